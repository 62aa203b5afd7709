/*
 * The CPU kernels' vector vocabulary, in one place, one section per
 * instruction set:
 *   - helpers any kernel may call (on x86 always declared, each under its
 *     ISA's target attribute): e^x on 8 and 16 lanes, horizontal sums and
 *     maxima, the folds that reduce many vectors' sums at once, the lane
 *     loaders of the quantized cache dtypes;
 *   - the mapping the attention template (attend_chunk.inc) is written in:
 *     a file that defines FG_SIMD_GENERIC, FG_SIMD_AVX2 or FG_SIMD_AVX512
 *     before including this header gets ISAN, FG_TARGET, vec, VW, VLOAD,
 *     VFMA, ... for that ISA. One ISA per translation unit (decode_<isa>.c),
 *     so the variants compile apart and in parallel.
 * A new ISA is one more section here and a decode_<isa>.c of a few lines.
 */
#ifndef FG_SIMD_H
#define FG_SIMD_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "common/cpu_features.h"
#include "common/dtype.h"
#include "common/vexp.h"
#include "kernels_cpu/kernels_cpu.h"

#ifdef FG_X86
#include <immintrin.h>
#endif

/* The dot products of R rows with hn query heads, reduced: s[h * FG_CPU_BLOCK
 * + r] (a head's row of scores) gets the sum of input r * hn + h. The
 * SIMD builds fold the n = R * hn vectors into one, whose 4-lane blocks hold
 * `per` sums each, value t (head t / R, row t % R) at lane 4 (t / per) +
 * t % per; this writes them as runs of a head's consecutive rows. */
static inline __attribute__((always_inline)) void fg_dot_rows(const float *z, int per, int n, int R, float *s) {
    const int run = per < R ? per : R;
    for (int t = 0; t < n; t += run)
        memcpy(s + (t / R) * FG_CPU_BLOCK + t % R, z + 4 * (t / per) + t % per, (size_t)run * sizeof(float));
}

/* ------------------------------------------------------------------ x86 helpers */
#ifdef FG_X86

/* A block's fp16 scale, widened by F16C (the AVX2 and AVX-512 kernels). */
__attribute__((target("f16c"))) static inline float fg_f16c_scale(const unsigned char *blk) {
    uint16_t h;
    memcpy(&h, blk, sizeof h);
    return _cvtsh_ss(h);
}

FG_SIMD_AVX2_TARGET static inline float fg_hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
FG_SIMD_AVX2_TARGET static inline float fg_hmax256(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
/* The sums of the lanes of v[0 .. n - 1] (n <= 8, a power of two), folded
 * together in halves (21 instructions for 8 sums, where one vector at a time
 * takes 8 x 6): v[i] ends in lane 4 (i % 2) + i / 2. */
FG_SIMD_AVX2_TARGET static inline __attribute__((always_inline)) __m256 fg_fold256(const __m256 *v, int n) {
    const __m256 zero = _mm256_setzero_ps();
    __m256 w[4], y[2];
    for (int i = 0; i < n / 2; i++) /* halves: [v(2i) lo + hi, v(2i+1) lo + hi] */
        w[i] = _mm256_add_ps(_mm256_permute2f128_ps(v[2 * i], v[2 * i + 1], 0x20),
                             _mm256_permute2f128_ps(v[2 * i], v[2 * i + 1], 0x31));
    for (int i = 0; i < (n / 2 + 1) / 2; i++) {
        const __m256 b = 2 * i + 1 < n / 2 ? w[2 * i + 1] : zero;
        y[i] = _mm256_add_ps(_mm256_unpacklo_ps(w[2 * i], b), _mm256_unpackhi_ps(w[2 * i], b));
    }
    const __m256 y1 = n > 4 ? y[1] : zero;
    const __m256d lo = _mm256_unpacklo_pd(_mm256_castps_pd(y[0]), _mm256_castps_pd(y1));
    const __m256d hi = _mm256_unpackhi_pd(_mm256_castps_pd(y[0]), _mm256_castps_pd(y1));
    return _mm256_add_ps(_mm256_castpd_ps(lo), _mm256_castpd_ps(hi));
}
/* fg_dot_rows for 8 lanes: value t enters as the input that lands in lane
 * 4 (t / per) + t % per */
FG_SIMD_AVX2_TARGET static inline __attribute__((always_inline)) void fg_hsum_rows256(const __m256 *v, int R, int hn, float *s) {
    const int n = R * hn, per = n >= 2 ? n / 2 : 1;
    if (n == 1) {
        s[0] = fg_hsum256(v[0]);
        return;
    }
    __m256 u[8];
    for (int t = 0; t < n; t++)
        u[2 * (t % per) + t / per] = v[(t % R) * hn + t / R];
    float z[8];
    _mm256_storeu_ps(z, fg_fold256(u, n));
    fg_dot_rows(z, per, n, R, s);
}
/* Lanes c .. c + 7 of a quantized row in place (blocks of 2^qs values, c % 8
 * == 0, so the lanes lie in one block): the values widened to fp32, times
 * the block's scale. */
FG_SIMD_AVX2_TARGET static inline __m256 fg_q8_lanes256(const unsigned char *p, int32_t c, int32_t qs, float scale) {
    const unsigned char *blk = p + (size_t)(c >> qs) * ((1u << qs) + 2);
    const __m128i b = _mm_loadl_epi64((const __m128i *)(const void *)(blk + 2 + (c & ((1 << qs) - 1))));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)), _mm256_set1_ps(scale));
}
/* The integer dots of a quantized block of 32 values with the query's 8-bit
 * ones (kernels_cpu/decode_step.c's query_q8_ints). q4_0's 32 nibbles as bytes,
 * value i in byte i: */
