/* Decode: one step of a batch of sequences at one layer (docs/design.md
 * §2.5), host bookkeeping mirrored, then the backend's decode_step op. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

fg_status fg_decode_f32(fg_context *ctx, int32_t layer, int32_t n_seqs, const int32_t *seqs, const int32_t *tokens,
                    const float *q, const float *k, const float *v, float *out) {
    FG_CHECK(ctx, NULL, FG_ERR_INVALID_ARGUMENT, "fg_decode: context must not be NULL");
    FG_CHECK(seqs && tokens && q && k && v && out, ctx, FG_ERR_INVALID_ARGUMENT,
             "fg_decode: seqs, tokens, q, k, v and out must not be NULL");
    FG_CHECK(layer >= 0 && layer < ctx->params.n_layers, ctx, FG_ERR_INVALID_ARGUMENT, "layer %d outside [0, %d)",
             (int)layer, (int)ctx->params.n_layers);
    FG_CHECK(n_seqs > 0 && n_seqs <= ctx->params.max_seqs, ctx, FG_ERR_INVALID_ARGUMENT,
             "n_seqs must be in 1..%d (max_seqs), got %d", (int)ctx->params.max_seqs, (int)n_seqs);
    const int32_t Hq = ctx->params.n_q_heads, Hkv = ctx->params.n_kv_heads, d = ctx->params.head_dim;
    const int32_t G = Hq / Hkv, P = ctx->layout.page_tokens;
    fg_status st = reserve_scratch(ctx, n_seqs * Hkv, n_seqs);
    if (st)
        return st;

    /* 1. validate every sequence and classify its new token (nothing changes yet) */
    for (int32_t i = 0; i < n_seqs; i++) {
        fg_seq *s = NULL;
        st = fg_get_seq(ctx, seqs[i], &s);
        if (st)
            return st;
        for (int32_t j = 0; j < i; j++)
            FG_CHECK(seqs[j] != seqs[i], ctx, FG_ERR_INVALID_ARGUMENT, "sequence %d appears twice in the batch",
                     (int)seqs[i]);
        const int32_t p = s->length[layer];
        FG_CHECK(p > 0, ctx, FG_ERR_BAD_STATE, "sequence %d: decode before prefill at layer %d", (int)seqs[i],
                 (int)layer);
        FG_CHECK(!s->ad || fg_all_prefilled(ctx, s), ctx, FG_ERR_BAD_STATE,
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

    /* 1b. adaptive sequences that reach defer_until: compressed before this step (all or nothing) */
    fg_adaptive_plan **plans = NULL;
    for (int32_t i = 0; i < n_seqs; i++) {
        fg_seq *s = &ctx->seqs[seqs[i]];
        if (!s->ad || s->ad->compress_at == s->n_prompt || s->length[layer] != s->ad->compress_at)
            continue;
        int ready = 1;
        for (int32_t l = 0; l < ctx->params.n_layers; l++)
            ready &= s->length[l] == s->ad->compress_at;
        if (!ready)
            continue;
        if (!plans && !(plans = calloc((size_t)n_seqs, sizeof *plans)))
            return fg_error(ctx, FG_ERR_OUT_OF_MEMORY, "out of host memory for a decode batch of %d", (int)n_seqs);
        if ((st = fg_adaptive_prepare(ctx, s, &plans[i])) != FG_OK)
            break;
    }
    if (st) {
        for (int32_t i = 0; i < n_seqs; i++)
            fg_adaptive_abort(ctx, &plans[i]);
        free(plans);
        return st;
    }
    for (int32_t i = 0; plans && i < n_seqs; i++)
        if (plans[i])
            fg_adaptive_trade(&ctx->seqs[seqs[i]], plans[i]);

    /* 2. plan every head on the host and give it the pages of its peak */
    for (int32_t i = 0; i < n_seqs && st == FG_OK; i++) {
        fg_seq *s = &ctx->seqs[seqs[i]];
        const int32_t p = s->length[layer];
        for (int32_t g = 0; g < Hkv; g++) {
            int32_t hi = i * Hkv + g;
            fg_head *h = &s->heads[(size_t)layer * Hkv + g];
            fg_step_plan pl = fg_plan_step(&h->pol, p + 1, s->cls, ctx->new_cls[i], h->n_slots, h->n_freq);
            ctx->plans[hi] = pl;
            /* meta pages shared with a fork are copied before the step writes them:
               every page where scores, the window or evictions may change a slot,
               else the one the new slot goes to and page 0 (the rows' counters).
               Row pages are never copied: the step writes rows at or above
               priv_from, which no other owner uses (common/slots.h,
               fg_head_share). A new row may be a fresh one: at most
               rows_bound + 1 of them. */
            const int rewrites = (h->components & (FG_KEEP_FREQUENT | FG_KEEP_LOCAL)) && !(h->components & FG_KEEP_FULL);
            const int writes = rewrites || pl.insert_flag || h->row_base >= 0;
            int32_t before = h->n_pages;
            st = fg_head_unshare(ctx, h, 0, writes ? 1 : 0);
            if (st == FG_OK && writes)
                st = fg_head_unshare(ctx, h, rewrites ? 1 : h->n_slots / P, h->n_pages);
            const int32_t ins = pl.insert_flag ? 1 : 0;
            const int32_t rows = h->rows_bound + ins > h->n_slots + ins ? h->rows_bound + ins : h->n_slots + ins;
            if (st == FG_OK)
                st = fg_head_reserve(ctx, h, fg_pages_for(ctx, rows));
            ctx->added_pages[hi] = h->n_pages - before;
            if (st) {
                fg_unreserve(ctx, layer, seqs, hi + 1);
                fg_pages_reshare(ctx);
                break;
            }
            ctx->dheads[hi] = (fg_decode_head){
                .pages = h->pages,
                .meta = h->meta,
                .n_pages = h->n_pages,
                .priv_from = h->priv_from,
                .row_base = h->n_pages > 0 ? h->row_base : -1,
                .n_slots = h->n_slots,
                .n_slots_after = pl.n_slots,
                .components = h->components,
                .score_mode = s->cp.score_mode,
                .pos = p,
                .insert_flag = pl.insert_flag,
                .window_start = pl.window_start,
                .freq_budget = pl.freq_budget,
                .q = q + ((size_t)i * Hq + (size_t)g * G) * d,
                .k = k + ((size_t)i * Hkv + g) * d,
                .v = v + ((size_t)i * Hkv + g) * d,
                .out = out + ((size_t)i * Hq + (size_t)g * G) * d,
                .share_first = i * Hkv,
                /* heads that rank together: only where there are scores to share */
                .share_n = s->cp.allocation == FG_ALLOC_LAYER && fg_tracks_scores(h->components) ? Hkv : 0,
            };
        }
    }

    /* 3. the step itself, and the rows adaptive sequences still observe */
    if (st == FG_OK) {
        st = ctx->be.ops->decode_step(&ctx->be, &ctx->layout, &ctx->shape, n_seqs * Hkv, ctx->dheads);
        for (int32_t i = 0; i < n_seqs && st == FG_OK; i++) {
            fg_seq *s = &ctx->seqs[seqs[i]];
            const int32_t p = s->length[layer];
            if (s->ad)
                st = fg_observe_rows(ctx, s, layer, p, p, p + 1, q + (size_t)i * Hq * d);
        }
        if (st) {
            /* The step's pages go back. Backends fail before they touch a cache
             * (workspace, staging); a device that fails in the middle of its
             * kernels reports FG_ERR_BACKEND, and that batch's caches are undefined. */
            fg_unreserve(ctx, layer, seqs, n_seqs * Hkv);
            fg_pages_reshare(ctx);
        }
    }
    if (plans) { /* the compressions stay with the step, or go with it */
        for (int32_t i = 0; i < n_seqs; i++) {
            if (plans[i] && st)
                fg_adaptive_trade(&ctx->seqs[seqs[i]], plans[i]); /* back: the full caches again */
            fg_adaptive_abort(ctx, &plans[i]);
        }
        free(plans);
    }
    if (st)
        return st;
    ctx->n_cow = 0; /* the copies stay */

    /* 4. commit: counts, pages beyond the new count back to the pool, history */
    for (int32_t i = 0; i < n_seqs; i++) {
        fg_seq *s = &ctx->seqs[seqs[i]];
        const int32_t p = s->length[layer];
        for (int32_t g = 0; g < Hkv; g++) {
            fg_head *h = &s->heads[(size_t)layer * Hkv + g];
            const fg_step_plan *pl = &ctx->plans[i * Hkv + g];
            const int32_t ins = pl->insert_flag ? 1 : 0, fresh_max = h->priv_from + h->n_slots + ins;
            if (h->n_pages > 0)
                h->row_base = -1; /* the step reset the counters */
            /* a fresh row is taken only when no row the head may write is free
               (rows [priv_from, hw) are kept or free: fg_head_share starts hw
               at priv_from): then hw <= priv_from + the slots before the step */
            if (ins && h->rows_bound < fresh_max)
                h->rows_bound++;
            /* an eviction below priv_from leaves its row dead, and the last
               slot's row where it was */
            if (h->priv_from > 0 && pl->n_slots < h->n_slots + ins)
                h->in_order = 0;
            h->n_slots = pl->n_slots;
            h->n_freq = pl->n_freq;
        }
        if (p == s->n_tokens) {
            s->tokens[p] = tokens[i];
            s->cls[p] = ctx->new_cls[i];
            s->n_tokens++;
        }
        s->length[layer] = p + 1;
    }
    /* 5. heads sharing pages that no longer pay for themselves, or sharing
       none any more, get slot s in row s again (fg_head_tidy); a head that
       shares nothing keeps slot s in row s: pages past the kept rows go, and
       the free rows with them (the counters restart) */
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
