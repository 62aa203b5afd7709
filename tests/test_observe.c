/*
 * The adaptive mode fed by the engine's own rows (FG_OBSERVE_EXPLICIT,
 * fg_seq_observe, fg_seq_compress):
 *   - fg_seq_observe's output is the causal attention of its rows over the
 *     held cache and themselves (a brute force in double), and it keeps
 *     none of them: the sequence's length and full cache stay;
 *   - the sequence never compresses on its own; fg_seq_compress does, within
 *     the budget, and keeps the key the given rows attend (planted in every
 *     head, far from the window), which a prompt that never looks at it
 *     loses;
 *   - many rows in several calls (the kept ones thinned evenly) compress
 *     alike on every backend, and a fork taken before the compression
 *     compresses exactly as its parent;
 *   - every refusal says why and changes nothing;
 *   - FG_OBSERVE_SCORES: scores the engine gives (fg_seq_observe_scores) add
 *     up call by call (fg_seq_observed_ranks), rank the keys alone, and the
 *     one scored highest stays in every head whose family ranks keys.
 * Backends: argv[1..], or ref and cpu; host activations, and device ones
 * (FG_IO_DEVICE) where the backend has a device.
 */
#include <string.h>

#include "backends/backend.h"
#include "tests/support/harness.h"

#define L 2
#define HKV 2
#define G 3
#define HQ (HKV * G)
#define D 16
#define N 48      /* the prompt */
#define R 150     /* given rows, in chunks of 50: more than 2 x W, so the kept ones are thinned */
#define CHUNK 50
#define W 16      /* observation_window */
#define PLANT 30  /* the key the given rows look for: before the window, after the keys cumulative attention favours */
#define MAXT (N + 8)
#define VOCAB 8

typedef struct world {
    int32_t tokens[MAXT];
    float q[L][N][HQ][D], k[L][N][HKV][D], v[L][N][HKV][D];
    float gq[L][R][HQ][D], gk[L][R][HKV][D], gv[L][R][HKV][D]; /* the given rows */
} world;

static world g_w;

static void make_world(void) {
    for (int32_t p = 0; p < MAXT; p++)
        g_w.tokens[p] = rng_int(0, 4);
    for (int32_t l = 0; l < L; l++) {
        for (int32_t p = 0; p < N; p++)
            for (int32_t x = 0; x < D; x++) {
                for (int32_t h = 0; h < HQ; h++)
                    g_w.q[l][p][h][x] = 0.3f * rng_gauss(); /* the prompt's rows look nowhere in particular */
                for (int32_t g = 0; g < HKV; g++) {
                    g_w.k[l][p][g][x] = rng_gauss();
                    g_w.v[l][p][g][x] = rng_gauss();
                }
            }
        for (int32_t i = 0; i < R; i++)
            for (int32_t x = 0; x < D; x++) {
                for (int32_t h = 0; h < HQ; h++) /* a question: its group's key at PLANT, and noise */
                    g_w.gq[l][i][h][x] = 2.5f * g_w.k[l][PLANT][h / G][x] + 0.3f * rng_gauss();
                for (int32_t g = 0; g < HKV; g++) {
                    g_w.gk[l][i][g][x] = rng_gauss();
                    g_w.gv[l][i][g][x] = rng_gauss();
                }
            }
    }
}

/* The causal attention of given row i (chunk from row c0) over the prompt and the chunk, in double. */
static void brute(int32_t l, int32_t c0, int32_t i, int32_t h, double *o) {
    const int32_t g = h / G, n = N + (i - c0) + 1;
    double s[N + CHUNK], m = -INFINITY, z = 0.0;
    for (int32_t j = 0; j < n; j++) {
        const float *kj = j < N ? g_w.k[l][j][g] : g_w.gk[l][c0 + j - N][g];
        double dot = 0.0;
        for (int32_t x = 0; x < D; x++)
            dot += (double)g_w.gq[l][i][h][x] * kj[x];
        s[j] = dot / sqrt((double)D);
        m = s[j] > m ? s[j] : m;
    }
    memset(o, 0, D * sizeof *o);
    for (int32_t j = 0; j < n; j++) {
        const double e = exp(s[j] - m);
        const float *vj = j < N ? g_w.v[l][j][g] : g_w.gv[l][c0 + j - N][g];
        z += e;
        for (int32_t x = 0; x < D; x++)
            o[x] += e * vj[x];
    }
    for (int32_t x = 0; x < D; x++)
        o[x] /= z;
}

