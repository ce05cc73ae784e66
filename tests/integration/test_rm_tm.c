/*
 * test_rm_tm.c - librmclient's core against real tcd processes: the TM API
 * (blocking and callback forms), many threads on one client, deadlines and
 * unknown outcomes, a two-node cluster losing a node, reconnection after a
 * restart, rm_client_free() with calls in flight, branch registration with
 * a lock wait, phase two through the AT layer, and a library that prints
 * nothing.
 *
 * NOTES
 *   Servers: PostgreSQL comes from scripts/with-servers --pg (TC_PG_URL,
 *   ORDERS_PG_URL); every test starts its own tcd processes from
 *   $TX_BIN_DIR/tcd on free loopback ports, with a fresh node id each, their
 *   output in log files (so that the library's silence can be checked on
 *   this process's stdout/stderr).  tcd children get PR_SET_PDEATHSIG so
 *   that a crashed test does not leave them behind, and every test's
 *   teardown kills whatever it started, also after a failed assertion.
 *   Without TC_PG_URL every test is skipped.
 *
 *   Faults are real: SIGSTOP (a node that hangs: requests sent and never
 *   answered), SIGKILL (a node that dies: the kernel resets its
 *   connections), a restart on the same port.
 *
 *   Waiting: for states (nodes registered, a status reached) the tests poll
 *   with a deadline; the two fixed delays (letting a lock waiter queue
 *   before the holder commits; letting blocked threads enter their calls
 *   before rm_client_free) are margins, and the assertions do not depend on
 *   their exact length.
 *
 *   Worker threads never call cmocka's assertions: they record results
 *   that the main thread checks after joining them.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <libpq-fe.h>

#include "rm_client.h"
#include "rm_at_int.h"
#include "rm_internal.h"
#include "rm_itest.h"
#include "tcd_proc.h"
#include "txp_status.h"

#define TOKEN "rm-tm-test-token"
#define MAX_TCD 8
#define START_TIMEOUT_MS 30000

/* ------------------------------------------------------------ helpers */

/* A port nobody listens on right now (the kernel's choice). */
static int free_port(void) {
  int port = tcd_proc_free_port();
  assert_true(port > 0);
  return port;
}

/* ---- tcd processes ---- */

static tcd_proc_t tcds[MAX_TCD];
static int next_node_id = 1;

static const char *pg_url(void) { return getenv("TC_PG_URL"); }

static void skip_without_servers(void) {
  if (!pg_url() || !getenv("TX_BIN_DIR")) skip();
}

/* Start tcd on 'port' (0: a free one) with a new node id, its output in a
 * log file; returns when it accepts connections (it listens only once its
 * store is ready). */
/* A node with more settings ("TC_X_Y=value", NULL-terminated; may be NULL). */
static tcd_proc_t *tcd_start_with(int port, const char *token, const char *const *env) {
  tcd_proc_t *t = NULL;
  for (int i = 0; i < MAX_TCD; i++)
    if (tcds[i].pid == 0) {
      t = &tcds[i];
      break;
    }
  assert_non_null(t);
  int node_id = next_node_id++;
  const char *dir = getenv("TX_SERVERS_DIR");
  char log[512];
  snprintf(log, sizeof(log), "%s/rm-tm-tcd-%d.log", dir ? dir : "/tmp", node_id);
  tcd_opts_t o = {.pg_url = pg_url(), .token = token, .node_id = node_id, .log_level = "warn", .port = port,
                  .log = log, .timeout_ms = START_TIMEOUT_MS, .env = env};
  if (tcd_proc_start(t, &o) != 0) {
    tcd_proc_print_log(t, stdout);
    fail_msg("%s", t->err);
  }
  return t;
}

static tcd_proc_t *tcd_start(int port, const char *token) { return tcd_start_with(port, token, NULL); }

static void tcd_signal(tcd_proc_t *t, int sig) {
  assert_true(t->pid > 0);
  assert_int_equal(tcd_proc_signal(t, sig), 0);
}

static void tcd_kill_all(void) {
  for (int i = 0; i < MAX_TCD; i++) tcd_proc_kill(&tcds[i]);
}

static int teardown_tcds(void **state) {
  (void)state;
  tcd_kill_all();
  return 0;
}

/* ---- log capture ---- */

#define CAP_LINES 512

typedef struct logcap {
  pthread_mutex_t mu;
  int by_level[5];
  int n;
  char lines[CAP_LINES][256];
} logcap_t;

static void logcap_init(logcap_t *l) {
  memset(l, 0, sizeof(*l));
  pthread_mutex_init(&l->mu, NULL);
}

static void log_capture(int level, const char *msg, void *arg) {
  logcap_t *l = arg;
  pthread_mutex_lock(&l->mu);
  if (level >= 0 && level < 5) l->by_level[level]++;
  snprintf(l->lines[l->n % CAP_LINES], sizeof(l->lines[0]), "%d %s", level, msg);
  l->n++;
  pthread_mutex_unlock(&l->mu);
  if (getenv("RM_TEST_VERBOSE")) fprintf(stderr, "[rm %d] %s\n", level, msg);
}

static bool log_has(logcap_t *l, int level, const char *needle) {
  bool found = false;
  pthread_mutex_lock(&l->mu);
  int first = l->n > CAP_LINES ? l->n - CAP_LINES : 0;
  for (int i = first; i < l->n && !found; i++) {
    const char *line = l->lines[i % CAP_LINES];
    if ((level < 0 || line[0] - '0' == level) && strstr(line, needle)) found = true;
  }
  pthread_mutex_unlock(&l->mu);
  return found;
}

/* ---- clients ---- */

static void nodes_of(char *out, size_t cap, const tcd_proc_t *a, const tcd_proc_t *b) {
  if (b) snprintf(out, cap, "127.0.0.1:%d,127.0.0.1:%d", a->port, b->port);
  else snprintf(out, cap, "127.0.0.1:%d", a->port);
}

/* How most tests begin: the servers (or a skip), one tcd, and the node
 * list a client of it is given. */
static tcd_proc_t *start_single_node(char *nodes, size_t cap) {
  skip_without_servers();
  tcd_proc_t *t = tcd_start(0, TOKEN);
  nodes_of(nodes, cap, t, NULL);
  return t;
}

static rm_client_t *client_new_choice(const char *nodes, const char *token, const char *app,
                                      unsigned request_timeout_ms, logcap_t *lc, int node_choice) {
  rm_config_t cfg = {0};
  cfg.node_choice = node_choice;
  cfg.nodes = nodes;
  cfg.token = token;
  cfg.application_id = app;
  cfg.request_timeout_ms = request_timeout_ms;
  cfg.connect_timeout_ms = 2000;
  if (lc) {
    cfg.log_cb = log_capture;
    cfg.log_arg = lc;
    cfg.log_level = RM_LOG_DEBUG;
  }
  rm_client_t *c = NULL;
  assert_int_equal(rm_client_new(&cfg, &c), RM_OK);
  assert_non_null(c);
  return c;
}

static rm_client_t *client_new(const char *nodes, const char *token, const char *app,
                               unsigned request_timeout_ms, logcap_t *lc) {
  return client_new_choice(nodes, token, app, request_timeout_ms, lc, RM_NODE_HOME);
}

