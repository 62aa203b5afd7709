/*
 * Real model end to end (suite `model`): stories260K through the public API.
 *   - the tokenizer encodes and decodes the reference prompt;
 *   - with the `full` policy, greedy decoding reproduces llama2.c's reference
 *     text byte for byte, on every backend and cache dtype;
 *   - FastGen gives the same text on `cpu` as on `ref`, and holds less memory;
 *   - sequences decoded in one batch, each with its own policy, match the
 *     same sequences decoded alone;
 *   - a prompt longer than the context is refused cleanly;
 *   - the key scorer: its ridge fit recovers a linear function, its file
 *     round-trips and a bad one is refused; a runner with one compresses an
 *     observe=scores prompt at its prefill's end, one without refuses it and
 *     keeps no sequence.
 * Usage: test_model MODEL_DIR [BACKEND]   (BACKEND, e.g. cuda: its FastGen text
 * must equal ref's; exit 77 when it is not available here)
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "tests/support/harness.h"
#include "model/llama2c.h"
#include "model/runner.h"
#include "model/scorer.h"
#include "model/tokenizer.h"

static const char *k_reference =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, she saw "
    "a big, red ball. She wanted to play with it, but it was too high.\nLily";

typedef struct model_env {
    fgm_llama_model model;
    fgm_tokenizer tok;
    int32_t prompt[64], n_prompt;
} model_env;

/* Greedy text of n tokens after the prompt; tokens[] receives all of them. */
static int greedy(model_env *env, const char *backend, fg_dtype dtype, const char *policy, int32_t n, char *text,
                  size_t cap, int32_t *tokens, fg_memory_stats *mem) {
    fgm_runner_params rp = {.backend = backend, .kv_dtype = dtype, .max_seqs = 1};
    fgm_runner *r = NULL;
    char err[256];
    if (fgm_runner_create(&env->model, &env->tok, &rp, &r, err, sizeof err) != FG_OK) {
        fprintf(stderr, "runner %s: %s\n", backend, err);
        return 0;
    }
    fg_compression_params cp;
    fg_compression_params_preset(policy, &cp);
    const int32_t V = env->model.config.vocab_size;
    float *logits = malloc((size_t)V * sizeof *logits);
    int32_t seq = -1, len = env->n_prompt;
    memcpy(tokens, env->prompt, (size_t)len * sizeof *tokens);
    fg_status st = fgm_runner_prefill(r, &cp, env->prompt, env->n_prompt, &seq, logits);
    text[0] = '\0';
    for (int32_t i = 1; i < env->n_prompt; i++)
        strncat(text, fgm_tokenizer_decode(&env->tok, env->prompt[i - 1], env->prompt[i]), cap - strlen(text) - 1);
    fgm_sampler g = {0};
    for (int32_t i = 0; st == FG_OK && i < n; i++) {
        int32_t next = fgm_sample(&g, logits, V);
        strncat(text, fgm_tokenizer_decode(&env->tok, tokens[len - 1], next), cap - strlen(text) - 1);
        tokens[len++] = next;
        if (i + 1 < n)
            st = fgm_runner_decode(r, 1, &seq, &next, logits);
    }
    EXPECT(st == FG_OK, "%s %s: %s", backend, policy, fg_last_error(fgm_runner_context(r)));
    if (mem)
        fg_memory(fgm_runner_context(r), seq, mem);
    free(logits);
    fgm_runner_destroy(&r);
    return st == FG_OK;
}

/* The second real model: BabyLlama (character-level vocabulary of 105, head
 * dim 16). Its full-cache greedy text is llama2.c's run.c text, as the models
 * README records it, on every backend; FastGen holds less. */
