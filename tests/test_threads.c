/*
 * Concurrency: several contexts, each driven from its own thread, give the
 * same bits as the same work done one context after another. Each job is a
 * whole life: create, prompts with mixed policies, prefill, batched decode,
 * inspect, destroy. Error messages are per thread (fg_last_error(NULL)) and
 * per context. The thread pool alone: every task once, thread numbers in
 * range, nested jobs inline, callers on several threads sharing one pool, a
 * pool shared by contexts. One context driven from two threads at once:
 * each call does its work or is refused. CI also runs this under ThreadSanitizer (see .ci/run).
 * Usage: test_threads [BACKEND...]   (default: ref cpu)
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fastgen.h"
#include "tests/support/harness.h"
#include "tools/synth.h"

enum { L = 2, HKV = 2, G = 2, HQ = G * HKV, D = 32, N = 48, STEPS = 40, SEQS = 2, JOBS = 4, REPEATS = 2 };

typedef struct job {
    const char *backend;
    int index;
    fg_dtype dtype;
    float *out;   /* every output the job produced, in order */
    size_t n_out; /* floats written */
    int32_t kept[SEQS * L * HKV];
    fg_status status;
    char error[512];
} job;

#define OUT_FLOATS ((size_t)SEQS * L * (N + STEPS) * HQ * D)

static void *run_job(void *arg) {
    job *j = arg;
    j->n_out = 0;
    j->status = FG_OK;
    synth syn;
    fg_status st = synth_create(L, HQ, HKV, D, 100 + (uint64_t)j->index, &syn);
    fg_context *ctx = NULL;
    if (st == FG_OK) {
        fg_context_params p = test_context_params(j->backend, L, HQ, HKV, D);
        p.kv_dtype = j->dtype;
        p.max_seqs = SEQS;
        p.max_seq_len = N + STEPS;
        p.page_tokens = 8;
        p.n_threads = 1 + j->index % 2; /* thread pools inside concurrent callers, too */
        p.classes = syn.classes;
        st = fg_context_create(&p, &ctx);
    }
    /* a refused call: its message is this thread's own */
    fg_context_params bad;
    fg_context_params_default(&bad);
    bad.n_layers = -(1000 + j->index);
    fg_context *none = NULL;
    char want[32];
    snprintf(want, sizeof want, "%d", 1000 + j->index);
    if (st == FG_OK && (fg_context_create(&bad, &none) == FG_OK || !strstr(fg_last_error(NULL), want)))
        st = FG_ERR_INTERNAL;

    const char *presets[SEQS] = {"fastgen", "h2o"};
    int32_t tokens[SEQS][N + STEPS], seqs[SEQS];
    static _Thread_local float q[(N + STEPS) * HQ * D], k[(N + STEPS) * HKV * D], v[(N + STEPS) * HKV * D];
    for (int32_t s = 0; s < SEQS && st == FG_OK; s++) {
        for (int32_t t = 0; t < N + STEPS; t++)
            tokens[s][t] = synth_token(&syn, t + 17 * s + j->index);
        fg_compression_params cp;
        fg_compression_params_preset(presets[s], &cp);
        st = fg_seq_create(ctx, &cp, tokens[s], N - 5 * s, &seqs[s]);
        for (int32_t l = 0; l < L && st == FG_OK; l++) {
            synth_qkv(&syn, l, tokens[s], 0, N - 5 * s, q, k, v);
            st = fg_prefill(ctx, seqs[s], l, q, k, v, j->out + j->n_out);
            j->n_out += (size_t)(N - 5 * s) * HQ * D;
        }
    }
    for (int32_t step = 0; step < STEPS && st == FG_OK; step++)
        for (int32_t l = 0; l < L && st == FG_OK; l++) {
            int32_t toks[SEQS];
            for (int32_t s = 0; s < SEQS; s++) {
                const int32_t pos = N - 5 * s + step;
                toks[s] = tokens[s][pos];
                synth_qkv(&syn, l, &toks[s], pos, 1, q + (size_t)s * HQ * D, k + (size_t)s * HKV * D,
                             v + (size_t)s * HKV * D);
            }
            st = fg_decode(ctx, l, SEQS, seqs, toks, q, k, v, j->out + j->n_out);
            j->n_out += (size_t)SEQS * HQ * D;
        }
    for (int32_t s = 0; s < SEQS && st == FG_OK; s++)
        for (int32_t l = 0; l < L && st == FG_OK; l++)
            for (int32_t g = 0; g < HKV && st == FG_OK; g++) {
                fg_head_info info;
                st = fg_head_inspect(ctx, seqs[s], l, g, &info);
                j->kept[(s * L + l) * HKV + g] = info.kept;
            }
    if (st)
        snprintf(j->error, sizeof j->error, "%s", ctx ? fg_last_error(ctx) : fg_last_error(NULL));
    j->status = st;
    fg_context_destroy(&ctx);
    synth_destroy(&syn);
    return NULL;
}

