/*
 * rm_at.c - AT-mode branches on the caller's PostgreSQL connection:
 * resources, table metadata and the rm_at_* API of rm_client.h.
 *
 * NOTES
 *   Phase one of an AT branch, all inside the caller's local transaction
 *   on the caller's PGconn (the caller ran BEGIN):
 *
 *     1. rm_at_open: check the connection is in a transaction block; no
 *        database call.
 *     2. rm_at_insert / _update / _delete / _update_delta, each inside a
 *        SAVEPOINT of its own: the first one also reads the session settings
 *        that shape the text of the images (TimeZone, DateStyle, ...).
 *          insert: INSERT ... RETURNING *                 (after image)
 *          update: SELECT * ... FOR UPDATE                (before image)
 *                  UPDATE ... RETURNING *                 (after image)
 *          delete: SELECT * ... FOR UPDATE                (before image)
 *                  DELETE
 *          delta:  UPDATE SET col = col + $1 WHERE pk AND (guard)
 *          deferred delta: SELECT 1 ... WHERE pk (the row exists; no lock),
 *                  the UPDATE is kept for prepare
 *        Each adds an undo item and (except delta) the lock key
 *        "table:pk".  On any failure the call rolls back to its savepoint:
 *        the row changes of that call are undone and the caller's
 *        transaction stays usable, as if the call had not been made.
 *        Round trips: the SAVEPOINT goes in one libpq pipeline with the
 *        statement's first query (a catalog read on a metadata miss takes
 *        it alone first); the RELEASE is its own round trip, because what
 *        the client does with the results (images, undo size, lock key)
 *        may still fail and need the savepoint.  A deferred delta's check
 *        sends SAVEPOINT, SELECT and RELEASE at once (a read has nothing
 *        to undo).
 *     3. rm_at_prepare: BranchRegister with the lock keys (the TC makes a
 *        busy lock wait, up to the lock-wait timeout); then the deferred
 *        delta UPDATEs, in one pipeline under one savepoint (a refusing
 *        guard rolls them back and prepare fails with RM_E_GUARD: the
 *        caller rolls back, close reports PhaseOneFailed); then INSERT the
 *        undo_log row in the caller's transaction (after deferred updates,
 *        pipelined behind their RELEASE), so a hot row updated by a
 *        deferred delta stays locked only for the UPDATE, this INSERT and
 *        the caller's COMMIT.  The INSERT runs without
 *        a savepoint on purpose: if it fails (typically on the unique key
 *        because a rollback of this branch already left its guard row: the
 *        anti-suspension fence) the caller's transaction is aborted, so no
 *        COMMIT can make the business change durable.
 *     4. The caller COMMITs (or not) and calls rm_at_close, which reports
 *        PhaseOneFailed to the TC for a registered branch that did not
 *        commit.
 *
 *   Crash windows: dying after 3's register and before the COMMIT leaves a
 *   branch at the TC with no undo row: the global transaction times out,
 *   the rollback finds no undo row and writes the guard (rm_undo.c).  Dying
 *   after the COMMIT: the undo row is durable with the change, whatever
 *   the TC decides is applied to it.
 *
 *   Threads: a branch belongs to one thread at a time (as does the caller's
 *   PGconn); everything shared (resources, metadata) is locked.
 */
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rm_at.h"
#include "txp_failpoint.h"
#include "txp_lockkey.h"
#include "txp_status.h"

#define INT8OID 20
#define SAVEPOINT_NAME "rm_at_stmt"

void (*rm__at_failpoint_after_register)(rm_branch_t *b, int64_t branch_id, void *arg) = NULL;
void *rm__at_failpoint_arg = NULL;

/* Serialises creation of the per-client state (rm__at_state's slot). */
static pthread_mutex_t g_state_mu = PTHREAD_MUTEX_INITIALIZER;

static const rm_at_tuning_t default_tuning = {
  .pool_size = 4,
  .queue_max = 10000,
  .flush_ms = 1000,
  .delete_batch = 1000,
  .sweep_interval_s = 3600,
  .retention_s = 86400,
  .lock_timeout_ms = 5000,
  .statement_timeout_ms = 8000,
  .connect_timeout_s = 5,
};

/* The session settings an image's text depends on; recorded in the undo
 * context and re-applied by the rollback. */
static const char *const image_settings[] = {"TimeZone",           "DateStyle",    "IntervalStyle",
                                             "extra_float_digits", "bytea_output", "lc_monetary"};
#define NSETTINGS (sizeof(image_settings) / sizeof(image_settings[0]))

typedef enum { B_OPEN = 0, B_PREPARED, B_FAILED } branch_state_t;

/* A delta update recorded by rm_at_update_delta_deferred: its UPDATE (and
 * the SELECT that tells a refusing guard from a vanished row), parameters
 * and undo item, run by rm_at_prepare after the branch is registered. */
typedef struct deferred {
  char *update_sql; /* UPDATE ... SET c = c + $1 WHERE pk = $2.. AND (guard) RETURNING c */
  char *exists_sql; /* SELECT 1 FROM t WHERE pk = $1.. */
  int npk;
  char **params;    /* delta, then the pk values */
  json_t *item;     /* the undo item (a delta item, as rm_at_update_delta records) */
  char what[160];   /* "table"."col" for messages */
  long long delta;
} deferred_t;

static void deferred_clear(deferred_t *d);

struct rm_branch {
  rm_client_t *c;
  rm_at_resource_t *res;
  PGconn *pg;
  char xid[RM_XID_MAX];
  branch_state_t state;
  bool registered;
  int64_t branch_id;
  json_t *undo;       /* array of items, in statement order */
  size_t nitems;
  size_t undo_bytes;  /* compact JSON size so far */
  bool has_delta;
  bool sp_pending;    /* the statement's SAVEPOINT goes with its first query */
  bool sp_taken;      /* the statement's SAVEPOINT was set (stmt_end undoes or releases it) */
  struct deferred *deferred; /* rm_at_update_delta_deferred, run by prepare */
  size_t ndeferred, capdeferred;
  txp_buf_t lock_keys;
  bool have_settings;
  char *settings[NSETTINGS];
  char errmsg[1024];
};

/* ------------------------------------------------------------- helpers */

static void set_err(rm_branch_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_err(rm_branch_t *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(b->errmsg, sizeof(b->errmsg), fmt, ap);
  va_end(ap);
}

const char *rm__sqlstate(const PGresult *res) {
  const char *s = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
  return s ? s : "";
}

void rm__pg_error(char *err, size_t errlen, const char *what, PGconn *pg, const PGresult *res) {
  const char *m = res ? PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY) : NULL;
  const char *d = res ? PQresultErrorField(res, PG_DIAG_MESSAGE_DETAIL) : NULL;
  if (!m) m = res ? PQresultErrorMessage(res) : NULL;
  if (!m || !*m) m = pg ? PQerrorMessage(pg) : "no connection";
  if (!m || !*m) m = "unknown error";
  size_t n = strlen(m);
  while (n > 0 && (m[n - 1] == '\n' || m[n - 1] == ' ')) n--;
  if (d) snprintf(err, errlen, "%s: %.*s (%s)", what, (int)n, m, d);
  else snprintf(err, errlen, "%s: %.*s", what, (int)n, m);
}

rm_row_t *rm__row_from_result(const PGresult *res, int row) {
  int n = PQnfields(res);
  rm_row_t *r = rm_row_new(n);
  if (!r) return NULL;
  for (int i = 0; i < n; i++) {
    const char *v = PQgetisnull(res, row, i) ? NULL : PQgetvalue(res, row, i);
    if (rm_row_set(r, i, PQfname(res, i), v) != 0) {
      rm_row_free(r);
      return NULL;
    }
  }
  return r;
}

/* Quote 'id' as an identifier into a malloc'd string (NULL on failure). */
static char *quote_ident(PGconn *pg, const char *id) {
  char *q = PQescapeIdentifier(pg, id, strlen(id));
  if (!q) return NULL;
  char *d = strdup(q);
  PQfreemem(q);
  return d;
}

/* ------------------------------------------------------- state, resources */

static rm_at_state_t *state_peek(rm_client_t *c) {
  rm_at_state_t **slot = rm__at_state(c);
  if (!slot) return NULL;
  pthread_mutex_lock(&g_state_mu);
  rm_at_state_t *s = *slot;
  pthread_mutex_unlock(&g_state_mu);
  return s;
}

rm_at_state_t *rm__at_state_get(rm_client_t *c) {
  rm_at_state_t **slot = rm__at_state(c);
  if (!slot) return NULL;
  pthread_mutex_lock(&g_state_mu);
  rm_at_state_t *s = *slot;
  if (!s && (s = calloc(1, sizeof(*s))) != NULL) {
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, &ca);
    pthread_condattr_destroy(&ca);
    s->c = c;
    s->tune = default_tuning;
    if (rm__undo_start(s) != 0) {
      pthread_cond_destroy(&s->cv);
      pthread_mutex_destroy(&s->mu);
      free(s);
      s = NULL;
    } else {
      *slot = s;
    }
  }
  pthread_mutex_unlock(&g_state_mu);
  return s;
}

