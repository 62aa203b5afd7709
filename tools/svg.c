/* The SVG figures of tools/svg.h. */
#include "tools/svg.h"

#include "tools/escape.h"

#include <math.h>
#include <string.h>

static const char *const k_colors[] = {"#4e79a7", "#59a14f", "#f28e2b", "#e15759",
                                       "#76b7b2", "#edc948", "#b07aa1", "#9c755f"};

static const char *color(int32_t i) { return k_colors[i % 8]; }

int fg_svg_profile(FILE *f, const fg_svg_profile_data *d) {
    const int32_t L = d->n_layers, H = d->n_heads;
    const int cell = 28, left = 70, top = 92, bar_w = 200, gap = 40;
    const int map_w = H * cell, map_h = L * cell;
    const int legend_y = top + map_h + 36;
    int width = left + map_w + gap + bar_w + 40;
    const int text_w = left + 7 * (int)(d->subtitle ? strlen(d->subtitle) : 0) + 20; /* about 7 px a character */
    width = width < text_w ? text_w : width < 640 ? 640 : width;
    const int height = legend_y + 24 * d->n_names + 20;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" "
               "font-size=\"12\">\n",
            width, height);
    fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    fprintf(f, "<text x=\"%d\" y=\"22\" font-size=\"15\">FastGen policy per KV head</text>\n", left);
    if (d->subtitle) {
        fprintf(f, "<text x=\"%d\" y=\"40\">", left);
        cli_xml_text(f, d->subtitle);
        fprintf(f, "</text>\n");
    }
    fprintf(f, "<text x=\"%d\" y=\"56\" fill=\"#555\">in each cell: the %% of its rows the head keeps; hover a cell "
               "for its recoveries</text>\n",
            left);
    fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">KV head</text>\n", left + map_w / 2, top - 18);
    fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">policies per layer</text>\n",
            left + map_w + gap + bar_w / 2, top - 18);
    for (int32_t g = 0; g < H; g++)
        fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">%d</text>\n", left + g * cell + cell / 2, top - 4,
                (int)g);
    for (int32_t l = 0; l < L; l++) {
        const int y = top + l * cell;
        fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">layer %d</text>\n", left - 8, y + cell / 2 + 4,
                (int)l);
        int32_t counts[64] = {0};
        for (int32_t g = 0; g < H; g++) {
            const int32_t p = d->policy[l * H + g];
            const double kept = d->kept[l * H + g];
            if (p >= 0 && p < 64)
                counts[p]++;
            fprintf(f, "<g><title>layer %d, KV head %d: ", (int)l, (int)g);
            cli_xml_text(f, p >= 0 && p < d->n_names ? d->names[p] : "?");
            fprintf(f, ", keeps %.0f%% of its rows", 100.0 * kept);
            for (int32_t e = 0; d->recovery && e < d->n_names; e++) {
                fprintf(f, "%s", e ? "; " : "\nrecovery: ");
                cli_xml_text(f, d->names[e]);
                fprintf(f, " %.3f", (double)d->recovery[((size_t)l * H + g) * d->n_names + e]);
            }
            fprintf(f, "</title><rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"%s\" stroke=\"white\"/>",
                    left + g * cell, y, cell, cell, color(p));
            fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" font-size=\"9\" fill=\"white\">%.0f</text></g>\n",
                    left + g * cell + cell / 2, y + cell / 2 + 3, 100.0 * kept);
        }
        double x = left + map_w + gap;
        for (int32_t e = 0; e < d->n_names && e < 64; e++) {
            if (!counts[e])
                continue;
            double w = (double)bar_w * counts[e] / H;
            fprintf(f, "<rect x=\"%.1f\" y=\"%d\" width=\"%.1f\" height=\"%d\" fill=\"%s\" stroke=\"white\">"
                       "<title>layer %d: %d x ",
                    x, y + 3, w, cell - 6, color(e), (int)l, (int)counts[e]);
            cli_xml_text(f, d->names[e]);
            fprintf(f, "</title></rect>\n");
            if (w >= 14)
                fprintf(f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\" fill=\"white\">%d</text>\n", x + w / 2,
                        y + cell / 2 + 4, (int)counts[e]);
            x += w;
        }
    }
    for (int32_t e = 0; e < d->n_names; e++) {
        const int y = legend_y + 24 * e;
        fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"16\" height=\"16\" fill=\"%s\"/>\n", left, y, color(e));
        fprintf(f, "<text x=\"%d\" y=\"%d\">", left + 24, y + 13);
        cli_xml_text(f, d->names[e]);
        fprintf(f, "</text>\n");
    }
    fprintf(f, "</svg>\n");
    return ferror(f) ? -1 : 0;
}

#define CHART_W 520
#define CHART_H 340
#define CHART_STEP (40 + CHART_H + 60) /* one chart with its title and axis labels */

/* Round ticks for [lo, hi]: a step of 1, 2 or 5 times a power of ten giving
 * 3 to 6 intervals; the range grows to whole steps (and stays inside [0, 1]
 * for a share). */
typedef struct axis {
    double lo, hi, step;
    int decimals;
} axis;

