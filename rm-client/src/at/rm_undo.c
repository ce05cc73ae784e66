/*
 * rm_undo.c - phase two of AT branches, on the library's own connections:
 * BranchCommit (delete the undo row, batched) and BranchRollback (checked
 * replay of the undo row), the undo clean-up thread and the retention
 * sweep.
 *
 * NOTES
 *   Threads.  rm__at_phase2 runs on the core's worker threads and blocks on
 *   PostgreSQL through a small per-resource pool (rm_at_int.h).  One deleter
 *   thread per client deletes the undo rows of committed branches in
 *   batches and runs the sweep.
 *
 *   Commit.  The TC's decision is durable before it sends BranchCommit, so
 *   the branch is answered PhaseTwoCommitted at once and its (xid,
 *   branch_id) queued.  The deleter drains the queues every flush_ms, or as
 *   soon as one holds delete_batch keys, with one DELETE per batch.  A full
 *   queue (queue_max) makes the commit delete its row inline.  Rows whose
 *   delete is lost (a crash, the database down) are resolved through the
 *   coordinator later (below), or left to the sweep.
 *
 *   Commit deltas (rm_at_update_delta_on_commit; rm_at_stmt.c NOTES say
 *   why a give-back waits for the commit).  Their undo row is marked
 *   "commit=1" in its context, and committing such a branch is no longer
 *   just deleting its row: in ONE local transaction the row is locked, its
 *   commit_delta items applied (one UPDATE per business row, the deltas of
 *   its columns together, so that a move such as frozen -> sold keeps the
 *   row's CHECK), the row deleted (first: DELETE ... RETURNING locks and
 *   reads it in one round trip), all committed, without waiting for the
 *   WAL flush (synchronous_commit off, set with the recorded settings): a
 *   PostgreSQL crash that loses such a commit brings the undo row back,
 *   and since its global committed the leftover pass applies it again; a
 *   rollback, which nothing would redo, waits for its flush.  The row's deletion is
 *   the mark that the deltas were applied, so they are applied exactly
 *   once however often the commit comes.  Every path that ends a
 *   committed branch's row honours the mark:
 *     - a branch this client prepared is remembered (rm__at_inline_add)
 *       and its BranchCommit runs on a worker, at once, answering the TC
 *       with the outcome: a failure (the row gone, a constraint: someone
 *       outside the coordinator changed it) is PhaseTwoCommitFailed*,
 *       which the TC shows as CommitFailed for an operator;
 *     - the deleter's batch DELETE skips marked rows and applies each
 *       (a branch not remembered: another instance's, or after a restart);
 *     - the leftover pass applies the marked rows of committed globals
 *       instead of deleting them;
 *     - the retention sweep never deletes a marked row (that would drop
 *       the give-back): it logs them as errors for an operator.
 *   A rollback skips commit_delta items: nothing of them was applied.
 *
 *   Rollback, in ONE local transaction on a pooled connection:
 *     1. SELECT the undo row FOR UPDATE.  Absent: INSERT the guard row
 *        (log_status 1, no rollback_info) ON CONFLICT DO NOTHING; once
 *        committed, a late local commit of this branch fails on
 *        UNIQUE (xid, branch_id) (the anti-suspension fence) and the answer
 *        is PhaseTwoRollbacked.  If the INSERT meets a conflict, the branch's
 *        own local transaction committed meanwhile (the INSERT waited for
 *        it): read the row again and go on.  A guard row already there
 *        means this branch is done: PhaseTwoRollbacked, nothing touched.
 *     2. Re-apply the session settings recorded in the undo context (SET
 *        LOCAL), so that current rows print as the images did.
 *     3. Replay the items backwards.  Each locks its row FOR UPDATE and
 *        compares it with the images:
 *          update: current == after  -> UPDATE back to before
 *                  current == before -> nothing (already undone)
 *          delete: absent            -> re-INSERT before
 *                  current == before -> nothing
 *          insert: current == after  -> DELETE
 *                  absent            -> nothing
 *          delta:  UPDATE col = col - delta (commutes; no image)
 *          commit_delta: nothing (it is applied only by a commit)
 *        anything else is a dirty write: the local transaction is rolled
 *        back (nothing overwritten) and the answer is
 *        PhaseTwoRollbackFailedUnretryable with RM_E_DIRTY_WRITE and a
 *        message naming table, key and columns.  A restore that the
 *        database refuses with an integrity constraint (SQLSTATE class 23:
 *        a CHECK, a unique key someone else took since, a foreign key) is
 *        answered PhaseTwoRollbackFailedUnretryable too: by design no
 *        undo of this library can be refused (rm_at_stmt.c NOTES), so it
 *        means a write outside the coordinator, and retrying cannot help;
 *        the TC ends the global in *RollbackFailed with its locks kept, for
 *        an operator, instead of retrying forever.
 *     4. DELETE the undo row and COMMIT.  A replayed BranchRollback then
 *        finds no row and writes a guard (step 1): it touches no business
 *        row, so duplicates are harmless, and the guard costs one small row
 *        only when a duplicate actually arrives.
 *   A database error anywhere rolls the local transaction back and answers
 *   PhaseTwoRollbackFailedRetryable (RM_E_DB): the TC retries later, and
 *   since nothing was committed the retry starts from scratch.
 *
 *   Leftovers (every resolve_interval_s, and once as soon as a node is up
 *   after a resource is added: start-up recovery of a crashed service).
 *   A lost queue leaves log_status 0 rows of committed branches behind.
 *   The deleter asks the coordinator the global status of the xids of rows
 *   older than resolve_grace_s (for the start-up pass: every row written
 *   before the resource was added), at most resolve_max_xids per pass, and
 *   deletes (SKIP LOCKED) the rows of commit-family globals; Begin and
 *   rollback-family rows stay for the TC to drive, GLOBAL_NOT_FOUND rows
 *   for the retention sweep.  No node up or no answer: nothing that pass.
 *   An AT commit without commit work is finished by its decision and its
 *   branches are only told (sql/tc/010): a notice lost with a coordinator
 *   that died leaves rows here, so a lost connection brings a pass of
 *   every resource RESOLVE_AFTER_LOSS_MS later, for rows older than
 *   RESOLVE_AFTER_LOSS_AGE_MS (rows of globals still undecided stay, as
 *   in every pass).
 *
 *   The sweep (every sweep_interval_s) deletes undo rows older than
 *   retention_s, guards and normal rows alike, and logs the normal ones: a
 *   normal row that old belongs to a branch whose phase two never reached
 *   this database (lost delete after a commit, or a global transaction
 *   nobody finished); after the sweep a late rollback of it would find no
 *   row and roll back nothing.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rm_undo_int.h"

#define SWEEP_MAX_BATCHES 100
/* After a lost coordinator connection: the pass, and the age of the rows
 * it looks at (older than the decisions that the lost node had in
 * flight; a TM that heard "unknown outcome" retries within that). */
