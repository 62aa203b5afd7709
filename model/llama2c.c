/* The llama2.c checkpoint loader of model/llama2c.h. Every header field is
 * checked against the others and against the file size before any weight is
 * touched. */
#include "model/llama2c.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>

#include "model/dequant.h"
#include "model/io.h"

/* Limits that keep every size computation far from overflow. */
#define MAX_DIM (1 << 16)
#define MAX_HIDDEN (1 << 18)
#define MAX_LAYERS 1024
#define MAX_VOCAB (1 << 22)
#define MAX_SEQ (1 << 20)

fg_status fgm_llama_load_memory(const void *buf, size_t size, fgm_llama_model *out, char *err, size_t err_size) {
    memset(out, 0, sizeof *out);
    if (!buf || size < 7 * sizeof(int32_t))
        return fgm_failf(err, err_size, FG_ERR_FORMAT, "checkpoint is %zu bytes, shorter than its 28-byte header", size);
    int32_t h[7];
    memcpy(h, buf, sizeof h);
    fgm_llama_config c = {.dim = h[0], .hidden_dim = h[1], .n_layers = h[2], .n_heads = h[3], .n_kv_heads = h[4],
                         .vocab_size = h[5], .seq_len = h[6]};
    c.shared_classifier = c.vocab_size > 0;
    if (c.vocab_size < 0 && c.vocab_size != INT32_MIN)
        c.vocab_size = -c.vocab_size;
    if (c.dim <= 0 || c.dim > MAX_DIM || c.hidden_dim <= 0 || c.hidden_dim > MAX_HIDDEN || c.n_layers <= 0 ||
        c.n_layers > MAX_LAYERS || c.n_heads <= 0 || c.n_kv_heads <= 0 || c.vocab_size <= 0 ||
        c.vocab_size > MAX_VOCAB || c.seq_len <= 0 || c.seq_len > MAX_SEQ)
        return fgm_failf(err, err_size, FG_ERR_FORMAT,
                     "implausible header: dim %d, hidden_dim %d, n_layers %d, n_heads %d, n_kv_heads %d, "
                     "vocab_size %d, seq_len %d",
                     h[0], h[1], h[2], h[3], h[4], h[5], h[6]);
    if (c.dim % c.n_heads || c.n_heads % c.n_kv_heads || (c.dim / c.n_heads) % 2)
        return fgm_failf(err, err_size, FG_ERR_FORMAT,
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
        return fgm_failf(err, err_size, FG_ERR_FORMAT,
                     "checkpoint is %zu bytes but its header (dim %d, hidden %d, %d layers, %d/%d heads, vocab %d, "
                     "seq_len %d, %s classifier) needs %llu: truncated or not a llama2.c file",
                     size, c.dim, c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads, c.vocab_size, c.seq_len,
                     c.shared_classifier ? "shared" : "separate", (unsigned long long)want);

    float *w = malloc((size_t)floats * sizeof(float));
    fgm_llama_layer *layers = calloc((size_t)L, sizeof *layers);
    if (!w || !layers) {
        free(w);
        free(layers);
        return fgm_failf(err, err_size, FG_ERR_OUT_OF_MEMORY, "out of memory for %llu weights",
                        (unsigned long long)floats);
    }
    memcpy(w, (const unsigned char *)buf + 28, (size_t)floats * sizeof(float));
    for (uint64_t i = 0; i < floats; i++)
        if (!isfinite(w[i])) {
            free(w);
            free(layers);
            return fgm_failf(err, err_size, FG_ERR_FORMAT, "weight %llu is not finite", (unsigned long long)i);
        }
    /* the file's order: each kind of weight for every layer, then the next kind */
    const float *p = w;
    fgm_llama_weights *W = &out->weights;
    W->token_embedding = (fgm_tensor){FGM_GGML_F32, p, (int64_t)V, (int64_t)D};
    p += V * D;
#define EACH_LAYER(field, rows, cols)                                                                                  \
    for (uint64_t l = 0; l < L; l++, p += (rows) * (cols))                                                             \
        layers[l].field = (fgm_tensor) { FGM_GGML_F32, p, (int64_t)(rows), (int64_t)(cols) }
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
    W->wcls = c.shared_classifier ? W->token_embedding : (fgm_tensor){FGM_GGML_F32, p, (int64_t)V, (int64_t)D};
    W->layers = layers;
    c.rms_eps = 1e-5f;
    c.rope_theta = 10000.0f;
    out->config = c;
    out->data = w;
    return FG_OK;
}

fg_status fgm_llama_load_file(const char *path, fgm_llama_model *out, char *err, size_t err_size) {
    void *buf;
    size_t size;
    memset(out, 0, sizeof *out);
    fg_status st = fgm_read_file(path, &buf, &size, err, err_size);
    if (st)
        return st;
    st = fgm_llama_load_memory(buf, size, out, err, err_size);
    free(buf);
    return st;
}