/* Poll the status of 'xid' until it is 'want'. */
static void wait_status(rm_client_t *c, const char *xid, int want, int timeout_ms) {
  double deadline = now_ms() + timeout_ms;
  int st = 0, rc;
  for (;;) {
    rc = rm_tm_status(c, xid, &st);
    if (rc == RM_OK && st == want) return;
    if (now_ms() > deadline)
      fail_msg("status of \"%s\" is %s (rc %d: %s), expected %s", xid, rm_global_status_name(st), rc,
               rm_strerror(rc), rm_global_status_name(want));
    sleep_ms(50);
  }
}

static long long sql_count(const char *url, const char *sql, const char *param) {
  PGconn *pg = PQconnectdb(url);
  if (PQstatus(pg) != CONNECTION_OK) fail_msg("could not connect to %s: %s", url, PQerrorMessage(pg));
  const char *v[1] = {param};
  PGresult *r = PQexecParams(pg, sql, param ? 1 : 0, NULL, v, NULL, NULL, 0);
  if (PQresultStatus(r) != PGRES_TUPLES_OK) fail_msg("query failed: %s", PQerrorMessage(pg));
  long long n = atoll(PQgetvalue(r, 0, 0));
  PQclear(r);
  PQfinish(pg);
  return n;
}

/* Globals ever created by application 'app' (live or finished). */
static long long globals_of(const char *app) {
  return sql_count(pg_url(),
                   "SELECT (SELECT count(*) FROM global_table WHERE application_id = $1) + "
                   "(SELECT count(*) FROM global_history WHERE application_id = $1)",
                   app);
}

/* ---- async completions ---- */

typedef struct waiter {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int calls;
  int code;
  int status;
  char xid[RM_XID_MAX];
  pthread_t thread;
} waiter_t;

static void waiter_init(waiter_t *w) {
  memset(w, 0, sizeof(*w));
  pthread_mutex_init(&w->mu, NULL);
  pthread_cond_init(&w->cv, NULL);
}

static void on_tm(int code, const char *xid, int status, void *arg) {
  waiter_t *w = arg;
  pthread_mutex_lock(&w->mu);
  w->calls++;
  w->code = code;
  w->status = status;
  snprintf(w->xid, sizeof(w->xid), "%s", xid ? xid : "");
  w->thread = pthread_self();
  pthread_cond_broadcast(&w->cv);
  pthread_mutex_unlock(&w->mu);
}

/* Wait until 'w' was called 'n' times in all. */
static void waiter_wait(waiter_t *w, int n, int timeout_ms) {
  double deadline = now_ms() + timeout_ms;
  pthread_mutex_lock(&w->mu);
  while (w->calls < n) {
    if (now_ms() > deadline) {
      int calls = w->calls;
      pthread_mutex_unlock(&w->mu);
      fail_msg("callback ran %d time(s) within %d ms, expected %d", calls, timeout_ms, n);
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 10 * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
      ts.tv_sec++;
      ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&w->cv, &w->mu, &ts);
  }
  pthread_mutex_unlock(&w->mu);
}

/* ---------------------------------------------------------------- tests */

static void test_strerror_and_args(void **state) {
  (void)state;
  static const int codes[] = {
    RM_E_INVALID, RM_E_NOMEM, RM_E_BAD_REQUEST, RM_E_AUTH, RM_E_GLOBAL_NOT_FOUND,
    RM_E_GLOBAL_NOT_ACTIVE, RM_E_LOCK_CONFLICT, RM_E_LOCK_WAIT_TIMEOUT,
    RM_E_LOCK_HOLDER_ROLLBACKING, RM_E_TIMED_OUT, RM_E_STORE, RM_E_BUSY, RM_E_DIRTY_WRITE,
    RM_E_UNKNOWN_OUTCOME, RM_E_DEADLINE, RM_E_NO_NODE, RM_E_CONN_LOST, RM_E_NOT_SUPPORTED,
    RM_E_DB, RM_E_NO_TABLE, RM_E_NO_PK, RM_E_NOT_ONE_ROW, RM_E_GUARD, RM_E_STATE,
  };
  for (size_t i = 0; i < sizeof(codes) / sizeof(codes[0]); i++) {
    const char *s = rm_strerror(codes[i]);
    assert_non_null(s);
    if (strcmp(s, "unknown error") == 0 || strcmp(s, "system error") == 0)
      fail_msg("rm_strerror(%d) has no description", codes[i]);
    for (size_t j = 0; j < i; j++)
      if (strcmp(s, rm_strerror(codes[j])) == 0) fail_msg("codes %d and %d share \"%s\"", codes[i], codes[j], s);
  }
  assert_string_equal(rm_strerror(0), "success");
  assert_string_equal(rm_strerror(-10110), "branch not found"); /* protocol codes pass through */
  assert_string_equal(rm_strerror(-99999), "unknown error");
  assert_string_equal(rm_global_status_name(RM_GS_COMMITTED), "Committed");
  assert_string_equal(rm_global_status_name(RM_GS_TIMEOUT_ROLLBACKED), "TimeoutRollbacked");

  /* Configuration errors are refused before anything starts. */
  rm_client_t *c = (rm_client_t *)(uintptr_t)1;
  rm_config_t cfg = {0};
  assert_int_equal(rm_client_new(&cfg, &c), RM_E_INVALID);
  assert_null(c);
  cfg.nodes = "127.0.0.1:1";
  cfg.token = "t";
  assert_int_equal(rm_client_new(&cfg, &c), RM_E_INVALID); /* no application id */
  cfg.application_id = "app";
  cfg.nodes = "127.0.0.1";
  assert_int_equal(rm_client_new(&cfg, &c), RM_E_INVALID);
  cfg.nodes = "127.0.0.1:1,,127.0.0.1:2";
  assert_int_equal(rm_client_new(&cfg, &c), RM_E_INVALID);
  cfg.nodes = "127.0.0.1:1";
  cfg.log_level = 9;
  assert_int_equal(rm_client_new(&cfg, &c), RM_E_INVALID);
  cfg.log_level = 0;
  cfg.node_choice = 2; /* neither RM_NODE_HOME nor RM_NODE_ROUND_ROBIN */
  assert_int_equal(rm_client_new(&cfg, &c), RM_E_INVALID);
  assert_int_equal(rm_client_new(NULL, &c), RM_E_INVALID);
  rm_client_free(NULL);
  assert_int_equal(rm_client_nodes_up(NULL), 0);
}

