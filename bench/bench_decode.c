/*
 * bench_decode: the decode step against this machine's streaming read
 * bandwidth, measured first in the same process.
 *
 * Shapes: Llama-2-7B (32 q = 32 KV heads, d = 128, G = 1), Llama-3-8B (32 q /
 * 8 KV, G = 4), a G = 8 model (32 q / 4 KV, as Qwen2-7B-class models) and
 * SmolLM2-135M (9 q / 3 KV, d = 64, G = 3: a small head dim; not in the
 * summary line, which stays comparable with earlier runs).
 * Contexts 1k, 4k, 16k; batch 1 and 8; f16, f32, q8_0 and q4_0 caches, one
 * after the other per (shape, context, batch) (--dtypes LIST to choose). Per group, the
 * full cache (every head full) runs interleaved with a FastGen-like mix (per
 * layer: special-only, +punct, +frequent, +local and full heads) and uniform
 * keep ratios of 50/25/10 %. Each case rotates over enough layer copies to
 * touch >= 4x the last-level cache (cold), and runs the real `cpu` decode
 * step (attention, score update, window and budget checks; the cache is kept
 * stationary: nothing is inserted or evicted). Bytes = kept rows x 2 x the
 * row's bytes (scales included for q8_0 / q4_0). The ceiling is a streaming read of >= 4x the LLC timed in the
 * same interleaved loop, so the fraction of bandwidth compares runs made
 * moments apart (this machine's bandwidth drifts between runs). On the cpu
 * backend the prefetch hint is measured during the first group's steps,
 * which therefore mix the two (FASTGEN_PF_LOCALITY=nta|t0 fixes it); the
 * hint taken is printed after the run. On the host the roofline's probes
 * (bench/roofline.h: the instructions' peaks) run first, and each row's
 * "of roof" is the step's floor (max of its bytes over the group's bandwidth
 * and its multiply-adds, e^x and widenings at the peaks) over its time.
 * Last line:
 *   decode summary: bw_fraction=F efficiency=E roofline_fraction=R
 * over the FastGen-mix cases at >= 4k context (medians), after one line per
 * group size G: the median fractions (bandwidth, roofline) of its full-cache 16-bit cases at >= 4k,
 * and per quantized dtype the full-cache step's time over the 16-bit one's.
 * Options: --csv (CSV table), --quick (contexts 1k and 4k, batch 1 only),
 *          --context N, --batch N (that context or batch of the lists only),
 *          --model NAME (only that shape: llama2-7b, llama3-8b, g8-32x4, smollm2-135m),
 *          --bf16 (the 16-bit rows bf16 instead of f16: on AVX512_BF16 the
 *          vdpbf16ps kernel; FG_CPU_ISA=avx512 gives the FMA one to compare),
 *          --host-tables (a GPU backend gets each head's page tables from
 *          the host every step, as callers without tables of their own,
 *          instead of keeping them on the device as the core does: the
 *          host's part of a step before and after),
 *          --backend NAME (default cpu). With a GPU backend (cuda, hip) the
 *          pages and q/k/v/out live on the device (FG_IO_DEVICE), runs of 8
 *          steps queued back to back are timed by device events (the host's
 *          bookkeeping of a step overlaps the device's work, as in an engine), the layer copies rotate past 4x the
 *          device's L2, and the ceiling is the device read-bandwidth probe,
 *          run between the steps of the same loop. Under HIP-CPU the figures
 *          are the host's and the header says so. With a GPU backend each
 *          group's cases of its first dtype (the 16-bit one by default) also
 *          run alone with the backend's per-kernel timing ("# kernels"
 *          lines: the host's bookkeeping, then the upload's and each
 *          kernel's device time a step, and their sum beside the step's
 *          time: a step well above the sum waits on the host).
 */
#define FG_EXPERIMENTAL /* FG_ADAPTIVE_*, fg_cpu_describe (fastgen.h) */
#include <math.h>

#include "backends/backend.h"
#include "bench_util.h"
#include "common/dtype.h"
#include "roofline.h"

