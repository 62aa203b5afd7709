/*
 * The decode step on the GPU (docs/design.md §2.5), four kernels (five with
 * groups of heads that rank together), after FlashDecoding:
 *   attend_chunks  one block per (chunk of a head's cached rows, group of up
 *                  to 4 query heads; FASTGEN_GPU_DECODE_HEADS=1|2|8 sets
 *                  another cap). The block first resolves its rows'
 *                  addresses (slot, row id, page) into shared memory, its
 *                  threads on many rows at a time; then a row is read by a
 *                  group of `lanes`
 *                  threads, each loading EPL contiguous elements (16 bytes
 *                  for f16 and bf16 at d = 128, so a warp reads whole rows),
 *                  and each K and V row is read once for the query heads of
 *                  the group. Every row group keeps an online softmax; the
 *                  block merges them into one partial state (max, sum,
 *                  output) per query head, and keeps the logits of the rows
 *                  for the score update;
 *   merge_heads    one block per (head, query head): merges the partial
 *                  states with the new token and writes the output;
 *   update_rows    one block per chunk: grows the scores, turns rows leaving
 *                  the window into frequent candidates, counts the candidates
 *                  and finds the lowest-ranked (one atomic per block);
 *   share_scores   one block per group of heads that rank together
 *                  (FG_ALLOC_LAYER): every slot's score becomes the group's
 *                  mean, and the candidates are counted and the lowest-
 *                  ranked found again, from the mean;
 *   finish_heads   one block per head: inserts the new row, drops rows that
 *                  leave a window without a frequent part, evicts the lowest-
 *                  ranked candidates (ties to the older) down to the budget,
 *                  and checks the slot count against the host's mirror.
 * The host's bookkeeping (descriptors, chunks; with host I/O also q, k and v)
 * travels in one upload; with device I/O the step does not wait. The page
 * tables stay on the device, one per head, kept by the core
 * (fg_decode_head.tab): the upload carries only the entries that changed
 * since a head's last step (a page every page_tokens steps, a copied meta
 * page), which write_tables puts in place first. Callers without tables
 * (tests, benchmarks) have theirs built and copied each step.
 */
#include <stdlib.h>
#include <string.h>

#include "kernels_cuda/gpu_common.cuh"

struct decode_desc {
    const float *q, *k, *v; /* [G][d], [d], [d]: device addresses */
    float *out;             /* [G][d] */
    void *const *pages;     /* its page tables (device addresses): n_pages row pages */
    void *const *meta;      /* and as many meta pages */
    int64_t praw;           /* its logits: [G][n_slots] */
    int32_t n_slots, n_after, n_pages, priv_from, row_base;
    uint32_t components;
    int32_t score_mode, pos, insert_flag, window_start, freq_budget;
    int32_t item0, n_items; /* its chunks */
    int32_t share_first, share_n; /* its group of heads that rank together (FG_ALLOC_LAYER); share_n 1: alone */
};

struct decode_item {
    int32_t head, begin, end;
};

/* A table entry the step writes before its kernels read the tables: an
 * entry of a head's table kept on the device that changed since its last
 * step (a page added, a meta page copied or restored). */
struct table_write {
    void **at;
    void *page;
};

__global__ static void FG_BLOCK_BOUNDS write_tables(const table_write *w, int32_t n) {
    const int32_t i = (int32_t)(blockIdx.x * blockDim.x + threadIdx.x);
    if (i < n)
        *w[i].at = w[i].page;
}

/* Rows each row group loads before it computes on them: loads in flight
 * hide the memory's latency. */
#define ROWS_IN_FLIGHT 4

/* A lane's EPL elements of ES bytes, raw, as 32-bit words (one when ES * EPL
 * is 2): loaded with 16-byte loads where they fit. ES = 0: quantized rows,
 * whose EPL values the lane reads dequantized, one fp32 word each. */
template <int ES, int EPL> struct lane_words {
    static constexpr int n = ES == 0 ? EPL : ES * EPL >= 4 ? ES * EPL / 4 : 1;
};

/* Rows in flight for NW words a lane: ROWS_IN_FLIGHT, fewer where the K and
 * V words would crowd out the registers: 2 at 16 words (f32 rows of d > 256,
 * 16-bit rows of d > 512), 1 at 32 (f32 rows of d > 512); four rows of both
 * spilled there. A divisor of ROWS_IN_FLIGHT, so the host's chunks
 * (multiples of ROWS_IN_FLIGHT rows a row group) hold whole rounds. */
__host__ __device__ constexpr int rows_in_flight(int nw) { return nw >= 32 ? 1 : nw >= 16 ? 2 : ROWS_IN_FLIGHT; }

/* A lane's EPL values of a quantized row from column c0, as fp32 bits:
 * q * scale, which fp32 holds exactly, so every backend reads the same
 * values. c0 is a multiple of EPL (4 or 8) and a block holds 8 values or
 * more, so the lane's values lie in one block: one scale a row. */
template <int EPL>
__device__ static inline void load_quant_words(const fg_gpu_layout &L, const unsigned char *row, int32_t c0,
                                               uint32_t *w) {
    const int32_t qb = 1 << L.qshift;
    const fg_dtype dtype = (fg_dtype)L.dtype;
    const unsigned char *blk = row + (size_t)(c0 >> L.qshift) * fg_qblock_bytes(dtype, qb);
    const float scale = fg_get_f16(blk);
FG_UNROLL
    for (int e = 0; e < EPL; e++)
        w[e] = fg_f32_bits((float)fg_qvalue(blk, dtype, qb, (c0 & (qb - 1)) + e) * scale);
}

template <int ES, int EPL> __device__ static inline void load_words(const unsigned char *p, uint32_t *w) {
    constexpr int BYTES = ES * EPL;
    if constexpr (BYTES % 16 == 0) {
FG_UNROLL
        for (int i = 0; i < BYTES / 16; i++) {
            const uint4 u = ((const uint4 *)p)[i];
            w[4 * i] = u.x;
            w[4 * i + 1] = u.y;
            w[4 * i + 2] = u.z;
            w[4 * i + 3] = u.w;
        }
    } else if constexpr (BYTES == 8) {
        const uint2 u = *(const uint2 *)p;
        w[0] = u.x;
        w[1] = u.y;
    } else if constexpr (BYTES == 4) {
        w[0] = *(const uint32_t *)p;
    } else {
        w[0] = *(const uint16_t *)p;
    }
}

