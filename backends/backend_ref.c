/* The `ref` backend: host memory and the serial reference kernels. It is the
 * oracle every other backend is checked against. */
#define _DEFAULT_SOURCE /* madvise */
#include <stdlib.h>
#include <sys/mman.h>

#include "backends/backend_host.h"
#include "kernels_ref/kernels_ref.h"

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

static const fg_backend_ops k_ref_ops = {
    .name = "ref",
    .kv_apart = 1,
    .buffer_alloc = fg_host_buffer_alloc,
    .buffer_free = fg_host_buffer_free,
    .prefill_attention = fg_ref_prefill_attention,
    .profile_stats = fg_ref_profile_stats,
    .compact = fg_ref_compact,
    .decode_step = fg_ref_decode_step,
    .read_slots = fg_ref_read_slots,
    .destroy = NULL,
};

fg_status fg_backend_ref_init(fg_backend *be) {
    be->ops = &k_ref_ops;
    return FG_OK;
}
