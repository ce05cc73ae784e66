/*
 * rm_at_sql.c - plain SQL in an AT branch (rm_at_sql, rm_client.h): the
 * statement classified by sql/rm_sql.c (cached per resource), then run in
 * the statement frame of rm_at_frame.c with the same images, undo items
 * and lock keys as the structured calls of rm_at_stmt.c.
 *
 * NOTES
 *   What runs, inside the statement's savepoint:
 *     insert: <the INSERT> RETURNING <digest of the row>, <key columns>
 *             [, NULL AS rm_at_returning, <the caller's RETURNING list>]
 *     update: <image: SELECT * ... WHERE <its condition> FOR UPDATE>
 *             <the UPDATE> RETURNING * [, NULL AS rm_at_returning, <...>]
 *     delete: <image>, then <the DELETE> RETURNING <key columns> [, ...]
 *     select for update: <image> (local row locks), a GlobalLockQuery of
 *             its rows' keys (waiting, with the local locks let go, while
 *             another global transaction holds one), then the SELECT
 *     hot counter (rm_at_hot_column): SELECT 1 by the key, and the UPDATE
 *             itself deferred to prepare (or, giving back, to the commit)
 *     read:   the SELECT as it is
 *   The marker column splits what the AT layer asked for from what the
 *   caller did; the caller's result is a copy of its part only.
 *
 *   The rows an UPDATE or DELETE changed must be the rows its image read
 *   (by key): under READ COMMITTED a row committed by another transaction
 *   between the two may come to match the condition, and its change
 *   would have no image.  The image locked every row it read, so those
 *   cannot move; a newcomer makes the statement fail as a whole (its
 *   savepoint rolled back), and the caller may run it again.
 *
 *   Parameters the image does not use (those of SET only) are sent to it
 *   typed as text unless the caller typed them: PostgreSQL cannot infer
 *   the type of a parameter a query never mentions.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rm_at_int.h"
#include "txp_lockkey.h"

#define TEXTOID 25

void (*rm__at_sql_after_image)(rm_branch_t *b, void *arg) = NULL;
/* The column that separates the AT layer's RETURNING part from the caller's. */
#define MARK "rm_at_returning"

/* ------------------------------------------------------------ helpers */

/* Field index of MARK in 'res' at or after 'from', or -1. */
static int mark_at(const PGresult *res, int from) {
  for (int i = from; i < PQnfields(res); i++)
    if (strcmp(PQfname(res, i), MARK) == 0) return i;
  return -1;
}

/* The caller's part of 'res' (fields from 'first' on) as a result of its
 * own, so that it sees exactly the columns it asked for.  NULL on
 * allocation failure. */
static PGresult *caller_part(PGconn *pg, const PGresult *res, int first) {
  int n = PQnfields(res) - first, nt = PQntuples(res);
  PGresult *out = PQmakeEmptyPGresult(pg, PGRES_TUPLES_OK);
  PGresAttDesc *d = n > 0 ? calloc((size_t)n, sizeof(*d)) : NULL;
  if (!out || (n > 0 && !d)) goto fail;
  for (int i = 0; i < n; i++) {
    d[i].name = PQfname(res, first + i);
    d[i].tableid = PQftable(res, first + i);
    d[i].columnid = PQftablecol(res, first + i);
    d[i].format = PQfformat(res, first + i);
    d[i].typid = PQftype(res, first + i);
    d[i].typlen = PQfsize(res, first + i);
    d[i].atttypmod = PQfmod(res, first + i);
  }
  if (!PQsetResultAttrs(out, n, d)) goto fail;
  for (int r = 0; r < nt; r++)
    for (int i = 0; i < n; i++) {
      bool null = PQgetisnull(res, r, first + i);
      if (!PQsetvalue(out, r, i, null ? NULL : PQgetvalue(res, r, first + i),
                      null ? -1 : PQgetlength(res, r, first + i)))
        goto fail;
    }
  free(d);
  return out;
fail:
  free(d);
  PQclear(out);
  return NULL;
}

/* 'sql' + 'tail' + [", NULL AS mark, " + caller's list]: the statement as
 * run (malloc'd), or NULL on allocation failure. */
