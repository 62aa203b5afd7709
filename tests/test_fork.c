/*
 * Fork with copy-on-write pages (fg_seq_fork): a sequence forked after its
 * prompt and decoded apart from its parent equals, bit for bit, a sequence
 * built independently from the same tokens (outputs, kept positions,
 * memory), for mixed policies (the paper's FastGen, H2O, full) and every
 * backend; a fork takes no page until one side writes; pages shared are
 * counted once; destroying either side leaves the other intact; the last
 * owner gives the pages back. Bad forks change nothing. Append: a chunk
 * equals its tokens decoded one by one; a refused chunk changes nothing.
 * Chunked prefill (fg_prefill_chunk): outputs, policies, kept rows and the
 * decode after it equal a one-shot prefill bit for bit (on cpu, chunks that
 * do not end on multiples of 64 rows within 1e-10 NMSE); chunks out of order,
 * past the prompt, or over a layer in progress are refused.
 * Usage: test_fork [BACKEND...]   (default: ref cpu)
 */
#include <math.h>
#include <string.h>

#include "fastgen.h"
#include "tests/support/harness.h"
#include "tools/synth.h"

enum { L = 2, HKV = 4, G = 2, HQ = G * HKV, D = 32, N = 48, STEPS = 30, MAXLEN = N + STEPS };

typedef struct world {
    synth syn;
    fg_context *ctx;
    int32_t tokens[3][MAXLEN]; /* the prompt, then continuation a, then continuation b */
} world;

static void prefill(world *w, int32_t seq) {
    static float q[N * HQ * D], k[N * HKV * D], v[N * HKV * D], out[N * HQ * D];
    for (int32_t l = 0; l < L; l++) {
        synth_qkv(&w->syn, l, w->tokens[0], 0, N, q, k, v);
        EXPECT_OK(w->ctx, fg_prefill(w->ctx, seq, l, q, k, v, out));
    }
}

/* One decode step of seqs[i] with continuation conts[i]; outputs to out. */
static void step(world *w, int32_t n, const int32_t *seqs, const int *conts, int32_t pos, float *out) {
    float q[3 * HQ * D], k[3 * HKV * D], v[3 * HKV * D];
    int32_t toks[3];
    for (int32_t l = 0; l < L; l++) {
        for (int32_t i = 0; i < n; i++) {
            toks[i] = w->tokens[conts[i]][pos];
            synth_qkv(&w->syn, l, &toks[i], pos, 1, q + i * HQ * D, k + i * HKV * D, v + i * HKV * D);
            /* the continuations differ in their values too, not only in their tokens */
            for (int32_t x = 0; x < HQ * D; x++)
                q[i * HQ * D + x] += 0.25f * (float)conts[i];
        }
        EXPECT_OK(w->ctx, fg_decode(w->ctx, l, n, seqs, toks, q, k, v, out + (size_t)l * n * HQ * D));
    }
}

/* The world's context: L layers of HQ / HKV heads of D, on `backend`. */
static void open_context(world *w, const char *backend, fg_dtype dtype, int32_t max_seqs, int32_t max_len,
                         int32_t page_tokens) {
    fg_context_params p = test_context_params(backend, L, HQ, HKV, D);
    p.kv_dtype = dtype;
    p.max_seqs = max_seqs;
    p.max_seq_len = max_len;
    p.page_tokens = page_tokens;
    p.classes = w->syn.classes;
    w->ctx = NULL;
    EXPECT_OK(NULL, fg_context_create(&p, &w->ctx));
}

static int same_heads(fg_context *ctx, int32_t a, int32_t b) {
    for (int32_t l = 0; l < L; l++)
        for (int32_t g = 0; g < HKV; g++) {
            enum { CAP = 1024 }; /* the longest sequence of these tests */
            int32_t pa[CAP], pb[CAP], na = -1, nb = -2;
            if (fg_head_positions(ctx, a, l, g, pa, CAP, &na) || fg_head_positions(ctx, b, l, g, pb, CAP, &nb) ||
                na != nb || memcmp(pa, pb, (size_t)na * sizeof *pa))
                return 0;
        }
    return 1;
}

