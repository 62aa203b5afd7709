/*
 * The backend vtable: what core/ asks of a device. Each op has one typedef,
 * used both in the table and in every implementation's prototype, so the
 * signatures cannot drift. core/ never touches device memory directly: pages
 * are opaque backend addresses that only ops and buffer functions read.
 */
#ifndef FG_BACKEND_H
#define FG_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "common/layout.h"
#include "fastgen.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fg_backend fg_backend;

/* Attention shape shared by all ops. */
typedef struct fg_shape {
    int32_t n_q_heads;  /* Hq */
    int32_t n_kv_heads; /* Hkv */
    int32_t head_dim;   /* d */
} fg_shape;

/* ---- prefill_attention: causal softmax attention over a prompt, with the
 * per-row max and normaliser that profile_stats reuses (pass 1 of §2.3).
 * Rows [row_begin, n) are computed, each over keys 0..i (row_begin > 0: a
 * chunk of a chunked prefill); q, out and the statistics hold those rows
 * only, m = n - row_begin of them. */
typedef fg_status fg_prefill_attention_fn(fg_backend *be, const fg_shape *shape, int32_t n, int32_t row_begin,
                                          const float *q,  /* [m][Hq][d] */
                                          const float *k,  /* [n][Hkv][d] */
                                          const float *v,  /* [n][Hkv][d] */
                                          float *out,      /* [m][Hq][d] */
                                          float *row_max,  /* [Hq][m] */
                                          float *row_sum); /* [Hq][m] */

/* ---- profile_stats: pass 2 of §2.3. Pooled attention A (mean over the
 * group) of rows i in [row_begin, n):
 *   col[g][j]         = sum_i A[i][j]
 *   col_local[w][g][j] = sum over the rows i whose window holds j of A[i][j]:
 *                        pos(i) - pos(j) < window[w]
 * Row i is key i (causal: i sees keys 0..i). pos(j) = key_pos[j], or j when
 * key_pos is NULL (a prompt); key_pos (a head's kept rows followed by new
 * ones, re-profiled on append) is a host array, strictly increasing. */
typedef struct fg_profile_request {
    int32_t n;                        /* keys (the prompt's length) */
    int32_t row_begin;                /* first profiled row (observation window) */
    int32_t n_windows;                /* distinct local windows, 0..FG_MAX_SHORTLIST */
    int32_t window[FG_MAX_SHORTLIST]; /* w(n) of each */
    const int32_t *key_pos;           /* [n] or NULL */
} fg_profile_request;

typedef fg_status fg_profile_stats_fn(fg_backend *be, const fg_shape *shape, const fg_profile_request *req,
                                      const float *q,       /* [n][Hq][d] */
                                      const float *k,       /* [n][Hkv][d] */
                                      const float *row_max, /* [Hq][n] */
                                      const float *row_sum, /* [Hq][n] */
                                      float *col,           /* [Hkv][n] */
                                      float *col_local);    /* [n_windows][Hkv][n] */

/* ---- compact: gather the kept prompt rows of each head into its pages. */
typedef struct fg_compact_head {
    int32_t kv_head;
    int32_t n_keep;
    const int32_t *pos;   /* [n_keep] prompt positions, ascending */
    const uint8_t *flags; /* [n_keep] FG_SLOT_* */
    const float *score;   /* [n_keep] initial cumulative score */
    void *const *pages;   /* [ceil(n_keep / page_tokens)] row pages: slot s in row s */
    void *const *meta;    /* [ceil(n_keep / page_tokens)] meta pages */
    const int32_t *src;   /* [n_keep] rows of k / v they come from, ascending; NULL: pos */
} fg_compact_head;

typedef fg_status fg_compact_fn(fg_backend *be, const fg_page_layout *layout, const fg_shape *shape, int32_t n,
                                const float *k, /* [n][Hkv][d] */
                                const float *v, /* [n][Hkv][d] */
                                int32_t n_heads, const fg_compact_head *heads);

/* ---- decode_step: §2.5 steps 1-4 for one (sequence, KV head). The host has
 * computed everything that does not depend on attention values. */
