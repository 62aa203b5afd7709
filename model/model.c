/* Models of model/model.h: freeing, sizes, and the GGUF `llama` loader. */
#include "model/model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/dequant.h"
#include "model/gguf.h"
#include "model/llama2c.h"
#include "model/io.h"

void fgm_llama_free(fgm_llama_model *model) {
    if (!model)
        return;
    free(model->data);
    free(model->weights.layers);
    if (model->gguf) {
        fgm_gguf_free(model->gguf);
        free(model->gguf);
    }
    memset(model, 0, sizeof *model);
}

size_t fgm_llama_weight_bytes(const fgm_llama_model *model) {
    const fgm_llama_config *c = &model->config;
    const fgm_llama_weights *W = &model->weights;
    size_t bytes = (size_t)fgm_type_row_bytes(W->token_embedding.type, W->token_embedding.cols) *
                       (size_t)W->token_embedding.rows +
                   (size_t)(2 * c->n_layers + 1) * (size_t)c->dim * sizeof(float);
    if (!c->shared_classifier)
        bytes += (size_t)fgm_type_row_bytes(W->wcls.type, W->wcls.cols) * (size_t)W->wcls.rows;
    for (int32_t l = 0; l < c->n_layers; l++) {
        const fgm_tensor *t[] = {&W->layers[l].wq, &W->layers[l].wk, &W->layers[l].wv, &W->layers[l].wo,
                                &W->layers[l].w1, &W->layers[l].w2, &W->layers[l].w3};
        for (int i = 0; i < 7; i++)
            bytes += (size_t)fgm_type_row_bytes(t[i]->type, t[i]->cols) * (size_t)t[i]->rows;
    }
    return bytes;
}

/* ------------------------------------------------------------------ GGUF */

/* A weight matrix named `name`: `rows` x `cols` (GGUF: ne[0] = cols), of a
 * type the dequantizer knows. */
static fg_status gguf_matrix(const fgm_gguf *g, const char *name, int64_t rows, int64_t cols, int required,
                             fgm_tensor *out, char *err, size_t n) {
    const fgm_gguf_tensor *t = fgm_gguf_tensor_find(g, name);
    memset(out, 0, sizeof *out);
    if (!t)
        return required ? fgm_failf(err, n, FG_ERR_FORMAT, "GGUF: tensor \"%s\" is missing", name) : FG_OK;
    if (t->ne[0] != cols || t->ne[1] != rows || t->ne[2] != 1 || t->ne[3] != 1)
        return fgm_failf(err, n, FG_ERR_FORMAT, "GGUF: tensor \"%s\" is %lld x %lld x %lld x %lld, the model needs %lld x %lld",
                        name, (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2], (long long)t->ne[3],
                        (long long)cols, (long long)rows);
    const fgm_type_info *ti = fgm_type_info_of(t->type);
    if (!ti->to_float)
        return fgm_failf(err, n, FG_ERR_UNAVAILABLE, "GGUF: tensor \"%s\" has type %s, which fastgen cannot dequantize",
                        name, ti->name);
    *out = (fgm_tensor){t->type, t->data, rows, cols};
    return FG_OK;
}

/* A norm vector of `dim` values, dequantized into dst. */
static fg_status gguf_vector(const fgm_gguf *g, const char *name, int64_t dim, float *dst, char *err, size_t n) {
    fgm_tensor t;
    fg_status st = gguf_matrix(g, name, 1, dim, 1, &t, err, n);
    if (st == FG_OK)
        fgm_type_info_of(t.type)->to_float(t.data, dst, dim);
    return st;
}

static fg_status gguf_dim(const fgm_gguf *g, const char *arch, const char *key, int64_t dflt, int64_t lo, int64_t hi,
                          int32_t *out, char *err, size_t n) {
    char full[128];
    snprintf(full, sizeof full, "%s.%s", arch, key);
    int64_t v;
    fg_status st = fgm_gguf_get_int(g, full, dflt, &v, err, n);
    if (st)
        return st;
    if (v < lo || v > hi)
        return fgm_failf(err, n, FG_ERR_FORMAT, "GGUF: %s is %lld%s (this reader takes %lld to %lld)", full,
                        (long long)v, v == dflt && dflt < lo ? " or missing" : "", (long long)lo, (long long)hi);
    *out = (int32_t)v;
    return FG_OK;
}