static char *with_returning(const rm_sql_stmt_t *s, const char *tail) {
  txp_buf_t b;
  txp_buf_init(&b, 0);
  int rc = txp_buf_append_str(&b, s->base_sql);
  if (!rc) rc = txp_buf_append_str(&b, tail);
  if (!rc && s->returning_sql) rc = txp_buf_append_str(&b, ", NULL AS " MARK ", ");
  if (!rc && s->returning_sql) rc = txp_buf_append_str(&b, s->returning_sql);
  if (rc) {
    txp_buf_free(&b);
    return NULL;
  }
  return b.data; /* the buffer's storage, owned by the caller now */
}

/* The key of row 'r' of 'res' from its 'npk' fields starting at 'first'
 * (named as the table's key columns). */
static rm_row_t *key_from_fields(const rm_table_t *t, const PGresult *res, int r, int first) {
  rm_row_t *pk = rm_row_new(t->npk);
  if (!pk) return NULL;
  for (int k = 0; k < t->npk; k++) {
    if (PQgetisnull(res, r, first + k) ||
        rm_row_set(pk, k, t->cols[t->pk[k]].name, PQgetvalue(res, r, first + k)) != 0) {
      rm_row_free(pk);
      return NULL;
    }
  }
  return pk;
}

static bool same_key(const rm_row_t *a, const rm_row_t *b) {
  if (a->n != b->n) return false;
  for (int k = 0; k < a->n; k++)
    if (strcmp(a->vals[k], b->vals[k]) != 0) return false;
  return true;
}

/* Room for 'n' more items in the branch: 0, or RM_E_INVALID with the message. */
static int room_for(rm_branch_t *b, const rm_table_t *t, size_t n) {
  if (b->nitems + b->ndeferred + n <= RM_AT_MAX_ITEMS) return 0;
  rm__at_err(b, "a statement on \"%s\" changes %zu rows: the branch would hold more than %d (a branch's limit)",
             t->name, n, RM_AT_MAX_ITEMS);
  return RM_E_INVALID;
}

/* One run of rm_at_sql: the statement, its parameters, what it made. */
typedef struct sql_run {
  rm_branch_t *b;
  const rm_sql_stmt_t *s;
  int nparams;
  const Oid *types;
  const char *const *vals;
  const char *sql;   /* the statement as the caller wrote it */
  const rm_table_t *t;
  PGresult *res;     /* the statement's own result */
  int user_first;    /* first field of the caller's RETURNING part, -1: none */
  rm_item_t *items;
  size_t nitems;
  bool delta;        /* taken as a hot counter's delta (rm_at_hot_column) */
  bool released;     /* ... whose read released the statement's savepoint */
} sql_run_t;

static int items_alloc(sql_run_t *r, size_t n) {
  if (n == 0) return 0;
  r->items = calloc(n, sizeof(*r->items));
  return r->items ? 0 : rm__at_oom(r->b);
}

/* Run 'text' (the statement with our RETURNING) and find the caller's part. */
static int run_statement(sql_run_t *r, const char *what, const char *text) {
  int rc = 0;
  r->res = rm__at_run(r->b, what, text, r->nparams, r->vals, r->types, PGRES_TUPLES_OK, &rc);
  if (!r->res) return rc;
  if (r->s->returning_sql) {
    int m = mark_at(r->res, 0);
    if (m < 0) {
      rm__at_err(r->b, "the statement's result lost its marker column \"" MARK "\"");
      return RM_E_DB;
    }
    r->user_first = m + 1;
  }
  return 0;
}

/* ------------------------------------------------------------- insert */

/* The INSERT 's' into 't' as it runs: RETURNING the row's digest and its
 * key [, the caller's list].  Malloc'd; NULL out of memory. */
