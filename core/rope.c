/* The engine's RoPE as the context knows it (fg_context_params' rope_*):
 * queries advanced to later positions for FG_OBSERVE_PREDICTED. RoPE turns
 * pair i of a head by position x freq[i] radians, so a query rotated at
 * position p is the same query at p + k once each pair turns by k x freq[i]:
 * the positions compose, and nothing needs the query before RoPE. */
#include <math.h>

#include "core/internal.h"

void fg_rope_turns(const fg_context *ctx, int64_t k, float *turn) {
    for (int32_t j = 0; j < ctx->params.rope_dims / 2; j++) {
        const double a = fmod((double)k * ctx->rope_freq[j], 6.283185307179586); /* k large: reduced in double */
        turn[2 * j] = (float)cos(a);
        turn[2 * j + 1] = (float)sin(a);
    }
}

void fg_rope_turn(const fg_context *ctx, const float *turn, float *x, int32_t n_heads) {
    const int32_t d = ctx->params.head_dim, pairs = ctx->params.rope_dims / 2;
    const int halves = ctx->params.rope_style == FG_ROPE_HALVES;
    for (int32_t h = 0; h < n_heads; h++, x += d)
        for (int32_t j = 0; j < pairs; j++) {
            float *a = x + (halves ? j : 2 * j), *b = x + (halves ? j + pairs : 2 * j + 1);
            const float c = turn[2 * j], sn = turn[2 * j + 1], x0 = *a, x1 = *b;
            *a = x0 * c - x1 * sn;
            *b = x0 * sn + x1 * c;
        }
}
