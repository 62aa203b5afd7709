/* Causal prefill attention on the GPU, keeping each row's max and normaliser
 * (pass 1 of DESIGN §2.3). One block per (query row, query head): keys go by
 * in tiles of blockDim, one per thread, through an online softmax; the output
 * accumulates in shared memory with threads over the head dimension. No
 * n x n buffer. */
#include "kernels_cuda/gpu_common.cuh"

__global__ static void prefill_rows(int32_t n, int32_t row_begin, int32_t Hq, int32_t Hkv, int32_t d, const float *q,
                                    const float *k, const float *v, float *out, float *row_max, float *row_sum) {
    FG_DYNAMIC_SHARED(float, sh);
    float *qs = sh, *acc = qs + d, *p = acc + d, *red = p + blockDim.x; /* [d] [d] [T] [T] */
    const int32_t i = row_begin + (int32_t)blockIdx.x, h = blockIdx.y, g = h / (Hq / Hkv), T = blockDim.x;
    const float scale = 1.0f / sqrtf((float)d);
    for (int32_t c = threadIdx.x; c < d; c += T) {
        qs[c] = q[((size_t)(i - row_begin) * Hq + h) * d + c] * scale;
        acc[c] = 0.0f;
    }
    __syncthreads();
    float m = -INFINITY, l = 0.0f;
    for (int32_t j0 = 0; j0 <= i; j0 += T) {
        const int32_t j = j0 + threadIdx.x;
        float s = -INFINITY;
        if (j <= i) {
            const float *kj = k + ((size_t)j * Hkv + g) * d;
            s = 0.0f;
            for (int32_t c = 0; c < d; c++)
                s += qs[c] * kj[c];
        }
        const float mn = fmaxf(m, fg_block_max(s, red));
        const float alpha = expf(m - mn), pj = j <= i ? expf(s - mn) : 0.0f;
        p[threadIdx.x] = pj;
        l = l * alpha + fg_block_sum(pj, red); /* the sum syncs: p is visible */
        const int32_t cnt = i - j0 + 1 < T ? i - j0 + 1 : T;
        for (int32_t c = threadIdx.x; c < d; c += T) {
            float a = acc[c] * alpha;
            for (int32_t jj = 0; jj < cnt; jj++)
                a += p[jj] * v[((size_t)(j0 + jj) * Hkv + g) * d + c];
            acc[c] = a;
        }
        m = mn;
        __syncthreads();
    }
    for (int32_t c = threadIdx.x; c < d; c += T)
        out[((size_t)(i - row_begin) * Hq + h) * d + c] = acc[c] / l;
    if (threadIdx.x == 0) {
        row_max[(size_t)h * (n - row_begin) + i - row_begin] = m;
        row_sum[(size_t)h * (n - row_begin) + i - row_begin] = l;
    }
}

extern "C" fg_status FG_GPU(prefill_attention)(fg_backend *be, const fg_shape *shape, int32_t n, int32_t row_begin,
                                               const float *q, const float *k, const float *v, float *out,
                                               float *row_max, float *row_sum) {
    fg_gpu_state *st = (fg_gpu_state *)be->impl;
    const int32_t Hq = shape->n_q_heads, Hkv = shape->n_kv_heads, d = shape->head_dim;
    const int32_t m = n - row_begin; /* the rows computed */
    const size_t nq = (size_t)m * Hq * d * 4, nk = (size_t)n * Hkv * d * 4, ns = (size_t)Hq * m * 4;
    const size_t shared = (2 * (size_t)d + 2 * FG_THREADS) * sizeof(float);
    if (be->device_io) { /* everything is on the device already: queue the kernel, wait for nothing */
        FG_LAUNCH(prefill_rows, dim3(m, Hq), FG_THREADS, shared, st->stream, n, row_begin, Hq, Hkv, d, q, k, v, out,
                  row_max, row_sum);
        GPU_CHECK(be, cudaGetLastError());
        return FG_OK;
    }
    unsigned char *base;
    size_t at = 0;
    void *dq, *dk, *dv;
    fg_status s = FG_GPU(scratch)(be, 2 * nq + 2 * nk + 2 * ns + 8 * 256, &base);
    if (!s) s = FG_GPU(upload)(be, base, &at, q, nq, &dq);
    if (!s) s = FG_GPU(upload)(be, base, &at, k, nk, &dk);
    if (!s) s = FG_GPU(upload)(be, base, &at, v, nk, &dv);
    if (s)
        return s;
    float *dout = (float *)(base + fg_gpu_align(at)), *dmax = (float *)(base + fg_gpu_align(at) + fg_gpu_align(nq));
    float *dsum = (float *)((unsigned char *)dmax + fg_gpu_align(ns));
    FG_LAUNCH(prefill_rows, dim3(m, Hq), FG_THREADS, shared, st->stream, n, row_begin, Hq, Hkv, d, (const float *)dq,
              (const float *)dk, (const float *)dv, dout, dmax, dsum);
    GPU_CHECK(be, cudaGetLastError());
    GPU_CHECK(be, cudaMemcpyAsync(out, dout, nq, cudaMemcpyDeviceToHost, st->stream));
    GPU_CHECK(be, cudaMemcpyAsync(row_max, dmax, ns, cudaMemcpyDeviceToHost, st->stream));
    GPU_CHECK(be, cudaMemcpyAsync(row_sum, dsum, ns, cudaMemcpyDeviceToHost, st->stream));
    GPU_CHECK(be, cudaStreamSynchronize(st->stream));
    return FG_OK;
}
