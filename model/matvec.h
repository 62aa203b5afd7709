/*
 * Products of a few activation rows with a weight matrix kept in its stored
 * type (model/dequant.h): each weight row is read once, in place, and dotted
 * with every activation row, without a dequantized copy. This is the decode
 * step's matrix product (one or a few rows), where the weights are read once
 * per token. fgm_matvec keeps the activations f32 (the product of the
 * dequantized weights, the runner's default); fgm_matvec_q8 quantizes them
 * as ggml does.
 *
 * q4_0, q4_1, q8_0, f16 and f32 have AVX2 + FMA (+ F16C) kernels chosen at
 * run time, and the 8-bit products an AVX-512 VNNI one as well (FG_CPU_ISA=
 * avx2|generic asks for less); every other type goes through its to_float
 * one block at a time.
 */
#ifndef FGM_MATVEC_H
#define FGM_MATVEC_H

#include <stdint.h>

#include "fastgen.h"
#include "model/model.h"

/* Rows of activations that fgm_matvec takes at once (more: tile + GEMM). */
#define FGM_MATVEC_MAX_ROWS 8

/* y[r * ldy + o] = W[o] . x[r * W->cols ...] for r < rows <= FGM_MATVEC_MAX_ROWS
 * and every output o, spread over the pool's threads (NULL: serially). W->cols
 * must be a multiple of the type's block (model loading checks it). */
void fgm_matvec(fg_threadpool *pool, float *y, int32_t ldy, const float *x, const fgm_tensor *W, int32_t rows);

/* One output of fgm_matvec_many: y[r * ldy + o] = W[o] . x[r]. */
typedef struct fgm_matvec_out {
    float *y;
    int32_t ldy;
    const fgm_tensor *W;
} fgm_matvec_out;

/* fgm_matvec for n matrices of the same width and one input (a layer's q, k
 * and v): up to three in one parallel job. */
void fgm_matvec_many(fg_threadpool *pool, const fgm_matvec_out *outs, int32_t n, const float *x, int32_t rows);

/* The same, one plain scalar loop per type's to_float: the reference the
 * vector kernels are tested against. */
void fgm_matvec_ref(float *y, int32_t ldy, const float *x, const fgm_tensor *W, int32_t rows);

/* ggml's scheme (llama.cpp's CPU products), for its speed: each activation
 * row quantized per block of 32 to 8-bit quants with a scale d (and s = d *
 * sum of the quants), as ggml's quantize_row_q8_1 does, and integer dot
 * products against the weight blocks. The AVX2 and VNNI kernels give the
 * bits of ggml's x86 vec_dot for q4_0, q4_1 and q8_0 (scripts/ggml_numerics.c
 * checks them against libggml-cpu; llama.cpp repacks q4_0 on AVX2 and sums it
 * otherwise); the plain loop (q5_0, q5_1, FG_CPU_ISA=generic) sums in its own
 * order. The rest of a step is not ggml's, and 8-bit rounding magnifies any
 * difference (docs/models.md), so a run's logits are not llama.cpp's. */
typedef struct fgm_q8_block {
    float d, s; /* rounded to f16, as ggml stores them */
    int8_t qs[32];
} fgm_q8_block;

/* Whether fgm_matvec_q8 takes weights of this type (q4_0, q4_1, q5_0, q5_1,
 * q8_0; the q5 types through the plain integer loop). */
int fgm_matvec_quantizes(int32_t type);

/* fgm_matvec with quantized activations; act: room for rows * W->cols / 32
 * blocks (scratch). */
void fgm_matvec_q8(fg_threadpool *pool, float *y, int32_t ldy, const float *x, const fgm_tensor *W, int32_t rows,
                  fgm_q8_block *act);
/* fgm_matvec_q8 for n matrices of the same width and one input, which is
 * quantized once. */
void fgm_matvec_q8_many(fg_threadpool *pool, const fgm_matvec_out *outs, int32_t n, const float *x, int32_t rows,
                       fgm_q8_block *act);
/* The same with plain integer loops: the vector kernels' reference. */
void fgm_matvec_q8_ref(float *y, int32_t ldy, const float *x, const fgm_tensor *W, int32_t rows, fgm_q8_block *act);

#endif
