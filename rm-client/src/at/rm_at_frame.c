/*
 * rm_at_frame.c - the frame every statement of an AT branch runs in on the
 * caller's connection (rm_at_stmt.c has the statements): its savepoint,
 * the libpq pipelines, the table metadata it uses, and the undo item and
 * lock key it records.  (The session settings the images depend on are
 * written by the undo row's INSERT: RM_AT_CONTEXT_SETTINGS.)
 *
 * NOTES
 *   A statement is rm__at_stmt_begin, rm__at_stmt_table, one or more
 *   rm__at_run, rm__at_record, and always rm__at_stmt_end.  On any
 *   failure the statement rolls back to its savepoint: the row changes of
 *   that call are undone and the caller's transaction stays usable, as if
 *   the call had not been made.  (One exception, an insert whose undo item
 *   cannot be built after it ran: see below.)
 *
 *   Round trips: the SAVEPOINT goes in one libpq pipeline with the
 *   statement's first query (a catalog read on a metadata miss takes it
 *   alone first).  An update's or delete's RELEASE is its own round trip,
 *   because the client still checks the results (one row, the guard) and
 *   may need the savepoint.  An insert's RELEASE goes in the same pipeline
 *   (rm__at_run_released): it either fails, and the savepoint is still
 *   there, or makes its row; only building its undo item can still fail
 *   (out of memory, undo or lock keys over their limits), and then the
 *   branch fails and the caller rolls back.  A deferred delta's check
 *   sends SAVEPOINT, SELECT and RELEASE at once (a read has nothing to
 *   undo).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rm_at_int.h"
#include "txc_pstmt.h"

int rm__at_stmt_error(rm_branch_t *b, const char *what, PGresult *res) {
  rm__pg_error(b->errmsg, sizeof(b->errmsg), what, b->pg, res);
  const char *st = rm__sqlstate(res);
  int rc = strncmp(st, "22", 2) == 0 ? RM_E_INVALID : RM_E_DB;
  PQclear(res);
  return rc;
}

/* Whether a query is worth a named statement: the ones with parameters
 * (the statements on a table, the undo row); not SAVEPOINT, RELEASE and
 * the like. */
static bool worth_naming(const char *sql, int nparams) {
  (void)sql;
  return nparams > 0;
}

