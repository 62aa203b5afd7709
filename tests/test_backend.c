/*
 * Backend cross-check (suite `backend`): every compiled backend against
 * `ref`, on the same inputs, through the public API. Per case: prefill
 * outputs (NMSE in double), chosen policies and recoveries, kept position
 * sets after the prompt and after every decode step (exactly equal), decode
 * outputs (NMSE <= 1e-8 with f32 caches, <= 5e-4 with f16/bf16), guard
 * regions after every output buffer untouched, no NaN/Inf. Each backend runs
 * with 1 and 2 threads, which must agree bit for bit.
 * Usage: test_backend [backend...]   (default: every backend that probes OK)
 */
#include <string.h>

#include "fastgen.h"
#include "checks.h"
#include "harness.h"

typedef struct shape_case {
    int32_t d, G, Hkv, n, steps;
    fg_dtype dtype;
} shape_case;

typedef struct run_out {
    float *prefill;        /* [n][Hq][d] */
    float *decode;         /* [steps][2][Hq][d] */
    int32_t *kept;         /* [steps + 1][2][Hkv][maxlen] positions, -1 padded */
    int32_t policy[2][16];
    int guards_ok;
} run_out;

/* Runs two sequences (FastGen and H2O by budget) through a backend. */
static int run_backend(const char *backend, int32_t threads, const shape_case *sc, const float *q, const float *k,
                       const float *v, const int32_t *tokens, fg_token_classes *tc, run_out *ro) {
    const int32_t Hq = sc->G * sc->Hkv, d = sc->d, n = sc->n, maxlen = n + sc->steps;
    fg_context_params p;
    fg_context_params_default(&p);
    p.backend = backend;
    p.n_threads = threads;
    p.n_layers = 1;
    p.n_q_heads = Hq;
    p.n_kv_heads = sc->Hkv;
    p.head_dim = d;
    p.kv_dtype = sc->dtype;
    p.max_seqs = 2;
    p.max_seq_len = maxlen;
    p.classes = tc;
    p.compression.threshold = 0.9f;
    fg_context *ctx = NULL;
    if (fg_context_create(&p, &ctx) != FG_OK) {
        fprintf(stderr, "backend %s: %s\n", backend, fg_last_error(NULL));
        return 0;
    }
    fg_compression_params h2o;
    fg_compression_params_preset("h2o", &h2o);
    h2o.shortlist[0].local_tokens = 7;
    h2o.shortlist[0].frequent_tokens = 9;
    int32_t seqs[2];
    fg_seq_create(ctx, NULL, tokens, n, &seqs[0]);
    fg_seq_create(ctx, &h2o, tokens, n, &seqs[1]);
    const size_t qn = (size_t)n * Hq * d;
    float *out = guarded(qn);
    ro->guards_ok = 1;
    for (int b = 0; b < 2; b++) {
        EXPECT_OK(ctx, fg_prefill(ctx, seqs[b], 0, q, k, v, out));
        ro->guards_ok &= guard_ok(out, qn);
    }
    memcpy(ro->prefill, out, qn * sizeof *out);
    for (int b = 0; b < 2; b++)
        for (int32_t g = 0; g < sc->Hkv; g++) {
            fg_head_info info;
            fg_head_inspect(ctx, seqs[b], 0, g, &info);
            ro->policy[b][g] = info.policy_index;
        }
    const size_t row_q = (size_t)Hq * d, row_k = (size_t)sc->Hkv * d;
    float *bq = malloc(2 * row_q * sizeof(float)), *bk = malloc(2 * row_k * sizeof(float));
    float *bv = malloc(2 * row_k * sizeof(float)), *bo = guarded(2 * row_q);
    for (int32_t step = 0; step <= sc->steps; step++) {
        for (int b = 0; b < 2; b++)
            for (int32_t g = 0; g < sc->Hkv; g++) {
                int32_t *dst = ro->kept + (((size_t)step * 2 + b) * sc->Hkv + g) * maxlen, cnt = 0;
                for (int32_t i = 0; i < maxlen; i++)
                    dst[i] = -1;
                EXPECT_OK(ctx, fg_head_positions(ctx, seqs[b], 0, g, dst, maxlen, &cnt));
            }
        if (step == sc->steps)
            break;
        const int32_t pos = n + step;
        int32_t toks[2] = {tokens[pos], tokens[pos]};
        for (int b = 0; b < 2; b++) {
            memcpy(bq + b * row_q, q + (size_t)pos * row_q, row_q * sizeof(float));
            memcpy(bk + b * row_k, k + (size_t)pos * row_k, row_k * sizeof(float));
            memcpy(bv + b * row_k, v + (size_t)pos * row_k, row_k * sizeof(float));
        }
        EXPECT_OK(ctx, fg_decode(ctx, 0, 2, seqs, toks, bq, bk, bv, bo));
        ro->guards_ok &= guard_ok(bo, 2 * row_q);
        memcpy(ro->decode + (size_t)step * 2 * row_q, bo, 2 * row_q * sizeof(float));
    }
    free(out);
    free(bq);
    free(bk);
    free(bv);
    free(bo);
    fg_context_destroy(&ctx);
    return 1;
}

static void alloc_out(run_out *ro, const shape_case *sc) {
    memset(ro, 0, sizeof *ro);
    const int32_t Hq = sc->G * sc->Hkv, maxlen = sc->n + sc->steps;
    ro->prefill = malloc((size_t)sc->n * Hq * sc->d * sizeof(float));
    ro->decode = malloc(((size_t)sc->steps * 2 * Hq * sc->d + 1) * sizeof(float));
    ro->kept = malloc((size_t)(sc->steps + 1) * 2 * sc->Hkv * maxlen * sizeof(int32_t));
}

