/*
 * test_rm_tcc.c - TCC branches (rm_tcc_resource_add, rm_tcc_try, the fence)
 * against a real tcd and the real stock and orders databases of
 * scripts/with-servers --pg: commit, rollback, a cancel before the try (the
 * empty rollback) and the try after it refused (anti-hanging), a cancel
 * that meets the try's uncommitted row, duplicate and contradicting phase
 * two, handler failures, AT and TCC in one global, the RM gone between try
 * and confirm, tcd killed after the decision, the retention sweep, and the
 * argument checks.
 *
 * The business: an account with a balance; the try freezes an amount
 * (frozen + n, checked against the balance), the confirm spends it
 * (balance - n, frozen - n), the cancel unfreezes it (frozen - n), each
 * in the fence's local transaction on the connection it is given.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <libpq-fe.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "rm_at_int.h"
#include "rm_client.h"
#include "rm_internal.h"
#include "rm_tcc.h"
#include "tcd_proc.h"
#include "txp_status.h"

#define TOKEN "rm-tcc-test-token"
#define RES "wallet"          /* the TCC resource of the main client, on the stock database */
#define RES_ALONE "wallet_b"  /* one only the short-lived clients serve */

static const char *stock_url, *orders_url, *tc_url;
static tcd_proc_t tcd;
static rm_client_t *client;
static atomic_int next_acct = 1;

/* What the handlers did, and what a test asks of them. */
static atomic_int confirms, cancels;
static atomic_int confirm_retries_left; /* confirm writes, then asks for a retry, this many times */
static atomic_int confirm_fail;         /* confirm fails for good */
static atomic_int confirm_breaks_txn;   /* confirm leaves a failed statement and says OK */

/* ------------------------------------------------------------- helpers */

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void log_cb(int level, const char *msg, void *arg) {
  (void)arg;
  if (level <= RM_LOG_WARN || getenv("RM_TEST_VERBOSE")) fprintf(stderr, "  [rmclient %d] %s\n", level, msg);
}

static PGconn *pg_open(const char *url) {
  PGconn *pg = PQconnectdb(url);
  if (PQstatus(pg) != CONNECTION_OK) {
    fprintf(stderr, "connect %s: %s", url, PQerrorMessage(pg));
    PQfinish(pg);
    return NULL;
  }
  return pg;
}

static bool exec_ok(PGconn *pg, const char *sql) {
  PGresult *r = PQexec(pg, sql);
  ExecStatusType st = PQresultStatus(r);
  bool ok = st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK;
  if (!ok) fprintf(stderr, "  sql failed: %s: %s", sql, PQresultErrorMessage(r));
  PQclear(r);
  return ok;
}

/* First value of a query with up to 2 parameters; LLONG_MIN: no row or
 * NULL; LLONG_MIN + 1: error. */
static long long q_ll(PGconn *pg, const char *sql, const char *p1, const char *p2) {
  const char *p[2] = {p1, p2};
  PGresult *r = PQexecParams(pg, sql, p2 ? 2 : p1 ? 1 : 0, NULL, p, NULL, NULL, 0);
  long long v = LLONG_MIN + 1;
  if (PQresultStatus(r) == PGRES_TUPLES_OK)
    v = PQntuples(r) && !PQgetisnull(r, 0, 0) ? atoll(PQgetvalue(r, 0, 0)) : LLONG_MIN;
  else
    fprintf(stderr, "  query failed: %s: %s", sql, PQresultErrorMessage(r));
  PQclear(r);
  return v;
}

#define WAIT_EQ(want, secs, what)                                           \
  ({                                                                        \
    long long _v = (what);                                                  \
    for (double _end = now_s() + (secs); _v != (want) && now_s() < _end;) { \
      sleep_ms(20);                                                         \
      _v = (what);                                                          \
    }                                                                       \
    _v;                                                                     \
  })

static long long fence(PGconn *pg, const char *xid, int64_t bid) {
  char b[24];
  snprintf(b, sizeof(b), "%lld", (long long)bid);
  return q_ll(pg, "SELECT status FROM tcc_fence WHERE xid = $1 AND branch_id = $2", xid, b);
}

static long long acct_col(PGconn *pg, const char *acct, const char *col) {
  char sql[128];
  snprintf(sql, sizeof(sql), "SELECT %s FROM tcc_account WHERE id = $1", col);
  return q_ll(pg, sql, acct, NULL);
}

/* A new account with 'balance'; its id in 'out'. */
static void new_account(PGconn *pg, int balance, char *out, size_t cap) {
  snprintf(out, cap, "acct-%d", atomic_fetch_add(&next_acct, 1));
  char b[16];
  snprintf(b, sizeof(b), "%d", balance);
  const char *p[2] = {out, b};
  PGresult *r = PQexecParams(pg, "INSERT INTO tcc_account (id, balance) VALUES ($1, $2)", 2, NULL, p, NULL, NULL, 0);
  assert_int_equal(PQresultStatus(r), PGRES_COMMAND_OK);
  PQclear(r);
}

