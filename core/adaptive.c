/* The adaptive mode (FG_ALLOC_ADAPTIVE, preset "fastgen-adaptive").
 *
 * Every head of a sequence holds its full cache until the sequence has been
 * observed: at the end of the last layer's prefill, or after defer_steps
 * decode steps. Meanwhile each layer keeps its last W rows (queries and the
 * full-cache attention outputs) and the pooled attention the prompt gave
 * every key. Then, per (layer, KV head) unit:
 *
 *   1. p[h][i][j]: the attention of each observed row i of each query head h
 *      of the group over the keys j <= pos(i), from the cached keys;
 *   2. for every family of the shortlist (its components and the split of
 *      its ratios) and every level l = 0..FG_AD_LEVELS (the family scaled to
 *      keep about l / FG_AD_LEVELS of the rows), the rows S it would keep now
 *      and the predicted error
 *          err = sum over h, i of || sum_{j in S + i} p[h][i][j] v_j / sum_{j in S + i} p[h][i][j] - out[h][i] ||^2,
 *      the squared error of the attention output the observed rows would get
 *      from those rows (values included, so rows that take attention but add
 *      little to the output count for little). The kept sets of one family
 *      grow with the level, so each family is one pass over its rows in the
 *      order it takes them.
 *
 * The budget (budget x the full cache's rows, over every unit) is then
 * shared: the start is the uniform allocation of the family whose uniform
 * error is lowest (so every uniform fixed policy of the shortlist is a point
 * of the search), and the units move to other levels and families only
 * where the summed predicted error falls: a Lagrangian choice per unit, then
 * the leftover rows to the upgrades that gain most per row; it is kept only
 * when its predicted error is below the start's. Every unit keeps at least
 * alloc_floor of the uniform share. Each head then keeps the rows of its
 * (family, level), in new pages; the full caches go once every head has
 * its new one. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"

#define FG_AD_LEVELS 40
#define FG_AD_CHOICES (FG_MAX_SHORTLIST * (FG_AD_LEVELS + 1))

/* ---------------------------------------------------------------- state */

void fg_adaptive_destroy(fg_context *ctx, fg_adaptive **pad) {
    if (!pad || !*pad)
        return;
    fg_adaptive *ad = *pad;
    for (int32_t l = 0; ad->layers && l < ctx->params.n_layers; l++) {
        free(ad->layers[l].col);
        free(ad->layers[l].q);
        free(ad->layers[l].out);
        free(ad->layers[l].pos);
    }
    free(ad->layers);
    free(ad);
    *pad = NULL;
}

fg_status fg_adaptive_create(fg_context *ctx, const fg_compression_params *cp, int32_t n_prompt, fg_adaptive **out) {
    const int32_t L = ctx->params.n_layers, Hq = ctx->params.n_q_heads, Hkv = ctx->params.n_kv_heads;
    const int32_t d = ctx->params.head_dim, W = cp->observation_window;
    *out = NULL;
    fg_adaptive *ad = calloc(1, sizeof *ad);
    if (ad)
        ad->layers = calloc((size_t)L, sizeof *ad->layers);
    int ok = ad && ad->layers;
    for (int32_t l = 0; ok && l < L; l++) {
        fg_adaptive_layer *a = &ad->layers[l];
        a->col = malloc((size_t)Hkv * n_prompt * sizeof *a->col);
        a->q = malloc((size_t)W * Hq * d * sizeof *a->q);
        a->out = malloc((size_t)W * Hq * d * sizeof *a->out);
        a->pos = malloc((size_t)W * sizeof *a->pos);
        ok = a->col && a->q && a->out && a->pos;
    }
    if (!ok) {
        fg_adaptive_destroy(ctx, &ad);
        return fg_error(ctx, FG_ERR_OUT_OF_MEMORY, "out of host memory for the adaptive mode's observed rows");
    }
    ad->window = W;
    ad->n_prompt = n_prompt;
    ad->compress_at = n_prompt + cp->defer_steps;
    *out = ad;
    return FG_OK;
}

fg_status fg_adaptive_clone(fg_context *ctx, const fg_adaptive *src, fg_adaptive **out) {
    const int32_t Hq = ctx->params.n_q_heads, Hkv = ctx->params.n_kv_heads, d = ctx->params.head_dim;
    fg_compression_params cp;
    memset(&cp, 0, sizeof cp);
    cp.observation_window = src->window;
    cp.defer_steps = src->compress_at - src->n_prompt;
    fg_status st = fg_adaptive_create(ctx, &cp, src->n_prompt, out);
    if (st)
        return st;
    const size_t rows = (size_t)src->window * Hq * d;
    for (int32_t l = 0; l < ctx->params.n_layers; l++) {
        const fg_adaptive_layer *a = &src->layers[l];
        fg_adaptive_layer *b = &(*out)->layers[l];
        memcpy(b->col, a->col, (size_t)Hkv * src->n_prompt * sizeof *a->col);
        memcpy(b->q, a->q, rows * sizeof *a->q);
        memcpy(b->out, a->out, rows * sizeof *a->out);
        memcpy(b->pos, a->pos, (size_t)src->window * sizeof *a->pos);
        b->n_obs = a->n_obs;
        b->next = a->next;
    }
    return FG_OK;
}

