/* Prefill: one-shot (fg_prefill) and chunked (fg_prefill_chunk). Each
 * layer's prompt is attended, profiled (docs/design.md §2.3), given its
 * policies and compacted into the cache (§2.4). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"

typedef struct prefill_scratch {
    float *row_max, *row_sum; /* [Hq][n] */
    float *col;               /* [Hkv][n] */
    float *col_local;         /* [n_windows][Hkv][n] */
    int32_t *pos;             /* [Hkv][n] kept positions per head */
    uint8_t *flags;           /* [Hkv][n] */
    float *score;             /* [Hkv][n] */
    fg_rank_entry *rank;      /* [n] */
    fg_compact_head *compact; /* [Hkv] */
    fg_profile_view *views;   /* [Hkv] */
    double *rec;              /* [Hkv][n_policies] budget mode: recoveries */
    int32_t *cost;            /* [Hkv][n_policies] budget mode: rows kept */
    int32_t *choice;          /* [Hkv] budget mode */
    float *pooled;            /* [Hkv][n] pooled ranks (score_pool > 1) */
    fg_rank_entry *shares;    /* [Hkv][n] FG_ALLOC_ADAKV: the candidates of every head */
    fg_policy *pols;          /* [Hkv] FG_ALLOC_ADAKV: every head's share */
} prefill_scratch;

static void prefill_scratch_free(fg_context *ctx, prefill_scratch *w) {
    if (ctx->be.device_io) {
        if (w->row_max)
            ctx->be.ops->buffer_free(&ctx->be, w->row_max);
        if (w->row_sum)
            ctx->be.ops->buffer_free(&ctx->be, w->row_sum);
    } else {
        free(w->row_max);
        free(w->row_sum);
    }
    free(w->col);
    free(w->col_local);
    free(w->pos);
    free(w->flags);
    free(w->score);
    free(w->rank);
    free(w->compact);
    free(w->views);
    free(w->rec);
    free(w->cost);
    free(w->choice);
    free(w->pooled);
    free(w->shares);
    free(w->pols);
}

/* A mode whose heads rank by their layer's mean (FG_ALLOC_LAYER):
 * x[Hkv][n] becomes, in every head, the mean of its heads (summed in head
 * order). */
static void layer_mean(float *x, int32_t Hkv, int32_t n) {
    for (int32_t j = 0; j < n; j++) {
        float sum = 0.0f;
        for (int32_t g = 0; g < Hkv; g++)
            sum += x[(size_t)g * n + j];
        for (int32_t g = 0; g < Hkv; g++)
            x[(size_t)g * n + j] = sum / (float)Hkv;
    }
}

/* The prompt phase of one layer. With stats (the row max and sum of every
 * prompt row, from the chunks of a chunked prefill) the attention is done
 * and only profiling, policy choice and compaction run; out is unused. */
