/*
 * Step 3 of the cpu decode step (kernels_cpu/decode_step.c) for the slots of one
 * work item, fused: each slot's score grows by its pooled attention, a window
 * row that fell out of the window becomes a frequent candidate, and the
 * candidates are counted and the lowest-ranked found. What the variants
 * share is here; each ISA's variant is in its decode_<isa>.c.
 */
#ifndef FG_SCORE_SCAN_H
#define FG_SCORE_SCAN_H

#include "common/rules.h"
#include "common/slots.h"
#include "kernels_cpu/kernels_cpu.h"

/* Step 3 of the header for the slots of one work item, fused: each slot's
 * score grows by its pooled attention (score = keep * score + sum_h raw[h]
 * f[h], the old score left out when keep is 0, the same operations in the
 * same order in every variant, so every ISA gives the same bits), a window row that fell out of the window becomes a
 * frequent candidate, and the candidates are counted and the lowest-ranked
 * (rank, then position) found. The vector variants keep a lowest-ranked
 * candidate per lane over the whole item and offer them to the scan at the
 * end: the minimum of (rank, position) is unique, so the order of the offers
 * does not matter. */
typedef struct scan_args {
    const fg_page_layout *layout;
    void *const *meta;
    const float *raw; /* raw[h * stride + (s - begin)]: slot s's e^(score - m_item[h]) */
    size_t stride;
    int32_t begin, end;
    const float *f; /* [G] each head's factor: e^(m_item - M) / (L G) */
    int32_t G;
    float keep; /* 0: FG_SCORE_LAST (the scores become this step's), 1: they add up */
    int mean;   /* FG_SCORE_MEAN: rank by score / age */
    int32_t t;  /* the sequence length after this step */
    int32_t window_start;
} scan_args;

typedef void score_scan_fn(const scan_args *g, fg_freq_scan *scan);
score_scan_fn fg_cpu_score_scan_generic;
#ifdef FG_X86
score_scan_fn fg_cpu_score_scan_avx2, fg_cpu_score_scan_avx512;
#endif

/* The slots of one meta page from slot s0 on: their metadata and raw scores. */
typedef struct scan_run {
    float *score;
    uint8_t *flags;
    const int32_t *pos;
    const float *raw;
    int32_t rows;
} scan_run;

static inline scan_run page_run(const scan_args *g, int32_t s0) {
    const fg_page_layout *L = g->layout;
    const int32_t P = L->page_tokens, j0 = s0 % P;
    fg_prefetch_meta(L, g->meta, g->end, s0 / P + FG_META_AHEAD);
    unsigned char *page = g->meta[s0 / P];
    const scan_run r = {(float *)(void *)(page + L->score_offset) + j0, page + L->flags_offset + j0,
                        (const int32_t *)(const void *)(page + L->pos_offset) + j0, g->raw + (s0 - g->begin),
                        g->end - s0 < P - j0 ? g->end - s0 : P - j0};
    return r;
}

/* Slot s0 + x of a run (the generic variant, and the others' tails). */
static inline void score_scan_one(const scan_args *g, const scan_run *r, int32_t s0, int32_t x, fg_freq_scan *scan) {
    float gained = 0.0f; /* one operation a statement, so that clang's default contraction (within an
                            expression) fuses nothing the vectors do not; GCC fuses none in ISO C (c_std=c11) */
    for (int32_t h = 0; h < g->G; h++) {
        const float part = r->raw[(size_t)h * g->stride + x] * g->f[h];
        gained += part;
    }
    const float kept = g->keep != 0.0f ? g->keep * r->score[x] : 0.0f; /* FG_SCORE_LAST: the old score goes,
                                                                           a NaN or an inf too */
    const float sc = kept + gained;
    r->score[x] = sc;
    if (fg_leaves_window(r->flags[x], r->pos[x], g->window_start))
        r->flags[x] = FG_SLOT_FREQUENT;
    if (r->flags[x] != FG_SLOT_FREQUENT)
        return;
    scan->n_freq++;
    const float rank = fg_rank_score(g->mean ? FG_SCORE_MEAN : FG_SCORE_SUM, sc, r->pos[x], g->t);
    fg_freq_scan_offer(scan, s0 + x, rank, r->pos[x]);
}

#endif /* FG_SCORE_SCAN_H */
