/*
 * Hostile numbers and odd call orders (issue 38): every case runs under an
 * alarm, so a call that never returns fails the test with the case's name.
 *   - adaptive mode: one key or value of 1e20 / 1e30 / NaN / Inf, every query NaN
 *     (every predicted error NaN), f32 and bf16 caches: the compressing
 *     decode step returns, the heads keep the budget and the floor;
 *   - budget mode: one NaN or Inf in q or k, every dtype: fg_prefill returns
 *     within the budget;
 *   - an adaptive prompt shorter than defer_until carried past it by
 *     fg_seq_append is compressed, exactly as the same tokens decoded one by
 *     one when the append ends at defer_until; defer_until above
 *     max_seq_len is refused;
 *   - thread pools: INT32_MAX tasks hand out no negative index; a pool run
 *     again from a task of another pool's job inside its own job is refused
 *     instead of deadlocking;
 *   (one context driven from two threads at once: test_threads, which CI
 *   runs under ThreadSanitizer too;)
 *   - forks: after any destroy the sequences together hold no more than
 *     they would apart;
 *   - tova, h2o, fastgen and the adaptive mode on ref and cpu after a -inf
 *     key or a NaN query: the same kept rows at every step (NaN ranks).
 * Backends: argv[1..], or ref and cpu.
 */
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tests/support/harness.h"

#define L 2
#define HKV 2
#define G 2
#define HQ (HKV * G)
#define D 16
#define VOCAB 8 /* 0-4 ordinary, 5 punctuation, 6 special */
#define MAXT 160

static const char *g_backend = "ref";
static char g_case[128];

static void on_alarm(int sig) {
    (void)sig;
    static const char msg[] = "test_hostile: a call did not return within its alarm: ";
    if (write(2, msg, sizeof msg - 1) < 0 || write(2, g_case, strlen(g_case)) < 0 || write(2, "\n", 1) < 0)
        _exit(3);
    _exit(2);
}

/* Starts a case: its name for the alarm's message, and `seconds` to finish. */
static void start_case(const char *name, unsigned seconds) {
    static struct timespec last;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (getenv("FG_TEST_VERBOSE") && g_case[0])
        printf("  %.2f s: %s\n", (double)(now.tv_sec - last.tv_sec) + 1e-9 * (double)(now.tv_nsec - last.tv_nsec),
               g_case);
    last = now;
    snprintf(g_case, sizeof g_case, "%s", name);
    alarm(seconds);
}

typedef struct world {
    int32_t tokens[MAXT];
    float q[L][MAXT][HQ][D], k[L][MAXT][HKV][D], v[L][MAXT][HKV][D];
} world;

static world g_w;

static void make_world(void) {
    for (int32_t p = 0; p < MAXT; p++) {
        const int32_t r = rng_int(0, 99);
        g_w.tokens[p] = r < 4 ? 6 : r < 14 ? 5 : rng_int(0, 4);
    }
    for (int32_t l = 0; l < L; l++)
        for (int32_t p = 0; p < MAXT; p++) {
            for (int32_t h = 0; h < HQ; h++)
                for (int32_t x = 0; x < D; x++)
                    g_w.q[l][p][h][x] = 1.5f * rng_gauss();
            for (int32_t g = 0; g < HKV; g++)
                for (int32_t x = 0; x < D; x++) {
                    g_w.k[l][p][g][x] = 1.5f * rng_gauss();
                    g_w.v[l][p][g][x] = rng_gauss();
                }
        }
}

static fg_token_classes *g_classes;

static fg_context *make_context(fg_dtype dtype, int32_t max_seqs, int32_t max_len) {
    fg_context_params p = test_context_params(g_backend, L, HQ, HKV, D);
    p.kv_dtype = dtype;
    p.max_seqs = max_seqs;
    p.max_seq_len = max_len;
    p.page_tokens = 8;
    p.classes = g_classes;
    fg_context *ctx = NULL;
    EXPECT_OK(NULL, fg_context_create(&p, &ctx));
    return ctx;
}

static void prefill_all(fg_context *ctx, int32_t seq, const world *w, int32_t n) {
    static float out[MAXT * HQ * D];
    static float q[MAXT][HQ][D], k[MAXT][HKV][D], v[MAXT][HKV][D];
    for (int32_t l = 0; l < L; l++) {
        memcpy(q, w->q[l], (size_t)n * sizeof q[0]);
        memcpy(k, w->k[l], (size_t)n * sizeof k[0]);
        memcpy(v, w->v[l], (size_t)n * sizeof v[0]);
        EXPECT_OK(ctx, fg_prefill(ctx, seq, l, &q[0][0][0], &k[0][0][0], &v[0][0][0], out));
    }
}

