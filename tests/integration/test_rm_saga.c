/*
 * test_rm_saga.c - saga steps against a real tcd and PostgreSQL (run in
 * test_rm_modes): the actions in order, a failure compensated newest
 * first with the failed step's compensation empty, an action retried,
 * a rollback before the commit (every compensation empty) and the late
 * action it refuses, duplicates answered from the fence, the coordinator
 * killed in the middle of a step, the only RM of a step's resource gone
 * until a new one comes, a saga with a TCC branch (confirmed after the
 * steps, cancelled with the compensations), two drives of one saga at once
 * (the one whose direction went stale stops), and bad input.
 *
 * The handlers log what they did to saga_log in the resource's own
 * database, inside the fence's transaction: a row there is an action or a
 * compensation that committed.  A step's args are "TAG" or "TAG:fail"
 * (the action fails for good), "TAG:retryN" (asks for a retry N times),
 * "TAG:slow" (waits for the test to let it go), "TAG:flaky" (the first
 * delivery waits for the test, then fails for good; the second waits
 * again, then goes through).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <libpq-fe.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rm_fence.h"
#include "rm_modes_fixture.h"
#include "txp_status.h"

static atomic_int retries_asked, slow_entered, slow_release, flaky_calls, flaky_gate;

/* ------------------------------------------------------------ handlers */

static int log_step(PGconn *pg, const rm_tcc_call_t *call, const char *kind, char *errmsg, size_t errlen) {
  char tag[64] = "";
  if (call->args) sscanf(call->args, "%63[^:]", tag);
  const char *p[3] = {call->xid, tag, kind};
  PGresult *r = PQexecParams(pg, "INSERT INTO saga_log (xid, step, kind) VALUES ($1, $2, $3)", 3, NULL, p, NULL,
                             NULL, 0);
  int rc = PQresultStatus(r) == PGRES_COMMAND_OK ? RM_TCC_OK : RM_TCC_RETRY;
  if (rc != RM_TCC_OK) snprintf(errmsg, errlen, "%s", PQresultErrorMessage(r));
  PQclear(r);
  return rc;
}

static int on_action(const rm_tcc_call_t *call, void *arg, char *errmsg, size_t errlen) {
  (void)arg;
  int rc = log_step(call->pg, call, "action", errmsg, errlen);
  if (rc != RM_TCC_OK) return rc;
  const char *how = call->args ? strchr(call->args, ':') : NULL;
  if (!how) return RM_TCC_OK;
  if (strcmp(how, ":fail") == 0) {
    snprintf(errmsg, errlen, "no seat left on that flight");
    return RM_TCC_FAILED; /* after writing: the write goes with the transaction */
  }
  int n;
  if (sscanf(how, ":retry%d", &n) == 1 && atomic_load(&retries_asked) < n) {
    atomic_fetch_add(&retries_asked, 1);
    snprintf(errmsg, errlen, "the airline is busy");
    return RM_TCC_RETRY;
  }
  if (strcmp(how, ":slow") == 0) {
    atomic_store(&slow_entered, 1);
    for (int i = 0; i < 2000 && !atomic_load(&slow_release); i++) sleep_ms(10);
  }
  if (strcmp(how, ":flaky") == 0) {
    int nth = atomic_fetch_add(&flaky_calls, 1) + 1;
    for (int i = 0; i < 2000 && atomic_load(&flaky_gate) < nth; i++) sleep_ms(10);
    if (nth == 1) {
      snprintf(errmsg, errlen, "no room left (this time)");
      return RM_TCC_FAILED;
    }
  }
  return RM_TCC_OK;
}

static int on_compensate(const rm_tcc_call_t *call, void *arg, char *errmsg, size_t errlen) {
  (void)arg;
  return log_step(call->pg, call, "compensation", errmsg, errlen);
}

const rm_saga_handlers_t saga_handlers = {.action = on_action, .compensate = on_compensate};

/* ------------------------------------------------------------- helpers */

/* What saga_log holds for 'xid', in order: "a+ b+ a-" (+ action, -
 * compensation).  Static buffer. */
static const char *journal(PGconn *pg, const char *xid) {
  static char out[512];
  out[0] = '\0';
  const char *p[1] = {xid};
  PGresult *r = PQexecParams(pg,
                             "SELECT step || CASE kind WHEN 'action' THEN '+' ELSE '-' END FROM saga_log "
                             "WHERE xid = $1 ORDER BY seq", 1, NULL, p, NULL, NULL, 0);
  for (int i = 0; PQresultStatus(r) == PGRES_TUPLES_OK && i < PQntuples(r); i++) {
    size_t o = strlen(out);
    snprintf(out + o, sizeof(out) - o, "%s%s", i ? " " : "", PQgetvalue(r, i, 0));
  }
  PQclear(r);
  return out;
}