#define RESOLVE_AFTER_LOSS_MS 5000
#define RESOLVE_AFTER_LOSS_AGE_MS 2000
#define SWEEP_LOG_ROWS 10

/* Snapshot of the resource list (append-only, never freed before the
 * state).  Caller frees the array. */
rm_at_resource_t **rm__undo_resources(rm_at_state_t *st, int *n) {
  pthread_mutex_lock(&st->mu);
  rm_at_resource_t **v = calloc((size_t)st->nresources + 1, sizeof(*v));
  *n = 0;
  for (rm_at_resource_t *r = st->resources; v && r; r = r->next) v[(*n)++] = r;
  pthread_mutex_unlock(&st->mu);
  return v;
}

/* Here, below rm_resource.c, because the sweep reads it too (rm_resource.c
 * sets the modes and dispatches phase two through them). */
const rm_at_mode_t *rm__at_resource_mode(rm_at_resource_t *r, int type, void **arg) {
  if (!r || type <= TXP_BT_AT || type >= TXP_BT__MAX) return NULL;
  pthread_mutex_lock(&r->meta_mu);
  const rm_at_mode_t *m = r->modes[type];
  if (arg) *arg = r->mode_args[type];
  pthread_mutex_unlock(&r->meta_mu);
  return m;
}

/* --------------------------------------------------------------- sweep */

