/*
 * The page layout every layer shares, host and device: the slot flags, and
 * where K, V and each slot's metadata lie in a page. A page holds the rows of
 * one (sequence, layer, KV head).
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

/* Layout of one page: rows of one (sequence, layer, KV head).
 *   [k_offset]     K     [page_tokens] rows of row_bytes (d values as dtype)
 *   [v_offset]     V     [page_tokens] rows of row_bytes
 *   [pos_offset]   pos   [page_tokens] int32
 *   [score_offset] score [page_tokens] float
 *   [flags_offset] flags [page_tokens] uint8
 * page_bytes is a multiple of 64. */
typedef struct fg_page_layout {
    int32_t page_tokens;
    int32_t head_dim;
    fg_dtype dtype;
    size_t row_bytes; /* fg_row_bytes(dtype, head_dim) */
    size_t k_offset, v_offset, pos_offset, score_offset, flags_offset;
    size_t page_bytes;
} fg_page_layout;

static inline size_t fg_align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

/* Layout of a page for the given shape and storage type. */
static inline fg_page_layout fg_page_layout_make(int32_t page_tokens, int32_t head_dim, fg_dtype dtype) {
    fg_page_layout L;
    L.row_bytes = fg_row_bytes(dtype, head_dim);
    size_t rows = (size_t)page_tokens * L.row_bytes;
    L.page_tokens = page_tokens;
    L.head_dim = head_dim;
    L.dtype = dtype;
    L.k_offset = 0;
    L.v_offset = fg_align_up(rows, 64);
    L.pos_offset = L.v_offset + fg_align_up(rows, 64);
    L.score_offset = L.pos_offset + fg_align_up((size_t)page_tokens * sizeof(int32_t), 16);
    L.flags_offset = L.score_offset + fg_align_up((size_t)page_tokens * sizeof(float), 16);
    L.page_bytes = fg_align_up(L.flags_offset + (size_t)page_tokens, 64);
    return L;
}

#ifdef __cplusplus
}
#endif

#endif /* FG_LAYOUT_H */
