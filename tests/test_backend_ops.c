/*
 * Backend ops against `ref` (suite `backend`), op by op, on the same inputs,
 * modelled on ggml's test-backend-ops:
 *   prefill_attention, profile_stats  head dims 64/80/128/256 and odd ones,
 *                                     G 1/4/8, prompts 1, 2, 3, 17, 255, 4099;
 *   compact                           pages byte for byte;
 *   decode_step                       heads of 1 .. 20000 rows in one batch,
 *                                     mixed policies, several steps, and a
 *                                     500-step run: outputs NMSE, kept sets
 *                                     exactly, scores close;
 *   adaptive_observe, adaptive_errors the adaptive mode's column sums and
 *                                     per-level errors, NMSE.
 * NMSE in double: <= 1e-8 with fp32 caches, <= 5e-4 with fp16/bf16. Guard
 * regions after every output must stay untouched; NaN/Inf fail. Each
 * backend runs with 1 and 2 threads, which must agree bit for bit.
 * Usage: test_backend_ops [--list] [--filter SUBSTRING] [backend...]
 *   (default: every case, on every backend that probes OK; --filter runs
 *   the cases whose name holds SUBSTRING, --list names them all)
 */
#include <string.h>

#include "backends/backend.h"
#include "core/internal.h"
#include "tests/support/checks.h"
#include "tests/support/harness.h"
#include "kernels_cpu/kernels_cpu.h"
#include "common/cpu_features.h"
#include "common/slots.h"

static void fill(float *x, size_t n, float scale) {
    for (size_t i = 0; i < n; i++)
        x[i] = scale * rng_gauss();
}

/* The NMSE of a against ref over the elements finite in both; *same_mask
 * &= whether they are non-finite at the same places (NaN where ref has NaN,
 * an infinity of the same sign where ref has one); *finite counts the
 * elements finite in both. */
static double nmse_finite(const float *a, const float *ref, size_t n, int *same_mask, size_t *finite) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (isfinite(a[i]) && isfinite(ref[i])) {
            num += ((double)a[i] - ref[i]) * ((double)a[i] - ref[i]);
            den += (double)ref[i] * ref[i];
            ++*finite;
        } else if (isnan(ref[i]) ? !isnan(a[i]) : a[i] != ref[i]) {
            *same_mask = 0;
        }
    }
    return den > 0.0 ? num / den : num;
}

typedef struct backend_pair {
    const char *name;
    fg_backend ref, one, two; /* two: 2 threads */
} backend_pair;

/* ------------------------------------------------------------------ prefill + profile */

/* poison: a key of KV head 0 at row n / 3 with +inf and -inf lanes (NaN or
 * infinite scores for every later row of its heads) and a NaN in the last
 * query head's row n / 2: every output, statistic and column sum must be
 * non-finite exactly where ref's is (the vector exponential once made such
 * scores weights near 0), and finite elsewhere as close as ever. */
static void check_prompt(backend_pair *bp, int32_t d, int32_t G, int32_t Hkv, int32_t n, int32_t row_begin,
                         int poison) {
    const fg_shape sh = {G * Hkv, Hkv, d};
    const int32_t Hq = G * Hkv;
    const size_t nq = (size_t)n * Hq * d, nk = (size_t)n * Hkv * d;
    float *q = malloc(nq * sizeof *q), *k = malloc(nk * sizeof *k), *v = malloc(nk * sizeof *v);
    fill(q, nq, 1.0f);
    fill(k, nk, 1.0f);
    fill(v, nk, 1.0f);
    if (poison) {
        k[(size_t)(n / 3) * Hkv * d] = INFINITY;
        k[(size_t)(n / 3) * Hkv * d + 1] = -INFINITY;
        q[((size_t)(n / 2) * Hq + Hq - 1) * d + 2] = NAN;
    }
    fg_profile_request req = {.n = n, .row_begin = row_begin, .n_windows = 2, .window = {1 + n / 3, 5}};
    fg_backend *bes[3] = {&bp->ref, &bp->one, &bp->two};
    float *out[3], *mx[3], *sm[3], *col[3], *cl[3];
    for (int b = 0; b < 3; b++) {
        out[b] = guarded(nq);
        mx[b] = guarded((size_t)Hq * n);
        sm[b] = guarded((size_t)Hq * n);
        col[b] = guarded((size_t)Hkv * n);
        cl[b] = guarded(2 * (size_t)Hkv * n);
        EXPECT(bes[b]->ops->prefill_attention(bes[b], &sh, n, 0, q, k, v, out[b], mx[b], sm[b]) == FG_OK, "prefill");
        EXPECT(bes[b]->ops->profile_stats(bes[b], &sh, &req, q, k, mx[b], sm[b], col[b], cl[b]) == FG_OK, "profile");
    }
    int same_mask = 1;
    size_t finite = 0;
#define CMP(a, r, n) (poison ? nmse_finite((a), (r), (n), &same_mask, &finite) : nmse((a), (r), (n)))
    const double e_out = CMP(out[1], out[0], nq), e_sum = CMP(sm[1], sm[0], (size_t)Hq * n);
    const double e_col = CMP(col[1], col[0], (size_t)Hkv * n), e_cl = CMP(cl[1], cl[0], 2 * (size_t)Hkv * n);
    const double e_mx = CMP(mx[1], mx[0], (size_t)Hq * n);
#undef CMP
    EXPECT(same_mask, "%s prompt ops d=%d G=%d n=%d: not finite where ref's are finite, or the reverse", bp->name,
           (int)d, (int)G, (int)n);
    size_t n_nan = 0;
    for (size_t i = 0; poison && i < nq; i++)
        n_nan += isnan(out[0][i]) != 0;
    if (poison) /* the poison reached outputs, and left others finite */
        EXPECT(n_nan > 0 && n_nan < nq, "%s prompt ops poisoned: %zu of %zu ref outputs NaN", bp->name, n_nan, nq);
    EXPECT(e_out <= 1e-8 && e_sum <= 1e-8 && e_mx <= 1e-8,
           "%s prefill d=%d G=%d n=%d: NMSE out %.3g sum %.3g", bp->name, (int)d, (int)G, (int)n, e_out, e_sum);
    EXPECT(e_col <= 1e-8 && e_cl <= 1e-8, "%s profile d=%d G=%d n=%d: NMSE col %.3g col_local %.3g", bp->name, (int)d,
           (int)G, (int)n, e_col, e_cl);
    int guards = 1;
    for (int b = 1; b < 3; b++)
        guards &= guard_ok(out[b], nq) && guard_ok(mx[b], (size_t)Hq * n) && guard_ok(sm[b], (size_t)Hq * n) &&
                  guard_ok(col[b], (size_t)Hkv * n) && guard_ok(cl[b], 2 * (size_t)Hkv * n);
    EXPECT(guards, "%s prompt ops wrote past an output", bp->name);
    EXPECT(memcmp(out[1], out[2], nq * sizeof(float)) == 0 && /* NaN bits too: the same operations */
               memcmp(col[1], col[2], (size_t)Hkv * n * sizeof(float)) == 0 &&
               memcmp(cl[1], cl[2], 2 * (size_t)Hkv * n * sizeof(float)) == 0,
           "%s prompt ops: 1 and 2 threads differ", bp->name);
    printf("  %-4s prefill+profile d=%-3d G=%d Hkv=%d n=%-5d%s NMSE out %.1e col %.1e col_local %.1e\n", bp->name,
           (int)d, (int)G, (int)Hkv, (int)n, poison ? " poisoned" : "", e_out, e_col, e_cl);
    for (int b = 0; b < 3; b++) {
        free(out[b]);
        free(mx[b]);
        free(sm[b]);
        free(col[b]);
        free(cl[b]);
    }
    free(q);
    free(k);
    free(v);
}

/* ------------------------------------------------------------------ caches for compact and decode */

/* One head's cache in one backend: row and meta pages with room for `cap`
 * rows, and the rows' state the next step is given (common/slots.h). */
typedef struct head_cache {
    void **pages, **meta;
    int32_t n_pages;
    int32_t priv_from, row_base;
    void **tab; /* a backend that keeps page tables (device_tables): its own, as the core keeps them */
    int32_t tab_valid;
} head_cache;

/* Pages are backend memory (the device's on a GPU): the test reaches them only
 * through the backend's write and read. */
static void cache_alloc(fg_backend *be, const fg_page_layout *L, int32_t cap, head_cache *c) {
    c->n_pages = (cap + L->page_tokens - 1) / L->page_tokens;
    c->pages = calloc((size_t)c->n_pages, sizeof(void *));
    c->meta = calloc((size_t)c->n_pages, sizeof(void *));
    c->priv_from = 0;
    c->row_base = -1;
    c->tab = NULL;
    c->tab_valid = 0;
    unsigned char *zero = calloc(1, L->page_bytes);
    int ok = 1;
    for (int32_t p = 0; p < c->n_pages && ok; p++)
        ok = be->ops->buffer_alloc(be, L->page_bytes, &c->pages[p]) == FG_OK &&
             fg_backend_write(be, c->pages[p], zero, L->page_bytes) == FG_OK &&
             be->ops->buffer_alloc(be, L->meta_bytes, &c->meta[p]) == FG_OK &&
             fg_backend_write(be, c->meta[p], zero, L->meta_bytes) == FG_OK;
    EXPECT(ok, "%s: %d pages allocated and zeroed", be->ops->name, (int)c->n_pages);
    free(zero);
}

