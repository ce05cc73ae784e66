/*
 * test_rm_xa.c - XA branches (rm_xa_resource_add, rm_xa_start,
 * rm_xa_prepare; COMMIT/ROLLBACK PREPARED in phase two): commit and
 * rollback with the change invisible until the commit, a PREPARE of a
 * failed transaction, a rollback before the start (anti-hanging) and one
 * that meets the branch still open, duplicates and contradictions, AT +
 * TCC + XA in one global, the RM gone with its branch prepared and tcd
 * killed before it is finished, the argument checks.  The fixture is
 * test_rm_modes.c.
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
#include "rm_xa.h"
#include "txp_status.h"

/* The XA branch: BEGIN, rm_xa_start, balance - amount (while it lasts);
 * rm_xa_prepare if 'prepare'.  0 or the first failing code (the
 * transaction then rolled back). */
static int xa_spend(rm_client_t *c, const char *res, PGconn *pg, const char *xid, const char *acct, int amount,
                    bool prepare, int64_t *bid) {
  char a[16];
  snprintf(a, sizeof(a), "%d", amount);
  assert_true(exec_ok(pg, "BEGIN"));
  int rc = rm_xa_start(c, xid, res, pg, bid);
  if (rc != 0) {
    assert_true(exec_ok(pg, "ROLLBACK"));
    return rc;
  }
  const char *p[2] = {acct, a};
  PGresult *r = PQexecParams(pg, "UPDATE tcc_account SET balance = balance - $2 WHERE id = $1 AND balance >= $2", 2,
                             NULL, p, NULL, NULL, 0);
  bool ok = PQresultStatus(r) == PGRES_COMMAND_OK && strcmp(PQcmdTuples(r), "1") == 0;
  PQclear(r);
  if (!ok) {
    assert_true(exec_ok(pg, "ROLLBACK"));
    return RM_E_GUARD;
  }
  if (prepare) rc = rm_xa_prepare(c, xid, pg, *bid);
  return rc;
}

/* A global begun ('name') with a prepared XA branch of the main client
 * spending 'amount' of 'acct', both of which must succeed: the branch. */
static int64_t begin_and_spend(PGconn *pg, const char *name, const char *acct, int amount, char *xid) {
  begin_global(name, xid);
  int64_t bid = 0;
  assert_int_equal(xa_spend(client, XA_RES, pg, xid, acct, amount, true, &bid), 0);
  return bid;
}

/* Whether branch 'bid' of 'xid' is a prepared transaction now. */
static long long prepared(PGconn *pg, const char *xid, int64_t bid) {
  char gid[RM_XA_GID_MAX];
  rm__xa_gid(gid, sizeof(gid), xid, bid);
  return q_ll(pg, "SELECT count(*) FROM pg_prepared_xacts WHERE gid = $1", gid, NULL);
}

