/* The llama2.c checkpoint loader of tools/llama2c.h. Every header field is
 * checked against the others and against the file size before any weight is
 * touched. */
#include "tools/llama2c.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>

#include "tools/dequant.h"

fg_status fg_failf(char *err, size_t n, fg_status st, const char *fmt, ...) {
    if (err && n) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, n, fmt, ap);
        va_end(ap);
    }
    return st;
}

/* The whole stream f (a pipe, a FIFO, standard input) into a buffer, at
 * most FG_MAX_FILE_BYTES. */
static fg_status read_stream(FILE *f, const char *path, unsigned char **out, size_t *len, char *err, size_t err_size) {
    size_t cap = 1 << 16, n = 0;
    unsigned char *buf = malloc(cap);
    if (!buf)
        return fg_failf(err, err_size, FG_ERR_OUT_OF_MEMORY, "out of memory reading %s", path);
    for (;;) {
        if (n == cap) {
            if ((uint64_t)cap >= (uint64_t)FG_MAX_FILE_BYTES || cap > SIZE_MAX / 2) {
                if (fgetc(f) == EOF) /* exactly the limit */
                    break;
                free(buf);
                return fg_failf(err, err_size, FG_ERR_IO, "%s holds more than the %lld bytes this tool reads", path,
                                (long long)FG_MAX_FILE_BYTES);
            }
            const size_t grown =
                (uint64_t)(2 * cap) < (uint64_t)FG_MAX_FILE_BYTES ? 2 * cap : (size_t)FG_MAX_FILE_BYTES;
            unsigned char *nb = realloc(buf, grown);
            if (!nb) {
                free(buf);
                return fg_failf(err, err_size, FG_ERR_OUT_OF_MEMORY, "out of memory reading %s", path);
            }
            buf = nb;
            cap = grown;
        }
        const size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0)
            break;
    }
    if (ferror(f)) {
        free(buf);
        return fg_failf(err, err_size, FG_ERR_IO, "cannot read %s", path);
    }
    *out = buf;
    *len = n;
    return FG_OK;
}