static char *insert_text(rm_branch_t *b, const rm_sql_stmt_t *s, const rm_table_t *t) {
  /* The row is named by the statement's alias, else by the table itself. */
  char *alias = s->alias ? PQescapeIdentifier(b->pg, s->alias, strlen(s->alias)) : NULL;
  if (s->alias && !alias) return NULL;
  const char *ref = alias ? alias : t->qname;
  txp_buf_t tail;
  txp_buf_init(&tail, 0);
  int rc = txp_buf_append_str(&tail, " RETURNING " RM_AT_ROW_DIGEST_HEAD);
  if (!rc) rc = txp_buf_append_str(&tail, ref);
  if (!rc) rc = txp_buf_append_str(&tail, RM_AT_ROW_DIGEST_TAIL);
  for (int k = 0; !rc && k < t->npk; k++) {
    rc = txp_buf_append_str(&tail, ", ");
    if (!rc) rc = txp_buf_append_str(&tail, ref);
    if (!rc) rc = txp_buf_append_str(&tail, ".");
    if (!rc) rc = txp_buf_append_str(&tail, t->cols[t->pk[k]].qname);
  }
  if (alias) PQfreemem(alias);
  char *text = rc ? NULL : with_returning(s, tail.data);
  txp_buf_free(&tail);
  return text;
}

static int run_insert(sql_run_t *r) {
  rm_branch_t *b = r->b;
  const rm_table_t *t = r->t;
  int rc = room_for(b, t, (size_t)r->s->nrows);
  if (rc) return rc;
  char *text = insert_text(b, r->s, t);
  if (!text) return rm__at_oom(b);
  rc = run_statement(r, "could not insert", text);
  free(text);
  if (rc) return rc;
  int n = PQntuples(r->res);
  if ((rc = items_alloc(r, (size_t)n)) != 0) return rc;
  for (int i = 0; i < n; i++) {
    rm_item_t *it = &r->items[r->nitems++];
    if (rm__at_item_init(it, RM_OP_INSERT, t) != 0) return rm__at_oom(b);
    if (PQgetisnull(r->res, i, 0) || !(it->pk = key_from_fields(t, r->res, i, 1))) {
      rm__at_err(b, "an inserted row of \"%s\" has no primary key value", t->name);
      return RM_E_INVALID;
    }
    if (!(it->digest = strdup(PQgetvalue(r->res, i, 0)))) return rm__at_oom(b);
  }
  return 0;
}

/* ---------------------------------------------------- update and delete */

/* The before image: the rows the condition holds now, locked. */
static int read_image(sql_run_t *r, PGresult **image) {
  rm_branch_t *b = r->b;
  const rm_sql_stmt_t *s = r->s;
  Oid *types = r->nparams ? calloc((size_t)r->nparams, sizeof(Oid)) : NULL;
  if (r->nparams && !types) return rm__at_oom(b);
  for (int i = 0; i < r->nparams; i++) {
    bool used = i < s->nparams && s->image_params && s->image_params[i];
    types[i] = r->types && r->types[i] ? r->types[i] : used ? 0 : TEXTOID;
  }
  int rc = 0;
  *image = rm__at_run(b, "could not read the before image", s->image_sql, r->nparams, r->vals, types,
                      PGRES_TUPLES_OK, &rc);
  free(types);
  return *image ? 0 : rc;
}

/* The item of each row of 'image' (before images, keys; their lock keys checked). */
static int image_items(sql_run_t *r, const PGresult *image, rm_op_t op) {
  rm_branch_t *b = r->b;
  const rm_table_t *t = r->t;
  int n = PQntuples(image);
  int rc = room_for(b, t, (size_t)n);
  if (rc == 0) rc = items_alloc(r, (size_t)n);
  for (int i = 0; rc == 0 && i < n; i++) {
    rm_item_t *it = &r->items[r->nitems++];
    if (rm__at_item_init(it, op, t) != 0 || !(it->before = rm__row_from_result(image, i))) return rm__at_oom(b);
    if (!(it->pk = rm__at_pk_from_row(t, it->before))) {
      rm__at_err(b, "a row of \"%s\" has no primary key value in its before image", t->name);
      return RM_E_INVALID;
    }
    rc = rm__at_check_lock_key(b, t, (const char *const *)it->pk->vals);
  }
  return rc;
}

/* The item whose key is 'key', or NULL: the statement changed a row its
 * image did not hold. */
static rm_item_t *item_of(sql_run_t *r, const rm_row_t *key) {
  for (size_t i = 0; i < r->nitems; i++)
    if (same_key(r->items[i].pk, key)) return &r->items[i];
  return NULL;
}

static int not_imaged(sql_run_t *r, const char *verb) {
  rm__at_err(r->b, "%s of \"%s\" changed %d rows where its before image held %zu: a row came to match its "
             "condition in between (committed by another transaction); nothing done, run it again",
             verb, r->t->name, PQntuples(r->res), r->nitems);
  return RM_E_NOT_ONE_ROW;
}

