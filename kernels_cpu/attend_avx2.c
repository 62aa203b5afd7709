/* The attention kernel for AVX2 + FMA + F16C (attend_chunk.h). */
#include "kernels_cpu/attend_chunk.h"

#ifdef FG_X86
#include "kernels_cpu/exp_avx2.h"

#define ISAN avx2
#define FG_TARGET __attribute__((target("avx2,fma,f16c")))
FG_TARGET static inline float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
FG_TARGET static inline float hmax256(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
/* The sums of the lanes of v[0 .. n - 1] (n <= 8, a power of two), folded
 * together in halves (21 instructions for 8 sums, where one vector at a time
 * takes 8 x 6): v[i] ends in lane 4 (i % 2) + i / 2. */
FG_TARGET static inline __attribute__((always_inline)) __m256 fold256(const __m256 *v, int n) {
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
FG_TARGET static inline __attribute__((always_inline)) void hsum_rows256(const __m256 *v, int R, int hn, float *s) {
    const int n = R * hn, per = n >= 2 ? n / 2 : 1;
    if (n == 1) {
        s[0] = hsum256(v[0]);
        return;
    }
    __m256 u[8];
    for (int t = 0; t < n; t++)
        u[2 * (t % per) + t / per] = v[(t % R) * hn + t / R];
    float z[8];
    _mm256_storeu_ps(z, fold256(u, n));
    fg_dot_rows(z, per, n, R, s);
}
/* Lanes c .. c + 7 of a quantized row in place (blocks of 2^qs values, c % 8
 * == 0, so the lanes lie in one block): the values widened to fp32, times
 * the block's scale. */
FG_TARGET static inline __m256 q8_lanes256(const unsigned char *p, int32_t c, int32_t qs, float scale) {
    const unsigned char *blk = p + (size_t)(c >> qs) * ((1u << qs) + 2);
    const __m128i b = _mm_loadl_epi64((const __m128i *)(const void *)(blk + 2 + (c & ((1 << qs) - 1))));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)), _mm256_set1_ps(scale));
}
FG_TARGET static inline __m256 q4_lanes256(const unsigned char *p, int32_t c, int32_t qs, float scale) {
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
#define VHSUM(v) hsum256(v)
#define VMAX(a, b) _mm256_max_ps(a, b)
#define VHMAX(v) hmax256(v)
#define VHSUM_ROWS(v, R, hn, s) hsum_rows256(v, R, hn, s)
#define VKEEP(v) __asm__("" : "+x"(v))
#define VLOAD_F16(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(p)))
#define VLOAD_BF16(p)                                                                                                  \
    _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)(p))), 16))
#define VLOAD_Q8(p, c, qs, s) q8_lanes256(p, c, qs, s)
#define VLOAD_Q4(p, c, qs, s) q4_lanes256(p, c, qs, s)
#define QSCALE(blk) fg_f16c_scale(blk)
#include "kernels_cpu/attend_chunk_dtypes.inc"
#endif /* FG_X86 */
