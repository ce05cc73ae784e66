/*
 * test_tcd.c - tcd end to end, the protocol: a real tcd process (the binary
 * the build made, sanitizers and all) on a real PostgreSQL, driven over the
 * wire with txclient: commit and rollback of two branches, lock conflicts
 * and lock waits, repeated messages, bad input, re-registration with
 * requests in flight.
 *
 * NOTES
 *   The fixture (tcd, the RM thread, the store, raw clients) is tcd_suite.h,
 *   shared with test_tcd_recovery (deadlines, failed phase two, a crash,
 *   the clean stop).  All tests share the group's tcd, which the group
 *   teardown stops with SIGTERM and a required clean exit.  Each test uses
 *   its own xids and lock keys.
 *
 *   Besides scenarios 1, 2, 3, 5 and 7 of the brief, 3b and 7b, and a few
 *   checks inside the others, pin down bugs found while writing these
 *   tests: a lock waiter that missed its wake-up, a use-after-free when a
 *   connection registers again with requests in flight.
 *
 *   Threads: the cmocka test thread (all assertions), the RM thread, and a
 *   background TM/RM client in the bad-input test.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tcd_suite.h"

/* ------------------------------------------------------------ helpers */

/* The waiting registration 'id' was granted after a wait: 'xid' holds
 * 'row_key' now. */
static void expect_granted_after_wait(txc_t *c, reader_t *rd, uint64_t id, const char *row_key, const char *xid) {
  txp_msg_t res;
  expect_answer(c, rd, id, &res, 0);
  assert_true(res.branch_id > 0);
  assert_true(txp_msg_has(&res, TXP_F_WAITED_MS));
  assert_true(res.waited_ms > 0);
  txp_msg_clear(&res);
  char holder[TXP_MAX_XID_LEN + 1];
  db_text(SQL_KEY_HOLDER, row_key, holder, sizeof(holder));
  assert_string_equal(holder, xid);
}

/* The client id 'branch' was registered under. */
static void branch_client(int64_t branch, char *out, size_t cap) {
  char bid[32];
  snprintf(bid, sizeof(bid), "%" PRId64, branch);
  db_text("SELECT client_id FROM branch_table WHERE branch_id = $1::bigint", bid, out, cap);
}

/* A RegisterRM (resources "db_client") or RegisterTM with a new identity. */
static void msg_identity(txp_msg_t *m, bool as_rm, const char *app, const char *client_id) {
  txp_msg_init(m, as_rm ? TXP_MSG_REGISTER_RM : TXP_MSG_REGISTER_TM);
  txp_msg_set_str(m, TXP_F_APP_ID, app);
  txp_msg_set_str(m, TXP_F_CLIENT_ID, client_id);
  txp_msg_set_str(m, TXP_F_TOKEN, TOKEN);
  if (as_rm) txp_msg_set_str(m, TXP_F_RESOURCE_IDS, "db_client");
}

/* ===================================================================== */
/*                                tests                                  */
/* ===================================================================== */

/* 1. Two branches, commit: Committed at once, phase two cleans up. */
static void test_commit_two_branches(void **state) {
  (void)state;
  cli_t cl = new_cli("t1");
  two_branch_tx_t tx;
  begin_two_branches(&cl, 30000, "t1-commit", "t_order:1", "t_stock:1", &tx);
  assert_true(tx.orders != tx.stock);
  assert_int_equal(db_long(SQL_GLOBAL_STATUS, tx.xid, NULL), TXP_GS_BEGIN);
  assert_int_equal(db_long(SQL_BRANCHES, tx.xid, NULL), 2);
  assert_int_equal(db_long(SQL_LOCKS, tx.xid, NULL), 2);

  int status = -1;
  commit_ok(cl.tm, tx.xid);

  expect_history(tx.xid, TXP_GS_COMMITTED, WAIT_MS);
  assert_int_equal(history_branches(tx.xid, TXP_BS_PHASE2_COMMITTED), 2);
  assert_int_equal(db_long(SQL_LIVE_ROWS, tx.xid, NULL), 0);
  expect_commits_told(tx.xid, tx.orders, tx.stock); /* told after the answer */
  assert_int_equal(rm_events(tx.xid, TXP_MSG_BRANCH_ROLLBACK, 0, NULL, 0), 0);
  /* The TM sees the same answer from GlobalStatus now. */
  assert_int_equal(txc_status(cl.tm, tx.xid, &status), 0);
  assert_int_equal(status, TXP_GS_COMMITTED);
}

/* 1b. A BranchRegister without an xid, with a timeout, begins the global
 * and registers its first branch in one call: the answer has both; the
 * global is its caller's, Begin, and goes on as any other.  Only an AT
 * branch without lock keys. */
