/* fastgen eval --sweep and --passkey: a driven method (fastgen-adaptive by
 * default) against the fixed policies and the peer methods, at KV memory
 * matched per prompt (docs/design.md §5.2).
 *
 * For every prompt the full cache makes a greedy reference. The driven
 * method runs at each budget; every other method then runs at the memory
 * the driven run kept on that prompt at that budget: its ratio is bisected
 * until its rows, summed over the same decode steps, match (a fixed policy's
 * row count depends only on its ratio, the lengths and the token classes,
 * so no run is needed to find it). Methods that take a budget themselves
 * (the FastGen budget modes) run at the budget instead.
 *
 * --sweep teacher-forces every run on the reference and reports, per memory
 * point and method: mean and max KL(full || compressed) of the next-token
 * distribution, top-1 agreement, the tokens before the first top-1
 * difference (where a free-running greedy decode would first part from the
 * full cache), and the paired difference of mean KL against the driven
 * method with a bootstrap 95% interval over the prompts.
 *
 * --passkey decodes greedily from each prompt (a number hidden in filler,
 * asked for at the end, or in a turn appended after it) and counts the runs
 * whose answer holds the number. Several questions about one document: the
 * document is prefilled and compressed once and forked for each (the
 * serving shape; a method that defers its compression past the document
 * compresses in each fork instead), each run's accuracy the share of them
 * answered. */
#define FG_EXPERIMENTAL /* FG_ADAPTIVE_*, fg_cpu_describe (fastgen.h) */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tools/cmd_eval_sweep.h"
#include "tools/svg.h"

#define SW_MAX_METHODS 12
#define SW_MAX_POINTS 12
#define SW_MAX_DTYPES 5
static const float k_default_budgets[] = {0.25f, 0.35f, 0.5f, 0.65f, 0.8f, 0.9f};
static const char *const k_default_methods[] = {"fastgen-adaptive", "h2o", "streamingllm", "tova", "snapkv", "adakv"};

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

static sw_result *result(sweep *w, int32_t di, int32_t p, int32_t m, int32_t b) {
    return &w->res[(((size_t)di * w->n_prompts + p) * w->n_methods + m) * w->n_points + b];
}

/* The row budget of dtype di at point b (see sweep). */
static float row_budget(const sweep *w, int32_t di, int32_t b) {
    const double r = w->budgets[b] / w->bytes[di];
    return r < 1.0 ? (float)r : 1.0f;
}

/* ---------------------------------------------------------------- methods */

/* Methods whose budget is a parameter of their own: they run at the point's budget. */
static int takes_budget(const char *m) { return !strncmp(m, "fastgen-budget", 14) || !strncmp(m, "fastgen-adaptive", 16); }

/* The parameters of `method` (a preset, options after a colon, as
 * fg_compression_params_parse takes them: "fastgen-adaptive:window=64")
 * with knob r: the budget, or the ratio of a one-entry preset (see
 * fg_compression_params_parse; a snapshot part takes r of the prompt beside
 * a window of r, which is the even split while r <= 0.5 of a long prompt
 * and reaches the full cache when the prompt is short). */
static int method_params(const char *method, double r, fg_compression_params *cp) {
    char name[64], spec[512];
    const char *colon = strchr(method, ':');
    snprintf(name, sizeof name, "%.*s", colon ? (int)(colon - method) : (int)strlen(method), method);
    if (fg_compression_params_preset(name, cp) != FG_OK)
        return 0;
    const int knob = takes_budget(name) || (cp->n_policies == 1 && !(cp->shortlist[0].components & FG_KEEP_FULL));
    if (!knob && cp->n_policies != 1)
        return 0;
    const float rf = r > 1e-9 ? (float)r : 1e-9f; /* the library takes a ratio in (0, 1] */
    if (knob)
        snprintf(spec, sizeof spec, "%s:%.9g%s%s", name, (double)rf, colon ? ":" : "", colon ? colon + 1 : "");
    else
        snprintf(spec, sizeof spec, "%s", method);
    return strlen(method) < 400 && fg_compression_params_parse(spec, cp) == FG_OK;
}

/* Rows a one-entry preset keeps per KV head at length t >= n (the prompt's
 * length n); spec[t]: special tokens among the first t (sinks included).
 * -1: no count for this method. */
static int64_t method_rows(const fg_compression_params *cp, int64_t t, int64_t n, const int32_t *spec) {
    const fg_policy *e = &cp->shortlist[0];
    const uint32_t c = e->components;
    if (c & FG_KEEP_FULL)
        return t;
    if (c & (FG_KEEP_PUNCT) || e->local_tokens || e->frequent_tokens)
        return -1;
    int32_t wt, kt, wn, kn; /* the library's w and k at t and at the prompt's length n */
    if (fg_policy_rows(e, (int32_t)t, &wt, &kt) != FG_OK || fg_policy_rows(e, (int32_t)n, &wn, &kn) != FG_OK)
        return -1;
    int64_t rows = 0;
    const int64_t w = c & FG_KEEP_LOCAL ? (wt > t ? t : wt) : 0;
    const int pin = (c & FG_KEEP_SPECIAL) != 0;
    if (pin) /* the special tokens, and the window's others */
        rows = spec[t] + w - (spec[t] - spec[t - w]);
    else
        rows = w;
    if (c & FG_KEEP_FREQUENT) { /* k(t) of the others */
        const int64_t others = t - rows;
        rows += kt < others ? kt : others;
    } else if (c & FG_KEEP_SNAPSHOT) { /* k(n) of the prompt's others outside its window, for good */
        const int64_t w_n = c & FG_KEEP_LOCAL ? (wn > n ? n : wn) : 0;
        const int64_t others = n - w_n - (pin ? spec[n - w_n] : 0);
        rows += kn < others ? kn : others;
    }
    return rows < t ? rows : t;
}

/* The ratio of `method` whose rows, summed over the lengths t0..t1-1,
 * come closest to `kept` of the full cache's. Returns 0 when the method has
 * no row count (it is then run at the budget, if it takes one). */
