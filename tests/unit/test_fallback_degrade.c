/*
 * test_fallback_degrade.c - fallback-to-local mode without servers:
 * librmclient's degrade detection against a coordinator address nobody
 * listens on, forced modes, the mode names, argument checks of the
 * local-mode helpers and of the compensation job, and the compensator's
 * thread (kicks, waits, stop) with databases that cannot be reached.
 *
 * NOTES
 *   Recovery (back to global mode after answered probes) needs a
 *   coordinator that answers: tests/integration/test_fallback.c covers it
 *   with real tcd processes.  Waits poll with a deadline; nothing sleeps a
 *   fixed time to wait for an event.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "rm_client.h"
#include "rm_itest.h"

/* ------------------------------------------------------------ helpers */

/* A loopback port nobody listens on (bound, then closed: refused). */
static int dead_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  assert_true(fd >= 0);
  struct sockaddr_in sa = {0};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
  socklen_t len = sizeof(sa);
  assert_int_equal(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
  close(fd);
  return ntohs(sa.sin_port);
}

typedef struct logcap {
  pthread_mutex_t mu;
  int n;
  char lines[64][256];
} logcap_t;

static void log_capture(int level, const char *msg, void *arg) {
  logcap_t *l = arg;
  pthread_mutex_lock(&l->mu);
  snprintf(l->lines[l->n % 64], sizeof(l->lines[0]), "%d %s", level, msg);
  l->n++;
  pthread_mutex_unlock(&l->mu);
  if (getenv("RM_TEST_VERBOSE")) fprintf(stderr, "[rm %d] %s\n", level, msg);
}

static bool log_has(logcap_t *l, const char *needle) {
  bool found = false;
  pthread_mutex_lock(&l->mu);
  int first = l->n > 64 ? l->n - 64 : 0;
  for (int i = first; i < l->n && !found; i++) found = strstr(l->lines[i % 64], needle) != NULL;
  pthread_mutex_unlock(&l->mu);
  return found;
}

static rm_client_t *dead_client(logcap_t *lc) {
  char nodes[64];
  snprintf(nodes, sizeof(nodes), "127.0.0.1:%d,127.0.0.1:%d", dead_port(), dead_port());
  rm_config_t cfg = {0};
  cfg.nodes = nodes;
  cfg.token = "t";
  cfg.application_id = "fallback-unit";
  cfg.connect_timeout_ms = 300;
  cfg.request_timeout_ms = 300;
  cfg.log_cb = log_capture;
  cfg.log_arg = lc;
  cfg.log_level = RM_LOG_DEBUG;
  rm_client_t *c = NULL;
  assert_int_equal(rm_client_new(&cfg, &c), 0);
  return c;
}

static void wait_mode(rm_client_t *c, int want, int timeout_ms) {
  double end = now_ms() + timeout_ms;
  while (rm_client_mode(c) != want) {
    if (now_ms() > end) {
      rm_degrade_stats_t st;
      rm_client_degrade_stats(c, &st);
      fail_msg("mode is %s after %d ms, expected %s (probes %llu, failed %llu)", rm_mode_name(rm_client_mode(c)),
               timeout_ms, rm_mode_name(want), (unsigned long long)st.probes,
               (unsigned long long)st.probe_failures);
    }
    sleep_ms(10);
  }
}

/* -------------------------------------------------------------- tests */