int rm__undo_sweep(rm_at_resource_t *r, long long *removed) {
  rm_at_state_t *st = r->st;
  rm_at_tuning_t t = rm__undo_tuning(st);
  char age[32], lim[32], err[512];
  snprintf(age, sizeof(age), "%u", t.retention_s);
  snprintf(lim, sizeof(lim), "%u", t.delete_batch ? t.delete_batch : 1000);
  const char *params[2] = {age, lim};
  PGconn *pg = NULL;
  int rc = rm__undo_pool_get(r, &pg, err, sizeof(err));
  if (rc != 0) {
    rm__log(st->c, RM_LOG_WARN, "could not sweep the undo log of \"%s\": %s", r->id, err);
    return rc;
  }
  long long normal = 0, guards = 0;
  for (int batch = 0; batch < SWEEP_MAX_BATCHES; batch++) {
    PGresult *res = PQexecParams(
      pg,
      "WITH gone AS (DELETE FROM undo_log WHERE (xid, branch_id) IN ("
      " SELECT xid, branch_id FROM undo_log"
      " WHERE log_created < pg_catalog.clock_timestamp() - $1::int8 * interval '1 second'"
      " AND NOT " MARKED("undo_log") /* deleting one would drop its give-back */
      " ORDER BY log_created LIMIT $2::int8 FOR UPDATE SKIP LOCKED)"
      " RETURNING xid, branch_id, log_status)"
      " SELECT xid, branch_id, log_status FROM gone",
      2, NULL, params, NULL, NULL, 0);
    if (PQresultStatus(res) != PGRES_TUPLES_OK) {
      rm__pg_error(err, sizeof(err), "could not sweep the undo log", pg, res);
      rm__log(st->c, RM_LOG_WARN, "%s of \"%s\"", err, r->id);
      PQclear(res);
      rc = RM_E_DB;
      break;
    }
    int n = PQntuples(res);
    for (int i = 0; i < n; i++) {
      if (strcmp(PQgetvalue(res, i, 2), "0") != 0) {
        guards++;
        continue;
      }
      if (normal++ < SWEEP_LOG_ROWS)
        rm__log(st->c, RM_LOG_WARN,
                "swept the undo row of branch %s of \"%s\" on \"%s\": older than %u s, its phase "
                "two never arrived",
                PQgetvalue(res, i, 1), PQgetvalue(res, i, 0), r->id, t.retention_s);
    }
    PQclear(res);
    if ((unsigned)n < (t.delete_batch ? t.delete_batch : 1000)) break;
  }
  if (rc == 0) {
    /* Marked rows that old: a commit's give-back that never reached this
     * database, or a global nobody finished.  Not ours to guess. */
    PGresult *res = PQexecParams(pg,
                                 "SELECT count(*), pg_catalog.min(xid) FROM undo_log"
                                 " WHERE log_status = 0 AND " MARKED("undo_log")
                                 " AND log_created < pg_catalog.clock_timestamp() - $1::int8 * interval '1 second'",
                                 1, NULL, params, NULL, NULL, 0);
    if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1 && strcmp(PQgetvalue(res, 0, 0), "0") != 0)
      rm__log(st->c, RM_LOG_ERROR,
              "%s undo row(s) with commit deltas on \"%s\" are older than %u s (the first of global transaction "
              "\"%s\"): their phase two never arrived; look up each global's outcome (tcctl show XID) and, if it "
              "committed, apply the row's commit_delta items by hand before deleting the row",
              PQgetvalue(res, 0, 0), r->id, t.retention_s, PQgetvalue(res, 0, 1));
    PQclear(res);
  }
  long long mode_rows = 0;
  for (int type = TXP_BT_AT + 1; rc == 0 && type < TXP_BT__MAX; type++) {
    const rm_at_mode_t *m = rm__at_resource_mode(r, type, NULL);
    if (!m || !m->sweep) continue;
    char merr[512] = "";
    long long n = m->sweep(pg, type, t.retention_s, t.delete_batch ? t.delete_batch : 1000, merr, sizeof(merr));
    if (n < 0) {
      rc = (int)n;
      rm__log(st->c, RM_LOG_WARN, "%s on \"%s\"", merr, r->id);
    } else {
      mode_rows += n;
    }
  }
  rm__undo_pool_put(r, pg, rc != 0);
  if (removed) *removed += mode_rows;
  if (normal > SWEEP_LOG_ROWS)
    rm__log(st->c, RM_LOG_WARN, "swept %lld undo rows of unfinished branches on \"%s\" in all", normal, r->id);
  if (guards)
    rm__log(st->c, RM_LOG_INFO, "swept %lld guard rows older than %u s on \"%s\"", guards, t.retention_s, r->id);
  if (removed) *removed += normal + guards;
  return rc;
}

