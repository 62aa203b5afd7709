/*
 * fp16 / bf16 <-> fp32 conversions (round to nearest even), portable C.
 * Shared by the CPU kernels and the tests; accumulation is always fp32.
 */
#ifndef FG_DTYPE_H
#define FG_DTYPE_H

#include <stdint.h>
#include <string.h>

#include "fastgen.h"

/* The conversions also run on GPUs (kernels_cuda/), bit-identical to the host. */
#if defined(__CUDACC__) || defined(__HIPCC__)
#define FG_HD __host__ __device__
#else
#define FG_HD
#endif

FG_HD static inline uint32_t fg_f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

FG_HD static inline float fg_bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

FG_HD static inline uint16_t fg_f32_to_f16(float f) {
    uint32_t x = fg_f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) /* inf or nan (quiet) */
        return (uint16_t)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0u));
    if (ax >= 0x477ff000u) /* rounds to >= 65520: overflow */
        return (uint16_t)(sign | 0x7c00u);
    if (ax < 0x38800000u) { /* below 2^-14: fp16 subnormal or zero */
        if (ax <= 0x33000000u) /* <= 2^-25 rounds to zero (ties to even) */
            return sign;
        uint32_t e = ax >> 23, m = (ax & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126u - e; /* 14..24 */
        uint32_t h = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (h & 1u)))
            h++;
        return (uint16_t)(sign | h);
    }
    uint32_t h = (ax - 0x38000000u) >> 13, rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u)))
        h++;
    return (uint16_t)(sign | h);
}

FG_HD static inline float fg_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) {
        float v = (float)m * 0x1p-24f;
        return sign ? -v : v;
    }
    if (e == 31)
        return fg_bits_f32(sign | 0x7f800000u | (m << 13));
    return fg_bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

FG_HD static inline uint16_t fg_f32_to_bf16(float f) {
    uint32_t x = fg_f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) /* nan stays a quiet nan */
        return (uint16_t)((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

FG_HD static inline float fg_bf16_to_f32(uint16_t b) { return fg_bits_f32((uint32_t)b << 16); }

/* Store n floats as dtype at dst. */
FG_HD static inline void fg_store_row(void *dst, fg_dtype dtype, const float *src, int32_t n) {
    switch (dtype) {
    case FG_DTYPE_F32:
        memcpy(dst, src, (size_t)n * sizeof(float));
        break;
    case FG_DTYPE_F16:
        for (int32_t i = 0; i < n; i++)
            ((uint16_t *)dst)[i] = fg_f32_to_f16(src[i]);
        break;
    case FG_DTYPE_BF16:
        for (int32_t i = 0; i < n; i++)
            ((uint16_t *)dst)[i] = fg_f32_to_bf16(src[i]);
        break;
    }
}

/* Element i of a row stored as dtype. */
FG_HD static inline float fg_load_elem(const void *row, fg_dtype dtype, int32_t i) {
    switch (dtype) {
    case FG_DTYPE_F16:
        return fg_f16_to_f32(((const uint16_t *)row)[i]);
    case FG_DTYPE_BF16:
        return fg_bf16_to_f32(((const uint16_t *)row)[i]);
    case FG_DTYPE_F32:
    default:
        return ((const float *)row)[i];
    }
}

/* Round-trip a value through dtype (what the cache will hand back). */
FG_HD static inline float fg_quantize(float x, fg_dtype dtype) {
    switch (dtype) {
    case FG_DTYPE_F16:
        return fg_f16_to_f32(fg_f32_to_f16(x));
    case FG_DTYPE_BF16:
        return fg_bf16_to_f32(fg_f32_to_bf16(x));
    case FG_DTYPE_F32:
    default:
        return x;
    }
}

#endif /* FG_DTYPE_H */