/* The integer 'text' (all of it), or false. */
static bool integer_of(const char *text, long long *out) {
  if (!text || !*text) return false;
  char *end = NULL;
  errno = 0;
  long long v = strtoll(text, &end, 10);
  if (errno || *end || v == LLONG_MIN) return false;
  *out = v;
  return true;
}

/*
 * An UPDATE of a declared hot counter by an amount, on one row named by its
 * whole key (rm_at_hot_column): a delta, deferred to prepare when it takes
 * (the caller's own statement runs there, its guard with it), recorded for
 * the commit when it gives back.  *eligible false: not of that form after
 * all (a key column not given, an amount that is no integer), the caller
 * goes on with images.
 */
static int run_hot_delta(sql_run_t *r, bool *eligible) {
  rm_branch_t *b = r->b;
  const rm_sql_stmt_t *s = r->s;
  const rm_table_t *t = r->t;
  *eligible = false;
  const char *pk[32];
  if (t->npk > 32 || r->nparams > RM_AT_DEFERRED_MAX_PARAMS) return 0;
  for (int k = 0; k < t->npk; k++) {
    pk[k] = NULL;
    for (int i = 0; i < s->neq && !pk[k]; i++) {
      const rm_sql_eq_t *e = &s->eqs[i];
      if (strcmp(e->col, t->cols[t->pk[k]].name) != 0) continue;
      pk[k] = e->param ? (e->param <= r->nparams ? r->vals[e->param - 1] : NULL) : e->value;
    }
    if (!pk[k]) return 0;
  }
  long long amount = 0;
  const char *x = s->delta_param ? (s->delta_param <= r->nparams ? r->vals[s->delta_param - 1] : NULL) : s->delta_value;
  if (!integer_of(x, &amount)) return 0;
  *eligible = true;
  r->delta = true;
  long long delta = s->delta_sign * amount;
  int ci = -1;
  int rc = rm__at_delta_col(b, t, s->delta_col, &ci);
  if (rc) return rc;
  if (delta < 0) {
    if (s->where_more) {
      rm__at_err(b, "\"%s\".\"%s\" %lld gives capacity back, which the commit applies (a give-back always fits): "
                 "it takes no condition beyond the row's key", t->name, s->delta_col, delta);
      return RM_E_INVALID;
    }
    return rm__at_commit_delta(b, t, ci, pk, delta, &r->released);
  }
  txp_buf_t text;
  txp_buf_init(&text, 0);
  rc = txp_buf_append_str(&text, s->base_sql);
  if (!rc) rc = txp_buf_append_str(&text, " RETURNING ");
  if (!rc) rc = txp_buf_append_str(&text, t->cols[ci].qname);
  if (!rc) rc = rm__at_defer_delta(b, t, ci, pk, delta, text.data, r->nparams, r->vals, r->types, &r->released);
  else rc = rm__at_oom(b);
  txp_buf_free(&text);
  return rc;
}

