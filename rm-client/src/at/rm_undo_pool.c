/*
 * rm_undo_pool.c - what phase two of AT branches stands on: the
 * per-resource pool of the library's own PostgreSQL connections, and the
 * helpers of one phase-two local transaction (rm_undo_int.h): statements
 * with their failure kept, key clauses, the recorded session settings, the
 * reading of an undo row and the classification of a failure.
 */
#include <errno.h>
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

/* A connection of 'r''s pool, opened if none is idle and the pool is not
 * full; otherwise waits up to statement_timeout_ms.  0 or RM_E_DB. */
int rm__undo_pool_get(rm_at_resource_t *r, PGconn **out, char *err, size_t errlen) {
  rm_at_tuning_t t = rm__undo_tuning(r->st);
  int max = t.pool_size < 1 ? 1 : t.pool_size > RM_AT_POOL_MAX ? RM_AT_POOL_MAX : (int)t.pool_size;
  struct timespec deadline = rm__undo_abs_ms(rm__undo_now_ms() + t.statement_timeout_ms);
  pthread_mutex_lock(&r->pool_mu);
  for (;;) {
    if (r->nidle > 0) {
      PGconn *pg = r->idle[--r->nidle];
      pthread_mutex_unlock(&r->pool_mu);
      if (rm__pg_idle_usable(pg)) {
        *out = pg;
        return 0;
      }
      PQfinish(pg); /* broken while idle (its server died, a failover), or read-only: open a new one */
      pthread_mutex_lock(&r->pool_mu);
      r->total--;
      continue;
    }
    if (r->total < max) {
      r->total++;
      pthread_mutex_unlock(&r->pool_mu);
      PGconn *pg = conn_open(r, &t, err, errlen);
      if (pg) {
        *out = pg;
        return 0;
      }
      pthread_mutex_lock(&r->pool_mu);
      r->total--;
      pthread_cond_signal(&r->pool_cv);
      pthread_mutex_unlock(&r->pool_mu);
      return RM_E_DB;
    }
    if (pthread_cond_timedwait(&r->pool_cv, &r->pool_mu, &deadline) == ETIMEDOUT) {
      pthread_mutex_unlock(&r->pool_mu);
      snprintf(err, errlen, "no free connection to resource \"%s\" (all %d busy)", r->id, max);
      return RM_E_DB;
    }
  }
}

/* Return 'pg' to the pool; 'bad' (or a broken or unfinished session)
 * closes it instead. */
void rm__undo_pool_put(rm_at_resource_t *r, PGconn *pg, bool bad) {
  if (!pg) return;
  if (!bad && (PQstatus(pg) != CONNECTION_OK || PQtransactionStatus(pg) != PQTRANS_IDLE)) bad = true;
  pthread_mutex_lock(&r->pool_mu);
  if (!bad && r->nidle < RM_AT_POOL_MAX) {
    r->idle[r->nidle++] = pg;
    pg = NULL;
  } else {
    r->total--;
  }
  pthread_cond_signal(&r->pool_cv);
  pthread_mutex_unlock(&r->pool_mu);
  if (pg) PQfinish(pg);
}

void rm__undo_pool_close(rm_at_resource_t *r) {
  pthread_mutex_lock(&r->pool_mu);
  int n = r->nidle;
  PGconn *idle[RM_AT_POOL_MAX];
  memcpy(idle, r->idle, sizeof(PGconn *) * (size_t)n);
  r->nidle = 0;
  r->total -= n;
  pthread_mutex_unlock(&r->pool_mu);
  for (int i = 0; i < n; i++) PQfinish(idle[i]);
}

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

bool rm__undo_same_row(const rm_item_t *a, const rm_item_t *b) {
  return strcmp(a->schema, b->schema) == 0 && strcmp(a->table, b->table) == 0 && a->pk->n == b->pk->n &&
         rm_row_diff(a->pk, b->pk, NULL, 0) == 0;
}

