/*
 * rm_at.c - AT-mode branches on the caller's PostgreSQL connection: the
 * branch's life (rm_at_open, rm_at_prepare, rm_at_close, its errors) and
 * the libpq helpers the AT files share.  The statements are in
 * rm_at_stmt.c (on the frame of rm_at_frame.c), resources and table
 * metadata in rm_at_meta.c, phase two in rm_undo.c.
 *
 * NOTES
 *   Phase one of an AT branch, all inside the caller's local transaction
 *   on the caller's PGconn (the caller ran BEGIN, or left the connection
 *   idle: then the branch's first round trip carries the BEGIN,
 *   rm__at_pipe_run):
 *
 *     1. rm_at_open: check the connection is idle, in a transaction block
 *        or not; no database call.
 *     2. rm_at_insert / _update / _delete / _update_delta /
 *        _update_delta_deferred / _update_delta_on_commit (rm_at_stmt.c:
 *        what each runs, which deltas may run in phase one, and the
 *        round trips), each inside a SAVEPOINT of its own.  Each adds an
 *        undo item and (except the deltas) the lock key "table:pk".  On
 *        any failure the call rolls back to its savepoint: the row changes
 *        of that call are undone and the caller's transaction stays
 *        usable, as if the call had not been made.
 *     3. rm_at_prepare: BranchRegister with the lock keys (the TC makes a
 *        busy lock wait, up to the lock-wait timeout); then the deferred
 *        delta UPDATEs, in one pipeline under one savepoint (a refusing
 *        guard rolls them back and prepare fails with RM_E_GUARD: the
 *        caller rolls back, close reports PhaseOneFailed); then INSERT the
 *        undo_log row in the caller's transaction (after deferred updates,
 *        pipelined behind their RELEASE), so a hot row updated by a
 *        deferred delta stays locked only for the UPDATE, this INSERT and
 *        the caller's COMMIT.  The INSERT runs without
 *        a savepoint on purpose: if it fails (typically on the unique key
 *        because a rollback of this branch already left its guard row: the
 *        anti-suspension fence) the caller's transaction is aborted, so no
 *        COMMIT can make the business change durable.
 *     4. The caller COMMITs (or not) and calls rm_at_close, which reports
 *        PhaseOneFailed to the TC for a registered branch that did not
 *        commit.
 *
 *   Crash windows: dying after 3's register and before the COMMIT leaves a
 *   branch at the TC with no undo row: the global transaction times out,
 *   the rollback finds no undo row and writes the guard (rm_undo.c).  Dying
 *   after the COMMIT: the undo row is durable with the change, whatever
 *   the TC decides is applied to it.
 *
 *   Threads: a branch belongs to one thread at a time (as does the caller's
 *   PGconn); everything shared (resources, metadata) is locked.
 */
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rm_at_int.h"
#include "txc_failpoint.h"
#include "txp_status.h"

void (*rm__at_failpoint_after_register)(rm_branch_t *b, int64_t branch_id, void *arg) = NULL;
void *rm__at_failpoint_arg = NULL;

/* ------------------------------------------------------------- helpers */

/* ------------------------------------------------------ open and close */

static bool xid_ok(const char *xid) {
  size_t n = xid ? strlen(xid) : 0;
  return n >= 1 && n <= TXP_MAX_XID_LEN;
}

int rm_at_open(rm_client_t *c, const char *xid, const char *resource_id, PGconn *pg,
               rm_branch_t **out) {
  if (out) *out = NULL;
  if (!c || !xid || !resource_id || !pg || !out)
    return rm__fail(RM_E_INVALID, "could not open a branch: the client, xid, resource id, connection or out is NULL");
  if (!xid_ok(xid))
    return rm__fail(RM_E_INVALID, "could not open a branch: the xid is empty or longer than %d bytes",
                    TXP_MAX_XID_LEN);
  rm_at_resource_t *r = rm__at_resource_find(c, resource_id);
  if (!r) {
    rm__fail(RM_E_INVALID, "could not open a branch of \"%s\": resource \"%s\" was not added (call "
             "rm_resource_add first)", xid, resource_id);
    rm__log(c, RM_LOG_ERROR, "%s", rm_errmsg());
    return RM_E_INVALID;
  }
  if (PQstatus(pg) != CONNECTION_OK)
    return rm__fail(RM_E_STATE, "could not open a branch of \"%s\" on \"%s\": the connection is not open", xid,
                    resource_id);
  PGTransactionStatusType ts = PQtransactionStatus(pg);
  if (ts != PQTRANS_INTRANS && ts != PQTRANS_IDLE)
    return rm__fail(RM_E_STATE,
                    "could not open a branch of \"%s\" on \"%s\": the connection must be idle, inside a "
                    "transaction block or not (not in a failed or busy transaction)", xid, resource_id);
  const char *enc = PQparameterStatus(pg, "client_encoding");
  if (!enc || strcmp(enc, "UTF8") != 0) {
    rm__fail(RM_E_NOT_SUPPORTED, "could not open a branch of \"%s\": client_encoding is \"%s\", not UTF8", xid,
             enc ? enc : "?");
    rm__log(c, RM_LOG_ERROR, "%s", rm_errmsg());
    return RM_E_NOT_SUPPORTED;
  }
  rm_branch_t *b = calloc(1, sizeof(*b));
  if (!b || !(b->undo = json_array())) {
    free(b);
    return rm__fail(RM_E_NOMEM, "could not open a branch of \"%s\": out of memory", xid);
  }
  b->c = c;
  b->res = r;
  b->pg = pg;
  b->begin_pending = ts == PQTRANS_IDLE;
  snprintf(b->xid, sizeof(b->xid), "%s", xid);
  txp_buf_init(&b->lock_keys, TXP_MAX_LOCK_KEYS_LEN);
  *out = b;
  return 0;
}

