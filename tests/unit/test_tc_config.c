/*
 * test_tc_config.c - tcd settings: file, environment, validation.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "tc_config.h"

static char path[64];

static void write_file(const char *text) {
  snprintf(path, sizeof(path), "/tmp/tcconf-XXXXXX");
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
  close(fd);
}

static void valid_base(tc_config_t *c) {
  tc_config_defaults(c);
  snprintf(c->token, sizeof(c->token), "secret");
  snprintf(c->pg_url, sizeof(c->pg_url), "postgresql://x@127.0.0.1/tc");
}

static void test_defaults_need_token_and_url(void **state) {
  (void)state;
  tc_config_t c;
  char err[512];
  tc_config_defaults(&c);
  assert_int_equal(tc_config_validate(&c, err, sizeof(err)), -1);
  assert_non_null(strstr(err, "server.token"));
  snprintf(c.token, sizeof(c.token), "t");
  assert_int_equal(tc_config_validate(&c, err, sizeof(err)), -1);
  assert_non_null(strstr(err, "store.pg_url"));
  valid_base(&c);
  assert_int_equal(tc_config_validate(&c, err, sizeof(err)), 0);
  assert_string_equal(c.listen, "127.0.0.1:8091"); /* loopback by default */
}

static void test_file_loads_values(void **state) {
  (void)state;
  tc_config_t c;
  char err[512];
  valid_base(&c);
  write_file("[node]\nid = 7\n[server]\nlisten = 127.0.0.1:9000\n[txn]\ndefault_timeout_ms = 1500\n");
  assert_int_equal(tc_config_load_file(&c, path, err, sizeof(err)), 0);
  unlink(path);
  assert_int_equal(c.node_id, 7);
  assert_string_equal(c.listen, "127.0.0.1:9000");
  assert_int_equal(c.default_timeout_ms, 1500);
  assert_int_equal(tc_config_validate(&c, err, sizeof(err)), 0);
}

static void test_unknown_key_is_an_error(void **state) {
  (void)state;
  tc_config_t c;
  char err[512];
  valid_base(&c);
  write_file("[server]\nlisten = 127.0.0.1:9000\nlisten_typo = 1\n");
  assert_int_equal(tc_config_load_file(&c, path, err, sizeof(err)), -1);
  unlink(path);
  assert_non_null(strstr(err, "listen_typo"));
  assert_non_null(strstr(err, "line 3"));
}

static void test_unknown_section_and_bad_values(void **state) {
  (void)state;
  tc_config_t c;
  char err[512];
  valid_base(&c);
  write_file("[nope]\nx = 1\n");
  assert_int_equal(tc_config_load_file(&c, path, err, sizeof(err)), -1);
  unlink(path);
  write_file("[node]\nid = 5000\n");
  assert_int_equal(tc_config_load_file(&c, path, err, sizeof(err)), -1);
  unlink(path);
  assert_non_null(strstr(err, "out of range"));
  write_file("[node]\nid = 12abc\n");
  assert_int_equal(tc_config_load_file(&c, path, err, sizeof(err)), -1);
  unlink(path);
  assert_non_null(strstr(err, "not an integer"));
  assert_int_equal(tc_config_load_file(&c, "/nonexistent/tcd.ini", err, sizeof(err)), -1);
  assert_non_null(strstr(err, "could not open"));
  assert_int_equal(c.node_id, 1); /* nothing changed by the failures */
}

static void test_env_overrides(void **state) {
  (void)state;
  tc_config_t c;
  char err[512];
  valid_base(&c);
  setenv("TC_SERVER_MAX_INFLIGHT", "12", 1);
  setenv("TC_LOG_LEVEL", "debug", 1);
  assert_int_equal(tc_config_load_env(&c, err, sizeof(err)), 0);
  assert_int_equal(c.max_inflight, 12);
  assert_string_equal(c.log_level, "debug");
  setenv("TC_SERVER_MAX_INFLIGHT", "-3", 1);
  assert_int_equal(tc_config_load_env(&c, err, sizeof(err)), -1);
  assert_non_null(strstr(err, "TC_SERVER_MAX_INFLIGHT"));
  unsetenv("TC_SERVER_MAX_INFLIGHT");
  unsetenv("TC_LOG_LEVEL");
}

