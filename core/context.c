/* The context: validation, sequences, the prefill and decode drivers that
 * turn host bookkeeping into backend ops, inspection and memory accounting.
 * Every entry point validates everything before it changes anything, so a
 * failed call leaves the caches as they were. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"

#define CHECK(cond, ctx, status, ...)                                                                                  \
    do {                                                                                                               \
        if (!(cond))                                                                                                   \
            return fg_error((ctx), (status), __VA_ARGS__);                                                             \
    } while (0)

/* ------------------------------------------------------------------ create */

static fg_status validate_params(const fg_context_params *p) {
    CHECK(p->n_layers > 0 && p->n_q_heads > 0 && p->n_kv_heads > 0 && p->head_dim > 0, NULL,
          FG_ERR_INVALID_ARGUMENT, "n_layers (%d), n_q_heads (%d), n_kv_heads (%d) and head_dim (%d) must be > 0",
          (int)p->n_layers, (int)p->n_q_heads, (int)p->n_kv_heads, (int)p->head_dim);
    CHECK(p->n_q_heads % p->n_kv_heads == 0, NULL, FG_ERR_INVALID_ARGUMENT,
          "n_q_heads (%d) must be a multiple of n_kv_heads (%d)", (int)p->n_q_heads, (int)p->n_kv_heads);
    CHECK(p->head_dim <= 1024, NULL, FG_ERR_INVALID_ARGUMENT, "head_dim %d is above the supported 1024",
          (int)p->head_dim);
    CHECK(p->kv_dtype == FG_DTYPE_F32 || p->kv_dtype == FG_DTYPE_F16 || p->kv_dtype == FG_DTYPE_BF16, NULL,
          FG_ERR_INVALID_ARGUMENT, "unknown kv_dtype %d", (int)p->kv_dtype);
    CHECK(p->max_seqs > 0 && p->max_seq_len > 0, NULL, FG_ERR_INVALID_ARGUMENT,
          "max_seqs (%d) and max_seq_len (%d) must be > 0", (int)p->max_seqs, (int)p->max_seq_len);
    CHECK(p->page_tokens > 0 && p->page_tokens <= 4096, NULL, FG_ERR_INVALID_ARGUMENT,
          "page_tokens must be in 1..4096, got %d", (int)p->page_tokens);
    CHECK(p->pool_chunk_pages > 0, NULL, FG_ERR_INVALID_ARGUMENT, "pool_chunk_pages must be > 0, got %d",
          (int)p->pool_chunk_pages);
    CHECK(p->n_threads >= 0 && p->n_threads <= FG_MAX_THREADS, NULL, FG_ERR_INVALID_ARGUMENT,
          "n_threads must be in 0..%d (0 = the cores this process may run on), got %d: every thread has its own "
          "decode workspace",
          FG_MAX_THREADS, (int)p->n_threads);
    CHECK(!p->threadpool || p->n_threads == 0 || p->n_threads == fg_threadpool_size(p->threadpool), NULL,
          FG_ERR_INVALID_ARGUMENT, "n_threads (%d) differs from the size of the threadpool given (%d): pass 0 or %d",
          (int)p->n_threads, (int)fg_threadpool_size(p->threadpool), (int)fg_threadpool_size(p->threadpool));
    CHECK(p->classes != NULL, NULL, FG_ERR_INVALID_ARGUMENT,
          "classes must not be NULL (build them with fg_token_classes_create)");
    CHECK(p->io == FG_IO_HOST || p->io == FG_IO_DEVICE, NULL, FG_ERR_INVALID_ARGUMENT,
          "io must be FG_IO_HOST (0) or FG_IO_DEVICE (1), got %d", (int)p->io);
    return fg_compression_params_validate(&p->compression);
}

fg_status fg_context_create(const fg_context_params *params, fg_context **out) {
    CHECK(params && out, NULL, FG_ERR_INVALID_ARGUMENT, "fg_context_create: params and out must not be NULL");
    *out = NULL;
    fg_status st = validate_params(params);
    if (st)
        return st;
    const char *backend = params->backend ? params->backend : "cpu";
    CHECK(strlen(backend) < 16, NULL, FG_ERR_INVALID_ARGUMENT, "unknown backend \"%s\"", backend);

    fg_context *ctx = calloc(1, sizeof *ctx);
    CHECK(ctx, NULL, FG_ERR_OUT_OF_MEMORY, "out of memory creating a context");
    ctx->params = *params;
    strcpy(ctx->backend_name, backend);
    ctx->params.backend = ctx->backend_name;
    ctx->params.classes = NULL;
    ctx->shape = (fg_shape){params->n_q_heads, params->n_kv_heads, params->head_dim};
    ctx->layout = fg_page_layout_make(params->page_tokens, params->head_dim, params->kv_dtype);
    ctx->be.err = fg_error_sink;
    ctx->be.err_sink = ctx;

    ctx->threads = params->threadpool;
    st = ctx->threads ? FG_OK : fg_threadpool_create(params->n_threads, &ctx->own_threads);
    if (st == FG_OK && !ctx->threads)
        ctx->threads = ctx->own_threads;
    else if (st)
        st = fg_error(ctx, st, "%s", fg_last_error(NULL));
    if (st == FG_OK)
        st = fg_backend_open(backend, ctx->threads, &ctx->be);
    if (st == FG_OK && params->io == FG_IO_DEVICE) {
        if (!ctx->be.ops->synchronize)
            st = fg_error(ctx, FG_ERR_INVALID_ARGUMENT,
                          "io = FG_IO_DEVICE needs a backend with device memory (cuda, hip); \"%s\" takes host arrays",
                          backend);
        ctx->be.device_io = 1;
    }
    if (st == FG_OK && params->stream) {
        if (!ctx->be.ops->set_stream)
            st = fg_error(ctx, FG_ERR_INVALID_ARGUMENT, "a stream was given, but backend \"%s\" has no streams",
                          backend);
        else
            st = ctx->be.ops->set_stream(&ctx->be, params->stream);
    }
    if (st == FG_OK)
        st = fg_token_classes_clone(params->classes, &ctx->classes);
    const int32_t raw = st == FG_OK ? fg_token_classes_raw_looking(ctx->classes) : 0;
    if (raw > 0 && params->log_fn) {
        char msg[400];
        snprintf(msg, sizeof msg, "token classes: %d of the %d pieces given as text look like raw vocabulary "
                 "strings (U+2581 or a leading \"\xc4\xa0\" for a space), so their punctuation is not found: build "
                 "them with fg_token_classes_create_from(..., FG_PIECES_SENTENCEPIECE or FG_PIECES_GPT2_BYTES)",
                 (int)raw, (int)fg_token_classes_vocab_size(ctx->classes));
        params->log_fn(params->log_user, FG_LOG_WARN, msg);
    }
    if (st == FG_OK) {
        ctx->seqs = calloc((size_t)params->max_seqs, sizeof *ctx->seqs);
        if (!ctx->seqs)
            st = fg_error(ctx, FG_ERR_OUT_OF_MEMORY, "out of memory for %d sequences", (int)params->max_seqs);
    }
    if (st) {
        fg_context_destroy(&ctx);
        return st;
    }
    fg_pool_init(&ctx->pool, &ctx->be, ctx, ctx->layout.page_bytes, params->pool_chunk_pages, params->max_pool_bytes);
    *out = ctx;
    return FG_OK;
}

static void stage_free(fg_context *ctx, fg_prefill_stage *stage);
static int stage_in_progress(const fg_context *ctx, const fg_seq *s);

static void seq_release(fg_context *ctx, fg_seq *s) {
    if (s->heads) {
        int32_t n_heads = ctx->params.n_layers * ctx->params.n_kv_heads;
        for (int32_t i = 0; i < n_heads; i++) {
            fg_head *h = &s->heads[i];
            for (int32_t p = 0; p < h->n_pages; p++)
                fg_pool_free(&ctx->pool, h->page_ids[p]);
            free(h->page_ids);
            free(h->pages);
        }
    }
    if (s->stage)
        for (int32_t l = 0; l < ctx->params.n_layers; l++)
            stage_free(ctx, &s->stage[l]);
    free(s->stage);
    fg_adaptive_destroy(ctx, &s->ad);
    free(s->heads);
    free(s->tokens);
    free(s->cls);
    free(s->length);
    memset(s, 0, sizeof *s);
}

void fg_context_destroy(fg_context **pctx) {
    if (!pctx || !*pctx)
        return;
    fg_context *ctx = *pctx;
    if (ctx->seqs)
        for (int32_t i = 0; i < ctx->params.max_seqs; i++)
            if (ctx->seqs[i].in_use)
                seq_release(ctx, &ctx->seqs[i]);
    fg_pool_release(&ctx->pool);
    free(ctx->seqs);
    free(ctx->dheads);
    free(ctx->plans);
    free(ctx->new_cls);
    free(ctx->added_pages);
    free(ctx->cow);
    fg_token_classes_destroy(&ctx->classes);
    fg_backend_close(&ctx->be);
    fg_threadpool_destroy(&ctx->own_threads);
    free(ctx);
    *pctx = NULL;
}

const char *fg_context_backend(const fg_context *ctx) { return ctx ? ctx->backend_name : NULL; }

fg_status fg_context_set_stream(fg_context *ctx, void *stream) {
    CHECK(ctx, NULL, FG_ERR_INVALID_ARGUMENT, "fg_context_set_stream: context must not be NULL");
    CHECK(ctx->be.ops->set_stream, ctx, FG_ERR_INVALID_ARGUMENT, "backend \"%s\" has no streams",
          ctx->backend_name);
    return ctx->be.ops->set_stream(&ctx->be, stream);
}

