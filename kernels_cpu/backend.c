/* The `cpu` backend: host memory and the thread-pool + SIMD kernels of
 * kernels_cpu.h (AVX2 / AVX-512 chosen at run time, a portable fallback). */
#include <stdlib.h>

#include "backends/backend_host.h"
#include "kernels_cpu/kernels_cpu.h"
#include "kernels_ref/kernels_ref.h"

static void cpu_destroy(fg_backend *be) {
    fg_cpu_state *st = be->impl;
    if (st)
        free(st->ws);
    free(st);
}

static const fg_backend_ops k_cpu_ops = {
    .name = "cpu",
    .kv_apart = 1,
    .buffer_alloc = fg_host_buffer_alloc,
    .buffer_free = fg_host_buffer_free,
    .prefill_attention = fg_cpu_prefill_attention,
    .profile_stats = fg_cpu_profile_stats,
    .compact = fg_cpu_compact,
    .decode_step = fg_cpu_decode_step,
    .read_slots = fg_host_read_slots, /* host memory: the plain read is the fast one */
    .adaptive_observe = fg_cpu_adaptive_observe,
    .adaptive_errors = fg_cpu_adaptive_errors,
    .destroy = cpu_destroy,
};

fg_status fg_backend_cpu_init(fg_backend *be) {
    fg_cpu_state *st = calloc(1, sizeof *st);
    if (!st)
        return be->err(be->err_sink, FG_ERR_OUT_OF_MEMORY, "cpu backend: out of memory");
    st->isa = fg_cpu_features_get().isa;
    st->tuning = fg_cpu_tuning_detect();
    be->impl = st;
    be->ops = &k_cpu_ops;
    return FG_OK;
}
