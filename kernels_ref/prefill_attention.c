/* Causal softmax attention over a prompt, keeping each row's max and
 * normaliser (pass 1 of docs/design.md §2.3). */
#include <math.h>

#include "kernels_ref/kernels_ref.h"

void fg_ref_prefill_attention_head(const fg_shape *shape, int32_t n, int32_t row_begin, int32_t h,
                                   const float *q,     /* [n][Hq][d] */
                                   const float *k,     /* [n][Hkv][d] */
                                   const float *v,     /* [n][Hkv][d] */
                                   float *out,         /* [n][Hq][d] */
                                   float *row_max,     /* [Hq][n] */
                                   float *row_sum) {   /* [Hq][n] */
    const int32_t Hq = shape->n_q_heads, Hkv = shape->n_kv_heads, d = shape->head_dim;
    const int32_t g = h / (Hq / Hkv);
    const float scale = 1.0f / sqrtf((float)d);
    const int32_t m_rows = n - row_begin;
    for (int32_t i = row_begin; i < n; i++) {
        const float *qi = q + ((size_t)(i - row_begin) * Hq + h) * d;
        float *oi = out + ((size_t)(i - row_begin) * Hq + h) * d;
        float m = -INFINITY;
        for (int32_t j = 0; j <= i; j++) {
            const float *kj = k + ((size_t)j * Hkv + g) * d;
            float s = 0.0f;
            for (int32_t c = 0; c < d; c++)
                s += qi[c] * kj[c];
            s *= scale;
            if (s > m)
                m = s;
        }
        for (int32_t c = 0; c < d; c++)
            oi[c] = 0.0f;
        float sum = 0.0f;
        for (int32_t j = 0; j <= i; j++) {
            const float *kj = k + ((size_t)j * Hkv + g) * d;
            const float *vj = v + ((size_t)j * Hkv + g) * d;
            float s = 0.0f;
            for (int32_t c = 0; c < d; c++)
                s += qi[c] * kj[c];
            float p = expf(s * scale - m);
            sum += p;
            for (int32_t c = 0; c < d; c++)
                oi[c] += p * vj[c];
        }
        for (int32_t c = 0; c < d; c++)
            oi[c] /= sum;
        row_max[(size_t)h * m_rows + i - row_begin] = m;
        row_sum[(size_t)h * m_rows + i - row_begin] = sum;
    }
}

fg_status fg_ref_prefill_attention(fg_backend *be, const fg_shape *shape, int32_t n, int32_t row_begin, const float *q,
                                   const float *k, const float *v, float *out, float *row_max, float *row_sum) {
    (void)be;
    for (int32_t h = 0; h < shape->n_q_heads; h++)
        fg_ref_prefill_attention_head(shape, n, row_begin, h, q, k, v, out, row_max, row_sum);
    return FG_OK;
}