rm_at_resource_t *rm__at_resource_find(rm_client_t *c, const char *id) {
  rm_at_state_t *s = state_peek(c);
  if (!s || !id) return NULL;
  pthread_mutex_lock(&s->mu);
  rm_at_resource_t *r = s->resources;
  while (r && strcmp(r->id, id) != 0) r = r->next;
  pthread_mutex_unlock(&s->mu);
  return r;
}

static void table_free(rm_table_t *t) {
  if (!t) return;
  for (int i = 0; t->cols && i < t->ncols; i++) {
    free(t->cols[i].name);
    free(t->cols[i].qname);
  }
  free(t->cols);
  free(t->pk);
  free(t->key_schema);
  free(t->key_name);
  free(t->schema);
  free(t->name);
  free(t->qname);
  free(t->lockname);
  free(t);
}

static void resource_free(rm_at_resource_t *r) {
  rm__undo_resource_free(r);
  for (rm_table_t *t = r->tables, *n; t; t = n) {
    n = t->next;
    table_free(t);
  }
  pthread_mutex_destroy(&r->meta_mu);
  pthread_mutex_destroy(&r->pool_mu);
  pthread_cond_destroy(&r->pool_cv);
  free(r->id);
  free(r->conninfo);
  free(r);
}

void rm__at_free(rm_at_state_t *s) {
  if (!s) return;
  rm__undo_stop(s);
  for (rm_at_resource_t *r = s->resources, *n; r; r = n) {
    n = r->next;
    resource_free(r);
  }
  pthread_cond_destroy(&s->cv);
  pthread_mutex_destroy(&s->mu);
  free(s);
}

/* Resource ids go into a comma-separated RegisterRM field and into the
 * TC's row keys (resource^^^table^^^pk). */
static bool resource_id_ok(const char *id) {
  size_t n = strlen(id);
  if (n == 0 || n > TXP_MAX_RESOURCE_LEN) return false;
  for (size_t i = 0; i < n; i++) {
    unsigned char ch = (unsigned char)id[i];
    if (ch < 0x20 || ch == 0x7f || ch == ',' || ch == '^') return false;
  }
  return true;
}

int rm_resource_add(rm_client_t *c, const char *resource_id, const char *conninfo) {
  if (!c || !resource_id || !conninfo || !resource_id_ok(resource_id)) return RM_E_INVALID;
  char *perr = NULL;
  PQconninfoOption *opts = PQconninfoParse(conninfo, &perr);
  if (!opts) {
    rm__log(c, RM_LOG_ERROR, "could not add resource \"%s\": invalid conninfo: %s", resource_id,
            perr ? perr : "out of memory");
    PQfreemem(perr);
    return perr ? RM_E_INVALID : RM_E_NOMEM;
  }
  PQconninfoFree(opts);
  rm_at_state_t *s = rm__at_state_get(c);
  if (!s) return RM_E_NOMEM;

  rm_at_resource_t *r = calloc(1, sizeof(*r));
  if (!r || !(r->id = strdup(resource_id)) || !(r->conninfo = strdup(conninfo))) {
    if (r) free(r->id);
    free(r);
    return RM_E_NOMEM;
  }
  r->st = s;
  pthread_mutex_init(&r->meta_mu, NULL);
  pthread_mutex_init(&r->pool_mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&r->pool_cv, &ca);
  pthread_condattr_destroy(&ca);

  int rc = 0;
  size_t ids_len = 0;
  pthread_mutex_lock(&s->mu);
  rm_at_resource_t **tail = &s->resources;
  for (; *tail; tail = &(*tail)->next) {
    ids_len += strlen((*tail)->id) + 1;
    if (strcmp((*tail)->id, resource_id) == 0) rc = strcmp((*tail)->conninfo, conninfo) == 0 ? 1 : RM_E_INVALID;
  }
  if (rc == 0 && ids_len + strlen(resource_id) > TXP_MAX_RESOURCE_IDS_LEN) rc = RM_E_INVALID;
  if (rc == 0) {
    *tail = r;
    s->nresources++;
  }
  pthread_mutex_unlock(&s->mu);
  if (rc != 0) {
    resource_free(r);
    if (rc == RM_E_INVALID)
      rm__log(c, RM_LOG_ERROR,
              "could not add resource \"%s\": already added with another conninfo, or the "
              "resource list is full",
              resource_id);
    return rc == 1 ? 0 : rc; /* the same resource again: nothing to do */
  }
  rm__log(c, RM_LOG_INFO, "resource \"%s\" added", resource_id);
  rm__resources_changed(c);
  return 0;
}

int rm__resource_ids(rm_client_t *c, char *out, size_t cap) {
  if (!out || cap == 0) return RM_E_INVALID;
  out[0] = '\0';
  rm_at_state_t *s = state_peek(c);
  if (!s) return 0;
  size_t w = 0;
  int rc = 0;
  pthread_mutex_lock(&s->mu);
  for (rm_at_resource_t *r = s->resources; r; r = r->next) {
    size_t n = strlen(r->id);
    if (w + (w > 0) + n + 1 > cap) {
      rc = RM_E_INVALID;
      break;
    }
    if (w > 0) out[w++] = ',';
    memcpy(out + w, r->id, n + 1);
    w += n;
  }
  pthread_mutex_unlock(&s->mu);
  if (rc != 0) out[0] = '\0';
  return rc != 0 ? rc : (int)w;
}

/* -------------------------------------------------------------- metadata */

/* One row per column of the table, with its position in the primary key
 * (0: not a key column).  $1: schema or NULL (then: the table the search
 * path finds), $2: table name. */
static const char META_SQL[] =
  "WITH t AS ("
  " SELECT c.oid, n.nspname, c.relname"
  " FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
  " WHERE c.relname = $2 AND c.relkind IN ('r', 'p')"
  " AND CASE WHEN $1::text IS NULL THEN pg_catalog.pg_table_is_visible(c.oid)"
  " ELSE n.nspname = $1::text END"
  " LIMIT 1)"
  " SELECT t.nspname, t.relname, a.attname, a.atttypid::int8, a.attgenerated::text,"
  " a.attidentity::text,"
  " COALESCE((SELECT k.n FROM pg_catalog.unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, n)"
  " WHERE k.attnum = a.attnum), 0)"
  " FROM t JOIN pg_catalog.pg_attribute a"
  " ON a.attrelid = t.oid AND a.attnum > 0 AND NOT a.attisdropped"
  " LEFT JOIN pg_catalog.pg_index i ON i.indrelid = t.oid AND i.indisprimary"
  " ORDER BY a.attnum";

static bool str_eq_null(const char *a, const char *b) { return a && b ? strcmp(a, b) == 0 : a == b; }

static rm_table_t *meta_lookup(rm_at_resource_t *r, const char *schema, const char *name) {
  pthread_mutex_lock(&r->meta_mu);
  rm_table_t *t = r->tables;
  while (t && !(str_eq_null(t->key_schema, schema) && strcmp(t->key_name, name) == 0)) t = t->next;
  pthread_mutex_unlock(&r->meta_mu);
  return t;
}

/* Build a table from META_SQL's result; 0, RM_E_NO_PK or RM_E_NOMEM. */
static int meta_build(PGconn *pg, const PGresult *res, const char *schema, const char *name,
                      rm_table_t **out, char *err, size_t errlen) {
  int n = PQntuples(res);
  rm_table_t *t = calloc(1, sizeof(*t));
  if (!t) goto nomem;
  t->ncols = n;
  t->cols = calloc((size_t)n, sizeof(rm_col_t));
  t->pk = calloc((size_t)n, sizeof(int));
  if (!t->cols || !t->pk) goto nomem;
  if ((schema && !(t->key_schema = strdup(schema))) || !(t->key_name = strdup(name))) goto nomem;
  if (!(t->schema = strdup(PQgetvalue(res, 0, 0))) || !(t->name = strdup(PQgetvalue(res, 0, 1))))
    goto nomem;
  for (int i = 0; i < n; i++) {
    rm_col_t *col = &t->cols[i];
    if (!(col->name = strdup(PQgetvalue(res, i, 2))) || !(col->qname = quote_ident(pg, col->name)))
      goto nomem;
    col->type = (unsigned)strtoul(PQgetvalue(res, i, 3), NULL, 10);
    col->generated = PQgetvalue(res, i, 4)[0];
    col->identity = PQgetvalue(res, i, 5)[0];
    int pos = atoi(PQgetvalue(res, i, 6));
    if (pos > 0 && pos <= n) {
      t->pk[pos - 1] = i;
      if (pos > t->npk) t->npk = pos;
    }
  }
  char *qs = quote_ident(pg, t->schema), *qn = quote_ident(pg, t->name);
  if (qs && qn && (t->qname = malloc(strlen(qs) + strlen(qn) + 2)) != NULL)
    sprintf(t->qname, "%s.%s", qs, qn);
  free(qs);
  free(qn);
  if (!t->qname) goto nomem;
  if (strcmp(t->schema, "public") == 0) {
    t->lockname = strdup(t->name);
  } else if ((t->lockname = malloc(strlen(t->schema) + strlen(t->name) + 2)) != NULL) {
    sprintf(t->lockname, "%s.%s", t->schema, t->name);
  }
  if (!t->lockname) goto nomem;
  if (t->npk == 0) {
    snprintf(err, errlen, "table \"%s\".\"%s\" has no primary key: the AT layer cannot handle it",
             t->schema, t->name);
    table_free(t);
    return RM_E_NO_PK;
  }
  *out = t;
  return 0;
nomem:
  table_free(t);
  snprintf(err, errlen, "out of memory");
  return RM_E_NOMEM;
}