void test_xa_commit_and_rollback(void **state) {
  (void)state;
  char acct[ACCT_MAX], xid[RM_XID_MAX];
  PGconn *s = open_with_account(100, acct), *w = itest_pg(stock_url);

  int64_t bid = begin_and_spend(s, "xa_commit", acct, 30, xid);
  assert_true(bid > 0);
  assert_int_equal(PQtransactionStatus(s), PQTRANS_IDLE); /* free for other work */
  assert_int_equal(prepared(w, xid, bid), 1);
  assert_int_equal(acct_col(w, acct, "balance"), 100); /* nobody sees it before the commit */
  assert_int_equal(fence(w, xid, bid), LLONG_MIN);
  assert_int_equal(commit_ok(xid), RM_GS_COMMITTED);
  assert_int_equal(acct_col(w, acct, "balance"), 70); /* at once: the TM waited for COMMIT PREPARED */
  assert_int_equal(prepared(w, xid, bid), 0);
  assert_int_equal(fence(w, xid, bid), 2);

  char xid2[RM_XID_MAX];
  bid = begin_and_spend(s, "xa_rollback", acct, 50, xid2);
  assert_int_equal(prepared(w, xid2, bid), 1);
  assert_int_equal(rollback_ok(xid2), RM_GS_ROLLBACKED);
  assert_int_equal(prepared(w, xid2, bid), 0);
  assert_int_equal(acct_col(w, acct, "balance"), 70);
  assert_int_equal(fence(w, xid2, bid), LLONG_MIN); /* rolled back with the branch */

  /* A PREPARE of a failed transaction prepares nothing; the rollback is
   * then an empty one, recorded. */
  char xid3[RM_XID_MAX];
  begin_global("xa_failed", xid3);
  assert_true(exec_ok(s, "BEGIN"));
  assert_int_equal(rm_xa_start(client, xid3, XA_RES, s, &bid), 0);
  PGresult *r = PQexec(s, "SELECT 1/0");
  PQclear(r);
  assert_int_equal(rm_xa_prepare(client, xid3, s, bid), RM_E_DB);
  assert_non_null(strstr(rm_errmsg(), "nothing was prepared"));
  assert_int_equal(PQtransactionStatus(s), PQTRANS_IDLE);
  assert_int_equal(prepared(w, xid3, bid), 0);
  rollback_ok(xid3);
  assert_int_equal(fence(w, xid3, bid), 4);
}

/* The rollback comes between the start's registration and its fence row:
 * recorded, and the start refused. */
void test_xa_rollback_before_start(void **state) {
  (void)state;
  char acct[ACCT_MAX], xid[RM_XID_MAX];
  PGconn *s = open_with_account(100, acct);
  begin_global("xa_rollback_first", xid);
  int64_t bid = 0;
  int rc = branch_with_rollback_at_registration(&rm__xa_failpoint_after_register, &rm__xa_failpoint_arg, xa_spend,
                                                XA_RES, s, xid, acct, 10, &bid);
  assert_int_equal(rc, RM_E_FENCE);
  assert_non_null(strstr(rm_errmsg(), "anti-hanging"));
  assert_int_equal(q_ll(s, "SELECT status FROM branch_fence WHERE xid = $1", xid, NULL), 4);
  assert_int_equal(q_ll(s, "SELECT count(*) FROM pg_prepared_xacts WHERE gid LIKE '%' || $1", xid, NULL), 0);
  assert_int_equal(acct_col(s, acct, "balance"), 100);
}

/* The rollback meets the branch's transaction still open: it cannot
 * record an empty rollback (the branch's own row holds the key), gives up
 * after its lock timeout, and the retry rolls the prepared branch back. */
void test_xa_rollback_meets_open_branch(void **state) {
  (void)state;
  char acct[ACCT_MAX], xid[RM_XID_MAX];
  PGconn *s = open_with_account(100, acct), *w = itest_pg(stock_url);
  begin_global("xa_rollback_waits", xid);
  int64_t bid = 0;
  assert_int_equal(xa_spend(client, XA_RES, s, xid, acct, 10, false, &bid), 0);
  struct rollback_run *rollback = rollback_start(xid);
  sleep_ms(300);
  assert_int_equal(rm_xa_prepare(client, xid, s, bid), 0); /* late, but the rollback still wins */
  rollback_join(rollback);
  assert_int_equal(WAIT_EQ(RM_GS_ROLLBACKED, 20, global_status(xid)), RM_GS_ROLLBACKED);
  assert_int_equal(WAIT_EQ(0, 10, prepared(w, xid, bid)), 0);
  assert_int_equal(acct_col(w, acct, "balance"), 100);
  assert_int_equal(fence(w, xid, bid), LLONG_MIN);
}

