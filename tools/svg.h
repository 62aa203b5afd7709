/* Small SVG figures for the CLI. */
#ifndef FG_SVG_H
#define FG_SVG_H

#include <stdint.h>
#include <stdio.h>

/* Heat map: rows = layers, columns = KV heads, colour = policy index, and
 * in each cell the share of its rows the head keeps; beside it, per layer,
 * the policy counts as a stacked bar; a legend. Returns 0. */
int fg_svg_profile(FILE *f, int32_t n_layers, int32_t n_heads, const int32_t *policy /* [L][H] */,
                   const double *kept /* [L][H] rows kept / length */, const char *const *names, int32_t n_names);

typedef struct fg_svg_series {
    const char *name;
    int32_t n;
    const double *x, *y;
} fg_svg_series;

typedef struct fg_svg_chart {
    const char *title, *x_label, *y_label;
    const fg_svg_series *series;
    int32_t n_series;
} fg_svg_chart;

/* Line charts stacked top to bottom, each with one line per series and axes
 * from its data. Returns 0. */
int fg_svg_charts(FILE *f, const fg_svg_chart *charts, int32_t n_charts);
/* One line chart. Returns 0. */
int fg_svg_lines(FILE *f, const char *title, const char *x_label, const char *y_label, const fg_svg_series *series,
                 int32_t n_series);

#endif
