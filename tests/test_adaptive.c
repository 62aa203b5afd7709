/*
 * The adaptive mode (FG_ALLOC_ADAPTIVE) against a brute force in double:
 *   - while the sequence is observed every head holds its full cache;
 *   - every predicted error (each unit, family, level) equals the error the
 *     definition gives, built here from the explicit attention map of the
 *     observed rows, each as a decode query at its own position, and every
 *     row count the rows that family keeps;
 *   - the allocation keeps the budget and the floor, and its predicted
 *     error is at most every uniform family's;
 *   - each head then holds what its family at its level keeps (§2.4 over the
 *     cumulative or the observed ranks), on every backend alike, after a
 *     one-shot or a chunked prefill, and a fork taken while the sequence is
 *     observed compresses exactly as its parent.
 * Backends: argv[1..], or ref and cpu.
 */
#include <string.h>

#include "core/internal.h"
#include "tests/support/harness.h"

#define L 2
#define HKV 2
#define G 2
#define HQ (HKV * G)
#define D 8
#define N 40     /* the prompt */
#define STEPS 6  /* observed decode steps: compression at N + STEPS */
#define W 12     /* observed rows */
#define T (N + STEPS)
#define MAXT (T + 8)
#define VOCAB 8 /* 0-4 ordinary, 5 punctuation, 6 special */

static const char *g_backend = "ref";

typedef struct world {
    int32_t tokens[MAXT];
    uint8_t cls[MAXT];
    float q[L][MAXT][HQ][D], k[L][MAXT][HKV][D], v[L][MAXT][HKV][D];
} world;

static world g_w;

static void make_world(void) {
    for (int32_t p = 0; p < MAXT; p++) {
        const int32_t r = rng_int(0, 99);
        g_w.tokens[p] = r < 4 ? 6 : r < 14 ? 5 : rng_int(0, 4);
        g_w.cls[p] = (p < 4 || g_w.tokens[p] == 6) ? FG_TOKEN_SPECIAL : g_w.tokens[p] == 5 ? FG_TOKEN_PUNCT : 0;
    }
    for (int32_t l = 0; l < L; l++)
        for (int32_t p = 0; p < MAXT; p++) {
            for (int32_t h = 0; h < HQ; h++)
                for (int32_t x = 0; x < D; x++)
                    g_w.q[l][p][h][x] = 1.7f * rng_gauss();
            for (int32_t g = 0; g < HKV; g++)
                for (int32_t x = 0; x < D; x++) {
                    g_w.k[l][p][g][x] = 1.7f * rng_gauss();
                    g_w.v[l][p][g][x] = rng_gauss();
                }
        }
}

/* The preset, with a SnapKV family (snapshot+local, max-pooled ranks) before
 * full so the snapshot path is checked too, and a floor that lets rows move. */
static fg_compression_params adaptive_params(float budget) {
    fg_compression_params cp;
    fg_compression_params_preset("fastgen-adaptive", &cp);
    cp.shortlist[cp.n_policies] = cp.shortlist[cp.n_policies - 1];
    cp.shortlist[cp.n_policies - 1] = (fg_policy){FG_KEEP_SNAPSHOT | FG_KEEP_LOCAL, 0.3f, 0.3f, 0, 0};
    cp.n_policies++;
    cp.score_pool = 7;
    cp.alloc_floor = 0.2f;
    cp.budget = budget;
    cp.observation_window = W;
    cp.defer_until = T;
    return cp;
}

static fg_context *make_context(const char *backend, int32_t page_tokens) {
    fg_token_classes *tc = NULL;
    fg_token_classes_create(VOCAB, NULL, &tc);
    fg_token_classes_set(tc, 5, FG_TOKEN_PUNCT);
    fg_token_classes_set(tc, 6, FG_TOKEN_SPECIAL);
    fg_context_params p = test_context_params(backend, L, HQ, HKV, D);
    p.max_seqs = 4;
    p.max_seq_len = MAXT;
    p.page_tokens = page_tokens;
    p.classes = tc;
    fg_context *ctx = NULL;
    EXPECT_OK(NULL, fg_context_create(&p, &ctx));
    fg_token_classes_destroy(&tc);
    return ctx;
}

