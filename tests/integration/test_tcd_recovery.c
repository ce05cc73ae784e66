/*
 * test_tcd_recovery.c - tcd end to end, what it finishes on its own: a
 * transaction rolled back at its deadline, a rollback that meets a dirty
 * write, a tcd killed mid-way and another one on the same store finishing
 * its work, and a clean stop with work in every stage.
 *
 * NOTES
 *   The fixture (tcd, the RM thread, the store, raw clients) is tcd_suite.h,
 *   shared with test_tcd (the protocol).  The tests share the group's tcd,
 *   except the crash test, which kills it with SIGKILL and starts another
 *   one on the same database, and the last test, which stops it with
 *   SIGTERM and requires a clean exit (exit status 0: no sanitizer report,
 *   no leak).  Each test uses its own xids and lock keys.
 *
 *   Scenarios 4, 6, 8 and 9 of the brief; checks inside them pin down a
 *   branch report rewriting phase-two outcomes.
 *
 *   Threads: the cmocka test thread (all assertions) and the RM thread.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>

#include "tcd_suite.h"

/* ===================================================================== */
/*                                tests                                  */
/* ===================================================================== */

/* 4. A transaction nobody finishes is rolled back at its deadline. */
static void test_timeout_rollback(void **state) {
  (void)state;
  cli_t cl = new_cli("t4");
  char xid[TXP_MAX_XID_LEN + 1];
  begin_ok(cl.tm, 500, "t4-timeout", xid);
  int64_t b = register_ok(cl.rm, xid, "db_orders", "t_timeout:1");
  expect_history(xid, TXP_GS_TIMEOUT_ROLLBACKED, WAIT_MS);
  assert_int_equal(history_branches(xid, TXP_BS_PHASE2_ROLLBACKED), 1);
  assert_int_equal(db_long(SQL_LIVE_ROWS, xid, NULL), 0);
  int64_t ids[4];
  assert_int_equal(rm_events(xid, TXP_MSG_BRANCH_ROLLBACK, 0, ids, 4), 1);
  assert_true(ids[0] == b);

  int64_t nb = 0;
  int rc = txc_branch_register(cl.rm, xid, "db_orders", "t_timeout:2", 0, &nb, NULL);
  assert_true(rc == TXP_EGLOBAL_NOT_FOUND || rc == TXP_EGLOBAL_NOT_ACTIVE || rc == TXP_ETIMED_OUT);
  assert_int_equal(db_long(SQL_LIVE_ROWS, xid, NULL), 0);
  int status = -1;
  rc = txc_commit(cl.tm, xid, &status);
  assert_true(rc != 0);
  assert_true(txp_global_status_is_rollback(status));

  /* A commit that arrives after the deadline, before or after the timeout
   * job: never a success, always a rollback status. */
  char x2[TXP_MAX_XID_LEN + 1];
  begin_ok(cl.tm, 200, "t4-late-commit", x2);
  register_ok(cl.rm, x2, "db_orders", "t_timeout:3");
  assert_true(db_wait_long("SELECT count(*) FROM global_table WHERE xid = $1 AND "
                           "deadline < clock_timestamp()",
                           x2, NULL, 1, WAIT_MS) ||
              db_long(SQL_HISTORY_STATUS, x2, NULL) > 0);
  status = -1;
  rc = txc_commit(cl.tm, x2, &status);
  assert_true(rc != 0);
  assert_true(txp_global_status_is_rollback(status));
  expect_history(x2, TXP_GS_TIMEOUT_ROLLBACKED, WAIT_MS);
  assert_int_equal(db_long(SQL_LIVE_ROWS, x2, NULL), 0);
}

