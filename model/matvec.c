/* Few-row matrix products over weights in their stored type (model/matvec.h). */
#include "model/matvec.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "common/cpu_features.h"
#include "common/dtype.h"
#include "model/dequant.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#define QK 32
#define MAX_BLOCK 256 /* the largest block of any type (the K-quants) */

/* ------------------------------------------------------------ portable path */

/* One weight row against every activation row: the row is dequantized a few
 * blocks at a time (MAX_BLOCK values, or one block of the K-quants) into a
 * small buffer, never whole. */
static void dot_rows_generic(const unsigned char *w, const fgm_type_info *ti, const float *x, int32_t in, int32_t rows,
                             float *out) {
    float buf[MAX_BLOCK], acc[FGM_MATVEC_MAX_ROWS] = {0};
    const int32_t step = ti->block >= MAX_BLOCK ? ti->block : MAX_BLOCK / ti->block * ti->block;
    for (int32_t b0 = 0; b0 < in; b0 += step) {
        const int32_t n = in - b0 < step ? in - b0 : step; /* a multiple of the block, as in is */
        ti->to_float(w, buf, n);
        w += (size_t)(n / ti->block) * (size_t)ti->bytes;
        for (int32_t r = 0; r < rows; r++) {
            const float *xr = x + (size_t)r * in + b0;
            float s = 0.0f;
            for (int32_t j = 0; j < n; j++)
                s += buf[j] * xr[j];
            acc[r] += s;
        }
    }
    for (int32_t r = 0; r < rows; r++)
        out[r] = acc[r];
}

/* ------------------------------------------------------- AVX2 + FMA + F16C */

#if defined(__x86_64__)
#define FGM_AVX2 __attribute__((target("avx2,fma,f16c")))
#define FGM_AVX2_INLINE __attribute__((target("avx2,fma,f16c"), always_inline)) static inline

FGM_AVX2_INLINE float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

FGM_AVX2_INLINE float half(const unsigned char *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* 16 bytes of 4-bit quants as 32 floats in ggml's order (low nibbles are
 * values 0..15, high nibbles 16..31), each q * d + m. */
FGM_AVX2_INLINE void unpack_q4(const unsigned char *qs, __m256 d, __m256 m, __m256 w[4]) {
    const __m128i bytes = _mm_loadu_si128((const __m128i *)qs), low = _mm_set1_epi8(0x0F);
    const __m128i lo = _mm_and_si128(bytes, low), hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), low);
    w[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo)), d, m);
    w[1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8))), d, m);
    w[2] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi)), d, m);
    w[3] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8))), d, m);
}

/* 32 weights (w[0..4), at column off) into every row's four accumulators:
 * four chains per row, so one row alone still keeps the FMA units busy. */
FGM_AVX2_INLINE void fma_rows(const __m256 w[4], const float *x, int32_t in, int32_t off, int32_t rows,
                             __m256 acc[][4]) {
    for (int32_t r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * in + off;
        for (int k = 0; k < 4; k++)
            acc[r][k] = _mm256_fmadd_ps(w[k], _mm256_loadu_ps(xr + 8 * k), acc[r][k]);
    }
}

FGM_AVX2_INLINE void finish(__m256 acc[][4], int32_t rows, float *out) {
    for (int32_t r = 0; r < rows; r++)
        out[r] = hsum8(_mm256_add_ps(_mm256_add_ps(acc[r][0], acc[r][1]), _mm256_add_ps(acc[r][2], acc[r][3])));
}

/* One weight row of `type` against `rows` activation rows. Inlined into
 * dot_rows_avx2 twice, once with rows = 1, so the decode of one sequence
 * keeps its accumulators in registers. */