/* ---- the thread pool alone */

/* A decode step long enough to run on the pool (FG_CPU_PAR_ROWS), full, h2o
 * and tova heads (score tracking: a head finishes on the thread that ends its
 * last chunk; tova's, a layer's heads ranked together, on the thread that
 * scores the layer's last one), on a context of `pool` or serially (pool
 * NULL, n_threads 1): its outputs and kept counts, appended to out. */
enum { LONG_N = 2100, LONG_STEPS = 6, LONG_SEQS = 3 };

static size_t long_decode(const synth *syn, fg_threadpool *pool, float *out) {
    fg_context_params p = test_context_params("cpu", 1, HQ, HKV, D);
    p.max_seqs = LONG_SEQS;
    p.max_seq_len = LONG_N + LONG_STEPS;
    p.classes = syn->classes;
    p.threadpool = pool;
    p.n_threads = pool ? 0 : 1;
    fg_context *ctx = NULL;
    EXPECT(fg_context_create(&p, &ctx) == FG_OK, "long context: %s", fg_last_error(NULL));
    static int32_t tokens[LONG_N + LONG_STEPS];
    static float q[LONG_N * HQ * D], k[LONG_N * HKV * D], v[LONG_N * HKV * D], o[LONG_N * HQ * D];
    for (int32_t t = 0; t < LONG_N + LONG_STEPS; t++)
        tokens[t] = synth_token(syn, t);
    const char *presets[LONG_SEQS] = {"full", "h2o", "tova"};
    int32_t seqs[LONG_SEQS];
    size_t n = 0;
    for (int s = 0; s < LONG_SEQS; s++) {
        fg_compression_params cp;
        fg_compression_params_preset(presets[s], &cp);
        EXPECT(fg_seq_create(ctx, &cp, tokens, LONG_N, &seqs[s]) == FG_OK, "long seq");
        synth_qkv(syn, 0, tokens, 0, LONG_N, q, k, v);
        EXPECT(fg_prefill(ctx, seqs[s], 0, q, k, v, o) == FG_OK, "long prefill: %s", fg_last_error(ctx));
    }
    for (int32_t step = 0; step < LONG_STEPS; step++) {
        int32_t toks[LONG_SEQS];
        for (int s = 0; s < LONG_SEQS; s++)
            toks[s] = tokens[LONG_N + step];
        for (int s = 0; s < LONG_SEQS; s++)
            synth_qkv(syn, 0, &toks[s], LONG_N + step, 1, q + (size_t)s * HQ * D, k + (size_t)s * HKV * D,
                         v + (size_t)s * HKV * D);
        EXPECT(fg_decode(ctx, 0, LONG_SEQS, seqs, toks, q, k, v, out + n) == FG_OK, "long decode: %s",
               fg_last_error(ctx));
        n += (size_t)LONG_SEQS * HQ * D;
    }
    for (int s = 0; s < LONG_SEQS; s++)
        for (int32_t g = 0; g < HKV; g++) {
            fg_head_info info;
            fg_head_inspect(ctx, seqs[s], 0, g, &info);
            out[n++] = (float)info.kept;
        }
    fg_context_destroy(&ctx);
    return n;
}

enum { POOL_TASKS = 997, POOL_CALLERS = 4, POOL_JOBS = 60 };

typedef struct pool_job {
    fg_threadpool *pool;
    _Atomic int hits[POOL_TASKS];
    _Atomic int bad_thread, nested_bad;
    int nested;
} pool_job;

static void serial_task(void *arg, int32_t task, int32_t thread) {
    pool_job *j = arg;
    (void)task;
    if (thread != 0)
        atomic_store(&j->nested_bad, 1);
}

