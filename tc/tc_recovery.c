/*
 * tc_recovery.c - the leader's background work: time out Begin sessions,
 * retry unfinished phase two, prune history.
 *
 * NOTES
 *   Leadership is a PostgreSQL advisory lock (recovery.leader_lock_key)
 *   held by a dedicated connection of this node (tc_read_conn_t).  When the node dies, its
 *   session ends, the lock is free, and the next node to ask becomes the
 *   leader within one recovery interval.  No home-made consensus: the lock
 *   only avoids duplicated work.  Correctness never depends on it, because
 *   every change the jobs make is a compare-and-set in the store (a decision
 *   is taken only from Begin; phase-two outcomes are idempotent), so an old
 *   leader that wakes up late can only repeat what is already decided.
 *
 *   The lease (cluster.leader_lease_ms): a session-level advisory lock
 *   outlives a paused process (SIGSTOP, a stuck loop), so the lock alone
 *   would let a frozen leader keep the jobs forever.  A node asks with
 *   tc_leader_try() (sql/tc/003_cluster.sql), which also terminates the
 *   leader connection of a holder whose node has written no heartbeat for
 *   the lease; the next attempt of a healthy node then takes the lock.
 *   The leader confirms on its own connection that it still holds the lock
 *   before each round of jobs, so a leader that wakes up after being fenced
 *   learns it from the dead connection instead of running a round.  A node
 *   asks only while its own membership is healthy (heartbeats written).
 *
 *   Jobs, each at most one run at a time:
 *     timeouts  Begin sessions past their deadline -> TimeoutRollbacking,
 *               then phase two (rollback);
 *     retries   sessions mid-phase-two whose lease expired (a dead node's,
 *               or due for a backoff retry) are claimed with SKIP LOCKED
 *               and driven again;
 *     history   rows older than recovery.history_days are deleted;
 *     orphans   sessions whose first phase-two drive belonged to a node
 *               that is gone (its node lock is free) are made due at once,
 *               instead of when that node's decide lease runs out.
 *   Each job is one named read of tc_store_read.h (tc_read_timeouts,
 *   tc_read_claim_retries, tc_read_prune_history, tc_read_adopt_orphans)
 *   on the store's reader connections; the SQL is there.
 */
#include "tc_recovery.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tc_log.h"
#include "tc_parts.h"
#include "tc_ctx.h"
#include "tc_phase2.h"
#include "tc_store_read.h"

#define CLAIM_LIMIT 256
#define CLAIM_LEASE_MS 12000
#define TIMEOUT_LIMIT 256
#define HISTORY_EVERY_MS 60000
#define READ_DEADLINE_MS 5000   /* a job's wait for a reader connection */
#define LEADER_DEADLINE_MS 2000 /* a question's wait for the leader connection */

struct tc_recovery {
  tc_ctx_t *ctx;
  tc_read_conn_t *leader_conn; /* the session that holds the leader lock */
  uv_timer_t tick;
  bool leader;
  bool asking;
  bool timeouts_running, retries_running, history_running, orphans_running;
  bool confirming; /* the leader checks that it still holds the lock */
  bool fence_warned;
  uint64_t last_history_ns;
  int reads; /* store reads in flight: close waits for them */
  bool closing;
  tc_parts_t close; /* the tick, the leader session and the reads in flight */
  tc_recovery_stats_t stats;
};

typedef struct timeout_call {
  tc_ctx_t *ctx; /* not the recovery object: this may outlive it */
  tc_op_t op;
  char xid[TXP_MAX_XID_LEN + 1];
} timeout_call_t;

/* ------------------------------------------------------------- timeouts */

static void on_timeout_decided(tc_op_t *op, void *arg) {
  timeout_call_t *t = arg;
  tc_ctx_t *ctx = t->ctx;
  if (op->status == 0 && op->res == TC_RES_OK && !ctx->stopping) {
    ctx->stats.timed_out++;
    tc_log_ctx_t lc = {t->xid, 0, NULL};
    TC_LOG(TC_LOG_INFO, &lc, "global transaction timed out: rolling back");
    tc_ctx_release_locks(ctx, t->xid);
    if (!txp_global_status_final(op->global_status))
      tc__phase2_drive(ctx, t->xid, op->global_status, op->branches, op->nbranches, NULL, NULL);
  }
  tc_op_clear(op);
  free(t);
}

static bool read_done(tc_recovery_t *rec);

