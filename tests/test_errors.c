/*
 * Bad input on every public function: a clear status and a message, never a
 * crash. Caches that were valid stay valid: a twin context that never sees a
 * bad call decodes beside the one that does, and after every failed call
 * both decode one more step and must agree bit for bit (outputs, kept
 * positions, memory).
 */
#include <string.h>

#include "fastgen.h"
#include "tests/support/harness.h"
#include "tools/synth.h"

enum { L = 2, HKV = 5, G = 2, HQ = G * HKV, D = 16, N = 40, MAXLEN = 120 };

typedef struct twin {
    fg_context *bad, *good;
    int32_t seq_bad, seq_good;
    int32_t pos;
    synth *syn;
    int32_t tokens[MAXLEN];
} twin;

static fg_context_params base_params(const synth *syn) {
    fg_context_params p = test_context_params("ref", L, HQ, HKV, D);
    p.kv_dtype = FG_DTYPE_BF16;
    p.max_seqs = 2;
    p.max_seq_len = MAXLEN;
    p.page_tokens = 4;
    p.classes = syn->classes;
    return p;
}

static void prefill_all(fg_context *ctx, const synth *syn, const int32_t *tokens, int32_t seq) {
    float q[N * HQ * D], k[N * HKV * D], v[N * HKV * D], out[N * HQ * D];
    for (int32_t l = 0; l < L; l++) {
        synth_qkv(syn, l, tokens, 0, N, q, k, v);
        EXPECT_OK(ctx, fg_prefill(ctx, seq, l, q, k, v, out));
    }
}

/* One decode step on both contexts; they must agree exactly. */
static void step_both(twin *t, const char *after) {
    float q[HQ * D], k[HKV * D], v[HKV * D], ob[HQ * D], og[HQ * D];
    const int32_t p = t->pos;
    for (int32_t l = 0; l < L; l++) {
        synth_qkv(t->syn, l, &t->tokens[p], p, 1, q, k, v);
        EXPECT_OK(t->bad, fg_decode(t->bad, l, 1, &t->seq_bad, &t->tokens[p], q, k, v, ob));
        EXPECT_OK(t->good, fg_decode(t->good, l, 1, &t->seq_good, &t->tokens[p], q, k, v, og));
        EXPECT(memcmp(ob, og, sizeof ob) == 0, "after %s: outputs differ at layer %d", after, (int)l);
    }
    for (int32_t l = 0; l < L; l++)
        for (int32_t g = 0; g < HKV; g++) {
            int32_t pb[MAXLEN], pg[MAXLEN], nb = -1, ng = -2;
            EXPECT_OK(t->bad, fg_head_positions(t->bad, t->seq_bad, l, g, pb, MAXLEN, &nb));
            EXPECT_OK(t->good, fg_head_positions(t->good, t->seq_good, l, g, pg, MAXLEN, &ng));
            EXPECT(nb == ng && memcmp(pb, pg, (size_t)nb * sizeof *pb) == 0, "after %s: kept sets differ", after);
        }
    fg_memory_stats mb, mg;
    fg_memory(t->bad, t->seq_bad, &mb);
    fg_memory(t->good, t->seq_good, &mg);
    EXPECT(mb.kv_bytes_held == mg.kv_bytes_held && mb.rows_kept == mg.rows_kept, "after %s: memory differs", after);
    t->pos++;
}

static void test_params_and_classes(void) {
    EXPECT(strstr(fg_status_string(FG_ERR_INVALID_ARGUMENT), "invalid") != NULL, "status names");
    EXPECT(fg_status_string((fg_status)-1234) != NULL, "unknown status still named");
    EXPECT(fg_version() && strcmp(fg_version(), FG_VERSION_STRING) == 0, "version");

    fg_token_classes *tc = NULL;
    EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_token_classes_create(10, NULL, NULL));
    EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_token_classes_create(0, NULL, &tc));
    EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_token_classes_create(-5, NULL, &tc));
    EXPECT(tc == NULL, "no handle on failure");
    EXPECT_OK(NULL, fg_token_classes_create(10, NULL, &tc));
    EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_token_classes_set(NULL, 1, FG_TOKEN_SPECIAL));
    EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_token_classes_set(tc, 10, FG_TOKEN_SPECIAL));
    EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_token_classes_set(tc, -1, FG_TOKEN_SPECIAL));
    EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_token_classes_set(tc, 1, (fg_token_class)9));
    EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_token_classes_get(tc, 1, NULL));
    EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_token_classes_get(tc, 99, &(fg_token_class){0}));
    const int32_t ids[] = {1, 2, 30};
    EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_token_classes_add_sequence(tc, NULL, 2));
    EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_token_classes_add_sequence(tc, ids, 0));
    EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_token_classes_add_sequence(tc, ids, 65));
    EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_token_classes_add_sequence(tc, ids, 3));
    uint8_t cls[3];
    EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_token_classes_classify(NULL, ids, 2, 0, cls));
    EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_token_classes_classify(tc, ids, -1, 0, cls));
    EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_token_classes_classify(tc, ids, 2, -1, cls));
    EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_token_classes_classify(tc, ids, 3, 0, cls));
    fg_token_classes_destroy(&tc);
    fg_token_classes_destroy(&tc); /* NULL handle: no-op */
    fg_token_classes_destroy(NULL);

    fg_compression_params cp;
    EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_compression_params_preset(NULL, &cp));
    EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_compression_params_preset("h2o", NULL));
    EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_compression_params_preset("quest", &cp));
    EXPECT(strstr(fg_last_error(NULL), "quest") != NULL, "message names the bad preset: %s", fg_last_error(NULL));
    const char *peers[] = {"snapkv", "adakv", "tova", "fastgen-adaptive"};
    for (int i = 0; i < 4; i++) {
        EXPECT_OK(NULL, fg_compression_params_preset(peers[i], &cp));
        EXPECT_OK(NULL, fg_compression_params_validate(&cp));
    }
    /* the peer methods' fields */
    fg_compression_params_default(&cp);
    cp.score_mode = (fg_score_mode)3;
    EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_compression_params_validate(&cp));
    fg_compression_params_default(&cp);
    cp.score_pool = -1;
    EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_compression_params_validate(&cp));
    cp.score_pool = 1025;
    EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_compression_params_validate(&cp));
    fg_compression_params_preset("adakv", &cp);
    cp.alloc_floor = NAN;
    EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_compression_params_validate(&cp));
    cp.alloc_floor = 1.5f;
    EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_compression_params_validate(&cp));
    fg_compression_params_preset("adakv", &cp);
    cp.allocation = (fg_allocation)7;
    EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_compression_params_validate(&cp));
    fg_compression_params_default(&cp); /* AdaKV needs one entry with frequent or snapshot */
    cp.allocation = FG_ALLOC_ADAKV;
    EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_compression_params_validate(&cp));
    EXPECT(strstr(fg_last_error(NULL), "one-entry") != NULL, "says what AdaKV needs: %s", fg_last_error(NULL));