/* A saga of a test: its xid and its steps' branch ids, in order. */
typedef struct saga_run {
  char xid[RM_XID_MAX];
  int64_t bid[3];
} saga_run_t;

/* Begin a saga and add one step per args (up to 3), which must succeed. */
static saga_run_t saga(const char *name, const char *const *args, int n) {
  saga_run_t g;
  assert_true(n <= (int)(sizeof(g.bid) / sizeof(g.bid[0])));
  begin_global(name, g.xid);
  for (int i = 0; i < n; i++) assert_int_equal(rm_saga_step(client, g.xid, SAGA_RES, args[i], &g.bid[i]), 0);
  return g;
}

static p2_arg_t step_call(bool action, const char *xid, int64_t bid, const char *args) {
  p2_arg_t a = {.req = {.commit = action, .xid = xid, .branch_id = bid, .resource_id = SAGA_RES,
                        .branch_type = TXP_BT_SAGA, .args = args}};
  phase2_thread(&a);
  return a;
}

/* --------------------------------------------------------------- tests */

/* Three steps: the actions run once each, in order, before rm_tm_commit
 * returns; the fence rows say confirmed. */
void test_saga_forward(void **state) {
  (void)state;
  PGconn *s = itest_pg(stock_url);
  saga_run_t g = saga("saga_forward", (const char *[]){"flight", "hotel", "car"}, 3);
  assert_string_equal(journal(s, g.xid), ""); /* nothing runs before the commit */
  assert_int_equal(commit_ok(g.xid), RM_GS_COMMITTED);
  assert_string_equal(journal(s, g.xid), "flight+ hotel+ car+");
  for (int i = 0; i < 3; i++) assert_int_equal(fence(s, g.xid, g.bid[i]), 2);
  assert_true(g.bid[0] < g.bid[1] && g.bid[1] < g.bid[2]);
  /* A duplicate action (a delivery the coordinator repeats) is answered from the row. */
  p2_arg_t dup = step_call(true, g.xid, g.bid[1], "hotel");
  assert_int_equal(dup.status, TXP_BS_PHASE2_COMMITTED);
  assert_string_equal(journal(s, g.xid), "flight+ hotel+ car+");
  assert_int_equal(WAIT_EQ(RM_GS_COMMITTED, 10, global_status(g.xid)), RM_GS_COMMITTED);
}

/* The second of three actions fails for good: the first is compensated,
 * the failed one and the one never run get empty compensations (no
 * handler), and rm_tm_commit says the saga was compensated. */
void test_saga_compensated(void **state) {
  (void)state;
  PGconn *s = itest_pg(stock_url);
  saga_run_t g = saga("saga_compensated", (const char *[]){"flight", "hotel:fail", "car"}, 3);
  int st = 0;
  int rc = rm_tm_commit(client, g.xid, &st);
  assert_int_equal(rc, RM_E_GLOBAL_NOT_ACTIVE);
  assert_int_equal(st, RM_GS_ROLLBACKED);
  assert_non_null(strstr(rm_errmsg(), "compensated"));
  /* hotel's own action row went with its failed transaction. */
  assert_string_equal(journal(s, g.xid), "flight+ flight-");
  assert_int_equal(fence(s, g.xid, g.bid[0]), 3);
  assert_int_equal(fence(s, g.xid, g.bid[1]), 4);
  assert_int_equal(fence(s, g.xid, g.bid[2]), 4);
  /* The late action of the step never run is refused by its row. */
  p2_arg_t late = step_call(true, g.xid, g.bid[2], "car");
  assert_int_equal(late.status, TXP_BS_PHASE2_COMMIT_FAILED_UNRETRYABLE);
  assert_int_equal(late.code, RM_E_FENCE);
  /* A duplicate compensation is answered from the row. */
  p2_arg_t dup = step_call(false, g.xid, g.bid[0], "flight");
  assert_int_equal(dup.status, TXP_BS_PHASE2_ROLLBACKED);
  assert_string_equal(journal(s, g.xid), "flight+ flight-");
  assert_int_equal(global_status(g.xid), RM_GS_ROLLBACKED);
}

/* An action that asks for retries: rm_tm_commit says the saga goes on,
 * the coordinator retries, the step runs once in the end and the next
 * one after it. */