FG_SIMD_AVX2_TARGET static inline __m256i fg_q4_bytes256(const unsigned char *v) {
    const __m128i x = _mm_loadu_si128((const __m128i *)(const void *)v);
    const __m256i both = _mm256_inserti128_si256(_mm256_castsi128_si256(x), _mm_srli_epi16(x, 4), 1);
    return _mm256_and_si256(both, _mm256_set1_epi8(0x0f));
}
/* Lane l: u_4l q_4l + ... + u_4l+3 q_4l+3 for unsigned bytes u and signed q
 * (|u|, |q| <= 127: no pair of products saturates vpmaddubsw's int16). */
FG_SIMD_AVX2_TARGET static inline __m256i fg_dot_u8s8_256(__m256i u, __m256i q) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, q), _mm256_set1_epi16(1));
}
/* n (1, 2 or 4) vectors of 8 values of a quantized block of 32 from value
 * o (o % 8n == 0; v: the block's bytes after its scale), widened to fp32
 * without the scale (the caller folds it into the factor it multiplies
 * them by). q4_0: the values' 16 nibbles of a half-block as bytes less 8,
 * widened 8 at a time. */
FG_SIMD_AVX2_TARGET static inline __attribute__((always_inline)) void fg_q4_raw256(const unsigned char *v, int32_t o,
                                                                                 int n, __m256 *out) {
    const __m128i m15 = _mm_set1_epi8(0x0f), k8 = _mm_set1_epi8(8);
    if (n == 1) {
        __m128i b = _mm_loadl_epi64((const __m128i *)(const void *)(v + (o & 15)));
        if (o >= 16)
            b = _mm_srli_epi16(b, 4);
        out[0] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_sub_epi8(_mm_and_si128(b, m15), k8)));
        return;
    }
    const __m128i x = _mm_loadu_si128((const __m128i *)(const void *)v);
    for (int g = 0; g < n / 2; g++) {
        const __m128i u = o + 16 * g >= 16 ? _mm_srli_epi16(x, 4) : x;
        const __m128i b = _mm_sub_epi8(_mm_and_si128(u, m15), k8);
        out[2 * g] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
        out[2 * g + 1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(b, b)));
    }
}
FG_SIMD_AVX2_TARGET static inline __attribute__((always_inline)) void fg_q8_raw256(const unsigned char *v, int32_t o,
                                                                                 int n, __m256 *out) {
    for (int u = 0; u < n; u++)
        out[u] = _mm256_cvtepi32_ps(
            _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(v + o + 8 * u))));
}
FG_SIMD_AVX2_TARGET static inline __m256 fg_q4_lanes256(const unsigned char *p, int32_t c, int32_t qs, float scale) {
    const int32_t half = 1 << (qs - 1), o = c & ((1 << qs) - 1);
    const unsigned char *blk = p + (size_t)(c >> qs) * ((1u << (qs - 1)) + 2);
    const __m128i m15 = _mm_set1_epi8(0x0f);
    __m128i b;
    if (half >= 8) { /* the 8 lanes are one nibble of 8 bytes */
        b = _mm_loadl_epi64((const __m128i *)(const void *)(blk + 2 + (o & (half - 1))));
        if (o >= half)
            b = _mm_srli_epi16(b, 4);
        b = _mm_and_si128(b, m15);
    } else { /* blocks of 8: the low nibbles of 4 bytes, then their high ones */
        uint32_t w;
        memcpy(&w, blk + 2, sizeof w);
        const __m128i x = _mm_cvtsi32_si128((int)w);
        b = _mm_unpacklo_epi32(_mm_and_si128(x, m15), _mm_and_si128(_mm_srli_epi16(x, 4), m15));
    }
    const __m256i q = _mm256_sub_epi32(_mm256_cvtepi8_epi32(b), _mm256_set1_epi32(8));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(q), _mm256_set1_ps(scale));
}

