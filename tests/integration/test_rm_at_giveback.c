/*
 * test_rm_at_giveback.c - capacity given back by a global transaction
 * (issue 17): a decrement is refused in phase one, a give-back is recorded
 * with rm_at_update_delta_on_commit and applied only by the commit, on
 * every path that commits a branch (at once on a worker, by the deleter,
 * by the leftover pass), and an undo that a constraint refuses ends the
 * global in RollbackFailed instead of being retried forever.
 *
 * NOTES
 *   Runs in test_rm_at's program, on its fixture (rm_at_fixture.h).  Each
 *   test has its own small bucket (ids 20 and up, 4 tickets) so that "sold
 *   out" is one freeze away.  The regression of the issue is
 *   test_release_rolled_back_after_tm_death: a release whose TM dies after
 *   its local commit, another buyer before the timeout, then the checks.
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

#include "rm_at_int.h"
#include "rm_at_fixture.h"
#include "rm_client.h"
#include "rm_internal.h"
#include "txp_status.h"

#define SMALL_STOCK 4

/* Bucket 'bucket' of activity 1 with SMALL_STOCK tickets, frozen_count
 * 'frozen_count' and sold_count 'sold_count' (created or reset). */
static void small_bucket(PGconn *s, int bucket, int frozen_count, int sold_count) {
  char b[16], f[16], so[16], st[16];
  snprintf(b, sizeof(b), "%d", bucket);
  snprintf(f, sizeof(f), "%d", frozen_count);
  snprintf(so, sizeof(so), "%d", sold_count);
  snprintf(st, sizeof(st), "%d", SMALL_STOCK);
  const char *p[4] = {b, st, f, so};
  PGresult *r = PQexecParams(s,
                             "INSERT INTO activity_ticket_bucket (activity_id, ticket_type, bucket_id, stock,"
                             " frozen_count, sold_count) VALUES (1, 1, $1, $2, $3, $4)"
                             " ON CONFLICT (activity_id, ticket_type, bucket_id) DO UPDATE"
                             " SET stock = $2, frozen_count = $3, sold_count = $4",
                             4, NULL, p, NULL, NULL, 0);
  assert_int_equal(PQresultStatus(r), PGRES_COMMAND_OK);
  PQclear(r);
}

/* The stock database for the running case, with 'bucket' reset as
 * small_bucket does. */
static PGconn *open_small_bucket(int bucket, int frozen_count, int sold_count) {
  PGconn *s = itest_pg(stock_url);
  small_bucket(s, bucket, frozen_count, sold_count);
  return s;
}

static long long bucket_col(PGconn *s, int bucket, const char *col) {
  char b[16], sql[160];
  snprintf(b, sizeof(b), "%d", bucket);
  snprintf(sql, sizeof(sql),
           "SELECT %s FROM activity_ticket_bucket WHERE activity_id = 1 AND ticket_type = 1 AND bucket_id = $1", col);
  return q_ll(s, sql, b, NULL, NULL);
}

static long long undo_left(PGconn *pg, const char *xid) {
  return q_ll(pg, "SELECT count(*) FROM undo_log WHERE xid = $1 AND log_status = 0", xid, NULL, NULL);
}

static long long tc_locks(const char *xid) {
  PGconn *t = pg_open(tc_url);
  long long n = t ? q_ll(t, "SELECT count(*) FROM lock_table WHERE xid = $1", xid, NULL, NULL) : -1;
  PQfinish(t);
  return n;
}

/* The body of a branch: deltas on one bucket row. */
typedef struct move_arg {
  int bucket;
  long long freeze;          /* phase one, under GUARD (0: none) */
  long long frozen_on_commit; /* rm_at_update_delta_on_commit of frozen_count (0: none) */
  long long sold_on_commit;   /* ... of sold_count (0: none) */
  bool deferred;              /* the freeze through rm_at_update_delta_deferred */
} move_arg_t;