/* The world of the fork tests: a prompt of N tokens shared by three
 * sequences' tokens, continuations 1 and 2 apart after it; f16 rows, 4
 * sequences, pages of 4. Returns whether its context opened. */
static int open_fork_world(world *w, const char *backend, uint64_t seed) {
    EXPECT_OK(NULL, synth_create(L, HQ, HKV, D, seed, &w->syn));
    for (int c = 0; c < 3; c++)
        for (int32_t t = 0; t < MAXLEN; t++)
            w->tokens[c][t] = t < N ? synth_token(&w->syn, t) : synth_token(&w->syn, t + 1000 * c);
    open_context(w, backend, FG_DTYPE_F16, 4, MAXLEN, 4);
    if (!w->ctx)
        synth_destroy(&w->syn);
    return w->ctx != NULL;
}

static void run(const char *backend, const char *policy) {
    world w;
    if (!open_fork_world(&w, backend, 3))
        return;
    fg_compression_params cp;
    EXPECT_OK(NULL, fg_compression_params_preset(policy, &cp));
    cp.shortlist[0].ratio_local = cp.n_policies == 1 ? 0.2f : cp.shortlist[0].ratio_local;
    cp.shortlist[0].ratio_frequent = cp.n_policies == 1 ? 0.2f : cp.shortlist[0].ratio_frequent;

    /* parent and fork, decoded apart (in one batch) with continuations 1 and 2 */
    int32_t parent, child, bad;
    EXPECT_OK(w.ctx, fg_seq_create(w.ctx, &cp, w.tokens[0], N, &parent));
    prefill(&w, parent);
    fg_memory_stats before, after;
    fg_memory(w.ctx, -1, &before);
    EXPECT_OK(w.ctx, fg_seq_fork(w.ctx, parent, &child));
    fg_memory(w.ctx, -1, &after);
    EXPECT(after.pages_in_use == before.pages_in_use && after.kv_bytes_held == before.kv_bytes_held,
           "%s %s: a fork took pages (%lld -> %lld)", backend, policy, (long long)before.pages_in_use,
           (long long)after.pages_in_use);
    EXPECT(same_heads(w.ctx, parent, child), "%s %s: a fork keeps its parent's rows", backend, policy);
    static float out_pair[STEPS][L * 2 * HQ * D], out_alone[STEPS][L * 2 * HQ * D];
    const int32_t pair[2] = {parent, child};
    const int conts[2] = {1, 2};
    for (int32_t s = 0; s < STEPS; s++)
        step(&w, 2, pair, conts, N + s, out_pair[s]);
    fg_memory_stats forked;
    fg_memory(w.ctx, -1, &forked);

    /* the same two sequences built independently, each prefilled and decoded alone */
    int32_t alone[2];
    for (int i = 0; i < 2; i++) {
        EXPECT_OK(w.ctx, fg_seq_create(w.ctx, &cp, w.tokens[0], N, &alone[i]));
        prefill(&w, alone[i]);
    }
    for (int32_t s = 0; s < STEPS; s++)
        step(&w, 2, alone, conts, N + s, out_alone[s]);
    EXPECT(memcmp(out_pair, out_alone, sizeof out_pair) == 0, "%s %s: fork outputs differ from independent ones",
           backend, policy);
    EXPECT(same_heads(w.ctx, parent, alone[0]) && same_heads(w.ctx, child, alone[1]),
           "%s %s: fork kept sets differ from independent ones", backend, policy);
    fg_memory_stats all;
    fg_memory(w.ctx, -1, &all);
    const int64_t independent = all.pages_in_use - forked.pages_in_use;
    EXPECT(forked.pages_in_use <= independent, "%s %s: the fork pair holds %lld pages, two separate ones %lld",
           backend, policy, (long long)forked.pages_in_use, (long long)independent);
    printf("  %-4s %-8s after %d steps: parent + fork hold %lld pages, two independent sequences %lld\n", backend,
           policy, STEPS, (long long)forked.pages_in_use, (long long)independent);

    /* bad forks change nothing */
    EXPECT_STATUS(w.ctx, FG_ERR_CAPACITY, fg_seq_fork(w.ctx, parent, &bad)); /* 4 of 4 in use */
    EXPECT_OK(w.ctx, fg_seq_destroy(w.ctx, alone[1]));
    EXPECT_STATUS(w.ctx, FG_ERR_INVALID_ARGUMENT, fg_seq_fork(w.ctx, alone[1], &bad)); /* destroyed */
    EXPECT_STATUS(w.ctx, FG_ERR_INVALID_ARGUMENT, fg_seq_fork(w.ctx, parent, NULL));
    float q[HQ * D] = {0}, k[HKV * D] = {0}, v[HKV * D] = {0}, o[HQ * D];
    int32_t tok = w.tokens[1][N + STEPS - 1];
    /* a fork between layer 0 and layer 1 of a step: refused */
    int32_t mid;
    EXPECT_OK(w.ctx, fg_seq_create(w.ctx, &cp, w.tokens[0], N, &mid));
    prefill(&w, mid);
    EXPECT_OK(w.ctx, fg_decode(w.ctx, 0, 1, &mid, &tok, q, k, v, o));
    fg_memory_stats m0, m1;
    fg_memory(w.ctx, -1, &m0);
    EXPECT_OK(w.ctx, fg_seq_destroy(w.ctx, alone[0]));
    EXPECT_STATUS(w.ctx, FG_ERR_BAD_STATE, fg_seq_fork(w.ctx, mid, &bad));
    fg_memory(w.ctx, -1, &m1);
    EXPECT(m1.pages_in_use < m0.pages_in_use, "destroying a sequence frees its own pages");

    /* either side alone: the parent goes, the fork decodes on as before */
    EXPECT_OK(w.ctx, fg_seq_destroy(w.ctx, parent));
    EXPECT_OK(w.ctx, fg_seq_destroy(w.ctx, mid));
    int32_t again;
    EXPECT_OK(w.ctx, fg_seq_fork(w.ctx, child, &again));
    EXPECT(same_heads(w.ctx, again, child), "%s %s: a fork of a fork keeps its rows", backend, policy);
    /* its kept positions, read from its pages again once its parent is gone */
    static int32_t kept_before[L * HKV][MAXLEN];
    int32_t n_before[L * HKV];
    for (int32_t i = 0; i < L * HKV; i++)
        EXPECT_OK(w.ctx, fg_head_positions(w.ctx, child, i / HKV, i % HKV, kept_before[i], MAXLEN, &n_before[i]));
    EXPECT_OK(w.ctx, fg_seq_destroy(w.ctx, child));
    for (int32_t i = 0; i < L * HKV; i++) {
        int32_t pos[MAXLEN], n_pos = -1;
        EXPECT(fg_head_positions(w.ctx, again, i / HKV, i % HKV, pos, MAXLEN, &n_pos) == FG_OK &&
                   n_pos == n_before[i] && !memcmp(pos, kept_before[i], (size_t)n_pos * sizeof *pos),
               "%s %s: the fork of a fork lost rows when its parent went", backend, policy);
    }
    EXPECT_OK(w.ctx, fg_seq_destroy(w.ctx, again));
    fg_memory_stats end;
    fg_memory(w.ctx, -1, &end);
    EXPECT(end.pages_in_use == 0 && end.kv_bytes_held == 0, "%s %s: %lld pages left after the last owner went",
           backend, policy, (long long)end.pages_in_use);
    fg_context_destroy(&w.ctx);
    synth_destroy(&w.syn);
}

