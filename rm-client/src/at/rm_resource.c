/*
 * rm_resource.c - the AT layer's per-client state and its resources
 * (rm_resource_add), and the table of calls the core makes into the layer
 * (rm_rm_ops_t, rm_internal.h): phase two, the quick commit, the resource
 * ids for RegisterRM, the end.
 *
 * NOTES
 *   The state is created by the first rm_resource_add (or tuning) through
 *   the core's rm__rm_get, which serialises the creation on the client;
 *   the resource list is append-only under the state's mutex, so a
 *   resource pointer stays valid for the life of the client.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rm_undo_int.h"

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

/* ------------------------------------------------------- state, resources */

static rm_at_state_t *state_peek(rm_client_t *c) { return rm__rm_peek(c); }

/* A new state with its deleter running (rm__rm_get's 'create'). */
static void *state_create(rm_client_t *c) {
  rm_at_state_t *s = calloc(1, sizeof(*s));
  if (!s) return NULL;
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
    return NULL;
  }
  return s;
}

/* What the core calls (rm_internal.h): phase two, the quick commit, the
 * resource ids and the end, each given the state. */
static int ops_phase2(void *rm, const rm_phase2_req_t *req, int *code, char *errmsg, size_t errlen) {
  return rm__at_phase2(((rm_at_state_t *)rm)->c, req, code, errmsg, errlen);
}
static bool ops_commit_queued(void *rm, const rm_phase2_req_t *req) {
  return rm__at_commit_queued(((rm_at_state_t *)rm)->c, req);
}
static int ops_resource_ids(void *rm, char *out, size_t cap) {
  return rm__resource_ids(((rm_at_state_t *)rm)->c, out, cap);
}
static void ops_node_lost(void *rm) { rm__undo_resolve_soon(rm); }
static void ops_free(void *rm) { rm__at_free(rm); }

static const rm_rm_ops_t at_ops = {ops_phase2, ops_commit_queued, ops_resource_ids, ops_node_lost, ops_free};

rm_at_state_t *rm__at_state_get(rm_client_t *c) { return rm__rm_get(c, &at_ops, state_create); }

rm_at_resource_t *rm__at_resource_find(rm_client_t *c, const char *id) {
  rm_at_state_t *s = state_peek(c);
  if (!s || !id) return NULL;
  pthread_mutex_lock(&s->mu);
  rm_at_resource_t *r = s->resources;
  while (r && strcmp(r->id, id) != 0) r = r->next;
  pthread_mutex_unlock(&s->mu);
  return r;
}

