/*
 * Re-profiling append (FG_APPEND_REPROFILE), against a brute force in double
 * precision and across backends:
 *  - brute force: after a prompt of every planted head type, a chunk is
 *    appended; for every (layer, KV head) the chunk's outputs (dense
 *    attention over the kept rows, as cached, and the chunk), every
 *    shortlist entry's recovery over the chunk's rows, the entries a head can
 *    no longer take (a window over rows it dropped), the choice and the kept
 *    positions equal the brute force's (ties closer than float can call are
 *    counted, not failed). One case turns a special-only head's chunk queries
 *    into a local head's, so that its local entries are out of reach.
 *  - full cache: a re-profiled append onto a full cache equals a one-shot
 *    prefill of the prompt and the chunk (bit for bit on ref and the GPU
 *    backends, within 1e-10 NMSE on cpu).
 *  - a conversation (append, decode, append, decode) gives the same policies
 *    and kept rows on every backend as on ref, outputs within 1e-8 NMSE;
 *  - a fork that re-profiles leaves its parent intact, and a refused append
 *    (a bad token) changes nothing.
 * Usage: test_reprofile [BACKEND...]   (default: ref cpu)
 */
#include <math.h>
#include <string.h>

#include "fastgen.h"
#include "tests/support/harness.h"
#include "common/dtype.h"
#include "tools/synth.h"

enum { L = 2, HKV = 5, G = 2, HQ = G * HKV, D = 32, N = 48, MAXLEN = 160 };

typedef struct world {
    synth syn;
    fg_context *ctx;
    fg_dtype dtype;
    int32_t tokens[MAXLEN];
    uint8_t cls[MAXLEN];
    float q[L][MAXLEN * HQ * D], k[L][MAXLEN * HKV * D], v[L][MAXLEN * HKV * D]; /* every position's rows */
} world;

static world g_w; /* large: static */

/* The rows of every position; with `swap_from` >= 0, the chunk rows at and
 * after it take, in the layer's SINK head, the queries of its LOCAL head. */
static void world_init(world *w, uint64_t seed, fg_dtype dtype, int32_t swap_from) {
    EXPECT_OK(NULL, synth_create(L, HQ, HKV, D, seed, &w->syn));
    w->dtype = dtype;
    for (int32_t t = 0; t < MAXLEN; t++)
        w->tokens[t] = synth_token(&w->syn, t);
    fg_token_classes_classify(w->syn.classes, w->tokens, MAXLEN, 0, w->cls);
    for (int32_t l = 0; l < L; l++) {
        synth_qkv(&w->syn, l, w->tokens, 0, MAXLEN, w->q[l], w->k[l], w->v[l]);
        if (swap_from < 0)
            continue;
        int32_t sink = -1, local = -1;
        for (int32_t g = 0; g < HKV; g++) {
            sink = w->syn.types[l * HKV + g] == SYNTH_SINK ? g : sink;
            local = w->syn.types[l * HKV + g] == SYNTH_LOCAL ? g : local;
        }
        for (int32_t t = swap_from; t < MAXLEN; t++)
            memcpy(&w->q[l][((size_t)t * HQ + sink * G) * D], &w->q[l][((size_t)t * HQ + local * G) * D],
                   sizeof(float) * G * D);
    }
}

static fg_context *open_context(const world *w, const char *backend, int32_t max_seqs) {
    fg_context_params p = test_context_params(backend, L, HQ, HKV, D);
    p.kv_dtype = w->dtype;
    p.max_seqs = max_seqs;
    p.max_seq_len = MAXLEN;
    p.page_tokens = 8;
    p.classes = w->syn.classes;
    fg_context *ctx = NULL;
    EXPECT_OK(NULL, fg_context_create(&p, &ctx));
    return ctx;
}

static void params(const char *preset, fg_compression_params *cp) {
    fg_compression_params_preset(preset, cp);
    cp->append_mode = FG_APPEND_REPROFILE;
}

