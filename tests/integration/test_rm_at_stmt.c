/*
 * test_rm_at_stmt.c - the AT layer's statements at their edges, in the
 * program and fixture of test_rm_at.c (rm_at_fixture.h): bad input and
 * refusals, a table that changes under a cached statement, the prepared
 * statements kept per connection, an insert whose undo item fails after
 * it ran.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rm_at_fixture.h"

/* A guard that refuses, rows that do not exist, and every kind of bad
 * input: a clear code each time, and the caller's transaction left usable
 * with its earlier work intact. */
void test_bad_input(void **state) {
  (void)state;
  PGconn *o = itest_pg(orders_url), *s = itest_pg(stock_url);
  char xid[RM_XID_MAX];
  assert_int_equal(rm_tm_begin(client, 30000, "bad_input", xid), 0);
  rm_branch_t *b = NULL;

  /* NULLs and bad strings. */
  assert_int_equal(rm_resource_add(NULL, "x", "dbname=x"), RM_E_INVALID);
  assert_int_equal(rm_resource_add(client, NULL, "dbname=x"), RM_E_INVALID);
  assert_int_equal(rm_resource_add(client, "x", NULL), RM_E_INVALID);
  assert_int_equal(rm_resource_add(client, "", "dbname=x"), RM_E_INVALID);
  assert_int_equal(rm_resource_add(client, "a,b", "dbname=x"), RM_E_INVALID);
  assert_int_equal(rm_resource_add(client, "x", "this is = not a conninfo ="), RM_E_INVALID);
  assert_int_equal(rm_resource_add(client, "orders", "dbname=elsewhere"), RM_E_INVALID);
  assert_int_equal(rm_resource_add(client, "orders", orders_url), 0); /* same again: fine */
  assert_int_equal(rm_at_open(NULL, xid, "orders", o, &b), RM_E_INVALID);
  assert_int_equal(rm_at_open(client, NULL, "orders", o, &b), RM_E_INVALID);
  assert_int_equal(rm_at_open(client, xid, NULL, o, &b), RM_E_INVALID);
  assert_int_equal(rm_at_open(client, xid, "orders", NULL, &b), RM_E_INVALID);
  assert_int_equal(rm_at_open(client, xid, "orders", o, NULL), RM_E_INVALID);
  assert_int_equal(rm_at_open(client, "", "orders", o, &b), RM_E_INVALID);
  char longxid[200];
  memset(longxid, 'x', sizeof(longxid) - 1);
  longxid[sizeof(longxid) - 1] = '\0';
  assert_int_equal(rm_at_open(client, longxid, "orders", o, &b), RM_E_INVALID);
  assert_int_equal(rm_at_open(client, xid, "nosuch", o, &b), RM_E_INVALID);
  assert_null(b);
  /* In a failed transaction. */
  assert_true(exec_ok(o, "BEGIN"));
  PQclear(PQexec(o, "SELECT 1 / 0"));
  assert_int_equal(rm_at_open(client, xid, "orders", o, &b), RM_E_STATE);
  assert_null(b);
  assert_true(exec_ok(o, "ROLLBACK"));
  assert_int_equal(rm_at_insert(NULL, "t", 0, NULL, NULL), RM_E_INVALID);
  assert_int_equal(rm_at_update(NULL, "t", NULL, 0, NULL, NULL), RM_E_INVALID);
  assert_int_equal(rm_at_delete(NULL, "t", NULL), RM_E_INVALID);
  assert_int_equal(rm_at_update_delta(NULL, "t", NULL, "c", 1, NULL), RM_E_INVALID);
  assert_int_equal(rm_at_prepare(NULL, NULL), RM_E_INVALID);
  assert_int_equal(rm_at_close(NULL, true), RM_E_INVALID);
  assert_string_equal(rm_at_errmsg(NULL), "");

  assert_true(exec_ok(o, "BEGIN"));
  assert_int_equal(rm_at_open(client, xid, "orders", o, &b), 0);
  assert_int_equal(rm_at_prepare(b, NULL), RM_E_STATE); /* nothing to prepare */
  /* A first good statement, whose effect must survive the failures. */
  long long id = atomic_fetch_add(&next_order, 1);
  assert_int_equal(insert_order(b, id, 77, 1, 9, xid), 0);
  char sid[32];
  snprintf(sid, sizeof(sid), "%lld", id);
  const char *pk[1] = {sid};

  assert_int_equal(rm_at_insert(b, NULL, 0, NULL, NULL), RM_E_INVALID);
  assert_int_equal(rm_at_insert(b, "trade_order", 2, NULL, NULL), RM_E_INVALID);
  assert_int_equal(rm_at_insert(b, "no_such_table", 0, NULL, NULL), RM_E_NO_TABLE);
  assert_non_null(strstr(rm_at_errmsg(b), "no_such_table"));
  assert_true(tx_usable(o));
  assert_int_equal(rm_at_insert(b, "nosuchschema.kv", 0, NULL, NULL), RM_E_NO_TABLE);
  assert_int_equal(rm_at_insert(b, ".kv", 0, NULL, NULL), RM_E_INVALID);
  char longname[100];
  memset(longname, 't', sizeof(longname) - 1);
  longname[sizeof(longname) - 1] = '\0';
  assert_int_equal(rm_at_insert(b, longname, 0, NULL, NULL), RM_E_INVALID);
  const char *nc[1] = {"a"}, *nv[1] = {"1"};
  assert_int_equal(rm_at_insert(b, "nopk", 1, nc, nv), RM_E_NO_PK);
  assert_non_null(strstr(rm_at_errmsg(b), "no primary key"));
  assert_true(tx_usable(o));
  /* Rows that are not there. */
  const char *missing[1] = {"-1"};
  const char *sc[1] = {"status"}, *sv[1] = {"PAID"};
  assert_int_equal(rm_at_update(b, "trade_order", missing, 1, sc, sv), RM_E_NOT_ONE_ROW);
  assert_int_equal(rm_at_delete(b, "trade_order", missing), RM_E_NOT_ONE_ROW);
  assert_true(tx_usable(o));
  /* Bad columns and values. */
  const char *uc[1] = {"no_such_col"};
  assert_int_equal(rm_at_update(b, "trade_order", pk, 1, uc, sv), RM_E_INVALID);
  const char *pkc[1] = {"order_id"}, *pkv[1] = {"5"};
  assert_int_equal(rm_at_update(b, "trade_order", pk, 1, pkc, pkv), RM_E_NOT_SUPPORTED);
  const char *qc[1] = {"qty"}, *qv[1] = {"not a number"};
  assert_int_equal(rm_at_update(b, "trade_order", pk, 1, qc, qv), RM_E_INVALID);
  const char *qneg[1] = {"-3"};
  assert_int_equal(rm_at_update(b, "trade_order", pk, 1, qc, qneg), RM_E_DB); /* CHECK */
  assert_true(tx_usable(o));
  const char *nullpk[1] = {NULL};
  assert_int_equal(rm_at_update(b, "trade_order", nullpk, 1, sc, sv), RM_E_INVALID);
  assert_int_equal(rm_at_update(b, "trade_order", pk, 0, sc, sv), RM_E_INVALID);
  /* Oversized: a key too long for a lock key, images too big. */
  size_t big = 3000;
  char *bigkey = malloc(big + 1);
  memset(bigkey, 'k', big);
  bigkey[big] = '\0';
  const char *kvc[2] = {"k", "v"}, *kvv[2] = {bigkey, "x"};
  assert_int_equal(rm_at_insert(b, "kv", 2, kvc, kvv), RM_E_INVALID);
  assert_non_null(strstr(rm_at_errmsg(b), "lock key"));
  assert_int_equal(q_ll(o, "SELECT count(*) FROM kv WHERE length(k) = 3000", NULL, NULL, NULL), 0);
  free(bigkey);
  size_t huge = 9u * 1024 * 1024;
  char *hv = malloc(huge + 1);
  memset(hv, 'v', huge);
  hv[huge] = '\0';
  const char *hvv[2] = {"huge", hv};
  /* An insert's undo keeps the key and the row's digest, not the row: a
   * 9 MB value goes in.  An update keeps both images: 18 MB, over the
   * branch's undo limit, refused and undone. */
  assert_int_equal(rm_at_insert(b, "kv", 2, kvc, hvv), 0);
  const char *hpk[1] = {"huge"}, *vcol[1] = {"v"}, *hval[1] = {hv};
  assert_int_equal(rm_at_update(b, "kv", hpk, 1, vcol, hval), RM_E_INVALID);
  assert_non_null(strstr(rm_at_errmsg(b), "exceed"));
  free(hv);
  assert_int_equal(q_ll(o, "SELECT count(*) FROM kv WHERE k = 'huge' AND length(v) = 9437184", NULL, NULL, NULL), 1);
  /* Deltas: not a counter column, and the guard. */
  assert_int_equal(rm_at_update_delta(b, "trade_order", pk, "status", 1, NULL), RM_E_NOT_SUPPORTED);
  assert_int_equal(rm_at_update_delta(b, "trade_order", pk, "qty", LLONG_MIN, NULL), RM_E_INVALID);
  assert_int_equal(rm_at_update_delta(b, "trade_order", pk, "qty", 5, "qty + $1 <= 3"), RM_E_GUARD);
  assert_int_equal(rm_at_update_delta(b, "trade_order", missing, "qty", 1, NULL), RM_E_NOT_ONE_ROW);
  assert_int_equal(rm_at_update_delta(b, "trade_order", pk, "qty", 1, "this is not sql"), RM_E_DB);
  assert_true(tx_usable(o));

  /* After all that: the first insert is intact, the branch still works. */
  assert_int_equal(q_ll(o, "SELECT count(*) FROM trade_order WHERE order_id = $1", sid, NULL, NULL), 1);
  assert_int_equal(rm_at_update(b, "trade_order", pk, 1, sc, sv), 0);
  int64_t bid = 0;
  assert_int_equal(rm_at_prepare(b, &bid), 0);
  assert_int_equal(rm_at_prepare(b, &bid), RM_E_STATE);
  assert_int_equal(rm_at_insert(b, "kv", 0, NULL, NULL), RM_E_STATE);
  assert_true(exec_ok(o, "COMMIT"));
  assert_int_equal(rm_at_close(b, true), 0);
  int st = 0;
  assert_int_equal(rm_tm_rollback(client, xid, &st), 0);
  assert_int_equal(order_exists(o, id), 0);

  /* An xid the TC does not know: registration fails, the caller rolls back. */
  assert_true(exec_ok(s, "BEGIN"));
  assert_int_equal(rm_at_open(client, "127.0.0.1:1:777", "stock", s, &b), 0);
  delta_arg_t d = {9, 1};
  assert_int_equal(body_delta(b, &d), 0);
  int rc = rm_at_prepare(b, &bid);
  assert_true(rc == RM_E_GLOBAL_NOT_FOUND || rc == RM_E_BAD_REQUEST);
  assert_true(rm_at_errmsg(b)[0] != '\0');
  assert_true(exec_ok(s, "ROLLBACK"));
  assert_int_equal(rm_at_close(b, false), 0);

  /* A failed transaction: no statement runs. */
  assert_true(exec_ok(s, "BEGIN"));
  assert_int_equal(rm_at_open(client, xid, "stock", s, &b), 0);
  PQclear(PQexec(s, "SELECT 1/0"));
  assert_int_equal(body_delta(b, &d), RM_E_STATE);
  assert_true(exec_ok(s, "ROLLBACK"));
  assert_int_equal(rm_at_close(b, false), 0);
}

