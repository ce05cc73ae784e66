/*
 * rm_rollback.c - phase-two rollback of AT branches (rm_undo.c NOTES):
 * the checked replay of a branch's undo row, item by item, in one local
 * transaction on a pooled connection.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rm_undo_int.h"

static int undo_delta(rm_undo_ctx_t *u, const rm_table_t *t, const rm_item_t *it) {
  int ci = rm__undo_col_of(t, it->col);
  if (ci < 0) {
    snprintf(u->io.err, u->io.errlen, "column \"%s\" of \"%s\".\"%s\" no longer exists: cannot undo a delta",
             it->col, it->schema, it->table);
    return RM_UNDO_FATAL;
  }
  txp_buf_t sql;
  txp_buf_init(&sql, 0);
  int rc = txp_buf_append_str(&sql, "UPDATE ");
  if (!rc) rc = txp_buf_append_str(&sql, t->qname);
  if (!rc) rc = txp_buf_append_str(&sql, " SET ");
  if (!rc) rc = txp_buf_append_str(&sql, t->cols[ci].qname);
  if (!rc) rc = txp_buf_append_str(&sql, " = ");
  if (!rc) rc = txp_buf_append_str(&sql, t->cols[ci].qname);
  if (!rc) rc = txp_buf_append_str(&sql, " - $1");
  if (!rc) rc = rm__undo_where_pk(u->io.pg, &sql, it->pk, 2);
  if (!rc) rc = txp_buf_append_str(&sql, " RETURNING 1");
  const char **params = calloc((size_t)it->pk->n + 1, sizeof(char *));
  Oid *types = calloc((size_t)it->pk->n + 1, sizeof(Oid));
  if (rc || !params || !types) {
    txp_buf_free(&sql);
    free(params);
    free(types);
    snprintf(u->io.err, u->io.errlen, "out of memory");
    return RM_UNDO_DB;
  }
  char d[32];
  snprintf(d, sizeof(d), "%lld", it->delta);
  params[0] = d;
  types[0] = INT8OID;
  for (int k = 0; k < it->pk->n; k++) params[k + 1] = it->pk->vals[k];
  PGresult *res = rm__pg_io_exec(&u->io, "could not undo a delta",
                                 sql.data, it->pk->n + 1, params, types, PGRES_TUPLES_OK);
  txp_buf_free(&sql);
  free(params);
  free(types);
  if (!res) return RM_UNDO_DB;
  int n = PQntuples(res);
  PQclear(res);
  if (n == 0) {
    rm_dirty_message(u->io.err, u->io.errlen, it, "after", NULL, NULL, NULL, 0);
    return RM_UNDO_DIRTY;
  }
  return RM_UNDO_OK;
}

/* SELECT digest, * ... FOR UPDATE: the current row and its digest (RM_AT_ROW_DIGEST),
 * or *cur = NULL if absent. */
static int lock_current(rm_undo_ctx_t *u, const rm_table_t *t, const rm_item_t *it, rm_row_t **cur,
                        char **digest) {
  *cur = NULL;
  *digest = NULL;
  txp_buf_t sql;
  txp_buf_init(&sql, 0);
  int rc = txp_buf_append_str(&sql, "SELECT " RM_AT_ROW_DIGEST(RM_AT_ROW_ALIAS) ", " RM_AT_ROW_ALIAS ".* FROM ");
  if (!rc) rc = txp_buf_append_str(&sql, t->qname);
  if (!rc) rc = txp_buf_append_str(&sql, " AS " RM_AT_ROW_ALIAS);
  if (!rc) rc = rm__undo_where_pk(u->io.pg, &sql, it->pk, 1);
  if (!rc) rc = txp_buf_append_str(&sql, " FOR UPDATE");
  if (rc) {
    txp_buf_free(&sql);
    snprintf(u->io.err, u->io.errlen, "out of memory");
    return RM_UNDO_DB;
  }
  PGresult *res = rm__pg_io_exec(&u->io, "could not lock the row to undo", sql.data, it->pk->n,
                                 (const char *const *)it->pk->vals, NULL, PGRES_TUPLES_OK);
  txp_buf_free(&sql);
  if (!res) return RM_UNDO_DB;
  int n = PQntuples(res);
  if (n > 1) {
    PQclear(res);
    snprintf(u->io.err, u->io.errlen, "the key of \"%s\".\"%s\" matches %d rows", it->schema, it->table, n);
    return RM_UNDO_FATAL;
  }
  if (n == 1 && (!(*cur = rm__row_from_fields(res, 0, 1)) || !(*digest = strdup(PQgetvalue(res, 0, 0))))) {
    PQclear(res);
    rm_row_free(*cur);
    *cur = NULL;
    snprintf(u->io.err, u->io.errlen, "out of memory");
    return RM_UNDO_DB;
  }
  PQclear(res);
  return RM_UNDO_OK;
}