static void resource_free(rm_at_resource_t *r) {
  for (int t = 0; t < TXP_BT__MAX; t++)
    if (r->modes[t] && r->modes[t]->free_arg) r->modes[t]->free_arg(r->mode_args[t]);
  rm__undo_resource_free(r);
  rm__tables_free(r);
  pthread_mutex_destroy(&r->meta_mu);
  txc_pgpool_destroy(&r->pool);
  txc_pstmt_free(r->pstmt);
  rm_sql_cache_free(r->sql);
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

/* Whether 'resource_id' was added before with 'conninfo': 1 (the same), a
 * code (another conninfo), 0 (not yet). */
static int already_added(rm_at_state_t *s, const char *resource_id, const char *conninfo) {
  int rc = 0;
  pthread_mutex_lock(&s->mu);
  for (rm_at_resource_t *r = s->resources; r; r = r->next)
    if (strcmp(r->id, resource_id) == 0) rc = strcmp(r->conninfo, conninfo) == 0 ? 1 : RM_E_INVALID;
  pthread_mutex_unlock(&s->mu);
  return rc;
}

/*
 * Check that the database of 'conninfo' can serve AT branches: it answers,
 * it has the undo_log table with the columns this library writes, and the
 * "rm" schema set db-migrate recorded there (schema_version, when the
 * table was made by db-migrate) is at least RM_UNDO_SCHEMA_VERSION.  0, or
 * a code with rm_errmsg() set and the line logged.  Without this check the
 * first branch would fail at prepare, after its registration, and leave a
 * rollback that retries until someone migrates the database.
 */
static int check_database(rm_client_t *c, rm_at_state_t *s, const char *id, const char *conninfo) {
  rm_at_tuning_t t = rm__undo_tuning(s);
  char ct[16], err[RM_ERRMSG_MAX];
  snprintf(ct, sizeof(ct), "%u", t.connect_timeout_s);
  const char *kw[] = {"connect_timeout", "application_name", "dbname", NULL};
  const char *vals[] = {ct, "librmclient", conninfo, NULL};
  PGconn *pg = PQconnectdbParams(kw, vals, 1);
  PGresult *res = NULL;
  int rc = 0;
  if (!pg) {
    rc = rm__fail(RM_E_NOMEM, "could not add resource \"%s\": out of memory", id);
    goto out;
  }
  if (PQstatus(pg) != CONNECTION_OK) {
    char what[320];
    snprintf(what, sizeof(what), "could not add resource \"%s\": could not connect to its database", id);
    rm__pg_error(err, sizeof(err), what, pg, NULL);
    rc = rm__fail(RM_E_DB, "%s", err);
    goto out;
  }
  const char *db = PQdb(pg);
  res = PQexec(pg,
               "SELECT (SELECT count(*) FROM pg_catalog.pg_attribute"
               "         WHERE attrelid = to_regclass('undo_log') AND NOT attisdropped"
               "           AND attname IN ('id', 'branch_id', 'xid', 'context', 'rollback_info',"
               "                           'log_status', 'log_created', 'log_modified')),"
               "       to_regclass('undo_log') IS NOT NULL, to_regclass('schema_version') IS NOT NULL");
  if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1) {
    rm__pg_error(err, sizeof(err), "could not look for the undo_log table", pg, res);
    rc = rm__fail(RM_E_DB, "could not add resource \"%s\": %s", id, err);
    goto out;
  }
  bool has_table = PQgetvalue(res, 0, 1)[0] == 't', has_versions = PQgetvalue(res, 0, 2)[0] == 't';
  int ncols = atoi(PQgetvalue(res, 0, 0));
  PQclear(res);
  res = NULL;
  if (!has_table) {
    rc = rm__fail(RM_E_NO_TABLE,
                  "could not add resource \"%s\": database \"%s\" has no undo_log table (on its search_path); "
                  "apply the RM schema first: `txc-db-migrate 'CONNINFO' rm` (scripts/db-migrate in the source "
                  "tree), with this resource's conninfo",
                  id, db);
    goto out;
  }
  long version = -1;
  if (has_versions) {
    res = PQexec(pg, "SELECT coalesce(max(version), -1) FROM schema_version WHERE set_name = 'rm'");
    if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1) {
      rm__pg_error(err, sizeof(err), "could not read schema_version", pg, res);
      rc = rm__fail(RM_E_DB, "could not add resource \"%s\": %s", id, err);
      goto out;
    }
    version = atol(PQgetvalue(res, 0, 0));
  }
  /* Recorded by db-migrate: the version decides; made by hand (no record):
   * the columns do. */
  if ((version >= 0 && version < RM_UNDO_SCHEMA_VERSION) || (version < 0 && ncols != 8)) {
    char have[64];
    if (version >= 0) snprintf(have, sizeof(have), "at version %ld", version);
    else snprintf(have, sizeof(have), "not the one this library writes");
    rc = rm__fail(RM_E_NOT_SUPPORTED,
                  "could not add resource \"%s\": the undo_log table of database \"%s\" is %s (this library "
                  "needs version %d of the \"rm\" schema set): run `txc-db-migrate 'CONNINFO' rm` "
                  "(scripts/db-migrate in the source tree), with this resource's conninfo",
                  id, db, have, RM_UNDO_SCHEMA_VERSION);
  }
