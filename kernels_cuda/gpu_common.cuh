/*
 * Shared by the GPU ops: the runtime (CUDA, or HIP through
 * kernels_cuda/hip_compat.h when FG_HIP is defined), error handling, the
 * backend state with its device scratch arena, and block-wide reductions
 * that work for any warp / wavefront size.
 */
#ifndef FG_GPU_COMMON_CUH
#define FG_GPU_COMMON_CUH

#include <math.h>
#include <stdint.h>

#ifdef FG_HIP
#include "kernels_cuda/hip_compat.h"
#define FG_GPU(name) fg_hip_##name
#define FG_GPU_NAME "hip"
#else
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#define FG_GPU(name) fg_cuda_##name
#define FG_GPU_NAME "cuda"
#endif

#include "backends/backend.h"
#include "common/dtype.h"
#include "common/rules.h"
#include "common/slots.h"

#define FG_THREADS 256 /* threads per block in every kernel */

/* Kernels launched with FG_THREADS threads a block say so to hipcc, which
 * otherwise plans for blocks of 1024 threads, a quarter of a SIMD's
 * registers a thread, and spills. nvcc already gives a thread up to 255
 * registers, and with the bounds ptxas trades a few registers for spills in
 * small kernels: not there. HIP-CPU defines __launch_bounds__ as nothing. */
#ifdef FG_HIP
#define FG_BLOCK_BOUNDS __launch_bounds__(FG_THREADS)
#else
#define FG_BLOCK_BOUNDS
#endif

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

/* Unrolls a loop of a compile-time count on devices (registers stay registers),
 * or keeps one rolled. */
#if (defined(__CUDACC__) || defined(__HIPCC__)) && !defined(__HIP_CPU_RT__)
#define FG_UNROLL _Pragma("unroll")
#define FG_NO_UNROLL _Pragma("unroll 1")
#else
#define FG_UNROLL
#define FG_NO_UNROLL
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

/* Pinned host buffers for the per-call upload, used in turn: a buffer is
 * rewritten only after the copy that last read it has run (its event), so
 * the host can run ahead of the device without waiting. */
#define FG_GPU_STAGES 4
typedef struct fg_gpu_stage {
    unsigned char *host;
    size_t bytes;
    cudaEvent_t done;
    int pending;
} fg_gpu_stage;

/* Per-kernel device time for the benchmarks (the "kernel_times" extra):
 * while on, an op records an event before its first queued work and after
 * each kernel or copy (fg_gpu_mark), then waits for them (fg_gpu_mark_end)
 * and adds the time between each pair to that step's name, and the host's
 * time up to its first queued work to "host". Off, the marks cost a branch. */
#define FG_GPU_MARKS 8  /* marks in one op */
#define FG_GPU_TIMED 24 /* names timed */
typedef struct fg_gpu_timing {
    int on, n;      /* n: events recorded after the first, -1 before mark_queue */
    double host_t0; /* the op's start on the host clock */
    cudaEvent_t ev[FG_GPU_MARKS + 1];
    const char *mark[FG_GPU_MARKS];
    int32_t n_names;
    fg_kernel_time sum[FG_GPU_TIMED];
} fg_gpu_timing;

/* Backend state: the stream (its own, or the engine's), a device scratch
 * arena that only grows, the staging buffers, and a sticky device flag that
 * the decode step raises when a head ends with a slot count the host did not
 * expect (read when the backend synchronises). */
typedef struct fg_gpu_state {
    cudaStream_t stream;
    cudaStream_t own_stream;
    int shared_stream; /* HIP-CPU: one stream for every backend, never destroyed */
    int32_t n_sm;      /* multiprocessors (compute units) */
    unsigned char *scratch;
    size_t scratch_bytes;
    fg_gpu_stage stage[FG_GPU_STAGES];
    int stage_next, stage_cur;
    int32_t *d_error, *h_error;
    cudaEvent_t timer[2];
    void *probe[2]; /* the bandwidth probe's buffers, kept between calls */
    size_t probe_bytes;
    int32_t decode_heads; /* most query heads one decode block takes (FASTGEN_GPU_DECODE_HEADS) */
    int32_t decode_mma;   /* 16-bit rows at d = 64 / 128 decode on tensor cores (FASTGEN_GPU_DECODE_MMA) */
    fg_gpu_timing timing;
} fg_gpu_state;