void fg_adaptive_observe(const fg_context *ctx, fg_adaptive *ad, int32_t layer, int32_t pos, const float *q,
                         const float *out) {
    const size_t row = (size_t)ctx->params.n_q_heads * ctx->params.head_dim;
    fg_adaptive_layer *a = &ad->layers[layer];
    for (int32_t i = 0; i < a->n_obs; i++) /* a row seen again (a chunk sent again) takes its own place */
        if (a->pos[i] == pos) {
            memcpy(a->q + (size_t)i * row, q, row * sizeof *q);
            memcpy(a->out + (size_t)i * row, out, row * sizeof *out);
            return;
        }
    memcpy(a->q + (size_t)a->next * row, q, row * sizeof *q);
    memcpy(a->out + (size_t)a->next * row, out, row * sizeof *out);
    a->pos[a->next] = pos;
    a->next = (a->next + 1) % ad->window;
    if (a->n_obs < ad->window)
        a->n_obs++;
}

void fg_adaptive_forget(fg_adaptive *ad, int32_t layer) {
    ad->layers[layer].n_obs = 0;
    ad->layers[layer].next = 0;
}

/* ---------------------------------------------------------------- families */

/* The family `f` scaled to level l: its window and its frequent or snapshot
 * ratios keep their proportion and add up to l / FG_AD_LEVELS. */
static fg_policy family_at(const fg_policy *f, int32_t level) {
    fg_policy p = *f;
    const uint32_t c = fg_effective_components(f->components);
    if (c & FG_KEEP_FULL)
        return p;
    const double b = (double)level / FG_AD_LEVELS;
    const double rl = (c & FG_KEEP_LOCAL) ? f->ratio_local : 0.0;
    const double rf = (c & (FG_KEEP_FREQUENT | FG_KEEP_SNAPSHOT)) ? f->ratio_frequent : 0.0;
    const double sum = rl + rf;
    p.ratio_local = sum > 0.0 ? (float)(b * rl / sum) : 0.0f;
    p.ratio_frequent = sum > 0.0 ? (float)(b * rf / sum) : 0.0f;
    if (sum <= 0.0 && (c & FG_KEEP_LOCAL)) /* a family with no ratio: its window scales */
        p.ratio_local = (float)b;
    return p;
}

/* ---------------------------------------------------------------- one unit */

/* Host scratch of one unit: t keys, W observed rows of G query heads. */
typedef struct unit_scratch {
    float *k, *v;           /* [t][d] the head's rows, in position order */
    int32_t *slot_pos;      /* [t] */
    float *p;               /* [G][W][t] observed attention */
    double *base, *win, *oth; /* [G][d + 1]: sums of p v (d) and of p (the last) over pinned keys and the row's
                                own, over the window's others, over the frequent or snapshot part */
    uint8_t *taken;         /* [t] keys the frequent or snapshot part holds for the row */
    fg_rank_entry *order;   /* [n_fam][t] each family's candidates, best first */
} unit_scratch;

/* The observed rows of one unit: positions (ascending) and their outputs. */
typedef struct obs_rows {
    int32_t n;           /* W */
    const int32_t *pos;  /* [W] */
    const float *const *out; /* [W] each row's output of the group's first query head: [G][d] */
} obs_rows;

/* Adds (sign +1) or takes away (-1) key j's share of row i to sums [G][d + 1]. */
static void row_add(const unit_scratch *u, double *sums, int32_t i, int32_t j, int32_t t, int32_t G, int32_t W,
                    int32_t d, double sign) {
    const float *vj = u->v + (size_t)j * d;
    for (int32_t h = 0; h < G; h++) {
        const double a = sign * u->p[((size_t)h * W + i) * t + j];
        double *acc = sums + (size_t)h * (d + 1);
        for (int32_t x = 0; x < d; x++)
            acc[x] += a * vj[x];
        acc[d] += a;
    }
}

/* err[l] += the squared error of row i's output over the rows family `fam`
 * at level l would give it as a decode query at its own position p: the
 * pinned keys before it and its own, the window ending at p (w(p + 1)),
 * and the best-ranked k(p + 1) of the others before the window. rows[l]:
 * the rows the family keeps now, at length t. */
