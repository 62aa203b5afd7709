/*
 * A vocabulary as the encoders read it (model/tokenizer.c: SentencePiece;
 * model/bpe.c: byte-level BPE): pieces, scores, control tokens, merges.
 * Loaded and freed by model/tokenizer.h.
 */
#ifndef FGM_VOCAB_H
#define FGM_VOCAB_H

#include <stddef.h>
#include <stdint.h>

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

#endif /* FGM_VOCAB_H */
