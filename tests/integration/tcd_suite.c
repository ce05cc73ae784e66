/*
 * tcd_suite.c - see tcd_suite.h.
 *
 * Threads: the cmocka test thread (all assertions) and the RM thread
 * (rmsim).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "rmsim.h"
#include "tcd_suite.h"

#define RM_RESOURCES "db_orders,db_stock"
#define START_TIMEOUT_MS 15000
#define STOP_TIMEOUT_MS 10000
#define POLL_NS 10000000L /* 10 ms between two looks */
#define MAX_TRACKED 64

/* ------------------------------------------------------------ utilities */

double now_ms(void) { return txc_now_ms(); }

void nap(void) {
  struct timespec ts = {0, POLL_NS};
  nanosleep(&ts, NULL);
}

/* -------------------------------------------------------------- the RM */

static rmsim_t *g_rm;

static void rm_set_port(int port) {
  if (g_rm) rmsim_set_port(g_rm, port);
}

int rm_generation(void) { return rmsim_generation(g_rm); }

bool rm_wait_generation(int above, int timeout_ms) {
  double deadline = now_ms() + timeout_ms;
  while (rm_generation() <= above) {
    if (now_ms() >= deadline) return false;
    nap();
  }
  return true;
}

void rm_set_modes(bool silent_commit, bool silent_rollback, int64_t dirty_branch) {
  rmsim_modes(g_rm, silent_commit, silent_rollback);
  rmsim_dirty(g_rm, 0);
  if (dirty_branch) rmsim_dirty(g_rm, dirty_branch);
}

int rm_events(const char *xid, int type, int after_gen, int64_t *ids, int max) {
  return rmsim_events(g_rm, xid, type, after_gen, ids, max);
}

bool rm_wait_events(const char *xid, int type, int after_gen, int want, int timeout_ms) {
  double deadline = now_ms() + timeout_ms;
  while (rm_events(xid, type, after_gen, NULL, 0) < want) {
    if (now_ms() >= deadline) return false;
    nap();
  }
  return true;
}

bool has_id(const int64_t *ids, int n, int64_t id) {
  for (int i = 0; i < n; i++)
    if (ids[i] == id) return true;
  return false;
}

/* ------------------------------------------------------------ tcd process */

tcd_proc_t g_tcd;
bool g_stopped_on_purpose;

/* Serving: it accepts a registration (its store is ready). */
static bool tcd_serving(const tcd_proc_t *t, void *arg) {
  (void)arg;
  return txc_serving(HOST, t->port, TOKEN, 200);
}

const char *g_tcd_setting;

int tcd_start(void) { return tcd_start_armed(NULL, NULL); }

int tcd_start_armed(const char *failpoints, const char *log) {
  /* tcd_proc keeps pointers to the settings: they live here. */
  static char armed[512];
  static const char *env[] = {"TC_RECOVERY_INTERVAL_MS=200", "TC_RECOVERY_RETRY_MIN_MS=100", NULL, NULL, NULL};
  int n = 2;
  if (failpoints) {
    snprintf(armed, sizeof(armed), "TX_FAILPOINTS=%s", failpoints);
    env[n++] = armed;
  }
  if (g_tcd_setting) env[n++] = g_tcd_setting;
  env[n] = NULL;
  tcd_opts_t o = {.token = TOKEN, .log_level = "warn", .env = env, .attempts = 5,
                  .timeout_ms = START_TIMEOUT_MS, .ready = tcd_serving, .log = log};
  if (tcd_proc_start(&g_tcd, &o) != 0) return -1;
  rm_set_port(g_tcd.port);
  return 0;
}

int tcd_stop(void) { return tcd_proc_stop(&g_tcd, STOP_TIMEOUT_MS); }

void tcd_kill9(void) { tcd_proc_kill(&g_tcd); }

bool tcd_alive(void) { return tcd_proc_alive(&g_tcd, NULL); }

/* --------------------------------------------------------- PostgreSQL */

void expect_history(const char *xid, int status, int timeout_ms) {
  if (!db_wait_long(SQL_HISTORY_STATUS, xid, NULL, status, timeout_ms))
    fail_msg("global %s: history status is %ld (live status %ld), expected %d", xid,
             db_long(SQL_HISTORY_STATUS, xid, NULL), db_long(SQL_GLOBAL_STATUS, xid, NULL), status);
}

