/*
 * rm_at_stmt.c - the statements of an AT branch on the caller's connection
 * (rm_at_insert, _update, _update_add, _delete, _update_delta,
 * _update_delta_deferred, _update_delta_on_commit), each in the frame of rm_at_frame.c; and the
 * deferred delta UPDATEs, which rm_at_prepare runs.
 *
 * NOTES
 *   What each statement runs, inside its savepoint (the first one of a
 *   branch also reads the session settings that shape the text of the
 *   images: TimeZone, DateStyle, ...):
 *     insert: INSERT ... RETURNING digest, pk        (the row's digest)
 *     update: SELECT * ... FOR UPDATE                (before image)
 *             UPDATE ... RETURNING *                 (after image)
 *     delete: SELECT * ... FOR UPDATE                (before image)
 *             DELETE
 *     add:    SELECT * ... FOR UPDATE                (before image)
 *             UPDATE SET col = col + $1 WHERE pk AND (guard) RETURNING *
 *                                                    (after image; an update)
 *     delta:  UPDATE SET col = col + $1 WHERE pk AND (guard)
 *     deferred delta: SELECT 1 ... WHERE pk (the row exists; no lock),
 *             the UPDATE is kept for prepare
 *     delta on commit: SELECT 1 ... WHERE pk (the row exists; no lock),
 *             the UPDATE is run by phase-two commit (rm_undo.c)
 *   Each adds an undo item and (except the deltas) the lock key "table:pk".
 *
 *   Which deltas may run in phase one.  A phase-one delta commits locally
 *   at once and becomes visible to everyone; a rollback undoes it with the
 *   opposite delta.  That opposite must always fit, whatever others did in
 *   between, or the global transaction cannot be rolled back at all.  For
 *   a counter of things taken (frozen, sold, used) that holds for an
 *   increment: its guard checked the bound when it took, and its undo
 *   (col - n) only gives back what this branch itself took, which is still
 *   counted.  It does not hold for a decrement: the capacity it gives back
 *   is free for others the moment the branch commits locally, and once they
 *   took it the undo (col + n) is refused by the bound (a CHECK, or worse,
 *   nothing: an oversell).  So a phase-one delta must be >= 0, and a delta
 *   that gives back goes through rm_at_update_delta_on_commit: phase one
 *   only records it (the capacity stays taken, so nobody can take it while
 *   the global transaction is undecided), phase-two commit applies it (a
 *   give-back always fits), rollback drops it (nothing to undo).  A counter
 *   whose decrement takes (a balance) is counted the other way round (what
 *   was spent) to fit this rule.  The plain-SQL AT mode to come
 *   (statements parsed from the services' own SQL) must apply the same
 *   rule to "col = col - $1": refuse it in phase one, or record it for the
 *   commit.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rm_at_int.h"
#include "txp_lockkey.h"

/* ------------------------------------------------------------- helpers */

/* Check 'pk_vals' (t->npk of them, none NULL). */
static int check_pk_vals(rm_branch_t *b, const rm_table_t *t, const char *const *pk_vals) {
  if (!pk_vals) {
    rm__at_err(b, "primary key values are NULL");
    return RM_E_INVALID;
  }
  for (int k = 0; k < t->npk; k++) {
    if (!pk_vals[k]) {
      rm__at_err(b, "primary key column \"%s\" of \"%s\" has a NULL value", t->cols[t->pk[k]].name, t->name);
      return RM_E_INVALID;
    }
  }
  return 0;
}

/* Append " WHERE pk1 = $first AND pk2 = $first+1 ..." to 'sql'. */
static int append_where_pk(txp_buf_t *sql, const rm_table_t *t, int first) {
  int rc = 0;
  for (int k = 0; !rc && k < t->npk; k++) {
    char num[32];
    snprintf(num, sizeof(num), " = $%d", first + k);
    rc = txp_buf_append_str(sql, k ? " AND " : " WHERE ");
    if (!rc) rc = txp_buf_append_str(sql, t->cols[t->pk[k]].qname);
    if (!rc) rc = txp_buf_append_str(sql, num);
  }
  return rc;
}

/* Append "<head><table> WHERE pk1 = $1 AND ...<tail>" ('tail' may be
 * NULL): a statement on one row, by its key. */
static int pk_stmt_sql(txp_buf_t *sql, const char *head, const rm_table_t *t, const char *tail) {
  int rc = txp_buf_append_str(sql, head);
  if (!rc) rc = txp_buf_append_str(sql, t->qname);
  if (!rc) rc = append_where_pk(sql, t, 1);
  if (!rc && tail) rc = txp_buf_append_str(sql, tail);
  return rc;
}

/* The pk of 'row' (by the table's key columns); NULL if a column is
 * missing or on allocation failure. */
rm_row_t *rm__at_pk_from_row(const rm_table_t *t, const rm_row_t *row) {
  rm_row_t *pk = rm_row_new(t->npk);
  if (!pk) return NULL;
  for (int k = 0; k < t->npk; k++) {
    const char *name = t->cols[t->pk[k]].name;
    int i = rm_row_find(row, name);
    if (i < 0 || !row->vals[i] || rm_row_set(pk, k, name, row->vals[i]) != 0) {
      rm_row_free(pk);
      return NULL;
    }
  }
  return pk;
}

static rm_row_t *pk_from_vals(const rm_table_t *t, const char *const *vals) {
  rm_row_t *pk = rm_row_new(t->npk);
  if (!pk) return NULL;
  for (int k = 0; k < t->npk; k++) {
    if (rm_row_set(pk, k, t->cols[t->pk[k]].name, vals[k]) != 0) {
      rm_row_free(pk);
      return NULL;
    }
  }
  return pk;
}

/* Check that the lock key of 'pk' would be accepted, before running the
 * statement (for update/delete, whose key is known up front). */
