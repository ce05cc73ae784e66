/*
 * rm_commit.c - phase-two commit of AT branches (rm_undo.c NOTES): the
 * queue of committed branches for the deleter, the batch that ends them
 * (a DELETE of the plain undo rows, each marked row committed with its
 * commit deltas), the branches remembered for an inline commit, and the
 * commit of one branch with commit deltas in one local transaction.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rm_undo_int.h"

/* A branch remembered for an inline commit (rm__at_inline_add). */
struct rm_inline_key {
  char xid[TXP_MAX_XID_LEN + 1];
  int64_t branch_id;
  int64_t added_ms;
};
/* Remembered entries older than this are dropped to make room: their
 * commit went elsewhere, or never came. */
#define INLINE_STALE_MS (10 * 60 * 1000)

/* ------------------------------------------------------- commit: delete */

/* Commit 'n' branches: DELETE the undo rows without commit deltas in one
 * statement, which also returns the marked ones; then commit each of
 * those (rm__commit_marked).  A marked row that fails is logged and left for
 * the leftover pass.  0, or the code of the DELETE's failure. */
int rm__commit_finish(rm_at_resource_t *r, const rm_undo_key_t *keys, size_t n, char *err, size_t errlen) {
  json_t *arr = json_array();
  for (size_t i = 0; arr && i < n; i++) {
    json_t *o = json_pack("{s:s, s:I}", "xid", keys[i].xid, "branch_id", (json_int_t)keys[i].branch_id);
    if (!o || json_array_append_new(arr, o) != 0) {
      json_decref(arr);
      arr = NULL;
    }
  }
  char *text = arr ? json_dumps(arr, JSON_COMPACT) : NULL;
  json_decref(arr);
  if (!text) {
    snprintf(err, errlen, "out of memory");
    return RM_E_NOMEM;
  }
  PGconn *pg = NULL;
  int rc = rm__undo_pool_get(r, &pg, err, errlen);
  bool bad = false;
  if (rc == 0) {
    const char *params[1] = {text};
    PGresult *res = PQexecParams(pg,
                                 "WITH k AS (SELECT * FROM pg_catalog.jsonb_to_recordset($1::jsonb)"
                                 " AS k(xid text, branch_id int8)),"
                                 " plain AS (DELETE FROM undo_log u USING k"
                                 " WHERE u.xid = k.xid AND u.branch_id = k.branch_id AND u.log_status = 0"
                                 " AND NOT " MARKED("u") ")"
                                 " SELECT u.xid, u.branch_id FROM undo_log u JOIN k"
                                 " ON u.xid = k.xid AND u.branch_id = k.branch_id"
                                 " WHERE u.log_status = 0 AND " MARKED("u"),
                                 1, NULL, params, NULL, NULL, 0);
    if (PQresultStatus(res) != PGRES_TUPLES_OK) {
      rm__pg_error(err, errlen, "could not delete undo rows", pg, res);
      rc = RM_E_DB;
      bad = true;
    }
    for (int i = 0; rc == 0 && i < PQntuples(res); i++) {
      char cerr[1024] = "";
      int code = 0;
      rm__commit_marked(r, pg, PQgetvalue(res, i, 0), atoll(PQgetvalue(res, i, 1)), &bad, &code, cerr, sizeof(cerr));
      if (bad) break;
    }
    PQclear(res);
    rm__undo_pool_put(r, pg, bad);
  }
  free(text);
  return rc;
}

void rm__commit_keys_free(rm_undo_key_t *keys, size_t n) {
  for (size_t i = 0; keys && i < n; i++) free(keys[i].xid);
  free(keys);
}

/* Append to r's queue; st->mu held.  False when full or out of memory. */
static bool queue_push(rm_at_resource_t *r, unsigned queue_max, char *xid, int64_t bid) {
  if (r->qlen >= queue_max) return false;
  if (r->qlen == r->qcap) {
    size_t cap = r->qcap ? r->qcap * 2 : 64;
    rm_undo_key_t *q = realloc(r->queue, cap * sizeof(*q));
    if (!q) return false;
    r->queue = q;
    r->qcap = cap;
  }
  r->queue[r->qlen].xid = xid;
  r->queue[r->qlen].branch_id = bid;
  r->qlen++;
  return true;
}

/* Delete everything queued for 'r', batch by batch.  A failed batch and
 * the rest go back to the queue (as far as it has room: the sweep
 * removes what is dropped). */