static void row_curve(const fg_policy *fam, const fg_profile_view *pv, const fg_rank_entry *order, int32_t n_order,
                      unit_scratch *u, const obs_rows *ob, int32_t i, int32_t G, int32_t d, double *err) {
    const int32_t t = pv->n, W = ob->n, p = ob->pos[i], tr = p + 1;
    const uint32_t c = fg_effective_components(fam->components);
    const size_t sz = (size_t)G * (d + 1) * sizeof(double);
    memset(u->base, 0, sz);
    memset(u->win, 0, sz);
    memset(u->oth, 0, sz);
    row_add(u, u->base, i, p, t, G, W, d, 1.0);
    if (c & (FG_KEEP_SPECIAL | FG_KEEP_PUNCT))
        for (int32_t j = 0; j < p; j++)
            if (fg_is_pinned(c, pv->cls[j]))
                row_add(u, u->base, i, j, t, G, W, d, 1.0);
    const int other = (c & (FG_KEEP_FREQUENT | FG_KEEP_SNAPSHOT)) != 0;
    int32_t lo = p, next = 0, taken = 0; /* the window is [lo, p]; the order's next; keys the other part holds */
    for (int32_t l = 0; l <= FG_AD_LEVELS; l++) {
        const fg_policy pol = family_at(fam, l);
        const int32_t nlo = (c & FG_KEEP_LOCAL) ? tr - fg_policy_window(&pol, tr) : p;
        for (int32_t j = lo - 1; j >= nlo; j--) { /* the window grows back */
            if (fg_is_pinned(c, pv->cls[j]))
                continue;
            if (u->taken[j]) { /* held by the other part until now */
                u->taken[j] = 0;
                taken--;
                row_add(u, u->oth, i, j, t, G, W, d, -1.0);
            }
            row_add(u, u->win, i, j, t, G, W, d, 1.0);
        }
        lo = nlo < lo ? nlo : lo;
        if (other) {
            const int32_t k = fg_policy_frequent_budget(&pol, tr);
            while (taken < k && next < n_order) {
                const int32_t j = order[next++].pos;
                if (j >= lo) /* in the window (or after the row): for good, as the window only grows */
                    continue;
                u->taken[j] = 1;
                taken++;
                row_add(u, u->oth, i, j, t, G, W, d, 1.0);
            }
        }
        double e = 0.0;
        for (int32_t h = 0; h < G; h++) {
            const double *b = u->base + (size_t)h * (d + 1), *w = u->win + (size_t)h * (d + 1);
            const double *o = u->oth + (size_t)h * (d + 1);
            const double den = b[d] + w[d] + o[d];
            const float *full = ob->out[i] + (size_t)h * d;
            for (int32_t x = 0; x < d; x++) {
                const double diff = (b[x] + w[x] + o[x]) / den - full[x];
                e += diff * diff;
            }
        }
        err[l] += e;
    }
    for (int32_t n = 0; n < next; n++) /* the row's marks go */
        u->taken[order[n].pos] = 0;
}

/* Rows family `fam` keeps at every level now, at length t (§2.4: pinned, the
 * window's others, k(t) of the rest). */
static void family_rows(const fg_policy *fam, const fg_profile_view *pv, int32_t *rows) {
    const int32_t t = pv->n;
    const uint32_t c = fg_effective_components(fam->components);
    int32_t pinned = 0;
    for (int32_t j = 0; j < t; j++)
        pinned += fg_is_pinned(c, pv->cls[j]);
    for (int32_t l = 0; l <= FG_AD_LEVELS; l++) {
        if (c & FG_KEEP_FULL) {
            rows[l] = t;
            continue;
        }
        const fg_policy pol = family_at(fam, l);
        const int32_t ws = (c & FG_KEEP_LOCAL) ? t - fg_policy_window(&pol, t) : t;
        int32_t pinned_before = 0;
        for (int32_t j = 0; j < ws; j++)
            pinned_before += fg_is_pinned(c, pv->cls[j]);
        int32_t r = pinned + (t - ws) - (pinned - pinned_before); /* pinned, and the window's others */
        if (c & (FG_KEEP_FREQUENT | FG_KEEP_SNAPSHOT)) {
            const int32_t cand = ws - pinned_before, k = fg_policy_frequent_budget(&pol, t);
            r += k < cand ? k : cand;
        }
        rows[l] = r;
    }
}

/* ---------------------------------------------------------------- allocation */

typedef struct unit_curves {
    double err[FG_MAX_SHORTLIST][FG_AD_LEVELS + 1];
    int32_t rows[FG_MAX_SHORTLIST][FG_AD_LEVELS + 1];
} unit_curves;

