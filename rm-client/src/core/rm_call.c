/*
 * rm_call.c - librmclient's calls on the loop thread: the deadline heap,
 * the table of requests awaiting an answer, routing to a node, retries,
 * failover when a connection goes down, and completion.
 *
 * NOTES
 *   Life of a call (loop thread):
 *     1. NEW: taken off the submit queue, entered in the deadline heap.
 *     2. dispatch: pick a node: the one that created the xid (its address
 *        precedes the last ':' of the xid) when it is registered, else the
 *        client's home node or the next registered one after it (or the
 *        next round-robin: rm_config_t.node_choice).  None -> WAITING (in
 *        'waitq') until one registers, or for at most the connect timeout
 *        (then RM_E_NO_NODE; the deadline for a call that may have reached
 *        a node already), or until detection switches the client to
 *        local mode (rm__calls_fail_waiting).
 *     3. SENT: encoded on that node's connection, in the id table and on
 *        the node's 'sent' list.  The answer completes it, except:
 *          - TXP_ESTORE (idempotent calls only), TXP_EBUSY, TXP_ESHUTDOWN,
 *            TXP_ETOO_MANY_CONNS: BACKOFF (a short delay in the heap), then
 *            dispatch again (avoiding a node that is shutting down);
 *          - the connection dies first: a frame that never left our queue
 *            is dispatched again; one that was handed to the kernel is
 *            resent only if the call is idempotent (GlobalBegin and
 *            BranchRegister carry an idempotency key made once per logical
 *            call; GlobalCommit/Rollback/Status are idempotent at the TC),
 *            else it completes with RM_E_UNKNOWN_OUTCOME.
 *     4. DONE: completed exactly once, by an answer, by its deadline, or by
 *        rm_client_free().
 *   The deadline decides what a failure means: a call that may have reached
 *   a coordinator ('maybe_done', or SENT at expiry) gets
 *   RM_E_UNKNOWN_OUTCOME; one that certainly did not gets RM_E_NO_NODE when
 *   no node is registered (RM_E_AUTH when every node refused our token),
 *   else the last retryable refusal (RM_E_BUSY, ...) or RM_E_DEADLINE.
 *
 *   Time: deadlines are absolute uv_hrtime() milliseconds, computed on the
 *   caller's thread when the call is made.  One uv_timer, armed for the
 *   earliest entry of the heap, expires calls and ends backoffs.
 */
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rm_core.h"
#include "txc_heap.h"
#include "txc_idtable.h"

#define RM_RETRY_MIN_MS 20u  /* backoff after a retryable refusal */
#define RM_RETRY_MAX_MS 500u

static void dispatch(rm_client_t *c, rm_call_t *k);

static int code_of(int64_t code) {
  if (code == 0) return 0;
  return (code < 0 && code >= INT_MIN) ? (int)code : TXP_EINTERNAL;
}

/* -------------------------------------------------------------- lists */

void rm__call_list_push(rm_call_list_t *l, rm_call_t *k) {
  k->next = NULL;
  k->prev = l->tail;
  if (l->tail) l->tail->next = k;
  else l->head = k;
  l->tail = k;
}

static void list_remove(rm_call_list_t *l, rm_call_t *k) {
  if (k->prev) k->prev->next = k->next;
  else l->head = k->next;
  if (k->next) k->next->prev = k->prev;
  else l->tail = k->prev;
  k->prev = k->next = NULL;
}

rm_call_t *rm__call_list_pop(rm_call_list_t *l) {
  rm_call_t *k = l->head;
  if (k) list_remove(l, k);
  return k;
}

/* ------------------------------------- the deadline heap, the id table */

static rm_call_t *call_of_hnode(txc_heap_node_t *n) { return n ? TXC_HEAP_ELEM(n, rm_call_t, hnode) : NULL; }

static int heap_push(rm_client_t *c, rm_call_t *k, uint64_t due) {
  return txc_heap_push(&c->heap, &k->hnode, due) == 0 ? 0 : RM_E_NOMEM;
}

static void heap_remove(rm_client_t *c, rm_call_t *k) { txc_heap_remove(&c->heap, &k->hnode); }

static void heap_update(rm_client_t *c, rm_call_t *k, uint64_t due) { txc_heap_update(&c->heap, &k->hnode, due); }

/* The call with the earliest due time, or NULL. */
static rm_call_t *heap_first(const rm_client_t *c) { return call_of_hnode(txc_heap_min(&c->heap)); }