/* Prefill (one shot, or chunks of `chunk` rows) and decode to length t. */
static void run_to(fg_context *ctx, int32_t seq, int32_t chunk, int32_t from, int32_t t) {
    static float out[MAXT][HQ][D];
    for (int32_t l = 0; from == 0 && l < L; l++) {
        if (chunk <= 0) {
            EXPECT_OK(ctx, fg_prefill(ctx, seq, l, &g_w.q[l][0][0][0], &g_w.k[l][0][0][0], &g_w.v[l][0][0][0],
                                      &out[0][0][0]));
            continue;
        }
        for (int32_t b = 0; b < N; b += chunk) {
            const int32_t n = N - b < chunk ? N - b : chunk;
            EXPECT_OK(ctx, fg_prefill_chunk(ctx, seq, l, b, n, &g_w.q[l][b][0][0], &g_w.k[l][b][0][0],
                                            &g_w.v[l][b][0][0], &out[b][0][0]));
        }
    }
    for (int32_t p = from > N ? from : N; p < t; p++)
        for (int32_t l = 0; l < L; l++)
            EXPECT_OK(ctx, fg_decode(ctx, l, 1, &seq, &g_w.tokens[p], &g_w.q[l][p][0][0], &g_w.k[l][p][0][0],
                                     &g_w.v[l][p][0][0], &out[0][0][0]));
}

/* ---------------------------------------------------------------- the brute force */

static int32_t ceil_ppm(float r, int32_t t) {
    const int64_t ppm = (int64_t)llround((double)r * 1e6);
    return (int32_t)((ppm * t + 999999) / 1000000);
}

/* The family at level l: its active ratios scaled to sum l / FG_AD_LEVELS. */
static fg_policy level_policy(const fg_policy *f, int32_t l) {
    fg_policy p = *f;
    const double b = (double)l / FG_AD_LEVELS;
    const double rl = (f->components & FG_KEEP_LOCAL) ? f->ratio_local : 0.0;
    const double rf = (f->components & (FG_KEEP_FREQUENT | FG_KEEP_SNAPSHOT)) ? f->ratio_frequent : 0.0;
    p.ratio_local = rl + rf > 0 ? (float)(b * rl / (rl + rf)) : (float)b;
    p.ratio_frequent = rl + rf > 0 ? (float)(b * rf / (rl + rf)) : 0.0f;
    return p;
}

static int pinned(uint32_t c, uint8_t cls) {
    return (cls == FG_TOKEN_SPECIAL && (c & FG_KEEP_SPECIAL)) || (cls == FG_TOKEN_PUNCT && (c & FG_KEEP_PUNCT));
}

/* Attention of query head h of layer l at position i over keys j <= i. */
static void attention(int32_t l, int32_t h, int32_t i, double *a) {
    const int32_t g = h / G;
    double m = -INFINITY, sum = 0.0;
    for (int32_t j = 0; j <= i; j++) {
        double s = 0.0;
        for (int32_t x = 0; x < D; x++)
            s += (double)g_w.q[l][i][h][x] * g_w.k[l][j][g][x];
        a[j] = s / sqrt((double)D);
        m = a[j] > m ? a[j] : m;
    }
    for (int32_t j = 0; j <= i; j++)
        sum += (a[j] = exp(a[j] - m));
    for (int32_t j = 0; j <= i; j++)
        a[j] /= sum;
}

/* The keys family `pol` keeps for a query at position p (the window and k at length p + 1). near: set when the
 * k-th and the next candidate's ranks are too close for fp32 to call. */
