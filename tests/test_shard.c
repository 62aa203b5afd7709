/*
 * Tensor parallelism: an engine that shards attention gives each rank a
 * context for the KV heads it owns (and their query heads). Two contexts of
 * 2 KV heads each against one of 4: for the paper's mode and every fixed
 * policy the outputs, each head's policy and its kept positions are the same
 * bit for bit, through the prompt and the decode steps. The modes that share
 * a budget across heads (fastgen-budget, adakv: per layer; fastgen-adaptive:
 * across layers too) share it within a rank: each rank keeps at most the
 * budget's share of its own heads' rows, so the ranks together keep at most
 * the budget, but the split between the ranks is not the unsharded one.
 * Usage: test_shard [BACKEND...]   (default: ref cpu)
 */
#include <string.h>

#include "fastgen.h"
#include "tests/support/harness.h"
#include "tools/synth.h"

enum { L = 2, HKV = 4, G = 2, HQ = G * HKV, D = 32, N = 160, STEPS = 24, RANKS = 2, RKV = HKV / RANKS };
enum { RQ = RKV * G, MAXLEN = N + STEPS };

typedef struct shard_run {
    fg_context *ctx;
    int32_t seq;
    int32_t kv0, n_kv; /* the KV heads it owns */
} shard_run;

static void open_run(const char *backend, const synth *syn, const fg_compression_params *cp, int32_t kv0,
                     int32_t n_kv, shard_run *r) {
    fg_context_params p = test_context_params(backend, L, n_kv * G, n_kv, D);
    p.max_seqs = 1;
    p.max_seq_len = MAXLEN;
    p.classes = syn->classes;
    r->ctx = NULL;
    r->kv0 = kv0;
    r->n_kv = n_kv;
    EXPECT_OK(NULL, fg_context_create(&p, &r->ctx));
    if (r->ctx)
        EXPECT_OK(r->ctx, fg_context_set_compression(r->ctx, cp));
}

/* The rows of heads [h0, h0 + nh) of x[n][H][D], packed into out[n][nh][D]. */
static void slice(const float *x, int32_t n, int32_t H, int32_t h0, int32_t nh, float *out) {
    for (int32_t i = 0; i < n; i++)
        memcpy(out + (size_t)i * nh * D, x + ((size_t)i * H + h0) * D, (size_t)nh * D * sizeof *x);
}

/* Prefill and decode of the whole model (one run) and of its shards; returns
 * whether the outputs agree bit for bit (sharded == whole). */
static int compare(const char *backend, const synth *syn, const char *preset, shard_run *whole,
                   shard_run shard[RANKS], const int32_t *tokens) {
    fg_compression_params cp;
    EXPECT_OK(NULL, fg_compression_params_preset(preset, &cp));
    open_run(backend, syn, &cp, 0, HKV, whole);
    for (int r = 0; r < RANKS; r++)
        open_run(backend, syn, &cp, r * RKV, RKV, &shard[r]);
    static float q[MAXLEN * HQ * D], k[MAXLEN * HKV * D], v[MAXLEN * HKV * D], out[MAXLEN * HQ * D];
    static float rq[MAXLEN * RQ * D], rk[MAXLEN * RKV * D], rv[MAXLEN * RKV * D], rout[MAXLEN * RQ * D],
        want[MAXLEN * RQ * D];
    int same = 1;
    EXPECT_OK(whole->ctx, fg_seq_create(whole->ctx, NULL, tokens, N, &whole->seq));
    for (int r = 0; r < RANKS; r++)
        EXPECT_OK(shard[r].ctx, fg_seq_create(shard[r].ctx, NULL, tokens, N, &shard[r].seq));
    for (int32_t step = -1; step < STEPS; step++) { /* -1: the prompt */
        const int32_t pos = step < 0 ? 0 : N + step, n = step < 0 ? N : 1;
        for (int32_t l = 0; l < L; l++) {
            synth_qkv(syn, l, tokens + pos, pos, n, q, k, v);
            EXPECT_OK(whole->ctx, step < 0 ? fg_prefill(whole->ctx, whole->seq, l, q, k, v, out)
                                           : fg_decode(whole->ctx, l, 1, &whole->seq, &tokens[pos], q, k, v, out));
            for (int r = 0; r < RANKS; r++) {
                shard_run *s = &shard[r];
                slice(q, n, HQ, s->kv0 * G, RQ, rq);
                slice(k, n, HKV, s->kv0, RKV, rk);
                slice(v, n, HKV, s->kv0, RKV, rv);
                EXPECT_OK(s->ctx, step < 0 ? fg_prefill(s->ctx, s->seq, l, rq, rk, rv, rout)
                                           : fg_decode(s->ctx, l, 1, &s->seq, &tokens[pos], rq, rk, rv, rout));
                slice(out, n, HQ, s->kv0 * G, RQ, want);
                same &= memcmp(rout, want, (size_t)n * RQ * D * sizeof *rout) == 0;
            }
        }
    }
    return same;
}

static void close_runs(shard_run *whole, shard_run shard[RANKS]) {
    fg_context_destroy(&whole->ctx);
    for (int r = 0; r < RANKS; r++)
        fg_context_destroy(&shard[r].ctx);
}

