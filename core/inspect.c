/* Inspection: a head's policy and kept positions, memory accounting, trim. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"

static size_t kv_row_bytes(const fg_context *ctx) {
    return ctx->layout.k_row_bytes + ctx->layout.v_row_bytes;
}

static fg_status head_inspect(const fg_context *ctx, int32_t seq, int32_t layer, int32_t kv_head,
                              fg_head_info *out, size_t size) {
    fg_seq *s = NULL;
    fg_head *h = NULL;
    fg_status st = fg_get_head(ctx, seq, layer, kv_head, &s, &h);
    if (st)
        return st;
    FG_CHECK(out, (fg_context *)ctx, FG_ERR_INVALID_ARGUMENT, "fg_head_inspect: info must not be NULL");
    fg_head_info whole, *info = &whole;
    memset(info, 0, sizeof *info);
    info->policy_index = h->policy_index;
    info->components = h->components;
    info->policy = h->pol;
    info->n_policies = s->cp.n_policies;
    memcpy(info->recovery, h->recovery, sizeof info->recovery);
    info->length = s->length[layer];
    info->kept = h->n_slots;
    size_t page_kv = (size_t)ctx->layout.page_tokens * kv_row_bytes(ctx);
    info->kv_bytes_held = (size_t)h->n_pages * page_kv;
    info->kv_bytes_full = (size_t)fg_pages_for(ctx, info->length) * page_kv;
    for (int32_t p = 0; p < h->n_pages; p++)
        info->kv_bytes_shared += fg_pool_shared(&ctx->pool, h->page_ids[p]) ? page_kv : 0;
    st = fg_struct_write(out, size, info, sizeof *info, FG_HEAD_INFO_OLDEST, "fg_head_info");
    return st ? fg_error((fg_context *)ctx, st, "fg_head_inspect: %s", fg_last_error(NULL)) : FG_OK;
}

fg_status fg_head_inspect_sized(const fg_context *ctx, int32_t seq, int32_t layer, int32_t kv_head, fg_head_info *info,
                                size_t size) {
    FG_CLAIM(ctx, "fg_head_inspect");
    return fg_release(ctx, head_inspect(ctx, seq, layer, kv_head, info, size));
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static fg_status head_positions(fg_context *ctx, int32_t seq, int32_t layer, int32_t kv_head, int32_t *positions,
                            int32_t capacity, int32_t *n_out) {
    fg_seq *s = NULL;
    fg_head *h = NULL;
    fg_status st = fg_get_head(ctx, seq, layer, kv_head, &s, &h);
    if (st)
        return st;
    FG_CHECK(n_out, ctx, FG_ERR_INVALID_ARGUMENT, "fg_head_positions: n_out must not be NULL");
    *n_out = h->n_slots;
    FG_CHECK(positions || h->n_slots == 0, ctx, FG_ERR_INVALID_ARGUMENT, "fg_head_positions: positions is NULL");
    FG_CHECK(capacity >= h->n_slots, ctx, FG_ERR_CAPACITY, "fg_head_positions: capacity %d < %d kept rows",
             (int)capacity, (int)h->n_slots);
    st = fg_backend_read_slots(&ctx->be, &ctx->layout, h->meta, h->n_slots, positions, NULL, NULL);
    if (st)
        return st;
    qsort(positions, (size_t)h->n_slots, sizeof *positions, cmp_i32);
    return FG_OK;
}

fg_status fg_head_positions(fg_context *ctx, int32_t seq, int32_t layer, int32_t kv_head, int32_t *positions,
                            int32_t capacity, int32_t *n_out) {
    FG_CLAIM(ctx, "fg_head_positions");
    return fg_release(ctx, head_positions(ctx, seq, layer, kv_head, positions, capacity, n_out));
}

static void add_seq_memory(const fg_context *ctx, const fg_seq *s, fg_memory_stats *m) {
    const int32_t Hkv = ctx->params.n_kv_heads;
    const size_t page_kv = (size_t)ctx->layout.page_tokens * kv_row_bytes(ctx);
    const size_t page_meta = ctx->layout.meta_bytes;
    for (int32_t l = 0; l < ctx->params.n_layers; l++) {
        if (!s->length[l])
            continue;
        for (int32_t g = 0; g < Hkv; g++) {
            const fg_head *h = &s->heads[(size_t)l * Hkv + g];
            m->kv_bytes_held += (size_t)h->n_pages * page_kv;
            m->meta_bytes_held += (size_t)h->n_pages * page_meta;
            m->kv_bytes_full += (size_t)fg_pages_for(ctx, s->length[l]) * page_kv;
            m->kv_bytes_alone += (size_t)fg_pages_for(ctx, h->n_slots) * page_kv;
            m->rows_kept += h->n_slots;
            m->rows_full += s->length[l];
        }
    }
}

/* Pages that full caches of the live sequences would share through their
 * forks: the whole pages of each fork's prefix that its parent holds too. */
