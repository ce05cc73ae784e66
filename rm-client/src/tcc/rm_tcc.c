/*
 * rm_tcc.c - TCC branches (rm_client.h, "RM: TCC mode"): the try inside
 * the caller's local transaction, and phase two (confirm or cancel) behind
 * the fence, on a connection of the resource's phase-two pool.
 *
 * NOTES
 *   Layering.  A TCC resource is an AT resource (at/rm_resource.c) with a
 *   mode attached (rm__at_resource_set_mode): the resource list, its
 *   connection pool, the dispatch of phase two and the deleter's retention
 *   sweep are the AT layer's; this file knows only the fence and the
 *   handlers.  The arrow runs tcc -> at.
 *
 *   The try.  Register first, then write the fence row: the branch id is
 *   the row's key, and a registration the coordinator refuses (the global
 *   is already rolling back, timed out) leaves nothing to undo.  Between
 *   the two the coordinator may decide a rollback and send the cancel:
 *   it finds no row (the try's insert is not committed, or not even sent)
 *   and records "cancelled before any try".  The try's insert then meets
 *   that row on the key (ON CONFLICT DO NOTHING: no error, 0 rows), reads
 *   it and refuses (RM_E_TCC_FENCE): no reservation is made that nobody
 *   would release.  If the two inserts race, the later one waits on the
 *   key for the first one's transaction and then sees its row.
 *
 *   Phase two.  One local transaction: lock the row (FOR UPDATE; a second
 *   delivery of the same confirm waits and then finds it confirmed), let
 *   rm_tcc_fence_phase2 decide, run the handler on the same connection,
 *   set the row, commit.  The handler's database change and the fence row
 *   commit together or not at all; a change outside the database must be
 *   idempotent, for when the commit fails after it.  A confirm that finds
 *   no row is retried: the try's local transaction may still be on its
 *   way (the TM committed right after rm_tcc_try returned, before the
 *   caller's COMMIT).
 *
 *   The coordinator answers a TM's GlobalCommit of a global with a TCC
 *   branch after the confirms ran (tc_coord.c commit_waits), as Seata
 *   commits TCC synchronously: when rm_tm_commit returns, the confirms are
 *   done, or retrying in the coordinator.
 *
 *   Retention.  A finished row is kept for the AT layer's undo retention
 *   (rm_at_tuning_t.retention_s) and then swept.  The row of an empty
 *   rollback must outlive the try that is late, which registered before
 *   the cancel and writes its row within the same call (seconds, not a
 *   day); a try that registers later is refused by the coordinator.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rm_at_int.h"
#include "rm_client.h"
#include "rm_internal.h"
#include "rm_pg.h"
#include "rm_tcc.h"
#include "rm_tcc_fence.h"
#include "rm_util.h"
#include "txc_failpoint.h"
#include "txp_msg.h"
#include "txp_status.h"

#define INT8OID 20
#define TCC_ARGS_MAX 65536u

void (*rm__tcc_failpoint_after_register)(const char *xid, int64_t branch_id, void *arg) = NULL;
void *rm__tcc_failpoint_arg = NULL;

/* The mode's state of one resource: a copy of the handlers. */
typedef struct tcc_resource {
  rm_tcc_handlers_t h;
} tcc_resource_t;

/* ----------------------------------------------------------- phase two */

/* One phase-two local transaction. */
typedef struct tcc_txn {
  rm_at_resource_t *r;
  PGconn *pg;
  const rm_phase2_req_t *req;
  char bid[24];
  char *err;
  size_t errlen;
  bool bad; /* the connection must not go back to its pool */
} tcc_txn_t;

static PGresult *txn_exec(tcc_txn_t *t, const char *what, const char *sql, int n, const char *const *params,
                          const Oid *types, ExecStatusType want) {
  PGresult *res = PQexecParams(t->pg, sql, n, types, params, NULL, NULL, 0);
  if (PQresultStatus(res) == want) return res;
  rm__pg_error(t->err, t->errlen, what, t->pg, res);
  if (PQstatus(t->pg) != CONNECTION_OK || rm__pg_read_only_error(res)) t->bad = true;
  PQclear(res);
  return NULL;
}

/* The fence row's status (RM_FENCE_NONE: no row) and args (malloc'd, NULL
 * when none), locked.  0 or -1 (message set). */