static void on_timeouts_found(int status, const char *err, const char *const *xids, int n, void *arg) {
  tc_recovery_t *rec = arg;
  rec->timeouts_running = false;
  if (read_done(rec) || status != TC_READ_OK) return;
  for (int i = 0; i < n; i++) {
    timeout_call_t *t = calloc(1, sizeof(*t));
    if (!t) break;
    t->ctx = rec->ctx;
    rec->stats.timed_out++;
    snprintf(t->xid, sizeof(t->xid), "%s", xids[i]);
    t->op.kind = TC_OP_DECIDE;
    t->op.cb = on_timeout_decided;
    t->op.arg = t;
    t->op.xid = t->xid;
    t->op.action = TC_DECIDE_TIMEOUT;
    if (tc_store_submit(rec->ctx->store, &t->op) != 0) {
      free(t);
      break; /* queue full: next tick */
    }
  }
}

/* -------------------------------------------------------------- retries */

static void on_claimed(int status, const char *err, const tc_read_claim_t *claims, int n, void *arg) {
  tc_recovery_t *rec = arg;
  rec->retries_running = false;
  if (read_done(rec) || status != TC_READ_OK) return;
  for (int i = 0; i < n; i++) {
    const tc_read_claim_t *c = &claims[i];
    rec->stats.retried++;
    tc_log_ctx_t lc = {c->xid, 0, NULL};
    TC_LOG(TC_LOG_DEBUG, &lc, "recovery drives phase two (%s, %d branches)", txp_global_status_name(c->global_status),
           c->nbranches);
    tc__phase2_drive(rec->ctx, c->xid, c->global_status, c->branches, c->nbranches, NULL, NULL);
  }
}

/* -------------------------------------------------------------- history */

static void on_history_pruned(int status, const char *err, int64_t n, void *arg) {
  tc_recovery_t *rec = arg;
  rec->history_running = false;
  if (read_done(rec)) return;
  if (status != TC_READ_OK) return;
  rec->stats.history_pruned += (uint64_t)n;
  if (n >= TC_READ_HISTORY_BATCH) rec->last_history_ns = 0; /* more to do: again at the next tick */
}

/* -------------------------------------------------------------- orphans */

static void on_orphans_adopted(int status, const char *err, int64_t n, void *arg) {
  tc_recovery_t *rec = arg;
  rec->orphans_running = false;
  if (read_done(rec) || status != TC_READ_OK) return;
  if (n > 0) tc_log_info("adopted %d sessions left mid-phase-two by nodes that are gone", (int)n);
}

/* ----------------------------------------------------------------- jobs */

/* A job's read was sent ('rc' 0): it is running, and close waits for it. */
static void read_sent(tc_recovery_t *rec, int rc, bool *running) {
  if (rc != 0) return;
  *running = true;
  rec->reads++;
}

static void run_jobs(tc_recovery_t *rec) {
  tc_store_t *st = rec->ctx->store;
  if (!rec->timeouts_running)
    read_sent(rec, tc_read_timeouts(st, TIMEOUT_LIMIT, READ_DEADLINE_MS, on_timeouts_found, rec),
              &rec->timeouts_running);
  if (!rec->retries_running)
    read_sent(rec, tc_read_claim_retries(st, CLAIM_LIMIT, CLAIM_LEASE_MS, READ_DEADLINE_MS, on_claimed, rec),
              &rec->retries_running);
  if (!rec->orphans_running)
    read_sent(rec, tc_read_adopt_orphans(st, READ_DEADLINE_MS, on_orphans_adopted, rec), &rec->orphans_running);
  uint64_t now = uv_hrtime();
  if (!rec->history_running && now - rec->last_history_ns > (uint64_t)HISTORY_EVERY_MS * 1000000u) {
    rec->last_history_ns = now;
    read_sent(rec,
              tc_read_prune_history(st, rec->ctx->cfg->history_days, READ_DEADLINE_MS, on_history_pruned, rec),
              &rec->history_running);
  }
}

/* ------------------------------------------------------------ leadership */

