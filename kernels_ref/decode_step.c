/* One decoding step of one head (docs/design.md §2.5, steps 1-4), as plain
 * loops over the slots:
 *   1. every query head of the group attends over the kept slots plus the
 *      new token's own key/value (quantized K rows: with the query rounded
 *      to q8_0, fg_query_q8_row);
 *   2. heads that track scores add the pooled attention to each slot's
 *      score (FG_SCORE_LAST: the score becomes it); a group of heads that
 *      rank together (FG_ALLOC_LAYER) then takes the mean of its scores;
 *   3. the new token is cached with the flag the host chose (or not at all);
 *   4. window rows that fell out of the window become frequent candidates or
 *      are dropped, then the lowest-ranked candidates go until k(t) remain.
 * Steps 1-2 are ref's own plain loops; steps 3-4 and the group's mean are
 * the one policy step every host backend shares (backends/decode_policy.c). */
#include <math.h>

#include "backends/decode_policy.h"
#include "common/slots.h"
#include "kernels_ref/kernels_ref.h"

static float dot_row(const float *q, const void *row, fg_dtype dtype, int32_t d) {
    float s = 0.0f;
    for (int32_t c = 0; c < d; c++)
        s += q[c] * fg_load_elem(row, dtype, d, c);
    return s;
}

static float dot_f32(const float *a, const float *b, int32_t d) {
    float s = 0.0f;
    for (int32_t c = 0; c < d; c++)
        s += a[c] * b[c];
    return s;
}

/* Steps 1-2 of one head: its output, and its slots' scores (FG_SCORE_LAST:
 * this step's attention alone); the new token's pooled attention in
 * *new_score. */
static void attend_head(const fg_page_layout *L, const fg_shape *shape, const fg_decode_head *hd, float *new_score) {
    const int32_t G = shape->n_q_heads / shape->n_kv_heads, d = shape->head_dim;
    const float scale = 1.0f / sqrtf((float)d);
    const int track = fg_tracks_scores(hd->components);
    void *const *pages = hd->pages, *const *meta = hd->meta;
    int32_t n = hd->n_slots;

    /* one query head at a time */
    if (track && hd->score_mode == FG_SCORE_LAST)
        for (int32_t s = 0; s < n; s++)
            *fg_slot_score(L, meta, s) = 0.0f;
    *new_score = 0.0f;
    float qr[1024]; /* head_dim <= 1024 (fg_context_create) */
    for (int32_t h = 0; h < G; h++) {
        const float *q = hd->q + (size_t)h * d;
        const float *qk = q; /* what the cached K rows are dotted with */
        if (fg_dtype_quantized(L->k_dtype)) {
            fg_query_q8_row(qr, q, d);
            qk = qr;
        }
        float *o = hd->out + (size_t)h * d;
        const float s_new = dot_f32(q, hd->k, d) * scale;
        float m = s_new;
        for (int32_t s = 0; s < n; s++) {
            float x = dot_row(qk, fg_slot_k(L, pages, meta, s), L->k_dtype, d) * scale;
            if (x > m)
                m = x;
        }
        const float p_new = expf(s_new - m);
        float sum = p_new;
        for (int32_t c = 0; c < d; c++)
            o[c] = p_new * hd->v[c];
        for (int32_t s = 0; s < n; s++) {
            float p = expf(dot_row(qk, fg_slot_k(L, pages, meta, s), L->k_dtype, d) * scale - m);
            sum += p;
            const void *vr = fg_slot_v(L, pages, meta, s);
            for (int32_t c = 0; c < d; c++)
                o[c] += p * fg_load_elem(vr, L->v_dtype, d, c);
        }
        for (int32_t c = 0; c < d; c++)
            o[c] /= sum;
        if (track) {
            const float inv = 1.0f / (sum * (float)G);
            for (int32_t s = 0; s < n; s++) {
                float p = expf(dot_row(qk, fg_slot_k(L, pages, meta, s), L->k_dtype, d) * scale - m);
                *fg_slot_score(L, meta, s) += p * inv;
            }
            *new_score += p_new * inv;
        }
    }
}

fg_status fg_ref_decode_step_head(const fg_page_layout *L, const fg_shape *shape, const fg_decode_head *hd) {
    float new_score;
    attend_head(L, shape, hd, &new_score);
    return fg_decode_finish_head(L, hd, new_score, NULL);
}

/* A group of heads that rank by their mean score (FG_ALLOC_LAYER): steps
 * 1-2 of each, the group's mean in every slot and for the new token, then
 * steps 3-4 of each. 1 when the heads do not hold the same positions. */
static int group_step(const fg_page_layout *L, const fg_shape *shape, const fg_decode_head *hds, int32_t n_heads,
                      int32_t *failed) {
    float new_score = 0.0f;
    for (int32_t i = 0; i < n_heads; i++) {
        float own;
        attend_head(L, shape, &hds[i], &own);
        new_score += own;
    }
    new_score /= (float)n_heads;
    const int32_t apart = fg_decode_share_scores(L, hds, n_heads);
    if (apart) {
        *failed = apart;
        return 1;
    }
    for (int32_t i = 0; i < n_heads; i++)
        if (fg_decode_finish_head(L, &hds[i], new_score, NULL) != FG_OK) {
            *failed = i;
            return 2;
        }
    return 0;
}

fg_status fg_ref_decode_step(fg_backend *be, const fg_page_layout *layout, const fg_shape *shape, int32_t n_heads,
                             const fg_decode_head *heads) {
    const int32_t broken = fg_decode_groups_check(heads, n_heads);
    if (broken >= 0)
        return be->err(be->err_sink, FG_ERR_INTERNAL, "decode_step: head %d is not in a whole group", broken);
    for (int32_t i = 0; i < n_heads; i++) {
        const fg_decode_head *hd = &heads[i];
        if (hd->share_n > 1) {
            int32_t bad = 0;
            const int r = group_step(layout, shape, hd, hd->share_n, &bad);
            if (r)
                return be->err(be->err_sink, FG_ERR_INTERNAL,
                               r == 1 ? "decode_step: head %d does not hold the positions of its group's first"
                                      : "decode_step: head %d ended with a slot count the host did not expect",
                               i + bad);
            i += hd->share_n - 1;
            continue;
        }
        fg_status st = fg_ref_decode_step_head(layout, shape, hd);
        if (st != FG_OK)
            return be->err(be->err_sink, st, "decode_step: head %d ended with a slot count the host did not expect", i);
    }
    return FG_OK;
}
