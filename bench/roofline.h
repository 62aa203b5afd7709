/*
 * The CPU roofline of a decode step (and a prompt), phase by phase, from
 * this machine's own probes: `fastgen bench` and `bench_decode` print it
 * beside every run.
 *
 * A phase's floor is max(bytes it reads / the read bandwidth, its
 * operations / the peak of the instructions it uses); a step's floor is the
 * sum of its phases' floors. The peaks are microbenchmarks of the
 * instructions themselves on every thread of the pool at once (independent
 * accumulators in registers, nothing read from memory), at the ISA level the
 * kernels run (fg_cpu_features_get: FG_CPU_ISA lowers both alike), never the
 * kernels being judged:
 *
 *   i8   8-bit multiply-adds: vpdpbusd on 256 bits where AVX-512 VNNI is
 *        (the model's 8-bit products use it), else vpmaddubsw + vpmaddwd +
 *        vpaddd (their AVX2 sequence), else a plain C loop;
 *   fma  fp32 multiply-adds: vfmadd on 512 bits (AVX-512) or 256 (AVX2),
 *        else a plain C loop;
 *   widen  f16 to f32 conversions: vcvtph2ps (512 or 256 bits), else the
 *        portable bit conversion the generic path uses.
 *
 * Operations counted per phase (roofline_decode_phases): the weight products
 * read every matrix once and do one multiply-add per weight (i8 when the
 * activations are 8-bit, fma otherwise); attention reads the K/V rows held
 * and, per row and query head, does 2 d multiply-adds (q.k and p v) and one
 * e^x, counted as ROOFLINE_EXP_OPS fma-equivalents (the kernels' e^x is a
 * range reduction and a degree-6 polynomial: about 16 vector operations),
 * with 2 d widenings per row of a 16-bit cache (K and V once for the
 * group's G query heads; a quantized row's element counts 2 fma-equivalents:
 * the integer conversion and its scale); the rest (RMSNorm, RoPE, the
 * residuals, SwiGLU) counts its fp32 operations at the fma peak. Where
 * operations of several kinds share a phase their times add (they issue
 * from the same cores).
 */
#ifndef FG_ROOFLINE_H
#define FG_ROOFLINE_H

#include <stdint.h>
#include <string.h>

#include "bench/bench_util.h"
#include "common/cpu_features.h"
#include "common/dtype.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#define ROOFLINE_EXP_OPS 16.0

/* The probes' figures: per second, all threads of the pool together. */
typedef struct roofline_peaks {
    fg_cpu_isa isa;
    int vnni;       /* the i8 probe ran vpdpbusd */
    int32_t threads;
    double read_bps;   /* streaming read bandwidth, bytes/s */
    double i8_macs;    /* 8-bit multiply-adds/s */
    double fma;        /* fp32 multiply-adds/s (lanes) */
    double widen;      /* f16 -> f32 conversions/s */
} roofline_peaks;

/* A phase's work: bytes read from memory and operations of each kind. */
typedef struct roofline_phase {
    const char *name;
    double bytes, i8, fma, widen;
} roofline_phase;

/* Keeps a value in a register as if changed: the loops below cannot hoist
 * their loop-invariant instructions, and no instruction is added. */
#define ROOF_OPAQUE(v) __asm__ volatile("" : "+x"(v))
#define ROOF_OPAQUE_V(v) __asm__ volatile("" : "+v"(v))

#if defined(__x86_64__)
/* Each probe: `iters` iterations of independent chains, written out (an
 * array indexed in a loop may live in memory, and the probe would time its
 * loads), as many as the latency asks and the registers hold; each returns
 * a value that depends on every chain. */
#define ROOF_4(X) X(0) X(1) X(2) X(3)
#define ROOF_6(X) ROOF_4(X) X(4) X(5)
#define ROOF_8(X) ROOF_6(X) X(6) X(7)
#define ROOF_12(X) ROOF_8(X) X(8) X(9) X(10) X(11)

/* 8-bit multiply-adds as AVX2 issues them: the chain through the accumulator
 * is the add alone (1 cycle), so 4 chains keep the multiplies busy within
 * 16 registers (4 accumulators, 4 operands, the two constants, temporaries) */
