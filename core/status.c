/* Status names, the last-error messages and the version. */
#include <stdio.h>
#include <string.h>

#include "fastgen_config.h"
#include "core/internal.h"

static _Thread_local char t_error[512] = "";

const char *fg_status_string(fg_status status) {
    switch (status) {
    case FG_OK: return "FG_OK: success";
    case FG_ERR_INVALID_ARGUMENT: return "FG_ERR_INVALID_ARGUMENT: invalid argument";
    case FG_ERR_OUT_OF_MEMORY: return "FG_ERR_OUT_OF_MEMORY: out of memory";
    case FG_ERR_UNAVAILABLE: return "FG_ERR_UNAVAILABLE: not available in this build or on this machine";
    case FG_ERR_BAD_STATE: return "FG_ERR_BAD_STATE: call not valid in the current state";
    case FG_ERR_CAPACITY: return "FG_ERR_CAPACITY: capacity exceeded";
    case FG_ERR_BACKEND: return "FG_ERR_BACKEND: backend failure";
    case FG_ERR_IO: return "FG_ERR_IO: input/output error";
    case FG_ERR_FORMAT: return "FG_ERR_FORMAT: malformed data";
    case FG_ERR_INTERNAL: return "FG_ERR_INTERNAL: internal error";
    }
    return "unknown fg_status";
}

const char *fg_version(void) { return FG_VERSION_STRING; }

const char *fg_build_backends(void) { return FG_BUILD_BACKENDS; }

const char *fg_last_error(const fg_context *ctx) { return ctx ? ctx->error : t_error; }

/* The context's log callback, run in the middle of a call: a call on ctx from it is refused (fg_claim),
 * and what it leaves in this thread's message (a refused call's) is put back. */
static void log_to(fg_context *ctx, fg_log_level level, const char *msg) {
    if (!ctx->params.log_fn)
        return;
    char saved[sizeof t_error];
    memcpy(saved, t_error, sizeof saved);
    ctx->in_log++;
    ctx->params.log_fn(ctx->params.log_user, level, msg);
    ctx->in_log--;
    memcpy(t_error, saved, sizeof t_error);
}

static fg_status record(fg_context *ctx, fg_status status, const char *fmt, va_list ap) {
    char msg[sizeof t_error]; /* the arguments may point into t_error itself */
    vsnprintf(msg, sizeof msg, fmt, ap);
    memcpy(t_error, msg, sizeof msg);
    if (ctx) {
        memcpy(ctx->error, msg, sizeof ctx->error);
        log_to(ctx, FG_LOG_ERROR, msg);
    }
    return status;
}

fg_status fg_error(fg_context *ctx, fg_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    record(ctx, status, fmt, ap);
    va_end(ap);
    return status;
}

void fg_error_save(const fg_context *ctx, fg_error_saved *saved) {
    memcpy(saved->ctx, ctx->error, sizeof saved->ctx);
    memcpy(saved->thread, t_error, sizeof saved->thread);
}

void fg_error_restore(fg_context *ctx, const fg_error_saved *saved, const char *what) {
    if (ctx->params.log_fn) {
        char msg[sizeof t_error + 128];
        snprintf(msg, sizeof msg, "%s failed (the call goes on): %s", what, ctx->error);
        log_to(ctx, FG_LOG_WARN, msg);
    }
    memcpy(ctx->error, saved->ctx, sizeof ctx->error);
    memcpy(t_error, saved->thread, sizeof t_error);
}

void fg_error_clear(fg_context *ctx) {
    ctx->error[0] = '\0';
    t_error[0] = '\0';
}

fg_status fg_error_sink(void *ctx, fg_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    record((fg_context *)ctx, status, fmt, ap);
    va_end(ap);
    return status;
}
