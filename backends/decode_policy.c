/* Steps 3-4 of a decode step for one head, and a group's shared scores
 * (backends/decode_policy.h): the metadata walked page by page. */
#include "backends/decode_policy.h"
#include "common/slots.h"

void fg_freq_scan_range(const fg_page_layout *L, const fg_decode_head *hd, int32_t begin, int32_t end,
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
            if (fg_leaves_window(flags[j], pos[j], hd->window_start))
                flags[j] = FG_SLOT_FREQUENT;
            if (flags[j] != FG_SLOT_FREQUENT)
                continue;
            scan->n_freq++;
            fg_freq_scan_offer(scan, s0 + (j - j0), fg_rank_score(hd->score_mode, score[j], pos[j], t), pos[j]);
        }
        s0 += j1 - j0;
    }
}

/* 4a for a head that does not track scores: window rows that left the
 * window become frequent rows (kept for good: no score ranks them), or go.
 * Returns the slot count after. */
static int32_t window_exit(const fg_page_layout *L, const fg_decode_head *hd, int32_t n) {
    const int32_t P = L->page_tokens;
    const uint8_t exit_flag = fg_window_exit_flag(hd->components);
    for (int32_t s0 = 0; s0 < n; s0 += P) {
        fg_prefetch_meta(L, hd->meta, n, s0 / P + FG_META_AHEAD);
        unsigned char *page = hd->meta[s0 / P];
        uint8_t *flags = page + L->flags_offset;
        const int32_t *pos = (const int32_t *)(const void *)(page + L->pos_offset);
        for (int32_t j = 0; j < P && s0 + j < n; j++) {
            if (!fg_leaves_window(flags[j], pos[j], hd->window_start))
                continue;
            if (exit_flag) {
                flags[j] = exit_flag;
            } else {
                n = fg_slot_remove(L, hd->pages, hd->meta, s0 + j, n, hd->priv_from); /* the last slot moves into j */
                j--;
            }
        }
    }
    return n;
}

fg_status fg_decode_finish_head(const fg_page_layout *L, const fg_decode_head *hd, float new_score,
                                const fg_freq_scan *scanned) {
    const int track = fg_tracks_scores(hd->components);
    const int32_t old_n = hd->n_slots;
    int32_t n = old_n;

    if (hd->row_base >= 0)
        fg_rows_reset(L, hd->meta, hd->row_base);
    /* 3. insert the new token */
    if (hd->insert_flag) {
        fg_slot_write(L, hd->pages, hd->meta, n, hd->k, hd->v, hd->pos, hd->insert_flag, track ? new_score : 0.0f);
        n++;
    }

    if (!track) { /* 4a */
        if (hd->components & FG_KEEP_LOCAL)
            n = window_exit(L, hd, n);
        return n == hd->n_slots_after ? FG_OK : FG_ERR_INTERNAL;
    }

    /* 4a-b: the old slots may come scanned already, the new one is scanned here */
    fg_freq_scan scan = FG_FREQ_SCAN_EMPTY;
    if (scanned)
        scan = *scanned;
    else
        fg_freq_scan_range(L, hd, 0, old_n, &scan);
    fg_freq_scan_range(L, hd, old_n, n, &scan);

    /* 4c. candidates down to the budget, lowest rank first (one, in a steady state) */
    while (scan.n_freq > hd->freq_budget) {
        if (scan.worst < 0 || scan.worst >= n)
            return FG_ERR_INTERNAL; /* a scan that counted candidates must name one */
        n = fg_slot_remove(L, hd->pages, hd->meta, scan.worst, n, hd->priv_from);
        if (scan.n_freq - 1 <= hd->freq_budget)
            break;
        scan = FG_FREQ_SCAN_EMPTY;
        fg_freq_scan_range(L, hd, 0, n, &scan);
    }
    return n == hd->n_slots_after ? FG_OK : FG_ERR_INTERNAL;
}

int32_t fg_decode_share_scores(const fg_page_layout *L, const fg_decode_head *hds, int32_t n_heads) {
    const int32_t P = L->page_tokens, n = hds[0].n_slots; /* every head's (fg_decode_groups_check) */
    if (!fg_tracks_scores(hds[0].components))
        return 0;
    for (int32_t s0 = 0; s0 < n; s0 += P) { /* page by page: the group's metadata at slot s0 */
        const int32_t m = n - s0 < P ? n - s0 : P;
        const int32_t *pos0 = (const int32_t *)(const void *)((const unsigned char *)hds[0].meta[s0 / P] +
                                                              L->pos_offset);
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
