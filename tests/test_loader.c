/*
 * The llama2.c loader and tokenizer on small files built here: valid ones
 * load; truncated files, header fields that disagree with each other or with
 * the size, non-finite weights, tokenizers with fewer entries than the
 * vocabulary or lengths past the end each give a clear error, never a crash.
 * Encoding and decoding follow the SentencePiece-style rules. The sampler
 * takes any logits (NaN and infinities included) and the repetition penalty
 * touches each distinct token once.
 */
#include <string.h>
#include <unistd.h>

#include "tests/support/harness.h"
#include "model/llama2c.h"
#include "model/tokenizer.h"
#include "model/io.h"
#include "model/runner.h"

static unsigned char *checkpoint(int32_t dim, int32_t hidden, int32_t layers, int32_t heads, int32_t kv,
                                 int32_t vocab, int32_t seq, int shared, size_t *size) {
    int32_t head = dim / heads, kv_dim = kv * head;
    size_t floats = (size_t)vocab * dim + (size_t)layers * dim + (size_t)layers * dim * dim +
                    2 * (size_t)layers * kv_dim * dim + (size_t)layers * dim * dim + (size_t)layers * dim +
                    3 * (size_t)layers * hidden * dim + dim + (size_t)seq * head + (shared ? 0 : (size_t)vocab * dim);
    *size = 28 + 4 * floats;
    unsigned char *buf = malloc(*size);
    int32_t h[7] = {dim, hidden, layers, heads, kv, shared ? vocab : -vocab, seq};
    memcpy(buf, h, sizeof h);
    for (size_t i = 0; i < floats; i++) {
        float f = (float)((i * 37) % 101) / 101.0f - 0.5f;
        memcpy(buf + 28 + 4 * i, &f, 4);
    }
    return buf;
}

static fg_status load(const unsigned char *buf, size_t size, char *err) {
    fgm_llama_model m;
    fg_status st = fgm_llama_load_memory(buf, size, &m, err, 256);
    if (st == FG_OK)
        fgm_llama_free(&m);
    return st;
}

static void test_checkpoints(void) {
    char err[256];
    size_t size;
    unsigned char *buf = checkpoint(8, 12, 2, 4, 2, 16, 5, 1, &size);
    fgm_llama_model m;
    EXPECT(fgm_llama_load_memory(buf, size, &m, err, sizeof err) == FG_OK, "valid shared checkpoint: %s", err);
    EXPECT(m.config.head_size == 2 && m.config.kv_dim == 4 && m.config.shared_classifier &&
               m.weights.wcls.data == m.weights.token_embedding.data,
           "config of a shared checkpoint");
    fgm_llama_free(&m);
    /* every truncation fails cleanly */
    int bad = 0;
    for (size_t n = 0; n < size; n += (n < 64 ? 1 : 97))
        bad += load(buf, n, err) != FG_ERR_FORMAT || !err[0];
    EXPECT(bad == 0, "%d truncations were not a format error", bad);
    EXPECT(load(buf, size - 1, err) == FG_ERR_FORMAT && strstr(err, "truncated"), "one byte short: %s", err);
    unsigned char *longer = malloc(size + 4);
    memcpy(longer, buf, size);
    EXPECT(load(longer, size + 4, err) == FG_ERR_FORMAT, "trailing bytes");
    free(longer);
    /* header fields that disagree */
    struct {
        int field;
        int32_t value;
        const char *why;
    } bad_headers[] = {
        {0, 0, "dim 0"},           {0, -8, "negative dim"},         {0, 7, "dim not divisible by heads"},
        {1, 0, "hidden 0"},        {2, 0, "no layers"},             {3, 3, "heads do not divide dim"},
        {4, 3, "kv heads do not divide heads"}, {4, 0, "no kv heads"}, {5, 0, "vocab 0"},
        {6, 0, "seq_len 0"},       {0, 1 << 30, "huge dim"},        {5, INT32_MIN, "vocab INT32_MIN"},
        {6, 1 << 30, "huge seq_len"}, {2, 3, "more layers than the file holds"},
        {5, -16, "separate classifier the file does not hold"},
    };
    for (size_t i = 0; i < sizeof bad_headers / sizeof bad_headers[0]; i++) {
        unsigned char *b = malloc(size);
        memcpy(b, buf, size);
        memcpy(b + 4 * bad_headers[i].field, &bad_headers[i].value, 4);
        fg_status st = load(b, size, err);
        EXPECT(st == FG_ERR_FORMAT && err[0], "%s: %s (%s)", bad_headers[i].why, fg_status_string(st), err);
        free(b);
    }
    /* a weight that is not finite */
    float nan = NAN;
    memcpy(buf + 28 + 4 * 100, &nan, 4);
    EXPECT(load(buf, size, err) == FG_ERR_FORMAT && strstr(err, "finite"), "NaN weight: %s", err);
    free(buf);
    /* separate classifier */
    buf = checkpoint(8, 8, 1, 2, 1, 10, 3, 0, &size);
    EXPECT(fgm_llama_load_memory(buf, size, &m, err, sizeof err) == FG_OK && !m.config.shared_classifier &&
               m.weights.wcls.data != m.weights.token_embedding.data,
           "separate classifier: %s", err);
    fgm_llama_free(&m);
    free(buf);
    EXPECT(fgm_llama_load_file("/nonexistent/model.bin", &m, err, sizeof err) == FG_ERR_IO && strstr(err, "nonexistent"),
           "missing file: %s", err);
}