fg_status fg_synchronize(fg_context *ctx) {
    CHECK(ctx, NULL, FG_ERR_INVALID_ARGUMENT, "fg_synchronize: context must not be NULL");
    return ctx->be.ops->synchronize ? ctx->be.ops->synchronize(&ctx->be) : FG_OK;
}

fg_status fg_backend_probe(const char *name) {
    CHECK(name, NULL, FG_ERR_INVALID_ARGUMENT, "fg_backend_probe: name must not be NULL");
    fg_backend be = {.err = fg_error_sink, .err_sink = NULL};
    fg_status st = fg_backend_open(name, NULL, &be);
    if (st == FG_OK)
        fg_backend_close(&be);
    return st;
}

/* ------------------------------------------------------------------ sequences */

static fg_status get_seq(const fg_context *ctx, int32_t seq, fg_seq **out) {
    CHECK(ctx, NULL, FG_ERR_INVALID_ARGUMENT, "context must not be NULL");
    fg_context *c = (fg_context *)ctx; /* the error message is the only thing written */
    CHECK(seq >= 0 && seq < ctx->params.max_seqs && ctx->seqs[seq].in_use, c, FG_ERR_INVALID_ARGUMENT,
          "sequence %d does not exist", (int)seq);
    *out = &ctx->seqs[seq];
    return FG_OK;
}

static fg_status get_head(const fg_context *ctx, int32_t seq, int32_t layer, int32_t kv_head, fg_seq **s,
                          fg_head **h) {
    fg_status st = get_seq(ctx, seq, s);
    if (st)
        return st;
    fg_context *c = (fg_context *)ctx;
    CHECK(layer >= 0 && layer < ctx->params.n_layers, c, FG_ERR_INVALID_ARGUMENT,
          "layer %d outside [0, %d)", (int)layer, (int)ctx->params.n_layers);
    CHECK(kv_head >= 0 && kv_head < ctx->params.n_kv_heads, c, FG_ERR_INVALID_ARGUMENT,
          "kv_head %d outside [0, %d)", (int)kv_head, (int)ctx->params.n_kv_heads);
    CHECK((*s)->length[layer] > 0, c, FG_ERR_BAD_STATE, "sequence %d has not been prefilled at layer %d", (int)seq,
          (int)layer);
    *h = &(*s)->heads[(size_t)layer * ctx->params.n_kv_heads + kv_head];
    return FG_OK;
}

fg_status fg_seq_create(fg_context *ctx, const fg_compression_params *compression, const int32_t *prompt,
                        int32_t n_prompt, int32_t *seq_out) {
    CHECK(ctx, NULL, FG_ERR_INVALID_ARGUMENT, "fg_seq_create: context must not be NULL");
    CHECK(prompt && seq_out, ctx, FG_ERR_INVALID_ARGUMENT, "fg_seq_create: prompt and seq_out must not be NULL");
    CHECK(n_prompt > 0, ctx, FG_ERR_INVALID_ARGUMENT, "fg_seq_create: the prompt needs >= 1 token, got %d",
          (int)n_prompt);
    CHECK(n_prompt <= ctx->params.max_seq_len, ctx, FG_ERR_CAPACITY,
          "prompt of %d tokens is longer than max_seq_len %d", (int)n_prompt, (int)ctx->params.max_seq_len);
    const fg_compression_params *cp = compression ? compression : &ctx->params.compression;
    fg_status st = fg_compression_params_validate(cp);
    if (st)
        return fg_error(ctx, st, "%s", fg_last_error(NULL));
    int32_t id = 0;
    while (id < ctx->params.max_seqs && ctx->seqs[id].in_use)
        id++;
    CHECK(id < ctx->params.max_seqs, ctx, FG_ERR_CAPACITY, "all %d sequences are in use (max_seqs)",
          (int)ctx->params.max_seqs);

    fg_seq *s = &ctx->seqs[id];
    size_t cap = (size_t)ctx->params.max_seq_len;
    s->tokens = malloc(cap * sizeof *s->tokens);
    s->cls = malloc(cap);
    s->length = calloc((size_t)ctx->params.n_layers, sizeof *s->length);
    s->heads = calloc((size_t)ctx->params.n_layers * ctx->params.n_kv_heads, sizeof *s->heads);
    if (!s->tokens || !s->cls || !s->length || !s->heads) {
        seq_release(ctx, s);
        return fg_error(ctx, FG_ERR_OUT_OF_MEMORY, "out of memory creating a sequence");
    }
    st = fg_token_classes_classify(ctx->classes, prompt, n_prompt, cp->n_sink, s->cls);
    if (st) {
        seq_release(ctx, s);
        return fg_error(ctx, st, "%s", fg_last_error(NULL));
    }
    if (cp->allocation == FG_ALLOC_ADAPTIVE && (st = fg_adaptive_create(ctx, cp, n_prompt, &s->ad)) != FG_OK) {
        seq_release(ctx, s);
        return st;
    }
    memcpy(s->tokens, prompt, (size_t)n_prompt * sizeof *prompt);
    s->cp = *cp;
    s->n_prompt = s->n_tokens = n_prompt;
    s->parent = -1;
    s->in_use = 1;
    *seq_out = id;
    return FG_OK;
}

/* c becomes a copy of s that shares its pages (one more owner each). */
static fg_status seq_clone(fg_context *ctx, const fg_seq *s, fg_seq *c) {
    const size_t cap = (size_t)ctx->params.max_seq_len, n_heads = (size_t)ctx->params.n_layers * ctx->params.n_kv_heads;
    memset(c, 0, sizeof *c);
    c->tokens = malloc(cap * sizeof *c->tokens);
    c->cls = malloc(cap);
    c->length = malloc((size_t)ctx->params.n_layers * sizeof *c->length);
    c->heads = calloc(n_heads, sizeof *c->heads);
    int ok = c->tokens && c->cls && c->length && c->heads;
    for (size_t i = 0; ok && i < n_heads; i++) {
        const fg_head *ph = &s->heads[i];
        fg_head *h = &c->heads[i];
        const int32_t n = ph->n_pages > 0 ? ph->n_pages : 1;
        h->page_ids = malloc((size_t)n * sizeof *h->page_ids);
        h->pages = malloc((size_t)n * sizeof *h->pages);
        ok = h->page_ids && h->pages;
        if (!ok)
            break;
        int32_t *ids = h->page_ids;
        void **pages = h->pages;
        *h = *ph; /* policy, recoveries, counts; a page table of its own */
        h->page_ids = ids;
        h->pages = pages;
        h->n_pages = 0;
        h->cap_pages = n;
        if (ph->n_pages > 0) { /* a head not prefilled yet has no page table */
            memcpy(h->page_ids, ph->page_ids, (size_t)ph->n_pages * sizeof *h->page_ids);
            memcpy(h->pages, ph->pages, (size_t)ph->n_pages * sizeof *h->pages);
        }
        for (int32_t p = 0; p < ph->n_pages; p++)
            fg_pool_ref(&ctx->pool, ph->page_ids[p]);
        h->n_pages = ph->n_pages;
    }
    if (!ok) {
        seq_release(ctx, c);
        return fg_error(ctx, FG_ERR_OUT_OF_MEMORY, "out of host memory copying sequence state");
    }
    fg_status st = s->ad ? fg_adaptive_clone(ctx, s->ad, &c->ad) : FG_OK;
    if (st) {
        seq_release(ctx, c);
        return st;
    }
    memcpy(c->tokens, s->tokens, (size_t)s->n_tokens * sizeof *s->tokens);
    memcpy(c->cls, s->cls, (size_t)s->n_tokens);
    memcpy(c->length, s->length, (size_t)ctx->params.n_layers * sizeof *c->length);
    c->cp = s->cp;
    c->n_prompt = s->n_prompt;
    c->n_tokens = s->n_tokens;
    c->parent = s->parent; /* a copy (fg_seq_append's snapshot) keeps the lineage; fg_seq_fork sets its own */
    c->fork_len = s->fork_len;
    c->in_use = 1;
    return FG_OK;
}

fg_status fg_seq_fork(fg_context *ctx, int32_t parent, int32_t *child_out) {
    fg_seq *s = NULL;
    fg_status st = get_seq(ctx, parent, &s);
    if (st)
        return st;
    CHECK(child_out, ctx, FG_ERR_INVALID_ARGUMENT, "fg_seq_fork: child must not be NULL");
    CHECK(!stage_in_progress(ctx, s), ctx, FG_ERR_BAD_STATE,
          "fg_seq_fork: sequence %d has a chunked prefill in progress", (int)parent);
    CHECK(s->length[0] > 0, ctx, FG_ERR_BAD_STATE,
          "fg_seq_fork: sequence %d is not prefilled yet: fork after fg_prefill (a copy of its prompt is "
          "fg_seq_create with the same tokens)", (int)parent);
    for (int32_t l = 1; l < ctx->params.n_layers; l++)
        CHECK(s->length[l] == s->length[0], ctx, FG_ERR_BAD_STATE,
              "fg_seq_fork: sequence %d is in the middle of a layer sweep (layer 0 at %d tokens, layer %d at %d)",
              (int)parent, (int)s->length[0], (int)l, (int)s->length[l]);
    int32_t id = 0;
    while (id < ctx->params.max_seqs && ctx->seqs[id].in_use)
        id++;
    CHECK(id < ctx->params.max_seqs, ctx, FG_ERR_CAPACITY, "fg_seq_fork: all %d sequences are in use (max_seqs)",
          (int)ctx->params.max_seqs);
    st = seq_clone(ctx, s, &ctx->seqs[id]);
    if (st == FG_OK) {
        ctx->seqs[id].parent = parent;
        ctx->seqs[id].fork_len = s->length[0];
        *child_out = id;
    }
    return st;
}

