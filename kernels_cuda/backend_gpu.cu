/* The GPU backend (CUDA, or HIP from the same source): device, stream,
 * buffers, the scratch arena, slot reads, and the op table. */
#include <stdlib.h>
#include <string.h>

#include "kernels_cuda/gpu_common.cuh"

/* cudaMalloc that also refuses a NULL "success" (HIP-CPU returns hipSuccess
 * with NULL when the host is out of memory). */
static fg_status gpu_malloc(fg_backend *be, size_t bytes, void **out) {
    *out = NULL;
    cudaError_t e = cudaMalloc(out, bytes ? bytes : 1);
    if (e != cudaSuccess || !*out) {
        *out = NULL;
        return be->err(be->err_sink, FG_ERR_OUT_OF_MEMORY, FG_GPU_NAME ": device allocation of %zu bytes failed: %s",
                       bytes, e != cudaSuccess ? cudaGetErrorString(e) : "no memory");
    }
    return FG_OK;
}

fg_status FG_GPU(scratch)(fg_backend *be, size_t bytes, unsigned char **out) {
    fg_gpu_state *st = (fg_gpu_state *)be->impl;
    if (bytes > st->scratch_bytes) {
        if (st->scratch)
            GPU_CHECK(be, cudaFree(st->scratch));
        st->scratch = NULL;
        st->scratch_bytes = 0;
        fg_status s = gpu_malloc(be, bytes, (void **)&st->scratch);
        if (s)
            return s;
        st->scratch_bytes = bytes;
    }
    *out = st->scratch;
    return FG_OK;
}

fg_status FG_GPU(upload)(fg_backend *be, unsigned char *base, size_t *at, const void *src, size_t n, void **dev) {
    fg_gpu_state *st = (fg_gpu_state *)be->impl;
    *at = fg_gpu_align(*at);
    *dev = base + *at;
    if (n)
        GPU_CHECK(be, cudaMemcpyAsync(*dev, src, n, cudaMemcpyHostToDevice, st->stream));
    *at += n;
    return FG_OK;
}

static void gpu_free(fg_backend *be, void *ptr) {
    (void)be;
    cudaFree(ptr);
}

