/*
 * ggml tensor types: one table, indexed by the type id GGUF stores, of each
 * type's name, block layout and `to_float` (dequantization of n values, n a
 * multiple of the block). Types the table knows but cannot dequantize have
 * to_float == NULL; ids it does not know have no entry.
 */
#ifndef FG_DEQUANT_H
#define FG_DEQUANT_H

#include <stdint.h>

typedef enum fg_ggml_type {
    FG_GGML_F32 = 0,
    FG_GGML_F16 = 1,
    FG_GGML_Q4_0 = 2,
    FG_GGML_Q4_1 = 3,
    FG_GGML_Q5_0 = 6,
    FG_GGML_Q5_1 = 7,
    FG_GGML_Q8_0 = 8,
    FG_GGML_Q8_1 = 9,
    FG_GGML_Q2_K = 10,
    FG_GGML_Q3_K = 11,
    FG_GGML_Q4_K = 12,
    FG_GGML_Q5_K = 13,
    FG_GGML_Q6_K = 14,
    FG_GGML_Q8_K = 15,
    FG_GGML_IQ4_NL = 20,
    FG_GGML_IQ4_XS = 23,
    FG_GGML_BF16 = 30,
    FG_GGML_N_TYPES = 31
} fg_ggml_type;

typedef void fg_to_float_fn(const void *src, float *dst, int64_t n);

typedef struct fg_type_info {
    const char *name;
    int32_t block;          /* values per block */
    int32_t bytes;          /* bytes per block */
    fg_to_float_fn *to_float; /* NULL: known, not supported */
} fg_type_info;

/* The type's entry, or NULL for an id ggml does not define (or retired). */
const fg_type_info *fg_type_info_of(int32_t type);

/* Bytes of a row of n values, or -1 when n is not a multiple of the block. */
int64_t fg_type_row_bytes(int32_t type, int64_t n);

#endif
