/*
 * Budget mode (fg_compression_params.budget / budget_tokens):
 *   - the allocation (fg_policy_allocate) on random instances: within the
 *     budget whenever the cheapest choice is, maximal (no upgrade still
 *     fits), and never below the exhaustive optimum by more than one head's
 *     best upgrade (the bound of the greedy for this knapsack);
 *   - on the synthetic workload: after each layer's prefill the heads keep at
 *     most budget x the full rows (+1% of rounding: entries cost the rows
 *     they keep as the sequence grows); while decoding the kept share stays
 *     near the budget; budget 1 keeps everything.
 */
#include <string.h>

#include "core/internal.h"
#include "tests/support/harness.h"
#include "tools/synth.h"

enum { MAXH = 4, MAXE = 5 };

static double total(const double *rec, const int32_t *choice, int32_t H, int32_t E) {
    double s = 0.0;
    for (int32_t g = 0; g < H; g++)
        s += rec[g * E + choice[g]];
    return s;
}

static int64_t used(const int32_t *cost, const int32_t *choice, int32_t H, int32_t E) {
    int64_t s = 0;
    for (int32_t g = 0; g < H; g++)
        s += cost[g * E + choice[g]];
    return s;
}

static void test_allocate(void) {
    int infeasible = 0, not_maximal = 0, far = 0, cases = 0;
    double worst_gap = 0.0;
    for (int it = 0; it < 3000; it++, cases++) {
        const int32_t H = rng_int(1, MAXH), E = rng_int(1, MAXE);
        double rec[MAXH * MAXE];
        int32_t cost[MAXH * MAXE], choice[MAXH];
        for (int32_t g = 0; g < H; g++)
            for (int32_t e = 0; e < E; e++) { /* entries roughly cheapest first, like a shortlist */
                cost[g * E + e] = rng_int(0, 10) + 10 * e;
                rec[g * E + e] = rng_uniform() * 0.5 + 0.1 * e;
            }
        const int64_t budget = rng_int(0, 60 * H);
        fg_policy_allocate(rec, cost, H, E, budget, choice);
        int64_t cheapest = 0;
        for (int32_t g = 0; g < H; g++) {
            int32_t c = cost[g * E];
            for (int32_t e = 1; e < E; e++)
                c = cost[g * E + e] < c ? cost[g * E + e] : c;
            cheapest += c;
        }
        if (cheapest <= budget && used(cost, choice, H, E) > budget)
            infeasible++;
        /* maximal: no single change that gains recovery still fits */
        for (int32_t g = 0; g < H; g++)
            for (int32_t e = 0; e < E; e++) {
                const int64_t dc = (int64_t)cost[g * E + e] - cost[g * E + choice[g]];
                if (rec[g * E + e] > rec[g * E + choice[g]] && used(cost, choice, H, E) + dc <= budget)
                    not_maximal++;
            }
        /* exhaustive optimum */
        double best = -1.0, max_step = 0.0;
        int32_t c[MAXH] = {0};
        for (;;) {
            if (used(cost, c, H, E) <= budget && total(rec, c, H, E) > best)
                best = total(rec, c, H, E);
            int32_t g = 0;
            while (g < H && ++c[g] == E)
                c[g++] = 0;
            if (g == H)
                break;
        }
        for (int32_t g = 0; g < H; g++)
            for (int32_t e = 0; e < E; e++)
                max_step = fmax(max_step, rec[g * E + e] - rec[g * E]);
        if (best >= 0.0) {
            const double gap = best - total(rec, choice, H, E);
            worst_gap = fmax(worst_gap, gap);
            far += gap > max_step + 1e-12;
        }
    }
    EXPECT(infeasible == 0, "%d of %d allocations exceed a budget the cheapest choice meets", infeasible, cases);
    EXPECT(not_maximal == 0, "%d upgrades that fit were left out", not_maximal);
    EXPECT(far == 0, "%d allocations below the optimum by more than one head's upgrade", far);
    printf("allocation: %d random instances, feasible and maximal; worst gap to the exhaustive optimum %.3f\n", cases,
           worst_gap);
}

/* Kept rows over the sequence's heads and layers, and the full rows. */
static void rows_of(fg_context *ctx, int32_t seq, int64_t *kept, int64_t *full) {
    fg_memory_stats m;
    EXPECT_OK(ctx, fg_memory(ctx, seq, &m));
    *kept = m.rows_kept;
    *full = m.rows_full;
}