static int global_status(const char *xid) {
  int st = -1;
  int rc = rm_tm_status(client, xid, &st);
  return rc == 0 ? st : rc;
}

/* ------------------------------------------------------------ handlers */

/* args: "ACCOUNT AMOUNT". */
static int parse_args(const char *args, char *acct, int *amount) {
  return args && sscanf(args, "%63s %d", acct, amount) == 2 ? 0 : -1;
}

static int apply(PGconn *pg, const char *sql, const char *acct, int amount, char *errmsg, size_t errlen) {
  char a[16];
  snprintf(a, sizeof(a), "%d", amount);
  const char *p[2] = {acct, a};
  PGresult *r = PQexecParams(pg, sql, 2, NULL, p, NULL, NULL, 0);
  int rc = PQresultStatus(r) == PGRES_COMMAND_OK && strcmp(PQcmdTuples(r), "1") == 0 ? RM_TCC_OK : RM_TCC_RETRY;
  if (rc != RM_TCC_OK) snprintf(errmsg, errlen, "%s", PQresultErrorMessage(r));
  PQclear(r);
  return rc;
}

static int on_confirm(const rm_tcc_call_t *call, void *arg, char *errmsg, size_t errlen) {
  (void)arg;
  char acct[64];
  int amount;
  if (parse_args(call->args, acct, &amount) != 0) {
    snprintf(errmsg, errlen, "bad args");
    return RM_TCC_FAILED;
  }
  if (atomic_load(&confirm_fail)) {
    snprintf(errmsg, errlen, "the card was declined");
    return RM_TCC_FAILED;
  }
  int rc = apply(call->pg, "UPDATE tcc_account SET balance = balance - $2, frozen = frozen - $2 WHERE id = $1", acct,
                 amount, errmsg, errlen);
  if (rc != RM_TCC_OK) return rc;
  if (atomic_load(&confirm_breaks_txn)) {
    PGresult *r = PQexec(call->pg, "SELECT 1/0");
    PQclear(r);
    return RM_TCC_OK; /* a liar: the library must not record this */
  }
  int left = atomic_load(&confirm_retries_left);
  if (left > 0 && atomic_compare_exchange_strong(&confirm_retries_left, &left, left - 1)) {
    snprintf(errmsg, errlen, "the payment service is busy");
    return RM_TCC_RETRY; /* after writing: the write must be rolled back with it */
  }
  atomic_fetch_add(&confirms, 1);
  return RM_TCC_OK;
}

static int on_cancel(const rm_tcc_call_t *call, void *arg, char *errmsg, size_t errlen) {
  (void)arg;
  char acct[64];
  int amount;
  if (parse_args(call->args, acct, &amount) != 0) {
    snprintf(errmsg, errlen, "bad args");
    return RM_TCC_FAILED;
  }
  int rc = apply(call->pg, "UPDATE tcc_account SET frozen = frozen - $2 WHERE id = $1", acct, amount, errmsg, errlen);
  if (rc == RM_TCC_OK) atomic_fetch_add(&cancels, 1);
  return rc;
}

static const rm_tcc_handlers_t handlers = {.confirm = on_confirm, .cancel = on_cancel};

/* The try: BEGIN, rm_tcc_try, the freeze; COMMIT if 'commit'.  0 or the
 * first failing code (the transaction then rolled back). */
static int try_freeze(rm_client_t *c, const char *res, PGconn *pg, const char *xid, const char *acct, int amount,
                      bool commit, int64_t *bid) {
  char args[96], a[16];
  snprintf(args, sizeof(args), "%s %d", acct, amount);
  snprintf(a, sizeof(a), "%d", amount);
  assert_true(exec_ok(pg, "BEGIN"));
  int rc = rm_tcc_try(c, xid, res, pg, args, bid);
  if (rc != 0) {
    assert_true(exec_ok(pg, "ROLLBACK"));
    return rc;
  }
  const char *p[2] = {acct, a};
  PGresult *r = PQexecParams(pg, "UPDATE tcc_account SET frozen = frozen + $2 WHERE id = $1 AND balance - frozen >= $2",
                             2, NULL, p, NULL, NULL, 0);
  bool ok = PQresultStatus(r) == PGRES_COMMAND_OK && strcmp(PQcmdTuples(r), "1") == 0;
  PQclear(r);
  if (!ok) {
    assert_true(exec_ok(pg, "ROLLBACK"));
    return RM_E_GUARD;
  }
  if (commit) assert_true(exec_ok(pg, "COMMIT"));
  return 0;
}