/* A column added after the table's metadata was cached is found (the
 * cache is read again), and its rollback restores it. */
void test_schema_change(void **state) {
  (void)state;
  PGconn *o = itest_pg(orders_url);
  char xid[RM_XID_MAX];
  rm_branch_t *b = begin_and_open(o, "schema_change", "orders", xid);
  const char *c1[2] = {"k", "v"}, *v1[2] = {"sc", "first"};
  assert_int_equal(rm_at_insert(b, "other.kv", 2, c1, v1), 0); /* metadata cached */
  assert_int_equal(rm_at_prepare(b, NULL), 0);
  assert_true(exec_ok(o, "COMMIT"));
  assert_int_equal(rm_at_close(b, true), 0);
  int st;
  assert_int_equal(rm_tm_commit(client, xid, &st), 0);

  assert_true(exec_ok(o, "ALTER TABLE other.kv ADD COLUMN IF NOT EXISTS extra text"));
  assert_int_equal(rm_tm_begin(client, 30000, "schema_change2", xid), 0);
  assert_true(exec_ok(o, "BEGIN"));
  assert_int_equal(rm_at_open(client, xid, "orders", o, &b), 0);
  const char *pk[1] = {"sc"};
  const char *c2[1] = {"extra"}, *v2[1] = {"added"};
  assert_int_equal(rm_at_update(b, "other.kv", pk, 1, c2, v2), 0);
  const char *c3[1] = {"still_missing"};
  assert_int_equal(rm_at_update(b, "other.kv", pk, 1, c3, v2), RM_E_INVALID);
  assert_int_equal(rm_at_prepare(b, NULL), 0);
  assert_true(exec_ok(o, "COMMIT"));
  assert_int_equal(rm_at_close(b, true), 0);
  assert_int_equal(rm_tm_rollback(client, xid, &st), 0);
  assert_int_equal(st, RM_GS_ROLLBACKED);
  assert_int_equal(q_ll(o, "SELECT count(*) FROM other.kv WHERE k = 'sc' AND extra IS NULL", NULL, NULL, NULL), 1);
  assert_int_equal(q_ll(o, "SELECT count(*) FROM kv WHERE k = 'huge'", NULL, NULL, NULL), 0); /* by its digest */
}

