/* Sequences: create, clone, fork, destroy, their length and tokens, and
 * their chunked prefill's staged activations (the pages are core/head.c's). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dtype.h"
#include "common/slots.h"
#include "core/internal.h"

void fg_seq_release(fg_context *ctx, fg_seq *s) {
    if (s->heads) {
        int32_t n_heads = ctx->params.n_layers * ctx->params.n_kv_heads;
        for (int32_t i = 0; i < n_heads; i++)
            fg_head_free(ctx, &s->heads[i]);
    }
    if (s->stage)
        for (int32_t l = 0; l < ctx->params.n_layers; l++)
            fg_stage_free(ctx, &s->stage[l]);
    free(s->stage);
    fg_adaptive_destroy(ctx, &s->ad);
    free(s->heads);
    free(s->tokens);
    free(s->cls);
    free(s->length);
    memset(s, 0, sizeof *s);
}

fg_status fg_get_seq(const fg_context *ctx, int32_t seq, fg_seq **out) {
    FG_CHECK(ctx, NULL, FG_ERR_INVALID_ARGUMENT, "context must not be NULL");
    fg_context *c = (fg_context *)ctx; /* the error message is the only thing written */
    FG_CHECK(seq >= 0 && seq < ctx->params.max_seqs && ctx->seqs[seq].in_use, c, FG_ERR_INVALID_ARGUMENT,
             "sequence %d does not exist", (int)seq);
    *out = &ctx->seqs[seq];
    return FG_OK;
}

fg_status fg_get_head(const fg_context *ctx, int32_t seq, int32_t layer, int32_t kv_head, fg_seq **s,
                          fg_head **h) {
    fg_status st = fg_get_seq(ctx, seq, s);
    if (st)
        return st;
    fg_context *c = (fg_context *)ctx;
    FG_CHECK(layer >= 0 && layer < ctx->params.n_layers, c, FG_ERR_INVALID_ARGUMENT,
             "layer %d outside [0, %d)", (int)layer, (int)ctx->params.n_layers);
    FG_CHECK(kv_head >= 0 && kv_head < ctx->params.n_kv_heads, c, FG_ERR_INVALID_ARGUMENT,
             "kv_head %d outside [0, %d)", (int)kv_head, (int)ctx->params.n_kv_heads);
    FG_CHECK((*s)->length[layer] > 0, c, FG_ERR_BAD_STATE, "sequence %d has not been prefilled at layer %d", (int)seq,
             (int)layer);
    *h = &(*s)->heads[(size_t)layer * ctx->params.n_kv_heads + kv_head];
    return FG_OK;
}