/* Grows the arena to `bytes` (contents not kept) and returns its base. */
fg_status FG_GPU(scratch)(fg_backend *be, size_t bytes, unsigned char **out);
/* Copies n host bytes into the arena at `at`, aligning `at` up to 256, and
 * waits for nothing: the caller synchronises before `src` changes. */
fg_status FG_GPU(upload)(fg_backend *be, unsigned char *base, size_t *at, const void *src, size_t n, void **dev);
/* The next pinned staging buffer, of at least `bytes` (waits only for the
 * copy that last read it); then stage_upload copies its first `bytes` to dev. */
fg_status FG_GPU(stage)(fg_backend *be, size_t bytes, unsigned char **host);
fg_status FG_GPU(stage_upload)(fg_backend *be, void *dev, const unsigned char *host, size_t bytes);
/* Per-kernel timing (fg_gpu_timing): mark_begin at an op's start,
 * mark_queue just before its first queued work (the host's bookkeeping ends
 * there), mark after each kernel or copy with its name (a string literal),
 * mark_end before the op returns. No-ops unless the "kernel_times" extra
 * turned timing on. */
void FG_GPU(mark_begin)(fg_backend *be);
void FG_GPU(mark_queue)(fg_backend *be);
void FG_GPU(mark)(fg_backend *be, const char *kernel);
fg_status FG_GPU(mark_end)(fg_backend *be);
/* Waits for the stream, then reports a raised error flag (and lowers it). */
fg_status FG_GPU(synchronize)(fg_backend *be);

static inline size_t fg_gpu_align(size_t x) { return (x + 255) / 256 * 256; }

/* The page layout, as kernels read it (pos, score, row and flags lie in the
 * meta pages; pl, the whole layout, for common/slots.h). K and V share one
 * dtype here: a context that stores them apart is refused before any kernel
 * runs (fg_backend_ops.kv_apart is 0). */
struct fg_gpu_layout {
    int32_t page_tokens, head_dim, dtype;
    int32_t qshift; /* quantized rows: log2 of the values per block */
    uint32_t row_bytes, k_offset, v_offset, pos_offset, score_offset, flags_offset, row_offset;
    fg_page_layout pl;
};

static inline fg_gpu_layout fg_gpu_layout_of(const fg_page_layout *L) {
    const int32_t qb = fg_qblock(L->head_dim);
    fg_gpu_layout g = {L->page_tokens,
                       L->head_dim,
                       (int32_t)L->k_dtype,
                       qb == 32 ? 5 : qb == 16 ? 4 : 3,
                       (uint32_t)L->k_row_bytes,
                       (uint32_t)L->k_offset,
                       (uint32_t)L->v_offset,
                       (uint32_t)L->pos_offset,
                       (uint32_t)L->score_offset,
                       (uint32_t)L->flags_offset,
                       (uint32_t)L->row_offset,
                       *L};
    return g;
}

/* Unit u of a row written by `n` threads: a quantized row's block u (the
 * same arithmetic as the host's fg_store_row), or element u. Units: d / qb,
 * or d. */
__device__ static inline int32_t fg_gpu_row_units(const fg_gpu_layout &L) {
    return fg_dtype_quantized((fg_dtype)L.dtype) ? L.head_dim >> L.qshift : L.head_dim;
}
__device__ static inline void fg_gpu_store(unsigned char *row, int32_t dtype, int32_t i, float x);
__device__ static inline void fg_gpu_store_unit(const fg_gpu_layout &L, unsigned char *row, int32_t u,
                                                const float *src) {
    if (L.dtype == FG_DTYPE_Q8_0)
        fg_quantize_q8_0(row + (size_t)u * fg_qblock_bytes(FG_DTYPE_Q8_0, 1 << L.qshift), src + (u << L.qshift),
                         1 << L.qshift);
    else if (L.dtype == FG_DTYPE_Q4_0)
        fg_quantize_q4_0(row + (size_t)u * fg_qblock_bytes(FG_DTYPE_Q4_0, 1 << L.qshift), src + (u << L.qshift),
                         1 << L.qshift);
    else
        fg_gpu_store(row, L.dtype, u, src[u]);
}

