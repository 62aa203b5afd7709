/*
 * The one CPU feature probe. Every CPU op (decode, prefill, profiling, the
 * model's matrix products) asks fg_cpu_features_get() which instruction set to
 * run; FG_CPU_ISA=generic|avx2|avx512 in the environment asks for less
 * (never more than the CPU has), for every op alike.
 *
 * Header-only: the library and the model library each include it. The probe
 * runs once per translation unit that asks (CPUID is slow: in a virtual
 * machine it traps to the hypervisor) and every thread computes the same.
 */
#ifndef FG_CPU_FEATURES_H
#define FG_CPU_FEATURES_H

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#define FG_X86 1
#endif

typedef enum fg_cpu_isa { FG_ISA_GENERIC = 0, FG_ISA_AVX2 = 1, FG_ISA_AVX512 = 2, FG_ISA_AVX512_BF16 = 3 } fg_cpu_isa;

typedef struct fg_cpu_features {
    fg_cpu_isa isa; /* the best level the kernels may use: AVX2 = AVX2 + FMA; AVX-512 = F, BW, VL, DQ;
                       AVX512_BF16 adds vdpbf16ps */
    int f16c;       /* F16C, at the AVX2 level or above */
    int vnni;       /* AVX-512 VNNI on 256-bit vectors, at the AVX-512 level or above */
} fg_cpu_features;

static inline fg_cpu_features fg_cpu_features_probe(void) {
    fg_cpu_features f = {FG_ISA_GENERIC, 0, 0};
#ifdef FG_X86
    unsigned a, b, c, d;
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        f.isa = FG_ISA_AVX2;
        /* CPUID leaf 1 ECX bit 29 (F16C), leaf 7 ECX bit 11 (VNNI), leaf 7.1 EAX bit 5 (BF16):
           not every compiler's __builtin_cpu_supports knows them (clang 14 knows none) */
        f.f16c = __get_cpuid(1, &a, &b, &c, &d) && (c >> 29 & 1u);
    }
    if (f.isa == FG_ISA_AVX2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
        f.isa = FG_ISA_AVX512;
        f.vnni = __get_cpuid_count(7, 0, &a, &b, &c, &d) && (c >> 11 & 1u);
        if (__get_cpuid_count(7, 1, &a, &b, &c, &d) && (a >> 5 & 1u))
            f.isa = FG_ISA_AVX512_BF16;
    }
#endif
    const char *want = getenv("FG_CPU_ISA");
    const fg_cpu_isa cap = !want                      ? f.isa
                           : !strcmp(want, "generic") ? FG_ISA_GENERIC
                           : !strcmp(want, "avx2")    ? FG_ISA_AVX2
                           : !strcmp(want, "avx512")  ? FG_ISA_AVX512
                                                      : f.isa;
    if (cap < f.isa)
        f.isa = cap;
    if (f.isa < FG_ISA_AVX2)
        f.f16c = 0;
    if (f.isa < FG_ISA_AVX512)
        f.vnni = 0;
    return f;
}

/* The features, probed on the first call. */
static inline fg_cpu_features fg_cpu_features_get(void) {
    static _Atomic int cached = -1; /* isa | f16c << 4 | vnni << 5 */
    int v = atomic_load_explicit(&cached, memory_order_relaxed);
    if (v < 0) {
        const fg_cpu_features f = fg_cpu_features_probe();
        v = (int)f.isa | f.f16c << 4 | f.vnni << 5;
        atomic_store_explicit(&cached, v, memory_order_relaxed);
    }
    const fg_cpu_features f = {(fg_cpu_isa)(v & 15), v >> 4 & 1, v >> 5 & 1};
    return f;
}

static inline const char *fg_cpu_isa_name(fg_cpu_isa isa) {
    return isa == FG_ISA_AVX512_BF16 ? "avx512-bf16"
           : isa == FG_ISA_AVX512    ? "avx512"
           : isa == FG_ISA_AVX2      ? "avx2"
                                     : "generic";
}

#endif /* FG_CPU_FEATURES_H */
