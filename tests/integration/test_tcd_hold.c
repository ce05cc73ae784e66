/*
 * test_tcd_hold.c - tcd end to end, begins answered before they are
 * stored (tc/tc_hold.h): a real tcd on a real PostgreSQL with
 * store.begin_hold_ms = 1000, driven over the wire.
 *
 * NOTES
 *   The hold is long here so that what happens inside it is not a matter
 *   of timing: a begin's row is absent for a second unless something
 *   stores it.  What each test shows:
 *     - the first registration carries the begin: the global's row and the
 *       branch's were written by one PostgreSQL transaction (same xmin);
 *     - a second registration sent in the same write waits for the first
 *       one's batch instead of finding no global;
 *     - a status, a commit without branches: each stores the begin first
 *       and then runs as before;
 *     - a registration that meets a lock and waits carries the begin only
 *       once: it is stored with the first try, the retry after the wake-up
 *       succeeds;
 *     - a begin nobody follows is stored alone when the hold ends;
 *     - another node that gets a registration of a held xid runs it again
 *       after the hold and finds the global;
 *     - a clean stop stores what it holds, and a kill -9 loses it (the
 *       TM's commit finds no global);
 *     - a keyed begin is held only on its first send (FIRST_SEND); a resend
 *       gets the same xid whether the first is still held or stored, and
 *       a keyed begin without the flag is stored before its answer.
 *   The fixture is tcd_suite.h (the RM thread answers phase two).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "tcd_suite.h"

#define HOLD_MS "1000"
#define SQL_GLOBALS "SELECT count(*) FROM global_table WHERE xid = $1"
/* 1 when the global's row and branch $2's were inserted by one transaction. */
#define SQL_SAME_TXN                                                                          \
  "SELECT (g.xmin::text = b.xmin::text)::int FROM global_table g JOIN branch_table b USING (xid) " \
  "WHERE g.xid = $1 AND b.branch_id = $2::bigint"

static long same_txn(const char *xid, int64_t branch) {
  char id[32];
  snprintf(id, sizeof(id), "%lld", (long long)branch);
  return db_long(SQL_SAME_TXN, xid, id);
}

/* 1. begin + register + register + commit: the begin rides the first
 * registration's transaction. */
static void test_first_register_carries_begin(void **state) {
  (void)state;
  cli_t cl = new_cli("h1");
  char xid[TXP_MAX_XID_LEN + 1];
  begin_ok(cl.tm, 30000, "h1", xid);
  assert_int_equal(db_long(SQL_GLOBALS, xid, NULL), 0); /* answered, held */
  int64_t b1 = register_ok(cl.rm, xid, "db_orders", "t_hold:1");
  assert_int_equal(db_long(SQL_GLOBAL_STATUS, xid, NULL), TXP_GS_BEGIN);
  assert_int_equal(same_txn(xid, b1), 1);
  int64_t b2 = register_ok(cl.rm, xid, "db_stock", "t_hold:2");
  assert_int_equal(same_txn(xid, b2), 0);
  commit_ok(cl.tm, xid);
  expect_commits_told(xid, b1, b2);
}

/* 2. Two registrations in one write: the second waits for the first's
 * batch (which stores the begin) and finds the global. */
static void test_second_register_waits(void **state) {
  (void)state;
  cli_t cl = new_cli("h2");
  txc_t *c = client(true, "h2-raw", "db_client");
  reader_t *rd = new_reader();
  char xid[TXP_MAX_XID_LEN + 1];
  begin_ok(cl.tm, 30000, "h2", xid);
  txp_msg_t m[2], res;
  msg_register(&m[0], xid, "db_orders", "t_hold:3", 0, NULL);
  msg_register(&m[1], xid, "db_stock", "t_hold:4", 0, NULL);
  send_frames(c, m, 2, 10);
  expect_answer(c, rd, 10, &res, 0);
  int64_t b1 = res.branch_id;
  txp_msg_clear(&res);
  expect_answer(c, rd, 11, &res, 0);
  int64_t b2 = res.branch_id;
  txp_msg_clear(&res);
  assert_true(b1 > 0 && b2 > 0 && b1 != b2);
  assert_int_equal(same_txn(xid, b1), 1);
  assert_int_equal(db_long(SQL_BRANCHES, xid, NULL), 2);
  rollback_ok(cl.tm, xid);
  assert_true(db_wait_long(SQL_LIVE_ROWS, xid, NULL, 0, WAIT_MS));
}

