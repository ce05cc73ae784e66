/*
 * test_svc_idem.c - the pure part of order-service's idempotency fast path
 * (examples/svc_idem.h): which Idempotency-Key values are accepted, which
 * Redis URLs are, and that a Redis nobody listens on fails at once
 * (SVC_IDEM_ERROR, so the caller goes to PostgreSQL) and keeps failing
 * fast instead of connecting again on every call.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "svc_common.h"
#include "svc_idem.h"

static void test_key_validation(void **state) {
  (void)state;
  char k64[65], k65[66];
  memset(k64, 'a', 64);
  k64[64] = '\0';
  memset(k65, 'a', 65);
  k65[65] = '\0';
  const char *good[] = {"a", "K-1", "fs12-7-0", "a.b_c:d-E9", k64};
  const char *bad[] = {"", "a b", "a/b", "é", "a\nb", "a\"b", "{x}", k65};
  for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) assert_true(svc_idem_key_ok(good[i]));
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) assert_false(svc_idem_key_ok(bad[i]));
  assert_false(svc_idem_key_ok(NULL));
}

static void test_urls(void **state) {
  (void)state;
  char err[256];
  const char *good[] = {"redis://127.0.0.1", "redis://127.0.0.1:6380", "redis://:secret@127.0.0.1:6380/2",
                        "redis://[::1]:6380", "redis://h/",
                        "redis+sentinel://127.0.0.1:26379,127.0.0.1:26380/txc"};
  /* One parser for the project (rm_redis_*, librmclient): an ACL user name
   * is refused there, as by the prefilter (it was ignored here before). */
  const char *bad[] = {"http://127.0.0.1", "redis://", "redis://:6379", "redis://h:0", "redis://h:65536",
                       "redis://h:12x", "redis://h:6379/x", "redis://[::1", "redis://user:secret@h:1/0",
                       "redis+sentinel://h1/", NULL};
  for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
    svc_idem_t *x = svc_idem_new(good[i], 100, 100, err, sizeof(err));
    if (!x) fail_msg("%s refused: %s", good[i], err);
    svc_idem_free(x);
  }
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    err[0] = '\0';
    svc_idem_t *x = svc_idem_new(bad[i], 100, 100, err, sizeof(err));
    if (x) fail_msg("%s accepted", bad[i] ? bad[i] : "NULL");
    assert_true(strlen(err) > 0);
  }
  svc_idem_free(NULL);
}

/* Port 1 on loopback: connection refused.  Every call is an error the
 * caller can fall through to PostgreSQL, and none waits for anything. */
static void test_redis_down(void **state) {
  (void)state;
  char err[256];
  svc_idem_t *x = svc_idem_new("redis://127.0.0.1:1", 200, 200, err, sizeof(err));
  assert_non_null(x);
  svc_idem_answer_t a = {0};
  int64_t t0 = svc_now_us();
  assert_int_equal(svc_idem_claim(x, 7, "k", 10, &a), SVC_IDEM_ERROR);
  assert_int_equal(svc_idem_peek(x, 7, "k", &a), SVC_IDEM_ERROR);
  json_t *body = json_object();
  assert_int_equal(svc_idem_store(x, 7, "k", "1/1/1", 201, body, 60), -1);
  json_decref(body);
  assert_int_equal(svc_idem_forget(x, 7, "k"), -1);
  assert_true(svc_now_us() - t0 < 1000 * 1000);
  assert_null(a.body);
  svc_idem_free(x);
}

int main(void) {
  svc_log_level = SVC_LOG_ERROR;
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_key_validation),
    cmocka_unit_test(test_urls),
    cmocka_unit_test(test_redis_down),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