/* Run a write built in 'sql' with 'params'; expects one row touched. */
static int undo_write(rm_undo_ctx_t *u, const char *what, txp_buf_t *sql, int n, const char *const *params) {
  PGresult *res = rm__pg_io_exec(&u->io, what, sql->data, n, params, NULL, PGRES_COMMAND_OK);
  if (!res) return RM_UNDO_DB;
  char tuples[32];
  snprintf(tuples, sizeof(tuples), "%s", PQcmdTuples(res));
  PQclear(res);
  if (strcmp(tuples, "1") != 0) {
    snprintf(u->io.err, u->io.errlen, "%s: the statement touched %s rows, not one", what, tuples);
    return RM_UNDO_DB;
  }
  return RM_UNDO_OK;
}

/* UPDATE t SET (changed columns) = before WHERE pk. */
static int restore_update(rm_undo_ctx_t *u, const rm_table_t *t, const rm_item_t *it) {
  txp_buf_t sql;
  txp_buf_init(&sql, 0);
  int n = 0, rc = txp_buf_append_str(&sql, "UPDATE ");
  const char **params = calloc((size_t)it->before->n + (size_t)it->pk->n, sizeof(char *));
  if (!rc) rc = params ? txp_buf_append_str(&sql, t->qname) : RM_E_NOMEM;
  for (int i = 0; !rc && i < it->before->n; i++) {
    const char *name = it->before->names[i];
    int ai = rm_row_find(it->after, name), ci = rm__undo_col_of(t, name);
    if (ci < 0 || t->cols[ci].generated || rm_row_find(it->pk, name) >= 0) continue;
    if (ai >= 0 && rm_val_eq(it->after->vals[ai], it->before->vals[i])) continue;
    char num[32];
    snprintf(num, sizeof(num), " = $%d", n + 1);
    rc = txp_buf_append_str(&sql, n ? ", " : " SET ");
    if (!rc) rc = txp_buf_append_str(&sql, t->cols[ci].qname);
    if (!rc) rc = txp_buf_append_str(&sql, num);
    params[n++] = it->before->vals[i];
  }
  if (!rc && n == 0) { /* nothing changed: nothing to restore */
    txp_buf_free(&sql);
    free(params);
    return RM_UNDO_OK;
  }
  if (!rc) rc = rm__undo_where_pk(u->io.pg, &sql, it->pk, n + 1);
  for (int k = 0; !rc && k < it->pk->n; k++) params[n + k] = it->pk->vals[k];
  if (rc) {
    txp_buf_free(&sql);
    free(params);
    snprintf(u->io.err, u->io.errlen, "out of memory");
    return RM_UNDO_DB;
  }
  rc = undo_write(u, "could not restore the before image", &sql, n + it->pk->n, params);
  txp_buf_free(&sql);
  free(params);
  return rc;
}

/* INSERT the before image of a deleted row (generated columns excluded). */
static int restore_delete(rm_undo_ctx_t *u, const rm_table_t *t, const rm_item_t *it) {
  txp_buf_t sql, vals;
  txp_buf_init(&sql, 0);
  txp_buf_init(&vals, 0);
  const char **params = calloc((size_t)it->before->n + 1, sizeof(char *));
  int n = 0, rc = params ? txp_buf_append_str(&sql, "INSERT INTO ") : RM_E_NOMEM;
  bool overriding = false;
  if (!rc) rc = txp_buf_append_str(&sql, t->qname);
  for (int i = 0; !rc && i < it->before->n; i++) {
    int ci = rm__undo_col_of(t, it->before->names[i]);
    if (ci < 0 || t->cols[ci].generated) continue;
    if (t->cols[ci].identity == 'a') overriding = true;
    char num[32];
    snprintf(num, sizeof(num), "%s$%d", n ? ", " : "", n + 1);
    rc = txp_buf_append_str(&sql, n ? ", " : " (");
    if (!rc) rc = txp_buf_append_str(&sql, t->cols[ci].qname);
    if (!rc) rc = txp_buf_append_str(&vals, num);
    params[n++] = it->before->vals[i];
  }
  if (!rc) rc = txp_buf_append_str(&sql, n ? ")" : " DEFAULT VALUES");
  if (!rc && overriding) rc = txp_buf_append_str(&sql, " OVERRIDING SYSTEM VALUE");
  if (!rc && n) {
    rc = txp_buf_append_str(&sql, " VALUES (");
    if (!rc) rc = txp_buf_append(&sql, vals.data, vals.len);
    if (!rc) rc = txp_buf_append_str(&sql, ")");
  }
  if (rc) {
    snprintf(u->io.err, u->io.errlen, "out of memory");
    rc = RM_UNDO_DB;
  } else {
    rc = undo_write(u, "could not re-insert the deleted row", &sql, n, params);
  }
  txp_buf_free(&sql);
  txp_buf_free(&vals);
  free(params);
  return rc;
}

