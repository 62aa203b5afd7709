/*
 * Brute force: random small prompts (n <= 64) where the pooled attention map
 * A is built explicitly in double. Every recovery is recomputed from its
 * definition — the mean over profiled rows of the mass each row puts on the
 * positions the policy keeps for that row — and compared with the library's
 * two-pass statistics (within 1e-6); so are the chosen policy and the kept
 * set (special/punct, window, F3/F4) of the chosen entry and of a forced one.
 */
#include <string.h>

#include "fastgen.h"
#include "tests/support/harness.h"

#define MAXN 64
#define VOCAB 8 /* 0-4 ordinary, 5 and 7 punctuation, 6 special */

typedef struct bf_case {
    int32_t n, G, Hkv, d, page_tokens;
    fg_compression_params cp;
    int32_t tokens[MAXN];
    uint8_t cls[MAXN];
    float *q, *k, *v; /* [n][Hq][d], [n][Hkv][d] */
} bf_case;

static int g_skipped_ties;

/* Ratios are multiples of 1/16, so ceil(r * n) is exact in every precision. */
static float rand_ratio(void) { return (float)rng_int(0, 16) / 16.0f; }

static uint32_t rand_components(void) {
    static const uint32_t choices[] = {
        FG_KEEP_SPECIAL,
        FG_KEEP_SPECIAL | FG_KEEP_PUNCT,
        FG_KEEP_SPECIAL | FG_KEEP_PUNCT | FG_KEEP_FREQUENT,
        FG_KEEP_SPECIAL | FG_KEEP_PUNCT | FG_KEEP_FREQUENT | FG_KEEP_LOCAL,
        FG_KEEP_FREQUENT | FG_KEEP_LOCAL,
        FG_KEEP_LOCAL,
        FG_KEEP_FREQUENT,
        FG_KEEP_SPECIAL | FG_KEEP_LOCAL,
        FG_KEEP_PUNCT | FG_KEEP_FREQUENT,
        FG_KEEP_FULL,
        FG_KEEP_SNAPSHOT | FG_KEEP_LOCAL,
        FG_KEEP_SNAPSHOT,
        FG_KEEP_SPECIAL | FG_KEEP_SNAPSHOT | FG_KEEP_LOCAL,
    };
    return choices[rng_int(0, (int32_t)(sizeof choices / sizeof choices[0]) - 1)];
}

static void random_case(bf_case *c) {
    c->n = rng_int(1, MAXN);
    c->G = 1 << rng_int(0, 2);
    c->Hkv = rng_int(1, 2);
    c->d = rng_int(2, 16);
    c->page_tokens = rng_int(1, 8);
    fg_compression_params_default(&c->cp);
    if (rng_int(0, 2) == 0) { /* a random shortlist */
        c->cp.n_policies = rng_int(1, FG_MAX_SHORTLIST);
        for (int32_t e = 0; e < c->cp.n_policies; e++)
            c->cp.shortlist[e].components = rand_components();
    }
    for (int32_t e = 0; e < c->cp.n_policies; e++) {
        fg_policy *p = &c->cp.shortlist[e];
        p->ratio_local = rand_ratio();
        p->ratio_frequent = rand_ratio();
        p->local_tokens = rng_int(0, 3) == 0 ? rng_int(1, 12) : 0;
        p->frequent_tokens = rng_int(0, 3) == 0 ? rng_int(1, 12) : 0;
    }
    c->cp.threshold = (float)(0.3 + 0.7 * rng_uniform());
    c->cp.n_sink = rng_int(0, 3) == 0 ? rng_int(1, 4) : 0;
    c->cp.score_mode = (fg_score_mode)rng_int(0, 2); /* at prefill LAST ranks as SUM: by the profiled rows */
    c->cp.observation_window = rng_int(0, 2) == 0 ? rng_int(1, c->n) : 0;
    c->cp.score_pool = rng_int(0, 2) == 0 ? rng_int(2, 9) : 0;
    for (int32_t p = 0; p < c->n; p++)
        c->tokens[p] = rng_int(0, VOCAB - 1);
    const int32_t Hq = c->G * c->Hkv;
    const float scale = (float)(0.5 + 3.0 * rng_uniform());
    size_t nq = (size_t)c->n * Hq * c->d, nk = (size_t)c->n * c->Hkv * c->d;
    c->q = malloc(nq * sizeof(float));
    c->k = malloc(nk * sizeof(float));
    c->v = malloc(nk * sizeof(float));
    for (size_t i = 0; i < nq; i++)
        c->q[i] = scale * rng_gauss();
    for (size_t i = 0; i < nk; i++) {
        c->k[i] = scale * rng_gauss();
        c->v[i] = rng_gauss();
    }
}

