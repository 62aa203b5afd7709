/*
 * The optimised CPU kernels (the context's thread pool + SIMD). The reference kernels in
 * kernels_ref/ are their oracle; the `cpu` backend (kernels_cpu/backend.c)
 * puts them in its table.
 */
#ifndef FG_KERNELS_CPU_H
#define FG_KERNELS_CPU_H

#include "backends/backend.h"
#include "backends/decode_policy.h" /* steps 3-4, fg_freq_scan, fg_prefetch_meta */

/* The ISA levels (AVX512_BF16: AVX-512 plus vdpbf16ps, which dots bf16
 * cache rows with the query rounded to bf16, twice the multiply-adds of an
 * f32 FMA) and the one probe every op asks. */
#include "common/cpu_features.h"

/* Steps 1-2 of one head in scalar code, for the shapes the vector kernels
 * do not take (a head dimension that is not a multiple of 8, groups of
 * more than FG_MAX_GROUP query heads, quantized rows with more than
 * FG_QSCALES blocks): returns the new token's pooled self-attention.
 * q_cached: [G][d] what the cached K rows are dotted with, the query scaled
 * by 1/sqrt(d) (rounded first for a quantized K, fg_query_q8_row). */
float fg_cpu_decode_attend_plain(const fg_page_layout *layout, const fg_shape *shape, const fg_decode_head *head,
                                 const float *q_cached);

/* The decode kernel's prefetch hint, chosen at run time (cpu_tuning.c).
 * Until this process has chosen, each backend times its decode steps (one
 * per layer) that read at least FG_PF_PROBE_BYTES of K and V on the vector
 * path: the first FG_PF_PROBE_SKIP untimed (the cache is still warm from
 * the prefill), then FG_PF_PROBE_STEPS with each hint in the order nta, t0,
 * t0, nta, ... (so a layer does not always get the same one). The hint
 * whose median time per byte is lower by at least 3 % is kept, else t0, and
 * is published for the whole process; FASTGEN_PF_LOCALITY=nta|t0 fixes it. */
typedef enum fg_pf_locality { FG_PF_NTA = 0, FG_PF_T0 = 3 } fg_pf_locality;
typedef struct fg_cpu_tuning {
    fg_pf_locality pf_locality; /* the hint of the decode kernel's software prefetches */
    char cpu[48];               /* "AuthenticAMD family 26 model 2" */
    const char *source;         /* why: measured, not yet, or the environment */
    int fixed;                  /* measured or set: no more probing */
} fg_cpu_tuning;
#define FG_PF_PROBE_BYTES ((size_t)256 << 10)
#define FG_PF_PROBE_SKIP 32
#define FG_PF_PROBE_STEPS 24
typedef struct fg_pf_probe {
    int32_t skipped;  /* large steps not timed yet */
    int32_t steps[2]; /* steps timed with nta, with t0 */
    double per_byte[2][FG_PF_PROBE_STEPS]; /* their seconds per byte */
} fg_pf_probe;
fg_cpu_tuning fg_cpu_tuning_detect(void);
/* The hint for a large decode step while t is not fixed: the probe's next
 * (or the process's choice, which t then takes); then that step's time. */
fg_pf_locality fg_cpu_pf_probe_step(fg_cpu_tuning *t, fg_pf_probe *p);
void fg_cpu_pf_probe_record(fg_cpu_tuning *t, fg_pf_probe *p, fg_pf_locality pf, double seconds, double bytes);
/* The probe's verdict: nta when its median seconds per byte are at most
 * 0.97 x t0's, else t0. Sorts p's times. */
fg_pf_locality fg_cpu_pf_choose(fg_pf_probe *p);
/* Tests only: forget the process's choice, as if nothing had measured it. */
void fg_cpu_pf_forget(void);

/* The adaptive mode's per-level sums of one observed row for the G heads
 * of a group (level_sums.inc), one per ISA, over keys sorted by level
 * (start: [n_levels + 2]; key: a permutation of 0 .. start[n_levels + 1] -
 * 1); head h's weights at p + h p_stride, its sums at
 * acc[h][n_levels + 1][d] and mass[h][n_levels + 1]; d a multiple of the
 * ISA's vector width (8 or 16). finite[j]: whether V row j is finite;
 * work: room for as many fg_level_key as the keys of the largest level;
 * pk: for 4 floats a key. */
typedef struct fg_level_key {
    int32_t j;
    float p[4]; /* the weights of the (up to) four heads summed at once */
} fg_level_key;
typedef void fg_level_sums_fn(const float *p, size_t p_stride, int32_t G, const float *v, const int32_t *key,
                              const int32_t *start, int32_t d, int32_t n_levels, const uint8_t *finite,
                              fg_level_key *work, float *pk, float *acc, float *mass);
/* Then the errors of every level from those sums (work: 5 n_levels doubles; d a multiple of 8). */
typedef void fg_level_errors_fn(const float *acc, const float *mass, int32_t n_levels, int32_t d, int mass_only,
                                double *work, double *err);
