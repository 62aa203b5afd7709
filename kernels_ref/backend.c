/* The `ref` backend: host memory and the serial reference kernels. It is the
 * oracle every other backend is checked against. */
#include <stdlib.h>
#include <string.h>

#include "backends/backend_host.h"
#include "kernels_ref/kernels_ref.h"

/* The ref op table; its two forms differ in where decode_step finds the
 * page tables (FASTGEN_REF_TABLES below), nothing else. */
#define REF_OPS(tables, step)                                                                                           \
    {                                                                                                                  \
        .name = "ref", .kv_apart = 1, .device_tables = (tables), .buffer_alloc = fg_host_buffer_alloc,                 \
        .buffer_free = fg_host_buffer_free, .prefill_attention = fg_ref_prefill_attention,                             \
        .profile_stats = fg_ref_profile_stats, .compact = fg_ref_compact, .decode_step = (step),                       \
        .read_slots = fg_host_read_slots, .adaptive_observe = fg_ref_adaptive_observe,                                 \
        .adaptive_errors = fg_ref_adaptive_errors,                                                                     \
    }

static const fg_backend_ops k_ref_ops = REF_OPS(0, fg_ref_decode_step);

/* FASTGEN_REF_TABLES=1: the ref kernels behind page tables kept as a GPU
 * backend keeps them (device_tables, docs/backends.md "Page tables on the
 * device"). Each step first checks that the entries the core says are
 * current hold the head's pages, then writes the rest, as the GPU's
 * write_tables does. An entry the core left stale (a page changed without
 * lowering tab_valid) is FG_ERR_INTERNAL naming it: the core's side of the
 * device tables, checked on the host and under the sanitizers. */
static fg_status ref_tables_decode_step(fg_backend *be, const fg_page_layout *layout, const fg_shape *shape,
                                        int32_t n_heads, const fg_decode_head *heads) {
    for (int32_t i = 0; i < n_heads; i++) {
        const fg_decode_head *h = &heads[i];
        if (!h->tab) /* a caller without tables (as the GPU backends take it) */
            continue;
        if (h->tab_valid < 0 || h->tab_valid > h->n_pages || h->tab_cap < h->n_pages)
            return be->err(be->err_sink, FG_ERR_INTERNAL,
                           "decode_step: head %d's page table (room for %d of %d pages, %d valid) does not hold "
                           "the step's pages",
                           (int)i, (int)h->tab_cap, (int)h->n_pages, (int)h->tab_valid);
        for (int32_t p = 0; p < h->tab_valid; p++)
            if (h->tab[p] != h->pages[p] || h->tab[h->tab_cap + p] != h->meta[p])
                return be->err(be->err_sink, FG_ERR_INTERNAL,
                               "decode_step: head %d's page table entry %d is stale (its %s page changed; %d of %d "
                               "entries said valid)",
                               (int)i, (int)p, h->tab[p] != h->pages[p] ? "row" : "meta", (int)h->tab_valid,
                               (int)h->n_pages);
    }
    for (int32_t i = 0; i < n_heads; i++) {
        const fg_decode_head *h = &heads[i];
        for (int32_t p = h->tab_valid; h->tab && p < h->n_pages; p++) {
            h->tab[p] = h->pages[p];
            h->tab[h->tab_cap + p] = h->meta[p];
        }
    }
    return fg_ref_decode_step(be, layout, shape, n_heads, heads);
}

static const fg_backend_ops k_ref_tables_ops = REF_OPS(1, ref_tables_decode_step);

fg_status fg_backend_ref_init(fg_backend *be) {
    const char *tables = getenv("FASTGEN_REF_TABLES");
    be->ops = tables && !strcmp(tables, "1") ? &k_ref_tables_ops : &k_ref_ops;
    return FG_OK;
}
