/* pgstat.c - see pgstat.h. */
#include "pgstat.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

void pgstat_add_db(pgstat_t *out, const char *conninfo) {
  char name[64] = "";
  PQconninfoOption *o = conninfo ? PQconninfoParse(conninfo, NULL) : NULL;
  for (PQconninfoOption *p = o; p && p->keyword; p++)
    if (strcmp(p->keyword, "dbname") == 0 && p->val) snprintf(name, sizeof(name), "%s", p->val);
  if (o) PQconninfoFree(o);
  if (!name[0] || out->ndb >= PGSTAT_MAX_DB) return;
  for (int k = 0; k < out->ndb; k++)
    if (strcmp(out->db[k], name) == 0) return;
  snprintf(out->db[out->ndb], sizeof(out->db[0]), "%s", name);
  out->xacts[out->ndb] = -1;
  out->statements[out->ndb] = -1;
  out->ndb++;
}

static long long get_ll(PGresult *r, int row, int col) {
  return PQgetisnull(r, row, col) ? 0 : atoll(PQgetvalue(r, row, col));
}

void pgstat_sample(pgstat_t *s, const char *url) {
  s->ok = false;
  for (int k = 0; k < s->ndb; k++) s->xacts[k] = s->statements[k] = s->rows_read[k] = -1;
  if (!url) return;
  PGconn *pg = PQconnectdb(url);
  if (PQstatus(pg) != CONNECTION_OK) {
    PQfinish(pg);
    return;
  }
  PGresult *r = PQexec(pg, "SELECT wal_records, wal_fpi, wal_bytes, wal_sync FROM pg_stat_wal");
  if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1) {
    s->ok = true;
    s->wal_records = get_ll(r, 0, 0);
    s->wal_fpi = get_ll(r, 0, 1);
    s->wal_bytes = get_ll(r, 0, 2);
    s->wal_sync = get_ll(r, 0, 3);
  }
  PQclear(r);
  r = PQexec(pg, "SELECT datname, xact_commit + xact_rollback, tup_returned FROM pg_stat_database "
                 "WHERE datname IS NOT NULL");
  for (int i = 0; PQresultStatus(r) == PGRES_TUPLES_OK && i < PQntuples(r); i++)
    for (int k = 0; k < s->ndb; k++)
      if (strcmp(s->db[k], PQgetvalue(r, i, 0)) == 0) {
        s->xacts[k] = get_ll(r, i, 1);
        s->rows_read[k] = get_ll(r, i, 2);
      }
  PQclear(r);
  /* The view exists where the extension was created: here, once.  A
   * server without the library loaded refuses, and statements stay
   * unknown. */
  r = PQexec(pg, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements");
  PQclear(r);
  r = PQexec(pg, "SELECT d.datname, sum(s.calls) FROM pg_stat_statements(false) s "
                 "JOIN pg_database d ON d.oid = s.dbid GROUP BY d.datname");
  if (PQresultStatus(r) == PGRES_TUPLES_OK) {
    for (int k = 0; k < s->ndb; k++) s->statements[k] = 0;
    for (int i = 0; i < PQntuples(r); i++)
      for (int k = 0; k < s->ndb; k++)
        if (strcmp(s->db[k], PQgetvalue(r, i, 0)) == 0) s->statements[k] = get_ll(r, i, 1);
  }
  PQclear(r);
  PQfinish(pg);
}
