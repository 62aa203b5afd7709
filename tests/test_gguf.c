/*
 * GGUF files made by ggml and llama.cpp (../shared/models/gguf, see its
 * README), read by model/gguf.c:
 *   - quants.gguf: each of the 14 types dequantizes to ggml's own output
 *     (the .ref tensors) bit for bit;
 *   - every file parses; the llama ones load as models;
 *   - stories260K-f32.gguf greedily generates llama.cpp's 80 ids for both of
 *     its prompts, and the same ids as the llama2.c .bin;
 *   - F16 and quantized files generate what their weights dequantized to F32
 *     in memory generate (so weights kept in their type change nothing), and
 *     the agreement with llama.cpp (which also quantizes activations) is
 *     reported;
 *   - the SentencePiece vocabulary from the metadata gives llama.cpp's ids for
 *     every string of tokenizer-tests.inp;
 *   - crafted and truncated files get a clean error.
 * Usage: test_gguf GGUF_DIR MODEL_DIR
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/support/harness.h"
#include "common/dtype.h"
#include "common/cpu_features.h"
#include "model/dequant.h"
#include "model/matvec.h"
#include "model/gguf.h"
#include "model/llama2c.h"
#include "model/runner.h"
#include "model/tokenizer.h"
#include "model/io.h"

static const char *g_dir, *g_model_dir;

static char *slurp(const char *name, size_t *size) {
    char path[1024], err[256];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    void *buf = NULL;
    EXPECT(fgm_read_file(path, &buf, size, err, sizeof err) == FG_OK, "%s", err);
    char *text = buf ? realloc(buf, *size + 1) : NULL;
    if (text)
        text[*size] = '\0';
    return text;
}

/* ------------------------------------------------------------------ dequantization */

static void test_quants(void) {
    char path[1024], err[400];
    snprintf(path, sizeof path, "%s/quants.gguf", g_dir);
    fgm_gguf g;
    EXPECT(fgm_gguf_open(path, &g, err, sizeof err) == FG_OK, "%s", err);
    const char *types[] = {"f16",  "bf16", "q4_0", "q4_1", "q5_0", "q5_1",   "q8_0",
                           "q2_K", "q3_K", "q4_K", "q5_K", "q6_K", "iq4_nl", "iq4_xs"};
    int exact = 0;
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        char ref_name[64];
        snprintf(ref_name, sizeof ref_name, "%s.ref", types[i]);
        const fgm_gguf_tensor *t = fgm_gguf_tensor_find(&g, types[i]), *ref = fgm_gguf_tensor_find(&g, ref_name);
        EXPECT(t && ref && ref->type == FGM_GGML_F32, "quants.gguf has %s and %s", types[i], ref_name);
        if (!t || !ref)
            continue;
        const fgm_type_info *ti = fgm_type_info_of(t->type);
        EXPECT(ti && ti->to_float && !strcmp(ti->name, types[i]), "%s: type %d is %s", types[i], (int)t->type,
               ti ? ti->name : "unknown");
        const int64_t n = t->ne[0] * t->ne[1];
        float *y = malloc((size_t)n * sizeof *y);
        if (ti && ti->to_float)
            ti->to_float(t->data, y, n);
        int64_t differ = 0;
        for (int64_t k = 0; k < n; k++)
            differ += memcmp(&y[k], (const float *)ref->data + k, sizeof *y) != 0;
        EXPECT(differ == 0, "%s: %lld of %lld values differ from ggml's", types[i], (long long)differ, (long long)n);
        exact += differ == 0;
        free(y);
    }
    printf("quants.gguf: %d of %zu types equal ggml's dequantization bit for bit\n", exact,
           sizeof types / sizeof types[0]);
    /* the cache's q8_0 / q4_0 rows (common/dtype.h) are ggml's blocks: a row
     * of `source` quantized as a cache row of 256 values (blocks of 32) gives
     * ggml's bytes, and reads back as ggml's dequantization */
    const fgm_gguf_tensor *src = fgm_gguf_tensor_find(&g, "source");
    EXPECT(src && src->type == FGM_GGML_F32 && src->ne[0] == 256, "quants.gguf has source [256][rows]");
    const fg_dtype kv[2] = {FG_DTYPE_Q8_0, FG_DTYPE_Q4_0};
    const char *kv_names[2] = {"q8_0", "q4_0"};
    for (int i = 0; src && i < 2; i++) {
        char ref_name[64];
        snprintf(ref_name, sizeof ref_name, "%s.ref", kv_names[i]);
        const fgm_gguf_tensor *t = fgm_gguf_tensor_find(&g, kv_names[i]), *ref = fgm_gguf_tensor_find(&g, ref_name);
        const size_t row = fg_row_bytes(kv[i], 256);
        EXPECT(t && ref && (int64_t)row == fgm_type_row_bytes(t->type, 256), "%s: rows of %zu bytes", kv_names[i],
               row);
        if (!t || !ref)
            continue;
        unsigned char buf[256 * sizeof(float)];
        int64_t bytes_differ = 0, values_differ = 0;
        for (int64_t r = 0; r < src->ne[1]; r++) {
            fg_store_row(buf, kv[i], (const float *)src->data + r * 256, 256);
            bytes_differ += memcmp(buf, (const unsigned char *)t->data + r * (int64_t)row, row) != 0;
            for (int32_t c = 0; c < 256; c++) {
                const float x = fg_load_elem(buf, kv[i], 256, c);
                values_differ += memcmp(&x, (const float *)ref->data + r * 256 + c, sizeof x) != 0;
            }
        }
        EXPECT(bytes_differ == 0 && values_differ == 0,
               "cache %s: %lld of %lld rows differ from ggml's quantization, %lld values from its dequantization",
               kv_names[i], (long long)bytes_differ, (long long)src->ne[1], (long long)values_differ);
    }
    printf("quants.gguf: the cache's q8_0 and q4_0 rows equal ggml's blocks byte for byte\n");
    /* a type fastgen knows but cannot dequantize: the model loader names the tensor and the type */
    const fgm_type_info *q8k = fgm_type_info_of(FGM_GGML_Q8_K);
    EXPECT(q8k && !q8k->to_float && fgm_type_info_of(4) == NULL && fgm_type_info_of(1000) == NULL, "type table");
    fgm_gguf_free(&g);
}

/* ------------------------------------------------------------------ crafted files */

typedef struct builder {
    unsigned char *b;
    size_t n, cap;
} builder;

