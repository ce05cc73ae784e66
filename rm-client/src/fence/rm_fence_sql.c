/*
 * rm_fence_sql.c - the statements on branch_fence rows (rm_fence.h).
 * Each is one round trip with text parameters; the branch id goes as
 * int8 so that the primary key is used without a cast.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rm_fence.h"
#include "rm_client.h"
#include "rm_pg.h"
#include "rm_util.h"

#define INT8OID 20
#define INT2OID 21

static void num(char *buf, size_t cap, long long v) { snprintf(buf, cap, "%lld", v); }

int rm_fence_insert(rm_pg_io_t *io, const char *xid, int64_t bid, const char *resource_id, int branch_type,
                    const char *args, int *found) {
  static const Oid types[] = {0, INT8OID, 0, INT2OID, 0};
  char b[24], t[24];
  num(b, sizeof(b), bid);
  num(t, sizeof(t), branch_type);
  const char *p[] = {xid, b, resource_id, t, args};
  *found = RM_FENCE_NONE;
  PGresult *res = rm__pg_io_exec(io, "could not write the fence row",
                                 "INSERT INTO branch_fence (xid, branch_id, resource_id, branch_type, status, args) "
                                 "VALUES ($1, $2, $3, $4, 1, $5) ON CONFLICT DO NOTHING",
                                 5, p, types, PGRES_COMMAND_OK);
  if (!res) return -1;
  bool inserted = atoi(PQcmdTuples(res)) == 1;
  PQclear(res);
  if (inserted) return 0;
  if (rm_fence_read(io, xid, bid, found) != 0) return -1;
  if (*found == RM_FENCE_NONE) { /* cannot be: the insert met a row */
    snprintf(io->err, io->errlen, "the fence row of branch %lld appeared and vanished", (long long)bid);
    return -1;
  }
  return 0;
}

static int read_row(rm_pg_io_t *io, const char *sql, const char *xid, int64_t bid, int *status, char **args) {
  static const Oid types[] = {0, INT8OID};
  char b[24];
  num(b, sizeof(b), bid);
  const char *p[] = {xid, b};
  *status = RM_FENCE_NONE;
  if (args) *args = NULL;
  PGresult *res = rm__pg_io_exec(io, "could not read the fence row", sql, 2, p, types, PGRES_TUPLES_OK);
  if (!res) return -1;
  int rc = 0;
  if (PQntuples(res) == 1) {
    *status = atoi(PQgetvalue(res, 0, 0));
    if (args && !PQgetisnull(res, 0, 1) && !(*args = strdup(PQgetvalue(res, 0, 1)))) {
      snprintf(io->err, io->errlen, "out of memory reading the fence row");
      rc = -1;
    }
  }
  PQclear(res);
  return rc;
}

int rm_fence_lock(rm_pg_io_t *io, const char *xid, int64_t bid, int *status, char **args) {
  return read_row(io, "SELECT status, args FROM branch_fence WHERE xid = $1 AND branch_id = $2 FOR UPDATE", xid, bid,
                  status, args);
}

int rm_fence_read(rm_pg_io_t *io, const char *xid, int64_t bid, int *status) {
  return read_row(io, "SELECT status FROM branch_fence WHERE xid = $1 AND branch_id = $2", xid, bid, status, NULL);
}

int rm_fence_record_empty(rm_pg_io_t *io, const char *xid, int64_t bid, const char *resource_id,
                          int branch_type, bool *inserted) {
  static const Oid types[] = {0, INT8OID, 0, INT2OID};
  char b[24], t[24];
  num(b, sizeof(b), bid);
  num(t, sizeof(t), branch_type);
  const char *p[] = {xid, b, resource_id, t};
  *inserted = false;
  PGresult *res = rm__pg_io_exec(io, "could not record the empty rollback in the fence",
                                 "INSERT INTO branch_fence (xid, branch_id, resource_id, branch_type, status) "
                                 "VALUES ($1, $2, $3, $4, 4) ON CONFLICT DO NOTHING",
                                 4, p, types, PGRES_COMMAND_OK);
  if (!res) return -1;
  *inserted = atoi(PQcmdTuples(res)) == 1;
  PQclear(res);
  return 0;
}

int rm_fence_set(rm_pg_io_t *io, const char *xid, int64_t bid, int status) {
  static const Oid types[] = {0, INT8OID, INT2OID};
  char b[24], s[24];
  num(b, sizeof(b), bid);
  num(s, sizeof(s), status);
  const char *p[] = {xid, b, s};
  PGresult *res = rm__pg_io_exec(io, "could not update the fence row",
                                 "UPDATE branch_fence SET status = $3, modified = clock_timestamp() "
                                 "WHERE xid = $1 AND branch_id = $2",
                                 3, p, types, PGRES_COMMAND_OK);
  if (!res) return -1;
  PQclear(res);
  return 0;
}

