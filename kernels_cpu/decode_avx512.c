/* The decode step's vector parts for AVX-512 (F, BW for the 16-bit
 * widening, DQ, VL; simd.h's FG_SIMD_AVX512): the attention template for
 * every cache dtype, and its bf16 variant for AVX-512 BF16. */
#define FG_SIMD_AVX512
#include "kernels_cpu/attend_chunk.h"
#include "kernels_cpu/score_scan.h"

#ifdef FG_X86
#include "kernels_cpu/attend_chunk_dtypes.inc"
#include "kernels_cpu/level_sums.inc"

/* 16 slots a step, the last of a run masked */
__attribute__((target("avx512f,avx512bw,avx512vl"))) void fg_cpu_score_scan_avx512(const scan_args *g,
                                                                                    fg_freq_scan *scan) {
    const __m512i local = _mm512_set1_epi32(FG_SLOT_LOCAL), freq = _mm512_set1_epi32(FG_SLOT_FREQUENT);
    const __m512i ws = _mm512_set1_epi32(g->window_start), t = _mm512_set1_epi32(g->t);
    const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512 keep = _mm512_set1_ps(g->keep);
    __m512 best_rank = _mm512_set1_ps(INFINITY);
    __m512i best_pos = _mm512_set1_epi32(INT32_MAX), best_slot = _mm512_set1_epi32(-1);
    for (int32_t s0 = g->begin; s0 < g->end;) {
        const scan_run r = page_run(g, s0);
        for (int32_t x = 0; x < r.rows; x += 16) {
            const __mmask16 m = r.rows - x >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (r.rows - x)) - 1);
            __m512 gained = _mm512_setzero_ps();
            for (int32_t h = 0; h < g->G; h++)
                gained = _mm512_add_ps(gained,
                                       _mm512_mul_ps(_mm512_maskz_loadu_ps(m, r.raw + (size_t)h * g->stride + x),
                                                     _mm512_set1_ps(g->f[h])));
            const __m512 sc = g->keep != 0.0f
                                  ? _mm512_add_ps(_mm512_mul_ps(keep, _mm512_maskz_loadu_ps(m, r.score + x)), gained)
                                  : _mm512_add_ps(_mm512_setzero_ps(), gained);
            _mm512_mask_storeu_ps(r.score + x, m, sc);
            __m512i fl = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(m, r.flags + x));
            const __m512i p = _mm512_maskz_loadu_epi32(m, r.pos + x);
            const __mmask16 leaving = _mm512_mask_cmpeq_epi32_mask(m, fl, local) & _mm512_cmplt_epi32_mask(p, ws);
            if (leaving) {
                fl = _mm512_mask_mov_epi32(fl, leaving, freq);
                _mm_mask_storeu_epi8(r.flags + x, leaving, _mm512_cvtepi32_epi8(fl));
            }
            const __mmask16 is_freq = _mm512_mask_cmpeq_epi32_mask(m, fl, freq);
            if (!is_freq)
                continue;
            scan->n_freq += __builtin_popcount((unsigned)is_freq);
            __m512 rank = g->mean ? _mm512_div_ps(sc, _mm512_cvtepi32_ps(_mm512_sub_epi32(t, p))) : sc;
            rank = _mm512_mask_mov_ps(rank, _mm512_cmp_ps_mask(rank, rank, _CMP_UNORD_Q),
                                      _mm512_set1_ps(-INFINITY)); /* fg_rank_score: NaN ranks as -inf */
            const __mmask16 empty = _mm512_cmplt_epi32_mask(best_slot, _mm512_setzero_si512()); /* as ref: a lane's
                                                                     first candidate is taken whatever its rank (NaN too) */
            const __mmask16 take =
                is_freq & (empty | _mm512_cmp_ps_mask(rank, best_rank, _CMP_LT_OQ) |
                           (_mm512_cmp_ps_mask(rank, best_rank, _CMP_EQ_OQ) & _mm512_cmplt_epi32_mask(p, best_pos)));
            best_rank = _mm512_mask_mov_ps(best_rank, take, rank);
            best_pos = _mm512_mask_mov_epi32(best_pos, take, p);
            best_slot = _mm512_mask_mov_epi32(best_slot, take, _mm512_add_epi32(_mm512_set1_epi32(s0 + x), iota));
        }
        s0 += r.rows;
    }
    float br[16];
    int32_t bp[16], bs[16];
    _mm512_storeu_ps(br, best_rank);
    _mm512_storeu_si512(bp, best_pos);
    _mm512_storeu_si512(bs, best_slot);
    for (int i = 0; i < 16; i++)
        if (bs[i] >= 0)
            fg_freq_scan_offer(scan, bs[i], br[i], bp[i]);
}

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
#endif /* FG_X86 */