void test_xa_duplicates(void **state) {
  (void)state;
  char acct[ACCT_MAX], xid[RM_XID_MAX];
  PGconn *s = open_with_account(100, acct), *w = itest_pg(stock_url);
  /* Prepared, undecided at the TC: two concurrent commits straight to the
   * RM commit it once (the second finds it busy or done). */
  int64_t bid = begin_and_spend(s, "xa_dup", acct, 10, xid);
  p2_arg_t a[2];
  phase2_twice_at_once(phase2_req(true, xid, bid, XA_RES, TXP_BT_XA), a);
  assert_true(a[0].status == TXP_BS_PHASE2_COMMITTED || a[1].status == TXP_BS_PHASE2_COMMITTED);
  for (int i = 0; i < 2; i++)
    assert_true(a[i].status == TXP_BS_PHASE2_COMMITTED || a[i].status == TXP_BS_PHASE2_COMMIT_FAILED_RETRYABLE);
  assert_int_equal(acct_col(w, acct, "balance"), 90);
  commit_ok(xid); /* the TC's own: answered from the row */
  assert_int_equal(acct_col(w, acct, "balance"), 90);
  int code = 0;
  char msg[512];
  assert_int_equal(rm__at_phase2(client, &a[0].req, &code, msg, sizeof(msg)), TXP_BS_PHASE2_COMMITTED);
  rm_phase2_req_t rb = a[0].req;
  rb.commit = false;
  assert_int_equal(rm__at_phase2(client, &rb, &code, msg, sizeof(msg)), TXP_BS_PHASE2_ROLLBACK_FAILED_UNRETRYABLE);
  assert_int_equal(code, RM_E_FENCE);
  assert_int_equal(acct_col(w, acct, "balance"), 90);

  /* Rolled back twice; a commit after it refused. */
  char xid2[RM_XID_MAX];
  bid = begin_and_spend(s, "xa_dup_rollback", acct, 10, xid2);
  rollback_ok(xid2);
  rm_phase2_req_t r2 = phase2_req(false, xid2, bid, XA_RES, TXP_BT_XA);
  /* No prepared transaction, no row: an empty rollback recorded now. */
  assert_int_equal(rm__at_phase2(client, &r2, &code, msg, sizeof(msg)), TXP_BS_PHASE2_ROLLBACKED);
  assert_int_equal(fence(w, xid2, bid), 4);
  assert_int_equal(rm__at_phase2(client, &r2, &code, msg, sizeof(msg)), TXP_BS_PHASE2_ROLLBACKED);
  r2.commit = true;
  assert_int_equal(rm__at_phase2(client, &r2, &code, msg, sizeof(msg)), TXP_BS_PHASE2_COMMIT_FAILED_UNRETRYABLE);
  assert_int_equal(code, RM_E_FENCE);
  assert_int_equal(acct_col(w, acct, "balance"), 90);

  /* A commit of a branch that never prepared: retryable. */
  rm_phase2_req_t ghost = phase2_req(true, "127.0.0.1:1:454545", 987660001, XA_RES, TXP_BT_XA);
  assert_int_equal(rm__at_phase2(client, &ghost, &code, msg, sizeof(msg)), TXP_BS_PHASE2_COMMIT_FAILED_RETRYABLE);
  assert_int_equal(code, RM_E_STATE);
}

/* AT, TCC and XA branches in one global: all commit, or all roll back. */
void test_xa_mixed_at_tcc_xa(void **state) {
  (void)state;
  PGconn *s = itest_pg(stock_url), *x = itest_pg(stock_url);
  char wallet[32], ledger[32], xid[RM_XID_MAX];
  new_account(s, 100, wallet, sizeof(wallet));
  new_account(s, 100, ledger, sizeof(ledger));
  for (int commit = 1; commit >= 0; commit--) {
    char k[64];
    snprintf(k, sizeof(k), "xa-order-%s-%d", ledger, commit);
    begin_global("xa_mixed", xid);
    assert_int_equal(at_set(xid, k, "PAID"), 0);
    int64_t tb = 0, xb = 0;
    assert_int_equal(try_freeze(client, RES, s, xid, wallet, 20, true, &tb), 0);
    assert_int_equal(xa_spend(client, XA_RES, x, xid, ledger, 20, true, &xb), 0);
    if (commit)
      assert_int_equal(commit_ok(xid), RM_GS_COMMITTED);
    else
      assert_int_equal(rollback_ok(xid), RM_GS_ROLLBACKED);
    expect_account(s, wallet, 80, 0);
    assert_int_equal(acct_col(s, ledger, "balance"), 80);
    assert_int_equal(prepared(s, xid, xb), 0);
    expect_order(k, commit ? "PAID" : "NEW");
  }
}