typedef struct fg_decode_head {
    void *const *pages;    /* row pages: every row a slot or the free list names, and a fresh one */
    void *const *meta;     /* meta pages: slots [0, n_slots + 1) and the free list */
    int32_t n_pages;       /* entries of each table */
    int32_t priv_from;     /* rows below it are shared: the step writes none (common/slots.h) */
    int32_t row_base;      /* >= 0: first reset the rows' counters (fg_rows_reset) */
    int32_t n_slots;       /* rows before the step */
    int32_t n_slots_after; /* rows after the step (host mirror; checked) */
    uint32_t components;   /* policy of the head */
    fg_score_mode score_mode;
    int32_t pos;           /* position p of the new token; t = p + 1 */
    uint8_t insert_flag;   /* FG_SLOT_* the new row is cached with; 0 = not cached */
    int32_t window_start;  /* t - w(t): LOCAL rows below it leave the window */
    int32_t freq_budget;   /* k(t) */
    const float *q;        /* [G][d] */
    const float *k;        /* [d] */
    const float *v;        /* [d] */
    float *out;            /* [G][d] */
    /* A backend that keeps page tables in its own memory (ops->device_tables)
     * reads the head's from `tab`: row pages at [0, tab_cap), meta pages at
     * [tab_cap, 2 tab_cap), backend addresses. Entries [0, tab_valid) hold
     * pages[] and meta[] already; the step writes [tab_valid, n_pages)
     * before its kernels read them, so a step uploads only what changed (a
     * page added, a copied or restored meta page). tab NULL: the backend
     * builds the tables from pages[] and meta[] (and copies them) itself.
     * Host backends read pages[] and meta[] only. */
    void **tab;
    int32_t tab_cap, tab_valid;
    /* share_n > 1 (FG_ALLOC_LAYER): heads [share_first, share_first +
     * share_n) of the call, this one among them, hold the same positions
     * slot for slot with the same policy; after step 2 each slot's score,
     * and the new token's, becomes the mean of the group's (summed in head
     * order, then divided by share_n), so steps 3-4 drop the same rows from
     * every one of them. 0 or 1: the head ranks by its own scores. */
    int32_t share_first, share_n;
} fg_decode_head;

/* -1 when every group of heads that rank together is whole within the call
 * (its first head opens it and the next share_n - 1 name it, all with the
 * first's slot count), else the first head that breaks that. */
static inline int32_t fg_decode_groups_check(const fg_decode_head *heads, int32_t n_heads) {
    for (int32_t i = 0; i < n_heads;) {
        const int32_t m = heads[i].share_n;
        if (m <= 1) {
            i++;
            continue;
        }
        if (heads[i].share_first != i || i + m > n_heads)
            return i;
        for (int32_t x = 1; x < m; x++)
            if (heads[i + x].share_first != i || heads[i + x].share_n != m || heads[i + x].n_slots != heads[i].n_slots)
                return i + x;
        i += m;
    }
    return -1;
}

typedef fg_status fg_decode_step_fn(fg_backend *be, const fg_page_layout *layout, const fg_shape *shape,
                                    int32_t n_heads, const fg_decode_head *heads);

/* ---- read_slots: copy slot metadata of one head (its meta pages) to the host (synchronising). */
typedef fg_status fg_read_slots_fn(fg_backend *be, const fg_page_layout *layout, void *const *meta, int32_t n_slots,
                                   int32_t *pos,     /* [n_slots] */
                                   uint8_t *flags,   /* [n_slots] or NULL */
                                   float *score);    /* [n_slots] or NULL */

/* ---- adaptive_observe, adaptive_errors: the adaptive mode's decision for
 * one unit, a (sequence, layer, KV head) whose slots 0..t-1 hold positions
 * 0..t-1 (its full cache), run where the cache lies (core/adaptive.c has
 * the method). Only the queries and entry levels go down and the column
 * sums and errors come back: no backend reads a cache back to decide.
 * scratch is backend memory (buffer_alloc) of fg_observe_scratch_floats
 * floats; observe fills it, errors reads it. Host arrays otherwise. */
