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
