/* The SVG figures of tools/svg.h. */
#include "tools/svg.h"

#include <math.h>

static const char *const k_colors[] = {"#4e79a7", "#59a14f", "#f28e2b", "#e15759",
                                       "#76b7b2", "#edc948", "#b07aa1", "#9c755f"};

static const char *color(int32_t i) { return k_colors[i % 8]; }

static void text_escaped(FILE *f, const char *s) {
    for (; *s; s++) {
        if (*s == '<')
            fputs("&lt;", f);
        else if (*s == '>')
            fputs("&gt;", f);
        else if (*s == '&')
            fputs("&amp;", f);
        else
            fputc(*s, f);
    }
}

int fg_svg_profile(FILE *f, int32_t L, int32_t H, const int32_t *policy, const double *kept, const char *const *names,
                   int32_t n_names) {
    const int cell = 28, left = 70, top = 72, bar_w = 200, gap = 40;
    const int map_w = H * cell, map_h = L * cell;
    const int legend_y = top + map_h + 40;
    const int width = left + map_w + gap + bar_w + 40, height = legend_y + 24 * n_names + 20;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" "
               "font-size=\"12\">\n",
            width, height);
    fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    fprintf(f, "<text x=\"%d\" y=\"22\" font-size=\"15\">FastGen policy per KV head</text>\n", left);
    fprintf(f, "<text x=\"%d\" y=\"40\" fill=\"#555\">in each cell: the %% of its rows the head keeps</text>\n",
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
            int32_t p = policy[l * H + g];
            if (p >= 0 && p < 64)
                counts[p]++;
            fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"%s\" stroke=\"white\">"
                       "<title>layer %d head %d: ",
                    left + g * cell, y, cell, cell, color(p), (int)l, (int)g);
            text_escaped(f, p >= 0 && p < n_names ? names[p] : "?");
            fprintf(f, ", %.0f%% of its rows kept</title></rect>\n", 100.0 * kept[l * H + g]);
            fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" font-size=\"9\" fill=\"white\" "
                       "pointer-events=\"none\">%.0f</text>\n",
                    left + g * cell + cell / 2, y + cell / 2 + 3, 100.0 * kept[l * H + g]);
        }
        double x = left + map_w + gap;
        for (int32_t e = 0; e < n_names && e < 64; e++) {
            if (!counts[e])
                continue;
            double w = (double)bar_w * counts[e] / H;
            fprintf(f, "<rect x=\"%.1f\" y=\"%d\" width=\"%.1f\" height=\"%d\" fill=\"%s\" stroke=\"white\">"
                       "<title>layer %d: %d x ",
                    x, y + 3, w, cell - 6, color(e), (int)l, (int)counts[e]);
            text_escaped(f, names[e]);
            fprintf(f, "</title></rect>\n");
            if (w >= 14)
                fprintf(f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\" fill=\"white\">%d</text>\n", x + w / 2,
                        y + cell / 2 + 4, (int)counts[e]);
            x += w;
        }
    }
    for (int32_t e = 0; e < n_names; e++) {
        const int y = legend_y + 24 * e;
        fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"16\" height=\"16\" fill=\"%s\"/>\n", left, y, color(e));
        fprintf(f, "<text x=\"%d\" y=\"%d\">", left + 24, y + 13);
        text_escaped(f, names[e]);
        fprintf(f, "</text>\n");
    }
    fprintf(f, "</svg>\n");
    return ferror(f) ? -1 : 0;
}

#define CHART_W 520
#define CHART_H 340
#define CHART_STEP (40 + CHART_H + 60) /* one chart with its title and axis labels */

