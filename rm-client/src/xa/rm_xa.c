/*
 * rm_xa.c - XA branches on PostgreSQL (rm_client.h, "RM: XA mode"): the
 * caller's local transaction ended by PREPARE TRANSACTION, phase two by
 * COMMIT PREPARED or ROLLBACK PREPARED on a connection of the resource's
 * pool, and the fence row that tells a duplicate from a branch that never
 * prepared.
 *
 * NOTES
 *   Layering.  As TCC (tcc/rm_tcc.c): an AT resource with a mode attached;
 *   the fence is fence/'s.  Arrows: xa -> at, xa -> fence.
 *
 *   The transaction id of a prepared branch is "txc:BRANCH_ID:XID" (at most
 *   4 + 20 + 1 + 128 < 200 bytes, PostgreSQL's limit): phase two builds it
 *   from the coordinator's request alone, so any RM of the resource can
 *   finish a branch that another process (since dead) prepared; the
 *   prepared transaction survives both that process and a restart of the
 *   database.  pg_prepared_xacts lists what is pending.
 *
 *   Why a fence row.  COMMIT PREPARED of an id that does not exist cannot
 *   tell "committed already" (a duplicate) from "never prepared"; the
 *   branch's start therefore inserts its fence row in the branch's own
 *   transaction: the row becomes visible exactly when the prepared
 *   transaction commits.  A commit that finds no prepared transaction and
 *   a visible row was a duplicate; one that finds neither retries (the
 *   PREPARE may be on its way).
 *
 *   Anti-hanging.  A rollback that finds no prepared transaction inserts
 *   the row of an empty rollback (fence status 4) in autocommit.  If the
 *   branch's transaction is still open (or prepared meanwhile), its own
 *   uncommitted row holds the key and the insert waits, up to the pool's
 *   lock_timeout, then fails retryably: the coordinator's retry finds the
 *   prepared transaction and rolls it back.  If the branch's start had not
 *   inserted its row yet, the empty rollback goes in and the start's
 *   insert then meets it: rm_xa_start refuses (RM_E_FENCE), and no
 *   prepared transaction can be left holding its row locks for nobody.
 *
 *   The trade-off against AT: the rows a branch wrote stay locked by the
 *   database from the branch's statements to phase two (across the whole
 *   global transaction, and across an RM crash until some RM of the
 *   resource finishes it), and each prepared transaction holds a slot of
 *   max_prepared_transactions; in exchange there is no undo log, no before
 *   image and no global row lock at the coordinator, and readers never see
 *   a change that might be rolled back.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rm_at_int.h"
#include "rm_client.h"
#include "rm_fence.h"
#include "rm_fence_branch.h"
#include "rm_internal.h"
#include "rm_pg.h"
#include "rm_util.h"
#include "rm_xa.h"
#include "txc_failpoint.h"
#include "txp_msg.h"
#include "txp_status.h"

void (*rm__xa_failpoint_after_register)(const char *xid, int64_t branch_id, void *arg) = NULL;
void *rm__xa_failpoint_arg = NULL;

/* undefined_object: "prepared transaction with identifier ... does not exist" */
#define SQLSTATE_NO_SUCH_PREPARED "42704"
/* lock_not_available: the empty rollback waited past lock_timeout */
#define SQLSTATE_LOCK_TIMEOUT "55P03"

void rm__xa_gid(char *out, size_t cap, const char *xid, int64_t branch_id) {
  snprintf(out, cap, "txc:%lld:%s", (long long)branch_id, xid);
}

/* "COMMIT PREPARED 'gid'" (or ROLLBACK) with the id quoted by libpq:
 * malloc'd, NULL on failure. */
static char *finish_sql(PGconn *pg, bool commit, const char *xid, int64_t bid) {
  char gid[RM_XA_GID_MAX];
  rm__xa_gid(gid, sizeof(gid), xid, bid);
  char *lit = PQescapeLiteral(pg, gid, strlen(gid));
  if (!lit) return NULL;
  size_t n = strlen(lit) + 32;
  char *sql = malloc(n);
  if (sql) snprintf(sql, n, "%s PREPARED %s", commit ? "COMMIT" : "ROLLBACK", lit);
  PQfreemem(lit);
  return sql;
}

/* Run COMMIT/ROLLBACK PREPARED: 0, 1 when no such prepared transaction
 * exists, -1 on another failure (message in io). */
