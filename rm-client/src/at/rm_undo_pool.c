/*
 * rm_undo_pool.c - what phase two of AT branches stands on: the
 * per-resource pool of the library's own PostgreSQL connections, and the
 * helpers of one phase-two local transaction (rm_undo_int.h): statements
 * with their failure kept, key clauses, the recorded session settings, the
 * reading of an undo row and the classification of a failure.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rm_undo_int.h"

/* ---------------------------------------------------------------- time */

int64_t rm__undo_now_ms(void) { return (int64_t)rm__mono_ms(); }

struct timespec rm__undo_abs_ms(int64_t at) {
  struct timespec ts = {.tv_sec = at / 1000, .tv_nsec = (long)(at % 1000) * 1000000L};
  return ts;
}

rm_at_tuning_t rm__undo_tuning(rm_at_state_t *st) {
  pthread_mutex_lock(&st->mu);
  rm_at_tuning_t t = st->tune;
  pthread_mutex_unlock(&st->mu);
  return t;
}

/* ---------------------------------------------------------------- pool */

static PGconn *conn_open(rm_at_resource_t *r, const rm_at_tuning_t *t, char *err, size_t errlen) {
  char ct[16], set[128];
  snprintf(ct, sizeof(ct), "%u", t->connect_timeout_s);
  /* connect_timeout and application_name come first so that the conninfo
   * may override them; client_encoding comes last: images are UTF-8. */
  const char *kw[] = {"connect_timeout", "application_name", "dbname", "client_encoding", NULL};
  const char *vals[] = {ct, "librmclient", r->conninfo, "UTF8", NULL};
  PGconn *pg = PQconnectdbParams(kw, vals, 1);
  if (!pg) {
    snprintf(err, errlen, "could not connect to resource \"%s\": out of memory", r->id);
    return NULL;
  }
  if (PQstatus(pg) != CONNECTION_OK) {
    char what[300];
    snprintf(what, sizeof(what), "could not connect to resource \"%s\"", r->id);
    rm__pg_error(err, errlen, what, pg, NULL);
    PQfinish(pg);
    return NULL;
  }
  snprintf(set, sizeof(set), "SET lock_timeout = %u; SET statement_timeout = %u", t->lock_timeout_ms,
           t->statement_timeout_ms);
  PGresult *res = PQexec(pg, set);
  if (PQresultStatus(res) != PGRES_COMMAND_OK) {
    rm__pg_error(err, errlen, "could not set up a phase-two session", pg, res);
    PQclear(res);
    PQfinish(pg);
    return NULL;
  }
  PQclear(res);
  return pg;
}

/* rm__undo_pool_get's way of opening a connection (txc_pgpool_ops_t). */
typedef struct pool_open_arg {
  rm_at_resource_t *r;
  const rm_at_tuning_t *t;
} pool_open_arg_t;

static PGconn *pool_open(void *arg, char *err, size_t errlen) {
  const pool_open_arg_t *a = arg;
  return conn_open(a->r, a->t, err, errlen);
}

/* An idle connection broken while idle (its server died, a failover), or
 * on a read-only server, is closed and a new one opened. */
static const txc_pgpool_ops_t pool_ops = {.open = pool_open, .lendable = rm__pg_idle_usable};

/* A connection of 'r''s pool, opened if none is idle and the pool is not
 * full; otherwise waits up to statement_timeout_ms.  0 or RM_E_DB. */
int rm__undo_pool_get(rm_at_resource_t *r, PGconn **out, char *err, size_t errlen) {
  rm_at_tuning_t t = rm__undo_tuning(r->st);
  int max = t.pool_size < 1 ? 1 : t.pool_size > RM_AT_POOL_MAX ? RM_AT_POOL_MAX : (int)t.pool_size;
  pool_open_arg_t arg = {.r = r, .t = &t};
  int got = txc_pgpool_get(&r->pool, max, t.statement_timeout_ms, &pool_ops, &arg, out, err, errlen);
  if (got == TXC_PGPOOL_BUSY)
    snprintf(err, errlen, "no free connection to resource \"%s\" (all %d busy)", r->id, max);
  return got == TXC_PGPOOL_OK ? 0 : RM_E_DB;
}

/* Return 'pg' to the pool; 'bad' (or a broken or unfinished session)
 * closes it instead. */
void rm__undo_pool_put(rm_at_resource_t *r, PGconn *pg, bool bad) { txc_pgpool_put(&r->pool, pg, !bad); }

void rm__undo_pool_close(rm_at_resource_t *r) { txc_pgpool_close_idle(&r->pool); }

/* ------------------------------------- the local transaction of phase two */

