/*
 * ggml tensor types: one table, indexed by the type id GGUF stores, of each
 * type's name, block layout and `to_float` (dequantization of n values, n a
 * multiple of the block). Types the table knows but cannot dequantize have
 * to_float == NULL; ids it does not know have no entry.
 */
#ifndef FGM_DEQUANT_H
#define FGM_DEQUANT_H

#include <stdint.h>

typedef enum fgm_ggml_type {
    FGM_GGML_F32 = 0,
    FGM_GGML_F16 = 1,
    FGM_GGML_Q4_0 = 2,
    FGM_GGML_Q4_1 = 3,
    FGM_GGML_Q5_0 = 6,
    FGM_GGML_Q5_1 = 7,
    FGM_GGML_Q8_0 = 8,
    FGM_GGML_Q8_1 = 9,
    FGM_GGML_Q2_K = 10,
    FGM_GGML_Q3_K = 11,
    FGM_GGML_Q4_K = 12,
    FGM_GGML_Q5_K = 13,
    FGM_GGML_Q6_K = 14,
    FGM_GGML_Q8_K = 15,
    FGM_GGML_IQ4_NL = 20,
    FGM_GGML_IQ4_XS = 23,
    FGM_GGML_BF16 = 30,
    FGM_GGML_N_TYPES = 31
} fgm_ggml_type;

typedef void fgm_to_float_fn(const void *src, float *dst, int64_t n);

typedef struct fgm_type_info {
    const char *name;
    int32_t block;          /* values per block */
    int32_t bytes;          /* bytes per block */
    fgm_to_float_fn *to_float; /* NULL: known, not supported */
} fgm_type_info;

/* The type's entry, or NULL for an id ggml does not define (or retired). */
const fgm_type_info *fgm_type_info_of(int32_t type);

/* Bytes of a row of n values, or -1 when n is not a multiple of the block. */
int64_t fgm_type_row_bytes(int32_t type, int64_t n);

#endif
