/*
 * tc_coord.c - the coordinator's request handlers: GlobalBegin, Commit,
 * Rollback, Status, Report, BranchRegister (with lock waits), BranchReport
 * and GlobalLockQuery.
 *
 * NOTES
 *   Each request becomes a call_t that owns the tc_req_t until it replies.
 *   Validation happens here, before anything reaches the store: a request
 *   that fails it is answered at once with the specific code and changes
 *   nothing.  State changes go through tc_store ops (group commit); the
 *   reply is sent only from the op's callback, i.e. after the change is
 *   durable, with one exception: a new begin (no idempotency key, or its
 *   key's first send) is answered at once and held until its first
 *   registration carries it (tc_hold.h), and every other request about its
 *   xid waits for that.
 *   Status and LockQuery are reads (tc_store_read.h) on the store's reader
 *   connections, outside the batches.
 *
 *   Lifecycle of a global transaction as this node sees it:
 *     1. GlobalBegin: id from the node's block, row inserted (Begin), in
 *        the first registration's transaction when the begin was held.
 *     2. BranchRegister: branch row + lock rows in one transaction, only
 *        while Begin and before the deadline; a conflict may wait (pushed
 *        wake-up from tc_lockwait).  A BranchRegister without an xid
 *        (with a timeout) does 1 and 2 at once, for a branch without
 *        locks: handle_begin_register.
 *     3. GlobalCommit/Rollback: compare-and-set from Begin (tc_decide_batch);
 *        commit releases the locks in the same transaction.  The decision is
 *        durable before any branch hears of it.
 *     4. Phase two (tc_phase2.c) tells each branch; each outcome is stored;
 *        the last one moves the transaction to history.  An AT commit
 *        without commit work skips it: the decision's transaction moved it
 *        to history already (sql/tc/010), and its branches are only told.
 *   A crash after 3 leaves a session whose retry lease expires; the leader's
 *   recovery job adopts and finishes it (tc_recovery.c).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "tc_hold.h"
#include "tc_lockwait.h"
#include "tc_log.h"
#include "txc_failpoint.h"
#include "tc_ctx.h"
#include "tc_coord.h"
#include "tc_phase2.h"
#include "txp_xid.h"
#include "tc_server.h"
#include "tc_store_read.h"
#include "txp_lockkey.h"

#define READ_DEADLINE_MS 5000 /* a read's wait for a reader connection */

typedef struct call {
  tc_ctx_t *ctx;
  tc_req_t *req;
  tc_op_t op;
  tc_waiter_t waiter;
  bool waiting;
  int races; /* conflicts with a key released meanwhile: retried at once */
  uint64_t started_ns;
  uint64_t submitted_ns; /* the op's latest submission to the store */
  uint64_t lock_deadline_ns;
  char xid[TXP_MAX_XID_LEN + 1];
  /* The connection's identity when the request arrived: copied, since the
   * connection may register again (and free the old strings) while the op
   * is queued or waiting for a lock. */
  char client_id[TXP_MAX_NAME_LEN + 1];
  char app_id[TXP_MAX_NAME_LEN + 1];
  char group[TXP_MAX_NAME_LEN + 1];
} call_t;

/* The caller's identity, copied into the call and named by its op: the
 * store checks it against the transaction's owner (may_act, below). */
static void call_identify(call_t *c, const tc_conn_t *conn) {
  snprintf(c->client_id, sizeof(c->client_id), "%s", tc_conn_client_id(conn));
  snprintf(c->app_id, sizeof(c->app_id), "%s", tc_conn_app_id(conn));
  snprintf(c->group, sizeof(c->group), "%s", tc_conn_group(conn));
  c->op.client_id = c->client_id;
  c->op.app_id = c->app_id;
  c->op.group = c->group;
}


/* The call of 'req', its op about the request's xid (kept in c->xid, ""
 * without one: a begin makes it); NULL, with the request answered, when
 * out of memory. */
static call_t *call_new_or_reply(tc_ctx_t *ctx, tc_req_t *req, tc_op_kind_t kind, void (*cb)(tc_op_t *, void *)) {
  call_t *c = calloc(1, sizeof(*c));
  if (!c) {
    tc_req_reply_code(req, TXP_ENOMEM, "out of memory");
    return NULL;
  }
  if (req->msg.xid) snprintf(c->xid, sizeof(c->xid), "%s", req->msg.xid);
  c->op.xid = c->xid;
  c->ctx = ctx;
  c->req = req;
  c->started_ns = uv_hrtime();
  c->op.kind = kind;
  c->op.cb = cb;
  c->op.arg = c;
  return c;
}

static void call_free(call_t *c) {
  tc_op_clear(&c->op);
  free(c);
}

/* Answer a refusal of the ownership rule: counted, nothing changed. */
static void reply_not_owner(call_t *c, const char *what) {
  char msg[256];
  c->ctx->stats.not_owner++;
  snprintf(msg, sizeof(msg), "could not %s: the global transaction or branch belongs to another application",
           what);
  tc_log_warn("refused to %s global transaction \"%s\" for application \"%s\" (group \"%s\") from %s: "
              "not the owner", what, c->xid, c->app_id, c->group, tc_conn_peer(c->req->conn));
  tc_req_reply_code(c->req, TXP_ENOT_OWNER, msg);
  call_free(c);
}

static void reply_code(call_t *c, int code, const char *msg) {
  tc_req_reply_code(c->req, code, msg);
  call_free(c);
}

/* Submit the call's op or answer BUSY/SHUTDOWN right away (a begin the op
 * was to carry is held again: tc_hold.h). */
static void submit_or_reply(call_t *c) {
  c->submitted_ns = uv_hrtime();
  int rc = tc_store_submit(c->ctx->store, &c->op);
  if (rc != 0) {
    tc_hold_unfold(c->ctx->hold, &c->op, false);
    reply_code(c, rc, rc == TXP_EBUSY ? "coordinator store queue full: retry later"
                                      : "coordinator shutting down");
  }
}

