/*
 * txc_compensate.c - run one pass of the fallback compensation job (and,
 * with --reconcile, the Redis/PostgreSQL reconciliation) from a shell, a
 * cron job or `make demo`.
 *
 * Settings come from the environment cluster/local/up prints:
 * ORDERS_PG_URL, STOCK_PG_URL, REDIS_URL.  The pass itself is
 * rm_compensate_run() (rm-client/src/fallback/rm_compensate.c): only one runs at a
 * time across all processes, it is idempotent, and it is safe to kill.
 *
 * Exit status: 0 the pass ran and left nothing failed, 1 an error (or rows
 * left failed), 2 usage, 75 another pass holds the lock (try later).
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rm_client.h"

static void log_to_stderr(int level, const char *msg, void *arg) {
  (void)arg;
  static const char *const names[] = {"?", "error", "warn", "info", "debug"};
  fprintf(stderr, "txc-compensate: %s: %s\n", level >= 1 && level <= 4 ? names[level] : "?", msg);
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: txc-compensate [--reconcile] [--activity ID] [--min-age-ms MS] [--verbose]\n"
          "Run one pass of the compensation job for orders taken in fallback-to-local\n"
          "mode: each pending order is finished (stock frozen) or cancelled with its\n"
          "Redis freeze released, and with --reconcile Redis is corrected from\n"
          "PostgreSQL.  Reads ORDERS_PG_URL, STOCK_PG_URL and REDIS_URL\n"
          "(or REDIS_SENTINELS and REDIS_MASTER_NAME: the master through Sentinel).\n"
          "exit status: 0 done, 1 error or rows left failed, 2 usage, 75 another pass runs\n");
}

int main(int argc, char **argv) {
  static const struct option lo[] = {{"reconcile", no_argument, NULL, 'r'},
                                     {"activity", required_argument, NULL, 'a'},
                                     {"min-age-ms", required_argument, NULL, 'm'},
                                     {"verbose", no_argument, NULL, 'v'},
                                     {"help", no_argument, NULL, 'h'},
                                     {NULL, 0, NULL, 0}};
  rm_comp_options_t o;
  memset(&o, 0, sizeof(o));
  o.log_cb = log_to_stderr;
  int ch;
  while ((ch = getopt_long(argc, argv, "ra:m:vh", lo, NULL)) != -1) {
    switch (ch) {
    case 'r': o.reconcile = true; break;
    case 'a': o.activity_id = strtoll(optarg, NULL, 10); break;
    case 'm': o.min_age_ms = (unsigned)strtoul(optarg, NULL, 10); break;
    case 'v': o.log_level = RM_LOG_INFO; break;
    case 'h': usage(stdout); return 0;
    default: usage(stderr); return 2;
    }
  }
  const char *orders = getenv("ORDERS_PG_URL"), *stock = getenv("STOCK_PG_URL"), *redis;
  char redis_buf[4096];
  /* REDIS_SENTINELS + REDIS_MASTER_NAME (cluster/local/up --ha), else REDIS_URL */
  redis = rm_redis_url_from_env(redis_buf, sizeof(redis_buf));
  if (!orders || !*orders || !stock || !*stock) {
    fprintf(stderr, "txc-compensate: ORDERS_PG_URL and STOCK_PG_URL must be set (see cluster/local/up)\n");
    return 2;
  }
  rm_prefilter_t *pf = NULL;
  if (redis && *redis) {
    rm_pf_options_t po;
    memset(&po, 0, sizeof(po));
    po.log_cb = log_to_stderr;
    int rc = rm_prefilter_new(redis, &po, &pf);
    if (rc != 0) {
      fprintf(stderr, "txc-compensate: invalid REDIS_URL \"%s\": %s\n", redis, rm_strerror(rc));
      return 2;
    }
  } else if (o.reconcile) {
    fprintf(stderr, "txc-compensate: --reconcile needs REDIS_URL\n");
    return 2;
  }
  rm_comp_report_t r;
  memset(&r, 0, sizeof(r));
  int rc = rm_compensate_run(orders, stock, pf, &o, &r);
  rm_prefilter_free(pf);
  if (rc == RM_COMP_E_LOCKED) {
    fprintf(stderr, "txc-compensate: another compensation pass is running; nothing done\n");
    return 75;
  }
  if (rc != 0) {
    fprintf(stderr, "txc-compensate: could not run the pass: %s: %s\n", rm_strerror(rc), rm_local_errmsg());
    return 1;
  }
  printf("{\"rows\":%u,\"frozen\":%u,\"cancelled\":%u,\"failed\":%u,\"pending\":%u,"
         "\"activities\":%u,\"reconcile_failed\":%u}\n",
         r.rows, r.frozen, r.cancelled, r.failed, r.pending, r.activities, r.reconcile_failed);
  return r.failed || r.reconcile_failed ? 1 : 0;
}
