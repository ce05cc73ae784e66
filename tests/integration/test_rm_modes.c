/*
 * test_rm_modes.c - TCC and XA branches (tcc/, xa/, fence/ of librmclient)
 * against a real tcd and the real stock and orders databases of
 * scripts/with-servers --pg: the fixture (one tcd, one client serving the
 * TCC resource "wallet", the XA resource "ledger" and the AT resource
 * "orders", all but orders on the stock database), its helpers and main;
 * the tests are in test_rm_tcc.c and test_rm_xa.c (rm_modes_fixture.h).
 *
 * The business: an account with a balance.  TCC: the try freezes an
 * amount (frozen + n, checked against the balance), the confirm spends it
 * (balance - n, frozen - n), the cancel unfreezes it (frozen - n), each in
 * the fence's local transaction on the connection it is given.  XA: the
 * branch spends from the balance in its own transaction, then prepares.
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
#include "rm_modes_fixture.h"
#include "rm_tcc.h"
#include "tcd_proc.h"
#include "txp_status.h"

const char *stock_url, *orders_url, *tc_url;
tcd_proc_t tcd;
rm_client_t *client;
char admin_socket[108];
static atomic_int next_acct = 1;

/* What the handlers did, and what a test asks of them. */
atomic_int confirms, cancels;
atomic_int confirm_retries_left;
atomic_int confirm_fail;
atomic_int confirm_breaks_txn;

/* ------------------------------------------------------------- helpers */

/* First value of a query with up to 2 parameters; LLONG_MIN: no row or
 * NULL; LLONG_MIN + 1: error. */
