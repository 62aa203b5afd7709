/* Pass 2 of docs/design.md §2.3 on the GPU, tiled: a block owns a tile of BK keys
 * of one KV head, staged in shared memory with their positions; the query
 * rows that see them go by in tiles of BK rows, also through shared memory
 * (with their max and normaliser from pass 1), so each is read once per key
 * tile, not once per key. Thread (key, lane) scores its key against the
 * R = BK / L rows lane, lane + L, ... of each tile (L = lanes per key) at
 * once: each element of its key read from shared memory serves R rows, and
 * the rows' elements come 4 at a time (16-byte loads, one address across
 * the warp for BK = 32, two for BK = 16), so a (row, key) pair costs
 * d / 4 + d / R shared loads a thread instead of the one-row loop's 2 d,
 * which bound it (docs/backends.md "Profiling on the GPU"). Each dot still adds its d
 * products in order, so a pair's score is the one-row loop's bit for bit.
 * A thread keeps the pooled attention it got (col) and the part from rows
 * whose window holds it (col_local), and the lanes' sums are added in a
 * fixed order at the end: no atomics, and the sums do not depend on
 * timing. Head dims above 256 take the one-block-per-key kernel. */
#include "kernels_cuda/gpu_common.cuh"

/* x[w] for a w known only at run time, read with constant indices, so that
 * x stays in registers (an indexed register array goes to local memory). */
__device__ static inline float fg_pick(const float (&x)[FG_MAX_SHORTLIST], int32_t w) {
    float r = 0.0f;
FG_UNROLL
    for (int32_t i = 0; i < FG_MAX_SHORTLIST; i++)
        r = i == w ? x[i] : r;
    return r;
}

/* A query row's words in shared memory: d rounded up to 4 (16-byte loads),
 * then 4 more, so that two rows read by one warp (BK = 16) start in
 * different banks. */
#define QROW(d) ((((d) + 3) & ~3) + 4)