static void cache_free(fg_backend *be, head_cache *c) {
    if (c->tab)
        be->ops->buffer_free(be, c->tab);
    for (int32_t p = 0; p < c->n_pages; p++) {
        be->ops->buffer_free(be, c->pages[p]);
        be->ops->buffer_free(be, c->meta[p]);
    }
    free(c->pages);
    free(c->meta);
}

/* A host copy of a cache's pages (tables into it, as fg_slot_* read them). */
typedef struct host_cache {
    unsigned char *mem;
    void **pages, **meta;
} host_cache;

static host_cache cache_read(fg_backend *be, const fg_page_layout *L, const head_cache *c) {
    host_cache h;
    const size_t unit = L->page_bytes + L->meta_bytes;
    h.mem = malloc((size_t)c->n_pages * unit);
    h.pages = malloc((size_t)c->n_pages * sizeof(void *));
    h.meta = malloc((size_t)c->n_pages * sizeof(void *));
    int ok = h.mem && h.pages && h.meta;
    for (int32_t p = 0; p < c->n_pages && ok; p++) {
        h.pages[p] = h.mem + (size_t)p * unit;
        h.meta[p] = h.mem + (size_t)p * unit + L->page_bytes;
        ok = fg_backend_read(be, h.pages[p], c->pages[p], L->page_bytes) == FG_OK &&
             fg_backend_read(be, h.meta[p], c->meta[p], L->meta_bytes) == FG_OK;
    }
    EXPECT(ok, "%s: a cache read back", be->ops->name);
    return h;
}

static void host_cache_free(host_cache *h) {
    free(h->mem);
    free(h->pages);
    free(h->meta);
}

/* A head as a prefill would leave it: a random profile, a policy, its kept rows. */
typedef struct sim_head {
    fg_policy pol;
    uint32_t comp;
    fg_score_mode mode;
    int32_t t, n_slots, n_freq;
    uint8_t *cls; /* [cap] classes of every position */
} sim_head;

static void compact_one(fg_backend *be, const fg_page_layout *L, const fg_shape *sh, int32_t n, const float *k,
                        const float *v, int32_t g, const int32_t *pos, const uint8_t *flags, const float *score,
                        int32_t n_keep, head_cache *c) {
    fg_compact_head ch = {.kv_head = g, .n_keep = n_keep, .pos = pos, .flags = flags, .score = score,
                          .pages = c->pages, .meta = c->meta};
    EXPECT(be->ops->compact(be, L, sh, n, k, v, 1, &ch) == FG_OK, "compact");
    c->row_base = n_keep; /* the first step sets hw = n_keep, nfree = 0 */
}

/* The first n_slots slots of two caches, each read back through its
 * backend, compared byte for byte: row ids, K and V rows, pos and flags. */