/* A branch opened on an idle connection begins the transaction itself
 * with its first statement (in the same round trip): the caller's COMMIT,
 * or rm_at_prepare_commit's, makes it durable; a rollback leaves nothing;
 * a branch whose only statement is a deferred delta begins it in prepare's
 * pipeline. */
void test_open_idle(void **state) {
  (void)state;
  PGconn *o = itest_pg(orders_url);
  char xid[RM_XID_MAX];
  int st = 0;
  /* committed by rm_at_prepare_commit */
  assert_int_equal(rm_tm_begin(client, 30000, "open_idle", xid), 0);
  rm_branch_t *b = NULL;
  assert_int_equal(PQtransactionStatus(o), PQTRANS_IDLE);
  assert_int_equal(rm_at_open(client, xid, "orders", o, &b), 0);
  assert_int_equal(PQtransactionStatus(o), PQTRANS_IDLE); /* nothing sent yet */
  const char *c[2] = {"k", "v"}, *v1[2] = {"idle-1", "a"}, *v2[2] = {"idle-2", "b"};
  assert_int_equal(rm_at_insert(b, "other.kv", 2, c, v1), 0);
  assert_int_equal(PQtransactionStatus(o), PQTRANS_INTRANS);
  assert_int_equal(rm_at_insert(b, "other.kv", 2, c, v2), 0);
  bool committed = false;
  assert_int_equal(rm_at_prepare_commit(b, NULL, &committed), 0);
  assert_true(committed);
  assert_int_equal(rm_at_close(b, true), 0);
  assert_int_equal(rm_tm_commit(client, xid, &st), 0);
  assert_int_equal(q_ll(o, "SELECT count(*) FROM other.kv WHERE k IN ('idle-1', 'idle-2')", NULL, NULL, NULL), 2);
  /* rolled back by the caller before prepare: nothing stays */
  assert_int_equal(rm_tm_begin(client, 30000, "open_idle_rb", xid), 0);
  assert_int_equal(rm_at_open(client, xid, "orders", o, &b), 0);
  const char *v3[2] = {"idle-3", "c"};
  assert_int_equal(rm_at_insert(b, "other.kv", 2, c, v3), 0);
  assert_true(exec_ok(o, "ROLLBACK"));
  rm_at_close(b, false);
  assert_int_equal(rm_tm_rollback(client, xid, &st), 0);
  assert_int_equal(q_ll(o, "SELECT count(*) FROM other.kv WHERE k = 'idle-3'", NULL, NULL, NULL), 0);
  /* a global rollback undoes a branch that began its own transaction */
  assert_int_equal(rm_tm_begin(client, 30000, "open_idle_grb", xid), 0);
  assert_int_equal(rm_at_open(client, xid, "orders", o, &b), 0);
  const char *v4[2] = {"idle-4", "d"};
  assert_int_equal(rm_at_insert(b, "other.kv", 2, c, v4), 0);
  committed = false;
  assert_int_equal(rm_at_prepare_commit(b, NULL, &committed), 0);
  assert_true(committed);
  assert_int_equal(rm_at_close(b, true), 0);
  assert_int_equal(rm_tm_rollback(client, xid, &st), 0);
  assert_int_equal(st, RM_GS_ROLLBACKED);
  assert_int_equal(q_ll(o, "SELECT count(*) FROM other.kv WHERE k = 'idle-4'", NULL, NULL, NULL), 0);
  assert_int_equal(PQtransactionStatus(o), PQTRANS_IDLE);
}

