/* The `cpu` backend: host memory, OpenMP + SIMD kernels (kernels_cpu.h). Ops
 * without an optimised kernel yet run the per-head reference kernel in
 * parallel over heads. */
#include <stdlib.h>

#include "backends/backend_host.h"
#include "kernels_cpu/kernels_cpu.h"
#include "kernels_cpu/kernels_ref.h"

#ifdef _OPENMP
#include <omp.h>
#define FG_OMP_THREADS(be) ((be)->n_threads > 0 ? (be)->n_threads : omp_get_max_threads())
#endif

static fg_status cpu_prefill_attention(fg_backend *be, const fg_shape *shape, int32_t n, const float *q,
                                       const float *k, const float *v, float *out, float *row_max,
                                       float *row_sum) {
    (void)be;
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1) num_threads(FG_OMP_THREADS(be))
#endif
    for (int32_t h = 0; h < shape->n_q_heads; h++)
        fg_ref_prefill_attention_head(shape, n, h, q, k, v, out, row_max, row_sum);
    return FG_OK;
}

static fg_status cpu_profile_stats(fg_backend *be, const fg_shape *shape, const fg_profile_request *req,
                                   const float *q, const float *k, const float *row_max, const float *row_sum,
                                   float *col, float *col_local) {
    (void)be;
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1) num_threads(FG_OMP_THREADS(be))
#endif
    for (int32_t g = 0; g < shape->n_kv_heads; g++)
        fg_ref_profile_stats_head(shape, req, g, q, k, row_max, row_sum, col, col_local);
    return FG_OK;
}

static fg_status cpu_compact(fg_backend *be, const fg_page_layout *layout, const fg_shape *shape, int32_t n,
                             const float *k, const float *v, int32_t n_heads, const fg_compact_head *heads) {
    (void)be;
    (void)n;
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1) num_threads(FG_OMP_THREADS(be))
#endif
    for (int32_t i = 0; i < n_heads; i++)
        fg_ref_compact_head(layout, shape, k, v, &heads[i]);
    return FG_OK;
}

static void cpu_destroy(fg_backend *be) {
    fg_cpu_state *st = be->impl;
    if (st)
        free(st->ws);
    free(st);
}

static const fg_backend_ops k_cpu_ops = {
    .name = "cpu",
    .buffer_alloc = fg_host_buffer_alloc,
    .buffer_free = fg_host_buffer_free,
    .prefill_attention = cpu_prefill_attention,
    .profile_stats = cpu_profile_stats,
    .compact = cpu_compact,
    .decode_step = fg_cpu_decode_step,
    .read_slots = fg_ref_read_slots,
    .destroy = cpu_destroy,
};

fg_status fg_backend_cpu_init(fg_backend *be) {
    fg_cpu_state *st = calloc(1, sizeof *st);
    if (!st)
        return be->err(be->err_sink, FG_ERR_OUT_OF_MEMORY, "cpu backend: out of memory");
    st->isa = fg_cpu_isa_detect();
    be->impl = st;
    be->ops = &k_cpu_ops;
    return FG_OK;
}