static void test_context(void) {
    enum { L = 2, HQ = 16, HKV = 8, D = 64, N = 512, STEPS = 200 };
    synth syn;
    EXPECT_OK(NULL, synth_create(L, HQ, HKV, D, 5, &syn));
    fg_context_params p = test_context_params("cpu", L, HQ, HKV, D);
    p.max_seqs = 4;
    p.max_seq_len = N + STEPS;
    p.classes = syn.classes;
    fg_context *ctx = NULL;
    EXPECT_OK(NULL, fg_context_create(&p, &ctx));
    static int32_t tokens[N + STEPS];
    for (int32_t t = 0; t < N + STEPS; t++)
        tokens[t] = synth_token(&syn, t);
    static float q[N * HQ * D], k[N * HKV * D], v[N * HKV * D], out[N * HQ * D];
    const float budgets[] = {0.25f, 0.4f, 0.6f, 1.0f};
    double prev_recovery = -1.0;
    for (int b = 0; b < 4; b++) {
        fg_compression_params cp;
        EXPECT_OK(NULL, fg_compression_params_preset("fastgen-budget", &cp));
        cp.budget = budgets[b];
        int32_t seq = -1;
        EXPECT_OK(ctx, fg_seq_create(ctx, &cp, tokens, N, &seq));
        double recovered = 0.0;
        for (int32_t l = 0; l < L; l++) {
            synth_qkv(&syn, l, tokens, 0, N, q, k, v);
            EXPECT_OK(ctx, fg_prefill(ctx, seq, l, q, k, v, out));
            int64_t layer_rows = 0;
            for (int32_t g = 0; g < HKV; g++) {
                fg_head_info hi;
                EXPECT_OK(ctx, fg_head_inspect(ctx, seq, l, g, &hi));
                layer_rows += hi.kept;
                recovered += hi.recovery[hi.policy_index];
            }
            /* entries cost their steady-state rows; the prompt's rounding may add 1% */
            EXPECT(layer_rows <= (int64_t)ceil(((double)budgets[b] + 0.01) * HKV * N),
                   "budget %.2f layer %d: %lld rows kept", (double)budgets[b], (int)l, (long long)layer_rows);
        }
        int64_t kept0, full0, kept, full;
        rows_of(ctx, seq, &kept0, &full0);
        for (int32_t step = 0; step < STEPS; step++)
            for (int32_t l = 0; l < L; l++) {
                const int32_t pos = N + step;
                synth_qkv(&syn, l, &tokens[pos], pos, 1, q, k, v);
                EXPECT_OK(ctx, fg_decode(ctx, l, 1, &seq, &tokens[pos], q, k, v, out));
            }
        rows_of(ctx, seq, &kept, &full);
        const double share0 = (double)kept0 / (double)full0, share = (double)kept / (double)full;
        EXPECT(share0 <= budgets[b] + 0.01, "budget %.2f: %.3f kept after the prompt", (double)budgets[b], share0);
        EXPECT(fabs(share - share0) <= 0.05, "budget %.2f: the kept share drifted from %.3f to %.3f while decoding",
               (double)budgets[b], share0, share);
        if (budgets[b] == 1.0f)
            EXPECT(kept == full, "budget 1 keeps everything: %lld of %lld", (long long)kept, (long long)full);
        EXPECT(recovered >= prev_recovery - 1e-9, "a larger budget recovered less: %.4f < %.4f", recovered,
               prev_recovery);
        prev_recovery = recovered;
        printf("budget %.2f: %.3f of the rows kept after the prompt, %.3f after %d steps; recovery %.4f per head\n",
               (double)budgets[b], share0, share, STEPS, recovered / (L * HKV));
        EXPECT_OK(ctx, fg_seq_destroy(ctx, seq));
    }
    /* bad budgets */
    fg_compression_params cp;
    fg_compression_params_default(&cp);
    cp.budget = 1.5f;
    EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_compression_params_validate(&cp));
    cp.budget = 0.0f;
    cp.budget_tokens = -1;
    EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_compression_params_validate(&cp));
    fg_context_destroy(&ctx);
    synth_destroy(&syn);
}

int main(void) {
    test_seed("test_budget");
    test_allocate();
    test_context();
    return test_finish();
}
