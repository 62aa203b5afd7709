/*
 * Synthetic workload (docs/design.md §5.1): a token stream and Q/K/V with planted
 * head types, deterministic in (seed, layer, head, position), so a prompt
 * and its continuation are drawn from the same structure.
 *
 * Keys carry one channel per token property (special, punctuation, heavy
 * hitter) plus rotating pairs that encode the position; each planted head
 * type puts its query on one of them:
 *   SINK    -> special tokens (BOS at 0)     expected: special
 *   PUNCT   -> punctuation                   expected: special+punct
 *   HEAVY   -> ~5% "heavy" ordinary tokens   expected: special+punct+frequent
 *   LOCAL   -> the most recent positions     expected: special+punct+frequent+local
 *   BROAD   -> nothing (near-uniform)        expected: full
 */
#ifndef FG_SYNTH_H
#define FG_SYNTH_H

#include <stdint.h>

#include "fastgen.h"

typedef enum fg_synth_type {
    FG_SYNTH_SINK = 0,
    FG_SYNTH_PUNCT,
    FG_SYNTH_HEAVY,
    FG_SYNTH_LOCAL,
    FG_SYNTH_BROAD,
    FG_SYNTH_N_TYPES
} fg_synth_type;

#define FG_SYNTH_VOCAB 64
#define FG_SYNTH_BOS 1
#define FG_SYNTH_EOS 2

typedef struct fg_synth {
    int32_t n_layers, n_q_heads, n_kv_heads, head_dim;
    uint64_t seed;
    fg_synth_type *types;      /* [n_layers][n_kv_heads] */
    fg_token_classes *classes; /* of the synthetic vocabulary (BOS/EOS special) */
} fg_synth;

/* Planted types cycle over heads and layers (every type in every layer when
 * Hkv >= 5, like the paper's mixes). */
fg_status fg_synth_create(int32_t n_layers, int32_t n_q_heads, int32_t n_kv_heads, int32_t head_dim, uint64_t seed,
                          fg_synth *out);
void fg_synth_destroy(fg_synth *s);
const char *fg_synth_type_name(fg_synth_type t);
/* Index of the paper shortlist entry a planted type should take. */
int32_t fg_synth_expected_entry(fg_synth_type t);

/* Token at position p (BOS at 0, ~12% punctuation, otherwise words). */
int32_t fg_synth_token(const fg_synth *s, int32_t p);
/* Rows for positions [pos0, pos0 + n) of one layer; tokens[0..n) are the
 * tokens at those positions.
 *   q: [n][Hq][d]   k, v: [n][Hkv][d] */
void fg_synth_qkv(const fg_synth *s, int32_t layer, const int32_t *tokens, int32_t pos0, int32_t n, float *q, float *k,
                  float *v);

#endif