fg_status fg_seq_destroy(fg_context *ctx, int32_t seq) {
    fg_seq *s = NULL;
    fg_status st = get_seq(ctx, seq, &s);
    if (st)
        return st;
    /* its forks now share their prefix with its parent; the first of them
     * takes its place, and the others share with that one what both shared
     * with it */
    int32_t first = -1, first_len = 0;
    for (int32_t i = 0; i < ctx->params.max_seqs; i++) {
        fg_seq *c = &ctx->seqs[i];
        if (!c->in_use || c->parent != seq || i == seq)
            continue;
        if (first < 0) {
            first = i;
            first_len = c->fork_len;
            c->parent = s->parent;
            c->fork_len = s->fork_len < c->fork_len ? s->fork_len : c->fork_len;
        } else {
            c->parent = first;
            c->fork_len = first_len < c->fork_len ? first_len : c->fork_len;
        }
    }
    seq_release(ctx, s);
    fg_pool_trim(&ctx->pool);
    return FG_OK;
}

fg_status fg_seq_length(const fg_context *ctx, int32_t seq, int32_t layer, int32_t *length) {
    fg_seq *s = NULL;
    fg_status st = get_seq(ctx, seq, &s);
    if (st)
        return st;
    CHECK(length, (fg_context *)ctx, FG_ERR_INVALID_ARGUMENT, "fg_seq_length: length must not be NULL");
    CHECK(layer >= 0 && layer < ctx->params.n_layers, (fg_context *)ctx, FG_ERR_INVALID_ARGUMENT,
          "layer %d outside [0, %d)", (int)layer, (int)ctx->params.n_layers);
    *length = s->length[layer];
    return FG_OK;
}

/* ------------------------------------------------------------------ pages */

int32_t fg_pages_for(const fg_context *ctx, int32_t rows) {
    return (rows + ctx->layout.page_tokens - 1) / ctx->layout.page_tokens;
}

/* Grows a head to n_pages pages. On failure the head keeps what it had. */
fg_status fg_head_reserve(fg_context *ctx, fg_head *h, int32_t n_pages) {
    if (n_pages > h->cap_pages) {
        int32_t cap = h->cap_pages ? h->cap_pages : 4;
        while (cap < n_pages)
            cap *= 2;
        int32_t *ids = realloc(h->page_ids, (size_t)cap * sizeof *ids);
        if (ids)
            h->page_ids = ids;
        void **pages = ids ? realloc(h->pages, (size_t)cap * sizeof *pages) : NULL;
        if (pages)
            h->pages = pages;
        CHECK(ids && pages, ctx, FG_ERR_OUT_OF_MEMORY, "out of host memory for a page table");
        h->cap_pages = cap;
    }
    while (h->n_pages < n_pages) {
        fg_status st = fg_pool_alloc(&ctx->pool, &h->page_ids[h->n_pages], &h->pages[h->n_pages]);
        if (st)
            return st;
        h->n_pages++;
    }
    return FG_OK;
}

void fg_head_shrink(fg_context *ctx, fg_head *h, int32_t n_pages) {
    while (h->n_pages > n_pages)
        fg_pool_free(&ctx->pool, h->page_ids[--h->n_pages]);
}

/* Copy-on-write: replaces the shared pages [first, last) of a head by copies
 * of its own before a step writes them, recording each in ctx->cow. */
static fg_status unshare(fg_context *ctx, fg_head *h, int32_t first, int32_t last) {
    for (int32_t p = first; p < last && p < h->n_pages; p++) {
        if (!fg_pool_shared(&ctx->pool, h->page_ids[p]))
            continue;
        if (ctx->n_cow == ctx->cap_cow) {
            int32_t cap = ctx->cap_cow ? 2 * ctx->cap_cow : 64;
            fg_cow_entry *c = realloc(ctx->cow, (size_t)cap * sizeof *c);
            CHECK(c, ctx, FG_ERR_OUT_OF_MEMORY, "out of host memory copying shared pages");
            ctx->cow = c;
            ctx->cap_cow = cap;
        }
        int32_t id;
        void *addr;
        fg_status st = fg_pool_alloc(&ctx->pool, &id, &addr);
        if (st == FG_OK && (st = fg_backend_copy(&ctx->be, addr, h->pages[p], ctx->layout.page_bytes)) != FG_OK)
            fg_pool_free(&ctx->pool, id);
        if (st)
            return st;
        ctx->cow[ctx->n_cow++] = (fg_cow_entry){h, p, h->page_ids[p], h->pages[p]};
        fg_pool_free(&ctx->pool, h->page_ids[p]); /* one owner less: the others keep it */
        h->page_ids[p] = id;
        h->pages[p] = addr;
    }
    return FG_OK;
}

/* Undoes the copies of a failed step: the heads share their old pages again. */
static void reshare(fg_context *ctx) {
    while (ctx->n_cow > 0) {
        const fg_cow_entry *c = &ctx->cow[--ctx->n_cow];
        fg_pool_ref(&ctx->pool, c->old_id);
        fg_pool_free(&ctx->pool, c->head->page_ids[c->page]);
        c->head->page_ids[c->page] = c->old_id;
        c->head->pages[c->page] = c->old_addr;
    }
}

/* Gives back the pages a decode step reserved for its first n_heads heads
 * (head i * Hkv + g of the batch is KV head g of sequence seqs[i]). */
static void unreserve(fg_context *ctx, int32_t layer, const int32_t *seqs, int32_t n_heads) {
    const int32_t Hkv = ctx->params.n_kv_heads;
    for (int32_t r = 0; r < n_heads; r++) {
        fg_head *h = &ctx->seqs[seqs[r / Hkv]].heads[(size_t)layer * Hkv + r % Hkv];
        fg_head_shrink(ctx, h, h->n_pages - ctx->added_pages[r]);
    }
}

/* ------------------------------------------------------------------ prefill */

typedef struct prefill_scratch {
    float *row_max, *row_sum; /* [Hq][n] */
    float *col;               /* [Hkv][n] */
    float *col_local;         /* [n_windows][Hkv][n] */
    int32_t *pos;             /* [Hkv][n] kept positions per head */
    uint8_t *flags;           /* [Hkv][n] */
    float *score;             /* [Hkv][n] */
    fg_rank_entry *rank;      /* [n] */
    fg_compact_head *compact; /* [Hkv] */
    fg_profile_view *views;   /* [Hkv] */
    double *rec;              /* [Hkv][n_policies] budget mode: recoveries */
    int32_t *cost;            /* [Hkv][n_policies] budget mode: rows kept */
    int32_t *choice;          /* [Hkv] budget mode */
    float *pooled;            /* [Hkv][n] pooled ranks (score_pool > 1) */
    fg_rank_entry *shares;    /* [Hkv][n] FG_ALLOC_ADAKV: the candidates of every head */
    fg_policy *pols;          /* [Hkv] FG_ALLOC_ADAKV: every head's share */
} prefill_scratch;

static void prefill_scratch_free(fg_context *ctx, prefill_scratch *w) {
    if (ctx->be.device_io) {
        if (w->row_max)
            ctx->be.ops->buffer_free(&ctx->be, w->row_max);
        if (w->row_sum)
            ctx->be.ops->buffer_free(&ctx->be, w->row_sum);
    } else {
        free(w->row_max);
        free(w->row_sum);
    }
    free(w->col);
    free(w->col_local);
    free(w->pos);
    free(w->flags);
    free(w->score);
    free(w->rank);
    free(w->compact);
    free(w->views);
    free(w->rec);
    free(w->cost);
    free(w->choice);
    free(w->pooled);
    free(w->shares);
    free(w->pols);
}

/* Budget mode: the layer's heads share budget x the full cache's rows (or
 * budget_tokens rows per head). An entry costs the rows it keeps as the
 * sequence grows, at length n: its pinned tokens, plus its window and
 * frequent ratios of the others (not the rounding of a short prompt, so the
 * kept share holds while decoding). */
static void allocate_budget(const fg_compression_params *cp, const fg_profile_view *views, fg_head *heads,
                            int32_t Hkv, int32_t n, prefill_scratch *w) {
    const int32_t E = cp->n_policies;
    for (int32_t e = 0; e < E; e++) {
        const fg_policy *pol = &cp->shortlist[e];
        const uint32_t c = fg_effective_components(pol->components);
        int32_t pinned = 0;
        for (int32_t j = 0; j < n; j++)
            pinned += fg_is_pinned(c, views[0].cls[j]);
        const double grow = ((c & FG_KEEP_LOCAL) ? pol->ratio_local : 0.0) + ((c & FG_KEEP_FREQUENT) ? pol->ratio_frequent : 0.0);
        const int32_t rows = (c & FG_KEEP_FULL) ? n : pinned + (int32_t)ceil(fmin(grow, 1.0) * (n - pinned));
        for (int32_t g = 0; g < Hkv; g++) {
            w->rec[g * E + e] = heads[g].recovery[e];
            w->cost[g * E + e] = rows;
        }
    }
    int64_t rows = INT64_MAX;
    if (cp->budget > 0.0f)
        rows = (int64_t)ceil((double)cp->budget * Hkv * n);
    if (cp->budget_tokens > 0 && (int64_t)cp->budget_tokens * Hkv < rows)
        rows = (int64_t)cp->budget_tokens * Hkv;
    fg_policy_allocate(w->rec, w->cost, Hkv, E, rows, w->choice);
    for (int32_t g = 0; g < Hkv; g++)
        heads[g].policy_index = w->choice[g];
}

/* Positions [first, last) of a pass whose rows start at position pos0 (q:
 * [][Hq][d] from pos0, activation memory) join the adaptive mode's observed
 * rows of `layer`. */
