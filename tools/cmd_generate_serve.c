/* fastgen generate --chat and --samples: a conversation appended turn by
 * turn to one sequence (fgm_runner_append), and K samples forked from one
 * prompt (fgm_runner_fork, pages shared copy-on-write). */
#include <stdlib.h>
#include <string.h>

#include "tools/cli.h"
#include "model/gguf.h"
#include "tools/cmd_generate_serve.h"
#include "model/io.h"

/* The system turn the GGUF's chat template writes when a conversation has
 * none (ChatML), or "". */
static void default_system(const cli_session *s, char *system, size_t size) {
    static const char k_open[] = "<|im_start|>system\n";
    system[0] = '\0';
    char *tmpl = s->model.gguf ? malloc(1 << 16) : NULL;
    if (!tmpl)
        return;
    fgm_gguf_get_str(s->model.gguf, "tokenizer.chat_template", tmpl, 1 << 16);
    const char *a = strstr(tmpl, k_open), *b = a ? strstr(a, "<|im_end|>") : NULL;
    if (a && b && (size_t)(b - a) < size + sizeof k_open - 1)
        snprintf(system, size, "%.*s", (int)(b - a - (sizeof k_open - 1)), a + sizeof k_open - 1);
    free(tmpl);
}

/* The tokens of a user turn. ChatML (<|im_start|>role\ntext<|im_end|>\n)
 * when the vocabulary has its two control tokens: the end of the previous
 * reply first (a reply stops before its <|im_end|>), the default system turn
 * before the first; the markup is read as control tokens, the user's text is
 * not (a user cannot close the turn by typing "<|im_end|>"). Else the text as
 * it is, BOS first. Appends at toks[*n]. */
int serve_chatml(const cli_session *s) {
    const int32_t im_start = fgm_tokenizer_piece_id(&s->tok, "<|im_start|>");
    const int32_t im_end = fgm_tokenizer_piece_id(&s->tok, "<|im_end|>");
    return im_start >= 0 && im_end >= 0 && s->tok.control[im_start] && s->tok.control[im_end];
}

fg_status serve_turn_tokens(const cli_session *s, int chatml, int first, const char *user, int32_t *toks, int32_t cap,
                            int32_t *n) {
    int32_t got = 0;
    fg_status st;
    if (!chatml) {
        st = fgm_tokenizer_encode(&s->tok, user, first ? FGM_ENCODE_BOS : 0, toks, cap, &got);
        *n = got;
        return st;
    }
    char pre[1200], system[1024] = "";
    if (first)
        default_system(s, system, sizeof system);
    snprintf(pre, sizeof pre, "%s%s%s%s<|im_start|>user\n", first ? "" : "<|im_end|>\n",
             system[0] ? "<|im_start|>system\n" : "", system, system[0] ? "<|im_end|>\n" : "");
    const char *parts[3] = {pre, user, "<|im_end|>\n<|im_start|>assistant\n"};
    const int flags[3] = {(first ? FGM_ENCODE_BOS : 0) | FGM_ENCODE_SPECIAL, 0, FGM_ENCODE_SPECIAL};
    *n = 0;
    for (int i = 0; i < 3; i++) {
        if ((st = fgm_tokenizer_encode(&s->tok, parts[i], flags[i], toks + *n, cap - *n, &got)) != FG_OK)
            return st;
        *n += got;
    }
    return FG_OK;
}

/* Samples one reply of up to n tokens after `logits`, decoding each token
 * into the cache (so the next turn sees the whole reply). Returns the count. */
static int32_t reply(cli_session *s, int32_t seq, fgm_sampler *sampler, float *logits, int32_t n, int32_t prev,
                     char *text, size_t cap, fg_status *st) {
    const int32_t vocab = s->model.config.vocab_size;
    int32_t k = 0, len = 0;
    fg_seq_length(fgm_runner_context(s->runner), seq, 0, &len);
    text[0] = '\0';
    for (; k < n && len + 1 < fgm_runner_ctx_len(s->runner); k++, len++) {
        int32_t next = fgm_sample(sampler, logits, vocab);
        if (next == s->tok.bos || next == s->tok.eos)
            break;
        strncat(text, fgm_tokenizer_decode(&s->tok, prev, next), cap - strlen(text) - 1);
        if ((*st = fgm_runner_decode(s->runner, 1, &seq, &next, logits)) != FG_OK)
            break;
        prev = next;
    }
    return k;
}