static void begin_register_call(txc_t *c, const char *resource, int type, const char *keys, txp_msg_t *res) {
  txp_msg_t req;
  txp_msg_init(&req, TXP_MSG_BRANCH_REGISTER);
  txp_msg_set_int(&req, TXP_F_BRANCH_TYPE, (uint64_t)type);
  txp_msg_set_str(&req, TXP_F_RESOURCE_ID, resource);
  txp_msg_set_int(&req, TXP_F_TIMEOUT_MS, 30000);
  txp_msg_set_str(&req, TXP_F_NAME, "t1b-begin-register");
  if (keys) txp_msg_set_str(&req, TXP_F_LOCK_KEYS, keys);
  assert_int_equal(txc_call(c, &req, res, 10000), 0);
}

static void test_begin_register(void **state) {
  (void)state;
  cli_t cl = new_cli("t1b");
  txp_msg_t res;
  begin_register_call(cl.rm, "db_orders", TXP_BT_AT, NULL, &res);
  assert_int_equal(res.code, 0);
  assert_true(txp_msg_has(&res, TXP_F_XID) && res.xid && res.xid[0]);
  assert_true(res.branch_id > 0 && res.timeout_ms == 30000);
  char xid[TXP_MAX_XID_LEN + 1];
  snprintf(xid, sizeof(xid), "%s", res.xid);
  int64_t b1 = res.branch_id;
  txp_msg_clear(&res);
  assert_int_equal(db_long(SQL_GLOBAL_STATUS, xid, NULL), TXP_GS_BEGIN);
  assert_int_equal(db_long(SQL_BRANCHES, xid, NULL), 1);
  assert_int_equal(db_long(SQL_LOCKS, xid, NULL), 0);
  assert_int_equal(db_long("SELECT count(*) FROM global_table WHERE xid = $1 AND transaction_name = "
                           "'t1b-begin-register' AND application_id = 'test-app'", xid, NULL), 1);
  /* a second branch the usual way, then the TM's commit */
  int64_t b2 = register_ok(cl.rm, xid, "db_stock", "t_stock:1b");
  commit_ok(cl.tm, xid);
  assert_int_equal(history_branches(xid, TXP_BS_PHASE2_COMMITTED), 2);
  expect_commits_told(xid, b1, b2);
  /* refused: lock keys, another branch type; nothing begun */
  long globals = db_long("SELECT count(*) FROM global_table", NULL, NULL);
  begin_register_call(cl.rm, "db_orders", TXP_BT_AT, "t_order:1b", &res);
  assert_int_equal(res.code, TXP_EBAD_REQUEST);
  txp_msg_clear(&res);
  begin_register_call(cl.rm, "db_orders", TXP_BT_TCC, NULL, &res);
  assert_int_equal(res.code, TXP_EBAD_REQUEST);
  txp_msg_clear(&res);
  assert_int_equal(db_long("SELECT count(*) FROM global_table", NULL, NULL), globals);
}

/* 2. Two branches, rollback: newest branch undone first. */
static void test_rollback_two_branches(void **state) {
  (void)state;
  cli_t cl = new_cli("t2");
  two_branch_tx_t tx;
  begin_two_branches(&cl, 30000, "t2-rollback", "t_order:2", "t_stock:2", &tx);

  rollback_ok(cl.tm, tx.xid);

  expect_history(tx.xid, TXP_GS_ROLLBACKED, WAIT_MS);
  assert_int_equal(history_branches(tx.xid, TXP_BS_PHASE2_ROLLBACKED), 2);
  assert_int_equal(db_long(SQL_LIVE_ROWS, tx.xid, NULL), 0);
  expect_rollbacks_newest_first(&tx);
  assert_int_equal(rm_events(tx.xid, TXP_MSG_BRANCH_COMMIT, 0, NULL, 0), 0);
}

/* 3. Lock conflicts: immediate conflict, FIFO wake-up of waiters, holder
 * rolling back, wait timeout. */