void test_saga_retried(void **state) {
  (void)state;
  PGconn *s = itest_pg(stock_url);
  atomic_store(&retries_asked, 0);
  saga_run_t g = saga("saga_retried", (const char *[]){"flight:retry2", "hotel"}, 2);
  int st = 0;
  int rc = rm_tm_commit(client, g.xid, &st);
  assert_int_equal(rc, RM_E_COMMIT_PENDING);
  assert_true(st == RM_GS_COMMIT_RETRYING || st == RM_GS_COMMITTING);
  assert_int_equal(WAIT_EQ(RM_GS_COMMITTED, 20, global_status(g.xid)), RM_GS_COMMITTED);
  assert_int_equal(atomic_load(&retries_asked), 2);
  assert_string_equal(journal(s, g.xid), "flight+ hotel+");
}

/* Rolled back before the commit: no action ran, every compensation is
 * empty, and an action delivered late is refused. */
void test_saga_rolled_back_before_commit(void **state) {
  (void)state;
  PGconn *s = itest_pg(stock_url);
  saga_run_t g = saga("saga_rollback", (const char *[]){"flight", "hotel"}, 2);
  assert_int_equal(rollback_ok(g.xid), RM_GS_ROLLBACKED);
  assert_int_equal(fence(s, g.xid, g.bid[0]), 4);
  assert_int_equal(fence(s, g.xid, g.bid[1]), 4);
  p2_arg_t late = step_call(true, g.xid, g.bid[0], "flight");
  assert_int_equal(late.status, TXP_BS_PHASE2_COMMIT_FAILED_UNRETRYABLE);
  assert_int_equal(late.code, RM_E_FENCE);
  assert_string_equal(journal(s, g.xid), "");
  /* No more steps once it is decided (finished: gone from the live table). */
  int64_t bid;
  int rc = rm_saga_step(client, g.xid, SAGA_RES, "car", &bid);
  assert_true(rc == RM_E_GLOBAL_NOT_FOUND || rc == RM_E_GLOBAL_NOT_ACTIVE);
}

typedef struct commit_arg {
  const char *xid;
  int rc, status;
} commit_arg_t;

static void *commit_thread(void *arg) {
  commit_arg_t *a = arg;
  a->rc = rm_tm_commit(client, a->xid, &a->status);
  return NULL;
}

/* The coordinator is killed while the second action runs (it commits
 * after, its answer lost): the restarted one goes on from the store, the
 * second step answered from its fence row, and every action ran once. */
void test_saga_tc_killed_mid_step(void **state) {
  (void)state;
  PGconn *s = itest_pg(stock_url), *t = itest_pg(tc_url);
  atomic_store(&slow_entered, 0);
  atomic_store(&slow_release, 0);
  saga_run_t g = saga("saga_tc_killed", (const char *[]){"flight", "hotel:slow", "car"}, 3);
  commit_arg_t ca = {.xid = g.xid};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, commit_thread, &ca), 0);
  assert_int_equal(WAIT_EQ(1, 10, atomic_load(&slow_entered)), 1);
  /* The steps are in the store, in order, the first one done. */
  char b0[24];
  snprintf(b0, sizeof(b0), "%lld", (long long)g.bid[0]);
  assert_int_equal(q_ll(t, "SELECT status FROM branch_table WHERE xid = $1 AND branch_id = $2", g.xid, b0), 5);
  assert_int_equal(q_ll(t, "SELECT count(*) FROM branch_table WHERE xid = $1 AND branch_type = 2", g.xid, NULL), 3);
  /* ... and tcctl show lists them, in order, with where each one is. */
  char cmd[512], out[8192];
  snprintf(cmd, sizeof(cmd), "'%s/tcctl' --socket '%s' show '%s' 2>&1", getenv("TX_BIN_DIR") ? getenv("TX_BIN_DIR") : ".",
           admin_socket, g.xid);
  FILE *f = popen(cmd, "r");
  assert_non_null(f);
  size_t n = fread(out, 1, sizeof(out) - 1, f);
  out[n] = '\0';
  assert_int_equal(pclose(f), 0);
  const char *steps = strstr(out, "3 saga steps");
  if (!steps) fail_msg("tcctl show has no saga steps:\n%s", out);
  const char *s1 = strstr(steps, "action done"), *s2 = strstr(steps, "waiting");
  assert_non_null(s1);
  assert_non_null(s2);
  assert_true(s1 < s2);
  assert_non_null(strstr(steps, "hotel:slow"));
  tcd_proc_kill(&tcd);
  atomic_store(&slow_release, 1);
  assert_int_equal(WAIT_EQ(2, 10, fence(s, g.xid, g.bid[1])), 2);
  assert_int_equal(tcd_proc_restart(&tcd), 0);
  pthread_join(th, NULL);
  assert_int_equal(WAIT_EQ(RM_GS_COMMITTED, 30, global_status(g.xid)), RM_GS_COMMITTED);
  assert_string_equal(journal(s, g.xid), "flight+ hotel+ car+");
}