int rm__at_pipe_run(rm_branch_t *b, int n, const char *const *sql, const int *nparams,
                    const char *const *const *params, const Oid *const *types, PGresult **res) {
  /* What was sent, in order: each query, after its Prepare when fresh. */
  typedef struct {
    int stmt;
    bool prepare;
  } sent_t;
  typedef char name_t[TXC_PSTMT_NAME_MAX];
  for (int i = 0; i < n; i++) res[i] = NULL;
  sent_t *sent = calloc((size_t)(2 * n), sizeof(sent_t));
  name_t *names = calloc((size_t)n, sizeof(name_t));
  PGresult **prep_err = calloc((size_t)n, sizeof(PGresult *));
  txc_pstmt_cache_t *cache = b->res ? b->res->pstmt : NULL;
  int nsent = 0, rc = 0;
  if (!sent || !names || !prep_err) {
    rm__at_err(b, "out of memory");
    rc = RM_E_NOMEM;
    goto done;
  }
  if (PQpipelineStatus(b->pg) != PQ_PIPELINE_OFF || PQenterPipelineMode(b->pg) != 1) {
    rm__pg_error(b->errmsg, sizeof(b->errmsg), "could not enter pipeline mode", b->pg, NULL);
    rc = RM_E_DB;
    goto done;
  }
  bool ok = true;
  /* The branch's own BEGIN (rm_at_open on an idle connection), in the
   * same round trip as its first query. */
  bool begin = b->begin_pending;
  if (begin) ok = PQsendQueryParams(b->pg, "BEGIN", 0, NULL, NULL, NULL, NULL, 0) == 1;
  for (int i = 0; ok && i < n; i++) {
    int np = nparams ? nparams[i] : 0;
    const Oid *tp = types ? types[i] : NULL;
    const char *const *pp = params ? params[i] : NULL;
    bool fresh = false;
    bool named = cache && worth_naming(sql[i], np) &&
                 txc_pstmt_lookup(cache, b->pg, sql[i], np, tp, names[i], &fresh);
    if (named && fresh) {
      ok = PQsendPrepare(b->pg, names[i], sql[i], np, tp) == 1;
      if (ok) sent[nsent++].stmt = i, sent[nsent - 1].prepare = true;
    }
    if (ok) {
      ok = named ? PQsendQueryPrepared(b->pg, names[i], np, pp, NULL, NULL, 0) == 1
                 : PQsendQueryParams(b->pg, sql[i], np, tp, pp, NULL, NULL, 0) == 1;
      if (ok) sent[nsent++].stmt = i, sent[nsent - 1].prepare = false;
    }
  }
  if (ok) ok = PQpipelineSync(b->pg) == 1;
  if (!ok) rm__pg_error(b->errmsg, sizeof(b->errmsg), "could not send statements", b->pg, NULL);
  /* Read every result of what was sent, then the sync. */
  bool read_ok = true;
  if (ok && begin) {
    PGresult *r = PQgetResult(b->pg), *extra;
    read_ok = r && PQresultStatus(r) == PGRES_COMMAND_OK;
    if (r && !read_ok) rm__pg_error(b->errmsg, sizeof(b->errmsg), "could not begin the branch's transaction", b->pg, r);
    PQclear(r);
    while ((extra = PQgetResult(b->pg)) != NULL) PQclear(extra); /* the NULL that ends it */
  }
  for (int k = 0; ok && read_ok && k < nsent; k++) {
    int i = sent[k].stmt;
    PGresult *r = PQgetResult(b->pg);
    if (!r) {
      read_ok = false;
      break;
    }
    PGresult *extra;
    while ((extra = PQgetResult(b->pg)) != NULL) PQclear(extra); /* the NULL that ends it */
    int np = nparams ? nparams[i] : 0;
    if (sent[k].prepare) {
      bool prepared = PQresultStatus(r) == PGRES_COMMAND_OK;
      txc_pstmt_prepared(cache, b->pg, sql[i], np, types ? types[i] : NULL, names[i], prepared);
      if (prepared) PQclear(r);
      else prep_err[i] = r; /* the query's own result only says "aborted" */
      continue;
    }
    if (strcmp(rm__sqlstate(r), "26000") == 0) txc_pstmt_forget(cache, b->pg); /* DISCARDed */
    if (prep_err[i]) {
      PQclear(r);
      r = prep_err[i];
      prep_err[i] = NULL;
    }
    res[i] = r;
  }
  for (int i = 0; i < n; i++) PQclear(prep_err[i]);
  if (ok && read_ok) {
    PGresult *sync = PQgetResult(b->pg);
    ok = PQresultStatus(sync) == PGRES_PIPELINE_SYNC;
    PQclear(sync);
  }
  if (PQexitPipelineMode(b->pg) != 1) ok = false;
  if (ok && read_ok && begin) b->begin_pending = false;
  if (!ok || !read_ok) {
    if (!b->errmsg[0] || PQstatus(b->pg) != CONNECTION_OK)
      rm__pg_error(b->errmsg, sizeof(b->errmsg), "could not read the results", b->pg, NULL);
    for (int i = 0; i < n; i++) {
      PQclear(res[i]);
      res[i] = NULL;
    }
    rc = RM_E_DB;
  }
done:
  free(sent);
  free(names);
  free(prep_err);
  return rc;
}

PGresult *rm__at_exec(rm_branch_t *b, const char *sql, int n, const char *const *params, const Oid *types) {
  const char *const sqls[1] = {sql};
  const int np[1] = {n};
  const char *const *pp[1] = {params};
  const Oid *tt[1] = {types};
  PGresult *res = NULL;
  if (rm__at_pipe_run(b, 1, sqls, np, pp, tt, &res) != 0) return NULL;
  return res;
}

