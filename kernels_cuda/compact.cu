/* compact on the GPU: the kept prompt rows of every head into its pages.
 * Grid: (tiles of ROWS_PER_BLOCK kept rows, heads). A block's threads cover
 * several rows at once, each thread one vector of 4 elements of a row (a
 * 16-byte load, an 8- or 16-byte store), so a warp gathers whole rows; rows
 * whose d or addresses do not allow vectors go element by element. The
 * host's part (descriptors, row and meta page tables, positions, flags, scores) goes up in
 * one copy from a pinned buffer. */
#include <stdlib.h>
#include <string.h>

#include "kernels_cuda/gpu_common.cuh"

#define ROWS_PER_BLOCK 32

struct compact_desc {
    int32_t kv_head, n_keep;
    int64_t slot0; /* into pos / flags / score */
    int64_t page0; /* into pages: the row pages, then as many meta pages */
    int32_t n_pages;
};

/* Four floats from src stored at dst as dtype (dst aligned to the stored size). */
__device__ static inline void store4(unsigned char *dst, int32_t dtype, float4 x) {
    if (dtype == FG_DTYPE_F32) {
        *(float4 *)dst = x;
        return;
    }
    const float f[4] = {x.x, x.y, x.z, x.w};
    uint16_t h[4];
    for (int i = 0; i < 4; i++)
        h[i] = dtype == FG_DTYPE_F16 ? fg_f32_to_f16(f[i]) : fg_f32_to_bf16(f[i]);
    *(uint2 *)dst = make_uint2((uint32_t)h[0] | ((uint32_t)h[1] << 16), (uint32_t)h[2] | ((uint32_t)h[3] << 16));
}

__global__ static void FG_BLOCK_BOUNDS compact_rows(fg_gpu_layout L, int32_t Hkv, int32_t vec, const float *k,
                                                    const float *v, const compact_desc *heads, void *const *pages,
                                                    const int32_t *pos, const int32_t *from, const uint8_t *flags,
                                                    const float *score) {
    const compact_desc h = heads[blockIdx.y];
    const int32_t d = L.head_dim, es = L.dtype == FG_DTYPE_F32 ? 4 : 2;
    const int32_t per_row = vec ? d / 4 : fg_gpu_row_units(L); /* threads' units in a row */
    const int32_t first = blockIdx.x * ROWS_PER_BLOCK, rows = fg_imin(ROWS_PER_BLOCK, h.n_keep - first);
    for (int32_t u = threadIdx.x; u < rows * per_row; u += blockDim.x) {
        const int32_t s = first + u / per_row, c = u % per_row;
        unsigned char *page = (unsigned char *)pages[h.page0 + s / L.page_tokens]; /* row s */
        unsigned char *meta = (unsigned char *)pages[h.page0 + h.n_pages + s / L.page_tokens];
        const int32_t j = s % L.page_tokens, p = pos[h.slot0 + s];
        const size_t src = ((size_t)from[h.slot0 + s] * Hkv + h.kv_head) * d, dst = (size_t)j * L.row_bytes;
        if (vec) {
            store4(page + L.k_offset + dst + (size_t)c * 4 * es, L.dtype, ((const float4 *)(k + src))[c]);
            store4(page + L.v_offset + dst + (size_t)c * 4 * es, L.dtype, ((const float4 *)(v + src))[c]);
        } else {
            fg_gpu_store_unit(L, page + L.k_offset + dst, c, k + src);
            fg_gpu_store_unit(L, page + L.v_offset + dst, c, v + src);
        }
        if (c == 0) {
            ((int32_t *)(meta + L.pos_offset))[j] = p;
            ((float *)(meta + L.score_offset))[j] = score[h.slot0 + s];
            ((int32_t *)(meta + L.row_offset))[j] = s;
            meta[L.flags_offset + j] = flags[h.slot0 + s];
        }
    }
}

