/* The registry of backends: names to constructors, the copies between host
 * and backend memory, the extras by name. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/backend.h"
#include "backends/backend_host.h"

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

const char *fg_backend_table_check(const fg_backend_ops *o) {
    if (!o->buffer_alloc || !o->buffer_free)
        return "buffer_alloc and buffer_free";
    if (!o->prefill_attention)
        return "prefill_attention";
    if (!o->profile_stats)
        return "profile_stats";
    if (!o->compact)
        return "compact";
    if (!o->decode_step)
        return "decode_step";
    if (!o->read_slots && o->buffer_read)
        return "read_slots (a backend with memory of its own has no host fallback)";
    if (!o->adaptive_observe != !o->adaptive_errors)
        return "adaptive_observe and adaptive_errors (both or neither)";
    return NULL;
}

fg_status fg_backend_open(const char *name, fg_threadpool *threads, fg_backend *be) {
    be->threads = threads;
    be->impl = NULL;
    be->ops = NULL;
    for (size_t i = 0; i < sizeof k_backends / sizeof k_backends[0]; i++) {
        if (strcmp(name, k_backends[i].name) != 0)
            continue;
        const fg_status st = k_backends[i].init(be);
        const char *missing = st == FG_OK ? fg_backend_table_check(be->ops) : NULL;
        if (!missing)
            return st;
        fg_backend_close(be);
        return be->err(be->err_sink, FG_ERR_INTERNAL, "backend \"%s\": its table has no %s", name, missing);
    }
    return be->err(be->err_sink, FG_ERR_INVALID_ARGUMENT, "unknown backend \"%s\" (known: ref, cpu, cuda, hip)",
                   name);
}

int fg_backend_supports(const fg_backend *be, fg_backend_feature feature) {
    const fg_backend_ops *o = be->ops;
    switch (feature) {
    case FG_FEATURE_ADAPTIVE:
        return o->adaptive_observe && o->adaptive_errors;
    case FG_FEATURE_KV_APART:
        return o->kv_apart;
    case FG_FEATURE_DEVICE_IO:
        return o->synchronize != NULL;
    case FG_FEATURE_STREAMS:
        return o->set_stream != NULL;
    case FG_FEATURE_CONVERT:
        return o->convert != NULL;
    }
    return 0;
}

fg_status fg_backend_read_slots(fg_backend *be, const fg_page_layout *layout, void *const *meta, int32_t n_slots,
                                int32_t *pos, uint8_t *flags, float *score) {
    if (be->ops->read_slots)
        return be->ops->read_slots(be, layout, meta, n_slots, pos, flags, score);
    return fg_host_read_slots(be, layout, meta, n_slots, pos, flags, score); /* host memory (fg_backend_open) */
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

fg_status fg_error_to_stderr(void *sink, fg_status status, const char *fmt, ...) {
    (void)sink;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return status;
}
