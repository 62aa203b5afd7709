/*
 * Shared by the benchmarks: timing, medians, the last-level cache size, and
 * the ceilings each benchmark measures in its own run (streaming read
 * bandwidth, copy bandwidth, sgemm rate), plus table/CSV output.
 */
#ifndef FG_BENCH_UTIL_H
#define FG_BENCH_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fastgen_config.h"

#ifdef FG_HAVE_BLAS
#include <cblas.h>
#endif

#include "backends/backend.h"
#include "fastgen.h"

static inline double bench_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static inline double bench_median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* The benchmark's thread pool: the backend's and the bandwidth probes'
 * (-t N / --threads N picks its size, default fg_default_threads()). */
static fg_threadpool *bench_pool_;
static int32_t bench_pool_threads_;

static inline fg_threadpool *bench_pool(void) {
    if (!bench_pool_ && fg_threadpool_create(bench_pool_threads_, &bench_pool_) != FG_OK) {
        fprintf(stderr, "bench: %s\n", fg_last_error(NULL));
        exit(1);
    }
    return bench_pool_;
}

static inline int bench_threads(void) { return fg_threadpool_size(bench_pool()); }

/* Size of the last-level cache from sysfs (32 MiB if unknown). */
static inline size_t bench_llc_bytes(void) {
    size_t best = 0;
    for (int i = 0; i < 8; i++) {
        char path[128], buf[64];
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        if (fgets(buf, sizeof buf, f)) {
            char *end;
            size_t v = strtoull(buf, &end, 10);
            if (*end == 'K')
                v <<= 10;
            else if (*end == 'M')
                v <<= 20;
            if (v > best)
                best = v;
        }
        fclose(f);
    }
    return best ? best : (size_t)32 << 20;
}

#if defined(__x86_64__)
#include <immintrin.h>
/* Sum of n floats (n a multiple of 64) with 8 independent AVX2 accumulators. */
__attribute__((target("avx2"))) static inline float bench_sum_avx2(const float *p, size_t n) {
    __m256 a[8];
    for (int k = 0; k < 8; k++)
        a[k] = _mm256_setzero_ps();
    for (size_t i = 0; i < n; i += 64)
        for (int k = 0; k < 8; k++)
            a[k] = _mm256_add_ps(a[k], _mm256_load_ps(p + i + 8 * k));
    for (int k = 1; k < 8; k++)
        a[0] = _mm256_add_ps(a[0], a[k]);
    float out[8];
    _mm256_storeu_ps(out, a[0]);
    return out[0] + out[1] + out[2] + out[3] + out[4] + out[5] + out[6] + out[7];
}
#endif

static inline float bench_sum(const float *p, size_t n) {
#if defined(__x86_64__)
    if (__builtin_cpu_supports("avx2"))
        return bench_sum_avx2(p, n);
#endif
    float acc[16] = {0};
    for (size_t i = 0; i < n; i += 16)
        for (int k = 0; k < 16; k++)
            acc[k] += p[i + k];
    float s = 0.0f;
    for (int k = 0; k < 16; k++)
        s += acc[k];
    return s;
}

/* One streaming read of n floats (a multiple of 64 per thread's share), all
 * threads, each over its contiguous part: the bandwidth probe. */
typedef struct bench_read_job {
    const float *buf;
    size_t per;
    float part[FG_MAX_THREADS];
} bench_read_job;

static void bench_read_task(void *arg, int32_t t, int32_t thread) {
    (void)thread;
    bench_read_job *j = arg;
    j->part[t] = bench_sum(j->buf + (size_t)t * j->per, j->per);
}

static inline float bench_stream_read_on(fg_threadpool *pool, const float *buf, size_t n) {
    const int T = fg_threadpool_size(pool);
    static bench_read_job j;
    j.buf = buf;
    j.per = n / 64 / (size_t)T * 64;
    fg_threadpool_run(pool, T, bench_read_task, &j);
    float total = 0.0f;
    for (int t = 0; t < T; t++)
        total += j.part[t];
    return total;
}

static inline float bench_stream_read(const float *buf, size_t n) { return bench_stream_read_on(bench_pool(), buf, n); }

