/*
 * rm_undo.c - phase two of AT branches, on the library's own connections:
 * BranchCommit (delete the undo row, batched) and BranchRollback (checked
 * replay of the undo row), the undo clean-up thread and the retention
 * sweep.
 *
 * NOTES
 *   Threads.  rm__at_phase2 runs on the core's worker threads and blocks on
 *   PostgreSQL through a small per-resource pool (rm_at.h).  One deleter
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

#include "rm_at.h"
#include "txp_errno.h"
#include "txp_status.h"

#define INT8OID 20
#define SWEEP_MAX_BATCHES 100
#define SWEEP_LOG_ROWS 10

/* SQL: whether undo_log row alias 'u' carries commit deltas (context values
 * are %-escaped, so ";commit=1;" cannot occur inside one). */
#define MARKED(u) "((';' || coalesce(" u ".context, '') || ';') LIKE '%;commit=1;%')"

/* A branch remembered for an inline commit (rm__at_inline_add). */
struct rm_inline_key {
  char xid[TXP_MAX_XID_LEN + 1];
  int64_t branch_id;
  int64_t added_ms;
};
/* Remembered entries older than this are dropped to make room: their
 * commit went elsewhere, or never came. */
#define INLINE_STALE_MS (10 * 60 * 1000)

static int commit_marked(rm_at_resource_t *r, PGconn *pg, const char *xid, int64_t bid, bool *bad, int *code,
                         char *err, size_t errlen);

/* ---------------------------------------------------------------- time */

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static struct timespec abs_ms(int64_t at) {
  struct timespec ts = {.tv_sec = at / 1000, .tv_nsec = (long)(at % 1000) * 1000000L};
  return ts;
}

static rm_at_tuning_t tuning(rm_at_state_t *st) {
  pthread_mutex_lock(&st->mu);
  rm_at_tuning_t t = st->tune;
  pthread_mutex_unlock(&st->mu);
  return t;
}

/* ---------------------------------------------------------------- pool */

static PGconn *conn_open(rm_at_resource_t *r, const rm_at_tuning_t *t, char *err, size_t errlen) {
  char ct[16], set[128];
  snprintf(ct, sizeof(ct), "%u", t->connect_timeout_s);
  /* connect_timeout and application_name come first so that the conninfo
   * may override them; client_encoding comes last: images are UTF-8. */
  const char *kw[] = {"connect_timeout", "application_name", "dbname", "client_encoding", NULL};
  const char *vals[] = {ct, "librmclient", r->conninfo, "UTF8", NULL};
  PGconn *pg = PQconnectdbParams(kw, vals, 1);
  if (!pg) {
    snprintf(err, errlen, "could not connect to resource \"%s\": out of memory", r->id);
    return NULL;
  }
  if (PQstatus(pg) != CONNECTION_OK) {
    char what[300];
    snprintf(what, sizeof(what), "could not connect to resource \"%s\"", r->id);
    rm__pg_error(err, errlen, what, pg, NULL);
    PQfinish(pg);
    return NULL;
  }
  snprintf(set, sizeof(set), "SET lock_timeout = %u; SET statement_timeout = %u", t->lock_timeout_ms,
           t->statement_timeout_ms);
  PGresult *res = PQexec(pg, set);
  if (PQresultStatus(res) != PGRES_COMMAND_OK) {
    rm__pg_error(err, errlen, "could not set up a phase-two session", pg, res);
    PQclear(res);
    PQfinish(pg);
    return NULL;
  }
  PQclear(res);
  return pg;
}

/* A connection of 'r''s pool, opened if none is idle and the pool is not
 * full; otherwise waits up to statement_timeout_ms.  0 or RM_E_DB. */
static int pool_get(rm_at_resource_t *r, PGconn **out, char *err, size_t errlen) {
  rm_at_tuning_t t = tuning(r->st);
  int max = t.pool_size < 1 ? 1 : t.pool_size > RM_AT_POOL_MAX ? RM_AT_POOL_MAX : (int)t.pool_size;
  struct timespec deadline = abs_ms(now_ms() + t.statement_timeout_ms);
  pthread_mutex_lock(&r->pool_mu);
  for (;;) {
    if (r->nidle > 0) {
      PGconn *pg = r->idle[--r->nidle];
      pthread_mutex_unlock(&r->pool_mu);
      if (PQstatus(pg) == CONNECTION_OK) {
        *out = pg;
        return 0;
      }
      PQfinish(pg); /* broken while idle: open a new one */
      pthread_mutex_lock(&r->pool_mu);
      r->total--;
      continue;
    }
    if (r->total < max) {
      r->total++;
      pthread_mutex_unlock(&r->pool_mu);
      PGconn *pg = conn_open(r, &t, err, errlen);
      if (pg) {
        *out = pg;
        return 0;
      }
      pthread_mutex_lock(&r->pool_mu);
      r->total--;
      pthread_cond_signal(&r->pool_cv);
      pthread_mutex_unlock(&r->pool_mu);
      return RM_E_DB;
    }
    if (pthread_cond_timedwait(&r->pool_cv, &r->pool_mu, &deadline) == ETIMEDOUT) {
      pthread_mutex_unlock(&r->pool_mu);
      snprintf(err, errlen, "no free connection to resource \"%s\" (all %d busy)", r->id, max);
      return RM_E_DB;
    }
  }
}

/* Return 'pg' to the pool; 'bad' (or a broken or unfinished session)
 * closes it instead. */
static void pool_put(rm_at_resource_t *r, PGconn *pg, bool bad) {
  if (!pg) return;
  if (!bad && (PQstatus(pg) != CONNECTION_OK || PQtransactionStatus(pg) != PQTRANS_IDLE)) bad = true;
  pthread_mutex_lock(&r->pool_mu);
  if (!bad && r->nidle < RM_AT_POOL_MAX) {
    r->idle[r->nidle++] = pg;
    pg = NULL;
  } else {
    r->total--;
  }
  pthread_cond_signal(&r->pool_cv);
  pthread_mutex_unlock(&r->pool_mu);
  if (pg) PQfinish(pg);
}

static void pool_close(rm_at_resource_t *r) {
  pthread_mutex_lock(&r->pool_mu);
  int n = r->nidle;
  PGconn *idle[RM_AT_POOL_MAX];
  memcpy(idle, r->idle, sizeof(PGconn *) * (size_t)n);
  r->nidle = 0;
  r->total -= n;
  pthread_mutex_unlock(&r->pool_mu);
  for (int i = 0; i < n; i++) PQfinish(idle[i]);
}

/* ------------------------------------------------------- commit: delete */

/* Commit 'n' branches: DELETE the undo rows without commit deltas in one
 * statement, which also returns the marked ones; then commit each of
 * those (commit_marked).  A marked row that fails is logged and left for
 * the leftover pass.  0, or the code of the DELETE's failure. */
