/*
 * fault_reconcile.c - align Redis with PostgreSQL for one activity after a
 * Redis or service fault (rm_prefilter_reconcile, not a dry run): the
 * "reconcile" step the fault suite runs before its final check.
 *
 * Usage: fault_reconcile ACTIVITY   (STOCK_PG_URL, REDIS_URL from the env)
 * Prints what was corrected; exit 0 done, 1 failed, 2 usage.
 */
#include <stdio.h>
#include <stdlib.h>

#include <libpq-fe.h>

#include "rm_client.h"

int main(int argc, char **argv) {
  char buf[4096];
  /* REDIS_SENTINELS + REDIS_MASTER_NAME (cluster/local/up --ha), else REDIS_URL */
  const char *pg_url = getenv("STOCK_PG_URL"), *redis_url = rm_redis_url_from_env(buf, sizeof(buf));
  if (argc != 2 || !pg_url || !redis_url) {
    fprintf(stderr, "usage: STOCK_PG_URL=... REDIS_URL=... fault_reconcile ACTIVITY\n");
    return 2;
  }
  long long activity = atoll(argv[1]);
  PGconn *pg = PQconnectdb(pg_url);
  if (PQstatus(pg) != CONNECTION_OK) {
    fprintf(stderr, "fault_reconcile: %s", PQerrorMessage(pg));
    PQfinish(pg);
    return 1;
  }
  rm_pf_options_t po = {.command_timeout_ms = 5000, .connect_timeout_ms = 2000, .max_connections = 2};
  rm_prefilter_t *pf = NULL;
  int rc = rm_prefilter_new(redis_url, &po, &pf);
  if (rc != 0) {
    fprintf(stderr, "fault_reconcile: prefilter: %d\n", rc);
    PQfinish(pg);
    return 1;
  }
  rm_pf_reconcile_t rep = {0};
  for (int attempt = 0; attempt < 5; attempt++) {
    rc = rm_prefilter_reconcile(pf, pg, activity, false, &rep, NULL, NULL);
    if (rc != RM_PF_E_CONFLICT) break;
  }
  if (rc != 0) {
    fprintf(stderr, "fault_reconcile: reconcile of activity %lld failed: %d\n", activity, rc);
  } else {
    printf("reconciled activity %lld\n", activity);
  }
  rm_prefilter_free(pf);
  PQfinish(pg);
  return rc == 0 ? 0 : 1;
}