static fg_compression_params explicit_params(float budget) {
    fg_compression_params cp;
    fg_compression_params_preset("fastgen-adaptive", &cp);
    cp.budget = budget;
    cp.observation_window = W;
    cp.defer_until = 0;
    cp.n_sink = 1;
    cp.observe = FG_OBSERVE_EXPLICIT;
    return cp;
}

/* Activations where the context wants them: host arrays, or a device's. */
typedef struct io {
    fg_backend be; /* the engine's own backend object, for its device memory */
    int device;
} io;

static const float *put(io *x, const float *src, size_t floats, void **tmp) {
    if (!x->device)
        return src;
    *tmp = NULL;
    if (x->be.ops->buffer_alloc(&x->be, floats * sizeof(float), tmp) ||
        fg_backend_write(&x->be, *tmp, src, floats * sizeof(float)))
        return NULL;
    return *tmp;
}

static void drop(io *x, void *tmp) {
    if (x->device && tmp)
        x->be.ops->buffer_free(&x->be, tmp);
}

static fg_context *make_context(const char *backend, io *x) {
    fg_token_classes *tc = NULL;
    fg_token_classes_create(VOCAB, NULL, &tc);
    fg_context_params p = test_context_params(backend, L, HQ, HKV, D);
    p.classes = tc;
    p.kv_dtype = FG_DTYPE_F32;
    p.max_seqs = 3;
    p.max_seq_len = MAXT;
    p.page_tokens = 8;
    if (x->device) {
        fg_device_info info;
        fg_device_info_fn *device_info = (fg_device_info_fn *)fg_backend_get_proc(&x->be, "device_info");
        if (!device_info || device_info(&x->be, &info)) {
            fg_token_classes_destroy(&tc);
            return NULL;
        }
        p.io = FG_IO_DEVICE;
        p.stream = info.stream;
    }
    fg_context *ctx = NULL;
    EXPECT_OK(NULL, fg_context_create(&p, &ctx));
    fg_token_classes_destroy(&tc);
    return ctx;
}

/* fg_prefill of every layer, or fg_seq_observe of given rows [c0, c0 + n) of one layer (out: host). */
static fg_status prefill_all(fg_context *ctx, io *x, int32_t seq) {
    static float out[N][HQ][D];
    fg_status st = FG_OK;
    for (int32_t l = 0; l < L && st == FG_OK; l++) {
        void *tq, *tk, *tv, *to;
        const float *q = put(x, &g_w.q[l][0][0][0], (size_t)N * HQ * D, &tq);
        const float *k = put(x, &g_w.k[l][0][0][0], (size_t)N * HKV * D, &tk);
        const float *v = put(x, &g_w.v[l][0][0][0], (size_t)N * HKV * D, &tv);
        float *o = (float *)put(x, &out[0][0][0], (size_t)N * HQ * D, &to);
        st = fg_prefill(ctx, seq, l, q, k, v, o);
        drop(x, tq), drop(x, tk), drop(x, tv), drop(x, to);
    }
    return st;
}

