/*
 * test_rm_at.c - the AT resource manager of librmclient against two real
 * PostgreSQL databases and a real tcd.
 *
 * NOTES
 *   Servers: scripts/with-servers --pg exports TC_PG_URL, ORDERS_PG_URL and
 *   STOCK_PG_URL (databases with the undo_log schema and the demo tables);
 *   the group setup starts tcd from $TX_BIN_DIR on a free loopback port and
 *   waits until it accepts connections, then one rm_client_t serves the
 *   resources "orders" and "stock" for every test.  Without the variables
 *   the whole group is skipped.
 *
 *   Each test uses its own rows (order ids from a counter, its own stock
 *   bucket) so that the tests do not depend on their order.
 *
 *   Waiting: the TC answers a rollback after phase two, and a commit at
 *   once with phase two after; where a test must see phase-two effects that
 *   nothing signals (undo rows deleted in the background), it polls the
 *   database with a deadline.
 *
 *   Threads: the worker threads of the concurrency tests never call cmocka
 *   (its failures longjmp); they count errors that the main thread asserts.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <inttypes.h>
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
#include "rm_at_fixture.h"
#include "rm_client.h"
#include "rm_internal.h"
#include "tcd_proc.h"
#include "txp_status.h"

const char *orders_url, *stock_url, *tc_url;
tcd_proc_t tcd;
rm_client_t *client;
atomic_llong next_order = 1000;

/* ------------------------------------------------------------- helpers */

/* First value of a query with up to 3 text parameters, as a long long;
 * LLONG_MIN if no row or NULL, LLONG_MIN + 1 on error. */
long long q_ll(PGconn *pg, const char *sql, const char *p1, const char *p2, const char *p3) {
  const char *params[3] = {p1, p2, p3};
  int n = p3 ? 3 : p2 ? 2 : p1 ? 1 : 0;
  PGresult *r = PQexecParams(pg, sql, n, NULL, params, NULL, NULL, 0);
  long long v = LLONG_MIN + 1;
  if (PQresultStatus(r) == PGRES_TUPLES_OK)
    v = PQntuples(r) && !PQgetisnull(r, 0, 0) ? atoll(PQgetvalue(r, 0, 0)) : LLONG_MIN;
  else
    fprintf(stderr, "  query failed: %s: %s", sql, PQresultErrorMessage(r));
  PQclear(r);
  return v;
}

/* First value as a malloc'd string (NULL if none). */
static char *q_str(PGconn *pg, const char *sql, const char *p1, const char *p2) {
  const char *params[2] = {p1, p2};
  int n = p2 ? 2 : p1 ? 1 : 0;
  PGresult *r = PQexecParams(pg, sql, n, NULL, params, NULL, NULL, 0);
  char *v = NULL;
  if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) && !PQgetisnull(r, 0, 0)) v = strdup(PQgetvalue(r, 0, 0));
  PQclear(r);
  return v;
}

static long long frozen(PGconn *pg, int bucket) {
  char b[16];
  snprintf(b, sizeof(b), "%d", bucket);
  return q_ll(pg,
              "SELECT frozen_count FROM activity_ticket_bucket"
              " WHERE activity_id = 1 AND ticket_type = 1 AND bucket_id = $1",
              b, NULL, NULL);
}

static long long undo_rows(PGconn *pg, const char *xid, int log_status) {
  char s[8];
  snprintf(s, sizeof(s), "%d", log_status);
  return q_ll(pg, "SELECT count(*) FROM undo_log WHERE xid = $1 AND log_status = $2", xid, s, NULL);
}

/* Whether the caller's transaction is still open and takes statements. */
bool tx_usable(PGconn *pg) {
  return PQtransactionStatus(pg) == PQTRANS_INTRANS && exec_ok(pg, "SELECT 1") &&
         PQtransactionStatus(pg) == PQTRANS_INTRANS;
}

long long order_exists(PGconn *pg, long long id) {
  char s[32];
  snprintf(s, sizeof(s), "%lld", id);
  return q_ll(pg, "SELECT count(*) FROM trade_order WHERE order_id = $1", s, NULL, NULL);
}

int global_status(const char *xid) {
  int st = -1;
  int rc = rm_tm_status(client, xid, &st);
  return rc == 0 ? st : rc;
}

/* Begin, then one branch on 'url'/'resource' that inserts an order. */
static const char *const order_cols[] = {"order_id", "activity_id", "ticket_type", "user_id",
                                         "qty", "bucket_id", "xid"};

int insert_order(rm_branch_t *b, long long id, int user, int qty, int bucket, const char *xid) {
  char sid[32], su[16], sq[16], sb[16];
  snprintf(sid, sizeof(sid), "%lld", id);
  snprintf(su, sizeof(su), "%d", user);
  snprintf(sq, sizeof(sq), "%d", qty);
  snprintf(sb, sizeof(sb), "%d", bucket);
  const char *vals[] = {sid, ACTIVITY, TICKET, su, sq, sb, xid};
  return rm_at_insert(b, "trade_order", 7, order_cols, vals);
}

rm_branch_t *open_branch(PGconn *pg, const char *xid, const char *resource) {
  assert_true(exec_ok(pg, "BEGIN"));
  rm_branch_t *b = NULL;
  assert_int_equal(rm_at_open(client, xid, resource, pg, &b), 0);
  return b;
}

rm_branch_t *begin_and_open(PGconn *pg, const char *name, const char *resource, char *xid) {
  assert_int_equal(rm_tm_begin(client, 30000, name, xid), 0);
  return open_branch(pg, xid, resource);
}

int deliver_phase2(bool commit, const char *xid, int64_t bid, const char *resource, phase2_reply_t *reply) {
  rm_phase2_req_t req = {.commit = commit, .xid = xid, .branch_id = bid, .resource_id = resource,
                         .branch_type = TXP_BT_AT};
  reply->code = 0;
  return rm__at_phase2(client, &req, &reply->code, reply->msg, sizeof(reply->msg));
}

int run_branch(PGconn *pg, const char *xid, const char *resource, body_fn body, void *arg, int64_t *bid) {
  if (!exec_ok(pg, "BEGIN")) return RM_E_DB;
  rm_branch_t *b = NULL;
  int rc = rm_at_open(client, xid, resource, pg, &b);
  if (rc == 0) rc = body(b, arg);
  return itest_branch_end(pg, b, rc, bid);
}

typedef struct order_arg {
  long long id;
  int user, qty, bucket;
  const char *xid;
} order_arg_t;

static int body_order(rm_branch_t *b, void *arg) {
  order_arg_t *o = arg;
  return insert_order(b, o->id, o->user, o->qty, o->bucket, o->xid);
}

void bucket_key(bucket_key_t *k, int bucket) {
  snprintf(k->text, sizeof(k->text), "%d", bucket);
  k->pk[0] = ACTIVITY;
  k->pk[1] = TICKET;
  k->pk[2] = k->text;
}

int body_delta(rm_branch_t *b, void *arg) {
  delta_arg_t *d = arg;
  bucket_key_t k;
  bucket_key(&k, d->bucket);
  return rm_at_update_delta(b, "activity_ticket_bucket", k.pk, "frozen_count", d->delta, GUARD);
}

/* Plain update of a bucket's frozen_count through the image path. */
typedef struct set_arg {
  int bucket;
  long long value;
} set_arg_t;

static int body_set_frozen(rm_branch_t *b, void *arg) {
  set_arg_t *s = arg;
  bucket_key_t k;
  bucket_key(&k, s->bucket);
  char sv[32];
  snprintf(sv, sizeof(sv), "%lld", s->value);
  const char *cols[1] = {"frozen_count"};
  const char *vals[1] = {sv};
  return rm_at_update(b, "activity_ticket_bucket", k.pk, 1, cols, vals);
}

/* ------------------------------------------------------------- fixture */

static int group_setup(void **state) {
  (void)state;
  if (!itest_urls(&orders_url, &stock_url, &tc_url)) return -1;
  /* Seed: one activity, 16 buckets of 1000 tickets; test-only tables. */
  PGconn *s = pg_open(stock_url), *o = pg_open(orders_url);
  if (!s || !o) return -1;
  bool ok = exec_ok(s,
                    "INSERT INTO activity (activity_id, name, status, starts_at, ends_at)"
                    " VALUES (1, 'rm_at test', 1, now(), now() + interval '1 day')"
                    " ON CONFLICT DO NOTHING") &&
            exec_ok(s,
                    "INSERT INTO activity_ticket_bucket (activity_id, ticket_type, bucket_id, stock)"
                    " SELECT 1, 1, g, 1000 FROM generate_series(0, 15) g ON CONFLICT DO NOTHING") &&
            exec_ok(o, "CREATE TABLE IF NOT EXISTS kv (k text PRIMARY KEY, v text, n int,"
                       " g int GENERATED ALWAYS AS (n * 2) STORED,"
                       " id bigint GENERATED ALWAYS AS IDENTITY)") &&
            exec_ok(o, "CREATE TABLE IF NOT EXISTS nopk (a int, b text)") &&
            exec_ok(o, "CREATE SCHEMA IF NOT EXISTS other") &&
            exec_ok(o, "CREATE TABLE IF NOT EXISTS other.kv (k text PRIMARY KEY, v text)");
  PQfinish(s);
  PQfinish(o);
  if (!ok) return -1;

  rm_config_t cfg = {.token = TOKEN, .application_id = "test_rm_at", .request_timeout_ms = 15000,
                     .lock_wait_ms = 2000, .log_cb = log_cb, .log_level = RM_LOG_DEBUG};
  if (itest_tcd_start(&tcd, tc_url, TOKEN, 500, NULL) != 0 || itest_client_new(&tcd, cfg, &client) != 0) return -1;
  if (rm_resource_add(client, "orders", orders_url) != 0 || rm_resource_add(client, "stock", stock_url) != 0)
    return -1;
  return itest_client_ready(client);
}

static int group_teardown(void **state) {
  (void)state;
  itest_group_stop(&client, &tcd);
  return 0;
}

/* ------------------------------------------------------------ the tests */

/* Begin 'name' ('xid'), then its two branches: an order of 'qty' tickets of
 * 'bucket' (branch *b1) and that bucket's frozen_count set to f0 + qty
 * (branch *b2).  Returns the order. */
static order_arg_t order_two_dbs(PGconn *o, PGconn *s, const char *name, int bucket, int qty, long long f0,
                                 char *xid, int64_t *b1, int64_t *b2) {
  assert_int_equal(rm_tm_begin(client, 30000, name, xid), 0);
  order_arg_t oa = {atomic_fetch_add(&next_order, 1), 1, qty, bucket, xid};
  set_arg_t sa = {bucket, f0 + qty};
  assert_int_equal(run_branch(o, xid, "orders", body_order, &oa, b1), 0);
  assert_int_equal(run_branch(s, xid, "stock", body_set_frozen, &sa, b2), 0);
  return oa;
}

/* Order insert + bucket update in two databases, committed. */
static void test_commit_two_dbs(void **state) {
  (void)state;
  PGconn *o = itest_pg(orders_url), *s = itest_pg(stock_url);
  long long f0 = frozen(s, 0);
  char xid[RM_XID_MAX];
  int64_t b1 = 0, b2 = 0;
  order_arg_t oa = order_two_dbs(o, s, "commit_two_dbs", 0, 2, f0, xid, &b1, &b2);
  assert_true(b1 > 0 && b2 > 0 && b1 != b2);
  /* Phase one left one undo row per branch, committed with the change. */
  assert_int_equal(undo_rows(o, xid, 0), 1);
  assert_int_equal(undo_rows(s, xid, 0), 1);
  int st = 0;
  assert_int_equal(rm_tm_commit(client, xid, &st), 0);
  assert_int_equal(st, RM_GS_COMMITTED);
  assert_int_equal(order_exists(o, oa.id), 1);
  assert_int_equal(frozen(s, 0), f0 + 2);
  /* The undo rows go in the background (BranchCommit, then the deleter). */
  assert_int_equal(WAIT_EQ(0, 10, undo_rows(o, xid, 0) + undo_rows(s, xid, 0)), 0);
  /* The global row locks are gone: another transaction updates the row. */
  char xid2[RM_XID_MAX];
  assert_int_equal(rm_tm_begin(client, 30000, "after_commit", xid2), 0);
  set_arg_t sb = {0, f0};
  assert_int_equal(run_branch(s, xid2, "stock", body_set_frozen, &sb, &b2), 0);
  assert_int_equal(rm_tm_commit(client, xid2, &st), 0);
  assert_int_equal(frozen(s, 0), f0);
}