FGM_AVX2_INLINE void dot_rows_body(int32_t type, const unsigned char *w, const float *x, int32_t in, int32_t rows,
                                  float *out) {
    __m256 acc[FGM_MATVEC_MAX_ROWS][4], wv[4];
    for (int32_t r = 0; r < rows; r++)
        for (int k = 0; k < 4; k++)
            acc[r][k] = _mm256_setzero_ps();
    switch (type) {
    case FGM_GGML_Q4_0: /* f16 d; quants q: (q - 8) d */
        for (int32_t b = 0; b < in; b += QK, w += 18) {
            const float d = half(w);
            unpack_q4(w + 2, _mm256_set1_ps(d), _mm256_set1_ps(-8.0f * d), wv);
            fma_rows(wv, x, in, b, rows, acc);
        }
        break;
    case FGM_GGML_Q4_1: /* f16 d, f16 m; quants q: q d + m */
        for (int32_t b = 0; b < in; b += QK, w += 20) {
            unpack_q4(w + 4, _mm256_set1_ps(half(w)), _mm256_set1_ps(half(w + 2)), wv);
            fma_rows(wv, x, in, b, rows, acc);
        }
        break;
    case FGM_GGML_Q8_0: /* f16 d; 32 int8 quants q: q d */
        for (int32_t b = 0; b < in; b += QK, w += 34) {
            const __m256 d = _mm256_set1_ps(half(w));
            for (int k = 0; k < 4; k++) {
                const __m128i q = _mm_loadl_epi64((const __m128i *)(w + 2 + 8 * k));
                wv[k] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), d);
            }
            fma_rows(wv, x, in, b, rows, acc);
        }
        break;
    case FGM_GGML_F16:
        for (int32_t b = 0; b < in; b += QK, w += 2 * QK) {
            for (int k = 0; k < 4; k++)
                wv[k] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + 16 * k)));
            fma_rows(wv, x, in, b, rows, acc);
        }
        break;
    default: /* F32 */
        for (int32_t b = 0; b < in; b += QK, w += 4 * QK) {
            for (int k = 0; k < 4; k++)
                wv[k] = _mm256_loadu_ps((const float *)(const void *)(w + 32 * k));
            fma_rows(wv, x, in, b, rows, acc);
        }
        break;
    }
    finish(acc, rows, out);
}

FGM_AVX2 static void dot_rows_avx2(int32_t type, const unsigned char *w, const float *x, int32_t in, int32_t rows,
                                  float *out) {
    if (rows == 1)
        dot_rows_body(type, w, x, in, 1, out);
    else
        dot_rows_body(type, w, x, in, rows, out);
}

/* ---- ggml's scheme: activations quantized to 8 bits, integer dots */

/* 32 unsigned 4-bit quants as bytes, low nibbles (values 0..15) first. */
FGM_AVX2_INLINE __m256i nibbles32(const unsigned char *qs) {
    const __m128i b = _mm_loadu_si128((const __m128i *)qs);
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(b, 4), b), _mm256_set1_epi8(0x0F));
}

/* How far ahead in a decode step's weight rows the q8 kernels ask for the
 * cache line (a task's rows lie one after another, so the distance crosses
 * rows): on an AMD EPYC (Zen 3), two threads, it took SmolLM2's q8_0
 * classifier from 25-31 to 35-38 GB/s and left the q4_1 layers, bound by their
 * arithmetic there, as they were. One request per two blocks. */
#define Q8_PREFETCH 2048

/* block_scales loads an activation block's d and s as one pair */
_Static_assert(offsetof(fgm_q8_block, s) == sizeof(float), "fgm_q8_block: d and s adjacent");

/* maddubs + madd: exact here (no pair of products reaches 2^15) */
FGM_AVX2_INLINE __m256i dpbusd_avx2(__m256i acc, __m256i a, __m256i b) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1)));
}
#define Q8_TARGET FGM_AVX2
#define Q8_NAME(x) x##_avx2
#define Q8_DPBUSD dpbusd_avx2
#include "model/matvec_q8.inc"

/* AVX-512 VNNI on 256-bit vectors (Zen 4/5, Ice Lake and later Xeons): one
 * instruction for the four products and their sum */
#define FGM_VNNI __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512vnni")))
#define Q8_TARGET FGM_VNNI
#define Q8_NAME(x) x##_vnni
#define Q8_DPBUSD _mm256_dpbusd_epi32
#include "model/matvec_q8.inc"