static int read_row(tcc_txn_t *t, int *status, char **args) {
  static const Oid types[] = {0, INT8OID};
  const char *p[] = {t->req->xid, t->bid};
  *status = RM_FENCE_NONE;
  *args = NULL;
  PGresult *res = txn_exec(t, "could not read the TCC fence row",
                           "SELECT status, args FROM tcc_fence WHERE xid = $1 AND branch_id = $2 FOR UPDATE", 2, p,
                           types, PGRES_TUPLES_OK);
  if (!res) return -1;
  int rc = 0;
  if (PQntuples(res) == 1) {
    *status = atoi(PQgetvalue(res, 0, 0));
    if (!PQgetisnull(res, 0, 1) && !(*args = strdup(PQgetvalue(res, 0, 1)))) {
      snprintf(t->err, t->errlen, "out of memory reading the TCC fence row");
      rc = -1;
    }
  }
  PQclear(res);
  return rc;
}

/* Insert the row of an empty rollback: 1 when it went in, 0 when a row
 * was there (the try committed meanwhile), -1 on failure. */
static int record_empty(tcc_txn_t *t) {
  static const Oid types[] = {0, INT8OID, 0};
  const char *p[] = {t->req->xid, t->bid, t->r->id};
  PGresult *res = txn_exec(t, "could not record the empty rollback in the TCC fence",
                           "INSERT INTO tcc_fence (xid, branch_id, resource_id, status) VALUES ($1, $2, $3, 4) "
                           "ON CONFLICT DO NOTHING",
                           3, p, types, PGRES_COMMAND_OK);
  if (!res) return -1;
  int n = atoi(PQcmdTuples(res));
  PQclear(res);
  return n == 1 ? 1 : 0;
}

static int set_status(tcc_txn_t *t, int to) {
  static const Oid types[] = {0, INT8OID, 0};
  char st[8];
  snprintf(st, sizeof(st), "%d", to);
  const char *p[] = {t->req->xid, t->bid, st};
  PGresult *res = txn_exec(t, "could not update the TCC fence row",
                           "UPDATE tcc_fence SET status = $3::smallint, modified = clock_timestamp() "
                           "WHERE xid = $1 AND branch_id = $2",
                           3, p, types, PGRES_COMMAND_OK);
  if (!res) return -1;
  PQclear(res);
  return 0;
}

static int simple(tcc_txn_t *t, const char *sql, const char *what) {
  PGresult *res = txn_exec(t, what, sql, 0, NULL, NULL, PGRES_COMMAND_OK);
  if (!res) return -1;
  PQclear(res);
  return 0;
}

/* Run the handler inside the transaction: 0, or the branch status of its
 * failure with *code set. */
static int run_handler(tcc_txn_t *t, const tcc_resource_t *tr, const char *args, int retry, int never, int *code) {
  const rm_phase2_req_t *req = t->req;
  rm_tcc_call_t call = {
    .xid = req->xid, .branch_id = req->branch_id, .resource_id = t->r->id, .args = args, .pg = t->pg};
  char herr[512] = "";
  int hrc = (req->commit ? tr->h.confirm : tr->h.cancel)(&call, tr->h.arg, herr, sizeof(herr));
  const char *what = req->commit ? "confirm" : "cancel";
  if (hrc == RM_TCC_OK) {
    if (PQtransactionStatus(t->pg) == PQTRANS_INTRANS) return 0;
    /* Its transaction was ended or broken: the fence row cannot be written
     * with the change, so nothing is recorded and the handler runs again. */
    snprintf(t->err, t->errlen,
             "the TCC %s handler of \"%s\" returned OK but left its transaction %s (a handler must not COMMIT, "
             "ROLLBACK or leave a failed statement): retried",
             what, t->r->id, PQtransactionStatus(t->pg) == PQTRANS_INERROR ? "failed" : "ended");
    *code = RM_E_TCC_HANDLER;
    return retry;
  }
  *code = RM_E_TCC_HANDLER;
  snprintf(t->err, t->errlen, "the TCC %s handler of \"%s\" %s: %s", what, t->r->id,
           hrc == RM_TCC_FAILED ? "failed for good" : "asked for a retry", herr[0] ? herr : "(no message)");
  return hrc == RM_TCC_FAILED ? never : retry;
}

