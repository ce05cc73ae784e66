/*
 * test_tc_creds.c - the credentials file (tc/tc_creds.h): what it accepts,
 * what it refuses, and the check of a secret.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tc_creds.h"
#include "test_file.h"

static char g_path[256];

static void write_file(const char *text, mode_t mode) { assert_true(test_write_file(g_path, text, mode)); }

static int setup(void **state) {
  (void)state;
  snprintf(g_path, sizeof(g_path), "%s/tc-creds-%d", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)getpid());
  return 0;
}

static int teardown(void **state) {
  (void)state;
  unlink(g_path);
  return 0;
}

static void test_load_and_check(void **state) {
  (void)state;
  write_file("# comment\n"
             "order-service flashsale 0123456789abcdef0123\n"
             "\n"
             "  stock-service\tflashsale   fedcba9876543210fedc  \r\n"
             "stock-service flashsale rotated-secret-000000\n"
             "tc-bench bench bench-secret-0000000000\n",
             0600);
  char err[256] = "";
  tc_creds_t *c = tc_creds_load(g_path, err, sizeof(err));
  if (!c) fail_msg("%s", err);
  assert_int_equal(tc_creds_count(c), 4);
  assert_int_equal(tc_creds_apps(c), 3);
  bool known = false;
  assert_string_equal(tc_creds_check(c, "order-service", "0123456789abcdef0123", &known), "flashsale");
  assert_true(known);
  /* both secrets of an application in rotation */
  assert_string_equal(tc_creds_check(c, "stock-service", "fedcba9876543210fedc", NULL), "flashsale");
  assert_string_equal(tc_creds_check(c, "stock-service", "rotated-secret-000000", NULL), "flashsale");
  /* another's secret, a prefix, a longer one, an unknown application */
  assert_null(tc_creds_check(c, "stock-service", "0123456789abcdef0123", &known));
  assert_true(known);
  assert_null(tc_creds_check(c, "order-service", "0123456789abcdef012", NULL));
  assert_null(tc_creds_check(c, "order-service", "0123456789abcdef01234", NULL));
  assert_null(tc_creds_check(c, "nobody", "0123456789abcdef0123", &known));
  assert_false(known);
  assert_null(tc_creds_check(c, "order-service", "", NULL));
  tc_creds_free(c);
  tc_creds_free(NULL);
}

static void test_refused(void **state) {
  (void)state;
  static const struct {
    const char *text;
    const char *why;
  } bad[] = {
    {"", "no credential"},
    {"# only a comment\n", "no credential"},
    {"order-service flashsale\n", ":1: expected"},
    {"order-service flashsale secret-0123456789 extra\n", ":1: expected"},
    {"order-service flashsale short\n", ":1: the secret"},
    {"order/service flashsale 0123456789abcdef0123\n", ":1: application id and group"},
    {"order-service *token* 0123456789abcdef0123\n", ":1: application id and group"},
    {"a g1 0123456789abcdef0123\na g2 0123456789abcdef0124\n", ":2: application \"a\" is in group"},
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    write_file(bad[i].text, 0600);
    char err[512] = "";
    tc_creds_t *c = tc_creds_load(g_path, err, sizeof(err));
    if (c) fail_msg("case %zu accepted", i);
    if (!strstr(err, bad[i].why)) fail_msg("case %zu: \"%s\" does not say \"%s\"", i, err, bad[i].why);
  }
  /* A file others may read or write. */
  for (mode_t m = 0; m < 2; m++) {
    write_file("a g 0123456789abcdef0123\n", m ? 0604 : 0640);
    char err[512] = "";
    assert_null(tc_creds_load(g_path, err, sizeof(err)));
    assert_non_null(strstr(err, "chmod 600"));
  }
  write_file("a g 0123456789abcdef0123\n", 0400);
  char err[512] = "";
  tc_creds_t *c = tc_creds_load(g_path, err, sizeof(err));
  assert_non_null(c);
  tc_creds_free(c);
  unlink(g_path);
  assert_null(tc_creds_load(g_path, err, sizeof(err)));
  assert_non_null(strstr(err, "could not open"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup_teardown(test_load_and_check, setup, teardown),
    cmocka_unit_test_setup_teardown(test_refused, setup, teardown),
  };
  return cmocka_run_group_tests_name("tc_creds", tests, NULL, NULL);
}