/* The sums of the lanes of v[0 .. n - 1] (n <= 16, a power of two), folded
 * together in halves (45 instructions for 16 sums, where one vector at a
 * time takes 16 x 8): v[i] ends in lane 4 (i % 4) + i / 4. */
FG_SIMD_AVX512_TARGET static inline __attribute__((always_inline)) __m512 fg_fold512(const __m512 *v, int n) {
    const __m512 zero = _mm512_setzero_ps();
    __m512 w[8], x[4], y[2];
    for (int i = 0; i < n / 2; i++) /* 256-bit halves: [v(2i) lo + hi, v(2i+1) lo + hi] */
        w[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44),
                             _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xEE));
    const int nw = n / 2, nx = (nw + 1) / 2, ny = (nx + 1) / 2;
    for (int i = 0; i < nx; i++) { /* 128-bit blocks: block k holds v(4i + k) */
        const __m512 b = 2 * i + 1 < nw ? w[2 * i + 1] : zero;
        x[i] = _mm512_add_ps(_mm512_shuffle_f32x4(w[2 * i], b, 0x88), _mm512_shuffle_f32x4(w[2 * i], b, 0xDD));
    }
    for (int i = 0; i < ny; i++) {
        const __m512 b = 2 * i + 1 < nx ? x[2 * i + 1] : zero;
        y[i] = _mm512_add_ps(_mm512_unpacklo_ps(x[2 * i], b), _mm512_unpackhi_ps(x[2 * i], b));
    }
    const __m512 y1 = ny > 1 ? y[1] : zero;
    const __m512d lo = _mm512_unpacklo_pd(_mm512_castps_pd(y[0]), _mm512_castps_pd(y1));
    const __m512d hi = _mm512_unpackhi_pd(_mm512_castps_pd(y[0]), _mm512_castps_pd(y1));
    return _mm512_add_ps(_mm512_castpd_ps(lo), _mm512_castpd_ps(hi));
}
/* fg_dot_rows for 16 lanes: value t enters as the input that lands in lane
 * 4 (t / per) + t % per */
FG_SIMD_AVX512_TARGET static inline __attribute__((always_inline)) void fg_hsum_rows512(const __m512 *v, int R, int hn, float *s) {
    const int n = R * hn, per = n >= 4 ? n / 4 : 1;
    if (n == 1) {
        s[0] = _mm512_reduce_add_ps(v[0]);
        return;
    }
    __m512 u[16];
    for (int t = 0; t < n; t++)
        u[4 * (t % per) + t / per] = v[(t % R) * hn + t / R];
    float z[16];
    _mm512_storeu_ps(z, fg_fold512(u, n));
    fg_dot_rows(z, per, n, R, s);
}
/* Lanes c .. c + 15 of a quantized row in place (blocks of 2^qs >= 16 values). */
FG_SIMD_AVX512_TARGET static inline __m512 fg_q8_lanes512(const unsigned char *p, int32_t c, int32_t qs, float scale) {
    const unsigned char *blk = p + (size_t)(c >> qs) * ((1u << qs) + 2);
    const __m128i b = _mm_loadu_si128((const __m128i *)(const void *)(blk + 2 + (c & ((1 << qs) - 1))));
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)), _mm512_set1_ps(scale));
}
FG_SIMD_AVX512_TARGET static inline __m512 fg_q4_lanes512(const unsigned char *p, int32_t c, int32_t qs, float scale) {
    const int32_t half = 1 << (qs - 1), o = c & ((1 << qs) - 1);
    const unsigned char *blk = p + (size_t)(c >> qs) * ((1u << (qs - 1)) + 2);
    const __m128i m15 = _mm_set1_epi8(0x0f);
    __m128i b;
    if (half >= 16) { /* the 16 lanes are one nibble of 16 bytes */
        b = _mm_loadu_si128((const __m128i *)(const void *)(blk + 2));
        if (o >= half)
            b = _mm_srli_epi16(b, 4);
        b = _mm_and_si128(b, m15);
    } else { /* blocks of 16: the low nibbles of 8 bytes, then their high ones */
        const __m128i x = _mm_loadl_epi64((const __m128i *)(const void *)(blk + 2));
        b = _mm_unpacklo_epi64(_mm_and_si128(x, m15), _mm_and_si128(_mm_srli_epi16(x, 4), m15));
    }
    const __m512i q = _mm512_sub_epi32(_mm512_cvtepi8_epi32(b), _mm512_set1_epi32(8));
    return _mm512_mul_ps(_mm512_cvtepi32_ps(q), _mm512_set1_ps(scale));
}
#endif /* FG_X86 */

