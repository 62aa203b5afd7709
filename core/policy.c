/* Policy choice from profiling statistics (docs/design.md §2.3-2.4) and the host
 * mirror of a decode step's slot counts (§2.5). All formulas are linear in
 * the pooled attention, so they read only col and col_local. A snapshot is
 * chosen as a frequent set is, and then never changes. */
#include <math.h>
#include <stdlib.h>

#include "common/rules.h"
#include "core/internal.h"

/* Rank of key j at the end of the prompt before pooling: cumulative
 * attention (or the last row's, FG_SCORE_LAST), or that divided by the
 * number of profiled rows that could see j. */
static float base_rank(const fg_compression_params *cp, const fg_profile_view *pv, int32_t j) {
    const float score = pv->score ? pv->score[j] : pv->col[j];
    if (cp->score_mode == FG_SCORE_MEAN) {
        if (pv->pos) /* as a decode step ranks: by age */
            return score / (float)(pv->length - pv->pos[j]);
        int32_t first = j > pv->row_begin ? j : pv->row_begin;
        return score / (float)(pv->n - first);
    }
    return score;
}

static float profile_rank(const fg_compression_params *cp, const fg_profile_view *pv, int32_t j) {
    return pv->rank ? pv->rank[j] : base_rank(cp, pv, j);
}

void fg_policy_pool_ranks(const fg_compression_params *cp, const fg_profile_view *pv, float *rank) {
    const int32_t half = cp->score_pool / 2, n = pv->n;
    for (int32_t j = 0; j < n; j++) {
        const int32_t lo = j - half < 0 ? 0 : j - half, hi = j + half >= n ? n - 1 : j + half;
        float best = base_rank(cp, pv, lo);
        for (int32_t i = lo + 1; i <= hi; i++) {
            const float r = base_rank(cp, pv, i);
            best = r > best ? r : best;
        }
        rank[j] = best;
    }
}

/* Higher rank first, a NaN rank last (a total order whatever the floats);
 * ties: the later position first. */
static int by_rank_desc(const void *a, const void *b) {
    const fg_rank_entry *x = a, *y = b;
    const int xn = isnan(x->rank), yn = isnan(y->rank);
    if (xn != yn)
        return xn ? 1 : -1;
    if (!xn && x->rank != y->rank)
        return x->rank > y->rank ? -1 : 1;
    return (x->pos < y->pos) - (x->pos > y->pos);
}

void fg_policy_rank_sort(fg_rank_entry *entries, int32_t n) {
    qsort(entries, (size_t)n, sizeof *entries, by_rank_desc);
}

int32_t fg_policy_select_frequent(const fg_compression_params *cp, const fg_policy *policy, const fg_profile_view *pv,
                                  int32_t exclude_from, fg_rank_entry *scratch) {
    uint32_t c = fg_effective_components(policy->components);
    int32_t n_cand = 0;
    for (int32_t j = 0; j < exclude_from; j++)
        if (!fg_is_pinned(c, pv->cls[j]))
            scratch[n_cand++] = (fg_rank_entry){profile_rank(cp, pv, j), j};
    qsort(scratch, (size_t)n_cand, sizeof *scratch, by_rank_desc);
    int32_t k = fg_policy_frequent_budget(policy, pv->length);
    return k < n_cand ? k : n_cand;
}