/* Element e of loaded words, as a float (dtype tells f16 from bf16). */
template <int ES> __device__ static inline float word_elem(const uint32_t *w, int e, int32_t dtype) {
    if constexpr (ES == 4 || ES == 0)
        return fg_bits_f32(w[e]);
    else
        return fg_gpu_half_to_float(dtype, (uint16_t)(w[e >> 1] >> ((e & 1) * 16)));
}

/* At most this many query heads per block for EPL elements per lane: the
 * registers hold an output slice per head. */
__host__ __device__ constexpr int max_heads_per_block(int epl) { return epl >= 16 ? 64 / epl : 8; }

/* Dynamic shared memory of attend_chunks: the addresses of a tile of rows,
 * q of the block's heads (GBM x lanes x EPL floats), then the area for the
 * row groups' merge, their max and sum, and (without warp shuffles) the
 * group sums. */
static size_t attend_area_floats(int epl, int gbm, int threads) {
    size_t area = (size_t)threads * epl;
    if ((size_t)gbm * threads > area)
        area = (size_t)gbm * threads;
    if (FG_GROUP_SUM_SHARED && (size_t)ROWS_IN_FLIGHT * gbm * threads > area)
        area = (size_t)ROWS_IN_FLIGHT * gbm * threads;
    return area;
}
static size_t attend_shared_bytes(int epl, int gbm, int lanes, int threads, int tile) {
    return (size_t)tile * sizeof(void *) + ((size_t)gbm * lanes * epl + attend_area_floats(epl, gbm, threads)) *
                                               sizeof(float);
}

/* Rows whose addresses a block resolves at once: the whole chunk where the
 * shared memory allows (48 KB a block), else the most whole steps that fit. */
static int32_t attend_tile(int32_t chunk, int32_t step, int epl, int gbm, int lanes) {
    const size_t budget = 48 * 1024, fixed = attend_shared_bytes(epl, gbm, lanes, FG_THREADS, 0);
    int32_t tile = chunk;
    while (tile > step && fixed + (size_t)tile * sizeof(void *) > budget)
        tile -= step;
    return tile;
}

/* One block per (chunk, group of GBM query heads), the groups of a chunk
 * next to each other in the grid, so that they read its rows from the L2
 * together. A tile's row addresses are resolved first, each thread taking
 * rows T apart (slot -> row id -> page: dependent loads, but for many rows
 * at once); then a row group's loads depend on nothing but shared memory
 * (8-byte pointers at the start of the dynamic shared memory, whose base is
 * aligned to at least 16 bytes; the kernel has no static shared memory). Each row group
 * keeps an online softmax, rescaled once per round of rows in flight. */