static void kept_for(const fg_policy *pol, int32_t p, const double *rank, int *kept, int *near) {
    const uint32_t c = pol->components;
    const int32_t tr = p + 1;
    int32_t w = 0;
    if (c & FG_KEEP_LOCAL) {
        w = ceil_ppm(pol->ratio_local, tr);
        w = w < 1 ? 1 : w;
    }
    const int32_t lo = (c & FG_KEEP_LOCAL) ? tr - w : p;
    for (int32_t j = 0; j <= p; j++)
        kept[j] = j == p || pinned(c, g_w.cls[j]) || j >= lo;
    if (!(c & (FG_KEEP_FREQUENT | FG_KEEP_SNAPSHOT)))
        return;
    int32_t k = ceil_ppm(pol->ratio_frequent, tr);
    double last = 0.0;
    for (int32_t r = 0; r <= k; r++) {
        int32_t best = -1;
        for (int32_t j = 0; j < lo; j++)
            if (!kept[j] && !pinned(c, g_w.cls[j]) &&
                (best < 0 || rank[j] > rank[best] || (rank[j] == rank[best] && j > best)))
                best = j;
        if (best < 0)
            break;
        if (r == k) {
            *near |= rank[best] != last && fabs(rank[best] - last) <= 1e-5 * fabs(last) + 1e-9;
            break;
        }
        kept[best] = 1;
        last = rank[best];
    }
}

typedef struct unit_truth {
    double score[MAXT], snap[MAXT];                 /* the frequent part's and the snapshot's ranks */
    double p[G][W][MAXT], full[G][W][D];            /* observed attention and outputs */
    int32_t pos[W];
} unit_truth;

static void unit_truth_of(int32_t l, int32_t g, unit_truth *u) {
    static double a[MAXT];
    memset(u, 0, sizeof *u);
    for (int32_t i = 0; i < N; i++) /* the prompt's profile: every row */
        for (int32_t h = g * G; h < (g + 1) * G; h++) {
            attention(l, h, i, a);
            for (int32_t j = 0; j <= i; j++)
                u->score[j] += a[j] / G;
        }
    double raw[MAXT] = {0};
    for (int32_t i = 0; i < W; i++) {
        const int32_t p = T - W + i;
        u->pos[i] = p;
        for (int32_t h = 0; h < G; h++) {
            attention(l, g * G + h, p, a);
            for (int32_t j = 0; j <= p; j++) {
                raw[j] += a[j] / G;
                if (p >= N)
                    u->score[j] += a[j] / G;
                u->p[h][i][j] = a[j] < 1e-6 && j < p ? 0.0 : a[j];
                for (int32_t x = 0; x < D; x++)
                    u->full[h][i][x] += u->p[h][i][j] * g_w.v[l][j][g][x];
            }
        }
    }
    for (int32_t j = 0; j < T; j++) { /* max-pooled over 7 */
        u->snap[j] = raw[j];
        for (int32_t o = j - 3; o <= j + 3; o++)
            if (o >= 0 && o < T && raw[o] > u->snap[j])
                u->snap[j] = raw[o];
    }
}

/* The predicted error of one family at one level, from the definition. */
static double truth_error(int32_t l, int32_t g, const unit_truth *u, const fg_policy *pol, int *near) {
    double e = 0.0;
    static int kept[MAXT];
    const double *rank = (pol->components & FG_KEEP_SNAPSHOT) ? u->snap : u->score;
    for (int32_t i = 0; i < W; i++) {
        kept_for(pol, u->pos[i], rank, kept, near);
        for (int32_t h = 0; h < G; h++) {
            double num[D] = {0}, den = 0.0;
            for (int32_t j = 0; j <= u->pos[i]; j++) {
                if (!kept[j])
                    continue;
                den += u->p[h][i][j];
                for (int32_t x = 0; x < D; x++)
                    num[x] += u->p[h][i][j] * g_w.v[l][j][g][x];
            }
            for (int32_t x = 0; x < D; x++)
                e += (num[x] / den - u->full[h][i][x]) * (num[x] / den - u->full[h][i][x]);
        }
    }
    return e;
}

