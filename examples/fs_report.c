/*
 * fs_report.c - the flash-sale report as HTML with SVG charts (fs_report.h).
 */
#include "fs_report.h"

#include <math.h>
#include <stdbool.h>
#include <string.h>

#define W 560
#define H 200
#define PAD_L 52
#define PAD_R 10
#define PAD_T 10
#define PAD_B 26
#define MAX_SERIES 18

static const char *const COLORS[] = {"#2b6cb0", "#d53f8c", "#1f8a4c", "#b7791f", "#6b46c1", "#c53030",
                                     "#2c7a7b", "#4a5568", "#dd6b20", "#38a169", "#805ad5", "#e53e3e",
                                     "#3182ce", "#d69e2e", "#319795", "#718096", "#97266d", "#276749"};

static void esc(FILE *f, const char *s) {
  for (; s && *s; s++) {
    switch (*s) {
    case '<': fputs("&lt;", f); break;
    case '>': fputs("&gt;", f); break;
    case '&': fputs("&amp;", f); break;
    case '"': fputs("&quot;", f); break;
    case '\'': fputs("&#39;", f); break;
    default: fputc(*s, f);
    }
  }
}

static double val(const json_t *a, size_t k) {
  const json_t *v = json_array_get(a, k);
  return json_is_number(v) ? json_number_value(v) : NAN;
}

typedef struct {
  const char *name;
  const json_t *values;
} series_t;

/* A line chart of 'ns' series over the slots 't_ms' (ms from the start). */
static void chart(FILE *f, const char *title, const char *unit, const json_t *t_ms, const series_t *s, int ns) {
  size_t n = json_array_size(t_ms);
  double max = 0;
  for (int i = 0; i < ns; i++)
    for (size_t k = 0; k < n; k++) {
      double v = val(s[i].values, k);
      if (isfinite(v) && v > max) max = v;
    }
  if (max <= 0) max = 1;
  double t0 = val(t_ms, 0), t1 = n ? val(t_ms, n - 1) : 1, span = t1 - t0 > 0 ? t1 - t0 : 1;
  if (!isfinite(t0)) t0 = 0;
  int points = 0;
  for (int i = 0; i < ns; i++)
    for (size_t k = 0; k < n; k++)
      if (isfinite(val(s[i].values, k))) points++;
  fputs("<figure class=\"chart\" data-chart=\"", f);
  esc(f, title);
  fprintf(f, "\" data-points=\"%d\"><figcaption>", points);
  esc(f, title);
  fprintf(f, "</figcaption>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
             "role=\"img\" aria-label=\"",
          W, H, W, H);
  esc(f, title);
  fputs("\">\n", f);
  int x0 = PAD_L, x1 = W - PAD_R, y0 = PAD_T, y1 = H - PAD_B;
  for (int g = 0; g <= 4; g++) { /* grid and the value axis */
    double y = y1 - (y1 - y0) * g / 4.0;
    fprintf(f, "<line class=\"grid\" x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\"/>", x0, y, x1, y);
    fprintf(f, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%.4g</text>\n", x0 - 4, y + 4, max * g / 4.0);
  }
  for (int g = 0; g <= 4; g++) { /* time axis, seconds from the first purchase */
    double x = x0 + (x1 - x0) * g / 4.0;
    fprintf(f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%.1f s</text>", x, H - 8,
            (t0 + span * g / 4.0) / 1000.0);
  }
  fputs("\n", f);
  for (int i = 0; i < ns; i++) {
    const char *color = COLORS[i % MAX_SERIES];
    bool open = false;
    int run = 0;
    double lx = 0, ly = 0;
    for (size_t k = 0; k <= n; k++) {
      double v = k < n ? val(s[i].values, k) : NAN;
      if (!isfinite(v)) {
        if (open) fputs("\"/>\n", f);
        if (run == 1) fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"2.5\" fill=\"%s\"/>\n", lx, ly, color);
        open = false;
        run = 0;
        continue;
      }
      lx = x0 + (x1 - x0) * (val(t_ms, k) - t0) / span;
      ly = y1 - (y1 - y0) * v / max;
      if (!open) {
        fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.6\" points=\"", color);
        open = true;
      }
      fprintf(f, "%.1f,%.1f ", lx, ly);
      run++;
    }
  }
  fputs("</svg>\n<div class=\"legend\">", f);
  for (int i = 0; i < ns; i++) {
    fprintf(f, "<span><i style=\"background:%s\"></i>", COLORS[i % MAX_SERIES]);
    esc(f, s[i].name);
    if (unit) {
      fputs(" (", f);
      esc(f, unit);
      fputs(")", f);
    }
    fputs("</span>", f);
  }
  fputs("</div></figure>\n", f);
}

static void card(FILE *f, const char *key, const char *label, const json_t *v, const char *unit) {
  fprintf(f, "<div class=\"card\"><b data-k=\"%s\">", key);
  if (json_is_integer(v))
    fprintf(f, "%lld", (long long)json_integer_value(v));
  else if (json_is_number(v))
    fprintf(f, "%.4g", json_number_value(v));
  else
    fputs("-", f);
  if (unit && json_is_number(v)) fprintf(f, " <small>%s</small>", unit);
  fputs("</b><span>", f);
  esc(f, label);
  fputs("</span></div>\n", f);
}