static void test_lock_conflict_fifo(void **state) {
  (void)state;
  cli_t cl = new_cli("t3");
  const char *row42 = "db_orders^^^t_row^^^42";
  char xa[TXP_MAX_XID_LEN + 1], xb[TXP_MAX_XID_LEN + 1], xc[TXP_MAX_XID_LEN + 1];
  char xx[TXP_MAX_XID_LEN + 1];
  begin_ok(cl.tm, 60000, "t3-A", xa);
  register_ok(cl.rm, xa, "db_orders", "t_row:42");

  /* No lock wait asked: conflict at once, naming the holder, nothing kept. */
  begin_ok(cl.tm, 60000, "t3-X", xx);
  txp_msg_t req, res;
  msg_register(&req, xx, "db_orders", "t_other:1;t_row:42", 0, NULL);
  double t0 = now_ms();
  assert_int_equal(txc_call(cl.rm, &req, &res, 10000), 0);
  double took = now_ms() - t0;
  assert_int_equal(res.code, TXP_ELOCK_CONFLICT);
  assert_non_null(res.lock_holder);
  assert_string_equal(res.lock_holder, xa);
  assert_non_null(res.message);
  assert_non_null(strstr(res.message, xa));
  txp_msg_clear(&res);
  assert_true(took < 3000);
  assert_int_equal(db_long(SQL_LIVE_ROWS, xx, NULL), 1); /* only its global row */

  /* B then C wait for the key.  Each writes its waiting registration and,
   * in the same write, a probe (the same key without waiting) that
   * conflicts at once: requests of one connection are batched in order, so
   * the probe's answer proves that the waiting registration is queued. */
  begin_ok(cl.tm, 60000, "t3-B", xb);
  begin_ok(cl.tm, 60000, "t3-C", xc);
  txc_t *cb = client(true, "t3-waiter-b", "db_waiter");
  txc_t *cc = client(true, "t3-waiter-c", "db_waiter");
  reader_t *db = new_reader(), *dc = new_reader();
  queue_waiter(cb, db, xb, "t_row:42", 5000, 100);
  queue_waiter(cc, dc, xc, "t_row:42", 5000, 200);
  assert_false(readable_now(cb));
  assert_false(readable_now(cc));

  /* A commits: B (first in line) gets the key, C waits on. */
  int status = -1;
  commit_ok(cl.tm, xa);
  expect_granted_after_wait(cb, db, 100, row42, xb);
  assert_false(readable_now(cc));
  assert_int_equal(db_long(SQL_BRANCHES, xc, NULL), 0);

  /* B commits: now C. */
  commit_ok(cl.tm, xb);
  expect_granted_after_wait(cc, dc, 200, row42, xc);
  rollback_ok(cl.tm, xc);
  assert_int_equal(db_long("SELECT count(*) FROM lock_table WHERE row_key = $1", row42, NULL), 0);
  expect_history(xa, TXP_GS_COMMITTED, WAIT_MS);
  expect_history(xb, TXP_GS_COMMITTED, WAIT_MS);
  expect_history(xc, TXP_GS_ROLLBACKED, WAIT_MS);
  assert_int_equal(txc_rollback(cl.tm, xx, &status), 0);

  /* A holder that is rolling back (its RM does not answer yet): others
   * fail fast, waiting or not. */
  char xh[TXP_MAX_XID_LEN + 1], xp[TXP_MAX_XID_LEN + 1];
  begin_ok(cl.tm, 60000, "t3-H", xh);
  register_ok(cl.rm, xh, "db_orders", "t_rb:1");
  rm_set_modes(false, true, 0);
  txc_t *ch = client(false, "t3-rollbacker", NULL);
  reader_t *dh = new_reader();
  send_rollback(ch, xh, 300);
  assert_true(rm_wait_events(xh, TXP_MSG_BRANCH_ROLLBACK, 0, 1, WAIT_MS));
  assert_int_equal(db_long(SQL_GLOBAL_STATUS, xh, NULL), TXP_GS_ROLLBACKING);
  assert_int_equal(db_long("SELECT min(status) FROM lock_table WHERE xid = $1", xh, NULL), 1);
  begin_ok(cl.tm, 60000, "t3-P", xp);
  msg_register(&req, xp, "db_orders", "t_rb:1", 5000, NULL);
  t0 = now_ms();
  assert_int_equal(txc_call(cl.rm, &req, &res, 10000), 0);
  took = now_ms() - t0;
  assert_int_equal(res.code, TXP_ELOCK_HOLDER_ROLLBACKING);
  assert_non_null(res.lock_holder);
  assert_string_equal(res.lock_holder, xh);
  txp_msg_clear(&res);
  assert_true(took < 2000);
  msg_register(&req, xp, "db_orders", "t_rb:1", 0, NULL);
  assert_int_equal(txc_call(cl.rm, &req, &res, 10000), 0);
  assert_int_equal(res.code, TXP_ELOCK_HOLDER_ROLLBACKING);
  txp_msg_clear(&res);
  assert_int_equal(db_long(SQL_BRANCHES, xp, NULL), 0);
  /* The RM answers now: the rollback completes and is answered. */
  rm_set_modes(false, false, 0);
  assert_int_equal(recv_answer(ch, dh, 300, &res, 15000), 0);
  assert_int_equal(res.code, 0);
  assert_int_equal(res.global_status, TXP_GS_ROLLBACKED);
  txp_msg_clear(&res);
  expect_history(xh, TXP_GS_ROLLBACKED, WAIT_MS);
  /* The key is free again: P takes it. */
  register_ok(cl.rm, xp, "db_orders", "t_rb:1");

  /* A wait longer than the holder lasts: LOCK_WAIT_TIMEOUT. */
  char xw[TXP_MAX_XID_LEN + 1];
  begin_ok(cl.tm, 60000, "t3-W", xw);
  t0 = now_ms();
  msg_register(&req, xw, "db_orders", "t_rb:1", 300, NULL);
  assert_int_equal(txc_call(cl.rm, &req, &res, 10000), 0);
  took = now_ms() - t0;
  assert_int_equal(res.code, TXP_ELOCK_WAIT_TIMEOUT);
  txp_msg_clear(&res);
  assert_true(took >= 290 && took < 5000);
  assert_int_equal(db_long(SQL_LIVE_ROWS, xw, NULL), 1);
  rollback_ok(cl.tm, xp);
  rollback_ok(cl.tm, xw);
}