long history_branches(const char *xid, int branch_status) {
  char s[16];
  snprintf(s, sizeof(s), "%d", branch_status);
  return db_long(SQL_HISTORY_BRANCHES, xid, s);
}

long branch_status(int64_t branch) {
  char bid[32];
  snprintf(bid, sizeof(bid), "%" PRId64, branch);
  return db_long("SELECT status FROM branch_table WHERE branch_id = $1::bigint", bid, NULL);
}

/* ------------------------------------------------------------ clients */

static txc_t *g_tracked[MAX_TRACKED];

static reader_t *g_readers[MAX_TRACKED];

static txc_t *track(txc_t *c) {
  for (int i = 0; i < MAX_TRACKED; i++)
    if (!g_tracked[i]) {
      g_tracked[i] = c;
      return c;
    }
  fail_msg("too many open clients");
  return c;
}

void untrack_close(txc_t *c) {
  for (int i = 0; i < MAX_TRACKED; i++)
    if (g_tracked[i] == c) g_tracked[i] = NULL;
  txc_close(c);
}

static void reader_free(reader_t *r) {
  if (!r) return;
  for (int i = 0; i < r->nheld; i++) txp_msg_clear(&r->held[i]);
  txp_decoder_free(r->dec);
  free(r);
}

reader_t *new_reader(void) {
  for (int i = 0; i < MAX_TRACKED; i++)
    if (!g_readers[i]) {
      reader_t *r = calloc(1, sizeof(*r));
      assert_non_null(r);
      r->dec = txp_decoder_new(NULL);
      if (!r->dec) {
        free(r);
        fail_msg("out of memory");
      }
      g_readers[i] = r;
      return r;
    }
  fail_msg("too many readers");
  return NULL;
}

txc_t *raw_connect(void) {
  char err[256];
  txc_t *c = txc_connect(HOST, g_tcd.port, 2000, err, sizeof(err));
  if (!c) fail_msg("could not connect to tcd on port %d: %s", g_tcd.port, err);
  return track(c);
}

txc_t *client(bool as_rm, const char *client_id, const char *resources) {
  txc_t *c = raw_connect();
  int rc = txc_register(c, as_rm, "test-app", client_id, TOKEN, as_rm ? resources : NULL);
  if (rc != 0) fail_msg("could not register %s: %s (%d)", client_id, txp_errname(rc), rc);
  return c;
}

void cli_open(cli_t *cl, const char *name) {
  char id[64];
  snprintf(id, sizeof(id), "%s-tm", name);
  cl->tm = client(false, id, NULL);
  snprintf(id, sizeof(id), "%s-rm", name);
  cl->rm = client(true, id, "db_client");
}

cli_t new_cli(const char *name) {
  cli_t cl;
  cli_open(&cl, name);
  return cl;
}

void begin_ok(txc_t *tm, uint32_t timeout_ms, const char *name, char *xid) {
  int rc = txc_begin(tm, timeout_ms, name, NULL, xid);
  if (rc != 0) fail_msg("GlobalBegin %s: %s (%d)", name, txp_errname(rc), rc);
  assert_true(xid[0] != '\0');
}

static int64_t register_with(txc_t *c, const char *xid, const char *resource, const char *keys,
                             const char *app_data) {
  int64_t branch = 0;
  int rc = txc_branch_register_data(c, xid, resource, keys, app_data, 0, &branch, NULL);
  if (rc != 0) fail_msg("BranchRegister %s %s on %s: %s (%d)", xid, keys, resource, txp_errname(rc), rc);
  assert_true(branch > 0);
  return branch;
}

int64_t register_ok(txc_t *c, const char *xid, const char *resource, const char *keys) {
  return register_with(c, xid, resource, keys, NULL);
}

int64_t register_sync_ok(txc_t *c, const char *xid, const char *resource, const char *keys) {
  return register_with(c, xid, resource, keys, TXP_APP_DATA_PHASE2_SYNC);
}

void begin_two_branches(const cli_t *cl, uint32_t timeout_ms, const char *name, const char *orders_keys,
                        const char *stock_keys, two_branch_tx_t *tx) {
  begin_ok(cl->tm, timeout_ms, name, tx->xid);
  tx->orders = register_ok(cl->rm, tx->xid, "db_orders", orders_keys);
  tx->stock = register_ok(cl->rm, tx->xid, "db_stock", stock_keys);
}