static int undo_insert_delete_row(rm_undo_ctx_t *u, const rm_table_t *t, const rm_item_t *it) {
  txp_buf_t sql;
  txp_buf_init(&sql, 0);
  int rc = txp_buf_append_str(&sql, "DELETE FROM ");
  if (!rc) rc = txp_buf_append_str(&sql, t->qname);
  if (!rc) rc = rm__undo_where_pk(u->io.pg, &sql, it->pk, 1);
  if (rc) {
    txp_buf_free(&sql);
    snprintf(u->io.err, u->io.errlen, "out of memory");
    return RM_UNDO_DB;
  }
  rc = undo_write(u, "could not delete the inserted row", &sql, it->pk->n, (const char *const *)it->pk->vals);
  txp_buf_free(&sql);
  return rc;
}

/* Dirty: describe how 'cur' differs from 'expect'. */
static int dirty(rm_undo_ctx_t *u, const rm_item_t *it, const char *expect_name, const rm_row_t *expect,
                 const rm_row_t *cur) {
  int diff[64];
  int nd = expect && cur ? rm_row_diff(expect, cur, diff, 64) : 0;
  rm_dirty_message(u->io.err, u->io.errlen, it, expect_name, expect, cur, diff, nd < 64 ? nd : 64);
  return RM_UNDO_DIRTY;
}

static int undo_item(rm_undo_ctx_t *u, const rm_item_t *it) {
  if (it->op == RM_OP_COMMIT_DELTA) return RM_UNDO_OK; /* never applied: nothing to undo */
  const rm_table_t *t = NULL;
  int rc = rm__undo_item_table(u, it, &t);
  if (rc != RM_UNDO_OK) return rc;
  if (it->op == RM_OP_DELTA) return undo_delta(u, t, it);

  rm_row_t *cur = NULL;
  char *digest = NULL;
  if ((rc = lock_current(u, t, it, &cur, &digest)) != RM_UNDO_OK) return rc;
  switch (it->op) {
  case RM_OP_INSERT:
    if (!cur) rc = RM_UNDO_OK; /* already gone */
    else if (it->digest ? rm_digest_matches(it->digest, digest) : rm_row_diff(it->after, cur, NULL, 0) == 0)
      rc = undo_insert_delete_row(u, t, it);
    else rc = dirty(u, it, "after", it->after, cur);
    break;
  case RM_OP_UPDATE:
    if (!cur) rc = dirty(u, it, "after", it->after, NULL);
    else if (rm_row_diff(it->after, cur, NULL, 0) == 0) rc = restore_update(u, t, it);
    else if (rm_row_diff(it->before, cur, NULL, 0) == 0) rc = RM_UNDO_OK; /* already undone */
    else rc = dirty(u, it, "after", it->after, cur);
    break;
  case RM_OP_DELETE:
    if (!cur) rc = restore_delete(u, t, it);
    else if (rm_row_diff(it->before, cur, NULL, 0) == 0) rc = RM_UNDO_OK; /* already restored */
    else rc = dirty(u, it, "before", it->before, cur);
    break;
  default:
    snprintf(u->io.err, u->io.errlen, "unknown undo op");
    rc = RM_UNDO_FATAL;
  }
  rm_row_free(cur);
  free(digest);
  return rc;
}