static void put(builder *w, const void *p, size_t n) {
    if (w->n + n > w->cap) {
        w->cap = (w->n + n) * 2;
        w->b = realloc(w->b, w->cap);
    }
    memcpy(w->b + w->n, p, n);
    w->n += n;
}
static void put_u32(builder *w, uint32_t x) { put(w, &x, 4); }
static void put_u64(builder *w, uint64_t x) { put(w, &x, 8); }
static void put_str(builder *w, const char *s) {
    put_u64(w, strlen(s));
    put(w, s, strlen(s));
}

/* A small valid file: 3 keys (a string, a u32, an array of strings), two f32
 * tensors of 4 x 2 values, alignment 32. *t1_offset: where tensor 1's offset is. */
static builder crafted(size_t *t1_offset) {
    builder w = {0};
    put(&w, "GGUF", 4);
    put_u32(&w, 3);
    put_u64(&w, 2);
    put_u64(&w, 3);
    put_str(&w, "general.architecture");
    put_u32(&w, FGM_GGUF_STRING);
    put_str(&w, "test");
    put_str(&w, "test.count");
    put_u32(&w, FGM_GGUF_UINT32);
    put_u32(&w, 7);
    put_str(&w, "test.words");
    put_u32(&w, FGM_GGUF_ARRAY);
    put_u32(&w, FGM_GGUF_STRING);
    put_u64(&w, 2);
    put_str(&w, "one");
    put_str(&w, "two");
    for (int t = 0; t < 2; t++) {
        put_str(&w, t ? "b" : "a");
        put_u32(&w, 2);
        put_u64(&w, 4);
        put_u64(&w, 2);
        put_u32(&w, FGM_GGML_F32);
        if (t)
            *t1_offset = w.n;
        put_u64(&w, t ? 32 : 0);
    }
    while (w.n % 32)
        put(&w, "", 1);
    for (int i = 0; i < 16; i++) {
        float x = (float)i;
        put(&w, &x, 4);
    }
    return w;
}

static void expect_bad(const unsigned char *b, size_t n, const char *word, const char *what) {
    fgm_gguf g;
    char err[400] = "";
    fg_status st = fgm_gguf_parse(b, n, &g, err, sizeof err);
    EXPECT(st == FG_ERR_FORMAT && strstr(err, word), "%s: %s, \"%s\" (wanted \"%s\")", what, fg_status_string(st),
           err, word);
    if (st == FG_OK)
        fgm_gguf_free(&g);
}

static void test_crafted(void) {
    size_t t1 = 0;
    builder w = crafted(&t1);
    fgm_gguf g;
    char err[400] = "";
    EXPECT(fgm_gguf_parse(w.b, w.n, &g, err, sizeof err) == FG_OK, "the crafted file: %s", err);
    if (!err[0]) {
        const fgm_gguf_kv *words = fgm_gguf_find(&g, "test.words");
        int64_t count = 0;
        EXPECT(words && words->n_elems == 2 && !strcmp(words->strs[1], "two"), "array of strings");
        EXPECT(fgm_gguf_get_int(&g, "test.count", 0, &count, err, sizeof err) == FG_OK && count == 7, "u32 key");
        EXPECT(fgm_gguf_get_int(&g, "general.architecture", 0, &count, err, sizeof err) == FG_ERR_FORMAT,
               "a string is not an integer");
        const fgm_gguf_tensor *b = fgm_gguf_tensor_find(&g, "b");
        EXPECT(b && ((const float *)b->data)[0] == 8.0f, "tensor b's data");
        fgm_gguf_free(&g);
    }
    /* every truncation fails cleanly */
    int bad = 0;
    for (size_t k = 0; k < w.n; k++) {
        err[0] = '\0';
        fg_status st = fgm_gguf_parse(w.b, k, &g, err, sizeof err);
        bad += st != FG_ERR_FORMAT || !err[0];
        if (st == FG_OK)
            fgm_gguf_free(&g);
    }
    EXPECT(bad == 0, "%d truncations of %zu were not refused cleanly", bad, w.n);
    unsigned char *m = malloc(w.n);
#define MUTATE(at, bytes, n_bytes, word, what)                                                                         \
    do {                                                                                                               \
        memcpy(m, w.b, w.n);                                                                                           \
        memcpy(m + (at), bytes, n_bytes);                                                                              \
        expect_bad(m, w.n, word, what);                                                                                \
    } while (0)
    const uint32_t v1 = 1, huge32 = 0xffffffffu, t_array = FGM_GGUF_ARRAY;
    const uint64_t huge = (uint64_t)1 << 40, off_unaligned = 33, off_overlap = 0, off_past = 64;
    MUTATE(0, "GGUX", 4, "magic", "bad magic");
    MUTATE(4, &v1, 4, "version", "version 1");
    MUTATE(8, &huge, 8, "do not fit", "2^40 tensors");
    MUTATE(16, &huge, 8, "do not fit", "2^40 keys");
    MUTATE(24, &huge, 8, "past the end", "a key of 2^40 bytes");
    MUTATE(24 + 8 + 20, &huge32, 4, "unknown value type", "value type 2^32-1");
    MUTATE(t1, &off_unaligned, 8, "aligned", "an unaligned tensor");
    MUTATE(t1, &off_overlap, 8, "overlap", "overlapping tensors");
    MUTATE(t1, &off_past, 8, "runs past the end of the file", "a tensor past the end");
    /* an array of arrays: the third key's element type */
    const size_t third = 24 + 8 + 20 + 4 + 8 + 4 + 8 + 10 + 4 + 4 + 8 + 10 + 4;
    MUTATE(third, &t_array, 4, "array of array", "an array of arrays");
#undef MUTATE
    free(m);
    free(w.b);
    printf("crafted GGUF: %zu truncations and 10 corruptions refused\n", w.n);
}

/* ------------------------------------------------------------------ the files and their models */

/* A RoPE base the library cannot run (0.5, 1, 1e-30, 1e13, NaN) patched into a real file: refused where
 * the file is read, naming the value, not loaded to fail at the first context. */
