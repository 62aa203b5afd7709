/*
 * The set simulator of docs/design.md §2.5 (sets of positions, double-precision
 * scores, no pages), shared by the lockstep test and the API fuzzer: it
 * starts from the library's prompt state and steps beside fg_decode, and
 * compare_sets checks the library's kept positions against it. Eviction ties
 * closer than fp32 can call (relative 1e-4) are resolved by adopting the
 * library's choice, and counted in g_ties.
 */
#ifndef FG_TEST_SIM_H
#define FG_TEST_SIM_H

#include <string.h>

#include "fastgen.h"
#include "tests/support/harness.h"
#include "common/dtype.h"

#ifndef MAXT
#define MAXT 400
#endif

typedef struct sim_head {
    uint32_t comp;
    fg_policy pol;      /* the head's own (per-head ratios under FG_ALLOC_ADAKV and FG_ALLOC_ADAPTIVE) */
    uint8_t flag[MAXT]; /* 0 = not kept, else FG_KEEP_* bit that keeps it */
    double score[MAXT];
} sim_head;

typedef struct sim_seq {
    fg_compression_params cp;
    const fg_policy *pol;  /* the shortlist's first entry (each head's own is in its sim_head) */
    int32_t n, id;
    int32_t tokens[MAXT];
    uint8_t cls[MAXT];
    float *q, *k, *v;      /* [MAXT][Hq][d], [MAXT][Hkv][d] */
    sim_head heads[2];
} sim_seq;

typedef struct run_cfg {
    int32_t G, Hkv, d, page_tokens;
    fg_dtype dtype;
} run_cfg;

static int g_ties;

/* ceil(r * t) with r taken to parts per million, as the library defines it
 * (so that 0.15f * 20 is 3, not the 4 its float spelling would give). */
static int32_t ceil_ppm(float r, int32_t t) {
    const int64_t ppm = (int64_t)llround((double)r * 1e6);
    return (int32_t)((ppm * t + 999999) / 1000000);
}

static int32_t window_at(const fg_policy *p, int32_t t) {
    int32_t w = ceil_ppm(p->ratio_local, t);
    if (p->local_tokens > 0 && w > p->local_tokens)
        w = p->local_tokens;
    return w < 1 ? 1 : w;
}

static int32_t budget_at(const fg_policy *p, int32_t t) {
    int32_t k = ceil_ppm(p->ratio_frequent, t);
    return p->frequent_tokens > 0 && k > p->frequent_tokens ? p->frequent_tokens : k;
}

static int pinned(uint32_t comp, uint8_t cls) {
    return (cls == FG_TOKEN_SPECIAL && (comp & FG_KEEP_SPECIAL)) || (cls == FG_TOKEN_PUNCT && (comp & FG_KEEP_PUNCT));
}

static double rank_of(const sim_seq *s, const sim_head *h, int32_t j, int32_t t) {
    return s->cp.score_mode == FG_SCORE_MEAN ? h->score[j] / (t - j) : h->score[j];
}

/* Pooled attention of head g's group, summed over the profiled prompt rows
 * i (the last observation_window of them, or all) for keys j <= i. */
static void prompt_col(const sim_seq *s, const run_cfg *rc, int32_t g, double *col) {
    const int32_t Hq = rc->G * rc->Hkv, d = rc->d;
    /* the adaptive mode ranks by every row (its observation_window rows are for its choice) */
    const int32_t ow = s->cp.allocation == FG_ALLOC_ADAPTIVE ? 0 : s->cp.observation_window;
    const int32_t first = ow > 0 && ow < s->n ? s->n - ow : 0;
    for (int32_t j = 0; j < s->n; j++)
        col[j] = 0.0;
    for (int32_t h = g * rc->G; h < (g + 1) * rc->G; h++)
        for (int32_t i = first; i < s->n; i++) {
            double sc[MAXT], m = -INFINITY, sum = 0.0;
            for (int32_t j = 0; j <= i; j++) {
                sc[j] = 0.0;
                for (int32_t x = 0; x < d; x++)
                    sc[j] += (double)s->q[((size_t)i * Hq + h) * d + x] * s->k[((size_t)j * rc->Hkv + g) * d + x];
                sc[j] /= sqrt((double)d);
                m = sc[j] > m ? sc[j] : m;
            }
            for (int32_t j = 0; j <= i; j++)
                sum += exp(sc[j] - m);
            for (int32_t j = 0; j <= i; j++)
                col[j] += exp(sc[j] - m) / sum / rc->G;
        }
}

/* FG_ALLOC_LAYER: every head's scores of the positions [0, t) it holds (the
 * same in every head) become the mean of the heads'. */
static void sim_share(sim_seq *s, const run_cfg *rc, int32_t t) {
    for (int32_t j = 0; j < t; j++) {
        double sum = 0.0;
        for (int32_t g = 0; g < rc->Hkv; g++)
            sum += s->heads[g].score[j];
        for (int32_t g = 0; g < rc->Hkv; g++)
            s->heads[g].score[j] = sum / rc->Hkv;
    }
}

