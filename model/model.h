/*
 * A Llama-architecture model in memory, whatever file it came from: the
 * shape, and weight matrices that stay in their file's type (f32 for
 * llama2.c checkpoints; f16, bf16 or a quantized block format for GGUF, read
 * in place from the mapped file). The norms are small and kept as f32.
 */
#ifndef FGM_MODEL_H
#define FGM_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "fastgen.h"

typedef struct fgm_llama_config {
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
} fgm_llama_config;

/* A weight matrix: rows of `cols` values of a ggml type (model/dequant.h),
 * row-major [rows][cols] = [out][in]. */
typedef struct fgm_tensor {
    int32_t type;
    const void *data;
    int64_t rows, cols;
} fgm_tensor;

typedef struct fgm_llama_layer {
    const float *rms_att, *rms_ffn; /* [dim] */
    fgm_tensor wq;                   /* [dim][dim] */
    fgm_tensor wk, wv;               /* [kv_dim][dim] */
    fgm_tensor wo;                   /* [dim][dim] */
    fgm_tensor w1, w3;               /* [hidden][dim] (gate, up) */
    fgm_tensor w2;                   /* [dim][hidden] (down) */
} fgm_llama_layer;

typedef struct fgm_llama_weights {
    fgm_tensor token_embedding; /* [vocab][dim] */
    fgm_llama_layer *layers;    /* [n_layers] */
    const float *rms_final;    /* [dim] */
    fgm_tensor wcls;            /* [vocab][dim]: the embedding itself when shared */
} fgm_llama_weights;

struct fgm_gguf;

typedef struct fgm_llama_model {
    fgm_llama_config config;
    fgm_llama_weights weights;
    float *data;          /* owned floats: llama2.c weights, or GGUF norms */
    struct fgm_gguf *gguf; /* GGUF: the mapped file the tensors point into */
} fgm_llama_model;

void fgm_llama_free(fgm_llama_model *model);

/* A llama2.c checkpoint or a GGUF file (told apart by the GGUF magic). */
fg_status fgm_model_load(const char *path, fgm_llama_model *model, char *err, size_t err_size);
/* GGUF, architecture `llama`: the file is mapped and its tensors stay in it. */
fg_status fgm_llama_load_gguf(const char *path, fgm_llama_model *model, char *err, size_t err_size);
/* The same from a parsed file: the model's tensors point into g, which must
 * outlive the model (fgm_llama_load_gguf hands its own g to the model). */
fg_status fgm_llama_from_gguf(struct fgm_gguf *g, fgm_llama_model *model, char *err, size_t err_size);

/* Bytes the weights take as stored (what a mapped file keeps resident). */
size_t fgm_llama_weight_bytes(const fgm_llama_model *model);

#endif