int32_t fg_policy_window_start(const fg_policy *policy, const fg_profile_view *pv) {
    if (!(fg_effective_components(policy->components) & FG_KEEP_LOCAL))
        return pv->n;
    const int32_t first = pv->length - fg_policy_window(policy, pv->length); /* position */
    if (!pv->pos)
        return first;
    int32_t lo = 0, hi = pv->n; /* the first key at or after it */
    while (lo < hi) {
        const int32_t mid = lo + (hi - lo) / 2;
        if (pv->pos[mid] >= first)
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

double fg_policy_recovery(const fg_compression_params *cp, int32_t entry, const fg_profile_view *pv,
                          fg_rank_entry *scratch) {
    const fg_policy *policy = &cp->shortlist[entry];
    uint32_t c = fg_effective_components(policy->components);
    if (c & FG_KEEP_FULL)
        return 1.0;
    const int32_t window_start = fg_policy_window_start(policy, pv);
    const float *col_local = (c & FG_KEEP_LOCAL) ? pv->col_local[entry] : NULL;
    double mass = 0.0;
    for (int32_t j = 0; j < pv->n; j++) {
        if (fg_is_pinned(c, pv->cls[j]))
            mass += pv->col[j];   /* sum_i A[i][j]: pinned for every row */
        else if (col_local)
            mass += col_local[j]; /* the rows whose window L_i holds j */
    }
    if (c & (FG_KEEP_FREQUENT | FG_KEEP_SNAPSHOT)) {
        int32_t k = fg_policy_select_frequent(cp, policy, pv, window_start, scratch);
        for (int32_t i = 0; i < k; i++) {
            int32_t j = scratch[i].pos;
            mass += (double)pv->col[j] - (col_local ? (double)col_local[j] : 0.0);
        }
    }
    return mass / (double)(pv->n - pv->row_begin);
}

int32_t fg_policy_choose(const fg_compression_params *cp, const fg_profile_view *pv, uint32_t skip, float *recovery,
                         fg_rank_entry *scratch) {
    int32_t chosen = -1, fallback = cp->n_policies - 1;
    for (int32_t e = 0; e < cp->n_policies; e++) {
        double r = fg_policy_recovery(cp, e, pv, scratch);
        recovery[e] = (float)r;
        if (skip & (1u << e))
            continue;
        fallback = e;
        if (chosen < 0 && r >= (double)cp->threshold)
            chosen = e;
    }
    return chosen >= 0 ? chosen : fallback;
}

/* A recovery as the allocation ranks it: a non-finite one (NaN or Inf
 * attention) below every real one, which lie in [0, 1]. */
static double ranked_recovery(double r) { return isfinite(r) ? r : -1.0; }

void fg_policy_allocate(const double *rec, const int32_t *cost, int32_t n_heads, int32_t n_entries,
                        int64_t budget_rows, int32_t *choice) {
    int64_t used = 0;
    for (int32_t g = 0; g < n_heads; g++) {
        const double *r = rec + (size_t)g * n_entries;
        const int32_t *c = cost + (size_t)g * n_entries;
        int32_t best = 0;
        for (int32_t e = 1; e < n_entries; e++)
            if (c[e] < c[best] || (c[e] == c[best] && ranked_recovery(r[e]) > ranked_recovery(r[best])))
                best = e;
        choice[g] = best;
        used += c[best];
    }
    /* Each move raises one head's (finite) recovery strictly, so no choice
       comes back and the loop ends after at most n_heads x n_entries moves. */
    for (;;) {
        int32_t up_g = -1, up_e = -1;
        double up_gain = 0.0;
        for (int32_t g = 0; g < n_heads; g++) {
            const double *r = rec + (size_t)g * n_entries;
            const int32_t *c = cost + (size_t)g * n_entries;
            const int32_t cur = choice[g];
            for (int32_t e = 0; e < n_entries; e++) {
                const int64_t dc = (int64_t)c[e] - c[cur];
                const double dr = ranked_recovery(r[e]) - ranked_recovery(r[cur]);
                if (!(dr > 0.0) || used + dc > budget_rows)
                    continue;
                /* recovery per row added; a free gain comes first */
                const double gain = dc <= 0 ? INFINITY : dr / (double)dc;
                if (up_g < 0 || gain > up_gain) {
                    up_g = g;
                    up_e = e;
                    up_gain = gain;
                }
            }
        }
        if (up_g < 0)
            return;
        used += (int64_t)cost[(size_t)up_g * n_entries + up_e] - cost[(size_t)up_g * n_entries + choice[up_g]];
        choice[up_g] = up_e;
    }
}

void fg_policy_share_rows(const fg_compression_params *cp, const fg_profile_view *views, int32_t n_heads,
                          fg_rank_entry *cand, fg_rank_entry *rest, int32_t *share, fg_policy *policies) {
    const fg_policy *entry = &cp->shortlist[0];
    const int32_t k_uniform = fg_policy_frequent_budget(entry, views[0].length);
    const int32_t floor_k = (int32_t)ceil((double)cp->alloc_floor * k_uniform);
    const fg_policy every = {entry->components, 1.0f, 1.0f, 0, 0}; /* all candidates, sorted */
    int64_t left = (int64_t)n_heads * k_uniform;
    int32_t n_rest = 0;
    for (int32_t g = 0; g < n_heads; g++) {
        const fg_profile_view *pv = &views[g];
        const int32_t n_cand = fg_policy_select_frequent(cp, &every, pv, fg_policy_window_start(entry, pv), cand);
        share[g] = floor_k < n_cand ? floor_k : n_cand;
        left -= share[g];
        for (int32_t i = share[g]; i < n_cand; i++) /* the position and the head in one key: later, then higher first */
            rest[n_rest++] = (fg_rank_entry){cand[i].rank, cand[i].pos * n_heads + g};
    }
    qsort(rest, (size_t)n_rest, sizeof *rest, by_rank_desc);
    for (int32_t i = 0; i < n_rest && left > 0; i++, left--)
        share[rest[i].pos % n_heads]++;
    for (int32_t g = 0; g < n_heads; g++) {
        fg_policy p = *entry;
        if (fg_effective_components(p.components) & FG_KEEP_SNAPSHOT) {
            p.ratio_frequent = share[g] > 0 ? 1.0f : 0.0f;
            p.frequent_tokens = share[g];
        } else {
            p.ratio_frequent = k_uniform > 0 ? p.ratio_frequent * (float)share[g] / (float)k_uniform : 0.0f;
        }
        policies[g] = p;
    }
}

int32_t fg_policy_keep(const fg_compression_params *cp, const fg_policy *policy, const fg_profile_view *pv,
                       fg_rank_entry *scratch, int32_t *pos, int32_t *src, uint8_t *flags, float *score,
                       int32_t *n_freq) {
    const int32_t n = pv->n;
    uint32_t c = fg_effective_components(policy->components);
    /* flags[j] marks the component keeping position j (0 = dropped), then the
     * kept positions are packed in ascending order */
    for (int32_t j = 0; j < n; j++)
        flags[j] = 0;
    *n_freq = 0;
    if (c & FG_KEEP_FULL) {
        for (int32_t j = 0; j < n; j++)
            flags[j] = FG_SLOT_FULL;
    } else {
        const int32_t window_start = fg_policy_window_start(policy, pv);
        for (int32_t j = 0; j < n; j++) {
            if (fg_is_pinned(c, pv->cls[j]))
                flags[j] = pv->cls[j] == FG_TOKEN_SPECIAL ? FG_SLOT_SPECIAL : FG_SLOT_PUNCT;
            else if (j >= window_start)
                flags[j] = FG_SLOT_LOCAL;
        }
        if (c & (FG_KEEP_FREQUENT | FG_KEEP_SNAPSHOT)) {
            const uint8_t flag = (c & FG_KEEP_FREQUENT) ? FG_SLOT_FREQUENT : FG_SLOT_SNAPSHOT;
            int32_t k = fg_policy_select_frequent(cp, policy, pv, window_start, scratch);
            for (int32_t i = 0; i < k; i++)
                flags[scratch[i].pos] = flag;
            *n_freq = flag == FG_SLOT_FREQUENT ? k : 0;
        }
    }
    int32_t kept = 0;
    for (int32_t j = 0; j < n; j++) {
        if (!flags[j])
            continue;
        pos[kept] = pv->pos ? pv->pos[j] : j;
        if (src)
            src[kept] = j;
        flags[kept] = flags[j];
        score[kept] = pv->score ? pv->score[j] : pv->col[j];
        kept++;
    }
    return kept;
}

fg_step_plan fg_plan_step(const fg_policy *policy, int32_t t, const uint8_t *cls, uint8_t cls_new, int32_t n_slots,
                          int32_t n_freq) {
    uint32_t c = fg_effective_components(policy->components);
    fg_step_plan pl = {n_slots, n_freq, fg_insert_flag(c, cls_new), 0, 0};
    if (pl.insert_flag)
        pl.n_slots++;
    if (pl.insert_flag == FG_SLOT_FREQUENT)
        pl.n_freq++;
    if (c & FG_KEEP_LOCAL) {
        /* every unpinned position of [old_start, t - 1) is in the window */
        int32_t old_start = (t - 1) - fg_policy_window(policy, t - 1);
        pl.window_start = t - fg_policy_window(policy, t);
        for (int32_t q = old_start < 0 ? 0 : old_start; q < pl.window_start; q++) {
            if (fg_is_pinned(c, cls[q]))
                continue;
            if (fg_window_exit_flag(c) == FG_SLOT_FREQUENT) /* the rule the backends apply (common/rules.h) */
                pl.n_freq++;
            else
                pl.n_slots--;
        }
    }
    if (c & FG_KEEP_FREQUENT) {
        pl.freq_budget = fg_policy_frequent_budget(policy, t);
        if (pl.n_freq > pl.freq_budget) {
            pl.n_slots -= pl.n_freq - pl.freq_budget;
            pl.n_freq = pl.freq_budget;
        }
    }
    return pl;
}

void fg_shortlist_windows(const fg_compression_params *cp, int32_t t, fg_profile_request *req, int32_t *window_of) {
    for (int32_t e = 0; e < cp->n_policies; e++) {
        window_of[e] = -1;
        if (!(fg_effective_components(cp->shortlist[e].components) & FG_KEEP_LOCAL))
            continue;
        const int32_t w = fg_policy_window(&cp->shortlist[e], t);
        int32_t i = 0;
        while (i < req->n_windows && req->window[i] != w)
            i++;
        if (i == req->n_windows)
            req->window[req->n_windows++] = w;
        window_of[e] = i;
    }
}