/* One decode step of one sequence at position p, every layer. */
static fg_status decode_at(fg_context *ctx, int32_t seq, const world *w, int32_t p, float *out) {
    for (int32_t l = 0; l < L; l++) {
        fg_status st = fg_decode(ctx, l, 1, &seq, &w->tokens[p], &w->q[l][p][0][0], &w->k[l][p][0][0],
                                 &w->v[l][p][0][0], out + (size_t)l * HQ * D);
        if (st)
            return st;
    }
    return FG_OK;
}

static int64_t rows_kept(fg_context *ctx, int32_t seq, int32_t *least) {
    int64_t kept = 0;
    *least = MAXT;
    for (int32_t l = 0; l < L; l++)
        for (int32_t g = 0; g < HKV; g++) {
            fg_head_info info;
            EXPECT_OK(ctx, fg_head_inspect(ctx, seq, l, g, &info));
            kept += info.kept;
            *least = info.kept < *least ? info.kept : *least;
        }
    return kept;
}

/* ---------------------------------------------------------------- 1. adaptive */

enum { POISON_KEY, POISON_VALUE, POISON_ALL_Q };

static void adaptive_poisoned(fg_dtype dtype, int kind, float value) {
    char name[96];
    snprintf(name, sizeof name, "%s adaptive %s %s %g", g_backend, fg_dtype_name(dtype),
             kind == POISON_KEY ? "one key" : kind == POISON_VALUE ? "one value" : "every query", (double)value);
    start_case(name, 60);
    const int32_t n = 24, defer = 40;
    world *w = malloc(sizeof *w);
    *w = g_w;
    if (kind == POISON_KEY || kind == POISON_VALUE)
        for (int32_t x = 0; x < D; x++)
            (kind == POISON_KEY ? w->k : w->v)[1][7][1][x] *= value;
    else
        for (int32_t l = 0; l < L; l++)
            for (int32_t p = 0; p < MAXT; p++)
                for (int32_t h = 0; h < HQ; h++)
                    for (int32_t x = 0; x < D; x++)
                        w->q[l][p][h][x] = value;
    fg_context *ctx = make_context(dtype, 1, MAXT);
    fg_compression_params cp;
    fg_compression_params_preset("fastgen-adaptive", &cp);
    cp.defer_until = defer;
    cp.observation_window = 32;
    int32_t seq = -1;
    EXPECT_OK(ctx, fg_seq_create(ctx, &cp, w->tokens, n, &seq));
    prefill_all(ctx, seq, w, n);
    float out[L * HQ * D];
    for (int32_t p = n; p <= defer; p++)
        EXPECT_OK(ctx, decode_at(ctx, seq, w, p, out));
    /* compressed before the step at position defer: its budget and floor,
       then that step's row */
    const int64_t units = L * HKV, budget = (int64_t)ceil((double)cp.budget * units * defer);
    const int32_t floor_rows = (int32_t)floor((double)cp.alloc_floor * (double)budget / units);
    int32_t least = 0;
    const int64_t kept = rows_kept(ctx, seq, &least);
    EXPECT(kept <= budget + units && kept < units * (defer + 1), "%s: %lld rows kept, budget %lld", name,
           (long long)kept, (long long)budget);
    EXPECT(least >= floor_rows, "%s: a head keeps %d rows, below the floor's %d", name, (int)least, (int)floor_rows);
    fg_context_destroy(&ctx);
    free(w);
    alarm(0);
}

/* ---------------------------------------------------------------- 2. budget */

static void budget_poisoned(fg_dtype dtype, int in_q, float value) {
    char name[96];
    snprintf(name, sizeof name, "%s fastgen-budget %s %s %g", g_backend, fg_dtype_name(dtype), in_q ? "q" : "k",
             (double)value);
    start_case(name, 60);
    const int32_t n = 64;
    world *w = malloc(sizeof *w);
    *w = g_w;
    for (int32_t l = 0; l < L; l++) {
        if (in_q)
            w->q[l][20][1][3] = value;
        else
            w->k[l][20][0][3] = value;
    }
    fg_context *ctx = make_context(dtype, 1, MAXT);
    fg_compression_params cp;
    fg_compression_params_preset("fastgen-budget", &cp);
    int32_t seq = -1;
    EXPECT_OK(ctx, fg_seq_create(ctx, &cp, w->tokens, n, &seq));
    prefill_all(ctx, seq, w, n);
    int32_t least = 0;
    const int64_t kept = rows_kept(ctx, seq, &least);
    EXPECT(kept <= (int64_t)ceil(cp.budget * L * HKV * n) + L * HKV, "%s: %lld rows kept of %d", name,
           (long long)kept, (int)(L * HKV * n));
    float out[L * HQ * D];
    EXPECT_OK(ctx, decode_at(ctx, seq, w, n, out));
    fg_context_destroy(&ctx);
    free(w);
    alarm(0);
}

