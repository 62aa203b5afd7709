/* fg_seq_observe, fg_seq_observe_scores and fg_seq_compress: the engine's
 * own rows (FG_OBSERVE_EXPLICIT) or key scores (FG_OBSERVE_SCORES) for the
 * adaptive mode, and its compression when told. The method is
 * core/adaptive.c's; this file checks the calls. */
#include <math.h>

#include "core/internal.h"

/* An adaptive sequence whose every layer is prefilled to one length. */
static fg_status check_observable(fg_context *ctx, const fg_seq *s, int32_t seq, const char *fn) {
    FG_CHECK(s->cp.allocation == FG_ALLOC_ADAPTIVE, ctx, FG_ERR_BAD_STATE,
             "%s: sequence %d is not adaptive (FG_ALLOC_ADAPTIVE)", fn, (int)seq);
    FG_CHECK(s->ad, ctx, FG_ERR_BAD_STATE, "%s: sequence %d is compressed already", fn, (int)seq);
    FG_CHECK(!fg_stage_in_progress(ctx, s), ctx, FG_ERR_BAD_STATE, "%s: sequence %d has a chunked prefill in progress",
             fn, (int)seq);
    for (int32_t l = 0; l < ctx->params.n_layers; l++)
        FG_CHECK(s->length[l] > 0 && s->length[l] == s->length[0], ctx, FG_ERR_BAD_STATE,
                 "%s: sequence %d: every layer must be prefilled to one length (layer 0 at %d tokens, layer %d at %d)",
                 fn, (int)seq, (int)s->length[0], (int)l, (int)s->length[l]);
    return FG_OK;
}

static fg_status seq_observe(fg_context *ctx, int32_t seq, int32_t layer, const float *q, const float *k,
                             const float *v, int32_t n, float *out) {
    fg_seq *s = NULL;
    fg_status st = fg_get_seq(ctx, seq, &s);
    if (st)
        return st;
    FG_CHECK(layer >= 0 && layer < ctx->params.n_layers, ctx, FG_ERR_INVALID_ARGUMENT,
             "fg_seq_observe: layer %d is not in 0..%d", (int)layer, (int)ctx->params.n_layers - 1);
    FG_CHECK(q && k && v && out, ctx, FG_ERR_INVALID_ARGUMENT, "fg_seq_observe: q, k, v and out must not be NULL");
    FG_CHECK(n > 0, ctx, FG_ERR_INVALID_ARGUMENT, "fg_seq_observe: n must be > 0, got %d", (int)n);
    if ((st = check_observable(ctx, s, seq, "fg_seq_observe")))
        return st;
    FG_CHECK(s->cp.observe == FG_OBSERVE_EXPLICIT, ctx, FG_ERR_BAD_STATE,
             "fg_seq_observe: sequence %d observes its own rows (observe = FG_OBSERVE_TAIL); given rows need "
             "FG_OBSERVE_EXPLICIT", (int)seq);
    FG_CHECK(n <= ctx->params.max_seq_len && n <= INT32_MAX - s->length[layer], ctx, FG_ERR_CAPACITY,
             "fg_seq_observe: %d rows at once are more than max_seq_len %d (give them in chunks)", (int)n,
             (int)ctx->params.max_seq_len);
    return fg_adaptive_observe_pass(ctx, s, layer, q, k, v, n, out);
}

fg_status fg_seq_observe(fg_context *ctx, int32_t seq, int32_t layer, const void *q, const void *k, const void *v,
                         int32_t n, void *out) {
    FG_CLAIM(ctx, "fg_seq_observe");
    fg_act_call c;
    fg_status st = fg_act_in(ctx, "fg_seq_observe", fg_act_rows(ctx, seq, n, ctx->params.max_seq_len), q, k, v, out,
                             &c);
    if (st == FG_OK)
        st = fg_act_out(ctx, &c, seq_observe(ctx, seq, layer, c.q, c.k, c.v, n, c.out));
    return fg_release(ctx, st);
}