template <int ES, int EPL, int GBM>
__global__ static void FG_BLOCK_BOUNDS attend_chunks(fg_gpu_layout L, int32_t G, int32_t lanes, int32_t tile,
                                                     const decode_desc *heads, const decode_item *items,
                                                     float *praw, float *part) {
    constexpr int NW = lane_words<ES, EPL>::n, U = rows_in_flight(NW);
    FG_DYNAMIC_SHARED(float, sh);
    const int32_t n_groups = (G + GBM - 1) / GBM, item = blockIdx.x / n_groups;
    const decode_item it = items[item];
    const decode_desc h = heads[it.head];
    void *const *pages = h.pages, *const *meta = h.meta;
    const int32_t d = L.head_dim, P = L.page_tokens, T = blockDim.x, dtype = L.dtype;
    const int32_t g0 = (blockIdx.x % n_groups) * GBM, GB = fg_imin(GBM, G - g0);
    const int32_t lane = threadIdx.x % lanes, rg = threadIdx.x / lanes, RG = T / lanes;
    const bool lane_on = lane * EPL < d;
    const bool track = fg_tracks_scores(h.components);
    const unsigned char **addr = (const unsigned char **)(void *)sh;  /* [tile] */
    float *qs = sh + tile * (sizeof(void *) / sizeof(float)), *red = qs + GBM * EPL * lanes; /* q, then the area */
    const size_t row_stride = ES == 0 ? L.row_bytes : (size_t)d * ES, lane_at = ES == 0 ? 0 : (size_t)lane * EPL * ES;
    const float scale = 1.0f / sqrtf((float)d);
    /* q of the block's heads, element e of lane x's slice at [g][e][x]: the
     * lanes of a row group read neighbouring words, no bank conflicts (with
     * each lane's slice contiguous, words EPL apart fell in 32 / EPL banks,
     * and the grouped kernels waited on shared memory: docs/backends.md). In
     * registers it would cost the four-head kernel its second block a
     * multiprocessor. */
    if (fg_dtype_quantized((fg_dtype)dtype)) { /* rounded to q8_0 as every backend rounds it: a thread a block */
        const int32_t qb = fg_qblock(d);
        for (int32_t b = threadIdx.x; b < GB * d / qb; b += T) {
            const float *x = h.q + (size_t)g0 * d + (size_t)b * qb;
            float inv, qscale;
            const bool rounds = fg_query_q8_block(x, qb, &inv, &qscale);
            for (int32_t e = 0; e < qb; e++) {
                const int32_t i = b * qb + e, g = i / d, c = i % d;
                const float xr = rounds ? (float)fg_q8_0_int(x[e], inv) * qscale : x[e];
                qs[(g * EPL + c % EPL) * lanes + c / EPL] = xr * scale;
            }
        }
    } else {
        for (int32_t i = threadIdx.x; i < GB * d; i += T) {
            const int32_t g = i / d, c = i % d;
            qs[(g * EPL + c % EPL) * lanes + c / EPL] = h.q[(size_t)g0 * d + i] * scale;
        }
    }

    float m[GBM], l[GBM], acc[GBM][EPL];
FG_UNROLL
    for (int g = 0; g < GBM; g++) {
        m[g] = -INFINITY;
        l[g] = 0.0f;
FG_UNROLL
        for (int e = 0; e < EPL; e++)
            acc[g][e] = 0.0f;
    }
    for (int32_t t0 = it.begin; t0 < it.end; t0 += tile) {
        const int32_t t1 = t0 + tile < it.end ? t0 + tile : it.end;
        __syncthreads(); /* the previous tile's addresses are used (and, the first time, q is in) */
        for (int32_t r = t0 + (int32_t)threadIdx.x; r < t1; r += T) {
            const int32_t row = *fg_slot_row(&L.pl, meta, r);
            addr[r - t0] = (const unsigned char *)pages[row / P] + (size_t)(row % P) * row_stride;
        }
        __syncthreads();
        /* row group rg takes rows t0 + rg + j * RG: neighbouring groups read neighbouring rows */
        const int32_t iters = (t1 - t0 + RG * U - 1) / (RG * U); /* the same for every thread */
        for (int32_t i = 0; i < iters; i++) {
            uint32_t kw[U][NW], vw[U][NW];
FG_UNROLL
            for (int u = 0; u < U; u++) {
                const int32_t r = t0 + rg + (i * U + u) * RG;
                if (r < t1 && lane_on) {
                    const unsigned char *row = addr[r - t0];
                    if constexpr (ES == 0) {
                        load_quant_words<EPL>(L, row + L.k_offset, lane * EPL, kw[u]);
                        load_quant_words<EPL>(L, row + L.v_offset, lane * EPL, vw[u]);
                    } else {
                        load_words<ES, EPL>(row + L.k_offset + lane_at, kw[u]);
                        load_words<ES, EPL>(row + L.v_offset + lane_at, vw[u]);
                    }
                } else {
FG_UNROLL
                    for (int w = 0; w < NW; w++)
                        kw[u][w] = vw[u][w] = 0u;
                }
            }
            float dot[U * GBM];
FG_UNROLL
            for (int u = 0; u < U; u++)
FG_UNROLL
                for (int g = 0; g < GBM; g++) {
                    float x = 0.0f;
                    if (g < GB && lane_on) {
                        const float *qg = qs + g * EPL * lanes + lane;
FG_UNROLL
                        for (int e = 0; e < EPL; e++)
                            x += qg[e * lanes] * word_elem<ES>(kw[u], e, dtype);
                    }
                    dot[u * GBM + g] = x;
                }
            fg_group_sum_n<U * GBM>(dot, lanes, red);
            /* the rows of this round: r0 + u * RG for u < nu */
            const int32_t r0 = t0 + rg + i * U * RG;
            const int nu = r0 >= t1 ? 0 : fg_imin(U, (t1 - r0 + RG - 1) / RG);
            if (nu == 0)
                continue;
FG_UNROLL
            for (int g = 0; g < GBM; g++) {
                if (g >= GB)
                    continue;
                float mx = m[g];
FG_UNROLL
                for (int u = 0; u < U; u++)
                    if (u < nu)
                        mx = fg_max_nan(mx, dot[u * GBM + g]);
                /* 0 the first time (m = -inf, mx finite); 1 while every score so far is -inf (nothing
                   held yet: -inf - -inf would be NaN, where ref's running max starts at the new token's) */
                const float c = mx == -INFINITY ? 1.0f : expf(m[g] - mx);
                l[g] *= c;
FG_UNROLL
                for (int e = 0; e < EPL; e++)
                    acc[g][e] *= c;
                m[g] = mx;
            }
FG_UNROLL
            for (int u = 0; u < U; u++) {
                if (u >= nu)
                    continue;
                const int32_t r = r0 + u * RG;
                float vx[EPL];
FG_UNROLL
                for (int e = 0; e < EPL; e++)
                    vx[e] = word_elem<ES>(vw[u], e, dtype);
FG_UNROLL
                for (int g = 0; g < GBM; g++) {
                    if (g < GB) {
                        const float s = dot[u * GBM + g], p = m[g] == -INFINITY ? 0.0f : expf(s - m[g]);
                        l[g] += p;
FG_UNROLL
                        for (int e = 0; e < EPL; e++)
                            acc[g][e] += p * vx[e];
                        if (track && lane == 0)
                            praw[h.praw + (size_t)(g0 + g) * h.n_slots + r] = s;
                    }
                }
            }
        }
    }

    /* merge the row groups: max, then the rescaled sums and outputs */
    float *state = part + ((size_t)item * G + g0) * (d + 2); /* per query head: m, l, acc[d] */
    __syncthreads();
    if (lane == 0)
FG_UNROLL
        for (int g = 0; g < GBM; g++)
            if (g < GB)
                red[g * RG + rg] = m[g];
    __syncthreads();
    float c[GBM];
FG_UNROLL
    for (int g = 0; g < GBM; g++) {
        c[g] = 0.0f;
        if (g < GB) {
            float M = -INFINITY;
            for (int32_t x = 0; x < RG; x++)
                M = fg_max_nan(M, red[g * RG + x]);
            c[g] = m[g] == -INFINITY ? 0.0f : expf(m[g] - M);
            if (threadIdx.x == 0)
                state[(size_t)g * (d + 2)] = M;
        }
    }
    __syncthreads();
    if (lane == 0)
FG_UNROLL
        for (int g = 0; g < GBM; g++)
            if (g < GB)
                red[g * RG + rg] = l[g] * c[g];
    __syncthreads();
    if ((int32_t)threadIdx.x < GB) {
        float s = 0.0f;
        for (int32_t x = 0; x < RG; x++)
            s += red[threadIdx.x * RG + x];
        state[(size_t)threadIdx.x * (d + 2) + 1] = s;
    }
FG_UNROLL
    for (int g = 0; g < GBM; g++) {
        if (g >= GB) /* the same for the whole block */
            continue;
        __syncthreads();
        if (lane_on)
FG_UNROLL
            for (int e = 0; e < EPL; e++)
                red[rg * d + lane * EPL + e] = acc[g][e] * c[g];
        __syncthreads();
        for (int32_t x = threadIdx.x; x < d; x += T) {
            float s = 0.0f;
            for (int32_t y = 0; y < RG; y++)
                s += red[y * d + x];
            state[(size_t)g * (d + 2) + 2 + x] = s;
        }
    }
}

#include "kernels_cuda/decode_mma.cuh"

/* Removes slot `s` of n (common/slots.h: thread 0 keeps the books, then all
 * threads copy the row it moves, if any). */
