/*
 * The `cpu` decode step (docs/design.md §2.5), built for memory bandwidth:
 *   1. work items are (head, chunk of FG_CPU_CHUNK slots): heads keep from 3
 *      to 30k rows, so long heads are split and threads stay balanced. Each
 *      item reads its K and V rows once for all G query heads of the group
 *      and leaves a partial softmax state (max, sum, output) per query head,
 *      plus the raw scores when the head tracks frequent scores;
 *   2. per head: the partial states and the new token merge into the output;
 *      a head that does not track scores then inserts and evicts
 *      (backends/decode_policy.c, the policy step ref calls too);
 *   3. per item of a head that tracks scores: its slots' scores grow by the
 *      pooled attention (from the raw scores, not a second pass over K) and
 *      are scanned for the lowest-ranked frequent candidate in the same
 *      vectorised pass (score_scan.h, each ISA's in its decode_<isa>.c);
 *   4. per head that tracks scores: insertion and eviction by the same
 *      policy step, from the merged scans.
 * The step is two jobs on the thread pool (decode_job below): step 2 of a
 * head runs on the thread that finishes its last item, step 4 on the thread
 * that finishes its last step-3 item. Steps 2-4 write only the head's own
 * pages (the core made them private before the step), so they may run while
 * other heads' items read.
 * Chunking does not depend on the thread count, so results do not either.
 * The workspace lives in the backend and only grows: a step in steady state
 * allocates nothing.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "kernels_cpu/attend_chunk.h"
#include "kernels_cpu/score_scan.h"
#include "kernels_cpu/kernels_cpu.h"
#include "common/clock.h"
#include "common/rules.h"
#include "common/slots.h"

/* ------------------------------------------------------------------ dispatch */

/* The ISA a step runs on: the CPU's, or a narrower one whose lanes divide
 * the head dimension (d = 8, 24, 40, ... on an AVX-512 CPU: AVX2's 8 lanes). -1: no
 * vector kernel takes d (not a multiple of 8), the plain step does. */
static int step_isa(fg_cpu_isa isa, int32_t d) {
    if (d % 8)
        return -1;
    if (isa >= FG_ISA_AVX512 && d % 16)
        return FG_ISA_AVX2;
    return (int)isa;
}

/* Whether the step dots bf16 rows with vdpbf16ps (the query rounded to
 * bf16): groups of 8 query heads, where the dots are compute-bound
 * (bench_decode --bf16 on Zen 5, FMA time / vdpbf16ps time over the full
 * cases at >= 4k, median of 12: 1.07 at G = 8, 0.91 at G = 4). Larger
 * groups widen a block into scratch once and dot it with FMAs. */
static int bf16_dots(fg_cpu_isa isa, fg_dtype dtype, int32_t d, int32_t G) {
    return isa == FG_ISA_AVX512_BF16 && dtype == FG_DTYPE_BF16 && d % 32 == 0 && G == 8;
}

/* Whether the step dots quantized K rows with the rounded query in integers
 * (AVX2's kernel, on AVX-512 CPUs too: vpmaddubsw does 32 products a
 * vector, where widening a row costs more than its FMAs): K and V in one
 * quantized dtype, blocks of 32, groups of up to 8 (larger ones widen each
 * block once into scratch). */
static int int_dots(fg_cpu_isa isa, const fg_page_layout *L, int32_t d, int32_t G) {
    return isa >= FG_ISA_AVX2 && L->k_dtype == L->v_dtype && fg_dtype_quantized(L->k_dtype) && d % 32 == 0 &&
           G <= 8;
}

/* The attention kernel for the layout's dtypes on this ISA; K and V in two
 * dtypes take the mixed kernel and the two widen functions. */