/* How a test of a branch registered before its statements opens it:
 * begun with it (rm_tm_begin_branch, rm_at_open_registered) or registered
 * early (rm_tm_begin, rm_at_open, rm_at_register_early).  0 or the code. */
typedef int (*first_open_fn)(const char *name, PGconn *o, char *xid, rm_branch_t **b);

static int open_begun_with(const char *name, PGconn *o, char *xid, rm_branch_t **b) {
  int64_t reg = 0;
  int rc = rm_tm_begin_branch(client, 30000, name, "orders", xid, &reg);
  if (rc == 0) assert_true(xid[0] != '\0' && reg > 0);
  return rc != 0 ? rc : rm_at_open_registered(client, xid, "orders", reg, o, b);
}

static int open_early(const char *name, PGconn *o, char *xid, rm_branch_t **b) {
  int rc = rm_tm_begin(client, 30000, name, xid);
  if (rc == 0) rc = rm_at_open(client, xid, "orders", o, b);
  return rc != 0 ? rc : rm_at_register_early(*b);
}

/* A branch opened by 'open' that inserts (k, 'v') into other.kv, with a
 * global lock on the row ('locked') or without. */
static rm_branch_t *open_inserting(first_open_fn open, PGconn *o, const char *k, bool locked, char *xid) {
  rm_branch_t *b = NULL;
  assert_int_equal(open(k, o, xid, &b), 0);
  const char *c[2] = {"k", "v"}, *v[2] = {k, "v"};
  assert_int_equal(locked ? rm_at_insert(b, "other.kv", 2, c, v) : rm_at_insert_unlocked(b, "other.kv", 2, c, v), 0);
  return b;
}

