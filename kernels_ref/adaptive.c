/* The adaptive mode's decision for one unit (backend.h: adaptive_observe,
 * adaptive_errors), in plain loops: float attention, double sums over keys. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/slots.h"
#include "kernels_ref/kernels_ref.h"

/* K and V of slots 0..t-1 into float rows [t][d]. */
void fg_ref_unpack_rows(const fg_page_layout *L, const fg_observe_unit *u, float *k, float *v) {
    const int32_t d = L->head_dim;
    for (int32_t s = 0; s < u->t; s++) {
        const int32_t r = *fg_slot_row(L, u->meta, s);
        for (int32_t c = 0; c < d; c++) {
            k[(size_t)s * d + c] = fg_load_elem(fg_row_k(L, u->pages, r), L->k_dtype, d, c);
            v[(size_t)s * d + c] = fg_load_elem(fg_row_v(L, u->pages, r), L->v_dtype, d, c);
        }
    }
}

/* Row i of head h: its attention over keys 0..pos, as softmax in float. */
static void observe_row(const float *q, const float *k, int32_t pos, int32_t d, float *p) {
    const float scale = 1.0f / sqrtf((float)d);
    float m = -INFINITY;
    for (int32_t j = 0; j <= pos; j++) {
        float x = 0.0f;
        for (int32_t c = 0; c < d; c++)
            x += q[c] * k[(size_t)j * d + c];
        p[j] = x * scale;
        m = p[j] > m ? p[j] : m;
    }
    double sum = 0.0;
    for (int32_t j = 0; j <= pos; j++) {
        p[j] = expf(p[j] - m);
        sum += p[j];
    }
    for (int32_t j = 0; j <= pos; j++)
        p[j] = (float)(p[j] / sum);
}

/* Column sums of keys [j0, j1) in the order h, i (backend.h), then their negligible keys to 0. */
void fg_ref_observe_sums(const fg_observe_unit *u, int32_t G, float *p, int32_t decode_from, int32_t j0, int32_t j1,
                         float *col_all, float *col_decode) {
    const int32_t t = u->t, W = u->n_rows;
    for (int32_t j = j0; j < j1; j++)
        col_all[j] = col_decode[j] = 0.0f;
    for (int32_t h = 0; h < G; h++)
        for (int32_t i = 0; i < W; i++) {
            float *pr = p + ((size_t)h * W + i) * t;
            const int32_t pos = u->row_pos[i], end = pos + 1 < j1 ? pos + 1 : j1;
            for (int32_t j = j0; j < end; j++) {
                col_all[j] += pr[j] / (float)G;
                if (pos >= decode_from)
                    col_decode[j] += pr[j] / (float)G;
                if (pr[j] < FG_OBSERVE_NEGLIGIBLE && j < pos)
                    pr[j] = 0.0f;
            }
        }
}

fg_status fg_ref_adaptive_observe(fg_backend *be, const fg_page_layout *layout, const fg_shape *shape,
                                  const fg_observe_unit *u, const float *q, int32_t decode_from, float *col_all,
                                  float *col_decode) {
    (void)be;
    const int32_t d = shape->head_dim, G = shape->n_q_heads / shape->n_kv_heads, t = u->t, W = u->n_rows;
    float *k = u->scratch, *v = k + (size_t)t * d, *p = v + (size_t)t * d;
    fg_ref_unpack_rows(layout, u, k, v);
    if (W == 0) /* the unpack only */
        return FG_OK;
    for (int32_t h = 0; h < G; h++)
        for (int32_t i = 0; i < W; i++) {
            float *pr = p + ((size_t)h * W + i) * t;
            observe_row(q + ((size_t)i * G + h) * d, k, u->row_pos[i], d, pr);
            for (int32_t j = u->row_pos[i] + 1; j < t; j++)
                pr[j] = 0.0f;
        }
    fg_ref_observe_sums(u, G, p, decode_from, 0, t, col_all, col_decode);
    return FG_OK;
}

/* The error of every level from the per-level sums acc[l][d + 1] (l <
 * n_levels; acc[n_levels]: the keys no level keeps), added to err[l]. */
void fg_ref_level_errors(const double *acc, int32_t n_levels, int32_t d, int mass, double *sums, double *err) {
    memset(sums, 0, (size_t)(d + 1) * sizeof *sums);
    for (int32_t l = 0; l <= n_levels; l++)
        for (int32_t x = 0; x <= d; x++)
            sums[x] += acc[(size_t)l * (d + 1) + x];
    const double total = sums[d]; /* the output o = sums / total */
    double *kept = sums + d + 1;
    memset(kept, 0, (size_t)(d + 1) * sizeof *kept);
    for (int32_t l = 0; l < n_levels; l++) {
        for (int32_t x = 0; x <= d; x++)
            kept[x] += acc[(size_t)l * (d + 1) + x];
        if (mass) {
            err[l] += 1.0 - kept[d];
            continue;
        }
        double e = 0.0;
        for (int32_t x = 0; x < d; x++) { /* a level that keeps no attention outputs 0 */
            const double diff = (kept[d] > 0.0 ? kept[x] / kept[d] : 0.0) - sums[x] / total;
            e += diff * diff;
        }
        err[l] += e;
    }
}

fg_status fg_ref_adaptive_errors(fg_backend *be, const fg_shape *shape, const fg_observe_unit *u, int32_t n_sets,
                                 int32_t n_levels, const uint8_t *entry, int mass, double *err) {
    const int32_t d = shape->head_dim, G = shape->n_q_heads / shape->n_kv_heads, t = u->t, W = u->n_rows;
    const float *v = u->scratch + (size_t)t * d, *p = v + (size_t)t * d;
    double *acc = malloc((size_t)(n_levels + 1) * (d + 1) * sizeof *acc);
    double *sums = malloc(2 * (size_t)(d + 1) * sizeof *sums);
    if (!acc || !sums) {
        free(acc);
        free(sums);
        return be->err(be->err_sink, FG_ERR_OUT_OF_MEMORY, "out of host memory for the adaptive mode's sums");
    }
    for (int32_t i = 0; i < W; i++)
        for (int32_t s = 0; s < n_sets; s++) {
            const uint8_t *e = entry + ((size_t)s * W + i) * t;
            double *out = err + ((size_t)i * n_sets + s) * n_levels;
            for (int32_t l = 0; l < n_levels; l++)
                out[l] = 0.0;
            for (int32_t h = 0; h < G; h++) {
                const float *pr = p + ((size_t)h * W + i) * t;
                memset(acc, 0, (size_t)(n_levels + 1) * (d + 1) * sizeof *acc);
                for (int32_t j = 0; j <= u->row_pos[i]; j++) {
                    if (pr[j] == 0.0f)
                        continue;
                    double *a = acc + (size_t)(e[j] < n_levels ? e[j] : n_levels) * (d + 1);
                    for (int32_t x = 0; x < d; x++)
                        a[x] += (double)pr[j] * v[(size_t)j * d + x];
                    a[d] += pr[j];
                }
                fg_ref_level_errors(acc, n_levels, d, mass, sums, out);
            }
        }
    free(acc);
    free(sums);
    return FG_OK;
}