int rm__commit_flush(rm_at_resource_t *r) {
  rm_at_state_t *st = r->st;
  pthread_mutex_lock(&st->mu);
  rm_undo_key_t *keys = r->queue;
  size_t n = r->qlen;
  unsigned batch = st->tune.delete_batch ? st->tune.delete_batch : 1000;
  r->queue = NULL;
  r->qlen = r->qcap = 0;
  pthread_mutex_unlock(&st->mu);
  size_t done = 0;
  int rc = 0;
  char err[512] = "";
  while (done < n) {
    size_t k = n - done < batch ? n - done : batch;
    if ((rc = rm__commit_finish(r, keys + done, k, err, sizeof(err))) != 0) break;
    done += k;
  }
  if (rc != 0) {
    size_t dropped = 0;
    pthread_mutex_lock(&st->mu);
    for (size_t i = done; i < n; i++) {
      if (queue_push(r, st->tune.queue_max, keys[i].xid, keys[i].branch_id)) keys[i].xid = NULL;
      else dropped++;
    }
    pthread_mutex_unlock(&st->mu);
    rm__log(st->c, RM_LOG_WARN,
            "could not delete the undo rows of %zu committed branch(es) on \"%s\": %s; will retry%s",
            n - done, r->id, err, dropped ? " (some dropped: the sweep will remove them)" : "");
  }
  rm__commit_keys_free(keys, n); /* requeued keys had their xid moved out (NULL) */
  return rc;
}

/* Apply the commit_delta items of items[first]'s row (items[first] is the
 * first of its row): UPDATE t SET c = c + $1, ... WHERE pk RETURNING 1,
 * the deltas of one column summed. */
static int apply_row_deltas(rm_undo_ctx_t *u, const rm_item_t *items, size_t n, size_t first) {
  const rm_item_t *it = &items[first];
  const rm_table_t *t = NULL;
  int rc = rm__undo_item_table(u, it, &t);
  if (rc != RM_UNDO_OK) return rc;
  int *cols = calloc(n, sizeof(int));
  long long *sums = calloc(n, sizeof(long long));
  char (*txt)[32] = calloc(n, 32);
  const char **params = calloc(n + (size_t)it->pk->n, sizeof(char *));
  Oid *types = calloc(n + (size_t)it->pk->n, sizeof(Oid));
  txp_buf_t sql;
  txp_buf_init(&sql, 0);
  int ncols = 0, out = RM_UNDO_OK;
  if (!cols || !sums || !txt || !params || !types) {
    snprintf(u->io.err, u->io.errlen, "out of memory");
    out = RM_UNDO_DB;
    goto done;
  }
  for (size_t k = first; k < n; k++) {
    const rm_item_t *e = &items[k];
    if (e->op != RM_OP_COMMIT_DELTA || !rm_item_same_row(it, e)) continue;
    int ci = rm__undo_col_of(t, e->col);
    if (ci < 0) {
      snprintf(u->io.err, u->io.errlen, "column \"%s\" of \"%s\".\"%s\" no longer exists: cannot apply a commit delta",
               e->col, e->schema, e->table);
      out = RM_UNDO_FATAL;
      goto done;
    }
    int j = 0;
    while (j < ncols && cols[j] != ci) j++;
    if (j == ncols) cols[ncols++] = ci;
    if (__builtin_add_overflow(sums[j], e->delta, &sums[j])) {
      snprintf(u->io.err, u->io.errlen, "the commit deltas of \"%s\".\"%s\" overflow", e->table, e->col);
      out = RM_UNDO_FATAL;
      goto done;
    }
  }
  rc = txp_buf_append_str(&sql, "UPDATE ");
  if (!rc) rc = txp_buf_append_str(&sql, t->qname);
  for (int j = 0; !rc && j < ncols; j++) {
    char num[32];
    snprintf(num, sizeof(num), " + $%d", j + 1);
    rc = txp_buf_append_str(&sql, j ? ", " : " SET ");
    if (!rc) rc = txp_buf_append_str(&sql, t->cols[cols[j]].qname);
    if (!rc) rc = txp_buf_append_str(&sql, " = ");
    if (!rc) rc = txp_buf_append_str(&sql, t->cols[cols[j]].qname);
    if (!rc) rc = txp_buf_append_str(&sql, num);
    snprintf(txt[j], 32, "%lld", sums[j]);
    params[j] = txt[j];
    types[j] = INT8OID;
  }
  if (!rc) rc = rm__undo_where_pk(u->io.pg, &sql, it->pk, ncols + 1);
  if (!rc) rc = txp_buf_append_str(&sql, " RETURNING 1");
  for (int k = 0; k < it->pk->n; k++) params[ncols + k] = it->pk->vals[k];
  if (rc) {
    snprintf(u->io.err, u->io.errlen, "out of memory");
    out = RM_UNDO_DB;
    goto done;
  }
  PGresult *res = rm__pg_io_exec(&u->io, "could not apply a commit delta",
                                 sql.data, ncols + it->pk->n, params, types, PGRES_TUPLES_OK);
  if (!res) {
    out = RM_UNDO_DB;
    goto done;
  }
  if (PQntuples(res) != 1) {
    snprintf(u->io.err, u->io.errlen,
             "the row of \"%s\".\"%s\" that a commit delta of the branch changes is gone: the give-back cannot be "
             "applied; restore the row or account for it by hand, then re-drive the global transaction",
             it->schema, it->table);
    out = RM_UNDO_FATAL;
  }
  PQclear(res);
done:
  txp_buf_free(&sql);
  free(cols);
  free(sums);
  free(txt);
  free(params);
  free(types);
  return out;
}

