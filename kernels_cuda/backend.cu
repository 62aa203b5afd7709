/* The GPU backend (CUDA, or HIP from the same source): device, stream,
 * buffers, the scratch arena, slot reads, and the op table. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

fg_status FG_GPU(stage)(fg_backend *be, size_t bytes, unsigned char **host) {
    fg_gpu_state *st = (fg_gpu_state *)be->impl;
    fg_gpu_stage *g = &st->stage[st->stage_next];
    if (g->pending)
        GPU_CHECK(be, cudaEventSynchronize(g->done)); /* the copy that last read it has run */
    g->pending = 0;
    if (bytes > g->bytes) {
        if (g->host)
            GPU_CHECK(be, cudaFreeHost(g->host));
        g->host = NULL;
        g->bytes = 0;
        const size_t want = bytes < 65536 ? 65536 : bytes + bytes / 2;
        cudaError_t e = cudaMallocHost((void **)&g->host, want);
        if (e != cudaSuccess || !g->host) {
            g->host = NULL;
            return be->err(be->err_sink, FG_ERR_OUT_OF_MEMORY, FG_GPU_NAME ": pinned host allocation of %zu bytes failed: %s",
                           want, e != cudaSuccess ? cudaGetErrorString(e) : "no memory");
        }
        g->bytes = want;
    }
    st->stage_cur = st->stage_next;
    st->stage_next = (st->stage_next + 1) % FG_GPU_STAGES;
    *host = g->host;
    return FG_OK;
}

fg_status FG_GPU(stage_upload)(fg_backend *be, void *dev, const unsigned char *host, size_t bytes) {
    fg_gpu_state *st = (fg_gpu_state *)be->impl;
    fg_gpu_stage *g = &st->stage[st->stage_cur];
    if (bytes)
        GPU_CHECK(be, cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, st->stream));
    GPU_CHECK(be, cudaEventRecord(g->done, st->stream));
    g->pending = 1;
    return FG_OK;
}

fg_status FG_GPU(synchronize)(fg_backend *be) {
    fg_gpu_state *st = (fg_gpu_state *)be->impl;
    GPU_CHECK(be, cudaMemcpyAsync(st->h_error, st->d_error, sizeof(int32_t), cudaMemcpyDeviceToHost, st->stream));
    GPU_CHECK(be, cudaStreamSynchronize(st->stream));
    if (*st->h_error) {
        const int32_t what = *st->h_error;
        *st->h_error = 0;
        GPU_CHECK(be, cudaMemset(st->d_error, 0, sizeof(int32_t)));
        return be->err(be->err_sink, FG_ERR_INTERNAL,
                       FG_GPU_NAME ": a decode step %s (that step's caches are undefined; please report it)",
                       what == 2 ? "found heads that rank together holding different positions"
                                 : "ended a head with a slot count the host did not expect");
    }
    return FG_OK;
}

static fg_status gpu_set_stream(fg_backend *be, void *stream) {
    fg_gpu_state *st = (fg_gpu_state *)be->impl;
    fg_status s = FG_GPU(synchronize)(be); /* work queued on the old stream ends first */
    if (s)
        return s;
    st->stream = stream ? (cudaStream_t)stream : st->own_stream;
    return FG_OK;
}

static fg_status gpu_timer(fg_backend *be, int stop, double *seconds) {
    fg_gpu_state *st = (fg_gpu_state *)be->impl;
    GPU_CHECK(be, cudaEventRecord(st->timer[stop ? 1 : 0], st->stream));
    if (stop) {
        float ms = 0.0f;
        GPU_CHECK(be, cudaEventSynchronize(st->timer[1]));
        GPU_CHECK(be, cudaEventElapsedTime(&ms, st->timer[0], st->timer[1]));
        *seconds = 1e-3 * ms;
    }
    return FG_OK;
}