/* The simulator starts from the library's prompt state (checked by the
 * brute-force test), with scores from its own double-precision profile. */
static void sim_init(fg_context *ctx, sim_seq *s, const run_cfg *rc) {
    for (int32_t g = 0; g < rc->Hkv; g++) {
        sim_head *h = &s->heads[g];
        memset(h, 0, sizeof *h);
        fg_head_info info;
        EXPECT_OK(ctx, fg_head_inspect(ctx, s->id, 0, g, &info));
        h->comp = info.components;
        h->pol = info.policy;
        int32_t pos[MAXT], n_kept = 0;
        EXPECT_OK(ctx, fg_head_positions(ctx, s->id, 0, g, pos, MAXT, &n_kept));
        prompt_col(s, rc, g, h->score);
        const int32_t wstart = s->n - window_at(&h->pol, s->n);
        for (int32_t i = 0; i < n_kept; i++) {
            int32_t j = pos[i];
            h->flag[j] = (h->comp & FG_KEEP_FULL)                               ? FG_KEEP_FULL
                         : pinned(h->comp, s->cls[j])                           ? (s->cls[j] == FG_TOKEN_SPECIAL ? FG_KEEP_SPECIAL : FG_KEEP_PUNCT)
                         : ((h->comp & FG_KEEP_LOCAL) && j >= wstart)           ? FG_KEEP_LOCAL
                         : (h->comp & FG_KEEP_SNAPSHOT)                         ? FG_KEEP_SNAPSHOT
                                                                                : FG_KEEP_FREQUENT;
        }
    }
    if (s->cp.allocation == FG_ALLOC_LAYER)
        sim_share(s, rc, s->n);
}

static float cached(float x, const run_cfg *rc) { return fg_quantize(x, rc->dtype); }

/* Steps 1-2 of §2.5 for head g of s at position p: accumulates the dense
 * reference output into ref[G][d] and updates the scores. */
static void sim_attend(sim_seq *s, const run_cfg *rc, int32_t g, int32_t p, double *ref) {
    sim_head *h = &s->heads[g];
    const int32_t Hq = rc->G * rc->Hkv, d = rc->d;
    const float *kn = s->k + ((size_t)p * rc->Hkv + g) * d, *vn = s->v + ((size_t)p * rc->Hkv + g) * d;
    const int track = (h->comp & FG_KEEP_FREQUENT) && !(h->comp & FG_KEEP_FULL);
    double gained[MAXT] = {0};
    for (int32_t hq = g * rc->G; hq < (g + 1) * rc->G; hq++) {
        const float *qv = s->q + ((size_t)p * Hq + hq) * d;
        double sc[MAXT], m = -INFINITY, sum = 0.0;
        for (int32_t j = 0; j <= p; j++) {
            if (j < p && !h->flag[j])
                continue;
            const float *kj = s->k + ((size_t)j * rc->Hkv + g) * d;
            sc[j] = 0.0;
            for (int32_t x = 0; x < d; x++)
                sc[j] += (double)qv[x] * (j == p ? kn[x] : cached(kj[x], rc));
            sc[j] /= sqrt((double)d);
            m = sc[j] > m ? sc[j] : m;
        }
        for (int32_t j = 0; j <= p; j++)
            if (j == p || h->flag[j])
                sum += exp(sc[j] - m);
        double *o = ref + (size_t)(hq - g * rc->G) * d;
        for (int32_t j = 0; j <= p; j++) {
            if (j < p && !h->flag[j])
                continue;
            double a = exp(sc[j] - m) / sum;
            const float *vj = s->v + ((size_t)j * rc->Hkv + g) * d;
            for (int32_t x = 0; x < d; x++)
                o[x] += a * (j == p ? vn[x] : cached(vj[x], rc));
            gained[j] += a / rc->G;
        }
    }
    if (track) /* FG_SCORE_LAST: this step's attention only */
        for (int32_t j = 0; j <= p; j++)
            if (j == p || h->flag[j])
                h->score[j] = (j == p || s->cp.score_mode == FG_SCORE_LAST ? 0.0 : h->score[j]) + gained[j];
}

/* Steps 3-4 for head g at position p: insert, window, frequent budget. */
static void sim_finish(sim_seq *s, int32_t g, int32_t p) {
    sim_head *h = &s->heads[g];
    const int32_t t = p + 1;
    const int track = (h->comp & FG_KEEP_FREQUENT) && !(h->comp & FG_KEEP_FULL);
    uint32_t c = h->comp;
    h->flag[p] = (c & FG_KEEP_FULL)                                  ? FG_KEEP_FULL
                 : (s->cls[p] == FG_TOKEN_SPECIAL && (c & FG_KEEP_SPECIAL)) ? FG_KEEP_SPECIAL
                 : (s->cls[p] == FG_TOKEN_PUNCT && (c & FG_KEEP_PUNCT))     ? FG_KEEP_PUNCT
                 : (c & FG_KEEP_LOCAL)                                      ? FG_KEEP_LOCAL
                 : (c & FG_KEEP_FREQUENT)                                   ? FG_KEEP_FREQUENT
                                                                            : 0;
    /* window */
    if (c & FG_KEEP_LOCAL) {
        int32_t start = t - window_at(&h->pol, t);
        for (int32_t j = 0; j < start; j++)
            if (h->flag[j] == FG_KEEP_LOCAL)
                h->flag[j] = (c & FG_KEEP_FREQUENT) ? FG_KEEP_FREQUENT : 0;
    }
    /* frequent budget */
    if (track) {
        int32_t nf = 0;
        for (int32_t j = 0; j <= p; j++)
            nf += h->flag[j] == FG_KEEP_FREQUENT;
        while (nf > budget_at(&h->pol, t)) {
            int32_t worst = -1;
            for (int32_t j = 0; j <= p; j++)
                if (h->flag[j] == FG_KEEP_FREQUENT &&
                    (worst < 0 || rank_of(s, h, j, t) < rank_of(s, h, worst, t)))
                    worst = j; /* strict <: the older position wins ties */
            h->flag[worst] = 0;
            nf--;
        }
    }
}