/* 3b. A lock released while a registration that met it is on its way
 * back: the holder's commit and a waiting registration in one batch (the
 * commit first), so the release happens before the waiter could queue.
 * The waiter must get the free lock at once, not sit out its lock wait. */
static void test_lock_release_race(void **state) {
  (void)state;
  cli_t cl = new_cli("t3b");
  txc_t *c = client(true, "t3b-both", "db_waiter");
  reader_t *rd = new_reader();
  for (int round = 0; round < 3; round++) {
    char xa[TXP_MAX_XID_LEN + 1], xb[TXP_MAX_XID_LEN + 1], key[32];
    snprintf(key, sizeof(key), "t_race:%d", round);
    begin_ok(cl.tm, 30000, "t3b-A", xa);
    register_ok(cl.rm, xa, "db_orders", key);
    begin_ok(cl.tm, 30000, "t3b-B", xb);
    txp_msg_t m[2], res;
    txp_msg_init(&m[0], TXP_MSG_GLOBAL_COMMIT);
    txp_msg_set_str(&m[0], TXP_F_XID, xa);
    msg_register(&m[1], xb, "db_orders", key, 4000, NULL);
    uint64_t id = 10 + 2 * (uint64_t)round;
    double t0 = now_ms();
    send_frames(c, m, 2, id);
    expect_answer(c, rd, id, &res, 0);
    assert_int_equal(res.global_status, TXP_GS_COMMITTED);
    txp_msg_clear(&res);
    assert_int_equal(recv_answer(c, rd, id + 1, &res, 10000), 0);
    double took = now_ms() - t0;
    if (res.code != 0)
      fail_msg("round %d: waiting registration answered %s after %.0f ms: %s", round,
               txp_errname((int)res.code), took, res.message ? res.message : "");
    assert_true(res.branch_id > 0);
    txp_msg_clear(&res);
    if (took >= 2000) fail_msg("round %d: the free lock took %.0f ms to be granted", round, took);
    rollback_ok(cl.tm, xb);
  }

  /* In one batch: A wants k1 and k2 (k2 held by C), B waits for k1.  A
   * takes k1, meets C on k2 and gives k1 back; B, which met k1 held by A,
   * must not wait for A (which holds nothing). */
  char xa[TXP_MAX_XID_LEN + 1], xb[TXP_MAX_XID_LEN + 1], xc[TXP_MAX_XID_LEN + 1];
  begin_ok(cl.tm, 30000, "t3b-C", xc);
  register_ok(cl.rm, xc, "db_orders", "t_giveback:2");
  begin_ok(cl.tm, 30000, "t3b-A", xa);
  begin_ok(cl.tm, 30000, "t3b-B", xb);
  txp_msg_t m[2], res;
  msg_register(&m[0], xa, "db_orders", "t_giveback:1,2", 0, NULL);
  msg_register(&m[1], xb, "db_orders", "t_giveback:1", 4000, NULL);
  double t0 = now_ms();
  send_frames(c, m, 2, 100);
  expect_answer(c, rd, 100, &res, TXP_ELOCK_CONFLICT);
  assert_non_null(res.lock_holder);
  assert_string_equal(res.lock_holder, xc);
  txp_msg_clear(&res);
  assert_int_equal(recv_answer(c, rd, 101, &res, 10000), 0);
  double took = now_ms() - t0;
  if (res.code != 0)
    fail_msg("B answered %s after %.0f ms: %s", txp_errname((int)res.code), took,
             res.message ? res.message : "");
  txp_msg_clear(&res);
  if (took >= 2000) fail_msg("the free lock took %.0f ms to be granted", took);
  char holder[TXP_MAX_XID_LEN + 1];
  db_text(SQL_KEY_HOLDER, "db_orders^^^t_giveback^^^1", holder, sizeof(holder));
  assert_string_equal(holder, xb);
  assert_int_equal(db_long(SQL_LOCKS, xa, NULL), 0);
  rollback_ok(cl.tm, xa);
  rollback_ok(cl.tm, xb);
  rollback_ok(cl.tm, xc);
}