static rm_client_t *new_client(const char *app, const char *res) {
  char nodes[64];
  snprintf(nodes, sizeof(nodes), "127.0.0.1:%d", tcd.port);
  rm_config_t cfg = {.nodes = nodes, .token = TOKEN, .application_id = app, .request_timeout_ms = 15000,
                     .log_cb = log_cb, .log_level = RM_LOG_DEBUG};
  rm_client_t *c = NULL;
  assert_int_equal(rm_client_new(&cfg, &c), 0);
  rm_at_tuning_t t = {.lock_timeout_ms = 1000, .statement_timeout_ms = 5000};
  assert_int_equal(rm__at_tune(c, &t), 0);
  assert_int_equal(rm_tcc_resource_add(c, res, stock_url, &handlers), 0);
  for (int i = 0; i < 500 && rm_client_nodes_up(c) < 1; i++) sleep_ms(20);
  assert_int_equal(rm_client_nodes_up(c), 1);
  sleep_ms(200); /* the RegisterRM with the resource reaches the node */
  return c;
}

static int group_setup(void **state) {
  (void)state;
  stock_url = getenv("STOCK_PG_URL");
  orders_url = getenv("ORDERS_PG_URL");
  tc_url = getenv("TC_PG_URL");
  if (!stock_url || !orders_url || !tc_url) {
    fprintf(stderr, "STOCK_PG_URL/ORDERS_PG_URL/TC_PG_URL not set: run under scripts/with-servers --pg\n");
    return -1;
  }
  PGconn *s = pg_open(stock_url), *o = pg_open(orders_url);
  if (!s || !o) return -1;
  bool ok = exec_ok(s, "CREATE TABLE IF NOT EXISTS tcc_account (id text PRIMARY KEY, balance int NOT NULL,"
                       " frozen int NOT NULL DEFAULT 0, CHECK (frozen >= 0 AND frozen <= balance))") &&
            exec_ok(o, "CREATE TABLE IF NOT EXISTS tcc_order (k text PRIMARY KEY, v text)");
  PQfinish(s);
  PQfinish(o);
  if (!ok) return -1;
  static const char *const tcd_env[] = {"TC_RECOVERY_INTERVAL_MS=100", "TC_RECOVERY_RETRY_MIN_MS=50",
                                        "TC_RECOVERY_RETRY_MAX_MS=300", NULL};
  const char *level = getenv("TC_LOG_LEVEL");
  tcd_opts_t to = {.pg_url = tc_url, .token = TOKEN, .log_level = level ? level : "error", .env = tcd_env,
                   .attempts = 5, .timeout_ms = 6000};
  if (tcd_proc_start(&tcd, &to) != 0) {
    fprintf(stderr, "could not start tcd: %s\n", tcd.err);
    return -1;
  }
  char nodes[64];
  snprintf(nodes, sizeof(nodes), "127.0.0.1:%d", tcd.port);
  rm_config_t cfg = {.nodes = nodes, .token = TOKEN, .application_id = "test_rm_tcc", .request_timeout_ms = 15000,
                     .log_cb = log_cb, .log_level = RM_LOG_DEBUG};
  if (rm_client_new(&cfg, &client) != 0) return -1;
  rm_at_tuning_t t = {.lock_timeout_ms = 1000, .statement_timeout_ms = 5000};
  if (rm__at_tune(client, &t) != 0) return -1;
  if (rm_tcc_resource_add(client, RES, stock_url, &handlers) != 0 ||
      rm_resource_add(client, "orders", orders_url) != 0) {
    fprintf(stderr, "resource_add: %s\n", rm_errmsg());
    return -1;
  }
  for (int i = 0; i < 500 && rm_client_nodes_up(client) < 1; i++) sleep_ms(20);
  if (rm_client_nodes_up(client) < 1) return -1;
  sleep_ms(200);
  return 0;
}

static int group_teardown(void **state) {
  (void)state;
  rm_client_free(client);
  client = NULL;
  tcd_proc_stop(&tcd, 5000);
  return 0;
}

/* ------------------------------------------------------------ the tests */

/* Commit: rm_tm_commit returns once the confirm ran (the coordinator waits
 * for TCC phase two); rollback: the cancel gives the freeze back. */
