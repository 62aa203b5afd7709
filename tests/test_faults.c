/*
 * Fault injection (SQLite's habit): every allocation the library makes can
 * fail, and a walk over k = 1, 2, ... makes the k-th one fail in a script of
 * create -> three sequences with mixed policies -> prefill (one of them in
 * two chunks, fg_prefill_chunk) -> batched decode
 * -> inspect -> destroy a sequence -> trim -> decode -> fork (pages shared
 * copy-on-write) -> decode -> append a chunk (to the full cache, and
 * re-profiled to the fork's parent) -> destroy. After each
 * failure: a status with a message; the subject context is unchanged, i.e.
 * equal to a twin that got only successful calls (kept positions, lengths,
 * memory); a retry succeeds; and every output of the subject equals the
 * twin's bit for bit. Leaks are ASan's to find (CI runs this under it).
 * A second walk does the same over the model loaders and the runner.
 * --stride S walks every S-th allocation only, from an offset the seed picks
 * (the gpu suite under HIP-CPU emulation, where each walk is slow; the
 * sites are the core's, which the ref and cpu walks cover whole).
 * Usage: test_faults BACKEND... [--model DIR] [--stride S]
 */
#include <string.h>

#include "fastgen.h"
#include "tests/support/fault.h"
#include "tests/support/harness.h"
#include "model/llama2c.h"
#include "model/runner.h"
#include "tools/synth.h"
#include "model/tokenizer.h"
#include "model/io.h"

enum { L = 2, HKV = 4, G = 2, HQ = G * HKV, D = 16, MAXLEN = 64, SEQS = 5 };

typedef enum op_kind {
    OP_CREATE, OP_SEQ, OP_PREFILL, OP_CHUNK, OP_DECODE, OP_INSPECT, OP_DESTROY_SEQ, OP_TRIM, OP_FORK, OP_APPEND
} op_kind;

typedef struct op {
    op_kind kind;
    int32_t a, b;      /* OP_SEQ, OP_INSPECT, OP_DESTROY_SEQ: sequence; OP_PREFILL: sequence, layer; OP_DECODE: layer;
                          OP_FORK: the new sequence's slot, the parent; OP_APPEND: sequence, layer (5 tokens);
                          OP_CHUNK: sequence, layer */
    uint32_t batch;    /* OP_DECODE: bit i = sequence i takes part; OP_CHUNK: 0 = the first third, 1 = the rest */
} op;

/* One side of the twin pair. */
typedef struct side {
    fg_context *ctx;
    int32_t seq[SEQS]; /* -1: none */
    float out[SEQS * MAXLEN * HQ * D];
    int32_t info[SEQS * L * HKV * (MAXLEN + 4)];
} side;

typedef struct world {
    const char *backend;
    synth syn;
    int32_t tokens[SEQS][MAXLEN];
    int32_t len[SEQS][L]; /* tokens each sequence has seen at each layer (twin side) */
} world;

/* 16: the full cache takes a new page at its first decode; the adaptive ones compress at the 6th decode
   step of their batch (3) and at their prefill (4) */
static const char *k_presets[SEQS] = {"fastgen", "h2o", "full", "fastgen-adaptive", "fastgen-adaptive"};
static const int32_t k_prompt[SEQS] = {24, 30, 16, 20, 28};