/* 6. The RM finds a dirty write: RollbackFailed, locks kept, tcd serves on. */
static void test_dirty_write(void **state) {
  (void)state;
  cli_t cl = new_cli("t6");
  two_branch_tx_t tx;
  begin_two_branches(&cl, 30000, "t6-dirty", "t_dirty:1", "t_dirty:2", &tx);
  rm_set_modes(false, false, tx.orders);
  int status = -1;
  int rc = txc_rollback(cl.tm, tx.xid, &status);
  assert_int_equal(rc, 0);
  assert_int_equal(status, TXP_GS_ROLLBACK_FAILED);
  assert_true(db_wait_long(SQL_GLOBAL_STATUS, tx.xid, NULL, TXP_GS_ROLLBACK_FAILED, WAIT_MS));
  expect_rollbacks_newest_first(&tx);
  char text[1024];
  db_text("SELECT last_error FROM global_table WHERE xid = $1", tx.xid, text, sizeof(text));
  assert_non_null(strstr(text, "DIRTY_WRITE"));
  /* Locks stay (the row needs an operator), as do the branches. */
  assert_int_equal(db_long(SQL_LOCKS, tx.xid, NULL), 2);
  assert_int_equal(db_long(SQL_BRANCHES, tx.xid, NULL), 2);
  assert_int_equal(branch_status(tx.orders), TXP_BS_PHASE2_ROLLBACK_FAILED_UNRETRYABLE);
  assert_int_equal(db_long(SQL_HISTORY_STATUS, tx.xid, NULL), -1);
  /* The failed transaction is left alone: no retry drives it again. */
  assert_int_equal(db_long("SELECT count(*) FROM global_table WHERE xid = $1 AND next_retry_at IS NULL",
                           tx.xid, NULL), 1);
  rm_set_modes(false, false, 0);

  /* A late (repeated) phase-one report of the branch already undone is
   * accepted but does not undo its phase-two outcome: an operator re-drive
   * must not roll it back a second time. */
  txp_msg_t req, res;
  msg_report(&req, tx.xid, tx.stock, TXP_BS_PHASE1_DONE);
  assert_int_equal(txc_call(cl.rm, &req, &res, 10000), 0);
  assert_int_equal(res.code, 0);
  txp_msg_clear(&res);
  assert_int_equal(branch_status(tx.stock), TXP_BS_PHASE2_ROLLBACKED);
  assert_int_equal(db_long(SQL_GLOBAL_STATUS, tx.xid, NULL), TXP_GS_ROLLBACK_FAILED);

  /* A repeated rollback answers the recorded outcome and drives nothing. */
  assert_int_equal(txc_rollback(cl.tm, tx.xid, &status), 0);
  assert_int_equal(status, TXP_GS_ROLLBACK_FAILED);
  assert_int_equal(rm_events(tx.xid, TXP_MSG_BRANCH_ROLLBACK, 0, NULL, 0), 2);

  /* Other transactions go on. */
  char x2[TXP_MAX_XID_LEN + 1];
  begin_ok(cl.tm, 30000, "t6-after", x2);
  register_ok(cl.rm, x2, "db_orders", "t_dirty:3");
  commit_ok(cl.tm, x2);
  expect_history(x2, TXP_GS_COMMITTED, WAIT_MS);
  /* ...but not on its locked rows. */
  char x3[TXP_MAX_XID_LEN + 1];
  begin_ok(cl.tm, 30000, "t6-blocked", x3);
  int64_t nb = 0;
  rc = txc_branch_register(cl.rm, x3, "db_orders", "t_dirty:1", 0, &nb, NULL);
  assert_true(rc == TXP_ELOCK_HOLDER_ROLLBACKING || rc == TXP_ELOCK_CONFLICT);
  rollback_ok(cl.tm, x3);
}

/* 7b. An AT commit whose branches have no commit work is finished by its
 * decision (sql/tc/010): the TM's answer finds it in history, Committed,
 * its branches PhaseTwoCommitted, nothing live; the branches are told, and
 * nothing waits for or records their answers: a silent RM changes nothing,
 * and a tcd killed right after has nothing to drive. */