static void decide_ok(txc_t *tm, const char *xid, bool commit) {
  int status = -1;
  int rc = commit ? txc_commit(tm, xid, &status) : txc_rollback(tm, xid, &status);
  if (rc != 0) fail_msg("%s %s: %s (%d)", commit ? "GlobalCommit" : "GlobalRollback", xid, txp_errname(rc), rc);
  assert_int_equal(status, commit ? TXP_GS_COMMITTED : TXP_GS_ROLLBACKED);
}

void commit_ok(txc_t *tm, const char *xid) { decide_ok(tm, xid, true); }

void rollback_ok(txc_t *tm, const char *xid) { decide_ok(tm, xid, false); }

void expect_commits_told(const char *xid, int64_t b1, int64_t b2) {
  int64_t ids[4];
  assert_true(rm_wait_events(xid, TXP_MSG_BRANCH_COMMIT, 0, 2, WAIT_MS));
  int n = rm_events(xid, TXP_MSG_BRANCH_COMMIT, 0, ids, 4);
  assert_true(n == 2 && has_id(ids, n, b1) && has_id(ids, n, b2));
}

void expect_rollbacks_newest_first(const two_branch_tx_t *tx) {
  int64_t ids[4];
  assert_int_equal(rm_events(tx->xid, TXP_MSG_BRANCH_ROLLBACK, 0, ids, 4), 2);
  assert_true(ids[0] == tx->stock && ids[1] == tx->orders);
}

void msg_register(txp_msg_t *m, const char *xid, const char *resource, const char *keys, uint32_t lock_wait_ms,
                  const char *idem) {
  txp_msg_init(m, TXP_MSG_BRANCH_REGISTER);
  txp_msg_set_str(m, TXP_F_XID, xid);
  txp_msg_set_int(m, TXP_F_BRANCH_TYPE, TXP_BT_AT);
  txp_msg_set_str(m, TXP_F_RESOURCE_ID, resource);
  if (keys) txp_msg_set_str(m, TXP_F_LOCK_KEYS, keys);
  if (lock_wait_ms) txp_msg_set_int(m, TXP_F_LOCK_WAIT_MS, lock_wait_ms);
  if (idem) txp_msg_set_str(m, TXP_F_IDEM_KEY, idem);
}

void msg_report(txp_msg_t *m, const char *xid, int64_t branch, int status) {
  txp_msg_init(m, TXP_MSG_BRANCH_REPORT);
  txp_msg_set_str(m, TXP_F_XID, xid);
  txp_msg_set_int(m, TXP_F_BRANCH_ID, branch);
  txp_msg_set_int(m, TXP_F_BRANCH_STATUS, status);
}

void send_frames(txc_t *c, txp_msg_t *msgs, int n, uint64_t first_id) {
  txp_buf_t out;
  txp_buf_init(&out, 0);
  for (int i = 0; i < n; i++) {
    msgs[i].request_id = first_id + (uint64_t)i;
    int rc = txp_encode(&msgs[i], &out, 0);
    if (rc != 0) {
      txp_buf_free(&out);
      fail_msg("could not encode a frame: %s", txp_errname(rc));
    }
  }
  int rc = txc_send_raw(c, out.data, out.len);
  txp_buf_free(&out);
  assert_int_equal(rc, 0);
}

static void send_decision(txc_t *c, const char *xid, txp_msg_type_t type, uint64_t id) {
  txp_msg_t req;
  txp_msg_init(&req, type);
  txp_msg_set_str(&req, TXP_F_XID, xid);
  send_frames(c, &req, 1, id);
}

void send_rollback(txc_t *c, const char *xid, uint64_t id) { send_decision(c, xid, TXP_MSG_GLOBAL_ROLLBACK, id); }

void send_commit(txc_t *c, const char *xid, uint64_t id) { send_decision(c, xid, TXP_MSG_GLOBAL_COMMIT, id); }

void queue_waiter(txc_t *c, reader_t *rd, const char *xid, const char *keys, uint32_t wait_ms, uint64_t id) {
  txp_msg_t pair[2], res;
  msg_register(&pair[0], xid, "db_orders", keys, wait_ms, NULL);
  msg_register(&pair[1], xid, "db_orders", keys, 0, NULL);
  send_frames(c, pair, 2, id);
  expect_answer(c, rd, id + 1, &res, TXP_ELOCK_CONFLICT);
  txp_msg_clear(&res);
}

