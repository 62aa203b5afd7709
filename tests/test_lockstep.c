/*
 * Decode lockstep: a deliberately simple simulator of DESIGN §2.5 — sets of
 * positions, double-precision scores, no pages — runs beside the library for
 * >= 300 steps per policy. Two sequences with different policies and prompt
 * lengths share every batched decode call. At every step:
 *   - the kept position set of every head equals the simulator's;
 *   - the attention output equals dense attention over exactly that set
 *     plus the new token (NMSE in double);
 *   - the bytes a head holds equal its kept rows rounded up to pages.
 * Eviction ties closer than fp32 can call (relative 1e-4) are resolved by
 * adopting the library's choice, and counted.
 */
#include <string.h>

#include "fastgen.h"
#include "harness.h"
#include "kernels_cpu/dtype.h"

#define VOCAB 8 /* 0-4 ordinary, 5 and 7 punctuation, 6 special */
#define STEPS 300
#define MAXT 400

typedef struct sim_head {
    uint32_t comp;
    uint8_t flag[MAXT]; /* 0 = not kept, else FG_KEEP_* bit that keeps it */
    double score[MAXT];
} sim_head;

typedef struct sim_seq {
    fg_compression_params cp;
    const fg_policy *pol;  /* chosen per head, but one-entry shortlists here */
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

static int32_t window_at(const fg_policy *p, int32_t t) {
    int32_t w = (int32_t)ceil((double)p->ratio_local * t);
    if (p->local_tokens > 0 && w > p->local_tokens)
        w = p->local_tokens;
    return w < 1 ? 1 : w;
}

static int32_t budget_at(const fg_policy *p, int32_t t) {
    int32_t k = (int32_t)ceil((double)p->ratio_frequent * t);
    return p->frequent_tokens > 0 && k > p->frequent_tokens ? p->frequent_tokens : k;
}

static int pinned(uint32_t comp, uint8_t cls) {
    return (cls == FG_TOKEN_SPECIAL && (comp & FG_KEEP_SPECIAL)) || (cls == FG_TOKEN_PUNCT && (comp & FG_KEEP_PUNCT));
}

static double rank_of(const sim_seq *s, const sim_head *h, int32_t j, int32_t t) {
    return s->cp.score_mode == FG_SCORE_MEAN ? h->score[j] / (t - j) : h->score[j];
}

/* Pooled attention of head g's group for row i over keys j <= i (prompt). */
static void prompt_col(const sim_seq *s, const run_cfg *rc, int32_t g, double *col) {
    const int32_t Hq = rc->G * rc->Hkv, d = rc->d;
    for (int32_t j = 0; j < s->n; j++)
        col[j] = 0.0;
    for (int32_t h = g * rc->G; h < (g + 1) * rc->G; h++)
        for (int32_t i = 0; i < s->n; i++) {
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

/* The simulator starts from the library's prompt state (checked by the
 * brute-force test), with scores from its own double-precision profile. */
static void sim_init(fg_context *ctx, sim_seq *s, const run_cfg *rc) {
    for (int32_t g = 0; g < rc->Hkv; g++) {
        sim_head *h = &s->heads[g];
        memset(h, 0, sizeof *h);
        fg_head_info info;
        EXPECT_OK(ctx, fg_head_inspect(ctx, s->id, 0, g, &info));
        h->comp = info.components;
        int32_t pos[MAXT], n_kept = 0;
        EXPECT_OK(ctx, fg_head_positions(ctx, s->id, 0, g, pos, MAXT, &n_kept));
        prompt_col(s, rc, g, h->score);
        const int32_t wstart = s->n - window_at(s->pol, s->n);
        for (int32_t i = 0; i < n_kept; i++) {
            int32_t j = pos[i];
            h->flag[j] = (h->comp & FG_KEEP_FULL)                               ? FG_KEEP_FULL
                         : pinned(h->comp, s->cls[j])                           ? (s->cls[j] == FG_TOKEN_SPECIAL ? FG_KEEP_SPECIAL : FG_KEEP_PUNCT)
                         : ((h->comp & FG_KEEP_LOCAL) && j >= wstart)           ? FG_KEEP_LOCAL
                                                                                : FG_KEEP_FREQUENT;
        }
    }
}

static float cached(float x, const run_cfg *rc) { return fg_quantize(x, rc->dtype); }

/* One step of §2.5 for head g of s at position p; accumulates the dense
 * reference output into ref[G][d]. */
static void sim_step(sim_seq *s, const run_cfg *rc, int32_t g, int32_t p, double *ref) {
    sim_head *h = &s->heads[g];
    const int32_t Hq = rc->G * rc->Hkv, d = rc->d, t = p + 1;
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
    if (track)
        for (int32_t j = 0; j <= p; j++)
            if (j == p || h->flag[j])
                h->score[j] = (j == p ? 0.0 : h->score[j]) + gained[j];

    /* insert */
    uint32_t c = h->comp;
    h->flag[p] = (c & FG_KEEP_FULL)                                  ? FG_KEEP_FULL
                 : (s->cls[p] == FG_TOKEN_SPECIAL && (c & FG_KEEP_SPECIAL)) ? FG_KEEP_SPECIAL
                 : (s->cls[p] == FG_TOKEN_PUNCT && (c & FG_KEEP_PUNCT))     ? FG_KEEP_PUNCT
                 : (c & FG_KEEP_LOCAL)                                      ? FG_KEEP_LOCAL
                 : (c & FG_KEEP_FREQUENT)                                   ? FG_KEEP_FREQUENT
                                                                            : 0;
    /* window */
    if (c & FG_KEEP_LOCAL) {
        int32_t start = t - window_at(s->pol, t);
        for (int32_t j = 0; j < start; j++)
            if (h->flag[j] == FG_KEEP_LOCAL)
                h->flag[j] = (c & FG_KEEP_FREQUENT) ? FG_KEEP_FREQUENT : 0;
    }
    /* frequent budget */
    if (track) {
        int32_t nf = 0;
        for (int32_t j = 0; j <= p; j++)
            nf += h->flag[j] == FG_KEEP_FREQUENT;
        while (nf > budget_at(s->pol, t)) {
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

static void run_pair(const run_cfg *rc, const fg_compression_params *cpa, const fg_compression_params *cpb,
                     const char *name) {
    fg_token_classes *tc = NULL;
    fg_token_classes_create(VOCAB, NULL, &tc);
    fg_token_classes_set(tc, 5, FG_TOKEN_PUNCT);
    fg_token_classes_set(tc, 7, FG_TOKEN_PUNCT);
    fg_token_classes_set(tc, 6, FG_TOKEN_SPECIAL);
    const int32_t Hq = rc->G * rc->Hkv, d = rc->d;
    fg_context_params params;
    fg_context_params_default(&params);
    params.backend = "ref";
    params.n_layers = 1;
    params.n_q_heads = Hq;
    params.n_kv_heads = rc->Hkv;
    params.head_dim = d;
    params.kv_dtype = rc->dtype;
    params.max_seqs = 2;
    params.max_seq_len = MAXT;
    params.page_tokens = rc->page_tokens;
    params.pool_chunk_pages = 3;
    params.classes = tc;
    fg_context *ctx = NULL;
    EXPECT_OK(NULL, fg_context_create(&params, &ctx));

    static sim_seq seqs[2];
    make_seq(&seqs[0], rc, cpa);
    make_seq(&seqs[1], rc, cpb);
    float *out = malloc((size_t)MAXT * Hq * d * sizeof(float));
    for (int b = 0; b < 2; b++) {
        sim_seq *s = &seqs[b];
        EXPECT_OK(ctx, fg_seq_create(ctx, &s->cp, s->tokens, s->n, &s->id));
        EXPECT_OK(ctx, fg_prefill(ctx, s->id, 0, s->q, s->k, s->v, out));
        sim_init(ctx, s, rc);
    }

    const size_t row_q = (size_t)Hq * d, row_k = (size_t)rc->Hkv * d;
    float *bq = malloc(2 * row_q * sizeof(float)), *bk = malloc(2 * row_k * sizeof(float));
    float *bv = malloc(2 * row_k * sizeof(float)), *bo = malloc(2 * row_q * sizeof(float));
    double *ref = malloc(2 * row_q * sizeof(double));
    const size_t row_bytes = 2 * (size_t)d * (rc->dtype == FG_DTYPE_F32 ? 4 : 2);
    int bad_bytes = 0;
    double worst_nmse = 0.0;
    for (int32_t step = 0; step < STEPS; step++) {
        int32_t ids[2], toks[2];
        for (int b = 0; b < 2; b++) {
            sim_seq *s = &seqs[b];
            int32_t p = s->n + step;
            ids[b] = s->id;
            toks[b] = s->tokens[p];
            memcpy(bq + b * row_q, s->q + (size_t)p * row_q, row_q * sizeof(float));
            memcpy(bk + b * row_k, s->k + (size_t)p * row_k, row_k * sizeof(float));
            memcpy(bv + b * row_k, s->v + (size_t)p * row_k, row_k * sizeof(float));
        }
        EXPECT_OK(ctx, fg_decode(ctx, 0, 2, ids, toks, bq, bk, bv, bo));
        memset(ref, 0, 2 * row_q * sizeof(double));
        double num = 0.0, den = 0.0;
        for (int b = 0; b < 2; b++) {
            sim_seq *s = &seqs[b];
            int32_t p = s->n + step;
            for (int32_t g = 0; g < rc->Hkv; g++) {
                sim_step(s, rc, g, p, ref + b * row_q + (size_t)g * rc->G * d);
                compare_sets(ctx, s, g, p + 1, name);
                fg_head_info info;
                EXPECT_OK(ctx, fg_head_inspect(ctx, s->id, 0, g, &info));
                size_t pages = ((size_t)info.kept + rc->page_tokens - 1) / rc->page_tokens;
                bad_bytes += info.kv_bytes_held != pages * rc->page_tokens * row_bytes || info.length != p + 1;
            }
        }
        for (size_t i = 0; i < 2 * row_q; i++) {
            num += (bo[i] - ref[i]) * (bo[i] - ref[i]);
            den += ref[i] * ref[i];
            if (!isfinite(bo[i]))
                num = INFINITY;
        }
        worst_nmse = fmax(worst_nmse, num / den);
    }
    /* the library quantises the new row only after attending it, like the simulator */
    EXPECT(worst_nmse <= 1e-9, "%s: attention NMSE %.3g vs dense over the kept set", name, worst_nmse);
    EXPECT(bad_bytes == 0, "%s: %d steps where held bytes != kept rows rounded up to pages", name, bad_bytes);
    printf("  %-34s G=%d Hkv=%d d=%-3d %s page=%d  NMSE %.2e\n", name, (int)rc->G, (int)rc->Hkv, (int)d,
           rc->dtype == FG_DTYPE_F32 ? "f32 " : rc->dtype == FG_DTYPE_F16 ? "f16 " : "bf16", (int)rc->page_tokens,
           worst_nmse);
    for (int b = 0; b < 2; b++) {
        free(seqs[b].q);
        free(seqs[b].k);
        free(seqs[b].v);
    }
    free(out);
    free(bq);
    free(bk);
    free(bv);
    free(bo);
    free(ref);
    fg_context_destroy(&ctx);
    fg_token_classes_destroy(&tc);
}

static fg_compression_params one_entry(uint32_t comp, float rl, float rf, int32_t lt, int32_t ft, fg_score_mode mode,
                                       int32_t n_sink) {
    fg_compression_params cp;
    fg_compression_params_default(&cp);
    cp.n_policies = 1;
    cp.shortlist[0] = (fg_policy){comp, rl, rf, lt, ft};
    cp.score_mode = mode;
    cp.n_sink = n_sink;
    return cp;
}

int main(void) {
    test_seed("test_lockstep");
    const uint32_t S = FG_KEEP_SPECIAL, P = FG_KEEP_PUNCT, F = FG_KEEP_FREQUENT, L = FG_KEEP_LOCAL;
    struct {
        const char *name;
        fg_compression_params cp;
    } cfg[] = {
        {"special", one_entry(S, 0.25f, 0.25f, 0, 0, FG_SCORE_SUM, 0)},
        {"special+punct", one_entry(S | P, 0.25f, 0.25f, 0, 0, FG_SCORE_SUM, 0)},
        {"special+punct+frequent", one_entry(S | P | F, 0.25f, 0.25f, 0, 0, FG_SCORE_SUM, 0)},
        {"special+punct+frequent+local", one_entry(S | P | F | L, 0.25f, 0.125f, 0, 0, FG_SCORE_SUM, 0)},
        {"full", one_entry(FG_KEEP_FULL, 0.25f, 0.25f, 0, 0, FG_SCORE_SUM, 0)},
        {"streamingllm (sinks 4)", one_entry(S | L, 0.25f, 0.0f, 0, 0, FG_SCORE_SUM, 4)},
        {"h2o", one_entry(F | L, 0.125f, 0.125f, 0, 0, FG_SCORE_SUM, 0)},
        {"local", one_entry(L, 0.25f, 0.0f, 0, 0, FG_SCORE_SUM, 0)},
        {"frequent", one_entry(F, 0.0f, 0.25f, 0, 0, FG_SCORE_SUM, 0)},
        {"h2o tokens 8+6", one_entry(F | L, 1.0f, 1.0f, 8, 6, FG_SCORE_SUM, 0)},
        {"s+p+f+l mean", one_entry(S | P | F | L, 0.125f, 0.25f, 0, 0, FG_SCORE_MEAN, 0)},
        {"frequent mean tokens 10", one_entry(F, 0.0f, 1.0f, 0, 10, FG_SCORE_MEAN, 0)},
        {"local tokens 5 + frequent 0.0625", one_entry(L | F, 1.0f, 0.0625f, 5, 0, FG_SCORE_SUM, 2)},
    };
    const int n_cfg = (int)(sizeof cfg / sizeof cfg[0]);
    int run = 0;
    for (int32_t G = 1; G <= 4; G *= 2) {
        for (int i = 0; i < n_cfg; i++, run++) {
            run_cfg rc = {G, rng_int(1, 2), rng_int(0, 1) ? 8 : 16, rng_int(1, 6), (fg_dtype)(run % 3)};
            char name[96];
            snprintf(name, sizeof name, "%s | %s", cfg[i].name, cfg[(i + 1) % n_cfg].name);
            run_pair(&rc, &cfg[i].cp, &cfg[(i + 1) % n_cfg].cp, name);
        }
    }
    printf("%d runs of %d steps (2 sequences each); %d fp32 eviction near-ties adopted\n", run, STEPS, g_ties);
    return test_finish();
}
