/*
 * Byte-level BPE (model/bpe.c), and the UTF-8 check every text path shares.
 */
#ifndef FGM_BPE_H
#define FGM_BPE_H

#include <stddef.h>
#include <stdint.h>

#include "fastgen.h"
#include "model/vocab.h"

struct fgm_gguf;

/* Byte-level BPE (model/bpe.c): GPT-2's byte-to-unicode mapping, the
 * pre-tokenizer the metadata names, merges by rank. */
fg_status fgm_bpe_from_gguf(const struct fgm_gguf *g, int32_t vocab_size, fgm_tokenizer *out, char *err, size_t err_size);

/* Bytes in the well-formed UTF-8 sequence at s (1 to 4), 0 when none starts there (an overlong form, a
 * surrogate, past U+10FFFF, a byte that never occurs in UTF-8, a cut sequence). */
int fgm_utf8_length(const char *s);

/* Text without control tokens, appended at tokens[*n] (*n counts past cap). */
fg_status fgm_bpe_encode(const fgm_tokenizer *t, const char *text, int32_t *tokens, int32_t cap, int32_t *n);
/* Splits text into pre-tokens; calls emit for each (start, length). */
void fgm_bpe_pretokenize(fgm_pretok pre, const char *text, void (*emit)(void *user, const char *s, size_t n),
                        void *user);

#endif /* FGM_BPE_H */