enum { T_SPECIAL, T_PUNCT, T_FREQ, T_LOCAL, T_FULL, N_TYPES };
static const uint32_t k_type_comp[N_TYPES] = {
    FG_KEEP_SPECIAL,
    FG_KEEP_SPECIAL | FG_KEEP_PUNCT,
    FG_KEEP_SPECIAL | FG_KEEP_PUNCT | FG_KEEP_FREQUENT,
    FG_KEEP_SPECIAL | FG_KEEP_PUNCT | FG_KEEP_FREQUENT | FG_KEEP_LOCAL,
    FG_KEEP_FULL,
};
/* rows kept at length t: sinks and specials ~1%, punctuation ~12%, r = 0.3 */
static int32_t type_rows(int type, int32_t t) {
    static const double frac[N_TYPES] = {0.01, 0.12, 0.42, 0.72, 1.0};
    int32_t n = (int32_t)ceil(frac[type] * t);
    return n < 4 ? 4 : n > t ? t : n;
}
/* The paper's figure, per layer, cheapest first: about 20% special, 20%
 * +punct, 20% +frequent, 25% +local, 15% full. */
static int head_type(int g, int Hkv) {
    double x = (g + 0.5) / Hkv;
    return x < 0.20 ? T_SPECIAL : x < 0.40 ? T_PUNCT : x < 0.60 ? T_FREQ : x < 0.85 ? T_LOCAL : T_FULL;
}

typedef struct model_shape {
    const char *name;
    int32_t Hq, Hkv, d;
    int in_summary; /* its FastGen-mix cases enter the decode summary */
} model_shape;

enum { MIX_FULL, MIX_FASTGEN, MIX_50, MIX_25, MIX_10, N_MIX };
static const char *const k_mix_name[N_MIX] = {"full", "fastgen-mix", "keep-50%", "keep-25%", "keep-10%"};

#define REPS 21
#define DEV_STEPS 8 /* steps per device-timed run */

typedef struct bench_case {
    int mix;
    int32_t R;               /* layer copies rotated over */
    int32_t n_heads;         /* batch x Hkv */
    unsigned char *mem;      /* every page of every copy */
    void **page_ptrs;
    void **tabs;             /* the page tables in the backend's memory (device_tables), NULL without */
    fg_decode_head *heads;   /* [R][n_heads] */
    size_t bytes;            /* K/V bytes one step reads */
    double rows;             /* K/V rows one step reads */
    double t[REPS];
} bench_case;

static int32_t case_rows(int mix, int g, int32_t Hkv, int32_t t) {
    switch (mix) {
    case MIX_FULL: return t;
    case MIX_FASTGEN: return type_rows(head_type(g, Hkv), t);
    case MIX_50: return t / 2;
    case MIX_25: return t / 4;
    default: return t / 10;
    }
}

static int case_type(int mix, int g, int32_t Hkv) {
    return mix == MIX_FULL ? T_FULL : mix == MIX_FASTGEN ? head_type(g, Hkv) : T_LOCAL;
}