/* The summed error and rows of a choice per unit (choice = family * (L + 1) + level). */
static double total(const unit_curves *uc, const int32_t *choice, int32_t n_units, int64_t *rows) {
    double e = 0.0;
    int64_t r = 0;
    for (int32_t u = 0; u < n_units; u++) {
        const int32_t f = choice[u] / (FG_AD_LEVELS + 1), l = choice[u] % (FG_AD_LEVELS + 1);
        e += uc[u].err[f][l];
        r += uc[u].rows[f][l];
    }
    *rows = r;
    return e;
}

/* Each unit's choice minimising err + lambda rows among those of at least
 * floor_rows rows (ties: fewer rows). */
static void lagrange(const unit_curves *uc, int32_t n_units, int32_t n_fam, int64_t floor_rows, double lambda,
                     int32_t *choice) {
    for (int32_t u = 0; u < n_units; u++) {
        double best = INFINITY;
        int32_t best_rows = 0, pick = -1;
        for (int32_t f = 0; f < n_fam; f++)
            for (int32_t l = 0; l <= FG_AD_LEVELS; l++) {
                const int32_t r = uc[u].rows[f][l];
                if (r < floor_rows && l < FG_AD_LEVELS)
                    continue;
                const double v = uc[u].err[f][l] + lambda * r;
                if (v < best || (v == best && r < best_rows)) {
                    best = v;
                    best_rows = r;
                    pick = f * (FG_AD_LEVELS + 1) + l;
                }
            }
        choice[u] = pick;
    }
}

/* The leftover rows to the single-unit moves that lower the error most per row added. */
static void fill(const unit_curves *uc, int32_t n_units, int32_t n_fam, int64_t budget, int64_t floor_rows,
                 int32_t *choice) {
    int64_t used;
    total(uc, choice, n_units, &used);
    for (;;) {
        int32_t bu = -1, bc = -1;
        double best = 0.0;
        for (int32_t u = 0; u < n_units; u++) {
            const int32_t f0 = choice[u] / (FG_AD_LEVELS + 1), l0 = choice[u] % (FG_AD_LEVELS + 1);
            const double e0 = uc[u].err[f0][l0];
            const int32_t r0 = uc[u].rows[f0][l0];
            for (int32_t f = 0; f < n_fam; f++)
                for (int32_t l = 0; l <= FG_AD_LEVELS; l++) {
                    const int64_t dr = (int64_t)uc[u].rows[f][l] - r0;
                    const double de = e0 - uc[u].err[f][l];
                    if (de <= 0.0 || used + dr > budget || (uc[u].rows[f][l] < floor_rows && l < FG_AD_LEVELS))
                        continue;
                    const double gain = dr <= 0 ? INFINITY : de / (double)dr;
                    if (gain > best) {
                        best = gain;
                        bu = u;
                        bc = f * (FG_AD_LEVELS + 1) + l;
                    }
                }
        }
        if (bu < 0)
            return;
        const int32_t f0 = choice[bu] / (FG_AD_LEVELS + 1), l0 = choice[bu] % (FG_AD_LEVELS + 1);
        used += (int64_t)uc[bu].rows[bc / (FG_AD_LEVELS + 1)][bc % (FG_AD_LEVELS + 1)] - uc[bu].rows[f0][l0];
        choice[bu] = bc;
    }
}

/* The choice of every unit within `budget` rows (see the file's comment). */
static void allocate(const unit_curves *uc, int32_t n_units, int32_t n_fam, int64_t budget, float floor_share,
                     int32_t *choice, int32_t *scratch) {
    /* the uniform start: every unit on one family at the highest level that fits */
    double best = INFINITY;
    for (int32_t f = 0; f < n_fam; f++) {
        for (int32_t l = FG_AD_LEVELS; l >= 0; l--) {
            for (int32_t u = 0; u < n_units; u++)
                scratch[u] = f * (FG_AD_LEVELS + 1) + l;
            int64_t rows;
            const double e = total(uc, scratch, n_units, &rows);
            if (rows > budget)
                continue;
            if (e < best) {
                best = e;
                memcpy(choice, scratch, (size_t)n_units * sizeof *choice);
            }
            break;
        }
    }
    if (best == INFINITY) { /* nothing fits: every unit at its family's least */
        for (int32_t u = 0; u < n_units; u++)
            choice[u] = 0;
        return;
    }
    /* the Lagrangian choice under the budget, topped up */
    const int64_t floor_rows = (int64_t)floor((double)floor_share * (double)budget / n_units);
    double lo = 0.0, hi = 1.0;
    for (int it = 0; it < 200; it++) { /* an upper bound: a lambda whose choice fits */
        lagrange(uc, n_units, n_fam, floor_rows, hi, scratch);
        int64_t rows;
        total(uc, scratch, n_units, &rows);
        if (rows <= budget)
            break;
        lo = hi;
        hi *= 4.0;
    }
    for (int it = 0; it < 60; it++) {
        const double mid = 0.5 * (lo + hi);
        lagrange(uc, n_units, n_fam, floor_rows, mid, scratch);
        int64_t rows;
        total(uc, scratch, n_units, &rows);
        if (rows <= budget)
            hi = mid;
        else
            lo = mid;
    }
    lagrange(uc, n_units, n_fam, floor_rows, hi, scratch);
    int64_t rows;
    total(uc, scratch, n_units, &rows);
    if (rows > budget)
        return;
    fill(uc, n_units, n_fam, budget, floor_rows, scratch);
    if (total(uc, scratch, n_units, &rows) < best && rows <= budget)
        memcpy(choice, scratch, (size_t)n_units * sizeof *choice);
}