void test_saga_bad_input(void **state) {
  (void)state;
  rm_saga_handlers_t half = {.action = on_action};
  assert_int_equal(rm_saga_resource_add(NULL, SAGA_RES, stock_url, &saga_handlers), RM_E_INVALID);
  assert_int_equal(rm_saga_resource_add(client, SAGA_RES, stock_url, &half), RM_E_INVALID);
  assert_int_equal(rm_saga_resource_add(client, SAGA_RES, stock_url, &saga_handlers), RM_E_INVALID); /* twice */
  assert_non_null(strstr(rm_errmsg(), "already"));
  char xid[RM_XID_MAX];
  begin_global("saga_bad", xid);
  int64_t bid = 7;
  assert_int_equal(rm_saga_step(client, NULL, SAGA_RES, "x", &bid), RM_E_INVALID);
  assert_int_equal(bid, 0);
  assert_int_equal(rm_saga_step(client, xid, "", "x", &bid), RM_E_INVALID);
  assert_int_equal(rm_saga_step(client, xid, SAGA_RES, TXP_APP_DATA_PHASE2_SYNC, &bid), RM_E_INVALID);
  char *big = malloc(RM_FENCE_ARGS_MAX + 2);
  memset(big, 'a', RM_FENCE_ARGS_MAX + 1);
  big[RM_FENCE_ARGS_MAX + 1] = '\0';
  assert_int_equal(rm_saga_step(client, xid, SAGA_RES, big, &bid), RM_E_INVALID);
  free(big);
  assert_int_equal(rm_saga_step(client, "127.0.0.1:1:999999", SAGA_RES, "x", &bid), RM_E_GLOBAL_NOT_FOUND);
  rollback_ok(xid);
}

/* The only RM of the step's resource is gone at the commit: the saga
 * waits (the coordinator retries), and goes on when an RM of that
 * resource connects. */
void test_saga_rm_gone(void **state) {
  (void)state;
  PGconn *s = itest_pg(stock_url);
  char xid[RM_XID_MAX];
  int64_t b[2];
  rm_client_t *c2 = new_client_saga("test_rm_modes_b", NULL, NULL, SAGA_ALONE);
  begin_global("saga_rm_gone", xid);
  assert_int_equal(rm_saga_step(client, xid, SAGA_RES, "flight", &b[0]), 0);
  assert_int_equal(rm_saga_step(client, xid, SAGA_ALONE, "visa", &b[1]), 0);
  rm_client_free(c2);
  int st = 0;
  assert_int_equal(rm_tm_commit(client, xid, &st), RM_E_COMMIT_PENDING);
  sleep_ms(300);
  assert_string_equal(journal(s, xid), "flight+"); /* the second step waits for its RM */
  assert_int_not_equal(global_status(xid), RM_GS_COMMITTED);
  rm_client_t *c3 = new_client_saga("test_rm_modes_b", NULL, NULL, SAGA_ALONE);
  assert_int_equal(WAIT_EQ(RM_GS_COMMITTED, 20, global_status(xid)), RM_GS_COMMITTED);
  assert_string_equal(journal(s, xid), "flight+ visa+");
  assert_int_equal(fence(s, xid, b[1]), 2);
  rm_client_free(c3);
}

/* A TCC branch in a saga: confirmed after the steps when they all ran,
 * cancelled with the compensations when one failed. */