int rm__at_check_lock_key(rm_branch_t *b, const rm_table_t *t, const char *const *pk_vals) {
  txp_buf_t tmp;
  txp_buf_init(&tmp, TXP_MAX_LOCK_KEYS_LEN);
  int rc = rm_lockkeys_add(&tmp, b->res->id, t->lockname, pk_vals, t->npk);
  txp_buf_free(&tmp);
  if (rc == RM_E_INVALID)
    rm__at_err(b, "the primary key of \"%s\" is too long or the table name unusable for a lock key "
               "(row keys are at most %d bytes)", t->name, TXP_MAX_ROW_KEY_LEN);
  return rc;
}

int rm__at_item_init(rm_item_t *it, rm_op_t op, const rm_table_t *t) {
  memset(it, 0, sizeof(*it));
  it->op = op;
  it->schema = strdup(t->schema);
  it->table = strdup(t->name);
  return it->schema && it->table ? 0 : RM_E_NOMEM;
}

/* Out of memory: the code, with the message set. */
int rm__at_oom(rm_branch_t *b) {
  rm__at_err(b, "out of memory");
  return RM_E_NOMEM;
}

/* 'res' holds exactly one row: 0, else RM_E_NOT_ONE_ROW. */
static int one_row(rm_branch_t *b, const rm_table_t *t, const PGresult *res) {
  if (PQntuples(res) == 1) return 0;
  rm__at_err(b, "%s row of \"%s\" has the given primary key", PQntuples(res) == 0 ? "no" : "more than one",
             t->name);
  return RM_E_NOT_ONE_ROW;
}

bool rm__at_is_pk_col(const rm_table_t *t, int ci) {
  for (int k = 0; k < t->npk; k++)
    if (t->pk[k] == ci) return true;
  return false;
}

/* ------------------------------------------------------------ statements */

static bool arg_ok(rm_branch_t *b, bool ok, const char *what) {
  if (!ok && b) rm__at_err(b, "invalid argument: %s", what);
  return ok;
}

/* Start a statement (rm__at_stmt_begin) whose arguments are 'ok' ('what'
 * names them in the message when not) and whose 'n' column names 'cols'
 * are all set. */
static int stmt_start(rm_branch_t *b, bool ok, const char *what, int n, const char *const *cols) {
  if (!arg_ok(b, ok, what)) return RM_E_INVALID;
  for (int i = 0; i < n; i++)
    if (!arg_ok(b, cols[i] != NULL, "a column name is NULL")) return RM_E_INVALID;
  return rm__at_stmt_begin(b);
}

/* The end of a statement started by stmt_start: free its item, result and
 * SQL, then rm__at_stmt_end. */
static int stmt_finish(rm_branch_t *b, int rc, rm_item_t *it, PGresult *res, txp_buf_t *sql) {
  rm_item_clear(it);
  PQclear(res);
  txp_buf_free(sql);
  return rm__at_stmt_end(b, rc);
}

/* Whether recording an insert's row could fail after the statement ran,
 * for what its input shows: a long key (lock key limits, and the undo,
 * which keeps the key and the row's digest), with room to spare for
 * escaping and for the columns it does not set.  Such an insert keeps its
 * savepoint until its undo item is recorded (rm__at_run_released, NOTES of rm_at_frame.c). */
static bool insert_may_fail_late(const rm_branch_t *b, const rm_table_t *t, int ncols, const char *const *cols,
                                 const char *const *vals) {
  size_t in = 0, key = strlen(b->res->id) + strlen(t->lockname) + 16;
  for (int i = 0; i < ncols; i++) {
    if (!rm__at_is_pk_col(t, rm__col_index(t, cols[i]))) continue; /* the undo keeps the key and a digest */
    size_t n = vals[i] ? strlen(vals[i]) : 0;
    in += 2 * n + 64;
    key += 2 * n + 1;
  }
  return key > TXP_MAX_ROW_KEY_LEN / 2 || b->lock_keys.len + key > TXP_MAX_LOCK_KEYS_LEN / 2 ||
         b->undo_bytes + in + 64 * 1024 > RM_AT_MAX_UNDO_BYTES;
}

/* The insert of one row as rm_at_insert runs it: INSERT INTO t AS
 * RM_AT_ROW_ALIAS (cols) VALUES ($1..) RETURNING the row's digest, then
 * its key columns.  0, or -1 out of memory. */
static int insert_sql(txp_buf_t *sql, const rm_table_t *t, int ncols, const char *const *cols) {
  int rc = txp_buf_append_str(sql, "INSERT INTO ");
  if (!rc) rc = txp_buf_append_str(sql, t->qname);
  if (!rc) rc = txp_buf_append_str(sql, " AS " RM_AT_ROW_ALIAS);
  if (ncols == 0) {
    if (!rc) rc = txp_buf_append_str(sql, " DEFAULT VALUES");
  } else {
    for (int i = 0; !rc && i < ncols; i++) {
      rc = txp_buf_append_str(sql, i ? ", " : " (");
      if (!rc) rc = txp_buf_append_str(sql, t->cols[rm__col_index(t, cols[i])].qname);
    }
    for (int i = 0; !rc && i < ncols; i++) {
      char num[32];
      snprintf(num, sizeof(num), "%s$%d", i ? ", " : ") VALUES (", i + 1);
      rc = txp_buf_append_str(sql, num);
    }
    if (!rc) rc = txp_buf_append_str(sql, ")");
  }
  /* The undo keeps the key and the row's digest, not the row. */
  if (!rc) rc = txp_buf_append_str(sql, " RETURNING " RM_AT_ROW_DIGEST(RM_AT_ROW_ALIAS));
  for (int k = 0; !rc && k < t->npk; k++) {
    rc = txp_buf_append_str(sql, ", " RM_AT_ROW_ALIAS ".");
    if (!rc) rc = txp_buf_append_str(sql, t->cols[t->pk[k]].qname);
  }
  return rc ? -1 : 0;
}

