/*
 * llama2.c checkpoints: a 7 x int32 header, then fp32 weights, row-major
 * [out][in]. A negative vocab_size means a separate classifier follows the
 * (unused) RoPE tables; otherwise the token embedding is the classifier.
 */
#ifndef FG_LLAMA2C_H
#define FG_LLAMA2C_H

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
} fg_llama_config;

typedef struct fg_llama_weights {
    const float *token_embedding; /* [vocab][dim] */
    const float *rms_att;         /* [L][dim] */
    const float *wq;              /* [L][dim][dim] */
    const float *wk;              /* [L][kv_dim][dim] */
    const float *wv;              /* [L][kv_dim][dim] */
    const float *wo;              /* [L][dim][dim] */
    const float *rms_ffn;         /* [L][dim] */
    const float *w1;              /* [L][hidden][dim] */
    const float *w2;              /* [L][dim][hidden] */
    const float *w3;              /* [L][hidden][dim] */
    const float *rms_final;       /* [dim] */
    const float *wcls;            /* [vocab][dim] */
} fg_llama_weights;

typedef struct fg_llama_model {
    fg_llama_config config;
    fg_llama_weights weights;
    float *data; /* owned copy of the weights */
} fg_llama_model;

/* Parse a checkpoint held in memory; err receives a one-line reason. */
fg_status fg_llama_load_memory(const void *buf, size_t size, fg_llama_model *out, char *err, size_t err_size);
fg_status fg_llama_load_file(const char *path, fg_llama_model *out, char *err, size_t err_size);
void fg_llama_free(fg_llama_model *model);

/* Writes a one-line reason into err (err_size bytes) and returns st. */
fg_status fg_failf(char *err, size_t err_size, fg_status st, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;

/* Whole file into memory (the caller frees *data): the one reader for every
 * file the tools read. Refuses what is not a regular file and files larger
 * than FG_MAX_FILE_BYTES. */
#define FG_MAX_FILE_BYTES ((int64_t)1 << 36)
fg_status fg_read_file(const char *path, void **data, size_t *size, char *err, size_t err_size);

#endif
