/*
 * GGUF (llama.cpp's model format, versions 2 and 3), read without trusting
 * it: every count, string length and offset is checked against what is left
 * of the file before it is used; tensor data must lie inside the data
 * section, aligned, without overlapping another tensor. A failed read frees
 * everything and says in one line which key or tensor was bad.
 *
 * Layout: "GGUF", uint32 version, uint64 tensor count, uint64 key count;
 * the keys (string, uint32 type, value); the tensor infos (string name,
 * uint32 n_dims, uint64 dims[n_dims] innermost first, uint32 type, uint64
 * offset into the data section); padding to general.alignment (default 32);
 * the data section. Strings are uint64 length + bytes, no terminator.
 */
#ifndef FG_GGUF_H
#define FG_GGUF_H

#include <stddef.h>
#include <stdint.h>

#include "fastgen.h"

typedef enum fg_gguf_vtype {
    FG_GGUF_UINT8 = 0,
    FG_GGUF_INT8 = 1,
    FG_GGUF_UINT16 = 2,
    FG_GGUF_INT16 = 3,
    FG_GGUF_UINT32 = 4,
    FG_GGUF_INT32 = 5,
    FG_GGUF_FLOAT32 = 6,
    FG_GGUF_BOOL = 7,
    FG_GGUF_STRING = 8,
    FG_GGUF_ARRAY = 9,
    FG_GGUF_UINT64 = 10,
    FG_GGUF_INT64 = 11,
    FG_GGUF_FLOAT64 = 12,
    FG_GGUF_N_VTYPES
} fg_gguf_vtype;

/* A string inside the file (not NUL-terminated). */
typedef struct fg_gguf_str {
    const char *s;
    uint64_t n;
} fg_gguf_str;

/* A metadata value. Scalars are decoded; arrays point into the file: an
 * array of strings is walked with fg_gguf_array_str. */
typedef struct fg_gguf_kv {
    fg_gguf_str key;
    fg_gguf_vtype type;
    union {
        uint64_t u; /* unsigned integers and bools */
        int64_t i;  /* signed integers */
        double f;   /* floats */
        fg_gguf_str str;
    } v;
    fg_gguf_vtype elem_type; /* arrays */
    uint64_t n_elems;
    const unsigned char *elems; /* first element in the file */
    const char **strs;          /* arrays of strings: [n_elems] NUL-terminated copies */
} fg_gguf_kv;

#define FG_GGUF_MAX_DIMS 4

typedef struct fg_gguf_tensor {
    char name[96];
    uint32_t n_dims;
    int64_t ne[FG_GGUF_MAX_DIMS]; /* ne[0]: the innermost (row length) */
    int32_t type;                 /* ggml type id */
    uint64_t offset;              /* into the data section */
    uint64_t bytes;
    const void *data;
} fg_gguf_tensor;

typedef struct fg_gguf {
    uint32_t version;
    uint64_t alignment;
    int64_t n_kv, n_tensors;
    fg_gguf_kv *kv;
    fg_gguf_tensor *tensors;
    const unsigned char *base; /* the file */
    size_t size;
    void *mapping; /* mmap of the file, or NULL when parsed from memory */
} fg_gguf;

/* Parses a GGUF file held in memory (not copied: buf must outlive out). */
fg_status fg_gguf_parse(const void *buf, size_t size, fg_gguf *out, char *err, size_t err_size);
/* Maps and parses a file (the mapping is released by fg_gguf_free). */
fg_status fg_gguf_open(const char *path, fg_gguf *out, char *err, size_t err_size);
void fg_gguf_free(fg_gguf *g);

const fg_gguf_kv *fg_gguf_find(const fg_gguf *g, const char *key);
const fg_gguf_tensor *fg_gguf_tensor_find(const fg_gguf *g, const char *name);
/* Integer / float metadata with a default when the key is absent; FG_ERR_FORMAT
 * (with a message) when it is present with a type that does not fit. */
fg_status fg_gguf_get_int(const fg_gguf *g, const char *key, int64_t dflt, int64_t *out, char *err, size_t n);
fg_status fg_gguf_get_float(const fg_gguf *g, const char *key, double dflt, double *out, char *err, size_t n);
/* A string value as a NUL-terminated copy into buf ("" when absent). */
void fg_gguf_get_str(const fg_gguf *g, const char *key, char *buf, size_t n);
/* Element i of a numeric array as double (arrays of ints and floats). */
double fg_gguf_array_num(const fg_gguf_kv *kv, uint64_t i);
const char *fg_gguf_vtype_name(fg_gguf_vtype t);

/* Does the file start with the GGUF magic? */
int fg_gguf_is_gguf(const char *path);

#endif
