/*
 * test_tcd_unknown_outcome.c - a store batch whose connection is lost in
 * flight is resolved by reading the store, not by guessing (tc_store.c
 * NOTES, "Unknown outcomes"; issue 22: "no answered decision is lost").
 *
 * Both kinds of loss, for each kind of op that a reading can tell:
 *   - "reply_lost": the batch committed and its answer was lost (what a
 *     primary that dies between its COMMIT and the answer, or a failover to
 *     a synchronous standby that has the commit, looks like to tcd).  The
 *     client must get the answer the batch would have given, and nothing may
 *     be applied twice.
 *   - "aborted": the batch never committed (the primary died before it).
 *     The op must run again and succeed, once.
 * The faults are tcd's failpoints (action "fail", armed at start), so every
 * test is deterministic: one batch of the chosen kind is lost, and the test
 * checks in tcd's log that it was (a test whose fault never happened would
 * pass for nothing), then checks the client's answer and the store's rows.
 * The failover itself, with a real primary killed, is the fault scenario
 * pg_primary_kill.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tcd_suite.h"
#include "txp_errno.h"
#include "txp_status.h"

static char g_log[256];

/* Restart tcd with 'failpoint' armed ("fail" on its first hit) and its
 * output in a fresh log file. */
static void restart_armed(const char *failpoint) {
  g_stopped_on_purpose = true;
  assert_int_equal(tcd_stop(), 0);
  snprintf(g_log, sizeof(g_log), "%s/tcd-unknown-%d.log", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp",
           (int)getpid());
  unlink(g_log);
  char spec[128];
  snprintf(spec, sizeof(spec), "%s=fail", failpoint);
  assert_int_equal(tcd_start_armed(spec, g_log), 0);
  g_stopped_on_purpose = false;
}

/* Whether tcd's log has a line containing 'what' (waits for it a little:
 * the log is written by another process). */
static bool log_has(const char *what) {
  double deadline = now_ms() + WAIT_MS;
  for (;;) {
    FILE *f = fopen(g_log, "r");
    char line[1024];
    bool found = false;
    while (f && !found && fgets(line, sizeof(line), f)) found = strstr(line, what) != NULL;
    if (f) fclose(f);
    if (found) return true;
    if (now_ms() >= deadline) return false;
    nap();
  }
}

/* The fault happened, and the store was read to resolve it. */
static void expect_fault_resolved(const char *failpoint) {
  char fired[160];
  snprintf(fired, sizeof(fired), "failpoint %s: fail", failpoint);
  if (!log_has(fired)) fail_msg("failpoint %s never fired (log %s)", failpoint, g_log);
  if (!log_has("lost its connection in flight: reading the store"))
    fail_msg("no resolution by reading the store in the log %s", g_log);
}

static long count_globals(const char *xid) {
  return db_long("SELECT count(*) FROM global_table WHERE xid = $1", xid, NULL) +
         db_long("SELECT count(*) FROM global_history WHERE xid = $1", xid, NULL);
}

/* count_globals once it is 'want', or what it is after WAIT_MS: a begin
 * is answered while it is held (tc_hold.c) and written after, so the
 * store's reading and the begin run again after it may still be under way
 * when the log says the reading started. */
static long count_globals_within(const char *xid, long want) {
  double deadline = now_ms() + WAIT_MS;
  long n = count_globals(xid);
  while (n != want && now_ms() < deadline) {
    nap();
    n = count_globals(xid);
  }
  return n;
}

/* A transaction begun on a tcd restarted with 'failpoint' armed: client
 * 'who', global 'name', and the row keys its two branches (db_orders,
 * db_stock) lock, named after 'who'. */
typedef struct {
  cli_t cl;
  char xid[TXP_MAX_XID_LEN + 1];
  char order_key[64], stock_key[64];
  int64_t order_branch, stock_branch;
} armed_txn_t;

static void begin_armed(armed_txn_t *t, const char *failpoint, const char *who, const char *name) {
  restart_armed(failpoint);
  cli_open(&t->cl, who);
  begin_ok(t->cl.tm, 30000, name, t->xid);
  snprintf(t->order_key, sizeof(t->order_key), "t_order:%s", who);
  snprintf(t->stock_key, sizeof(t->stock_key), "t_stock:%s", who);
}

