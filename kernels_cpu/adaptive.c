/* The adaptive mode's decision for one unit on the CPU (backend.h:
 * adaptive_observe, adaptive_errors): the observed rows' scores as sgemm
 * tiles, softmax per row, column sums per key tile (each item owns its
 * columns and runs ref's sums on them); then each observed row's per-level
 * sums in float with the ISA's vectors (level_sums.inc), its errors in
 * double. Items never share an output, so threads change no bit. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/slots.h"
#include "kernels_cpu/cpu_math.h"
#include "kernels_cpu/kernels_cpu.h"
#include "kernels_ref/kernels_ref.h"

typedef struct observe_job {
    const fg_page_layout *layout;
    fg_unpack_row_fn *unpack;
    const fg_observe_unit *u;
    const float *q, *k;
    float *p;
    int32_t G, d, decode_from;
    float *col_all, *col_decode;
} observe_job;

/* Item (key tile): its K and V rows into float, with the ISA's widening
 * where the dtype has one, else as ref reads them. */
static void unpack_item(void *arg, int32_t item, int32_t thread) {
    (void)thread;
    const observe_job *jb = arg;
    const fg_observe_unit *u = jb->u;
    const fg_page_layout *L = jb->layout;
    const int32_t d = jb->d, j0 = item * FG_TK, j1 = j0 + FG_TK < u->t ? j0 + FG_TK : u->t;
    float *k = u->scratch, *v = k + (size_t)u->t * d;
    for (int32_t s = j0; s < j1; s++) {
        const int32_t r = *fg_slot_row(L, u->meta, s);
        const unsigned char *kr = fg_row_k(L, u->pages, r), *vr = fg_row_v(L, u->pages, r);
        if (!jb->unpack || !jb->unpack(kr, L->k_dtype, d, k + (size_t)s * d))
            for (int32_t c = 0; c < d; c++)
                k[(size_t)s * d + c] = fg_load_elem(kr, L->k_dtype, d, c);
        if (!jb->unpack || !jb->unpack(vr, L->v_dtype, d, v + (size_t)s * d))
            for (int32_t c = 0; c < d; c++)
                v[(size_t)s * d + c] = fg_load_elem(vr, L->v_dtype, d, c);
    }
}

/* Item (h, key tile): scores of every observed row over the tile. */
static void score_item(void *arg, int32_t item, int32_t thread) {
    (void)thread;
    const observe_job *jb = arg;
    const fg_observe_unit *u = jb->u;
    const int32_t t = u->t, W = u->n_rows, d = jb->d, G = jb->G;
    const int32_t n_tiles = (t + FG_TK - 1) / FG_TK, h = item / n_tiles, j0 = (item % n_tiles) * FG_TK;
    const int32_t cols = t - j0 < FG_TK ? t - j0 : FG_TK;
    fg_sgemm_nt(W, cols, d, 1.0f / sqrtf((float)d), jb->q + (size_t)h * d, G * d, jb->k + (size_t)j0 * d, d, 0.0f,
                jb->p + (size_t)h * W * t + j0, t);
}

/* Item (h, i): the row's softmax over keys 0..pos, 0 after. */
static void softmax_item(void *arg, int32_t item, int32_t thread) {
    (void)thread;
    const observe_job *jb = arg;
    const fg_observe_unit *u = jb->u;
    const int32_t t = u->t, pos = u->row_pos[item % u->n_rows];
    float *p = jb->p + (size_t)item * t; /* item = h * W + i */
    float m = -INFINITY;
    for (int32_t j = 0; j <= pos; j++)
        m = p[j] > m ? p[j] : m;
    const float inv = 1.0f / fg_exp_sub_sum(p, pos + 1, m);
    for (int32_t j = 0; j <= pos; j++)
        p[j] *= inv;
    memset(p + pos + 1, 0, (size_t)(t - pos - 1) * sizeof *p);
}

/* Item (key tile): its columns' sums, then its negligible keys to 0, as ref does them. */
static void sums_item(void *arg, int32_t item, int32_t thread) {
    (void)thread;
    const observe_job *jb = arg;
    const int32_t t = jb->u->t, j0 = item * FG_TK, j1 = j0 + FG_TK < t ? j0 + FG_TK : t;
    fg_ref_observe_sums(jb->u, jb->G, jb->p, jb->decode_from, j0, j1, jb->col_all, jb->col_decode);
}

/* The ISA's row widening for head_dim d, NULL for ref's element reads. */
static fg_unpack_row_fn *unpack_for(const fg_backend *be, int32_t d) {
    const fg_cpu_state *st = be->impl;
#ifdef FG_X86
    if (st->isa >= FG_ISA_AVX512 && d % 16 == 0)
        return fg_cpu_unpack_row_avx512;
    if (st->isa >= FG_ISA_AVX2 && d % 8 == 0)
        return fg_cpu_unpack_row_avx2;
#endif
    (void)st;
    return d % 8 == 0 ? fg_cpu_unpack_row_generic : NULL;
}