/* A buffer of >= 4x the LLC (at least 128 MiB) for bench_stream_read. */
static inline float *bench_stream_buffer(size_t *n_floats) {
    size_t bytes = 4 * bench_llc_bytes();
    if (bytes < ((size_t)128 << 20))
        bytes = (size_t)128 << 20;
    *n_floats = bytes / sizeof(float);
    float *buf = aligned_alloc(64, bytes);
    if (buf)
        for (size_t i = 0; i < *n_floats; i++)
            buf[i] = (float)(i & 1023);
    return buf;
}

/* Streaming read bandwidth (bytes/s) of the threads of `pool`, median of 9
 * passes (0 when the buffer cannot be had). fastgen bench's limit uses it too. */
static inline double bench_read_bandwidth_on(fg_threadpool *pool) {
    size_t n;
    float *buf = bench_stream_buffer(&n);
    if (!buf)
        return 0.0;
    double t[9];
    volatile float sink = 0.0f;
    const size_t T = (size_t)fg_threadpool_size(pool), read = n / 64 / T * 64 * T;
    for (int r = 0; r < 9; r++) {
        double t0 = bench_now();
        sink += bench_stream_read_on(pool, buf, n);
        t[r] = bench_now() - t0;
    }
    (void)sink;
    free(buf);
    return (double)(read * sizeof(float)) / bench_median(t, 9);
}

/* The same on the benchmark's pool: all threads. */
static inline double bench_read_bandwidth(void) { return bench_read_bandwidth_on(bench_pool()); }

/* One memcpy of `bytes` from a to b split over all threads: the copy probe. */
typedef struct bench_copy_job {
    unsigned char *b;
    const unsigned char *a;
    size_t bytes;
    int T;
} bench_copy_job;

static void bench_copy_task(void *arg, int32_t i, int32_t thread) {
    (void)thread;
    const bench_copy_job *j = arg;
    const size_t lo = j->bytes / j->T * i, hi = i == j->T - 1 ? j->bytes : j->bytes / j->T * (i + 1);
    memcpy(j->b + lo, j->a + lo, hi - lo);
}

static inline void bench_copy_once(unsigned char *b, const unsigned char *a, size_t bytes) {
    const bench_copy_job j = {b, a, bytes, bench_threads()};
    fg_threadpool_run(bench_pool(), j.T, bench_copy_task, (void *)&j);
}

/* Copy bandwidth (bytes read + written per second) over >= 4x the LLC, all
 * threads, median of 9 passes. */
static inline double bench_copy_bandwidth(void) {
    size_t bytes = 4 * bench_llc_bytes();
    if (bytes < ((size_t)128 << 20))
        bytes = (size_t)128 << 20;
    unsigned char *a = aligned_alloc(64, bytes), *b = aligned_alloc(64, bytes);
    if (!a || !b) {
        free(a);
        free(b);
        return 0.0;
    }
    memset(a, 1, bytes);
    memset(b, 2, bytes);
    double t[9];
    for (int r = 0; r < 9; r++) {
        double t0 = bench_now();
        bench_copy_once(b, a, bytes);
        t[r] = bench_now() - t0;
    }
    free(a);
    free(b);
    return 2.0 * (double)bytes / bench_median(t, 9);
}

/* sgemm rate (flop/s, all threads, one single-threaded sgemm per thread) on
 * C[M][N] = A[M][K] B[N][K]^T, the profiling tile. */
typedef struct bench_sgemm_job {
    float *bufs;
    int M, N, K, reps;
} bench_sgemm_job;

static void bench_sgemm_task(void *arg, int32_t me, int32_t thread) {
    (void)thread;
    const bench_sgemm_job *j = arg;
    const int M = j->M, N = j->N, K = j->K;
    float *A = j->bufs + (size_t)me * (M * K + N * K + M * N), *B = A + M * K, *C = B + N * K;
#ifdef FG_HAVE_BLAS
    for (int i = 0; i < j->reps; i++)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, A, K, B, K, 0.0f, C, N);
#else
    (void)A, (void)B, (void)C;
#endif
}