int rm_at_open_registered(rm_client_t *c, const char *xid, const char *resource_id, int64_t branch_id, PGconn *pg,
                          rm_branch_t **out) {
  int rc = rm_at_open(c, xid, resource_id, pg, out);
  if (rc != 0 || branch_id <= 0) return rc; /* 0: registered by its prepare, as usual */
  (*out)->registered = true;
  (*out)->registered_first = true;
  (*out)->branch_id = branch_id;
  return 0;
}

int rm_at_open_rehearsal(rm_client_t *c, const char *resource_id, PGconn *pg, rm_branch_t **out) {
  int rc = rm_at_open(c, RM_AT_REHEARSAL_XID, resource_id, pg, out);
  if (rc == 0) (*out)->rehearsal = true;
  return rc;
}

/* How the local transaction ends where a branch commits: a rehearsal
 * rolls it back. */
static const char *end_word(const rm_branch_t *b) { return b->rehearsal ? "ROLLBACK" : "COMMIT"; }

int rm_at_statement_savepoints(rm_branch_t *b, bool on) {
  if (!b) return rm__fail(RM_E_INVALID, "could not set statement savepoints: the branch is NULL");
  if (b->state != RM_BRANCH_OPEN || b->nitems + b->ndeferred > 0) {
    rm__at_err(b, "statement savepoints are set before the branch's first statement");
    return rm__fail(RM_E_STATE, "%s", b->errmsg);
  }
  b->no_savepoints = !on;
  return 0;
}

static void branch_free(rm_branch_t *b) {
  for (size_t i = 0; i < b->ndeferred; i++) rm__at_deferred_clear(&b->deferred[i]);
  free(b->deferred);
  rm__at_deferred_insert_free(b->dins);
  json_decref(b->undo);
  txp_buf_free(&b->lock_keys);
  free(b);
}

/* The early registration's answer (rm_at_register_early), once: 0 with
 * b->branch_id set, or the code (b->errmsg set). */
static int registration_wait(rm_branch_t *b) {
  if (!b->pending_reg) return 0;
  int64_t bid = 0;
  int rc = rm__branch_register_wait(b->c, b->pending_reg, &bid, b->errmsg, sizeof(b->errmsg));
  b->pending_reg = NULL;
  if (rc != 0) return rc;
  b->registered = true;
  b->branch_id = bid;
  return 0;
}

int rm_at_register_early(rm_branch_t *b) {
  if (!b) return rm__fail(RM_E_INVALID, "could not register a branch early: the branch is NULL");
  if (b->state != RM_BRANCH_OPEN || b->registered_first || b->nitems + b->ndeferred > 0) {
    rm__at_err(b, "a branch is registered early only right after rm_at_open, before its statements");
    return rm__fail(RM_E_STATE, "%s", b->errmsg);
  }
  int rc = b->rehearsal ? 0 : rm__branch_register_start(b->c, b->xid, b->res->id, &b->pending_reg);
  if (rc != 0) {
    rm__at_err(b, "could not register the branch: %s", rm_strerror(rc));
    return rm__fail(rc, "%s", b->errmsg);
  }
  b->registered_first = true;
  return 0;
}