/* One global of such a branch that inserts (k, 'v') into other.kv, the
 * branch prepared and committed locally, the global committed or rolled
 * back: the rows of k afterwards. */
static long long first_round(first_open_fn open, PGconn *o, const char *k, bool commit) {
  char xid[RM_XID_MAX];
  rm_branch_t *b = open_inserting(open, o, k, false, xid);
  bool committed = false;
  int64_t bid = 0;
  assert_int_equal(rm_at_prepare_commit(b, &bid, &committed), 0);
  assert_true(committed && bid > 0);
  assert_int_equal(rm_at_close(b, true), 0);
  int st = 0;
  assert_int_equal(rm_tm_status(client, xid, &st), 0);
  assert_int_equal(st, RM_GS_BEGIN);
  assert_int_equal(commit ? rm_tm_commit(client, xid, &st) : rm_tm_rollback(client, xid, &st), 0);
  assert_int_equal(st, commit ? RM_GS_COMMITTED : RM_GS_ROLLBACKED);
  return q_ll(o, "SELECT count(*) FROM other.kv WHERE k = $1", k, NULL, NULL);
}

/* ... and one whose statement takes a global lock: refused at prepare,
 * rolled back; nothing stays. */
static void first_locked(first_open_fn open, PGconn *o, const char *k) {
  char xid[RM_XID_MAX];
  rm_branch_t *b = open_inserting(open, o, k, true, xid);
  bool committed = false;
  assert_int_equal(rm_at_prepare_commit(b, NULL, &committed), RM_E_STATE);
  assert_false(committed);
  assert_non_null(strstr(rm_at_errmsg(b), "registered before its statements"));
  rm_at_close(b, false);
  int st = 0;
  assert_int_equal(rm_tm_rollback(client, xid, &st), 0);
  assert_int_equal(st, RM_GS_ROLLBACKED);
  assert_int_equal(q_ll(o, "SELECT count(*) FROM other.kv WHERE k = $1", k, NULL, NULL), 0);
}

/* rm_tm_begin_branch and rm_at_open_registered: the global begun and the
 * branch registered in one call; committed and rolled back with the
 * global; a locked statement refused at prepare. */
void test_begin_open(void **state) {
  (void)state;
  PGconn *o = itest_pg(orders_url);
  assert_int_equal(first_round(open_begun_with, o, "bo-1", true), 1);
  assert_int_equal(first_round(open_begun_with, o, "bo-2", false), 0);
  first_locked(open_begun_with, o, "bo-3");
  assert_int_equal(PQtransactionStatus(o), PQTRANS_IDLE);
}

/* rm_at_register_early: the registration travels while the statements
 * run; prepare waits for it.  As above, and: only once, only before the
 * statements; a branch closed with its registration in flight. */
