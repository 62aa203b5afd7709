/*
 * bench_profile: profiling (pass 2 of docs/design.md §2.3) against the prefill
 * attention of the same prompt, and both against an sgemm rate measured in
 * the same run on the profiling tile (64 x 256 x d, one single-threaded sgemm
 * per thread). Shape: one Llama-3-8B layer (32 q / 8 KV heads, d = 128),
 * prompts of 1k, 4k and 8k tokens. Flops counted: profiling = the causal
 * half of Q K^T (2 n^2/2 d per query head); prefill = Q K^T and P V.
 * Last line:
 *   profile summary: profile_over_prefill=R gemm_fraction=G
 * R: median over prompts of time(profile) / time(prefill attention);
 * G: median of profiling GFLOP/s / sgemm GFLOP/s.
 *
 * Then the adaptive mode's whole cost (the observation ring,
 * every family's error curve, the allocation and the compression), through
 * the public API: four layers of the same shape prefilled with the preset
 * "fastgen-adaptive" (budget 0.5; --adaptive SPEC another, as fastgen
 * eval --methods writes it: "fastgen-adaptive:window=32") against "full"
 * (attention and the cache write only), interleaved, same prompt. Last line:
 *   adaptive summary: adaptive_over_prefill=R
 * R: median over prompts of (time(adaptive) - time(full)) / time(full).
 * Options: --csv, --quick (1k and 4k), --backend NAME, --adaptive SPEC.
 */
#include <math.h>

#include "backends/backend.h"
#include "bench_util.h"

/* Seconds to prefill `layers` layers of one sequence of n tokens under `spec`
 * (fg_compression_params_parse: a preset and its options). */
static double prefill_seconds(const char *backend, const char *spec, int32_t layers, int32_t n, const float *q,
                              const float *k, const float *v, float *out, const fg_token_classes *classes) {
    fg_context_params p;
    fg_context_params_default(&p);
    p.backend = backend;
    p.n_layers = layers;
    p.n_q_heads = 32;
    p.n_kv_heads = 8;
    p.head_dim = 128;
    p.kv_dtype = FG_DTYPE_F16;
    p.max_seqs = 1;
    p.max_seq_len = n + 16;
    p.classes = classes;
    fg_compression_params cp;
    fg_context *ctx = NULL;
    int32_t *prompt = malloc((size_t)n * sizeof *prompt), seq = -1;
    if (!prompt || fg_compression_params_parse(spec, &cp) || fg_context_create(&p, &ctx)) {
        fprintf(stderr, "bench_profile: %s\n", fg_last_error(ctx));
        free(prompt);
        return -1.0;
    }
    for (int32_t i = 0; i < n; i++)
        prompt[i] = i == 0 ? 1 : (i % 11 == 0 ? 2 : 3 + (int32_t)((i * 7919u) % 90u));
    fg_status st = fg_seq_create(ctx, &cp, prompt, n, &seq);
    const double t0 = bench_now();
    for (int32_t l = 0; l < layers && st == FG_OK; l++)
        st = fg_prefill(ctx, seq, l, q, k, v, out);
    if (st == FG_OK)
        st = fg_synchronize(ctx);
    const double t = bench_now() - t0;
    if (st != FG_OK)
        fprintf(stderr, "bench_profile: %s: %s\n", fg_status_string(st), fg_last_error(ctx));
    fg_context_destroy(&ctx);
    free(prompt);
    return st == FG_OK ? t : -1.0;
}