/* A tokenizer file: pieces with scores -i. */
static unsigned char *tokfile(const char *const *pieces, int32_t n, size_t *size) {
    size_t total = 4;
    for (int32_t i = 0; i < n; i++)
        total += 8 + strlen(pieces[i]);
    unsigned char *buf = malloc(total), *p = buf + 4;
    uint32_t maxlen = 8;
    memcpy(buf, &maxlen, 4);
    for (int32_t i = 0; i < n; i++) {
        float score = -(float)i;
        int32_t len = (int32_t)strlen(pieces[i]);
        memcpy(p, &score, 4);
        memcpy(p + 4, &len, 4);
        memcpy(p + 8, pieces[i], (size_t)len);
        p += 8 + len;
    }
    *size = total;
    return buf;
}

static void test_tokenizer(void) {
    /* ids 3..258 are the byte pieces, then merges ordered by score */
    static char bytes[256][8];
    const char *pieces[270];
    pieces[0] = "<unk>";
    pieces[1] = "\n<s>\n";
    pieces[2] = "\n</s>\n";
    for (int b = 0; b < 256; b++) {
        snprintf(bytes[b], sizeof bytes[b], "<0x%02X>", b);
        pieces[3 + b] = bytes[b];
    }
    const char *merges[] = {" ", "a", "b", "ab", " ab", "c", " c", ".", "<0x-1>", "<0x 1>"};
    for (int i = 0; i < 10; i++)
        pieces[259 + i] = merges[i];
    const int32_t V = 269;
    size_t size;
    unsigned char *buf = tokfile(pieces, V, &size);
    fgm_tokenizer t;
    char err[256];
    EXPECT(fgm_tokenizer_load_memory(buf, size, V, &t, err, sizeof err) == FG_OK, "valid tokenizer: %s", err);
    int32_t tok[32], n = 0;
    EXPECT(fgm_tokenizer_encode(&t, "ab c.", 1, tok, 32, &n) == FG_OK, "encode");
    /* BOS, " ab" (merged from " ", "a", "b"), " c", "." */
    const int32_t want[] = {1, 263, 265, 266};
    EXPECT(n == 4 && memcmp(tok, want, sizeof want) == 0, "encoding of \"ab c.\": %d tokens", (int)n);
    EXPECT(strcmp(fgm_tokenizer_decode(&t, 1, 263), "ab") == 0, "leading space dropped after BOS");
    EXPECT(strcmp(fgm_tokenizer_decode(&t, 5, 263), " ab") == 0, "space kept elsewhere");
    /* byte fallback: 'z' and the two bytes of an unknown code point */
    EXPECT(fgm_tokenizer_encode(&t, "z\xc3\xa9", 0, tok, 32, &n) == FG_OK && n == 4 && tok[1] == 3 + 'z' &&
               tok[2] == 3 + 0xc3 && tok[3] == 3 + 0xa9,
           "byte fallback (%d tokens)", (int)n);
    EXPECT(strcmp(fgm_tokenizer_decode(&t, 0, 3 + 'z'), "z") == 0, "byte piece decodes to its byte");
    EXPECT(strcmp(fgm_tokenizer_decode(&t, 0, 267), "<0x-1>") == 0 && strcmp(fgm_tokenizer_decode(&t, 0, 268), "<0x 1>") == 0,
           "only two hex digits make a byte piece (a sign once read out of bounds)");
    EXPECT(fgm_tokenizer_decode(&t, 0, V + 3)[0] == '\0' && fgm_tokenizer_decode(&t, 0, -1)[0] == '\0',
           "out-of-range ids decode to nothing");
    EXPECT(fgm_tokenizer_encode(&t, "abcabcabc", 1, tok, 3, &n) == FG_ERR_CAPACITY && n > 3, "capacity");
    fgm_tokenizer_free(&t);

    /* fewer entries than the vocabulary */
    EXPECT(fgm_tokenizer_load_memory(buf, size, V + 1, &t, err, sizeof err) == FG_ERR_FORMAT && strstr(err, "entries"),
           "short tokenizer: %s", err);
    /* more entries than the vocabulary: trailing bytes are refused, not ignored */
    EXPECT(fgm_tokenizer_load_memory(buf, size, V - 1, &t, err, sizeof err) == FG_ERR_FORMAT && strstr(err, "after"),
           "tokenizer with trailing bytes: %s", err);
    /* every truncation */
    int bad = 0;
    for (size_t k = 0; k < size; k += 7)
        bad += fgm_tokenizer_load_memory(buf, k, V, &t, err, sizeof err) != FG_ERR_FORMAT;
    EXPECT(bad == 0, "%d truncated tokenizers loaded", bad);
    /* a length that runs past the end, a negative one, a NaN score */
    int32_t huge = 1 << 30, neg = -5;
    float nan = NAN;
    unsigned char *b2 = malloc(size);
    memcpy(b2, buf, size);
    memcpy(b2 + 8, &huge, 4);
    EXPECT(fgm_tokenizer_load_memory(b2, size, V, &t, err, sizeof err) == FG_ERR_FORMAT, "length past the end: %s", err);
    memcpy(b2 + 8, &neg, 4);
    EXPECT(fgm_tokenizer_load_memory(b2, size, V, &t, err, sizeof err) == FG_ERR_FORMAT, "negative length: %s", err);
    memcpy(b2, buf, size);
    memcpy(b2 + 4, &nan, 4);
    EXPECT(fgm_tokenizer_load_memory(b2, size, V, &t, err, sizeof err) == FG_ERR_FORMAT, "NaN score: %s", err);
    EXPECT(fgm_tokenizer_load_memory(b2, 3, V, &t, err, sizeof err) == FG_ERR_FORMAT, "3-byte file");
    EXPECT(fgm_tokenizer_load_memory(buf, size, 0, &t, err, sizeof err) == FG_ERR_INVALID_ARGUMENT, "vocab 0");
    free(b2);
    free(buf);
}