/* What this CPU has (common/cpu_features.h, FG_CPU_ISA honoured): the f32
 * kernel needs AVX2, FMA and F16C; the VNNI one AVX-512 VNNI. */
static int have_avx2(void) {
    const fg_cpu_features f = fg_cpu_features_get();
    return f.isa >= FG_ISA_AVX2 && f.f16c;
}
static int have_vnni(void) { return fg_cpu_features_get().vnni && have_avx2(); }
#endif

/* Whether the vector kernel takes this type and width. */
static int vector_kernel(int32_t type, int64_t in) {
#if defined(__x86_64__)
    if (in % QK == 0 && have_avx2())
        return type == FGM_GGML_Q4_0 || type == FGM_GGML_Q4_1 || type == FGM_GGML_Q8_0 || type == FGM_GGML_F16 ||
               type == FGM_GGML_F32;
#else
    (void)type;
    (void)in;
#endif
    return 0;
}

int fgm_matvec_quantizes(int32_t type) {
    return type == FGM_GGML_Q4_0 || type == FGM_GGML_Q4_1 || type == FGM_GGML_Q5_0 || type == FGM_GGML_Q5_1 ||
           type == FGM_GGML_Q8_0;
}

/* Whether the vector kernels of this file take the type (the others: the plain loop). */
static int q8_vector_type(int32_t type) {
    return type == FGM_GGML_Q4_0 || type == FGM_GGML_Q4_1 || type == FGM_GGML_Q8_0;
}

/* ggml's quantize_row_q8_1 (and q8_0, which ignores s), as its AVX2 path
 * computes it: d = amax / 127, quants round(x * 127 / amax) to nearest
 * even; d and s = d * sum(quants) rounded to f16 as ggml stores them. */
static void quantize_q8(const float *x, int32_t n, fgm_q8_block *out) {
    for (int32_t b = 0; b < n / QK; b++, x += QK, out++) {
        float amax = 0.0f;
        for (int j = 0; j < QK; j++)
            amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
        const float d = amax / 127.0f, id = amax != 0.0f ? 127.0f / amax : 0.0f;
        int32_t sum = 0;
        for (int j = 0; j < QK; j++) {
            const int32_t q = (int32_t)nearbyintf(x[j] * id);
            out->qs[j] = (int8_t)q;
            sum += q;
        }
        out->d = fg_f16_to_f32(fg_f32_to_f16(d));
        out->s = fg_f16_to_f32(fg_f32_to_f16(d * (float)sum));
    }
}

#if defined(__x86_64__)
/* quantize_q8 on AVX2, the same bytes and floats for finite activations
 * (the max of |x| ignores NaN as the plain loop does, the quants round to
 * nearest even, the sum is exact); a NaN or infinite value, where the plain
 * loop's cast is undefined, gives a quant of -128 here (ggml's AVX2 path's).
 * The plain loop called libm per value; a decode step quantizes each layer's
 * inputs on one thread while the others wait. */
FGM_AVX2 static void quantize_q8_avx2(const float *x, int32_t n, fgm_q8_block *out) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int32_t b = 0; b < n / QK; b++, x += QK, out++) {
        __m256 v[4], m = _mm256_setzero_ps();
        for (int k = 0; k < 4; k++) {
            v[k] = _mm256_loadu_ps(x + 8 * k);
            m = _mm256_max_ps(_mm256_andnot_ps(sign, v[k]), m); /* a NaN lane keeps m */
        }
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        const float amax = _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
        const float d = amax / 127.0f, id = amax != 0.0f ? 127.0f / amax : 0.0f;
        __m256i q[4], sum = _mm256_setzero_si256();
        for (int k = 0; k < 4; k++) {
            const __m256 r = _mm256_round_ps(_mm256_mul_ps(v[k], _mm256_set1_ps(id)),
                                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            q[k] = _mm256_cvtps_epi32(r);
            sum = _mm256_add_epi32(sum, q[k]);
        }
        /* the packs interleave the 128-bit halves: 4-byte groups 0, 4, 1, 5, ... back in order */
        const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
        const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        _mm256_storeu_si256((__m256i *)out->qs, _mm256_permutevar8x32_epi32(p, order));
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, _MM_SHUFFLE(1, 0, 3, 2)));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, _MM_SHUFFLE(2, 3, 0, 1)));
        out->d = fg_f16_to_f32(fg_f32_to_f16(d));
        out->s = fg_f16_to_f32(fg_f32_to_f16(d * (float)_mm_cvtsi128_si32(s4)));
    }
}
#endif

