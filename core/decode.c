/* Decode: one step of a batch of sequences at one layer (docs/design.md
 * §2.5). A call reads in one direction, phase by phase:
 *   check    every sequence and its new token, each token classified;
 *            nothing changes until all pass
 *   plan     the adaptive sequences that are due compressed first
 *            (adaptive.c), then each head's step mirrored on the host and
 *            given its pages (head.c: fg_head_plan_step), and where the
 *            backend keeps page tables, room for the head's (the step
 *            writes the entries that changed since the last)
 *   execute  the backend's decode_step op, then the rows that adaptive
 *            sequences still observe
 *   commit   each head's counts (head.c: fg_head_commit_step), the token,
 *            the length; then the heads tidied
 * A failure in plan or execute puts everything back: the pages reserved,
 * the copies made for the step, the compressions. */
#include <stdlib.h>

#include "common/rules.h"
#include "core/internal.h"

static fg_status reserve_scratch(fg_context *ctx, int32_t n_heads, int32_t n_seqs) {
    if (n_heads <= ctx->scratch_heads)
        return FG_OK;
    fg_decode_head *dh = realloc(ctx->dheads, (size_t)n_heads * sizeof *dh);
    if (dh)
        ctx->dheads = dh;
    fg_step_plan *pl = realloc(ctx->plans, (size_t)n_heads * sizeof *pl);
    if (pl)
        ctx->plans = pl;
    int32_t *added = realloc(ctx->added_pages, (size_t)n_heads * sizeof *added);
    if (added)
        ctx->added_pages = added;
    uint8_t *nc = realloc(ctx->new_cls, (size_t)n_heads); /* n_seqs <= n_heads */
    if (nc)
        ctx->new_cls = nc;
    FG_CHECK(dh && pl && added && nc, ctx, FG_ERR_OUT_OF_MEMORY, "out of host memory for a decode batch of %d",
             (int)n_seqs);
    ctx->scratch_heads = n_heads;
    return FG_OK;
}

/* check: the batch, each sequence at this layer, each token, whose class
 * goes to ctx->new_cls[i]. */
static fg_status check(fg_context *ctx, int32_t layer, int32_t n_seqs, const int32_t *seqs, const int32_t *tokens) {
    for (int32_t i = 0; i < n_seqs; i++) {
        fg_seq *s = NULL;
        fg_status st = fg_get_seq(ctx, seqs[i], &s);
        if (st)
            return st;
        for (int32_t j = 0; j < i; j++)
            FG_CHECK(seqs[j] != seqs[i], ctx, FG_ERR_INVALID_ARGUMENT, "sequence %d appears twice in the batch",
                     (int)seqs[i]);
        const int32_t p = s->length[layer];
        FG_CHECK(p > 0, ctx, FG_ERR_BAD_STATE, "sequence %d: decode before prefill at layer %d", (int)seqs[i],
                 (int)layer);
        FG_CHECK(!fg_alloc_mode_of(&s->cp)->whole_prompt_first || fg_all_prefilled(ctx, s), ctx, FG_ERR_BAD_STATE,
                 "sequence %d: an adaptive sequence shares its budget over every layer, so every layer is prefilled "
                 "before its first decode step", (int)seqs[i]);
        FG_CHECK(p < ctx->params.max_seq_len, ctx, FG_ERR_CAPACITY,
                 "sequence %d is full: %d tokens, max_seq_len %d", (int)seqs[i], (int)p, (int)ctx->params.max_seq_len);
        st = fg_check_token(ctx, s, seqs[i], p, tokens[i]);
        if (st)
            return st;
        if (p < s->n_tokens) {
            ctx->new_cls[i] = s->cls[p];
        } else {
            FG_CHECK(p == s->n_tokens, ctx, FG_ERR_BAD_STATE,
                     "sequence %d: layer %d is at position %d but the sequence has %d tokens", (int)seqs[i], (int)layer,
                     (int)p, (int)s->n_tokens);
            ctx->new_cls[i] = fg_token_classes_next(ctx->classes, s->tokens, p, tokens[i], s->cp.n_sink);
        }
    }
    return FG_OK;
}