static void test_cross_field_checks(void **state) {
  (void)state;
  tc_config_t c;
  char err[512];
  valid_base(&c);
  c.default_timeout_ms = c.max_timeout_ms + 1;
  assert_int_equal(tc_config_validate(&c, err, sizeof(err)), -1);
  valid_base(&c);
  snprintf(c.listen, sizeof(c.listen), "nohostport");
  assert_int_equal(tc_config_validate(&c, err, sizeof(err)), -1);
  valid_base(&c);
  c.writers = c.pool_size;
  assert_int_equal(tc_config_validate(&c, err, sizeof(err)), -1);
  valid_base(&c); /* writers and relaxed writers must leave a reader */
  c.writers = c.pool_size - 1;
  c.relaxed_writers = 1;
  assert_int_equal(tc_config_validate(&c, err, sizeof(err)), -1);
  assert_non_null(strstr(err, "relaxed_writers"));
  c.relaxed_writers = 0;
  assert_int_equal(tc_config_validate(&c, err, sizeof(err)), 0);
  valid_base(&c); /* a relaxed lane brings the clean-up writer with it */
  c.writers = c.pool_size - 3;
  c.relaxed_writers = 1;
  assert_int_equal(tc_config_validate(&c, err, sizeof(err)), 0);
  assert_int_equal(tc_config_store_writers(&c), c.pool_size - 1);
  c.relaxed_writers = 2;
  assert_int_equal(tc_config_validate(&c, err, sizeof(err)), -1);
  assert_non_null(strstr(err, "clean-up writer"));
  valid_base(&c);
  snprintf(c.log_format, sizeof(c.log_format), "xml");
  assert_int_equal(tc_config_validate(&c, err, sizeof(err)), -1);
  assert_int_equal(tc_config_set(&c, "server", "nokey", "1", err, sizeof(err)), -1);
  assert_int_equal(tc_config_set(&c, "server", "max_inflight", "99", err, sizeof(err)), 0);
  assert_int_equal(c.max_inflight, 99);
}

/* Security review, finding 7: what --check-config accepts, start-up
 * accepts; the mask --print-config prints is not a secret; a misspelt
 * TC_<SECTION>_<KEY> is an error, not ignored. */
static void test_config_says_the_truth(void **state) {
  (void)state;
  tc_config_t c;
  char err[512];
  valid_base(&c);
  snprintf(c.listen, sizeof(c.listen), "example.com:1");
  assert_int_equal(tc_config_validate(&c, err, sizeof(err)), -1);
  assert_non_null(strstr(err, "numeric IP"));
  static const char *const good[] = {"127.0.0.1:1", "0.0.0.0:7091", "[::1]:7091", "localhost:7091", "*:7091"};
  for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
    valid_base(&c);
    snprintf(c.listen, sizeof(c.listen), "%s", good[i]);
    assert_int_equal(tc_config_validate(&c, err, sizeof(err)), 0);
  }
  valid_base(&c);
  snprintf(c.token, sizeof(c.token), "%s", TC_CONFIG_MASK);
  assert_int_equal(tc_config_validate(&c, err, sizeof(err)), -1);
  assert_non_null(strstr(err, "server.token"));
  valid_base(&c);
  snprintf(c.pg_url, sizeof(c.pg_url), "postgresql://u:" TC_CONFIG_MASK "@db/tc");
  assert_int_equal(tc_config_validate(&c, err, sizeof(err)), -1);
  assert_non_null(strstr(err, "store.pg_url"));

  valid_base(&c);
  setenv("TC_SERVER_TOKN", "x", 1);
  assert_int_equal(tc_config_load_env(&c, err, sizeof(err)), -1);
  assert_non_null(strstr(err, "TC_SERVER_TOKN"));
  unsetenv("TC_SERVER_TOKN");
  setenv("TC_store_pg_url_x", "x", 1); /* the section matched whatever the case */
  assert_int_equal(tc_config_load_env(&c, err, sizeof(err)), -1);
  unsetenv("TC_store_pg_url_x");
  /* the clients' variables of cluster/local/up are not settings: left alone */
  setenv("TC_NODES", "127.0.0.1:1", 1);
  setenv("TC_PG_URL", "postgresql://x/tc", 1);
  setenv("TC_ADMIN_SOCKETS", "/tmp/a.sock", 1);
  setenv("TC_TOKEN", "t", 1);
  assert_int_equal(tc_config_load_env(&c, err, sizeof(err)), 0);
  unsetenv("TC_NODES");
  unsetenv("TC_PG_URL");
  unsetenv("TC_ADMIN_SOCKETS");
  unsetenv("TC_TOKEN");
}

static void test_split_addr(void **state) {
  (void)state;
  char host[64];
  int port;
  assert_int_equal(tc_config_split_addr("127.0.0.1:80", host, sizeof(host), &port), 0);
  assert_string_equal(host, "127.0.0.1");
  assert_int_equal(port, 80);
  assert_int_equal(tc_config_split_addr(":80", host, sizeof(host), &port), -1);
  assert_int_equal(tc_config_split_addr("h:", host, sizeof(host), &port), -1);
  assert_int_equal(tc_config_split_addr("h:70000", host, sizeof(host), &port), -1);
  assert_int_equal(tc_config_split_addr("h:8x", host, sizeof(host), &port), -1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_defaults_need_token_and_url),
    cmocka_unit_test(test_file_loads_values),
    cmocka_unit_test(test_unknown_key_is_an_error),
    cmocka_unit_test(test_unknown_section_and_bad_values),
    cmocka_unit_test(test_env_overrides),
    cmocka_unit_test(test_cross_field_checks),
    cmocka_unit_test(test_config_says_the_truth),
    cmocka_unit_test(test_split_addr),
  };
  return cmocka_run_group_tests_name("tc_config", tests, NULL, NULL);
}
