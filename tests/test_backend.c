/*
 * Backend cross-check (suite `backend`): every compiled backend against
 * `ref`, on the same inputs, through the public API. Per case: prefill
 * outputs (NMSE in double), chosen policies and recoveries, kept position
 * sets after the prompt and after every decode step (exactly equal), decode
 * outputs (NMSE <= 1e-8 with f32 caches, <= 5e-4 with f16/bf16), guard
 * regions after every output buffer untouched, no NaN/Inf. Each backend runs
 * with 1 and 2 threads, which must agree bit for bit. GPU backends also run
 * with device-resident activations (FG_IO_DEVICE) on a stream of another
 * backend object, as an engine's, the second sequence prefilled in two chunks
 * (fg_prefill_chunk): bit for bit the same as with host arrays. After the
 * steps both sequences take a chunk by fg_seq_append (the FastGen one
 * re-profiled, FG_APPEND_REPROFILE; H2O keeping its policy): outputs and
 * kept sets checked as a decode step's.
 * Wrong uses of the I/O options are refused. Activations in 16 bits
 * (act_dtype f16, bf16) give the fp32 outputs rounded, bit for bit.
 * Usage: test_backend [backend...]   (default: every backend that probes OK)
 */
#define FG_EXPERIMENTAL /* FG_ADAPTIVE_*, fg_cpu_describe (fastgen.h) */
#include <math.h>
#include <string.h>

#include "backends/backend.h"
#include "common/dtype.h"
#include "kernels_cpu/kernels_cpu.h"
#include "fastgen.h"
#include "tests/support/checks.h"
#include "tests/support/harness.h"

typedef struct shape_case {
    int32_t d, G, Hkv, n, steps;
    fg_dtype dtype;
    int v_apart; /* V stored as v_dtype, not as dtype (fg_context_params.v_dtype) */
    fg_dtype v_dtype;
} shape_case;

enum { APPENDED = 9 }; /* the chunk after the decode steps */

typedef struct run_out {
    float *prefill;        /* [n][Hq][d] */
    float *decode;         /* [steps][2][Hq][d] */
    float *append;         /* [2][APPENDED][Hq][d] */
    int32_t *kept;         /* [steps + 2][2][Hkv][maxlen] positions, -1 padded (the last after the append) */
    int32_t policy[2][16];
    int guards_ok;
} run_out;

/* Device copies of the activations for FG_IO_DEVICE runs, made through a
 * backend object of the test's own (the engine's, as it were). */
typedef struct dev_io {
    fg_backend be;
    void *q, *k, *v, *out, *bq, *bk, *bv, *bo, *ao;
} dev_io;

static int dev_alloc(fg_backend *be, void **p, size_t bytes, const void *src) {
    if (be->ops->buffer_alloc(be, bytes, p))
        return 0;
    return !src || fg_backend_write(be, *p, src, bytes) == FG_OK;
}

/* Runs two sequences (FastGen and H2O by budget) through a backend, with
 * host arrays or (io = FG_IO_DEVICE) device ones. */