static axis axis_for(double lo, double hi, int unit) {
    if (!(hi >= lo)) {
        lo = 0.0;
        hi = 1.0;
    }
    if (hi - lo < 1e-12) { /* one value: a small range around it */
        const double pad = fabs(lo) > 1e-12 ? fabs(lo) * 0.1 : 0.1;
        lo -= pad;
        hi += pad;
    }
    if (unit) {
        lo = lo < 0.0 ? 0.0 : lo;
        hi = hi > 1.0 ? 1.0 : hi;
    }
    const double raw = (hi - lo) / 5.0, mag = pow(10.0, floor(log10(raw)));
    const double m = raw / mag;
    const double step = (m <= 1.0 ? 1.0 : m <= 2.0 ? 2.0 : m <= 5.0 ? 5.0 : 10.0) * mag;
    axis a = {floor(lo / step + 1e-9) * step, ceil(hi / step - 1e-9) * step, step, 0};
    if (unit) {
        a.lo = a.lo < 0.0 ? 0.0 : a.lo;
        a.hi = a.hi > 1.0 ? 1.0 : a.hi;
    }
    if (a.lo < 0.0 && lo >= 0.0) /* no negative axis under data that cannot be negative */
        a.lo = 0.0;
    a.decimals = step >= 1.0 ? 0 : (int)ceil(-log10(step) - 1e-9);
    return a;
}

/* One line chart inside a group shifted down by dy. */
static void chart(FILE *f, int dy, const fg_svg_chart *c) {
    const int left = 70, top = 40, w = CHART_W, h = CHART_H, legend_x = left + w + 30;
    double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
    for (int32_t s = 0; s < c->n_series; s++)
        for (int32_t i = 0; i < c->series[s].n; i++) {
            if (!isfinite(c->series[s].x[i]) || !isfinite(c->series[s].y[i]))
                continue;
            x0 = fmin(x0, c->series[s].x[i]);
            x1 = fmax(x1, c->series[s].x[i]);
            y0 = fmin(y0, c->series[s].y[i]);
            y1 = fmax(y1, c->series[s].y[i]);
        }
    const axis ax = axis_for(x0, x1, c->x_unit), ay = axis_for(y0, y1, c->y_unit);
#define SX(v) (left + ((v) - ax.lo) / (ax.hi - ax.lo) * w)
#define SY(v) (top + h - ((v) - ay.lo) / (ay.hi - ay.lo) * h)
    fprintf(f, "<g transform=\"translate(0,%d)\">\n<text x=\"%d\" y=\"24\" font-size=\"15\">", dy, left);
    cli_xml_text(f, c->title);
    fprintf(f, "</text>\n<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#888\"/>\n", left,
            top, w, h);
    for (double v = ax.lo; v <= ax.hi + ax.step * 1e-6; v += ax.step)
        fprintf(f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%.*f</text>\n", SX(v), top + h + 16, ax.decimals,
                v);
    for (double v = ay.lo; v <= ay.hi + ay.step * 1e-6; v += ay.step) {
        fprintf(f, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%.*f</text>\n", left - 6, SY(v) + 4, ay.decimals, v);
        fprintf(f, "<line x1=\"%d\" x2=\"%d\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#eee\"/>\n", left + 1, left + w - 1,
                SY(v), SY(v));
    }
    fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">", left + w / 2, top + h + 36);
    cli_xml_text(f, c->x_label);
    fprintf(f, "</text>\n<text transform=\"translate(14,%d) rotate(-90)\" text-anchor=\"middle\">", top + h / 2);
    cli_xml_text(f, c->y_label);
    fprintf(f, "</text>\n");
    for (int32_t s = 0; s < c->n_series; s++) {
        const fg_svg_series *se = &c->series[s];
        fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"", color(s));
        for (int32_t i = 0; i < se->n; i++)
            if (isfinite(se->x[i]) && isfinite(se->y[i]))
                fprintf(f, "%.1f,%.1f ", SX(se->x[i]), SY(se->y[i]));
        fprintf(f, "\"/>\n");
        for (int32_t i = 0; i < se->n; i++)
            if (isfinite(se->x[i]) && isfinite(se->y[i])) {
                fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"%s\"><title>", SX(se->x[i]),
                        SY(se->y[i]), color(s));
                cli_xml_text(f, se->name);
                fprintf(f, ": %.4g at %.4g</title></circle>\n", se->y[i], se->x[i]);
            }
        fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"16\" height=\"4\" fill=\"%s\"/>\n<text x=\"%d\" y=\"%d\">",
                legend_x, top + 10 + 22 * s, color(s), legend_x + 24, top + 15 + 22 * s);
        cli_xml_text(f, se->name);
        fprintf(f, "</text>\n");
    }
#undef SX
#undef SY
    fprintf(f, "</g>\n");
}

int fg_svg_charts(FILE *f, const fg_svg_chart *charts, int32_t n_charts) {
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" "
               "font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
            70 + CHART_W + 30 + 260, CHART_STEP * n_charts);
    for (int32_t i = 0; i < n_charts; i++)
        chart(f, CHART_STEP * i, &charts[i]);
    fprintf(f, "</svg>\n");
    return ferror(f) ? -1 : 0;
}
