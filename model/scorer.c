/* The calibrated key scorer of model/scorer.h. */
#include "model/scorer.h"

#include "model/io.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char scorer_magic[8] = {'F', 'G', 'S', 'C', 'O', 'R', 'E', '1'};

static size_t scorer_floats(const fgm_scorer *sc) {
    return (size_t)sc->n_layers * sc->n_kv_heads * ((size_t)sc->dim + 1);
}

fg_status fgm_scorer_load(const char *path, fgm_scorer *out, char *err, size_t err_size) {
    memset(out, 0, sizeof *out);
    void *data = NULL;
    size_t size = 0;
    fg_status st = fgm_read_file(path, &data, &size, err, err_size);
    if (st)
        return st;
    const unsigned char *p = data;
    int32_t head[4];
    if (size < sizeof scorer_magic + sizeof head || memcmp(p, scorer_magic, sizeof scorer_magic)) {
        free(data);
        return fgm_failf(err, err_size, FG_ERR_FORMAT, "%s: not a fastgen scorer (no FGSCORE1 header, or shorter than one)", path);
    }
    memcpy(head, p + sizeof scorer_magic, sizeof head);
    fgm_scorer sc = {head[0], head[1], head[2], head[3], NULL};
    if (sc.n_layers <= 0 || sc.n_layers > 4096 || sc.n_kv_heads <= 0 || sc.n_kv_heads > 4096 || sc.dim <= 0 ||
        sc.dim > (1 << 20) || sc.calib_tokens < 0) {
        free(data);
        return fgm_failf(err, err_size, FG_ERR_FORMAT, "%s: a scorer of %d layers, %d KV heads, width %d", path,
                         (int)sc.n_layers, (int)sc.n_kv_heads, (int)sc.dim);
    }
    const size_t n = scorer_floats(&sc), want = sizeof scorer_magic + sizeof head + n * sizeof(float);
    if (size != want) {
        free(data);
        return fgm_failf(err, err_size, FG_ERR_FORMAT, "%s: %zu bytes where a scorer of %d layers, %d KV heads "
                         "and width %d has %zu", path, size, (int)sc.n_layers, (int)sc.n_kv_heads, (int)sc.dim, want);
    }
    sc.w = malloc(n * sizeof *sc.w);
    if (!sc.w) {
        free(data);
        return fgm_failf(err, err_size, FG_ERR_OUT_OF_MEMORY, "%s: out of memory for the scorer", path);
    }
    memcpy(sc.w, p + sizeof scorer_magic + sizeof head, n * sizeof *sc.w);
    free(data);
    for (size_t i = 0; i < n; i++)
        if (!isfinite(sc.w[i])) {
            free(sc.w);
            return fgm_failf(err, err_size, FG_ERR_FORMAT, "%s: weight %zu is not finite", path, i);
        }
    *out = sc;
    return FG_OK;
}

fg_status fgm_scorer_save(const char *path, const fgm_scorer *sc, char *err, size_t err_size) {
    FILE *f = fopen(path, "wb");
    if (!f)
        return fgm_failf(err, err_size, FG_ERR_IO, "%s: cannot write", path);
    const int32_t head[4] = {sc->n_layers, sc->n_kv_heads, sc->dim, sc->calib_tokens};
    const size_t n = scorer_floats(sc);
    int ok = fwrite(scorer_magic, 1, sizeof scorer_magic, f) == sizeof scorer_magic &&
             fwrite(head, sizeof head, 1, f) == 1 && fwrite(sc->w, sizeof *sc->w, n, f) == n;
    ok = (fclose(f) == 0) && ok;
    return ok ? FG_OK : fgm_failf(err, err_size, FG_ERR_IO, "%s: write failed", path);
}

void fgm_scorer_free(fgm_scorer *sc) {
    if (!sc)
        return;
    free(sc->w);
    memset(sc, 0, sizeof *sc);
}

void fgm_scorer_predict(const fgm_scorer *sc, int32_t layer, const float *x, int32_t n, float *out, size_t ld,
                        int32_t at) {
    const int32_t D = sc->dim;
    for (int32_t g = 0; g < sc->n_kv_heads; g++) {
        const float *w = sc->w + ((size_t)layer * sc->n_kv_heads + g) * ((size_t)D + 1);
        for (int32_t i = 0; i < n; i++) {
            const float *xi = x + (size_t)i * D;
            float s = w[D];
            for (int32_t e = 0; e < D; e++)
                s += w[e] * xi[e];
            out[(size_t)g * ld + (size_t)at + i] = s;
        }
    }
}

