/* Appending tokens to a sequence: kept under the heads' policies, or
 * re-profiled over the chunk (docs/design.md §2.8). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"

/* Host scratch of a re-profiling append: N = the most keys of a head
 * (its kept rows and the chunk), T = the sequence's length after it. */
typedef struct reprofile_scratch {
    int32_t *tokens;          /* [T] the tokens so far */
    uint8_t *cls;             /* [T] their classes */
    int32_t *slot_pos;        /* [N] a head's slots */
    int64_t *order;           /* [N] (position, slot), sorted */
    float *slot_score;        /* [N] */
    float *slot_k, *slot_v;   /* [N][d] as read */
    float *key_k, *key_v;     /* [N][d] in position order */
    int32_t *key_pos;         /* [N] */
    uint8_t *key_cls;         /* [N] */
    float *score, *col;       /* [N] */
    float *col_local;         /* [n_windows][N] */
    fg_rank_entry *rank;      /* [N] */
    int32_t *keep_pos, *keep_src; /* [N] */
    uint8_t *keep_flags;      /* [N] */
    float *keep_score;        /* [N] */
    fg_head *fresh;           /* [Hkv] the new caches, committed at the end */
    /* activations (backend memory with FG_IO_DEVICE) */
    float *q, *k, *v;         /* [N][G][d], [N][d], [N][d] */
    float *out;               /* [n][G][d] */
    float *mx, *sm;           /* [G][n] */
    float *row_max, *row_sum; /* [G][N] */
} reprofile_scratch;

static void reprofile_free(fg_context *ctx, reprofile_scratch *w) {
    void *host[] = {w->tokens,  w->cls,     w->slot_pos, w->order,    w->slot_score, w->slot_k,   w->slot_v,
                    w->key_k,   w->key_v,   w->key_pos,  w->key_cls,  w->score,      w->col,      w->col_local,
                    w->rank,    w->keep_pos, w->keep_src, w->keep_flags, w->keep_score};
    for (size_t i = 0; i < sizeof host / sizeof host[0]; i++)
        free(host[i]);
    for (int32_t g = 0; w->fresh && g < ctx->params.n_kv_heads; g++) {
        fg_head_free(ctx, &w->fresh[g]);
    }
    free(w->fresh);
    if (ctx->be.device_io && ctx->be.ops->synchronize)
        ctx->be.ops->synchronize(&ctx->be); /* nothing queued still reads them */
    float *act[] = {w->q, w->k, w->v, w->out, w->mx, w->sm, w->row_max, w->row_sum};
    for (size_t i = 0; i < sizeof act / sizeof act[0]; i++)
        fg_io_free(ctx, act[i]);
}