typedef struct nested_arg {
    pool_job *outer;
    int32_t thread;
} nested_arg;

static void nested_task(void *arg, int32_t task, int32_t thread) {
    nested_arg *n = arg;
    (void)task;
    if (thread != n->thread) /* a job inside a task runs inline, as the thread that runs the task */
        atomic_store(&n->outer->nested_bad, 1);
}

static void count_task(void *arg, int32_t task, int32_t thread) {
    pool_job *j = arg;
    atomic_fetch_add(&j->hits[task], 1);
    if (thread < 0 || thread >= fg_threadpool_size(j->pool))
        atomic_store(&j->bad_thread, 1);
    if (j->nested && task % 97 == 0) {
        nested_arg n = {j, thread};
        fg_threadpool_run(j->pool, 5, nested_task, &n);
    }
}

static void *caller_main(void *arg) {
    pool_job *j = arg;
    for (int r = 0; r < POOL_JOBS; r++)
        fg_threadpool_run(j->pool, POOL_TASKS, count_task, j);
    return NULL;
}

static void test_pool(const char *spin) {
    setenv("FASTGEN_SPIN_US", spin, 1); /* read when a pool is created */
    fg_threadpool *pool = NULL;
    EXPECT(fg_threadpool_create(-1, &pool) == FG_ERR_INVALID_ARGUMENT && !pool, "n_threads -1 is refused");
    EXPECT(strstr(fg_last_error(NULL), "n_threads") != NULL, "the message says why: %s", fg_last_error(NULL));
    EXPECT(fg_threadpool_create(FG_MAX_THREADS + 1, &pool) == FG_ERR_INVALID_ARGUMENT, "too many threads refused");
    EXPECT(fg_threadpool_create(0, &pool) == FG_OK && fg_threadpool_size(pool) == fg_default_threads() &&
               fg_default_threads() >= 1, "n_threads 0: the CPUs this process may use (%d)", fg_default_threads());
    fg_threadpool_destroy(&pool);
    EXPECT(pool == NULL, "destroy clears the handle");
    fg_threadpool_destroy(&pool); /* twice: nothing */
    EXPECT(fg_threadpool_size(NULL) == 1, "a NULL pool is one thread");

    EXPECT(fg_threadpool_create(3, &pool) == FG_OK && fg_threadpool_size(pool) == 3, "a pool of 3");
    static pool_job j;
    memset(&j, 0, sizeof j);
    j.pool = pool;
    j.nested = 1;
    fg_threadpool_run(pool, POOL_TASKS, count_task, &j);
    int once = 1;
    for (int t = 0; t < POOL_TASKS; t++)
        once &= atomic_load(&j.hits[t]) == 1;
    EXPECT(once, "spin %s: every task of a job runs once", spin);
    EXPECT(!atomic_load(&j.bad_thread) && !atomic_load(&j.nested_bad), "thread numbers in range; nested jobs inline");

    /* several application threads share the pool: their jobs take turns */
    memset(&j, 0, sizeof j);
    j.pool = pool;
    pthread_t th[POOL_CALLERS];
    for (int i = 0; i < POOL_CALLERS; i++)
        EXPECT(pthread_create(&th[i], NULL, caller_main, &j) == 0, "pthread_create");
    for (int i = 0; i < POOL_CALLERS; i++)
        pthread_join(th[i], NULL);
    int all = 1;
    for (int t = 0; t < POOL_TASKS; t++)
        all &= atomic_load(&j.hits[t]) == POOL_CALLERS * POOL_JOBS;
    EXPECT(all && !atomic_load(&j.bad_thread), "spin %s: %d callers x %d jobs, every task each time", spin,
           POOL_CALLERS, POOL_JOBS);
    fg_threadpool_run(pool, 0, count_task, &j); /* no tasks: nothing */
    fg_threadpool_run(NULL, 3, serial_task, &j); /* no pool: serially, as thread 0 */
    EXPECT(!atomic_load(&j.nested_bad), "a NULL pool runs serially");

    /* contexts that share the pool; n_threads must agree with it */
    synth syn;
    EXPECT(synth_create(L, HQ, HKV, D, 7, &syn) == FG_OK, "synthetic workload");
    fg_context_params p = test_context_params("cpu", L, HQ, HKV, D);
    p.classes = syn.classes;
    p.threadpool = pool;
    p.n_threads = 2;
    fg_context *ctx = NULL;
    EXPECT(fg_context_create(&p, &ctx) == FG_ERR_INVALID_ARGUMENT && strstr(fg_last_error(NULL), "threadpool"),
           "n_threads other than the shared pool's size is refused: %s", fg_last_error(NULL));
    p.n_threads = 0;
    fg_context *c2 = NULL;
    EXPECT(fg_context_create(&p, &ctx) == FG_OK && fg_context_create(&p, &c2) == FG_OK, "two contexts, one pool");
    fg_context_destroy(&ctx);
    fg_context_destroy(&c2);
    static float on_pool[LONG_STEPS * LONG_SEQS * HQ * D + LONG_SEQS * HKV],
        serial[LONG_STEPS * LONG_SEQS * HQ * D + LONG_SEQS * HKV];
    const size_t n = long_decode(&syn, pool, on_pool);
    EXPECT(n == long_decode(&syn, NULL, serial) && memcmp(on_pool, serial, n * sizeof(float)) == 0,
           "spin %s: decode steps of %d rows on 3 threads equal the serial ones bit for bit", spin, LONG_SEQS * LONG_N);
    synth_destroy(&syn);
    fg_threadpool_destroy(&pool);
}

