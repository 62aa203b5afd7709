/*
 * Shared by the GPU ops: the runtime (CUDA, or HIP through
 * kernels_hip/hip_compat.h when FG_HIP is defined), error handling, the
 * backend state with its device scratch arena, and block-wide reductions
 * that work for any warp / wavefront size.
 */
#ifndef FG_GPU_COMMON_CUH
#define FG_GPU_COMMON_CUH

#include <math.h>
#include <stdint.h>

#ifdef FG_HIP
#include "kernels_hip/hip_compat.h"
#define FG_GPU(name) fg_hip_##name
#define FG_GPU_NAME "hip"
#else
#include <cuda_runtime.h>
#define FG_GPU(name) fg_cuda_##name
#define FG_GPU_NAME "cuda"
#endif

#include "backends/backend.h"
#include "kernels_cpu/dtype.h"

#define FG_THREADS 256 /* threads per block in every kernel */

/* The three spellings that differ under HIP-CPU (AMD's HIP runtime on the CPU,
 * which defines __HIP_CPU_RT__; -Dhip-cpu=enabled): a kernel launch, the
 * dynamic shared memory of a block, and an integer min. nvcc and hipcc see
 * the usual <<<...>>> and extern __shared__. */
#ifdef __HIP_CPU_RT__
#define FG_LAUNCH(kernel, grid, block, shared_bytes, stream, ...)                                                      \
    hipLaunchKernelGGL(kernel, grid, block, shared_bytes, stream, __VA_ARGS__)
#define FG_DYNAMIC_SHARED(type, name) HIP_DYNAMIC_SHARED(type, name)
#else
#define FG_LAUNCH(kernel, grid, block, shared_bytes, stream, ...)                                                      \
    kernel<<<grid, block, shared_bytes, stream>>>(__VA_ARGS__)
#define FG_DYNAMIC_SHARED(type, name) extern __shared__ type name[]
#endif

__device__ static inline int32_t fg_imin(int32_t a, int32_t b) { return a < b ? a : b; }

/* A runtime call that must succeed: otherwise an fg_status with the runtime's text. */
#define GPU_CHECK(be, call)                                                                                            \
    do {                                                                                                               \
        cudaError_t e_ = (call);                                                                                       \
        if (e_ != cudaSuccess)                                                                                         \
            return (be)->err((be)->err_sink, FG_ERR_BACKEND, FG_GPU_NAME ": %s failed: %s", #call,                     \
                             cudaGetErrorString(e_));                                                                  \
    } while (0)

/* Backend state: one stream and a device scratch arena that only grows. */
typedef struct fg_gpu_state {
    cudaStream_t stream;
    int shared_stream; /* HIP-CPU: one stream for every backend, never destroyed */
    unsigned char *scratch;
    size_t scratch_bytes;
} fg_gpu_state;

/* Grows the arena to `bytes` (contents not kept) and returns its base. */
fg_status FG_GPU(scratch)(fg_backend *be, size_t bytes, unsigned char **out);
/* Copies n host bytes into the arena at `at`, aligning `at` up to 256. */
fg_status FG_GPU(upload)(fg_backend *be, unsigned char *base, size_t *at, const void *src, size_t n, void **dev);

static inline size_t fg_gpu_align(size_t x) { return (x + 255) / 256 * 256; }

/* The page layout, as kernels read it. */
struct fg_gpu_layout {
    int32_t page_tokens, head_dim, dtype;
    uint32_t k_offset, v_offset, pos_offset, score_offset, flags_offset;
};

static inline fg_gpu_layout fg_gpu_layout_of(const fg_page_layout *L) {
    fg_gpu_layout g = {L->page_tokens,          L->head_dim,           (int32_t)L->dtype,
                       (uint32_t)L->k_offset,   (uint32_t)L->v_offset, (uint32_t)L->pos_offset,
                       (uint32_t)L->score_offset, (uint32_t)L->flags_offset};
    return g;
}

__device__ static inline float fg_gpu_elem(const unsigned char *row, int32_t dtype, int32_t i) {
    return dtype == FG_DTYPE_F32 ? ((const float *)row)[i]
           : dtype == FG_DTYPE_F16 ? fg_f16_to_f32(((const uint16_t *)row)[i])
                                   : fg_bf16_to_f32(((const uint16_t *)row)[i]);
}

__device__ static inline void fg_gpu_store(unsigned char *row, int32_t dtype, int32_t i, float x) {
    if (dtype == FG_DTYPE_F32)
        ((float *)row)[i] = x;
    else if (dtype == FG_DTYPE_F16)
        ((uint16_t *)row)[i] = fg_f32_to_f16(x);
    else
        ((uint16_t *)row)[i] = fg_f32_to_bf16(x);
}

/* Block-wide sum and max through shared memory (any blockDim, any warp size);
 * every thread gets the result. `sh` holds blockDim.x floats. */
__device__ static inline float fg_block_sum(float x, float *sh) {
    sh[threadIdx.x] = x;
    __syncthreads();
    for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s)
            sh[threadIdx.x] += sh[threadIdx.x + s];
        __syncthreads();
    }
    float r = sh[0];
    __syncthreads();
    return r;
}

__device__ static inline float fg_block_max(float x, float *sh) {
    sh[threadIdx.x] = x;
    __syncthreads();
    for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s)
            sh[threadIdx.x] = fmaxf(sh[threadIdx.x], sh[threadIdx.x + s]);
        __syncthreads();
    }
    float r = sh[0];
    __syncthreads();
    return r;
}

/* The ops, named fg_cuda_* or fg_hip_*. */
extern "C" {
fg_prefill_attention_fn FG_GPU(prefill_attention);
fg_profile_stats_fn FG_GPU(profile_stats);
fg_compact_fn FG_GPU(compact);
fg_decode_step_fn FG_GPU(decode_step);
fg_read_slots_fn FG_GPU(read_slots);
}

#endif /* FG_GPU_COMMON_CUH */
