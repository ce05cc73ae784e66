/*
 * rm_tm.c - the calls a caller's thread makes to the coordinators: the TM
 * API of rm_client.h (begin, commit, rollback, status; blocking and
 * callback forms) and the AT layer's BranchRegister and BranchReport
 * (rm_internal.h).  Each builds a call holding copies of its arguments and
 * hands it to the loop thread (rm_call.c runs it there).
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rm_core.h"

#define RM_BLOCKING_GRACE_MS 2000u /* a blocking caller gives up this long after its deadline */

/* ---------------------------------------------------------- running calls */

/*
 * Run 'k' as a blocking call: returns its code.  The caller keeps its
 * reference and drops it afterwards; it may read the outcome fields only
 * when '*completed' (the loop completed the call: otherwise it was refused
 * before submission, or given up on, and the loop may still write them).
 */
/* The two halves of a blocking call: start it (0, or the code: then it
 * never ran), and wait for its end. */
static int start_blocking(rm_client_t *c, rm_call_t *k) {
  if (rm__on_loop_thread(c)) {
    RM_LOG_C(c, RM_LOG_ERROR, "blocking call %s made from a library callback: refused",
        txp_msg_type_name(k->type));
    return RM_E_INVALID;
  }
  k->sync = true;
  if (uv_mutex_init(&k->mu) != 0) {
    k->sync = false;
    return RM_E_NOMEM;
  }
  if (uv_cond_init(&k->cv) != 0) {
    uv_mutex_destroy(&k->mu);
    k->sync = false;
    return RM_E_NOMEM;
  }
  atomic_store(&k->refs, 2);
  int rc = rm__submit(c, k);
  if (rc != 0) atomic_store(&k->refs, 1);
  return rc;
}

static int wait_blocking(rm_client_t *c, rm_call_t *k, bool *completed) {
  *completed = false;
  uv_mutex_lock(&k->mu);
  while (!k->done) {
    /* The loop completes every call by its deadline; the grace period only
     * guards against a loop thread blocked by a misbehaving callback. */
    uint64_t limit = k->deadline_ms + RM_BLOCKING_GRACE_MS, now = rm__mono_ms();
    if (now >= limit) break;
    uv_cond_timedwait(&k->cv, &k->mu, (limit - now) * 1000000u);
  }
  bool done = k->done;
  int rc = k->code;
  uv_mutex_unlock(&k->mu);
  *completed = done;
  if (!done) {
    RM_LOG_C(c, RM_LOG_ERROR, "%s got no completion %u ms past its deadline: the library thread is "
        "blocked (a callback that blocks?); outcome unknown",
        txp_msg_type_name(k->type), RM_BLOCKING_GRACE_MS);
    return RM_E_UNKNOWN_OUTCOME;
  }
  return rc;
}

static int run_blocking(rm_client_t *c, rm_call_t *k, bool *completed) {
  *completed = false;
  int rc = start_blocking(c, k);
  return rc != 0 ? rc : wait_blocking(c, k, completed);
}

/* Start an async call: 0 (callback runs once) or an error (it never runs). */
static int run_async(rm_client_t *c, rm_call_t *k, rm_tm_cb cb, void *arg) {
  k->cb = cb;
  k->cb_arg = arg;
  int rc = rm__submit(c, k);
  if (rc != 0) rm__call_unref(k);
  return rc;
}

/* --------------------------------------------------------- public: TM */

static rm_call_t *begin_call(rm_client_t *c, unsigned timeout_ms, const char *name, int *rc) {
  *rc = RM_E_INVALID;
  if (!c || rm__check_str(name, TXP_MAX_NAME_LEN, false) != 0) return NULL;
  *rc = RM_E_NOMEM;
  rm_call_t *k = rm__call_new(TXP_MSG_GLOBAL_BEGIN, true, c->cfg.request_timeout_ms);
  if (!k) return NULL;
  k->timeout_ms = timeout_ms;
  rm__idem_key(k->idem);
  if (name && !(k->name = strdup(name))) {
    rm__call_destroy(k);
    return NULL;
  }
  *rc = 0;
  return k;
}