static int run_backend(const char *backend, int32_t threads, fg_io io, const shape_case *sc, const float *q,
                       const float *k, const float *v, const int32_t *tokens, fg_token_classes *tc, run_out *ro) {
    const int32_t Hq = sc->G * sc->Hkv, d = sc->d, n = sc->n, maxlen = n + sc->steps + APPENDED;
    fg_context_params p;
    fg_context_params_default(&p);
    p.backend = backend;
    p.n_threads = threads;
    p.n_layers = 1;
    p.n_q_heads = Hq;
    p.n_kv_heads = sc->Hkv;
    p.head_dim = d;
    p.kv_dtype = sc->dtype;
    p.v_dtype = sc->v_apart ? (int32_t)sc->v_dtype : -1;
    p.max_seqs = 2;
    p.max_seq_len = maxlen;
    p.classes = tc;
    const int32_t total = maxlen;
    const size_t qn = (size_t)n * Hq * d, row_q = (size_t)Hq * d, row_k = (size_t)sc->Hkv * d;
    dev_io dv = {.be = {.err = fg_error_to_stderr}};
    if (io == FG_IO_DEVICE) {
        fg_device_info info;
        if (fg_backend_open(backend, 0, &dv.be))
            return 0;
        fg_device_info_fn *device_info = (fg_device_info_fn *)fg_backend_get_proc(&dv.be, "device_info");
        if (!device_info || device_info(&dv.be, &info))
            return 0;
        p.io = FG_IO_DEVICE;
        p.stream = info.stream;
        const size_t bq = (size_t)total * row_q * 4, bk = (size_t)total * row_k * 4;
        if (!dev_alloc(&dv.be, &dv.q, bq, q) || !dev_alloc(&dv.be, &dv.k, bk, k) || !dev_alloc(&dv.be, &dv.v, bk, v) ||
            !dev_alloc(&dv.be, &dv.out, qn * 4, NULL) || !dev_alloc(&dv.be, &dv.bo, 2 * row_q * 4, NULL) ||
            !dev_alloc(&dv.be, &dv.ao, APPENDED * row_q * 4, NULL))
            return 0;
    }
    fg_context *ctx = NULL;
    if (fg_context_create(&p, &ctx) != FG_OK) {
        fprintf(stderr, "backend %s: %s\n", backend, fg_last_error(NULL));
        return 0;
    }
    fg_compression_params paper; /* the sequences created without their own */
    fg_compression_params_default(&paper);
    paper.threshold = 0.9f;
    paper.append_mode = FG_APPEND_REPROFILE;
    EXPECT_OK(ctx, fg_context_set_compression(ctx, &paper));
    fg_compression_params h2o;
    fg_compression_params_preset("h2o", &h2o);
    h2o.shortlist[0].local_tokens = 7;
    h2o.shortlist[0].frequent_tokens = 9;
    int32_t seqs[2];
    fg_seq_create(ctx, NULL, tokens, n, &seqs[0]);
    fg_seq_create(ctx, &h2o, tokens, n, &seqs[1]);
    float *out = guarded(qn);
    ro->guards_ok = 1;
    for (int b = 0; b < 2; b++) {
        if (io == FG_IO_DEVICE && b == 1) { /* the second in chunks: a third of the prompt, then the rest */
            const int32_t first = n >= 3 ? n / 3 : n;
            EXPECT_OK(ctx, fg_prefill_chunk(ctx, seqs[b], 0, 0, first, dv.q, dv.k, dv.v, dv.out));
            if (first < n)
                EXPECT_OK(ctx, fg_prefill_chunk(ctx, seqs[b], 0, first, n - first, (const float *)dv.q + first * row_q,
                                                (const float *)dv.k + first * row_k, (const float *)dv.v + first * row_k,
                                                (float *)dv.out + first * row_q));
        } else if (io == FG_IO_DEVICE)
            EXPECT_OK(ctx, fg_prefill(ctx, seqs[b], 0, dv.q, dv.k, dv.v, dv.out));
        else
            EXPECT_OK(ctx, fg_prefill(ctx, seqs[b], 0, q, k, v, out));
        ro->guards_ok &= guard_ok(out, qn);
    }
    if (io == FG_IO_DEVICE) {
        EXPECT_OK(ctx, fg_synchronize(ctx));
        EXPECT(fg_backend_read(&dv.be, out, dv.out, qn * 4) == FG_OK, "reading the prefill output back");
    }
    memcpy(ro->prefill, out, qn * sizeof *out);
    for (int b = 0; b < 2; b++)
        for (int32_t g = 0; g < sc->Hkv; g++) {
            fg_head_info info;
            fg_head_inspect(ctx, seqs[b], 0, g, &info);
            ro->policy[b][g] = info.policy_index;
        }
    float *bq = malloc(2 * row_q * sizeof(float)), *bk = malloc(2 * row_k * sizeof(float));
    float *bv = malloc(2 * row_k * sizeof(float)), *bo = guarded(2 * row_q), *ao = guarded(APPENDED * row_q);
    for (int32_t step = 0; step <= sc->steps + 1; step++) {
        for (int b = 0; b < 2; b++)
            for (int32_t g = 0; g < sc->Hkv; g++) {
                int32_t *dst = ro->kept + (((size_t)step * 2 + b) * sc->Hkv + g) * maxlen, cnt = 0;
                for (int32_t i = 0; i < maxlen; i++)
                    dst[i] = -1;
                EXPECT_OK(ctx, fg_head_positions(ctx, seqs[b], 0, g, dst, maxlen, &cnt));
            }
        if (step == sc->steps + 1)
            break;
        if (step == sc->steps) { /* the chunk, on both sequences */
            const int32_t pos = n + step;
            for (int b = 0; b < 2; b++) {
                if (io == FG_IO_DEVICE) {
                    EXPECT_OK(ctx, fg_seq_append(ctx, seqs[b], 0, tokens + pos, APPENDED,
                                                 (const float *)dv.q + (size_t)pos * row_q,
                                                 (const float *)dv.k + (size_t)pos * row_k,
                                                 (const float *)dv.v + (size_t)pos * row_k, dv.ao));
                    EXPECT_OK(ctx, fg_synchronize(ctx));
                    EXPECT(fg_backend_read(&dv.be, ao, dv.ao, APPENDED * row_q * 4) == FG_OK,
                           "reading the append output back");
                } else {
                    EXPECT_OK(ctx, fg_seq_append(ctx, seqs[b], 0, tokens + pos, APPENDED, q + (size_t)pos * row_q,
                                                 k + (size_t)pos * row_k, v + (size_t)pos * row_k, ao));
                }
                ro->guards_ok &= guard_ok(ao, APPENDED * row_q);
                memcpy(ro->append + (size_t)b * APPENDED * row_q, ao, APPENDED * row_q * sizeof(float));
            }
            continue;
        }
        const int32_t pos = n + step;
        int32_t toks[2] = {tokens[pos], tokens[pos]};
        for (int b = 0; b < 2; b++) {
            memcpy(bq + b * row_q, q + (size_t)pos * row_q, row_q * sizeof(float));
            memcpy(bk + b * row_k, k + (size_t)pos * row_k, row_k * sizeof(float));
            memcpy(bv + b * row_k, v + (size_t)pos * row_k, row_k * sizeof(float));
        }
        if (io == FG_IO_DEVICE) {
            /* the rows of both sequences stay where the prompt's are, one apart: batch i reads from pos + i */
            const float *dq = (const float *)dv.q + (size_t)pos * row_q, *dk = (const float *)dv.k + (size_t)pos * row_k;
            const float *dvv = (const float *)dv.v + (size_t)pos * row_k;
            if (!dv.bq) {
                EXPECT(dev_alloc(&dv.be, &dv.bq, 2 * row_q * 4, NULL) && dev_alloc(&dv.be, &dv.bk, 2 * row_k * 4, NULL) &&
                           dev_alloc(&dv.be, &dv.bv, 2 * row_k * 4, NULL),
                       "device batch buffers");
            }
            for (int b = 0; b < 2; b++) { /* device-to-device, queued on the engine's stream */
                fg_backend_copy(&dv.be, (float *)dv.bq + b * row_q, dq, row_q * 4);
                fg_backend_copy(&dv.be, (float *)dv.bk + b * row_k, dk, row_k * 4);
                fg_backend_copy(&dv.be, (float *)dv.bv + b * row_k, dvv, row_k * 4);
            }
            EXPECT_OK(ctx, fg_decode(ctx, 0, 2, seqs, toks, dv.bq, dv.bk, dv.bv, dv.bo));
            EXPECT_OK(ctx, fg_synchronize(ctx));
            EXPECT(fg_backend_read(&dv.be, bo, dv.bo, 2 * row_q * 4) == FG_OK, "reading the decode output back");
        } else {
            EXPECT_OK(ctx, fg_decode(ctx, 0, 2, seqs, toks, bq, bk, bv, bo));
        }
        ro->guards_ok &= guard_ok(bo, 2 * row_q);
        memcpy(ro->decode + (size_t)step * 2 * row_q, bo, 2 * row_q * sizeof(float));
    }
    free(out);
    free(bq);
    free(bk);
    free(bv);
    free(bo);
    free(ao);
    fg_context_destroy(&ctx);
    if (io == FG_IO_DEVICE) {
        void *bufs[] = {dv.q, dv.k, dv.v, dv.out, dv.bq, dv.bk, dv.bv, dv.bo, dv.ao};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
            if (bufs[i])
                dv.be.ops->buffer_free(&dv.be, bufs[i]);
        fg_backend_close(&dv.be);
    }
    return 1;
}

