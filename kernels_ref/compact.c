/* Gathers the kept prompt rows of each head into its pages (docs/design.md §2.4). */
#include "kernels_ref/kernels_ref.h"
#include "common/slots.h"

void fg_ref_compact_head(const fg_page_layout *layout, const fg_shape *shape,
                         const float *k,               /* [n][Hkv][d] */
                         const float *v,               /* [n][Hkv][d] */
                         const fg_compact_head *head) {
    const int32_t Hkv = shape->n_kv_heads, d = shape->head_dim;
    for (int32_t s = 0; s < head->n_keep; s++) {
        size_t row = ((size_t)(head->src ? head->src[s] : head->pos[s]) * Hkv + head->kv_head) * d;
        fg_slot_write_at(layout, head->pages, head->meta, s, k + row, v + row, head->pos[s], head->flags[s], head->score[s]);
    }
}

fg_status fg_ref_compact(fg_backend *be, const fg_page_layout *layout, const fg_shape *shape, int32_t n,
                         const float *k, const float *v, int32_t n_heads, const fg_compact_head *heads) {
    (void)be;
    (void)n;
    for (int32_t i = 0; i < n_heads; i++)
        fg_ref_compact_head(layout, shape, k, v, &heads[i]);
    return FG_OK;
}
