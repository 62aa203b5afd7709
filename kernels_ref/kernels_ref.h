/*
 * The scalar reference kernels: plain loops, fp32 accumulation, written to
 * be obviously right. The `ref` backend runs them serially; every other
 * backend is tested against them. Attention and profiling share no code
 * with the cpu kernels; §2.5's steps 3-4 are the policy step both call
 * (backends/decode_policy.c), checked against tests/support/sim.h.
 */
#ifndef FG_KERNELS_REF_H
#define FG_KERNELS_REF_H

#include "backends/backend.h"

fg_prefill_attention_fn fg_ref_prefill_attention;
fg_profile_stats_fn fg_ref_profile_stats;
fg_compact_fn fg_ref_compact;
fg_decode_step_fn fg_ref_decode_step;
fg_adaptive_observe_fn fg_ref_adaptive_observe;
fg_adaptive_errors_fn fg_ref_adaptive_errors;

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
/* The adaptive mode's parts (kernels_ref/adaptive.c), the cpu backend's too where
 * they are not its work: K and V of slots 0..t-1 as float [t][d]; the
 * column sums of keys [j0, j1) (backend.h's order) that then zero their
 * negligible keys (the cpu's per key tile); the
 * errors of every level from per-level sums acc[n_levels + 1][d + 1] in
 * double, added to err[n_levels] (sums: 2 (d + 1) doubles of scratch). */
void fg_ref_unpack_rows(const fg_page_layout *layout, const fg_observe_unit *u, float *k, float *v);
void fg_ref_observe_sums(const fg_observe_unit *u, int32_t G, float *p, int32_t decode_from, int32_t j0, int32_t j1,
                         float *col_all, float *col_decode);
void fg_ref_level_errors(const double *acc, int32_t n_levels, int32_t d, int mass, double *sums, double *err);
#endif /* FG_KERNELS_REF_H */
