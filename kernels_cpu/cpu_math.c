/* The helpers of cpu_math.h. */
#include "kernels_cpu/cpu_math.h"

#include "fastgen_config.h"
#include <math.h>

#ifdef FG_HAVE_BLAS
#include <cblas.h>
#endif
#include "kernels_cpu/simd.h"
#include "kernels_cpu/kernels_cpu.h"

int fg_cpu_threads(const fg_backend *be) { return fg_threadpool_size(be->threads); }

void fg_sgemm_nt(int32_t M, int32_t N, int32_t K, float alpha, const float *A, int32_t lda, const float *B,
                 int32_t ldb, float beta, float *C, int32_t ldc) {
#ifdef FG_HAVE_BLAS
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
#else
    for (int32_t i = 0; i < M; i++)
        for (int32_t j = 0; j < N; j++) {
            float s = 0.0f;
            for (int32_t k = 0; k < K; k++)
                s += A[(size_t)i * lda + k] * B[(size_t)j * ldb + k];
            C[(size_t)i * ldc + j] = alpha * s + (beta != 0.0f ? beta * C[(size_t)i * ldc + j] : 0.0f);
        }
#endif
}

void fg_sgemm_nn(int32_t M, int32_t N, int32_t K, const float *A, int32_t lda, const float *B, int32_t ldb,
                 float beta, float *C, int32_t ldc) {
#ifdef FG_HAVE_BLAS
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
#else
    for (int32_t i = 0; i < M; i++) {
        float *c = C + (size_t)i * ldc;
        for (int32_t j = 0; j < N; j++)
            c[j] = beta != 0.0f ? beta * c[j] : 0.0f;
        for (int32_t k = 0; k < K; k++) {
            const float a = A[(size_t)i * lda + k];
            const float *b = B + (size_t)k * ldb;
            for (int32_t j = 0; j < N; j++)
                c[j] += a * b[j];
        }
    }
#endif
}

void fg_blas_single_thread(void) {
#ifdef FG_HAVE_OPENBLAS /* another BLAS (Debian's reference one) has no threads to set */
    openblas_set_num_threads(1);
#endif
}

#if defined(__x86_64__)
FG_SIMD_AVX2_TARGET static float exp_sub_sum_avx2(float *x, int32_t n, float sub) {
    const __m256 vs = _mm256_set1_ps(sub);
    __m256 acc = _mm256_setzero_ps();
    int32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 y = fg_exp256(_mm256_sub_ps(_mm256_loadu_ps(x + i), vs));
        /* -inf inputs (masked keys) give exactly 0; a NaN stays NaN (unordered: not equal) */
        y = _mm256_and_ps(y, _mm256_cmp_ps(_mm256_loadu_ps(x + i), _mm256_set1_ps(-INFINITY), _CMP_NEQ_UQ));
        _mm256_storeu_ps(x + i, y);
        acc = _mm256_add_ps(acc, y);
    }
    float lanes[8], s = 0.0f;
    _mm256_storeu_ps(lanes, acc);
    for (int k = 0; k < 8; k++)
        s += lanes[k];
    for (; i < n; i++) {
        x[i] = expf(x[i] - sub);
        s += x[i];
    }
    return s;
}
#endif

float fg_exp_sub_sum(float *x, int32_t n, float sub) {
#if defined(__x86_64__)
    if (fg_cpu_features_get().isa >= FG_ISA_AVX2)
        return exp_sub_sum_avx2(x, n, sub);
#endif
    float s = 0.0f;
    for (int32_t i = 0; i < n; i++) {
        x[i] = expf(x[i] - sub);
        s += x[i];
    }
    return s;
}