static int build_case(fg_backend *be, bench_case *c, int mix, const model_shape *m, int32_t t, int32_t B, fg_dtype dtype,
                      int host_tables, const fg_page_layout *L, const float *q, const float *k, const float *v, float *out,
                      const unsigned char *page_template, size_t cache_bytes) {
    const int32_t Hkv = m->Hkv, P = L->page_tokens, G = m->Hq / m->Hkv;
    memset(c, 0, sizeof *c);
    c->mix = mix;
    c->n_heads = B * Hkv;
    size_t pages_per_copy = 0;
    for (int32_t g = 0; g < Hkv; g++) {
        int32_t rows = case_rows(mix, g, Hkv, t);
        c->bytes += (size_t)B * rows * 2 * fg_row_bytes(dtype, m->d);
        c->rows += (double)B * rows;
        pages_per_copy += (size_t)B * ((rows + P) / P); /* room for one more row */
    }
    const size_t unit = L->page_bytes + L->meta_bytes; /* a row page, then its meta page */
    const size_t copy_bytes = pages_per_copy * unit, target = 4 * cache_bytes;
    c->R = (int32_t)((target + copy_bytes - 1) / copy_bytes);
    if (c->R < 1)
        c->R = 1;
    c->page_ptrs = malloc(2 * pages_per_copy * c->R * sizeof(void *));
    c->heads = malloc((size_t)c->R * c->n_heads * sizeof *c->heads);
    unsigned char *staging = aligned_alloc(64, copy_bytes); /* one layer copy, written at once */
    if (!c->page_ptrs || !c->heads || !staging || be->ops->buffer_alloc(be, copy_bytes * c->R, (void **)&c->mem))
        return 0;
    size_t page = 0;
    for (int32_t r = 0; r < c->R; r++) {
        for (int32_t b = 0; b < B; b++)
            for (int32_t g = 0; g < Hkv; g++) {
                const int32_t rows = case_rows(mix, g, Hkv, t), np = (rows + P) / P;
                const int type = case_type(mix, g, Hkv), track = type == T_FREQ || type == T_LOCAL;
                void **pp = c->page_ptrs + 2 * page, **mp = pp + np;
                for (int32_t p = 0; p < np; p++, page++) {
                    /* a page: the template rows; its meta page: this head's metadata, slot s in row s */
                    unsigned char *sp = staging + (page - (size_t)r * pages_per_copy) * unit, *sm = sp + L->page_bytes;
                    memcpy(sp, page_template, L->page_bytes);
                    memset(sm, 0, L->meta_bytes);
                    for (int32_t j = 0; j < P && p * P + j < rows; j++) {
                        ((int32_t *)(void *)(sm + L->pos_offset))[j] = p * P + j;
                        ((int32_t *)(void *)(sm + L->row_offset))[j] = p * P + j;
                        sm[L->flags_offset + j] = track ? FG_SLOT_FREQUENT : (uint8_t)k_type_comp[type];
                    }
                    pp[p] = c->mem + page * unit;
                    mp[p] = c->mem + page * unit + L->page_bytes;
                }
                c->heads[(size_t)r * c->n_heads + b * Hkv + g] = (fg_decode_head){
                    .pages = pp,
                    .meta = mp,
                    .n_pages = np,
                    .priv_from = 0,
                    .row_base = rows,
                    .n_slots = rows,
                    .n_slots_after = rows,
                    .components = k_type_comp[type],
                    .score_mode = FG_SCORE_SUM,
                    .pos = t,
                    .insert_flag = 0,
                    .window_start = 0,
                    .freq_budget = rows,
                    .q = q + ((size_t)b * m->Hq + (size_t)g * G) * m->d,
                    .k = k + ((size_t)b * Hkv + g) * m->d,
                    .v = v + ((size_t)b * Hkv + g) * m->d,
                    .out = out + ((size_t)b * m->Hq + (size_t)g * G) * m->d,
                };
                if (be->ops->device_tables && !host_tables) { /* the core's path: the tables stay in place */
                    fg_decode_head *dh = &c->heads[(size_t)r * c->n_heads + b * Hkv + g];
                    dh->tab = NULL; /* set below, once the tables are written */
                    dh->tab_cap = dh->tab_valid = np;
                }
            }
        if (fg_backend_write(be, c->mem + (size_t)r * copy_bytes, staging, copy_bytes))
            return 0;
    }
    free(staging);
    if (be->ops->device_tables && !host_tables) { /* each head's tables, as page_ptrs holds them: pages, then meta */
        const size_t n = 2 * pages_per_copy * c->R;
        if (be->ops->buffer_alloc(be, n * sizeof(void *), (void **)&c->tabs) ||
            fg_backend_write(be, c->tabs, c->page_ptrs, n * sizeof(void *)))
            return 0;
        for (size_t x = 0; x < (size_t)c->R * c->n_heads; x++)
            c->heads[x].tab = c->tabs + (c->heads[x].pages - (void *const *)c->page_ptrs);
    }
    return 1;
}

static void free_case(fg_backend *be, bench_case *c) {
    if (c->mem)
        be->ops->buffer_free(be, c->mem);
    if (c->tabs)
        be->ops->buffer_free(be, c->tabs);
    free(c->page_ptrs);
    free(c->heads);
}

