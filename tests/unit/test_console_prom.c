/*
 * test_console_prom.c - the console's reading of a service's /metrics
 * (console/console_prom.c): the text svc_http writes, routes with braces,
 * a route that only starts like ours, hostile lines, and the quantiles.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "console_prom.h"

#define NAME "txc_http_request_duration_seconds"

/* As svc_http_metrics writes it: two statuses of POST /orders, and the
 * pay route that shares the prefix and holds braces. */
static const char SERVICE_TEXT[] =
    "# HELP txc_http_request_duration_seconds Requests answered.\n"
    "# TYPE txc_http_request_duration_seconds histogram\n"
    NAME "_bucket{method=\"POST\",route=\"/orders\",status=\"201\",le=\"0.005\"} 6\n"
    NAME "_bucket{method=\"POST\",route=\"/orders\",status=\"201\",le=\"0.01\"} 9\n"
    NAME "_bucket{method=\"POST\",route=\"/orders\",status=\"201\",le=\"+Inf\"} 10\n"
    NAME "_sum{method=\"POST\",route=\"/orders\",status=\"201\"} 0.05\n"
    NAME "_count{method=\"POST\",route=\"/orders\",status=\"201\"} 10\n"
    NAME "_bucket{method=\"POST\",route=\"/orders\",status=\"409\",le=\"0.005\"} 4\n"
    NAME "_bucket{method=\"POST\",route=\"/orders\",status=\"409\",le=\"0.01\"} 5\n"
    NAME "_bucket{method=\"POST\",route=\"/orders\",status=\"409\",le=\"+Inf\"} 10\n"
    NAME "_count{method=\"POST\",route=\"/orders\",status=\"409\"} 10\n"
    NAME "_bucket{method=\"POST\",route=\"/orders/{id}/pay\",status=\"200\",le=\"0.005\"} 100\n"
    NAME "_count{method=\"POST\",route=\"/orders/{id}/pay\",status=\"200\"} 100\n"
    NAME "_count{method=\"GET\",route=\"/orders\",status=\"200\"} 7\n";

static void parse(const char *text, console_prom_t *out) {
  console_prom_parse(text, strlen(text), NAME, "POST", "/orders", out);
}

static void test_sums_the_route_over_its_statuses(void **state) {
  (void)state;
  console_prom_t p;
  parse(SERVICE_TEXT, &p);
  assert_int_equal(p.nb, 3);
  assert_true(p.le[0] == 0.005 && p.le[1] == 0.01 && isinf(p.le[2]));
  assert_true(p.cum[0] == 10 && p.cum[1] == 14 && p.cum[2] == 20);
  assert_true(p.total == 20);
  assert_true(p.accepted == 10);
}

static void test_another_route_or_method_is_not_counted(void **state) {
  (void)state;
  console_prom_t p;
  console_prom_parse(SERVICE_TEXT, strlen(SERVICE_TEXT), NAME, "POST", "/orders/{id}/pay", &p);
  assert_true(p.total == 100 && p.accepted == 100 && p.nb == 1);
  console_prom_parse(SERVICE_TEXT, strlen(SERVICE_TEXT), NAME, "GET", "/orders", &p);
  assert_true(p.total == 7 && p.nb == 0);
  console_prom_parse(SERVICE_TEXT, strlen(SERVICE_TEXT), NAME, "POST", "/order", &p);
  assert_true(p.total == 0 && p.nb == 0);
}

static void test_hostile_lines_are_skipped(void **state) {
  (void)state;
  static const char text[] =
      NAME "_count{method=\"POST\",route=\"/orders\",status=\"201\"} -5\n"        /* negative */
      NAME "_count{method=\"POST\",route=\"/orders\",status=\"201\"} nan\n"       /* not finite */
      NAME "_count{method=\"POST\",route=\"/orders\",status=\"201\"} inf\n"       /* not finite */
      NAME "_count{method=\"POST\",route=\"/orders\",status=\"201\"}\n"           /* no value */
      NAME "_count{method=\"POST\",route=\"/orders,status=\"201\"} 3\n"           /* broken quotes */
      NAME "_count{xmethod=\"POST\",route=\"/orders\",status=\"201\"} 3\n"        /* not the label */
      NAME "_count method=\"POST\",route=\"/orders\"} 3\n"                        /* no brace */
      NAME "_bucket{method=\"POST\",route=\"/orders\",status=\"201\"} 3\n"        /* no le */
      NAME "_bucket{method=\"POST\",route=\"/orders\",le=\"-1\"} 3\n"             /* negative bound */
      NAME "_bucket{method=\"POST\",route=\"/orders\",le=\"0.1x\"} 3\n"           /* not a number */
      NAME "_countx{method=\"POST\",route=\"/orders\",status=\"201\"} 3\n"        /* another series */
      NAME "_count{method=\"POST\",route=\"/orders\",status=\"201\"} 2\n";        /* the one good line */
  console_prom_t p;
  parse(text, &p);
  assert_true(p.total == 2);
  assert_int_equal(p.nb, 0);
}

static void test_bounds_are_capped_and_sorted(void **state) {
  (void)state;
  char text[8192];
  size_t n = 0;
  for (int k = 2 * CONSOLE_PROM_BOUNDS; k >= 1; k--)
    n += (size_t)snprintf(text + n, sizeof(text) - n, NAME "_bucket{method=\"POST\",route=\"/orders\",le=\"%d\"} %d\n",
                          k, k);
  console_prom_t p;
  parse(text, &p);
  assert_int_equal(p.nb, CONSOLE_PROM_BOUNDS);
  for (int k = 1; k < p.nb; k++) assert_true(p.le[k - 1] < p.le[k]);
}

static void test_no_nul_needed_and_long_lines_skipped(void **state) {
  (void)state;
  char text[4096];
  memset(text, 'a', 2000);
  text[2000] = '\n';
  const char good[] = NAME "_count{method=\"POST\",route=\"/orders\",status=\"201\"} 4";
  memcpy(text + 2001, good, sizeof(good) - 1); /* no newline, no NUL after it */
  console_prom_t p;
  console_prom_parse(text, 2001 + sizeof(good) - 1, NAME, "POST", "/orders", &p);
  assert_true(p.total == 4);
}

static void test_quantiles(void **state) {
  (void)state;
  console_prom_t p;
  parse(SERVICE_TEXT, &p);
  /* rank 10 of 20 falls at the end of the first bucket */
  assert_true(fabs(console_histogram_quantile(p.le, p.cum, p.nb, 0.5) - 0.005) < 1e-12);
  /* rank 12 of 20: half way through (0.005, 0.01] */
  assert_true(fabs(console_histogram_quantile(p.le, p.cum, p.nb, 0.6) - 0.0075) < 1e-12);
  /* rank 19.8: beyond the last finite bound, which is all we know */
  assert_true(console_histogram_quantile(p.le, p.cum, p.nb, 0.99) == 0.01);
  double le[] = {1, 2}, none[] = {0, 0};
  assert_true(console_histogram_quantile(le, none, 2, 0.5) == -1);
  assert_true(console_histogram_quantile(le, none, 0, 0.5) == -1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sums_the_route_over_its_statuses),
      cmocka_unit_test(test_another_route_or_method_is_not_counted),
      cmocka_unit_test(test_hostile_lines_are_skipped),
      cmocka_unit_test(test_bounds_are_capped_and_sorted),
      cmocka_unit_test(test_no_nul_needed_and_long_lines_skipped),
      cmocka_unit_test(test_quantiles),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