/* Append (fg_seq_append): a chunk of tokens per layer equals the same tokens
 * decoded one at a time, bit for bit, and a refused chunk (a bad token in
 * its middle, past max_seq_len, a destroyed sequence) changes nothing. */
static void test_append(const char *backend) {
    enum { CHUNK = 20, AFTER = 6 };
    world w;
    EXPECT_OK(NULL, synth_create(L, HQ, HKV, D, 9, &w.syn));
    for (int c = 0; c < 3; c++)
        for (int32_t t = 0; t < MAXLEN; t++)
            w.tokens[c][t] = synth_token(&w.syn, t);
    open_context(&w, backend, FG_DTYPE_BF16, 3, N + CHUNK + AFTER, 8);
    if (!w.ctx)
        return;
    int32_t a, b;
    EXPECT_OK(w.ctx, fg_seq_create(w.ctx, NULL, w.tokens[0], N, &a));
    EXPECT_OK(w.ctx, fg_seq_create(w.ctx, NULL, w.tokens[0], N, &b));
    prefill(&w, a);
    prefill(&w, b);
    static float q[CHUNK * HQ * D], k[CHUNK * HKV * D], v[CHUNK * HKV * D];
    static float out_a[L][CHUNK * HQ * D], out_b[L][CHUNK * HQ * D];
    /* a refused chunk: its 11th token is outside the vocabulary */
    fg_memory_stats m0, m1;
    fg_memory(w.ctx, -1, &m0);
    int32_t bad_chunk[CHUNK];
    memcpy(bad_chunk, &w.tokens[0][N], sizeof bad_chunk);
    bad_chunk[10] = SYNTH_VOCAB + 5;
    synth_qkv(&w.syn, 0, &w.tokens[0][N], N, CHUNK, q, k, v);
    EXPECT_STATUS(w.ctx, FG_ERR_INVALID_ARGUMENT, fg_seq_append(w.ctx, a, 0, bad_chunk, CHUNK, q, k, v, out_a[0]));
    fg_memory(w.ctx, -1, &m1);
    int32_t len = -1;
    EXPECT(fg_seq_length(w.ctx, a, 0, &len) == FG_OK && len == N && m1.pages_in_use == m0.pages_in_use &&
               same_heads(w.ctx, a, b),
           "%s: a refused chunk changed the sequence (length %d)", backend, (int)len);
    EXPECT_STATUS(w.ctx, FG_ERR_CAPACITY, fg_seq_append(w.ctx, a, 0, &w.tokens[0][N], CHUNK + AFTER + 1, q, k, v,
                                                         out_a[0]));
    /* a: the chunk, layer by layer; b: the same tokens, decoded one at a time */
    for (int32_t l = 0; l < L; l++) {
        synth_qkv(&w.syn, l, &w.tokens[0][N], N, CHUNK, q, k, v);
        EXPECT_OK(w.ctx, fg_seq_append(w.ctx, a, l, &w.tokens[0][N], CHUNK, q, k, v, out_a[l]));
    }
    for (int32_t i = 0; i < CHUNK; i++)
        for (int32_t l = 0; l < L; l++) {
            float q1[HQ * D], k1[HKV * D], v1[HKV * D];
            synth_qkv(&w.syn, l, &w.tokens[0][N + i], N + i, 1, q1, k1, v1);
            EXPECT_OK(w.ctx, fg_decode(w.ctx, l, 1, &b, &w.tokens[0][N + i], q1, k1, v1, out_b[l] + i * HQ * D));
        }
    EXPECT(memcmp(out_a, out_b, sizeof out_a) == 0 && same_heads(w.ctx, a, b),
           "%s: appending a chunk differs from decoding it token by token", backend);
    /* and they go on alike */
    static float oa[AFTER][L * HQ * D], ob[AFTER][L * HQ * D];
    const int cont[1] = {0};
    for (int32_t s = 0; s < AFTER; s++) {
        step(&w, 1, &a, cont, N + CHUNK + s, oa[s]);
        step(&w, 1, &b, cont, N + CHUNK + s, ob[s]);
    }
    EXPECT(memcmp(oa, ob, sizeof oa) == 0 && same_heads(w.ctx, a, b), "%s: decoding after an append differs",
           backend);
    EXPECT_OK(w.ctx, fg_seq_destroy(w.ctx, a));
    EXPECT_STATUS(w.ctx, FG_ERR_INVALID_ARGUMENT, fg_seq_append(w.ctx, a, 0, w.tokens[0], 1, q, k, v, out_a[0]));
    int32_t fresh;
    EXPECT_OK(w.ctx, fg_seq_create(w.ctx, NULL, w.tokens[0], N, &fresh));
    EXPECT_STATUS(w.ctx, FG_ERR_BAD_STATE, fg_seq_append(w.ctx, fresh, 0, w.tokens[0], 1, q, k, v, out_a[0]));
    printf("  %-4s append: a chunk of %d tokens = %d decode steps, bit for bit; refused chunks change nothing\n",
           backend, CHUNK, CHUNK);
    fg_context_destroy(&w.ctx);
    synth_destroy(&w.syn);
}