static int fence_phase2(tcc_txn_t *t, const tcc_resource_t *tr, int *code) {
  const rm_phase2_req_t *req = t->req;
  int ok = req->commit ? TXP_BS_PHASE2_COMMITTED : TXP_BS_PHASE2_ROLLBACKED;
  int retry = req->commit ? TXP_BS_PHASE2_COMMIT_FAILED_RETRYABLE : TXP_BS_PHASE2_ROLLBACK_FAILED_RETRYABLE;
  int never = req->commit ? TXP_BS_PHASE2_COMMIT_FAILED_UNRETRYABLE : TXP_BS_PHASE2_ROLLBACK_FAILED_UNRETRYABLE;
  *code = RM_E_DB;
  if (simple(t, "BEGIN", "could not begin the TCC phase-two transaction") != 0) return retry;
  int found;
  char *args = NULL;
  if (read_row(t, &found, &args) != 0) return retry;
  int to, status = retry;
  const char *why;
  rm_fence_action_t act = rm_tcc_fence_phase2(req->commit, found, &to, &why);
  if (act == RM_FENCE_RECORD) {
    int in = record_empty(t);
    if (in < 0) goto out;
    if (in == 0) { /* the try committed after our read: decide again on its row */
      free(args);
      if (read_row(t, &found, &args) != 0) goto out;
      act = rm_tcc_fence_phase2(req->commit, found, &to, &why);
      if (act == RM_FENCE_RECORD) { /* cannot be: a row was there */
        snprintf(t->err, t->errlen, "the TCC fence row of the branch appeared and vanished: retried");
        goto out;
      }
    }
  }
  switch (act) {
  case RM_FENCE_DONE:
    status = ok; /* a duplicate: answered from the row; the ROLLBACK below changes nothing */
    goto out;
  case RM_FENCE_RETRY:
  case RM_FENCE_REFUSE:
    *code = act == RM_FENCE_RETRY ? RM_E_STATE : RM_E_TCC_FENCE;
    snprintf(t->err, t->errlen, "%s", why);
    status = act == RM_FENCE_RETRY ? retry : never;
    goto out;
  case RM_FENCE_RUN: {
    int hs = run_handler(t, tr, args, retry, never, code);
    if (hs != 0) {
      status = hs;
      goto out;
    }
    *code = RM_E_DB;
    if (set_status(t, to) != 0) goto out;
    break;
  }
  case RM_FENCE_RECORD: break; /* the row went in above */
  }
  if (simple(t, "COMMIT", "could not commit the TCC phase-two transaction") != 0) goto out;
  if (act == RM_FENCE_RECORD)
    rm__log(t->r->st->c, RM_LOG_INFO, "branch %lld of \"%s\" on \"%s\" cancelled before its try: recorded (a late "
            "try is refused)", (long long)req->branch_id, req->xid, t->r->id);
  *code = 0;
  status = ok;
out:
  free(args);
  return status;
}

static int tcc_phase2(rm_at_resource_t *r, void *arg, const rm_phase2_req_t *req, int *code, char *errmsg,
                      size_t errlen) {
  tcc_txn_t t = {.r = r, .req = req, .err = errmsg, .errlen = errlen};
  snprintf(t.bid, sizeof(t.bid), "%lld", (long long)req->branch_id);
  int retry = req->commit ? TXP_BS_PHASE2_COMMIT_FAILED_RETRYABLE : TXP_BS_PHASE2_ROLLBACK_FAILED_RETRYABLE;
  if (rm__at_conn_get(r, &t.pg, errmsg, errlen) != 0) {
    *code = RM_E_DB;
    return retry;
  }
  int status = fence_phase2(&t, arg, code);
  if (PQtransactionStatus(t.pg) != PQTRANS_IDLE) {
    PGresult *rb = PQexec(t.pg, "ROLLBACK");
    if (PQresultStatus(rb) != PGRES_COMMAND_OK) t.bad = true;
    PQclear(rb);
  }
  rm__at_conn_put(r, t.pg, t.bad);
  if (status == TXP_BS_PHASE2_COMMIT_FAILED_UNRETRYABLE || status == TXP_BS_PHASE2_ROLLBACK_FAILED_UNRETRYABLE)
    rm__log(r->st->c, RM_LOG_ERROR, "TCC %s of branch %lld of \"%s\" on \"%s\" failed for good: %s",
            req->commit ? "confirm" : "cancel", (long long)req->branch_id, req->xid, r->id, errmsg);
  return status;
}