/* 3. A status and a commit that come before any registration store the
 * begin first, then run as they always did. */
static void test_status_and_empty_commit(void **state) {
  (void)state;
  cli_t cl = new_cli("h3");
  char xid[TXP_MAX_XID_LEN + 1];
  begin_ok(cl.tm, 30000, "h3", xid);
  int status = -1;
  assert_int_equal(txc_status(cl.tm, xid, &status), 0);
  assert_int_equal(status, TXP_GS_BEGIN);
  assert_int_equal(db_long(SQL_GLOBAL_STATUS, xid, NULL), TXP_GS_BEGIN);

  char x2[TXP_MAX_XID_LEN + 1];
  begin_ok(cl.tm, 30000, "h3-empty", x2);
  commit_ok(cl.tm, x2);
  assert_int_equal(db_long(SQL_GLOBALS, x2, NULL), 0);
  assert_true(db_wait_long("SELECT count(*) FROM global_history WHERE xid = $1", x2, NULL, 1, WAIT_MS));
  rollback_ok(cl.tm, xid);
}

/* 4. A registration that carries the begin, meets a lock and waits: the
 * begin was stored with its first try; the retry after the holder
 * commits registers the branch under the same global. */
static void test_lock_wait_carries_begin_once(void **state) {
  (void)state;
  cli_t cl = new_cli("h4");
  char holder[TXP_MAX_XID_LEN + 1], xid[TXP_MAX_XID_LEN + 1];
  begin_ok(cl.tm, 30000, "h4-holder", holder);
  register_ok(cl.rm, holder, "db_orders", "t_hold:5");

  txc_t *c = client(true, "h4-waiter", "db_client");
  reader_t *rd = new_reader();
  begin_ok(cl.tm, 30000, "h4", xid);
  queue_waiter(c, rd, xid, "t_hold:5", 10000, 20); /* the probe's conflict proves it waits */
  assert_int_equal(db_long(SQL_GLOBAL_STATUS, xid, NULL), TXP_GS_BEGIN);
  assert_int_equal(db_long(SQL_BRANCHES, xid, NULL), 0);

  commit_ok(cl.tm, holder); /* a commit releases its locks at the decision */
  txp_msg_t res;
  expect_answer(c, rd, 20, &res, 0);
  int64_t b = res.branch_id;
  txp_msg_clear(&res);
  assert_true(b > 0);
  assert_int_equal(db_long(SQL_GLOBALS, xid, NULL), 1);
  assert_int_equal(db_long(SQL_BRANCHES, xid, NULL), 1);
  assert_int_equal(same_txn(xid, b), 0);
  rollback_ok(cl.tm, xid);
}

/* 5. A begin that nobody follows is stored alone when its hold ends, and
 * works as any other afterwards. */
static void test_hold_ends(void **state) {
  (void)state;
  cli_t cl = new_cli("h5");
  char xid[TXP_MAX_XID_LEN + 1];
  begin_ok(cl.tm, 30000, "h5", xid);
  assert_true(db_wait_long(SQL_GLOBALS, xid, NULL, 1, WAIT_MS));
  assert_int_equal(db_long(SQL_GLOBAL_STATUS, xid, NULL), TXP_GS_BEGIN);
  int64_t b = register_ok(cl.rm, xid, "db_orders", "t_hold:6");
  assert_int_equal(same_txn(xid, b), 0);
  rollback_ok(cl.tm, xid);
}

/* After a test stopped or killed tcd on purpose: a new one, with the RM
 * thread registered again (its generation above 'gen'). */
static void start_again(int gen) {
  g_stopped_on_purpose = false;
  assert_int_equal(tcd_start(), 0);
  assert_true(rm_wait_generation(gen, WAIT_MS));
}

/* 6. A clean stop stores the begins it holds (the TM's later calls may go
 * to another node). */