static int matched_params(const char *method, double kept, int64_t t0, int64_t t1, int64_t n, const int32_t *spec,
                          fg_compression_params *cp) {
    if (!method_params(method, 0.5, cp) || cp->budget > 0.0f || method_rows(cp, t0, n, spec) < 0)
        return 0; /* a budget mode runs at the budget */
    double full = 0.0;
    for (int64_t t = t0; t < t1; t++)
        full += (double)t;
    const double want = kept * full;
    double lo = 0.0, hi = 1.0;
    for (int it = 0; it < 40; it++) { /* the smallest ratio that reaches it */
        const double mid = 0.5 * (lo + hi);
        double rows = 0.0;
        method_params(method, mid, cp);
        for (int64_t t = t0; t < t1; t++)
            rows += (double)method_rows(cp, t, n, spec);
        if (rows < want)
            lo = mid;
        else
            hi = mid;
    }
    /* hi reaches it, lo falls short: the closer of the two */
    double r_hi = 0.0, r_lo = 0.0;
    method_params(method, lo, cp);
    for (int64_t t = t0; t < t1; t++)
        r_lo += (double)method_rows(cp, t, n, spec);
    method_params(method, hi, cp);
    for (int64_t t = t0; t < t1; t++)
        r_hi += (double)method_rows(cp, t, n, spec);
    method_params(method, want - r_lo < r_hi - want ? lo : hi, cp);
    return 1;
}

/* ---------------------------------------------------------------- runs */

/* KL(full || compressed) of one step. */
static double step_kl(const float *full, const float *comp, int32_t V) {
    const double lf = cli_logsumexp(full, V), lc = cli_logsumexp(comp, V);
    double kl = 0.0;
    for (int32_t v = 0; v < V; v++) {
        const double a = full[v] - lf;
        kl += exp(a) * (a - (comp[v] - lc));
    }
    return kl > 0.0 ? kl : 0.0;
}

/* The steps of n runs (sequences seqs, results out[i]) from the logits
 * each has in w->logits: teacher-forced on the reference (--sweep), or each
 * decoding its own greedy tokens until it stops or has n_steps of them
 * (--passkey: one answered question q more when its answer holds the
 * number). `last`: the token before the first step. Memory is sampled
 * before every step, into held and full. */
static fg_status steps(sweep *w, fgm_runner *r, const int32_t *seqs, int32_t n, int32_t q, int32_t last,
                       double *held, double *full, sw_result **out) {
    fg_context *ctx = fgm_runner_context(r);
    int32_t toks[SW_MAX_METHODS * SW_MAX_POINTS];
    char answer[SW_MAX_METHODS * SW_MAX_POINTS][256];
    int32_t alen[SW_MAX_METHODS * SW_MAX_POINTS] = {0};
    int done[SW_MAX_METHODS * SW_MAX_POINTS] = {0};
    const int32_t V = w->vocab;
    fg_status st = FG_OK;
    for (int i = 0; i < n; i++)
        answer[i][0] = '\0';
    for (int32_t t = 0; t < w->n_steps; t++) {
        int32_t live[SW_MAX_METHODS * SW_MAX_POINTS], ids[SW_MAX_METHODS * SW_MAX_POINTS], m = 0;
        for (int i = 0; i < n; i++) {
            fg_memory_stats ms;
            fg_memory(ctx, seqs[i], &ms);
            held[i] += (double)ms.rows_kept;
            full[i] += (double)ms.rows_full;
            const float *lg = w->logits + (size_t)i * V;
            if (!w->passkey) {
                const double kl = step_kl(w->ref_logits + (size_t)t * V, lg, V);
                out[i]->kl += kl;
                out[i]->kl_max = kl > out[i]->kl_max ? kl : out[i]->kl_max;
                const int same = cli_argmax(lg, V) == cli_argmax(w->ref_logits + (size_t)t * V, V);
                out[i]->top1 += same;
                if (!same && out[i]->agree < 0)
                    out[i]->agree = t;
                toks[i] = w->ref[t];
            } else if (!done[i]) {
                const int32_t prev = t ? toks[i] : last;
                toks[i] = cli_argmax(lg, V);
                const char *piece = fgm_tokenizer_decode(&w->s.tok, prev, toks[i]);
                done[i] = toks[i] == w->s.tok.eos || w->s.tok.control[toks[i]]; /* end of text, or of the turn */
                for (const char *c = piece; c && *c && alen[i] < (int32_t)sizeof answer[i] - 1; c++)
                    answer[i][alen[i]++] = *c;
                answer[i][alen[i]] = '\0';
            }
            if (!done[i]) {
                live[m] = i;
                ids[m++] = seqs[i];
            }
        }
        if (t + 1 == w->n_steps || m == 0)
            break;
        int32_t mt[SW_MAX_METHODS * SW_MAX_POINTS];
        for (int j = 0; j < m; j++)
            mt[j] = toks[live[j]];
        if ((st = fgm_runner_decode(r, m, ids, mt, w->logits)) != FG_OK)
            break;
        for (int j = m - 1; j >= 0; j--) /* row j to row live[j] >= j, the last first */
            if (live[j] != j)
                memcpy(w->logits + (size_t)live[j] * V, w->logits + (size_t)j * V, (size_t)V * sizeof *w->logits);
    }
    for (int i = 0; w->passkey && i < n; i++)
        out[i]->correct += strstr(answer[i], w->key[q]) != NULL;
    return st;
}

/* Runs n configurations (params cps, results out[i]) on one prompt and its
 * questions (steps). Several questions: each asked of a fork of every
 * configuration's compressed prompt, the forks released after it. */
