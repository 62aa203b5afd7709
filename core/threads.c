/*
 * The thread pool every CPU loop of the library (and of the model runner)
 * runs on: fg_threadpool in fastgen.h.
 *
 * A job is n_tasks calls of fn(arg, task, thread). The tasks are cut into
 * one contiguous range per thread (a matrix product's rows stay contiguous
 * per core, so one core's stream prefetcher does not fetch the rows of the
 * other's tasks); each thread takes the tasks of its own range one at a time
 * from that range's counter, then takes what is left of the others', so a
 * thread the OS has descheduled holds up at most the one task it is inside,
 * never a fixed share of the job. Between jobs a
 * worker spins for a short while (a decode step's jobs come microseconds
 * apart) and then sleeps on a condition variable, so that on a busy machine
 * no thread burns the time slice its partners need; the caller waits for
 * the last task the same way.
 *
 * Publication is a seqlock on `gen`: odd while the caller writes the job,
 * even once it may be read. A worker announces itself in `active` before it
 * reads the job and backs off when gen moved meanwhile; the caller writes
 * the next job only when `active` is zero. Sleeps and wake-ups pair a
 * sequentially consistent store with a load on each side (gen / sleepers,
 * the threads' done counts / caller_waiting), so a wake-up is never lost.
 */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "core/internal.h"

struct fg_threadpool {
    int32_t n_threads; /* the caller and n_threads - 1 workers */
    struct worker *workers;  /* [n_threads - 1] */
    int32_t n_started; /* workers running (they start at the first parallel job) */
    int64_t spin_ns;

    pthread_mutex_t run_mu; /* one job at a time */
    pthread_mutex_t mu;     /* sleeping and waking */
    pthread_cond_t wake, done;

    /* the job: written while gen is odd and active is zero */
    fg_task_fn fn;
    void *arg;

    _Atomic uint32_t gen;
    struct range *ranges;      /* [n_threads] the tasks of each thread, then of whoever takes them */
    int32_t n_ranges;          /* this job's: the threads running */
    int32_t n_tasks;           /* this job's */
    _Atomic int32_t active;    /* workers between reading the job and leaving it */
    _Atomic int32_t sleepers;
    _Atomic int32_t caller_waiting;
    _Atomic int32_t stop;
    int lent;                  /* fg_threadpool_create_lent: the workers are the engine's threads */
    _Atomic uint64_t released; /* lent: the last ticket fg_threadpool_release gave back */
    const struct nest *job_up; /* the jobs this job's caller is inside (workers chain their nodes to it; a
                                  pointer copied, never followed, by a worker that finds no task left) */
};

/* Tasks [next, end) of one thread's share, and the tasks that thread has
 * finished (of any share), on a cache line of its own: a thread counts its
 * own work where no other thread writes, and the job is done when the
 * counts add up to n_tasks. */
typedef struct range {
    _Alignas(64) _Atomic int64_t next; /* wide: each thread takes one past the end, which must not wrap */
    int32_t end;
    _Atomic int32_t done;
} range;

/* The jobs a thread is inside, innermost first: a node lives on the stack
 * of the caller that runs the job, and the job's workers take it up, so a
 * task always knows every pool that waits on it. */
typedef struct nest {
    const fg_threadpool *pool;
    int32_t thread;         /* this thread's number in that job (the innermost's only) */
    const struct nest *up;  /* the job that runs the caller of this one */
} nest;

static _Thread_local const nest *tls_nest;

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Spins until cond holds or p->spin_ns have passed (the clock read every 64 pauses). */
#define SPIN_UNTIL(p, cond)                                                                                            \
    do {                                                                                                               \
        int64_t spin_end_ = -1;                                                                                        \
        for (uint32_t spin_i_ = 1; !(cond); spin_i_++) {                                                               \
            cpu_relax();                                                                                               \
            if ((spin_i_ & 63) == 0) {                                                                                 \
                const int64_t t_ = fg_now_ns();                                                                        \
                if (spin_end_ < 0)                                                                                     \
                    spin_end_ = t_ + (p)->spin_ns;                                                                     \
                else if (t_ >= spin_end_)                                                                              \
                    break;                                                                                             \
            }                                                                                                          \
        }                                                                                                              \
    } while (0)