/* The test's own classes: the rule of docs/design.md §2.1 applied by hand. */
static void classify(bf_case *c) {
    for (int32_t p = 0; p < c->n; p++) {
        int32_t t = c->tokens[p];
        c->cls[p] = (p < c->cp.n_sink || t == 6) ? FG_TOKEN_SPECIAL : (t == 5 || t == 7) ? FG_TOKEN_PUNCT : 0;
    }
}

/* A[i][j] pooled over the group of KV head g. */
static void attention_map(const bf_case *c, int32_t g, double A[MAXN][MAXN]) {
    const int32_t Hq = c->G * c->Hkv, d = c->d;
    memset(A, 0, sizeof(double) * MAXN * MAXN);
    for (int32_t h = g * c->G; h < (g + 1) * c->G; h++) {
        for (int32_t i = 0; i < c->n; i++) {
            double s[MAXN], m = -INFINITY, sum = 0.0;
            for (int32_t j = 0; j <= i; j++) {
                s[j] = 0.0;
                for (int32_t x = 0; x < d; x++)
                    s[j] += (double)c->q[((size_t)i * Hq + h) * d + x] * c->k[((size_t)j * c->Hkv + g) * d + x];
                s[j] /= sqrt((double)d);
                m = s[j] > m ? s[j] : m;
            }
            for (int32_t j = 0; j <= i; j++)
                sum += exp(s[j] - m);
            for (int32_t j = 0; j <= i; j++)
                A[i][j] += exp(s[j] - m) / sum / c->G;
        }
    }
}

static int32_t ceil16(float r, int32_t t) { return (int32_t)ceil((double)r * t); }

typedef struct expected {
    double recovery;
    int keep_final[MAXN]; /* kept at t = n */
    int near_tie;         /* the top-k boundary is too close to call in fp32 */
} expected;