/* ---------------------------------------------------------------- 3. append past defer_until */

static void append_chunk(fg_context *ctx, int32_t seq, const world *w, int32_t from, int32_t n) {
    static float out[MAXT * HQ * D];
    for (int32_t l = 0; l < L; l++)
        EXPECT_OK(ctx, fg_seq_append(ctx, seq, l, &w->tokens[from], n, &w->q[l][from][0][0], &w->k[l][from][0][0],
                                     &w->v[l][from][0][0], out));
}

static void adaptive_append(void) {
    start_case("adaptive append past defer_until", 60);
    const int32_t n = 20, defer = 48;
    fg_compression_params cp;
    fg_compression_params_preset("fastgen-adaptive", &cp);
    cp.defer_until = defer;
    cp.observation_window = 40;
    fg_context *ctx = make_context(FG_DTYPE_F32, 3, MAXT);
    int32_t by_append = -1, by_decode = -1, past = -1;
    EXPECT_OK(ctx, fg_seq_create(ctx, &cp, g_w.tokens, n, &by_append));
    EXPECT_OK(ctx, fg_seq_create(ctx, &cp, g_w.tokens, n, &by_decode));
    EXPECT_OK(ctx, fg_seq_create(ctx, &cp, g_w.tokens, n, &past));
    prefill_all(ctx, by_append, &g_w, n);
    prefill_all(ctx, by_decode, &g_w, n);
    prefill_all(ctx, past, &g_w, n);
    append_chunk(ctx, by_append, &g_w, n, defer - n); /* ends at defer_until */
    float out[L * HQ * D];
    for (int32_t p = n; p < defer; p++)
        EXPECT_OK(ctx, decode_at(ctx, by_decode, &g_w, p, out));
    append_chunk(ctx, past, &g_w, n, 30);          /* carried past it */
    append_chunk(ctx, past, &g_w, n + 30, 20);
    /* the decoded one compresses before its next step: both take it */
    EXPECT_OK(ctx, decode_at(ctx, by_decode, &g_w, defer, out));
    EXPECT_OK(ctx, decode_at(ctx, by_append, &g_w, defer, out));
    int32_t least = 0;
    const int64_t kept_append = rows_kept(ctx, by_append, &least), kept_decode = rows_kept(ctx, by_decode, &least);
    const int64_t kept_past = rows_kept(ctx, past, &least);
    EXPECT(kept_append == kept_decode, "append to defer_until keeps %lld rows, decoding %lld", (long long)kept_append,
           (long long)kept_decode);
    EXPECT(kept_append <= (int64_t)ceil(cp.budget * L * HKV * defer) + L * HKV,
           "append to defer_until: %lld of %d rows kept", (long long)kept_append, (int)(L * HKV * (defer + 1)));
    EXPECT(kept_past <= (int64_t)ceil(cp.budget * L * HKV * (n + 50)),
           "append past defer_until: %lld of %d rows kept", (long long)kept_past, (int)(L * HKV * (n + 50)));
    for (int32_t l = 0; l < L; l++)
        for (int32_t g = 0; g < HKV; g++) {
            int32_t a[MAXT], b[MAXT], na = 0, nb = 0;
            EXPECT_OK(ctx, fg_head_positions(ctx, by_append, l, g, a, MAXT, &na));
            EXPECT_OK(ctx, fg_head_positions(ctx, by_decode, l, g, b, MAXT, &nb));
            EXPECT(na == nb && !memcmp(a, b, (size_t)na * sizeof *a),
                   "layer %d head %d: append and decode keep different rows (%d, %d)", (int)l, (int)g, (int)na,
                   (int)nb);
        }
    fg_context_destroy(&ctx);

    /* defer_until beyond max_seq_len could never fire */
    ctx = make_context(FG_DTYPE_F32, 1, 64);
    cp.defer_until = 65;
    cp.observation_window = 64; /* the rows from the prompt to defer_until fit */
    int32_t seq = -1;
    EXPECT_STATUS(ctx, FG_ERR_INVALID_ARGUMENT, fg_seq_create(ctx, &cp, g_w.tokens, 8, &seq));
    EXPECT(strstr(fg_last_error(ctx), "max_seq_len") != NULL, "the message says why: %s", fg_last_error(ctx));
    fg_context_destroy(&ctx);
    fg_context_params p = test_context_params(g_backend, L, HQ, HKV, D);
    p.max_seq_len = 64;
    p.classes = g_classes;
    EXPECT_OK(NULL, fg_context_create(&p, &ctx));
    fg_compression_params before;
    fg_compression_params_preset("h2o", &before);
    EXPECT_OK(ctx, fg_context_set_compression(ctx, &before));
    EXPECT_STATUS(ctx, FG_ERR_INVALID_ARGUMENT, fg_context_set_compression(ctx, &cp));
    EXPECT(strstr(fg_last_error(ctx), "max_seq_len") != NULL, "the context's default is refused too: %s",
           fg_last_error(ctx));
    /* and the refusal left the default as it was: a sequence created without its own is h2o's */
    EXPECT_OK(ctx, fg_seq_create(ctx, NULL, g_w.tokens, 8, &seq));
    fg_context_destroy(&ctx);
    alarm(0);
}