static void prefill(const world *w, fg_context *ctx, int32_t seq) {
    static float out[MAXLEN * HQ * D];
    for (int32_t l = 0; l < L; l++)
        EXPECT_OK(ctx, fg_prefill(ctx, seq, l, w->q[l], w->k[l], w->v[l], out));
}

static void append(const world *w, fg_context *ctx, int32_t seq, int32_t at, int32_t n, float *out /* [L][n][HQ][D] */) {
    for (int32_t l = 0; l < L; l++)
        EXPECT_OK(ctx, fg_seq_append(ctx, seq, l, &w->tokens[at], n, &w->q[l][(size_t)at * HQ * D],
                                     &w->k[l][(size_t)at * HKV * D], &w->v[l][(size_t)at * HKV * D],
                                     out + (size_t)l * n * HQ * D));
}

static void decode(const world *w, fg_context *ctx, int32_t seq, int32_t at, float *out /* [L][HQ][D] */) {
    for (int32_t l = 0; l < L; l++)
        EXPECT_OK(ctx, fg_decode(ctx, l, 1, &seq, &w->tokens[at], &w->q[l][(size_t)at * HQ * D],
                                 &w->k[l][(size_t)at * HKV * D], &w->v[l][(size_t)at * HKV * D],
                                 out + (size_t)l * HQ * D));
}

static double nmse(const float *a, const double *b, size_t n) {
    double num = 0.0, den = 1e-300;
    for (size_t i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += b[i] * b[i];
    }
    return num / den;
}

/* ---------------------------------------------------------------- brute force */

static int32_t ceil_ppm(float r, int32_t t) {
    const int64_t ppm = (int64_t)llround((double)r * 1e6);
    return (int32_t)((ppm * t + 999999) / 1000000);
}
static int32_t window_at(const fg_policy *p, int32_t t) {
    int32_t x = ceil_ppm(p->ratio_local, t);
    x = p->local_tokens > 0 && x > p->local_tokens ? p->local_tokens : x;
    return x < 1 ? 1 : x;
}
static int32_t budget_at(const fg_policy *p, int32_t t) {
    int32_t x = ceil_ppm(p->ratio_frequent, t);
    return p->frequent_tokens > 0 && x > p->frequent_tokens ? p->frequent_tokens : x;
}
static uint32_t effective(uint32_t c) { return (c & FG_KEEP_FULL) ? FG_KEEP_FULL : c; }
static int pinned(uint32_t c, uint8_t cls) {
    return (cls == FG_TOKEN_SPECIAL && (c & FG_KEEP_SPECIAL)) || (cls == FG_TOKEN_PUNCT && (c & FG_KEEP_PUNCT));
}

/* Pooled attention rows of KV head g over keys key[0..nk) (positions pos,
 * rows k/v) for query rows at positions rows[0..nr) (a row sees the keys at
 * or before it): A[r][j], and the output of each query head. */
static void dense(const float *q /* [MAXLEN][HQ][D] */, const float *kk /* [nk][D] */, const float *vv,
                  const int32_t *pos, int32_t nk, const int32_t *rows, int32_t nr, int32_t g, double *A /* [nr][nk] */,
                  double *out /* [nr][G][D] or NULL */) {
    for (int32_t r = 0; r < nr; r++) {
        for (int32_t j = 0; j < nk; j++)
            A[(size_t)r * nk + j] = 0.0;
        for (int32_t h = 0; h < G; h++) {
            const float *qi = q + ((size_t)rows[r] * HQ + g * G + h) * D;
            double sc[MAXLEN], mx = -INFINITY, sum = 0.0;
            for (int32_t j = 0; j < nk && pos[j] <= rows[r]; j++) {
                sc[j] = 0.0;
                for (int32_t x = 0; x < D; x++)
                    sc[j] += (double)qi[x] * kk[(size_t)j * D + x];
                sc[j] /= sqrt((double)D);
                mx = sc[j] > mx ? sc[j] : mx;
            }
            int32_t seen = 0;
            while (seen < nk && pos[seen] <= rows[r])
                seen++;
            for (int32_t j = 0; j < seen; j++)
                sum += exp(sc[j] - mx);
            for (int32_t x = 0; out && x < D; x++)
                out[((size_t)r * G + h) * D + x] = 0.0;
            for (int32_t j = 0; j < seen; j++) {
                const double a = exp(sc[j] - mx) / sum;
                A[(size_t)r * nk + j] += a / G;
                for (int32_t x = 0; out && x < D; x++)
                    out[((size_t)r * G + h) * D + x] += a * vv[(size_t)j * D + x];
            }
        }
    }
}

