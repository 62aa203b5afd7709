/* Small SVG figures for the CLI. */
#ifndef FG_SVG_H
#define FG_SVG_H

#include <stdint.h>
#include <stdio.h>

/* What the policy map shows. */
typedef struct fg_svg_profile_data {
    const char *subtitle;   /* under the title: model, prompt length, T, memory kept (NULL: none) */
    int32_t n_layers, n_heads;
    const int32_t *policy;  /* [L][H] index into names */
    const double *kept;     /* [L][H] rows kept / length */
    const float *recovery;  /* [L][H][n_names] each entry's profiled recovery, or NULL */
    const char *const *names;
    int32_t n_names;
} fg_svg_profile_data;

/* Heat map: rows = layers, columns = KV heads, colour = policy, in each
 * cell the share of its rows the head keeps, and a tooltip with its policy,
 * rows and every entry's recovery; beside it, per layer, the policy counts
 * as a stacked bar; a legend. Returns 0, or -1 when the file fails. */
int fg_svg_profile(FILE *f, const fg_svg_profile_data *d);

typedef struct fg_svg_series {
    const char *name;
    int32_t n;
    const double *x, *y;
} fg_svg_series;

typedef struct fg_svg_chart {
    const char *title, *x_label, *y_label;
    const fg_svg_series *series;
    int32_t n_series;
    int x_unit, y_unit; /* the axis holds a share: its range stays inside [0, 1] */
} fg_svg_chart;

/* The x label of every chart of memory: rows of one token each, so the
 * share of rows is the share of K/V bytes. */
#define FG_SVG_MEMORY_LABEL "KV rows kept / full"

/* Line charts stacked top to bottom, each with one line per series and axes
 * from its data at round ticks (1, 2 or 5 times a power of ten). Returns 0. */
int fg_svg_charts(FILE *f, const fg_svg_chart *charts, int32_t n_charts);

#endif
