/* The adaptive mode (FG_ALLOC_ADAPTIVE, preset "fastgen-adaptive").
 *
 * Every head of a sequence holds its full cache until the sequence has been
 * observed: at the end of the last layer's prefill, or, for a prompt
 * shorter than defer_until tokens, at the decode step that reaches it.
 * Meanwhile each layer keeps the queries of its last W rows
 * (observation_window) and the pooled attention the prompt gave every key.
 * Then, per (layer, KV head) unit, from the cached keys and values:
 *
 *   1. p[h][i][j]: the attention of each observed row i (at position p_i)
 *      of each query head h of the group over the keys j <= p_i (below
 *      FG_OBSERVE_NEGLIGIBLE: 0, but the row's own), and the full cache's
 *      output o[h][i] = sum_j p[h][i][j] v_j / sum_j p[h][i][j];
 *   2. for every family of the shortlist (its components and the split of
 *      its ratios) and every level l = 0..FG_AD_LEVELS (the family scaled to
 *      keep about l / FG_AD_LEVELS of the rows), the error it would give the
 *      observed rows as the decode queries they were:
 *          err = sum over h, i of || sum_{j in S_i} p[h][i][j] v_j / sum_{j in S_i} p[h][i][j] - o[h][i] ||^2
 *      where S_i is what the family keeps for a query at p_i: the pinned
 *      keys before it and its own key, the window ending at p_i, and the
 *      best-ranked k(p_i + 1) of the others before that window. Values are
 *      part of it, so rows that take attention but move the output little
 *      count for little; windows are anchored where each row was, so a
 *      family's locality is judged as decoding will see it.
 *
 * The budget (budget x the full cache's rows now, over every unit) is then
 * shared: the start is the uniform allocation of the family whose uniform
 * error is lowest, so every uniform policy of the shortlist is a point of
 * the search; a Lagrangian choice per unit, topped up with the leftover rows
 * where they lower the error most per row, replaces it only when its
 * predicted error is lower. Each unit keeps at least alloc_floor of the
 * uniform share. The heads then keep what their (family, level) keeps now,
 * in new pages, and decode on with that policy; the full caches go once
 * every head has its new one.
 *
 * The arithmetic over keys runs where the cache lies (backend.h's
 * adaptive_observe and adaptive_errors); the host ranks the keys, turns
 * every family's sets into entry levels (the first level that keeps a key
 * for a row: the sets are nested), adds the rows' errors in row order and
 * allocates. No backend reads a cache back to decide. */
#define FG_EXPERIMENTAL /* FG_ADAPTIVE_*, fg_cpu_describe (fastgen.h) */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"

/* The predicted error of a level whose arithmetic overflowed (NaN or Inf
 * keys, queries or values): it ranks after every real one, and the sum of
 * every unit's stays finite, so each search below compares real numbers. */
#define FG_AD_WORST 1e300
#define FG_AD_CHOICE(f, l) ((f) * (FG_AD_LEVELS + 1) + (l))
#define FG_AD_FAMILY(c) ((c) / (FG_AD_LEVELS + 1))
#define FG_AD_LEVEL(c) ((c) % (FG_AD_LEVELS + 1))

/* ---------------------------------------------------------------- state */

void fg_adaptive_destroy(fg_context *ctx, fg_adaptive **pad) {
    if (!pad || !*pad)
        return;
    fg_adaptive *ad = *pad;
    for (int32_t l = 0; ad->layers && l < ctx->params.n_layers; l++) {
        free(ad->layers[l].col);
        free(ad->layers[l].q);
        free(ad->layers[l].pos);
        free(ad->layers[l].given);
        free(ad->layers[l].given_col);
    }
    free(ad->layers);
    free(ad);
    *pad = NULL;
}

fg_status fg_adaptive_create(fg_context *ctx, const fg_compression_params *cp, int32_t n_prompt, fg_adaptive **out) {
    const int32_t L = ctx->params.n_layers, Hq = ctx->params.n_q_heads, Hkv = ctx->params.n_kv_heads;
    const int32_t d = ctx->params.head_dim, W = cp->observation_window;
    *out = NULL;
    if (!fg_backend_supports(&ctx->be, FG_FEATURE_ADAPTIVE))
        return fg_error(ctx, FG_ERR_UNAVAILABLE,
                        "FG_ALLOC_ADAPTIVE: backend \"%s\" has no adaptive_observe / adaptive_errors; open the "
                        "context on one that has (ref, cpu, cuda, hip) or choose another allocation",
                        ctx->backend_name);
    if (!fg_observe_when_told(cp->observe) && cp->defer_until - n_prompt > W)
        return fg_error(ctx, FG_ERR_INVALID_ARGUMENT,
                        "FG_ALLOC_ADAPTIVE: defer_until %d is %d decode steps after this prompt of %d tokens, more "
                        "than the %d observed rows (observation_window) would hold", (int)cp->defer_until,
                        (int)(cp->defer_until - n_prompt), (int)n_prompt, (int)W);
    fg_adaptive *ad = calloc(1, sizeof *ad);
    if (ad)
        ad->layers = calloc((size_t)L, sizeof *ad->layers);
    int ok = ad && ad->layers;
    for (int32_t l = 0; ok && l < L; l++) {
        fg_adaptive_layer *a = &ad->layers[l];
        a->col = malloc((size_t)Hkv * n_prompt * sizeof *a->col);
        a->q = malloc((size_t)W * Hq * d * sizeof *a->q);
        a->pos = malloc((size_t)W * sizeof *a->pos);
        ok = a->col && a->q && a->pos;
        if (ok && cp->observe == FG_OBSERVE_EXPLICIT) { /* the ranks' columns come with the first rows */
            a->given = malloc((size_t)2 * W * Hq * d * sizeof *a->given);
            a->stride = 1;
            ok = a->given != NULL;
        }
    }
    if (!ok) {
        fg_adaptive_destroy(ctx, &ad);
        return fg_error(ctx, FG_ERR_OUT_OF_MEMORY, "out of host memory for the adaptive mode's observed rows");
    }
    ad->window = W;
    ad->n_prompt = n_prompt;
    ad->explicit_rows = cp->observe == FG_OBSERVE_EXPLICIT;
    ad->scored = cp->observe == FG_OBSERVE_SCORES;
    ad->horizon = cp->observe != FG_OBSERVE_PREDICTED ? 0 : cp->predict_horizon > 0 ? cp->predict_horizon : 512;
    ad->compress_at = fg_observe_when_told(cp->observe) ? INT32_MAX
                      : cp->defer_until > n_prompt     ? cp->defer_until
                                                       : n_prompt;
    *out = ad;
    return FG_OK;
}

fg_status fg_adaptive_clone(fg_context *ctx, const fg_adaptive *src, fg_adaptive **out) {
    const int32_t Hq = ctx->params.n_q_heads, Hkv = ctx->params.n_kv_heads, d = ctx->params.head_dim;
    fg_compression_params cp;
    memset(&cp, 0, sizeof cp);
    cp.observation_window = src->window;
    cp.observe = src->explicit_rows ? FG_OBSERVE_EXPLICIT
                 : src->scored      ? FG_OBSERVE_SCORES
                 : src->horizon     ? FG_OBSERVE_PREDICTED
                                    : FG_OBSERVE_TAIL;
    cp.predict_horizon = src->horizon;
    cp.defer_until = fg_observe_when_told(cp.observe) ? 0 : src->compress_at;
    fg_status st = fg_adaptive_create(ctx, &cp, src->n_prompt, out);
    if (st)
        return st;
    for (int32_t l = 0; l < ctx->params.n_layers; l++) {
        const fg_adaptive_layer *a = &src->layers[l];
        fg_adaptive_layer *b = &(*out)->layers[l];
        memcpy(b->col, a->col, (size_t)Hkv * src->n_prompt * sizeof *a->col);
        memcpy(b->q, a->q, (size_t)src->window * Hq * d * sizeof *a->q);
        memcpy(b->pos, a->pos, (size_t)src->window * sizeof *a->pos);
        b->n_obs = a->n_obs;
        b->next = a->next;
        if (a->given_col && !(b->given_col = malloc((size_t)Hkv * a->given_keys * sizeof *b->given_col))) {
            fg_adaptive_destroy(ctx, out);
            return fg_error(ctx, FG_ERR_OUT_OF_MEMORY, "out of host memory copying the observed rows' ranks");
        }
        if (a->given_col) {
            memcpy(b->given_col, a->given_col, (size_t)Hkv * a->given_keys * sizeof *a->given_col);
            b->given_keys = a->given_keys;
        }
        b->n_scored = a->n_scored;
        if (a->given) {
            memcpy(b->given, a->given, (size_t)a->n_given * Hq * d * sizeof *a->given);
            b->n_given = a->n_given;
            b->seen = a->seen;
            b->stride = a->stride;
        }
    }
    return FG_OK;
}