typedef struct brute {
    double rec[FG_MAX_SHORTLIST];
    uint32_t skip;
    int32_t choice, n_kept;
    int32_t kept[MAXLEN];
    double out[MAXLEN * G * D];
    double near; /* the smallest relative rank gap at a frequent cut, and recovery gap at T */
} brute;

/* The frequent set of entry e: the top k(T) ranks among the unpinned keys
 * before index `before`; in[j] set for them. Returns the relative gap at the cut. */
static double top_k(const fg_compression_params *cp, const fg_policy *pol, const double *rank, const uint8_t *cls,
                    const int32_t *pos, int32_t before, int32_t T, int *in) {
    const uint32_t c = effective(pol->components);
    int32_t cand[MAXLEN], n = 0;
    for (int32_t j = 0; j < before; j++)
        if (!pinned(c, cls[j]))
            cand[n++] = j;
    for (int32_t a = 1; a < n; a++) /* insertion sort: rank descending, then the later position */
        for (int32_t b = a; b > 0; b--) {
            const int32_t x = cand[b - 1], y = cand[b];
            if (rank[y] > rank[x] || (rank[y] == rank[x] && pos[y] > pos[x])) {
                cand[b - 1] = y;
                cand[b] = x;
            }
        }
    const int32_t k = budget_at(pol, T) < n ? budget_at(pol, T) : n;
    for (int32_t i = 0; i < k; i++)
        in[cand[i]] = 1;
    (void)cp;
    if (k == 0 || k == n)
        return INFINITY;
    return fabs(rank[cand[k - 1]] - rank[cand[k]]) / fmax(fabs(rank[cand[k - 1]]), 1e-30);
}