static void hash_insert(rm_client_t *c, rm_call_t *k) {
  k->idnode.id = k->request_id;
  txc_idtable_insert(&c->sent_ids, &k->idnode);
}

static rm_call_t *hash_find(const rm_client_t *c, uint64_t id) {
  txc_idnode_t *n = txc_idtable_find(&c->sent_ids, id);
  return n ? TXC_IDTABLE_ELEM(n, rm_call_t, idnode) : NULL;
}

static void hash_remove(rm_client_t *c, rm_call_t *k) { txc_idtable_remove(&c->sent_ids, &k->idnode); }

/* ------------------------------------------------------- call objects */

rm_call_t *rm__call_new(uint16_t type, bool idempotent, unsigned timeout_ms) {
  rm_call_t *k = calloc(1, sizeof(*k));
  if (!k) return NULL;
  k->type = type;
  k->idempotent = idempotent;
  k->deadline_ms = rm__mono_ms() + timeout_ms;
  txc_heap_node_init(&k->hnode);
  k->node = -1;
  k->avoid = -1;
  atomic_init(&k->refs, 1);
  return k;
}

void rm__call_destroy(rm_call_t *k) {
  free(k->name);
  free(k->resource_id);
  free(k->lock_keys);
  free(k->app_data);
  free(k->message);
  if (k->sync) {
    uv_cond_destroy(&k->cv);
    uv_mutex_destroy(&k->mu);
  }
  free(k);
}

void rm__call_unref(rm_call_t *k) {
  if (atomic_fetch_sub(&k->refs, 1) == 1) rm__call_destroy(k);
}

/* Take 'k' out of the id table and its node's list. */
static void unlink_sent(rm_client_t *c, rm_call_t *k) {
  hash_remove(c, k);
  list_remove(&c->nodes[k->node].sent, k);
  k->node = -1;
}

void rm__call_complete(rm_client_t *c, rm_call_t *k, int code) {
  heap_remove(c, k);
  k->state = RM_CALL_DONE;
  k->code = code;
  if (code != 0 && (!k->errmsg[0] || k->errmsg_code != code))
    snprintf(k->errmsg, sizeof(k->errmsg), "%s", rm_strerror(code));
  uv_mutex_lock(&c->mu);
  c->live--;
  uv_mutex_unlock(&c->mu);
  if (code == RM_E_NO_NODE) rm__probe_soon(c);
  if (!k->sync) {
    const char *xid = k->type == TXP_MSG_GLOBAL_BEGIN ? (code == 0 ? k->res_xid : NULL) : k->xid;
    k->cb(code, xid, k->status, k->cb_arg);
  } else {
    uv_mutex_lock(&k->mu);
    k->done = true;
    uv_cond_signal(&k->cv);
    uv_mutex_unlock(&k->mu);
  }
  rm__call_unref(k);
}

/* ------------------------------------------------------------ routing */

static bool node_ready(const rm_client_t *c, int i) { return rm__conn_ready(c->nodes[i].conn); }

/* No node registered and every one refused our token. */
static bool all_auth_failed(const rm_client_t *c) {
  if (atomic_load(&c->nodes_up) > 0) return false;
  for (int i = 0; i < c->nnodes; i++)
    if (!rm__conn_auth_failed(c->nodes[i].conn)) return false;
  return true;
}

static bool any_auth_failed(const rm_client_t *c) {
  for (int i = 0; i < c->nnodes; i++)
    if (rm__conn_auth_failed(c->nodes[i].conn)) return true;
  return false;
}

/* The node for 'k': the xid's creator if registered, else the client's
 * home node or the next registered one after it (RM_NODE_HOME), or the
 * next registered node round-robin (RM_NODE_ROUND_ROBIN); 'avoid' is
 * skipped unless it is the only one. */
static int pick_node(rm_client_t *c, const rm_call_t *k) {
  if (k->xid[0]) {
    char addr[RM_ADDR_MAX];
    if (rm__xid_node(k->xid, addr, sizeof(addr)) == 0) {
      for (int i = 0; i < c->nnodes; i++)
        if (i != k->avoid && node_ready(c, i) && rm__conn_is_node(c->nodes[i].conn, addr)) return i;
    }
  }
  bool home = c->cfg.node_choice == RM_NODE_HOME;
  unsigned start = home ? c->home : c->rr;
  for (int n = 0; n < c->nnodes; n++) {
    int i = (int)((start + (unsigned)n) % (unsigned)c->nnodes);
    if (i != k->avoid && node_ready(c, i)) {
      if (!home) c->rr = (unsigned)i + 1;
      return i;
    }
  }
  if (k->avoid >= 0 && node_ready(c, k->avoid)) return k->avoid;
  return -1;
}

