/*
 * Decode lockstep: a deliberately simple simulator of DESIGN §2.5 — sets of
 * positions, double-precision scores, no pages — runs beside the library for
 * >= 300 steps per policy. Two sequences with different policies and prompt
 * lengths share every batched decode call. At every step:
 *   - the kept position set of every head equals the simulator's;
 *   - the attention output equals dense attention over exactly that set
 *     plus the new token (NMSE in double);
 *   - the bytes a head holds equal its kept rows rounded up to pages.
 * Eviction ties closer than fp32 can call (relative 1e-4) are resolved by
 * adopting the library's choice, and counted.
 */
#include <string.h>

#include "fastgen.h"
#include "harness.h"
#include "sim.h"

#define STEPS 300

static void run_pair(const run_cfg *rc, const fg_compression_params *cpa, const fg_compression_params *cpb,
                     const char *name) {
    fg_token_classes *tc = sim_classes();
    const int32_t Hq = rc->G * rc->Hkv, d = rc->d;
    fg_context_params params;
    fg_context_params_default(&params);
    params.backend = "ref";
    params.n_layers = 1;
    params.n_q_heads = Hq;
    params.n_kv_heads = rc->Hkv;
    params.head_dim = d;
    params.kv_dtype = rc->dtype;
    params.max_seqs = 2;
    params.max_seq_len = MAXT;
    params.page_tokens = rc->page_tokens;
    params.pool_chunk_pages = 3;
    params.classes = tc;
    fg_context *ctx = NULL;
    EXPECT_OK(NULL, fg_context_create(&params, &ctx));

    static sim_seq seqs[2];
    make_seq(&seqs[0], rc, cpa);
    make_seq(&seqs[1], rc, cpb);
    float *out = malloc((size_t)MAXT * Hq * d * sizeof(float));
    for (int b = 0; b < 2; b++) {
        sim_seq *s = &seqs[b];
        EXPECT_OK(ctx, fg_seq_create(ctx, &s->cp, s->tokens, s->n, &s->id));
        EXPECT_OK(ctx, fg_prefill(ctx, s->id, 0, s->q, s->k, s->v, out));
        sim_init(ctx, s, rc);
    }

    const size_t row_q = (size_t)Hq * d, row_k = (size_t)rc->Hkv * d;
    float *bq = malloc(2 * row_q * sizeof(float)), *bk = malloc(2 * row_k * sizeof(float));
    float *bv = malloc(2 * row_k * sizeof(float)), *bo = malloc(2 * row_q * sizeof(float));
    double *ref = malloc(2 * row_q * sizeof(double));
    const size_t row_bytes = 2 * (size_t)d * (rc->dtype == FG_DTYPE_F32 ? 4 : 2);
    int bad_bytes = 0;
    double worst_nmse = 0.0;
    for (int32_t step = 0; step < STEPS; step++) {
        int32_t ids[2], toks[2];
        for (int b = 0; b < 2; b++) {
            sim_seq *s = &seqs[b];
            int32_t p = s->n + step;
            ids[b] = s->id;
            toks[b] = s->tokens[p];
            memcpy(bq + b * row_q, s->q + (size_t)p * row_q, row_q * sizeof(float));
            memcpy(bk + b * row_k, s->k + (size_t)p * row_k, row_k * sizeof(float));
            memcpy(bv + b * row_k, s->v + (size_t)p * row_k, row_k * sizeof(float));
        }
        EXPECT_OK(ctx, fg_decode(ctx, 0, 2, ids, toks, bq, bk, bv, bo));
        memset(ref, 0, 2 * row_q * sizeof(double));
        double num = 0.0, den = 0.0;
        for (int b = 0; b < 2; b++) {
            sim_seq *s = &seqs[b];
            int32_t p = s->n + step;
            for (int32_t g = 0; g < rc->Hkv; g++) {
                sim_step(s, rc, g, p, ref + b * row_q + (size_t)g * rc->G * d);
                compare_sets(ctx, s, g, p + 1, name);
                fg_head_info info;
                EXPECT_OK(ctx, fg_head_inspect(ctx, s->id, 0, g, &info));
                size_t pages = ((size_t)info.kept + rc->page_tokens - 1) / rc->page_tokens;
                bad_bytes += info.kv_bytes_held != pages * rc->page_tokens * row_bytes || info.length != p + 1;
            }
        }
        for (size_t i = 0; i < 2 * row_q; i++) {
            num += (bo[i] - ref[i]) * (bo[i] - ref[i]);
            den += ref[i] * ref[i];
            if (!isfinite(bo[i]))
                num = INFINITY;
        }
        worst_nmse = fmax(worst_nmse, num / den);
    }
    /* the library quantises the new row only after attending it, like the simulator */
    EXPECT(worst_nmse <= 1e-9, "%s: attention NMSE %.3g vs dense over the kept set", name, worst_nmse);
    EXPECT(bad_bytes == 0, "%s: %d steps where held bytes != kept rows rounded up to pages", name, bad_bytes);
    printf("  %-34s G=%d Hkv=%d d=%-3d %s page=%d  NMSE %.2e\n", name, (int)rc->G, (int)rc->Hkv, (int)d,
           rc->dtype == FG_DTYPE_F32 ? "f32 " : rc->dtype == FG_DTYPE_F16 ? "f16 " : "bf16", (int)rc->page_tokens,
           worst_nmse);
    for (int b = 0; b < 2; b++) {
        free(seqs[b].q);
        free(seqs[b].k);
        free(seqs[b].v);
    }
    free(out);
    free(bq);
    free(bk);
    free(bv);
    free(bo);
    free(ref);
    fg_context_destroy(&ctx);
    fg_token_classes_destroy(&tc);
}