__device__ static void remove_slot(const fg_gpu_layout &L, void *const *pages, void *const *meta, int32_t s, int32_t n,
                                   int32_t priv_from, int32_t *sh) {
    if (threadIdx.x == 0)
        sh[0] = fg_rows_remove(&L.pl, meta, s, n, priv_from, &sh[1]);
    __syncthreads();
    const int32_t from = sh[0], to = sh[1];
    if (from >= 0) {
        const int32_t words = (int32_t)(L.row_bytes / 2); /* 16-bit words of a row (every row format is even) */
        uint16_t *kt = (uint16_t *)fg_row_k(&L.pl, pages, to), *vt = (uint16_t *)fg_row_v(&L.pl, pages, to);
        const uint16_t *kf = (const uint16_t *)fg_row_k(&L.pl, pages, from);
        const uint16_t *vf = (const uint16_t *)fg_row_v(&L.pl, pages, from);
        for (int32_t w = threadIdx.x; w < words; w += blockDim.x) {
            kt[w] = kf[w];
            vt[w] = vf[w];
        }
    }
    __syncthreads();
}

__device__ static inline int32_t block_min_int(int32_t x, int32_t *sh) {
    sh[threadIdx.x] = x;
    __syncthreads();
    for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s)
            sh[threadIdx.x] = fg_imin(sh[threadIdx.x], sh[threadIdx.x + s]);
        __syncthreads();
    }
    int32_t r = sh[0];
    __syncthreads();
    return r;
}

__device__ static inline float block_min(float x, float *sh) { return -fg_block_max(-x, sh); }

/* The least of the block's (rank, position) keys, for every thread; sh: a
 * key per thread. */
__device__ static inline unsigned long long block_min_key(unsigned long long key, unsigned long long *sh) {
    sh[threadIdx.x] = key;
    __syncthreads();
    for (unsigned w = blockDim.x / 2; w > 0; w >>= 1) {
        if (threadIdx.x < w && sh[threadIdx.x + w] < sh[threadIdx.x])
            sh[threadIdx.x] = sh[threadIdx.x + w];
        __syncthreads();
    }
    return sh[0];
}

/* What the merge leaves for the later kernels of a head (besides ml). */
struct head_stat {
    unsigned long long victim; /* min of (rank bits, position) over the frequent rows once the window moved */
    int32_t n_freq;            /* those rows */
};

/* (rank, position) as one key whose minimum is the lowest rank, ties to the
 * older row. Ranks are >= 0 but for -inf (fg_rank_score's NaN), whose raw
 * bits would order above every number: the bits are mapped so that unsigned
 * order is the floats' order over all of them (negatives inverted, the sign
 * bit set on the others). */
__device__ static inline unsigned long long rank_key(float rank, int32_t pos) {
    const uint32_t b = fg_f32_bits(rank), ordered = b & 0x80000000u ? ~b : b | 0x80000000u;
    return ((unsigned long long)ordered << 32) | (uint32_t)pos;
}

/* Step 1, one block per (head, query head g): the chunks' partial states and
 * the new token merge into g's output, the chunks taken by the block's
 * threads together. ml[head][3G] gets g's max, 1 / (sum * G) for the score
 * update, and the new token's share of the pooled attention (finish_heads
 * adds the G shares in order). */
__global__ static void FG_BLOCK_BOUNDS merge_heads(fg_gpu_layout L, int32_t G, const decode_desc *heads,
                                                   const float *part, float *ml, head_stat *hs) {
    FG_DYNAMIC_SHARED(float, red);
    const int32_t head = blockIdx.x / G, g = blockIdx.x % G, T = blockDim.x;
    const decode_desc h = heads[head];
    const int32_t d = L.head_dim, n = h.n_items;
    const float scale = 1.0f / sqrtf((float)d);
    const float *qh = h.q + (size_t)g * d, *kn = h.k, *vn = h.v;
    const size_t stride = (size_t)G * (d + 2); /* from one chunk's state of g to the next's */
    const float *st0 = part + (size_t)h.item0 * stride + (size_t)g * (d + 2);
    float part_dot = 0.0f, mc = -INFINITY;
    for (int32_t c = threadIdx.x; c < d; c += T)
        part_dot += qh[c] * kn[c];
    for (int32_t c = threadIdx.x; c < n; c += T)
        mc = fg_max_nan(mc, st0[(size_t)c * stride]);
    const float s_new = fg_block_sum(part_dot, red) * scale;
    const float m = fg_max_nan(s_new, fg_block_max_nan(mc, red));
    const float p_new = expf(s_new - m);
    float lc = 0.0f;
    for (int32_t c = threadIdx.x; c < n; c += T)
        lc += st0[(size_t)c * stride + 1] * expf(st0[(size_t)c * stride] - m);
    const float l = p_new + fg_block_sum(lc, red);
    for (int32_t x = threadIdx.x; x < d; x += T) {
        float o = p_new * vn[x];
        for (int32_t c = 0; c < n; c++)
            o += expf(st0[(size_t)c * stride] - m) * st0[(size_t)c * stride + 2 + x];
        h.out[(size_t)g * d + x] = o / l;
    }
    if (threadIdx.x == 0) {
        float *mh = ml + (size_t)head * 3 * G;
        mh[g] = m;
        mh[G + g] = 1.0f / (l * (float)G);
        mh[2 * G + g] = p_new / (l * (float)G);
        if (g == 0)
            hs[head] = head_stat{~0ull, 0};
    }
}

/* Steps 2 and 4a over the cached rows, one block per chunk: scores grow by
 * the pooled attention (the chunks kept the logits), rows leaving the window
 * of a head with a frequent part become candidates, and the candidates are
 * counted with the lowest-ranked of them, for finish_heads. */