static fg_status run_op(world *w, side *s, const op *o, const int32_t *len) {
    switch (o->kind) {
    case OP_CREATE: {
        fg_context_params p = test_context_params(w->backend, L, HQ, HKV, D);
        p.kv_dtype = FG_DTYPE_F16;
        p.max_seqs = SEQS;
        p.max_seq_len = MAXLEN;
        p.page_tokens = 4;
        p.pool_chunk_pages = 8; /* the pool grows in the middle of prefills and decodes */
        p.classes = w->syn.classes;
        return fg_context_create(&p, &s->ctx);
    }
    case OP_SEQ: {
        fg_compression_params cp;
        fg_status st = fg_compression_params_preset(k_presets[o->a], &cp);
        cp.append_mode = o->a == 0 ? FG_APPEND_REPROFILE : FG_APPEND_KEEP; /* and so its fork */
        if (o->a >= 3) { /* observed over 8 rows; compressed at 26 tokens, or at once */
            cp.observation_window = 8;
            cp.defer_until = o->a == 3 ? 26 : 0;
        }
        return st ? st : fg_seq_create(s->ctx, &cp, w->tokens[o->a], k_prompt[o->a], &s->seq[o->a]);
    }
    case OP_PREFILL: {
        const int32_t n = k_prompt[o->a];
        static float q[MAXLEN * HQ * D], k[MAXLEN * HKV * D], v[MAXLEN * HKV * D];
        synth_qkv(&w->syn, o->b, w->tokens[o->a], 0, n, q, k, v);
        return fg_prefill(s->ctx, s->seq[o->a], o->b, q, k, v, s->out);
    }
    case OP_CHUNK: {
        const int32_t n = k_prompt[o->a], first = n / 3, at = o->batch ? first : 0, m = o->batch ? n - first : first;
        static float q[MAXLEN * HQ * D], k[MAXLEN * HKV * D], v[MAXLEN * HKV * D];
        synth_qkv(&w->syn, o->b, w->tokens[o->a], 0, n, q, k, v);
        return fg_prefill_chunk(s->ctx, s->seq[o->a], o->b, at, m, q + (size_t)at * HQ * D, k + (size_t)at * HKV * D,
                                v + (size_t)at * HKV * D, s->out);
    }
    case OP_DECODE: {
        int32_t seqs[SEQS], toks[SEQS], n = 0;
        static float q[SEQS * HQ * D], k[SEQS * HKV * D], v[SEQS * HKV * D];
        for (int32_t i = 0; i < SEQS; i++)
            if (o->batch >> i & 1) {
                const int32_t p = len[i * L + o->a];
                seqs[n] = s->seq[i];
                toks[n] = w->tokens[i][p];
                synth_qkv(&w->syn, o->a, &toks[n], p, 1, q + (size_t)n * HQ * D, k + (size_t)n * HKV * D,
                             v + (size_t)n * HKV * D);
                n++;
            }
        return fg_decode(s->ctx, o->a, n, seqs, toks, q, k, v, s->out);
    }
    case OP_INSPECT: {
        int32_t *x = s->info;
        for (int32_t l = 0; l < L; l++)
            for (int32_t g = 0; g < HKV; g++) {
                fg_head_info hi;
                fg_status st = fg_head_inspect(s->ctx, s->seq[o->a], l, g, &hi);
                if (st == FG_OK)
                    st = fg_head_positions(s->ctx, s->seq[o->a], l, g, x + 4, MAXLEN, &x[3]);
                if (st)
                    return st;
                x[0] = hi.policy_index;
                x[1] = hi.kept;
                x[2] = (int32_t)hi.kv_bytes_held;
                x += MAXLEN + 4;
            }
        return FG_OK;
    }
    case OP_DESTROY_SEQ: {
        fg_status st = fg_seq_destroy(s->ctx, s->seq[o->a]);
        if (st == FG_OK)
            s->seq[o->a] = -1;
        return st;
    }
    case OP_TRIM:
        return fg_trim(s->ctx);
    case OP_FORK:
        return fg_seq_fork(s->ctx, s->seq[o->b], &s->seq[o->a]);
    case OP_APPEND: {
        static float q[5 * HQ * D], k[5 * HKV * D], v[5 * HKV * D];
        const int32_t p = len[o->a * L + o->b];
        synth_qkv(&w->syn, o->b, &w->tokens[o->a][p], p, 5, q, k, v);
        return fg_seq_append(s->ctx, s->seq[o->a], o->b, &w->tokens[o->a][p], 5, q, k, v, s->out);
    }
    }
    return FG_ERR_INTERNAL;
}