/* Chunked prefill against one-shot: sequence a prefilled at once, b in
 * chunks that end on multiples of 64 rows, c in chunks that do not. */
static void test_chunked(const char *backend) {
    enum { NC = 300, AFTER = 8, LEN = NC + AFTER };
    static const int32_t plan_b[] = {64, 128, 108}, plan_c[] = {1, 36, 100, 163};
    world w;
    EXPECT_OK(NULL, synth_create(L, HQ, HKV, D, 11, &w.syn));
    open_context(&w, backend, FG_DTYPE_F16, 3, LEN, 16);
    if (!w.ctx)
        return;
    static int32_t tokens[LEN];
    for (int32_t t = 0; t < LEN; t++)
        tokens[t] = synth_token(&w.syn, t);
    int32_t a, b, c;
    EXPECT_OK(w.ctx, fg_seq_create(w.ctx, NULL, tokens, NC, &a));
    EXPECT_OK(w.ctx, fg_seq_create(w.ctx, NULL, tokens, NC, &b));
    EXPECT_OK(w.ctx, fg_seq_create(w.ctx, NULL, tokens, NC, &c));
    static float q[NC * HQ * D], k[NC * HKV * D], v[NC * HKV * D];
    static float out_a[NC * HQ * D], out_b[NC * HQ * D], out_c[NC * HQ * D];
    double worst = 0.0;
    int bits_c = 1;
    for (int32_t l = 0; l < L; l++) {
        synth_qkv(&w.syn, l, tokens, 0, NC, q, k, v);
        EXPECT_OK(w.ctx, fg_prefill(w.ctx, a, l, q, k, v, out_a));
        for (int pass = 0; pass < 2; pass++) {
            const int32_t *plan = pass ? plan_c : plan_b, seq = pass ? c : b;
            const int n_chunks = pass ? 4 : 3;
            float *out = pass ? out_c : out_b;
            for (int32_t i = 0, at = 0; i < n_chunks; at += plan[i++]) {
                const int32_t m = plan[i];
                if (i == 1 && l == 0 && pass == 0) { /* wrong uses in the middle change nothing */
                    EXPECT_STATUS(w.ctx, FG_ERR_INVALID_ARGUMENT,
                                  fg_prefill_chunk(w.ctx, seq, l, at + 1, m, q, k, v, out));
                    EXPECT_STATUS(w.ctx, FG_ERR_INVALID_ARGUMENT,
                                  fg_prefill_chunk(w.ctx, seq, l, at, NC - at + 1, q, k, v, out));
                    EXPECT_STATUS(w.ctx, FG_ERR_BAD_STATE, fg_prefill(w.ctx, seq, l, q, k, v, out));
                    int32_t child;
                    EXPECT_STATUS(w.ctx, FG_ERR_BAD_STATE, fg_seq_fork(w.ctx, seq, &child));
                }
                EXPECT_OK(w.ctx, fg_prefill_chunk(w.ctx, seq, l, at, m, q + (size_t)at * HQ * D,
                                                  k + (size_t)at * HKV * D, v + (size_t)at * HKV * D,
                                                  out + (size_t)at * HQ * D));
            }
        }
        EXPECT(memcmp(out_a, out_b, sizeof out_a) == 0, "%s layer %d: chunks on 64-row ends differ from one-shot",
               backend, (int)l);
        double num = 0.0, den = 0.0;
        for (size_t i = 0; i < sizeof out_a / sizeof out_a[0]; i++) {
            num += ((double)out_c[i] - out_a[i]) * ((double)out_c[i] - out_a[i]);
            den += (double)out_a[i] * out_a[i];
        }
        worst = fmax(worst, num / den);
        bits_c &= memcmp(out_a, out_c, sizeof out_a) == 0;
    }
    const int cpu = strcmp(backend, "cpu") == 0;
    EXPECT(bits_c || (cpu && worst <= 1e-10), "%s: uneven chunks differ from one-shot (NMSE %.3g)", backend, worst);
    EXPECT(same_heads(w.ctx, a, b), "%s: kept rows after 64-row chunks differ from one-shot", backend);
    EXPECT(same_heads(w.ctx, a, c), "%s: kept rows after uneven chunks differ from one-shot", backend);
    for (int32_t g = 0; g < HKV; g++) {
        fg_head_info ia, ib;
        fg_head_inspect(w.ctx, a, 0, g, &ia);
        fg_head_inspect(w.ctx, b, 0, g, &ib);
        EXPECT(ia.policy_index == ib.policy_index && memcmp(ia.recovery, ib.recovery, sizeof ia.recovery) == 0,
               "%s head %d: chunked profile differs", backend, (int)g);
    }
    /* the layer is done: another chunk is refused */
    EXPECT_STATUS(w.ctx, FG_ERR_BAD_STATE, fg_prefill_chunk(w.ctx, b, 0, 0, 1, q, k, v, out_b));
    /* and they decode alike */
    static float oa[AFTER][L * HQ * D], ob[AFTER][L * HQ * D];
    for (int32_t s = 0; s < AFTER; s++)
        for (int32_t l = 0; l < L; l++) {
            float q1[HQ * D], k1[HKV * D], v1[HKV * D];
            synth_qkv(&w.syn, l, &tokens[NC + s], NC + s, 1, q1, k1, v1);
            EXPECT_OK(w.ctx, fg_decode(w.ctx, l, 1, &a, &tokens[NC + s], q1, k1, v1, oa[s] + l * HQ * D));
            EXPECT_OK(w.ctx, fg_decode(w.ctx, l, 1, &b, &tokens[NC + s], q1, k1, v1, ob[s] + l * HQ * D));
        }
    EXPECT(memcmp(oa, ob, sizeof oa) == 0 && same_heads(w.ctx, a, b), "%s: decoding after a chunked prefill differs",
           backend);
    /* a sequence destroyed in the middle of a chunked prefill gives everything back */
    int32_t d;
    EXPECT_OK(w.ctx, fg_seq_destroy(w.ctx, c));
    EXPECT_OK(w.ctx, fg_seq_create(w.ctx, NULL, tokens, NC, &d));
    EXPECT_OK(w.ctx, fg_prefill_chunk(w.ctx, d, 0, 0, 10, q, k, v, out_c));
    EXPECT_STATUS(w.ctx, FG_ERR_BAD_STATE, fg_seq_append(w.ctx, d, 1, tokens, 1, q, k, v, out_c));
    EXPECT_OK(w.ctx, fg_seq_destroy(w.ctx, d));
    printf("  %-4s chunked prefill: 64-row chunks = one-shot bit for bit; uneven chunks %s (NMSE %.1e)\n", backend,
           bits_c ? "bit for bit too" : "within rounding", worst);
    fg_context_destroy(&w.ctx);
    synth_destroy(&w.syn);
}

