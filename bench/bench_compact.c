/*
 * bench_compact: compaction (gathering the kept prompt rows of every head
 * into its pages) against this machine's copy bandwidth, measured in the
 * same run (memcpy over >= 4x the LLC, all threads, bytes read + written).
 * Bytes moved = kept rows x 2 (K, V) x (4 d read + the row's bytes written).
 * A copy of >= 4x the LLC is timed between the compactions (interleaved), and
 * each case's fraction is against those copies.
 * Shape: one Llama-3-8B layer (8 KV heads, d = 128), prompts of 4k, 16k and
 * 64k tokens, half of the rows kept, f32, f16, q8_0 and q4_0 caches; each prompt's K/V
 * is >= 4x the LLC or rotated over enough copies to be. Last line:
 *   compact summary: copy_fraction=C     (median over the cases)
 * Options: --csv, --backend NAME.
 */

#include "backends/backend.h"
#include "bench_util.h"

#define REPS 15

int main(int argc, char **argv) {
    const int csv = bench_has_flag(argc, argv, "--csv");
    const char *backend;
    fg_backend be;
    if (bench_open_backend(argc, argv, &be, &backend) != FG_OK)
        return 1;
    const int32_t Hkv = 8, d = 128;
    const fg_shape sh = {32, Hkv, d};
    const int dev = bench_is_device(&be);
    fg_device_info dinfo = {.l2_bytes = bench_llc_bytes()};
    if (dev && bench_device_info(&be)(&be, &dinfo))
        return 1;
    be.device_io = dev; /* on a GPU, the prompt's K and V live on the device */
    size_t probe_bytes = 4 * dinfo.l2_bytes;
    probe_bytes = probe_bytes < ((size_t)128 << 20) ? (size_t)128 << 20 : probe_bytes;
    if (dinfo.emulated)
        probe_bytes = (size_t)32 << 20;
    unsigned char *pa = dev ? NULL : aligned_alloc(64, probe_bytes), *pb = dev ? NULL : aligned_alloc(64, probe_bytes);
    if (!dev && (!pa || !pb))
        return 1;
    double copy_bw = 0.0;
    if (dev) {
        if (bench_bandwidth(&be)(&be, 1, probe_bytes, 5, &copy_bw))
            return 1;
        printf("# bench_compact: backend %s on %s%s, device copy bandwidth %.1f GB/s (read + write) at the start; "
               "each case re-measures it between its runs; timed by device events, K/V in device memory\n",
               backend, dinfo.name, dinfo.emulated ? " [HIP-CPU EMULATION: the figures are the host's]" : "",
               copy_bw / 1e9);
    } else {
        memset(pa, 1, probe_bytes);
        memset(pb, 2, probe_bytes);
        copy_bw = bench_copy_bandwidth();
        printf("# bench_compact: backend %s, %d threads, copy bandwidth %.2f GB/s (read + write) at the start; each "
               "case re-measures it between its runs\n",
               backend, bench_threads(), copy_bw / 1e9);
    }
    if (csv)
        printf("n,dtype,kept_rows,time_ms,gb_per_s,copy_fraction\n");
    else
        printf("%7s %5s %10s %9s %8s %8s\n", "n", "dtype", "kept rows", "time ms", "GB/s", "of copy");
    const int32_t lengths[] = {4096, 16384, 65536};
    /* f32 and f16 enter the summary (comparable with earlier runs); q8_0
     * and q4_0, which quantize as they write, have a line each */
    const fg_dtype dts[] = {FG_DTYPE_F32, FG_DTYPE_F16, FG_DTYPE_Q8_0, FG_DTYPE_Q4_0};
    double fracs[6], qfracs[2][3];
    int count = 0, qcount[2] = {0, 0};
    for (int li = 0; li < 3; li++)
        for (int di = 0; di < 4; di++) {
            const int32_t n = lengths[li];
            const fg_dtype dt = dts[di];
            const fg_page_layout L = fg_page_layout_make(16, d, dt, dt);
            const size_t kv_bytes = (size_t)n * Hkv * d * sizeof(float);
            int32_t R = (int32_t)((4 * dinfo.l2_bytes + 2 * kv_bytes - 1) / (2 * kv_bytes));
            R = R < 1 ? 1 : R;
            float *kv = malloc((size_t)R * 2 * kv_bytes);
            const int32_t keep = n / 2, np = (keep + 15) / 16;
            int32_t *pos = malloc((size_t)keep * sizeof *pos);
            uint8_t *flags = malloc((size_t)keep);
            float *score = malloc((size_t)keep * sizeof *score);
            unsigned char *pages = NULL; /* backend memory: the device's for a GPU backend */
            const size_t meta0 = (size_t)Hkv * np * L.page_bytes; /* the row pages, then the meta pages */
            be.ops->buffer_alloc(&be, meta0 + (size_t)Hkv * np * L.meta_bytes, (void **)&pages);
            void **ptrs = malloc((size_t)2 * Hkv * np * sizeof *ptrs), **mptrs = ptrs + (size_t)Hkv * np;
            if (!kv || !pos || !flags || !score || !pages || !ptrs) {
                fprintf(stderr, "bench_compact: out of memory\n");
                return 1;
            }
            for (size_t i = 0; i < (size_t)R * 2 * kv_bytes / sizeof(float); i++)
                kv[i] = (float)(i % 977) / 977.0f - 0.5f;
            for (int32_t j = 0; j < keep; j++) {
                pos[j] = 2 * j + (j % 2); /* every other row, not a regular stride */
                flags[j] = FG_SLOT_FREQUENT;
                score[j] = 1.0f;
            }
            fg_compact_head heads[8];
            for (int32_t g = 0; g < Hkv; g++) {
                for (int32_t p = 0; p < np; p++) {
                    ptrs[g * np + p] = pages + ((size_t)g * np + p) * L.page_bytes;
                    mptrs[g * np + p] = pages + meta0 + ((size_t)g * np + p) * L.meta_bytes;
                }
                heads[g] = (fg_compact_head){g,    keep, pos, flags, score, ptrs + (size_t)g * np, mptrs + (size_t)g * np,
                                             NULL};
            }
            float *akv = kv;
            if (dev && !(akv = bench_device_copy(&be, kv, (size_t)R * 2 * kv_bytes)))
                return 1;
            double t[REPS], tc[REPS];
            for (int r = 0; r < REPS; r++) {
                if (dev) {
                    double rate = 0.0;
                    if (bench_bandwidth(&be)(&be, 1, probe_bytes, 1, &rate) || rate <= 0.0)
                        return 1;
                    tc[r] = 2.0 * (double)probe_bytes / rate;
                } else {
                    const double tc0 = bench_now();
                    bench_copy_once(pb, pa, probe_bytes);
                    tc[r] = bench_now() - tc0;
                }
                const float *k = akv + (size_t)(r % R) * 2 * (kv_bytes / sizeof(float));
                const float *v = k + kv_bytes / sizeof(float);
                const double t0 = bench_region(&be, dev, 0, 0.0);
                if (be.ops->compact(&be, &L, &sh, n, k, v, Hkv, heads))
                    return 1;
                t[r] = bench_region(&be, dev, 1, t0);
            }
            const double tm = bench_median(t, REPS);
            fg_kernel_times_fn *ktimes = bench_kernel_times(&be);
            if (dev && ktimes) { /* one call's parts, timed alone */
                fg_kernel_time kt[8];
                int32_t nk = 0;
                if (ktimes(&be, 1, kt, 8, &nk) || be.ops->compact(&be, &L, &sh, n, akv, akv + kv_bytes / sizeof(float),
                                                                  Hkv, heads) ||
                    ktimes(&be, 0, kt, 8, &nk))
                    return 1;
                printf("# kernels %d %s (ms):", (int)n, fg_dtype_name(dt));
                bench_print_kernel_times(kt, nk, 1.0);
                printf("; the call took %.4f\n", 1e3 * tm);
            }
            if (dev)
                be.ops->buffer_free(&be, akv);
            const double bytes = (double)keep * Hkv * 2 * (4.0 * d + (double)fg_row_bytes(dt, d));
            const double gbs = bytes / tm, bw = 2.0 * (double)probe_bytes / bench_median(tc, REPS);
            if (di < 2)
                fracs[count++] = gbs / bw;
            else
                qfracs[di - 2][qcount[di - 2]++] = gbs / bw;
            if (csv)
                printf("%d,%s,%d,%.4f,%.3f,%.4f\n", (int)n, fg_dtype_name(dt), (int)(keep * Hkv), 1e3 * tm, gbs / 1e9,
                       gbs / bw);
            else
                printf("%7d %5s %10d %9.3f %8.2f %7.1f%%\n", (int)n, fg_dtype_name(dt), (int)(keep * Hkv), 1e3 * tm,
                       gbs / 1e9, 100 * gbs / bw);
            free(kv);
            free(pos);
            free(flags);
            free(score);
            be.ops->buffer_free(&be, pages);
            free(ptrs);
        }
    fg_backend_close(&be);
    free(pa);
    free(pb);
    for (int q = 0; q < 2; q++)
        printf("compact %s (quantizing as it writes): copy_fraction=%.3f\n", q ? "q4_0" : "q8_0",
               bench_median(qfracs[q], qcount[q]));
    printf("compact summary: copy_fraction=%.3f\n", bench_median(fracs, count));
    return 0;
}