static void free_out(run_out *ro) {
    free(ro->prefill);
    free(ro->decode);
    free(ro->kept);
}

static void check_case(const char *backend, const shape_case *sc) {
    const int32_t Hq = sc->G * sc->Hkv, d = sc->d, total = sc->n + sc->steps;
    size_t nq = (size_t)total * Hq * d, nk = (size_t)total * sc->Hkv * d;
    float *q = malloc(nq * sizeof *q), *k = malloc(nk * sizeof *k), *v = malloc(nk * sizeof *v);
    for (size_t i = 0; i < nq; i++)
        q[i] = 1.5f * rng_gauss();
    for (size_t i = 0; i < nk; i++) {
        k[i] = 1.5f * rng_gauss();
        v[i] = rng_gauss();
    }
    int32_t *tokens = malloc((size_t)total * sizeof *tokens);
    for (int32_t i = 0; i < total; i++)
        tokens[i] = i == 0 ? 1 : rng_int(0, 9);
    fg_token_classes *tc = NULL;
    fg_token_classes_create(10, NULL, &tc);
    fg_token_classes_set(tc, 1, FG_TOKEN_SPECIAL);
    fg_token_classes_set(tc, 2, FG_TOKEN_PUNCT);
    fg_token_classes_set(tc, 3, FG_TOKEN_PUNCT);

    run_out ref, one, two;
    alloc_out(&ref, sc);
    alloc_out(&one, sc);
    alloc_out(&two, sc);
    int ok = run_backend("ref", 1, sc, q, k, v, tokens, tc, &ref) &&
             run_backend(backend, 1, sc, q, k, v, tokens, tc, &one) &&
             run_backend(backend, 2, sc, q, k, v, tokens, tc, &two);
    EXPECT(ok, "backend %s runs", backend);
    if (ok) {
        const double limit = sc->dtype == FG_DTYPE_F32 ? 1e-8 : 5e-4;
        const size_t row_q = (size_t)Hq * d, maxlen = (size_t)total;
        double e_pre = nmse(one.prefill, ref.prefill, (size_t)sc->n * row_q);
        double e_dec = sc->steps ? nmse(one.decode, ref.decode, (size_t)sc->steps * 2 * row_q) : 0.0;
        const char *dt = sc->dtype == FG_DTYPE_F32 ? "f32" : sc->dtype == FG_DTYPE_F16 ? "f16" : "bf16";
        EXPECT(e_pre <= 1e-8, "%s d=%d G=%d n=%d: prefill NMSE %.3g", backend, (int)d, (int)sc->G, (int)sc->n, e_pre);
        EXPECT(e_dec <= limit, "%s d=%d G=%d n=%d %s: decode NMSE %.3g", backend, (int)d, (int)sc->G, (int)sc->n, dt,
               e_dec);
        EXPECT(memcmp(one.policy, ref.policy, sizeof ref.policy) == 0, "%s: policies differ from ref", backend);
        EXPECT(memcmp(one.kept, ref.kept, (size_t)(sc->steps + 1) * 2 * sc->Hkv * maxlen * sizeof(int32_t)) == 0,
               "%s d=%d G=%d n=%d: kept sets differ from ref", backend, (int)d, (int)sc->G, (int)sc->n);
        EXPECT(one.guards_ok && two.guards_ok, "%s: a guard region was written", backend);
        EXPECT(memcmp(one.prefill, two.prefill, (size_t)sc->n * row_q * sizeof(float)) == 0 &&
                   memcmp(one.decode, two.decode, (size_t)sc->steps * 2 * row_q * sizeof(float)) == 0 &&
                   memcmp(one.kept, two.kept,
                          (size_t)(sc->steps + 1) * 2 * sc->Hkv * maxlen * sizeof(int32_t)) == 0,
               "%s: 1 and 2 threads differ", backend);
        printf("  %-4s d=%-3d G=%d Hkv=%d n=%-4d steps=%-3d %-4s prefill NMSE %.1e decode NMSE %.1e\n", backend,
               (int)d, (int)sc->G, (int)sc->Hkv, (int)sc->n, (int)sc->steps, dt, e_pre, e_dec);
    }
    free_out(&ref);
    free_out(&one);
    free_out(&two);
    fg_token_classes_destroy(&tc);
    free(q);
    free(k);
    free(v);
    free(tokens);
}

int main(int argc, char **argv) {
    test_seed("test_backend");
    const char *all[] = {"cpu", "cuda", "hip"};
    const char **names = argc > 1 ? (const char **)argv + 1 : all;
    const int n_names = argc > 1 ? argc - 1 : 3;
    const shape_case cases[] = {
        {64, 1, 2, 1, 40, FG_DTYPE_F32},   {64, 4, 2, 2, 40, FG_DTYPE_F16},   {80, 1, 3, 3, 40, FG_DTYPE_BF16},
        {128, 4, 2, 17, 60, FG_DTYPE_F32}, {128, 8, 1, 255, 30, FG_DTYPE_F16}, {7, 2, 5, 13, 50, FG_DTYPE_BF16},
        {256, 1, 2, 64, 20, FG_DTYPE_F32},
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
        ran++;
    }
    if (ran == 0 && argc > 1 && !test_backend_required()) /* the requested GPU backends are not here: skipped */
        return 77;
    EXPECT(ran > 0, "no backend besides ref was tested");
    return test_finish();
}
