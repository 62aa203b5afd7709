/*
 * The scalar reference kernels: plain loops, fp32 accumulation, written to
 * be obviously right. The `ref` backend runs them serially; every other
 * backend is tested against them, so they share no code with the cpu
 * kernels beyond the page layout and the rules of common/.
 */
#ifndef FG_KERNELS_REF_H
#define FG_KERNELS_REF_H

#include "backends/backend.h"

fg_prefill_attention_fn fg_ref_prefill_attention;
fg_profile_stats_fn fg_ref_profile_stats;
fg_compact_fn fg_ref_compact;
fg_decode_step_fn fg_ref_decode_step;
fg_read_slots_fn fg_ref_read_slots;

/* Query head h of prompt rows [row_begin, n) (q, out and the statistics hold
 * those rows only; writes out[:, h], row_max[h], row_sum[h]). */
void fg_ref_prefill_attention_head(const fg_shape *shape, int32_t n, int32_t row_begin, int32_t h, const float *q,
                                   const float *k, const float *v, float *out, float *row_max, float *row_sum);
/* KV head g (writes col[g], col_local[:, g]). */
void fg_ref_profile_stats_head(const fg_shape *shape, const fg_profile_request *req, int32_t g, const float *q,
                               const float *k, const float *row_max, const float *row_sum, float *col,
                               float *col_local);
void fg_ref_compact_head(const fg_page_layout *layout, const fg_shape *shape, const float *k, const float *v,
                         const fg_compact_head *head);
/* Returns FG_ERR_INTERNAL when the slot count disagrees with the host mirror. */
fg_status fg_ref_decode_step_head(const fg_page_layout *layout, const fg_shape *shape, const fg_decode_head *head);
#endif /* FG_KERNELS_REF_H */
