/* The CLI's model session (model, tokenizer, runner) and its output helpers. */
#include "tools/cli.h"

#include "model/gguf.h"
#include "model/io.h"
#include "model/scorer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

fg_status cli_load(const cli_opts *o, cli_session *s, char *err, size_t n) {
    memset(s, 0, sizeof *s);
    fg_status st = fgm_model_load(o->model, &s->model, err, n);
    if (st == FG_OK && s->model.gguf)
        st = fgm_tokenizer_from_gguf(s->model.gguf, s->model.config.vocab_size, &s->tok, err, n);
    else if (st == FG_OK && (st = fgm_tokenizer_load_file(o->tokenizer, s->model.config.vocab_size, &s->tok, err, n)) &&
             o->tokenizer_defaulted) {
        char why[512];
        snprintf(why, sizeof why, "%s", err);
        /* the loader's reason at most 300 bytes, so the sentence around it survives in err's 512 */
        snprintf(err, n, "the tokenizer tried by default, %s (tok512.bin beside the model), does not fit %s (%.300s); "
                 "-z FILE names the model's own", o->tokenizer, o->model, why);
    }
    if (st)
        cli_close(s);
    return st;
}

/* The prompt's progress on the terminal: a line that updates, erased at the end. */
static void prefill_progress(void *user, int32_t done, int32_t total) {
    (void)user;
    if (done < total)
        fprintf(stderr, "\r  prefill %3d%%", (int)(100 * (int64_t)done / total));
    else
        fputs("\r\033[K", stderr);
    fflush(stderr);
}

fg_status cli_attach_scorer(const cli_opts *o, cli_session *s, fgm_runner *r, char *err, size_t n) {
    if (o->scorer && !strcmp(o->scorer, "none"))
        return FG_OK;
    if (s->scorer) /* loaded for another of the session's runners */
        return fgm_runner_set_scorer(r, s->scorer) ? fgm_failf(err, n, FG_ERR_INVALID_ARGUMENT, "%s: %s",
                                                               s->scorer_path, fgm_runner_error(r))
                                                   : FG_OK;
    snprintf(s->scorer_path, sizeof s->scorer_path, "%s", o->scorer ? o->scorer : o->model);
    if (!o->scorer) {
        strncat(s->scorer_path, ".fgscore", sizeof s->scorer_path - strlen(s->scorer_path) - 1);
        if (access(s->scorer_path, R_OK) != 0) {
            s->scorer_path[0] = '\0';
            return FG_OK;
        }
    }
    s->scorer = calloc(1, sizeof *s->scorer);
    fg_status st = s->scorer ? fgm_scorer_load(s->scorer_path, s->scorer, err, n) : FG_ERR_OUT_OF_MEMORY;
    if (st == FG_OK && (st = fgm_runner_set_scorer(r, s->scorer)))
        snprintf(err, n, "%s: %s", s->scorer_path, fgm_runner_error(r));
    else if (st == FG_ERR_OUT_OF_MEMORY && !s->scorer)
        snprintf(err, n, "out of memory for the scorer");
    if (st && !o->scorer) { /* found, not asked for: said, and the run goes on without it */
        if (!o->quiet)
            fprintf(stderr, "fastgen: not using the scorer found beside the model: %s\n", err);
        fgm_scorer_free(s->scorer);
        free(s->scorer);
        s->scorer = NULL;
        s->scorer_path[0] = '\0';
        return FG_OK;
    }
    return st;
}

void cli_default_observe(const cli_session *s, fg_compression_params *cp, int quiet) {
    if (cp->allocation != FG_ALLOC_ADAPTIVE || cp->observe != FG_OBSERVE_TAIL)
        return;
    if (s->scorer)
        cp->observe = FG_OBSERVE_SCORES;
    if (quiet)
        return;
    if (s->scorer)
        fprintf(stderr, "fastgen: fastgen-adaptive ranks keys by the model's calibrated scorer %s (observe=scores: "
                "what a reconstruction pass would keep, at no extra pass; --observe tail for the prompt's last "
                "rows)\n", s->scorer_path);
    else
        fprintf(stderr, "fastgen: fastgen-adaptive judges by the prompt's last rows (observe=tail): no scorer for "
                "this model, and a question asked later may find its answer dropped; `fastgen calibrate -m MODEL "
                "--text FILE` writes one, used from then on at no extra pass\n");
}

fg_status cli_open(const cli_opts *o, int32_t max_seqs, int track_recovery, cli_session *s, char *err, size_t n) {
    fg_status st = cli_load(o, s, err, n);
    if (st == FG_OK) {
        fgm_runner_params rp = {.backend = o->backend, .max_seqs = max_seqs,
                               .track_recovery = track_recovery, .q8_activations = o->q8_activations,
                               .prefill_chunk = o->prefill_chunk, .n_threads = o->threads,
                               .max_len = o->ctx_size};
        cli_runner_dtypes(o, &rp);
        st = fgm_runner_create(&s->model, &s->tok, &rp, &s->runner, err, n);
    }
    if (st == FG_OK) /* the scorer: --scorer's, else MODEL.fgscore when there, for observe=scores */
        st = cli_attach_scorer(o, s, s->runner, err, n);
    if (st == FG_OK && o->ctx_size > s->model.config.seq_len && !o->quiet) /* used, at the model's size */
        fprintf(stderr, "fastgen: -c %d: the model's context is %d tokens, which is what a sequence may hold\n",
                (int)o->ctx_size, (int)s->model.config.seq_len);
    if (st == FG_OK && !o->quiet && isatty(2))
        fgm_runner_set_progress(s->runner, prefill_progress, NULL);
    if (st)
        cli_close(s);
    return st;
}