static fg_status run_batch(sweep *w, fgm_runner *r, const int32_t *prompt, int32_t n_prompt, int32_t n,
                           const fg_compression_params *cps, sw_result **out) {
    int32_t seqs[SW_MAX_METHODS * SW_MAX_POINTS], kids[SW_MAX_METHODS * SW_MAX_POINTS];
    double held[SW_MAX_METHODS * SW_MAX_POINTS] = {0}, full[SW_MAX_METHODS * SW_MAX_POINTS] = {0};
    const int32_t V = w->vocab;
    fg_status st = fgm_runner_prefill_many(r, n, cps, prompt, n_prompt, seqs, w->logits);
    if (st)
        return st;
    int32_t recon[SW_MAX_METHODS * SW_MAX_POINTS], n_recon = 0; /* observe=reconstruct: one pass for them all */
    for (int i = 0; i < n; i++)
        if (cps[i].allocation == FG_ALLOC_ADAPTIVE && cps[i].observe == FG_OBSERVE_EXPLICIT)
            recon[n_recon++] = seqs[i];
    if (n_recon > 0) { /* the prompt again after the instruction, without the sequence's start */
        const int32_t skip = prompt[0] == w->s.tok.bos;
        const double t0 = cli_now();
        st = fgm_runner_reconstruct(r, n_recon, recon, w->recon, w->n_recon, prompt + skip, n_prompt - skip, NULL);
        w->t_recon += cli_now() - t0;
        w->n_recons++;
    }
    for (int i = 1; i < n; i++) /* the prompt's logits: the same under every policy */
        memcpy(w->logits + (size_t)i * V, w->logits, (size_t)V * sizeof *w->logits);
    for (int i = 0; i < n; i++) {
        memset(out[i], 0, sizeof *out[i]);
        out[i]->agree = -1;
    }
    const int forked = w->n_q > 1;
    for (int32_t q = 0; q < w->n_q && st == FG_OK; q++) {
        const int32_t *on = seqs;
        int32_t n_kids = 0;
        if (forked) {
            for (; n_kids < n && st == FG_OK; n_kids++)
                st = fgm_runner_fork(r, seqs[n_kids], &kids[n_kids]);
            n_kids -= st != FG_OK; /* the fork that failed made no sequence */
            on = kids;
        }
        for (int i = 0; i < n && st == FG_OK && w->n_turn[q] > 0; i++) /* the turn, on each cache as it is */
            st = fgm_runner_append(r, on[i], w->turn[q], w->n_turn[q], w->logits + (size_t)i * V);
        if (st == FG_OK)
            st = steps(w, r, on, n, q, w->n_turn[q] > 0 ? w->turn[q][w->n_turn[q] - 1] : prompt[n_prompt - 1],
                       held, full, out);
        for (int i = 0; i < n_kids; i++)
            fgm_runner_release(r, kids[i]);
    }
    for (int i = 0; i < n; i++) {
        const double n_steps = w->n_steps;
        out[i]->kl /= n_steps;
        out[i]->top1 /= n_steps;
        out[i]->kept = full[i] > 0 ? held[i] / full[i] : 1.0;
        out[i]->agree = out[i]->agree < 0 ? w->n_steps : out[i]->agree;
        out[i]->correct /= w->n_q;
        out[i]->made = st == FG_OK; /* a run that failed is not one */
        fgm_runner_release(r, seqs[i]);
    }
    return st;
}

/* The full cache's greedy reference: logits before each of n_steps tokens. */
static fg_status reference(sweep *w, const int32_t *prompt, int32_t n_prompt) {
    fg_compression_params cp;
    fg_compression_params_preset("full", &cp);
    int32_t seq = -1;
    const int32_t V = w->vocab;
    const double t0 = cli_now();
    fg_status st = fgm_runner_prefill(w->s.runner, &cp, prompt, n_prompt, &seq, w->ref_logits);
    w->t_prefill += cli_now() - t0;
    w->n_prefill++;
    if (st == FG_OK && w->n_turn[0] > 0) /* the first question's */
        st = fgm_runner_append(w->s.runner, seq, w->turn[0], w->n_turn[0], w->ref_logits);
    for (int32_t t = 0; st == FG_OK && t < w->n_steps; t++) {
        w->ref[t] = cli_argmax(w->ref_logits + (size_t)t * V, V);
        if (t + 1 < w->n_steps)
            st = fgm_runner_decode(w->s.runner, 1, &seq, &w->ref[t], w->ref_logits + (size_t)(t + 1) * V);
    }
    if (seq >= 0)
        fgm_runner_release(w->s.runner, seq);
    return st;
}

/* One prompt: the reference, the driven method at every budget, then every
 * other method at the memory each driven run kept. */
static fg_status sweep_prompt(sweep *w, int32_t p, const char *text, const eval_passkey *pk) {
    int32_t *prompt = NULL, n_prompt = 0;
    fg_status st = cli_encode(&w->s, text, &prompt, &n_prompt);
    w->n_q = pk ? pk->n : 1;
    for (int32_t q = 0; q < w->n_q; q++) {
        w->key[q] = pk ? pk->key[q] : NULL;
        w->turn[q] = NULL;
        w->n_turn[q] = 0;
        if (st == FG_OK && pk && pk->turn[q])
            st = cli_encode_more(&w->s, pk->turn[q], &w->turn[q], &w->n_turn[q]);
        if (st == FG_OK && n_prompt + w->n_turn[q] + w->n_steps > w->ctx_len)
            st = FG_ERR_CAPACITY;
    }
    /* the classes and the lengths the other methods are matched at: the first question's (the driven
     * run's kept share is over every question's decode; the turns differ by a few tokens) */
    const int32_t n_turn = w->n_turn[0];
    if (st == FG_OK)
        st = reference(w, prompt, n_prompt);
    /* the classes of the prompt, the second turn and the reference, and the special tokens before each length */
    const int32_t n_all = n_prompt + n_turn + w->n_steps;
    int32_t *all = malloc((size_t)n_all * sizeof *all);
    int32_t *spec = malloc((size_t)(n_all + 1) * sizeof *spec);
    fg_compression_params cps[SW_MAX_METHODS * SW_MAX_POINTS];
    sw_result *outs[SW_MAX_METHODS * SW_MAX_POINTS];
    if (!all || !spec)
        st = FG_ERR_OUT_OF_MEMORY;
    if (st == FG_OK) {
        memcpy(all, prompt, (size_t)n_prompt * sizeof *all);
        if (n_turn > 0)
            memcpy(all + n_prompt, w->turn[0], (size_t)n_turn * sizeof *all);
        memcpy(all + n_prompt + n_turn, w->ref, (size_t)w->n_steps * sizeof *all);
        st = fg_token_classes_classify(fgm_runner_classes(w->s.runner), all, n_all, 4, w->cls);
        spec[0] = 0;
        for (int32_t t = 0; t < n_all; t++)
            spec[t + 1] = spec[t] + (w->cls[t] == FG_TOKEN_SPECIAL);
    }
    /* per cache dtype: the driven method, then the others (a batch each) */
    const int64_t t0 = n_prompt + n_turn, t1 = t0 + w->n_steps; /* the lengths memory was sampled at */
    for (int32_t di = 0; st == FG_OK && di < w->n_dt; di++) {
        int n = 0;
        for (int32_t b = 0; b < w->n_points; b++, n++) {
            method_params(w->methods[0], row_budget(w, di, b), &cps[n]);
            outs[n] = result(w, di, p, 0, b);
        }
        st = run_batch(w, w->runners[di], prompt, n_prompt, n, cps, outs);
        w->failed = st ? w->runners[di] : NULL;
        n = 0;
        for (int32_t m = 1; st == FG_OK && m < w->n_methods; m++)
            for (int32_t b = 0; b < w->n_points; b++, n++) {
                if (!matched_params(w->methods[m], result(w, di, p, 0, b)->kept, t0, t1, n_prompt, spec, &cps[n]))
                    method_params(w->methods[m], row_budget(w, di, b), &cps[n]);
                outs[n] = result(w, di, p, m, b);
            }
        if (st == FG_OK && n > 0) {
            st = run_batch(w, w->runners[di], prompt, n_prompt, n, cps, outs);
            w->failed = st ? w->runners[di] : NULL;
        }
    }
    free(all);
    free(spec);
    free(prompt);
    for (int32_t q = 0; q < w->n_q; q++) {
        free(w->turn[q]);
        w->turn[q] = NULL;
        w->n_turn[q] = 0;
    }
    return st;
}