/* The brute force of one head's re-profiling append of chunk [t, T). */
static void brute_head(const world *w, const fg_compression_params *cp, int32_t l, int32_t g, int32_t t, int32_t T,
                       const int32_t *old, int32_t m, uint32_t old_comp, const double *prompt_col, brute *b) {
    static float kk[MAXLEN * D], vv[MAXLEN * D];
    static double A[MAXLEN * MAXLEN];
    int32_t pos[MAXLEN], rows[MAXLEN];
    uint8_t cls[MAXLEN];
    double base[MAXLEN], col[MAXLEN], rank[MAXLEN];
    const int32_t nk = m + (T - t), nr = T - t;
    for (int32_t j = 0; j < nk; j++) {
        pos[j] = j < m ? old[j] : t + (j - m);
        cls[j] = w->cls[pos[j]];
        base[j] = j < m && (old_comp & FG_KEEP_FREQUENT) ? prompt_col[pos[j]] : 0.0;
        for (int32_t x = 0; x < D; x++) { /* kept rows as cached; the chunk's as given */
            const float kx = w->k[l][((size_t)pos[j] * HKV + g) * D + x], vx = w->v[l][((size_t)pos[j] * HKV + g) * D + x];
            kk[(size_t)j * D + x] = j < m ? fg_quantize(kx, w->dtype) : kx;
            vv[(size_t)j * D + x] = j < m ? fg_quantize(vx, w->dtype) : vx;
        }
    }
    for (int32_t r = 0; r < nr; r++)
        rows[r] = t + r;
    dense(w->q[l], kk, vv, pos, nk, rows, nr, g, A, b->out);
    for (int32_t j = 0; j < nk; j++) {
        col[j] = 0.0;
        for (int32_t r = 0; r < nr; r++)
            col[j] += A[(size_t)r * nk + j];
        rank[j] = base[j] + col[j];
        if (cp->score_mode == FG_SCORE_MEAN)
            rank[j] /= (double)(T - pos[j]);
    }
    b->near = INFINITY;
    b->skip = 0;
    b->choice = -1;
    int32_t fallback = cp->n_policies - 1;
    int in_sets[FG_MAX_SHORTLIST][MAXLEN];
    int32_t wstart[FG_MAX_SHORTLIST];
    for (int32_t e = 0; e < cp->n_policies; e++) {
        const fg_policy *pol = &cp->shortlist[e];
        const uint32_t c = effective(pol->components);
        int *in = in_sets[e];
        memset(in, 0, sizeof in_sets[e]);
        wstart[e] = nk;
        if (c & FG_KEEP_FULL) {
            b->rec[e] = 1.0;
            for (int32_t j = 0; j < nk; j++)
                in[j] = 1;
        } else {
            const int32_t win = window_at(pol, T);
            if (c & FG_KEEP_LOCAL) {
                wstart[e] = 0;
                while (wstart[e] < nk && pos[wstart[e]] < T - win)
                    wstart[e]++;
                int32_t need = 0, held = 0;
                for (int32_t p = T - win; p < T; p++)
                    need += !pinned(c, w->cls[p]);
                for (int32_t j = wstart[e]; j < nk; j++)
                    held += !pinned(c, cls[j]);
                if (held < need)
                    b->skip |= 1u << e;
            }
            if (c & FG_KEEP_FREQUENT)
                b->near = fmin(b->near, top_k(cp, pol, rank, cls, pos, wstart[e], T, in));
            /* recovery: each row's mass on what the entry keeps for that row */
            double mass = 0.0;
            for (int32_t r = 0; r < nr; r++)
                for (int32_t j = 0; j < nk; j++) {
                    const int local = (c & FG_KEEP_LOCAL) && rows[r] - pos[j] < win;
                    if (pinned(c, cls[j]) || local || in[j])
                        mass += A[(size_t)r * nk + j];
                }
            b->rec[e] = mass / nr;
            for (int32_t j = 0; j < nk; j++)
                in[j] |= pinned(c, cls[j]) || j >= wstart[e];
        }
        if (b->skip & (1u << e))
            continue;
        fallback = e;
        b->near = fmin(b->near, fabs(b->rec[e] - cp->threshold));
        if (b->choice < 0 && b->rec[e] >= cp->threshold)
            b->choice = e;
    }
    if (b->choice < 0)
        b->choice = fallback;
    b->n_kept = 0;
    for (int32_t j = 0; j < nk; j++)
        if (in_sets[b->choice][j])
            b->kept[b->n_kept++] = pos[j];
}