static void test_mode_names(void **state) {
  (void)state;
  assert_int_equal(rm_mode_parse(NULL), RM_MODE_AUTO);
  assert_int_equal(rm_mode_parse(""), RM_MODE_AUTO);
  assert_int_equal(rm_mode_parse("auto"), RM_MODE_AUTO);
  assert_int_equal(rm_mode_parse("GLOBAL"), RM_MODE_GLOBAL);
  assert_int_equal(rm_mode_parse("Local"), RM_MODE_LOCAL);
  assert_int_equal(rm_mode_parse("locally"), RM_E_INVALID);
  assert_int_equal(rm_mode_parse(" local"), RM_E_INVALID);
  assert_string_equal(rm_mode_name(RM_MODE_AUTO), "auto");
  assert_string_equal(rm_mode_name(RM_MODE_GLOBAL), "global");
  assert_string_equal(rm_mode_name(RM_MODE_LOCAL), "local");
  assert_string_equal(rm_mode_name(7), "?");
  assert_string_equal(RM_MODE_ENV, "TXC_TX_MODE");
  /* The new codes have words of their own. */
  assert_string_equal(rm_strerror(RM_COMP_E_LOCKED), "another compensation job is running");
  assert_non_null(strstr(rm_prefilter_strerror(RM_LOCAL_E_MISMATCH), "other values"));
  assert_non_null(strstr(rm_strerror(RM_LOCAL_E_PAID), "paid"));
  assert_non_null(strstr(rm_strerror(RM_LOCAL_E_DECIDED), "other outcome"));
}

static void test_args(void **state) {
  (void)state;
  logcap_t lc = {.mu = PTHREAD_MUTEX_INITIALIZER};
  rm_client_t *c = dead_client(&lc);
  rm_degrade_opts_t o = {0};
  assert_int_equal(rm_client_degrade_enable(NULL, NULL), RM_E_INVALID);
  o.fail_threshold = 1001;
  assert_int_equal(rm_client_degrade_enable(c, &o), RM_E_INVALID);
  o.fail_threshold = 0;
  o.probe_interval_ms = 3600001;
  assert_int_equal(rm_client_degrade_enable(c, &o), RM_E_INVALID);
  assert_int_equal(rm_client_force_mode(c, 3), RM_E_INVALID);
  assert_int_equal(rm_client_force_mode(NULL, RM_MODE_LOCAL), RM_E_INVALID);
  assert_int_equal(rm_client_mode(NULL), RM_MODE_GLOBAL);

  /* Not enabled: global whatever happens, and nothing probes. */
  rm_degrade_stats_t st;
  sleep_ms(200);
  rm_client_degrade_stats(c, &st);
  assert_false(st.enabled);
  assert_int_equal(st.mode, RM_MODE_GLOBAL);
  assert_int_equal(st.probes, 0);

  /* Local mode's counters are the client's: a refused call counts
   * nothing, and no client means all zero. */
  rm_local_order_t lo = {1, 1, 0, 0, 1, 1, 0, 0, NULL};
  assert_int_equal(rm_local_order_insert(c, NULL, &lo), RM_E_INVALID);
  assert_int_equal(rm_local_stock_freeze(c, NULL, &lo), RM_E_INVALID);
  rm_local_stats_t ls;
  memset(&ls, 0xff, sizeof(ls));
  rm_client_local_stats(c, &ls);
  assert_true(ls.orders == 0 && ls.frozen == 0 && ls.refused == 0 && ls.finished == 0 && ls.cancelled == 0);
  memset(&ls, 0xff, sizeof(ls));
  rm_client_local_stats(NULL, &ls);
  assert_true(ls.orders == 0 && ls.frozen == 0 && ls.refused == 0 && ls.finished == 0 && ls.cancelled == 0);
  rm_client_local_stats(c, NULL);
  rm_client_free(c);

  /* Local helpers and the job refuse bad arguments before any I/O. */
  assert_int_equal(rm_local_order_insert(NULL, NULL, &lo), RM_E_INVALID);
  assert_int_equal(rm_local_stock_freeze(NULL, NULL, &lo), RM_E_INVALID);
  assert_int_equal(rm_local_order_finish(NULL, NULL, 1), RM_E_INVALID);
  assert_int_equal(rm_local_order_cancel(NULL, NULL, NULL, 1, RM_PF_SOLD_OUT), RM_E_INVALID);
  assert_true(strlen(rm_local_errmsg()) > 0);
  rm_comp_report_t rep;
  rm_comp_options_t co = {0};
  co.reconcile = true; /* without a prefilter */
  assert_int_equal(rm_compensate_run("dbname=x", "dbname=y", NULL, &co, &rep), RM_E_INVALID);
  assert_int_equal(rm_compensate_run(NULL, "dbname=y", NULL, NULL, &rep), RM_E_INVALID);
  rm_compensator_t *k = NULL;
  rm_compensator_options_t ko = {0};
  assert_int_equal(rm_compensator_start(&ko, &k), RM_E_INVALID);
  assert_null(k);
  rm_compensator_stop(NULL);
  rm_compensator_kick(NULL, true);
}

