/*
 * The adaptive mode judged by predicted queries (FG_OBSERVE_PREDICTED: the
 * prompt's last rows advanced by the context's RoPE into the positions
 * decoding will reach):
 *   - the advance is RoPE's own: a query rotated at p and advanced by k
 *     equals the same query rotated at p + k (this test's RoPE, in double),
 *     for adjacent pairs and halves, a partial rotation and frequency
 *     factors, and k up to a million;
 *   - it keeps the key decoding will need and the prompt's tail does not
 *     look at: a planted key whose RoPE angle is opposite to the last rows'
 *     queries at their own positions, and aligned with them a few dozen
 *     positions on. The tail, at the same budget, drops it somewhere; every
 *     backend keeps the same rows;
 *   - every refusal says why: no RoPE described, bad RoPE fields, a horizon
 *     without the mode.
 * Backends: argv[1..], or ref and cpu.
 */
#include <string.h>

#include "core/internal.h"
#include "tests/support/harness.h"

#define L 2
#define HKV 2
#define G 2
#define HQ (HKV * G)
#define D 16
#define N 48     /* the prompt */
#define W 8      /* observation_window: rows 40..47 */
#define PLANT 8  /* the key the predicted rows need */
#define HORIZON 40
#define VOCAB 8
#define PI 3.14159265358979323846

/* Pair 0 turns pi / 36 a position (its frequency factor below): the last
 * rows, 32 to 39 positions after the plant, meet it near pi (opposite); the
 * predicted ones, 44 to 79 after, near 2 pi for the later half. */
static const double k_pair0 = PI / 36.0;

typedef struct world {
    int32_t tokens[N];
    float q[L][N][HQ][D], k[L][N][HKV][D], v[L][N][HKV][D]; /* q and k after RoPE */
} world;

static world g_w;
static float g_factors[D / 2];

/* This test's RoPE in double: pair j of the first dims lanes turned by pos x freq(j). */
static double pair_freq(double theta, int32_t dims, int32_t j, const float *factors) {
    return pow(theta, -(double)j / (dims / 2)) / (factors ? factors[j] : 1.0);
}

static void rope_ref(float *x, int32_t d, int32_t dims, int halves, double theta, const float *factors, int64_t pos) {
    for (int32_t j = 0; j < dims / 2; j++) {
        const double a = (double)pos * pair_freq(theta, dims, j, factors);
        float *p = x + (halves ? j : 2 * j), *q = x + (halves ? j + dims / 2 : 2 * j + 1);
        const double x0 = *p, x1 = *q;
        *p = (float)(x0 * cos(a) - x1 * sin(a));
        *q = (float)(x0 * sin(a) + x1 * cos(a));
    }
    (void)d;
}

static fg_context_params rope_params(const char *backend, fg_token_classes *tc) {
    fg_context_params p = test_context_params(backend, L, HQ, HKV, D);
    p.classes = tc;
    p.kv_dtype = FG_DTYPE_F32;
    p.max_seqs = 2;
    p.max_seq_len = N + 8;
    p.page_tokens = 8;
    p.rope_theta = 10000.0f;
    p.rope_style = FG_ROPE_ADJACENT;
    p.rope_freq_factors = g_factors;
    return p;
}

static void check_advance(void) {
    fg_token_classes *tc = NULL;
    EXPECT_OK(NULL, fg_token_classes_create(VOCAB, NULL, &tc));
    const int32_t dims_of[] = {D, 12};
    for (int halves = 0; halves < 2; halves++)
        for (int c = 0; c < 2; c++) {
            fg_context_params p = rope_params("ref", tc);
            p.rope_style = halves ? FG_ROPE_HALVES : FG_ROPE_ADJACENT;
            p.rope_dims = dims_of[c];
            p.rope_theta = c ? 500000.0f : 10000.0f;
            float factors[D / 2];
            for (int32_t j = 0; j < D / 2; j++)
                factors[j] = c ? 1.0f + (float)j : 1.0f;
            p.rope_freq_factors = c ? factors : NULL;
            fg_context *ctx = NULL;
            EXPECT_OK(NULL, fg_context_create(&p, &ctx));
            if (!ctx)
                continue;
            double worst = 0.0;
            const int64_t ks[] = {1, 37, 4096, 1000003};
            for (size_t t = 0; t < sizeof ks / sizeof ks[0]; t++) {
                float x[2][D], want[2][D], turn[D];
                for (int32_t h = 0; h < 2; h++)
                    for (int32_t e = 0; e < D; e++)
                        x[h][e] = rng_gauss();
                memcpy(want, x, sizeof x);
                const int64_t pos = rng_int(0, 5000);
                for (int32_t h = 0; h < 2; h++) {
                    rope_ref(x[h], D, dims_of[c], halves, p.rope_theta, p.rope_freq_factors, pos);
                    rope_ref(want[h], D, dims_of[c], halves, p.rope_theta, p.rope_freq_factors, pos + ks[t]);
                }
                fg_rope_turns(ctx, ks[t], turn);
                fg_rope_turn(ctx, turn, &x[0][0], 2);
                for (int32_t h = 0; h < 2; h++)
                    for (int32_t e = 0; e < D; e++) {
                        const double dv = fabs((double)x[h][e] - want[h][e]);
                        worst = dv > worst ? dv : worst;
                    }
            }
            EXPECT(worst < 2e-4, "RoPE advanced (%s, %d lanes) is %.3g from RoPE at the later position",
                   halves ? "halves" : "adjacent", (int)dims_of[c], worst);
            fg_context_destroy(&ctx);
        }
    fg_token_classes_destroy(&tc);
}