/* A preset with one field changed is refused. */
#define REFUSED(preset, change)                                                                                       \
    do {                                                                                                               \
        fg_compression_params_preset(preset, &cp);                                                                     \
        change;                                                                                                        \
        EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_compression_params_validate(&cp));                             \
    } while (0)
    REFUSED("streamingllm", cp.allocation = FG_ALLOC_ADAKV);
    REFUSED("adakv", cp.budget = 0.5f);
    REFUSED("h2o", cp.budget = 0.5f); /* one entry: a budget would have nothing to choose, and be ignored */
    EXPECT(strstr(fg_last_error(NULL), "one-entry") != NULL, "says why: %s", fg_last_error(NULL));
    REFUSED("snapkv", cp.budget_tokens = 64);
    REFUSED("adakv", cp.append_mode = FG_APPEND_REPROFILE);
    REFUSED("fastgen", cp.allocation = FG_ALLOC_LAYER); /* one entry for every head of a layer */
    EXPECT(strstr(fg_last_error(NULL), "one-entry") != NULL, "says what FG_ALLOC_LAYER needs: %s", fg_last_error(NULL));
    REFUSED("tova", cp.append_mode = FG_APPEND_REPROFILE);
    fg_compression_params_preset("h2o", &cp); /* any one-entry policy may rank by its layer */
    cp.allocation = FG_ALLOC_LAYER;
    EXPECT_OK(NULL, fg_compression_params_validate(&cp));
    REFUSED("fastgen", cp.shortlist[2].components = FG_KEEP_FREQUENT | FG_KEEP_SNAPSHOT);
    EXPECT(strstr(fg_last_error(NULL), "snapshot") != NULL, "says why: %s", fg_last_error(NULL));
    /* the adaptive mode's fields */
    REFUSED("fastgen-adaptive", cp.budget = 0.0f);
    EXPECT(strstr(fg_last_error(NULL), "budget") != NULL, "says it needs a budget: %s", fg_last_error(NULL));
    REFUSED("fastgen-adaptive", cp.n_policies--); /* the last entry is not full */
    REFUSED("fastgen-adaptive", cp.observation_window = 0);
    REFUSED("fastgen-adaptive", cp.score_mode = FG_SCORE_MEAN);
    REFUSED("fastgen-adaptive", cp.append_mode = FG_APPEND_REPROFILE);
    REFUSED("fastgen-adaptive", cp.defer_until = -1);
    REFUSED("h2o", cp.defer_until = 10); /* only the adaptive mode defers */
#undef REFUSED
    {
        uint32_t bits = 0;
        char name[64];
        EXPECT_OK(NULL, fg_policy_parse("snapshot+local", &bits));
        EXPECT(bits == (FG_KEEP_SNAPSHOT | FG_KEEP_LOCAL), "snapshot+local parses to 0x%x", (unsigned)bits);
        EXPECT_OK(NULL, fg_policy_name(bits, name, sizeof name));
        EXPECT(!strcmp(name, "snapshot+local"), "0x%x is named %s", (unsigned)bits, name);
    }
    EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_compression_params_validate(NULL));
    const float bad_T[] = {0.0f, -0.5f, 1.5f, NAN};
    for (int i = 0; i < 4; i++) {
        fg_compression_params_default(&cp);
        cp.threshold = bad_T[i];
        EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_compression_params_validate(&cp));
    }
    const float bad_r[] = {-0.1f, 1.1f, NAN};
    for (int i = 0; i < 3; i++) {
        fg_compression_params_default(&cp);
        cp.shortlist[1].ratio_local = bad_r[i];
        EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_compression_params_validate(&cp));
        fg_compression_params_default(&cp);
        cp.shortlist[2].ratio_frequent = bad_r[i];
        EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_compression_params_validate(&cp));
    }
    fg_compression_params_default(&cp);
    cp.n_policies = 0;
    EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_compression_params_validate(&cp));
    cp.n_policies = FG_MAX_SHORTLIST + 1;
    EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_compression_params_validate(&cp));
    fg_compression_params_default(&cp);
    cp.shortlist[0].components = 0;
    EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_compression_params_validate(&cp));
    cp.shortlist[0].components = 1u << 7;
    EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_compression_params_validate(&cp));
    fg_compression_params_default(&cp);
    cp.shortlist[0].local_tokens = -1;
    EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_compression_params_validate(&cp));
    fg_compression_params_default(&cp);
    cp.n_sink = -1;
    EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_compression_params_validate(&cp));
    fg_compression_params_default(&cp);
    cp.score_mode = (fg_score_mode)5;
    EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_compression_params_validate(&cp));
    fg_compression_params_default(&cp);
    cp.observation_window = -3;
    EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_compression_params_validate(&cp));

    uint32_t comp = 0;
    EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_policy_parse(NULL, &comp));
    EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_policy_parse("special", NULL));
    EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_policy_parse("special+bogus", &comp));
    EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_policy_parse("special+", &comp));
    EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_policy_parse("", &comp));
    EXPECT_OK(NULL, fg_policy_parse("punct+special+local", &comp));
    char name[64];
    EXPECT_OK(NULL, fg_policy_name(comp, name, sizeof name));
    EXPECT(strcmp(name, "special+punct+local") == 0, "canonical name %s", name);
    EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_policy_name(comp, NULL, 10));
    EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_policy_name(comp, name, 0));
    EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_policy_name(0, name, sizeof name));
    EXPECT_STATUS(NULL, FG_ERR_CAPACITY, fg_policy_name(comp, name, 5));

    /* the rows an entry's ratios give: the library's w(t) and k(t), what the CLI's matching predicts with */
    fg_policy e = {FG_KEEP_FREQUENT | FG_KEEP_LOCAL, 0.3f, 0.1f, 0, 0};
    int32_t w = -1, k = -1;
    EXPECT_OK(NULL, fg_policy_rows(&e, 100, &w, &k));
    EXPECT(w == 30 && k == 10, "w(100) = %d, k(100) = %d at 0.3 / 0.1", (int)w, (int)k);
    EXPECT_OK(NULL, fg_policy_rows(&e, 7, &w, NULL)); /* ceil(2.1) */
    EXPECT(w == 3, "w(7) = %d", (int)w);
    e.ratio_local = 0.0f;
    e.local_tokens = 5;
    e.frequent_tokens = 4;
    EXPECT_OK(NULL, fg_policy_rows(&e, 1000, &w, &k));
    EXPECT(w == 1 && k == 4, "a zero window keeps 1 row, the cap bounds k: %d, %d", (int)w, (int)k);
    EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_policy_rows(NULL, 10, &w, &k));
    EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_policy_rows(&e, 0, &w, &k));
    e.ratio_frequent = NAN;
    EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_policy_rows(&e, 10, &w, &k));
    EXPECT(strstr(fg_last_error(NULL), "ratios") != NULL, "message: %s", fg_last_error(NULL));

    /* the presets by index: each one loads, and the list ends */
    int32_t n_presets = 0;
    for (const char *pn; (pn = fg_compression_preset_name(n_presets)); n_presets++)
        EXPECT_OK(NULL, fg_compression_params_preset(pn, &cp));
    EXPECT(n_presets == 11, "%d presets listed", (int)n_presets);
    EXPECT(fg_compression_preset_name(-1) == NULL, "no preset at -1");
    EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_compression_params_preset("bogus", &cp));
    EXPECT(strstr(fg_last_error(NULL), "fastgen-adaptive") && strstr(fg_last_error(NULL), "tova"),
           "the refusal lists the presets: %s", fg_last_error(NULL));
}

