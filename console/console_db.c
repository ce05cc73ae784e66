/*
 * console_db.c - the read-only connection pool (console_db.h).
 */
#include "console_db.h"

#include <errno.h>
#include <libpq-fe.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "txc_pgmsg.h"
#include "txc_worker.h"

struct console_db {
  char *what;
  char *conninfo;
  int size;
  pthread_mutex_t mu;
  pthread_cond_t freed;
  int open;      /* connections that exist, idle or borrowed */
  int nidle;
  PGconn **idle; /* 'size' slots */
};

console_db_t *console_db_new(const char *what, const char *conninfo, int size) {
  console_db_t *db = calloc(1, sizeof(*db));
  if (!db) return NULL;
  db->what = strdup(what);
  db->conninfo = strdup(conninfo);
  db->size = size > 0 ? size : 1;
  db->idle = calloc((size_t)db->size, sizeof(*db->idle));
  if (!db->what || !db->conninfo || !db->idle) {
    console_db_free(db);
    return NULL;
  }
  pthread_mutex_init(&db->mu, NULL);
  txc_cond_init_monotonic(&db->freed);
  return db;
}

void console_db_free(console_db_t *db) {
  if (!db) return;
  if (db->idle) {
    for (int i = 0; i < db->nidle; i++) PQfinish(db->idle[i]);
    pthread_mutex_destroy(&db->mu);
    pthread_cond_destroy(&db->freed);
  }
  free(db->idle);
  free(db->what);
  free(db->conninfo);
  free(db);
}

static PGconn *connect_one(console_db_t *db, char *err, size_t errlen) {
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

/* An idle connection, a new one, or NULL after CONSOLE_DB_WAIT_MS. */
static PGconn *borrow(console_db_t *db, char *err, size_t errlen) {
  struct timespec until;
  clock_gettime(CLOCK_MONOTONIC, &until);
  until.tv_sec += CONSOLE_DB_WAIT_MS / 1000;
  until.tv_nsec += (long)(CONSOLE_DB_WAIT_MS % 1000) * 1000000L;
  if (until.tv_nsec >= 1000000000L) {
    until.tv_sec++;
    until.tv_nsec -= 1000000000L;
  }
  pthread_mutex_lock(&db->mu);
  for (;;) {
    if (db->nidle > 0) {
      PGconn *c = db->idle[--db->nidle];
      pthread_mutex_unlock(&db->mu);
      return c;
    }
    if (db->open < db->size) {
      db->open++;
      pthread_mutex_unlock(&db->mu);
      PGconn *c = connect_one(db, err, errlen);
      if (!c) {
        pthread_mutex_lock(&db->mu);
        db->open--;
        pthread_cond_signal(&db->freed);
        pthread_mutex_unlock(&db->mu);
      }
      return c;
    }
    if (pthread_cond_timedwait(&db->freed, &db->mu, &until) == ETIMEDOUT) {
      pthread_mutex_unlock(&db->mu);
      snprintf(err, errlen, "%s: all %d connections busy for %d ms", db->what, db->size, CONSOLE_DB_WAIT_MS);
      return NULL;
    }
  }
}

static void give_back(console_db_t *db, PGconn *c) {
  bool ok = PQstatus(c) == CONNECTION_OK && PQtransactionStatus(c) == PQTRANS_IDLE;
  pthread_mutex_lock(&db->mu);
  if (ok) {
    db->idle[db->nidle++] = c;
  } else {
    db->open--;
  }
  pthread_cond_signal(&db->freed);
  pthread_mutex_unlock(&db->mu);
  if (!ok) PQfinish(c);
}

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