/* ------------------------------------------------------------- resolve */

/*
 * Leftovers: a log_status 0 row older than the grace age normally belongs
 * to a branch whose phase two already happened here but whose queued
 * delete was lost (a kill -9 within flush_ms of the BranchCommit).  The
 * pass asks the coordinator the global status of such rows' xids (blocking
 * rm_tm_status, on the deleter thread, never the loop thread) and deletes
 * the rows of globals in the commit family: committing an AT branch is
 * deleting its undo row, so doing it early or twice is harmless.  Rows of
 * Begin or rollback-family globals stay (the TC drives them to their
 * rollback, which needs the row); GLOBAL_NOT_FOUND (history pruned, or
 * another coordinator's xid) is left to the retention sweep.  Any other
 * answer, or no node up, ends the pass with nothing done for the rest.
 *
 * Per resource the deleter keeps a cursor (first log_created of an xid, in
 * microseconds, then the xid) so that xids left in place (Begin, not
 * found) do not starve later ones when there are more than
 * resolve_max_xids; the cursor wraps when a pass reaches the end.
 */

#define RESOLVE_CHUNK 64
#define RESOLVE_LOG_ROWS 10

typedef struct resolve_cursor {
  long long first_us; /* INT64_MIN: from the start */
  char xid[TXP_MAX_XID_LEN + 1];
} resolve_cursor_t;

typedef struct resolve_stats {
  long long asked, committed_xids, deleted, left_begin, left_rollback, left_not_found, left_other;
  int logged;
} resolve_stats_t;

static bool stopping(rm_at_state_t *st) {
  pthread_mutex_lock(&st->mu);
  bool s = st->stopping;
  pthread_mutex_unlock(&st->mu);
  return s;
}

/* A global in the commit family: its AT branches are (to be) committed. */
static bool commit_family(int gs) {
  return gs == TXP_GS_COMMITTING || gs == TXP_GS_COMMIT_RETRYING || gs == TXP_GS_ASYNC_COMMITTING ||
         gs == TXP_GS_COMMITTED;
}

/* Delete the log_status 0 rows of the 'n' xids in 'xids' (all in the
 * commit family), skipping rows locked by someone else. */
