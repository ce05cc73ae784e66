/*
 * rm_serve.c - requests from a coordinator to this client: BranchCommit
 * and BranchRollback run the resource manager's phase two (rm_rm_ops_t
 * .phase2, the AT layer's) on libuv's thread pool, since it blocks on
 * PostgreSQL, and are answered from the loop thread on the connection they
 * came on.  The common AT commit (queue the undo row for the background
 * deleter) is answered at once from the loop thread (.commit_queued).  A
 * client with no resource manager attached answers that it serves no
 * resource.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rm_core.h"

#define RM_MAX_PHASE2 1024 /* phase-two jobs running at once; TXP_EBUSY beyond */

typedef struct p2_job {
  uv_work_t work;
  rm_client_t *c;
  int node;
  uint64_t session;
  uint64_t request_id;
  uint16_t type;
  uint16_t flags;
  bool commit;
  int64_t branch_id;
  int branch_type;
  int status;
  int code;
  char xid[TXP_MAX_XID_LEN + 1];
  char resource_id[TXP_MAX_RESOURCE_LEN + 1];
  char *args; /* the request's application data (a saga step's args), owned */
  char errmsg[TXP_MAX_MESSAGE_LEN + 1];
} p2_job_t;

static void p2_free(p2_job_t *j) {
  free(j->args);
  free(j);
}

/* Send the *_RESULT of a phase-two request; a message the encoder refuses
 * (not UTF-8) is dropped rather than the answer. */
static void p2_answer(rm_conn_t *conn, uint16_t type, uint64_t request_id, const char *xid,
                      int64_t branch_id, int code, int status, const char *message) {
  txp_msg_t res;
  txp_msg_init(&res, (txp_msg_type_t)(type + 1));
  res.request_id = request_id;
  res.flags = TXP_FLAG_RESPONSE;
  txp_msg_set_int(&res, TXP_F_CODE, code);
  txp_msg_set_int(&res, TXP_F_BRANCH_STATUS, status);
  txp_msg_set_str(&res, TXP_F_XID, xid);
  txp_msg_set_int(&res, TXP_F_BRANCH_ID, branch_id);
  if (message && message[0]) txp_msg_set_str(&res, TXP_F_MESSAGE, message);
  int rc = rm__conn_send(conn, &res, NULL);
  if (rc != 0 && rc != TXP_ECONN_LOST && message) {
    txp_msg_set_str(&res, TXP_F_MESSAGE, NULL);
    rm__conn_send(conn, &res, NULL);
  }
}

static void p2_work(uv_work_t *w) {
  p2_job_t *j = w->data;
  rm_phase2_req_t req = {j->commit, j->xid, j->branch_id, j->resource_id, j->branch_type, j->args};
  j->code = 0;
  j->errmsg[0] = '\0';
  void *rm = rm__rm_peek(j->c);
  if (!rm) {
    j->code = RM_E_INVALID;
    snprintf(j->errmsg, sizeof(j->errmsg), "resource \"%s\" is not served by this client", j->resource_id);
    j->status = j->commit ? TXP_BS_PHASE2_COMMIT_FAILED_RETRYABLE : TXP_BS_PHASE2_ROLLBACK_FAILED_RETRYABLE;
    return;
  }
  j->status = j->c->rm_ops->phase2(rm, &req, &j->code, j->errmsg, sizeof(j->errmsg));
}

static void p2_after(uv_work_t *w, int status) {
  p2_job_t *j = w->data;
  rm_client_t *c = j->c;
  int ok = j->commit ? TXP_BS_PHASE2_COMMITTED : TXP_BS_PHASE2_ROLLBACKED;
  int retry = j->commit ? TXP_BS_PHASE2_COMMIT_FAILED_RETRYABLE : TXP_BS_PHASE2_ROLLBACK_FAILED_RETRYABLE;
  int fail = j->commit ? TXP_BS_PHASE2_COMMIT_FAILED_UNRETRYABLE : TXP_BS_PHASE2_ROLLBACK_FAILED_UNRETRYABLE;
  c->phase2_jobs--;
  if (status == UV_ECANCELED) {
    j->status = retry;
    j->code = TXP_ESHUTDOWN;
  }
  if (j->status == ok) {
    j->code = 0;
  } else {
    if (j->status != retry && j->status != fail) {
      RM_LOG_C(c, RM_LOG_WARN, "phase two of branch %" PRId64 " returned branch status %d, which is not a "
          "result of %s: answering it as retryable", j->branch_id, j->status,
          j->commit ? "a commit" : "a rollback");
      j->status = retry;
    }
    if (j->code == 0) j->code = j->status == fail ? TXP_EBRANCH_UNRETRYABLE : TXP_EBRANCH_RETRYABLE;
    rm__utf8_cut(j->errmsg, TXP_MAX_MESSAGE_LEN);
    RM_LOG_C(c, RM_LOG_WARN, "could not %s branch %" PRId64 " of global transaction \"%s\" on \"%s\": %s",
        j->commit ? "commit" : "roll back", j->branch_id, j->xid, j->resource_id,
        j->errmsg[0] ? j->errmsg : rm_strerror(j->code));
  }
  rm_conn_t *conn = c->stopping ? NULL : c->nodes[j->node].conn;
  if (conn && rm__conn_ready(conn) && rm__conn_session(conn) == j->session) {
    if (!(j->flags & TXP_FLAG_ONEWAY))
      p2_answer(conn, j->type, j->request_id, j->xid, j->branch_id, j->code, j->status, j->errmsg);
  } else {
    /* The coordinator times the call out and drives the branch again. */
    RM_LOG_C(c, RM_LOG_DEBUG, "dropping the answer to %s of branch %" PRId64 ": its connection is gone",
        txp_msg_type_name(j->type), j->branch_id);
  }
  p2_free(j);
}

