/* Pass 2 of DESIGN §2.3 on the GPU: one block per (key, KV head) owns that
 * key's statistics, so there are no atomics and the sums are reproducible.
 * Threads stride over the rows that see the key; the pooled attention each
 * row gives it goes to col and, for rows whose window holds it, col_local. */
#include "kernels_cuda/gpu_common.cuh"

__global__ static void profile_keys(fg_profile_request req, int32_t Hq, int32_t Hkv, int32_t d, const float *q,
                                    const float *k, const float *row_max, const float *row_sum,
                                    const int32_t *key_pos, float *col, float *col_local) {
    FG_DYNAMIC_SHARED(float, sh);
    float *ks = sh, *red = ks + d; /* [d] [T] */
    const int32_t j = blockIdx.x, g = blockIdx.y, G = Hq / Hkv, n = req.n, T = blockDim.x;
    const float scale = 1.0f / sqrtf((float)d);
    for (int32_t c = threadIdx.x; c < d; c += T)
        ks[c] = k[((size_t)j * Hkv + g) * d + c] * scale;
    __syncthreads();
    float total = 0.0f, local[FG_MAX_SHORTLIST] = {0};
    const int32_t first = j > req.row_begin ? j : req.row_begin;
    for (int32_t h = g * G; h < (g + 1) * G; h++)
        for (int32_t i = first + threadIdx.x; i < n; i += T) {
            const float *qi = q + ((size_t)i * Hq + h) * d;
            float s = 0.0f;
            for (int32_t c = 0; c < d; c++)
                s += qi[c] * ks[c];
            const float a = expf(s - row_max[(size_t)h * n + i]) / (row_sum[(size_t)h * n + i] * (float)G);
            total += a;
            const int32_t age = key_pos ? key_pos[i] - key_pos[j] : i - j;
            for (int32_t w = 0; w < req.n_windows; w++)
                if (age < req.window[w])
                    local[w] += a;
        }
    total = fg_block_sum(total, red);
    if (threadIdx.x == 0)
        col[(size_t)g * n + j] = total;
    for (int32_t w = 0; w < req.n_windows; w++) {
        const float lw = fg_block_sum(local[w], red);
        if (threadIdx.x == 0)
            col_local[((size_t)w * Hkv + g) * n + j] = lw;
    }
}

extern "C" fg_status FG_GPU(profile_stats)(fg_backend *be, const fg_shape *shape, const fg_profile_request *req,
                                           const float *q, const float *k, const float *row_max,
                                           const float *row_sum, float *col, float *col_local) {
    fg_gpu_state *st = (fg_gpu_state *)be->impl;
    const int32_t Hq = shape->n_q_heads, Hkv = shape->n_kv_heads, d = shape->head_dim, n = req->n;
    const size_t nq = (size_t)n * Hq * d * 4, nk = (size_t)n * Hkv * d * 4, ns = (size_t)Hq * n * 4;
    const size_t nc = (size_t)Hkv * n * 4, ncl = (size_t)(req->n_windows ? req->n_windows : 1) * nc;
    const size_t shared = ((size_t)d + FG_THREADS) * sizeof(float);
    unsigned char *base;
    size_t at = 0;
    const void *dq = q, *dk = k, *dmax = row_max, *dsum = row_sum; /* device I/O: already there */
    const size_t np = req->key_pos ? (size_t)n * 4 : 0;
    fg_status s = FG_GPU(scratch)(be, (be->device_io ? 0 : nq + nk + 2 * ns) + np + nc + ncl + 8 * 256, &base);
    const void *dpos = NULL; /* a host array on either I/O */
    if (!s && np)
        s = FG_GPU(upload)(be, base, &at, req->key_pos, np, (void **)&dpos);
    if (!be->device_io) {
        void *x;
        if (!s && !(s = FG_GPU(upload)(be, base, &at, q, nq, &x))) dq = x;
        if (!s && !(s = FG_GPU(upload)(be, base, &at, k, nk, &x))) dk = x;
        if (!s && !(s = FG_GPU(upload)(be, base, &at, row_max, ns, &x))) dmax = x;
        if (!s && !(s = FG_GPU(upload)(be, base, &at, row_sum, ns, &x))) dsum = x;
    }
    if (s)
        return s;
    float *dcol = (float *)(base + fg_gpu_align(at)), *dcl = (float *)((unsigned char *)dcol + fg_gpu_align(nc));
    FG_LAUNCH(profile_keys, dim3(n, Hkv), FG_THREADS, shared, st->stream, *req, Hq, Hkv, d, (const float *)dq,
              (const float *)dk, (const float *)dmax, (const float *)dsum, (const int32_t *)dpos, dcol, dcl);
    GPU_CHECK(be, cudaGetLastError());
    GPU_CHECK(be, cudaMemcpyAsync(col, dcol, nc, cudaMemcpyDeviceToHost, st->stream));
    if (req->n_windows)
        GPU_CHECK(be, cudaMemcpyAsync(col_local, dcl, (size_t)req->n_windows * nc, cudaMemcpyDeviceToHost,
                                      st->stream));
    return FG_GPU(synchronize)(be); /* the host chooses the policies from col */
}