static void test_round_trips(void **state) {
  (void)state;
  char nodes[128];
  tcd_proc_t *t = start_single_node(nodes, sizeof(nodes));
  char xid[RM_XID_MAX], xid2[RM_XID_MAX], prefix[64];
  logcap_t lc;
  logcap_init(&lc);
  rm_client_t *c = client_new(nodes, TOKEN, "rm-tm-round", 0, &lc);

  /* The first call does not wait for rm_client_new to connect: it waits
   * for the node itself. */
  int st = -1;
  assert_int_equal(rm_tm_begin(c, 30000, "round-trip", xid), RM_OK);
  snprintf(prefix, sizeof(prefix), "127.0.0.1:%d:", t->port);
  assert_true(strncmp(xid, prefix, strlen(prefix)) == 0);
  assert_int_equal(rm_client_nodes_up(c), 1);
  assert_int_equal(rm_tm_status(c, xid, &st), RM_OK);
  assert_int_equal(st, RM_GS_BEGIN);
  assert_int_equal(rm_tm_commit(c, xid, &st), RM_OK);
  assert_int_equal(st, RM_GS_COMMITTED);
  wait_status(c, xid, RM_GS_COMMITTED, 5000);
  /* Committing again is idempotent; rolling back now is refused. */
  assert_int_equal(rm_tm_commit(c, xid, &st), RM_OK);
  assert_int_equal(st, RM_GS_COMMITTED);
  assert_int_equal(rm_tm_rollback(c, xid, &st), RM_E_GLOBAL_NOT_ACTIVE);
  assert_int_equal(st, RM_GS_COMMITTED);

  assert_int_equal(rm_tm_begin(c, 0, NULL, xid2), RM_OK);
  assert_string_not_equal(xid, xid2);
  assert_int_equal(rm_tm_rollback(c, xid2, &st), RM_OK);
  assert_int_equal(st, RM_GS_ROLLBACKED);
  assert_int_equal(rm_tm_commit(c, xid2, &st), RM_E_GLOBAL_NOT_ACTIVE);
  assert_int_equal(st, RM_GS_ROLLBACKED);

  /* Errors of the coordinator pass through. */
  char unknown[128];
  snprintf(unknown, sizeof(unknown), "127.0.0.1:%d:1", t->port);
  assert_int_equal(rm_tm_status(c, unknown, &st), RM_E_GLOBAL_NOT_FOUND);
  assert_int_equal(rm_tm_commit(c, "not-an-xid", &st), RM_E_GLOBAL_NOT_FOUND);
  /* A begin whose timeout the coordinator refuses. */
  assert_int_equal(rm_tm_begin(c, 999999999, NULL, xid2), RM_E_BAD_REQUEST);
  assert_string_equal(xid2, "");

  /* Bad arguments never reach the network. */
  char longxid[300];
  memset(longxid, 'x', sizeof(longxid) - 1);
  longxid[sizeof(longxid) - 1] = '\0';
  assert_int_equal(rm_tm_commit(c, NULL, &st), RM_E_INVALID);
  assert_int_equal(rm_tm_commit(c, "", &st), RM_E_INVALID);
  assert_int_equal(rm_tm_status(c, longxid, &st), RM_E_INVALID);
  assert_int_equal(rm_tm_begin(c, 0, longxid, xid2), RM_E_INVALID);
  assert_int_equal(rm_tm_begin(c, 0, NULL, NULL), RM_E_INVALID);
  assert_int_equal(rm_tm_begin(NULL, 0, NULL, xid2), RM_E_INVALID);
  assert_int_equal(rm_tm_commit_async(c, xid, NULL, NULL), RM_E_INVALID);

  /* Callback forms: each callback once, on the library's thread. */
  waiter_t w;
  waiter_init(&w);
  assert_int_equal(rm_tm_begin_async(c, 0, "async", on_tm, &w), RM_OK);
  waiter_wait(&w, 1, 10000);
  assert_int_equal(w.code, RM_OK);
  assert_true(strncmp(w.xid, prefix, strlen(prefix)) == 0);
  assert_false(pthread_equal(w.thread, pthread_self()));
  char axid[RM_XID_MAX];
  snprintf(axid, sizeof(axid), "%s", w.xid);
  assert_int_equal(rm_tm_status_async(c, axid, on_tm, &w), RM_OK);
  waiter_wait(&w, 2, 10000);
  assert_int_equal(w.code, RM_OK);
  assert_int_equal(w.status, RM_GS_BEGIN);
  assert_string_equal(w.xid, axid);
  assert_int_equal(rm_tm_commit_async(c, axid, on_tm, &w), RM_OK);
  waiter_wait(&w, 3, 10000);
  assert_int_equal(w.code, RM_OK);
  assert_int_equal(w.status, RM_GS_COMMITTED);
  assert_int_equal(rm_tm_begin_async(c, 0, NULL, on_tm, &w), RM_OK);
  waiter_wait(&w, 4, 10000);
  assert_int_equal(w.code, RM_OK);
  snprintf(axid, sizeof(axid), "%s", w.xid);
  assert_int_equal(rm_tm_rollback_async(c, axid, on_tm, &w), RM_OK);
  waiter_wait(&w, 5, 10000);
  assert_int_equal(w.code, RM_OK);
  assert_int_equal(w.status, RM_GS_ROLLBACKED);
  assert_int_equal(rm_tm_status_async(c, unknown, on_tm, &w), RM_OK);
  waiter_wait(&w, 6, 10000);
  assert_int_equal(w.code, RM_E_GLOBAL_NOT_FOUND);
  sleep_ms(50);
  assert_int_equal(w.calls, 6); /* exactly once each */

  rm_client_free(c);
  assert_true(log_has(&lc, RM_LOG_INFO, "connected to coordinator"));
  assert_int_equal(lc.by_level[RM_LOG_ERROR], 0);
}

/* ---- 32 threads x 50 transactions on one client ---- */

#define NTHREADS 32
#define NTX 50

typedef struct mt_ctx {
  rm_client_t *c;
  atomic_int begun;
  atomic_int failures;
  atomic_int first_rc;
  char first_what[128];
} mt_ctx_t;

static void mt_fail(mt_ctx_t *m, const char *what, int rc) {
  int zero = 0;
  if (atomic_compare_exchange_strong(&m->first_rc, &zero, rc))
    snprintf(m->first_what, sizeof(m->first_what), "%s", what);
  atomic_fetch_add(&m->failures, 1);
}

static void *mt_worker(void *arg) {
  mt_ctx_t *m = arg;
  char xid[RM_XID_MAX], name[32];
  for (int i = 0; i < NTX; i++) {
    int st = 0;
    snprintf(name, sizeof(name), "mt-%d", i);
    int rc = rm_tm_begin(m->c, 0, name, xid);
    if (rc != RM_OK) {
      mt_fail(m, "begin", rc);
      continue;
    }
    atomic_fetch_add(&m->begun, 1);
    if (i % 5 == 0) {
      rc = rm_tm_status(m->c, xid, &st);
      if (rc != RM_OK || st != RM_GS_BEGIN) mt_fail(m, "status", rc ? rc : -1);
    }
    if (i % 2) {
      rc = rm_tm_commit(m->c, xid, &st);
      if (rc != RM_OK || st != RM_GS_COMMITTED) mt_fail(m, "commit", rc ? rc : -1);
    } else {
      rc = rm_tm_rollback(m->c, xid, &st);
      if (rc != RM_OK || st != RM_GS_ROLLBACKED) mt_fail(m, "rollback", rc ? rc : -1);
    }
  }
  return NULL;
}

static void test_many_threads(void **state) {
  (void)state;
  char nodes[128];
  start_single_node(nodes, sizeof(nodes));
  mt_ctx_t m;
  memset(&m, 0, sizeof(m));
  m.c = client_new(nodes, TOKEN, "rm-tm-threads", 10000, NULL);
  pthread_t th[NTHREADS];
  double t0 = now_ms();
  for (int i = 0; i < NTHREADS; i++) assert_int_equal(pthread_create(&th[i], NULL, mt_worker, &m), 0);
  for (int i = 0; i < NTHREADS; i++) pthread_join(th[i], NULL);
  double elapsed = now_ms() - t0;
  rm_client_free(m.c);
  if (atomic_load(&m.failures))
    fail_msg("%d failures; first: %s -> %d (%s)", atomic_load(&m.failures), m.first_what,
             atomic_load(&m.first_rc), rm_strerror(atomic_load(&m.first_rc)));
  assert_int_equal(atomic_load(&m.begun), NTHREADS * NTX);
  /* One global per begin: no call was sent twice in a way that doubled it. */
  assert_int_equal(globals_of("rm-tm-threads"), NTHREADS * NTX);
  print_message("%d transactions from %d threads in %.0f ms\n", NTHREADS * NTX, NTHREADS, elapsed);
}

