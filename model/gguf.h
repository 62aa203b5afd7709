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
#ifndef FGM_GGUF_H
#define FGM_GGUF_H

#include <stddef.h>
#include <stdint.h>

#include "fastgen.h"

typedef enum fgm_gguf_vtype {
    FGM_GGUF_UINT8 = 0,
    FGM_GGUF_INT8 = 1,
    FGM_GGUF_UINT16 = 2,
    FGM_GGUF_INT16 = 3,
    FGM_GGUF_UINT32 = 4,
    FGM_GGUF_INT32 = 5,
    FGM_GGUF_FLOAT32 = 6,
    FGM_GGUF_BOOL = 7,
    FGM_GGUF_STRING = 8,
    FGM_GGUF_ARRAY = 9,
    FGM_GGUF_UINT64 = 10,
    FGM_GGUF_INT64 = 11,
    FGM_GGUF_FLOAT64 = 12,
    FGM_GGUF_N_VTYPES
} fgm_gguf_vtype;

/* A string inside the file (not NUL-terminated). */
typedef struct fgm_gguf_str {
    const char *s;
    uint64_t n;
} fgm_gguf_str;

/* A metadata value. Scalars are decoded; arrays point into the file
 * (fgm_gguf_array_num reads a number of one), and an array of strings is
 * also copied, NUL-terminated, into strs. */
typedef struct fgm_gguf_kv {
    fgm_gguf_str key;
    fgm_gguf_vtype type;
    union {
        uint64_t u; /* unsigned integers and bools */
        int64_t i;  /* signed integers */
        double f;   /* floats */
        fgm_gguf_str str;
    } v;
    fgm_gguf_vtype elem_type; /* arrays */
    uint64_t n_elems;
    const unsigned char *elems; /* first element in the file */
    const char **strs;          /* arrays of strings: [n_elems] NUL-terminated copies */
} fgm_gguf_kv;

#define FGM_GGUF_MAX_DIMS 4

typedef struct fgm_gguf_tensor {
    char name[96];
    uint32_t n_dims;
    int64_t ne[FGM_GGUF_MAX_DIMS]; /* ne[0]: the innermost (row length) */
    int32_t type;                 /* ggml type id */
    uint64_t offset;              /* into the data section */
    uint64_t bytes;
    const void *data;
} fgm_gguf_tensor;

typedef struct fgm_gguf {
    uint32_t version;
    uint64_t alignment;
    int64_t n_kv, n_tensors;
    fgm_gguf_kv *kv;
    fgm_gguf_tensor *tensors;
    const unsigned char *base; /* the file */
    size_t size;
    void *mapping; /* mmap of the file, or NULL when parsed from memory */
} fgm_gguf;

/* Parses a GGUF file held in memory (not copied: buf must outlive out). */
fg_status fgm_gguf_parse(const void *buf, size_t size, fgm_gguf *out, char *err, size_t err_size);
/* Maps and parses a file (the mapping is released by fgm_gguf_free). */
fg_status fgm_gguf_open(const char *path, fgm_gguf *out, char *err, size_t err_size);
void fgm_gguf_free(fgm_gguf *g);

const fgm_gguf_kv *fgm_gguf_find(const fgm_gguf *g, const char *key);
const fgm_gguf_tensor *fgm_gguf_tensor_find(const fgm_gguf *g, const char *name);
/* Integer / float metadata with a default when the key is absent; FG_ERR_FORMAT
 * (with a message) when it is present with a type that does not fit. */
fg_status fgm_gguf_get_int(const fgm_gguf *g, const char *key, int64_t dflt, int64_t *out, char *err, size_t n);
fg_status fgm_gguf_get_float(const fgm_gguf *g, const char *key, double dflt, double *out, char *err, size_t n);
/* A string value as a NUL-terminated copy into buf ("" when absent). */
void fgm_gguf_get_str(const fgm_gguf *g, const char *key, char *buf, size_t n);
/* Element i of a numeric array as double (arrays of ints and floats). */
double fgm_gguf_array_num(const fgm_gguf_kv *kv, uint64_t i);
const char *fgm_gguf_vtype_name(fgm_gguf_vtype t);

/* Does the file start with the GGUF magic? */
int fgm_gguf_is_gguf(const char *path);

#endif
