/*
 * console_db.c - the read-only connection pool (console_db.h).
 */
#include "console_db.h"

#include <libpq-fe.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "txc_pgmsg.h"
#include "txc_pgpool.h"
#include "txc_worker.h"

struct console_db {
  char *what;
  char *conninfo;
  txc_pgpool_t pool; /* at most pool.cap connections */
};

/* Before console_db_new, which frees what it half made with it. */
void console_db_free(console_db_t *db) {
  if (!db) return;
  txc_pgpool_destroy(&db->pool);
  free(db->what);
  free(db->conninfo);
  free(db);
}

console_db_t *console_db_new(const char *what, const char *conninfo, int size) {
  console_db_t *db = calloc(1, sizeof(*db));
  if (db && (!(db->what = strdup(what)) || !(db->conninfo = strdup(conninfo)) ||
             txc_pgpool_init(&db->pool, size) != 0)) {
    console_db_free(db);
    db = NULL;
  }
  return db;
}

static PGconn *connect_one(void *arg, char *err, size_t errlen) {
  const console_db_t *db = arg;
  char timeout[16], options[96];
  snprintf(timeout, sizeof(timeout), "%d", CONSOLE_DB_CONNECT_S);
  snprintf(options, sizeof(options), "-c default_transaction_read_only=on -c statement_timeout=%d",
           CONSOLE_DB_STATEMENT_MS);
  /* The URL first: the keywords after it override what it says. */
  const char *keys[] = {"dbname", "application_name", "connect_timeout", "options", NULL};
  const char *vals[] = {db->conninfo, "txc-console", timeout, options, NULL};
  PGconn *c = PQconnectdbParams(keys, vals, 1);
  if (!c || PQstatus(c) != CONNECTION_OK) {
    const char *m = c ? PQerrorMessage(c) : "out of memory";
    snprintf(err, errlen, "%s: cannot connect: %.*s", db->what, (int)txc_pgmsg_len(m), m);
    PQfinish(c);
    return NULL;
  }
  return c;
}

/* Idle connections are lent as they are: a dead one fails its query, and
 * give_back closes it. */
static const txc_pgpool_ops_t pool_ops = {.open = connect_one, .lendable = NULL};

/* An idle connection, a new one, or NULL after CONSOLE_DB_WAIT_MS. */
static PGconn *borrow(console_db_t *db, char *err, size_t errlen) {
  PGconn *c;
  int size = db->pool.cap;
  if (txc_pgpool_get(&db->pool, size, CONSOLE_DB_WAIT_MS, &pool_ops, db, &c, err, errlen) == TXC_PGPOOL_BUSY)
    snprintf(err, errlen, "%s: all %d connections busy for %d ms", db->what, size, CONSOLE_DB_WAIT_MS);
  return c;
}

static void give_back(console_db_t *db, PGconn *c) { txc_pgpool_put(&db->pool, c, true); }

int console_db_value(console_db_t *db, const char *sql, int nparams, const char *const *params, char **out, char *err,
                     size_t errlen) {
  *out = NULL;
  PGconn *c = borrow(db, err, errlen);
  if (!c) return -1;
  /* Every parameter is text (the SQL casts what it needs): a parameter
   * a query does not use still has a type. */
  Oid types[CONSOLE_DB_MAX_PARAMS];
  if (nparams > CONSOLE_DB_MAX_PARAMS) nparams = CONSOLE_DB_MAX_PARAMS;
  for (int i = 0; i < nparams; i++) types[i] = 25; /* TEXTOID */
  PGresult *r = PQexecParams(c, sql, nparams, types, params, NULL, NULL, 0);
  int rc = -1;
  if (PQresultStatus(r) != PGRES_TUPLES_OK) {
    const char *m = PQerrorMessage(c);
    snprintf(err, errlen, "%s: query failed: %.*s", db->what, (int)txc_pgmsg_len(m), m);
  } else if (PQntuples(r) != 1 || PQnfields(r) != 1 || PQgetisnull(r, 0, 0)) {
    snprintf(err, errlen, "%s: the query returned no value", db->what);
  } else if (!(*out = strdup(PQgetvalue(r, 0, 0)))) {
    snprintf(err, errlen, "out of memory");
  } else {
    rc = 0;
  }
  PQclear(r);
  give_back(db, c);
  return rc;
}