out:
  if (rc != 0) rm__log(c, RM_LOG_ERROR, "%s", rm_errmsg());
  PQclear(res);
  PQfinish(pg);
  return rc;
}

int rm_resource_add(rm_client_t *c, const char *resource_id, const char *conninfo) {
  if (!c || !resource_id || !conninfo)
    return rm__fail(RM_E_INVALID, "could not add a resource: the client, the resource id or the conninfo is NULL");
  if (!resource_id_ok(resource_id))
    return rm__fail(RM_E_INVALID,
                    "could not add resource \"%.256s\": a resource id is 1 to %d bytes without ',', '^' or "
                    "control characters", resource_id, TXP_MAX_RESOURCE_LEN);
  char *perr = NULL;
  PQconninfoOption *opts = PQconninfoParse(conninfo, &perr);
  if (!opts) {
    rm__fail(perr ? RM_E_INVALID : RM_E_NOMEM, "could not add resource \"%s\": invalid conninfo: %s",
             resource_id, perr ? perr : "out of memory");
    rm__log(c, RM_LOG_ERROR, "%s", rm_errmsg());
    PQfreemem(perr);
    return perr ? RM_E_INVALID : RM_E_NOMEM;
  }
  PQconninfoFree(opts);
  rm_at_state_t *s = rm__at_state_get(c);
  if (!s) return rm__fail(RM_E_NOMEM, "could not add resource \"%s\": out of memory", resource_id);
  int added = already_added(s, resource_id, conninfo);
  if (added == 1) return 0; /* the same resource again: nothing to do */
  if (added == 0) {
    int crc = check_database(c, s, resource_id, conninfo);
    if (crc != 0) return crc;
  }

  rm_at_resource_t *r = calloc(1, sizeof(*r));
  if (!r || txc_pgpool_init(&r->pool, RM_AT_POOL_MAX) != 0 || !(r->id = strdup(resource_id)) ||
      !(r->conninfo = strdup(conninfo)) || (!rm__unnamed_statements(c) && !(r->pstmt = txc_pstmt_new("rm_at_", 64)))) {
    if (r) {
      txc_pgpool_destroy(&r->pool);
      free(r->id);
      free(r->conninfo);
    }
    free(r);
    return rm__fail(RM_E_NOMEM, "could not add resource \"%s\": out of memory", resource_id);
  }
  r->st = s;
  r->sql = rm_sql_cache_new(RM_SQL_CACHE_CAP); /* NULL is fine: statements are then parsed on each call */
  pthread_mutex_init(&r->meta_mu, NULL);

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
    if (rc == RM_E_INVALID) {
      rm__fail(rc, "could not add resource \"%s\": already added with another conninfo, or the resource list "
               "is full", resource_id);
      rm__log(c, RM_LOG_ERROR, "%s", rm_errmsg());
    }
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


/* ----------------------------------------------------------- phase two */

bool rm__at_commit_queued(rm_client_t *c, const rm_phase2_req_t *req) {
  size_t xl = req && req->xid ? strlen(req->xid) : 0;
  if (!c || !req || !req->commit || req->branch_type != TXP_BT_AT || xl == 0 || xl > TXP_MAX_XID_LEN ||
      !req->resource_id)
    return false;
  rm_at_resource_t *r = rm__at_resource_find(c, req->resource_id);
  return r && rm__commit_enqueue(r, req->xid, req->branch_id);
}


int rm__at_phase2(rm_client_t *c, const rm_phase2_req_t *req, int *code, char *errmsg, size_t errlen) {
  int scratch_code;
  char scratch[1];
  if (!code) code = &scratch_code;
  if (!errmsg || errlen == 0) {
    errmsg = scratch;
    errlen = sizeof(scratch);
  }
  *code = 0;
  errmsg[0] = '\0';
  bool commit = req && req->commit;
  int retry = commit ? TXP_BS_PHASE2_COMMIT_FAILED_RETRYABLE : TXP_BS_PHASE2_ROLLBACK_FAILED_RETRYABLE;
  int fail = commit ? TXP_BS_PHASE2_COMMIT_FAILED_UNRETRYABLE : TXP_BS_PHASE2_ROLLBACK_FAILED_UNRETRYABLE;
  size_t xl = req && req->xid ? strlen(req->xid) : 0;
  if (!c || !req || xl == 0 || xl > TXP_MAX_XID_LEN || !req->resource_id) {
    *code = RM_E_INVALID;
    snprintf(errmsg, errlen, "invalid phase-two request (xid or resource missing or too long)");
    return fail;
  }
  rm_at_resource_t *r = rm__at_resource_find(c, req->resource_id);
  if (!r) {
    *code = RM_E_INVALID;
    snprintf(errmsg, errlen, "resource \"%s\" is not served by this client", req->resource_id);
    return retry;
  }
  if (req->branch_type != TXP_BT_AT) {
    void *arg = NULL;
    const rm_at_mode_t *mode = rm__at_resource_mode(r, req->branch_type, &arg);
    if (mode) return mode->phase2(r, arg, req, code, errmsg, errlen);
    /* Retryable: a client of this process that serves the mode may be
     * on its way (the coordinator asks every RM of the resource). */
    *code = RM_E_NOT_SUPPORTED;
    snprintf(errmsg, errlen, "branch type %s of resource \"%s\" is not served by this client",
             txp_branch_type_name(req->branch_type), req->resource_id);
    return retry;
  }

  return commit ? rm__commit_phase2(r, req, code, errmsg, errlen) : rm__rollback_phase2(r, req, code, errmsg, errlen);
}

int rm__at_resource_set_mode(rm_at_resource_t *r, int type, const rm_at_mode_t *mode, void *arg) {
  int rc = 0;
  if (!r || !mode || !mode->phase2 || type <= TXP_BT_AT || type >= TXP_BT__MAX) {
    rc = RM_E_INVALID;
  } else {
    pthread_mutex_lock(&r->meta_mu);
    if (r->modes[type]) {
      rc = RM_E_INVALID;
    } else {
      r->modes[type] = mode;
      r->mode_args[type] = arg;
    }
    pthread_mutex_unlock(&r->meta_mu);
  }
  if (rc != 0 && mode && mode->free_arg) mode->free_arg(arg);
  return rc;
}


int rm__at_resource_add_mode(rm_client_t *c, const char *what, const char *id, const char *conninfo, int type,
                             const rm_at_mode_t *mode, void *arg) {
  int rc = rm_resource_add(c, id, conninfo);
  rm_at_resource_t *r = rc == 0 ? rm__at_resource_find(c, id) : NULL;
  if (rc == 0 && !r) rc = rm__fail(RM_E_INVALID, "could not add %s resource \"%s\": not found after adding", what, id);
  if (rc != 0) {
    if (mode->free_arg) mode->free_arg(arg);
    return rc;
  }
  if (rm__at_resource_set_mode(r, type, mode, arg) != 0) /* frees arg */
    return rm__fail(RM_E_INVALID, "could not add %s resource \"%s\": it has %s handlers already", what, id, what);
  return 0;
}

int rm__at_conn_get(rm_at_resource_t *r, PGconn **out, char *err, size_t errlen) {
  return rm__undo_pool_get(r, out, err, errlen);
}

void rm__at_conn_put(rm_at_resource_t *r, PGconn *pg, bool bad) { rm__undo_pool_put(r, pg, bad); }

/* ----------------------------------------------- tuning, flush, sweep */

int rm__at_tune(rm_client_t *c, const rm_at_tuning_t *t) {
  rm_at_state_t *st = rm__at_state_get(c);
  if (!st) return RM_E_NOMEM;
  if (!t) return RM_E_INVALID;
  pthread_mutex_lock(&st->mu);
#define TUNE(f) \
  if (t->f) st->tune.f = t->f
  TUNE(pool_size);
  TUNE(queue_max);
  TUNE(flush_ms);
  TUNE(delete_batch);
  TUNE(sweep_interval_s);
  TUNE(retention_s);
  TUNE(lock_timeout_ms);
  TUNE(statement_timeout_ms);
  TUNE(connect_timeout_s);
  TUNE(resolve_interval_s);
  TUNE(resolve_grace_s);
  TUNE(resolve_max_xids);
#undef TUNE
  if (t->sweep_interval_s) st->next_sweep_ms = rm__undo_now_ms() + (int64_t)t->sweep_interval_s * 1000;
  pthread_cond_broadcast(&st->cv);
  pthread_mutex_unlock(&st->mu);
  return 0;
}

int rm__at_flush(rm_client_t *c) {
  rm_at_state_t *st = rm__at_state_get(c);
  if (!st) return RM_E_NOMEM;
  int n = 0, rc = 0;
  rm_at_resource_t **v = rm__undo_resources(st, &n);
  for (int i = 0; v && i < n; i++) {
    int r = rm__commit_flush(v[i]);
    if (r != 0 && rc == 0) rc = r;
  }
  free(v);
  return rc;
}

int rm__at_sweep(rm_client_t *c, long long *removed) {
  rm_at_state_t *st = rm__at_state_get(c);
  if (!st) return RM_E_NOMEM;
  if (removed) *removed = 0;
  int n = 0, rc = 0;
  rm_at_resource_t **v = rm__undo_resources(st, &n);
  for (int i = 0; v && i < n; i++) {
    int r = rm__undo_sweep(v[i], removed);
    if (r != 0 && rc == 0) rc = r;
  }
  free(v);
  return rc;
}


/* ------------------------------------------------------ hot counters */

int rm_at_hot_column(rm_client_t *c, const char *resource_id, const char *table, const char *column) {
  rm_at_resource_t *r = c && resource_id ? rm__at_resource_find(c, resource_id) : NULL;
  if (!r) return rm__fail(RM_E_INVALID, "rm_at_hot_column: unknown resource \"%s\": add it first", resource_id ? resource_id : "(null)");
  const char *dot = table ? strchr(table, '.') : NULL;
  size_t sl = dot ? (size_t)(dot - table) : 0;
  const char *name = dot ? dot + 1 : table;
  if (!table || !column || (dot && (sl == 0 || sl > RM_AT_MAX_NAME)) || !name[0] || strlen(name) > RM_AT_MAX_NAME ||
      !column[0] || strlen(column) > RM_AT_MAX_NAME)
    return rm__fail(RM_E_INVALID, "rm_at_hot_column: invalid table or column name");
  pthread_mutex_lock(&r->meta_mu);
  int rc = 0;
  if (r->nhot == RM_AT_MAX_HOT) {
    rc = RM_E_INVALID;
  } else {
    struct rm_hot_col *h = &r->hot[r->nhot++];
    snprintf(h->schema, sizeof(h->schema), "%.*s", (int)sl, dot ? table : "");
    snprintf(h->table, sizeof(h->table), "%s", name);
    snprintf(h->col, sizeof(h->col), "%s", column);
  }
  pthread_mutex_unlock(&r->meta_mu);
  if (rc) return rm__fail(rc, "rm_at_hot_column: at most %d hot columns per resource", RM_AT_MAX_HOT);
  return 0;
}

bool rm__at_hot(rm_at_resource_t *r, const rm_table_t *t, const char *col) {
  bool hot = false;
  pthread_mutex_lock(&r->meta_mu);
  for (int i = 0; i < r->nhot && !hot; i++) {
    const struct rm_hot_col *h = &r->hot[i];
    hot = strcmp(h->col, col) == 0 && strcmp(h->table, t->name) == 0 && (!h->schema[0] || strcmp(h->schema, t->schema) == 0);
  }
  pthread_mutex_unlock(&r->meta_mu);
  return hot;
}
