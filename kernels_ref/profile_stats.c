/* Pass 2 of docs/design.md §2.3: per key, the pooled attention it received (col) and
 * the part of it that came from rows whose local window holds it (col_local). */
#include <math.h>
#include <string.h>

#include "kernels_ref/kernels_ref.h"

void fg_ref_profile_stats_head(const fg_shape *shape, const fg_profile_request *req, int32_t g,
                               const float *q,        /* [n][Hq][d] */
                               const float *k,        /* [n][Hkv][d] */
                               const float *row_max,  /* [Hq][n] */
                               const float *row_sum,  /* [Hq][n] */
                               float *col,            /* [Hkv][n] */
                               float *col_local) {    /* [n_windows][Hkv][n] */
    const int32_t Hq = shape->n_q_heads, Hkv = shape->n_kv_heads, d = shape->head_dim;
    const int32_t G = Hq / Hkv, n = req->n;
    const float scale = 1.0f / sqrtf((float)d);
    const int32_t *kp = req->key_pos;
    float *cg = col + (size_t)g * n;
    memset(cg, 0, (size_t)n * sizeof(float));
    for (int32_t w = 0; w < req->n_windows; w++)
        memset(col_local + ((size_t)w * Hkv + g) * n, 0, (size_t)n * sizeof(float));

    for (int32_t h = g * G; h < (g + 1) * G; h++) {
        for (int32_t i = req->row_begin; i < n; i++) {
            const float *qi = q + ((size_t)i * Hq + h) * d;
            const float m = row_max[(size_t)h * n + i];
            const float inv = 1.0f / (row_sum[(size_t)h * n + i] * (float)G);
            for (int32_t j = 0; j <= i; j++) {
                const float *kj = k + ((size_t)j * Hkv + g) * d;
                float s = 0.0f;
                for (int32_t c = 0; c < d; c++)
                    s += qi[c] * kj[c];
                float a = expf(s * scale - m) * inv; /* this head's share of A[i][j] */
                cg[j] += a;
                for (int32_t w = 0; w < req->n_windows; w++)
                    if ((kp ? kp[i] - kp[j] : i - j) < req->window[w])
                        col_local[((size_t)w * Hkv + g) * n + j] += a;
            }
        }
    }
}

fg_status fg_ref_profile_stats(fg_backend *be, const fg_shape *shape, const fg_profile_request *req, const float *q,
                               const float *k, const float *row_max, const float *row_sum, float *col,
                               float *col_local) {
    (void)be;
    for (int32_t g = 0; g < shape->n_kv_heads; g++)
        fg_ref_profile_stats_head(shape, req, g, q, k, row_max, row_sum, col, col_local);
    return FG_OK;
}
