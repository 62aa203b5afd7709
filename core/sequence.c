/* Sequences (create, clone, fork, destroy) and their pages: reservation,
 * copy-on-write unsharing, re-sharing. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dtype.h"
#include "core/internal.h"

void fg_seq_release(fg_context *ctx, fg_seq *s) {
    if (s->heads) {
        int32_t n_heads = ctx->params.n_layers * ctx->params.n_kv_heads;
        for (int32_t i = 0; i < n_heads; i++) {
            fg_head *h = &s->heads[i];
            for (int32_t p = 0; p < h->n_pages; p++)
                fg_pool_free(&ctx->pool, h->page_ids[p]);
            free(h->page_ids);
            free(h->pages);
        }
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

fg_status fg_seq_create(fg_context *ctx, const fg_compression_params *compression, const int32_t *prompt,
                        int32_t n_prompt, int32_t *seq_out) {
    FG_CHECK(ctx, NULL, FG_ERR_INVALID_ARGUMENT, "fg_seq_create: context must not be NULL");
    FG_CHECK(prompt && seq_out, ctx, FG_ERR_INVALID_ARGUMENT, "fg_seq_create: prompt and seq_out must not be NULL");
    FG_CHECK(n_prompt > 0, ctx, FG_ERR_INVALID_ARGUMENT, "fg_seq_create: the prompt needs >= 1 token, got %d",
             (int)n_prompt);
    FG_CHECK(n_prompt <= ctx->params.max_seq_len, ctx, FG_ERR_CAPACITY,
             "prompt of %d tokens is longer than max_seq_len %d", (int)n_prompt, (int)ctx->params.max_seq_len);
    const fg_compression_params *cp = compression ? compression : &ctx->params.compression;
    fg_status st = fg_compression_params_validate(cp);
    if (st)
        return fg_error(ctx, st, "%s", fg_last_error(NULL));
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
        ok = h->page_ids && h->pages;
        if (!ok)
            break;
        int32_t *ids = h->page_ids;
        void **pages = h->pages;
        *h = *ph; /* policy, recoveries, counts; a page table of its own */
        h->page_ids = ids;
        h->pages = pages;
        h->n_pages = 0;
        h->cap_pages = n;
        if (ph->n_pages > 0) { /* a head not prefilled yet has no page table */
            memcpy(h->page_ids, ph->page_ids, (size_t)ph->n_pages * sizeof *h->page_ids);
            memcpy(h->pages, ph->pages, (size_t)ph->n_pages * sizeof *h->pages);
        }
        for (int32_t p = 0; p < ph->n_pages; p++)
            fg_pool_ref(&ctx->pool, ph->page_ids[p]);
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

fg_status fg_seq_fork(fg_context *ctx, int32_t parent, int32_t *child_out) {
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
        ctx->seqs[id].parent = parent;
        ctx->seqs[id].fork_len = s->length[0];
        *child_out = id;
    }
    return st;
}

fg_status fg_seq_destroy(fg_context *ctx, int32_t seq) {
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
    fg_pool_trim(&ctx->pool);
    return FG_OK;
}