/*
 * The commit of a branch whose undo row carries commit deltas, in ONE
 * local transaction on 'u->io.pg' (NOTES): lock the row, apply its
 * commit_delta items, delete it, commit.  No row (or a guard): applied
 * before, or nothing to apply.  Returns a branch status, sets *code.
 */
static int commit_apply_on(rm_undo_ctx_t *u, int *code) {
  const rm_phase2_req_t *req = u->req;
  rm_undo_txn_t t;
  if (!rm__undo_txn_begin(u, &t, true, code)) goto out;
  /* The row goes first (locked, and gone for everyone once we commit): if
   * a delta cannot be applied, the ROLLBACK brings it back. */
  if (!(t.row = rm__pg_io_exec(&u->io, "could not take the undo row",
                               "DELETE FROM undo_log WHERE xid = $1 AND branch_id = $2 AND log_status = 0"
                               " RETURNING id, log_status, context, rollback_info::text",
                               2, t.key, NULL, PGRES_TUPLES_OK)))
    goto out;
  if (PQntuples(t.row) != 1) {
    *code = 0; /* committed before, or a guard row: nothing to apply */
    t.status = TXP_BS_PHASE2_COMMITTED;
    goto out;
  }
  if (!rm__undo_txn_load(u, &t, code)) goto out;
  for (size_t i = 0; i < t.nitems; i++) {
    if (t.items[i].op != RM_OP_COMMIT_DELTA) continue;
    bool first = true;
    for (size_t k = 0; k < i && first; k++)
      first = !(t.items[k].op == RM_OP_COMMIT_DELTA && rm_item_same_row(&t.items[i], &t.items[k]));
    if (!first) continue;
    int rc = apply_row_deltas(u, t.items, t.nitems, i);
    if (rc != RM_UNDO_OK) {
      t.status = rm__undo_item_failure(u, rc, true, code);
      goto out;
    }
  }
  if (!rm__undo_txn_commit(u, &t, "could not commit", code)) goto out;
  rm__log(u->r->st->c, RM_LOG_DEBUG, "committed branch %s of \"%s\" on \"%s\" with its commit deltas", t.bid,
          req->xid, u->r->id);

out:
  return rm__undo_txn_end(u, &t);
}

/* commit_apply_on for (xid, bid) on 'pg' (idle), with its outcome logged:
 * a failure that needs an operator as an error.  *bad: 'pg' must not go
 * back to its pool.  Returns the branch status. */
int rm__commit_marked(rm_at_resource_t *r, PGconn *pg, const char *xid, int64_t bid, bool *bad, int *code,
                         char *err, size_t errlen) {
  rm_phase2_req_t req = {.commit = true, .xid = xid, .branch_id = bid, .resource_id = r->id,
                         .branch_type = TXP_BT_AT};
  rm_undo_ctx_t u = {.r = r, .req = &req, .io = {.pg = pg, .err = err, .errlen = errlen}};
  int status = commit_apply_on(&u, code);
  *bad = *bad || u.io.bad;
  if (status == TXP_BS_PHASE2_COMMIT_FAILED_UNRETRYABLE)
    rm__log(r->st->c, RM_LOG_ERROR, "commit of branch %lld of \"%s\" on \"%s\" failed for good: %s",
            (long long)bid, xid, r->id, err);
  else if (status != TXP_BS_PHASE2_COMMITTED)
    rm__log(r->st->c, RM_LOG_WARN,
            "could not commit branch %lld of \"%s\" on \"%s\" (its commit deltas): %s; will retry", (long long)bid,
            xid, r->id, err);
  return status;
}

/* -------------------------------------------------------------- entry */

/* Index of (xid, bid) among r's remembered branches, or -1; st->mu held. */
static long inline_find(const rm_at_resource_t *r, const char *xid, int64_t bid) {
  for (size_t i = 0; i < r->ninl; i++)
    if (r->inl[i].branch_id == bid && strcmp(r->inl[i].xid, xid) == 0) return (long)i;
  return -1;
}