static int64_t shared_full_pages(const fg_context *ctx) {
    int64_t shared = 0;
    for (int32_t i = 0; i < ctx->params.max_seqs; i++) {
        const fg_seq *c = &ctx->seqs[i];
        if (!c->in_use || c->parent < 0 || c->parent == i || !ctx->seqs[c->parent].in_use)
            continue;
        const fg_seq *p = &ctx->seqs[c->parent];
        for (int32_t l = 0; l < ctx->params.n_layers; l++) {
            int32_t n = c->fork_len < c->length[l] ? c->fork_len : c->length[l];
            n = n < p->length[l] ? n : p->length[l];
            shared += (int64_t)(n / ctx->layout.page_tokens) * ctx->params.n_kv_heads;
        }
    }
    return shared;
}

static fg_status memory(const fg_context *ctx, int32_t seq, fg_memory_stats *stats, size_t size) {
    FG_CHECK(ctx, NULL, FG_ERR_INVALID_ARGUMENT, "fg_memory: context must not be NULL");
    FG_CHECK(stats, (fg_context *)ctx, FG_ERR_INVALID_ARGUMENT, "fg_memory: stats must not be NULL");
    fg_memory_stats m = {0};
    if (seq >= 0) {
        fg_seq *s = NULL;
        fg_status st = fg_get_seq(ctx, seq, &s);
        if (st)
            return st;
        add_seq_memory(ctx, s, &m);
    } else {
        for (int32_t i = 0; i < ctx->params.max_seqs; i++)
            if (ctx->seqs[i].in_use)
                add_seq_memory(ctx, &ctx->seqs[i], &m);
    }
    if (seq < 0) { /* pages shared by forks count once, in what is held and in the full cache alike */
        const size_t page_kv = (size_t)ctx->layout.page_tokens * kv_row_bytes(ctx);
        m.kv_bytes_held = (size_t)ctx->pool.in_use * page_kv;
        m.meta_bytes_held = (size_t)ctx->meta_pool.in_use * ctx->layout.meta_bytes;
        m.kv_bytes_full -= (size_t)shared_full_pages(ctx) * page_kv;
    }
    m.pool_bytes = fg_pool_bytes(&ctx->pool) + fg_pool_bytes(&ctx->meta_pool);
    m.pages_in_use = ctx->pool.in_use; /* row pages (each has a meta page) */
    m.pages_free = fg_pool_pages_total(&ctx->pool) - ctx->pool.in_use;
    fg_status st = fg_struct_write(stats, size, &m, sizeof m, FG_MEMORY_STATS_OLDEST, "fg_memory_stats");
    return st ? fg_error((fg_context *)ctx, st, "fg_memory: %s", fg_last_error(NULL)) : FG_OK;
}

fg_status fg_memory_sized(const fg_context *ctx, int32_t seq, fg_memory_stats *stats, size_t size) {
    FG_CLAIM(ctx, "fg_memory");
    return fg_release(ctx, memory(ctx, seq, stats, size));
}

static fg_status trim(fg_context *ctx) {
    FG_CHECK(ctx, NULL, FG_ERR_INVALID_ARGUMENT, "fg_trim: context must not be NULL");
    fg_pool_trim(&ctx->pool);
    fg_pool_trim(&ctx->meta_pool);
    fg_act_release(ctx);
    return FG_OK;
}

fg_status fg_trim(fg_context *ctx) {
    FG_CLAIM(ctx, "fg_trim");
    return fg_release(ctx, trim(ctx));
}