static int body_move(rm_branch_t *b, void *arg) {
  move_arg_t *m = arg;
  bucket_key_t k;
  bucket_key(&k, m->bucket);
  int rc = 0;
  if (m->freeze)
    rc = (m->deferred ? rm_at_update_delta_deferred : rm_at_update_delta)(b, "activity_ticket_bucket", k.pk,
                                                                          "frozen_count", m->freeze, GUARD);
  if (rc == 0 && m->frozen_on_commit)
    rc = rm_at_update_delta_on_commit(b, "activity_ticket_bucket", k.pk, "frozen_count", m->frozen_on_commit);
  if (rc == 0 && m->sold_on_commit)
    rc = rm_at_update_delta_on_commit(b, "activity_ticket_bucket", k.pk, "sold_count", m->sold_on_commit);
  return rc;
}

/* A global with one stock branch of 'm', committed (phase two awaited:
 * the undo row gone). */
static void freeze_committed(PGconn *s, move_arg_t m) {
  char xid[RM_XID_MAX];
  assert_int_equal(rm_tm_begin(client, 30000, "giveback_freeze", xid), 0);
  assert_int_equal(run_branch(s, xid, "stock", body_move, &m, NULL), 0);
  int st = 0;
  assert_int_equal(rm_tm_commit(client, xid, &st), 0);
  assert_int_equal(WAIT_EQ(0, 10, undo_left(s, xid)), 0);
}

/* A decrement in phase one is refused with nothing changed; a commit
 * delta that takes (net > 0 on a row) is refused by prepare before any
 * registration. */
void test_giveback_refused_in_phase_one(void **state) {
  (void)state;
  PGconn *s = open_small_bucket(20, 2, 0);
  char xid[RM_XID_MAX];
  rm_branch_t *b = begin_and_open(s, "giveback_refused", "stock", xid);
  const char *pk[3] = {ACTIVITY, TICKET, "20"};
  assert_int_equal(rm_at_update_delta(b, "activity_ticket_bucket", pk, "frozen_count", -2, NULL), RM_E_INVALID);
  assert_non_null(strstr(rm_at_errmsg(b), "gives capacity back"));
  assert_non_null(strstr(rm_at_errmsg(b), "rm_at_update_delta_on_commit"));
  assert_int_equal(rm_at_update_delta_deferred(b, "activity_ticket_bucket", pk, "frozen_count", -1, NULL),
                   RM_E_INVALID);
  assert_true(tx_usable(s));
  assert_int_equal(bucket_col(s, 20, "frozen_count"), 2);
  /* Recorded for the commit: nothing changes now. */
  assert_int_equal(rm_at_update_delta_on_commit(b, "activity_ticket_bucket", pk, "frozen_count", 1), 0);
  assert_int_equal(bucket_col(s, 20, "frozen_count"), 2);
  /* ... but +1 at the commit would take: prepare refuses it, unregistered. */
  assert_int_equal(rm_at_prepare(b, NULL), RM_E_INVALID);
  assert_non_null(strstr(rm_at_errmsg(b), "commit cannot be refused"));
  /* A missing row is found now, not at the commit. */
  const char *nopk[3] = {ACTIVITY, TICKET, "9999"};
  assert_int_equal(rm_at_update_delta_on_commit(b, "activity_ticket_bucket", nopk, "frozen_count", -1),
                   RM_E_NOT_ONE_ROW);
  assert_true(tx_usable(s));
  assert_true(exec_ok(s, "ROLLBACK"));
  assert_int_equal(rm_at_close(b, false), 0);
  PGconn *t = pg_open(tc_url);
  assert_non_null(t);
  assert_int_equal(q_ll(t, "SELECT count(*) FROM branch_table WHERE xid = $1", xid, NULL, NULL), 0);
  PQfinish(t);
  int st = 0;
  assert_int_equal(rm_tm_rollback(client, xid, &st), 0);
}

/* A release keeps the tickets taken until its global commits: a buyer in
 * between is refused (sold out), and after the commit the tickets are
 * back and can be bought. */
