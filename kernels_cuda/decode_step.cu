/*
 * The decode step on the GPU (DESIGN §2.5), two kernels:
 *   attend_chunks  one block per (head, chunk of FG_THREADS slots): a thread
 *                  per slot scores it against the G query heads, the block
 *                  reduces max and sum per query head and accumulates the
 *                  partial output with threads over the head dimension (V rows
 *                  read once for the group); probabilities are kept for the
 *                  score update;
 *   finish_heads   one block per head: merges the partial states with the new
 *                  token, writes the output, grows the scores, inserts the new
 *                  row, moves rows out of the window and evicts the lowest-
 *                  ranked frequent rows (block-wide argmin, ties to the older),
 *                  and checks the slot count against the host's mirror.
 */
#include <stdlib.h>
#include <string.h>

#include "kernels_cuda/gpu_common.cuh"

#define CHUNK FG_THREADS

struct decode_desc {
    int64_t page0;       /* into the page table */
    int32_t n_slots, n_after;
    uint32_t components;
    int32_t score_mode, pos, insert_flag, window_start, freq_budget;
    int32_t item0, n_items; /* its chunks */
    int64_t praw;        /* its probabilities: [G][n_slots] */
};

struct decode_item {
    int32_t head, begin, end;
};

__device__ static inline const unsigned char *slot_row(const fg_gpu_layout &L, void *const *pages, int32_t s,
                                                       uint32_t off) {
    const int32_t es = L.dtype == FG_DTYPE_F32 ? 4 : 2;
    return (const unsigned char *)pages[s / L.page_tokens] + off + (size_t)(s % L.page_tokens) * L.head_dim * es;
}

__global__ static void attend_chunks(fg_gpu_layout L, int32_t G, const decode_desc *heads, const decode_item *items,
                                     void *const *ptab, const float *q, float *praw, float *part) {
    FG_DYNAMIC_SHARED(float, red);
    const decode_item it = items[blockIdx.x];
    const decode_desc h = heads[it.head];
    void *const *pages = ptab + h.page0;
    const int32_t d = L.head_dim, s = it.begin + threadIdx.x;
    const bool mine = s < it.end;
    const float scale = 1.0f / sqrtf((float)d);
    const float *qh = q + (size_t)it.head * G * d;
    float *state = part + (size_t)blockIdx.x * G * (d + 2); /* per query head: m, l, acc[d] */
    for (int32_t g = 0; g < G; g++) {
        float sc = -INFINITY;
        if (mine) {
            const unsigned char *kr = slot_row(L, pages, s, L.k_offset);
            sc = 0.0f;
            for (int32_t c = 0; c < d; c++)
                sc += qh[(size_t)g * d + c] * fg_gpu_elem(kr, L.dtype, c);
            sc *= scale;
        }
        const float m = fg_block_max(sc, red);
        const float p = mine ? expf(sc - m) : 0.0f;
        const float l = fg_block_sum(p, red);
        float *pr = praw + h.praw + (size_t)g * h.n_slots;
        if (mine)
            pr[s] = p;
        __syncthreads(); /* p of every slot of the chunk is in praw */
        float *st = state + (size_t)g * (d + 2);
        for (int32_t c = threadIdx.x; c < d; c += blockDim.x) {
            float a = 0.0f;
            for (int32_t r = it.begin; r < it.end; r++)
                a += pr[r] * fg_gpu_elem(slot_row(L, pages, r, L.v_offset), L.dtype, c);
            st[2 + c] = a;
        }
        if (threadIdx.x == 0) {
            st[0] = m;
            st[1] = l;
        }
    }
}