/* ---------------------------------------------------------------- report */

static uint64_t rng_next(uint64_t *s) {
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545f4914f6cdd1dull;
}

static int by_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Percentile bootstrap 95% interval of the mean of d[0..n) (2000 resamples, a fixed seed). */
static void bootstrap(const double *d, int32_t n, double *lo, double *hi) {
    enum { R = 2000 };
    static double means[R];
    uint64_t s = 0x9e3779b97f4a7c15ull;
    for (int r = 0; r < R; r++) {
        double sum = 0.0;
        for (int32_t i = 0; i < n; i++)
            sum += d[rng_next(&s) % (uint64_t)n];
        means[r] = sum / n;
    }
    qsort(means, R, sizeof means[0], by_double);
    *lo = means[(int)(0.025 * R)];
    *hi = means[(int)(0.975 * R) - 1];
}

/* Aggregates of one method at one point over the prompts that ran. */
typedef struct sw_agg {
    double kept, kept_lo, kept_hi, kl, kl_max, top1, agree, acc;
    double d, d_lo, d_hi; /* KL (or accuracy) minus the driven method's, paired, and its interval */
    double y_lo[2], y_hi[2]; /* bootstrap 95% intervals of the mean KL (passkey: accuracy) and top-1 */
    int32_t n;
} sw_agg;

static sw_agg aggregate(sweep *w, int32_t di, int32_t m, int32_t b, int passkey) {
    sw_agg a = {0};
    a.kept_lo = INFINITY;
    a.kept_hi = -INFINITY;
    double *d = malloc((size_t)w->n_prompts * 3 * sizeof *d), *y0 = d ? d + w->n_prompts : NULL;
    double *y1 = d ? d + 2 * (size_t)w->n_prompts : NULL;
    for (int32_t p = 0; p < w->n_prompts; p++) {
        const sw_result *r = result(w, di, p, m, b), *r0 = result(w, di, p, 0, b);
        if (!r->made || !r0->made)
            continue;
        if (d) {
            y0[a.n] = passkey ? (double)r->correct : r->kl;
            y1[a.n] = passkey ? (double)r->correct : r->top1;
        }
        a.kept += r->kept;
        a.kept_lo = fmin(a.kept_lo, r->kept);
        a.kept_hi = fmax(a.kept_hi, r->kept);
        a.kl += r->kl;
        a.kl_max = fmax(a.kl_max, r->kl_max);
        a.top1 += r->top1;
        a.agree += r->agree;
        a.acc += r->correct;
        if (d)
            d[a.n] = passkey ? (double)(r->correct - r0->correct) : r->kl - r0->kl;
        a.n++;
    }
    if (a.n > 0) {
        a.kept /= a.n;
        a.kl /= a.n;
        a.top1 /= a.n;
        a.agree /= a.n;
        a.acc /= a.n;
        double s = 0.0;
        for (int32_t i = 0; d && i < a.n; i++)
            s += d[i];
        a.d = d ? s / a.n : NAN;
        if (d) {
            bootstrap(d, a.n, &a.d_lo, &a.d_hi);
            bootstrap(y0, a.n, &a.y_lo[0], &a.y_hi[0]);
            bootstrap(y1, a.n, &a.y_lo[1], &a.y_hi[1]);
        } else {
            a.y_lo[0] = a.y_hi[0] = a.y_lo[1] = a.y_hi[1] = NAN;
        }
    }
    free(d);
    return a;
}

/* The driven method against method m: it "wins" when the interval of
 * (m - driven) KL lies above 0, "loses" when below, else "tie" (passkey:
 * accuracy, so the signs turn). */
static const char *verdict(const sw_agg *a, int passkey) {
    const double lo = passkey ? -a->d_hi : a->d_lo, hi = passkey ? -a->d_lo : a->d_hi;
    return lo > 0.0 ? "wins" : hi < 0.0 ? "loses" : "tie";
}

typedef sw_agg sw_aggs[SW_MAX_METHODS][SW_MAX_POINTS];