/* The one file reader refuses what is neither a regular file nor a pipe (a
 * directory opens, and ftell then says LONG_MAX; a device may never end),
 * and reads a pipe to its end. */
static void test_read_file(void) {
    const char *not_files[] = {".", "/", "/dev/null", "/dev/zero"};
    for (size_t i = 0; i < sizeof not_files / sizeof not_files[0]; i++) {
        void *data = (void *)1;
        size_t size = 7;
        char err[256] = "";
        EXPECT(fgm_read_file(not_files[i], &data, &size, err, sizeof err) == FG_ERR_IO && data == NULL && size == 0 &&
                   strstr(err, "not a file or a pipe"),
               "fgm_read_file(%s): %s", not_files[i], err);
    }
    void *data;
    size_t size;
    char err[256] = "";
    int fds[2];
    if (pipe(fds) == 0) {
        char path[64];
        snprintf(path, sizeof path, "/dev/fd/%d", fds[0]);
        const int wrote = write(fds[1], "a pipe\n", 7) == 7;
        close(fds[1]);
        const fg_status rs = fgm_read_file(path, &data, &size, err, sizeof err);
        EXPECT(wrote && rs == FG_OK && size == 7 && !memcmp(data, "a pipe\n", 7), "a pipe read to its end: %s", err);
        if (rs == FG_OK)
            free(data);
        close(fds[0]);
    }
    EXPECT(fgm_read_file("/nonexistent/x.bin", &data, &size, err, sizeof err) == FG_ERR_IO && strstr(err, "x.bin"),
           "missing file: %s", err);
}