/* The subject equals its twin: the same sequences, lengths, kept rows, memory. */
static int same_state(const side *x, const side *y) {
    if ((x->ctx == NULL) != (y->ctx == NULL))
        return 0;
    if (!x->ctx)
        return 1;
    for (int32_t i = 0; i < SEQS; i++) {
        if ((x->seq[i] < 0) != (y->seq[i] < 0))
            return 0;
        if (x->seq[i] < 0)
            continue;
        for (int32_t l = 0; l < L; l++) {
            int32_t lx = -1, ly = -2;
            fg_seq_length(x->ctx, x->seq[i], l, &lx);
            fg_seq_length(y->ctx, y->seq[i], l, &ly);
            if (lx != ly)
                return 0;
            for (int32_t g = 0; g < HKV && lx > 0; g++) {
                int32_t px[MAXLEN], py[MAXLEN], nx = -1, ny = -2;
                if (fg_head_positions(x->ctx, x->seq[i], l, g, px, MAXLEN, &nx) ||
                    fg_head_positions(y->ctx, y->seq[i], l, g, py, MAXLEN, &ny) || nx != ny ||
                    memcmp(px, py, (size_t)nx * sizeof *px))
                    return 0;
            }
        }
    }
    fg_memory_stats mx, my;
    fg_memory(x->ctx, -1, &mx);
    fg_memory(y->ctx, -1, &my);
    return mx.pages_in_use == my.pages_in_use && mx.kv_bytes_held == my.kv_bytes_held &&
           mx.kv_bytes_full == my.kv_bytes_full && mx.rows_kept == my.rows_kept && mx.rows_full == my.rows_full &&
           mx.meta_bytes_held == my.meta_bytes_held;
}

/* The script, as the twin applies it; lengths advance with prefills and decodes. */
static int32_t make_script(op *ops) {
    int32_t n = 0;
    ops[n++] = (op){OP_CREATE, 0, 0, 0};
    for (int32_t i = 0; i < SEQS; i++) {
        ops[n++] = (op){OP_SEQ, i, 0, 0};
        for (int32_t l = 0; l < L; l++) {
            if (i == 1) { /* in two chunks, profiled over the whole prompt at the second */
                ops[n++] = (op){OP_CHUNK, i, l, 0};
                ops[n++] = (op){OP_CHUNK, i, l, 1};
            } else {
                ops[n++] = (op){OP_PREFILL, i, l, 0};
            }
        }
    }
    for (int32_t step = 0; step < 5; step++)
        for (int32_t l = 0; l < L; l++)
            ops[n++] = (op){OP_DECODE, l, 0, 31};
    for (int32_t i = 0; i < SEQS; i++)
        ops[n++] = (op){OP_INSPECT, i, 0, 0};
    ops[n++] = (op){OP_DESTROY_SEQ, 1, 0, 0};
    ops[n++] = (op){OP_TRIM, 0, 0, 0};
    for (int32_t step = 0; step < 3; step++)
        for (int32_t l = 0; l < L; l++)
            ops[n++] = (op){OP_DECODE, l, 0, 29};
    ops[n++] = (op){OP_FORK, 1, 0, 0}; /* slot 1 continues from sequence 0, sharing its pages */
    for (int32_t step = 0; step < 3; step++)
        for (int32_t l = 0; l < L; l++)
            ops[n++] = (op){OP_DECODE, l, 0, 31};
    for (int32_t l = 0; l < L; l++)
        ops[n++] = (op){OP_APPEND, 2, l, 0};
    for (int32_t l = 0; l < L; l++) /* re-profiled: new pages for every head, the fork's shared ones left to it */
        ops[n++] = (op){OP_APPEND, 0, l, 0};
    for (int32_t i = 0; i < SEQS; i++)
        ops[n++] = (op){OP_INSPECT, i, 0, 0};
    return n;
}

static void advance(int32_t *len, const op *o) {
    if (o->kind == OP_PREFILL || (o->kind == OP_CHUNK && o->batch == 1))
        len[o->a * L + o->b] = k_prompt[o->a];
    if (o->kind == OP_DECODE)
        for (int32_t i = 0; i < SEQS; i++)
            if (o->batch >> i & 1)
                len[i * L + o->a]++;
    if (o->kind == OP_FORK)
        for (int32_t l = 0; l < L; l++)
            len[o->a * L + l] = len[o->b * L + l];
    if (o->kind == OP_APPEND)
        len[o->a * L + o->b] += 5;
}

