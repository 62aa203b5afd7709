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
#ifndef SYNTH_H
#define SYNTH_H

#include <stdint.h>

#include "fastgen.h"

typedef enum synth_type {
    SYNTH_SINK = 0,
    SYNTH_PUNCT,
    SYNTH_HEAVY,
    SYNTH_LOCAL,
    SYNTH_BROAD,
    SYNTH_N_TYPES
} synth_type;

#define SYNTH_VOCAB 64
#define SYNTH_BOS 1
#define SYNTH_EOS 2

typedef struct synth {
    int32_t n_layers, n_q_heads, n_kv_heads, head_dim;
    uint64_t seed;
    synth_type *types;      /* [n_layers][n_kv_heads] */
    fg_token_classes *classes; /* of the synthetic vocabulary (BOS/EOS special) */
} synth;

/* Planted types cycle over heads and layers (every type in every layer when
 * Hkv >= 5, like the paper's mixes). */
fg_status synth_create(int32_t n_layers, int32_t n_q_heads, int32_t n_kv_heads, int32_t head_dim, uint64_t seed,
                          synth *out);
void synth_destroy(synth *s);
const char *synth_type_name(synth_type t);
/* Index of the paper shortlist entry a planted type should take. */
int32_t synth_expected_entry(synth_type t);

/* Token at position p (BOS at 0, ~12% punctuation, otherwise words). */
int32_t synth_token(const synth *s, int32_t p);
/* Rows for positions [pos0, pos0 + n) of one layer; tokens[0..n) are the
 * tokens at those positions.
 *   q: [n][Hq][d]   k, v: [n][Hkv][d] */
void synth_qkv(const synth *s, int32_t layer, const int32_t *tokens, int32_t pos0, int32_t n, float *q, float *k,
                  float *v);

#endif