static int run_change(sql_run_t *r) {
  rm_branch_t *b = r->b;
  const rm_sql_stmt_t *s = r->s;
  const rm_table_t *t = r->t;
  bool update = s->kind == RM_SQL_UPDATE;
  for (int i = 0; update && i < s->nset; i++) {
    if (rm__at_is_pk_col(t, rm__col_index(t, s->set_cols[i]))) {
      rm__at_err(b, "column \"%s\" is part of the primary key of \"%s\": the AT layer cannot update it",
                 s->set_cols[i], t->name);
      return RM_E_NOT_SUPPORTED;
    }
  }
  if (update && s->delta_col && !s->returning && rm__at_hot(b->res, t, s->delta_col)) {
    bool eligible = false;
    int hrc = run_hot_delta(r, &eligible);
    if (eligible || hrc) return hrc;
  }
  PGresult *image = NULL;
  int rc = read_image(r, &image);
  if (rc == 0) rc = image_items(r, image, update ? RM_OP_UPDATE : RM_OP_DELETE);
  PQclear(image);
  if (rc) return rc;
  if (rm__at_sql_after_image) rm__at_sql_after_image(b, rm__at_failpoint_arg);

  txp_buf_t tail;
  txp_buf_init(&tail, 0);
  rc = txp_buf_append_str(&tail, update ? " RETURNING *" : " RETURNING ");
  for (int k = 0; !update && !rc && k < t->npk; k++) {
    if (k) rc = txp_buf_append_str(&tail, ", ");
    if (!rc) rc = txp_buf_append_str(&tail, t->cols[t->pk[k]].qname);
  }
  char *text = rc ? NULL : with_returning(s, tail.data);
  txp_buf_free(&tail);
  if (!text) return rm__at_oom(b);
  rc = run_statement(r, update ? "could not update" : "could not delete", text);
  free(text);
  if (rc) return rc;
  int n = PQntuples(r->res);
  if ((size_t)n != r->nitems) return not_imaged(r, update ? "UPDATE" : "DELETE");
  /* Our part: the whole row (update) or its key (delete), up to the marker. */
  int ours = r->user_first > 0 ? r->user_first - 1 : PQnfields(r->res);
  for (int i = 0; i < n; i++) {
    rm_row_t *row = update ? rm__row_from_range(r->res, i, 0, ours) : key_from_fields(t, r->res, i, 0);
    rm_row_t *key = row && update ? rm__at_pk_from_row(t, row) : row;
    rm_item_t *it = key ? item_of(r, key) : NULL;
    if (key != row) rm_row_free(key);
    if (!row) return rm__at_oom(b);
    if (!it || (update && it->after)) {
      rm_row_free(row);
      return not_imaged(r, update ? "UPDATE" : "DELETE");
    }
    if (update) it->after = row;
    else rm_row_free(row);
  }
  return 0;
}

/* ---------------------------------------------------------------- entry */

/* ----------------------------------------------------- select for update */

/* The lock keys of the rows of 'image' into 'keys'. */
static int image_keys(sql_run_t *r, const PGresult *image, txp_buf_t *keys) {
  const rm_table_t *t = r->t;
  for (int i = 0; i < PQntuples(image); i++) {
    rm_row_t *row = rm__row_from_result(image, i);
    rm_row_t *pk = row ? rm__at_pk_from_row(t, row) : NULL;
    rm_row_free(row);
    if (!pk) return rm__at_oom(r->b);
    int rc = rm_lockkeys_add(keys, r->b->res->id, t->lockname, (const char *const *)pk->vals, pk->n);
    rm_row_free(pk);
    if (rc == RM_E_INVALID) {
      rm__at_err(r->b, "SELECT ... FOR UPDATE of \"%s\": the rows' lock keys exceed %u bytes (or a key is too long): "
                 "select fewer rows", t->name, (unsigned)TXP_MAX_LOCK_KEYS_LEN);
    }
    if (rc != 0) return rc;
  }
  return 0;
}

/*
 * SELECT ... FOR UPDATE: the rows it returns read under their local row
 * locks, and free of other global transactions' locks (Seata's way of
 * reading committed data across global transactions).  When another
 * global transaction holds one, the local locks are let go (its rollback
 * may need them) and the coordinator is asked to answer once the holder
 * released it (its pushed lock queue, up to the client's lock_wait_ms);
 * then the rows are read again.  Without statement savepoints the local
 * locks cannot be let go alone: a held row is a conflict at once.  The
 * statement itself runs last, on rows that are now this transaction's.
 */