static int pages_equal(const fg_page_layout *L, fg_backend *ba, const head_cache *a, fg_backend *bb,
                       const head_cache *b, int32_t n_slots) {
    host_cache x = cache_read(ba, L, a), y = cache_read(bb, L, b);
    int same = 1;
    for (int32_t s = 0; s < n_slots && same; s++)
        same = *fg_slot_row(L, x.meta, s) == *fg_slot_row(L, y.meta, s) &&
               !memcmp(fg_slot_k(L, x.pages, x.meta, s), fg_slot_k(L, y.pages, y.meta, s), L->k_row_bytes) &&
               !memcmp(fg_slot_v(L, x.pages, x.meta, s), fg_slot_v(L, y.pages, y.meta, s), L->v_row_bytes) &&
               *fg_slot_pos(L, x.meta, s) == *fg_slot_pos(L, y.meta, s) &&
               *fg_slot_flags(L, x.meta, s) == *fg_slot_flags(L, y.meta, s);
    host_cache_free(&x);
    host_cache_free(&y);
    return same;
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* Kept positions, sorted (slot order may differ between backends). */
static void kept_positions(fg_backend *be, const fg_page_layout *L, const head_cache *c, int32_t n, int32_t *pos) {
    fg_backend_read_slots(be, L, c->meta, n, pos, NULL, NULL);
    qsort(pos, (size_t)n, sizeof *pos, cmp_i32);
}

/* Queries rounded to bf16 values in check_decode: the cpu backend's
 * vdpbf16ps kernel (bf16 caches on AVX512_BF16) rounds the query to bf16,
 * so with such queries it must agree with ref as tightly as the f32 FMA
 * kernels do. */
static int g_bf16_queries;
/* check_decode with caches as a fork finds them (fg_head_share): every
 * compacted row shared, so the steps take fresh rows and must leave the
 * shared ones as they were. Even heads are a fork's copy (its new rows in
 * pages past the shared ones), odd heads its source (its new rows from
 * the kept ones on, in the last shared page first). */
static int g_shared_rows;
/* check_decode with heads that rank together (FG_ALLOC_LAYER) in groups of
 * g_share consecutive heads, which must have the same length and policy:
 * they get the same classes and profile (so the same kept rows) and their
 * own K, V and Q. 0: every head alone. */
static int32_t g_share;
/* check_decode with a query value of 3e7 in the first block of head 1's
 * queries: a block whose q8_0 scale overflows fp16, so a quantized K dots
 * it unrounded (fg_query_q8_row) and the cpu backend leaves the integer
 * dots for that head's step. */
static int g_big_query;
/* sharp: queries 8x larger, so a head's scores spread over tens of units and
 * most of its probabilities are tiny (below f16's subnormals for the
 * tensor-core kernel's parts of P) */
static int g_sharp;
/* V's dtype apart from K's (dt) in the cases below, or -1: V as K */
static int g_v_dtype = -1;
/* check_decode with non-finite inputs (poison_head): NaN or infinite scores
 * that every backend must turn into non-finite outputs exactly where ref
 * does (the vector exponential once clamped NaN to a weight near 0), and
 * non-finite ranks that every backend evicts by one rule (a NaN rank as
 * -inf: evicted first, the older first among equals). */
static int g_poison;

/* Head i's poison (g_poison), by i % 4: a prompt key with +inf and -inf
 * lanes (NaN or infinite scores for every query); a NaN in the query of
 * step 1; a -inf lane in the key decoded at step 2; a prompt key of +-1e38
 * where the cache cannot hold it (its q8_0 / q4_0 scale and its fp16 value
 * overflow; in f32 or bf16 whether its dot overflows depends on the order
 * of the sums, which backends do not share: such a key is left out). */
static void poison_head(int32_t i, int32_t len, int32_t G, int32_t d, fg_dtype dt, float *K, float *Q) {
    switch (i % 4) {
    case 0:
        K[(size_t)(len / 2) * d] = INFINITY;
        K[(size_t)(len / 2) * d + 1] = -INFINITY;
        break;
    case 1: Q[(size_t)(len + 1) * G * d] = NAN; break;
    case 2: K[(size_t)(len + 2) * d] = -INFINITY; break;
    default:
        for (int32_t c = 0; c < d && dt != FG_DTYPE_F32 && dt != FG_DTYPE_BF16; c++)
            K[(size_t)(len / 3) * d + c] = c % 2 ? -1e38f : 1e38f;
    }
}


static fg_page_layout layout_of(int32_t page_tokens, int32_t d, fg_dtype dt) {
    return fg_page_layout_make(page_tokens, d, dt, g_v_dtype < 0 ? dt : (fg_dtype)g_v_dtype);
}

/* Decode over a batch of heads of the given lengths and policies, `steps` steps.
 * ties: zero queries (every row gets the same attention) and integer profile
 * scores, so evictions are decided by the tie rule (the older row goes). */
static void check_decode(backend_pair *bp, int32_t d, int32_t G, fg_dtype dt, int32_t page_tokens, int32_t n_heads,
                         const int32_t *lengths, const uint32_t *comps, int32_t steps, int ties) {
    const fg_shape sh = {G, 1, d}; /* every head of the batch is KV head 0 of its own sequence */
    const fg_page_layout L = layout_of(page_tokens, d, dt);
    fg_backend *bes[3] = {&bp->ref, &bp->one, &bp->two};
    int32_t max_len = 0, min_len = lengths[0];
    for (int32_t i = 0; i < n_heads; i++) {
        max_len = lengths[i] > max_len ? lengths[i] : max_len;
        min_len = lengths[i] < min_len ? lengths[i] : min_len;
    }
    const int32_t cap = max_len + steps + 1 + page_tokens; /* shared rows: up to a page past the compacted ones */
    sim_head *hs = calloc((size_t)n_heads, sizeof *hs);
    head_cache(*caches)[3] = calloc((size_t)n_heads, sizeof *caches);
    float **K = calloc((size_t)n_heads, sizeof *K), **V = calloc((size_t)n_heads, sizeof *V);
    float **Q = calloc((size_t)n_heads, sizeof *Q);
    int32_t *pos = malloc((size_t)cap * sizeof *pos), *pos2 = malloc((size_t)cap * sizeof *pos2);
    uint8_t *flags = malloc((size_t)cap);
    float *score = malloc((size_t)cap * sizeof *score), *col = malloc((size_t)cap * sizeof *col);
    float *cl = malloc((size_t)cap * sizeof *cl);
    fg_rank_entry *rank = malloc((size_t)cap * sizeof *rank);
    for (int32_t i = 0; i < n_heads; i++) {
        sim_head *h = &hs[i];
        h->t = lengths[i];
        h->pol = (fg_policy){comps[i], 0.25f, 0.125f, 0, 0};
        h->comp = fg_effective_components(comps[i]);
        const int32_t lead = g_share > 1 ? i - i % g_share : i; /* the first of its group */
        h->mode = (fg_score_mode)((g_share > 1 ? i / g_share : i) % 3); /* sum, mean, last */
        h->cls = malloc((size_t)cap);
        for (int32_t p = 0; p < cap; p++) {
            int32_t r = rng_int(0, 99);
            h->cls[p] = r < 3 ? FG_TOKEN_SPECIAL : r < 15 ? FG_TOKEN_PUNCT : FG_TOKEN_ORDINARY;
        }
        if (lead != i) {
            EXPECT(lengths[i] == lengths[lead] && comps[i] == comps[lead], "check_decode: group of %d unlike", (int)i);
            memcpy(h->cls, hs[lead].cls, (size_t)cap);
        }
        K[i] = malloc((size_t)cap * d * sizeof(float));
        V[i] = malloc((size_t)cap * d * sizeof(float));
        Q[i] = malloc((size_t)cap * G * d * sizeof(float));
        fill(K[i], (size_t)cap * d, 1.5f);
        fill(V[i], (size_t)cap * d, 1.0f);
        fill(Q[i], (size_t)cap * G * d, ties ? 0.0f : g_sharp ? 12.0f : 1.5f);
        for (size_t c = 0; g_bf16_queries && c < (size_t)cap * G * d; c++)
            Q[i][c] = fg_bf16_to_f32(fg_f32_to_bf16(Q[i][c]));
        for (int32_t t = 0; g_big_query && i == 1 && t < cap; t++)
            Q[i][(size_t)t * G * d + 5] = t % 2 ? 3e7f : -3e7f;
        if (g_poison)
            poison_head(i, lengths[i], G, d, dt, K[i], Q[i]);
        /* a prefill's state: a random profile through the real policy code */
        for (int32_t j = 0; j < h->t && lead == i; j++) { /* a group's heads: its first's profile */
            col[j] = ties ? (float)rng_int(0, 2) : (float)(rng_uniform() * 3.0);
            cl[j] = col[j] * 0.5f;
        }
        fg_compression_params cp;
        fg_compression_params_default(&cp);
        cp.n_policies = 1;
        cp.shortlist[0] = h->pol;
        cp.score_mode = h->mode;
        fg_profile_view pv = {.n = h->t, .row_begin = 0, .length = h->t, .cls = h->cls, .col = col, .col_local = {cl}};
        h->n_slots = fg_policy_keep(&cp, &cp.shortlist[0], &pv, rank, pos, NULL, flags, score, &h->n_freq);
        for (int b = 0; b < 3; b++) {
            cache_alloc(bes[b], &L, cap, &caches[i][b]);
            compact_one(bes[b], &L, &sh, h->t, K[i], V[i], 0, pos, flags, score, h->n_slots, &caches[i][b]);
            if (g_shared_rows)
                caches[i][b].priv_from = caches[i][b].row_base =
                    i % 2 ? h->n_slots : (h->n_slots + page_tokens - 1) / page_tokens * page_tokens;
        }
        /* the second instance of a backend that keeps page tables reads them from its memory (the core's
           path), the first gets them from the host each step: their outputs must be the same bits */
        if (bes[2]->ops->device_tables)
            EXPECT(bes[2]->ops->buffer_alloc(bes[2], 2 * (size_t)caches[i][2].n_pages * sizeof(void *),
                                             (void **)&caches[i][2].tab) == FG_OK,
                   "%s: a page table's memory", bp->name);
    }
    /* the shared rows as compaction left them (ref's) */
    host_cache *before = calloc((size_t)n_heads, sizeof *before);
    for (int32_t i = 0; g_shared_rows && i < n_heads; i++)
        before[i] = cache_read(&bp->ref, &L, &caches[i][0]);
    fg_decode_head *dh[3];
    float *out[3];
    for (int b = 0; b < 3; b++) {
        dh[b] = calloc((size_t)n_heads, sizeof *dh[b]);
        out[b] = guarded((size_t)n_heads * G * d);
    }
    double worst = 0.0;
    int same_sets = 1, same_threads = 1, guards = 1, same_group = 1, same_mask = 1;
    size_t finite = 0, outputs = 0;
    int32_t *lead_pos = malloc((size_t)cap * sizeof *lead_pos);
    for (int32_t step = 0; step < steps; step++) {
        fg_step_plan plans[64];
        for (int32_t i = 0; i < n_heads; i++) {
            sim_head *h = &hs[i];
            plans[i] = fg_plan_step(&h->pol, h->t + 1, h->cls, h->cls[h->t], h->n_slots, h->n_freq);
            for (int b = 0; b < 3; b++)
                dh[b][i] = (fg_decode_head){.pages = caches[i][b].pages, .meta = caches[i][b].meta,
                                            .n_pages = caches[i][b].n_pages, .priv_from = caches[i][b].priv_from,
                                            .row_base = caches[i][b].row_base, .n_slots = h->n_slots,
                                            .n_slots_after = plans[i].n_slots, .components = h->comp,
                                            .score_mode = h->mode, .pos = h->t, .insert_flag = plans[i].insert_flag,
                                            .window_start = plans[i].window_start, .freq_budget = plans[i].freq_budget,
                                            .q = Q[i] + (size_t)h->t * G * d, .k = K[i] + (size_t)h->t * d,
                                            .v = V[i] + (size_t)h->t * d, .out = out[b] + (size_t)i * G * d,
                                            .share_first = g_share > 1 ? i - i % g_share : i, .share_n = g_share};
            head_cache *c2 = &caches[i][2];
            if (c2->tab) { /* written whole the first step; later a tail of it again, as after a page added */
                dh[2][i].tab = c2->tab;
                dh[2][i].tab_cap = c2->n_pages;
                dh[2][i].tab_valid = step == 0 ? 0 : (step * 7 + i) % (c2->n_pages + 1);
            }
        }
        if (bes[2]->ops->device_tables && step == 0) { /* tables that do not hold the step's pages: refused */
            fg_decode_head bad[64];
            memcpy(bad, dh[2], (size_t)n_heads * sizeof *bad);
            bad[n_heads - 1].tab_valid = bad[n_heads - 1].n_pages + 1;
            EXPECT(bes[2]->ops->decode_step(bes[2], &L, &sh, n_heads, bad) == FG_ERR_INTERNAL,
                   "%s decode_step takes a table with more valid entries than pages", bp->name);
            bad[n_heads - 1].tab_valid = 0;
            bad[n_heads - 1].tab_cap = bad[n_heads - 1].n_pages - 1;
            EXPECT(bes[2]->ops->decode_step(bes[2], &L, &sh, n_heads, bad) == FG_ERR_INTERNAL,
                   "%s decode_step takes a table smaller than its pages", bp->name);
        }
        for (int b = 0; g_share > 1 && step == 0 && b < 3; b++) { /* a group broken: refused before any write */
            fg_decode_head broken[64];
            memcpy(broken, dh[b], (size_t)n_heads * sizeof *broken);
            broken[1].share_n = 0;
            EXPECT(bes[b]->ops->decode_step(bes[b], &L, &sh, n_heads, broken) == FG_ERR_INTERNAL,
                   "%s decode_step takes a group whose second head is alone", b ? bp->name : "ref");
            broken[1].share_n = g_share;
            broken[0].share_first = 1;
            EXPECT(bes[b]->ops->decode_step(bes[b], &L, &sh, n_heads, broken) == FG_ERR_INTERNAL,
                   "%s decode_step takes a group that its first head does not open", b ? bp->name : "ref");
        }
        for (int b = 0; b < 3; b++)
            EXPECT(bes[b]->ops->decode_step(bes[b], &L, &sh, n_heads, dh[b]) == FG_OK, "%s decode_step: %s",
                   b ? bp->name : "ref", fg_last_error(NULL));
        const size_t n_out = (size_t)n_heads * G * d;
        const double e = g_poison ? nmse_finite(out[1], out[0], n_out, &same_mask, &finite) : nmse(out[1], out[0], n_out);
        outputs += n_out;
        worst = e > worst ? e : worst;
        same_threads &= memcmp(out[1], out[2], (size_t)n_heads * G * d * sizeof(float)) == 0;
        guards &= guard_ok(out[1], (size_t)n_heads * G * d) && guard_ok(out[2], (size_t)n_heads * G * d);
        for (int32_t i = 0; i < n_heads; i++) {
            sim_head *h = &hs[i];
            h->n_slots = plans[i].n_slots;
            h->n_freq = plans[i].n_freq;
            h->t++;
            for (int b = 0; b < 3; b++)
                caches[i][b].row_base = -1;
            kept_positions(&bp->ref, &L, &caches[i][0], h->n_slots, pos);
            kept_positions(bes[1], &L, &caches[i][1], h->n_slots, pos2);
            same_sets &= memcmp(pos, pos2, (size_t)h->n_slots * sizeof *pos) == 0;
            kept_positions(bes[2], &L, &caches[i][2], h->n_slots, pos2);
            same_threads &= memcmp(pos, pos2, (size_t)h->n_slots * sizeof *pos) == 0;
            if (g_share > 1 && i % g_share == 0)
                memcpy(lead_pos, pos, (size_t)h->n_slots * sizeof *pos);
            else if (g_share > 1) /* the group keeps one set of rows */
                same_group &= h->n_slots == hs[i - i % g_share].n_slots &&
                              memcmp(pos, lead_pos, (size_t)h->n_slots * sizeof *pos) == 0;
        }
    }
    /* 16-bit rows: their rounding. bf16 rows on AVX512_BF16 (G = 8) also
     * round the query to bf16, 2^-8 of each element at most (8 significant
     * bits), so a score moves by at most e = 2^-8 sum_c |q_c k_c| / sqrt(d):
     * about 2^-8 0.56 sqrt(d) for these values, 0.025 at d = 128, a worst
     * case that needs every rounding error aligned with its product's sign
     * (e^2 = 6e-4). The errors are independent, of either sign and about
     * 2^-8 / sqrt(3) rms, so the typical move is 2^-8 / sqrt(3) rms(q k)
     * = 3e-3 0.75, about 1e-3 at any d, and the output's NMSE of order 1e-6
     * (measured: 3.8e-6 at d = 128, 1.9e-6 at d = 64), far inside the limit.
     * Queries that are bf16 values already: summation order only, as the
     * f32 kernels. */
    /* q8_0 / q4_0 rows: every backend stores the same bytes (compact
     * compares them) and reads a value back as q * scale, which fp32 holds
     * exactly (an 8-bit integer times an fp16 scale has at most 19
     * significant bits): the same values as f32 rows, dotted with the same
     * rounded query (fg_query_q8_row, the cpu backend's integer dots
     * included: their sums are exact), so only the order of the sums
     * differs, the f32 limit. Each backend quantizes the rows it
     * inserts with the same arithmetic (fg_quantize_q8_0 / _q4_0, IEEE
     * division and roundf on every device), so the kept sets stay exact. */
    /* GPU kernels read 16-bit rows exactly and compute in f32 (the tensor-core kernel's 16-bit parts
       included): the f32 limit for every dtype */
    const int gpu = !strcmp(bp->name, "cuda") || !strcmp(bp->name, "hip");
    const double limit = gpu || dt == FG_DTYPE_F32 || fg_dtype_quantized(dt) || g_bf16_queries ? 1e-8 : 5e-4;
    char dn[16]; /* K's dtype, then V's when apart */
    snprintf(dn, sizeof dn, "%s%s%s", fg_dtype_name(dt), g_v_dtype < 0 ? "" : "/",
             g_v_dtype < 0 ? "" : fg_dtype_name((fg_dtype)g_v_dtype));
    EXPECT(worst <= limit, "%s decode d=%d G=%d %s: NMSE %.3g", bp->name, (int)d, (int)G, dn, worst);
    EXPECT(same_sets, "%s decode d=%d G=%d %s: kept sets differ from ref", bp->name, (int)d, (int)G, dn);
    EXPECT(same_mask, "%s decode d=%d G=%d %s: outputs not finite where ref's are finite, or the reverse", bp->name,
           (int)d, (int)G, dn);
    if (g_poison) /* the poison reached some outputs, and left others finite */
        EXPECT(finite > 0 && finite < outputs, "%s decode d=%d G=%d %s poisoned: %zu of %zu outputs finite",
               bp->name, (int)d, (int)G, dn, finite, outputs);
    EXPECT(same_threads, "%s decode: 1 and 2 threads differ", bp->name);
    EXPECT(same_group, "%s decode: heads that rank together keep different rows", bp->name);
    free(lead_pos);
    EXPECT(guards, "%s decode wrote past its output", bp->name);
    /* shared rows: every backend left them as they were */
    int untouched = 1;
    for (int32_t i = 0; g_shared_rows && i < n_heads; i++) {
        for (int b = 0; b < 3; b++) {
            host_cache now = cache_read(bes[b], &L, &caches[i][b]);
            for (int32_t r = 0; r < caches[i][0].priv_from; r++)
                untouched &= memcmp(fg_row_k(&L, now.pages, r), fg_row_k(&L, before[i].pages, r), L.k_row_bytes) == 0 &&
                             memcmp(fg_row_v(&L, now.pages, r), fg_row_v(&L, before[i].pages, r), L.v_row_bytes) == 0;
            host_cache_free(&now);
        }
        host_cache_free(&before[i]);
    }
    free(before);
    EXPECT(untouched, "%s decode d=%d %s: a step wrote a shared row", bp->name, (int)d, dn);
    printf("  %-4s decode d=%-3d G=%d %-9s page=%-2d heads=%d (rows %d..%d) steps=%-3d NMSE %.1e\n", bp->name, (int)d,
           (int)G, dn, (int)page_tokens, (int)n_heads, (int)min_len, (int)max_len, (int)steps, worst);
    for (int32_t i = 0; i < n_heads; i++) {
        for (int b = 0; b < 3; b++)
            cache_free(bes[b], &caches[i][b]);
        free(hs[i].cls);
        free(K[i]);
        free(V[i]);
        free(Q[i]);
    }
    for (int b = 0; b < 3; b++) {
        free(dh[b]);
        free(out[b]);
    }
    free(hs);
    free(caches);
    free(K);
    free(V);
    free(Q);
    free(pos);
    free(pos2);
    free(flags);
    free(score);
    free(col);
    free(cl);
    free(rank);
}

/* ------------------------------------------------------------------ compact */

static void check_compact(backend_pair *bp, int32_t d, fg_dtype dt, int32_t n) {
    const int32_t Hkv = 3;
    const fg_shape sh = {Hkv, Hkv, d};
    const fg_page_layout L = layout_of(16, d, dt);
    float *k = malloc((size_t)n * Hkv * d * sizeof(float)), *v = malloc((size_t)n * Hkv * d * sizeof(float));
    fill(k, (size_t)n * Hkv * d, 2.0f);
    fill(v, (size_t)n * Hkv * d, 2.0f);
    k[0] = 1e-6f; /* an fp16 subnormal, and values near the fp16 limits */
    k[1] = 65519.0f;
    v[0] = -3e-8f;
    if (fg_dtype_quantized(dt)) /* blocks with edge cases (head 2, the one compacted, kept below) */
        for (int32_t c = 0; c < d; c++) {
            k[(0 * Hkv + 2) * (size_t)d + c] = c ? 0.0f : -0.0f;           /* all zero, -0 first */
            k[(1 * Hkv + 2) * (size_t)d + c] = c == 3 ? NAN : (float)c;    /* a NaN */
            k[(2 * Hkv + 2) * (size_t)d + c] = 0.75f;                      /* all equal */
            k[(3 * Hkv + 2) * (size_t)d + c] = c % 2 ? -2.5f : 2.5f;       /* the largest magnitude twice, signs apart */
            v[(3 * Hkv + 2) * (size_t)d + c] = c % 3 ? 1e-30f : -1e30f;    /* tiny and huge */
        }
    int32_t *pos = malloc((size_t)n * sizeof *pos), kept = 0;
    uint8_t *flags = malloc((size_t)n);
    float *score = malloc((size_t)n * sizeof *score);
    for (int32_t j = 0; j < n; j++)
        if (rng_int(0, 2) || (fg_dtype_quantized(dt) && j < 4)) {
            pos[kept] = j;
            flags[kept] = FG_SLOT_FREQUENT;
            score[kept++] = (float)j;
        }
    head_cache a, b;
    cache_alloc(&bp->ref, &L, kept + 1, &a);
    cache_alloc(&bp->one, &L, kept + 1, &b);
    compact_one(&bp->ref, &L, &sh, n, k, v, 2, pos, flags, score, kept, &a);
    compact_one(&bp->one, &L, &sh, n, k, v, 2, pos, flags, score, kept, &b);
    EXPECT(pages_equal(&L, &bp->ref, &a, &bp->one, &b, kept), "%s compact d=%d dtype %d: pages differ from ref", bp->name, (int)d, (int)dt);
    cache_free(&bp->ref, &a);
    cache_free(&bp->one, &b);
    free(k);
    free(v);
    free(pos);
    free(flags);
    free(score);
}

/* ------------------------------------------------------------------ the adaptive mode's ops */

static double nmse_d(const double *a, const double *ref, size_t n) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        num += (a[i] - ref[i]) * (a[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return den > 0.0 ? num / den : num;
}

/* adaptive_observe and adaptive_errors on one unit: a full cache of t rows
 * (slot j = position j), W observed rows (the last ones and a few earlier),
 * random entry levels for two sets, both error modes. poison: V row t / 2
 * holds an infinite lane, head 0 of every observed row
 * ignores it (its query points away from that key) and head 1 attends it
 * evenly (a query of 0): where a row sees the key its errors are not finite,
 * elsewhere they are, on every backend alike. */
static void check_adaptive(backend_pair *bp, int32_t d, int32_t G, fg_dtype dt, int32_t t, int32_t W, int poison) {
    enum { SETS = 2, LEVELS = 41 };
    const fg_shape sh = {G, 1, d};
    const fg_page_layout L = layout_of(16, d, dt);
    float *k = malloc((size_t)t * d * sizeof *k), *v = malloc((size_t)t * d * sizeof *v);
    float *q = malloc((size_t)W * G * d * sizeof *q), *score = calloc((size_t)t, sizeof *score);
    int32_t *pos = malloc((size_t)t * sizeof *pos), *rows = malloc((size_t)W * sizeof *rows);
    uint8_t *flags = malloc((size_t)t), *entry = malloc((size_t)SETS * W * t);
    fill(k, (size_t)t * d, 1.0f);
    fill(v, (size_t)t * d, 1.0f);
    fill(q, (size_t)W * G * d, 3.0f); /* peaked attention: some of it negligible */
    const int32_t j0 = t / 2;
    if (poison) {
        v[(size_t)j0 * d] = INFINITY;
        for (int32_t i = 0; i < W; i++)
            for (int32_t x = 0; x < d; x++) {
                q[((size_t)i * G + 0) * d + x] = -40.0f * k[(size_t)j0 * d + x];
                q[((size_t)i * G + 1) * d + x] = 0.0f;
            }
    }
    for (int32_t j = 0; j < t; j++) {
        pos[j] = j;
        flags[j] = FG_SLOT_FULL;
    }
    for (int32_t i = 0; i < W; i++) /* the last rows, the first few spread before them */
        rows[i] = i < W / 4 ? (int32_t)((int64_t)(t - W) * i / (W / 4 + 1)) + i : t - W + i;
    for (size_t x = 0; x < (size_t)SETS * W * t; x++)
        entry[x] = (uint8_t)rng_int(0, LEVELS); /* LEVELS: kept at none */
    head_cache a, b;
    cache_alloc(&bp->ref, &L, t, &a);
    cache_alloc(&bp->one, &L, t, &b);
    compact_one(&bp->ref, &L, &sh, t, k, v, 0, pos, flags, score, t, &a);
    compact_one(&bp->one, &L, &sh, t, k, v, 0, pos, flags, score, t, &b);
    fg_backend *bes[3] = {&bp->ref, &bp->one, &bp->two};
    const head_cache *caches[3] = {&a, &b, &b};
    const size_t n_err = (size_t)W * SETS * LEVELS;
    float *col[3][2];
    double *err[3][2];
    void *scratch[3];
    for (int x = 0; x < 3; x++) {
        EXPECT(bes[x]->ops->buffer_alloc(bes[x], fg_observe_scratch_floats(t, W, G, d) * sizeof(float),
                                         &scratch[x]) == FG_OK, "scratch");
        const fg_observe_unit u = {caches[x]->pages, caches[x]->meta, caches[x]->n_pages, t, W, rows,
                                   (float *)scratch[x]};
        col[x][0] = guarded((size_t)t);
        col[x][1] = guarded((size_t)t);
        EXPECT(bes[x]->ops->adaptive_observe(bes[x], &L, &sh, &u, q, t - W / 2, col[x][0], col[x][1]) == FG_OK,
               "%s adaptive_observe", bes[x]->ops->name);
        for (int mass = 0; mass < 2; mass++) {
            err[x][mass] = malloc(n_err * sizeof(double));
            EXPECT(bes[x]->ops->adaptive_errors(bes[x], &sh, &u, SETS, LEVELS, entry, mass, err[x][mass]) == FG_OK,
                   "%s adaptive_errors", bes[x]->ops->name);
        }
    }
    const double e_all = nmse(col[1][0], col[0][0], (size_t)t), e_dec = nmse(col[1][1], col[0][1], (size_t)t);
    int finite = 1, pattern = 1, seen = 0;
    for (size_t x = 0; x < n_err; x++) {
        const int sees = poison && rows[x / (SETS * LEVELS)] >= j0; /* the row's keys reach the poisoned one */
        seen += sees;
        finite &= isfinite(err[1][1][x]) && (sees || (isfinite(err[1][0][x]) && err[1][0][x] >= 0.0));
        pattern &= (!isfinite(err[1][0][x])) == sees && (!isfinite(err[0][0][x])) == sees;
        if (sees) /* compared as 0 below: only which ones are not finite matters */
            err[0][0][x] = err[1][0][x] = err[2][0][x] = 0.0;
    }
    const double e_err = nmse_d(err[1][0], err[0][0], n_err), e_mass = nmse_d(err[1][1], err[0][1], n_err);
    EXPECT(finite, "%s adaptive d=%d G=%d: errors finite and >= 0", bp->name, (int)d, (int)G);
    EXPECT(!poison || (pattern && seen > 0), "%s adaptive d=%d G=%d: an infinite V row one head ignores: errors not "
           "finite only where a row sees it (%s)", bp->name, (int)d, (int)G, pattern ? "no row sees it" : "elsewhere");
    /* fp16/bf16/quantized rows are unpacked exactly: the same float keys and values as ref */
    EXPECT(e_all <= 1e-8 && e_dec <= 1e-8, "%s adaptive_observe d=%d G=%d t=%d W=%d dtype %d: NMSE col_all %.3g "
           "col_decode %.3g", bp->name, (int)d, (int)G, (int)t, (int)W, (int)dt, e_all, e_dec);
    EXPECT(e_err <= 1e-8 && e_mass <= 1e-8, "%s adaptive_errors d=%d G=%d t=%d W=%d dtype %d: NMSE %.3g, mass %.3g",
           bp->name, (int)d, (int)G, (int)t, (int)W, (int)dt, e_err, e_mass);
    EXPECT(guard_ok(col[1][0], (size_t)t) && guard_ok(col[1][1], (size_t)t) && guard_ok(col[2][0], (size_t)t) &&
               guard_ok(col[2][1], (size_t)t), "%s adaptive_observe wrote past its sums", bp->name);
    EXPECT(memcmp(col[1][0], col[2][0], (size_t)t * sizeof(float)) == 0 &&
               memcmp(col[1][1], col[2][1], (size_t)t * sizeof(float)) == 0 &&
               memcmp(err[1][0], err[2][0], n_err * sizeof(double)) == 0 &&
               memcmp(err[1][1], err[2][1], n_err * sizeof(double)) == 0,
           "%s adaptive ops: 1 and 2 threads differ", bp->name);
    printf("  %-4s adaptive d=%-3d G=%d t=%-5d W=%-2d dtype %d%s  NMSE col %.1e errors %.1e mass %.1e\n", bp->name,
           (int)d, (int)G, (int)t, (int)W, (int)dt, poison ? " (an infinite V row)" : "", e_all, e_err, e_mass);
    for (int x = 0; x < 3; x++) {
        bes[x]->ops->buffer_free(bes[x], scratch[x]);
        free(col[x][0]);
        free(col[x][1]);
        free(err[x][0]);
        free(err[x][1]);
    }
    cache_free(&bp->ref, &a);
    cache_free(&bp->one, &b);
    free(k);
    free(v);
    free(q);
    free(score);
    free(pos);
    free(rows);
    free(flags);
    free(entry);
}

/* ---- the cases: each a function, named in k_cases (--filter, --list) */

/* The components, short, in the cases below. */
#define S FG_KEEP_SPECIAL
#define P FG_KEEP_PUNCT
#define F FG_KEEP_FREQUENT
#define L FG_KEEP_LOCAL
#define N FG_KEEP_SNAPSHOT

/* prefill_attention and profile_stats: odd and real shapes */
static void case_prompt(backend_pair *bp) {
    const int32_t prompt[][5] = {
        /* d, G, Hkv, n, row_begin */
        {64, 1, 2, 1, 0},    {64, 4, 1, 2, 0},   {80, 1, 2, 3, 0},   {128, 8, 1, 17, 0}, {128, 4, 2, 255, 0},
        {256, 1, 1, 255, 100}, {7, 2, 3, 37, 0}, {80, 4, 1, 300, 290}, {64, 1, 1, 4099, 0},
        {200, 1, 1, 70, 33}, {320, 2, 1, 40, 5}, /* GPU: the last tiled shape, and the untiled kernels */
    };
    for (size_t c = 0; c < sizeof prompt / sizeof prompt[0]; c++)
        check_prompt(bp, prompt[c][0], prompt[c][1], prompt[c][2], prompt[c][3], prompt[c][4], 0);
    /* NaN and infinite scores (a query with a NaN, a key with infinities) */
    check_prompt(bp, 64, 4, 2, 300, 0, 1);
    check_prompt(bp, 128, 3, 1, 130, 40, 1);
    check_prompt(bp, 7, 2, 3, 37, 0, 1);
}

/* compact: every dtype, byte for byte */
static void case_compact(backend_pair *bp) {
    for (int dt = 0; dt < 3; dt++) {
        check_compact(bp, 128, (fg_dtype)dt, 300);
        check_compact(bp, 7, (fg_dtype)dt, 50);
        /* large enough for the cpu backend's non-temporal stores (about 2/3 of the rows are kept) */
        const size_t row = fg_row_bytes((fg_dtype)dt, 128);
        check_compact(bp, 128, (fg_dtype)dt, (int32_t)(FG_CPU_STREAM_BYTES / (2 * row) * 2));
    }
}

/* compact into q8_0 / q4_0 rows: blocks of 32, 16 and 8 values, byte for byte */
static void case_compact_quantized(backend_pair *bp) {
    for (int dt = FG_DTYPE_Q8_0; dt <= FG_DTYPE_Q4_0; dt++) {
        check_compact(bp, 128, (fg_dtype)dt, 300);
        check_compact(bp, 16, (fg_dtype)dt, 70);
        check_compact(bp, 24, (fg_dtype)dt, 50);
        check_compact(bp, 8, (fg_dtype)dt, 40);
        const size_t row = fg_row_bytes((fg_dtype)dt, 128);
        check_compact(bp, 128, (fg_dtype)dt, (int32_t)(FG_CPU_STREAM_BYTES / (2 * row) * 2));
    }
}

/* decode: batches of heads from 1 to 20000 rows, mixed policies */
static void case_decode_mixed(backend_pair *bp) {
    const uint32_t comps[] = {S, S | P, S | P | F, S | P | F | L, FG_KEEP_FULL, F | L, L, F};
    int32_t lengths[] = {1, 2, 3, 17, 255, 4099, 20000, 40};
    /* emulated GPU kernels (HIP-CPU) run about a hundred times slower than
       the device: there the two longest heads take 1100 and 2000 rows, still
       several chunks (8 blocks a multiprocessor, HIP-CPU's one a core); ref's
       side of the check takes most of the time under the sanitizers and in
       the runs of another ISA of the same kernels (the default run has the
       long head): there the longest head takes 6000 rows */
    fg_device_info_fn *device_info = (fg_device_info_fn *)fg_backend_get_proc(&bp->one, "device_info");
    fg_device_info info;
    const int emulated = device_info && device_info(&bp->one, &info) == FG_OK && info.emulated;
    const char *why = emulated               ? "emulated"
                      : FG_TEST_SANITIZED    ? "under the sanitizers"
                      : getenv("FG_CPU_ISA") ? "another ISA's run"
                                             : NULL;
    if (emulated) {
        lengths[5] = 1100;
        lengths[6] = 2000;
        printf("  %s: %s, the longest heads of decode-mixed cut from 4099 and 20000 rows to 1100 and 2000\n",
               bp->name, why);
    } else if (why) {
        lengths[6] = 6000;
        printf("  %s: %s, the longest head of decode-mixed cut from 20000 rows to 6000\n", bp->name, why);
    }
    const int32_t dims[] = {64, 80, 128, 256};
    const int32_t groups[] = {1, 4, 8};
    for (int r = 0; r < 9; r++) {
        const int32_t d = dims[r % 4], G = groups[r % 3];
        const fg_dtype dt = (fg_dtype)(r % 3);
        int32_t lens[8];
        uint32_t cs[8];
        for (int j = 0; j < 8; j++) {
            lens[j] = lengths[(j + r) % 8];
            cs[j] = comps[(j + 2 * r) % 8];
        }
        check_decode(bp, d, G, dt, r % 2 ? 16 : 5, 8, lens, cs, 6, 0);
    }
}

/* decode: the shapes no vector kernel takes (the cpu's plain step): head
 * dimensions of 7 and 12, groups of 20 (two passes of its 16 heads) and, on
 * the host backends, of 70 (more than FG_MAX_GROUP; the GPU kernels refuse
 * groups above 64), tracking heads among them */
static void case_decode_odd_dim(backend_pair *bp) {
    check_decode(bp, 7, 2, FG_DTYPE_F16, 3, 2, (const int32_t[]){9, 30}, (const uint32_t[]){S | P | F | L, F}, 20, 0);
    check_decode(bp, 12, 20, FG_DTYPE_BF16, 16, 3, (const int32_t[]){40, 300, 5}, /* the third head: FG_SCORE_LAST */
                 (const uint32_t[]){FG_KEEP_FULL, F, S | P | F | L}, 12, 0);
    if (!bp->one.ops->synchronize) /* a host backend */
        check_decode(bp, 64, 70, FG_DTYPE_F32, 16, 2, (const int32_t[]){100, 9}, (const uint32_t[]){F | L, F}, 4, 1);
}

/* decode: groups of more than 8 query heads (16-bit blocks widened once into scratch) */
static void case_decode_wide_groups(backend_pair *bp) {
    check_decode(bp, 64, 16, FG_DTYPE_F16, 16, 3, (const int32_t[]){3, 700, 1100},
                 (const uint32_t[]){S | P | F | L, FG_KEEP_FULL, F}, 6, 0);
    check_decode(bp, 128, 12, FG_DTYPE_BF16, 5, 2, (const int32_t[]){600, 40}, (const uint32_t[]){F | L, S | P}, 6, 0);
}

/* decode: ties everywhere: the older row is evicted first, on every backend alike */
static void case_decode_ties(backend_pair *bp) {
    check_decode(bp, 64, 4, FG_DTYPE_F32, 16, 4, (const int32_t[]){50, 300, 40, 120},
                 (const uint32_t[]){S | P | F | L, F | L, F, S | P | F}, 40, 1);
    check_decode(bp, 16, 1, FG_DTYPE_BF16, 4, 2, (const int32_t[]){64, 33}, (const uint32_t[]){F, F | L}, 40, 1);
}

/* decode: pages of 100 and 64 rows: the score scans' whole vectors and masked tails (SmolLM2's G = 3) */
static void case_decode_big_pages(backend_pair *bp) {
    check_decode(bp, 64, 3, FG_DTYPE_F16, 100, 3, (const int32_t[]){450, 130, 520},
                 (const uint32_t[]){S | P | F | L, F | L, F}, 16, 0);
    check_decode(bp, 64, 4, FG_DTYPE_F32, 64, 3, (const int32_t[]){350, 70, 600},
                 (const uint32_t[]){F, S | P | F | L, F | L}, 16, 1);
}

/* decode: groups of 3 and 7 (SmolLM2's; Qwen2.5-7B's: heads taken 2 + 1 and
 * 4 + 2 + 1 at a time), every dtype, odd row counts */
static void case_decode_groups_of_3(backend_pair *bp) {
    for (int dt = 0; dt <= FG_DTYPE_Q4_0; dt++) {
        check_decode(bp, 64, 3, (fg_dtype)dt, 16, 3, (const int32_t[]){301, 7, 1},
                     (const uint32_t[]){FG_KEEP_FULL, F | L, S | P | F | L}, 5, 0);
        check_decode(bp, 128, 7, (fg_dtype)dt, 16, 2, (const int32_t[]){133, 45},
                     (const uint32_t[]){F, FG_KEEP_FULL}, 5, 0);
    }
}

/* decode: bf16 caches with queries that are bf16 values: every kernel within f32 rounding of ref */
static void case_decode_bf16_queries(backend_pair *bp) {
    g_bf16_queries = 1;
    check_decode(bp, 128, 8, FG_DTYPE_BF16, 16, 4, (const int32_t[]){600, 33, 1100, 260},
                 (const uint32_t[]){S | P | F | L, FG_KEEP_FULL, F | L, F}, 12, 0);
    check_decode(bp, 64, 8, FG_DTYPE_BF16, 16, 3, (const int32_t[]){400, 700, 5},
                 (const uint32_t[]){F, FG_KEEP_FULL, S | P | F | L}, 12, 0);
    g_bf16_queries = 0;
}

/* decode: sharp attention (most probabilities tiny) over long heads, 16-bit rows at d = 64 and 128: the
 * tensor-core kernel's split of P must keep them as f32 does */
static void case_decode_sharp(backend_pair *bp) {
    g_sharp = 1;
    check_decode(bp, 64, 4, FG_DTYPE_F16, 16, 3, (const int32_t[]){3000, 700, 1500},
                 (const uint32_t[]){FG_KEEP_FULL, F | L, FG_KEEP_FULL}, 4, 0);
    check_decode(bp, 128, 8, FG_DTYPE_BF16, 16, 2, (const int32_t[]){2000, 900},
                 (const uint32_t[]){FG_KEEP_FULL, F}, 4, 0);
    check_decode(bp, 128, 3, FG_DTYPE_F16, 16, 2, (const int32_t[]){2500, 300},
                 (const uint32_t[]){F | L, FG_KEEP_FULL}, 4, 0);
    g_sharp = 0;
}

/* decode: NaN and infinite scores (poison_head) on every score mode, alone
 * and ranked together (TOVA's layer ranking), every cache dtype */
static void case_decode_nonfinite(backend_pair *bp) {
    g_poison = 1;
    for (int dt = 0; dt <= FG_DTYPE_Q4_0; dt++)
        check_decode(bp, 64, 3, (fg_dtype)dt, 16, 8, (const int32_t[]){90, 40, 70, 300, 33, 60, 120, 50},
                     (const uint32_t[]){F | L, F, F | L, S | P | F | L, F, F | L, FG_KEEP_FULL, F}, 8, 0);
    check_decode(bp, 128, 8, FG_DTYPE_F32, 16, 4, (const int32_t[]){700, 260, 1100, 90},
                 (const uint32_t[]){F | L, F, S | P | F | L, F}, 6, 0);
    g_share = 3; /* sum, mean, last per group: the third is TOVA's */
    check_decode(bp, 64, 4, FG_DTYPE_F32, 16, 9, (const int32_t[]){80, 80, 80, 50, 50, 50, 200, 200, 200},
                 (const uint32_t[]){F, F, F, F | L, F | L, F | L, F, F, F}, 8, 0);
    g_share = 0;
    g_poison = 0;
}

/* decode: kept sets identical for 500 steps */
static void case_decode_long(backend_pair *bp) {
    check_decode(bp, 64, 4, FG_DTYPE_F32, 16, 4, (const int32_t[]){50, 300, 7, 120},
                 (const uint32_t[]){S | P | F | L, F | L, F, S | P | F}, 500, 0);
}

/* decode: snapshots (SnapKV, AdaKV) beside TOVA's last-row scores (every third head) */
static void case_decode_snapshots(backend_pair *bp) {
    check_decode(bp, 64, 4, FG_DTYPE_F16, 16, 6, (const int32_t[]){200, 3000, 40, 9000, 120, 5},
                 (const uint32_t[]){N | L, S | N, F, N, S | N | L, F}, 40, 0);
    check_decode(bp, 128, 8, FG_DTYPE_BF16, 5, 3, (const int32_t[]){700, 64, 2500},
                 (const uint32_t[]){F, F | L, N | L}, 30, 1);
}

/* decode: heads that rank together (TOVA's FG_ALLOC_LAYER): groups of 3 and
 * 2 with every score mode, on the vector path and the plain one (d = 12),
 * long heads split into chunks, shared rows */
static void case_decode_layer(backend_pair *bp) {
    g_share = 3;
    check_decode(bp, 64, 3, FG_DTYPE_F16, 16, 9, (const int32_t[]){900, 900, 900, 40, 40, 40, 5000, 5000, 5000},
                 (const uint32_t[]){F, F, F, F | L, F | L, F | L, S | P | F, S | P | F, S | P | F}, 30, 0);
    check_decode(bp, 128, 4, FG_DTYPE_BF16, 5, 6, (const int32_t[]){300, 300, 300, 70, 70, 70},
                 (const uint32_t[]){F, F, F, F, F, F}, 30, 0);
    g_share = 2;
    check_decode(bp, 12, 2, FG_DTYPE_F32, 4, 4, (const int32_t[]){60, 60, 33, 33}, (const uint32_t[]){F, F, N | L, N | L},
                 20, 0);
    g_shared_rows = 1;
    check_decode(bp, 64, 2, FG_DTYPE_Q8_0, 16, 4, (const int32_t[]){200, 200, 90, 90},
                 (const uint32_t[]){F | L, F | L, F, F}, 40, 0);
    g_shared_rows = 0;
    g_share = 0;
}

/* The query a quantized K is dotted with (fg_query_q8_row): each block
 * exactly what fg_quantize_q8_0 stores, read back; a block with a NaN, an
 * inf or a scale past fp16 left bit for bit. */
static void check_query_rounding(void) {
    const int32_t dims[] = {128, 48, 24}; /* blocks of 32, 16 and 8 */
    for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
        const int32_t d = dims[di], qb = fg_qblock(d);
        float x[128], r[128];
        fill(x, (size_t)d, 2.0f);
        x[qb] = NAN;                            /* block 1: stays */
        x[2 * qb + 1] = d == 24 ? 1e7f : INFINITY; /* block 2: stays (d = 24: a scale past fp16) */
        fg_query_q8_row(r, x, d);
        int same_bytes = 1, kept = 1;
        for (int32_t b = 0; b < d / qb; b++) {
            unsigned char blk[34];
            fg_quantize_q8_0(blk, x + b * qb, qb);
            for (int32_t j = b * qb; j < (b + 1) * qb; j++) {
                if (b == 1 || b == 2)
                    kept &= memcmp(&r[j], &x[j], sizeof(float)) == 0;
                else
                    same_bytes &= r[j] == (float)fg_qvalue(blk, FG_DTYPE_Q8_0, qb, j - b * qb) * fg_get_f16(blk);
            }
        }
        EXPECT(same_bytes, "d=%d: the rounded query is not q8_0's values", (int)d);
        EXPECT(kept, "d=%d: a block that cannot round was changed", (int)d);
    }
}

/* decode on q8_0 / q4_0 rows: blocks of 32, 16 and 8 values, every ISA's
 * widths (d = 8 and 24: no 16-lane kernel), groups of 8 and above 8
 * (widened into scratch), long heads, a query block that cannot round */
static void case_decode_quantized(backend_pair *bp) {
    check_query_rounding();
    for (int dt = FG_DTYPE_Q8_0; dt <= FG_DTYPE_Q4_0; dt++) {
        check_decode(bp, 128, 4, (fg_dtype)dt, 16, 4, (const int32_t[]){600, 33, 4099, 260},
                     (const uint32_t[]){S | P | F | L, FG_KEEP_FULL, F | L, F}, 8, 0);
        check_decode(bp, 64, 3, (fg_dtype)dt, 16, 3, (const int32_t[]){400, 700, 5},
                     (const uint32_t[]){F, FG_KEEP_FULL, S | P | F | L}, 12, 0);
        check_decode(bp, 16, 1, (fg_dtype)dt, 4, 2, (const int32_t[]){64, 33}, (const uint32_t[]){F, F | L}, 20, 1);
        check_decode(bp, 8, 2, (fg_dtype)dt, 16, 2, (const int32_t[]){90, 300}, (const uint32_t[]){S | P | F | L, F},
                     20, 0);
        check_decode(bp, 24, 8, (fg_dtype)dt, 5, 2, (const int32_t[]){120, 41}, (const uint32_t[]){F | L, N | L}, 12, 0);
        check_decode(bp, 64, 12, (fg_dtype)dt, 16, 2, (const int32_t[]){700, 40}, (const uint32_t[]){F | L, S | P}, 6,
                     0);
        /* the integer dots' groups of 8: V widened 8 values at a time */
        check_decode(bp, 128, 8, (fg_dtype)dt, 16, 2, (const int32_t[]){300, 90},
                     (const uint32_t[]){F | L, S | P | F | L}, 10, 0);
        g_big_query = 1;
        check_decode(bp, 64, 2, (fg_dtype)dt, 16, 3, (const int32_t[]){300, 200, 100},
                     (const uint32_t[]){F | L, F, S | P | F | L}, 12, 0);
        g_big_query = 0;
    }
}

/* decode on rows a fork shares: new rows go to fresh ones and free ones
 * the head owns, evictions move metadata only when the hole's row is
 * shared, and no step writes a shared row (every policy, long enough for
 * free rows to be reused, odd pages, a quantized dtype) */
static void case_decode_shared(backend_pair *bp) {
    g_shared_rows = 1;
    check_decode(bp, 64, 4, FG_DTYPE_F16, 16, 6, (const int32_t[]){50, 300, 7, 120, 33, 200},
                 (const uint32_t[]){S | P | F | L, F | L, F, S | P | F, FG_KEEP_FULL, L}, 120, 0);
    check_decode(bp, 128, 8, FG_DTYPE_BF16, 5, 3, (const int32_t[]){700, 64, 250},
                 (const uint32_t[]){F, F | L, N | L}, 40, 1);
    check_decode(bp, 64, 3, FG_DTYPE_Q8_0, 16, 3, (const int32_t[]){400, 90, 5},
                 (const uint32_t[]){F | L, S | P | F | L, L}, 60, 0);
    g_shared_rows = 0;
}

/* K and V in two dtypes (llama.cpp's -ctk / -ctv): the cpu kernels widen
 * each block's rows with each one's loader, compaction stores each in its
 * own; every pair with a quantized or 16-bit side, groups below and above
 * 8 (the kernels' scratch path), odd pages, shared rows */
static void case_decode_kv_apart(backend_pair *bp) {
    if (!bp->one.ops->kv_apart) { /* a context on it refuses them (test_backend checks) */
        printf("  %s reads K and V in one dtype: nothing to compare\n", bp->name);
        return;
    }
    const int pairs[][2] = {{FG_DTYPE_Q8_0, FG_DTYPE_F16}, {FG_DTYPE_Q4_0, FG_DTYPE_F16}, {FG_DTYPE_F16, FG_DTYPE_Q8_0},
                            {FG_DTYPE_BF16, FG_DTYPE_F32}, {FG_DTYPE_Q8_0, FG_DTYPE_Q4_0}, {FG_DTYPE_F32, FG_DTYPE_BF16}};
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
        const fg_dtype kt = (fg_dtype)pairs[i][0];
        g_v_dtype = pairs[i][1];
        check_compact(bp, 64, kt, 70);
        check_decode(bp, 128, 4, kt, 16, 4, (const int32_t[]){600, 33, 1500, 260},
                     (const uint32_t[]){S | P | F | L, FG_KEEP_FULL, F | L, F}, 8, 0);
        check_decode(bp, 32, 12, kt, 5, 2, (const int32_t[]){120, 41}, (const uint32_t[]){F | L, N | L}, 12, 0);
        check_decode(bp, 16, 1, kt, 4, 2, (const int32_t[]){64, 33}, (const uint32_t[]){F, F | L}, 20, 1);
        /* 33 blocks of 8 a row: more scales than the per-dtype kernels hold, none kept by the mixed one */
        check_decode(bp, 264, 2, kt, 16, 2, (const int32_t[]){90, 40}, (const uint32_t[]){F | L, FG_KEEP_FULL}, 6, 0);
        g_shared_rows = 1;
        check_decode(bp, 64, 3, kt, 16, 3, (const int32_t[]){400, 90, 5}, (const uint32_t[]){F | L, S | P | F | L, L},
                     30, 0);
        g_shared_rows = 0;
    }
    g_v_dtype = -1;
}