/* And a cached row into float (f32, f16, bf16; 0 for the other dtypes). */
typedef int fg_unpack_row_fn(const unsigned char *row, fg_dtype dtype, int32_t d, float *out);
fg_level_sums_fn fg_cpu_level_sums_generic;
fg_level_errors_fn fg_cpu_level_errors_generic;
fg_unpack_row_fn fg_cpu_unpack_row_generic;
#ifdef FG_X86
fg_level_sums_fn fg_cpu_level_sums_avx2, fg_cpu_level_sums_avx512;
fg_level_errors_fn fg_cpu_level_errors_avx2, fg_cpu_level_errors_avx512;
fg_unpack_row_fn fg_cpu_unpack_row_avx2, fg_cpu_unpack_row_avx512;
#endif
fg_adaptive_observe_fn fg_cpu_adaptive_observe;
fg_adaptive_errors_fn fg_cpu_adaptive_errors;

/* Threads a cpu kernel uses: the size of the backend's pool (1 without one). */
int fg_cpu_threads(const fg_backend *be);

/* State of the `cpu` backend (be->impl). */
typedef struct fg_cpu_state {
    fg_cpu_isa isa;
    fg_cpu_tuning tuning;
    fg_pf_probe probe; /* the prefetch hint's measurement, until tuning.fixed */
    void *ws;        /* decode workspace, grown on demand, 64-byte aligned */
    size_t ws_bytes;
} fg_cpu_state;

#define FG_CPU_CHUNK 512 /* slots per decode work item */
#define FG_CPU_BLOCK 16  /* rows a decode work item scores at once: one rescale, one V pass */
#define FG_QSCALES 32    /* quantized rows: the most blocks a row may have for the vector kernels */
/* kept rows of all the step's KV heads x query heads per KV head below which
 * a decode step runs on the calling thread, where waking the pool would cost
 * more than it saves (docs/results.md: the pool's threshold) */
#define FG_CPU_PAR_ROWS 2048
#define FG_MAX_GROUP 64  /* query heads per KV head on the SIMD path */
/* compactions that write at least this many K/V bytes bypass the caches
 * (non-temporal stores); smaller ones leave their pages cached for decode */
#define FG_CPU_STREAM_BYTES ((size_t)4 << 20)

/* Asks for the row ids of meta page `index` (slots from index *
 * page_tokens), unless it starts at or past slot `end`: the attention reads
 * them before the rows they name, so they come FG_META_AHEAD pages ahead. */
static inline void fg_prefetch_row_ids(const fg_page_layout *L, void *const *meta, int32_t end, int32_t index) {
    if ((int64_t)index * L->page_tokens >= end)
        return;
    const unsigned char *ids = (const unsigned char *)meta[index] + L->row_offset;
    const size_t last = (size_t)L->page_tokens * sizeof(int32_t) - 1;
    for (size_t off = 0; off < last; off += 64)
        __builtin_prefetch(ids + off, 0, 3);
    __builtin_prefetch(ids + last, 0, 3);
}

/* One decode work item: G query heads over slots [begin, end) of a head. */
typedef struct fg_attend_chunk {
    const fg_page_layout *layout;
    void *const *pages, *const *meta; /* row and meta pages */
    int32_t begin, end;
    int32_t G, d;
    const float *q;    /* [G][d] already scaled by 1/sqrt(d); rounded first for a quantized K (fg_query_q8_row);
                          NULL when qi is set */
    /* a quantized K, d % 32 == 0, AVX2: the rounded query in integers (kernels_cpu/decode_step.c's
       query_q8_ints), or NULL */
    const int8_t *qi;   /* [G][d] */
    const float *qd;    /* [G][d / 32][8] each block's scale times 1/sqrt(d) */
    const int32_t *qc;  /* [G][d / 32][8] q4_0's offsets */
    const uint16_t *qb; /* [G][d] the unscaled query rounded to bf16 (the bf16-dot kernel's), or NULL */
    float scale;        /* 1/sqrt(d), applied to the bf16 dots */
    float *m, *l;      /* [G] partial max and sum */
    float *acc;        /* [G][d] partial output (unnormalised) */
    float *raw;        /* raw[h * raw_stride + (s - begin)] = e^(score - m[h]) of slot s, or NULL */
    size_t raw_stride;
    float *kbuf, *vbuf; /* [FG_CPU_BLOCK][d] each: the thread's scratch for converted rows */
    /* K and V in two dtypes (the mixed kernel): each one's row as fp32 */
    void (*widen_k)(const unsigned char *row, float *dst, int32_t d);
    void (*widen_v)(const unsigned char *row, float *dst, int32_t d);
    int32_t head;       /* the decode head it belongs to */
    int pf_t0;          /* prefetch into every cache level (else non-temporally): the CPU's tuning */
    fg_freq_scan scan;  /* its slots' frequent-candidate scan (heads that track scores) */
} fg_attend_chunk;

typedef void fg_attend_chunk_fn(const fg_attend_chunk *a);
typedef void fg_widen_row_fn(const unsigned char *row, float *dst, int32_t d);

fg_decode_step_fn fg_cpu_decode_step;
fg_prefill_attention_fn fg_cpu_prefill_attention;
fg_profile_stats_fn fg_cpu_profile_stats;
fg_compact_fn fg_cpu_compact;

#endif /* FG_KERNELS_CPU_H */