/* A 16-bit element (f16 or bf16) as a float, exactly: the hardware conversion
 * on a device, the portable one under HIP-CPU. */
__device__ static inline float fg_gpu_half_to_float(int32_t dtype, uint16_t x) {
    if (dtype != FG_DTYPE_F16)
        return fg_bf16_to_f32(x);
#ifdef __HIP_CPU_RT__
    return fg_f16_to_f32(x);
#else
    return __half2float(__ushort_as_half(x));
#endif
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

/* The larger of a and b, NaN when either is: a decode step's running maximum
 * as ref's (a NaN score makes the head's output and scores NaN; fmaxf would
 * drop it, and a chunk whose every score is NaN would vanish from the merge). */
__device__ static inline float fg_max_nan(float a, float b) {
    return a != a || b != b ? a + b : fmaxf(a, b);
}

/* fg_block_max with fg_max_nan. */
__device__ static inline float fg_block_max_nan(float x, float *sh) {
    sh[threadIdx.x] = x;
    __syncthreads();
    for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s)
            sh[threadIdx.x] = fg_max_nan(sh[threadIdx.x], sh[threadIdx.x + s]);
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

/* Sums of x[0..N) over aligned groups of `width` threads (a power of two, at
 * most 32); every thread of a group gets its group's sums. Every thread of
 * the block calls it (it may synchronise). Warp shuffles on devices (a group
 * fits in a CUDA warp and in an AMD wave32 or wave64: no warp size is
 * assumed beyond 32); shared memory under HIP-CPU, whose threads are fibers
 * without lanes, or where FG_GPU_SHARED_REDUCE is defined. `sh` holds
 * N * blockDim.x floats. */
#if defined(__HIP_CPU_RT__) || defined(FG_GPU_SHARED_REDUCE)
#define FG_GROUP_SUM_SHARED 1
#else
#define FG_GROUP_SUM_SHARED 0
#endif
template <int N> __device__ static inline void fg_group_sum_n(float (&x)[N], int32_t width, float *sh) {
#if FG_GROUP_SUM_SHARED
    const int32_t T = blockDim.x, first = threadIdx.x & ~(width - 1);
    for (int i = 0; i < N; i++)
        sh[i * T + threadIdx.x] = x[i];
    __syncthreads();
    for (int i = 0; i < N; i++) {
        float s = 0.0f;
        for (int32_t j = 0; j < width; j++)
            s += sh[i * T + first + j];
        x[i] = s;
    }
    __syncthreads();
#else
    (void)sh;
    for (int32_t o = width / 2; o > 0; o >>= 1) /* N independent shuffles per round: they overlap */
FG_UNROLL
        for (int i = 0; i < N; i++)
#ifdef FG_HIP
            x[i] += __shfl_xor(x[i], o, width);
#else
            x[i] += __shfl_xor_sync(0xffffffffu, x[i], o, width);
#endif
#endif
}

/* The ops, named fg_cuda_* or fg_hip_*. */
extern "C" {
fg_prefill_attention_fn FG_GPU(prefill_attention);
fg_profile_stats_fn FG_GPU(profile_stats);
fg_compact_fn FG_GPU(compact);
fg_decode_step_fn FG_GPU(decode_step);
fg_read_slots_fn FG_GPU(read_slots);
fg_adaptive_observe_fn FG_GPU(adaptive_observe);
fg_adaptive_errors_fn FG_GPU(adaptive_errors);
}

#endif /* FG_GPU_COMMON_CUH */