static int finish_prepared(rm_pg_io_t *io, bool commit, const char *xid, int64_t bid) {
  char *sql = finish_sql(io->pg, commit, xid, bid);
  if (!sql) {
    snprintf(io->err, io->errlen, "out of memory (or a broken connection) quoting the prepared transaction id");
    io->bad = PQstatus(io->pg) != CONNECTION_OK;
    return -1;
  }
  PGresult *res = PQexec(io->pg, sql);
  free(sql);
  int rc = 0;
  if (PQresultStatus(res) != PGRES_COMMAND_OK) {
    snprintf(io->sqlstate, sizeof(io->sqlstate), "%s", rm__sqlstate(res));
    if (strcmp(io->sqlstate, SQLSTATE_NO_SUCH_PREPARED) == 0) {
      rc = 1;
    } else {
      rm__pg_error(io->err, io->errlen, commit ? "COMMIT PREPARED failed" : "ROLLBACK PREPARED failed", io->pg,
                   res);
      if (PQstatus(io->pg) != CONNECTION_OK || rm__pg_read_only_error(res)) io->bad = true;
      rc = -1;
    }
  }
  PQclear(res);
  return rc;
}

static int xa_commit(rm_pg_io_t *io, rm_at_resource_t *r, const rm_phase2_req_t *req, int *code) {
  int retry = TXP_BS_PHASE2_COMMIT_FAILED_RETRYABLE;
  *code = RM_E_DB;
  int f = finish_prepared(io, true, req->xid, req->branch_id);
  if (f < 0) return retry;
  int found;
  if (f == 0) {
    /* Committed; the row (visible now) marked finished for the sweep.  If
     * that fails, it stays "tried", which a later commit reads as done. */
    if (rm_fence_set(io, req->xid, req->branch_id, RM_FENCE_CONFIRMED) != 0)
      rm__log(r->st->c, RM_LOG_WARN, "XA branch %lld of \"%s\" on \"%s\" committed; its fence row was not marked: %s",
              (long long)req->branch_id, req->xid, r->id, io->err);
    *code = 0;
    return TXP_BS_PHASE2_COMMITTED;
  }
  if (rm_fence_read(io, req->xid, req->branch_id, &found) != 0) return retry;
  switch (found) {
  case RM_FENCE_TRIED: /* visible: its prepared transaction committed (a duplicate) */
  case RM_FENCE_CONFIRMED: *code = 0; return TXP_BS_PHASE2_COMMITTED;
  case RM_FENCE_NONE:
    *code = RM_E_STATE;
    snprintf(io->err, io->errlen,
             "XA branch not prepared yet (no prepared transaction, no fence row): retried; if it never prepares, "
             "the global was committed without it (tcctl show XID)");
    return retry;
  default:
    *code = RM_E_FENCE;
    snprintf(io->err, io->errlen, "the XA branch was rolled back before: it cannot be committed (tcctl show XID)");
    return TXP_BS_PHASE2_COMMIT_FAILED_UNRETRYABLE;
  }
}

static int xa_rollback(rm_pg_io_t *io, rm_at_resource_t *r, const rm_phase2_req_t *req, int *code) {
  int retry = TXP_BS_PHASE2_ROLLBACK_FAILED_RETRYABLE;
  *code = RM_E_DB;
  int f = finish_prepared(io, false, req->xid, req->branch_id);
  if (f < 0) return retry;
  if (f == 0) {
    *code = 0;
    return TXP_BS_PHASE2_ROLLBACKED; /* its fence row went with it */
  }
  bool in = false;
  if (rm_fence_record_empty(io, req->xid, req->branch_id, r->id, TXP_BT_XA, &in) != 0) {
    if (strcmp(io->sqlstate, SQLSTATE_LOCK_TIMEOUT) == 0) {
      *code = RM_E_STATE;
      snprintf(io->err, io->errlen,
               "the XA branch's local transaction is still open (not prepared yet): retried");
    }
    return retry;
  }
  if (in) {
    rm__log(r->st->c, RM_LOG_INFO, "XA branch %lld of \"%s\" on \"%s\" rolled back before it prepared: recorded (a "
            "late start is refused)", (long long)req->branch_id, req->xid, r->id);
    *code = 0;
    return TXP_BS_PHASE2_ROLLBACKED;
  }
  int found;
  if (rm_fence_read(io, req->xid, req->branch_id, &found) != 0) return retry;
  switch (found) {
  case RM_FENCE_CANCELLED:
  case RM_FENCE_CANCELLED_EMPTY: *code = 0; return TXP_BS_PHASE2_ROLLBACKED; /* a duplicate */
  case RM_FENCE_NONE:
    /* The branch's transaction ended between our two statements:
     * prepared now (the retry rolls it back) or gone. */
    *code = RM_E_STATE;
    snprintf(io->err, io->errlen, "the XA branch's transaction ended while it was rolled back: retried");
    return retry;
  default:
    *code = RM_E_FENCE;
    snprintf(io->err, io->errlen, "the XA branch was committed before: it cannot be rolled back (tcctl show XID)");
    return TXP_BS_PHASE2_ROLLBACK_FAILED_UNRETRYABLE;
  }
}

