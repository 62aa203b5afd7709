/* Causal prefill attention on the GPU, keeping each row's max and normaliser
 * (pass 1 of docs/design.md §2.3), tiled as in FlashAttention: a block takes a tile
 * of 32 query rows of one query head, 8 lanes per row, each lane a stripe of
 * the head dimension in registers (its query and output accumulator), and
 * walks the keys in tiles staged through shared memory (K and V read once
 * per query tile, not once per row), with an online softmax per row. No
 * n x n buffer.
 *
 * A row's arithmetic does not depend on the block it is in: key tiles start
 * at multiples of the tile size, and the tiles past a row are masked out
 * exactly (their scale is 1 and their weights 0). So a chunked prefill
 * (row_begin > 0) gives one-shot prefill's rows bit for bit, and so does a
 * re-profiled append over the same keys. Head dims above 256 take the
 * one-block-per-row kernel. */
#include "kernels_cuda/gpu_common.cuh"

#define ROW_LANES 8                      /* lanes per query row */
#define TILE_ROWS (FG_THREADS / ROW_LANES) /* query rows per block */

/* DPL: head-dim elements per lane (d <= 8 * DPL); BK: keys per tile. */
template <int DPL, int BK>
__global__ static void FG_BLOCK_BOUNDS prefill_tiles(int32_t n, int32_t row_begin, int32_t Hq, int32_t Hkv, int32_t d,
                                                     const float *q, const float *k, const float *v, float *out,
                                                     float *row_max, float *row_sum) {
    FG_DYNAMIC_SHARED(float, sh);
    float *ks = sh, *vs = ks + BK * d, *red = vs + BK * d; /* [BK][d] [BK][d] [BK][T] (shared sums only) */
    const int32_t lane = threadIdx.x % ROW_LANES, r = threadIdx.x / ROW_LANES, h = blockIdx.y, g = h / (Hq / Hkv);
    const int32_t first = row_begin + (int32_t)blockIdx.x * TILE_ROWS, i = first + r, valid = i < n;
    const int32_t last = fg_imin(first + TILE_ROWS, n) - 1, row = valid ? i : first; /* rows past n mirror the first */
    const float scale = 1.0f / sqrtf((float)d);
    float qr[DPL], acc[DPL];
FG_UNROLL
    for (int x = 0; x < DPL; x++) {
        const int32_t c = lane + ROW_LANES * x;
        qr[x] = c < d ? q[((size_t)(row - row_begin) * Hq + h) * d + c] * scale : 0.0f;
        acc[x] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    for (int32_t j0 = 0; j0 <= last; j0 += BK) {
        for (int32_t e = threadIdx.x; e < BK * d; e += blockDim.x) { /* the tile of K and V */
            const int32_t jj = e / d, c = e % d, j = j0 + jj;
            ks[e] = j <= last ? k[((size_t)j * Hkv + g) * d + c] : 0.0f;
            vs[e] = j <= last ? v[((size_t)j * Hkv + g) * d + c] : 0.0f;
        }
        __syncthreads();
        /* the tile's keys KS at a time: one online-softmax round each, so a
         * round's scores and loads stay in registers (hipcc, given all BK
         * keys unrolled, holds their loads at once and spills) */
        constexpr int KS = DPL >= 32 ? 4 : 8;
FG_NO_UNROLL
        for (int32_t k0 = 0; k0 < BK; k0 += KS) {
            float s[KS];
FG_UNROLL
            for (int jj = 0; jj < KS; jj++) {
                float dot = 0.0f;
FG_UNROLL
                for (int x = 0; x < DPL; x++) {
                    const int32_t c = lane + ROW_LANES * x;
                    dot += c < d ? qr[x] * ks[(k0 + jj) * d + c] : 0.0f;
                }
                s[jj] = dot;
            }
            fg_group_sum_n<KS>(s, ROW_LANES, red);
            float mt = m;
FG_UNROLL
            for (int jj = 0; jj < KS; jj++) {
                s[jj] = j0 + k0 + jj <= row ? s[jj] : -INFINITY; /* causal */
                mt = fmaxf(mt, s[jj]);
            }
            const float alpha = expf(m - mt); /* 1 when the round brings no new max; 0 on the first */
            float psum = 0.0f;
FG_UNROLL
            for (int jj = 0; jj < KS; jj++) {
                s[jj] = expf(s[jj] - mt);
                psum += s[jj];
            }
            l = l * alpha + psum;
FG_UNROLL
            for (int x = 0; x < DPL; x++) {
                const int32_t c = lane + ROW_LANES * x;
                float a = acc[x] * alpha;
FG_UNROLL
                for (int jj = 0; jj < KS; jj++)
                    a += c < d ? s[jj] * vs[(k0 + jj) * d + c] : 0.0f;
                acc[x] = a;
            }
            m = mt;
        }
        __syncthreads();
    }
    if (!valid)
        return;
FG_UNROLL
    for (int x = 0; x < DPL; x++) {
        const int32_t c = lane + ROW_LANES * x;
        if (c < d)
            out[((size_t)(i - row_begin) * Hq + h) * d + c] = acc[x] / l;
    }
    if (lane == 0) {
        row_max[(size_t)h * (n - row_begin) + i - row_begin] = m;
        row_sum[(size_t)h * (n - row_begin) + i - row_begin] = l;
    }
}

/* Head dims above 256: one block per (query row, query head); keys go by in
 * tiles of blockDim, one per thread, through an online softmax, the output
 * accumulating in shared memory with threads over the head dimension. */
__global__ static void FG_BLOCK_BOUNDS prefill_rows(int32_t n, int32_t row_begin, int32_t Hq, int32_t Hkv, int32_t d,
                                                    const float *q, const float *k, const float *v, float *out,
                                                    float *row_max, float *row_sum) {
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

/* Queues the kernel for m = n - row_begin rows (device addresses). */
static void launch(fg_gpu_state *st, int32_t n, int32_t row_begin, int32_t Hq, int32_t Hkv, int32_t d, const float *q,
                   const float *k, const float *v, float *out, float *row_max, float *row_sum) {
    const int32_t m = n - row_begin;
    const dim3 tiles((m + TILE_ROWS - 1) / TILE_ROWS, Hq);
    const size_t red = FG_GROUP_SUM_SHARED ? 32 * (size_t)FG_THREADS : 0; /* the group sums' shared fallback */
#define TILED(DPL, BK)                                                                                                 \
    FG_LAUNCH((prefill_tiles<DPL, BK>), tiles, FG_THREADS, (2 * BK * (size_t)d + red) * sizeof(float), st->stream, n,  \
              row_begin, Hq, Hkv, d, q, k, v, out, row_max, row_sum)
    if (d <= 32)
        TILED(4, 32);
    else if (d <= 64)
        TILED(8, 32);
    else if (d <= 128)
        TILED(16, 32);
    else if (d <= 256)
        TILED(32, 16);
    else
        FG_LAUNCH(prefill_rows, dim3(m, Hq), FG_THREADS, (2 * (size_t)d + 2 * FG_THREADS) * sizeof(float), st->stream,
                  n, row_begin, Hq, Hkv, d, q, k, v, out, row_max, row_sum);
#undef TILED
}

extern "C" fg_status FG_GPU(prefill_attention)(fg_backend *be, const fg_shape *shape, int32_t n, int32_t row_begin,
                                               const float *q, const float *k, const float *v, float *out,
                                               float *row_max, float *row_sum) {
    fg_gpu_state *st = (fg_gpu_state *)be->impl;
    const int32_t Hq = shape->n_q_heads, Hkv = shape->n_kv_heads, d = shape->head_dim;
    const int32_t m = n - row_begin; /* the rows computed */
    const size_t nq = (size_t)m * Hq * d * 4, nk = (size_t)n * Hkv * d * 4, ns = (size_t)Hq * m * 4;
    if (be->device_io) { /* everything is on the device already: queue the kernel, wait for nothing */
        launch(st, n, row_begin, Hq, Hkv, d, q, k, v, out, row_max, row_sum);
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
    launch(st, n, row_begin, Hq, Hkv, d, (const float *)dq, (const float *)dk, (const float *)dv, dout, dmax, dsum);
    GPU_CHECK(be, cudaGetLastError());
    GPU_CHECK(be, cudaMemcpyAsync(out, dout, nq, cudaMemcpyDeviceToHost, st->stream));
    GPU_CHECK(be, cudaMemcpyAsync(row_max, dmax, ns, cudaMemcpyDeviceToHost, st->stream));
    GPU_CHECK(be, cudaMemcpyAsync(row_sum, dsum, ns, cudaMemcpyDeviceToHost, st->stream));
    GPU_CHECK(be, cudaStreamSynchronize(st->stream));
    return FG_OK;
}
