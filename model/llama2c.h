/*
 * llama2.c checkpoints: a 7 x int32 header, then fp32 weights, row-major
 * [out][in]. A negative vocab_size means a separate classifier follows the
 * (unused) RoPE tables; otherwise the token embedding is the classifier.
 */
#ifndef FGM_LLAMA2C_H
#define FGM_LLAMA2C_H

#include <stddef.h>
#include <stdint.h>

#include "fastgen.h"
#include "model/model.h"

/* Parse a checkpoint held in memory; err receives a one-line reason. */
fg_status fgm_llama_load_memory(const void *buf, size_t size, fgm_llama_model *out, char *err, size_t err_size);
fg_status fgm_llama_load_file(const char *path, fgm_llama_model *out, char *err, size_t err_size);

#endif