__attribute__((target("avx2,fma"))) static inline int64_t roof_i8_avx2(int64_t iters) {
    const __m256i a = _mm256_set1_epi8(3), ones = _mm256_set1_epi16(1);
#define DECL(k) __m256i acc##k = _mm256_setzero_si256(), b##k = _mm256_set1_epi8((char)(k + 1));
    ROOF_4(DECL)
#undef DECL
    for (int64_t i = 0; i < iters; i++) {
#define STEP(k)                                                                                                        \
    ROOF_OPAQUE(b##k);                                                                                                 \
    acc##k = _mm256_add_epi32(acc##k, _mm256_madd_epi16(_mm256_maddubs_epi16(a, b##k), ones));
        ROOF_4(STEP)
#undef STEP
    }
    const __m256i s = _mm256_add_epi32(_mm256_add_epi32(acc0, acc1), _mm256_add_epi32(acc2, acc3));
    return _mm256_extract_epi32(s, 0);
}

/* vpdpbusd: the accumulator is its input (5 cycles), so 12 chains */
__attribute__((target("avx2,fma,avx512f,avx512vl,avx512vnni"))) static inline int64_t roof_i8_vnni(int64_t iters) {
    const __m256i a = _mm256_set1_epi8(3), b = _mm256_set1_epi8(5);
#define DECL(k) __m256i acc##k = _mm256_setzero_si256();
    ROOF_12(DECL)
#undef DECL
    for (int64_t i = 0; i < iters; i++) {
#define STEP(k) acc##k = _mm256_dpbusd_epi32(acc##k, a, b);
        ROOF_12(STEP)
#undef STEP
    }
    const __m256i s = _mm256_add_epi32(_mm256_add_epi32(_mm256_add_epi32(acc0, acc1), _mm256_add_epi32(acc2, acc3)),
                                       _mm256_add_epi32(_mm256_add_epi32(acc4, acc5), _mm256_add_epi32(acc6, acc7)));
    const __m256i s2 = _mm256_add_epi32(_mm256_add_epi32(acc8, acc9), _mm256_add_epi32(acc10, acc11));
    return _mm256_extract_epi32(_mm256_add_epi32(s, s2), 0);
}

/* fp32 multiply-adds: 12 chains (two pipes of 4-cycle latency need 8) */
__attribute__((target("avx2,fma"))) static inline int64_t roof_fma_avx2(int64_t iters) {
    const __m256 a = _mm256_set1_ps(0.999f), b = _mm256_set1_ps(1e-3f);
#define DECL(k) __m256 acc##k = _mm256_set1_ps((float)k);
    ROOF_12(DECL)
#undef DECL
    for (int64_t i = 0; i < iters; i++) {
#define STEP(k) acc##k = _mm256_fmadd_ps(acc##k, a, b);
        ROOF_12(STEP)
#undef STEP
    }
    const __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)),
                                   _mm256_add_ps(_mm256_add_ps(acc4, acc5), _mm256_add_ps(acc6, acc7)));
    const __m256 s2 = _mm256_add_ps(_mm256_add_ps(acc8, acc9), _mm256_add_ps(acc10, acc11));
    return (int64_t)_mm256_cvtss_f32(_mm256_add_ps(s, s2));
}

__attribute__((target("avx2,fma,avx512f"))) static inline int64_t roof_fma_avx512(int64_t iters) {
    const __m512 a = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(1e-3f);
#define DECL(k) __m512 acc##k = _mm512_set1_ps((float)k);
    ROOF_12(DECL)
#undef DECL
    for (int64_t i = 0; i < iters; i++) {
#define STEP(k) acc##k = _mm512_fmadd_ps(acc##k, a, b);
        ROOF_12(STEP)
#undef STEP
    }
    const __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(acc0, acc1), _mm512_add_ps(acc2, acc3)),
                                   _mm512_add_ps(_mm512_add_ps(acc4, acc5), _mm512_add_ps(acc6, acc7)));
    const __m512 s2 = _mm512_add_ps(_mm512_add_ps(acc8, acc9), _mm512_add_ps(acc10, acc11));
    return (int64_t)_mm512_reduce_add_ps(_mm512_add_ps(s, s2));
}

/* f16 widenings: 6 chains (the add's 3 cycles behind a conversion a cycle)
 * within 16 registers */
__attribute__((target("avx2,fma,f16c"))) static inline int64_t roof_widen_avx2(int64_t iters) {
#define DECL(k) __m256 acc##k = _mm256_setzero_ps(); __m128i h##k = _mm_set1_epi16((short)(0x3c00 + k));
    ROOF_6(DECL)
#undef DECL
    for (int64_t i = 0; i < iters; i++) {
#define STEP(k)                                                                                                        \
    ROOF_OPAQUE(h##k);                                                                                                 \
    acc##k = _mm256_add_ps(acc##k, _mm256_cvtph_ps(h##k));
        ROOF_6(STEP)
#undef STEP
    }
    const __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)),
                                   _mm256_add_ps(acc4, acc5));
    return (int64_t)_mm256_cvtss_f32(s);
}