static fg_status observe_rows(fg_context *ctx, fg_seq *s, int32_t layer, int32_t pos0, int32_t first, int32_t last,
                              const float *q) {
    const size_t row = (size_t)ctx->params.n_q_heads * ctx->params.head_dim;
    float *hq = NULL;
    if (ctx->be.device_io && !(hq = malloc(row * sizeof *hq)))
        return fg_error(ctx, FG_ERR_OUT_OF_MEMORY, "out of host memory for an observed row");
    fg_status st = FG_OK;
    for (int32_t p = first < pos0 ? pos0 : first; p < last && st == FG_OK; p++) {
        const float *qr = q + (size_t)(p - pos0) * row;
        if (ctx->be.device_io) {
            if ((st = fg_backend_read(&ctx->be, hq, qr, row * sizeof *hq)))
                break;
            qr = hq;
        }
        fg_adaptive_observe(ctx, s->ad, layer, p, qr);
    }
    free(hq);
    return st;
}

/* Whether every layer of a sequence has been prefilled. */
static int all_prefilled(const fg_context *ctx, const fg_seq *s) {
    for (int32_t l = 0; l < ctx->params.n_layers; l++)
        if (!s->length[l])
            return 0;
    return 1;
}

/* The adaptive mode's compression, all or nothing. */
static fg_status compress_now(fg_context *ctx, fg_seq *s) {
    fg_adaptive_plan *plan = NULL;
    fg_status st = fg_adaptive_prepare(ctx, s, &plan);
    if (st)
        return st;
    fg_adaptive_swap(s, plan);
    fg_adaptive_abort(ctx, &plan); /* the full caches go */
    return FG_OK;
}


/* The prompt phase of one layer. With stats (the row max and sum of every
 * prompt row, from the chunks of a chunked prefill) the attention is done
 * and only profiling, policy choice and compaction run; out is unused. */
static fg_status prefill_layer(fg_context *ctx, fg_seq *s, int32_t layer, const float *q, const float *k,
                               const float *v, float *out, const float *const stats[2], prefill_scratch *w) {
    const int32_t n = s->n_prompt, Hq = ctx->params.n_q_heads, Hkv = ctx->params.n_kv_heads;
    const fg_compression_params *cp = &s->cp;

    /* distinct local windows w(n) of the shortlist */
    fg_profile_request req = {.n = n, .row_begin = 0, .n_windows = 0};
    if (cp->observation_window > 0 && cp->observation_window < n && !s->ad) /* adaptive: ranks by every row */
        req.row_begin = n - cp->observation_window;
    int32_t window_of[FG_MAX_SHORTLIST];
    for (int32_t e = 0; e < cp->n_policies; e++) {
        window_of[e] = -1;
        uint32_t c = fg_effective_components(cp->shortlist[e].components);
        if (!(c & FG_KEEP_LOCAL))
            continue;
        int32_t wn = fg_policy_window(&cp->shortlist[e], n), i = 0;
        while (i < req.n_windows && req.window[i] != wn)
            i++;
        if (i == req.n_windows)
            req.window[req.n_windows++] = wn;
        window_of[e] = i;
    }

    size_t nq = (size_t)Hq * n, nk = (size_t)Hkv * n;
    if (stats) {
        /* given */
    } else if (ctx->be.device_io) { /* the row statistics pass from one kernel to the next: device memory */
        fg_status sa = ctx->be.ops->buffer_alloc(&ctx->be, nq * sizeof(float), (void **)&w->row_max);
        if (sa == FG_OK)
            sa = ctx->be.ops->buffer_alloc(&ctx->be, nq * sizeof(float), (void **)&w->row_sum);
        if (sa)
            return sa;
    } else {
        w->row_max = malloc(nq * sizeof(float));
        w->row_sum = malloc(nq * sizeof(float));
    }
    w->col = malloc(nk * sizeof(float));
    w->col_local = malloc((req.n_windows ? (size_t)req.n_windows : 1) * nk * sizeof(float));
    w->pos = malloc(nk * sizeof(int32_t));
    w->flags = malloc(nk);
    w->score = malloc(nk * sizeof(float));
    w->rank = malloc((size_t)n * sizeof(fg_rank_entry));
    w->compact = malloc((size_t)Hkv * sizeof(fg_compact_head));
    w->views = malloc((size_t)Hkv * sizeof(fg_profile_view));
    w->rec = malloc((size_t)Hkv * cp->n_policies * sizeof(double));
    w->cost = malloc((size_t)Hkv * cp->n_policies * sizeof(int32_t));
    w->choice = malloc((size_t)Hkv * sizeof(int32_t));
    const int pool = cp->score_pool > 1, share = cp->allocation == FG_ALLOC_ADAKV;
    w->pooled = pool ? malloc(nk * sizeof(float)) : NULL;
    w->shares = share ? malloc(nk * sizeof(fg_rank_entry)) : NULL;
    w->pols = share ? malloc((size_t)Hkv * sizeof(fg_policy)) : NULL;
    CHECK((stats || (w->row_max && w->row_sum)) && w->col && w->col_local && w->pos && w->flags && w->score && w->rank &&
              w->compact && w->views && w->rec && w->cost && w->choice && (w->pooled || !pool) &&
              ((w->shares && w->pols) || !share),
          ctx, FG_ERR_OUT_OF_MEMORY, "out of host memory for profiling a prompt of %d tokens", (int)n);

    const fg_backend_ops *ops = ctx->be.ops;
    const float *row_max = stats ? stats[0] : w->row_max, *row_sum = stats ? stats[1] : w->row_sum;
    fg_status st = stats ? FG_OK
                         : ops->prefill_attention(&ctx->be, &ctx->shape, n, 0, q, k, v, out, w->row_max, w->row_sum);
    if (st == FG_OK)
        st = ops->profile_stats(&ctx->be, &ctx->shape, &req, q, k, row_max, row_sum, w->col, w->col_local);
    if (st)
        return st;

    /* policy choice and the kept rows of every head (host) */
    fg_head *heads = &s->heads[(size_t)layer * Hkv];
    fg_profile_view *views = w->views;
    for (int32_t g = 0; g < Hkv; g++) {
        fg_profile_view pv = {
            .n = n, .row_begin = req.row_begin, .length = n, .cls = s->cls, .col = w->col + (size_t)g * n};
        for (int32_t e = 0; e < cp->n_policies; e++)
            pv.col_local[e] = window_of[e] >= 0 ? w->col_local + ((size_t)window_of[e] * Hkv + g) * n : NULL;
        if (cp->score_pool > 1) {
            fg_policy_pool_ranks(cp, &pv, w->pooled + (size_t)g * n);
            pv.rank = w->pooled + (size_t)g * n;
        }
        views[g] = pv;
        heads[g].policy_index = fg_policy_choose(cp, &pv, 0, heads[g].recovery, w->rank);
    }
    if ((cp->budget > 0.0f || cp->budget_tokens > 0) && !s->ad)
        allocate_budget(cp, views, heads, Hkv, n, w);
    if (s->ad) { /* adaptive: full until the whole sequence is observed; the profile is kept for then */
        for (int32_t g = 0; g < Hkv; g++)
            heads[g].policy_index = cp->n_policies - 1;
        memcpy(s->ad->layers[layer].col, w->col, nk * sizeof(float));
    }
    for (int32_t g = 0; g < Hkv; g++)
        heads[g].pol = cp->shortlist[heads[g].policy_index];
    if (cp->allocation == FG_ALLOC_ADAKV) {
        fg_policy_share_rows(cp, views, Hkv, w->rank, w->shares, w->choice, w->pols);
        for (int32_t g = 0; g < Hkv; g++)
            heads[g].pol = w->pols[g];
    }
    for (int32_t g = 0; g < Hkv; g++) {
        const fg_profile_view pv = views[g];
        fg_head *h = &heads[g];
        const fg_policy *pol = &h->pol;
        h->components = fg_effective_components(pol->components);
        int32_t n_freq;
        int32_t kept = fg_policy_keep(cp, pol, &pv, w->rank, w->pos + (size_t)g * n, NULL, w->flags + (size_t)g * n,
                                      w->score + (size_t)g * n, &n_freq);
        w->compact[g] = (fg_compact_head){.kv_head = g, .n_keep = kept, .pos = w->pos + (size_t)g * n,
                                          .flags = w->flags + (size_t)g * n, .score = w->score + (size_t)g * n};
        h->n_freq = n_freq;
    }

    /* pages for every head, all or nothing */
    for (int32_t g = 0; g < Hkv; g++) {
        st = fg_head_reserve(ctx, &heads[g], fg_pages_for(ctx, w->compact[g].n_keep));
        if (st) {
            for (int32_t i = 0; i <= g; i++)
                fg_head_shrink(ctx, &heads[i], 0);
            return st;
        }
        w->compact[g].pages = heads[g].pages;
    }
    st = ops->compact(&ctx->be, &ctx->layout, &ctx->shape, n, k, v, Hkv, w->compact);
    if (st) {
        for (int32_t g = 0; g < Hkv; g++)
            fg_head_shrink(ctx, &heads[g], 0);
        return st;
    }
    for (int32_t g = 0; g < Hkv; g++)
        heads[g].n_slots = w->compact[g].n_keep;
    s->length[layer] = n;
    if (s->ad && !stats) { /* a chunked prefill observed its rows chunk by chunk */
        fg_adaptive_forget(s->ad, layer);
        st = observe_rows(ctx, s, layer, 0, n - (n < s->ad->window ? n : s->ad->window), n, q);
    }
    if (st == FG_OK && s->ad && s->ad->compress_at == n && all_prefilled(ctx, s))
        st = compress_now(ctx, s);
    if (st) { /* the layer as it was: not prefilled */
        for (int32_t g = 0; g < Hkv; g++)
            fg_head_shrink(ctx, &heads[g], 0);
        s->length[layer] = 0;
    }
    return st;
}

/* What fg_prefill and fg_prefill_chunk check first: the sequence, the
 * arrays, the layer, and that the layer is not prefilled yet. */