int rm__at_pending_run(rm_branch_t *b, int n, const char *const *sqls, const int *np,
                       const char *const *const *pp, const Oid *const *tt, PGresult **out) {
  bool want_sp = !b->no_savepoints;
  int pre = want_sp ? 1 : 0, total = pre + n;
  const char *S[4] = {"SAVEPOINT " RM_AT_SAVEPOINT};
  int N[4] = {0};
  const char *const *P[4] = {NULL};
  const Oid *T[4] = {NULL};
  PGresult *R[4] = {NULL};
  for (int i = 0; i < n; i++) {
    S[pre + i] = sqls[i];
    N[pre + i] = np ? np[i] : 0;
    P[pre + i] = pp ? pp[i] : NULL;
    T[pre + i] = tt ? tt[i] : NULL;
    out[i] = NULL;
  }
  b->sp_pending = false;
  int rc = total > 0 ? rm__at_pipe_run(b, total, S, N, P, T, R) : 0;
  if (rc == 0 && want_sp && PQresultStatus(R[0]) != PGRES_COMMAND_OK) {
    rc = rm__at_stmt_error(b, "could not set a savepoint", R[0]);
    R[0] = NULL;
  }
  /* Only a savepoint that was set is rolled back to or released later
   * (ROLLBACK TO an unknown savepoint would abort the transaction). */
  b->sp_taken = want_sp && R[0] != NULL && PQresultStatus(R[0]) == PGRES_COMMAND_OK;
  for (int i = 0; rc == 0 && i < n; i++) {
    out[i] = R[pre + i];
    R[pre + i] = NULL;
  }
  for (int i = 0; i < total; i++) PQclear(R[i]);
  return rc;
}

/* Send the statement's pending start now (before a query that does not go
 * through rm__at_run). */
static int sp_ensure(rm_branch_t *b) {
  if (!b->sp_pending) return 0;
  return rm__at_pending_run(b, 0, NULL, NULL, NULL, NULL, NULL);
}

/* The statement, and with 'release' the RELEASE of its savepoint in the
 * same round trip (see rm__at_run_released). */
static PGresult *run_stmt(rm_branch_t *b, const char *what, const char *sql, int n, const char *const *params,
                          const Oid *types, ExecStatusType want, bool release, int *rc) {
  static const char release_sql[] = "RELEASE SAVEPOINT " RM_AT_SAVEPOINT;
  const char *const sqls[2] = {sql, release_sql};
  const int np[2] = {n, 0};
  const char *const *pp[2] = {params, NULL};
  const Oid *tt[2] = {types, NULL};
  PGresult *out[2] = {NULL, NULL};
  int nq = release && !b->no_savepoints ? 2 : 1;
  if (b->sp_pending) {
    int prc = rm__at_pending_run(b, nq, sqls, np, pp, tt, out);
    if (prc != 0) {
      *rc = prc;
      return NULL;
    }
  } else if (release && b->sp_taken) {
    int prc = rm__at_pipe_run(b, 2, sqls, np, pp, tt, out);
    if (prc != 0) {
      *rc = prc;
      return NULL;
    }
  } else {
    nq = 1;
    if (!(out[0] = rm__at_exec(b, sql, n, params, types))) {
      *rc = RM_E_DB; /* b->errmsg says why */
      return NULL;
    }
  }
  PGresult *res = out[0];
  if (nq == 2) {
    /* After a failed statement the RELEASE did not run (pipeline aborted):
     * the savepoint is still there for the rollback below or at the end. */
    bool released = PQresultStatus(res) == want && PQresultStatus(out[1]) == PGRES_COMMAND_OK;
    if (PQresultStatus(res) == want && !released) {
      PQclear(res);
      *rc = rm__at_stmt_error(b, "could not release the savepoint", out[1]);
      return NULL;
    }
    PQclear(out[1]);
    if (released) {
      b->sp_taken = false;
      b->sp_released = true;
    }
  }
  if (PQresultStatus(res) != want && !b->sp_taken && b->res && b->res->pstmt && txc_pstmt_stale(res))
    txc_pstmt_forget(b->res->pstmt, b->pg); /* no savepoint to retry in: the next branch prepares afresh */
  if (PQresultStatus(res) != want && b->sp_taken && b->res && b->res->pstmt && txc_pstmt_stale(res)) {
    /* Prepared before an ALTER TABLE changed its result columns (SELECT *,
     * RETURNING *), or deallocated by the application: back to the
     * savepoint, and once more with the statements prepared afresh (the
     * savepoint is then released at the statement's end). */
    PQclear(res);
    txc_pstmt_forget(b->res->pstmt, b->pg);
    PGresult *rb = PQexec(b->pg, "ROLLBACK TO SAVEPOINT " RM_AT_SAVEPOINT);
    bool back = PQresultStatus(rb) == PGRES_COMMAND_OK;
    if (!back) {
      *rc = rm__at_stmt_error(b, "could not roll back to the savepoint", rb);
      return NULL;
    }
    PQclear(rb);
    if (!(res = rm__at_exec(b, sql, n, params, types))) {
      *rc = RM_E_DB;
      return NULL;
    }
  }
  if (PQresultStatus(res) == want) return res;
  *rc = rm__at_stmt_error(b, what, res);
  return NULL;
}