__attribute__((target("avx2,fma,f16c,avx512f"))) static inline int64_t roof_widen_avx512(int64_t iters) {
#define DECL(k) __m512 acc##k = _mm512_setzero_ps(); __m256i h##k = _mm256_set1_epi16((short)(0x3c00 + k));
    ROOF_8(DECL)
#undef DECL
    for (int64_t i = 0; i < iters; i++) {
#define STEP(k)                                                                                                        \
    ROOF_OPAQUE_V(h##k);                                                                                               \
    acc##k = _mm512_add_ps(acc##k, _mm512_cvtph_ps(h##k));
        ROOF_8(STEP)
#undef STEP
    }
    const __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(acc0, acc1), _mm512_add_ps(acc2, acc3)),
                                   _mm512_add_ps(_mm512_add_ps(acc4, acc5), _mm512_add_ps(acc6, acc7)));
    return (int64_t)_mm512_reduce_add_ps(s);
}
#undef ROOF_4
#undef ROOF_6
#undef ROOF_8
#undef ROOF_12
#endif

/* The generic path's counterparts: plain C over registers' worth of data. */
static inline int64_t roof_i8_generic(int64_t iters) {
    uint32_t acc[32] = {0}; /* wraps: a long run passes 2^31 */
    int8_t b[32];
    uint8_t a[32];
    for (int k = 0; k < 32; k++)
        a[k] = (uint8_t)(k + 1), b[k] = (int8_t)(k - 16);
    for (int64_t i = 0; i < iters; i++) {
        const int8_t *bp = b; /* reloaded each time, as a kernel reads its operands */
        __asm__ volatile("" : "+r"(bp));
        for (int k = 0; k < 32; k++)
            acc[k] += (uint32_t)((int32_t)a[k] * bp[k]);
    }
    uint32_t s = 0;
    for (int k = 0; k < 32; k++)
        s += acc[k];
    return (int64_t)s;
}

static inline int64_t roof_fma_generic(int64_t iters) {
    float acc[32];
    for (int k = 0; k < 32; k++)
        acc[k] = (float)k;
    for (int64_t i = 0; i < iters; i++)
        for (int k = 0; k < 32; k++)
            acc[k] = acc[k] * 0.999f + 1e-3f; /* a recurrence: nothing to hoist */
    float s = 0.0f;
    for (int k = 0; k < 32; k++)
        s += acc[k];
    return (int64_t)s;
}

static inline int64_t roof_widen_generic(int64_t iters) {
    float acc[32] = {0};
    uint16_t h[32];
    for (int k = 0; k < 32; k++)
        h[k] = (uint16_t)(0x3c00 + k);
    for (int64_t i = 0; i < iters; i++) {
        const uint16_t *hp = h;
        __asm__ volatile("" : "+r"(hp));
        for (int k = 0; k < 32; k++)
            acc[k] += fg_f16_to_f32(hp[k]);
    }
    float s = 0.0f;
    for (int k = 0; k < 32; k++)
        s += acc[k];
    return (int64_t)s;
}

enum { ROOF_I8, ROOF_FMA, ROOF_WIDEN };

typedef struct roof_job {
    int kind;
    int64_t iters;
    fg_cpu_features f;
    volatile int64_t sink[FG_MAX_THREADS];
} roof_job;

/* Operations one iteration of the kind's probe does at this ISA. */
static inline double roof_ops_per_iter(int kind, fg_cpu_features f) {
    if (f.isa == FG_ISA_GENERIC || (kind == ROOF_WIDEN && !f.f16c)) /* the C loops: 32 a pass */
        return 32.0;
    switch (kind) {
    case ROOF_I8: return f.vnni ? 12 * 32.0 : 4 * 32.0;                     /* chains x 32 byte pairs */
    case ROOF_FMA: return f.isa >= FG_ISA_AVX512 ? 12 * 16.0 : 12 * 8.0;   /* 12 chains x lanes */
    default: return f.isa >= FG_ISA_AVX512 ? 8 * 16.0 : 6 * 8.0;           /* 8 or 6 chains x lanes */
    }
}

static void roof_task(void *arg, int32_t t, int32_t thread) {
    (void)thread;
    roof_job *j = arg;
    int64_t r = 0;
#if defined(__x86_64__)
    const int wide = j->f.isa >= FG_ISA_AVX512, avx2 = j->f.isa >= FG_ISA_AVX2;
    if (j->kind == ROOF_I8 && avx2)
        r = j->f.vnni ? roof_i8_vnni(j->iters) : roof_i8_avx2(j->iters);
    else if (j->kind == ROOF_FMA && avx2)
        r = wide ? roof_fma_avx512(j->iters) : roof_fma_avx2(j->iters);
    else if (j->kind == ROOF_WIDEN && avx2 && j->f.f16c)
        r = wide ? roof_widen_avx512(j->iters) : roof_widen_avx2(j->iters);
    else
#endif
        r = j->kind == ROOF_I8 ? roof_i8_generic(j->iters)
            : j->kind == ROOF_FMA ? roof_fma_generic(j->iters)
                                  : roof_widen_generic(j->iters);
    j->sink[t] = r;
}