static fg_attend_chunk_fn *isa_kernel(fg_cpu_isa isa, const fg_page_layout *L, int32_t d, int32_t G,
                                      fg_widen_row_fn **widen_k, fg_widen_row_fn **widen_v) {
    const fg_dtype kt = L->k_dtype, vt = L->v_dtype;
#define WIDEN(t, isan)                                                                                                 \
    ((t) == FG_DTYPE_F16    ? fg_cpu_widen_f16_##isan                                                                  \
     : (t) == FG_DTYPE_BF16 ? fg_cpu_widen_bf16_##isan                                                                 \
     : (t) == FG_DTYPE_Q8_0 ? fg_cpu_widen_q8_0_##isan                                                                 \
     : (t) == FG_DTYPE_Q4_0 ? fg_cpu_widen_q4_0_##isan                                                                 \
                            : fg_cpu_widen_f32_##isan)
#define PICK(isan)                                                                                                     \
    do {                                                                                                               \
        *widen_k = WIDEN(kt, isan);                                                                                    \
        *widen_v = WIDEN(vt, isan);                                                                                    \
        return kt != vt              ? fg_cpu_attend_chunk_mixed_##isan                                                \
               : kt == FG_DTYPE_F16  ? fg_cpu_attend_chunk_f16_##isan                                                  \
               : kt == FG_DTYPE_BF16 ? fg_cpu_attend_chunk_bf16_##isan                                                 \
               : kt == FG_DTYPE_Q8_0 ? fg_cpu_attend_chunk_q8_0_##isan                                                 \
               : kt == FG_DTYPE_Q4_0 ? fg_cpu_attend_chunk_q4_0_##isan                                                 \
                                     : fg_cpu_attend_chunk_f32_##isan;                                                 \
    } while (0)
#ifdef FG_X86
    if (kt == vt && bf16_dots(isa, kt, d, G)) {
        *widen_k = *widen_v = NULL;
        return fg_cpu_attend_chunk_bf16_avx512bf16;
    }
    if (int_dots(isa, L, d, G))
        PICK(avx2);
    if (isa >= FG_ISA_AVX512)
        PICK(avx512);
    if (isa == FG_ISA_AVX2)
        PICK(avx2);
#endif
    (void)isa;
    (void)d;
    (void)G;
    PICK(generic);
#undef PICK
#undef WIDEN
}

static score_scan_fn *isa_score_scan(fg_cpu_isa isa) {
#ifdef FG_X86
    if (isa >= FG_ISA_AVX512)
        return fg_cpu_score_scan_avx512;
    if (isa == FG_ISA_AVX2)
        return fg_cpu_score_scan_avx2;
#endif
    (void)isa;
    return fg_cpu_score_scan_generic;
}

/* ------------------------------------------------------------------ the step */

typedef struct head_plan {
    int32_t first_item, n_items; /* work items of the head */
    size_t raw;                  /* offset of its raw scores, or SIZE_MAX */
    int fast;                    /* 0: the plain step handles the head (kernels_cpu/decode_plain.c) */
    float new_score;             /* the new token's pooled self-attention */
    _Atomic int32_t left;        /* its items not yet attended */
    _Atomic int32_t group_left;  /* the first of a group (FG_ALLOC_LAYER): its heads not yet scored */
} head_plan;

/* Grows the workspace to `bytes` (64-byte aligned); contents are not kept. */
static fg_status workspace(fg_backend *be, fg_cpu_state *st, size_t bytes) {
    if (bytes <= st->ws_bytes)
        return FG_OK;
    free(st->ws);
    st->ws = aligned_alloc(64, (bytes + 63) / 64 * 64);
    st->ws_bytes = st->ws ? bytes : 0;
    if (!st->ws)
        return be->err(be->err_sink, FG_ERR_OUT_OF_MEMORY, "cpu decode: workspace of %zu bytes", bytes);
    return FG_OK;
}

static size_t up64(size_t x) { return (x + 63) / 64 * 64; }

/* The G query heads at q (d values each, d % 32 == 0) for the integer dots
 * with quantized K rows: each block's 32 values as fg_query_q8_row rounds
 * them, in qi; per block, 8 lanes of its fp16 scale times `scale` in qd,
 * and in qc (NULL for q8_0 rows) lane l's 8 (q_4l + ... + q_4l+3), the
 * offset a q4_0 row's nibbles carry (sum_i q_i (u_i - 8) = sum_i q_i u_i -
 * 8 sum_i q_i, lane by lane as vpmaddubsw and vpmaddwd add them). 0 when a
 * block does not round (fg_query_q8_block): the step then dots the whole
 * KV head's rounded floats. */
static int query_q8_ints(const float *q, int32_t G, int32_t d, float scale, int8_t *qi, float *qd, int32_t *qc) {
    for (int32_t b = 0; b < G * d / 32; b++) {
        const float *x = q + (size_t)b * 32;
        float inv, qscale;
        if (!fg_query_q8_block(x, 32, &inv, &qscale))
            return 0;
        for (int32_t i = 0; i < 32; i++)
            qi[(size_t)b * 32 + i] = (int8_t)fg_q8_0_int(x[i], inv);
        for (int32_t l = 0; l < 8; l++) {
            const int8_t *m = qi + (size_t)b * 32 + 4 * l;
            qd[(size_t)b * 8 + l] = qscale * scale;
            if (qc)
                qc[(size_t)b * 8 + l] = 8 * (m[0] + m[1] + m[2] + m[3]);
        }
    }
    return 1;
}

/* One decode step in two jobs. The first: a task per work item, longest
 * first, then one per head without items; the thread that finishes a head's
 * last item merges the head (step 2 of the header) and, for a head that does
 * not track scores, inserts and evicts. The second, when some head tracks
 * scores: a task per item of those heads (step 3: score update and scan),
 * and the thread that finishes a head's last one merges its scans in item
 * order and inserts and evicts (step 4). One barrier a step; a thread the OS
 * deschedules delays only the heads whose items it holds. */
typedef struct decode_job {
    const fg_page_layout *layout;
    const fg_shape *shape;
    const fg_decode_head *heads;
    head_plan *plan;
    fg_attend_chunk *items;
    const int32_t *order; /* items, longest first, then the heads without items (as -1 - head) */
    const int32_t *track; /* the items of the heads that track scores, head by head */
    fg_attend_chunk_fn *attend;
    score_scan_fn *score_scan;
    const float *qs;     /* [n_heads][G][d] the queries, scaled by 1/sqrt(d) */
    const float *qks;    /* the same, rounded first for a quantized K (fg_query_q8_row): what cached rows meet
                            in the plain path (the integer dots, which skip it, need fast_ok) */
    unsigned char *bufs; /* the threads' scratch rows */
    size_t per_thread;
    int32_t G, d;
    _Atomic int32_t bad;   /* a head that ended with a slot count the host did not expect, or -1 */
    _Atomic int32_t apart; /* a head that does not hold its group's positions, or -1 */
} decode_job;

/* Steps 3-4 of head i, its scores updated (scan: as the items scanned
 * them, or NULL). A head of a group that ranks together (FG_ALLOC_LAYER)
 * waits for the others: the thread that scores the group's last head takes
 * the mean of their scores and finishes them all, in order. */
static void head_scored(decode_job *j, int32_t i, float new_score, const fg_freq_scan *scan) {
    const fg_decode_head *hd = &j->heads[i];
    if (hd->share_n <= 1) {
        if (fg_decode_finish_head(j->layout, hd, new_score, scan) != FG_OK)
            atomic_store(&j->bad, i);
        return;
    }
    const int32_t first = hd->share_first, n = hd->share_n;
    j->plan[i].new_score = new_score;
    if (atomic_fetch_sub(&j->plan[first].group_left, 1) != 1)
        return;
    float shared = 0.0f;
    for (int32_t m = 0; m < n; m++)
        shared += j->plan[first + m].new_score;
    shared /= (float)n;
    const int apart = fg_decode_share_scores(j->layout, j->heads + first, n);
    if (apart) {
        atomic_store(&j->apart, first + apart);
        return;
    }
    for (int32_t m = 0; m < n; m++) /* the scans saw each head's own scores: scanned again */
        if (fg_decode_finish_head(j->layout, &j->heads[first + m], shared, NULL) != FG_OK)
            atomic_store(&j->bad, first + m);
}

/* Step 2 for head i, once its items are done: the partial states and the
 * new token merge into the output. A head that tracks scores turns each
 * item's max into the item's score factor and waits for the second job; any
 * other head inserts and evicts now (a tracking head without rows too). */
static void merge_head(decode_job *j, int32_t i) {
    const fg_page_layout *layout = j->layout;
    const fg_decode_head *hd = &j->heads[i];
    head_plan *hp = &j->plan[i];
    const int32_t G = j->G, d = j->d;
    if (!hp->fast) {
        head_scored(j, i, fg_cpu_decode_attend_plain(layout, j->shape, hd, j->qks + (size_t)i * G * d), NULL);
    } else {
        const float *q = j->qs + (size_t)i * G * d;
        float M[FG_MAX_GROUP], Linv[FG_MAX_GROUP], new_score = 0.0f;
        for (int32_t h = 0; h < G; h++) {
            const float *qh = q + (size_t)h * d;
            float s_new = 0.0f;
            for (int32_t c = 0; c < d; c++)
                s_new += qh[c] * hd->k[c];
            float m = s_new;
            for (int32_t c = 0; c < hp->n_items; c++)
                m = fmaxf(m, j->items[hp->first_item + c].m[h]);
            const float p_new = expf(s_new - m);
            float l = p_new, *o = hd->out + (size_t)h * d;
            for (int32_t x = 0; x < d; x++)
                o[x] = p_new * hd->v[x];
            for (int32_t c = 0; c < hp->n_items; c++) {
                const fg_attend_chunk *a = &j->items[hp->first_item + c];
                const float w = expf(a->m[h] - m);
                l += a->l[h] * w;
                const float *acc = a->acc + (size_t)h * d;
                for (int32_t x = 0; x < d; x++)
                    o[x] += w * acc[x];
            }
            const float inv = 1.0f / l;
            for (int32_t x = 0; x < d; x++)
                o[x] *= inv;
            M[h] = m;
            Linv[h] = inv / (float)G;
            new_score += p_new * Linv[h];
        }
        hp->new_score = new_score;
        if (hp->raw == SIZE_MAX || hp->n_items == 0) {
            const fg_freq_scan none = FG_FREQ_SCAN_EMPTY;
            head_scored(j, i, new_score, hp->raw == SIZE_MAX ? NULL : &none);
        } else {
            /* pooled attention of slot s: sum_h raw[h][s] e^(m_c - M) / (L G), one factor per item */
            for (int32_t c = 0; c < hp->n_items; c++) {
                fg_attend_chunk *a = &j->items[hp->first_item + c];
                for (int32_t h = 0; h < G; h++)
                    a->m[h] = expf(a->m[h] - M[h]) * Linv[h]; /* m is not needed any more */
            }
            return; /* steps 3-4 in the second job */
        }
    }
}

static void decode_task(void *arg, int32_t task, int32_t thread) {
    decode_job *j = arg;
    const int32_t it = j->order[task];
    if (it < 0) {
        merge_head(j, -1 - it);
        return;
    }
    fg_attend_chunk *a = &j->items[it];
    float *buf = (float *)(void *)(j->bufs + (size_t)thread * j->per_thread);
    a->kbuf = buf;
    a->vbuf = buf + (size_t)FG_CPU_BLOCK * j->d + 16;
    j->attend(a);
    if (atomic_fetch_sub(&j->plan[a->head].left, 1) == 1)
        merge_head(j, a->head);
}

/* Step 3 for one item of a head that tracks scores: its slots' scores grow
 * by their pooled attention, then the frequent-candidate scan of §2.5 4a-b;
 * the thread that ends a head's last item merges the scans in item order
 * (every thread count gives the same result) and inserts and evicts. */
static void score_task(void *arg, int32_t task, int32_t thread) {
    (void)thread;
    decode_job *j = arg;
    fg_attend_chunk *a = &j->items[j->track[task]];
    const fg_page_layout *layout = j->layout;
    const fg_decode_head *hd = &j->heads[a->head];
    const scan_args g = {layout, hd->meta, a->raw, a->raw_stride, a->begin, a->end, a->m, j->G,
                         hd->score_mode == FG_SCORE_LAST ? 0.0f : 1.0f, hd->score_mode == FG_SCORE_MEAN, hd->pos + 1,
                         hd->window_start};
    a->scan = FG_FREQ_SCAN_EMPTY;
    j->score_scan(&g, &a->scan);
    head_plan *hp = &j->plan[a->head];
    if (atomic_fetch_sub(&hp->left, 1) != 1)
        return;
    fg_freq_scan scan = FG_FREQ_SCAN_EMPTY;
    for (int32_t c = 0; c < hp->n_items; c++)
        fg_freq_scan_merge(&scan, &j->items[hp->first_item + c].scan);
    head_scored(j, a->head, hp->new_score, &scan);
}

fg_status fg_cpu_decode_step(fg_backend *be, const fg_page_layout *layout, const fg_shape *shape, int32_t n_heads,
                             const fg_decode_head *heads) {
    fg_cpu_state *st = be->impl;
    const int32_t G = shape->n_q_heads / shape->n_kv_heads, d = shape->head_dim;
    const float scale = 1.0f / sqrtf((float)d);
    /* the per-dtype kernels keep a block's scales in arrays of FG_QSCALES; the mixed one's widen functions
       read each scale where it lies */
    const int scales = fg_dtype_quantized(layout->k_dtype) && layout->k_dtype == layout->v_dtype;
    const int isa_or_none = step_isa(st->isa, d);
    const int fast_ok = isa_or_none >= 0 && G <= FG_MAX_GROUP && (!scales || d / fg_qblock(d) <= FG_QSCALES);
    const fg_cpu_isa isa = fast_ok ? (fg_cpu_isa)isa_or_none : st->isa;
    const int threads = fg_cpu_threads(be);

    const int32_t broken = fg_decode_groups_check(heads, n_heads); /* before anything is written */
    if (broken >= 0)
        return be->err(be->err_sink, FG_ERR_INTERNAL, "decode_step: head %d is not in a whole group", broken);

    /* plan: work items and workspace offsets (host arithmetic only) */
    int32_t n_items = 0;
    size_t raw_floats = 0, step_rows = 0;
    for (int32_t i = 0; i < n_heads; i++) {
        const fg_decode_head *hd = &heads[i];
        const int track = fg_tracks_scores(hd->components);
        n_items += fast_ok ? (hd->n_slots + FG_CPU_CHUNK - 1) / FG_CPU_CHUNK : 0;
        raw_floats += fast_ok && track ? (size_t)G * hd->n_slots : 0;
        step_rows += (size_t)hd->n_slots;
    }
    /* a small step runs on the calling thread: waking the pool would cost
     * more than it saves */
    const int par = threads > 1 && step_rows * (size_t)G >= FG_CPU_PAR_ROWS;
    /* the prefetch hint: until it is chosen, a large step times one of the two (cpu_tuning.c) */
    const double kv_bytes = (double)step_rows * (double)(layout->k_row_bytes + layout->v_row_bytes);
    const int large = fast_ok && !st->tuning.fixed && kv_bytes >= (double)FG_PF_PROBE_BYTES;
    const fg_pf_locality pf = large ? fg_cpu_pf_probe_step(&st->tuning, &st->probe) : st->tuning.pf_locality;
    const int probe = large && !st->tuning.fixed; /* not if the step just took the process's choice */
    const size_t off_plan = 0;
    const size_t off_item = off_plan + up64((size_t)n_heads * sizeof(head_plan));
    const size_t off_order = off_item + up64((size_t)n_items * sizeof(fg_attend_chunk));
    const size_t off_track = off_order + up64(((size_t)n_items + n_heads) * sizeof(int32_t));
    const size_t off_q = off_track + up64((size_t)n_items * sizeof(int32_t));
    const int bf16 = layout->k_dtype == layout->v_dtype && bf16_dots(isa, layout->k_dtype, d, G);
    fg_widen_row_fn *widen_k, *widen_v;
    fg_attend_chunk_fn *attend = isa_kernel(isa, layout, d, G, &widen_k, &widen_v);
    /* a quantized K: the rounded query (fg_query_q8_row) scaled, and for the integer dots its
       8-bit values, each block's scale (times 1/sqrt(d)) and q4_0's offsets, 8 lanes each */
    const int qk = fg_dtype_quantized(layout->k_dtype), qdots = fast_ok && int_dots(isa, layout, d, G);
    const size_t nq = (size_t)n_heads * G * d, nqb = (size_t)n_heads * G * (size_t)(d / 32) * 8;
    const size_t off_qk = off_q + up64(nq * sizeof(float));
    const size_t off_qi = off_qk + (qk ? up64(nq * sizeof(float)) : 0);
    const size_t off_qd = off_qi + (qdots ? up64(nq) : 0);
    const size_t off_qc = off_qd + (qdots ? up64(nqb * sizeof(float)) : 0);
    const size_t off_qb = off_qc + (qdots ? up64(nqb * sizeof(int32_t)) : 0);
    const size_t off_state = off_qb + (bf16 ? up64((size_t)n_heads * G * d * sizeof(uint16_t)) : 0);
    const size_t off_raw = off_state + up64((size_t)n_items * G * (d + 2) * sizeof(float));
    const size_t off_buf = off_raw + up64(raw_floats * sizeof(float));
    /* kbuf and vbuf 64 bytes off a 4 KiB multiple apart: no 4K aliasing between them */
    const size_t per_thread = up64(((size_t)2 * FG_CPU_BLOCK * d + 16) * sizeof(float)) + 64;
    fg_status s = workspace(be, st, off_buf + (size_t)threads * per_thread);
    if (s)
        return s;
    unsigned char *ws = st->ws;
    head_plan *plan = (head_plan *)(void *)(ws + off_plan);
    fg_attend_chunk *items = (fg_attend_chunk *)(void *)(ws + off_item);
    int32_t *order = (int32_t *)(void *)(ws + off_order), *track_items = (int32_t *)(void *)(ws + off_track);
    float *qs = (float *)(void *)(ws + off_q), *state = (float *)(void *)(ws + off_state);
    float *raw = (float *)(void *)(ws + off_raw);
    uint16_t *qbs = bf16 ? (uint16_t *)(void *)(ws + off_qb) : NULL;

    int32_t item = 0;
    size_t raw_at = 0;
    for (int32_t i = 0; i < n_heads; i++) {
        const fg_decode_head *hd = &heads[i];
        const int track = fg_tracks_scores(hd->components);
        head_plan *hp = &plan[i];
        hp->fast = fast_ok;
        hp->first_item = item;
        hp->n_items = fast_ok ? (hd->n_slots + FG_CPU_CHUNK - 1) / FG_CPU_CHUNK : 0;
        hp->raw = fast_ok && track ? raw_at : SIZE_MAX;
        atomic_init(&hp->left, hp->n_items);
        atomic_init(&hp->group_left, hd->share_n > 1 && hd->share_first == i ? hd->share_n : 0);
        float *q = qs + (size_t)i * G * d;
        for (int32_t c = 0; c < G * d; c++)
            q[c] = hd->q[c] * scale;
        int8_t *qi = NULL;
        float *qd = NULL;
        int32_t *qc = NULL;
        if (qdots) {
            const size_t at = (size_t)i * G * (size_t)(d / 32) * 8;
            qi = (int8_t *)(void *)(ws + off_qi) + (size_t)i * G * d;
            qd = (float *)(void *)(ws + off_qd) + at;
            qc = (int32_t *)(void *)(ws + off_qc) + at;
            if (!query_q8_ints(hd->q, G, d, scale, qi, qd, layout->k_dtype == FG_DTYPE_Q4_0 ? qc : NULL))
                qi = NULL; /* a block that does not round: the float dots of q_cached */
        }
        float *q_cached = q; /* what the cached K rows are dotted with, where the integer dots do not take them */
        if (qk && !qi) {
            q_cached = (float *)(void *)(ws + off_qk) + (size_t)i * G * d;
            for (int32_t h = 0; h < G; h++)
                fg_query_q8_row(q_cached + (size_t)h * d, hd->q + (size_t)h * d, d);
            for (int32_t c = 0; c < G * d; c++)
                q_cached[c] *= scale;
        }
        uint16_t *qb = qbs ? qbs + (size_t)i * G * d : NULL;
        for (int32_t c = 0; qb && c < G * d; c++)
            qb[c] = fg_f32_to_bf16(hd->q[c]);
        for (int32_t c = 0; c < hp->n_items; c++, item++) {
            fg_attend_chunk *a = &items[item];
            a->layout = layout;
            a->head = i;
            a->pages = hd->pages;
            a->meta = hd->meta;
            a->begin = c * FG_CPU_CHUNK;
            a->end = a->begin + FG_CPU_CHUNK < hd->n_slots ? a->begin + FG_CPU_CHUNK : hd->n_slots;
            a->G = G;
            a->d = d;
            a->q = qi ? NULL : q_cached; /* the integer dots read qi instead */
            a->qi = qi;
            a->qd = qd;
            a->qc = qc;
            a->qb = qb;
            a->scale = scale;
            a->m = state + (size_t)item * G * (d + 2);
            a->l = a->m + G;
            a->acc = a->l + G;
            a->raw = hp->raw != SIZE_MAX ? raw + hp->raw + a->begin : NULL;
            a->raw_stride = (size_t)hd->n_slots;
            a->pf_t0 = pf == FG_PF_T0;
            a->widen_k = widen_k;
            a->widen_v = widen_v;
        }
        if (hp->raw != SIZE_MAX)
            raw_at += (size_t)G * hd->n_slots;
    }

    /* 1. partial attention of every chunk, longest first (a head's last
     * chunk is short; the short ones at the end balance the threads); each
     * head's steps 2-4 follow on the thread that finishes its last chunk */
    int32_t n_full = 0;
    for (int32_t it = 0; it < n_items; it++)
        if (items[it].end - items[it].begin == FG_CPU_CHUNK)
            order[n_full++] = it;
    for (int32_t it = 0, k = n_full; it < n_items; it++) {
        const int32_t len = items[it].end - items[it].begin;
        if (len == FG_CPU_CHUNK)
            continue;
        int32_t at = k++; /* insertion by length, longest first: at most one short chunk per head */
        for (; at > n_full && items[order[at - 1]].end - items[order[at - 1]].begin < len; at--)
            order[at] = order[at - 1];
        order[at] = it;
    }
    int32_t n_lone = 0, n_track = 0; /* heads without items (the plain step's, or empty ones) finish as
                                        tasks of their own; the items of heads that track scores, head by head */
    for (int32_t i = 0; i < n_heads; i++) {
        if (plan[i].n_items == 0)
            order[n_items + n_lone++] = -1 - i;
        for (int32_t c = 0; plan[i].raw != SIZE_MAX && c < plan[i].n_items; c++)
            track_items[n_track++] = plan[i].first_item + c;
    }
    decode_job job = {layout, shape, heads, plan, items, order, track_items, attend,
                      isa_score_scan(isa), qs, qk ? (const float *)(void *)(ws + off_qk) : qs,
                      ws + off_buf, per_thread, G, d, -1, -1};
    fg_threadpool *pool = par ? be->threads : NULL;
    const int64_t t0 = probe ? fg_now_ns() : 0;
    fg_threadpool_run(pool, n_items + n_lone, decode_task, (void *)&job);
    if (probe)
        fg_cpu_pf_probe_record(&st->tuning, &st->probe, pf, 1e-9 * (double)(fg_now_ns() - t0), kv_bytes);
    if (n_track > 0) {
        for (int32_t i = 0; i < n_heads; i++) /* the second job counts the items again */
            atomic_store(&plan[i].left, plan[i].raw != SIZE_MAX ? plan[i].n_items : 0);
        fg_threadpool_run(pool, n_track, score_task, (void *)&job);
    }
    const int32_t apart = atomic_load(&job.apart);
    if (apart >= 0)
        return be->err(be->err_sink, FG_ERR_INTERNAL, "decode_step: head %d does not hold its group's positions",
                       apart);
    const int32_t bad = atomic_load(&job.bad);
    if (bad >= 0)
        return be->err(be->err_sink, FG_ERR_INTERNAL,
                       "decode_step: head %d ended with a slot count the host did not expect", bad);
    return FG_OK;
}
