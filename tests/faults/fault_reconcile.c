/*
 * fault_reconcile.c - align Redis with PostgreSQL for one activity after a
 * Redis or service fault (rm_prefilter_reconcile, not a dry run): the
 * "reconcile" step the fault suite runs before its final check.
 *
 * Usage: fault_reconcile [--dry-run] ACTIVITY   (STOCK_PG_URL, REDIS_URL or
 *        REDIS_SENTINELS + REDIS_MASTER_NAME from the env)
 * Prints what was corrected; exit 0 done, 1 failed, 2 usage.  --dry-run:
 * compare only; exit 0 when Redis equals PostgreSQL, 3 when it differs.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "rm_client.h"

int main(int argc, char **argv) {
  char buf[4096];
  /* REDIS_SENTINELS + REDIS_MASTER_NAME (cluster/local/up --ha), else REDIS_URL */
  const char *pg_url = getenv("STOCK_PG_URL"), *redis_url = rm_redis_url_from_env(buf, sizeof(buf));
  bool dry = argc == 3 && strcmp(argv[1], "--dry-run") == 0;
  if (argc != 2 + dry || !pg_url || !redis_url) {
    fprintf(stderr, "usage: STOCK_PG_URL=... REDIS_URL=... fault_reconcile [--dry-run] ACTIVITY\n");
    return 2;
  }
  long long activity = atoll(argv[1 + dry]);
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
    rc = rm_prefilter_reconcile(pf, pg, activity, dry, &rep, NULL, NULL);
    if (rc != RM_PF_E_CONFLICT) break;
  }
  if (rc != 0) {
    fprintf(stderr, "fault_reconcile: reconcile of activity %lld failed: %d\n", activity, rc);
  } else {
    printf("%s activity %lld: differences meta %u, buckets %u, users %u, orders %u, deadlines %u\n",
           dry ? "compared" : "reconciled", activity, rep.meta, rep.buckets, rep.users, rep.orders, rep.deadlines);
  }
  rm_prefilter_free(pf);
  PQfinish(pg);
  if (rc != 0) return 1;
  return dry && (rep.meta || rep.buckets || rep.users || rep.orders || rep.deadlines) ? 3 : 0;
}
