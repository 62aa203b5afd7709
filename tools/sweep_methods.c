/* fastgen eval --sweep: each method's parameters, at a budget or at the
 * memory another run kept (tools/sweep.h). */
#define FG_EXPERIMENTAL /* FG_ADAPTIVE_*, fg_cpu_describe (fastgen.h) */
#include <stdio.h>
#include <string.h>

#include "tools/sweep.h"

/* Methods whose budget is a parameter of their own: they run at the point's budget. */
int sweep_takes_budget(const char *m) { return !strncmp(m, "fastgen-budget", 14) || !strncmp(m, "fastgen-adaptive", 16); }

/* The parameters of `method` (a preset, options after a colon, as
 * fg_compression_params_parse takes them: "fastgen-adaptive:window=64")
 * with knob r: the budget, or the ratio of a one-entry preset (see
 * fg_compression_params_parse: a window and a frequent or snapshot part
 * take r / 2 each). */
int sweep_method_params(const char *method, double r, fg_compression_params *cp) {
    char name[64], spec[512];
    const char *colon = strchr(method, ':');
    snprintf(name, sizeof name, "%.*s", colon ? (int)(colon - method) : (int)strlen(method), method);
    if (fg_compression_params_preset(name, cp) != FG_OK)
        return 0;
    const int knob = sweep_takes_budget(name) || (cp->n_policies == 1 && !(cp->shortlist[0].components & FG_KEEP_FULL));
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
int sweep_matched_params(const char *method, double kept, int64_t t0, int64_t t1, int64_t n, const int32_t *spec,
                          fg_compression_params *cp) {
    if (!sweep_method_params(method, 0.5, cp) || cp->budget > 0.0f || method_rows(cp, t0, n, spec) < 0)
        return 0; /* a budget mode runs at the budget */
    double full = 0.0;
    for (int64_t t = t0; t < t1; t++)
        full += (double)t;
    const double want = kept * full;
    double lo = 0.0, hi = 1.0;
    for (int it = 0; it < 40; it++) { /* the smallest ratio that reaches it */
        const double mid = 0.5 * (lo + hi);
        double rows = 0.0;
        sweep_method_params(method, mid, cp);
        for (int64_t t = t0; t < t1; t++)
            rows += (double)method_rows(cp, t, n, spec);
        if (rows < want)
            lo = mid;
        else
            hi = mid;
    }
    /* hi reaches it, lo falls short: the closer of the two */
    double r_hi = 0.0, r_lo = 0.0;
    sweep_method_params(method, lo, cp);
    for (int64_t t = t0; t < t1; t++)
        r_lo += (double)method_rows(cp, t, n, spec);
    sweep_method_params(method, hi, cp);
    for (int64_t t = t0; t < t1; t++)
        r_hi += (double)method_rows(cp, t, n, spec);
    sweep_method_params(method, want - r_lo < r_hi - want ? lo : hi, cp);
    return 1;
}