/* The same, rolled back: both databases restored, undo rows gone. */
static void test_rollback_two_dbs(void **state) {
  (void)state;
  PGconn *o = itest_pg(orders_url), *s = itest_pg(stock_url);
  long long f1 = frozen(s, 1);
  char xid[RM_XID_MAX];
  int64_t b1 = 0, b2 = 0;
  order_arg_t oa = order_two_dbs(o, s, "rollback_two_dbs", 1, 3, f1, xid, &b1, &b2);
  assert_int_equal(order_exists(o, oa.id), 1);
  assert_int_equal(frozen(s, 1), f1 + 3);
  int st = 0;
  assert_int_equal(rm_tm_rollback(client, xid, &st), 0);
  assert_int_equal(st, RM_GS_ROLLBACKED);
  /* The TC answers a rollback once the branches are undone. */
  assert_int_equal(order_exists(o, oa.id), 0);
  assert_int_equal(frozen(s, 1), f1);
  assert_int_equal(undo_rows(o, xid, 0) + undo_rows(o, xid, 1), 0);
  assert_int_equal(undo_rows(s, xid, 0) + undo_rows(s, xid, 1), 0);
}

static char *dump(PGconn *pg, const char *sql) {
  PGresult *r = PQexec(pg, sql);
  size_t cap = 1, len = 0;
  char *out = calloc(1, 1);
  for (int i = 0; out && PQresultStatus(r) == PGRES_TUPLES_OK && i < PQntuples(r); i++) {
    for (int j = 0; j < PQnfields(r); j++) {
      const char *v = PQgetisnull(r, i, j) ? "<NULL>" : PQgetvalue(r, i, j);
      size_t n = strlen(v) + 2;
      char *g = realloc(out, cap + n);
      if (!g) break;
      out = g;
      cap += n;
      len += (size_t)snprintf(out + len, cap - len, "%s|", v);
    }
  }
  PQclear(r);
  return out;
}

static void test_rollback_all_ops(void **state) {
  (void)state;
  PGconn *o = itest_pg(orders_url), *s = itest_pg(stock_url);
  assert_true(exec_ok(o, "INSERT INTO kv (k, v, n) VALUES ('all-ops-1', 'one', 1), ('all-ops-2', 'two', 2)"
                         " ON CONFLICT DO NOTHING"));
  assert_true(exec_ok(o, "INSERT INTO other.kv VALUES ('x', 'orig') ON CONFLICT DO NOTHING"));
  /* The caller's session prints times and dates its own way. */
  assert_true(exec_ok(o, "SET TimeZone = 'Asia/Tokyo'"));
  assert_true(exec_ok(o, "SET DateStyle = 'SQL, DMY'"));
  char *kv0 = dump(o, "SELECT * FROM kv ORDER BY k");
  char *okv0 = dump(o, "SELECT * FROM other.kv ORDER BY k");
  long long f2 = frozen(s, 2);

  char xid[RM_XID_MAX];
  assert_int_equal(rm_tm_begin(client, 30000, "all_ops", xid), 0);
  int64_t bid = 0;
  /* Stock: a delta up now and one down at the commit, on the same row. */
  assert_true(exec_ok(s, "SET TimeZone = 'America/Sao_Paulo'"));
  rm_branch_t *b = open_branch(s, xid, "stock");
  const char *pkb[3] = {ACTIVITY, TICKET, "2"};
  assert_int_equal(rm_at_update_delta(b, "activity_ticket_bucket", pkb, "frozen_count", 5, GUARD), 0);
  assert_int_equal(rm_at_update_delta_on_commit(b, "activity_ticket_bucket", pkb, "frozen_count", -1), 0);
  assert_int_equal(rm_at_prepare(b, &bid), 0);
  assert_true(exec_ok(s, "COMMIT"));
  assert_int_equal(rm_at_close(b, true), 0);
  assert_int_equal(frozen(s, 2), f2 + 5);

  /* Orders: insert, update the new row twice, update and delete kv rows
   * (generated and identity columns must come back as they were), update a
   * table of another schema. */
  long long id = atomic_fetch_add(&next_order, 1);
  assert_true(exec_ok(o, "BEGIN"));
  assert_int_equal(rm_at_open(client, xid, "orders", o, &b), 0);
  assert_int_equal(insert_order(b, id, 9, 1, 2, xid), 0);
  char sid[32];
  snprintf(sid, sizeof(sid), "%lld", id);
  const char *pk[1] = {sid};
  const char *c1[2] = {"status", "expire_at"}, *v1[2] = {"PAID", "2030-01-02 03:04:05+00"};
  assert_int_equal(rm_at_update(b, "trade_order", pk, 2, c1, v1), 0);
  const char *c2[1] = {"status"}, *v2[1] = {"CANCELLED"};
  assert_int_equal(rm_at_update(b, "trade_order", pk, 1, c2, v2), 0);
  const char *k1[1] = {"all-ops-1"}, *k2[1] = {"all-ops-2"};
  const char *c3[2] = {"v", "n"}, *v3[2] = {NULL, "41"};
  assert_int_equal(rm_at_update(b, "kv", k1, 2, c3, v3), 0);
  assert_int_equal(rm_at_delete(b, "kv", k2), 0);
  const char *k3[1] = {"x"};
  const char *c4[1] = {"v"}, *v4[1] = {"changed"};
  assert_int_equal(rm_at_update(b, "other.kv", k3, 1, c4, v4), 0);
  assert_int_equal(rm_at_prepare(b, &bid), 0);
  assert_true(exec_ok(o, "COMMIT"));
  assert_int_equal(rm_at_close(b, true), 0);
  assert_int_equal(order_exists(o, id), 1);
  assert_int_equal(q_ll(o, "SELECT n FROM kv WHERE k = 'all-ops-1'", NULL, NULL, NULL), 41);

  int st = 0;
  assert_int_equal(rm_tm_rollback(client, xid, &st), 0);
  assert_int_equal(st, RM_GS_ROLLBACKED);
  assert_int_equal(order_exists(o, id), 0);
  char *kv1 = dump(o, "SELECT * FROM kv ORDER BY k");
  char *okv1 = dump(o, "SELECT * FROM other.kv ORDER BY k");
  assert_string_equal(kv1, kv0);
  assert_string_equal(okv1, okv0);
  assert_int_equal(frozen(s, 2), f2);
  assert_int_equal(undo_rows(o, xid, 0) + undo_rows(s, xid, 0), 0);
  free(kv0);
  free(kv1);
  free(okv0);
  free(okv1);
}

/* A concurrent non-AT write changes the row after the branch: the rollback
 * detects it, overwrites nothing, and the global ends RollbackFailed. */
static void test_dirty_write(void **state) {
  (void)state;
  PGconn *o = itest_pg(orders_url);
  long long id = atomic_fetch_add(&next_order, 1);
  char sid[32];
  snprintf(sid, sizeof(sid), "%lld", id);
  assert_true(exec_ok(o, "BEGIN"));
  {
    const char *p[1] = {sid};
    PGresult *r = PQexecParams(o,
                               "INSERT INTO trade_order (order_id, activity_id, ticket_type, user_id, qty,"
                               " bucket_id) VALUES ($1, 1, 1, 5, 1, 3)",
                               1, NULL, p, NULL, NULL, 0);
    assert_int_equal(PQresultStatus(r), PGRES_COMMAND_OK);
    PQclear(r);
  }
  assert_true(exec_ok(o, "COMMIT"));

  char xid[RM_XID_MAX];
  rm_branch_t *b = begin_and_open(o, "dirty", "orders", xid);
  const char *pk[1] = {sid};
  const char *cols[1] = {"status"}, *vals[1] = {"PAID"};
  assert_int_equal(rm_at_update(b, "trade_order", pk, 1, cols, vals), 0);
  int64_t bid = 0;
  assert_int_equal(rm_at_prepare(b, &bid), 0);
  assert_true(exec_ok(o, "COMMIT"));
  rm_at_close(b, true);

  /* The dirty write: outside any global transaction. */
  {
    const char *p[1] = {sid};
    PGresult *r = PQexecParams(o, "UPDATE trade_order SET status = 'CANCELLED' WHERE order_id = $1", 1,
                               NULL, p, NULL, NULL, 0);
    assert_int_equal(PQresultStatus(r), PGRES_COMMAND_OK);
    PQclear(r);
  }
  int st = 0;
  /* Not 0: the rollback did not finish, and says so, with the repair. */
  assert_int_equal(rm_tm_rollback(client, xid, &st), RM_E_ROLLBACK_FAILED);
  assert_int_equal(st, RM_GS_ROLLBACK_FAILED);
  assert_non_null(strstr(rm_errmsg(), "tcctl redrive"));
  assert_non_null(strstr(rm_errmsg(), xid));
  assert_int_equal(global_status(xid), RM_GS_ROLLBACK_FAILED);
  /* Asked again: the same answer (idempotent). */
  assert_int_equal(rm_tm_rollback(client, xid, &st), RM_E_ROLLBACK_FAILED);
  char *now = q_str(o, "SELECT status FROM trade_order WHERE order_id = $1", sid, NULL);
  assert_non_null(now);
  assert_string_equal(now, "CANCELLED"); /* nothing overwritten */
  free(now);
  assert_int_equal(undo_rows(o, xid, 0), 1); /* kept for the operator */

  /* What the TC was told: unretryable, RM_E_DIRTY_WRITE, and a message
   * naming the table, the key and the column with both values. */
  phase2_reply_t reply;
  int bs = deliver_phase2(false, xid, bid, "orders", &reply);
  assert_int_equal(bs, TXP_BS_PHASE2_ROLLBACK_FAILED_UNRETRYABLE);
  assert_int_equal(reply.code, RM_E_DIRTY_WRITE);
  assert_non_null(strstr(reply.msg, "\"trade_order\""));
  assert_non_null(strstr(reply.msg, sid));
  assert_non_null(strstr(reply.msg, "status after \"PAID\", now \"CANCELLED\""));
  assert_int_equal(undo_rows(o, xid, 0), 1);
}

/* Insert one trade_order row 'sid' in a branch of 'xid' on 'pg' and commit it. */
static int64_t branch_insert_order_row(PGconn *pg, const char *xid, const char *sid) {
  rm_branch_t *b = open_branch(pg, xid, "orders");
  const char *cols[6] = {"order_id", "activity_id", "ticket_type", "user_id", "qty", "bucket_id"};
  const char *vals[6] = {sid, "1", "1", "6", "1", "3"};
  assert_int_equal(rm_at_insert(b, "trade_order", 6, cols, vals), 0);
  int64_t bid = 0;
  assert_int_equal(rm_at_prepare(b, &bid), 0);
  assert_true(exec_ok(pg, "COMMIT"));
  rm_at_close(b, true);
  return bid;
}

/* rm_config_t.undo_format = RM_UNDO_OBJECTS, for a rolling upgrade: the
 * undo row as earlier versions wrote and read it (objects, the whole
 * digest, every setting in a version 1 context), an invalid format
 * refused, and such a row rolled back (by either client: both read both
 * forms). */
