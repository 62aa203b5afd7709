/* The registry of backends: names to constructors, plus the page layout that
 * every backend shares. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/backend.h"
#include "common/dtype.h"

typedef struct fg_backend_entry {
    const char *name;
    fg_backend_init_fn *init;
} fg_backend_entry;

static const fg_backend_entry k_backends[] = {
    {"ref", fg_backend_ref_init},
    {"cpu", fg_backend_cpu_init},
    {"cuda", fg_backend_cuda_init},
    {"hip", fg_backend_hip_init},
};

fg_status fg_backend_open(const char *name, fg_threadpool *threads, fg_backend *be) {
    be->threads = threads;
    be->impl = NULL;
    be->ops = NULL;
    for (size_t i = 0; i < sizeof k_backends / sizeof k_backends[0]; i++)
        if (strcmp(name, k_backends[i].name) == 0)
            return k_backends[i].init(be);
    return be->err(be->err_sink, FG_ERR_INVALID_ARGUMENT, "unknown backend \"%s\" (known: ref, cpu, cuda, hip)",
                   name);
}

void fg_backend_close(fg_backend *be) {
    if (be->ops && be->ops->destroy)
        be->ops->destroy(be);
    be->ops = NULL;
    be->impl = NULL;
}

fg_backend_proc fg_backend_get_proc(const fg_backend *be, const char *name) {
    return be->ops && be->ops->get_proc ? be->ops->get_proc(name) : NULL;
}

fg_status fg_backend_write(fg_backend *be, void *dst, const void *src, size_t bytes) {
    if (be->ops->buffer_write)
        return be->ops->buffer_write(be, dst, src, bytes);
    memcpy(dst, src, bytes);
    return FG_OK;
}

fg_status fg_backend_read(fg_backend *be, void *dst, const void *src, size_t bytes) {
    if (be->ops->buffer_read)
        return be->ops->buffer_read(be, dst, src, bytes);
    memcpy(dst, src, bytes);
    return FG_OK;
}

fg_status fg_backend_copy(fg_backend *be, void *dst, const void *src, size_t bytes) {
    if (be->ops->buffer_copy)
        return be->ops->buffer_copy(be, dst, src, bytes);
    memcpy(dst, src, bytes);
    return FG_OK;
}

fg_status fg_backend_copy2d(fg_backend *be, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                            size_t rows) {
    if (be->ops->buffer_copy2d)
        return be->ops->buffer_copy2d(be, dst, dpitch, src, spitch, width, rows);
    for (size_t r = 0; r < rows; r++)
        memcpy((unsigned char *)dst + r * dpitch, (const unsigned char *)src + r * spitch, width);
    return FG_OK;
}

fg_status fg_backend_read_rows(fg_backend *be, const fg_page_layout *L, void *const *pages, int32_t n_slots,
                               float *k, float *v, int32_t *pos, uint8_t *flags, float *score) {
    fg_status st = be->ops->synchronize ? be->ops->synchronize(be) : FG_OK;
    if (st || n_slots <= 0)
        return st;
    unsigned char *page = be->ops->buffer_read ? malloc(L->page_bytes) : NULL;
    if (be->ops->buffer_read && !page)
        return be->err(be->err_sink, FG_ERR_OUT_OF_MEMORY, "out of host memory for a page of %zu bytes", L->page_bytes);
    const int32_t P = L->page_tokens, d = L->head_dim;
    const size_t row_bytes = (size_t)d * fg_dtype_size(L->dtype);
    for (int32_t p = 0; p * P < n_slots && st == FG_OK; p++) {
        const unsigned char *src = pages[p];
        if (page) {
            st = be->ops->buffer_read(be, page, src, L->page_bytes);
            src = page;
        }
        for (int32_t r = 0; r < P && p * P + r < n_slots && st == FG_OK; r++) {
            const size_t s = (size_t)p * P + r;
            for (int32_t c = 0; c < d; c++) {
                k[s * d + c] = fg_load_elem(src + L->k_offset + r * row_bytes, L->dtype, c);
                v[s * d + c] = fg_load_elem(src + L->v_offset + r * row_bytes, L->dtype, c);
            }
            if (pos)
                memcpy(&pos[s], src + L->pos_offset + r * sizeof(int32_t), sizeof(int32_t));
            if (score)
                memcpy(&score[s], src + L->score_offset + r * sizeof(float), sizeof(float));
            if (flags)
                flags[s] = src[L->flags_offset + r];
        }
    }
    free(page);
    return st;
}

size_t fg_dtype_size(fg_dtype dtype) { return dtype == FG_DTYPE_F32 ? 4 : 2; }

static size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

fg_page_layout fg_page_layout_make(int32_t page_tokens, int32_t head_dim, fg_dtype dtype) {
    fg_page_layout L;
    size_t rows = (size_t)page_tokens * (size_t)head_dim * fg_dtype_size(dtype);
    L.page_tokens = page_tokens;
    L.head_dim = head_dim;
    L.dtype = dtype;
    L.k_offset = 0;
    L.v_offset = align_up(rows, 64);
    L.pos_offset = L.v_offset + align_up(rows, 64);
    L.score_offset = L.pos_offset + align_up((size_t)page_tokens * sizeof(int32_t), 16);
    L.flags_offset = L.score_offset + align_up((size_t)page_tokens * sizeof(float), 16);
    L.page_bytes = align_up(L.flags_offset + (size_t)page_tokens, 64);
    return L;
}

fg_status fg_error_to_stderr(void *sink, fg_status status, const char *fmt, ...) {
    (void)sink;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return status;
}