static fg_status prefill_checks(fg_context *ctx, const char *fn, int32_t seq, int32_t layer, const float *q,
                                const float *k, const float *v, const float *out, fg_seq **s) {
    fg_status st = get_seq(ctx, seq, s);
    if (st)
        return st;
    CHECK(q && k && v && out, ctx, FG_ERR_INVALID_ARGUMENT, "%s: q, k, v and out must not be NULL", fn);
    CHECK(layer >= 0 && layer < ctx->params.n_layers, ctx, FG_ERR_INVALID_ARGUMENT, "layer %d outside [0, %d)",
          (int)layer, (int)ctx->params.n_layers);
    CHECK((*s)->length[layer] == 0, ctx, FG_ERR_BAD_STATE, "sequence %d is already prefilled at layer %d", (int)seq,
          (int)layer);
    return FG_OK;
}

fg_status fg_prefill(fg_context *ctx, int32_t seq, int32_t layer, const float *q, const float *k, const float *v,
                     float *out) {
    fg_seq *s = NULL;
    fg_status st = prefill_checks(ctx, "fg_prefill", seq, layer, q, k, v, out, &s);
    if (st)
        return st;
    CHECK(!s->stage || s->stage[layer].filled == 0, ctx, FG_ERR_BAD_STATE,
          "sequence %d: layer %d has a chunked prefill in progress (%d of %d rows)", (int)seq, (int)layer,
          (int)s->stage[layer].filled, (int)s->n_prompt);
    prefill_scratch w = {0};
    st = prefill_layer(ctx, s, layer, q, k, v, out, NULL, &w);
    prefill_scratch_free(ctx, &w);
    return st;
}

/* Memory for activations (prompt rows, a chunk): the backend's with FG_IO_DEVICE, else the host's. */
fg_status fg_io_alloc(fg_context *ctx, size_t bytes, float **out) {
    *out = NULL;
    if (ctx->be.device_io)
        return ctx->be.ops->buffer_alloc(&ctx->be, bytes, (void **)out);
    *out = malloc(bytes ? bytes : 1);
    CHECK(*out, ctx, FG_ERR_OUT_OF_MEMORY, "out of host memory for %zu bytes of activations", bytes);
    return FG_OK;
}

static fg_status io_copy(fg_context *ctx, float *dst, const float *src, size_t bytes) {
    if (ctx->be.device_io)
        return fg_backend_copy(&ctx->be, dst, src, bytes);
    memcpy(dst, src, bytes);
    return FG_OK;
}

/* `rows` rows of `width` floats, from src every spitch floats to dst every
 * dpitch floats (one queued copy with FG_IO_DEVICE). */
static fg_status io_copy_rows(fg_context *ctx, float *dst, size_t dpitch, const float *src, size_t spitch,
                              size_t width, size_t rows) {
    const size_t f = sizeof(float);
    if (ctx->be.device_io)
        return fg_backend_copy2d(&ctx->be, dst, dpitch * f, src, spitch * f, width * f, rows);
    for (size_t r = 0; r < rows; r++)
        memcpy(dst + r * dpitch, src + r * spitch, width * f);
    return FG_OK;
}

static void stage_free(fg_context *ctx, fg_prefill_stage *stage) {
    float **bufs[] = {&stage->q, &stage->k, &stage->v, &stage->row_max, &stage->row_sum};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        if (*bufs[i] && ctx->be.device_io)
            ctx->be.ops->buffer_free(&ctx->be, *bufs[i]);
        else
            free(*bufs[i]);
        *bufs[i] = NULL;
    }
    stage->filled = 0;
}

/* Whether a sequence has a chunked prefill in progress on some layer. */
static int stage_in_progress(const fg_context *ctx, const fg_seq *s) {
    for (int32_t l = 0; s->stage && l < ctx->params.n_layers; l++)
        if (s->stage[l].filled)
            return 1;
    return 0;
}

fg_status fg_prefill_chunk(fg_context *ctx, int32_t seq, int32_t layer, int32_t begin, int32_t n, const float *q,
                           const float *k, const float *v, float *out) {
    fg_seq *s = NULL;
    fg_status st = prefill_checks(ctx, "fg_prefill_chunk", seq, layer, q, k, v, out, &s);
    if (st)
        return st;
    const int32_t filled = s->stage ? s->stage[layer].filled : 0, N = s->n_prompt;
    CHECK(begin == filled, ctx, FG_ERR_INVALID_ARGUMENT,
          "fg_prefill_chunk: sequence %d layer %d expects the chunk at row %d, got %d (chunks come in order)",
          (int)seq, (int)layer, (int)filled, (int)begin);
    CHECK(n > 0 && n <= N - begin, ctx, FG_ERR_INVALID_ARGUMENT,
          "fg_prefill_chunk: %d rows at row %d do not fit the prompt of %d", (int)n, (int)begin, (int)N);
    const int32_t Hq = ctx->params.n_q_heads, Hkv = ctx->params.n_kv_heads, d = ctx->params.head_dim;
    const size_t rq = (size_t)Hq * d * sizeof(float), rk = (size_t)Hkv * d * sizeof(float);
    if (!s->stage) {
        s->stage = calloc((size_t)ctx->params.n_layers, sizeof *s->stage);
        CHECK(s->stage, ctx, FG_ERR_OUT_OF_MEMORY, "out of host memory for a chunked prefill");
    }
    fg_prefill_stage *stage = &s->stage[layer];
    if (begin == 0) { /* the prompt's rows of this layer, held until the last chunk */
        stage_free(ctx, stage); /* what a failed first chunk left */
        if ((st = fg_io_alloc(ctx, (size_t)N * rq, &stage->q)) || (st = fg_io_alloc(ctx, (size_t)N * rk, &stage->k)) ||
            (st = fg_io_alloc(ctx, (size_t)N * rk, &stage->v)) ||
            (st = fg_io_alloc(ctx, (size_t)Hq * N * sizeof(float), &stage->row_max)) ||
            (st = fg_io_alloc(ctx, (size_t)Hq * N * sizeof(float), &stage->row_sum))) {
            stage_free(ctx, stage);
            return st;
        }
    }
    /* the chunk's rows join the stage (a failure below leaves `filled` where it was: the chunk can come again) */
    float *mx = NULL, *sm = NULL;
    if ((st = io_copy(ctx, stage->q + (size_t)begin * Hq * d, q, (size_t)n * rq)) == FG_OK &&
        (st = io_copy(ctx, stage->k + (size_t)begin * Hkv * d, k, (size_t)n * rk)) == FG_OK &&
        (st = io_copy(ctx, stage->v + (size_t)begin * Hkv * d, v, (size_t)n * rk)) == FG_OK &&
        (st = fg_io_alloc(ctx, (size_t)Hq * n * sizeof(float), &mx)) == FG_OK &&
        (st = fg_io_alloc(ctx, (size_t)Hq * n * sizeof(float), &sm)) == FG_OK)
        st = ctx->be.ops->prefill_attention(&ctx->be, &ctx->shape, begin + n, begin, q, stage->k, stage->v, out, mx,
                                            sm);
    if (st == FG_OK && s->ad) { /* the prompt's last rows are the adaptive mode's observed ones */
        if (begin == 0)
            fg_adaptive_forget(s->ad, layer);
        st = observe_rows(ctx, s, layer, begin, N - (N < s->ad->window ? N : s->ad->window), begin + n, q);
    }
    if (st == FG_OK) /* [Hq][n] into [Hq][N] at column begin */
        st = io_copy_rows(ctx, stage->row_max + begin, (size_t)N, mx, (size_t)n, (size_t)n, (size_t)Hq);
    if (st == FG_OK)
        st = io_copy_rows(ctx, stage->row_sum + begin, (size_t)N, sm, (size_t)n, (size_t)n, (size_t)Hq);
    if (ctx->be.device_io && (mx || sm) && st == FG_OK && ctx->be.ops->synchronize)
        st = ctx->be.ops->synchronize(&ctx->be); /* the copies out of mx and sm are done before they go */
    float *tmp[2] = {mx, sm};
    for (int i = 0; i < 2; i++)
        if (tmp[i] && ctx->be.device_io)
            ctx->be.ops->buffer_free(&ctx->be, tmp[i]);
        else
            free(tmp[i]);
    if (st)
        return st;
    if (begin + n < N) {
        stage->filled = begin + n;
        return FG_OK;
    }
    /* the last chunk: profile the whole prompt, choose, compact; the stage goes */
    prefill_scratch w = {0};
    const float *const stats[2] = {stage->row_max, stage->row_sum};
    st = prefill_layer(ctx, s, layer, stage->q, stage->k, stage->v, NULL, stats, &w);
    prefill_scratch_free(ctx, &w);
    if (st) {
        stage->filled = begin; /* the last chunk can come again */
        return st;
    }
    stage_free(ctx, stage);
    return FG_OK;
}

/* ------------------------------------------------------------------ decode */

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
    CHECK(dh && pl && added && nc, ctx, FG_ERR_OUT_OF_MEMORY, "out of host memory for a decode batch of %d",
          (int)n_seqs);
    ctx->scratch_heads = n_heads;
    return FG_OK;
}

