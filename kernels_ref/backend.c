/* The `ref` backend: host memory and the serial reference kernels. It is the
 * oracle every other backend is checked against. */
#include "backends/backend_host.h"
#include "kernels_ref/kernels_ref.h"

static const fg_backend_ops k_ref_ops = {
    .name = "ref",
    .kv_apart = 1,
    .buffer_alloc = fg_host_buffer_alloc,
    .buffer_free = fg_host_buffer_free,
    .prefill_attention = fg_ref_prefill_attention,
    .profile_stats = fg_ref_profile_stats,
    .compact = fg_ref_compact,
    .decode_step = fg_ref_decode_step,
    .read_slots = fg_host_read_slots,
    .adaptive_observe = fg_ref_adaptive_observe,
    .adaptive_errors = fg_ref_adaptive_errors,
};

fg_status fg_backend_ref_init(fg_backend *be) {
    be->ops = &k_ref_ops;
    return FG_OK;
}