static rm_call_t *xid_call(rm_client_t *c, uint16_t type, const char *xid, int *rc) {
  *rc = RM_E_INVALID;
  if (!c || rm__check_str(xid, TXP_MAX_XID_LEN, true) != 0) return NULL;
  *rc = RM_E_NOMEM;
  rm_call_t *k = rm__call_new(type, true, c->cfg.request_timeout_ms);
  if (!k) return NULL;
  snprintf(k->xid, sizeof(k->xid), "%s", xid);
  *rc = 0;
  return k;
}

/* rm_errmsg() for a TM call that could not be made: 'what' names it. */
static int tm_refused(int rc, rm_client_t *c, const char *what, const char *xid, const char *name) {
  if (rc == RM_E_NOMEM) return rm__fail(rc, "could not %s: out of memory", what);
  if (!c) return rm__fail(rc, "could not %s: the client is NULL", what);
  if (xid && rm__check_str(xid, TXP_MAX_XID_LEN, true) != 0)
    return rm__fail(rc, "could not %s: the xid is %s", what, xid[0] ? "longer than 128 bytes" : "NULL or empty");
  if (name && rm__check_str(name, TXP_MAX_NAME_LEN, false) != 0)
    return rm__fail(rc, "could not %s: the name is longer than %d bytes", what, TXP_MAX_NAME_LEN);
  return rm__fail(rc, "could not %s: invalid argument (NULL xid, buffer or callback)", what);
}

/* rm_errmsg() after a blocking call 'k' ended with 'rc' != 0: the
 * coordinator's message when it answered. */
static int tm_failed(int rc, rm_call_t *k, bool completed, const char *what) {
  const char *why = completed && k->errmsg[0] ? k->errmsg : rm_strerror(rc);
  if (k->type == TXP_MSG_GLOBAL_BEGIN) return rm__fail(rc, "could not %s: %s", what, why);
  if (rc == RM_E_ROLLBACK_PENDING || rc == RM_E_ROLLBACK_FAILED || rc == RM_E_COMMIT_FAILED ||
      rc == RM_E_COMMIT_PENDING)
    return rm__fail(rc, "%s", why);
  if (completed && k->status)
    return rm__fail(rc, "could not %s \"%s\": %s (status %s)", what, k->xid, why,
                    txp_global_status_name(k->status));
  return rm__fail(rc, "could not %s \"%s\": %s", what, k->xid, why);
}

static const char *tm_what(uint16_t type) {
  switch (type) {
  case TXP_MSG_GLOBAL_BEGIN: return "begin a global transaction";
  case TXP_MSG_GLOBAL_COMMIT: return "commit global transaction";
  case TXP_MSG_GLOBAL_ROLLBACK: return "roll back global transaction";
  default: return "read the status of global transaction";
  }
}

int rm_tm_begin(rm_client_t *c, unsigned timeout_ms, const char *name, char *xid) {
  int rc;
  const char *what = tm_what(TXP_MSG_GLOBAL_BEGIN);
  if (!xid) return tm_refused(RM_E_INVALID, c, what, NULL, name);
  xid[0] = '\0';
  bool completed;
  rm_call_t *k = begin_call(c, timeout_ms, name, &rc);
  if (!k) return tm_refused(rc, c, what, NULL, name);
  rc = run_blocking(c, k, &completed);
  if (rc == 0 && completed) snprintf(xid, RM_XID_MAX, "%s", k->res_xid);
  if (rc != 0) tm_failed(rc, k, completed, what);
  rm__call_unref(k);
  return rc;
}

static int xid_blocking(rm_client_t *c, uint16_t type, const char *xid, int *status) {
  int rc;
  bool completed;
  if (status) *status = 0;
  rm_call_t *k = xid_call(c, type, xid, &rc);
  if (!k) return tm_refused(rc, c, tm_what(type), xid ? xid : "", NULL);
  rc = run_blocking(c, k, &completed);
  if (status && completed) *status = k->status;
  if (rc != 0) tm_failed(rc, k, completed, tm_what(type));
  rm__call_unref(k);
  return rc;
}

int rm_tm_commit(rm_client_t *c, const char *xid, int *status) {
  return xid_blocking(c, TXP_MSG_GLOBAL_COMMIT, xid, status);
}