/* Prompt, then a re-profiled chunk of C tokens; every head against the brute force. */
static void test_brute(const char *backend, const char *preset, fg_dtype dtype, int32_t C, int swap, float T_) {
    world *w = &g_w;
    world_init(w, 5, dtype, swap ? N : -1);
    fg_context *ctx = open_context(w, backend, 1);
    if (!ctx)
        return;
    fg_compression_params cp;
    if (!strcmp(preset, "s|s+l|full")) { /* a window is all a local query can use */
        params("fastgen", &cp);
        cp.n_policies = 3;
        cp.shortlist[1].components = FG_KEEP_SPECIAL | FG_KEEP_LOCAL;
        cp.shortlist[2].components = FG_KEEP_FULL;
    } else {
        params(preset, &cp);
    }
    cp.threshold = T_;
    int32_t a;
    EXPECT_OK(ctx, fg_seq_create(ctx, &cp, w->tokens, N, &a));
    prefill(w, ctx, a);
    static float out[MAXLEN * HQ * D];
    int ties = 0, checked = 0, skipped = 0, changed = 0;
    double worst = 0.0;
    for (int32_t l = 0; l < L; l++) {
        int32_t old[HKV][MAXLEN], m[HKV];
        uint32_t comp[HKV];
        static double pcol[HKV][MAXLEN];
        for (int32_t g = 0; g < HKV; g++) {
            fg_head_info info;
            EXPECT_OK(ctx, fg_head_inspect(ctx, a, l, g, &info));
            comp[g] = info.components;
            EXPECT_OK(ctx, fg_head_positions(ctx, a, l, g, old[g], MAXLEN, &m[g]));
            /* the prompt's cumulative scores: the pooled attention each key got */
            static double Ap[N * N];
            int32_t ppos[N];
            static float pk[N * D], pv[N * D];
            for (int32_t j = 0; j < N; j++) {
                ppos[j] = j;
                memcpy(pk + j * D, &w->k[l][((size_t)j * HKV + g) * D], sizeof(float) * D);
                memcpy(pv + j * D, &w->v[l][((size_t)j * HKV + g) * D], sizeof(float) * D);
            }
            dense(w->q[l], pk, pv, ppos, N, ppos, N, g, Ap, NULL);
            for (int32_t j = 0; j < N; j++) {
                pcol[g][j] = 0.0;
                for (int32_t i = 0; i < N; i++)
                    pcol[g][j] += Ap[(size_t)i * N + j];
            }
        }
        EXPECT_OK(ctx, fg_seq_append(ctx, a, l, &w->tokens[N], C, &w->q[l][(size_t)N * HQ * D],
                                     &w->k[l][(size_t)N * HKV * D], &w->v[l][(size_t)N * HKV * D], out));
        for (int32_t g = 0; g < HKV; g++) {
            static brute b;
            brute_head(w, &cp, l, g, N, N + C, old[g], m[g], comp[g], pcol[g], &b);
            fg_head_info info;
            int32_t kept[MAXLEN], n_kept = -1;
            EXPECT_OK(ctx, fg_head_inspect(ctx, a, l, g, &info));
            EXPECT_OK(ctx, fg_head_positions(ctx, a, l, g, kept, MAXLEN, &n_kept));
            static float o[MAXLEN * G * D];
            for (int32_t r = 0; r < C; r++)
                memcpy(o + (size_t)r * G * D, out + ((size_t)r * HQ + g * G) * D, sizeof(float) * G * D);
            const double e = nmse(o, b.out, (size_t)C * G * D);
            worst = e > worst ? e : worst;
            EXPECT(e < 1e-8, "%s %s layer %d head %d: output NMSE %.3g against the brute force", backend, preset,
                   (int)l, (int)g, e);
            for (int32_t x = 0; x < cp.n_policies; x++)
                EXPECT(fabs(info.recovery[x] - b.rec[x]) < 1e-4, "%s %s layer %d head %d: entry %d recovers %.6f, brute %.6f",
                       backend, preset, (int)l, (int)g, (int)x, (double)info.recovery[x], b.rec[x]);
            const int same = info.policy_index == b.choice && n_kept == b.n_kept &&
                             memcmp(kept, b.kept, (size_t)n_kept * sizeof *kept) == 0;
            if (!same && b.near < 1e-4) {
                ties++;
            } else {
                EXPECT(same, "%s %s layer %d head %d: entry %d keeping %d rows, brute: entry %d keeping %d", backend,
                       preset, (int)l, (int)g, (int)info.policy_index, (int)n_kept, (int)b.choice, (int)b.n_kept);
            }
            EXPECT(info.length == N + C && info.kept == n_kept, "%s: head info %d/%d", backend, (int)info.length,
                   (int)info.kept);
            skipped += b.skip != 0;
            changed += info.components != comp[g];
            checked++;
        }
    }
    printf("  %-4s %-10s %s C=%-3d%s T=%.2f: %d heads = brute force (outputs NMSE <= %.1e, %d near-ties adopted); "
           "%d changed policy, %d had entries out of reach\n",
           backend, preset, dtype == FG_DTYPE_F32 ? "f32 " : dtype == FG_DTYPE_F16 ? "f16 " : "bf16", (int)C,
           swap ? " swapped" : "", (double)T_, checked, worst, ties, changed, skipped);
    if (swap)
        EXPECT(skipped > 0 && changed > 0, "%s: the swapped case left no entry out of reach (the check did not run)",
               backend);
    fg_context_destroy(&ctx);
    synth_destroy(&w->syn);
}