__global__ static void FG_BLOCK_BOUNDS update_rows(fg_gpu_layout L, int32_t G, const decode_desc *heads,
                                                   const decode_item *items, const float *praw,
                                                   const float *ml, head_stat *hs) {
    FG_DYNAMIC_SHARED(float, red);
    unsigned long long *kred = (unsigned long long *)(red + blockDim.x);
    const decode_item it = items[blockIdx.x];
    const decode_desc h = heads[it.head];
    const bool track = fg_tracks_scores(h.components);
    const bool flip = (h.components & FG_KEEP_LOCAL) && (h.components & FG_KEEP_FREQUENT);
    if (!track && !flip) /* the same for the whole block */
        return;
    void *const *meta = h.meta;
    const int32_t P = L.page_tokens, t = h.pos + 1, n = h.n_slots;
    const float *M = ml + (size_t)it.head * 3 * G, *Linv = M + G;
    int32_t cnt = 0;
    unsigned long long key = ~0ull;
    for (int32_t s = it.begin + threadIdx.x; s < it.end; s += blockDim.x) {
        unsigned char *page = (unsigned char *)meta[s / P];
        const int32_t j = s % P, pos = ((const int32_t *)(page + L.pos_offset))[j];
        float *score = (float *)(page + L.score_offset) + j;
        if (track) {
            float gained = 0.0f;
            for (int32_t g = 0; g < G; g++)
                gained += expf(praw[h.praw + (size_t)g * n + s] - M[g]) * Linv[g];
            *score = (h.score_mode == FG_SCORE_LAST ? 0.0f : *score) + gained; /* LAST: this step's only */
        }
        uint8_t flag = page[L.flags_offset + j];
        if (flip && fg_leaves_window(flag, pos, h.window_start)) {
            flag = FG_SLOT_FREQUENT;
            page[L.flags_offset + j] = flag;
        }
        if (track && flag == FG_SLOT_FREQUENT) {
            cnt++;
            const unsigned long long k = rank_key(fg_rank_score(h.score_mode, *score, pos, t), pos);
            key = k < key ? k : key;
        }
    }
    if (!track || h.share_n > 1) /* a group's candidates: share_scores counts them from the mean */
        return;
    const int32_t total = (int32_t)fg_block_sum((float)cnt, red); /* exact below 2^24 rows */
    const unsigned long long least = block_min_key(key, kred);
    if (threadIdx.x == 0 && total > 0) {
        atomicAdd(&hs[it.head].n_freq, total);
        atomicMin(&hs[it.head].victim, least);
    }
}

/* FG_ALLOC_LAYER, one block per group of heads that rank together (its
 * first head's block; the others return): after update_rows, every slot's
 * score becomes the mean of the group's (summed in head order, as ref), and
 * each head's candidate count and lowest-ranked candidate are those of the
 * mean. The heads hold the same positions slot for slot; a head that does
 * not is an error (status). */
__global__ static void FG_BLOCK_BOUNDS share_scores(fg_gpu_layout L, const decode_desc *heads,
                                                    head_stat *hs, int32_t *status) {
    FG_DYNAMIC_SHARED(float, red);
    unsigned long long *kred = (unsigned long long *)(red + blockDim.x);
    const int32_t first = blockIdx.x;
    const decode_desc h = heads[first];
    if (h.share_n <= 1 || h.share_first != first || !fg_tracks_scores(h.components))
        return; /* the same for the whole block */
    const int32_t P = L.page_tokens, t = h.pos + 1, n = h.n_slots, m = h.share_n;
    int32_t cnt = 0, bad = 0;
    unsigned long long key = ~0ull;
    for (int32_t s = threadIdx.x; s < n; s += blockDim.x) {
        const int32_t j = s % P;
        const unsigned char *page0 = (const unsigned char *)h.meta[s / P];
        const int32_t pos = ((const int32_t *)(page0 + L.pos_offset))[j];
        float sum = 0.0f;
        for (int32_t x = 0; x < m; x++) {
            const unsigned char *page = (const unsigned char *)heads[first + x].meta[s / P];
            bad |= ((const int32_t *)(page + L.pos_offset))[j] != pos; /* slot counts: checked on the host */
            sum += ((const float *)(page + L.score_offset))[j];
        }
        const float mean = sum / (float)m;
        for (int32_t x = 0; x < m; x++)
            ((float *)((unsigned char *)heads[first + x].meta[s / P] + L.score_offset))[j] = mean;
        if (page0[L.flags_offset + j] == FG_SLOT_FREQUENT) {
            cnt++;
            const unsigned long long k = rank_key(fg_rank_score(h.score_mode, mean, pos, t), pos);
            key = k < key ? k : key;
        }
    }
    if (bad)
        *status = 2; /* sticky: read when the backend synchronises */
    const int32_t total = (int32_t)fg_block_sum((float)cnt, red); /* exact below 2^24 rows */
    const unsigned long long least = block_min_key(key, kred);
    for (int32_t x = threadIdx.x; x < m; x += blockDim.x)
        hs[first + x] = head_stat{least, total};
}

/* Steps 3 and 4, one block per head: the new row goes in, rows that leave
 * the window of a head without a frequent part go, and the lowest-ranked
 * candidates go until the budget holds (the first from update_rows' key,
 * any further one by block-wide scans); the slot count is checked against
 * the host's mirror. */