int rm_at_close(rm_branch_t *b, bool committed) {
  if (!b) return RM_E_INVALID;
  /* An early registration still in flight ends here (registered or not:
   * a registered branch that did not commit is reported below). */
  if (b->pending_reg && registration_wait(b) != 0)
    rm__log(b->c, RM_LOG_DEBUG, "early registration of a branch of \"%s\" failed: %s", b->xid, b->errmsg);
  if (committed) TXC_FAILPOINT("rm.at.after_local_commit");
  /* Not committed: no commit of it will come to apply anything. */
  if (!committed && b->state == RM_BRANCH_PREPARED && b->has_commit_delta)
    rm__at_inline_remove(b->res, b->xid, b->branch_id);
  int rc = 0;
  if (b->registered && !(committed && b->state == RM_BRANCH_PREPARED)) {
    /* Registered but not durable: tell the TC now rather than at the
     * global timeout.  A failure here is harmless (the rollback of the
     * global transaction finds no undo row and writes the guard). */
    rc = rm__branch_report(b->c, b->xid, b->branch_id, TXP_BS_PHASE1_FAILED,
                           b->errmsg[0] ? b->errmsg : "local transaction did not commit");
    if (rc == RM_E_GLOBAL_NOT_FOUND || rc == RM_E_GLOBAL_NOT_ACTIVE) {
      /* Already decided (e.g. the rollback that fenced this branch). */
      rm__log(b->c, RM_LOG_INFO, "branch %lld of \"%s\" not reported as failed: %s",
              (long long)b->branch_id, b->xid, rm_strerror(rc));
      rc = 0;
    } else if (rc != 0)
      rm__log(b->c, RM_LOG_WARN,
              "could not report branch %lld of \"%s\" as failed: %s; the global transaction "
              "will roll it back",
              (long long)b->branch_id, b->xid, rm_strerror(rc));
  } else if (committed && b->state == RM_BRANCH_OPEN && b->nitems > 0) {
    rm__log(b->c, RM_LOG_ERROR,
            "branch of \"%s\" on \"%s\" committed %zu statement(s) without rm_at_prepare: they "
            "are not part of the global transaction",
            b->xid, b->res->id, b->nitems);
    rm__fail(RM_E_STATE, "branch of \"%s\" on \"%s\" committed %zu statement(s) without rm_at_prepare: they "
             "are not part of the global transaction", b->xid, b->res->id, b->nitems);
    rc = RM_E_STATE;
  }
  branch_free(b);
  return rc;
}

const char *rm_at_errmsg(const rm_branch_t *b) { return b ? b->errmsg : ""; }

/* --------------------------------------------------------------- prepare */

/*
 * A commit cannot be refused (the decision is made), so what a branch
 * records for the commit must always fit: for each row, its commit deltas
 * must not add up to more than zero (a give-back, or a move between two
 * counters of the row such as frozen -> sold, which phase two applies in
 * one UPDATE).  A take belongs in phase one, under its guard.  0, or
 * RM_E_INVALID with the message set.
 */
static int check_commit_deltas(rm_branch_t *b) {
  if (!b->has_commit_delta) return 0;
  /* The items as phase two will read them (either form: rm_image.h); only
   * branches with commit deltas pay for reading them back. */
  size_t n = json_array_size(b->undo), got = 0;
  rm_item_t *its = calloc(n ? n : 1, sizeof(*its));
  char why[64];
  while (its && got < n && rm_item_from_json(json_array_get(b->undo, got), &its[got], why, sizeof(why)) == 0) got++;
  int rc = got == n ? 0 : rm__at_oom(b); /* the library's own items: only memory can fail */
  for (size_t i = 0; rc == 0 && i < n; i++) {
    const rm_item_t *a = &its[i];
    if (a->op != RM_OP_COMMIT_DELTA) continue;
    bool first = true;
    for (size_t k = 0; k < i && first; k++) first = !(its[k].op == RM_OP_COMMIT_DELTA && rm_item_same_row(a, &its[k]));
    if (!first) continue;
    long long net = 0;
    bool overflow = false;
    for (size_t k = i; k < n; k++)
      if (its[k].op == RM_OP_COMMIT_DELTA && rm_item_same_row(a, &its[k]))
        overflow = overflow || __builtin_add_overflow(net, its[k].delta, &net);
    if (overflow || net > 0) {
      rm__at_err(b, "the commit-time deltas of one row of \"%s\" add up to %s%lld: a commit cannot be refused, so it "
                 "may only give back or move; take in phase one (rm_at_update_delta, under its guard)",
                 a->table, overflow ? "more than " : "+", overflow ? LLONG_MAX : net);
      rc = RM_E_INVALID;
    }
  }
  rm_undo_free(its, got);
  return rc;
}

static int prepare(rm_branch_t *b, int64_t *branch_id, bool *fused_commit);

