/*
 * A compression written as one string, as the CLI's --methods and
 * llama.cpp's --kv-compress take it: fg_compression_params_parse in
 * fastgen.h.
 *
 *   NAME[:KNOB][:KEY=VALUE]...
 *
 * NAME is a preset. KNOB, in (0, 1], is the budget of the presets that take
 * one (fastgen-budget, fastgen-adaptive) and the kept ratio of a one-entry
 * preset (split evenly between a window and a frequent or snapshot part when
 * it has both, so that snapkv:0.5 keeps half the prompt as h2o:0.5 does, as
 * Python's compression(kept=) splits it). The options name
 * the fields a user tunes; each is checked whole and in its range, and the
 * result is validated as fg_seq_create validates it.
 */
#define FG_EXPERIMENTAL /* FG_ADAPTIVE_* (fastgen.h): the flags= option */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"

#define SPEC_MAX 256 /* longer specs are refused, never cut */

/* A value as written, with no space around it (strtol and strtof skip leading spaces). */
static int bare(const char *s) { return *s && !isspace((unsigned char)*s); }

static int parse_int(const char *s, long lo, long hi, int32_t *out) {
    char *end;
    errno = 0;
    const long v = strtol(s, &end, 10);
    if (!bare(s) || *end || errno || v < lo || v > hi)
        return 0;
    *out = (int32_t)v;
    return 1;
}

static int parse_unit(const char *s, float *out) { /* in [0, 1], finite */
    char *end;
    errno = 0;
    const float v = strtof(s, &end);
    if (!bare(s) || *end || errno || !(v >= 0.0f && v <= 1.0f))
        return 0;
    *out = v;
    return 1;
}

static int takes_budget(const char *name) {
    return !strcmp(name, "fastgen-budget") || !strcmp(name, "fastgen-adaptive");
}

/* The knob r of preset `name` into p (see above); 0 when the preset has none. */
static int set_knob(const char *name, float r, fg_compression_params *p) {
    if (takes_budget(name)) {
        p->budget = r;
        return 1;
    }
    if (p->n_policies != 1)
        return 0; /* "fastgen": its shortlist's ratios are its own */
    fg_policy *e = &p->shortlist[0];
    const uint32_t c = e->components;
    if (c & FG_KEEP_FULL)
        return 0;
    const int local = (c & FG_KEEP_LOCAL) != 0, other = (c & (FG_KEEP_FREQUENT | FG_KEEP_SNAPSHOT)) != 0;
    const int split = local && other;
    e->ratio_local = local ? (split ? r / 2 : r) : 0.0f;
    e->ratio_frequent = other ? (split ? r / 2 : r) : 0.0f;
    return 1;
}

static int set_flags(const char *val, fg_compression_params *p) {
    static const struct {
        const char *name;
        uint32_t flag;
    } k_flags[] = {{"per-layer", FG_ADAPTIVE_PER_LAYER}, {"mass", FG_ADAPTIVE_MASS},
                   {"end", FG_ADAPTIVE_ANCHOR_END},      {"tail", FG_ADAPTIVE_TAIL_RANKS},
                   {"rowmax", FG_ADAPTIVE_ROW_MAX},      {"rownorm", FG_ADAPTIVE_ROW_NORM}};
    p->adaptive_flags = 0;
    for (const char *f = val; *f;) {
        const char *plus = strchr(f, '+');
        const size_t len = plus ? (size_t)(plus - f) : strlen(f);
        size_t i = 0;
        while (i < sizeof k_flags / sizeof k_flags[0] &&
               (strlen(k_flags[i].name) != len || strncmp(k_flags[i].name, f, len)))
            i++;
        if (i == sizeof k_flags / sizeof k_flags[0])
            return 0;
        p->adaptive_flags |= k_flags[i].flag;
        f = plus ? plus + 1 : f + len;
    }
    return 1;
}

