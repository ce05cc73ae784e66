/*
 * tc_phase2.c - phase two: tell each branch of a decided global transaction
 * to commit or roll back, and record each outcome.
 *
 * NOTES
 *   Commit (AT): every unfinished branch at once; an acknowledged branch is
 *   recorded PhaseTwoCommitted.  Rollback: one branch at a time, newest
 *   first (reverse registration order, as the undo logs must be replayed),
 *   stopping at the first failure.
 *
 *   Each outcome goes through the store (tc_phase2_batch), which also
 *   decides what happens to the global transaction: finished and moved to
 *   history when nothing is left, *Retrying with a backoff after a
 *   retryable failure, *Failed (locks kept, for an operator) after an
 *   unretryable one such as a dirty write.  This module keeps no state that
 *   recovery needs: if the node dies mid-way, the session's retry lease
 *   expires and the leader drives it again.  Branch operations are
 *   idempotent at the RM, so driving a branch twice is harmless.
 *
 *   The number of drives in progress is bounded; past the bound a session is
 *   left to the recovery job (it is durable, only later).
 *
 *   Commit notices.  An AT commit whose branches have no commit work is
 *   finished by the store in its decision's transaction (sql/tc/010): its
 *   branches are only told (tc__phase2_notify), in one-way frames that the
 *   RMs do not answer (a relayed one is a call through the bus).  They
 *   need no drive and no record: a lost notice leaves an undo row that its
 *   RM's resolve pass deletes.
 *
 *   Sagas.  A global with SAGA steps commits one branch at a time, in
 *   registration order: the steps first (each call carries the step's
 *   args, read from the store just before it: they are not kept in the
 *   rows), then its other branches; a retryable failure stops the drive
 *   until the backoff is over, as a rollback does.  An action that fails
 *   for good turns the global to Rollbacking in the store op that records
 *   it (sql/tc/009_saga.sql, TC_RES_COMPENSATE), and this drive hands its
 *   rows, with the outcomes it recorded, to a rollback drive: the
 *   compensations, newest first, of every step, the one that failed
 *   included (the RM's fence makes that one an empty compensation when
 *   its action left nothing).  A step whose action ran (PhaseTwoCommitted)
 *   is not finished for a rollback.  A TM waiting for the commit is
 *   answered when that rollback ends.
 *
 *   Two drives of one global may run at once (recovery claims a global
 *   whose lease ran out under a slow drive, or a paused node's).  Of one
 *   direction they are harmless, but a saga turns: the drive that did not
 *   hear the failure is then a commit drive of a global being compensated.
 *   The store does not record its outcomes (sql/tc/011_stale_outcomes.sql)
 *   and answers with the global's status; a drive that sees the global in
 *   the other direction stops (model/saga.pml found both: a TCC branch
 *   confirmed by the stale drive while the saga was compensated, and a
 *   refused action that failed the rollback).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tc_log.h"
#include "txc_failpoint.h"
#include "tc_phase2.h"
#include "tc_server.h"
#include "tc_store_read.h"

#define MAX_ACTIVE_DRIVES 20000
#define BRANCH_CALL_TIMEOUT_MS 10000
#define BRANCH_DATA_READ_MS 5000

const double tc_phase2_bounds[TC_PHASE2_BUCKETS] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                                    0.25,  0.5,    1,     2.5,  5,     10,   30};

/* Count one drive of 'ns' nanoseconds in the histogram. */
static void observe(tc_node_stats_t *s, bool commit, uint64_t ns) {
  int k = commit ? 0 : 1;
  tc_hist_observe(s->phase2_bucket[k], &s->phase2_count[k], &s->phase2_seconds[k], (double)ns / 1e9);
}

typedef struct drive drive_t;

typedef struct branch_ctx {
  drive_t *d;
  tc_branch_row_t row;
  tc_op_t op;
  int answer; /* commit: the branch status the RM answered */
  char *args;  /* a saga step's (malloc'd), read before its call */
  char error[512];
} branch_ctx_t;