fg_status fg_read_file(const char *path, void **data, size_t *size, char *err, size_t err_size) {
    *data = NULL;
    *size = 0;
    const int std_in = !strcmp(path, "-"); /* standard input */
    FILE *f = std_in ? stdin : fopen(path, "rb");
    if (!f)
        return fg_failf(err, err_size, FG_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    /* A regular file's size comes from the open file itself; a pipe, FIFO,
     * socket or terminal on standard input is read to its end; a directory
     * opens, but its "size" from ftell is LONG_MAX, and a device may never
     * end: both are refused. */
    struct stat sb;
    fg_status st = FG_OK;
    unsigned char *buf = NULL;
    size_t len = 0;
    if (fstat(fileno(f), &sb) != 0) {
        st = fg_failf(err, err_size, FG_ERR_IO, "cannot stat %s: %s", path, strerror(errno));
    } else if (S_ISFIFO(sb.st_mode) || S_ISSOCK(sb.st_mode) || (std_in && isatty(fileno(f)))) {
        st = read_stream(f, path, &buf, &len, err, err_size);
    } else if (!S_ISREG(sb.st_mode)) {
        st = fg_failf(err, err_size, FG_ERR_IO, "%s is not a file or a pipe (a %s)", path,
                      S_ISDIR(sb.st_mode) ? "directory" : "device");
    } else if ((uint64_t)sb.st_size > (uint64_t)FG_MAX_FILE_BYTES) {
        st = fg_failf(err, err_size, FG_ERR_IO, "%s is %lld bytes, more than the %lld this tool reads", path,
                      (long long)sb.st_size, (long long)FG_MAX_FILE_BYTES);
    } else {
        len = (size_t)sb.st_size;
        buf = malloc(len > 0 ? len : 1);
        if (!buf)
            st = fg_failf(err, err_size, FG_ERR_OUT_OF_MEMORY, "out of memory reading %s (%zu bytes)", path, len);
        if (st == FG_OK && fread(buf, 1, len, f) != len)
            st = fg_failf(err, err_size, FG_ERR_IO, "cannot read %s (%zu bytes expected)", path, len);
        if (st == FG_OK && fgetc(f) != EOF) /* the file grew while it was read */
            st = fg_failf(err, err_size, FG_ERR_IO, "%s changed while it was read", path);
    }
    if (!std_in)
        fclose(f);
    if (st) {
        free(buf);
        return st;
    }
    *data = buf;
    *size = len;
    return FG_OK;
}

/* Limits that keep every size computation far from overflow. */
#define MAX_DIM (1 << 16)
#define MAX_HIDDEN (1 << 18)
#define MAX_LAYERS 1024
#define MAX_VOCAB (1 << 22)
#define MAX_SEQ (1 << 20)

fg_status fg_llama_load_memory(const void *buf, size_t size, fg_llama_model *out, char *err, size_t err_size) {
    memset(out, 0, sizeof *out);
    if (!buf || size < 7 * sizeof(int32_t))
        return fg_failf(err, err_size, FG_ERR_FORMAT, "checkpoint is %zu bytes, shorter than its 28-byte header", size);
    int32_t h[7];
    memcpy(h, buf, sizeof h);
    fg_llama_config c = {.dim = h[0], .hidden_dim = h[1], .n_layers = h[2], .n_heads = h[3], .n_kv_heads = h[4],
                         .vocab_size = h[5], .seq_len = h[6]};
    c.shared_classifier = c.vocab_size > 0;
    if (c.vocab_size < 0 && c.vocab_size != INT32_MIN)
        c.vocab_size = -c.vocab_size;
    if (c.dim <= 0 || c.dim > MAX_DIM || c.hidden_dim <= 0 || c.hidden_dim > MAX_HIDDEN || c.n_layers <= 0 ||
        c.n_layers > MAX_LAYERS || c.n_heads <= 0 || c.n_kv_heads <= 0 || c.vocab_size <= 0 ||
        c.vocab_size > MAX_VOCAB || c.seq_len <= 0 || c.seq_len > MAX_SEQ)
        return fg_failf(err, err_size, FG_ERR_FORMAT,
                     "implausible header: dim %d, hidden_dim %d, n_layers %d, n_heads %d, n_kv_heads %d, "
                     "vocab_size %d, seq_len %d",
                     h[0], h[1], h[2], h[3], h[4], h[5], h[6]);
    if (c.dim % c.n_heads || c.n_heads % c.n_kv_heads || (c.dim / c.n_heads) % 2)
        return fg_failf(err, err_size, FG_ERR_FORMAT,
                     "header fields disagree: dim %d must split into %d heads of even size, and n_heads %d into "
                     "%d KV heads",
                     c.dim, c.n_heads, c.n_heads, c.n_kv_heads);
    c.head_size = c.dim / c.n_heads;
    c.kv_dim = c.n_kv_heads * c.head_size;

    const uint64_t D = (uint64_t)c.dim, Hd = (uint64_t)c.hidden_dim, L = (uint64_t)c.n_layers;
    const uint64_t V = (uint64_t)c.vocab_size, KV = (uint64_t)c.kv_dim;
    const uint64_t floats = V * D + L * D + L * D * D + 2 * L * KV * D + L * D * D + L * D + 3 * L * Hd * D + D +
                            (uint64_t)c.seq_len * (uint64_t)c.head_size + (c.shared_classifier ? 0 : V * D);
    const uint64_t want = 28 + 4 * floats;
    if ((uint64_t)size != want)
        return fg_failf(err, err_size, FG_ERR_FORMAT,
                     "checkpoint is %zu bytes but its header (dim %d, hidden %d, %d layers, %d/%d heads, vocab %d, "
                     "seq_len %d, %s classifier) needs %llu: truncated or not a llama2.c file",
                     size, c.dim, c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads, c.vocab_size, c.seq_len,
                     c.shared_classifier ? "shared" : "separate", (unsigned long long)want);

    float *w = malloc((size_t)floats * sizeof(float));
    fg_llama_layer *layers = calloc((size_t)L, sizeof *layers);
    if (!w || !layers) {
        free(w);
        free(layers);
        return fg_failf(err, err_size, FG_ERR_OUT_OF_MEMORY, "out of memory for %llu weights",
                        (unsigned long long)floats);
    }
    memcpy(w, (const unsigned char *)buf + 28, (size_t)floats * sizeof(float));
    for (uint64_t i = 0; i < floats; i++)
        if (!isfinite(w[i])) {
            free(w);
            free(layers);
            return fg_failf(err, err_size, FG_ERR_FORMAT, "weight %llu is not finite", (unsigned long long)i);
        }
    /* the file's order: each kind of weight for every layer, then the next kind */
    const float *p = w;
    fg_llama_weights *W = &out->weights;
    W->token_embedding = (fg_tensor){FG_GGML_F32, p, (int64_t)V, (int64_t)D};
    p += V * D;
#define EACH_LAYER(field, rows, cols)                                                                                  \
    for (uint64_t l = 0; l < L; l++, p += (rows) * (cols))                                                             \
        layers[l].field = (fg_tensor) { FG_GGML_F32, p, (int64_t)(rows), (int64_t)(cols) }
    for (uint64_t l = 0; l < L; l++, p += D)
        layers[l].rms_att = p;
    EACH_LAYER(wq, D, D);
    EACH_LAYER(wk, KV, D);
    EACH_LAYER(wv, KV, D);
    EACH_LAYER(wo, D, D);
    for (uint64_t l = 0; l < L; l++, p += D)
        layers[l].rms_ffn = p;
    EACH_LAYER(w1, Hd, D);
    EACH_LAYER(w2, D, Hd);
    EACH_LAYER(w3, Hd, D);
#undef EACH_LAYER
    W->rms_final = p;
    p += D + (uint64_t)c.seq_len * (uint64_t)c.head_size; /* legacy RoPE tables, unused */
    W->wcls = c.shared_classifier ? W->token_embedding : (fg_tensor){FG_GGML_F32, p, (int64_t)V, (int64_t)D};
    W->layers = layers;
    c.rms_eps = 1e-5f;
    c.rope_theta = 10000.0f;
    out->config = c;
    out->data = w;
    return FG_OK;
}

fg_status fg_llama_load_file(const char *path, fg_llama_model *out, char *err, size_t err_size) {
    void *buf;
    size_t size;
    memset(out, 0, sizeof *out);
    fg_status st = fg_read_file(path, &buf, &size, err, err_size);
    if (st)
        return st;
    st = fg_llama_load_memory(buf, size, out, err, err_size);
    free(buf);
    return st;
}