int rm_tm_rollback(rm_client_t *c, const char *xid, int *status) {
  return xid_blocking(c, TXP_MSG_GLOBAL_ROLLBACK, xid, status);
}

int rm_tm_status(rm_client_t *c, const char *xid, int *status) {
  return xid_blocking(c, TXP_MSG_GLOBAL_STATUS, xid, status);
}

int rm_tm_begin_async(rm_client_t *c, unsigned timeout_ms, const char *name, rm_tm_cb cb, void *arg) {
  int rc;
  const char *what = tm_what(TXP_MSG_GLOBAL_BEGIN);
  if (!cb) return tm_refused(RM_E_INVALID, c, what, NULL, name);
  rm_call_t *k = begin_call(c, timeout_ms, name, &rc);
  if (!k) return tm_refused(rc, c, what, NULL, name);
  if ((rc = run_async(c, k, cb, arg)) != 0) rm__fail(rc, "could not %s: %s", what, rm_strerror(rc));
  return rc;
}

static int xid_async(rm_client_t *c, uint16_t type, const char *xid, rm_tm_cb cb, void *arg) {
  int rc;
  if (!cb) return tm_refused(RM_E_INVALID, c, tm_what(type), xid ? xid : "", NULL);
  rm_call_t *k = xid_call(c, type, xid, &rc);
  if (!k) return tm_refused(rc, c, tm_what(type), xid ? xid : "", NULL);
  if ((rc = run_async(c, k, cb, arg)) != 0) rm__fail(rc, "could not %s \"%s\": %s", tm_what(type), xid, rm_strerror(rc));
  return rc;
}

int rm_tm_commit_async(rm_client_t *c, const char *xid, rm_tm_cb cb, void *arg) {
  return xid_async(c, TXP_MSG_GLOBAL_COMMIT, xid, cb, arg);
}

int rm_tm_rollback_async(rm_client_t *c, const char *xid, rm_tm_cb cb, void *arg) {
  return xid_async(c, TXP_MSG_GLOBAL_ROLLBACK, xid, cb, arg);
}

int rm_tm_status_async(rm_client_t *c, const char *xid, rm_tm_cb cb, void *arg) {
  return xid_async(c, TXP_MSG_GLOBAL_STATUS, xid, cb, arg);
}

int rm_tm_begin_branch(rm_client_t *c, unsigned timeout_ms, const char *name, const char *resource_id, char *xid,
                       int64_t *branch_id) {
  const char *what = tm_what(TXP_MSG_GLOBAL_BEGIN);
  if (!xid || !branch_id) return tm_refused(RM_E_INVALID, c, what, NULL, name);
  *branch_id = 0;
  char err[TXP_MAX_MESSAGE_LEN + 1];
  int rc = rm__begin_register(c, timeout_ms, name, resource_id, xid, branch_id, err, sizeof(err));
  if (rc == RM_E_NOT_SUPPORTED) return rm_tm_begin(c, timeout_ms, name, xid); /* registered at prepare */
  if (rc != 0) return rm__fail(rc, "could not %s with a branch on \"%s\": %s", what, resource_id ? resource_id : "",
                               err);
  return 0;
}

/* ---------------------------------------------- internal: for the AT layer */

int rm__branch_register(rm_client_t *c, const char *xid, const char *resource_id,
                        const char *lock_keys, const char *app_data, unsigned lock_wait_ms,
                        int64_t *branch_id, char *errmsg, size_t errlen) {
  return rm__branch_register_as(c, TXP_BT_AT, xid, resource_id, lock_keys, app_data, lock_wait_ms, branch_id, errmsg,
                                errlen);
}

/* A BranchRegister started (0 with the pending call in *out) or refused
 * before it was sent (the code; 'errmsg' says why). */