struct drive {
  tc_ctx_t *ctx;
  char xid[TXP_MAX_XID_LEN + 1];
  bool commit;
  int global_status;
  branch_ctx_t *branches; /* in driving order */
  int n, next, pending;
  int calls_pending;      /* commit: RM answers still awaited */
  tc_op_t all_op;         /* commit: "every branch committed", one store op */
  bool stopped;
  bool sequential;        /* commit one branch at a time (a saga) */
  bool compensate;        /* a saga's action failed for good: roll back */
  tc_branch_row_t *rows;  /* every row, outcomes applied (a saga's, for the rollback) */
  int nrows;
  uint64_t started_ns;
  void (*done)(int, void *);
  void *done_arg;
};

static void branch_call(drive_t *d, branch_ctx_t *b);

static void drive_finish(drive_t *d) {
  tc_ctx_t *ctx = d->ctx;
  ctx->stats.phase2_active--;
  observe(&ctx->stats, d->commit, uv_hrtime() - d->started_ns);
  if (d->compensate) {
    /* The saga rolls back now, from the outcomes recorded so far; the TM
     * (if one waits) hears that rollback's end. */
    tc_log_ctx_t lc = {d->xid, 0, NULL};
    TC_LOG(TC_LOG_INFO, &lc, "saga step failed for good: compensating");
    tc__phase2_drive(ctx, d->xid, d->global_status, d->rows, d->nrows, d->done, d->done_arg);
  } else if (d->done) {
    d->done(d->global_status, d->done_arg);
  }
  for (int i = 0; i < d->n; i++) {
    tc_op_clear(&d->branches[i].op);
    free(d->branches[i].args);
  }
  tc_op_clear(&d->all_op);
  free(d->branches);
  free(d->rows);
  free(d);
}

/* Keep the drive's copy of the rows in step with a recorded outcome. */
static void row_recorded(drive_t *d, int64_t branch_id, int status) {
  for (int i = 0; i < d->nrows; i++)
    if (d->rows[i].branch_id == branch_id) d->rows[i].status = status;
}

/* A stored outcome ('b' is NULL for the all-committed op): update the
 * drive and continue or finish it.  'units' is how many branch units the
 * op settled. */
static void handle_stored(drive_t *d, tc_op_t *op, branch_ctx_t *b, int units) {
  tc_ctx_t *ctx = d->ctx;
  tc_log_ctx_t lc = {d->xid, b ? b->row.branch_id : 0, NULL};
  d->pending -= units;
  if (op->status != 0) {
    /* The outcome is not recorded: recovery will drive this branch again. */
    TC_LOG(TC_LOG_WARN, &lc, "could not record phase-two outcome: %s; recovery will retry", op->errmsg);
    d->stopped = true;
  } else {
    if (op->global_status) d->global_status = op->global_status;
    if (b) row_recorded(d, b->row.branch_id, b->op.branch_status);
    if (op->res == TC_RES_COMPENSATE) {
      d->compensate = true;
      d->stopped = true;
    } else if (op->finished) {
      if (txp_global_status_is_rollback(op->global_status)) tc_ctx_release_locks(ctx, d->xid);
    } else if (op->global_status && txp_global_status_is_commit(op->global_status) != d->commit) {
      /* Another drive of this saga turned it to its compensations: this
       * drive's direction is stale (its outcome was not recorded:
       * sql/tc/011_stale_outcomes.sql); the compensating drive goes on. */
      TC_LOG(TC_LOG_INFO, &lc, "the global transaction is %s now: this %s drive stops",
             txp_global_status_name(op->global_status), d->commit ? "commit" : "rollback");
      d->stopped = true;
    } else if (op->res == TC_RES_FAILED) {
      if (txp_global_status_is_commit(op->global_status)) ctx->stats.commit_failed++;
      else ctx->stats.rollback_failed++;
      TC_LOG(TC_LOG_ERROR, &lc,
             "global transaction is %s: branch on \"%s\" failed for good: %s; "
             "repair the data, then re-drive it with tcctl",
             txp_global_status_name(op->global_status), b ? b->row.resource_id : "?",
             b ? b->error : "?");
      d->stopped = true;
    } else if (op->res == TC_RES_RETRY) {
      d->stopped = d->stopped || !d->commit || d->sequential;
    } else if (op->res == TC_RES_NOT_FOUND) {
      d->stopped = true; /* finished elsewhere (another node, or a duplicate) */
    }
  }
  if ((!d->commit || d->sequential) && !d->stopped && d->next < d->n) {
    branch_call(d, &d->branches[d->next++]);
    return;
  }
  if (d->pending == 0 && (d->stopped || d->next >= d->n)) drive_finish(d);
}