static void test_commit_and_rollback(void **state) {
  (void)state;
  PGconn *s = pg_open(stock_url);
  assert_non_null(s);
  char acct[32], xid[RM_XID_MAX];
  new_account(s, 100, acct, sizeof(acct));
  int c0 = atomic_load(&confirms), k0 = atomic_load(&cancels);

  assert_int_equal(rm_tm_begin(client, 30000, "tcc_commit", xid), 0);
  int64_t bid = 0;
  assert_int_equal(try_freeze(client, RES, s, xid, acct, 30, true, &bid), 0);
  assert_true(bid > 0);
  assert_int_equal(fence(s, xid, bid), 1);
  assert_int_equal(acct_col(s, acct, "frozen"), 30);
  int st = 0;
  assert_int_equal(rm_tm_commit(client, xid, &st), 0);
  assert_int_equal(st, RM_GS_COMMITTED);
  /* No wait: applied when the TM heard "committed". */
  assert_int_equal(fence(s, xid, bid), 2);
  assert_int_equal(acct_col(s, acct, "balance"), 70);
  assert_int_equal(acct_col(s, acct, "frozen"), 0);
  assert_int_equal(atomic_load(&confirms), c0 + 1);
  assert_int_equal(atomic_load(&cancels), k0);

  char xid2[RM_XID_MAX];
  assert_int_equal(rm_tm_begin(client, 30000, "tcc_rollback", xid2), 0);
  assert_int_equal(try_freeze(client, RES, s, xid2, acct, 50, true, &bid), 0);
  assert_int_equal(acct_col(s, acct, "frozen"), 50);
  assert_int_equal(rm_tm_rollback(client, xid2, &st), 0);
  assert_int_equal(st, RM_GS_ROLLBACKED);
  assert_int_equal(fence(s, xid2, bid), 3);
  assert_int_equal(acct_col(s, acct, "balance"), 70);
  assert_int_equal(acct_col(s, acct, "frozen"), 0);
  assert_int_equal(atomic_load(&cancels), k0 + 1);
  assert_int_equal(atomic_load(&confirms), c0 + 1);

  /* A freeze over the balance fails in the try's own transaction: the
   * branch was registered, nothing was tried, the rollback is empty. */
  char xid3[RM_XID_MAX];
  assert_int_equal(rm_tm_begin(client, 30000, "tcc_too_much", xid3), 0);
  assert_int_equal(try_freeze(client, RES, s, xid3, acct, 500, true, &bid), RM_E_GUARD);
  assert_int_equal(fence(s, xid3, bid), LLONG_MIN);
  assert_int_equal(rm_tm_rollback(client, xid3, &st), 0);
  assert_int_equal(fence(s, xid3, bid), 4);
  assert_int_equal(atomic_load(&cancels), k0 + 1); /* no handler for an empty rollback */
  assert_int_equal(acct_col(s, acct, "frozen"), 0);
  PQfinish(s);
}

/* The cancel arrives between the try's registration and its fence row:
 * recorded as an empty rollback, and the try is then refused. */
typedef struct pause_ctx {
  int rc, status;
} pause_ctx_t;

static void rollback_in_between(const char *xid, int64_t bid, void *arg) {
  (void)bid;
  pause_ctx_t *p = arg;
  p->rc = rm_tm_rollback(client, xid, &p->status);
}

static void test_cancel_before_try(void **state) {
  (void)state;
  PGconn *s = pg_open(stock_url);
  assert_non_null(s);
  char acct[32], xid[RM_XID_MAX];
  new_account(s, 10, acct, sizeof(acct));
  int k0 = atomic_load(&cancels);
  assert_int_equal(rm_tm_begin(client, 30000, "tcc_cancel_first", xid), 0);
  pause_ctx_t p = {-1, -1};
  rm__tcc_failpoint_arg = &p;
  rm__tcc_failpoint_after_register = rollback_in_between;
  int64_t bid = 0;
  int rc = try_freeze(client, RES, s, xid, acct, 5, true, &bid);
  rm__tcc_failpoint_after_register = NULL;
  assert_int_equal(p.rc, 0);
  assert_int_equal(p.status, RM_GS_ROLLBACKED);
  assert_int_equal(rc, RM_E_TCC_FENCE); /* anti-hanging */
  assert_non_null(strstr(rm_errmsg(), "before its try"));
  assert_int_equal(bid, 0);
  /* Nothing frozen, the row says why, no cancel handler ran. */
  assert_int_equal(acct_col(s, acct, "frozen"), 0);
  PGconn *w = pg_open(stock_url);
  long long st4 = q_ll(w, "SELECT status FROM tcc_fence WHERE xid = $1", xid, NULL);
  assert_int_equal(st4, 4);
  assert_int_equal(atomic_load(&cancels), k0);
  assert_int_equal(global_status(xid), RM_GS_ROLLBACKED);
  PQfinish(w);
  PQfinish(s);
}

/* The cancel meets the try's row inserted but not committed: it waits on
 * the key, then cancels the committed try. */
typedef struct rb_arg {
  const char *xid;
  int rc, status;
} rb_arg_t;

static void *rollback_thread(void *arg) {
  rb_arg_t *a = arg;
  a->rc = rm_tm_rollback(client, a->xid, &a->status);
  return NULL;
}

static void test_cancel_meets_uncommitted_try(void **state) {
  (void)state;
  PGconn *s = pg_open(stock_url), *w = pg_open(stock_url);
  assert_non_null(s);
  char acct[32], xid[RM_XID_MAX];
  new_account(s, 10, acct, sizeof(acct));
  int k0 = atomic_load(&cancels);
  assert_int_equal(rm_tm_begin(client, 30000, "tcc_cancel_waits", xid), 0);
  int64_t bid = 0;
  assert_int_equal(try_freeze(client, RES, s, xid, acct, 4, false, &bid), 0);
  rb_arg_t a = {xid, -1, -1};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, rollback_thread, &a), 0);
  sleep_ms(300); /* the cancel is waiting on the try's uncommitted key */
  assert_true(exec_ok(s, "COMMIT"));
  pthread_join(th, NULL);
  /* Within the phase-two lock timeout it cancels at once; past it, the
   * coordinator's retry does: either way, the end is the same. */
  assert_int_equal(WAIT_EQ(RM_GS_ROLLBACKED, 20, global_status(xid)), RM_GS_ROLLBACKED);
  assert_int_equal(WAIT_EQ(3, 10, fence(w, xid, bid)), 3);
  assert_int_equal(acct_col(w, acct, "frozen"), 0);
  assert_int_equal(atomic_load(&cancels), k0 + 1);
  PQfinish(s);
  PQfinish(w);
}

