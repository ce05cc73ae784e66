/*
 * rm_fence_branch.c - adding a resource of a fenced mode and opening a
 * fenced branch in the caller's transaction: the steps TCC, saga and XA
 * share (rm_fence_branch.h).
 */
#include <stdlib.h>
#include <string.h>

#include "rm_client.h"
#include "rm_fence.h"
#include "rm_fence_branch.h"
#include "rm_internal.h"
#include "rm_util.h"
#include "txc_failpoint.h"
#include "txp_msg.h"
#include "txp_status.h"

int rm__fence_resource_add(rm_client_t *c, const rm_fence_handled_mode_t *mode, const char *resource_id,
                           const char *conninfo, const void *h, size_t size, bool complete) {
  if (!c || !resource_id || !conninfo || !h || !complete)
    return rm__fail(RM_E_INVALID, "could not add a %s resource: the client, the resource id, the conninfo, the "
                                  "handlers or one of %s is NULL", mode->name, mode->handler_names);
  rm_at_resource_t *r = rm__at_resource_find(c, resource_id);
  if (r && rm__at_resource_mode(r, mode->type, NULL))
    return rm__fail(RM_E_INVALID, "could not add %s resource \"%s\": it has %s handlers already", mode->name,
                    resource_id, mode->name);
  int rc = rm_fence_require(mode->name, resource_id, conninfo, false);
  if (rc != 0) {
    rm__log(c, RM_LOG_ERROR, "%s", rm_errmsg());
    return rc;
  }
  void *copy = malloc(size);
  if (!copy) return rm__fail(RM_E_NOMEM, "could not add %s resource \"%s\": out of memory", mode->name, resource_id);
  memcpy(copy, h, size);
  return rm__at_resource_add_mode(c, mode->name, resource_id, conninfo, mode->type, mode->ops, copy);
}

int rm__fence_branch_open(rm_client_t *c, const rm_fence_opening_t *o, const char *xid, const char *resource_id,
                          PGconn *pg, const char *args, int64_t *branch_id) {
  if (branch_id) *branch_id = 0;
  if (!c || !xid || !xid[0] || strlen(xid) > TXP_MAX_XID_LEN || !resource_id || !pg)
    return rm__fail(RM_E_INVALID, "%s: the client, the xid (1 to %d bytes), the resource id or the connection is "
                                  "missing or invalid", o->what, TXP_MAX_XID_LEN);
  if (args && strlen(args) > RM_FENCE_ARGS_MAX)
    return rm__fail(RM_E_INVALID, "%s of \"%s\": args of %zu bytes (at most %u)", o->what, xid, strlen(args),
                    RM_FENCE_ARGS_MAX);
  rm_at_resource_t *r = rm__at_resource_find(c, resource_id);
  if (!r || !rm__at_resource_mode(r, o->type, NULL))
    return rm__fail(RM_E_INVALID, "%s of \"%s\": resource \"%s\" %s", o->what, xid, resource_id, o->not_served);
  if (PQtransactionStatus(pg) != PQTRANS_INTRANS)
    return rm__fail(RM_E_STATE, "%s of \"%s\": the connection is not inside a transaction block (BEGIN first; a "
                                "failed statement must be rolled back)", o->what, xid);

  char err[RM_ERRMSG_MAX];
  int64_t bid = 0;
  int rc = rm__branch_register_as(c, o->type, xid, resource_id, NULL, NULL, 0, &bid, err, sizeof(err));
  if (rc != 0) return rm__fail(rc, "%s of \"%s\" on \"%s\": registration failed: %s", o->what, xid, resource_id, err);
  if (o->after_register) o->after_register(xid, bid, o->after_register_arg);
  TXC_FAILPOINT(o->failpoint);

  if ((rc = rm_fence_first(pg, o->what, xid, bid, resource_id, o->type, args)) != 0) return rc;
  if (branch_id) *branch_id = bid;
  return 0;
}

int rm__fence_phase2(rm_at_resource_t *r, const rm_fence_handled_mode_t *mode, const rm_phase2_req_t *req,
                     rm_fence_job_t *job, int *code, char *errmsg, size_t errlen) {
  rm_pg_io_t io = {.err = errmsg, .errlen = errlen};
  if (rm__at_conn_get(r, &io.pg, errmsg, errlen) != 0) {
    *code = RM_E_DB;
    return req->commit ? TXP_BS_PHASE2_COMMIT_FAILED_RETRYABLE : TXP_BS_PHASE2_ROLLBACK_FAILED_RETRYABLE;
  }
  job->commit = req->commit;
  job->xid = req->xid;
  job->branch_id = req->branch_id;
  job->resource_id = r->id;
  job->branch_type = mode->type;
  job->mode = mode->name;
  bool empty;
  int status = rm_fence_run(&io, job, code, &empty);
  rm__at_conn_put(r, io.pg, io.bad);
  if (empty)
    rm__log(r->st->c, RM_LOG_INFO, "%s %lld of \"%s\" on \"%s\" %s", mode->branch_word, (long long)req->branch_id,
            req->xid, r->id, mode->empty_note);
  return status;
}