static double host_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Adds `seconds` to `name`'s sum (names are string literals: compared by text). */
static void timing_add(fg_gpu_timing *t, const char *name, double seconds) {
    int32_t i = 0;
    while (i < t->n_names && strcmp(t->sum[i].name, name))
        i++;
    if (i == t->n_names) {
        if (i == FG_GPU_TIMED)
            return;
        t->sum[t->n_names++] = fg_kernel_time{name, 0.0, 0};
    }
    t->sum[i].seconds += seconds;
    t->sum[i].calls++;
}

void FG_GPU(mark_begin)(fg_backend *be) {
    fg_gpu_timing *t = &((fg_gpu_state *)be->impl)->timing;
    if (!t->on)
        return;
    t->n = -1; /* until mark_queue */
    t->host_t0 = host_seconds();
}

void FG_GPU(mark_queue)(fg_backend *be) {
    fg_gpu_state *st = (fg_gpu_state *)be->impl;
    fg_gpu_timing *t = &st->timing;
    if (!t->on || t->n != -1)
        return;
    timing_add(t, "host", host_seconds() - t->host_t0);
    t->n = 0;
    cudaEventRecord(t->ev[0], st->stream);
}

void FG_GPU(mark)(fg_backend *be, const char *kernel) {
    fg_gpu_state *st = (fg_gpu_state *)be->impl;
    fg_gpu_timing *t = &st->timing;
    if (!t->on || t->n < 0 || t->n == FG_GPU_MARKS)
        return;
    t->mark[t->n] = kernel;
    cudaEventRecord(t->ev[++t->n], st->stream);
}

fg_status FG_GPU(mark_end)(fg_backend *be) {
    fg_gpu_timing *t = &((fg_gpu_state *)be->impl)->timing;
    if (!t->on || t->n <= 0)
        return FG_OK;
    GPU_CHECK(be, cudaEventSynchronize(t->ev[t->n]));
    for (int i = 0; i < t->n; i++) {
        float ms = 0.0f;
        GPU_CHECK(be, cudaEventElapsedTime(&ms, t->ev[i], t->ev[i + 1]));
        timing_add(t, t->mark[i], 1e-3 * ms);
    }
    t->n = 0;
    return FG_OK;
}

static fg_status gpu_kernel_times(fg_backend *be, int on, fg_kernel_time *out, int32_t cap, int32_t *n) {
    fg_gpu_state *st = (fg_gpu_state *)be->impl;
    fg_gpu_timing *t = &st->timing;
    if (on) {
        for (int i = 0; i <= FG_GPU_MARKS; i++) /* made once, on first use */
            if (!t->ev[i])
                GPU_CHECK(be, cudaEventCreate(&t->ev[i]));
        t->n_names = 0;
        t->n = 0;
    }
    t->on = on;
    *n = t->n_names < cap ? t->n_names : cap;
    for (int32_t i = 0; i < *n; i++)
        out[i] = t->sum[i];
    return FG_OK;
}

__global__ static void FG_BLOCK_BOUNDS convert_values(void *dst, int32_t dst_dtype, const void *src, int32_t src_dtype,
                                                      size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        if (src_dtype == FG_DTYPE_F32)
            fg_gpu_store((unsigned char *)dst + 2 * i, dst_dtype, 0, ((const float *)src)[i]); /* 16-bit */
        else
            ((float *)dst)[i] = fg_gpu_half_to_float(src_dtype, ((const uint16_t *)src)[i]);
    }
}

static fg_status gpu_convert(fg_backend *be, void *dst, fg_dtype dst_dtype, const void *src, fg_dtype src_dtype,
                             size_t n) {
    fg_gpu_state *st = (fg_gpu_state *)be->impl;
    if (n == 0)
        return FG_OK;
    const size_t blocks = (n + FG_THREADS - 1) / FG_THREADS, cap = (size_t)st->n_sm * 8;
    FG_LAUNCH(convert_values, (unsigned)(blocks < cap ? blocks : cap), FG_THREADS, 0, st->stream, dst,
              (int32_t)dst_dtype, src, (int32_t)src_dtype, n);
    GPU_CHECK(be, cudaGetLastError());
    return FG_OK;
}

