/*
 * Access to one head's slots (see fg_page_layout), host and device, and the
 * bookkeeping of its rows that every backend shares.
 *
 * Slots [0, n) are the kept rows, dense, in the order the kernels visit
 * them; slot s names its row r = row[s]. Rows live in the row pages and do
 * not move when a slot goes, unless the bookkeeping below moves one into a
 * row it may write. A head's rows below `priv_from` may be shared with a
 * fork: no step writes them. The rows at or above it that no slot holds are
 * the free list, kept in the row entries of the slots past the end:
 * row[n .. n + nfree). New rows come from it, else from the high water mark
 * hw (rows [priv_from, hw) are either kept or free). Both counters live in
 * meta page 0; `row_base` (>= 0) resets them: hw = row_base, nfree = 0.
 *
 * A head that shares nothing (priv_from 0) keeps row[s] = s: compaction
 * writes row s for slot s, a new slot n takes row n, and removing slot s
 * moves row n - 1 into row s (as a dense cache would), freeing row n - 1.
 */
#ifndef FG_SLOTS_H
#define FG_SLOTS_H

#include <string.h>

#include "common/dtype.h"
#include "common/layout.h"

/* ---- metadata of slot s */

static inline FG_HD unsigned char *fg_meta_at(const fg_page_layout *L, void *const *meta, int32_t s, size_t off,
                                              size_t size) {
    return (unsigned char *)meta[s / L->page_tokens] + off + (size_t)(s % L->page_tokens) * size;
}
static inline FG_HD int32_t *fg_slot_pos(const fg_page_layout *L, void *const *meta, int32_t s) {
    return (int32_t *)(void *)fg_meta_at(L, meta, s, L->pos_offset, sizeof(int32_t));
}
static inline FG_HD float *fg_slot_score(const fg_page_layout *L, void *const *meta, int32_t s) {
    return (float *)(void *)fg_meta_at(L, meta, s, L->score_offset, sizeof(float));
}
static inline FG_HD int32_t *fg_slot_row(const fg_page_layout *L, void *const *meta, int32_t s) {
    return (int32_t *)(void *)fg_meta_at(L, meta, s, L->row_offset, sizeof(int32_t));
}
static inline FG_HD uint8_t *fg_slot_flags(const fg_page_layout *L, void *const *meta, int32_t s) {
    return fg_meta_at(L, meta, s, L->flags_offset, 1);
}
/* hw and nfree (meta page 0). */
static inline FG_HD int32_t *fg_rows_header(const fg_page_layout *L, void *const *meta) {
    return (int32_t *)(void *)((unsigned char *)meta[0] + L->hdr_offset);
}

/* ---- K and V of row r */

static inline FG_HD unsigned char *fg_row_k(const fg_page_layout *L, void *const *rows, int32_t r) {
    return (unsigned char *)rows[r / L->page_tokens] + L->k_offset + (size_t)(r % L->page_tokens) * L->k_row_bytes;
}
static inline FG_HD unsigned char *fg_row_v(const fg_page_layout *L, void *const *rows, int32_t r) {
    return (unsigned char *)rows[r / L->page_tokens] + L->v_offset + (size_t)(r % L->page_tokens) * L->v_row_bytes;
}
/* K and V of slot s. */
static inline FG_HD unsigned char *fg_slot_k(const fg_page_layout *L, void *const *rows, void *const *meta, int32_t s) {
    return fg_row_k(L, rows, *fg_slot_row(L, meta, s));
}
static inline FG_HD unsigned char *fg_slot_v(const fg_page_layout *L, void *const *rows, void *const *meta, int32_t s) {
    return fg_row_v(L, rows, *fg_slot_row(L, meta, s));
}

/* ---- the bookkeeping of a step (one thread: the caller copies the rows) */

static inline FG_HD void fg_rows_reset(const fg_page_layout *L, void *const *meta, int32_t row_base) {
    int32_t *hdr = fg_rows_header(L, meta);
    hdr[0] = row_base;
    hdr[1] = 0;
}

