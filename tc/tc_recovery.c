/*
 * tc_recovery.c - the leader's background work: time out Begin sessions,
 * retry unfinished phase two, prune history.
 *
 * NOTES
 *   Leadership is a PostgreSQL advisory lock (recovery.leader_lock_key)
 *   held by a dedicated connection of this node.  When the node dies, its
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
 */
#include "tc_recovery.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tc_log.h"
#include "tc_ctx.h"
#include "tc_phase2.h"

#define CLAIM_LIMIT 256
#define CLAIM_LEASE_MS 12000
#define TIMEOUT_LIMIT 256
#define HISTORY_EVERY_MS 60000
/* History rows deleted per statement: a first pruning after a long
 * retention period must not become one huge transaction. */
#define HISTORY_BATCH 10000

struct tc_recovery {
  tc_ctx_t *ctx;
  tc_pg_pool_t *leader_pool;
  uv_timer_t tick;
  bool leader;
  bool asking;
  bool timeouts_running, retries_running, history_running, orphans_running;
  bool confirming; /* the leader checks that it still holds the lock */
  bool fence_warned;
  uint64_t last_history_ns;
  int reads; /* store reads in flight: close waits for them */
  bool closing;
  int close_parts;
  void (*done)(void *);
  void *done_arg;
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

static void on_timeouts_found(tc_pg_job_t *job, int status, void *arg) {
  tc_recovery_t *rec = arg;
  rec->timeouts_running = false;
  if (read_done(rec) || status != TC_PG_OK) return;
  const PGresult *r = tc_pg_job_result(job, 0);
  for (int i = 0; i < PQntuples(r); i++) {
    timeout_call_t *t = calloc(1, sizeof(*t));
    if (!t) break;
    t->ctx = rec->ctx;
    rec->stats.timed_out++;
    snprintf(t->xid, sizeof(t->xid), "%s", PQgetvalue(r, i, 0));
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

static void on_claimed(tc_pg_job_t *job, int status, void *arg) {
  tc_recovery_t *rec = arg;
  rec->retries_running = false;
  if (read_done(rec) || status != TC_PG_OK) return;
  /* Rows: xid, global status, then one branch per row (NULL branch_id when
   * the session has none left), ordered by xid. */
  const PGresult *r = tc_pg_job_result(job, 0);
  int n = PQntuples(r);
  tc_branch_row_t *rows = calloc((size_t)(n ? n : 1), sizeof(*rows));
  if (!rows) return;
  int i = 0;
  while (i < n) {
    const char *xid = PQgetvalue(r, i, 0);
    int gs = atoi(PQgetvalue(r, i, 1));
    int k = 0;
    int j = i;
    for (; j < n && strcmp(PQgetvalue(r, j, 0), xid) == 0; j++) {
      if (PQgetisnull(r, j, 2)) continue;
      tc_branch_row_t *b = &rows[k++];
      memset(b, 0, sizeof(*b));
      b->branch_id = strtoll(PQgetvalue(r, j, 2), NULL, 10);
      b->branch_type = atoi(PQgetvalue(r, j, 3));
      b->status = atoi(PQgetvalue(r, j, 4));
      snprintf(b->resource_id, sizeof(b->resource_id), "%s", PQgetvalue(r, j, 5));
      snprintf(b->client_id, sizeof(b->client_id), "%s", PQgetvalue(r, j, 6));
      snprintf(b->application_id, sizeof(b->application_id), "%s", PQgetvalue(r, j, 7));
      snprintf(b->app_group, sizeof(b->app_group), "%s", PQgetvalue(r, j, 8));
    }
    rec->stats.retried++;
    tc_log_ctx_t lc = {xid, 0, NULL};
    TC_LOG(TC_LOG_DEBUG, &lc, "recovery drives phase two (%s, %d branches)", txp_global_status_name(gs), k);
    tc__phase2_drive(rec->ctx, xid, gs, rows, k, NULL, NULL);
    i = j;
  }
  free(rows);
}

/* -------------------------------------------------------------- history */

static void on_history_pruned(tc_pg_job_t *job, int status, void *arg) {
  tc_recovery_t *rec = arg;
  rec->history_running = false;
  if (read_done(rec)) return;
  if (status != TC_PG_OK) return;
  uint64_t n = strtoull(PQcmdTuples((PGresult *)(uintptr_t)tc_pg_job_result(job, 0)), NULL, 10);
  rec->stats.history_pruned += n;
  if (n >= HISTORY_BATCH) rec->last_history_ns = 0; /* more to do: again at the next tick */
}

/* -------------------------------------------------------------- orphans */

static void on_orphans_adopted(tc_pg_job_t *job, int status, void *arg) {
  tc_recovery_t *rec = arg;
  rec->orphans_running = false;
  if (read_done(rec) || status != TC_PG_OK) return;
  int n = atoi(PQgetvalue(tc_pg_job_result(job, 0), 0, 0));
  if (n > 0) tc_log_info("adopted %d sessions left mid-phase-two by nodes that are gone", n);
}

/* ----------------------------------------------------------------- jobs */

static void run_read(tc_recovery_t *rec, const char *sql, int n, const char *const *vals, tc_pg_job_cb cb,
                     bool *running) {
  tc_pg_job_t *job = tc_pg_job_new(0, cb, rec);
  if (!job) return;
  if (tc_pg_job_add(job, sql, n, vals) != 0 || tc_store_read(rec->ctx->store, job, 5000) != 0) {
    tc_pg_job_free(job);
    return;
  }
  *running = true;
  rec->reads++;
}

static void run_jobs(tc_recovery_t *rec) {
  char lim[16], lease[16], days[16];
  if (!rec->timeouts_running) {
    snprintf(lim, sizeof(lim), "%d", TIMEOUT_LIMIT);
    const char *v[] = {lim};
    run_read(rec, "SELECT xid FROM global_table WHERE status = 1 AND deadline < statement_timestamp() "
                  "ORDER BY deadline LIMIT $1::int", /* stable bound: an index range scan */
             1, v, on_timeouts_found, &rec->timeouts_running);
  }
  if (!rec->retries_running) {
    snprintf(lim, sizeof(lim), "%d", CLAIM_LIMIT);
    snprintf(lease, sizeof(lease), "%d", CLAIM_LEASE_MS);
    const char *v[] = {lim, lease};
    run_read(rec,
             "SELECT c.xid, c.status, b.branch_id, b.branch_type, b.status, b.resource_id, b.client_id, "
             "b.application_id, b.app_group "
             "FROM tc_claim_retries($1::int, $2::int) c "
             "LEFT JOIN branch_table b ON b.xid = c.xid ORDER BY c.xid, b.branch_id",
             2, v, on_claimed, &rec->retries_running);
  }
  if (!rec->orphans_running)
    run_read(rec, "SELECT tc_adopt_orphans()", 0, NULL, on_orphans_adopted, &rec->orphans_running);
  uint64_t now = uv_hrtime();
  if (!rec->history_running && now - rec->last_history_ns > (uint64_t)HISTORY_EVERY_MS * 1000000u) {
    rec->last_history_ns = now;
    snprintf(days, sizeof(days), "%d", rec->ctx->cfg->history_days);
    const char *v[] = {days};
    /* statement_timestamp(), not clock_timestamp(): a volatile bound
     * cannot use the end_time index, and the history table is the one
     * table here that is large (a full scan every minute, 0.6 s at 1.5
     * million rows). */
    run_read(rec,
             "DELETE FROM global_history WHERE xid IN (SELECT xid FROM global_history "
             "WHERE end_time < statement_timestamp() - $1::int * interval '1 day' "
             "ORDER BY end_time LIMIT 10000)", /* HISTORY_BATCH */
             1, v, on_history_pruned, &rec->history_running);
  }
}

/* ------------------------------------------------------------ leadership */

static void on_leader_answer(tc_pg_job_t *job, int status, void *arg) {
  tc_recovery_t *rec = arg;
  rec->asking = false;
  if (status != TC_PG_OK || rec->closing) return;
  const char *answer = PQgetvalue(tc_pg_job_result(job, 0), 0, 0);
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
  tc_pg_job_t *job = tc_pg_job_new(0, on_leader_answer, rec);
  if (!job) return;
  char key[32], ctx[16], lease[16];
  snprintf(key, sizeof(key), "%lld", (long long)rec->ctx->cfg->leader_lock_key);
  snprintf(ctx, sizeof(ctx), "%d", rec->ctx->cfg->node_id);
  snprintf(lease, sizeof(lease), "%d", rec->ctx->cfg->cluster_leader_lease_ms);
  const char *v[] = {key, ctx, lease};
  if (tc_pg_job_add(job, "SELECT tc_leader_try($1::bigint, $2::integer, $3::integer)", 3, v) != 0 ||
      tc_pg_submit(rec->leader_pool, job, 2000) != 0) {
    tc_pg_job_free(job);
    return;
  }
  rec->asking = true;
}

/* The leader still holds the lock (its connection is alive and was not
 * terminated by a fence): only then run a round of jobs. */
static void on_leader_confirmed(tc_pg_job_t *job, int status, void *arg) {
  tc_recovery_t *rec = arg;
  rec->confirming = false;
  if (status != TC_PG_OK || rec->closing || !rec->leader) return;
  if (PQgetvalue(tc_pg_job_result(job, 0), 0, 0)[0] != 't') {
    rec->leader = false;
    tc_log_warn("lost the recovery leadership: the leader lock is no longer held by this node");
    return;
  }
  if (!rec->ctx->ops->may_lead(rec->ctx)) return; /* heartbeats failing: others will fence us */
  run_jobs(rec);
}

static void confirm_leadership(tc_recovery_t *rec) {
  if (rec->confirming) return;
  tc_pg_job_t *job = tc_pg_job_new(0, on_leader_confirmed, rec);
  if (!job) return;
  char key[32];
  snprintf(key, sizeof(key), "%lld", (long long)rec->ctx->cfg->leader_lock_key);
  const char *v[] = {key};
  if (tc_pg_job_add(job,
                    "SELECT EXISTS (SELECT 1 FROM pg_locks l WHERE l.pid = pg_backend_pid() "
                    "AND l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 "
                    "AND l.classid = ($1::bigint >> 32)::oid AND l.objid = ($1::bigint & 4294967295)::oid)",
                    1, v) != 0 ||
      tc_pg_submit(rec->leader_pool, job, 2000) != 0) {
    tc_pg_job_free(job);
    return;
  }
  rec->confirming = true;
}

static void on_leader_conn(tc_pg_pool_t *pool, int idx, bool up, const char *err, void *arg) {
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
  tc_pg_pool_opts_t o = {0};
  o.conninfo = ctx->cfg->pg_url;
  o.size = 1;
  o.max_queue = 16;
  o.on_state = on_leader_conn;
  o.state_arg = rec;
  /* The name says which node leads (tc_nodes, tc_leader_try read it). */
  char init[64];
  snprintf(init, sizeof(init), "SET application_name = 'tcd-leader/%d'", ctx->cfg->node_id);
  o.init_sql = init;
  rec->leader_pool = tc_pg_pool_new(ctx->loop, &o);
  if (!rec->leader_pool) {
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

static void close_part(void *arg) {
  tc_recovery_t *rec = arg;
  if (--rec->close_parts > 0) return;
  void (*done)(void *) = rec->done;
  void *darg = rec->done_arg;
  free(rec);
  if (done) done(darg);
}

static void on_tick_closed(uv_handle_t *h) { close_part(h->data); }

/* Account for a finished read; true when the object is closing (and the
 * caller must not touch it any more: it may be freed by this call). */
static bool read_done(tc_recovery_t *rec) {
  rec->reads--;
  if (!rec->closing) return false;
  close_part(rec);
  return true;
}

void tc_recovery_close(tc_recovery_t *rec, void (*done)(void *), void *arg) {
  rec->closing = true;
  rec->done = done;
  rec->done_arg = arg;
  rec->close_parts = 2 + rec->reads;
  uv_close((uv_handle_t *)&rec->tick, on_tick_closed);
  tc_pg_pool_close(rec->leader_pool, close_part, rec);
}
