/* The SVG figures of tools/svg.h. */
#include "tools/svg.h"

#include "tools/escape.h"

#include <math.h>
#include <string.h>

/* One colour per method and per policy family: the headline red, the full
 * cache grey, each peer method the colour of the components it keeps, the
 * paper's shortlist light to dark as it keeps more. */
static const struct {
    const char *name, *color;
} k_palette[] = {
    {"fastgen-adaptive", "#d62728"},
    {"full", "#7f7f7f"},
    {"h2o", "#1f77b4"},
    {"frequent+local", "#1f77b4"},
    {"streamingllm", "#2ca02c"},
    {"special+local", "#2ca02c"},
    {"snapkv", "#ff7f0e"},
    {"snapshot+local", "#ff7f0e"},
    {"adakv", "#8c564b"},
    {"tova", "#9467bd"},
    {"fastgen-budget", "#bcbd22"},
    {"fastgen", "#e377c2"},
    {"local", "#17becf"},
    {"frequent", "#6baed6"},
    {"special", "#fdd0a2"},
    {"special+punct", "#fdae6b"},
    {"special+punct+frequent", "#e6550d"},
    {"special+punct+frequent+local", "#a63603"},
};

static const char *const k_spare[] = {"#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd"};

const char *svg_color(const char *name) {
    size_t len = strcspn(name, ": ("); /* "fastgen-adaptive:window=8", "h2o q8_0", "fastgen (T = 0.9)" */
    for (size_t i = 0; i < sizeof k_palette / sizeof k_palette[0]; i++)
        if (strlen(k_palette[i].name) == len && !strncmp(k_palette[i].name, name, len))
            return k_palette[i].color;
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < len; i++)
        h = (h ^ (unsigned char)name[i]) * 16777619u;
    return k_spare[h % (sizeof k_spare / sizeof k_spare[0])];
}

/* Legend items in rows from (x, y) within `width`: each a swatch and its
 * name (about 7 px a character). Returns the height the rows take. */
static int legend_rows(FILE *f, int x, int y, int width, const char *const *names, int32_t n, int draw) {
    int cx = x, cy = y;
    for (int32_t e = 0; e < n; e++) {
        const int w = 24 + 7 * (int)strlen(names[e]) + 18;
        if (cx > x && cx + w > x + width) {
            cx = x;
            cy += 22;
        }
        if (draw) {
            fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"16\" height=\"16\" fill=\"%s\"/>\n<text x=\"%d\" y=\"%d\">",
                    cx, cy, svg_color(names[e]), cx + 22, cy + 13);
            cli_xml_text(f, names[e]);
            fprintf(f, "</text>\n");
        }
        cx += w;
    }
    return n ? cy - y + 22 : 0;
}