/* ---- wrong token, no node ---- */

static void test_wrong_token(void **state) {
  (void)state;
  char nodes[128];
  start_single_node(nodes, sizeof(nodes));
  char xid[RM_XID_MAX];
  logcap_t lc;
  logcap_init(&lc);
  rm_client_t *c = client_new(nodes, "not-the-token", "rm-tm-auth", 5000, &lc);
  double t0 = now_ms();
  assert_int_equal(rm_tm_begin(c, 0, NULL, xid), RM_E_AUTH);
  double elapsed = now_ms() - t0;
  assert_true(elapsed < 3000); /* surfaced when refused, not at the deadline */
  assert_true(log_has(&lc, RM_LOG_ERROR, "authentication failed"));
  /* Later calls fail at once while every node refuses us. */
  waiter_t w;
  waiter_init(&w);
  t0 = now_ms();
  assert_int_equal(rm_tm_begin_async(c, 0, NULL, on_tm, &w), RM_OK);
  waiter_wait(&w, 1, 3000);
  assert_int_equal(w.code, RM_E_AUTH);
  assert_int_equal(rm_tm_status(c, "127.0.0.1:1:1", NULL), RM_E_AUTH);
  assert_true(now_ms() - t0 < 1000);
  assert_int_equal(rm_client_nodes_up(c), 0);
  rm_client_free(c);
}

static void test_no_node(void **state) {
  (void)state;
  char nodes[64], xid[RM_XID_MAX];
  int st = -1;
  int port = free_port(); /* nothing listens there */
  snprintf(nodes, sizeof(nodes), "127.0.0.1:%d", port);
  logcap_t lc;
  logcap_init(&lc);
  rm_client_t *c = client_new(nodes, TOKEN, "rm-tm-nonode", 400, &lc);
  double t0 = now_ms();
  assert_int_equal(rm_tm_begin(c, 0, NULL, xid), RM_E_NO_NODE);
  double e = now_ms() - t0;
  assert_true(e >= 350 && e < 1500);
  snprintf(xid, sizeof(xid), "127.0.0.1:%d:42", port);
  t0 = now_ms();
  assert_int_equal(rm_tm_commit(c, xid, &st), RM_E_NO_NODE);
  assert_int_equal(st, 0);
  e = now_ms() - t0;
  assert_true(e >= 350 && e < 1500);
  waiter_t w;
  waiter_init(&w);
  assert_int_equal(rm_tm_status_async(c, xid, on_tm, &w), RM_OK);
  waiter_wait(&w, 1, 3000);
  assert_int_equal(w.code, RM_E_NO_NODE);
  assert_int_equal(rm_client_nodes_up(c), 0);
  rm_client_free(c);
  assert_true(log_has(&lc, RM_LOG_WARN, "could not connect to coordinator"));

  /* A name that does not resolve is just another unreachable node. */
  c = client_new("no-such-host.invalid:8091", TOKEN, "rm-tm-nonode", 300, NULL);
  assert_int_equal(rm_tm_begin(c, 0, NULL, xid), RM_E_NO_NODE);
  rm_client_free(c);
}

/* ---- a node that hangs ---- */

static void test_hung_node_unknown_outcome(void **state) {
  (void)state;
  char nodes[128];
  tcd_proc_t *t = start_single_node(nodes, sizeof(nodes));
  char xid[RM_XID_MAX], xid2[RM_XID_MAX];
  int st = -1;
  rm_client_t *c = client_new(nodes, TOKEN, "rm-tm-hung", 800, NULL);
  assert_int_equal(rm_tm_begin(c, 60000, NULL, xid), RM_OK);

  tcd_signal(t, SIGSTOP);
  double t0 = now_ms();
  assert_int_equal(rm_tm_commit(c, xid, &st), RM_E_UNKNOWN_OUTCOME);
  double e = now_ms() - t0;
  assert_true(e >= 750 && e < 2500);
  assert_int_equal(rm_tm_begin(c, 0, NULL, xid2), RM_E_UNKNOWN_OUTCOME);
  waiter_t w;
  waiter_init(&w);
  assert_int_equal(rm_tm_rollback_async(c, "127.0.0.1:1:1", on_tm, &w), RM_OK);
  waiter_wait(&w, 1, 3000);
  assert_int_equal(w.code, RM_E_UNKNOWN_OUTCOME);
  tcd_signal(t, SIGCONT);

  /* The commit was sent: once the node runs again it happens, and the
   * status resolves the unknown outcome. */
  wait_status(c, xid, RM_GS_COMMITTED, 10000);
  rm_client_free(c);
}

/* ---- two nodes, one dies ---- */

#define LOST_MAX 64

typedef struct load_ctx {
  rm_client_t *c;
  atomic_bool stop;
  atomic_int done;
  atomic_int failures;
  atomic_int first_rc;
  /* Commits answered "not found": begins the killed node had answered and
   * not stored yet (tc/tc_hold.h), checked after the run. */
  pthread_mutex_t mu;
  int nlost;
  char lost[LOST_MAX][RM_XID_MAX];
} load_ctx_t;

static void *load_worker(void *arg) {
  load_ctx_t *l = arg;
  char xid[RM_XID_MAX];
  while (!atomic_load(&l->stop)) {
    int st = 0, rc = rm_tm_begin(l->c, 0, "load", xid);
    if (rc == RM_OK) rc = rm_tm_commit(l->c, xid, &st);
    if (rc == RM_E_GLOBAL_NOT_FOUND) {
      pthread_mutex_lock(&l->mu);
      bool kept = l->nlost < LOST_MAX;
      if (kept) snprintf(l->lost[l->nlost++], RM_XID_MAX, "%s", xid);
      pthread_mutex_unlock(&l->mu);
      if (kept) continue;
    }
    if (rc != RM_OK) {
      int zero = 0;
      atomic_compare_exchange_strong(&l->first_rc, &zero, rc);
      atomic_fetch_add(&l->failures, 1);
    } else {
      atomic_fetch_add(&l->done, 1);
    }
  }
  return NULL;
}

static void wait_counter(atomic_int *n, int want, int timeout_ms) {
  double deadline = now_ms() + timeout_ms;
  while (atomic_load(n) < want) {
    if (now_ms() > deadline) fail_msg("counter at %d after %d ms, expected %d", atomic_load(n), timeout_ms, want);
    sleep_ms(5);
  }
}

/* A begin on 'c' that the node whose xids start with 'prefix' must serve;
 * counted in 'begins' (each makes one global). */
static void begin_served_by(rm_client_t *c, const char *prefix, char *xid, int *begins) {
  assert_int_equal(rm_tm_begin(c, 0, NULL, xid), RM_OK);
  (*begins)++;
  assert_true(strncmp(xid, prefix, strlen(prefix)) == 0);
}

