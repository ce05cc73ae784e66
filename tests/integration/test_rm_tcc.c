/*
 * test_rm_tcc.c - TCC branches (rm_tcc_resource_add, rm_tcc_try, the
 * fence): commit, rollback, a cancel before the try (the empty rollback)
 * and the try after it refused (anti-hanging), a cancel that meets the
 * try's uncommitted row, duplicate and contradicting phase two, handler
 * failures, AT and TCC in one global, the RM gone between try and confirm,
 * tcd killed after the decision, the retention sweep, the argument
 * checks.  The fixture is test_rm_modes.c.
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

#include "rm_modes_fixture.h"
#include "rm_tcc.h"
#include "txp_status.h"

/* Commit: rm_tm_commit returns once the confirm ran (the coordinator waits
 * for TCC phase two); rollback: the cancel gives the freeze back. */
void test_commit_and_rollback(void **state) {
  (void)state;
  char acct[ACCT_MAX], xid[RM_XID_MAX];
  PGconn *s = open_with_account(100, acct);
  int c0 = atomic_load(&confirms), k0 = atomic_load(&cancels);

  int64_t bid = begin_and_freeze(s, "tcc_commit", acct, 30, xid);
  assert_true(bid > 0);
  assert_int_equal(fence(s, xid, bid), 1);
  expect_account(s, acct, 100, 30);
  assert_int_equal(commit_ok(xid), RM_GS_COMMITTED);
  /* No wait: applied when the TM heard "committed". */
  assert_int_equal(fence(s, xid, bid), 2);
  expect_account(s, acct, 70, 0);
  assert_int_equal(atomic_load(&confirms), c0 + 1);
  assert_int_equal(atomic_load(&cancels), k0);

  char xid2[RM_XID_MAX];
  bid = begin_and_freeze(s, "tcc_rollback", acct, 50, xid2);
  expect_account(s, acct, 70, 50);
  assert_int_equal(rollback_ok(xid2), RM_GS_ROLLBACKED);
  assert_int_equal(fence(s, xid2, bid), 3);
  expect_account(s, acct, 70, 0);
  assert_int_equal(atomic_load(&cancels), k0 + 1);
  assert_int_equal(atomic_load(&confirms), c0 + 1);

  /* A freeze over the balance fails in the try's own transaction: the
   * branch was registered, nothing was tried, the rollback is empty. */
  char xid3[RM_XID_MAX];
  begin_global("tcc_too_much", xid3);
  assert_int_equal(try_freeze(client, RES, s, xid3, acct, 500, true, &bid), RM_E_GUARD);
  assert_int_equal(fence(s, xid3, bid), LLONG_MIN);
  rollback_ok(xid3);
  assert_int_equal(fence(s, xid3, bid), 4);
  assert_int_equal(atomic_load(&cancels), k0 + 1); /* no handler for an empty rollback */
  assert_int_equal(acct_col(s, acct, "frozen"), 0);
}

/* The cancel arrives between the try's registration and its fence row:
 * recorded as an empty rollback, and the try is then refused. */
void test_cancel_before_try(void **state) {
  (void)state;
  char acct[ACCT_MAX], xid[RM_XID_MAX];
  PGconn *s = open_with_account(10, acct);
  int k0 = atomic_load(&cancels);
  begin_global("tcc_cancel_first", xid);
  int64_t bid = 0;
  int rc = branch_with_rollback_at_registration(&rm__tcc_failpoint_after_register, &rm__tcc_failpoint_arg, try_freeze,
                                                RES, s, xid, acct, 5, &bid);
  assert_int_equal(rc, RM_E_FENCE); /* anti-hanging */
  assert_non_null(strstr(rm_errmsg(), "before its try"));
  assert_int_equal(bid, 0);
  /* Nothing frozen, the row says why, no cancel handler ran. */
  assert_int_equal(acct_col(s, acct, "frozen"), 0);
  PGconn *w = itest_pg(stock_url);
  long long st4 = q_ll(w, "SELECT status FROM branch_fence WHERE xid = $1", xid, NULL);
  assert_int_equal(st4, 4);
  assert_int_equal(atomic_load(&cancels), k0);
  assert_int_equal(global_status(xid), RM_GS_ROLLBACKED);
}

/* The cancel meets the try's row inserted but not committed: it waits on
 * the key, then cancels the committed try. */
