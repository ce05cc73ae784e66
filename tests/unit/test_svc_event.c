/*
 * test_svc_event.c - the decoder of order events (examples/svc_event.h):
 * what a consumer accepts from the stream, and everything it refuses
 * with a reason instead of applying half of it.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <string.h>

#include "svc_event.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *const good_k[] = {"event_id", "type", "order_id", "payload"};
#define GOOD_PAYLOAD "{\"activity\":7,\"ticket_type\":1,\"bucket\":3,\"user\":42,\"qty\":2}"

/* Parse with the good fields, field 'replace' (if >= 0) given 'value'. */
static bool parse_with(int replace, const char *value, svc_event_t *ev, json_t **pl, char *biz, char *why) {
  const char *v[4] = {"12", "order.paid", "900", GOOD_PAYLOAD};
  if (replace >= 0) v[replace] = value;
  return svc_event_parse(good_k, v, 4, ev, pl, biz, why, 256);
}

static void test_good_event(void **state) {
  (void)state;
  svc_event_t ev = {0};
  json_t *pl = NULL;
  char biz[SVC_EVENT_BIZ_KEY_MAX], why[256] = "";
  assert_true(parse_with(-1, NULL, &ev, &pl, biz, why));
  assert_int_equal(ev.event_id, 12);
  assert_int_equal(ev.order_id, 900);
  assert_string_equal(ev.type, "order.paid");
  assert_string_equal(ev.biz_key, "order.paid:900");
  assert_ptr_equal(ev.payload, pl);
  assert_int_equal(json_integer_value(json_object_get(pl, "qty")), 2);
  json_decref(pl);
}

/* Every type the outbox writes is one a consumer reads, with its own key
 * (one order can have a waitlist event and then its end). */
static void test_every_type(void **state) {
  (void)state;
  static const char *const types[] = {"order.paid",       "order.cancelled",  "order.expired",
                                      "order.rejected",   "waitlist.ordered", "waitlist.refused"};
  for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
    svc_event_t ev = {0};
    json_t *pl = NULL;
    char biz[SVC_EVENT_BIZ_KEY_MAX], why[256] = "", want[64];
    assert_true(parse_with(1, types[i], &ev, &pl, biz, why));
    assert_string_equal(ev.type, types[i]);
    snprintf(want, sizeof(want), "%s:900", types[i]);
    assert_string_equal(ev.biz_key, want);
    json_decref(pl);
  }
  svc_event_t ev = {0};
  json_t *pl = NULL;
  char biz[SVC_EVENT_BIZ_KEY_MAX], why[256] = "";
  assert_false(parse_with(1, "waitlist.joined", &ev, &pl, biz, why));
  assert_false(parse_with(1, "waitlist.", &ev, &pl, biz, why));
}

static void test_fields_in_any_order_unknown_ignored(void **state) {
  (void)state;
  const char *k[5] = {"payload", "extra", "order_id", "type", "event_id"};
  const char *v[5] = {GOOD_PAYLOAD, "whatever", "5", "order.expired", "1"};
  svc_event_t ev = {0};
  json_t *pl = NULL;
  char biz[SVC_EVENT_BIZ_KEY_MAX], why[256];
  assert_true(svc_event_parse(k, v, 5, &ev, &pl, biz, why, sizeof(why)));
  assert_string_equal(ev.biz_key, "order.expired:5");
  json_decref(pl);
}

static void test_refusals(void **state) {
  (void)state;
  static const struct {
    int field;
    const char *value, *why_has;
  } bad[] = {
    {0, "0", "positive"},          {0, "-3", "positive"},        {0, "12x", "positive"},
    {0, "99999999999999999999", "positive"},                     {2, "", "positive"},
    {2, NULL, "positive"},         {1, "order.refunded", "unknown type"},
    {1, "", "unknown type"},       {1, NULL, "unknown type"},     {3, "not json", "payload"},
    {3, "[1,2]", "payload"},       {3, "{\"activity\":7}", "payload"},
    {3, "{\"activity\":7,\"ticket_type\":1,\"bucket\":3,\"user\":42,\"qty\":0}", "payload"},
    {3, "{\"activity\":7,\"ticket_type\":1,\"bucket\":3,\"user\":42,\"qty\":2,\"qty\":3}", "payload"},
    {3, "{\"activity\":\"7\",\"ticket_type\":1,\"bucket\":3,\"user\":42,\"qty\":2}", "payload"},
    {3, NULL, "payload"},
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    svc_event_t ev = {0};
    json_t *pl = (json_t *)1;
    char biz[SVC_EVENT_BIZ_KEY_MAX], why[256] = "";
    const char *v[4] = {"12", "order.paid", "900", GOOD_PAYLOAD};
    v[bad[i].field] = bad[i].value;
    size_t n = 4;
    const char *k[4] = {good_k[0], good_k[1], good_k[2], good_k[3]};
    if (!bad[i].value) { /* the field is missing altogether */
      k[bad[i].field] = "absent";
      v[bad[i].field] = "x";
    }
    assert_false(svc_event_parse(k, v, n, &ev, &pl, biz, why, sizeof(why)));
    assert_null(pl);
    assert_non_null(strstr(why, bad[i].why_has));
  }
}

