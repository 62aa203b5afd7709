/*
 * Host-side access to one head's paged slots (see fg_page_layout). Slot s
 * lives in page s / page_tokens, row s % page_tokens.
 */
#ifndef FG_SLOTS_H
#define FG_SLOTS_H

#include "common/dtype.h"
#include "common/layout.h"

typedef struct fg_slot_ref {
    unsigned char *page;
    int32_t row;
} fg_slot_ref;

static inline fg_slot_ref fg_slot(const fg_page_layout *L, void *const *pages, int32_t s) {
    fg_slot_ref r = {(unsigned char *)pages[s / L->page_tokens], s % L->page_tokens};
    return r;
}

static inline void *fg_slot_k(const fg_page_layout *L, fg_slot_ref r) {
    return r.page + L->k_offset + (size_t)r.row * L->row_bytes;
}
static inline void *fg_slot_v(const fg_page_layout *L, fg_slot_ref r) {
    return r.page + L->v_offset + (size_t)r.row * L->row_bytes;
}
static inline int32_t *fg_slot_pos(const fg_page_layout *L, fg_slot_ref r) {
    return (int32_t *)(void *)(r.page + L->pos_offset) + r.row;
}
static inline float *fg_slot_score(const fg_page_layout *L, fg_slot_ref r) {
    return (float *)(void *)(r.page + L->score_offset) + r.row;
}
static inline uint8_t *fg_slot_flags(const fg_page_layout *L, fg_slot_ref r) {
    return r.page + L->flags_offset + r.row;
}

/* Copies slot `from` over slot `to` (K, V and metadata). */
static inline void fg_slot_move(const fg_page_layout *L, void *const *pages, int32_t to, int32_t from) {
    fg_slot_ref a = fg_slot(L, pages, to), b = fg_slot(L, pages, from);
    memcpy(fg_slot_k(L, a), fg_slot_k(L, b), L->row_bytes);
    memcpy(fg_slot_v(L, a), fg_slot_v(L, b), L->row_bytes);
    *fg_slot_pos(L, a) = *fg_slot_pos(L, b);
    *fg_slot_score(L, a) = *fg_slot_score(L, b);
    *fg_slot_flags(L, a) = *fg_slot_flags(L, b);
}

/* Writes a row with its metadata into slot s. */
static inline void fg_slot_write(const fg_page_layout *L, void *const *pages, int32_t s, const float *k,
                                 const float *v, int32_t pos, uint8_t flags, float score) {
    fg_slot_ref r = fg_slot(L, pages, s);
    fg_store_row(fg_slot_k(L, r), L->dtype, k, L->head_dim);
    fg_store_row(fg_slot_v(L, r), L->dtype, v, L->head_dim);
    *fg_slot_pos(L, r) = pos;
    *fg_slot_score(L, r) = score;
    *fg_slot_flags(L, r) = flags;
}

#endif /* FG_SLOTS_H */
