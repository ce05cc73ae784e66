/*
 * rm_tcc.c - TCC branches (rm_client.h, "RM: TCC mode"): the try inside
 * the caller's local transaction, and phase two (confirm or cancel) behind
 * the fence, on a connection of the resource's phase-two pool.
 *
 * NOTES
 *   Layering.  A TCC resource is an AT resource (at/rm_resource.c) with a
 *   mode attached (rm__at_resource_set_mode): the resource list, its
 *   connection pool, the dispatch of phase two and the deleter's retention
 *   sweep are the AT layer's; the fence's rules and rows are fence/'s
 *   (shared with XA); this file knows the handlers.  The arrows run
 *   tcc -> at, tcc -> fence.
 *
 *   The try.  Register first, then write the fence row: the branch id is
 *   the row's key, and a registration the coordinator refuses (the global
 *   is already rolling back, timed out) leaves nothing to undo.  Between
 *   the two the coordinator may decide a rollback and send the cancel:
 *   it finds no row (the try's insert is not committed, or not even sent)
 *   and records "cancelled before any try".  The try's insert then meets
 *   that row on the key (ON CONFLICT DO NOTHING: no error, 0 rows), reads
 *   it and refuses (RM_E_FENCE): no reservation is made that nobody
 *   would release.  If the two inserts race, the later one waits on the
 *   key for the first one's transaction and then sees its row.
 *
 *   Phase two.  One local transaction: lock the row (FOR UPDATE; a second
 *   delivery of the same confirm waits and then finds it confirmed), let
 *   rm_fence_phase2 decide, run the handler on the same connection,
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
#include "rm_fence.h"
#include "rm_internal.h"
#include "rm_pg.h"
#include "rm_tcc.h"
#include "rm_util.h"
#include "txc_failpoint.h"
#include "txp_msg.h"
#include "txp_status.h"

void (*rm__tcc_failpoint_after_register)(const char *xid, int64_t branch_id, void *arg) = NULL;
void *rm__tcc_failpoint_arg = NULL;

/* The mode's state of one resource: a copy of the handlers. */
typedef struct tcc_resource {
  rm_tcc_handlers_t h;
} tcc_resource_t;

/* ----------------------------------------------------------- phase two */

/* Run the handler inside the transaction: 0, or the branch status of its
 * failure with *code set. */
static int run_handler(rm_fence_io_t *io, rm_at_resource_t *r, const tcc_resource_t *tr,
                       const rm_phase2_req_t *req, const char *args, int retry, int never, int *code) {
  rm_tcc_call_t call = {
    .xid = req->xid, .branch_id = req->branch_id, .resource_id = r->id, .args = args, .pg = io->pg};
  char herr[512] = "";
  int hrc = (req->commit ? tr->h.confirm : tr->h.cancel)(&call, tr->h.arg, herr, sizeof(herr));
  const char *what = req->commit ? "confirm" : "cancel";
  *code = RM_E_TCC_HANDLER;
  if (hrc == RM_TCC_OK) {
    if (PQtransactionStatus(io->pg) == PQTRANS_INTRANS) return 0;
    /* Its transaction was ended or broken: the fence row cannot be written
     * with the change, so nothing is recorded and the handler runs again. */
    snprintf(io->err, io->errlen,
             "the TCC %s handler of \"%s\" returned OK but left its transaction %s (a handler must not COMMIT, "
             "ROLLBACK or leave a failed statement): retried",
             what, r->id, PQtransactionStatus(io->pg) == PQTRANS_INERROR ? "failed" : "ended");
    return retry;
  }
  snprintf(io->err, io->errlen, "the TCC %s handler of \"%s\" %s: %s", what, r->id,
           hrc == RM_TCC_FAILED ? "failed for good" : "asked for a retry", herr[0] ? herr : "(no message)");
  return hrc == RM_TCC_FAILED ? never : retry;
}