/* A refusal of 'm', unless it is one way (a commit notice, which nobody
 * waits for: the coordinator's leftovers then go to the resolve pass). */
static void p2_refuse(rm_conn_t *conn, const txp_msg_t *m, int code, int status, const char *msg) {
  if (m->flags & TXP_FLAG_ONEWAY) return;
  p2_answer(conn, m->type, m->request_id, m->xid, m->branch_id, code, status, msg);
}

/* BranchCommit/BranchRollback from a coordinator: run the AT layer's
 * phase two on the thread pool and answer from p2_after(). */
static void start_phase2(rm_client_t *c, rm_conn_t *conn, const txp_msg_t *m) {
  bool commit = m->type == TXP_MSG_BRANCH_COMMIT;
  int retry = commit ? TXP_BS_PHASE2_COMMIT_FAILED_RETRYABLE : TXP_BS_PHASE2_ROLLBACK_FAILED_RETRYABLE;
  if (c->phase2_jobs >= RM_MAX_PHASE2) {
    p2_refuse(conn, m, TXP_EBUSY, retry,
              "too many phase-two requests in progress on this client: retry later");
    return;
  }
  int branch_type = txp_msg_has(m, TXP_F_BRANCH_TYPE) ? (int)m->branch_type : TXP_BT_AT;
  rm_phase2_req_t fast = {commit, m->xid, m->branch_id, m->resource_id, branch_type, NULL};
  void *rm = rm__rm_peek(c);
  if (rm && c->rm_ops->commit_queued(rm, &fast)) {
    /* Answered from here: a trip through the thread pool would cost two
     * thread switches per branch for a queue push. */
    if (!(m->flags & TXP_FLAG_ONEWAY))
      p2_answer(conn, m->type, m->request_id, m->xid, m->branch_id, 0, TXP_BS_PHASE2_COMMITTED, NULL);
    return;
  }
  p2_job_t *j = calloc(1, sizeof(*j));
  if (!j) {
    p2_refuse(conn, m, TXP_ENOMEM, retry, "out of memory");
    return;
  }
  j->c = c;
  j->node = rm__conn_index(conn);
  j->session = rm__conn_session(conn);
  j->request_id = m->request_id;
  j->type = m->type;
  j->flags = m->flags;
  j->commit = commit;
  j->branch_id = m->branch_id;
  j->branch_type = branch_type;
  snprintf(j->xid, sizeof(j->xid), "%s", m->xid ? m->xid : "");
  snprintf(j->resource_id, sizeof(j->resource_id), "%s", m->resource_id ? m->resource_id : "");
  if (m->application_data && !(j->args = strdup(m->application_data))) {
    p2_refuse(conn, m, TXP_ENOMEM, retry, "out of memory");
    free(j);
    return;
  }
  j->work.data = j;
  int rc = uv_queue_work(&c->loop, &j->work, p2_work, p2_after);
  if (rc != 0) {
    p2_refuse(conn, m, TXP_EINTERNAL, retry,
              "could not queue phase two on this client");
    p2_free(j);
    return;
  }
  c->phase2_jobs++;
}

void rm__serve_request(rm_client_t *c, rm_conn_t *conn, const txp_msg_t *m) {
  txp_msg_t res;
  switch (m->type) {
  case TXP_MSG_BRANCH_COMMIT:
  case TXP_MSG_BRANCH_ROLLBACK:
    start_phase2(c, conn, m);
    return;
  case TXP_MSG_UNDO_LOG_DELETE:
    /* Undo rows go with phase-two commit and the AT layer's sweep. */
    if (m->flags & TXP_FLAG_ONEWAY) return;
    txp_msg_init_result(&res, m, 0, NULL);
    rm__conn_send(conn, &res, NULL);
    return;
  default:
    if (m->flags & TXP_FLAG_ONEWAY) return;
    txp_msg_init_result(&res, m, TXP_EBAD_REQUEST, "request type not served by a client");
    rm__conn_send(conn, &res, NULL);
    return;
  }
}
