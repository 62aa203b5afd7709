/* The context: creation (every parameter validated first), destruction,
 * the engine's stream, backend probing. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"

static fg_status validate_params(const fg_context_params *p) {
    FG_CHECK(p->n_layers > 0 && p->n_q_heads > 0 && p->n_kv_heads > 0 && p->head_dim > 0, NULL,
             FG_ERR_INVALID_ARGUMENT, "n_layers (%d), n_q_heads (%d), n_kv_heads (%d) and head_dim (%d) must be > 0",
             (int)p->n_layers, (int)p->n_q_heads, (int)p->n_kv_heads, (int)p->head_dim);
    FG_CHECK(p->n_q_heads % p->n_kv_heads == 0, NULL, FG_ERR_INVALID_ARGUMENT,
             "n_q_heads (%d) must be a multiple of n_kv_heads (%d)", (int)p->n_q_heads, (int)p->n_kv_heads);
    FG_CHECK(p->head_dim <= 1024, NULL, FG_ERR_INVALID_ARGUMENT, "head_dim %d is above the supported 1024",
             (int)p->head_dim);
    FG_CHECK(fg_dtype_name(p->kv_dtype), NULL, FG_ERR_INVALID_ARGUMENT, "unknown kv_dtype %d", (int)p->kv_dtype);
    FG_CHECK(p->v_dtype == -1 || fg_dtype_name((fg_dtype)p->v_dtype), NULL, FG_ERR_INVALID_ARGUMENT,
             "unknown v_dtype %d (-1: V as kv_dtype)", (int)p->v_dtype);
    FG_CHECK(fg_kv_row_bytes(p->kv_dtype, p->head_dim) > 0, NULL, FG_ERR_INVALID_ARGUMENT,
             "kv_dtype %s needs a head_dim that is a multiple of 8 (blocks of 8, 16 or 32 values), got %d",
             fg_dtype_name(p->kv_dtype), (int)p->head_dim);
    FG_CHECK(p->v_dtype == -1 || fg_kv_row_bytes((fg_dtype)p->v_dtype, p->head_dim) > 0, NULL,
             FG_ERR_INVALID_ARGUMENT,
             "v_dtype %s needs a head_dim that is a multiple of 8 (blocks of 8, 16 or 32 values), got %d",
             fg_dtype_name((fg_dtype)p->v_dtype), (int)p->head_dim);
    FG_CHECK(p->max_seqs > 0 && p->max_seq_len > 0, NULL, FG_ERR_INVALID_ARGUMENT,
             "max_seqs (%d) and max_seq_len (%d) must be > 0", (int)p->max_seqs, (int)p->max_seq_len);
    FG_CHECK(p->page_tokens > 0 && p->page_tokens <= 4096, NULL, FG_ERR_INVALID_ARGUMENT,
             "page_tokens must be in 1..4096, got %d", (int)p->page_tokens);
    FG_CHECK(p->pool_chunk_pages > 0, NULL, FG_ERR_INVALID_ARGUMENT, "pool_chunk_pages must be > 0, got %d",
             (int)p->pool_chunk_pages);
    FG_CHECK(p->n_threads >= 0 && p->n_threads <= FG_MAX_THREADS, NULL, FG_ERR_INVALID_ARGUMENT,
             "n_threads must be in 0..%d (0 = the cores this process may run on), got %d: every thread has its own "
             "decode workspace",
             FG_MAX_THREADS, (int)p->n_threads);
    FG_CHECK(!p->threadpool || p->n_threads == 0 || p->n_threads == fg_threadpool_size(p->threadpool), NULL,
             FG_ERR_INVALID_ARGUMENT, "n_threads (%d) differs from the size of the threadpool given (%d): pass 0 or %d",
             (int)p->n_threads, (int)fg_threadpool_size(p->threadpool), (int)fg_threadpool_size(p->threadpool));
    FG_CHECK(p->classes != NULL, NULL, FG_ERR_INVALID_ARGUMENT,
             "classes must not be NULL (build them with fg_token_classes_create)");
    FG_CHECK(p->io == FG_IO_HOST || p->io == FG_IO_DEVICE, NULL, FG_ERR_INVALID_ARGUMENT,
             "io must be FG_IO_HOST (0) or FG_IO_DEVICE (1), got %d", (int)p->io);
    FG_CHECK(p->act_dtype == FG_DTYPE_F32 || p->act_dtype == FG_DTYPE_F16 || p->act_dtype == FG_DTYPE_BF16, NULL,
             FG_ERR_INVALID_ARGUMENT,
             "act_dtype must be FG_DTYPE_F32 (%d), FG_DTYPE_F16 (%d) or FG_DTYPE_BF16 (%d), got %d",
             (int)FG_DTYPE_F32, (int)FG_DTYPE_F16, (int)FG_DTYPE_BF16, (int)p->act_dtype);
    FG_CHECK(p->rope_theta == 0.0f || (p->rope_theta > 1.0f && p->rope_theta < 1e12f), NULL, FG_ERR_INVALID_ARGUMENT,
             "rope_theta must be 0 (RoPE not described) or in (1, 1e12), got %g", (double)p->rope_theta);
    FG_CHECK(p->rope_dims >= 0 && p->rope_dims <= p->head_dim && p->rope_dims % 2 == 0, NULL, FG_ERR_INVALID_ARGUMENT,
             "rope_dims must be even and in 0..head_dim (%d; 0 = head_dim), got %d", (int)p->head_dim,
             (int)p->rope_dims);
    FG_CHECK(p->rope_style == FG_ROPE_ADJACENT || p->rope_style == FG_ROPE_HALVES, NULL, FG_ERR_INVALID_ARGUMENT,
             "rope_style must be FG_ROPE_ADJACENT (0) or FG_ROPE_HALVES (1), got %d", (int)p->rope_style);
    FG_CHECK(!p->rope_freq_factors || p->rope_theta > 0.0f, NULL, FG_ERR_INVALID_ARGUMENT,
             "rope_freq_factors need rope_theta");
    for (int32_t i = 0; p->rope_freq_factors && i < (p->rope_dims ? p->rope_dims : p->head_dim) / 2; i++)
        FG_CHECK(p->rope_freq_factors[i] > 0.0f && p->rope_freq_factors[i] < 1e30f, NULL, FG_ERR_INVALID_ARGUMENT,
                 "rope_freq_factors[%d] must be finite and > 0, got %g", (int)i, (double)p->rope_freq_factors[i]);
    return FG_OK;
}

/* The radians per position of each RoPE pair (fg_context_params' rope_*), or
 * NULL in *out when RoPE is not described. */
