/*
 * Decode lockstep: a deliberately simple simulator of docs/design.md §2.5 — sets of
 * positions, double-precision scores, no pages — runs beside the library for
 * 300 steps per policy (--steps N: fewer). Two sequences with different policies and prompt
 * lengths share every batched decode call; a third forks from the first a
 * third of the way in (pages shared, copy-on-write) and decodes tokens of its
 * own; every 29 steps the second takes a chunk of 2 to 8 tokens by
 * fg_seq_append instead. At every step (after every chunk):
 *   - the kept position set of every head equals the simulator's;
 *   - the attention output equals dense attention over exactly that set
 *     plus the new token (NMSE in double);
 *   - the bytes a head that shares no page holds equal its kept rows
 *     rounded up to pages, and all heads together (the fork's sharing
 *     pages) hold no more than that sum.
 * Eviction ties closer than fp32 can call (relative 1e-4) are resolved by
 * adopting the library's choice, and counted.
 */
#include <string.h>

#include "fastgen.h"
#include "tests/support/harness.h"
#include "tests/support/sim.h"

static int32_t g_steps = 300; /* --steps N: fewer where each step is slow (emulated GPU kernels) */

static const char *g_backend = "ref";

/* A simulated sequence's rows at position p (query of every head, key and value of every KV head). */
static void rows_at(const sim_seq *s, const run_cfg *rc, int32_t p, float *q, float *k, float *v) {
    const size_t row_q = (size_t)rc->G * rc->Hkv * rc->d, row_k = (size_t)rc->Hkv * rc->d;
    memcpy(q, s->q + (size_t)p * row_q, row_q * sizeof(float));
    memcpy(k, s->k + (size_t)p * row_k, row_k * sizeof(float));
    memcpy(v, s->v + (size_t)p * row_k, row_k * sizeof(float));
}

/* Adds the squared error of n output rows against their double reference. */
static void add_error(const float *out, const double *ref, size_t n, double *num, double *den) {
    for (size_t i = 0; i < n; i++) {
        *num += (out[i] - ref[i]) * (out[i] - ref[i]);
        *den += ref[i] * ref[i];
        if (!isfinite(out[i]))
            *num = INFINITY;
    }
}

/* Sequences A and B (policies cpa, cpb) decode together; at FORK_AT, C forks
 * from A (its pages shared) and goes on with tokens of its own; every so
 * often B takes a chunk of tokens by fg_seq_append instead of a decode. */