static void alloc_out(run_out *ro, const shape_case *sc) {
    memset(ro, 0, sizeof *ro);
    const int32_t Hq = sc->G * sc->Hkv, maxlen = sc->n + sc->steps + APPENDED;
    ro->prefill = malloc((size_t)sc->n * Hq * sc->d * sizeof(float));
    ro->decode = malloc(((size_t)sc->steps * 2 * Hq * sc->d + 1) * sizeof(float));
    ro->append = malloc((size_t)2 * APPENDED * Hq * sc->d * sizeof(float));
    ro->kept = malloc((size_t)(sc->steps + 2) * 2 * sc->Hkv * maxlen * sizeof(int32_t));
}

static void free_out(run_out *ro) {
    free(ro->prefill);
    free(ro->decode);
    free(ro->append);
    free(ro->kept);
}

static int exact_dtype(fg_dtype t) { return t == FG_DTYPE_F32 || fg_dtype_quantized(t); }

/* The cases' prompt and decode tokens (BOS, then ids 0..9) and their classes: 1 special, 2 and 3 punct. */
static void case_tokens(int32_t *tokens, int32_t n) {
    for (int32_t i = 0; i < n; i++)
        tokens[i] = i == 0 ? 1 : rng_int(0, 9);
}

static fg_token_classes *case_classes(void) {
    fg_token_classes *tc = NULL;
    fg_token_classes_create(10, NULL, &tc);
    fg_token_classes_set(tc, 1, FG_TOKEN_SPECIAL);
    fg_token_classes_set(tc, 2, FG_TOKEN_PUNCT);
    fg_token_classes_set(tc, 3, FG_TOKEN_PUNCT);
    return tc;
}

static void check_case(const char *backend, const shape_case *sc) {
    if (sc->v_apart && (strcmp(backend, "cuda") == 0 || strcmp(backend, "hip") == 0))
        return; /* refused by the GPU backends (check_kv_apart_refused) */
    const int32_t Hq = sc->G * sc->Hkv, d = sc->d, total = sc->n + sc->steps + APPENDED;
    size_t nq = (size_t)total * Hq * d, nk = (size_t)total * sc->Hkv * d;
    float *q = malloc(nq * sizeof *q), *k = malloc(nk * sizeof *k), *v = malloc(nk * sizeof *v);
    for (size_t i = 0; i < nq; i++)
        q[i] = 1.5f * rng_gauss();
    for (size_t i = 0; i < nk; i++) {
        k[i] = 1.5f * rng_gauss();
        v[i] = rng_gauss();
    }
    int32_t *tokens = malloc((size_t)total * sizeof *tokens);
    case_tokens(tokens, total);
    fg_token_classes *tc = case_classes();

    run_out ref, one, two, dev;
    alloc_out(&ref, sc);
    alloc_out(&one, sc);
    alloc_out(&two, sc);
    alloc_out(&dev, sc);
    int ok = run_backend("ref", 1, FG_IO_HOST, sc, q, k, v, tokens, tc, &ref) &&
             run_backend(backend, 1, FG_IO_HOST, sc, q, k, v, tokens, tc, &one) &&
             run_backend(backend, 2, FG_IO_HOST, sc, q, k, v, tokens, tc, &two);
    const int gpu = strcmp(backend, "cuda") == 0 || strcmp(backend, "hip") == 0;
    if (ok && gpu) {
        ok = run_backend(backend, 1, FG_IO_DEVICE, sc, q, k, v, tokens, tc, &dev);
        EXPECT(ok, "backend %s runs with FG_IO_DEVICE", backend);
    }
    EXPECT(ok, "backend %s runs", backend);
    if (ok) {
        /* quantized values are exact in fp32: the f32 limit (see test_backend_ops) */
        const double limit = exact_dtype(sc->dtype) && (!sc->v_apart || exact_dtype(sc->v_dtype)) ? 1e-8 : 5e-4;
        const size_t row_q = (size_t)Hq * d, maxlen = (size_t)total;
        double e_pre = nmse(one.prefill, ref.prefill, (size_t)sc->n * row_q);
        double e_dec = sc->steps ? nmse(one.decode, ref.decode, (size_t)sc->steps * 2 * row_q) : 0.0;
        const double e_app = nmse(one.append, ref.append, (size_t)2 * APPENDED * row_q);
        char dt[16];
        snprintf(dt, sizeof dt, "%s%s%s", fg_dtype_name(sc->dtype), sc->v_apart ? "/" : "",
                 sc->v_apart ? fg_dtype_name(sc->v_dtype) : "");
        EXPECT(e_pre <= 1e-8, "%s d=%d G=%d n=%d: prefill NMSE %.3g", backend, (int)d, (int)sc->G, (int)sc->n, e_pre);
        EXPECT(e_dec <= limit, "%s d=%d G=%d n=%d %s: decode NMSE %.3g", backend, (int)d, (int)sc->G, (int)sc->n, dt,
               e_dec);
        EXPECT(e_app <= limit, "%s d=%d G=%d n=%d %s: append NMSE %.3g", backend, (int)d, (int)sc->G, (int)sc->n, dt,
               e_app);
        EXPECT(memcmp(one.policy, ref.policy, sizeof ref.policy) == 0, "%s: policies differ from ref", backend);
        EXPECT(memcmp(one.kept, ref.kept, (size_t)(sc->steps + 2) * 2 * sc->Hkv * maxlen * sizeof(int32_t)) == 0,
               "%s d=%d G=%d n=%d: kept sets differ from ref", backend, (int)d, (int)sc->G, (int)sc->n);
        EXPECT(one.guards_ok && two.guards_ok, "%s: a guard region was written", backend);
        EXPECT(memcmp(one.prefill, two.prefill, (size_t)sc->n * row_q * sizeof(float)) == 0 &&
                   memcmp(one.decode, two.decode, (size_t)sc->steps * 2 * row_q * sizeof(float)) == 0 &&
                   memcmp(one.append, two.append, (size_t)2 * APPENDED * row_q * sizeof(float)) == 0 &&
                   memcmp(one.kept, two.kept,
                          (size_t)(sc->steps + 2) * 2 * sc->Hkv * maxlen * sizeof(int32_t)) == 0,
               "%s: 1 and 2 threads differ", backend);
        if (gpu)
            EXPECT(memcmp(one.prefill, dev.prefill, (size_t)sc->n * row_q * sizeof(float)) == 0 &&
                       memcmp(one.decode, dev.decode, (size_t)sc->steps * 2 * row_q * sizeof(float)) == 0 &&
                       memcmp(one.append, dev.append, (size_t)2 * APPENDED * row_q * sizeof(float)) == 0 &&
                       memcmp(one.kept, dev.kept, (size_t)(sc->steps + 2) * 2 * sc->Hkv * maxlen * sizeof(int32_t)) == 0 &&
                       memcmp(one.policy, dev.policy, sizeof one.policy) == 0,
                   "%s d=%d G=%d n=%d: FG_IO_DEVICE differs from host arrays", backend, (int)d, (int)sc->G, (int)sc->n);
        printf("  %-4s d=%-3d G=%d Hkv=%d n=%-4d steps=%-3d %-9s prefill NMSE %.1e decode NMSE %.1e append NMSE %.1e%s\n",
               backend, (int)d, (int)sc->G, (int)sc->Hkv, (int)sc->n, (int)sc->steps, dt, e_pre, e_dec, e_app,
               gpu ? ", device I/O identical" : "");
    }
    free_out(&dev);
    free_out(&ref);
    free_out(&one);
    free_out(&two);
    fg_token_classes_destroy(&tc);
    free(q);
    free(k);
    free(v);
    free(tokens);
}