void test_cancel_meets_uncommitted_try(void **state) {
  (void)state;
  char acct[ACCT_MAX], xid[RM_XID_MAX];
  PGconn *s = open_with_account(10, acct), *w = itest_pg(stock_url);
  int k0 = atomic_load(&cancels);
  begin_global("tcc_cancel_waits", xid);
  int64_t bid = 0;
  assert_int_equal(try_freeze(client, RES, s, xid, acct, 4, false, &bid), 0);
  struct rollback_run *rollback = rollback_start(xid);
  sleep_ms(300); /* the cancel is waiting on the try's uncommitted key */
  assert_true(exec_ok(s, "COMMIT"));
  rollback_join(rollback);
  /* Within the phase-two lock timeout it cancels at once; past it, the
   * coordinator's retry does: either way, the end is the same. */
  assert_int_equal(WAIT_EQ(RM_GS_ROLLBACKED, 20, global_status(xid)), RM_GS_ROLLBACKED);
  assert_int_equal(WAIT_EQ(3, 10, fence(w, xid, bid)), 3);
  assert_int_equal(acct_col(w, acct, "frozen"), 0);
  assert_int_equal(atomic_load(&cancels), k0 + 1);
}

/* Phase two delivered twice, concurrently, late, and against the grain. */
void test_duplicate_phase2(void **state) {
  (void)state;
  char acct[ACCT_MAX], xid[RM_XID_MAX];
  PGconn *s = open_with_account(100, acct);
  int c0 = atomic_load(&confirms), k0 = atomic_load(&cancels);
  /* Tried, left undecided at the TC: two concurrent confirms straight to
   * the RM confirm once. */
  int64_t bid = begin_and_freeze(s, "tcc_dup", acct, 10, xid);
  p2_arg_t a[2];
  phase2_twice_at_once(phase2_req(true, xid, bid, RES, TXP_BT_TCC), a);
  for (int i = 0; i < 2; i++) assert_int_equal(a[i].status, TXP_BS_PHASE2_COMMITTED);
  assert_int_equal(atomic_load(&confirms), c0 + 1);
  assert_int_equal(acct_col(s, acct, "balance"), 90);
  /* The TC's own commit: answered from the row. */
  commit_ok(xid);
  assert_int_equal(atomic_load(&confirms), c0 + 1);
  assert_int_equal(acct_col(s, acct, "balance"), 90);
  /* A cancel of a confirmed branch: refused for good, nothing changes. */
  int code = 0;
  char msg[512];
  rm_phase2_req_t cancel = a[0].req;
  cancel.commit = false;
  assert_int_equal(rm__at_phase2(client, &cancel, &code, msg, sizeof(msg)), TXP_BS_PHASE2_ROLLBACK_FAILED_UNRETRYABLE);
  assert_int_equal(code, RM_E_FENCE);
  assert_non_null(strstr(msg, "confirmed"));
  assert_int_equal(atomic_load(&cancels), k0);
  expect_account(s, acct, 90, 0);

  /* Cancels twice; a confirm after them refused. */
  char xid2[RM_XID_MAX];
  bid = begin_and_freeze(s, "tcc_dup_cancel", acct, 20, xid2);
  rollback_ok(xid2);
  rm_phase2_req_t c2 = phase2_req(false, xid2, bid, RES, TXP_BT_TCC);
  assert_int_equal(rm__at_phase2(client, &c2, &code, msg, sizeof(msg)), TXP_BS_PHASE2_ROLLBACKED);
  assert_int_equal(rm__at_phase2(client, &c2, &code, msg, sizeof(msg)), TXP_BS_PHASE2_ROLLBACKED);
  assert_int_equal(atomic_load(&cancels), k0 + 1);
  assert_int_equal(acct_col(s, acct, "frozen"), 0);
  c2.commit = true;
  assert_int_equal(rm__at_phase2(client, &c2, &code, msg, sizeof(msg)), TXP_BS_PHASE2_COMMIT_FAILED_UNRETRYABLE);
  assert_int_equal(code, RM_E_FENCE);

  /* A confirm of a branch whose try never committed: retryable. */
  rm_phase2_req_t ghost = phase2_req(true, "127.0.0.1:1:434343", 987650001, RES, TXP_BT_TCC);
  assert_int_equal(rm__at_phase2(client, &ghost, &code, msg, sizeof(msg)), TXP_BS_PHASE2_COMMIT_FAILED_RETRYABLE);
  assert_int_equal(code, RM_E_STATE);
  assert_int_equal(fence(s, ghost.xid, ghost.branch_id), LLONG_MIN);
  /* A TCC branch of a resource without TCC handlers: retryable (an RM
   * that serves it may come). */
  ghost.resource_id = "orders";
  assert_int_equal(rm__at_phase2(client, &ghost, &code, msg, sizeof(msg)), TXP_BS_PHASE2_COMMIT_FAILED_RETRYABLE);
  assert_int_equal(code, RM_E_NOT_SUPPORTED);
}