/* Recovery and kept set of one policy, from A alone. */
static expected expect_policy(const bf_case *c, const fg_policy *pol, double A[MAXN][MAXN]) {
    expected ex;
    memset(&ex, 0, sizeof ex);
    const int32_t n = c->n;
    const int32_t rb = c->cp.observation_window > 0 && c->cp.observation_window < n ? n - c->cp.observation_window : 0;
    uint32_t comp = (pol->components & FG_KEEP_FULL) ? FG_KEEP_FULL : pol->components;
    if (comp & FG_KEEP_FULL) {
        ex.recovery = 1.0;
        for (int32_t j = 0; j < n; j++)
            ex.keep_final[j] = 1;
        return ex;
    }
    int pinned[MAXN];
    for (int32_t j = 0; j < n; j++)
        pinned[j] = (c->cls[j] == FG_TOKEN_SPECIAL && (comp & FG_KEEP_SPECIAL)) ||
                    (c->cls[j] == FG_TOKEN_PUNCT && (comp & FG_KEEP_PUNCT));
    int32_t w = 0;
    if (comp & FG_KEEP_LOCAL) {
        w = ceil16(pol->ratio_local, n);
        if (pol->local_tokens > 0 && w > pol->local_tokens)
            w = pol->local_tokens;
        if (w < 1)
            w = 1;
    }
    double col[MAXN] = {0};
    for (int32_t i = rb; i < n; i++)
        for (int32_t j = 0; j <= i; j++)
            col[j] += A[i][j];
    int inF[MAXN] = {0};
    if (comp & (FG_KEEP_FREQUENT | FG_KEEP_SNAPSHOT)) {
        int32_t k = ceil16(pol->ratio_frequent, n);
        if (pol->frequent_tokens > 0 && k > pol->frequent_tokens)
            k = pol->frequent_tokens;
        /* candidates by selection sort: rank desc, then the later position */
        double base[MAXN], rank[MAXN];
        int cand[MAXN];
        int32_t nc = 0;
        for (int32_t j = 0; j < n; j++) {
            cand[j] = !pinned[j] && !((comp & FG_KEEP_LOCAL) && j >= n - w);
            int32_t first = j > rb ? j : rb;
            base[j] = c->cp.score_mode == FG_SCORE_MEAN ? col[j] / (n - first) : col[j];
            nc += cand[j];
        }
        for (int32_t j = 0; j < n; j++) { /* max pooling over score_pool / 2 keys either side */
            const int32_t half = c->cp.score_pool > 1 ? c->cp.score_pool / 2 : 0;
            rank[j] = base[j];
            for (int32_t i = j - half; i <= j + half; i++)
                if (i >= 0 && i < n && base[i] > rank[j])
                    rank[j] = base[i];
        }
        if (k > nc)
            k = nc;
        double last_taken = 0.0;
        for (int32_t r = 0; r <= k && r < nc; r++) {
            int32_t best = -1;
            for (int32_t j = 0; j < n; j++)
                if (cand[j] && !inF[j] && (best < 0 || rank[j] > rank[best] || (rank[j] == rank[best] && j > best)))
                    best = j;
            if (r < k) {
                inF[best] = 1;
                last_taken = rank[best];
            } else if (k > 0 && rank[best] != last_taken &&
                       fabs(rank[best] - last_taken) <= 1e-5 * fabs(last_taken) + 1e-9) {
                /* the first one left out nearly ties the last one taken (an exact tie is one pooled
                   key's rank, equal in every precision: the later position wins) */
                ex.near_tie = 1;
            }
        }
    }
    double mass = 0.0;
    for (int32_t i = rb; i < n; i++)
        for (int32_t j = 0; j <= i; j++) {
            int in_window = (comp & FG_KEEP_LOCAL) && !pinned[j] && j > i - w;
            if (pinned[j] || in_window || inF[j])
                mass += A[i][j];
        }
    ex.recovery = mass / (n - rb);
    for (int32_t j = 0; j < n; j++)
        ex.keep_final[j] = pinned[j] || inF[j] || ((comp & FG_KEEP_LOCAL) && j >= n - w);
    return ex;
}

static void check_kept(fg_context *ctx, int32_t seq, int32_t g, const bf_case *c, const expected *ex, int case_no) {
    if (ex->near_tie) {
        g_skipped_ties++;
        return;
    }
    int32_t pos[MAXN], n_kept = -1;
    EXPECT_OK(ctx, fg_head_positions(ctx, seq, 0, g, pos, MAXN, &n_kept));
    int got[MAXN] = {0};
    for (int32_t i = 0; i < n_kept; i++)
        got[pos[i]] = 1;
    int same = 1;
    for (int32_t j = 0; j < c->n; j++)
        same &= got[j] == ex->keep_final[j];
    EXPECT(same, "case %d head %d: kept set differs from the brute force", case_no, (int)g);
}

/* The test's vocabulary as the library takes it: 5 and 7 punctuation, 6 special. */
static fg_token_classes *test_classes(void) {
    fg_token_classes *tc = NULL;
    EXPECT_OK(NULL, fg_token_classes_create(VOCAB, NULL, &tc));
    fg_token_classes_set(tc, 5, FG_TOKEN_PUNCT);
    fg_token_classes_set(tc, 7, FG_TOKEN_PUNCT);
    fg_token_classes_set(tc, 6, FG_TOKEN_SPECIAL);
    return tc;
}

