/* fastgen eval --chat FILE: what happens to the heads' policies on a new
 * turn (fg_seq_append), keep against re-profile, on conversations.
 *
 * For each conversation the full cache answers every user turn greedily (up
 * to -n tokens a reply, stopping at the end-of-text token), one sequence,
 * the turns appended. Then FastGen at T = 0.90, 0.95 and 0.98, each with
 * FG_APPEND_KEEP and FG_APPEND_REPROFILE (six sequences decoded together),
 * is teacher-forced on that conversation: its next-token distributions at
 * every reply position are compared with the full cache's. The first turn's
 * replies come before any append, so they are the same under both modes;
 * the table reports the later turns, where the modes differ, and the KV
 * memory held over the whole conversation (mean over the steps, and at its
 * end). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tools/cli.h"
#include "tools/cmd_eval_chat.h"
#include "tools/cmd_generate_serve.h"
#include "model/io.h"

#define N_T 3
#define N_MODES 2
#define N_CFG (N_T * N_MODES)
static const float k_T[N_T] = {0.90f, 0.95f, 0.98f};
static const char *const k_mode[N_MODES] = {"keep", "reprofile"};

typedef struct chat_acc {
    double kl_sum[2], kl_max; /* [0]: the first turn's replies, [1]: the later turns' */
    int64_t top1[2], steps[2];
    double held, full;        /* KV bytes summed over the samples (after every decode and append) */
    double end_held, end_full;/* at the end of each conversation */
} chat_acc;

typedef struct chat_state {
    cli_session s;
    int chatml;
    int32_t vocab, ctx_len, reply_max;
    int32_t *toks;     /* [ctx_len] the conversation's tokens, turn after turn */
    int32_t *turn_at;  /* [turns + 1] where each turn's user tokens start in toks */
    int32_t *reply_at; /* [turns] where its reply starts */
    int32_t *scored;   /* [turns] reply positions scored (the reply, and its stop when it stopped) */
    float *ref;        /* [ctx_len][vocab] the full cache's logits at every scored position, in order */
    float *logits;     /* [N_CFG][vocab] */
    chat_acc acc[N_CFG];
    int32_t conversations, turns_scored;
} chat_state;

static void score(chat_state *c, int cfg, int later, const float *full, const float *got) {
    const double lf = cli_logsumexp(full, c->vocab), lg = cli_logsumexp(got, c->vocab);
    double kl = 0.0;
    for (int32_t v = 0; v < c->vocab; v++) {
        const double a = full[v] - lf, b = got[v] - lg;
        kl += exp(a) * (a - b);
    }
    chat_acc *x = &c->acc[cfg];
    x->kl_sum[later] += kl;
    x->kl_max = later && kl > x->kl_max ? kl : x->kl_max;
    x->top1[later] += cli_argmax(full, c->vocab) == cli_argmax(got, c->vocab);
    x->steps[later]++;
}

static void sample_memory(chat_state *c, const int32_t *seqs) {
    for (int i = 0; i < N_CFG; i++) {
        fg_memory_stats m;
        fg_memory(fgm_runner_context(c->s.runner), seqs[i], &m);
        c->acc[i].held += (double)m.kv_bytes_held;
        c->acc[i].full += (double)m.kv_bytes_full;
    }
}

/* The full cache's answers: the conversation's tokens and the reference
 * logits. Returns the turns that fit the context (0: none). */
static fg_status reference(chat_state *c, char *const *turns, int32_t n_turns, int32_t *fitted) {
    const int32_t V = c->vocab;
    fg_compression_params full;
    fg_compression_params_preset("full", &full);
    int32_t seq = -1, len = 0, at = 0, n_ref = 0;
    fg_status st = FG_OK;
    float *logits = c->logits; /* scratch: row 0 */
    *fitted = 0;
    for (int32_t t = 0; t < n_turns && st == FG_OK; t++) {
        int32_t n = 0;
        st = serve_turn_tokens(&c->s, c->chatml, t == 0, turns[t], c->toks + len, c->ctx_len - len, &n);
        if (st == FG_ERR_CAPACITY || (st == FG_OK && len + n + c->reply_max + 1 > c->ctx_len)) {
            st = FG_OK;
            break; /* the conversation ends where the context does */
        }
        if (st)
            break;
        c->turn_at[t] = len;
        st = t == 0 ? fgm_runner_prefill(c->s.runner, &full, c->toks, n, &seq, logits)
                    : fgm_runner_append(c->s.runner, seq, c->toks + len, n, logits);
        len += n;
        c->reply_at[t] = len;
        c->scored[t] = 0;
        for (int32_t r = 0; r < c->reply_max && st == FG_OK; r++) {
            memcpy(c->ref + (size_t)n_ref++ * V, logits, (size_t)V * sizeof *logits);
            c->scored[t]++;
            const int32_t next = cli_argmax(logits, V);
            if (next == c->s.tok.eos || next == c->s.tok.bos)
                break; /* the stop is scored, not decoded (the next turn's markup closes the reply) */
            c->toks[len++] = next;
            st = fgm_runner_decode(c->s.runner, 1, &seq, &next, logits);
        }
        c->turn_at[t + 1] = len;
        at = t + 1;
    }
    if (seq >= 0)
        fgm_runner_release(c->s.runner, seq);
    *fitted = at;
    return st;
}

