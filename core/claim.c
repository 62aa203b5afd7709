/* The claim every entry point that takes a context makes first: one call at
 * a time per context (fastgen.h's threads paragraph), none from a thread the
 * context's pool would refuse. */
#include <stdatomic.h>

#include "core/internal.h"

/* Only its address matters: a thread's own marker. */
static _Thread_local char t_marker;

int fg_claimed_here(const fg_context *ctx) {
    return atomic_load_explicit(&((fg_context *)ctx)->owner, memory_order_relaxed) == (const void *)&t_marker;
}

fg_status fg_claim(const fg_context *cctx, const char *fn) {
    if (!cctx)
        return fg_error(NULL, FG_ERR_INVALID_ARGUMENT, "%s: context must not be NULL", fn);
    fg_context *ctx = (fg_context *)cctx; /* the claim and the message are all a const call writes */
    if (fg_threadpool_blocked(ctx->threads)) /* every run of the call on its pool would be refused */
        return fg_error(NULL, FG_ERR_BAD_STATE,
                        "%s: called from a task of a job that waits on this context's thread pool through another "
                        "pool (a task of pool A ran pool B, whose task calls a context on A): this call did nothing",
                        fn);
    const void *me = &t_marker, *none = NULL;
    if (atomic_load_explicit(&ctx->owner, memory_order_relaxed) == me) {
        if (ctx->in_log) /* the call in progress is in the middle of its work: nothing may run on it */
            return fg_error(NULL, FG_ERR_BAD_STATE,
                            "%s: called from the context's log callback, in the middle of a call on this context "
                            "(a callback may read fg_last_error, not call into its context): this call did nothing",
                            fn);
        ctx->depth++;
        return FG_OK;
    }
    if (!atomic_compare_exchange_strong_explicit(&ctx->owner, &none, me, memory_order_acquire,
                                                 memory_order_relaxed))
        return fg_error(NULL, FG_ERR_BAD_STATE,
                        "%s: another thread is inside a call on this context (one call at a time per context; "
                        "this call did nothing)", fn);
    ctx->depth = 1;
    fg_error_clear(ctx);
    return FG_OK;
}

fg_status fg_release(const fg_context *cctx, fg_status st) {
    fg_context *ctx = (fg_context *)cctx;
    if (--ctx->depth == 0)
        atomic_store_explicit(&ctx->owner, NULL, memory_order_release);
    return st;
}