/* ---- one context, two threads at once: each call does its work or is
 * refused with FG_ERR_BAD_STATE (its message in fg_last_error(NULL)); a
 * thread that retries until its call is taken gets a serial run's bits */

enum { RACE_N = 40, RACE_STEPS = 40 };

typedef struct racer {
    fg_context *ctx;
    const synth *syn;
    int32_t seq, n;
    float *out;     /* [RACE_STEPS][L][HQ * D] */
    int32_t refused, wrong;
    fg_status failed;
} racer;

static void *race(void *arg) {
    racer *r = arg;
    float q[HQ * D], k[HKV * D], v[HKV * D];
    for (int32_t s = 0; s < RACE_STEPS; s++)
        for (int32_t l = 0; l < L; l++) {
            const int32_t p = r->n + s, tok = synth_token(r->syn, p);
            synth_qkv(r->syn, l, &tok, p, 1, q, k, v);
            for (;;) {
                const fg_status st =
                    fg_decode(r->ctx, l, 1, &r->seq, &tok, q, k, v, r->out + ((size_t)s * L + l) * HQ * D);
                if (st == FG_OK)
                    break;
                if (st != FG_ERR_BAD_STATE) {
                    r->failed = st;
                    return NULL;
                }
                r->refused++;
                r->wrong += strstr(fg_last_error(NULL), "another thread") == NULL;
                fg_memory_stats m; /* a reading call is taken or refused alike */
                const fg_status sm = fg_memory(r->ctx, r->seq, &m);
                r->wrong += sm != FG_OK && sm != FG_ERR_BAD_STATE;
            }
        }
    return NULL;
}

