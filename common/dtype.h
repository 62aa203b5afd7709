/*
 * The cache's storage types: fp16 / bf16 <-> fp32 conversions (round to
 * nearest even) and the q8_0 / q4_0 blocks, portable C. Shared by every
 * backend (host and device) and the tests; accumulation is always fp32.
 */
#ifndef FG_DTYPE_H
#define FG_DTYPE_H

#include <math.h>
#include <stddef.h>
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

/* ---------------------------------------------------------------- q8_0 / q4_0 */

FG_HD static inline int fg_dtype_quantized(fg_dtype dtype) {
    return dtype == FG_DTYPE_Q8_0 || dtype == FG_DTYPE_Q4_0;
}

/* Values per quantization block of a row of d values (see fg_dtype in
 * fastgen.h): 32, 16 or 8, the largest that divides d; 0 when none does. */
FG_HD static inline int32_t fg_qblock(int32_t d) {
    return d % 32 == 0 ? 32 : d % 16 == 0 ? 16 : d % 8 == 0 ? 8 : 0;
}

/* Bytes of one block of qb values: the fp16 scale, then the values. */
FG_HD static inline size_t fg_qblock_bytes(fg_dtype dtype, int32_t qb) {
    return 2 + (size_t)(dtype == FG_DTYPE_Q8_0 ? qb : qb / 2);
}

/* Bytes of a cached row of d values (0 when the dtype cannot hold it). */
FG_HD static inline size_t fg_row_bytes(fg_dtype dtype, int32_t d) {
    switch (dtype) {
    case FG_DTYPE_F32:
        return (size_t)d * 4;
    case FG_DTYPE_F16:
    case FG_DTYPE_BF16:
        return (size_t)d * 2;
    case FG_DTYPE_Q8_0:
    case FG_DTYPE_Q4_0: {
        const int32_t qb = fg_qblock(d);
        return qb ? (size_t)(d / qb) * fg_qblock_bytes(dtype, qb) : 0;
    }
    }
    return 0;
}

FG_HD static inline void fg_put_f16(unsigned char *p, uint16_t h) { memcpy(p, &h, sizeof h); }
FG_HD static inline float fg_get_f16(const unsigned char *p) {
    uint16_t h;
    memcpy(&h, p, sizeof h);
    return fg_f16_to_f32(h);
}

/* One q8_0 block of qb values, as ggml's quantize_row_q8_0_ref: scale
 * max|x| / 127, each value rounded to nearest (halves away from zero). A NaN
 * stores 0 and does not enter the scale; an inf, or a magnitude past fp16's
 * range times 127, makes the fp16 scale inf and the block reads back as
 * inf / NaN, as in ggml (no int8 conversion is ever undefined here).
 * fg_q8_0_scale: the block's scale before its fp16 rounding, and in *inv
 * the factor fg_q8_0_int rounds each value with (the cache's rows and the
 * query of a quantized K round through these two). */
FG_HD static inline float fg_q8_0_scale(const float *x, int32_t qb, float *inv) {
    float amax = 0.0f;
    for (int32_t j = 0; j < qb; j++)
        amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
    const float scale = amax / 127.0f;
    *inv = scale != 0.0f ? 1.0f / scale : 0.0f;
    return scale;
}
FG_HD static inline int fg_q8_0_int(float x, float inv) {
    const float q = roundf(x * inv);
    return (int)(q >= -127.0f && q <= 127.0f ? q : 0.0f);
}
FG_HD static inline void fg_quantize_q8_0(unsigned char *dst, const float *x, int32_t qb) {
    float inv;
    fg_put_f16(dst, fg_f32_to_f16(fg_q8_0_scale(x, qb, &inv)));
    for (int32_t j = 0; j < qb; j++)
        ((int8_t *)(dst + 2))[j] = (int8_t)fg_q8_0_int(x[j], inv);
}

/* The query that cached rows of a quantized K are dotted with
 * (docs/design.md §3.1): each block of fg_qblock(d) values rounded to q8_0
 * as fg_quantize_q8_0 rounds it (ggml's vec_dot_type of q8_0 and q4_0 rows,
 * what llama.cpp's CPU attention dots them with), so a backend may dot the
 * two in integers. A block with a value that is not finite, or whose fp16
 * scale overflows, is left as it is.
 *
 * fg_query_q8_block: 1 when the qb values at x round, with *inv the factor
 * fg_q8_0_int rounds a value with and *scale the block's fp16 scale as a
 * float; 0 when the block stays as it is. */
