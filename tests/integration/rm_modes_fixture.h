/*
 * rm_modes_fixture.h - what the TCC, saga and XA tests share (test_rm_modes.c
 * defines it; test_rm_tcc.c and test_rm_xa.c run in the same program).
 */
#ifndef RM_MODES_FIXTURE_H
#define RM_MODES_FIXTURE_H

#include <libpq-fe.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "itest_pg.h"
#include "rm_at_int.h"
#include "rm_client.h"
#include "rm_internal.h"
#include "rm_itest.h"
#include "tcd_proc.h"

#define TOKEN "rm-modes-test-token"
#define RES "wallet"           /* the TCC resource of the main client, on the stock database */
#define RES_ALONE "wallet_b"   /* one only the short-lived clients serve */
#define XA_RES "ledger"        /* the XA resource of the main client, on the stock database */
#define XA_ALONE "ledger_b"    /* one only the short-lived clients serve */
#define SAGA_RES "trip"        /* the saga resource of the main client, on the stock database */
#define SAGA_ALONE "trip_b"    /* one only the short-lived clients serve */

extern const char *stock_url, *orders_url, *tc_url;
extern tcd_proc_t tcd;
extern rm_client_t *client;
extern char admin_socket[108]; /* tcd's admin socket (TC_ADMIN_SOCKET) */

/* What the TCC handlers did, and what a test asks of them. */
extern atomic_int confirms, cancels;
extern atomic_int confirm_retries_left; /* confirm writes, then asks for a retry, this many times */
extern atomic_int confirm_fail;         /* confirm fails for good */
extern atomic_int confirm_breaks_txn;   /* confirm leaves a failed statement and says OK */
extern const rm_tcc_handlers_t tcc_handlers;
int on_confirm(const rm_tcc_call_t *call, void *arg, char *errmsg, size_t errlen);
int on_cancel(const rm_tcc_call_t *call, void *arg, char *errmsg, size_t errlen);

/* First value of a query with up to 2 parameters; LLONG_MIN: no row or
 * NULL; LLONG_MIN + 1: error. */
long long q_ll(PGconn *pg, const char *sql, const char *p1, const char *p2);
/* The fence row's status (LLONG_MIN: none). */
long long fence(PGconn *pg, const char *xid, int64_t bid);
long long acct_col(PGconn *pg, const char *acct, const char *col);
/* A new account with 'balance'; its id in 'out'. */
void new_account(PGconn *pg, int balance, char *out, size_t cap);
/* The stock database for the running case (itest_pg) with a new account
 * of 'balance' there: its id in 'acct' (ACCT_MAX). */
#define ACCT_MAX 32
PGconn *open_with_account(int balance, char *acct);
/* The account's balance and frozen amount are these (a failure names the
 * caller's line). */
#define expect_account(pg, acct, balance, frozen) expect_account_at(pg, acct, balance, frozen, __FILE__, __LINE__)
void expect_account_at(PGconn *pg, const char *acct, long long balance, long long frozen, const char *file, int line);
/* rm_tm_begin on the group's client, which must succeed: its xid in 'xid'
 * (RM_XID_MAX). */
void begin_global(const char *name, char *xid);
/* rm_tm_commit and rm_tm_rollback on the group's client, which must
 * succeed: the global status they answer. */
int commit_ok(const char *xid);
int rollback_ok(const char *xid);
/* The global status of 'xid' from the TC, or the rm_tm_status code. */
int global_status(const char *xid);
/* The TCC try: BEGIN, rm_tcc_try, the freeze; COMMIT if 'commit'.  0 or
 * the first failing code (the transaction then rolled back). */
int try_freeze(rm_client_t *c, const char *res, PGconn *pg, const char *xid, const char *acct, int amount,
               bool commit, int64_t *bid);
/* A global begun ('name') with a committed try of the main client
 * freezing 'amount' of 'acct', both of which must succeed: the branch. */