fg_status fg_decode(fg_context *ctx, int32_t layer, int32_t n_seqs, const int32_t *seqs, const int32_t *tokens,
                    const float *q, const float *k, const float *v, float *out) {
    CHECK(ctx, NULL, FG_ERR_INVALID_ARGUMENT, "fg_decode: context must not be NULL");
    CHECK(seqs && tokens && q && k && v && out, ctx, FG_ERR_INVALID_ARGUMENT,
          "fg_decode: seqs, tokens, q, k, v and out must not be NULL");
    CHECK(layer >= 0 && layer < ctx->params.n_layers, ctx, FG_ERR_INVALID_ARGUMENT, "layer %d outside [0, %d)",
          (int)layer, (int)ctx->params.n_layers);
    CHECK(n_seqs > 0 && n_seqs <= ctx->params.max_seqs, ctx, FG_ERR_INVALID_ARGUMENT,
          "n_seqs must be in 1..%d (max_seqs), got %d", (int)ctx->params.max_seqs, (int)n_seqs);
    const int32_t Hq = ctx->params.n_q_heads, Hkv = ctx->params.n_kv_heads, d = ctx->params.head_dim;
    const int32_t G = Hq / Hkv, P = ctx->layout.page_tokens;
    fg_status st = reserve_scratch(ctx, n_seqs * Hkv, n_seqs);
    if (st)
        return st;

    /* 1. validate every sequence and classify its new token (nothing changes yet) */
    for (int32_t i = 0; i < n_seqs; i++) {
        fg_seq *s = NULL;
        st = get_seq(ctx, seqs[i], &s);
        if (st)
            return st;
        for (int32_t j = 0; j < i; j++)
            CHECK(seqs[j] != seqs[i], ctx, FG_ERR_INVALID_ARGUMENT, "sequence %d appears twice in the batch",
                  (int)seqs[i]);
        const int32_t p = s->length[layer];
        CHECK(p > 0, ctx, FG_ERR_BAD_STATE, "sequence %d: decode before prefill at layer %d", (int)seqs[i],
              (int)layer);
        CHECK(!s->ad || all_prefilled(ctx, s), ctx, FG_ERR_BAD_STATE,
              "sequence %d: an adaptive sequence shares its budget over every layer, so every layer is prefilled "
              "before its first decode step", (int)seqs[i]);
        CHECK(p < ctx->params.max_seq_len, ctx, FG_ERR_CAPACITY,
              "sequence %d is full: %d tokens, max_seq_len %d", (int)seqs[i], (int)p, (int)ctx->params.max_seq_len);
        CHECK(tokens[i] >= 0 && tokens[i] < fg_token_classes_vocab_size(ctx->classes), ctx,
              FG_ERR_INVALID_ARGUMENT, "token %d of sequence %d is outside the vocabulary [0, %d)", (int)tokens[i],
              (int)seqs[i], (int)fg_token_classes_vocab_size(ctx->classes));
        if (p < s->n_tokens) {
            CHECK(s->tokens[p] == tokens[i], ctx, FG_ERR_INVALID_ARGUMENT,
                  "sequence %d: position %d is token %d in another layer, not %d", (int)seqs[i], (int)p,
                  (int)s->tokens[p], (int)tokens[i]);
            ctx->new_cls[i] = s->cls[p];
        } else {
            CHECK(p == s->n_tokens, ctx, FG_ERR_BAD_STATE,
                  "sequence %d: layer %d is at position %d but the sequence has %d tokens", (int)seqs[i], (int)layer,
                  (int)p, (int)s->n_tokens);
            ctx->new_cls[i] = fg_token_classes_next(ctx->classes, s->tokens, p, tokens[i], s->cp.n_sink);
        }
    }

    /* 1b. adaptive sequences observed for their defer_steps: compressed before this step (all or nothing) */
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
            fg_adaptive_swap(&ctx->seqs[seqs[i]], plans[i]);

    /* 2. plan every head on the host and give it the pages of its peak */
    for (int32_t i = 0; i < n_seqs && st == FG_OK; i++) {
        fg_seq *s = &ctx->seqs[seqs[i]];
        const int32_t p = s->length[layer];
        for (int32_t g = 0; g < Hkv; g++) {
            int32_t hi = i * Hkv + g;
            fg_head *h = &s->heads[(size_t)layer * Hkv + g];
            fg_step_plan pl = fg_plan_step(&h->pol, p + 1, s->cls, ctx->new_cls[i], h->n_slots, h->n_freq);
            ctx->plans[hi] = pl;
            /* pages shared with a fork are copied before the step writes them: every
               page where scores, the window or evictions may change a slot, else only
               the page the new row goes to */
            const int rewrites = (h->components & (FG_KEEP_FREQUENT | FG_KEEP_LOCAL)) && !(h->components & FG_KEEP_FULL);
            const int32_t first = rewrites ? 0 : h->n_slots / P, last = rewrites || pl.insert_flag ? h->n_pages : 0;
            int32_t before = h->n_pages;
            st = unshare(ctx, h, first, last);
            if (st == FG_OK)
                st = fg_head_reserve(ctx, h, fg_pages_for(ctx, h->n_slots + (pl.insert_flag ? 1 : 0)));
            ctx->added_pages[hi] = h->n_pages - before;
            if (st) {
                unreserve(ctx, layer, seqs, hi + 1);
                reshare(ctx);
                break;
            }
            ctx->dheads[hi] = (fg_decode_head){
                .pages = h->pages,
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
                st = observe_rows(ctx, s, layer, p, p, p + 1, q + (size_t)i * Hq * d);
        }
        if (st) {
            /* The step's pages go back. Backends fail before they touch a cache
             * (workspace, staging); a device that fails in the middle of its
             * kernels reports FG_ERR_BACKEND, and that batch's caches are undefined. */
            unreserve(ctx, layer, seqs, n_seqs * Hkv);
            reshare(ctx);
        }
    }
    if (plans) { /* the compressions stay with the step, or go with it */
        for (int32_t i = 0; i < n_seqs; i++) {
            if (plans[i] && st)
                fg_adaptive_unswap(&ctx->seqs[seqs[i]], plans[i]);
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
            h->n_slots = pl->n_slots;
            h->n_freq = pl->n_freq;
            fg_head_shrink(ctx, h, (h->n_slots + P - 1) / P);
        }
        if (p == s->n_tokens) {
            s->tokens[p] = tokens[i];
            s->cls[p] = ctx->new_cls[i];
            s->n_tokens++;
        }
        s->length[layer] = p + 1;
    }
    return FG_OK;
}

/* ------------------------------------------------------------------ append, re-profiled */

/* Host scratch of a re-profiling append: N = the most keys of a head
 * (its kept rows and the chunk), T = the sequence's length after it. */
typedef struct reprofile_scratch {
    int32_t *tokens;          /* [T] the tokens so far */
    uint8_t *cls;             /* [T] their classes */
    int32_t *slot_pos;        /* [N] a head's slots */
    int64_t *order;           /* [N] (position, slot), sorted */
    float *slot_score;        /* [N] */
    float *slot_k, *slot_v;   /* [N][d] as read */
    float *key_k, *key_v;     /* [N][d] in position order */
    int32_t *key_pos;         /* [N] */
    uint8_t *key_cls;         /* [N] */
    float *score, *col;       /* [N] */
    float *col_local;         /* [n_windows][N] */
    fg_rank_entry *rank;      /* [N] */
    int32_t *keep_pos, *keep_src; /* [N] */
    uint8_t *keep_flags;      /* [N] */
    float *keep_score;        /* [N] */
    fg_head *fresh;           /* [Hkv] the new caches, committed at the end */
    /* activations (backend memory with FG_IO_DEVICE) */
    float *q, *k, *v;         /* [N][G][d], [N][d], [N][d] */
    float *out;               /* [n][G][d] */
    float *mx, *sm;           /* [G][n] */
    float *row_max, *row_sum; /* [G][N] */
} reprofile_scratch;

void fg_io_free(fg_context *ctx, float *p) {
    if (p && ctx->be.device_io)
        ctx->be.ops->buffer_free(&ctx->be, p);
    else
        free(p);
}

/* Host memory into activation memory. */
fg_status fg_io_write(fg_context *ctx, float *dst, const float *src, size_t bytes) {
    if (ctx->be.device_io)
        return fg_backend_write(&ctx->be, dst, src, bytes);
    memcpy(dst, src, bytes);
    return FG_OK;
}

static void reprofile_free(fg_context *ctx, reprofile_scratch *w) {
    void *host[] = {w->tokens,  w->cls,     w->slot_pos, w->order,    w->slot_score, w->slot_k,   w->slot_v,
                    w->key_k,   w->key_v,   w->key_pos,  w->key_cls,  w->score,      w->col,      w->col_local,
                    w->rank,    w->keep_pos, w->keep_src, w->keep_flags, w->keep_score};
    for (size_t i = 0; i < sizeof host / sizeof host[0]; i++)
        free(host[i]);
    for (int32_t g = 0; w->fresh && g < ctx->params.n_kv_heads; g++) {
        fg_head_shrink(ctx, &w->fresh[g], 0);
        free(w->fresh[g].page_ids);
        free(w->fresh[g].pages);
    }
    free(w->fresh);
    if (ctx->be.device_io && ctx->be.ops->synchronize)
        ctx->be.ops->synchronize(&ctx->be); /* nothing queued still reads them */
    float *act[] = {w->q, w->k, w->v, w->out, w->mx, w->sm, w->row_max, w->row_sum};
    for (size_t i = 0; i < sizeof act / sizeof act[0]; i++)
        fg_io_free(ctx, act[i]);
}

static int by_key(const void *a, const void *b) {
    const int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Entries with `local` whose window at length T reaches an unpinned
 * position the head no longer holds: they cannot be taken (bit e set). */
static uint32_t unreachable_windows(const fg_compression_params *cp, const fg_profile_view *pv, const uint8_t *cls) {
    uint32_t skip = 0;
    for (int32_t e = 0; e < cp->n_policies; e++) {
        const fg_policy *pol = &cp->shortlist[e];
        const uint32_t c = fg_effective_components(pol->components);
        if (!(c & FG_KEEP_LOCAL))
            continue;
        int32_t need = 0, held = 0;
        for (int32_t p = pv->length - fg_policy_window(pol, pv->length); p < pv->length; p++)
            need += !fg_is_pinned(c, cls[p]);
        for (int32_t j = fg_policy_window_start(pol, pv); j < pv->n; j++)
            held += !fg_is_pinned(c, pv->cls[j]);
        if (held < need)
            skip |= 1u << e;
    }
    return skip;
}

/* One KV head of a re-profiling append: attention of the chunk over the
 * head's kept rows and the chunk (into out), the profile over the chunk's
 * rows, the choice, and the new cache in w->fresh[g]'s pages. Reads the
 * head's cache, writes none of it. */
static fg_status reprofile_head(fg_context *ctx, fg_seq *s, int32_t layer, int32_t g, int32_t n, const float *q,
                                const float *k, const float *v, float *out, reprofile_scratch *w) {
    const int32_t Hq = ctx->params.n_q_heads, Hkv = ctx->params.n_kv_heads, d = ctx->params.head_dim, G = Hq / Hkv;
    const int32_t t = s->length[layer], T = t + n;
    const fg_compression_params *cp = &s->cp;
    const fg_head *h = &s->heads[(size_t)layer * Hkv + g];
    const int32_t m = h->n_slots, N = m + n;
    const fg_shape shape = {G, 1, d};
    const size_t row = (size_t)d * sizeof(float);

    /* the kept rows, in position order, then the chunk's */
    fg_status st = fg_backend_read_rows(&ctx->be, &ctx->layout, h->pages, m, w->slot_k, w->slot_v, w->slot_pos, NULL,
                                        w->slot_score);
    if (st)
        return st;
    for (int32_t i = 0; i < m; i++) /* (position, slot): positions are distinct */
        w->order[i] = (int64_t)w->slot_pos[i] << 32 | (uint32_t)i;
    qsort(w->order, (size_t)m, sizeof *w->order, by_key);
    const int ranked = (h->components & FG_KEEP_FREQUENT) != 0; /* its scores were kept up */
    for (int32_t i = 0; i < N; i++) {
        const int32_t o = i < m ? (int32_t)(w->order[i] & 0xffffffff) : -1;
        w->key_pos[i] = i < m ? w->slot_pos[o] : t + (i - m);
        w->key_cls[i] = w->cls[w->key_pos[i]];
        w->score[i] = i < m && ranked ? w->slot_score[o] : 0.0f;
        if (i < m) {
            memcpy(w->key_k + (size_t)i * d, w->slot_k + (size_t)o * d, row);
            memcpy(w->key_v + (size_t)i * d, w->slot_v + (size_t)o * d, row);
        }
    }
    if ((st = fg_io_write(ctx, w->k, w->key_k, (size_t)m * row)) || (st = fg_io_write(ctx, w->v, w->key_v, (size_t)m * row)))
        return st;
    /* the chunk's rows of this head's group: strided in q / k / v */
    const size_t Gd = (size_t)G * d, Hqd = (size_t)Hq * d, Hkvd = (size_t)Hkv * d;
    if ((st = io_copy_rows(ctx, w->q + (size_t)m * Gd, Gd, q + (size_t)g * Gd, Hqd, Gd, (size_t)n)) ||
        (st = io_copy_rows(ctx, w->k + (size_t)m * d, (size_t)d, k + (size_t)g * d, Hkvd, (size_t)d, (size_t)n)) ||
        (st = io_copy_rows(ctx, w->v + (size_t)m * d, (size_t)d, v + (size_t)g * d, Hkvd, (size_t)d, (size_t)n)))
        return st;

    /* attention (pass 1) and the profile (pass 2) of the chunk's rows */
    const fg_backend_ops *ops = ctx->be.ops;
    st = ops->prefill_attention(&ctx->be, &shape, N, m, w->q + (size_t)m * G * d, w->k, w->v, w->out, w->mx, w->sm);
    if (st == FG_OK)
        st = io_copy_rows(ctx, out + (size_t)g * Gd, Hqd, w->out, Gd, Gd, (size_t)n);
    if (st == FG_OK) /* [G][n] into [G][N] at column m */
        st = io_copy_rows(ctx, w->row_max + m, (size_t)N, w->mx, (size_t)n, (size_t)n, (size_t)G);
    if (st == FG_OK)
        st = io_copy_rows(ctx, w->row_sum + m, (size_t)N, w->sm, (size_t)n, (size_t)n, (size_t)G);
    fg_profile_request req = {.n = N, .row_begin = m, .n_windows = 0, .key_pos = w->key_pos};
    int32_t window_of[FG_MAX_SHORTLIST];
    for (int32_t e = 0; e < cp->n_policies; e++) {
        window_of[e] = -1;
        if (!(fg_effective_components(cp->shortlist[e].components) & FG_KEEP_LOCAL))
            continue;
        const int32_t wt = fg_policy_window(&cp->shortlist[e], T);
        int32_t i = 0;
        while (i < req.n_windows && req.window[i] != wt)
            i++;
        if (i == req.n_windows)
            req.window[req.n_windows++] = wt;
        window_of[e] = i;
    }
    if (st == FG_OK)
        st = ops->profile_stats(&ctx->be, &shape, &req, w->q, w->k, w->row_max, w->row_sum, w->col, w->col_local);
    if (st)
        return st;

    /* the choice among the entries the head can still take, and what it keeps */
    for (int32_t j = 0; j < N; j++)
        w->score[j] += w->col[j];
    fg_profile_view pv = {.n = N, .row_begin = m, .length = T, .pos = w->key_pos, .cls = w->key_cls, .col = w->col,
                          .score = w->score};
    for (int32_t e = 0; e < cp->n_policies; e++)
        pv.col_local[e] = window_of[e] >= 0 ? w->col_local + (size_t)window_of[e] * N : NULL;
    fg_head *f = &w->fresh[g];
    f->policy_index = fg_policy_choose(cp, &pv, unreachable_windows(cp, &pv, w->cls), f->recovery, w->rank);
    f->pol = cp->shortlist[f->policy_index];
    const fg_policy *pol = &f->pol;
    f->components = fg_effective_components(pol->components);
    const int32_t kept = fg_policy_keep(cp, pol, &pv, w->rank, w->keep_pos, w->keep_src, w->keep_flags, w->keep_score,
                                        &f->n_freq);
    if ((st = fg_head_reserve(ctx, f, fg_pages_for(ctx, kept))))
        return st;
    f->n_slots = kept;
    const fg_compact_head ch = {.kv_head = 0, .n_keep = kept, .pos = w->keep_pos, .flags = w->keep_flags,
                                .score = w->keep_score, .pages = f->pages, .src = w->keep_src};
    return ops->compact(&ctx->be, &ctx->layout, &shape, N, w->k, w->v, 1, &ch);
}

/* The classes of the chunk's tokens at positions [t, t + n) into w->cls
 * (w->tokens: the tokens so far), checking the tokens another layer has. */
static fg_status chunk_classes(fg_context *ctx, const fg_seq *s, int32_t seq, int32_t t, const int32_t *tokens,
                               int32_t n, reprofile_scratch *w) {
    memcpy(w->tokens, s->tokens, (size_t)s->n_tokens * sizeof *w->tokens);
    memcpy(w->cls, s->cls, (size_t)s->n_tokens);
    const int32_t vocab = fg_token_classes_vocab_size(ctx->classes);
    for (int32_t i = 0; i < n; i++) {
        const int32_t p = t + i;
        CHECK(tokens[i] >= 0 && tokens[i] < vocab, ctx, FG_ERR_INVALID_ARGUMENT,
              "token %d of the chunk (sequence %d) is outside the vocabulary [0, %d)", (int)tokens[i], (int)seq,
              (int)vocab);
        if (p < s->n_tokens) {
            CHECK(s->tokens[p] == tokens[i], ctx, FG_ERR_INVALID_ARGUMENT,
                  "sequence %d: position %d is token %d in another layer, not %d", (int)seq, (int)p,
                  (int)s->tokens[p], (int)tokens[i]);
            continue;
        }
        w->cls[p] = fg_token_classes_next(ctx->classes, w->tokens, p, tokens[i], s->cp.n_sink);
        w->tokens[p] = tokens[i];
    }
    return FG_OK;
}

/* FG_APPEND_REPROFILE: every head of the layer re-profiled over the chunk.
 * The new caches go to new pages; the old ones are given back only when
 * every head has succeeded, so a failure changes nothing. */
static fg_status append_reprofile(fg_context *ctx, fg_seq *s, int32_t seq, int32_t layer, const int32_t *tokens,
                                  int32_t n, const float *q, const float *k, const float *v, float *out) {
    const int32_t Hq = ctx->params.n_q_heads, Hkv = ctx->params.n_kv_heads, d = ctx->params.head_dim, G = Hq / Hkv;
    const int32_t t = s->length[layer], T = t + n;
    fg_head *heads = &s->heads[(size_t)layer * Hkv];
    int32_t N = 0;
    for (int32_t g = 0; g < Hkv; g++)
        N = heads[g].n_slots + n > N ? heads[g].n_slots + n : N;
    const size_t Nd = (size_t)N * d;
    reprofile_scratch w = {0};
    w.tokens = malloc((size_t)T * sizeof *w.tokens);
    w.cls = malloc((size_t)T);
    w.slot_pos = malloc((size_t)N * sizeof(int32_t));
    w.order = malloc((size_t)N * sizeof(int64_t));
    w.slot_score = malloc((size_t)N * sizeof(float));
    w.slot_k = malloc(Nd * sizeof(float));
    w.slot_v = malloc(Nd * sizeof(float));
    w.key_k = malloc(Nd * sizeof(float));
    w.key_v = malloc(Nd * sizeof(float));
    w.key_pos = malloc((size_t)N * sizeof(int32_t));
    w.key_cls = malloc((size_t)N);
    w.score = malloc((size_t)N * sizeof(float));
    w.col = malloc((size_t)N * sizeof(float));
    w.col_local = malloc((size_t)FG_MAX_SHORTLIST * N * sizeof(float));
    w.rank = malloc((size_t)N * sizeof(fg_rank_entry));
    w.keep_pos = malloc((size_t)N * sizeof(int32_t));
    w.keep_src = malloc((size_t)N * sizeof(int32_t));
    w.keep_flags = malloc((size_t)N);
    w.keep_score = malloc((size_t)N * sizeof(float));
    w.fresh = calloc((size_t)Hkv, sizeof *w.fresh);
    fg_status st = FG_OK;
    if (!(w.tokens && w.cls && w.slot_pos && w.order && w.slot_score && w.slot_k && w.slot_v && w.key_k && w.key_v &&
          w.key_pos && w.key_cls && w.score && w.col && w.col_local && w.rank && w.keep_pos && w.keep_src &&
          w.keep_flags && w.keep_score && w.fresh))
        st = fg_error(ctx, FG_ERR_OUT_OF_MEMORY, "out of host memory re-profiling a chunk of %d tokens", (int)n);
    if (st == FG_OK)
        st = chunk_classes(ctx, s, seq, t, tokens, n, &w);
    if (st == FG_OK && (st = fg_io_alloc(ctx, Nd * G * sizeof(float), &w.q)) == FG_OK &&
        (st = fg_io_alloc(ctx, Nd * sizeof(float), &w.k)) == FG_OK && (st = fg_io_alloc(ctx, Nd * sizeof(float), &w.v)) == FG_OK &&
        (st = fg_io_alloc(ctx, (size_t)n * G * d * sizeof(float), &w.out)) == FG_OK &&
        (st = fg_io_alloc(ctx, (size_t)G * n * sizeof(float), &w.mx)) == FG_OK &&
        (st = fg_io_alloc(ctx, (size_t)G * n * sizeof(float), &w.sm)) == FG_OK &&
        (st = fg_io_alloc(ctx, (size_t)G * N * sizeof(float), &w.row_max)) == FG_OK)
        st = fg_io_alloc(ctx, (size_t)G * N * sizeof(float), &w.row_sum);
    for (int32_t g = 0; g < Hkv && st == FG_OK; g++)
        st = reprofile_head(ctx, s, layer, g, n, q, k, v, out, &w);
    if (st == FG_OK && ctx->be.ops->synchronize)
        st = ctx->be.ops->synchronize(&ctx->be); /* the new caches are written */
    if (st == FG_OK) { /* commit: the new caches in, the old pages out (a fork keeps its share) */
        for (int32_t g = 0; g < Hkv; g++) {
            fg_head *h = &heads[g], *f = &w.fresh[g];
            fg_head_shrink(ctx, h, 0);
            const fg_head old = *h;
            *h = *f;
            f->page_ids = old.page_ids; /* freed with the scratch */
            f->pages = old.pages;
            f->n_pages = 0;
            f->cap_pages = old.cap_pages;
        }
        for (int32_t p = s->n_tokens; p < T; p++) {
            s->tokens[p] = w.tokens[p];
            s->cls[p] = w.cls[p];
        }
        s->n_tokens = T > s->n_tokens ? T : s->n_tokens;
        s->length[layer] = T;
    }
    reprofile_free(ctx, &w);
    return st;
}

fg_status fg_seq_append(fg_context *ctx, int32_t seq, int32_t layer, const int32_t *tokens, int32_t n,
                        const float *q, const float *k, const float *v, float *out) {
    CHECK(ctx, NULL, FG_ERR_INVALID_ARGUMENT, "fg_seq_append: context must not be NULL");
    fg_seq *s = NULL;
    fg_status st = get_seq(ctx, seq, &s);
    if (st)
        return st;
    CHECK(tokens && q && k && v && out, ctx, FG_ERR_INVALID_ARGUMENT,
          "fg_seq_append: tokens, q, k, v and out must not be NULL");
    CHECK(layer >= 0 && layer < ctx->params.n_layers, ctx, FG_ERR_INVALID_ARGUMENT, "layer %d outside [0, %d)",
          (int)layer, (int)ctx->params.n_layers);
    CHECK(n > 0, ctx, FG_ERR_INVALID_ARGUMENT, "fg_seq_append: n must be > 0, got %d", (int)n);
    const int32_t t = s->length[layer];
    CHECK(t > 0, ctx, FG_ERR_BAD_STATE, "sequence %d: append before prefill at layer %d", (int)seq, (int)layer);
    CHECK(!stage_in_progress(ctx, s), ctx, FG_ERR_BAD_STATE,
          "sequence %d: append while a chunked prefill is in progress", (int)seq);
    CHECK(n <= ctx->params.max_seq_len - t, ctx, FG_ERR_CAPACITY,
          "sequence %d: %d tokens and %d more exceed max_seq_len %d", (int)seq, (int)t, (int)n,
          (int)ctx->params.max_seq_len);
    if (s->cp.append_mode == FG_APPEND_REPROFILE)
        return append_reprofile(ctx, s, seq, layer, tokens, n, q, k, v, out);
    /* the state before the chunk, sharing its pages: a failure anywhere in it restores this */
    fg_seq before;
    if ((st = seq_clone(ctx, s, &before)))
        return st;
    const size_t rq = (size_t)ctx->params.n_q_heads * ctx->params.head_dim;
    const size_t rk = (size_t)ctx->params.n_kv_heads * ctx->params.head_dim;
    for (int32_t i = 0; i < n && st == FG_OK; i++)
        st = fg_decode(ctx, layer, 1, &seq, &tokens[i], q + i * rq, k + i * rk, v + i * rk, out + i * rq);
    if (st) {
        seq_release(ctx, s);
        *s = before;
        return st; /* fg_decode's message stays */
    }
    seq_release(ctx, &before);
    return FG_OK;
}

/* ------------------------------------------------------------------ inspection */

static size_t kv_row_bytes(const fg_context *ctx) {
    return 2 * (size_t)ctx->params.head_dim * fg_dtype_size(ctx->params.kv_dtype);
}

fg_status fg_head_inspect(const fg_context *ctx, int32_t seq, int32_t layer, int32_t kv_head, fg_head_info *info) {
    fg_seq *s = NULL;
    fg_head *h = NULL;
    fg_status st = get_head(ctx, seq, layer, kv_head, &s, &h);
    if (st)
        return st;
    CHECK(info, (fg_context *)ctx, FG_ERR_INVALID_ARGUMENT, "fg_head_inspect: info must not be NULL");
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
    return FG_OK;
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

fg_status fg_head_positions(fg_context *ctx, int32_t seq, int32_t layer, int32_t kv_head, int32_t *positions,
                            int32_t capacity, int32_t *n_out) {
    fg_seq *s = NULL;
    fg_head *h = NULL;
    fg_status st = get_head(ctx, seq, layer, kv_head, &s, &h);
    if (st)
        return st;
    CHECK(n_out, ctx, FG_ERR_INVALID_ARGUMENT, "fg_head_positions: n_out must not be NULL");
    *n_out = h->n_slots;
    CHECK(positions || h->n_slots == 0, ctx, FG_ERR_INVALID_ARGUMENT, "fg_head_positions: positions is NULL");
    CHECK(capacity >= h->n_slots, ctx, FG_ERR_CAPACITY, "fg_head_positions: capacity %d < %d kept rows",
          (int)capacity, (int)h->n_slots);
    st = ctx->be.ops->read_slots(&ctx->be, &ctx->layout, h->pages, h->n_slots, positions, NULL, NULL);
    if (st)
        return st;
    qsort(positions, (size_t)h->n_slots, sizeof *positions, cmp_i32);
    return FG_OK;
}

static void add_seq_memory(const fg_context *ctx, const fg_seq *s, fg_memory_stats *m) {
    const int32_t Hkv = ctx->params.n_kv_heads;
    const size_t page_kv = (size_t)ctx->layout.page_tokens * kv_row_bytes(ctx);
    const size_t page_meta = ctx->layout.page_bytes - page_kv;
    for (int32_t l = 0; l < ctx->params.n_layers; l++) {
        if (!s->length[l])
            continue;
        for (int32_t g = 0; g < Hkv; g++) {
            const fg_head *h = &s->heads[(size_t)l * Hkv + g];
            m->kv_bytes_held += (size_t)h->n_pages * page_kv;
            m->meta_bytes_held += (size_t)h->n_pages * page_meta;
            m->kv_bytes_full += (size_t)fg_pages_for(ctx, s->length[l]) * page_kv;
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

fg_status fg_memory(const fg_context *ctx, int32_t seq, fg_memory_stats *stats) {
    CHECK(ctx, NULL, FG_ERR_INVALID_ARGUMENT, "fg_memory: context must not be NULL");
    CHECK(stats, (fg_context *)ctx, FG_ERR_INVALID_ARGUMENT, "fg_memory: stats must not be NULL");
    fg_memory_stats m = {0};
    if (seq >= 0) {
        fg_seq *s = NULL;
        fg_status st = get_seq(ctx, seq, &s);
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
        m.meta_bytes_held = (size_t)ctx->pool.in_use * (ctx->layout.page_bytes - page_kv);
        m.kv_bytes_full -= (size_t)shared_full_pages(ctx) * page_kv;
    }
    m.pool_bytes = fg_pool_bytes(&ctx->pool);
    m.pages_in_use = ctx->pool.in_use;
    m.pages_free = fg_pool_pages_total(&ctx->pool) - ctx->pool.in_use;
    *stats = m;
    return FG_OK;
}

fg_status fg_trim(fg_context *ctx) {
    CHECK(ctx, NULL, FG_ERR_INVALID_ARGUMENT, "fg_trim: context must not be NULL");
    fg_pool_trim(&ctx->pool);
    return FG_OK;
}