/* io and stream options a backend cannot serve: refused, and nothing is made. */
static void check_wrong_use(void) {
    fg_token_classes *tc = NULL;
    fg_token_classes_create(10, NULL, &tc);
    fg_context_params p;
    fg_context_params_default(&p);
    p.n_layers = 1;
    p.n_q_heads = 2;
    p.n_kv_heads = 1;
    p.head_dim = 16;
    p.classes = tc;
    const char *hosts[] = {"ref", "cpu"};
    for (int i = 0; i < 2; i++) {
        fg_context *ctx = (fg_context *)&p; /* must be cleared */
        p.backend = hosts[i];
        p.io = FG_IO_DEVICE;
        p.stream = NULL;
        EXPECT(fg_context_create(&p, &ctx) == FG_ERR_INVALID_ARGUMENT && ctx == NULL &&
                   strstr(fg_last_error(NULL), "FG_IO_DEVICE"),
               "%s: io = FG_IO_DEVICE is refused (%s)", hosts[i], fg_last_error(NULL));
        p.io = FG_IO_HOST;
        p.stream = &p;
        EXPECT(fg_context_create(&p, &ctx) == FG_ERR_INVALID_ARGUMENT && ctx == NULL &&
                   strstr(fg_last_error(NULL), "no streams"),
               "%s: a stream is refused (%s)", hosts[i], fg_last_error(NULL));
        p.stream = NULL;
        EXPECT(fg_context_create(&p, &ctx) == FG_OK, "%s: a host context", hosts[i]);
        EXPECT(fg_context_set_stream(ctx, &p) == FG_ERR_INVALID_ARGUMENT, "%s: fg_context_set_stream is refused",
               hosts[i]);
        EXPECT(fg_synchronize(ctx) == FG_OK, "%s: fg_synchronize has nothing to wait for", hosts[i]);
        fg_context_destroy(&ctx);
    }
    p.backend = "ref";
    p.io = (fg_io)7;
    fg_context *ctx = NULL;
    EXPECT(fg_context_create(&p, &ctx) == FG_ERR_INVALID_ARGUMENT && ctx == NULL, "io = 7 is refused");
    EXPECT(fg_synchronize(NULL) == FG_ERR_INVALID_ARGUMENT && fg_context_set_stream(NULL, NULL) == FG_ERR_INVALID_ARGUMENT,
           "a NULL context is refused");
    fg_token_classes_destroy(&tc);
}

/* fg_cpu_describe: the CPU, its ISA and the prefetch hint with its reason;
 * FASTGEN_PF_LOCALITY overrides it both ways. */
static void check_cpu_tuning(void) {
    char buf[256];
    EXPECT(fg_cpu_describe(NULL, 0) == FG_ERR_INVALID_ARGUMENT, "no buffer");
    unsetenv("FASTGEN_PF_LOCALITY");
    EXPECT(fg_cpu_describe(buf, sizeof buf) == FG_OK && strstr(buf, "isa ") && strstr(buf, "decode prefetch "),
           "the CPU described: %s", buf);
    printf("cpu: %s\n", buf);
    setenv("FASTGEN_PF_LOCALITY", "t0", 1);
    EXPECT(fg_cpu_describe(buf, sizeof buf) == FG_OK && strstr(buf, "prefetch t0 (FASTGEN_PF_LOCALITY)"), "%s", buf);
    setenv("FASTGEN_PF_LOCALITY", "nta", 1);
    EXPECT(fg_cpu_describe(buf, sizeof buf) == FG_OK && strstr(buf, "prefetch nta (FASTGEN_PF_LOCALITY)"), "%s", buf);
    unsetenv("FASTGEN_PF_LOCALITY");
    char tiny[8];
    EXPECT(fg_cpu_describe(tiny, sizeof tiny) == FG_OK && strlen(tiny) == sizeof tiny - 1, "cut to the buffer");
}

/* A probe whose nta steps took `nta` seconds per byte and t0's `t0`, but
 * for two steps of the faster hint 50x slower (steps that lost their core:
 * a sum or a mean would turn the verdict round). */
static fg_pf_probe probe_of(double nta, double t0) {
    fg_pf_probe p = {.skipped = FG_PF_PROBE_SKIP, .steps = {FG_PF_PROBE_STEPS, FG_PF_PROBE_STEPS}};
    const int slow = nta < t0 ? 0 : 1;
    for (int s = 0; s < FG_PF_PROBE_STEPS; s++) {
        p.per_byte[0][s] = nta * (slow == 0 && (s == 3 || s == 17) ? 50.0 : 1.0);
        p.per_byte[1][s] = t0 * (slow == 1 && (s == 3 || s == 17) ? 50.0 : 1.0);
    }
    return p;
}

/* The prefetch hint measured at run time (cpu_tuning.c): real decode steps
 * feed the probe until the process has a measured hint; the verdict on
 * medians; the warm-up steps left out, the two hints alternated, and the
 * choice published to a second backend and to fg_cpu_describe; a fixed
 * hint never probed. Synthetic timings where a verdict is asserted: a real
 * machine's has nothing to assert. */