/* Tasks the threads of the job have finished. */
static int32_t finished(fg_threadpool *p) {
    int32_t n = 0;
    for (int32_t r = 0; r < p->n_ranges; r++)
        n += atomic_load(&p->ranges[r].done);
    return n;
}

static void take_tasks(fg_threadpool *p, int32_t thread) {
    const fg_task_fn fn = p->fn;
    void *arg = p->arg;
    const int32_t n_ranges = p->n_ranges;
    _Atomic int32_t *done = &p->ranges[thread].done;
    for (int32_t k = 0; k < n_ranges; k++) { /* its own range first, then the others' in turn */
        range *r = &p->ranges[(thread + k) % n_ranges];
        for (int64_t t; (t = atomic_fetch_add(&r->next, 1)) < r->end;) {
            fn(arg, (int32_t)t, thread);
            atomic_fetch_add(done, 1); /* each task counted as it ends: a thread descheduled between tasks
                                          holds up nobody once the others have taken the rest */
        }
    }
    if (atomic_load(&p->caller_waiting) && finished(p) == p->n_tasks) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_signal(&p->done);
        pthread_mutex_unlock(&p->mu);
    }
}

/* Done serving: the pool stops, or a lent thread's ticket was given back. */
static int leave(const fg_threadpool *p, uint64_t ticket) {
    return atomic_load(&p->stop) || (ticket && atomic_load(&p->released) >= ticket);
}

static int job_after(const fg_threadpool *p, uint32_t seen, uint64_t ticket) {
    const uint32_t g = atomic_load(&p->gen);
    return (g != seen && !(g & 1u)) || leave(p, ticket);
}

typedef struct worker {
    pthread_t thread;
    fg_threadpool *pool;
    int32_t id;
} worker;

/* Runs the pool's jobs as thread `id` until leave(): a worker's whole life,
 * or a lent thread's turn (ticket > 0). seen: the last job it ran. */
static void serve(fg_threadpool *p, int32_t id, uint32_t seen, uint64_t ticket) {
    for (;;) {
        SPIN_UNTIL(p, job_after(p, seen, ticket));
        if (!job_after(p, seen, ticket)) {
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->sleepers, 1);
            while (!job_after(p, seen, ticket))
                pthread_cond_wait(&p->wake, &p->mu);
            atomic_fetch_sub(&p->sleepers, 1);
            pthread_mutex_unlock(&p->mu);
        }
        if (leave(p, ticket))
            return;
        const uint32_t g = atomic_load(&p->gen);
        atomic_fetch_add(&p->active, 1);
        if (atomic_load(&p->gen) == g && !(g & 1u)) { /* the job did not change under us */
            const nest *outer = tls_nest;
            const nest here = {p, id, p->job_up};
            tls_nest = &here;
            take_tasks(p, id);
            tls_nest = outer;
            seen = g;
        }
        atomic_fetch_sub(&p->active, 1);
    }
}

static void *worker_main(void *varg) {
    const worker *w = varg;
    serve(w->pool, w->id, 0, 0);
    return NULL;
}

int32_t fg_default_threads(void) {
    int32_t n = 0;
#ifdef CPU_COUNT
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0)
        n = CPU_COUNT(&set);
#endif
    if (n <= 0) {
        const long online = sysconf(_SC_NPROCESSORS_ONLN);
        n = online > 0 ? (int32_t)online : 1;
    }
    return n < FG_MAX_THREADS ? n : FG_MAX_THREADS;
}

/* FASTGEN_SPIN_US: how long an idle thread spins before it sleeps (default 100). */
static int64_t spin_ns_from_env(void) {
    const char *s = getenv("FASTGEN_SPIN_US");
    if (s && *s) {
        char *end;
        const long us = strtol(s, &end, 10);
        if (!*end && us >= 0 && us <= 1000000)
            return (int64_t)us * 1000;
    }
    return 100 * 1000;
}