#undef S
#undef P
#undef F
#undef L
#undef N

/* adaptive_observe, adaptive_errors: vector widths 16, 8 and none, the
 * group sizes (blocks of 4 heads and the rest), a cache of one row, stored
 * dtypes, a head dim past 256 */
static void case_adaptive(backend_pair *bp) {
    const int32_t shapes[][6] = {
        /* d, G, dtype, t, W, poison */
        {64, 1, FG_DTYPE_F32, 1, 1, 0},     {128, 4, FG_DTYPE_F32, 300, 64, 0}, {80, 2, FG_DTYPE_F16, 257, 16, 0},
        {7, 3, FG_DTYPE_F32, 50, 8, 0},     {128, 8, FG_DTYPE_BF16, 1100, 64, 0}, {64, 2, FG_DTYPE_Q8_0, 200, 32, 0},
        {300, 2, FG_DTYPE_F32, 90, 8, 0}, /* GPU: three chunks of columns */
        {64, 7, FG_DTYPE_F16, 130, 8, 0},   /* cpu: heads summed 4 and then 3 at a time */
        {64, 4, FG_DTYPE_F32, 200, 16, 1},  /* an infinite V row one head ignores and another attends */
    };
    for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++)
        check_adaptive(bp, shapes[c][0], shapes[c][1], (fg_dtype)shapes[c][2], shapes[c][3], shapes[c][4],
                       shapes[c][5]);
}

