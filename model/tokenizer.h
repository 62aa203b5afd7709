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

struct fgm_gguf;

#define FGM_TOKEN_BOS 1
#define FGM_TOKEN_EOS 2

typedef struct fgm_tokenizer_entry {
    const char *piece;
    int32_t id;
} fgm_tokenizer_entry;

typedef enum fgm_tokenizer_kind { FGM_TOKENIZER_SPM = 0, FGM_TOKENIZER_BPE = 1 } fgm_tokenizer_kind;

/* GPT-2 style pre-tokenizers (tokenizer.ggml.pre) fastgen knows. */
typedef enum fgm_pretok { FGM_PRETOK_GPT2 = 0, FGM_PRETOK_SMOLLM = 1 } fgm_pretok;

typedef struct fgm_bpe_merge {
    const char *pair; /* "left right", as the merges list spells it */
    int32_t rank;     /* its place in the list: lower merges first */
} fgm_bpe_merge;

typedef struct fgm_tokenizer {
    fgm_tokenizer_kind kind;
    int32_t vocab_size;
    char **pieces;               /* [vocab_size] NUL-terminated */
    float *scores;               /* [vocab_size] */
    uint8_t *control;            /* [vocab_size] 1: a control token (BOS, EOS, chat markers): decodes to "" */
    fgm_tokenizer_entry *sorted;  /* [vocab_size] by piece, for lookups */
    size_t max_piece_len;
    int32_t bos, eos, unk;       /* ids, -1 where the vocabulary has none */
    int add_bos;                 /* the model expects BOS before a prompt */
    int32_t *specials;           /* [n_specials] control tokens with a text, longest first */
    int32_t n_specials;
    int32_t byte_id[256];        /* the <0xNN> piece of each byte, or -1 */
    char byte_pieces[256][2];    /* decoded <0xNN> pieces */
    /* byte-level BPE (kind FGM_TOKENIZER_BPE) */
    fgm_pretok pre;
    fgm_bpe_merge *merges;        /* [n_merges] sorted by pair, for lookups */
    int32_t n_merges;
    char **text;                 /* [vocab_size] the bytes each token stands for */
} fgm_tokenizer;

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