static int register_start(rm_client_t *c, int branch_type, const char *xid, const char *resource_id,
                          const char *lock_keys, const char *app_data, unsigned lock_wait_ms, rm_call_t **out,
                          char *errmsg, size_t errlen) {
  *out = NULL;
  if (!c || rm__check_str(xid, TXP_MAX_XID_LEN, true) != 0 ||
      rm__check_str(resource_id, TXP_MAX_RESOURCE_LEN, true) != 0 ||
      rm__check_str(lock_keys, TXP_MAX_LOCK_KEYS_LEN, false) != 0 ||
      rm__check_str(app_data, TXP_MAX_APP_DATA_LEN, false) != 0 || branch_type < 0 || branch_type >= TXP_BT__MAX) {
    if (errmsg && errlen) snprintf(errmsg, errlen, "invalid argument to branch registration");
    return RM_E_INVALID;
  }
  uint64_t timeout = (uint64_t)c->cfg.request_timeout_ms + lock_wait_ms;
  if (timeout > UINT_MAX) timeout = UINT_MAX;
  rm_call_t *k = rm__call_new(TXP_MSG_BRANCH_REGISTER, true, (unsigned)timeout);
  if (!k) return RM_E_NOMEM;
  snprintf(k->xid, sizeof(k->xid), "%s", xid);
  rm__idem_key(k->idem);
  k->branch_type = branch_type;
  k->lock_wait_ms = lock_wait_ms;
  k->resource_id = strdup(resource_id);
  k->lock_keys = lock_keys ? strdup(lock_keys) : NULL;
  k->app_data = app_data ? strdup(app_data) : NULL;
  if (!k->resource_id || (lock_keys && !k->lock_keys) || (app_data && !k->app_data)) {
    rm__call_destroy(k);
    return RM_E_NOMEM;
  }
  int rc = start_blocking(c, k);
  if (rc != 0) {
    rm__call_unref(k);
    if (errmsg && errlen) snprintf(errmsg, errlen, "%s", rm_strerror(rc));
    return rc;
  }
  *out = k;
  return 0;
}

int rm__branch_register_as(rm_client_t *c, int branch_type, const char *xid, const char *resource_id,
                           const char *lock_keys, const char *app_data, unsigned lock_wait_ms,
                           int64_t *branch_id, char *errmsg, size_t errlen) {
  if (errmsg && errlen) errmsg[0] = '\0';
  if (branch_id) *branch_id = 0;
  rm_call_t *k;
  int rc = register_start(c, branch_type, xid, resource_id, lock_keys, app_data, lock_wait_ms, &k, errmsg, errlen);
  if (rc != 0) return rc;
  int64_t bid = 0;
  rc = rm__branch_register_wait(c, k, &bid, errmsg, errlen);
  if (branch_id) *branch_id = bid;
  return rc;
}

int rm__begin_register(rm_client_t *c, unsigned timeout_ms, const char *name, const char *resource_id,
                       char *xid, int64_t *branch_id, char *errmsg, size_t errlen) {
  if (errmsg && errlen) errmsg[0] = '\0';
  if (xid) xid[0] = '\0';
  if (branch_id) *branch_id = 0;
  if (!c || !xid || rm__check_str(resource_id, TXP_MAX_RESOURCE_LEN, true) != 0 ||
      rm__check_str(name, TXP_MAX_NAME_LEN, false) != 0) {
    if (errmsg && errlen) snprintf(errmsg, errlen, "invalid argument to a begin with its branch");
    return RM_E_INVALID;
  }
  rm_call_t *k = rm__call_new(TXP_MSG_BRANCH_REGISTER, true, c->cfg.request_timeout_ms);
  if (!k) return RM_E_NOMEM;
  /* No idempotency key: a resend makes a new global (see rm_internal.h). */
  k->branch_type = TXP_BT_AT;
  k->timeout_ms = timeout_ms;
  k->resource_id = strdup(resource_id);
  if (name && !(k->name = strdup(name))) {
    free(k->resource_id);
    k->resource_id = NULL;
  }
  if (!k->resource_id) {
    rm__call_destroy(k);
    return RM_E_NOMEM;
  }
  bool completed;
  int rc = run_blocking(c, k, &completed);
  if (rc == 0 && completed) {
    snprintf(xid, RM_XID_MAX, "%s", k->res_xid);
    if (branch_id) *branch_id = k->res_branch_id;
  } else {
    /* An older coordinator: "missing or empty xid". */
    if (completed && rc == RM_E_BAD_REQUEST && strstr(k->errmsg, "xid")) rc = RM_E_NOT_SUPPORTED;
    if (errmsg && errlen) snprintf(errmsg, errlen, "%s", completed && k->errmsg[0] ? k->errmsg : rm_strerror(rc));
  }
  rm__call_unref(k);
  return rc;
}