fg_status fgm_scorer_fit_init(fgm_scorer_fit *f, int32_t dim, int32_t n_kv_heads) {
    memset(f, 0, sizeof *f);
    const size_t E = (size_t)dim + 1;
    f->dim = dim;
    f->n_kv_heads = n_kv_heads;
    f->A = calloc(E * E, sizeof *f->A);
    f->b = calloc((size_t)n_kv_heads * E, sizeof *f->b);
    f->part = malloc(E * E * sizeof *f->part);
    if (!f->A || !f->b || !f->part) {
        fgm_scorer_fit_free(f);
        return FG_ERR_OUT_OF_MEMORY;
    }
    return FG_OK;
}

void fgm_scorer_fit_free(fgm_scorer_fit *f) {
    free(f->A);
    free(f->b);
    free(f->part);
    memset(f, 0, sizeof *f);
}

void fgm_scorer_fit_add(fgm_scorer_fit *f, const float *x, const float *y, int32_t n) {
    const int32_t D = f->dim, E = D + 1;
    /* the upper triangle of sum x' x'^T in float over blocks of 256 rows (short sums), each block into A */
    for (int32_t i0 = 0; i0 < n; i0 += 256) {
        const int32_t i1 = n - i0 < 256 ? n : i0 + 256;
        memset(f->part, 0, (size_t)E * E * sizeof *f->part);
        for (int32_t i = i0; i < i1; i++) {
            const float *xi = x + (size_t)i * D;
            for (int32_t a = 0; a < D; a++) {
                const float xa = xi[a];
                float *row = f->part + (size_t)a * E;
                for (int32_t c = a; c < D; c++)
                    row[c] += xa * xi[c];
                row[D] += xa;
            }
            f->part[(size_t)D * E + D] += 1.0f;
        }
        for (int32_t a = 0; a < E; a++)
            for (int32_t c = a; c < E; c++)
                f->A[(size_t)a * E + c] += f->part[(size_t)a * E + c];
    }
    for (int32_t g = 0; g < f->n_kv_heads; g++) {
        double *b = f->b + (size_t)g * E;
        for (int32_t i = 0; i < n; i++) {
            const double yi = y[(size_t)g * n + i];
            const float *xi = x + (size_t)i * D;
            for (int32_t a = 0; a < D; a++)
                b[a] += yi * xi[a];
            b[D] += yi;
        }
    }
    f->rows += n;
}

fg_status fgm_scorer_fit_solve(const fgm_scorer_fit *f, double ridge, float *w, char *err, size_t err_size) {
    const int32_t E = f->dim + 1;
    double *L = malloc((size_t)E * E * sizeof *L), *z = malloc((size_t)E * sizeof *z);
    if (!L || !z) {
        free(L);
        free(z);
        return fgm_failf(err, err_size, FG_ERR_OUT_OF_MEMORY, "out of memory solving a scorer's fit");
    }
    /* the full symmetric matrix with the ridge on the weights' diagonal, then its Cholesky factor L L^T */
    for (int32_t a = 0; a < E; a++)
        for (int32_t c = 0; c < E; c++)
            L[(size_t)a * E + c] = a <= c ? f->A[(size_t)a * E + c] : f->A[(size_t)c * E + a];
    for (int32_t a = 0; a < f->dim; a++)
        L[(size_t)a * E + a] *= 1.0 + ridge;
    for (int32_t j = 0; j < E; j++) {
        double s = L[(size_t)j * E + j];
        for (int32_t k = 0; k < j; k++)
            s -= L[(size_t)j * E + k] * L[(size_t)j * E + k];
        if (!(s > 0.0)) {
            free(L);
            free(z);
            return fgm_failf(err, err_size, FG_ERR_INVALID_ARGUMENT,
                             "a scorer's fit is singular at column %d (too few calibration rows, or constant inputs)",
                             (int)j);
        }
        L[(size_t)j * E + j] = sqrt(s);
        for (int32_t i = j + 1; i < E; i++) {
            double t = L[(size_t)i * E + j];
            for (int32_t k = 0; k < j; k++)
                t -= L[(size_t)i * E + k] * L[(size_t)j * E + k];
            L[(size_t)i * E + j] = t / L[(size_t)j * E + j];
        }
    }
    for (int32_t g = 0; g < f->n_kv_heads; g++) {
        const double *b = f->b + (size_t)g * E;
        for (int32_t i = 0; i < E; i++) { /* L z = b */
            double t = b[i];
            for (int32_t k = 0; k < i; k++)
                t -= L[(size_t)i * E + k] * z[k];
            z[i] = t / L[(size_t)i * E + i];
        }
        for (int32_t i = E - 1; i >= 0; i--) { /* L^T w = z */
            double t = z[i];
            for (int32_t k = i + 1; k < E; k++)
                t -= L[(size_t)k * E + i] * z[k];
            z[i] = t / L[(size_t)i * E + i];
        }
        for (int32_t i = 0; i < E; i++)
            w[(size_t)g * E + i] = (float)z[i];
    }
    free(L);
    free(z);
    return FG_OK;
}