fg_status fg_cpu_adaptive_observe(fg_backend *be, const fg_page_layout *layout, const fg_shape *shape,
                                  const fg_observe_unit *u, const float *q, int32_t decode_from, float *col_all,
                                  float *col_decode) {
    const int32_t d = shape->head_dim, G = shape->n_q_heads / shape->n_kv_heads, t = u->t, W = u->n_rows;
    float *k = u->scratch, *v = k + (size_t)t * d, *p = v + (size_t)t * d;
    const observe_job jb = {layout, unpack_for(be, d), u, q, k, p, G, d, decode_from, col_all, col_decode};
    const int32_t n_tiles = (t + FG_TK - 1) / FG_TK;
    fg_status st = fg_threadpool_run(be->threads, n_tiles, unpack_item, (void *)&jb);
    if (st || W == 0) /* W = 0: the unpack only */
        return st;
    fg_blas_single_thread();
    st = fg_threadpool_run(be->threads, G * n_tiles, score_item, (void *)&jb);
    if (st == FG_OK)
        st = fg_threadpool_run(be->threads, G * W, softmax_item, (void *)&jb);
    if (st == FG_OK)
        st = fg_threadpool_run(be->threads, n_tiles, sums_item, (void *)&jb);
    return st;
}

typedef struct errors_job {
    const fg_observe_unit *u;
    const float *v, *p;
    const uint8_t *entry;
    int32_t G, d, n_sets, n_levels, mass;
    fg_level_sums_fn *sums;
    fg_level_errors_fn *errors; /* NULL: the plain path (ref's, in double) */
    float *fws;   /* [threads][G][n_levels + 1][d + 1] */
    double *dws;  /* [threads][(n_levels + 1) (d + 1) + 2 (d + 1)] */
    int32_t *iws; /* [threads][t + n_levels + 2]: the keys by level, where each level starts */
    fg_level_key *lws; /* [threads][t]: a level's keys for the sums */
    float *pws;        /* [threads][t][4]: four heads' weights side by side */
    const uint8_t *finite; /* [t]: whether V row j is finite */
    double *err;
} errors_job;

/* Item (i, s): row i's errors for set s, summed over the group's heads in order. */
static void errors_item(void *arg, int32_t item, int32_t thread) {
    const errors_job *jb = arg;
    const fg_observe_unit *u = jb->u;
    const int32_t t = u->t, W = u->n_rows, d = jb->d, L = jb->n_levels, G = jb->G;
    const int32_t i = item / jb->n_sets, s = item % jb->n_sets, n = u->row_pos[i] + 1;
    const size_t cells = (size_t)(L + 1) * (d + 1);
    float *acc = jb->fws + (size_t)thread * G * cells, *mass = acc + (size_t)G * (L + 1) * d;
    double *dacc = jb->dws + (size_t)thread * (cells + 2 * (size_t)(d + 1)), *sums = dacc + cells;
    double *out = jb->err + ((size_t)i * jb->n_sets + s) * L;
    const uint8_t *e = jb->entry + ((size_t)s * W + i) * t;
    int32_t *key = jb->iws + (size_t)thread * ((size_t)t + L + 2), *start = key + t;
    for (int32_t l = 0; l < L; l++)
        out[l] = 0.0;
    /* the keys by level (a counting sort, in key order within a level), once for every head */
    memset(start, 0, (size_t)(L + 2) * sizeof *start);
    for (int32_t j = 0; j < n; j++)
        start[(e[j] < L ? e[j] : L) + 1]++;
    for (int32_t l = 0; l <= L; l++)
        start[l + 1] += start[l];
    for (int32_t j = 0; j < n; j++)
        key[start[e[j] < L ? e[j] : L]++] = j;
    for (int32_t l = L; l >= 0; l--) /* back to where each level starts */
        start[l + 1] = start[l];
    start[0] = 0;
    jb->sums(jb->p + (size_t)i * t, (size_t)W * t, G, jb->v, key, start, d, L, jb->finite,
             jb->lws + (size_t)thread * t, jb->pws + (size_t)thread * t * 4, acc, mass);
    for (int32_t h = 0; h < G; h++) {
        const float *ah = acc + (size_t)h * (L + 1) * d, *mh = mass + (size_t)h * (L + 1);
        if (jb->errors) {
            jb->errors(ah, mh, L, d, jb->mass, dacc, out); /* work: the plain path's buffer, free here */
            continue;
        }
        for (int32_t l = 0; l <= L; l++) {
            for (int32_t x = 0; x < d; x++)
                dacc[(size_t)l * (d + 1) + x] = ah[(size_t)l * d + x];
            dacc[(size_t)l * (d + 1) + d] = mh[l];
        }
        fg_ref_level_errors(dacc, L, d, jb->mass, sums, out);
    }
}

