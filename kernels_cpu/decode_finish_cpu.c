/* Steps 3-4 of a decode step on the cpu backend (docs/design.md §2.5):
 * insert, window, frequent budget, with the frequent-candidate scan split
 * into ranges that the vector score update (decode_step_cpu.c) scans as it
 * goes and merges here. Also the plain step for the shapes the vector
 * kernels do not take. Written apart from the reference (kernels_ref/), so
 * that backend_ops compares two implementations of attention and eviction. */
#include <math.h>

#include "common/rules.h"
#include "common/slots.h"
#include "kernels_cpu/kernels_cpu.h"

void fg_cpu_freq_scan(const fg_page_layout *L, const fg_decode_head *hd, int32_t begin, int32_t end,
                      fg_freq_scan *scan) {
    const int32_t P = L->page_tokens, t = hd->pos + 1;
    for (int32_t s0 = begin; s0 < end;) {
        fg_prefetch_meta(L, hd->meta, end, s0 / P + FG_META_AHEAD);
        unsigned char *page = hd->meta[s0 / P];
        uint8_t *flags = page + L->flags_offset;
        const int32_t *pos = (const int32_t *)(const void *)(page + L->pos_offset);
        const float *score = (const float *)(const void *)(page + L->score_offset);
        const int32_t j0 = s0 % P, j1 = end - s0 < P - j0 ? j0 + (end - s0) : P;
        for (int32_t j = j0; j < j1; j++) {
            if (flags[j] == FG_SLOT_LOCAL && pos[j] < hd->window_start)
                flags[j] = FG_SLOT_FREQUENT;
            if (flags[j] != FG_SLOT_FREQUENT)
                continue;
            scan->n_freq++;
            const float rank = fg_rank_score(hd->score_mode, score[j], pos[j], t);
            if (scan->worst < 0 || fg_ranks_below(rank, pos[j], scan->worst_rank, scan->worst_pos)) {
                scan->worst = s0 + (j - j0);
                scan->worst_rank = rank;
                scan->worst_pos = pos[j];
            }
        }
        s0 += j1 - j0;
    }
}

void fg_cpu_freq_scan_merge(fg_freq_scan *into, const fg_freq_scan *from) {
    into->n_freq += from->n_freq;
    if (from->worst >= 0 && (into->worst < 0 || fg_ranks_below(from->worst_rank, from->worst_pos, into->worst_rank,
                                                                 into->worst_pos))) {
        into->worst = from->worst;
        into->worst_rank = from->worst_rank;
        into->worst_pos = from->worst_pos;
    }
}

fg_status fg_cpu_decode_finish_head(const fg_page_layout *L, const fg_decode_head *hd, float new_score,
                                    const fg_freq_scan *scanned) {
    const int track = fg_tracks_scores(hd->components);
    void *const *pages = hd->pages, *const *meta = hd->meta;
    const int32_t old_n = hd->n_slots;
    int32_t n = old_n;

    if (hd->row_base >= 0)
        fg_rows_reset(L, meta, hd->row_base);
    /* 3. insert the new token */
    if (hd->insert_flag) {
        fg_slot_write(L, pages, meta, n, hd->k, hd->v, hd->pos, hd->insert_flag, track ? new_score : 0.0f);
        n++;
    }

    const int32_t P = L->page_tokens;
    if (!track) { /* 4a. rows leaving the window: frequent candidates, or dropped (metadata page by page) */
        if (hd->components & FG_KEEP_LOCAL)
            for (int32_t s0 = 0; s0 < n; s0 += P) {
                fg_prefetch_meta(L, meta, n, s0 / P + FG_META_AHEAD);
                unsigned char *page = meta[s0 / P];
                uint8_t *flags = page + L->flags_offset;
                const int32_t *pos = (const int32_t *)(const void *)(page + L->pos_offset);
                for (int32_t j = 0; j < P && s0 + j < n; j++) {
                    if (flags[j] != FG_SLOT_LOCAL || pos[j] >= hd->window_start)
                        continue;
                    if (hd->components & FG_KEEP_FREQUENT) {
                        flags[j] = FG_SLOT_FREQUENT;
                    } else {
                        n = fg_slot_remove(L, pages, meta, s0 + j, n, hd->priv_from); /* the last slot moves into j */
                        j--;
                    }
                }
            }
        return n == hd->n_slots_after ? FG_OK : FG_ERR_INTERNAL;
    }

    /* 4a-b: rows leaving the window become frequent candidates; the
       candidates are counted and the lowest-ranked found (the minimum of
       (rank, position) is unique, so neither the order of the walk nor a
       split of it matters). The old slots may come scanned already. */
    fg_freq_scan scan = FG_FREQ_SCAN_EMPTY;
    if (scanned)
        scan = *scanned;
    else
        fg_cpu_freq_scan(L, hd, 0, old_n, &scan);
    fg_cpu_freq_scan(L, hd, old_n, n, &scan);

    /* 4c. candidates down to the budget, lowest rank first (one, in a steady state) */
    while (scan.n_freq > hd->freq_budget) {
        if (scan.worst < 0 || scan.worst >= n)
            return FG_ERR_INTERNAL; /* a scan that counted candidates must name one */
        n = fg_slot_remove(L, pages, meta, scan.worst, n, hd->priv_from);
        if (scan.n_freq - 1 <= hd->freq_budget)
            break;
        scan = FG_FREQ_SCAN_EMPTY;
        fg_cpu_freq_scan(L, hd, 0, n, &scan);
    }
    return n == hd->n_slots_after ? FG_OK : FG_ERR_INTERNAL;
}