int rm_at_prepare(rm_branch_t *b, int64_t *branch_id) {
  if (!b) return rm__fail(RM_E_INVALID, "could not prepare a branch: the branch is NULL");
  int rc = prepare(b, branch_id, NULL);
  if (rc != 0) rm__errmsg_set("%s", b->errmsg[0] ? b->errmsg : rm_strerror(rc));
  return rc;
}

/* End the caller's transaction after a failure (a no-op when it already
 * ended). */
static void caller_rollback(rm_branch_t *b) {
  if (PQtransactionStatus(b->pg) != PQTRANS_IDLE) PQclear(PQexec(b->pg, "ROLLBACK"));
}

/* The undo row met the guard a rollback of this branch left (23505 on its
 * key): the local transaction must not commit. */
static int guard_row_met(rm_branch_t *b) {
  rm__at_err(b, "branch %lld of \"%s\" was already rolled back (its guard row is in undo_log): "
                "the local transaction must roll back", (long long)b->branch_id, b->xid);
  return RM_E_GLOBAL_NOT_ACTIVE;
}

int rm_at_prepare_commit(rm_branch_t *b, int64_t *branch_id, bool *committed) {
  if (committed) *committed = false;
  if (!b || !committed) return rm__fail(RM_E_INVALID, "could not prepare and commit a branch: the branch or committed is NULL");
  bool fused = false;
  int rc = prepare(b, branch_id, &fused);
  if (rc == 0 && fused) {
    *committed = !b->rehearsal;
    return 0;
  }
  if (rc == 0 && b->rehearsal) { /* prepared and rolled back (rm_at_prepare) */
    return 0;
  }
  if (rc == 0) { /* not fused: prepared, the COMMIT goes alone */
    PGresult *r = PQexec(b->pg, "COMMIT");
    *committed = PQresultStatus(r) == PGRES_COMMAND_OK && strcmp(PQcmdStatus(r), "COMMIT") == 0;
    if (!*committed) {
      rm__pg_error(b->errmsg, sizeof(b->errmsg), "the local commit failed", b->pg, r);
      rc = RM_E_DB;
    }
    PQclear(r);
  }
  if (!*committed) caller_rollback(b);
  if (rc != 0) rm__errmsg_set("%s", b->errmsg[0] ? b->errmsg : rm_strerror(rc));
  return rc;
}

/* The undo row's INSERT ($1 xid, $2 branch, $3 the context's head, $4
 * the items), in the form rm_config_t.undo_format asks for.  $4 has no
 * cast: it takes the column's type, text since sql/rm/004 and jsonb
 * before it, so one library writes to both. */
static const char *undo_insert_sql(const rm_branch_t *b) {
  static const char compact[] = "INSERT INTO undo_log (xid, branch_id, context, rollback_info, log_status)"
                                " VALUES ($1, $2, $3 || " RM_AT_CONTEXT_SETTINGS ", $4, 0)";
  static const char objects[] = "INSERT INTO undo_log (xid, branch_id, context, rollback_info, log_status)"
                                " VALUES ($1, $2, $3 || " RM_AT_CONTEXT_SETTINGS_ALL ", $4, 0)";
  return rm__undo_compact(b->c) ? compact : objects;
}

/* ") INSERT INTO undo_log (...) SELECT $k, $k+1, $k+2 || <context>": what
 * follows the data-modifying CTE of both fused statements; $k is the xid,
 * then the branch id and the context's head. */
static int append_undo_select(txp_buf_t *sql, int k, const char *context_settings) {
  char head[160];
  snprintf(head, sizeof(head),
           ") INSERT INTO undo_log (xid, branch_id, context, rollback_info, log_status) SELECT $%d, $%d, $%d || ", k,
           k + 1, k + 2);
  int rc = txp_buf_append_str(sql, head);
  return rc ? rc : txp_buf_append_str(sql, context_settings);
}

/* The end of a fused statement that did not commit: 'rc' is already the
 * first statement's classified failure, or 0 when it ran and the COMMIT
 * after it failed.  Frees both results, rolls back.  The code. */
static int fused_failed(rm_branch_t *b, PGresult *r[2], int rc) {
  if (rc == 0) {
    rm__pg_error(b->errmsg, sizeof(b->errmsg), "the local commit failed", b->pg, r[1]);
    rc = RM_E_DB;
  }
  PQclear(r[0]);
  PQclear(r[1]);
  caller_rollback(b);
  return rc;
}

