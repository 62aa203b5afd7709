/* Causal prefill attention on tiles (pass 1 of docs/design.md §2.3): for each query
 * head and tile of FG_TQ rows, key tiles of FG_TK columns go through sgemm
 * (S = Q K^T), an online softmax, and sgemm again (O += P V). Never an n x n
 * buffer; row max and normaliser come out for profile_stats. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels_cpu/cpu_math.h"
#include "kernels_cpu/kernels_cpu.h"

/* One item: query head h over one tile of FG_TQ rows. */
typedef struct prefill_job {
    const fg_shape *shape;
    int32_t n, row_begin, tile0, n_tiles;
    float scale;
    const float *q, *k, *v;
    float *out, *row_max, *row_sum, *ws;
    size_t per_thread;
} prefill_job;

static void prefill_item(void *arg, int32_t item, int32_t thread) {
    const prefill_job *j = arg;
    const int32_t Hq = j->shape->n_q_heads, Hkv = j->shape->n_kv_heads, d = j->shape->head_dim, G = Hq / Hkv;
    const int32_t n = j->n, row_begin = j->row_begin, tile0 = j->tile0, n_tiles = j->n_tiles;
    const float scale = j->scale, *q = j->q, *k = j->k, *v = j->v;
    float *out = j->out, *row_max = j->row_max, *row_sum = j->row_sum;
    /* the last tiles have the most keys: start with them */
    const int32_t h = item % Hq, tile = tile0 + n_tiles - 1 - item / Hq, g = h / G;
    const int32_t t0 = tile * FG_TQ, i0 = t0 > row_begin ? t0 : row_begin;
    const int32_t i1 = t0 + FG_TQ < n ? t0 + FG_TQ : n, rows = i1 - i0;
    float *S = j->ws + (size_t)thread * j->per_thread;
    float *O = S + (size_t)FG_TQ * FG_TK;
    const int32_t m_rows = n - row_begin;
    float *m = row_max + (size_t)h * m_rows + (i0 - row_begin), *l = row_sum + (size_t)h * m_rows + (i0 - row_begin);
    for (int32_t r = 0; r < rows; r++) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
    }
    memset(O, 0, (size_t)rows * d * sizeof(float));
    for (int32_t j0 = 0; j0 < i1; j0 += FG_TK) {
        const int32_t j1 = j0 + FG_TK < i1 ? j0 + FG_TK : i1, cols = j1 - j0;
        fg_sgemm_nt(rows, cols, d, scale, q + ((size_t)(i0 - row_begin) * Hq + h) * d, Hq * d, k + ((size_t)j0 * Hkv + g) * d,
                    Hkv * d, 0.0f, S, FG_TK);
        for (int32_t r = 0; r < rows; r++) {
            float *s = S + (size_t)r * FG_TK;
            const int32_t last = i0 + r - j0; /* keys past the row are masked */
            const int32_t valid = last + 1 < cols ? last + 1 : cols;
            for (int32_t c = valid; c < cols; c++)
                s[c] = -INFINITY;
            if (valid <= 0) { /* no visible key in this tile: p = 0 */
                memset(s, 0, (size_t)cols * sizeof(float));
                continue;
            }
            float bm = s[0];
            for (int32_t c = 1; c < valid; c++)
                bm = s[c] > bm ? s[c] : bm;
            if (bm > m[r]) {
                const float alpha = expf(m[r] - bm);
                l[r] *= alpha;
                for (int32_t x = 0; x < d; x++)
                    O[(size_t)r * d + x] *= alpha;
                m[r] = bm;
            }
            l[r] += fg_exp_sub_sum(s, cols, m[r]);
        }
        fg_sgemm_nn(rows, d, cols, S, FG_TK, v + ((size_t)j0 * Hkv + g) * d, Hkv * d, 1.0f, O, d);
    }
    for (int32_t r = 0; r < rows; r++) {
        float *o = out + ((size_t)(i0 - row_begin + r) * Hq + h) * d;
        const float inv = 1.0f / l[r];
        for (int32_t x = 0; x < d; x++)
            o[x] = O[(size_t)r * d + x] * inv;
    }
}

fg_status fg_cpu_prefill_attention(fg_backend *be, const fg_shape *shape, int32_t n, int32_t row_begin,
                                   const float *q,      /* [m][Hq][d], m = n - row_begin */
                                   const float *k,      /* [n][Hkv][d] */
                                   const float *v,      /* [n][Hkv][d] */
                                   float *out,          /* [m][Hq][d] */
                                   float *row_max,      /* [Hq][m] */
                                   float *row_sum) {    /* [Hq][m] */
    const int32_t Hq = shape->n_q_heads, d = shape->head_dim;
    /* row tiles sit at multiples of FG_TQ whatever row_begin is, so a chunk's
       rows get the arithmetic of a one-shot prefill when chunks end on them */
    const int32_t tile0 = row_begin / FG_TQ, n_tiles = (n + FG_TQ - 1) / FG_TQ - tile0;
    const float scale = 1.0f / sqrtf((float)d);
    const int threads = fg_cpu_threads(be);
    /* per thread: S [TQ][TK], O [TQ][d] */
    const size_t per_thread = (size_t)FG_TQ * FG_TK + (size_t)FG_TQ * d;
    float *ws = malloc((size_t)threads * per_thread * sizeof(float));
    if (!ws)
        return be->err(be->err_sink, FG_ERR_OUT_OF_MEMORY, "prefill: workspace of %zu bytes",
                       (size_t)threads * per_thread * sizeof(float));
    fg_blas_single_thread();
    const prefill_job job = {shape, n, row_begin, tile0, n_tiles, scale, q, k, v, out, row_max, row_sum, ws, per_thread};
    fg_threadpool_run(be->threads, Hq * n_tiles, prefill_item, (void *)&job);
    free(ws);
    return FG_OK;
}