int32_t serve_split_turns(char *text, char **turns) {
    int32_t n = 0;
    for (char *p = text; *p;) {
        while (*p == '\n' || *p == '\r')
            p++;
        if (!*p)
            break;
        char *end = strstr(p, "\n\n");
        if (end)
            *end = '\0';
        for (char *q = p; *q; q++) /* a turn is one line of text */
            if (*q == '\n' || *q == '\r')
                *q = ' ';
        for (size_t len = strlen(p); len && (p[len - 1] == ' ' || p[len - 1] == '\t'); len--)
            p[len - 1] = '\0';
        if (*p) /* a paragraph of spaces and tabs is no turn */
            turns[n++] = p;
        p = end ? end + 2 : p + strlen(p);
    }
    return n;
}

/* User turns: paragraphs of the file (separated by blank lines). */
static char **read_turns(const char *path, int32_t *n) {
    size_t size;
    *n = 0;
    char *text = cli_read_text("generate", path, &size);
    char **turns = text ? calloc(size / 2 + 2, sizeof *turns) : NULL;
    if (!turns) {
        free(text);
        return NULL;
    }
    turns[0] = text;
    *n = serve_split_turns(text, turns + 1);
    if (*n == 0) {
        fprintf(stderr, "fastgen generate: %s holds no turn (turns are separated by blank lines)\n", path);
        free(text);
        free(turns);
        return NULL;
    }
    return turns;
}