static fg_status prefill_layer(fg_context *ctx, fg_seq *s, int32_t layer, const float *q, const float *k,
                               const float *v, float *out, const float *const stats[2], prefill_scratch *w) {
    const int32_t n = s->n_prompt, Hq = ctx->params.n_q_heads, Hkv = ctx->params.n_kv_heads;
    const fg_compression_params *cp = &s->cp;

    /* distinct local windows w(n) of the shortlist */
    fg_profile_request req = {.n = n, .row_begin = 0, .n_windows = 0};
    const fg_alloc_mode *mode = fg_alloc_mode_of(cp);
    if (cp->observation_window > 0 && cp->observation_window < n && mode->tail_ranks(cp))
        req.row_begin = n - cp->observation_window;
    int32_t window_of[FG_MAX_SHORTLIST];
    fg_shortlist_windows(cp, n, &req, window_of);

    size_t nq = (size_t)Hq * n, nk = (size_t)Hkv * n;
    if (stats) {
        /* given */
    } else if (ctx->be.device_io) { /* the row statistics pass from one kernel to the next: device memory */
        fg_status sa = ctx->be.ops->buffer_alloc(&ctx->be, nq * sizeof(float), (void **)&w->row_max);
        if (sa == FG_OK)
            sa = ctx->be.ops->buffer_alloc(&ctx->be, nq * sizeof(float), (void **)&w->row_sum);
        if (sa)
            return sa;
    }
    const int host_stats = !stats && !ctx->be.device_io;
    const int pool = cp->score_pool > 1, share = mode->shares_rows;
    const size_t np = (size_t)Hkv * cp->n_policies;
    const fg_alloc_item items[] = {
        {(void **)&w->row_max, host_stats ? nq * sizeof(float) : 0},
        {(void **)&w->row_sum, host_stats ? nq * sizeof(float) : 0},
        {(void **)&w->col, nk * sizeof(float)},
        {(void **)&w->col_local, (req.n_windows ? (size_t)req.n_windows : 1) * nk * sizeof(float)},
        {(void **)&w->pos, nk * sizeof(int32_t)},
        {(void **)&w->flags, nk},
        {(void **)&w->score, nk * sizeof(float)},
        {(void **)&w->rank, (size_t)n * sizeof(fg_rank_entry)},
        {(void **)&w->compact, (size_t)Hkv * sizeof(fg_compact_head)},
        {(void **)&w->views, (size_t)Hkv * sizeof(fg_profile_view)},
        {(void **)&w->rec, np * sizeof(double)},
        {(void **)&w->cost, np * sizeof(int32_t)},
        {(void **)&w->choice, (size_t)Hkv * sizeof(int32_t)},
        {(void **)&w->pooled, pool ? nk * sizeof(float) : 0},
        {(void **)&w->shares, share ? nk * sizeof(fg_rank_entry) : 0},
        {(void **)&w->pols, share ? (size_t)Hkv * sizeof(fg_policy) : 0},
    };
    FG_CHECK(fg_alloc_all(items, sizeof items / sizeof items[0]),
             ctx, FG_ERR_OUT_OF_MEMORY, "out of host memory for profiling a prompt of %d tokens", (int)n);

    const fg_backend_ops *ops = ctx->be.ops;
    const float *row_max = stats ? stats[0] : w->row_max, *row_sum = stats ? stats[1] : w->row_sum;
    fg_status st = stats ? FG_OK
                         : ops->prefill_attention(&ctx->be, &ctx->shape, n, 0, q, k, v, out, w->row_max, w->row_sum);
    if (st == FG_OK)
        st = ops->profile_stats(&ctx->be, &ctx->shape, &req, q, k, row_max, row_sum, w->col, w->col_local);
    if (st)
        return st;
    if (mode->layer_ranks) { /* every head ranks by the layer's mean */
        layer_mean(w->col, Hkv, n);
        for (int32_t x = 0; x < req.n_windows; x++)
            layer_mean(w->col_local + (size_t)x * nk, Hkv, n);
    }

    /* policy choice and the kept rows of every head (host) */
    fg_head *heads = &s->heads[(size_t)layer * Hkv];
    fg_profile_view *views = w->views;
    for (int32_t g = 0; g < Hkv; g++) {
        fg_profile_view pv = {
            .n = n, .row_begin = req.row_begin, .length = n, .cls = s->cls, .col = w->col + (size_t)g * n};
        for (int32_t e = 0; e < cp->n_policies; e++)
            pv.col_local[e] = window_of[e] >= 0 ? w->col_local + ((size_t)window_of[e] * Hkv + g) * n : NULL;
        if (cp->score_pool > 1) {
            fg_policy_pool_ranks(cp, &pv, w->pooled + (size_t)g * n);
            pv.rank = w->pooled + (size_t)g * n;
        }
        views[g] = pv;
        heads[g].policy_index = fg_policy_choose(cp, &pv, 0, heads[g].recovery, w->rank);
    }
    const fg_layer_choice choice = {cp, s, layer, Hkv, n, views, heads, w->col,
                                    w->rec, w->cost, w->choice, w->rank, w->shares, w->pols};
    mode->choose(&choice);
    for (int32_t g = 0; g < Hkv; g++) {
        const fg_profile_view pv = views[g];
        fg_head *h = &heads[g];
        const fg_policy *pol = &h->pol;
        h->components = fg_effective_components(pol->components);
        int32_t n_freq;
        int32_t kept = fg_policy_keep(cp, pol, &pv, w->rank, w->pos + (size_t)g * n, NULL, w->flags + (size_t)g * n,
                                      w->score + (size_t)g * n, &n_freq);
        w->compact[g] = (fg_compact_head){.kv_head = g, .n_keep = kept, .pos = w->pos + (size_t)g * n,
                                          .flags = w->flags + (size_t)g * n, .score = w->score + (size_t)g * n};
        h->n_freq = n_freq;
    }

    /* pages for every head, all or nothing */
    for (int32_t g = 0; g < Hkv; g++) {
        st = fg_head_reserve(ctx, &heads[g], fg_pages_for(ctx, w->compact[g].n_keep));
        if (st) {
            for (int32_t i = 0; i <= g; i++)
                fg_head_shrink(ctx, &heads[i], 0);
            return st;
        }
        w->compact[g].pages = heads[g].pages;
        w->compact[g].meta = heads[g].meta;
    }
    st = ops->compact(&ctx->be, &ctx->layout, &ctx->shape, n, k, v, Hkv, w->compact);
    if (st) {
        for (int32_t g = 0; g < Hkv; g++)
            fg_head_shrink(ctx, &heads[g], 0);
        return st;
    }
    for (int32_t g = 0; g < Hkv; g++) {
        heads[g].n_slots = w->compact[g].n_keep;
        fg_head_compacted(&heads[g]);
    }
    s->length[layer] = n;
    if (mode->layer_prefilled)
        st = mode->layer_prefilled(ctx, s, layer, n, stats ? NULL : q);
    if (st) { /* the layer as it was: not prefilled */
        for (int32_t g = 0; g < Hkv; g++)
            fg_head_shrink(ctx, &heads[g], 0);
        s->length[layer] = 0;
    }
    return st;
}

