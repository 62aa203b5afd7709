/* Memory of the backends whose memory is host memory (ref, cpu): 64-byte
 * aligned blocks, page pools' chunks on transparent huge pages; and the
 * plain read of slot metadata from it. */
#define _DEFAULT_SOURCE /* madvise */
#include <stdlib.h>
#include <sys/mman.h>

#include "backends/backend_host.h"
#include "common/slots.h"

fg_status fg_host_buffer_alloc(fg_backend *be, size_t bytes, void **out) {
    /* 64-byte aligned so that rows can be loaded with aligned vectors. From
     * 2 MiB up (a page pool's chunks), 2 MiB aligned with the whole 2 MiB
     * blocks advised for transparent huge pages: the decode step walks the
     * metadata of KV pages several KiB apart, and where each of those misses
     * the TLB, software prefetches are dropped (measured on Zen 5) */
    const size_t huge = (size_t)2 << 20, rounded = (bytes + 63) / 64 * 64;
    if (rounded < huge)
        *out = aligned_alloc(64, rounded ? rounded : 64);
    else if (posix_memalign(out, huge, rounded)) /* aligned_alloc wants a size that is a multiple */
        *out = NULL;
    if (!*out)
        return be->err(be->err_sink, FG_ERR_OUT_OF_MEMORY, "host allocation of %zu bytes failed", bytes);
#ifdef MADV_HUGEPAGE
    if (rounded >= huge)
        (void)madvise(*out, rounded / huge * huge, MADV_HUGEPAGE); /* advice only: failure changes nothing */
#endif
    return FG_OK;
}

void fg_host_buffer_free(fg_backend *be, void *ptr) {
    (void)be;
    free(ptr);
}

fg_status fg_host_read_slots(fg_backend *be, const fg_page_layout *layout, void *const *meta, int32_t n_slots,
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
