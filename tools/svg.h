/* Small SVG figures for the CLI. */
#ifndef SVG_H
#define SVG_H

#include <stdint.h>
#include <stdio.h>

/* What the policy map shows. */
typedef struct svg_profile_data {
    const char *subtitle;   /* under the title: model, prompt length, T, memory kept (NULL: none) */
    int32_t n_layers, n_heads;
    const int32_t *policy;  /* [L][H] index into names */
    const double *kept;     /* [L][H] rows kept / length */
    const float *recovery;  /* [L][H][n_names] each entry's profiled recovery, or NULL */
    const char *const *names;
    int32_t n_names;
} svg_profile_data;

/* Heat map: rows = layers, columns = KV heads, colour = policy (svg_color),
 * the filled height of each cell = the share of its rows the head keeps
 * (and its percentage), a tooltip with its policy, rows and every entry's
 * recovery; beside it, per layer, the policy counts as a stacked bar; the
 * legend at the top. Returns 0, or -1 when the file fails. */
int svg_profile(FILE *f, const svg_profile_data *d);

typedef struct svg_series {
    const char *name;  /* a method or policy name: its colour is svg_color's */
    int32_t n;
    const double *x, *y;
    const double *y_lo, *y_hi; /* [n] an interval around y, drawn as a band, or NULL */
} svg_series;

typedef struct svg_chart {
    const char *title, *x_label, *y_label;
    const svg_series *series;
    int32_t n_series;
    int x_unit, y_unit; /* the axis holds a share: its range stays inside [0, 1] */
    const char *subtitle; /* under the title: the model and the prompts (NULL: none) */
} svg_chart;

/* The colour of a method or policy family, the same in every figure: a
 * table by name (options after ':' and a dtype after ' ' ignored), so a
 * method and the components it keeps look alike (h2o and frequent+local);
 * names not in it take a colour from their hash. */
const char *svg_color(const char *name);

/* The x label of every chart of memory: rows of one token each, so the
 * share of rows is the share of K/V bytes. */
#define SVG_MEMORY_LABEL "KV rows kept / full"

/* Line charts stacked top to bottom, each with one line per series (its
 * interval as a band), axes from its data at round ticks (1, 2 or 5 times a
 * power of ten) with the points inside the frame. Returns 0. */
int svg_charts(FILE *f, const svg_chart *charts, int32_t n_charts);

#endif