static void test_context_create(const synth *syn) {
    fg_context *ctx = NULL;
    fg_context_params p = base_params(syn);
    EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_context_create(NULL, &ctx));
    EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_context_create(&p, NULL));
#define BAD_PARAM(field, value, status)                                                                                \
    do {                                                                                                               \
        fg_context_params bp = base_params(syn);                                                                       \
        bp.field = value;                                                                                              \
        EXPECT_STATUS(NULL, status, fg_context_create(&bp, &ctx));                                                     \
        EXPECT(ctx == NULL, "no context after a failed create (" #field ")");                                          \
    } while (0)
    BAD_PARAM(n_layers, 0, FG_ERR_INVALID_ARGUMENT);
    BAD_PARAM(n_q_heads, -1, FG_ERR_INVALID_ARGUMENT);
    BAD_PARAM(n_kv_heads, 0, FG_ERR_INVALID_ARGUMENT);
    BAD_PARAM(n_kv_heads, 3, FG_ERR_INVALID_ARGUMENT); /* 10 % 3 != 0 */
    BAD_PARAM(head_dim, 0, FG_ERR_INVALID_ARGUMENT);
    BAD_PARAM(kv_dtype, (fg_dtype)9, FG_ERR_INVALID_ARGUMENT);
    { /* quantized rows need blocks of 8, 16 or 32 values */
        fg_context_params bp = base_params(syn);
        bp.kv_dtype = FG_DTYPE_Q4_0;
        bp.head_dim = 12;
        EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_context_create(&bp, &ctx));
        EXPECT(ctx == NULL && strstr(fg_last_error(NULL), "q4_0") && strstr(fg_last_error(NULL), "multiple of 8"),
               "a q4_0 cache of head_dim 12 is refused, saying why: %s", fg_last_error(NULL));
    }
    BAD_PARAM(v_dtype, 9, FG_ERR_INVALID_ARGUMENT);
    BAD_PARAM(v_dtype, -2, FG_ERR_INVALID_ARGUMENT);
    { /* V apart from K: its rows need blocks too; bytes held are K's rows plus V's */
        fg_context_params bp = base_params(syn);
        bp.kv_dtype = FG_DTYPE_F16;
        bp.v_dtype = FG_DTYPE_Q8_0;
        bp.head_dim = 12;
        EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_context_create(&bp, &ctx));
        EXPECT(ctx == NULL && strstr(fg_last_error(NULL), "v_dtype q8_0"), "a q8_0 V of head_dim 12 is refused: %s",
               fg_last_error(NULL));
        bp = base_params(syn);
        bp.kv_dtype = FG_DTYPE_Q8_0;
        bp.v_dtype = FG_DTYPE_F16;
        EXPECT_OK(NULL, fg_context_create(&bp, &ctx));
        int32_t seq = -1, tokens[N];
        for (int32_t i = 0; i < N; i++)
            tokens[i] = synth_token(syn, i);
        EXPECT_OK(ctx, fg_seq_create(ctx, NULL, tokens, N, &seq));
        prefill_all(ctx, syn, tokens, seq);
        fg_memory_stats m;
        EXPECT_OK(ctx, fg_memory(ctx, -1, &m));
        const size_t pair = fg_kv_row_bytes(FG_DTYPE_Q8_0, bp.head_dim) + fg_kv_row_bytes(FG_DTYPE_F16, bp.head_dim),
                     rows = (size_t)(N + bp.page_tokens - 1) / (size_t)bp.page_tokens * (size_t)bp.page_tokens,
                     want = (size_t)bp.n_layers * (size_t)bp.n_kv_heads * rows * pair;
        EXPECT(m.kv_bytes_full == want, "K q8_0 and V f16: a full cache of %d tokens is %zu bytes, want %zu", (int)N,
               m.kv_bytes_full, want);
        fg_context_destroy(&ctx);
    }
    fg_dtype dt = FG_DTYPE_F32;
    EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_dtype_parse("q5_0", &dt));
    EXPECT(dt == FG_DTYPE_F32 && strstr(fg_last_error(NULL), "q8_0"), "fg_dtype_parse lists the names: %s",
           fg_last_error(NULL));
    EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_dtype_parse(NULL, &dt));
    for (int i = 0; i <= FG_DTYPE_Q4_0; i++)
        EXPECT(fg_dtype_parse(fg_dtype_name((fg_dtype)i), &dt) == FG_OK && dt == (fg_dtype)i, "dtype %d round-trips",
               i);
    EXPECT(fg_dtype_name((fg_dtype)5) == NULL && fg_dtype_name((fg_dtype)-1) == NULL, "no name outside the enum");
    /* ggml's blocks: 2 + 32 bytes (q8_0) and 2 + 16 (q4_0) per 32 values; blocks of 16 and 8 below 32 */
    EXPECT(fg_kv_row_bytes(FG_DTYPE_Q8_0, 64) == 68 && fg_kv_row_bytes(FG_DTYPE_Q4_0, 64) == 36 &&
               fg_kv_row_bytes(FG_DTYPE_Q8_0, 16) == 18 && fg_kv_row_bytes(FG_DTYPE_Q4_0, 8) == 6 &&
               fg_kv_row_bytes(FG_DTYPE_Q8_0, 24) == 30 && fg_kv_row_bytes(FG_DTYPE_F16, 64) == 128 &&
               fg_kv_row_bytes(FG_DTYPE_Q8_0, 12) == 0 && fg_kv_row_bytes((fg_dtype)7, 64) == 0 &&
               fg_kv_row_bytes(FG_DTYPE_F32, 0) == 0,
           "fg_kv_row_bytes");
    BAD_PARAM(max_seqs, 0, FG_ERR_INVALID_ARGUMENT);
    BAD_PARAM(max_seq_len, -4, FG_ERR_INVALID_ARGUMENT);
    BAD_PARAM(page_tokens, 0, FG_ERR_INVALID_ARGUMENT);
    BAD_PARAM(pool_chunk_pages, 0, FG_ERR_INVALID_ARGUMENT);
    BAD_PARAM(n_threads, -2, FG_ERR_INVALID_ARGUMENT);
    BAD_PARAM(n_threads, FG_MAX_THREADS + 1, FG_ERR_INVALID_ARGUMENT); /* libgomp ended the process at 2000 */
    EXPECT(strstr(fg_last_error(NULL), "n_threads") != NULL, "the message says why: %s", fg_last_error(NULL));
    BAD_PARAM(n_threads, 100000, FG_ERR_INVALID_ARGUMENT);
    BAD_PARAM(classes, NULL, FG_ERR_INVALID_ARGUMENT);
    BAD_PARAM(act_dtype, FG_DTYPE_Q8_0, FG_ERR_INVALID_ARGUMENT); /* f32, f16 or bf16 */
    EXPECT(strstr(fg_last_error(NULL), "act_dtype") != NULL, "the message says why: %s", fg_last_error(NULL));
    BAD_PARAM(act_dtype, -1, FG_ERR_INVALID_ARGUMENT);
    BAD_PARAM(backend, "tpu", FG_ERR_INVALID_ARGUMENT);
    BAD_PARAM(backend, "a-backend-name-longer-than-sixteen", FG_ERR_INVALID_ARGUMENT);