/* Read the metadata from pg_catalog and publish it.  'replace': a newer
 * reading goes before the cached one (which stays allocated: other threads
 * may hold it) instead of yielding to it. */
static int table_load(rm_at_resource_t *r, PGconn *pg, const char *schema, const char *name,
                      bool replace, const rm_table_t **out, char *err, size_t errlen);

int rm__table_get(rm_at_resource_t *r, PGconn *pg, const char *schema, const char *name,
                  const rm_table_t **out, char *err, size_t errlen) {
  rm_table_t *t = meta_lookup(r, schema, name);
  if (t) {
    *out = t;
    return 0;
  }
  return table_load(r, pg, schema, name, false, out, err, errlen);
}

static int table_load(rm_at_resource_t *r, PGconn *pg, const char *schema, const char *name,
                      bool replace, const rm_table_t **out, char *err, size_t errlen) {
  rm_table_t *t = NULL;
  const char *params[2] = {schema, name};
  PGresult *res = PQexecParams(pg, META_SQL, 2, NULL, params, NULL, NULL, 0);
  if (PQresultStatus(res) != PGRES_TUPLES_OK) {
    rm__pg_error(err, errlen, "could not read the metadata of a table", pg, res);
    PQclear(res);
    return RM_E_DB;
  }
  if (PQntuples(res) == 0) {
    if (schema) snprintf(err, errlen, "table \"%s\".\"%s\" does not exist", schema, name);
    else snprintf(err, errlen, "table \"%s\" does not exist", name);
    PQclear(res);
    return RM_E_NO_TABLE;
  }
  int rc = meta_build(pg, res, schema, name, &t, err, errlen);
  PQclear(res);
  if (rc != 0) return rc;
  /* Publish, unless another thread was quicker. */
  pthread_mutex_lock(&r->meta_mu);
  rm_table_t *have = r->tables;
  while (!replace && have && !(str_eq_null(have->key_schema, schema) && strcmp(have->key_name, name) == 0))
    have = have->next;
  if (replace || !have) {
    t->next = r->tables;
    r->tables = t;
    have = t;
    t = NULL;
  }
  pthread_mutex_unlock(&r->meta_mu);
  table_free(t);
  *out = have;
  return 0;
}

static int col_index(const rm_table_t *t, const char *name) {
  for (int i = 0; i < t->ncols; i++)
    if (strcmp(t->cols[i].name, name) == 0) return i;
  return -1;
}

/*
 * Check that the 'n' columns 'names' exist in *t; if one does not, the
 * table may have changed since it was cached: read it again once (inside
 * the statement's savepoint) and check again.  0, or RM_E_INVALID with the
 * missing column named in 'err', or the reload's error.
 */
static int check_cols(rm_at_resource_t *r, PGconn *pg, const rm_table_t **t, int n,
                      const char *const *names, char *err, size_t errlen) {
  for (int pass = 0; pass < 2; pass++) {
    int missing = -1;
    for (int i = 0; i < n && missing < 0; i++)
      if (col_index(*t, names[i]) < 0) missing = i;
    if (missing < 0) return 0;
    if (pass == 1) {
      snprintf(err, errlen, "column \"%s\" of table \"%s\" does not exist", names[missing], (*t)->name);
      return RM_E_INVALID;
    }
    int rc = table_load(r, pg, (*t)->key_schema, (*t)->key_name, true, t, err, errlen);
    if (rc != 0) return rc;
  }
  return 0;
}

static bool is_pk_col(const rm_table_t *t, int ci) {
  for (int k = 0; k < t->npk; k++)
    if (t->pk[k] == ci) return true;
  return false;
}

/* ------------------------------------------------------ open and close */

static bool xid_ok(const char *xid) {
  size_t n = xid ? strlen(xid) : 0;
  return n >= 1 && n <= TXP_MAX_XID_LEN;
}

int rm_at_open(rm_client_t *c, const char *xid, const char *resource_id, PGconn *pg,
               rm_branch_t **out) {
  if (out) *out = NULL;
  if (!c || !xid || !resource_id || !pg || !out || !xid_ok(xid)) return RM_E_INVALID;
  rm_at_resource_t *r = rm__at_resource_find(c, resource_id);
  if (!r) {
    rm__log(c, RM_LOG_ERROR, "could not open a branch of \"%s\": resource \"%s\" was not added",
            xid, resource_id);
    return RM_E_INVALID;
  }
  if (PQstatus(pg) != CONNECTION_OK || PQtransactionStatus(pg) != PQTRANS_INTRANS) return RM_E_STATE;
  const char *enc = PQparameterStatus(pg, "client_encoding");
  if (!enc || strcmp(enc, "UTF8") != 0) {
    rm__log(c, RM_LOG_ERROR, "could not open a branch of \"%s\": client_encoding is \"%s\", not UTF8",
            xid, enc ? enc : "?");
    return RM_E_NOT_SUPPORTED;
  }
  rm_branch_t *b = calloc(1, sizeof(*b));
  if (!b || !(b->undo = json_array())) {
    free(b);
    return RM_E_NOMEM;
  }
  b->c = c;
  b->res = r;
  b->pg = pg;
  snprintf(b->xid, sizeof(b->xid), "%s", xid);
  txp_buf_init(&b->lock_keys, TXP_MAX_LOCK_KEYS_LEN);
  *out = b;
  return 0;
}

static void branch_free(rm_branch_t *b) {
  for (size_t i = 0; i < b->ndeferred; i++) deferred_clear(&b->deferred[i]);
  free(b->deferred);
  json_decref(b->undo);
  txp_buf_free(&b->lock_keys);
  for (size_t i = 0; i < NSETTINGS; i++) free(b->settings[i]);
  free(b);
}

int rm_at_close(rm_branch_t *b, bool committed) {
  if (!b) return RM_E_INVALID;
  if (committed) TXP_FAILPOINT("rm.at.after_local_commit");
  int rc = 0;
  if (b->registered && !(committed && b->state == B_PREPARED)) {
    /* Registered but not durable: tell the TC now rather than at the
     * global timeout.  A failure here is harmless (the rollback of the
     * global transaction finds no undo row and writes the guard). */
    rc = rm__branch_report(b->c, b->xid, b->branch_id, TXP_BS_PHASE1_FAILED,
                           b->errmsg[0] ? b->errmsg : "local transaction did not commit");
    if (rc == RM_E_GLOBAL_NOT_FOUND || rc == RM_E_GLOBAL_NOT_ACTIVE) {
      /* Already decided (e.g. the rollback that fenced this branch). */
      rm__log(b->c, RM_LOG_INFO, "branch %lld of \"%s\" not reported as failed: %s",
              (long long)b->branch_id, b->xid, rm_strerror(rc));
      rc = 0;
    } else if (rc != 0)
      rm__log(b->c, RM_LOG_WARN,
              "could not report branch %lld of \"%s\" as failed: %s; the global transaction "
              "will roll it back",
              (long long)b->branch_id, b->xid, rm_strerror(rc));
  } else if (committed && b->state == B_OPEN && b->nitems > 0) {
    rm__log(b->c, RM_LOG_ERROR,
            "branch of \"%s\" on \"%s\" committed %zu statement(s) without rm_at_prepare: they "
            "are not part of the global transaction",
            b->xid, b->res->id, b->nitems);
    rc = RM_E_STATE;
  }
  branch_free(b);
  return rc;
}

const char *rm_at_errmsg(const rm_branch_t *b) { return b ? b->errmsg : ""; }

/* ------------------------------------------------------- statement frame */

/* Map a failed statement to a code: data errors (bad value for the type,
 * value too long, ...) are the caller's input, the rest is the database. */
static int stmt_error(rm_branch_t *b, const char *what, PGresult *res) {
  rm__pg_error(b->errmsg, sizeof(b->errmsg), what, b->pg, res);
  const char *st = rm__sqlstate(res);
  int rc = strncmp(st, "22", 2) == 0 ? RM_E_INVALID : RM_E_DB;
  PQclear(res);
  return rc;
}

/*
 * Run 'n' statements in one round trip (libpq pipeline mode, one sync at
 * the end): res[i] gets the result of statement i (after an error, the
 * later ones are PGRES_PIPELINE_ABORTED; NULL when none came).  Returns 0,
 * or RM_E_DB when the pipeline could not be sent or its results not read
 * in full (the connection is then broken: every res[i] not filled is NULL).
 * The statements run inside the caller's transaction block, as PQexec
 * would run them one by one.
 */
