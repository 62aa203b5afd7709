/* The adaptive mode's decision for one unit on the GPU (backend.h:
 * adaptive_observe, adaptive_errors). The cache never leaves the device:
 * the observed queries, positions, page tables and entry levels go up, the
 * two column sums ([t] floats) and the errors ([W][sets][levels] doubles)
 * come back.
 *   unpack_rows      block per slot: K and V to float rows in the scratch
 *   observe_rows     block per (row, head): scores, softmax, p
 *   observe_sums     thread per key: column sums in ref's order (h, then
 *                    i), then the negligible keys to 0
 *   level_errors     block per (row, set), a thread per column of V (128
 *                    at a time) and one for the attention: per-level sums
 *                    in shared memory, each head and chunk of columns in
 *                    turn, then thread l the error of level l (double),
 *                    summed over the heads and chunks in order. */
#include <stdlib.h>
#include <string.h>

#include "kernels_cuda/gpu_common.cuh"

__global__ static void unpack_rows(fg_gpu_layout L, void *const *pages, void *const *meta, float *k, float *v) {
    const int32_t s = blockIdx.x, d = L.head_dim;
    const int32_t r = *fg_slot_row(&L.pl, meta, s);
    const unsigned char *kr = fg_row_k(&L.pl, pages, r), *vr = fg_row_v(&L.pl, pages, r);
    for (int32_t c = threadIdx.x; c < d; c += blockDim.x) {
        k[(size_t)s * d + c] = fg_load_elem(kr, (fg_dtype)L.dtype, d, c);
        v[(size_t)s * d + c] = fg_load_elem(vr, (fg_dtype)L.dtype, d, c);
    }
}

/* Row i (at pos[i]) of head h: p over keys 0..pos, 0 after, up to t. */
__global__ static void FG_BLOCK_BOUNDS observe_rows(const float *q, const float *k, const int32_t *pos, int32_t t,
                                                    int32_t W, int32_t G, int32_t d, float scale, float *p) {
    FG_DYNAMIC_SHARED(float, sh); /* [d] the query, then [blockDim] for the reductions */
    const int32_t i = blockIdx.x, h = blockIdx.y, n = pos[i] + 1;
    float *qs = sh, *red = sh + d, *pr = p + ((size_t)h * W + i) * t;
    for (int32_t c = threadIdx.x; c < d; c += blockDim.x)
        qs[c] = q[((size_t)i * G + h) * d + c];
    __syncthreads();
    float m = -INFINITY;
    for (int32_t j = threadIdx.x; j < n; j += blockDim.x) {
        float x = 0.0f;
        for (int32_t c = 0; c < d; c++)
            x += qs[c] * k[(size_t)j * d + c];
        pr[j] = x * scale;
        m = fmaxf(m, pr[j]);
    }
    m = fg_block_max(m, red);
    float sum = 0.0f;
    for (int32_t j = threadIdx.x; j < n; j += blockDim.x) {
        pr[j] = expf(pr[j] - m);
        sum += pr[j];
    }
    const float inv = 1.0f / fg_block_sum(sum, red);
    for (int32_t j = threadIdx.x; j < t; j += blockDim.x)
        pr[j] = j < n ? pr[j] * inv : 0.0f;
}

__global__ static void FG_BLOCK_BOUNDS observe_sums(const int32_t *pos, int32_t t, int32_t W, int32_t G,
                                                    int32_t decode_from, float *p, float *col_all, float *col_decode) {
    const int32_t j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= t)
        return;
    float all = 0.0f, dec = 0.0f;
    for (int32_t h = 0; h < G; h++)
        for (int32_t i = 0; i < W; i++) {
            if (j > pos[i])
                continue;
            float *x = p + ((size_t)h * W + i) * t + j;
            all += *x / (float)G;
            if (pos[i] >= decode_from)
                dec += *x / (float)G;
            if (*x < FG_OBSERVE_NEGLIGIBLE && j < pos[i])
                *x = 0.0f;
        }
    col_all[j] = all;
    col_decode[j] = dec;
}

/* Columns of V a block sums at once: the per-level sums of a chunk fit in
 * (n_levels + 1) (LEVEL_COLS + 1) floats of shared memory whatever d. */
#define LEVEL_COLS 128