/* ---------------------------------------------------------------- compression */

/* A prepared compression: the new caches of every unit; once swapped in,
 * the full ones and the observed rows, until the caller keeps the swap. */
struct fg_adaptive_plan {
    int32_t n_units;
    fg_head *fresh;  /* [n_units] */
    fg_adaptive *ad; /* the sequence's observed rows, while swapped */
};

typedef struct compress_scratch {
    unit_scratch u;
    unit_curves *curves;          /* [units] */
    float *score, *snap;          /* [units][t] the frequent part's ranks (cumulative attention), the snapshot's */
    float *pooled;                /* [t] */
    int32_t *choice, *tmp;        /* [units] */
    int32_t *obs_pos;             /* [W] observed rows in position order */
    const float **obs_out;        /* [W] */
    const float **obs_q;          /* [W] */
    int32_t *keep_pos, *keep_src; /* [t] */
    uint8_t *keep_flags;          /* [t] */
    float *keep_score;            /* [t] */
    fg_rank_entry *rank;          /* [t] */
    float *dk, *dv;               /* a head's rows for compact: activation memory (the device's with FG_IO_DEVICE) */
} compress_scratch;

static void scratch_free(fg_context *ctx, compress_scratch *w) {
    void *host[] = {w->u.k,      w->u.v,       w->u.slot_pos, w->u.p,      w->u.base,     w->u.win,
                    w->u.oth,    w->u.taken,   w->u.order,    w->curves,   w->score,      w->snap,
                    w->pooled,   w->choice,    w->tmp,        w->obs_pos,  (void *)w->obs_out, (void *)w->obs_q,
                    w->keep_pos, w->keep_src,  w->keep_flags, w->keep_score, w->rank};
    for (size_t i = 0; i < sizeof host / sizeof host[0]; i++)
        free(host[i]);
    if (ctx->be.device_io && ctx->be.ops->synchronize)
        ctx->be.ops->synchronize(&ctx->be); /* nothing queued still reads them */
    fg_io_free(ctx, w->dk);
    fg_io_free(ctx, w->dv);
}

void fg_adaptive_abort(fg_context *ctx, fg_adaptive_plan **pplan) {
    if (!pplan || !*pplan)
        return;
    fg_adaptive_plan *plan = *pplan;
    for (int32_t i = 0; plan->fresh && i < plan->n_units; i++) {
        fg_head_shrink(ctx, &plan->fresh[i], 0);
        free(plan->fresh[i].page_ids);
        free(plan->fresh[i].pages);
    }
    free(plan->fresh);
    fg_adaptive_destroy(ctx, &plan->ad);
    free(plan);
    *pplan = NULL;
}

static void swap_heads(fg_seq *s, fg_adaptive_plan *plan) {
    for (int32_t unit = 0; unit < plan->n_units; unit++) {
        const fg_head h = s->heads[unit];
        s->heads[unit] = plan->fresh[unit];
        plan->fresh[unit] = h;
    }
    fg_adaptive *ad = s->ad;
    s->ad = plan->ad;
    plan->ad = ad;
}

void fg_adaptive_swap(fg_seq *s, fg_adaptive_plan *plan) { swap_heads(s, plan); }
void fg_adaptive_unswap(fg_seq *s, fg_adaptive_plan *plan) { swap_heads(s, plan); }

