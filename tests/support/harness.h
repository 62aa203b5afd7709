/*
 * A tiny test harness: checks that count instead of abort, a seeded RNG
 * whose seed is printed (and settable with FG_TEST_SEED), and the closing
 * line "N passed, N failed" that CI reads.
 */
#ifndef FG_TEST_HARNESS_H
#define FG_TEST_HARNESS_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "fastgen.h"

static int g_pass, g_fail;

/* 1 in a build under AddressSanitizer or ThreadSanitizer (gcc or clang), where
 * the long cases take a shorter form. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define FG_TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define FG_TEST_SANITIZED 1
#endif
#endif
#ifndef FG_TEST_SANITIZED
#define FG_TEST_SANITIZED 0
#endif

/* A context of the tests' shape: the defaults, the backend, layers and heads. */
static inline fg_context_params test_context_params(const char *backend, int32_t layers, int32_t q_heads,
                                                    int32_t kv_heads, int32_t head_dim) {
    fg_context_params p;
    fg_context_params_default(&p);
    p.backend = backend;
    p.n_layers = layers;
    p.n_q_heads = q_heads;
    p.n_kv_heads = kv_heads;
    p.head_dim = head_dim;
    return p;
}

#define EXPECT(cond, ...)                                                                                              \
    do {                                                                                                               \
        if (cond) {                                                                                                    \
            g_pass++;                                                                                                  \
        } else {                                                                                                       \
            g_fail++;                                                                                                  \
            fprintf(stderr, "%s:%d: FAILED: %s: ", __FILE__, __LINE__, #cond);                                         \
            fprintf(stderr, __VA_ARGS__);                                                                              \
            fputc('\n', stderr);                                                                                       \
        }                                                                                                              \
    } while (0)

/* A call that must succeed; prints the library's message when it does not. */
#define EXPECT_OK(ctx, call)                                                                                           \
    do {                                                                                                               \
        fg_status st_ = (call);                                                                                        \
        EXPECT(st_ == FG_OK, "%s -> %s (%s)", #call, fg_status_string(st_), fg_last_error(ctx));                       \
    } while (0)

/* A call that must fail with `status` and leave a non-empty message. */
#define EXPECT_STATUS(ctx, status, call)                                                                               \
    do {                                                                                                               \
        fg_status st_ = (call);                                                                                        \
        EXPECT(st_ == (status) && fg_last_error(ctx)[0] != '\0', "%s -> %s, wanted %s", #call, fg_status_string(st_),  \
               fg_status_string(status));                                                                              \
    } while (0)

static uint64_t g_rng;

static inline uint64_t rng_next(void) {
    uint64_t x = (g_rng += 0x9e3779b97f4a7c15ull);
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static inline double rng_uniform(void) { return ((double)(rng_next() >> 11) + 0.5) * 0x1p-53; }
static inline int32_t rng_int(int32_t lo, int32_t hi) { return lo + (int32_t)(rng_next() % (uint64_t)(hi - lo + 1)); }
static inline float rng_gauss(void) {
    return (float)(sqrt(-2.0 * log(rng_uniform())) * cos(6.283185307179586 * rng_uniform()));
}

static inline void test_seed(const char *name) {
    const char *env = getenv("FG_TEST_SEED");
    uint64_t seed = env ? strtoull(env, NULL, 0) : 20261130ull;
    g_rng = seed;
    printf("%s: seed %llu (set FG_TEST_SEED to change)\n", name, (unsigned long long)seed);
}

/* Whether a backend that is not here fails the test instead of skipping it
 * (exit 77). The HIP-CPU build sets FG_TEST_REQUIRE_BACKEND for its gpu suite:
 * emulation always exists there, so a skip would hide a broken build. */
static inline int test_backend_required(void) {
    const char *env = getenv("FG_TEST_REQUIRE_BACKEND");
    return env && env[0] && env[0] != '0';
}

static inline int test_finish(void) {
    printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}

#ifdef FASTGEN_H
/* Runs `run` on the backends named on the command line (argv[1..]), or on
 * ref and cpu. A backend that is not here is skipped, or fails the test when
 * one is required. Returns the exit code: 77 (skipped) when a named backend
 * was not here and nothing failed, as the test did not test what it was
 * asked to ("ref cuda" on a machine without CUDA tested ref only). */
static inline int test_each_backend(int argc, char **argv, void (*run)(const char *backend)) {
    static const char *const dflt[] = {"ref", "cpu"};
    const char *const *names = argc > 1 ? (const char *const *)argv + 1 : dflt;
    const int n = argc > 1 ? argc - 1 : 2;
    int skipped = 0;
    for (int i = 0; i < n; i++) {
        if (fg_backend_probe(names[i]) != FG_OK) {
            printf("%s: not tested: %s\n", names[i], fg_last_error(NULL));
            EXPECT(!test_backend_required(), "backend %s is required here", names[i]);
            skipped++;
            continue;
        }
        run(names[i]);
    }
    if (skipped && !g_fail && !test_backend_required()) {
        printf("%d passed, skipped: %d of the %d backends asked for are not here\n", g_pass, skipped, n);
        return 77;
    }
    return test_finish();
}
#endif

#endif