__global__ static void level_errors(const float *v, const float *p, const uint8_t *entry, const int32_t *pos,
                                    int32_t t, int32_t W, int32_t G, int32_t d, int32_t n_sets, int32_t n_levels,
                                    int32_t mass, double *err) {
    FG_DYNAMIC_SHARED(float, acc); /* [n_levels + 1][LEVEL_COLS + 1]: a chunk's columns, then the attention */
    const int32_t i = blockIdx.x, s = blockIdx.y, n = pos[i] + 1, x = threadIdx.x, w = LEVEL_COLS + 1;
    const uint8_t *e = entry + ((size_t)s * W + i) * t;
    double out = 0.0; /* thread l: level l's error, summed over the heads and the chunks */
    for (int32_t h = 0; h < G; h++) {
        const float *pr = p + ((size_t)h * W + i) * t;
        for (int32_t c0 = 0; c0 < d; c0 += LEVEL_COLS) {
            const int32_t cw = d - c0 < LEVEL_COLS ? d - c0 : LEVEL_COLS; /* column cw: the attention */
            for (int32_t c = x; c < (n_levels + 1) * w; c += blockDim.x)
                acc[c] = 0.0f;
            __syncthreads();
            if (x <= cw)
                for (int32_t j = 0; j < n; j++) {
                    const float pj = pr[j];
                    if (pj == 0.0f)
                        continue;
                    const int32_t l = e[j] < n_levels ? e[j] : n_levels;
                    acc[l * w + x] += pj * (x < cw ? v[(size_t)j * d + c0 + x] : 1.0f);
                }
            __syncthreads();
            if (x < n_levels) {
                double total = 0.0, kept_mass = 0.0;
                for (int32_t l = 0; l <= n_levels; l++) {
                    total += acc[l * w + cw];
                    if (l <= x)
                        kept_mass += acc[l * w + cw];
                }
                if (mass) {
                    if (c0 == 0)
                        out += 1.0 - kept_mass;
                } else {
                    double e2 = 0.0;
                    for (int32_t c = 0; c < cw; c++) {
                        double all = 0.0, kept = 0.0;
                        for (int32_t l = 0; l <= n_levels; l++) {
                            all += acc[l * w + c];
                            if (l <= x)
                                kept += acc[l * w + c];
                        }
                        const double diff = (kept_mass > 0.0 ? kept / kept_mass : 0.0) - all / total;
                        e2 += diff * diff;
                    }
                    out += e2;
                }
            }
            __syncthreads();
        }
    }
    if (x < n_levels)
        err[((size_t)i * n_sets + s) * n_levels + x] = out;
}

/* The page tables of a unit into the arena at `at`. */
static fg_status upload_tables(fg_backend *be, const fg_observe_unit *u, unsigned char *base, size_t *at,
                               void **d_pages, void **d_meta) {
    fg_status s = FG_GPU(upload)(be, base, at, u->pages, (size_t)u->n_pages * sizeof(void *), d_pages);
    return s ? s : FG_GPU(upload)(be, base, at, u->meta, (size_t)u->n_pages * sizeof(void *), d_meta);
}