static int insert_row(rm_branch_t *b, const char *table, int ncols, const char *const *cols,
                      const char *const *vals, bool lock) {
  if (!b) return RM_E_INVALID;
  int rc = stmt_start(b, table && ncols >= 0 && ncols <= 1600 && (ncols == 0 || (cols && vals)),
                      "table, columns or values", ncols, cols);
  if (rc != 0) return rc;
  const rm_table_t *t = NULL;
  txp_buf_t sql;
  txp_buf_init(&sql, 0);
  PGresult *res = NULL;
  rm_item_t it = {0};
  if ((rc = rm__at_stmt_table(b, table, ncols, cols, &t)) != 0) goto out;
  if (insert_sql(&sql, t, ncols, cols) != 0) {
    rc = rm__at_oom(b);
    goto out;
  }
  /* An insert either fails or makes its one row: released at once,
   * unless recording it could still fail. */
  res = insert_may_fail_late(b, t, ncols, cols, vals)
            ? rm__at_run(b, "could not insert", sql.data, ncols, vals, NULL, PGRES_TUPLES_OK, &rc)
            : rm__at_run_released(b, "could not insert", sql.data, ncols, vals, NULL, PGRES_TUPLES_OK, &rc);
  if (!res) goto out;
  if (PQntuples(res) != 1) {
    rm__at_err(b, "insert into \"%s\" returned %d rows, not one", t->name, PQntuples(res));
    rc = RM_E_NOT_ONE_ROW;
    goto out;
  }
  rm_row_t *key = NULL;
  if (rm__at_item_init(&it, RM_OP_INSERT, t) != 0 || !(key = rm__row_from_fields(res, 0, 1)) ||
      (!PQgetisnull(res, 0, 0) && !(it.digest = strdup(PQgetvalue(res, 0, 0))))) {
    rm_row_free(key);
    rc = rm__at_oom(b);
    goto out;
  }
  it.pk = rm__at_pk_from_row(t, key);
  rm_row_free(key);
  if (!it.pk || !it.digest) {
    rm__at_err(b, "the inserted row of \"%s\" has no primary key value", t->name);
    rc = RM_E_INVALID;
    goto out;
  }
  rc = rm__at_record(b, t, &it, lock);
out:
  return stmt_finish(b, rc, &it, res, &sql);
}

int rm_at_insert(rm_branch_t *b, const char *table, int ncols, const char *const *cols,
                 const char *const *vals) {
  return insert_row(b, table, ncols, cols, vals, true);
}

int rm_at_insert_unlocked(rm_branch_t *b, const char *table, int ncols, const char *const *cols,
                          const char *const *vals) {
  return insert_row(b, table, ncols, cols, vals, false);
}

void rm__at_deferred_insert_free(rm_deferred_insert_t *d) {
  if (!d) return;
  for (int i = 0; d->cols && i < d->ncols; i++) free(d->cols[i]);
  for (int i = 0; d->vals && i < d->nparams; i++) free(d->vals[i]);
  free(d->cols);
  free(d->vals);
  free(d->types);
  for (int k = 0; d->pk_names && k < d->npk; k++) free(d->pk_names[k]);
  free(d->pk_names);
  free(d->sql);
  free(d->table);
  free(d->insert_sql);
  free(d->item_table);
  free(d->item_schema);
  free(d);
}

char **rm__strs_dup(int n, const char *const *in) {
  char **out = calloc((size_t)(n > 0 ? n : 1), sizeof(char *));
  for (int i = 0; out && i < n; i++) {
    if (in[i] && !(out[i] = strdup(in[i]))) {
      for (int k = 0; k < i; k++) free(out[k]);
      free(out);
      out = NULL;
    }
  }
  return out;
}

rm_deferred_insert_t *rm__at_deferred_insert_new(const rm_table_t *t, char *insert_sql, int nparams,
                                                 const char *const *vals, const unsigned int *types) {
  rm_deferred_insert_t *d = insert_sql ? calloc(1, sizeof(*d)) : NULL;
  if (!d) {
    free(insert_sql);
    return NULL;
  }
  d->insert_sql = insert_sql;
  d->nparams = nparams;
  d->npk = t->npk;
  bool ok = (d->vals = rm__strs_dup(nparams, vals)) && (d->item_table = strdup(t->name)) &&
            (strcmp(t->schema, "public") == 0 || (d->item_schema = strdup(t->schema))) &&
            (d->pk_names = calloc((size_t)(t->npk > 0 ? t->npk : 1), sizeof(char *)));
  if (ok && types && nparams > 0 && (ok = (d->types = calloc((size_t)nparams, sizeof(unsigned int))) != NULL))
    memcpy(d->types, types, (size_t)nparams * sizeof(unsigned int));
  for (int k = 0; ok && k < t->npk; k++) ok = (d->pk_names[k] = strdup(t->cols[t->pk[k]].name)) != NULL;
  if (!ok) {
    if (!d->vals) d->nparams = 0;
    if (!d->pk_names) d->npk = 0;
    rm__at_deferred_insert_free(d);
    return NULL;
  }
  return d;
}

int rm_at_insert_deferred(rm_branch_t *b, const char *table, int ncols, const char *const *cols,
                          const char *const *vals) {
  if (!b) return RM_E_INVALID;
  int rc = stmt_start(b, table && ncols >= 0 && ncols <= 1600 && (ncols == 0 || (cols && vals)),
                      "table, columns or values", ncols, cols);
  if (rc != 0) return rc;
  const rm_table_t *t = NULL;
  if (b->dins) {
    rm__at_err(b, "the branch has a deferred insert already (one per branch)");
    rc = RM_E_INVALID;
  } else if ((rc = rm__at_stmt_table(b, table, ncols, cols, &t)) == 0) {
    txp_buf_t sql;
    txp_buf_init(&sql, 0);
    rm_deferred_insert_t *d = NULL;
    if (insert_sql(&sql, t, ncols, cols) != 0) txp_buf_free(&sql);
    else d = rm__at_deferred_insert_new(t, sql.data, ncols, vals, NULL); /* takes sql.data */
    if (d && (d->table = strdup(table)) && (d->cols = rm__strs_dup(ncols, cols))) {
      d->ncols = ncols;
      b->dins = d;
    } else {
      rm__at_deferred_insert_free(d);
      rc = rm__at_oom(b);
    }
  }
  return rm__at_stmt_end(b, rc);
}

int rm__at_insert_deferred_run(rm_branch_t *b, const rm_deferred_insert_t *d) {
  return insert_row(b, d->table, d->ncols, (const char *const *)d->cols, (const char *const *)d->vals, false);
}