template <int BK>
__global__ static void FG_BLOCK_BOUNDS profile_tiles(fg_profile_request req, int32_t Hq, int32_t Hkv, int32_t d,
                                                     const float *q, const float *k, const float *row_max,
                                                     const float *row_sum, const int32_t *key_pos, float *col,
                                                     float *col_local) {
    FG_DYNAMIC_SHARED(float, sh);
    constexpr int32_t L = FG_THREADS / BK, R = BK / L; /* lanes a key, rows a lane in a tile */
    /* every row of a tile has its lane, and qs starts 16 bytes aligned (BK (d + 1) words of keys before it;
       dynamic shared memory itself starts at least 16-byte aligned) */
    static_assert(BK % L == 0 && BK % 4 == 0, "profile_tiles: BK rows in R per lane, qs 16-byte aligned");
    const int32_t D1 = d + 1;        /* padded key rows: the keys of a warp read different banks */
    const int32_t QD = QROW(d);      /* query rows 16-byte aligned, 4 words apart in the banks */
    float *ks = sh, *qs = ks + BK * D1, *mx = qs + BK * QD, *inv = mx + BK, *part = inv + BK; /* part: [L][BK] */
    const int32_t key = threadIdx.x % BK, lane = threadIdx.x / BK;
    const int32_t g = blockIdx.y, G = Hq / Hkv, n = req.n, j0 = blockIdx.x * BK, j = j0 + key;
    const float scale = 1.0f / sqrtf((float)d);
    for (int32_t e = threadIdx.x; e < BK * d; e += blockDim.x) {
        const int32_t jj = e / d, c = e % d;
        ks[jj * D1 + c] = j0 + jj < n ? k[((size_t)(j0 + jj) * Hkv + g) * d + c] : 0.0f;
    }
    /* a query tile goes up 4 words a thread, each thread at one column and
     * every FG_THREADS / (d / 4)-th row, where d / 4 divides the block and q
     * allows 16-byte loads (no division a word: the tiles of the rows are
     * loaded G (n - j0) / BK times a block, the keys once) */
    const int32_t d4 = d / 4;
    const int vec_q = d % 4 == 0 && FG_THREADS % d4 == 0 && ((uintptr_t)q % 16) == 0;
    const int32_t q_col = vec_q ? 4 * ((int32_t)threadIdx.x % d4) : 0, q_row = vec_q ? (int32_t)threadIdx.x / d4 : 0;
    const int32_t q_step = vec_q ? FG_THREADS / d4 : 0;
    float total = 0.0f, local[FG_MAX_SHORTLIST];
FG_UNROLL
    for (int w = 0; w < FG_MAX_SHORTLIST; w++)
        local[w] = 0.0f;
    const int32_t first = j0 > req.row_begin ? j0 : req.row_begin; /* rows before j0 see none of the tile */
    for (int32_t h = g * G; h < (g + 1) * G; h++)
        for (int32_t i0 = first; i0 < n; i0 += BK) {
            __syncthreads(); /* the last tile's rows are read */
            if (vec_q) {
                for (int32_t r = q_row; r < BK; r += q_step) {
                    float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                    if (i0 + r < n) {
                        x = *(const float4 *)(q + ((size_t)(i0 + r) * Hq + h) * d + q_col);
                        x = make_float4(x.x * scale, x.y * scale, x.z * scale, x.w * scale);
                    }
                    *(float4 *)(qs + r * QD + q_col) = x;
                }
            } else {
                for (int32_t e = threadIdx.x; e < BK * d; e += blockDim.x) {
                    const int32_t r = e / d, c = e % d;
                    qs[r * QD + c] = i0 + r < n ? q[((size_t)(i0 + r) * Hq + h) * d + c] * scale : 0.0f;
                }
            }
            for (int32_t r = threadIdx.x; r < BK; r += blockDim.x) {
                const int32_t i = i0 + r < n ? i0 + r : n - 1;
                mx[r] = row_max[(size_t)h * n + i];
                inv[r] = 1.0f / (row_sum[(size_t)h * n + i] * (float)G);
            }
            __syncthreads();
            if (i0 + lane >= n || j >= n) /* none of its rows is in the prompt, or no key */
                continue;
            /* the R dots, each over c in order */
            float s[R];
FG_UNROLL
            for (int32_t x = 0; x < R; x++)
                s[x] = 0.0f;
            const float *kk = ks + key * D1;
            int32_t c = 0;
            for (; c + 4 <= d; c += 4) {
                const float k0 = kk[c], k1 = kk[c + 1], k2 = kk[c + 2], k3 = kk[c + 3];
FG_UNROLL
                for (int32_t x = 0; x < R; x++) {
                    const float4 qv = *(const float4 *)(qs + (lane + x * L) * QD + c);
                    s[x] += qv.x * k0;
                    s[x] += qv.y * k1;
                    s[x] += qv.z * k2;
                    s[x] += qv.w * k3;
                }
            }
            for (; c < d; c++) {
FG_UNROLL
                for (int32_t x = 0; x < R; x++)
                    s[x] += qs[(lane + x * L) * QD + c] * kk[c];
            }
FG_UNROLL
            for (int32_t x = 0; x < R; x++) {
                const int32_t r = lane + x * L, i = i0 + r;
                if (i >= n || i < j) /* past the prompt, or before the key (causal) */
                    continue;
                const float a = expf(s[x] - mx[r]) * inv[r];
                total += a;
                const int32_t age = key_pos ? key_pos[i] - key_pos[j] : i - j;
FG_UNROLL /* constant indices: `local` stays in registers, not in local memory */
                for (int32_t w = 0; w < FG_MAX_SHORTLIST; w++)
                    if (w < req.n_windows && age < req.window[w])
                        local[w] += a;
            }
        }
    /* the lanes' sums of each key, added in lane order */
    for (int32_t w = -1; w < req.n_windows; w++) {
        __syncthreads();
        part[lane * BK + key] = w < 0 ? total : fg_pick(local, w);
        __syncthreads();
        if (lane == 0 && j < n) {
            float sum = 0.0f;
            for (int32_t x = 0; x < L; x++)
                sum += part[x * BK + key];
            if (w < 0)
                col[(size_t)g * n + j] = sum;
            else
                col_local[((size_t)w * Hkv + g) * n + j] = sum;
        }
    }
}