static int fence_phase2(rm_fence_io_t *io, rm_at_resource_t *r, const tcc_resource_t *tr,
                        const rm_phase2_req_t *req, int *code) {
  int ok = req->commit ? TXP_BS_PHASE2_COMMITTED : TXP_BS_PHASE2_ROLLBACKED;
  int retry = req->commit ? TXP_BS_PHASE2_COMMIT_FAILED_RETRYABLE : TXP_BS_PHASE2_ROLLBACK_FAILED_RETRYABLE;
  int never = req->commit ? TXP_BS_PHASE2_COMMIT_FAILED_UNRETRYABLE : TXP_BS_PHASE2_ROLLBACK_FAILED_UNRETRYABLE;
  *code = RM_E_DB;
  if (rm_fence_command(io, "BEGIN", "could not begin the TCC phase-two transaction") != 0) return retry;
  int found;
  char *args = NULL;
  if (rm_fence_lock(io, req->xid, req->branch_id, &found, &args) != 0) return retry;
  int to, status = retry;
  const char *why;
  rm_fence_action_t act = rm_fence_phase2(req->commit, found, &to, &why);
  if (act == RM_FENCE_RECORD) {
    bool in;
    if (rm_fence_record_empty(io, req->xid, req->branch_id, r->id, TXP_BT_TCC, &in) != 0) goto out;
    if (!in) { /* the try committed after our read: decide again on its row */
      free(args);
      if (rm_fence_lock(io, req->xid, req->branch_id, &found, &args) != 0) goto out;
      act = rm_fence_phase2(req->commit, found, &to, &why);
      if (act == RM_FENCE_RECORD) { /* cannot be: a row was there */
        snprintf(io->err, io->errlen, "the fence row of the branch appeared and vanished: retried");
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
    *code = act == RM_FENCE_RETRY ? RM_E_STATE : RM_E_FENCE;
    snprintf(io->err, io->errlen, "%s", why);
    status = act == RM_FENCE_RETRY ? retry : never;
    goto out;
  case RM_FENCE_RUN: {
    int hs = run_handler(io, r, tr, req, args, retry, never, code);
    if (hs != 0) {
      status = hs;
      goto out;
    }
    *code = RM_E_DB;
    if (rm_fence_set(io, req->xid, req->branch_id, to) != 0) goto out;
    break;
  }
  case RM_FENCE_RECORD: break; /* the row went in above */
  }
  if (rm_fence_command(io, "COMMIT", "could not commit the TCC phase-two transaction") != 0) goto out;
  if (act == RM_FENCE_RECORD)
    rm__log(r->st->c, RM_LOG_INFO, "branch %lld of \"%s\" on \"%s\" cancelled before its try: recorded (a late "
            "try is refused)", (long long)req->branch_id, req->xid, r->id);
  *code = 0;
  status = ok;
out:
  free(args);
  return status;
}

static int tcc_phase2(rm_at_resource_t *r, void *arg, const rm_phase2_req_t *req, int *code, char *errmsg,
                      size_t errlen) {
  rm_fence_io_t io = {.err = errmsg, .errlen = errlen};
  int retry = req->commit ? TXP_BS_PHASE2_COMMIT_FAILED_RETRYABLE : TXP_BS_PHASE2_ROLLBACK_FAILED_RETRYABLE;
  if (rm__at_conn_get(r, &io.pg, errmsg, errlen) != 0) {
    *code = RM_E_DB;
    return retry;
  }
  int status = fence_phase2(&io, r, arg, req, code);
  if (PQtransactionStatus(io.pg) != PQTRANS_IDLE) {
    PGresult *rb = PQexec(io.pg, "ROLLBACK");
    if (PQresultStatus(rb) != PGRES_COMMAND_OK) io.bad = true;
    PQclear(rb);
  }
  rm__at_conn_put(r, io.pg, io.bad);
  if (status == TXP_BS_PHASE2_COMMIT_FAILED_UNRETRYABLE || status == TXP_BS_PHASE2_ROLLBACK_FAILED_UNRETRYABLE)
    rm__log(r->st->c, RM_LOG_ERROR, "TCC %s of branch %lld of \"%s\" on \"%s\" failed for good: %s",
            req->commit ? "confirm" : "cancel", (long long)req->branch_id, req->xid, r->id, errmsg);
  return status;
}

/* The retention sweep: finished rows older than 'retention_s'. */
static long long tcc_sweep(rm_at_resource_t *r, void *arg, PGconn *pg, unsigned retention_s, unsigned limit,
                           char *err, size_t errlen) {
  (void)r;
  (void)arg;
  rm_fence_io_t io = {.pg = pg, .err = err, .errlen = errlen};
  long long n = rm_fence_sweep(&io, TXP_BT_TCC, retention_s, limit);
  return n < 0 ? RM_E_DB : n;
}

static const rm_at_mode_t tcc_mode = {.phase2 = tcc_phase2, .sweep = tcc_sweep, .free_arg = free};

/* -------------------------------------------------------- the public API */

int rm_tcc_resource_add(rm_client_t *c, const char *resource_id, const char *conninfo, const rm_tcc_handlers_t *h) {
  if (!c || !resource_id || !conninfo || !h || !h->confirm || !h->cancel)
    return rm__fail(RM_E_INVALID, "could not add a TCC resource: the client, the resource id, the conninfo, the "
                                  "handlers or one of confirm and cancel is NULL");
  rm_at_resource_t *r = rm__at_resource_find(c, resource_id);
  if (r && rm__at_resource_mode(r, TXP_BT_TCC, NULL))
    return rm__fail(RM_E_INVALID, "could not add TCC resource \"%s\": it has TCC handlers already", resource_id);
  int rc = rm_fence_require("TCC", resource_id, conninfo, false);
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
  if (args && strlen(args) > RM_FENCE_ARGS_MAX)
    return rm__fail(RM_E_INVALID, "TCC try of \"%s\": args of %zu bytes (at most %u)", xid, strlen(args),
                    RM_FENCE_ARGS_MAX);
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

  if ((rc = rm_fence_first(pg, "TCC try", xid, bid, resource_id, TXP_BT_TCC, args)) != 0) return rc;
  if (branch_id) *branch_id = bid;
  return 0;
}