static void test_commit_finished_at_decision(void **state) {
  (void)state;
  cli_t cl = new_cli("t7b");
  rm_set_modes(true, true, 0);
  two_branch_tx_t tx;
  begin_two_branches(&cl, 60000, "t7b-commit", "t_fin:1", "t_fin:2", &tx);
  commit_ok(cl.tm, tx.xid);
  /* Finished when the TM heard it: no wait. */
  assert_int_equal(db_long(SQL_LIVE_ROWS, tx.xid, NULL), 0);
  assert_int_equal(db_long(SQL_LOCKS, tx.xid, NULL), 0);
  assert_int_equal(db_long("SELECT status FROM global_history WHERE xid = $1", tx.xid, NULL), TXP_GS_COMMITTED);
  assert_int_equal(history_branches(tx.xid, TXP_BS_PHASE2_COMMITTED), 2);
  /* Told, though the RM does not answer. */
  expect_commits_told(tx.xid, tx.orders, tx.stock);
  /* A repeated commit is answered from the history, and tells no one. */
  commit_ok(cl.tm, tx.xid);
  assert_int_equal(rm_events(tx.xid, TXP_MSG_BRANCH_COMMIT, 0, NULL, 0), 2);
  /* The row keys are free at once. */
  char y[TXP_MAX_XID_LEN + 1];
  begin_ok(cl.tm, 60000, "t7b-next", y);
  register_ok(cl.rm, y, "db_orders", "t_fin:1");
  rm_set_modes(false, false, 0);
  commit_ok(cl.tm, y);
}

/* 8. tcd is killed mid-way; another one on the same store finishes its
 * work: a decided commit whose branches were not told, a decided rollback
 * whose first branch did not answer, and a Begin transaction that must
 * time out. */