static fg_status observe(fg_context *ctx, io *x, int32_t seq, int32_t l, int32_t c0, int32_t n, float *out) {
    void *tq, *tk, *tv, *to;
    const float *q = put(x, &g_w.gq[l][c0][0][0], (size_t)n * HQ * D, &tq);
    const float *k = put(x, &g_w.gk[l][c0][0][0], (size_t)n * HKV * D, &tk);
    const float *v = put(x, &g_w.gv[l][c0][0][0], (size_t)n * HKV * D, &tv);
    float *o = (float *)put(x, out, (size_t)n * HQ * D, &to);
    fg_status st = fg_seq_observe(ctx, seq, l, q, k, v, n, o);
    if (st == FG_OK && x->device)
        st = fg_synchronize(ctx) ? FG_ERR_BACKEND : fg_backend_read(&x->be, out, o, (size_t)n * HQ * D * sizeof *out);
    drop(x, tq), drop(x, tk), drop(x, tv), drop(x, to);
    return st;
}

typedef struct outcome {
    int32_t kept[L][HKV], policy[L][HKV];
    int32_t pos[L][HKV][MAXT];
} outcome;

static void read_outcome(fg_context *ctx, int32_t seq, outcome *o) {
    memset(o, 0, sizeof *o);
    for (int32_t l = 0; l < L; l++)
        for (int32_t g = 0; g < HKV; g++) {
            fg_head_info info;
            EXPECT_OK(ctx, fg_head_inspect(ctx, seq, l, g, &info));
            o->policy[l][g] = info.policy_index;
            EXPECT_OK(ctx, fg_head_positions(ctx, seq, l, g, o->pos[l][g], MAXT, &o->kept[l][g]));
        }
}

/* The heads of an outcome that keep position p. */
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

/* The heads of seq whose family ranks keys (*ranking), and how many of them keep PLANT (*keeping). */
static void ranking_heads_keeping(fg_context *ctx, int32_t seq, const outcome *o, int *ranking, int *keeping) {
    for (int32_t l = 0; l < L; l++)
        for (int32_t g = 0; g < HKV; g++) {
            fg_head_info info;
            EXPECT_OK(ctx, fg_head_inspect(ctx, seq, l, g, &info));
            if (!(info.components & FG_KEEP_FREQUENT))
                continue;
            ++*ranking;
            for (int32_t j = 0; j < o->kept[l][g]; j++)
                *keeping += o->pos[l][g][j] == PLANT;
        }
}

static outcome g_first;
static int g_have_first;