void test_saga_with_tcc(void **state) {
  (void)state;
  char acct[ACCT_MAX], xid[RM_XID_MAX];
  PGconn *s = open_with_account(100, acct);
  int64_t sb = 0;
  int64_t tb = begin_and_freeze(s, "saga_tcc_ok", acct, 20, xid);
  assert_int_equal(rm_saga_step(client, xid, SAGA_RES, "flight", &sb), 0);
  assert_int_equal(commit_ok(xid), RM_GS_COMMITTED);
  assert_int_equal(fence(s, xid, tb), 2);
  assert_int_equal(acct_col(s, acct, "balance"), 80);
  assert_string_equal(journal(s, xid), "flight+");

  char xid2[RM_XID_MAX];
  int64_t sb2[2];
  tb = begin_and_freeze(s, "saga_tcc_fail", acct, 30, xid2);
  assert_int_equal(rm_saga_step(client, xid2, SAGA_RES, "flight", &sb2[0]), 0);
  assert_int_equal(rm_saga_step(client, xid2, SAGA_RES, "hotel:fail", &sb2[1]), 0);
  int st = 0;
  assert_int_equal(rm_tm_commit(client, xid2, &st), RM_E_GLOBAL_NOT_ACTIVE);
  assert_int_equal(st, RM_GS_ROLLBACKED);
  assert_int_equal(fence(s, xid2, tb), 3); /* cancelled, never confirmed */
  expect_account(s, acct, 80, 0);
  assert_string_equal(journal(s, xid2), "flight+ flight-");
}

/* Where a finished (or failed) saga ended: its status once it is no
 * longer in phase two, waiting up to 'secs'. */
static int saga_end(const char *xid, int secs) {
  int st = global_status(xid);
  for (int i = 0; i < secs * 50; i++) {
    if (st == RM_GS_COMMITTED || st == RM_GS_ROLLBACKED || st == RM_GS_COMMIT_FAILED || st == RM_GS_ROLLBACK_FAILED)
      break;
    sleep_ms(20);
    st = global_status(xid);
  }
  return st;
}

/* Two drives of one saga at once (model/saga.pml found it): recovery
 * claims the saga when its lease runs out under a slow step, and drives it
 * a second time.  The first drive hears the second action fail for good
 * and turns the saga to its compensations; the second drive's delivery of
 * that action then goes through.  That drive is stale: its outcome is not
 * recorded (sql/tc/011_stale_outcomes.sql) and it stops (tc_phase2.c
 * handle_stored) instead of going on to confirm the TCC branch while the
 * saga is compensated, which left it RollbackFailed with the TCC branch
 * confirmed.  The saga is compensated in full, the TCC branch cancelled. */
void test_saga_two_drives(void **state) {
  (void)state;
  char acct[ACCT_MAX], xid[RM_XID_MAX];
  PGconn *s = open_with_account(100, acct), *t = itest_pg(tc_url);
  atomic_store(&flaky_calls, 0);
  atomic_store(&flaky_gate, 0);
  int64_t sb[2];
  int64_t tb = begin_and_freeze(s, "saga_two_drives", acct, 25, xid);
  assert_int_equal(rm_saga_step(client, xid, SAGA_RES, "flight", &sb[0]), 0);
  assert_int_equal(rm_saga_step(client, xid, SAGA_RES, "hotel:flaky", &sb[1]), 0);
  commit_arg_t ca = {.xid = xid};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, commit_thread, &ca), 0);
  /* The first drive runs hotel's action (waiting, its fence row inserted). */
  assert_int_equal(WAIT_EQ(1, 10, atomic_load(&flaky_calls)), 1);
  /* Its lease runs out: recovery drives the saga again, and that drive's
   * delivery of hotel's action waits on the first one's fence row. */
  assert_true(q_ll(t, "UPDATE global_table SET next_retry_at = clock_timestamp() WHERE xid = $1 RETURNING 1", xid,
                   NULL) == 1);
  assert_int_equal(WAIT_EQ(1, 10, q_ll(s, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                                          "AND query LIKE 'INSERT INTO branch_fence%'", NULL, NULL)), 1);
  /* The first delivery fails for good: the saga turns to its
   * compensations; the second delivery runs the action (and waits). */
  atomic_store(&flaky_gate, 1);
  assert_int_equal(WAIT_EQ(2, 10, atomic_load(&flaky_calls)), 2);
  assert_int_equal(WAIT_EQ(1, 10, q_ll(t, "SELECT (status IN (4, 5))::int FROM global_table WHERE xid = $1", xid,
                                       NULL)), 1);
  /* It goes through: hotel's action is in, its compensation comes. */
  atomic_store(&flaky_gate, 2);
  assert_int_equal(saga_end(xid, 30), RM_GS_ROLLBACKED);
  pthread_join(th, NULL);
  assert_int_equal(fence(s, xid, tb), 3); /* cancelled, never confirmed */
  expect_account(s, acct, 100, 0);
  assert_int_equal(fence(s, xid, sb[0]), 3);
  assert_int_equal(fence(s, xid, sb[1]), 3);
  assert_string_equal(journal(s, xid), "flight+ hotel+ hotel- flight-");
}
