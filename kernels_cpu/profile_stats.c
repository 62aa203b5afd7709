/* Pass 2 of docs/design.md §2.3 on tiles: each work item owns the columns of one key
 * tile of one KV head, recomputes S = Q K^T for the rows that see them
 * (sgemm), turns S into pooled attention with the row max and normaliser of
 * pass 1, and sums columns (col, and col_local per window). Owning columns
 * means no races and a summation order that does not depend on threads. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels_cpu/cpu_math.h"
#include "kernels_cpu/kernels_cpu.h"

/* The first column c of the tile at j0 (of `valid` keys j0 + c <= i) that
 * row i's window holds: pos(i) - pos(j0 + c) < window. Positions increase,
 * so the held keys are the tile's last ones. */
static int32_t window_first(const fg_profile_request *req, int32_t i, int32_t window, int32_t j0, int32_t valid) {
    if (!req->key_pos) {
        const int32_t c0 = i - window + 1 - j0;
        return c0 > 0 ? c0 : 0;
    }
    const int32_t *kp = req->key_pos + j0, limit = req->key_pos[i] - window; /* held: kp[c] > limit */
    int32_t lo = 0, hi = valid;
    while (lo < hi) {
        const int32_t mid = lo + (hi - lo) / 2;
        if (kp[mid] > limit)
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

/* One item: KV head g over one tile of FG_TK key columns. */
typedef struct profile_job {
    const fg_shape *shape;
    const fg_profile_request *req;
    float scale;
    const float *q, *k, *row_max, *row_sum;
    float *col, *col_local, *ws;
} profile_job;

static void profile_item(void *arg, int32_t item, int32_t thread) {
    const profile_job *j = arg;
    const int32_t Hq = j->shape->n_q_heads, Hkv = j->shape->n_kv_heads, d = j->shape->head_dim, G = Hq / Hkv;
    const fg_profile_request *req = j->req;
    const int32_t n = req->n;
    const float scale = j->scale, *q = j->q, *k = j->k, *row_max = j->row_max, *row_sum = j->row_sum;
    float *col = j->col, *col_local = j->col_local;
    const int32_t g = item % Hkv, kt = item / Hkv; /* early key tiles have the most rows: first */
    const int32_t j0 = kt * FG_TK, j1 = j0 + FG_TK < n ? j0 + FG_TK : n, cols = j1 - j0;
    float *S = j->ws + (size_t)thread * FG_TQ * FG_TK;
    float *cg = col + (size_t)g * n + j0;
    memset(cg, 0, (size_t)cols * sizeof(float));
    for (int32_t w = 0; w < req->n_windows; w++)
        memset(col_local + ((size_t)w * Hkv + g) * n + j0, 0, (size_t)cols * sizeof(float));
    const int32_t first_row = j0 > req->row_begin ? j0 : req->row_begin;
    for (int32_t h = g * G; h < (g + 1) * G; h++) {
        for (int32_t i0 = first_row; i0 < n; i0 += FG_TQ) {
            const int32_t i1 = i0 + FG_TQ < n ? i0 + FG_TQ : n, rows = i1 - i0;
            fg_sgemm_nt(rows, cols, d, scale, q + ((size_t)i0 * Hq + h) * d, Hq * d,
                        k + ((size_t)j0 * Hkv + g) * d, Hkv * d, 0.0f, S, FG_TK);
            for (int32_t r = 0; r < rows; r++) {
                const int32_t i = i0 + r;
                float *s = S + (size_t)r * FG_TK;
                const int32_t valid = i - j0 + 1 < cols ? i - j0 + 1 : cols; /* keys j <= i */
                const float inv = 1.0f / (row_sum[(size_t)h * n + i] * (float)G);
                fg_exp_sub_sum(s, valid, row_max[(size_t)h * n + i]);
                for (int32_t c = 0; c < valid; c++)
                    cg[c] += s[c] * inv;
                for (int32_t w = 0; w < req->n_windows; w++) {
                    /* rows i whose window holds j: pos(i) - pos(j) < window, i.e. j from c0 on */
                    const int32_t c0 = window_first(req, i, req->window[w], j0, valid);
                    float *cl = col_local + ((size_t)w * Hkv + g) * n + j0;
                    for (int32_t c = c0; c < valid; c++)
                        cl[c] += s[c] * inv;
                }
            }
        }
    }
}

fg_status fg_cpu_profile_stats(fg_backend *be, const fg_shape *shape, const fg_profile_request *req,
                               const float *q,        /* [n][Hq][d] */
                               const float *k,        /* [n][Hkv][d] */
                               const float *row_max,  /* [Hq][n] */
                               const float *row_sum,  /* [Hq][n] */
                               float *col,            /* [Hkv][n] */
                               float *col_local) {    /* [n_windows][Hkv][n] */
    const int32_t Hkv = shape->n_kv_heads, d = shape->head_dim;
    const int32_t n = req->n, n_ktiles = (n + FG_TK - 1) / FG_TK;
    const float scale = 1.0f / sqrtf((float)d);
    const int threads = fg_cpu_threads(be);
    const size_t per_thread = (size_t)FG_TQ * FG_TK;
    float *ws = malloc((size_t)threads * per_thread * sizeof(float));
    if (!ws)
        return be->err(be->err_sink, FG_ERR_OUT_OF_MEMORY, "profile: workspace of %zu bytes",
                       (size_t)threads * per_thread * sizeof(float));
    fg_blas_single_thread();
    const profile_job job = {shape, req, scale, q, k, row_max, row_sum, col, col_local, ws};
    fg_threadpool_run(be->threads, Hkv * n_ktiles, profile_item, (void *)&job);
    free(ws);
    return FG_OK;
}