static void test_two_nodes_one_dies(void **state) {
  (void)state;
  skip_without_servers();
  tcd_proc_t *a = tcd_start(0, TOKEN);
  tcd_proc_t *b = tcd_start(0, TOKEN);
  const char *app = "rm-tm-cluster";
  char nodes[128], pa[64], pb[64];
  char xids[10][RM_XID_MAX];
  int from_a = 0, from_b = 0, begins = 0, st;
  logcap_t lc;
  logcap_init(&lc);
  nodes_of(nodes, sizeof(nodes), a, b);
  snprintf(pa, sizeof(pa), "127.0.0.1:%d:", a->port);
  snprintf(pb, sizeof(pb), "127.0.0.1:%d:", b->port);
  rm_client_t *c = client_new_choice(nodes, TOKEN, app, 5000, &lc, RM_NODE_ROUND_ROBIN);
  assert_int_equal(WAIT_EQ(2, 10, rm_client_nodes_up(c)), 2);

  /* Begins go round-robin; each xid names its node. */
  for (int i = 0; i < 10; i++) {
    assert_int_equal(rm_tm_begin(c, 60000, NULL, xids[i]), RM_OK);
    begins++;
    if (strncmp(xids[i], pa, strlen(pa)) == 0) from_a++;
    else if (strncmp(xids[i], pb, strlen(pb)) == 0) from_b++;
  }
  assert_int_equal(from_a, 5);
  assert_int_equal(from_b, 5);

  /* Load from four threads; kill -9 node A in the middle of it. */
  load_ctx_t l;
  memset(&l, 0, sizeof(l));
  pthread_mutex_init(&l.mu, NULL);
  l.c = c;
  pthread_t th[4];
  for (int i = 0; i < 4; i++) assert_int_equal(pthread_create(&th[i], NULL, load_worker, &l), 0);
  wait_counter(&l.done, 40, 30000);
  tcd_proc_kill(a);
  int at_kill = atomic_load(&l.done);
  wait_counter(&l.done, at_kill + 100, 30000);
  atomic_store(&l.stop, true);
  for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
  if (atomic_load(&l.failures))
    fail_msg("%d calls failed across the node's death; first %d (%s)", atomic_load(&l.failures),
             atomic_load(&l.first_rc), rm_strerror(atomic_load(&l.first_rc)));
  /* The only failures allowed: a begin node A answered and held when it
   * died (tc/tc_hold.h).  Each names A, and the store has no trace of it:
   * nothing was changed under it. */
  for (int i = 0; i < l.nlost; i++) {
    if (strncmp(l.lost[i], pa, strlen(pa)) != 0) fail_msg("commit of %s: not found, yet not begun on node A", l.lost[i]);
    assert_int_equal(sql_count(pg_url(),
                               "SELECT (SELECT count(*) FROM global_table WHERE xid = $1) + "
                               "(SELECT count(*) FROM global_history WHERE xid = $1)",
                               l.lost[i]),
                     0);
  }
  if (l.nlost) print_message("%d begins held by node A were lost with it\n", l.nlost);
  pthread_mutex_destroy(&l.mu);
  begins += atomic_load(&l.done);
  assert_int_equal(rm_client_nodes_up(c), 1);
  assert_true(log_has(&lc, RM_LOG_WARN, "lost connection to coordinator"));

  /* Transactions node A created are served by B now. */
  for (int i = 0; i < 10; i++) {
    assert_int_equal(rm_tm_commit(c, xids[i], &st), RM_OK);
    assert_int_equal(st, RM_GS_COMMITTED);
  }
  for (int i = 0; i < 5; i++) {
    char x[RM_XID_MAX];
    begin_served_by(c, pb, x, &begins);
    assert_int_equal(rm_tm_rollback(c, x, &st), RM_OK);
  }
  rm_client_free(c);

  /* A fresh client whose first node is the dead one. */
  char dead_first[128];
  snprintf(dead_first, sizeof(dead_first), "127.0.0.1:%d,127.0.0.1:%d", a->port, b->port);
  c = client_new(dead_first, TOKEN, app, 5000, NULL);
  char x[RM_XID_MAX];
  begin_served_by(c, pb, x, &begins);
  assert_int_equal(rm_tm_commit(c, x, &st), RM_OK);
  rm_client_free(c);

  /* Resends after the kill used the same idempotency key: exactly one
   * global per successful begin. */
  assert_int_equal(globals_of(app), begins);
}

/* ---- heartbeats: a silent node is dead; the resend keeps its key ---- */


/* RM_NODE_HOME (the default): every begin of a client goes to its home
 * node; while that node is down, to the other; back once it returns. */
static void test_home_node(void **state) {
  (void)state;
  skip_without_servers();
  tcd_proc_t *a = tcd_start(0, TOKEN);
  tcd_proc_t *b = tcd_start(0, TOKEN);
  char nodes[128], pa[64], pb[64], x[RM_XID_MAX], first[RM_XID_MAX];
  int st;
  nodes_of(nodes, sizeof(nodes), a, b);
  snprintf(pa, sizeof(pa), "127.0.0.1:%d:", a->port);
  snprintf(pb, sizeof(pb), "127.0.0.1:%d:", b->port);
  rm_client_t *c = client_new(nodes, TOKEN, "rm-tm-home", 5000, NULL);
  assert_int_equal(WAIT_EQ(2, 10, rm_client_nodes_up(c)), 2);
  assert_int_equal(rm_tm_begin(c, 60000, NULL, first), RM_OK);
  bool home_a = strncmp(first, pa, strlen(pa)) == 0;
  assert_true(home_a || strncmp(first, pb, strlen(pb)) == 0);
  const char *home = home_a ? pa : pb, *other = home_a ? pb : pa;
  for (int i = 0; i < 20; i++) {
    assert_int_equal(rm_tm_begin(c, 60000, NULL, x), RM_OK);
    if (strncmp(x, home, strlen(home)) != 0) fail_msg("begin %d went to %s, not the home node %s", i, x, home);
    assert_int_equal(rm_tm_commit(c, x, &st), RM_OK);
  }
  /* The home node dies: begins go to the other one. */
  tcd_proc_t *h = home_a ? a : b;
  tcd_proc_kill(h);
  for (int i = 0; i < 5; i++) {
    assert_int_equal(rm_tm_begin(c, 0, NULL, x), RM_OK);
    if (strncmp(x, other, strlen(other)) != 0) fail_msg("begin %d went to %s while the home node was down", i, x);
    assert_int_equal(rm_tm_rollback(c, x, &st), RM_OK);
  }
  /* It returns: begins go home again. */
  assert_int_equal(tcd_proc_restart(h), 0);
  assert_int_equal(WAIT_EQ(2, 15, rm_client_nodes_up(c)), 2);
  assert_int_equal(rm_tm_begin(c, 0, NULL, x), RM_OK);
  if (strncmp(x, home, strlen(home)) != 0) fail_msg("begin went to %s after the home node returned", x);
  assert_int_equal(rm_tm_rollback(c, x, &st), RM_OK);
  assert_int_equal(rm_tm_rollback(c, first, &st), RM_OK);
  rm_client_free(c);
}
static void test_heartbeat_dead_then_resend(void **state) {
  (void)state;
  char nodes[128];
  tcd_proc_t *t = start_single_node(nodes, sizeof(nodes));
  const char *app = "rm-tm-heartbeat";
  logcap_t lc;
  logcap_init(&lc);
  rm_config_t cfg = {0};
  cfg.nodes = nodes;
  cfg.token = TOKEN;
  cfg.application_id = app;
  cfg.request_timeout_ms = 15000;
  cfg.connect_timeout_ms = 1000;
  cfg.heartbeat_ms = 200;
  cfg.log_cb = log_capture;
  cfg.log_arg = &lc;
  cfg.log_level = RM_LOG_DEBUG;
  rm_client_t *c = NULL;
  assert_int_equal(rm_client_new(&cfg, &c), RM_OK);
  assert_int_equal(WAIT_EQ(1, 10, rm_client_nodes_up(c)), 1);

  tcd_signal(t, SIGSTOP);
  double t0 = now_ms();
  waiter_t w;
  waiter_init(&w);
  assert_int_equal(rm_tm_begin_async(c, 0, "hb", on_tm, &w), RM_OK);
  /* Two silent heartbeat intervals: the connection is declared dead. */
  assert_int_equal(WAIT_EQ(0, 3, rm_client_nodes_up(c)), 0);
  double dead_after = now_ms() - t0;
  assert_true(dead_after >= 300 && dead_after < 1500);
  assert_true(log_has(&lc, RM_LOG_WARN, "no answer for"));
  sleep_ms(300);
  assert_int_equal(w.calls, 0); /* sent, connection lost: it waits to be resent */
  tcd_signal(t, SIGCONT);

  /* The node comes back: the begin is resent with the same idempotency
   * key.  The node also reads the first copy from the old socket: still
   * one global transaction. */
  waiter_wait(&w, 1, 15000);
  assert_int_equal(w.code, RM_OK);
  assert_true(log_has(&lc, RM_LOG_DEBUG, "resending GlobalBegin"));
  assert_int_equal(WAIT_EQ(1, 5, rm_client_nodes_up(c)), 1);
  int st;
  assert_int_equal(rm_tm_rollback(c, w.xid, &st), RM_OK);
  rm_client_free(c);
  assert_int_equal(globals_of(app), 1);
}