/* The fused form of steps 2 and 3 of prepare and the caller's COMMIT, in
 * one round trip (rm_at_prepare_commit; only without statement
 * savepoints, with at most one deferred delta): the undo row's INSERT
 * (with the deferred UPDATE as a data-modifying CTE whose refusal makes
 * log_status 2, which undo_log's CHECK refuses, so the refusal aborts the
 * transaction before the COMMIT; the items stay a bare parameter, which
 * takes the column's type), then COMMIT.  0 committed;
 * else the code, the transaction rolled back. */
static int fused_commit(rm_branch_t *b, const char *const *insert_params) {
  const char *insert_sql = undo_insert_sql(b);
  rm_deferred_t *d = b->ndeferred == 1 ? &b->deferred[0] : NULL;
  txp_buf_t sql;
  txp_buf_init(&sql, 0);
  const char *params[4 + RM_AT_DEFERRED_MAX_PARAMS];
  Oid types[4 + RM_AT_DEFERRED_MAX_PARAMS] = {0};
  int np = 4, rc = 0;
  if (d) {
    char tail[160];
    int k = d->nparams + 1; /* the UPDATE's own parameters come first */
    rc = txp_buf_append_str(&sql, "WITH rm_deferred AS (");
    if (!rc) rc = txp_buf_append_str(&sql, d->update_sql);
    if (!rc)
      rc = append_undo_select(&sql, k, rm__undo_compact(b->c) ? RM_AT_CONTEXT_SETTINGS : RM_AT_CONTEXT_SETTINGS_ALL);
    snprintf(tail, sizeof(tail), ", $%d, CASE WHEN EXISTS (SELECT 1 FROM rm_deferred) THEN 0 ELSE 2 END", k + 3);
    if (!rc) rc = txp_buf_append_str(&sql, tail);
    if (rc) {
      txp_buf_free(&sql);
      rm__at_err(b, "out of memory");
      caller_rollback(b);
      return RM_E_NOMEM;
    }
    np = d->nparams + 4;
    for (int i = 0; i < d->nparams; i++) {
      params[i] = d->params[i];
      types[i] = d->types[i];
    }
    for (int i = 0; i < 4; i++) params[d->nparams + i] = insert_params[i];
  } else {
    for (int i = 0; i < 4; i++) params[i] = insert_params[i];
  }
  const char *const sqls[2] = {d ? sql.data : insert_sql, end_word(b)};
  const int nps[2] = {np, 0};
  const char *const *pp[2] = {params, NULL};
  const Oid *tt[2] = {d ? types : NULL, NULL};
  PGresult *r[2] = {NULL, NULL};
  rc = rm__at_pipe_run(b, 2, sqls, nps, pp, tt, r);
  txp_buf_free(&sql);
  if (rc == 0 && PQresultStatus(r[0]) == PGRES_COMMAND_OK && PQresultStatus(r[1]) == PGRES_COMMAND_OK &&
      strcmp(PQcmdStatus(r[1]), end_word(b)) == 0) {
    PQclear(r[0]);
    PQclear(r[1]);
    return 0;
  }
  if (rc == 0 && PQresultStatus(r[0]) != PGRES_COMMAND_OK) {
    const char *st = rm__sqlstate(r[0]);
    const char *cons = PQresultErrorField(r[0], PG_DIAG_CONSTRAINT_NAME);
    if (d && strcmp(st, "23514") == 0 && cons && strcmp(cons, "undo_log_log_status_check") == 0) {
      caller_rollback(b);
      /* Refused, or the row is gone: tell which (a plain read, after). */
      rc = rm__at_deferred_refused(b, d);
    } else if (strcmp(st, "23505") == 0) {
      rc = guard_row_met(b);
    } else {
      rm__pg_error(b->errmsg, sizeof(b->errmsg), d ? "could not run the delta update and write the undo log"
                                                   : "could not write the undo log", b->pg, r[0]);
      rc = st[0] == '2' && st[1] == '2' ? RM_E_INVALID : RM_E_DB;
    }
  }
  return fused_failed(b, r, rc);
}

/*
 * A branch that is one deferred insert (rm_at_insert_deferred), with its
 * undo row and the caller's COMMIT, in one statement: the insert as
 * rm_at_insert runs it, in a CTE whose RETURNING (the row's digest and its
 * key) makes the undo item, in the compact form, where rm_at_insert's
 * result would have made it on this side.  On a connection with no
 * transaction open (nothing of the branch ran yet) the statement is the
 * whole local transaction, committed by itself; inside the caller's
 * transaction the COMMIT follows in the same round trip.  The item is
 * jsonb, which the undo column takes as it is (version 3) or as its text
 * (version 4).  An insert that made no row (a trigger skipped it) makes
 * log_status 2, which the CHECK refuses.  0 committed; else the code, the
 * transaction rolled back.
 */
