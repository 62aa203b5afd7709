/*
 * A calibrated key scorer (FG_OBSERVE_SCORES; KVzap's idea): per layer and
 * KV head, a linear function of the layer's normed input row (what its
 * q, k and v are products of) that predicts the log of the attention a
 * reconstruction pass (KVzip's: the prompt again after an instruction to
 * repeat it) gives that row's key, relative to the head's mean. Fitted
 * offline by `fastgen calibrate` on a calibration text (ridge regression),
 * it ranks a prompt's keys as the pass would, at the cost of one
 * dim-long dot per row and KV head.
 *
 * The file (little-endian): "FGSCORE1", int32 n_layers, n_kv_heads, dim,
 * calibration tokens, then float weights [n_layers][n_kv_heads][dim + 1]
 * (the last of each row the bias).
 */
#ifndef FGM_SCORER_H
#define FGM_SCORER_H

#include <stddef.h>
#include <stdint.h>

#include "fastgen.h"

typedef struct fgm_scorer {
    int32_t n_layers, n_kv_heads, dim;
    int32_t calib_tokens; /* tokens it was fitted on (information) */
    float *w;             /* [n_layers][n_kv_heads][dim + 1] */
} fgm_scorer;

fg_status fgm_scorer_load(const char *path, fgm_scorer *out, char *err, size_t err_size);
fg_status fgm_scorer_save(const char *path, const fgm_scorer *sc, char *err, size_t err_size);
void fgm_scorer_free(fgm_scorer *sc);

/* The log-scores of n rows x [n][dim] of one layer: out [n_kv_heads][ld]
 * from column at (out[g * ld + at + i] for row i). */
void fgm_scorer_predict(const fgm_scorer *sc, int32_t layer, const float *x, int32_t n, float *out, size_t ld,
                        int32_t at);

/* The normal equations of one layer's ridge regression, accumulated over
 * calibration rows: A = sum x' x'^T and b[g] = sum x' y[g] with x' = (x, 1). */
typedef struct fgm_scorer_fit {
    int32_t dim, n_kv_heads;
    double *A;    /* [dim + 1][dim + 1] */
    double *b;    /* [n_kv_heads][dim + 1] */
    float *part;  /* [dim + 1][dim + 1] one call's sums (float, then added to A) */
    int64_t rows;
} fgm_scorer_fit;

fg_status fgm_scorer_fit_init(fgm_scorer_fit *f, int32_t dim, int32_t n_kv_heads);
void fgm_scorer_fit_free(fgm_scorer_fit *f);
/* n rows x [n][dim] with their targets y [n_kv_heads][n]. */
void fgm_scorer_fit_add(fgm_scorer_fit *f, const float *x, const float *y, int32_t n);
/* The ridge solution (weights [n_kv_heads][dim + 1]): (A + lambda D) w = b,
 * D the diagonal of A but the bias's 0, lambda = ridge;
 * FG_ERR_INVALID_ARGUMENT when A is not positive definite even so (too few
 * rows, or constant inputs). */
fg_status fgm_scorer_fit_solve(const fgm_scorer_fit *f, double ridge, float *w, char *err, size_t err_size);

#endif