/* What fg_prefill and fg_prefill_chunk check first: the sequence, the
 * arrays, the layer, and that the layer is not prefilled yet. */
static fg_status prefill_checks(fg_context *ctx, const char *fn, int32_t seq, int32_t layer, const float *q,
                                const float *k, const float *v, const float *out, fg_seq **s) {
    fg_status st = fg_get_seq(ctx, seq, s);
    if (st)
        return st;
    FG_CHECK(q && k && v && out, ctx, FG_ERR_INVALID_ARGUMENT, "%s: q, k, v and out must not be NULL", fn);
    FG_CHECK(layer >= 0 && layer < ctx->params.n_layers, ctx, FG_ERR_INVALID_ARGUMENT, "layer %d outside [0, %d)",
             (int)layer, (int)ctx->params.n_layers);
    FG_CHECK((*s)->length[layer] == 0, ctx, FG_ERR_BAD_STATE, "sequence %d is already prefilled at layer %d", (int)seq,
             (int)layer);
    return FG_OK;
}

static fg_status prefill(fg_context *ctx, int32_t seq, int32_t layer, const float *q, const float *k, const float *v,
                     float *out) {
    fg_seq *s = NULL;
    fg_status st = prefill_checks(ctx, "fg_prefill", seq, layer, q, k, v, out, &s);
    if (st)
        return st;
    FG_CHECK(!s->stage || s->stage[layer].filled == 0, ctx, FG_ERR_BAD_STATE,
             "sequence %d: layer %d has a chunked prefill in progress (%d of %d rows)", (int)seq, (int)layer,
             (int)s->stage[layer].filled, (int)s->n_prompt);
    prefill_scratch w = {0};
    st = prefill_layer(ctx, s, layer, q, k, v, out, NULL, &w);
    prefill_scratch_free(ctx, &w);
    return st;
}

fg_status fg_prefill(fg_context *ctx, int32_t seq, int32_t layer, const void *q, const void *k, const void *v,
                     void *out) {
    FG_CLAIM(ctx, "fg_prefill");
    const int64_t n = fg_act_prompt(ctx, seq);
    fg_act_call c;
    fg_status st = fg_act_in(ctx, "fg_prefill", fg_act_rows(ctx, seq, n, n), q, k, v, out, &c);
    if (st == FG_OK)
        st = fg_act_out(ctx, &c, prefill(ctx, seq, layer, c.q, c.k, c.v, c.out));
    return fg_release(ctx, st);
}