/* The adaptive mode's cost over a full prefill, printed per prompt length; the median ratio. */
static int adaptive_cost(const char *backend, const char *spec, int csv, int quick, double *median) {
    enum { LAYERS = 4, HQ = 32, HKV = 8, D = 128 };
    fg_token_classes *classes = NULL;
    if (fg_token_classes_create(100, NULL, &classes))
        return 1;
    fg_token_classes_set(classes, 1, FG_TOKEN_SPECIAL);
    fg_token_classes_set(classes, 2, FG_TOKEN_PUNCT);
    if (csv) /* a second table: a comment line before its header */
        printf("# adaptive mode against full, %d layers\nn,full_s,adaptive_s,adaptive_over_prefill\n", LAYERS);
    else
        printf("%6s %11s %11s %9s   (%d layers, %s against full)\n", "n", "full s", "adaptive s", "ratio", LAYERS,
               spec);
    const int32_t lengths[] = {1024, 4096, 8192};
    double ratios[3];
    int count = 0;
    for (int li = 0; li < (quick ? 2 : 3); li++) {
        const int32_t n = lengths[li];
        const size_t nq = (size_t)n * HQ * D, nk = (size_t)n * HKV * D;
        float *q = malloc(nq * sizeof *q), *k = malloc(nk * sizeof *k), *v = malloc(nk * sizeof *v);
        float *out = malloc(nq * sizeof *out);
        if (!q || !k || !v || !out)
            return 1;
        for (size_t i = 0; i < nq; i++)
            q[i] = (float)((i * 7919) % 1000) / 500.0f - 1.0f;
        for (size_t i = 0; i < nk; i++) {
            k[i] = (float)((i * 104729) % 1000) / 500.0f - 1.0f;
            v[i] = (float)((i * 15485863) % 1000) / 500.0f - 1.0f;
        }
        double tf[3], ta[3];
        const int reps = n <= 1024 ? 3 : 2;
        for (int r = 0; r < reps; r++) { /* interleaved */
            tf[r] = prefill_seconds(backend, "full", LAYERS, n, q, k, v, out, classes);
            ta[r] = prefill_seconds(backend, spec, LAYERS, n, q, k, v, out, classes);
            if (tf[r] < 0 || ta[r] < 0)
                return 1;
        }
        const double t_full = bench_median(tf, reps), t_ad = bench_median(ta, reps);
        ratios[count++] = (t_ad - t_full) / t_full;
        if (csv)
            printf("%d,%.4f,%.4f,%.3f\n", (int)n, t_full, t_ad, (t_ad - t_full) / t_full);
        else
            printf("%6d %11.4f %11.4f %9.3f\n", (int)n, t_full, t_ad, (t_ad - t_full) / t_full);
        free(q);
        free(k);
        free(v);
        free(out);
    }
    fg_token_classes_destroy(&classes);
    *median = bench_median(ratios, count);
    return 0;
}

