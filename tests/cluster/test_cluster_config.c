/*
 * test_cluster_config.c - the [cluster] settings of tcd: defaults, the
 * peers list parser, and the cross-field checks.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "tc_config.h"

typedef struct {
  int n;
  int ids[8];
  char addrs[8][64];
} seen_t;

static int collect(int id, const char *addr, void *arg) {
  seen_t *s = arg;
  s->ids[s->n] = id;
  snprintf(s->addrs[s->n], sizeof(s->addrs[0]), "%s", addr);
  s->n++;
  return 0;
}

static void valid_base(tc_config_t *c) {
  tc_config_defaults(c);
  snprintf(c->token, sizeof(c->token), "secret");
  snprintf(c->pg_url, sizeof(c->pg_url), "postgresql://127.0.0.1/tc");
}

static void test_defaults(void **state) {
  (void)state;
  tc_config_t c;
  valid_base(&c);
  char err[256];
  assert_int_equal(tc_config_validate(&c, err, sizeof(err)), 0);
  assert_string_equal(c.cluster_bus, "");
  assert_int_equal(c.cluster_heartbeat_ms, 1000);
  assert_int_equal(c.cluster_leader_lease_ms, 5000);
  assert_int_equal(c.cluster_lock_recheck_ms, 500);
}

static void test_peers(void **state) {
  (void)state;
  char err[256];
  seen_t s = {0};
  assert_int_equal(tc_config_each_peer(" 1@tcp://10.0.0.1:7101 ,2@ipc:///tmp/b, 13@tcp://[::1]:7", collect, &s,
                                       err, sizeof(err)),
                   0);
  assert_int_equal(s.n, 3);
  assert_int_equal(s.ids[0], 1);
  assert_string_equal(s.addrs[0], "tcp://10.0.0.1:7101");
  assert_string_equal(s.addrs[1], "ipc:///tmp/b");
  assert_int_equal(s.ids[2], 13);
  assert_int_equal(tc_config_each_peer("", collect, &s, err, sizeof(err)), 0);
  assert_int_equal(tc_config_each_peer("1@tcp://a:1,,", NULL, NULL, err, sizeof(err)), 0);
  static const char *const bad[] = {"tcp://a:1", "0@tcp://a:1", "1024@tcp://a:1", "x@tcp://a:1",
                                    "1@", "1@a:1", "1 @tcp://a:1"};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    err[0] = '\0';
    assert_int_equal(tc_config_each_peer(bad[i], NULL, NULL, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "cluster.peers"));
  }
}

static void test_checks(void **state) {
  (void)state;
  tc_config_t c;
  char err[256];
  valid_base(&c);
  assert_int_equal(tc_config_set(&c, "cluster", "bus", "127.0.0.1:7101", err, sizeof(err)), 0);
  assert_int_equal(tc_config_validate(&c, err, sizeof(err)), -1);
  assert_non_null(strstr(err, "cluster.bus"));
  valid_base(&c);
  assert_int_equal(tc_config_set(&c, "cluster", "leader_lease_ms", "2000", err, sizeof(err)), 0);
  assert_int_equal(tc_config_validate(&c, err, sizeof(err)), -1);
  assert_non_null(strstr(err, "leader_lease_ms"));
  valid_base(&c);
  assert_int_equal(tc_config_set(&c, "cluster", "peers", "2@tcp://127.0.0.1:7102", err, sizeof(err)), 0);
  assert_int_equal(tc_config_set(&c, "cluster", "bus", "tcp://127.0.0.1:7101", err, sizeof(err)), 0);
  /* A bus needs the cluster secret. */
  assert_int_equal(tc_config_validate(&c, err, sizeof(err)), -1);
  assert_non_null(strstr(err, "cluster.secret_file"));
  char path[] = "/tmp/test_cluster_config.XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  const char key[] = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\n";
  assert_int_equal(write(fd, key, sizeof(key) - 1), (int)sizeof(key) - 1);
  close(fd);
  assert_int_equal(tc_config_set(&c, "cluster", "secret_file", path, err, sizeof(err)), 0);
  assert_int_equal(tc_config_validate(&c, err, sizeof(err)), 0);
  assert_int_equal(c.cluster_replay_window_ms, 30000);
  /* Readable by others: refused, naming the file. */
  assert_int_equal(chmod(path, 0644), 0);
  assert_int_equal(tc_config_validate(&c, err, sizeof(err)), -1);
  assert_non_null(strstr(err, path));
  assert_non_null(strstr(err, "0600"));
  assert_int_equal(chmod(path, 0600), 0);
  /* A bus on every interface is refused: bind the address peers use. */
  static const char *const wild[] = {"tcp://*:7101", "tcp://0.0.0.0:7101", "tcp://[::]:7101"};
  for (size_t i = 0; i < 3; i++) {
    assert_int_equal(tc_config_set(&c, "cluster", "bus", wild[i], err, sizeof(err)), 0);
    assert_int_equal(tc_config_validate(&c, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "every interface"));
  }
  assert_int_equal(tc_config_set(&c, "cluster", "bus", "tcp://10.1.2.3:7101", err, sizeof(err)), 0);
  assert_int_equal(tc_config_validate(&c, err, sizeof(err)), 0);
  unlink(path);
  assert_int_equal(tc_config_validate(&c, err, sizeof(err)), -1);
  assert_non_null(strstr(err, "could not open the cluster secret file"));
  assert_int_equal(tc_config_set(&c, "cluster", "heartbeat_ms", "50", err, sizeof(err)), -1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_defaults),
    cmocka_unit_test(test_peers),
    cmocka_unit_test(test_checks),
  };
  return cmocka_run_group_tests_name("cluster config", tests, NULL, NULL);
}