/* The retention sweep: finished rows older than 'retention_s'. */
static long long tcc_sweep(rm_at_resource_t *r, void *arg, PGconn *pg, unsigned retention_s, unsigned limit) {
  (void)arg;
  char ret[16], lim[16];
  snprintf(ret, sizeof(ret), "%u", retention_s);
  snprintf(lim, sizeof(lim), "%u", limit ? limit : 1000);
  const char *p[] = {ret, lim};
  PGresult *res = PQexecParams(pg,
                               "DELETE FROM tcc_fence WHERE ctid = ANY (ARRAY(SELECT ctid FROM tcc_fence "
                               "WHERE status <> 1 AND modified < clock_timestamp() - make_interval(secs => $1::int) "
                               "LIMIT $2::int))",
                               2, NULL, p, NULL, NULL, 0);
  long long n;
  if (PQresultStatus(res) == PGRES_COMMAND_OK) {
    n = atoll(PQcmdTuples(res));
  } else {
    char err[512];
    rm__pg_error(err, sizeof(err), "could not sweep the TCC fence", pg, res);
    rm__log(r->st->c, RM_LOG_WARN, "%s on \"%s\"", err, r->id);
    n = RM_E_DB;
  }
  PQclear(res);
  return n;
}

static const rm_at_mode_t tcc_mode = {.phase2 = tcc_phase2, .sweep = tcc_sweep, .free_arg = free};

/* -------------------------------------------------------- the public API */

/* Whether the database of 'conninfo' has the fence table: 0, or a code
 * with rm_errmsg set.  Asked before the resource is added, so that a
 * refused TCC resource leaves nothing behind. */
static int check_fence(const char *id, const char *conninfo) {
  char err[RM_ERRMSG_MAX];
  const char *kw[] = {"connect_timeout", "application_name", "dbname", NULL};
  const char *vals[] = {"10", "librmclient", conninfo, NULL};
  PGconn *pg = PQconnectdbParams(kw, vals, 1);
  if (!pg) return rm__fail(RM_E_NOMEM, "could not add TCC resource \"%s\": out of memory", id);
  int rc = 0;
  PGresult *res = NULL;
  if (PQstatus(pg) != CONNECTION_OK) {
    rm__pg_error(err, sizeof(err), "could not connect to its database", pg, NULL);
    rc = rm__fail(RM_E_DB, "could not add TCC resource \"%s\": %s", id, err);
    goto out;
  }
  res = PQexec(pg, "SELECT to_regclass('tcc_fence') IS NOT NULL, current_database()");
  if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1) {
    rm__pg_error(err, sizeof(err), "could not look for the tcc_fence table", pg, res);
    rc = rm__fail(RM_E_DB, "could not add TCC resource \"%s\": %s", id, err);
  } else if (PQgetvalue(res, 0, 0)[0] != 't') {
    rc = rm__fail(RM_E_NO_TABLE,
                  "could not add TCC resource \"%s\": database \"%s\" has no tcc_fence table (on its search_path; "
                  "version 2 of the \"rm\" schema set): run `txc-db-migrate 'CONNINFO' rm` (scripts/db-migrate in "
                  "the source tree), with this resource's conninfo",
                  id, PQgetvalue(res, 0, 1));
  }
out:
  PQclear(res);
  PQfinish(pg);
  return rc;
}

int rm_tcc_resource_add(rm_client_t *c, const char *resource_id, const char *conninfo, const rm_tcc_handlers_t *h) {
  if (!c || !resource_id || !conninfo || !h || !h->confirm || !h->cancel)
    return rm__fail(RM_E_INVALID, "could not add a TCC resource: the client, the resource id, the conninfo, the "
                                  "handlers or one of confirm and cancel is NULL");
  rm_at_resource_t *r = rm__at_resource_find(c, resource_id);
  if (r && rm__at_resource_mode(r, TXP_BT_TCC, NULL))
    return rm__fail(RM_E_INVALID, "could not add TCC resource \"%s\": it has TCC handlers already", resource_id);
  int rc = check_fence(resource_id, conninfo);
  if (rc != 0) {
    rm__log(c, RM_LOG_ERROR, "%s", rm_errmsg());
    return rc;
  }
  if ((rc = rm_resource_add(c, resource_id, conninfo)) != 0) return rc;
  if (!(r = rm__at_resource_find(c, resource_id)))
    return rm__fail(RM_E_INVALID, "could not add TCC resource \"%s\": not found after adding", resource_id);
  tcc_resource_t *tr = malloc(sizeof(*tr));
  if (!tr) return rm__fail(RM_E_NOMEM, "could not add TCC resource \"%s\": out of memory", resource_id);
  tr->h = *h;
  if (rm__at_resource_set_mode(r, TXP_BT_TCC, &tcc_mode, tr) != 0) /* frees tr */
    return rm__fail(RM_E_INVALID, "could not add TCC resource \"%s\": it has TCC handlers already", resource_id);
  return 0;
}