/* ROLLBACK what was not committed; u->io.bad if the connection is lost. */
void rm__undo_end(rm_undo_ctx_t *u) {
  if (PQtransactionStatus(u->io.pg) != PQTRANS_IDLE) {
    PGresult *rb = PQexec(u->io.pg, "ROLLBACK");
    if (PQresultStatus(rb) != PGRES_COMMAND_OK) u->io.bad = true;
    PQclear(rb);
  }
  if (PQstatus(u->io.pg) != CONNECTION_OK) u->io.bad = true;
}

/* Run a statement; NULL (message in u->io.err, SQLSTATE in u->io.sqlstate)
 * unless it returns 'want'. */
/* Whether the last failure was an integrity constraint refusing the
 * statement (SQLSTATE class 23): data, not the database, so a retry
 * cannot help. */
bool rm__undo_refused(const rm_undo_ctx_t *u) { return strncmp(u->io.sqlstate, "23", 2) == 0; }

/* Append " WHERE "k1" = $first AND ..." for the columns of 'pk'. */
int rm__undo_where_pk(PGconn *pg, txp_buf_t *sql, const rm_row_t *pk, int first) {
  int rc = 0;
  for (int k = 0; !rc && k < pk->n; k++) {
    char *q = PQescapeIdentifier(pg, pk->names[k], strlen(pk->names[k]));
    char num[32];
    snprintf(num, sizeof(num), " = $%d", first + k);
    rc = q ? txp_buf_append_str(sql, k ? " AND " : " WHERE ") : RM_E_NOMEM;
    if (!rc) rc = txp_buf_append_str(sql, q);
    if (!rc) rc = txp_buf_append_str(sql, num);
    PQfreemem(q);
  }
  return rc;
}

int rm__undo_col_of(const rm_table_t *t, const char *name) {
  for (int i = 0; i < t->ncols; i++)
    if (strcmp(t->cols[i].name, name) == 0) return i;
  return -1;
}


/* SET LOCAL the recorded settings in one statement. */
int rm__undo_apply_settings(rm_undo_ctx_t *u, const rm_ctx_t *ctx, bool relaxed) {
  if (ctx->nsettings == 0 && !relaxed) return RM_UNDO_OK;
  txp_buf_t sql;
  txp_buf_init(&sql, 0);
  const char *params[2 * RM_CTX_MAX_SETTINGS];
  int rc = txp_buf_append_str(&sql, "SELECT ");
  for (int i = 0; !rc && i < ctx->nsettings; i++) {
    char f[64];
    snprintf(f, sizeof(f), "%spg_catalog.set_config($%d, $%d, true)", i ? ", " : "", 2 * i + 1, 2 * i + 2);
    rc = txp_buf_append_str(&sql, f);
    params[2 * i] = ctx->names[i];
    params[2 * i + 1] = ctx->values[i];
  }
  if (!rc && relaxed)
    rc = txp_buf_append_str(&sql, ctx->nsettings ? ", pg_catalog.set_config('synchronous_commit', 'off', true)"
                                                 : "pg_catalog.set_config('synchronous_commit', 'off', true)");
  if (rc) {
    txp_buf_free(&sql);
    snprintf(u->io.err, u->io.errlen, "out of memory");
    return RM_UNDO_DB;
  }
  PGresult *res = rm__pg_io_exec(&u->io, "could not apply the session settings of the undo log", sql.data,
                                 2 * ctx->nsettings, params, NULL, PGRES_TUPLES_OK);
  txp_buf_free(&sql);
  if (!res) return RM_UNDO_DB;
  PQclear(res);
  return RM_UNDO_OK;
}

/*
 * The outcome of a failed item of a commit or rollback: a dirty write, an
 * undo that cannot be read or applied, or a statement an integrity
 * constraint refused are for an operator (unretryable; the message says
 * what to do); anything else (the database down, a lock timeout) is
 * retried.  Returns the branch status, sets *code.
 */
int rm__undo_item_failure(rm_undo_ctx_t *u, int rc, bool commit, int *code) {
  int retry = commit ? TXP_BS_PHASE2_COMMIT_FAILED_RETRYABLE : TXP_BS_PHASE2_ROLLBACK_FAILED_RETRYABLE;
  int fail = commit ? TXP_BS_PHASE2_COMMIT_FAILED_UNRETRYABLE : TXP_BS_PHASE2_ROLLBACK_FAILED_UNRETRYABLE;
  if (rc == RM_UNDO_DIRTY) {
    *code = RM_E_DIRTY_WRITE;
    return fail;
  }
  if (rc == RM_UNDO_DB && rm__undo_refused(u)) {
    size_t l = strlen(u->io.err);
    snprintf(u->io.err + l, u->io.errlen - l,
             " (SQLSTATE %s: the row was changed outside the global transaction; repair it, then re-drive the "
             "global transaction with tcctl)", u->io.sqlstate);
    rc = RM_UNDO_FATAL;
  }
  if (rc == RM_UNDO_FATAL) {
    *code = TXP_EBRANCH_UNRETRYABLE;
    return fail;
  }
  *code = RM_E_DB;
  return retry;
}