static int by_key(const void *a, const void *b) {
    const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Entries with `local` whose window at length T reaches an unpinned
 * position the head no longer holds: they cannot be taken (bit e set). */
static uint32_t unreachable_windows(const fg_compression_params *cp, const fg_profile_view *pv, const uint8_t *cls) {
    uint32_t skip = 0;
    for (int32_t e = 0; e < cp->n_policies; e++) {
        const fg_policy *pol = &cp->shortlist[e];
        const uint32_t c = fg_effective_components(pol->components);
        if (!(c & FG_KEEP_LOCAL))
            continue;
        int32_t need = 0, held = 0;
        for (int32_t p = pv->length - fg_policy_window(pol, pv->length); p < pv->length; p++)
            need += !fg_is_pinned(c, cls[p]);
        for (int32_t j = fg_policy_window_start(pol, pv); j < pv->n; j++)
            held += !fg_is_pinned(c, pv->cls[j]);
        if (held < need)
            skip |= 1u << e;
    }
    return skip;
}

/* One KV head of a re-profiling append: attention of the chunk over the
 * head's kept rows and the chunk (into out), the profile over the chunk's
 * rows, the choice, and the new cache in w->fresh[g]'s pages. Reads the
 * head's cache, writes none of it. */
static fg_status reprofile_head(fg_context *ctx, fg_seq *s, int32_t layer, int32_t g, int32_t n, const float *q,
                                const float *k, const float *v, float *out, reprofile_scratch *w) {
    const int32_t Hq = ctx->params.n_q_heads, Hkv = ctx->params.n_kv_heads, d = ctx->params.head_dim, G = Hq / Hkv;
    const int32_t t = s->length[layer], T = t + n;
    const fg_compression_params *cp = &s->cp;
    const fg_head *h = &s->heads[(size_t)layer * Hkv + g];
    const int32_t m = h->n_slots, N = m + n;
    const fg_shape shape = {G, 1, d};
    const size_t row = (size_t)d * sizeof(float);

    /* the kept rows, in position order, then the chunk's */
    fg_status st = fg_head_read_rows(&ctx->be, &ctx->layout, h, m, w->slot_k, w->slot_v, w->slot_pos, NULL,
                                        w->slot_score);
    if (st)
        return st;
    for (int32_t i = 0; i < m; i++) /* (position, slot): positions are distinct */
        w->order[i] = (int64_t)w->slot_pos[i] << 32 | (uint32_t)i;
    qsort(w->order, (size_t)m, sizeof *w->order, by_key);
    const int ranked = (h->components & FG_KEEP_FREQUENT) != 0; /* its scores were kept up */
    for (int32_t i = 0; i < N; i++) {
        const int32_t o = i < m ? (int32_t)(w->order[i] & 0xffffffff) : -1;
        w->key_pos[i] = i < m ? w->slot_pos[o] : t + (i - m);
        w->key_cls[i] = w->cls[w->key_pos[i]];
        w->score[i] = i < m && ranked ? w->slot_score[o] : 0.0f;
        if (i < m) {
            memcpy(w->key_k + (size_t)i * d, w->slot_k + (size_t)o * d, row);
            memcpy(w->key_v + (size_t)i * d, w->slot_v + (size_t)o * d, row);
        }
    }
    if ((st = fg_io_write(ctx, w->k, w->key_k, (size_t)m * row)) || (st = fg_io_write(ctx, w->v, w->key_v, (size_t)m * row)))
        return st;
    /* the chunk's rows of this head's group: strided in q / k / v */
    const size_t Gd = (size_t)G * d, Hqd = (size_t)Hq * d, Hkvd = (size_t)Hkv * d;
    if ((st = fg_io_copy_rows(ctx, w->q + (size_t)m * Gd, Gd, q + (size_t)g * Gd, Hqd, Gd, (size_t)n)) ||
        (st = fg_io_copy_rows(ctx, w->k + (size_t)m * d, (size_t)d, k + (size_t)g * d, Hkvd, (size_t)d, (size_t)n)) ||
        (st = fg_io_copy_rows(ctx, w->v + (size_t)m * d, (size_t)d, v + (size_t)g * d, Hkvd, (size_t)d, (size_t)n)))
        return st;

    /* attention (pass 1) and the profile (pass 2) of the chunk's rows */
    const fg_backend_ops *ops = ctx->be.ops;
    st = ops->prefill_attention(&ctx->be, &shape, N, m, w->q + (size_t)m * G * d, w->k, w->v, w->out, w->mx, w->sm);
    if (st == FG_OK)
        st = fg_io_copy_rows(ctx, out + (size_t)g * Gd, Hqd, w->out, Gd, Gd, (size_t)n);
    if (st == FG_OK) /* [G][n] into [G][N] at column m */
        st = fg_io_copy_rows(ctx, w->row_max + m, (size_t)N, w->mx, (size_t)n, (size_t)n, (size_t)G);
    if (st == FG_OK)
        st = fg_io_copy_rows(ctx, w->row_sum + m, (size_t)N, w->sm, (size_t)n, (size_t)n, (size_t)G);
    fg_profile_request req = {.n = N, .row_begin = m, .n_windows = 0, .key_pos = w->key_pos};
    int32_t window_of[FG_MAX_SHORTLIST];
    fg_shortlist_windows(cp, T, &req, window_of);
    if (st == FG_OK)
        st = ops->profile_stats(&ctx->be, &shape, &req, w->q, w->k, w->row_max, w->row_sum, w->col, w->col_local);
    if (st)
        return st;

    /* the choice among the entries the head can still take, and what it keeps */
    for (int32_t j = 0; j < N; j++)
        w->score[j] += w->col[j];
    fg_profile_view pv = {.n = N, .row_begin = m, .length = T, .pos = w->key_pos, .cls = w->key_cls, .col = w->col,
                          .score = w->score};
    for (int32_t e = 0; e < cp->n_policies; e++)
        pv.col_local[e] = window_of[e] >= 0 ? w->col_local + (size_t)window_of[e] * N : NULL;
    fg_head *f = &w->fresh[g];
    f->policy_index = fg_policy_choose(cp, &pv, unreachable_windows(cp, &pv, w->cls), f->recovery, w->rank);
    f->pol = cp->shortlist[f->policy_index];
    const fg_policy *pol = &f->pol;
    f->components = fg_effective_components(pol->components);
    const int32_t kept = fg_policy_keep(cp, pol, &pv, w->rank, w->keep_pos, w->keep_src, w->keep_flags, w->keep_score,
                                        &f->n_freq);
    if ((st = fg_head_reserve(ctx, f, fg_pages_for(ctx, kept))))
        return st;
    f->n_slots = kept;
    fg_head_compacted(f);
    const fg_compact_head ch = {.kv_head = 0, .n_keep = kept, .pos = w->keep_pos, .flags = w->keep_flags,
                                .score = w->keep_score, .pages = f->pages, .meta = f->meta,
                                .src = w->keep_src};
    return ops->compact(&ctx->be, &ctx->layout, &shape, N, w->k, w->v, 1, &ch);
}

/* The classes of the chunk's tokens at positions [t, t + n) into w->cls
 * (w->tokens: the tokens so far), checking the tokens another layer has. */
static fg_status chunk_classes(fg_context *ctx, const fg_seq *s, int32_t seq, int32_t t, const int32_t *tokens,
                               int32_t n, reprofile_scratch *w) {
    memcpy(w->tokens, s->tokens, (size_t)s->n_tokens * sizeof *w->tokens);
    memcpy(w->cls, s->cls, (size_t)s->n_tokens);
    for (int32_t i = 0; i < n; i++) {
        const int32_t p = t + i;
        fg_status st = fg_check_token(ctx, s, seq, p, tokens[i]);
        if (st)
            return st;
        if (p < s->n_tokens)
            continue;
        w->cls[p] = fg_token_classes_next(ctx->classes, w->tokens, p, tokens[i], s->cp.n_sink);
        w->tokens[p] = tokens[i];
    }
    return FG_OK;
}

/* FG_APPEND_REPROFILE: every head of the layer re-profiled over the chunk.
 * The new caches go to new pages; the old ones are given back only when
 * every head has succeeded, so a failure changes nothing. */
static fg_status append_reprofile(fg_context *ctx, fg_seq *s, int32_t seq, int32_t layer, const int32_t *tokens,
                                  int32_t n, const float *q, const float *k, const float *v, float *out) {
    const int32_t Hq = ctx->params.n_q_heads, Hkv = ctx->params.n_kv_heads, d = ctx->params.head_dim, G = Hq / Hkv;
    const int32_t t = s->length[layer], T = t + n;
    fg_head *heads = &s->heads[(size_t)layer * Hkv];
    int32_t N = 0;
    for (int32_t g = 0; g < Hkv; g++)
        N = heads[g].n_slots + n > N ? heads[g].n_slots + n : N;
    const size_t Nd = (size_t)N * d;
    reprofile_scratch w = {0};
    const fg_alloc_item items[] = {
        {(void **)&w.tokens, (size_t)T * sizeof *w.tokens},
        {(void **)&w.cls, (size_t)T},
        {(void **)&w.slot_pos, (size_t)N * sizeof(int32_t)},
        {(void **)&w.order, (size_t)N * sizeof(int64_t)},
        {(void **)&w.slot_score, (size_t)N * sizeof(float)},
        {(void **)&w.slot_k, Nd * sizeof(float)},
        {(void **)&w.slot_v, Nd * sizeof(float)},
        {(void **)&w.key_k, Nd * sizeof(float)},
        {(void **)&w.key_v, Nd * sizeof(float)},
        {(void **)&w.key_pos, (size_t)N * sizeof(int32_t)},
        {(void **)&w.key_cls, (size_t)N},
        {(void **)&w.score, (size_t)N * sizeof(float)},
        {(void **)&w.col, (size_t)N * sizeof(float)},
        {(void **)&w.col_local, (size_t)FG_MAX_SHORTLIST * N * sizeof(float)},
        {(void **)&w.rank, (size_t)N * sizeof(fg_rank_entry)},
        {(void **)&w.keep_pos, (size_t)N * sizeof(int32_t)},
        {(void **)&w.keep_src, (size_t)N * sizeof(int32_t)},
        {(void **)&w.keep_flags, (size_t)N},
        {(void **)&w.keep_score, (size_t)N * sizeof(float)},
    };
    w.fresh = calloc((size_t)Hkv, sizeof *w.fresh);
    fg_status st = FG_OK;
    if (!fg_alloc_all(items, sizeof items / sizeof items[0]) || !w.fresh)
        st = fg_error(ctx, FG_ERR_OUT_OF_MEMORY, "out of host memory re-profiling a chunk of %d tokens", (int)n);
    if (st == FG_OK)
        st = chunk_classes(ctx, s, seq, t, tokens, n, &w);
    if (st == FG_OK && (st = fg_io_alloc(ctx, Nd * G * sizeof(float), &w.q)) == FG_OK &&
        (st = fg_io_alloc(ctx, Nd * sizeof(float), &w.k)) == FG_OK && (st = fg_io_alloc(ctx, Nd * sizeof(float), &w.v)) == FG_OK &&
        (st = fg_io_alloc(ctx, (size_t)n * G * d * sizeof(float), &w.out)) == FG_OK &&
        (st = fg_io_alloc(ctx, (size_t)G * n * sizeof(float), &w.mx)) == FG_OK &&
        (st = fg_io_alloc(ctx, (size_t)G * n * sizeof(float), &w.sm)) == FG_OK &&
        (st = fg_io_alloc(ctx, (size_t)G * N * sizeof(float), &w.row_max)) == FG_OK)
        st = fg_io_alloc(ctx, (size_t)G * N * sizeof(float), &w.row_sum);
    for (int32_t g = 0; g < Hkv && st == FG_OK; g++)
        st = reprofile_head(ctx, s, layer, g, n, q, k, v, out, &w);
    if (st == FG_OK && ctx->be.ops->synchronize)
        st = ctx->be.ops->synchronize(&ctx->be); /* the new caches are written */
    if (st == FG_OK) { /* commit: the new caches in, the old pages out (a fork keeps its share) */
        for (int32_t g = 0; g < Hkv; g++) {
            fg_head *h = &heads[g], *f = &w.fresh[g];
            fg_head_shrink(ctx, h, 0);
            const fg_head old = *h;
            *h = *f;
            f->page_ids = old.page_ids; /* freed with the scratch */
            f->pages = old.pages;
            f->meta_ids = old.meta_ids;
            f->meta = old.meta;
            f->n_pages = 0;
            f->cap_pages = old.cap_pages;
            f->tab = old.tab; /* freed with the scratch too; the new cache makes its own */
            f->tab_cap = old.tab_cap;
        }
        for (int32_t p = s->n_tokens; p < T; p++) {
            s->tokens[p] = w.tokens[p];
            s->cls[p] = w.cls[p];
        }
        s->n_tokens = T > s->n_tokens ? T : s->n_tokens;
        s->length[layer] = T;
    }
    reprofile_free(ctx, &w);
    return st;
}

static fg_status seq_append(fg_context *ctx, int32_t seq, int32_t layer, const int32_t *tokens, int32_t n,
                        const float *q, const float *k, const float *v, float *out) {
    FG_CHECK(ctx, NULL, FG_ERR_INVALID_ARGUMENT, "fg_seq_append: context must not be NULL");
    fg_seq *s = NULL;
    fg_status st = fg_get_seq(ctx, seq, &s);
    if (st)
        return st;
    FG_CHECK(tokens && q && k && v && out, ctx, FG_ERR_INVALID_ARGUMENT,
             "fg_seq_append: tokens, q, k, v and out must not be NULL");
    FG_CHECK(layer >= 0 && layer < ctx->params.n_layers, ctx, FG_ERR_INVALID_ARGUMENT, "layer %d outside [0, %d)",
             (int)layer, (int)ctx->params.n_layers);
    FG_CHECK(n > 0, ctx, FG_ERR_INVALID_ARGUMENT, "fg_seq_append: n must be > 0, got %d", (int)n);
    const int32_t t = s->length[layer];
    FG_CHECK(t > 0, ctx, FG_ERR_BAD_STATE, "sequence %d: append before prefill at layer %d", (int)seq, (int)layer);
    FG_CHECK(!fg_stage_in_progress(ctx, s), ctx, FG_ERR_BAD_STATE,
             "sequence %d: append while a chunked prefill is in progress", (int)seq);
    FG_CHECK(n <= ctx->params.max_seq_len - t, ctx, FG_ERR_CAPACITY,
             "sequence %d: %d tokens and %d more exceed max_seq_len %d", (int)seq, (int)t, (int)n,
             (int)ctx->params.max_seq_len);
    if (s->cp.append_mode == FG_APPEND_REPROFILE)
        return append_reprofile(ctx, s, seq, layer, tokens, n, q, k, v, out);
    /* the state before the chunk, sharing its pages (the steps write none
       of them): a failure anywhere in it restores this */
    fg_seq before;
    if ((st = fg_seq_clone(ctx, s, &before)))
        return st;
    const int32_t Hkv = ctx->params.n_kv_heads;
    for (int32_t g = 0; g < Hkv; g++)
        fg_head_share(ctx, &s->heads[(size_t)layer * Hkv + g], 0);
    const size_t rq = (size_t)ctx->params.n_q_heads * ctx->params.head_dim;
    const size_t rk = (size_t)ctx->params.n_kv_heads * ctx->params.head_dim;
    for (int32_t i = 0; i < n && st == FG_OK; i++)
        st = fg_decode_f32(ctx, layer, 1, &seq, &tokens[i], q + i * rq, k + i * rk, v + i * rk, out + i * rq);
    /* an adaptive sequence the chunk carried past defer_until: compressed once
       its last layer has the chunk (the decode steps wait for every layer at
       defer_until, which a layer-by-layer append never has) */
    if (st == FG_OK && fg_adaptive_due(ctx, s))
        st = fg_adaptive_compress(ctx, s);
    if (st) {
        fg_seq_release(ctx, s);
        *s = before;
        return st; /* fg_decode's message stays */
    }
    fg_seq_release(ctx, &before);
    for (int32_t g = 0; g < Hkv; g++)
        fg_head_tidy(ctx, s, (size_t)layer * Hkv + g);
    return FG_OK;
}

fg_status fg_seq_append(fg_context *ctx, int32_t seq, int32_t layer, const int32_t *tokens, int32_t n,
                        const void *q, const void *k, const void *v, void *out) {
    FG_CLAIM(ctx, "fg_seq_append");
    fg_act_call c;
    fg_status st = fg_act_in(ctx, "fg_seq_append", fg_act_rows(ctx, seq, n, ctx->params.max_seq_len), q, k, v, out,
                             &c);
    if (st == FG_OK)
        st = fg_act_out(ctx, &c, seq_append(ctx, seq, layer, tokens, n, c.q, c.k, c.v, c.out));
    return fg_release(ctx, st);
}