static void check_prefetch_probe(void) {
    unsetenv("FASTGEN_PF_LOCALITY");
    char buf[256];
    fg_cpu_pf_forget();
    { /* real steps: one layer, 8 KV heads of 96 rows x d = 128 in f16 = 384 KiB a step */
        enum { HQ = 8, HKV = 8, D = 128, N = 96, STEPS = FG_PF_PROBE_SKIP + 2 * FG_PF_PROBE_STEPS + 4 };
        fg_context_params p = test_context_params("cpu", 1, HQ, HKV, D);
        p.kv_dtype = FG_DTYPE_F16;
        p.max_seq_len = N + STEPS;
        fg_context *ctx = NULL;
        fg_token_classes *tc = NULL;
        int32_t tokens[N], seq = -1, tok = 5;
        static float q[N * HQ * D], k[N * HKV * D], v[N * HKV * D], o[N * HQ * D];
        for (int32_t i = 0; i < N; i++)
            tokens[i] = 3 + i % 50;
        for (size_t i = 0; i < sizeof q / sizeof q[0]; i++)
            q[i] = k[i] = v[i] = (float)((i * 7919) % 1000) / 1000.0f - 0.5f;
        EXPECT(fg_token_classes_create(64, NULL, &tc) == FG_OK, "classes");
        p.classes = tc;
        EXPECT(fg_context_create(&p, &ctx) == FG_OK, "the probe's context: %s", fg_last_error(NULL));
        EXPECT_OK(ctx, fg_seq_create(ctx, NULL, tokens, N, &seq));
        EXPECT_OK(ctx, fg_prefill(ctx, seq, 0, q, k, v, o));
        EXPECT(fg_cpu_describe(buf, sizeof buf) == FG_OK && strstr(buf, "until the first"), "not measured yet: %s",
               buf);
        for (int s = 0; s < STEPS; s++)
            EXPECT_OK(ctx, fg_decode(ctx, 0, 1, &seq, &tok, q, k, v, o));
        EXPECT(fg_cpu_describe(buf, sizeof buf) == FG_OK && strstr(buf, "(measured"),
               "%d decode steps of 384 KiB measured the hint: %s", (int)STEPS, buf);
        printf("cpu after %d decode steps: %s\n", (int)STEPS, buf);
        fg_context_destroy(&ctx);
        fg_token_classes_destroy(&tc);
    }

    fg_pf_probe nta_ahead = probe_of(0.90, 1.0), close = probe_of(0.98, 1.0), t0_ahead = probe_of(2.0, 1.0);
    EXPECT(fg_cpu_pf_choose(&nta_ahead) == FG_PF_NTA, "nta 10 %% faster per byte is taken, two slow steps aside");
    EXPECT(fg_cpu_pf_choose(&close) == FG_PF_T0 && fg_cpu_pf_choose(&t0_ahead) == FG_PF_T0,
           "t0 unless nta leads by 3 %%");

    fg_cpu_pf_forget();
    fg_cpu_tuning set = fg_cpu_tuning_detect();
    set.fixed = 1;
    set.pf_locality = FG_PF_T0;
    fg_pf_probe none = {0};
    fg_cpu_pf_probe_record(&set, &none, FG_PF_NTA, 1.0, 1.0);
    EXPECT(fg_cpu_pf_probe_step(&set, &none) == FG_PF_T0 && none.skipped == 0 && none.steps[0] == 0,
           "a fixed hint is not probed");
    fg_cpu_tuning t = fg_cpu_tuning_detect(), u = fg_cpu_tuning_detect();
    fg_pf_probe pt = {0}, pu = {0};
    EXPECT(!t.fixed && t.pf_locality == FG_PF_T0, "t0 until measured (%s)", t.source);
    int warm = 1;
    for (int s = 0; s < FG_PF_PROBE_SKIP; s++) { /* the warm-up: t0, untimed */
        const fg_pf_locality pf = fg_cpu_pf_probe_step(&t, &pt);
        warm &= pf == FG_PF_T0;
        fg_cpu_pf_probe_record(&t, &pt, pf, 1.0, 1.0);
    }
    EXPECT(warm && pt.steps[0] == 0 && pt.steps[1] == 0, "the first %d steps are not timed", FG_PF_PROBE_SKIP);
    int order = 1;
    static const fg_pf_locality abba[4] = {FG_PF_NTA, FG_PF_T0, FG_PF_T0, FG_PF_NTA};
    for (int s = 0; s < 2 * FG_PF_PROBE_STEPS; s++) { /* nta 10 % faster: published */
        const fg_pf_locality pf = fg_cpu_pf_probe_step(&t, &pt);
        order &= pf == abba[s % 4];
        EXPECT(!t.fixed, "not chosen before the last step (%d)", s);
        fg_cpu_pf_probe_record(&t, &pt, pf, pf == FG_PF_NTA ? 0.9e-3 : 1e-3, 1e6);
    }
    EXPECT(order, "the hints alternate nta, t0, t0, nta");
    EXPECT(t.fixed && t.pf_locality == FG_PF_NTA && strstr(t.source, "measured"), "nta measured ahead: %s", t.source);
    EXPECT(fg_cpu_pf_probe_step(&u, &pu) == FG_PF_NTA && u.fixed, "a second backend takes the process's choice at once");
    EXPECT(fg_cpu_describe(buf, sizeof buf) == FG_OK && strstr(buf, "prefetch nta (measured"), "%s", buf);
    setenv("FASTGEN_PF_LOCALITY", "t0", 1);
    EXPECT(fg_cpu_describe(buf, sizeof buf) == FG_OK && strstr(buf, "prefetch t0 (FASTGEN_PF_LOCALITY)"),
           "the environment still overrides: %s", buf);
    unsetenv("FASTGEN_PF_LOCALITY");
    fg_cpu_pf_forget(); /* the rest of this test measures it again */
}

/* A GPU backend reads K and V in one dtype: a context that sets them apart
 * is refused at creation, with what to do instead. */
static void check_kv_apart_refused(const char *backend) {
    fg_token_classes *tc = NULL;
    fg_token_classes_create(10, NULL, &tc);
    fg_context_params p;
    fg_context_params_default(&p);
    p.backend = backend;
    p.n_layers = 1;
    p.n_q_heads = 4;
    p.n_kv_heads = 2;
    p.head_dim = 64;
    p.kv_dtype = FG_DTYPE_Q8_0;
    p.v_dtype = FG_DTYPE_F16;
    p.max_seqs = 1;
    p.max_seq_len = 64;
    p.classes = tc;
    fg_context *ctx = NULL;
    EXPECT(fg_context_create(&p, &ctx) == FG_ERR_UNAVAILABLE && !ctx && strstr(fg_last_error(NULL), "one dtype"),
           "%s: K q8_0 and V f16 refused: %s", backend, fg_last_error(NULL));
    p.v_dtype = FG_DTYPE_Q8_0; /* the same as kv_dtype: one dtype */
    EXPECT_OK(NULL, fg_context_create(&p, &ctx));
    fg_context_destroy(&ctx);
    fg_token_classes_destroy(&tc);
    printf("  %-4s K and V in two dtypes: refused at context creation\n", backend);
}