extern "C" fg_status FG_GPU(adaptive_observe)(fg_backend *be, const fg_page_layout *layout, const fg_shape *shape,
                                              const fg_observe_unit *u, const float *q, int32_t decode_from,
                                              float *col_all, float *col_decode) {
    fg_gpu_state *st = (fg_gpu_state *)be->impl;
    const int32_t d = shape->head_dim, G = shape->n_q_heads / shape->n_kv_heads, t = u->t, W = u->n_rows;
    if (t <= 0)
        return FG_OK;
    float *k = u->scratch, *v = k + (size_t)t * d, *p = v + (size_t)t * d;
    const size_t need = 2 * fg_gpu_align((size_t)u->n_pages * sizeof(void *)) + fg_gpu_align((size_t)W * 4) +
                        fg_gpu_align((size_t)W * G * d * 4) + 2 * fg_gpu_align((size_t)t * 4) + 2048;
    unsigned char *base;
    fg_status s = FG_GPU(scratch)(be, need, &base);
    size_t at = 0;
    void *d_pages, *d_meta, *d_pos, *d_q;
    if (s || (s = upload_tables(be, u, base, &at, &d_pages, &d_meta)))
        return s;
    FG_LAUNCH(unpack_rows, t, 64, 0, st->stream, fg_gpu_layout_of(layout), (void *const *)d_pages,
              (void *const *)d_meta, k, v);
    GPU_CHECK(be, cudaGetLastError());
    if (W == 0) /* the unpack only: compact reads the rows next, on the same stream */
        return FG_OK;
    if ((s = FG_GPU(upload)(be, base, &at, u->row_pos, (size_t)W * 4, &d_pos)) ||
        (s = FG_GPU(upload)(be, base, &at, q, (size_t)W * G * d * 4, &d_q)))
        return s;
    at = fg_gpu_align(at);
    float *d_all = (float *)(base + at), *d_dec = (float *)(base + fg_gpu_align(at + (size_t)t * 4));
    FG_LAUNCH(observe_rows, dim3(W, G), FG_THREADS, (d + FG_THREADS) * sizeof(float), st->stream, (const float *)d_q,
              (const float *)k, (const int32_t *)d_pos, t, W, G, d, 1.0f / sqrtf((float)d), p);
    GPU_CHECK(be, cudaGetLastError());
    FG_LAUNCH(observe_sums, (t + FG_THREADS - 1) / FG_THREADS, FG_THREADS, 0, st->stream, (const int32_t *)d_pos, t,
              W, G, decode_from, p, d_all, d_dec);
    GPU_CHECK(be, cudaGetLastError());
    GPU_CHECK(be, cudaMemcpyAsync(col_all, d_all, (size_t)t * 4, cudaMemcpyDeviceToHost, st->stream));
    GPU_CHECK(be, cudaMemcpyAsync(col_decode, d_dec, (size_t)t * 4, cudaMemcpyDeviceToHost, st->stream));
    return FG_GPU(synchronize)(be);
}

extern "C" fg_status FG_GPU(adaptive_errors)(fg_backend *be, const fg_shape *shape, const fg_observe_unit *u,
                                             int32_t n_sets, int32_t n_levels, const uint8_t *entry, int mass,
                                             double *err) {
    fg_gpu_state *st = (fg_gpu_state *)be->impl;
    const int32_t d = shape->head_dim, G = shape->n_q_heads / shape->n_kv_heads, t = u->t, W = u->n_rows;
    if (W == 0 || n_sets == 0)
        return FG_OK;
    const size_t shared = (size_t)(n_levels + 1) * (LEVEL_COLS + 1) * sizeof(float);
    if (shared > 48 * 1024) /* what every device gives a block without asking */
        return be->err(be->err_sink, FG_ERR_UNAVAILABLE, FG_GPU_NAME ": the adaptive mode's sums of %d levels "
                       "need %zu bytes of shared memory, more than a block's 48 KiB", (int)n_levels, shared);
    const float *v = u->scratch + (size_t)t * d, *p = v + (size_t)t * d;
    const size_t n_err = (size_t)W * n_sets * n_levels;
    const size_t need = fg_gpu_align((size_t)W * 4) + fg_gpu_align((size_t)n_sets * W * t) + n_err * 8 + 1024;
    unsigned char *base;
    fg_status s = FG_GPU(scratch)(be, need, &base);
    size_t at = 0;
    void *d_pos, *d_entry;
    if (s || (s = FG_GPU(upload)(be, base, &at, u->row_pos, (size_t)W * 4, &d_pos)) ||
        (s = FG_GPU(upload)(be, base, &at, entry, (size_t)n_sets * W * t, &d_entry)))
        return s;
    double *d_err = (double *)(base + fg_gpu_align(at));
    const int32_t cols = (d < LEVEL_COLS ? d : LEVEL_COLS) + 1; /* threads: a chunk's columns and the attention */
    const int32_t threads = ((cols > n_levels ? cols : n_levels) + 31) / 32 * 32;
    FG_LAUNCH(level_errors, dim3(W, n_sets), threads, shared, st->stream, v, p, (const uint8_t *)d_entry,
              (const int32_t *)d_pos, t, W, G, d, n_sets, n_levels, mass, d_err);
    GPU_CHECK(be, cudaGetLastError());
    GPU_CHECK(be, cudaMemcpyAsync(err, d_err, n_err * 8, cudaMemcpyDeviceToHost, st->stream));
    return FG_GPU(synchronize)(be);
}
