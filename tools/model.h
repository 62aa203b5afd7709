/*
 * A Llama-architecture model in memory, whatever file it came from: the
 * shape, and weight matrices that stay in their file's type (f32 for
 * llama2.c checkpoints; f16, bf16 or a quantized block format for GGUF, read
 * in place from the mapped file). The norms are small and kept as f32.
 */
#ifndef FG_MODEL_H
#define FG_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "fastgen.h"

typedef struct fg_llama_config {
    int32_t dim;        /* model width */
    int32_t hidden_dim; /* MLP width */
    int32_t n_layers;
    int32_t n_heads;    /* query heads */
    int32_t n_kv_heads;
    int32_t vocab_size;
    int32_t seq_len;    /* positions the model was trained for */
    int32_t head_size;  /* dim / n_heads */
    int32_t kv_dim;     /* n_kv_heads * head_size */
    int shared_classifier;
    float rms_eps;      /* RMSNorm epsilon (1e-5 for llama2.c) */
    float rope_theta;   /* RoPE frequency base (10000 for llama2.c) */
} fg_llama_config;

/* A weight matrix: rows of `cols` values of a ggml type (tools/dequant.h),
 * row-major [rows][cols] = [out][in]. */
typedef struct fg_tensor {
    int32_t type;
    const void *data;
    int64_t rows, cols;
} fg_tensor;

typedef struct fg_llama_layer {
    const float *rms_att, *rms_ffn; /* [dim] */
    fg_tensor wq;                   /* [dim][dim] */
    fg_tensor wk, wv;               /* [kv_dim][dim] */
    fg_tensor wo;                   /* [dim][dim] */
    fg_tensor w1, w3;               /* [hidden][dim] (gate, up) */
    fg_tensor w2;                   /* [dim][hidden] (down) */
} fg_llama_layer;

typedef struct fg_llama_weights {
    fg_tensor token_embedding; /* [vocab][dim] */
    fg_llama_layer *layers;    /* [n_layers] */
    const float *rms_final;    /* [dim] */
    fg_tensor wcls;            /* [vocab][dim]: the embedding itself when shared */
} fg_llama_weights;

struct fg_gguf;

typedef struct fg_llama_model {
    fg_llama_config config;
    fg_llama_weights weights;
    float *data;          /* owned floats: llama2.c weights, or GGUF norms */
    struct fg_gguf *gguf; /* GGUF: the mapped file the tensors point into */
} fg_llama_model;

void fg_llama_free(fg_llama_model *model);

/* A llama2.c checkpoint or a GGUF file (told apart by the GGUF magic). */
fg_status fg_model_load(const char *path, fg_llama_model *model, char *err, size_t err_size);
/* GGUF, architecture `llama`: the file is mapped and its tensors stay in it. */
fg_status fg_llama_load_gguf(const char *path, fg_llama_model *model, char *err, size_t err_size);
/* The same from a parsed file: the model's tensors point into g, which must
 * outlive the model (fg_llama_load_gguf hands its own g to the model). */
fg_status fg_llama_from_gguf(struct fg_gguf *g, fg_llama_model *model, char *err, size_t err_size);

/* Bytes the weights take as stored (what a mapped file keeps resident). */
size_t fg_llama_weight_bytes(const fg_llama_model *model);

#endif
