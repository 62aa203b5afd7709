/* Steps 1-2 of a decode step on the cpu backend (docs/design.md §2.5) in
 * plain scalar code, for the shapes the vector kernels do not take. Written
 * apart from the reference (kernels_ref/), so that backend_ops compares two
 * implementations of attention; steps 3-4 are the shared policy step
 * (backends/decode_policy.c). */
#include <math.h>

#include "common/rules.h"
#include "common/slots.h"
#include "kernels_cpu/kernels_cpu.h"

/* q . row, the row widened element by element from its dtype */
static float dot_cached(const float *q, const void *row, fg_dtype dtype, int32_t d) {
    float s = 0.0f;
    for (int32_t c = 0; c < d; c++)
        s += q[c] * fg_load_elem(row, dtype, d, c);
    return s;
}

/* Query heads one pass over the slots serves: their running maxima and sums
 * live on the stack. */
#define PLAIN_HEADS 16

/* Not the reference's loops (kernels_ref/decode_step.c reads each K row
 * three times per query head): the order of the vector kernels, in scalar
 * code. One pass over the slots serves up to PLAIN_HEADS query heads with an
 * online softmax (each head's running max m and sum l; the output so far is
 * rescaled by e^(m_old - m) when the max grows), so each K and V row is read
 * once per pass. The new token's own key (dotted with the query as given)
 * starts each head's state. A head
 * that tracks scores then reads K once more to turn each slot's scores into
 * its pooled attention, one head's share at a time as ref adds it (score
 * = keep * score, then += p_h / (l_h G) for each h). */
float fg_cpu_decode_attend_plain(const fg_page_layout *L, const fg_shape *shape, const fg_decode_head *hd,
                                 const float *q_cached) {
    const int32_t G = shape->n_q_heads / shape->n_kv_heads, d = shape->head_dim, n = hd->n_slots;
    const float scale = 1.0f / sqrtf((float)d);
    const int track = fg_tracks_scores(hd->components);
    const float keep = hd->score_mode == FG_SCORE_LAST ? 0.0f : 1.0f;
    void *const *pages = hd->pages, *const *meta = hd->meta;
    float new_score = 0.0f;

    for (int32_t h0 = 0; h0 < G; h0 += PLAIN_HEADS) {
        const int32_t hn = G - h0 < PLAIN_HEADS ? G - h0 : PLAIN_HEADS;
        const float *q = hd->q + (size_t)h0 * d, *qk = q_cached + (size_t)h0 * d;
        float *out = hd->out + (size_t)h0 * d;
        float m[PLAIN_HEADS], l[PLAIN_HEADS], self[PLAIN_HEADS];
        for (int32_t h = 0; h < hn; h++) {
            self[h] = m[h] = dot_cached(q + (size_t)h * d, hd->k, FG_DTYPE_F32, d) * scale;
            l[h] = 1.0f;
            for (int32_t c = 0; c < d; c++)
                out[(size_t)h * d + c] = hd->v[c];
        }
        for (int32_t s = 0; s < n; s++) {
            const void *kr = fg_slot_k(L, pages, meta, s), *vr = fg_slot_v(L, pages, meta, s);
            for (int32_t h = 0; h < hn; h++) {
                const float x = dot_cached(qk + (size_t)h * d, kr, L->k_dtype, d);
                float *o = out + (size_t)h * d;
                if (x > m[h]) { /* a new max: what came before shrinks by e^(m_old - x) */
                    const float shrink = expf(m[h] - x);
                    l[h] *= shrink;
                    for (int32_t c = 0; c < d; c++)
                        o[c] *= shrink;
                    m[h] = x;
                }
                const float p = expf(x - m[h]);
                l[h] += p;
                for (int32_t c = 0; c < d; c++)
                    o[c] += p * fg_load_elem(vr, L->v_dtype, d, c);
            }
        }
        for (int32_t h = 0; h < hn; h++) {
            const float inv = 1.0f / l[h];
            for (int32_t c = 0; c < d; c++)
                out[(size_t)h * d + c] *= inv;
            l[h] = inv / (float)G; /* from here: the factor of the pooled attention */
            new_score += expf(self[h] - m[h]) * l[h];
        }
        if (!track)
            continue;
        for (int32_t s = 0; s < n; s++) {
            const void *kr = fg_slot_k(L, pages, meta, s);
            float *score = fg_slot_score(L, meta, s);
            /* FG_SCORE_LAST: this step's attention alone (as ref, a NaN score does not carry over); each
               head's share is added to the score in turn, as ref adds it and as new_score sums it, so a
               slot that met the query as the new token did keeps its tie with it for any G (a pass's sum
               added at once would round apart from new_score past PLAIN_HEADS heads) */
            float sc = h0 > 0 || keep != 0.0f ? *score : 0.0f;
            for (int32_t h = 0; h < hn; h++)
                sc += expf(dot_cached(qk + (size_t)h * d, kr, L->k_dtype, d) - m[h]) * l[h];
            *score = sc;
        }
    }
    return new_score;
}