static fg_status prefill_chunk(fg_context *ctx, int32_t seq, int32_t layer, int32_t begin, int32_t n, const float *q,
                           const float *k, const float *v, float *out) {
    fg_seq *s = NULL;
    fg_status st = prefill_checks(ctx, "fg_prefill_chunk", seq, layer, q, k, v, out, &s);
    if (st)
        return st;
    const int32_t filled = s->stage ? s->stage[layer].filled : 0, N = s->n_prompt;
    FG_CHECK(begin == filled, ctx, FG_ERR_INVALID_ARGUMENT,
             "fg_prefill_chunk: sequence %d layer %d expects the chunk at row %d, got %d (chunks come in order)",
             (int)seq, (int)layer, (int)filled, (int)begin);
    FG_CHECK(n > 0 && n <= N - begin, ctx, FG_ERR_INVALID_ARGUMENT,
             "fg_prefill_chunk: %d rows at row %d do not fit the prompt of %d", (int)n, (int)begin, (int)N);
    const int32_t Hq = ctx->params.n_q_heads, Hkv = ctx->params.n_kv_heads, d = ctx->params.head_dim;
    const size_t rq = (size_t)Hq * d * sizeof(float), rk = (size_t)Hkv * d * sizeof(float);
    if (!s->stage) {
        s->stage = calloc((size_t)ctx->params.n_layers, sizeof *s->stage);
        FG_CHECK(s->stage, ctx, FG_ERR_OUT_OF_MEMORY, "out of host memory for a chunked prefill");
    }
    fg_prefill_stage *stage = &s->stage[layer];
    if (begin == 0) { /* the prompt's rows of this layer, held until the last chunk */
        fg_stage_free(ctx, stage); /* what a failed first chunk left */
        if ((st = fg_io_alloc(ctx, (size_t)N * rq, &stage->q)) || (st = fg_io_alloc(ctx, (size_t)N * rk, &stage->k)) ||
            (st = fg_io_alloc(ctx, (size_t)N * rk, &stage->v)) ||
            (st = fg_io_alloc(ctx, (size_t)Hq * N * sizeof(float), &stage->row_max)) ||
            (st = fg_io_alloc(ctx, (size_t)Hq * N * sizeof(float), &stage->row_sum))) {
            fg_stage_free(ctx, stage);
            return st;
        }
    }
    /* the chunk's rows join the stage (a failure below leaves `filled` where it was: the chunk can come again) */
    float *mx = NULL, *sm = NULL;
    if ((st = fg_io_copy(ctx, stage->q + (size_t)begin * Hq * d, q, (size_t)n * rq)) == FG_OK &&
        (st = fg_io_copy(ctx, stage->k + (size_t)begin * Hkv * d, k, (size_t)n * rk)) == FG_OK &&
        (st = fg_io_copy(ctx, stage->v + (size_t)begin * Hkv * d, v, (size_t)n * rk)) == FG_OK &&
        (st = fg_io_alloc(ctx, (size_t)Hq * n * sizeof(float), &mx)) == FG_OK &&
        (st = fg_io_alloc(ctx, (size_t)Hq * n * sizeof(float), &sm)) == FG_OK)
        st = ctx->be.ops->prefill_attention(&ctx->be, &ctx->shape, begin + n, begin, q, stage->k, stage->v, out, mx,
                                            sm);
    const fg_alloc_mode *mode = fg_alloc_mode_of(&s->cp);
    if (st == FG_OK && mode->chunk_prefilled)
        st = mode->chunk_prefilled(ctx, s, layer, begin, n, N, q);
    if (st == FG_OK) /* [Hq][n] into [Hq][N] at column begin */
        st = fg_io_copy_rows(ctx, stage->row_max + begin, (size_t)N, mx, (size_t)n, (size_t)n, (size_t)Hq);
    if (st == FG_OK)
        st = fg_io_copy_rows(ctx, stage->row_sum + begin, (size_t)N, sm, (size_t)n, (size_t)n, (size_t)Hq);
    if (ctx->be.device_io && (mx || sm) && st == FG_OK && ctx->be.ops->synchronize)
        st = ctx->be.ops->synchronize(&ctx->be); /* the copies out of mx and sm are done before they go */
    float *tmp[2] = {mx, sm};
    for (int i = 0; i < 2; i++)
        if (tmp[i] && ctx->be.device_io)
            ctx->be.ops->buffer_free(&ctx->be, tmp[i]);
        else
            free(tmp[i]);
    if (st)
        return st;
    if (begin + n < N) {
        stage->filled = begin + n;
        return FG_OK;
    }
    /* the last chunk: profile the whole prompt, choose, compact; the stage goes */
    prefill_scratch w = {0};
    const float *const stats[2] = {stage->row_max, stage->row_sum};
    st = prefill_layer(ctx, s, layer, stage->q, stage->k, stage->v, NULL, stats, &w);
    prefill_scratch_free(ctx, &w);
    if (st) {
        stage->filled = begin; /* the last chunk can come again */
        return st;
    }
    fg_stage_free(ctx, stage);
    return FG_OK;
}

fg_status fg_prefill_chunk(fg_context *ctx, int32_t seq, int32_t layer, int32_t begin, int32_t n, const void *q,
                           const void *k, const void *v, void *out) {
    FG_CLAIM(ctx, "fg_prefill_chunk");
    const int64_t rest = begin >= 0 ? (int64_t)fg_act_prompt(ctx, seq) - begin : 0;
    fg_act_call c;
    fg_status st = fg_act_in(ctx, "fg_prefill_chunk", fg_act_rows(ctx, seq, n, rest), q, k, v, out, &c);
    if (st == FG_OK)
        st = fg_act_out(ctx, &c, prefill_chunk(ctx, seq, layer, begin, n, c.q, c.k, c.v, c.out));
    return fg_release(ctx, st);
}
