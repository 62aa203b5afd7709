/*
 * The scalar reference kernels: plain loops, fp32 accumulation, written to
 * be obviously right. The `ref` backend runs them serially; every other
 * backend is tested against them. Each op is split into a per-head kernel
 * (`*_head`) that the `cpu` backend can also drive in parallel.
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
/* Steps 4a-b of §2.5 for a head that tracks scores, over slots [begin, end):
 * window rows that left the window become frequent candidates, and the
 * candidates are counted and the lowest-ranked found. Scans of consecutive
 * ranges merge into the scan of their union. */
typedef struct fg_freq_scan {
    int32_t n_freq; /* candidates */
    int32_t worst;  /* the lowest-ranked candidate's slot, -1 when none */
    int32_t worst_pos;
    float worst_rank;
} fg_freq_scan;
#define FG_FREQ_SCAN_EMPTY ((fg_freq_scan){0, -1, 0, 0.0f})
void fg_ref_freq_scan(const fg_page_layout *layout, const fg_decode_head *head, int32_t begin, int32_t end,
                      fg_freq_scan *scan);
void fg_ref_freq_scan_merge(fg_freq_scan *into, const fg_freq_scan *from);
/* Steps 3-4 of §2.5 (insert, window, frequent budget) once attention and the
 * score update are done; new_score: the new token's pooled self-attention.
 * `scanned`, or NULL: the scan of the head's slots [0, n_slots), made after
 * their score update (a head that tracks scores only). */
fg_status fg_ref_decode_finish_head(const fg_page_layout *layout, const fg_decode_head *head, float new_score,
                                    const fg_freq_scan *scanned);

#endif /* FG_KERNELS_REF_H */