/* Reference of the quantized-activation dot: plain integer sums per block. */
static void dot_q8_generic(int32_t type, const unsigned char *w, const fgm_q8_block *act, int32_t nb, int32_t rows,
                           float *out) {
    for (int32_t r = 0; r < rows; r++) {
        const unsigned char *wb = w;
        float s = 0.0f, summ = 0.0f;
        for (int32_t b = 0; b < nb; b++) {
            const fgm_q8_block *a = act + (size_t)r * nb + b;
            uint16_t h;
            memcpy(&h, wb, 2);
            const float d = fg_f16_to_f32(h);
            int32_t dot = 0;
            if (type == FGM_GGML_Q8_0) {
                for (int j = 0; j < QK; j++)
                    dot += (int8_t)wb[2 + j] * a->qs[j];
                wb += 34;
            } else if (type == FGM_GGML_Q5_0 || type == FGM_GGML_Q5_1) {
                /* d [m] qh qs: value j = low nibble j (high for j >= 16) | bit j of qh << 4, less 16 for q5_0 */
                const int m1 = type == FGM_GGML_Q5_1, off = m1 ? 0 : 16;
                uint32_t qh;
                memcpy(&qh, wb + (m1 ? 4 : 2), 4);
                const unsigned char *qs = wb + (m1 ? 8 : 6);
                for (int j = 0; j < QK / 2; j++)
                    dot += ((int)((qs[j] & 0x0Fu) | (((qh >> j) & 1u) << 4)) - off) * a->qs[j] +
                           ((int)((qs[j] >> 4) | (((qh >> (j + 16)) & 1u) << 4)) - off) * a->qs[j + QK / 2];
                if (m1) {
                    memcpy(&h, wb + 2, 2);
                    summ += fg_f16_to_f32(h) * a->s;
                }
                wb += m1 ? 24 : 22;
            } else {
                const unsigned char *qs = wb + (type == FGM_GGML_Q4_1 ? 4 : 2);
                const int off = type == FGM_GGML_Q4_1 ? 0 : 8;
                for (int j = 0; j < QK / 2; j++)
                    dot += ((qs[j] & 0x0F) - off) * a->qs[j] + ((qs[j] >> 4) - off) * a->qs[j + QK / 2];
                if (type == FGM_GGML_Q4_1) {
                    memcpy(&h, wb + 2, 2);
                    summ += fg_f16_to_f32(h) * a->s;
                }
                wb += type == FGM_GGML_Q4_1 ? 20 : 18;
            }
            s += d * a->d * (float)dot;
        }
        out[r] = s + summ;
    }
}

/* The products of one weight row with every activation row, by one kernel. */
typedef enum kernel { K_GENERIC, K_AVX2, K_Q8_GENERIC, K_Q8_AVX2, K_Q8_VNNI } kernel;

typedef struct matvec_job {
    kernel k;
    const fgm_tensor *W;
    const fgm_type_info *ti;
    const float *x;
    const fgm_q8_block *act; /* K_Q8_*: the quantized rows of x */
    int32_t rows;
} matvec_job;