static fg_status seq_create(fg_context *ctx, const fg_compression_params *compression, size_t size,
                            const int32_t *prompt, int32_t n_prompt, int32_t *seq_out) {
    FG_CHECK(prompt && seq_out, ctx, FG_ERR_INVALID_ARGUMENT, "fg_seq_create: prompt and seq_out must not be NULL");
    FG_CHECK(n_prompt > 0, ctx, FG_ERR_INVALID_ARGUMENT, "fg_seq_create: the prompt needs >= 1 token, got %d",
             (int)n_prompt);
    FG_CHECK(n_prompt <= ctx->params.max_seq_len, ctx, FG_ERR_CAPACITY,
             "prompt of %d tokens is longer than max_seq_len %d", (int)n_prompt, (int)ctx->params.max_seq_len);
    fg_compression_params own; /* the caller's fields over the defaults (fastgen.h's "Growth") */
    fg_status st = compression ? fg_compression_params_read(&own, compression, size) : FG_OK;
    if (st)
        return fg_error(ctx, st, "%s", fg_last_error(NULL));
    const fg_compression_params *cp = compression ? &own : &ctx->compression;
    FG_CHECK(cp->allocation != FG_ALLOC_ADAPTIVE || fg_observe_when_told(cp->observe) ||
                 cp->defer_until <= ctx->params.max_seq_len, ctx,
             FG_ERR_INVALID_ARGUMENT, "defer_until %d is beyond max_seq_len %d: the sequence could never be compressed",
             (int)cp->defer_until, (int)ctx->params.max_seq_len);
    FG_CHECK(cp->observe != FG_OBSERVE_PREDICTED || ctx->rope_freq, ctx, FG_ERR_INVALID_ARGUMENT,
             "FG_OBSERVE_PREDICTED advances queries by RoPE, and this context's is not described "
             "(fg_context_params.rope_theta)");
    int32_t id = 0;
    while (id < ctx->params.max_seqs && ctx->seqs[id].in_use)
        id++;
    FG_CHECK(id < ctx->params.max_seqs, ctx, FG_ERR_CAPACITY, "all %d sequences are in use (max_seqs)",
             (int)ctx->params.max_seqs);

    fg_seq *s = &ctx->seqs[id];
    size_t cap = (size_t)ctx->params.max_seq_len;
    s->tokens = malloc(cap * sizeof *s->tokens);
    s->cls = malloc(cap);
    s->length = calloc((size_t)ctx->params.n_layers, sizeof *s->length);
    s->heads = calloc((size_t)ctx->params.n_layers * ctx->params.n_kv_heads, sizeof *s->heads);
    if (!s->tokens || !s->cls || !s->length || !s->heads) {
        fg_seq_release(ctx, s);
        return fg_error(ctx, FG_ERR_OUT_OF_MEMORY, "out of memory creating a sequence");
    }
    st = fg_token_classes_classify(ctx->classes, prompt, n_prompt, cp->n_sink, s->cls);
    if (st) {
        fg_seq_release(ctx, s);
        return fg_error(ctx, st, "%s", fg_last_error(NULL));
    }
    if (cp->allocation == FG_ALLOC_ADAPTIVE && (st = fg_adaptive_create(ctx, cp, n_prompt, &s->ad)) != FG_OK) {
        fg_seq_release(ctx, s);
        return st;
    }
    memcpy(s->tokens, prompt, (size_t)n_prompt * sizeof *prompt);
    s->cp = *cp;
    s->n_prompt = s->n_tokens = n_prompt;
    s->parent = -1;
    s->in_use = 1;
    *seq_out = id;
    return FG_OK;
}

fg_status fg_seq_create_sized(fg_context *ctx, const fg_compression_params *compression, size_t size,
                              const int32_t *prompt, int32_t n_prompt, int32_t *seq_out) {
    FG_CLAIM(ctx, "fg_seq_create");
    return fg_release(ctx, seq_create(ctx, compression, size, prompt, n_prompt, seq_out));
}

/* c becomes a copy of s that shares its pages (one more owner each). */
fg_status fg_seq_clone(fg_context *ctx, const fg_seq *s, fg_seq *c) {
    const size_t cap = (size_t)ctx->params.max_seq_len, n_heads = (size_t)ctx->params.n_layers * ctx->params.n_kv_heads;
    memset(c, 0, sizeof *c);
    c->tokens = malloc(cap * sizeof *c->tokens);
    c->cls = malloc(cap);
    c->length = malloc((size_t)ctx->params.n_layers * sizeof *c->length);
    c->heads = calloc(n_heads, sizeof *c->heads);
    int ok = c->tokens && c->cls && c->length && c->heads;
    for (size_t i = 0; ok && i < n_heads; i++) {
        const fg_head *ph = &s->heads[i];
        fg_head *h = &c->heads[i];
        const int32_t n = ph->n_pages > 0 ? ph->n_pages : 1;
        h->page_ids = malloc((size_t)n * sizeof *h->page_ids);
        h->pages = malloc((size_t)n * sizeof *h->pages);
        h->meta_ids = malloc((size_t)n * sizeof *h->meta_ids);
        h->meta = malloc((size_t)n * sizeof *h->meta);
        ok = h->page_ids && h->pages && h->meta_ids && h->meta;
        if (!ok)
            break;
        int32_t *ids = h->page_ids, *meta_ids = h->meta_ids;
        void **pages = h->pages, **meta = h->meta;
        *h = *ph; /* policy, recoveries, counts; page tables of its own */
        h->page_ids = ids;
        h->pages = pages;
        h->meta_ids = meta_ids;
        h->meta = meta;
        h->n_pages = 0;
        h->cap_pages = n;
        h->tab = NULL; /* its own, made at its first step */
        h->tab_cap = h->tab_valid = 0;
        if (ph->n_pages > 0) { /* a head not prefilled yet has no page table */
            memcpy(h->page_ids, ph->page_ids, (size_t)ph->n_pages * sizeof *h->page_ids);
            memcpy(h->pages, ph->pages, (size_t)ph->n_pages * sizeof *h->pages);
            memcpy(h->meta_ids, ph->meta_ids, (size_t)ph->n_pages * sizeof *h->meta_ids);
            memcpy(h->meta, ph->meta, (size_t)ph->n_pages * sizeof *h->meta);
        }
        for (int32_t p = 0; p < ph->n_pages; p++) {
            fg_pool_ref(&ctx->pool, ph->page_ids[p]);
            fg_pool_ref(&ctx->meta_pool, ph->meta_ids[p]);
        }
        h->n_pages = ph->n_pages;
    }
    if (!ok) {
        fg_seq_release(ctx, c);
        return fg_error(ctx, FG_ERR_OUT_OF_MEMORY, "out of host memory copying sequence state");
    }
    fg_status st = s->ad ? fg_adaptive_clone(ctx, s->ad, &c->ad) : FG_OK;
    if (st) {
        fg_seq_release(ctx, c);
        return st;
    }
    memcpy(c->tokens, s->tokens, (size_t)s->n_tokens * sizeof *s->tokens);
    memcpy(c->cls, s->cls, (size_t)s->n_tokens);
    memcpy(c->length, s->length, (size_t)ctx->params.n_layers * sizeof *c->length);
    c->cp = s->cp;
    c->n_prompt = s->n_prompt;
    c->n_tokens = s->n_tokens;
    c->parent = s->parent; /* a copy (fg_seq_append's snapshot) keeps the lineage; fg_seq_fork sets its own */
    c->fork_len = s->fork_len;
    c->in_use = 1;
    return FG_OK;
}

