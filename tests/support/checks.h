/*
 * Checks shared by the backend tests: outputs with a guard region after
 * them, and NMSE in double with NaN/Inf failing.
 */
#ifndef FG_TEST_CHECKS_H
#define FG_TEST_CHECKS_H

#include <math.h>
#include <stdlib.h>

#define GUARD 64
#define GUARD_VALUE 1234.5f

static inline float *guarded(size_t n) {
    if (n > ((size_t)1 << 34)) /* no test asks for this much; keeps the allocator size bounded */
        n = 0;
    float *p = malloc((n + GUARD) * sizeof *p);
    for (size_t i = 0; i < n + GUARD; i++)
        p[i] = GUARD_VALUE;
    return p;
}

static inline int guard_ok(const float *p, size_t n) {
    for (size_t i = n; i < n + GUARD; i++)
        if (p[i] != GUARD_VALUE)
            return 0;
    return 1;
}

static inline double nmse(const float *a, const float *ref, size_t n) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i]) || !isfinite(ref[i]))
            return INFINITY;
        num += ((double)a[i] - ref[i]) * ((double)a[i] - ref[i]);
        den += (double)ref[i] * ref[i];
    }
    return den > 0.0 ? num / den : num;
}

#endif