typedef struct op_case {
    const char *name;
    void (*run)(backend_pair *bp);
} op_case;

static const op_case k_cases[] = {
    {"prompt", case_prompt},
    {"compact", case_compact},
    {"decode-mixed", case_decode_mixed},
    {"decode-odd-dim", case_decode_odd_dim},
    {"decode-wide-groups", case_decode_wide_groups},
    {"decode-ties", case_decode_ties},
    {"decode-big-pages", case_decode_big_pages},
    {"decode-groups-of-3", case_decode_groups_of_3},
    {"decode-bf16-queries", case_decode_bf16_queries},
    {"decode-sharp", case_decode_sharp},
    {"decode-long", case_decode_long},
    {"decode-nonfinite", case_decode_nonfinite},
    {"decode-snapshots", case_decode_snapshots},
    {"decode-layer", case_decode_layer},
    {"compact-quantized", case_compact_quantized},
    {"decode-quantized", case_decode_quantized},
    {"decode-shared", case_decode_shared},
    {"decode-kv-apart", case_decode_kv_apart},
    {"adaptive", case_adaptive},
};

/* The ISA the cpu kernels take under FG_CPU_ISA, and without it. */
static void isa_levels(fg_cpu_isa *asked, fg_cpu_isa *best) {
    *asked = fg_cpu_features_probe().isa;
    const char *env = getenv("FG_CPU_ISA");
    char want[32] = "";
    if (env)
        snprintf(want, sizeof want, "%s", env);
    unsetenv("FG_CPU_ISA");
    *best = fg_cpu_features_probe().isa;
    if (want[0])
        setenv("FG_CPU_ISA", want, 1);
}