static void test_rope_base(void) {
    size_t size;
    char *file = slurp("stories260K-f32.gguf", &size);
    if (!file)
        return;
    static const char key[] = "llama.rope.freq_base";
    char *at = NULL;
    for (size_t i = 0; i + sizeof key < size && !at; i++)
        if (!memcmp(file + i, key, sizeof key - 1))
            at = file + i + sizeof key - 1;
    uint32_t type = 0;
    if (at)
        memcpy(&type, at, 4);
    EXPECT(at && type == FGM_GGUF_FLOAT32, "stories260K-f32.gguf: %s as a float32 key", key);
    const float bad[] = {0.5f, 1.0f, 1e-30f, 1e13f, NAN}, good = 10000.0f;
    char path[] = "/tmp/test_gguf_rope_XXXXXX";
    const int fd = mkstemp(path);
    EXPECT(fd >= 0, "mkstemp");
    for (size_t c = 0; at && fd >= 0 && c <= sizeof bad / sizeof bad[0]; c++) {
        const float base = c < sizeof bad / sizeof bad[0] ? bad[c] : good;
        memcpy(at + 4, &base, 4);
        FILE *f = fopen(path, "wb");
        EXPECT(f && fwrite(file, 1, size, f) == size && fclose(f) == 0, "writing %s", path);
        fgm_llama_model m;
        char err[400] = "";
        const fg_status st = fgm_model_load(path, &m, err, sizeof err);
        char value[32];
        snprintf(value, sizeof value, "%g", (double)base);
        if (base == good)
            EXPECT(st == FG_OK, "rope.freq_base %g: %s", (double)base, err);
        else
            EXPECT(st == FG_ERR_FORMAT && strstr(err, "rope.freq_base") && strstr(err, value),
                   "rope.freq_base %g: %s, \"%s\"", (double)base, fg_status_string(st), err);
        if (st == FG_OK)
            fgm_llama_free(&m);
    }
    if (fd >= 0) {
        close(fd);
        unlink(path);
    }
    free(file);
}

/* Greedy ids after a prompt: n tokens. */
static fg_status greedy_as(const fgm_llama_model *m, const fgm_tokenizer *t, const int32_t *prompt, int32_t n_prompt,
                           int32_t n, int q8, int32_t *out) {
    /* q8: llama.cpp's defaults whole, its f16 cache with the 8-bit activations */
    fgm_runner_params rp = {.backend = "cpu", .kv_dtype = q8 ? FG_DTYPE_F16 : FG_DTYPE_F32, .max_seqs = 1,
                            .q8_activations = q8};
    fgm_runner *r = NULL;
    char err[256];
    fg_status st = fgm_runner_create(m, t, &rp, &r, err, sizeof err);
    if (st) {
        fprintf(stderr, "runner: %s\n", err);
        return st;
    }
    fg_compression_params full;
    fg_compression_params_preset("full", &full);
    float *logits = malloc((size_t)m->config.vocab_size * sizeof *logits);
    int32_t seq = -1;
    st = fgm_runner_prefill(r, &full, prompt, n_prompt, &seq, logits);
    fgm_sampler g = {0};
    for (int32_t i = 0; st == FG_OK && i < n; i++) {
        out[i] = fgm_sample(&g, logits, m->config.vocab_size);
        if (i + 1 < n)
            st = fgm_runner_decode(r, 1, &seq, &out[i], logits);
    }
    if (st)
        fprintf(stderr, "greedy: %s\n", fgm_runner_error(r));
    free(logits);
    fgm_runner_destroy(&r);
    return st;
}

static fg_status greedy(const fgm_llama_model *m, const fgm_tokenizer *t, const int32_t *prompt, int32_t n_prompt,
                        int32_t n, int32_t *out) {
    return greedy_as(m, t, prompt, n_prompt, n, 0, out);
}

/* The model with every weight matrix dequantized to f32 in memory (norms are already f32). */
static float *dequantize_all(fgm_llama_model *m) {
    fgm_llama_weights *W = &m->weights;
    size_t floats = 0;
    fgm_tensor *all[1 + 7 * 1024 + 1];
    int n = 0;
    all[n++] = &W->token_embedding;
    for (int32_t l = 0; l < m->config.n_layers; l++) {
        fgm_llama_layer *ly = &W->layers[l];
        fgm_tensor *t[] = {&ly->wq, &ly->wk, &ly->wv, &ly->wo, &ly->w1, &ly->w2, &ly->w3};
        for (int i = 0; i < 7; i++)
            all[n++] = t[i];
    }
    if (!m->config.shared_classifier)
        all[n++] = &W->wcls;
    for (int i = 0; i < n; i++)
        floats += (size_t)(all[i]->rows * all[i]->cols);
    float *buf = malloc(floats * sizeof *buf), *p = buf;
    for (int i = 0; i < n; i++) {
        fgm_type_info_of(all[i]->type)->to_float(all[i]->data, p, all[i]->rows * all[i]->cols);
        *all[i] = (fgm_tensor){FGM_GGML_F32, p, all[i]->rows, all[i]->cols};
        p += all[i]->rows * all[i]->cols;
    }
    if (m->config.shared_classifier)
        W->wcls = W->token_embedding;
    return buf;
}

/* "name: 1 2 3" from a *.llama-cpp.txt file, the k-th occurrence of name. */
static int32_t read_ids(const char *text, const char *name, int k, int32_t *ids, int32_t cap) {
    const char *p = text;
    for (int i = 0; i <= k && p; i++) {
        p = strstr(p, name);
        if (p && i < k)
            p += strlen(name);
    }
    if (!p)
        return 0;
    p += strlen(name);
    int32_t n = 0;
    while (*p && *p != '\n' && n < cap) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p)
            break;
        ids[n++] = (int32_t)v;
        p = end;
    }
    return n;
}