static void make_world(void) {
    for (int32_t j = 0; j < D / 2; j++)
        g_factors[j] = 1.0f;
    g_factors[0] = (float)(1.0 / k_pair0); /* theta^0 / factor = pi / 36 */
    for (int32_t p = 0; p < N; p++)
        g_w.tokens[p] = rng_int(0, 4);
    for (int32_t l = 0; l < L; l++)
        for (int32_t p = 0; p < N; p++) {
            for (int32_t h = 0; h < HQ; h++) {
                float *q = g_w.q[l][p][h];
                for (int32_t e = 2; e < D; e++) /* the prompt looks nowhere in particular */
                    q[e] = 0.3f * rng_gauss();
                q[0] = p >= N - W ? 5.66f : 0.0f; /* the last rows: along pair 0, where the plant is */
                q[1] = 0.0f;
                rope_ref(q, D, D, 0, 10000.0, g_factors, p);
            }
            for (int32_t g = 0; g < HKV; g++) {
                float *k = g_w.k[l][p][g];
                for (int32_t e = 0; e < D; e++) {
                    k[e] = e < 2 ? 0.0f : rng_gauss();
                    g_w.v[l][p][g][e] = rng_gauss();
                }
                if (p == PLANT) { /* the plant: pair 0 alone */
                    memset(k, 0, D * sizeof *k);
                    k[0] = 5.66f;
                }
                rope_ref(k, D, D, 0, 10000.0, g_factors, p);
            }
        }
}

static fg_compression_params params(fg_observe_mode observe) {
    fg_compression_params cp;
    fg_compression_params_preset("fastgen-adaptive", &cp);
    cp.budget = 0.25f;
    cp.observation_window = W;
    cp.defer_until = 0;
    cp.n_sink = 1;
    cp.observe = observe;
    cp.predict_horizon = observe == FG_OBSERVE_PREDICTED ? HORIZON : 0;
    return cp;
}

typedef struct outcome {
    int32_t kept[L][HKV];
    int32_t pos[L][HKV][N];
} outcome;

/* A sequence under cp, prefilled (compressed at its end), its heads' positions read. */
static void run_seq(fg_context *ctx, const fg_compression_params *cp, outcome *o) {
    static float out[N][HQ][D];
    int32_t seq = -1;
    memset(o, 0, sizeof *o);
    EXPECT_OK(ctx, fg_seq_create(ctx, cp, g_w.tokens, N, &seq));
    for (int32_t l = 0; l < L; l++)
        EXPECT_OK(ctx, fg_prefill(ctx, seq, l, &g_w.q[l][0][0][0], &g_w.k[l][0][0][0], &g_w.v[l][0][0][0],
                                  &out[0][0][0]));
    fg_memory_stats ms;
    EXPECT_OK(ctx, fg_memory(ctx, seq, &ms));
    EXPECT(ms.rows_kept <= (int64_t)ceil(0.25 * (double)ms.rows_full), "%lld rows kept of %lld, over the budget",
           (long long)ms.rows_kept, (long long)ms.rows_full);
    for (int32_t l = 0; l < L; l++)
        for (int32_t g = 0; g < HKV; g++)
            EXPECT_OK(ctx, fg_head_positions(ctx, seq, l, g, o->pos[l][g], N, &o->kept[l][g]));
    EXPECT_OK(ctx, fg_seq_destroy(ctx, seq));
}

static int heads_keeping(const outcome *o, int32_t p) {
    int n = 0;
    for (int32_t l = 0; l < L; l++)
        for (int32_t g = 0; g < HKV; g++) {
            int has = 0;
            for (int32_t j = 0; j < o->kept[l][g]; j++)
                has |= o->pos[l][g][j] == p;
            n += has;
        }
    return n;
}

static outcome g_first;
static int g_have_first;