static int resolve_delete(rm_at_resource_t *r, const char *const *xids, int n, const int *gs, resolve_stats_t *rs) {
  rm_at_state_t *st = r->st;
  char err[512];
  json_t *arr = json_array();
  for (int i = 0; arr && i < n; i++)
    if (json_array_append_new(arr, json_string(xids[i])) != 0) {
      json_decref(arr);
      arr = NULL;
    }
  char *text = arr ? json_dumps(arr, JSON_COMPACT) : NULL;
  json_decref(arr);
  if (!text) {
    rm__log(st->c, RM_LOG_WARN, "could not resolve leftover undo rows on \"%s\": out of memory", r->id);
    return RM_E_NOMEM;
  }
  PGconn *pg = NULL;
  int rc = rm__undo_pool_get(r, &pg, err, sizeof(err));
  if (rc != 0) {
    rm__log(st->c, RM_LOG_WARN, "could not resolve leftover undo rows on \"%s\": %s", r->id, err);
    free(text);
    return rc;
  }
  const char *params[1] = {text};
  /* Plain rows go in one DELETE; marked rows (commit deltas) come back
   * with 'marked' true and are committed one by one. */
  PGresult *res = PQexecParams(
    pg,
    "WITH x AS (SELECT pg_catalog.jsonb_array_elements_text($1::jsonb) AS xid),"
    " gone AS (DELETE FROM undo_log WHERE (xid, branch_id) IN ("
    " SELECT xid, branch_id FROM undo_log"
    " WHERE xid IN (SELECT xid FROM x) AND log_status = 0 AND NOT " MARKED("undo_log")
    " FOR UPDATE SKIP LOCKED)"
    " RETURNING xid, branch_id, log_created)"
    " SELECT xid, branch_id,"
    " pg_catalog.round(extract(epoch FROM pg_catalog.clock_timestamp() - log_created))::int8, false AS marked"
    " FROM gone"
    " UNION ALL SELECT u.xid, u.branch_id,"
    " pg_catalog.round(extract(epoch FROM pg_catalog.clock_timestamp() - u.log_created))::int8, true"
    " FROM undo_log u WHERE u.xid IN (SELECT xid FROM x) AND u.log_status = 0 AND " MARKED("u")
    " ORDER BY 1, 2",
    1, NULL, params, NULL, NULL, 0);
  free(text);
  bool bad = false;
  if (PQresultStatus(res) != PGRES_TUPLES_OK) {
    rm__pg_error(err, sizeof(err), "could not delete leftover undo rows", pg, res);
    rm__log(st->c, RM_LOG_WARN, "%s of \"%s\"", err, r->id);
    rc = RM_E_DB;
    bad = true;
  } else {
    int rows = PQntuples(res);
    for (int i = 0; i < rows && !bad; i++) {
      if (strcmp(PQgetvalue(res, i, 3), "t") == 0) {
        char cerr[1024] = "";
        int code = 0;
        int bs = rm__commit_marked(r, pg, PQgetvalue(res, i, 0), atoll(PQgetvalue(res, i, 1)), &bad, &code, cerr,
                               sizeof(cerr));
        if (bs == TXP_BS_PHASE2_COMMITTED) {
          rs->deleted++;
          rm__log(st->c, RM_LOG_INFO,
                  "applied the commit deltas of leftover branch %s of \"%s\" on \"%s\" (%s s old): the global "
                  "transaction committed, its phase two had not reached this database",
                  PQgetvalue(res, i, 1), PQgetvalue(res, i, 0), r->id, PQgetvalue(res, i, 2));
        }
        continue;
      }
      rs->deleted++;
      if (rs->logged >= RESOLVE_LOG_ROWS) continue;
      rs->logged++;
      const char *x = PQgetvalue(res, i, 0);
      int status = TXP_GS_COMMITTED;
      for (int k = 0; k < n; k++)
        if (strcmp(xids[k], x) == 0) status = gs[k];
      rm__log(st->c, RM_LOG_INFO,
              "deleted the leftover undo row of branch %s of \"%s\" on \"%s\" (%s s old): the global "
              "transaction is %s, the phase-two delete was lost",
              PQgetvalue(res, i, 1), x, r->id, PQgetvalue(res, i, 2), txp_global_status_name(status));
    }
  }
  PQclear(res);
  rm__undo_pool_put(r, pg, bad);
  return rc;
}

/*
 * One pass over 'r': rows older than 'grace_ms' (DB clock), at most
 * resolve_max_xids xids from 'cur' on.  Returns 0 when the pass ran (even
 * with database errors: the next pass retries), RM_E_NO_NODE when no
 * coordinator answered (nothing done for the xids not yet asked).
 */