static void test_model_file(const char *name, int f32) {
    char path[1024], err[400];
    snprintf(path, sizeof path, "%s/%s.gguf", g_dir, name);
    fgm_llama_model m;
    fgm_tokenizer tok;
    fg_status st = fgm_model_load(path, &m, err, sizeof err);
    EXPECT(st == FG_OK && m.gguf, "%s: %s", name, err);
    if (st)
        return;
    EXPECT(fgm_tokenizer_from_gguf(m.gguf, m.config.vocab_size, &tok, err, sizeof err) == FG_OK, "%s: %s", name, err);
    size_t size;
    char txt_name[256];
    snprintf(txt_name, sizeof txt_name, "%s.llama-cpp.txt", name);
    char *ref = slurp(txt_name, &size);
    for (int k = 0; ref && k < 2; k++) {
        int32_t prompt[64], want[128], got[128], got_f32[128];
        const int32_t n_prompt = read_ids(ref, "prompt_ids:", k, prompt, 64), n = read_ids(ref, "gen_ids:", k, want, 128);
        EXPECT(n_prompt > 0 && n == 80, "%s: prompt %d and its 80 ids", txt_name, k);
        if (n_prompt <= 0 || n != 80 || greedy(&m, &tok, prompt, n_prompt, n, got) != FG_OK)
            continue;
        int32_t agree = 0;
        while (agree < n && got[agree] == want[agree])
            agree++;
        if (f32) {
            EXPECT(agree == n, "%s prompt %d: llama.cpp's ids for %d of %d tokens", name, k, (int)agree, (int)n);
        } else {
            /* weights kept in their type = the same weights dequantized to f32 up front */
            fgm_llama_model deq = m;
            fgm_llama_layer *layers = malloc((size_t)m.config.n_layers * sizeof *layers);
            memcpy(layers, m.weights.layers, (size_t)m.config.n_layers * sizeof *layers);
            deq.weights.layers = layers;
            float *buf = dequantize_all(&deq);
            if (greedy(&deq, &tok, prompt, n_prompt, n, got_f32) == FG_OK)
                EXPECT(memcmp(got, got_f32, sizeof(int32_t) * (size_t)n) == 0,
                       "%s prompt %d: quantized weights and their f32 dequantization generate different ids", name, k);
            free(buf);
            free(layers);
            EXPECT(agree >= 16, "%s prompt %d: llama.cpp's ids for only %d tokens", name, k, (int)agree);
        }
        /* ggml's products (the CLI's default): 8-bit activations against q4_0/q4_1/q5_0/q5_1/q8_0
           weights, f32 ones against f16 and f32 weights, as its CPU backend multiplies them; an f16 cache */
        int32_t agree_q8 = 0;
        if (greedy_as(&m, &tok, prompt, n_prompt, n, 1, got) == FG_OK)
            while (agree_q8 < n && got[agree_q8] == want[agree_q8])
                agree_q8++;
        /* exactly with AVX2 and AVX-512 kernels (what llama.cpp's run had); the portable ones (no AVX2,
           or FG_CPU_ISA=generic) sum attention in another order, and these tiny models part on that */
        const int exact = fg_cpu_features_get().isa >= FG_ISA_AVX2; /* the ISA the kernels take here */
        EXPECT(exact ? agree_q8 == n : agree_q8 >= 32, "%s prompt %d: with 8-bit activations llama.cpp's ids for "
               "%d of %d tokens", name, k, (int)agree_q8, (int)n);
        printf("%-22s prompt %d: %2d of %d greedy ids equal llama.cpp's%s; %d with 8-bit activations\n", name, k,
               (int)agree, (int)n, f32 ? "" : " (equal to its weights dequantized to f32)", (int)agree_q8);
    }
    free(ref);
    fgm_tokenizer_free(&tok);
    fgm_llama_free(&m);
}

static void test_files(void) {
    const char *files[] = {"stories260K-f32", "stories260K-f16", "stories260K-q4_k_m", "babyllama105-q8_0",
                           "babyllama105-q4_k_m", "quants"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char path[1024], err[400] = "";
        snprintf(path, sizeof path, "%s/%s.gguf", g_dir, files[i]);
        fgm_gguf g;
        EXPECT(fgm_gguf_open(path, &g, err, sizeof err) == FG_OK && g.n_tensors > 0, "%s: %s", files[i], err);
        fgm_llama_model m;
        fg_status st = fgm_llama_from_gguf(&g, &m, err, sizeof err);
        if (i + 1 < sizeof files / sizeof files[0])
            EXPECT(st == FG_OK, "%s as a model: %s", files[i], err);
        else /* quants.gguf has no architecture */
            EXPECT(st == FG_ERR_UNAVAILABLE && strstr(err, "architecture"), "quants.gguf as a model: %s", err);
        if (st == FG_OK)
            fgm_llama_free(&m);
        fgm_gguf_free(&g);
    }
    /* the same text as the llama2.c checkpoint */
    char path[1024], err[400];
    snprintf(path, sizeof path, "%s/stories260K.bin", g_model_dir);
    fgm_llama_model bin = {0}, gg = {0}; /* freed below whether or not they load */
    fgm_tokenizer tok = {0};
    EXPECT(fgm_model_load(path, &bin, err, sizeof err) == FG_OK, "%s", err);
    snprintf(path, sizeof path, "%s/stories260K-f32.gguf", g_dir);
    EXPECT(fgm_model_load(path, &gg, err, sizeof err) == FG_OK, "%s", err);
    EXPECT(gg.gguf && fgm_tokenizer_from_gguf(gg.gguf, 512, &tok, err, sizeof err) == FG_OK, "%s", err);
    const int32_t prompt[] = {1, 403, 407, 261, 378};
    int32_t a[60], b[60];
    if (greedy(&bin, &tok, prompt, 5, 60, a) == FG_OK && greedy(&gg, &tok, prompt, 5, 60, b) == FG_OK)
        EXPECT(memcmp(a, b, sizeof a) == 0, "stories260K: the .bin and the f32 GGUF generate different ids");
    fgm_tokenizer_free(&tok);
    fgm_llama_free(&bin);
    fgm_llama_free(&gg);
    test_model_file("stories260K-f32", 1);
    test_model_file("stories260K-f16", 0);
    test_model_file("stories260K-q4_k_m", 0);
    test_model_file("babyllama105-q8_0", 0);
    test_model_file("babyllama105-q4_k_m", 0);
}

/* ------------------------------------------------------------------ tokenizer */

static void test_tokenizer(void) {
    char path[1024], err[400];
    snprintf(path, sizeof path, "%s/stories260K-f32.gguf", g_dir);
    fgm_gguf g;
    fgm_tokenizer t;
    EXPECT(fgm_gguf_open(path, &g, err, sizeof err) == FG_OK, "%s", err);
    EXPECT(fgm_tokenizer_from_gguf(&g, 511, &t, err, sizeof err) == FG_ERR_FORMAT, "a vocabulary of the wrong size");
    EXPECT(fgm_tokenizer_from_gguf(&g, 512, &t, err, sizeof err) == FG_OK, "%s", err);
    size_t ni, no;
    char *in = slurp("tokenizer-tests.inp", &ni), *out = slurp("tokenizer-tests.stories260K.out", &no);
    const char *sep = "\n__ggml_vocab_test__\n";
    int strings = 0, equal = 0;
    char *p = in, *o = out;
    while (p && o && *p) {
        char *end = strstr(p, sep), *line_end = strchr(o, '\n');
        if (end)
            *end = '\0';
        if (line_end)
            *line_end = '\0';
        int32_t ids[4096], n = 0;
        EXPECT(fgm_tokenizer_encode(&t, p, 0, ids, 4096, &n) == FG_OK, "encode");
        char got[16384] = "";
        for (int32_t i = 0; i < n && strlen(got) + 16 < sizeof got; i++)
            snprintf(got + strlen(got), sizeof got - strlen(got), " %d", (int)ids[i]);
        const int same = strcmp(got, o) == 0;
        EXPECT(same, "tokenizer test %d \"%s\":\n  llama.cpp:%s\n  fastgen:  %s", strings, p, o, got);
        equal += same;
        strings++;
        p = end ? end + strlen(sep) : NULL;
        o = line_end ? line_end + 1 : NULL;
    }
    EXPECT(strings >= 40, "only %d tokenizer test strings read", strings);
    printf("tokenizer: %d of %d strings give llama.cpp's ids\n", equal, strings);
    free(in);
    free(out);
    fgm_tokenizer_free(&t);
    fgm_gguf_free(&g);
}