fg_status fg_seq_length(const fg_context *ctx, int32_t seq, int32_t layer, int32_t *length) {
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

int32_t fg_pages_for(const fg_context *ctx, int32_t rows) {
    return (rows + ctx->layout.page_tokens - 1) / ctx->layout.page_tokens;
}

/* Grows a head to n_pages pages. On failure the head keeps what it had. */
fg_status fg_head_reserve(fg_context *ctx, fg_head *h, int32_t n_pages) {
    if (n_pages > h->cap_pages) {
        int32_t cap = h->cap_pages ? h->cap_pages : 4;
        while (cap < n_pages)
            cap *= 2;
        int32_t *ids = realloc(h->page_ids, (size_t)cap * sizeof *ids);
        if (ids)
            h->page_ids = ids;
        void **pages = ids ? realloc(h->pages, (size_t)cap * sizeof *pages) : NULL;
        if (pages)
            h->pages = pages;
        FG_CHECK(ids && pages, ctx, FG_ERR_OUT_OF_MEMORY, "out of host memory for a page table");
        h->cap_pages = cap;
    }
    while (h->n_pages < n_pages) {
        fg_status st = fg_pool_alloc(&ctx->pool, &h->page_ids[h->n_pages], &h->pages[h->n_pages]);
        if (st)
            return st;
        h->n_pages++;
    }
    return FG_OK;
}

void fg_head_shrink(fg_context *ctx, fg_head *h, int32_t n_pages) {
    while (h->n_pages > n_pages)
        fg_pool_free(&ctx->pool, h->page_ids[--h->n_pages]);
}

/* Copy-on-write: replaces the shared pages [first, last) of a head by copies
 * of its own before a step writes them, recording each in ctx->cow. */
fg_status fg_head_unshare(fg_context *ctx, fg_head *h, int32_t first, int32_t last) {
    for (int32_t p = first; p < last && p < h->n_pages; p++) {
        if (!fg_pool_shared(&ctx->pool, h->page_ids[p]))
            continue;
        if (ctx->n_cow == ctx->cap_cow) {
            int32_t cap = ctx->cap_cow ? 2 * ctx->cap_cow : 64;
            fg_cow_entry *c = realloc(ctx->cow, (size_t)cap * sizeof *c);
            FG_CHECK(c, ctx, FG_ERR_OUT_OF_MEMORY, "out of host memory copying shared pages");
            ctx->cow = c;
            ctx->cap_cow = cap;
        }
        int32_t id;
        void *addr;
        fg_status st = fg_pool_alloc(&ctx->pool, &id, &addr);
        if (st == FG_OK && (st = fg_backend_copy(&ctx->be, addr, h->pages[p], ctx->layout.page_bytes)) != FG_OK)
            fg_pool_free(&ctx->pool, id);
        if (st)
            return st;
        ctx->cow[ctx->n_cow++] = (fg_cow_entry){h, p, h->page_ids[p], h->pages[p]};
        fg_pool_free(&ctx->pool, h->page_ids[p]); /* one owner less: the others keep it */
        h->page_ids[p] = id;
        h->pages[p] = addr;
    }
    return FG_OK;
}

/* Undoes the copies of a failed step: the heads share their old pages again. */
void fg_pages_reshare(fg_context *ctx) {
    while (ctx->n_cow > 0) {
        const fg_cow_entry *c = &ctx->cow[--ctx->n_cow];
        fg_pool_ref(&ctx->pool, c->old_id);
        fg_pool_free(&ctx->pool, c->head->page_ids[c->page]);
        c->head->page_ids[c->page] = c->old_id;
        c->head->pages[c->page] = c->old_addr;
    }
}

/* Gives back the pages a decode step reserved for its first n_heads heads
 * (head i * Hkv + g of the batch is KV head g of sequence seqs[i]). */
void fg_unreserve(fg_context *ctx, int32_t layer, const int32_t *seqs, int32_t n_heads) {
    const int32_t Hkv = ctx->params.n_kv_heads;
    for (int32_t r = 0; r < n_heads; r++) {
        fg_head *h = &ctx->seqs[seqs[r / Hkv]].heads[(size_t)layer * Hkv + r % Hkv];
        fg_head_shrink(ctx, h, h->n_pages - ctx->added_pages[r]);
    }
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

fg_status fg_backend_read_rows(fg_backend *be, const fg_page_layout *L, void *const *pages, int32_t n_slots,
                               float *k, float *v, int32_t *pos, uint8_t *flags, float *score) {
    fg_status st = be->ops->synchronize ? be->ops->synchronize(be) : FG_OK;
    if (st || n_slots <= 0)
        return st;
    unsigned char *page = be->ops->buffer_read ? malloc(L->page_bytes) : NULL;
    if (be->ops->buffer_read && !page)
        return be->err(be->err_sink, FG_ERR_OUT_OF_MEMORY, "out of host memory for a page of %zu bytes", L->page_bytes);
    const int32_t P = L->page_tokens, d = L->head_dim;
    const size_t row_bytes = L->row_bytes;
    for (int32_t p = 0; p * P < n_slots && st == FG_OK; p++) {
        const unsigned char *src = pages[p];
        if (page) {
            st = be->ops->buffer_read(be, page, src, L->page_bytes);
            src = page;
        }
        for (int32_t r = 0; r < P && p * P + r < n_slots && st == FG_OK; r++) {
            const size_t s = (size_t)p * P + r;
            for (int32_t c = 0; c < d; c++) {
                k[s * d + c] = fg_load_elem(src + L->k_offset + r * row_bytes, L->dtype, d, c);
                v[s * d + c] = fg_load_elem(src + L->v_offset + r * row_bytes, L->dtype, d, c);
            }
            if (pos)
                memcpy(&pos[s], src + L->pos_offset + r * sizeof(int32_t), sizeof(int32_t));
            if (score)
                memcpy(&score[s], src + L->score_offset + r * sizeof(float), sizeof(float));
            if (flags)
                flags[s] = src[L->flags_offset + r];
        }
    }
    free(page);
    return st;
}
