/*
 * libFuzzer target over the public API: the input is a program of calls —
 * create a sequence (a one-entry policy from a table, a prompt of 1..40
 * tokens), prefill it, decode a batch of sequences, fork one (its future
 * then differs), append a chunk to one, destroy one, trim, inspect, and bad
 * calls (unknown or destroyed sequences, duplicates in a
 * batch, tokens outside the vocabulary, layers out of range, NULL pointers,
 * decode before prefill or past max_seq_len, a second prefill, short
 * capacities). Each live sequence has the set simulator of the lockstep test
 * beside it (tests/support/sim.h): after every decode the kept positions of every
 * head and the attention output (dense over the simulator's set) must match,
 * and after every refused call nothing may have changed. An op byte of 250
 * or more is a hostile run instead: a context of its own, every preset, Q/K/V
 * holding NaN, infinities, 3.4e38, 1e20/1e30 and subnormals where the input
 * says; every call must return (libFuzzer's -timeout, and the replay's
 * alarm, fail a hang) with FG_OK or a message, no head may keep more rows
 * than its length, and every page must come back. Any mismatch aborts.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fastgen.h"
#define MAXT 72
#include "tests/support/harness.h"
#include "tests/support/sim.h"

#define VOCAB SIM_VOCAB
#define MAX_LEN 64
#define SEQS 3

typedef struct reader {
    const uint8_t *p;
    size_t n;
} reader;

static uint8_t next(reader *r) {
    if (!r->n)
        return 0;
    r->n--;
    return *r->p++;
}

typedef struct slot {
    int live, prefilled;
    int32_t len; /* tokens the library has for it */
    sim_seq sim;
} slot;

static const fg_policy k_policies[] = {
    {FG_KEEP_SPECIAL, 0.25f, 0.25f, 0, 0},
    {FG_KEEP_SPECIAL | FG_KEEP_PUNCT, 0.25f, 0.25f, 0, 0},
    {FG_KEEP_SPECIAL | FG_KEEP_PUNCT | FG_KEEP_FREQUENT, 0.25f, 0.3f, 0, 0},
    {FG_KEEP_SPECIAL | FG_KEEP_PUNCT | FG_KEEP_FREQUENT | FG_KEEP_LOCAL, 0.2f, 0.15f, 0, 0},
    {FG_KEEP_FULL, 0.3f, 0.3f, 0, 0},
    {FG_KEEP_FREQUENT | FG_KEEP_LOCAL, 0.125f, 0.125f, 0, 0},
    {FG_KEEP_LOCAL, 0.25f, 0.0f, 0, 0},
    {FG_KEEP_FREQUENT, 0.0f, 1.0f, 0, 5},
    {FG_KEEP_SPECIAL | FG_KEEP_LOCAL, 1.0f, 0.0f, 6, 0},
};

static void die_if_failed(const char *what) {
    if (g_fail) {
        fprintf(stderr, "fuzz_api: %s\n", what);
        abort();
    }
}

/* Every head of every prefilled sequence still matches its simulator. */
static void check_all(fg_context *ctx, slot *slots, const run_cfg *rc, const char *what) {
    for (int i = 0; i < SEQS; i++)
        if (slots[i].live && slots[i].prefilled)
            for (int32_t g = 0; g < rc->Hkv; g++)
                compare_sets(ctx, &slots[i].sim, g, slots[i].len, what);
    die_if_failed(what);
}

/* A call that must be refused with a message and change nothing. */
#define REFUSED(ctx, call, what)                                                                                       \
    do {                                                                                                               \
        fg_status st_ = (call);                                                                                        \
        EXPECT(st_ != FG_OK && fg_last_error(ctx)[0], "%s was accepted", what);                                        \
        check_all(ctx, slots, &rc, what);                                                                              \
    } while (0)

/* ---- hostile runs: no simulator (NaN has no reference), only the contracts */

static const char *const k_presets[] = {"fastgen", "fastgen-budget", "fastgen-adaptive", "full", "streamingllm",
                                        "h2o", "local", "frequent", "snapkv", "adakv", "tova"};
static const float k_hostile[] = {NAN, INFINITY, -INFINITY, 3.4e38f, -3.4e38f, 1e20f, 1e30f, -1e30f, 1e-45f, 1e-40f,
                                  0.0f, 65504.0f, 70000.0f};