static void report_json_points(sweep *w, int32_t di, sw_aggs agg) {
    printf("\"points\": [");
    for (int32_t b = 0; b < w->n_points; b++) {
        printf("%s{\"budget\": %.3f, \"methods\": [", b ? ", " : "", (double)w->budgets[b]);
        for (int32_t m = 0; m < w->n_methods; m++) {
            const sw_agg *a = &agg[m][b];
            printf("%s{\"method\": ", m ? ", " : "");
            cli_json_string(stdout, w->methods[m]);
            printf(", \"prompts\": %d, \"kv_kept\": %.4f, \"kv_kept_range\": [%.4f, %.4f], ", (int)a->n, a->kept,
                   a->n ? a->kept_lo : 0.0, a->n ? a->kept_hi : 0.0);
            if (w->by_bytes)
                printf("\"kv_bytes\": %.4f, ", a->kept * w->bytes[di]);
            printf("\"kl_mean\": %.6f, \"kl_max\": %.6f, \"top1\": %.4f, \"agree\": %.2f, \"accuracy\": %.4f, "
                   "\"diff\": %.6f, \"diff_ci95\": [%.6f, %.6f], \"per_prompt\": [",
                   a->kl, a->kl_max, a->top1, a->agree, a->acc, a->d, a->d_lo, a->d_hi);
            for (int32_t p = 0; p < w->n_prompts; p++) {
                const sw_result *r = result(w, di, p, m, b);
                printf("%s[%.4f, %.6f, %.4f, %d, %.4f]", p ? ", " : "", r->kept, r->kl, r->top1, (int)r->agree,
                       r->correct);
            }
            printf("]}");
        }
        printf("]}");
    }
    printf("]");
}

/* The tables of one cache dtype: per point, every method against the driven one. */
static void report_tables(sweep *w, int32_t di, sw_aggs agg, int passkey) {
    const char *drv = w->methods[0];
    int nw = 18; /* the method column */
    for (int32_t m = 0; m < w->n_methods; m++)
        nw = (int)strlen(w->methods[m]) > nw ? (int)strlen(w->methods[m]) : nw;
    for (int32_t b = 0; b < w->n_points; b++) {
        const sw_agg *a0 = &agg[0][b];
        if (w->by_bytes)
            printf("\n%s, bytes %.2f (rows at %.3f): %s kept %.1f%% of the rows (%.1f-%.1f%% over %d prompts), %.1f%% "
                   "of the bytes\n",
                   fg_dtype_name(w->dts[di]), (double)w->budgets[b], (double)row_budget(w, di, b), drv, 100 * a0->kept,
                   100 * (a0->n ? a0->kept_lo : 0.0), 100 * (a0->n ? a0->kept_hi : 0.0), (int)a0->n,
                   100 * a0->kept * w->bytes[di]);
        else
            printf("\nbudget %.2f: %s kept %.1f%% (%.1f-%.1f%% over %d prompts)\n", (double)w->budgets[b], drv,
                   100 * a0->kept, 100 * (a0->n ? a0->kept_lo : 0.0), 100 * (a0->n ? a0->kept_hi : 0.0), (int)a0->n);
        if (passkey)
            printf("  %-*s %7s %9s %26s\n", nw, "method", "KV kept", "accuracy", "d(acc) [95% interval]");
        else
            printf("  %-*s %7s %9s %9s %7s %6s %30s\n", nw, "method", "KV kept", "KL mean", "KL max", "top-1",
                   "agree", "dKL [95% interval]");
        for (int32_t m = 0; m < w->n_methods; m++) {
            const sw_agg *a = &agg[m][b];
            if (passkey)
                printf("  %-*s %6.1f%% %8.1f%%", nw, w->methods[m], 100 * a->kept, 100 * a->acc);
            else
                printf("  %-*s %6.1f%% %9.4f %9.4f %6.1f%% %6.1f", nw, w->methods[m], 100 * a->kept, a->kl,
                       a->kl_max, 100 * a->top1, a->agree);
            if (m > 0)
                printf(passkey ? " %+7.3f [%+7.3f, %+7.3f] %s %s" : " %+9.4f [%+9.4f, %+9.4f] %s %s", a->d, a->d_lo,
                       a->d_hi, drv, verdict(a, passkey));
            printf("\n");
        }
    }
}

/* The summary lines of one dtype: the driven method and the best other one per point. */
static void report_summary(sweep *w, int32_t di, sw_aggs agg, int passkey) {
    const char *drv = w->methods[0];
    for (int32_t b = 0; b < w->n_points; b++) {
        int32_t best = -1, better = 0, ties = 0, worse = 0;
        for (int32_t m = 1; m < w->n_methods; m++) {
            const sw_agg *a = &agg[m][b];
            const double v = passkey ? -a->acc : a->kl;
            if (best < 0 || v < (passkey ? -agg[best][b].acc : agg[best][b].kl))
                best = m;
            const char *vd = verdict(a, passkey);
            better += !strcmp(vd, "wins");
            ties += !strcmp(vd, "tie");
            worse += !strcmp(vd, "loses");
        }
        if (best < 0)
            continue;
        char what[64] = "";
        if (w->by_bytes)
            snprintf(what, sizeof what, "%s ", fg_dtype_name(w->dts[di]));
        if (passkey)
            printf("summary: %sbudget %.2f kept %.1f%%: %s accuracy %.1f%%, best other %s %.1f%%; wins %d, "
                   "ties %d, loses %d\n", what, (double)w->budgets[b], 100 * agg[0][b].kept, drv, 100 * agg[0][b].acc,
                   w->methods[best], 100 * agg[best][b].acc, better, ties, worse);
        else
            printf("summary: %sbudget %.2f kept %.1f%%: %s KL %.4f, best other %s %.4f; wins %d, ties %d, "
                   "loses %d\n", what, (double)w->budgets[b], 100 * agg[0][b].kept, drv, agg[0][b].kl,
                   w->methods[best], agg[best][b].kl, better, ties, worse);
    }
}

/* --dtypes: per byte budget, the best method of each dtype, and the best
 * quantized combination against the best one of the reference's dtype,
 * paired over the prompts with a bootstrap 95% interval. */
