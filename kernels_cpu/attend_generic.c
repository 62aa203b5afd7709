/* The attention kernel in portable C (attend_chunk.h): 8 lanes of a
 * compiler vector, for CPUs without AVX2 (and other architectures). */
#include "kernels_cpu/attend_chunk.h"

/* 8 lanes as a GCC/Clang vector: + - * work lane by lane (no FMA contraction in
 * ISO C), and the compiler maps it to whatever the target has (two SSE
 * registers on x86-64, NEON on AArch64). A struct of 8 floats did the same
 * lane by lane and took GCC 2.5 minutes to unroll. */
typedef float vec8 __attribute__((vector_size(32)));
static inline vec8 g_zero(void) { return (vec8){0}; }
static inline vec8 g_set1(float x) { return (vec8){x, x, x, x, x, x, x, x}; }
static inline vec8 g_load(const float *p) {
    vec8 r = g_zero();
    memcpy(&r, p, sizeof r);
    return r;
}
static inline void g_store(float *p, vec8 a) { memcpy(p, &a, sizeof a); }
static inline vec8 g_fma(vec8 a, vec8 b, vec8 c) { return c + a * b; }
static inline vec8 g_mul(vec8 a, vec8 b) { return a * b; }
static inline vec8 g_add(vec8 a, vec8 b) { return a + b; }
static inline vec8 g_sub(vec8 a, vec8 b) { return a - b; }
static inline vec8 g_exp(vec8 a) {
    for (int i = 0; i < 8; i++)
        a[i] = expf(a[i]);
    return a;
}
static inline vec8 g_max(vec8 a, vec8 b) {
    for (int i = 0; i < 8; i++)
        a[i] = b[i] > a[i] ? b[i] : a[i];
    return a;
}
static inline float g_hmax(vec8 a) {
    float m = a[0];
    for (int i = 1; i < 8; i++)
        m = a[i] > m ? a[i] : m;
    return m;
}
static inline float g_hsum(vec8 a) { return ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7])); }
static inline vec8 g_load_f16(const uint16_t *p) {
    vec8 r = g_zero();
    for (int i = 0; i < 8; i++)
        r[i] = fg_f16_to_f32(p[i]);
    return r;
}
static inline vec8 g_load_bf16(const uint16_t *p) {
    vec8 r = g_zero();
    for (int i = 0; i < 8; i++)
        r[i] = fg_bf16_to_f32(p[i]);
    return r;
}

/* Lanes c .. c + 7 of a quantized row (blocks of 2^qs values, c % 8 == 0)
 * whose block's scale is `scale`: q * scale, the plain definition
 * (fg_load_quant, through fg_qvalue). */
static inline vec8 g_load_q8(const unsigned char *p, int32_t c, int32_t qs, float scale) {
    const unsigned char *blk = p + (size_t)(c >> qs) * ((1u << qs) + 2);
    const int32_t o = c & ((1 << qs) - 1);
    vec8 r = g_zero();
    for (int i = 0; i < 8; i++)
        r[i] = (float)fg_qvalue(blk, FG_DTYPE_Q8_0, 1 << qs, o + i) * scale;
    return r;
}
static inline vec8 g_load_q4(const unsigned char *p, int32_t c, int32_t qs, float scale) {
    const int32_t o = c & ((1 << qs) - 1);
    const unsigned char *blk = p + (size_t)(c >> qs) * ((1u << (qs - 1)) + 2);
    vec8 r = g_zero();
    for (int i = 0; i < 8; i++)
        r[i] = (float)fg_qvalue(blk, FG_DTYPE_Q4_0, 1 << qs, o + i) * scale;
    return r;
}

#define ISAN generic
#define FG_TARGET
#define VW 8
#define VREGS 16
#define vec vec8
#define VZERO() g_zero()
#define VSET1(x) g_set1(x)
#define VLOAD(p) g_load(p)
#define VSTORE(p, v) g_store(p, v)
#define VFMA(a, b, c) g_fma(a, b, c)
#define VMUL(a, b) g_mul(a, b)
#define VSUB(a, b) g_sub(a, b)
#define VADD(a, b) g_add(a, b)
#define VEXP(v) g_exp(v)
#define VHSUM(v) g_hsum(v)
#define VMAX(a, b) g_max(a, b)
#define VHMAX(v) g_hmax(v)
#define VHSUM_ROWS(v, R, hn, s)                                                                                        \
    for (int i_ = 0; i_ < (R) * (hn); i_++)                                                                            \
    (s)[(i_ % (hn)) * FG_CPU_BLOCK + i_ / (hn)] = g_hsum((v)[i_])
#define VKEEP(v) (void)(v)
#define VLOAD_F16(p) g_load_f16(p)
#define VLOAD_BF16(p) g_load_bf16(p)
#define VLOAD_Q8(p, c, qs, s) g_load_q8(p, c, qs, s)
#define VLOAD_Q4(p, c, qs, s) g_load_q4(p, c, qs, s)
#define QSCALE(blk) fg_get_f16(blk)
#include "kernels_cpu/attend_chunk_dtypes.inc"