static int resolve_resource(rm_at_resource_t *r, resolve_cursor_t *cur, int64_t grace_ms) {
  rm_at_state_t *st = r->st;
  rm_at_tuning_t t = rm__undo_tuning(st);
  unsigned max = t.resolve_max_xids ? t.resolve_max_xids : 256;
  if (rm_client_nodes_up(st->c) < 1) return RM_E_NO_NODE;

  char grace[32], first[32], lim[32], err[512];
  snprintf(grace, sizeof(grace), "%lld", (long long)(grace_ms < 0 ? 0 : grace_ms));
  snprintf(first, sizeof(first), "%lld", cur->first_us);
  snprintf(lim, sizeof(lim), "%u", max);
  const char *params[4] = {grace, first, cur->xid, lim};
  PGconn *pg = NULL;
  if (rm__undo_pool_get(r, &pg, err, sizeof(err)) != 0) {
    rm__log(st->c, RM_LOG_WARN, "could not look for leftover undo rows on \"%s\": %s", r->id, err);
    return 0;
  }
  PGresult *res = PQexecParams(
    pg,
    "SELECT xid, first_us FROM ("
    " SELECT xid, (extract(epoch FROM pg_catalog.min(log_created)) * 1000000)::int8 AS first_us"
    " FROM undo_log"
    " WHERE log_status = 0"
    " AND log_created < pg_catalog.clock_timestamp() - $1::int8 * interval '1 millisecond'"
    " GROUP BY xid) s"
    " WHERE (first_us, xid COLLATE \"C\") > ($2::int8, $3::text COLLATE \"C\")"
    " ORDER BY first_us, xid COLLATE \"C\" LIMIT $4::int8",
    4, NULL, params, NULL, NULL, 0);
  bool ok = PQresultStatus(res) == PGRES_TUPLES_OK;
  if (!ok) {
    rm__pg_error(err, sizeof(err), "could not look for leftover undo rows", pg, res);
    rm__log(st->c, RM_LOG_WARN, "%s of \"%s\"", err, r->id);
  }
  rm__undo_pool_put(r, pg, !ok);
  if (!ok) {
    PQclear(res);
    return 0;
  }

  int n = PQntuples(res), rc = 0;
  resolve_stats_t rs = {0};
  const char *xids[RESOLVE_CHUNK];
  int gs[RESOLVE_CHUNK], ncommit = 0, i = 0;
  for (; i < n; i++) {
    const char *x = PQgetvalue(res, i, 0);
    if (stopping(st)) {
      rc = RM_E_CONN_LOST;
      break;
    }
    int status = 0, code = rm_tm_status(st->c, x, &status);
    if (code == 0) {
      rs.asked++;
      if (commit_family(status)) {
        xids[ncommit] = x;
        gs[ncommit++] = status;
      } else if (status == TXP_GS_BEGIN) {
        rs.left_begin++;
      } else if (txp_global_status_is_rollback(status)) {
        rs.left_rollback++;
      } else {
        rs.left_other++; /* CommitFailed, Stop*Retry...: an operator's */
      }
    } else if (code == RM_E_GLOBAL_NOT_FOUND) {
      rs.asked++;
      rs.left_not_found++;
    } else if (code == RM_E_NOT_OWNER) {
      /* Another application's global (two groups sharing this database):
       * not ours to settle; passed over, or every pass would stop here. */
      rs.asked++;
      rs.left_other++;
    } else {
      /* No node, a lost connection, a busy or failing store: no answer. */
      rm__log(st->c, RM_LOG_INFO,
              "resolving leftover undo rows on \"%s\": the coordinator did not answer for \"%s\" (%s); "
              "stopping this pass",
              r->id, x, rm_strerror(code));
      rc = RM_E_NO_NODE;
      break;
    }
    /* The row's xid is settled (deleted below or left on purpose). */
    snprintf(cur->xid, sizeof(cur->xid), "%s", x);
    cur->first_us = atoll(PQgetvalue(res, i, 1));
    if (ncommit == RESOLVE_CHUNK || i == n - 1) {
      if (ncommit) {
        rs.committed_xids += ncommit;
        resolve_delete(r, xids, ncommit, gs, &rs);
        ncommit = 0;
      }
      rm__commit_flush(r); /* keep phase-two deletes moving during a long pass */
    }
  }
  if (ncommit) { /* stopped mid-chunk: what was answered still counts */
    rs.committed_xids += ncommit;
    resolve_delete(r, xids, ncommit, gs, &rs);
  }
  if (rc == 0 && (unsigned)n < max) { /* reached the end: wrap */
    cur->first_us = INT64_MIN;
    cur->xid[0] = '\0';
  }
  PQclear(res);

  if (rs.deleted)
    rm__log(st->c, RM_LOG_INFO,
            "resolved leftover undo rows on \"%s\" through the coordinator: deleted %lld row(s) of %lld "
            "committed global transaction(s)",
            r->id, rs.deleted, rs.committed_xids);
  if (rs.asked)
    rm__log(st->c, RM_LOG_DEBUG,
            "leftover undo rows on \"%s\": %lld xid(s) asked, %lld committed, left %lld begun, %lld "
            "rolling back or rolled back, %lld not found, %lld other",
            r->id, rs.asked, rs.committed_xids, rs.left_begin, rs.left_rollback, rs.left_not_found,
            rs.left_other);
  return rc == RM_E_NO_NODE ? RM_E_NO_NODE : 0;
}