#undef BAD_PARAM
    EXPECT(strstr(fg_last_error(NULL), "backend") != NULL, "message names the backend: %s", fg_last_error(NULL));
    p.backend = "cuda";
    fg_status st = fg_context_create(&p, &ctx);
    if (st != FG_OK) {
        /* not compiled in: how to build it; compiled in without a device: why not */
        EXPECT(st == FG_ERR_UNAVAILABLE && (strstr(fg_last_error(NULL), "meson setup") != NULL ||
                                            strstr(fg_last_error(NULL), "no device") != NULL),
               "cuda refuses with a reason: %s", fg_last_error(NULL));
        EXPECT(fg_backend_probe("cuda") == FG_ERR_UNAVAILABLE, "probe cuda");
    }
    fg_context_destroy(&ctx);
    EXPECT(fg_backend_probe("hip") == FG_OK || fg_backend_probe("hip") == FG_ERR_UNAVAILABLE, "probe hip");
    EXPECT(fg_backend_probe("ref") == FG_OK && fg_backend_probe("cpu") == FG_OK, "probe ref, cpu");
    EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_backend_probe(NULL));
    EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_backend_probe("nope"));
    fg_context_destroy(NULL);
    ctx = NULL;
    fg_context_destroy(&ctx);
}

/* fastgen.h's "Growth": structs of an older header (their last field
 * missing) and of a newer one (bytes past this library's) through the
 * _sized entry points, as a program built against that header calls them. */
static void test_struct_growth(const synth *syn, const int32_t *tokens) {
    enum { GUARD = 24 };
    const unsigned char mark = 0xA5;
    const size_t old_ctx = offsetof(fg_context_params, v_dtype), cur_ctx = sizeof(fg_context_params);
    union {
        fg_context_params p;
        unsigned char b[sizeof(fg_context_params) + GUARD];
    } cp;
    memset(cp.b, mark, sizeof cp.b);
    fg_context_params_default_sized(&cp.p, old_ctx); /* an old program's default: its bytes only */
    int untouched = 1;
    for (size_t i = old_ctx; i < sizeof cp.b; i++)
        untouched &= cp.b[i] == mark;
    EXPECT(untouched, "the default of an old-size struct writes nothing past its size");
    const fg_context_params want = base_params(syn);
    memcpy(&cp.p, &want, old_ctx); /* the fields the old header had */
    fg_context *old = NULL, *cur = NULL;
    EXPECT_OK(NULL, fg_context_create_sized(&cp.p, old_ctx, &old)); /* v_dtype (past it) takes its default */
    EXPECT_OK(NULL, fg_context_create(&want, &cur));
    int32_t s_old = -1, s_cur = -1;
    if (old && cur) {
        EXPECT_OK(old, fg_seq_create(old, NULL, tokens, N, &s_old));
        EXPECT_OK(cur, fg_seq_create(cur, NULL, tokens, N, &s_cur));
        prefill_all(old, syn, tokens, s_old);
        prefill_all(cur, syn, tokens, s_cur);
        /* an old-size output: the fields it has, nothing past it */
        union {
            fg_memory_stats m;
            unsigned char b[sizeof(fg_memory_stats) + GUARD];
        } ms;
        const size_t old_ms = offsetof(fg_memory_stats, kv_bytes_alone);
        memset(ms.b, mark, sizeof ms.b);
        fg_memory_stats full;
        EXPECT_OK(old, fg_memory_sized(old, s_old, &ms.m, old_ms));
        EXPECT_OK(cur, fg_memory(cur, s_cur, &full));
        untouched = 1;
        for (size_t i = old_ms; i < sizeof ms.b; i++)
            untouched &= ms.b[i] == mark;
        EXPECT(untouched && memcmp(&ms.m, &full, old_ms) == 0,
               "an old fg_memory_stats gets its fields (V as kv_dtype, as the full struct's context) and no more");
        union {
            fg_head_info h;
            unsigned char b[sizeof(fg_head_info) + GUARD];
        } hi;
        const size_t old_hi = offsetof(fg_head_info, kv_bytes_shared);
        memset(hi.b, mark, sizeof hi.b);
        EXPECT_OK(old, fg_head_inspect_sized(old, s_old, 0, 0, &hi.h, old_hi));
        EXPECT(hi.b[old_hi] == mark && hi.h.kept > 0, "an old fg_head_info: its fields, nothing past them");
        /* a newer header's output: the fields past this library's are zero, their defaults */
        memset(hi.b, mark, sizeof hi.b);
        EXPECT_OK(old, fg_head_inspect_sized(old, s_old, 0, 0, &hi.h, sizeof hi.b));
        EXPECT(hi.b[sizeof(fg_head_info)] == 0 && hi.b[sizeof hi.b - 1] == 0, "a newer fg_head_info's tail is zeroed");
        EXPECT_STATUS(old, FG_ERR_INVALID_ARGUMENT, fg_memory_sized(old, s_old, &ms.m, 8));
        EXPECT(strstr(fg_last_error(old), "fg_memory_stats") != NULL, "message: %s", fg_last_error(old));
    }
    fg_context_destroy(&old);
    fg_context_destroy(&cur);

    /* a newer header's struct: accepted when its unknown fields are zero, refused when one is set */
    memset(cp.b, 0, sizeof cp.b);
    memcpy(&cp.p, &want, cur_ctx);
    EXPECT_OK(NULL, fg_context_create_sized(&cp.p, sizeof cp.b, &old));
    fg_context_destroy(&old);
    cp.b[cur_ctx + 3] = 1;
    EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_context_create_sized(&cp.p, sizeof cp.b, &old));
    EXPECT(old == NULL && strstr(fg_last_error(NULL), "newer fastgen.h") != NULL, "message: %s", fg_last_error(NULL));
    EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_context_create_sized(&cp.p, old_ctx - 4, &old));
    EXPECT(old == NULL && strstr(fg_last_error(NULL), "sizeof") != NULL, "too small: %s", fg_last_error(NULL));

    /* compression params of an old header: the preset's fields it has; defer_until past it is 0 */
    const size_t old_cp = offsetof(fg_compression_params, defer_until);
    union {
        fg_compression_params c;
        unsigned char b[sizeof(fg_compression_params) + GUARD];
    } cc;
    memset(cc.b, mark, sizeof cc.b);
    EXPECT_OK(NULL, fg_compression_params_preset_sized("fastgen-adaptive", &cc.c, old_cp));
    EXPECT(cc.b[old_cp] == mark && cc.c.allocation == FG_ALLOC_ADAPTIVE, "an old preset: its fields only");
    EXPECT_OK(NULL, fg_compression_params_validate_sized(&cc.c, old_cp));
    EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_compression_params_validate_sized(&cc.c, sizeof cc.b));
    EXPECT(strstr(fg_last_error(NULL), "newer fastgen.h") != NULL, "the guard bytes read as a newer header's fields: %s",
           fg_last_error(NULL));
    fg_context_params one = want;
    one.max_seqs = 1;
    EXPECT_OK(NULL, fg_context_create(&one, &old));
    if (old) {
        EXPECT_OK(old, fg_seq_create_sized(old, &cc.c, old_cp, tokens, N, &s_old));
        EXPECT_OK(old, fg_seq_destroy(old, s_old));
        /* the context's default for sequences: validated, refused without a change */
        fg_compression_params bad;
        fg_compression_params_default(&bad);
        bad.threshold = 1.01f;
        EXPECT_STATUS(old, FG_ERR_INVALID_ARGUMENT, fg_context_set_compression(old, &bad));
        EXPECT(strstr(fg_last_error(old), "threshold") != NULL, "message: %s", fg_last_error(old));
        EXPECT_STATUS(old, FG_ERR_INVALID_ARGUMENT, fg_context_set_compression(old, NULL));
        EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_context_set_compression(NULL, &bad));
        EXPECT_OK(old, fg_seq_create(old, NULL, tokens, N, &s_old));
        prefill_all(old, syn, tokens, s_old);
    }

    /* hostile sizes (SIZE_MAX, a negative int cast, past any version): refused before a byte is read or
     * written; the _default calls, which return nothing, write nothing */
    const size_t hostile[] = {SIZE_MAX, (size_t)-8, 4097, (size_t)1 << 20};
    for (size_t h = 0; h < sizeof hostile / sizeof hostile[0]; h++) {
        const size_t size = hostile[h];
        fg_context *made = NULL;
        EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_context_create_sized(&want, size, &made));
        EXPECT(made == NULL && strstr(fg_last_error(NULL), "no version"), "size %zu: %s", size, fg_last_error(NULL));
        memset(cc.b, mark, sizeof cc.b);
        memset(cp.b, mark, sizeof cp.b);
        fg_compression_params_default_sized(&cc.c, size);
        fg_context_params_default_sized(&cp.p, size);
        EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_compression_params_preset_sized("h2o", &cc.c, size));
        EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_compression_params_validate_sized(&cc.c, size));
        untouched = 1;
        for (size_t i = 0; i < sizeof cc.b; i++)
            untouched &= cc.b[i] == mark;
        for (size_t i = 0; i < sizeof cp.b; i++)
            untouched &= cp.b[i] == mark;
        EXPECT(untouched, "size %zu: a default or a preset wrote its struct", size);
        if (!old)
            continue;
        union {
            fg_memory_stats m;
            fg_head_info hi;
            unsigned char b[sizeof(fg_head_info) + sizeof(fg_memory_stats) + GUARD];
        } outs;
        memset(outs.b, mark, sizeof outs.b);
        int32_t s_new = -1;
        fg_compression_params h2o;
        fg_compression_params_preset("h2o", &h2o);
        EXPECT_STATUS(old, FG_ERR_INVALID_ARGUMENT, fg_memory_sized(old, s_old, &outs.m, size));
        EXPECT_STATUS(old, FG_ERR_INVALID_ARGUMENT, fg_head_inspect_sized(old, s_old, 0, 0, &outs.hi, size));
        EXPECT_STATUS(old, FG_ERR_INVALID_ARGUMENT, fg_seq_create_sized(old, &h2o, size, tokens, N, &s_new));
        EXPECT_STATUS(old, FG_ERR_INVALID_ARGUMENT, fg_context_set_compression_sized(old, &h2o, size));
        untouched = s_new == -1;
        for (size_t i = 0; i < sizeof outs.b; i++)
            untouched &= outs.b[i] == mark;
        EXPECT(untouched, "size %zu: an output struct was written, or a sequence made", size);
    }
    fg_context_destroy(&old);
}