typedef struct fg_observe_unit {
    void *const *pages;     /* the head's row pages */
    void *const *meta;      /* its meta pages: slot s's K/V row */
    int32_t n_pages;
    int32_t t;              /* keys: slot j holds position j */
    int32_t n_rows;         /* W observed rows */
    const int32_t *row_pos; /* [W] their positions, ascending, < t */
    float *scratch;         /* backend memory: K, V [t][d] (float), p [G][W][t] */
} fg_observe_unit;

/* Floats of a unit's scratch. */
static inline size_t fg_observe_scratch_floats(int32_t t, int32_t W, int32_t G, int32_t d) {
    return (size_t)t * (2 * (size_t)d + (size_t)G * W);
}

/* Attention below this moves no predicted error measurably: observe stores
 * it as 0 (but a row's own key), so errors skips it. */
#define FG_OBSERVE_NEGLIGIBLE 1e-6f

/* Pass 1: the unit's K and V unpacked to float, and each observed row's
 * attention p[h][i][j] (query head h of the group, row i at position p_i)
 * over keys j <= p_i, 0 after it and where negligible. Column sums of the
 * raw attention, over every row and head / G: col_all[j]; over the rows at
 * or after position decode_from only: col_decode[j]. Summed in the order
 * h, then i: every backend's sums are the same floats where the p are.
 * n_rows = 0: the unpack only (compact then reads K and V from the
 * scratch), q and the sums unused. */
typedef fg_status fg_adaptive_observe_fn(fg_backend *be, const fg_page_layout *layout, const fg_shape *shape,
                                         const fg_observe_unit *u,
                                         const float *q,     /* host [W][G][d] */
                                         int32_t decode_from,
                                         float *col_all,     /* host [t] */
                                         float *col_decode); /* host [t] */

/* Pass 2: for n_sets key sets per row, nested by level (entry[s][i][j] = the
 * first of n_levels levels whose set holds key j for row i; n_levels: none),
 * the error each level would give row i, summed over the group's heads:
 *   err[i][s][l] = sum_h || sum_{j: entry <= l} p v_j / sum_{j: entry <= l} p - o ||^2
 *   o = sum_j p v_j / sum_j p   (the unit's output over every key not negligible)
 * (a level that keeps no attention outputs 0: its error is || o ||^2)
 * or, with mass set, sum_h (1 - sum_{j: entry <= l} p): the attention a
 * level misses. Sums over keys in float (ref: double), the rest in double. */
typedef fg_status fg_adaptive_errors_fn(fg_backend *be, const fg_shape *shape, const fg_observe_unit *u,
                                        int32_t n_sets, int32_t n_levels,
                                        const uint8_t *entry, /* host [n_sets][W][t] */
                                        int mass,
                                        double *err);         /* host [W][n_sets][n_levels] */

/* ---- buffers: device memory for pages. write/read copy between host and
 * backend memory (NULL in a backend whose memory is host memory). */
typedef fg_status fg_buffer_alloc_fn(fg_backend *be, size_t bytes, void **out);
typedef void fg_buffer_free_fn(fg_backend *be, void *ptr);
typedef fg_status fg_buffer_write_fn(fg_backend *be, void *dst, const void *src, size_t bytes);
typedef fg_status fg_buffer_read_fn(fg_backend *be, void *dst, const void *src, size_t bytes);
typedef fg_status fg_buffer_copy_fn(fg_backend *be, void *dst, const void *src, size_t bytes); /* within the backend */
/* `rows` rows of `width` bytes, from src every spitch bytes to dst every
 * dpitch bytes, within the backend (queued, as buffer_copy). */
typedef fg_status fg_buffer_copy2d_fn(fg_backend *be, void *dst, size_t dpitch, const void *src, size_t spitch,
                                      size_t width, size_t rows);

/* ---- optional, for backends with their own memory and queue (GPUs) */
typedef fg_status fg_synchronize_fn(fg_backend *be); /* waits for the queue; reports a failure it found */
/* n device values from src_dtype to dst_dtype (f32 and f16 / bf16 either
 * way, rounding to nearest even), queued: activations in a context's
 * act_dtype with FG_IO_DEVICE. */