/*
 * The item of an update or a delete ('op') of the row 'pk_vals', with the
 * before image: SELECT * FROM t WHERE pk FOR UPDATE (exactly one row).
 */
static int before_item(rm_branch_t *b, rm_op_t op, const rm_table_t *t, const char *const *pk_vals,
                       rm_item_t *it) {
  if (rm__at_item_init(it, op, t) != 0 || !(it->pk = pk_from_vals(t, pk_vals))) return rm__at_oom(b);
  txp_buf_t sql;
  txp_buf_init(&sql, 0);
  if (pk_stmt_sql(&sql, "SELECT * FROM ", t, " FOR UPDATE") != 0) {
    txp_buf_free(&sql);
    return rm__at_oom(b);
  }
  int rc = 0;
  PGresult *res = rm__at_run(b, "could not lock the row", sql.data, t->npk, pk_vals, NULL, PGRES_TUPLES_OK, &rc);
  txp_buf_free(&sql);
  if (!res) return rc;
  if ((rc = one_row(b, t, res)) == 0 && !(it->before = rm__row_from_result(res, 0))) rc = rm__at_oom(b);
  PQclear(res);
  return rc;
}

/*
 * Run 'sql', an UPDATE ... RETURNING * of the one row whose before image
 * 'it' holds (locked by before_item), and record the item with the after
 * image it returns; the result is left in *res for stmt_finish.  No row
 * back means the update's guard refused: 'guard_col' and 'amount' name
 * the change in the message (NULL: an update without a guard, where that
 * is the plain "touched 0 rows").
 */
static int update_locked_row(rm_branch_t *b, const rm_table_t *t, rm_item_t *it, const char *sql, int nparams,
                             const char *const *params, const char *guard_col, const char *amount, PGresult **res) {
  int rc = 0;
  if (!(*res = rm__at_run(b, "could not update", sql, nparams, params, NULL, PGRES_TUPLES_OK, &rc))) return rc;
  int n = PQntuples(*res);
  if (n == 0 && guard_col) {
    int vi = rm_row_find(it->before, guard_col);
    const char *was = vi >= 0 && it->before->vals[vi] ? it->before->vals[vi] : "NULL";
    rm__at_err(b, "the guard of the update of \"%s\".\"%s\" by %s refused (\"%s\" is %s)", t->name, guard_col,
               amount, guard_col, was);
    return RM_E_GUARD;
  }
  if (n != 1) {
    rm__at_err(b, "update of \"%s\" touched %d rows, not one", t->name, n);
    return RM_E_NOT_ONE_ROW;
  }
  if (!(it->after = rm__row_from_result(*res, 0))) return rm__at_oom(b);
  return rm__at_record(b, t, it, true);
}

int rm_at_update(rm_branch_t *b, const char *table, const char *const *pk_vals, int nset,
                 const char *const *set_cols, const char *const *set_vals) {
  if (!b) return RM_E_INVALID;
  int rc = stmt_start(b, table && pk_vals && nset >= 1 && nset <= 1600 && set_cols && set_vals,
                      "table, key values or columns", nset, set_cols);
  if (rc != 0) return rc;
  const rm_table_t *t = NULL;
  txp_buf_t sql;
  txp_buf_init(&sql, 0);
  PGresult *res = NULL;
  const char **params = NULL;
  rm_item_t it = {0};
  if ((rc = rm__at_stmt_table(b, table, nset, set_cols, &t)) != 0 || (rc = check_pk_vals(b, t, pk_vals)) != 0 ||
      (rc = rm__at_check_lock_key(b, t, pk_vals)) != 0)
    goto out;
  for (int i = 0; i < nset; i++) {
    int ci = rm__col_index(t, set_cols[i]);
    if (rm__at_is_pk_col(t, ci)) {
      rm__at_err(b, "column \"%s\" is part of the primary key of \"%s\": the AT layer cannot update it",
                 set_cols[i], t->name);
      rc = RM_E_NOT_SUPPORTED;
      goto out;
    }
  }
  if ((rc = before_item(b, RM_OP_UPDATE, t, pk_vals, &it)) != 0) goto out;

  /* UPDATE t SET c1 = $1, ... WHERE pk = $nset+1 ... RETURNING * */
  params = calloc((size_t)(nset + t->npk), sizeof(char *));
  rc = params ? txp_buf_append_str(&sql, "UPDATE ") : RM_E_NOMEM;
  if (!rc) rc = txp_buf_append_str(&sql, t->qname);
  for (int i = 0; !rc && i < nset; i++) {
    char num[16];
    rc = txp_buf_append_str(&sql, i ? ", " : " SET ");
    if (!rc) rc = txp_buf_append_str(&sql, t->cols[rm__col_index(t, set_cols[i])].qname);
    snprintf(num, sizeof(num), " = $%d", i + 1);
    if (!rc) rc = txp_buf_append_str(&sql, num);
    params[i] = set_vals[i];
  }
  if (!rc) rc = append_where_pk(&sql, t, nset + 1);
  if (!rc) rc = txp_buf_append_str(&sql, " RETURNING *");
  if (rc) {
    rc = rm__at_oom(b);
    goto out;
  }
  for (int k = 0; k < t->npk; k++) params[nset + k] = pk_vals[k];
  rc = update_locked_row(b, t, &it, sql.data, nset + t->npk, params, NULL, NULL, &res);
out:
  free(params);
  return stmt_finish(b, rc, &it, res, &sql);
}

