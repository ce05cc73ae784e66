/*
 * rm_saga.c - saga steps (rm_client.h, "RM: Saga mode"): a step added by
 * the TM, its action and compensation run behind the fence when the
 * coordinator drives them.
 *
 * NOTES
 *   Layering.  As for TCC: a saga resource is an AT resource with a mode
 *   attached (rm__at_resource_set_mode), which gives it the phase-two
 *   pool, the dispatch and the retention sweep; the fence (rules
 *   rm_fence_saga, one local transaction rm_fence_run) is fence/'s.  The
 *   arrows run saga -> at, saga -> fence.
 *
 *   A step is a branch of type SAGA that holds no lock and does nothing at
 *   registration: the coordinator stores its args (the branch's
 *   application data) and sends them with each call of phase two, where
 *   "commit" is the action and "rollback" the compensation
 *   (tc/tc_phase2.c NOTES: one step at a time, in order; compensations
 *   newest first).  So the process that adds steps need not serve the
 *   resource, and any process that serves it runs them.
 *
 *   The fence row is written by the action (inserted, then the handler,
 *   then set confirmed, in one transaction) or by an empty compensation.
 *   An action that failed, or never came, leaves no row: its compensation
 *   records "cancelled before any try" and runs no handler, and a late
 *   delivery of the action then finds that row and is refused.
 */
#include <stdlib.h>
#include <string.h>

#include "rm_at_int.h"
#include "rm_client.h"
#include "rm_fence.h"
#include "rm_fence_branch.h"
#include "rm_internal.h"
#include "rm_util.h"
#include "txp_msg.h"
#include "txp_status.h"

static int saga_phase2(rm_at_resource_t *r, void *arg, const rm_phase2_req_t *req, int *code, char *errmsg,
                       size_t errlen);

static const rm_at_mode_t saga_mode = {.phase2 = saga_phase2, .sweep = rm_fence_sweep, .free_arg = free};

static const rm_fence_handled_mode_t saga_handled = {
  .type = TXP_BT_SAGA, .name = "saga", .handler_names = "action and compensate", .ops = &saga_mode,
  .branch_word = "saga step",
  .empty_note = "compensated before its action committed: recorded, nothing to undo (a late action is refused)"};

static int saga_phase2(rm_at_resource_t *r, void *arg, const rm_phase2_req_t *req, int *code, char *errmsg,
                       size_t errlen) {
  const rm_saga_handlers_t *h = arg; /* the mode's state of one resource: a copy of the handlers */
  rm_fence_job_t job = {.what = req->commit ? "action" : "compensation", .args = req->args, .rules = rm_fence_saga,
                        .handler = req->commit ? h->action : h->compensate, .handler_arg = h->arg};
  int status = rm__fence_phase2(r, &saga_handled, req, &job, code, errmsg, errlen);
  /* A failed action is compensated: a warning; a failed compensation
   * needs an operator. */
  if (status == TXP_BS_PHASE2_COMMIT_FAILED_UNRETRYABLE || status == TXP_BS_PHASE2_ROLLBACK_FAILED_UNRETRYABLE)
    rm__log(r->st->c, req->commit ? RM_LOG_WARN : RM_LOG_ERROR, "saga %s of step %lld of \"%s\" on \"%s\" failed "
            "for good: %s%s", job.what, (long long)req->branch_id, req->xid, r->id, errmsg,
            req->commit && *code != RM_E_FENCE ? " (the saga is compensated)" : "");
  return status;
}

/* -------------------------------------------------------- the public API */

int rm_saga_resource_add(rm_client_t *c, const char *resource_id, const char *conninfo,
                         const rm_saga_handlers_t *h) {
  return rm__fence_resource_add(c, &saga_handled, resource_id, conninfo, h, sizeof(*h),
                                h && h->action && h->compensate);
}

int rm_saga_step(rm_client_t *c, const char *xid, const char *resource_id, const char *args, int64_t *branch_id) {
  if (branch_id) *branch_id = 0;
  if (!c || !xid || !xid[0] || strlen(xid) > TXP_MAX_XID_LEN || !resource_id || !resource_id[0] ||
      strlen(resource_id) > TXP_MAX_RESOURCE_LEN)
    return rm__fail(RM_E_INVALID, "saga step: the client, the xid (1 to %d bytes) or the resource id (1 to %d "
                                  "bytes) is missing or invalid", TXP_MAX_XID_LEN, TXP_MAX_RESOURCE_LEN);
  if (args && strlen(args) > RM_FENCE_ARGS_MAX)
    return rm__fail(RM_E_INVALID, "saga step of \"%s\": args of %zu bytes (at most %u)", xid, strlen(args),
                    RM_FENCE_ARGS_MAX);
  if (args && strcmp(args, TXP_APP_DATA_PHASE2_SYNC) == 0)
    return rm__fail(RM_E_INVALID, "saga step of \"%s\": args \"%s\" are reserved by the protocol", xid, args);
  char err[RM_ERRMSG_MAX];
  int64_t bid = 0;
  int rc = rm__branch_register_as(c, TXP_BT_SAGA, xid, resource_id, NULL, args, 0, &bid, err, sizeof(err));
  if (rc != 0) return rm__fail(rc, "saga step of \"%s\" on \"%s\": registration failed: %s", xid, resource_id, err);
  if (branch_id) *branch_id = bid;
  return 0;
}