/* The deleter's bookkeeping per resource (same index as the resource
 * list, which is append-only). */
typedef struct resolve_slot {
  int64_t added_ms;   /* when the deleter first saw the resource */
  int64_t next_ms;    /* next pass */
  bool first_done;    /* the start-up pass ran */
  resolve_cursor_t cur;
} resolve_slot_t;

/* Ask for the pass after a lost coordinator 'in_ms' from now.  The first
 * request sets the time: a cluster losing its nodes one after the other
 * does not push the pass back. */
static void resolve_again_soon(rm_at_state_t *st, int64_t in_ms) {
  pthread_mutex_lock(&st->mu);
  if (st->resolve_soon_ms == 0) st->resolve_soon_ms = rm__undo_now_ms() + in_ms;
  pthread_mutex_unlock(&st->mu);
}

/* Run the due resolve passes ('soon': a coordinator was lost, every
 * resource's pass is due now, for younger rows); 'slots' grows with the
 * resource list. */
static void resolve_due(rm_at_state_t *st, rm_at_resource_t **v, int n, resolve_slot_t **slots, int *nslots,
                        unsigned *last_interval, unsigned *last_grace, bool soon) {
  rm_at_tuning_t t = rm__undo_tuning(st);
  int64_t interval_ms = (int64_t)(t.resolve_interval_s ? t.resolve_interval_s : 30) * 1000;
  int64_t grace_ms = (int64_t)(t.resolve_grace_s ? t.resolve_grace_s : 30) * 1000;
  int64_t now = rm__undo_now_ms();
  if (n > *nslots) {
    resolve_slot_t *g = realloc(*slots, sizeof(*g) * (size_t)n);
    if (!g) return;
    for (int i = *nslots; i < n; i++) {
      /* Start-up pass as soon as a node is up: rows of a crashed
       * predecessor are there from the start. */
      g[i] = (resolve_slot_t){.added_ms = now, .next_ms = now, .cur = {.first_us = INT64_MIN}};
    }
    *slots = g;
    *nslots = n;
  }
  if (t.resolve_interval_s != *last_interval || t.resolve_grace_s != *last_grace) {
    /* Retuned: the new period starts now. */
    for (int i = 0; i < n; i++)
      if ((*slots)[i].first_done && (*slots)[i].next_ms > now + interval_ms) (*slots)[i].next_ms = now + interval_ms;
    *last_interval = t.resolve_interval_s;
    *last_grace = t.resolve_grace_s;
  }
  for (int i = 0; i < n; i++) {
    resolve_slot_t *s = &(*slots)[i];
    bool after_loss = soon && s->first_done;
    if (!after_loss && rm__undo_now_ms() < s->next_ms) continue;
    /* The start-up pass looks at every row written before the deleter
     * saw the resource (within flush_ms of rm_resource_add; rows of a
     * crashed predecessor), however young. */
    int64_t age = s->first_done ? grace_ms : rm__undo_now_ms() - s->added_ms;
    if (age > grace_ms) age = grace_ms;
    if (after_loss && age > RESOLVE_AFTER_LOSS_AGE_MS) age = RESOLVE_AFTER_LOSS_AGE_MS;
    int rc = resolve_resource(v[i], &s->cur, age);
    if (rc == RM_E_NO_NODE && after_loss) {
      resolve_again_soon(st, 1000); /* no node answered yet: the same pass in a second */
    } else if (rc == RM_E_NO_NODE && !s->first_done) {
      s->next_ms = rm__undo_now_ms() + 1000; /* retry the start-up pass soon */
    } else {
      s->first_done = s->first_done || rc == 0;
      s->next_ms = rm__undo_now_ms() + (s->first_done ? interval_ms : 1000);
    }
  }
}