/* ---------------------------------------------------------------- checks */

typedef struct outcome {
    int32_t policy[L * HKV];
    float ratios[L * HKV][2];
    int32_t kept[L * HKV][MAXT], n_kept[L * HKV];
} outcome;

static void read_outcome(fg_context *ctx, int32_t seq, outcome *o) {
    for (int32_t u = 0; u < L * HKV; u++) {
        fg_head_info info;
        EXPECT_OK(ctx, fg_head_inspect(ctx, seq, u / HKV, u % HKV, &info));
        o->policy[u] = info.policy_index;
        o->ratios[u][0] = info.policy.ratio_local;
        o->ratios[u][1] = info.policy.ratio_frequent;
        EXPECT_OK(ctx, fg_head_positions(ctx, seq, u / HKV, u % HKV, o->kept[u], MAXT, &o->n_kept[u]));
    }
}

static int same_outcome(const outcome *a, const outcome *b) {
    for (int32_t u = 0; u < L * HKV; u++)
        if (a->policy[u] != b->policy[u] || a->n_kept[u] != b->n_kept[u] ||
            memcmp(a->ratios[u], b->ratios[u], sizeof a->ratios[u]) ||
            memcmp(a->kept[u], b->kept[u], (size_t)a->n_kept[u] * sizeof a->kept[u][0]))
            return 0;
    return 1;
}

static outcome g_first; /* the first backend's */
static int g_have_first;

static void tolerances(const char *backend);