static void test_sampler(void) {
    enum { V = 64 };
    float logits[V];
    const float odd[] = {NAN, INFINITY, -INFINITY};
    for (int o = 0; o < 3; o++)
        for (int at = 0; at < V; at += 21) {
            for (int trial = 0; trial < 4; trial++) {
                fgm_sampler g = {0.8f, trial & 1 ? 0.5f : 1.0f, 42u + (uint64_t)trial, trial & 2 ? 5 : 0};
                for (int i = 0; i < V; i++)
                    logits[i] = (float)((i * 7) % 13) - 6.0f;
                logits[at] = odd[o];
                const int32_t t = fgm_sample(&g, logits, V);
                EXPECT(t >= 0 && t < V, "logit %d = %g: sampled %d", at, (double)odd[o], (int)t);
            }
        }
    /* a top_p below every token's mass still takes the likeliest one */
    fgm_sampler g = {1.0f, 1e-9f, 7u, 0};
    for (int i = 0; i < V; i++)
        logits[i] = i == 17 ? 5.0f : 0.0f;
    EXPECT(fgm_sample(&g, logits, V) == 17, "top_p 1e-9 takes the likeliest token");
    /* the penalty: each distinct token once, out-of-vocabulary ids skipped */
    for (int i = 0; i < V; i++)
        logits[i] = 1.0f;
    logits[3] = 4.0f;
    logits[5] = -1.0f;
    const int32_t hist[] = {3, 9, 3, 5, -1, V, 5, 3};
    unsigned char seen[V] = {0};
    fgm_penalize(logits, V, hist, 8, -1, 2.0f, seen);
    EXPECT(logits[3] == 2.0f && logits[5] == -2.0f && logits[9] == 0.5f && logits[0] == 1.0f,
           "penalty once per token: %g %g %g %g", (double)logits[3], (double)logits[5], (double)logits[9],
           (double)logits[0]);
    logits[9] = 1.0f;
    for (int i = 0; i < V; i++)
        EXPECT(!seen[i], "the marks are cleared: token %d", i);
    fgm_penalize(logits, V, hist, 8, 2, 2.0f, seen); /* the last two: 5 and 3 */
    EXPECT(logits[3] == 1.0f && logits[5] == -4.0f && logits[9] == 1.0f, "last_n 2: %g %g %g", (double)logits[3],
           (double)logits[5], (double)logits[9]);
}

int main(void) {
    test_seed("test_loader");
    test_sampler();
    test_checkpoints();
    test_tokenizer();
    test_read_file();
    return test_finish();
}
