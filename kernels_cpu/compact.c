/* Compaction on the CPU: a streaming gather of the kept prompt rows into
 * pages, parallel over spans of the prompt; large compactions write their
 * rows with non-temporal stores where aligned, 16-bit caches convert 8 values at a
 * time (F16C for fp16, integer rounding for bf16), and q8_0 / q4_0 blocks
 * quantize 8 values at a time, all bit-identical to the scalar path (their
 * target allows FMA, but ISO C mode, c_std=c11, keeps GCC from contracting a
 * multiply and an add into one). */
#include <math.h>
#include <string.h>

#include "kernels_cpu/kernels_cpu.h"
#include "common/slots.h"

#include "kernels_cpu/simd.h"

#if defined(__x86_64__)

/* 8 fp32 -> 8 fp16, round to nearest even (F16C); NaN stays NaN */
FG_SIMD_AVX2_TARGET static inline __m128i f16x8(const float *src) {
    return _mm256_cvtps_ph(_mm256_loadu_ps(src), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

/* 8 fp32 -> 8 bf16: add 0x7fff + the kept lsb, keep the high half; NaN -> quiet NaN */
FG_SIMD_AVX2_TARGET static inline __m128i bf16x8(const float *src) {
    __m256i x = _mm256_castps_si256(_mm256_loadu_ps(src));
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(x, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
    __m256i nan =
        _mm256_cmpgt_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
    __m256i q = _mm256_or_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(0x40));
    r = _mm256_blendv_epi8(r, q, nan);
    /* pack the low 16 bits of 8 lanes */
    __m256i packed = _mm256_packus_epi32(r, r); /* lanes 0-3 and 4-7 in each 128-bit half */
    return _mm256_castsi256_si128(_mm256_permute4x64_epi64(packed, 0x08));
}

FG_SIMD_AVX2_TARGET static void store_f16_avx2(uint16_t *dst, const float *src, int32_t n) {
    int32_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(void *)(dst + i), f16x8(src + i));
    for (; i < n; i++)
        dst[i] = fg_f32_to_f16(src[i]);
}

FG_SIMD_AVX2_TARGET static void store_bf16_avx2(uint16_t *dst, const float *src, int32_t n) {
    int32_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(void *)(dst + i), bf16x8(src + i));
    for (; i < n; i++)
        dst[i] = fg_f32_to_bf16(src[i]);
}

/* The largest |x| of a block of qb (a multiple of 8) values; NaN ignored, as
 * the scalar loop's comparisons do (max_ps returns its second operand when
 * the first is NaN). */
FG_SIMD_AVX2_TARGET static inline float block_amax(const float *x, int32_t qb) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_setzero_ps();
    for (int32_t j = 0; j < qb; j += 8)
        m = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)), m);
    return fg_hmax256(m);
}

/* The scale as fp16 (F16C rounds to nearest even as fg_f32_to_f16 does; a
 * scale is never NaN, the one input where the two may differ). */
FG_SIMD_AVX2_TARGET static inline void put_scale(unsigned char *dst, float scale) {
    fg_put_f16(dst, (uint16_t)_cvtss_sh(scale, _MM_FROUND_TO_NEAREST_INT));
}

/* fg_quantize_q8_0, 8 values at a time, the same bytes: roundf (halves away
 * from zero) as truncation plus a step where the remainder is >= 0.5. */
FG_SIMD_AVX2_TARGET static void quantize_q8_0_avx2(unsigned char *dst, const float *x,
                                                                    int32_t qb) {
    const float scale = block_amax(x, qb) / 127.0f, inv = scale != 0.0f ? 1.0f / scale : 0.0f;
    put_scale(dst, scale);
    const __m256 sign = _mm256_set1_ps(-0.0f), half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f);
    const __m256 lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f), vinv = _mm256_set1_ps(inv);
    for (int32_t j = 0; j < qb; j += 8) {
        const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + j), vinv);
        const __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
        const __m256 up = _mm256_cmp_ps(_mm256_andnot_ps(sign, _mm256_sub_ps(v, t)), half, _CMP_GE_OQ);
        __m256 r = _mm256_add_ps(t, _mm256_and_ps(up, _mm256_or_ps(_mm256_and_ps(v, sign), one)));
        const __m256 ok = _mm256_and_ps(_mm256_cmp_ps(r, lo, _CMP_GE_OQ), _mm256_cmp_ps(r, hi, _CMP_LE_OQ));
        r = _mm256_and_ps(r, ok); /* out of range or NaN: 0 */
        const __m256i q = _mm256_cvttps_epi32(r);
        const __m128i q16 = _mm_packs_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1));
        _mm_storel_epi64((__m128i *)(void *)(dst + 2 + j), _mm_packs_epi16(q16, q16));
    }
}