int main(int argc, char **argv) {
    const int csv = bench_has_flag(argc, argv, "--csv"), quick = bench_has_flag(argc, argv, "--quick");
    const char *spec = bench_arg(argc, argv, "--adaptive");
    fg_compression_params spec_cp;
    if (spec && fg_compression_params_parse(spec, &spec_cp) != FG_OK) { /* refused before any run */
        fprintf(stderr, "bench_profile: --adaptive %s: %s\n", spec, fg_last_error(NULL));
        return 2;
    }
    const char *backend;
    fg_backend be;
    if (bench_open_backend(argc, argv, &be, &backend) != FG_OK)
        return 1;
    const int32_t Hq = 32, Hkv = 8, d = 128;
    const fg_shape sh = {Hq, Hkv, d};
    const int dev = bench_is_device(&be);
    fg_device_info di = {.n_sm = 0};
    if (dev && bench_device_info(&be)(&be, &di))
        return 1;
    be.device_io = dev; /* on a GPU, q/k/v, the output and the row statistics live on the device */
    const double gemm = dev ? 0.0 : bench_sgemm_rate(64, 256, d);
    if (dev)
        printf("# bench_profile: backend %s on %s%s, timed by device events (the profile includes copying its "
               "columns to the host), no sgemm ceiling (gemm_fraction 0)\n",
               backend, di.name, di.emulated ? " [HIP-CPU EMULATION: the figures are the host's]" : "");
    else
        printf("# bench_profile: backend %s, %d threads, sgemm on the 64x256x%d tile: %.1f GFLOP/s\n", backend,
               bench_threads(), (int)d, gemm / 1e9);
    if (csv)
        printf("n,prefill_s,profile_s,profile_over_prefill,prefill_gflops,profile_gflops,gemm_fraction\n");
    else
        printf("%6s %11s %11s %9s %14s %14s %9s\n", "n", "prefill s", "profile s", "ratio", "prefill GF/s",
               "profile GF/s", "of sgemm");
    const int32_t lengths[] = {1024, 4096, 8192};
    double ratios[3], fracs[3];
    int count = 0;
    for (int li = 0; li < (quick ? 2 : 3); li++) {
        const int32_t n = lengths[li];
        const size_t nq = (size_t)n * Hq * d, nk = (size_t)n * Hkv * d;
        float *q = malloc(nq * sizeof *q), *k = malloc(nk * sizeof *k), *v = malloc(nk * sizeof *v);
        float *out = malloc(nq * sizeof *out), *mx = malloc((size_t)Hq * n * sizeof *mx);
        float *sm = malloc((size_t)Hq * n * sizeof *sm), *col = malloc((size_t)Hkv * n * sizeof *col);
        float *cl = malloc((size_t)Hkv * n * sizeof *cl);
        for (size_t i = 0; i < nq; i++)
            q[i] = (float)((i * 7919) % 1000) / 500.0f - 1.0f;
        for (size_t i = 0; i < nk; i++)
            k[i] = v[i] = (float)((i * 104729) % 1000) / 500.0f - 1.0f;
        fg_profile_request req = {.n = n, .row_begin = 0, .n_windows = 1, .window = {(int32_t)ceil(0.3 * n)}};
        const int reps = n <= 1024 ? 5 : 3;
        double tp[5], tf[5];
        const float *aq = q, *ak = k, *av = v;
        float *aout = out, *amx = mx, *asm_ = sm;
        if (dev) {
            aq = bench_device_copy(&be, q, nq * 4);
            ak = bench_device_copy(&be, k, nk * 4);
            av = bench_device_copy(&be, v, nk * 4);
            aout = bench_device_copy(&be, NULL, nq * 4);
            amx = bench_device_copy(&be, NULL, (size_t)Hq * n * 4);
            asm_ = bench_device_copy(&be, NULL, (size_t)Hq * n * 4);
            if (!aq || !ak || !av || !aout || !amx || !asm_)
                return 1;
        }
        for (int r = 0; r < reps; r++) { /* interleaved */
            double t0 = bench_region(&be, dev, 0, 0.0);
            if (be.ops->prefill_attention(&be, &sh, n, 0, aq, ak, av, aout, amx, asm_))
                return 1;
            tp[r] = bench_region(&be, dev, 1, t0);
            t0 = bench_region(&be, dev, 0, 0.0);
            if (be.ops->profile_stats(&be, &sh, &req, aq, ak, amx, asm_, col, cl))
                return 1;
            tf[r] = bench_region(&be, dev, 1, t0);
        }
        if (dev) {
            void *bufs[] = {(void *)aq, (void *)ak, (void *)av, aout, amx, asm_};
            for (int i = 0; i < 6; i++)
                be.ops->buffer_free(&be, bufs[i]);
        }
        const double t_pre = bench_median(tp, reps), t_prof = bench_median(tf, reps);
        const double qk = 2.0 * Hq * ((double)n * (n + 1) / 2.0) * d; /* causal Q K^T */
        const double f_pre = 2.0 * qk / t_pre, f_prof = qk / t_prof;
        ratios[count] = t_prof / t_pre;
        fracs[count++] = gemm > 0 ? f_prof / gemm : 0.0;
        if (csv)
            printf("%d,%.4f,%.4f,%.3f,%.2f,%.2f,%.3f\n", (int)n, t_pre, t_prof, t_prof / t_pre, f_pre / 1e9,
                   f_prof / 1e9, gemm > 0 ? f_prof / gemm : 0.0);
        else
            printf("%6d %11.4f %11.4f %9.3f %14.2f %14.2f %8.1f%%\n", (int)n, t_pre, t_prof, t_prof / t_pre,
                   f_pre / 1e9, f_prof / 1e9, gemm > 0 ? 100 * f_prof / gemm : 0.0);
        free(q);
        free(k);
        free(v);
        free(out);
        free(mx);
        free(sm);
        free(col);
        free(cl);
    }
    fg_backend_close(&be);
    printf("profile summary: profile_over_prefill=%.3f gemm_fraction=%.3f\n", bench_median(ratios, count),
           bench_median(fracs, count));
    double ad = 0.0;
    if (adaptive_cost(backend, spec ? spec : "fastgen-adaptive", csv, quick, &ad))
        return 1;
    printf("adaptive summary: adaptive_over_prefill=%.3f\n", ad);
    return 0;
}