static void test_crash_recovery(void **state) {
  (void)state;
  cli_t cl = new_cli("t8");
  rm_set_modes(true, true, 0);
  char x1[TXP_MAX_XID_LEN + 1], x2[TXP_MAX_XID_LEN + 1], x4[TXP_MAX_XID_LEN + 1];
  begin_ok(cl.tm, 60000, "t8-committed", x1);
  int64_t b1 = register_sync_ok(cl.rm, x1, "db_orders", "t_crash:1");
  int64_t b2 = register_sync_ok(cl.rm, x1, "db_stock", "t_crash:2");
  begin_ok(cl.tm, 1500, "t8-begun", x2);
  int64_t b3 = register_ok(cl.rm, x2, "db_orders", "t_crash:3");
  begin_ok(cl.tm, 60000, "t8-rolling-back", x4);
  int64_t b4 = register_ok(cl.rm, x4, "db_orders", "t_crash:4");
  int64_t b5 = register_ok(cl.rm, x4, "db_stock", "t_crash:5");
  txc_t *cr = client(false, "t8-rollbacker", NULL);
  send_rollback(cr, x4, 1);
  /* Branches with commit work: the TM would wait for their phase two. */
  send_commit(cr, x1, 2);
  /* The RM heard of both commits but says nothing. */
  assert_true(rm_wait_events(x1, TXP_MSG_BRANCH_COMMIT, 0, 2, WAIT_MS));
  assert_int_equal(db_long(SQL_GLOBAL_STATUS, x1, NULL), TXP_GS_ASYNC_COMMITTING);
  assert_int_equal(db_long(SQL_GLOBAL_STATUS, x2, NULL), TXP_GS_BEGIN);
  assert_int_equal(db_long(SQL_LOCKS, x1, NULL), 0); /* commit released them */
  /* The rollback is decided and waits for its newest branch. */
  assert_true(rm_wait_events(x4, TXP_MSG_BRANCH_ROLLBACK, 0, 1, WAIT_MS));
  assert_int_equal(db_long(SQL_GLOBAL_STATUS, x4, NULL), TXP_GS_ROLLBACKING);
  assert_int_equal(db_long("SELECT count(*) FROM lock_table WHERE xid = $1 AND status = 1", x4, NULL), 2);

  int gen = rm_generation();
  tcd_kill9();
  untrack_close(cl.tm);
  untrack_close(cl.rm);
  untrack_close(cr);
  rm_set_modes(false, false, 0);
  assert_int_equal(tcd_start(), 0);
  assert_true(rm_wait_generation(gen, WAIT_MS));

  expect_history(x1, TXP_GS_COMMITTED, 20000);
  assert_int_equal(history_branches(x1, TXP_BS_PHASE2_COMMITTED), 2);
  int64_t ids[8];
  int n = rm_events(x1, TXP_MSG_BRANCH_COMMIT, gen, ids, 8);
  assert_true(n >= 2);
  assert_true(has_id(ids, n, b1) && has_id(ids, n, b2));
  assert_int_equal(db_long(SQL_LIVE_ROWS, x1, NULL), 0);

  expect_history(x2, TXP_GS_TIMEOUT_ROLLBACKED, 20000);
  assert_int_equal(history_branches(x2, TXP_BS_PHASE2_ROLLBACKED), 1);
  n = rm_events(x2, TXP_MSG_BRANCH_ROLLBACK, gen, ids, 8);
  assert_true(n >= 1 && has_id(ids, n, b3));
  assert_int_equal(rm_events(x2, TXP_MSG_BRANCH_COMMIT, 0, NULL, 0), 0);
  assert_int_equal(db_long(SQL_LIVE_ROWS, x2, NULL), 0);

  expect_history(x4, TXP_GS_ROLLBACKED, 20000);
  assert_int_equal(history_branches(x4, TXP_BS_PHASE2_ROLLBACKED), 2);
  n = rm_events(x4, TXP_MSG_BRANCH_ROLLBACK, gen, ids, 8);
  assert_true(n >= 2);
  assert_true(ids[0] == b5 && has_id(ids, n, b4)); /* newest first again */
  assert_int_equal(rm_events(x4, TXP_MSG_BRANCH_COMMIT, 0, NULL, 0), 0);
  assert_int_equal(db_long(SQL_LIVE_ROWS, x4, NULL), 0);

  /* The new node serves new work. */
  cli_open(&cl, "t8b");
  char x3[TXP_MAX_XID_LEN + 1];
  begin_ok(cl.tm, 30000, "t8-after", x3);
  register_ok(cl.rm, x3, "db_orders", "t_crash:1");
  commit_ok(cl.tm, x3);
  expect_history(x3, TXP_GS_COMMITTED, WAIT_MS);
}

/* 9. SIGTERM stops tcd cleanly, even with work in every stage: a
 * transaction left open, a registration waiting for a lock, a rollback
 * whose RM has not answered (a TC->RM call pending), and a commit whose
 * branches have not answered.  Exit status 0: no sanitizer report, no leak
 * at exit.  What was decided stays decided in the store. */
