/* The decode step's vector parts in portable C (simd.h's FG_SIMD_GENERIC: 8
 * lanes of a compiler vector), for CPUs without AVX2 and other
 * architectures: the attention template for every cache dtype. */
#define FG_SIMD_GENERIC
#include "kernels_cpu/attend_chunk.h"
#include "kernels_cpu/score_scan.h"

#include "kernels_cpu/attend_chunk_dtypes.inc"
#include "kernels_cpu/level_sums.inc"

void fg_cpu_score_scan_generic(const scan_args *g, fg_freq_scan *scan) {
    for (int32_t s0 = g->begin; s0 < g->end;) {
        const scan_run r = page_run(g, s0);
        for (int32_t x = 0; x < r.rows; x++)
            score_scan_one(g, &r, s0, x, scan);
        s0 += r.rows;
    }
}