/* The lock wait to ask for now: what is left of the deadline, keeping the
 * request timeout (or half of what is left) for the answer itself. */
static uint32_t lock_wait_now(const rm_client_t *c, const rm_call_t *k) {
  uint64_t now = rm__mono_ms();
  if (!k->lock_wait_ms || now >= k->deadline_ms) return 0;
  uint64_t left = k->deadline_ms - now;
  uint64_t reserve = c->cfg.request_timeout_ms < left / 2 ? c->cfg.request_timeout_ms : left / 2;
  uint64_t lw = left - reserve;
  return lw < k->lock_wait_ms ? (uint32_t)lw : k->lock_wait_ms;
}

static void build_msg(const rm_client_t *c, const rm_call_t *k, txp_msg_t *m) {
  txp_msg_init(m, (txp_msg_type_t)k->type);
  switch (k->type) {
  case TXP_MSG_GLOBAL_BEGIN:
    if (k->timeout_ms) txp_msg_set_int(m, TXP_F_TIMEOUT_MS, k->timeout_ms);
    if (k->name) txp_msg_set_str(m, TXP_F_NAME, k->name);
    txp_msg_set_str(m, TXP_F_IDEM_KEY, k->idem);
    /* No earlier send may have reached a coordinator: it may answer before
     * storing the begin (tc/tc_hold.h).  A resend goes without. */
    if (!k->maybe_done) txp_msg_set_int(m, TXP_F_FIRST_SEND, 1);
    break;
  case TXP_MSG_BRANCH_REGISTER: {
    uint32_t lw = lock_wait_now(c, k);
    if (k->xid[0]) {
      txp_msg_set_str(m, TXP_F_XID, k->xid);
    } else { /* no xid: the coordinator begins the global too */
      txp_msg_set_int(m, TXP_F_TIMEOUT_MS, k->timeout_ms);
      if (k->name) txp_msg_set_str(m, TXP_F_NAME, k->name);
    }
    txp_msg_set_int(m, TXP_F_BRANCH_TYPE, (uint64_t)k->branch_type);
    txp_msg_set_str(m, TXP_F_RESOURCE_ID, k->resource_id);
    if (k->lock_keys && k->lock_keys[0]) txp_msg_set_str(m, TXP_F_LOCK_KEYS, k->lock_keys);
    if (k->app_data) txp_msg_set_str(m, TXP_F_APP_DATA, k->app_data);
    if (lw) txp_msg_set_int(m, TXP_F_LOCK_WAIT_MS, lw);
    txp_msg_set_str(m, TXP_F_IDEM_KEY, k->idem);
    txp_msg_set_str(m, TXP_F_CLIENT_ID, c->client_id);
    break;
  }
  case TXP_MSG_GLOBAL_LOCK_QUERY: {
    uint32_t lw = lock_wait_now(c, k);
    txp_msg_set_str(m, TXP_F_XID, k->xid);
    txp_msg_set_str(m, TXP_F_RESOURCE_ID, k->resource_id);
    txp_msg_set_str(m, TXP_F_LOCK_KEYS, k->lock_keys);
    if (lw) txp_msg_set_int(m, TXP_F_LOCK_WAIT_MS, lw);
    break;
  }
  case TXP_MSG_BRANCH_REPORT:
    txp_msg_set_str(m, TXP_F_XID, k->xid);
    txp_msg_set_int(m, TXP_F_BRANCH_ID, k->branch_id);
    txp_msg_set_int(m, TXP_F_BRANCH_STATUS, k->branch_status);
    if (k->message && k->message[0]) txp_msg_set_str(m, TXP_F_MESSAGE, k->message);
    break;
  default: /* commit, rollback, status */
    txp_msg_set_str(m, TXP_F_XID, k->xid);
    break;
  }
}

