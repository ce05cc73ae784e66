/*
 * console_prom.c - a route's histogram out of Prometheus text
 * (console_prom.h).
 */
#include "console_prom.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LINE_MAX_BYTES 1024 /* a longer line is not one of ours: skipped */

double console_histogram_quantile(const double *le, const double *cum, int n, double q) {
  if (n <= 0 || !(cum[n - 1] > 0) || !isfinite(cum[n - 1])) return -1; /* sums of hostile counts may overflow */
  double rank = q * cum[n - 1];
  for (int k = 0; k < n; k++) {
    if (cum[k] < rank) continue;
    if (isinf(le[k])) return k > 0 ? le[k - 1] : 0; /* beyond the last bound: the bound is all we know */
    double lo = k > 0 ? le[k - 1] : 0, below = k > 0 ? cum[k - 1] : 0;
    double in = cum[k] - below;
    return in > 0 ? lo + (le[k] - lo) * ((rank - below) / in) : le[k]; /* the ratio first: no overflow */
  }
  return le[n - 1];
}

/* The value of label 'name' in 'labels' (name="value", comma-separated)
 * into out; false if absent or too long.  Matches whole names only. */
static bool label(const char *labels, const char *name, char *out, size_t cap) {
  size_t nl = strlen(name);
  const char *p = labels;
  while (*p) {
    const char *eq = strchr(p, '=');
    if (!eq || eq[1] != '"') return false;
    const char *v = eq + 2, *e = strchr(v, '"');
    if (!e) return false;
    if ((size_t)(eq - p) == nl && memcmp(p, name, nl) == 0) {
      if ((size_t)(e - v) >= cap) return false;
      memcpy(out, v, (size_t)(e - v));
      out[e - v] = '\0';
      return true;
    }
    p = e + 1;
    if (*p == ',') p++;
  }
  return false;
}

static void add_bucket(console_prom_t *out, double le, double v) {
  int k = 0;
  while (k < out->nb && out->le[k] != le) k++;
  if (k == out->nb) {
    if (out->nb == CONSOLE_PROM_BOUNDS) return;
    while (k > 0 && out->le[k - 1] > le) { /* keep the bounds ascending */
      out->le[k] = out->le[k - 1];
      out->cum[k] = out->cum[k - 1];
      k--;
    }
    out->le[k] = le;
    out->cum[k] = 0;
    out->nb++;
  }
  out->cum[k] += v;
}

static void parse_line(char *line, const char *name, const char *method, const char *route, console_prom_t *out) {
  size_t nl = strlen(name);
  if (strncmp(line, name, nl) != 0) return;
  const char *kind = line + nl;
  bool bucket = strncmp(kind, "_bucket{", 8) == 0, count = strncmp(kind, "_count{", 7) == 0;
  if (!bucket && !count) return;
  char *open = strchr(line, '{'), *close = strrchr(open, '}'); /* the last: a value may hold braces */
  if (!close || close < open) return;
  *close = '\0';
  const char *labels = open + 1;
  char got[128];
  if (!label(labels, "method", got, sizeof(got)) || strcmp(got, method) != 0) return;
  if (!label(labels, "route", got, sizeof(got)) || strcmp(got, route) != 0) return;
  char *end;
  double v = strtod(close + 1, &end);
  if (end == close + 1 || !isfinite(v) || v < 0) return;
  if (bucket) {
    char les[32];
    if (!label(labels, "le", les, sizeof(les))) return;
    double le = strcmp(les, "+Inf") == 0 ? INFINITY : strtod(les, &end);
    if (le != INFINITY && (*end != '\0' || !isfinite(le) || le < 0)) return;
    add_bucket(out, le, v);
  } else {
    char st[8];
    out->total += v;
    if (label(labels, "status", st, sizeof(st)) && st[0] == '2') out->accepted += v;
  }
}

void console_prom_parse(const char *text, size_t len, const char *name, const char *method, const char *route,
                        console_prom_t *out) {
  memset(out, 0, sizeof(*out));
  char line[LINE_MAX_BYTES];
  size_t i = 0;
  while (i < len) {
    const char *nl = memchr(text + i, '\n', len - i);
    size_t n = nl ? (size_t)(nl - (text + i)) : len - i;
    if (n < sizeof(line) && !memchr(text + i, '\0', n)) {
      memcpy(line, text + i, n);
      line[n] = '\0';
      parse_line(line, name, method, route, out);
    }
    i += n + 1;
  }
}
