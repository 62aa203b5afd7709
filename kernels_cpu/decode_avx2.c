/* The decode step's vector parts for AVX2 + FMA + F16C (simd.h's
 * FG_SIMD_AVX2): the attention template for every cache dtype. */
#define FG_SIMD_AVX2
#include "kernels_cpu/attend_chunk.h"
#include "kernels_cpu/score_scan.h"

#ifdef FG_X86
#include "kernels_cpu/attend_chunk_dtypes.inc"
#include "kernels_cpu/level_sums.inc"

/* 8 slots a step, the rest of a run one at a time */
__attribute__((target("avx2,fma"))) void fg_cpu_score_scan_avx2(const scan_args *g, fg_freq_scan *scan) {
    const __m256i local = _mm256_set1_epi32(FG_SLOT_LOCAL), freq = _mm256_set1_epi32(FG_SLOT_FREQUENT);
    const __m256i ws = _mm256_set1_epi32(g->window_start), t = _mm256_set1_epi32(g->t);
    const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256 keep = _mm256_set1_ps(g->keep);
    __m256 best_rank = _mm256_set1_ps(INFINITY);
    __m256i best_pos = _mm256_set1_epi32(INT32_MAX), best_slot = _mm256_set1_epi32(-1);
    for (int32_t s0 = g->begin; s0 < g->end;) {
        const scan_run r = page_run(g, s0);
        int32_t x = 0;
        for (; x + 8 <= r.rows; x += 8) {
            __m256 gained = _mm256_setzero_ps();
            for (int32_t h = 0; h < g->G; h++)
                gained = _mm256_add_ps(gained, _mm256_mul_ps(_mm256_loadu_ps(r.raw + (size_t)h * g->stride + x),
                                                             _mm256_set1_ps(g->f[h])));
            const __m256 sc = g->keep != 0.0f ? _mm256_add_ps(_mm256_mul_ps(keep, _mm256_loadu_ps(r.score + x)), gained)
                                              : _mm256_add_ps(_mm256_setzero_ps(), gained);
            _mm256_storeu_ps(r.score + x, sc);
            __m256i fl = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(r.flags + x)));
            const __m256i p = _mm256_loadu_si256((const __m256i *)(const void *)(r.pos + x));
            const __m256i leaving = _mm256_and_si256(_mm256_cmpeq_epi32(fl, local), _mm256_cmpgt_epi32(ws, p));
            for (int bits = _mm256_movemask_ps(_mm256_castsi256_ps(leaving)); bits; bits &= bits - 1)
                r.flags[x + __builtin_ctz((unsigned)bits)] = FG_SLOT_FREQUENT;
            fl = _mm256_blendv_epi8(fl, freq, leaving);
            const __m256i is_freq = _mm256_cmpeq_epi32(fl, freq);
            const int fbits = _mm256_movemask_ps(_mm256_castsi256_ps(is_freq));
            if (!fbits)
                continue;
            scan->n_freq += __builtin_popcount((unsigned)fbits);
            __m256 rank = g->mean ? _mm256_div_ps(sc, _mm256_cvtepi32_ps(_mm256_sub_epi32(t, p))) : sc;
            rank = _mm256_blendv_ps(rank, _mm256_set1_ps(-INFINITY),
                                    _mm256_cmp_ps(rank, rank, _CMP_UNORD_Q)); /* fg_rank_score: NaN ranks as -inf */
            const __m256i lower = _mm256_or_si256(
                _mm256_castps_si256(_mm256_cmp_ps(rank, best_rank, _CMP_LT_OQ)),
                _mm256_and_si256(_mm256_castps_si256(_mm256_cmp_ps(rank, best_rank, _CMP_EQ_OQ)),
                                 _mm256_cmpgt_epi32(best_pos, p)));
            const __m256i empty = _mm256_cmpgt_epi32(_mm256_setzero_si256(), best_slot); /* as ref: a lane's first
                                                                                           candidate is taken whatever its rank (NaN too) */
            const __m256i take = _mm256_and_si256(is_freq, _mm256_or_si256(lower, empty));
            best_rank = _mm256_blendv_ps(best_rank, rank, _mm256_castsi256_ps(take));
            best_pos = _mm256_blendv_epi8(best_pos, p, take);
            best_slot = _mm256_blendv_epi8(best_slot, _mm256_add_epi32(_mm256_set1_epi32(s0 + x), iota), take);
        }
        for (; x < r.rows; x++)
            score_scan_one(g, &r, s0, x, scan);
        s0 += r.rows;
    }
    float br[8];
    int32_t bp[8], bs[8];
    _mm256_storeu_ps(br, best_rank);
    _mm256_storeu_si256((__m256i *)(void *)bp, best_pos);
    _mm256_storeu_si256((__m256i *)(void *)bs, best_slot);
    for (int i = 0; i < 8; i++)
        if (bs[i] >= 0)
            fg_freq_scan_offer(scan, bs[i], br[i], bp[i]);
}
#endif
