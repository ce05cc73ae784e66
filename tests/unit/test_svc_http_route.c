/*
 * test_svc_http_route.c - the route label of a request path
 * (svc_http_route): ids folded into {id}, label-safe, bounded.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "svc_http.h"

static void expect(const char *path, const char *want) {
  char out[64];
  svc_http_route(path, out, sizeof(out));
  if (strcmp(out, want) != 0) fail_msg("route of \"%s\": got \"%s\", want \"%s\"", path, out, want);
}

static void test_routes(void **state) {
  (void)state;
  expect("/orders", "/orders");
  expect("/orders/42", "/orders/{id}");
  expect("/orders/42/pay", "/orders/{id}/pay");
  expect("/activities/7/tickets", "/activities/{id}/tickets");
  expect("/orders/42x/pay", "/orders/42x/pay"); /* not all digits: kept */
  expect("/", "/");
  expect("", "");
  expect("/a b\"c\n", "/a_b_c_"); /* nothing that could break a label */
  expect("/x/1/2/3", "/x/{id}/{id}/{id}");
  char longp[200];
  memset(longp, 'a', sizeof(longp) - 1);
  longp[0] = '/';
  longp[sizeof(longp) - 1] = '\0';
  expect(longp, "other");
  expect(NULL, "");
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_routes)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