/* Operations/s of one kind, every thread of `pool` at once: the iterations
 * sized to about 20 ms, best of 5 runs. */
static inline double roofline_probe(fg_threadpool *pool, int kind) {
    const int32_t T = fg_threadpool_size(pool);
    static roof_job j;
    j.kind = kind;
    j.f = fg_cpu_features_get();
    j.iters = 1000;
    for (int r = 0; r < 16; r++) { /* sized, untimed: about 20 ms a run */
        const double t0 = bench_now();
        fg_threadpool_run(pool, T, roof_task, &j);
        const double t = bench_now() - t0;
        if (t >= 0.01)
            break;
        j.iters *= t > 0.0 && 0.02 / t < 64 ? (int64_t)(0.02 / t) + 1 : 64;
    }
    double best = 0.0;
    for (int r = 0; r < 5; r++) {
        const double t0 = bench_now();
        fg_threadpool_run(pool, T, roof_task, &j);
        const double rate = (double)j.iters * roof_ops_per_iter(kind, j.f) * T / (bench_now() - t0);
        best = rate > best ? rate : best;
    }
    return best;
}

/* Every probe on the pool's threads: the bandwidth too. */
static inline roofline_peaks roofline_measure(fg_threadpool *pool) {
    const fg_cpu_features f = fg_cpu_features_get();
    roofline_peaks p = {f.isa, f.isa >= FG_ISA_AVX2 && f.vnni, fg_threadpool_size(pool), 0, 0, 0, 0};
    p.read_bps = bench_read_bandwidth_on(pool);
    p.i8_macs = roofline_probe(pool, ROOF_I8);
    p.fma = roofline_probe(pool, ROOF_FMA);
    p.widen = roofline_probe(pool, ROOF_WIDEN);
    return p;
}

/* A phase's floor (seconds): *mem and *ops get its two terms. */
static inline double roofline_phase_floor(const roofline_peaks *p, const roofline_phase *ph, double *mem, double *ops) {
    const double m = p->read_bps > 0 ? ph->bytes / p->read_bps : 0.0;
    double o = 0.0;
    if (ph->i8 > 0 && p->i8_macs > 0)
        o += ph->i8 / p->i8_macs;
    if (ph->fma > 0 && p->fma > 0)
        o += ph->fma / p->fma;
    if (ph->widen > 0 && p->widen > 0)
        o += ph->widen / p->widen;
    if (mem)
        *mem = m;
    if (ops)
        *ops = o;
    return m > o ? m : o;
}

/* The attention of one step over `rows` K/V rows held (all layers and KV
 * heads together) of a cache of dtype dt (V in v_dt), G query heads per KV
 * head of dimension d; `bytes`: what those rows take, read once. */
static inline roofline_phase roofline_attention(double rows, int32_t G, int32_t d, fg_dtype dt, fg_dtype v_dt,
                                                double bytes) {
    roofline_phase ph = {"attention", bytes, 0.0, 0.0, 0.0};
    ph.fma = rows * G * (2.0 * d + ROOFLINE_EXP_OPS);
    const fg_dtype both[2] = {dt, v_dt};
    for (int i = 0; i < 2; i++) {
        if (both[i] == FG_DTYPE_F16 || both[i] == FG_DTYPE_BF16)
            ph.widen += rows * d;
        else if (both[i] != FG_DTYPE_F32)
            ph.fma += rows * d * 2.0;
    }
    return ph;
}

/* "probes (2 threads, avx2): read 31.2 GB/s, i8 812 G/s (vpmaddubsw), fma 210 G/s, widen 98 G/s" */
static inline void roofline_print_peaks(FILE *f, const char *prefix, const roofline_peaks *p) {
    fprintf(f,
            "%sprobes (%d threads, %s): read %.1f GB/s; 8-bit multiply-adds %.1f G/s (%s); fp32 multiply-adds "
            "%.1f G/s; f16 widenings %.1f G/s\n",
            prefix, (int)p->threads, fg_cpu_isa_name(p->isa), p->read_bps / 1e9, p->i8_macs / 1e9,
            p->isa == FG_ISA_GENERIC ? "C loop" : p->vnni ? "vpdpbusd" : "vpmaddubsw+vpmaddwd", p->fma / 1e9,
            p->widen / 1e9);
}

#endif
