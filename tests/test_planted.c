/*
 * Planted heads: the synthetic workload plants one head of each type (sink /
 * special, punctuation, local, heavy hitter, broad) per layer; profiling with
 * the paper's shortlist must pick the expected entry for every head, at
 * d = 64 and 128, G = 1 and 4, profiling all rows or an observation window.
 */
#include <string.h>

#include "fastgen.h"
#include "tests/support/harness.h"
#include "tools/synth.h"

static void run(int32_t d, int32_t G, int32_t observation_window) {
    const int32_t Hkv = SYNTH_N_TYPES, Hq = G * Hkv, n = 512, layers = 2;
    synth syn;
    EXPECT(synth_create(layers, Hq, Hkv, d, 7, &syn) == FG_OK, "synth");
    fg_context_params p = test_context_params("cpu", layers, Hq, Hkv, d);
    p.kv_dtype = FG_DTYPE_F16;
    p.max_seq_len = n;
    p.classes = syn.classes;
    fg_compression_params cp;
    fg_compression_params_default(&cp);
    cp.observation_window = observation_window;
    fg_context *ctx = NULL;
    EXPECT_OK(NULL, fg_context_create(&p, &ctx));
    EXPECT_OK(ctx, fg_context_set_compression(ctx, &cp));

    int32_t tokens[512];
    for (int32_t i = 0; i < n; i++)
        tokens[i] = synth_token(&syn, i);
    size_t nq = (size_t)n * Hq * d, nk = (size_t)n * Hkv * d;
    float *q = malloc(nq * sizeof *q), *k = malloc(nk * sizeof *k), *v = malloc(nk * sizeof *v);
    float *out = malloc(nq * sizeof *out);
    int32_t seq = -1;
    EXPECT_OK(ctx, fg_seq_create(ctx, NULL, tokens, n, &seq));
    int32_t agree = 0;
    for (int32_t l = 0; l < layers; l++) {
        synth_qkv(&syn, l, tokens, 0, n, q, k, v);
        EXPECT_OK(ctx, fg_prefill(ctx, seq, l, q, k, v, out));
        for (int32_t g = 0; g < Hkv; g++) {
            fg_head_info info;
            EXPECT_OK(ctx, fg_head_inspect(ctx, seq, l, g, &info));
            synth_type type = syn.types[l * Hkv + g];
            int32_t want = synth_expected_entry(type);
            EXPECT(info.policy_index == want,
                   "d=%d G=%d obs=%d layer %d head %d planted %s: chose entry %d (recoveries %.3f %.3f %.3f %.3f)",
                   (int)d, (int)G, (int)observation_window, (int)l, (int)g, synth_type_name(type),
                   (int)info.policy_index, (double)info.recovery[0], (double)info.recovery[1],
                   (double)info.recovery[2], (double)info.recovery[3]);
            agree += info.policy_index == want;
        }
    }
    printf("  d=%-3d G=%d observation window %-4d: %d / %d heads as planted\n", (int)d, (int)G,
           (int)observation_window, (int)agree, (int)(layers * Hkv));
    free(q);
    free(k);
    free(v);
    free(out);
    fg_context_destroy(&ctx);
    synth_destroy(&syn);
}

int main(void) {
    test_seed("test_planted");
    for (int32_t d = 64; d <= 128; d *= 2)
        for (int32_t G = 1; G <= 4; G *= 4)
            run(d, G, 0);
    run(128, 4, 256);
    return test_finish();
}
