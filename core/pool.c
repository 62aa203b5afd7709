/* The page pool: pages of one size, allocated from the backend in chunks.
 * A page counts its owners (a fork shares its parent's pages); it goes back
 * on its chunk's free stack when the last owner frees it, and fg_pool_trim()
 * returns chunks with no page in use to the backend. Page ids are
 * chunk * chunk_pages + index and never move. Two pools may share one cap
 * (row and meta pages: max_pool_bytes). */
#include <stdlib.h>

#include "core/internal.h"

void fg_pool_init(fg_pool *pool, fg_backend *be, fg_context *ctx, size_t page_bytes, int32_t chunk_pages,
                  size_t max_bytes) {
    *pool = (fg_pool){.be = be, .ctx = ctx, .page_bytes = page_bytes, .chunk_pages = chunk_pages,
                      .max_bytes = max_bytes};
}

static void release_chunk(fg_pool *pool, int32_t c) {
    fg_pool_chunk *ch = &pool->chunks[c];
    if (ch->base) {
        pool->be->ops->buffer_free(pool->be, ch->base);
        pool->n_live--;
    }
    free(ch->free_stack);
    free(ch->refs);
    *ch = (fg_pool_chunk){0};
    if (c < pool->slot_hint)
        pool->slot_hint = c;
}

void fg_pool_release(fg_pool *pool) {
    for (int32_t i = 0; i < pool->n_chunks; i++)
        release_chunk(pool, i);
    free(pool->chunks);
    pool->chunks = NULL;
    pool->n_chunks = pool->cap_chunks = 0;
    pool->free_hint = pool->slot_hint = 0;
    pool->in_use = 0;
}

size_t fg_pool_bytes(const fg_pool *pool) {
    return (size_t)fg_pool_pages_total(pool) * pool->page_bytes;
}

int64_t fg_pool_pages_total(const fg_pool *pool) { return (int64_t)pool->n_live * pool->chunk_pages; }

/* A new chunk in the lowest released slot, or at the end. */
static fg_status grow(fg_pool *pool, int32_t *chunk_index) {
    size_t chunk_bytes = (size_t)pool->chunk_pages * pool->page_bytes;
    const size_t held = fg_pool_bytes(pool) + (pool->peer ? fg_pool_bytes(pool->peer) : 0);
    if (pool->max_bytes && held + chunk_bytes > pool->max_bytes)
        return fg_error(pool->ctx, FG_ERR_OUT_OF_MEMORY,
                        "page pool is at its cap of %zu bytes (max_pool_bytes); %zu more would be needed",
                        pool->max_bytes, chunk_bytes);
    int32_t c = pool->slot_hint;
    while (c < pool->n_chunks && pool->chunks[c].base)
        c++;
    pool->slot_hint = c;
    if (c == pool->n_chunks) {
        if (pool->n_chunks == pool->cap_chunks) {
            const int32_t cap = pool->cap_chunks ? 2 * pool->cap_chunks : 8;
            fg_pool_chunk *chunks = realloc(pool->chunks, (size_t)cap * sizeof *chunks);
            if (!chunks)
                return fg_error(pool->ctx, FG_ERR_OUT_OF_MEMORY, "out of host memory growing the page pool");
            pool->chunks = chunks;
            pool->cap_chunks = cap;
        }
        pool->chunks[pool->n_chunks++] = (fg_pool_chunk){0};
    }
    fg_pool_chunk *ch = &pool->chunks[c];
    ch->free_stack = malloc((size_t)pool->chunk_pages * sizeof(int32_t));
    ch->refs = calloc((size_t)pool->chunk_pages, sizeof(int32_t));
    if (!ch->free_stack || !ch->refs) {
        free(ch->free_stack);
        free(ch->refs);
        *ch = (fg_pool_chunk){0};
        return fg_error(pool->ctx, FG_ERR_OUT_OF_MEMORY, "out of host memory growing the page pool");
    }
    fg_status st = pool->be->ops->buffer_alloc(pool->be, chunk_bytes, &ch->base);
    if (st) {
        free(ch->free_stack);
        free(ch->refs);
        *ch = (fg_pool_chunk){0};
        return st;
    }
    /* pop order: page 0 first */
    for (int32_t i = 0; i < pool->chunk_pages; i++)
        ch->free_stack[i] = pool->chunk_pages - 1 - i;
    ch->n_free = pool->chunk_pages;
    pool->n_live++;
    pool->slot_hint = c + 1;
    *chunk_index = c;
    return FG_OK;
}

fg_status fg_pool_alloc(fg_pool *pool, int32_t *page_id, void **addr) {
    /* the lowest chunk with a free page, so that high chunks empty out and trim */
    int32_t c = pool->free_hint;
    while (c < pool->n_chunks && !(pool->chunks[c].base && pool->chunks[c].n_free > 0))
        c++;
    pool->free_hint = c;
    if (c == pool->n_chunks) {
        fg_status st = grow(pool, &c);
        if (st)
            return st;
    }
    fg_pool_chunk *ch = &pool->chunks[c];
    int32_t idx = ch->free_stack[--ch->n_free];
    ch->refs[idx] = 1;
    *page_id = c * pool->chunk_pages + idx;
    *addr = (unsigned char *)ch->base + (size_t)idx * pool->page_bytes;
    pool->in_use++;
    return FG_OK;
}

void fg_pool_free(fg_pool *pool, int32_t page_id) {
    fg_pool_chunk *ch = &pool->chunks[page_id / pool->chunk_pages];
    const int32_t idx = page_id % pool->chunk_pages;
    if (--ch->refs[idx] > 0)
        return;
    ch->free_stack[ch->n_free++] = idx;
    pool->in_use--;
    if (page_id / pool->chunk_pages < pool->free_hint)
        pool->free_hint = page_id / pool->chunk_pages;
}

void fg_pool_ref(fg_pool *pool, int32_t page_id) {
    pool->chunks[page_id / pool->chunk_pages].refs[page_id % pool->chunk_pages]++;
}

int fg_pool_shared(const fg_pool *pool, int32_t page_id) { return fg_pool_refs(pool, page_id) > 1; }

int32_t fg_pool_refs(const fg_pool *pool, int32_t page_id) {
    return pool->chunks[page_id / pool->chunk_pages].refs[page_id % pool->chunk_pages];
}

void fg_pool_trim(fg_pool *pool) {
    for (int32_t i = 0; i < pool->n_chunks; i++)
        if (pool->chunks[i].base && pool->chunks[i].n_free == pool->chunk_pages)
            release_chunk(pool, i);
}