static void shared_context(const char *backend) {
    synth syn;
    EXPECT(synth_create(L, HQ, HKV, D, 7, &syn) == FG_OK, "synth");
    fg_context *ctx[2] = {NULL, NULL}; /* [0]: two threads at once; [1]: one after the other */
    racer r[2][2];
    float *outs = malloc((size_t)4 * RACE_STEPS * L * HQ * D * sizeof(float));
    for (int c = 0; c < 2; c++) {
        fg_context_params p = test_context_params(backend, L, HQ, HKV, D);
        p.max_seqs = 2;
        p.max_seq_len = RACE_N + 8 + RACE_STEPS;
        p.classes = syn.classes;
        EXPECT_OK(NULL, fg_context_create(&p, &ctx[c]));
        fg_compression_params cp;
        fg_compression_params_preset("h2o", &cp);
        for (int i = 0; i < 2; i++) {
            const int32_t n = RACE_N + 8 * i;
            int32_t *tokens = malloc((size_t)n * sizeof *tokens);
            float *q = malloc((size_t)n * HQ * D * sizeof *q), *k = malloc((size_t)n * HKV * D * sizeof *k);
            float *v = malloc((size_t)n * HKV * D * sizeof *v), *o = malloc((size_t)n * HQ * D * sizeof *o);
            for (int32_t t = 0; t < n; t++)
                tokens[t] = synth_token(&syn, t);
            r[c][i] = (racer){.ctx = ctx[c], .syn = &syn, .n = n, .out = outs + (size_t)(2 * c + i) * RACE_STEPS * L * HQ * D};
            EXPECT_OK(ctx[c], fg_seq_create(ctx[c], &cp, tokens, n, &r[c][i].seq));
            for (int32_t l = 0; l < L; l++) {
                synth_qkv(&syn, l, tokens, 0, n, q, k, v);
                EXPECT_OK(ctx[c], fg_prefill(ctx[c], r[c][i].seq, l, q, k, v, o));
            }
            free(tokens);
            free(q);
            free(k);
            free(v);
            free(o);
        }
    }
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        EXPECT(pthread_create(&th[i], NULL, race, &r[0][i]) == 0, "pthread_create");
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < 2; i++)
        race(&r[1][i]);
    for (int i = 0; i < 2; i++) {
        EXPECT(r[0][i].failed == FG_OK, "%s thread %d: a decode failed: %s", backend, i,
               fg_status_string(r[0][i].failed));
        EXPECT(r[0][i].wrong == 0, "%s thread %d: %d refusals without their message", backend, i, (int)r[0][i].wrong);
        EXPECT(!memcmp(r[0][i].out, r[1][i].out, (size_t)RACE_STEPS * L * HQ * D * sizeof(float)),
               "%s thread %d: outputs differ from a serial run", backend, i);
    }
    printf("%s: one context, two threads: %d and %d calls refused while the other was inside one\n", backend,
           (int)r[0][0].refused, (int)r[0][1].refused);
    /* a failed call leaves its message; the next successful call clears it */
    int32_t len = 0;
    EXPECT_STATUS(ctx[0], FG_ERR_INVALID_ARGUMENT, fg_seq_length(ctx[0], 99, 0, &len));
    EXPECT_OK(ctx[0], fg_seq_length(ctx[0], r[0][0].seq, 0, &len));
    EXPECT(fg_last_error(ctx[0])[0] == '\0', "a successful call left \"%s\"", fg_last_error(ctx[0]));
    for (int c = 0; c < 2; c++)
        fg_context_destroy(&ctx[c]);
    free(outs);
    synth_destroy(&syn);
}

/* A lent pool (llama.cpp's graph threads): in each turn the lent threads
 * arrive early, late or not at all; every job runs every task once, the lent
 * threads take part when they come, and each returns at its turn's release. */
typedef struct lent_arg {
    fg_threadpool *pool;
    int32_t thread;
    int turns;
} lent_arg;

typedef struct lent_job {
    fg_threadpool *pool;
    _Atomic int hits[POOL_TASKS];
    _Atomic int by_lent;
} lent_job;

static void lent_task(void *arg, int32_t task, int32_t thread) {
    lent_job *j = arg;
    atomic_fetch_add(&j->hits[task], 1);
    if (thread > 0)
        atomic_fetch_add(&j->by_lent, 1);
    else if (task == 0) /* the caller held up: a lent thread that came takes tasks, however busy the machine */
        nanosleep(&(struct timespec){0, 1000000}, NULL);
}

static void *lent_main(void *varg) {
    lent_arg *a = varg;
    for (int t = 1; t <= a->turns; t++) {
        if ((t + a->thread) % 5 == 0)
            continue; /* this turn it does not come */
        if ((t + a->thread) % 3 == 0)
            nanosleep(&(struct timespec){0, 200000}, NULL); /* it comes late */
        fg_threadpool_lend(a->pool, a->thread, (uint64_t)t);
    }
    return NULL;
}