int rm_at_delete(rm_branch_t *b, const char *table, const char *const *pk_vals) {
  if (!b) return RM_E_INVALID;
  int rc = stmt_start(b, table && pk_vals, "table or key values", 0, NULL);
  if (rc != 0) return rc;
  const rm_table_t *t = NULL;
  txp_buf_t sql;
  txp_buf_init(&sql, 0);
  PGresult *res = NULL;
  rm_item_t it = {0};
  if ((rc = rm__at_stmt_table(b, table, 0, NULL, &t)) != 0 || (rc = check_pk_vals(b, t, pk_vals)) != 0 ||
      (rc = rm__at_check_lock_key(b, t, pk_vals)) != 0)
    goto out;
  if ((rc = before_item(b, RM_OP_DELETE, t, pk_vals, &it)) != 0) goto out;
  if (pk_stmt_sql(&sql, "DELETE FROM ", t, NULL) != 0) {
    rc = rm__at_oom(b);
    goto out;
  }
  if (!(res = rm__at_run(b, "could not delete", sql.data, t->npk, pk_vals, NULL, PGRES_COMMAND_OK, &rc))) goto out;
  if (strcmp(PQcmdTuples(res), "1") != 0) {
    rm__at_err(b, "delete from \"%s\" touched %s rows, not one", t->name, PQcmdTuples(res));
    rc = RM_E_NOT_ONE_ROW;
    goto out;
  }
  rc = rm__at_record(b, t, &it, true);
out:
  return stmt_finish(b, rc, &it, res, &sql);
}

/* ------------------------------------------------------------------ deltas */

/* Column types a delta may target (integers and numeric). */
static bool delta_type_ok(unsigned type) { return type == 20 || type == 21 || type == 23 || type == 1700; }

/*
 * The target of a delta update (inside its savepoint): the table, the key
 * values and the column 'col', which must be an integer or numeric column
 * outside the primary key (its index in *ci).
 */
int rm__at_delta_col(rm_branch_t *b, const rm_table_t *t, const char *col, int *ci) {
  *ci = rm__col_index(t, col);
  if (*ci < 0) {
    rm__at_err(b, "column \"%s\" of \"%s\" does not exist", col, t->name);
    return RM_E_INVALID;
  }
  if (rm__at_is_pk_col(t, *ci) || t->cols[*ci].generated || !delta_type_ok(t->cols[*ci].type)) {
    rm__at_err(b, "column \"%s\" of \"%s\" cannot take a delta (it must be an integer or numeric column "
               "outside the primary key)", col, t->name);
    return RM_E_NOT_SUPPORTED;
  }
  return 0;
}

static int delta_target(rm_branch_t *b, const char *table, const char *const *pk_vals, const char *col,
                        const rm_table_t **t, int *ci) {
  const char *const dcol[1] = {col};
  int rc = rm__at_stmt_table(b, table, 1, dcol, t);
  if (rc == 0) rc = check_pk_vals(b, *t, pk_vals);
  if (rc != 0) return rc;
  return rm__at_delta_col(b, *t, col, ci);
}

/* Append "UPDATE t SET c = c + $1 WHERE pk = $2 ... AND (guard) RETURNING
 * <returning>" (NULL: the column c). */
static int delta_sql(txp_buf_t *sql, const rm_table_t *t, int ci, const char *guard, const char *returning) {
  int rc = txp_buf_append_str(sql, "UPDATE ");
  if (!rc) rc = txp_buf_append_str(sql, t->qname);
  if (!rc) rc = txp_buf_append_str(sql, " SET ");
  if (!rc) rc = txp_buf_append_str(sql, t->cols[ci].qname);
  if (!rc) rc = txp_buf_append_str(sql, " = ");
  if (!rc) rc = txp_buf_append_str(sql, t->cols[ci].qname);
  if (!rc) rc = txp_buf_append_str(sql, " + $1");
  if (!rc) rc = append_where_pk(sql, t, 2);
  if (!rc && guard && *guard) {
    rc = txp_buf_append_str(sql, " AND (");
    if (!rc) rc = txp_buf_append_str(sql, guard);
    if (!rc) rc = txp_buf_append_str(sql, ")");
  }
  if (!rc) rc = txp_buf_append_str(sql, " RETURNING ");
  if (!rc) rc = txp_buf_append_str(sql, returning ? returning : t->cols[ci].qname);
  return rc;
}

/* The undo item of a delta of column 'ci' (the same for both forms). */
static int delta_item(rm_branch_t *b, const rm_table_t *t, const char *const *pk_vals, int ci, long long delta,
                      rm_item_t *it) {
  if (rm__at_item_init(it, RM_OP_DELTA, t) != 0 || !(it->pk = pk_from_vals(t, pk_vals)) ||
      !(it->col = strdup(t->cols[ci].name)))
    return rm__at_oom(b);
  it->delta = delta;
  return 0;
}

/* A phase-one delta must not give capacity back (NOTES): false, with the
 * message set, for a decrement. */
static bool phase_one_delta_ok(rm_branch_t *b, const char *table, const char *col, long long delta) {
  if (delta >= 0 || delta == LLONG_MIN || !table || !col) return true; /* stmt_start judges the rest */
  rm__at_err(b, "\"%s\".\"%s\" %lld gives capacity back: undone by +%lld at a rollback, it would be refused "
             "once others took what it freed; record it with rm_at_update_delta_on_commit, which applies it "
             "when the global transaction commits", table, col, delta, -delta);
  return false;
}

/* Start a delta statement: its arguments checked, and for a phase-one
 * delta (not 'on_commit') the rule of the NOTES. */
static int delta_start(rm_branch_t *b, const char *table, const char *const *pk_vals, const char *col,
                       long long delta, bool on_commit) {
  if (!b) return RM_E_INVALID;
  if (!on_commit && !phase_one_delta_ok(b, table, col, delta)) return RM_E_INVALID;
  return stmt_start(b, table && pk_vals && col && delta != LLONG_MIN, "table, key values, column or delta", 0, NULL);
}

