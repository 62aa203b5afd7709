/*
 * llama2.c tokenizer files: uint32 max_token_length, then per id: float32
 * score, int32 length, that many bytes. Encoding is SentencePiece-style BPE:
 * a dummy-prefix space, UTF-8 code points looked up whole (byte fallback
 * <0xNN> = id 3 + byte otherwise), then repeated merges of the adjacent pair
 * whose concatenation has the best score.
 */
#ifndef FG_TOKENIZER_H
#define FG_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "fastgen.h"

#define FG_TOKEN_BOS 1
#define FG_TOKEN_EOS 2

typedef struct fg_tokenizer_entry {
    const char *piece;
    int32_t id;
} fg_tokenizer_entry;

typedef struct fg_tokenizer {
    int32_t vocab_size;
    char **pieces;               /* [vocab_size] NUL-terminated */
    float *scores;               /* [vocab_size] */
    fg_tokenizer_entry *sorted;  /* [vocab_size] by piece, for lookups */
    size_t max_piece_len;
    char byte_pieces[256][2];    /* decoded <0xNN> pieces */
} fg_tokenizer;

fg_status fg_tokenizer_load_memory(const void *buf, size_t size, int32_t vocab_size, fg_tokenizer *out, char *err,
                                   size_t err_size);
fg_status fg_tokenizer_load_file(const char *path, int32_t vocab_size, fg_tokenizer *out, char *err,
                                 size_t err_size);
void fg_tokenizer_free(fg_tokenizer *t);

/* text -> tokens (BOS first when bos). cap: room in tokens; FG_ERR_CAPACITY
 * when the result needs more (*n_out then holds how many it needs). */
fg_status fg_tokenizer_encode(const fg_tokenizer *t, const char *text, int bos, int32_t *tokens, int32_t cap,
                              int32_t *n_out);
/* The text of token after prev (a leading space after BOS is dropped, byte
 * pieces become their byte). */
const char *fg_tokenizer_decode(const fg_tokenizer *t, int32_t prev, int32_t token);

#endif
