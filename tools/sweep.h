/* The state of fastgen eval --sweep / --passkey that its three files share:
 * the driver and the runs (tools/cmd_eval_sweep.c), the methods at matched
 * memory (tools/sweep_methods.c), the report (tools/sweep_report.c). */
#ifndef FG_SWEEP_H
#define FG_SWEEP_H

#include "tools/cmd_eval_sweep.h"

#define SW_MAX_METHODS 12
#define SW_MAX_POINTS 12
#define SW_MAX_DTYPES 5

/* One run: a method at a memory point on a prompt. */
typedef struct sw_result {
    double kl, kl_max, top1, kept; /* means over the scored steps; kept: rows held / full over them */
    int32_t agree;                 /* tokens before the first top-1 difference */
    double correct;                /* --passkey: the share of the prompt's questions answered */
    int made;                      /* the run happened (the prompt fitted) */
} sw_result;

typedef struct sweep {
    cli_session s;
    const eval_sweep_opts *x;
    /* --dtypes: every method on caches of each dtype, its budgets read as
     * bytes against the reference's full cache (--dtype, f16 by default; the
     * reference runs on it): dtype i runs at row budget min(1, budget /
     * bytes[i]), bytes[i] being its row's bytes over the reference's */
    int32_t n_dt;
    int by_bytes; /* --dtypes given: the report is in bytes, per dtype */
    fg_dtype dts[SW_MAX_DTYPES];
    double bytes[SW_MAX_DTYPES];
    fgm_runner *runners[SW_MAX_DTYPES]; /* runners[i] for dts[i]; s.runner (the reference's) among them or not */
    fgm_runner *failed;                 /* the runner of the last call that failed (its message) */
    int32_t n_methods, n_points, n_cfg;
    const char *methods[SW_MAX_METHODS];
    float budgets[SW_MAX_POINTS];
    int32_t n_steps, vocab, ctx_len;
    float *ref_logits;  /* [n_steps][vocab] the full cache's, before each reference token */
    int32_t *ref;       /* [n_steps] the reference tokens */
    uint8_t *cls;       /* [ctx_len] classes of the prompt and the reference (4 sinks) */
    float *logits;      /* [n_cfg][vocab] */
    int32_t n_prompts;
    sw_result *res;     /* [n_dt][n_prompts][n_methods][n_points] */
    /* --passkey: the prompt's questions, the number each answer must hold and the turn that asks for it
     * (KEY<TAB>DOCUMENT<TAB>TURN...: appended after the document's prefill and compression; none: the
     * question ends the prompt). Several: each asked of a fork of the compressed document */
    int passkey;
    int32_t n_q;
    const char *key[EVAL_MAX_QUESTIONS];
    int32_t *turn[EVAL_MAX_QUESTIONS], n_turn[EVAL_MAX_QUESTIONS];
    /* observe=reconstruct: the instruction the prompt is repeated after (KVzip), and what the passes cost */
    int32_t *recon, n_recon;
    double t_prefill, t_recon; /* seconds: the full cache's prefills (the references'), the reconstructions */
    int32_t n_prefill, n_recons;
} sweep;

static inline sw_result *result(sweep *w, int32_t di, int32_t p, int32_t m, int32_t b) {
    return &w->res[(((size_t)di * w->n_prompts + p) * w->n_methods + m) * w->n_points + b];
}

/* The row budget of dtype di at point b (see sweep). */
static inline float row_budget(const sweep *w, int32_t di, int32_t b) {
    const double r = w->budgets[b] / w->bytes[di];
    return r < 1.0 ? (float)r : 1.0f;
}

/* ---- methods (tools/sweep_methods.c) */

/* Methods whose budget is a parameter of their own: they run at the point's budget. */
int sweep_takes_budget(const char *method);
/* The parameters of `method` with knob r (the budget, or a one-entry
 * preset's ratio); 0 when the method is not one the sweep can drive. */
int sweep_method_params(const char *method, double r, fg_compression_params *cp);
/* The ratio of `method` whose rows, summed over the lengths t0..t1-1 of a
 * prompt of n tokens (spec: its special tokens, cumulated), come closest to
 * `kept` of the full cache's; 0 when the method has no row count. */
int sweep_matched_params(const char *method, double kept, int64_t t0, int64_t t1, int64_t n, const int32_t *spec,
                         fg_compression_params *cp);

/* ---- report (tools/sweep_report.c): the tables, the JSON, the summary; returns the exit code */
int sweep_report(sweep *w, const cli_opts *o, double seconds, int passkey);

#endif