/* fg_quantize_q4_0, 8 values at a time, the same bytes. */
FG_SIMD_AVX2_TARGET static void quantize_q4_0_avx2(unsigned char *dst, const float *x,
                                                                    int32_t qb) {
    const float amax = block_amax(x, qb);
    float max = 0.0f; /* all zero (or NaN): 0, as the scalar loop leaves it */
    for (int32_t j = 0; amax > 0.0f && j < qb; j++) /* the first value of largest magnitude, with its sign */
        if (fabsf(x[j]) == amax) {
            max = x[j];
            break;
        }
    const float scale = max / -8.0f, inv = scale != 0.0f ? 1.0f / scale : 0.0f;
    put_scale(dst, scale);
    const __m256 vinv = _mm256_set1_ps(inv), off = _mm256_set1_ps(8.5f), zero = _mm256_setzero_ps();
    const __m256 sixteen = _mm256_set1_ps(16.0f);
    int32_t nib[32];
    for (int32_t j = 0; j < qb; j += 8) {
        const __m256 a = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(x + j), vinv), off);
        const __m256 in = _mm256_and_ps(_mm256_cmp_ps(a, zero, _CMP_GE_OQ), _mm256_cmp_ps(a, sixteen, _CMP_LT_OQ));
        const __m256 top = _mm256_cmp_ps(a, sixteen, _CMP_GE_OQ);
        const __m256i t = _mm256_cvttps_epi32(_mm256_and_ps(a, in)); /* 0 outside [0, 16) */
        __m256i q = _mm256_blendv_epi8(_mm256_set1_epi32(8), t, _mm256_castps_si256(in));
        q = _mm256_blendv_epi8(q, _mm256_set1_epi32(15), _mm256_castps_si256(top));
        _mm256_storeu_si256((__m256i *)(void *)(nib + j), q);
    }
    for (int32_t j = 0; j < qb / 2; j++)
        dst[2 + j] = (unsigned char)(nib[j] | nib[j + qb / 2] << 4);
}

FG_SIMD_AVX2_TARGET static void quantize_row_avx2(unsigned char *dst, fg_dtype dtype, const float *src,
                                                              int32_t n) {
    const int32_t qb = fg_qblock(n);
    const size_t bb = fg_qblock_bytes(dtype, qb);
    for (int32_t b = 0; b < n / qb; b++) {
        if (dtype == FG_DTYPE_Q8_0)
            quantize_q8_0_avx2(dst + (size_t)b * bb, src + (size_t)b * qb, qb);
        else
            quantize_q4_0_avx2(dst + (size_t)b * bb, src + (size_t)b * qb, qb);
    }
}

/* A whole row with non-temporal stores (n % 8 == 0, dst aligned to 32 bytes
 * for fp32 and 16 for 16-bit rows): a large compaction writes far more than
 * the caches hold, so skipping the read-for-ownership of every written line
 * saves up to a third of the memory traffic. The caller fences. */
FG_SIMD_AVX2_TARGET static void stream_row_avx2(void *dst, fg_dtype dtype, const float *src,
                                                                 int32_t n) {
    for (int32_t i = 0; i < n; i += 8) {
        if (dtype == FG_DTYPE_F32)
            _mm256_stream_ps((float *)dst + i, _mm256_loadu_ps(src + i));
        else
            _mm_stream_si128((__m128i *)(void *)((uint16_t *)dst + i),
                             dtype == FG_DTYPE_F16 ? f16x8(src + i) : bf16x8(src + i));
    }
}
#endif

typedef enum store_mode { STORE_SCALAR, STORE_SIMD, STORE_STREAM } store_mode;

static void store_row(void *dst, fg_dtype dtype, const float *src, int32_t n, store_mode mode) {
#if defined(__x86_64__)
    if (fg_dtype_quantized(dtype) && mode != STORE_SCALAR) {
        quantize_row_avx2(dst, dtype, src, n);
        return;
    }
    const uintptr_t align = dtype == FG_DTYPE_F32 ? 32 : 16;
    if (mode == STORE_STREAM && n % 8 == 0 && (uintptr_t)dst % align == 0) {
        stream_row_avx2(dst, dtype, src, n);
        return;
    }
    if (mode != STORE_SCALAR && dtype == FG_DTYPE_F16) {
        store_f16_avx2(dst, src, n);
        return;
    }
    if (mode != STORE_SCALAR && dtype == FG_DTYPE_BF16) {
        store_bf16_avx2(dst, src, n);
        return;
    }
#endif
    (void)mode;
    fg_store_row(dst, dtype, src, n);
}