#define HL 2   /* layers */
#define HMAX 64 /* positions: a prompt of 40, 7 steps, a chunk of 6 and a step beside the fork fit */

static void hostile_ok(fg_context *ctx, fg_status st, const char *what) {
    if (st != FG_OK && !fg_last_error(ctx)[0]) {
        fprintf(stderr, "fuzz_api: hostile %s failed with no message (%s)\n", what, fg_status_string(st));
        abort();
    }
}

static void hostile_run(reader *r, const run_cfg *rc, fg_token_classes *tc) {
    const int32_t Hq = rc->G * rc->Hkv, Hkv = rc->Hkv, d = rc->d;
    const char *preset = k_presets[next(r) % (sizeof k_presets / sizeof k_presets[0])];
    const uint8_t db = next(r);
    const fg_dtype dtype = (fg_dtype)(db % 5);
    const int32_t v_dtype = (db / 5) % 6 - 1; /* V as K (-1), or apart in one of the five */
    const int32_t n = 1 + next(r) % 40, steps = next(r) % 8, chunk = 1 + next(r) % 6;
    const size_t rq = (size_t)Hq * d, rk = (size_t)Hkv * d;
    float *q = malloc((size_t)HL * HMAX * rq * sizeof *q), *k = malloc((size_t)HL * HMAX * rk * sizeof *k);
    float *v = malloc((size_t)HL * HMAX * rk * sizeof *v), *out = malloc((size_t)HMAX * rq * sizeof *out);
    int32_t tokens[HMAX];
    for (int32_t p = 0; p < HMAX; p++)
        tokens[p] = rng_int(0, VOCAB - 1);
    for (size_t i = 0; i < (size_t)HL * HMAX * rq; i++)
        q[i] = 1.5f * rng_gauss();
    for (size_t i = 0; i < (size_t)HL * HMAX * rk; i++) {
        k[i] = 1.5f * rng_gauss();
        v[i] = rng_gauss();
    }
    for (int32_t poison = next(r) % 6; poison >= 0; poison--) { /* where the input says */
        const uint8_t where = next(r), which = next(r), val = next(r);
        const int32_t l = where & 1, p = (where >> 1) % HMAX;
        const float x = k_hostile[val % (sizeof k_hostile / sizeof k_hostile[0])];
        if (which % 3 == 0)
            q[((size_t)l * HMAX + p) * rq + which % rq] = x;
        else if (which % 3 == 1)
            k[((size_t)l * HMAX + p) * rk + which % rk] = x;
        else
            v[((size_t)l * HMAX + p) * rk + which % rk] = x;
    }
    fg_context_params params;
    fg_context_params_default(&params);
    params.backend = "ref";
    params.n_layers = HL;
    params.n_q_heads = Hq;
    params.n_kv_heads = Hkv;
    params.head_dim = d;
    params.kv_dtype = dtype;
    params.v_dtype = v_dtype;
    params.max_seqs = 2;
    params.max_seq_len = HMAX;
    params.page_tokens = rc->page_tokens;
    params.n_threads = 1; /* no pool to start for each run */
    params.classes = tc;
    fg_context *ctx = NULL;
    fg_compression_params cp;
    if (fg_context_create(&params, &ctx) != FG_OK) { /* a quantized cache needs a head dim of 8 or more */
        params.kv_dtype = FG_DTYPE_F16;
        params.v_dtype = -1;
        if (fg_context_create(&params, &ctx) != FG_OK)
            abort();
    }
    if (fg_compression_params_preset(preset, &cp) != FG_OK)
        abort();
    cp.defer_until = cp.defer_until > n + steps ? n + steps : cp.defer_until; /* compressed inside the run */
    int32_t seq = -1, child = -1;
    fg_status st = fg_seq_create(ctx, &cp, tokens, n, &seq);
    hostile_ok(ctx, st, "create");
    for (int32_t l = 0; l < HL && st == FG_OK; l++)
        hostile_ok(ctx, st = fg_prefill(ctx, seq, l, q + (size_t)l * HMAX * rq, k + (size_t)l * HMAX * rk,
                                        v + (size_t)l * HMAX * rk, out), "prefill");
    int32_t len = n;
    for (int32_t s = 0; s < steps && st == FG_OK; s++, len++)
        for (int32_t l = 0; l < HL && st == FG_OK; l++)
            hostile_ok(ctx, st = fg_decode(ctx, l, 1, &seq, &tokens[len], q + ((size_t)l * HMAX + len) * rq,
                                           k + ((size_t)l * HMAX + len) * rk, v + ((size_t)l * HMAX + len) * rk, out),
                       "decode");
    if (st == FG_OK)
        hostile_ok(ctx, st = fg_seq_fork(ctx, seq, &child), "fork");
    for (int32_t l = 0; l < HL && st == FG_OK; l++)
        hostile_ok(ctx, st = fg_seq_append(ctx, child, l, &tokens[len], chunk, q + ((size_t)l * HMAX + len) * rq,
                                           k + ((size_t)l * HMAX + len) * rk, v + ((size_t)l * HMAX + len) * rk, out),
                   "append");
    for (int32_t l = 0; l < HL && st == FG_OK; l++) /* the source steps on beside its fork */
        hostile_ok(ctx, st = fg_decode(ctx, l, 1, &seq, &tokens[len], q + ((size_t)l * HMAX + len) * rq,
                                       k + ((size_t)l * HMAX + len) * rk, v + ((size_t)l * HMAX + len) * rk, out),
                   "decode beside a fork");
    const int32_t ids[2] = {seq, child};
    for (int i = 0; i < 2; i++)
        for (int32_t l = 0; l < HL && ids[i] >= 0; l++)
            for (int32_t g = 0; g < Hkv; g++) {
                fg_head_info info;
                if (fg_head_inspect(ctx, ids[i], l, g, &info) == FG_OK && (info.kept > info.length || info.kept < 0)) {
                    fprintf(stderr, "fuzz_api: hostile %s: %d rows kept at length %d\n", preset, (int)info.kept,
                            (int)info.length);
                    abort();
                }
            }
    if (seq >= 0)
        fg_seq_destroy(ctx, seq);
    if (child >= 0)
        fg_seq_destroy(ctx, child);
    fg_memory_stats m;
    if (fg_memory(ctx, -1, &m) != FG_OK || m.pages_in_use != 0) {
        fprintf(stderr, "fuzz_api: hostile %s: %lld pages still in use\n", preset, (long long)m.pages_in_use);
        abort();
    }
    fg_context_destroy(&ctx);
    free(q);
    free(k);
    free(v);
    free(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    reader r = {data, size};
    g_fail = 0;
    g_rng = 0x5eed0000u + next(&r) * 257u + next(&r);
    const uint8_t shape = next(&r);
    run_cfg rc = {1 + (shape & 1), 1 + (shape >> 1 & 1), (shape >> 2 & 1) ? 8 : 4, 1 + (shape >> 3 & 3),
                  (fg_dtype)((shape >> 5) % 3)};
    const int32_t Hq = rc.G * rc.Hkv, d = rc.d;

    fg_token_classes *tc = sim_classes();
    fg_context_params params;
    fg_context_params_default(&params);
    params.backend = "ref";
    params.n_layers = 1;
    params.n_q_heads = Hq;
    params.n_kv_heads = rc.Hkv;
    params.head_dim = d;
    params.kv_dtype = rc.dtype;
    params.max_seqs = SEQS;
    params.max_seq_len = MAX_LEN;
    params.page_tokens = rc.page_tokens;
    params.pool_chunk_pages = 2;
    params.classes = tc;
    fg_context *ctx = NULL;
    if (fg_context_create(&params, &ctx) != FG_OK) {
        fprintf(stderr, "fuzz_api: %s\n", fg_last_error(NULL));
        abort();
    }

    static slot slots[SEQS];
    memset(slots, 0, sizeof slots);
    const size_t row_q = (size_t)Hq * d, row_k = (size_t)rc.Hkv * d;
    float *out = malloc(MAX_LEN * row_q * sizeof(float));
    float *bq = malloc(SEQS * row_q * sizeof(float)), *bk = malloc(SEQS * row_k * sizeof(float));
    float *bv = malloc(SEQS * row_k * sizeof(float)), *bo = malloc(SEQS * row_q * sizeof(float));
    double *ref = malloc(SEQS * row_q * sizeof(double));

    for (int ops = 0; r.n && ops < 200; ops++) {
        const uint8_t op = next(&r);
        if (op >= 250) {
            hostile_run(&r, &rc, tc);
            continue;
        }
        const uint8_t arg = next(&r);
        slot *s = &slots[arg % SEQS];
        switch (op % 10) {
        case 8: { /* fork into a free slot: the child starts as the parent's simulator, then its future differs */
            slot *child = NULL;
            for (int i = 0; i < SEQS && !child; i++)
                if (!slots[i].live)
                    child = &slots[i];
            if (!s->live || !s->prefilled || !child)
                break;
            int32_t id = -1;
            EXPECT_OK(ctx, fg_seq_fork(ctx, s->sim.id, &id));
            die_if_failed("fork");
            const sim_seq parent = s->sim;
            child->sim = parent;
            const size_t nq = (size_t)MAXT * Hq * d, nk = (size_t)MAXT * rc.Hkv * d;
            child->sim.q = malloc(nq * sizeof(float));
            child->sim.k = malloc(nk * sizeof(float));
            child->sim.v = malloc(nk * sizeof(float));
            memcpy(child->sim.q, parent.q, nq * sizeof(float));
            memcpy(child->sim.k, parent.k, nk * sizeof(float));
            memcpy(child->sim.v, parent.v, nk * sizeof(float));
            for (int32_t p = s->len; p < MAXT; p++) {
                child->sim.tokens[p] = rng_int(0, VOCAB - 1);
                child->sim.cls[p] = (p < parent.cp.n_sink || child->sim.tokens[p] == 6) ? FG_TOKEN_SPECIAL
                                    : (child->sim.tokens[p] == 5 || child->sim.tokens[p] == 7) ? FG_TOKEN_PUNCT
                                                                                               : FG_TOKEN_ORDINARY;
                for (size_t x = 0; x < (size_t)Hq * d; x++)
                    child->sim.q[(size_t)p * Hq * d + x] = 1.5f * rng_gauss();
                for (size_t x = 0; x < (size_t)rc.Hkv * d; x++) {
                    child->sim.k[(size_t)p * rc.Hkv * d + x] = 1.5f * rng_gauss();
                    child->sim.v[(size_t)p * rc.Hkv * d + x] = rng_gauss();
                }
            }
            child->sim.cp = parent.cp;
            child->sim.pol = &child->sim.cp.shortlist[0];
            child->sim.id = id;
            child->live = child->prefilled = 1;
            child->len = s->len;
            check_all(ctx, slots, &rc, "fork");
            break;
        }
        case 9: { /* append a chunk of 1..5 tokens: the simulator steps through it token by token */
            const int32_t n = 1 + (arg >> 4) % 5;
            if (!s->live || !s->prefilled)
                break;
            const size_t rq = (size_t)Hq * d, rk = (size_t)rc.Hkv * d;
            if (s->len + n > MAX_LEN) {
                REFUSED(ctx, fg_seq_append(ctx, s->sim.id, 0, &s->sim.tokens[s->len], n, s->sim.q + s->len * rq,
                                           s->sim.k + s->len * rk, s->sim.v + s->len * rk, out),
                        "an append past max_seq_len");
                break;
            }
            EXPECT_OK(ctx, fg_seq_append(ctx, s->sim.id, 0, &s->sim.tokens[s->len], n, s->sim.q + s->len * rq,
                                         s->sim.k + s->len * rk, s->sim.v + s->len * rk, out));
            die_if_failed("append");
            double num = 0.0, den = 0.0;
            for (int32_t i = 0; i < n; i++) {
                memset(ref, 0, rq * sizeof(double));
                sim_steps(&s->sim, &rc, s->len, ref);
                for (size_t x = 0; x < rq; x++) {
                    num += (out[i * rq + x] - ref[x]) * (out[i * rq + x] - ref[x]);
                    den += ref[x] * ref[x];
                }
                s->len++;
            }
            for (int32_t g = 0; g < rc.Hkv; g++)
                compare_sets(ctx, &s->sim, g, s->len, "append");
            EXPECT(num <= 1e-9 * den, "append output NMSE %.3g", num / den);
            die_if_failed("append against the simulator");
            break;
        }
        case 0: /* create */
            if (!s->live) {
                fg_compression_params cp;
                fg_compression_params_default(&cp);
                cp.n_policies = 1;
                cp.shortlist[0] = k_policies[(arg / SEQS) % (sizeof k_policies / sizeof k_policies[0])];
                cp.score_mode = (arg & 0x40) ? FG_SCORE_MEAN : FG_SCORE_SUM;
                cp.n_sink = (arg & 0x80) ? 2 : 0;
                cp.allocation = (arg & 0x20) ? FG_ALLOC_LAYER : FG_ALLOC_SHORTLIST; /* the layer's heads rank as one */
                make_seq(&s->sim, &rc, &cp);
                s->sim.n = 1 + next(&r) % 40;
                EXPECT_OK(ctx, fg_seq_create(ctx, &s->sim.cp, s->sim.tokens, s->sim.n, &s->sim.id));
                die_if_failed("create");
                s->live = 1;
                s->prefilled = 0;
                s->len = 0;
            }
            break;
        case 1: /* prefill (in two chunks when arg is odd), or a second prefill (refused) */
            if (s->live && !s->prefilled && (arg & 1) && s->sim.n > 1) {
                const int32_t first = 1 + (int32_t)(arg >> 1) % (s->sim.n - 1);
                const size_t rq = (size_t)Hq * d, rk = (size_t)rc.Hkv * d;
                EXPECT_OK(ctx, fg_prefill_chunk(ctx, s->sim.id, 0, 0, first, s->sim.q, s->sim.k, s->sim.v, out));
                REFUSED(ctx, fg_prefill(ctx, s->sim.id, 0, s->sim.q, s->sim.k, s->sim.v, out), "a prefill over chunks");
                EXPECT_OK(ctx, fg_prefill_chunk(ctx, s->sim.id, 0, first, s->sim.n - first, s->sim.q + first * rq,
                                                s->sim.k + first * rk, s->sim.v + first * rk, out + first * rq));
                die_if_failed("chunked prefill");
                s->prefilled = 1;
                s->len = s->sim.n;
                sim_init(ctx, &s->sim, &rc);
            } else if (s->live && !s->prefilled) {
                EXPECT_OK(ctx, fg_prefill(ctx, s->sim.id, 0, s->sim.q, s->sim.k, s->sim.v, out));
                die_if_failed("prefill");
                s->prefilled = 1;
                s->len = s->sim.n;
                sim_init(ctx, &s->sim, &rc);
            } else if (s->live) {
                REFUSED(ctx, fg_prefill(ctx, s->sim.id, 0, s->sim.q, s->sim.k, s->sim.v, out), "a second prefill");
            }
            break;
        case 2:
        case 3: { /* decode a batch; refused when a member is not ready or full */
            int32_t ids[SEQS], toks[SEQS], n = 0, ready = 1;
            slot *members[SEQS];
            for (int i = 0; i < SEQS; i++)
                if ((arg >> i & 1) && slots[i].live) {
                    slot *m = &slots[i];
                    const int32_t p = m->prefilled ? m->len : 0;
                    ready &= m->prefilled && p < MAX_LEN;
                    ids[n] = m->sim.id;
                    toks[n] = m->sim.tokens[p];
                    memcpy(bq + n * row_q, m->sim.q + (size_t)p * row_q, row_q * sizeof(float));
                    memcpy(bk + n * row_k, m->sim.k + (size_t)p * row_k, row_k * sizeof(float));
                    memcpy(bv + n * row_k, m->sim.v + (size_t)p * row_k, row_k * sizeof(float));
                    members[n++] = m;
                }
            if (!n)
                break;
            if (!ready) {
                REFUSED(ctx, fg_decode(ctx, 0, n, ids, toks, bq, bk, bv, bo), "decode before prefill or past the end");
                break;
            }
            EXPECT_OK(ctx, fg_decode(ctx, 0, n, ids, toks, bq, bk, bv, bo));
            die_if_failed("decode");
            memset(ref, 0, SEQS * row_q * sizeof(double));
            double num = 0.0, den = 0.0;
            for (int32_t b = 0; b < n; b++) {
                slot *m = members[b];
                sim_steps(&m->sim, &rc, m->len, ref + b * row_q);
                for (int32_t g = 0; g < rc.Hkv; g++)
                    compare_sets(ctx, &m->sim, g, m->len + 1, "decode");
                m->len++;
            }
            for (size_t i = 0; i < (size_t)n * row_q; i++) {
                num += (bo[i] - ref[i]) * (bo[i] - ref[i]);
                den += ref[i] * ref[i];
            }
            EXPECT(num <= 1e-9 * den, "decode output NMSE %.3g", num / den);
            die_if_failed("decode against the simulator");
            break;
        }
        case 4: /* destroy, then a call on the destroyed id */
            if (s->live) {
                EXPECT_OK(ctx, fg_seq_destroy(ctx, s->sim.id));
                free(s->sim.q);
                free(s->sim.k);
                free(s->sim.v);
                s->live = 0;
                int32_t len;
                REFUSED(ctx, fg_seq_length(ctx, s->sim.id, 0, &len), "a destroyed sequence");
            }
            break;
        case 5: /* trim and memory */
            EXPECT_OK(ctx, fg_trim(ctx));
            check_all(ctx, slots, &rc, "trim");
            break;
        case 6: /* inspect, and positions into a short buffer */
            if (s->live && s->prefilled) {
                fg_head_info info;
                int32_t pos[MAXT], n_kept = -1;
                EXPECT_OK(ctx, fg_head_inspect(ctx, s->sim.id, 0, arg % rc.Hkv, &info));
                if (info.kept > 0) {
                    fg_status st = fg_head_positions(ctx, s->sim.id, 0, arg % rc.Hkv, pos, info.kept - 1, &n_kept);
                    EXPECT(st == FG_ERR_CAPACITY && n_kept == info.kept, "short capacity: %s, %d of %d",
                           fg_status_string(st), (int)n_kept, (int)info.kept);
                }
                die_if_failed("inspect");
            }
            break;
        default: { /* a bad call of another kind */
            int32_t live = -1;
            for (int i = 0; i < SEQS; i++)
                if (slots[i].live && slots[i].prefilled && slots[i].len < MAX_LEN)
                    live = i;
            int32_t id = live >= 0 ? slots[live].sim.id : 0, tok = 3, ids2[2] = {id, id};
            memset(bq, 0, row_q * sizeof(float));
            memset(bk, 0, 2 * row_k * sizeof(float));
            memset(bv, 0, 2 * row_k * sizeof(float));
            switch (arg % 7) {
            case 0: REFUSED(ctx, fg_decode(ctx, 1, 1, &id, &tok, bq, bk, bv, bo), "layer out of range"); break;
            case 1: tok = arg & 1 ? VOCAB : -1;
                REFUSED(ctx, fg_decode(ctx, 0, 1, &id, &tok, bq, bk, bv, bo), "token outside the vocabulary");
                break;
            case 2: REFUSED(ctx, fg_decode(ctx, 0, 2, ids2, ids2, bq, bk, bv, bo), "a sequence twice in a batch"); break;
            case 3: REFUSED(ctx, fg_decode(ctx, 0, 1, &id, &tok, NULL, bk, bv, bo), "NULL q"); break;
            case 4: id = 1000 + arg;
                REFUSED(ctx, fg_decode(ctx, 0, 1, &id, &tok, bq, bk, bv, bo), "an unknown sequence");
                break;
            case 5: REFUSED(ctx, fg_decode(ctx, 0, SEQS + 1, &id, &tok, bq, bk, bv, bo), "a batch above max_seqs"); break;
            default: {
                int32_t pos[4], n_kept;
                REFUSED(ctx, fg_head_positions(ctx, id, 0, rc.Hkv, pos, 4, &n_kept), "a KV head out of range");
            }
            }
        }
        }
    }
    for (int i = 0; i < SEQS; i++)
        if (slots[i].live) {
            free(slots[i].sim.q);
            free(slots[i].sim.k);
            free(slots[i].sim.v);
        }
    free(out);
    free(bq);
    free(bk);
    free(bv);
    free(bo);
    free(ref);
    fg_context_destroy(&ctx);
    fg_token_classes_destroy(&tc);
    return 0;
}