/* ------------------------------------------------------------------ byte-level BPE */

typedef struct pieces {
    char text[64][32];
    int n;
} pieces;

static void collect(void *user, const char *s, size_t n) {
    pieces *p = user;
    if (p->n < 64)
        snprintf(p->text[p->n++], 32, "%.*s", (int)n, s);
}

static void expect_split(fgm_pretok pre, const char *text, const char *const *want, int n_want) {
    pieces p = {.n = 0};
    fgm_bpe_pretokenize(pre, text, collect, &p);
    int same = p.n == n_want;
    for (int i = 0; same && i < n_want; i++)
        same = !strcmp(p.text[i], want[i]);
    EXPECT(same, "pre-tokens of \"%s\": %d pieces, first \"%s\"", text, p.n, p.n ? p.text[0] : "");
}

/* A GGUF holding only a gpt2 vocabulary: the 256 byte stand-ins, then the
 * tokens the first n_tokens merges make (all of them when n_tokens < 0). */
static builder bpe_vocab(const char *const *merges, int n_merges, int n_tokens, const char *pre) {
    n_tokens = n_tokens < 0 ? n_merges : n_tokens;
    static char stand_in[256][4];
    int n_bytes = 0;
    for (unsigned b = 0, extra = 0; b < 256; b++) {
        const int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
        const unsigned cp = printable ? b : 256 + extra++;
        if (cp < 0x80)
            snprintf(stand_in[b], 4, "%c", (char)cp);
        else
            snprintf(stand_in[b], 4, "%c%c", (char)(0xC0 | cp >> 6), (char)(0x80 | (cp & 0x3F)));
        n_bytes++;
    }
    builder w = {0};
    put(&w, "GGUF", 4);
    put_u32(&w, 3);
    put_u64(&w, 0);
    put_u64(&w, 4);
    put_str(&w, "tokenizer.ggml.model");
    put_u32(&w, FGM_GGUF_STRING);
    put_str(&w, "gpt2");
    put_str(&w, "tokenizer.ggml.pre");
    put_u32(&w, FGM_GGUF_STRING);
    put_str(&w, pre);
    put_str(&w, "tokenizer.ggml.tokens");
    put_u32(&w, FGM_GGUF_ARRAY);
    put_u32(&w, FGM_GGUF_STRING);
    put_u64(&w, (uint64_t)(n_bytes + n_tokens));
    for (int b = 0; b < n_bytes; b++)
        put_str(&w, stand_in[b]);
    for (int m = 0; m < n_tokens; m++) { /* the token a merge makes: its two sides joined */
        char joined[64];
        const char *sp = strchr(merges[m], ' ');
        snprintf(joined, sizeof joined, "%.*s%s", (int)(sp - merges[m]), merges[m], sp + 1);
        put_str(&w, joined);
    }
    put_str(&w, "tokenizer.ggml.merges");
    put_u32(&w, FGM_GGUF_ARRAY);
    put_u32(&w, FGM_GGUF_STRING);
    put_u64(&w, (uint64_t)n_merges);
    for (int m = 0; m < n_merges; m++)
        put_str(&w, merges[m]);
    return w;
}

/* text's ids under the merges (tokens for the first n_tokens; all when < 0), and their decoding, which is
 * `back` (text when NULL). */
static void expect_ids_as(const char *const *merges, int n_merges, int n_tokens, const char *text, const int32_t *want,
                          int n_want, const char *back_want, const char *what) {
    builder w = bpe_vocab(merges, n_merges, n_tokens, "gpt2");
    fgm_gguf g;
    fgm_tokenizer t;
    char err[400] = "";
    EXPECT(fgm_gguf_parse(w.b, w.n, &g, err, sizeof err) == FG_OK, "%s", err);
    EXPECT(fgm_tokenizer_from_gguf(&g, 256 + (n_tokens < 0 ? n_merges : n_tokens), &t, err, sizeof err) == FG_OK,
           "%s: %s", what, err);
    int32_t ids[64], n = 0;
    EXPECT(fgm_tokenizer_encode(&t, text, 0, ids, 64, &n) == FG_OK && n == n_want &&
               !memcmp(ids, want, (size_t)n * sizeof *ids),
           "%s: \"%s\" -> %d ids, first %d", what, text, (int)n, n ? (int)ids[0] : -1);
    char back[256] = "";
    for (int32_t i = 0; i < n; i++)
        strncat(back, fgm_tokenizer_decode(&t, i ? ids[i - 1] : -1, ids[i]), sizeof back - strlen(back) - 1);
    EXPECT(!strcmp(back, back_want ? back_want : text), "%s: decodes back to \"%s\"", what, back);
    fgm_tokenizer_free(&t);
    fgm_gguf_free(&g);
    free(w.b);
}

static void expect_ids(const char *const *merges, int n_merges, const char *text, const int32_t *want, int n_want,
                       const char *what) {
    expect_ids_as(merges, n_merges, -1, text, want, n_want, NULL, what);
}

