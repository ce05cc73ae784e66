/*
 * console_prom.h - one route's latency histogram and counts out of a
 * service's Prometheus text (/metrics), and quantiles of it.  Pure: no
 * I/O, no allocation, so that the unit test and the fuzzer reach it.
 *
 * NOTES
 *   The text arrives from the network: a line that does not parse is
 *   skipped, values must be finite and >= 0, at most CONSOLE_PROM_BOUNDS
 *   distinct bounds are kept (the others are dropped), and a label value
 *   may hold any byte but '"' (svc_http writes route="/orders/{id}/pay").
 */
#ifndef CONSOLE_PROM_H
#define CONSOLE_PROM_H

#include <stddef.h>

#define CONSOLE_PROM_BOUNDS 32

/* One histogram summed over its status label: bounds ascending. */
typedef struct {
  int nb;
  double le[CONSOLE_PROM_BOUNDS], cum[CONSOLE_PROM_BOUNDS];
  double total, accepted; /* _count summed; of those with a 2xx status */
} console_prom_t;

/* Read the series 'name'_bucket and 'name'_count with the labels
 * method="'method'" and route="'route'" (exact) out of 'text' ('len'
 * bytes, need not end in NUL) into 'out' (reset first). */
void console_prom_parse(const char *text, size_t len, const char *name, const char *method, const char *route,
                        console_prom_t *out);

/* The q-quantile (0..1) of a histogram given as 'n' upper bounds 'le'
 * (ascending, the last may be INFINITY) and cumulative counts 'cum',
 * interpolated inside a bucket as Prometheus' histogram_quantile does;
 * -1 when it counts nothing. */
double console_histogram_quantile(const double *le, const double *cum, int n, double q);

#endif /* CONSOLE_PROM_H */