/* plan: every head's step mirrored and its pages reserved, its arguments
 * to the op in ctx->dheads (head i * Hkv + g: KV head g of seqs[i]). On
 * failure nothing is left reserved or copied. */
static fg_status plan(fg_context *ctx, int32_t layer, int32_t n_seqs, const int32_t *seqs, const float *q,
                      const float *k, const float *v, float *out) {
    const int32_t Hq = ctx->params.n_q_heads, Hkv = ctx->params.n_kv_heads, d = ctx->params.head_dim;
    const int32_t G = Hq / Hkv;
    for (int32_t i = 0; i < n_seqs; i++) {
        fg_seq *s = &ctx->seqs[seqs[i]];
        const int32_t p = s->length[layer];
        const int layer_ranks = fg_alloc_mode_of(&s->cp)->layer_ranks; /* the group marks below */
        for (int32_t g = 0; g < Hkv; g++) {
            const int32_t hi = i * Hkv + g;
            fg_head *h = &s->heads[(size_t)layer * Hkv + g];
            fg_step_plan *pl = &ctx->plans[hi];
            fg_status st = fg_head_plan_step(ctx, h, p, s->cls, ctx->new_cls[i], pl, &ctx->added_pages[hi]);
            if (st == FG_OK)
                st = fg_head_tab_ready(ctx, h); /* a backend that keeps the tables: room for them */
            if (st) {
                fg_unreserve(ctx, layer, seqs, hi + 1);
                fg_pages_reshare(ctx);
                return st;
            }
            ctx->dheads[hi] = (fg_decode_head){
                .pages = h->pages,
                .meta = h->meta,
                .n_pages = h->n_pages,
                .priv_from = h->priv_from,
                .row_base = h->n_pages > 0 ? h->row_base : -1,
                .n_slots = h->n_slots,
                .n_slots_after = pl->n_slots,
                .components = h->components,
                .score_mode = s->cp.score_mode,
                .pos = p,
                .insert_flag = pl->insert_flag,
                .window_start = pl->window_start,
                .freq_budget = pl->freq_budget,
                .q = q + ((size_t)i * Hq + (size_t)g * G) * d,
                .k = k + ((size_t)i * Hkv + g) * d,
                .v = v + ((size_t)i * Hkv + g) * d,
                .out = out + ((size_t)i * Hq + (size_t)g * G) * d,
                .tab = h->tab,
                .tab_cap = h->tab_cap,
                .tab_valid = h->tab_valid,
                .share_first = i * Hkv,
                /* heads that rank together: only where there are scores to share */
                .share_n = layer_ranks && fg_tracks_scores(h->components) ? Hkv : 0,
            };
        }
    }
    return FG_OK;
}

/* execute: the op over every planned head, then the rows the adaptive
 * sequences observe. On failure the step's pages go back. Backends fail
 * before they touch a cache (workspace, staging); a device that fails in
 * the middle of its kernels reports FG_ERR_BACKEND, and that batch's caches
 * are undefined. */
static fg_status execute(fg_context *ctx, int32_t layer, int32_t n_seqs, const int32_t *seqs, const float *q) {
    const int32_t Hq = ctx->params.n_q_heads, Hkv = ctx->params.n_kv_heads, d = ctx->params.head_dim;
    fg_status st = ctx->be.ops->decode_step(&ctx->be, &ctx->layout, &ctx->shape, n_seqs * Hkv, ctx->dheads);
    for (int32_t i = 0; i < n_seqs && st == FG_OK; i++) {
        fg_seq *s = &ctx->seqs[seqs[i]];
        const int32_t p = s->length[layer];
        const fg_alloc_mode *mode = fg_alloc_mode_of(&s->cp);
        if (mode->step_observe)
            st = mode->step_observe(ctx, s, layer, p, q + (size_t)i * Hq * d);
    }
    if (st) {
        fg_unreserve(ctx, layer, seqs, n_seqs * Hkv);
        fg_pages_reshare(ctx);
    }
    return st;
}

/* commit: the counts the plan mirrored, the token, the length; then each
 * head tidied (fg_head_tidy), and a head that shares nothing gives back the
 * pages past its kept rows. */