static void report_bytes(sweep *w, sw_aggs *agg, int passkey, fg_dtype ref) {
    printf("\nby bytes of the full %s cache (%s is better):\n", fg_dtype_name(ref),
           passkey ? "higher accuracy" : "lower KL");
    int32_t r0 = -1; /* the reference's dtype among the runs */
    for (int32_t di = 0; di < w->n_dt; di++)
        r0 = r0 < 0 && w->dts[di] == ref ? di : r0;
    double *d = malloc((size_t)w->n_prompts * sizeof *d);
    for (int32_t b = 0; b < w->n_points; b++) {
        printf("  bytes %.2f:", (double)w->budgets[b]);
        int32_t best_m[SW_MAX_DTYPES], best_all = -1;
        for (int32_t di = 0; di < w->n_dt; di++) {
            best_m[di] = 0;
            for (int32_t m = 1; m < w->n_methods; m++) {
                const double v = passkey ? -agg[di][m][b].acc : agg[di][m][b].kl;
                if (v < (passkey ? -agg[di][best_m[di]][b].acc : agg[di][best_m[di]][b].kl))
                    best_m[di] = m;
            }
            const sw_agg *a = &agg[di][best_m[di]][b];
            printf("%s %s %s %s %.4f (bytes %.3f)", di ? ";" : "", fg_dtype_name(w->dts[di]), w->methods[best_m[di]],
                   passkey ? "accuracy" : "KL", passkey ? a->acc : a->kl, a->kept * w->bytes[di]);
            const double v = passkey ? -a->acc : a->kl;
            if (best_all < 0 || v < (passkey ? -agg[best_all][best_m[best_all]][b].acc
                                             : agg[best_all][best_m[best_all]][b].kl))
                best_all = di;
        }
        printf("\n    best: %s + %s", fg_dtype_name(w->dts[best_all]), w->methods[best_m[best_all]]);
        /* the best of the other dtypes against the reference dtype's best, paired */
        int32_t bq = -1;
        for (int32_t di = 0; di < w->n_dt; di++)
            if (di != r0 && (bq < 0 || agg[di][best_m[di]][b].kl < agg[bq][best_m[bq]][b].kl))
                bq = di;
        if (r0 >= 0 && bq >= 0 && d && !passkey) {
            int32_t n = 0;
            for (int32_t p = 0; p < w->n_prompts; p++) {
                const sw_result *x = result(w, bq, p, best_m[bq], b), *y = result(w, r0, p, best_m[r0], b);
                if (x->made && y->made)
                    d[n++] = x->kl - y->kl;
            }
            double mean = 0.0, lo = NAN, hi = NAN;
            for (int32_t i = 0; i < n; i++)
                mean += d[i] / n;
            if (n > 0)
                bootstrap(d, n, &lo, &hi);
            printf("; %s + %s - %s + %s: dKL %+.4f [%+.4f, %+.4f] over %d prompts (%s)", fg_dtype_name(w->dts[bq]),
                   w->methods[best_m[bq]], fg_dtype_name(w->dts[r0]), w->methods[best_m[r0]], mean, lo, hi, (int)n,
                   hi < 0.0 ? "better" : lo > 0.0 ? "worse" : "tie");
        } else if (r0 < 0 && !passkey) {
            printf(" (no paired difference: %s, the reference's dtype, is not among --dtypes)", fg_dtype_name(ref));
        }
        printf("\n");
    }
    free(d);
}

static int report(sweep *w, const cli_opts *o, double seconds, int passkey) {
    const char *drv = w->methods[0];
    sw_aggs *agg = calloc((size_t)w->n_dt, sizeof *agg);
    if (!agg) {
        fprintf(stderr, "fastgen eval: out of memory\n");
        return 1;
    }
    for (int32_t di = 0; di < w->n_dt; di++)
        for (int32_t m = 0; m < w->n_methods; m++)
            for (int32_t b = 0; b < w->n_points; b++)
                agg[di][m][b] = aggregate(w, di, m, b, passkey);
    if (o->json) {
        printf("{\"task\": \"%s\", \"model\": ", passkey ? "passkey" : "sweep");
        cli_json_string(stdout, o->model);
        printf(", \"prompts\": %d, \"steps\": %d, \"driven\": ", (int)w->n_prompts, (int)w->n_steps);
        cli_json_string(stdout, drv);
        printf(", ");
        if (w->n_dt == 1) {
            report_json_points(w, 0, agg[0]);
        } else {
            printf("\"reference_dtype\": \"%s\", \"dtypes\": [", fg_dtype_name(o->dtype));
            for (int32_t di = 0; di < w->n_dt; di++) {
                printf("%s{\"dtype\": \"%s\", \"bytes_per_row\": %.4f, ", di ? ", " : "", fg_dtype_name(w->dts[di]),
                       w->bytes[di]);
                report_json_points(w, di, agg[di]);
                printf("}");
            }
            printf("]");
        }
        printf("}\n");
    } else {
        printf("fastgen eval --%s: %d prompts x %d %s tokens, %s (%.1f s)\n", passkey ? "passkey" : "sweep",
               (int)w->n_prompts, (int)w->n_steps, passkey ? "greedy" : "teacher-forced", o->model, seconds);
        printf("every method at the KV memory %s kept on each prompt (its ratio bisected; budget modes at the "
               "budget);\n%s = method - %s, paired, with a bootstrap 95%% interval over the prompts (wins: the interval is above 0)\n",
               drv, passkey ? "d(acc)" : "dKL", drv);
        if (w->n_recons > 0) /* observe=reconstruct: a pass over the prompt again, per run */
            printf("reconstruction passes with their compression (one per batch of runs): %.2f s each on average "
                   "(%d), a full-cache prefill of the prompt %.2f s (%d): %.2fx\n",
                   w->t_recon / w->n_recons, (int)w->n_recons, w->t_prefill / w->n_prefill, (int)w->n_prefill,
                   (w->t_recon / w->n_recons) / (w->t_prefill / w->n_prefill));
        if (w->by_bytes) {
            printf("caches of %d dtypes against the full %s cache's reference; budgets are bytes of that cache:",
                   (int)w->n_dt, fg_dtype_name(o->dtype));
            for (int32_t di = 0; di < w->n_dt; di++)
                printf("%s %s rows are %.3f of its bytes", di ? "," : "", fg_dtype_name(w->dts[di]), w->bytes[di]);
            printf("\n");
        }
        for (int32_t di = 0; di < w->n_dt; di++)
            report_tables(w, di, agg[di], passkey);
        printf("\n");
        for (int32_t di = 0; di < w->n_dt; di++)
            report_summary(w, di, agg[di], passkey);
        if (w->by_bytes)
            report_bytes(w, agg, passkey, o->dtype);
    }
    int rc = 0;
    if (o->svg) {
        enum { NS = SW_MAX_DTYPES * SW_MAX_METHODS };
        static double xs[NS][SW_MAX_POINTS], y0[NS][SW_MAX_POINTS], y1[NS][SW_MAX_POINTS];
        static double lo[2][NS][SW_MAX_POINTS], hi[2][NS][SW_MAX_POINTS];
        static char names[NS][96];
        svg_series s0[NS], s1[NS];
        int32_t ns = 0;
        for (int32_t di = 0; di < w->n_dt; di++)
            for (int32_t m = 0; m < w->n_methods; m++, ns++) {
                for (int32_t b = 0; b < w->n_points; b++) {
                    const sw_agg *a = &agg[di][m][b];
                    xs[ns][b] = w->by_bytes ? a->kept * w->bytes[di] : a->kept;
                    y0[ns][b] = passkey ? a->acc : a->kl;
                    y1[ns][b] = passkey ? a->acc : a->top1;
                    for (int k = 0; k < 2; k++) {
                        lo[k][ns][b] = a->y_lo[k];
                        hi[k][ns][b] = a->y_hi[k];
                    }
                }
                if (w->by_bytes)
                    snprintf(names[ns], sizeof names[ns], "%s %s", w->methods[m], fg_dtype_name(w->dts[di]));
                else
                    snprintf(names[ns], sizeof names[ns], "%s", w->methods[m]);
                cli_utf8_whole(names[ns]); /* a long name is cut between characters */
                s0[ns] = (svg_series){names[ns], w->n_points, xs[ns], y0[ns], lo[0][ns], hi[0][ns]};
                s1[ns] = (svg_series){names[ns], w->n_points, xs[ns], y1[ns], lo[1][ns], hi[1][ns]};
            }
        const char *xl = w->by_bytes ? "KV bytes kept / full cache of the reference dtype" : SVG_MEMORY_LABEL;
        char sub[512];
        const char *slash = strrchr(o->model, '/');
        snprintf(sub, sizeof sub, "%s: %d prompts, %d %s tokens each; bands: bootstrap 95%% intervals over the "
                 "prompts", slash ? slash + 1 : o->model, (int)w->n_prompts, (int)w->n_steps,
                 passkey ? "answer" : "teacher-forced");
        cli_utf8_whole(sub);
        const svg_chart charts[2] = {
            {passkey ? "Passkey accuracy vs KV memory kept" : "Mean KL(full || compressed) vs KV memory kept", xl,
             passkey ? "accuracy" : "mean KL", s0, ns, 1, passkey, sub},
            {"Top-1 agreement with the full cache vs KV memory kept", xl, "top-1 agreement", s1, ns, 1, 1, sub},
        };
        FILE *fp = fopen(o->svg, "w");
        int bad = !fp || svg_charts(fp, charts, passkey ? 1 : 2) != 0;
        if (fp)
            bad |= fclose(fp) != 0;
        if (bad) {
            fprintf(stderr, "fastgen eval: cannot write %s\n", o->svg);
            rc = 1;
        }
    }
    free(agg);
    return rc;
}