/* The six configurations teacher-forced on the conversation. */
static fg_status replay(chat_state *c, int32_t n_turns) {
    const int32_t V = c->vocab;
    fg_compression_params cps[N_CFG];
    for (int i = 0; i < N_CFG; i++) {
        fg_compression_params_default(&cps[i]);
        cps[i].threshold = k_T[i % N_T];
        cps[i].append_mode = i < N_T ? FG_APPEND_KEEP : FG_APPEND_REPROFILE;
    }
    int32_t seqs[N_CFG];
    fg_status st = fgm_runner_prefill_many(c->s.runner, N_CFG, cps, c->toks, c->reply_at[0], seqs, c->logits);
    if (st)
        return st;
    for (int i = 1; i < N_CFG; i++) /* the prompt's logits: the same under every policy */
        memcpy(c->logits + (size_t)i * V, c->logits, (size_t)V * sizeof *c->logits);
    sample_memory(c, seqs);
    const float *ref = c->ref; /* the reference's logits at this turn's first reply position */
    for (int32_t t = 0; t < n_turns && st == FG_OK; ref += (size_t)c->scored[t++] * V) {
        const int32_t u0 = c->turn_at[t], r0 = c->reply_at[t], replied = c->turn_at[t + 1] - r0;
        for (int i = 0; t > 0 && i < N_CFG && st == FG_OK; i++)
            st = fgm_runner_append(c->s.runner, seqs[i], c->toks + u0, r0 - u0, c->logits + (size_t)i * V);
        if (t > 0 && st == FG_OK)
            sample_memory(c, seqs);
        for (int32_t r = 0; r < c->scored[t] && st == FG_OK; r++) {
            for (int i = 0; i < N_CFG; i++)
                score(c, i, t > 0, ref + (size_t)r * V, c->logits + (size_t)i * V);
            if (r == replied)
                break;
            int32_t toks[N_CFG];
            for (int i = 0; i < N_CFG; i++)
                toks[i] = c->toks[r0 + r];
            st = fgm_runner_decode(c->s.runner, N_CFG, seqs, toks, c->logits);
            if (st == FG_OK)
                sample_memory(c, seqs);
        }
    }
    for (int i = 0; i < N_CFG; i++) {
        fg_memory_stats m;
        fg_memory(fgm_runner_context(c->s.runner), seqs[i], &m);
        c->acc[i].end_held += (double)m.kv_bytes_held;
        c->acc[i].end_full += (double)m.kv_bytes_full;
        fgm_runner_release(c->s.runner, seqs[i]);
    }
    return st;
}

static void report(const chat_state *c, const cli_opts *o, const char *path, double seconds) {
    if (o->json)
        printf("{\"conversations\": %d, \"turns\": %d, \"reply_tokens\": %d, \"results\": [", (int)c->conversations,
               (int)c->turns_scored, (int)c->reply_max);
    else
        printf("fastgen eval --chat %s: %d conversations, %d turns, replies of up to %d tokens, %s (%.1f s)\n\n"
               "%-26s %8s %8s %9s %9s %7s %12s\n",
               path, (int)c->conversations, (int)c->turns_scored, (int)c->reply_max, o->model, seconds, "",
               "KV kept", "at end", "KL mean", "KL max", "top-1", "turn 1 KL");
    for (int i = 0; i < N_CFG; i++) {
        const chat_acc *a = &c->acc[i];
        const double kept = a->full > 0 ? a->held / a->full : 1.0, end = a->end_full > 0 ? a->end_held / a->end_full : 1.0;
        const double kl = a->steps[1] ? a->kl_sum[1] / (double)a->steps[1] : 0.0;
        const double top1 = a->steps[1] ? (double)a->top1[1] / (double)a->steps[1] : 1.0;
        const double kl0 = a->steps[0] ? a->kl_sum[0] / (double)a->steps[0] : 0.0;
        if (o->json) {
            printf("%s{\"T\": %.2f, \"append\": \"%s\", \"kv_kept\": %.4f, \"kv_kept_end\": %.4f, \"kl_mean\": %.6f, "
                   "\"kl_max\": %.6f, \"top1\": %.4f, \"steps\": %lld, \"kl_mean_turn1\": %.6f}",
                   i ? ", " : "", (double)k_T[i % N_T], k_mode[i / N_T], kept, end, kl, a->kl_max, top1,
                   (long long)a->steps[1], kl0);
        } else {
            char name[64];
            snprintf(name, sizeof name, "fastgen T=%.2f %s", (double)k_T[i % N_T], k_mode[i / N_T]);
            printf("%-26s %7.1f%% %7.1f%% %9.4f %9.4f %6.1f%% %12.4f\n", name, 100 * kept, 100 * end, kl, a->kl_max,
                   100 * top1, kl0);
            if (i % N_T == N_T - 1 && i + 1 < N_CFG)
                printf("\n");
        }
    }
    if (o->json)
        printf("]}\n");
    else
        printf("\nKL, top-1: next-token distributions at the reply positions of turns 2 and later (%lld per row),\n"
               "against the full cache's. KV kept: bytes held / a full cache's, mean over the conversation.\n",
               (long long)c->acc[0].steps[1]);
}