static fg_status rope_table(const fg_context_params *p, double **out) {
    *out = NULL;
    if (p->rope_theta == 0.0f)
        return FG_OK;
    const int32_t pairs = (p->rope_dims ? p->rope_dims : p->head_dim) / 2;
    double *f = malloc((size_t)(pairs > 0 ? pairs : 1) * sizeof *f);
    FG_CHECK(f, NULL, FG_ERR_OUT_OF_MEMORY, "out of memory for the RoPE frequencies");
    for (int32_t i = 0; i < pairs; i++)
        f[i] = pow((double)p->rope_theta, -(double)i / pairs) /
               (p->rope_freq_factors ? (double)p->rope_freq_factors[i] : 1.0);
    *out = f;
    return FG_OK;
}

fg_status fg_context_create_sized(const fg_context_params *caller, size_t size, fg_context **out) {
    FG_CHECK(caller && out, NULL, FG_ERR_INVALID_ARGUMENT, "fg_context_create: params and out must not be NULL");
    *out = NULL;
    fg_context_params p; /* the caller's fields over the defaults (fastgen.h's "Growth") */
    fg_context_params_defaults(&p);
    fg_status st = fg_struct_read(&p, sizeof p, caller, size, FG_CONTEXT_PARAMS_OLDEST, "fg_context_params");
    if (st == FG_OK)
        st = validate_params(&p);
    if (st)
        return st;
    const fg_context_params *params = &p;
    const char *backend = params->backend ? params->backend : "cpu";
    FG_CHECK(strlen(backend) < 16, NULL, FG_ERR_INVALID_ARGUMENT, "unknown backend \"%s\"", backend);

    fg_context *ctx = calloc(1, sizeof *ctx);
    FG_CHECK(ctx, NULL, FG_ERR_OUT_OF_MEMORY, "out of memory creating a context");
    ctx->params = *params;
    fg_compression_params_default(&ctx->compression);
    strcpy(ctx->backend_name, backend);
    ctx->params.backend = ctx->backend_name;
    ctx->params.classes = NULL;
    if (ctx->params.rope_theta > 0.0f && ctx->params.rope_dims == 0)
        ctx->params.rope_dims = ctx->params.head_dim;
    ctx->params.rope_freq_factors = NULL;
    ctx->shape = (fg_shape){params->n_q_heads, params->n_kv_heads, params->head_dim};
    ctx->layout = fg_page_layout_make(params->page_tokens, params->head_dim, params->kv_dtype,
                                      params->v_dtype == -1 ? params->kv_dtype : (fg_dtype)params->v_dtype);
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
    if (st == FG_OK && ctx->layout.k_dtype != ctx->layout.v_dtype && !fg_backend_supports(&ctx->be, FG_FEATURE_KV_APART))
        st = fg_error(ctx, FG_ERR_UNAVAILABLE,
                      "K in %s and V in %s: the %s backend's kernels read K and V in one dtype (ref and cpu take "
                      "two); set v_dtype to -1 or to kv_dtype",
                      fg_dtype_name(ctx->layout.k_dtype), fg_dtype_name(ctx->layout.v_dtype), backend);
    if (st == FG_OK && params->io == FG_IO_DEVICE) {
        if (!fg_backend_supports(&ctx->be, FG_FEATURE_DEVICE_IO))
            st = fg_error(ctx, FG_ERR_INVALID_ARGUMENT,
                          "io = FG_IO_DEVICE needs a backend with device memory (cuda, hip); \"%s\" takes host arrays",
                          backend);
        ctx->be.device_io = 1;
    }
    if (st == FG_OK && params->stream) {
        if (!fg_backend_supports(&ctx->be, FG_FEATURE_STREAMS))
            st = fg_error(ctx, FG_ERR_INVALID_ARGUMENT, "a stream was given, but backend \"%s\" has no streams",
                          backend);
        else
            st = ctx->be.ops->set_stream(&ctx->be, params->stream);
    }
    if (st == FG_OK && (st = rope_table(params, &ctx->rope_freq)))
        st = fg_error(ctx, st, "%s", fg_last_error(NULL));
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
    fg_pool_init(&ctx->meta_pool, &ctx->be, ctx, ctx->layout.meta_bytes, params->pool_chunk_pages,
                 params->max_pool_bytes);
    ctx->pool.peer = &ctx->meta_pool;
    ctx->meta_pool.peer = &ctx->pool;
    *out = ctx;
    return FG_OK;
}