int main(int argc, char **argv) {
    test_seed("test_backend_ops");
    fg_cpu_isa asked, best;
    isa_levels(&asked, &best);
    if (getenv("FG_CPU_ISA") && asked == best) { /* the variant runs (backend_ops_<isa>) on a CPU whose best it is */
        printf("FG_CPU_ISA=%s gives the cpu kernels this CPU picks anyway (%s): the default run tests them; "
               "skipped\n", getenv("FG_CPU_ISA"), fg_cpu_isa_name(best));
        return 77;
    }
    const char *all[] = {"cpu", "cuda", "hip"}, *names[8], *filter = NULL;
    int n_names = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--list")) {
            for (size_t c = 0; c < sizeof k_cases / sizeof k_cases[0]; c++)
                printf("%s\n", k_cases[c].name);
            return 0;
        } else if (!strcmp(argv[i], "--filter") && i + 1 < argc) {
            filter = argv[++i];
        } else if (argv[i][0] == '-' || n_names == (int)(sizeof names / sizeof names[0])) {
            fprintf(stderr, "usage: test_backend_ops [--list] [--filter SUBSTRING] [backend...]\n");
            return 2;
        } else {
            names[n_names++] = argv[i];
        }
    }
    const int named = n_names > 0;
    if (!named)
        for (int i = 0; i < 3; i++)
            names[n_names++] = all[i];
    int ran = 0, cases = 0;
    for (size_t c = 0; c < sizeof k_cases / sizeof k_cases[0]; c++)
        cases += !filter || strstr(k_cases[c].name, filter) != NULL;
    if (cases == 0) {
        fprintf(stderr, "test_backend_ops: no case matches \"%s\" (--list names them)\n", filter);
        return 2;
    }
    fg_threadpool *two_threads = NULL; /* `two`: the kernels' tasks on two threads, `one` serially */
    EXPECT(fg_threadpool_create(2, &two_threads) == FG_OK, "a pool of two threads: %s", fg_last_error(NULL));
    for (int i = 0; i < n_names; i++) {
        backend_pair bp = {.name = names[i]};
        bp.ref.err = bp.one.err = bp.two.err = fg_error_to_stderr;
        fg_status st = fg_backend_probe(names[i]);
        if (st != FG_OK) {
            printf("%s: not tested: %s\n", names[i], fg_last_error(NULL));
            EXPECT(st == FG_ERR_UNAVAILABLE, "backend %s: %s", names[i], fg_status_string(st));
            EXPECT(!test_backend_required(), "backend %s is required here (FG_TEST_REQUIRE_BACKEND)", names[i]);
            continue;
        }
        fg_backend_open("ref", NULL, &bp.ref);
        fg_backend_open(names[i], NULL, &bp.one);
        fg_backend_open(names[i], two_threads, &bp.two);
        ran++;
        for (size_t c = 0; c < sizeof k_cases / sizeof k_cases[0]; c++)
            if (!filter || strstr(k_cases[c].name, filter)) {
                printf("%s %s\n", names[i], k_cases[c].name);
                k_cases[c].run(&bp);
            }
        fg_backend_close(&bp.ref);
        fg_backend_close(&bp.one);
        fg_backend_close(&bp.two);
    }
    fg_threadpool_destroy(&two_threads);
    if (ran == 0 && named && !test_backend_required()) /* the requested GPU backends are not here: skipped */
        return 77;
    EXPECT(ran > 0, "no backend besides ref was tested");
    return test_finish();
}
