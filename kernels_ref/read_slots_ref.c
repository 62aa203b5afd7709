/* Copies one head's slot metadata out of its pages. */
#include "kernels_ref/kernels_ref.h"
#include "common/slots.h"

fg_status fg_ref_read_slots(fg_backend *be, const fg_page_layout *layout, void *const *pages, int32_t n_slots,
                            int32_t *pos, uint8_t *flags, float *score) {
    (void)be;
    for (int32_t s = 0; s < n_slots; s++) {
        fg_slot_ref r = fg_slot(layout, pages, s);
        pos[s] = *fg_slot_pos(layout, r);
        if (flags)
            flags[s] = *fg_slot_flags(layout, r);
        if (score)
            score[s] = *fg_slot_score(layout, r);
    }
    return FG_OK;
}