int svg_profile(FILE *f, const svg_profile_data *d) {
    const int32_t L = d->n_layers, H = d->n_heads;
    const int cell = 28, left = 70, bar_w = 200, gap = 40;
    const int map_w = H * cell, map_h = L * cell;
    int width = left + map_w + gap + bar_w + 40;
    const int text_w = left + 7 * (int)(d->subtitle ? strlen(d->subtitle) : 0) + 20; /* about 7 px a character */
    width = width < text_w ? text_w : width < 640 ? 640 : width;
    /* the legend first, under the titles, so it is in view with the top of the map */
    const int legend_y = 70, legend_h = legend_rows(f, left, legend_y, width - left - 20, d->names, d->n_names, 0);
    const int top = legend_y + legend_h + 40;
    const int height = top + map_h + 20;
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
    fprintf(f, "<text x=\"%d\" y=\"58\" fill=\"#555\">colour: the head's policy; filled height and number: the %% of "
               "its rows it keeps; hover a cell for its recoveries</text>\n",
            left);
    legend_rows(f, left, legend_y, width - left - 20, d->names, d->n_names, 1);
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
            const double kept = d->kept[l * H + g] < 0.0 ? 0.0 : d->kept[l * H + g] > 1.0 ? 1.0 : d->kept[l * H + g];
            const char *name = p >= 0 && p < d->n_names ? d->names[p] : "?";
            if (p >= 0 && p < 64)
                counts[p]++;
            fprintf(f, "<g><title>layer %d, KV head %d: ", (int)l, (int)g);
            cli_xml_text(f, name);
            fprintf(f, ", keeps %.0f%% of its rows", 100.0 * kept);
            for (int32_t e = 0; d->recovery && e < d->n_names; e++) {
                fprintf(f, "%s", e ? "; " : "\nrecovery: ");
                cli_xml_text(f, d->names[e]);
                fprintf(f, " %.3f", (double)d->recovery[((size_t)l * H + g) * d->n_names + e]);
            }
            /* the policy's colour, pale for the cell and full for the part the head keeps */
            const double fill_h = (cell - 2) * kept;
            fprintf(f, "</title><rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"%s\" fill-opacity=\"0.25\" "
                       "stroke=\"white\"/>",
                    left + g * cell, y, cell, cell, svg_color(name));
            fprintf(f, "<rect x=\"%d\" y=\"%.1f\" width=\"%d\" height=\"%.1f\" fill=\"%s\"/>", left + g * cell + 1,
                    y + 1 + (cell - 2) - fill_h, cell - 2, fill_h, svg_color(name));
            fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" font-size=\"11\" fill=\"#111\" stroke=\"white\" "
                       "stroke-width=\"2.5\" paint-order=\"stroke\">%.0f</text></g>\n",
                    left + g * cell + cell / 2, y + cell / 2 + 4, 100.0 * kept);
        }
        double x = left + map_w + gap;
        for (int32_t e = 0; e < d->n_names && e < 64; e++) {
            if (!counts[e])
                continue;
            double w = (double)bar_w * counts[e] / H;
            fprintf(f, "<rect x=\"%.1f\" y=\"%d\" width=\"%.1f\" height=\"%d\" fill=\"%s\" stroke=\"white\">"
                       "<title>layer %d: %d x ",
                    x, y + 3, w, cell - 6, svg_color(d->names[e]), (int)l, (int)counts[e]);
            cli_xml_text(f, d->names[e]);
            fprintf(f, "</title></rect>\n");
            if (w >= 14)
                fprintf(f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\" fill=\"#111\" stroke=\"white\" "
                           "stroke-width=\"2.5\" paint-order=\"stroke\">%d</text>\n",
                        x + w / 2, y + cell / 2 + 4, (int)counts[e]);
            x += w;
        }
    }
    fprintf(f, "</svg>\n");
    return ferror(f) ? -1 : 0;
}