/* ------------------------------------------------------------------ the mappings */
#if defined(FG_SIMD_GENERIC)
/* 8 lanes as a GCC/Clang vector: + - * work lane by lane (no FMA contraction in
 * ISO C), and the compiler maps it to whatever the target has (two SSE
 * registers on x86-64, NEON on AArch64). A struct of 8 floats did the same
 * lane by lane and took GCC 2.5 minutes to unroll. */
typedef float vec8 __attribute__((vector_size(32)));
static inline vec8 g_zero(void) { return (vec8){0}; }
static inline vec8 g_set1(float x) { return (vec8){x, x, x, x, x, x, x, x}; }
static inline vec8 g_load(const float *p) {
    vec8 r = g_zero();
    memcpy(&r, p, sizeof r);
    return r;
}
static inline void g_store(float *p, vec8 a) { memcpy(p, &a, sizeof a); }
static inline vec8 g_fma(vec8 a, vec8 b, vec8 c) { return c + a * b; }
static inline vec8 g_mul(vec8 a, vec8 b) { return a * b; }
static inline vec8 g_add(vec8 a, vec8 b) { return a + b; }
static inline vec8 g_sub(vec8 a, vec8 b) { return a - b; }
static inline vec8 g_exp(vec8 a) {
    for (int i = 0; i < 8; i++)
        a[i] = expf(a[i]);
    return a;
}
static inline vec8 g_max(vec8 a, vec8 b) {
    for (int i = 0; i < 8; i++)
        a[i] = b[i] > a[i] ? b[i] : a[i];
    return a;
}
static inline float g_hmax(vec8 a) {
    float m = a[0];
    for (int i = 1; i < 8; i++)
        m = a[i] > m ? a[i] : m;
    return m;
}
static inline float g_hsum(vec8 a) { return ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7])); }
static inline vec8 g_load_f16(const uint16_t *p) {
    vec8 r = g_zero();
    for (int i = 0; i < 8; i++)
        r[i] = fg_f16_to_f32(p[i]);
    return r;
}
static inline vec8 g_load_bf16(const uint16_t *p) {
    vec8 r = g_zero();
    for (int i = 0; i < 8; i++)
        r[i] = fg_bf16_to_f32(p[i]);
    return r;
}

/* Lanes c .. c + 7 of a quantized row (blocks of 2^qs values, c % 8 == 0)
 * whose block's scale is `scale`: q * scale, the plain definition
 * (fg_load_quant, through fg_qvalue). */
static inline vec8 g_load_q8(const unsigned char *p, int32_t c, int32_t qs, float scale) {
    const unsigned char *blk = p + (size_t)(c >> qs) * ((1u << qs) + 2);
    const int32_t o = c & ((1 << qs) - 1);
    vec8 r = g_zero();
    for (int i = 0; i < 8; i++)
        r[i] = (float)fg_qvalue(blk, FG_DTYPE_Q8_0, 1 << qs, o + i) * scale;
    return r;
}
static inline vec8 g_load_q4(const unsigned char *p, int32_t c, int32_t qs, float scale) {
    const int32_t o = c & ((1 << qs) - 1);
    const unsigned char *blk = p + (size_t)(c >> qs) * ((1u << (qs - 1)) + 2);
    vec8 r = g_zero();
    for (int i = 0; i < 8; i++)
        r[i] = (float)fg_qvalue(blk, FG_DTYPE_Q4_0, 1 << qs, o + i) * scale;
    return r;
}