static void row_dots(const matvec_job *j, const unsigned char *w, float *dots) {
    const int32_t in = (int32_t)j->W->cols;
    switch (j->k) {
#if defined(__x86_64__)
    case K_AVX2: dot_rows_avx2(j->W->type, w, j->x, in, j->rows, dots); break;
    case K_Q8_AVX2: dot_q8_avx2(j->W->type, w, j->act, in / QK, j->rows, dots); break;
    case K_Q8_VNNI: dot_q8_vnni(j->W->type, w, j->act, in / QK, j->rows, dots); break;
#endif
    case K_Q8_GENERIC: dot_q8_generic(j->W->type, w, j->act, in / QK, j->rows, dots); break;
    default: dot_rows_generic(w, j->ti, j->x, in, j->rows, dots); break;
    }
}

#define FGM_MATVEC_TASK_ROWS 32 /* output rows per task: small enough that a descheduled thread holds up little */
#define FGM_MATVEC_MAX_OUTS 3     /* products of one input in one job (more: one job per three) */

/* One job for the products of one input with up to FGM_MATVEC_MAX_OUTS
 * matrices (a layer's q, k and v): the tasks of each output, one after
 * another. */
typedef struct run_job {
    int32_t n;
    struct {
        fgm_matvec_out o;
        matvec_job j;
        size_t row_bytes;
        int32_t first_task;
    } part[FGM_MATVEC_MAX_OUTS];
} run_job;

static void run_rows(void *arg, int32_t task, int32_t thread) {
    (void)thread;
    const run_job *r = arg;
    int32_t p = 0;
    while (p + 1 < r->n && task >= r->part[p + 1].first_task)
        p++;
    const matvec_job *j = &r->part[p].j;
    const int32_t out = (int32_t)j->W->rows, o0 = (task - r->part[p].first_task) * FGM_MATVEC_TASK_ROWS;
    const int32_t o1 = o0 + FGM_MATVEC_TASK_ROWS < out ? o0 + FGM_MATVEC_TASK_ROWS : out;
    const unsigned char *base = j->W->data;
    float *y = r->part[p].o.y;
    const size_t ldy = (size_t)r->part[p].o.ldy;
#if defined(__x86_64__)
    if (j->rows == 1 && (j->k == K_Q8_AVX2 || j->k == K_Q8_VNNI)) { /* a decode step: the task's rows in one call */
        const size_t rb = r->part[p].row_bytes;
        const int32_t nb = (int32_t)j->W->cols / QK;
        if (j->k == K_Q8_AVX2)
            dot_q8_rows_avx2(j->W->type, base + (size_t)o0 * rb, rb, j->act, nb, o1 - o0, y + o0);
        else
            dot_q8_rows_vnni(j->W->type, base + (size_t)o0 * rb, rb, j->act, nb, o1 - o0, y + o0);
        return;
    }
#endif
    for (int32_t o = o0; o < o1; o++) {
        float dots[FGM_MATVEC_MAX_ROWS];
        row_dots(j, base + (size_t)o * r->part[p].row_bytes, dots);
        for (int32_t x = 0; x < j->rows; x++)
            y[(size_t)x * ldy + o] = dots[x];
    }
}

/* Every output row of every matrix of the job, spread over the pool's
 * threads (serially without one, or when there is little to spread). */
static void run(fg_threadpool *pool, run_job *r) {
    int32_t tasks = 0, out = 0;
    for (int32_t p = 0; p < r->n; p++) {
        const fgm_tensor *W = r->part[p].j.W;
        r->part[p].row_bytes = (size_t)fgm_type_row_bytes(W->type, W->cols);
        r->part[p].first_task = tasks;
        tasks += (int32_t)((W->rows + FGM_MATVEC_TASK_ROWS - 1) / FGM_MATVEC_TASK_ROWS);
        out += (int32_t)W->rows;
    }
    fg_threadpool_run(out >= 2 * FGM_MATVEC_TASK_ROWS ? pool : NULL, tasks, run_rows, (void *)r);
}

/* The best quantized-activation kernel of this CPU (FG_CPU_ISA=avx2 or
 * generic asks for less, as of every op). */
static kernel q8_kernel(void) {
#if defined(__x86_64__)
    if (have_vnni())
        return K_Q8_VNNI;
    if (have_avx2())
        return K_Q8_AVX2;
#endif
    return K_Q8_GENERIC;
}

