/*
 * The decode rules that host and device code share (docs/design.md §2.5):
 * which heads track scores, when a row leaves the window, and how frequent
 * candidates rank. Every backend and the host's mirror of a step include
 * this one header, so they cannot disagree on them.
 */
#ifndef FG_RULES_H
#define FG_RULES_H

#include <math.h> /* INFINITY */
#include <stdint.h>

#include "common/dtype.h" /* FG_HD */
#include "common/layout.h" /* FG_SLOT_* */
#include "fastgen.h"

/* A head tracks per-slot attention scores when it keeps frequent rows and
 * is not a full cache. */
FG_HD static inline int fg_tracks_scores(uint32_t components) {
    return (components & FG_KEEP_FREQUENT) && !(components & FG_KEEP_FULL);
}

/* Step 4a: a window row whose position fell below the window's start
 * (t - w(t)) has left the window. */
FG_HD static inline int fg_leaves_window(uint8_t flag, int32_t pos, int32_t window_start) {
    return flag == FG_SLOT_LOCAL && pos < window_start;
}

/* What a row that left the window becomes: a frequent candidate when the
 * head keeps frequent rows, else nothing (it is dropped). */
FG_HD static inline uint8_t fg_window_exit_flag(uint32_t components) {
    return (components & FG_KEEP_FREQUENT) ? (uint8_t)FG_SLOT_FREQUENT : (uint8_t)0;
}

/* Ranking of a frequent candidate at length t: its accumulated score, or
 * (FG_SCORE_MEAN) that score over its age; a NaN (the attention of a NaN
 * query or an infinite key) ranks as -inf, below every number: such rows go
 * first, the older first, on every backend alike (a comparison with NaN
 * would make the order of a walk over the candidates decide). */
FG_HD static inline float fg_rank_score(int32_t mode, float score, int32_t pos, int32_t t) {
    const float r = mode == FG_SCORE_MEAN ? score / (float)(t - pos) : score;
    return r != r ? -INFINITY : r;
}

/* True when candidate a ranks below b: lower rank, ties to the older. The
 * minimum of (rank, position) is unique, so the order of a walk over the
 * candidates never matters. */
FG_HD static inline int fg_ranks_below(float ra, int32_t pa, float rb, int32_t pb) {
    return ra < rb || (ra == rb && pa < pb);
}

#endif /* FG_RULES_H */