typedef fg_status fg_convert_fn(fg_backend *be, void *dst, fg_dtype dst_dtype, const void *src, fg_dtype src_dtype,
                                size_t n);
typedef fg_status fg_set_stream_fn(fg_backend *be, void *stream); /* the engine's stream; NULL = the backend's */
/* Device-event timing on the queue: stop = 0 marks the start; stop = 1 marks
 * the end, waits for it and gives the seconds between the two. */
typedef fg_status fg_timer_fn(fg_backend *be, int stop, double *seconds);

typedef struct fg_device_info {
    char name[96];
    int32_t n_sm;      /* multiprocessors / compute units */
    size_t l2_bytes;   /* last-level cache of the device */
    size_t mem_bytes;
    int emulated;      /* HIP-CPU: figures are the host's */
    void *stream;      /* the stream the backend queues on now */
} fg_device_info;
typedef fg_status fg_device_info_fn(fg_backend *be, fg_device_info *info);
/* Read (copy = 0: every byte of a buffer read once, a sum written) or copy
 * (copy = 1: read + write) bandwidth of `bytes` device bytes, the best of
 * reps runs timed by device events, in bytes moved per second. */
typedef fg_status fg_bandwidth_fn(fg_backend *be, int copy, size_t bytes, int reps, double *bytes_per_s);

/* Device time per kernel: on = 1 clears the sums and times every kernel and
 * copy of the ops that follow (each op then waits for its own work, so time
 * them apart from a throughput run); on = 0 stops. Either way `out` gets up
 * to `cap` sums (name, seconds, calls; "host" is the host's time in an op up
 * to its first queued work: its bookkeeping) and *n their count. */
typedef struct fg_kernel_time {
    const char *name;
    double seconds;
    int64_t calls;
} fg_kernel_time;
typedef fg_status fg_kernel_times_fn(fg_backend *be, int on, fg_kernel_time *out, int32_t cap, int32_t *n);

/* Entry points outside the op table, for the benchmarks and tests: a GPU
 * backend's "timer" (fg_timer_fn), "device_info" (fg_device_info_fn),
 * "bandwidth" (fg_bandwidth_fn) and "kernel_times" (fg_kernel_times_fn),
 * looked up by name as ggml looks up a backend's extras. NULL when the
 * backend has none of that name. */
typedef void (*fg_backend_proc)(void);
typedef fg_backend_proc fg_get_proc_fn(const char *name);

/* A backend's table, by role: what it is, its memory, its kernels (one per
 * typedef above), its queue, its lifetime. Each backend's table lives with
 * its kernels (kernels_ref/backend.c, kernels_cpu/backend.c,
 * kernels_cuda/backend.cu). What a NULL slot means (fg_backend_open checks
 * the table, docs/backends.md has the recipe for a new op):
 *   buffer_alloc, buffer_free, prefill_attention, profile_stats, compact,
 *     decode_step: required; a table without one is refused
 *   read_slots: a backend whose memory is host memory (no buffer_read) gets
 *     the plain copy (fg_backend_read_slots); one with its own must fill it
 *   adaptive_observe, adaptive_errors: both or neither; without them the
 *     adaptive mode is refused on that backend (fg_backend_supports)
 *   the copies: memcpy; the queue's slots: the features they name refused. */
