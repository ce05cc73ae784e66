/*
 * test_svc_http_route.c - the route label of a request path
 * (svc_http_route): ids folded into {id}, label-safe, bounded; and the
 * services' route tables (svc_route_find): the route and its id, 404, or
 * 405 with the Allow header's methods.
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
  if (strcmp(out, want) != 0)
    fail_msg("route of \"%s\": got \"%s\", want \"%s\"", path ? path : "(null)", out, want);
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

static const svc_route_t table[] = {
  {"POST", "/orders", 0},          {"GET", "/orders/{id}", 1},     {"POST", "/orders/{id}/pay", 2},
  {"GET", "/admin/mode", 3},       {"POST", "/admin/mode", 4},     {"GET", "/x/{id}/y/{id}", 5},
};
#define NTABLE (sizeof(table) / sizeof(table[0]))

/* find METHOD PATH: the index, id and Allow value. */
static int find(const char *method, const char *path, long long *id, char *allow, size_t allowlen) {
  *id = -7;
  return svc_route_find(table, NTABLE, method, path, id, allow, allowlen);
}

static void test_route_find(void **state) {
  (void)state;
  char allow[64];
  long long id;
  assert_int_equal(find("POST", "/orders", &id, allow, sizeof(allow)), 0);
  assert_int_equal(id, 0);
  assert_int_equal(find("GET", "/orders/42", &id, allow, sizeof(allow)), 1);
  assert_int_equal(id, 42);
  assert_int_equal(find("POST", "/orders/9223372036854775807/pay", &id, allow, sizeof(allow)), 2);
  assert_true(id == INT64_MAX);
  assert_int_equal(find("GET", "/x/3/y/4", &id, allow, sizeof(allow)), 5);
  assert_int_equal(id, 3); /* the first id */

  /* the path is known, the method is not: 405 and what Allow says */
  assert_int_equal(find("GET", "/orders", &id, allow, sizeof(allow)), SVC_ROUTE_NOT_ALLOWED);
  assert_string_equal(allow, "POST");
  assert_int_equal(find("DELETE", "/admin/mode", &id, allow, sizeof(allow)), SVC_ROUTE_NOT_ALLOWED);
  assert_string_equal(allow, "GET, POST");
  assert_int_equal(find("POST", "/orders/7", &id, allow, sizeof(allow)), SVC_ROUTE_NOT_ALLOWED);
  assert_string_equal(allow, "GET");
  /* an Allow that does not fit is cut at a method, never mid-word */
  char small[6];
  assert_int_equal(find("PUT", "/admin/mode", &id, small, sizeof(small)), SVC_ROUTE_NOT_ALLOWED);
  assert_string_equal(small, "GET");

  /* no such path: 404; ids that are no ids */
  const char *const nowhere[] = {"/",
                                 "",
                                 "/orders/",
                                 "/orders/0",
                                 "/orders/042",
                                 "/orders/-1",
                                 "/orders/4x",
                                 "/orders/9223372036854775808", /* 2^63 */
                                 "/orders/99999999999999999999999/pay",
                                 "/orders/42/",
                                 "/orders/42/pay/",
                                 "/orders/42/refund",
                                 "/Orders",
                                 "/orders?x=1",
                                 "/x/1/y/",
                                 "/admin/mode/x"};
  for (size_t i = 0; i < sizeof(nowhere) / sizeof(nowhere[0]); i++) {
    int r = find("GET", nowhere[i], &id, allow, sizeof(allow));
    if (r != SVC_ROUTE_NOT_FOUND) fail_msg("GET \"%s\": %d, want not found", nowhere[i], r);
    assert_string_equal(allow, "");
  }
}

/* svc_route_or_reply: the answer of a 405 and of a 404, as sent. */
static void test_route_reply(void **state) {
  (void)state;
  svc_req_t req = {.method = "PATCH", .path = "/admin/mode", .body = "", .body_len = 0};
  svc_resp_t resp = {0};
  int op = -1;
  long long id;
  assert_false(svc_route_or_reply(table, NTABLE, &req, &resp, &op, &id));
  svc_resp_finish(&resp);
  assert_int_equal(resp.status, 405);
  assert_string_equal(svc_resp_get_header(&resp, "allow"), "GET, POST");
  assert_string_equal(json_string_value(json_object_get(resp.body, "error")), "method_not_allowed");
  assert_int_equal(json_integer_value(json_object_get(resp.body, "status")), 405);
  json_decref(resp.body);

  svc_req_t req2 = {.method = "GET", .path = "/nowhere", .body = "", .body_len = 0};
  svc_resp_t resp2 = {0};
  assert_false(svc_route_or_reply(table, NTABLE, &req2, &resp2, &op, &id));
  svc_resp_finish(&resp2);
  assert_int_equal(resp2.status, 404);
  assert_null(svc_resp_get_header(&resp2, "Allow"));
  assert_string_equal(json_string_value(json_object_get(resp2.body, "type")), "urn:txc:problem:not_found");
  json_decref(resp2.body);

  svc_req_t req3 = {.method = "POST", .path = "/orders/5/pay", .body = "", .body_len = 0};
  svc_resp_t resp3 = {0};
  assert_true(svc_route_or_reply(table, NTABLE, &req3, &resp3, &op, &id));
  assert_int_equal(op, 2);
  assert_int_equal(id, 5);
  assert_int_equal(resp3.status, 0); /* untouched: the handler answers */
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_routes), cmocka_unit_test(test_route_find),
                                     cmocka_unit_test(test_route_reply)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
