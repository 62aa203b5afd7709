/* Helpers of the tiled CPU kernels: sgemm (OpenBLAS, single-threaded inside
 * the pool's tasks; a plain loop without BLAS) and an in-place vector exp. */
#ifndef FG_CPU_MATH_H
#define FG_CPU_MATH_H

#include <stdint.h>

/* Tiles of the prompt kernels (prefill attention, profiling): FG_TQ query rows
 * by FG_TK key columns, a tile of scores small enough for L2. */
#define FG_TQ 64
#define FG_TK 256

/* C[M][N] = alpha A[M][K] . B[N][K]^T + beta C   (row-major, leading dims given) */
void fg_sgemm_nt(int32_t M, int32_t N, int32_t K, float alpha, const float *A, int32_t lda, const float *B,
                 int32_t ldb, float beta, float *C, int32_t ldc);
/* C[M][N] = A[M][K] . B[K][N] + beta C */
void fg_sgemm_nn(int32_t M, int32_t N, int32_t K, const float *A, int32_t lda, const float *B, int32_t ldb,
                 float beta, float *C, int32_t ldc);
/* x[i] = e^(x[i] - sub) for i < n; returns the sum (inputs <= sub, or -inf). */
float fg_exp_sub_sum(float *x, int32_t n, float sub);
/* Makes BLAS single-threaded (the kernels run it inside their pool's tasks). */
void fg_blas_single_thread(void);

#endif