typedef struct fg_backend_ops {
    const char *name;
    int kv_apart; /* its kernels read K and V stored in two dtypes (layout k_dtype != v_dtype) */
    int device_tables; /* decode_step reads each head's page tables from its own memory (fg_decode_head.tab),
                          which the core keeps per head and updates where they change */

    /* memory: pages and the copies between them and the host */
    fg_buffer_alloc_fn *buffer_alloc;
    fg_buffer_free_fn *buffer_free;
    fg_buffer_write_fn *buffer_write;   /* optional (memcpy): host -> backend */
    fg_buffer_read_fn *buffer_read;     /* optional (memcpy): backend -> host */
    fg_buffer_copy_fn *buffer_copy;     /* optional (memcpy): within the backend (copy-on-write of shared pages) */
    fg_buffer_copy2d_fn *buffer_copy2d; /* optional (a memcpy per row) */

    /* kernels */
    fg_prefill_attention_fn *prefill_attention;
    fg_profile_stats_fn *profile_stats;
    fg_compact_fn *compact;
    fg_decode_step_fn *decode_step;
    fg_read_slots_fn *read_slots;
    fg_adaptive_observe_fn *adaptive_observe;
    fg_adaptive_errors_fn *adaptive_errors;

    /* queue: optional, NULL in the host backends */
    fg_synchronize_fn *synchronize;
    fg_convert_fn *convert; /* optional: FG_IO_DEVICE with act_dtype f16 / bf16 needs it */
    fg_set_stream_fn *set_stream;
    fg_get_proc_fn *get_proc; /* the backend's extras by name (fg_backend_get_proc) */

    void (*destroy)(fg_backend *be); /* releases the backend object (NULL: nothing to release) */
} fg_backend_ops;

/* The error sink a backend writes its messages to (the context). */
typedef fg_status fg_error_fn(void *sink, fg_status status, const char *fmt, ...);

struct fg_backend {
    const fg_backend_ops *ops;
    fg_threadpool *threads; /* where the host loops run (NULL: serially); not owned */
    int32_t device_io;   /* activations (q, k, v, out and the row statistics) are backend addresses */
    void *impl;          /* backend private state */
    void *err_sink;      /* passed to err */
    fg_error_fn *err;
};

/* Backend constructors: fill *be or return FG_ERR_UNAVAILABLE with a message
 * through err(err_sink, ...). Each lives with its backend. */
typedef fg_status fg_backend_init_fn(fg_backend *be);
fg_backend_init_fn fg_backend_ref_init;
fg_backend_init_fn fg_backend_cpu_init;
fg_backend_init_fn fg_backend_cuda_init;
fg_backend_init_fn fg_backend_hip_init;

/* An error sink that prints the message to stderr: for the backend objects
 * that tests and benchmarks open themselves (sink unused). */
fg_error_fn fg_error_to_stderr;

/* Registry (backends/registry.c). */
/* Opens a backend by name and checks its table (fg_backend_table_check). */
fg_status fg_backend_open(const char *name, fg_threadpool *threads, fg_backend *be);
/* NULL when a table holds every slot it must, else what it lacks. */
const char *fg_backend_table_check(const fg_backend_ops *ops);

/* What a backend can do beyond the required kernels, as its table says. */
typedef enum fg_backend_feature {
    FG_FEATURE_ADAPTIVE,  /* adaptive_observe and adaptive_errors: the adaptive mode (FG_ALLOC_ADAPTIVE) */
    FG_FEATURE_KV_APART,  /* K and V cached in two dtypes */
    FG_FEATURE_DEVICE_IO, /* memory and a queue of its own: activations at device addresses (FG_IO_DEVICE) */
    FG_FEATURE_STREAMS,   /* the engine's stream (set_stream) */
    FG_FEATURE_CONVERT,   /* device activations in f16 / bf16 (convert) */
} fg_backend_feature;
int fg_backend_supports(const fg_backend *be, fg_backend_feature feature);
/* read_slots, or the plain copy where the backend's memory is host memory. */
fg_status fg_backend_read_slots(fg_backend *be, const fg_page_layout *layout, void *const *meta, int32_t n_slots,
                                int32_t *pos, uint8_t *flags, float *score);
void fg_backend_close(fg_backend *be);
/* The extra `name` of a backend (see fg_get_proc_fn), NULL when none. */
fg_backend_proc fg_backend_get_proc(const fg_backend *be, const char *name);
/* Host <-> backend copies (memcpy for host-memory backends). */
fg_status fg_backend_write(fg_backend *be, void *dst, const void *src, size_t bytes);
fg_status fg_backend_read(fg_backend *be, void *dst, const void *src, size_t bytes);
fg_status fg_backend_copy(fg_backend *be, void *dst, const void *src, size_t bytes);
fg_status fg_backend_copy2d(fg_backend *be, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                            size_t rows);

#ifdef __cplusplus
}
#endif

#endif /* FG_BACKEND_H */