int rm_at_update_delta(rm_branch_t *b, const char *table, const char *const *pk_vals,
                       const char *col, long long delta, const char *guard) {
  int rc = delta_start(b, table, pk_vals, col, delta, false);
  if (rc != 0) return rc;
  const rm_table_t *t = NULL;
  txp_buf_t sql;
  txp_buf_init(&sql, 0);
  PGresult *res = NULL;
  const char **params = NULL;
  Oid *types = NULL;
  rm_item_t it = {0};
  int ci = -1;
  if ((rc = delta_target(b, table, pk_vals, col, &t, &ci)) != 0) goto out;
  char dbuf[32];
  snprintf(dbuf, sizeof(dbuf), "%lld", delta);
  params = calloc((size_t)(1 + t->npk), sizeof(char *));
  types = params ? calloc((size_t)(1 + t->npk), sizeof(Oid)) : NULL;
  if (!types || delta_sql(&sql, t, ci, guard, NULL) != 0) {
    rc = rm__at_oom(b);
    goto out;
  }
  params[0] = dbuf;
  types[0] = INT8OID;
  for (int k = 0; k < t->npk; k++) params[1 + k] = pk_vals[k];
  if (!(res = rm__at_run(b, "could not update", sql.data, 1 + t->npk, params, types, PGRES_TUPLES_OK, &rc)))
    goto out;
  if (PQntuples(res) != 1) {
    /* The guard refused, or there is no such row: tell which. */
    bool none = PQntuples(res) == 0;
    PQclear(res);
    res = NULL;
    if (!none) {
      rm__at_err(b, "delta update of \"%s\" touched several rows", t->name);
      rc = RM_E_NOT_ONE_ROW;
      goto out;
    }
    txp_buf_reset(&sql);
    if (pk_stmt_sql(&sql, "SELECT 1 FROM ", t, NULL) != 0) {
      rc = rm__at_oom(b);
      goto out;
    }
    if (!(res = rm__at_run(b, "could not read the row", sql.data, t->npk, pk_vals, NULL, PGRES_TUPLES_OK, &rc)))
      goto out;
    if (PQntuples(res) == 0) {
      rm__at_err(b, "no row of \"%s\" has the given primary key", t->name);
      rc = RM_E_NOT_ONE_ROW;
    } else {
      rm__at_err(b, "the guard of the delta update of \"%s\".\"%s\" refused %lld", t->name, col, delta);
      rc = RM_E_GUARD;
    }
    goto out;
  }
  if ((rc = delta_item(b, t, pk_vals, ci, delta, &it)) != 0) goto out;
  rc = rm__at_record(b, t, &it, false);
out:
  free(types);
  free(params);
  return stmt_finish(b, rc, &it, res, &sql);
}

/*
 * UPDATE t SET c = c + $1 WHERE pk AND (guard) RETURNING *: an update of
 * one row by an amount, as rm_at_update in every other respect (before
 * image under FOR UPDATE, after image, the row's global lock key, the undo
 * restores the before image if the row still shows the after image).
 * 'amount' is text in the column's type (PostgreSQL infers $1 from the
 * column), so numeric "-10.50" works where rm_at_update_delta's long long
 * cannot, and a decrement is safe here: the row stays locked globally
 * until the decision, so nobody spends what a rollback would give back.
 */
int rm_at_update_add(rm_branch_t *b, const char *table, const char *const *pk_vals, const char *col,
                     const char *amount, const char *guard) {
  if (!b) return RM_E_INVALID;
  const char *const scol[1] = {col};
  int rc = stmt_start(b, table && pk_vals && col && amount && amount[0], "table, key values, column or amount",
                      1, scol);
  if (rc != 0) return rc;
  const rm_table_t *t = NULL;
  txp_buf_t sql;
  txp_buf_init(&sql, 0);
  PGresult *res = NULL;
  const char **params = NULL;
  rm_item_t it = {0};
  int ci = -1;
  if ((rc = delta_target(b, table, pk_vals, col, &t, &ci)) != 0 || (rc = rm__at_check_lock_key(b, t, pk_vals)) != 0)
    goto out;
  if ((rc = before_item(b, RM_OP_UPDATE, t, pk_vals, &it)) != 0) goto out;
  params = calloc((size_t)(1 + t->npk), sizeof(char *));
  if (!params || delta_sql(&sql, t, ci, guard, "*") != 0) {
    rc = rm__at_oom(b);
    goto out;
  }
  params[0] = amount;
  for (int k = 0; k < t->npk; k++) params[1 + k] = pk_vals[k];
  rc = update_locked_row(b, t, &it, sql.data, 1 + t->npk, params, col, amount, &res);
out:
  free(params);
  return stmt_finish(b, rc, &it, res, &sql);
}

void rm__at_deferred_clear(rm_deferred_t *d) {
  free(d->update_sql);
  free(d->exists_sql);
  for (int k = 0; d->params && k < d->nparams; k++) free(d->params[k]);
  free(d->params);
  free(d->types);
  for (int k = 0; d->pk_vals && k < d->npk; k++) free(d->pk_vals[k]);
  free(d->pk_vals);
  json_decref(d->item);
  memset(d, 0, sizeof(*d));
}

/*
 * Read that the row of 'pk_vals' exists (no lock), with 'esql' (SELECT 1
 * FROM t WHERE pk).  When the statement's savepoint is still pending,
 * SAVEPOINT, SELECT and RELEASE go in one round trip (the SELECT changes
 * nothing, so there is nothing to roll back after it): then *released is
 * set and the caller must not end the statement through rm__at_stmt_end.
 */
static int row_must_exist(rm_branch_t *b, const rm_table_t *t, const char *esql, const char *const *pk_vals,
                          bool *released) {
  PGresult *res = NULL;
  int rc = 0;
  *released = false;
  if (b->sp_pending) {
    /* Without statement savepoints there is nothing to release. */
    int nq = b->no_savepoints ? 1 : 2;
    const char *const sqls[2] = {esql, "RELEASE SAVEPOINT " RM_AT_SAVEPOINT};
    const int np[2] = {t->npk, 0};
    const char *const *pp[2] = {pk_vals, NULL};
    PGresult *r2[2] = {NULL, NULL};
    if ((rc = rm__at_pending_run(b, nq, sqls, np, pp, NULL, r2)) != 0) return rc;
    if (PQresultStatus(r2[0]) != PGRES_TUPLES_OK) {
      rc = rm__at_stmt_error(b, "could not read the row", r2[0]);
      r2[0] = NULL;
    } else if (nq == 2 && PQresultStatus(r2[1]) != PGRES_COMMAND_OK) {
      rc = rm__at_stmt_error(b, "could not release the savepoint", r2[1]);
      r2[1] = NULL;
    } else {
      res = r2[0];
      r2[0] = NULL;
      *released = nq == 2;
    }
    PQclear(r2[0]);
    PQclear(r2[1]);
    if (rc != 0) return rc;
  } else if (!(res = rm__at_run(b, "could not read the row", esql, t->npk, pk_vals, NULL, PGRES_TUPLES_OK, &rc))) {
    return rc;
  }
  rc = one_row(b, t, res);
  PQclear(res);
  return rc;
}