static void on_outcome_stored(tc_op_t *op, void *arg) {
  branch_ctx_t *b = arg;
  handle_stored(b->d, op, b, 1);
}

static void on_all_stored(tc_op_t *op, void *arg) {
  drive_t *d = arg;
  handle_stored(d, op, NULL, d->n);
}

static void store_outcome(drive_t *d, branch_ctx_t *b, int branch_status) {
  tc_ctx_t *ctx = d->ctx;
  b->op.kind = TC_OP_PHASE2;
  b->op.cb = on_outcome_stored;
  b->op.arg = b;
  b->op.xid = d->xid;
  b->op.id = b->row.branch_id;
  b->op.branch_status = branch_status;
  b->op.error = b->error[0] ? b->error : NULL;
  if (tc_store_submit(ctx->store, &b->op) != 0) {
    /* Queue full: leave it to recovery (the lease expires, it retries). */
    d->pending--;
    d->stopped = true;
    if (d->pending == 0) drive_finish(d);
  }
}

/* Commit, every RM acknowledged: one store op for the whole transaction. */
static void store_all_committed(drive_t *d) {
  tc_op_t *op = &d->all_op;
  op->kind = TC_OP_PHASE2;
  op->cb = on_all_stored;
  op->arg = d;
  op->xid = d->xid;
  op->id = 0; /* every branch */
  op->branch_status = TXP_BS_PHASE2_COMMITTED;
  op->error = NULL;
  /* Clean-up, unless a TM waits for this drive (a commit with give-backs,
   * TXP_APP_DATA_PHASE2_SYNC): then no waiting for a fuller batch. */
  op->lazy = !d->done;
  if (tc_store_submit(d->ctx->store, op) != 0) {
    d->pending -= d->n;
    d->stopped = true;
    if (d->pending == 0) drive_finish(d);
  }
}

/* Commit: record the answers once all are in (the common all-committed
 * case as one op; otherwise each branch's outcome). */
static void commit_answer(drive_t *d, branch_ctx_t *b, int bs) {
  b->answer = bs;
  if (--d->calls_pending > 0) return;
  bool all_ok = true;
  for (int i = 0; i < d->n; i++) all_ok = all_ok && d->branches[i].answer == TXP_BS_PHASE2_COMMITTED;
  if (all_ok) {
    TXC_FAILPOINT("tc.phase2.after_acks");
    store_all_committed(d);
    return;
  }
  d->pending++; /* guard: a synchronous failure must not free 'd' under the loop */
  for (int i = 0; i < d->n; i++) store_outcome(d, &d->branches[i], d->branches[i].answer);
  if (--d->pending == 0) drive_finish(d);
}