int main(int argc, char **argv) {
    const int csv = bench_has_flag(argc, argv, "--csv"), quick = bench_has_flag(argc, argv, "--quick");
    const int bf16 = bench_has_flag(argc, argv, "--bf16");
    const int host_tables = bench_has_flag(argc, argv, "--host-tables");
    const char *backend;
    fg_backend be;
    if (bench_open_backend(argc, argv, &be, &backend) != FG_OK)
        return 1;

    size_t stream_n;
    float *stream = bench_stream_buffer(&stream_n);
    if (!stream)
        return 1;
    /* a GPU backend: device events, device memory, the device's L2 and read bandwidth */
    const int dev = bench_timer(&be) && bench_bandwidth(&be) && bench_device_info(&be);
    fg_device_info dinfo = {.l2_bytes = bench_llc_bytes()};
    if (dev && bench_device_info(&be)(&be, &dinfo))
        return 1;
    size_t probe_bytes = dev ? (8 * dinfo.l2_bytes > ((size_t)1 << 30) ? 8 * dinfo.l2_bytes : (size_t)1 << 30) : 0;
    if (dinfo.emulated)
        probe_bytes = (size_t)64 << 20;
    double read_bw = 0.0;
    roofline_peaks peaks = {0}; /* the host's instruction peaks (cpu backends) */
    if (dev) {
        if (bench_bandwidth(&be)(&be, 0, probe_bytes, 5, &read_bw))
            return 1;
        be.device_io = 1;
        printf("# bench_decode: backend %s on %s (%d SMs, L2 %zu MiB)%s, device read bandwidth %.1f GB/s at the start "
               "(%zu MiB read; each group re-measures it between its steps; 'of bw' uses that); steps timed by device "
               "events, q/k/v/out in device memory\n",
               backend, dinfo.name, (int)dinfo.n_sm, dinfo.l2_bytes >> 20,
               dinfo.emulated ? " [HIP-CPU EMULATION: the figures are the host's, not a GPU's]" : "", read_bw / 1e9,
               probe_bytes >> 20);
    } else {
        peaks = roofline_measure(bench_pool());
        read_bw = peaks.read_bps;
        char cpu[256];
        fg_cpu_describe(cpu, sizeof cpu);
        printf("# bench_decode: backend %s, %d threads, LLC %zu MiB, streaming read bandwidth %.2f GB/s at the start "
               "(each group re-measures it between its runs; 'of bw' uses that)\n# cpu: %s\n",
               backend, bench_threads(), bench_llc_bytes() >> 20, read_bw / 1e9, cpu);
        roofline_print_peaks(stdout, "# roofline ", &peaks);
        printf("# 'of roof': a step's floor over its time; the floor: max(bytes / the group's bandwidth, its "
               "multiply-adds, e^x and widenings at the probes' peaks) (bench/roofline.h)\n");
    }
    if (csv)
        printf("model,context,batch,dtype,case,kept_fraction,time_ms,gb_per_s,bw_fraction,ideal_speedup,"
               "measured_speedup,roofline_fraction\n");
    else
        printf("%-12s %6s %5s %5s %-12s %6s %9s %8s %7s %8s %8s %7s\n", "model", "ctx", "batch", "dtype", "case",
               "kept", "time ms", "GB/s", "of bw", "ideal x", "meas. x", "of roof");

    const model_shape models[] = {{"llama2-7b", 32, 32, 128, 1}, {"llama3-8b", 32, 8, 128, 1},
                                  {"g8-32x4", 32, 4, 128, 1}, {"smollm2-135m", 9, 3, 64, 0}};
    enum { N_MODELS = sizeof models / sizeof models[0] };
    const char *only = bench_arg(argc, argv, "--model");
    double g_fracs[N_MODELS][16], g_roofs[N_MODELS][16];
    int g_n[N_MODELS] = {0};
    const int32_t contexts[] = {1024, 4096, 16384};
    const int32_t batches[] = {1, 8};
    /* --context N / --batch N: that one only (one of the lists') */
    const char *only_ctx = bench_arg(argc, argv, "--context"), *only_batch = bench_arg(argc, argv, "--batch");
    if ((only_ctx && atoi(only_ctx) != 1024 && atoi(only_ctx) != 4096 && atoi(only_ctx) != 16384) ||
        (only_batch && atoi(only_batch) != 1 && atoi(only_batch) != 8)) {
        fprintf(stderr, "bench_decode: --context takes 1024, 4096 or 16384, --batch 1 or 8\n");
        return 2;
    }
    /* the cache dtypes of each group, run one after the other (the first is
     * the 16-bit one the quantized rows are compared with) */
    fg_dtype dtypes[8] = {bf16 ? FG_DTYPE_BF16 : FG_DTYPE_F16, FG_DTYPE_F32, FG_DTYPE_Q8_0, FG_DTYPE_Q4_0};
    size_t n_dt = 4;
    const char *dt_list = bench_arg(argc, argv, "--dtypes");
    if (dt_list && bf16) {
        fprintf(stderr, "bench_decode: --bf16 picks the 16-bit rows of the default list; with --dtypes name bf16\n");
        return 2;
    }
    if (dt_list) {
        n_dt = 0;
        char buf[128];
        snprintf(buf, sizeof buf, "%s", dt_list);
        for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
            if (n_dt == 8 || fg_dtype_parse(tok, &dtypes[n_dt]) != FG_OK) {
                fprintf(stderr, "bench_decode: --dtypes takes up to 8 of f32,f16,bf16,q8_0,q4_0: %s\n", dt_list);
                return 2;
            }
            n_dt++;
        }
    }
    /* per quantized dtype: the full-cache step's time over the 16-bit one's in the same group, >= 4k */
    double q_ratio[2][64];
    int q_n[2] = {0, 0};
    double t16_full = 0.0;
    double fracs[64], effs[64], roofs[64];
    int n_summary = 0;
    for (size_t mi = 0; mi < N_MODELS; mi++)
        for (size_t ci = 0; ci < (quick ? 2 : 3) && (!only || !strcmp(only, models[mi].name)); ci++)
            for (size_t bi = 0; bi < (quick ? 1 : 2); bi++)
                for (size_t di = 0; di < n_dt; di++) {
                    if ((only_ctx && atoi(only_ctx) != contexts[ci]) || (only_batch && atoi(only_batch) != batches[bi]))
                        continue;
                    if (di == 0) /* a new group: its own 16-bit time */
                        t16_full = 0.0;
                    const model_shape *m = &models[mi];
                    const int32_t t = contexts[ci], B = batches[bi];
                    const fg_dtype dt = dtypes[di];
                    const fg_page_layout L = fg_page_layout_make(16, m->d, dt, dt);
                    const size_t qn = (size_t)B * m->Hq * m->d, kn = (size_t)B * m->Hkv * m->d;
                    float *q = malloc(qn * sizeof *q), *k = malloc(kn * sizeof *k), *v = malloc(kn * sizeof *v);
                    float *out = malloc(qn * sizeof *out);
                    unsigned char *tmpl = aligned_alloc(64, L.page_bytes);
                    float row[1024];
                    for (size_t i = 0; i < qn; i++)
                        q[i] = (float)((i * 7919) % 1000) / 1000.0f - 0.5f;
                    for (size_t i = 0; i < kn; i++)
                        k[i] = v[i] = (float)((i * 104729) % 1000) / 1000.0f - 0.5f;
                    memset(tmpl, 0, L.page_bytes);
                    for (int32_t r = 0; r < 16; r++) {
                        for (int32_t c = 0; c < m->d; c++)
                            row[c] = (float)(((r * 131 + c) * 2654435761u) % 2000) / 1000.0f - 1.0f;
                        fg_store_row(tmpl + L.k_offset + (size_t)r * L.k_row_bytes, dt, row, m->d);
                        fg_store_row(tmpl + L.v_offset + (size_t)r * L.v_row_bytes, dt, row, m->d);
                    }
                    /* with a GPU backend the step reads and writes device copies */
                    float *dq = q, *dk = k, *dv = v, *dout = out;
                    int ok = 1;
                    if (dev) {
                        ok = !be.ops->buffer_alloc(&be, qn * 4, (void **)&dq) &&
                             !be.ops->buffer_alloc(&be, kn * 4, (void **)&dk) &&
                             !be.ops->buffer_alloc(&be, kn * 4, (void **)&dv) &&
                             !be.ops->buffer_alloc(&be, qn * 4, (void **)&dout) && !fg_backend_write(&be, dq, q, qn * 4) &&
                             !fg_backend_write(&be, dk, k, kn * 4) && !fg_backend_write(&be, dv, v, kn * 4);
                    }
                    bench_case cases[N_MIX];
                    for (int x = 0; x < N_MIX && ok; x++)
                        ok &= build_case(&be, &cases[x], x, m, t, B, dt, host_tables, &L, dq, dk, dv, dout, tmpl, dinfo.l2_bytes);
                    if (!ok) {
                        fprintf(stderr, "bench_decode: out of memory\n");
                        return 1;
                    }
                    /* warm-up, then the cases interleaved rep by rep */
                    for (int x = 0; x < N_MIX; x++)
                        be.ops->decode_step(&be, &L, &(fg_shape){m->Hq, m->Hkv, m->d}, cases[x].n_heads,
                                            cases[x].heads);
                    double t_stream[REPS];
                    volatile float sink = 0.0f;
                    for (int rep = 0; rep < REPS; rep++) {
                        if (dev) {
                            double rate = 0.0;
                            if (bench_bandwidth(&be)(&be, 0, probe_bytes, 1, &rate) || rate <= 0.0)
                                return 1;
                            t_stream[rep] = (double)probe_bytes / rate;
                        } else {
                            const double ts = bench_now();
                            sink += bench_stream_read(stream, stream_n);
                            t_stream[rep] = bench_now() - ts;
                        }
                        for (int x = 0; x < N_MIX; x++) {
                            bench_case *c = &cases[x];
                            const fg_decode_head *h = c->heads + (size_t)(rep % c->R) * c->n_heads;
                            const fg_shape shape = {m->Hq, m->Hkv, m->d};
                            if (dev) { /* DEV_STEPS steps queued back to back (the host runs ahead), over the copies */
                                if (bench_timer(&be)(&be, 0, NULL))
                                    return 1;
                                for (int x2 = 0; x2 < DEV_STEPS; x2++)
                                    if (be.ops->decode_step(&be, &L, &shape, c->n_heads,
                                                            c->heads + (size_t)((rep * DEV_STEPS + x2) % c->R) * c->n_heads))
                                        return 1;
                                if (bench_timer(&be)(&be, 1, &c->t[rep]))
                                    return 1;
                                c->t[rep] /= DEV_STEPS;
                                (void)h;
                            } else {
                                double t0 = bench_now();
                                be.ops->decode_step(&be, &L, &shape, c->n_heads, h);
                                c->t[rep] = bench_now() - t0;
                            }
                        }
                    }
                    (void)sink;
                    fg_kernel_times_fn *ktimes = bench_kernel_times(&be);
                    if (dev && ktimes && di == 0) /* the first dtype's cases, kernel by kernel: where a step goes */
                        for (int x = 0; x < N_MIX; x++) {
                            bench_case *c = &cases[x];
                            fg_kernel_time kt[16];
                            int32_t nk = 0;
                            const fg_shape shape = {m->Hq, m->Hkv, m->d};
                            if (ktimes(&be, 1, kt, 16, &nk))
                                return 1;
                            for (int x2 = 0; x2 < DEV_STEPS; x2++)
                                if (be.ops->decode_step(&be, &L, &shape, c->n_heads,
                                                        c->heads + (size_t)(x2 % c->R) * c->n_heads))
                                    return 1;
                            if (ktimes(&be, 0, kt, 16, &nk))
                                return 1;
                            printf("# kernels %s %d x%d %s %s (ms a step):", m->name, (int)t, (int)B,
                                   fg_dtype_name(dt), k_mix_name[x]);
                            const double dev_sum = bench_print_kernel_times(kt, nk, DEV_STEPS);
                            printf("; device %.4f of the step's %.4f\n", 1e3 * dev_sum, 1e3 * bench_median(c->t, REPS));
                        }
                    const double bw = (dev ? (double)probe_bytes : (double)(stream_n * sizeof(float))) /
                                      bench_median(t_stream, REPS);
                    const double t_full = bench_median(cases[MIX_FULL].t, REPS);
                    for (int x = 0; x < N_MIX; x++) {
                        bench_case *c = &cases[x];
                        const double tm = bench_median(c->t, REPS), gbs = (double)c->bytes / tm;
                        const double ideal = (double)cases[MIX_FULL].bytes / (double)c->bytes;
                        const double meas = t_full / tm, kept = 1.0 / ideal;
                        const char *dn = fg_dtype_name(dt);
                        /* the floor at this group's bandwidth (the host's peaks; a GPU has none here) */
                        roofline_peaks gp = peaks;
                        gp.read_bps = bw;
                        const roofline_phase att =
                            roofline_attention(c->rows, m->Hq / m->Hkv, m->d, dt, dt, (double)c->bytes);
                        const double roof = dev ? 0.0 : roofline_phase_floor(&gp, &att, NULL, NULL) / tm;
                        char rf[16] = "-"; /* a GPU: no host roofline */
                        if (!dev)
                            snprintf(rf, sizeof rf, csv ? "%.4f" : "%.1f%%", csv ? roof : 100 * roof);
                        if (csv)
                            printf("%s,%d,%d,%s,%s,%.4f,%.4f,%.3f,%.4f,%.3f,%.3f,%s\n", m->name, (int)t, (int)B, dn,
                                   k_mix_name[x], kept, 1e3 * tm, gbs / 1e9, gbs / bw, ideal, meas, rf);
                        else
                            printf("%-12s %6d %5d %5s %-12s %5.1f%% %9.3f %8.2f %6.1f%% %8.2f %8.2f %7s\n", m->name,
                                   (int)t, (int)B, dn, k_mix_name[x], 100 * kept, 1e3 * tm, gbs / 1e9, 100 * gbs / bw,
                                   ideal, meas, rf);
                        if (x == MIX_FULL && t >= 4096 && (dt == FG_DTYPE_F16 || dt == FG_DTYPE_BF16) &&
                            g_n[mi] < 16) {
                            g_roofs[mi][g_n[mi]] = roof;
                            g_fracs[mi][g_n[mi]++] = gbs / bw;
                        }
                        if (x == MIX_FULL && (dt == FG_DTYPE_F16 || dt == FG_DTYPE_BF16))
                            t16_full = tm;
                        const int qi = dt == FG_DTYPE_Q8_0 ? 0 : dt == FG_DTYPE_Q4_0 ? 1 : -1;
                        if (x == MIX_FULL && t >= 4096 && qi >= 0 && t16_full > 0.0 && q_n[qi] < 64)
                            q_ratio[qi][q_n[qi]++] = tm / t16_full;
                        const int unquantized = !fg_dtype_quantized(dt); /* the summary stays comparable */
                        if (x == MIX_FASTGEN && t >= 4096 && m->in_summary && unquantized && n_summary < 64) {
                            fracs[n_summary] = gbs / bw;
                            roofs[n_summary] = roof;
                            effs[n_summary++] = meas / ideal;
                        }
                        free_case(&be, c);
                    }
                    if (dev) {
                        be.ops->buffer_free(&be, dq);
                        be.ops->buffer_free(&be, dk);
                        be.ops->buffer_free(&be, dv);
                        be.ops->buffer_free(&be, dout);
                    }
                    free(q);
                    free(k);
                    free(v);
                    free(out);
                    free(tmpl);
                }
    fg_backend_close(&be);
    free(stream);
    if (!dev) { /* the prefetch hint, measured during the first group's steps (which mix the two hints) */
        char cpu[256];
        fg_cpu_describe(cpu, sizeof cpu);
        printf("# cpu after the run: %s\n", cpu);
    }
    for (size_t mi = 0; mi < N_MODELS; mi++)
        if (g_n[mi]) {
            printf("decode G=%d (%s): median bw_fraction of the full-cache 16-bit cases at >= 4k = %.3f",
                   (int)(models[mi].Hq / models[mi].Hkv), models[mi].name, bench_median(g_fracs[mi], g_n[mi]));
            if (!dev)
                printf(", roofline_fraction = %.3f", bench_median(g_roofs[mi], g_n[mi]));
            printf("\n");
        }
    for (int qi = 0; qi < 2; qi++)
        if (q_n[qi]) {
            const double med = bench_median(q_ratio[qi], q_n[qi]); /* sorts them */
            printf("decode %s: full-cache step time / the 16-bit one's in the same group at >= 4k: median %.3f "
                   "(%d cases, min %.3f, max %.3f)\n",
                   qi ? "q4_0" : "q8_0", med, q_n[qi], q_ratio[qi][0], q_ratio[qi][q_n[qi] - 1]);
        }
    printf("decode summary: bw_fraction=%.3f efficiency=%.3f", bench_median(fracs, n_summary),
           bench_median(effs, n_summary));
    if (!dev) /* the host's roofline */
        printf(" roofline_fraction=%.3f", bench_median(roofs, n_summary));
    printf("\n");
    return 0;
}