/* One step of §2.5 for every head of s at position p; accumulates the dense
 * reference output into ref[Hq][d]. */
static void sim_steps(sim_seq *s, const run_cfg *rc, int32_t p, double *ref) {
    for (int32_t g = 0; g < rc->Hkv; g++)
        sim_attend(s, rc, g, p, ref + (size_t)g * rc->G * rc->d);
    if (s->cp.allocation == FG_ALLOC_LAYER)
        sim_share(s, rc, p + 1);
    for (int32_t g = 0; g < rc->Hkv; g++)
        sim_finish(s, g, p);
}

/* Compares the library's kept set of head g with the simulator's. A single
 * swap between two frequent candidates whose ranks tie within 1e-4 is adopted. */
static void compare_sets(fg_context *ctx, sim_seq *s, int32_t g, int32_t t, const char *what) {
    sim_head *h = &s->heads[g];
    int32_t pos[MAXT], n_kept = 0;
    EXPECT_OK(ctx, fg_head_positions(ctx, s->id, 0, g, pos, MAXT, &n_kept));
    uint8_t lib[MAXT] = {0};
    for (int32_t i = 0; i < n_kept; i++)
        lib[pos[i]] = 1;
    int32_t only_sim = -1, only_lib = -1, n_diff = 0;
    for (int32_t j = 0; j < t; j++) {
        if (!!h->flag[j] != lib[j]) {
            n_diff++;
            if (lib[j])
                only_lib = j;
            else
                only_sim = j;
        }
    }
    if (n_diff == 2 && only_sim >= 0 && only_lib >= 0 && h->flag[only_sim] == FG_KEEP_FREQUENT) {
        double a = rank_of(s, h, only_sim, t), b = rank_of(s, h, only_lib, t);
        if (fabs(a - b) <= 1e-4 * fmax(fabs(a), fabs(b))) {
            h->flag[only_lib] = FG_KEEP_FREQUENT;
            h->flag[only_sim] = 0;
            g_ties++;
            n_diff = 0;
        }
    }
    EXPECT(n_diff == 0, "%s: t=%d head %d: kept sets differ in %d positions", what, (int)t, (int)g, (int)n_diff);
}

static void make_seq(sim_seq *s, const run_cfg *rc, const fg_compression_params *cp) {
    const int32_t Hq = rc->G * rc->Hkv;
    s->cp = *cp;
    s->pol = &s->cp.shortlist[0];
    s->n = rng_int(8, 64);
    for (int32_t p = 0; p < MAXT; p++) {
        int32_t r = rng_int(0, 99);
        s->tokens[p] = r < 3 ? 6 : r < 10 ? 5 : r < 16 ? 7 : rng_int(0, 4);
        s->cls[p] = (p < cp->n_sink || s->tokens[p] == 6) ? FG_TOKEN_SPECIAL
                    : (s->tokens[p] == 5 || s->tokens[p] == 7) ? FG_TOKEN_PUNCT
                                                                 : FG_TOKEN_ORDINARY;
    }
    size_t nq = (size_t)MAXT * Hq * rc->d, nk = (size_t)MAXT * rc->Hkv * rc->d;
    s->q = malloc(nq * sizeof(float));
    s->k = malloc(nk * sizeof(float));
    s->v = malloc(nk * sizeof(float));
    for (size_t i = 0; i < nq; i++)
        s->q[i] = 1.5f * rng_gauss();
    for (size_t i = 0; i < nk; i++) {
        s->k[i] = 1.5f * rng_gauss();
        s->v[i] = rng_gauss();
    }
}

/* The simulator's vocabulary: 0-4 ordinary, 5 and 7 punctuation, 6 special. */
#define SIM_VOCAB 8
static fg_token_classes *sim_classes(void) {
    fg_token_classes *tc = NULL;
    fg_token_classes_create(SIM_VOCAB, NULL, &tc);
    fg_token_classes_set(tc, 5, FG_TOKEN_PUNCT);
    fg_token_classes_set(tc, 7, FG_TOKEN_PUNCT);
    fg_token_classes_set(tc, 6, FG_TOKEN_SPECIAL);
    return tc;
}

#endif