void rm__undo_resolve_soon(rm_at_state_t *st) { resolve_again_soon(st, RESOLVE_AFTER_LOSS_MS); }

/* -------------------------------------------------------------- deleter */

static void *deleter_main(void *arg) {
  rm_at_state_t *st = arg;
  resolve_slot_t *slots = NULL;
  int nslots = 0;
  unsigned last_interval = 0, last_grace = 0;
  pthread_mutex_lock(&st->mu);
  while (!st->stopping) {
    if (!st->kick) {
      struct timespec at = rm__undo_abs_ms(rm__undo_now_ms() + st->tune.flush_ms);
      pthread_cond_timedwait(&st->cv, &st->mu, &at);
    }
    if (st->stopping) break;
    st->kick = false;
    bool soon = st->resolve_soon_ms != 0 && rm__undo_now_ms() >= st->resolve_soon_ms;
    if (soon) st->resolve_soon_ms = 0;
    bool sweep = rm__undo_now_ms() >= st->next_sweep_ms;
    if (sweep) st->next_sweep_ms = rm__undo_now_ms() + (int64_t)st->tune.sweep_interval_s * 1000;
    pthread_mutex_unlock(&st->mu);

    int n = 0;
    rm_at_resource_t **v = rm__undo_resources(st, &n);
    for (int i = 0; v && i < n; i++) {
      rm__commit_flush(v[i]);
      if (sweep) rm__undo_sweep(v[i], NULL);
    }
    if (v) resolve_due(st, v, n, &slots, &nslots, &last_interval, &last_grace, soon);
    free(v);
    pthread_mutex_lock(&st->mu);
  }
  pthread_mutex_unlock(&st->mu);
  free(slots);
  return NULL;
}

int rm__undo_start(rm_at_state_t *s) {
  /* First sweep soon after start: that is when a crash left rows behind. */
  s->next_sweep_ms = rm__undo_now_ms() + 60 * 1000;
  if (pthread_create(&s->deleter, NULL, deleter_main, s) != 0) return RM_E_NOMEM;
  s->deleter_running = true;
  return 0;
}

void rm__undo_stop(rm_at_state_t *s) {
  pthread_mutex_lock(&s->mu);
  s->stopping = true;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
  if (s->deleter_running) pthread_join(s->deleter, NULL);
  s->deleter_running = false;
  /* Last chance for the queued deletes; what fails is left to the sweep. */
  int n = 0;
  rm_at_resource_t **v = rm__undo_resources(s, &n);
  for (int i = 0; v && i < n; i++) {
    rm__commit_flush(v[i]);
    rm__undo_pool_close(v[i]);
  }
  free(v);
}

void rm__undo_resource_free(rm_at_resource_t *r) {
  free(r->inl);
  r->inl = NULL;
  r->ninl = 0;
  rm__commit_keys_free(r->queue, r->qlen);
  r->queue = NULL;
  r->qlen = r->qcap = 0;
  rm__undo_pool_close(r);
}

