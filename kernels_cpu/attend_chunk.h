/*
 * The decode step's attention over one work item (attend_chunk.inc), one
 * instantiation per cache dtype and ISA, and what they share. Each ISA is a
 * translation unit of its own (decode_generic.c, decode_avx2.c,
 * decode_avx512.c), so the variants compile apart and in parallel; the
 * ISA's vector macros (VLOAD, VFMA, ...) are defined in its file before it
 * includes attend_chunk_dtypes.inc. kernels_cpu/decode_step.c picks one at run time.
 */
#ifndef FG_ATTEND_CHUNK_H
#define FG_ATTEND_CHUNK_H

#include <math.h>
#include <string.h>

#include "common/cpu_features.h"
#include "common/slots.h"
#include "kernels_cpu/kernels_cpu.h"
#include "kernels_cpu/simd.h"

#define CAT3_(a, b, c) a##_##b##_##c
#define CAT3(a, b, c) CAT3_(a, b, c)
#define FN(name) CAT3(fg_cpu_##name, DTN, ISAN)

/* Blocks a decode item ahead of the one it reads that it prefetches (a
 * compile-time tunable). The locality hint is measured at run time (cpu_tuning.c). */
#ifndef FG_PF_BLOCKS
#define FG_PF_BLOCKS 1
#endif

/* Asks for the cache lines of a row at p that start in bytes [from, to) of
 * it: into every cache level (t0) or non-temporally. The hint is the same
 * for a whole step, so the branch costs nothing measurable; one kernel per
 * hint would double the template's build (always inlined: GCC 12 at -O1 and
 * above dropped the calls of a prefetch-only function left to its own
 * inlining choice). */
static inline __attribute__((always_inline)) void fg_prefetch_span(const unsigned char *p, size_t from, size_t to,
                                                                     int t0) {
    for (size_t off = (from + 63) & ~(size_t)63; off < to; off += 64) {
        if (t0)
            __builtin_prefetch(p + off, 0, 3);
        else
            __builtin_prefetch(p + off, 0, 0);
    }
}

/* Slots of the block that starts at slot s: consecutive slots of one meta
 * page, at most FG_CPU_BLOCK, none past end. */
static inline int32_t fg_block_rows(int32_t s, int32_t end, int32_t P) {
    int32_t B = P - s % P;
    if (B > FG_CPU_BLOCK)
        B = FG_CPU_BLOCK;
    return B < end - s ? B : end - s;
}

/* K and V of the B slots from s: the rows their row ids name (one run of
 * consecutive rows of a page, as an unshared head keeps them, costs one
 * lookup). */
static inline void fg_block_row_ptrs(const fg_page_layout *L, void *const *pages, void *const *meta, int32_t s,
                                     int32_t B, const unsigned char **k, const unsigned char **v) {
    const int32_t *row = fg_slot_row(L, meta, s), P = L->page_tokens, r0 = row[0];
    int run = r0 % P + B <= P;
    for (int32_t j = 1; j < B && run; j++)
        run = row[j] == r0 + j;
    if (run) {
        const unsigned char *kb = fg_row_k(L, pages, r0), *vb = fg_row_v(L, pages, r0);
        for (int32_t j = 0; j < B; j++) {
            k[j] = kb + (size_t)j * L->k_row_bytes;
            v[j] = vb + (size_t)j * L->v_row_bytes;
        }
    } else {
        for (int32_t j = 0; j < B; j++) {
            k[j] = fg_row_k(L, pages, row[j]);
            v[j] = fg_row_v(L, pages, row[j]);
        }
    }
}

/* How each instantiation reads a row of its cache dtype (VLOAD*: the ISA's). */
#define ROW_F32(p, c) VLOAD((const float *)(const void *)(p) + (c))
#define ROW_F16(p, c) VLOAD_F16((const uint16_t *)(const void *)(p) + (c))
#define ROW_BF16(p, c) VLOAD_BF16((const uint16_t *)(const void *)(p) + (c))

/* The instantiations: fg_cpu_attend_chunk_<dtype>_<isa>, and _mixed_<isa>
 * for K and V in two dtypes, which widens each block's rows with
 * fg_cpu_widen_<dtype>_<isa> (the item's widen_k, widen_v). */
#define FG_ATTEND_CHUNK_ISA(isan)                                                                                      \
    fg_attend_chunk_fn fg_cpu_attend_chunk_f32_##isan, fg_cpu_attend_chunk_f16_##isan,                                 \
        fg_cpu_attend_chunk_bf16_##isan, fg_cpu_attend_chunk_q8_0_##isan, fg_cpu_attend_chunk_q4_0_##isan,            \
        fg_cpu_attend_chunk_mixed_##isan;                                                                              \
    fg_widen_row_fn fg_cpu_widen_f32_##isan, fg_cpu_widen_f16_##isan, fg_cpu_widen_bf16_##isan,                        \
        fg_cpu_widen_q8_0_##isan, fg_cpu_widen_q4_0_##isan
FG_ATTEND_CHUNK_ISA(generic);
#ifdef FG_X86
FG_ATTEND_CHUNK_ISA(avx2);
FG_ATTEND_CHUNK_ISA(avx512);
fg_attend_chunk_fn fg_cpu_attend_chunk_bf16_avx512bf16; /* bf16 rows dotted by vdpbf16ps (decode_avx512.c) */
#endif

#endif /* FG_ATTEND_CHUNK_H */