static void test_undo_objects(void **state) {
  (void)state;
  rm_config_t bad = {.token = TOKEN, .application_id = "test_rm_at", .undo_format = 2};
  rm_client_t *none = NULL;
  assert_int_equal(itest_client_new(&tcd, bad, &none), -1);
  assert_non_null(strstr(rm_errmsg(), "undo_format 2"));

  rm_config_t cfg = {.token = TOKEN, .application_id = "test_rm_at", .request_timeout_ms = 15000,
                     .lock_wait_ms = 2000, .log_cb = log_cb, .log_level = RM_LOG_DEBUG,
                     .undo_format = RM_UNDO_OBJECTS};
  rm_client_t *older = NULL;
  assert_int_equal(itest_client_new(&tcd, cfg, &older), 0);
  assert_int_equal(rm_resource_add(older, "orders", orders_url), 0);
  assert_int_equal(itest_client_ready(older), 0);
  PGconn *o = itest_pg(orders_url);
  long long id = atomic_fetch_add(&next_order, 1);
  char sid[32], xid[RM_XID_MAX];
  snprintf(sid, sizeof(sid), "%lld", id);
  assert_true(exec_ok(o, "INSERT INTO other.kv VALUES ('objects', 'orig') ON CONFLICT (k) DO UPDATE SET v = 'orig'"));
  assert_int_equal(rm_tm_begin(older, 30000, "undo_objects", xid), 0);
  assert_true(exec_ok(o, "BEGIN"));
  rm_branch_t *b = NULL;
  assert_int_equal(rm_at_open(older, xid, "orders", o, &b), 0);
  const char *cols[6] = {"order_id", "activity_id", "ticket_type", "user_id", "qty", "bucket_id"};
  const char *vals[6] = {sid, "1", "1", "6", "1", "3"};
  assert_int_equal(rm_at_insert(b, "trade_order", 6, cols, vals), 0);
  const char *k[1] = {"objects"}, *c[1] = {"v"}, *v[1] = {"changed"};
  assert_int_equal(rm_at_update(b, "other.kv", k, 1, c, v), 0);
  assert_int_equal(rm_at_prepare(b, NULL), 0);
  assert_true(exec_ok(o, "COMMIT"));
  assert_int_equal(rm_at_close(b, true), 0);
  assert_int_equal(q_ll(o, "SELECT count(*) FROM undo_log WHERE xid = $1"
                           " AND context LIKE 'serializer=json;version=1;TimeZone=%;lc_monetary=%'"
                           " AND rollback_info::jsonb->0->>'op' = 'insert' AND length(rollback_info::jsonb->0->>'digest') = 44"
                           " AND rollback_info::jsonb->1->>'op' = 'update' AND rollback_info::jsonb->1->>'schema' = 'other'",
                        xid, NULL, NULL), 1);
  int st = 0;
  assert_int_equal(rm_tm_rollback(older, xid, &st), 0);
  assert_int_equal(st, RM_GS_ROLLBACKED);
  assert_int_equal(q_ll(o, "SELECT count(*) FROM trade_order WHERE order_id = $1", sid, NULL, NULL), 0);
  char *kv = q_str(o, "SELECT v FROM other.kv WHERE k = 'objects'", NULL, NULL);
  assert_non_null(kv);
  assert_string_equal(kv, "orig");
  free(kv);
  rm_client_free(older);
}

/* An insert's undo keeps the row's digest, not its image: a row changed
 * since is dirty (nothing deleted, the message shows the row as it is);
 * repaired to what the branch inserted, the re-driven rollback deletes
 * it.  And a row a later branch of the same global changed is restored by
 * that branch's undo first, so the digest matches again. */
static void test_insert_digest(void **state) {
  (void)state;
  PGconn *o = itest_pg(orders_url), *o2 = itest_pg(orders_url);
  long long id = atomic_fetch_add(&next_order, 1);
  char sid[32], xid[RM_XID_MAX];
  snprintf(sid, sizeof(sid), "%lld", id);
  assert_int_equal(rm_tm_begin(client, 30000, "insert_digest", xid), 0);
  int64_t bid = branch_insert_order_row(o, xid, sid);
  /* The compact insert item: ["i", table, key, the digest's head], and a
   * context that leaves out the demo's standard settings. */
  assert_int_equal(q_ll(o, "SELECT count(*) FROM undo_log WHERE xid = $1 AND rollback_info::jsonb->0->>0 = 'i'"
                           " AND jsonb_array_length(rollback_info::jsonb->0) = 4"
                           " AND length(rollback_info::jsonb->0->>3) = 22 AND context NOT LIKE '%TimeZone%'",
                        xid, NULL, NULL), 1);
  char *was = q_str(o, "SELECT status FROM trade_order WHERE order_id = $1", sid, NULL);
  assert_non_null(was);
  assert_true(exec_ok(o, "BEGIN"));
  {
    const char *p[1] = {sid};
    PGresult *r = PQexecParams(o, "UPDATE trade_order SET status = 'CANCELLED' WHERE order_id = $1", 1, NULL, p,
                               NULL, NULL, 0);
    assert_int_equal(PQresultStatus(r), PGRES_COMMAND_OK);
    PQclear(r);
  }
  assert_true(exec_ok(o, "COMMIT"));
  int st = 0;
  assert_int_equal(rm_tm_rollback(client, xid, &st), RM_E_ROLLBACK_FAILED);
  assert_int_equal(q_ll(o, "SELECT count(*) FROM trade_order WHERE order_id = $1", sid, NULL, NULL), 1);
  phase2_reply_t reply;
  assert_int_equal(deliver_phase2(false, xid, bid, "orders", &reply), TXP_BS_PHASE2_ROLLBACK_FAILED_UNRETRYABLE);
  assert_int_equal(reply.code, RM_E_DIRTY_WRITE);
  assert_non_null(strstr(reply.msg, "changed since the branch inserted it"));
  assert_non_null(strstr(reply.msg, "\"CANCELLED\""));
  /* The operator's repair: the row as the branch left it; then re-driven. */
  {
    const char *p[2] = {was, sid};
    PGresult *r = PQexecParams(o, "UPDATE trade_order SET status = $1 WHERE order_id = $2", 2, NULL, p, NULL, NULL,
                               0);
    assert_int_equal(PQresultStatus(r), PGRES_COMMAND_OK);
    PQclear(r);
  }
  free(was);
  assert_int_equal(deliver_phase2(false, xid, bid, "orders", &reply), TXP_BS_PHASE2_ROLLBACKED);
  assert_int_equal(q_ll(o, "SELECT count(*) FROM trade_order WHERE order_id = $1", sid, NULL, NULL), 0);

  /* Two branches of one global on the same row: insert, then update. */
  id = atomic_fetch_add(&next_order, 1);
  snprintf(sid, sizeof(sid), "%lld", id);
  assert_int_equal(rm_tm_begin(client, 30000, "insert_digest", xid), 0);
  branch_insert_order_row(o, xid, sid);
  rm_branch_t *b = open_branch(o2, xid, "orders");
  const char *pk[1] = {sid}, *cols[1] = {"status"}, *vals[1] = {"PAID"};
  assert_int_equal(rm_at_update(b, "trade_order", pk, 1, cols, vals), 0);
  assert_int_equal(rm_at_prepare(b, NULL), 0);
  assert_true(exec_ok(o2, "COMMIT"));
  rm_at_close(b, true);
  assert_int_equal(rm_tm_rollback(client, xid, &st), 0);
  assert_int_equal(st, RM_GS_ROLLBACKED);
  assert_int_equal(q_ll(o, "SELECT count(*) FROM trade_order WHERE order_id = $1", sid, NULL, NULL), 0);
  assert_int_equal(undo_rows(o, xid, 0), 0);
}

/* The branch registers, then the process "pauses": the TM rolls back
 * before the local transaction writes its undo row and commits.  The
 * rollback leaves the guard; the late local commit fails; nothing changes. */
typedef struct pause_ctx {
  const char *xid;
  PGconn *watch;
  int rollback_rc, rollback_status;
  long long guard_rows;
} pause_ctx_t;

static void pause_rollback(rm_branch_t *b, int64_t bid, void *arg) {
  (void)b;
  (void)bid;
  pause_ctx_t *p = arg;
  p->rollback_rc = rm_tm_rollback(client, p->xid, &p->rollback_status);
  p->guard_rows = WAIT_EQ(1, 10, undo_rows(p->watch, p->xid, 1));
}

static void test_never_committed(void **state) {
  (void)state;
  PGconn *s = itest_pg(stock_url), *w = itest_pg(stock_url);
  long long f4 = frozen(w, 4);
  char xid[RM_XID_MAX];
  assert_int_equal(rm_tm_begin(client, 30000, "never_committed", xid), 0);
  pause_ctx_t p = {xid, w, -1, -1, -1};
  rm_branch_t *b = open_branch(s, xid, "stock");
  const char *pk[3] = {ACTIVITY, TICKET, "4"};
  assert_int_equal(rm_at_update_delta(b, "activity_ticket_bucket", pk, "frozen_count", 7, GUARD), 0);
  rm__at_failpoint_arg = &p;
  rm__at_failpoint_after_register = pause_rollback;
  int64_t bid = 0;
  int rc = rm_at_prepare(b, &bid);
  rm__at_failpoint_after_register = NULL;
  assert_int_equal(p.rollback_rc, 0);
  assert_int_equal(p.rollback_status, RM_GS_ROLLBACKED);
  assert_int_equal(p.guard_rows, 1);
  /* The late undo row collides with the guard: the local transaction is
   * aborted, so its COMMIT commits nothing. */
  assert_int_equal(rc, RM_E_GLOBAL_NOT_ACTIVE);
  assert_non_null(strstr(rm_at_errmsg(b), "already rolled back"));
  PGresult *r = PQexec(s, "COMMIT");
  assert_int_equal(PQresultStatus(r), PGRES_COMMAND_OK);
  assert_string_equal(PQcmdStatus(r), "ROLLBACK");
  PQclear(r);
  rm_at_close(b, false);
  assert_int_equal(frozen(w, 4), f4);
  assert_int_equal(undo_rows(w, xid, 0), 0);
  assert_int_equal(undo_rows(w, xid, 1), 1);
  assert_int_equal(global_status(xid), RM_GS_ROLLBACKED);
}

/* Paused later: the undo row is written but not committed when the TM
 * rolls back.  The rollback waits for the local transaction (and gives up,
 * retryably, after its lock timeout); the local commit goes through; the
 * TC's retry then undoes it.  Nothing changes in the end either. */
static void *rollback_thread(void *arg) {
  const char *xid = arg;
  int st = 0;
  rm_tm_rollback(client, xid, &st);
  return NULL;
}

/* 'pause_ms' below the phase-two lock timeout (1 s here): the waiting
 * rollback sees the undo row appear and undoes it at once.  Above it: the
 * rollback gives up (retryable) and the TC's retry undoes it. */
static void late_commit(int pause_ms, int bucket) {
  PGconn *s = pg_open(stock_url), *w = pg_open(stock_url);
  assert_non_null(s);
  assert_non_null(w);
  long long f = frozen(w, bucket);
  char xid[RM_XID_MAX];
  bucket_key_t k;
  bucket_key(&k, bucket);
  rm_branch_t *b = begin_and_open(s, "late_commit", "stock", xid);
  assert_int_equal(rm_at_update_delta(b, "activity_ticket_bucket", k.pk, "frozen_count", 6, GUARD), 0);
  int64_t bid = 0;
  assert_int_equal(rm_at_prepare(b, &bid), 0);
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, rollback_thread, xid), 0);
  sleep_ms(pause_ms); /* the rollback is waiting on our uncommitted undo row */
  assert_true(exec_ok(s, "COMMIT"));
  rm_at_close(b, true);
  pthread_join(th, NULL);
  assert_int_equal(WAIT_EQ(RM_GS_ROLLBACKED, 20, global_status(xid)), RM_GS_ROLLBACKED);
  assert_int_equal(frozen(w, bucket), f);
  assert_int_equal(undo_rows(w, xid, 0), 0);
  PQfinish(s);
  PQfinish(w);
}