fg_status fg_threadpool_create(int32_t n_threads, fg_threadpool **out) {
    if (!out)
        return fg_error(NULL, FG_ERR_INVALID_ARGUMENT, "fg_threadpool_create: out is NULL");
    *out = NULL;
    if (n_threads < 0 || n_threads > FG_MAX_THREADS)
        return fg_error(NULL, FG_ERR_INVALID_ARGUMENT,
                        "fg_threadpool_create: n_threads must be in 0..%d (0 = the cores this process may run on), "
                        "got %d",
                        FG_MAX_THREADS, (int)n_threads);
    fg_threadpool *p = calloc(1, sizeof *p);
    if (!p)
        return fg_error(NULL, FG_ERR_OUT_OF_MEMORY, "fg_threadpool_create: out of memory");
    p->n_threads = n_threads > 0 ? n_threads : fg_default_threads();
    p->spin_ns = spin_ns_from_env();
    if (p->n_threads > 1) {
        p->workers = calloc((size_t)p->n_threads - 1, sizeof *p->workers);
        p->ranges = aligned_alloc(64, (size_t)p->n_threads * sizeof *p->ranges);
    }
    int ok = p->n_threads == 1 || (p->workers && p->ranges);
    ok = ok && pthread_mutex_init(&p->run_mu, NULL) == 0;
    ok = ok && pthread_mutex_init(&p->mu, NULL) == 0;
    ok = ok && pthread_cond_init(&p->wake, NULL) == 0;
    ok = ok && pthread_cond_init(&p->done, NULL) == 0;
    if (!ok) {
        free(p->workers);
        free(p->ranges);
        free(p);
        return fg_error(NULL, FG_ERR_OUT_OF_MEMORY, "fg_threadpool_create: out of memory");
    }
    *out = p;
    return FG_OK;
}

fg_status fg_threadpool_create_lent(int32_t n_threads, fg_threadpool **out) {
    if (n_threads < 1 || n_threads > FG_MAX_THREADS) {
        if (out)
            *out = NULL;
        return fg_error(NULL, FG_ERR_INVALID_ARGUMENT, "fg_threadpool_create_lent: n_threads must be in 1..%d, got %d",
                        FG_MAX_THREADS, (int)n_threads);
    }
    fg_status st = fg_threadpool_create(n_threads, out);
    if (st == FG_OK) {
        (*out)->lent = 1;
        (*out)->n_started = n_threads - 1; /* every worker's range exists; the caller takes an absent one's */
    }
    return st;
}

fg_status fg_threadpool_lend(fg_threadpool *p, int32_t thread, uint64_t ticket) {
    if (!p || !p->lent || thread < 1 || thread >= p->n_threads || ticket == 0)
        return fg_error(NULL, FG_ERR_INVALID_ARGUMENT, "fg_threadpool_lend: a pool from fg_threadpool_create_lent, "
                        "a thread in 1..size-1 (got %d) and a ticket > 0", (int)thread);
    const uint32_t g = atomic_load(&p->gen);
    serve(p, thread, g & 1u ? g - 1u : g, ticket); /* a job already out is left to the others */
    return FG_OK;
}

fg_status fg_threadpool_release(fg_threadpool *p, uint64_t ticket) {
    if (!p || !p->lent || ticket == 0)
        return fg_error(NULL, FG_ERR_INVALID_ARGUMENT,
                        "fg_threadpool_release: a pool from fg_threadpool_create_lent and a ticket > 0");
    atomic_store(&p->released, ticket);
    pthread_mutex_lock(&p->mu);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    return FG_OK;
}

void fg_threadpool_destroy(fg_threadpool **pool) {
    if (!pool || !*pool)
        return;
    fg_threadpool *p = *pool;
    if (p->lent)
        p->n_started = 0; /* no thread of its own to join */
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, 1);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    for (int32_t i = 0; i < p->n_started; i++)
        pthread_join(p->workers[i].thread, NULL);
    pthread_cond_destroy(&p->done);
    pthread_cond_destroy(&p->wake);
    pthread_mutex_destroy(&p->mu);
    pthread_mutex_destroy(&p->run_mu);
    free(p->workers);
    free(p->ranges);
    free(p);
    *pool = NULL;
}

int32_t fg_threadpool_size(const fg_threadpool *pool) { return pool ? pool->n_threads : 1; }