/* The observed attention of unit (layer, g) into u->p, and its ranks. */
static void observe_unit(const fg_context *ctx, const fg_seq *s, const fg_adaptive_layer *a, int32_t g,
                         const obs_rows *ob, const float *const *obs_q, unit_scratch *u, float *score, float *snap,
                         float *pooled) {
    const int32_t Hq = ctx->params.n_q_heads, Hkv = ctx->params.n_kv_heads, d = ctx->params.head_dim, G = Hq / Hkv;
    const int32_t t = s->length[0], W = ob->n, n_prompt = s->ad->n_prompt;
    const float scale = 1.0f / sqrtf((float)d);
    for (int32_t hh = 0; hh < G; hh++)
        for (int32_t i = 0; i < W; i++) {
            const float *q = obs_q[i] + (size_t)(g * G + hh) * d;
            float *p = u->p + ((size_t)hh * W + i) * t;
            const int32_t pi = ob->pos[i];
            float m = -INFINITY;
            for (int32_t j = 0; j <= pi; j++) {
                float x = 0.0f;
                for (int32_t c = 0; c < d; c++)
                    x += q[c] * u->k[(size_t)j * d + c];
                p[j] = x * scale;
                m = p[j] > m ? p[j] : m;
            }
            double sum = 0.0;
            for (int32_t j = 0; j <= pi; j++) {
                p[j] = expf(p[j] - m);
                sum += p[j];
            }
            for (int32_t j = 0; j <= pi; j++)
                p[j] = (float)(p[j] / sum);
            for (int32_t j = pi + 1; j < t; j++)
                p[j] = 0.0f;
        }
    /* the frequent part ranks by the cumulative attention of every row so far (the prompt's profile
       and the observed decode rows), the snapshot by the observed rows', max-pooled */
    for (int32_t j = 0; j < t; j++) {
        score[j] = j < n_prompt ? a->col[(size_t)g * n_prompt + j] : 0.0f;
        snap[j] = 0.0f;
    }
    for (int32_t i = 0; i < W; i++)
        for (int32_t hh = 0; hh < G; hh++)
            for (int32_t j = 0; j <= ob->pos[i]; j++) {
                const float pa = u->p[((size_t)hh * W + i) * t + j] / (float)G;
                snap[j] += pa;
                if (ob->pos[i] >= n_prompt)
                    score[j] += pa;
            }
    if (s->cp.score_pool > 1) {
        const fg_profile_view raw = {.n = t, .row_begin = 0, .length = t, .cls = s->cls, .col = snap};
        fg_policy_pool_ranks(&s->cp, &raw, pooled);
        memcpy(snap, pooled, (size_t)t * sizeof *snap);
    }
}

