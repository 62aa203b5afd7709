/* fastgen eval --sweep / --passkey: the report of a sweep (tools/sweep.h):
 * per memory point and method, KL, top-1 agreement, the paired difference
 * against the driven method with a bootstrap interval, the passkey
 * accuracy; as tables, JSON or CSV, with the summary and the SVG chart. */
#define FG_EXPERIMENTAL /* FG_ADAPTIVE_*, fg_cpu_describe (fastgen.h) */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tools/svg.h"
#include "tools/sweep.h"

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

int sweep_report(sweep *w, const cli_opts *o, double seconds, int passkey) {
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