void cli_close(cli_session *s) {
    fgm_runner_destroy(&s->runner);
    fgm_scorer_free(s->scorer);
    free(s->scorer);
    s->scorer = NULL;
    fgm_tokenizer_free(&s->tok);
    fgm_llama_free(&s->model);
}

static fg_status encode(const cli_session *s, const char *prompt, int flags, int32_t **tokens, int32_t *n) {
    int32_t cap = (int32_t)strlen(prompt) + 2;
    *tokens = malloc((size_t)cap * sizeof **tokens);
    if (!*tokens)
        return FG_ERR_OUT_OF_MEMORY;
    fg_status st = fgm_tokenizer_encode(&s->tok, prompt, flags, *tokens, cap, n);
    if (st) {
        free(*tokens);
        *tokens = NULL;
    }
    return st;
}

fg_status cli_encode(const cli_session *s, const char *prompt, int32_t **tokens, int32_t *n) {
    return encode(s, prompt, FGM_ENCODE_BOS | FGM_ENCODE_SPECIAL, tokens, n);
}

fg_status cli_encode_more(const cli_session *s, const char *text, int32_t **tokens, int32_t *n) {
    return encode(s, text, FGM_ENCODE_SPECIAL, tokens, n);
}

fg_status cli_reconstruct_prefix(const cli_session *s, int chat, int32_t **tokens, int32_t *n) {
    return cli_encode_more(s,
                           chat ? "<|im_start|>user\nRepeat the previous context exactly.<|im_end|>\n"
                                  "<|im_start|>assistant\n"
                                : "\n\nRepeat the previous context exactly.\n\n",
                           tokens, n);
}

const char *cli_reason(const fgm_runner *r, fg_status st) {
    const char *e = r ? fgm_runner_error(r) : NULL;
    return e && e[0] ? e : fg_status_string(st);
}

void cli_human_bytes(double b, char *buf, size_t n) {
    const char *unit[] = {"B", "KiB", "MiB", "GiB"};
    int u = 0;
    while (b >= 1024.0 && u < 3) {
        b /= 1024.0;
        u++;
    }
    snprintf(buf, n, u ? "%.1f %s" : "%.0f %s", b, unit[u]);
}

char *cli_display_prompt(const cli_session *s, const int32_t *tokens, int32_t n) {
    size_t len = 1;
    for (int32_t i = 0; i < n; i++)
        len += strlen(fgm_tokenizer_decode(&s->tok, i ? tokens[i - 1] : s->tok.bos, tokens[i]));
    char *text = malloc(len);
    if (!text)
        return NULL;
    size_t at = 0;
    for (int32_t i = 0; i < n; i++) { /* BOS, EOS and chat markers decode to nothing */
        const char *piece = fgm_tokenizer_decode(&s->tok, i ? tokens[i - 1] : s->tok.bos, tokens[i]);
        const size_t m = strlen(piece);
        memcpy(text + at, piece, m);
        at += m;
    }
    text[at] = '\0';
    return text;
}

void cli_print_kv(const char *label, const fg_memory_stats *m, int32_t page_tokens) {
    char held[32], full[32];
    cli_human_bytes((double)m->kv_bytes_held, held, sizeof held);
    cli_human_bytes((double)m->kv_bytes_full, full, sizeof full);
    const double share = m->kv_bytes_full ? (double)m->kv_bytes_held / (double)m->kv_bytes_full : 0.0;
    printf("%s%s held vs %s full (%.1f%%; %lld of %lld rows kept)\n", label, held, full, 100.0 * share,
           (long long)m->rows_kept, (long long)m->rows_full);
    if (m->rows_kept < m->rows_full && m->kv_bytes_held >= m->kv_bytes_full) /* fewer rows, no bytes saved */
        printf("  (memory is held in pages of %d rows per head: a head that keeps fewer rows than a page still "
               "holds its page, so a short sequence saves rows but no bytes)\n", (int)page_tokens);
}

double cli_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int cli_open_or_report(const cli_opts *o, int track, cli_session *s) {
    char err[512];
    fg_status st = cli_open(o, 1, track, s, err, sizeof err);
    if (st) {
        fprintf(stderr, "fastgen: %s\n", err);
        return 1;
    }
    return 0;
}

int32_t cli_argmax(const float *x, int32_t n) {
    int32_t b = 0;
    for (int32_t i = 1; i < n; i++)
        b = x[i] > x[b] ? i : b;
    return b;
}

double cli_logsumexp(const float *x, int32_t n) {
    double m = -INFINITY, s = 0.0;
    for (int32_t i = 0; i < n; i++)
        m = x[i] > m ? x[i] : m;
    for (int32_t i = 0; i < n; i++)
        s += exp(x[i] - m);
    return m + log(s);
}
