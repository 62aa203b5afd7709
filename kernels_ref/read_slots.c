/* Copies one head's slot metadata out of its meta pages. */
#include "kernels_ref/kernels_ref.h"
#include "common/slots.h"

fg_status fg_ref_read_slots(fg_backend *be, const fg_page_layout *layout, void *const *meta, int32_t n_slots,
                            int32_t *pos, uint8_t *flags, float *score) {
    (void)be;
    for (int32_t s = 0; s < n_slots; s++) {
        pos[s] = *fg_slot_pos(layout, meta, s);
        if (flags)
            flags[s] = *fg_slot_flags(layout, meta, s);
        if (score)
            score[s] = *fg_slot_score(layout, meta, s);
    }
    return FG_OK;
}