long long q_ll(PGconn *pg, const char *sql, const char *p1, const char *p2) {
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

long long fence(PGconn *pg, const char *xid, int64_t bid) {
  char b[24];
  snprintf(b, sizeof(b), "%lld", (long long)bid);
  return q_ll(pg, "SELECT status FROM branch_fence WHERE xid = $1 AND branch_id = $2", xid, b);
}

long long acct_col(PGconn *pg, const char *acct, const char *col) {
  char sql[128];
  snprintf(sql, sizeof(sql), "SELECT %s FROM tcc_account WHERE id = $1", col);
  return q_ll(pg, sql, acct, NULL);
}

/* A new account with 'balance'; its id in 'out'. */
void new_account(PGconn *pg, int balance, char *out, size_t cap) {
  snprintf(out, cap, "acct-%d", atomic_fetch_add(&next_acct, 1));
  char b[16];
  snprintf(b, sizeof(b), "%d", balance);
  const char *p[2] = {out, b};
  PGresult *r = PQexecParams(pg, "INSERT INTO tcc_account (id, balance) VALUES ($1, $2)", 2, NULL, p, NULL, NULL, 0);
  assert_int_equal(PQresultStatus(r), PGRES_COMMAND_OK);
  PQclear(r);
}

PGconn *open_with_account(int balance, char *acct) {
  PGconn *pg = itest_pg(stock_url);
  new_account(pg, balance, acct, ACCT_MAX);
  return pg;
}

void expect_account_at(PGconn *pg, const char *acct, long long balance, long long frozen, const char *file, int line) {
  _assert_int_equal(cast_to_largest_integral_type(acct_col(pg, acct, "balance")),
                    cast_to_largest_integral_type(balance), file, line);
  _assert_int_equal(cast_to_largest_integral_type(acct_col(pg, acct, "frozen")), cast_to_largest_integral_type(frozen),
                    file, line);
}

void begin_global(const char *name, char *xid) { assert_int_equal(rm_tm_begin(client, 30000, name, xid), 0); }

int commit_ok(const char *xid) {
  int st = 0;
  assert_int_equal(rm_tm_commit(client, xid, &st), 0);
  return st;
}

int rollback_ok(const char *xid) {
  int st = 0;
  assert_int_equal(rm_tm_rollback(client, xid, &st), 0);
  return st;
}

int global_status(const char *xid) {
  int st = -1;
  int rc = rm_tm_status(client, xid, &st);
  return rc == 0 ? st : rc;
}

/* ------------------------------------------------------------ handlers */

/* Apply the call's args, "ACCOUNT AMOUNT", with 'sql' ($1 the account,
 * $2 the amount) unless 'declined': RM_TCC_OK; RM_TCC_FAILED for bad args
 * or declined (errmsg says which); RM_TCC_RETRY when the statement did not
 * change exactly one row. */
static int apply_call(const rm_tcc_call_t *call, const char *sql, bool declined, char *errmsg, size_t errlen) {
  char acct[64];
  int amount;
  if (!call->args || sscanf(call->args, "%63s %d", acct, &amount) != 2) {
    snprintf(errmsg, errlen, "bad args");
    return RM_TCC_FAILED;
  }
  if (declined) {
    snprintf(errmsg, errlen, "the card was declined");
    return RM_TCC_FAILED;
  }
  char a[16];
  snprintf(a, sizeof(a), "%d", amount);
  const char *p[2] = {acct, a};
  PGresult *r = PQexecParams(call->pg, sql, 2, NULL, p, NULL, NULL, 0);
  int rc = PQresultStatus(r) == PGRES_COMMAND_OK && strcmp(PQcmdTuples(r), "1") == 0 ? RM_TCC_OK : RM_TCC_RETRY;
  if (rc != RM_TCC_OK) snprintf(errmsg, errlen, "%s", PQresultErrorMessage(r));
  PQclear(r);
  return rc;
}

int on_confirm(const rm_tcc_call_t *call, void *arg, char *errmsg, size_t errlen) {
  (void)arg;
  int rc = apply_call(call, "UPDATE tcc_account SET balance = balance - $2, frozen = frozen - $2 WHERE id = $1",
                      atomic_load(&confirm_fail), errmsg, errlen);
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

int on_cancel(const rm_tcc_call_t *call, void *arg, char *errmsg, size_t errlen) {
  (void)arg;
  int rc = apply_call(call, "UPDATE tcc_account SET frozen = frozen - $2 WHERE id = $1", false, errmsg, errlen);
  if (rc == RM_TCC_OK) atomic_fetch_add(&cancels, 1);
  return rc;
}

const rm_tcc_handlers_t tcc_handlers = {.confirm = on_confirm, .cancel = on_cancel};

/* The try: BEGIN, rm_tcc_try, the freeze; COMMIT if 'commit'.  0 or the
 * first failing code (the transaction then rolled back). */
int try_freeze(rm_client_t *c, const char *res, PGconn *pg, const char *xid, const char *acct, int amount,
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

int64_t begin_and_freeze(PGconn *pg, const char *name, const char *acct, int amount, char *xid) {
  begin_global(name, xid);
  int64_t bid = 0;
  assert_int_equal(try_freeze(client, RES, pg, xid, acct, amount, true, &bid), 0);
  return bid;
}

rm_client_t *new_client(const char *app, const char *tcc_res, const char *xa_res) {
  return new_client_saga(app, tcc_res, xa_res, NULL);
}

rm_client_t *new_client_saga(const char *app, const char *tcc_res, const char *xa_res, const char *saga_res) {
  char nodes[64];
  snprintf(nodes, sizeof(nodes), "127.0.0.1:%d", tcd.port);
  rm_config_t cfg = {.nodes = nodes, .token = TOKEN, .application_id = app, .request_timeout_ms = 15000,
                     .log_cb = log_cb, .log_level = RM_LOG_DEBUG};
  rm_client_t *c = NULL;
  assert_int_equal(rm_client_new(&cfg, &c), 0);
  rm_at_tuning_t t = {.lock_timeout_ms = 1000, .statement_timeout_ms = 5000};
  assert_int_equal(rm__at_tune(c, &t), 0);
  if (tcc_res) assert_int_equal(rm_tcc_resource_add(c, tcc_res, stock_url, &tcc_handlers), 0);
  if (xa_res) assert_int_equal(rm_xa_resource_add(c, xa_res, stock_url), 0);
  if (saga_res) assert_int_equal(rm_saga_resource_add(c, saga_res, stock_url, &saga_handlers), 0);
  for (int i = 0; i < 500 && rm_client_nodes_up(c) < 1; i++) sleep_ms(20);
  assert_int_equal(rm_client_nodes_up(c), 1);
  sleep_ms(200); /* the RegisterRM with the resources reaches the node */
  return c;
}

static int group_setup(void **state) {
  (void)state;
  if (!itest_urls(&orders_url, &stock_url, &tc_url)) return -1;
  PGconn *s = pg_open(stock_url), *o = pg_open(orders_url);
  if (!s || !o) return -1;
  bool ok = exec_ok(s, "CREATE TABLE IF NOT EXISTS tcc_account (id text PRIMARY KEY, balance int NOT NULL,"
                       " frozen int NOT NULL DEFAULT 0, CHECK (frozen >= 0 AND frozen <= balance))") &&
            exec_ok(s, "CREATE TABLE IF NOT EXISTS saga_log (seq bigserial PRIMARY KEY, xid text NOT NULL,"
                       " step text NOT NULL, kind text NOT NULL)") &&
            exec_ok(o, "CREATE TABLE IF NOT EXISTS tcc_order (k text PRIMARY KEY, v text)");
  PQfinish(s);
  PQfinish(o);
  if (!ok) return -1;
  /* An admin socket too: the saga tests read `tcctl show`. */
  snprintf(admin_socket, sizeof(admin_socket), "/tmp/txc-rm-modes-%d.sock", (int)getpid());
  static char admin_env[sizeof(admin_socket) + 32];
  snprintf(admin_env, sizeof(admin_env), "TC_ADMIN_SOCKET=%s", admin_socket);
  rm_config_t cfg = {.token = TOKEN, .application_id = "test_rm_modes", .request_timeout_ms = 15000,
                     .log_cb = log_cb, .log_level = RM_LOG_DEBUG};
  if (itest_tcd_start(&tcd, tc_url, TOKEN, 300, admin_env) != 0 || itest_client_new(&tcd, cfg, &client) != 0)
    return -1;
  /* Phase two waits up to 5 s for a row lock here (itest_client_new's
   * 1 s, the library's default being 5 s): test_saga_two_drives holds a
   * delivery on the other one's fence row while the test steps on, and on
   * a loaded machine that took more than a second; the waits the TCC and
   * XA tests provoke end by the holder's commit, well before either. */
  rm_at_tuning_t phase2 = {.lock_timeout_ms = 5000};
  if (rm__at_tune(client, &phase2) != 0) return -1;
  if (rm_tcc_resource_add(client, RES, stock_url, &tcc_handlers) != 0 ||
      rm_xa_resource_add(client, XA_RES, stock_url) != 0 || rm_resource_add(client, "orders", orders_url) != 0 ||
      rm_saga_resource_add(client, SAGA_RES, stock_url, &saga_handlers) != 0) {
    fprintf(stderr, "resource_add: %s\n", rm_errmsg());
    return -1;
  }
  return itest_client_ready(client);
}

static int group_teardown(void **state) {
  (void)state;
  itest_group_stop(&client, &tcd);
  return 0;
}

/* -------------------------------------------------- shared by the tests */

struct rollback_run {
  rb_arg_t arg;
  pthread_t thread;
};

static void *rollback_thread(void *arg) {
  rb_arg_t *a = arg;
  a->rc = rm_tm_rollback(client, a->xid, &a->status);
  return NULL;
}

struct rollback_run *rollback_start(const char *xid) {
  struct rollback_run *run = calloc(1, sizeof(*run));
  assert_non_null(run);
  run->arg = (rb_arg_t){xid, -1, -1};
  assert_int_equal(pthread_create(&run->thread, NULL, rollback_thread, &run->arg), 0);
  return run;
}

void rollback_join(struct rollback_run *run) {
  pthread_join(run->thread, NULL);
  free(run);
}

static void rollback_at_failpoint(const char *xid, int64_t bid, void *arg) {
  (void)bid;
  rb_arg_t *a = arg;
  a->rc = rm_tm_rollback(client, xid, &a->status);
}

int branch_with_rollback_at_registration(after_register_fn *hook, void **hook_arg, branch_fn branch, const char *res,
                                         PGconn *pg, const char *xid, const char *acct, int amount, int64_t *bid) {
  rb_arg_t rollback = {xid, -1, -1};
  *hook_arg = &rollback;
  *hook = rollback_at_failpoint;
  int rc = branch(client, res, pg, xid, acct, amount, true, bid);
  *hook = NULL;
  assert_int_equal(rollback.rc, 0);
  assert_int_equal(rollback.status, RM_GS_ROLLBACKED);
  return rc;
}

void *phase2_thread(void *arg) {
  p2_arg_t *a = arg;
  char msg[512];
  a->status = rm__at_phase2(client, &a->req, &a->code, msg, sizeof(msg));
  return NULL;
}

rm_phase2_req_t phase2_req(bool commit, const char *xid, int64_t bid, const char *res, int branch_type) {
  return (rm_phase2_req_t){
    .commit = commit, .xid = xid, .branch_id = bid, .resource_id = res, .branch_type = branch_type};
}

void phase2_twice_at_once(rm_phase2_req_t req, p2_arg_t out[2]) {
  pthread_t th[2];
  for (int i = 0; i < 2; i++) {
    out[i] = (p2_arg_t){req, -1, -1};
    assert_int_equal(pthread_create(&th[i], NULL, phase2_thread, &out[i]), 0);
  }
  for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
}

int at_set(const char *xid, const char *k, const char *v) {
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

void expect_order(const char *k, const char *want) {
  PGconn *o = itest_pg(orders_url);
  const char *p[1] = {k};
  PGresult *r = PQexecParams(o, "SELECT v FROM tcc_order WHERE k = $1", 1, NULL, p, NULL, NULL, 0);
  int rows = PQntuples(r);
  char v[64] = "";
  if (rows == 1) snprintf(v, sizeof(v), "%s", PQgetvalue(r, 0, 0));
  PQclear(r);
  assert_int_equal(rows, 1);
  assert_string_equal(v, want);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    ITEST_CASE(test_commit_and_rollback),
    ITEST_CASE(test_cancel_before_try),
    ITEST_CASE(test_cancel_meets_uncommitted_try),
    ITEST_CASE(test_duplicate_phase2),
    ITEST_CASE(test_handler_failures),
    ITEST_CASE(test_mixed_at_and_tcc),
    ITEST_CASE(test_rm_gone_between_try_and_confirm),
    ITEST_CASE(test_sweep),
    ITEST_CASE(test_bad_input),
    ITEST_CASE(test_xa_commit_and_rollback),
    ITEST_CASE(test_xa_rollback_before_start),
    ITEST_CASE(test_xa_rollback_meets_open_branch),
    ITEST_CASE(test_xa_duplicates),
    ITEST_CASE(test_xa_mixed_at_tcc_xa),
    ITEST_CASE(test_xa_bad_input),
    ITEST_CASE(test_xa_rm_gone_and_tc_killed),
    ITEST_CASE(test_saga_forward),
    ITEST_CASE(test_saga_compensated),
    ITEST_CASE(test_saga_retried),
    ITEST_CASE(test_saga_rolled_back_before_commit),
    ITEST_CASE(test_saga_bad_input),
    ITEST_CASE(test_saga_rm_gone),
    ITEST_CASE(test_saga_with_tcc),
    ITEST_CASE(test_saga_tc_killed_mid_step),
    ITEST_CASE(test_saga_two_drives),
    ITEST_CASE(test_tc_killed_after_decision),
  };
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