/* Moves slot `from` over slot `to` (K, V and metadata), all threads. */
__device__ static void move_slot(const fg_gpu_layout &L, void *const *pages, int32_t to, int32_t from) {
    const int32_t words = L.head_dim * (L.dtype == FG_DTYPE_F32 ? 4 : 2) / 2; /* 16-bit words of a row */
    uint16_t *kt = (uint16_t *)slot_row(L, pages, to, L.k_offset), *vt = (uint16_t *)slot_row(L, pages, to, L.v_offset);
    const uint16_t *kf = (const uint16_t *)slot_row(L, pages, from, L.k_offset);
    const uint16_t *vf = (const uint16_t *)slot_row(L, pages, from, L.v_offset);
    for (int32_t w = threadIdx.x; w < words; w += blockDim.x) {
        kt[w] = kf[w];
        vt[w] = vf[w];
    }
    if (threadIdx.x == 0) {
        unsigned char *pt = (unsigned char *)pages[to / L.page_tokens], *pf = (unsigned char *)pages[from / L.page_tokens];
        const int32_t jt = to % L.page_tokens, jf = from % L.page_tokens;
        ((int32_t *)(pt + L.pos_offset))[jt] = ((int32_t *)(pf + L.pos_offset))[jf];
        ((float *)(pt + L.score_offset))[jt] = ((float *)(pf + L.score_offset))[jf];
        pt[L.flags_offset + jt] = pf[L.flags_offset + jf];
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

__device__ static inline float rank_of(int32_t mode, float score, int32_t pos, int32_t t) {
    return mode == FG_SCORE_MEAN ? score / (float)(t - pos) : score;
}

__global__ static void finish_heads(fg_gpu_layout L, int32_t G, const decode_desc *heads, void *const *ptab,
                                    const float *q, const float *k, const float *v, float *out, const float *praw,
                                    float *part, int32_t *status) {
    FG_DYNAMIC_SHARED(float, red);
    int32_t *ired = (int32_t *)(red + blockDim.x);
    __shared__ float M[64], Linv[64];
    const decode_desc h = heads[blockIdx.x];
    void *const *pages = ptab + h.page0;
    const int32_t d = L.head_dim, P = L.page_tokens, t = h.pos + 1;
    const float scale = 1.0f / sqrtf((float)d);
    const float *qh = q + (size_t)blockIdx.x * G * d, *kn = k + (size_t)blockIdx.x * d, *vn = v + (size_t)blockIdx.x * d;
    const bool track = (h.components & FG_KEEP_FREQUENT) && !(h.components & FG_KEEP_FULL);

    /* 1. merge the chunks with the new token */
    float new_score = 0.0f;
    for (int32_t g = 0; g < G; g++) {
        float part_dot = 0.0f;
        for (int32_t c = threadIdx.x; c < d; c += blockDim.x)
            part_dot += qh[(size_t)g * d + c] * kn[c];
        const float s_new = fg_block_sum(part_dot, red) * scale;
        float m = s_new;
        for (int32_t c = 0; c < h.n_items; c++)
            m = fmaxf(m, part[(size_t)(h.item0 + c) * G * (d + 2) + (size_t)g * (d + 2)]);
        const float p_new = expf(s_new - m);
        float l = p_new;
        for (int32_t c = 0; c < h.n_items; c++) {
            const float *st = part + (size_t)(h.item0 + c) * G * (d + 2) + (size_t)g * (d + 2);
            l += st[1] * expf(st[0] - m);
        }
        for (int32_t x = threadIdx.x; x < d; x += blockDim.x) {
            float o = p_new * vn[x];
            for (int32_t c = 0; c < h.n_items; c++) {
                const float *st = part + (size_t)(h.item0 + c) * G * (d + 2) + (size_t)g * (d + 2);
                o += expf(st[0] - m) * st[2 + x];
            }
            out[((size_t)blockIdx.x * G + g) * d + x] = o / l;
        }
        if (threadIdx.x == 0 && g < 64) {
            M[g] = m;
            Linv[g] = 1.0f / (l * (float)G);
        }
        new_score += p_new / (l * (float)G);
        __syncthreads();
    }

    /* 2. scores grow by the pooled attention */
    int32_t n = h.n_slots;
    if (track && G <= 64) {
        for (int32_t s = threadIdx.x; s < n; s += blockDim.x) {
            const int32_t c = s / CHUNK;
            float gained = 0.0f;
            for (int32_t g = 0; g < G; g++) {
                const float mc = part[(size_t)(h.item0 + c) * G * (d + 2) + (size_t)g * (d + 2)];
                gained += praw[h.praw + (size_t)g * n + s] * expf(mc - M[g]) * Linv[g];
            }
            unsigned char *page = (unsigned char *)pages[s / P];
            ((float *)(page + L.score_offset))[s % P] += gained;
        }
        __syncthreads();
    }

    /* 3. insert the new token */
    if (h.insert_flag) {
        unsigned char *kr = (unsigned char *)slot_row(L, pages, n, L.k_offset);
        unsigned char *vr = (unsigned char *)slot_row(L, pages, n, L.v_offset);
        for (int32_t c = threadIdx.x; c < d; c += blockDim.x) {
            fg_gpu_store(kr, L.dtype, c, kn[c]);
            fg_gpu_store(vr, L.dtype, c, vn[c]);
        }
        if (threadIdx.x == 0) {
            unsigned char *page = (unsigned char *)pages[n / P];
            ((int32_t *)(page + L.pos_offset))[n % P] = h.pos;
            ((float *)(page + L.score_offset))[n % P] = track ? new_score : 0.0f;
            page[L.flags_offset + n % P] = (uint8_t)h.insert_flag;
        }
        n++;
        __syncthreads();
    }

    /* 4a. rows leaving the window: frequent candidates, or gone */
    if (h.components & FG_KEEP_LOCAL) {
        if (h.components & FG_KEEP_FREQUENT) {
            for (int32_t s = threadIdx.x; s < n; s += blockDim.x) {
                unsigned char *page = (unsigned char *)pages[s / P];
                if (page[L.flags_offset + s % P] == FG_SLOT_LOCAL &&
                    ((int32_t *)(page + L.pos_offset))[s % P] < h.window_start)
                    page[L.flags_offset + s % P] = FG_SLOT_FREQUENT;
            }
            __syncthreads();
        } else {
            for (;;) { /* the lowest slot that leaves, then the last slot fills it */
                int32_t mine = INT32_MAX;
                for (int32_t s = threadIdx.x; s < n; s += blockDim.x) {
                    const unsigned char *page = (const unsigned char *)pages[s / P];
                    if (page[L.flags_offset + s % P] == FG_SLOT_LOCAL &&
                        ((const int32_t *)(page + L.pos_offset))[s % P] < h.window_start)
                        mine = fg_imin(mine, s);
                }
                const int32_t hole = block_min_int(mine, ired);
                if (hole == INT32_MAX)
                    break;
                if (hole != n - 1)
                    move_slot(L, pages, hole, n - 1);
                n--;
            }
        }
    }

    /* 4b. frequent rows down to the budget: lowest rank first, ties to the older */
    if (track) {
        int32_t cnt = 0;
        for (int32_t s = threadIdx.x; s < n; s += blockDim.x)
            cnt += ((const unsigned char *)pages[s / P])[L.flags_offset + s % P] == FG_SLOT_FREQUENT;
        int32_t n_freq = (int32_t)fg_block_sum((float)cnt, red);
        while (n_freq > h.freq_budget) {
            float lo = INFINITY;
            for (int32_t s = threadIdx.x; s < n; s += blockDim.x) {
                const unsigned char *page = (const unsigned char *)pages[s / P];
                const int32_t j = s % P;
                if (page[L.flags_offset + j] == FG_SLOT_FREQUENT)
                    lo = fminf(lo, rank_of(h.score_mode, ((const float *)(page + L.score_offset))[j],
                                           ((const int32_t *)(page + L.pos_offset))[j], t));
            }
            const float worst_rank = block_min(lo, red);
            int32_t oldest = INT32_MAX;
            for (int32_t s = threadIdx.x; s < n; s += blockDim.x) {
                const unsigned char *page = (const unsigned char *)pages[s / P];
                const int32_t j = s % P, p = ((const int32_t *)(page + L.pos_offset))[j];
                if (page[L.flags_offset + j] == FG_SLOT_FREQUENT &&
                    rank_of(h.score_mode, ((const float *)(page + L.score_offset))[j], p, t) == worst_rank)
                    oldest = fg_imin(oldest, p);
            }
            const int32_t victim_pos = block_min_int(oldest, ired);
            int32_t mine = INT32_MAX;
            for (int32_t s = threadIdx.x; s < n; s += blockDim.x)
                if (((const int32_t *)((const unsigned char *)pages[s / P] + L.pos_offset))[s % P] == victim_pos)
                    mine = s;
            const int32_t victim = block_min_int(mine, ired);
            if (victim != n - 1)
                move_slot(L, pages, victim, n - 1);
            n--;
            n_freq--;
        }
    }
    if (threadIdx.x == 0)
        status[blockIdx.x] = n == h.n_after ? 0 : 1;
}

extern "C" fg_status FG_GPU(decode_step)(fg_backend *be, const fg_page_layout *layout, const fg_shape *shape,
                                         int32_t n_heads, const fg_decode_head *heads) {
    fg_gpu_state *st = (fg_gpu_state *)be->impl;
    const int32_t G = shape->n_q_heads / shape->n_kv_heads, d = shape->head_dim, P = layout->page_tokens;
    if (G > 64)
        return be->err(be->err_sink, FG_ERR_UNAVAILABLE, FG_GPU_NAME ": decode supports up to 64 query heads per KV head");
    /* host staging: descriptors, items, page tables, q / k / v */
    int64_t pages = 0, raw = 0;
    int32_t n_items = 0;
    for (int32_t i = 0; i < n_heads; i++) {
        pages += (heads[i].n_slots + (heads[i].insert_flag ? 1 : 0) + P - 1) / P;
        raw += (int64_t)G * heads[i].n_slots;
        n_items += (heads[i].n_slots + CHUNK - 1) / CHUNK;
    }
    decode_desc *desc = (decode_desc *)malloc((size_t)n_heads * sizeof *desc);
    decode_item *items = (decode_item *)malloc((size_t)(n_items ? n_items : 1) * sizeof *items);
    void **ptab = (void **)malloc((size_t)(pages ? pages : 1) * sizeof *ptab);
    float *qkv = (float *)malloc((size_t)n_heads * (G + 2) * d * sizeof(float));
    int32_t *status = (int32_t *)malloc((size_t)n_heads * sizeof(int32_t));
    float *out = (float *)malloc((size_t)n_heads * G * d * sizeof(float));
    fg_status s = desc && items && ptab && qkv && status && out ? FG_OK : FG_ERR_OUT_OF_MEMORY;
    if (s) {
        s = be->err(be->err_sink, s, FG_GPU_NAME ": decode: out of host memory");
        goto done;
    }
    {
        int64_t po = 0, ro = 0;
        int32_t io = 0;
        float *qs = qkv, *ks = qkv + (size_t)n_heads * G * d, *vs = ks + (size_t)n_heads * d;
        for (int32_t i = 0; i < n_heads; i++) {
            const fg_decode_head *hd = &heads[i];
            const int32_t np = (hd->n_slots + (hd->insert_flag ? 1 : 0) + P - 1) / P;
            const int32_t ni = (hd->n_slots + CHUNK - 1) / CHUNK;
            desc[i] = decode_desc{po, hd->n_slots, hd->n_slots_after, hd->components, (int32_t)hd->score_mode,
                                  hd->pos, hd->insert_flag, hd->window_start, hd->freq_budget, io, ni, ro};
            for (int32_t c = 0; c < ni; c++)
                items[io + c] = decode_item{i, c * CHUNK, (c + 1) * CHUNK < hd->n_slots ? (c + 1) * CHUNK : hd->n_slots};
            memcpy(ptab + po, hd->pages, (size_t)np * sizeof(void *));
            memcpy(qs + (size_t)i * G * d, hd->q, (size_t)G * d * sizeof(float));
            memcpy(ks + (size_t)i * d, hd->k, (size_t)d * sizeof(float));
            memcpy(vs + (size_t)i * d, hd->v, (size_t)d * sizeof(float));
            po += np;
            ro += (int64_t)G * hd->n_slots;
            io += ni;
        }
        const size_t part_bytes = (size_t)(n_items ? n_items : 1) * G * (d + 2) * sizeof(float);
        unsigned char *base;
        size_t at = 0;
        void *dd, *di, *dp, *dq;
        s = FG_GPU(scratch)(be, (size_t)n_heads * sizeof *desc + (size_t)n_items * sizeof *items +
                                    (size_t)pages * sizeof(void *) + (size_t)n_heads * (2 * G + 2) * d * 4 +
                                    (size_t)raw * 4 + part_bytes + (size_t)n_heads * 4 + 12 * 256, &base);
        if (!s) s = FG_GPU(upload)(be, base, &at, desc, (size_t)n_heads * sizeof *desc, &dd);
        if (!s) s = FG_GPU(upload)(be, base, &at, items, (size_t)n_items * sizeof *items, &di);
        if (!s) s = FG_GPU(upload)(be, base, &at, ptab, (size_t)pages * sizeof(void *), &dp);
        if (!s) s = FG_GPU(upload)(be, base, &at, qkv, (size_t)n_heads * (G + 2) * d * sizeof(float), &dq);
        if (s)
            goto done;
        at = fg_gpu_align(at);
        float *dout = (float *)(base + at);
        at = fg_gpu_align(at + (size_t)n_heads * G * d * 4);
        float *draw = (float *)(base + at);
        at = fg_gpu_align(at + (size_t)raw * 4);
        float *dpart = (float *)(base + at);
        at = fg_gpu_align(at + part_bytes);
        int32_t *dstatus = (int32_t *)(base + at);
        const fg_gpu_layout L = fg_gpu_layout_of(layout);
        const float *dqs = (const float *)dq, *dks = dqs + (size_t)n_heads * G * d, *dvs = dks + (size_t)n_heads * d;
        if (n_items) {
            FG_LAUNCH(attend_chunks, n_items, FG_THREADS, FG_THREADS * sizeof(float), st->stream, L, G,
                      (const decode_desc *)dd, (const decode_item *)di, (void *const *)dp, dqs, draw, dpart);
        }
        FG_LAUNCH(finish_heads, n_heads, FG_THREADS, 2 * FG_THREADS * sizeof(float), st->stream, L, G,
                  (const decode_desc *)dd, (void *const *)dp, dqs, dks, dvs, dout, draw, dpart, dstatus);
        cudaError_t e = cudaGetLastError();
        if (e == cudaSuccess)
            e = cudaMemcpyAsync(out, dout, (size_t)n_heads * G * d * 4, cudaMemcpyDeviceToHost, st->stream);
        if (e == cudaSuccess)
            e = cudaMemcpyAsync(status, dstatus, (size_t)n_heads * 4, cudaMemcpyDeviceToHost, st->stream);
        if (e == cudaSuccess)
            e = cudaStreamSynchronize(st->stream);
        if (e != cudaSuccess) {
            s = be->err(be->err_sink, FG_ERR_BACKEND, FG_GPU_NAME ": decode: %s", cudaGetErrorString(e));
            goto done;
        }
        for (int32_t i = 0; i < n_heads; i++) {
            memcpy(heads[i].out, out + (size_t)i * G * d, (size_t)G * d * sizeof(float));
            if (status[i] && !s)
                s = be->err(be->err_sink, FG_ERR_INTERNAL,
                            "decode_step: head %d ended with a slot count the host did not expect", (int)i);
        }
    }
done:
    free(desc);
    free(items);
    free(ptab);
    free(qkv);
    free(status);
    free(out);
    return s;
}