#define CHART_W 520
#define CHART_H 340
#define CHART_STEP (56 + CHART_H + 60) /* one chart with its titles and axis labels */

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
static void chart(FILE *f, int dy, const svg_chart *c) {
    const int left = 70, top = 56, w = CHART_W, h = CHART_H, legend_x = left + w + 30;
    const int inset = 10; /* the points stay inside the frame, never on it */
    double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
    for (int32_t s = 0; s < c->n_series; s++)
        for (int32_t i = 0; i < c->series[s].n; i++) {
            const svg_series *se = &c->series[s];
            if (!isfinite(se->x[i]) || !isfinite(se->y[i]))
                continue;
            x0 = fmin(x0, se->x[i]);
            x1 = fmax(x1, se->x[i]);
            y0 = fmin(y0, se->y_lo && isfinite(se->y_lo[i]) ? fmin(se->y[i], se->y_lo[i]) : se->y[i]);
            y1 = fmax(y1, se->y_hi && isfinite(se->y_hi[i]) ? fmax(se->y[i], se->y_hi[i]) : se->y[i]);
        }
    const axis ax = axis_for(x0, x1, c->x_unit), ay = axis_for(y0, y1, c->y_unit);
#define SX(v) (left + inset + ((v) - ax.lo) / (ax.hi - ax.lo) * (w - 2 * inset))
#define SY(v) (top + h - inset - ((v) - ay.lo) / (ay.hi - ay.lo) * (h - 2 * inset))
    fprintf(f, "<g transform=\"translate(0,%d)\">\n<text x=\"%d\" y=\"22\" font-size=\"15\">", dy, left);
    cli_xml_text(f, c->title);
    fprintf(f, "</text>\n");
    if (c->subtitle) {
        fprintf(f, "<text x=\"%d\" y=\"40\" fill=\"#555\">", left);
        cli_xml_text(f, c->subtitle);
        fprintf(f, "</text>\n");
    }
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#888\"/>\n", left, top, w,
            h);
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
    static const char *const k_dash[] = {"", " stroke-dasharray=\"6,3\"", " stroke-dasharray=\"2,3\"",
                                         " stroke-dasharray=\"8,3,2,3\""};
    for (int32_t s = 0; s < c->n_series; s++) { /* the bands under every line */
        const svg_series *se = &c->series[s];
        if (!se->y_lo || !se->y_hi)
            continue;
        fprintf(f, "<polygon fill=\"%s\" fill-opacity=\"0.15\" stroke=\"none\" points=\"", svg_color(se->name));
        for (int32_t i = 0; i < se->n; i++)
            if (isfinite(se->x[i]) && isfinite(se->y_hi[i]))
                fprintf(f, "%.1f,%.1f ", SX(se->x[i]), SY(se->y_hi[i]));
        for (int32_t i = se->n - 1; i >= 0; i--)
            if (isfinite(se->x[i]) && isfinite(se->y_lo[i]))
                fprintf(f, "%.1f,%.1f ", SX(se->x[i]), SY(se->y_lo[i]));
        fprintf(f, "\"/>\n");
    }
    for (int32_t s = 0; s < c->n_series; s++) {
        const svg_series *se = &c->series[s];
        const char *col = svg_color(se->name);
        int same = 0; /* series of one colour (a method at several dtypes) differ by their dashes */
        for (int32_t r = 0; r < s; r++)
            same += !strcmp(svg_color(c->series[r].name), col);
        const char *dash = k_dash[same % 4];
        fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\"%s points=\"", col, dash);
        for (int32_t i = 0; i < se->n; i++)
            if (isfinite(se->x[i]) && isfinite(se->y[i]))
                fprintf(f, "%.1f,%.1f ", SX(se->x[i]), SY(se->y[i]));
        fprintf(f, "\"/>\n");
        for (int32_t i = 0; i < se->n; i++)
            if (isfinite(se->x[i]) && isfinite(se->y[i])) {
                fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"%s\"><title>", SX(se->x[i]),
                        SY(se->y[i]), col);
                cli_xml_text(f, se->name);
                fprintf(f, ": %.4g at %.4g", se->y[i], se->x[i]);
                if (se->y_lo && se->y_hi)
                    fprintf(f, " (95%% interval %.4g to %.4g)", se->y_lo[i], se->y_hi[i]);
                fprintf(f, "</title></circle>\n");
            }
        fprintf(f, "<line x1=\"%d\" x2=\"%d\" y1=\"%d\" y2=\"%d\" stroke=\"%s\" stroke-width=\"3\"%s/>\n<text x=\"%d\" "
                   "y=\"%d\">",
                legend_x, legend_x + 18, top + 12 + 22 * s, top + 12 + 22 * s, col, dash, legend_x + 24,
                top + 16 + 22 * s);
        cli_xml_text(f, se->name);
        fprintf(f, "</text>\n");
    }
#undef SX
#undef SY
    fprintf(f, "</g>\n");
}

int svg_charts(FILE *f, const svg_chart *charts, int32_t n_charts) {
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" "
               "font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
            70 + CHART_W + 30 + 260, CHART_STEP * n_charts);
    for (int32_t i = 0; i < n_charts; i++)
        chart(f, CHART_STEP * i, &charts[i]);
    fprintf(f, "</svg>\n");
    return ferror(f) ? -1 : 0;
}