/* Register the db_orders branch, then the db_stock one, over the RM
 * thread ('sync') or the plain RM client. */
static void register_both(armed_txn_t *t, bool sync) {
  int64_t (*reg)(txc_t *, const char *, const char *, const char *) = sync ? register_sync_ok : register_ok;
  t->order_branch = reg(t->cl.rm, t->xid, "db_orders", t->order_key);
  t->stock_branch = reg(t->cl.rm, t->xid, "db_stock", t->stock_key);
}

/* The TM's commit ('commit') or rollback of 'xid' succeeds with the final
 * status it asks for. */
static void decide_ok(cli_t *cl, const char *xid, bool commit) {
  int status = -1;
  int rc = commit ? txc_commit(cl->tm, xid, &status) : txc_rollback(cl->tm, xid, &status);
  if (rc != 0) fail_msg("%s %s: %s (%d)", commit ? "GlobalCommit" : "GlobalRollback", xid, txp_errname(rc), rc);
  assert_int_equal(status, commit ? TXP_GS_COMMITTED : TXP_GS_ROLLBACKED);
}

/* The branches of 'xid' told of its decision (messages 'type'), up to 8
 * of them into 'ids', newest first: both 'b1' and 'b2' are among them. */
static int told_both(const char *xid, int type, int64_t b1, int64_t b2, int64_t ids[8]) {
  int n = rm_events(xid, type, 0, ids, 8);
  assert_true(has_id(ids, n, b1) && has_id(ids, n, b2));
  return n;
}

/* Commit with two branches served by the RM thread, and check it all ended
 * committed, each branch told once at least ('told': an AT commit without
 * commit work, finished at its decision, has its branches told only when
 * tcd heard the decision's answer; otherwise their RMs delete the undo
 * rows in their resolve pass). */
static void commit_and_check_told(armed_txn_t *t, bool told) {
  const char *xid = t->xid;
  int64_t b1 = t->order_branch, b2 = t->stock_branch;
  decide_ok(&t->cl, xid, true);
  expect_history(xid, TXP_GS_COMMITTED, WAIT_MS);
  assert_int_equal(history_branches(xid, TXP_BS_PHASE2_COMMITTED), 2);
  assert_int_equal(db_long(SQL_LIVE_ROWS, xid, NULL), 0);
  int64_t ids[8];
  if (told) {
    assert_true(rm_wait_events(xid, TXP_MSG_BRANCH_COMMIT, 0, 2, WAIT_MS));
    told_both(xid, TXP_MSG_BRANCH_COMMIT, b1, b2, ids);
  }
  assert_int_equal(rm_events(xid, TXP_MSG_BRANCH_ROLLBACK, 0, NULL, 0), 0);
}

static void commit_and_check(armed_txn_t *t) { commit_and_check_told(t, true); }

/* A begin lost in flight ('failpoint'): the TM gets an xid that is live,
 * once, and the transaction runs to its commit. */
static void begin_lost(const char *failpoint, const char *who) {
  armed_txn_t t;
  begin_armed(&t, failpoint, who, who);
  expect_fault_resolved(failpoint);
  assert_int_equal(count_globals_within(t.xid, 1), 1);
  assert_int_equal(db_long(SQL_GLOBAL_STATUS, t.xid, NULL), TXP_GS_BEGIN);
  register_both(&t, false);
  commit_and_check(&t);
}

/* A registration lost in flight ('failpoint'): the RM gets the branch id
 * that is recorded, and there is one branch holding its one lock. */
static void register_lost(const char *failpoint, const char *who) {
  armed_txn_t t;
  begin_armed(&t, failpoint, who, who);
  t.order_branch = register_ok(t.cl.rm, t.xid, "db_orders", t.order_key);
  expect_fault_resolved(failpoint);
  assert_int_equal(db_long(SQL_BRANCHES, t.xid, NULL), 1);
  assert_int_equal(branch_status(t.order_branch), TXP_BS_REGISTERED);
  assert_int_equal(db_long(SQL_LOCKS, t.xid, NULL), 1);
  char row_key[96], holder[TXP_MAX_XID_LEN + 1];
  snprintf(row_key, sizeof(row_key), "db_orders^^^t_order^^^%s", who);
  db_text(SQL_KEY_HOLDER, row_key, holder, sizeof(holder));
  assert_string_equal(holder, t.xid);
  t.stock_branch = register_ok(t.cl.rm, t.xid, "db_stock", t.stock_key);
  commit_and_check(&t);
}