static int run_select_for_update(sql_run_t *r) {
  rm_branch_t *b = r->b;
  uint64_t deadline = rm__mono_ms() + rm__lock_wait_ms(b->c);
  txp_buf_t keys;
  txp_buf_init(&keys, TXP_MAX_LOCK_KEYS_LEN);
  int rc = 0;
  for (;;) {
    PGresult *image = NULL;
    txp_buf_reset(&keys);
    rc = read_image(r, &image);
    if (rc == 0) rc = image_keys(r, image, &keys);
    PQclear(image);
    if (rc != 0 || keys.len == 0 || b->rehearsal) break; /* a rehearsal asks the coordinator nothing */
    bool lockable = false;
    char holder[RM_XID_MAX] = "";
    rc = rm__lock_query(b->c, b->xid, b->res->id, keys.data, 0, &lockable, holder, sizeof(holder), b->errmsg,
                        sizeof(b->errmsg));
    if (rc != 0 || lockable) break;
    uint64_t now = rm__mono_ms();
    if (b->no_savepoints || now >= deadline) {
      rm__at_err(b, "SELECT ... FOR UPDATE of \"%s\": a row is held by global transaction \"%s\"%s", r->t->name,
                 holder, b->no_savepoints ? " (a branch without statement savepoints cannot wait for it)" : "");
      rc = b->no_savepoints ? RM_E_LOCK_CONFLICT : RM_E_LOCK_WAIT_TIMEOUT;
      break;
    }
    PGresult *sp = PQexec(b->pg, "ROLLBACK TO SAVEPOINT " RM_AT_SAVEPOINT); /* the local locks go, the savepoint stays */
    bool ok = PQresultStatus(sp) == PGRES_COMMAND_OK;
    if (!ok) rc = rm__at_stmt_error(b, "could not let the rows go while waiting for their global lock", sp);
    else PQclear(sp);
    if (!ok) break;
    rc = rm__lock_query(b->c, b->xid, b->res->id, keys.data, (unsigned)(deadline - now), &lockable, holder,
                        sizeof(holder), b->errmsg, sizeof(b->errmsg));
    if (rc == RM_E_LOCK_WAIT_TIMEOUT)
      rm__at_err(b, "SELECT ... FOR UPDATE of \"%s\": timed out waiting for global transaction \"%s\" to release a row",
                 r->t->name, holder);
    if (rc != 0) break;
  }
  txp_buf_free(&keys);
  if (rc != 0) return rc;
  rc = 0;
  r->res = rm__at_run(b, "could not select", r->sql, r->nparams, r->vals, r->types, PGRES_TUPLES_OK, &rc);
  return r->res ? 0 : rc;
}

/* Run a classified change (insert, update, delete) with its images; the
 * items are left in r->items for the caller to record. */
static int run_classified(sql_run_t *r) {
  const rm_sql_stmt_t *s = r->s;
  const char *const *cols = (const char *const *)s->set_cols;
  int rc = rm__at_stmt_table_in(r->b, s->schema, s->table, s->nset, cols, &r->t);
  if (rc) return rc;
  if (s->kind == RM_SQL_SELECT_FOR_UPDATE) return run_select_for_update(r);
  return s->kind == RM_SQL_INSERT ? run_insert(r) : run_change(r);
}

/* The caller's statement, checked and classified (sql/rm_sql.c, cached
 * per resource): 0 with *s set (clear 'own' after), or the code with the
 * branch's message. */
static int classify(rm_branch_t *b, const char *sql, int nparams, const char *const *param_values,
                    const rm_sql_stmt_t **s, rm_sql_stmt_t *own) {
  if (!sql || nparams < 0 || nparams > RM_SQL_MAX_PARAMS || (nparams > 0 && !param_values)) {
    rm__at_err(b, "invalid argument: statement, parameter count or values");
    return RM_E_INVALID;
  }
  char err[sizeof(b->errmsg)];
  int rc = rm_sql_cache_get(b->res->sql, sql, s, own, err, sizeof(err));
  if (rc != 0) {
    rm__at_err(b, "%s", err);
    return rc;
  }
  if (nparams < (*s)->nparams) {
    rm__at_err(b, "the statement uses $%d but %d parameters were given", (*s)->nparams, nparams);
    rm_sql_stmt_clear(own);
    return RM_E_INVALID;
  }
  return 0;
}