static inline double bench_sgemm_rate_on(fg_threadpool *pool, int M, int N, int K) {
#ifdef FG_HAVE_BLAS
    const int T = fg_threadpool_size(pool), reps = 300;
#ifdef FG_HAVE_OPENBLAS
    openblas_set_num_threads(1);
#endif
    float *bufs = malloc(sizeof(float) * (size_t)T * (M * K + N * K + M * N));
    if (!bufs)
        return 0.0;
    for (size_t i = 0; i < (size_t)T * (M * K + N * K + M * N); i++)
        bufs[i] = 0.001f * (float)(i % 97);
    const bench_sgemm_job j = {bufs, M, N, K, reps};
    double t[7];
    for (int r = 0; r < 7; r++) {
        double t0 = bench_now();
        fg_threadpool_run(pool, T, bench_sgemm_task, (void *)&j);
        t[r] = bench_now() - t0;
    }
    free(bufs);
    return 2.0 * M * N * K * reps * T / bench_median(t, 7);
#else
    (void)pool;
    (void)M;
    (void)N;
    (void)K;
    (void)bench_sgemm_task;
    return 0.0;
#endif
}

/* The same on the benchmark's pool. */
static inline double bench_sgemm_rate(int M, int N, int K) { return bench_sgemm_rate_on(bench_pool(), M, N, K); }

/* Opens the backend named by --backend NAME (default cpu); *name gets it. */
static inline fg_status bench_open_backend(int argc, char **argv, fg_backend *be, const char **name) {
    *name = "cpu";
    for (int i = 1; i + 1 < argc; i++) {
        if (!strcmp(argv[i], "--backend"))
            *name = argv[i + 1];
        if (!strcmp(argv[i], "-t") || !strcmp(argv[i], "--threads"))
            bench_pool_threads_ = atoi(argv[i + 1]);
    }
    *be = (fg_backend){.err = fg_error_to_stderr};
    return fg_backend_open(*name, bench_pool(), be);
}

/* A backend's benchmark extras (fg_get_proc_fn), NULL when it has none. */
static inline fg_timer_fn *bench_timer(const fg_backend *be) { return (fg_timer_fn *)fg_backend_get_proc(be, "timer"); }
static inline fg_kernel_times_fn *bench_kernel_times(const fg_backend *be) {
    return (fg_kernel_times_fn *)fg_backend_get_proc(be, "kernel_times");
}
/* Prints " name ms" for each part (seconds / per, in ms) and returns the sum of the device's parts (all but "host"). */
static inline double bench_print_kernel_times(const fg_kernel_time *kt, int32_t n, double per) {
    double device = 0.0;
    for (int32_t i = 0; i < n; i++) {
        printf(" %s %.4f", kt[i].name, 1e3 * kt[i].seconds / per);
        if (strcmp(kt[i].name, "host"))
            device += kt[i].seconds / per;
    }
    return device;
}
static inline fg_bandwidth_fn *bench_bandwidth(const fg_backend *be) {
    return (fg_bandwidth_fn *)fg_backend_get_proc(be, "bandwidth");
}
static inline fg_device_info_fn *bench_device_info(const fg_backend *be) {
    return (fg_device_info_fn *)fg_backend_get_proc(be, "device_info");
}

/* A GPU backend: device memory, device-event timing, a bandwidth probe. */
static inline int bench_is_device(const fg_backend *be) {
    return bench_timer(be) && bench_bandwidth(be) && bench_device_info(be);
}

/* `bytes` of backend memory holding a copy of src (uninitialised when src
 * is NULL); NULL on failure. */
static inline void *bench_device_copy(fg_backend *be, const void *src, size_t bytes) {
    void *p = NULL;
    if (be->ops->buffer_alloc(be, bytes, &p))
        return NULL;
    if (src && fg_backend_write(be, p, src, bytes)) {
        be->ops->buffer_free(be, p);
        return NULL;
    }
    return p;
}

/* Starts (t0 = bench_now()) or ends a timed region: device events on a GPU
 * backend (the end waits for the device), the wall clock otherwise. */
static inline double bench_region(fg_backend *be, int dev, int stop, double t0) {
    double sec = 0.0;
    if (dev)
        return bench_timer(be)(be, stop, &sec) ? -1.0 : sec;
    return stop ? bench_now() - t0 : bench_now();
}

/* The value after option `name`, or NULL. */
static inline const char *bench_arg(int argc, char **argv, const char *name) {
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], name))
            return argv[i + 1];
    return NULL;
}

static inline int bench_has_flag(int argc, char **argv, const char *flag) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], flag))
            return 1;
    return 0;
}

#endif