/* The context and items of undo row 'row' (SELECT id, log_status,
 * context, rollback_info::text) of branch 'bid'.  0, or -1 with the
 * message set: the row cannot be read, which no retry cures. */
int rm__undo_parse_row(rm_undo_ctx_t *u, const PGresult *row, const char *bid, rm_ctx_t *ctx, rm_item_t **items,
                          size_t *nitems) {
  char why[512];
  if (rm_ctx_parse(PQgetisnull(row, 0, 2) ? NULL : PQgetvalue(row, 0, 2), ctx) == 0 &&
      rm_undo_decode(PQgetisnull(row, 0, 3) ? NULL : PQgetvalue(row, 0, 3), items, nitems, why, sizeof(why)) == 0)
    return 0;
  if (!ctx->version) snprintf(why, sizeof(why), "unknown context \"%.100s\"", PQgetvalue(row, 0, 2));
  snprintf(u->io.err, u->io.errlen, "undo row of branch %s of \"%s\" cannot be read: %s", bid, u->req->xid, why);
  return -1;
}

int rm__undo_item_table(rm_undo_ctx_t *u, const rm_item_t *it, const rm_table_t **t) {
  int rc = rm__table_get(u->r, u->io.pg, it->schema, it->table, t, u->io.err, u->io.errlen);
  if (rc == RM_E_DB || rc == RM_E_NOMEM) {
    if (PQstatus(u->io.pg) != CONNECTION_OK) u->io.bad = true;
    return RM_UNDO_DB;
  }
  return rc != 0 ? RM_UNDO_FATAL : RM_UNDO_OK;
}

/* ------------------------- the local transaction of a commit or rollback */

bool rm__undo_txn_begin(rm_undo_ctx_t *u, rm_undo_txn_t *t, bool commit, int *code) {
  *t = (rm_undo_txn_t){.commit = commit,
                       .status = commit ? TXP_BS_PHASE2_COMMIT_FAILED_RETRYABLE
                                        : TXP_BS_PHASE2_ROLLBACK_FAILED_RETRYABLE};
  snprintf(t->bid, sizeof(t->bid), "%lld", (long long)u->req->branch_id);
  t->key[0] = u->req->xid;
  t->key[1] = t->bid;
  *code = RM_E_DB;
  PGresult *res = rm__pg_io_exec(&u->io, commit ? "could not begin the commit" : "could not begin the rollback",
                                 "BEGIN", 0, NULL, NULL, PGRES_COMMAND_OK);
  PQclear(res);
  return res != NULL;
}

bool rm__undo_txn_load(rm_undo_ctx_t *u, rm_undo_txn_t *t, int *code) {
  if (rm__undo_parse_row(u, t->row, t->bid, &t->ctx, &t->items, &t->nitems) != 0) {
    *code = TXP_EBRANCH_UNRETRYABLE;
    t->status = t->commit ? TXP_BS_PHASE2_COMMIT_FAILED_UNRETRYABLE : TXP_BS_PHASE2_ROLLBACK_FAILED_UNRETRYABLE;
    return false;
  }
  return rm__undo_apply_settings(u, &t->ctx, t->commit) == RM_UNDO_OK;
}

bool rm__undo_txn_commit(rm_undo_ctx_t *u, rm_undo_txn_t *t, const char *what, int *code) {
  PGresult *res = rm__pg_io_exec(&u->io, what, "COMMIT", 0, NULL, NULL, PGRES_COMMAND_OK);
  if (!res) return false;
  PQclear(res);
  *code = 0;
  t->status = t->commit ? TXP_BS_PHASE2_COMMITTED : TXP_BS_PHASE2_ROLLBACKED;
  return true;
}

int rm__undo_txn_end(rm_undo_ctx_t *u, rm_undo_txn_t *t) {
  /* Anything not committed is rolled back: nothing half-done stays. */
  rm__undo_end(u);
  PQclear(t->row);
  t->row = NULL;
  rm_undo_free(t->items, t->nitems);
  t->items = NULL;
  t->nitems = 0;
  rm_ctx_clear(&t->ctx);
  return t->status;
}

