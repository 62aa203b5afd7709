/*
 * Steps 3-4 of a decode step (docs/design.md §2.5) for one head, written once
 * for every backend whose memory the host can read (ref, cpu): insert the new
 * token, let window rows that left the window become frequent candidates (or
 * go), then evict the lowest-ranked candidates down to k(t). Also the mean of
 * a group's scores (FG_ALLOC_LAYER). The GPU's block-wide version
 * (kernels_cuda/decode_step.cu) is a specialisation that test_backend_ops
 * checks against this one; tests/support/sim.h stays the independent oracle.
 *
 * A backend runs steps 1-2 (attention, the score update) its own way and
 * then calls fg_decode_finish_head; one that walks the slots while it
 * updates their scores can hand over the scan it made on the way
 * (fg_freq_scan_offer, fg_freq_scan_merge) and save a pass.
 */
#ifndef FG_DECODE_POLICY_H
#define FG_DECODE_POLICY_H

#include "backends/backend.h"
#include "common/rules.h"

/* Steps 4a-b over a range of a tracking head's slots: window rows that
 * left the window become frequent candidates, and the candidates are
 * counted and the lowest-ranked found. Scans of consecutive ranges merge
 * into the scan of their union, in any order: the minimum of (rank,
 * position) is unique. */
typedef struct fg_freq_scan {
    int32_t n_freq; /* candidates */
    int32_t worst;  /* the lowest-ranked candidate's slot, -1 when none */
    int32_t worst_pos;
    float worst_rank;
} fg_freq_scan;
#define FG_FREQ_SCAN_EMPTY ((fg_freq_scan){0, -1, 0, 0.0f})

static inline void fg_freq_scan_offer(fg_freq_scan *scan, int32_t slot, float rank, int32_t pos) {
    if (scan->worst < 0 || fg_ranks_below(rank, pos, scan->worst_rank, scan->worst_pos)) {
        scan->worst = slot;
        scan->worst_rank = rank;
        scan->worst_pos = pos;
    }
}

static inline void fg_freq_scan_merge(fg_freq_scan *into, const fg_freq_scan *from) {
    into->n_freq += from->n_freq;
    if (from->worst >= 0)
        fg_freq_scan_offer(into, from->worst, from->worst_rank, from->worst_pos);
}

/* Asks for the metadata (positions, scores, rows, flags) of meta page
 * `index` of a head, unless it starts at or past slot `end`. The walks over
 * a head's metadata touch a few lines every page, too far apart for the
 * hardware prefetcher, so they ask FG_META_AHEAD pages ahead. */
#define FG_META_AHEAD 4
static inline void fg_prefetch_meta(const fg_page_layout *L, void *const *meta, int32_t end, int32_t index) {
    if ((int64_t)index * L->page_tokens >= end)
        return;
    const unsigned char *page = (const unsigned char *)meta[index];
    for (size_t off = 0; off < L->meta_bytes; off += 64)
        __builtin_prefetch(page + off, 1, 3);
}

/* Steps 4a-b over slots [begin, end) of a head that tracks scores, into scan. */
void fg_freq_scan_range(const fg_page_layout *layout, const fg_decode_head *head, int32_t begin, int32_t end,
                        fg_freq_scan *scan);

/* Steps 3-4 once attention and the score update are done; new_score: the
 * new token's pooled self-attention. `scanned`, or NULL: the scan of the
 * head's slots [0, n_slots), made after their score update (a head that
 * tracks scores only). FG_ERR_INTERNAL when the head ends with a slot count
 * other than the host's mirror (n_slots_after). */
fg_status fg_decode_finish_head(const fg_page_layout *layout, const fg_decode_head *head, float new_score,
                                const fg_freq_scan *scanned);

/* A group of heads that rank together (FG_ALLOC_LAYER), after their steps
 * 1-2: every slot's score becomes the group's mean (summed in head order,
 * then divided by the group's size). Returns 0, or the first head that does
 * not hold the first one's positions (nothing written past that slot). */
int32_t fg_decode_share_scores(const fg_page_layout *layout, const fg_decode_head *heads, int32_t n_heads);

#endif /* FG_DECODE_POLICY_H */
