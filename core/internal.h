/*
 * core/ internals: the context, its sequences and head caches, the page pool,
 * policy choice and the host mirror of the decode step. core/ knows nothing
 * about devices; it reaches memory only through the backend vtable.
 */
#ifndef FG_INTERNAL_H
#define FG_INTERNAL_H

#include <stdarg.h>
#include <stdatomic.h>

#include "backends/backend.h"
#include "fastgen.h"

/* ---- errors (core/status.c) */

/* Records a message (context and thread), logs it, returns status. ctx may be NULL. */
fg_status fg_error(fg_context *ctx, fg_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
fg_status fg_error_sink(void *ctx, fg_status status, const char *fmt, ...);
/* A step that may fail without failing its call (a tidy): the messages as
 * they were before it, put back by fg_error_restore, which logs the step's
 * own message as a warning (what: the step). */
typedef struct fg_error_saved {
    char ctx[512], thread[512];
} fg_error_saved;
void fg_error_save(const fg_context *ctx, fg_error_saved *saved);
void fg_error_restore(fg_context *ctx, const fg_error_saved *saved, const char *what);
/* Clears the context's message and the thread's (a call's start). */
void fg_error_clear(fg_context *ctx);

/* ---- public structs across header versions (core/params.c; fastgen.h's "Growth") */
/* The smallest size of each struct the library reads or writes: 0.2's
 * layout without its last field. 0.2 is the first version that passes
 * sizes (0.1 programs do not load: the soname changed), so these exist to
 * exercise the older-header path (test_errors) until a field is added, when
 * 0.2's sizeof becomes the oldest. */
#define FG_CONTEXT_PARAMS_OLDEST offsetof(fg_context_params, v_dtype)
#define FG_COMPRESSION_PARAMS_OLDEST offsetof(fg_compression_params, defer_until)
#define FG_HEAD_INFO_OLDEST offsetof(fg_head_info, kv_bytes_shared)
#define FG_MEMORY_STATS_OLDEST offsetof(fg_memory_stats, kv_bytes_alone)
/* A caller's struct of `size` bytes over the defaults in dst (dst_size
 * bytes): the fields it has are its, later ones keep their defaults; refused
 * below `oldest`, or above dst_size with a byte past it that is not zero
 * (a newer header's field). `what` names the struct in the message. */
fg_status fg_struct_read(void *dst, size_t dst_size, const void *src, size_t size, size_t oldest, const char *what);
/* src (src_size bytes) into the caller's struct of `size` bytes: the fields
 * it has; zero past src_size. Refused below `oldest`. */
fg_status fg_struct_write(void *dst, size_t size, const void *src, size_t src_size, size_t oldest, const char *what);
/* A caller's compression params (size bytes) read over the defaults and validated. */
fg_status fg_compression_params_read(fg_compression_params *dst, const fg_compression_params *src, size_t size);
/* Validation of a whole current-size struct. */
fg_status fg_compression_params_check(const fg_compression_params *p);
void fg_context_params_defaults(fg_context_params *p);

/* ---- budgets (core/params.c) */

#define FG_KEEP_ALL (FG_KEEP_SPECIAL | FG_KEEP_PUNCT | FG_KEEP_FREQUENT | FG_KEEP_LOCAL | FG_KEEP_FULL | FG_KEEP_SNAPSHOT)

/* w(t) = max(1, ceil(r_l t)), capped by local_tokens. */
int32_t fg_policy_window(const fg_policy *policy, int32_t t);
/* k(t) = ceil(r_f t), capped by frequent_tokens. */
int32_t fg_policy_frequent_budget(const fg_policy *policy, int32_t t);
/* The components a head really uses (full dominates everything). */
static inline uint32_t fg_effective_components(uint32_t c) { return (c & FG_KEEP_FULL) ? FG_KEEP_FULL : c; }
/* Whether the head's own special/punct components keep a token of class cls. */
static inline int fg_is_pinned(uint32_t components, uint8_t cls) {
    return (cls == FG_TOKEN_SPECIAL && (components & FG_KEEP_SPECIAL)) ||
           (cls == FG_TOKEN_PUNCT && (components & FG_KEEP_PUNCT));
}
/* The slot flag a new token of class cls is cached with, 0 = not cached (§2.5 step 3). */
uint8_t fg_insert_flag(uint32_t components, uint8_t cls);

/* ---- token classes (core/classes.c) */

fg_status fg_token_classes_clone(const fg_token_classes *src, fg_token_classes **out);
/* Pieces given as text that look like raw vocabulary strings: those holding
 * U+2581, and those starting with "Ġ" when they are 5% of the vocabulary or more. */
int32_t fg_token_classes_raw_looking(const fg_token_classes *tc);
/* Class of token `id` at position p, given the tokens before it (history[0..p)). */
uint8_t fg_token_classes_next(const fg_token_classes *tc, const int32_t *history, int32_t p, int32_t id,
                              int32_t n_sink);

/* ---- policy choice from profiling statistics (core/policy.c) */

/* The profile of one head: n keys, of which the rows [row_begin, n) were
 * profiled. A prompt's keys are its positions (pos NULL, length n); on a
 * re-profiling append they are the head's kept rows and the new tokens, at
 * increasing positions, in a sequence of `length` tokens. */
typedef struct fg_profile_view {
    int32_t n;                 /* keys */
    int32_t row_begin;         /* first profiled row */
    int32_t length;            /* tokens of the sequence: w(length), k(length) */
    const int32_t *pos;        /* [n] positions of the keys, increasing; NULL: 0..n-1 */
    const uint8_t *cls;        /* [n] token classes */
    const float *col;          /* [n] pooled attention each key received */
    const float *score;        /* [n] cumulative score to rank by; NULL: col */
    const float *rank;         /* [n] the ranks themselves (pooled, fg_policy_pool_ranks); NULL: from score */
    const float *col_local[FG_MAX_SHORTLIST]; /* per shortlist entry with local: [n] */
} fg_profile_view;

/* Scratch for the top-k selection: n entries. */
typedef struct fg_rank_entry {
    float rank;
    int32_t pos;
} fg_rank_entry;

/* Recovery of shortlist entry `entry` (§2.3). */
double fg_policy_recovery(const fg_compression_params *cp, int32_t entry, const fg_profile_view *pv,
                          fg_rank_entry *scratch);
/* rank[j]: the best rank within score_pool / 2 keys of j (the view's own
 * ranks: score or col, by score mode). */
void fg_policy_pool_ranks(const fg_compression_params *cp, const fg_profile_view *pv, float *rank);
/* Recoveries of every entry and the chosen index: the first >= T, else the
 * last; entries whose bit is set in `skip` are never chosen (the last entry
 * that is not, as the fallback). */
int32_t fg_policy_choose(const fg_compression_params *cp, const fg_profile_view *pv, uint32_t skip, float *recovery,
                         fg_rank_entry *scratch);
/* Key index where the window of a policy with `local` starts at the view's
 * length (n without local). */
int32_t fg_policy_window_start(const fg_policy *policy, const fg_profile_view *pv);
/* The distinct local windows w(t) of the shortlist's entries, appended to
 * req->window (req->n_windows of them), and for each entry e the index of
 * its window in window_of[e] (-1: the entry keeps no local window). */
void fg_shortlist_windows(const fg_compression_params *cp, int32_t t, fg_profile_request *req, int32_t *window_of);
/* Budget mode: choice[g] for each of n_heads heads, maximising the summed
 * recovery rec[g][e] within budget_rows summed cost[g][e] (both [n_heads][n_entries]):
 * every head starts at its cheapest entry, then the upgrade with the most
 * recovery gained per row added that still fits is taken, until none fits. */
void fg_policy_allocate(const double *rec, const int32_t *cost, int32_t n_heads, int32_t n_entries,
                        int64_t budget_rows, int32_t *choice);
/* FG_ALLOC_ADAKV: the layer's n_heads heads share n_heads x k(n) rows of
 * their one entry's frequent or snapshot part: each keeps its best
 * alloc_floor x k(n) candidates (all it has, if fewer), and the rest go to
 * the best-ranked remaining candidates of all heads together (ties: the
 * later position, then the higher head). share[g] receives head g's rows and
 * policies[g] its entry with that share (snapshot: a token cap; frequent:
 * the ratio scaled). Scratch: cand [n], rest [n_heads][n]. */
void fg_policy_share_rows(const fg_compression_params *cp, const fg_profile_view *views, int32_t n_heads,
                          fg_rank_entry *cand, fg_rank_entry *rest, int32_t *share, fg_policy *policies);
/* Sorts rank entries as every selection does: the higher rank first, ties
 * to the later position. */
void fg_policy_rank_sort(fg_rank_entry *entries, int32_t n);
/* Frequent set: sorts the candidates (unpinned positions below
 * exclude_from, i.e. outside the window) into scratch by rank and returns
 * k = min(k(n), candidates); the set is scratch[0..k). */
int32_t fg_policy_select_frequent(const fg_compression_params *cp, const fg_policy *policy, const fg_profile_view *pv,
                                  int32_t exclude_from, fg_rank_entry *scratch);
/* Rows the head keeps after the prompt (§2.4), in ascending position, with
 * their key indices in src (may be NULL). Returns the count; *n_freq
 * receives how many are frequent. flags must hold n entries. */
int32_t fg_policy_keep(const fg_compression_params *cp, const fg_policy *policy, const fg_profile_view *pv,
                       fg_rank_entry *scratch, int32_t *pos, int32_t *src, uint8_t *flags, float *score,
                       int32_t *n_freq);

/* ---- host mirror of one decode step (core/policy.c) */

typedef struct fg_step_plan {
    int32_t n_slots;      /* after the step */
    int32_t n_freq;       /* frequent rows after the step */
    uint8_t insert_flag;
    int32_t window_start; /* t - w(t), or 0 without local */
    int32_t freq_budget;  /* k(t), or 0 without frequent */
} fg_step_plan;

/* State (n_slots, n_freq) before adding position t - 1; cls[0..t-1) known,
 * cls_new the class of position t - 1. */
fg_step_plan fg_plan_step(const fg_policy *policy, int32_t t, const uint8_t *cls, uint8_t cls_new, int32_t n_slots,
                          int32_t n_freq);

/* ---- page pool (core/pool.c) */

typedef struct fg_pool_chunk {
    void *base;          /* NULL: released */
    int32_t n_free;
    int32_t *free_stack; /* [chunk_pages] */
    int32_t *refs;       /* [chunk_pages] owners of each page (forks share pages) */
} fg_pool_chunk;

typedef struct fg_pool {
    fg_backend *be;
    fg_context *ctx;     /* error sink */
    size_t page_bytes;
    int32_t chunk_pages;
    size_t max_bytes;    /* with the peer's bytes */
    const struct fg_pool *peer;
    fg_pool_chunk *chunks;
    int32_t n_chunks, cap_chunks;
    int32_t n_live;      /* chunks holding memory */
    int32_t free_hint;   /* no chunk below it has a free page */
    int32_t slot_hint;   /* no released slot below it */
    int64_t in_use;
} fg_pool;

void fg_pool_init(fg_pool *pool, fg_backend *be, fg_context *ctx, size_t page_bytes, int32_t chunk_pages,
                  size_t max_bytes);
void fg_pool_release(fg_pool *pool);
fg_status fg_pool_alloc(fg_pool *pool, int32_t *page_id, void **addr);
/* Drops one owner; the page returns to its chunk when the last one goes. */
void fg_pool_free(fg_pool *pool, int32_t page_id);
/* One more owner of a page (a fork). */
void fg_pool_ref(fg_pool *pool, int32_t page_id);
int fg_pool_shared(const fg_pool *pool, int32_t page_id);
/* Owners of a page. */
int32_t fg_pool_refs(const fg_pool *pool, int32_t page_id);
void fg_pool_trim(fg_pool *pool);
size_t fg_pool_bytes(const fg_pool *pool);
int64_t fg_pool_pages_total(const fg_pool *pool);

/* ---- context state (core/context.c creates it) */

typedef struct fg_head {
    int32_t policy_index;
    fg_policy pol;                       /* the head's own: its entry, with what an allocation changed */
    uint32_t components;                 /* effective components */
    float recovery[FG_MAX_SHORTLIST];
    int32_t n_slots;                     /* host mirror of the kept rows */
    int32_t n_freq;                      /* of which frequent */
    /* rows (common/slots.h): rows below priv_from may be shared with forks
     * (0: the head shares none and keeps slot s in row s); rows_bound bounds
     * the device's high water mark hw, which exceeds priv_from by at most
     * the rows kept; row_base >= 0 is a reset of the rows' counters the next
     * step makes; in_order: slot s is known to be in row s and no row at or
     * above n_slots is in use */
    int32_t priv_from, rows_bound, row_base;
    int32_t in_order;
    int32_t n_pages, cap_pages;          /* of each table */
    int32_t *page_ids;                   /* [cap_pages] row pages (ctx->pool) */
    void **pages;                        /* [cap_pages] backend addresses */
    int32_t *meta_ids;                   /* [cap_pages] meta pages (ctx->meta_pool) */
    void **meta;                         /* [cap_pages] backend addresses */
    /* Where the backend keeps page tables (ops->device_tables): both tables
     * in its memory, row pages at [0, tab_cap), meta pages from tab_cap;
     * entries [0, tab_valid) match pages[] and meta[] (tab_valid <= n_pages:
     * whatever changes an entry below it lowers it). A head owns its table:
     * a copy of the struct (a fork) starts without one. */
    void **tab;
    int32_t tab_cap, tab_valid;
} fg_head;

/* A shared meta page a decode step replaced by its own copy. */
typedef struct fg_cow_entry {
    fg_head *head;
    int32_t page;   /* index in the head's meta page table */
    int32_t old_id; /* the shared page */
    void *old_addr;
} fg_cow_entry;

/* A chunked prefill of one layer in progress: the prompt rows received so
 * far, held until the last chunk profiles the whole prompt (backend memory
 * with FG_IO_DEVICE, host memory otherwise). */
typedef struct fg_prefill_stage {
    int32_t filled;           /* rows received */
    float *q, *k, *v;         /* [n_prompt][H][d] */
    float *row_max, *row_sum; /* [Hq][n_prompt] */
} fg_prefill_stage;

/* ---- the adaptive mode (core/adaptive.c) */

/* What one layer of a sequence keeps until its heads are compressed. */
typedef struct fg_adaptive_layer {
    float *col;          /* [Hkv][n_prompt] pooled attention the prompt's rows gave each key */
    float *q;            /* [W][Hq][d] the queries of the last W rows */
    int32_t *pos;        /* [W] their positions */
    int32_t n_obs, next; /* rows held (at most W), the ring's next slot */
    /* FG_OBSERVE_EXPLICIT: what the rows fg_seq_observe gave leave behind */
    float *given_col;      /* [Hkv][given_keys] the pooled attention they gave each key (the ranks) */
    int32_t given_keys;    /* keys given_col spans: the sequence's length at the last observe */
    float *given;          /* [2 W][Hq][d] every stride-th of them, the errors' rows */
    int32_t n_given;       /* rows in `given` */
    int64_t seen, stride;  /* rows given so far; given holds the rows whose index is a multiple of stride */
    int32_t n_scored;      /* FG_OBSERVE_SCORES: fg_seq_observe_scores calls (their sums in given_col) */
} fg_adaptive_layer;

/* The observe modes whose sequences wait for fg_seq_compress (defer_until unused). */
static inline int fg_observe_when_told(fg_observe_mode m) {
    return m == FG_OBSERVE_EXPLICIT || m == FG_OBSERVE_SCORES;
}

typedef struct fg_adaptive {
    int32_t window;            /* W: rows observed */
    int32_t n_prompt;
    int32_t compress_at;       /* the length at which the heads are compressed (INT32_MAX: when told) */
    int explicit_rows;         /* FG_OBSERVE_EXPLICIT */
    int scored;                /* FG_OBSERVE_SCORES */
    int32_t horizon;           /* FG_OBSERVE_PREDICTED: its predict_horizon (> 0), else 0 */
    fg_adaptive_layer *layers; /* [n_layers] */
} fg_adaptive;

typedef struct fg_seq {
    int in_use;
    fg_compression_params cp;
    int32_t n_prompt;
    int32_t n_tokens;  /* known tokens (prompt + decoded at layer 0 or any layer) */
    int32_t *tokens;   /* [max_seq_len] */
    uint8_t *cls;      /* [max_seq_len] */
    int32_t *length;   /* [n_layers] t per layer, 0 = not prefilled */
    fg_head *heads;    /* [n_layers][Hkv] */
    fg_prefill_stage *stage; /* [n_layers] chunked prefills in progress, or NULL */
    fg_adaptive *ad;   /* FG_ALLOC_ADAPTIVE until the heads are compressed, else NULL */
    /* fork lineage, for the full cache a forked set would hold (fg_memory):
     * the live sequence whose first fork_len tokens this one shares, or -1 */
    int32_t parent, fork_len;
} fg_seq;

fg_status fg_adaptive_create(fg_context *ctx, const fg_compression_params *cp, int32_t n_prompt, fg_adaptive **out);
void fg_adaptive_destroy(fg_context *ctx, fg_adaptive **ad);
fg_status fg_adaptive_clone(fg_context *ctx, const fg_adaptive *src, fg_adaptive **out);
/* Row `pos` of `layer` joins the observed rows (its query, a host array [Hq][d]). */
void fg_adaptive_observe(const fg_context *ctx, fg_adaptive *ad, int32_t layer, int32_t pos, const float *q);
/* The observed rows of `layer` go (its prefill starts again). */
void fg_adaptive_forget(fg_adaptive *ad, int32_t layer);
/* Positions [first, last) of a pass whose rows start at position pos0 (q:
 * [][Hq][d] from pos0, activation memory) join the adaptive mode's observed
 * rows of `layer`. */
fg_status fg_observe_rows(fg_context *ctx, fg_seq *s, int32_t layer, int32_t pos0, int32_t first, int32_t last,
                          const float *q);
/* Shares the sequence's budget among every head of every layer and
 * prepares their compressed caches in new pages (nothing of the sequence
 * changes). trade puts them in place and takes the full caches and the
 * observed rows into the plan (a second trade undoes it); abort frees what
 * the plan holds (the new caches before a trade, the old ones after). */
typedef struct fg_adaptive_plan fg_adaptive_plan;
fg_status fg_adaptive_prepare(fg_context *ctx, fg_seq *s, fg_adaptive_plan **plan);
void fg_adaptive_trade(fg_seq *s, fg_adaptive_plan *plan);
void fg_adaptive_abort(fg_context *ctx, fg_adaptive_plan **plan);
/* Before a decode step at `layer`: the adaptive sequences of the batch
 * that every layer has brought to defer_until are compressed (all or
 * none); *plans holds what a failed step undoes (NULL when none were due).
 * After the step, end keeps the compressions (st == FG_OK) or undoes them,
 * and frees *plans. */
fg_status fg_adaptive_step_begin(fg_context *ctx, int32_t layer, int32_t n_seqs, const int32_t *seqs,
                                 fg_adaptive_plan ***plans);
void fg_adaptive_step_end(fg_context *ctx, int32_t n_seqs, const int32_t *seqs, fg_adaptive_plan **plans,
                          fg_status st);
/* prepare, trade and abort: the sequence compressed now, or as it was on failure. */
fg_status fg_adaptive_compress(fg_context *ctx, fg_seq *s);
/* A layer of s prefilled (n rows): an adaptive sequence observes the
 * prompt's last rows (q: the layer's queries; NULL when a chunked prefill
 * observed them already) and, its last layer in, compresses when its
 * defer_until is the prompt's end. FG_OK at once for any other sequence. */
fg_status fg_adaptive_layer_prefilled(fg_context *ctx, fg_seq *s, int32_t layer, int32_t n, const float *q);
/* A chunk [begin, begin + n) of a prompt of N rows staged at a layer: an
 * adaptive sequence observes the chunk's rows among the prompt's last. */
fg_status fg_adaptive_chunk_prefilled(fg_context *ctx, fg_seq *s, int32_t layer, int32_t begin, int32_t n,
                                      int32_t N, const float *q);
/* Whether a sequence still observed is due for its compression after a
 * layer sweep: every layer at one length, at or past compress_at (an append
 * can carry it past without a decode step at compress_at). */
int fg_adaptive_due(const fg_context *ctx, const fg_seq *s);
/* FG_OBSERVE_SCORES: scores [Hkv][n] (checked) added to the layer's ranks;
 * refused, nothing added, where a sum would leave the float range. */
fg_status fg_adaptive_observe_scores(fg_context *ctx, fg_seq *s, int32_t layer, const float *scores, int32_t n);
/* The layer's given ranks of keys [0, n): out [Hkv][n]. */
void fg_adaptive_ranks(const fg_context *ctx, const fg_seq *s, int32_t layer, float *out, int32_t n);
/* fg_seq_observe's pass over one layer of an adaptive sequence (checked):
 * out gets the rows' attention, the layer's ranks and rows what they leave. */
fg_status fg_adaptive_observe_pass(fg_context *ctx, fg_seq *s, int32_t layer, const float *q, const float *k,
                                   const float *v, int32_t n, float *out);
/* Levels of memory each family is tried at: level l keeps about l / FG_AD_LEVELS of the rows. */
#define FG_AD_LEVELS 40
/* For tests: the predicted error and the rows of every unit (layer x KV
 * head), family and level, [units][n_policies][FG_AD_LEVELS + 1], of a
 * sequence still observed (every layer at one length), and the budget they
 * share, in rows. */
fg_status fg_adaptive_curves(fg_context *ctx, const fg_seq *s, double *err, int32_t *rows, int64_t *budget_rows);

struct fg_context {
    fg_context_params params;
    fg_compression_params compression; /* of sequences created without their own (fg_context_set_compression) */
    char backend_name[16];
    fg_shape shape;
    fg_page_layout layout;
    fg_backend be;
    fg_threadpool *threads;     /* the pool the CPU work runs on: params.threadpool or own_threads */
    fg_threadpool *own_threads; /* the context's own pool, when none was given */
    fg_token_classes *classes;
    fg_pool pool;      /* row pages */
    fg_pool meta_pool; /* meta pages */
    fg_seq *seqs;          /* [max_seqs] */
    /* decode scratch, grown on demand (never shrunk) */
    fg_decode_head *dheads;
    fg_step_plan *plans;
    uint8_t *new_cls;
    int32_t *added_pages;
    /* copy-on-write during a decode step: what to undo if the step fails */
    struct fg_cow_entry *cow;
    int32_t n_cow, cap_cow;
    int32_t scratch_heads;
    double *rope_freq;  /* [params.rope_dims / 2] radians per position of each RoPE pair (rope_theta > 0),
                           else NULL; params.rope_freq_factors is NULL (the context keeps no caller memory) */
    float *act[4];      /* act_dtype other than f32: q, k, v and out in fp32 (activation memory), grown as needed */
    size_t act_cap[4];  /* their floats */
    char error[512];
    /* the thread inside a call (fg_claim): the address of its own marker, NULL when none */
    _Atomic(const void *) owner;
    int32_t depth; /* the owner's calls in progress (a call may make another) */
    int32_t in_log; /* > 0 while the log callback runs (core/status.c): fg_claim refuses calls from it */
};

/* RoPE (core/rope.c; the context's rope_freq, rope_dims > 0): turn[rope_dims]
 * gets the cos and sin of each pair's angle over k positions; fg_rope_turn
 * turns n_heads heads of head_dim lanes by them (a rotated query advanced
 * by k positions). */
void fg_rope_turns(const fg_context *ctx, int64_t k, float *turn);
void fg_rope_turn(const fg_context *ctx, const float *turn, float *x, int32_t n_heads);

/* Every entry point that takes a context claims it for the calling thread
 * first (core/claim.c; fastgen.h: one call at a time per context): FG_OK
 * (the context's message cleared when this is the thread's outermost call),
 * or an error naming `fn` when ctx is NULL, another thread is inside a call,
 * or the context's pool would refuse this thread (fg_threadpool_blocked),
 * which leaves the context and its message alone. fg_release gives the claim
 * back and returns st. */
fg_status fg_claim(const fg_context *ctx, const char *fn);
fg_status fg_release(const fg_context *ctx, fg_status st);
/* 1 when the calling thread is inside a call on ctx (e.g. in its log callback). */
int fg_claimed_here(const fg_context *ctx);
/* 1 when fg_threadpool_run(p, ...) from this thread would be refused (a job
 * of p waits on this thread through another pool's; core/threads.c). Since
 * fg_claim refuses such a call at its entry, no run on ctx->threads inside a
 * claimed call is ever refused: the kernels and the core ignore
 * fg_threadpool_run's status. */
int fg_threadpool_blocked(const fg_threadpool *p);
#define FG_CLAIM(ctx, fn)                                                                                              \
    do {                                                                                                               \
        const fg_status claim_ = fg_claim((ctx), (fn));                                                                \
        if (claim_)                                                                                                    \
            return claim_;                                                                                             \
    } while (0)

/* Returns fg_error(ctx, status, ...) from the calling entry point when cond fails. */
#define FG_CHECK(cond, ctx, status, ...)                                                                               \
    do {                                                                                                               \
        if (!(cond))                                                                                                   \
            return fg_error((ctx), (status), __VA_ARGS__);                                                             \
    } while (0)

/* ---- sequences (core/sequence.c) */

/* The live sequence `seq` (FG_ERR_INVALID_ARGUMENT, with a message, if none). */
fg_status fg_get_seq(const fg_context *ctx, int32_t seq, fg_seq **out);
/* The live sequence `seq` and its head (layer, kv_head), validated. */
fg_status fg_get_head(const fg_context *ctx, int32_t seq, int32_t layer, int32_t kv_head, fg_seq **s, fg_head **h);
/* c becomes a copy of s that shares its pages (one more owner each). */
fg_status fg_seq_clone(fg_context *ctx, const fg_seq *s, fg_seq *c);
/* Token `token` may go to position p of sequence `seq` (s): inside the
 * vocabulary, and the token another layer already has there, if any. */
fg_status fg_check_token(fg_context *ctx, const fg_seq *s, int32_t seq, int32_t p, int32_t token);
/* Frees everything a sequence holds (its pages, stages, adaptive state). */
void fg_seq_release(fg_context *ctx, fg_seq *s);
/* Frees a chunked prefill's staged activations. */
void fg_stage_free(fg_context *ctx, fg_prefill_stage *stage);
/* Whether a sequence has a chunked prefill in progress on some layer. */
int fg_stage_in_progress(const fg_context *ctx, const fg_seq *s);

/* ---- a head's pages (core/head.c) */

int32_t fg_pages_for(const fg_context *ctx, int32_t rows);
/* Grows a head to n_pages pages (row and meta). On failure the head keeps what it had. */
fg_status fg_head_reserve(fg_context *ctx, fg_head *h, int32_t n_pages);
void fg_head_shrink(fg_context *ctx, fg_head *h, int32_t n_pages);
/* Frees a head's pages and page tables. */
void fg_head_free(fg_context *ctx, fg_head *h);
/* Entries from `page` on of a head's table in backend memory changed. */
static inline void fg_head_tab_stale(fg_head *h, int32_t page) {
    if (h->tab_valid > page)
        h->tab_valid = page;
}
/* A head's table in backend memory, made or grown (then written whole) for
 * a step where the backend keeps them (ops->device_tables; else nothing). */
fg_status fg_head_tab_ready(fg_context *ctx, fg_head *h);
/* A head whose n_slots slots were just compacted: slot s in row s, nothing shared. */
void fg_head_compacted(fg_head *h);
/* The head's pages are now shared (a fork, or fg_seq_append's snapshot):
 * its steps no longer write the rows it has; its free rows are forgotten.
 * The source (copy 0) writes its new rows from its high water mark on, in
 * its last page first, as before; a copy (1) writes them in pages of its
 * own, past every shared one, so that no row page is ever copied. */
void fg_head_share(fg_context *ctx, fg_head *h, int copy);
/* After a step of head i of s: a head that shares pages holds no more
 * than it would alone (its share of each page counted), and one that
 * shares none keeps slot s in row s. Otherwise its kept rows are gathered
 * into pages of its own (fg_head_repack), and then the same head of the
 * other sequences, whose share grew, is tidied too. A repack that fails
 * leaves its head as it was (only memory is at stake). */
void fg_head_tidy(fg_context *ctx, fg_seq *s, size_t i);
/* Gathers a head's kept rows into new pages of its own, slot s in row s,
 * and gives back the old ones. On failure the head is as it was. */
fg_status fg_head_repack(fg_context *ctx, fg_head *h);
/* Copy-on-write: replaces the shared meta pages [first, last) of a head by
 * copies of its own before a step writes them, recording each in ctx->cow. */
fg_status fg_head_unshare(fg_context *ctx, fg_head *h, int32_t first, int32_t last);
/* Undoes the copies of a failed step: the heads share their old pages again. */
void fg_pages_reshare(fg_context *ctx);
/* The first n_slots slots of one head read to the host, after the
 * backend's queued work: K and V as float [n_slots][d], and pos / flags /
 * score (each may be NULL). */
fg_status fg_head_read_rows(fg_backend *be, const fg_page_layout *layout, const fg_head *h, int32_t n_slots,
                            float *k, float *v, int32_t *pos, uint8_t *flags, float *score);
/* A decode step of head h at position p (t = p + 1), on the host: its
 * plan (fg_plan_step) in *pl, its shared meta pages copied where the step
 * writes them (recorded in ctx->cow), and the pages of its peak reserved;
 * *added_pages: how many, also on failure (fg_unreserve gives them back). */
fg_status fg_head_plan_step(fg_context *ctx, fg_head *h, int32_t p, const uint8_t *cls, uint8_t cls_new,
                            fg_step_plan *pl, int32_t *added_pages);
/* After the op ran the planned step: the head's counts as the plan
 * mirrored them, and what its rows' bookkeeping learnt. */
void fg_head_commit_step(fg_head *h, const fg_step_plan *pl);
/* Gives back the pages a decode step reserved for its first n_heads heads
 * (head i * Hkv + g of the batch is KV head g of sequence seqs[i]). */
void fg_unreserve(fg_context *ctx, int32_t layer, const int32_t *seqs, int32_t n_heads);

/* ---- allocation modes (core/alloc.c): one entry per fg_allocation */

/* A layer's policy choice at the end of its prompt: every head's profile
 * and the threshold's choice (heads[g].policy_index, recovery) are made;
 * the mode sets heads[g].pol (and may change policy_index). */
typedef struct fg_layer_choice {
    const fg_compression_params *cp;
    fg_seq *s;
    int32_t layer, Hkv, n;
    const fg_profile_view *views; /* [Hkv] */
    fg_head *heads;               /* [Hkv] */
    const float *col;             /* [Hkv][n] the layer's pooled attention */
    /* scratch: [Hkv][n_policies] recoveries and costs, [Hkv] choices, [n] ranks; shares_rows: [Hkv][n] candidates
       and [Hkv] policies */
    double *rec;
    int32_t *cost, *choice;
    fg_rank_entry *rank, *shares;
    fg_policy *pols;
} fg_layer_choice;

typedef struct fg_alloc_mode {
    const char *name;
    int layer_ranks;       /* every head ranks by its layer's mean attention */
    int shares_rows;       /* the choice needs fg_layer_choice's shares and pols */
    int whole_prompt_first; /* no decode step before every layer is prefilled */
    /* whether a profile ranks by the prompt's last observation_window rows only (when set) */
    int (*tail_ranks)(const fg_compression_params *cp);
    void (*choose)(const fg_layer_choice *c);
    /* beyond the prompt, NULL where the mode does nothing: a layer prefilled (q: its queries, NULL when a
       chunked prefill gave them chunk by chunk), a chunk of a prompt staged, a decode step's query */
    fg_status (*layer_prefilled)(fg_context *ctx, fg_seq *s, int32_t layer, int32_t n, const float *q);
    fg_status (*chunk_prefilled)(fg_context *ctx, fg_seq *s, int32_t layer, int32_t begin, int32_t n, int32_t N,
                                 const float *q);
    fg_status (*step_observe)(fg_context *ctx, fg_seq *s, int32_t layer, int32_t p, const float *q);
} fg_alloc_mode;

const fg_alloc_mode *fg_alloc_mode_of(const fg_compression_params *cp);

/* ---- prefill */

/* Whether every layer of a sequence has been prefilled (here: adaptive.c,
 * below prefill.c, asks it too). */
static inline int fg_all_prefilled(const fg_context *ctx, const fg_seq *s) {
    for (int32_t l = 0; l < ctx->params.n_layers; l++)
        if (!s->length[l])
            return 0;
    return 1;
}

/* ---- scratch and activation memory (core/activations.c) */

/* Host scratch: each *ptr = malloc(bytes); an item of 0 bytes (not needed,
 * or held elsewhere) is left as it is. Returns 1 when every buffer asked
 * for was allocated; else 0, and the caller frees what was (its pointers
 * start NULL). */
typedef struct fg_alloc_item {
    void **ptr;
    size_t bytes;
} fg_alloc_item;
int fg_alloc_all(const fg_alloc_item *items, size_t n);

/* Activation memory: the backend's with FG_IO_DEVICE, else the host's. */
fg_status fg_io_alloc(fg_context *ctx, size_t bytes, float **out);
void fg_io_free(fg_context *ctx, float *p);
/* Host floats into activation memory. */
fg_status fg_io_write(fg_context *ctx, float *dst, const float *src, size_t bytes);
/* Activation memory to activation memory (a queued copy with FG_IO_DEVICE). */
fg_status fg_io_copy(fg_context *ctx, float *dst, const float *src, size_t bytes);
/* `rows` rows of `width` floats, from src every spitch floats to dst every
 * dpitch floats (one queued copy with FG_IO_DEVICE). */
fg_status fg_io_copy_rows(fg_context *ctx, float *dst, size_t dpitch, const float *src, size_t spitch, size_t width,
                          size_t rows);

/* fg_decode on fp32 activations (what fg_decode runs after converting
 * act_dtype's; fg_seq_append's steps call it directly). */
fg_status fg_decode_f32(fg_context *ctx, int32_t layer, int32_t n_seqs, const int32_t *seqs, const int32_t *tokens,
                        const float *q, const float *k, const float *v, float *out);

/* A call's activations in the context's act_dtype: fg_act_in gives fp32
 * q, k, v and out (the caller's own when act_dtype is f32, else the
 * context's buffers with q, k and v converted); fg_act_out converts out back
 * into the caller's array after a call that succeeded. rows: q's and out's
 * rows (of Hq x d), k's and v's (of Hkv x d). */
typedef struct fg_act_call {
    const float *q, *k, *v;
    float *out;
    void *user_out;
    size_t out_n;
} fg_act_call;
/* The rows to convert: `rows` when seq is a live sequence (or -1: none to
 * check) and 0 < rows <= limit, else 0, for a call its own checks refuse. */
size_t fg_act_rows(const fg_context *ctx, int32_t seq, int64_t rows, int64_t limit);
/* The prompt rows of a live sequence, else 0. */
int32_t fg_act_prompt(const fg_context *ctx, int32_t seq);
/* Also refuses (FG_ERR_INVALID_ARGUMENT, naming fn) an array that is not
 * aligned to its element (4 bytes in f32, 2 in f16 / bf16). */
fg_status fg_act_in(fg_context *ctx, const char *fn, size_t rows, const void *q, const void *k, const void *v,
                    void *out, fg_act_call *c);
fg_status fg_act_out(fg_context *ctx, const fg_act_call *c, fg_status st);
/* Gives the conversion buffers back (fg_trim, fg_context_destroy). */
void fg_act_release(fg_context *ctx);

#endif /* FG_INTERNAL_H */