static int finish_commits(rm_at_resource_t *r, const rm_undo_key_t *keys, size_t n, char *err, size_t errlen) {
  json_t *arr = json_array();
  for (size_t i = 0; arr && i < n; i++) {
    json_t *o = json_pack("{s:s, s:I}", "xid", keys[i].xid, "branch_id", (json_int_t)keys[i].branch_id);
    if (!o || json_array_append_new(arr, o) != 0) {
      json_decref(arr);
      arr = NULL;
    }
  }
  char *text = arr ? json_dumps(arr, JSON_COMPACT) : NULL;
  json_decref(arr);
  if (!text) {
    snprintf(err, errlen, "out of memory");
    return RM_E_NOMEM;
  }
  PGconn *pg = NULL;
  int rc = pool_get(r, &pg, err, errlen);
  bool bad = false;
  if (rc == 0) {
    const char *params[1] = {text};
    PGresult *res = PQexecParams(pg,
                                 "WITH k AS (SELECT * FROM pg_catalog.jsonb_to_recordset($1::jsonb)"
                                 " AS k(xid text, branch_id int8)),"
                                 " plain AS (DELETE FROM undo_log u USING k"
                                 " WHERE u.xid = k.xid AND u.branch_id = k.branch_id AND u.log_status = 0"
                                 " AND NOT " MARKED("u") ")"
                                 " SELECT u.xid, u.branch_id FROM undo_log u JOIN k"
                                 " ON u.xid = k.xid AND u.branch_id = k.branch_id"
                                 " WHERE u.log_status = 0 AND " MARKED("u"),
                                 1, NULL, params, NULL, NULL, 0);
    if (PQresultStatus(res) != PGRES_TUPLES_OK) {
      rm__pg_error(err, errlen, "could not delete undo rows", pg, res);
      rc = RM_E_DB;
      bad = true;
    }
    for (int i = 0; rc == 0 && i < PQntuples(res); i++) {
      char cerr[1024] = "";
      int code = 0;
      commit_marked(r, pg, PQgetvalue(res, i, 0), atoll(PQgetvalue(res, i, 1)), &bad, &code, cerr, sizeof(cerr));
      if (bad) break;
    }
    PQclear(res);
    pool_put(r, pg, bad);
  }
  free(text);
  return rc;
}

static void keys_free(rm_undo_key_t *keys, size_t n) {
  for (size_t i = 0; keys && i < n; i++) free(keys[i].xid);
  free(keys);
}

/* Append to r's queue; st->mu held.  False when full or out of memory. */
static bool queue_push(rm_at_resource_t *r, unsigned queue_max, char *xid, int64_t bid) {
  if (r->qlen >= queue_max) return false;
  if (r->qlen == r->qcap) {
    size_t cap = r->qcap ? r->qcap * 2 : 64;
    rm_undo_key_t *q = realloc(r->queue, cap * sizeof(*q));
    if (!q) return false;
    r->queue = q;
    r->qcap = cap;
  }
  r->queue[r->qlen].xid = xid;
  r->queue[r->qlen].branch_id = bid;
  r->qlen++;
  return true;
}

/* Delete everything queued for 'r', batch by batch.  A failed batch and
 * the rest go back to the queue (as far as it has room: the sweep
 * removes what is dropped). */
static int flush_resource(rm_at_resource_t *r) {
  rm_at_state_t *st = r->st;
  pthread_mutex_lock(&st->mu);
  rm_undo_key_t *keys = r->queue;
  size_t n = r->qlen;
  unsigned batch = st->tune.delete_batch ? st->tune.delete_batch : 1000;
  r->queue = NULL;
  r->qlen = r->qcap = 0;
  pthread_mutex_unlock(&st->mu);
  size_t done = 0;
  int rc = 0;
  char err[512] = "";
  while (done < n) {
    size_t k = n - done < batch ? n - done : batch;
    if ((rc = finish_commits(r, keys + done, k, err, sizeof(err))) != 0) break;
    done += k;
  }
  if (rc != 0) {
    size_t dropped = 0;
    pthread_mutex_lock(&st->mu);
    for (size_t i = done; i < n; i++) {
      if (queue_push(r, st->tune.queue_max, keys[i].xid, keys[i].branch_id)) keys[i].xid = NULL;
      else dropped++;
    }
    pthread_mutex_unlock(&st->mu);
    rm__log(st->c, RM_LOG_WARN,
            "could not delete the undo rows of %zu committed branch(es) on \"%s\": %s; will retry%s",
            n - done, r->id, err, dropped ? " (some dropped: the sweep will remove them)" : "");
  }
  keys_free(keys, n); /* requeued keys had their xid moved out (NULL) */
  return rc;
}

/* Snapshot of the resource list (append-only, never freed before the
 * state).  Caller frees the array. */
static rm_at_resource_t **resources_snapshot(rm_at_state_t *st, int *n) {
  pthread_mutex_lock(&st->mu);
  rm_at_resource_t **v = calloc((size_t)st->nresources + 1, sizeof(*v));
  *n = 0;
  for (rm_at_resource_t *r = st->resources; v && r; r = r->next) v[(*n)++] = r;
  pthread_mutex_unlock(&st->mu);
  return v;
}

/* --------------------------------------------------------------- sweep */