/* ---- store errors are retried ---- */

static int terminate_tc_backends(void) {
  PGconn *pg = PQconnectdb(pg_url());
  if (PQstatus(pg) != CONNECTION_OK) fail_msg("could not connect: %s", PQerrorMessage(pg));
  PGresult *r = PQexec(pg, "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                           "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                           "AND backend_type = 'client backend'");
  if (PQresultStatus(r) != PGRES_TUPLES_OK) fail_msg("terminate failed: %s", PQerrorMessage(pg));
  int n = atoi(PQgetvalue(r, 0, 0));
  PQclear(r);
  PQfinish(pg);
  return n;
}

static void test_store_errors_retried(void **state) {
  (void)state;
  char nodes[128];
  start_single_node(nodes, sizeof(nodes));
  const char *app = "rm-tm-store";
  logcap_t lc;
  logcap_init(&lc);
  load_ctx_t l;
  memset(&l, 0, sizeof(l));
  l.c = client_new(nodes, TOKEN, app, 15000, &lc);
  pthread_t th[4];
  for (int i = 0; i < 4; i++) assert_int_equal(pthread_create(&th[i], NULL, load_worker, &l), 0);
  int killed = 0;
  for (int round = 0; round < 3; round++) {
    wait_counter(&l.done, atomic_load(&l.done) + 30, 30000);
    killed += terminate_tc_backends(); /* ops in flight fail with TXP_ESTORE */
  }
  wait_counter(&l.done, atomic_load(&l.done) + 30, 30000);
  atomic_store(&l.stop, true);
  for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
  rm_client_free(l.c);
  assert_true(killed > 0);
  if (atomic_load(&l.failures))
    fail_msg("%d calls failed while the store connections were cut; first %d (%s)",
             atomic_load(&l.failures), atomic_load(&l.first_rc), rm_strerror(atomic_load(&l.first_rc)));
  /* Retried begins kept their keys: one global each. */
  assert_int_equal(globals_of(app), atomic_load(&l.done));
  int retried = 0;
  pthread_mutex_lock(&lc.mu);
  for (int i = 0; i < lc.n && i < CAP_LINES; i++)
    if (strstr(lc.lines[i], "(STORE): retrying")) retried++;
  pthread_mutex_unlock(&lc.mu);
  print_message("%d backends terminated, %d store refusals retried, %d transactions\n", killed, retried,
                atomic_load(&l.done));
}

/* ---- restart ---- */

static void test_reconnect_after_restart(void **state) {
  (void)state;
  char nodes[128];
  tcd_proc_t *t = start_single_node(nodes, sizeof(nodes));
  int port = t->port;
  char xid[RM_XID_MAX];
  int st;
  rm_client_t *c = client_new(nodes, TOKEN, "rm-tm-restart", 15000, NULL);
  assert_int_equal(rm_tm_begin(c, 60000, NULL, xid), RM_OK);
  /* A begin is answered before it is stored and stored within
   * store.begin_hold_ms (tc/tc_hold.h); one killed before that is lost
   * (test_tcd_hold).  This one is meant to survive: kill once it is in. */
  assert_int_equal(WAIT_EQ(1, 5, sql_count(pg_url(), "SELECT count(*) FROM global_table WHERE xid = $1", xid)), 1);
  tcd_proc_kill(t);
  /* Wait until the client noticed, then ask while the node is down: the
   * call waits for the node to come back, within its deadline. */
  assert_int_equal(WAIT_EQ(0, 5, rm_client_nodes_up(c)), 0);
  waiter_t w;
  waiter_init(&w);
  assert_int_equal(rm_tm_begin_async(c, 0, NULL, on_tm, &w), RM_OK);
  t = tcd_start(port, TOKEN);
  waiter_wait(&w, 1, 15000);
  assert_int_equal(w.code, RM_OK);
  assert_int_equal(rm_client_nodes_up(c), 1);
  /* The transaction begun before the restart lives on in the store. */
  assert_int_equal(rm_tm_commit(c, xid, &st), RM_OK);
  assert_int_equal(st, RM_GS_COMMITTED);
  assert_int_equal(rm_tm_rollback(c, w.xid, &st), RM_OK);
  rm_client_free(c);
}

/* ---- a begin answered before it is stored ---- */

/* librmclient marks a GlobalBegin's first send (txp FIRST_SEND), so the
 * node holds it (tc/tc_hold.h): with a one-second hold, its row is not in
 * the store right after the answer.  The commit that follows stores it
 * first and commits it. */
static void test_begin_held(void **state) {
  (void)state;
  skip_without_servers();
  static const char *const env[] = {"TC_STORE_BEGIN_HOLD_MS=1000", NULL};
  tcd_proc_t *t = tcd_start_with(0, TOKEN, env);
  char nodes[128], xid[RM_XID_MAX];
  nodes_of(nodes, sizeof(nodes), t, NULL);
  rm_client_t *c = client_new(nodes, TOKEN, "rm-tm-held", 5000, NULL);
  assert_int_equal(rm_tm_begin(c, 60000, "held", xid), RM_OK);
  assert_int_equal(sql_count(pg_url(), "SELECT count(*) FROM global_table WHERE xid = $1", xid), 0);
  int st = 0;
  assert_int_equal(rm_tm_commit(c, xid, &st), RM_OK);
  assert_int_equal(st, RM_GS_COMMITTED);
  assert_int_equal(globals_of("rm-tm-held"), 1);
  rm_client_free(c);
}