/* A backend's table as fg_backend_open checks it: each required slot
 * missing is named; read_slots left out of a host-memory table falls back
 * to the plain copy (the same positions as ref's own), and is refused
 * where the backend has memory of its own; the adaptive pair goes
 * together, and without it the feature is off. */
static fg_status no_read(fg_backend *be, void *dst, const void *src, size_t bytes) {
    (void)be, (void)dst, (void)src, (void)bytes;
    return FG_OK;
}

static void check_backend_table(void) {
    fg_backend ref = {.err = fg_error_to_stderr};
    EXPECT_OK(NULL, fg_backend_open("ref", NULL, &ref));
    const fg_backend_ops *good = ref.ops;
    EXPECT(fg_backend_table_check(good) == NULL, "ref's table is whole: %s", fg_backend_table_check(good));
    EXPECT(fg_backend_supports(&ref, FG_FEATURE_ADAPTIVE) && fg_backend_supports(&ref, FG_FEATURE_KV_APART) &&
               !fg_backend_supports(&ref, FG_FEATURE_DEVICE_IO) && !fg_backend_supports(&ref, FG_FEATURE_STREAMS),
           "ref's features: adaptive, K and V apart; no device memory, no streams");
    struct {
        const char *slot;
        fg_backend_ops ops;
    } cut[6];
    for (int i = 0; i < 6; i++)
        cut[i].ops = *good;
    cut[0].slot = "buffer_alloc", cut[0].ops.buffer_free = NULL;
    cut[1].slot = "prefill_attention", cut[1].ops.prefill_attention = NULL;
    cut[2].slot = "profile_stats", cut[2].ops.profile_stats = NULL;
    cut[3].slot = "compact", cut[3].ops.compact = NULL;
    cut[4].slot = "decode_step", cut[4].ops.decode_step = NULL;
    cut[5].slot = "adaptive_observe and adaptive_errors", cut[5].ops.adaptive_errors = NULL;
    for (int i = 0; i < 6; i++) {
        const char *why = fg_backend_table_check(&cut[i].ops);
        EXPECT(why && strstr(why, cut[i].slot), "a table without %s refused: %s", cut[i].slot, why ? why : "passed");
    }
    fg_backend_ops lean = *good; /* host memory, no read_slots, no adaptive pair: sound */
    lean.read_slots = NULL;
    lean.adaptive_observe = NULL;
    lean.adaptive_errors = NULL;
    EXPECT(fg_backend_table_check(&lean) == NULL, "a host table without read_slots and the adaptive pair passes");
    fg_backend b = ref;
    b.ops = &lean;
    EXPECT(!fg_backend_supports(&b, FG_FEATURE_ADAPTIVE), "no adaptive pair: the adaptive mode off");
    fg_backend_ops device = lean;
    device.buffer_read = no_read;
    const char *why = fg_backend_table_check(&device);
    EXPECT(why && strstr(why, "read_slots"), "memory of its own without read_slots refused: %s", why ? why : "passed");

    /* the fallback reads what the backend's own read_slots reads */
    fg_page_layout L;
    memset(&L, 0, sizeof L);
    L.page_tokens = 4;
    L.pos_offset = 0;
    L.score_offset = 4 * sizeof(int32_t);
    L.row_offset = L.score_offset + 4 * sizeof(float);
    L.flags_offset = L.row_offset + 4 * sizeof(int32_t);
    unsigned char page[2][64];
    memset(page, 0, sizeof page);
    void *meta[2] = {page[0], page[1]};
    for (int32_t s = 0; s < 7; s++) {
        ((int32_t *)(void *)page[s / 4])[s % 4] = 100 + 3 * s;
        page[s / 4][L.flags_offset + s % 4] = (uint8_t)(1 + s % 3);
    }
    int32_t pos_a[7], pos_b[7];
    uint8_t fl_a[7], fl_b[7];
    EXPECT_OK(NULL, fg_backend_read_slots(&ref, &L, meta, 7, pos_a, fl_a, NULL));
    EXPECT_OK(NULL, fg_backend_read_slots(&b, &L, meta, 7, pos_b, fl_b, NULL));
    EXPECT(memcmp(pos_a, pos_b, sizeof pos_a) == 0 && memcmp(fl_a, fl_b, sizeof fl_a) == 0 && pos_b[6] == 118 &&
               fl_b[5] == 3,
           "read_slots' fallback reads the positions and flags the table's own reads");
    fg_backend_close(&ref);
    printf("  backend tables: 6 required slots checked, read_slots' host fallback, the adaptive pair together\n");
}

/* act_dtype f16 / bf16: q, k, v and out cross the API in 16 bits. A context
 * given 16-bit inputs returns, bit for bit, the fp32 context's outputs on the
 * same values rounded to 16 bits (the kernels see the same fp32 inputs), and
 * keeps the same rows: prefill (one sequence whole, one in two chunks),
 * decode steps of both, an append;
 * with host arrays, and on GPU backends with device ones (the conversion is
 * then a device op). */
enum { ACT_D = 64, ACT_G = 2, ACT_HKV = 2, ACT_N = 40, ACT_STEPS = 12, ACT_APPEND = 5 };

typedef struct act_run {
    fg_context *ctx;
    int32_t seqs[2];
    fg_backend dev; /* FG_IO_DEVICE: the engine's backend object and its buffers */
    void *buf[4];
} act_run;

/* n values as the act dtype's bits (16-bit) or floats, at dst (host or device). */
static void act_put(act_run *r, fg_dtype act, void *dst, const float *src, size_t n, void *host_tmp) {
    const void *from = src;
    if (act != FG_DTYPE_F32) {
        fg_store_row(host_tmp, act, src, (int32_t)n);
        from = host_tmp;
    }
    if (r->dev.ops)
        EXPECT(fg_backend_write(&r->dev, dst, from, n * fg_row_bytes(act, 1)) == FG_OK, "writing device activations");
    else
        memcpy(dst, from, n * fg_row_bytes(act, 1));
}