__global__ static void FG_BLOCK_BOUNDS finish_heads(fg_gpu_layout L, int32_t G, const decode_desc *heads,
                                                    const float *ml, const head_stat *hs,
                                                    int32_t *status) {
    FG_DYNAMIC_SHARED(float, red);
    int32_t *ired = (int32_t *)(red + blockDim.x);
    const decode_desc h = heads[blockIdx.x];
    const head_stat stat = hs[blockIdx.x];
    float new_score = 0.0f; /* the new token's pooled attention: its G shares, in order; a group's mean */
    for (int32_t x = 0; x < h.share_n; x++) {
        const int32_t head = h.share_n > 1 ? h.share_first + x : (int32_t)blockIdx.x;
        float own = 0.0f;
        for (int32_t g = 0; g < G; g++)
            own += ml[(size_t)head * 3 * G + 2 * G + g];
        new_score += own;
    }
    if (h.share_n > 1)
        new_score /= (float)h.share_n;
    void *const *pages = h.pages, *const *meta = h.meta;
    const int32_t P = L.page_tokens, t = h.pos + 1;
    const float *kn = h.k, *vn = h.v;
    const bool track = fg_tracks_scores(h.components);
    int32_t n = h.n_slots;

    /* 3. insert the new token (thread 0 takes its row) */
    if (threadIdx.x == 0) {
        if (h.row_base >= 0)
            fg_rows_reset(&L.pl, meta, h.row_base);
        if (h.insert_flag) {
            ired[0] = fg_rows_take(&L.pl, meta, n);
            *fg_slot_pos(&L.pl, meta, n) = h.pos;
            *fg_slot_score(&L.pl, meta, n) = track ? new_score : 0.0f;
            *fg_slot_flags(&L.pl, meta, n) = (uint8_t)h.insert_flag;
        }
    }
    __syncthreads();
    if (h.insert_flag) {
        const int32_t row = ired[0];
        unsigned char *kr = fg_row_k(&L.pl, pages, row), *vr = fg_row_v(&L.pl, pages, row);
        for (int32_t u = threadIdx.x; u < fg_gpu_row_units(L); u += blockDim.x) {
            fg_gpu_store_unit(L, kr, u, kn);
            fg_gpu_store_unit(L, vr, u, vn);
        }
        n++;
        __syncthreads();
    }

    /* 4a. rows leaving the window of a head without a frequent part: gone */
    if ((h.components & FG_KEEP_LOCAL) && !(h.components & FG_KEEP_FREQUENT)) {
        for (;;) { /* the lowest slot that leaves, then the last slot fills it */
            int32_t mine = INT32_MAX;
            for (int32_t s = threadIdx.x; s < n; s += blockDim.x) {
                const unsigned char *page = (const unsigned char *)meta[s / P];
                if (fg_leaves_window(page[L.flags_offset + s % P], ((const int32_t *)(page + L.pos_offset))[s % P],
                                     h.window_start))
                    mine = fg_imin(mine, s);
            }
            const int32_t hole = block_min_int(mine, ired);
            if (hole == INT32_MAX)
                break;
            remove_slot(L, pages, meta, hole, n, h.priv_from, ired);
            n--;
        }
    }

    /* 4b. frequent rows down to the budget: lowest rank first, ties to the older */
    if (track) {
        const bool new_freq = h.insert_flag == FG_SLOT_FREQUENT;
        int32_t n_freq = stat.n_freq + (new_freq ? 1 : 0);
        for (bool first = true; n_freq > h.freq_budget; first = false) {
            int32_t victim_pos;
            if (first) {
                unsigned long long key = stat.victim;
                if (new_freq) {
                    const unsigned long long k = rank_key(fg_rank_score(h.score_mode, new_score, h.pos, t), h.pos);
                    key = k < key ? k : key;
                }
                victim_pos = (int32_t)(uint32_t)(key & 0xffffffffu);
            } else {
                float lo = INFINITY;
                for (int32_t s = threadIdx.x; s < n; s += blockDim.x) {
                    const unsigned char *page = (const unsigned char *)meta[s / P];
                    const int32_t j = s % P;
                    if (page[L.flags_offset + j] == FG_SLOT_FREQUENT)
                        lo = fminf(lo, fg_rank_score(h.score_mode, ((const float *)(page + L.score_offset))[j],
                                               ((const int32_t *)(page + L.pos_offset))[j], t));
                }
                const float worst_rank = block_min(lo, red);
                int32_t oldest = INT32_MAX;
                for (int32_t s = threadIdx.x; s < n; s += blockDim.x) {
                    const unsigned char *page = (const unsigned char *)meta[s / P];
                    const int32_t j = s % P, p = ((const int32_t *)(page + L.pos_offset))[j];
                    if (page[L.flags_offset + j] == FG_SLOT_FREQUENT &&
                        fg_rank_score(h.score_mode, ((const float *)(page + L.score_offset))[j], p, t) == worst_rank)
                        oldest = fg_imin(oldest, p);
                }
                victim_pos = block_min_int(oldest, ired);
            }
            int32_t mine = INT32_MAX;
            for (int32_t s = threadIdx.x; s < n; s += blockDim.x)
                if (*fg_slot_pos(&L.pl, meta, s) == victim_pos)
                    mine = s;
            const int32_t victim = block_min_int(mine, ired);
            remove_slot(L, pages, meta, victim, n, h.priv_from, ired);
            n--;
            n_freq--;
        }
    }
    if (threadIdx.x == 0 && n != h.n_after)
        *status = 1; /* sticky: read when the backend synchronises */
}

/* Row chunks of one call: enough blocks to fill the device (about 8 per
 * multiprocessor), a multiple of the rows a block loads at once (`step`),
 * at most 2048 rows unless one step is more. */
static int32_t chunk_rows(int64_t total_rows, int32_t n_sm, int32_t step) {
    int64_t c = (total_rows + 8 * (int64_t)n_sm - 1) / (8 * (int64_t)n_sm);
    c = c > 2048 ? 2048 : c < 1 ? 1 : c;
    return (int32_t)((c + step - 1) / step * step);
}

/* Elements per lane: 16-byte loads (8 halves or 4 floats), more when a row
 * would need over 32 lanes, fewer when d is not a multiple. */
static int32_t elems_per_lane(int32_t d, int32_t es) {
    int32_t epl = 16 / es;
    while (epl < 32 && d / epl > 32)
        epl *= 2;
    while (epl > 1 && d % epl)
        epl /= 2;
    return epl;
}

/* The kernel for (element size, elements per lane, query heads per block). */
#define ATTEND_LAUNCH(ES, EPL, GBM)                                                                                    \
    FG_LAUNCH((attend_chunks<ES, EPL, (GBM < max_heads_per_block(EPL) ? GBM : max_heads_per_block(EPL))>), grid,     \
              FG_THREADS, shared, st->stream, L, G, lanes, tile, dd, di, draw, dpart)
#define ATTEND_GBM(ES, EPL)                                                                                            \
    switch (gbm) {                                                                                                     \
    case 1: ATTEND_LAUNCH(ES, EPL, 1); break;                                                                          \
    case 2: ATTEND_LAUNCH(ES, EPL, 2); break;                                                                          \
    case 4: ATTEND_LAUNCH(ES, EPL, 4); break;                                                                          \
    default: ATTEND_LAUNCH(ES, EPL, 8); break;                                                                         \
    }
#define ATTEND_EPL(ES)                                                                                                 \
    switch (epl) {                                                                                                     \
    case 1: ATTEND_GBM(ES, 1) break;                                                                                   \
    case 2: ATTEND_GBM(ES, 2) break;                                                                                   \
    case 4: ATTEND_GBM(ES, 4) break;                                                                                   \
    case 8: ATTEND_GBM(ES, 8) break;                                                                                   \
    case 16: ATTEND_GBM(ES, 16) break;                                                                                 \
    default: ATTEND_GBM(ES, 32) break;                                                                                 \
    }

/* quantized rows: d is a multiple of 8 and at most 256 (checked), so a lane
 * takes 4 or 8 values (two instantiations, not four: the build's time) */
#define ATTEND_EPL_QUANT                                                                                               \
    switch (epl) {                                                                                                     \
    case 4: ATTEND_GBM(0, 4) break;                                                                                    \
    default: ATTEND_GBM(0, 8) break;                                                                                   \
    }