static int store_error_code(const tc_op_t *op) { return op->status ? op->status : TXP_ESTORE; }

/* "Not found" for an xid that another node made may be a begin that node
 * answered and still holds (tc_hold.h): the request runs once more after
 * the hold (true: taken; the caller frees its call, not the request). */
static bool retry_if_held_elsewhere(tc_ctx_t *ctx, tc_req_t *req) {
  char node[TXP_XID_NODE_MAX + 1];
  if (req->retried || txp_xid_parse(req->msg.xid, node, sizeof(node), NULL, NULL) != 0 ||
      strcmp(node, ctx->advertise) == 0)
    return false;
  return tc_hold_retry_later(ctx->hold, req);
}

/* ------------------------------------------------------------ validation */

static bool xid_ok(const char *xid) { return xid && xid[0] && strlen(xid) <= TXP_MAX_XID_LEN; }

static bool require_xid_or_reply(tc_ctx_t *ctx, tc_req_t *req) {
  if (xid_ok(req->msg.xid)) return true;
  ctx->stats.bad_requests++;
  tc_req_reply_code(req, TXP_EBAD_REQUEST, "missing or empty xid");
  return false;
}

/* ----------------------------------------------------------------- begin */

/*
 * The random part of a new xid (txp_xid.h), from the kernel's CSPRNG.
 * Drawn 64 at a time so that a begin costs no system call; per thread,
 * since tests run several nodes in one process.  Returns 0, or -1 when the
 * kernel gave no randomness (then no xid is made).
 */