static void test_calls(twin *t) {
    fg_context *c = t->bad;
    float q[N * HQ * D] = {0}, k[N * HKV * D] = {0}, v[N * HKV * D] = {0}, out[N * HQ * D];
    int32_t s2 = -1, n_out = -1, pos[MAXLEN];
    const int32_t tok = t->tokens[t->pos];

    /* sequences */
    EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_seq_create(NULL, NULL, t->tokens, N, &s2));
    EXPECT_STATUS(c, FG_ERR_INVALID_ARGUMENT, fg_seq_create(c, NULL, NULL, N, &s2));
    EXPECT_STATUS(c, FG_ERR_INVALID_ARGUMENT, fg_seq_create(c, NULL, t->tokens, 0, &s2));
    EXPECT_STATUS(c, FG_ERR_INVALID_ARGUMENT, fg_seq_create(c, NULL, t->tokens, -3, &s2));
    EXPECT_STATUS(c, FG_ERR_CAPACITY, fg_seq_create(c, NULL, t->tokens, MAXLEN + 1, &s2));
    step_both(t, "bad seq_create");
    int32_t bad_tokens[3] = {1, SYNTH_VOCAB, 4};
    EXPECT_STATUS(c, FG_ERR_INVALID_ARGUMENT, fg_seq_create(c, NULL, bad_tokens, 3, &s2));
    bad_tokens[1] = -7;
    EXPECT_STATUS(c, FG_ERR_INVALID_ARGUMENT, fg_seq_create(c, NULL, bad_tokens, 3, &s2));
    fg_compression_params cp;
    fg_compression_params_default(&cp);
    cp.threshold = 0.0f;
    EXPECT_STATUS(c, FG_ERR_INVALID_ARGUMENT, fg_seq_create(c, &cp, t->tokens, N, &s2));
    EXPECT(strstr(fg_last_error(c), "threshold") != NULL, "context message names T: %s", fg_last_error(c));
    step_both(t, "bad tokens or params");
    EXPECT_OK(c, fg_seq_create(c, NULL, t->tokens, N, &s2));
    int32_t s3 = -1;
    EXPECT_STATUS(c, FG_ERR_CAPACITY, fg_seq_create(c, NULL, t->tokens, N, &s3)); /* max_seqs = 2 */
    EXPECT_STATUS(c, FG_ERR_INVALID_ARGUMENT, fg_seq_destroy(c, 7));
    EXPECT_STATUS(c, FG_ERR_INVALID_ARGUMENT, fg_seq_destroy(c, -1));
    EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_seq_destroy(NULL, 0));
    int32_t len = -1;
    EXPECT_STATUS(c, FG_ERR_INVALID_ARGUMENT, fg_seq_length(c, s2, L, &len));
    EXPECT_STATUS(c, FG_ERR_INVALID_ARGUMENT, fg_seq_length(c, s2, 0, NULL));
    EXPECT_OK(c, fg_seq_length(c, s2, 0, &len));
    EXPECT(len == 0, "not prefilled: length 0");

    /* prefill */
    EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_prefill(NULL, s2, 0, q, k, v, out));
    EXPECT_STATUS(c, FG_ERR_INVALID_ARGUMENT, fg_prefill(c, 9, 0, q, k, v, out));
    EXPECT_STATUS(c, FG_ERR_INVALID_ARGUMENT, fg_prefill(c, s2, -1, q, k, v, out));
    EXPECT_STATUS(c, FG_ERR_INVALID_ARGUMENT, fg_prefill(c, s2, L, q, k, v, out));
    EXPECT_STATUS(c, FG_ERR_INVALID_ARGUMENT, fg_prefill(c, s2, 0, NULL, k, v, out));
    EXPECT_STATUS(c, FG_ERR_INVALID_ARGUMENT, fg_prefill(c, s2, 0, q, k, v, NULL));
    EXPECT_STATUS(c, FG_ERR_BAD_STATE, fg_prefill(c, t->seq_bad, 0, q, k, v, out)); /* twice */
    step_both(t, "bad prefill");

    /* decode */
    const int32_t ids2[2] = {t->seq_bad, t->seq_bad};
    const int32_t toks2[2] = {tok, tok};
    float dq[2 * HQ * D] = {0}, dk[2 * HKV * D] = {0}, dv[2 * HKV * D] = {0}, dout[2 * HQ * D];
    EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_decode(NULL, 0, 1, &t->seq_bad, &tok, dq, dk, dv, dout));
    EXPECT_STATUS(c, FG_ERR_INVALID_ARGUMENT, fg_decode(c, 0, 1, NULL, &tok, dq, dk, dv, dout));
    EXPECT_STATUS(c, FG_ERR_INVALID_ARGUMENT, fg_decode(c, 0, 1, &t->seq_bad, NULL, dq, dk, dv, dout));
    EXPECT_STATUS(c, FG_ERR_INVALID_ARGUMENT, fg_decode(c, 0, 1, &t->seq_bad, &tok, dq, dk, NULL, dout));
    EXPECT_STATUS(c, FG_ERR_INVALID_ARGUMENT, fg_decode(c, L, 1, &t->seq_bad, &tok, dq, dk, dv, dout));
    EXPECT_STATUS(c, FG_ERR_INVALID_ARGUMENT, fg_decode(c, 0, 0, &t->seq_bad, &tok, dq, dk, dv, dout));
    EXPECT_STATUS(c, FG_ERR_INVALID_ARGUMENT, fg_decode(c, 0, 3, ids2, toks2, dq, dk, dv, dout));
    EXPECT_STATUS(c, FG_ERR_INVALID_ARGUMENT, fg_decode(c, 0, 2, ids2, toks2, dq, dk, dv, dout)); /* twice */
    const int32_t mixed[2] = {t->seq_bad, s2};
    EXPECT_STATUS(c, FG_ERR_BAD_STATE, fg_decode(c, 0, 2, mixed, toks2, dq, dk, dv, dout)); /* s2 not prefilled */
    EXPECT(strstr(fg_last_error(c), "prefill") != NULL, "decode before prefill: %s", fg_last_error(c));
    const int32_t bad_tok = SYNTH_VOCAB + 3;
    EXPECT_STATUS(c, FG_ERR_INVALID_ARGUMENT, fg_decode(c, 0, 1, &t->seq_bad, &bad_tok, dq, dk, dv, dout));
    step_both(t, "bad decode");

    /* arrays at addresses that are not a multiple of a float's size: refused, nothing read */
    static union {
        float f[2 * HQ * D + 1];
        char b[sizeof(float) * (2 * HQ * D + 1)];
    } odd;
    float *const q_odd = (float *)(void *)(odd.b + 1), *const v_odd = (float *)(void *)(odd.b + 2);
    EXPECT_STATUS(c, FG_ERR_INVALID_ARGUMENT, fg_decode(c, 0, 1, &t->seq_bad, &tok, q_odd, dk, dv, dout));
    EXPECT(strstr(fg_last_error(c), "q at") && strstr(fg_last_error(c), "aligned"), "misaligned q: %s",
           fg_last_error(c));
    EXPECT_STATUS(c, FG_ERR_INVALID_ARGUMENT, fg_decode(c, 0, 1, &t->seq_bad, &tok, dq, dk, v_odd, dout));
    EXPECT_STATUS(c, FG_ERR_INVALID_ARGUMENT, fg_decode(c, 0, 1, &t->seq_bad, &tok, dq, dk, dv, q_odd));
    EXPECT(strstr(fg_last_error(c), "out at") != NULL, "misaligned out: %s", fg_last_error(c));
    EXPECT_STATUS(c, FG_ERR_INVALID_ARGUMENT, fg_seq_append(c, t->seq_bad, 0, &tok, 1, dq, q_odd, dv, dout));
    EXPECT(strstr(fg_last_error(c), "fg_seq_append: k at") != NULL, "misaligned k: %s", fg_last_error(c));
    EXPECT_STATUS(c, FG_ERR_INVALID_ARGUMENT, fg_prefill(c, s2, 0, q_odd, k, v, out));
    step_both(t, "misaligned arrays");

    /* every layer must see the same token at a position */
    float q1[HQ * D], k1[HKV * D], v1[HKV * D];
    const int32_t other = (tok + 1) % SYNTH_VOCAB;
    synth_qkv(t->syn, 0, &t->tokens[t->pos], t->pos, 1, q1, k1, v1);
    EXPECT_OK(c, fg_decode(c, 0, 1, &t->seq_bad, &tok, q1, k1, v1, dout));
    synth_qkv(t->syn, 1, &t->tokens[t->pos], t->pos, 1, q1, k1, v1);
    EXPECT_STATUS(c, FG_ERR_INVALID_ARGUMENT, fg_decode(c, 1, 1, &t->seq_bad, &other, q1, k1, v1, dout));
    EXPECT_OK(c, fg_decode(c, 1, 1, &t->seq_bad, &tok, q1, k1, v1, dout));
    for (int32_t l = 0; l < L; l++) {
        synth_qkv(t->syn, l, &t->tokens[t->pos], t->pos, 1, q1, k1, v1);
        EXPECT_OK(t->good, fg_decode(t->good, l, 1, &t->seq_good, &tok, q1, k1, v1, dout));
    }
    t->pos++;
    step_both(t, "a token that differs between layers");

    /* inspection */
    fg_head_info info;
    EXPECT_STATUS(c, FG_ERR_INVALID_ARGUMENT, fg_head_inspect(c, t->seq_bad, 0, HKV, &info));
    EXPECT_STATUS(c, FG_ERR_INVALID_ARGUMENT, fg_head_inspect(c, t->seq_bad, 0, 0, NULL));
    EXPECT_STATUS(c, FG_ERR_BAD_STATE, fg_head_inspect(c, s2, 0, 0, &info));
    EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_head_inspect(NULL, 0, 0, 0, &info));
    float ranks[4] = {0};
    EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_seq_observe_scores(NULL, 0, 0, ranks, 1));
    EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_seq_observed_ranks(NULL, 0, 0, ranks, 1));
    EXPECT_STATUS(c, FG_ERR_BAD_STATE, fg_seq_observed_ranks(c, s2, 0, ranks, 1)); /* not adaptive */
    EXPECT(strstr(fg_last_error(c), "FG_OBSERVE_SCORES") != NULL, "says why: %s", fg_last_error(c));
    EXPECT_STATUS(c, FG_ERR_INVALID_ARGUMENT, fg_head_positions(c, t->seq_bad, 0, 0, pos, MAXLEN, NULL));
    EXPECT_STATUS(c, FG_ERR_CAPACITY, fg_head_positions(c, t->seq_bad, 0, 4, pos, 1, &n_out));
    EXPECT(n_out > 1, "a short buffer still reports the kept count (%d)", (int)n_out);
    fg_memory_stats m;
    EXPECT_STATUS(c, FG_ERR_INVALID_ARGUMENT, fg_memory(c, 0, NULL));
    EXPECT_STATUS(c, FG_ERR_INVALID_ARGUMENT, fg_memory(c, 5, &m));
    EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_memory(NULL, -1, &m));
    EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_trim(NULL));
    EXPECT(fg_context_backend(NULL) == NULL && strcmp(fg_context_backend(c), "ref") == 0, "backend name");
    EXPECT_OK(c, fg_seq_destroy(c, s2));
    EXPECT_STATUS(c, FG_ERR_INVALID_ARGUMENT, fg_seq_destroy(c, s2)); /* twice */
    step_both(t, "bad inspection");
    (void)q;
    (void)k;
    (void)v;
    (void)out;
}