fg_status fg_adaptive_prepare(fg_context *ctx, fg_seq *s, fg_adaptive_plan **out) {
    const int32_t L = ctx->params.n_layers, Hq = ctx->params.n_q_heads, Hkv = ctx->params.n_kv_heads;
    const int32_t d = ctx->params.head_dim, G = Hq / Hkv, n_units = L * Hkv;
    const fg_compression_params *cp = &s->cp;
    const fg_adaptive *ad = s->ad;
    const int32_t t = s->length[0], W = ad->layers[0].n_obs, n_fam = cp->n_policies;
    *out = NULL;
    compress_scratch w;
    memset(&w, 0, sizeof w);
    unit_scratch *u = &w.u;
    u->k = malloc((size_t)t * d * sizeof *u->k);
    u->v = malloc((size_t)t * d * sizeof *u->v);
    u->slot_pos = malloc((size_t)t * sizeof *u->slot_pos);
    u->p = malloc((size_t)G * W * t * sizeof *u->p);
    u->base = malloc((size_t)G * (d + 1) * sizeof *u->base);
    u->win = malloc((size_t)G * (d + 1) * sizeof *u->win);
    u->oth = malloc((size_t)G * (d + 1) * sizeof *u->oth);
    u->taken = calloc((size_t)t, 1);
    u->order = malloc((size_t)n_fam * t * sizeof *u->order);
    w.curves = malloc((size_t)n_units * sizeof *w.curves);
    w.score = malloc((size_t)n_units * t * sizeof *w.score);
    w.snap = malloc((size_t)n_units * t * sizeof *w.snap);
    w.pooled = malloc((size_t)t * sizeof *w.pooled);
    w.choice = malloc((size_t)n_units * sizeof *w.choice);
    w.tmp = malloc((size_t)n_units * sizeof *w.tmp);
    w.obs_pos = malloc((size_t)W * sizeof *w.obs_pos);
    w.obs_out = malloc((size_t)W * sizeof *w.obs_out);
    w.obs_q = malloc((size_t)W * sizeof *w.obs_q);
    w.keep_pos = malloc((size_t)t * sizeof *w.keep_pos);
    w.keep_src = malloc((size_t)t * sizeof *w.keep_src);
    w.keep_flags = malloc((size_t)t);
    w.keep_score = malloc((size_t)t * sizeof *w.keep_score);
    w.rank = malloc((size_t)t * sizeof *w.rank);
    fg_adaptive_plan *plan = calloc(1, sizeof *plan);
    if (plan) {
        plan->n_units = n_units;
        plan->fresh = calloc((size_t)n_units, sizeof *plan->fresh);
    }
    fg_status st = FG_OK;
    if (!(u->k && u->v && u->slot_pos && u->p && u->base && u->win && u->oth && u->taken && u->order && w.curves &&
          w.score && w.snap && w.pooled && w.choice && w.tmp && w.obs_pos && w.obs_out && w.obs_q && w.keep_pos &&
          w.keep_src && w.keep_flags && w.keep_score && w.rank && plan && plan->fresh))
        st = fg_error(ctx, FG_ERR_OUT_OF_MEMORY, "out of host memory compressing a sequence of %d tokens", (int)t);
    if (st == FG_OK && ctx->be.device_io && (st = fg_io_alloc(ctx, (size_t)t * d * sizeof(float), &w.dk)) == FG_OK)
        st = fg_io_alloc(ctx, (size_t)t * d * sizeof(float), &w.dv);

    /* 1. the curves of every unit */
    for (int32_t l = 0; l < L && st == FG_OK; l++) {
        const fg_adaptive_layer *a = &ad->layers[l];
        for (int32_t i = 0; i < W; i++) { /* the ring's oldest first: positions ascend */
            const int32_t slot = (a->next - W + i + ad->window) % ad->window;
            w.obs_pos[i] = a->pos[slot];
            w.obs_q[i] = a->q + (size_t)slot * Hq * d;
        }
        for (int32_t g = 0; g < Hkv && st == FG_OK; g++) {
            const int32_t unit = l * Hkv + g;
            const fg_head *h = &s->heads[unit];
            st = fg_backend_read_rows(&ctx->be, &ctx->layout, h->pages, t, u->k, u->v, u->slot_pos, NULL, NULL);
            for (int32_t j = 0; st == FG_OK && j < t; j++)
                if (u->slot_pos[j] != j)
                    st = fg_error(ctx, FG_ERR_INTERNAL, "adaptive compression: layer %d head %d slot %d holds "
                                  "position %d", (int)l, (int)g, (int)j, (int)u->slot_pos[j]);
            if (st)
                break;
            for (int32_t i = 0; i < W; i++) /* each row holds [Hq][d]: this unit's group starts at g G d */
                w.obs_out[i] = w.obs_q[i] - a->q + a->out + (size_t)g * G * d;
            const obs_rows ob = {W, w.obs_pos, w.obs_out};
            float *score = w.score + (size_t)unit * t, *snap = w.snap + (size_t)unit * t;
            observe_unit(ctx, s, a, g, &ob, w.obs_q, u, score, snap, w.pooled);
            unit_curves *uc = &w.curves[unit];
            int32_t n_order[FG_MAX_SHORTLIST];
            for (int32_t f = 0; f < n_fam; f++) { /* each family's candidates, ranked as fg_policy_keep does */
                const uint32_t c = fg_effective_components(cp->shortlist[f].components);
                fg_rank_entry *order = u->order + (size_t)f * t;
                n_order[f] = 0;
                if (c & (FG_KEEP_FREQUENT | FG_KEEP_SNAPSHOT) && !(c & FG_KEEP_FULL))
                    for (int32_t j = 0; j < t; j++)
                        if (!fg_is_pinned(c, s->cls[j]))
                            order[n_order[f]++] = (fg_rank_entry){(c & FG_KEEP_SNAPSHOT) ? snap[j] : score[j], j};
                fg_policy_rank_sort(order, n_order[f]);
                const fg_profile_view pv = {.n = t, .row_begin = 0, .length = t, .cls = s->cls, .col = score};
                family_rows(&cp->shortlist[f], &pv, uc->rows[f]);
                for (int32_t lv = 0; lv <= FG_AD_LEVELS; lv++)
                    uc->err[f][lv] = 0.0;
            }
            const fg_profile_view pv = {.n = t, .row_begin = 0, .length = t, .cls = s->cls, .col = score};
            for (int32_t i = 0; i < W; i++)
                for (int32_t f = 0; f < n_fam; f++)
                    if (!(cp->shortlist[f].components & FG_KEEP_FULL))
                        row_curve(&cp->shortlist[f], &pv, u->order + (size_t)f * t, n_order[f], u, &ob, i, G, d,
                                  uc->err[f]);
        }
    }
    /* EXPERIMENT: per-layer weights of the errors */
    if (st == FG_OK && getenv("FG_EXP_LWEIGHT")) {
        const char *cur = getenv("FG_EXP_LWEIGHT");
        for (int32_t l = 0; l < L; l++) {
            const double wl = cur && *cur ? atof(cur) : 1.0;
            if (cur && (cur = strchr(cur, ',')))
                cur++;
            for (int32_t g = 0; g < Hkv; g++)
                for (int32_t f = 0; f < n_fam; f++)
                    for (int32_t lv = 0; lv <= FG_AD_LEVELS; lv++)
                        w.curves[l * Hkv + g].err[f][lv] *= wl;
        }
    }
    /* 2. the allocation */
    if (st == FG_OK) {
        int64_t budget = INT64_MAX;
        if (cp->budget > 0.0f)
            budget = (int64_t)ceil((double)cp->budget * n_units * t);
        if (cp->budget_tokens > 0 && (int64_t)cp->budget_tokens * n_units < budget)
            budget = (int64_t)cp->budget_tokens * n_units;
        allocate(w.curves, n_units, n_fam, budget, cp->alloc_floor, w.choice, w.tmp);
        if (getenv("FG_EXP_DEBUG")) { /* EXPERIMENT */
            int64_t rows;
            const double e = total(w.curves, w.choice, n_units, &rows);
            fprintf(stderr, "adaptive t=%d budget=%lld rows=%lld err=%.4g:", (int)t, (long long)budget, (long long)rows, e);
            for (int32_t f = 0; f < n_fam; f++) {
                for (int32_t l = FG_AD_LEVELS; l >= 0; l--) {
                    int64_t r = 0; double ee = 0;
                    for (int32_t u2 = 0; u2 < n_units; u2++) { r += w.curves[u2].rows[f][l]; ee += w.curves[u2].err[f][l]; }
                    if (r <= budget) { fprintf(stderr, " uni%d=%.4g@%d", (int)f, ee, (int)l); break; }
                }
            }
            fprintf(stderr, "\n   ");
            for (int32_t u2 = 0; u2 < n_units; u2++)
                fprintf(stderr, " %d:%d", (int)(w.choice[u2] / (FG_AD_LEVELS + 1)), (int)(w.choice[u2] % (FG_AD_LEVELS + 1)));
            fprintf(stderr, "\n");
        }
    }
    /* 3. the new caches, in new pages */
    for (int32_t unit = 0; unit < n_units && st == FG_OK; unit++) {
        const int32_t f = w.choice[unit] / (FG_AD_LEVELS + 1), lv = w.choice[unit] % (FG_AD_LEVELS + 1);
        const fg_head *h = &s->heads[unit];
        fg_head *fr = &plan->fresh[unit];
        if ((st = fg_backend_read_rows(&ctx->be, &ctx->layout, h->pages, t, u->k, u->v, NULL, NULL, NULL)))
            break;
        fr->policy_index = f;
        fr->pol = family_at(&cp->shortlist[f], lv);
        fr->components = fg_effective_components(fr->pol.components);
        memcpy(fr->recovery, h->recovery, sizeof fr->recovery);
        const fg_profile_view pv = {.n = t, .row_begin = 0, .length = t, .cls = s->cls,
                                    .col = w.score + (size_t)unit * t,
                                    .rank = (fr->components & FG_KEEP_SNAPSHOT) ? w.snap + (size_t)unit * t : NULL};
        const int32_t kept = fg_policy_keep(cp, &fr->pol, &pv, w.rank, w.keep_pos, w.keep_src, w.keep_flags,
                                            w.keep_score, &fr->n_freq);
        if ((st = fg_head_reserve(ctx, fr, fg_pages_for(ctx, kept))))
            break;
        fr->n_slots = kept;
        const float *k = u->k, *v = u->v;
        if (ctx->be.device_io) {
            if ((st = fg_io_write(ctx, w.dk, u->k, (size_t)t * d * sizeof(float))) ||
                (st = fg_io_write(ctx, w.dv, u->v, (size_t)t * d * sizeof(float))))
                break;
            k = w.dk;
            v = w.dv;
        }
        const fg_shape shape = {G, 1, d};
        const fg_compact_head ch = {.kv_head = 0, .n_keep = kept, .pos = w.keep_pos, .flags = w.keep_flags,
                                    .score = w.keep_score, .pages = fr->pages, .src = w.keep_src};
        st = ctx->be.ops->compact(&ctx->be, &ctx->layout, &shape, t, k, v, 1, &ch);
        if (st == FG_OK && ctx->be.device_io && ctx->be.ops->synchronize)
            st = ctx->be.ops->synchronize(&ctx->be); /* the rows are written before the buffers take the next head's */
    }
    if (st == FG_OK && ctx->be.ops->synchronize)
        st = ctx->be.ops->synchronize(&ctx->be);
    scratch_free(ctx, &w);
    if (st) {
        fg_adaptive_abort(ctx, &plan);
        return st;
    }
    *out = plan;
    return FG_OK;
}