static void act_get(act_run *r, fg_dtype act, float *dst, const void *src, size_t n, void *host_tmp) {
    const void *from = src;
    if (r->dev.ops) {
        EXPECT_OK(r->ctx, fg_synchronize(r->ctx));
        EXPECT(fg_backend_read(&r->dev, host_tmp, src, n * fg_row_bytes(act, 1)) == FG_OK, "reading device outputs");
        from = host_tmp;
    }
    for (size_t i = 0; i < n; i++)
        dst[i] = fg_load_elem(from, act, (int32_t)n, (int32_t)i);
}

/* Runs the case with activations in `act`; outputs (as floats) and the kept positions after it. */
static int act_case(const char *backend, fg_io io, fg_dtype act, const float *q, const float *k, const float *v,
                    const int32_t *tokens, fg_token_classes *tc, float *outs, int32_t *kept) {
    const int32_t Hq = ACT_G * ACT_HKV, maxlen = ACT_N + ACT_STEPS + ACT_APPEND;
    const size_t rq = (size_t)Hq * ACT_D, rk = (size_t)ACT_HKV * ACT_D, es = fg_row_bytes(act, 1);
    act_run r = {0};
    fg_context_params p = test_context_params(backend, 1, Hq, ACT_HKV, ACT_D);
    p.max_seqs = 2;
    p.max_seq_len = maxlen;
    p.classes = tc;
    p.act_dtype = act;
    if (io == FG_IO_DEVICE) {
        fg_device_info info;
        r.dev.err = fg_error_to_stderr;
        if (fg_backend_open(backend, 0, &r.dev))
            return 0;
        fg_device_info_fn *device_info = (fg_device_info_fn *)fg_backend_get_proc(&r.dev, "device_info");
        if (!device_info || device_info(&r.dev, &info)) {
            fg_backend_close(&r.dev);
            return 0;
        }
        p.io = FG_IO_DEVICE;
        p.stream = info.stream;
    }
    if (fg_context_create(&p, &r.ctx) != FG_OK) {
        fprintf(stderr, "act_dtype %s on %s: %s\n", fg_dtype_name(act), backend, fg_last_error(NULL));
        if (r.dev.ops)
            fg_backend_close(&r.dev);
        return 0;
    }
    const size_t cap = (size_t)maxlen * rq; /* the largest array of one call */
    unsigned char *host[4], *tmp = malloc(cap * 4);
    for (int i = 0; i < 4; i++) {
        host[i] = malloc(cap * 4);
        r.buf[i] = host[i];
        if (r.dev.ops)
            EXPECT(r.dev.ops->buffer_alloc(&r.dev, cap * 4, &r.buf[i]) == FG_OK, "device buffers");
    }
    fg_compression_params h2o;
    fg_compression_params_preset("h2o", &h2o);
    h2o.shortlist[0].local_tokens = 7;
    h2o.shortlist[0].frequent_tokens = 9;
    EXPECT_OK(r.ctx, fg_seq_create(r.ctx, NULL, tokens, ACT_N, &r.seqs[0]));
    EXPECT_OK(r.ctx, fg_seq_create(r.ctx, &h2o, tokens, ACT_N, &r.seqs[1]));
    float *o = outs;
    for (int b = 0; b < 2; b++) {
        act_put(&r, act, r.buf[0], q, ACT_N * rq, tmp);
        act_put(&r, act, r.buf[1], k, ACT_N * rk, tmp);
        act_put(&r, act, r.buf[2], v, ACT_N * rk, tmp);
        if (b == 0) {
            EXPECT_OK(r.ctx, fg_prefill(r.ctx, r.seqs[b], 0, r.buf[0], r.buf[1], r.buf[2], r.buf[3]));
        } else { /* the second in two chunks (fg_prefill_chunk): 15 rows, then the rest */
            unsigned char *at[4] = {r.buf[0], r.buf[1], r.buf[2], r.buf[3]};
            EXPECT_OK(r.ctx, fg_prefill_chunk(r.ctx, r.seqs[b], 0, 0, 15, at[0], at[1], at[2], at[3]));
            EXPECT_OK(r.ctx, fg_prefill_chunk(r.ctx, r.seqs[b], 0, 15, ACT_N - 15, at[0] + 15 * rq * es,
                                              at[1] + 15 * rk * es, at[2] + 15 * rk * es, at[3] + 15 * rq * es));
        }
        act_get(&r, act, o, r.buf[3], ACT_N * rq, tmp);
        o += ACT_N * rq;
    }
    for (int32_t step = 0; step < ACT_STEPS; step++) {
        const int32_t pos = ACT_N + step, toks[2] = {tokens[pos], tokens[pos]};
        for (int b = 0; b < 2; b++) { /* both sequences take the same row */
            act_put(&r, act, (unsigned char *)r.buf[0] + b * rq * es, q + pos * rq, rq, tmp);
            act_put(&r, act, (unsigned char *)r.buf[1] + b * rk * es, k + pos * rk, rk, tmp);
            act_put(&r, act, (unsigned char *)r.buf[2] + b * rk * es, v + pos * rk, rk, tmp);
        }
        EXPECT_OK(r.ctx, fg_decode(r.ctx, 0, 2, r.seqs, toks, r.buf[0], r.buf[1], r.buf[2], r.buf[3]));
        act_get(&r, act, o, r.buf[3], 2 * rq, tmp);
        o += 2 * rq;
    }
    const int32_t pos = ACT_N + ACT_STEPS;
    for (int b = 0; b < 2; b++) {
        act_put(&r, act, r.buf[0], q + pos * rq, ACT_APPEND * rq, tmp);
        act_put(&r, act, r.buf[1], k + pos * rk, ACT_APPEND * rk, tmp);
        act_put(&r, act, r.buf[2], v + pos * rk, ACT_APPEND * rk, tmp);
        EXPECT_OK(r.ctx, fg_seq_append(r.ctx, r.seqs[b], 0, tokens + pos, ACT_APPEND, r.buf[0], r.buf[1], r.buf[2],
                                       r.buf[3]));
        act_get(&r, act, o, r.buf[3], ACT_APPEND * rq, tmp);
        o += ACT_APPEND * rq;
    }
    for (int b = 0; b < 2; b++)
        for (int32_t g = 0; g < ACT_HKV; g++) {
            int32_t cnt = 0, *dst = kept + ((size_t)b * ACT_HKV + g) * maxlen;
            for (int32_t i = 0; i < maxlen; i++)
                dst[i] = -1;
            EXPECT_OK(r.ctx, fg_head_positions(r.ctx, r.seqs[b], 0, g, dst, maxlen, &cnt));
        }
    fg_context_destroy(&r.ctx);
    for (int i = 0; i < 4; i++) {
        if (r.dev.ops)
            r.dev.ops->buffer_free(&r.dev, r.buf[i]);
        free(host[i]);
    }
    free(tmp);
    if (r.dev.ops)
        fg_backend_close(&r.dev);
    return 1;
}