/* A log callback that calls back into its own context, in the middle of the
 * call that logs: destroying the sequence being decoded, trimming the pool,
 * reading memory, destroying the context. Every such call is refused
 * (FG_ERR_BAD_STATE, nothing done), and the call that logged still reports
 * its own error. */
typedef struct reentry {
    fg_context *ctx;
    int32_t seq;
    int calls, refused, other;
    char last[600];
} reentry;

static void reentering_log(void *user, fg_log_level level, const char *message) {
    (void)level;
    reentry *r = user;
    snprintf(r->last, sizeof r->last, "%s", message);
    if (!r->ctx)
        return;
    r->calls++;
    fg_memory_stats m;
    const fg_status st[3] = {fg_seq_destroy(r->ctx, r->seq), fg_trim(r->ctx), fg_memory(r->ctx, -1, &m)};
    for (int i = 0; i < 3; i++) {
        r->refused += st[i] == FG_ERR_BAD_STATE;
        r->other += st[i] != FG_ERR_BAD_STATE;
    }
    EXPECT(strstr(fg_last_error(NULL), "log callback") != NULL, "a refused call from the callback: %s",
           fg_last_error(NULL));
    fg_context *copy = r->ctx;
    fg_context_destroy(&copy);
    r->other += copy == NULL; /* not destroyed: the handle stays */
}

