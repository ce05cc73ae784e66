/*
 * db.c - see db.h.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "db.h"

PGconn *g_pg;

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

long db_long(const char *sql, const char *p1, const char *p2) {
  const char *params[2] = {p1, p2};
  int n = p2 ? 2 : p1 ? 1 : 0;
  PGresult *r = PQexecParams(g_pg, sql, n, NULL, params, NULL, NULL, 0);
  if (PQresultStatus(r) != PGRES_TUPLES_OK) {
    char msg[512];
    snprintf(msg, sizeof(msg), "%s", PQresultErrorMessage(r));
    PQclear(r);
    fail_msg("query failed: %s: %s", sql, msg);
  }
  long v = -1;
  if (PQntuples(r) > 0 && !PQgetisnull(r, 0, 0)) v = strtol(PQgetvalue(r, 0, 0), NULL, 10);
  PQclear(r);
  return v;
}

void db_text(const char *sql, const char *p1, char *out, size_t cap) {
  const char *params[1] = {p1};
  PGresult *r = PQexecParams(g_pg, sql, p1 ? 1 : 0, NULL, params, NULL, NULL, 0);
  out[0] = '\0';
  if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) > 0 && !PQgetisnull(r, 0, 0))
    snprintf(out, cap, "%s", PQgetvalue(r, 0, 0));
  bool ok = PQresultStatus(r) == PGRES_TUPLES_OK;
  PQclear(r);
  if (!ok) fail_msg("query failed: %s", sql);
}

void db_exec(const char *sql, const char *p1, const char *p2) {
  const char *params[2] = {p1, p2};
  int n = p2 ? 2 : p1 ? 1 : 0;
  PGresult *r = PQexecParams(g_pg, sql, n, NULL, params, NULL, NULL, 0);
  ExecStatusType st = PQresultStatus(r);
  if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
    char msg[512];
    snprintf(msg, sizeof(msg), "%s", PQresultErrorMessage(r));
    PQclear(r);
    fail_msg("statement failed: %s: %s", sql, msg);
  }
  PQclear(r);
}

bool db_wait_long(const char *sql, const char *p1, const char *p2, long want, int timeout_ms) {
  double deadline = now_ms() + timeout_ms;
  for (;;) {
    if (db_long(sql, p1, p2) == want) return true;
    if (now_ms() >= deadline) return false;
    struct timespec ts = {0, 10000000L};
    nanosleep(&ts, NULL);
  }
}