/* random_case with 2 to 4 KV heads, their activations drawn again. */
static void random_case_heads(bf_case *c) {
    random_case(c);
    c->Hkv = rng_int(2, 4);
    free(c->q);
    free(c->k);
    free(c->v);
    const int32_t Hq = c->G * c->Hkv;
    c->q = malloc((size_t)c->n * Hq * c->d * sizeof(float));
    c->k = malloc((size_t)c->n * c->Hkv * c->d * sizeof(float));
    c->v = malloc((size_t)c->n * c->Hkv * c->d * sizeof(float));
    for (size_t i = 0; i < (size_t)c->n * Hq * c->d; i++)
        c->q[i] = 2.0f * rng_gauss();
    for (size_t i = 0; i < (size_t)c->n * c->Hkv * c->d; i++) {
        c->k[i] = 2.0f * rng_gauss();
        c->v[i] = rng_gauss();
    }
}

/* A ref context (classes tc) with one sequence under c->cp, layer 0 prefilled with the case. */
static fg_context *prefill_one(const bf_case *c, fg_token_classes *tc, int32_t *seq) {
    fg_context_params p = test_context_params("ref", 1, c->G * c->Hkv, c->Hkv, c->d);
    p.max_seq_len = MAXN;
    p.page_tokens = c->page_tokens;
    p.classes = tc;
    fg_context *ctx = NULL;
    float *out = malloc((size_t)c->n * p.n_q_heads * c->d * sizeof(float));
    EXPECT_OK(NULL, fg_context_create(&p, &ctx));
    EXPECT_OK(ctx, fg_context_set_compression(ctx, &c->cp));
    EXPECT_OK(ctx, fg_seq_create(ctx, NULL, c->tokens, c->n, seq));
    EXPECT_OK(ctx, fg_prefill(ctx, *seq, 0, c->q, c->k, c->v, out));
    free(out);
    return ctx;
}

/* What a case holds, freed. */
static void case_done(bf_case *c, fg_context **ctx, fg_token_classes **tc) {
    free(c->q);
    free(c->k);
    free(c->v);
    fg_context_destroy(ctx);
    fg_token_classes_destroy(tc);
}

static void run_case(int case_no) {
    bf_case c;
    random_case(&c);
    classify(&c);
    fg_token_classes *tc = test_classes();

    fg_context_params p = test_context_params("ref", 1, c.G * c.Hkv, c.Hkv, c.d);
    p.max_seqs = 2;
    p.max_seq_len = MAXN;
    p.page_tokens = c.page_tokens;
    p.classes = tc;
    p.kv_dtype = (fg_dtype)rng_int(0, 2);
    fg_context *ctx = NULL;
    EXPECT_OK(NULL, fg_context_create(&p, &ctx));
    if (!ctx)
        return;
    EXPECT_OK(ctx, fg_context_set_compression(ctx, &c.cp));

    /* one sequence with the whole shortlist, one forced onto a single entry */
    const int32_t forced = rng_int(0, c.cp.n_policies - 1);
    fg_compression_params one = c.cp;
    one.n_policies = 1;
    one.shortlist[0] = c.cp.shortlist[forced];
    int32_t seq_all = -1, seq_one = -1;
    float *out = malloc((size_t)c.n * p.n_q_heads * c.d * sizeof(float));
    EXPECT_OK(ctx, fg_seq_create(ctx, NULL, c.tokens, c.n, &seq_all));
    EXPECT_OK(ctx, fg_seq_create(ctx, &one, c.tokens, c.n, &seq_one));
    EXPECT_OK(ctx, fg_prefill(ctx, seq_all, 0, c.q, c.k, c.v, out));
    EXPECT_OK(ctx, fg_prefill(ctx, seq_one, 0, c.q, c.k, c.v, out));

    static double A[MAXN][MAXN];
    for (int32_t g = 0; g < c.Hkv; g++) {
        attention_map(&c, g, A);
        fg_head_info info;
        EXPECT_OK(ctx, fg_head_inspect(ctx, seq_all, 0, g, &info));
        int32_t chosen = -1, near_threshold = 0;
        expected ex_chosen = {0};
        for (int32_t e = 0; e < c.cp.n_policies; e++) {
            expected ex = expect_policy(&c, &c.cp.shortlist[e], A);
            EXPECT(fabs(ex.recovery - info.recovery[e]) <= 1e-6, "case %d head %d entry %d: recovery %.9f, brute %.9f",
                   case_no, (int)g, (int)e, (double)info.recovery[e], ex.recovery);
            if (chosen < 0 && fabs(ex.recovery - c.cp.threshold) < 1e-5)
                near_threshold = 1;
            if (chosen < 0 && ex.recovery >= c.cp.threshold) {
                chosen = e;
                ex_chosen = ex;
            }
        }
        if (chosen < 0) {
            chosen = c.cp.n_policies - 1;
            ex_chosen = expect_policy(&c, &c.cp.shortlist[chosen], A);
        }
        if (near_threshold) {
            g_skipped_ties++;
        } else {
            EXPECT(info.policy_index == chosen, "case %d head %d: chose %d, brute force %d", case_no, (int)g,
                   (int)info.policy_index, (int)chosen);
            check_kept(ctx, seq_all, g, &c, &ex_chosen, case_no);
        }
        expected ex_forced = expect_policy(&c, &c.cp.shortlist[forced], A);
        check_kept(ctx, seq_one, g, &c, &ex_forced, case_no);
    }
    free(out);
    case_done(&c, &ctx, &tc);
}