fg_status fgm_llama_from_gguf(fgm_gguf *g, fgm_llama_model *m, char *err, size_t n) {
    memset(m, 0, sizeof *m);
    char arch[64];
    fgm_gguf_get_str(g, "general.architecture", arch, sizeof arch);
    if (strcmp(arch, "llama"))
        return fgm_failf(err, n, FG_ERR_UNAVAILABLE,
                        "GGUF: architecture \"%s\" is not supported (fastgen runs \"llama\": Llama 1/2/3, Mistral, "
                        "TinyLlama, SmolLM)", arch[0] ? arch : "(none)");
    fgm_llama_config c = {0};
    fg_status st = FG_OK;
    if (!st) st = gguf_dim(g, arch, "embedding_length", 0, 2, 1 << 16, &c.dim, err, n);
    if (!st) st = gguf_dim(g, arch, "feed_forward_length", 0, 1, 1 << 18, &c.hidden_dim, err, n);
    if (!st) st = gguf_dim(g, arch, "block_count", 0, 1, 1024, &c.n_layers, err, n);
    if (!st) st = gguf_dim(g, arch, "attention.head_count", 0, 1, 1024, &c.n_heads, err, n);
    if (!st) st = gguf_dim(g, arch, "attention.head_count_kv", c.n_heads, 1, 1024, &c.n_kv_heads, err, n);
    if (!st) st = gguf_dim(g, arch, "context_length", 0, 1, 1 << 20, &c.seq_len, err, n);
    if (st)
        return st;
    if (c.dim % c.n_heads || c.n_heads % c.n_kv_heads || (c.dim / c.n_heads) % 2)
        return fgm_failf(err, n, FG_ERR_FORMAT,
                        "GGUF: width %d does not split into %d heads of even size, or %d heads into %d KV heads", c.dim,
                        c.n_heads, c.n_heads, c.n_kv_heads);
    c.head_size = c.dim / c.n_heads;
    c.kv_dim = c.n_kv_heads * c.head_size;
    int32_t rope_dims = 0;
    if ((st = gguf_dim(g, arch, "rope.dimension_count", c.head_size, 2, 1 << 16, &rope_dims, err, n)))
        return st;
    if (rope_dims != c.head_size)
        return fgm_failf(err, n, FG_ERR_UNAVAILABLE, "GGUF: RoPE over %d of %d head dimensions is not supported",
                        rope_dims, c.head_size);
    double theta, eps;
    char key[128];
    snprintf(key, sizeof key, "%s.rope.freq_base", arch);
    if ((st = fgm_gguf_get_float(g, key, 10000.0, &theta, err, n)))
        return st;
    snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", arch);
    if ((st = fgm_gguf_get_float(g, key, 1e-5, &eps, err, n)))
        return st;
    /* the library's range for fg_context_params.rope_theta (core/context.c), on the float it will get */
    const float theta_f = (float)theta;
    if (!(theta_f > 1.0f && theta_f < 1e12f))
        return fgm_failf(err, n, FG_ERR_FORMAT,
                         "GGUF: %s.rope.freq_base is %g; fastgen's RoPE takes a base in (1, 1e12)", arch, theta);
    if (!(eps > 0.0 && eps < 1.0))
        return fgm_failf(err, n, FG_ERR_FORMAT, "GGUF: %s.attention.layer_norm_rms_epsilon is %g, not in (0, 1)",
                         arch, eps);
    c.rope_theta = theta_f;
    c.rms_eps = (float)eps;
    const fgm_gguf_tensor *emb = fgm_gguf_tensor_find(g, "token_embd.weight");
    if (!emb)
        return fgm_failf(err, n, FG_ERR_FORMAT, "GGUF: tensor \"token_embd.weight\" is missing");
    if (emb->ne[1] < 3 || emb->ne[1] > (1 << 22))
        return fgm_failf(err, n, FG_ERR_FORMAT, "GGUF: a vocabulary of %lld tokens", (long long)emb->ne[1]);
    c.vocab_size = (int32_t)emb->ne[1];
    c.shared_classifier = fgm_gguf_tensor_find(g, "output.weight") == NULL;

    fgm_llama_weights *W = &m->weights;
    W->layers = calloc((size_t)c.n_layers, sizeof *W->layers);
    m->data = malloc((size_t)(2 * c.n_layers + 1) * (size_t)c.dim * sizeof(float));
    if (!W->layers || !m->data) {
        fgm_llama_free(m);
        return fgm_failf(err, n, FG_ERR_OUT_OF_MEMORY, "GGUF: out of memory for %d layers", c.n_layers);
    }
    const int64_t D = c.dim, KV = c.kv_dim, H = c.hidden_dim, V = c.vocab_size;
    st = gguf_matrix(g, "token_embd.weight", V, D, 1, &W->token_embedding, err, n);
    if (!st)
        st = gguf_matrix(g, "output.weight", V, D, 0, &W->wcls, err, n);
    if (!st && c.shared_classifier)
        W->wcls = W->token_embedding;
    float *norms = m->data;
    if (!st)
        st = gguf_vector(g, "output_norm.weight", D, norms, err, n);
    W->rms_final = norms;
    for (int32_t l = 0; l < c.n_layers && !st; l++) {
        fgm_llama_layer *ly = &W->layers[l];
        char name[96];
#define MATRIX(field, suffix, rows, cols)                                                                              \
    if (!st) {                                                                                                         \
        snprintf(name, sizeof name, "blk.%d." suffix ".weight", (int)l);                                               \
        st = gguf_matrix(g, name, rows, cols, 1, &ly->field, err, n);                                                  \
    }
        MATRIX(wq, "attn_q", D, D)
        MATRIX(wk, "attn_k", KV, D)
        MATRIX(wv, "attn_v", KV, D)
        MATRIX(wo, "attn_output", D, D)
        MATRIX(w1, "ffn_gate", H, D)
        MATRIX(w2, "ffn_down", D, H)
        MATRIX(w3, "ffn_up", H, D)
#undef MATRIX
        float *att = norms + (size_t)(1 + 2 * l) * D, *ffn = att + D;
        snprintf(name, sizeof name, "blk.%d.attn_norm.weight", (int)l);
        if (!st)
            st = gguf_vector(g, name, D, att, err, n);
        snprintf(name, sizeof name, "blk.%d.ffn_norm.weight", (int)l);
        if (!st)
            st = gguf_vector(g, name, D, ffn, err, n);
        ly->rms_att = att;
        ly->rms_ffn = ffn;
    }
    if (st) {
        fgm_llama_free(m);
        return st;
    }
    m->config = c;
    return FG_OK;
}

fg_status fgm_llama_load_gguf(const char *path, fgm_llama_model *m, char *err, size_t n) {
    memset(m, 0, sizeof *m);
    fgm_gguf *g = calloc(1, sizeof *g);
    if (!g)
        return fgm_failf(err, n, FG_ERR_OUT_OF_MEMORY, "out of memory");
    fg_status st = fgm_gguf_open(path, g, err, n);
    if (st == FG_OK)
        st = fgm_llama_from_gguf(g, m, err, n);
    if (st) {
        fgm_gguf_free(g);
        free(g);
        return st;
    }
    m->gguf = g;
    return FG_OK;
}

fg_status fgm_model_load(const char *path, fgm_llama_model *m, char *err, size_t n) {
    return fgm_gguf_is_gguf(path) ? fgm_llama_load_gguf(path, m, err, n) : fgm_llama_load_file(path, m, err, n);
}