static void test_rollback_before_local_commit(void **state) {
  (void)state;
  late_commit(300, 5);
  late_commit(1600, 5);
}

/* Phase two twice, concurrently, late, and for branches never seen. */
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
  PGconn *s = itest_pg(stock_url);
  long long f6 = frozen(s, 6);

  /* A committed delta branch, left undecided at the TC: two concurrent
   * rollbacks delivered straight to the RM undo it exactly once. */
  char xid[RM_XID_MAX];
  assert_int_equal(rm_tm_begin(client, 30000, "dup", xid), 0);
  delta_arg_t d = {6, 5};
  int64_t bid = 0;
  assert_int_equal(run_branch(s, xid, "stock", body_delta, &d, &bid), 0);
  assert_int_equal(frozen(s, 6), f6 + 5);
  p2_arg_t a[2];
  pthread_t th[2];
  for (int i = 0; i < 2; i++) {
    a[i] = (p2_arg_t){{.commit = false, .xid = xid, .branch_id = bid, .resource_id = "stock",
                       .branch_type = TXP_BT_AT}, -1, -1};
    assert_int_equal(pthread_create(&th[i], NULL, phase2_thread, &a[i]), 0);
  }
  for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < 2; i++) {
    assert_int_equal(a[i].status, TXP_BS_PHASE2_ROLLBACKED);
    assert_int_equal(a[i].code, 0);
  }
  assert_int_equal(frozen(s, 6), f6); /* not f6 - 5 */
  /* Once more, late, after the TC's own rollback: still nothing. */
  int st = 0;
  assert_int_equal(rm_tm_rollback(client, xid, &st), 0);
  assert_int_equal(st, RM_GS_ROLLBACKED);
  int code = -1;
  char msg[512];
  assert_int_equal(rm__at_phase2(client, &a[0].req, &code, msg, sizeof(msg)), TXP_BS_PHASE2_ROLLBACKED);
  assert_int_equal(frozen(s, 6), f6);
  assert_int_equal(undo_rows(s, xid, 0), 0);

  /* Commit twice (and a rollback after a commit finds the undo row gone
   * and fences it: it never undoes a committed branch twice). */
  char xid2[RM_XID_MAX];
  assert_int_equal(rm_tm_begin(client, 30000, "dup_commit", xid2), 0);
  assert_int_equal(run_branch(s, xid2, "stock", body_delta, &d, &bid), 0);
  assert_int_equal(rm_tm_commit(client, xid2, &st), 0);
  rm_phase2_req_t c = {.commit = true, .xid = xid2, .branch_id = bid, .resource_id = "stock",
                       .branch_type = TXP_BT_AT};
  assert_int_equal(rm__at_phase2(client, &c, &code, msg, sizeof(msg)), TXP_BS_PHASE2_COMMITTED);
  assert_int_equal(rm__at_phase2(client, &c, &code, msg, sizeof(msg)), TXP_BS_PHASE2_COMMITTED);
  assert_int_equal(rm__at_flush(client), 0);
  assert_int_equal(WAIT_EQ(0, 10, undo_rows(s, xid2, 0)), 0);
  assert_int_equal(frozen(s, 6), f6 + 5);

  /* Branches this process never saw. */
  rm_phase2_req_t ghost = {.commit = false, .xid = "127.0.0.1:1:424242", .branch_id = 987654321,
                           .resource_id = "stock", .branch_type = TXP_BT_AT};
  assert_int_equal(rm__at_phase2(client, &ghost, &code, msg, sizeof(msg)), TXP_BS_PHASE2_ROLLBACKED);
  assert_int_equal(rm__at_phase2(client, &ghost, &code, msg, sizeof(msg)), TXP_BS_PHASE2_ROLLBACKED);
  assert_int_equal(undo_rows(s, ghost.xid, 1), 1);
  ghost.commit = true;
  ghost.branch_id = 987654322;
  assert_int_equal(rm__at_phase2(client, &ghost, &code, msg, sizeof(msg)), TXP_BS_PHASE2_COMMITTED);

  /* Requests it cannot serve. */
  assert_int_equal(rm__at_phase2(client, NULL, &code, msg, sizeof(msg)),
                   TXP_BS_PHASE2_ROLLBACK_FAILED_UNRETRYABLE);
  assert_int_equal(code, RM_E_INVALID);
  rm_phase2_req_t bad = ghost;
  bad.resource_id = "nosuch";
  assert_int_equal(rm__at_phase2(client, &bad, &code, msg, sizeof(msg)), TXP_BS_PHASE2_COMMIT_FAILED_RETRYABLE);
  assert_non_null(strstr(msg, "nosuch"));
  bad = ghost;
  bad.branch_type = TXP_BT_TCC; /* no TCC handlers here: another RM of the resource may have them */
  assert_int_equal(rm__at_phase2(client, &bad, &code, msg, sizeof(msg)), TXP_BS_PHASE2_COMMIT_FAILED_RETRYABLE);
  assert_int_equal(code, RM_E_NOT_SUPPORTED);
  bad = ghost;
  bad.xid = "";
  assert_int_equal(rm__at_phase2(client, &bad, &code, msg, sizeof(msg)), TXP_BS_PHASE2_COMMIT_FAILED_UNRETRYABLE);
}

/* Many threads share the one client: each runs whole global transactions
 * over both databases, committing two in three. */
#define MT_THREADS 8
#define MT_ITERS 12

typedef struct mt_arg {
  int idx;
  int committed_qty;
  int errors;
} mt_arg_t;

static void *mt_thread(void *arg) {
  mt_arg_t *a = arg;
  PGconn *o = pg_open(orders_url), *s = pg_open(stock_url);
  if (!o || !s) {
    a->errors++;
    goto out;
  }
  for (int i = 0; i < MT_ITERS; i++) {
    char xid[RM_XID_MAX];
    if (rm_tm_begin(client, 30000, "mt", xid) != 0) {
      a->errors++;
      continue;
    }
    int qty = 1 + (i % 3);
    order_arg_t oa = {atomic_fetch_add(&next_order, 1), 100 + a->idx, qty, 7, xid};
    delta_arg_t d = {7, qty};
    int64_t bid;
    bool ok = run_branch(o, xid, "orders", body_order, &oa, &bid) == 0 &&
              run_branch(s, xid, "stock", body_delta, &d, &bid) == 0;
    int st = 0;
    bool commit = ok && i % 3 != 0;
    int rc = commit ? rm_tm_commit(client, xid, &st) : rm_tm_rollback(client, xid, &st);
    if (!ok || rc != 0 || st != (commit ? RM_GS_COMMITTED : RM_GS_ROLLBACKED)) {
      fprintf(stderr, "  mt %d/%d: ok %d rc %d status %d\n", a->idx, i, ok, rc, st);
      a->errors++;
    } else if (commit) {
      a->committed_qty += qty;
    }
  }
out:
  PQfinish(o);
  PQfinish(s);
  return NULL;
}

static void test_many_threads(void **state) {
  (void)state;
  PGconn *o = itest_pg(orders_url), *s = itest_pg(stock_url);
  long long f7 = frozen(s, 7);
  pthread_t th[MT_THREADS];
  mt_arg_t a[MT_THREADS];
  for (int i = 0; i < MT_THREADS; i++) {
    a[i] = (mt_arg_t){i, 0, 0};
    assert_int_equal(pthread_create(&th[i], NULL, mt_thread, &a[i]), 0);
  }
  int errors = 0, qty = 0;
  for (int i = 0; i < MT_THREADS; i++) {
    pthread_join(th[i], NULL);
    errors += a[i].errors;
    qty += a[i].committed_qty;
  }
  assert_int_equal(errors, 0);
  assert_int_equal(frozen(s, 7), f7 + qty);
  long long sum = q_ll(o, "SELECT COALESCE(sum(qty), 0) FROM trade_order WHERE bucket_id = 7", NULL, NULL, NULL);
  assert_int_equal(sum, qty);
  assert_int_equal(WAIT_EQ(0, 10, q_ll(o, "SELECT count(*) FROM undo_log WHERE log_status = 0 AND xid IN"
                                          " (SELECT xid FROM trade_order WHERE bucket_id = 7)",
                                       NULL, NULL, NULL)),
                   0);
}

/* 64 concurrent freezes of one bucket row as delta branches (no global row
 * lock), half committed and half rolled back: exactly the committed total
 * stays frozen. */
#define NFREEZE 64

/* One freeze of 'bucket' by 'body' with 'body_arg', as its own global
 * transaction named 'name'. */
typedef struct fz_arg {
  int idx;
  pthread_barrier_t *bar;
  const char *name;
  body_fn body;
  void *body_arg;
  int errors;
} fz_arg_t;

static void *freeze_thread(void *arg) {
  fz_arg_t *a = arg;
  PGconn *s = pg_open(stock_url);
  char xid[RM_XID_MAX];
  bool began = s && rm_tm_begin(client, 60000, a->name, xid) == 0;
  pthread_barrier_wait(a->bar); /* all begun: freeze at once */
  int64_t bid;
  int rc = began ? run_branch(s, xid, "stock", a->body, a->body_arg, &bid) : RM_E_STATE;
  pthread_barrier_wait(a->bar); /* every freeze is in before any decision */
  int st = 0;
  bool commit = a->idx % 2 == 0;
  int rc2 = !began ? RM_E_STATE : commit ? rm_tm_commit(client, xid, &st) : rm_tm_rollback(client, xid, &st);
  if (rc != 0 || rc2 != 0 || st != (commit ? RM_GS_COMMITTED : RM_GS_ROLLBACKED)) {
    fprintf(stderr, "  %s %d: branch %d, decision %d, status %d\n", a->name, a->idx, rc, rc2, st);
    a->errors++;
  }
  PQfinish(s);
  return NULL;
}

/* NFREEZE threads freeze one ticket of 'bucket' each with 'body' (which
 * adds 1 to its frozen_count), half of them committed: the bucket ends
 * NFREEZE / 2 higher. */
static void freezes_half_committed(const char *name, int bucket, body_fn body, void *body_arg) {
  PGconn *s = pg_open(stock_url);
  assert_non_null(s);
  long long f0 = frozen(s, bucket);
  pthread_barrier_t bar;
  pthread_barrier_init(&bar, NULL, NFREEZE);
  pthread_t th[NFREEZE];
  fz_arg_t a[NFREEZE];
  for (int i = 0; i < NFREEZE; i++) {
    a[i] = (fz_arg_t){i, &bar, name, body, body_arg, 0};
    assert_int_equal(pthread_create(&th[i], NULL, freeze_thread, &a[i]), 0);
  }
  int errors = 0;
  for (int i = 0; i < NFREEZE; i++) {
    pthread_join(th[i], NULL);
    errors += a[i].errors;
  }
  pthread_barrier_destroy(&bar);
  assert_int_equal(errors, 0);
  assert_int_equal(frozen(s, bucket), f0 + NFREEZE / 2);
  PQfinish(s);
}

static void test_delta_64_freezes(void **state) {
  (void)state;
  delta_arg_t d = {8, 1};
  freezes_half_committed("freeze", 8, body_delta, &d);
}

/* The background deleter clears committed branches without help, and the
 * sweep removes rows past the retention age (and only those). */