static int pipe_run(rm_branch_t *b, int n, const char *const *sql, const int *nparams,
                    const char *const *const *params, const Oid *const *types, PGresult **res) {
  for (int i = 0; i < n; i++) res[i] = NULL;
  if (PQpipelineStatus(b->pg) != PQ_PIPELINE_OFF || PQenterPipelineMode(b->pg) != 1) {
    rm__pg_error(b->errmsg, sizeof(b->errmsg), "could not enter pipeline mode", b->pg, NULL);
    return RM_E_DB;
  }
  int sent = 0;
  bool ok = true;
  for (; ok && sent < n; sent++)
    ok = PQsendQueryParams(b->pg, sql[sent], nparams ? nparams[sent] : 0, types ? types[sent] : NULL,
                           params ? params[sent] : NULL, NULL, NULL, 0) == 1;
  if (!ok) sent--;
  if (ok) ok = PQpipelineSync(b->pg) == 1;
  if (!ok) rm__pg_error(b->errmsg, sizeof(b->errmsg), "could not send statements", b->pg, NULL);
  /* Read every result of what was sent, then the sync. */
  for (int i = 0; ok && i < sent; i++) {
    res[i] = PQgetResult(b->pg);
    if (!res[i]) {
      ok = false;
      break;
    }
    PGresult *extra;
    while ((extra = PQgetResult(b->pg)) != NULL) PQclear(extra); /* the NULL that ends statement i */
  }
  if (ok) {
    PGresult *sync = PQgetResult(b->pg);
    ok = PQresultStatus(sync) == PGRES_PIPELINE_SYNC;
    PQclear(sync);
  }
  if (PQexitPipelineMode(b->pg) != 1) ok = false;
  if (!ok) {
    if (!b->errmsg[0] || PQstatus(b->pg) != CONNECTION_OK)
      rm__pg_error(b->errmsg, sizeof(b->errmsg), "could not read the results", b->pg, NULL);
    return RM_E_DB;
  }
  return 0;
}

#define SETTINGS_SQL                                                                          \
  "SELECT pg_catalog.current_setting('TimeZone'), pg_catalog.current_setting('DateStyle'),"   \
  " pg_catalog.current_setting('IntervalStyle'), pg_catalog.current_setting('extra_float_digits')," \
  " pg_catalog.current_setting('bytea_output'), pg_catalog.current_setting('lc_monetary')"

/*
 * The statement's pending start (stmt_begin), sent in one round trip with
 * the 'n' (at most 3) statements that follow it: SAVEPOINT, on the first
 * statement of a branch the image settings, then sqls[0..n-1].  0 with
 * out[i] their results, or an error (the start failed; out[] all NULL).
 */
static int pending_run(rm_branch_t *b, int n, const char *const *sqls, const int *np,
                       const char *const *const *pp, const Oid *const *tt, PGresult **out) {
  bool want_settings = !b->have_settings;
  int pre = want_settings ? 2 : 1, total = pre + n;
  const char *S[5] = {"SAVEPOINT " SAVEPOINT_NAME, SETTINGS_SQL};
  int N[5] = {0};
  const char *const *P[5] = {NULL};
  const Oid *T[5] = {NULL};
  PGresult *R[5] = {NULL};
  for (int i = 0; i < n; i++) {
    S[pre + i] = sqls[i];
    N[pre + i] = np ? np[i] : 0;
    P[pre + i] = pp ? pp[i] : NULL;
    T[pre + i] = tt ? tt[i] : NULL;
    out[i] = NULL;
  }
  b->sp_pending = false;
  int rc = pipe_run(b, total, S, N, P, T, R);
  if (rc == 0 && PQresultStatus(R[0]) != PGRES_COMMAND_OK) {
    rc = stmt_error(b, "could not set a savepoint", R[0]);
    R[0] = NULL;
  }
  /* Only a savepoint that was set is rolled back to or released later
   * (ROLLBACK TO an unknown savepoint would abort the transaction). */
  b->sp_taken = R[0] != NULL && PQresultStatus(R[0]) == PGRES_COMMAND_OK;
  if (rc == 0 && want_settings) {
    if (PQresultStatus(R[1]) != PGRES_TUPLES_OK || PQntuples(R[1]) != 1 || PQnfields(R[1]) != (int)NSETTINGS) {
      rc = stmt_error(b, "could not read the session settings", R[1]);
      R[1] = NULL;
    } else {
      for (size_t i = 0; i < NSETTINGS && rc == 0; i++) {
        free(b->settings[i]);
        if (!(b->settings[i] = strdup(PQgetvalue(R[1], 0, (int)i)))) {
          set_err(b, "out of memory");
          rc = RM_E_NOMEM;
        }
      }
      if (rc == 0) b->have_settings = true;
    }
  }
  for (int i = 0; rc == 0 && i < n; i++) {
    out[i] = R[pre + i];
    R[pre + i] = NULL;
  }
  for (int i = 0; i < total; i++) PQclear(R[i]);
  return rc;
}

/* Send the statement's pending start now (before a query that does not go
 * through run()). */
static int sp_ensure(rm_branch_t *b) {
  if (!b->sp_pending) return 0;
  return pending_run(b, 0, NULL, NULL, NULL, NULL, NULL);
}

/* Run 'sql' with text parameters; returns the result on 'want', else NULL
 * with *rc and the message set.  A pending start (stmt_begin) goes in the
 * same round trip, ahead of the statement. */
static PGresult *run(rm_branch_t *b, const char *what, const char *sql, int n,
                     const char *const *params, const Oid *types, ExecStatusType want, int *rc) {
  PGresult *res;
  if (b->sp_pending) {
    const char *const sqls[1] = {sql};
    const int np[1] = {n};
    const char *const *pp[1] = {params};
    const Oid *tt[1] = {types};
    int prc = pending_run(b, 1, sqls, np, pp, tt, &res);
    if (prc != 0) {
      *rc = prc;
      return NULL;
    }
  } else {
    res = PQexecParams(b->pg, sql, n, types, params, NULL, NULL, 0);
  }
  if (PQresultStatus(res) == want) return res;
  *rc = stmt_error(b, what, res);
  return NULL;
}

/*
 * Start a statement: check the transaction.  The SAVEPOINT (and, on the
 * first statement of a branch, the read of the image settings) is only
 * noted: it goes in one round trip with the statement's first query.
 */
static int stmt_begin(rm_branch_t *b) {
  if (b->state != B_OPEN) {
    set_err(b, "branch is %s: no more statements", b->state == B_PREPARED ? "prepared" : "failed");
    return RM_E_STATE;
  }
  if (b->nitems + b->ndeferred >= RM_AT_MAX_ITEMS) {
    set_err(b, "branch has too many statements (limit %d)", RM_AT_MAX_ITEMS);
    return RM_E_INVALID;
  }
  PGTransactionStatusType ts = PQtransactionStatus(b->pg);
  if (ts != PQTRANS_INTRANS) {
    set_err(b, "the connection is %s, not idle in a transaction block",
            ts == PQTRANS_INERROR ? "in a failed transaction" : ts == PQTRANS_IDLE ? "not in a transaction" : "busy");
    return RM_E_STATE;
  }
  b->sp_pending = true;
  b->sp_taken = false;
  return 0;
}

/* End a statement begun by stmt_begin: release on success, roll back to
 * the savepoint on failure (the caller's transaction is then as before). */
static int stmt_end(rm_branch_t *b, int rc) {
  b->sp_pending = false;
  if (!b->sp_taken) return rc; /* no savepoint was set: nothing to release or undo */
  b->sp_taken = false;
  if (rc == 0) {
    PGresult *res = PQexec(b->pg, "RELEASE SAVEPOINT " SAVEPOINT_NAME);
    if (PQresultStatus(res) != PGRES_COMMAND_OK) {
      rc = stmt_error(b, "could not release the savepoint", res);
      PQclear(PQexec(b->pg, "ROLLBACK TO SAVEPOINT " SAVEPOINT_NAME "; RELEASE SAVEPOINT " SAVEPOINT_NAME));
      return rc;
    }
    PQclear(res);
    return 0;
  }
  PGresult *res = PQexec(b->pg, "ROLLBACK TO SAVEPOINT " SAVEPOINT_NAME "; RELEASE SAVEPOINT " SAVEPOINT_NAME);
  if (PQresultStatus(res) != PGRES_COMMAND_OK) {
    size_t n = strlen(b->errmsg);
    rm__pg_error(b->errmsg + n, sizeof(b->errmsg) - n, "; and could not roll back to the savepoint",
                 b->pg, res);
  }
  PQclear(res);
  return rc;
}

/* Split "schema.table" or "table"; checks lengths.  0 or RM_E_INVALID. */
static int split_table(rm_branch_t *b, const char *table, char *schema, char *name) {
  schema[0] = name[0] = '\0';
  const char *dot = table ? strchr(table, '.') : NULL;
  size_t sl = dot ? (size_t)(dot - table) : 0;
  const char *n = dot ? dot + 1 : table;
  if (!table || (dot && (sl == 0 || sl > RM_AT_MAX_NAME)) || strlen(n) == 0 || strlen(n) > RM_AT_MAX_NAME) {
    set_err(b, "invalid table name \"%.80s\"", table ? table : "(null)");
    return RM_E_INVALID;
  }
  if (dot) memcpy(schema, table, sl), schema[sl] = '\0';
  memcpy(name, n, strlen(n) + 1);
  return 0;
}

