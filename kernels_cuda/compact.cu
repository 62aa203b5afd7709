/* compact on the GPU: the kept prompt rows of every head into its pages.
 * Grid: (row tiles, heads); threads stride over the head dimension. */
#include <stdlib.h>
#include <string.h>

#include "kernels_cuda/gpu_common.cuh"

#define ROWS_PER_BLOCK 8

struct compact_desc {
    int32_t kv_head, n_keep;
    int64_t slot0; /* into pos / flags / score */
    int64_t page0; /* into pages */
};

__global__ static void compact_rows(fg_gpu_layout L, int32_t Hkv, const float *k, const float *v,
                                    const compact_desc *heads, void *const *pages, const int32_t *pos,
                                    const uint8_t *flags, const float *score) {
    const compact_desc h = heads[blockIdx.y];
    const int32_t d = L.head_dim, es = L.dtype == FG_DTYPE_F32 ? 4 : 2;
    for (int32_t r = 0; r < ROWS_PER_BLOCK; r++) {
        const int32_t s = blockIdx.x * ROWS_PER_BLOCK + r;
        if (s >= h.n_keep)
            return;
        unsigned char *page = (unsigned char *)pages[h.page0 + s / L.page_tokens];
        const int32_t j = s % L.page_tokens;
        const int32_t p = pos[h.slot0 + s];
        const float *ks = k + ((size_t)p * Hkv + h.kv_head) * d, *vs = v + ((size_t)p * Hkv + h.kv_head) * d;
        for (int32_t c = threadIdx.x; c < d; c += blockDim.x) {
            fg_gpu_store(page + L.k_offset + (size_t)j * d * es, L.dtype, c, ks[c]);
            fg_gpu_store(page + L.v_offset + (size_t)j * d * es, L.dtype, c, vs[c]);
        }
        if (threadIdx.x == 0) {
            ((int32_t *)(page + L.pos_offset))[j] = p;
            ((float *)(page + L.score_offset))[j] = score[h.slot0 + s];
            page[L.flags_offset + j] = flags[h.slot0 + s];
        }
    }
}

extern "C" fg_status FG_GPU(compact)(fg_backend *be, const fg_page_layout *layout, const fg_shape *shape, int32_t n,
                                     const float *k, const float *v, int32_t n_heads, const fg_compact_head *heads) {
    fg_gpu_state *st = (fg_gpu_state *)be->impl;
    const int32_t Hkv = shape->n_kv_heads, d = shape->head_dim, P = layout->page_tokens;
    int64_t slots = 0, pages = 0;
    int32_t max_keep = 0;
    for (int32_t i = 0; i < n_heads; i++) {
        slots += heads[i].n_keep;
        pages += (heads[i].n_keep + P - 1) / P;
        max_keep = heads[i].n_keep > max_keep ? heads[i].n_keep : max_keep;
    }
    if (max_keep == 0)
        return FG_OK;
    /* host staging: descriptors, page tables, pos / flags / score, concatenated */
    compact_desc *desc = (compact_desc *)malloc((size_t)n_heads * sizeof *desc);
    void **ptab = (void **)malloc((size_t)pages * sizeof *ptab);
    int32_t *pos = (int32_t *)malloc((size_t)slots * 4);
    float *score = (float *)malloc((size_t)slots * 4);
    uint8_t *flags = (uint8_t *)malloc((size_t)slots);
    fg_status s = desc && ptab && pos && score && flags ? FG_OK : FG_ERR_OUT_OF_MEMORY;
    if (s == FG_OK) {
        int64_t so = 0, po = 0;
        for (int32_t i = 0; i < n_heads; i++) {
            const fg_compact_head *h = &heads[i];
            const int32_t np = (h->n_keep + P - 1) / P;
            desc[i] = compact_desc{h->kv_head, h->n_keep, so, po};
            memcpy(pos + so, h->pos, (size_t)h->n_keep * 4);
            memcpy(score + so, h->score, (size_t)h->n_keep * 4);
            memcpy(flags + so, h->flags, (size_t)h->n_keep);
            memcpy(ptab + po, h->pages, (size_t)np * sizeof(void *));
            so += h->n_keep;
            po += np;
        }
        const size_t rows = (size_t)n * Hkv * d * sizeof(float);
        unsigned char *base;
        size_t at = 0;
        void *dd, *dp, *dpos, *dsc, *dfl;
        const void *dk = k, *dv = v; /* device I/O: already there */
        s = FG_GPU(scratch)(be, (be->device_io ? 0 : 2 * rows) + (size_t)n_heads * sizeof *desc +
                                    (size_t)pages * sizeof(void *) + (size_t)slots * 9 + 8 * 256, &base);
        if (!be->device_io) {
            void *x;
            if (!s && !(s = FG_GPU(upload)(be, base, &at, k, rows, &x))) dk = x;
            if (!s && !(s = FG_GPU(upload)(be, base, &at, v, rows, &x))) dv = x;
        }
        if (!s) s = FG_GPU(upload)(be, base, &at, desc, (size_t)n_heads * sizeof *desc, &dd);
        if (!s) s = FG_GPU(upload)(be, base, &at, ptab, (size_t)pages * sizeof(void *), &dp);
        if (!s) s = FG_GPU(upload)(be, base, &at, pos, (size_t)slots * 4, &dpos);
        if (!s) s = FG_GPU(upload)(be, base, &at, score, (size_t)slots * 4, &dsc);
        if (!s) s = FG_GPU(upload)(be, base, &at, flags, (size_t)slots, &dfl);
        if (!s) {
            dim3 grid((max_keep + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK, n_heads);
            FG_LAUNCH(compact_rows, grid, FG_THREADS, 0, st->stream, fg_gpu_layout_of(layout), Hkv,
                      (const float *)dk, (const float *)dv, (const compact_desc *)dd, (void *const *)dp,
                      (const int32_t *)dpos, (const uint8_t *)dfl, (const float *)dsc);
            cudaError_t e = cudaGetLastError();
            if (e == cudaSuccess)
                e = cudaStreamSynchronize(st->stream); /* the staging buffers are freed below */
            if (e != cudaSuccess)
                s = be->err(be->err_sink, FG_ERR_BACKEND, FG_GPU_NAME ": compact: %s", cudaGetErrorString(e));
        }
    } else {
        s = be->err(be->err_sink, s, FG_GPU_NAME ": compact: out of host memory");
    }
    free(desc);
    free(ptab);
    free(pos);
    free(score);
    free(flags);
    return s;
}