static void run_backend(const char *backend) {
    g_backend = backend;
    tolerances(backend);
    static const float budgets[] = {0.25f, 0.5f, 0.8f};
    for (int b = 0; b < 3; b++) {
        const fg_compression_params cp = adaptive_params(budgets[b]);
        fg_context *ctx = make_context(backend, 1 + b * 3);
        int32_t seq = -1, fork = -1, chunked = -1;
        EXPECT_OK(ctx, fg_seq_create(ctx, &cp, g_w.tokens, N, &seq));
        EXPECT_OK(ctx, fg_seq_create(ctx, &cp, g_w.tokens, N, &chunked));
        run_to(ctx, seq, 0, 0, N + 2);
        run_to(ctx, chunked, 16, 0, T);
        EXPECT_OK(ctx, fg_seq_fork(ctx, seq, &fork)); /* observed: the fork observes on */
        run_to(ctx, seq, 0, N + 2, T);
        run_to(ctx, fork, 0, N + 2, T);
        /* observed so far: every head full */
        int full = 1;
        for (int32_t u = 0; u < L * HKV; u++) {
            fg_head_info info;
            EXPECT_OK(ctx, fg_head_inspect(ctx, seq, u / HKV, u % HKV, &info));
            full &= (info.components & FG_KEEP_FULL) && info.kept == T;
        }
        EXPECT(full, "%s budget %.2f: a head is compressed before the sequence is observed", backend,
               (double)budgets[b]);

        /* the predicted curves against the definition */
        static double err[L * HKV * FG_MAX_SHORTLIST * (FG_AD_LEVELS + 1)];
        static int32_t rows[L * HKV * FG_MAX_SHORTLIST * (FG_AD_LEVELS + 1)];
        int64_t budget_rows = 0;
        EXPECT_OK(ctx, fg_adaptive_curves(ctx, &ctx->seqs[seq], err, rows, &budget_rows));
        const int32_t F = cp.n_policies;
        int bad_err = 0, bad_rows = 0, skipped = 0;
        static unit_truth truth;
        for (int32_t u = 0; u < L * HKV && b == 0; u++) {
            unit_truth_of(u / HKV, u % HKV, &truth);
            for (int32_t f = 0; f < F; f++)
                for (int32_t lv = 0; lv <= FG_AD_LEVELS; lv++) {
                    const size_t at = ((size_t)u * F + f) * (FG_AD_LEVELS + 1) + lv;
                    if (cp.shortlist[f].components & FG_KEEP_FULL) {
                        bad_err += err[at] != 0.0;
                        bad_rows += rows[at] != T;
                        continue;
                    }
                    const fg_policy pol = level_policy(&cp.shortlist[f], lv);
                    int near = 0;
                    const double e = truth_error(u / HKV, u % HKV, &truth, &pol, &near);
                    static int kept[MAXT];
                    kept_for(&pol, T - 1, (pol.components & FG_KEEP_SNAPSHOT) ? truth.snap : truth.score, kept,
                             &near); /* what it keeps now: a query at the last position */
                    int32_t n_kept = 0;
                    for (int32_t j = 0; j < T; j++)
                        n_kept += kept[j];
                    if (near) {
                        skipped++;
                        continue;
                    }
                    if (fabs(err[at] - e) > 1e-4 * e + 1e-7) {
                        if (bad_err++ < 5)
                            fprintf(stderr, "  unit %d family %d level %d: predicted %.9g, definition %.9g\n",
                                    (int)u, (int)f, (int)lv, err[at], e);
                    }
                    bad_rows += rows[at] != n_kept;
                }
        }
        EXPECT(bad_err == 0 && bad_rows == 0, "%s: %d predicted errors and %d row counts differ from the definition "
               "(%d near-ties skipped)", backend, bad_err, bad_rows, skipped);

        /* the compression, at the next step */
        run_to(ctx, seq, 0, T, T + 1);
        run_to(ctx, fork, 0, T, T + 1);
        run_to(ctx, chunked, 0, T, T + 1);
        outcome o, of, oc;
        read_outcome(ctx, seq, &o);
        read_outcome(ctx, fork, &of);
        read_outcome(ctx, chunked, &oc);
        EXPECT(same_outcome(&o, &of), "%s budget %.2f: the fork compressed otherwise than its parent", backend,
               (double)budgets[b]);
        if (strcmp(backend, "cpu")) /* cpu's chunks end off its 64-row tiles: its profile differs in rounding */
            EXPECT(same_outcome(&o, &oc), "%s budget %.2f: the chunked prefill compressed otherwise", backend,
                   (double)budgets[b]);
        /* the choice: within the budget and the floor, and no worse than any uniform family */
        int64_t used = 0;
        double total = 0.0;
        int below_floor = 0;
        const int64_t floor_rows = (int64_t)floor((double)cp.alloc_floor * (double)budget_rows / (L * HKV));
        for (int32_t u = 0; u < L * HKV; u++) {
            const int32_t f = o.policy[u];
            const int32_t lv = (cp.shortlist[f].components & FG_KEEP_FULL)
                                   ? FG_AD_LEVELS
                                   : (int32_t)lround((o.ratios[u][0] + o.ratios[u][1]) * FG_AD_LEVELS);
            const size_t at = ((size_t)u * F + f) * (FG_AD_LEVELS + 1) + lv;
            used += rows[at];
            total += err[at];
            below_floor += rows[at] < floor_rows && lv < FG_AD_LEVELS;
        }
        EXPECT(used <= budget_rows, "%s budget %.2f: %lld rows over the budget's %lld", backend, (double)budgets[b],
               (long long)used, (long long)budget_rows);
        EXPECT(below_floor == 0, "%s: %d heads below the floor", backend, below_floor);
        for (int32_t f = 0; f < F; f++) {
            for (int32_t lv = FG_AD_LEVELS; lv >= 0; lv--) {
                int64_t r = 0;
                double e = 0.0;
                for (int32_t u = 0; u < L * HKV; u++) {
                    r += rows[((size_t)u * F + f) * (FG_AD_LEVELS + 1) + lv];
                    e += err[((size_t)u * F + f) * (FG_AD_LEVELS + 1) + lv];
                }
                if (r > budget_rows)
                    continue;
                EXPECT(total <= e, "%s budget %.2f: predicted error %.6g above uniform family %d's %.6g", backend,
                       (double)budgets[b], total, (int)f, e);
                break;
            }
        }
        if (b == 1) { /* every backend compresses alike */
            if (!g_have_first) {
                g_first = o;
                g_have_first = 1;
            } else {
                EXPECT(same_outcome(&g_first, &o), "%s: policies or kept rows differ from the first backend's",
                       backend);
            }
        }
        printf("  %s budget %.2f: %lld of %lld rows, predicted error %.4g\n", backend, (double)budgets[b],
               (long long)used, (long long)budget_rows, total);
        fg_context_destroy(&ctx);

        /* compressed at the prompt's end: each head holds exactly the rows of its choice then (the same
           choice as a twin still observed at that length) */
        fg_compression_params now = cp, later = cp;
        now.defer_until = 0;
        later.defer_until = N + 1;
        ctx = make_context(backend, 4);
        int32_t a = -1, twin = -1;
        EXPECT_OK(ctx, fg_seq_create(ctx, &now, g_w.tokens, N, &a));
        EXPECT_OK(ctx, fg_seq_create(ctx, &later, g_w.tokens, N, &twin));
        run_to(ctx, a, 0, 0, N);
        run_to(ctx, twin, 0, 0, N);
        EXPECT(ctx->seqs[a].ad == NULL && ctx->seqs[twin].ad != NULL, "%s: compressed at the wrong time", backend);
        EXPECT_OK(ctx, fg_adaptive_curves(ctx, &ctx->seqs[twin], err, rows, &budget_rows));
        read_outcome(ctx, a, &o);
        int bad_kept = 0;
        for (int32_t u = 0; u < L * HKV; u++) {
            const int32_t f = o.policy[u];
            const int32_t lv = (cp.shortlist[f].components & FG_KEEP_FULL)
                                   ? FG_AD_LEVELS
                                   : (int32_t)lround((o.ratios[u][0] + o.ratios[u][1]) * FG_AD_LEVELS);
            bad_kept += o.n_kept[u] != rows[((size_t)u * F + f) * (FG_AD_LEVELS + 1) + lv];
        }
        EXPECT(bad_kept == 0, "%s budget %.2f: %d heads do not keep the rows of their choice", backend,
               (double)budgets[b], bad_kept);
        fg_context_destroy(&ctx);
    }
}