/* 5. Repeated messages get the same answer and change nothing. */
static void test_idempotency(void **state) {
  (void)state;
  cli_t cl = new_cli("t5");
  char xid[TXP_MAX_XID_LEN + 1];
  int status2 = -1;

  /* commit twice; rollback after commit */
  begin_ok(cl.tm, 30000, "t5-commit", xid);
  register_ok(cl.rm, xid, "db_orders", "t_idem:1");
  commit_ok(cl.tm, xid);
  assert_int_equal(txc_commit(cl.tm, xid, &status2), 0);
  assert_int_equal(status2, TXP_GS_COMMITTED);
  assert_int_equal(txc_rollback(cl.tm, xid, &status2), TXP_EGLOBAL_NOT_ACTIVE);
  assert_int_equal(status2, TXP_GS_COMMITTED);
  expect_history(xid, TXP_GS_COMMITTED, WAIT_MS);
  assert_int_equal(txc_commit(cl.tm, xid, &status2), 0);
  assert_int_equal(status2, TXP_GS_COMMITTED);
  assert_int_equal(txc_rollback(cl.tm, xid, &status2), TXP_EGLOBAL_NOT_ACTIVE);
  assert_int_equal(status2, TXP_GS_COMMITTED);
  /* The branch is told once (one way, sql/tc/010): the notice may still be
   * on its way to the RM's thread when the answers above are in. */
  assert_true(rm_wait_events(xid, TXP_MSG_BRANCH_COMMIT, 0, 1, WAIT_MS));
  assert_int_equal(rm_events(xid, TXP_MSG_BRANCH_COMMIT, 0, NULL, 0), 1);
  assert_int_equal(rm_events(xid, TXP_MSG_BRANCH_ROLLBACK, 0, NULL, 0), 0);

  /* unknown xid */
  char unknown[TXP_MAX_XID_LEN + 1];
  snprintf(unknown, sizeof(unknown), "%s:%d:999999999999", HOST, g_tcd.port);
  assert_int_equal(txc_commit(cl.tm, unknown, &status2), TXP_EGLOBAL_NOT_FOUND);
  assert_int_equal(txc_rollback(cl.tm, unknown, &status2), TXP_EGLOBAL_NOT_FOUND);
  assert_int_equal(txc_status(cl.tm, unknown, &status2), TXP_EGLOBAL_NOT_FOUND);
  assert_int_equal(db_long(SQL_LIVE_ROWS, unknown, NULL), 0);
  assert_int_equal(db_long(SQL_HISTORY_STATUS, unknown, NULL), -1);

  /* begin twice with one idempotency key */
  char idem[64], x1[TXP_MAX_XID_LEN + 1], x2[TXP_MAX_XID_LEN + 1];
  snprintf(idem, sizeof(idem), "t5-begin-%d", (int)getpid());
  assert_int_equal(txc_begin(cl.tm, 30000, "t5-idem", idem, x1), 0);
  assert_int_equal(txc_begin(cl.tm, 30000, "t5-idem", idem, x2), 0);
  assert_string_equal(x1, x2);
  assert_int_equal(db_long("SELECT count(*) FROM global_table WHERE idem_key = $1", idem, NULL), 1);

  /* register twice with one idempotency key */
  txp_msg_t req, res;
  msg_register(&req, x1, "db_orders", "t_idem:2", 0, "branch-1");
  assert_int_equal(txc_call(cl.rm, &req, &res, 10000), 0);
  assert_int_equal(res.code, 0);
  int64_t first = res.branch_id;
  txp_msg_clear(&res);
  assert_true(first > 0);
  msg_register(&req, x1, "db_orders", "t_idem:2", 0, "branch-1");
  assert_int_equal(txc_call(cl.rm, &req, &res, 10000), 0);
  assert_int_equal(res.code, 0);
  assert_int_equal(res.branch_id, first);
  txp_msg_clear(&res);
  assert_int_equal(db_long(SQL_BRANCHES, x1, NULL), 1);
  assert_int_equal(db_long(SQL_LOCKS, x1, NULL), 1);

  /* the same BranchReport twice */
  for (int i = 0; i < 2; i++) {
    msg_report(&req, x1, first, TXP_BS_PHASE1_DONE);
    assert_int_equal(txc_call(cl.rm, &req, &res, 10000), 0);
    assert_int_equal(res.code, 0);
    txp_msg_clear(&res);
  }
  assert_int_equal(branch_status(first), TXP_BS_PHASE1_DONE);
  assert_int_equal(db_long(SQL_BRANCHES, x1, NULL), 1);
  assert_int_equal(db_long(SQL_GLOBAL_STATUS, x1, NULL), TXP_GS_BEGIN);

  rollback_ok(cl.tm, x1);
  assert_int_equal(txc_rollback(cl.tm, x1, &status2), 0);
  assert_int_equal(status2, TXP_GS_ROLLBACKED);
  assert_int_equal(txc_commit(cl.tm, x1, &status2), TXP_EGLOBAL_NOT_ACTIVE);
  assert_true(txp_global_status_is_rollback(status2));
  expect_history(x1, TXP_GS_ROLLBACKED, WAIT_MS);
  assert_int_equal(rm_events(x1, TXP_MSG_BRANCH_ROLLBACK, 0, NULL, 0), 1);
}

/* A TM+RM client that runs transactions until told to stop. */
typedef struct bg {
  pthread_t thread;
  int port;
  atomic_bool stop;
  atomic_int ok, failed;
  char error[256];
} bg_t;

static bg_t g_bg;
static bool g_bg_running;

static void bg_stop(void) {
  if (!g_bg_running) return;
  atomic_store(&g_bg.stop, true);
  pthread_join(g_bg.thread, NULL);
  g_bg_running = false;
}