/* The row of a new slot n (the first free row, else a fresh one), which
 * row[n] then names. */
static inline FG_HD int32_t fg_rows_take(const fg_page_layout *L, void *const *meta, int32_t n) {
    int32_t *hdr = fg_rows_header(L, meta), *row = fg_slot_row(L, meta, n);
    if (hdr[1] > 0) {
        hdr[1]--;
        return *row;
    }
    *row = hdr[0]++;
    return *row;
}

/* Removes slot s of n: the last slot's metadata moves into s. When s's row
 * may be written, the last slot's row moves into it (returns the row to
 * copy from, *to the row to copy to; -1: no copy) and the last row is the
 * one freed; else s's own row is. A freed row the head may write joins the
 * free list; one it shares is left to its other owners. */
static inline FG_HD int32_t fg_rows_remove(const fg_page_layout *L, void *const *meta, int32_t s, int32_t n,
                                           int32_t priv_from, int32_t *to) {
    const int32_t last = n - 1, r = *fg_slot_row(L, meta, s), rl = *fg_slot_row(L, meta, last);
    int32_t from = -1, freed = r;
    *to = -1;
    if (s != last) {
        *fg_slot_pos(L, meta, s) = *fg_slot_pos(L, meta, last);
        *fg_slot_score(L, meta, s) = *fg_slot_score(L, meta, last);
        *fg_slot_flags(L, meta, s) = *fg_slot_flags(L, meta, last);
        if (r >= priv_from) {
            from = rl;
            *to = r;
            freed = rl;
        } else {
            *fg_slot_row(L, meta, s) = rl;
        }
    }
    int32_t *hdr = fg_rows_header(L, meta);
    if (freed >= priv_from) {
        *fg_slot_row(L, meta, last) = freed;
        hdr[1]++;
    } else if (hdr[1] > 0) {
        *fg_slot_row(L, meta, last) = *fg_slot_row(L, meta, last + hdr[1]);
    }
    return from;
}

/* ---- host helpers over both */

/* Writes a new slot n: its row (fg_rows_take) and metadata. */
static inline void fg_slot_write(const fg_page_layout *L, void *const *rows, void *const *meta, int32_t n,
                                 const float *k, const float *v, int32_t pos, uint8_t flags, float score) {
    const int32_t r = fg_rows_take(L, meta, n);
    fg_store_row(fg_row_k(L, rows, r), L->k_dtype, k, L->head_dim);
    fg_store_row(fg_row_v(L, rows, r), L->v_dtype, v, L->head_dim);
    *fg_slot_pos(L, meta, n) = pos;
    *fg_slot_score(L, meta, n) = score;
    *fg_slot_flags(L, meta, n) = flags;
}

/* Removes slot s of n (fg_rows_remove, with its copy). Returns n - 1. */
static inline int32_t fg_slot_remove(const fg_page_layout *L, void *const *rows, void *const *meta, int32_t s,
                                     int32_t n, int32_t priv_from) {
    int32_t to;
    const int32_t from = fg_rows_remove(L, meta, s, n, priv_from, &to);
    if (from >= 0) {
        memcpy(fg_row_k(L, rows, to), fg_row_k(L, rows, from), L->k_row_bytes);
        memcpy(fg_row_v(L, rows, to), fg_row_v(L, rows, from), L->v_row_bytes);
    }
    return n - 1;
}

/* Compaction: slot s of a new cache, in row s. */
static inline void fg_slot_write_at(const fg_page_layout *L, void *const *rows, void *const *meta, int32_t s,
                                    const float *k, const float *v, int32_t pos, uint8_t flags, float score) {
    fg_store_row(fg_row_k(L, rows, s), L->k_dtype, k, L->head_dim);
    fg_store_row(fg_row_v(L, rows, s), L->v_dtype, v, L->head_dim);
    *fg_slot_pos(L, meta, s) = pos;
    *fg_slot_score(L, meta, s) = score;
    *fg_slot_row(L, meta, s) = s;
    *fg_slot_flags(L, meta, s) = flags;
}

#endif /* FG_SLOTS_H */