static void on_branch_result(int status, const txp_msg_t *res, void *arg) {
  branch_ctx_t *b = arg;
  drive_t *d = b->d;
  tc_ctx_t *ctx = d->ctx;
  int ok_status = d->commit ? TXP_BS_PHASE2_COMMITTED : TXP_BS_PHASE2_ROLLBACKED;
  int retry_status = d->commit ? TXP_BS_PHASE2_COMMIT_FAILED_RETRYABLE : TXP_BS_PHASE2_ROLLBACK_FAILED_RETRYABLE;
  int fail_status = d->commit ? TXP_BS_PHASE2_COMMIT_FAILED_UNRETRYABLE : TXP_BS_PHASE2_ROLLBACK_FAILED_UNRETRYABLE;
  int bs;
  if (status != 0) {
    snprintf(b->error, sizeof(b->error), "%s", txp_strerror(status));
    bs = retry_status;
  } else if (res->code == 0) {
    bs = txp_msg_has(res, TXP_F_BRANCH_STATUS) && res->branch_status ? (int)res->branch_status : ok_status;
    if (bs != ok_status) {
      snprintf(b->error, sizeof(b->error), "resource manager answered %s", txp_branch_status_name(bs));
      if (bs != retry_status && bs != fail_status) bs = retry_status;
    }
  } else {
    snprintf(b->error, sizeof(b->error), "%s: %s", txp_errname((int)res->code),
             res->message ? res->message : txp_strerror((int)res->code));
    /* The RM's own code may be any (a TCC handler's, RM_E_FENCE): the
     * branch status it sends with it says whether a retry can help. */
    bool unretryable = res->code == TXP_EDIRTY_WRITE || res->code == TXP_EBRANCH_UNRETRYABLE ||
                       (txp_msg_has(res, TXP_F_BRANCH_STATUS) && (int)res->branch_status == fail_status);
    bs = unretryable ? fail_status : retry_status;
  }
  if (bs == retry_status) ctx->stats.phase2_retryable++;
  if (bs == fail_status) ctx->stats.phase2_unretryable++;
  if (d->commit && !d->sequential) commit_answer(d, b, bs);
  else store_outcome(d, b, bs);
}

static void call_rm(drive_t *d, branch_ctx_t *b);

/* A saga step's args are in the store: read them, then call. */
static void on_step_args(int status, const char *err, const char *data, void *arg) {
  branch_ctx_t *b = arg;
  drive_t *d = b->d;
  if (status != 0) {
    /* Retried like an RM that cannot be reached. */
    snprintf(b->error, sizeof(b->error), "could not read the saga step's args from the store: %s",
             err && err[0] ? err : "store unreachable");
    store_outcome(d, b, d->commit ? TXP_BS_PHASE2_COMMIT_FAILED_RETRYABLE : TXP_BS_PHASE2_ROLLBACK_FAILED_RETRYABLE);
    return;
  }
  if (data && !(b->args = strdup(data))) {
    snprintf(b->error, sizeof(b->error), "out of memory");
    store_outcome(d, b, d->commit ? TXP_BS_PHASE2_COMMIT_FAILED_RETRYABLE : TXP_BS_PHASE2_ROLLBACK_FAILED_RETRYABLE);
    return;
  }
  call_rm(d, b);
}

static void branch_call(drive_t *d, branch_ctx_t *b) {
  tc_ctx_t *ctx = d->ctx;
  d->pending++;
  if (b->row.branch_type == TXP_BT_SAGA && !b->args) {
    int rc = tc_read_branch_data(ctx->store, d->xid, b->row.branch_id, BRANCH_DATA_READ_MS, on_step_args, b);
    if (rc != 0) on_step_args(rc, "the store's reader queue is full", NULL, b);
    return;
  }
  call_rm(d, b);
}

