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

#ifdef _OPENMP
#include <omp.h>
#endif
#ifdef FG_HAVE_BLAS
#include <cblas.h>
#endif

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

static inline int bench_threads(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

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

/* Streaming read bandwidth (bytes/s) over a buffer of >= 4x the LLC, all
 * threads, median of 9 passes. */
static inline double bench_read_bandwidth(void) {
    size_t bytes = 8 * bench_llc_bytes();
    if (bytes < ((size_t)256 << 20))
        bytes = (size_t)256 << 20;
    const size_t n = bytes / sizeof(float);
    float *buf = aligned_alloc(64, n * sizeof(float));
    if (!buf)
        return 0.0;
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
    for (size_t i = 0; i < n; i++)
        buf[i] = (float)(i & 1023);
    double t[9];
    volatile float sink = 0.0f;
    for (int r = 0; r < 9; r++) {
        double t0 = bench_now();
        float total = 0.0f;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) reduction(+ : total)
#endif
        for (size_t b = 0; b < n / 64; b++) {
            float acc[16] = {0};
            const float *p = buf + b * 64;
            for (int u = 0; u < 64; u += 16)
                for (int k = 0; k < 16; k++)
                    acc[k] += p[u + k];
            float s = 0.0f;
            for (int k = 0; k < 16; k++)
                s += acc[k];
            total += s;
        }
        t[r] = bench_now() - t0;
        sink += total;
    }
    (void)sink;
    free(buf);
    return (double)bytes / bench_median(t, 9);
}

/* Copy bandwidth (bytes read + written per second), all threads. */
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
    const int T = bench_threads();
    double t[9];
    for (int r = 0; r < 9; r++) {
        double t0 = bench_now();
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
        for (int i = 0; i < T; i++) {
            size_t lo = bytes / T * i, hi = i == T - 1 ? bytes : bytes / T * (i + 1);
            memcpy(b + lo, a + lo, hi - lo);
        }
        t[r] = bench_now() - t0;
    }
    free(a);
    free(b);
    return 2.0 * (double)bytes / bench_median(t, 9);
}

/* sgemm rate (flop/s, all threads, one single-threaded sgemm per thread) on
 * C[M][N] = A[M][K] B[N][K]^T, the profiling tile. */
static inline double bench_sgemm_rate(int M, int N, int K) {
#ifdef FG_HAVE_BLAS
    const int T = bench_threads(), reps = 200;
    double t[5];
    for (int r = 0; r < 5; r++) {
        double t0 = bench_now();
#ifdef _OPENMP
#pragma omp parallel num_threads(T)
#endif
        {
            float *A = malloc(sizeof(float) * M * K), *B = malloc(sizeof(float) * N * K);
            float *C = malloc(sizeof(float) * M * N);
            for (int i = 0; i < M * K; i++)
                A[i] = 0.001f * (float)(i % 97);
            for (int i = 0; i < N * K; i++)
                B[i] = 0.001f * (float)(i % 89);
            for (int i = 0; i < reps; i++)
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, A, K, B, K, 0.0f, C, N);
            free(A);
            free(B);
            free(C);
        }
        t[r] = bench_now() - t0;
    }
    return 2.0 * M * N * K * reps * T / bench_median(t, 5);
#else
    (void)M;
    (void)N;
    (void)K;
    return 0.0;
#endif
}

static inline int bench_has_flag(int argc, char **argv, const char *flag) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], flag))
            return 1;
    return 0;
}

#endif