/* ---------------------------------------------------------------- 4, 5. pools */

/* Calls and tasks outside [0, n) per thread, each on a cache line of its own. */
typedef struct count_job {
    struct {
        _Alignas(64) int64_t calls, bad;
    } per[2];
    int32_t n;
} count_job;

static void count_task(void *arg, int32_t task, int32_t thread) {
    count_job *j = arg;
    j->per[thread].bad += task < 0 || task >= j->n;
    j->per[thread].calls++;
}

typedef struct nested {
    fg_threadpool *a, *b;
    _Atomic int32_t refused, ran;
    fg_context *ctx; /* a context on pool A */
    _Atomic int32_t ctx_refused;
} nested;

static void inner_a(void *arg, int32_t task, int32_t thread) {
    (void)task;
    (void)thread;
    atomic_fetch_add(&((nested *)arg)->ran, 1);
}

static void task_of_b(void *arg, int32_t task, int32_t thread) {
    nested *x = arg;
    (void)task;
    (void)thread;
    if (fg_threadpool_run(x->a, 4, inner_a, x) == FG_ERR_BAD_STATE && strstr(fg_last_error(NULL), "another pool"))
        atomic_fetch_add(&x->refused, 1);
    /* a call on a context whose pool is A would have every run of A refused: refused at its entry */
    fg_memory_stats m;
    if (fg_memory(x->ctx, -1, &m) == FG_ERR_BAD_STATE && strstr(fg_last_error(NULL), "through another pool"))
        atomic_fetch_add(&x->ctx_refused, 1);
}

static void task_of_a(void *arg, int32_t task, int32_t thread) {
    nested *x = arg;
    (void)task;
    (void)thread;
    fg_threadpool_run(x->b, 2, task_of_b, x);
    fg_threadpool_run(x->a, 3, inner_a, x); /* its own pool: inline */
}

static void pools(void) {
    start_case("fg_threadpool_run with INT32_MAX tasks", 120);
    fg_threadpool *a = NULL, *b = NULL;
    EXPECT_OK(NULL, fg_threadpool_create(2, &a));
    EXPECT_OK(NULL, fg_threadpool_create(2, &b));
    static count_job cj;
    cj.n = INT32_MAX;
    if (FG_TEST_SANITIZED) { /* 2^31 calls: 7 s plain, most of a minute instrumented */
        printf("INT32_MAX tasks: run by the plain build, not under the sanitizers\n");
    } else {
        EXPECT_OK(NULL, fg_threadpool_run(a, INT32_MAX, count_task, &cj));
        EXPECT(cj.per[0].bad + cj.per[1].bad == 0 && cj.per[0].calls + cj.per[1].calls == INT32_MAX,
               "INT32_MAX tasks: %lld outside [0, n), %lld calls", (long long)(cj.per[0].bad + cj.per[1].bad),
               (long long)(cj.per[0].calls + cj.per[1].calls));
    }
    EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_threadpool_run(a, -1, count_task, &cj));

    start_case("nested pools: A's task runs B, whose task runs A", 30);
    fg_context_params cp = test_context_params("cpu", L, HQ, HKV, D);
    cp.threadpool = a;
    cp.n_threads = 0;
    cp.classes = g_classes;
    nested x = {a, b, 0, 0, NULL, 0};
    EXPECT_OK(NULL, fg_context_create(&cp, &x.ctx));
    EXPECT_OK(NULL, fg_threadpool_run(a, 2, task_of_a, &x));
    EXPECT(atomic_load(&x.refused) == 4, "%d of 4 runs of A from B's tasks refused", (int)atomic_load(&x.refused));
    EXPECT(atomic_load(&x.ran) == 6, "A inside A ran %d of 6 tasks inline", (int)atomic_load(&x.ran));
    EXPECT(atomic_load(&x.ctx_refused) == 4, "%d of 4 calls on A's context from B's tasks refused",
           (int)atomic_load(&x.ctx_refused));
    fg_memory_stats m;
    EXPECT_OK(x.ctx, fg_memory(x.ctx, -1, &m)); /* and from outside every job, it works */
    fg_context_destroy(&x.ctx);
    fg_threadpool_destroy(&a);
    fg_threadpool_destroy(&b);
    alarm(0);
}

