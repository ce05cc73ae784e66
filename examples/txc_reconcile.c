/*
 * txc_reconcile.c - txc-reconcile, one run of the daily reconciliation by
 * hand or from a script (build/bin/txc-reconcile; reconcile.h).
 *
 * NOTES
 *     txc-reconcile [--since TS] [--until TS] [--day YYYY-MM-DD]
 *                   [--settle SECONDS] [--lock-wait SECONDS] [--json]
 *   compares the orders of the window with the payment ledger, the stock
 *   database and the points (reconcile.h), records the run and its
 *   differences in the orders database (reconcile_run,
 *   reconcile_difference), writes the alert line (the services' JSON log
 *   format) on stderr and the result on stdout: a table, or with --json
 *   the document recon_result_json describes.
 *   The window: --since/--until (PostgreSQL timestamps, e.g.
 *   2026-12-01T00:00:00Z), or --day (that UTC day); by default the day
 *   up to now minus the settle margin (--settle, default
 *   $ORDER_RECONCILE_SETTLE_S or 300 s), and never later than that.
 *   Databases: ORDERS_PG_URL and STOCK_PG_URL (required), EVENTS_PG_URL
 *   (unset: the points are not compared, and the output says so), the
 *   variables the services read.  A run of order-service's schedule holding
 *   the lock is waited for up to --lock-wait seconds (default 60).
 *   Exit status: 0 no difference, 1 differences found, 2 could not run
 *   (usage, database, lock).
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reconcile.h"
#include "svc_common.h"

#define PROG "txc-reconcile"

static void usage(FILE *f) {
  fprintf(f,
          "usage: " PROG " [--since TS] [--until TS] [--day YYYY-MM-DD] [--settle SECONDS]\n"
          "                     [--lock-wait SECONDS] [--json]\n"
          "       " PROG " --help\n"
          "\n"
          "The daily reconciliation (examples/reconcile.h): the orders of a window against the\n"
          "payment ledger, the stock database (freezes, sold counts) and the points.\n"
          "  --since TS, --until TS  the window [since, until) (PostgreSQL timestamps)\n"
          "  --day YYYY-MM-DD        the window is that UTC day\n"
          "                          (default: the day up to now - settle)\n"
          "  --settle SECONDS        leave what changed this recently for the next run\n"
          "                          (default $ORDER_RECONCILE_SETTLE_S, else 300)\n"
          "  --lock-wait SECONDS     wait this long for a run in progress (default 60)\n"
          "  --json                  the result as JSON on stdout\n"
          "Environment: ORDERS_PG_URL, STOCK_PG_URL, EVENTS_PG_URL (unset: points not compared).\n"
          "The run and its differences are recorded in the orders database (reconcile_run,\n"
          "reconcile_difference); the alert line goes to stderr.\n"
          "\n"
          "exit status: 0 no difference, 1 differences found, 2 could not run\n");
}

static int usage_error(const char *msg, const char *arg) {
  fprintf(stderr, PROG ": %s%s%s%s (see " PROG " --help)\n", msg, arg ? " \"" : "", arg ? arg : "", arg ? "\"" : "");
  return 2;
}

static void print_text(const recon_result_t *r) {
  printf("reconciliation run %lld: window %s .. %s\n", r->run_id, r->since, r->until);
  printf("compared: %lld paid orders, %lld ledger entries, %lld confirmed freezes, %lld buckets, ", r->paid_orders,
         r->ledger_entries, r->confirmed_freezes, r->buckets);
  if (r->points_rows >= 0)
    printf("%lld points rows\n", r->points_rows);
  else
    printf("points not compared (EVENTS_PG_URL is not set)\n");
  if (!r->ndiffs) {
    printf("0 differences\n");
    return;
  }
  printf("%zu difference%s:\n", r->ndiffs, r->ndiffs == 1 ? "" : "s");
  printf("  %-8s %-22s %-10s %-12s %-12s %s\n", "check", "kind", "order", "expected", "actual", "reason");
  for (size_t i = 0; i < r->ndiffs; i++) {
    const recon_diff_t *d = &r->diffs[i];
    char id[24] = "-";
    if (d->order_id >= 0) snprintf(id, sizeof(id), "%lld", d->order_id);
    printf("  %-8s %-22s %-10s %-12s %-12s %s\n", d->check, d->kind, id, d->expected[0] ? d->expected : "-",
           d->actual[0] ? d->actual : "-", d->reason);
  }
}

int main(int argc, char **argv) {
  svc_log_init(PROG, "RECONCILE_LOG_LEVEL");
  recon_opts_t o = {.started_by = "tool", .lock_wait_ms = 60000};
  bool json = false, ok = true;
  o.settle_s = svc_env_int("ORDER_RECONCILE_SETTLE_S", 300, 0, 86400LL * 30, &ok);
  if (!ok) return 2;
  for (int i = 1; i < argc; i++) {
    bool missing = false;
    const char *v;
    const char *a = argv[i];
    if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
      usage(stdout);
      return 0;
    } else if (strcmp(a, "--json") == 0) {
      json = true;
    } else if ((v = svc_opt_value(argc, argv, &i, "--since", &missing)) || missing) {
      if (missing || !*v) return usage_error("--since needs a timestamp", NULL);
      o.since = v;
    } else if ((v = svc_opt_value(argc, argv, &i, "--until", &missing)) || missing) {
      if (missing || !*v) return usage_error("--until needs a timestamp", NULL);
      o.until = v;
    } else if ((v = svc_opt_value(argc, argv, &i, "--day", &missing)) || missing) {
      if (missing || strlen(v) != 10 || v[4] != '-' || v[7] != '-')
        return usage_error("--day needs a date YYYY-MM-DD", v);
      o.day = v;
    } else if ((v = svc_opt_value(argc, argv, &i, "--settle", &missing)) || missing) {
      long long x;
      if (missing || !svc_parse_ll(v, 0, 86400LL * 30, &x)) return usage_error("invalid --settle", v);
      o.settle_s = x;
    } else if ((v = svc_opt_value(argc, argv, &i, "--lock-wait", &missing)) || missing) {
      long long x;
      if (missing || !svc_parse_ll(v, 0, 3600, &x)) return usage_error("invalid --lock-wait", v);
      o.lock_wait_ms = (unsigned)x * 1000;
    } else {
      return usage_error("unknown argument", a);
    }
  }
  if (o.day && (o.since || o.until)) return usage_error("--day and --since/--until exclude each other", NULL);
  o.orders_url = svc_env_str("ORDERS_PG_URL", NULL);
  o.stock_url = svc_env_str("STOCK_PG_URL", NULL);
  o.events_url = svc_env_str("EVENTS_PG_URL", NULL);
  if (!o.orders_url || !o.stock_url) {
    fprintf(stderr, PROG ": ORDERS_PG_URL and STOCK_PG_URL must be set (cluster/local/up prints them)\n");
    return 2;
  }

  recon_result_t r;
  recon_status_t st = recon_run(&o, &r);
  recon_log(&r);
  if (json) {
    json_t *j = recon_result_json(&r);
    char *s = json_dumps(j, JSON_INDENT(2) | JSON_ENSURE_ASCII);
    if (s) printf("%s\n", s);
    free(s);
    json_decref(j);
  } else if (st == RECON_OK || st == RECON_DIFFERENCES) {
    print_text(&r);
  } else {
    fprintf(stderr, PROG ": %s\n", r.error);
  }
  recon_result_free(&r);
  return st == RECON_OK ? 0 : st == RECON_DIFFERENCES ? 1 : 2;
}
