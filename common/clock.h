/*
 * A monotonic clock in nanoseconds, for the host code that times itself: the
 * thread pool's spin (core/threads.c) and the cpu backend's prefetch probe
 * (kernels_cpu/decode_step.c).
 */
#ifndef FG_CLOCK_H
#define FG_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline int64_t fg_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

#endif