int64_t begin_and_freeze(PGconn *pg, const char *name, const char *acct, int amount, char *xid);
/* A client serving the TCC resource 'tcc_res' and the XA resource
 * 'xa_res' (either may be NULL) on the stock database, connected. */
rm_client_t *new_client(const char *app, const char *tcc_res, const char *xa_res);
/* The same with the saga resource 'saga_res' too (may be NULL). */
rm_client_t *new_client_saga(const char *app, const char *tcc_res, const char *xa_res, const char *saga_res);
/* An AT branch on orders: tcc_order row 'k' set to 'v' (created 'NEW'). */
int at_set(const char *xid, const char *k, const char *v);
/* tcc_order's value of 'k' is 'want' (the row exists). */
void expect_order(const char *k, const char *want);

/* An rm_tm_rollback of 'xid' and its outcome. */
typedef struct rb_arg {
  const char *xid;
  int rc, status;
} rb_arg_t;
/* The rollback of 'xid' begun on a thread of its own, for a test that acts
 * while it waits; rollback_join waits for its end (and frees it). */
struct rollback_run *rollback_start(const char *xid);
void rollback_join(struct rollback_run *run);

/* A branch of a mode run by the test (try_freeze, the XA tests' xa_spend):
 * 'finish' commits or prepares it. */
typedef int (*branch_fn)(rm_client_t *c, const char *res, PGconn *pg, const char *xid, const char *acct, int amount,
                         bool finish, int64_t *bid);
/* The library's hook after a branch's registration (rm__tcc_..., rm__xa_...). */
typedef void (*after_register_fn)(const char *xid, int64_t bid, void *arg);
/* 'branch' of the main client with the global rolled back between its
 * registration and its fence row, through the mode's hook ('hook', its
 * argument 'hook_arg'); the rollback must go through.  The branch's code. */
int branch_with_rollback_at_registration(after_register_fn *hook, void **hook_arg, branch_fn branch, const char *res,
                                         PGconn *pg, const char *xid, const char *acct, int amount, int64_t *bid);

/* A phase-two request ('commit' or not) for branch 'bid' of 'xid' on
 * resource 'res', of type 'branch_type' (TXP_BT_*). */
rm_phase2_req_t phase2_req(bool commit, const char *xid, int64_t bid, const char *res, int branch_type);

/* rm__at_phase2 on a thread. */
typedef struct p2_arg {
  rm_phase2_req_t req;
  int status, code;
} p2_arg_t;
void *phase2_thread(void *arg);
/* 'req' delivered to the main client's RM twice at once (a duplicate phase
 * two from two threads): each delivery's answer in 'out'. */
void phase2_twice_at_once(rm_phase2_req_t req, p2_arg_t out[2]);

/* test_rm_tcc.c */
void test_commit_and_rollback(void **state);
void test_cancel_before_try(void **state);
void test_cancel_meets_uncommitted_try(void **state);
void test_duplicate_phase2(void **state);
void test_handler_failures(void **state);
void test_mixed_at_and_tcc(void **state);
void test_rm_gone_between_try_and_confirm(void **state);
void test_sweep(void **state);
void test_bad_input(void **state);
void test_tc_killed_after_decision(void **state);

/* test_rm_saga.c */
extern const rm_saga_handlers_t saga_handlers;
void test_saga_forward(void **state);
void test_saga_compensated(void **state);
void test_saga_retried(void **state);
void test_saga_rolled_back_before_commit(void **state);
void test_saga_tc_killed_mid_step(void **state);
void test_saga_bad_input(void **state);
void test_saga_rm_gone(void **state);
void test_saga_with_tcc(void **state);
void test_saga_two_drives(void **state);

/* test_rm_xa.c */
void test_xa_commit_and_rollback(void **state);
void test_xa_rollback_before_start(void **state);
void test_xa_rollback_meets_open_branch(void **state);
void test_xa_duplicates(void **state);
void test_xa_mixed_at_tcc_xa(void **state);
void test_xa_bad_input(void **state);
void test_xa_rm_gone_and_tc_killed(void **state);

#endif