/* A tolerance instead of a budget: the chosen heads' predicted error stays
 * within tolerance x the least's, and a smaller tolerance keeps no fewer
 * rows. */
static void tolerances(const char *backend) {
    static const float tols[] = {0.5f, 0.1f, 0.01f};
    int64_t last_rows = -1;
    for (int i = 0; i < 3; i++) {
        fg_compression_params cp = adaptive_params(0.0f);
        cp.tolerance = tols[i];
        cp.alloc_floor = 0.8f; /* the preset's: the floor must not break the bound */
        fg_context *ctx = make_context(backend, 4);
        int32_t seq = -1;
        EXPECT_OK(ctx, fg_seq_create(ctx, &cp, g_w.tokens, N, &seq));
        run_to(ctx, seq, 0, 0, T); /* every layer at defer_until: the next step compresses first */
        static double err[L * HKV * FG_MAX_SHORTLIST * (FG_AD_LEVELS + 1)];
        static int32_t rows[L * HKV * FG_MAX_SHORTLIST * (FG_AD_LEVELS + 1)];
        int64_t budget_rows = 0;
        EXPECT_OK(ctx, fg_adaptive_curves(ctx, &ctx->seqs[seq], err, rows, &budget_rows));
        run_to(ctx, seq, 0, T, T + 1);
        const int32_t F = cp.n_policies;
        double least = 0.0, chosen = 0.0;
        int64_t kept = 0;
        for (int32_t u = 0; u < L * HKV; u++) {
            double e0 = 1e300;
            for (int32_t f = 0; f < F - 1; f++) /* the least: level 0 of the best family but full */
                e0 = err[((size_t)u * F + f) * (FG_AD_LEVELS + 1)] < e0 ? err[((size_t)u * F + f) * (FG_AD_LEVELS + 1)]
                                                                         : e0;
            least += e0;
            fg_head_info info;
            EXPECT_OK(ctx, fg_head_inspect(ctx, seq, u / HKV, u % HKV, &info));
            const int full = (info.components & FG_KEEP_FULL) != 0;
            const uint32_t c = cp.shortlist[info.policy_index].components;
            const double r = ((c & FG_KEEP_LOCAL) ? info.policy.ratio_local : 0.0) +
                             ((c & (FG_KEEP_FREQUENT | FG_KEEP_SNAPSHOT)) ? info.policy.ratio_frequent : 0.0);
            const int32_t lv = full ? FG_AD_LEVELS : (int32_t)lround(r * FG_AD_LEVELS);
            const size_t at = ((size_t)u * F + info.policy_index) * (FG_AD_LEVELS + 1) + lv;
            chosen += err[at];
            kept += rows[at];
        }
        EXPECT(chosen <= tols[i] * least * (1.0 + 1e-9),
               "%s tolerance %.2f: predicted error %.4g over %.2f of the least's %.4g", backend, (double)tols[i],
               chosen, (double)tols[i], least);
        EXPECT(last_rows < 0 || kept >= last_rows, "%s tolerance %.2f kept %lld rows, fewer than a looser one's %lld",
               backend, (double)tols[i], (long long)kept, (long long)last_rows);
        EXPECT(kept < (int64_t)L * HKV * T, "%s tolerance %.2f kept everything", backend, (double)tols[i]);
        printf("  %s tolerance %.2f: %lld of %d rows, predicted error %.4g of the least's %.4g\n", backend,
               (double)tols[i], (long long)kept, (int)(L * HKV * T), chosen, least);
        last_rows = kept;
        fg_context_destroy(&ctx);
    }
}