static void test_babyllama(const char *dir, const char *backend) {
    static const char *k_baby = "Once upon a time, there was a little girl named Lily. She loved to play outside in "
                                "the sunshine. One day, she went to the park with her mommy and daddy. She saw a big "
                                "box on the ground.";
    char path[1024], err[256];
    model_env env;
    snprintf(path, sizeof path, "%s/babyllama105.bin", dir);
    fg_status st = fgm_llama_load_file(path, &env.model, err, sizeof err);
    EXPECT(st == FG_OK, "load %s: %s", path, err);
    if (st)
        return;
    snprintf(path, sizeof path, "%s/tok105.bin", dir);
    st = fgm_tokenizer_load_file(path, env.model.config.vocab_size, &env.tok, err, sizeof err);
    EXPECT(st == FG_OK, "tokenizer %s: %s", path, err);
    EXPECT(env.model.config.head_size == 16 && env.model.config.vocab_size == 105, "BabyLlama header");
    if (st == FG_OK && fgm_tokenizer_encode(&env.tok, "Once upon a time", 1, env.prompt, 64, &env.n_prompt) == FG_OK) {
        EXPECT(env.n_prompt == 18, "character-level: BOS, the space and 16 characters, not %d", (int)env.n_prompt);
        static char text[8192];
        static int32_t tokens[600];
        const char *backends[] = {"ref", backend};
        for (int b = 0; b < 2; b++)
            if (greedy(&env, backends[b], FG_DTYPE_F32, "full", 200, text, sizeof text, tokens, NULL))
                EXPECT(!strncmp(text, k_baby, strlen(k_baby)), "BabyLlama on %s: full-cache text differs:\n%s",
                       backends[b], text);
        fg_memory_stats mem;
        if (greedy(&env, backend, FG_DTYPE_F16, "fastgen", 150, text, sizeof text, tokens, &mem))
            EXPECT(mem.kv_bytes_held < mem.kv_bytes_full, "BabyLlama FastGen holds %zu of %zu", mem.kv_bytes_held,
                   mem.kv_bytes_full);
    }
    if (st == FG_OK)
        fgm_tokenizer_free(&env.tok);
    fgm_llama_free(&env.model);
}