static void call_rm(drive_t *d, branch_ctx_t *b) {
  tc_ctx_t *ctx = d->ctx;
  ctx->stats.phase2_calls++;
  txp_msg_t m;
  txp_msg_init(&m, d->commit ? TXP_MSG_BRANCH_COMMIT : TXP_MSG_BRANCH_ROLLBACK);
  txp_msg_set_str(&m, TXP_F_XID, d->xid);
  txp_msg_set_int(&m, TXP_F_BRANCH_ID, b->row.branch_id);
  txp_msg_set_str(&m, TXP_F_RESOURCE_ID, b->row.resource_id);
  txp_msg_set_int(&m, TXP_F_BRANCH_TYPE, b->row.branch_type);
  if (b->args) txp_msg_set_str(&m, TXP_F_APP_DATA, b->args);
  tc_conn_t *conn = tc_server_find_branch_rm(ctx->server, b->row.resource_id, b->row.client_id,
                                             b->row.application_id, b->row.app_group);
  if (!conn) {
    /* Cluster: a peer that holds such an RM relays the call (its answer
     * comes back through on_branch_result like a direct one). */
    if (ctx->ops->forward(ctx, &m, b->row.client_id, BRANCH_CALL_TIMEOUT_MS, on_branch_result, b) == 0)
      return;
    ctx->stats.phase2_no_rm++;
    snprintf(b->error, sizeof(b->error), "no resource manager connected for resource \"%s\"",
             b->row.resource_id);
    if (d->commit && !d->sequential) commit_answer(d, b, TXP_BS_PHASE2_COMMIT_FAILED_RETRYABLE);
    else store_outcome(d, b, TXP_BS_PHASE2_ROLLBACK_FAILED_RETRYABLE);
    return;
  }
  int rc = tc_conn_call(conn, &m, BRANCH_CALL_TIMEOUT_MS, on_branch_result, b);
  if (rc != 0) on_branch_result(rc, NULL, b);
}

/* Whether phase two has nothing left to do on 'row': a saga step whose
 * action ran still has its compensation to run in a rollback. */
static bool branch_finished(bool commit, const tc_branch_row_t *row) {
  if (row->status == TXP_BS_PHASE2_ROLLBACKED) return true;
  return row->status == TXP_BS_PHASE2_COMMITTED && (commit || row->branch_type != TXP_BT_SAGA);
}

void tc__phase2_drive(tc_ctx_t *ctx, const char *xid, int global_status,
                      const tc_branch_row_t *rows, int nrows, void (*done)(int, void *), void *arg) {
  bool commit = txp_global_status_is_commit(global_status);
  if (ctx->stats.phase2_active >= MAX_ACTIVE_DRIVES || ctx->stopping) {
    if (done) done(global_status, arg);
    return; /* durable: recovery drives it when the lease expires */
  }
  bool saga = false;
  for (int i = 0; i < nrows; i++) saga = saga || rows[i].branch_type == TXP_BT_SAGA;
  drive_t *d = calloc(1, sizeof(*d));
  if (d && nrows > 0) d->branches = calloc((size_t)nrows, sizeof(branch_ctx_t));
  if (d && saga) d->rows = malloc((size_t)nrows * sizeof(tc_branch_row_t));
  if (!d || (nrows > 0 && !d->branches) || (saga && !d->rows)) {
    if (d) free(d->branches);
    free(d);
    if (done) done(global_status, arg);
    return;
  }
  d->ctx = ctx;
  d->started_ns = uv_hrtime();
  snprintf(d->xid, sizeof(d->xid), "%s", xid);
  d->commit = commit;
  d->global_status = global_status;
  d->done = done;
  d->done_arg = arg;
  d->sequential = commit && saga;
  if (saga) {
    memcpy(d->rows, rows, (size_t)nrows * sizeof(tc_branch_row_t));
    d->nrows = nrows;
  }
  /* Driving order: commit in any order (all at once), rollback newest
   * first; a saga's commit: its steps in order, then the rest.  Branches
   * already finished are skipped, except that one is kept when all are:
   * recording it again lets the store finish the session. */
  int last_finished = -1;
  for (int pass = 0; pass < (d->sequential ? 2 : 1); pass++) {
    for (int k = 0; k < nrows; k++) {
      int i = commit ? k : nrows - 1 - k;
      if (d->sequential && (rows[i].branch_type == TXP_BT_SAGA) != (pass == 0)) continue;
      if (branch_finished(commit, &rows[i])) {
        last_finished = i;
        continue;
      }
      branch_ctx_t *b = &d->branches[d->n++];
      b->d = d;
      b->row = rows[i];
    }
  }
  ctx->stats.phase2_active++;
  if (d->n == 0) {
    if (last_finished < 0) {
      drive_finish(d);
      return;
    }
    branch_ctx_t *b = &d->branches[d->n++];
    b->d = d;
    b->row = rows[last_finished];
    d->pending++;
    store_outcome(d, b, rows[last_finished].status);
    d->next = d->n;
    return;
  }
  if (commit && !d->sequential) {
    /* Hold an extra count while starting the calls: a call that fails at
     * once must not finish (and free) the drive under this loop. */
    d->next = d->n;
    d->pending++;
    d->calls_pending = d->n;
    for (int i = 0; i < d->n; i++) branch_call(d, &d->branches[i]);
    if (--d->pending == 0) drive_finish(d);
  } else {
    branch_call(d, &d->branches[d->next++]);
  }
}