static void on_leader_answer(int status, const char *err, const char *answer, void *arg) {
  tc_recovery_t *rec = arg;
  rec->asking = false;
  if (status != TC_READ_OK || rec->closing) return;
  if (strcmp(answer, "fenced") == 0) {
    tc_log_warn("the recovery leader stopped writing heartbeats for %d ms: its leadership was revoked",
                rec->ctx->cfg->cluster_leader_lease_ms);
  } else if (strcmp(answer, "no-privilege") == 0 && !rec->fence_warned) {
    rec->fence_warned = true;
    tc_log_warn("the recovery leader is stalled but this role may not terminate its session: "
                "GRANT pg_signal_backend to the tcd role");
  }
  bool got = strcmp(answer, "leader") == 0;
  if (got && !rec->leader) {
    rec->leader = true;
    rec->stats.leader_terms++;
    tc_log_info("this node is now the recovery leader");
    run_jobs(rec);
  }
}

static void ask_leadership(tc_recovery_t *rec) {
  if (rec->asking || !rec->ctx->ops->may_lead(rec->ctx)) return;
  const tc_config_t *cfg = rec->ctx->cfg;
  if (tc_read_leader_try(rec->leader_conn, cfg->leader_lock_key, cfg->node_id, cfg->cluster_leader_lease_ms,
                         LEADER_DEADLINE_MS, on_leader_answer, rec) == 0)
    rec->asking = true;
}

/* The leader still holds the lock (its connection is alive and was not
 * terminated by a fence): only then run a round of jobs. */
static void on_leader_confirmed(int status, const char *err, bool held, void *arg) {
  tc_recovery_t *rec = arg;
  rec->confirming = false;
  if (status != TC_READ_OK || rec->closing || !rec->leader) return;
  if (!held) {
    rec->leader = false;
    tc_log_warn("lost the recovery leadership: the leader lock is no longer held by this node");
    return;
  }
  if (!rec->ctx->ops->may_lead(rec->ctx)) return; /* heartbeats failing: others will fence us */
  run_jobs(rec);
}

static void confirm_leadership(tc_recovery_t *rec) {
  if (rec->confirming) return;
  if (tc_read_leader_held(rec->leader_conn, rec->ctx->cfg->leader_lock_key, LEADER_DEADLINE_MS, on_leader_confirmed,
                          rec) == 0)
    rec->confirming = true;
}

static void on_leader_conn(bool up, const char *err, void *arg) {
  tc_recovery_t *rec = arg;
  if (!up && rec->leader) {
    /* The session holding the advisory lock is gone, and the lock with it. */
    rec->leader = false;
    tc_log_warn("lost the recovery leadership: store connection lost (%s)", err ? err : "unknown");
  }
}

static void on_tick(uv_timer_t *t) {
  tc_recovery_t *rec = t->data;
  if (rec->closing) return;
  if (rec->leader) confirm_leadership(rec);
  else ask_leadership(rec);
}

tc_recovery_t *tc_recovery_new(tc_ctx_t *ctx) {
  tc_recovery_t *rec = calloc(1, sizeof(*rec));
  if (!rec) return NULL;
  rec->ctx = ctx;
  rec->leader_conn =
    tc_read_conn_new(ctx->loop, ctx->cfg->pg_url, TC_READ_CONN_LEADER, ctx->cfg->node_id, on_leader_conn, rec);
  if (!rec->leader_conn) {
    free(rec);
    return NULL;
  }
  uv_timer_init(ctx->loop, &rec->tick);
  rec->tick.data = rec;
  uv_timer_start(&rec->tick, on_tick, 10, (uint64_t)ctx->cfg->recovery_interval_ms);
  return rec;
}

bool tc_recovery_is_leader(const tc_recovery_t *rec) { return rec->leader; }

void tc_recovery_get_stats(const tc_recovery_t *rec, tc_recovery_stats_t *out) { *out = rec->stats; }

static void on_tick_closed(uv_handle_t *h) {
  tc_recovery_t *rec = h->data;
  tc_parts_closed(&rec->close);
}

/* Account for a finished read; true when the object is closing (and the
 * caller must not touch it any more: it may be freed by this call). */
static bool read_done(tc_recovery_t *rec) {
  rec->reads--;
  if (!rec->closing) return false;
  tc_parts_closed(&rec->close);
  return true;
}

void tc_recovery_close(tc_recovery_t *rec, void (*done)(void *), void *arg) {
  rec->closing = true;
  tc_parts_start(&rec->close, 2 + rec->reads, free, rec, done, arg);
  uv_close((uv_handle_t *)&rec->tick, on_tick_closed);
  tc_read_conn_close(rec->leader_conn, tc_parts_closed, &rec->close);
}