static void test_cleanup(void **state) {
  (void)state;
  PGconn *s = itest_pg(stock_url);
  char xid[RM_XID_MAX];
  assert_int_equal(rm_tm_begin(client, 30000, "cleanup", xid), 0);
  delta_arg_t d = {10, 1};
  int64_t bid;
  assert_int_equal(run_branch(s, xid, "stock", body_delta, &d, &bid), 0);
  int st;
  assert_int_equal(rm_tm_commit(client, xid, &st), 0);
  assert_int_equal(WAIT_EQ(0, 10, undo_rows(s, xid, 0)), 0); /* flush_ms is 1 s */

  assert_true(exec_ok(s, "INSERT INTO undo_log (xid, branch_id, context, rollback_info, log_created)"
                         " VALUES ('old:1:1', 1, 'serializer=json;version=1', '[]',"
                         " now() - interval '2 days'),"
                         " ('new:1:1', 1, 'serializer=json;version=1', '[]', now())"));
  assert_true(exec_ok(s, "INSERT INTO undo_log (xid, branch_id, log_status, log_created)"
                         " VALUES ('old:1:1', 2, 1, now() - interval '3 days')"));
  long long removed = -1;
  assert_int_equal(rm__at_sweep(client, &removed), 0);
  assert_true(removed >= 2);
  assert_int_equal(q_ll(s, "SELECT count(*) FROM undo_log WHERE xid = 'old:1:1'", NULL, NULL, NULL), 0);
  assert_int_equal(q_ll(s, "SELECT count(*) FROM undo_log WHERE xid = 'new:1:1'", NULL, NULL, NULL), 1);
  assert_true(exec_ok(s, "DELETE FROM undo_log WHERE xid = 'new:1:1'"));
}

/* ------------------------------------------- deferred delta updates */

/* body_delta's update deferred (rm_at_update_delta_deferred). */
static int body_delta_deferred(rm_branch_t *b, void *arg) {
  delta_arg_t *d = arg;
  bucket_key_t k;
  bucket_key(&k, d->bucket);
  return rm_at_update_delta_deferred(b, "activity_ticket_bucket", k.pk, "frozen_count", d->delta, GUARD);
}

/* Another connection can lock bucket 'bucket' at once (NOWAIT). */
static bool row_free(int bucket) {
  PGconn *x = pg_open(stock_url);
  if (!x) return false;
  char sb[16];
  snprintf(sb, sizeof(sb), "%d", bucket);
  bool ok = exec_ok(x, "BEGIN") &&
            q_ll(x, "SELECT frozen_count FROM activity_ticket_bucket WHERE activity_id = 1 AND ticket_type = 1"
                    " AND bucket_id = $1 FOR UPDATE NOWAIT", sb, NULL, NULL) > LLONG_MIN + 1;
  exec_ok(x, "ROLLBACK");
  PQfinish(x);
  return ok;
}

/* A deferred delta changes nothing (and locks nothing) before prepare,
 * runs in prepare, commits; a rolled-back one is undone, also behind an
 * image update of the same row in the same branch (undo order = the
 * order prepare ran them). */
static void test_deferred_delta_commit_rollback(void **state) {
  (void)state;
  PGconn *s = itest_pg(stock_url);
  long long f0 = frozen(s, 12);
  char xid[RM_XID_MAX];
  int st = 0;
  rm_branch_t *b = begin_and_open(s, "deferred_commit", "stock", xid);
  delta_arg_t d = {12, 2};
  assert_int_equal(body_delta_deferred(b, &d), 0);
  assert_int_equal(frozen(s, 12), f0); /* not run yet */
  assert_true(row_free(12));           /* and the row is not locked */
  int64_t bid = 0;
  assert_int_equal(rm_at_prepare(b, &bid), 0);
  assert_true(bid > 0);
  assert_int_equal(frozen(s, 12), f0 + 2);
  assert_false(row_free(12)); /* now it is, until the COMMIT */
  assert_true(exec_ok(s, "COMMIT"));
  assert_int_equal(rm_at_close(b, true), 0);
  assert_true(row_free(12));
  assert_int_equal(q_ll(s, "SELECT count(*) FROM undo_log WHERE xid = $1 AND context LIKE '%delta=1%'", xid, NULL,
                        NULL),
                   1);
  assert_int_equal(rm_tm_commit(client, xid, &st), 0);
  assert_int_equal(st, RM_GS_COMMITTED);
  assert_int_equal(frozen(s, 12), f0 + 2);
  assert_int_equal(WAIT_EQ(0, 10, undo_rows(s, xid, 0)), 0);

  /* Rolled back: two deferred deltas and an image update of the same row
   * between them. */
  assert_int_equal(rm_tm_begin(client, 30000, "deferred_rollback", xid), 0);
  assert_true(exec_ok(s, "BEGIN"));
  assert_int_equal(rm_at_open(client, xid, "stock", s, &b), 0);
  delta_arg_t d3 = {12, 3};
  assert_int_equal(body_delta_deferred(b, &d3), 0);
  set_arg_t sa = {12, f0 + 10};
  assert_int_equal(body_set_frozen(b, &sa), 0);
  assert_int_equal(body_delta_deferred(b, &d3), 0);
  assert_int_equal(rm_at_prepare(b, NULL), 0);
  assert_int_equal(frozen(s, 12), f0 + 16);
  assert_true(exec_ok(s, "COMMIT"));
  assert_int_equal(rm_at_close(b, true), 0);
  assert_int_equal(rm_tm_rollback(client, xid, &st), 0);
  assert_int_equal(st, RM_GS_ROLLBACKED);
  assert_int_equal(frozen(s, 12), f0 + 2);
  assert_int_equal(undo_rows(s, xid, 0), 0);
}

/* A guard that refuses at prepare: RM_E_GUARD, the branch registered, the
 * deferred updates rolled back and the transaction usable with the
 * earlier statements intact; the caller rolls back and the global
 * transaction rolls back cleanly.  And what the deferred call itself
 * refuses at once, each leaving the transaction usable. */
static void test_deferred_delta_guard(void **state) {
  (void)state;
  PGconn *s = itest_pg(stock_url);
  long long f0 = frozen(s, 13);
  char xid[RM_XID_MAX];
  int st = 0;
  rm_branch_t *b = begin_and_open(s, "deferred_guard", "stock", xid);
  delta_arg_t now1 = {13, 1};
  assert_int_equal(body_delta(b, &now1), 0); /* an immediate one first */
  const char *pk_bad_row[3] = {ACTIVITY, TICKET, "999"};
  assert_int_equal(rm_at_update_delta_deferred(b, "activity_ticket_bucket", pk_bad_row, "frozen_count", 1, GUARD),
                   RM_E_NOT_ONE_ROW);
  assert_true(tx_usable(s));
  const char *pk_bad_val[3] = {ACTIVITY, TICKET, "abc"};
  assert_int_equal(rm_at_update_delta_deferred(b, "activity_ticket_bucket", pk_bad_val, "frozen_count", 1, GUARD),
                   RM_E_INVALID);
  assert_true(tx_usable(s));
  const char *pk13[3] = {ACTIVITY, TICKET, "13"};
  assert_int_equal(rm_at_update_delta_deferred(b, "activity_ticket_bucket", pk13, "no_such_col", 1, GUARD),
                   RM_E_INVALID);
  assert_int_equal(rm_at_update_delta_deferred(b, "activity_ticket_bucket", pk13, "bucket_id", 1, NULL),
                   RM_E_NOT_SUPPORTED);
  assert_int_equal(rm_at_update_delta_deferred(b, "no_such_table", pk13, "frozen_count", 1, NULL), RM_E_NO_TABLE);
  assert_int_equal(rm_at_update_delta_deferred(b, "activity_ticket_bucket", NULL, "frozen_count", 1, NULL),
                   RM_E_INVALID);
  assert_true(tx_usable(s));
  delta_arg_t ok1 = {13, 1}, too_many = {13, 1000000};
  assert_int_equal(body_delta_deferred(b, &ok1), 0);
  assert_int_equal(body_delta_deferred(b, &too_many), 0); /* accepted now, refused at prepare */
  assert_int_equal(frozen(s, 13), f0 + 1);
  int64_t bid = 0;
  assert_int_equal(rm_at_prepare(b, &bid), RM_E_GUARD);
  assert_non_null(strstr(rm_at_errmsg(b), "guard"));
  assert_true(tx_usable(s));
  assert_int_equal(frozen(s, 13), f0 + 1); /* the deferred ok1 rolled back too, the immediate one stands */
  assert_int_equal(q_ll(s, "SELECT count(*) FROM undo_log WHERE xid = $1", xid, NULL, NULL), 0);
  assert_int_equal(rm_at_prepare(b, NULL), RM_E_STATE);
  assert_true(exec_ok(s, "ROLLBACK"));
  assert_int_equal(rm_at_close(b, false), 0); /* reports PhaseOneFailed */
  assert_int_equal(rm_tm_rollback(client, xid, &st), 0);
  assert_int_equal(st, RM_GS_ROLLBACKED);
  assert_int_equal(frozen(s, 13), f0);
  assert_int_equal(q_ll(s, "SELECT count(*) FROM undo_log WHERE xid = $1 AND log_status = 0", xid, NULL, NULL), 0);

  /* Deferred after prepare: RM_E_STATE; a branch of deferred calls that
   * all failed has nothing to prepare. */
  assert_int_equal(rm_tm_begin(client, 30000, "deferred_state", xid), 0);
  assert_true(exec_ok(s, "BEGIN"));
  assert_int_equal(rm_at_open(client, xid, "stock", s, &b), 0);
  /* the first call of a branch fails inside its pipeline (savepoint,
   * settings, the read): the transaction stays usable */
  assert_int_equal(rm_at_update_delta_deferred(b, "activity_ticket_bucket", pk_bad_val, "frozen_count", 1, GUARD),
                   RM_E_INVALID);
  assert_true(tx_usable(s));
  assert_int_equal(rm_at_update_delta_deferred(b, "activity_ticket_bucket", pk_bad_row, "frozen_count", 1, GUARD),
                   RM_E_NOT_ONE_ROW);
  assert_true(tx_usable(s));
  assert_int_equal(rm_at_prepare(b, NULL), RM_E_STATE);
  assert_int_equal(body_delta_deferred(b, &ok1), 0);
  assert_int_equal(rm_at_prepare(b, NULL), 0);
  assert_int_equal(body_delta_deferred(b, &ok1), RM_E_STATE);
  assert_true(exec_ok(s, "COMMIT"));
  assert_int_equal(rm_at_close(b, true), 0);
  assert_int_equal(rm_tm_rollback(client, xid, &st), 0);
  assert_int_equal(st, RM_GS_ROLLBACKED);
  assert_int_equal(frozen(s, 13), f0);
}

/* Open a branch without statement savepoints. */
static rm_branch_t *open_unsaved(PGconn *pg, const char *xid, const char *resource) {
  rm_branch_t *b = NULL;
  if (!exec_ok(pg, "BEGIN") || rm_at_open(client, xid, resource, pg, &b) != 0) return NULL;
  if (rm_at_statement_savepoints(b, false) != 0) {
    rm_at_close(b, false);
    return NULL;
  }
  return b;
}

/* Without statement savepoints (rm_at_statement_savepoints): the same
 * commit and checked rollback of an insert, an image update and a
 * deferred delta; a failed statement fails the branch and leaves the
 * transaction aborted (no savepoint took it back: the proof none was
 * set); a guard refusing at prepare leaves it aborted too, so that a
 * COMMIT rolls back, and the global transaction rolls back to the
 * values before; the switch only before the first statement. */