static void test_bpe(void) {
    /* GPT-2's pattern, alternative by alternative; smollm splits digits first */
    const char *gpt2[] = {"Hello", " world", "'s", " 123", " ", " test", "\n", "\n", "foo", "!!", " "};
    expect_split(FGM_PRETOK_GPT2, "Hello world's 123  test\n\nfoo!! ", gpt2, 11);
    const char *smollm[] = {"Hello", "'s", " ", "1", "2", "3", "x"};
    expect_split(FGM_PRETOK_SMOLLM, "Hello's 123x", smollm, 7);
    const char *uni[] = {"h\xc3\xa9llo", " w\xc3\xb6rld", " \xf0\x9f\xa6\x99.", "cpp", " \xd0\xbd\xd0\xb5"};
    expect_split(FGM_PRETOK_GPT2, "h\xc3\xa9llo w\xc3\xb6rld \xf0\x9f\xa6\x99.cpp \xd0\xbd\xd0\xb5", uni, 5);
    /* a space character of several bytes alone between words (U+00A0, U+3000) stands alone; after
       another space it still goes to neither word (this once looped for ever) */
    const char *wide[] = {"a", "\xc2\xa0", "b", "\xe3\x80\x80", "c", " ", "\xc2\xa0", "d"};
    expect_split(FGM_PRETOK_GPT2, "a\xc2\xa0" "b\xe3\x80\x80" "c \xc2\xa0" "d", wide, 8);
    /* merges by rank: the lower rank first, whatever the position */
    const char *ll_first[] = {"l l", "e l", "h e"};
    expect_ids(ll_first, 3, "hell", (const int32_t[]){258, 256}, 2, "l l before e l");
    const char *el_first[] = {"e l", "l l", "h el"};
    expect_ids(el_first, 3, "hell", (const int32_t[]){258, 'l'}, 2, "e l before l l");
    /* a merge listed again later keeps its first rank */
    const char *twice[43] = {"e l", "l l", "h el"};
    for (int i = 3; i < 43; i++)
        twice[i] = "e l";
    expect_ids_as(twice, 43, 3, "hell", (const int32_t[]){258, 'l'}, 2, NULL, "a merge listed 41 times");
    /* bytes that are not well-formed UTF-8 (0xFF never occurs; 0xC3 is cut short) are U+FFFD, EF BF BD */
    expect_ids_as(el_first, 3, -1, "a\xff" "b\xc3", (const int32_t[]){'a', 0xEF, 0xBF, 0xBD, 'b', 0xEF, 0xBF, 0xBD}, 8,
                  "a\xEF\xBF\xBD" "b\xEF\xBF\xBD", "ill-formed UTF-8");
    /* the space stand-in (U+0120) joins the word after it; bytes with no merge stay bytes */
    const char *space[] = {"\xc4\xa0 w", "\xc4\xa0w o"};
    expect_ids(space, 2, "a wok\x01", (const int32_t[]){'a', 257, 'k', 1}, 4, "space stand-in");
    /* an unknown pre-tokenizer is refused by name */
    builder w = bpe_vocab(space, 2, -1, "llama3-something");
    fgm_gguf g;
    fgm_tokenizer t;
    char err[400] = "";
    EXPECT(fgm_gguf_parse(w.b, w.n, &g, err, sizeof err) == FG_OK, "%s", err);
    EXPECT(fgm_tokenizer_from_gguf(&g, 258, &t, err, sizeof err) == FG_ERR_UNAVAILABLE && strstr(err, "llama3"),
           "unknown pre-tokenizer: %s", err);
    fgm_gguf_free(&g);
    free(w.b);
    printf("byte-level BPE: pre-tokenizers and merges on built vocabularies\n");
}

/* Random blocks of `type` with sane f16 scales: every byte pattern of the
 * quants is a valid block. */
static void random_blocks(int32_t type, unsigned char *w, int64_t n_values) {
    const fgm_type_info *ti = fgm_type_info_of(type);
    const int64_t bytes = n_values / ti->block * ti->bytes;
    for (int64_t i = 0; i < bytes; i++)
        w[i] = (unsigned char)rng_next();
    if (type == FGM_GGML_F16 || type == FGM_GGML_BF16)
        for (int64_t i = 0; i < n_values; i++) {
            const uint16_t h = type == FGM_GGML_F16 ? fg_f32_to_f16(rng_gauss()) : fg_f32_to_bf16(rng_gauss());
            memcpy(w + 2 * i, &h, 2);
        }
    /* the f16 scales: d (and m or dmin) first, but q6_K keeps its d last */
    const int n_scales = type == FGM_GGML_Q4_1 || type == FGM_GGML_Q5_1 || type == FGM_GGML_Q4_K ? 2 : 1;
    for (int64_t b = 0; type != FGM_GGML_F16 && type != FGM_GGML_BF16 && b < n_values / ti->block; b++) {
        unsigned char *blk = w + b * ti->bytes + (type == FGM_GGML_Q6_K ? ti->bytes - 2 : 0);
        for (int k = 0; k < n_scales; k++) {
            const uint16_t h = fg_f32_to_f16((float)(rng_gauss() * 0.05));
            memcpy(blk + 2 * k, &h, 2);
        }
    }
}

/* ggml's x86 dot of a q4_0 / q4_1 / q8_0 weight row with 8-bit activations,
 * in its order of float operations: per block, 8 lanes of 4 integer products
 * each (elements 4k..4k+3, the low nibbles being elements 0-15), each lane
 * fused-multiply-added into its own accumulator with d_w * d_a; the lanes
 * summed as (k, k+4), then (0, 2) + (1, 3); plus, for q4_1, m_w * s_a summed
 * block after block. */
static float ggml_order_dot(int32_t type, const unsigned char *w, const fgm_q8_block *a, int32_t nb) {
    const size_t wb = type == FGM_GGML_Q4_1 ? 20 : type == FGM_GGML_Q4_0 ? 18 : 34;
    float acc[8] = {0}, summs = 0.0f;
    for (int32_t b = 0; b < nb; b++, w += wb, a++) {
        int q[32];
        for (int j = 0; j < 32; j++) {
            if (type == FGM_GGML_Q8_0)
                q[j] = (int8_t)w[2 + j];
            else {
                const unsigned char byte = w[(type == FGM_GGML_Q4_1 ? 4 : 2) + j % 16];
                q[j] = (j < 16 ? byte & 0x0F : byte >> 4) - (type == FGM_GGML_Q4_0 ? 8 : 0);
            }
        }
        uint16_t h;
        memcpy(&h, w, 2);
        const float de = fg_f16_to_f32(h) * a->d;
        for (int k = 0; k < 8; k++) {
            int lane = 0;
            for (int j = 4 * k; j < 4 * k + 4; j++)
                lane += q[j] * a->qs[j];
            acc[k] = fmaf(de, (float)lane, acc[k]);
        }
        if (type == FGM_GGML_Q4_1) {
            memcpy(&h, w + 2, 2);
            summs += fg_f16_to_f32(h) * a->s;
        }
    }
    float s4[4];
    for (int k = 0; k < 4; k++)
        s4[k] = acc[k] + acc[k + 4];
    return ((s4[0] + s4[2]) + (s4[1] + s4[3])) + summs;
}

/* The decode step's matrix products (model/matvec.c): the vector kernels
 * against the plain reference, f32 activations and ggml's 8-bit ones, on
 * rows of 16 blocks and of 17 (the 8-bit kernel's last block alone). */