/* A confirm that asks for a retry (after writing: rolled back with it),
 * one that breaks its transaction and says OK (not recorded), and one that
 * fails for good (CommitFailed for an operator). */
void test_handler_failures(void **state) {
  (void)state;
  char acct[ACCT_MAX], xid[RM_XID_MAX];
  PGconn *s = open_with_account(100, acct);
  int c0 = atomic_load(&confirms);

  atomic_store(&confirm_retries_left, 2);
  int64_t bid = begin_and_freeze(s, "tcc_retry", acct, 10, xid);
  commit_ok(xid); /* decided; phase two retries */
  assert_int_equal(WAIT_EQ(2, 20, fence(s, xid, bid)), 2);
  assert_int_equal(atomic_load(&confirm_retries_left), 0);
  assert_int_equal(atomic_load(&confirms), c0 + 1);
  assert_int_equal(acct_col(s, acct, "balance"), 90); /* once, not three times */
  assert_int_equal(WAIT_EQ(RM_GS_COMMITTED, 20, global_status(xid)), RM_GS_COMMITTED);

  atomic_store(&confirm_breaks_txn, 1);
  char xid2[RM_XID_MAX];
  bid = begin_and_freeze(s, "tcc_liar", acct, 10, xid2);
  commit_ok(xid2);
  sleep_ms(300);
  assert_int_equal(fence(s, xid2, bid), 1); /* still tried: nothing recorded */
  assert_int_equal(acct_col(s, acct, "balance"), 90);
  atomic_store(&confirm_breaks_txn, 0);
  assert_int_equal(WAIT_EQ(2, 20, fence(s, xid2, bid)), 2);
  assert_int_equal(acct_col(s, acct, "balance"), 80);

  atomic_store(&confirm_fail, 1);
  char xid3[RM_XID_MAX];
  bid = begin_and_freeze(s, "tcc_declined", acct, 10, xid3);
  int st = 0;
  int rc = rm_tm_commit(client, xid3, &st);
  atomic_store(&confirm_fail, 0);
  assert_int_equal(rc, RM_E_COMMIT_FAILED);
  assert_int_equal(st, RM_GS_COMMIT_FAILED);
  assert_int_equal(fence(s, xid3, bid), 1);
  assert_int_equal(acct_col(s, acct, "frozen"), 10); /* held for the operator */
}

/* AT and TCC branches in one global: both commit, or both roll back. */
void test_mixed_at_and_tcc(void **state) {
  (void)state;
  char acct[ACCT_MAX], xid[RM_XID_MAX];
  PGconn *s = open_with_account(100, acct);
  for (int commit = 1; commit >= 0; commit--) {
    char k[64];
    snprintf(k, sizeof(k), "order-%s-%d", acct, commit);
    begin_global("tcc_mixed", xid);
    assert_int_equal(at_set(xid, k, "PAID"), 0);
    int64_t bid = 0;
    assert_int_equal(try_freeze(client, RES, s, xid, acct, 25, true, &bid), 0);
    if (commit) {
      commit_ok(xid);
      assert_int_equal(fence(s, xid, bid), 2);
    } else {
      assert_int_equal(rollback_ok(xid), RM_GS_ROLLBACKED);
      assert_int_equal(fence(s, xid, bid), 3);
    }
    expect_account(s, acct, 75, 0);
    expect_order(k, commit ? "PAID" : "NEW");
  }
}

/* The RM that tried is gone before the confirm: the global is committed
 * as a decision and retried; the next RM of the resource confirms it. */