static void commit(fg_context *ctx, int32_t layer, int32_t n_seqs, const int32_t *seqs, const int32_t *tokens) {
    const int32_t Hkv = ctx->params.n_kv_heads, P = ctx->layout.page_tokens;
    ctx->n_cow = 0; /* the copies stay */
    for (int32_t i = 0; i < n_seqs; i++) {
        fg_seq *s = &ctx->seqs[seqs[i]];
        const int32_t p = s->length[layer];
        for (int32_t g = 0; g < Hkv; g++) {
            fg_head *h = &s->heads[(size_t)layer * Hkv + g];
            fg_head_commit_step(h, &ctx->plans[i * Hkv + g]);
            if (h->tab)
                h->tab_valid = h->n_pages; /* the step wrote the rest */
        }
        if (p == s->n_tokens) {
            s->tokens[p] = tokens[i];
            s->cls[p] = ctx->new_cls[i];
            s->n_tokens++;
        }
        s->length[layer] = p + 1;
    }
    for (int32_t i = 0; i < n_seqs; i++)
        for (int32_t g = 0; g < Hkv; g++)
            fg_head_tidy(ctx, &ctx->seqs[seqs[i]], (size_t)layer * Hkv + g);
    for (int32_t i = 0; i < n_seqs; i++)
        for (int32_t g = 0; g < Hkv; g++) {
            fg_head *h = &ctx->seqs[seqs[i]].heads[(size_t)layer * Hkv + g];
            if (h->priv_from == 0 && h->n_pages > (h->n_slots + P - 1) / P) {
                fg_head_shrink(ctx, h, (h->n_slots + P - 1) / P);
                h->rows_bound = h->row_base = h->n_slots;
            }
        }
}

fg_status fg_decode_f32(fg_context *ctx, int32_t layer, int32_t n_seqs, const int32_t *seqs, const int32_t *tokens,
                        const float *q, const float *k, const float *v, float *out) {
    FG_CHECK(ctx, NULL, FG_ERR_INVALID_ARGUMENT, "fg_decode: context must not be NULL");
    FG_CHECK(seqs && tokens && q && k && v && out, ctx, FG_ERR_INVALID_ARGUMENT,
             "fg_decode: seqs, tokens, q, k, v and out must not be NULL");
    FG_CHECK(layer >= 0 && layer < ctx->params.n_layers, ctx, FG_ERR_INVALID_ARGUMENT, "layer %d outside [0, %d)",
             (int)layer, (int)ctx->params.n_layers);
    FG_CHECK(n_seqs > 0 && n_seqs <= ctx->params.max_seqs, ctx, FG_ERR_INVALID_ARGUMENT,
             "n_seqs must be in 1..%d (max_seqs), got %d", (int)ctx->params.max_seqs, (int)n_seqs);
    fg_status st = reserve_scratch(ctx, n_seqs * ctx->params.n_kv_heads, n_seqs);
    if (st == FG_OK)
        st = check(ctx, layer, n_seqs, seqs, tokens);
    if (st)
        return st;

    fg_adaptive_plan **compressed = NULL;
    st = fg_adaptive_step_begin(ctx, layer, n_seqs, seqs, &compressed);
    if (st)
        return st;
    st = plan(ctx, layer, n_seqs, seqs, q, k, v, out);
    if (st == FG_OK)
        st = execute(ctx, layer, n_seqs, seqs, q);
    fg_adaptive_step_end(ctx, n_seqs, seqs, compressed, st);
    if (st)
        return st;
    commit(ctx, layer, n_seqs, seqs, tokens);
    return FG_OK;
}

fg_status fg_decode(fg_context *ctx, int32_t layer, int32_t n_seqs, const int32_t *seqs, const int32_t *tokens,
                    const void *q, const void *k, const void *v, void *out) {
    FG_CLAIM(ctx, "fg_decode");
    fg_act_call c;
    fg_status st = fg_act_in(ctx, "fg_decode", fg_act_rows(ctx, -1, n_seqs, ctx->params.max_seqs), q, k, v, out,
                             &c);
    if (st == FG_OK)
        st = fg_act_out(ctx, &c, fg_decode_f32(ctx, layer, n_seqs, seqs, tokens, c.q, c.k, c.v, c.out));
    return fg_release(ctx, st);
}