static int xid_nonce(uint64_t *out) {
  static __thread uint64_t pool[64];
  static __thread size_t left;
  if (left == 0) {
    size_t got = 0;
    while (got < sizeof(pool)) {
      ssize_t n = getrandom((char *)pool + got, sizeof(pool) - got, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return -1;
      got += (size_t)n;
    }
    left = sizeof(pool) / sizeof(pool[0]);
  }
  *out = pool[--left];
  pool[left] = 0; /* a used nonce does not linger */
  return 0;
}

/* Answer a begin with its xid. */
static void reply_begun(call_t *c, const char *xid, uint32_t timeout_ms) {
  c->ctx->stats.begun++;
  txp_msg_t res;
  txp_msg_init_result(&res, &c->req->msg, 0, NULL);
  txp_msg_set_str(&res, TXP_F_XID, xid);
  txp_msg_set_int(&res, TXP_F_TIMEOUT_MS, timeout_ms);
  txp_msg_set_int(&res, TXP_F_NODE_ID, c->ctx->cfg->node_id);
  tc_req_reply(c->req, &res);
  call_free(c);
}

static void on_begin_done(tc_op_t *op, void *arg) {
  call_t *c = arg;
  if (op->status != 0) {
    reply_code(c, store_error_code(op), op->errmsg);
    return;
  }
  if (op->res == TC_RES_FINISHED) {
    reply_code(c, TXP_EGLOBAL_NOT_ACTIVE,
               "idempotency key already used by a global transaction that has finished");
    return;
  }
  TXC_FAILPOINT("tc.begin.after_store");
  reply_begun(c, op->out_xid, op->timeout_ms);
}

/* The timeout of a begin (the node's default when 0 or absent): false,
 * with the request answered, when it is above the limit. */
static bool begin_timeout_or_reply(tc_ctx_t *ctx, tc_req_t *req, uint32_t *timeout) {
  const txp_msg_t *m = &req->msg;
  *timeout = txp_msg_has(m, TXP_F_TIMEOUT_MS) && m->timeout_ms ? m->timeout_ms
                                                               : (uint32_t)ctx->cfg->default_timeout_ms;
  if (*timeout <= (uint32_t)ctx->cfg->max_timeout_ms) return true;
  char msg[128];
  snprintf(msg, sizeof(msg), "timeout_ms %u is above the limit of %d", *timeout, ctx->cfg->max_timeout_ms);
  ctx->stats.bad_requests++;
  tc_req_reply_code(req, TXP_EBAD_REQUEST, msg);
  return false;
}

/* A new global's transaction id and xid (in c->xid): 0, or -1 with the
 * call answered and freed. */
static int new_global_or_reply(call_t *c, int64_t *txid) {
  tc_ctx_t *ctx = c->ctx;
  if (tc_store_next_id(ctx->store, txid) != 0) {
    reply_code(c, TXP_ESTORE, "no transaction id available: coordinator store unreachable, retry");
    return -1;
  }
  uint64_t nonce;
  if (xid_nonce(&nonce) != 0) {
    reply_code(c, TXP_EINTERNAL, "could not make an xid: no randomness from the kernel");
    return -1;
  }
  if (txp_xid_make(c->xid, sizeof(c->xid), ctx->advertise, *txid, nonce) < 0) {
    /* node.advertise is checked at start-up (tc_config.c): not reached. */
    reply_code(c, TXP_EINTERNAL, "could not make an xid from node.advertise");
    return -1;
  }
  return 0;
}

/* The call of a request that begins a global (a Begin, or a
 * BranchRegister that begins one): its timeout and the new global's
 * transaction id and xid (in c->xid).  NULL, with the request answered,
 * when the timeout is above the limit or there is no memory, id or xid. */
static call_t *begin_call_or_reply(tc_ctx_t *ctx, tc_req_t *req, tc_op_kind_t kind, void (*cb)(tc_op_t *, void *),
                                   uint32_t *timeout, int64_t *txid) {
  if (!begin_timeout_or_reply(ctx, req, timeout)) return NULL;
  call_t *c = call_new_or_reply(ctx, req, kind, cb);
  return c && new_global_or_reply(c, txid) == 0 ? c : NULL;
}

static void handle_begin(tc_ctx_t *ctx, tc_req_t *req) {
  const txp_msg_t *m = &req->msg;
  uint32_t timeout;
  int64_t txid;
  call_t *c = begin_call_or_reply(ctx, req, TC_OP_BEGIN, on_begin_done, &timeout, &txid);
  if (!c) return;
  c->op.id = txid;
  c->op.timeout_ms = timeout;
  c->op.name = m->name;
  call_identify(c, req->conn);
  c->op.idem_key = m->idem_key && m->idem_key[0] ? m->idem_key : NULL;
  /* A new begin is answered at once and waits for its global's first
   * registration (tc_hold.h).  A keyed one that may be a resend must get
   * the first send's xid: held here, or else in the store. */
  uint32_t held_timeout;
  const char *held_xid = tc_hold_keyed(ctx->hold, c->app_id, c->op.idem_key, &held_timeout);
  if (held_xid) {
    reply_begun(c, held_xid, held_timeout);
    return;
  }
  bool is_new = !c->op.idem_key || (txp_msg_has(m, TXP_F_FIRST_SEND) && m->first_send);
  tc_held_begin_t held = {.xid = c->xid, .txid = txid, .timeout_ms = timeout, .name = m->name,
                          .app_id = c->app_id, .group = c->group, .idem_key = c->op.idem_key};
  if (is_new && tc_hold_begin(ctx->hold, &held) == 0) {
    reply_begun(c, c->xid, timeout);
    return;
  }
  submit_or_reply(c);
}

/* -------------------------------------------------------------- decision */

/* The status a TM sees: AT phase two is clean-up only, so an
 * AsyncCommitting transaction is committed as far as the TM is concerned. */
static int tm_visible_status(int s) { return s == TXP_GS_ASYNC_COMMITTING ? TXP_GS_COMMITTED : s; }

static bool has_saga_step(const tc_op_t *op) {
  for (int i = 0; i < op->nbranches; i++)
    if (op->branches[i].branch_type == TXP_BT_SAGA) return true;
  return false;
}

/* A saga's commit is its steps' actions, not a decision that stands
 * whatever they do: the TM hears where the saga is. */
static void saga_reply(call_t *c, int global_status) {
  int code = 0;
  const char *msg = NULL;
  switch (global_status) {
  case TXP_GS_COMMITTED:
  case TXP_GS_COMMIT_FAILED: break; /* a branch that is not a step failed: rm_tm_commit says so */
  case TXP_GS_ROLLBACKED:
  case TXP_GS_TIMEOUT_ROLLBACKED:
    code = TXP_EGLOBAL_NOT_ACTIVE;
    msg = "a saga step failed for good: the steps before it were compensated (tcctl show XID has its error)";
    break;
  case TXP_GS_ROLLBACK_FAILED:
  case TXP_GS_TIMEOUT_ROLLBACK_FAILED:
    code = TXP_EROLLBACK_FAILED;
    msg = "a saga step failed for good and a compensation failed for good too: an operator's (tcctl show XID)";
    break;
  default:
    if (txp_global_status_is_rollback(global_status)) {
      code = TXP_EROLLBACK_PENDING;
      msg = "a saga step failed for good: its compensations are not all done yet; the coordinator retries them";
    } else {
      code = TXP_ECOMMIT_PENDING;
      msg = "the saga goes on: a step is not done yet and the coordinator retries it (rm_tm_status tells when "
            "it ends)";
    }
  }
  txp_msg_t res;
  txp_msg_init_result(&res, &c->req->msg, code, msg);
  txp_msg_set_str(&res, TXP_F_XID, c->xid);
  txp_msg_set_int(&res, TXP_F_GLOBAL_STATUS, global_status);
  tc_req_reply(c->req, &res);
  call_free(c);
}

static void after_phase2_reply(int global_status, void *arg) {
  call_t *c = arg;
  if (c->op.kind == TC_OP_DECIDE && c->op.action == TC_DECIDE_COMMIT && has_saga_step(&c->op)) {
    saga_reply(c, global_status);
    return;
  }
  /* A commit whose phase two is still retried is committed for the TM (the
   * decision stands); CommitFailed is passed on (an operator's). */
  if (global_status == TXP_GS_COMMITTING || global_status == TXP_GS_COMMIT_RETRYING)
    global_status = TXP_GS_COMMITTED;
  txp_msg_t res;
  txp_msg_init_result(&res, &c->req->msg, 0, NULL);
  txp_msg_set_str(&res, TXP_F_XID, c->xid);
  txp_msg_set_int(&res, TXP_F_GLOBAL_STATUS, tm_visible_status(global_status));
  tc_req_reply(c->req, &res);
  call_free(c);
}

/* Whether a branch does real work in its phase-two commit
 * (TXP_APP_DATA_PHASE2_SYNC, or any branch not AT: a TCC confirm is the
 * business change itself, as Seata commits all but AT-only globals
 * synchronously): then the TM is answered after it. */
static bool commit_waits(const tc_op_t *op) {
  for (int i = 0; i < op->nbranches; i++)
    if (op->branches[i].phase2_sync || op->branches[i].branch_type != TXP_BT_AT) return true;
  return false;
}

static void on_decide_done(tc_op_t *op, void *arg) {
  call_t *c = arg;
  tc_ctx_t *ctx = c->ctx;
  bool want_commit = op->action == TC_DECIDE_COMMIT;
  if (op->status != 0) {
    reply_code(c, store_error_code(op), op->errmsg);
    return;
  }
  int code = 0;
  const char *msg = NULL;
  switch (op->res) {
  case TC_RES_NOT_FOUND:
    if (retry_if_held_elsewhere(c->ctx, c->req)) {
      call_free(c);
      return;
    }
    reply_code(c, TXP_EGLOBAL_NOT_FOUND, "global transaction not found");
    return;
  case TC_RES_NOT_OWNER:
    reply_not_owner(c, want_commit ? "commit" : "roll back");
    return;
  case TC_RES_OK:
  case TC_RES_TIMED_OUT:
    if (op->res == TC_RES_TIMED_OUT) {
      ctx->stats.timed_out++;
      code = TXP_ETIMED_OUT;
      msg = "global transaction timed out: rolled back";
    }
    tc_ctx_release_locks(ctx, c->xid);
    if (txp_global_status_final(op->global_status)) {
      if (txp_global_status_is_commit(op->global_status)) ctx->stats.committed++;
      else ctx->stats.rolled_back++;
      /* Finished already: no branches, or AT branches whose commit is only
       * their undo rows' deletion (sql/tc/010): those are told, not driven. */
      if (op->nbranches > 0 && txp_global_status_is_commit(op->global_status)) {
        TXC_FAILPOINT("tc.commit.after_decision");
        tc__phase2_notify(ctx, c->xid, op->branches, op->nbranches);
      }
      break;
    }
    if (txp_global_status_is_commit(op->global_status)) TXC_FAILPOINT("tc.commit.after_decision");
    else TXC_FAILPOINT("tc.rollback.after_decision");
    if (txp_global_status_is_commit(op->global_status)) {
      ctx->stats.committed++;
      if (commit_waits(op)) {
        /* A give-back is applied by its commit: answer when it was. */
        tc__phase2_drive(ctx, c->xid, op->global_status, op->branches, op->nbranches, after_phase2_reply, c);
        return;
      }
      /* AT commit is asynchronous: answer now, drive the branches after. */
      tc__phase2_drive(ctx, c->xid, op->global_status, op->branches, op->nbranches, NULL, NULL);
      break;
    }
    if (code == 0) {
      ctx->stats.rolled_back++;
      /* Rollback: answer when the branches are undone (or failed). */
      tc__phase2_drive(ctx, c->xid, op->global_status, op->branches, op->nbranches,
                       after_phase2_reply, c);
      return;
    }
    tc__phase2_drive(ctx, c->xid, op->global_status, op->branches, op->nbranches, NULL, NULL);
    break;
  case TC_RES_DECIDED:
  case TC_RES_FINISHED: {
    /* Repeated or crossing decision: answer the status, idempotently. */
    bool is_commit = txp_global_status_is_commit(op->global_status);
    if (is_commit != want_commit) {
      code = TXP_EGLOBAL_NOT_ACTIVE;
      msg = is_commit ? "global transaction already committed" : "global transaction already rolled back";
    }
    break;
  }
  default:
    reply_code(c, TXP_EINTERNAL, "unexpected store result");
    return;
  }
  txp_msg_t res;
  txp_msg_init_result(&res, &c->req->msg, code, msg);
  txp_msg_set_str(&res, TXP_F_XID, c->xid);
  txp_msg_set_int(&res, TXP_F_GLOBAL_STATUS, tm_visible_status(op->global_status));
  tc_req_reply(c->req, &res);
  call_free(c);
}

static void handle_decide(tc_ctx_t *ctx, tc_req_t *req, tc_decide_action_t action) {
  if (!require_xid_or_reply(ctx, req)) return;
  call_t *c = call_new_or_reply(ctx, req, TC_OP_DECIDE, on_decide_done);
  if (!c) return;
  c->op.action = action;
  call_identify(c, req->conn);
  if (action == TC_DECIDE_COMMIT) TXC_FAILPOINT("tc.commit.before_decision");
  submit_or_reply(c);
}

static void handle_global_report(tc_ctx_t *ctx, tc_req_t *req) {
  int s = (int)req->msg.global_status;
  if (txp_global_status_is_commit(s)) handle_decide(ctx, req, TC_DECIDE_COMMIT);
  else if (txp_global_status_is_rollback(s)) handle_decide(ctx, req, TC_DECIDE_ROLLBACK);
  else {
    ctx->stats.bad_requests++;
    tc_req_reply_code(req, TXP_EBAD_REQUEST, "global report must carry a commit or rollback status");
  }
}

/* ------------------------------------------------------------------ reads */

/* A read for a request: the reply is sent from its callback. */
typedef struct read_call {
  tc_ctx_t *ctx;
  tc_req_t *req;
} read_call_t;

static read_call_t *read_call_new(tc_ctx_t *ctx, tc_req_t *req) {
  read_call_t *rc = calloc(1, sizeof(*rc));
  if (!rc) {
    tc_req_reply_code(req, TXP_ENOMEM, "out of memory");
    return NULL;
  }
  rc->ctx = ctx;
  rc->req = req;
  return rc;
}

/* The read could not be sent ('code' of a tc_read_*): answer, free. */
static void read_call_unsent(read_call_t *rc, int code) {
  if (code == TC_READ_ENOMEM) tc_req_reply_code(rc->req, TXP_ENOMEM, "out of memory");
  else tc_req_reply_code(rc->req, TXP_EBUSY, "coordinator store queue full: retry later");
  free(rc);
}

static void on_status_read(int status, const char *err, const tc_read_status_t *r, void *arg) {
  read_call_t *rc = arg;
  if (status != TC_READ_OK) {
    tc_req_reply_code(rc->req, TXP_ESTORE, "could not read the global status: store unavailable");
  } else if (!r->found) {
    if (!retry_if_held_elsewhere(rc->ctx, rc->req))
      tc_req_reply_code(rc->req, TXP_EGLOBAL_NOT_FOUND, "global transaction not found");
  } else if (!r->allowed) {
    rc->ctx->stats.not_owner++;
    tc_req_reply_code(rc->req, TXP_ENOT_OWNER,
                      "could not read the global status: the global transaction belongs to another application");
  } else {
    txp_msg_t res;
    txp_msg_init_result(&res, &rc->req->msg, 0, NULL);
    txp_msg_set_str(&res, TXP_F_XID, rc->req->msg.xid);
    txp_msg_set_int(&res, TXP_F_GLOBAL_STATUS, r->global_status);
    tc_req_reply(rc->req, &res);
  }
  free(rc);
}

/* The status, to whoever may decide the transaction (tc__may_decide), or
 * once it finished, to its group. */
static void handle_status(tc_ctx_t *ctx, tc_req_t *req) {
  if (!require_xid_or_reply(ctx, req)) return;
  read_call_t *rc = read_call_new(ctx, req);
  if (!rc) return;
  int code = tc_read_status(ctx->store, req->msg.xid, tc_conn_app_id(req->conn), tc_conn_group(req->conn),
                            READ_DEADLINE_MS, on_status_read, rc);
  if (code != 0) read_call_unsent(rc, code);
}

/* Each row key must fit the store's limit. */
static int check_rowkey(const txp_lockkey_t *k, void *arg) {
  char row[TXP_MAX_ROW_KEY_LEN + 1];
  return txp_row_key((const char *)arg, k, row, sizeof(row)) < 0 ? TXP_EFIELD_TOO_LONG : 0;
}

/*
 * A GlobalLockQuery: whether the rows are free of other transactions'
 * global locks (a SELECT ... FOR UPDATE in a branch asks it).  With
 * lock_wait_ms it waits, in the same pushed queue as a registration
 * (tc_lockwait.h), until the holder releases them, then reads again.
 */
typedef struct lock_query {
  tc_ctx_t *ctx;
  tc_req_t *req;
  tc_waiter_t waiter;
  uint64_t started_ns, read_ns, deadline_ns;
  char xid[TXP_MAX_XID_LEN + 1];
} lock_query_t;

static void lock_query_read(lock_query_t *q);

static void lock_query_reply(lock_query_t *q, const char *holder) {
  txp_msg_t res;
  char msg[TXP_MAX_XID_LEN + 96]; /* the answer points at it until sent */
  if (q->waiter.first_queued_ns) {
    tc_node_stats_t *st = &q->ctx->stats;
    int k = holder ? 1 : 0; /* refused (timed out) or granted */
    tc_hist_observe(st->lock_wait_bucket[k], &st->lock_wait_count[k], &st->lock_wait_seconds[k],
                    (double)(uv_hrtime() - q->waiter.first_queued_ns) / 1e9);
  }
  if (holder && q->waiter.first_queued_ns) {
    snprintf(msg, sizeof(msg), "lock wait timed out: held by global transaction \"%s\"", holder);
    q->ctx->stats.lock_wait_timeouts++;
    txp_msg_init_result(&res, &q->req->msg, TXP_ELOCK_WAIT_TIMEOUT, msg);
  } else {
    txp_msg_init_result(&res, &q->req->msg, 0, NULL);
  }
  txp_msg_set_int(&res, TXP_F_LOCKABLE, holder == NULL);
  if (holder) txp_msg_set_str(&res, TXP_F_LOCK_HOLDER, holder);
  if (q->waiter.first_queued_ns)
    txp_msg_set_int(&res, TXP_F_WAITED_MS, (int64_t)((uv_hrtime() - q->waiter.first_queued_ns) / 1000000u));
  tc_req_reply(q->req, &res);
  free(q);
}

static void on_lock_query_wake(tc_waiter_t *w, int reason) {
  lock_query_t *q = w->data;
  if (reason == 0 || (reason == TXP_ELOCK_WAIT_TIMEOUT && q->deadline_ns > uv_hrtime())) {
    lock_query_read(q); /* released, or a cluster re-check: read again */
    return;
  }
  if (reason == TXP_ELOCK_WAIT_TIMEOUT) {
    lock_query_reply(q, w->holder);
    return;
  }
  tc_req_reply_code(q->req, reason, "lock query ended: coordinator shutting down");
  free(q);
}

static void on_lock_query_read(int status, const char *err, const char *holder, void *arg) {
  (void)err;
  lock_query_t *q = arg;
  if (status != TC_READ_OK) {
    tc_req_reply_code(q->req, TXP_ESTORE, "could not query locks: store unavailable");
    free(q);
    return;
  }
  uint64_t now = uv_hrtime();
  if (!holder || q->deadline_ns <= now) {
    lock_query_reply(q, holder);
    return;
  }
  tc_ctx_t *ctx = q->ctx;
  q->waiter.cb = on_lock_query_wake;
  q->waiter.data = q;
  q->waiter.xid = q->xid[0] ? q->xid : NULL;
  snprintf(q->waiter.holder, sizeof(q->waiter.holder), "%s", holder);
  q->waiter.deadline_ns = q->deadline_ns;
  /* As a registration's wait: with peers, re-read at least this often. */
  uint64_t recheck_ns = (uint64_t)ctx->cfg->cluster_lock_recheck_ms * 1000000u;
  if (ctx->peers && recheck_ns && now + recheck_ns < q->waiter.deadline_ns) q->waiter.deadline_ns = now + recheck_ns;
  if (!q->waiter.first_queued_ns) {
    q->waiter.first_queued_ns = now;
    ctx->stats.lock_waits++;
  }
  q->waiter.met_ns = q->read_ns;
  int rc = tc_lockwait_add(ctx->lockwait, &q->waiter);
  if (rc == TXP_EAGAIN) {
    lock_query_read(q); /* released meanwhile */
  } else if (rc != 0) {
    lock_query_reply(q, holder); /* no room to wait: the answer as it is */
  }
}

static void lock_query_read(lock_query_t *q) {
  q->read_ns = uv_hrtime();
  const txp_msg_t *m = &q->req->msg;
  int code = tc_read_lock_holder(q->ctx->store, m->resource_id, m->lock_keys, (size_t)q->ctx->cfg->max_lock_keys,
                                 q->xid[0] ? q->xid : NULL, READ_DEADLINE_MS, on_lock_query_read, q);
  if (code != 0) {
    if (code == TC_READ_ENOMEM) tc_req_reply_code(q->req, TXP_ENOMEM, "out of memory");
    else tc_req_reply_code(q->req, TXP_EBUSY, "coordinator store queue full: retry later");
    free(q);
  }
}

/* Validate lock keys: their number and each row key's length. */
static int check_lock_keys_or_reply(tc_ctx_t *ctx, tc_req_t *req) {
  const txp_msg_t *m = &req->msg;
  int n = txp_lockkeys_each(m->lock_keys, (size_t)ctx->cfg->max_lock_keys, check_rowkey,
                            (void *)(uintptr_t)m->resource_id);
  if (n >= 0) return n;
  char msg[256];
  if (n == TXP_ELIMIT)
    snprintf(msg, sizeof(msg), "too many lock keys: at most %d per branch", ctx->cfg->max_lock_keys);
  else if (n == TXP_EFIELD_TOO_LONG)
    snprintf(msg, sizeof(msg), "lock key longer than %d bytes with its resource id", TXP_MAX_ROW_KEY_LEN);
  else
    snprintf(msg, sizeof(msg), "malformed lock keys: expected \"table:pk1,pk2;table2:pk\"");
  ctx->stats.bad_requests++;
  tc_req_reply_code(req, TXP_EBAD_REQUEST, msg);
  return -1;
}

static void handle_lock_query(tc_ctx_t *ctx, tc_req_t *req) {
  if (check_lock_keys_or_reply(ctx, req) < 0) return;
  const txp_msg_t *m = &req->msg;
  if (m->lock_wait_ms > (uint32_t)ctx->cfg->lock_wait_max_ms) {
    char msg[96];
    snprintf(msg, sizeof(msg), "lock_wait_ms %u is above the limit of %d", m->lock_wait_ms, ctx->cfg->lock_wait_max_ms);
    ctx->stats.bad_requests++;
    tc_req_reply_code(req, TXP_EBAD_REQUEST, msg);
    return;
  }
  lock_query_t *q = calloc(1, sizeof(*q));
  if (!q) {
    tc_req_reply_code(req, TXP_ENOMEM, "out of memory");
    return;
  }
  q->ctx = ctx;
  q->req = req;
  q->started_ns = uv_hrtime();
  q->deadline_ns = m->lock_wait_ms ? q->started_ns + (uint64_t)m->lock_wait_ms * 1000000u : 0;
  if (m->xid) snprintf(q->xid, sizeof(q->xid), "%s", m->xid);
  lock_query_read(q);
}

/* --------------------------------------------------------- registration */

static void on_register_done(tc_op_t *op, void *arg);

static void on_lock_wake(tc_waiter_t *w, int reason) {
  call_t *c = w->data;
  c->waiting = false;
  if (reason == TXP_ELOCK_WAIT_TIMEOUT && c->lock_deadline_ns > uv_hrtime()) {
    /* Cluster re-check (see below), not the caller's deadline: the holder
     * may have been released on a node whose wake-up never arrived. */
    submit_or_reply(c);
    return;
  }
  if (reason != 0) {
    if (reason == TXP_ELOCK_WAIT_TIMEOUT) c->ctx->stats.lock_wait_timeouts++;
    char msg[TXP_MAX_XID_LEN + 96];
    snprintf(msg, sizeof(msg), "lock wait timed out: held by global transaction \"%s\"", w->holder);
    reply_code(c, reason, msg);
    return;
  }
  submit_or_reply(c); /* same op, same branch id: try again */
}

static void reply_register(call_t *c, int code, const char *msg) {
  txp_msg_t res;
  txp_msg_init_result(&res, &c->req->msg, code, msg);
  if (code == 0) txp_msg_set_int(&res, TXP_F_BRANCH_ID, c->op.out_id);
  if (code == 0 && c->op.begin_txid) { /* it began its global too */
    txp_msg_set_str(&res, TXP_F_XID, c->xid);
    txp_msg_set_int(&res, TXP_F_TIMEOUT_MS, c->op.begin_timeout_ms);
    txp_msg_set_int(&res, TXP_F_NODE_ID, c->ctx->cfg->node_id);
  }
  if (c->waiter.first_queued_ns) {
    uint64_t waited_ns = uv_hrtime() - c->waiter.first_queued_ns;
    uint64_t waited = waited_ns / 1000000u;
    txp_msg_set_int(&res, TXP_F_WAITED_MS, (int64_t)waited);
    if (code == 0) c->ctx->stats.lock_wait_ms_total += waited;
    tc_node_stats_t *st = &c->ctx->stats;
    int k = code == 0 ? 0 : 1;
    tc_hist_observe(st->lock_wait_bucket[k], &st->lock_wait_count[k], &st->lock_wait_seconds[k],
                    (double)waited_ns / 1e9);
  }
  if (c->op.holder[0] && code != 0) txp_msg_set_str(&res, TXP_F_LOCK_HOLDER, c->op.holder);
  tc_req_reply(c->req, &res);
  call_free(c);
}

static void on_register_done(tc_op_t *op, void *arg) {
  call_t *c = arg;
  tc_ctx_t *ctx = c->ctx;
  /* A begin that rode this batch is in the store now, or lost with it:
   * the requests that waited for it go on, and a retry (lock wait) does
   * not carry it again. */
  tc_hold_unfold(ctx->hold, op, true);
  if (op->status != 0) {
    reply_register(c, store_error_code(op), op->errmsg);
    return;
  }
  char msg[TXP_MAX_XID_LEN + 128];
  switch (op->res) {
  case TC_RES_OK:
    TXC_FAILPOINT("tc.register.after_store");
    ctx->stats.registered++;
    if (op->begin_txid) ctx->stats.begun++;
    reply_register(c, 0, NULL);
    return;
  case TC_RES_NOT_FOUND:
    if (retry_if_held_elsewhere(ctx, c->req)) {
      call_free(c);
      return;
    }
    reply_register(c, TXP_EGLOBAL_NOT_FOUND, "global transaction not found");
    return;
  case TC_RES_NOT_OWNER:
    reply_not_owner(c, "register a branch in");
    return;
  case TC_RES_NOT_ACTIVE:
    snprintf(msg, sizeof(msg), "could not register branch: global transaction is %s, expected Begin",
             txp_global_status_name(op->global_status));
    reply_register(c, TXP_EGLOBAL_NOT_ACTIVE, msg);
    return;
  case TC_RES_TIMED_OUT:
    reply_register(c, TXP_ETIMED_OUT, "could not register branch: global transaction timed out");
    return;
  case TC_RES_HOLDER_ROLLBACKING:
    tc_ctx_release_locks(ctx, c->xid); /* see TC_RES_CONFLICT */
    ctx->stats.register_conflicts++;
    snprintf(msg, sizeof(msg), "lock held by global transaction \"%s\", which is rolling back", op->holder);
    reply_register(c, TXP_ELOCK_HOLDER_ROLLBACKING, msg);
    return;
  case TC_RES_CONFLICT: {
    /* The keys this registration took in its batch were given back: an
     * item of the same batch that met one of them was told to wait for
     * this xid, which may never release anything.  Wake it (a waiter this
     * xid really blocks meets it again and re-queues in its place).  Only
     * after this registration has queued itself: tc_lockwait_add tells a
     * release by a hash of the holder's xid, and this xid's own release
     * would look like its holder's when the two share one; it would then
     * retry at once, meet the holder again and never wait (it spun until
     * its deadline, one store batch after another). */
    if (!op->holder[0] && ++c->races <= 5) {
      /* The key was released between the store's insert and its check:
       * there is no holder to wait for, so try again now. */
      tc_ctx_release_locks(ctx, c->xid);
      submit_or_reply(c);
      return;
    }
    ctx->stats.register_conflicts++;
    uint64_t now = uv_hrtime();
    int queued = -1;
    if (c->lock_deadline_ns > now) {
      c->waiter.cb = on_lock_wake;
      c->waiter.data = c;
      c->waiter.xid = c->xid;
      snprintf(c->waiter.holder, sizeof(c->waiter.holder), "%s", op->holder);
      c->waiter.deadline_ns = c->lock_deadline_ns;
      /* With peers, the holder may be released on another node and the
       * bus wake-up lost: re-check the store at least this often. */
      uint64_t recheck_ns = (uint64_t)ctx->cfg->cluster_lock_recheck_ms * 1000000u;
      if (ctx->peers && recheck_ns && now + recheck_ns < c->waiter.deadline_ns)
        c->waiter.deadline_ns = now + recheck_ns;
      if (!c->waiter.first_queued_ns) {
        c->waiter.first_queued_ns = now;
        ctx->stats.lock_waits++;
      }
      c->waiter.met_ns = c->submitted_ns;
      queued = tc_lockwait_add(ctx->lockwait, &c->waiter);
      if (queued == 0) c->waiting = true;
    }
    tc_ctx_release_locks(ctx, c->xid); /* see above: after the queueing */
    if (queued == 0) return;
    if (queued == TXP_EAGAIN) {
      submit_or_reply(c); /* released meanwhile: try again now */
      return;
    }
    snprintf(msg, sizeof(msg), "lock conflict: held by global transaction \"%s\"", op->holder);
    reply_register(c, c->waiter.first_queued_ns ? TXP_ELOCK_WAIT_TIMEOUT : TXP_ELOCK_CONFLICT, msg);
    return;
  }
  default:
    reply_register(c, TXP_EINTERNAL, "unexpected store result");
    return;
  }
}

static void handle_begin_register(tc_ctx_t *ctx, tc_req_t *req);

static void handle_register(tc_ctx_t *ctx, tc_req_t *req) {
  const txp_msg_t *m = &req->msg;
  if (!xid_ok(m->xid) && txp_msg_has(m, TXP_F_TIMEOUT_MS)) {
    handle_begin_register(ctx, req);
    return;
  }
  if (!require_xid_or_reply(ctx, req)) return;
  char msg[160];
  if (m->branch_type >= TXP_BT__MAX) {
    snprintf(msg, sizeof(msg), "branch type %u is not supported: use AT, TCC, SAGA or XA", m->branch_type);
    ctx->stats.bad_requests++;
    tc_req_reply_code(req, TXP_EBAD_REQUEST, msg);
    return;
  }
  if (m->branch_type == TXP_BT_SAGA && m->lock_keys && m->lock_keys[0]) {
    /* A step runs after the decision, in its own local transaction: there
     * is nothing for a global lock to protect. */
    ctx->stats.bad_requests++;
    tc_req_reply_code(req, TXP_EBAD_REQUEST, "a saga step takes no lock keys");
    return;
  }
  if (!m->resource_id || !m->resource_id[0]) {
    ctx->stats.bad_requests++;
    tc_req_reply_code(req, TXP_EBAD_REQUEST, "missing or empty resource_id");
    return;
  }
  if (m->lock_keys && m->lock_keys[0] && check_lock_keys_or_reply(ctx, req) < 0) return;
  if (m->lock_wait_ms > (uint32_t)ctx->cfg->lock_wait_max_ms) {
    snprintf(msg, sizeof(msg), "lock_wait_ms %u is above the limit of %d", m->lock_wait_ms,
             ctx->cfg->lock_wait_max_ms);
    ctx->stats.bad_requests++;
    tc_req_reply_code(req, TXP_EBAD_REQUEST, msg);
    return;
  }
  call_t *c = call_new_or_reply(ctx, req, TC_OP_REGISTER, on_register_done);
  if (!c) return;
  if (tc_store_next_id(ctx->store, &c->op.id) != 0) {
    reply_code(c, TXP_ESTORE, "no branch id available: coordinator store unreachable, retry");
    return;
  }
  c->op.resource_id = m->resource_id;
  c->op.branch_type = (int)m->branch_type;
  c->op.lock_keys = m->lock_keys && m->lock_keys[0] ? m->lock_keys : NULL;
  c->op.app_data = m->application_data;
  call_identify(c, req->conn);
  c->op.idem_key = m->idem_key && m->idem_key[0] ? m->idem_key : NULL;
  if (m->lock_wait_ms) c->lock_deadline_ns = c->started_ns + (uint64_t)m->lock_wait_ms * 1000000u;
  tc_hold_fold(ctx->hold, &c->op); /* the global's begin may ride along */
  submit_or_reply(c);
}

/*
 * A BranchRegister without an xid, with a timeout: begin a global
 * transaction and register its first branch in one round trip and one
 * store transaction (the TM's own branch: rm_at_begin_open).  The answer
 * carries the xid and the branch id.  An AT branch without lock keys
 * only: its op must never wait for a lock and run again (its begin would
 * run twice).  No idempotency key for the begin: a client that resends it
 * after a lost connection gets a new global, and the one it may have
 * begun has a branch with no undo row, rolled back at its timeout.
 */
static void handle_begin_register(tc_ctx_t *ctx, tc_req_t *req) {
  const txp_msg_t *m = &req->msg;
  const char *bad = NULL;
  if (m->branch_type != TXP_BT_AT) bad = "a branch registered with its global's begin must be an AT branch";
  else if (m->lock_keys && m->lock_keys[0]) bad = "a branch registered with its global's begin takes no lock keys";
  else if (!m->resource_id || !m->resource_id[0]) bad = "missing or empty resource_id";
  if (bad) {
    ctx->stats.bad_requests++;
    tc_req_reply_code(req, TXP_EBAD_REQUEST, bad);
    return;
  }
  uint32_t timeout;
  int64_t txid;
  call_t *c = begin_call_or_reply(ctx, req, TC_OP_REGISTER, on_register_done, &timeout, &txid);
  if (!c) return;
  if (tc_store_next_id(ctx->store, &c->op.id) != 0) {
    reply_code(c, TXP_ESTORE, "no branch id available: coordinator store unreachable, retry");
    return;
  }
  c->op.begin_txid = txid;
  c->op.begin_timeout_ms = timeout;
  c->op.begin_name = m->name;
  c->op.resource_id = m->resource_id;
  c->op.branch_type = TXP_BT_AT;
  c->op.app_data = m->application_data;
  call_identify(c, req->conn);
  c->op.idem_key = m->idem_key && m->idem_key[0] ? m->idem_key : NULL;
  submit_or_reply(c);
}

/* --------------------------------------------------------- branch report */

static void on_branch_report_done(tc_op_t *op, void *arg) {
  call_t *c = arg;
  if (op->status != 0) {
    reply_code(c, store_error_code(op), op->errmsg);
    return;
  }
  switch (op->res) {
  case TC_RES_NOT_FOUND: reply_code(c, TXP_EGLOBAL_NOT_FOUND, "global transaction not found"); return;
  case TC_RES_BRANCH_NOT_FOUND: reply_code(c, TXP_EBRANCH_NOT_FOUND, "branch not found"); return;
  case TC_RES_NOT_OWNER: reply_not_owner(c, "report a branch of"); return;
  default: reply_code(c, 0, NULL); return;
  }
}

static void handle_branch_report(tc_ctx_t *ctx, tc_req_t *req) {
  const txp_msg_t *m = &req->msg;
  if (!require_xid_or_reply(ctx, req)) return;
  if (m->branch_status != TXP_BS_PHASE1_DONE && m->branch_status != TXP_BS_PHASE1_FAILED) {
    ctx->stats.bad_requests++;
    tc_req_reply_code(req, TXP_EBAD_REQUEST, "branch report must be PhaseOneDone or PhaseOneFailed");
    return;
  }
  /* Branch id 0 means "every branch" to the store (phase two's all-committed
   * outcome): a report must name one branch. */
  if (m->branch_id <= 0) {
    ctx->stats.bad_requests++;
    tc_req_reply_code(req, TXP_EBAD_REQUEST, "branch report needs the id of one branch");
    return;
  }
  call_t *c = call_new_or_reply(ctx, req, TC_OP_PHASE2, on_branch_report_done);
  if (!c) return;
  c->op.id = m->branch_id;
  c->op.branch_status = (int)m->branch_status;
  c->op.error = m->message;
  call_identify(c, req->conn);
  submit_or_reply(c);
}

/* ------------------------------------------------------------- dispatch */

void tc__coord_on_request(tc_req_t *req, void *arg) {
  tc_ctx_t *ctx = arg;
  ctx->stats.requests++;
  tc__coord_resume(req, arg);
}

void tc__coord_resume(tc_req_t *req, void *arg) {
  tc_ctx_t *ctx = arg;
  if (ctx->stopping) {
    tc_req_reply_code(req, TXP_ESHUTDOWN, "coordinator shutting down");
    return;
  }
  /* A request about a global whose begin this node answered but has not
   * stored yet waits for it (tc_hold.h). */
  if (req->msg.type != TXP_MSG_GLOBAL_BEGIN && xid_ok(req->msg.xid) && tc_hold_park(ctx->hold, req)) return;
  switch (req->msg.type) {
  case TXP_MSG_GLOBAL_BEGIN: handle_begin(ctx, req); break;
  case TXP_MSG_GLOBAL_COMMIT: handle_decide(ctx, req, TC_DECIDE_COMMIT); break;
  case TXP_MSG_GLOBAL_ROLLBACK: handle_decide(ctx, req, TC_DECIDE_ROLLBACK); break;
  case TXP_MSG_GLOBAL_STATUS: handle_status(ctx, req); break;
  case TXP_MSG_GLOBAL_REPORT: handle_global_report(ctx, req); break;
  case TXP_MSG_BRANCH_REGISTER: handle_register(ctx, req); break;
  case TXP_MSG_BRANCH_REPORT: handle_branch_report(ctx, req); break;
  case TXP_MSG_GLOBAL_LOCK_QUERY: handle_lock_query(ctx, req); break;
  default:
    ctx->stats.bad_requests++;
    tc_req_reply_code(req, TXP_EBAD_REQUEST, "message type not served by the coordinator");
    break;
  }
}
