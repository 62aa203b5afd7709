/* A head's pages: reservation and release, sharing among forks (copy-on-write
 * of the meta pages, the tidy that keeps forks from holding more than apart,
 * the repack that gathers a head's rows), and reading them back to the host. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dtype.h"
#include "common/slots.h"
#include "core/internal.h"

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
    fg_head_tab_stale(h, n_pages); /* a page reserved there later is another */
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
    if (h->tab)
        ctx->be.ops->buffer_free(&ctx->be, h->tab); /* GPU backends: after the work queued on it */
    h->tab = NULL;
    h->tab_cap = h->tab_valid = 0;
}

fg_status fg_head_tab_ready(fg_context *ctx, fg_head *h) {
    if (!ctx->be.ops->device_tables || (h->tab && h->tab_cap >= h->cap_pages))
        return FG_OK;
    void *tab = NULL; /* room for as many pages as the host's tables, written whole by the next step */
    const fg_status st = ctx->be.ops->buffer_alloc(&ctx->be, 2 * (size_t)h->cap_pages * sizeof(void *), &tab);
    if (st)
        return st;
    if (h->tab)
        ctx->be.ops->buffer_free(&ctx->be, h->tab);
    h->tab = tab;
    h->tab_cap = h->cap_pages;
    h->tab_valid = 0;
    return FG_OK;
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
       page and one new page: one copy of both when their rows are as long
       (V then lies v_offset after K), else one each */
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
        const size_t kb = (size_t)run * L->k_row_bytes, vb = (size_t)run * L->v_row_bytes;
        st = fg_backend_copy2d(be, fg_row_k(L, f.pages, s), L->v_offset, fg_row_k(L, h->pages, r), L->v_offset, kb,
                               kb == vb ? 2 : 1);
        if (st == FG_OK && kb != vb)
            st = fg_backend_copy2d(be, fg_row_v(L, f.pages, s), vb, fg_row_v(L, h->pages, r), vb, vb, 1);
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
    h->tab_valid = 0; /* every page is another */
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
        fg_head_tab_stale(h, p);
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
        fg_head_tab_stale(c->head, c->page);
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

fg_status fg_head_read_rows(fg_backend *be, const fg_page_layout *L, const fg_head *h, int32_t n_slots, float *k,
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
            k[(size_t)s * d + c] = fg_load_elem(fg_row_k(L, rows, r), L->k_dtype, d, c);
            v[(size_t)s * d + c] = fg_load_elem(fg_row_v(L, rows, r), L->v_dtype, d, c);
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

fg_status fg_head_plan_step(fg_context *ctx, fg_head *h, int32_t p, const uint8_t *cls, uint8_t cls_new,
                            fg_step_plan *pl, int32_t *added_pages) {
    const int32_t P = ctx->layout.page_tokens;
    *pl = fg_plan_step(&h->pol, p + 1, cls, cls_new, h->n_slots, h->n_freq);
    /* meta pages shared with a fork are copied before the step writes them:
       every page where scores, the window or evictions may change a slot,
       else the one the new slot goes to and page 0 (the rows' counters).
       Row pages are never copied: the step writes rows at or above
       priv_from, which no other owner uses (common/slots.h, fg_head_share).
       A new row may be a fresh one: at most rows_bound + 1 of them. */
    const int rewrites = (h->components & (FG_KEEP_FREQUENT | FG_KEEP_LOCAL)) && !(h->components & FG_KEEP_FULL);
    const int writes = rewrites || pl->insert_flag || h->row_base >= 0;
    const int32_t before = h->n_pages;
    fg_status st = fg_head_unshare(ctx, h, 0, writes ? 1 : 0);
    if (st == FG_OK && writes)
        st = fg_head_unshare(ctx, h, rewrites ? 1 : h->n_slots / P, h->n_pages);
    const int32_t ins = pl->insert_flag ? 1 : 0;
    const int32_t rows = h->rows_bound + ins > h->n_slots + ins ? h->rows_bound + ins : h->n_slots + ins;
    if (st == FG_OK)
        st = fg_head_reserve(ctx, h, fg_pages_for(ctx, rows));
    *added_pages = h->n_pages - before;
    return st;
}

void fg_head_commit_step(fg_head *h, const fg_step_plan *pl) {
    const int32_t ins = pl->insert_flag ? 1 : 0, fresh_max = h->priv_from + h->n_slots + ins;
    if (h->n_pages > 0)
        h->row_base = -1; /* the step reset the counters */
    /* a fresh row is taken only when no row the head may write is free
       (rows [priv_from, hw) are kept or free: fg_head_share starts hw at
       priv_from): then hw <= priv_from + the slots before the step */
    if (ins && h->rows_bound < fresh_max)
        h->rows_bound++;
    /* an eviction below priv_from leaves its row dead, and the last slot's
       row where it was */
    if (h->priv_from > 0 && pl->n_slots < h->n_slots + ins)
        h->in_order = 0;
    h->n_slots = pl->n_slots;
    h->n_freq = pl->n_freq;
}