/* Given rows q [n][Hq][d] (host) of one layer: every stride-th kept, the
 * stride doubling (every other kept row going) whenever 2 W are held, so
 * the rows kept stay evenly spread over all that were given. */
static void keep_given(const fg_context *ctx, fg_adaptive *ad, int32_t layer, const float *q, int32_t n) {
    const size_t row = (size_t)ctx->params.n_q_heads * ctx->params.head_dim;
    fg_adaptive_layer *a = &ad->layers[layer];
    for (int32_t i = 0; i < n; i++, a->seen++) {
        if (a->seen % a->stride)
            continue;
        if (a->n_given == 2 * ad->window) {
            for (int32_t r = 0; 2 * r < a->n_given; r++)
                memmove(a->given + (size_t)r * row, a->given + (size_t)2 * r * row, row * sizeof *q);
            a->n_given = (a->n_given + 1) / 2;
            a->stride *= 2;
            if (a->seen % a->stride)
                continue;
        }
        memcpy(a->given + (size_t)a->n_given++ * row, q + (size_t)i * row, row * sizeof *q);
    }
}

void fg_adaptive_observe(const fg_context *ctx, fg_adaptive *ad, int32_t layer, int32_t pos, const float *q) {
    const size_t row = (size_t)ctx->params.n_q_heads * ctx->params.head_dim;
    fg_adaptive_layer *a = &ad->layers[layer];
    int32_t at = a->next;
    for (int32_t i = 0; i < a->n_obs; i++) /* a row seen again (a chunk sent again) takes its own place */
        if (a->pos[i] == pos)
            at = i;
    memcpy(a->q + (size_t)at * row, q, row * sizeof *q);
    a->pos[at] = pos;
    if (at == a->next) {
        a->next = (a->next + 1) % ad->window;
        a->n_obs += a->n_obs < ad->window;
    }
}

void fg_adaptive_forget(fg_adaptive *ad, int32_t layer) {
    ad->layers[layer].n_obs = 0;
    ad->layers[layer].next = 0;
}

/* Positions [first, last) of a pass whose rows start at position pos0 (q:
 * [][Hq][d] from pos0, activation memory) join the adaptive mode's observed
 * rows of `layer`. */
fg_status fg_observe_rows(fg_context *ctx, fg_seq *s, int32_t layer, int32_t pos0, int32_t first, int32_t last,
                              const float *q) {
    const size_t row = (size_t)ctx->params.n_q_heads * ctx->params.head_dim;
    float *hq = NULL;
    if (ctx->be.device_io && !(hq = malloc(row * sizeof *hq)))
        return fg_error(ctx, FG_ERR_OUT_OF_MEMORY, "out of host memory for an observed row");
    fg_status st = FG_OK;
    for (int32_t p = first < pos0 ? pos0 : first; p < last && st == FG_OK; p++) {
        const float *qr = q + (size_t)(p - pos0) * row;
        if (ctx->be.device_io) {
            if ((st = fg_backend_read(&ctx->be, hq, qr, row * sizeof *hq)))
                break;
            qr = hq;
        }
        fg_adaptive_observe(ctx, s->ad, layer, p, qr);
    }
    free(hq);
    return st;
}

/* ---------------------------------------------------------------- families */

/* The family `f` at level l: its window and its frequent or snapshot ratios
 * keep their proportion and add up to l / FG_AD_LEVELS. */
static fg_policy family_at(const fg_policy *f, int32_t level) {
    fg_policy p = *f;
    const uint32_t c = fg_effective_components(f->components);
    if (c & FG_KEEP_FULL)
        return p;
    const double b = (double)level / FG_AD_LEVELS;
    const double rl = (c & FG_KEEP_LOCAL) ? f->ratio_local : 0.0;
    const double rf = (c & (FG_KEEP_FREQUENT | FG_KEEP_SNAPSHOT)) ? f->ratio_frequent : 0.0;
    const double sum = rl + rf;
    p.ratio_local = sum > 0.0 ? (float)(b * rl / sum) : (c & FG_KEEP_LOCAL) ? (float)b : 0.0f;
    p.ratio_frequent = sum > 0.0 ? (float)(b * rf / sum) : 0.0f;
    return p;
}

/* Rows family `fam` keeps at every level at length t (§2.4: the pinned
 * rows, the window's others, k(t) of the rest). */
static void family_rows(const fg_policy *fam, int32_t t, const uint8_t *cls, int32_t *rows) {
    const uint32_t c = fg_effective_components(fam->components);
    int32_t pinned = 0;
    for (int32_t j = 0; j < t; j++)
        pinned += fg_is_pinned(c, cls[j]);
    for (int32_t l = 0; l <= FG_AD_LEVELS; l++) {
        if (c & FG_KEEP_FULL) {
            rows[l] = t;
            continue;
        }
        const fg_policy pol = family_at(fam, l);
        const int32_t ws = (c & FG_KEEP_LOCAL) ? t - fg_policy_window(&pol, t) : t;
        int32_t before = 0; /* pinned rows before the window */
        for (int32_t j = 0; j < ws; j++)
            before += fg_is_pinned(c, cls[j]);
        int32_t r = pinned + (t - ws) - (pinned - before);
        if (c & (FG_KEEP_FREQUENT | FG_KEEP_SNAPSHOT)) {
            const int32_t cand = ws - before, k = fg_policy_frequent_budget(&pol, t);
            r += k < cand ? k : cand;
        }
        rows[l] = r;
    }
}

/* ---------------------------------------------------------------- one unit */

/* Entry levels: key j is kept for an observed row at every level from
 * entry[j] on (the sets of a family are nested: windows only grow and k
 * only rises); FG_AD_NEVER: at none of them. */
#define FG_AD_NEVER (FG_AD_LEVELS + 1)

/* entry[j] for observed row at position p and family `fam`, as a decode
 * query at p sees it: its own key and the pinned keys before it at level 0,
 * the window ending at p (w(p + 1)) from the level it reaches j, and the
 * best-ranked k(p + 1) of the others before the window (order: the
 * family's candidates, best first) from the level that first takes j; a
 * taken key the window reaches later stays kept from its first level. */