/* The code for a call that ends without an answer: see NOTES. */
static int unanswered_code(const rm_client_t *c, const rm_call_t *k) {
  if (k->maybe_done) return RM_E_UNKNOWN_OUTCOME;
  if (atomic_load(&c->nodes_up) == 0) return any_auth_failed(c) ? RM_E_AUTH : RM_E_NO_NODE;
  return k->last_code ? k->last_code : RM_E_DEADLINE;
}

/* The deadline of 'k' passed: complete it (whatever its state). */
static void expire(rm_client_t *c, rm_call_t *k) {
  int code;
  switch (k->state) {
  case RM_CALL_SENT:
    unlink_sent(c, k);
    code = RM_E_UNKNOWN_OUTCOME;
    RM_LOG_C(c, RM_LOG_DEBUG, "%s request %" PRIu64 " got no answer within its deadline: outcome unknown",
        txp_msg_type_name(k->type), k->request_id);
    break;
  case RM_CALL_WAITING:
    list_remove(&c->waitq, k);
    code = unanswered_code(c, k);
    break;
  default:
    code = unanswered_code(c, k);
    break;
  }
  rm__call_complete(c, k, code);
}

/*
 * Send 'k' (state NEW, unlinked, in the heap) to a node, or park it in the
 * wait list when none is registered.  May complete it (deadline already
 * passed, every node refused our token, arguments the encoder refuses).
 */
static void dispatch(rm_client_t *c, rm_call_t *k) {
  if (rm__mono_ms() >= k->deadline_ms) {
    expire(c, k);
    return;
  }
  for (int tries = 0; tries < c->nnodes; tries++) {
    int i = pick_node(c, k);
    if (i < 0) break;
    txp_msg_t m;
    build_msg(c, k, &m);
    m.request_id = ++c->next_request_id;
    uint64_t end = 0;
    int rc = rm__conn_send(c->nodes[i].conn, &m, &end);
    if (rc == 0) {
      k->state = RM_CALL_SENT;
      k->node = i;
      k->request_id = m.request_id;
      k->wire_end = end;
      hash_insert(c, k);
      rm__call_list_push(&c->nodes[i].sent, k);
      return;
    }
    if (rc == TXP_ECONN_LOST) continue; /* that session just ended: next node */
    /* The encoder refused the message: an argument is invalid (e.g. not
     * UTF-8).  Nothing was sent. */
    RM_LOG_C(c, RM_LOG_WARN, "could not send %s: %s", txp_msg_type_name(k->type), txp_strerror(rc));
    rm__call_complete(c, k, rc == TXP_ENOMEM ? RM_E_NOMEM : RM_E_INVALID);
    return;
  }
  if (all_auth_failed(c)) {
    rm__call_complete(c, k, k->maybe_done ? RM_E_UNKNOWN_OUTCOME : RM_E_AUTH);
    return;
  }
  k->state = RM_CALL_WAITING;
  rm__call_list_push(&c->waitq, k);
  /* No call waits longer than the connect timeout for a node to appear
   * (the seed's 3 s): past it, RM_E_NO_NODE, so that a TM switches to
   * local mode instead of holding its request to the deadline.  A call
   * that may have reached a node waits to its deadline: its outcome is
   * open until a node answers. */
  uint64_t cap = rm__mono_ms() + c->cfg.connect_timeout_ms;
  if (!k->maybe_done && cap < k->deadline_ms) heap_update(c, k, cap);
}

void rm__calls_fail_waiting(rm_client_t *c) {
  rm_call_list_t q = c->waitq, keep = {0};
  c->waitq.head = c->waitq.tail = NULL;
  rm_call_t *k;
  while ((k = rm__call_list_pop(&q))) {
    if (k->maybe_done) {
      rm__call_list_push(&keep, k);
      continue;
    }
    rm__call_complete(c, k, unanswered_code(c, k));
  }
  c->waitq = keep;
  rm__call_arm_timer(c);
}

/* A retryable refusal: try again after a short backoff (within the
 * deadline; the heap entry becomes the earlier of the two). */
static void retry_later(rm_client_t *c, rm_call_t *k) {
  k->retries++;
  unsigned delay = rm__backoff_ms(k->retries, RM_RETRY_MIN_MS, RM_RETRY_MAX_MS, rm__rand32(&c->rng));
  uint64_t due = rm__mono_ms() + delay;
  k->state = RM_CALL_BACKOFF;
  heap_update(c, k, due < k->deadline_ms ? due : k->deadline_ms);
}

