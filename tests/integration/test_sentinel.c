/*
 * test_sentinel.c - librmclient's Redis address resolver and the
 * prefilter's pool under Sentinel, on real servers: a master, a replica
 * and three Sentinels started by the test itself with scripts/redis-tmp
 * (in a temporary directory; TX_SOURCE_DIR from ctest).
 *
 * What is checked (issue 22):
 *   - rm_redis_resolve on a redis+sentinel:// URL names the master, with
 *     its run_id; sentinels that do not answer fail fast with
 *     RM_E_REDIS_NO_MASTER;
 *   - a prefilter on the Sentinel URL runs its scripts on the master
 *     (a freeze of an activity not loaded answers RM_PF_NOT_LOADED);
 *   - kill -9 of the master: every call meanwhile comes back within a
 *     bound (no TCP timeout), as "did not run" or "unknown outcome"; after
 *     the promotion the calls reach the new master by themselves, and
 *     rm_prefilter_master_changes counts one change.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "rm_client.h"

static char dir[256];
static char url[512];
static int master_port;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* scripts/redis-tmp ARGS; its stdout's "export NAME=VALUE" for 'want'
 * into 'out' (may be NULL).  The exit status. */
static int redis_tmp(const char *args, const char *want, char *out, size_t cap) {
  char line[1024];
  snprintf(line, sizeof(line), "'%s/scripts/redis-tmp' %s", getenv("TX_SOURCE_DIR"), args);
  FILE *f = popen(line, "r");
  if (!f) return -1;
  while (fgets(line, sizeof(line), f)) {
    char key[64];
    snprintf(key, sizeof(key), "export %s=", want ? want : "-");
    if (want && out && strncmp(line, key, strlen(key)) == 0) {
      snprintf(out, cap, "%s", line + strlen(key));
      out[strcspn(out, "\r\n")] = '\0';
    }
  }
  return pclose(f);
}