/* Every node refuses connections: local mode after 'fail_threshold'
 * failed probes, logged and counted once; a call failing with
 * RM_E_NO_NODE meanwhile is what services see. */
static void test_degrade_to_local(void **state) {
  (void)state;
  logcap_t lc = {.mu = PTHREAD_MUTEX_INITIALIZER};
  rm_client_t *c = dead_client(&lc);
  rm_degrade_opts_t o = {0};
  o.fail_threshold = 3;
  o.recover_threshold = 2;
  o.probe_interval_ms = 50;
  o.probe_timeout_ms = 200;
  double t0 = now_ms();
  assert_int_equal(rm_client_degrade_enable(c, &o), 0);
  assert_int_equal(rm_client_mode(c), RM_MODE_GLOBAL);
  wait_mode(c, RM_MODE_LOCAL, 5000);
  double took = now_ms() - t0;
  /* The first probe, made while the client still makes its first
   * connections (the connect timeout, 300 ms, from its start), waits for a
   * node up to its 200 ms; once that grace is over, a probe with no node
   * registered fails at once (rm_degrade.c). */
  assert_true(took >= 200 - 20);
  rm_degrade_stats_t st;
  rm_client_degrade_stats(c, &st);
  assert_true(st.enabled);
  assert_int_equal(st.mode, RM_MODE_LOCAL);
  assert_int_equal(st.detected, RM_MODE_LOCAL);
  assert_int_equal(st.forced, RM_MODE_AUTO);
  assert_int_equal(st.to_local, 1);
  assert_int_equal(st.to_global, 0);
  assert_true(st.probes >= 3);
  assert_int_equal(st.probes, st.probe_failures);
  assert_true(st.fail_streak >= 3);
  assert_int_equal(st.ok_streak, 0);
  assert_true(log_has(&lc, "switched from global to local mode"));
  assert_true(log_has(&lc, "no coordinator answered 3 consecutive probes"));

  /* Probing goes on in local mode, and the mode stays. */
  sleep_ms(400);
  rm_client_degrade_stats(c, &st);
  assert_true(st.probes >= 4);
  assert_int_equal(st.to_local, 1);
  assert_int_equal(rm_client_mode(c), RM_MODE_LOCAL);

  /* A TM call still behaves as before: no node. */
  char xid[RM_XID_MAX];
  assert_int_equal(rm_tm_begin(c, 0, NULL, xid), RM_E_NO_NODE);
  rm_client_free(c);
}

/* Forcing overrides detection both ways; AUTO gives it back. */
static void test_forced_modes(void **state) {
  (void)state;
  logcap_t lc = {.mu = PTHREAD_MUTEX_INITIALIZER};
  rm_client_t *c = dead_client(&lc);
  /* Forcing works without detection. */
  assert_int_equal(rm_client_force_mode(c, RM_MODE_LOCAL), 0);
  assert_int_equal(rm_client_mode(c), RM_MODE_LOCAL);
  assert_true(log_has(&lc, "forced to local"));
  assert_int_equal(rm_client_force_mode(c, RM_MODE_AUTO), 0);
  assert_int_equal(rm_client_mode(c), RM_MODE_GLOBAL);

  /* Forced global while every node is down: detection says local, the
   * mode stays global; ending the force switches at once. */
  assert_int_equal(rm_client_force_mode(c, RM_MODE_GLOBAL), 0);
  rm_degrade_opts_t o = {3, 2, 30, 100};
  assert_int_equal(rm_client_degrade_enable(c, &o), 0);
  assert_int_equal(WAIT_EQ(RM_MODE_LOCAL, 5, degrade_detected(c)), RM_MODE_LOCAL);
  rm_degrade_stats_t st;
  rm_client_degrade_stats(c, &st);
  assert_int_equal(rm_client_mode(c), RM_MODE_GLOBAL);
  assert_int_equal(st.forced, RM_MODE_GLOBAL);
  assert_int_equal(rm_client_force_mode(c, RM_MODE_AUTO), 0);
  assert_int_equal(rm_client_mode(c), RM_MODE_LOCAL);
  rm_client_degrade_stats(c, &st);
  /* local (forced), global (auto), local (auto again) */
  assert_int_equal(st.to_local, 2);
  assert_int_equal(st.to_global, 1);
  assert_true(log_has(&lc, "left to detection"));

  /* Retuning while running keeps the mode. */
  o.fail_threshold = 1;
  assert_int_equal(rm_client_degrade_enable(c, &o), 0);
  sleep_ms(100);
  assert_int_equal(rm_client_mode(c), RM_MODE_LOCAL);
  rm_client_free(c);
}