static void test_matvec(void) {
    static const int32_t types[] = {FGM_GGML_Q4_0, FGM_GGML_Q4_1, FGM_GGML_Q8_0, FGM_GGML_F16, FGM_GGML_BF16,
                                    FGM_GGML_Q5_0, FGM_GGML_Q5_1, FGM_GGML_Q4_K, FGM_GGML_Q6_K};
    enum { OUT = 67, IN_MAX = 544 };
    unsigned char *w = malloc((size_t)OUT * IN_MAX * 4);
    float *x = malloc(sizeof(float) * FGM_MATVEC_MAX_ROWS * IN_MAX), *row = malloc(sizeof(float) * IN_MAX);
    float *y = malloc(sizeof(float) * FGM_MATVEC_MAX_ROWS * OUT);
    float *want = malloc(sizeof(float) * FGM_MATVEC_MAX_ROWS * OUT);
    fgm_q8_block *act = malloc(sizeof(fgm_q8_block) * FGM_MATVEC_MAX_ROWS * IN_MAX / 32);
    fg_threadpool *pool = NULL; /* three threads: the rows split unevenly into tasks */
    EXPECT(fg_threadpool_create(3, &pool) == FG_OK, "a pool of 3 threads: %s", fg_last_error(NULL));
    for (int32_t in = 512; in <= IN_MAX; in += 32) {
        for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
            const fgm_type_info *ti = fgm_type_info_of(types[t]);
            if (in % ti->block)
                continue; /* the k-quants' blocks of 256 */
            random_blocks(types[t], w, (int64_t)OUT * in);
            const fgm_tensor W = {types[t], w, OUT, in};
            for (int32_t rows = 1; rows <= FGM_MATVEC_MAX_ROWS; rows += 3) {
                for (int32_t i = 0; i < rows * in; i++)
                    x[i] = rng_gauss();
                /* a block whose quants tie: amax 127 makes x * 127 / amax = x, and x = k + 0.5 rounds to even */
                x[0] = 127.0f;
                for (int32_t i = 1; i < 32; i++)
                    x[i] = (float)(i - 16) + 0.5f;
                for (int32_t i = 32; i < 64; i++)
                    x[i] = 0.0f; /* and a block of zeros */
                /* the exact product of the dequantized weights, in double */
                double worst = 0.0, worst_q8 = 0.0, worst_int = 0.0;
                for (int32_t o = 0; o < OUT; o++) {
                    ti->to_float(w + (size_t)o * (size_t)fgm_type_row_bytes(types[t], in), row, in);
                    for (int32_t r = 0; r < rows; r++) {
                        double s = 0.0, mag = 0.0;
                        for (int32_t i = 0; i < in; i++) {
                            s += (double)row[i] * x[r * in + i];
                            mag += fabs((double)row[i] * x[r * in + i]);
                        }
                        want[r * OUT + o] = (float)s;
                        y[r * OUT + o] = (float)mag; /* scale of the rounding, for the moment */
                    }
                }
                float *mag = malloc(sizeof(float) * (size_t)rows * OUT);
                float *ref = malloc(sizeof(float) * (size_t)rows * OUT);
                memcpy(mag, y, sizeof(float) * (size_t)rows * OUT);
                fgm_matvec(pool, y, OUT, x, &W, rows);
                fgm_matvec_ref(ref, OUT, x, &W, rows);
                for (int32_t i = 0; i < rows * OUT; i++) {
                    worst = fmax(worst, fabs(y[i] - want[i]) / mag[i]);
                    worst = fmax(worst, fabs(ref[i] - want[i]) / mag[i]);
                }
                EXPECT(worst < 1e-5, "%s, %d rows of %d: f32 products off by %.3g of their magnitude", ti->name,
                       (int)rows, (int)in, worst);
                if (fgm_matvec_quantizes(types[t])) {
                    /* q8 activations: within their rounding (half a step of amax/127 per value) of the exact product */
                    fgm_matvec_q8(pool, y, OUT, x, &W, rows, act);
                    for (int32_t i = 0; i < rows * OUT; i++)
                        worst_q8 = fmax(worst_q8, fabs(y[i] - want[i]) / mag[i]);
                    EXPECT(worst_q8 < 0.03 && worst_q8 > 0.0, "%s, %d rows: q8 products off by %.3g of their magnitude",
                           ti->name, (int)rows, worst_q8);
                    /* the vector kernel equals the integer reference but for float rounding, and a row
                       alone gets what it gets in a batch */
                    const size_t act_bytes = sizeof(fgm_q8_block) * (size_t)rows * in / 32;
                    fgm_q8_block *vec_act = malloc(act_bytes);
                    memcpy(vec_act, act, act_bytes);
                    fgm_matvec_q8_ref(ref, OUT, x, &W, rows, act);
                    EXPECT(memcmp(vec_act, act, act_bytes) == 0, "%s, %d rows: the vector quantization of the "
                           "activations differs from the plain loop's", ti->name, (int)rows);
                    free(vec_act);
                    /* where the vector kernels run (AVX2 with F16C, or VNNI), their sums are ggml's vec_dot's,
                       bit for bit; q5_0 and q5_1 take the plain loop, which is not */
                    const fg_cpu_features cpu = fg_cpu_features_get();
                    if (cpu.isa >= FG_ISA_AVX2 && cpu.f16c && types[t] != FGM_GGML_Q5_0 &&
                        types[t] != FGM_GGML_Q5_1) {
                        int differ = 0;
                        for (int32_t r = 0; r < rows; r++)
                            for (int32_t o = 0; o < OUT; o++) {
                                const float g = ggml_order_dot(types[t], w + (size_t)o * (size_t)fgm_type_row_bytes(
                                                                              types[t], in), act + (size_t)r * in / 32,
                                                               in / 32);
                                differ += memcmp(&g, &y[r * OUT + o], sizeof g) != 0;
                            }
                        EXPECT(differ == 0, "%s, %d rows: %d of %d products not summed in ggml's order", ti->name,
                               (int)rows, differ, (int)(rows * OUT));
                    }
                    for (int32_t i = 0; i < rows * OUT; i++)
                        worst_int = fmax(worst_int, fabs(ref[i] - y[i]) / mag[i]);
                    for (int32_t r = 0; r < rows; r++)
                        for (int32_t o = 0; o < OUT; o++) {
                            const size_t at = (size_t)o * (size_t)fgm_type_row_bytes(types[t], in);
                            const fgm_tensor one = {types[t], w + at, 1, in};
                            float ro;
                            fgm_matvec_q8(NULL, &ro, 1, x + r * in, &one, 1, act);
                            worst_int = fmax(worst_int, fabs(ro - y[r * OUT + o]) / mag[r * OUT + o]);
                        }
                    EXPECT(worst_int < 1e-5, "%s, %d rows: q8 kernel vs its reference, or alone vs batched: %.3g",
                           ti->name, (int)rows, worst_int);
                }
                free(mag);
                free(ref);
            }
        }
    }
    free(w);
    free(x);
    free(row);
    free(y);
    free(want);
    free(act);
    fg_threadpool_destroy(&pool);
}