/* A full cache, re-profiled: the chunk equals a one-shot prefill's rows. */
static void test_full(const char *backend) {
    enum { C = 40 };
    world *w = &g_w;
    world_init(w, 7, FG_DTYPE_F32, -1);
    fg_context *ctx = open_context(w, backend, 2);
    if (!ctx)
        return;
    fg_compression_params cp;
    params("full", &cp);
    int32_t a, b;
    EXPECT_OK(ctx, fg_seq_create(ctx, &cp, w->tokens, N, &a));
    EXPECT_OK(ctx, fg_seq_create(ctx, &cp, w->tokens, N + C, &b));
    prefill(w, ctx, a);
    static float oa[L * C * HQ * D], ob[L][(N + C) * HQ * D];
    append(w, ctx, a, N, C, oa);
    for (int32_t l = 0; l < L; l++)
        EXPECT_OK(ctx, fg_prefill(ctx, b, l, w->q[l], w->k[l], w->v[l], ob[l]));
    int bits = 1;
    double worst = 0.0;
    for (int32_t l = 0; l < L; l++) {
        const float *x = oa + (size_t)l * C * HQ * D, *y = ob[l] + (size_t)N * HQ * D;
        bits &= memcmp(x, y, sizeof(float) * C * HQ * D) == 0;
        static double yd[C * HQ * D];
        for (size_t i = 0; i < (size_t)C * HQ * D; i++)
            yd[i] = y[i];
        const double e = nmse(x, yd, (size_t)C * HQ * D);
        worst = e > worst ? e : worst;
    }
    const int want_bits = strcmp(backend, "cpu") != 0;
    EXPECT(want_bits ? bits : worst < 1e-10, "%s: a re-profiled chunk on a full cache differs from one-shot (NMSE %.3g)",
           backend, worst);
    for (int32_t l = 0; l < L; l++)
        for (int32_t g = 0; g < HKV; g++) {
            fg_head_info ia, ib;
            EXPECT_OK(ctx, fg_head_inspect(ctx, a, l, g, &ia));
            EXPECT_OK(ctx, fg_head_inspect(ctx, b, l, g, &ib));
            EXPECT(ia.kept == N + C && ib.kept == N + C && ia.kv_bytes_held == ib.kv_bytes_held,
                   "%s: full heads keep %d and %d rows", backend, (int)ia.kept, (int)ib.kept);
        }
    /* and the next step too */
    static float da[L * HQ * D], db[L * HQ * D];
    decode(w, ctx, a, N + C, da);
    decode(w, ctx, b, N + C, db);
    EXPECT(want_bits ? memcmp(da, db, sizeof da) == 0 : 1, "%s: the step after the chunk differs", backend);
    printf("  %-4s full cache: a re-profiled chunk of %d = one-shot prefill %s (NMSE %.1e)\n", backend, C,
           bits ? "bit for bit" : "within rounding", worst);
    fg_context_destroy(&ctx);
    synth_destroy(&w->syn);
}

/* A conversation on `backend` and on ref: the same choices and kept rows. */
typedef struct convo {
    float out[L * MAXLEN * HQ * D];
    int32_t policy[L][HKV], kept[L][HKV][MAXLEN], n_kept[L][HKV];
    size_t held;
} convo;