/* One line chart inside a group shifted down by dy. */
static void chart(FILE *f, int dy, const char *title, const char *x_label, const char *y_label,
                  const fg_svg_series *series, int32_t n_series) {
    const int left = 70, top = 40, w = CHART_W, h = CHART_H, legend_x = left + w + 30;
    double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
    for (int32_t s = 0; s < n_series; s++)
        for (int32_t i = 0; i < series[s].n; i++) {
            if (!isfinite(series[s].x[i]) || !isfinite(series[s].y[i]))
                continue;
            x0 = fmin(x0, series[s].x[i]);
            x1 = fmax(x1, series[s].x[i]);
            y0 = fmin(y0, series[s].y[i]);
            y1 = fmax(y1, series[s].y[i]);
        }
    if (!(x1 >= x0)) {
        x0 = 0.0;
        x1 = 1.0;
        y0 = 0.0;
        y1 = 1.0;
    }
    if (x1 - x0 < 1e-9) {
        x0 -= 0.05;
        x1 += 0.05;
    }
    if (y1 - y0 < 1e-9) {
        y0 -= 0.05;
        y1 += 0.05;
    }
    const double px = (x1 - x0) * 0.05, py = (y1 - y0) * 0.08;
    x0 -= px;
    x1 += px;
    y0 = y0 >= 0.0 && y0 - py < 0.0 ? 0.0 : y0 - py; /* no negative axis under data that cannot be negative */
    y1 += py;
#define SX(v) (left + ((v) - x0) / (x1 - x0) * w)
#define SY(v) (top + h - ((v) - y0) / (y1 - y0) * h)
    fprintf(f, "<g transform=\"translate(0,%d)\">\n<text x=\"%d\" y=\"24\" font-size=\"15\">", dy, left);
    text_escaped(f, title);
    fprintf(f, "</text>\n<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#888\"/>\n", left,
            top, w, h);
    for (int i = 0; i <= 4; i++) {
        double xv = x0 + (x1 - x0) * i / 4, yv = y0 + (y1 - y0) * i / 4;
        fprintf(f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%.3g</text>\n", SX(xv), top + h + 16, xv);
        fprintf(f, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%.3g</text>\n", left - 6, SY(yv) + 4, yv);
        fprintf(f, "<line x1=\"%d\" x2=\"%d\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#eee\"/>\n", left + 1, left + w - 1,
                SY(yv), SY(yv));
    }
    fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">", left + w / 2, top + h + 36);
    text_escaped(f, x_label);
    fprintf(f, "</text>\n<text transform=\"translate(18,%d) rotate(-90)\" text-anchor=\"middle\">", top + h / 2);
    text_escaped(f, y_label);
    fprintf(f, "</text>\n");
    for (int32_t s = 0; s < n_series; s++) {
        const fg_svg_series *se = &series[s];
        fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"", color(s));
        for (int32_t i = 0; i < se->n; i++)
            if (isfinite(se->x[i]) && isfinite(se->y[i]))
                fprintf(f, "%.1f,%.1f ", SX(se->x[i]), SY(se->y[i]));
        fprintf(f, "\"/>\n");
        for (int32_t i = 0; i < se->n; i++)
            if (isfinite(se->x[i]) && isfinite(se->y[i]))
                fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"%s\"/>\n", SX(se->x[i]), SY(se->y[i]),
                        color(s));
        fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"16\" height=\"4\" fill=\"%s\"/>\n<text x=\"%d\" y=\"%d\">",
                legend_x, top + 10 + 22 * s, color(s), legend_x + 24, top + 15 + 22 * s);
        text_escaped(f, se->name);
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
        chart(f, CHART_STEP * i, charts[i].title, charts[i].x_label, charts[i].y_label, charts[i].series,
              charts[i].n_series);
    fprintf(f, "</svg>\n");
    return ferror(f) ? -1 : 0;
}

int fg_svg_lines(FILE *f, const char *title, const char *x_label, const char *y_label, const fg_svg_series *series,
                 int32_t n_series) {
    const fg_svg_chart one = {title, x_label, y_label, series, n_series};
    return fg_svg_charts(f, &one, 1);
}