static void test_stop_stores_held(void **state) {
  (void)state;
  cli_t cl = new_cli("h6");
  char xid[TXP_MAX_XID_LEN + 1];
  begin_ok(cl.tm, 30000, "h6", xid);
  assert_int_equal(db_long(SQL_GLOBALS, xid, NULL), 0);
  int gen = rm_generation();
  g_stopped_on_purpose = true;
  int st = tcd_stop();
  assert_true(st != -1);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) fail_msg("tcd did not exit cleanly on SIGTERM: status 0x%x", st);
  assert_int_equal(db_long(SQL_GLOBAL_STATUS, xid, NULL), TXP_GS_BEGIN);
  start_again(gen);
  cli_t again = new_cli("h6-again");
  rollback_ok(again.tm, xid);
}

/* A GlobalBegin with idempotency key 'key', marked as its first send or
 * not; its xid into 'xid'. */
static void keyed_begin(txc_t *tm, const char *key, bool first_send, char *xid) {
  txp_msg_t req, res;
  txp_msg_init(&req, TXP_MSG_GLOBAL_BEGIN);
  txp_msg_set_int(&req, TXP_F_TIMEOUT_MS, 30000);
  txp_msg_set_str(&req, TXP_F_IDEM_KEY, key);
  if (first_send) txp_msg_set_int(&req, TXP_F_FIRST_SEND, 1);
  int rc = txc_call(tm, &req, &res, WAIT_MS);
  if (rc != 0 || res.code != 0 || !res.xid)
    fail_msg("keyed GlobalBegin %s: %d / %lld", key, rc, (long long)res.code);
  snprintf(xid, TXP_MAX_XID_LEN + 1, "%s", res.xid);
  txp_msg_clear(&res);
}

/* 7. A keyed begin on its first send is held; its resend (no flag) gets
 * the same xid from the hold, and the first registration carries it. */
static void test_keyed_first_send_held(void **state) {
  (void)state;
  cli_t cl = new_cli("h7");
  char xid[TXP_MAX_XID_LEN + 1], again[TXP_MAX_XID_LEN + 1];
  keyed_begin(cl.tm, "h7-key", true, xid);
  assert_int_equal(db_long(SQL_GLOBALS, xid, NULL), 0);
  keyed_begin(cl.tm, "h7-key", false, again);
  assert_string_equal(again, xid);
  int64_t b = register_ok(cl.rm, xid, "db_orders", "t_hold:7");
  assert_int_equal(same_txn(xid, b), 1);
  assert_int_equal(db_long("SELECT count(*) FROM global_table WHERE idem_key = $1", "h7-key", NULL), 1);
  keyed_begin(cl.tm, "h7-key", false, again); /* stored now: the store finds it */
  assert_string_equal(again, xid);
  rollback_ok(cl.tm, xid);
}

/* 8. A keyed begin that may be a resend (no FIRST_SEND) is stored before
 * it is answered; a held one is stored with its key, so a later resend
 * finds it in the store. */
static void test_keyed_without_flag_stored_first(void **state) {
  (void)state;
  cli_t cl = new_cli("h8");
  char xid[TXP_MAX_XID_LEN + 1], again[TXP_MAX_XID_LEN + 1];
  keyed_begin(cl.tm, "h8-key", false, xid);
  assert_int_equal(db_long(SQL_GLOBAL_STATUS, xid, NULL), TXP_GS_BEGIN);
  rollback_ok(cl.tm, xid);

  keyed_begin(cl.tm, "h8-key-2", true, xid);
  assert_true(db_wait_long(SQL_GLOBALS, xid, NULL, 1, WAIT_MS)); /* the hold ended */
  keyed_begin(cl.tm, "h8-key-2", false, again);
  assert_string_equal(again, xid);
  rollback_ok(cl.tm, xid);
}

/* 9. What the hold gives up: a tcd killed while it holds a begin loses it
 * (nothing under that xid could have changed); the TM's commit then finds
 * no global, and the store has no trace of it. */
