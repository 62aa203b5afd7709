/* Scratch and activation memory: host scratch allocated all or nothing,
 * activation buffers (host memory, or the backend's with FG_IO_DEVICE) and
 * the copies between them. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"

/* Memory for activations (prompt rows, a chunk): the backend's with FG_IO_DEVICE, else the host's. */
fg_status fg_io_alloc(fg_context *ctx, size_t bytes, float **out) {
    *out = NULL;
    if (ctx->be.device_io)
        return ctx->be.ops->buffer_alloc(&ctx->be, bytes, (void **)out);
    *out = malloc(bytes ? bytes : 1);
    FG_CHECK(*out, ctx, FG_ERR_OUT_OF_MEMORY, "out of host memory for %zu bytes of activations", bytes);
    return FG_OK;
}

fg_status fg_io_copy(fg_context *ctx, float *dst, const float *src, size_t bytes) {
    if (ctx->be.device_io)
        return fg_backend_copy(&ctx->be, dst, src, bytes);
    memcpy(dst, src, bytes);
    return FG_OK;
}

/* `rows` rows of `width` floats, from src every spitch floats to dst every
 * dpitch floats (one queued copy with FG_IO_DEVICE). */
fg_status fg_io_copy_rows(fg_context *ctx, float *dst, size_t dpitch, const float *src, size_t spitch,
                              size_t width, size_t rows) {
    const size_t f = sizeof(float);
    if (ctx->be.device_io)
        return fg_backend_copy2d(&ctx->be, dst, dpitch * f, src, spitch * f, width * f, rows);
    for (size_t r = 0; r < rows; r++)
        memcpy(dst + r * dpitch, src + r * spitch, width * f);
    return FG_OK;
}

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

int fg_alloc_all(const fg_alloc_item *items, size_t n) {
    int ok = 1;
    for (size_t i = 0; i < n; i++) {
        if (!items[i].bytes)
            continue; /* not needed here: the pointer stays as it is */
        *items[i].ptr = malloc(items[i].bytes);
        ok &= *items[i].ptr != NULL;
    }
    return ok;
}

/* n values between fp32 and a 16-bit dtype where they lie: a loop on the
 * host, the backend's convert op on the device. */
static fg_status act_convert(fg_context *ctx, void *dst, fg_dtype dst_dtype, const void *src, fg_dtype src_dtype,
                             size_t n) {
    if (ctx->be.device_io) {
        FG_CHECK(fg_backend_supports(&ctx->be, FG_FEATURE_CONVERT), ctx, FG_ERR_UNAVAILABLE,
                 "backend \"%s\" cannot convert device activations (act_dtype %s)", ctx->backend_name,
                 fg_dtype_name((fg_dtype)ctx->params.act_dtype));
        return ctx->be.ops->convert(&ctx->be, dst, dst_dtype, src, src_dtype, n);
    }
    const size_t part = (size_t)1 << 30; /* fg_store_row / fg_load_elem count in int32 */
    for (size_t at = 0; at < n; at += part) {
        const int32_t m = (int32_t)(n - at < part ? n - at : part);
        if (src_dtype == FG_DTYPE_F32)
            fg_store_row((uint16_t *)dst + at, dst_dtype, (const float *)src + at, m);
        else
            for (int32_t i = 0; i < m; i++)
                ((float *)dst)[at + (size_t)i] = fg_load_elem((const uint16_t *)src + at, src_dtype, m, i);
    }
    return FG_OK;
}

/* Device work queued on a buffer ends before it goes. */
static void act_settle(fg_context *ctx) {
    if (ctx->be.device_io && ctx->be.ops->synchronize)
        (void)ctx->be.ops->synchronize(&ctx->be); /* a failure shows at the caller's next synchronisation */
}

void fg_act_release(fg_context *ctx) {
    int any = 0;
    for (int i = 0; i < 4; i++)
        any |= ctx->act[i] != NULL;
    if (any)
        act_settle(ctx);
    for (int i = 0; i < 4; i++) {
        fg_io_free(ctx, ctx->act[i]);
        ctx->act[i] = NULL;
        ctx->act_cap[i] = 0;
    }
}

/* Buffer i of at least n floats (its contents not kept). */
static fg_status act_buffer(fg_context *ctx, int i, size_t n) {
    if (ctx->act_cap[i] >= n)
        return FG_OK;
    if (ctx->act[i])
        act_settle(ctx);
    fg_io_free(ctx, ctx->act[i]);
    ctx->act[i] = NULL;
    ctx->act_cap[i] = 0;
    fg_status st = fg_io_alloc(ctx, n * sizeof(float), &ctx->act[i]);
    if (st == FG_OK)
        ctx->act_cap[i] = n;
    return st;
}

int32_t fg_act_prompt(const fg_context *ctx, int32_t seq) {
    return seq >= 0 && seq < ctx->params.max_seqs && ctx->seqs[seq].in_use ? ctx->seqs[seq].n_prompt : 0;
}

size_t fg_act_rows(const fg_context *ctx, int32_t seq, int64_t rows, int64_t limit) {
    if (seq >= 0 && (seq >= ctx->params.max_seqs || !ctx->seqs[seq].in_use))
        return 0;
    return rows > 0 && rows <= limit ? (size_t)rows : 0;
}

fg_status fg_act_in(fg_context *ctx, const char *fn, size_t rows, const void *q, const void *k, const void *v,
                    void *out, fg_act_call *c) {
    *c = (fg_act_call){q, k, v, out, NULL, 0};
    const fg_dtype at = (fg_dtype)ctx->params.act_dtype;
    const size_t align = at == FG_DTYPE_F32 ? 4 : 2;
    const void *arr[4] = {q, k, v, out};
    static const char *const names[4] = {"q", "k", "v", "out"};
    for (int i = 0; i < 4; i++)
        FG_CHECK((uintptr_t)arr[i] % align == 0, ctx, FG_ERR_INVALID_ARGUMENT,
                 "%s: %s at %p is not aligned to its %s elements (%zu bytes)", fn, names[i], arr[i],
                 fg_dtype_name(at), align);
    if (at == FG_DTYPE_F32 || !q || !k || !v || !out || rows == 0)
        return FG_OK; /* nothing to convert, or a call the checks after this refuse */
    const size_t nq = rows * (size_t)ctx->params.n_q_heads * (size_t)ctx->params.head_dim;
    const size_t nk = rows * (size_t)ctx->params.n_kv_heads * (size_t)ctx->params.head_dim;
    const void *src[3] = {q, k, v};
    const size_t n[4] = {nq, nk, nk, nq};
    fg_status st = FG_OK;
    for (int i = 0; i < 4 && st == FG_OK; i++)
        st = act_buffer(ctx, i, n[i]);
    for (int i = 0; i < 3 && st == FG_OK; i++)
        st = act_convert(ctx, ctx->act[i], FG_DTYPE_F32, src[i], at, n[i]);
    if (st)
        return st;
    *c = (fg_act_call){ctx->act[0], ctx->act[1], ctx->act[2], ctx->act[3], out, nq};
    return FG_OK;
}

fg_status fg_act_out(fg_context *ctx, const fg_act_call *c, fg_status st) {
    if (st || !c->user_out)
        return st;
    return act_convert(ctx, c->user_out, (fg_dtype)ctx->params.act_dtype, c->out, FG_DTYPE_F32, c->out_n);
}