static fg_status gpu_device_info(fg_backend *be, fg_device_info *info) {
    int dev = 0;
    cudaDeviceProp prop;
    memset(&prop, 0, sizeof prop);
    GPU_CHECK(be, cudaGetDevice(&dev));
    GPU_CHECK(be, cudaGetDeviceProperties(&prop, dev));
    memset(info, 0, sizeof *info);
    for (size_t i = 0; i + 1 < sizeof info->name && prop.name[i]; i++)
        info->name[i] = prop.name[i];
    info->n_sm = prop.multiProcessorCount;
    info->l2_bytes = (size_t)prop.l2CacheSize;
    info->mem_bytes = (size_t)prop.totalGlobalMem;
    info->stream = (void *)((fg_gpu_state *)be->impl)->stream;
#ifdef __HIP_CPU_RT__
    info->emulated = 1;
#endif
    return FG_OK;
}

/* Every thread reads 16-byte words strided by the grid and keeps a sum, so
 * that the reads cannot be dropped; the copy moves 16-byte words. */
__global__ static void FG_BLOCK_BOUNDS read_words(const uint4 *src, size_t n, uint32_t *sink) {
    uint32_t acc = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const uint4 w = src[i];
        acc ^= w.x ^ w.y ^ w.z ^ w.w;
    }
    if (acc == 0x9e3779b9u) /* practically never: keeps the loads */
        sink[0] = acc;
}

__global__ static void FG_BLOCK_BOUNDS copy_words(uint4 *dst, const uint4 *src, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = src[i];
}

static fg_status gpu_bandwidth(fg_backend *be, int copy, size_t bytes, int reps, double *bytes_per_s) {
    fg_gpu_state *st = (fg_gpu_state *)be->impl;
    const size_t n = bytes / 16;
    *bytes_per_s = 0.0;
    if (st->probe_bytes < n * 16) { /* kept between calls: no allocation between the timed runs */
        for (int i = 0; i < 2; i++) {
            cudaFree(st->probe[i]);
            st->probe[i] = NULL;
        }
        st->probe_bytes = 0;
        fg_status s = gpu_malloc(be, n * 16, &st->probe[0]);
        if (!s)
            s = gpu_malloc(be, n * 16, &st->probe[1]);
        if (s)
            return s;
        st->probe_bytes = n * 16;
        GPU_CHECK(be, cudaMemsetAsync(st->probe[0], 1, n * 16, st->stream));
    }
    const unsigned blocks = (unsigned)(st->n_sm * 8);
    double best = 0.0;
    for (int r = 0; r < reps + 1; r++) { /* the first run warms up */
        double sec = 0.0;
        fg_status s = gpu_timer(be, 0, &sec);
        if (s)
            return s;
        if (copy)
            FG_LAUNCH(copy_words, blocks, FG_THREADS, 0, st->stream, (uint4 *)st->probe[1],
                      (const uint4 *)st->probe[0], n);
        else
            FG_LAUNCH(read_words, blocks, FG_THREADS, 0, st->stream, (const uint4 *)st->probe[0], n,
                      (uint32_t *)st->probe[1]);
        GPU_CHECK(be, cudaGetLastError());
        if ((s = gpu_timer(be, 1, &sec)))
            return s;
        const double rate = (copy ? 2.0 : 1.0) * (double)(n * 16) / sec;
        if (r > 0 && sec > 0.0 && rate > best)
            best = rate;
    }
    *bytes_per_s = best;
    return FG_OK;
}

/* Host <-> device copies in the queue's order (after what the stream holds,
 * e.g. a conversion of the activations; an engine's stream may be one that
 * does not wait for the legacy default stream), then waited for. */
static fg_status gpu_write(fg_backend *be, void *dst, const void *src, size_t bytes) {
    fg_gpu_state *st = (fg_gpu_state *)be->impl;
    GPU_CHECK(be, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, st->stream));
    GPU_CHECK(be, cudaStreamSynchronize(st->stream));
    return FG_OK;
}