static void row_entry(const fg_policy *fam, const uint8_t *cls, const fg_rank_entry *order, int32_t n_order,
                      int32_t t, int32_t p, uint32_t flags, uint8_t *entry) {
    /* FG_ADAPTIVE_ANCHOR_END: the window and k of the compression's length for every row */
    const int anchor_end = (flags & FG_ADAPTIVE_ANCHOR_END) != 0;
    const int32_t tr = anchor_end ? t : p + 1, top = anchor_end ? t : p;
    const uint32_t c = fg_effective_components(fam->components);
    memset(entry, FG_AD_NEVER, (size_t)t);
    entry[p] = 0;
    if (c & (FG_KEEP_SPECIAL | FG_KEEP_PUNCT))
        for (int32_t j = 0; j < p; j++)
            if (fg_is_pinned(c, cls[j]))
                entry[j] = 0;
    const int other = (c & (FG_KEEP_FREQUENT | FG_KEEP_SNAPSHOT)) != 0;
    /* the window's first key; the order's next; the other part's keys; whether the row's own is one of them
       (ANCHOR_END: a key before the window at the compression's length, it takes a slot as fg_policy_keep
       gives it one, but is kept from level 0 whatever) */
    int32_t lo = top, next = 0, taken = 0, own_taken = 0;
    for (int32_t l = 0; l <= FG_AD_LEVELS; l++) {
        const fg_policy pol = family_at(fam, l);
        const int32_t nlo = (c & FG_KEEP_LOCAL) ? tr - fg_policy_window(&pol, tr) : top;
        for (int32_t j = lo - 1; j >= nlo; j--) { /* the window grows back */
            if (j == p) {
                taken -= own_taken;
                own_taken = 0;
                continue;
            }
            if (fg_is_pinned(c, cls[j]))
                continue;
            if (entry[j] != FG_AD_NEVER) /* the other part's until now: kept since then */
                taken--;
            else
                entry[j] = (uint8_t)l;
        }
        lo = nlo < lo ? nlo : lo;
        if (other) {
            const int32_t k = fg_policy_frequent_budget(&pol, tr);
            while (taken < k && next < n_order) {
                const int32_t j = order[next++].pos;
                if (j >= lo) /* in the window, or after the row: for good */
                    continue;
                if (j == p)
                    own_taken = 1;
                else
                    entry[j] = (uint8_t)l;
                taken++;
            }
        }
    }
}

/* Host scratch of one unit: t keys, W observed rows of G query heads. */
typedef struct unit_scratch {
    float *q;             /* [W][G][d] the group's observed queries */
    int32_t *slot_pos;    /* [t] */
    float *col_all, *col_decode; /* [t] the observed attention's column sums */
    fg_rank_entry *order; /* [n_fam][t] each family's candidates, best first */
    uint8_t *entry;       /* [n_sets][W][t] entry levels of every family but full */
    double *row_err;      /* [W][n_sets][FG_AD_LEVELS + 1] each row's errors */
    float *scratch;       /* backend memory: fg_observe_scratch_floats */
} unit_scratch;

/* The entry levels of one observed row for every family but full. */
typedef struct entry_job {
    const fg_seq *s;
    const unit_scratch *u;
    const int32_t *n_order, *obs_pos, *sets; /* sets: [n_sets] the family of each */
    int32_t t, W, n_sets;
} entry_job;

static void entry_row(void *arg, int32_t i, int32_t thread) {
    (void)thread;
    const entry_job *j = arg;
    const fg_seq *s = j->s;
    for (int32_t x = 0; x < j->n_sets; x++) {
        const int32_t f = j->sets[x];
        row_entry(&s->cp.shortlist[f], s->cls, j->u->order + (size_t)f * j->t, j->n_order[f], j->t, j->obs_pos[i],
                  s->cp.adaptive_flags, j->u->entry + ((size_t)x * j->W + i) * j->t);
    }
}

/* ---------------------------------------------------------------- allocation */

typedef struct unit_curves {
    double err[FG_MAX_SHORTLIST][FG_AD_LEVELS + 1];
    int32_t rows[FG_MAX_SHORTLIST][FG_AD_LEVELS + 1];
} unit_curves;

/* FG_OBSERVE_SCORES' errors under FG_ADAPTIVE_MASS: for every family but full and every level,
 * the share of the unit's scores on the keys it does not keep for a decode
 * query after the sequence (its entry levels as row_entry gives them, at
 * position t - 1). In double, summed in key order. */
static void scored_mass(const fg_seq *s, unit_scratch *u, const int32_t *n_order, const int32_t *sets, int32_t n_sets,
                        int32_t t, const float *score, unit_curves *uc) {
    double total = 0.0;
    for (int32_t j = 0; j < t; j++)
        total += score[j];
    for (int32_t x = 0; x < n_sets; x++) {
        const int32_t f = sets[x];
        uint8_t *entry = u->entry; /* the first family's row: scratch enough for one */
        row_entry(&s->cp.shortlist[f], s->cls, u->order + (size_t)f * t, n_order[f], t, t - 1, s->cp.adaptive_flags,
                  entry);
        double missed[FG_AD_LEVELS + 2] = {0}; /* by entry level; FG_AD_NEVER's at the end */
        for (int32_t j = 0; j < t; j++)
            missed[entry[j]] += score[j];
        double above = total; /* the scores of the keys a level has not taken yet */
        for (int32_t lv = 0; lv <= FG_AD_LEVELS; lv++) {
            above -= missed[lv];
            uc->err[f][lv] = total > 0.0 ? (above > 0.0 ? above : 0.0) / total : 0.0;
        }
    }
}

/* The summed error and rows of one choice per unit. */
static double total(const unit_curves *uc, const int32_t *choice, int32_t n_units, int64_t *rows) {
    double e = 0.0;
    int64_t r = 0;
    for (int32_t u = 0; u < n_units; u++) {
        e += uc[u].err[FG_AD_FAMILY(choice[u])][FG_AD_LEVEL(choice[u])];
        r += uc[u].rows[FG_AD_FAMILY(choice[u])][FG_AD_LEVEL(choice[u])];
    }
    *rows = r;
    return e;
}

/* Whether a choice of rows r keeps the floor (the full cache always does). */
static int above_floor(int32_t r, int32_t level, int64_t floor_rows) { return r >= floor_rows || level == FG_AD_LEVELS; }

/* Each unit's choice minimising err + lambda rows (ties: fewer rows). */
static void lagrange(const unit_curves *uc, int32_t n_units, int32_t n_fam, int64_t floor_rows, double lambda,
                     int32_t *choice) {
    for (int32_t u = 0; u < n_units; u++) {
        double best = INFINITY;
        int32_t best_rows = 0;
        choice[u] = FG_AD_CHOICE(n_fam - 1, FG_AD_LEVELS); /* full: every unit has it */
        for (int32_t f = 0; f < n_fam; f++)
            for (int32_t l = 0; l <= FG_AD_LEVELS; l++) {
                const int32_t r = uc[u].rows[f][l];
                if (!above_floor(r, l, floor_rows))
                    continue;
                const double v = uc[u].err[f][l] + lambda * r;
                if (v < best || (v == best && r < best_rows)) {
                    best = v;
                    best_rows = r;
                    choice[u] = FG_AD_CHOICE(f, l);
                }
            }
    }
}

/* The leftover rows to the single-unit moves that lower the error most per
 * row added. Each move lowers one unit's (finite) error strictly, so no
 * choice comes back and the loop ends. */
static void fill(const unit_curves *uc, int32_t n_units, int32_t n_fam, int64_t budget, int64_t floor_rows,
                 int32_t *choice) {
    int64_t used;
    total(uc, choice, n_units, &used);
    for (;;) {
        int32_t bu = -1, bc = -1;
        double best = 0.0;
        for (int32_t u = 0; u < n_units; u++) {
            const double e0 = uc[u].err[FG_AD_FAMILY(choice[u])][FG_AD_LEVEL(choice[u])];
            const int32_t r0 = uc[u].rows[FG_AD_FAMILY(choice[u])][FG_AD_LEVEL(choice[u])];
            for (int32_t f = 0; f < n_fam; f++)
                for (int32_t l = 0; l <= FG_AD_LEVELS; l++) {
                    const int64_t dr = (int64_t)uc[u].rows[f][l] - r0;
                    const double de = e0 - uc[u].err[f][l];
                    if (!(de > 0.0) || used + dr > budget || !above_floor(uc[u].rows[f][l], l, floor_rows))
                        continue;
                    const double gain = dr <= 0 ? INFINITY : de / (double)dr;
                    if (gain > best) {
                        best = gain;
                        bu = u;
                        bc = FG_AD_CHOICE(f, l);
                    }
                }
        }
        if (bu < 0)
            return;
        used += (int64_t)uc[bu].rows[FG_AD_FAMILY(bc)][FG_AD_LEVEL(bc)] -
                uc[bu].rows[FG_AD_FAMILY(choice[bu])][FG_AD_LEVEL(choice[bu])];
        choice[bu] = bc;
    }
}