static int sql_run(rm_branch_t *b, const char *sql, int nparams, const unsigned int *param_types,
                   const char *const *param_values, int64_t *rows, PGresult **result, bool lock) {
  if (rows) *rows = 0;
  if (result) *result = NULL;
  if (!b) return RM_E_INVALID;
  rm_sql_stmt_t own;
  const rm_sql_stmt_t *s = NULL;
  int rc = classify(b, sql, nparams, param_values, &s, &own);
  if (rc != 0) return rc;
  if (!lock && s->kind != RM_SQL_INSERT) {
    rm__at_err(b, "only an INSERT may go without global locks, not this %s: use rm_at_sql",
               rm_sql_kind_name(s->kind));
    rm_sql_stmt_clear(&own);
    return RM_E_INVALID;
  }
  if ((rc = rm__at_stmt_begin(b)) != 0) {
    rm_sql_stmt_clear(&own);
    return rc;
  }
  sql_run_t r = {.b = b, .s = s, .nparams = nparams, .types = param_types, .vals = param_values, .sql = sql,
                 .user_first = -1};
  if (s->kind == RM_SQL_READ) {
    r.res = rm__at_run(b, "could not read", sql, nparams, param_values, param_types, PGRES_TUPLES_OK, &rc);
  } else {
    rc = run_classified(&r);
  }
  PGresult *mine = NULL;
  if (rc == 0 && result && (s->kind == RM_SQL_READ || s->kind == RM_SQL_SELECT_FOR_UPDATE)) {
    mine = r.res;
    r.res = NULL;
  } else if (rc == 0 && result && r.user_first >= 0 && !(mine = caller_part(b->pg, r.res, r.user_first))) {
    rc = rm__at_oom(b);
  }
  int64_t n = rc != 0 ? 0 : r.delta ? 1 : PQntuples(mine && !r.res ? mine : r.res);
  if (rc == 0 && r.t) {
    rc = rm__at_record_all(b, r.t, r.items, r.nitems, lock); /* consumes the items */
  } else {
    for (size_t i = 0; i < r.nitems; i++) rm_item_clear(&r.items[i]);
  }
  if (rc == 0) {
    if (rows) *rows = n;
    if (result) *result = mine;
  } else {
    PQclear(mine);
  }
  free(r.items);
  PQclear(r.res);
  rm_sql_stmt_clear(&own);
  if (r.released) { /* the delta's read released the savepoint, and changed nothing */
    b->sp_taken = false;
    return rc;
  }
  return rm__at_stmt_end(b, rc);
}

int rm_at_sql(rm_branch_t *b, const char *sql, int nparams, const unsigned int *param_types,
              const char *const *param_values, int64_t *rows, PGresult **result) {
  return sql_run(b, sql, nparams, param_types, param_values, rows, result, true);
}

int rm_at_sql_unlocked(rm_branch_t *b, const char *sql, int nparams, const unsigned int *param_types,
                       const char *const *param_values, int64_t *rows, PGresult **result) {
  return sql_run(b, sql, nparams, param_types, param_values, rows, result, false);
}

int rm_at_sql_deferred(rm_branch_t *b, const char *sql, int nparams, const unsigned int *param_types,
                       const char *const *param_values) {
  if (!b) return RM_E_INVALID;
  rm_sql_stmt_t own;
  const rm_sql_stmt_t *s = NULL;
  int rc = classify(b, sql, nparams, param_values, &s, &own);
  if (rc != 0) return rc;
  if (s->kind != RM_SQL_INSERT || s->nrows != 1 || s->returning_sql) {
    rm__at_err(b, "only an INSERT of one row without RETURNING can be deferred, not this %s%s",
               rm_sql_kind_name(s->kind), s->kind != RM_SQL_INSERT ? "" : s->returning_sql ? " with RETURNING"
                                                                                          : " of several rows");
    rm_sql_stmt_clear(&own);
    return RM_E_NOT_SUPPORTED;
  }
  if (b->dins) {
    rm__at_err(b, "the branch has a deferred insert already (one per branch)");
    rm_sql_stmt_clear(&own);
    return RM_E_INVALID;
  }
  if ((rc = rm__at_stmt_begin(b)) != 0) {
    rm_sql_stmt_clear(&own);
    return rc;
  }
  const rm_table_t *t = NULL;
  rc = rm__at_stmt_table_in(b, s->schema, s->table, s->nset, (const char *const *)s->set_cols, &t);
  if (rc == 0) {
    rm_deferred_insert_t *d = rm__at_deferred_insert_new(t, insert_text(b, s, t), nparams, param_values, param_types);
    if (d && (d->sql = strdup(sql))) b->dins = d;
    else {
      rm__at_deferred_insert_free(d);
      rc = rm__at_oom(b);
    }
  }
  rm_sql_stmt_clear(&own);
  return rm__at_stmt_end(b, rc);
}

int rm__at_sql_deferred_run(rm_branch_t *b, const rm_deferred_insert_t *d) {
  return sql_run(b, d->sql, d->nparams, d->types, (const char *const *)d->vals, NULL, NULL, false);
}