static void run_convo(const char *backend, convo *c) {
    static const int32_t turns[][2] = {{N, 20}, {N + 20, 6}, {N + 26, 30}, {N + 56, 5}, {N + 61, 9}}; /* append / decode */
    world *w = &g_w;
    fg_context *ctx = open_context(w, backend, 1);
    if (!ctx)
        return;
    fg_compression_params cp;
    params("fastgen", &cp);
    int32_t a;
    EXPECT_OK(ctx, fg_seq_create(ctx, &cp, w->tokens, N, &a));
    prefill(w, ctx, a);
    size_t at = 0;
    for (size_t i = 0; i < sizeof turns / sizeof turns[0]; i++) {
        const int32_t p = turns[i][0], n = turns[i][1];
        if (i % 2 == 0) {
            append(w, ctx, a, p, n, c->out + at);
        } else {
            static float o[MAXLEN][L * HQ * D];
            for (int32_t s = 0; s < n; s++)
                decode(w, ctx, a, p + s, o[s]);
            for (int32_t s = 0; s < n; s++) /* [L][n][HQ][D] as an append's */
                for (int32_t l = 0; l < L; l++)
                    memcpy(c->out + at + ((size_t)l * n + s) * HQ * D, o[s] + (size_t)l * HQ * D,
                           sizeof(float) * HQ * D);
        }
        at += (size_t)L * n * HQ * D;
    }
    for (int32_t l = 0; l < L; l++)
        for (int32_t g = 0; g < HKV; g++) {
            fg_head_info info;
            EXPECT_OK(ctx, fg_head_inspect(ctx, a, l, g, &info));
            c->policy[l][g] = info.policy_index;
            EXPECT_OK(ctx, fg_head_positions(ctx, a, l, g, c->kept[l][g], MAXLEN, &c->n_kept[l][g]));
        }
    fg_memory_stats ms;
    EXPECT_OK(ctx, fg_memory(ctx, a, &ms));
    c->held = ms.kv_bytes_held;
    fg_context_destroy(&ctx);
}

static void test_convo(const char *backend) {
    static convo ref, got;
    world *w = &g_w;
    world_init(w, 9, FG_DTYPE_F16, -1);
    memset(&ref, 0, sizeof ref);
    memset(&got, 0, sizeof got);
    run_convo("ref", &ref);
    run_convo(backend, &got);
    static double rd[L * MAXLEN * HQ * D];
    const size_t n = (size_t)L * (20 + 6 + 30 + 5 + 9) * HQ * D;
    for (size_t i = 0; i < n; i++)
        rd[i] = ref.out[i];
    const double e = nmse(got.out, rd, n);
    EXPECT(e < 1e-8, "%s: conversation outputs NMSE %.3g against ref", backend, e);
    EXPECT(memcmp(ref.policy, got.policy, sizeof ref.policy) == 0 && memcmp(ref.n_kept, got.n_kept, sizeof ref.n_kept) == 0 &&
               memcmp(ref.kept, got.kept, sizeof ref.kept) == 0 && ref.held == got.held,
           "%s: a conversation's policies or kept rows differ from ref", backend);
    printf("  %-4s conversation (append 20, decode 6, append 30, decode 5, append 9): policies and kept rows = ref, "
           "outputs NMSE %.1e, %zu KV bytes held\n",
           backend, e, got.held);
    synth_destroy(&w->syn);
}

/* A fork that re-profiles leaves its parent as an independent sequence; a
 * refused chunk changes nothing. */
