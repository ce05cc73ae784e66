/* rm_itest.c - see rm_itest.h. */
#include "rm_itest.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "rm_client.h"

void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

double now_ms(void) { return now_s() * 1e3; }

void log_cb(int level, const char *msg, void *arg) {
  (void)arg;
  if (level <= RM_LOG_WARN || getenv("RM_TEST_VERBOSE")) fprintf(stderr, "  [rmclient %d] %s\n", level, msg);
}

PGconn *pg_open(const char *url) {
  PGconn *pg = PQconnectdb(url);
  if (PQstatus(pg) != CONNECTION_OK) {
    fprintf(stderr, "connect %s: %s", url, PQerrorMessage(pg));
    PQfinish(pg);
    return NULL;
  }
  PQclear(PQexec(pg, "SET client_min_messages = warning"));
  return pg;
}

int degrade_detected(rm_client_t *c) {
  rm_degrade_stats_t st;
  rm_client_degrade_stats(c, &st);
  return st.detected;
}

bool exec_ok(PGconn *pg, const char *sql) {
  PGresult *r = PQexec(pg, sql);
  ExecStatusType st = PQresultStatus(r);
  bool ok = st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK;
  if (!ok) fprintf(stderr, "  sql failed: %s: %s", sql, PQresultErrorMessage(r));
  PQclear(r);
  return ok;
}