int rm__at_commit_delta(rm_branch_t *b, const rm_table_t *t, int ci, const char *const *pk_vals, long long delta,
                        bool *released) {
  txp_buf_t esql;
  txp_buf_init(&esql, 0);
  rm_item_t it = {0};
  int rc = 0;
  *released = false;
  if (pk_stmt_sql(&esql, "SELECT 1 FROM ", t, NULL) != 0) {
    rc = rm__at_oom(b);
    goto out;
  }
  /* The row must exist now: a commit that finds it gone cannot apply the
   * delta and needs an operator (rm_undo.c). */
  if ((rc = row_must_exist(b, t, esql.data, pk_vals, released)) != 0) goto out;
  if (rm__at_item_init(&it, RM_OP_COMMIT_DELTA, t) != 0 || !(it.pk = pk_from_vals(t, pk_vals)) ||
      !(it.col = strdup(t->cols[ci].name))) {
    rc = rm__at_oom(b);
    goto out;
  }
  it.delta = delta;
  rc = rm__at_record(b, t, &it, false); /* no lock key: it changes nothing before the commit */
out:
  rm_item_clear(&it);
  txp_buf_free(&esql);
  return rc;
}

int rm_at_update_delta_on_commit(rm_branch_t *b, const char *table, const char *const *pk_vals,
                                 const char *col, long long delta) {
  int rc = delta_start(b, table, pk_vals, col, delta, true);
  if (rc != 0) return rc;
  const rm_table_t *t = NULL;
  bool released = false;
  int ci = -1;
  if ((rc = delta_target(b, table, pk_vals, col, &t, &ci)) == 0) rc = rm__at_commit_delta(b, t, ci, pk_vals, delta, &released);
  if (released) { /* the savepoint is gone and the SELECT changed nothing */
    b->sp_taken = false;
    return rc;
  }
  return rm__at_stmt_end(b, rc);
}

int rm__at_defer_delta(rm_branch_t *b, const rm_table_t *t, int ci, const char *const *pk_vals, long long delta,
                       const char *update_sql, int nparams, const char *const *params, const Oid *types,
                       bool *released) {
  txp_buf_t esql;
  txp_buf_init(&esql, 0);
  rm_item_t it = {0};
  rm_deferred_t d = {0};
  int rc = 0;
  *released = false;
  if (nparams < 0 || nparams > RM_AT_DEFERRED_MAX_PARAMS) {
    rm__at_err(b, "a deferred delta update takes at most %d parameters", RM_AT_DEFERRED_MAX_PARAMS);
    return RM_E_INVALID;
  }
  if (pk_stmt_sql(&esql, "SELECT 1 FROM ", t, NULL) != 0) {
    rc = rm__at_oom(b);
    goto out;
  }
  /* The row must exist now (a plain read: no row lock): a failure then
   * leaves the caller's transaction as it was.  Without statement
   * savepoints the caller rolls back on any failure anyway, and prepare's
   * UPDATE finds a missing row as well (rm__at_deferred_refused:
   * RM_E_NOT_ONE_ROW there): no read, one round trip less per call. */
  if (!b->no_savepoints && (rc = row_must_exist(b, t, esql.data, pk_vals, released)) != 0) goto out;
  /* The undo item, as rm_at_update_delta records it; it joins the undo
   * log when prepare has run the UPDATE (statement order = undo order). */
  size_t sz = 0;
  if ((rc = delta_item(b, t, pk_vals, ci, delta, &it)) != 0 || (rc = rm__at_item_encode(b, t, &it, &d.item, &sz)) != 0)
    goto out;
  d.delta = delta;
  snprintf(d.what, sizeof(d.what), "\"%.60s\".\"%.60s\"", t->name, t->cols[ci].name);
  d.update_sql = strdup(update_sql);
  d.exists_sql = strdup(esql.data);
  d.params = calloc((size_t)nparams + 1, sizeof(char *));
  d.types = calloc((size_t)nparams + 1, sizeof(Oid));
  d.pk_vals = calloc((size_t)t->npk, sizeof(char *));
  bool ok = d.update_sql && d.exists_sql && d.params && d.types && d.pk_vals;
  for (int i = 0; ok && i < nparams; i++) {
    d.types[i] = types ? types[i] : 0;
    ok = !params[i] || (d.params[i] = strdup(params[i])) != NULL;
  }
  d.nparams = ok ? nparams : 0;
  for (int k = 0; ok && k < t->npk; k++) ok = (d.pk_vals[k] = strdup(pk_vals[k])) != NULL;
  d.npk = ok ? t->npk : 0;
  if (ok && b->ndeferred == b->capdeferred) {
    size_t cap = b->capdeferred ? b->capdeferred * 2 : 4;
    rm_deferred_t *nd = realloc(b->deferred, cap * sizeof(*nd));
    if (nd) {
      b->deferred = nd;
      b->capdeferred = cap;
    } else {
      ok = false;
    }
  }
  if (!ok) {
    d.nparams = nparams; /* free what was copied */
    d.npk = t->npk;
    rc = rm__at_oom(b);
    goto out;
  }
  b->deferred[b->ndeferred++] = d;
  memset(&d, 0, sizeof(d));
  b->undo_bytes += sz + 1;
out:
  rm__at_deferred_clear(&d);
  rm_item_clear(&it);
  txp_buf_free(&esql);
  return rc;
}