static void test_without_savepoints(void **state) {
  (void)state;
  PGconn *s = itest_pg(stock_url), *o = itest_pg(orders_url);
  long long f0 = frozen(s, 15);
  char xid[RM_XID_MAX];
  int st = 0;

  /* committed */
  assert_int_equal(rm_tm_begin(client, 30000, "unsaved_commit", xid), 0);
  rm_branch_t *b = open_unsaved(s, xid, "stock");
  assert_non_null(b);
  delta_arg_t d2 = {15, 2};
  assert_int_equal(body_delta_deferred(b, &d2), 0);
  assert_int_equal(rm_at_statement_savepoints(b, true), RM_E_STATE); /* too late */
  assert_int_equal(rm_at_prepare(b, NULL), 0);
  assert_true(exec_ok(s, "COMMIT"));
  assert_int_equal(rm_at_close(b, true), 0);
  long long id = atomic_fetch_add(&next_order, 1);
  b = open_unsaved(o, xid, "orders");
  assert_non_null(b);
  assert_int_equal(insert_order(b, id, 7, 1, 15, xid), 0);
  assert_int_equal(rm_at_prepare(b, NULL), 0);
  assert_true(exec_ok(o, "COMMIT"));
  assert_int_equal(rm_at_close(b, true), 0);
  assert_int_equal(rm_tm_commit(client, xid, &st), 0);
  assert_int_equal(st, RM_GS_COMMITTED);
  assert_int_equal(frozen(s, 15), f0 + 2);
  assert_int_equal(order_exists(o, id), 1);

  /* rolled back: insert, image update and deferred delta undone */
  long long id2 = atomic_fetch_add(&next_order, 1);
  assert_int_equal(rm_tm_begin(client, 30000, "unsaved_rollback", xid), 0);
  b = open_unsaved(s, xid, "stock");
  assert_non_null(b);
  set_arg_t sa = {15, f0 + 10};
  assert_int_equal(body_set_frozen(b, &sa), 0);
  assert_int_equal(body_delta_deferred(b, &d2), 0);
  assert_int_equal(rm_at_prepare(b, NULL), 0);
  assert_int_equal(frozen(s, 15), f0 + 12);
  assert_true(exec_ok(s, "COMMIT"));
  assert_int_equal(rm_at_close(b, true), 0);
  b = open_unsaved(o, xid, "orders");
  assert_non_null(b);
  assert_int_equal(insert_order(b, id2, 7, 1, 15, xid), 0);
  assert_int_equal(rm_at_prepare(b, NULL), 0);
  assert_true(exec_ok(o, "COMMIT"));
  assert_int_equal(rm_at_close(b, true), 0);
  assert_int_equal(rm_tm_rollback(client, xid, &st), 0);
  assert_int_equal(st, RM_GS_ROLLBACKED);
  assert_int_equal(frozen(s, 15), f0 + 2);
  assert_int_equal(order_exists(o, id2), 0);

  /* a failing statement: the branch fails, the transaction is aborted */
  assert_int_equal(rm_tm_begin(client, 30000, "unsaved_fail", xid), 0);
  b = open_unsaved(o, xid, "orders");
  assert_non_null(b);
  assert_int_equal(insert_order(b, id, 7, 1, 15, xid), RM_E_DB); /* duplicate key */
  assert_int_equal(PQtransactionStatus(o), PQTRANS_INERROR);
  assert_non_null(strstr(rm_at_errmsg(b), "roll the transaction back"));
  assert_int_equal(insert_order(b, id2, 7, 1, 15, xid), RM_E_STATE);
  assert_int_equal(rm_at_prepare(b, NULL), RM_E_STATE);
  assert_true(exec_ok(o, "ROLLBACK"));
  assert_int_equal(rm_at_close(b, false), 0);

  /* a guard refusing at prepare: registered, aborted, rolled back clean */
  b = open_unsaved(s, xid, "stock");
  assert_non_null(b);
  delta_arg_t ok1 = {15, 1}, too_many = {15, 1000000};
  assert_int_equal(body_delta_deferred(b, &ok1), 0);
  assert_int_equal(body_delta_deferred(b, &too_many), 0);
  int64_t bid = 0;
  assert_int_equal(rm_at_prepare(b, &bid), RM_E_GUARD);
  assert_non_null(strstr(rm_at_errmsg(b), "guard"));
  assert_int_equal(PQtransactionStatus(s), PQTRANS_INERROR);
  PGresult *r = PQexec(s, "COMMIT"); /* what a careless caller would do */
  assert_string_equal(PQcmdStatus(r), "ROLLBACK");
  PQclear(r);
  assert_int_equal(rm_at_close(b, false), 0);
  assert_int_equal(rm_tm_rollback(client, xid, &st), 0);
  assert_int_equal(st, RM_GS_ROLLBACKED);
  assert_int_equal(frozen(s, 15), f0 + 2);
  assert_int_equal(q_ll(s, "SELECT count(*) FROM undo_log WHERE xid = $1 AND log_status = 0", xid, NULL, NULL), 0);

  /* a deferred delta of a row that does not exist: not read at the call
   * (no savepoints: no read), found by prepare, nothing written */
  assert_int_equal(rm_tm_begin(client, 30000, "unsaved_missing_row", xid), 0);
  b = open_unsaved(s, xid, "stock");
  assert_non_null(b);
  assert_int_equal(body_delta_deferred(b, &ok1), 0);
  delta_arg_t missing = {999, 1};
  assert_int_equal(body_delta_deferred(b, &missing), 0);
  assert_int_equal(rm_at_prepare(b, NULL), RM_E_NOT_ONE_ROW);
  assert_non_null(strstr(rm_at_errmsg(b), "is gone"));
  assert_true(exec_ok(s, "ROLLBACK"));
  assert_int_equal(rm_at_close(b, false), 0);
  assert_int_equal(rm_tm_rollback(client, xid, &st), 0);
  assert_int_equal(st, RM_GS_ROLLBACKED);
  assert_int_equal(frozen(s, 15), f0 + 2);
  assert_int_equal(q_ll(s, "SELECT count(*) FROM undo_log WHERE xid = $1 AND log_status = 0", xid, NULL, NULL), 0);
  assert_int_equal(rm_at_statement_savepoints(NULL, false), RM_E_INVALID);
}

/* rm_at_prepare_commit: the fused form (no savepoints, one deferred
 * delta or none) commits the branch with its undo row in one round trip,
 * and a refusal of the deferred guard, or its row gone, rolls the whole
 * transaction back (the branch's other rows with it); with savepoints it
 * is prepare, then COMMIT. */
static void prepare_commit_cases(const char *undo_type) {
  PGconn *s = itest_pg(stock_url), *o = itest_pg(orders_url), *o2 = itest_pg(orders_url);
  char *type = q_str(s, "SELECT format_type(atttypid, atttypmod) FROM pg_attribute"
                        " WHERE attrelid = 'undo_log'::regclass AND attname = 'rollback_info'", NULL, NULL);
  assert_non_null(type);
  assert_string_equal(type, undo_type);
  free(type);
  long long f0 = frozen(s, 11);
  char xid[RM_XID_MAX];
  int st = 0;
  bool committed = false;
  int64_t bid = 0;

  /* fused, one deferred delta: committed, undo row written */
  assert_int_equal(rm_tm_begin(client, 30000, "prepare_commit", xid), 0);
  rm_branch_t *b = open_unsaved(s, xid, "stock");
  assert_non_null(b);
  delta_arg_t d2 = {11, 2};
  assert_int_equal(body_delta_deferred(b, &d2), 0);
  assert_int_equal(rm_at_prepare_commit(b, &bid, &committed), 0);
  assert_true(committed);
  assert_true(bid > 0);
  assert_int_equal(PQtransactionStatus(s), PQTRANS_IDLE);
  assert_int_equal(rm_at_close(b, committed), 0);
  assert_int_equal(frozen(s, 11), f0 + 2);
  /* the demo's settings are the standard ones: the context leaves them out */
  assert_int_equal(q_ll(s, "SELECT count(*) FROM undo_log WHERE xid = $1 AND context = 'serializer=json;version=3;delta=1'",
                        xid, NULL, NULL),
                   1);
  /* the items as the library wrote them (a text column keeps its compact
   * text; jsonb, of version 3, its own) */
  assert_int_equal(q_ll(s, "SELECT count(*) FROM undo_log WHERE xid = $1 AND rollback_info::text LIKE"
                           " CASE pg_typeof(rollback_info) WHEN 'text'::regtype THEN '[[\"d\",\"activity_ticket_bucket\",{%'"
                           " ELSE '[[\"d\", \"activity_ticket_bucket\", {%' END",
                        xid, NULL, NULL),
                   1);
  /* fused, no deferred delta (an insert): committed */
  long long id = atomic_fetch_add(&next_order, 1);
  b = open_unsaved(o, xid, "orders");
  assert_non_null(b);
  assert_int_equal(insert_order(b, id, 9, 1, 11, xid), 0);
  assert_int_equal(rm_at_prepare_commit(b, NULL, &committed), 0);
  assert_true(committed);
  assert_int_equal(rm_at_close(b, true), 0);
  assert_int_equal(rm_tm_rollback(client, xid, &st), 0); /* and both undo */
  assert_int_equal(st, RM_GS_ROLLBACKED);
  assert_int_equal(frozen(s, 11), f0);
  assert_int_equal(order_exists(o, id), 0);

  /* fused refusal: an insert and a refused deferred delta, all rolled back */
  assert_int_equal(rm_tm_begin(client, 30000, "prepare_commit_refused", xid), 0);
  b = open_unsaved(s, xid, "stock");
  assert_non_null(b);
  const char *fcols[] = {"order_id", "activity_id", "ticket_type", "bucket_id", "user_id", "qty", "deadline"};
  char so[32];
  snprintf(so, sizeof(so), "%lld", atomic_fetch_add(&next_order, 1));
  const char *fvals[] = {so, ACTIVITY, TICKET, "11", "9", "1", "2099-01-01 00:00:00+00"};
  assert_int_equal(rm_at_insert(b, "stock_freeze", 7, fcols, fvals), 0);
  delta_arg_t too_many = {11, 1000000};
  assert_int_equal(body_delta_deferred(b, &too_many), 0);
  assert_int_equal(rm_at_prepare_commit(b, NULL, &committed), RM_E_GUARD);
  assert_false(committed);
  assert_non_null(strstr(rm_at_errmsg(b), "refused"));
  assert_int_equal(PQtransactionStatus(s), PQTRANS_IDLE);
  assert_int_equal(q_ll(s, "SELECT count(*) FROM stock_freeze WHERE order_id = $1", so, NULL, NULL), 0);
  assert_int_equal(q_ll(s, "SELECT count(*) FROM undo_log WHERE xid = $1", xid, NULL, NULL), 0);
  assert_int_equal(rm_at_close(b, false), 0);

  /* fused, the deferred delta's row deleted meanwhile: RM_E_NOT_ONE_ROW */
  assert_true(exec_ok(o2, "INSERT INTO kv (k, v, n) VALUES ('pc_gone', 'x', 1) ON CONFLICT (k) DO UPDATE SET n = 1"));
  b = open_unsaved(o, xid, "orders");
  assert_non_null(b);
  const char *kpk[1] = {"pc_gone"};
  assert_int_equal(rm_at_update_delta_deferred(b, "kv", kpk, "n", 1, NULL), 0);
  assert_true(exec_ok(o2, "DELETE FROM kv WHERE k = 'pc_gone'"));
  assert_int_equal(rm_at_prepare_commit(b, NULL, &committed), RM_E_NOT_ONE_ROW);
  assert_false(committed);
  assert_int_equal(PQtransactionStatus(o), PQTRANS_IDLE);
  assert_int_equal(rm_at_close(b, false), 0);
  assert_int_equal(rm_tm_rollback(client, xid, &st), 0);
  assert_int_equal(st, RM_GS_ROLLBACKED);
  assert_int_equal(frozen(s, 11), f0);

  /* with savepoints: prepare, then COMMIT */
  assert_int_equal(rm_tm_begin(client, 30000, "prepare_commit_saved", xid), 0);
  assert_true(exec_ok(s, "BEGIN"));
  assert_int_equal(rm_at_open(client, xid, "stock", s, &b), 0);
  assert_int_equal(body_delta_deferred(b, &d2), 0);
  assert_int_equal(rm_at_prepare_commit(b, NULL, &committed), 0);
  assert_true(committed);
  assert_int_equal(PQtransactionStatus(s), PQTRANS_IDLE);
  assert_int_equal(rm_at_close(b, true), 0);
  assert_int_equal(rm_tm_commit(client, xid, &st), 0);
  assert_int_equal(st, RM_GS_COMMITTED);
  assert_int_equal(frozen(s, 11), f0 + 2);
  assert_int_equal(rm_at_prepare_commit(NULL, NULL, &committed), RM_E_INVALID);
}