static fg_status gpu_write(fg_backend *be, void *dst, const void *src, size_t bytes) {
    GPU_CHECK(be, cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
    return FG_OK;
}

static fg_status gpu_read(fg_backend *be, void *dst, const void *src, size_t bytes) {
    GPU_CHECK(be, cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
    return FG_OK;
}

static fg_status gpu_copy(fg_backend *be, void *dst, const void *src, size_t bytes) {
    fg_gpu_state *st = (fg_gpu_state *)be->impl;
    GPU_CHECK(be, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, st->stream));
    return FG_OK;
}

/* Gathers pos/flags/score of n slots (pages[] are device addresses). */
__global__ static void gather_slots(fg_gpu_layout L, void *const *pages, int32_t n, int32_t *pos, uint8_t *flags,
                                    float *score) {
    const int32_t s = blockIdx.x * blockDim.x + threadIdx.x;
    if (s >= n)
        return;
    const unsigned char *page = (const unsigned char *)pages[s / L.page_tokens];
    const int32_t j = s % L.page_tokens;
    pos[s] = ((const int32_t *)(page + L.pos_offset))[j];
    flags[s] = page[L.flags_offset + j];
    score[s] = ((const float *)(page + L.score_offset))[j];
}

extern "C" fg_status FG_GPU(read_slots)(fg_backend *be, const fg_page_layout *layout, void *const *pages,
                                        int32_t n_slots, int32_t *pos, uint8_t *flags, float *score) {
    fg_gpu_state *st = (fg_gpu_state *)be->impl;
    if (n_slots <= 0)
        return FG_OK;
    const int32_t n_pages = (n_slots + layout->page_tokens - 1) / layout->page_tokens;
    const size_t need = fg_gpu_align((size_t)n_pages * sizeof(void *)) + fg_gpu_align((size_t)n_slots * 9) + 1024;
    unsigned char *base;
    fg_status s = FG_GPU(scratch)(be, need, &base);
    if (s)
        return s;
    size_t at = 0;
    void *d_pages;
    if ((s = FG_GPU(upload)(be, base, &at, pages, (size_t)n_pages * sizeof(void *), &d_pages)))
        return s;
    at = fg_gpu_align(at);
    int32_t *d_pos = (int32_t *)(base + at);
    at = fg_gpu_align(at + (size_t)n_slots * 4);
    float *d_score = (float *)(base + at);
    at = fg_gpu_align(at + (size_t)n_slots * 4);
    uint8_t *d_flags = base + at;
    FG_LAUNCH(gather_slots, (n_slots + FG_THREADS - 1) / FG_THREADS, FG_THREADS, 0, st->stream,
              fg_gpu_layout_of(layout), (void *const *)d_pages, n_slots, d_pos, d_flags, d_score);
    GPU_CHECK(be, cudaGetLastError());
    GPU_CHECK(be, cudaMemcpyAsync(pos, d_pos, (size_t)n_slots * 4, cudaMemcpyDeviceToHost, st->stream));
    if (flags)
        GPU_CHECK(be, cudaMemcpyAsync(flags, d_flags, (size_t)n_slots, cudaMemcpyDeviceToHost, st->stream));
    if (score)
        GPU_CHECK(be, cudaMemcpyAsync(score, d_score, (size_t)n_slots * 4, cudaMemcpyDeviceToHost, st->stream));
    GPU_CHECK(be, cudaStreamSynchronize(st->stream));
    return FG_OK;
}

static void gpu_destroy(fg_backend *be) {
    fg_gpu_state *st = (fg_gpu_state *)be->impl;
    if (!st)
        return;
    if (st->scratch)
        cudaFree(st->scratch);
    if (st->stream && !st->shared_stream)
        cudaStreamDestroy(st->stream);
    free(st);
}

static const fg_backend_ops k_gpu_ops = {
    FG_GPU_NAME,
    gpu_malloc,
    gpu_free,
    gpu_write,
    gpu_read,
    FG_GPU(prefill_attention),
    FG_GPU(profile_stats),
    FG_GPU(compact),
    FG_GPU(decode_step),
    FG_GPU(read_slots),
    gpu_destroy,
    gpu_copy,
};

#ifdef FG_HIP
extern "C" fg_status fg_backend_hip_init(fg_backend *be) {
#else
extern "C" fg_status fg_backend_cuda_init(fg_backend *be) {
#endif
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0)
        return be->err(be->err_sink, FG_ERR_UNAVAILABLE, "backend \"" FG_GPU_NAME "\": no device (%s)",
                       e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    fg_gpu_state *st = (fg_gpu_state *)calloc(1, sizeof *st);
    if (!st)
        return be->err(be->err_sink, FG_ERR_OUT_OF_MEMORY, FG_GPU_NAME ": out of memory");
    be->impl = st;
    be->ops = &k_gpu_ops;
#ifdef __HIP_CPU_RT__
    /* HIP-CPU keeps a slot per stream for the life of each host thread and
     * aborts past 255 of them, destroyed ones included: under emulation the
     * backends share one stream, made once and never destroyed. */
    static cudaError_t shared_status = cudaErrorUnknown;
    static cudaStream_t shared = [] {
        cudaStream_t s = 0;
        shared_status = cudaStreamCreate(&s);
        return s;
    }();
    st->stream = shared;
    st->shared_stream = 1;
    e = shared_status;
#else
    e = cudaStreamCreate(&st->stream);
#endif
    if (e != cudaSuccess) {
        gpu_destroy(be);
        be->impl = NULL;
        be->ops = NULL;
        return be->err(be->err_sink, FG_ERR_BACKEND, FG_GPU_NAME ": cudaStreamCreate failed: %s", cudaGetErrorString(e));
    }
    return FG_OK;
}
