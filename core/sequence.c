/* Sequences (create, clone, fork, destroy) and their pages: reservation,
 * copy-on-write unsharing, re-sharing. */
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

static fg_status seq_create(fg_context *ctx, const fg_compression_params *compression, const int32_t *prompt,
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
    FG_CHECK(cp->allocation != FG_ALLOC_ADAPTIVE || cp->defer_until <= ctx->params.max_seq_len, ctx,
             FG_ERR_INVALID_ARGUMENT, "defer_until %d is beyond max_seq_len %d: the sequence could never be compressed",
             (int)cp->defer_until, (int)ctx->params.max_seq_len);
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

fg_status fg_seq_create(fg_context *ctx, const fg_compression_params *compression, const int32_t *prompt,
                        int32_t n_prompt, int32_t *seq_out) {
    FG_CLAIM(ctx, "fg_seq_create");
    return fg_release(ctx, seq_create(ctx, compression, prompt, n_prompt, seq_out));
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

int32_t fg_pages_for(const fg_context *ctx, int32_t rows) {
    return (rows + ctx->layout.page_tokens - 1) / ctx->layout.page_tokens;
}

/* Grows a page table to cap entries (it stays as it was on failure). */
static int grow_table(int32_t **ids, void ***addrs, int32_t cap) {
    int32_t *i = realloc(*ids, (size_t)cap * sizeof *i);
    if (i)
        *ids = i;
    void **a = i ? realloc(*addrs, (size_t)cap * sizeof *a) : NULL;
    if (a)
        *addrs = a;
    return i && a;
}

/* Grows a head to n_pages pages. On failure the head keeps what it had. */
fg_status fg_head_reserve(fg_context *ctx, fg_head *h, int32_t n_pages) {
    if (n_pages > h->cap_pages) {
        int32_t cap = h->cap_pages ? h->cap_pages : 4;
        while (cap < n_pages)
            cap *= 2;
        FG_CHECK(grow_table(&h->page_ids, &h->pages, cap) && grow_table(&h->meta_ids, &h->meta, cap), ctx,
                 FG_ERR_OUT_OF_MEMORY, "out of host memory for a page table");
        h->cap_pages = cap;
    }
    while (h->n_pages < n_pages) {
        const int32_t p = h->n_pages;
        fg_status st = fg_pool_alloc(&ctx->pool, &h->page_ids[p], &h->pages[p]);
        if (st)
            return st;
        if ((st = fg_pool_alloc(&ctx->meta_pool, &h->meta_ids[p], &h->meta[p])) != FG_OK) {
            fg_pool_free(&ctx->pool, h->page_ids[p]);
            return st;
        }
        h->n_pages++;
    }
    return FG_OK;
}

void fg_head_shrink(fg_context *ctx, fg_head *h, int32_t n_pages) {
    while (h->n_pages > n_pages) {
        --h->n_pages;
        fg_pool_free(&ctx->pool, h->page_ids[h->n_pages]);
        fg_pool_free(&ctx->meta_pool, h->meta_ids[h->n_pages]);
    }
}

void fg_head_free(fg_context *ctx, fg_head *h) {
    fg_head_shrink(ctx, h, 0);
    free(h->page_ids);
    free(h->pages);
    free(h->meta_ids);
    free(h->meta);
    h->page_ids = h->meta_ids = NULL;
    h->pages = h->meta = NULL;
    h->cap_pages = 0;
}

void fg_head_compacted(fg_head *h) {
    h->priv_from = 0;
    h->rows_bound = h->row_base = h->n_slots;
    h->in_order = 1;
}

void fg_head_share(fg_context *ctx, fg_head *h, int copy) {
    if (h->n_pages == 0)
        return; /* nothing to share: its first rows will be its own */
    if (copy) { /* its new rows go to pages of its own, past every shared one */
        h->priv_from = h->rows_bound = h->row_base = h->n_pages * ctx->layout.page_tokens;
        h->in_order = h->in_order && h->priv_from == h->n_slots;
        return;
    }
    /* the source: rows from the high water mark on, which no copy uses (slot
       s in row s: from n_slots, with nothing lost; else the rows it no longer
       keeps in pages it owned stay dead) */
    h->priv_from = h->rows_bound = h->row_base = h->in_order ? h->n_slots : h->rows_bound;
}

/* fg_head_tidy for one head: 1 when it gathered its rows (it gave up its
 * share of every page it shared). */
static int tidy_one(fg_context *ctx, fg_head *h) {
    if (h->priv_from == 0 || h->n_pages == 0)
        return 0; /* slot s in row s already */
    /* the head's share of its pages (a page of r owners counts 1 / r), in
       row pages and in bytes of both kinds, against what it would hold alone:
       summed over the heads that share them, a family of forks then never
       holds more than its members would apart */
    const fg_page_layout *L = &ctx->layout;
    double rows = 0.0, meta = 0.0;
    int shared = 0;
    for (int32_t p = 0; p < h->n_pages; p++) {
        const int32_t r = fg_pool_refs(&ctx->pool, h->page_ids[p]), m = fg_pool_refs(&ctx->meta_pool, h->meta_ids[p]);
        shared |= r > 1 || m > 1;
        rows += 1.0 / r;
        meta += 1.0 / m;
    }
    if (!shared && h->in_order) { /* its rows are in order: only the bookkeeping changes */
        h->priv_from = 0;
        return 0;
    }
    const double alone = fg_pages_for(ctx, h->n_slots), eps = 1e-9; /* sums of 1 / r */
    const int pays = rows <= alone + eps && rows * (double)L->page_bytes + meta * (double)L->meta_bytes <=
                                                (alone + eps) * (double)(L->page_bytes + L->meta_bytes);
    if (shared && pays)
        return 0;
    /* best effort: a head that cannot gather its rows now keeps its shared pages (the bytes stay counted),
       and the call this tidy belongs to still succeeds, its messages as they were */
    fg_error_saved saved;
    fg_error_save(ctx, &saved);
    if (fg_head_repack(ctx, h) != FG_OK) {
        fg_error_restore(ctx, &saved, "gathering a head's rows into pages of its own");
        return 0;
    }
    return shared;
}

void fg_head_tidy(fg_context *ctx, fg_seq *s, size_t i) {
    if (!tidy_one(ctx, &s->heads[i]))
        return;
    /* the pages it gave up cost their other owners more: the same head of
       every other sequence (forks share no other), until none gathers */
    for (int again = 1; again;) {
        again = 0;
        for (int32_t j = 0; j < ctx->params.max_seqs; j++)
            if (ctx->seqs[j].in_use && &ctx->seqs[j] != s && ctx->seqs[j].heads)
                again |= tidy_one(ctx, &ctx->seqs[j].heads[i]);
    }
}

fg_status fg_head_repack(fg_context *ctx, fg_head *h) {
    const fg_page_layout *L = &ctx->layout;
    const int32_t P = L->page_tokens, n = h->n_slots, n_old = h->n_pages;
    fg_backend *be = &ctx->be;
    fg_status st = be->ops->synchronize ? be->ops->synchronize(be) : FG_OK; /* the steps that wrote it are done */
    if (st)
        return st;
    fg_head f = {0};
    if ((st = fg_head_reserve(ctx, &f, fg_pages_for(ctx, n)))) {
        fg_head_free(ctx, &f);
        return st;
    }
    /* the old metadata on the host, rewritten for the new pages: slot s in row s */
    unsigned char *old = malloc((size_t)(n_old > 0 ? n_old : 1) * L->meta_bytes);
    unsigned char *fresh = calloc((size_t)(f.n_pages > 0 ? f.n_pages : 1), L->meta_bytes);
    void **old_meta = malloc((size_t)(n_old > 0 ? n_old : 1) * sizeof *old_meta);
    void **new_meta = malloc((size_t)(f.n_pages > 0 ? f.n_pages : 1) * sizeof *new_meta);
    if (!old || !fresh || !old_meta || !new_meta)
        st = fg_error(ctx, FG_ERR_OUT_OF_MEMORY, "out of host memory gathering a head's %d rows", (int)n);
    for (int32_t p = 0; p < n_old && st == FG_OK; p++) {
        old_meta[p] = old + (size_t)p * L->meta_bytes;
        st = fg_backend_read(be, old_meta[p], h->meta[p], L->meta_bytes);
    }
    for (int32_t p = 0; p < f.n_pages && st == FG_OK; p++)
        new_meta[p] = fresh + (size_t)p * L->meta_bytes;
    /* K and V of each run of slots whose rows follow each other in one old
       page and one new page: one copy of both (V lies v_offset after K) */
    for (int32_t s = 0; s < n && st == FG_OK;) {
        const int32_t r = *fg_slot_row(L, old_meta, s);
        if (r < 0 || r >= n_old * P) {
            st = fg_error(ctx, FG_ERR_INTERNAL, "slot %d names row %d outside the head's %d rows", (int)s, (int)r,
                          (int)(n_old * P));
            break;
        }
        int32_t run = 1;
        while (s + run < n && (s + run) % P != 0 && (r + run) % P != 0 && *fg_slot_row(L, old_meta, s + run) == r + run)
            run++;
        st = fg_backend_copy2d(be, fg_row_k(L, f.pages, s), L->v_offset, fg_row_k(L, h->pages, r), L->v_offset,
                               (size_t)run * L->row_bytes, 2);
        for (int32_t j = s; j < s + run; j++) {
            *fg_slot_pos(L, new_meta, j) = *fg_slot_pos(L, old_meta, j);
            *fg_slot_score(L, new_meta, j) = *fg_slot_score(L, old_meta, j);
            *fg_slot_flags(L, new_meta, j) = *fg_slot_flags(L, old_meta, j);
            *fg_slot_row(L, new_meta, j) = j;
        }
        s += run;
    }
    for (int32_t p = 0; p < f.n_pages && st == FG_OK; p++)
        st = fg_backend_write(be, f.meta[p], new_meta[p], L->meta_bytes);
    if (st == FG_OK && be->ops->synchronize)
        st = be->ops->synchronize(be); /* copied before the old pages can be handed out again */
    free(old);
    free(fresh);
    free(old_meta);
    free(new_meta);
    if (st) {
        fg_head_free(ctx, &f);
        return st;
    }
    fg_head_shrink(ctx, h, 0); /* a fork keeps its share */
    free(h->page_ids);
    free(h->pages);
    free(h->meta_ids);
    free(h->meta);
    h->page_ids = f.page_ids;
    h->pages = f.pages;
    h->meta_ids = f.meta_ids;
    h->meta = f.meta;
    h->n_pages = f.n_pages;
    h->cap_pages = f.cap_pages;
    fg_head_compacted(h); /* its next step resets the rows' counters */
    return FG_OK;
}

/* Copy-on-write: replaces the shared meta pages [first, last) of a head by
 * copies of its own before a step writes them, recording each in ctx->cow. */
fg_status fg_head_unshare(fg_context *ctx, fg_head *h, int32_t first, int32_t last) {
    for (int32_t p = first; p < last && p < h->n_pages; p++) {
        if (!fg_pool_shared(&ctx->meta_pool, h->meta_ids[p]))
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
        fg_status st = fg_pool_alloc(&ctx->meta_pool, &id, &addr);
        if (st == FG_OK && (st = fg_backend_copy(&ctx->be, addr, h->meta[p], ctx->layout.meta_bytes)) != FG_OK)
            fg_pool_free(&ctx->meta_pool, id);
        if (st)
            return st;
        ctx->cow[ctx->n_cow++] = (fg_cow_entry){h, p, h->meta_ids[p], h->meta[p]};
        fg_pool_free(&ctx->meta_pool, h->meta_ids[p]); /* one owner less: the others keep it */
        h->meta_ids[p] = id;
        h->meta[p] = addr;
    }
    return FG_OK;
}

/* Undoes the copies of a failed step: the heads share their old pages again. */
void fg_pages_reshare(fg_context *ctx) {
    while (ctx->n_cow > 0) {
        const fg_cow_entry *c = &ctx->cow[--ctx->n_cow];
        fg_pool_ref(&ctx->meta_pool, c->old_id);
        fg_pool_free(&ctx->meta_pool, c->head->meta_ids[c->page]);
        c->head->meta_ids[c->page] = c->old_id;
        c->head->meta[c->page] = c->old_addr;
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

fg_status fg_backend_read_rows(fg_backend *be, const fg_page_layout *L, const fg_head *h, int32_t n_slots, float *k,
                               float *v, int32_t *pos, uint8_t *flags, float *score) {
    fg_status st = be->ops->synchronize ? be->ops->synchronize(be) : FG_OK;
    if (st || n_slots <= 0)
        return st;
    /* a host copy of every page (backends with their own memory), or the pages themselves */
    const int32_t P = L->page_tokens, d = L->head_dim, n_pages = h->n_pages;
    unsigned char *copy = NULL;
    void **rows = h->pages, **meta = h->meta;
    if (be->ops->buffer_read) {
        const size_t bytes = (size_t)n_pages * (L->page_bytes + L->meta_bytes + 2 * sizeof(void *));
        copy = malloc(bytes);
        if (!copy)
            return be->err(be->err_sink, FG_ERR_OUT_OF_MEMORY, "out of host memory for %zu bytes of pages", bytes);
        rows = (void **)(void *)copy;
        meta = rows + n_pages;
        unsigned char *at = copy + (size_t)n_pages * 2 * sizeof(void *);
        for (int32_t p = 0; p < n_pages && st == FG_OK; p++) {
            rows[p] = at;
            meta[p] = at + L->page_bytes;
            at += L->page_bytes + L->meta_bytes;
            st = be->ops->buffer_read(be, rows[p], h->pages[p], L->page_bytes);
            if (st == FG_OK)
                st = be->ops->buffer_read(be, meta[p], h->meta[p], L->meta_bytes);
        }
    }
    for (int32_t s = 0; s < n_slots && st == FG_OK; s++) {
        const int32_t r = *fg_slot_row(L, meta, s);
        if (r < 0 || r >= n_pages * P) {
            st = be->err(be->err_sink, FG_ERR_INTERNAL, "slot %d names row %d outside the head's %d rows", (int)s,
                         (int)r, (int)(n_pages * P));
            break;
        }
        for (int32_t c = 0; c < d; c++) {
            k[(size_t)s * d + c] = fg_load_elem(fg_row_k(L, rows, r), L->dtype, d, c);
            v[(size_t)s * d + c] = fg_load_elem(fg_row_v(L, rows, r), L->dtype, d, c);
        }
        if (pos)
            pos[s] = *fg_slot_pos(L, meta, s);
        if (score)
            score[s] = *fg_slot_score(L, meta, s);
        if (flags)
            flags[s] = *fg_slot_flags(L, meta, s);
    }
    free(copy);
    return st;
}