/* Phase two delivered twice, concurrently, late, and against the grain. */
typedef struct p2_arg {
  rm_phase2_req_t req;
  int status, code;
} p2_arg_t;

static void *phase2_thread(void *arg) {
  p2_arg_t *a = arg;
  char msg[512];
  a->status = rm__at_phase2(client, &a->req, &a->code, msg, sizeof(msg));
  return NULL;
}

static void test_duplicate_phase2(void **state) {
  (void)state;
  PGconn *s = pg_open(stock_url);
  assert_non_null(s);
  char acct[32], xid[RM_XID_MAX];
  new_account(s, 100, acct, sizeof(acct));
  int c0 = atomic_load(&confirms), k0 = atomic_load(&cancels);
  /* Tried, left undecided at the TC: two concurrent confirms straight to
   * the RM confirm once. */
  assert_int_equal(rm_tm_begin(client, 30000, "tcc_dup", xid), 0);
  int64_t bid = 0;
  assert_int_equal(try_freeze(client, RES, s, xid, acct, 10, true, &bid), 0);
  p2_arg_t a[2];
  pthread_t th[2];
  for (int i = 0; i < 2; i++) {
    a[i] = (p2_arg_t){{.commit = true, .xid = xid, .branch_id = bid, .resource_id = RES, .branch_type = TXP_BT_TCC},
                      -1, -1};
    assert_int_equal(pthread_create(&th[i], NULL, phase2_thread, &a[i]), 0);
  }
  for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < 2; i++) assert_int_equal(a[i].status, TXP_BS_PHASE2_COMMITTED);
  assert_int_equal(atomic_load(&confirms), c0 + 1);
  assert_int_equal(acct_col(s, acct, "balance"), 90);
  /* The TC's own commit: answered from the row. */
  int st = 0;
  assert_int_equal(rm_tm_commit(client, xid, &st), 0);
  assert_int_equal(atomic_load(&confirms), c0 + 1);
  assert_int_equal(acct_col(s, acct, "balance"), 90);
  /* A cancel of a confirmed branch: refused for good, nothing changes. */
  int code = 0;
  char msg[512];
  rm_phase2_req_t cancel = a[0].req;
  cancel.commit = false;
  assert_int_equal(rm__at_phase2(client, &cancel, &code, msg, sizeof(msg)), TXP_BS_PHASE2_ROLLBACK_FAILED_UNRETRYABLE);
  assert_int_equal(code, RM_E_TCC_FENCE);
  assert_non_null(strstr(msg, "confirmed"));
  assert_int_equal(atomic_load(&cancels), k0);
  assert_int_equal(acct_col(s, acct, "balance"), 90);

  /* Cancels twice; a confirm after them refused. */
  char xid2[RM_XID_MAX];
  assert_int_equal(rm_tm_begin(client, 30000, "tcc_dup_cancel", xid2), 0);
  assert_int_equal(try_freeze(client, RES, s, xid2, acct, 20, true, &bid), 0);
  assert_int_equal(rm_tm_rollback(client, xid2, &st), 0);
  rm_phase2_req_t c2 = {.commit = false, .xid = xid2, .branch_id = bid, .resource_id = RES,
                        .branch_type = TXP_BT_TCC};
  assert_int_equal(rm__at_phase2(client, &c2, &code, msg, sizeof(msg)), TXP_BS_PHASE2_ROLLBACKED);
  assert_int_equal(rm__at_phase2(client, &c2, &code, msg, sizeof(msg)), TXP_BS_PHASE2_ROLLBACKED);
  assert_int_equal(atomic_load(&cancels), k0 + 1);
  assert_int_equal(acct_col(s, acct, "frozen"), 0);
  c2.commit = true;
  assert_int_equal(rm__at_phase2(client, &c2, &code, msg, sizeof(msg)), TXP_BS_PHASE2_COMMIT_FAILED_UNRETRYABLE);
  assert_int_equal(code, RM_E_TCC_FENCE);

  /* A confirm of a branch whose try never committed: retryable. */
  rm_phase2_req_t ghost = {.commit = true, .xid = "127.0.0.1:1:434343", .branch_id = 987650001, .resource_id = RES,
                           .branch_type = TXP_BT_TCC};
  assert_int_equal(rm__at_phase2(client, &ghost, &code, msg, sizeof(msg)), TXP_BS_PHASE2_COMMIT_FAILED_RETRYABLE);
  assert_int_equal(code, RM_E_STATE);
  assert_int_equal(fence(s, ghost.xid, ghost.branch_id), LLONG_MIN);
  /* A TCC branch of a resource without TCC handlers: retryable (an RM
   * that serves it may come). */
  ghost.resource_id = "orders";
  assert_int_equal(rm__at_phase2(client, &ghost, &code, msg, sizeof(msg)), TXP_BS_PHASE2_COMMIT_FAILED_RETRYABLE);
  assert_int_equal(code, RM_E_NOT_SUPPORTED);
  PQfinish(s);
}