#define FORK_AT (g_steps / 3)
static void run_trio(const run_cfg *rc, const fg_compression_params *cpa, const fg_compression_params *cpb,
                     const char *name) {
    enum { A, B, C, N_SEQ };
    fg_token_classes *tc = sim_classes();
    const int32_t Hq = rc->G * rc->Hkv, d = rc->d;
    fg_context_params params;
    fg_context_params_default(&params);
    params.backend = g_backend;
    params.n_layers = 1;
    params.n_q_heads = Hq;
    params.n_kv_heads = rc->Hkv;
    params.head_dim = d;
    params.kv_dtype = rc->dtype;
    params.max_seqs = N_SEQ;
    params.max_seq_len = MAXT;
    params.page_tokens = rc->page_tokens;
    params.pool_chunk_pages = 3;
    params.classes = tc;
    fg_context *ctx = NULL;
    EXPECT_OK(NULL, fg_context_create(&params, &ctx));

    static sim_seq seqs[N_SEQ];
    make_seq(&seqs[A], rc, cpa);
    make_seq(&seqs[B], rc, cpb);
    make_seq(&seqs[C], rc, cpa); /* its own rows after the fork; before it, A's */
    int32_t len[N_SEQ] = {0}, live[N_SEQ] = {1, 1, 0}, appends = 0, appended = 0;
    float *out = malloc((size_t)MAXT * Hq * d * sizeof(float));
    for (int b = A; b <= B; b++) {
        sim_seq *s = &seqs[b];
        EXPECT_OK(ctx, fg_seq_create(ctx, &s->cp, s->tokens, s->n, &s->id));
        EXPECT_OK(ctx, fg_prefill(ctx, s->id, 0, s->q, s->k, s->v, out));
        sim_init(ctx, s, rc);
        len[b] = s->n;
    }

    const size_t row_q = (size_t)Hq * d, row_k = (size_t)rc->Hkv * d;
    enum { CHUNK = 8 };
    float *bq = malloc(CHUNK * row_q * sizeof(float)), *bk = malloc(CHUNK * row_k * sizeof(float));
    float *bv = malloc(CHUNK * row_k * sizeof(float)), *bo = malloc(CHUNK * row_q * sizeof(float));
    double *ref = malloc(CHUNK * row_q * sizeof(double));
    const size_t row_bytes = 2 * (size_t)d * (rc->dtype == FG_DTYPE_F32 ? 4 : 2);
    int bad_bytes = 0, shared_steps = 0;
    size_t saved_bytes = 0;
    double worst_nmse = 0.0;
    for (int32_t step = 0; step < g_steps; step++) {
        if (step == FORK_AT) { /* C continues from A: A's rows and state so far, its own rows after */
            sim_seq *a = &seqs[A], *c = &seqs[C];
            const int32_t t = len[A];
            memcpy(c->q, a->q, (size_t)t * row_q * sizeof(float));
            memcpy(c->k, a->k, (size_t)t * row_k * sizeof(float));
            memcpy(c->v, a->v, (size_t)t * row_k * sizeof(float));
            memcpy(c->tokens, a->tokens, (size_t)t * sizeof a->tokens[0]);
            memcpy(c->cls, a->cls, (size_t)t);
            memcpy(c->heads, a->heads, sizeof a->heads);
            c->n = a->n;
            EXPECT_OK(ctx, fg_seq_fork(ctx, a->id, &c->id));
            len[C] = t;
            live[C] = 1;
        }
        /* B appends a chunk instead of decoding, now and then */
        const int32_t m = step % 29 == 13 ? rng_int(2, CHUNK) : 0;
        const int append = m > 0 && len[B] + m <= MAXT - (g_steps - step); /* room left for the decodes */
        if (append) {
            sim_seq *s = &seqs[B];
            for (int32_t i = 0; i < m; i++)
                rows_at(s, rc, len[B] + i, bq + i * row_q, bk + i * row_k, bv + i * row_k);
            EXPECT_OK(ctx, fg_seq_append(ctx, s->id, 0, s->tokens + len[B], m, bq, bk, bv, bo));
            memset(ref, 0, (size_t)m * row_q * sizeof(double));
            for (int32_t i = 0; i < m; i++)
                sim_steps(s, rc, len[B] + i, ref + i * row_q);
            len[B] += m;
            for (int32_t g = 0; g < rc->Hkv; g++)
                compare_sets(ctx, s, g, len[B], name);
            double num = 0.0, den = 0.0;
            add_error(bo, ref, (size_t)m * row_q, &num, &den);
            worst_nmse = fmax(worst_nmse, num / den);
            appends++;
            appended += m;
        }
        /* one batched decode of the others (and of B unless it appended) */
        int32_t ids[N_SEQ], toks[N_SEQ], who[N_SEQ], n = 0;
        for (int b = 0; b < N_SEQ; b++) {
            if (!live[b] || (b == B && append))
                continue;
            ids[n] = seqs[b].id;
            toks[n] = seqs[b].tokens[len[b]];
            rows_at(&seqs[b], rc, len[b], bq + n * row_q, bk + n * row_k, bv + n * row_k);
            who[n++] = b;
        }
        EXPECT_OK(ctx, fg_decode(ctx, 0, n, ids, toks, bq, bk, bv, bo));
        memset(ref, 0, (size_t)n * row_q * sizeof(double));
        size_t alone = 0; /* what every head would hold on its own: its kept rows rounded up to pages */
        for (int i = 0; i < n; i++) {
            sim_seq *s = &seqs[who[i]];
            const int32_t p = len[who[i]]++;
            sim_steps(s, rc, p, ref + i * row_q);
            for (int32_t g = 0; g < rc->Hkv; g++) {
                compare_sets(ctx, s, g, p + 1, name);
                fg_head_info info;
                EXPECT_OK(ctx, fg_head_inspect(ctx, s->id, 0, g, &info));
                const size_t pages = ((size_t)info.kept + rc->page_tokens - 1) / rc->page_tokens;
                bad_bytes += info.length != p + 1 ||
                             (info.kv_bytes_shared == 0 && info.kv_bytes_held != pages * rc->page_tokens * row_bytes);
                shared_steps += info.kv_bytes_shared > 0;
            }
        }
        /* heads that share pages (A and its fork C) hold, all together, no more than apart */
        for (int b = 0; b < N_SEQ; b++)
            for (int32_t g = 0; live[b] && g < rc->Hkv; g++) {
                fg_head_info info;
                EXPECT_OK(ctx, fg_head_inspect(ctx, seqs[b].id, 0, g, &info));
                alone += ((size_t)info.kept + rc->page_tokens - 1) / rc->page_tokens * rc->page_tokens * row_bytes;
            }
        fg_memory_stats all;
        EXPECT_OK(ctx, fg_memory(ctx, -1, &all));
        bad_bytes += all.kv_bytes_held > alone;
        if (all.kv_bytes_held <= alone && alone - all.kv_bytes_held > saved_bytes)
            saved_bytes = alone - all.kv_bytes_held;
        double num = 0.0, den = 0.0;
        add_error(bo, ref, (size_t)n * row_q, &num, &den);
        worst_nmse = fmax(worst_nmse, num / den);
    }
    /* the library quantises the new row only after attending it, like the simulator */
    EXPECT(worst_nmse <= 1e-9, "%s: attention NMSE %.3g vs dense over the kept set", name, worst_nmse);
    EXPECT(bad_bytes == 0, "%s: %d steps where a head sharing nothing held other than its kept rows rounded up to "
           "pages, or the heads together more than apart", name, bad_bytes);
    EXPECT(appends > 0 && live[C], "%s: the run appended %d times and forked %d", name, (int)appends, live[C]);
    printf("  %-34s G=%d Hkv=%d d=%-3d %s page=%d  NMSE %.2e  %d appends (%d tokens)  %d head-steps shared, "
           "at most %zu B saved\n", name, (int)rc->G, (int)rc->Hkv, (int)d,
           rc->dtype == FG_DTYPE_F32 ? "f32 " : rc->dtype == FG_DTYPE_F16 ? "f16 " : "bf16", (int)rc->page_tokens,
           worst_nmse, (int)appends, (int)appended, shared_steps, saved_bytes);
    for (int b = 0; b < N_SEQ; b++) {
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

/* A peer method's preset with its ratios (or a token cap on its frequent part). */
static fg_compression_params preset(const char *name, float rl, float rf) {
    fg_compression_params cp;
    fg_compression_params_preset(name, &cp);
    cp.shortlist[0].ratio_local = rl;
    cp.shortlist[0].ratio_frequent = rf;
    return cp;
}

static fg_compression_params preset_tokens(const char *name, int32_t frequent_tokens) {
    fg_compression_params cp = preset(name, 0.0f, 1.0f);
    cp.shortlist[0].frequent_tokens = frequent_tokens;
    return cp;
}

/* The adaptive mode, compressed at the prefill (over its last 8 rows): then each head decodes on at its own
 * family and ratios. */
static fg_compression_params adaptive(float budget) {
    fg_compression_params cp;
    fg_compression_params_preset("fastgen-adaptive", &cp);
    cp.budget = budget;
    cp.observation_window = 8;
    cp.defer_until = 0;
    return cp;
}

int main(int argc, char **argv) {
    test_seed("test_lockstep");
    const char *dflt[] = {"ref", "cpu"};
    if (argc > 2 && !strcmp(argv[1], "--steps")) {
        g_steps = atoi(argv[2]);
        EXPECT(g_steps >= 30 && g_steps <= 300, "--steps takes 30 to 300, got %s", argv[2]);
        if (g_steps < 30 || g_steps > 300)
            return test_finish();
        argc -= 2;
        argv += 2;
    }
    const char **names = argc > 1 ? (const char **)argv + 1 : dflt;
    const int n_backends = argc > 1 ? argc - 1 : 2;
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
        {"snapkv", preset("snapkv", 0.125f, 0.25f)},
        {"adakv", preset("adakv", 0.25f, 0.125f)},
        {"tova", preset("tova", 0.0f, 0.25f)},
        {"tova tokens 12", preset_tokens("tova", 12)},
        {"special+snapshot+local last", one_entry(S | FG_KEEP_SNAPSHOT | L, 0.125f, 0.125f, 0, 0, FG_SCORE_LAST, 1)},
        {"fastgen-adaptive 0.3", adaptive(0.3f)},
        {"fastgen-adaptive 0.6", adaptive(0.6f)},
    };
    const int n_cfg = (int)(sizeof cfg / sizeof cfg[0]);
    int ran = 0;
    for (int k = 0; k < n_backends; k++) {
        g_backend = names[k];
        if (fg_backend_probe(g_backend) != FG_OK) {
            printf("%s: not tested: %s\n", g_backend, fg_last_error(NULL));
            EXPECT(!test_backend_required(), "backend %s is required here", g_backend);
            continue;
        }
        int run = 0;
        g_ties = 0;
        for (int32_t G = 1; G <= 4; G *= 2) {
            for (int i = 0; i < n_cfg; i++, run++) {
                run_cfg rc = {G, rng_int(1, 2), rng_int(0, 1) ? 8 : 16, rng_int(1, 6), (fg_dtype)(run % 3)};
                char name[96];
                snprintf(name, sizeof name, "%s | %s", cfg[i].name, cfg[(i + 1) % n_cfg].name);
                run_trio(&rc, &cfg[i].cp, &cfg[(i + 1) % n_cfg].cp, name);
            }
        }
        printf("%s: %d runs of %d steps (2 sequences, a third forked, chunks appended); %d fp32 eviction near-ties "
               "adopted\n", g_backend, run, (int)g_steps, g_ties);
        ran++;
    }
    if (ran == 0 && !test_backend_required())
        return 77;
    return test_finish();
}
