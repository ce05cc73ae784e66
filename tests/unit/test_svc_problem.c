/*
 * test_svc_problem.c - the services' error answers as RFC 9457 problem
 * objects (svc_problem.h), and an answer as the server sends it
 * (svc_resp_finish: problems completed, Retry-After on a 503; Location
 * and Allow copied into the answer, bounded).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "svc_http.h"
#include "svc_problem.h"

static const char *str(const json_t *o, const char *k) { return json_string_value(json_object_get(o, k)); }

static void test_new(void **state) {
  (void)state;
  json_t *p = svc_problem_new(404, "unknown_activity", "there is no activity 99");
  assert_non_null(p);
  assert_string_equal(str(p, "type"), "urn:txc:problem:unknown_activity");
  assert_string_equal(str(p, "title"), "Unknown activity");
  assert_int_equal(json_integer_value(json_object_get(p, "status")), 404);
  assert_string_equal(str(p, "detail"), "there is no activity 99");
  assert_string_equal(str(p, "error"), "unknown_activity"); /* the word scripts read, kept */
  assert_int_equal(json_object_size(p), 5);
  assert_true(svc_problem_ok(p, 404));
  assert_false(svc_problem_ok(p, 409));
  json_decref(p);

  /* no detail: the title; a word not in the table: the status phrase */
  p = svc_problem_new(503, "something_new", NULL);
  assert_string_equal(str(p, "title"), "Service Unavailable");
  assert_string_equal(str(p, "detail"), "Service Unavailable");
  assert_string_equal(str(p, "type"), "urn:txc:problem:something_new");
  json_decref(p);
  p = svc_problem_new(418, "teapot", NULL);
  assert_string_equal(str(p, "title"), "Error");
  json_decref(p);

  /* a word from elsewhere (another service's answer) is no part of a URI */
  const char *const bad[] = {NULL, "", "Sold-Out", "a b", "x\"y", "https://evil/", "\xc3\xa9",
                             "a234567890123456789012345678901234567890123456789"}; /* 49 bytes */
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    p = svc_problem_new(409, bad[i], "d");
    assert_string_equal(str(p, "error"), "error");
    assert_string_equal(str(p, "type"), "urn:txc:problem:error");
    json_decref(p);
  }
  /* a detail that is not UTF-8 (a library's message) gives way to the title */
  p = svc_problem_new(503, "unavailable", "bad \xff byte");
  assert_string_equal(str(p, "detail"), "Service unavailable");
  json_decref(p);
}

static void test_rejected(void **state) {
  (void)state;
  const char *const reasons[] = {"sold_out", "over_limit", "not_on_sale", "invalid"};
  for (size_t i = 0; i < sizeof(reasons) / sizeof(reasons[0]); i++) {
    json_t *p = svc_problem_rejected(reasons[i]);
    assert_true(svc_problem_ok(p, 409));
    assert_string_equal(str(p, "error"), "rejected");
    assert_string_equal(str(p, "reason"), reasons[i]);
    assert_string_equal(str(p, "title"), "Order refused");
    assert_true(strlen(str(p, "detail")) > 0);
    json_decref(p);
  }
  json_t *p = svc_problem_rejected("no way!");
  assert_string_equal(str(p, "reason"), "error");
  json_decref(p);
}