/* ------------------------------------------------------------- notices */

/* Relayed notices in flight at most (a branch whose RM is connected to
 * another node only: the bus relays a call, whose answer comes back);
 * past it a notice is dropped: the RM's resolve pass deletes the row. */
#define MAX_RELAYED_NOTICES 10000

typedef struct notice {
  tc_ctx_t *ctx;
  int64_t branch_id;
  char xid[TXP_MAX_XID_LEN + 1];
} notice_t;

static void on_relayed_notice(int status, const txp_msg_t *res, void *arg) {
  notice_t *n = arg;
  tc_ctx_t *ctx = n->ctx;
  ctx->stats.phase2_notices_active--;
  if (status != 0 || res->code != 0) {
    tc_log_ctx_t lc = {n->xid, n->branch_id, NULL};
    TC_LOG(TC_LOG_DEBUG, &lc, "relayed commit notice failed (%s): the resource manager deletes the undo row "
           "in its resolve pass", status != 0 ? txp_strerror(status) : txp_errname((int)res->code));
  }
  free(n);
}

void tc__phase2_notify(tc_ctx_t *ctx, const char *xid, const tc_branch_row_t *branches, int nbranches) {
  for (int i = 0; i < nbranches && !ctx->stopping; i++) {
    const tc_branch_row_t *row = &branches[i];
    txp_msg_t m;
    txp_msg_init(&m, TXP_MSG_BRANCH_COMMIT);
    txp_msg_set_str(&m, TXP_F_XID, xid);
    txp_msg_set_int(&m, TXP_F_BRANCH_ID, row->branch_id);
    txp_msg_set_str(&m, TXP_F_RESOURCE_ID, row->resource_id);
    txp_msg_set_int(&m, TXP_F_BRANCH_TYPE, row->branch_type);
    ctx->stats.phase2_calls++;
    tc_conn_t *conn = tc_server_find_branch_rm(ctx->server, row->resource_id, row->client_id, row->application_id,
                                               row->app_group);
    if (conn) {
      /* One way: the RM answers nothing, and tcd reads nothing back. */
      (void)tc_conn_send_oneway(conn, &m); /* not sent: the RM's resolve pass */
      continue;
    }
    notice_t *n = ctx->stats.phase2_notices_active < MAX_RELAYED_NOTICES ? malloc(sizeof(*n)) : NULL;
    if (!n) continue;
    n->ctx = ctx;
    n->branch_id = row->branch_id;
    snprintf(n->xid, sizeof(n->xid), "%s", xid);
    ctx->stats.phase2_notices_active++;
    if (ctx->ops->forward(ctx, &m, row->client_id, BRANCH_CALL_TIMEOUT_MS, on_relayed_notice, n) != 0) {
      ctx->stats.phase2_no_rm++;
      ctx->stats.phase2_notices_active--;
      free(n);
    }
  }
}