/* A confirm that asks for a retry (after writing: rolled back with it),
 * one that breaks its transaction and says OK (not recorded), and one that
 * fails for good (CommitFailed for an operator). */
static void test_handler_failures(void **state) {
  (void)state;
  PGconn *s = pg_open(stock_url);
  assert_non_null(s);
  char acct[32], xid[RM_XID_MAX];
  new_account(s, 100, acct, sizeof(acct));
  int c0 = atomic_load(&confirms);

  atomic_store(&confirm_retries_left, 2);
  assert_int_equal(rm_tm_begin(client, 30000, "tcc_retry", xid), 0);
  int64_t bid = 0;
  assert_int_equal(try_freeze(client, RES, s, xid, acct, 10, true, &bid), 0);
  int st = 0;
  assert_int_equal(rm_tm_commit(client, xid, &st), 0); /* decided; phase two retries */
  assert_int_equal(WAIT_EQ(2, 20, fence(s, xid, bid)), 2);
  assert_int_equal(atomic_load(&confirm_retries_left), 0);
  assert_int_equal(atomic_load(&confirms), c0 + 1);
  assert_int_equal(acct_col(s, acct, "balance"), 90); /* once, not three times */
  assert_int_equal(WAIT_EQ(RM_GS_COMMITTED, 20, global_status(xid)), RM_GS_COMMITTED);

  atomic_store(&confirm_breaks_txn, 1);
  char xid2[RM_XID_MAX];
  assert_int_equal(rm_tm_begin(client, 30000, "tcc_liar", xid2), 0);
  assert_int_equal(try_freeze(client, RES, s, xid2, acct, 10, true, &bid), 0);
  assert_int_equal(rm_tm_commit(client, xid2, &st), 0);
  sleep_ms(300);
  assert_int_equal(fence(s, xid2, bid), 1); /* still tried: nothing recorded */
  assert_int_equal(acct_col(s, acct, "balance"), 90);
  atomic_store(&confirm_breaks_txn, 0);
  assert_int_equal(WAIT_EQ(2, 20, fence(s, xid2, bid)), 2);
  assert_int_equal(acct_col(s, acct, "balance"), 80);

  atomic_store(&confirm_fail, 1);
  char xid3[RM_XID_MAX];
  assert_int_equal(rm_tm_begin(client, 30000, "tcc_declined", xid3), 0);
  assert_int_equal(try_freeze(client, RES, s, xid3, acct, 10, true, &bid), 0);
  int rc = rm_tm_commit(client, xid3, &st);
  atomic_store(&confirm_fail, 0);
  assert_int_equal(rc, RM_E_COMMIT_FAILED);
  assert_int_equal(st, RM_GS_COMMIT_FAILED);
  assert_int_equal(fence(s, xid3, bid), 1);
  assert_int_equal(acct_col(s, acct, "frozen"), 10); /* held for the operator */
  PQfinish(s);
}

/* AT and TCC branches in one global: both commit, or both roll back. */
static int at_set(const char *xid, const char *k, const char *v) {
  PGconn *o = pg_open(orders_url);
  char sql[160];
  snprintf(sql, sizeof(sql), "INSERT INTO tcc_order (k, v) VALUES ('%s', 'NEW') ON CONFLICT DO NOTHING", k);
  if (!exec_ok(o, sql) || !exec_ok(o, "BEGIN")) return -1;
  rm_branch_t *b = NULL;
  int rc = rm_at_open(client, xid, "orders", o, &b);
  const char *keys[1] = {k}, *cols[1] = {"v"}, *vals[1] = {v};
  if (rc == 0) rc = rm_at_update(b, "tcc_order", keys, 1, cols, vals);
  if (rc == 0) rc = rm_at_prepare(b, NULL);
  if (rc == 0 && !exec_ok(o, "COMMIT")) rc = RM_E_DB;
  if (rc != 0) exec_ok(o, "ROLLBACK");
  if (b) rm_at_close(b, rc == 0);
  PQfinish(o);
  return rc;
}

static char *order_v(const char *k) {
  PGconn *o = pg_open(orders_url);
  const char *p[1] = {k};
  PGresult *r = PQexecParams(o, "SELECT v FROM tcc_order WHERE k = $1", 1, NULL, p, NULL, NULL, 0);
  char *v = PQntuples(r) == 1 ? strdup(PQgetvalue(r, 0, 0)) : NULL;
  PQclear(r);
  PQfinish(o);
  return v;
}