void test_xa_bad_input(void **state) {
  (void)state;
  PGconn *s = itest_pg(stock_url);
  assert_int_equal(rm_xa_resource_add(NULL, XA_RES, stock_url), RM_E_INVALID);
  assert_int_equal(rm_xa_resource_add(client, XA_RES, stock_url), 0); /* again: nothing to do */
  char url[512];
  itest_fresh_database(tc_url, tc_url, "xa_nofence", url, sizeof(url));
  assert_int_equal(rm_xa_resource_add(client, "xa_nofence", url), RM_E_NO_TABLE);
  assert_non_null(strstr(rm_errmsg(), "txc-db-migrate"));

  char xid[RM_XID_MAX];
  begin_global("xa_bad", xid);
  int64_t bid = 5;
  assert_int_equal(rm_xa_start(client, xid, XA_RES, s, &bid), RM_E_STATE); /* no BEGIN */
  assert_int_equal(bid, 0);
  assert_int_equal(rm_xa_prepare(client, xid, s, 1), RM_E_STATE);
  assert_true(exec_ok(s, "BEGIN"));
  assert_int_equal(rm_xa_start(client, xid, "orders", s, &bid), RM_E_INVALID); /* not XA */
  assert_int_equal(rm_xa_start(client, xid, RES, s, &bid), RM_E_INVALID);      /* TCC only */
  assert_int_equal(rm_xa_start(client, "", XA_RES, s, &bid), RM_E_INVALID);
  assert_int_equal(rm_xa_prepare(client, xid, s, 0), RM_E_INVALID);
  assert_int_equal(rm_xa_prepare(NULL, xid, s, 1), RM_E_INVALID);
  assert_true(exec_ok(s, "ROLLBACK"));
  rollback_ok(xid);
}

/* The RM prepared its branch and died; the TM commits (CommitRetrying:
 * no RM serves the resource); tcd is killed and restarted; a new RM of the
 * resource comes and the restarted node finishes the prepared branch. */
void test_xa_rm_gone_and_tc_killed(void **state) {
  (void)state;
  char acct[ACCT_MAX], xid[RM_XID_MAX];
  PGconn *s = open_with_account(100, acct);
  rm_client_t *c2 = new_client("test_rm_modes_x", NULL, XA_ALONE);
  begin_global("xa_rm_gone", xid);
  int64_t bid = 0;
  assert_int_equal(xa_spend(c2, XA_ALONE, s, xid, acct, 40, true, &bid), 0);
  rm_client_free(c2);
  assert_int_equal(prepared(s, xid, bid), 1); /* it outlives its process */
  commit_ok(xid);
  assert_int_equal(acct_col(s, acct, "balance"), 100);
  tcd_proc_kill(&tcd);
  assert_int_equal(tcd_proc_restart(&tcd), 0);
  rm_client_t *c3 = new_client("test_rm_modes_x", NULL, XA_ALONE);
  assert_int_equal(WAIT_EQ(0, 30, prepared(s, xid, bid)), 0);
  assert_int_equal(acct_col(s, acct, "balance"), 60);
  assert_int_equal(WAIT_EQ(2, 10, fence(s, xid, bid)), 2);
  assert_int_equal(WAIT_EQ(RM_GS_COMMITTED, 20, global_status(xid)), RM_GS_COMMITTED);
  rm_client_free(c3);
}