int rm_tcc_try(rm_client_t *c, const char *xid, const char *resource_id, PGconn *pg, const char *args,
               int64_t *branch_id) {
  if (branch_id) *branch_id = 0;
  if (!c || !xid || !xid[0] || strlen(xid) > TXP_MAX_XID_LEN || !resource_id || !pg)
    return rm__fail(RM_E_INVALID, "TCC try: the client, the xid (1 to %d bytes), the resource id or the "
                                  "connection is missing or invalid", TXP_MAX_XID_LEN);
  if (args && strlen(args) > TCC_ARGS_MAX)
    return rm__fail(RM_E_INVALID, "TCC try of \"%s\": args of %zu bytes (at most %u)", xid, strlen(args),
                    TCC_ARGS_MAX);
  rm_at_resource_t *r = rm__at_resource_find(c, resource_id);
  if (!r || !rm__at_resource_mode(r, TXP_BT_TCC, NULL))
    return rm__fail(RM_E_INVALID, "TCC try of \"%s\": resource \"%s\" has no TCC handlers in this client "
                                  "(rm_tcc_resource_add)", xid, resource_id);
  if (PQtransactionStatus(pg) != PQTRANS_INTRANS)
    return rm__fail(RM_E_STATE, "TCC try of \"%s\": the connection is not inside a transaction block (BEGIN "
                                "first; a failed statement must be rolled back)", xid);

  char err[RM_ERRMSG_MAX];
  int64_t bid = 0;
  int rc = rm__branch_register_as(c, TXP_BT_TCC, xid, resource_id, NULL, NULL, 0, &bid, err, sizeof(err));
  if (rc != 0) return rm__fail(rc, "TCC try of \"%s\" on \"%s\": registration failed: %s", xid, resource_id, err);
  if (rm__tcc_failpoint_after_register) rm__tcc_failpoint_after_register(xid, bid, rm__tcc_failpoint_arg);
  TXC_FAILPOINT("rm.tcc.after_register");

  static const Oid types[] = {0, INT8OID, 0, 0};
  char sbid[24];
  snprintf(sbid, sizeof(sbid), "%lld", (long long)bid);
  const char *p[] = {xid, sbid, resource_id, args};
  PGresult *res = PQexecParams(pg,
                               "INSERT INTO tcc_fence (xid, branch_id, resource_id, status, args) "
                               "VALUES ($1, $2, $3, 1, $4) ON CONFLICT DO NOTHING",
                               4, types, p, NULL, NULL, 0);
  if (PQresultStatus(res) != PGRES_COMMAND_OK) {
    rm__pg_error(err, sizeof(err), "could not write the TCC fence row", pg, res);
    PQclear(res);
    return rm__fail(RM_E_DB, "TCC try of \"%s\" (branch %lld): %s (roll back the transaction)", xid, (long long)bid,
                    err);
  }
  bool inserted = atoi(PQcmdTuples(res)) == 1;
  PQclear(res);
  if (!inserted) {
    res = PQexecParams(pg, "SELECT status FROM tcc_fence WHERE xid = $1 AND branch_id = $2", 2, types, p, NULL, NULL,
                       0);
    int found = PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1 ? atoi(PQgetvalue(res, 0, 0)) : -1;
    if (found < 0) rm__pg_error(err, sizeof(err), "could not read the TCC fence row", pg, res);
    PQclear(res);
    if (found < 0)
      return rm__fail(RM_E_DB, "TCC try of \"%s\" (branch %lld): %s (roll back the transaction)", xid,
                      (long long)bid, err);
    const char *why;
    if (!rm_tcc_fence_try_ok(found, &why))
      return rm__fail(RM_E_TCC_FENCE, "TCC try of \"%s\" (branch %lld): %s (roll back the transaction)", xid,
                      (long long)bid, why);
  }
  if (branch_id) *branch_id = bid;
  return 0;
}