static void *bg_main(void *arg) {
  bg_t *b = arg;
  char err[256];
  txc_t *tm = txc_connect(HOST, b->port, 2000, err, sizeof(err));
  txc_t *c = txc_connect(HOST, b->port, 2000, err, sizeof(err));
  int rc = (!tm || !c) ? TXP_ECONN_LOST : txc_register(tm, false, "bg", "bg-tm", TOKEN, NULL);
  if (rc == 0) rc = txc_register(c, true, "bg", "bg-rm", TOKEN, "db_client");
  if (rc != 0) {
    snprintf(b->error, sizeof(b->error), "register: %s", txp_errname(rc));
    atomic_fetch_add(&b->failed, 1);
  }
  for (int i = 0; rc == 0 && !atomic_load(&b->stop); i++) {
    char xid[TXP_MAX_XID_LEN + 1], keys[64];
    int status = -1;
    snprintf(keys, sizeof(keys), "t_bg:%d", i);
    rc = txc_begin(tm, 30000, "bg", NULL, xid);
    if (rc == 0) rc = txc_branch_register(c, xid, "db_orders", keys, 0, NULL, NULL);
    if (rc == 0) rc = txc_commit(tm, xid, &status);
    if (rc == 0 && status != TXP_GS_COMMITTED) rc = TXP_EINTERNAL;
    if (rc != 0) {
      snprintf(b->error, sizeof(b->error), "transaction %d: %s", i, txp_errname(rc));
      atomic_fetch_add(&b->failed, 1);
    } else {
      atomic_fetch_add(&b->ok, 1);
    }
  }
  txc_close(tm);
  txc_close(c);
  return NULL;
}

static void bg_wait_more(bg_t *b, int more) {
  int want = atomic_load(&b->ok) + more;
  double deadline = now_ms() + WAIT_MS;
  while (atomic_load(&b->ok) < want && atomic_load(&b->failed) == 0 && now_ms() < deadline) nap();
  if (atomic_load(&b->failed) != 0 || atomic_load(&b->ok) < want)
    fail_msg("background client stalled or failed: ok=%d failed=%d %s", atomic_load(&b->ok),
             atomic_load(&b->failed), b->error);
}

static void frame_header(unsigned char *h, unsigned major, unsigned type, uint64_t id, uint32_t body_len) {
  h[0] = 0xDA;
  h[1] = 0xDA;
  h[2] = (unsigned char)major;
  h[3] = 0;
  h[4] = (unsigned char)(type >> 8);
  h[5] = (unsigned char)type;
  h[6] = 0;
  h[7] = 0;
  for (int i = 0; i < 8; i++) h[8 + i] = (unsigned char)(id >> (56 - 8 * i));
  for (int i = 0; i < 4; i++) h[16 + i] = (unsigned char)(body_len >> (24 - 8 * i));
}

/* 7. Bad input is refused with a clear error and changes nothing; broken
 * streams close only their own connection. */
