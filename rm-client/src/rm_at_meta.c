/*
 * rm_at_meta.c - the AT layer's per-client state, its resources
 * (rm_resource_add) and their table metadata cache, read from pg_catalog.
 *
 * NOTES
 *   Everything here is shared by the client's threads: the resource list
 *   under the state's mutex, each resource's metadata under its own (the
 *   lock order is in rm_at.h).  A table published in the cache is
 *   immutable and never freed before its resource, so a statement may hold
 *   it without a lock; a newer reading of the same table goes in front of
 *   it (rm__table_check_cols) instead of replacing it in place.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rm_at.h"

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
  rm__pstmt_free(r->pstmt);
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
  if (!r || !(r->id = strdup(resource_id)) || !(r->conninfo = strdup(conninfo)) ||
      (!rm__unnamed_statements(c) && !(r->pstmt = rm__pstmt_new()))) {
    if (r) {
      free(r->id);
      free(r->conninfo);
    }
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

rm_table_t *rm__table_cached(rm_at_resource_t *r, const char *schema, const char *name) {
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
  rm_table_t *t = rm__table_cached(r, schema, name);
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

int rm__col_index(const rm_table_t *t, const char *name) {
  for (int i = 0; i < t->ncols; i++)
    if (strcmp(t->cols[i].name, name) == 0) return i;
  return -1;
}

/* The table may have changed since it was cached: a missing column makes
 * one reload (see rm_at.h). */
int rm__table_check_cols(rm_at_resource_t *r, PGconn *pg, const rm_table_t **t, int n,
                         const char *const *names, char *err, size_t errlen) {
  for (int pass = 0; pass < 2; pass++) {
    int missing = -1;
    for (int i = 0; i < n && missing < 0; i++)
      if (rm__col_index(*t, names[i]) < 0) missing = i;
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

