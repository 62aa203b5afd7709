/*
 * SentencePiece-style vocabularies, from llama2.c tokenizer files (uint32
 * max_token_length, then per id: float32 score, int32 length, that many
 * bytes) or from a GGUF file's metadata (tokenizer.ggml.model = "llama":
 * tokens, scores, token types, BOS/EOS/unknown ids). Encoding: a
 * dummy-prefix space, UTF-8 code points looked up whole (else their bytes as
 * <0xNN> pieces, else the unknown token), then repeated merges of the
 * adjacent pair whose concatenation has the best score (leftmost on ties).
 * The SentencePiece space U+2581 is held as an ASCII space.
 */
#ifndef FGM_TOKENIZER_H
#define FGM_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "fastgen.h"
#include "model/bpe.h"
#include "model/vocab.h"

struct fgm_gguf;

#define FGM_TOKEN_BOS 1
#define FGM_TOKEN_EOS 2

/* The vocabulary of a GGUF file (tokenizer.ggml.*): SentencePiece ("llama") or byte-level BPE ("gpt2"). */
fg_status fgm_tokenizer_from_gguf(const struct fgm_gguf *g, int32_t vocab_size, fgm_tokenizer *out, char *err,
                                 size_t err_size);

fg_status fgm_tokenizer_load_memory(const void *buf, size_t size, int32_t vocab_size, fgm_tokenizer *out, char *err,
                                   size_t err_size);
fg_status fgm_tokenizer_load_file(const char *path, int32_t vocab_size, fgm_tokenizer *out, char *err,
                                 size_t err_size);
void fgm_tokenizer_free(fgm_tokenizer *t);

/* flags of fgm_tokenizer_encode */
#define FGM_ENCODE_BOS 1     /* the start of a sequence: BOS first if the vocabulary asks for it (add_bos) */
#define FGM_ENCODE_SPECIAL 2 /* control tokens spelled in the text ("<|im_start|>") become their ids, and
                               the runs of text between them are encoded apart, as llama.cpp's parse_special */

/* text -> tokens. cap: room in tokens; FG_ERR_CAPACITY when the result needs
 * more (*n_out then holds how many it needs). */
fg_status fgm_tokenizer_encode(const fgm_tokenizer *t, const char *text, int flags, int32_t *tokens, int32_t cap,
                              int32_t *n_out);
/* The id of the token whose piece is exactly `piece` (as the vocabulary
 * spells it: byte-level stand-ins for a BPE vocabulary), or -1. */
int32_t fgm_tokenizer_piece_id(const fgm_tokenizer *t, const char *piece);

/* The text of token after prev (a leading space after BOS is dropped, byte
 * pieces become their byte). */
const char *fgm_tokenizer_decode(const fgm_tokenizer *t, int32_t prev, int32_t token);

#endif