FG_HD static inline int fg_query_q8_block(const float *x, int32_t qb, float *inv, float *scale) {
    for (int32_t j = 0; j < qb; j++)
        if (!(fabsf(x[j]) <= 3.402823466e38f)) /* inf or NaN */
            return 0;
    *scale = fg_f16_to_f32(fg_f32_to_f16(fg_q8_0_scale(x, qb, inv)));
    return *scale <= 65504.0f;
}
/* A query row x of d values rounded as above into dst, block by block. */
FG_HD static inline void fg_query_q8_row(float *dst, const float *x, int32_t d) {
    const int32_t qb = fg_qblock(d);
    for (int32_t j = 0; !qb && j < d; j++) /* no block size (d % 8 != 0: no quantized cache takes it): as given */
        dst[j] = x[j];
    for (int32_t b = 0; qb && b < d / qb; b++) {
        float inv, scale;
        const int rounds = fg_query_q8_block(x + b * qb, qb, &inv, &scale);
        for (int32_t j = b * qb; j < (b + 1) * qb; j++)
            dst[j] = rounds ? (float)fg_q8_0_int(x[j], inv) * scale : x[j];
    }
}

/* a * b rounded once, never fused into a following add (device compilers
 * contract by default; the host build, ISO C11, does not: a build with
 * -ffp-contract=fast and FMA could quantize q4_0 differently from the
 * device): every backend quantizes to the same bytes. */
FG_HD static inline float fg_mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}

/* A q4_0 value: min(15, trunc(y + 8.5)) as ggml; 8 (that is, 0) for a NaN. */
FG_HD static inline unsigned fg_q4_nibble(float y) {
    const float a = y + 8.5f;
    return a >= 0.0f && a < 16.0f ? (unsigned)a : a >= 16.0f ? 15u : 8u;
}

/* One q4_0 block of qb values, as ggml's quantize_row_q4_0_ref: the value of
 * largest magnitude, with its sign, maps to -8; q = min(15, trunc(x / scale
 * + 8.5)). A NaN stores 8 (that is, 0); an inf makes the scale inf, as in
 * q8_0. */
FG_HD static inline void fg_quantize_q4_0(unsigned char *dst, const float *x, int32_t qb) {
    float amax = 0.0f, max = 0.0f;
    for (int32_t j = 0; j < qb; j++)
        if (amax < fabsf(x[j])) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    const float scale = max / -8.0f, inv = scale != 0.0f ? 1.0f / scale : 0.0f;
    fg_put_f16(dst, fg_f32_to_f16(scale));
    const int32_t half = qb / 2;
    for (int32_t j = 0; j < half; j++)
        dst[2 + j] = (unsigned char)(fg_q4_nibble(fg_mul_rn(x[j], inv)) | fg_q4_nibble(fg_mul_rn(x[j + half], inv)) << 4);
}

/* Value j of a quantized block of qb values before its scale: q (q8_0), or
 * q - 8 (q4_0: the low nibble of byte j, or the high one of byte j - qb / 2).
 * Every reader of quantized rows, host and device, goes through it. */
FG_HD static inline int fg_qvalue(const unsigned char *blk, fg_dtype dtype, int32_t qb, int32_t j) {
    if (dtype == FG_DTYPE_Q8_0)
        return ((const int8_t *)(blk + 2))[j];
    const int32_t half = qb / 2;
    return (j < half ? (blk[2 + j] & 0x0f) : (blk[2 + j - half] >> 4)) - 8;
}

/* Value i of a quantized row of d values (the plain definition: q * scale). */
FG_HD static inline float fg_load_quant(const unsigned char *row, fg_dtype dtype, int32_t d, int32_t i) {
    const int32_t qb = fg_qblock(d);
    const unsigned char *blk = row + (size_t)(i / qb) * fg_qblock_bytes(dtype, qb);
    return (float)fg_qvalue(blk, dtype, qb, i % qb) * fg_get_f16(blk);
}

/* ---------------------------------------------------------------- rows */

/* Store a row of n floats as dtype at dst (quantized dtypes: n is the head
 * dimension, cut into fg_qblock(n) blocks). */
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
    case FG_DTYPE_Q8_0:
    case FG_DTYPE_Q4_0: {
        const int32_t qb = fg_qblock(n);
        const size_t bb = fg_qblock_bytes(dtype, qb);
        for (int32_t b = 0; b < n / qb; b++) {
            unsigned char *blk = (unsigned char *)dst + (size_t)b * bb;
            if (dtype == FG_DTYPE_Q8_0)
                fg_quantize_q8_0(blk, src + (size_t)b * qb, qb);
            else
                fg_quantize_q4_0(blk, src + (size_t)b * qb, qb);
        }
        break;
    }
    }
}

/* Element i of a row of d values stored as dtype. */
FG_HD static inline float fg_load_elem(const void *row, fg_dtype dtype, int32_t d, int32_t i) {
    switch (dtype) {
    case FG_DTYPE_F16:
        return fg_f16_to_f32(((const uint16_t *)row)[i]);
    case FG_DTYPE_BF16:
        return fg_bf16_to_f32(((const uint16_t *)row)[i]);
    case FG_DTYPE_Q8_0:
    case FG_DTYPE_Q4_0:
        return fg_load_quant((const unsigned char *)row, dtype, d, i);
    case FG_DTYPE_F32:
    default:
        return ((const float *)row)[i];
    }
}

/* Round-trip a value through a per-value dtype (what the cache will hand
 * back); quantized dtypes round whole blocks, see fg_store_row. */
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