static size_t out_floats(const op *o) {
    if (o->kind == OP_PREFILL)
        return (size_t)k_prompt[o->a] * HQ * D;
    if (o->kind == OP_CHUNK)
        return (size_t)(o->batch ? k_prompt[o->a] - k_prompt[o->a] / 3 : k_prompt[o->a] / 3) * HQ * D;
    if (o->kind == OP_DECODE)
        return (size_t)__builtin_popcount(o->batch) * HQ * D;
    if (o->kind == OP_APPEND)
        return (size_t)5 * HQ * D;
    return 0;
}

/* One run of the script with the k-th allocation failing; returns whether it fired. */
static int walk_once(world *w, const op *ops, int32_t n_ops, long k, long *failures) {
    static side subject, twin;
    int32_t len[SEQS * L] = {0};
    subject.ctx = twin.ctx = NULL;
    for (int32_t i = 0; i < SEQS; i++)
        subject.seq[i] = twin.seq[i] = -1;
    fault_reset(k);
    int ok = 1;
    for (int32_t j = 0; j < n_ops && ok; j++) {
        const op *o = &ops[j];
        fault_active(1);
        fg_status st = run_op(w, &subject, o, len);
        fault_active(0);
        if (st != FG_OK) {
            const char *msg = fg_last_error(o->kind == OP_CREATE ? NULL : subject.ctx);
            EXPECT(fault_fired() && st == FG_ERR_OUT_OF_MEMORY && msg[0], "%s k=%ld op %d: %s, message \"%s\"",
                   w->backend, k, (int)j, fg_status_string(st), msg);
            EXPECT(same_state(&subject, &twin), "%s k=%ld op %d: the failed call changed the context", w->backend, k,
                   (int)j);
            (*failures)++;
            st = run_op(w, &subject, o, len); /* the retry */
            EXPECT(st == FG_OK, "%s k=%ld op %d: the retry failed: %s", w->backend, k, (int)j,
                   fg_last_error(subject.ctx));
        }
        else if (o->kind != OP_CREATE) /* a call that succeeds leaves no message, whatever failed inside it */
            EXPECT(!fg_last_error(subject.ctx)[0], "%s k=%ld op %d: a successful call left \"%s\"", w->backend, k,
                   (int)j, fg_last_error(subject.ctx));
        fg_status st2 = run_op(w, &twin, o, len);
        EXPECT(st2 == FG_OK, "%s: twin op %d: %s", w->backend, (int)j, fg_last_error(twin.ctx));
        ok = st == FG_OK && st2 == FG_OK;
        const size_t nf = out_floats(o);
        if (ok && nf)
            ok = memcmp(subject.out, twin.out, nf * sizeof(float)) == 0;
        if (ok && o->kind == OP_INSPECT)
            ok = memcmp(subject.info, twin.info, sizeof subject.info) == 0;
        EXPECT(ok, "%s k=%ld op %d: subject and twin differ after it", w->backend, k, (int)j);
        advance(len, o);
    }
    EXPECT(!ok || same_state(&subject, &twin), "%s k=%ld: the end states differ", w->backend, k);
    fg_context_destroy(&subject.ctx);
    fg_context_destroy(&twin.ctx);
    return fault_fired();
}

static long g_stride = 1;

static void walk_library(const char *backend) {
    world w = {.backend = backend};
    EXPECT_OK(NULL, synth_create(L, HQ, HKV, D, 7, &w.syn));
    for (int32_t i = 0; i < SEQS; i++)
        for (int32_t p = 0; p < MAXLEN; p++)
            w.tokens[i][p] = synth_token(&w.syn, p + 11 * i);
    for (int32_t i = 0; i < SEQS; i++)
        w.tokens[i][0] = SYNTH_BOS;
    op ops[128];
    const int32_t n_ops = make_script(ops);
    const long first = 1 + (long)(rng_next() % (uint64_t)g_stride);
    long k = first, failures = 0, walked = 0;
    while (walk_once(&w, ops, n_ops, k, &failures) && k < 100000) {
        k += g_stride;
        walked++;
    }
    printf("%s: %ld allocation sites walked (every %ld-th, from number %ld) over %d calls, %ld failures injected\n", backend,
           walked, g_stride, first, (int)n_ops, failures);
    EXPECT(k > 20, "%s: only %ld allocations seen: is the wrapping linked?", backend, k - 1);
    synth_destroy(&w.syn);
}