/* First index of sorted[0..n) whose value is >= x. */
static int32_t lower_bound(const int32_t *sorted, int32_t n, int32_t x) {
    int32_t lo = 0, hi = n;
    while (lo < hi) {
        int32_t mid = lo + (hi - lo) / 2;
        if (sorted[mid] < x)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

#define FG_COMPACT_SPAN 64 /* prompt positions per work item: [span][Hkv][d] rows stay in L2 */

/* One item: the kept rows of every head among FG_COMPACT_SPAN positions. */
typedef struct compact_job {
    const fg_page_layout *L;
    const fg_shape *shape;
    const float *k, *v;
    int32_t n_heads;
    const fg_compact_head *heads;
    store_mode mode;
} compact_job;

static void compact_span(void *arg, int32_t span, int32_t thread) {
    (void)thread;
    const compact_job *jb = arg;
    const fg_page_layout *L = jb->L;
    const int32_t Hkv = jb->shape->n_kv_heads, d = jb->shape->head_dim, P = L->page_tokens, n_heads = jb->n_heads;
    const size_t k_row_bytes = L->k_row_bytes, v_row_bytes = L->v_row_bytes;
    const float *k = jb->k, *v = jb->v;
    const fg_compact_head *heads = jb->heads;
    const store_mode mode = jb->mode;
    const int32_t p0 = span * FG_COMPACT_SPAN, p1 = p0 + FG_COMPACT_SPAN;
    for (int32_t i = 0; i < n_heads; i++) {
        const fg_compact_head *hd = &heads[i];
        const int32_t *from = hd->src ? hd->src : hd->pos; /* rows of k / v, ascending */
        const int32_t s0 = lower_bound(from, hd->n_keep, p0), s1 = lower_bound(from, hd->n_keep, p1);
        for (int32_t s = s0; s < s1; s++) {
            unsigned char *page = hd->pages[s / P], *meta = hd->meta[s / P];
            const int32_t j = s % P;
            const size_t src = ((size_t)from[s] * Hkv + hd->kv_head) * d;
            store_row(page + L->k_offset + (size_t)j * k_row_bytes, L->k_dtype, k + src, d, mode); /* row s */
            store_row(page + L->v_offset + (size_t)j * v_row_bytes, L->v_dtype, v + src, d, mode);
            ((int32_t *)(void *)(meta + L->pos_offset))[j] = hd->pos[s];
            ((float *)(void *)(meta + L->score_offset))[j] = hd->score[s];
            ((int32_t *)(void *)(meta + L->row_offset))[j] = s;
            meta[L->flags_offset + j] = hd->flags[s];
        }
    }
#if defined(__x86_64__)
    if (mode == STORE_STREAM) /* the streamed rows are visible to every thread from here */
        _mm_sfence();
#endif
}

fg_status fg_cpu_compact(fg_backend *be, const fg_page_layout *L, const fg_shape *shape, int32_t n,
                         const float *k, /* [n][Hkv][d] */
                         const float *v, /* [n][Hkv][d] */
                         int32_t n_heads, const fg_compact_head *heads) {
    const fg_cpu_state *st = be->impl;
    size_t written = 0;
    for (int32_t i = 0; i < n_heads; i++)
        written += (size_t)heads[i].n_keep * (L->k_row_bytes + L->v_row_bytes);
    const store_mode mode = st->isa < FG_ISA_AVX2            ? STORE_SCALAR
                            : written >= FG_CPU_STREAM_BYTES ? STORE_STREAM
                                                             : STORE_SIMD;
    const int32_t n_spans = (n + FG_COMPACT_SPAN - 1) / FG_COMPACT_SPAN;
    /* work items walk the rows of k / v in order; every head takes its kept
     * rows of the span (they are ascending), so the span is read from memory once */
    const compact_job job = {L, shape, k, v, n_heads, heads, mode};
    fg_threadpool_run(be->threads, n_spans, compact_span, (void *)&job);
    return FG_OK;
}