static void run(const char *backend) {
    synth syn;
    EXPECT_OK(NULL, synth_create(L, HQ, HKV, D, 11, &syn));
    int32_t tokens[MAXLEN];
    for (int32_t t = 0; t < MAXLEN; t++)
        tokens[t] = synth_token(&syn, t);

    /* the paper's mode and every fixed policy: the shards are the whole, bit for bit */
    const char *per_head[] = {"fastgen", "full", "streamingllm", "h2o", "local", "frequent", "snapkv"};
    for (size_t p = 0; p < sizeof per_head / sizeof per_head[0]; p++) {
        shard_run whole, shard[RANKS];
        const int same = compare(backend, &syn, per_head[p], &whole, shard, tokens);
        EXPECT(same, "%s %s: the shards' outputs differ from the whole model's", backend, per_head[p]);
        int heads_same = 1;
        for (int r = 0; r < RANKS; r++)
            for (int32_t l = 0; l < L; l++)
                for (int32_t g = 0; g < RKV; g++) {
                    fg_head_info a, b;
                    int32_t pa[MAXLEN], pb[MAXLEN], na = -1, nb = -2;
                    EXPECT_OK(whole.ctx, fg_head_inspect(whole.ctx, whole.seq, l, shard[r].kv0 + g, &a));
                    EXPECT_OK(shard[r].ctx, fg_head_inspect(shard[r].ctx, shard[r].seq, l, g, &b));
                    EXPECT_OK(whole.ctx, fg_head_positions(whole.ctx, whole.seq, l, shard[r].kv0 + g, pa, MAXLEN, &na));
                    EXPECT_OK(shard[r].ctx, fg_head_positions(shard[r].ctx, shard[r].seq, l, g, pb, MAXLEN, &nb));
                    heads_same &= a.policy_index == b.policy_index && a.components == b.components && na == nb &&
                                  !memcmp(pa, pb, (size_t)na * sizeof *pa) &&
                                  !memcmp(a.recovery, b.recovery, sizeof a.recovery);
                }
        EXPECT(heads_same, "%s %s: a shard's head chose another policy or keeps other rows", backend, per_head[p]);
        close_runs(&whole, shard);
    }

    /* budgets shared across heads: each rank keeps at most the budget's share of its own rows */
    const char *shared[] = {"fastgen-budget", "adakv", "fastgen-adaptive"};
    for (size_t p = 0; p < sizeof shared / sizeof shared[0]; p++) {
        shard_run whole, shard[RANKS];
        compare(backend, &syn, shared[p], &whole, shard, tokens);
        fg_compression_params cp;
        fg_compression_params_preset(shared[p], &cp);
        int64_t kept_all = 0, full_all = 0;
        for (int r = 0; r < RANKS; r++) {
            fg_memory_stats m;
            EXPECT_OK(shard[r].ctx, fg_memory(shard[r].ctx, shard[r].seq, &m));
            /* the budget (adakv: its policy's share) holds at the prompt, within a row per head; each decode
               step adds one row per head */
            const float share = cp.budget > 0.0f ? cp.budget : cp.shortlist[0].ratio_local + cp.shortlist[0].ratio_frequent;
            const int64_t allowed = (int64_t)(share * (float)(N * L * RKV)) + (int64_t)(STEPS + 1) * L * RKV;
            EXPECT(m.rows_kept <= allowed, "%s %s rank %d: %lld rows kept, its budget allows %lld", backend,
                   shared[p], r, (long long)m.rows_kept, (long long)allowed);
            kept_all += m.rows_kept;
            full_all += m.rows_full;
        }
        fg_memory_stats w;
        EXPECT_OK(whole.ctx, fg_memory(whole.ctx, whole.seq, &w));
        EXPECT(full_all == w.rows_full && kept_all < full_all, "%s %s: the ranks keep %lld of %lld rows", backend,
               shared[p], (long long)kept_all, (long long)full_all);
        printf("  %-4s %-16s ranks keep %lld rows together, the whole model %lld (of %lld)\n", backend, shared[p],
               (long long)kept_all, (long long)w.rows_kept, (long long)full_all);
        close_runs(&whole, shard);
    }
    /* rows ranked over a layer's heads (tova, FG_ALLOC_LAYER): over a rank's heads, so within a rank every head
       keeps the same positions, and as many as the whole model's heads */
    {
        shard_run whole, shard[RANKS];
        compare(backend, &syn, "tova", &whole, shard, tokens);
        for (int r = 0; r < RANKS; r++)
            for (int32_t l = 0; l < L; l++) {
                int32_t p0[MAXLEN], n0 = -1, pw[MAXLEN], nw = -2;
                EXPECT_OK(shard[r].ctx, fg_head_positions(shard[r].ctx, shard[r].seq, l, 0, p0, MAXLEN, &n0));
                EXPECT_OK(whole.ctx, fg_head_positions(whole.ctx, whole.seq, l, 0, pw, MAXLEN, &nw));
                EXPECT(n0 == nw && n0 < MAXLEN, "%s tova rank %d layer %d: %d rows kept, the whole model %d", backend,
                       r, (int)l, (int)n0, (int)nw);
                for (int32_t g = 1; g < RKV; g++) {
                    int32_t pg[MAXLEN], ng = -1;
                    EXPECT_OK(shard[r].ctx, fg_head_positions(shard[r].ctx, shard[r].seq, l, g, pg, MAXLEN, &ng));
                    EXPECT(ng == n0 && !memcmp(pg, p0, (size_t)n0 * sizeof *pg),
                           "%s tova rank %d layer %d: head %d keeps other rows than head 0", backend, r, (int)l, (int)g);
                }
            }
        close_runs(&whole, shard);
    }
    printf("  %-4s sharded over %d ranks: fastgen and 6 fixed policies equal the whole model bit for bit; tova keeps "
           "one set of rows per rank and layer\n",
           backend, RANKS);
    synth_destroy(&syn);
}

int main(int argc, char **argv) {
    test_seed("test_shard");
    return test_each_backend(argc, argv, run);
}
