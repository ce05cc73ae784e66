/*
 * fuzz_prom.c - libFuzzer target for the console's reading of a service's
 * /metrics (console/console_prom.c): text from whatever answers at the
 * URL the console was given.  Whatever the bytes: no crash, no read past
 * the input (it need not end in NUL), at most CONSOLE_PROM_BOUNDS bounds,
 * ascending, counts finite and >= 0, and a quantile inside the bounds.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_check.h"
#include "console_prom.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > 65536) return 0;
  char *copy = malloc(size ? size : 1); /* exactly size bytes: ASan sees a read past them */
  if (!copy) return 0;
  memcpy(copy, data, size);
  console_prom_t p;
  console_prom_parse(copy, size, "m", "POST", "/orders", &p);
  free(copy);
  CHECK(p.nb >= 0 && p.nb <= CONSOLE_PROM_BOUNDS);
  for (int k = 0; k < p.nb; k++) {
    CHECK(p.le[k] >= 0 && !isnan(p.le[k]));
    CHECK(k == 0 || p.le[k - 1] < p.le[k]);
    CHECK(p.cum[k] >= 0 && !isnan(p.cum[k]));
  }
  CHECK(p.total >= 0 && p.accepted >= 0 && p.accepted <= p.total);
  double q = console_histogram_quantile(p.le, p.cum, p.nb, 0.99);
  CHECK(q == -1 || (q >= 0 && (p.nb == 0 || q <= p.le[p.nb - 1])));
  return 0;
}