/* FG_ALLOC_ADAKV from A alone: each head's candidates ranked as in
 * expect_policy, its floor first, then one top-k over every head's rest. */
static void run_adakv_case(int case_no) {
    bf_case c;
    random_case_heads(&c);
    c.cp.n_policies = 1;
    static const uint32_t comps[] = {FG_KEEP_SNAPSHOT | FG_KEEP_LOCAL, FG_KEEP_SNAPSHOT,
                                     FG_KEEP_SPECIAL | FG_KEEP_SNAPSHOT | FG_KEEP_LOCAL};
    fg_policy *pol = &c.cp.shortlist[0];
    pol->components = comps[rng_int(0, 2)];
    c.cp.allocation = FG_ALLOC_ADAKV;
    static const float floors[] = {0.0f, 0.2f, 0.5f, 1.0f};
    c.cp.alloc_floor = floors[rng_int(0, 3)];
    classify(&c);
    fg_token_classes *tc = test_classes();
    int32_t seq = -1;
    fg_context *ctx = prefill_one(&c, tc, &seq);

    /* the uniform share and every head's candidates, as expect_policy ranks them */
    fg_policy all = *pol;
    all.ratio_frequent = 1.0f;
    all.frequent_tokens = 0;
    int32_t k_u = ceil16(pol->ratio_frequent, c.n);
    if (pol->frequent_tokens > 0 && k_u > pol->frequent_tokens)
        k_u = pol->frequent_tokens;
    const int32_t floor_k = (int32_t)ceil((double)c.cp.alloc_floor * k_u);
    static double A[MAXN][MAXN];
    double rank[4][MAXN];
    int keep[4][MAXN], cand[4][MAXN], share[4];
    int64_t left = (int64_t)c.Hkv * k_u;
    for (int32_t g = 0; g < c.Hkv; g++) {
        attention_map(&c, g, A);
        expected every = expect_policy(&c, &all, A); /* every candidate taken: the kept set minus the rest */
        fg_policy none = *pol;
        none.ratio_frequent = 0.0f;
        none.frequent_tokens = 0;
        expected base = expect_policy(&c, &none, A); /* pinned and window only */
        /* ranks: the pooled column sums, recomputed here as expect_policy does */
        const int32_t rb = c.cp.observation_window > 0 && c.cp.observation_window < c.n ? c.n - c.cp.observation_window : 0;
        double col[MAXN] = {0}, b[MAXN];
        for (int32_t i = rb; i < c.n; i++)
            for (int32_t j = 0; j <= i; j++)
                col[j] += A[i][j];
        for (int32_t j = 0; j < c.n; j++) {
            const int32_t first = j > rb ? j : rb;
            b[j] = c.cp.score_mode == FG_SCORE_MEAN ? col[j] / (c.n - first) : col[j];
        }
        for (int32_t j = 0; j < c.n; j++) {
            const int32_t half = c.cp.score_pool > 1 ? c.cp.score_pool / 2 : 0;
            rank[g][j] = b[j];
            for (int32_t i = j - half; i <= j + half; i++)
                if (i >= 0 && i < c.n && b[i] > rank[g][j])
                    rank[g][j] = b[i];
            keep[g][j] = base.keep_final[j];
            cand[g][j] = every.keep_final[j] && !base.keep_final[j];
        }
        share[g] = 0;
        for (int32_t t = 0; t < floor_k; t++) { /* the head's floor: its best, the later position on ties */
            int32_t best = -1;
            for (int32_t j = 0; j < c.n; j++)
                if (cand[g][j] && (best < 0 || rank[g][j] > rank[g][best] || (rank[g][j] == rank[g][best] && j > best)))
                    best = j;
            if (best < 0)
                break;
            keep[g][best] = 1;
            cand[g][best] = 0;
            share[g]++;
        }
        left -= share[g];
    }
    int near_tie = 0;
    double last = 0.0;
    for (; left >= 0; left--) { /* the rest: the best over every head, later position then higher head on ties */
        int32_t bg = -1, bj = -1;
        for (int32_t g = 0; g < c.Hkv; g++)
            for (int32_t j = 0; j < c.n; j++)
                if (cand[g][j] && (bg < 0 || rank[g][j] > rank[bg][bj] ||
                                   (rank[g][j] == rank[bg][bj] && (j > bj || (j == bj && g > bg))))) {
                    bg = g;
                    bj = j;
                }
        if (bg < 0)
            break;
        if (left == 0) { /* the first one left out */
            near_tie = rank[bg][bj] != last && fabs(rank[bg][bj] - last) <= 1e-5 * fabs(last) + 1e-9;
            break;
        }
        keep[bg][bj] = 1;
        cand[bg][bj] = 0;
        last = rank[bg][bj];
    }
    if (near_tie) {
        g_skipped_ties++;
    } else {
        for (int32_t g = 0; g < c.Hkv; g++) {
            expected ex = {0};
            for (int32_t j = 0; j < c.n; j++)
                ex.keep_final[j] = keep[g][j];
            check_kept(ctx, seq, g, &c, &ex, case_no);
        }
    }
    case_done(&c, &ctx, &tc);
}