static void test_fork_and_refusal(const char *backend) {
    enum { C = 24 };
    world *w = &g_w;
    world_init(w, 13, FG_DTYPE_BF16, -1);
    fg_context *ctx = open_context(w, backend, 3);
    if (!ctx)
        return;
    fg_compression_params cp;
    params("fastgen", &cp);
    int32_t parent, twin, child;
    EXPECT_OK(ctx, fg_seq_create(ctx, &cp, w->tokens, N, &parent));
    EXPECT_OK(ctx, fg_seq_create(ctx, &cp, w->tokens, N, &twin));
    prefill(w, ctx, parent);
    prefill(w, ctx, twin);
    EXPECT_OK(ctx, fg_seq_fork(ctx, parent, &child));
    static float out[L * C * HQ * D];
    /* refused: a token outside the vocabulary in the chunk */
    fg_memory_stats m0, m1;
    fg_memory(ctx, -1, &m0);
    int32_t bad[C];
    memcpy(bad, &w->tokens[N], sizeof bad);
    bad[C - 1] = SYNTH_VOCAB + 1;
    EXPECT_STATUS(ctx, FG_ERR_INVALID_ARGUMENT, fg_seq_append(ctx, child, 0, bad, C, &w->q[0][(size_t)N * HQ * D],
                                                             &w->k[0][(size_t)N * HKV * D], &w->v[0][(size_t)N * HKV * D], out));
    fg_memory(ctx, -1, &m1);
    int32_t len = -1;
    fg_seq_length(ctx, child, 0, &len);
    EXPECT(len == N && m1.pages_in_use == m0.pages_in_use, "%s: a refused chunk changed the fork (length %d)", backend,
           (int)len);
    append(w, ctx, child, N, C, out);
    /* the parent still equals its twin, and decodes as it does */
    int same = 1;
    for (int32_t l = 0; l < L; l++)
        for (int32_t g = 0; g < HKV; g++) {
            int32_t pa[MAXLEN], pb[MAXLEN], na = -1, nb = -2;
            fg_head_positions(ctx, parent, l, g, pa, MAXLEN, &na);
            fg_head_positions(ctx, twin, l, g, pb, MAXLEN, &nb);
            same &= na == nb && memcmp(pa, pb, (size_t)na * sizeof *pa) == 0;
        }
    static float dp[L * HQ * D], dt[L * HQ * D];
    decode(w, ctx, parent, N, dp);
    decode(w, ctx, twin, N, dt);
    EXPECT(same && memcmp(dp, dt, sizeof dp) == 0, "%s: re-profiling a fork changed its parent", backend);
    fg_memory_stats mp, mt;
    fg_memory(ctx, parent, &mp);
    fg_memory(ctx, twin, &mt);
    EXPECT(mp.kv_bytes_held == mt.kv_bytes_held, "%s: the parent holds %zu bytes, its twin %zu", backend,
           mp.kv_bytes_held, mt.kv_bytes_held);
    EXPECT_OK(ctx, fg_seq_destroy(ctx, child));
    EXPECT_OK(ctx, fg_seq_destroy(ctx, parent));
    EXPECT_OK(ctx, fg_seq_destroy(ctx, twin));
    fg_memory_stats end;
    fg_memory(ctx, -1, &end);
    EXPECT(end.pages_in_use == 0, "%s: %lld pages left", backend, (long long)end.pages_in_use);
    /* budget mode does not re-profile: refused when the sequence is made */
    params("fastgen-budget", &cp);
    int32_t x;
    EXPECT_STATUS(ctx, FG_ERR_INVALID_ARGUMENT, fg_seq_create(ctx, &cp, w->tokens, N, &x));
    printf("  %-4s fork: a re-profiled child leaves its parent = its twin; refused chunks change nothing\n", backend);
    fg_context_destroy(&ctx);
    synth_destroy(&w->syn);
}

static void run(const char *backend) {
    test_brute(backend, "fastgen", FG_DTYPE_F32, 40, 0, 0.95f);
    test_brute(backend, "fastgen", FG_DTYPE_F16, 12, 1, 0.95f);
    test_brute(backend, "s|s+l|full", FG_DTYPE_F16, 12, 1, 0.9f);
    test_brute(backend, "fastgen", FG_DTYPE_BF16, 30, 0, 0.9f);
    test_brute(backend, "h2o", FG_DTYPE_F32, 20, 0, 0.95f);
    test_full(backend);
    test_convo(backend);
    test_fork_and_refusal(backend);
}

int main(int argc, char **argv) {
    test_seed("test_reprofile");
    return test_each_backend(argc, argv, run);
}