static void test_complete(void **state) {
  (void)state;
  /* an answer stored before this shape (an idempotent replay) */
  json_t *p = svc_problem_complete(json_pack("{s:s,s:s}", "error", "rejected", "reason", "sold_out"), 409);
  assert_true(svc_problem_ok(p, 409));
  assert_string_equal(str(p, "reason"), "sold_out");
  assert_string_equal(str(p, "title"), "Order refused");
  json_decref(p);
  /* the order's status of an old bad_state moves aside */
  p = svc_problem_complete(json_pack("{s:s,s:s}", "error", "bad_state", "status", "PAID"), 409);
  assert_true(svc_problem_ok(p, 409));
  assert_string_equal(str(p, "order_status"), "PAID");
  json_decref(p);
  /* what a problem has is kept */
  p = svc_problem_complete(json_pack("{s:s,s:s,s:s}", "error", "x", "detail", "mine", "title", "Mine"), 400);
  assert_string_equal(str(p, "detail"), "mine");
  assert_string_equal(str(p, "title"), "Mine");
  json_decref(p);
  /* no error word, or no object at all */
  p = svc_problem_complete(json_object(), 500);
  assert_true(svc_problem_ok(p, 500));
  assert_string_equal(str(p, "error"), "error");
  json_decref(p);
  p = svc_problem_complete(json_string("text"), 502);
  assert_true(svc_problem_ok(p, 502));
  assert_string_equal(str(p, "error"), "internal");
  json_decref(p);
  p = svc_problem_complete(NULL, 500);
  assert_true(svc_problem_ok(p, 500));
  json_decref(p);
}

static void test_finish(void **state) {
  (void)state;
  /* nothing answered: 500 */
  svc_resp_t r = {0};
  svc_resp_finish(&r);
  assert_int_equal(r.status, 500);
  assert_true(svc_problem_ok(r.body, 500));
  json_decref(r.body);

  /* a 503 says when to try again, unless the handler said it */
  svc_resp_t u = {0};
  svc_resp_error(&u, 503, "unavailable", "Redis is away");
  svc_resp_finish(&u);
  assert_string_equal(svc_resp_get_header(&u, "Retry-After"), "1");
  svc_resp_header(&u, "Retry-After", "5");
  svc_resp_finish(&u);
  assert_string_equal(svc_resp_get_header(&u, "retry-after"), "5");
  assert_int_equal(u.nheaders, 1);
  json_decref(u.body);

  /* a refusal built by hand gets the problem's members */
  svc_resp_t h = {0};
  svc_resp_json(&h, 409, json_pack("{s:s,s:s}", "error", "rejected", "reason", "over_limit"));
  svc_resp_finish(&h);
  assert_true(svc_problem_ok(h.body, 409));
  assert_null(svc_resp_get_header(&h, "Retry-After"));
  json_decref(h.body);

  /* a success is left alone */
  svc_resp_t ok = {0};
  svc_resp_json(&ok, 200, json_pack("{s:b}", "ok", 1));
  svc_resp_finish(&ok);
  assert_int_equal(json_object_size(ok.body), 1);
  json_decref(ok.body);

  /* 201 with Location, 405 with Allow: copied, so a stack buffer may go */
  svc_resp_t c = {0};
  {
    char loc[32] = "/orders/42";
    svc_resp_json(&c, 201, json_pack("{s:I}", "order_id", (json_int_t)42));
    svc_resp_header_copy(&c, "Location", loc);
    memset(loc, 'x', sizeof(loc) - 1);
  }
  svc_resp_finish(&c);
  assert_int_equal(c.status, 201);
  assert_string_equal(svc_resp_get_header(&c, "Location"), "/orders/42");
  json_decref(c.body);
  svc_resp_t a = {0};
  svc_resp_not_allowed(&a, "GET, POST");
  svc_resp_finish(&a);
  assert_int_equal(a.status, 405);
  assert_string_equal(svc_resp_get_header(&a, "Allow"), "GET, POST");
  assert_true(svc_problem_ok(a.body, 405));
  json_decref(a.body);

  /* copied values are bounded: one that does not fit is dropped */
  svc_resp_t b = {0};
  char big[SVC_RESP_HBUF + 1];
  memset(big, 'a', sizeof(big) - 1);
  big[sizeof(big) - 1] = '\0';
  svc_resp_header_copy(&b, "Location", big);
  assert_null(svc_resp_get_header(&b, "Location"));
  svc_resp_header_copy(&b, "Location", "/orders/1");
  assert_string_equal(svc_resp_get_header(&b, "Location"), "/orders/1");
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_new), cmocka_unit_test(test_rejected),
                                     cmocka_unit_test(test_complete), cmocka_unit_test(test_finish)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