static fg_status seq_fork(fg_context *ctx, int32_t parent, int32_t *child_out) {
    fg_seq *s = NULL;
    fg_status st = fg_get_seq(ctx, parent, &s);
    if (st)
        return st;
    FG_CHECK(child_out, ctx, FG_ERR_INVALID_ARGUMENT, "fg_seq_fork: child must not be NULL");
    FG_CHECK(!fg_stage_in_progress(ctx, s), ctx, FG_ERR_BAD_STATE,
             "fg_seq_fork: sequence %d has a chunked prefill in progress", (int)parent);
    FG_CHECK(s->length[0] > 0, ctx, FG_ERR_BAD_STATE,
             "fg_seq_fork: sequence %d is not prefilled yet: fork after fg_prefill (a copy of its prompt is "
             "fg_seq_create with the same tokens)", (int)parent);
    for (int32_t l = 1; l < ctx->params.n_layers; l++)
        FG_CHECK(s->length[l] == s->length[0], ctx, FG_ERR_BAD_STATE,
                 "fg_seq_fork: sequence %d is in the middle of a layer sweep (layer 0 at %d tokens, layer %d at %d)",
                 (int)parent, (int)s->length[0], (int)l, (int)s->length[l]);
    int32_t id = 0;
    while (id < ctx->params.max_seqs && ctx->seqs[id].in_use)
        id++;
    FG_CHECK(id < ctx->params.max_seqs, ctx, FG_ERR_CAPACITY, "fg_seq_fork: all %d sequences are in use (max_seqs)",
             (int)ctx->params.max_seqs);
    st = fg_seq_clone(ctx, s, &ctx->seqs[id]);
    if (st == FG_OK) {
        /* both now share every page of every head (fg_head_share) */
        const size_t n_heads = (size_t)ctx->params.n_layers * ctx->params.n_kv_heads;
        for (size_t i = 0; i < n_heads; i++) {
            fg_head_share(ctx, &s->heads[i], 0);
            fg_head_share(ctx, &ctx->seqs[id].heads[i], 1);
        }
        ctx->seqs[id].parent = parent;
        ctx->seqs[id].fork_len = s->length[0];
        *child_out = id;
    }
    return st;
}

fg_status fg_seq_fork(fg_context *ctx, int32_t parent, int32_t *child_out) {
    FG_CLAIM(ctx, "fg_seq_fork");
    return fg_release(ctx, seq_fork(ctx, parent, child_out));
}