PGresult *rm__at_run(rm_branch_t *b, const char *what, const char *sql, int n,
                     const char *const *params, const Oid *types, ExecStatusType want, int *rc) {
  return run_stmt(b, what, sql, n, params, types, want, false, rc);
}

PGresult *rm__at_run_released(rm_branch_t *b, const char *what, const char *sql, int n,
                              const char *const *params, const Oid *types, ExecStatusType want, int *rc) {
  return run_stmt(b, what, sql, n, params, types, want, true, rc);
}

int rm__at_stmt_begin(rm_branch_t *b) {
  if (b->state != RM_BRANCH_OPEN) {
    rm__at_err(b, "branch is %s: no more statements", b->state == RM_BRANCH_PREPARED ? "prepared" : "failed");
    return RM_E_STATE;
  }
  if (b->nitems + b->ndeferred >= RM_AT_MAX_ITEMS) {
    rm__at_err(b, "branch has too many statements (limit %d)", RM_AT_MAX_ITEMS);
    return RM_E_INVALID;
  }
  PGTransactionStatusType ts = PQtransactionStatus(b->pg);
  if (ts != PQTRANS_INTRANS && !(ts == PQTRANS_IDLE && b->begin_pending)) {
    rm__at_err(b, "the connection is %s, not idle in a transaction block",
               ts == PQTRANS_INERROR ? "in a failed transaction"
               : ts == PQTRANS_IDLE  ? "not in a transaction"
                                     : "busy");
    return RM_E_STATE;
  }
  b->sp_pending = true;
  b->sp_taken = false;
  b->sp_released = false;
  return 0;
}

void rm__at_sp_rollback(rm_branch_t *b) {
  PGresult *res = PQexec(b->pg, "ROLLBACK TO SAVEPOINT " RM_AT_SAVEPOINT "; RELEASE SAVEPOINT " RM_AT_SAVEPOINT);
  if (PQresultStatus(res) != PGRES_COMMAND_OK) {
    size_t n = strlen(b->errmsg);
    rm__pg_error(b->errmsg + n, sizeof(b->errmsg) - n, "; and could not roll back to the savepoint",
                 b->pg, res);
  }
  PQclear(res);
}

static int stmt_end(rm_branch_t *b, int rc);

/* The end of every statement: its code, and on failure rm_errmsg() set to
 * the branch's message (which some paths write directly). */
int rm__at_stmt_end(rm_branch_t *b, int rc) {
  rc = stmt_end(b, rc);
  if (rc != 0) rm__errmsg_set("%s", b->errmsg[0] ? b->errmsg : rm_strerror(rc));
  return rc;
}