long long rm_fence_sweep(PGconn *pg, int branch_type, unsigned retention_s, unsigned limit, char *err,
                         size_t errlen) {
  rm_pg_io_t io = {.pg = pg, .err = err, .errlen = errlen};
  char t[24], ret[24], lim[24];
  num(t, sizeof(t), branch_type);
  num(ret, sizeof(ret), retention_s);
  num(lim, sizeof(lim), limit ? limit : 1000);
  const char *p[] = {t, ret, lim};
  PGresult *res = rm__pg_io_exec(&io, "could not sweep the fence",
                                 "DELETE FROM branch_fence WHERE ctid = ANY (ARRAY(SELECT ctid FROM branch_fence "
                                 "WHERE status <> 1 AND branch_type = $1::smallint "
                                 "AND modified < clock_timestamp() - make_interval(secs => $2::int) LIMIT $3::int))",
                                 3, p, NULL, PGRES_COMMAND_OK);
  if (!res) return RM_E_DB;
  long long n = atoll(PQcmdTuples(res));
  PQclear(res);
  return n;
}

int rm_fence_probe(const char *conninfo, rm_fence_probe_t *out, char *err, size_t errlen) {
  memset(out, 0, sizeof(*out));
  const char *kw[] = {"connect_timeout", "application_name", "dbname", NULL};
  const char *vals[] = {"10", "librmclient", conninfo, NULL};
  PGconn *pg = PQconnectdbParams(kw, vals, 1);
  if (!pg) {
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  int rc = -1;
  if (PQstatus(pg) != CONNECTION_OK) {
    rm__pg_error(err, errlen, "could not connect to its database", pg, NULL);
  } else {
    rm_pg_io_t io = {.pg = pg, .err = err, .errlen = errlen};
    PGresult *res = rm__pg_io_exec(&io, "could not look for the branch_fence table",
                                   "SELECT to_regclass('branch_fence') IS NOT NULL, current_database(), "
                                   "current_setting('max_prepared_transactions')::int",
                                   0, NULL, NULL, PGRES_TUPLES_OK);
    if (res) {
      out->has_fence = PQgetvalue(res, 0, 0)[0] == 't';
      snprintf(out->db, sizeof(out->db), "%s", PQgetvalue(res, 0, 1));
      out->max_prepared = atoi(PQgetvalue(res, 0, 2));
      PQclear(res);
      rc = 0;
    }
  }
  PQfinish(pg);
  return rc;
}

int rm_fence_require(const char *mode, const char *id, const char *conninfo, bool need_prepared) {
  char err[RM_ERRMSG_MAX];
  rm_fence_probe_t p;
  if (rm_fence_probe(conninfo, &p, err, sizeof(err)) != 0)
    return rm__fail(RM_E_DB, "could not add %s resource \"%s\": %s", mode, id, err);
  if (!p.has_fence)
    return rm__fail(RM_E_NO_TABLE,
                    "could not add %s resource \"%s\": database \"%s\" has no branch_fence table (on its "
                    "search_path; version 2 of the \"rm\" schema set): run `txc-db-migrate 'CONNINFO' rm` "
                    "(scripts/db-migrate in the source tree), with this resource's conninfo",
                    mode, id, p.db);
  if (need_prepared && p.max_prepared < 1)
    return rm__fail(RM_E_NOT_SUPPORTED,
                    "could not add %s resource \"%s\": the server of database \"%s\" has "
                    "max_prepared_transactions = %d; set it to at least the number of branches open at once "
                    "(for example 64, in postgresql.conf) and restart the server",
                    mode, id, p.db, p.max_prepared);
  return 0;
}

int rm_fence_command(rm_pg_io_t *io, const char *sql, const char *what) {
  PGresult *res = rm__pg_io_exec(io, what, sql, 0, NULL, NULL, PGRES_COMMAND_OK);
  if (!res) return -1;
  PQclear(res);
  return 0;
}

int rm_fence_first(PGconn *pg, const char *what, const char *xid, int64_t bid, const char *resource_id,
                   int branch_type, const char *args) {
  char err[RM_ERRMSG_MAX];
  rm_pg_io_t io = {.pg = pg, .err = err, .errlen = sizeof(err)};
  int found;
  if (rm_fence_insert(&io, xid, bid, resource_id, branch_type, args, &found) != 0)
    return rm__fail(RM_E_DB, "%s of \"%s\" (branch %lld): %s (roll back the transaction)", what, xid,
                    (long long)bid, err);
  const char *why;
  if (!rm_fence_first_ok(found, &why))
    return rm__fail(RM_E_FENCE, "%s of \"%s\" (branch %lld): %s (roll back the transaction)", what, xid,
                    (long long)bid, why);
  return 0;
}