/* A test that loses one op in flight: 'lost' (begin_lost, register_lost,
 * rollback_lost) with tcd armed at 'failpoint', as client 'who'. */
#define LOSS_TEST(name, lost, failpoint, who) \
  static void name(void **state) {            \
    (void)state;                              \
    lost(failpoint, who);                     \
  }

/* Committed, its answer lost: the TM gets that xid, once. */
LOSS_TEST(test_begin_reply_lost, begin_lost, "tc.store.begin.reply_lost", "u1")

/* Never committed: the begin runs again. */
LOSS_TEST(test_begin_aborted, begin_lost, "tc.store.begin.aborted", "u2")

/* Committed with its lock, its answer lost. */
LOSS_TEST(test_register_reply_lost, register_lost, "tc.store.register.reply_lost", "u3")

/* Never committed: the registration runs again and takes its lock. */
LOSS_TEST(test_register_aborted, register_lost, "tc.store.register.aborted", "u4")

/* A commit decision recorded, its answer lost: the TM hears "committed"
 * (not an error it would have to guess about).  Branches with commit work
 * are driven; AT branches without it were finished by the decision, which
 * the reading finds in the history (their RMs' resolve passes delete the
 * undo rows of a notice never sent). */
static void test_commit_reply_lost(void **state) {
  (void)state;
  armed_txn_t t;
  begin_armed(&t, "tc.store.decide.reply_lost", "u5", "u5-commit-reply-lost");
  register_both(&t, true);
  commit_and_check(&t);
  expect_fault_resolved("tc.store.decide.reply_lost");

  begin_armed(&t, "tc.store.decide.reply_lost", "u5b", "u5-at-commit-reply-lost");
  register_both(&t, false);
  commit_and_check_told(&t, false);
  expect_fault_resolved("tc.store.decide.reply_lost");
}

/* A rollback decision lost in flight ('failpoint'), of a global with two
 * branches: the TM's answer comes once both are undone, newest first, as
 * without the fault (answered as a fresh decision when it had committed,
 * run again when it had not). */
static void rollback_lost(const char *failpoint, const char *who) {
  armed_txn_t t;
  begin_armed(&t, failpoint, who, who);
  register_both(&t, false);
  decide_ok(&t.cl, t.xid, false);
  expect_fault_resolved(failpoint);
  int64_t ids[8];
  assert_true(told_both(t.xid, TXP_MSG_BRANCH_ROLLBACK, t.order_branch, t.stock_branch, ids) >= 2);
  assert_int_equal(ids[0], t.stock_branch); /* newest first */
  expect_history(t.xid, TXP_GS_ROLLBACKED, WAIT_MS);
  assert_int_equal(db_long(SQL_LIVE_ROWS, t.xid, NULL), 0);
}

LOSS_TEST(test_rollback_aborted, rollback_lost, "tc.store.decide.aborted", "u6")

LOSS_TEST(test_rollback_reply_lost, rollback_lost, "tc.store.decide.reply_lost", "u7")

/* The last tcd (armed or not) must stop cleanly: the suite's teardown. */
static int group_teardown(void **state) {
  if (g_log[0]) unlink(g_log);
  return suite_group_teardown(state);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup_teardown(test_begin_reply_lost, suite_test_setup, suite_test_teardown),
    cmocka_unit_test_setup_teardown(test_begin_aborted, suite_test_setup, suite_test_teardown),
    cmocka_unit_test_setup_teardown(test_register_reply_lost, suite_test_setup, suite_test_teardown),
    cmocka_unit_test_setup_teardown(test_register_aborted, suite_test_setup, suite_test_teardown),
    cmocka_unit_test_setup_teardown(test_commit_reply_lost, suite_test_setup, suite_test_teardown),
    cmocka_unit_test_setup_teardown(test_rollback_aborted, suite_test_setup, suite_test_teardown),
    cmocka_unit_test_setup_teardown(test_rollback_reply_lost, suite_test_setup, suite_test_teardown),
  };
  return cmocka_run_group_tests_name("tcd_unknown_outcome", tests, suite_group_setup, group_teardown);
}