/* The choice of n_units units within `budget` rows (see the file's comment). */
static void allocate(const unit_curves *uc, int32_t n_units, int32_t n_fam, int64_t budget, float floor_share,
                     int32_t *choice, int32_t *scratch) {
    double best = INFINITY;
    for (int32_t f = 0; f < n_fam; f++) /* the uniform starts: one family at the highest level that fits */
        for (int32_t l = FG_AD_LEVELS; l >= 0; l--) {
            for (int32_t u = 0; u < n_units; u++)
                scratch[u] = FG_AD_CHOICE(f, l);
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
    if (best == INFINITY) { /* nothing fits: every unit at the first family's least */
        for (int32_t u = 0; u < n_units; u++)
            choice[u] = FG_AD_CHOICE(0, 0);
        return;
    }
    const int64_t floor_rows = (int64_t)floor((double)floor_share * (double)budget / n_units);
    double lo = 0.0, hi = 1.0;
    int64_t rows;
    for (int it = 0; it < 200; it++) { /* a lambda whose choice fits */
        lagrange(uc, n_units, n_fam, floor_rows, hi, scratch);
        total(uc, scratch, n_units, &rows);
        if (rows <= budget)
            break;
        lo = hi;
        hi *= 4.0;
    }
    for (int it = 0; it < 60; it++) { /* the least such lambda */
        const double mid = 0.5 * (lo + hi);
        lagrange(uc, n_units, n_fam, floor_rows, mid, scratch);
        total(uc, scratch, n_units, &rows);
        if (rows <= budget)
            hi = mid;
        else
            lo = mid;
    }
    lagrange(uc, n_units, n_fam, floor_rows, hi, scratch);
    total(uc, scratch, n_units, &rows);
    if (rows > budget)
        return;
    fill(uc, n_units, n_fam, budget, floor_rows, scratch);
    if (total(uc, scratch, n_units, &rows) < best && rows <= budget)
        memcpy(choice, scratch, (size_t)n_units * sizeof *choice);
}

/* The error of keeping the least: each unit at level 0 of its best family
 * but the last (full). */
static double least_error(const unit_curves *uc, int32_t n_units, int32_t n_fam) {
    double least = 0.0;
    for (int32_t u = 0; u < n_units && n_fam > 1; u++) {
        double e = FG_AD_WORST;
        for (int32_t f = 0; f < n_fam - 1; f++)
            e = uc[u].err[f][0] < e ? uc[u].err[f][0] : e;
        least += e;
    }
    return least;
}

/* The fewest rows the n_units units can keep with a predicted error of at
 * most target, with no floor: the rows of the Lagrangian choice with the
 * largest lambda whose error stays within it (lambda 0 chooses the least
 * error, 0 at the full cache, so one always does). */
static int64_t tolerance_rows(const unit_curves *uc, int32_t n_units, int32_t n_fam, double target,
                              int32_t *scratch) {
    int64_t rows;
    double lo = 0.0, hi = 1.0;
    for (int it = 0; it < 200; it++) { /* a lambda whose choice passes the target */
        lagrange(uc, n_units, n_fam, 0, hi, scratch);
        if (total(uc, scratch, n_units, &rows) > target)
            break;
        lo = hi;
        hi *= 4.0;
    }
    for (int it = 0; it < 60; it++) { /* the largest that keeps within it */
        const double mid = 0.5 * (lo + hi);
        lagrange(uc, n_units, n_fam, 0, mid, scratch);
        if (total(uc, scratch, n_units, &rows) <= target)
            lo = mid;
        else
            hi = mid;
    }
    lagrange(uc, n_units, n_fam, 0, lo, scratch);
    total(uc, scratch, n_units, &rows);
    return rows;
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
    float *score, *snap;          /* [units][t] the frequent part's ranks and the snapshot's */
    float *pooled;                /* [t] */
    int32_t *choice, *tmp;        /* [units] */
    int32_t *obs_pos;             /* [W] observed rows in position order */
    const float **obs_q;          /* [W] their queries, [Hq][d] each */
    float *turn;                  /* FG_OBSERVE_PREDICTED: [W][rope_dims / 2][2] the cos and sin that advance
                                     each observed row to its predicted position */
    int32_t *keep_pos, *keep_src; /* [t] */
    uint8_t *keep_flags;          /* [t] */
    float *keep_score;            /* [t] */
    fg_rank_entry *rank;          /* [t] */
    float *hk, *hv;               /* [t][d] a head's rows on the host, to compact from (host activations of a
                                     backend with its own memory) */
} compress_scratch;

static void scratch_free(fg_context *ctx, compress_scratch *w) {
    void *host[] = {w->u.q,      w->u.slot_pos,  w->u.col_all,   w->u.col_decode, w->u.order, w->u.entry,
                    w->u.row_err, w->curves,     w->score,       w->snap,         w->pooled,  w->choice,
                    w->tmp,      w->obs_pos,     (void *)w->obs_q, w->keep_pos,   w->keep_src, w->keep_flags,
                    w->keep_score, w->rank,      w->hk,          w->hv,           w->turn};
    for (size_t i = 0; i < sizeof host / sizeof host[0]; i++)
        free(host[i]);
    if (w->u.scratch) {
        if (ctx->be.ops->synchronize)
            ctx->be.ops->synchronize(&ctx->be); /* nothing queued still reads it */
        ctx->be.ops->buffer_free(&ctx->be, w->u.scratch);
    }
}

void fg_adaptive_abort(fg_context *ctx, fg_adaptive_plan **pplan) {
    if (!pplan || !*pplan)
        return;
    fg_adaptive_plan *plan = *pplan;
    for (int32_t i = 0; plan->fresh && i < plan->n_units; i++) {
        fg_head_free(ctx, &plan->fresh[i]);
    }
    free(plan->fresh);
    fg_adaptive_destroy(ctx, &plan->ad);
    free(plan);
    *pplan = NULL;
}

void fg_adaptive_trade(fg_seq *s, fg_adaptive_plan *plan) {
    for (int32_t unit = 0; unit < plan->n_units; unit++) {
        const fg_head h = s->heads[unit];
        s->heads[unit] = plan->fresh[unit];
        plan->fresh[unit] = h;
    }
    fg_adaptive *ad = s->ad;
    s->ad = plan->ad;
    plan->ad = ad;
}


/* The unit's full cache as the observe op sees it (scratch: the unit's). */
static fg_observe_unit observe_view(const fg_head *h, int32_t t, int32_t W, const int32_t *obs_pos, float *scratch) {
    return (fg_observe_unit){.pages = h->pages, .meta = h->meta, .n_pages = h->n_pages, .t = t, .n_rows = W,
                             .row_pos = obs_pos, .scratch = scratch};
}

/* FG_OBSERVE_PREDICTED: the turns (fg_rope_turns, [W][rope_dims]) that
 * take row i of W, at pos[i] (ascending), to position t - 1 + (i + 1) H / W:
 * the rows spread over the next H tokens in their order. */
static void predicted_turns(const fg_context *ctx, const int32_t *pos, int32_t W, int32_t t, int32_t H, float *turn) {
    for (int32_t i = 0; i < W; i++) {
        const int64_t ahead = (int64_t)(i + 1) * H / W;
        fg_rope_turns(ctx, (int64_t)t - 1 + (ahead > 0 ? ahead : 1) - pos[i], turn + (size_t)i * ctx->params.rope_dims);
    }
}

/* The curves of every unit: observed where the cache lies, ranked and
 * given entry levels on the host, their errors where the cache lies. */
static fg_status unit_curves_all(fg_context *ctx, const fg_seq *s, compress_scratch *w) {
    const int32_t L = ctx->params.n_layers, Hq = ctx->params.n_q_heads, Hkv = ctx->params.n_kv_heads;
    const int32_t d = ctx->params.head_dim, G = Hq / Hkv, t = s->length[0], n_fam = s->cp.n_policies;
    const int32_t n_prompt = s->ad->n_prompt;
    const fg_adaptive *ad = s->ad;
    unit_scratch *u = &w->u;
    const fg_shape shape = {G, 1, d};
    int32_t sets[FG_MAX_SHORTLIST], n_sets = 0; /* the families with errors to compute: all but full */
    for (int32_t f = 0; f < n_fam; f++)
        if (!(s->cp.shortlist[f].components & FG_KEEP_FULL))
            sets[n_sets++] = f;
    for (int32_t l = 0; l < L; l++) {
        const fg_adaptive_layer *a = &ad->layers[l];
        /* FG_OBSERVE_EXPLICIT's rows, else the tail's. Every given row ranked the keys as it came
         * (given_col); the errors are judged on observation_window of the ones kept, evenly spaced.
         * FG_OBSERVE_SCORES: the given scores rank (given_col), the tail's rows judge */
        const int given = a->n_given > 0, ranked = given || a->n_scored > 0; /* (a failed call may have widened
                                                                                  given_col: it ranks nothing) */
        /* FG_OBSERVE_SCORES with FG_ADAPTIVE_MASS: the scores' own mass judges, no rows */
        const int by_mass = ad->scored && (s->cp.adaptive_flags & FG_ADAPTIVE_MASS);
        const int32_t n_kept = by_mass ? 0 : given ? a->n_given : a->n_obs;
        const int32_t W = n_kept < ad->window ? n_kept : ad->window;
        for (int32_t i = 0; i < W; i++) {
            if (given) { /* decode queries after the sequence: every key, the last one their "own" */
                w->obs_pos[i] = t - 1;
                w->obs_q[i] = a->given + (size_t)(((2 * (int64_t)i + 1) * n_kept) / (2 * W)) * Hq * d;
            } else { /* the ring's oldest first: positions ascend */
                const int32_t slot = (a->next - W + i + ad->window) % ad->window;
                w->obs_pos[i] = a->pos[slot];
                w->obs_q[i] = a->q + (size_t)slot * Hq * d;
            }
        }
        const int predicted = ad->horizon > 0 && !given; /* the rows advanced, then judged after the sequence */
        if (predicted) {
            predicted_turns(ctx, w->obs_pos, W, t, ad->horizon, w->turn);
            for (int32_t i = 0; i < W; i++)
                w->obs_pos[i] = t - 1;
        }
        for (int32_t g = 0; g < Hkv; g++) {
            const int32_t unit = l * Hkv + g;
            const fg_head *h = &s->heads[unit];
            fg_status st = fg_backend_read_slots(&ctx->be, &ctx->layout, h->meta, t, u->slot_pos, NULL, NULL);
            if (st)
                return st;
            for (int32_t j = 0; j < t; j++) /* a full head holds every position once, in order */
                if (u->slot_pos[j] != j)
                    return fg_error(ctx, FG_ERR_INTERNAL, "adaptive compression: layer %d head %d slot %d holds "
                                    "position %d", (int)l, (int)g, (int)j, (int)u->slot_pos[j]);
            for (int32_t i = 0; i < W; i++) { /* the group's queries */
                memcpy(u->q + (size_t)i * G * d, w->obs_q[i] + (size_t)g * G * d, (size_t)G * d * sizeof *u->q);
                if (predicted)
                    fg_rope_turn(ctx, w->turn + (size_t)i * ctx->params.rope_dims, u->q + (size_t)i * G * d, G);
            }
            const fg_observe_unit ou = observe_view(h, t, W, w->obs_pos, u->scratch);
            if (W == 0) { /* nothing observed: the profile alone ranks */
                memset(u->col_all, 0, (size_t)t * sizeof *u->col_all);
                memset(u->col_decode, 0, (size_t)t * sizeof *u->col_decode);
            } else if ((st = ctx->be.ops->adaptive_observe(&ctx->be, &ctx->layout, &shape, &ou, u->q,
                                                           predicted ? 0 : n_prompt, u->col_all, u->col_decode))) {
                return st;
            }
            /* the ranks: the frequent part's is the cumulative attention of every row so far (the prompt's
             * profile, then the observed decode rows, or the predicted rows as if decoded), the snapshot's the
             * observed (predicted) rows'; given rows or scores: theirs */
            float *score = w->score + (size_t)unit * t, *snap = w->snap + (size_t)unit * t;
            for (int32_t j = 0; j < t; j++) {
                score[j] = ranked ? (j < a->given_keys ? a->given_col[(size_t)g * a->given_keys + j] : 0.0f)
                                  : (j < n_prompt ? a->col[(size_t)g * n_prompt + j] : 0.0f) + u->col_decode[j];
                snap[j] = ranked ? score[j] : u->col_all[j];
            }
            if (s->cp.score_pool > 1) {
                const fg_profile_view raw = {.n = t, .row_begin = 0, .length = t, .cls = s->cls, .col = snap};
                fg_policy_pool_ranks(&s->cp, &raw, w->pooled);
                memcpy(snap, w->pooled, (size_t)t * sizeof *snap);
            }
            unit_curves *uc = &w->curves[unit];
            int32_t n_order[FG_MAX_SHORTLIST];
            for (int32_t f = 0; f < n_fam; f++) { /* each family's candidates, ranked as fg_policy_keep does */
                const uint32_t c = fg_effective_components(s->cp.shortlist[f].components);
                fg_rank_entry *order = u->order + (size_t)f * t;
                n_order[f] = 0;
                if ((c & (FG_KEEP_FREQUENT | FG_KEEP_SNAPSHOT)) && !(c & FG_KEEP_FULL))
                    for (int32_t j = 0; j < t; j++)
                        if (!fg_is_pinned(c, s->cls[j]))
                            order[n_order[f]++] = (fg_rank_entry){(c & FG_KEEP_SNAPSHOT) ? snap[j] : score[j], j};
                fg_policy_rank_sort(order, n_order[f]);
                family_rows(&s->cp.shortlist[f], t, s->cls, uc->rows[f]);
                for (int32_t lv = 0; lv <= FG_AD_LEVELS; lv++)
                    uc->err[f][lv] = 0.0;
            }
            if (by_mass && n_sets > 0) {
                scored_mass(s, u, n_order, sets, n_sets, t, score, uc);
                continue;
            }
            if (n_sets == 0 || W == 0)
                continue;
            const entry_job ej = {s, u, n_order, w->obs_pos, sets, t, W, n_sets};
            if ((st = fg_threadpool_run(ctx->threads, W, entry_row, (void *)&ej)) ||
                (st = ctx->be.ops->adaptive_errors(&ctx->be, &shape, &ou, n_sets, FG_AD_LEVELS + 1, u->entry,
                                                   (s->cp.adaptive_flags & FG_ADAPTIVE_MASS) != 0, u->row_err)))
                return st;
            const uint32_t fl = s->cp.adaptive_flags;
            for (int32_t i = 0; i < W; i++) { /* in row order, whatever the backend */
                /* ROW_NORM: every family's errors of the row over one reference, its least level-0 error */
                double ref = 0.0;
                for (int32_t x = 0; x < n_sets; x++) {
                    const double e0 = u->row_err[((size_t)i * n_sets + x) * (FG_AD_LEVELS + 1)];
                    ref = x == 0 || e0 < ref ? e0 : ref;
                }
                const double scale = (fl & FG_ADAPTIVE_ROW_NORM) && ref > 0.0 ? 1.0 / ref : 1.0;
                for (int32_t x = 0; x < n_sets; x++) {
                    const double *re = u->row_err + ((size_t)i * n_sets + x) * (FG_AD_LEVELS + 1);
                    for (int32_t lv = 0; lv <= FG_AD_LEVELS; lv++) {
                        double *e = &uc->err[sets[x]][lv];
                        const double r = re[lv] * scale;
                        *e = (fl & FG_ADAPTIVE_ROW_MAX) ? (r > *e || r != r ? r : *e) : *e + r;
                    }
                }
            }
            for (int32_t f = 0; f < n_fam; f++)
                for (int32_t lv = 0; lv <= FG_AD_LEVELS; lv++)
                    if (!(uc->err[f][lv] <= FG_AD_WORST)) /* NaN or above: the worst */
                        uc->err[f][lv] = FG_AD_WORST;
        }
    }
    return FG_OK;
}

/* The new cache of one unit in fr: what its (family, level) keeps now, in
 * new pages, compacted from the unit's rows unpacked where they lie (the
 * scratch, when activation memory is backend memory), else on the host. */
static fg_status unit_compact(fg_context *ctx, const fg_seq *s, int32_t unit, int32_t choice, compress_scratch *w,
                              fg_head *fr) {
    const int32_t d = ctx->params.head_dim, G = ctx->params.n_q_heads / ctx->params.n_kv_heads, t = s->length[0];
    const fg_head *h = &s->heads[unit];
    const fg_shape shape = {G, 1, d};
    const float *k, *v;
    fg_status st;
    if (w->hk) {
        st = fg_head_read_rows(&ctx->be, &ctx->layout, h, t, w->hk, w->hv, NULL, NULL, NULL);
        k = w->hk;
        v = w->hv;
    } else {
        const fg_observe_unit ou = observe_view(h, t, 0, NULL, w->u.scratch);
        st = ctx->be.ops->adaptive_observe(&ctx->be, &ctx->layout, &shape, &ou, NULL, 0, NULL, NULL);
        k = w->u.scratch;
        v = k + (size_t)t * d;
    }
    if (st)
        return st;
    fr->policy_index = FG_AD_FAMILY(choice);
    fr->pol = family_at(&s->cp.shortlist[fr->policy_index], FG_AD_LEVEL(choice));
    fr->components = fg_effective_components(fr->pol.components);
    memcpy(fr->recovery, h->recovery, sizeof fr->recovery);
    const fg_profile_view pv = {.n = t, .row_begin = 0, .length = t, .cls = s->cls, .col = w->score + (size_t)unit * t,
                                .rank = (fr->components & FG_KEEP_SNAPSHOT) ? w->snap + (size_t)unit * t : NULL};
    const int32_t kept = fg_policy_keep(&s->cp, &fr->pol, &pv, w->rank, w->keep_pos, w->keep_src, w->keep_flags,
                                        w->keep_score, &fr->n_freq);
    if ((st = fg_head_reserve(ctx, fr, fg_pages_for(ctx, kept))))
        return st;
    fr->n_slots = kept;
    fg_head_compacted(fr);
    const fg_compact_head ch = {.kv_head = 0, .n_keep = kept, .pos = w->keep_pos, .flags = w->keep_flags,
                                .score = w->keep_score, .pages = fr->pages, .meta = fr->meta,
                                .src = w->keep_src};
    st = ctx->be.ops->compact(&ctx->be, &ctx->layout, &shape, t, k, v, 1, &ch);
    if (st == FG_OK && ctx->be.ops->synchronize)
        st = ctx->be.ops->synchronize(&ctx->be); /* written before the scratch takes the next head's rows */
    return st;
}

/* The budget in rows of every unit at length t. */
static int64_t budget_of(const fg_compression_params *cp, int32_t n_units, int32_t t) {
    int64_t budget = INT64_MAX;
    if (cp->budget > 0.0f)
        budget = (int64_t)ceil((double)cp->budget * n_units * t);
    if (cp->budget_tokens > 0 && (int64_t)cp->budget_tokens * n_units < budget)
        budget = (int64_t)cp->budget_tokens * n_units;
    return budget;
}

/* The rows n_units units share: the budget's, or under a tolerance the
 * fewest whose allocation meets it (the floor the allocation keeps may need
 * more than the search without one found: then the least budget that does,
 * by bisection), capped by the budget when there is one too. choice and
 * scratch: [n_units] of the caller's, overwritten. */
static int64_t rows_for(const fg_compression_params *cp, const unit_curves *uc, int32_t n_units, int32_t t,
                        int32_t *choice, int32_t *scratch) {
    const int64_t budget = budget_of(cp, n_units, t);
    if (!(cp->tolerance > 0.0f))
        return budget;
    const int32_t n_fam = cp->n_policies;
    const double target = (double)cp->tolerance * least_error(uc, n_units, n_fam);
    int64_t lo = tolerance_rows(uc, n_units, n_fam, target, scratch), hi = (int64_t)n_units * t, rows;
    allocate(uc, n_units, n_fam, lo, cp->alloc_floor, choice, scratch);
    if (total(uc, choice, n_units, &rows) > target) { /* lo falls short, the full cache (hi) does not */
        while (hi - lo > 1) {
            const int64_t mid = lo + (hi - lo) / 2;
            allocate(uc, n_units, n_fam, mid, cp->alloc_floor, choice, scratch);
            if (total(uc, choice, n_units, &rows) <= target)
                hi = mid;
            else
                lo = mid;
        }
        lo = hi;
    }
    return lo < budget ? lo : budget;
}

static fg_status scratch_alloc(fg_context *ctx, compress_scratch *w, int32_t t, int32_t W, int32_t G, int32_t d,
                               int32_t n_fam, int32_t n_units, int predicted) {
    unit_scratch *u = &w->u;
    u->q = malloc((size_t)(W ? W : 1) * G * d * sizeof *u->q);
    u->slot_pos = malloc((size_t)t * sizeof *u->slot_pos);
    u->col_all = malloc((size_t)t * sizeof *u->col_all);
    u->col_decode = malloc((size_t)t * sizeof *u->col_decode);
    u->order = malloc((size_t)n_fam * t * sizeof *u->order);
    u->entry = malloc((size_t)n_fam * (W ? W : 1) * t);
    u->row_err = malloc((size_t)(W ? W : 1) * n_fam * (FG_AD_LEVELS + 1) * sizeof *u->row_err);
    w->curves = malloc((size_t)n_units * sizeof *w->curves);
    w->score = malloc((size_t)n_units * t * sizeof *w->score);
    w->snap = malloc((size_t)n_units * t * sizeof *w->snap);
    w->pooled = malloc((size_t)t * sizeof *w->pooled);
    w->choice = malloc((size_t)n_units * sizeof *w->choice);
    w->tmp = malloc((size_t)n_units * sizeof *w->tmp);
    w->obs_pos = malloc((size_t)(W ? W : 1) * sizeof *w->obs_pos);
    w->obs_q = malloc((size_t)(W ? W : 1) * sizeof *w->obs_q);
    w->keep_pos = malloc((size_t)t * sizeof *w->keep_pos);
    w->keep_src = malloc((size_t)t * sizeof *w->keep_src);
    w->keep_flags = malloc((size_t)t);
    w->keep_score = malloc((size_t)t * sizeof *w->keep_score);
    w->rank = malloc((size_t)t * sizeof *w->rank);
    if (predicted)
        w->turn = malloc((size_t)(W ? W : 1) * ctx->params.rope_dims * sizeof *w->turn);
    /* a backend with its own memory under host activations compacts from host rows */
    const int host_rows = ctx->be.ops->buffer_read && !ctx->be.device_io;
    if (host_rows) {
        w->hk = malloc((size_t)t * d * sizeof *w->hk);
        w->hv = malloc((size_t)t * d * sizeof *w->hv);
    }
    if (!(u->q && u->slot_pos && u->col_all && u->col_decode && u->order && u->entry && u->row_err && w->curves &&
          w->score && w->snap && w->pooled && w->choice && w->tmp && w->obs_pos && w->obs_q && w->keep_pos &&
          w->keep_src && w->keep_flags && w->keep_score && w->rank && (!host_rows || (w->hk && w->hv)) &&
          (!predicted || w->turn)))
        return fg_error(ctx, FG_ERR_OUT_OF_MEMORY, "out of host memory compressing a sequence of %d tokens", (int)t);
    return ctx->be.ops->buffer_alloc(&ctx->be, fg_observe_scratch_floats(t, W, G, d) * sizeof(float),
                                     (void **)&u->scratch);
}

fg_status fg_adaptive_prepare(fg_context *ctx, fg_seq *s, fg_adaptive_plan **out) {
    const int32_t L = ctx->params.n_layers, Hq = ctx->params.n_q_heads, Hkv = ctx->params.n_kv_heads;
    const int32_t d = ctx->params.head_dim, G = Hq / Hkv, n_units = L * Hkv;
    const fg_compression_params *cp = &s->cp;
    const int32_t t = s->length[0], W = s->ad->window, n_fam = cp->n_policies;
    *out = NULL;
    compress_scratch w;
    memset(&w, 0, sizeof w);
    fg_status st = scratch_alloc(ctx, &w, t, W, G, d, n_fam, n_units, s->ad->horizon > 0);
    fg_adaptive_plan *plan = st == FG_OK ? calloc(1, sizeof *plan) : NULL;
    if (plan) {
        plan->n_units = n_units;
        plan->fresh = calloc((size_t)n_units, sizeof *plan->fresh);
    }
    if (st == FG_OK && !(plan && plan->fresh))
        st = fg_error(ctx, FG_ERR_OUT_OF_MEMORY, "out of host memory compressing a sequence of %d tokens", (int)t);
    if (st == FG_OK)
        st = unit_curves_all(ctx, s, &w);
    if (st == FG_OK && (cp->adaptive_flags & FG_ADAPTIVE_PER_LAYER)) /* each layer its share, among its heads */
        for (int32_t l = 0; l < L; l++)
            allocate(w.curves + (size_t)l * Hkv, Hkv, n_fam,
                     rows_for(cp, w.curves + (size_t)l * Hkv, Hkv, t, w.choice + (size_t)l * Hkv, w.tmp),
                     cp->alloc_floor, w.choice + (size_t)l * Hkv, w.tmp);
    else if (st == FG_OK)
        allocate(w.curves, n_units, n_fam, rows_for(cp, w.curves, n_units, t, w.choice, w.tmp), cp->alloc_floor,
                 w.choice, w.tmp);
    for (int32_t unit = 0; unit < n_units && st == FG_OK; unit++)
        st = unit_compact(ctx, s, unit, w.choice[unit], &w, &plan->fresh[unit]);
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

fg_status fg_adaptive_compress(fg_context *ctx, fg_seq *s) {
    fg_adaptive_plan *plan = NULL;
    fg_status st = fg_adaptive_prepare(ctx, s, &plan);
    if (st)
        return st;
    fg_adaptive_trade(s, plan);
    fg_adaptive_abort(ctx, &plan); /* the full caches go */
    return FG_OK;
}

fg_status fg_adaptive_step_begin(fg_context *ctx, int32_t layer, int32_t n_seqs, const int32_t *seqs,
                                 fg_adaptive_plan ***out) {
    fg_adaptive_plan **plans = NULL;
    fg_status st = FG_OK;
    *out = NULL;
    for (int32_t i = 0; i < n_seqs; i++) {
        fg_seq *s = &ctx->seqs[seqs[i]];
        if (!s->ad || s->ad->compress_at == s->n_prompt || s->length[layer] != s->ad->compress_at)
            continue;
        int ready = 1;
        for (int32_t l = 0; l < ctx->params.n_layers; l++)
            ready &= s->length[l] == s->ad->compress_at;
        if (!ready)
            continue;
        if (!plans && !(plans = calloc((size_t)n_seqs, sizeof *plans)))
            return fg_error(ctx, FG_ERR_OUT_OF_MEMORY, "out of host memory for a decode batch of %d", (int)n_seqs);
        if ((st = fg_adaptive_prepare(ctx, s, &plans[i])) != FG_OK)
            break;
    }
    if (st) {
        for (int32_t i = 0; i < n_seqs; i++)
            fg_adaptive_abort(ctx, &plans[i]);
        free(plans);
        return st;
    }
    for (int32_t i = 0; plans && i < n_seqs; i++)
        if (plans[i])
            fg_adaptive_trade(&ctx->seqs[seqs[i]], plans[i]);
    *out = plans;
    return FG_OK;
}

void fg_adaptive_step_end(fg_context *ctx, int32_t n_seqs, const int32_t *seqs, fg_adaptive_plan **plans,
                          fg_status st) {
    if (!plans)
        return;
    for (int32_t i = 0; i < n_seqs; i++) {
        if (plans[i] && st)
            fg_adaptive_trade(&ctx->seqs[seqs[i]], plans[i]); /* back: the full caches again */
        fg_adaptive_abort(ctx, &plans[i]);
    }
    free(plans);
}

fg_status fg_adaptive_layer_prefilled(fg_context *ctx, fg_seq *s, int32_t layer, int32_t n, const float *q) {
    if (!s->ad)
        return FG_OK;
    fg_status st = FG_OK;
    if (q) { /* the prompt's last rows are the observed ones (a chunked prefill observed them chunk by chunk) */
        fg_adaptive_forget(s->ad, layer);
        st = fg_observe_rows(ctx, s, layer, 0, n - (n < s->ad->window ? n : s->ad->window), n, q);
    }
    if (st == FG_OK && s->ad->compress_at == n && fg_all_prefilled(ctx, s))
        st = fg_adaptive_compress(ctx, s);
    return st;
}

fg_status fg_adaptive_chunk_prefilled(fg_context *ctx, fg_seq *s, int32_t layer, int32_t begin, int32_t n,
                                      int32_t N, const float *q) {
    if (!s->ad)
        return FG_OK;
    if (begin == 0)
        fg_adaptive_forget(s->ad, layer);
    return fg_observe_rows(ctx, s, layer, begin, N - (N < s->ad->window ? N : s->ad->window), begin + n, q);
}

int fg_adaptive_due(const fg_context *ctx, const fg_seq *s) {
    if (!s->ad || s->length[0] < s->ad->compress_at)
        return 0;
    for (int32_t l = 1; l < ctx->params.n_layers; l++)
        if (s->length[l] != s->length[0])
            return 0;
    return 1;
}

fg_status fg_adaptive_curves(fg_context *ctx, const fg_seq *s, double *err, int32_t *rows, int64_t *budget_rows) {
    const int32_t n_units = ctx->params.n_layers * ctx->params.n_kv_heads, n_fam = s->cp.n_policies;
    const int32_t d = ctx->params.head_dim, G = ctx->params.n_q_heads / ctx->params.n_kv_heads, t = s->length[0];
    const int32_t W = s->ad->window;
    compress_scratch w;
    memset(&w, 0, sizeof w);
    fg_status st = scratch_alloc(ctx, &w, t, W, G, d, n_fam, n_units, s->ad->horizon > 0);
    if (st == FG_OK)
        st = unit_curves_all(ctx, s, &w);
    for (int32_t unit = 0; st == FG_OK && unit < n_units; unit++)
        for (int32_t f = 0; f < n_fam; f++)
            for (int32_t l = 0; l <= FG_AD_LEVELS; l++) {
                const size_t at = ((size_t)unit * n_fam + f) * (FG_AD_LEVELS + 1) + l;
                err[at] = w.curves[unit].err[f][l];
                rows[at] = w.curves[unit].rows[f][l];
            }
    if (st == FG_OK)
        *budget_rows = budget_of(&s->cp, n_units, t);
    scratch_free(ctx, &w);
    return st;
}

/* ---------------------------------------------------------------- the engine's own rows */

/* A layer's given ranks widened to t keys (zeros after the old ones):
 * the same sums, wider, so nothing of the sequence changes. */
static fg_status given_cols_grow(fg_context *ctx, fg_adaptive_layer *a, int32_t t, const char *fn) {
    const int32_t Hkv = ctx->params.n_kv_heads;
    if (t <= a->given_keys)
        return FG_OK;
    float *grown = calloc((size_t)Hkv * t, sizeof *grown);
    if (!grown)
        return fg_error(ctx, FG_ERR_OUT_OF_MEMORY, "%s: out of host memory for the ranks of %d keys", fn, (int)t);
    for (int32_t g = 0; g < Hkv && a->given_col; g++)
        memcpy(grown + (size_t)g * t, a->given_col + (size_t)g * a->given_keys, (size_t)a->given_keys * sizeof *grown);
    free(a->given_col);
    a->given_col = grown;
    a->given_keys = t;
    return FG_OK;
}

fg_status fg_adaptive_observe_scores(fg_context *ctx, fg_seq *s, int32_t layer, const float *scores, int32_t n) {
    const int32_t Hkv = ctx->params.n_kv_heads;
    fg_adaptive_layer *a = &s->ad->layers[layer];
    fg_status st = given_cols_grow(ctx, a, n, "fg_seq_observe_scores");
    if (st)
        return st;
    for (int32_t g = 0; g < Hkv; g++) /* the sums stay finite, or nothing is added */
        for (int32_t j = 0; j < n; j++)
            if (!isfinite(a->given_col[(size_t)g * a->given_keys + j] + scores[(size_t)g * n + j]))
                return fg_error(ctx, FG_ERR_INVALID_ARGUMENT, "fg_seq_observe_scores: head %d, key %d: the scores "
                                "given so far add up past the float range", (int)g, (int)j);
    for (int32_t g = 0; g < Hkv; g++)
        for (int32_t j = 0; j < n; j++)
            a->given_col[(size_t)g * a->given_keys + j] += scores[(size_t)g * n + j];
    a->n_scored++;
    return FG_OK;
}

void fg_adaptive_ranks(const fg_context *ctx, const fg_seq *s, int32_t layer, float *out, int32_t n) {
    const int32_t Hkv = ctx->params.n_kv_heads;
    const fg_adaptive_layer *a = &s->ad->layers[layer];
    for (int32_t g = 0; g < Hkv; g++)
        for (int32_t j = 0; j < n; j++)
            out[(size_t)g * n + j] = j < a->given_keys ? a->given_col[(size_t)g * a->given_keys + j] : 0.0f;
}

/* The pass of fg_seq_observe over one layer: n rows after the t the
 * sequence holds attend them and each other (prefill_attention over the
 * t + n keys from row t), then the pooled attention they gave each held key
 * joins the layer's ranks (profile_stats over the same rows; its column
 * sums are host memory on every backend). */
fg_status fg_adaptive_observe_pass(fg_context *ctx, fg_seq *s, int32_t layer, const float *q, const float *k,
                                   const float *v, int32_t n, float *out) {
    const int32_t Hq = ctx->params.n_q_heads, Hkv = ctx->params.n_kv_heads, d = ctx->params.head_dim;
    const int32_t t = s->length[layer], N = t + n;
    const size_t rq = (size_t)Hq * d, rk = (size_t)Hkv * d;
    fg_adaptive_layer *a = &s->ad->layers[layer];
    float *hk = NULL, *hv = NULL, *keys = NULL, *vals = NULL, *hcol = NULL, *hq = NULL;
    int32_t *pos = NULL;
    const fg_alloc_item host[] = {{(void **)&hk, (size_t)t * d * sizeof *hk}, {(void **)&hv, (size_t)t * d * sizeof *hv},
                                  {(void **)&keys, (size_t)t * rk * sizeof *keys},
                                  {(void **)&vals, (size_t)t * rk * sizeof *vals},
                                  {(void **)&hcol, (size_t)Hkv * N * sizeof *hcol},
                                  {(void **)&hq, (size_t)n * rq * sizeof *hq}, {(void **)&pos, (size_t)t * sizeof *pos}};
    fg_status st = fg_alloc_all(host, sizeof host / sizeof host[0])
                       ? FG_OK
                       : fg_error(ctx, FG_ERR_OUT_OF_MEMORY, "fg_seq_observe: out of host memory for %d rows", (int)N);
    if (st == FG_OK) /* the ranks' columns grow with the sequence (decoded rows) */
        st = given_cols_grow(ctx, a, t, "fg_seq_observe");
    float *kk = NULL, *vv = NULL, *qq = NULL, *mx = NULL, *sm = NULL, *mxn = NULL, *smn = NULL;
    float **io[] = {&kk, &vv, &qq, &mx, &sm, &mxn, &smn};
    const size_t io_floats[] = {(size_t)N * rk, (size_t)N * rk, (size_t)N * rq, (size_t)Hq * n,
                                (size_t)Hq * n,  (size_t)Hq * N, (size_t)Hq * N};
    for (size_t b = 0; st == FG_OK && b < sizeof io / sizeof io[0]; b++) {
        st = fg_io_alloc(ctx, io_floats[b] * sizeof(float), io[b]);
        if (st == FG_OK && !ctx->be.device_io) /* rows below t of q and the statistics are read by no one */
            memset(*io[b], 0, io_floats[b] * sizeof(float));
    }
    /* the held keys and values, every head's, as one [N][Hkv][d] pair with the rows' own after them */
    for (int32_t g = 0; g < Hkv && st == FG_OK; g++) {
        const fg_head *h = &s->heads[(size_t)layer * Hkv + g];
        st = fg_head_read_rows(&ctx->be, &ctx->layout, h, t, hk, hv, pos, NULL, NULL);
        for (int32_t j = 0; st == FG_OK && j < t; j++) {
            if (pos[j] != j) {
                st = fg_error(ctx, FG_ERR_INTERNAL, "fg_seq_observe: layer %d head %d slot %d holds position %d",
                              (int)layer, (int)g, (int)j, (int)pos[j]);
                break;
            }
            memcpy(keys + (size_t)j * rk + (size_t)g * d, hk + (size_t)j * d, (size_t)d * sizeof *keys);
            memcpy(vals + (size_t)j * rk + (size_t)g * d, hv + (size_t)j * d, (size_t)d * sizeof *vals);
        }
    }
    if (st == FG_OK)
        st = fg_io_write(ctx, kk, keys, (size_t)t * rk * sizeof *keys);
    if (st == FG_OK)
        st = fg_io_write(ctx, vv, vals, (size_t)t * rk * sizeof *vals);
    if (st == FG_OK)
        st = fg_io_copy(ctx, kk + (size_t)t * rk, k, (size_t)n * rk * sizeof *k);
    if (st == FG_OK)
        st = fg_io_copy(ctx, vv + (size_t)t * rk, v, (size_t)n * rk * sizeof *v);
    if (st == FG_OK)
        st = fg_io_copy(ctx, qq + (size_t)t * rq, q, (size_t)n * rq * sizeof *q);
    if (st == FG_OK)
        st = ctx->be.ops->prefill_attention(&ctx->be, &ctx->shape, N, t, q, kk, vv, out, mx, sm);
    if (st == FG_OK) /* the row statistics where profile_stats reads them: [Hq][N] from row t */
        st = fg_io_copy_rows(ctx, mxn + t, (size_t)N, mx, (size_t)n, (size_t)n, (size_t)Hq);
    if (st == FG_OK)
        st = fg_io_copy_rows(ctx, smn + t, (size_t)N, sm, (size_t)n, (size_t)n, (size_t)Hq);
    const fg_profile_request req = {.n = N, .row_begin = t, .n_windows = 0};
    if (st == FG_OK)
        st = ctx->be.ops->profile_stats(&ctx->be, &ctx->shape, &req, qq, kk, mxn, smn, hcol, hcol);
    if (st == FG_OK && ctx->be.device_io)
        st = fg_backend_read(&ctx->be, hq, q, (size_t)n * rq * sizeof *hq);
    else if (st == FG_OK)
        memcpy(hq, q, (size_t)n * rq * sizeof *hq);
    if (st == FG_OK && ctx->be.ops->synchronize)
        st = ctx->be.ops->synchronize(&ctx->be);
    if (st == FG_OK) { /* nothing fails after this: the call is all or nothing */
        for (int32_t g = 0; g < Hkv; g++)
            for (int32_t j = 0; j < t; j++)
                a->given_col[(size_t)g * a->given_keys + j] += hcol[(size_t)g * N + j];
        keep_given(ctx, s->ad, layer, hq, n);
    }
    for (size_t b = 0; b < sizeof io / sizeof io[0]; b++)
        fg_io_free(ctx, *io[b]);
    free(hk);
    free(hv);
    free(keys);
    free(vals);
    free(hcol);
    free(hq);
    free(pos);
    return st;
}