/* Metadata for a statement (inside its savepoint). */
static int stmt_table(rm_branch_t *b, const char *table, const rm_table_t **t) {
  char schema[RM_AT_MAX_NAME + 1], name[RM_AT_MAX_NAME + 1];
  int rc = split_table(b, table, schema, name);
  if (rc != 0) return rc;
  if ((*t = meta_lookup(b->res, schema[0] ? schema : NULL, name)) != NULL) return 0;
  if ((rc = sp_ensure(b)) != 0) return rc; /* the catalog query runs inside the savepoint */
  return rm__table_get(b->res, b->pg, schema[0] ? schema : NULL, name, t, b->errmsg, sizeof(b->errmsg));
}

/* check_cols for a statement: a reload of the metadata runs inside the
 * statement's savepoint. */
static int stmt_cols(rm_branch_t *b, const rm_table_t **t, int n, const char *const *names) {
  for (int i = 0; i < n; i++) {
    if (col_index(*t, names[i]) < 0) {
      int rc = sp_ensure(b);
      if (rc != 0) return rc;
      break;
    }
  }
  return check_cols(b->res, b->pg, t, n, names, b->errmsg, sizeof(b->errmsg));
}

/* Check 'pk_vals' (t->npk of them, none NULL). */
static int check_pk_vals(rm_branch_t *b, const rm_table_t *t, const char *const *pk_vals) {
  if (!pk_vals) {
    set_err(b, "primary key values are NULL");
    return RM_E_INVALID;
  }
  for (int k = 0; k < t->npk; k++) {
    if (!pk_vals[k]) {
      set_err(b, "primary key column \"%s\" of \"%s\" has a NULL value", t->cols[t->pk[k]].name, t->name);
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

/* The pk of 'row' (by the table's key columns); NULL if a column is
 * missing or on allocation failure. */
static rm_row_t *pk_from_row(const rm_table_t *t, const rm_row_t *row) {
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
static int check_lock_key(rm_branch_t *b, const rm_table_t *t, const char *const *pk_vals) {
  txp_buf_t tmp;
  txp_buf_init(&tmp, TXP_MAX_LOCK_KEYS_LEN);
  int rc = rm_lockkeys_add(&tmp, b->res->id, t->lockname, pk_vals, t->npk);
  txp_buf_free(&tmp);
  if (rc == RM_E_INVALID)
    set_err(b, "the primary key of \"%s\" is too long or the table name unusable for a lock key "
            "(row keys are at most %d bytes)", t->name, TXP_MAX_ROW_KEY_LEN);
  return rc;
}

/*
 * Record a finished statement: the item (consumed) and its lock key.  On
 * failure nothing is recorded (the caller then rolls back the savepoint).
 */
static int record(rm_branch_t *b, const rm_table_t *t, rm_item_t *it, bool lock) {
  int rc = 0;
  size_t old_len = b->lock_keys.len;
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
      set_err(b, "lock key of \"%s\" rejected: key too long, unusable table name, or the branch's "
              "lock keys exceed %u bytes", t->name, (unsigned)TXP_MAX_LOCK_KEYS_LEN);
    if (rc != 0) goto out;
  }
  j = rm_item_to_json(it);
  if (!j) {
    set_err(b, "could not encode the undo image of \"%s\" (a value is not valid UTF-8?)", t->name);
    rc = RM_E_NOT_SUPPORTED;
    goto out;
  }
  size_t sz = json_dumpb(j, NULL, 0, JSON_COMPACT);
  if (sz == 0 || b->undo_bytes + sz + 1 > RM_AT_MAX_UNDO_BYTES) {
    set_err(b, "undo images of the branch would exceed %u bytes", (unsigned)RM_AT_MAX_UNDO_BYTES);
    rc = RM_E_INVALID;
    goto out;
  }
  if (json_array_append(b->undo, j) != 0) {
    rc = RM_E_NOMEM;
    goto out;
  }
  b->undo_bytes += sz + 1;
  b->nitems++;
  if (it->op == RM_OP_DELTA) b->has_delta = true;
out:
  if (rc != 0) {
    b->lock_keys.len = old_len;
    if (b->lock_keys.data) b->lock_keys.data[old_len] = '\0';
  }
  if (rc == RM_E_NOMEM) set_err(b, "out of memory");
  json_decref(j);
  rm_item_clear(it);
  return rc;
}

static int item_init(rm_item_t *it, rm_op_t op, const rm_table_t *t) {
  memset(it, 0, sizeof(*it));
  it->op = op;
  it->schema = strdup(t->schema);
  it->table = strdup(t->name);
  return it->schema && it->table ? 0 : RM_E_NOMEM;
}

/* ------------------------------------------------------------ statements */

static bool arg_ok(rm_branch_t *b, bool ok, const char *what) {
  if (!ok && b) set_err(b, "invalid argument: %s", what);
  return ok;
}

int rm_at_insert(rm_branch_t *b, const char *table, int ncols, const char *const *cols,
                 const char *const *vals) {
  if (!b) return RM_E_INVALID;
  if (!arg_ok(b, table && ncols >= 0 && ncols <= 1600 && (ncols == 0 || (cols && vals)),
              "table, columns or values"))
    return RM_E_INVALID;
  for (int i = 0; i < ncols; i++)
    if (!arg_ok(b, cols[i] != NULL, "a column name is NULL")) return RM_E_INVALID;

  int rc = stmt_begin(b);
  if (rc != 0) return rc;
  const rm_table_t *t = NULL;
  txp_buf_t sql;
  txp_buf_init(&sql, 0);
  PGresult *res = NULL;
  rm_item_t it = {0};
  if ((rc = stmt_table(b, table, &t)) != 0 ||
      (rc = stmt_cols(b, &t, ncols, cols)) != 0)
    goto out;
  rc = txp_buf_append_str(&sql, "INSERT INTO ");
  if (!rc) rc = txp_buf_append_str(&sql, t->qname);
  if (ncols == 0) {
    if (!rc) rc = txp_buf_append_str(&sql, " DEFAULT VALUES");
  } else {
    for (int i = 0; !rc && i < ncols; i++) {
      rc = txp_buf_append_str(&sql, i ? ", " : " (");
      if (!rc) rc = txp_buf_append_str(&sql, t->cols[col_index(t, cols[i])].qname);
    }
    for (int i = 0; !rc && i < ncols; i++) {
      char num[32];
      snprintf(num, sizeof(num), "%s$%d", i ? ", " : ") VALUES (", i + 1);
      rc = txp_buf_append_str(&sql, num);
    }
    if (!rc) rc = txp_buf_append_str(&sql, ")");
  }
  if (!rc) rc = txp_buf_append_str(&sql, " RETURNING *");
  if (rc) {
    rc = RM_E_NOMEM;
    set_err(b, "out of memory");
    goto out;
  }
  if (!(res = run(b, "could not insert", sql.data, ncols, vals, NULL, PGRES_TUPLES_OK, &rc))) goto out;
  if (PQntuples(res) != 1) {
    set_err(b, "insert into \"%s\" returned %d rows, not one", t->name, PQntuples(res));
    rc = RM_E_NOT_ONE_ROW;
    goto out;
  }
  if ((rc = item_init(&it, RM_OP_INSERT, t)) != 0 || !(it.after = rm__row_from_result(res, 0))) {
    rc = RM_E_NOMEM;
    set_err(b, "out of memory");
    goto out;
  }
  if (!(it.pk = pk_from_row(t, it.after))) {
    set_err(b, "the inserted row of \"%s\" has no primary key value", t->name);
    rc = RM_E_INVALID;
    goto out;
  }
  rc = record(b, t, &it, true);
out:
  rm_item_clear(&it);
  PQclear(res);
  txp_buf_free(&sql);
  return stmt_end(b, rc);
}

/* SELECT * FROM t WHERE pk FOR UPDATE: the before image (exactly one row). */
static int lock_before(rm_branch_t *b, const rm_table_t *t, const char *const *pk_vals, rm_row_t **out) {
  txp_buf_t sql;
  txp_buf_init(&sql, 0);
  int rc = txp_buf_append_str(&sql, "SELECT * FROM ");
  if (!rc) rc = txp_buf_append_str(&sql, t->qname);
  if (!rc) rc = append_where_pk(&sql, t, 1);
  if (!rc) rc = txp_buf_append_str(&sql, " FOR UPDATE");
  if (rc) {
    txp_buf_free(&sql);
    set_err(b, "out of memory");
    return RM_E_NOMEM;
  }
  PGresult *res = run(b, "could not lock the row", sql.data, t->npk, pk_vals, NULL, PGRES_TUPLES_OK, &rc);
  txp_buf_free(&sql);
  if (!res) return rc;
  if (PQntuples(res) != 1) {
    set_err(b, "%s row of \"%s\" has the given primary key", PQntuples(res) == 0 ? "no" : "more than one",
            t->name);
    PQclear(res);
    return RM_E_NOT_ONE_ROW;
  }
  *out = rm__row_from_result(res, 0);
  PQclear(res);
  if (!*out) {
    set_err(b, "out of memory");
    return RM_E_NOMEM;
  }
  return 0;
}

int rm_at_update(rm_branch_t *b, const char *table, const char *const *pk_vals, int nset,
                 const char *const *set_cols, const char *const *set_vals) {
  if (!b) return RM_E_INVALID;
  if (!arg_ok(b, table && pk_vals && nset >= 1 && nset <= 1600 && set_cols && set_vals,
              "table, key values or columns"))
    return RM_E_INVALID;
  for (int i = 0; i < nset; i++)
    if (!arg_ok(b, set_cols[i] != NULL, "a column name is NULL")) return RM_E_INVALID;

  int rc = stmt_begin(b);
  if (rc != 0) return rc;
  const rm_table_t *t = NULL;
  txp_buf_t sql;
  txp_buf_init(&sql, 0);
  PGresult *res = NULL;
  const char **params = NULL;
  rm_item_t it = {0};
  if ((rc = stmt_table(b, table, &t)) != 0 ||
      (rc = stmt_cols(b, &t, nset, set_cols)) != 0 ||
      (rc = check_pk_vals(b, t, pk_vals)) != 0 || (rc = check_lock_key(b, t, pk_vals)) != 0)
    goto out;
  for (int i = 0; i < nset; i++) {
    int ci = col_index(t, set_cols[i]);
    if (is_pk_col(t, ci)) {
      set_err(b, "column \"%s\" is part of the primary key of \"%s\": the AT layer cannot update it",
              set_cols[i], t->name);
      rc = RM_E_NOT_SUPPORTED;
      goto out;
    }
  }
  if ((rc = item_init(&it, RM_OP_UPDATE, t)) != 0 || !(it.pk = pk_from_vals(t, pk_vals))) {
    rc = RM_E_NOMEM;
    set_err(b, "out of memory");
    goto out;
  }
  if ((rc = lock_before(b, t, pk_vals, &it.before)) != 0) goto out;

  /* UPDATE t SET c1 = $1, ... WHERE pk = $nset+1 ... RETURNING * */
  params = calloc((size_t)(nset + t->npk), sizeof(char *));
  rc = params ? txp_buf_append_str(&sql, "UPDATE ") : RM_E_NOMEM;
  if (!rc) rc = txp_buf_append_str(&sql, t->qname);
  for (int i = 0; !rc && i < nset; i++) {
    char num[16];
    rc = txp_buf_append_str(&sql, i ? ", " : " SET ");
    if (!rc) rc = txp_buf_append_str(&sql, t->cols[col_index(t, set_cols[i])].qname);
    snprintf(num, sizeof(num), " = $%d", i + 1);
    if (!rc) rc = txp_buf_append_str(&sql, num);
    params[i] = set_vals[i];
  }
  if (!rc) rc = append_where_pk(&sql, t, nset + 1);
  if (!rc) rc = txp_buf_append_str(&sql, " RETURNING *");
  if (rc) {
    rc = RM_E_NOMEM;
    set_err(b, "out of memory");
    goto out;
  }
  for (int k = 0; k < t->npk; k++) params[nset + k] = pk_vals[k];
  if (!(res = run(b, "could not update", sql.data, nset + t->npk, params, NULL, PGRES_TUPLES_OK, &rc)))
    goto out;
  if (PQntuples(res) != 1) {
    set_err(b, "update of \"%s\" touched %d rows, not one", t->name, PQntuples(res));
    rc = RM_E_NOT_ONE_ROW;
    goto out;
  }
  if (!(it.after = rm__row_from_result(res, 0))) {
    rc = RM_E_NOMEM;
    set_err(b, "out of memory");
    goto out;
  }
  rc = record(b, t, &it, true);
out:
  rm_item_clear(&it);
  PQclear(res);
  free(params);
  txp_buf_free(&sql);
  return stmt_end(b, rc);
}

int rm_at_delete(rm_branch_t *b, const char *table, const char *const *pk_vals) {
  if (!b) return RM_E_INVALID;
  if (!arg_ok(b, table && pk_vals, "table or key values")) return RM_E_INVALID;
  int rc = stmt_begin(b);
  if (rc != 0) return rc;
  const rm_table_t *t = NULL;
  txp_buf_t sql;
  txp_buf_init(&sql, 0);
  PGresult *res = NULL;
  rm_item_t it = {0};
  if ((rc = stmt_table(b, table, &t)) != 0 || (rc = check_pk_vals(b, t, pk_vals)) != 0 ||
      (rc = check_lock_key(b, t, pk_vals)) != 0)
    goto out;
  if ((rc = item_init(&it, RM_OP_DELETE, t)) != 0 || !(it.pk = pk_from_vals(t, pk_vals))) {
    rc = RM_E_NOMEM;
    set_err(b, "out of memory");
    goto out;
  }
  if ((rc = lock_before(b, t, pk_vals, &it.before)) != 0) goto out;
  rc = txp_buf_append_str(&sql, "DELETE FROM ");
  if (!rc) rc = txp_buf_append_str(&sql, t->qname);
  if (!rc) rc = append_where_pk(&sql, t, 1);
  if (rc) {
    rc = RM_E_NOMEM;
    set_err(b, "out of memory");
    goto out;
  }
  if (!(res = run(b, "could not delete", sql.data, t->npk, pk_vals, NULL, PGRES_COMMAND_OK, &rc))) goto out;
  if (strcmp(PQcmdTuples(res), "1") != 0) {
    set_err(b, "delete from \"%s\" touched %s rows, not one", t->name, PQcmdTuples(res));
    rc = RM_E_NOT_ONE_ROW;
    goto out;
  }
  rc = record(b, t, &it, true);
out:
  rm_item_clear(&it);
  PQclear(res);
  txp_buf_free(&sql);
  return stmt_end(b, rc);
}

/* Column types a delta may target (integers and numeric). */
static bool delta_type_ok(unsigned type) { return type == 20 || type == 21 || type == 23 || type == 1700; }

int rm_at_update_delta(rm_branch_t *b, const char *table, const char *const *pk_vals,
                       const char *col, long long delta, const char *guard) {
  if (!b) return RM_E_INVALID;
  if (!arg_ok(b, table && pk_vals && col && delta != LLONG_MIN, "table, key values, column or delta"))
    return RM_E_INVALID;
  int rc = stmt_begin(b);
  if (rc != 0) return rc;
  const rm_table_t *t = NULL;
  txp_buf_t sql;
  txp_buf_init(&sql, 0);
  PGresult *res = NULL;
  const char **params = NULL;
  rm_item_t it = {0};
  int ci = -1;
  const char *const dcol[1] = {col};
  if ((rc = stmt_table(b, table, &t)) != 0 ||
      (rc = stmt_cols(b, &t, 1, dcol)) != 0 ||
      (rc = check_pk_vals(b, t, pk_vals)) != 0)
    goto out;
  ci = col_index(t, col);
  if (is_pk_col(t, ci) || t->cols[ci].generated || !delta_type_ok(t->cols[ci].type)) {
    set_err(b, "column \"%s\" of \"%s\" cannot take a delta (it must be an integer or numeric column "
            "outside the primary key)", col, t->name);
    rc = RM_E_NOT_SUPPORTED;
    goto out;
  }
  /* UPDATE t SET c = c + $1 WHERE pk = $2 ... AND (guard) RETURNING c */
  char dbuf[32];
  snprintf(dbuf, sizeof(dbuf), "%lld", delta);
  params = calloc((size_t)(1 + t->npk), sizeof(char *));
  Oid *types = params ? calloc((size_t)(1 + t->npk), sizeof(Oid)) : NULL;
  rc = types ? 0 : RM_E_NOMEM;
  if (!rc) rc = txp_buf_append_str(&sql, "UPDATE ");
  if (!rc) rc = txp_buf_append_str(&sql, t->qname);
  if (!rc) rc = txp_buf_append_str(&sql, " SET ");
  if (!rc) rc = txp_buf_append_str(&sql, t->cols[ci].qname);
  if (!rc) rc = txp_buf_append_str(&sql, " = ");
  if (!rc) rc = txp_buf_append_str(&sql, t->cols[ci].qname);
  if (!rc) rc = txp_buf_append_str(&sql, " + $1");
  if (!rc) rc = append_where_pk(&sql, t, 2);
  if (!rc && guard && *guard) {
    rc = txp_buf_append_str(&sql, " AND (");
    if (!rc) rc = txp_buf_append_str(&sql, guard);
    if (!rc) rc = txp_buf_append_str(&sql, ")");
  }
  if (!rc) rc = txp_buf_append_str(&sql, " RETURNING ");
  if (!rc) rc = txp_buf_append_str(&sql, t->cols[ci].qname);
  if (rc) {
    free(types);
    rc = RM_E_NOMEM;
    set_err(b, "out of memory");
    goto out;
  }
  params[0] = dbuf;
  types[0] = INT8OID;
  for (int k = 0; k < t->npk; k++) params[1 + k] = pk_vals[k];
  res = run(b, "could not update", sql.data, 1 + t->npk, params, types, PGRES_TUPLES_OK, &rc);
  free(types);
  if (!res) goto out;
  if (PQntuples(res) != 1) {
    /* The guard refused, or there is no such row: tell which. */
    bool none = PQntuples(res) == 0;
    PQclear(res);
    res = NULL;
    if (!none) {
      set_err(b, "delta update of \"%s\" touched several rows", t->name);
      rc = RM_E_NOT_ONE_ROW;
      goto out;
    }
    txp_buf_reset(&sql);
    rc = txp_buf_append_str(&sql, "SELECT 1 FROM ");
    if (!rc) rc = txp_buf_append_str(&sql, t->qname);
    if (!rc) rc = append_where_pk(&sql, t, 1);
    if (rc) {
      rc = RM_E_NOMEM;
      set_err(b, "out of memory");
      goto out;
    }
    if (!(res = run(b, "could not read the row", sql.data, t->npk, pk_vals, NULL, PGRES_TUPLES_OK, &rc)))
      goto out;
    if (PQntuples(res) == 0) {
      set_err(b, "no row of \"%s\" has the given primary key", t->name);
      rc = RM_E_NOT_ONE_ROW;
    } else {
      set_err(b, "the guard of the delta update of \"%s\".\"%s\" refused %lld", t->name, col, delta);
      rc = RM_E_GUARD;
    }
    goto out;
  }
  if ((rc = item_init(&it, RM_OP_DELTA, t)) != 0 || !(it.pk = pk_from_vals(t, pk_vals)) ||
      !(it.col = strdup(t->cols[ci].name))) {
    rc = RM_E_NOMEM;
    set_err(b, "out of memory");
    goto out;
  }
  it.delta = delta;
  rc = record(b, t, &it, false);
out:
  rm_item_clear(&it);
  PQclear(res);
  free(params);
  txp_buf_free(&sql);
  return stmt_end(b, rc);
}

/* Append "UPDATE t SET c = c + $1 WHERE pk = $2 ... AND (guard) RETURNING c". */
static int delta_sql(txp_buf_t *sql, const rm_table_t *t, int ci, const char *guard) {
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
  if (!rc) rc = txp_buf_append_str(sql, t->cols[ci].qname);
  return rc;
}

static void deferred_clear(deferred_t *d) {
  free(d->update_sql);
  free(d->exists_sql);
  for (int k = 0; d->params && k <= d->npk; k++) free(d->params[k]);
  free(d->params);
  json_decref(d->item);
  memset(d, 0, sizeof(*d));
}

int rm_at_update_delta_deferred(rm_branch_t *b, const char *table, const char *const *pk_vals,
                                const char *col, long long delta, const char *guard) {
  if (!b) return RM_E_INVALID;
  if (!arg_ok(b, table && pk_vals && col && delta != LLONG_MIN, "table, key values, column or delta"))
    return RM_E_INVALID;
  int rc = stmt_begin(b);
  if (rc != 0) return rc;
  const rm_table_t *t = NULL;
  txp_buf_t sql, esql;
  txp_buf_init(&sql, 0);
  txp_buf_init(&esql, 0);
  PGresult *res = NULL;
  rm_item_t it = {0};
  deferred_t d = {0};
  bool released = false;
  int ci = -1;
  const char *const dcol[1] = {col};
  if ((rc = stmt_table(b, table, &t)) != 0 || (rc = stmt_cols(b, &t, 1, dcol)) != 0 ||
      (rc = check_pk_vals(b, t, pk_vals)) != 0)
    goto out;
  if (b->nitems + b->ndeferred >= RM_AT_MAX_ITEMS) {
    set_err(b, "branch has too many statements (limit %d)", RM_AT_MAX_ITEMS);
    rc = RM_E_INVALID;
    goto out;
  }
  ci = col_index(t, col);
  if (is_pk_col(t, ci) || t->cols[ci].generated || !delta_type_ok(t->cols[ci].type)) {
    set_err(b, "column \"%s\" of \"%s\" cannot take a delta (it must be an integer or numeric column "
            "outside the primary key)", col, t->name);
    rc = RM_E_NOT_SUPPORTED;
    goto out;
  }
  rc = delta_sql(&sql, t, ci, guard);
  if (!rc) rc = txp_buf_append_str(&esql, "SELECT 1 FROM ");
  if (!rc) rc = txp_buf_append_str(&esql, t->qname);
  if (!rc) rc = append_where_pk(&esql, t, 1);
  if (rc) {
    rc = RM_E_NOMEM;
    set_err(b, "out of memory");
    goto out;
  }
  /* The row must exist now (a plain read: no row lock).  When the
   * savepoint is still pending, SAVEPOINT, SELECT and RELEASE go in one
   * round trip: the SELECT changes nothing, so there is nothing to roll
   * back after it. */
  if (b->sp_pending) {
    const char *const sqls[2] = {esql.data, "RELEASE SAVEPOINT " SAVEPOINT_NAME};
    const int np[2] = {t->npk, 0};
    const char *const *pp[2] = {pk_vals, NULL};
    PGresult *r2[2];
    if ((rc = pending_run(b, 2, sqls, np, pp, NULL, r2)) != 0) goto out;
    if (PQresultStatus(r2[0]) != PGRES_TUPLES_OK) {
      rc = stmt_error(b, "could not read the row", r2[0]);
      r2[0] = NULL;
    } else if (PQresultStatus(r2[1]) != PGRES_COMMAND_OK) {
      rc = stmt_error(b, "could not release the savepoint", r2[1]);
      r2[1] = NULL;
    } else {
      res = r2[0];
      r2[0] = NULL;
      released = true;
    }
    PQclear(r2[0]);
    PQclear(r2[1]);
    if (rc != 0) goto out;
  } else if (!(res = run(b, "could not read the row", esql.data, t->npk, pk_vals, NULL, PGRES_TUPLES_OK, &rc))) {
    goto out;
  }
  if (PQntuples(res) != 1) {
    set_err(b, "%s row of \"%s\" has the given primary key", PQntuples(res) == 0 ? "no" : "more than one",
            t->name);
    rc = RM_E_NOT_ONE_ROW;
    goto out;
  }
  /* The undo item, as rm_at_update_delta records it; it joins the undo
   * log when prepare has run the UPDATE (statement order = undo order). */
  if ((rc = item_init(&it, RM_OP_DELTA, t)) != 0 || !(it.pk = pk_from_vals(t, pk_vals)) ||
      !(it.col = strdup(t->cols[ci].name))) {
    rc = RM_E_NOMEM;
    set_err(b, "out of memory");
    goto out;
  }
  it.delta = delta;
  if (!(d.item = rm_item_to_json(&it))) {
    set_err(b, "could not encode the undo item of \"%s\" (a value is not valid UTF-8?)", t->name);
    rc = RM_E_NOT_SUPPORTED;
    goto out;
  }
  size_t sz = json_dumpb(d.item, NULL, 0, JSON_COMPACT);
  if (sz == 0 || b->undo_bytes + sz + 1 > RM_AT_MAX_UNDO_BYTES) {
    set_err(b, "undo images of the branch would exceed %u bytes", (unsigned)RM_AT_MAX_UNDO_BYTES);
    rc = RM_E_INVALID;
    goto out;
  }
  char dbuf[32];
  snprintf(dbuf, sizeof(dbuf), "%lld", delta);
  d.npk = t->npk;
  d.delta = delta;
  snprintf(d.what, sizeof(d.what), "\"%.60s\".\"%.60s\"", t->name, t->cols[ci].name);
  d.update_sql = strdup(sql.data);
  d.exists_sql = strdup(esql.data);
  d.params = calloc((size_t)(1 + t->npk), sizeof(char *));
  bool ok = d.update_sql && d.exists_sql && d.params && (d.params[0] = strdup(dbuf)) != NULL;
  for (int k = 0; ok && k < t->npk; k++) ok = (d.params[1 + k] = strdup(pk_vals[k])) != NULL;
  if (ok && b->ndeferred == b->capdeferred) {
    size_t cap = b->capdeferred ? b->capdeferred * 2 : 4;
    deferred_t *nd = realloc(b->deferred, cap * sizeof(*nd));
    if (nd) {
      b->deferred = nd;
      b->capdeferred = cap;
    } else {
      ok = false;
    }
  }
  if (!ok) {
    rc = RM_E_NOMEM;
    set_err(b, "out of memory");
    goto out;
  }
  b->deferred[b->ndeferred++] = d;
  memset(&d, 0, sizeof(d));
  b->undo_bytes += sz + 1;
out:
  deferred_clear(&d);
  rm_item_clear(&it);
  PQclear(res);
  txp_buf_free(&sql);
  txp_buf_free(&esql);
  if (released) { /* the savepoint is gone and the SELECT changed nothing */
    b->sp_taken = false;
    return rc;
  }
  return stmt_end(b, rc);
}

/*
 * Prepare, after the registration: run the deferred delta UPDATEs under
 * one savepoint, in one round trip.  0, or the code with the savepoint
 * rolled back (the transaction as it was before prepare, still usable):
 * RM_E_GUARD, RM_E_NOT_ONE_ROW (the row is gone), RM_E_DB, RM_E_INVALID.
 * On success the savepoint is left for the caller to release.
 */
static int run_deferred(rm_branch_t *b) {
  size_t n = b->ndeferred + 1;
  const char **sqls = calloc(n, sizeof(char *));
  int *np = calloc(n, sizeof(int));
  const char *const **pp = calloc(n, sizeof(char **));
  const Oid **tt = calloc(n, sizeof(Oid *));
  PGresult **res = calloc(n, sizeof(PGresult *));
  /* Oids of the parameters: the delta is int8, the key values untyped (a
   * primary key has at most INDEX_MAX_KEYS = 32 columns). */
  static const Oid int8_first[1 + 32] = {INT8OID};
  int rc = sqls && np && pp && tt && res ? 0 : RM_E_NOMEM;
  if (!rc) sqls[0] = "SAVEPOINT " SAVEPOINT_NAME;
  for (size_t i = 0; !rc && i < b->ndeferred; i++) {
    deferred_t *d = &b->deferred[i];
    sqls[1 + i] = d->update_sql;
    np[1 + i] = 1 + d->npk;
    pp[1 + i] = (const char *const *)d->params;
    tt[1 + i] = d->npk <= 32 ? int8_first : NULL;
  }
  if (rc) {
    set_err(b, "out of memory");
    goto done;
  }
  if ((rc = pipe_run(b, (int)n, sqls, np, pp, tt, res)) != 0) goto done;
  if (PQresultStatus(res[0]) != PGRES_COMMAND_OK) {
    rc = stmt_error(b, "could not set a savepoint", res[0]);
    res[0] = NULL;
    goto done;
  }
  for (size_t i = 0; i < b->ndeferred; i++) {
    PGresult *r = res[1 + i];
    deferred_t *d = &b->deferred[i];
    if (PQresultStatus(r) != PGRES_TUPLES_OK) {
      char what[200];
      snprintf(what, sizeof(what), "could not run the delta update of %s", d->what);
      rc = stmt_error(b, what, r);
      res[1 + i] = NULL;
      break;
    }
    if (PQntuples(r) != 1) {
      if (PQntuples(r) > 1) {
        set_err(b, "delta update of %s touched several rows", d->what);
        rc = RM_E_NOT_ONE_ROW;
        break;
      }
      /* Refused, or the row is gone: tell which, after the rollback. */
      PGresult *rb = PQexec(b->pg, "ROLLBACK TO SAVEPOINT " SAVEPOINT_NAME);
      PQclear(rb);
      PGresult *e = PQexecParams(b->pg, d->exists_sql, d->npk, NULL, (const char *const *)d->params + 1, NULL,
                                 NULL, 0);
      if (PQresultStatus(e) != PGRES_TUPLES_OK) {
        rc = stmt_error(b, "could not read the row", e);
      } else {
        if (PQntuples(e) == 0) {
          set_err(b, "the row of the deferred delta update of %s is gone", d->what);
          rc = RM_E_NOT_ONE_ROW;
        } else {
          set_err(b, "the guard of the deferred delta update of %s refused %lld", d->what, d->delta);
          rc = RM_E_GUARD;
        }
        PQclear(e);
      }
      break;
    }
  }
done:
  if (rc != 0 && res && res[0] && PQresultStatus(res[0]) == PGRES_COMMAND_OK) {
    /* Undo the deferred updates: the transaction as before prepare. */
    PGresult *r = PQexec(b->pg, "ROLLBACK TO SAVEPOINT " SAVEPOINT_NAME "; RELEASE SAVEPOINT " SAVEPOINT_NAME);
    if (PQresultStatus(r) != PGRES_COMMAND_OK) {
      size_t len = strlen(b->errmsg);
      rm__pg_error(b->errmsg + len, sizeof(b->errmsg) - len, "; and could not roll back to the savepoint", b->pg, r);
    }
    PQclear(r);
  }
  for (size_t i = 0; res && i < n; i++) PQclear(res[i]);
  free(res);
  free(tt);
  free(pp);
  free(np);
  free(sqls);
  return rc;
}

/* --------------------------------------------------------------- prepare */

int rm_at_prepare(rm_branch_t *b, int64_t *branch_id) {
  if (!b) return RM_E_INVALID;
  if (b->state != B_OPEN) {
    set_err(b, "branch is already %s", b->state == B_PREPARED ? "prepared" : "failed");
    return RM_E_STATE;
  }
  if (b->nitems + b->ndeferred == 0) {
    set_err(b, "branch has no statement to prepare");
    return RM_E_STATE;
  }
  if (PQtransactionStatus(b->pg) != PQTRANS_INTRANS) {
    set_err(b, "the connection is not idle in a transaction block");
    return RM_E_STATE;
  }
  /* The undo items of the deferred deltas go last: prepare runs them
   * after every other statement of the branch. */
  for (size_t i = 0; i < b->ndeferred; i++) {
    if (json_array_append(b->undo, b->deferred[i].item) != 0) {
      set_err(b, "out of memory");
      b->state = B_FAILED;
      return RM_E_NOMEM;
    }
  }
  char *undo = json_dumps(b->undo, JSON_COMPACT);
  char *ctx = rm_ctx_format(b->has_delta || b->ndeferred > 0, (int)NSETTINGS, image_settings,
                            (const char *const *)b->settings);
  if (!undo || !ctx) {
    free(undo);
    free(ctx);
    set_err(b, "out of memory");
    if (b->ndeferred > 0) b->state = B_FAILED; /* their items are in b->undo now: no retry */
    return RM_E_NOMEM;
  }

  /* 1. Register (the TC takes the global row locks, waiting if busy). */
  int64_t bid = 0;
  const char *keys = b->lock_keys.len ? b->lock_keys.data : NULL;
  int rc = rm__branch_register(b->c, b->xid, b->res->id, keys, NULL, rm__lock_wait_ms(b->c), &bid,
                               b->errmsg, sizeof(b->errmsg));
  if (rc != 0) {
    if (!b->errmsg[0]) set_err(b, "could not register the branch: %s", rm_strerror(rc));
    b->state = B_FAILED;
    free(undo);
    free(ctx);
    return rc;
  }
  b->registered = true;
  b->branch_id = bid;
  if (rm__at_failpoint_after_register) rm__at_failpoint_after_register(b, bid, rm__at_failpoint_arg);
  TXP_FAILPOINT("rm.at.after_register");

  /* 2. The deferred delta updates (a delta needs no lock key, so the
   * registration did not wait for them): the hot rows they lock are held
   * from here to the caller's COMMIT only. */
  if (b->ndeferred > 0 && (rc = run_deferred(b)) != 0) {
    b->state = B_FAILED;
    free(undo);
    free(ctx);
    return rc;
  }

  /* 3. The undo row, in the caller's transaction and deliberately without
   * a savepoint: if it fails, the transaction is aborted and cannot commit.
   * After deferred updates, their savepoint is released in the same round
   * trip. */
  char bidbuf[32];
  snprintf(bidbuf, sizeof(bidbuf), "%lld", (long long)bid);
  const char *params[4] = {b->xid, bidbuf, ctx, undo};
  static const char insert_sql[] = "INSERT INTO undo_log (xid, branch_id, context, rollback_info, log_status)"
                                   " VALUES ($1, $2, $3, $4::jsonb, 0)";
  PGresult *res = NULL;
  if (b->ndeferred > 0) {
    const char *const sqls[2] = {"RELEASE SAVEPOINT " SAVEPOINT_NAME, insert_sql};
    const int np[2] = {0, 4};
    const char *const *pp[2] = {NULL, params};
    PGresult *r2[2];
    rc = pipe_run(b, 2, sqls, np, pp, NULL, r2);
    if (rc == 0 && PQresultStatus(r2[0]) != PGRES_COMMAND_OK) {
      res = r2[0]; /* reported below as the failure (the INSERT did not run) */
      PQclear(r2[1]);
    } else {
      PQclear(r2[0]);
      res = r2[1];
    }
  } else {
    res = PQexecParams(b->pg, insert_sql, 4, NULL, params, NULL, NULL, 0);
  }
  free(undo);
  free(ctx);
  if (PQresultStatus(res) != PGRES_COMMAND_OK) {
    if (strcmp(rm__sqlstate(res), "23505") == 0) {
      set_err(b, "branch %lld of \"%s\" was already rolled back (its guard row is in undo_log): "
              "the local transaction must roll back", (long long)bid, b->xid);
      rc = RM_E_GLOBAL_NOT_ACTIVE;
    } else {
      rm__pg_error(b->errmsg, sizeof(b->errmsg), "could not write the undo log", b->pg, res);
      rc = RM_E_DB;
    }
    PQclear(res);
    b->state = B_FAILED;
    return rc;
  }
  PQclear(res);
  b->state = B_PREPARED;
  if (branch_id) *branch_id = bid;
  return 0;
}