int rm_at_update_delta_deferred(rm_branch_t *b, const char *table, const char *const *pk_vals,
                                const char *col, long long delta, const char *guard) {
  int rc = delta_start(b, table, pk_vals, col, delta, false);
  if (rc != 0) return rc;
  const rm_table_t *t = NULL;
  txp_buf_t sql;
  txp_buf_init(&sql, 0);
  bool released = false;
  int ci = -1;
  const char **params = NULL;
  Oid *types = NULL;
  if ((rc = delta_target(b, table, pk_vals, col, &t, &ci)) != 0) goto out;
  char dbuf[32];
  snprintf(dbuf, sizeof(dbuf), "%lld", delta);
  params = calloc((size_t)(1 + t->npk), sizeof(char *));
  types = calloc((size_t)(1 + t->npk), sizeof(Oid));
  if (!params || !types || delta_sql(&sql, t, ci, guard, NULL) != 0) {
    rc = rm__at_oom(b);
    goto out;
  }
  params[0] = dbuf;
  types[0] = INT8OID; /* the delta; the key values untyped */
  for (int k = 0; k < t->npk; k++) params[1 + k] = pk_vals[k];
  rc = rm__at_defer_delta(b, t, ci, pk_vals, delta, sql.data, 1 + t->npk, params, types, &released);
out:
  free(params);
  free(types);
  txp_buf_free(&sql);
  if (released) { /* the savepoint is gone and the SELECT changed nothing */
    b->sp_taken = false;
    return rc;
  }
  return rm__at_stmt_end(b, rc);
}

/* ---------------------------------------- prepare: the deferred updates */

int rm__at_deferred_refused(rm_branch_t *b, const rm_deferred_t *d) {
  PGresult *e = PQexecParams(b->pg, d->exists_sql, d->npk, NULL, (const char *const *)d->pk_vals, NULL, NULL, 0);
  if (PQresultStatus(e) != PGRES_TUPLES_OK) return rm__at_stmt_error(b, "could not read the row", e);
  int rc = RM_E_GUARD;
  if (PQntuples(e) == 0) {
    rm__at_err(b, "the row of the deferred delta update of %s is gone", d->what);
    rc = RM_E_NOT_ONE_ROW;
  } else {
    rm__at_err(b, "the guard of the deferred delta update of %s refused %lld", d->what, d->delta);
  }
  PQclear(e);
  return rc;
}

/* Leave the caller's transaction aborted (only after a refusal without a
 * savepoint, where rows it must not commit were changed): a COMMIT then
 * rolls back. */
static void abort_transaction(rm_branch_t *b) {
  PQclear(PQexec(b->pg, "DO $rm$BEGIN RAISE EXCEPTION 'rm_at: a deferred delta update was refused: "
                        "this transaction must roll back'; END$rm$"));
}

int rm__at_run_deferred(rm_branch_t *b, const char *tail, int ntail, const char *const *tail_params,
                        PGresult **tail_res) {
  bool sp = !b->no_savepoints;
  int first = sp ? 1 : 0; /* the first UPDATE's index */
  size_t n = b->ndeferred + 1;
  if (tail_res) *tail_res = NULL;
  const char **sqls = calloc(n, sizeof(char *));
  int *np = calloc(n, sizeof(int));
  const char *const **pp = calloc(n, sizeof(char **));
  const Oid **tt = calloc(n, sizeof(Oid *));
  PGresult **res = calloc(n, sizeof(PGresult *));
  int rc = sqls && np && pp && tt && res ? 0 : RM_E_NOMEM;
  if (!rc && sp) sqls[0] = "SAVEPOINT " RM_AT_SAVEPOINT;
  for (size_t i = 0; !rc && i < b->ndeferred; i++) {
    rm_deferred_t *d = &b->deferred[i];
    sqls[first + i] = d->update_sql;
    np[first + i] = d->nparams;
    pp[first + i] = (const char *const *)d->params;
    tt[first + i] = d->types;
  }
  if (!rc && !sp && tail) {
    sqls[n - 1] = tail;
    np[n - 1] = ntail;
    pp[n - 1] = tail_params;
  }
  int nrun = sp ? (int)n : (int)b->ndeferred + (tail ? 1 : 0);
  if (rc) {
    rm__at_err(b, "out of memory");
    goto done;
  }
  if ((rc = rm__at_pipe_run(b, nrun, sqls, np, pp, tt, res)) != 0) goto done;
  if (sp && PQresultStatus(res[0]) != PGRES_COMMAND_OK) {
    rc = rm__at_stmt_error(b, "could not set a savepoint", res[0]);
    res[0] = NULL;
    goto done;
  }
  for (size_t i = 0; i < b->ndeferred; i++) {
    PGresult *r = res[first + i];
    rm_deferred_t *d = &b->deferred[i];
    if (PQresultStatus(r) != PGRES_TUPLES_OK) {
      char what[200];
      snprintf(what, sizeof(what), "could not run the delta update of %s", d->what);
      rc = rm__at_stmt_error(b, what, r);
      res[first + i] = NULL;
      break;
    }
    if (PQntuples(r) != 1) {
      if (PQntuples(r) > 1) {
        rm__at_err(b, "delta update of %s touched several rows", d->what);
        rc = RM_E_NOT_ONE_ROW;
        break;
      }
      /* Refused, or the row is gone: tell which, after the rollback (with
       * no savepoint, in the transaction as it is: the read sees the same
       * row). */
      if (sp) PQclear(PQexec(b->pg, "ROLLBACK TO SAVEPOINT " RM_AT_SAVEPOINT));
      rc = rm__at_deferred_refused(b, d);
      break;
    }
  }
  if (rc == 0 && !sp && tail) {
    *tail_res = res[n - 1];
    res[n - 1] = NULL;
  }
done:
  if (rc != 0 && sp && res && res[0] && PQresultStatus(res[0]) == PGRES_COMMAND_OK) {
    /* Undo the deferred updates: the transaction as before prepare. */
    rm__at_sp_rollback(b);
  }
  if (rc != 0 && !sp && PQtransactionStatus(b->pg) == PQTRANS_INTRANS) abort_transaction(b);
  for (size_t i = 0; res && i < n; i++) PQclear(res[i]);
  free(res);
  free(tt);
  free(pp);
  free(np);
  free(sqls);
  return rc;
}

