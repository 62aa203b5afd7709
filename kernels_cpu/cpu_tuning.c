/* The cpu backend's tuning (fg_cpu_tuning in kernels_cpu.h): the decode
 * kernel's prefetch hint, measured on this machine rather than looked up by
 * CPU model.
 *
 * The hint changes no result, only the speed, and which is faster depends
 * on the cache hierarchy: a tie on one CPU, half the speed on another
 * (docs/results.md, "Decode prefetch hint"). So each backend times its
 * first large decode steps with
 * both (kernels_cpu.h: which steps, how many, in what order), compares the
 * median seconds per byte (a step that lost its core to another process
 * moves a median little), keeps nta only when it is at least 3 % faster
 * and t0, which never starves the loads, otherwise and until then, and
 * publishes the choice for the process: later backends, and those still
 * probing, take it. FASTGEN_PF_LOCALITY=nta|t0 fixes it. */
#define FG_EXPERIMENTAL /* FG_ADAPTIVE_*, fg_cpu_describe (fastgen.h) */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels_cpu/kernels_cpu.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

/* The process's measured hint: 0 until a backend has measured it, else 1 + the fg_pf_locality. */
static _Atomic int g_measured;

/* t takes the process's measured hint (g_measured's value, not 0). */
static void take_measured(fg_cpu_tuning *t, int measured) {
    t->pf_locality = (fg_pf_locality)(measured - 1);
    t->source = "measured by this process's first large decode steps";
    t->fixed = 1;
}

fg_cpu_tuning fg_cpu_tuning_detect(void) {
    fg_cpu_tuning t = {FG_PF_T0, "unknown CPU", "until the first large decode steps measure it against nta", 0};
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
    const int measured = atomic_load(&g_measured);
    if (measured)
        take_measured(&t, measured);
    const char *env = getenv("FASTGEN_PF_LOCALITY");
    if (env && (!strcmp(env, "nta") || !strcmp(env, "0"))) {
        t.pf_locality = FG_PF_NTA;
        t.source = "FASTGEN_PF_LOCALITY";
        t.fixed = 1;
    } else if (env && (!strcmp(env, "t0") || !strcmp(env, "3"))) {
        t.pf_locality = FG_PF_T0;
        t.source = "FASTGEN_PF_LOCALITY";
        t.fixed = 1;
    }
    return t;
}

fg_pf_locality fg_cpu_pf_probe_step(fg_cpu_tuning *t, fg_pf_probe *p) {
    if (t->fixed)
        return t->pf_locality;
    const int measured = atomic_load(&g_measured);
    if (measured) { /* another backend of this process finished first */
        take_measured(t, measured);
        return t->pf_locality;
    }
    if (p->skipped < FG_PF_PROBE_SKIP)
        return t->pf_locality;
    const int32_t k = p->steps[0] + p->steps[1]; /* nta, t0, t0, nta, nta, t0, ...: 24 each after 48 */
    return ((k + 1) / 2) % 2 == 0 ? FG_PF_NTA : FG_PF_T0;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

fg_pf_locality fg_cpu_pf_choose(fg_pf_probe *p) {
    double med[2];
    for (int i = 0; i < 2; i++) {
        const int32_t n = p->steps[i] < FG_PF_PROBE_STEPS ? p->steps[i] : FG_PF_PROBE_STEPS;
        if (n == 0)
            return FG_PF_T0;
        qsort(p->per_byte[i], (size_t)n, sizeof p->per_byte[i][0], cmp_double);
        med[i] = n % 2 ? p->per_byte[i][n / 2] : 0.5 * (p->per_byte[i][n / 2 - 1] + p->per_byte[i][n / 2]);
    }
    return med[0] <= 0.97 * med[1] ? FG_PF_NTA : FG_PF_T0;
}

void fg_cpu_pf_probe_record(fg_cpu_tuning *t, fg_pf_probe *p, fg_pf_locality pf, double seconds, double bytes) {
    if (t->fixed)
        return;
    if (p->skipped < FG_PF_PROBE_SKIP) {
        p->skipped++;
        return;
    }
    const int i = pf == FG_PF_NTA ? 0 : 1;
    if (p->steps[i] < FG_PF_PROBE_STEPS && bytes > 0.0)
        p->per_byte[i][p->steps[i]++] = seconds / bytes;
    if (p->steps[0] < FG_PF_PROBE_STEPS || p->steps[1] < FG_PF_PROBE_STEPS)
        return;
    int expected = 0;
    atomic_compare_exchange_strong(&g_measured, &expected, 1 + fg_cpu_pf_choose(p));
    take_measured(t, atomic_load(&g_measured)); /* the first backend's choice, if another won */
}

void fg_cpu_pf_forget(void) { atomic_store(&g_measured, 0); }

fg_status fg_cpu_describe(char *buf, size_t size) {
    if (!buf || size == 0)
        return FG_ERR_INVALID_ARGUMENT;
    const fg_cpu_tuning t = fg_cpu_tuning_detect();
    snprintf(buf, size, "%s; isa %s; decode prefetch %s (%s)", t.cpu, fg_cpu_isa_name(fg_cpu_features_get().isa),
             t.pf_locality == FG_PF_NTA ? "nta" : "t0", t.source);
    return FG_OK;
}
