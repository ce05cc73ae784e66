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
 *   Phase two.  One local transaction behind the fence (rm_fence_run:
 *   lock the row, rm_fence_phase2 decides, the handler runs on the same
 *   connection, the row is set, commit).  The handler's database change
 *   and the fence row commit together or not at all; a change outside the
 *   database must be idempotent, for when the commit fails after it.  A confirm that finds
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
#include "rm_fence_branch.h"
#include "rm_internal.h"
#include "rm_pg.h"
#include "rm_tcc.h"
#include "rm_util.h"
#include "txp_msg.h"
#include "txp_status.h"

void (*rm__tcc_failpoint_after_register)(const char *xid, int64_t branch_id, void *arg) = NULL;
void *rm__tcc_failpoint_arg = NULL;

/* ----------------------------------------------------------- phase two */

static int tcc_phase2(rm_at_resource_t *r, void *arg, const rm_phase2_req_t *req, int *code, char *errmsg,
                      size_t errlen);

static const rm_at_mode_t tcc_mode = {.phase2 = tcc_phase2, .sweep = rm_fence_sweep, .free_arg = free};

static const rm_fence_handled_mode_t tcc_handled = {
  .type = TXP_BT_TCC, .name = "TCC", .handler_names = "confirm and cancel", .ops = &tcc_mode,
  .branch_word = "branch", .empty_note = "cancelled before its try: recorded (a late try is refused)"};

static int tcc_phase2(rm_at_resource_t *r, void *arg, const rm_phase2_req_t *req, int *code, char *errmsg,
                      size_t errlen) {
  const rm_tcc_handlers_t *h = arg; /* the mode's state of one resource: a copy of the handlers */
  rm_fence_job_t job = {.what = req->commit ? "confirm" : "cancel", .args = NULL, .rules = rm_fence_phase2,
                        .handler = req->commit ? h->confirm : h->cancel, .handler_arg = h->arg};
  int status = rm__fence_phase2(r, &tcc_handled, req, &job, code, errmsg, errlen);
  if (status == TXP_BS_PHASE2_COMMIT_FAILED_UNRETRYABLE || status == TXP_BS_PHASE2_ROLLBACK_FAILED_UNRETRYABLE)
    rm__log(r->st->c, RM_LOG_ERROR, "TCC %s of branch %lld of \"%s\" on \"%s\" failed for good: %s", job.what,
            (long long)req->branch_id, req->xid, r->id, errmsg);
  return status;
}

/* -------------------------------------------------------- the public API */

int rm_tcc_resource_add(rm_client_t *c, const char *resource_id, const char *conninfo, const rm_tcc_handlers_t *h) {
  return rm__fence_resource_add(c, &tcc_handled, resource_id, conninfo, h, sizeof(*h), h && h->confirm && h->cancel);
}

int rm_tcc_try(rm_client_t *c, const char *xid, const char *resource_id, PGconn *pg, const char *args,
               int64_t *branch_id) {
  /* Built per call: a test sets the hook just before it tries. */
  const rm_fence_opening_t try = {
    .type = TXP_BT_TCC, .what = "TCC try", .not_served = "has no TCC handlers in this client (rm_tcc_resource_add)",
    .failpoint = "rm.tcc.after_register", .after_register = rm__tcc_failpoint_after_register,
    .after_register_arg = rm__tcc_failpoint_arg};
  return rm__fence_branch_open(c, &try, xid, resource_id, pg, args, branch_id);
}