void test_register_early(void **state) {
  (void)state;
  PGconn *o = itest_pg(orders_url);
  assert_int_equal(first_round(open_early, o, "re-1", true), 1);
  assert_int_equal(first_round(open_early, o, "re-2", false), 0);
  first_locked(open_early, o, "re-3");
  char xid[RM_XID_MAX];
  int st = 0;
  rm_branch_t *b = NULL;
  /* once; closed in flight, before any statement */
  assert_int_equal(open_early("re-close", o, xid, &b), 0);
  assert_int_equal(rm_at_register_early(b), RM_E_STATE);
  rm_at_close(b, false);
  assert_int_equal(rm_tm_rollback(client, xid, &st), 0);
  assert_int_equal(st, RM_GS_ROLLBACKED);
  /* too late: after a statement */
  assert_int_equal(rm_tm_begin(client, 30000, "early_late", xid), 0);
  assert_int_equal(rm_at_open(client, xid, "orders", o, &b), 0);
  const char *c[2] = {"k", "v"}, *v4[2] = {"re-4", "d"};
  assert_int_equal(rm_at_insert_unlocked(b, "other.kv", 2, c, v4), 0);
  assert_int_equal(rm_at_register_early(b), RM_E_STATE);
  assert_true(exec_ok(o, "ROLLBACK"));
  rm_at_close(b, false);
  assert_int_equal(rm_tm_rollback(client, xid, &st), 0);
  assert_int_equal(PQtransactionStatus(o), PQTRANS_IDLE);
}

/* An insert whose RELEASE went with it (its input looked small) and whose
 * undo item then cannot be built (a default makes the key too long for a
 * lock key): the branch fails and says to roll back; nothing else is half
 * done. */
void test_insert_fails_late(void **state) {
  (void)state;
  PGconn *o = itest_pg(orders_url);
  assert_true(exec_ok(o, "CREATE TABLE IF NOT EXISTS bigdefault (k text PRIMARY KEY DEFAULT repeat('k', 2500),"
                         " v text)"));
  char xid[RM_XID_MAX];
  rm_branch_t *b = begin_and_open(o, "fails_late", "orders", xid);
  const char *c[1] = {"v"}, *v[1] = {"late"}, *kc[1] = {"k"};
  assert_int_equal(rm_at_insert(b, "bigdefault", 1, c, v), RM_E_INVALID);
  assert_non_null(strstr(rm_at_errmsg(b), "roll it back"));
  assert_int_equal(rm_at_insert(b, "other.kv", 1, kc, v), RM_E_STATE); /* the branch is failed */
  assert_int_equal(rm_at_prepare(b, NULL), RM_E_STATE);
  assert_true(exec_ok(o, "ROLLBACK"));
  rm_at_close(b, false);
  int st = 0;
  assert_int_equal(rm_tm_rollback(client, xid, &st), 0);
  assert_int_equal(q_ll(o, "SELECT count(*) FROM bigdefault", NULL, NULL, NULL), 0);
}

/* One global transaction of client 'c' with one branch on 'pg' that
 * inserts (k, 'v') into other.kv; committed or rolled back. */
static int kv_global(rm_client_t *c, PGconn *pg, const char *k, bool commit) {
  char xid[RM_XID_MAX];
  int rc = rm_tm_begin(c, 30000, "pstmt", xid);
  if (rc != 0) return rc;
  rm_branch_t *b = NULL;
  if (!exec_ok(pg, "BEGIN")) return RM_E_DB;
  const char *cols[2] = {"k", "v"}, *vals[2] = {k, "v"};
  if ((rc = rm_at_open(c, xid, "orders", pg, &b)) == 0 && (rc = rm_at_insert(b, "other.kv", 2, cols, vals)) == 0)
    rc = rm_at_prepare(b, NULL);
  if (rc != 0 && b && getenv("RM_TEST_VERBOSE")) fprintf(stderr, "  kv branch: %s\n", rm_at_errmsg(b));
  bool ok = rc == 0 && exec_ok(pg, "COMMIT");
  if (!ok) exec_ok(pg, "ROLLBACK");
  if (b) rm_at_close(b, ok);
  int st = 0;
  int rc2 = commit && ok ? rm_tm_commit(c, xid, &st) : rm_tm_rollback(c, xid, &st);
  return rc != 0 ? rc : !ok ? RM_E_DB : rc2;
}

/* The AT layer's queries are named prepared statements per connection:
 * prepared on first use, then reused; prepared again after the application
 * deallocates them or an ALTER TABLE changes the result columns of a
 * statement with RETURNING * (the call itself still succeeds).  A client
 * with unnamed_statements prepares nothing. */