/* The scorer (model/scorer.h) alone, then in a runner on the model's prompt. */
static void test_scorer(model_env *env, fgm_runner *r, const int32_t *prompt, int32_t n) {
    enum { DX = 8, HX = 2, NX = 400 };
    static float x[NX][DX], y[HX][NX], w_true[HX][DX + 1], w[HX][DX + 1];
    for (int32_t g = 0; g < HX; g++)
        for (int32_t e = 0; e <= DX; e++)
            w_true[g][e] = rng_gauss();
    for (int32_t i = 0; i < NX; i++) {
        for (int32_t e = 0; e < DX; e++)
            x[i][e] = rng_gauss();
        for (int32_t g = 0; g < HX; g++) {
            float t = w_true[g][DX];
            for (int32_t e = 0; e < DX; e++)
                t += w_true[g][e] * x[i][e];
            y[g][i] = t;
        }
    }
    fgm_scorer_fit fit;
    EXPECT(fgm_scorer_fit_init(&fit, DX, HX) == FG_OK, "fit init");
    static float yh[HX][NX / 2];
    for (int32_t half = 0; half < 2; half++) { /* two calls: the sums add up */
        for (int32_t g = 0; g < HX; g++)
            memcpy(yh[g], &y[g][half * NX / 2], sizeof yh[g]);
        fgm_scorer_fit_add(&fit, &x[half * NX / 2][0], &yh[0][0], NX / 2);
    }
    char err[256];
    EXPECT(fgm_scorer_fit_solve(&fit, 0.0, &w[0][0], err, sizeof err) == FG_OK, "solve: %s", err);
    double worst = 0.0;
    for (int32_t g = 0; g < HX; g++)
        for (int32_t e = 0; e <= DX; e++)
            worst = fmax(worst, fabs((double)w[g][e] - w_true[g][e]));
    EXPECT(worst < 1e-3, "the fit is %.3g from the linear function it was given", worst);
    fgm_scorer_fit_free(&fit);
    EXPECT(fgm_scorer_fit_init(&fit, DX, HX) == FG_OK, "fit init");
    fgm_scorer_fit_add(&fit, &x[0][0], &y[0][0], 3); /* fewer rows than weights: refused, not a made-up fit */
    EXPECT(fgm_scorer_fit_solve(&fit, 0.0, &w[0][0], err, sizeof err) != FG_OK && strstr(err, "singular"),
           "an underdetermined fit: %s", err);
    fgm_scorer_fit_free(&fit);

    /* a scorer of the model's shape: its file round-trips; a cut one is refused */
    const fgm_llama_config *c = &env->model.config;
    fgm_scorer sc = {c->n_layers, c->n_kv_heads, c->dim, 7, NULL}, back;
    const size_t nw = (size_t)c->n_layers * c->n_kv_heads * (c->dim + 1);
    sc.w = malloc(nw * sizeof *sc.w);
    for (size_t i = 0; i < nw; i++)
        sc.w[i] = 0.3f * rng_gauss();
    char path[] = "/tmp/fastgen-test-scorer-XXXXXX";
    const int fd = mkstemp(path);
    EXPECT(fd >= 0, "a temporary file");
    close(fd);
    EXPECT(fgm_scorer_save(path, &sc, err, sizeof err) == FG_OK, "save: %s", err);
    EXPECT(fgm_scorer_load(path, &back, err, sizeof err) == FG_OK, "load: %s", err);
    EXPECT(back.n_layers == sc.n_layers && back.n_kv_heads == sc.n_kv_heads && back.dim == sc.dim &&
               back.calib_tokens == 7 && !memcmp(back.w, sc.w, nw * sizeof *sc.w),
           "the scorer's file does not round-trip");
    fgm_scorer_free(&back);
    EXPECT(truncate(path, 100) == 0, "truncate");
    EXPECT(fgm_scorer_load(path, &back, err, sizeof err) == FG_ERR_FORMAT && strstr(err, "bytes where"),
           "a cut scorer: %s", err);
    remove(path);

    /* in the runner: none loaded refuses observe=scores and keeps nothing; one loaded compresses at the end */
    fg_compression_params cp;
    fg_compression_params_preset("fastgen-adaptive", &cp);
    cp.observe = FG_OBSERVE_SCORES;
    int32_t seq = -1;
    fg_status st = fgm_runner_prefill(r, &cp, prompt, n, &seq, NULL);
    EXPECT(st == FG_ERR_BAD_STATE && strstr(fgm_runner_error(r), "calibrated scorer"), "no scorer: %s",
           fgm_runner_error(r));
    fg_memory_stats all;
    EXPECT_OK(fgm_runner_context(r), fg_memory(fgm_runner_context(r), -1, &all));
    EXPECT(all.rows_full == 0, "a refused prefill left %lld rows", (long long)all.rows_full);
    fgm_scorer other = sc;
    other.n_kv_heads = 1;
    EXPECT(fgm_runner_set_scorer(r, &other) == FG_ERR_INVALID_ARGUMENT &&
               strstr(fgm_runner_error(r), "calibrated for"), "another shape: %s", fgm_runner_error(r));
    EXPECT(fgm_runner_set_scorer(r, &sc) == FG_OK, "set the scorer: %s", fgm_runner_error(r));
    EXPECT_OK(fgm_runner_context(r), fgm_runner_prefill(r, &cp, prompt, n, &seq, NULL));
    fg_memory_stats ms;
    EXPECT_OK(fgm_runner_context(r), fg_memory(fgm_runner_context(r), seq, &ms));
    EXPECT(ms.rows_kept <= (int64_t)ceil(0.5 * (double)ms.rows_full) + c->n_layers * c->n_kv_heads,
           "observe=scores kept %lld of %lld rows at budget 0.5", (long long)ms.rows_kept, (long long)ms.rows_full);
    EXPECT(ms.rows_kept < ms.rows_full, "observe=scores did not compress at the prefill's end");
    fgm_runner_release(r, seq);
    EXPECT(fgm_runner_set_scorer(r, NULL) == FG_OK, "unset the scorer");
    fgm_scorer_free(&sc);
}