/* A blocking call that ends with RM_E_NO_NODE starts a probe at once: with
 * a long interval, only such calls can make the probes come quickly. */
static void test_no_node_probes_at_once(void **state) {
  (void)state;
  logcap_t lc = {.mu = PTHREAD_MUTEX_INITIALIZER};
  rm_client_t *c = dead_client(&lc);
  rm_degrade_opts_t o = {2, 2, 60000, 100};
  assert_int_equal(rm_client_degrade_enable(c, &o), 0);
  double end = now_ms() + 5000;
  rm_degrade_stats_t st;
  do { /* the first probe runs at once */
    sleep_ms(10);
    rm_client_degrade_stats(c, &st);
    assert_true(now_ms() < end);
  } while (st.probes < 1);
  assert_int_equal(rm_client_mode(c), RM_MODE_GLOBAL);
  char xid[RM_XID_MAX];
  assert_int_equal(rm_tm_begin(c, 0, NULL, xid), RM_E_NO_NODE);
  wait_mode(c, RM_MODE_LOCAL, 3000);
  rm_client_degrade_stats(c, &st);
  assert_int_equal(st.probes, 2);
  rm_client_free(c);
}

/* The compensator's thread with databases nobody serves: every pass fails
 * with RM_E_DB, run_now reports it, kicks and stop do not hang. */
static void test_compensator_unreachable(void **state) {
  (void)state;
  logcap_t lc = {.mu = PTHREAD_MUTEX_INITIALIZER};
  char ci[128];
  snprintf(ci, sizeof(ci), "host=127.0.0.1 port=%d dbname=none connect_timeout=2", dead_port());
  rm_compensator_options_t ko = {0};
  ko.orders_conninfo = ci;
  ko.stock_conninfo = ci;
  ko.interval_ms = 50;
  ko.run.log_cb = log_capture;
  ko.run.log_arg = &lc;
  rm_compensator_t *k = NULL;
  assert_int_equal(rm_compensator_start(&ko, &k), 0);
  rm_comp_report_t rep;
  assert_int_equal(rm_compensator_run_now(k, false, 10000, &rep), RM_E_DB);
  assert_int_equal(rm_compensator_run_now(k, true, 10000, &rep), RM_E_DB); /* no prefilter: no reconcile */
  rm_compensator_kick(k, false);
  rm_compensator_stats_t st;
  double end = now_ms() + 5000;
  do {
    sleep_ms(10);
    rm_compensator_stats(k, &st);
    assert_true(now_ms() < end);
  } while (st.errors < 4);
  assert_int_equal(st.passes, 0);
  assert_int_equal(st.last_code, RM_E_DB);
  assert_true(log_has(&lc, "could not connect to the orders database"));
  rm_compensator_stop(k);
  /* The job alone: the same. */
  assert_int_equal(rm_compensate_run(ci, ci, NULL, NULL, &rep), RM_E_DB);
  assert_non_null(strstr(rm_local_errmsg(), "could not connect"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_mode_names),
    cmocka_unit_test(test_args),
    cmocka_unit_test(test_degrade_to_local),
    cmocka_unit_test(test_forced_modes),
    cmocka_unit_test(test_no_node_probes_at_once),
    cmocka_unit_test(test_compensator_unreachable),
  };
  return cmocka_run_group_tests_name("fallback_degrade", tests, NULL, NULL);
}