/*
 * What a commit or rollback that the coordinator answered with code 0
 * really got, by the status it answered (rm_client.h: a code 0 means the
 * caller got what it asked for, and nothing else does): 0, or
 * RM_E_ROLLBACK_PENDING / RM_E_ROLLBACK_FAILED / RM_E_COMMIT_FAILED with
 * the explanation in 'k->errmsg'.  The coordinator's answer stays as it
 * was (a repeated call is still idempotent): only the code changes.
 */
static int decision_code(rm_call_t *k) {
  const char *name = txp_global_status_name(k->status);
  if (k->type == TXP_MSG_GLOBAL_COMMIT) {
    if (k->status != TXP_GS_COMMIT_FAILED) return 0;
    snprintf(k->errmsg, sizeof(k->errmsg),
             "global transaction \"%s\" is committed, but a branch's phase-two commit failed for good (%s): "
             "see `tcctl show %s`", k->xid, name, k->xid);
    return RM_E_COMMIT_FAILED;
  }
  if (k->type != TXP_MSG_GLOBAL_ROLLBACK) return 0;
  switch (k->status) {
  case TXP_GS_ROLLBACK_FAILED:
  case TXP_GS_TIMEOUT_ROLLBACK_FAILED:
    snprintf(k->errmsg, sizeof(k->errmsg),
             "rollback of global transaction \"%s\" failed (%s): a branch cannot be undone, e.g. a row was "
             "changed outside the coordinator (a dirty write; nothing was overwritten): `tcctl show %s` names "
             "it; repair the row, then run `tcctl redrive %s`", k->xid, name, k->xid, k->xid);
    return RM_E_ROLLBACK_FAILED;
  case TXP_GS_ROLLBACKING:
  case TXP_GS_ROLLBACK_RETRYING:
  case TXP_GS_TIMEOUT_ROLLBACKING:
  case TXP_GS_TIMEOUT_ROLLBACK_RETRYING:
  case TXP_GS_STOP_ROLLBACK_RETRY:
    snprintf(k->errmsg, sizeof(k->errmsg),
             "rollback of global transaction \"%s\" is decided but not finished (%s): a branch is not undone "
             "yet (no resource manager of its resource running, a database without undo_log, a lock "
             "timeout: `tcctl show %s` has the branch's last error); the coordinator retries while an RM of "
             "that resource runs", k->xid, name, k->xid);
    return RM_E_ROLLBACK_PENDING;
  default:
    return 0;
  }
}