#define ISAN generic
#define FG_TARGET
#define VW 8
#define VREGS 16
#define vec vec8
#define VZERO() g_zero()
#define VSET1(x) g_set1(x)
#define VLOAD(p) g_load(p)
#define VSTORE(p, v) g_store(p, v)
#define VFMA(a, b, c) g_fma(a, b, c)
#define VMUL(a, b) g_mul(a, b)
#define VSUB(a, b) g_sub(a, b)
#define VADD(a, b) g_add(a, b)
#define VEXP(v) g_exp(v)
#define VHSUM(v) g_hsum(v)
#define VMAX(a, b) g_max(a, b)
#define VHMAX(v) g_hmax(v)
#define VHSUM_ROWS(v, R, hn, s)                                                                                        \
    for (int i_ = 0; i_ < (R) * (hn); i_++)                                                                            \
    (s)[(i_ % (hn)) * FG_CPU_BLOCK + i_ / (hn)] = g_hsum((v)[i_])
#define VKEEP(v) (void)(v)
#define VLOAD_F16(p) g_load_f16(p)
#define VLOAD_BF16(p) g_load_bf16(p)
#define VLOAD_Q8(p, c, qs, s) g_load_q8(p, c, qs, s)
#define VLOAD_Q4(p, c, qs, s) g_load_q4(p, c, qs, s)
#define QSCALE(blk) fg_get_f16(blk)

#elif defined(FG_SIMD_AVX2) && defined(FG_X86)
#define ISAN avx2
#define FG_TARGET FG_SIMD_AVX2_TARGET
#define VW 8
#define VREGS 16
#define vec __m256
#define VZERO() _mm256_setzero_ps()
#define VSET1(x) _mm256_set1_ps(x)
#define VLOAD(p) _mm256_loadu_ps(p)
#define VSTORE(p, v) _mm256_storeu_ps(p, v)
#define VFMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define VMUL(a, b) _mm256_mul_ps(a, b)
#define VSUB(a, b) _mm256_sub_ps(a, b)
#define VADD(a, b) _mm256_add_ps(a, b)
#define VEXP(v) fg_exp256(v)
#define VHSUM(v) fg_hsum256(v)
#define VMAX(a, b) _mm256_max_ps(a, b)
#define VHMAX(v) fg_hmax256(v)
#define VHSUM_ROWS(v, R, hn, s) fg_hsum_rows256(v, R, hn, s)
#define VKEEP(v) __asm__("" : "+x"(v))
#define VLOAD_F16(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(p)))
#define VLOAD_BF16(p)                                                                                                  \
    _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)(p))), 16))
#define VLOAD_Q8(p, c, qs, s) fg_q8_lanes256(p, c, qs, s)
#define VLOAD_Q4(p, c, qs, s) fg_q4_lanes256(p, c, qs, s)
#define QSCALE(blk) fg_f16c_scale(blk)

#elif defined(FG_SIMD_AVX512) && defined(FG_X86)
#define ISAN avx512
#define FG_TARGET FG_SIMD_AVX512_TARGET
#define VW 16
#define VREGS 32
#define vec __m512
#define VZERO() _mm512_setzero_ps()
#define VSET1(x) _mm512_set1_ps(x)
#define VLOAD(p) _mm512_loadu_ps(p)
#define VSTORE(p, v) _mm512_storeu_ps(p, v)
#define VFMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define VMUL(a, b) _mm512_mul_ps(a, b)
#define VSUB(a, b) _mm512_sub_ps(a, b)
#define VADD(a, b) _mm512_add_ps(a, b)
#define VEXP(v) fg_exp512(v)
#define VHSUM(v) _mm512_reduce_add_ps(v)
#define VMAX(a, b) _mm512_max_ps(a, b)
#define VHMAX(v) _mm512_reduce_max_ps(v)
#define VHSUM_ROWS(v, R, hn, s) fg_hsum_rows512(v, R, hn, s)
#define VKEEP(v) __asm__("" : "+v"(v))
#define VLOAD_F16(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(p)))
#define VLOAD_BF16(p)                                                                                                  \
    _mm512_castsi512_ps(                                                                                               \
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(const void *)(p))), 16))
#define VLOAD_Q8(p, c, qs, s) fg_q8_lanes512(p, c, qs, s)
#define VLOAD_Q4(p, c, qs, s) fg_q4_lanes512(p, c, qs, s)
#define QSCALE(blk) fg_f16c_scale(blk)
#endif

#endif /* FG_SIMD_H */