static int fused_insert_commit(rm_branch_t *b, const char *const *head) {
  const rm_deferred_insert_t *d = b->dins;
  int nhead = 3, first = d->nparams + 1; /* xid, branch id, context; then the item's names */
  int np = d->nparams + nhead + 1 + d->npk + (d->item_schema ? 1 : 0);
  const char **params = calloc((size_t)np, sizeof(char *));
  Oid *types = calloc((size_t)np, sizeof(Oid)); /* the caller's, then inferred */
  txp_buf_t sql;
  txp_buf_init(&sql, 0);
  if (!params || !types) {
    free(params);
    free(types);
    rm__at_err(b, "out of memory");
    caller_rollback(b);
    return RM_E_NOMEM;
  }
  int k = 0;
  for (int i = 0; i < d->nparams; i++) {
    if (d->types) types[k] = d->types[i];
    params[k++] = d->vals[i];
  }
  for (int i = 0; i < nhead; i++) params[k++] = head[i];
  params[k++] = d->item_table;
  for (int i = 0; i < d->npk; i++) params[k++] = d->pk_names[i];
  if (d->item_schema) params[k++] = d->item_schema;
  char num[160];
  int rc = txp_buf_append_str(&sql, "WITH rm_ins (d");
  for (int i = 0; !rc && i < d->npk; i++) {
    snprintf(num, sizeof(num), ", k%d", i);
    rc = txp_buf_append_str(&sql, num);
  }
  if (!rc) rc = txp_buf_append_str(&sql, ") AS (");
  if (!rc) rc = txp_buf_append_str(&sql, d->insert_sql);
  if (!rc) rc = append_undo_select(&sql, first, RM_AT_CONTEXT_SETTINGS);
  snprintf(num, sizeof(num),
           ", pg_catalog.jsonb_build_array(pg_catalog.jsonb_build_array('i', $%d::text, "
           "pg_catalog.jsonb_build_object(",
           first + 3);
  if (!rc) rc = txp_buf_append_str(&sql, num);
  for (int i = 0; !rc && i < d->npk; i++) {
    /* the key as its type prints it (format's %s), as a result's text */
    snprintf(num, sizeof(num), "%s$%d::text, pg_catalog.format('%%s', rm_ins.k%d)", i ? ", " : "", first + 4 + i, i);
    rc = txp_buf_append_str(&sql, num);
  }
  snprintf(num, sizeof(num), "), pg_catalog.left(rm_ins.d, %d)", RM_ROW_DIGEST_KEPT);
  if (!rc) rc = txp_buf_append_str(&sql, num);
  if (d->item_schema) {
    snprintf(num, sizeof(num), ", $%d::text", first + 4 + d->npk);
    if (!rc) rc = txp_buf_append_str(&sql, num);
  }
  if (!rc)
    rc = txp_buf_append_str(&sql, ")), CASE WHEN rm_ins.d IS NULL THEN 2 ELSE 0 END"
                                  " FROM (SELECT 1) AS rm_one LEFT JOIN rm_ins ON true");
  if (rc) {
    free(params);
    free(types);
    txp_buf_free(&sql);
    rm__at_err(b, "out of memory");
    caller_rollback(b);
    return RM_E_NOMEM;
  }
  /* Nothing of the branch ran: the statement is its transaction (not in
   * a rehearsal, whose BEGIN goes first and whose end rolls back). */
  bool alone = b->begin_pending && !b->rehearsal;
  if (alone) b->begin_pending = false;
  const char *const sqls[2] = {sql.data, end_word(b)};
  const int nps[2] = {np, 0};
  const char *const *pp[2] = {params, NULL};
  const Oid *tt[2] = {types, NULL};
  PGresult *r[2] = {NULL, NULL};
  int n = alone ? 1 : 2;
  rc = rm__at_pipe_run(b, n, sqls, nps, pp, tt, r);
  txp_buf_free(&sql);
  free(params);
  free(types);
  if (rc == 0 && PQresultStatus(r[0]) == PGRES_COMMAND_OK &&
      (alone || (PQresultStatus(r[1]) == PGRES_COMMAND_OK && strcmp(PQcmdStatus(r[1]), end_word(b)) == 0))) {
    PQclear(r[0]);
    PQclear(r[1]);
    b->nitems = 1;
    rm__at_deferred_insert_free(b->dins);
    b->dins = NULL;
    return 0;
  }
  if (rc == 0 && PQresultStatus(r[0]) != PGRES_COMMAND_OK) {
    const char *st = rm__sqlstate(r[0]);
    const char *cons = PQresultErrorField(r[0], PG_DIAG_CONSTRAINT_NAME);
    cons = cons ? cons : "";
    if (strcmp(st, "23505") == 0 && strcmp(cons, "undo_log_pkey") == 0) {
      rc = guard_row_met(b);
    } else if (strcmp(st, "23514") == 0 && strcmp(cons, "undo_log_log_status_check") == 0) {
      rm__at_err(b, "insert into \"%s\" made no row (a trigger skipped it?)", d->item_table);
      rc = RM_E_NOT_ONE_ROW;
    } else {
      char what[256];
      snprintf(what, sizeof(what), "could not insert into \"%s\" and write the undo log", d->item_table);
      rm__pg_error(b->errmsg, sizeof(b->errmsg), what, b->pg, r[0]);
      rc = st[0] == '2' && st[1] == '2' ? RM_E_INVALID : RM_E_DB;
    }
  }
  return fused_failed(b, r, rc);
}