void test_release_waits_for_commit(void **state) {
  (void)state;
  PGconn *s = open_small_bucket(21, SMALL_STOCK, 0); /* sold out: all four frozen */
  char rel[RM_XID_MAX], buy[RM_XID_MAX];
  assert_int_equal(rm_tm_begin(client, 30000, "giveback_release", rel), 0);
  move_arg_t release = {.bucket = 21, .frozen_on_commit = -2};
  assert_int_equal(run_branch(s, rel, "stock", body_move, &release, NULL), 0);
  assert_int_equal(bucket_col(s, 21, "frozen_count"), SMALL_STOCK); /* still taken */

  assert_int_equal(rm_tm_begin(client, 30000, "giveback_buy_early", buy), 0);
  move_arg_t take = {.bucket = 21, .freeze = 2, .deferred = true};
  assert_int_equal(run_branch(s, buy, "stock", body_move, &take, NULL), RM_E_GUARD);
  int st = 0;
  assert_int_equal(rm_tm_rollback(client, buy, &st), 0);

  assert_int_equal(rm_tm_commit(client, rel, &st), 0);
  assert_int_equal(st, RM_GS_COMMITTED);
  /* The TC answered after the branch's commit (TXP_APP_DATA_PHASE2_SYNC):
   * the tickets are back when the TM hears "committed". */
  assert_int_equal(bucket_col(s, 21, "frozen_count"), SMALL_STOCK - 2);
  assert_int_equal(undo_left(s, rel), 0);
  PGconn *t = pg_open(tc_url);
  assert_non_null(t);
  assert_int_equal(q_ll(t, "SELECT count(*) FROM global_history WHERE xid = $1", rel, NULL, NULL), 1);
  PQfinish(t);

  freeze_committed(s, (move_arg_t){.bucket = 21, .freeze = 2, .deferred = true});
  assert_int_equal(bucket_col(s, 21, "frozen_count"), SMALL_STOCK);
}

/*
 * The regression of issue 17.  A cancel: the order row updated (a global
 * lock) and the freeze released, both committed locally; then the TM dies
 * (it never commits).  Another buyer comes before the global timeout.
 * Before the fix the release had given the tickets back at its local
 * commit, the buyer took them, and the timeout's undo (frozen + 2) broke
 * the bucket's CHECK forever: the global retried without end, its locks
 * held.  Now the buyer is refused and the timeout rolls back cleanly.
 */
void test_release_rolled_back_after_tm_death(void **state) {
  (void)state;
  PGconn *s = open_small_bucket(22, SMALL_STOCK, 0), *o = itest_pg(orders_url);
  assert_true(exec_ok(o, "INSERT INTO kv (k, v, n) VALUES ('giveback-order', 'UNPAID', 1)"
                         " ON CONFLICT (k) DO UPDATE SET v = 'UNPAID'"));
  char cancel[RM_XID_MAX];
  assert_int_equal(rm_tm_begin(client, 1000, "cancel", cancel), 0);
  rm_branch_t *b = open_branch(o, cancel, "orders");
  const char *k[1] = {"giveback-order"}, *c[1] = {"v"}, *v[1] = {"CANCELLED"};
  assert_int_equal(rm_at_update(b, "kv", k, 1, c, v), 0);
  assert_int_equal(rm_at_prepare(b, NULL), 0);
  assert_true(exec_ok(o, "COMMIT"));
  assert_int_equal(rm_at_close(b, true), 0);
  move_arg_t release = {.bucket = 22, .frozen_on_commit = -2};
  assert_int_equal(run_branch(s, cancel, "stock", body_move, &release, NULL), 0);
  /* The TM is gone: no commit, no rollback from it. */
  assert_int_equal(tc_locks(cancel), 1);

  /* Another buyer before the timeout: nothing was given back. */
  char buy[RM_XID_MAX];
  assert_int_equal(rm_tm_begin(client, 30000, "buy_in_the_window", buy), 0);
  move_arg_t take = {.bucket = 22, .freeze = 2, .deferred = true};
  assert_int_equal(run_branch(s, buy, "stock", body_move, &take, NULL), RM_E_GUARD);
  int st = 0;
  assert_int_equal(rm_tm_rollback(client, buy, &st), 0);

  /* The timeout rolls the cancel back: it finishes, no lock left, nothing
   * oversold, the totals where they were. */
  assert_int_equal(WAIT_EQ(RM_GS_TIMEOUT_ROLLBACKED, 20, global_status(cancel)), RM_GS_TIMEOUT_ROLLBACKED);
  assert_int_equal(tc_locks(cancel), 0);
  assert_int_equal(undo_left(s, cancel) + undo_left(o, cancel), 0);
  assert_int_equal(bucket_col(s, 22, "frozen_count"), SMALL_STOCK);
  assert_int_equal(bucket_col(s, 22, "sold_count"), 0);
  char *now = NULL;
  {
    PGresult *r = PQexec(o, "SELECT v FROM kv WHERE k = 'giveback-order'");
    assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
    now = strdup(PQgetvalue(r, 0, 0));
    PQclear(r);
  }
  assert_string_equal(now, "UNPAID");
  free(now);
}