/* The answer 'm' to SENT call 'k' (already unlinked), from 'conn'. */
static void on_answer(rm_client_t *c, rm_conn_t *conn, rm_call_t *k, const txp_msg_t *m) {
  int idx = rm__conn_index(conn);
  int code = code_of(m->code);
  k->state = RM_CALL_NEW;
  if (m->type != TXP_MSG_ERROR && m->type != k->type + 1) {
    RM_LOG_C(c, RM_LOG_WARN, "coordinator \"%s\" answered %s with %s: outcome unknown",
        rm__conn_addr(conn), txp_msg_type_name(k->type), txp_msg_type_name(m->type));
    rm__call_complete(c, k, RM_E_UNKNOWN_OUTCOME);
    return;
  }
  if (m->message) {
    snprintf(k->errmsg, sizeof(k->errmsg), "%s", m->message);
  } else {
    k->errmsg[0] = '\0';
  }
  k->errmsg_code = code;
  if (txp_msg_has(m, TXP_F_GLOBAL_STATUS)) k->status = (int)m->global_status;
  if (k->type == TXP_MSG_GLOBAL_LOCK_QUERY) {
    k->res_lockable = txp_msg_has(m, TXP_F_LOCKABLE) && m->lockable;
    snprintf(k->res_xid, sizeof(k->res_xid), "%s", m->lock_holder ? m->lock_holder : "");
    k->waited_ms = m->waited_ms;
  }
  if (code == 0) {
    if (k->type == TXP_MSG_GLOBAL_BEGIN) {
      if (!m->xid || !m->xid[0]) {
        RM_LOG_C(c, RM_LOG_WARN, "coordinator \"%s\" answered GlobalBegin without an xid", rm__conn_addr(conn));
        rm__call_complete(c, k, RM_E_UNKNOWN_OUTCOME);
        return;
      }
      snprintf(k->res_xid, sizeof(k->res_xid), "%s", m->xid);
      rm__conn_learn_xid(conn, m->xid);
    } else if (k->type == TXP_MSG_BRANCH_REGISTER) {
      if (!k->xid[0]) { /* it began its global too (rm__begin_register) */
        if (!m->xid || !m->xid[0]) {
          RM_LOG_C(c, RM_LOG_WARN, "coordinator \"%s\" answered a begin and registration without an xid",
                   rm__conn_addr(conn));
          rm__call_complete(c, k, RM_E_UNKNOWN_OUTCOME);
          return;
        }
        snprintf(k->res_xid, sizeof(k->res_xid), "%s", m->xid);
        rm__conn_learn_xid(conn, m->xid);
      }
      k->res_branch_id = m->branch_id;
      k->waited_ms = m->waited_ms;
      if (m->waited_ms)
        RM_LOG_C(c, RM_LOG_DEBUG, "branch %" PRId64 " of \"%s\" registered after waiting %u ms for a global lock",
            m->branch_id, k->xid, (unsigned)m->waited_ms);
    } else {
      int done = decision_code(k);
      if (done != 0) {
        k->errmsg_code = done;
        RM_LOG_C(c, RM_LOG_WARN, "%s", k->errmsg);
        rm__call_complete(c, k, done);
        return;
      }
    }
    rm__call_complete(c, k, 0);
    return;
  }
  bool retry = code == TXP_EBUSY || code == TXP_ESHUTDOWN || code == TXP_ETOO_MANY_CONNS ||
               (code == TXP_ESTORE && k->idempotent);
  if (retry) {
    /* The store may have committed before failing: only an idempotent call
     * gets here with TXP_ESTORE, and its outcome is open until answered. */
    if (code == TXP_ESTORE) k->maybe_done = true;
    if (code == TXP_ESHUTDOWN) k->avoid = idx;
    k->last_code = code;
    RM_LOG_C(c, RM_LOG_DEBUG, "coordinator \"%s\" refused %s (%s): retrying", rm__conn_addr(conn),
        txp_msg_type_name(k->type), txp_errname(code));
    retry_later(c, k);
    return;
  }
  rm__call_complete(c, k, code);
}

/* ------------------------------------------ connection callbacks (loop) */

static void on_conn_ready(rm_conn_t *conn, void *arg) {
  rm_client_t *c = arg;
  atomic_fetch_add(&c->nodes_up, 1);
  c->ever_up = true;
  /* Everything that waited for a node goes now, in arrival order. */
  rm_call_list_t q = c->waitq;
  c->waitq.head = c->waitq.tail = NULL;
  rm_call_t *k;
  while ((k = rm__call_list_pop(&q))) {
    k->state = RM_CALL_NEW;
    heap_update(c, k, k->deadline_ms); /* its heap entry was the end of the wait for a node */
    dispatch(c, k);
  }
  (void)conn;
  rm__call_arm_timer(c);
}

static void on_conn_down(rm_conn_t *conn, bool was_ready, int reason, void *arg) {
  rm_client_t *c = arg;
  rm_node_t *n = &c->nodes[rm__conn_index(conn)];
  if (was_ready) {
    atomic_fetch_sub(&c->nodes_up, 1);
    void *rm = rm__rm_peek(c);
    if (rm) c->rm_ops->node_lost(rm);
  }
  rm_call_list_t q = n->sent;
  n->sent.head = n->sent.tail = NULL;
  rm_call_t *k;
  while ((k = rm__call_list_pop(&q))) {
    hash_remove(c, k);
    k->node = -1;
    k->state = RM_CALL_NEW;
    if (!rm__conn_sent(conn, k->wire_end)) {
      dispatch(c, k); /* never left our queue: it did not happen */
    } else if (k->idempotent) {
      k->maybe_done = true;
      RM_LOG_C(c, RM_LOG_DEBUG, "resending %s after losing \"%s\"", txp_msg_type_name(k->type),
          rm__conn_addr(conn));
      dispatch(c, k);
    } else {
      k->maybe_done = true;
      rm__call_complete(c, k, RM_E_UNKNOWN_OUTCOME);
    }
  }
  if (reason == TXP_EAUTH && all_auth_failed(c)) {
    /* No node will take us: fail what waits now rather than at deadlines. */
    q = c->waitq;
    c->waitq.head = c->waitq.tail = NULL;
    while ((k = rm__call_list_pop(&q))) rm__call_complete(c, k, k->maybe_done ? RM_E_UNKNOWN_OUTCOME : RM_E_AUTH);
  }
  rm__call_arm_timer(c);
}