static void test_bad_input(void **state) {
  (void)state;
  bg_t *b = &g_bg;
  memset(b, 0, sizeof(*b));
  b->port = g_tcd.port;
  atomic_init(&b->stop, false);
  atomic_init(&b->ok, 0);
  atomic_init(&b->failed, 0);
  assert_int_equal(pthread_create(&b->thread, NULL, bg_main, b), 0);
  g_bg_running = true;

  bg_wait_more(b, 3);

  /* wrong token */
  txc_t *c = raw_connect();
  assert_int_equal(txc_register(c, true, "intruder", "intruder", "not-the-token", "db_orders"),
                   TXP_EAUTH);
  assert_true(txc_wait_closed(c, 5000));
  untrack_close(c);
  c = raw_connect();
  assert_int_equal(txc_register(c, false, "intruder", "intruder", NULL, NULL), TXP_EAUTH);
  assert_true(txc_wait_closed(c, 5000));
  untrack_close(c);

  cli_t cl = new_cli("t7");
  char xid[TXP_MAX_XID_LEN + 1];
  begin_ok(cl.tm, 30000, "t7-bad", xid);

  /* malformed lock keys */
  static const char *const bad_keys[] = {
    "t_order", "t_order:", ":1", "t_order:1;", "t_order:1,,2", "t_order:1;;t_stock:2", "t^x:1", "t:a\tb",
  };
  for (size_t i = 0; i < sizeof(bad_keys) / sizeof(bad_keys[0]); i++) {
    int64_t nb = 0;
    int rc = txc_branch_register(cl.rm, xid, "db_orders", bad_keys[i], 0, &nb, NULL);
    if (rc != TXP_EBAD_REQUEST) fail_msg("lock keys \"%s\": got %s, expected BAD_REQUEST", bad_keys[i], txp_errname(rc));
  }
  /* a saga step with lock keys (a step holds no global lock) */
  txp_msg_t req, res;
  msg_register(&req, xid, "db_orders", "t_bad:1", 0, NULL);
  txp_msg_set_int(&req, TXP_F_BRANCH_TYPE, TXP_BT_SAGA);
  assert_int_equal(txc_call(cl.rm, &req, &res, 10000), 0);
  assert_int_equal(res.code, TXP_EBAD_REQUEST);
  assert_non_null(res.message);
  assert_non_null(strstr(res.message, "saga step"));
  txp_msg_clear(&res);
  /* empty resource; lock wait above the limit */
  msg_register(&req, xid, "", "t_bad:1", 0, NULL);
  assert_int_equal(txc_call(cl.rm, &req, &res, 10000), 0);
  assert_int_equal(res.code, TXP_EBAD_REQUEST);
  txp_msg_clear(&res);
  msg_register(&req, xid, "db_orders", "t_bad:1", 600001, NULL);
  assert_int_equal(txc_call(cl.rm, &req, &res, 10000), 0);
  assert_int_equal(res.code, TXP_EBAD_REQUEST);
  txp_msg_clear(&res);
  assert_int_equal(db_long(SQL_BRANCHES, xid, NULL), 0);
  assert_int_equal(db_long(SQL_LOCKS, xid, NULL), 0);

  /* timeout above the maximum */
  char name[64], xbad[TXP_MAX_XID_LEN + 1] = "";
  snprintf(name, sizeof(name), "t7-too-long-%d", (int)getpid());
  assert_int_equal(txc_begin(cl.tm, 600001, name, NULL, xbad), TXP_EBAD_REQUEST);
  assert_int_equal(db_long("SELECT (SELECT count(*) FROM global_table WHERE transaction_name = $1) + "
                           "(SELECT count(*) FROM global_history WHERE transaction_name = $1)",
                           name, NULL),
                   0);
  /* a valid request still works on the same connection */
  int64_t ok_branch = register_ok(cl.rm, xid, "db_orders", "t_bad:1");
  assert_true(ok_branch > 0);
  int64_t ok_branch2 = register_ok(cl.rm, xid, "db_stock", "t_bad:2");

  /* BranchReport naming no branch of the xid (0, negative, unknown) */
  static const int64_t bad_ids[] = {0, -1, 999999999999};
  for (size_t i = 0; i < sizeof(bad_ids) / sizeof(bad_ids[0]); i++) {
    msg_report(&req, xid, bad_ids[i], TXP_BS_PHASE1_FAILED);
    assert_int_equal(txc_call(cl.rm, &req, &res, 10000), 0);
    if (res.code != TXP_EBAD_REQUEST && res.code != TXP_EBRANCH_NOT_FOUND)
      fail_msg("BranchReport of branch %" PRId64 ": got %s", bad_ids[i], txp_errname((int)res.code));
    txp_msg_clear(&res);
  }
  assert_int_equal(db_long("SELECT count(*) FROM branch_table WHERE xid = $1 AND status = 1", xid, NULL), 2);
  /* ...and a report for an unknown xid */
  msg_report(&req, "no-such-xid", ok_branch, TXP_BS_PHASE1_DONE);
  assert_int_equal(txc_call(cl.rm, &req, &res, 10000), 0);
  assert_int_equal(res.code, TXP_EGLOBAL_NOT_FOUND);
  txp_msg_clear(&res);
  (void)ok_branch2;

  /* garbage bytes */
  c = raw_connect();
  static const char garbage[] = "GET / HTTP/1.1\r\nHost: tcd\r\n\r\nthis is not a frame at all";
  assert_int_equal(txc_send_raw(c, garbage, sizeof(garbage) - 1), 0);
  assert_true(txc_wait_closed(c, 5000));
  untrack_close(c);
  /* garbage after a good registration */
  c = client(false, "t7-garbage-tm", NULL);
  assert_int_equal(txc_send_raw(c, "\x00\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c\x0d\x0e\x0f\x10\x11\x12\x13", 20), 0);
  assert_true(txc_wait_closed(c, 5000));
  untrack_close(c);
  /* a header announcing a body far over the limit */
  unsigned char h[TXP_HEADER_SIZE + 64];
  c = client(false, "t7-huge-tm", NULL);
  frame_header(h, TXP_VERSION_MAJOR, TXP_MSG_GLOBAL_BEGIN, 1, 0x7fffffffu);
  assert_int_equal(txc_send_raw(c, h, TXP_HEADER_SIZE), 0);
  assert_true(txc_wait_closed(c, 5000));
  untrack_close(c);
  /* another major version */
  c = raw_connect();
  frame_header(h, TXP_VERSION_MAJOR + 1, TXP_MSG_REGISTER_TM, 1, 0);
  assert_int_equal(txc_send_raw(c, h, TXP_HEADER_SIZE), 0);
  assert_true(txc_wait_closed(c, 5000));
  untrack_close(c);
  /* a truncated frame: valid header, half the body, then the client goes */
  for (int i = 0; i < 2; i++) {
    c = i ? client(false, "t7-trunc-tm", NULL) : raw_connect();
    frame_header(h, TXP_VERSION_MAJOR, TXP_MSG_GLOBAL_BEGIN, 7, 64);
    memset(h + TXP_HEADER_SIZE, 0x81, 32);
    assert_int_equal(txc_send_raw(c, h, TXP_HEADER_SIZE + 32), 0);
    untrack_close(c);
  }
  /* a truncated frame left hanging does not block the others either */
  c = client(false, "t7-hang-tm", NULL);
  frame_header(h, TXP_VERSION_MAJOR, TXP_MSG_GLOBAL_BEGIN, 8, 64);
  assert_int_equal(txc_send_raw(c, h, TXP_HEADER_SIZE + 10), 0);

  /* The registered clients kept working all along. */
  bg_wait_more(b, 3);
  rollback_ok(cl.tm, xid);
  assert_true(tcd_alive());
  bg_stop();
  if (atomic_load(&b->failed) != 0) fail_msg("background client failed: %s", b->error);
  assert_true(atomic_load(&b->ok) >= 6);
}