/* ------------------------------------------------------------------ loaders and runner */

static fg_status load_all(const void *mb, size_t ms, const void *tb, size_t ts, char *err, size_t n) {
    fgm_llama_model m;
    fgm_tokenizer t;
    fgm_runner *r = NULL;
    fg_status st = fgm_llama_load_memory(mb, ms, &m, err, n);
    if (st)
        return st;
    st = fgm_tokenizer_load_memory(tb, ts, m.config.vocab_size, &t, err, n);
    if (st == FG_OK) {
        fgm_runner_params rp = {.backend = "cpu", .kv_dtype = FG_DTYPE_F32, .max_seqs = 2, .track_recovery = 1};
        st = fgm_runner_create(&m, &t, &rp, &r, err, n);
        int32_t prompt[8], n_prompt = 0, seq = -1, next = 300;
        if (st == FG_OK && (st = fgm_tokenizer_encode(&t, "Once upon a time", 1, prompt, 8, &n_prompt)) != FG_OK)
            snprintf(err, n, "encode: %s", fg_status_string(st)); /* the tokenizer's status is its message */
        if (st == FG_OK && (st = fgm_runner_prefill(r, NULL, prompt, n_prompt, &seq, NULL)) != FG_OK)
            snprintf(err, n, "%s", fgm_runner_error(r));
        if (st == FG_OK && (st = fgm_runner_decode(r, 1, &seq, &next, NULL)) != FG_OK)
            snprintf(err, n, "%s", fgm_runner_error(r));
        fgm_runner_destroy(&r);
        fgm_tokenizer_free(&t);
    }
    fgm_llama_free(&m);
    return st;
}

static void walk_loaders(const char *dir) {
    char path[1024], err[512];
    void *mb, *tb;
    size_t ms, ts;
    snprintf(path, sizeof path, "%s/stories260K.bin", dir);
    EXPECT(fgm_read_file(path, &mb, &ms, err, sizeof err) == FG_OK, "%s", err);
    snprintf(path, sizeof path, "%s/tok512.bin", dir);
    EXPECT(fgm_read_file(path, &tb, &ts, err, sizeof err) == FG_OK, "%s", err);
    if (!mb || !tb)
        return;
    long k = 1;
    for (;; k++) {
        fault_reset(k);
        err[0] = '\0';
        fault_active(1);
        fg_status st = load_all(mb, ms, tb, ts, err, sizeof err);
        fault_active(0);
        if (!fault_fired()) {
            EXPECT(st == FG_OK, "loaders with no fault: %s", err);
            break;
        }
        EXPECT(st != FG_OK && err[0], "loaders k=%ld: %s with message \"%s\"", k, fg_status_string(st), err);
    }
    printf("loaders + runner: %ld allocation sites walked\n", k - 1);
    EXPECT(k > 10, "loaders: only %ld allocations seen", k - 1);
    free(mb);
    free(tb);
}

int main(int argc, char **argv) {
    test_seed("test_faults");
    for (int i = 1; i + 1 < argc; i++) /* before any walk */
        if (!strcmp(argv[i], "--stride")) {
            g_stride = atol(argv[i + 1]);
            EXPECT(g_stride >= 1, "--stride takes a count >= 1");
            g_stride = g_stride < 1 ? 1 : g_stride;
        }
    int ran = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--model") && i + 1 < argc) {
            walk_loaders(argv[++i]);
            continue;
        }
        if (!strcmp(argv[i], "--stride") && i + 1 < argc) {
            i++;
            continue;
        }
        if (fg_backend_probe(argv[i]) != FG_OK) {
            printf("%s: not tested: %s\n", argv[i], fg_last_error(NULL));
            EXPECT(!test_backend_required(), "backend %s is required here (FG_TEST_REQUIRE_BACKEND)", argv[i]);
            continue;
        }
        walk_library(argv[i]);
        ran++;
    }
    if (ran == 0 && !test_backend_required())
        return 77;
    return test_finish();
}
