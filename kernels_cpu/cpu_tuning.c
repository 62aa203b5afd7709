/* Per-CPU tuning of the cpu backend (fg_cpu_tuning in kernels_cpu.h).
 *
 * The prefetch hint of the decode kernel, measured by bench_decode --quick
 * (fraction of the read bandwidth, back to back, 2 threads):
 *   AMD EPYC family 26 model 2 (Zen 5): nta and t0 alike on the summary
 *     (0.748 / 0.777 against 0.766 / 0.785) and at G = 1, 4, 8; nta ahead
 *     on the SmolLM2 shape (G = 3, d = 64: 0.739 / 0.745 against 0.695 /
 *     0.702), so nta;
 *   Intel Xeon family 6 model 207 (Emerald Rapids), as a user measured it:
 *     nta halved the speed (summary 0.43 against 0.80 with t0).
 * Any other CPU takes t0, the hint that never starves the loads. */
#define FG_EXPERIMENTAL /* FG_ADAPTIVE_*, fg_cpu_describe (fastgen.h) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels_cpu/kernels_cpu.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

typedef struct tuning_row {
    const char *vendor;
    int family; /* -1: any */
    fg_pf_locality pf;
    const char *source;
} tuning_row;

static const tuning_row k_rows[] = {
    {"AuthenticAMD", 26, FG_PF_NTA, "table: AMD family 26 (Zen 5), measured"},
    {"GenuineIntel", 6, FG_PF_T0, "table: Intel family 6, measured on Emerald Rapids"},
};

fg_cpu_tuning fg_cpu_tuning_detect(void) {
    fg_cpu_tuning t = {FG_PF_T0, "unknown CPU", "default: no table row for this CPU"};
    char vendor[13] = "";
    int family = -1, model = -1;
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, c, d;
    if (__get_cpuid(0, &a, &b, &c, &d)) {
        memcpy(vendor, &b, 4);
        memcpy(vendor + 4, &d, 4);
        memcpy(vendor + 8, &c, 4);
        vendor[12] = '\0';
    }
    if (__get_cpuid(1, &a, &b, &c, &d)) {
        const int base = (int)(a >> 8) & 0xf, ext = (int)(a >> 20) & 0xff;
        family = base == 0xf ? base + ext : base;
        model = (int)(a >> 4) & 0xf;
        if (base == 0x6 || base == 0xf)
            model |= (int)((a >> 16) & 0xf) << 4;
    }
    snprintf(t.cpu, sizeof t.cpu, "%s family %d model %d", vendor[0] ? vendor : "x86", family, model);
#endif
    for (size_t i = 0; i < sizeof k_rows / sizeof k_rows[0]; i++)
        if (!strcmp(vendor, k_rows[i].vendor) && (k_rows[i].family < 0 || k_rows[i].family == family)) {
            t.pf_locality = k_rows[i].pf;
            t.source = k_rows[i].source;
            break;
        }
    const char *env = getenv("FASTGEN_PF_LOCALITY");
    if (env && (!strcmp(env, "nta") || !strcmp(env, "0"))) {
        t.pf_locality = FG_PF_NTA;
        t.source = "FASTGEN_PF_LOCALITY";
    } else if (env && (!strcmp(env, "t0") || !strcmp(env, "3"))) {
        t.pf_locality = FG_PF_T0;
        t.source = "FASTGEN_PF_LOCALITY";
    }
    return t;
}

fg_status fg_cpu_describe(char *buf, size_t size) {
    if (!buf || size == 0)
        return FG_ERR_INVALID_ARGUMENT;
    const fg_cpu_tuning t = fg_cpu_tuning_detect();
    snprintf(buf, size, "%s; isa %s; decode prefetch %s (%s)", t.cpu, fg_cpu_isa_name(fg_cpu_features_get().isa),
             t.pf_locality == FG_PF_NTA ? "nta" : "t0", t.source);
    return FG_OK;
}