static void test_lent_pool(void) {
    enum { LENT = 3, TURNS = 60 };
    fg_threadpool *pool = NULL;
    EXPECT(fg_threadpool_create_lent(0, &pool) == FG_ERR_INVALID_ARGUMENT && !pool, "a lent pool of 0 refused");
    EXPECT(fg_threadpool_create_lent(LENT, &pool) == FG_OK && fg_threadpool_size(pool) == LENT, "lent pool");
    EXPECT(fg_threadpool_lend(pool, 0, 1) == FG_ERR_INVALID_ARGUMENT, "thread 0 is the caller's");
    EXPECT(fg_threadpool_lend(pool, LENT, 1) == FG_ERR_INVALID_ARGUMENT, "thread past the pool refused");
    EXPECT(fg_threadpool_lend(pool, 1, 0) == FG_ERR_INVALID_ARGUMENT, "ticket 0 refused");
    fg_threadpool *own = NULL;
    EXPECT(fg_threadpool_create(2, &own) == FG_OK, "pool");
    EXPECT(fg_threadpool_lend(own, 1, 1) == FG_ERR_INVALID_ARGUMENT, "lending to a pool of its own threads");
    fg_threadpool_destroy(&own);
    pthread_t th[LENT];
    lent_arg args[LENT];
    for (int i = 1; i < LENT; i++) {
        args[i] = (lent_arg){.pool = pool, .thread = i, .turns = TURNS};
        EXPECT(pthread_create(&th[i], NULL, lent_main, &args[i]) == 0, "pthread_create");
    }
    static lent_job lj;
    int all_once = 1, lent_worked = 0;
    for (int t = 1; t <= TURNS; t++) {
        for (int k = 0; k < 3; k++) { /* a turn runs several jobs, as a fastgen call does */
            for (int i = 0; i < POOL_TASKS; i++)
                atomic_store(&lj.hits[i], 0);
            atomic_store(&lj.by_lent, 0);
            lj.pool = pool;
            EXPECT(fg_threadpool_run(pool, POOL_TASKS, lent_task, &lj) == FG_OK, "lent pool job");
            for (int i = 0; i < POOL_TASKS; i++)
                all_once &= atomic_load(&lj.hits[i]) == 1;
            lent_worked |= atomic_load(&lj.by_lent) > 0;
        }
        EXPECT(fg_threadpool_release(pool, (uint64_t)t) == FG_OK, "release");
    }
    for (int i = 1; i < LENT; i++)
        pthread_join(th[i], NULL); /* each returned at its last turn's release: no hang */
    EXPECT(all_once, "every task of every job ran once on the lent pool");
    EXPECT(lent_worked, "the lent threads took tasks");
    fg_threadpool_destroy(&pool);
}

int main(int argc, char **argv) {
    test_seed("test_threads");
    test_pool("0");
    test_pool("100");
    test_lent_pool();
    const char *dflt[] = {"ref", "cpu"};
    const char **names = argc > 1 ? (const char **)argv + 1 : dflt;
    const int n_names = argc > 1 ? argc - 1 : 2;
    for (int b = 0; b < n_names; b++) {
        if (fg_backend_probe(names[b]) != FG_OK) {
            printf("%s: not tested: %s\n", names[b], fg_last_error(NULL));
            continue;
        }
        job serial[JOBS], threaded[JOBS];
        for (int i = 0; i < JOBS; i++) {
            serial[i] = (job){.backend = names[b], .index = i, .dtype = (fg_dtype)(i % 3)};
            serial[i].out = malloc(OUT_FLOATS * sizeof(float));
            run_job(&serial[i]);
            EXPECT(serial[i].status == FG_OK, "%s job %d alone: %s", names[b], i, serial[i].error);
        }
        int same = 1;
        for (int r = 0; r < REPEATS; r++) {
            pthread_t th[JOBS];
            for (int i = 0; i < JOBS; i++) {
                threaded[i] = serial[i];
                threaded[i].out = malloc(OUT_FLOATS * sizeof(float));
                EXPECT(pthread_create(&th[i], NULL, run_job, &threaded[i]) == 0, "pthread_create");
            }
            for (int i = 0; i < JOBS; i++)
                pthread_join(th[i], NULL);
            for (int i = 0; i < JOBS; i++) {
                EXPECT(threaded[i].status == FG_OK, "%s job %d in a thread: %s", names[b], i, threaded[i].error);
                same &= threaded[i].n_out == serial[i].n_out &&
                        memcmp(threaded[i].out, serial[i].out, serial[i].n_out * sizeof(float)) == 0 &&
                        memcmp(threaded[i].kept, serial[i].kept, sizeof serial[i].kept) == 0;
                free(threaded[i].out);
            }
        }
        EXPECT(same, "%s: %d contexts on %d threads differ from serial use", names[b], JOBS, JOBS);
        shared_context(names[b]);
        printf("%s: %d jobs x %d concurrent repeats, %zu output floats each: %s\n", names[b], JOBS, REPEATS,
               serial[0].n_out, same ? "bit-identical to serial" : "DIFFERENT");
        for (int i = 0; i < JOBS; i++)
            free(serial[i].out);
    }
    return test_finish();
}