/* 7b. A connection may register again (a new identity) while its earlier
 * requests are still being served, even waiting for a lock: those keep the
 * identity they were sent under, and nothing reads the old one after it
 * is gone. */
static void test_reregister_in_flight(void **state) {
  (void)state;
  cli_t cl = new_cli("t7b");
  txc_t *c = client(true, "t7b-first", "db_client");
  reader_t *dec = new_reader();
  char xid[TXP_MAX_XID_LEN + 1];
  begin_ok(cl.tm, 30000, "t7b", xid);

  /* BranchRegister and, in the same write, RegisterRM with a new id. */
  txp_msg_t m[2], res;
  msg_register(&m[0], xid, "db_orders", "t_rereg:1", 0, NULL);
  msg_identity(&m[1], true, "test-app-2", "t7b-second-identity");
  send_frames(c, m, 2, 10);
  expect_answer(c, dec, 10, &res, 0);
  int64_t b1 = res.branch_id;
  txp_msg_clear(&res);
  expect_answer(c, dec, 11, &res, 0);
  txp_msg_clear(&res);
  char text[256];
  branch_client(b1, text, sizeof(text));
  assert_string_equal(text, "t7b-first");

  /* GlobalBegin and, in the same write, RegisterTM with a new identity. */
  txp_msg_init(&m[0], TXP_MSG_GLOBAL_BEGIN);
  txp_msg_set_int(&m[0], TXP_F_TIMEOUT_MS, 30000);
  msg_identity(&m[1], false, "test-app-3", "t7b-third-identity");
  send_frames(c, m, 2, 20);
  expect_answer(c, dec, 20, &res, 0);
  assert_non_null(res.xid);
  char x2[TXP_MAX_XID_LEN + 1];
  snprintf(x2, sizeof(x2), "%s", res.xid);
  txp_msg_clear(&res);
  expect_answer(c, dec, 21, &res, 0);
  txp_msg_clear(&res);
  /* The begin is answered before it is stored (tc_hold.h): wait for its
   * row, stored under the identity of its request. */
  assert_true(db_wait_long("SELECT count(*) FROM global_table WHERE xid = $1", x2, NULL, 1, WAIT_MS));
  db_text("SELECT application_id FROM global_table WHERE xid = $1", x2, text, sizeof(text));
  assert_string_equal(text, "test-app-2");

  /* A registration waiting for a lock while its connection registers
   * again: it is served after the holder goes, under its first identity. */
  char xw[TXP_MAX_XID_LEN + 1];
  begin_ok(cl.tm, 30000, "t7b-wait", xw);
  queue_waiter(c, dec, xw, "t_rereg:1", 5000, 30);
  msg_identity(&m[0], true, "test-app-4", "t7b-fourth-identity");
  send_frames(c, m, 1, 32);
  expect_answer(c, dec, 32, &res, 0);
  txp_msg_clear(&res);
  int status = -1;
  commit_ok(cl.tm, xid);
  expect_answer(c, dec, 30, &res, 0);
  int64_t bw = res.branch_id;
  txp_msg_clear(&res);
  branch_client(bw, text, sizeof(text));
  assert_string_equal(text, "t7b-third-identity");
  rollback_ok(cl.tm, xw);
  /* x2 is test-app-2's: another application may not roll it back, that
   * one may. */
  assert_int_equal(txc_rollback(cl.tm, x2, &status), TXP_ENOT_OWNER);
  txc_t *app2 = raw_connect();
  assert_int_equal(txc_register(app2, false, "test-app-2", "t7b-app2", TOKEN, NULL), 0);
  rollback_ok(app2, x2);
  assert_true(tcd_alive());
}

/* ------------------------------------------------------------- group */

static int test_teardown(void **state) {
  bg_stop();
  return suite_test_teardown(state);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup_teardown(test_commit_two_branches, suite_test_setup, test_teardown),
    cmocka_unit_test_setup_teardown(test_begin_register, suite_test_setup, test_teardown),
    cmocka_unit_test_setup_teardown(test_rollback_two_branches, suite_test_setup, test_teardown),
    cmocka_unit_test_setup_teardown(test_lock_conflict_fifo, suite_test_setup, test_teardown),
    cmocka_unit_test_setup_teardown(test_lock_release_race, suite_test_setup, test_teardown),
    cmocka_unit_test_setup_teardown(test_idempotency, suite_test_setup, test_teardown),
    cmocka_unit_test_setup_teardown(test_bad_input, suite_test_setup, test_teardown),
    cmocka_unit_test_setup_teardown(test_reregister_in_flight, suite_test_setup, test_teardown),
  };
  return cmocka_run_group_tests_name("tcd", tests, suite_group_setup, suite_group_teardown);
}