/* A confirm is a move (frozen -2, sold +2) on a full bucket: applied in
 * one UPDATE (separately, sold + 2 first would break the CHECK).  The
 * branch is not remembered for an inline commit (as after a restart), so
 * the deleter's batch commits it, and must apply the deltas, not just
 * delete the row. */
void test_move_on_commit_by_the_deleter(void **state) {
  (void)state;
  PGconn *s = open_small_bucket(23, SMALL_STOCK, 0);
  char xid[RM_XID_MAX];
  assert_int_equal(rm_tm_begin(client, 30000, "giveback_confirm", xid), 0);
  move_arg_t confirm = {.bucket = 23, .sold_on_commit = 2, .frozen_on_commit = -2};
  int64_t bid = 0;
  assert_int_equal(run_branch(s, xid, "stock", body_move, &confirm, &bid), 0);
  rm__at_inline_remove(rm__at_resource_find(client, "stock"), xid, bid);
  int st = 0;
  assert_int_equal(rm_tm_commit(client, xid, &st), 0);
  assert_int_equal(WAIT_EQ(0, 10, undo_left(s, xid)), 0);
  assert_int_equal(bucket_col(s, 23, "frozen_count"), SMALL_STOCK - 2);
  assert_int_equal(bucket_col(s, 23, "sold_count"), 2);
  /* Exactly once: a BranchCommit replayed finds no row and changes nothing. */
  phase2_reply_t reply;
  rm__at_inline_add(rm__at_resource_find(client, "stock"), xid, bid);
  assert_int_equal(deliver_phase2(true, xid, bid, "stock", &reply), TXP_BS_PHASE2_COMMITTED);
  assert_int_equal(rm__at_flush(client), 0);
  assert_int_equal(bucket_col(s, 23, "frozen_count"), SMALL_STOCK - 2);
  assert_int_equal(bucket_col(s, 23, "sold_count"), 2);
}

/* An undo row with commit deltas whose phase two never came (the service
 * died after the global committed): the leftover pass applies it, once;
 * the sweep never deletes such a row. */