/* FG_ALLOC_LAYER from A alone: every head keeps what expect_policy keeps
 * for the mean of the heads' maps (each already its group's mean). */
static void run_layer_case(int case_no) {
    bf_case c;
    random_case_heads(&c);
    c.cp.n_policies = 1; /* random_case's first entry, whatever its parts */
    c.cp.allocation = FG_ALLOC_LAYER;
    classify(&c);
    fg_token_classes *tc = test_classes();
    int32_t seq = -1;
    fg_context *ctx = prefill_one(&c, tc, &seq);
    static double A[MAXN][MAXN], mean[MAXN][MAXN];
    memset(mean, 0, sizeof mean);
    for (int32_t g = 0; g < c.Hkv; g++) {
        attention_map(&c, g, A);
        for (int32_t i = 0; i < c.n; i++)
            for (int32_t j = 0; j <= i; j++)
                mean[i][j] += A[i][j] / c.Hkv;
    }
    const expected ex = expect_policy(&c, &c.cp.shortlist[0], mean);
    for (int32_t g = 0; g < c.Hkv; g++)
        check_kept(ctx, seq, g, &c, &ex, case_no);
    case_done(&c, &ctx, &tc);
}

int main(void) {
    test_seed("test_bruteforce");
    const int cases = 400;
    for (int i = 0; i < cases; i++)
        run_case(i);
    for (int i = 0; i < cases / 2; i++)
        run_adakv_case(cases + i);
    for (int i = 0; i < cases / 2; i++)
        run_layer_case(cases + cases / 2 + i);
    printf("%d random cases, %d FG_ALLOC_ADAKV and %d FG_ALLOC_LAYER cases, %d comparisons skipped at fp32 "
           "near-ties\n",
           cases, cases / 2, cases / 2, g_skipped_ties);
    return test_finish();
}