void test_rm_gone_between_try_and_confirm(void **state) {
  (void)state;
  char acct[ACCT_MAX], xid[RM_XID_MAX];
  PGconn *s = open_with_account(100, acct);
  int c0 = atomic_load(&confirms);
  rm_client_t *c2 = new_client("test_rm_modes_b", RES_ALONE, NULL);
  begin_global("tcc_rm_gone", xid);
  int64_t bid = 0;
  assert_int_equal(try_freeze(c2, RES_ALONE, s, xid, acct, 40, true, &bid), 0);
  rm_client_free(c2); /* the RM dies with its try committed */
  commit_ok(xid);
  sleep_ms(300);
  assert_int_equal(fence(s, xid, bid), 1);
  assert_int_equal(atomic_load(&confirms), c0);
  assert_int_equal(acct_col(s, acct, "frozen"), 40);
  rm_client_t *c3 = new_client("test_rm_modes_b", RES_ALONE, NULL);
  assert_int_equal(WAIT_EQ(2, 20, fence(s, xid, bid)), 2);
  assert_int_equal(atomic_load(&confirms), c0 + 1);
  expect_account(s, acct, 60, 0);
  assert_int_equal(WAIT_EQ(RM_GS_COMMITTED, 20, global_status(xid)), RM_GS_COMMITTED);
  rm_client_free(c3);
}

/* tcd is killed after deciding the commit, before the confirm got through
 * (it keeps asking for a retry); the restarted node finishes it. */
void test_tc_killed_after_decision(void **state) {
  (void)state;
  char acct[ACCT_MAX], xid[RM_XID_MAX];
  PGconn *s = open_with_account(100, acct);
  int c0 = atomic_load(&confirms);
  atomic_store(&confirm_retries_left, 1000000);
  int64_t bid = begin_and_freeze(s, "tcc_tc_killed", acct, 15, xid);
  commit_ok(xid);
  tcd_proc_kill(&tcd);
  atomic_store(&confirm_retries_left, 0);
  assert_int_equal(fence(s, xid, bid), 1);
  assert_int_equal(tcd_proc_restart(&tcd), 0);
  assert_int_equal(WAIT_EQ(2, 30, fence(s, xid, bid)), 2);
  assert_int_equal(atomic_load(&confirms), c0 + 1);
  assert_int_equal(acct_col(s, acct, "balance"), 85);
  assert_int_equal(WAIT_EQ(RM_GS_COMMITTED, 20, global_status(xid)), RM_GS_COMMITTED);
}

/* The retention sweep takes finished rows past the retention, never a
 * tried one. */
void test_sweep(void **state) {
  (void)state;
  char acct[ACCT_MAX], xid[RM_XID_MAX], xid2[RM_XID_MAX];
  PGconn *s = open_with_account(100, acct);
  int64_t done = begin_and_freeze(s, "tcc_sweep_done", acct, 1, xid);
  commit_ok(xid);
  int64_t open = begin_and_freeze(s, "tcc_sweep_open", acct, 1, xid2);
  assert_true(exec_ok(s, "UPDATE branch_fence SET modified = now() - interval '3 days'"));
  long long removed = 0;
  assert_int_equal(rm__at_sweep(client, &removed), 0);
  assert_true(removed >= 1);
  assert_int_equal(fence(s, xid, done), LLONG_MIN);
  assert_int_equal(fence(s, xid2, open), 1);
  rollback_ok(xid2);
  assert_int_equal(fence(s, xid2, open), 3);
}

void test_bad_input(void **state) {
  (void)state;
  PGconn *s = itest_pg(stock_url);
  rm_tcc_handlers_t half = {.confirm = on_confirm};
  assert_int_equal(rm_tcc_resource_add(NULL, RES, stock_url, &tcc_handlers), RM_E_INVALID);
  assert_int_equal(rm_tcc_resource_add(client, RES, stock_url, NULL), RM_E_INVALID);
  assert_int_equal(rm_tcc_resource_add(client, RES, stock_url, &half), RM_E_INVALID);
  assert_int_equal(rm_tcc_resource_add(client, RES, stock_url, &tcc_handlers), RM_E_INVALID); /* twice */
  assert_non_null(strstr(rm_errmsg(), "already"));

  /* A database without the fence (the RM schema at version 1). */
  char url[512];
  itest_fresh_database(tc_url, stock_url, "tcc_nofence", url, sizeof(url));
  PGconn *n = itest_pg(url);
  assert_true(exec_ok(n, "CREATE TABLE undo_log (id bigserial PRIMARY KEY, branch_id bigint, xid text, context text,"
                         " rollback_info jsonb, log_status int, log_created timestamptz, log_modified timestamptz)"));
  assert_int_equal(rm_tcc_resource_add(client, "nofence", url, &tcc_handlers), RM_E_NO_TABLE);
  assert_non_null(strstr(rm_errmsg(), "txc-db-migrate"));

  char xid[RM_XID_MAX];
  begin_global("tcc_bad", xid);
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
  rollback_ok(xid);
}