int fg_threadpool_blocked(const fg_threadpool *p) {
    if (!p || (tls_nest && tls_nest->pool == p))
        return 0;
    for (const nest *n = tls_nest; n; n = n->up)
        if (n->pool == p)
            return 1;
    return 0;
}

fg_status fg_threadpool_run(fg_threadpool *p, int32_t n_tasks, fg_task_fn fn, void *arg) {
    if (n_tasks < 0 || (n_tasks > 0 && !fn))
        return fg_error(NULL, FG_ERR_INVALID_ARGUMENT, "fg_threadpool_run: n_tasks must be >= 0 (got %d) and fn "
                        "must not be NULL", (int)n_tasks);
    if (n_tasks == 0)
        return FG_OK;
    if (p && tls_nest && tls_nest->pool == p) { /* a task of this pool asks for more: inline, as the thread it is */
        for (int32_t t = 0; t < n_tasks; t++)
            fn(arg, t, tls_nest->thread);
        return FG_OK;
    }
    if (fg_threadpool_blocked(p)) /* its job waits on this one through another pool's: it would wait for ever */
        return fg_error(NULL, FG_ERR_BAD_STATE, "fg_threadpool_run: the pool runs a job that waits on this "
                            "one through another pool (a task of pool A ran pool B, whose task runs A): run A's "
                            "work inline or on a third pool");
    if (!p || p->n_threads == 1 || n_tasks == 1) {
        const nest here = {p, 0, tls_nest};
        const nest *outer = tls_nest;
        if (p)
            tls_nest = &here;
        for (int32_t t = 0; t < n_tasks; t++)
            fn(arg, t, 0);
        tls_nest = outer;
        return FG_OK;
    }
    pthread_mutex_lock(&p->run_mu);
    /* workers start at the first job that wants them (a context that never
     * runs a parallel job costs no threads); one that cannot start leaves
     * its tasks to the others */
    for (; !p->lent && p->n_started + 1 < p->n_threads; p->n_started++) {
        worker *w = &p->workers[p->n_started];
        w->pool = p;
        w->id = p->n_started + 1;
        if (pthread_create(&w->thread, NULL, worker_main, w) != 0)
            break; /* tried again at the next job */
    }
    const nest here = {p, 0, tls_nest};
    const nest *outer = tls_nest;
    if (p->n_started == 0) {
        pthread_mutex_unlock(&p->run_mu);
        tls_nest = &here;
        for (int32_t t = 0; t < n_tasks; t++)
            fn(arg, t, 0);
        tls_nest = outer;
        return FG_OK;
    }
    const uint32_t g = atomic_load(&p->gen);
    atomic_store(&p->gen, g + 1); /* odd: the job is being written */
    SPIN_UNTIL(p, atomic_load(&p->active) == 0);
    while (atomic_load(&p->active) != 0) /* a worker still leaving the last job, descheduled */
        sched_yield();
    p->fn = fn;
    p->arg = arg;
    p->job_up = outer;
    p->n_ranges = p->n_started + 1;
    for (int32_t r = 0; r < p->n_ranges; r++) {
        atomic_store(&p->ranges[r].next, (int32_t)((int64_t)n_tasks * r / p->n_ranges));
        p->ranges[r].end = (int32_t)((int64_t)n_tasks * (r + 1) / p->n_ranges);
        atomic_store(&p->ranges[r].done, 0);
    }
    p->n_tasks = n_tasks;
    atomic_store(&p->gen, g + 2);
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->wake);
        pthread_mutex_unlock(&p->mu);
    }
    tls_nest = &here;
    take_tasks(p, 0);
    tls_nest = outer;
    SPIN_UNTIL(p, finished(p) == n_tasks);
    if (finished(p) != n_tasks) {
        pthread_mutex_lock(&p->mu);
        atomic_store(&p->caller_waiting, 1);
        while (finished(p) != n_tasks)
            pthread_cond_wait(&p->done, &p->mu);
        atomic_store(&p->caller_waiting, 0);
        pthread_mutex_unlock(&p->mu);
    }
    pthread_mutex_unlock(&p->run_mu);
    return FG_OK;
}