/* ---------------------------------------------------------------- 7. forks */

static void fork_walk(void) {
    start_case("forks: held against alone after every call", 120);
    fg_compression_params cp;
    fg_compression_params_preset("h2o", &cp);
    cp.shortlist[0].ratio_local = 0.1f;
    cp.shortlist[0].ratio_frequent = 0.1f;
    enum { SEQS = 4 };
    fg_context *ctx = make_context(FG_DTYPE_F16, SEQS, MAXT);
    int32_t live[SEQS], len[SEQS], n_live = 0, violations = 0, checks = 0;
    float out[L * HQ * D];
    for (int32_t it = 0; it < 600; it++) {
        const int32_t op = rng_int(0, 9);
        if (n_live == 0) {
            const int32_t n = rng_int(8, 40);
            EXPECT_OK(ctx, fg_seq_create(ctx, &cp, g_w.tokens, n, &live[0]));
            prefill_all(ctx, live[0], &g_w, n);
            len[0] = n;
            n_live = 1;
        } else if (op < 6) { /* a step of one sequence */
            const int32_t i = rng_int(0, n_live - 1);
            if (len[i] >= MAXT - 1)
                continue;
            world *w = &g_w;
            EXPECT_OK(ctx, decode_at(ctx, live[i], w, len[i], out));
            len[i]++;
        } else if (op < 8 && n_live < SEQS) {
            const int32_t i = rng_int(0, n_live - 1);
            EXPECT_OK(ctx, fg_seq_fork(ctx, live[i], &live[n_live]));
            len[n_live++] = len[i];
        } else {
            const int32_t i = rng_int(0, n_live - 1);
            EXPECT_OK(ctx, fg_seq_destroy(ctx, live[i]));
            live[i] = live[n_live - 1];
            len[i] = len[n_live - 1];
            n_live--;
        }
        fg_memory_stats m;
        EXPECT_OK(ctx, fg_memory(ctx, -1, &m));
        violations += m.kv_bytes_held > m.kv_bytes_alone;
        checks++;
        if (m.kv_bytes_held > m.kv_bytes_alone && violations == 1)
            printf("step %d (op %d): %zu bytes held, %zu apart\n", (int)it, (int)op, m.kv_bytes_held,
                   m.kv_bytes_alone);
    }
    EXPECT(violations == 0, "forks held more than apart after %d of %d calls", (int)violations, (int)checks);
    fg_context_destroy(&ctx);
    alarm(0);
}

/* ---------------------------------------------------------------- 4. ranks of non-finite attention */

/* `method` on ref and cpu over the same poisoned sequence: a key of -inf
 * lanes in the prompt and in a decoded token (kind 0), or a NaN in a decode
 * step's query (kind 1):
 * NaN scores, which every backend ranks by one rule (a NaN rank as -inf,
 * the older first: common/rules.h), so both keep the same rows at every step. */