static int setup(void **state) {
  (void)state;
  char port[16] = "", args[512], sp[16], sents[256] = "";
  if (!getenv("TX_SOURCE_DIR")) return -1;
  snprintf(dir, sizeof(dir), "%s/txc-sentinel.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
  if (!mkdtemp(dir)) return -1;
  snprintf(args, sizeof(args), "start '%s/m' --aof", dir);
  if (redis_tmp(args, "REDIS_PORT", port, sizeof(port)) != 0) return -1;
  master_port = atoi(port);
  snprintf(args, sizeof(args), "start '%s/r' --aof --replica-of %d", dir, master_port);
  if (redis_tmp(args, NULL, NULL, 0) != 0) return -1;
  for (int i = 1; i <= 3; i++) {
    snprintf(args, sizeof(args), "sentinel '%s/s%d' --monitor t %d --down-after 1000 --failover-timeout 2000", dir, i,
             master_port);
    if (redis_tmp(args, "SENTINEL_PORT", sp, sizeof(sp)) != 0) return -1;
    snprintf(sents + strlen(sents), sizeof(sents) - strlen(sents), "%s127.0.0.1:%s", i > 1 ? "," : "", sp);
  }
  snprintf(url, sizeof(url), "redis+sentinel://%s/t", sents);
  /* until every sentinel knows the replica and the others (else no
   * failover): resolve works at once, the rest takes a few seconds */
  char cmd[1024];
  snprintf(cmd, sizeof(cmd),
           "for i in $(seq 1 100); do ok=1; for p in $(echo '%s' | tr ',' ' ' | sed 's/127.0.0.1://g'); do "
           "[ \"$(redis-cli -p $p sentinel master t | tr -d '\\r' | awk 'p{print;p=0} "
           "/^(num-slaves|num-other-sentinels)$/{p=1}' | paste -sd' ')\" = '1 2' ] || ok=0; done; "
           "[ $ok = 1 ] && exit 0; sleep 0.1; done; exit 1",
           sents);
  return system(cmd) == 0 ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  char args[512];
  for (int i = 1; i <= 3; i++) {
    snprintf(args, sizeof(args), "stop '%s/s%d'", dir, i);
    redis_tmp(args, NULL, NULL, 0);
  }
  snprintf(args, sizeof(args), "stop '%s/r'", dir);
  redis_tmp(args, NULL, NULL, 0);
  snprintf(args, sizeof(args), "stop '%s/m'", dir);
  redis_tmp(args, NULL, NULL, 0);
  snprintf(args, sizeof(args), "rm -rf '%s'", dir);
  return system(args) == 0 ? 0 : -1;
}

static void test_resolve(void **state) {
  (void)state;
  rm_redis_addr_t a;
  assert_int_equal(rm_redis_resolve(url, 500, &a), 0);
  assert_string_equal(a.host, "127.0.0.1");
  assert_int_equal(a.port, master_port);
  assert_int_equal(strlen(a.run_id), 40);
  /* nobody listens: refused at once, the distinct code */
  double t0 = now_s();
  assert_int_equal(rm_redis_resolve("redis+sentinel://127.0.0.1:1,127.0.0.1:2/t", 500, &a), RM_E_REDIS_NO_MASTER);
  assert_true(now_s() - t0 < 0.5);
  assert_non_null(strstr(rm_prefilter_errmsg(), "127.0.0.1:2"));
  /* a name nobody watches */
  char other[600];
  snprintf(other, sizeof(other), "%.*sother", (int)(strrchr(url, '/') + 1 - url), url);
  assert_int_equal(rm_redis_resolve(other, 500, &a), RM_E_REDIS_NO_MASTER);
  assert_non_null(strstr(rm_prefilter_errmsg(), "does not know"));
}

static void test_failover(void **state) {
  (void)state;
  rm_pf_options_t o = {.command_timeout_ms = 300, .connect_timeout_ms = 300, .max_connections = 4};
  rm_prefilter_t *pf = NULL;
  int bucket = -1;
  assert_int_equal(rm_prefilter_new(url, &o, &pf), 0);
  assert_int_equal(rm_prefilter_freeze(pf, 7, 1, 1, 1, 1, &bucket), RM_PF_NOT_LOADED);
  assert_int_equal(rm_prefilter_master_changes(pf), 0);

  char args[512];
  snprintf(args, sizeof(args), "stop '%s/m' --kill", dir);
  assert_int_equal(redis_tmp(args, NULL, NULL, 0), 0);
  double t0 = now_s(), slowest = 0, back = -1;
  int no_master = 0, calls = 0;
  while (now_s() - t0 < 20) {
    double c0 = now_s();
    int rc = rm_prefilter_freeze(pf, 7, 1, 1, 2 + calls, 1, &bucket);
    double took = now_s() - c0;
    calls++;
    if (took > slowest) slowest = took;
    if (rc == RM_PF_NOT_LOADED) {
      back = now_s() - t0;
      break;
    }
    if (rc == RM_E_REDIS_NO_MASTER) no_master++;
    else if (rc != RM_E_CONN_LOST && rc != RM_E_UNKNOWN_OUTCOME)
      fail_msg("freeze during the failover: %d (%s: %s)", rc, rm_prefilter_strerror(rc), rm_prefilter_errmsg());
    usleep(20000);
  }
  fprintf(stderr, "  failover: back after %.2f s, %d calls (%d RM_E_REDIS_NO_MASTER), slowest %.3f s\n", back,
          calls, no_master, slowest);
  assert_true(back > 0 && back < 10);
  assert_true(no_master > 0);
  /* each call bounded: sentinels asked (3 x (connect + reply)) plus one connect */
  assert_true(slowest < 3 * 0.6 + 0.3 + 0.3);
  assert_int_equal(rm_prefilter_master_changes(pf), 1);
  rm_redis_addr_t a;
  assert_int_equal(rm_redis_resolve(url, 500, &a), 0);
  assert_int_not_equal(a.port, master_port);
  rm_prefilter_free(pf);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_resolve),
    cmocka_unit_test(test_failover),
  };
  if (!getenv("TX_SOURCE_DIR")) {
    fprintf(stderr, "test_sentinel: TX_SOURCE_DIR not set (run through ctest)\n");
    return 77;
  }
  signal(SIGPIPE, SIG_IGN);
  return cmocka_run_group_tests(tests, setup, teardown);
}