static void test_prepare_commit(void **state) {
  (void)state;
  prepare_commit_cases("text");
}

/* The undo column as version 3 of the RM schema made it (jsonb, before
 * sql/rm/004): the same library writes to it, the fused guard still
 * refuses, both roll back.  Put back to text after. */
static void test_undo_jsonb_column(void **state) {
  (void)state;
  static const char *const to_jsonb =
      "ALTER TABLE undo_log ALTER COLUMN rollback_info TYPE jsonb USING rollback_info::jsonb";
  static const char *const to_text = "ALTER TABLE undo_log ALTER COLUMN rollback_info TYPE text USING rollback_info::text";
  PGconn *s = itest_pg(stock_url), *o = itest_pg(orders_url);
  assert_true(exec_ok(s, to_jsonb));
  assert_true(exec_ok(o, to_jsonb));
  prepare_commit_cases("jsonb");
  assert_true(exec_ok(s, to_text));
  assert_true(exec_ok(o, to_text));
}

/* rm_at_insert_deferred.  A branch that is the insert alone, without
 * savepoints, on a connection with no transaction open, prepared by
 * rm_at_prepare_commit: one statement, committed by itself (the
 * connection idle after it), its undo row the compact insert item, and
 * the global's rollback deletes the row (the digest the statement kept is
 * the one the rollback compares).  A key the insert meets comes from
 * prepare_commit, nothing committed.  With savepoints and a transaction
 * of the caller's: a second deferred insert is refused (the branch still
 * usable), and prepare runs the insert as rm_at_insert_unlocked. */
static void test_insert_deferred(void **state) {
  (void)state;
  PGconn *o = itest_pg(orders_url), *o2 = itest_pg(orders_url);
  const char *cols[6] = {"order_id", "activity_id", "ticket_type", "user_id", "qty", "bucket_id"};
  char xid[RM_XID_MAX], sid[32], bid_s[32];
  int st = 0;
  bool committed = false;
  int64_t bid = 0;

  /* fused: the whole local transaction is one statement */
  long long id = atomic_fetch_add(&next_order, 1);
  snprintf(sid, sizeof(sid), "%lld", id);
  const char *vals[6] = {sid, "1", "1", "6", "1", "3"};
  assert_int_equal(rm_tm_begin(client, 30000, "insert_deferred", xid), 0);
  rm_branch_t *b = NULL;
  assert_int_equal(PQtransactionStatus(o), PQTRANS_IDLE);
  assert_int_equal(rm_at_open(client, xid, "orders", o, &b), 0);
  assert_int_equal(rm_at_statement_savepoints(b, false), 0);
  assert_int_equal(rm_at_insert_deferred(b, "trade_order", 6, cols, vals), 0);
  assert_int_equal(PQtransactionStatus(o), PQTRANS_IDLE); /* nothing sent yet */
  assert_int_equal(order_exists(o2, id), 0);
  assert_int_equal(rm_at_prepare_commit(b, &bid, &committed), 0);
  assert_true(committed);
  assert_true(bid > 0);
  assert_int_equal(PQtransactionStatus(o), PQTRANS_IDLE);
  assert_int_equal(rm_at_close(b, true), 0);
  assert_int_equal(order_exists(o2, id), 1);
  snprintf(bid_s, sizeof(bid_s), "%lld", (long long)bid);
  assert_int_equal(q_ll(o2, "SELECT count(*) FROM undo_log WHERE xid = $1 AND branch_id = $2::bigint"
                            " AND log_status = 0 AND context = 'serializer=json;version=3'",
                        xid, bid_s, NULL),
                   1);
  /* the compact insert item, as jsonb prints it: the key as text, the
   * digest's head of 22 characters (RM_ROW_DIGEST_KEPT) */
  char *info = q_str(o2, "SELECT rollback_info FROM undo_log WHERE xid = $1", xid, NULL);
  assert_non_null(info);
  char want[96];
  snprintf(want, sizeof(want), "[[\"i\", \"trade_order\", {\"order_id\": \"%s\"}, \"", sid);
  assert_memory_equal(info, want, strlen(want));
  assert_int_equal(strlen(info), strlen(want) + 22 + 3); /* the digest's head, then "]] */
  free(info);
  assert_int_equal(rm_tm_rollback(client, xid, &st), 0);
  assert_int_equal(st, RM_GS_ROLLBACKED);
  assert_int_equal(order_exists(o2, id), 0);

  /* the insert meets a key: prepare_commit's code, nothing committed */
  long long taken = atomic_fetch_add(&next_order, 1);
  char staken[32];
  snprintf(staken, sizeof(staken), "%lld", taken);
  const char *tvals[6] = {staken, "1", "1", "6", "1", "3"};
  assert_int_equal(q_ll(o2, "INSERT INTO trade_order (order_id, activity_id, ticket_type, user_id, qty, bucket_id)"
                            " VALUES ($1::bigint, 1, 1, 6, 1, 3) RETURNING 1",
                        staken, NULL, NULL),
                   1);
  assert_int_equal(rm_tm_begin(client, 30000, "insert_deferred_taken", xid), 0);
  assert_int_equal(rm_at_open(client, xid, "orders", o, &b), 0);
  assert_int_equal(rm_at_statement_savepoints(b, false), 0);
  assert_int_equal(rm_at_insert_deferred(b, "trade_order", 6, cols, tvals), 0);
  assert_int_equal(rm_at_prepare_commit(b, NULL, &committed), RM_E_DB);
  assert_false(committed);
  assert_non_null(strstr(rm_at_errmsg(b), "trade_order"));
  assert_int_equal(PQtransactionStatus(o), PQTRANS_IDLE);
  assert_int_equal(rm_at_close(b, false), 0);
  assert_int_equal(q_ll(o2, "SELECT count(*) FROM undo_log WHERE xid = $1", xid, NULL, NULL), 0);
  assert_int_equal(rm_tm_rollback(client, xid, &st), 0);
  assert_int_equal(st, RM_GS_ROLLBACKED);
  assert_int_equal(order_exists(o2, taken), 1); /* the other one's row stands */

  /* savepoints, the caller's transaction: run by prepare as an insert */
  id = atomic_fetch_add(&next_order, 1);
  snprintf(sid, sizeof(sid), "%lld", id);
  assert_int_equal(rm_tm_begin(client, 30000, "insert_deferred_saved", xid), 0);
  assert_true(exec_ok(o, "BEGIN"));
  assert_int_equal(rm_at_open(client, xid, "orders", o, &b), 0);
  assert_int_equal(rm_at_insert_deferred(b, "no_such_table", 6, cols, vals), RM_E_NO_TABLE);
  assert_int_equal(rm_at_insert_deferred(b, "trade_order", 6, cols, vals), 0);
  assert_int_equal(rm_at_insert_deferred(b, "trade_order", 6, cols, vals), RM_E_INVALID);
  assert_non_null(strstr(rm_at_errmsg(b), "one per branch"));
  assert_int_equal(rm_at_prepare_commit(b, NULL, &committed), 0);
  assert_true(committed);
  assert_int_equal(rm_at_close(b, true), 0);
  assert_int_equal(order_exists(o2, id), 1);
  assert_int_equal(rm_tm_rollback(client, xid, &st), 0);
  assert_int_equal(st, RM_GS_ROLLBACKED);
  assert_int_equal(order_exists(o2, id), 0);
  assert_int_equal(rm_at_insert_deferred(NULL, "trade_order", 6, cols, vals), RM_E_INVALID);

  /* the same as plain SQL (rm_at_sql_deferred): an INSERT of one row
   * without RETURNING; fused as above, then rolled back by its undo */
  static const char *const ins = "INSERT INTO trade_order (order_id, activity_id, ticket_type, user_id, qty, bucket_id)"
                                 " VALUES ($1, $2, $3, $4, $5, $6)";
  id = atomic_fetch_add(&next_order, 1);
  snprintf(sid, sizeof(sid), "%lld", id);
  assert_int_equal(rm_tm_begin(client, 30000, "sql_deferred", xid), 0);
  assert_int_equal(rm_at_open(client, xid, "orders", o, &b), 0);
  assert_int_equal(rm_at_sql_deferred(b, "UPDATE trade_order SET qty = 2 WHERE order_id = $1", 1, NULL, vals),
                   RM_E_NOT_SUPPORTED);
  assert_int_equal(rm_at_sql_deferred(b, "INSERT INTO trade_order (order_id, activity_id, ticket_type, user_id, qty,"
                                         " bucket_id) VALUES ($1, 1, 1, 6, 1, 3) RETURNING order_id", 1, NULL, vals),
                   RM_E_NOT_SUPPORTED);
  assert_non_null(strstr(rm_at_errmsg(b), "RETURNING"));
  assert_int_equal(rm_at_statement_savepoints(b, false), 0);
  assert_int_equal(rm_at_sql_deferred(b, ins, 6, NULL, vals), 0);
  assert_int_equal(PQtransactionStatus(o), PQTRANS_IDLE);
  assert_int_equal(rm_at_prepare_commit(b, NULL, &committed), 0);
  assert_true(committed);
  assert_int_equal(PQtransactionStatus(o), PQTRANS_IDLE);
  assert_int_equal(rm_at_close(b, true), 0);
  assert_int_equal(order_exists(o2, id), 1);
  assert_int_equal(q_ll(o2, "SELECT count(*) FROM undo_log WHERE xid = $1 AND rollback_info::jsonb->0->>0 = 'i'",
                        xid, NULL, NULL),
                   1);
  assert_int_equal(rm_tm_rollback(client, xid, &st), 0);
  assert_int_equal(st, RM_GS_ROLLBACKED);
  assert_int_equal(order_exists(o2, id), 0);

  /* ... and with savepoints: run by prepare as rm_at_sql_unlocked */
  id = atomic_fetch_add(&next_order, 1);
  snprintf(sid, sizeof(sid), "%lld", id);
  assert_int_equal(rm_tm_begin(client, 30000, "sql_deferred_saved", xid), 0);
  assert_int_equal(rm_at_open(client, xid, "orders", o, &b), 0);
  assert_int_equal(rm_at_sql_deferred(b, ins, 6, NULL, vals), 0);
  assert_int_equal(rm_at_sql_deferred(b, ins, 6, NULL, vals), RM_E_INVALID);
  assert_int_equal(rm_at_prepare_commit(b, NULL, &committed), 0);
  assert_true(committed);
  assert_int_equal(rm_at_close(b, true), 0);
  assert_int_equal(order_exists(o2, id), 1);
  assert_int_equal(rm_tm_commit(client, xid, &st), 0);
  assert_int_equal(st, RM_GS_COMMITTED);
  assert_int_equal(order_exists(o2, id), 1);
  assert_int_equal(rm_at_sql_deferred(NULL, ins, 6, NULL, vals), RM_E_INVALID);
}

/* rm_at_insert_unlocked: the branch registers no lock key for the row
 * (the coordinator's lock table has none for the global, where
 * rm_at_insert's row has one), and the rollback deletes it as before. */