static void run(const char *backend, int device) {
    io x = {.be = {.err = fg_error_to_stderr}, .device = device};
    if (device && fg_backend_open(backend, NULL, &x.be))
        return;
    fg_context *ctx = make_context(backend, &x);
    if (!ctx) {
        if (device)
            fg_backend_close(&x.be);
        return;
    }
    printf("  %s, %s activations\n", backend, device ? "device" : "host");
    const fg_compression_params cp = explicit_params(0.25f);
    int32_t seq = -1, fork = -1;
    EXPECT_OK(ctx, fg_seq_create(ctx, &cp, g_w.tokens, N, &seq));
    float out[CHUNK][HQ][D];
    /* before the prefill: refused, with a reason */
    EXPECT_STATUS(ctx, FG_ERR_BAD_STATE, observe(ctx, &x, seq, 0, 0, CHUNK, &out[0][0][0]));
    EXPECT(strstr(fg_last_error(ctx), "prefilled") != NULL, "says why: %s", fg_last_error(ctx));
    EXPECT_OK(ctx, prefill_all(ctx, &x, seq));
    fg_memory_stats ms;
    EXPECT_OK(ctx, fg_memory(ctx, seq, &ms));
    EXPECT(ms.rows_kept == ms.rows_full, "an explicit sequence compressed on its own: %lld of %lld rows",
           (long long)ms.rows_kept, (long long)ms.rows_full);
    /* the given rows: their output, none of them kept */
    double worst = 0.0;
    for (int32_t l = 0; l < L; l++)
        for (int32_t c0 = 0; c0 < R; c0 += CHUNK) {
            EXPECT_OK(ctx, observe(ctx, &x, seq, l, c0, CHUNK, &out[0][0][0]));
            for (int32_t i = 0; i < CHUNK; i += 7)
                for (int32_t h = 0; h < HQ; h++) {
                    double o[D];
                    brute(l, c0, c0 + i, h, o);
                    for (int32_t e = 0; e < D; e++) {
                        const double dv = fabs(o[e] - out[i][h][e]);
                        worst = dv > worst ? dv : worst;
                    }
                }
            if (l == 0 && c0 == 0) { /* a compression now would see layer 1 given nothing: refused */
                EXPECT_STATUS(ctx, FG_ERR_BAD_STATE, fg_seq_compress(ctx, seq));
                EXPECT(strstr(fg_last_error(ctx), "same rows") != NULL, "says why: %s", fg_last_error(ctx));
            }
        }
    EXPECT(worst < 1e-4, "fg_seq_observe's output is %.3g from the causal attention's", worst);
    int32_t len = 0;
    EXPECT_OK(ctx, fg_seq_length(ctx, seq, L - 1, &len));
    EXPECT(len == N, "the given rows were kept: length %d", (int)len);
    /* refusals that change nothing */
    EXPECT_STATUS(ctx, FG_ERR_INVALID_ARGUMENT, fg_seq_observe(ctx, seq, L, &g_w.gq[0][0][0][0], &g_w.gk[0][0][0][0],
                                                               &g_w.gv[0][0][0][0], 1, &out[0][0][0]));
    EXPECT_STATUS(ctx, FG_ERR_INVALID_ARGUMENT, fg_seq_observe(ctx, seq, 0, NULL, &g_w.gk[0][0][0][0],
                                                               &g_w.gv[0][0][0][0], 1, &out[0][0][0]));
    EXPECT_STATUS(ctx, FG_ERR_INVALID_ARGUMENT, fg_seq_observe(ctx, seq, 0, &g_w.gq[0][0][0][0], &g_w.gk[0][0][0][0],
                                                               &g_w.gv[0][0][0][0], 0, &out[0][0][0]));
    EXPECT_STATUS(ctx, FG_ERR_INVALID_ARGUMENT, fg_seq_compress(ctx, 7));
    EXPECT_OK(ctx, fg_memory(ctx, seq, &ms)); /* the refusals changed nothing */
    EXPECT(ms.rows_kept == ms.rows_full, "a refused call compressed the sequence");
    EXPECT_OK(ctx, fg_seq_length(ctx, seq, 0, &len));
    EXPECT(len == N, "a refused call changed the length to %d", (int)len);
    /* a fork before the compression compresses as its parent */
    EXPECT_OK(ctx, fg_seq_fork(ctx, seq, &fork));
    EXPECT_OK(ctx, fg_seq_compress(ctx, seq));
    EXPECT_OK(ctx, fg_seq_compress(ctx, fork));
    outcome a, b;
    read_outcome(ctx, seq, &a);
    read_outcome(ctx, fork, &b);
    EXPECT(!memcmp(&a, &b, sizeof a), "a fork taken before the compression compressed otherwise");
    EXPECT_OK(ctx, fg_memory(ctx, seq, &ms));
    EXPECT(ms.rows_kept <= (int64_t)ceil(0.25 * (double)ms.rows_full),
           "%lld rows kept of %lld, more than the budget 0.25", (long long)ms.rows_kept, (long long)ms.rows_full);
    EXPECT(heads_keeping(&a, PLANT) == L * HKV, "a head dropped the key every given row attends");
    EXPECT_STATUS(ctx, FG_ERR_BAD_STATE, observe(ctx, &x, seq, 0, 0, CHUNK, &out[0][0][0]));
    EXPECT(strstr(fg_last_error(ctx), "compressed already") != NULL, "says why: %s", fg_last_error(ctx));
    EXPECT_STATUS(ctx, FG_ERR_BAD_STATE, fg_seq_compress(ctx, seq));
    if (!g_have_first) {
        g_first = a;
        g_have_first = 1;
    } else {
        EXPECT(!memcmp(&g_first, &a, sizeof a), "%s compressed otherwise than the first backend", backend);
    }
    /* the control: the same budget judged by the prompt's own rows, which never look at the planted key */
    fg_compression_params tail = cp;
    tail.observe = FG_OBSERVE_TAIL;
    tail.defer_until = N + 4; /* still observing after the prefill: refused for what it is */
    int32_t other = -1;
    EXPECT_OK(ctx, fg_seq_destroy(ctx, fork));
    EXPECT_OK(ctx, fg_seq_create(ctx, &tail, g_w.tokens, N, &other));
    EXPECT_OK(ctx, prefill_all(ctx, &x, other));
    EXPECT_STATUS(ctx, FG_ERR_BAD_STATE, observe(ctx, &x, other, 0, 0, CHUNK, &out[0][0][0]));
    EXPECT(strstr(fg_last_error(ctx), "FG_OBSERVE_EXPLICIT") != NULL, "says why: %s", fg_last_error(ctx));
    EXPECT_OK(ctx, fg_seq_compress(ctx, other)); /* a tail sequence compressed before defer_until, when told */
    outcome c;
    read_outcome(ctx, other, &c);
    EXPECT(heads_keeping(&c, PLANT) < L * HKV, "the tail's own rows kept the planted key in every head: the test shows nothing");
    fg_context_destroy(&ctx);
    if (device)
        fg_backend_close(&x.be);
}