/* The plain loop for a d no vector width divides. */
static void level_sums_plain(const float *p, size_t p_stride, int32_t G, const float *v, const int32_t *key,
                             const int32_t *start, int32_t d, int32_t n_levels, const uint8_t *finite,
                             fg_level_key *work, float *pk, float *acc, float *mass) {
    (void)finite;
    (void)work;
    (void)pk;
    memset(acc, 0, (size_t)G * (n_levels + 1) * d * sizeof *acc);
    memset(mass, 0, (size_t)G * (n_levels + 1) * sizeof *mass);
    for (int32_t h = 0; h < G; h++)
        for (int32_t l = 0; l <= n_levels; l++) {
            const float *ph = p + (size_t)h * p_stride;
            float *a = acc + ((size_t)h * (n_levels + 1) + l) * d, *m = mass + (size_t)h * (n_levels + 1) + l;
            for (int32_t k = start[l]; k < start[l + 1]; k++) {
                const int32_t j = key[k];
                if (ph[j] == 0.0f)
                    continue;
                for (int32_t x = 0; x < d; x++)
                    a[x] += ph[j] * v[(size_t)j * d + x];
                *m += ph[j];
            }
        }
}

/* The ISA's pair for head_dim d, or the plain sums and no vector errors. */
static void level_fns(const fg_backend *be, int32_t d, fg_level_sums_fn **sums, fg_level_errors_fn **errors) {
    const fg_cpu_state *st = be->impl;
    *sums = level_sums_plain;
    *errors = NULL;
#ifdef FG_X86
    if (st->isa >= FG_ISA_AVX512 && d % 16 == 0) {
        *sums = fg_cpu_level_sums_avx512;
        *errors = fg_cpu_level_errors_avx512;
        return;
    }
    if (st->isa >= FG_ISA_AVX2 && d % 8 == 0) {
        *sums = fg_cpu_level_sums_avx2;
        *errors = fg_cpu_level_errors_avx2;
        return;
    }
#endif
    (void)st;
    if (d % 8 == 0) {
        *sums = fg_cpu_level_sums_generic;
        *errors = fg_cpu_level_errors_generic;
    }
}

fg_status fg_cpu_adaptive_errors(fg_backend *be, const fg_shape *shape, const fg_observe_unit *u, int32_t n_sets,
                                 int32_t n_levels, const uint8_t *entry, int mass, double *err) {
    const int32_t d = shape->head_dim, G = shape->n_q_heads / shape->n_kv_heads, t = u->t;
    const int threads = fg_cpu_threads(be);
    const size_t cells = (size_t)(n_levels + 1) * (d + 1);
    float *fws = malloc((size_t)threads * G * cells * sizeof *fws);
    double *dws = malloc((size_t)threads * (cells + 2 * (size_t)(d + 1)) * sizeof *dws);
    int32_t *iws = malloc((size_t)threads * ((size_t)t + n_levels + 2) * sizeof *iws);
    fg_level_key *lws = malloc((size_t)threads * t * sizeof *lws);
    float *pws = malloc((size_t)threads * t * 4 * sizeof *pws);
    uint8_t *finite = malloc((size_t)t);
    if (!fws || !dws || !iws || !lws || !pws || !finite) {
        free(fws);
        free(dws);
        free(iws);
        free(lws);
        free(pws);
        free(finite);
        return be->err(be->err_sink, FG_ERR_OUT_OF_MEMORY, "out of host memory for the adaptive mode's sums");
    }
    const float *v = u->scratch + (size_t)t * d;
    fg_level_sums_fn *sums;
    fg_level_errors_fn *errors;
    level_fns(be, d, &sums, &errors);
    for (int32_t j = 0; sums != level_sums_plain && j < t; j++) { /* an exponent of all ones: Inf or NaN */
        uint32_t odd = 0;
        for (int32_t x = 0; x < d; x++) {
            uint32_t bits;
            memcpy(&bits, &v[(size_t)j * d + x], sizeof bits);
            odd |= (bits & 0x7F800000u) == 0x7F800000u;
        }
        finite[j] = !odd;
    }
    errors_job jb = {.u = u, .v = v, .p = v + (size_t)t * d, .entry = entry, .G = G, .d = d, .n_sets = n_sets,
                     .n_levels = n_levels, .mass = mass, .fws = fws, .dws = dws, .iws = iws, .lws = lws,
                     .pws = pws, .finite = finite, .err = err, .sums = sums, .errors = errors};
    const fg_status st = fg_threadpool_run(be->threads, u->n_rows * n_sets, errors_item, (void *)&jb);
    free(fws);
    free(dws);
    free(iws);
    free(lws);
    free(pws);
    free(finite);
    return st;
}
