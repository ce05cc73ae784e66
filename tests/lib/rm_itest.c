/* rm_itest.c - see rm_itest.h. */
#include "rm_itest.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rm_at_int.h"
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

bool itest_urls(const char **orders, const char **stock, const char **tc) {
  *orders = getenv("ORDERS_PG_URL");
  *stock = getenv("STOCK_PG_URL");
  *tc = getenv("TC_PG_URL");
  if (*orders && *stock && *tc) return true;
  fprintf(stderr, "ORDERS_PG_URL/STOCK_PG_URL/TC_PG_URL not set: run under scripts/with-servers --pg\n");
  return false;
}

int itest_tcd_start(tcd_proc_t *t, const char *tc_url, const char *token, unsigned retry_max_ms, const char *extra) {
  static char retry_max[64];
  static const char *env[5];
  snprintf(retry_max, sizeof(retry_max), "TC_RECOVERY_RETRY_MAX_MS=%u", retry_max_ms);
  env[0] = "TC_RECOVERY_INTERVAL_MS=100";
  env[1] = "TC_RECOVERY_RETRY_MIN_MS=50";
  env[2] = retry_max;
  env[3] = extra;
  env[4] = NULL;
  const char *level = getenv("TC_LOG_LEVEL");
  tcd_opts_t o = {.pg_url = tc_url, .token = token, .log_level = level ? level : "error", .env = env,
                  .attempts = 5, .timeout_ms = 6000};
  if (tcd_proc_start(t, &o) == 0) return 0;
  fprintf(stderr, "could not start tcd: %s\n", t->err);
  return -1;
}

int itest_client_new(const tcd_proc_t *t, rm_config_t cfg, rm_client_t **out) {
  char nodes[64];
  snprintf(nodes, sizeof(nodes), "127.0.0.1:%d", t->port);
  cfg.nodes = nodes;
  rm_at_tuning_t tune = {.lock_timeout_ms = 1000, .statement_timeout_ms = 5000};
  if (rm_client_new(&cfg, out) != 0 || rm__at_tune(*out, &tune) != 0) {
    fprintf(stderr, "could not start the client: %s\n", rm_errmsg());
    return -1;
  }
  return 0;
}

int itest_client_ready(rm_client_t *c) {
  for (int i = 0; i < 500 && rm_client_nodes_up(c) < 1; i++) sleep_ms(20);
  if (rm_client_nodes_up(c) < 1) {
    fprintf(stderr, "client never connected to tcd\n");
    return -1;
  }
  sleep_ms(200); /* let the RM registration (resource list) reach the node */
  return 0;
}

void itest_group_stop(rm_client_t **c, tcd_proc_t *t) {
  rm_client_free(*c);
  *c = NULL;
  tcd_proc_stop(t, 5000);
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

int itest_branch_end(PGconn *pg, rm_branch_t *b, int rc, int64_t *bid) {
  if (rc == 0) rc = rm_at_prepare(b, bid);
  if (rc != 0) {
    if (b && getenv("RM_TEST_VERBOSE")) fprintf(stderr, "  branch failed: %s\n", rm_at_errmsg(b));
    exec_ok(pg, "ROLLBACK");
    if (b) rm_at_close(b, false);
    return rc;
  }
  /* A COMMIT of a transaction that failed answers ROLLBACK, not an error. */
  PGresult *r = PQexec(pg, "COMMIT");
  bool ok = PQresultStatus(r) == PGRES_COMMAND_OK && strcmp(PQcmdStatus(r), "COMMIT") == 0;
  PQclear(r);
  rm_at_close(b, ok);
  return ok ? 0 : RM_E_DB;
}
