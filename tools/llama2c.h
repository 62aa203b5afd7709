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
#include "tools/model.h"

/* Parse a checkpoint held in memory; err receives a one-line reason. */
fg_status fg_llama_load_memory(const void *buf, size_t size, fg_llama_model *out, char *err, size_t err_size);
fg_status fg_llama_load_file(const char *path, fg_llama_model *out, char *err, size_t err_size);

/* Writes a one-line reason into err (err_size bytes) and returns st. */
fg_status fg_failf(char *err, size_t err_size, fg_status st, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;

/* Whole file into memory (the caller frees *data): the one reader for every
 * file the tools read. A regular file, or a pipe, FIFO or socket read to its
 * end; "-" is standard input (a terminal too). Refuses directories, devices
 * and more than FG_MAX_FILE_BYTES. */
#define FG_MAX_FILE_BYTES ((int64_t)1 << 36)
fg_status fg_read_file(const char *path, void **data, size_t *size, char *err, size_t err_size);

#endif