/* Head dims above 256: one block per (key, KV head), threads striding over
 * the rows that see the key. */
__global__ static void FG_BLOCK_BOUNDS profile_keys(fg_profile_request req, int32_t Hq, int32_t Hkv, int32_t d,
                                                    const float *q, const float *k, const float *row_max,
                                                    const float *row_sum, const int32_t *key_pos, float *col,
                                                    float *col_local) {
    FG_DYNAMIC_SHARED(float, sh);
    float *ks = sh, *red = ks + d; /* [d] [T] */
    const int32_t j = blockIdx.x, g = blockIdx.y, G = Hq / Hkv, n = req.n, T = blockDim.x;
    const float scale = 1.0f / sqrtf((float)d);
    for (int32_t c = threadIdx.x; c < d; c += T)
        ks[c] = k[((size_t)j * Hkv + g) * d + c];
    __syncthreads();
    float total = 0.0f, local[FG_MAX_SHORTLIST] = {0};
    const int32_t first = j > req.row_begin ? j : req.row_begin;
    for (int32_t h = g * G; h < (g + 1) * G; h++)
        for (int32_t i = first + threadIdx.x; i < n; i += T) {
            const float *qi = q + ((size_t)i * Hq + h) * d;
            float s = 0.0f;
            for (int32_t c = 0; c < d; c++)
                s += qi[c] * scale * ks[c];
            const float a = expf(s - row_max[(size_t)h * n + i]) / (row_sum[(size_t)h * n + i] * (float)G);
            total += a;
            const int32_t age = key_pos ? key_pos[i] - key_pos[j] : i - j;
FG_UNROLL /* constant indices: `local` stays in registers, not in scratch memory */
            for (int32_t w = 0; w < FG_MAX_SHORTLIST; w++)
                if (w < req.n_windows && age < req.window[w])
                    local[w] += a;
        }
    total = fg_block_sum(total, red);
    if (threadIdx.x == 0)
        col[(size_t)g * n + j] = total;
    for (int32_t w = 0; w < req.n_windows; w++) {
        const float lw = fg_block_sum(fg_pick(local, w), red);
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
    const int32_t *kp = (const int32_t *)dpos;
    const float *fq = (const float *)dq, *fk = (const float *)dk, *fmax = (const float *)dmax, *fsum = (const float *)dsum;
#define TILED(BK)                                                                                                      \
    FG_LAUNCH((profile_tiles<BK>), dim3((n + BK - 1) / BK, Hkv), FG_THREADS,                                           \
              (BK * ((size_t)d + 1 + QROW(d)) + 2 * BK + FG_THREADS) * sizeof(float), st->stream, *req, Hq, Hkv, d,  \
              fq, fk,                                                                                                  \
              fmax, fsum, kp, dcol, dcl)
    if (d <= 128)
        TILED(32);
    else if (d <= 256)
        TILED(16);
    else
        FG_LAUNCH(profile_keys, dim3(n, Hkv), FG_THREADS, shared, st->stream, *req, Hq, Hkv, d, fq, fk, fmax, fsum, kp,
                  dcol, dcl);
#undef TILED
    GPU_CHECK(be, cudaGetLastError());
    GPU_CHECK(be, cudaMemcpyAsync(col, dcol, nc, cudaMemcpyDeviceToHost, st->stream));
    if (req->n_windows)
        GPU_CHECK(be, cudaMemcpyAsync(col_local, dcl, (size_t)req->n_windows * nc, cudaMemcpyDeviceToHost,
                                      st->stream));
    return FG_GPU(synchronize)(be); /* the host chooses the policies from col */
}