/* Token classes from a GGUF's raw tokenizer.ggml.tokens with their encoding
 * equal those from the decoded text (the runner's way), id for id; as text,
 * the raw strings lose most of their punctuation, and a context says so. */
static void warn_log(void *user, fg_log_level level, const char *msg) {
    if (level == FG_LOG_WARN && strstr(msg, "fg_token_classes_create_from"))
        ++*(int *)user;
}

static void raw_classes(const char *path) {
    char err[400] = "";
    fgm_gguf g;
    if (fgm_gguf_open(path, &g, err, sizeof err) != FG_OK) {
        EXPECT(0, "%s: %s", path, err);
        return;
    }
    const fgm_gguf_kv *tokens = fgm_gguf_find(&g, "tokenizer.ggml.tokens");
    char model[32];
    fgm_gguf_get_str(&g, "tokenizer.ggml.model", model, sizeof model);
    const int32_t V = tokens ? (int32_t)tokens->n_elems : 0;
    fgm_tokenizer tok;
    if (V <= 0 || fgm_tokenizer_from_gguf(&g, V, &tok, err, sizeof err) != FG_OK) {
        EXPECT(0, "%s: %s", path, err);
        fgm_gguf_free(&g);
        return;
    }
    const char **text = malloc((size_t)V * sizeof *text);
    for (int32_t i = 0; i < V; i++)
        text[i] = tok.kind == FGM_TOKENIZER_BPE ? tok.text[i] : tok.pieces[i];
    const fg_piece_encoding enc = !strcmp(model, "gpt2") ? FG_PIECES_GPT2_BYTES : FG_PIECES_SENTENCEPIECE;
    fg_token_classes *from_text = NULL, *from_raw = NULL, *raw_as_text = NULL;
    EXPECT(fg_token_classes_create(V, text, &from_text) == FG_OK &&
               fg_token_classes_create_from(V, tokens->strs, enc, &from_raw) == FG_OK &&
               fg_token_classes_create(V, tokens->strs, &raw_as_text) == FG_OK,
           "%s: classes", path);
    int32_t differ = 0;
    for (int32_t i = 0; from_text && from_raw && i < V; i++) {
        fg_token_class a, b;
        fg_token_classes_get(from_text, i, &a);
        fg_token_classes_get(from_raw, i, &b);
        differ += a != b;
    }
    const int32_t punct = fg_token_classes_count(from_raw, FG_TOKEN_PUNCT);
    const int32_t lost = punct - fg_token_classes_count(raw_as_text, FG_TOKEN_PUNCT);
    EXPECT(differ == 0 && punct > 0, "%s (%s): raw pieces with their encoding: %d of %d ids classed otherwise than "
           "the decoded text (%d punctuation)", path, model, (int)differ, (int)V, (int)punct);
    EXPECT(lost > 0, "%s: the raw strings taken as text lose punctuation (%d of %d)", path, (int)lost, (int)punct);
    /* a context built from the raw strings as text warns */
    int warned = 0;
    fg_context_params p = test_context_params("ref", 1, 2, 1, 8);
    p.classes = raw_as_text;
    p.log_fn = warn_log;
    p.log_user = &warned;
    fg_context *ctx = NULL;
    EXPECT(fg_context_create(&p, &ctx) == FG_OK && warned == 1, "%s: a context of raw strings taken as text warns "
           "(%d)", path, warned);
    fg_context_destroy(&ctx);
    warned = 0;
    p.classes = from_raw;
    EXPECT(fg_context_create(&p, &ctx) == FG_OK && warned == 0, "%s: the right classes do not warn", path);
    fg_context_destroy(&ctx);
    printf("  %s: %d ids, %d punctuation from the raw %s pieces (%d of them lost when taken as text)\n", path,
           (int)V, (int)punct, model, (int)lost);
    fg_token_classes_destroy(&from_text);
    fg_token_classes_destroy(&from_raw);
    fg_token_classes_destroy(&raw_as_text);
    free(text);
    fgm_tokenizer_free(&tok);
    fgm_gguf_free(&g);
}

static void test_raw_classes(const char *extra) {
    const char *files[] = {"stories260K-f32", "babyllama105-q8_0"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s.gguf", g_dir, files[i]);
        raw_classes(path);
    }
    if (extra) /* SmolLM2 in CI: byte-level BPE */
        raw_classes(extra);
    /* GPT-2 stand-ins by hand: "Ġ," is a space and a comma, "Ċ" a newline, "Ġa" a word, a bad string nothing */
    const char *bpe[] = {"\xc4\xa0,", "\xc4\x8a", "\xc4\xa0\x61" /* Ġa */, "!!", "\xff", "\xc4\xa0", "\xe2\x96\x81."};
    fg_token_classes *tc = NULL;
    EXPECT(fg_token_classes_create_from(7, bpe, FG_PIECES_GPT2_BYTES, &tc) == FG_OK, "GPT-2 pieces");
    const fg_token_class want[] = {FG_TOKEN_PUNCT, FG_TOKEN_PUNCT, FG_TOKEN_ORDINARY, FG_TOKEN_PUNCT,
                                   FG_TOKEN_ORDINARY, FG_TOKEN_PUNCT, FG_TOKEN_ORDINARY};
    for (int i = 0; tc && i < 7; i++) {
        fg_token_class c;
        fg_token_classes_get(tc, i, &c);
        EXPECT(c == want[i], "GPT-2 piece %d: class %d, want %d", i, (int)c, (int)want[i]);
    }
    fg_token_classes_destroy(&tc);
    EXPECT(fg_token_classes_create_from(7, bpe, (fg_piece_encoding)9, &tc) == FG_ERR_INVALID_ARGUMENT && !tc,
           "an unknown encoding is refused");
}

int main(int argc, char **argv) {
    test_seed("test_gguf");
    if (argc < 3) {
        fprintf(stderr, "usage: test_gguf GGUF_DIR MODEL_DIR [SMOLLM2.gguf]\n");
        return 1;
    }
    g_dir = argv[1];
    g_model_dir = argv[2];
    test_raw_classes(argc > 3 ? argv[3] : NULL);
    test_quants();
    test_crafted();
    test_rope_base();
    test_tokenizer();
    test_bpe();
    test_files();
    test_matvec();
    return test_finish();
}