void test_prepared_statements(void **state) {
  (void)state;
  static const char count_sql[] = "SELECT count(*) FROM pg_prepared_statements WHERE name LIKE 'rm\\_at\\_%'";
  PGconn *o = itest_pg(orders_url);
  assert_int_equal(q_ll(o, count_sql, NULL, NULL, NULL), 0);
  assert_int_equal(kv_global(client, o, "ps1", true), 0);
  long long n1 = q_ll(o, count_sql, NULL, NULL, NULL);
  assert_true(n1 >= 2); /* the INSERT ... RETURNING * and the undo row */
  assert_int_equal(kv_global(client, o, "ps2", true), 0);
  assert_int_equal(q_ll(o, count_sql, NULL, NULL, NULL), n1); /* reused, none added */

  assert_true(exec_ok(o, "DEALLOCATE ALL"));
  assert_int_equal(kv_global(client, o, "ps3", true), 0);
  assert_int_equal(q_ll(o, count_sql, NULL, NULL, NULL), n1);

  /* RETURNING * of a prepared INSERT now has one more column. */
  assert_true(exec_ok(o, "ALTER TABLE other.kv ADD COLUMN IF NOT EXISTS ps_extra int"));
  assert_int_equal(kv_global(client, o, "ps4", true), 0);
  assert_int_equal(kv_global(client, o, "ps5", false), 0); /* and its undo still works */
  assert_int_equal(WAIT_EQ(0, 10, q_ll(o, "SELECT count(*) FROM other.kv WHERE k = 'ps5'", NULL, NULL, NULL)), 0);
  assert_int_equal(q_ll(o, "SELECT count(*) FROM other.kv WHERE k IN ('ps1', 'ps2', 'ps3', 'ps4')", NULL, NULL,
                        NULL),
                   4);

  /* unnamed_statements: nothing prepared on the connection. */
  char nodes[64];
  snprintf(nodes, sizeof(nodes), "127.0.0.1:%d", tcd.port);
  rm_config_t cfg = {.nodes = nodes, .token = TOKEN, .application_id = "test_rm_at_unnamed",
                     .request_timeout_ms = 15000, .log_cb = log_cb, .unnamed_statements = 1};
  rm_client_t *unnamed = NULL;
  assert_int_equal(rm_client_new(&cfg, &unnamed), 0);
  assert_int_equal(rm_resource_add(unnamed, "orders", orders_url), 0);
  PGconn *o2 = pg_open(orders_url);
  assert_non_null(o2);
  assert_int_equal(kv_global(unnamed, o2, "ps6", true), 0);
  assert_int_equal(q_ll(o2, count_sql, NULL, NULL, NULL), 0);
  PQfinish(o2);
  rm_client_free(unnamed);
  assert_true(exec_ok(o, "ALTER TABLE other.kv DROP COLUMN ps_extra"));
}

/* A rehearsal (rm_at_open_rehearsal) runs a branch's statements and its
 * prepare on the connection, asks the coordinator nothing (its client's
 * only node does not listen, so any call would fail) and leaves nothing
 * behind: not the rows it wrote, not a bucket's delta, not its undo row;
 * and a caller's COMMIT after rm_at_prepare has nothing to commit. */