static void test_mixed_at_and_tcc(void **state) {
  (void)state;
  PGconn *s = pg_open(stock_url);
  assert_non_null(s);
  char acct[32], xid[RM_XID_MAX];
  new_account(s, 100, acct, sizeof(acct));
  for (int commit = 1; commit >= 0; commit--) {
    char k[64];
    snprintf(k, sizeof(k), "order-%s-%d", acct, commit);
    assert_int_equal(rm_tm_begin(client, 30000, "tcc_mixed", xid), 0);
    assert_int_equal(at_set(xid, k, "PAID"), 0);
    int64_t bid = 0;
    assert_int_equal(try_freeze(client, RES, s, xid, acct, 25, true, &bid), 0);
    int st = 0;
    if (commit) {
      assert_int_equal(rm_tm_commit(client, xid, &st), 0);
      assert_int_equal(fence(s, xid, bid), 2);
      assert_int_equal(acct_col(s, acct, "balance"), 75);
    } else {
      assert_int_equal(rm_tm_rollback(client, xid, &st), 0);
      assert_int_equal(st, RM_GS_ROLLBACKED);
      assert_int_equal(fence(s, xid, bid), 3);
      assert_int_equal(acct_col(s, acct, "balance"), 75);
    }
    assert_int_equal(acct_col(s, acct, "frozen"), 0);
    char *v = order_v(k);
    assert_non_null(v);
    assert_string_equal(v, commit ? "PAID" : "NEW");
    free(v);
  }
  PQfinish(s);
}

/* The RM that tried is gone before the confirm: the global is committed
 * as a decision and retried; the next RM of the resource confirms it. */
static void test_rm_gone_between_try_and_confirm(void **state) {
  (void)state;
  PGconn *s = pg_open(stock_url);
  assert_non_null(s);
  char acct[32], xid[RM_XID_MAX];
  new_account(s, 100, acct, sizeof(acct));
  int c0 = atomic_load(&confirms);
  rm_client_t *c2 = new_client("test_rm_tcc_b", RES_ALONE);
  assert_int_equal(rm_tm_begin(client, 30000, "tcc_rm_gone", xid), 0);
  int64_t bid = 0;
  assert_int_equal(try_freeze(c2, RES_ALONE, s, xid, acct, 40, true, &bid), 0);
  rm_client_free(c2); /* the RM dies with its try committed */
  int st = 0;
  assert_int_equal(rm_tm_commit(client, xid, &st), 0);
  sleep_ms(300);
  assert_int_equal(fence(s, xid, bid), 1);
  assert_int_equal(atomic_load(&confirms), c0);
  assert_int_equal(acct_col(s, acct, "frozen"), 40);
  rm_client_t *c3 = new_client("test_rm_tcc_b", RES_ALONE);
  assert_int_equal(WAIT_EQ(2, 20, fence(s, xid, bid)), 2);
  assert_int_equal(atomic_load(&confirms), c0 + 1);
  assert_int_equal(acct_col(s, acct, "balance"), 60);
  assert_int_equal(acct_col(s, acct, "frozen"), 0);
  assert_int_equal(WAIT_EQ(RM_GS_COMMITTED, 20, global_status(xid)), RM_GS_COMMITTED);
  rm_client_free(c3);
  PQfinish(s);
}

/* tcd is killed after deciding the commit, before the confirm got through
 * (it keeps asking for a retry); the restarted node finishes it. */
static void test_tc_killed_after_decision(void **state) {
  (void)state;
  PGconn *s = pg_open(stock_url);
  assert_non_null(s);
  char acct[32], xid[RM_XID_MAX];
  new_account(s, 100, acct, sizeof(acct));
  int c0 = atomic_load(&confirms);
  atomic_store(&confirm_retries_left, 1000000);
  assert_int_equal(rm_tm_begin(client, 30000, "tcc_tc_killed", xid), 0);
  int64_t bid = 0;
  assert_int_equal(try_freeze(client, RES, s, xid, acct, 15, true, &bid), 0);
  int st = 0;
  assert_int_equal(rm_tm_commit(client, xid, &st), 0);
  tcd_proc_kill(&tcd);
  atomic_store(&confirm_retries_left, 0);
  assert_int_equal(fence(s, xid, bid), 1);
  assert_int_equal(tcd_proc_restart(&tcd), 0);
  assert_int_equal(WAIT_EQ(2, 30, fence(s, xid, bid)), 2);
  assert_int_equal(atomic_load(&confirms), c0 + 1);
  assert_int_equal(acct_col(s, acct, "balance"), 85);
  assert_int_equal(WAIT_EQ(RM_GS_COMMITTED, 20, global_status(xid)), RM_GS_COMMITTED);
  PQfinish(s);
}

/* The retention sweep takes finished rows past the retention, never a
 * tried one. */