static const char CSS[] =
    "body{font:14px/1.4 'DejaVu Sans',sans-serif;margin:24px;color:#1a202c;background:#f7fafc}"
    "h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:24px 0 8px}.sub{color:#4a5568;margin:0 0 16px}"
    ".cards{display:flex;flex-wrap:wrap;gap:10px}.card{background:#fff;border:1px solid #e2e8f0;border-radius:6px;"
    "padding:10px 14px;min-width:110px}.card b{display:block;font-size:22px}.card span{color:#4a5568;font-size:12px}"
    ".charts{display:flex;flex-wrap:wrap;gap:14px}.chart{background:#fff;border:1px solid #e2e8f0;border-radius:6px;"
    "margin:0;padding:8px}figcaption{font-weight:bold;margin-bottom:4px}svg text{font-size:10px;fill:#4a5568}"
    ".grid{stroke:#edf2f7}.legend span{margin-right:12px;font-size:12px}.legend i{display:inline-block;width:10px;"
    "height:10px;margin-right:4px}table{border-collapse:collapse;background:#fff}td,th{border:1px solid #e2e8f0;"
    "padding:4px 8px;text-align:left;vertical-align:top}.ok{color:#1f8a4c}.bad{color:#c53030;font-weight:bold}";

int fs_report_html(const json_t *r, FILE *f) {
  const json_t *tl = json_object_get(r, "timeline"), *t_ms = json_object_get(tl, "t_ms");
  bool ok = json_is_true(json_object_get(r, "invariants_ok"));
  fputs("<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">\n",
        f);
  fprintf(f, "<title>flash sale %lld</title><style>%s</style></head>\n<body data-ready=\"1\">\n",
          (long long)json_integer_value(json_object_get(r, "activity")), CSS);
  fprintf(f, "<h1>Flash sale: activity %lld</h1>\n", (long long)json_integer_value(json_object_get(r, "activity")));
  fprintf(f, "<p class=\"sub\">%lld users within %.1f s, %lld tickets in %lld buckets, limit %lld per user; "
             "invariants: <span data-k=\"invariants_ok\" class=\"%s\">%s</span></p>\n",
          (long long)json_integer_value(json_object_get(r, "users")),
          json_number_value(json_object_get(r, "window_s")),
          (long long)json_integer_value(json_object_get(r, "tickets")),
          (long long)json_integer_value(json_object_get(r, "buckets")),
          (long long)json_integer_value(json_object_get(r, "limit")), ok ? "ok" : "bad",
          ok ? "all hold" : "FAILED");
  fputs("<div class=\"cards\">\n", f);
  card(f, "requests", "purchase requests", json_object_get(r, "requests"), NULL);
  card(f, "accepted", "orders accepted", json_object_get(r, "accepted"), NULL);
  card(f, "sold", "tickets sold (paid)", json_object_get(r, "sold"), NULL);
  card(f, "frozen", "tickets frozen (unpaid)", json_object_get(r, "frozen"), NULL);
  card(f, "tps", "requests per second", json_object_get(r, "tps"), NULL);
  card(f, "p50_ms", "p50 of POST /orders", json_object_get(r, "p50_ms"), "ms");
  card(f, "p99_ms", "p99 of POST /orders", json_object_get(r, "p99_ms"), "ms");
  card(f, "globals_per_accepted_order", "global transactions per order",
       json_object_get(r, "globals_per_accepted_order"), NULL);
  fputs("</div>\n", f);

  if (json_array_size(t_ms) > 0) {
    char over[96];
    snprintf(over, sizeof(over), "Over the sale (slots of %lld ms)",
             (long long)json_integer_value(json_object_get(tl, "slot_ms")));
    fputs("<h2>", f);
    esc(f, over);
    fputs("</h2>\n<div class=\"charts\">\n", f);
    series_t rate[] = {{"purchases due", json_object_get(tl, "purchases_per_s")},
                       {"accepted", json_object_get(tl, "accepted_per_s")}};
    chart(f, "orders per second", "/s", t_ms, rate, 2);
    series_t lat[] = {{"p50", json_object_get(tl, "p50_ms")}, {"p99", json_object_get(tl, "p99_ms")}};
    chart(f, "latency of POST /orders", "ms", t_ms, lat, 2);
    series_t fl[] = {{"requests in flight", json_object_get(tl, "in_flight")}};
    chart(f, "requests in flight", NULL, t_ms, fl, 1);
    if (json_integer_value(json_object_get(tl, "stock_samples")) > 0) {
      series_t st[] = {{"available", json_object_get(tl, "available")},
                       {"frozen", json_object_get(tl, "frozen")},
                       {"sold", json_object_get(tl, "sold")}};
      chart(f, "tickets", NULL, t_ms, st, 3);
      const json_t *bk = json_object_get(tl, "buckets");
      series_t per[MAX_SERIES];
      char names[MAX_SERIES][32];
      int nb = 0;
      for (size_t i = 0; i < json_array_size(bk) && nb < MAX_SERIES; i++, nb++) {
        const json_t *b = json_array_get(bk, i);
        snprintf(names[nb], sizeof(names[nb]), "bucket %lld", (long long)json_integer_value(json_object_get(b, "bucket")));
        per[nb] = (series_t){names[nb], json_object_get(b, "available")};
      }
      if (nb) chart(f, "available per bucket", NULL, t_ms, per, nb);
    }
    fputs("</div>\n", f);
  }

  fputs("<h2>Invariants</h2>\n<table><tr><th>invariant</th><th>holds</th><th>detail</th></tr>\n", f);
  const char *name;
  const json_t *inv;
  json_object_foreach((json_t *)json_object_get(r, "invariants"), name, inv) {
    const json_t *o = json_object_get(inv, "ok");
    fputs("<tr><td>", f);
    esc(f, name);
    fprintf(f, "</td><td class=\"%s\">%s</td><td>", json_is_false(o) ? "bad" : "ok",
            json_is_true(o) ? "yes" : json_is_false(o) ? "NO" : "not checked");
    esc(f, json_string_value(json_object_get(inv, "detail")));
    fputs("</td></tr>\n", f);
  }
  fputs("</table>\n</body></html>\n", f);
  return ferror(f) ? -1 : 0;
}