static void run(const char *backend) {
    printf("  %s\n", backend);
    fg_token_classes *tc = NULL;
    EXPECT_OK(NULL, fg_token_classes_create(VOCAB, NULL, &tc));
    fg_context_params p = rope_params(backend, tc);
    fg_context *ctx = NULL;
    EXPECT_OK(NULL, fg_context_create(&p, &ctx));
    if (!ctx) {
        fg_token_classes_destroy(&tc);
        return;
    }
    const fg_compression_params pred = params(FG_OBSERVE_PREDICTED), tail = params(FG_OBSERVE_TAIL);
    outcome a, c;
    run_seq(ctx, &pred, &a);
    run_seq(ctx, &tail, &c);
    EXPECT(heads_keeping(&a, PLANT) == L * HKV, "the predicted rows kept the planted key in %d of %d heads",
           heads_keeping(&a, PLANT), L * HKV);
    EXPECT(heads_keeping(&c, PLANT) < L * HKV,
           "the tail's own rows kept the planted key in every head: the test shows nothing");
    if (!g_have_first) {
        g_first = a;
        g_have_first = 1;
    } else {
        EXPECT(!memcmp(&g_first, &a, sizeof a), "%s compressed otherwise than the first backend", backend);
    }
    /* a later horizon passes the alignment (2 pi at 72 positions) by: the plant goes again */
    fg_compression_params far = pred;
    far.predict_horizon = 1;
    outcome f;
    run_seq(ctx, &far, &f);
    EXPECT(heads_keeping(&f, PLANT) < L * HKV, "rows predicted 1 position on (still opposite to the plant) kept it in "
           "every head: the horizon is not used");
    fg_context_destroy(&ctx);

    /* refusals: no RoPE described, then bad RoPE fields */
    p.rope_theta = 0.0f;
    p.rope_freq_factors = NULL;
    EXPECT_OK(NULL, fg_context_create(&p, &ctx));
    int32_t seq = -1;
    EXPECT_STATUS(ctx, FG_ERR_INVALID_ARGUMENT, fg_seq_create(ctx, &pred, g_w.tokens, N, &seq));
    EXPECT(strstr(fg_last_error(ctx), "rope_theta") != NULL, "says why: %s", fg_last_error(ctx));
    EXPECT_STATUS(ctx, FG_ERR_INVALID_ARGUMENT, fg_context_set_compression(ctx, &pred));
    EXPECT(strstr(fg_last_error(ctx), "rope_theta") != NULL, "says why: %s", fg_last_error(ctx));
    fg_context_destroy(&ctx);
    float bad_factor[D / 2];
    for (int32_t j = 0; j < D / 2; j++)
        bad_factor[j] = j == 3 ? 0.0f : 1.0f;
    for (int b = 0; b < 7; b++) {
        fg_context_params q = rope_params(backend, tc);
        const char *why = NULL;
        switch (b) {
        case 0: q.rope_theta = -1.0f, why = "rope_theta"; break;
        case 1: q.rope_theta = NAN, why = "rope_theta"; break;
        case 2: q.rope_dims = 7, why = "rope_dims"; break;
        case 3: q.rope_dims = D + 2, why = "rope_dims"; break;
        case 4: q.rope_style = 2, why = "rope_style"; break;
        case 5: q.rope_freq_factors = bad_factor, why = "rope_freq_factors[3]"; break;
        default: q.rope_theta = 0.0f, why = "rope_freq_factors need"; break;
        }
        fg_context *bad = NULL;
        EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_context_create(&q, &bad));
        EXPECT(!bad && strstr(fg_last_error(NULL), why), "bad RoPE %d: %s", b, fg_last_error(NULL));
    }
    fg_token_classes_destroy(&tc);
}

static void check_params(void) {
    fg_compression_params cp = params(FG_OBSERVE_TAIL);
    cp.predict_horizon = 64;
    EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_compression_params_validate(&cp));
    EXPECT(strstr(fg_last_error(NULL), "only FG_OBSERVE_PREDICTED") != NULL, "says why: %s", fg_last_error(NULL));
    cp = params(FG_OBSERVE_PREDICTED);
    cp.predict_horizon = -1;
    EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_compression_params_validate(&cp));
    cp = params(FG_OBSERVE_PREDICTED);
    EXPECT_OK(NULL, fg_compression_params_validate(&cp));
    fg_compression_params_preset("snapkv", &cp);
    cp.observe = FG_OBSERVE_PREDICTED;
    EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_compression_params_validate(&cp));
    EXPECT(strstr(fg_last_error(NULL), "FG_OBSERVE_PREDICTED is for FG_ALLOC_ADAPTIVE") != NULL, "says why: %s",
           fg_last_error(NULL));
}

int main(int argc, char **argv) {
    test_seed("test_predicted");
    check_advance();
    check_params();
    make_world();
    return test_each_backend(argc, argv, run);
}