static void test_kill_loses_held(void **state) {
  (void)state;
  cli_t cl = new_cli("h9");
  char xid[TXP_MAX_XID_LEN + 1];
  begin_ok(cl.tm, 30000, "h9", xid);
  int gen = rm_generation();
  g_stopped_on_purpose = true;
  tcd_kill9();
  start_again(gen);
  cli_t again = new_cli("h9-again");
  int status = -1;
  assert_int_equal(txc_commit(again.tm, xid, &status), TXP_EGLOBAL_NOT_FOUND);
  assert_int_equal(db_long(SQL_GLOBALS, xid, NULL), 0);
  assert_int_equal(db_long("SELECT count(*) FROM global_history WHERE xid = $1", xid, NULL), 0);
}

static bool serving(const tcd_proc_t *t, void *arg) {
  (void)arg;
  return txc_serving(HOST, t->port, TOKEN, 200);
}

/* 10. A client that cannot reach the node that made an xid sends its calls
 * to another node.  While the maker holds the begin, the other node finds
 * no global: it runs the registration once more after the hold (plus a
 * margin), and by then the maker has stored the begin.  An xid that no
 * node holds is still "not found" after that one wait. */
static void test_other_node_waits_for_hold(void **state) {
  (void)state;
  static const char *env[] = {"TC_STORE_BEGIN_HOLD_MS=" HOLD_MS, NULL};
  tcd_proc_t other;
  memset(&other, 0, sizeof(other));
  tcd_opts_t o = {.token = TOKEN, .node_id = 2, .log_level = "warn", .env = env, .attempts = 5,
                  .timeout_ms = 15000, .ready = serving};
  if (tcd_proc_start(&other, &o) != 0) fail_msg("could not start a second tcd: %s", other.err);
  char err[256];
  txc_t *rm = txc_connect(HOST, other.port, 2000, err, sizeof(err));
  assert_non_null(rm);
  assert_int_equal(txc_register(rm, true, "test-app", "h10-rm-other", TOKEN, "db_client"), 0);

  cli_t cl = new_cli("h10");
  char xid[TXP_MAX_XID_LEN + 1];
  begin_ok(cl.tm, 30000, "h10", xid); /* held by the suite's node for a second */
  int64_t b = 0;
  assert_int_equal(txc_branch_register(rm, xid, "db_orders", "t_hold:10", 0, &b, NULL), 0);
  assert_true(b > 0);
  assert_int_equal(db_long(SQL_BRANCHES, xid, NULL), 1);
  commit_ok(cl.tm, xid);

  int64_t none = 0;
  assert_int_equal(txc_branch_register(rm, "127.0.0.1:1:7:0123456789abcdef", "db_orders", "t_hold:11", 0, &none, NULL),
                   TXP_EGLOBAL_NOT_FOUND);
  txc_close(rm);
  assert_int_equal(tcd_proc_stop(&other, 10000), 0);
}

int main(void) {
  g_tcd_setting = "TC_STORE_BEGIN_HOLD_MS=" HOLD_MS;
  const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup_teardown(test_first_register_carries_begin, suite_test_setup, suite_test_teardown),
    cmocka_unit_test_setup_teardown(test_second_register_waits, suite_test_setup, suite_test_teardown),
    cmocka_unit_test_setup_teardown(test_status_and_empty_commit, suite_test_setup, suite_test_teardown),
    cmocka_unit_test_setup_teardown(test_lock_wait_carries_begin_once, suite_test_setup, suite_test_teardown),
    cmocka_unit_test_setup_teardown(test_hold_ends, suite_test_setup, suite_test_teardown),
    cmocka_unit_test_setup_teardown(test_keyed_first_send_held, suite_test_setup, suite_test_teardown),
    cmocka_unit_test_setup_teardown(test_keyed_without_flag_stored_first, suite_test_setup, suite_test_teardown),
    cmocka_unit_test_setup_teardown(test_other_node_waits_for_hold, suite_test_setup, suite_test_teardown),
    cmocka_unit_test_setup_teardown(test_stop_stores_held, suite_test_setup, suite_test_teardown),
    cmocka_unit_test_setup_teardown(test_kill_loses_held, suite_test_setup, suite_test_teardown),
  };
  return cmocka_run_group_tests_name("tcd_hold", tests, suite_group_setup, suite_group_teardown);
}