static void test_insert_unlocked(void **state) {
  (void)state;
  PGconn *o = itest_pg(orders_url), *tc = itest_pg(tc_url);
  char xid[RM_XID_MAX];
  int st = 0;
  long long locked = atomic_fetch_add(&next_order, 1), unlocked = atomic_fetch_add(&next_order, 1);
  /* a setting away from its standard value, which the undo context keeps */
  assert_true(exec_ok(o, "SET IntervalStyle = 'iso_8601'"));
  rm_branch_t *b = begin_and_open(o, "insert_unlocked", "orders", xid);
  assert_int_equal(insert_order(b, locked, 8, 1, 0, xid), 0);
  char sid[32], su[16] = "8", sq[16] = "1", sb[16] = "0";
  snprintf(sid, sizeof(sid), "%lld", unlocked);
  const char *vals[] = {sid, ACTIVITY, TICKET, su, sq, sb, xid};
  assert_int_equal(rm_at_insert_unlocked(b, "trade_order", 7, order_cols, vals), 0);
  assert_int_equal(rm_at_prepare(b, NULL), 0);
  assert_true(exec_ok(o, "COMMIT"));
  assert_int_equal(rm_at_close(b, true), 0);
  /* the undo row's INSERT wrote into its context the one setting away
   * from its standard value (the rollback below applies it) */
  assert_int_equal(q_ll(o, "SELECT count(*) FROM undo_log WHERE xid = $1"
                           " AND context = 'serializer=json;version=3;IntervalStyle=iso_8601'",
                        xid, NULL, NULL),
                   1);
  char want[64];
  snprintf(want, sizeof(want), "%%trade_order^^^%lld", locked);
  assert_int_equal(q_ll(tc, "SELECT count(*) FROM lock_table WHERE xid = $1", xid, NULL, NULL), 1);
  assert_int_equal(q_ll(tc, "SELECT count(*) FROM lock_table WHERE xid = $1 AND row_key LIKE $2", xid, want, NULL), 1);
  assert_int_equal(rm_tm_rollback(client, xid, &st), 0);
  assert_int_equal(st, RM_GS_ROLLBACKED);
  assert_int_equal(order_exists(o, locked), 0);
  assert_int_equal(order_exists(o, unlocked), 0);
  assert_int_equal(rm_at_insert_unlocked(NULL, "trade_order", 7, order_cols, vals), RM_E_INVALID);
}

/* 64 concurrent deferred freezes of one row, half committed and half
 * rolled back: exactly the committed total stays frozen. */
static void test_deferred_delta_64_freezes(void **state) {
  (void)state;
  delta_arg_t d = {14, 1};
  freezes_half_committed("deferred_freeze", 14, body_delta_deferred, &d);
}

/* ------------------------------------------- leftover undo rows (lost deletes) */

static long long branch_rows(PGconn *pg, const char *xid, long long bid) {
  char b[32];
  snprintf(b, sizeof(b), "%lld", bid);
  return q_ll(pg, "SELECT count(*) FROM undo_log WHERE xid = $1 AND branch_id = $2 AND log_status = 0", xid, b,
              NULL);
}

/* An undo row as a lost phase-two delete leaves it, 'age_s' seconds old. */
static bool put_leftover(PGconn *pg, const char *xid, long long bid, int age_s) {
  char b[32], a[32];
  snprintf(b, sizeof(b), "%lld", bid);
  snprintf(a, sizeof(a), "%d", age_s);
  return q_ll(pg,
              "INSERT INTO undo_log (xid, branch_id, context, rollback_info, log_created)"
              " VALUES ($1, $2, 'serializer=json;version=1', '[]',"
              " pg_catalog.clock_timestamp() - $3::int8 * interval '1 second') RETURNING 1",
              xid, b, a) == 1;
}

/* A committed global whose orders branch ran; its undo row deleted by the
 * queue as usual.  Returns the branch id. */
static int64_t committed_order(PGconn *o, char *xid) {
  assert_int_equal(rm_tm_begin(client, 30000, "resolve_committed", xid), 0);
  order_arg_t oa = {atomic_fetch_add(&next_order, 1), 1, 1, 0, xid};
  int64_t bid = 0;
  assert_int_equal(run_branch(o, xid, "orders", body_order, &oa, &bid), 0);
  int st = 0;
  assert_int_equal(rm_tm_commit(client, xid, &st), 0);
  assert_int_equal(st, RM_GS_COMMITTED);
  assert_int_equal(WAIT_EQ(0, 10, undo_rows(o, xid, 0)), 0);
  return bid;
}

/* A kill -9 within flush_ms of a BranchCommit loses the queued delete: the
 * row of a Committed global stays.  The resolve pass asks the coordinator
 * and deletes it (past the grace age), and leaves alone the rows of a
 * Begin global, of a rolled-back one, of an xid the TC does not know, and
 * of a committed one still within the grace age. */
static void test_resolve_leftovers(void **state) {
  (void)state;
  PGconn *o = itest_pg(orders_url);
  char xc[RM_XID_MAX], xy[RM_XID_MAX], xb[RM_XID_MAX], xr[RM_XID_MAX];
  const char *xn = "resolve-not-found:1:1";
  int64_t bc = committed_order(o, xc), by = committed_order(o, xy);
  assert_int_equal(rm_tm_begin(client, 120000, "resolve_begin", xb), 0);
  assert_int_equal(rm_tm_begin(client, 30000, "resolve_rollback", xr), 0);
  int st = 0;
  assert_int_equal(rm_tm_rollback(client, xr, &st), 0);
  assert_int_equal(global_status(xb), RM_GS_BEGIN);
  assert_int_equal(global_status(xr), RM_GS_ROLLBACKED);
  assert_int_equal(global_status(xn), RM_E_GLOBAL_NOT_FOUND);

  /* The lost deletes (two rows of the old committed global), and the
   * rows that must stay. */
  assert_true(put_leftover(o, xc, bc, 300));
  assert_true(put_leftover(o, xc, bc + 1000000, 290));
  assert_true(put_leftover(o, xy, by, 0)); /* committed, but young */
  assert_true(put_leftover(o, xb, 1, 300));
  assert_true(put_leftover(o, xr, 1, 300));
  assert_true(put_leftover(o, xn, 1, 300));

  /* Passes every second (default grace: 30 s). */
  rm_at_tuning_t t = {.resolve_interval_s = 1};
  assert_int_equal(rm__at_tune(client, &t), 0);
  assert_int_equal(WAIT_EQ(0, 20, undo_rows(o, xc, 0)), 0);
  sleep_ms(2500); /* at least one more pass */
  assert_int_equal(branch_rows(o, xy, by), 1);
  assert_int_equal(branch_rows(o, xb, 1), 1);
  assert_int_equal(branch_rows(o, xr, 1), 1);
  assert_int_equal(branch_rows(o, xn, 1), 1);

  /* Past a 1 s grace the young committed row goes too; the others stay. */
  t = (rm_at_tuning_t){.resolve_grace_s = 1};
  assert_int_equal(rm__at_tune(client, &t), 0);
  assert_int_equal(WAIT_EQ(0, 20, undo_rows(o, xy, 0)), 0);
  sleep_ms(2500);
  assert_int_equal(branch_rows(o, xb, 1), 1);
  assert_int_equal(branch_rows(o, xr, 1), 1);
  assert_int_equal(branch_rows(o, xn, 1), 1);
  assert_int_equal(global_status(xb), RM_GS_BEGIN); /* the pass only asked */

  /* A leftover row locked by another session (as by a rollback in
   * progress) is skipped (SKIP LOCKED), never waited for. */
  assert_true(put_leftover(o, xc, bc, 300));
  PGconn *lk = pg_open(orders_url);
  assert_non_null(lk);
  assert_true(exec_ok(lk, "BEGIN"));
  char b[32];
  snprintf(b, sizeof(b), "%lld", (long long)bc);
  assert_int_equal(q_ll(lk, "SELECT count(*) FROM (SELECT 1 FROM undo_log WHERE xid = $1 AND branch_id = $2"
                            " FOR UPDATE) s",
                        xc, b, NULL),
                   1);
  sleep_ms(2500); /* passes ran; the locked row stays */
  assert_int_equal(branch_rows(o, xc, bc), 1);
  assert_true(exec_ok(lk, "COMMIT"));
  PQfinish(lk);
  assert_int_equal(WAIT_EQ(0, 20, undo_rows(o, xc, 0)), 0);

  /* Clean up; back to the defaults. */
  assert_int_equal(rm_tm_rollback(client, xb, &st), 0);
  const char *del = "DELETE FROM undo_log WHERE xid = $1 OR xid = $2 OR xid = $3 RETURNING 1";
  PGresult *r = PQexecParams(o, del, 3, NULL, (const char *const[]){xb, xr, xn}, NULL, NULL, 0);
  assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
  assert_int_equal(PQntuples(r), 3);
  PQclear(r);
  t = (rm_at_tuning_t){.resolve_interval_s = 30, .resolve_grace_s = 30};
  assert_int_equal(rm__at_tune(client, &t), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    ITEST_CASE(test_commit_two_dbs),
    ITEST_CASE(test_rollback_two_dbs),
    ITEST_CASE(test_rollback_all_ops),
    ITEST_CASE(test_dirty_write),
    ITEST_CASE(test_insert_digest),
    ITEST_CASE(test_undo_objects),
    ITEST_CASE(test_never_committed),
    ITEST_CASE(test_rollback_before_local_commit),
    ITEST_CASE(test_duplicate_phase2),
    ITEST_CASE(test_many_threads),
    ITEST_CASE(test_delta_64_freezes),
    ITEST_CASE(test_bad_input),
    ITEST_CASE(test_schema_change),
    ITEST_CASE(test_prepared_statements),
    ITEST_CASE(test_insert_fails_late),
    ITEST_CASE(test_open_idle),
    ITEST_CASE(test_begin_open),
    ITEST_CASE(test_register_early),
    ITEST_CASE(test_rehearsal),
    ITEST_CASE(test_cleanup),
    ITEST_CASE(test_deferred_delta_commit_rollback),
    ITEST_CASE(test_deferred_delta_guard),
    ITEST_CASE(test_deferred_delta_64_freezes),
    ITEST_CASE(test_without_savepoints),
    ITEST_CASE(test_insert_unlocked),
    ITEST_CASE(test_prepare_commit),
    ITEST_CASE(test_undo_jsonb_column),
    ITEST_CASE(test_insert_deferred),
    ITEST_CASE(test_resolve_leftovers),
    ITEST_CASE(test_giveback_refused_in_phase_one),
    ITEST_CASE(test_release_waits_for_commit),
    ITEST_CASE(test_release_rolled_back_after_tm_death),
    ITEST_CASE(test_move_on_commit_by_the_deleter),
    ITEST_CASE(test_commit_delta_leftover),
    ITEST_CASE(test_undo_refused_by_constraint),
    ITEST_CASE(test_resource_needs_undo_log),
    ITEST_CASE(test_update_add),
    ITEST_CASE(test_rollback_pending),
    ITEST_CASE(test_errmsg),
    ITEST_CASE(test_commit_failed),
    ITEST_CASE(test_sql_commit_rollback),
    ITEST_CASE(test_sql_returning_and_nothing),
    ITEST_CASE(test_sql_refused),
    ITEST_CASE(test_sql_dirty_write),
    ITEST_CASE(test_sql_global_lock),
    ITEST_CASE(test_sql_newcomer_row),
    ITEST_CASE(test_sql_select_for_update),
    ITEST_CASE(test_sql_select_for_update_timeout),
    ITEST_CASE(test_sql_hot_counter),
  };
  /* RM_TEST_FILTER=test_dirty* runs only the matching tests. */
  if (getenv("RM_TEST_FILTER")) cmocka_set_test_filter(getenv("RM_TEST_FILTER"));
  return cmocka_run_group_tests_name("rm_at", tests, group_setup, group_teardown);
}