void fg_context_destroy(fg_context **pctx) {
    if (!pctx || !*pctx)
        return;
    fg_context *ctx = *pctx;
    if (fg_claimed_here(ctx)) { /* from its log callback: the call in progress still runs on it */
        fg_error(NULL, FG_ERR_BAD_STATE, "fg_context_destroy: called from inside a call on this context (its log "
                                         "callback): the context was not destroyed");
        return;
    }
    if (ctx->seqs)
        for (int32_t i = 0; i < ctx->params.max_seqs; i++)
            if (ctx->seqs[i].in_use)
                fg_seq_release(ctx, &ctx->seqs[i]);
    fg_pool_release(&ctx->pool);
    fg_pool_release(&ctx->meta_pool);
    fg_act_release(ctx);
    free(ctx->seqs);
    free(ctx->dheads);
    free(ctx->plans);
    free(ctx->new_cls);
    free(ctx->added_pages);
    free(ctx->cow);
    fg_token_classes_destroy(&ctx->classes);
    free(ctx->rope_freq);
    fg_backend_close(&ctx->be);
    fg_threadpool_destroy(&ctx->own_threads);
    free(ctx);
    *pctx = NULL;
}

const char *fg_context_backend(const fg_context *ctx) { return ctx ? ctx->backend_name : NULL; }

static fg_status context_set_stream(fg_context *ctx, void *stream) {
    FG_CHECK(ctx, NULL, FG_ERR_INVALID_ARGUMENT, "fg_context_set_stream: context must not be NULL");
    FG_CHECK(fg_backend_supports(&ctx->be, FG_FEATURE_STREAMS), ctx, FG_ERR_INVALID_ARGUMENT, "backend \"%s\" has no streams",
             ctx->backend_name);
    return ctx->be.ops->set_stream(&ctx->be, stream);
}

fg_status fg_context_set_stream(fg_context *ctx, void *stream) {
    FG_CLAIM(ctx, "fg_context_set_stream");
    return fg_release(ctx, context_set_stream(ctx, stream));
}

static fg_status set_compression(fg_context *ctx, const fg_compression_params *caller, size_t size) {
    fg_compression_params cp;
    fg_status st = fg_compression_params_read(&cp, caller, size);
    if (st)
        return fg_error(ctx, st, "fg_context_set_compression: %s", fg_last_error(NULL));
    FG_CHECK(cp.allocation != FG_ALLOC_ADAPTIVE || fg_observe_when_told(cp.observe) ||
                 cp.defer_until <= ctx->params.max_seq_len, ctx,
             FG_ERR_INVALID_ARGUMENT, "fg_context_set_compression: defer_until %d is beyond max_seq_len %d: no sequence "
             "could ever be compressed", (int)cp.defer_until, (int)ctx->params.max_seq_len);
    FG_CHECK(cp.observe != FG_OBSERVE_PREDICTED || ctx->rope_freq, ctx, FG_ERR_INVALID_ARGUMENT,
             "fg_context_set_compression: FG_OBSERVE_PREDICTED advances queries by RoPE, and this context's is not "
             "described (fg_context_params.rope_theta)");
    ctx->compression = cp;
    return FG_OK;
}

fg_status fg_context_set_compression_sized(fg_context *ctx, const fg_compression_params *compression, size_t size) {
    FG_CLAIM(ctx, "fg_context_set_compression");
    return fg_release(ctx, set_compression(ctx, compression, size));
}

static fg_status synchronize(fg_context *ctx) {
    FG_CHECK(ctx, NULL, FG_ERR_INVALID_ARGUMENT, "fg_synchronize: context must not be NULL");
    return ctx->be.ops->synchronize ? ctx->be.ops->synchronize(&ctx->be) : FG_OK;
}

fg_status fg_synchronize(fg_context *ctx) {
    FG_CLAIM(ctx, "fg_synchronize");
    return fg_release(ctx, synchronize(ctx));
}

fg_status fg_backend_probe(const char *name) {
    FG_CHECK(name, NULL, FG_ERR_INVALID_ARGUMENT, "fg_backend_probe: name must not be NULL");
    fg_backend be = {.err = fg_error_sink, .err_sink = NULL};
    fg_status st = fg_backend_open(name, NULL, &be);
    if (st == FG_OK)
        fg_backend_close(&be);
    return st;
}