static int prepare(rm_branch_t *b, int64_t *branch_id, bool *fused_commit_done) {
  if (b->state != RM_BRANCH_OPEN) {
    rm__at_err(b, "branch is already %s", b->state == RM_BRANCH_PREPARED ? "prepared" : "failed");
    return RM_E_STATE;
  }
  if (b->nitems + b->ndeferred == 0 && !b->dins) {
    rm__at_err(b, "branch has no statement to prepare");
    return RM_E_STATE;
  }
  PGTransactionStatusType ts = PQtransactionStatus(b->pg);
  if (ts != PQTRANS_INTRANS && !(ts == PQTRANS_IDLE && b->begin_pending)) {
    rm__at_err(b, "the connection is not idle in a transaction block");
    return RM_E_STATE;
  }
  /* A deferred insert goes in with the undo row, in one statement, when
   * it is the branch's only statement and prepare commits too
   * (fused_insert_commit); otherwise it runs now, as rm_at_insert_unlocked
   * would have, before the deferred deltas. */
  bool fuse_insert = b->dins && fused_commit_done && b->no_savepoints && b->nitems == 0 && b->ndeferred == 0 &&
                     rm__undo_compact(b->c);
  int rc = 0;
  if (b->dins && !fuse_insert) {
    rm_deferred_insert_t *d = b->dins;
    b->dins = NULL;
    rc = d->sql ? rm__at_sql_deferred_run(b, d) : rm__at_insert_deferred_run(b, d);
    rm__at_deferred_insert_free(d);
    if (rc != 0) return rc;
  }
  rc = check_commit_deltas(b);
  if (rc != 0) return rc;
  /* The undo items of the deferred deltas go last: prepare runs them
   * after every other statement of the branch. */
  for (size_t i = 0; i < b->ndeferred; i++) {
    if (json_array_append(b->undo, b->deferred[i].item) != 0) {
      rm__at_err(b, "out of memory");
      b->state = RM_BRANCH_FAILED;
      return RM_E_NOMEM;
    }
  }
  char *undo = json_dumps(b->undo, JSON_COMPACT); /* items in the configured form (rm__at_item_encode) */
  char *ctx = rm__at_context(b);
  if (!undo || !ctx) {
    free(undo);
    free(ctx);
    rm__at_err(b, "out of memory");
    if (b->ndeferred > 0) b->state = RM_BRANCH_FAILED; /* their items are in b->undo now: no retry */
    return RM_E_NOMEM;
  }

  /* 1. Register (the TC takes the global row locks, waiting if busy),
   * unless it was, with its global's begin (rm_tm_begin_branch: no
   * locks). */
  int64_t bid = b->branch_id;
  const char *keys = b->lock_keys.len ? b->lock_keys.data : NULL;
  if (b->registered_first && (keys || b->has_commit_delta)) {
    (void)registration_wait(b); /* registered: rm_at_close reports it failed */
    rm__at_err(b, "a branch registered before its statements (rm_tm_begin_branch and rm_at_open_registered, "
                  "or rm_at_register_early) takes no global lock and no commit delta: open it with rm_at_open and "
                  "let rm_at_prepare register it; roll the local transaction back");
    b->state = RM_BRANCH_FAILED;
    free(undo);
    free(ctx);
    return RM_E_STATE;
  }
  /* Commit deltas make the commit real work: the TM is to be answered
   * after it (TXP_APP_DATA_PHASE2_SYNC). */
  const char *app_data = b->has_commit_delta ? TXP_APP_DATA_PHASE2_SYNC : NULL;
  if (b->rehearsal) { /* nothing to register: branch id 0 */
    bid = 0;
  } else if (b->pending_reg) { /* rm_at_register_early: its answer */
    rc = registration_wait(b);
    bid = b->branch_id;
  } else if (!b->registered_first) {
    rc = rm__branch_register(b->c, b->xid, b->res->id, keys, app_data, rm__lock_wait_ms(b->c), &bid, b->errmsg,
                             sizeof(b->errmsg));
  }
  if (rc != 0) {
    if (!b->errmsg[0]) rm__at_err(b, "could not register the branch: %s", rm_strerror(rc));
    b->state = RM_BRANCH_FAILED;
    free(undo);
    free(ctx);
    return rc;
  }
  b->registered = !b->rehearsal;
  b->branch_id = bid;
  if (!b->rehearsal) { /* a rehearsal registered nothing: the tests' points after a registration are not its */
    if (rm__at_failpoint_after_register) rm__at_failpoint_after_register(b, bid, rm__at_failpoint_arg);
    TXC_FAILPOINT("rm.at.after_register");
  }

  /* 2. The deferred delta updates (a delta needs no lock key, so the
   * registration did not wait for them): the hot rows they lock are held
   * from here to the caller's COMMIT only.
   * 3. The undo row, in the caller's transaction and deliberately without
   * a savepoint: if it fails, the transaction is aborted and cannot commit.
   * After deferred updates under a savepoint, the RELEASE goes in the same
   * round trip; without statement savepoints the INSERT goes in the
   * deferred updates' own round trip. */
  char bidbuf[32];
  snprintf(bidbuf, sizeof(bidbuf), "%lld", (long long)bid);
  const char *params[4] = {b->xid, bidbuf, ctx, undo};
  if (fuse_insert || (fused_commit_done && b->no_savepoints && b->ndeferred <= 1 &&
                      (b->ndeferred == 0 || b->deferred[0].nparams <= RM_AT_DEFERRED_MAX_PARAMS))) {
    rc = fuse_insert ? fused_insert_commit(b, params) : fused_commit(b, params);
    free(undo);
    free(ctx);
    if (rc != 0) {
      b->state = RM_BRANCH_FAILED;
      return rc;
    }
    *fused_commit_done = true;
    b->state = RM_BRANCH_PREPARED;
    if (b->has_commit_delta && !b->rehearsal) rm__at_inline_add(b->res, b->xid, bid);
    if (branch_id) *branch_id = bid;
    return 0;
  }
  const char *insert_sql = undo_insert_sql(b);
  PGresult *res = NULL;
  if (b->ndeferred > 0 &&
      (rc = rm__at_run_deferred(b, b->no_savepoints ? insert_sql : NULL, 4, params, &res)) != 0) {
    b->state = RM_BRANCH_FAILED;
    free(undo);
    free(ctx);
    return rc;
  }
  if (b->ndeferred > 0 && b->no_savepoints) {
    /* res is the INSERT's (NULL: reported below) */
  } else if (b->ndeferred > 0) {
    const char *const sqls[2] = {"RELEASE SAVEPOINT " RM_AT_SAVEPOINT, insert_sql};
    const int np[2] = {0, 4};
    const char *const *pp[2] = {NULL, params};
    PGresult *r2[2];
    rc = rm__at_pipe_run(b, 2, sqls, np, pp, NULL, r2);
    if (rc == 0 && PQresultStatus(r2[0]) != PGRES_COMMAND_OK) {
      res = r2[0]; /* reported below as the failure (the INSERT did not run) */
      PQclear(r2[1]);
    } else {
      PQclear(r2[0]);
      res = r2[1];
    }
  } else {
    res = rm__at_exec(b, insert_sql, 4, params, NULL); /* NULL: reported below */
  }
  free(undo);
  free(ctx);
  if (PQresultStatus(res) != PGRES_COMMAND_OK) {
    if (strcmp(rm__sqlstate(res), "23505") == 0) {
      rc = guard_row_met(b); /* (b->branch_id is bid since the registration) */
    } else {
      rm__pg_error(b->errmsg, sizeof(b->errmsg), "could not write the undo log", b->pg, res);
      rc = RM_E_DB;
    }
    PQclear(res);
    b->state = RM_BRANCH_FAILED;
    return rc;
  }
  PQclear(res);
  if (b->rehearsal) caller_rollback(b); /* the caller's COMMIT finds nothing to commit */
  b->state = RM_BRANCH_PREPARED;
  /* Its BranchCommit must apply the commit deltas: served on a worker at
   * once rather than queued for the deleter (rm_undo.c NOTES). */
  if (b->has_commit_delta && !b->rehearsal) rm__at_inline_add(b->res, b->xid, bid);
  if (branch_id) *branch_id = bid;
  return 0;
}