void test_rehearsal(void **state) {
  (void)state;
  rm_config_t cfg = {.token = TOKEN, .application_id = "test_rm_at", .nodes = "127.0.0.1:1",
                     .request_timeout_ms = 300, .lock_wait_ms = 200};
  rm_client_t *lone = NULL;
  assert_int_equal(rm_client_new(&cfg, &lone), 0);
  assert_int_equal(rm_resource_add(lone, "orders", orders_url), 0);
  assert_int_equal(rm_resource_add(lone, "stock", stock_url), 0);
  PGconn *o = itest_pg(orders_url), *s = itest_pg(stock_url);
  rm_branch_t *b = NULL;
  assert_int_equal(rm_at_open_rehearsal(NULL, "stock", s, &b), RM_E_INVALID);
  assert_int_equal(rm_at_open_rehearsal(lone, "nosuch", s, &b), RM_E_INVALID);
  assert_int_equal(rm_at_open_rehearsal(lone, "stock", NULL, &b), RM_E_INVALID);
  assert_null(b);
  const char *undo_sql = "SELECT count(*) FROM undo_log";
  const char *frozen_sql = "SELECT frozen_count FROM activity_ticket_bucket WHERE activity_id = " ACTIVITY
                           " AND ticket_type = " TICKET " AND bucket_id = 2";
  long long undo_s = q_ll(s, undo_sql, NULL, NULL, NULL), undo_o = q_ll(o, undo_sql, NULL, NULL, NULL);
  long long frozen = q_ll(s, frozen_sql, NULL, NULL, NULL);
  assert_true(frozen >= 0);

  /* 1. The stock's freeze as the service runs it: on an idle connection,
   * registered early, no statement savepoints, a deferred delta, prepare
   * and COMMIT fused into one round trip, which here rolls back. */
  assert_int_equal(rm_at_open_rehearsal(lone, "stock", s, &b), 0);
  assert_int_equal(rm_at_statement_savepoints(b, false), 0);
  assert_int_equal(rm_at_register_early(b), 0);
  bucket_key_t k;
  bucket_key(&k, 2);
  assert_int_equal(rm_at_update_delta_deferred(b, "activity_ticket_bucket", k.pk, "frozen_count", 1, GUARD), 0);
  int64_t bid = -1;
  bool committed = true;
  assert_int_equal(rm_at_prepare_commit(b, &bid, &committed), 0);
  assert_false(committed);
  assert_int_equal(bid, 0);
  assert_int_equal(PQtransactionStatus(s), PQTRANS_IDLE);
  assert_int_equal(rm_at_close(b, false), 0);
  assert_int_equal(q_ll(s, frozen_sql, NULL, NULL, NULL), frozen);
  assert_int_equal(q_ll(s, undo_sql, NULL, NULL, NULL), undo_s);

  /* 2. Inside the caller's transaction, with savepoints: an insert, an
   * update and a SELECT ... FOR UPDATE that a branch would take global
   * locks for; rm_at_prepare, then the caller's COMMIT. */
  assert_true(exec_ok(o, "INSERT INTO other.kv VALUES ('rehearsed', 'orig') ON CONFLICT (k) DO UPDATE SET v = 'orig'"));
  assert_true(exec_ok(o, "BEGIN"));
  assert_int_equal(rm_at_open_rehearsal(lone, "orders", o, &b), 0);
  long long id = atomic_fetch_add(&next_order, 1);
  assert_int_equal(insert_order(b, id, 78, 1, 2, RM_AT_REHEARSAL_XID), 0);
  const char *kk[1] = {"rehearsed"}, *c[1] = {"v"}, *v[1] = {"changed"};
  assert_int_equal(rm_at_update(b, "other.kv", kk, 1, c, v), 0);
  int64_t rows = 0;
  assert_int_equal(rm_at_sql(b, "SELECT v FROM other.kv WHERE k = $1 FOR UPDATE", 1, NULL, kk, &rows, NULL), 0);
  assert_int_equal(rows, 1);
  assert_int_equal(rm_at_prepare(b, &bid), 0);
  assert_int_equal(bid, 0);
  assert_int_equal(PQtransactionStatus(o), PQTRANS_IDLE); /* rolled back by prepare */
  PQclear(PQexec(o, "COMMIT"));                            /* nothing to commit (a warning) */
  assert_int_equal(rm_at_close(b, false), 0);
  assert_int_equal(order_exists(o, id), 0);
  assert_int_equal(q_ll(o, "SELECT count(*) FROM other.kv WHERE k = 'rehearsed' AND v = 'orig'", NULL, NULL, NULL), 1);
  assert_int_equal(q_ll(o, undo_sql, NULL, NULL, NULL), undo_o);

  /* 3. One deferred insert alone on an idle connection: for a branch the
   * statement is its own transaction; a rehearsal's still rolls back. */
  assert_int_equal(rm_at_open_rehearsal(lone, "orders", o, &b), 0);
  assert_int_equal(rm_at_statement_savepoints(b, false), 0);
  const char *cols[2] = {"k", "v"}, *vals[2] = {"rehearsed-alone", "v"};
  assert_int_equal(rm_at_insert_deferred(b, "other.kv", 2, cols, vals), 0);
  committed = true;
  assert_int_equal(rm_at_prepare_commit(b, NULL, &committed), 0);
  assert_false(committed);
  assert_int_equal(rm_at_close(b, false), 0);
  assert_int_equal(PQtransactionStatus(o), PQTRANS_IDLE);
  assert_int_equal(q_ll(o, "SELECT count(*) FROM other.kv WHERE k = 'rehearsed-alone'", NULL, NULL, NULL), 0);
  assert_int_equal(q_ll(o, undo_sql, NULL, NULL, NULL), undo_o);
  rm_client_free(lone);
}
