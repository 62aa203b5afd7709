/* The allocation modes (fg_allocation, docs/design.md §2.4 and §2.7): how a
 * layer's heads get their policies at the end of the prompt, and what a mode
 * does beyond it. One entry per mode in one table; prefill and decode call
 * the entry of a sequence's mode (fg_alloc_mode_of) without knowing which.
 *
 *   shortlist  each head the first entry that recovers the threshold; with a
 *              budget, the layer's heads share it (fg_policy_allocate)
 *   adakv      as shortlist, then the first entry's frequent rows shared
 *              among the heads by rank (AdaKV)
 *   layer      as shortlist, every head ranking by the layer's mean (TOVA)
 *   adaptive   the full cache until the sequence is observed, then one
 *              budget over every head of every layer (core/adaptive.c) */
#define FG_EXPERIMENTAL /* FG_ADAPTIVE_TAIL_RANKS (fastgen.h) */
#include <math.h>
#include <string.h>

#include "core/internal.h"

/* Budget mode: the layer's heads share budget x the full cache's rows (or
 * budget_tokens rows per head). An entry costs the rows it keeps as the
 * sequence grows, at length n: its pinned tokens, plus its window and
 * frequent ratios of the others (not the rounding of a short prompt, so the
 * kept share holds while decoding). */
static void allocate_budget(const fg_layer_choice *c) {
    const fg_compression_params *cp = c->cp;
    const int32_t E = cp->n_policies, Hkv = c->Hkv, n = c->n;
    for (int32_t e = 0; e < E; e++) {
        const fg_policy *pol = &cp->shortlist[e];
        const uint32_t comp = fg_effective_components(pol->components);
        int32_t pinned = 0;
        for (int32_t j = 0; j < n; j++)
            pinned += fg_is_pinned(comp, c->views[0].cls[j]);
        const double grow = ((comp & FG_KEEP_LOCAL) ? pol->ratio_local : 0.0) +
                            ((comp & FG_KEEP_FREQUENT) ? pol->ratio_frequent : 0.0);
        const int32_t rows = (comp & FG_KEEP_FULL) ? n : pinned + (int32_t)ceil(fmin(grow, 1.0) * (n - pinned));
        for (int32_t g = 0; g < Hkv; g++) {
            c->rec[g * E + e] = c->heads[g].recovery[e];
            c->cost[g * E + e] = rows;
        }
    }
    int64_t rows = INT64_MAX;
    if (cp->budget > 0.0f)
        rows = (int64_t)ceil((double)cp->budget * Hkv * n);
    if (cp->budget_tokens > 0 && (int64_t)cp->budget_tokens * Hkv < rows)
        rows = (int64_t)cp->budget_tokens * Hkv;
    fg_policy_allocate(c->rec, c->cost, Hkv, E, rows, c->choice);
    for (int32_t g = 0; g < Hkv; g++)
        c->heads[g].policy_index = c->choice[g];
}

/* shortlist and layer: the threshold's choice (policy_index, made by the
 * caller), or the budget's; each head's policy is its entry. */
static void choose_shortlist(const fg_layer_choice *c) {
    if (c->cp->budget > 0.0f || c->cp->budget_tokens > 0)
        allocate_budget(c);
    for (int32_t g = 0; g < c->Hkv; g++)
        c->heads[g].pol = c->cp->shortlist[c->heads[g].policy_index];
}

/* adakv: as shortlist, then every head's share of the first entry's
 * frequent rows. */
static void choose_adakv(const fg_layer_choice *c) {
    choose_shortlist(c);
    fg_policy_share_rows(c->cp, c->views, c->Hkv, c->rank, c->shares, c->choice, c->pols);
    for (int32_t g = 0; g < c->Hkv; g++)
        c->heads[g].pol = c->pols[g];
}

/* adaptive: the full cache (the shortlist's last entry) until the whole
 * sequence is observed; the layer's profile is kept for then. */
static void choose_adaptive(const fg_layer_choice *c) {
    for (int32_t g = 0; g < c->Hkv; g++) {
        c->heads[g].policy_index = c->cp->n_policies - 1;
        c->heads[g].pol = c->cp->shortlist[c->heads[g].policy_index];
    }
    memcpy(c->s->ad->layers[c->layer].col, c->col, (size_t)c->Hkv * c->n * sizeof(float));
}

/* adaptive: the profile ranks by every prompt row, unless told the tail's. */
static int tail_ranks_adaptive(const fg_compression_params *cp) {
    return (cp->adaptive_flags & FG_ADAPTIVE_TAIL_RANKS) != 0;
}

static int tail_ranks(const fg_compression_params *cp) {
    (void)cp;
    return 1;
}

/* adaptive: a decode step's query joins the observed rows while the
 * sequence is not compressed yet. */
static fg_status step_observe_adaptive(fg_context *ctx, fg_seq *s, int32_t layer, int32_t p, const float *q) {
    return s->ad ? fg_observe_rows(ctx, s, layer, p, p, p + 1, q) : FG_OK;
}

static const fg_alloc_mode k_modes[] = {
    [FG_ALLOC_SHORTLIST] = {.name = "shortlist", .tail_ranks = tail_ranks, .choose = choose_shortlist},
    [FG_ALLOC_ADAKV] = {.name = "adakv", .shares_rows = 1, .tail_ranks = tail_ranks, .choose = choose_adakv},
    [FG_ALLOC_ADAPTIVE] = {.name = "adaptive",
                           .whole_prompt_first = 1,
                           .tail_ranks = tail_ranks_adaptive,
                           .choose = choose_adaptive,
                           .layer_prefilled = fg_adaptive_layer_prefilled,
                           .chunk_prefilled = fg_adaptive_chunk_prefilled,
                           .step_observe = step_observe_adaptive},
    [FG_ALLOC_LAYER] = {.name = "layer", .layer_ranks = 1, .tail_ranks = tail_ranks, .choose = choose_shortlist},
};

const fg_alloc_mode *fg_alloc_mode_of(const fg_compression_params *cp) {
    return &k_modes[cp->allocation]; /* checked: fg_compression_params_validate */
}