static int xa_phase2(rm_at_resource_t *r, void *arg, const rm_phase2_req_t *req, int *code, char *errmsg,
                     size_t errlen) {
  (void)arg;
  rm_pg_io_t io = {.err = errmsg, .errlen = errlen};
  int retry = req->commit ? TXP_BS_PHASE2_COMMIT_FAILED_RETRYABLE : TXP_BS_PHASE2_ROLLBACK_FAILED_RETRYABLE;
  if (rm__at_conn_get(r, &io.pg, errmsg, errlen) != 0) {
    *code = RM_E_DB;
    return retry;
  }
  int status = req->commit ? xa_commit(&io, r, req, code) : xa_rollback(&io, r, req, code);
  rm__at_conn_put(r, io.pg, io.bad);
  if (status == TXP_BS_PHASE2_COMMIT_FAILED_UNRETRYABLE || status == TXP_BS_PHASE2_ROLLBACK_FAILED_UNRETRYABLE)
    rm__log(r->st->c, RM_LOG_ERROR, "XA %s of branch %lld of \"%s\" on \"%s\" failed for good: %s",
            req->commit ? "commit" : "rollback", (long long)req->branch_id, req->xid, r->id, errmsg);
  return status;
}

/* The mode has no state of its own (its arg is NULL). */
static const rm_at_mode_t xa_mode = {.phase2 = xa_phase2, .sweep = rm_fence_sweep, .free_arg = NULL};

/* -------------------------------------------------------- the public API */

int rm_xa_resource_add(rm_client_t *c, const char *resource_id, const char *conninfo) {
  if (!c || !resource_id || !conninfo)
    return rm__fail(RM_E_INVALID, "could not add an XA resource: the client, the resource id or the conninfo is NULL");
  rm_at_resource_t *r = rm__at_resource_find(c, resource_id);
  if (r && rm__at_resource_mode(r, TXP_BT_XA, NULL)) return 0; /* the same again */
  int rc = rm_fence_require("XA", resource_id, conninfo, true);
  if (rc != 0) {
    rm__log(c, RM_LOG_ERROR, "%s", rm_errmsg());
    return rc;
  }
  if ((rc = rm_resource_add(c, resource_id, conninfo)) != 0) return rc;
  if (!(r = rm__at_resource_find(c, resource_id)))
    return rm__fail(RM_E_INVALID, "could not add XA resource \"%s\": not found after adding", resource_id);
  rm__at_resource_set_mode(r, TXP_BT_XA, &xa_mode, NULL); /* a race of two adds: one wins, both fine */
  return 0;
}

int rm_xa_start(rm_client_t *c, const char *xid, const char *resource_id, PGconn *pg, int64_t *branch_id) {
  /* Built per call: a test sets the hook just before it starts. */
  const rm_fence_opening_t start = {
    .type = TXP_BT_XA, .what = "XA start",
    .not_served = "is not an XA resource of this client (rm_xa_resource_add)",
    .failpoint = "rm.xa.after_register", .after_register = rm__xa_failpoint_after_register,
    .after_register_arg = rm__xa_failpoint_arg};
  return rm__fence_branch_open(c, &start, xid, resource_id, pg, NULL, branch_id);
}

int rm_xa_prepare(rm_client_t *c, const char *xid, PGconn *pg, int64_t branch_id) {
  if (!c || !xid || !xid[0] || strlen(xid) > TXP_MAX_XID_LEN || !pg || branch_id <= 0)
    return rm__fail(RM_E_INVALID, "XA prepare: the client, the xid, the connection or the branch id is missing "
                                  "or invalid");
  PGTransactionStatusType ts = PQtransactionStatus(pg);
  if (ts != PQTRANS_INTRANS && ts != PQTRANS_INERROR)
    return rm__fail(RM_E_STATE, "XA prepare of \"%s\": the connection is not inside the branch's transaction", xid);
  char gid[RM_XA_GID_MAX];
  rm__xa_gid(gid, sizeof(gid), xid, branch_id);
  char *lit = PQescapeLiteral(pg, gid, strlen(gid));
  if (!lit) return rm__fail(RM_E_NOMEM, "XA prepare of \"%s\": could not quote its id", xid);
  char sql[RM_XA_GID_MAX * 2 + 32];
  snprintf(sql, sizeof(sql), "PREPARE TRANSACTION %s", lit);
  PQfreemem(lit);
  PGresult *res = PQexec(pg, sql);
  int rc = 0;
  if (PQresultStatus(res) != PGRES_COMMAND_OK) {
    char err[RM_ERRMSG_MAX];
    rm__pg_error(err, sizeof(err), "PREPARE TRANSACTION failed", pg, res);
    rc = rm__fail(RM_E_DB, "XA prepare of \"%s\" (branch %lld): %s", xid, (long long)branch_id, err);
  } else if (strcmp(PQcmdStatus(res), "PREPARE TRANSACTION") != 0) {
    /* An aborted transaction: PREPARE rolls it back. */
    rc = rm__fail(RM_E_DB, "XA prepare of \"%s\" (branch %lld): the transaction had failed and was rolled back "
                           "instead (nothing was prepared)", xid, (long long)branch_id);
  }
  PQclear(res);
  if (rc == 0) TXC_FAILPOINT("rm.xa.after_prepare");
  return rc;
}