static int sweep_resource(rm_at_resource_t *r, long long *removed) {
  rm_at_state_t *st = r->st;
  rm_at_tuning_t t = tuning(st);
  char age[32], lim[32], err[512];
  snprintf(age, sizeof(age), "%u", t.retention_s);
  snprintf(lim, sizeof(lim), "%u", t.delete_batch ? t.delete_batch : 1000);
  const char *params[2] = {age, lim};
  PGconn *pg = NULL;
  int rc = pool_get(r, &pg, err, sizeof(err));
  if (rc != 0) {
    rm__log(st->c, RM_LOG_WARN, "could not sweep the undo log of \"%s\": %s", r->id, err);
    return rc;
  }
  long long normal = 0, guards = 0;
  for (int batch = 0; batch < SWEEP_MAX_BATCHES; batch++) {
    PGresult *res = PQexecParams(
      pg,
      "WITH gone AS (DELETE FROM undo_log WHERE id IN ("
      " SELECT id FROM undo_log"
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
  pool_put(r, pg, rc != 0);
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
  int rc = pool_get(r, &pg, err, sizeof(err));
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
    " gone AS (DELETE FROM undo_log WHERE id IN ("
    " SELECT id FROM undo_log"
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
        int bs = commit_marked(r, pg, PQgetvalue(res, i, 0), atoll(PQgetvalue(res, i, 1)), &bad, &code, cerr,
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
  pool_put(r, pg, bad);
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
  rm_at_tuning_t t = tuning(st);
  unsigned max = t.resolve_max_xids ? t.resolve_max_xids : 256;
  if (rm_client_nodes_up(st->c) < 1) return RM_E_NO_NODE;

  char grace[32], first[32], lim[32], err[512];
  snprintf(grace, sizeof(grace), "%lld", (long long)(grace_ms < 0 ? 0 : grace_ms));
  snprintf(first, sizeof(first), "%lld", cur->first_us);
  snprintf(lim, sizeof(lim), "%u", max);
  const char *params[4] = {grace, first, cur->xid, lim};
  PGconn *pg = NULL;
  if (pool_get(r, &pg, err, sizeof(err)) != 0) {
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
  pool_put(r, pg, !ok);
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
      flush_resource(r); /* keep phase-two deletes moving during a long pass */
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

/* Run the due resolve passes; 'slots' grows with the resource list. */
static void resolve_due(rm_at_state_t *st, rm_at_resource_t **v, int n, resolve_slot_t **slots, int *nslots,
                        unsigned *last_interval, unsigned *last_grace) {
  rm_at_tuning_t t = tuning(st);
  int64_t interval_ms = (int64_t)(t.resolve_interval_s ? t.resolve_interval_s : 30) * 1000;
  int64_t grace_ms = (int64_t)(t.resolve_grace_s ? t.resolve_grace_s : 30) * 1000;
  int64_t now = now_ms();
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
    if (now_ms() < s->next_ms) continue;
    /* The start-up pass looks at every row written before the deleter
     * saw the resource (within flush_ms of rm_resource_add; rows of a
     * crashed predecessor), however young. */
    int64_t age = s->first_done ? grace_ms : now_ms() - s->added_ms;
    if (age > grace_ms) age = grace_ms;
    int rc = resolve_resource(v[i], &s->cur, age);
    if (rc == RM_E_NO_NODE && !s->first_done) {
      s->next_ms = now_ms() + 1000; /* retry the start-up pass soon */
    } else {
      s->first_done = s->first_done || rc == 0;
      s->next_ms = now_ms() + (s->first_done ? interval_ms : 1000);
    }
  }
}

/* -------------------------------------------------------------- deleter */

static void *deleter_main(void *arg) {
  rm_at_state_t *st = arg;
  resolve_slot_t *slots = NULL;
  int nslots = 0;
  unsigned last_interval = 0, last_grace = 0;
  pthread_mutex_lock(&st->mu);
  while (!st->stopping) {
    if (!st->kick) {
      struct timespec at = abs_ms(now_ms() + st->tune.flush_ms);
      pthread_cond_timedwait(&st->cv, &st->mu, &at);
    }
    if (st->stopping) break;
    st->kick = false;
    bool sweep = now_ms() >= st->next_sweep_ms;
    if (sweep) st->next_sweep_ms = now_ms() + (int64_t)st->tune.sweep_interval_s * 1000;
    pthread_mutex_unlock(&st->mu);

    int n = 0;
    rm_at_resource_t **v = resources_snapshot(st, &n);
    for (int i = 0; v && i < n; i++) {
      flush_resource(v[i]);
      if (sweep) sweep_resource(v[i], NULL);
    }
    if (v) resolve_due(st, v, n, &slots, &nslots, &last_interval, &last_grace);
    free(v);
    pthread_mutex_lock(&st->mu);
  }
  pthread_mutex_unlock(&st->mu);
  free(slots);
  return NULL;
}

int rm__undo_start(rm_at_state_t *s) {
  /* First sweep soon after start: that is when a crash left rows behind. */
  s->next_sweep_ms = now_ms() + 60 * 1000;
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
  rm_at_resource_t **v = resources_snapshot(s, &n);
  for (int i = 0; v && i < n; i++) {
    flush_resource(v[i]);
    pool_close(v[i]);
  }
  free(v);
}

void rm__undo_resource_free(rm_at_resource_t *r) {
  free(r->inl);
  r->inl = NULL;
  r->ninl = 0;
  keys_free(r->queue, r->qlen);
  r->queue = NULL;
  r->qlen = r->qcap = 0;
  pool_close(r);
}

int rm__at_tune(rm_client_t *c, const rm_at_tuning_t *t) {
  rm_at_state_t *st = rm__at_state_get(c);
  if (!st) return RM_E_NOMEM;
  if (!t) return RM_E_INVALID;
  pthread_mutex_lock(&st->mu);
#define TUNE(f) \
  if (t->f) st->tune.f = t->f
  TUNE(pool_size);
  TUNE(queue_max);
  TUNE(flush_ms);
  TUNE(delete_batch);
  TUNE(sweep_interval_s);
  TUNE(retention_s);
  TUNE(lock_timeout_ms);
  TUNE(statement_timeout_ms);
  TUNE(connect_timeout_s);
  TUNE(resolve_interval_s);
  TUNE(resolve_grace_s);
  TUNE(resolve_max_xids);
#undef TUNE
  if (t->sweep_interval_s) st->next_sweep_ms = now_ms() + (int64_t)t->sweep_interval_s * 1000;
  pthread_cond_broadcast(&st->cv);
  pthread_mutex_unlock(&st->mu);
  return 0;
}

int rm__at_flush(rm_client_t *c) {
  rm_at_state_t *st = rm__at_state_get(c);
  if (!st) return RM_E_NOMEM;
  int n = 0, rc = 0;
  rm_at_resource_t **v = resources_snapshot(st, &n);
  for (int i = 0; v && i < n; i++) {
    int r = flush_resource(v[i]);
    if (r != 0 && rc == 0) rc = r;
  }
  free(v);
  return rc;
}

int rm__at_sweep(rm_client_t *c, long long *removed) {
  rm_at_state_t *st = rm__at_state_get(c);
  if (!st) return RM_E_NOMEM;
  if (removed) *removed = 0;
  int n = 0, rc = 0;
  rm_at_resource_t **v = resources_snapshot(st, &n);
  for (int i = 0; v && i < n; i++) {
    int r = sweep_resource(v[i], removed);
    if (r != 0 && rc == 0) rc = r;
  }
  free(v);
  return rc;
}

/* -------------------------------------------------------------- rollback */

typedef struct undo_ctx {
  rm_at_resource_t *r;
  PGconn *pg;
  const rm_phase2_req_t *req;
  char *err;
  size_t errlen;
  bool bad;         /* the connection must not go back to the pool */
  char sqlstate[6]; /* of the last statement ux saw fail ("" if none) */
} undo_ctx_t;

/* Run a statement; NULL (message in u->err, SQLSTATE in u->sqlstate)
 * unless it returns 'want'. */
static PGresult *ux(undo_ctx_t *u, const char *what, const char *sql, int n, const char *const *params,
                    const Oid *types, ExecStatusType want) {
  PGresult *res = PQexecParams(u->pg, sql, n, types, params, NULL, NULL, 0);
  if (PQresultStatus(res) == want) return res;
  rm__pg_error(u->err, u->errlen, what, u->pg, res);
  snprintf(u->sqlstate, sizeof(u->sqlstate), "%s", rm__sqlstate(res));
  if (PQstatus(u->pg) != CONNECTION_OK) u->bad = true;
  PQclear(res);
  return NULL;
}

/* Whether the last failure was an integrity constraint refusing the
 * statement (SQLSTATE class 23): data, not the database, so a retry
 * cannot help. */
static bool refused_by_constraint(const undo_ctx_t *u) { return strncmp(u->sqlstate, "23", 2) == 0; }

/* Append " WHERE "k1" = $first AND ..." for the columns of 'pk'. */
static int where_pk(PGconn *pg, txp_buf_t *sql, const rm_row_t *pk, int first) {
  int rc = 0;
  for (int k = 0; !rc && k < pk->n; k++) {
    char *q = PQescapeIdentifier(pg, pk->names[k], strlen(pk->names[k]));
    char num[32];
    snprintf(num, sizeof(num), " = $%d", first + k);
    rc = q ? txp_buf_append_str(sql, k ? " AND " : " WHERE ") : RM_E_NOMEM;
    if (!rc) rc = txp_buf_append_str(sql, q);
    if (!rc) rc = txp_buf_append_str(sql, num);
    PQfreemem(q);
  }
  return rc;
}

static int col_of(const rm_table_t *t, const char *name) {
  for (int i = 0; i < t->ncols; i++)
    if (strcmp(t->cols[i].name, name) == 0) return i;
  return -1;
}

/* Outcome of one item. */
enum { UNDO_OK = 0, UNDO_DIRTY = 1, UNDO_DB = 2, UNDO_FATAL = 3 };

static int undo_delta(undo_ctx_t *u, const rm_table_t *t, const rm_item_t *it) {
  int ci = col_of(t, it->col);
  if (ci < 0) {
    snprintf(u->err, u->errlen, "column \"%s\" of \"%s\".\"%s\" no longer exists: cannot undo a delta",
             it->col, it->schema, it->table);
    return UNDO_FATAL;
  }
  txp_buf_t sql;
  txp_buf_init(&sql, 0);
  int rc = txp_buf_append_str(&sql, "UPDATE ");
  if (!rc) rc = txp_buf_append_str(&sql, t->qname);
  if (!rc) rc = txp_buf_append_str(&sql, " SET ");
  if (!rc) rc = txp_buf_append_str(&sql, t->cols[ci].qname);
  if (!rc) rc = txp_buf_append_str(&sql, " = ");
  if (!rc) rc = txp_buf_append_str(&sql, t->cols[ci].qname);
  if (!rc) rc = txp_buf_append_str(&sql, " - $1");
  if (!rc) rc = where_pk(u->pg, &sql, it->pk, 2);
  if (!rc) rc = txp_buf_append_str(&sql, " RETURNING 1");
  const char **params = calloc((size_t)it->pk->n + 1, sizeof(char *));
  Oid *types = calloc((size_t)it->pk->n + 1, sizeof(Oid));
  if (rc || !params || !types) {
    txp_buf_free(&sql);
    free(params);
    free(types);
    snprintf(u->err, u->errlen, "out of memory");
    return UNDO_DB;
  }
  char d[32];
  snprintf(d, sizeof(d), "%lld", it->delta);
  params[0] = d;
  types[0] = INT8OID;
  for (int k = 0; k < it->pk->n; k++) params[k + 1] = it->pk->vals[k];
  PGresult *res = ux(u, "could not undo a delta", sql.data, it->pk->n + 1, params, types, PGRES_TUPLES_OK);
  txp_buf_free(&sql);
  free(params);
  free(types);
  if (!res) return UNDO_DB;
  int n = PQntuples(res);
  PQclear(res);
  if (n == 0) {
    rm_dirty_message(u->err, u->errlen, it, "after", NULL, NULL, NULL, 0);
    return UNDO_DIRTY;
  }
  return UNDO_OK;
}

/* SELECT * ... FOR UPDATE: the current row, or *cur = NULL if absent. */
static int lock_current(undo_ctx_t *u, const rm_table_t *t, const rm_item_t *it, rm_row_t **cur) {
  *cur = NULL;
  txp_buf_t sql;
  txp_buf_init(&sql, 0);
  int rc = txp_buf_append_str(&sql, "SELECT * FROM ");
  if (!rc) rc = txp_buf_append_str(&sql, t->qname);
  if (!rc) rc = where_pk(u->pg, &sql, it->pk, 1);
  if (!rc) rc = txp_buf_append_str(&sql, " FOR UPDATE");
  if (rc) {
    txp_buf_free(&sql);
    snprintf(u->err, u->errlen, "out of memory");
    return UNDO_DB;
  }
  PGresult *res = ux(u, "could not lock the row to undo", sql.data, it->pk->n,
                     (const char *const *)it->pk->vals, NULL, PGRES_TUPLES_OK);
  txp_buf_free(&sql);
  if (!res) return UNDO_DB;
  int n = PQntuples(res);
  if (n > 1) {
    PQclear(res);
    snprintf(u->err, u->errlen, "the key of \"%s\".\"%s\" matches %d rows", it->schema, it->table, n);
    return UNDO_FATAL;
  }
  if (n == 1 && !(*cur = rm__row_from_result(res, 0))) {
    PQclear(res);
    snprintf(u->err, u->errlen, "out of memory");
    return UNDO_DB;
  }
  PQclear(res);
  return UNDO_OK;
}

/* Run a write built in 'sql' with 'params'; expects one row touched. */
static int undo_write(undo_ctx_t *u, const char *what, txp_buf_t *sql, int n, const char *const *params) {
  PGresult *res = ux(u, what, sql->data, n, params, NULL, PGRES_COMMAND_OK);
  if (!res) return UNDO_DB;
  char tuples[32];
  snprintf(tuples, sizeof(tuples), "%s", PQcmdTuples(res));
  PQclear(res);
  if (strcmp(tuples, "1") != 0) {
    snprintf(u->err, u->errlen, "%s: the statement touched %s rows, not one", what, tuples);
    return UNDO_DB;
  }
  return UNDO_OK;
}

/* UPDATE t SET (changed columns) = before WHERE pk. */
static int restore_update(undo_ctx_t *u, const rm_table_t *t, const rm_item_t *it) {
  txp_buf_t sql;
  txp_buf_init(&sql, 0);
  int n = 0, rc = txp_buf_append_str(&sql, "UPDATE ");
  const char **params = calloc((size_t)it->before->n + (size_t)it->pk->n, sizeof(char *));
  if (!rc) rc = params ? txp_buf_append_str(&sql, t->qname) : RM_E_NOMEM;
  for (int i = 0; !rc && i < it->before->n; i++) {
    const char *name = it->before->names[i];
    int ai = rm_row_find(it->after, name), ci = col_of(t, name);
    if (ci < 0 || t->cols[ci].generated || rm_row_find(it->pk, name) >= 0) continue;
    if (ai >= 0 && rm_val_eq(it->after->vals[ai], it->before->vals[i])) continue;
    char num[32];
    snprintf(num, sizeof(num), " = $%d", n + 1);
    rc = txp_buf_append_str(&sql, n ? ", " : " SET ");
    if (!rc) rc = txp_buf_append_str(&sql, t->cols[ci].qname);
    if (!rc) rc = txp_buf_append_str(&sql, num);
    params[n++] = it->before->vals[i];
  }
  if (!rc && n == 0) { /* nothing changed: nothing to restore */
    txp_buf_free(&sql);
    free(params);
    return UNDO_OK;
  }
  if (!rc) rc = where_pk(u->pg, &sql, it->pk, n + 1);
  for (int k = 0; !rc && k < it->pk->n; k++) params[n + k] = it->pk->vals[k];
  if (rc) {
    txp_buf_free(&sql);
    free(params);
    snprintf(u->err, u->errlen, "out of memory");
    return UNDO_DB;
  }
  rc = undo_write(u, "could not restore the before image", &sql, n + it->pk->n, params);
  txp_buf_free(&sql);
  free(params);
  return rc;
}

/* INSERT the before image of a deleted row (generated columns excluded). */
static int restore_delete(undo_ctx_t *u, const rm_table_t *t, const rm_item_t *it) {
  txp_buf_t sql, vals;
  txp_buf_init(&sql, 0);
  txp_buf_init(&vals, 0);
  const char **params = calloc((size_t)it->before->n + 1, sizeof(char *));
  int n = 0, rc = params ? txp_buf_append_str(&sql, "INSERT INTO ") : RM_E_NOMEM;
  bool overriding = false;
  if (!rc) rc = txp_buf_append_str(&sql, t->qname);
  for (int i = 0; !rc && i < it->before->n; i++) {
    int ci = col_of(t, it->before->names[i]);
    if (ci < 0 || t->cols[ci].generated) continue;
    if (t->cols[ci].identity == 'a') overriding = true;
    char num[32];
    snprintf(num, sizeof(num), "%s$%d", n ? ", " : "", n + 1);
    rc = txp_buf_append_str(&sql, n ? ", " : " (");
    if (!rc) rc = txp_buf_append_str(&sql, t->cols[ci].qname);
    if (!rc) rc = txp_buf_append_str(&vals, num);
    params[n++] = it->before->vals[i];
  }
  if (!rc) rc = txp_buf_append_str(&sql, n ? ")" : " DEFAULT VALUES");
  if (!rc && overriding) rc = txp_buf_append_str(&sql, " OVERRIDING SYSTEM VALUE");
  if (!rc && n) {
    rc = txp_buf_append_str(&sql, " VALUES (");
    if (!rc) rc = txp_buf_append(&sql, vals.data, vals.len);
    if (!rc) rc = txp_buf_append_str(&sql, ")");
  }
  if (rc) {
    snprintf(u->err, u->errlen, "out of memory");
    rc = UNDO_DB;
  } else {
    rc = undo_write(u, "could not re-insert the deleted row", &sql, n, params);
  }
  txp_buf_free(&sql);
  txp_buf_free(&vals);
  free(params);
  return rc;
}

static int undo_insert_delete_row(undo_ctx_t *u, const rm_table_t *t, const rm_item_t *it) {
  txp_buf_t sql;
  txp_buf_init(&sql, 0);
  int rc = txp_buf_append_str(&sql, "DELETE FROM ");
  if (!rc) rc = txp_buf_append_str(&sql, t->qname);
  if (!rc) rc = where_pk(u->pg, &sql, it->pk, 1);
  if (rc) {
    txp_buf_free(&sql);
    snprintf(u->err, u->errlen, "out of memory");
    return UNDO_DB;
  }
  rc = undo_write(u, "could not delete the inserted row", &sql, it->pk->n, (const char *const *)it->pk->vals);
  txp_buf_free(&sql);
  return rc;
}

/* Dirty: describe how 'cur' differs from 'expect'. */
static int dirty(undo_ctx_t *u, const rm_item_t *it, const char *expect_name, const rm_row_t *expect,
                 const rm_row_t *cur) {
  int diff[64];
  int nd = expect && cur ? rm_row_diff(expect, cur, diff, 64) : 0;
  rm_dirty_message(u->err, u->errlen, it, expect_name, expect, cur, diff, nd < 64 ? nd : 64);
  return UNDO_DIRTY;
}

static int undo_item(undo_ctx_t *u, const rm_item_t *it) {
  if (it->op == RM_OP_COMMIT_DELTA) return UNDO_OK; /* never applied: nothing to undo */
  const rm_table_t *t = NULL;
  int rc = rm__table_get(u->r, u->pg, it->schema, it->table, &t, u->err, u->errlen);
  if (rc == RM_E_DB || rc == RM_E_NOMEM) {
    if (PQstatus(u->pg) != CONNECTION_OK) u->bad = true;
    return UNDO_DB;
  }
  if (rc != 0) return UNDO_FATAL; /* table gone, or no longer has a key */
  if (it->op == RM_OP_DELTA) return undo_delta(u, t, it);

  rm_row_t *cur = NULL;
  if ((rc = lock_current(u, t, it, &cur)) != UNDO_OK) return rc;
  switch (it->op) {
  case RM_OP_INSERT:
    if (!cur) rc = UNDO_OK; /* already gone */
    else if (rm_row_diff(it->after, cur, NULL, 0) == 0) rc = undo_insert_delete_row(u, t, it);
    else rc = dirty(u, it, "after", it->after, cur);
    break;
  case RM_OP_UPDATE:
    if (!cur) rc = dirty(u, it, "after", it->after, NULL);
    else if (rm_row_diff(it->after, cur, NULL, 0) == 0) rc = restore_update(u, t, it);
    else if (rm_row_diff(it->before, cur, NULL, 0) == 0) rc = UNDO_OK; /* already undone */
    else rc = dirty(u, it, "after", it->after, cur);
    break;
  case RM_OP_DELETE:
    if (!cur) rc = restore_delete(u, t, it);
    else if (rm_row_diff(it->before, cur, NULL, 0) == 0) rc = UNDO_OK; /* already restored */
    else rc = dirty(u, it, "before", it->before, cur);
    break;
  default:
    snprintf(u->err, u->errlen, "unknown undo op");
    rc = UNDO_FATAL;
  }
  rm_row_free(cur);
  return rc;
}

/* SET LOCAL the recorded settings in one statement; 'relaxed' adds
 * synchronous_commit = off to them (a commit with commit deltas: see
 * commit_apply_on). */
static int apply_settings(undo_ctx_t *u, const rm_ctx_t *ctx, bool relaxed) {
  if (ctx->nsettings == 0 && !relaxed) return UNDO_OK;
  txp_buf_t sql;
  txp_buf_init(&sql, 0);
  const char *params[2 * RM_CTX_MAX_SETTINGS];
  int rc = txp_buf_append_str(&sql, "SELECT ");
  for (int i = 0; !rc && i < ctx->nsettings; i++) {
    char f[64];
    snprintf(f, sizeof(f), "%spg_catalog.set_config($%d, $%d, true)", i ? ", " : "", 2 * i + 1, 2 * i + 2);
    rc = txp_buf_append_str(&sql, f);
    params[2 * i] = ctx->names[i];
    params[2 * i + 1] = ctx->values[i];
  }
  if (!rc && relaxed)
    rc = txp_buf_append_str(&sql, ctx->nsettings ? ", pg_catalog.set_config('synchronous_commit', 'off', true)"
                                                 : "pg_catalog.set_config('synchronous_commit', 'off', true)");
  if (rc) {
    txp_buf_free(&sql);
    snprintf(u->err, u->errlen, "out of memory");
    return UNDO_DB;
  }
  PGresult *res = ux(u, "could not apply the session settings of the undo log", sql.data, 2 * ctx->nsettings,
                     params, NULL, PGRES_TUPLES_OK);
  txp_buf_free(&sql);
  if (!res) return UNDO_DB;
  PQclear(res);
  return UNDO_OK;
}

/*
 * The outcome of a failed item of a commit or rollback: a dirty write, an
 * undo that cannot be read or applied, or a statement an integrity
 * constraint refused are for an operator (unretryable; the message says
 * what to do); anything else (the database down, a lock timeout) is
 * retried.  Returns the branch status, sets *code.
 */
static int item_failure(undo_ctx_t *u, int rc, bool commit, int *code) {
  int retry = commit ? TXP_BS_PHASE2_COMMIT_FAILED_RETRYABLE : TXP_BS_PHASE2_ROLLBACK_FAILED_RETRYABLE;
  int fail = commit ? TXP_BS_PHASE2_COMMIT_FAILED_UNRETRYABLE : TXP_BS_PHASE2_ROLLBACK_FAILED_UNRETRYABLE;
  if (rc == UNDO_DIRTY) {
    *code = RM_E_DIRTY_WRITE;
    return fail;
  }
  if (rc == UNDO_DB && refused_by_constraint(u)) {
    size_t l = strlen(u->err);
    snprintf(u->err + l, u->errlen - l,
             " (SQLSTATE %s: the row was changed outside the global transaction; repair it, then re-drive the "
             "global transaction with tcctl)", u->sqlstate);
    rc = UNDO_FATAL;
  }
  if (rc == UNDO_FATAL) {
    *code = TXP_EBRANCH_UNRETRYABLE;
    return fail;
  }
  *code = RM_E_DB;
  return retry;
}

/* The context and items of undo row 'row' (SELECT id, log_status,
 * context, rollback_info::text) of branch 'bid'.  0, or -1 with the
 * message set: the row cannot be read, which no retry cures. */
static int parse_undo_row(undo_ctx_t *u, const PGresult *row, const char *bid, rm_ctx_t *ctx, rm_item_t **items,
                          size_t *nitems) {
  char why[512];
  if (rm_ctx_parse(PQgetisnull(row, 0, 2) ? NULL : PQgetvalue(row, 0, 2), ctx) == 0 &&
      rm_undo_decode(PQgetisnull(row, 0, 3) ? NULL : PQgetvalue(row, 0, 3), items, nitems, why, sizeof(why)) == 0)
    return 0;
  if (!ctx->version) snprintf(why, sizeof(why), "unknown context \"%.100s\"", PQgetvalue(row, 0, 2));
  snprintf(u->err, u->errlen, "undo row of branch %s of \"%s\" cannot be read: %s", bid, u->req->xid, why);
  return -1;
}

static bool same_row_item(const rm_item_t *a, const rm_item_t *b) {
  return strcmp(a->schema, b->schema) == 0 && strcmp(a->table, b->table) == 0 && a->pk->n == b->pk->n &&
         rm_row_diff(a->pk, b->pk, NULL, 0) == 0;
}

/* Apply the commit_delta items of items[first]'s row (items[first] is the
 * first of its row): UPDATE t SET c = c + $1, ... WHERE pk RETURNING 1,
 * the deltas of one column summed. */
static int apply_row_deltas(undo_ctx_t *u, const rm_item_t *items, size_t n, size_t first) {
  const rm_item_t *it = &items[first];
  const rm_table_t *t = NULL;
  int rc = rm__table_get(u->r, u->pg, it->schema, it->table, &t, u->err, u->errlen);
  if (rc == RM_E_DB || rc == RM_E_NOMEM) {
    if (PQstatus(u->pg) != CONNECTION_OK) u->bad = true;
    return UNDO_DB;
  }
  if (rc != 0) return UNDO_FATAL; /* table gone, or no longer has a key */
  int *cols = calloc(n, sizeof(int));
  long long *sums = calloc(n, sizeof(long long));
  char (*txt)[32] = calloc(n, 32);
  const char **params = calloc(n + (size_t)it->pk->n, sizeof(char *));
  Oid *types = calloc(n + (size_t)it->pk->n, sizeof(Oid));
  txp_buf_t sql;
  txp_buf_init(&sql, 0);
  int ncols = 0, out = UNDO_OK;
  if (!cols || !sums || !txt || !params || !types) {
    snprintf(u->err, u->errlen, "out of memory");
    out = UNDO_DB;
    goto done;
  }
  for (size_t k = first; k < n; k++) {
    const rm_item_t *e = &items[k];
    if (e->op != RM_OP_COMMIT_DELTA || !same_row_item(it, e)) continue;
    int ci = col_of(t, e->col);
    if (ci < 0) {
      snprintf(u->err, u->errlen, "column \"%s\" of \"%s\".\"%s\" no longer exists: cannot apply a commit delta",
               e->col, e->schema, e->table);
      out = UNDO_FATAL;
      goto done;
    }
    int j = 0;
    while (j < ncols && cols[j] != ci) j++;
    if (j == ncols) cols[ncols++] = ci;
    if (__builtin_add_overflow(sums[j], e->delta, &sums[j])) {
      snprintf(u->err, u->errlen, "the commit deltas of \"%s\".\"%s\" overflow", e->table, e->col);
      out = UNDO_FATAL;
      goto done;
    }
  }
  rc = txp_buf_append_str(&sql, "UPDATE ");
  if (!rc) rc = txp_buf_append_str(&sql, t->qname);
  for (int j = 0; !rc && j < ncols; j++) {
    char num[32];
    snprintf(num, sizeof(num), " + $%d", j + 1);
    rc = txp_buf_append_str(&sql, j ? ", " : " SET ");
    if (!rc) rc = txp_buf_append_str(&sql, t->cols[cols[j]].qname);
    if (!rc) rc = txp_buf_append_str(&sql, " = ");
    if (!rc) rc = txp_buf_append_str(&sql, t->cols[cols[j]].qname);
    if (!rc) rc = txp_buf_append_str(&sql, num);
    snprintf(txt[j], 32, "%lld", sums[j]);
    params[j] = txt[j];
    types[j] = INT8OID;
  }
  if (!rc) rc = where_pk(u->pg, &sql, it->pk, ncols + 1);
  if (!rc) rc = txp_buf_append_str(&sql, " RETURNING 1");
  for (int k = 0; k < it->pk->n; k++) params[ncols + k] = it->pk->vals[k];
  if (rc) {
    snprintf(u->err, u->errlen, "out of memory");
    out = UNDO_DB;
    goto done;
  }
  PGresult *res = ux(u, "could not apply a commit delta", sql.data, ncols + it->pk->n, params, types, PGRES_TUPLES_OK);
  if (!res) {
    out = UNDO_DB;
    goto done;
  }
  if (PQntuples(res) != 1) {
    snprintf(u->err, u->errlen,
             "the row of \"%s\".\"%s\" that a commit delta of the branch changes is gone: the give-back cannot be "
             "applied; restore the row or account for it by hand, then re-drive the global transaction",
             it->schema, it->table);
    out = UNDO_FATAL;
  }
  PQclear(res);
done:
  txp_buf_free(&sql);
  free(cols);
  free(sums);
  free(txt);
  free(params);
  free(types);
  return out;
}

/*
 * The commit of a branch whose undo row carries commit deltas, in ONE
 * local transaction on 'u->pg' (NOTES): lock the row, apply its
 * commit_delta items, delete it, commit.  No row (or a guard): applied
 * before, or nothing to apply.  Returns a branch status, sets *code.
 */
static int commit_apply_on(undo_ctx_t *u, int *code) {
  const rm_phase2_req_t *req = u->req;
  char bid[32];
  snprintf(bid, sizeof(bid), "%lld", (long long)req->branch_id);
  const char *key[2] = {req->xid, bid};
  PGresult *row = NULL, *res = NULL;
  rm_item_t *items = NULL;
  size_t nitems = 0;
  rm_ctx_t ctx = {0};
  int status = TXP_BS_PHASE2_COMMIT_FAILED_RETRYABLE;
  *code = RM_E_DB;

  if (!(res = ux(u, "could not begin the commit", "BEGIN", 0, NULL, NULL, PGRES_COMMAND_OK))) goto out;
  PQclear(res);
  /* The row goes first (locked, and gone for everyone once we commit): if
   * a delta cannot be applied, the ROLLBACK brings it back. */
  if (!(row = ux(u, "could not take the undo row",
                 "DELETE FROM undo_log WHERE xid = $1 AND branch_id = $2 AND log_status = 0"
                 " RETURNING id, log_status, context, rollback_info::text",
                 2, key, NULL, PGRES_TUPLES_OK)))
    goto out;
  if (PQntuples(row) != 1) {
    *code = 0; /* committed before, or a guard row: nothing to apply */
    status = TXP_BS_PHASE2_COMMITTED;
    goto out;
  }
  if (parse_undo_row(u, row, bid, &ctx, &items, &nitems) != 0) {
    *code = TXP_EBRANCH_UNRETRYABLE;
    status = TXP_BS_PHASE2_COMMIT_FAILED_UNRETRYABLE;
    goto out;
  }
  if (apply_settings(u, &ctx, true) != UNDO_OK) goto out;
  for (size_t i = 0; i < nitems; i++) {
    if (items[i].op != RM_OP_COMMIT_DELTA) continue;
    bool first = true;
    for (size_t k = 0; k < i && first; k++)
      first = !(items[k].op == RM_OP_COMMIT_DELTA && same_row_item(&items[i], &items[k]));
    if (!first) continue;
    int rc = apply_row_deltas(u, items, nitems, i);
    if (rc != UNDO_OK) {
      status = item_failure(u, rc, true, code);
      goto out;
    }
  }
  if (!(res = ux(u, "could not commit", "COMMIT", 0, NULL, NULL, PGRES_COMMAND_OK))) goto out;
  PQclear(res);
  *code = 0;
  status = TXP_BS_PHASE2_COMMITTED;
  rm__log(u->r->st->c, RM_LOG_DEBUG, "committed branch %s of \"%s\" on \"%s\" with its commit deltas", bid,
          req->xid, u->r->id);

out:
  if (PQtransactionStatus(u->pg) != PQTRANS_IDLE) {
    PGresult *rb = PQexec(u->pg, "ROLLBACK");
    if (PQresultStatus(rb) != PGRES_COMMAND_OK) u->bad = true;
    PQclear(rb);
  }
  if (PQstatus(u->pg) != CONNECTION_OK) u->bad = true;
  PQclear(row);
  rm_undo_free(items, nitems);
  rm_ctx_clear(&ctx);
  return status;
}

/* commit_apply_on for (xid, bid) on 'pg' (idle), with its outcome logged:
 * a failure that needs an operator as an error.  *bad: 'pg' must not go
 * back to its pool.  Returns the branch status. */
static int commit_marked(rm_at_resource_t *r, PGconn *pg, const char *xid, int64_t bid, bool *bad, int *code,
                         char *err, size_t errlen) {
  rm_phase2_req_t req = {.commit = true, .xid = xid, .branch_id = bid, .resource_id = r->id,
                         .branch_type = TXP_BT_AT};
  undo_ctx_t u = {.r = r, .pg = pg, .req = &req, .err = err, .errlen = errlen};
  int status = commit_apply_on(&u, code);
  *bad = *bad || u.bad;
  if (status == TXP_BS_PHASE2_COMMIT_FAILED_UNRETRYABLE)
    rm__log(r->st->c, RM_LOG_ERROR, "commit of branch %lld of \"%s\" on \"%s\" failed for good: %s",
            (long long)bid, xid, r->id, err);
  else if (status != TXP_BS_PHASE2_COMMITTED)
    rm__log(r->st->c, RM_LOG_WARN,
            "could not commit branch %lld of \"%s\" on \"%s\" (its commit deltas): %s; will retry", (long long)bid,
            xid, r->id, err);
  return status;
}

/* The whole rollback on 'u->pg'; returns a branch status, sets *code. */
static int rollback_on(undo_ctx_t *u, int *code) {
  const rm_phase2_req_t *req = u->req;
  rm_client_t *c = u->r->st->c;
  char bid[32];
  snprintf(bid, sizeof(bid), "%lld", (long long)req->branch_id);
  const char *key[2] = {req->xid, bid};
  PGresult *row = NULL, *res = NULL;
  rm_item_t *items = NULL;
  size_t nitems = 0;
  rm_ctx_t ctx = {0};
  int status = TXP_BS_PHASE2_ROLLBACK_FAILED_RETRYABLE;
  *code = RM_E_DB;

  if (!(res = ux(u, "could not begin the rollback", "BEGIN", 0, NULL, NULL, PGRES_COMMAND_OK))) goto out;
  PQclear(res);
  for (int attempt = 0; attempt < 3 && !row; attempt++) {
    row = ux(u, "could not read the undo log",
             "SELECT id, log_status, context, rollback_info::text FROM undo_log"
             " WHERE xid = $1 AND branch_id = $2 FOR UPDATE",
             2, key, NULL, PGRES_TUPLES_OK);
    if (!row) goto out;
    if (PQntuples(row) == 1) break;
    PQclear(row);
    row = NULL;
    /* 1. No undo row: fence the branch with the guard. */
    res = ux(u, "could not write the guard row",
             "INSERT INTO undo_log (xid, branch_id, context, rollback_info, log_status)"
             " VALUES ($1, $2, 'guard', NULL, 1) ON CONFLICT (xid, branch_id) DO NOTHING RETURNING id",
             2, key, NULL, PGRES_TUPLES_OK);
    if (!res) goto out;
    bool inserted = PQntuples(res) == 1;
    PQclear(res);
    if (inserted) {
      if (!(res = ux(u, "could not commit the guard row", "COMMIT", 0, NULL, NULL, PGRES_COMMAND_OK))) goto out;
      PQclear(res);
      rm__log(c, RM_LOG_INFO,
              "rollback of branch %s of \"%s\" on \"%s\": no undo row (never committed locally); "
              "guard written",
              bid, req->xid, u->r->id);
      *code = 0;
      return TXP_BS_PHASE2_ROLLBACKED;
    }
    /* Conflict: the branch's local commit landed meanwhile; read again. */
  }
  if (!row) {
    snprintf(u->err, u->errlen, "the undo row of branch %s of \"%s\" keeps appearing and vanishing", bid, req->xid);
    goto out;
  }
  if (strcmp(PQgetvalue(row, 0, 1), "0") != 0) {
    /* A guard (this branch was already rolled back, or fenced): done. */
    *code = 0;
    status = TXP_BS_PHASE2_ROLLBACKED;
    goto out;
  }

  /* 2. Settings, then 3. the items backwards. */
  if (parse_undo_row(u, row, bid, &ctx, &items, &nitems) != 0) {
    *code = TXP_EBRANCH_UNRETRYABLE;
    status = TXP_BS_PHASE2_ROLLBACK_FAILED_UNRETRYABLE;
    goto out;
  }
  if (apply_settings(u, &ctx, false) != UNDO_OK) goto out;
  for (size_t i = nitems; i-- > 0;) {
    int rc = undo_item(u, &items[i]);
    if (rc == UNDO_OK) continue;
    status = item_failure(u, rc, false, code);
    goto out;
  }

  /* 4. The undo row goes; commit. */
  const char *id[1] = {PQgetvalue(row, 0, 0)};
  if (!(res = ux(u, "could not delete the undo row", "DELETE FROM undo_log WHERE id = $1", 1, id, NULL,
                 PGRES_COMMAND_OK)))
    goto out;
  PQclear(res);
  if (!(res = ux(u, "could not commit the rollback", "COMMIT", 0, NULL, NULL, PGRES_COMMAND_OK))) goto out;
  PQclear(res);
  *code = 0;
  status = TXP_BS_PHASE2_ROLLBACKED;
  rm__log(c, RM_LOG_DEBUG, "rolled back branch %s of \"%s\" on \"%s\" (%zu item(s))", bid, req->xid,
          u->r->id, nitems);

out:
  /* Anything not committed above is rolled back: nothing half-done stays. */
  if (PQtransactionStatus(u->pg) != PQTRANS_IDLE) {
    PGresult *rb = PQexec(u->pg, "ROLLBACK");
    if (PQresultStatus(rb) != PGRES_COMMAND_OK) u->bad = true;
    PQclear(rb);
  }
  if (PQstatus(u->pg) != CONNECTION_OK) u->bad = true;
  PQclear(row);
  rm_undo_free(items, nitems);
  rm_ctx_clear(&ctx);
  return status;
}

/* -------------------------------------------------------------- entry */

/* Index of (xid, bid) among r's remembered branches, or -1; st->mu held. */
static long inline_find(const rm_at_resource_t *r, const char *xid, int64_t bid) {
  for (size_t i = 0; i < r->ninl; i++)
    if (r->inl[i].branch_id == bid && strcmp(r->inl[i].xid, xid) == 0) return (long)i;
  return -1;
}

void rm__at_inline_add(rm_at_resource_t *r, const char *xid, int64_t bid) {
  rm_at_state_t *st = r->st;
  if (strlen(xid) > TXP_MAX_XID_LEN) return;
  int64_t now = now_ms();
  pthread_mutex_lock(&st->mu);
  if (!r->inl) r->inl = calloc(RM_AT_INLINE_MAX, sizeof(*r->inl));
  if (r->inl && r->ninl == RM_AT_INLINE_MAX) { /* full: forget the stale ones */
    size_t w = 0;
    for (size_t i = 0; i < r->ninl; i++)
      if (now - r->inl[i].added_ms < INLINE_STALE_MS) r->inl[w++] = r->inl[i];
    r->ninl = w;
  }
  if (r->inl && r->ninl < RM_AT_INLINE_MAX && inline_find(r, xid, bid) < 0) {
    struct rm_inline_key *k = &r->inl[r->ninl++];
    snprintf(k->xid, sizeof(k->xid), "%s", xid);
    k->branch_id = bid;
    k->added_ms = now;
  }
  pthread_mutex_unlock(&st->mu);
}

/* Forget (xid, bid); st->mu held.  Whether it was remembered. */
static bool inline_take_locked(rm_at_resource_t *r, const char *xid, int64_t bid) {
  long i = inline_find(r, xid, bid);
  if (i < 0) return false;
  r->inl[i] = r->inl[--r->ninl];
  return true;
}

void rm__at_inline_remove(rm_at_resource_t *r, const char *xid, int64_t bid) {
  pthread_mutex_lock(&r->st->mu);
  inline_take_locked(r, xid, bid);
  pthread_mutex_unlock(&r->st->mu);
}

/* Queue the undo row of committed branch (xid, bid) for the deleter.
 * False when the queue is full (or out of memory): delete it inline; and
 * when this client remembers the branch for an inline commit (its commit
 * deltas are applied at once, by rm__at_phase2). */
static bool enqueue_commit(rm_at_resource_t *r, const char *xid, int64_t bid) {
  rm_at_state_t *st = r->st;
  pthread_mutex_lock(&st->mu);
  bool remembered = r->ninl > 0 && inline_find(r, xid, bid) >= 0;
  pthread_mutex_unlock(&st->mu);
  if (remembered) return false;
  char *x = strdup(xid);
  if (!x) return false;
  pthread_mutex_lock(&st->mu);
  bool queued = queue_push(r, st->tune.queue_max, x, bid);
  if (queued && r->qlen >= st->tune.delete_batch) {
    st->kick = true;
    pthread_cond_broadcast(&st->cv);
  }
  pthread_mutex_unlock(&st->mu);
  if (!queued) free(x);
  return queued;
}

bool rm__at_commit_queued(rm_client_t *c, const rm_phase2_req_t *req) {
  size_t xl = req && req->xid ? strlen(req->xid) : 0;
  if (!c || !req || !req->commit || req->branch_type != TXP_BT_AT || xl == 0 || xl > TXP_MAX_XID_LEN ||
      !req->resource_id)
    return false;
  rm_at_resource_t *r = rm__at_resource_find(c, req->resource_id);
  if (!r) return false;
  return enqueue_commit(r, req->xid, req->branch_id);
}

int rm__at_phase2(rm_client_t *c, const rm_phase2_req_t *req, int *code, char *errmsg, size_t errlen) {
  int scratch_code;
  char scratch[1];
  if (!code) code = &scratch_code;
  if (!errmsg || errlen == 0) {
    errmsg = scratch;
    errlen = sizeof(scratch);
  }
  *code = 0;
  errmsg[0] = '\0';
  bool commit = req && req->commit;
  int ok = commit ? TXP_BS_PHASE2_COMMITTED : TXP_BS_PHASE2_ROLLBACKED;
  int retry = commit ? TXP_BS_PHASE2_COMMIT_FAILED_RETRYABLE : TXP_BS_PHASE2_ROLLBACK_FAILED_RETRYABLE;
  int fail = commit ? TXP_BS_PHASE2_COMMIT_FAILED_UNRETRYABLE : TXP_BS_PHASE2_ROLLBACK_FAILED_UNRETRYABLE;
  size_t xl = req && req->xid ? strlen(req->xid) : 0;
  if (!c || !req || xl == 0 || xl > TXP_MAX_XID_LEN || !req->resource_id) {
    *code = RM_E_INVALID;
    snprintf(errmsg, errlen, "invalid phase-two request (xid or resource missing or too long)");
    return fail;
  }
  if (req->branch_type != TXP_BT_AT) {
    *code = RM_E_NOT_SUPPORTED;
    snprintf(errmsg, errlen, "branch type %s is not served by the AT resource manager",
             txp_branch_type_name(req->branch_type));
    return fail;
  }
  rm_at_resource_t *r = rm__at_resource_find(c, req->resource_id);
  if (!r) {
    *code = RM_E_INVALID;
    snprintf(errmsg, errlen, "resource \"%s\" is not served by this client", req->resource_id);
    return retry;
  }

  if (commit) {
    pthread_mutex_lock(&r->st->mu);
    bool remembered = r->ninl > 0 && inline_take_locked(r, req->xid, req->branch_id);
    pthread_mutex_unlock(&r->st->mu);
    if (remembered) {
      /* Commit deltas: apply them now and answer with the outcome. */
      undo_ctx_t u = {.r = r, .req = req, .err = errmsg, .errlen = errlen};
      if (pool_get(r, &u.pg, errmsg, errlen) != 0) {
        rm__at_inline_add(r, req->xid, req->branch_id); /* the TC retries the commit */
        *code = RM_E_DB;
        return retry;
      }
      int status = commit_apply_on(&u, code);
      pool_put(r, u.pg, u.bad);
      if (status == TXP_BS_PHASE2_COMMIT_FAILED_RETRYABLE) rm__at_inline_add(r, req->xid, req->branch_id);
      if (status == TXP_BS_PHASE2_COMMIT_FAILED_UNRETRYABLE)
        rm__log(c, RM_LOG_ERROR, "commit of branch %lld of \"%s\" on \"%s\" failed for good: %s",
                (long long)req->branch_id, req->xid, r->id, errmsg);
      return status;
    }
    if (!enqueue_commit(r, req->xid, req->branch_id)) {
      /* Queue full: commit inline.  The answer is Committed either way:
       * the decision is made; a row left behind is resolved later (a
       * marked one applied by the leftover pass, a plain one deleted). */
      char err[1024] = "";
      char xid[TXP_MAX_XID_LEN + 1]; /* length checked above */
      snprintf(xid, sizeof(xid), "%s", req->xid);
      rm_undo_key_t k = {xid, req->branch_id};
      int rc = finish_commits(r, &k, 1, err, sizeof(err));
      if (rc != 0)
        rm__log(c, RM_LOG_WARN, "could not delete the undo row of committed branch %lld of \"%s\": %s",
                (long long)req->branch_id, req->xid, err[0] ? err : rm_strerror(rc));
    }
    return ok;
  }

  rm__at_inline_remove(r, req->xid, req->branch_id); /* no commit will come */
  undo_ctx_t u = {.r = r, .req = req, .err = errmsg, .errlen = errlen};
  int rc = pool_get(r, &u.pg, errmsg, errlen);
  if (rc != 0) {
    *code = RM_E_DB;
    return retry;
  }
  int status = rollback_on(&u, code);
  pool_put(r, u.pg, u.bad);
  /* Retryable failures are logged by the core with its answer; one that
   * needs an operator (a dirty write) is an error in its own right. */
  if (status == TXP_BS_PHASE2_ROLLBACK_FAILED_UNRETRYABLE)
    rm__log(c, RM_LOG_ERROR, "rollback of branch %lld of \"%s\" on \"%s\" failed for good: %s",
            (long long)req->branch_id, req->xid, r->id, errmsg);
  return status;
}