/* ---- free with calls in flight ---- */

#define FREE_THREADS 8

typedef struct free_ctx {
  rm_client_t *c;
  atomic_int entered;
  int rc[FREE_THREADS];
  double returned_at[FREE_THREADS];
  int index;
  pthread_mutex_t mu;
} free_ctx_t;

static void *free_worker(void *arg) {
  free_ctx_t *f = arg;
  pthread_mutex_lock(&f->mu);
  int me = f->index++;
  pthread_mutex_unlock(&f->mu);
  char xid[RM_XID_MAX];
  atomic_fetch_add(&f->entered, 1);
  f->rc[me] = rm_tm_begin(f->c, 0, NULL, xid);
  f->returned_at[me] = now_ms();
  return NULL;
}

static void test_free_with_calls_in_flight(void **state) {
  (void)state;
  char nodes[128];
  tcd_proc_t *t = start_single_node(nodes, sizeof(nodes));
  free_ctx_t f;
  memset(&f, 0, sizeof(f));
  pthread_mutex_init(&f.mu, NULL);
  f.c = client_new(nodes, TOKEN, "rm-tm-free", 60000, NULL);
  assert_int_equal(WAIT_EQ(1, 10, rm_client_nodes_up(f.c)), 1);
  tcd_signal(t, SIGSTOP); /* everything sent from now on hangs */

  pthread_t th[FREE_THREADS];
  for (int i = 0; i < FREE_THREADS; i++) assert_int_equal(pthread_create(&th[i], NULL, free_worker, &f), 0);
  waiter_t w;
  waiter_init(&w);
  for (int i = 0; i < 8; i++) assert_int_equal(rm_tm_begin_async(f.c, 0, NULL, on_tm, &w), RM_OK);
  wait_counter(&f.entered, FREE_THREADS, 5000);
  sleep_ms(200); /* margin: the threads are inside rm_tm_begin */
  assert_int_equal(w.calls, 0);

  double t0 = now_ms();
  rm_client_free(f.c);
  double freed = now_ms();
  assert_true(freed - t0 < 2000);
  /* Every async callback ran before rm_client_free returned. */
  assert_int_equal(w.calls, 8);
  assert_int_equal(w.code, RM_E_UNKNOWN_OUTCOME); /* they were on the wire */
  for (int i = 0; i < FREE_THREADS; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < FREE_THREADS; i++) {
    if (f.rc[i] != RM_E_UNKNOWN_OUTCOME && f.rc[i] != RM_E_CONN_LOST)
      fail_msg("thread %d got %d (%s)", i, f.rc[i], rm_strerror(f.rc[i]));
    assert_true(f.returned_at[i] - t0 < 2000);
  }
  tcd_signal(t, SIGCONT);
}

/* ---- branch registration with a lock wait ---- */

typedef struct reg_ctx {
  rm_client_t *c;
  const char *xid;
  int rc;
  int64_t branch;
  double elapsed;
  char err[256];
} reg_ctx_t;

static void *reg_worker(void *arg) {
  reg_ctx_t *r = arg;
  double t0 = now_ms();
  r->rc = rm__branch_register(r->c, r->xid, "res-lock", "t_lock:1;t_lock:2", NULL, 10000, &r->branch,
                              r->err, sizeof(r->err));
  r->elapsed = now_ms() - t0;
  return NULL;
}

static void test_branch_register_lock_wait(void **state) {
  (void)state;
  char nodes[128];
  tcd_proc_t *t = start_single_node(nodes, sizeof(nodes));
  char x1[RM_XID_MAX], x2[RM_XID_MAX], x3[RM_XID_MAX], err[256];
  int st;
  int64_t b1 = 0, b3 = 0;
  logcap_t lc;
  logcap_init(&lc);
  rm_client_t *c = client_new(nodes, TOKEN, "rm-tm-locks", 5000, &lc);
  assert_int_equal(rm__lock_wait_ms(c), 2000); /* the default */
  assert_int_equal(rm_tm_begin(c, 60000, NULL, x1), RM_OK);
  assert_int_equal(rm_tm_begin(c, 60000, NULL, x2), RM_OK);
  assert_int_equal(rm_tm_begin(c, 60000, NULL, x3), RM_OK);

  assert_int_equal(rm__branch_register(c, x1, "res-lock", "t_lock:1", "{\"a\":1}", 0, &b1, err, sizeof(err)),
                   RM_OK);
  assert_true(b1 > 0);

  /* x2 wants the same row: it waits (pushed by the TC) until x1 commits. */
  reg_ctx_t r = {c, x2, -1, 0, 0, ""};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, reg_worker, &r), 0);
  sleep_ms(300); /* margin: let the registration queue behind x1's lock */
  assert_int_equal(rm_tm_commit(c, x1, &st), RM_OK);
  pthread_join(th, NULL);
  if (r.rc != RM_OK) fail_msg("register after the wait: %d (%s): %s", r.rc, rm_strerror(r.rc), r.err);
  assert_true(r.branch > 0 && r.branch != b1);
  assert_true(r.elapsed >= 250);
  assert_true(log_has(&lc, RM_LOG_DEBUG, "after waiting"));

  /* Without a wait, a conflict is an immediate error naming the holder. */
  double t0 = now_ms();
  assert_int_equal(rm__branch_register(c, x3, "res-lock", "t_lock:2", NULL, 0, &b3, err, sizeof(err)),
                   RM_E_LOCK_CONFLICT);
  assert_true(now_ms() - t0 < 2000);
  assert_non_null(strstr(err, x2));
  assert_int_equal(b3, 0);
  /* A short wait that runs out. */
  assert_int_equal(rm__branch_register(c, x3, "res-lock", "t_lock:2", NULL, 300, &b3, err, sizeof(err)),
                   RM_E_LOCK_WAIT_TIMEOUT);

  /* Phase-one report, then roll x2 back. */
  assert_int_equal(rm__branch_report(c, x2, r.branch, TXP_BS_PHASE1_FAILED, "local commit failed"), RM_OK);
  /* No RM serves "res-lock": finished at once, or decided and retried,
   * and then the code says so. */
  int rrc = rm_tm_rollback(c, x2, &st);
  assert_true((rrc == RM_OK && st == RM_GS_ROLLBACKED) ||
              (rrc == RM_E_ROLLBACK_PENDING && st == RM_GS_ROLLBACK_RETRYING));

  /* Bad arguments: refused locally, with a message. */
  assert_int_equal(rm__branch_register(c, NULL, "res-lock", NULL, NULL, 0, &b3, err, sizeof(err)), RM_E_INVALID);
  assert_true(err[0] != '\0');
  assert_int_equal(rm__branch_register(c, x3, "", NULL, NULL, 0, &b3, err, sizeof(err)), RM_E_INVALID);
  assert_int_equal(rm__branch_report(c, x3, 1, TXP_BS_PHASE2_COMMITTED, NULL), RM_E_INVALID);
  /* The coordinator's own refusals come back with its message. */
  char unknown[128];
  snprintf(unknown, sizeof(unknown), "127.0.0.1:%d:1", t->port);
  assert_int_equal(rm__branch_register(c, unknown, "res-lock", NULL, NULL, 0, &b3, err, sizeof(err)),
                   RM_E_GLOBAL_NOT_FOUND);
  assert_non_null(strstr(err, "not found"));
  assert_int_equal(rm__branch_register(c, x3, "res-lock", "no-colon", NULL, 0, &b3, err, sizeof(err)),
                   RM_E_BAD_REQUEST);
  assert_int_equal(rm_tm_rollback(c, x3, &st), RM_OK);
  rm_client_free(c);
}

