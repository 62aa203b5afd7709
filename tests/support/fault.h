/*
 * Allocation fault injection by link-time wrapping: a test linked with
 *   -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc,--wrap=aligned_alloc
 * routes every allocation of its own objects and of the static libraries it
 * links (the library, the model loaders, HIP-CPU's device allocator) through
 * here. fault_reset(k) makes the k-th allocation made inside active spans
 * (fault_active) fail, once; a walk over k = 1, 2, ... ends when a run no
 * longer reaches its k-th allocation, and fault_count() tells how many there
 * were.
 * Allocations inside shared libraries (libc, libgomp, OpenBLAS) are not seen,
 * nor those of other threads than the caller's.
 */
#ifndef FG_TEST_FAULT_H
#define FG_TEST_FAULT_H

#include <pthread.h>
#include <stddef.h>

void *__real_malloc(size_t n);
void *__real_calloc(size_t count, size_t n);
void *__real_realloc(void *p, size_t n);
void *__real_aligned_alloc(size_t align, size_t n);
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t count, size_t n);
void *__wrap_realloc(void *p, size_t n);
void *__wrap_aligned_alloc(size_t align, size_t n);

static long g_fault_at;   /* the allocation that fails, counted from 1 over active spans; 0 = none */
static long g_fault_seen; /* allocations seen in active spans */
static int g_fault_active, g_fault_fired;
static pthread_t g_fault_thread; /* the caller's: the library allocates only there */

/* Only the calling thread's allocations count: a runtime's own worker threads
 * (HIP-CPU runs kernels and grows fiber stacks on them) are not the library's. */
static int fault_hit(void) {
    if (!__atomic_load_n(&g_fault_active, __ATOMIC_SEQ_CST) || !pthread_equal(pthread_self(), g_fault_thread))
        return 0;
    if (__atomic_add_fetch(&g_fault_seen, 1, __ATOMIC_SEQ_CST) != g_fault_at)
        return 0;
    __atomic_store_n(&g_fault_fired, 1, __ATOMIC_SEQ_CST);
    return 1;
}

void *__wrap_malloc(size_t n) { return fault_hit() ? NULL : __real_malloc(n); }
void *__wrap_calloc(size_t count, size_t n) { return fault_hit() ? NULL : __real_calloc(count, n); }
void *__wrap_realloc(void *p, size_t n) { return fault_hit() ? NULL : __real_realloc(p, n); }
void *__wrap_aligned_alloc(size_t align, size_t n) { return fault_hit() ? NULL : __real_aligned_alloc(align, n); }

/* A new walk step: the k-th allocation made in active spans fails (k = 0: none). */
static inline void fault_reset(long k) {
    g_fault_at = k;
    g_fault_seen = 0;
    g_fault_fired = 0;
    g_fault_active = 0;
}

/* Only allocations between fault_active(1) and fault_active(0) count. */
static inline void fault_active(int on) {
    g_fault_thread = pthread_self();
    __atomic_store_n(&g_fault_active, on, __ATOMIC_SEQ_CST);
}
static inline int fault_fired(void) { return __atomic_load_n(&g_fault_fired, __ATOMIC_SEQ_CST); }
static inline long fault_count(void) { return __atomic_load_n(&g_fault_seen, __ATOMIC_SEQ_CST); }

#endif