/* fg_memory(ctx, -1) of forks: held and full count shared pages alike, so a
 * full-policy sequence and its forks hold no more than their full cache (a
 * fork's own rows start a page of their own, its parent's fill its last
 * page: full caches that share whole pages hold as much or more); a fork of
 * a fork the same. When a fork that others share goes, its last page,
 * partly filled, stays with them, where full caches would share whole pages
 * only: a page per head more at most. A sequence not prefilled yet cannot
 * fork. */
static void test_fork_memory(const char *backend) {
    world w;
    if (!open_fork_world(&w, backend, 5))
        return;
    fg_compression_params full;
    EXPECT_OK(NULL, fg_compression_params_preset("full", &full));
    int32_t a, b, c, d, early;
    EXPECT_OK(w.ctx, fg_seq_create(w.ctx, &full, w.tokens[0], N, &early));
    EXPECT_STATUS(w.ctx, FG_ERR_BAD_STATE, fg_seq_fork(w.ctx, early, &b)); /* before its prefill */
    EXPECT(strstr(fg_last_error(w.ctx), "not prefilled") != NULL, "the message says why: %s", fg_last_error(w.ctx));
    EXPECT_OK(w.ctx, fg_seq_destroy(w.ctx, early));
    EXPECT_OK(w.ctx, fg_seq_create(w.ctx, &full, w.tokens[0], N, &a));
    prefill(&w, a);
    EXPECT_OK(w.ctx, fg_seq_fork(w.ctx, a, &b));
    static float out[L * 3 * HQ * D];
    for (int32_t t = 0; t < 9; t++) /* a and b apart for 9 steps, then b forks c */
        step(&w, 2, (int32_t[]){a, b}, (int[]){1, 2}, N + t, out);
    EXPECT_OK(w.ctx, fg_seq_fork(w.ctx, b, &c));
    EXPECT_OK(w.ctx, fg_seq_fork(w.ctx, b, &d));
    for (int32_t t = 9; t < 14; t++)
        step(&w, 3, (int32_t[]){a, c, d}, (int[]){1, 2, 1}, N + t, out);
    fg_head_info info;
    EXPECT_OK(w.ctx, fg_head_inspect(w.ctx, a, 0, 0, &info));
    const size_t page_kv = info.kv_bytes_full / (size_t)((info.length + 4) / 5); /* pages of 5 tokens */
    for (int round = 0; round < 3; round++) {
        fg_memory_stats m;
        EXPECT_OK(w.ctx, fg_memory(w.ctx, -1, &m));
        const size_t slack = round == 0 ? 0 : (size_t)L * HKV * page_kv;
        EXPECT(m.kv_bytes_held <= m.kv_bytes_full + slack && m.kv_bytes_held < m.kv_bytes_alone,
               "%s, round %d: full-policy forks hold %zu bytes of a full cache of %zu (%zu apart)", backend, round,
               m.kv_bytes_held, m.kv_bytes_full, m.kv_bytes_alone);
        /* b goes (c and d share its prefix with each other and with a), then a goes */
        EXPECT_OK(w.ctx, fg_seq_destroy(w.ctx, round == 0 ? b : round == 1 ? a : c));
    }
    fg_context_destroy(&w.ctx);
    synth_destroy(&w.syn);
}

static void run_all(const char *backend) {
    test_fork_memory(backend);
    for (int pol = 0; pol < 3; pol++)
        run(backend, (const char *[]){"fastgen", "h2o", "full"}[pol]);
    test_append(backend);
    test_chunked(backend);
}

int main(int argc, char **argv) {
    test_seed("test_fork");
    return test_each_backend(argc, argv, run_all);
}