int serve_chat(const cli_opts *o, const fg_compression_params *cp_given, int observe_named, const char *path) {
    int32_t n_turns = 0;
    char **turns = read_turns(path, &n_turns);
    if (!turns)
        return 1;
    cli_session s;
    char err[512];
    if (cli_open(o, 1, 0, &s, err, sizeof err) != FG_OK) {
        fprintf(stderr, "fastgen generate: %s\n", err);
        free(turns[0]);
        free(turns);
        return 1;
    }
    fg_compression_params own = *cp_given;
    if (!observe_named)
        cli_default_observe(&s, &own, o->quiet || o->json);
    const fg_compression_params *cp = &own;
    const int32_t V = s.model.config.vocab_size, ctx_len = fgm_runner_ctx_len(s.runner);
    const int chatml = serve_chatml(&s);
    enum { REPLY = 4096 };
    float *logits = malloc((size_t)V * sizeof *logits);
    int32_t *toks = malloc((size_t)(ctx_len + 2) * sizeof *toks), seq = -1;
    /* every answered turn takes a token of the context at least */
    const int32_t n_slots = n_turns < ctx_len ? n_turns : ctx_len;
    char *replies = malloc((size_t)n_slots * REPLY);
    fgm_sampler sampler = {o->temperature, o->top_p, o->seed * 0x9e3779b97f4a7c15ull + 1, o->top_k};
    fg_status st = logits && toks && replies ? FG_OK : FG_ERR_OUT_OF_MEMORY;
    int32_t done = 0, stopped = 0; /* stopped: the turn that did not fit, from 1 */
    char why[160] = "";
    for (int32_t t = 0; t < n_turns && t < n_slots && st == FG_OK; t++, done++) {
        int32_t n = 0, len = 0;
        if (seq >= 0)
            fg_seq_length(fgm_runner_context(s.runner), seq, 0, &len);
        /* no token holds more than the longest piece's bytes: a turn longer than that many tokens' worth does
         * not fit without encoding it */
        const int too_long = strlen(turns[1 + t]) > s.tok.max_piece_len * (size_t)(ctx_len - len);
        st = too_long ? FG_ERR_CAPACITY : serve_turn_tokens(&s, chatml, seq < 0, turns[1 + t], toks, ctx_len + 2, &n);
        if (st == FG_ERR_CAPACITY || (st == FG_OK && len + n >= ctx_len)) {
            stopped = t + 1;
            snprintf(why, sizeof why, "turn %d does not fit the rest of the context (%d of %d tokens used)",
                     (int)t + 1, (int)len, (int)ctx_len);
            st = FG_OK;
            break;
        }
        char *rep = replies + (size_t)t * REPLY;
        if (st == FG_OK)
            st = seq < 0 ? fgm_runner_prefill(s.runner, cp, toks, n, &seq, logits)
                         : fgm_runner_append(s.runner, seq, toks, n, logits);
        if (st == FG_OK)
            reply(&s, seq, &sampler, logits, o->n, toks[n - 1], rep, REPLY, &st);
        if (!o->json && st == FG_OK)
            printf("user:  %s\nmodel: %s\n\n", turns[1 + t], rep);
    }
    if (st == FG_OK && !stopped && done < n_turns) { /* more turns than the context has tokens */
        stopped = done + 1;
        snprintf(why, sizeof why, "turn %d does not fit the rest of the context", (int)done + 1);
    }
    int rc = 1;
    if (st) {
        fprintf(stderr, "fastgen generate: %s\n", cli_reason(s.runner, st));
    } else if (seq < 0) { /* the first turn did not fit */
        if (o->json) {
            printf("{\"turns\": [], \"stopped\": ");
            cli_json_string(stdout, why);
            printf(", \"policy\": ");
            cli_json_string(stdout, o->policy);
            printf("}\n");
        }
        fprintf(stderr, "fastgen generate: %s\n", why);
    } else {
        fg_memory_stats m;
        fg_memory(fgm_runner_context(s.runner), seq, &m);
        if (o->json) {
            printf("{\"turns\": [");
            for (int32_t t = 0; t < done; t++) {
                printf("%s{\"user\": ", t ? ", " : "");
                cli_json_string(stdout, turns[1 + t]);
                printf(", \"reply\": ");
                cli_json_string(stdout, replies + (size_t)t * REPLY);
                printf("}");
            }
            printf("], \"stopped\": ");
            if (stopped)
                cli_json_string(stdout, why);
            else
                printf("null");
            printf(", \"policy\": ");
            cli_json_string(stdout, o->policy);
            printf(", \"kv_bytes_held\": %zu, \"kv_bytes_full\": %zu, \"rows_kept\": %lld, \"rows_full\": %lld}\n",
                   m.kv_bytes_held, m.kv_bytes_full, (long long)m.rows_kept, (long long)m.rows_full);
        } else {
            char label[64];
            snprintf(label, sizeof label, "%d turns; KV cache: ", (int)done);
            cli_print_kv(label, &m, fgm_runner_page_tokens(s.runner));
        }
        if (stopped) /* what was asked was not all done */
            fprintf(stderr, "fastgen generate: stopped after %d of %d turns: %s\n", (int)done, (int)n_turns, why);
        rc = stopped ? 1 : 0;
    }
    free(replies);
    free(logits);
    free(toks);
    cli_close(&s);
    free(turns[0]);
    free(turns);
    return rc;
}