static void test_repeated_field_refused(void **state) {
  (void)state;
  const char *k[5] = {"event_id", "type", "order_id", "payload", "order_id"};
  const char *v[5] = {"1", "order.paid", "5", GOOD_PAYLOAD, "6"};
  svc_event_t ev = {0};
  json_t *pl = NULL;
  char biz[SVC_EVENT_BIZ_KEY_MAX], why[256];
  assert_false(svc_event_parse(k, v, 5, &ev, &pl, biz, why, sizeof(why)));
  assert_non_null(strstr(why, "repeated"));
  assert_null(pl);
}

static void test_null_value_refused(void **state) {
  (void)state;
  const char *k[4] = {"event_id", "type", "order_id", "payload"};
  const char *v[4] = {"1", "order.paid", "5", NULL};
  svc_event_t ev = {0};
  json_t *pl = NULL;
  char biz[SVC_EVENT_BIZ_KEY_MAX], why[256];
  assert_false(svc_event_parse(k, v, 4, &ev, &pl, biz, why, sizeof(why)));
  assert_non_null(strstr(why, "without a value"));
}

/* A key file with 'lines' in a temporary directory; its path in 'path'. */
static void key_file(char *path, size_t len, const char *lines, mode_t mode) {
  snprintf(path, len, "/tmp/test_svc_auth.%d.key", (int)getpid());
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(lines, f);
  fclose(f);
  chmod(path, mode);
}

#define KEY_A "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"
#define KEY_B "ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100"

/* The services' key (svc_auth.h): a signature verifies for exactly its
 * parts, a key that follows as the second line still verifies (rotation),
 * and a key file others may read, or with a bad line, is refused. */
static void test_service_key(void **state) {
  (void)state;
  char path[128], err[256], sig[SVC_AUTH_HEX_MAX], sig2[SVC_AUTH_HEX_MAX];
  key_file(path, sizeof(path), KEY_A "\n", 0600);
  svc_auth_t *a = svc_auth_load(path, err, sizeof(err));
  assert_non_null(a);
  svc_event_sign(a, "12", "order.paid", "900", GOOD_PAYLOAD, sig);
  assert_int_equal(strlen(sig), 64);
  assert_true(svc_event_verify(a, "12", "order.paid", "900", GOOD_PAYLOAD, sig));
  assert_false(svc_event_verify(a, "12", "order.cancelled", "900", GOOD_PAYLOAD, sig));
  assert_false(svc_event_verify(a, "12", "order.paid", "901", GOOD_PAYLOAD, sig));
  assert_false(svc_event_verify(a, "1", "2order.paid", "900", GOOD_PAYLOAD, sig)); /* parts are length-framed */
  assert_false(svc_event_verify(a, "12", "order.paid", "900", GOOD_PAYLOAD, "00"));
  assert_false(svc_event_verify(a, "12", "order.paid", "900", GOOD_PAYLOAD, NULL));
  sig[0] = sig[0] == '0' ? '1' : '0';
  assert_false(svc_event_verify(a, "12", "order.paid", "900", GOOD_PAYLOAD, sig));
  svc_event_sign(a, "12", "order.paid", "900", GOOD_PAYLOAD, sig);

  /* rotation: B signs, A still verifies */
  key_file(path, sizeof(path), KEY_B "\n" KEY_A "\n", 0600);
  svc_auth_t *ba = svc_auth_load(path, err, sizeof(err));
  assert_non_null(ba);
  assert_true(svc_event_verify(ba, "12", "order.paid", "900", GOOD_PAYLOAD, sig));
  svc_event_sign(ba, "12", "order.paid", "900", GOOD_PAYLOAD, sig2);
  assert_string_not_equal(sig, sig2);
  assert_false(svc_event_verify(a, "12", "order.paid", "900", GOOD_PAYLOAD, sig2));
  svc_auth_free(ba);
  svc_auth_free(a);

  key_file(path, sizeof(path), KEY_A "\n", 0644);
  assert_null(svc_auth_load(path, err, sizeof(err)));
  assert_non_null(strstr(err, "chmod 600"));
  key_file(path, sizeof(path), "not a key\n", 0600);
  assert_null(svc_auth_load(path, err, sizeof(err)));
  assert_non_null(strstr(err, "hex digits"));
  key_file(path, sizeof(path), "# only a comment\n", 0600);
  assert_null(svc_auth_load(path, err, sizeof(err)));
  unlink(path);
  assert_null(svc_auth_load(path, err, sizeof(err)));
  assert_non_null(strstr(err, "could not open"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_good_event), cmocka_unit_test(test_every_type),
    cmocka_unit_test(test_fields_in_any_order_unknown_ignored),
    cmocka_unit_test(test_refusals),
    cmocka_unit_test(test_repeated_field_refused),
    cmocka_unit_test(test_null_value_refused),
    cmocka_unit_test(test_service_key),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