void test_commit_delta_leftover(void **state) {
  (void)state;
  PGconn *s = open_small_bucket(24, SMALL_STOCK, 0);
  char xid[RM_XID_MAX];
  assert_int_equal(rm_tm_begin(client, 30000, "giveback_leftover", xid), 0);
  move_arg_t rel = {.bucket = 24, .frozen_on_commit = -3};
  assert_int_equal(run_branch(s, xid, "stock", body_move, &rel, NULL), 0);
  /* As the row of a dead process: copied aside before the commit, put
   * back after it, old. */
  char *lit = PQescapeLiteral(s, xid, strlen(xid));
  assert_non_null(lit);
  char sql[512];
  snprintf(sql, sizeof(sql), "CREATE TEMP TABLE kept AS SELECT * FROM undo_log WHERE xid = %s", lit);
  PQfreemem(lit);
  assert_true(exec_ok(s, sql));
  assert_int_equal(q_ll(s, "SELECT count(*) FROM kept WHERE context LIKE '%;commit=1%'", NULL, NULL, NULL), 1);
  int st = 0;
  assert_int_equal(rm_tm_commit(client, xid, &st), 0);
  assert_int_equal(WAIT_EQ(SMALL_STOCK - 3, 10, bucket_col(s, 24, "frozen_count")), SMALL_STOCK - 3);
  assert_int_equal(WAIT_EQ(0, 10, undo_left(s, xid)), 0);
  small_bucket(s, 24, SMALL_STOCK, 0); /* as if the commit had not reached this database */
  assert_true(exec_ok(s, "INSERT INTO undo_log (xid, branch_id, context, rollback_info, log_status, log_created)"
                         " SELECT xid, branch_id, context, rollback_info, 0, now() - interval '1 day 1 hour'"
                         " FROM kept"));
  /* The sweep (retention 1 day) never deletes it unapplied (the leftover
   * pass may have applied it meanwhile: then the deltas are in). */
  long long removed = -1;
  assert_int_equal(rm__at_sweep(client, &removed), 0);
  assert_true(undo_left(s, xid) == 1 || bucket_col(s, 24, "frozen_count") == SMALL_STOCK - 3);
  /* The leftover pass asks the TC (Committed) and applies it. */
  rm_at_tuning_t t = {.resolve_interval_s = 1};
  assert_int_equal(rm__at_tune(client, &t), 0);
  assert_int_equal(WAIT_EQ(0, 20, undo_left(s, xid)), 0);
  assert_int_equal(bucket_col(s, 24, "frozen_count"), SMALL_STOCK - 3);
  t = (rm_at_tuning_t){.resolve_interval_s = 30};
  assert_int_equal(rm__at_tune(client, &t), 0);
  assert_true(exec_ok(s, "DROP TABLE kept"));
}

/* An undo that a constraint refuses (a write outside the coordinator took
 * the bucket's frozen count below what the branch froze) is not retried
 * forever: the branch is unretryable, the global RollbackFailed, the undo
 * row kept for the operator, the message saying what to do. */
void test_undo_refused_by_constraint(void **state) {
  (void)state;
  PGconn *s = open_small_bucket(25, 0, 0);
  char xid[RM_XID_MAX];
  assert_int_equal(rm_tm_begin(client, 30000, "giveback_refused_undo", xid), 0);
  move_arg_t take = {.bucket = 25, .freeze = 2};
  int64_t bid = 0;
  assert_int_equal(run_branch(s, xid, "stock", body_move, &take, &bid), 0);
  assert_true(exec_ok(s, "UPDATE activity_ticket_bucket SET frozen_count = 0"
                         " WHERE activity_id = 1 AND ticket_type = 1 AND bucket_id = 25"));
  int st = 0;
  assert_int_equal(rm_tm_rollback(client, xid, &st), RM_E_ROLLBACK_FAILED);
  assert_int_equal(st, RM_GS_ROLLBACK_FAILED);
  assert_int_equal(WAIT_EQ(RM_GS_ROLLBACK_FAILED, 20, global_status(xid)), RM_GS_ROLLBACK_FAILED);
  assert_int_equal(undo_left(s, xid), 1);
  assert_int_equal(bucket_col(s, 25, "frozen_count"), 0);
  phase2_reply_t reply;
  assert_int_equal(deliver_phase2(false, xid, bid, "stock", &reply), TXP_BS_PHASE2_ROLLBACK_FAILED_UNRETRYABLE);
  assert_int_equal(reply.code, TXP_EBRANCH_UNRETRYABLE);
  assert_non_null(strstr(reply.msg, "activity_ticket_bucket_count_check"));
  assert_non_null(strstr(reply.msg, "SQLSTATE 23514"));
  assert_non_null(strstr(reply.msg, "tcctl"));
  PGconn *t = itest_pg(tc_url);
  assert_int_equal(q_ll(t, "SELECT status FROM global_table WHERE xid = $1", xid, NULL, NULL), RM_GS_ROLLBACK_FAILED);
}