int recv_answer(txc_t *c, reader_t *rd, uint64_t id, txp_msg_t *out, int timeout_ms) {
  double deadline = now_ms() + timeout_ms;
  for (int i = 0; i < rd->nheld; i++) {
    if (rd->held[i].request_id != id) continue;
    *out = rd->held[i];
    rd->held[i] = rd->held[--rd->nheld];
    return 0;
  }
  txp_msg_init(out, TXP_MSG_NONE);
  for (;;) {
    int rc = txp_decoder_next(rd->dec, out);
    if (rc == 0) {
      if ((out->flags & TXP_FLAG_RESPONSE) && out->request_id == id) return 0;
      if ((out->flags & TXP_FLAG_RESPONSE) && rd->nheld < READER_HELD) rd->held[rd->nheld++] = *out;
      else txp_msg_clear(out);
      txp_msg_init(out, TXP_MSG_NONE);
      continue;
    }
    txp_msg_clear(out);
    if (rc != TXP_EAGAIN) return rc;
    double left = deadline - now_ms();
    if (left <= 0) return TXP_EUNKNOWN_OUTCOME;
    struct pollfd p = {txc_fd(c), POLLIN, 0};
    int pr = poll(&p, 1, (int)left + 1);
    if (pr <= 0) continue;
    char buf[4096];
    ssize_t got = recv(txc_fd(c), buf, sizeof(buf), 0);
    if (got == 0 || (got < 0 && errno != EAGAIN && errno != EINTR)) return TXP_ECONN_LOST;
    if (got > 0 && txp_decoder_feed(rd->dec, buf, (size_t)got) != 0) return TXP_ENOMEM;
  }
}

void expect_answer(txc_t *c, reader_t *rd, uint64_t id, txp_msg_t *out, int code) {
  assert_int_equal(recv_answer(c, rd, id, out, 10000), 0);
  assert_int_equal(out->code, code);
}

bool readable_now(txc_t *c) {
  struct pollfd p = {txc_fd(c), POLLIN, 0};
  return poll(&p, 1, 0) == 1;
}

/* -------------------------------------------------------------- fixture */

int suite_test_setup(void **state) {
  (void)state;
  if (tcd_alive()) return 0;
  fprintf(stderr, "%s: tcd is not running: starting a new one\n", program_invocation_short_name);
  return tcd_start();
}

int suite_test_teardown(void **state) {
  (void)state;
  int rc = 0;
  if (!g_stopped_on_purpose && !tcd_alive()) {
    fprintf(stderr, "%s: tcd died during the test\n", program_invocation_short_name);
    rc = -1;
  }
  for (int i = 0; i < MAX_TRACKED; i++) {
    if (g_tracked[i]) txc_close(g_tracked[i]);
    reader_free(g_readers[i]);
    g_tracked[i] = NULL;
    g_readers[i] = NULL;
  }
  rm_set_modes(false, false, 0);
  return rc;
}

int suite_group_setup(void **state) {
  (void)state;
  const char *me = program_invocation_short_name;
  const char *url = getenv("TC_PG_URL");
  if (!url || !getenv("TX_BIN_DIR")) {
    fprintf(stderr, "%s: TC_PG_URL and TX_BIN_DIR must be set (run it through ctest)\n", me);
    return -1;
  }
  signal(SIGPIPE, SIG_IGN);
  g_pg = PQconnectdb(url);
  if (PQstatus(g_pg) != CONNECTION_OK) {
    fprintf(stderr, "%s: could not connect to %s: %s\n", me, url, PQerrorMessage(g_pg));
    return -1;
  }
  if (tcd_start() != 0) {
    fprintf(stderr, "%s: could not start tcd: %s\n", me, g_tcd.err);
    return -1;
  }
  g_rm = rmsim_new("rm-orders-stock", RM_RESOURCES, TOKEN, g_tcd.port);
  if (!g_rm || rmsim_start(g_rm, WAIT_MS) != 0) {
    fprintf(stderr, "%s: the RM thread could not register\n", me);
    return -1;
  }
  return 0;
}

int suite_group_teardown(void **state) {
  (void)state;
  rmsim_free(g_rm);
  g_rm = NULL;
  int rc = 0;
  if (g_tcd.pid > 0) {
    int st = tcd_stop();
    if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      fprintf(stderr, "%s: tcd did not exit cleanly: status 0x%x\n", program_invocation_short_name, st);
      rc = -1;
    }
  }
  PQfinish(g_pg);
  g_pg = NULL;
  return rc;
}