static void on_conn_frame(rm_conn_t *conn, txp_msg_t *m, void *arg) {
  rm_client_t *c = arg;
  if (!(m->flags & TXP_FLAG_RESPONSE) && txp_msg_type_is_request(m->type)) {
    rm__serve_request(c, conn, m);
    return;
  }
  rm_call_t *k = hash_find(c, m->request_id);
  if (!k || k->node != rm__conn_index(conn)) {
    RM_LOG_C(c, RM_LOG_DEBUG, "ignoring %s for request %" PRIu64 " from \"%s\" (timed out?)",
        txp_msg_type_name(m->type), m->request_id, rm__conn_addr(conn));
    return;
  }
  unlink_sent(c, k);
  on_answer(c, conn, k, m);
  rm__call_arm_timer(c);
}

static void on_conn_bad_response(rm_conn_t *conn, uint64_t request_id, int rc, void *arg) {
  rm_client_t *c = arg;
  rm_call_t *k = hash_find(c, request_id);
  if (!k || k->node != rm__conn_index(conn)) return;
  unlink_sent(c, k);
  k->maybe_done = true;
  RM_LOG_C(c, RM_LOG_WARN, "invalid answer to %s from \"%s\" (%s): outcome unknown",
      txp_msg_type_name(k->type), rm__conn_addr(conn), txp_strerror(rc));
  rm__call_complete(c, k, RM_E_UNKNOWN_OUTCOME);
  rm__call_arm_timer(c);
}

static int conn_resource_ids(char *out, size_t cap, void *arg) {
  rm_client_t *c = arg;
  void *rm = rm__rm_peek(c);
  if (!rm) {
    if (cap) out[0] = '\0';
    return 0;
  }
  return c->rm_ops->resource_ids(rm, out, cap);
}

const rm_conn_cbs_t rm__call_conn_cbs = {
  on_conn_ready, on_conn_down, on_conn_frame, on_conn_bad_response, conn_resource_ids,
};

/* ------------------------------------ the timer; starting, aborting calls */

static void on_timer(uv_timer_t *t) {
  rm_client_t *c = t->data;
  uint64_t now = rm__mono_ms();
  for (rm_call_t *k; (k = heap_first(c)) != NULL && k->hnode.key <= now;) {
    if (now >= k->deadline_ms) {
      expire(c, k);
    } else if (k->state == RM_CALL_WAITING) { /* waited the connect timeout for a node */
      list_remove(&c->waitq, k);
      rm__call_complete(c, k, unanswered_code(c, k));
    } else if (k->state == RM_CALL_BACKOFF) { /* a backoff ended */
      heap_update(c, k, k->deadline_ms);
      k->state = RM_CALL_NEW;
      dispatch(c, k);
    } else { /* an earlier entry that no longer applies: the deadline it is */
      heap_update(c, k, k->deadline_ms);
    }
  }
  rm__call_arm_timer(c);
}

void rm__call_arm_timer(rm_client_t *c) {
  if (c->stopping) return;
  if (txc_heap_len(&c->heap) == 0) {
    uv_timer_stop(&c->timer);
    return;
  }
  uint64_t now = rm__mono_ms(), due = heap_first(c)->hnode.key;
  uv_update_time(&c->loop); /* the timer counts from the loop's clock */
  uv_timer_start(&c->timer, on_timer, due > now ? due - now : 0, 0);
}

void rm__call_start(rm_client_t *c, rm_call_t *k) {
  k->state = RM_CALL_NEW;
  if (heap_push(c, k, k->deadline_ms) != 0) {
    rm__call_complete(c, k, RM_E_NOMEM);
    return;
  }
  dispatch(c, k);
}

void rm__calls_abort(rm_client_t *c) {
  for (rm_call_t *k; (k = heap_first(c)) != NULL;) {
    int code = k->maybe_done ? RM_E_UNKNOWN_OUTCOME : RM_E_CONN_LOST;
    if (k->state == RM_CALL_SENT) {
      if (rm__conn_sent(c->nodes[k->node].conn, k->wire_end)) code = RM_E_UNKNOWN_OUTCOME;
      unlink_sent(c, k);
    } else if (k->state == RM_CALL_WAITING) {
      list_remove(&c->waitq, k);
    }
    rm__call_complete(c, k, code);
  }
}