int serve_samples(const cli_opts *o, const fg_compression_params *cp_given, int observe_named, int32_t k) {
    cli_session s;
    char err[512];
    if (cli_open(o, k, 0, &s, err, sizeof err) != FG_OK) {
        fprintf(stderr, "fastgen generate: %s\n", err);
        return 1;
    }
    fg_compression_params own = *cp_given;
    if (!observe_named)
        cli_default_observe(&s, &own, o->quiet || o->json);
    const fg_compression_params *cp = &own;
    const int32_t V = s.model.config.vocab_size, ctx_len = fgm_runner_ctx_len(s.runner);
    int32_t *prompt = NULL, n_prompt = 0, seqs[64];
    float *logits = malloc((size_t)k * V * sizeof *logits);
    static char texts[64][4096];
    fgm_sampler samplers[64];
    int alive[64];
    fg_status st = logits && cli_encode(&s, o->prompt, &prompt, &n_prompt) == FG_OK ? FG_OK : FG_ERR_INVALID_ARGUMENT;
    if (st == FG_OK && n_prompt >= ctx_len)
        st = FG_ERR_CAPACITY;
    /* one prefill, K - 1 forks: the prompt's pages are shared */
    if (st == FG_OK)
        st = fgm_runner_prefill(s.runner, cp, prompt, n_prompt, &seqs[0], logits);
    for (int32_t i = 1; i < k && st == FG_OK; i++) {
        st = fgm_runner_fork(s.runner, seqs[0], &seqs[i]);
        memcpy(logits + (size_t)i * V, logits, (size_t)V * sizeof *logits);
    }
    const float temperature = o->temperature > 0.0f ? o->temperature : 1.0f; /* samples differ only when sampled */
    for (int32_t i = 0; i < k; i++) {
        samplers[i] =
            (fgm_sampler){temperature, o->top_p, (o->seed + (uint64_t)i) * 0x9e3779b97f4a7c15ull + 1, o->top_k};
        alive[i] = 1;
        texts[i][0] = '\0';
    }
    int32_t prev[64], steps = o->n < ctx_len - n_prompt ? o->n : ctx_len - n_prompt;
    for (int32_t i = 0; i < k; i++)
        prev[i] = n_prompt ? prompt[n_prompt - 1] : 0;
    for (int32_t step = 0; step < steps && st == FG_OK; step++) {
        int32_t ids[64], toks[64], n = 0;
        for (int32_t i = 0; i < k; i++) {
            if (!alive[i])
                continue;
            int32_t next = fgm_sample(&samplers[i], logits + (size_t)i * V, V);
            if (next == s.tok.bos || next == s.tok.eos) {
                alive[i] = 0;
                continue;
            }
            strncat(texts[i], fgm_tokenizer_decode(&s.tok, prev[i], next), sizeof texts[i] - strlen(texts[i]) - 1);
            prev[i] = next;
            ids[n] = seqs[i];
            toks[n++] = next;
        }
        if (!n || step + 1 == steps)
            break;
        float *batch = malloc((size_t)n * V * sizeof *batch);
        st = batch ? fgm_runner_decode(s.runner, n, ids, toks, batch) : FG_ERR_OUT_OF_MEMORY;
        for (int32_t i = 0, j = 0; st == FG_OK && i < k; i++)
            if (alive[i])
                memcpy(logits + (size_t)i * V, batch + (size_t)j++ * V, (size_t)V * sizeof *logits);
        free(batch);
    }
    int rc = 1;
    if (st) {
        fprintf(stderr, "fastgen generate: %s\n", st == FG_ERR_CAPACITY ? "the prompt fills the context"
                                                                        : cli_reason(s.runner, st));
    } else {
        fg_memory_stats all;
        fg_memory(fgm_runner_context(s.runner), -1, &all);
        if (o->json) {
            printf("{\"samples\": [");
            for (int32_t i = 0; i < k; i++) {
                printf("%s", i ? ", " : "");
                cli_json_string(stdout, texts[i]);
            }
            printf("], \"n_prompt\": %d, \"kv_bytes_held\": %zu, \"kv_bytes_alone\": %zu, \"kv_bytes_full\": %zu}\n",
                   (int)n_prompt, all.kv_bytes_held, all.kv_bytes_alone, all.kv_bytes_full);
        } else {
            char *shown = cli_display_prompt(&s, prompt, n_prompt); /* as generate shows it: no control tokens */
            for (int32_t i = 0; i < k; i++)
                printf("sample %d: %s%s\n\n", (int)i + 1, shown ? shown : o->prompt, texts[i]);
            free(shown);
            char label[64], alone[32];
            snprintf(label, sizeof label, "%d samples: KV cache: ", (int)k);
            cli_print_kv(label, &all, fgm_runner_page_tokens(s.runner));
            cli_human_bytes((double)all.kv_bytes_alone, alone, sizeof alone);
            printf("  shared pages counted once: %.2fx of the %s the %d samples would hold as separate sequences\n",
                   all.kv_bytes_alone ? (double)all.kv_bytes_held / (double)all.kv_bytes_alone : 0.0, alone, (int)k);
        }
        rc = 0;
    }
    free(prompt);
    free(logits);
    cli_close(&s);
    return rc;
}