/* The whole rollback on 'u->io.pg'; returns a branch status, sets *code. */
static int rollback_on(rm_undo_ctx_t *u, int *code) {
  const rm_phase2_req_t *req = u->req;
  rm_client_t *c = u->r->st->c;
  rm_undo_txn_t t;
  if (!rm__undo_txn_begin(u, &t, false, code)) goto out;
  for (int attempt = 0; attempt < 3 && !t.row; attempt++) {
    t.row = rm__pg_io_exec(&u->io, "could not read the undo log",
                           "SELECT branch_id, log_status, context, rollback_info::text FROM undo_log"
                           " WHERE xid = $1 AND branch_id = $2 FOR UPDATE",
                           2, t.key, NULL, PGRES_TUPLES_OK);
    if (!t.row) goto out;
    if (PQntuples(t.row) == 1) break;
    PQclear(t.row);
    t.row = NULL;
    /* 1. No undo row: fence the branch with the guard. */
    PGresult *res = rm__pg_io_exec(&u->io, "could not write the guard row",
                                   "INSERT INTO undo_log (xid, branch_id, context, rollback_info, log_status)"
                                   " VALUES ($1, $2, 'guard', NULL, 1) ON CONFLICT (xid, branch_id) DO NOTHING"
                                   " RETURNING branch_id",
                                   2, t.key, NULL, PGRES_TUPLES_OK);
    if (!res) goto out;
    bool inserted = PQntuples(res) == 1;
    PQclear(res);
    if (inserted) {
      if (!rm__undo_txn_commit(u, &t, "could not commit the guard row", code)) goto out;
      rm__log(c, RM_LOG_INFO,
              "rollback of branch %s of \"%s\" on \"%s\": no undo row (never committed locally); "
              "guard written",
              t.bid, req->xid, u->r->id);
      return TXP_BS_PHASE2_ROLLBACKED; /* committed: nothing to end */
    }
    /* Conflict: the branch's local commit landed meanwhile; read again. */
  }
  if (!t.row) {
    snprintf(u->io.err, u->io.errlen, "the undo row of branch %s of \"%s\" keeps appearing and vanishing", t.bid,
             req->xid);
    goto out;
  }
  if (strcmp(PQgetvalue(t.row, 0, 1), "0") != 0) {
    /* A guard (this branch was already rolled back, or fenced): done. */
    *code = 0;
    t.status = TXP_BS_PHASE2_ROLLBACKED;
    goto out;
  }

  /* 2. Settings, then 3. the items backwards. */
  if (!rm__undo_txn_load(u, &t, code)) goto out;
  for (size_t i = t.nitems; i-- > 0;) {
    int rc = undo_item(u, &t.items[i]);
    if (rc == RM_UNDO_OK) continue;
    t.status = rm__undo_item_failure(u, rc, false, code);
    goto out;
  }

  /* 4. The undo row goes; commit. */
  PGresult *res = rm__pg_io_exec(&u->io, "could not delete the undo row",
                                 "DELETE FROM undo_log WHERE xid = $1 AND branch_id = $2", 2, t.key, NULL,
                                 PGRES_COMMAND_OK);
  if (!res) goto out;
  PQclear(res);
  if (!rm__undo_txn_commit(u, &t, "could not commit the rollback", code)) goto out;
  rm__log(c, RM_LOG_DEBUG, "rolled back branch %s of \"%s\" on \"%s\" (%zu item(s))", t.bid, req->xid,
          u->r->id, t.nitems);

out:
  return rm__undo_txn_end(u, &t);
}


int rm__rollback_phase2(rm_at_resource_t *r, const rm_phase2_req_t *req, int *code, char *errmsg, size_t errlen) {
  rm_client_t *c = r->st->c;
  int retry = TXP_BS_PHASE2_ROLLBACK_FAILED_RETRYABLE;
  rm__at_inline_remove(r, req->xid, req->branch_id); /* no commit will come */
  rm_undo_ctx_t u = {.r = r, .req = req, .io = {.err = errmsg, .errlen = errlen}};
  int rc = rm__undo_pool_get(r, &u.io.pg, errmsg, errlen);
  if (rc != 0) {
    *code = RM_E_DB;
    return retry;
  }
  int status = rollback_on(&u, code);
  rm__undo_pool_put(r, u.io.pg, u.io.bad);
  /* Retryable failures are logged by the core with its answer; one that
   * needs an operator (a dirty write) is an error in its own right. */
  if (status == TXP_BS_PHASE2_ROLLBACK_FAILED_UNRETRYABLE)
    rm__log(c, RM_LOG_ERROR, "rollback of branch %lld of \"%s\" on \"%s\" failed for good: %s",
            (long long)req->branch_id, req->xid, r->id, errmsg);
  return status;
}