static fg_status seq_observe_scores(fg_context *ctx, int32_t seq, int32_t layer, const float *scores, int32_t n) {
    fg_seq *s = NULL;
    fg_status st = fg_get_seq(ctx, seq, &s);
    if (st)
        return st;
    FG_CHECK(layer >= 0 && layer < ctx->params.n_layers, ctx, FG_ERR_INVALID_ARGUMENT,
             "fg_seq_observe_scores: layer %d is not in 0..%d", (int)layer, (int)ctx->params.n_layers - 1);
    FG_CHECK(scores, ctx, FG_ERR_INVALID_ARGUMENT, "fg_seq_observe_scores: scores must not be NULL");
    if ((st = check_observable(ctx, s, seq, "fg_seq_observe_scores")))
        return st;
    FG_CHECK(s->cp.observe == FG_OBSERVE_SCORES, ctx, FG_ERR_BAD_STATE,
             "fg_seq_observe_scores: sequence %d does not rank by given scores; that needs FG_OBSERVE_SCORES",
             (int)seq);
    FG_CHECK(n == s->length[layer], ctx, FG_ERR_INVALID_ARGUMENT,
             "fg_seq_observe_scores: n must be the %d keys layer %d holds, got %d", (int)s->length[layer], (int)layer,
             (int)n);
    const size_t m = (size_t)ctx->params.n_kv_heads * n;
    for (size_t i = 0; i < m; i++)
        FG_CHECK(isfinite(scores[i]) && scores[i] >= 0.0f, ctx, FG_ERR_INVALID_ARGUMENT,
                 "fg_seq_observe_scores: score %zu (head %d, key %d) is %g; scores must be finite and >= 0", i,
                 (int)(i / (size_t)n), (int)(i % (size_t)n), (double)scores[i]);
    return fg_adaptive_observe_scores(ctx, s, layer, scores, n);
}

fg_status fg_seq_observe_scores(fg_context *ctx, int32_t seq, int32_t layer, const float *scores, int32_t n) {
    FG_CLAIM(ctx, "fg_seq_observe_scores");
    return fg_release(ctx, seq_observe_scores(ctx, seq, layer, scores, n));
}

static fg_status seq_observed_ranks(fg_context *ctx, int32_t seq, int32_t layer, float *out, int32_t n) {
    fg_seq *s = NULL;
    fg_status st = fg_get_seq(ctx, seq, &s);
    if (st)
        return st;
    FG_CHECK(layer >= 0 && layer < ctx->params.n_layers, ctx, FG_ERR_INVALID_ARGUMENT,
             "fg_seq_observed_ranks: layer %d is not in 0..%d", (int)layer, (int)ctx->params.n_layers - 1);
    FG_CHECK(out, ctx, FG_ERR_INVALID_ARGUMENT, "fg_seq_observed_ranks: out must not be NULL");
    FG_CHECK(s->cp.allocation == FG_ALLOC_ADAPTIVE && fg_observe_when_told(s->cp.observe), ctx, FG_ERR_BAD_STATE,
             "fg_seq_observed_ranks: sequence %d is not adaptive with FG_OBSERVE_EXPLICIT or FG_OBSERVE_SCORES",
             (int)seq);
    FG_CHECK(s->ad, ctx, FG_ERR_BAD_STATE, "fg_seq_observed_ranks: sequence %d is compressed already", (int)seq);
    FG_CHECK(n >= 0 && n <= s->length[layer], ctx, FG_ERR_INVALID_ARGUMENT,
             "fg_seq_observed_ranks: n must be in 0..%d (the keys layer %d holds), got %d", (int)s->length[layer],
             (int)layer, (int)n);
    fg_adaptive_ranks(ctx, s, layer, out, n);
    return FG_OK;
}

fg_status fg_seq_observed_ranks(fg_context *ctx, int32_t seq, int32_t layer, float *out, int32_t n) {
    FG_CLAIM(ctx, "fg_seq_observed_ranks");
    return fg_release(ctx, seq_observed_ranks(ctx, seq, layer, out, n));
}

static fg_status seq_compress(fg_context *ctx, int32_t seq) {
    fg_seq *s = NULL;
    fg_status st = fg_get_seq(ctx, seq, &s);
    if (st || (st = check_observable(ctx, s, seq, "fg_seq_compress")))
        return st;
    for (int32_t l = 1; l < ctx->params.n_layers; l++)
        FG_CHECK(s->ad->layers[l].seen == s->ad->layers[0].seen, ctx, FG_ERR_BAD_STATE,
                 "fg_seq_compress: sequence %d: every layer must be given the same rows (layer 0 was given %lld, "
                 "layer %d %lld)", (int)seq, (long long)s->ad->layers[0].seen, (int)l,
                 (long long)s->ad->layers[l].seen);
    for (int32_t l = 1; l < ctx->params.n_layers; l++)
        FG_CHECK(s->ad->layers[l].n_scored == s->ad->layers[0].n_scored, ctx, FG_ERR_BAD_STATE,
                 "fg_seq_compress: sequence %d: every layer must be given scores as many times (layer 0 %d, layer %d "
                 "%d)", (int)seq, (int)s->ad->layers[0].n_scored, (int)l, (int)s->ad->layers[l].n_scored);
    return fg_adaptive_compress(ctx, s);
}

fg_status fg_seq_compress(fg_context *ctx, int32_t seq) {
    FG_CLAIM(ctx, "fg_seq_compress");
    return fg_release(ctx, seq_compress(ctx, seq));
}