/* FG_OBSERVE_SCORES: the engine's key scores rank, added call by call; the
 * key scored highest is kept by every head within the budget. */
static void run_scores(const char *backend) {
    io x = {.be = {.err = fg_error_to_stderr}, .device = 0};
    fg_context *ctx = make_context(backend, &x);
    if (!ctx)
        return;
    printf("  %s, given scores\n", backend);
    fg_compression_params cp = explicit_params(0.25f);
    cp.observe = FG_OBSERVE_SCORES;
    static float sc[HKV][N], half[HKV][N], back[HKV][N];
    for (int32_t g = 0; g < HKV; g++)
        for (int32_t j = 0; j < N; j++) {
            sc[g][j] = j == PLANT ? 100.0f : (float)rng_uniform();
            half[g][j] = 0.5f * sc[g][j];
        }
    int32_t seq = -1, fork = -1;
    EXPECT_OK(ctx, fg_seq_create(ctx, &cp, g_w.tokens, N, &seq));
    EXPECT_STATUS(ctx, FG_ERR_BAD_STATE, fg_seq_observe_scores(ctx, seq, 0, &half[0][0], N));
    EXPECT(strstr(fg_last_error(ctx), "prefilled") != NULL, "says why: %s", fg_last_error(ctx));
    EXPECT_OK(ctx, prefill_all(ctx, &x, seq));
    fg_memory_stats ms;
    EXPECT_OK(ctx, fg_memory(ctx, seq, &ms));
    EXPECT(ms.rows_kept == ms.rows_full, "a scored sequence compressed on its own");
    /* refusals: each says why and leaves nothing behind */
    EXPECT_STATUS(ctx, FG_ERR_INVALID_ARGUMENT, fg_seq_observe_scores(ctx, seq, 0, &half[0][0], N - 1));
    EXPECT(strstr(fg_last_error(ctx), "keys layer 0 holds") != NULL, "says why: %s", fg_last_error(ctx));
    EXPECT_STATUS(ctx, FG_ERR_INVALID_ARGUMENT, fg_seq_observe_scores(ctx, seq, L, &half[0][0], N));
    EXPECT_STATUS(ctx, FG_ERR_INVALID_ARGUMENT, fg_seq_observe_scores(ctx, seq, 0, NULL, N));
    float bad[HKV][N];
    memcpy(bad, half, sizeof bad);
    bad[1][5] = -1.0f;
    EXPECT_STATUS(ctx, FG_ERR_INVALID_ARGUMENT, fg_seq_observe_scores(ctx, seq, 0, &bad[0][0], N));
    EXPECT(strstr(fg_last_error(ctx), "head 1, key 5") != NULL, "says which: %s", fg_last_error(ctx));
    bad[1][5] = NAN;
    EXPECT_STATUS(ctx, FG_ERR_INVALID_ARGUMENT, fg_seq_observe_scores(ctx, seq, 0, &bad[0][0], N));
    EXPECT_STATUS(ctx, FG_ERR_INVALID_ARGUMENT, fg_seq_observed_ranks(ctx, seq, 0, &back[0][0], N + 1));
    EXPECT_OK(ctx, fg_seq_observed_ranks(ctx, seq, 0, &back[0][0], N));
    int zero = 1;
    for (int32_t g = 0; g < HKV; g++)
        for (int32_t j = 0; j < N; j++)
            zero &= back[g][j] == 0.0f;
    EXPECT(zero, "refused scores left ranks behind");
    /* on a fork: sums past the float range refused, nothing added; a fork of a sequence scored in one layer
     * only is refused its compression as its parent would be */
    EXPECT_OK(ctx, fg_seq_fork(ctx, seq, &fork));
    static float huge[HKV][N];
    for (int32_t g = 0; g < HKV; g++)
        for (int32_t j = 0; j < N; j++)
            huge[g][j] = 3e38f;
    EXPECT_OK(ctx, fg_seq_observe_scores(ctx, fork, 0, &huge[0][0], N));
    EXPECT_STATUS(ctx, FG_ERR_INVALID_ARGUMENT, fg_seq_observe_scores(ctx, fork, 0, &huge[0][0], N));
    EXPECT(strstr(fg_last_error(ctx), "float range") != NULL, "says why: %s", fg_last_error(ctx));
    EXPECT_OK(ctx, fg_seq_observed_ranks(ctx, fork, 0, &back[0][0], N));
    EXPECT(back[1][7] == 3e38f, "a refused sum changed the ranks: %g", (double)back[1][7]);
    int32_t fork2 = -1;
    EXPECT_OK(ctx, fg_seq_fork(ctx, fork, &fork2));
    EXPECT_STATUS(ctx, FG_ERR_BAD_STATE, fg_seq_compress(ctx, fork2));
    EXPECT(strstr(fg_last_error(ctx), "scores as many times") != NULL, "a fork lost its score calls: %s",
           fg_last_error(ctx));
    EXPECT_OK(ctx, fg_seq_destroy(ctx, fork2));
    EXPECT_OK(ctx, fg_seq_destroy(ctx, fork));
    /* two calls add: the ranks are their sum */
    EXPECT_OK(ctx, fg_seq_observe_scores(ctx, seq, 0, &half[0][0], N));
    EXPECT_STATUS(ctx, FG_ERR_BAD_STATE, fg_seq_compress(ctx, seq)); /* layer 1 not scored yet */
    EXPECT(strstr(fg_last_error(ctx), "scores as many times") != NULL, "says why: %s", fg_last_error(ctx));
    for (int32_t l = 1; l < L; l++)
        EXPECT_OK(ctx, fg_seq_observe_scores(ctx, seq, l, &half[0][0], N));
    for (int32_t l = 0; l < L; l++)
        EXPECT_OK(ctx, fg_seq_observe_scores(ctx, seq, l, &half[0][0], N));
    EXPECT_OK(ctx, fg_seq_observed_ranks(ctx, seq, L - 1, &back[0][0], N));
    EXPECT(!memcmp(back, sc, sizeof back), "the ranks are not the sum of the scores given");
    /* a fork before the compression compresses as its parent; the planted key stays in every head */
    EXPECT_OK(ctx, fg_seq_fork(ctx, seq, &fork));
    EXPECT_OK(ctx, fg_seq_compress(ctx, seq));
    EXPECT_OK(ctx, fg_seq_compress(ctx, fork));
    outcome a, b;
    read_outcome(ctx, seq, &a);
    read_outcome(ctx, fork, &b);
    EXPECT(!memcmp(&a, &b, sizeof a), "a fork taken before the compression compressed otherwise");
    EXPECT_OK(ctx, fg_memory(ctx, seq, &ms));
    EXPECT(ms.rows_kept <= (int64_t)ceil(0.25 * (double)ms.rows_full),
           "%lld rows kept of %lld, more than the budget 0.25", (long long)ms.rows_kept, (long long)ms.rows_full);
    int ranking = 0, keeping = 0; /* the heads whose family ranks keys (the tail's rows chose the families) */
    ranking_heads_keeping(ctx, seq, &a, &ranking, &keeping);
    EXPECT(ranking > 0 && keeping == ranking, "%d of the %d heads that rank keys kept the key scored highest",
           keeping, ranking);
    EXPECT_STATUS(ctx, FG_ERR_BAD_STATE, fg_seq_observe_scores(ctx, seq, 0, &half[0][0], N));
    EXPECT(strstr(fg_last_error(ctx), "compressed already") != NULL, "says why: %s", fg_last_error(ctx));
    EXPECT_STATUS(ctx, FG_ERR_BAD_STATE, fg_seq_observed_ranks(ctx, seq, 0, &back[0][0], N));
    /* the scores' own mass as the judge (flags=mass): the key scored highest stays in every ranking head too */
    EXPECT_OK(ctx, fg_seq_destroy(ctx, fork));
    fg_compression_params mass;
    EXPECT_OK(NULL, fg_compression_params_parse("fastgen-adaptive:0.25:observe=scores:flags=mass", &mass));
    mass.observation_window = W;
    mass.n_sink = 1;
    EXPECT_OK(ctx, fg_seq_create(ctx, &mass, g_w.tokens, N, &fork));
    EXPECT_OK(ctx, prefill_all(ctx, &x, fork));
    for (int32_t l = 0; l < L; l++)
        EXPECT_OK(ctx, fg_seq_observe_scores(ctx, fork, l, &sc[0][0], N));
    EXPECT_OK(ctx, fg_seq_compress(ctx, fork));
    outcome m;
    read_outcome(ctx, fork, &m);
    int mass_ranking = 0, mass_keeping = 0;
    ranking_heads_keeping(ctx, fork, &m, &mass_ranking, &mass_keeping);
    EXPECT(mass_ranking > 0 && mass_keeping == mass_ranking, "flags=mass: %d of %d ranking heads kept the key",
           mass_keeping, mass_ranking);
    EXPECT_OK(ctx, fg_memory(ctx, fork, &ms));
    EXPECT(ms.rows_kept <= (int64_t)ceil(0.25 * (double)ms.rows_full), "flags=mass: %lld rows of %lld",
           (long long)ms.rows_kept, (long long)ms.rows_full);
    /* rows are not scores, scores not rows */
    float out[CHUNK][HQ][D];
    EXPECT_OK(ctx, fg_seq_destroy(ctx, fork));
    EXPECT_OK(ctx, fg_seq_create(ctx, &cp, g_w.tokens, N, &fork));
    EXPECT_OK(ctx, prefill_all(ctx, &x, fork));
    EXPECT_STATUS(ctx, FG_ERR_BAD_STATE, observe(ctx, &x, fork, 0, 0, CHUNK, &out[0][0][0]));
    fg_compression_params ex = explicit_params(0.25f);
    int32_t other = -1;
    EXPECT_OK(ctx, fg_seq_create(ctx, &ex, g_w.tokens, N, &other));
    EXPECT_OK(ctx, prefill_all(ctx, &x, other));
    EXPECT_STATUS(ctx, FG_ERR_BAD_STATE, fg_seq_observe_scores(ctx, other, 0, &half[0][0], N));
    EXPECT(strstr(fg_last_error(ctx), "FG_OBSERVE_SCORES") != NULL, "says why: %s", fg_last_error(ctx));
    fg_context_destroy(&ctx);
}

static void run_backend(const char *backend) {
    run_scores(backend);
    run(backend, 0);
    if (strcmp(backend, "ref") && strcmp(backend, "cpu"))
        run(backend, 1);
}

int main(int argc, char **argv) {
    test_seed("test_observe");
    make_world();
    return test_each_backend(argc, argv, run_backend);
}
