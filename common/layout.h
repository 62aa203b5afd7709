/*
 * The page layout every layer shares, host and device: the slot flags, and
 * where K, V and each slot's metadata lie. A page holds entries of one
 * (sequence, layer, KV head).
 */
#ifndef FG_LAYOUT_H
#define FG_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#include "common/dtype.h"
#include "fastgen.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Slot flags: which component keeps a cached row (same bits as FG_KEEP_*). */
enum {
    FG_SLOT_SPECIAL = FG_KEEP_SPECIAL,
    FG_SLOT_PUNCT = FG_KEEP_PUNCT,
    FG_SLOT_FREQUENT = FG_KEEP_FREQUENT,
    FG_SLOT_LOCAL = FG_KEEP_LOCAL,
    FG_SLOT_FULL = FG_KEEP_FULL,
    FG_SLOT_SNAPSHOT = FG_KEEP_SNAPSHOT /* kept for good: no decode step touches it */
};

/* A head's cache lies in two kinds of pages, both page_tokens entries long,
 * in two page tables of the same length:
 *   row pages  [k_offset] K [page_tokens] rows of k_row_bytes (d values as k_dtype)
 *              [v_offset] V [page_tokens] rows of v_row_bytes (d values as v_dtype)
 *   meta pages [pos_offset]   pos   [page_tokens] int32
 *              [score_offset] score [page_tokens] float
 *              [row_offset]   row   [page_tokens] int32: where the slot's K/V lie
 *              [flags_offset] flags [page_tokens] uint8
 *              [hdr_offset]   int32 hw, nfree (meaningful in meta page 0)
 * Slot s's metadata is entry s % page_tokens of meta page s / page_tokens;
 * its K and V are row r = row[s] of the row pages (row r % page_tokens of
 * row page r / page_tokens). Rows never move when a slot is evicted; only
 * metadata does, so forks share their row pages and copy only the small
 * meta pages (common/slots.h has the bookkeeping). Both page sizes are
 * multiples of 64. */
typedef struct fg_page_layout {
    int32_t page_tokens;
    int32_t head_dim;
    fg_dtype k_dtype, v_dtype;     /* K's and V's storage (the same unless the context set them apart) */
    size_t k_row_bytes, v_row_bytes; /* fg_row_bytes(k_dtype, head_dim), fg_row_bytes(v_dtype, head_dim) */
    size_t k_offset, v_offset;
    size_t page_bytes; /* a row page */
    size_t pos_offset, score_offset, row_offset, flags_offset, hdr_offset;
    size_t meta_bytes; /* a meta page */
} fg_page_layout;

static inline size_t fg_align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

/* Layout of both pages for the given shape and storage types. */
static inline fg_page_layout fg_page_layout_make(int32_t page_tokens, int32_t head_dim, fg_dtype k_dtype,
                                                 fg_dtype v_dtype) {
    fg_page_layout L;
    L.k_row_bytes = fg_row_bytes(k_dtype, head_dim);
    L.v_row_bytes = fg_row_bytes(v_dtype, head_dim);
    L.page_tokens = page_tokens;
    L.head_dim = head_dim;
    L.k_dtype = k_dtype;
    L.v_dtype = v_dtype;
    L.k_offset = 0;
    L.v_offset = fg_align_up((size_t)page_tokens * L.k_row_bytes, 64);
    L.page_bytes = L.v_offset + fg_align_up((size_t)page_tokens * L.v_row_bytes, 64);
    const size_t words = fg_align_up((size_t)page_tokens * 4, 16);
    L.pos_offset = 0;
    L.score_offset = words;
    L.row_offset = 2 * words;
    L.flags_offset = 3 * words;
    L.hdr_offset = L.flags_offset + fg_align_up((size_t)page_tokens, 16);
    L.meta_bytes = fg_align_up(L.hdr_offset + 2 * sizeof(int32_t), 64);
    return L;
}

#ifdef __cplusplus
}
#endif

#endif /* FG_LAYOUT_H */