static fg_compression_params one_entry(uint32_t comp, float rl, float rf, int32_t lt, int32_t ft, fg_score_mode mode,
                                       int32_t n_sink) {
    fg_compression_params cp;
    fg_compression_params_default(&cp);
    cp.n_policies = 1;
    cp.shortlist[0] = (fg_policy){comp, rl, rf, lt, ft};
    cp.score_mode = mode;
    cp.n_sink = n_sink;
    return cp;
}

int main(void) {
    test_seed("test_lockstep");
    const uint32_t S = FG_KEEP_SPECIAL, P = FG_KEEP_PUNCT, F = FG_KEEP_FREQUENT, L = FG_KEEP_LOCAL;
    struct {
        const char *name;
        fg_compression_params cp;
    } cfg[] = {
        {"special", one_entry(S, 0.25f, 0.25f, 0, 0, FG_SCORE_SUM, 0)},
        {"special+punct", one_entry(S | P, 0.25f, 0.25f, 0, 0, FG_SCORE_SUM, 0)},
        {"special+punct+frequent", one_entry(S | P | F, 0.25f, 0.25f, 0, 0, FG_SCORE_SUM, 0)},
        {"special+punct+frequent+local", one_entry(S | P | F | L, 0.25f, 0.125f, 0, 0, FG_SCORE_SUM, 0)},
        {"full", one_entry(FG_KEEP_FULL, 0.25f, 0.25f, 0, 0, FG_SCORE_SUM, 0)},
        {"streamingllm (sinks 4)", one_entry(S | L, 0.25f, 0.0f, 0, 0, FG_SCORE_SUM, 4)},
        {"h2o", one_entry(F | L, 0.125f, 0.125f, 0, 0, FG_SCORE_SUM, 0)},
        {"local", one_entry(L, 0.25f, 0.0f, 0, 0, FG_SCORE_SUM, 0)},
        {"frequent", one_entry(F, 0.0f, 0.25f, 0, 0, FG_SCORE_SUM, 0)},
        {"h2o tokens 8+6", one_entry(F | L, 1.0f, 1.0f, 8, 6, FG_SCORE_SUM, 0)},
        {"s+p+f+l mean", one_entry(S | P | F | L, 0.125f, 0.25f, 0, 0, FG_SCORE_MEAN, 0)},
        {"frequent mean tokens 10", one_entry(F, 0.0f, 1.0f, 0, 10, FG_SCORE_MEAN, 0)},
        {"local tokens 5 + frequent 0.0625", one_entry(L | F, 1.0f, 0.0625f, 5, 0, FG_SCORE_SUM, 2)},
    };
    const int n_cfg = (int)(sizeof cfg / sizeof cfg[0]);
    int run = 0;
    for (int32_t G = 1; G <= 4; G *= 2) {
        for (int i = 0; i < n_cfg; i++, run++) {
            run_cfg rc = {G, rng_int(1, 2), rng_int(0, 1) ? 8 : 16, rng_int(1, 6), (fg_dtype)(run % 3)};
            char name[96];
            snprintf(name, sizeof name, "%s | %s", cfg[i].name, cfg[(i + 1) % n_cfg].name);
            run_pair(&rc, &cfg[i].cp, &cfg[(i + 1) % n_cfg].cp, name);
        }
    }
    printf("%d runs of %d steps (2 sequences each); %d fp32 eviction near-ties adopted\n", run, STEPS, g_ties);
    return test_finish();
}
