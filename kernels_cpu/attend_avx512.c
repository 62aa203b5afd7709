/* The attention kernel for AVX-512 (F, BW for the 16-bit widening, DQ, VL),
 * and its bf16 variant for AVX-512 BF16 (attend_chunk.h). */
#include "kernels_cpu/attend_chunk.h"

#ifdef FG_X86
#define ISAN avx512
#define FG_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")))
FG_TARGET static inline __m512 exp512(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.33654f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    x = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    x = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), x);
    __m512 y = _mm512_set1_ps(1.9875691500e-4f);
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.3981999507e-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(8.3334519073e-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(4.1665795894e-2f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.6666665459e-1f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(5.0000001201e-1f));
    y = _mm512_fmadd_ps(y, _mm512_mul_ps(x, x), _mm512_add_ps(x, _mm512_set1_ps(1.0f)));
    __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(y, _mm512_castsi512_ps(e));
}
/* The sums of the lanes of v[0 .. n - 1] (n <= 16, a power of two), folded
 * together in halves (45 instructions for 16 sums, where one vector at a
 * time takes 16 x 8): v[i] ends in lane 4 (i % 4) + i / 4. */
FG_TARGET static inline __attribute__((always_inline)) __m512 fold512(const __m512 *v, int n) {
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
FG_TARGET static inline __attribute__((always_inline)) void hsum_rows512(const __m512 *v, int R, int hn, float *s) {
    const int n = R * hn, per = n >= 4 ? n / 4 : 1;
    if (n == 1) {
        s[0] = _mm512_reduce_add_ps(v[0]);
        return;
    }
    __m512 u[16];
    for (int t = 0; t < n; t++)
        u[4 * (t % per) + t / per] = v[(t % R) * hn + t / R];
    float z[16];
    _mm512_storeu_ps(z, fold512(u, n));
    fg_dot_rows(z, per, n, R, s);
}
/* Lanes c .. c + 15 of a quantized row in place (blocks of 2^qs >= 16 values). */
FG_TARGET static inline __m512 q8_lanes512(const unsigned char *p, int32_t c, int32_t qs, float scale) {
    const unsigned char *blk = p + (size_t)(c >> qs) * ((1u << qs) + 2);
    const __m128i b = _mm_loadu_si128((const __m128i *)(const void *)(blk + 2 + (c & ((1 << qs) - 1))));
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)), _mm512_set1_ps(scale));
}
FG_TARGET static inline __m512 q4_lanes512(const unsigned char *p, int32_t c, int32_t qs, float scale) {
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
#define VEXP(v) exp512(v)
#define VHSUM(v) _mm512_reduce_add_ps(v)
#define VMAX(a, b) _mm512_max_ps(a, b)
#define VHMAX(v) _mm512_reduce_max_ps(v)
#define VHSUM_ROWS(v, R, hn, s) hsum_rows512(v, R, hn, s)
#define VKEEP(v) __asm__("" : "+v"(v))
#define VLOAD_F16(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(p)))
#define VLOAD_BF16(p)                                                                                                  \
    _mm512_castsi512_ps(                                                                                               \
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(const void *)(p))), 16))
#define VLOAD_Q8(p, c, qs, s) q8_lanes512(p, c, qs, s)
#define VLOAD_Q4(p, c, qs, s) q4_lanes512(p, c, qs, s)
#define QSCALE(blk) fg_f16c_scale(blk)
#define FG_KEEP_ISA
#include "kernels_cpu/attend_chunk_dtypes.inc"
#undef FG_KEEP_ISA

/* AVX-512 BF16 (Zen 4/5, Cooper Lake, Sapphire Rapids and later): bf16 rows
 * dotted with vdpbf16ps against the query rounded to bf16, two exact bf16
 * products per lane and instruction where an FMA does one; the V pass as in
 * AVX-512. Scores then differ from ref by the query's rounding: at most
 * 2^-9 of sum_c |q_c k_c| / sqrt(d) each. */
#undef ISAN
#undef FG_TARGET
#define ISAN avx512bf16
#define FG_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma,f16c")))
#define FG_DOT_BF16 1
#define DTN bf16
#define ROW_IS_F32 0
#define ROW(p, c) ROW_BF16(p, c)
#define COL_BYTES(c) ((size_t)(c) * 2)
#include "kernels_cpu/attend_chunk.inc"
#undef DTN
#undef ROW_IS_F32
#undef ROW
#undef COL_BYTES
#undef FG_DOT_BF16
#include "kernels_cpu/attend_chunk_isa_end.inc"
#endif /* FG_X86 */