/* The end of the conversation that starts at conv: the first line that is
 * "---" (spaces and a carriage return after it allowed), cut off there;
 * *next: what follows that line (NULL at the end of the file). */
static void cut_conversation(char *conv, char **next) {
    *next = NULL;
    for (char *line = conv; line && *line;) {
        char *eol = strchr(line, '\n');
        const size_t len = eol ? (size_t)(eol - line) : strlen(line);
        size_t n = len;
        while (n > 3 && (line[n - 1] == ' ' || line[n - 1] == '\t' || line[n - 1] == '\r'))
            n--;
        if (n == 3 && !strncmp(line, "---", 3)) {
            *line = '\0';
            *next = eol ? eol + 1 : line + len;
            return;
        }
        line = eol ? eol + 1 : NULL;
    }
}

int eval_chat(const cli_opts *o, const char *path, int32_t limit) {
    size_t size;
    char err[512];
    char *text = cli_read_text("eval", path, &size);
    char **turns = text ? calloc(size / 2 + 2, sizeof *turns) : NULL;
    if (!turns) {
        if (text)
            fprintf(stderr, "fastgen eval: out of memory\n");
        free(text);
        return 1;
    }
    chat_state c;
    memset(&c, 0, sizeof c);
    int rc = 1;
    fg_status st = cli_load(o, &c.s, err, sizeof err);
    if (st == FG_OK) {
        c.ctx_len = c.s.model.config.seq_len < 4096 ? c.s.model.config.seq_len : 4096;
        fgm_runner_params rp = {.backend = o->backend, .max_seqs = N_CFG, .page_tokens = 1,
                               .max_len = c.ctx_len, .q8_activations = o->q8_activations,
                               .prefill_chunk = o->prefill_chunk, .n_threads = o->threads};
        cli_runner_dtypes(o, &rp);
        st = fgm_runner_create(&c.s.model, &c.s.tok, &rp, &c.s.runner, err, sizeof err);
        if (st == FG_OK)
            st = cli_attach_scorer(o, &c.s, c.s.runner, err, sizeof err);
    }
    if (st) {
        fprintf(stderr, "fastgen eval: %s\n", err);
        goto done;
    }
    c.chatml = serve_chatml(&c.s);
    c.vocab = c.s.model.config.vocab_size;
    c.reply_max = o->n;
    c.toks = malloc((size_t)c.ctx_len * sizeof *c.toks);
    c.turn_at = malloc((size_t)(size / 2 + 2) * sizeof *c.turn_at);
    c.reply_at = malloc((size_t)(size / 2 + 2) * sizeof *c.reply_at);
    c.scored = malloc((size_t)(size / 2 + 2) * sizeof *c.scored);
    c.ref = malloc((size_t)c.ctx_len * c.vocab * sizeof *c.ref);
    c.logits = malloc((size_t)N_CFG * c.vocab * sizeof *c.logits);
    if (!c.toks || !c.turn_at || !c.reply_at || !c.scored || !c.ref || !c.logits) {
        fprintf(stderr, "fastgen eval: out of memory\n");
        goto done;
    }
    const double t0 = cli_now();
    const int show = !o->quiet && isatty(2);
    int32_t seen = 0;
    /* conversations: separated by lines of "---"; the first `limit` of them (0: all) */
    for (char *conv = text, *next = NULL; conv && (limit == 0 || seen < limit); conv = next) {
        cut_conversation(conv, &next);
        const int32_t n_turns = serve_split_turns(conv, turns);
        if (n_turns == 0) /* nothing before the first separator, or between two */
            continue;
        seen++;
        if (show) {
            fprintf(stderr, "\r  conversation %d", (int)seen);
            fflush(stderr);
        }
        int32_t fitted = 0;
        if (n_turns > 0 && (st = reference(&c, turns, n_turns, &fitted)) == FG_OK && fitted > 0)
            st = replay(&c, fitted);
        if (st) {
            fprintf(stderr, "fastgen eval: %s\n", cli_reason(c.s.runner, st));
            goto done;
        }
        if (fitted < n_turns)
            fprintf(stderr, "fastgen eval: conversation %d: %d of its %d turns fit the context\n",
                    (int)c.conversations + 1, (int)fitted, (int)n_turns);
        c.conversations += fitted > 0;
        c.turns_scored += fitted;
    }
    if (show)
        fputc('\n', stderr);
    if (c.conversations == 0) {
        fprintf(stderr, "fastgen eval: %s holds no conversation that fits the context\n", path);
        goto done;
    }
    report(&c, o, path, cli_now() - t0);
    rc = 0;
done:
    free(c.toks);
    free(c.turn_at);
    free(c.reply_at);
    free(c.scored);
    free(c.ref);
    free(c.logits);
    cli_close(&c.s);
    free(text);
    free(turns);
    return rc;
}