/* q . row, the row widened element by element from its dtype */
static float dot_cached(const float *q, const void *row, fg_dtype dtype, int32_t d) {
    float s = 0.0f;
    for (int32_t c = 0; c < d; c++)
        s += q[c] * fg_load_elem(row, dtype, d, c);
    return s;
}

/* Query heads one pass over the slots serves: their running maxima and sums
 * live on the stack. */
#define PLAIN_HEADS 16

/* Not the reference's loops (kernels_ref/decode_step_ref.c reads each K row
 * three times per query head): the order of the vector kernels, in scalar
 * code. One pass over the slots serves up to PLAIN_HEADS query heads with an
 * online softmax (each head's running max m and sum l; the output so far is
 * rescaled by e^(m_old - m) when the max grows), so each K and V row is read
 * once per pass. The new token's own key (dotted with the query as given)
 * starts each head's state. A head
 * that tracks scores then reads K once more to turn each slot's scores into
 * its pooled attention, one head's share at a time as ref adds it (score
 * = keep * score, then += p_h / (l_h G) for each h). */
float fg_cpu_decode_attend_plain(const fg_page_layout *L, const fg_shape *shape, const fg_decode_head *hd,
                                 const float *q_cached) {
    const int32_t G = shape->n_q_heads / shape->n_kv_heads, d = shape->head_dim, n = hd->n_slots;
    const float scale = 1.0f / sqrtf((float)d);
    const int track = fg_tracks_scores(hd->components);
    const float keep = hd->score_mode == FG_SCORE_LAST ? 0.0f : 1.0f;
    void *const *pages = hd->pages, *const *meta = hd->meta;
    float new_score = 0.0f;

    for (int32_t h0 = 0; h0 < G; h0 += PLAIN_HEADS) {
        const int32_t hn = G - h0 < PLAIN_HEADS ? G - h0 : PLAIN_HEADS;
        const float *q = hd->q + (size_t)h0 * d, *qk = q_cached + (size_t)h0 * d;
        float *out = hd->out + (size_t)h0 * d;
        float m[PLAIN_HEADS], l[PLAIN_HEADS], self[PLAIN_HEADS];
        for (int32_t h = 0; h < hn; h++) {
            self[h] = m[h] = dot_cached(q + (size_t)h * d, hd->k, FG_DTYPE_F32, d) * scale;
            l[h] = 1.0f;
            for (int32_t c = 0; c < d; c++)
                out[(size_t)h * d + c] = hd->v[c];
        }
        for (int32_t s = 0; s < n; s++) {
            const void *kr = fg_slot_k(L, pages, meta, s), *vr = fg_slot_v(L, pages, meta, s);
            for (int32_t h = 0; h < hn; h++) {
                const float x = dot_cached(qk + (size_t)h * d, kr, L->k_dtype, d);
                float *o = out + (size_t)h * d;
                if (x > m[h]) { /* a new max: what came before shrinks by e^(m_old - x) */
                    const float shrink = expf(m[h] - x);
                    l[h] *= shrink;
                    for (int32_t c = 0; c < d; c++)
                        o[c] *= shrink;
                    m[h] = x;
                }
                const float p = expf(x - m[h]);
                l[h] += p;
                for (int32_t c = 0; c < d; c++)
                    o[c] += p * fg_load_elem(vr, L->v_dtype, d, c);
            }
        }
        for (int32_t h = 0; h < hn; h++) {
            const float inv = 1.0f / l[h];
            for (int32_t c = 0; c < d; c++)
                out[(size_t)h * d + c] *= inv;
            l[h] = inv / (float)G; /* from here: the factor of the pooled attention */
            new_score += expf(self[h] - m[h]) * l[h];
        }
        if (!track)
            continue;
        for (int32_t s = 0; s < n; s++) {
            const void *kr = fg_slot_k(L, pages, meta, s);
            float *score = fg_slot_score(L, meta, s);
            /* FG_SCORE_LAST: this step's attention alone (as ref, a NaN score does not carry over); each
               head's share is added to the score in turn, as ref adds it and as new_score sums it, so a
               slot that met the query as the new token did keeps its tie with it for any G (a pass's sum
               added at once would round apart from new_score past PLAIN_HEADS heads) */
            float sc = h0 > 0 || keep != 0.0f ? *score : 0.0f;
            for (int32_t h = 0; h < hn; h++)
                sc += expf(dot_cached(qk + (size_t)h * d, kr, L->k_dtype, d) - m[h]) * l[h];
            *score = sc;
        }
    }
    return new_score;
}

int fg_cpu_decode_share(const fg_page_layout *L, const fg_decode_head *hds, int32_t n_heads) {
    const int32_t P = L->page_tokens, n = hds[0].n_slots; /* every head's (fg_decode_groups_check) */
    if (!fg_tracks_scores(hds[0].components))
        return 0;
    for (int32_t s0 = 0; s0 < n; s0 += P) { /* page by page: the group's metadata at slot s0 */
        const int32_t m = n - s0 < P ? n - s0 : P;
        const unsigned char *first = hds[0].meta[s0 / P];
        const int32_t *pos0 = (const int32_t *)(const void *)(first + L->pos_offset);
        for (int32_t j = 0; j < m; j++) {
            float sum = 0.0f;
            for (int32_t i = 0; i < n_heads; i++) {
                const unsigned char *page = hds[i].meta[s0 / P];
                if (((const int32_t *)(const void *)(page + L->pos_offset))[j] != pos0[j])
                    return i;
                sum += ((const float *)(const void *)(page + L->score_offset))[j];
            }
            for (int32_t i = 0; i < n_heads; i++)
                ((float *)(void *)((unsigned char *)hds[i].meta[s0 / P] + L->score_offset))[j] = sum / (float)n_heads;
        }
    }
    return 0;
}