static fg_status gpu_read(fg_backend *be, void *dst, const void *src, size_t bytes) {
    fg_gpu_state *st = (fg_gpu_state *)be->impl;
    GPU_CHECK(be, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, st->stream));
    GPU_CHECK(be, cudaStreamSynchronize(st->stream));
    return FG_OK;
}

static fg_status gpu_copy(fg_backend *be, void *dst, const void *src, size_t bytes) {
    fg_gpu_state *st = (fg_gpu_state *)be->impl;
    GPU_CHECK(be, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, st->stream));
    return FG_OK;
}

static fg_status gpu_copy2d(fg_backend *be, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                            size_t rows) {
    fg_gpu_state *st = (fg_gpu_state *)be->impl;
    if (width && rows)
        GPU_CHECK(be, cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows, cudaMemcpyDeviceToDevice, st->stream));
    return FG_OK;
}

/* Gathers pos/flags/score of n slots (pages[] are device addresses). */
__global__ static void FG_BLOCK_BOUNDS gather_slots(fg_gpu_layout L, void *const *pages, int32_t n, int32_t *pos,
                                                    uint8_t *flags, float *score) {
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
    return FG_GPU(synchronize)(be);
}

static void gpu_destroy(fg_backend *be) {
    fg_gpu_state *st = (fg_gpu_state *)be->impl;
    if (!st)
        return;
    if (st->own_stream)
        cudaStreamSynchronize(st->own_stream);
    if (st->stream && st->stream != st->own_stream)
        cudaStreamSynchronize(st->stream);
    if (st->scratch)
        cudaFree(st->scratch);
    for (int i = 0; i < FG_GPU_STAGES; i++) {
        if (st->stage[i].host)
            cudaFreeHost(st->stage[i].host);
        if (st->stage[i].done)
            cudaEventDestroy(st->stage[i].done);
    }
    for (int i = 0; i < 2; i++)
        if (st->timer[i])
            cudaEventDestroy(st->timer[i]);
    for (int i = 0; i <= FG_GPU_MARKS; i++)
        if (st->timing.ev[i])
            cudaEventDestroy(st->timing.ev[i]);
    for (int i = 0; i < 2; i++)
        if (st->probe[i])
            cudaFree(st->probe[i]);
    if (st->d_error)
        cudaFree(st->d_error);
    if (st->h_error)
        cudaFreeHost(st->h_error);
    if (st->own_stream && !st->shared_stream)
        cudaStreamDestroy(st->own_stream);
    free(st);
}

/* The benchmark extras, by name (fg_get_proc_fn). */
static fg_backend_proc gpu_get_proc(const char *name) {
    if (!strcmp(name, "timer"))
        return (fg_backend_proc)gpu_timer;
    if (!strcmp(name, "device_info"))
        return (fg_backend_proc)gpu_device_info;
    if (!strcmp(name, "bandwidth"))
        return (fg_backend_proc)gpu_bandwidth;
    if (!strcmp(name, "kernel_times"))
        return (fg_backend_proc)gpu_kernel_times;
    return NULL;
}

/* The table, each slot set by its name; constexpr, so the table is a
 * constant like the host backends' and no initialisation order matters. */