/* A pool at its cap: the failing prefill or decode reports out of memory and
 * changes nothing; once pages are freed, decoding goes on exactly as in an
 * uncapped twin. Its log callback calls back into the context (reentering_log). */
static void test_pool_cap(synth *syn, const int32_t *tokens) {
    fg_context_params p = base_params(syn);
    p.pool_chunk_pages = 1; /* the pool grows page by page */
    p.max_seqs = 3;
    fg_compression_params full, tiny;
    fg_compression_params_preset("full", &full);
    fg_compression_params_preset("local", &tiny);
    tiny.shortlist[0].local_tokens = 1;
    fg_context *a = NULL, *b = NULL;
    EXPECT_OK(NULL, fg_context_create(&p, &a));
    EXPECT_OK(NULL, fg_context_create(&p, &b));
    int32_t sa = -1, sb = -1, filler = -1;
    EXPECT_OK(a, fg_seq_create(a, &full, tokens, N, &sa));
    EXPECT_OK(a, fg_seq_create(a, &tiny, tokens, N, &filler));
    EXPECT_OK(b, fg_seq_create(b, &full, tokens, N, &sb));
    prefill_all(a, syn, tokens, sa);
    prefill_all(a, syn, tokens, filler);
    prefill_all(b, syn, tokens, sb);
    fg_memory_stats m0, m;
    fg_memory(a, -1, &m0);
    fg_context_destroy(&a);

    /* the same again under a cap of exactly what that took */
    p.max_pool_bytes = m0.pool_bytes;
    reentry re = {0};
    p.log_fn = reentering_log;
    p.log_user = &re;
    EXPECT_OK(NULL, fg_context_create(&p, &a));
    EXPECT_OK(a, fg_seq_create(a, &full, tokens, N, &sa));
    re.ctx = a;
    re.seq = sa;
    EXPECT_OK(a, fg_seq_create(a, &tiny, tokens, N, &filler));
    prefill_all(a, syn, tokens, sa);
    float q[N * HQ * D], k[N * HKV * D], v[N * HKV * D], out[N * HQ * D];
    synth_qkv(syn, 0, tokens, 0, N, q, k, v);
    int32_t extra = -1;
    EXPECT_OK(a, fg_seq_create(a, &full, tokens, N, &extra));
    EXPECT_STATUS(a, FG_ERR_OUT_OF_MEMORY, fg_prefill(a, extra, 0, q, k, v, out));
    EXPECT(strstr(fg_last_error(a), "max_pool_bytes") != NULL, "the cap is named: %s", fg_last_error(a));
    EXPECT_OK(a, fg_seq_destroy(a, extra));
    prefill_all(a, syn, tokens, filler);

    /* the first decode needs an 11th page per full head (40 rows fill 10
     * pages of 4); the cap refuses it, the filler's 10 pages make room for
     * the next page boundary (4 tokens) */
    float dq[HQ * D], dk[HKV * D], dv[HKV * D], oa[HQ * D], ob[HQ * D];
    int refused = 0;
    for (int32_t pos = N; pos < N + 4; pos++) {
        for (int32_t l = 0; l < L; l++) {
            synth_qkv(syn, l, &tokens[pos], pos, 1, dq, dk, dv);
            fg_status st = fg_decode(a, l, 1, &sa, &tokens[pos], dq, dk, dv, oa);
            if (st == FG_ERR_OUT_OF_MEMORY) {
                refused++;
                int32_t len = -1;
                fg_seq_length(a, sa, l, &len);
                fg_memory(a, -1, &m);
                EXPECT(len == pos && m.pages_in_use == m0.pages_in_use,
                       "a refused decode changed nothing (length %d, %lld pages)", (int)len,
                       (long long)m.pages_in_use);
                EXPECT_OK(a, fg_seq_destroy(a, filler)); /* frees pages under the cap */
                st = fg_decode(a, l, 1, &sa, &tokens[pos], dq, dk, dv, oa);
            }
            EXPECT(st == FG_OK, "decode at %d: %s", (int)pos, fg_last_error(a));
            EXPECT_OK(b, fg_decode(b, l, 1, &sb, &tokens[pos], dq, dk, dv, ob));
            EXPECT(memcmp(oa, ob, sizeof oa) == 0, "capped and uncapped outputs differ at %d", (int)pos);
        }
    }
    EXPECT(refused == 1, "the cap refused one decode (%d)", refused);
    EXPECT(re.calls >= 2 && re.refused == 3 * re.calls && re.other == 0,
           "the log callback ran %d times; of its calls into the context %d were refused, %d were not", re.calls,
           re.refused, re.other);
    re.ctx = NULL;
    fg_context_destroy(&a);
    fg_context_destroy(&b);
}