/* ---- phase two, through the AT layer ---- */

static void test_phase_two_dispatch(void **state) {
  (void)state;
  skip_without_servers();
  const char *orders = getenv("ORDERS_PG_URL");
  if (!orders) skip();
  tcd_proc_t *t = tcd_start(0, TOKEN);
  char nodes[128], x[RM_XID_MAX], y[RM_XID_MAX], err[256];
  int st;
  int64_t b = 0;
  logcap_t lc;
  logcap_init(&lc);
  nodes_of(nodes, sizeof(nodes), t, NULL);
  rm_client_t *c = client_new(nodes, TOKEN, "rm-tm-phase2", 5000, &lc);
  assert_int_equal(WAIT_EQ(1, 10, rm_client_nodes_up(c)), 1);
  /* Becoming an RM re-registers on the live connection (RegisterRM). */
  assert_int_equal(rm_resource_add(c, "orders", orders), RM_OK);
  char ids[256];
  assert_true(rm__resource_ids(c, ids, sizeof(ids)) >= 0);
  assert_string_equal(ids, "orders");

  /* Commit: the TC sends BranchCommit to this client; the answer
   * (PhaseTwoCommitted) lets the session finish: Committed in history. */
  assert_int_equal(rm_tm_begin(c, 60000, NULL, x), RM_OK);
  assert_int_equal(rm__branch_register(c, x, "orders", "p2_rows:1", NULL, 0, &b, err, sizeof(err)), RM_OK);
  assert_int_equal(rm_tm_commit(c, x, &st), RM_OK);
  assert_int_equal(st, RM_GS_COMMITTED);
  wait_status(c, x, RM_GS_COMMITTED, 10000);

  /* Rollback of a branch whose local transaction never committed: the AT
   * layer writes its guard row and answers PhaseTwoRollbacked, which the
   * rollback waits for. */
  assert_int_equal(rm_tm_begin(c, 60000, NULL, y), RM_OK);
  assert_int_equal(rm__branch_register(c, y, "orders", "p2_rows:2", NULL, 0, &b, err, sizeof(err)), RM_OK);
  assert_int_equal(rm_tm_rollback(c, y, &st), RM_OK);
  assert_int_equal(st, RM_GS_ROLLBACKED);
  assert_int_equal(sql_count(orders, "SELECT count(*) FROM undo_log WHERE xid = $1 AND log_status = 1", y), 1);
  rm_client_free(c);
}

/* ---- the library prints nothing ---- */

static void test_prints_nothing(void **state) {
  (void)state;
  char nodes[128];
  tcd_proc_t *t = start_single_node(nodes, sizeof(nodes));
  char xid[RM_XID_MAX], path[512];
  int st;
  const char *dir = getenv("TX_SERVERS_DIR");
  snprintf(path, sizeof(path), "%s/rm-tm-stdio-%d.txt", dir ? dir : "/tmp", (int)getpid());
  logcap_t lc;
  logcap_init(&lc);

  fflush(stdout);
  fflush(stderr);
  int saved_out = dup(1), saved_err = dup(2);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  assert_true(saved_out >= 0 && saved_err >= 0 && fd >= 0);
  dup2(fd, 1);
  dup2(fd, 2);
  close(fd);

  /* Everything that logs, with and without a callback. */
  rm_client_t *quiet = client_new(nodes, "wrong", "rm-tm-quiet", 1000, NULL);
  int rc_auth = rm_tm_begin(quiet, 0, NULL, xid);
  rm_client_free(quiet);
  quiet = client_new("127.0.0.1:1", TOKEN, "rm-tm-quiet", 300, NULL);
  int rc_none = rm_tm_begin(quiet, 0, NULL, xid);
  rm_client_free(quiet);
  rm_client_t *c = client_new(nodes, TOKEN, "rm-tm-quiet", 1000, &lc);
  int rc_begin = rm_tm_begin(c, 0, NULL, xid);
  int rc_commit = rm_tm_commit(c, xid, &st);
  tcd_proc_kill(t); /* a lost connection, reconnect attempts */
  int rc_after = rm_tm_begin(c, 0, NULL, xid);
  rm_client_free(c);

  fflush(stdout);
  fflush(stderr);
  dup2(saved_out, 1);
  dup2(saved_err, 2);
  close(saved_out);
  close(saved_err);

  struct stat sb;
  assert_int_equal(stat(path, &sb), 0);
  if (sb.st_size != 0) {
    FILE *f = fopen(path, "r");
    char line[512];
    while (f && fgets(line, sizeof(line), f)) print_message("printed: %s", line);
    if (f) fclose(f);
    fail_msg("the library wrote %lld bytes to stdout/stderr", (long long)sb.st_size);
  }
  unlink(path);
  assert_int_equal(rc_auth, RM_E_AUTH);
  assert_int_equal(rc_none, RM_E_NO_NODE);
  assert_int_equal(rc_begin, RM_OK);
  assert_int_equal(rc_commit, RM_OK);
  assert_int_equal(rc_after, RM_E_NO_NODE);
  /* ... while the callback heard all about it. */
  assert_true(log_has(&lc, RM_LOG_INFO, "connected to coordinator"));
  assert_true(log_has(&lc, RM_LOG_WARN, "lost connection to coordinator"));
}

int main(void) {
  /* SIGPIPE keeps its default action: a library that let a write to a dead
   * coordinator raise it would kill this process. */
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_strerror_and_args),
    cmocka_unit_test_teardown(test_round_trips, teardown_tcds),
    cmocka_unit_test_teardown(test_many_threads, teardown_tcds),
    cmocka_unit_test_teardown(test_wrong_token, teardown_tcds),
    cmocka_unit_test_teardown(test_no_node, teardown_tcds),
    cmocka_unit_test_teardown(test_hung_node_unknown_outcome, teardown_tcds),
    cmocka_unit_test_teardown(test_two_nodes_one_dies, teardown_tcds),
    cmocka_unit_test_teardown(test_home_node, teardown_tcds),
    cmocka_unit_test_teardown(test_heartbeat_dead_then_resend, teardown_tcds),
    cmocka_unit_test_teardown(test_store_errors_retried, teardown_tcds),
    cmocka_unit_test_teardown(test_reconnect_after_restart, teardown_tcds),
    cmocka_unit_test_teardown(test_begin_held, teardown_tcds),
    cmocka_unit_test_teardown(test_free_with_calls_in_flight, teardown_tcds),
    cmocka_unit_test_teardown(test_branch_register_lock_wait, teardown_tcds),
    cmocka_unit_test_teardown(test_phase_two_dispatch, teardown_tcds),
    cmocka_unit_test_teardown(test_prints_nothing, teardown_tcds),
  };
  int rc = cmocka_run_group_tests_name("rm_tm", tests, NULL, teardown_tcds);
  tcd_kill_all();
  return rc;
}