static void check_act_dtype(const char *backend) {
    const int32_t Hq = ACT_G * ACT_HKV, maxlen = ACT_N + ACT_STEPS + ACT_APPEND;
    const size_t rq = (size_t)Hq * ACT_D, rk = (size_t)ACT_HKV * ACT_D;
    const size_t n_out = (2 * ACT_N + 2 * ACT_STEPS + 2 * ACT_APPEND) * rq, n_kept = 2 * ACT_HKV * (size_t)maxlen;
    const int gpu = strcmp(backend, "cuda") == 0 || strcmp(backend, "hip") == 0;
    int32_t tokens[ACT_N + ACT_STEPS + ACT_APPEND];
    case_tokens(tokens, maxlen);
    fg_token_classes *tc = case_classes();
    const fg_dtype acts[] = {FG_DTYPE_F16, FG_DTYPE_BF16};
    for (int a = 0; a < 2; a++) {
        const fg_dtype act = acts[a];
        float *x[3];
        const size_t n[3] = {maxlen * rq, maxlen * rk, maxlen * rk};
        for (int i = 0; i < 3; i++) { /* values the act dtype holds exactly */
            x[i] = malloc(n[i] * sizeof(float));
            for (size_t j = 0; j < n[i]; j++)
                x[i][j] = fg_quantize(rng_gauss(), act);
        }
        for (int dev = 0; dev <= gpu; dev++) {
            const fg_io io = dev ? FG_IO_DEVICE : FG_IO_HOST;
            float *want = malloc(n_out * sizeof(float)), *got = malloc(n_out * sizeof(float));
            int32_t *kept_want = malloc(n_kept * 4), *kept_got = malloc(n_kept * 4);
            int ok = act_case(backend, io, FG_DTYPE_F32, x[0], x[1], x[2], tokens, tc, want, kept_want) &&
                     act_case(backend, io, act, x[0], x[1], x[2], tokens, tc, got, kept_got);
            EXPECT(ok, "act_dtype %s on %s (%s arrays) ran", fg_dtype_name(act), backend, dev ? "device" : "host");
            size_t bad = 0;
            for (size_t i = 0; ok && i < n_out; i++)
                bad += fg_quantize(want[i], act) != got[i] && !(isnan(got[i]) && isnan(want[i]));
            EXPECT(ok && bad == 0, "act_dtype %s on %s (%s arrays): %zu of %zu outputs differ from the fp32 ones rounded",
                   fg_dtype_name(act), backend, dev ? "device" : "host", bad, n_out);
            EXPECT(ok && memcmp(kept_want, kept_got, n_kept * 4) == 0, "act_dtype %s on %s: the kept rows differ",
                   fg_dtype_name(act), backend);
            free(want);
            free(got);
            free(kept_want);
            free(kept_got);
        }
        for (int i = 0; i < 3; i++)
            free(x[i]);
    }
    fg_token_classes_destroy(&tc);
}

int main(int argc, char **argv) {
    test_seed("test_backend");
    check_wrong_use();
    check_backend_table();
    check_cpu_tuning();
    check_prefetch_probe();
    check_act_dtype("ref");
    const char *all[] = {"cpu", "cuda", "hip"};
    const char **names = argc > 1 ? (const char **)argv + 1 : all;
    const int n_names = argc > 1 ? argc - 1 : 3;
    const shape_case cases[] = {
        {64, 1, 2, 1, 40, FG_DTYPE_F32, 0, FG_DTYPE_F32},
        {64, 4, 2, 2, 40, FG_DTYPE_F16, 0, FG_DTYPE_F32},
        {80, 1, 3, 3, 40, FG_DTYPE_BF16, 0, FG_DTYPE_F32},
        {128, 4, 2, 17, 60, FG_DTYPE_F32, 0, FG_DTYPE_F32},
        {128, 8, 1, 255, 30, FG_DTYPE_F16, 0, FG_DTYPE_F32},
        {7, 2, 5, 13, 50, FG_DTYPE_BF16, 0, FG_DTYPE_F32},
        {256, 1, 2, 64, 20, FG_DTYPE_F32, 0, FG_DTYPE_F32},
        /* quantized rows: prefill compaction, decode insertion and append all quantize */
        {64, 4, 2, 17, 40, FG_DTYPE_Q8_0, 0, FG_DTYPE_F32},
        {128, 1, 2, 5, 30, FG_DTYPE_Q4_0, 0, FG_DTYPE_F32},
        {16, 2, 3, 13, 40, FG_DTYPE_Q8_0, 0, FG_DTYPE_F32},
        {8, 3, 2, 9, 40, FG_DTYPE_Q4_0, 0, FG_DTYPE_F32},
        /* K and V in two dtypes (ref and cpu; the GPU backends refuse them) */
        {64, 4, 2, 17, 40, FG_DTYPE_Q8_0, 1, FG_DTYPE_F16},
        {128, 2, 2, 5, 30, FG_DTYPE_Q4_0, 1, FG_DTYPE_F16},
        {64, 1, 3, 9, 40, FG_DTYPE_F16, 1, FG_DTYPE_Q8_0},
        {32, 12, 1, 21, 30, FG_DTYPE_BF16, 1, FG_DTYPE_F32},
    };
    int ran = 0;
    for (int i = 0; i < n_names; i++) {
        fg_status st = fg_backend_probe(names[i]);
        if (st != FG_OK) {
            printf("%s: not tested: %s\n", names[i], fg_last_error(NULL));
            EXPECT(st == FG_ERR_UNAVAILABLE, "backend %s: %s", names[i], fg_status_string(st));
            EXPECT(!test_backend_required(), "backend %s is required here (FG_TEST_REQUIRE_BACKEND)", names[i]);
            continue;
        }
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
            check_case(names[i], &cases[c]);
        check_act_dtype(names[i]);
        if (strcmp(names[i], "cuda") == 0 || strcmp(names[i], "hip") == 0)
            check_kv_apart_refused(names[i]);
        ran++;
    }
    if (ran == 0 && argc > 1 && !test_backend_required()) /* the requested GPU backends are not here: skipped */
        return 77;
    EXPECT(ran > 0, "no backend besides ref was tested");
    return test_finish();
}