/* What the adaptive mode refuses, and that a refusal changes nothing. */
static void refusals(void) {
    fg_context *ctx = make_context("ref", 4);
    fg_compression_params cp = adaptive_params(0.5f);
    int32_t seq = -1;
    cp.defer_until = N + W + 1; /* more decode rows than the ring holds */
    EXPECT_STATUS(ctx, FG_ERR_INVALID_ARGUMENT, fg_seq_create(ctx, &cp, g_w.tokens, N, &seq));
    EXPECT(strstr(fg_last_error(ctx), "observation_window") != NULL, "says why: %s", fg_last_error(ctx));
    cp.defer_until = T;
    EXPECT_OK(ctx, fg_seq_create(ctx, &cp, g_w.tokens, N, &seq));
    static float out[MAXT][HQ][D];
    EXPECT_OK(ctx, fg_prefill(ctx, seq, 0, &g_w.q[0][0][0][0], &g_w.k[0][0][0][0], &g_w.v[0][0][0][0], &out[0][0][0]));
    EXPECT_STATUS(ctx, FG_ERR_BAD_STATE, fg_decode(ctx, 0, 1, &seq, &g_w.tokens[N], &g_w.q[0][N][0][0],
                                                   &g_w.k[0][N][0][0], &g_w.v[0][N][0][0], &out[0][0][0]));
    EXPECT(strstr(fg_last_error(ctx), "every layer") != NULL, "says why: %s", fg_last_error(ctx));
    int32_t len = -1;
    EXPECT_OK(ctx, fg_seq_length(ctx, seq, 0, &len));
    EXPECT(len == N, "the refused decode changed the length to %d", (int)len);
    fg_context_destroy(&ctx);
}

int main(int argc, char **argv) {
    test_seed("test_adaptive");
    make_world();
    refusals();
    return test_each_backend(argc, argv, run_backend);
}