static void test_clean_stop(void **state) {
  (void)state;
  cli_t cl = new_cli("t9");
  char xo[TXP_MAX_XID_LEN + 1], xw[TXP_MAX_XID_LEN + 1], xr[TXP_MAX_XID_LEN + 1];
  char xc[TXP_MAX_XID_LEN + 1];
  begin_ok(cl.tm, 60000, "t9-open", xo);
  register_ok(cl.rm, xo, "db_orders", "t_stop:1");

  /* a waiter for the open transaction's key */
  begin_ok(cl.tm, 60000, "t9-waiter", xw);
  txc_t *cw = client(true, "t9-waiter", "db_waiter");
  reader_t *rw = new_reader();
  queue_waiter(cw, rw, xw, "t_stop:1", 30000, 1);

  /* a rollback and a commit, both waiting for the silent RM */
  rm_set_modes(true, true, 0);
  begin_ok(cl.tm, 60000, "t9-rollback", xr);
  register_ok(cl.rm, xr, "db_orders", "t_stop:2");
  register_ok(cl.rm, xr, "db_stock", "t_stop:3");
  begin_ok(cl.tm, 60000, "t9-commit", xc);
  register_sync_ok(cl.rm, xc, "db_orders", "t_stop:4");
  register_sync_ok(cl.rm, xc, "db_stock", "t_stop:5");
  txc_t *cr = client(false, "t9-rollbacker", NULL);
  send_rollback(cr, xr, 1);
  send_commit(cr, xc, 2);
  assert_true(rm_wait_events(xr, TXP_MSG_BRANCH_ROLLBACK, 0, 1, WAIT_MS));
  assert_true(rm_wait_events(xc, TXP_MSG_BRANCH_COMMIT, 0, 2, WAIT_MS));

  assert_true(tcd_alive());
  g_stopped_on_purpose = true;
  int st = tcd_stop();
  assert_true(st != -1);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
    fail_msg("tcd did not exit cleanly on SIGTERM: status 0x%x", st);
  assert_true(txc_wait_closed(cl.tm, 5000));
  assert_true(txc_wait_closed(cw, 5000));

  /* What it left is durable; nothing was decided that was not asked. */
  assert_int_equal(db_long(SQL_GLOBAL_STATUS, xo, NULL), TXP_GS_BEGIN);
  assert_int_equal(db_long(SQL_LOCKS, xo, NULL), 1);
  assert_int_equal(db_long(SQL_GLOBAL_STATUS, xw, NULL), TXP_GS_BEGIN);
  assert_int_equal(db_long(SQL_BRANCHES, xw, NULL), 0);
  long sr = db_long(SQL_GLOBAL_STATUS, xr, NULL);
  assert_true(sr == TXP_GS_ROLLBACKING || sr == TXP_GS_ROLLBACK_RETRYING);
  long sc = db_long(SQL_GLOBAL_STATUS, xc, NULL);
  assert_true(sc == TXP_GS_ASYNC_COMMITTING || sc == TXP_GS_COMMIT_RETRYING);
  assert_int_equal(db_long(SQL_LOCKS, xc, NULL), 0);
}

/* 10. The leader prunes history older than recovery.history_days (7 by
 * default) in bounded statements (10,000 rows each, the next one at the
 * next tick) and keeps what is younger. */
static void test_history_pruned(void **state) {
  (void)state;
  db_exec("INSERT INTO global_history (xid, transaction_id, status, begin_time, end_time) "
          "SELECT 'hist-old:' || g, -g, 9, now() - interval '31 days', now() - interval '30 days' "
          "FROM generate_series(1, 25000) g",
          NULL, NULL);
  db_exec("INSERT INTO global_history (xid, transaction_id, status, begin_time, end_time) "
          "VALUES ('hist-recent', -30000, 9, now() - interval '2 days', now() - interval '1 day')",
          NULL, NULL);
  /* A restarted leader prunes at once. */
  tcd_kill9();
  assert_int_equal(tcd_start(), 0);
  assert_true(db_wait_long("SELECT count(*) FROM global_history WHERE xid LIKE 'hist-old:%'", NULL, NULL, 0,
                           20000));
  assert_int_equal(db_long("SELECT count(*) FROM global_history WHERE xid = $1", "hist-recent", NULL), 1);
  db_exec("DELETE FROM global_history WHERE xid = $1", "hist-recent", NULL);
}

/* ------------------------------------------------------------- group */

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup_teardown(test_timeout_rollback, suite_test_setup, suite_test_teardown),
    cmocka_unit_test_setup_teardown(test_dirty_write, suite_test_setup, suite_test_teardown),
    cmocka_unit_test_setup_teardown(test_commit_finished_at_decision, suite_test_setup, suite_test_teardown),
    cmocka_unit_test_setup_teardown(test_crash_recovery, suite_test_setup, suite_test_teardown),
    cmocka_unit_test_setup_teardown(test_clean_stop, suite_test_setup, suite_test_teardown),
    cmocka_unit_test_setup_teardown(test_history_pruned, suite_test_setup, suite_test_teardown),
  };
  return cmocka_run_group_tests_name("tcd_recovery", tests, suite_group_setup, suite_group_teardown);
}