static constexpr fg_backend_ops gpu_ops_table() {
    fg_backend_ops o = {};
    o.name = FG_GPU_NAME;
    o.kv_apart = 0; /* one dtype for K and V: the kernels are instantiated per dtype */
    o.device_tables = 1; /* decode_step reads each head's page tables where the core keeps them */
    o.buffer_alloc = gpu_malloc;
    o.buffer_free = gpu_free;
    o.buffer_write = gpu_write;
    o.buffer_read = gpu_read;
    o.buffer_copy = gpu_copy;
    o.buffer_copy2d = gpu_copy2d;
    o.prefill_attention = FG_GPU(prefill_attention);
    o.profile_stats = FG_GPU(profile_stats);
    o.compact = FG_GPU(compact);
    o.decode_step = FG_GPU(decode_step);
    o.read_slots = FG_GPU(read_slots);
    o.adaptive_observe = FG_GPU(adaptive_observe);
    o.adaptive_errors = FG_GPU(adaptive_errors);
    o.synchronize = FG_GPU(synchronize);
    o.convert = gpu_convert;
    o.set_stream = gpu_set_stream;
    o.get_proc = gpu_get_proc;
    o.destroy = gpu_destroy;
    return o;
}
static constexpr fg_backend_ops k_gpu_ops = gpu_ops_table();

/* Creates what the state owns (a stream, events, device and pinned words:
 * all allocations); a failure leaves it for gpu_destroy. */
static cudaError_t gpu_state_init(fg_gpu_state *st) {
    cudaError_t e;
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
    st->own_stream = shared;
    st->shared_stream = 1;
    e = shared_status;
#else
    e = cudaStreamCreate(&st->own_stream);
#endif
    st->stream = st->own_stream;
    for (int i = 0; i < FG_GPU_STAGES && e == cudaSuccess; i++)
        e = cudaEventCreate(&st->stage[i].done);
    for (int i = 0; i < 2 && e == cudaSuccess; i++)
        e = cudaEventCreate(&st->timer[i]);
    if (e == cudaSuccess)
        e = cudaMalloc((void **)&st->d_error, sizeof(int32_t));
    if (e == cudaSuccess)
        e = cudaMemset(st->d_error, 0, sizeof(int32_t));
    if (e == cudaSuccess)
        e = cudaMallocHost((void **)&st->h_error, sizeof(int32_t));
    if (e == cudaSuccess && (!st->d_error || !st->h_error))
        e = cudaErrorUnknown;
    if (e == cudaSuccess)
        *st->h_error = 0;
    int dev = 0;
    cudaDeviceProp prop;
    memset(&prop, 0, sizeof prop);
    if (e == cudaSuccess && cudaGetDevice(&dev) == cudaSuccess && cudaGetDeviceProperties(&prop, dev) == cudaSuccess)
        st->n_sm = prop.multiProcessorCount;
    if (st->n_sm <= 0)
        st->n_sm = 16;
    /* query heads per decode block: 4 by default (a block of 8 holds 213
     * registers a thread on sm_90 at f16, d = 128: one block per SM); 1, 2, 4 or 8 */
    const char *env = getenv("FASTGEN_GPU_DECODE_HEADS");
    const int heads = env ? atoi(env) : 4;
    st->decode_heads = heads == 1 || heads == 2 || heads == 8 ? heads : 4;
    /* the tensor-core decode kernel (decode_mma.cuh): on CUDA devices of compute capability 8.0 and later;
       FASTGEN_GPU_DECODE_MMA=0 turns it off, =1 on wherever it is compiled (HIP-CPU: emulated, for the tests) */
    const char *mma = getenv("FASTGEN_GPU_DECODE_MMA");
#if defined(FG_HIP) && !defined(__HIP_CPU_RT__)
    (void)mma;
    st->decode_mma = 0; /* real HIP: attend_chunks (MFMA / WMMA are not written) */
#elif defined(__HIP_CPU_RT__)
    st->decode_mma = mma && atoi(mma) == 1; /* emulated: slow, for the tests */
#else
    st->decode_mma = mma ? atoi(mma) == 1 : prop.major >= 8;
#endif
    return e;
}

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
    e = gpu_state_init(st);
    if (e != cudaSuccess) {
        gpu_destroy(be);
        be->impl = NULL;
        be->ops = NULL;
        return be->err(be->err_sink, FG_ERR_OUT_OF_MEMORY,
                       FG_GPU_NAME ": setting up the device (a stream, events, device and pinned memory) failed: %s",
                       cudaGetErrorString(e));
    }
    return FG_OK;
}