/* The job for outs[0 .. n) with kernel k (fixed, or per type when k < 0). */
static run_job make_job(const fgm_matvec_out *outs, int32_t n, int k, const float *x, const fgm_q8_block *act,
                        int32_t rows) {
    run_job r;
    r.n = n;
    for (int32_t p = 0; p < n; p++) {
        const fgm_tensor *W = outs[p].W;
        r.part[p].o = outs[p];
        kernel kp = k >= 0 ? (kernel)k : vector_kernel(W->type, W->cols) ? K_AVX2 : K_GENERIC;
        if ((kp == K_Q8_AVX2 || kp == K_Q8_VNNI) && !q8_vector_type(W->type))
            kp = K_Q8_GENERIC;
        r.part[p].j = (matvec_job){kp, W, fgm_type_info_of(W->type), x, act, rows};
    }
    return r;
}

static void matvec_q8(fg_threadpool *pool, const fgm_matvec_out *outs, int32_t n, const float *x, int32_t rows,
                      fgm_q8_block *act, int vec) {
    if (n <= 0)
        return;
    const int32_t in = (int32_t)outs[0].W->cols;
    void (*quantize)(const float *, int32_t, fgm_q8_block *) = quantize_q8;
#if defined(__x86_64__)
    if (vec)
        quantize = quantize_q8_avx2;
#endif
    for (int32_t r = 0; r < rows; r++)
        quantize(x + (size_t)r * in, in, act + (size_t)r * (in / QK));
    for (int32_t i = 0; i < n; i += FGM_MATVEC_MAX_OUTS) {
        run_job r = make_job(outs + i, n - i < FGM_MATVEC_MAX_OUTS ? n - i : FGM_MATVEC_MAX_OUTS,
                             vec ? (int)q8_kernel() : K_Q8_GENERIC, x, act, rows);
        run(pool, &r);
    }
}

void fgm_matvec_q8_many(fg_threadpool *pool, const fgm_matvec_out *outs, int32_t n, const float *x, int32_t rows,
                       fgm_q8_block *act) {
#if defined(__x86_64__)
    matvec_q8(pool, outs, n, x, rows, act, have_avx2());
#else
    matvec_q8(pool, outs, n, x, rows, act, 0);
#endif
}

void fgm_matvec_q8(fg_threadpool *pool, float *y, int32_t ldy, const float *x, const fgm_tensor *W, int32_t rows,
                  fgm_q8_block *act) {
    const fgm_matvec_out o = {y, ldy, W};
    fgm_matvec_q8_many(pool, &o, 1, x, rows, act);
}

void fgm_matvec_q8_ref(float *y, int32_t ldy, const float *x, const fgm_tensor *W, int32_t rows, fgm_q8_block *act) {
    const fgm_matvec_out o = {y, ldy, W};
    matvec_q8(NULL, &o, 1, x, rows, act, 0);
}

void fgm_matvec_many(fg_threadpool *pool, const fgm_matvec_out *outs, int32_t n, const float *x, int32_t rows) {
    for (int32_t i = 0; i < n; i += FGM_MATVEC_MAX_OUTS) {
        run_job r = make_job(outs + i, n - i < FGM_MATVEC_MAX_OUTS ? n - i : FGM_MATVEC_MAX_OUTS, -1, x, NULL, rows);
        run(pool, &r);
    }
}

void fgm_matvec(fg_threadpool *pool, float *y, int32_t ldy, const float *x, const fgm_tensor *W, int32_t rows) {
    const fgm_matvec_out o = {y, ldy, W};
    fgm_matvec_many(pool, &o, 1, x, rows);
}

void fgm_matvec_ref(float *y, int32_t ldy, const float *x, const fgm_tensor *W, int32_t rows) {
    const fgm_matvec_out o = {y, ldy, W};
    run_job r = make_job(&o, 1, K_GENERIC, x, NULL, rows);
    run(NULL, &r);
}