/* fg_compression_params_parse: the knob goes where the preset takes it,
 * options set their fields, and every bad part is refused by name with the
 * output untouched. */
static void test_spec(void) {
    fg_compression_params p, want;
    EXPECT_OK(NULL, fg_compression_params_parse("fastgen-adaptive:0.25:observe=predicted:floor=0.5", &p));
    EXPECT(p.allocation == FG_ALLOC_ADAPTIVE && p.budget == 0.25f && p.observe == FG_OBSERVE_PREDICTED &&
               p.alloc_floor == 0.5f, "adaptive spec: budget %g observe %d floor %g", (double)p.budget,
           (int)p.observe, (double)p.alloc_floor);
    EXPECT_OK(NULL, fg_compression_params_parse("fastgen-adaptive:observe=scores:flags=mass", &p));
    EXPECT(p.observe == FG_OBSERVE_SCORES && p.adaptive_flags == 2u, "observe=scores spec (flags=mass: 2)");
    EXPECT_OK(NULL, fg_compression_params_parse("h2o:0.5", &p)); /* frequent + local: half each */
    EXPECT(p.n_policies == 1 && p.shortlist[0].ratio_local == 0.25f && p.shortlist[0].ratio_frequent == 0.25f,
           "h2o:0.5 split %g %g", (double)p.shortlist[0].ratio_local, (double)p.shortlist[0].ratio_frequent);
    EXPECT_OK(NULL, fg_compression_params_parse("snapkv:0.3:window=16:pool=5", &p));
    EXPECT(p.shortlist[0].ratio_local == 0.15f && p.shortlist[0].ratio_frequent == 0.15f &&
               p.observation_window == 16 && p.score_pool == 5, "snapkv spec: snapshot + window, half each");
    EXPECT_OK(NULL, fg_compression_params_parse("full", &p));
    EXPECT_OK(NULL, fg_compression_params_preset("full", &want));
    EXPECT(!memcmp(&p, &want, sizeof p), "\"full\" is the preset");
    EXPECT_OK(NULL, fg_compression_params_parse("streamingllm:0.5:sink=8", &p));
    EXPECT(p.n_sink == 8 && p.shortlist[0].ratio_local == 0.5f, "streamingllm spec");
    static const char *const bad[] = {
        "", "nosuch", "nosuch:0.5", "h2o:0", "h2o:1.5", "h2o:nan", "h2o:0.5x", "full:0.5", "fastgen:0.5",
        "h2o:0.5:bogus=1", "h2o:0.5:window", "h2o:0.5:window=-1", "h2o:pool=3", "fastgen-adaptive:observe=x",
        "fastgen-adaptive:families=9", "fastgen-adaptive:flags=per-layer+nope", "fastgen-adaptive:tol=1",
        "h2o:0.5:0.5", "h2o:alloc=adaptive", "h2o: 0.5", "h2o:0.5:window= 8", "h2o:observe=scores",
        "fastgen-adaptive:observe=scores:flags=end",
        "fastgen-adaptive:0.5:window=1:window=1:window=1:window=1:window=1:window=1:window=1:window=1:window=1:"
        "window=1:window=1:window=1:window=1:window=1:window=1:window=1:window=1:window=1:window=1:window=1:"
        "window=1:window=1:window=1:window=1:window=1:window=1:window=1:window=1:window=1:window=1:window=1"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        memset(&p, 0x5a, sizeof p);
        memset(&want, 0x5a, sizeof want);
        EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_compression_params_parse(bad[i], &p));
        EXPECT(fg_last_error(NULL)[0] != '\0', "\"%s\": a message", bad[i]);
        EXPECT(!memcmp(&p, &want, sizeof p), "\"%s\": the output untouched", bad[i]);
    }
    EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_compression_params_parse(NULL, &p));
    EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_compression_params_parse("full", NULL));
    EXPECT_STATUS(NULL, FG_ERR_INVALID_ARGUMENT, fg_compression_params_parse_sized("full", &p, SIZE_MAX));
}

int main(void) {
    test_seed("test_errors");
    synth syn;
    EXPECT(synth_create(L, HQ, HKV, D, 11, &syn) == FG_OK, "synth");
    test_params_and_classes();
    test_context_create(&syn);

    twin t = {.syn = &syn, .pos = N};
    for (int32_t i = 0; i < MAXLEN; i++)
        t.tokens[i] = synth_token(&syn, i);
    test_struct_growth(&syn, t.tokens);
    fg_context_params p = base_params(&syn);
    EXPECT_OK(NULL, fg_context_create(&p, &t.bad));
    EXPECT_OK(NULL, fg_context_create(&p, &t.good));
    EXPECT_OK(t.bad, fg_seq_create(t.bad, NULL, t.tokens, N, &t.seq_bad));
    EXPECT_OK(t.good, fg_seq_create(t.good, NULL, t.tokens, N, &t.seq_good));
    prefill_all(t.bad, &syn, t.tokens, t.seq_bad);
    prefill_all(t.good, &syn, t.tokens, t.seq_good);
    step_both(&t, "prefill");
    test_calls(&t);

    /* a sequence past its maximum length */
    while (t.pos < MAXLEN)
        step_both(&t, "filling up");
    float dq[HQ * D] = {0}, dk[HKV * D] = {0}, dv[HKV * D] = {0}, dout[HQ * D];
    EXPECT_STATUS(t.bad, FG_ERR_CAPACITY, fg_decode(t.bad, 0, 1, &t.seq_bad, &t.tokens[0], dq, dk, dv, dout));
    fg_context_destroy(&t.bad);
    fg_context_destroy(&t.good);

    test_pool_cap(&syn, t.tokens);
    synth_destroy(&syn);
    test_spec();
    return test_finish();
}