int main(int argc, char **argv) {
    test_seed("test_model");
    if (argc < 2) {
        fprintf(stderr, "usage: test_model MODEL_DIR\n");
        return 1;
    }
    char path[1024], err[256];
    model_env env;
    snprintf(path, sizeof path, "%s/stories260K.bin", argv[1]);
    fg_status st = fgm_llama_load_file(path, &env.model, err, sizeof err);
    EXPECT(st == FG_OK, "load %s: %s (the model comes from ../shared/models/, see its README)", path, err);
    if (st)
        return test_finish();
    snprintf(path, sizeof path, "%s/tok512.bin", argv[1]);
    st = fgm_tokenizer_load_file(path, env.model.config.vocab_size, &env.tok, err, sizeof err);
    EXPECT(st == FG_OK, "tokenizer %s: %s", path, err);
    if (st)
        return test_finish();
    const fgm_llama_config *c = &env.model.config;
    EXPECT(c->dim == 64 && c->n_layers == 5 && c->n_heads == 8 && c->n_kv_heads == 4 && c->vocab_size == 512 &&
               c->seq_len == 512 && c->shared_classifier,
           "stories260K header");

    /* tokenizer */
    EXPECT(fgm_tokenizer_encode(&env.tok, "Once upon a time", 1, env.prompt, 8, &env.n_prompt) == FG_OK, "encode");
    const int32_t want[] = {1, 403, 407, 261, 378};
    EXPECT(env.n_prompt == 5 && memcmp(env.prompt, want, sizeof want) == 0, "\"Once upon a time\" -> %d tokens",
           (int)env.n_prompt);

    /* the merges against a plain quadratic SentencePiece (the best pair, leftmost on a tie, until none is a
     * piece) on random ASCII strings, and a megabyte in one call (quadratic, it would not finish) */
    {
        static const char alphabet[] = "aeiou tnsrhldmw.,!?'\n";
        char str[161], pair[256];
        int32_t got[200], ref[200];
        uint64_t rs = 7;
        int same = 1;
        for (int ci = 0; ci < 300 && same; ci++) {
            rs = rs * 6364136223846793005ull + 1442695040888963407ull;
            const int len = 1 + (int)((rs >> 33) % 160);
            for (int i = 0; i < len; i++) {
                rs = rs * 6364136223846793005ull + 1442695040888963407ull;
                str[i] = alphabet[(rs >> 33) % (sizeof alphabet - 1)];
            }
            str[len] = '\0';
            int32_t n = 0, ng = 0;
            ref[n++] = fgm_tokenizer_piece_id(&env.tok, " ");
            for (int i = 0; i < len; i++) {
                char one[2] = {str[i], 0}, byte[8];
                snprintf(byte, sizeof byte, "<0x%02X>", (unsigned char)str[i]);
                const int32_t id = fgm_tokenizer_piece_id(&env.tok, one);
                ref[n++] = id >= 0 ? id : fgm_tokenizer_piece_id(&env.tok, byte);
            }
            for (;;) {
                int32_t best_at = -1, best_id = -1;
                for (int32_t i = 0; i + 1 < n; i++) {
                    snprintf(pair, sizeof pair, "%s%s", env.tok.pieces[ref[i]], env.tok.pieces[ref[i + 1]]);
                    const int32_t id = fgm_tokenizer_piece_id(&env.tok, pair);
                    if (id >= 0 && (best_at < 0 || env.tok.scores[id] > env.tok.scores[best_id])) {
                        best_at = i;
                        best_id = id;
                    }
                }
                if (best_at < 0)
                    break;
                ref[best_at] = best_id;
                memmove(ref + best_at + 1, ref + best_at + 2, (size_t)(n - best_at - 2) * sizeof *ref);
                n--;
            }
            same = fgm_tokenizer_encode(&env.tok, str, 0, got, 200, &ng) == FG_OK && ng == n &&
                   !memcmp(got, ref, (size_t)n * sizeof *got);
            EXPECT(same, "encode(\"%s\"): %d tokens, the quadratic merge %d", str, (int)ng, (int)n);
        }
        enum { MB = 1 << 20 };
        char *big = malloc(MB + 1), *back = malloc(MB + 2);
        int32_t *ids = malloc((MB + 2) * sizeof *ids), n_ids = 0;
        EXPECT(big && back && ids, "alloc");
        if (big && back && ids) {
            for (int i = 0; i < MB; i++) {
                rs = rs * 6364136223846793005ull + 1442695040888963407ull;
                big[i] = alphabet[(rs >> 33) % (sizeof alphabet - 1)];
            }
            big[MB] = '\0';
            EXPECT(fgm_tokenizer_encode(&env.tok, big, FGM_ENCODE_BOS, ids, MB + 2, &n_ids) == FG_OK && n_ids > 1,
                   "a megabyte of text encodes");
            size_t at = 0;
            for (int32_t i = 1; i < n_ids; i++) {
                const char *piece = fgm_tokenizer_decode(&env.tok, ids[i - 1], ids[i]);
                const size_t l = strlen(piece);
                if (at + l > MB)
                    break;
                memcpy(back + at, piece, l);
                at += l;
            }
            EXPECT(at == MB && !memcmp(back, big, MB), "a megabyte decodes back to itself");
        }
        free(big);
        free(back);
        free(ids);
    }

    /* llama2.c's 64 steps = the 5-token prompt and 60 generated tokens */
    static char text[8192], text_ref[8192];
    int32_t tokens[600], tokens_ref[600];
    const char *extra = argc > 2 ? argv[2] : NULL;
    if (extra && fg_backend_probe(extra) != FG_OK) {
        printf("%s: not tested: %s\n", extra, fg_last_error(NULL));
        EXPECT(!test_backend_required(), "backend %s is required here (FG_TEST_REQUIRE_BACKEND)", extra);
        return test_backend_required() ? test_finish() : 77;
    }
    const char *backends[] = {"ref", extra ? extra : "cpu"};
    const fg_dtype dtypes[] = {FG_DTYPE_F32, FG_DTYPE_F16, FG_DTYPE_BF16};
    for (int b = 0; b < 2; b++)
        for (int d = 0; d < 3; d++)
            if (greedy(&env, backends[b], dtypes[d], "full", 60, text, sizeof text, tokens, NULL))
                EXPECT(strcmp(text, k_reference) == 0, "%s dtype %d: full cache text differs:\n%s", backends[b], d,
                       text);

    /* FastGen: cpu == ref, and less memory than the full cache */
    fg_memory_stats mem;
    if (greedy(&env, "ref", FG_DTYPE_F32, "fastgen", 200, text_ref, sizeof text_ref, tokens_ref, NULL) &&
        greedy(&env, backends[1], FG_DTYPE_F32, "fastgen", 200, text, sizeof text, tokens, &mem)) {
        EXPECT(strcmp(text, text_ref) == 0, "fastgen text differs between %s and ref", backends[1]);
        EXPECT(mem.kv_bytes_held < mem.kv_bytes_full, "FastGen holds %zu of %zu bytes", mem.kv_bytes_held,
               mem.kv_bytes_full);
        printf("FastGen after 200 tokens: %zu of %zu KV bytes held\n", mem.kv_bytes_held, mem.kv_bytes_full);
    }

    /* a batch of two policies == each alone */
    fgm_runner_params rp = {.backend = "cpu", .kv_dtype = FG_DTYPE_F32, .max_seqs = 2};
    fgm_runner *r = NULL;
    EXPECT(fgm_runner_create(&env.model, &env.tok, &rp, &r, err, sizeof err) == FG_OK, "runner: %s", err);
    fg_compression_params cp[2];
    fg_compression_params_preset("full", &cp[0]);
    fg_compression_params_preset("h2o", &cp[1]);
    const int32_t V = c->vocab_size;
    float *lb = malloc(2 * (size_t)V * sizeof(float)), *la = malloc((size_t)V * sizeof(float));
    int32_t seqs[2];
    const int32_t *forced = tokens_ref + env.n_prompt; /* teacher-forced continuation */
    for (int i = 0; i < 2; i++)
        EXPECT_OK(fgm_runner_context(r), fgm_runner_prefill(r, &cp[i], env.prompt, env.n_prompt, &seqs[i], NULL));
    for (int32_t step = 0; step < 40; step++) {
        int32_t toks[2] = {forced[step], forced[step]};
        EXPECT_OK(fgm_runner_context(r), fgm_runner_decode(r, 2, seqs, toks, lb));
    }
    for (int i = 0; i < 2; i++)
        fgm_runner_release(r, seqs[i]);
    double worst = 0.0;
    for (int i = 0; i < 2; i++) {
        int32_t s1 = -1;
        EXPECT_OK(fgm_runner_context(r), fgm_runner_prefill(r, &cp[i], env.prompt, env.n_prompt, &s1, NULL));
        for (int32_t step = 0; step < 40; step++)
            EXPECT_OK(fgm_runner_context(r), fgm_runner_decode(r, 1, &s1, &forced[step], la));
        fgm_runner_release(r, s1);
        for (int32_t v = 0; v < V; v++)
            worst = fmax(worst, fabs((double)lb[i * V + v] - la[v]));
    }
    EXPECT(worst < 1e-3, "batched and single decoding differ by %.3g in the logits", worst);

    /* one prompt into two sequences at once == each prefilled alone: the same logits, the same
       kept rows, the same decoding after (bit for bit: the same products in the same order) */
    {
        fgm_runner *r4 = NULL;
        fgm_runner_params rp4 = {.backend = "cpu", .kv_dtype = FG_DTYPE_F32, .max_seqs = 4};
        EXPECT(fgm_runner_create(&env.model, &env.tok, &rp4, &r4, err, sizeof err) == FG_OK, "runner: %s", err);
        float *lm = malloc(2 * (size_t)V * sizeof(float)), *l1 = malloc(2 * (size_t)V * sizeof(float));
        int32_t many[2] = {-1, -1}, alone[2] = {-1, -1};
        EXPECT_OK(fgm_runner_context(r4), fgm_runner_prefill_many(r4, 2, cp, env.prompt, env.n_prompt, many, lm));
        int same_kept = 1;
        for (int i = 0; i < 2; i++) {
            int32_t pos_many[64], pos_alone[64], n_many = 0, n_alone = 0;
            EXPECT_OK(fgm_runner_context(r4), fgm_runner_prefill(r4, &cp[i], env.prompt, env.n_prompt, &alone[i], l1));
            EXPECT(memcmp(lm, l1, (size_t)V * sizeof(float)) == 0, "policy %d: the prompt's logits differ", i);
            for (int32_t l = 0; l < c->n_layers; l++)
                for (int32_t g = 0; g < c->n_kv_heads; g++) {
                    fg_head_positions(fgm_runner_context(r4), many[i], l, g, pos_many, 64, &n_many);
                    fg_head_positions(fgm_runner_context(r4), alone[i], l, g, pos_alone, 64, &n_alone);
                    same_kept &= n_many == n_alone && !memcmp(pos_many, pos_alone, (size_t)n_many * sizeof(int32_t));
                }
        }
        EXPECT(same_kept, "prefilled together and alone, the sequences keep different rows");
        int32_t toks[2] = {forced[0], forced[0]};
        EXPECT_OK(fgm_runner_context(r4), fgm_runner_decode(r4, 2, many, toks, lm));
        EXPECT_OK(fgm_runner_context(r4), fgm_runner_decode(r4, 2, alone, toks, l1));
        EXPECT(memcmp(lm, l1, 2 * (size_t)V * sizeof(float)) == 0, "decoding after differs");
        for (int i = 0; i < 2; i++) {
            fgm_runner_release(r4, many[i]);
            fgm_runner_release(r4, alone[i]);
        }
        /* all or none: five sequences do not fit this runner of four; nor two beside three */
        fg_compression_params five[5] = {cp[0], cp[1], cp[0], cp[1], cp[0]};
        int32_t s5[5] = {-1, -1, -1, -1, -1};
        fg_memory_stats before, after;
        EXPECT(fgm_runner_prefill_many(r4, 5, five, env.prompt, env.n_prompt, s5, NULL) == FG_ERR_INVALID_ARGUMENT,
               "five sequences in a runner of four");
        EXPECT_OK(fgm_runner_context(r4), fgm_runner_prefill_many(r4, 3, five, env.prompt, env.n_prompt, s5, NULL));
        fg_memory(fgm_runner_context(r4), -1, &before);
        EXPECT(fgm_runner_prefill_many(r4, 2, cp, env.prompt, env.n_prompt, many, NULL) == FG_ERR_CAPACITY,
               "two more sequences beside three in a context of four");
        fg_memory(fgm_runner_context(r4), -1, &after);
        EXPECT(after.rows_full == before.rows_full && after.kv_bytes_held == before.kv_bytes_held,
               "a failed prefill of several left a sequence behind");
        for (int i = 0; i < 3; i++)
            fgm_runner_release(r4, s5[i]);
        fgm_runner_destroy(&r4);
        free(lm);
        free(l1);
    }

    /* a prompt longer than the context */
    int32_t *longp = malloc((size_t)(c->seq_len + 1) * sizeof *longp);
    for (int32_t i = 0; i <= c->seq_len; i++)
        longp[i] = i ? 300 : 1;
    int32_t s = -1;
    EXPECT(fgm_runner_prefill(r, NULL, longp, c->seq_len + 1, &s, NULL) == FG_ERR_CAPACITY, "prompt past the context");
    free(longp);
    free(lb);
    free(la);
    test_scorer(&env, r, tokens_ref, 120);
    fgm_runner_destroy(&r);
    fgm_tokenizer_free(&env.tok);
    fgm_llama_free(&env.model);
    test_babyllama(argv[1], backends[1]);
    return test_finish();
}
