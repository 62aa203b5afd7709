/* The `ref` backend: host memory and the serial reference kernels. It is the
 * oracle every other backend is checked against. */
#include <stdlib.h>

#include "backends/backend_host.h"
#include "kernels_cpu/kernels_ref.h"

fg_status fg_host_buffer_alloc(fg_backend *be, size_t bytes, void **out) {
    /* 64-byte aligned so that rows can be loaded with aligned vectors */
    size_t rounded = (bytes + 63) / 64 * 64;
    *out = aligned_alloc(64, rounded ? rounded : 64);
    if (!*out)
        return be->err(be->err_sink, FG_ERR_OUT_OF_MEMORY, "host allocation of %zu bytes failed", bytes);
    return FG_OK;
}

void fg_host_buffer_free(fg_backend *be, void *ptr) {
    (void)be;
    free(ptr);
}

static const fg_backend_ops k_ref_ops = {
    .name = "ref",
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