static fg_status seq_destroy(fg_context *ctx, int32_t seq) {
    fg_seq *s = NULL;
    fg_status st = fg_get_seq(ctx, seq, &s);
    if (st)
        return st;
    /* its forks now share their prefix with its parent; the first of them
     * takes its place, and the others share with that one what both shared
     * with it */
    int32_t first = -1, first_len = 0;
    for (int32_t i = 0; i < ctx->params.max_seqs; i++) {
        fg_seq *c = &ctx->seqs[i];
        if (!c->in_use || c->parent != seq || i == seq)
            continue;
        if (first < 0) {
            first = i;
            first_len = c->fork_len;
            c->parent = s->parent;
            c->fork_len = s->fork_len < c->fork_len ? s->fork_len : c->fork_len;
        } else {
            c->parent = first;
            c->fork_len = first_len < c->fork_len ? first_len : c->fork_len;
        }
    }
    fg_seq_release(ctx, s);
    /* the pages it shared now cost their other owners more: every head whose
       share stopped paying gathers its rows (forks share only the same head) */
    const size_t n_heads = (size_t)ctx->params.n_layers * ctx->params.n_kv_heads;
    for (int32_t i = 0; i < ctx->params.max_seqs; i++)
        for (size_t h = 0; ctx->seqs[i].in_use && h < n_heads; h++)
            fg_head_tidy(ctx, &ctx->seqs[i], h);
    fg_pool_trim(&ctx->pool);
    fg_pool_trim(&ctx->meta_pool);
    return FG_OK;
}

fg_status fg_seq_destroy(fg_context *ctx, int32_t seq) {
    FG_CLAIM(ctx, "fg_seq_destroy");
    return fg_release(ctx, seq_destroy(ctx, seq));
}

static fg_status seq_length(const fg_context *ctx, int32_t seq, int32_t layer, int32_t *length) {
    fg_seq *s = NULL;
    fg_status st = fg_get_seq(ctx, seq, &s);
    if (st)
        return st;
    FG_CHECK(length, (fg_context *)ctx, FG_ERR_INVALID_ARGUMENT, "fg_seq_length: length must not be NULL");
    FG_CHECK(layer >= 0 && layer < ctx->params.n_layers, (fg_context *)ctx, FG_ERR_INVALID_ARGUMENT,
             "layer %d outside [0, %d)", (int)layer, (int)ctx->params.n_layers);
    *length = s->length[layer];
    return FG_OK;
}

fg_status fg_seq_length(const fg_context *ctx, int32_t seq, int32_t layer, int32_t *length) {
    FG_CLAIM(ctx, "fg_seq_length");
    return fg_release(ctx, seq_length(ctx, seq, layer, length));
}

fg_status fg_check_token(fg_context *ctx, const fg_seq *s, int32_t seq, int32_t p, int32_t token) {
    const int32_t vocab = fg_token_classes_vocab_size(ctx->classes);
    FG_CHECK(token >= 0 && token < vocab, ctx, FG_ERR_INVALID_ARGUMENT,
             "token %d of sequence %d (position %d) is outside the vocabulary [0, %d)", (int)token, (int)seq, (int)p,
             (int)vocab);
    FG_CHECK(p >= s->n_tokens || s->tokens[p] == token, ctx, FG_ERR_INVALID_ARGUMENT,
             "sequence %d: position %d is token %d in another layer, not %d", (int)seq, (int)p, (int)s->tokens[p],
             (int)token);
    return FG_OK;
}

void fg_stage_free(fg_context *ctx, fg_prefill_stage *stage) {
    float **bufs[] = {&stage->q, &stage->k, &stage->v, &stage->row_max, &stage->row_sum};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        if (*bufs[i] && ctx->be.device_io)
            ctx->be.ops->buffer_free(&ctx->be, *bufs[i]);
        else
            free(*bufs[i]);
        *bufs[i] = NULL;
    }
    stage->filled = 0;
}

/* Whether a sequence has a chunked prefill in progress on some layer. */
int fg_stage_in_progress(const fg_context *ctx, const fg_seq *s) {
    for (int32_t l = 0; s->stage && l < ctx->params.n_layers; l++)
        if (s->stage[l].filled)
            return 1;
    return 0;
}