/* ---------------------------------------------------------------- driver */

static int parse_list(const char *text, const char **names, float *values, int32_t max, int32_t *n, char *buf,
                      size_t buf_size) {
    *n = 0;
    if (strlen(text) >= buf_size) /* refused whole, never cut */
        return 0;
    snprintf(buf, buf_size, "%s", text);
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        if (*n == max)
            return 0;
        if (names) {
            names[(*n)++] = tok;
        } else {
            float v = 0.0f;
            if (!cli_parse_float(tok, 0.0f, 1.0f, &v) || v == 0.0f)
                return 0;
            values[(*n)++] = v;
        }
    }
    return *n > 0;
}

int eval_sweep(const cli_opts *o, const eval_sweep_opts *x, char **prompts, const eval_passkey *passkeys,
               int32_t n_prompts) {
    sweep w;
    memset(&w, 0, sizeof w);
    w.x = x;
    static char mbuf[1024], bbuf[256];
    if (x->methods) {
        if (!parse_list(x->methods, w.methods, NULL, SW_MAX_METHODS, &w.n_methods, mbuf, sizeof mbuf))
            return cli_usage("eval", "--methods takes 1 to %d comma-separated policy names", SW_MAX_METHODS);
    } else {
        w.n_methods = (int32_t)(sizeof k_default_methods / sizeof k_default_methods[0]);
        memcpy(w.methods, k_default_methods, sizeof k_default_methods);
    }
    if (x->budgets) {
        if (!parse_list(x->budgets, NULL, w.budgets, SW_MAX_POINTS, &w.n_points, bbuf, sizeof bbuf))
            return cli_usage("eval", "--budgets takes 1 to %d comma-separated fractions in (0, 1]", SW_MAX_POINTS);
    } else {
        w.n_points = (int32_t)(sizeof k_default_budgets / sizeof k_default_budgets[0]);
        memcpy(w.budgets, k_default_budgets, sizeof k_default_budgets);
    }
    for (int32_t m = 0; m < w.n_methods; m++) {
        fg_compression_params cp;
        if (!method_params(w.methods[m], 0.5, &cp))
            return cli_usage("eval", "--methods: \"%s\" is not a policy a sweep can drive (a preset that takes a "
                                     "budget, or a one-entry preset, with options each after a colon: window=, "
                                     "defer=, floor=, pool=, sink=, families=, flags=, tol=, observe=, alloc=)", w.methods[m]);
    }
    w.n_dt = 1;
    w.dts[0] = o->dtype;
    w.by_bytes = x->dtypes != NULL;
    if (x->dtypes && o->v_dtype >= 0)
        return cli_usage("eval", "--dtypes stores K and V in each type it names: -ctk / -ctv do not go with it");
    if (x->dtypes) {
        char dbuf[128];
        if (strlen(x->dtypes) >= sizeof dbuf)
            return cli_usage("eval", "--dtypes takes up to %d of f32, f16, bf16, q8_0, q4_0, comma-separated",
                             SW_MAX_DTYPES);
        snprintf(dbuf, sizeof dbuf, "%s", x->dtypes);
        w.n_dt = 0;
        for (char *tok = strtok(dbuf, ","); tok; tok = strtok(NULL, ",")) {
            if (w.n_dt == SW_MAX_DTYPES || fg_dtype_parse(tok, &w.dts[w.n_dt]) != FG_OK)
                return cli_usage("eval", "--dtypes takes up to %d of f32, f16, bf16, q8_0, q4_0, comma-separated: %s",
                                 SW_MAX_DTYPES, x->dtypes);
            w.n_dt++;
        }
    }
    w.n_cfg = (w.n_methods > 1 ? w.n_methods - 1 : 1) * w.n_points;
    if (w.n_points > w.n_cfg)
        w.n_cfg = w.n_points;
    w.n_steps = o->n;
    w.n_prompts = n_prompts;
    w.passkey = passkeys != NULL;
    int forks = 0; /* some prompt has several questions: every configuration forked for each */
    for (int32_t p = 0; passkeys && p < n_prompts; p++)
        forks |= passkeys[p].n > 1;

    int reconstruct = 0; /* some method reconstructs its prompt: the runner holds it twice */
    for (int32_t m = 0; m < w.n_methods; m++) {
        fg_compression_params cp;
        reconstruct |= method_params(w.methods[m], 0.5, &cp) && cp.observe == FG_OBSERVE_EXPLICIT;
    }
    char err[512];
    fg_status st = cli_load(o, &w.s, err, sizeof err);
    int32_t longest = 0, longest_doc = 0;
    for (int32_t p = 0; st == FG_OK && p < n_prompts; p++) {
        int32_t *ids = NULL, n = 0;
        if (cli_encode(&w.s, prompts[p], &ids, &n) == FG_OK)
            for (int32_t q = 0; passkeys && q < passkeys[p].n && passkeys[p].turn[q]; q++) {
                int32_t *more = NULL, n_more = 0;
                cli_encode_more(&w.s, passkeys[p].turn[q], &more, &n_more);
                longest = n + n_more > longest ? n + n_more : longest;
                free(more);
            }
        longest = n > longest ? n : longest;
        longest_doc = n > longest_doc ? n : longest_doc;
        free(ids);
    }
    if (st == FG_OK && reconstruct) { /* KVzip's instruction, in the chat's form where the prompts have one */
        int chat = 0;
        for (int32_t p = 0; p < n_prompts; p++)
            chat |= strstr(prompts[p], "<|im_start|>") != NULL;
        st = cli_reconstruct_prefix(&w.s, chat, &w.recon, &w.n_recon);
        if (st == FG_OK && longest_doc * 2 + w.n_recon > longest) /* the document again after it, at once */
            longest = longest_doc * 2 + w.n_recon;
    }
    /* the reference's runner (--dtype), and one per other dtype of --dtypes */
    for (int32_t di = -1; st == FG_OK && di < w.n_dt; di++) {
        if (di >= 0 && w.dts[di] == o->dtype) {
            w.runners[di] = w.s.runner;
            continue;
        }
        fgm_runner_params rp = {.backend = o->backend, .max_seqs = (forks ? 2 : 1) * w.n_cfg, .max_len = longest + o->n,
                                .q8_activations = o->q8_activations, .prefill_chunk = o->prefill_chunk,
                                .n_threads = o->threads};
        cli_runner_dtypes(o, &rp); /* the reference's: --dtype, or -ctk / -ctv */
        if (di >= 0)
            rp.kv_dtype = w.dts[di];
        st = fgm_runner_create(&w.s.model, &w.s.tok, &rp, di < 0 ? &w.s.runner : &w.runners[di], err, sizeof err);
    }
    for (int32_t di = 0; st == FG_OK && di < w.n_dt; di++) {
        const int32_t hd = w.s.model.config.head_size;
        w.bytes[di] = (double)fg_kv_row_bytes(w.dts[di], hd) / (double)fg_kv_row_bytes(o->dtype, hd);
    }
    int rc = 1;
    if (st) {
        fprintf(stderr, "fastgen eval: %s\n", err);
        goto done;
    }
    w.vocab = w.s.model.config.vocab_size;
    w.ctx_len = longest + o->n < w.s.model.config.seq_len ? longest + o->n : w.s.model.config.seq_len;
    w.ref = malloc((size_t)o->n * sizeof *w.ref);
    w.ref_logits = malloc((size_t)o->n * w.vocab * sizeof *w.ref_logits);
    w.logits = malloc((size_t)w.n_cfg * w.vocab * sizeof *w.logits);
    w.cls = malloc((size_t)w.ctx_len + 1);
    w.res = calloc((size_t)w.n_dt * n_prompts * w.n_methods * w.n_points, sizeof *w.res);
    if (!w.ref || !w.ref_logits || !w.logits || !w.cls || !w.res) {
        fprintf(stderr, "fastgen eval: out of memory\n");
        goto done;
    }
    const int show = !o->quiet && isatty(2);
    const double t0 = cli_now();
    int32_t n_done = 0;
    for (int32_t p = 0; p < n_prompts; p++) {
        if (show) {
            fprintf(stderr, "\r  prompt %d/%d", (int)p + 1, (int)n_prompts);
            fflush(stderr);
        }
        st = sweep_prompt(&w, p, prompts[p], passkeys ? &passkeys[p] : NULL);
        if (st == FG_ERR_CAPACITY) {
            fprintf(stderr, "fastgen eval: prompt %d plus %d tokens does not fit the context; skipped\n", (int)p + 1,
                    (int)o->n);
            continue;
        }
        if (st) {
            fprintf(stderr, "fastgen eval: %s\n", cli_reason(w.failed ? w.failed : w.s.runner, st));
            goto done;
        }
        n_done++;
    }
    if (show)
        fprintf(stderr, "\n");
    if (n_done == 0) {
        fprintf(stderr, "fastgen eval: no prompt fits the context with -n %d; nothing to report\n", (int)o->n);
        goto done;
    }
    rc = report(&w, o, cli_now() - t0, w.passkey);
done:
    free(w.recon);
    free(w.ref);
    free(w.ref_logits);
    free(w.logits);
    free(w.cls);
    free(w.res);
    for (int32_t di = 0; di < w.n_dt; di++)
        if (w.runners[di] && w.runners[di] != w.s.runner)
            fgm_runner_destroy(&w.runners[di]);
    cli_close(&w.s);
    return rc;
}