static void nonfinite_ranks(const char *method, int kind) {
    char name[96];
    snprintf(name, sizeof name, "%s: ref and cpu keep the same rows after %s", method,
             kind ? "a NaN query" : "a -inf key");
    start_case(name, 60);
    const int32_t n = 40, steps = 12;
    world *w = malloc(sizeof *w);
    *w = g_w;
    for (int32_t l = 0; l < L; l++) {
        if (kind)
            w->q[l][n + 2][1][0] = NAN;
        else /* in the prompt and in a decoded token (which attends itself) */
            for (int32_t x = 0; x < D; x += 2)
                w->k[l][9][0][x] = w->k[l][n + 1][0][x] = -INFINITY;
    }
    const char *saved = g_backend;
    fg_context *ctx[2];
    int32_t seq[2];
    float out[L * HQ * D];
    for (int b = 0; b < 2; b++) {
        g_backend = b ? "cpu" : "ref";
        ctx[b] = make_context(FG_DTYPE_F32, 1, MAXT);
        fg_compression_params cp;
        EXPECT_OK(NULL, fg_compression_params_preset(method, &cp));
        EXPECT_OK(ctx[b], fg_seq_create(ctx[b], &cp, w->tokens, n, &seq[b]));
        prefill_all(ctx[b], seq[b], w, n);
    }
    g_backend = saved;
    int same = 1, nan_out = 0;
    for (int32_t p = n; p < n + steps; p++)
        for (int b = 0; b < 2; b++) {
            EXPECT_OK(ctx[b], decode_at(ctx[b], seq[b], w, p, out));
            for (size_t i = 0; i < sizeof out / sizeof out[0]; i++)
                nan_out |= isnan(out[i]);
            if (b == 0)
                continue;
            for (int32_t l = 0; l < L; l++)
                for (int32_t g = 0; g < HKV; g++) {
                    int32_t pa[MAXT], pb[MAXT], na = 0, nb = 0;
                    EXPECT_OK(ctx[0], fg_head_positions(ctx[0], seq[0], l, g, pa, MAXT, &na));
                    EXPECT_OK(ctx[1], fg_head_positions(ctx[1], seq[1], l, g, pb, MAXT, &nb));
                    if (na != nb || memcmp(pa, pb, (size_t)na * sizeof *pa)) {
                        if (same)
                            printf("  %s: position %d, layer %d, head %d: ref keeps %d rows, cpu %d (or others)\n",
                                   name, (int)p, (int)l, (int)g, (int)na, (int)nb);
                        same = 0;
                    }
                }
        }
    EXPECT(same, "%s: the kept rows differ", name);
    EXPECT(nan_out, "%s: no output was NaN (the poison did not reach the attention)", name);
    for (int b = 0; b < 2; b++)
        fg_context_destroy(&ctx[b]);
    free(w);
    alarm(0);
}

/* ---------------------------------------------------------------- driver */

static void run(const char *backend) {
    g_backend = backend;
    const float hostile[] = {1e20f, 1e30f, NAN, INFINITY, -INFINITY, 3.4e38f, 1e-45f};
    for (int dt = 0; dt < 2; dt++) {
        const fg_dtype dtype = dt ? FG_DTYPE_BF16 : FG_DTYPE_F32;
        for (size_t i = 0; i < sizeof hostile / sizeof hostile[0]; i++)
            adaptive_poisoned(dtype, POISON_KEY, hostile[i]);
        for (size_t i = 0; i < sizeof hostile / sizeof hostile[0]; i++)
            adaptive_poisoned(dtype, POISON_VALUE, hostile[i]);
        adaptive_poisoned(dtype, POISON_ALL_Q, NAN);
    }
    const fg_dtype all[] = {FG_DTYPE_F32, FG_DTYPE_F16, FG_DTYPE_BF16, FG_DTYPE_Q8_0, FG_DTYPE_Q4_0};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        for (int in_q = 0; in_q < 2; in_q++) {
            budget_poisoned(all[i], in_q, NAN);
            budget_poisoned(all[i], in_q, INFINITY);
        }
    adaptive_append();
    fork_walk();
}

int main(int argc, char **argv) {
    signal(SIGALRM, on_alarm);
    test_seed("test_hostile");
    make_world();
    fg_token_classes_create(VOCAB, NULL, &g_classes);
    fg_token_classes_set(g_classes, 5, FG_TOKEN_PUNCT);
    fg_token_classes_set(g_classes, 6, FG_TOKEN_SPECIAL);
    pools();
    if (fg_backend_probe("cpu") == FG_OK) {
        const char *methods[] = {"tova", "h2o", "fastgen", "fastgen-adaptive"};
        for (size_t m = 0; m < sizeof methods / sizeof methods[0]; m++)
            for (int kind = 0; kind < 2; kind++)
                nonfinite_ranks(methods[m], kind);
    }
    const int rc = test_each_backend(argc, argv, run);
    fg_token_classes_destroy(&g_classes);
    return rc;
}
