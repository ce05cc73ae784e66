/*
 * rm_at_meta.c - the table metadata cache of the AT layer's resources,
 * read from pg_catalog.
 *
 * NOTES
 *   Each resource's metadata is under its own mutex (the lock order is in
 *   rm_at_int.h).  A table published in the cache is immutable and never freed
 *   before its resource, so a statement may hold it without a lock; a
 *   newer reading of the same table goes in front of it
 *   (rm__table_check_cols) instead of replacing it in place.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rm_at_int.h"

/* Quote 'id' as an identifier into a malloc'd string (NULL on failure). */
static char *quote_ident(PGconn *pg, const char *id) {
  char *q = PQescapeIdentifier(pg, id, strlen(id));
  if (!q) return NULL;
  char *d = strdup(q);
  PQfreemem(q);
  return d;
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

void rm__tables_free(rm_at_resource_t *r) {
  for (rm_table_t *t = r->tables, *n; t; t = n) {
    n = t->next;
    table_free(t);
  }
  r->tables = NULL;
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
 * one reload (see rm_at_int.h). */
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