static void test_sweep(void **state) {
  (void)state;
  PGconn *s = pg_open(stock_url);
  assert_non_null(s);
  char acct[32], xid[RM_XID_MAX], xid2[RM_XID_MAX];
  new_account(s, 100, acct, sizeof(acct));
  int64_t done = 0, open = 0;
  assert_int_equal(rm_tm_begin(client, 30000, "tcc_sweep_done", xid), 0);
  assert_int_equal(try_freeze(client, RES, s, xid, acct, 1, true, &done), 0);
  int st = 0;
  assert_int_equal(rm_tm_commit(client, xid, &st), 0);
  assert_int_equal(rm_tm_begin(client, 30000, "tcc_sweep_open", xid2), 0);
  assert_int_equal(try_freeze(client, RES, s, xid2, acct, 1, true, &open), 0);
  assert_true(exec_ok(s, "UPDATE tcc_fence SET modified = now() - interval '3 days'"));
  long long removed = 0;
  assert_int_equal(rm__at_sweep(client, &removed), 0);
  assert_true(removed >= 1);
  assert_int_equal(fence(s, xid, done), LLONG_MIN);
  assert_int_equal(fence(s, xid2, open), 1);
  assert_int_equal(rm_tm_rollback(client, xid2, &st), 0);
  assert_int_equal(fence(s, xid2, open), 3);
  PQfinish(s);
}

static void test_bad_input(void **state) {
  (void)state;
  PGconn *s = pg_open(stock_url);
  assert_non_null(s);
  rm_tcc_handlers_t half = {.confirm = on_confirm};
  assert_int_equal(rm_tcc_resource_add(NULL, RES, stock_url, &handlers), RM_E_INVALID);
  assert_int_equal(rm_tcc_resource_add(client, RES, stock_url, NULL), RM_E_INVALID);
  assert_int_equal(rm_tcc_resource_add(client, RES, stock_url, &half), RM_E_INVALID);
  assert_int_equal(rm_tcc_resource_add(client, RES, stock_url, &handlers), RM_E_INVALID); /* twice */
  assert_non_null(strstr(rm_errmsg(), "already"));

  /* A database without the fence (the RM schema at version 1). */
  PGconn *t = pg_open(tc_url);
  assert_true(exec_ok(t, "DROP DATABASE IF EXISTS tcc_nofence") && exec_ok(t, "CREATE DATABASE tcc_nofence"));
  PQfinish(t);
  char url[512];
  snprintf(url, sizeof(url), "%s", stock_url);
  char *slash = strrchr(url, '/');
  assert_non_null(slash);
  char *q = strchr(slash, '?');
  char tail[256] = "";
  if (q) snprintf(tail, sizeof(tail), "%s", q);
  snprintf(slash, sizeof(url) - (size_t)(slash - url), "/tcc_nofence%s", tail);
  PGconn *n = pg_open(url);
  assert_non_null(n);
  assert_true(exec_ok(n, "CREATE TABLE undo_log (id bigserial PRIMARY KEY, branch_id bigint, xid text, context text,"
                         " rollback_info jsonb, log_status int, log_created timestamptz, log_modified timestamptz)"));
  PQfinish(n);
  assert_int_equal(rm_tcc_resource_add(client, "nofence", url, &handlers), RM_E_NO_TABLE);
  assert_non_null(strstr(rm_errmsg(), "txc-db-migrate"));

  char xid[RM_XID_MAX];
  assert_int_equal(rm_tm_begin(client, 30000, "tcc_bad", xid), 0);
  /* Not in a transaction block. */
  assert_int_equal(rm_tcc_try(client, xid, RES, s, "x 1", NULL), RM_E_STATE);
  assert_true(exec_ok(s, "BEGIN"));
  assert_int_equal(rm_tcc_try(client, xid, "orders", s, "x 1", NULL), RM_E_INVALID); /* no handlers */
  assert_int_equal(rm_tcc_try(client, xid, "nosuch", s, "x 1", NULL), RM_E_INVALID);
  assert_int_equal(rm_tcc_try(client, "", RES, s, "x 1", NULL), RM_E_INVALID);
  assert_int_equal(rm_tcc_try(NULL, xid, RES, s, "x 1", NULL), RM_E_INVALID);
  char *big = malloc(70000);
  memset(big, 'a', 69999);
  big[69999] = '\0';
  assert_int_equal(rm_tcc_try(client, xid, RES, s, big, NULL), RM_E_INVALID);
  free(big);
  /* An xid the coordinator does not know: refused at registration. */
  int64_t bid = 7;
  assert_int_not_equal(rm_tcc_try(client, "127.0.0.1:1:999999", RES, s, "x 1", &bid), 0);
  assert_int_equal(bid, 0);
  assert_true(exec_ok(s, "ROLLBACK"));
  int st = 0;
  assert_int_equal(rm_tm_rollback(client, xid, &st), 0);
  PQfinish(s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_commit_and_rollback),
    cmocka_unit_test(test_cancel_before_try),
    cmocka_unit_test(test_cancel_meets_uncommitted_try),
    cmocka_unit_test(test_duplicate_phase2),
    cmocka_unit_test(test_handler_failures),
    cmocka_unit_test(test_mixed_at_and_tcc),
    cmocka_unit_test(test_rm_gone_between_try_and_confirm),
    cmocka_unit_test(test_sweep),
    cmocka_unit_test(test_bad_input),
    cmocka_unit_test(test_tc_killed_after_decision),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