int rm__branch_register_start(rm_client_t *c, const char *xid, const char *resource_id, rm_pending_t **out) {
  return register_start(c, TXP_BT_AT, xid, resource_id, NULL, NULL, 0, out, NULL, 0);
}

int rm__branch_register_wait(rm_client_t *c, rm_pending_t *k, int64_t *branch_id, char *errmsg, size_t errlen) {
  if (errmsg && errlen) errmsg[0] = '\0';
  *branch_id = 0;
  bool completed;
  int rc = wait_blocking(c, k, &completed);
  if (rc == 0 && completed) *branch_id = k->res_branch_id;
  else if (errmsg && errlen) snprintf(errmsg, errlen, "%s", completed && k->errmsg[0] ? k->errmsg : rm_strerror(rc));
  rm__call_unref(k);
  return rc;
}

int rm__lock_query(rm_client_t *c, const char *xid, const char *resource_id, const char *lock_keys,
                   unsigned lock_wait_ms, bool *lockable, char *holder, size_t holderlen, char *errmsg,
                   size_t errlen) {
  if (errmsg && errlen) errmsg[0] = '\0';
  if (holder && holderlen) holder[0] = '\0';
  *lockable = false;
  if (!c || rm__check_str(xid, TXP_MAX_XID_LEN, true) != 0 ||
      rm__check_str(resource_id, TXP_MAX_RESOURCE_LEN, true) != 0 ||
      rm__check_str(lock_keys, TXP_MAX_LOCK_KEYS_LEN, true) != 0) {
    if (errmsg && errlen) snprintf(errmsg, errlen, "invalid argument to a global lock query");
    return RM_E_INVALID;
  }
  uint64_t timeout = (uint64_t)c->cfg.request_timeout_ms + lock_wait_ms;
  if (timeout > UINT_MAX) timeout = UINT_MAX;
  /* A read: safe to send again. */
  rm_call_t *k = rm__call_new(TXP_MSG_GLOBAL_LOCK_QUERY, true, (unsigned)timeout);
  if (!k) return RM_E_NOMEM;
  snprintf(k->xid, sizeof(k->xid), "%s", xid);
  k->lock_wait_ms = lock_wait_ms;
  k->resource_id = strdup(resource_id);
  k->lock_keys = strdup(lock_keys);
  if (!k->resource_id || !k->lock_keys) {
    rm__call_destroy(k);
    return RM_E_NOMEM;
  }
  bool completed;
  int rc = run_blocking(c, k, &completed);
  if (completed && (rc == 0 || rc == RM_E_LOCK_WAIT_TIMEOUT)) {
    *lockable = rc == 0 && k->res_lockable;
    if (holder && holderlen) snprintf(holder, holderlen, "%s", k->res_xid);
  }
  if (rc != 0 && errmsg && errlen) snprintf(errmsg, errlen, "%s", completed && k->errmsg[0] ? k->errmsg : rm_strerror(rc));
  rm__call_unref(k);
  return rc;
}

int rm__branch_report(rm_client_t *c, const char *xid, int64_t branch_id, int branch_status,
                      const char *message) {
  if (!c || rm__check_str(xid, TXP_MAX_XID_LEN, true) != 0 ||
      (branch_status != TXP_BS_PHASE1_DONE && branch_status != TXP_BS_PHASE1_FAILED))
    return RM_E_INVALID;
  /* Not idempotent as far as this layer knows: once sent, a lost answer is
   * an unknown outcome rather than a resend. */
  rm_call_t *k = rm__call_new(TXP_MSG_BRANCH_REPORT, false, c->cfg.request_timeout_ms);
  if (!k) return RM_E_NOMEM;
  snprintf(k->xid, sizeof(k->xid), "%s", xid);
  k->branch_id = branch_id;
  k->branch_status = branch_status;
  if (message && message[0]) {
    if (!(k->message = strdup(message))) {
      rm__call_destroy(k);
      return RM_E_NOMEM;
    }
    rm__utf8_cut(k->message, TXP_MAX_MESSAGE_LEN);
  }
  bool completed;
  int rc = run_blocking(c, k, &completed);
  rm__call_unref(k);
  return rc;
}