void rm__at_inline_add(rm_at_resource_t *r, const char *xid, int64_t bid) {
  rm_at_state_t *st = r->st;
  if (strlen(xid) > TXP_MAX_XID_LEN) return;
  int64_t now = rm__undo_now_ms();
  pthread_mutex_lock(&st->mu);
  if (!r->inl) r->inl = calloc(RM_AT_INLINE_MAX, sizeof(*r->inl));
  if (r->inl && r->ninl == RM_AT_INLINE_MAX) { /* full: forget the stale ones */
    size_t w = 0;
    for (size_t i = 0; i < r->ninl; i++)
      if (now - r->inl[i].added_ms < INLINE_STALE_MS) r->inl[w++] = r->inl[i];
    r->ninl = w;
  }
  if (r->inl && r->ninl < RM_AT_INLINE_MAX && inline_find(r, xid, bid) < 0) {
    struct rm_inline_key *k = &r->inl[r->ninl++];
    snprintf(k->xid, sizeof(k->xid), "%s", xid);
    k->branch_id = bid;
    k->added_ms = now;
  }
  pthread_mutex_unlock(&st->mu);
}

/* Forget (xid, bid); st->mu held.  Whether it was remembered. */
static bool inline_take_locked(rm_at_resource_t *r, const char *xid, int64_t bid) {
  long i = inline_find(r, xid, bid);
  if (i < 0) return false;
  r->inl[i] = r->inl[--r->ninl];
  return true;
}

void rm__at_inline_remove(rm_at_resource_t *r, const char *xid, int64_t bid) {
  pthread_mutex_lock(&r->st->mu);
  inline_take_locked(r, xid, bid);
  pthread_mutex_unlock(&r->st->mu);
}

/* Queue the undo row of committed branch (xid, bid) for the deleter.
 * False when the queue is full (or out of memory): delete it inline; and
 * when this client remembers the branch for an inline commit (its commit
 * deltas are applied at once, by rm__at_phase2). */
bool rm__commit_enqueue(rm_at_resource_t *r, const char *xid, int64_t bid) {
  rm_at_state_t *st = r->st;
  pthread_mutex_lock(&st->mu);
  bool remembered = r->ninl > 0 && inline_find(r, xid, bid) >= 0;
  pthread_mutex_unlock(&st->mu);
  if (remembered) return false;
  char *x = strdup(xid);
  if (!x) return false;
  pthread_mutex_lock(&st->mu);
  bool queued = queue_push(r, st->tune.queue_max, x, bid);
  if (queued && r->qlen >= st->tune.delete_batch) {
    st->kick = true;
    pthread_cond_broadcast(&st->cv);
  }
  pthread_mutex_unlock(&st->mu);
  if (!queued) free(x);
  return queued;
}

int rm__commit_phase2(rm_at_resource_t *r, const rm_phase2_req_t *req, int *code, char *errmsg, size_t errlen) {
  rm_client_t *c = r->st->c;
  int ok = TXP_BS_PHASE2_COMMITTED, retry = TXP_BS_PHASE2_COMMIT_FAILED_RETRYABLE;
  pthread_mutex_lock(&r->st->mu);
  bool remembered = r->ninl > 0 && inline_take_locked(r, req->xid, req->branch_id);
  pthread_mutex_unlock(&r->st->mu);
  if (remembered) {
    /* Commit deltas: apply them now and answer with the outcome. */
    rm_undo_ctx_t u = {.r = r, .req = req, .io = {.err = errmsg, .errlen = errlen}};
    if (rm__undo_pool_get(r, &u.io.pg, errmsg, errlen) != 0) {
      rm__at_inline_add(r, req->xid, req->branch_id); /* the TC retries the commit */
      *code = RM_E_DB;
      return retry;
    }
    int status = commit_apply_on(&u, code);
    rm__undo_pool_put(r, u.io.pg, u.io.bad);
    if (status == TXP_BS_PHASE2_COMMIT_FAILED_RETRYABLE) rm__at_inline_add(r, req->xid, req->branch_id);
    if (status == TXP_BS_PHASE2_COMMIT_FAILED_UNRETRYABLE)
      rm__log(c, RM_LOG_ERROR, "commit of branch %lld of \"%s\" on \"%s\" failed for good: %s",
              (long long)req->branch_id, req->xid, r->id, errmsg);
    return status;
  }
  if (!rm__commit_enqueue(r, req->xid, req->branch_id)) {
    /* Queue full: commit inline.  The answer is Committed either way:
     * the decision is made; a row left behind is resolved later (a
     * marked one applied by the leftover pass, a plain one deleted). */
    char err[1024] = "";
    char xid[TXP_MAX_XID_LEN + 1]; /* length checked above */
    snprintf(xid, sizeof(xid), "%s", req->xid);
    rm_undo_key_t k = {xid, req->branch_id};
    int rc = rm__commit_finish(r, &k, 1, err, sizeof(err));
    if (rc != 0)
      rm__log(c, RM_LOG_WARN, "could not delete the undo row of committed branch %lld of \"%s\": %s",
              (long long)req->branch_id, req->xid, err[0] ? err : rm_strerror(rc));
  }
  return ok;
}