extern "C" fg_status FG_GPU(decode_step)(fg_backend *be, const fg_page_layout *layout, const fg_shape *shape,
                                         int32_t n_heads, const fg_decode_head *heads) {
    fg_gpu_state *st = (fg_gpu_state *)be->impl;
    FG_GPU(mark_begin)(be);
    const int32_t G = shape->n_q_heads / shape->n_kv_heads, d = shape->head_dim;
    /* element bytes, 0 for quantized rows (read like fp32 ones: 4 values a lane at least) */
    const int32_t es = fg_dtype_quantized(layout->k_dtype) ? 0 : layout->k_dtype == FG_DTYPE_F32 ? 4 : 2;
    const int32_t epl = elems_per_lane(d, es ? es : 4);
    int32_t lanes = 1;
    while (lanes * epl < d)
        lanes *= 2;
    if (es == 0 && d > 256)
        return be->err(be->err_sink, FG_ERR_UNAVAILABLE,
                       FG_GPU_NAME ": decode on q8_0 / q4_0 rows supports head dimensions up to 256 (d = %d)", (int)d);
    if (G > 64 || lanes > 32)
        return be->err(be->err_sink, FG_ERR_UNAVAILABLE,
                       FG_GPU_NAME ": decode supports up to 64 query heads per KV head and head dimensions that "
                                   "32 lanes of 1 to 32 elements cover (G = %d, d = %d)",
                       (int)G, (int)d);
    const int32_t broken = fg_decode_groups_check(heads, n_heads); /* before anything is queued */
    if (broken >= 0)
        return be->err(be->err_sink, FG_ERR_INTERNAL, "decode_step: head %d is not in a whole group", (int)broken);
    int32_t gbm = 1; /* query heads per block: G rounded up to a power of two, within the registers */
    while (gbm < G && gbm < max_heads_per_block(epl) && gbm < st->decode_heads)
        gbm *= 2;
    const int32_t row_groups = FG_THREADS / lanes;
    const bool host_io = !be->device_io;

    /* sizes: the upload (descriptors, chunks, the page tables of heads that keep none here, the entries that
       changed of those that do, host q / k / v) and the device work area */
    int64_t pages = 0, writes = 0, raw = 0, rows = 0;
    for (int32_t i = 0; i < n_heads; i++) {
        const fg_decode_head *hd = &heads[i];
        if (!hd->tab)
            pages += 2 * (int64_t)hd->n_pages;
        else if (hd->tab_valid < 0 || hd->tab_valid > hd->n_pages || hd->tab_cap < hd->n_pages)
            return be->err(be->err_sink, FG_ERR_INTERNAL,
                           "decode_step: head %d's page table holds %d of %d entries, %d valid", (int)i,
                           (int)hd->tab_cap, (int)hd->n_pages, (int)hd->tab_valid);
        else
            writes += 2 * (int64_t)(hd->n_pages - hd->tab_valid);
        raw += (int64_t)G * hd->n_slots;
        rows += hd->n_slots;
    }
    /* the tensor-core kernel for 16-bit rows at d = 64 and 128 where the device has it (decode_mma.cuh) */
#ifdef FG_DECODE_MMA
    const bool mma = st->decode_mma && es == 2 && (d == 64 || d == 128);
    const int mma_parts = layout->k_dtype == FG_DTYPE_BF16 ? 3 : 2;
    const int32_t step = mma ? MMA_WARPS * MMA_ROWS : row_groups * ROWS_IN_FLIGHT;
#else
    const bool mma = false;
    const int32_t step = row_groups * ROWS_IN_FLIGHT;
#endif
    const int32_t chunk = chunk_rows(rows, st->n_sm, step);
#ifdef FG_DECODE_MMA
    const int32_t tile = mma ? mma_tile(chunk, mma_parts, d) : attend_tile(chunk, step, epl, gbm, lanes);
    const size_t shared =
        mma ? mma_shared_bytes(mma_parts, d, tile) : attend_shared_bytes(epl, gbm, lanes, FG_THREADS, tile);
#else
    const int32_t tile = attend_tile(chunk, step, epl, gbm, lanes);
    const size_t shared = attend_shared_bytes(epl, gbm, lanes, FG_THREADS, tile);
#endif
    int64_t n_items = 0;
    for (int32_t i = 0; i < n_heads; i++)
        n_items += (heads[i].n_slots + chunk - 1) / chunk;
    const size_t o_items = fg_gpu_align((size_t)n_heads * sizeof(decode_desc));
    const size_t o_ptab = o_items + fg_gpu_align((size_t)n_items * sizeof(decode_item));
    const size_t o_writes = o_ptab + fg_gpu_align((size_t)pages * sizeof(void *));
    const size_t o_qkv = o_writes + fg_gpu_align((size_t)writes * sizeof(table_write));
    const size_t qkv_bytes = host_io ? (size_t)n_heads * (G + 2) * d * sizeof(float) : 0;
    const size_t up_bytes = o_qkv + qkv_bytes;
    const size_t out_bytes = host_io ? (size_t)n_heads * G * d * sizeof(float) : 0;
    const size_t part_bytes = (size_t)(n_items ? n_items : 1) * G * (d + 2) * sizeof(float);
    const size_t o_raw = fg_gpu_align(up_bytes), o_part = o_raw + fg_gpu_align((size_t)raw * 4);
    const size_t o_ml = o_part + fg_gpu_align(part_bytes);
    const size_t o_hs = o_ml + fg_gpu_align((size_t)n_heads * 3 * G * sizeof(float));
    const size_t o_out = o_hs + fg_gpu_align((size_t)n_heads * sizeof(head_stat));
    unsigned char *base, *host;
    fg_status s = FG_GPU(scratch)(be, o_out + out_bytes + 256, &base);
    if (!s)
        s = FG_GPU(stage)(be, up_bytes > out_bytes ? up_bytes : out_bytes, &host);
    if (s)
        return s;

    decode_desc *desc = (decode_desc *)host;
    decode_item *items = (decode_item *)(host + o_items);
    void **ptab = (void **)(host + o_ptab);
    table_write *tw = (table_write *)(host + o_writes);
    float *qs = (float *)(host + o_qkv), *ks = qs + (size_t)n_heads * G * d, *vs = ks + (size_t)n_heads * d;
    const float *dqs = (const float *)(base + o_qkv), *dks = dqs + (size_t)n_heads * G * d;
    const float *dvs = dks + (size_t)n_heads * d;
    float *dout = (float *)(base + o_out);
    int64_t po = 0, ro = 0, wo = 0;
    int32_t io = 0;
    bool any_share = false;
    for (int32_t i = 0; i < n_heads; i++) {
        const fg_decode_head *hd = &heads[i];
        const int32_t np = hd->n_pages;
        const int32_t ni = (hd->n_slots + chunk - 1) / chunk;
        void *const *dpages, *const *dmeta;
        if (hd->tab) { /* kept on the device */
            dpages = hd->tab;
            dmeta = hd->tab + hd->tab_cap;
        } else { /* its tables travel with the step */
            dpages = (void *const *)(base + o_ptab) + po;
            dmeta = dpages + np;
        }
        decode_desc x = {hd->q,          hd->k,        hd->v,           hd->out,       dpages,      dmeta,
                         ro,             hd->n_slots,  hd->n_slots_after, np,          hd->priv_from,
                         hd->row_base,   hd->components,
                         (int32_t)hd->score_mode, hd->pos, hd->insert_flag, hd->window_start, hd->freq_budget, io, ni,
                         hd->share_n > 1 ? hd->share_first : i, hd->share_n > 1 ? hd->share_n : 1};
        any_share |= hd->share_n > 1;
        if (host_io) {
            memcpy(qs + (size_t)i * G * d, hd->q, (size_t)G * d * sizeof(float));
            memcpy(ks + (size_t)i * d, hd->k, (size_t)d * sizeof(float));
            memcpy(vs + (size_t)i * d, hd->v, (size_t)d * sizeof(float));
            x.q = dqs + (size_t)i * G * d;
            x.k = dks + (size_t)i * d;
            x.v = dvs + (size_t)i * d;
            x.out = dout + (size_t)i * G * d;
        }
        desc[i] = x;
        for (int32_t c = 0; c < ni; c++)
            items[io + c] = decode_item{i, c * chunk, (c + 1) * chunk < hd->n_slots ? (c + 1) * chunk : hd->n_slots};
        if (!hd->tab) {
            memcpy(ptab + po, hd->pages, (size_t)np * sizeof(void *));
            memcpy(ptab + po + np, hd->meta, (size_t)np * sizeof(void *));
            po += 2 * np;
        } else {
            for (int32_t p = hd->tab_valid; p < np; p++) {
                tw[wo++] = table_write{hd->tab + p, hd->pages[p]};
                tw[wo++] = table_write{hd->tab + hd->tab_cap + p, hd->meta[p]};
            }
        }
        ro += (int64_t)G * hd->n_slots;
        io += ni;
    }
    FG_GPU(mark_queue)(be);
    if ((s = FG_GPU(stage_upload)(be, base, host, up_bytes)))
        return s;

    const fg_gpu_layout L = fg_gpu_layout_of(layout);
    const decode_desc *dd = (const decode_desc *)base;
    const decode_item *di = (const decode_item *)(base + o_items);
    float *draw = (float *)(base + o_raw), *dpart = (float *)(base + o_part);
    FG_GPU(mark)(be, "upload");
    if (writes) {
        FG_LAUNCH(write_tables, (unsigned)((writes + FG_THREADS - 1) / FG_THREADS), FG_THREADS, 0, st->stream,
                  (const table_write *)(base + o_writes), (int32_t)writes);
        FG_GPU(mark)(be, "tables");
    }
    if (n_items && mma) {
#ifdef FG_DECODE_MMA
        const unsigned grid = (unsigned)(n_items * ((G + MMA_HEADS - 1) / MMA_HEADS));
        if (layout->k_dtype == FG_DTYPE_BF16 && d == 64)
            FG_LAUNCH((attend_mma<1, 3, 4>), grid, FG_THREADS, shared, st->stream, L, G, tile, dd, di, draw, dpart);
        else if (layout->k_dtype == FG_DTYPE_BF16)
            FG_LAUNCH((attend_mma<1, 3, 8>), grid, FG_THREADS, shared, st->stream, L, G, tile, dd, di, draw, dpart);
        else if (d == 64)
            FG_LAUNCH((attend_mma<0, 2, 4>), grid, FG_THREADS, shared, st->stream, L, G, tile, dd, di, draw, dpart);
        else
            FG_LAUNCH((attend_mma<0, 2, 8>), grid, FG_THREADS, shared, st->stream, L, G, tile, dd, di, draw, dpart);
        FG_GPU(mark)(be, "attend_mma");
#endif
    } else if (n_items) {
        const unsigned grid = (unsigned)(n_items * ((G + gbm - 1) / gbm));
        if (es == 4)
            ATTEND_EPL(4)
        else if (es == 2)
            ATTEND_EPL(2)
        else
            ATTEND_EPL_QUANT
        FG_GPU(mark)(be, "attend");
    }
    float *dml = (float *)(base + o_ml);
    head_stat *dhs = (head_stat *)(base + o_hs);
    FG_LAUNCH(merge_heads, (unsigned)(n_heads * G), FG_THREADS, FG_THREADS * sizeof(float), st->stream, L, G, dd, dpart,
              dml, dhs);
    FG_GPU(mark)(be, "merge");
    if (n_items) {
        FG_LAUNCH(update_rows, (unsigned)n_items, FG_THREADS, FG_THREADS * (sizeof(float) + sizeof(unsigned long long)),
                  st->stream, L, G, dd, di, draw, dml, dhs);
        FG_GPU(mark)(be, "update");
    }
    if (any_share) {
        FG_LAUNCH(share_scores, n_heads, FG_THREADS, FG_THREADS * (sizeof(float) + sizeof(unsigned long long)),
                  st->stream, L, dd, dhs, st->d_error);
        FG_GPU(mark)(be, "share");
    }
    FG_LAUNCH(finish_heads, n_heads, FG_THREADS, 2 * FG_THREADS * sizeof(float), st->stream, L, G, dd, dml, dhs,
              st->d_error);
    FG_GPU(mark)(be, "finish");
    GPU_CHECK(be, cudaGetLastError());
    if (!host_io)
        return FG_GPU(mark_end)(be); /* the engine's stream runs on; errors show at the next synchronisation */

    /* host I/O: the outputs come back through the staging buffer, and the step is checked */
    GPU_CHECK(be, cudaMemcpyAsync(host, dout, out_bytes, cudaMemcpyDeviceToHost, st->stream));
    FG_GPU(mark)(be, "read back");
    if ((s = FG_GPU(mark_end)(be)))
        return s;
    if ((s = FG_GPU(synchronize)(be)))
        return s;
    for (int32_t i = 0; i < n_heads; i++)
        memcpy(heads[i].out, (const float *)host + (size_t)i * G * d, (size_t)G * d * sizeof(float));
    return FG_OK;
}