static int stmt_end(rm_branch_t *b, int rc) {
  b->sp_pending = false;
  if (b->no_savepoints) {
    if (rc != 0) {
      /* Nothing to roll back to: the statement may have changed rows, or
       * aborted the transaction. */
      size_t len = strlen(b->errmsg);
      snprintf(b->errmsg + len, sizeof(b->errmsg) - len,
               "; the branch runs without statement savepoints: roll the transaction back");
      b->state = RM_BRANCH_FAILED;
    }
    b->sp_released = false;
    return rc;
  }
  if (!b->sp_taken) {
    if (rc != 0 && b->sp_released) {
      /* The statement's change is in the transaction with no undo item. */
      size_t len = strlen(b->errmsg);
      snprintf(b->errmsg + len, sizeof(b->errmsg) - len,
               "; the statement's change stays in the transaction: roll it back");
      b->state = RM_BRANCH_FAILED;
    }
    b->sp_released = false;
    return rc; /* no savepoint was set: nothing to release or undo */
  }
  b->sp_taken = false;
  if (rc == 0) {
    PGresult *res = PQexec(b->pg, "RELEASE SAVEPOINT " RM_AT_SAVEPOINT);
    if (PQresultStatus(res) != PGRES_COMMAND_OK) {
      rc = rm__at_stmt_error(b, "could not release the savepoint", res);
      PQclear(PQexec(b->pg, "ROLLBACK TO SAVEPOINT " RM_AT_SAVEPOINT "; RELEASE SAVEPOINT " RM_AT_SAVEPOINT));
      return rc;
    }
    PQclear(res);
    return 0;
  }
  rm__at_sp_rollback(b);
  return rc;
}

/* Split "schema.table" or "table"; checks lengths.  0 or RM_E_INVALID. */
static int split_table(rm_branch_t *b, const char *table, char *schema, char *name) {
  schema[0] = name[0] = '\0';
  const char *dot = table ? strchr(table, '.') : NULL;
  size_t sl = dot ? (size_t)(dot - table) : 0;
  const char *n = dot ? dot + 1 : table;
  if (!table || (dot && (sl == 0 || sl > RM_AT_MAX_NAME)) || strlen(n) == 0 || strlen(n) > RM_AT_MAX_NAME) {
    rm__at_err(b, "invalid table name \"%.80s\"", table ? table : "(null)");
    return RM_E_INVALID;
  }
  if (dot) memcpy(schema, table, sl), schema[sl] = '\0';
  memcpy(name, n, strlen(n) + 1);
  return 0;
}

/* rm__table_check_cols for a statement: a reload of the metadata runs
 * inside the statement's savepoint. */
static int stmt_cols(rm_branch_t *b, const rm_table_t **t, int n, const char *const *names) {
  for (int i = 0; i < n; i++) {
    if (rm__col_index(*t, names[i]) < 0) {
      int rc = sp_ensure(b);
      if (rc != 0) return rc;
      break;
    }
  }
  return rm__table_check_cols(b->res, b->pg, t, n, names, b->errmsg, sizeof(b->errmsg));
}

int rm__at_stmt_table(rm_branch_t *b, const char *table, int n, const char *const *cols, const rm_table_t **t) {
  char schema[RM_AT_MAX_NAME + 1], name[RM_AT_MAX_NAME + 1];
  int rc = split_table(b, table, schema, name);
  if (rc != 0) return rc;
  return rm__at_stmt_table_in(b, schema[0] ? schema : NULL, name, n, cols, t);
}

int rm__at_stmt_table_in(rm_branch_t *b, const char *schema, const char *name, int n, const char *const *cols,
                         const rm_table_t **t) {
  int rc = 0;
  if (!name || !name[0] || strlen(name) > RM_AT_MAX_NAME || (schema && strlen(schema) > RM_AT_MAX_NAME)) {
    rm__at_err(b, "invalid table name \"%.80s\"", name ? name : "(null)");
    return RM_E_INVALID;
  }
  if ((*t = rm__table_cached(b->res, schema, name)) == NULL) {
    if ((rc = sp_ensure(b)) != 0) return rc; /* the catalog query runs inside the savepoint */
    rc = rm__table_get(b->res, b->pg, schema, name, t, b->errmsg, sizeof(b->errmsg));
    if (rc != 0) return rc;
  }
  return stmt_cols(b, t, n, cols);
}