/* One KEY=VALUE option into p; 0 when the key is unknown or the value bad. */
static int set_option(char *kv, fg_compression_params *p, int *pool) {
    char *eq = strchr(kv, '=');
    if (!eq)
        return 0;
    *eq = '\0';
    const char *key = kv, *val = eq + 1;
    if (!strcmp(key, "window"))
        return parse_int(val, 0, INT32_MAX, &p->observation_window);
    if (!strcmp(key, "defer"))
        return parse_int(val, 0, INT32_MAX, &p->defer_until);
    if (!strcmp(key, "floor"))
        return parse_unit(val, &p->alloc_floor);
    if (!strcmp(key, "pool")) {
        *pool = 1;
        return parse_int(val, 0, INT32_MAX, &p->score_pool);
    }
    if (!strcmp(key, "sink"))
        return parse_int(val, 0, INT32_MAX, &p->n_sink);
    if (!strcmp(key, "horizon"))
        return parse_int(val, 1, 1 << 24, &p->predict_horizon);
    if (!strcmp(key, "tol"))
        return parse_unit(val, &p->tolerance) && p->tolerance < 1.0f;
    if (!strcmp(key, "flags"))
        return set_flags(val, p);
    if (!strcmp(key, "families")) { /* the shortlist entries kept, as their digits ("02") */
        const fg_compression_params all = *p;
        p->n_policies = 0;
        for (const char *c = val; *c; c++) {
            if (*c < '0' || *c - '0' >= all.n_policies || p->n_policies == FG_MAX_SHORTLIST)
                return 0;
            p->shortlist[p->n_policies++] = all.shortlist[*c - '0'];
        }
        return p->n_policies > 0;
    }
    if (!strcmp(key, "observe")) {
        if (!strcmp(val, "tail"))
            p->observe = FG_OBSERVE_TAIL;
        else if (!strcmp(val, "reconstruct"))
            p->observe = FG_OBSERVE_EXPLICIT;
        else if (!strcmp(val, "predicted"))
            p->observe = FG_OBSERVE_PREDICTED;
        else if (!strcmp(val, "scores"))
            p->observe = FG_OBSERVE_SCORES;
        else
            return 0;
        return 1;
    }
    if (!strcmp(key, "alloc")) { /* a one-entry preset's heads: each alone, or the layer's as one */
        if (p->allocation != FG_ALLOC_SHORTLIST && p->allocation != FG_ALLOC_LAYER)
            return 0;
        if (!strcmp(val, "shortlist"))
            p->allocation = FG_ALLOC_SHORTLIST;
        else if (!strcmp(val, "layer"))
            p->allocation = FG_ALLOC_LAYER;
        else
            return 0;
        return 1;
    }
    return 0;
}

fg_status fg_compression_params_parse_sized(const char *spec, fg_compression_params *params, size_t size) {
    if (!spec || !params)
        return fg_error(NULL, FG_ERR_INVALID_ARGUMENT, "fg_compression_params_parse: spec and params must not be NULL");
    char buf[SPEC_MAX];
    if (strlen(spec) >= sizeof buf)
        return fg_error(NULL, FG_ERR_INVALID_ARGUMENT, "compression \"%.40s...\" is longer than %d characters",
                        spec, SPEC_MAX - 1);
    snprintf(buf, sizeof buf, "%s", spec);
    char *rest = strchr(buf, ':');
    if (rest)
        *rest++ = '\0';
    const char *name = buf;
    fg_compression_params p;
    fg_status st = fg_compression_params_preset(name, &p);
    if (st != FG_OK)
        return st; /* its message names the presets */
    int pool = 0;
    for (char *part = rest, *next; part; part = next) {
        next = strchr(part, ':');
        if (next)
            *next++ = '\0';
        if (part == rest && !strchr(part, '=')) { /* the knob */
            float r;
            if (!parse_unit(part, &r) || r == 0.0f)
                return fg_error(NULL, FG_ERR_INVALID_ARGUMENT,
                                "compression \"%s\": \"%s\" is not a ratio in (0, 1]", spec, part);
            if (!set_knob(name, r, &p))
                return fg_error(NULL, FG_ERR_INVALID_ARGUMENT,
                                "compression \"%s\": %s takes no ratio (its policies fix their own)", spec, name);
            continue;
        }
        char opt[SPEC_MAX];
        snprintf(opt, sizeof opt, "%s", part);
        if (!set_option(part, &p, &pool))
            return fg_error(NULL, FG_ERR_INVALID_ARGUMENT,
                            "compression \"%s\": bad option \"%s\" (known: window, defer, floor, pool, sink, "
                            "horizon, tol, flags, families, observe, alloc; each KEY=VALUE in its range)",
                            spec, opt);
    }
    if (pool) { /* pool ranks only a snapshot part's keys: refused where there is none */
        int snapshot = 0;
        for (int32_t e = 0; e < p.n_policies; e++)
            snapshot |= (p.shortlist[e].components & FG_KEEP_SNAPSHOT) != 0;
        if (!snapshot)
            return fg_error(NULL, FG_ERR_INVALID_ARGUMENT,
                            "compression \"%s\": pool= ranks a snapshot part's keys, and %s has none", spec, name);
    }
    st = fg_compression_params_validate(&p);
    if (st != FG_OK)
        return st;
    return fg_struct_write(params, size, &p, sizeof p, FG_COMPRESSION_PARAMS_OLDEST, "fg_compression_params");
}