extern "C" fg_status FG_GPU(compact)(fg_backend *be, const fg_page_layout *layout, const fg_shape *shape, int32_t n,
                                     const float *k, const float *v, int32_t n_heads, const fg_compact_head *heads) {
    fg_gpu_state *st = (fg_gpu_state *)be->impl;
    FG_GPU(mark_begin)(be);
    const int32_t Hkv = shape->n_kv_heads, d = shape->head_dim, P = layout->page_tokens;
    int64_t slots = 0, pages = 0;
    int32_t max_keep = 0, any_src = 0;
    for (int32_t i = 0; i < n_heads; i++) {
        any_src |= heads[i].src != NULL;
        slots += heads[i].n_keep;
        pages += 2 * ((heads[i].n_keep + P - 1) / P);
        max_keep = heads[i].n_keep > max_keep ? heads[i].n_keep : max_keep;
    }
    if (max_keep == 0)
        return FG_OK;
    /* the upload: descriptors, page tables, pos / source rows / score / flags, concatenated; the source
     * rows only where a head has its own (a prefill's are its positions: 9 bytes a kept row, not 13) */
    const size_t o_ptab = fg_gpu_align((size_t)n_heads * sizeof(compact_desc));
    const size_t o_pos = o_ptab + fg_gpu_align((size_t)pages * sizeof(void *));
    const size_t o_from = any_src ? o_pos + fg_gpu_align((size_t)slots * 4) : o_pos;
    const size_t o_score = o_from + fg_gpu_align((size_t)slots * 4), o_flags = o_score + fg_gpu_align((size_t)slots * 4);
    const size_t up_bytes = o_flags + (size_t)slots;
    const size_t rows = (size_t)n * Hkv * d * sizeof(float);
    const size_t o_k = fg_gpu_align(up_bytes), o_v = o_k + fg_gpu_align(rows);
    unsigned char *base, *host;
    fg_status s = FG_GPU(scratch)(be, (be->device_io ? up_bytes : o_v + rows) + 256, &base);
    if (!s)
        s = FG_GPU(stage)(be, up_bytes, &host);
    if (s)
        return s;
    compact_desc *desc = (compact_desc *)host;
    void **ptab = (void **)(host + o_ptab);
    int64_t so = 0, po = 0;
    for (int32_t i = 0; i < n_heads; i++) {
        const fg_compact_head *h = &heads[i];
        const int32_t np = (h->n_keep + P - 1) / P;
        desc[i] = compact_desc{h->kv_head, h->n_keep, so, po, np};
        memcpy(host + o_pos + (size_t)so * 4, h->pos, (size_t)h->n_keep * 4);
        if (any_src)
            memcpy(host + o_from + (size_t)so * 4, h->src ? h->src : h->pos, (size_t)h->n_keep * 4);
        memcpy(host + o_score + (size_t)so * 4, h->score, (size_t)h->n_keep * 4);
        memcpy(host + o_flags + (size_t)so, h->flags, (size_t)h->n_keep);
        memcpy(ptab + po, h->pages, (size_t)np * sizeof(void *));
        memcpy(ptab + po + np, h->meta, (size_t)np * sizeof(void *));
        so += h->n_keep;
        po += 2 * np;
    }
    FG_GPU(mark_queue)(be);
    if ((s = FG_GPU(stage_upload)(be, base, host, up_bytes)))
        return s;
    const float *dk = k, *dv = v; /* device I/O: already there */
    if (!be->device_io) {
        GPU_CHECK(be, cudaMemcpyAsync(base + o_k, k, rows, cudaMemcpyHostToDevice, st->stream));
        GPU_CHECK(be, cudaMemcpyAsync(base + o_v, v, rows, cudaMemcpyHostToDevice, st->stream));
        dk = (const float *)(base + o_k);
        dv = (const float *)(base + o_v);
    }
    FG_GPU(mark)(be, "upload");
    /* vectors of 4 when every source row and page row is aligned for them */
    const int32_t vec = d % 4 == 0 && ((uintptr_t)dk % 16) == 0 && ((uintptr_t)dv % 16) == 0 &&
                        !fg_dtype_quantized(layout->k_dtype); /* quantized rows: one thread a block */
    const dim3 grid((max_keep + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK, n_heads);
    FG_LAUNCH(compact_rows, grid, FG_THREADS, 0, st->stream, fg_gpu_layout_of(layout), Hkv, vec, dk, dv,
              (const compact_desc *)base, (void *const *)(base + o_ptab), (const int32_t *)(base + o_pos),
              (const int32_t *)(base + o_from), (const uint8_t *)(base + o_flags), (const float *)(base + o_score));
    FG_GPU(mark)(be, "compact");
    GPU_CHECK(be, cudaGetLastError());
    if ((s = FG_GPU(mark_end)(be)))
        return s;
    /* host I/O is synchronous; device I/O queues the copy and returns */
    return be->device_io ? FG_OK : FG_GPU(synchronize)(be);
}