int rm__at_item_encode(rm_branch_t *b, const rm_table_t *t, const rm_item_t *it, json_t **out, size_t *size) {
  /* In the form the undo row is written in (rm_config_t.undo_format): the
   * branch's undo is dumped as it is at prepare, and its size is counted
   * as written. */
  json_t *j = rm__undo_compact(b->c) ? rm_item_to_compact(it) : rm_item_to_json(it);
  if (!j) {
    rm__at_err(b, "could not encode the undo item of \"%s\" (a value is not valid UTF-8?)", t->name);
    return RM_E_NOT_SUPPORTED;
  }
  size_t sz = json_dumpb(j, NULL, 0, JSON_COMPACT);
  if (sz == 0 || b->undo_bytes + sz + 1 > RM_AT_MAX_UNDO_BYTES) {
    json_decref(j);
    rm__at_err(b, "undo images of the branch would exceed %u bytes", (unsigned)RM_AT_MAX_UNDO_BYTES);
    return RM_E_INVALID;
  }
  *out = j;
  *size = sz;
  return 0;
}

int rm__at_record(rm_branch_t *b, const rm_table_t *t, rm_item_t *it, bool lock) {
  int rc = 0;
  size_t old_len = b->lock_keys.len, sz = 0;
  json_t *j = NULL;
  if (lock) {
    const char **vals = calloc((size_t)it->pk->n, sizeof(char *));
    if (!vals) {
      rc = RM_E_NOMEM;
      goto out;
    }
    for (int k = 0; k < it->pk->n; k++) vals[k] = it->pk->vals[k];
    rc = rm_lockkeys_add(&b->lock_keys, b->res->id, t->lockname, vals, it->pk->n);
    free(vals);
    if (rc == RM_E_INVALID)
      rm__at_err(b, "lock key of \"%s\" rejected: key too long, unusable table name, or the branch's "
                 "lock keys exceed %u bytes", t->name, (unsigned)TXP_MAX_LOCK_KEYS_LEN);
    if (rc != 0) goto out;
  }
  if ((rc = rm__at_item_encode(b, t, it, &j, &sz)) != 0) goto out;
  if (json_array_append(b->undo, j) != 0) {
    rc = RM_E_NOMEM;
    goto out;
  }
  b->undo_bytes += sz + 1;
  b->nitems++;
  if (it->op == RM_OP_DELTA) b->has_delta = true;
  if (it->op == RM_OP_COMMIT_DELTA) b->has_commit_delta = true;
out:
  if (rc != 0) {
    b->lock_keys.len = old_len;
    if (b->lock_keys.data) b->lock_keys.data[old_len] = '\0';
  }
  if (rc == RM_E_NOMEM) rm__at_err(b, "out of memory");
  json_decref(j);
  rm_item_clear(it);
  return rc;
}

int rm__at_record_all(rm_branch_t *b, const rm_table_t *t, rm_item_t *its, size_t n, bool lock) {
  size_t old_len = b->lock_keys.len, old_items = b->nitems, old_bytes = b->undo_bytes;
  size_t old_array = json_array_size(b->undo);
  bool old_delta = b->has_delta, old_commit_delta = b->has_commit_delta;
  int rc = 0;
  size_t i = 0;
  for (; i < n && rc == 0; i++) rc = rm__at_record(b, t, &its[i], lock);
  for (; i < n; i++) rm_item_clear(&its[i]);
  if (rc != 0) { /* undo the ones recorded: none of the statement's rows stays */
    while (json_array_size(b->undo) > old_array) json_array_remove(b->undo, json_array_size(b->undo) - 1);
    b->lock_keys.len = old_len;
    if (b->lock_keys.data) b->lock_keys.data[old_len] = '\0';
    b->nitems = old_items;
    b->undo_bytes = old_bytes;
    b->has_delta = old_delta;
    b->has_commit_delta = old_commit_delta;
  }
  return rc;
}

char *rm__at_context(const rm_branch_t *b) {
  return rm_ctx_format(b->has_delta || b->ndeferred > 0, b->has_commit_delta, rm__undo_compact(b->c), 0, NULL, NULL);
}
