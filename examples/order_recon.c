/*
 * order_recon.c - order-service's schedule of the daily reconciliation
 * (order_recon.h, reconcile.h).
 */
#include "order_recon.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "reconcile.h"
#include "txc_worker.h"

struct order_recon {
  recon_opts_t o;
  int at_min;           /* daily: minutes after midnight UTC */
  long long interval_s; /* > 0: every this many seconds instead */
  txc_worker_t job;
  /* Under job.mu: the runs by result, and the last run's result. */
  unsigned long long runs[5]; /* by recon_status_t */
  bool have_last;
  long long last_run_id;
  double last_unix;
  size_t last_total;
  size_t last_by_kind[16];
};

static double wall_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Seconds from now to the next HH:MM (UTC). */
static long long seconds_to_daily(int at_min) {
  time_t now = time(NULL);
  struct tm tm;
  gmtime_r(&now, &tm);
  long long since_midnight = tm.tm_hour * 3600LL + tm.tm_min * 60LL + tm.tm_sec;
  long long at = at_min * 60LL, d = at - since_midnight;
  return d > 0 ? d : d + 86400;
}

static void run_once(order_recon_t *r) {
  recon_result_t res;
  recon_status_t st = recon_run(&r->o, &res);
  if (st == RECON_LOCKED) st = RECON_SKIPPED; /* another instance is running it */
  res.status = st;
  recon_log(&res);
  pthread_mutex_lock(&r->job.mu);
  r->runs[st]++;
  if (st == RECON_OK || st == RECON_DIFFERENCES) {
    r->have_last = true;
    r->last_run_id = res.run_id;
    r->last_unix = wall_s();
    r->last_total = res.ndiffs;
    for (size_t i = 0; i < recon_nkinds && i < sizeof(r->last_by_kind) / sizeof(r->last_by_kind[0]); i++)
      r->last_by_kind[i] = recon_count_kind(&res, recon_kinds[i].kind);
  }
  pthread_mutex_unlock(&r->job.mu);
  recon_result_free(&res);
}

static void *recon_main(void *arg) {
  order_recon_t *r = arg;
  for (;;) {
    /* Sleep until the next run, a minute at most at a time (the wall
     * clock may jump), or until stopped. */
    long long wait_s = r->interval_s > 0 ? r->interval_s : seconds_to_daily(r->at_min);
    int64_t due = svc_now_us() + wait_s * 1000000LL;
    for (int64_t left; (left = due - svc_now_us()) > 0;) {
      if (!txc_worker_sleep(&r->job, ((left < 60000000LL ? left : 60000000LL) + 999) / 1000)) return NULL;
      if (r->interval_s <= 0 && left > 60000000LL) due = svc_now_us() + seconds_to_daily(r->at_min) * 1000000LL;
    }
    run_once(r);
  }
}

order_recon_t *order_recon_start(const char *orders_url, bool *ok) {
  const char *at = svc_env_str("ORDER_RECONCILE_AT", "02:30");
  long long interval = svc_env_int("ORDER_RECONCILE_INTERVAL_S", 0, 0, 86400LL * 7, ok);
  long long settle = svc_env_int("ORDER_RECONCILE_SETTLE_S", 300, 0, 86400LL * 30, ok);
  int hh = -1, mm = -1;
  char extra;
  bool off = strcmp(at, "off") == 0;
  if (!off && (sscanf(at, "%d:%d%c", &hh, &mm, &extra) != 2 || hh < 0 || hh > 23 || mm < 0 || mm > 59)) {
    svc_error("invalid value \"%s\" for ORDER_RECONCILE_AT: expected HH:MM (UTC) or off", at);
    *ok = false;
  }
  if (!*ok || (off && interval == 0)) return NULL;
  const char *stock = svc_env_str("STOCK_PG_URL", NULL);
  if (!stock) {
    svc_warn("STOCK_PG_URL is not set: no daily reconciliation in this instance");
    return NULL;
  }
  order_recon_t *r = calloc(1, sizeof(*r));
  if (!r) return NULL;
  r->o = (recon_opts_t){.orders_url = orders_url, .stock_url = stock,
                        .events_url = svc_env_str("EVENTS_PG_URL", NULL), .settle_s = settle,
                        .started_by = "schedule", .lock_wait_ms = 0,
                        .skip_within_s = interval > 0 ? (interval + 1) / 2 : 20 * 3600};
  r->at_min = off ? 0 : hh * 60 + mm;
  r->interval_s = interval;
  if (txc_worker_start(&r->job, recon_main, r) != 0) {
    svc_warn("could not start the reconciliation thread");
    free(r);
    return NULL;
  }
  if (interval > 0)
    svc_info("reconciliation every %lld s (settle margin %lld s)", interval, settle);
  else
    svc_info("reconciliation daily at %02d:%02d UTC (settle margin %lld s)", hh, mm, settle);
  return r;
}

void order_recon_metrics(order_recon_t *r, txc_buf_t *b) {
  static const char *const results[5] = {"ok", "differences", "failed", "locked", "skipped"};
  unsigned long long runs[5] = {0};
  bool have = false;
  long long id = 0;
  double when = 0;
  size_t total = 0, by_kind[16] = {0};
  if (r) {
    pthread_mutex_lock(&r->job.mu);
    memcpy(runs, r->runs, sizeof(runs));
    have = r->have_last;
    id = r->last_run_id;
    when = r->last_unix;
    total = r->last_total;
    memcpy(by_kind, r->last_by_kind, sizeof(by_kind));
    pthread_mutex_unlock(&r->job.mu);
  }
  txc_buf_printf(b, "# HELP txc_reconcile_runs_total Scheduled reconciliation runs of this instance by result "
                    "(skipped: another instance ran it).\n"
                    "# TYPE txc_reconcile_runs_total counter\n");
  for (int i = 0; i < 5; i++) {
    if (i == RECON_LOCKED) continue; /* counted as skipped */
    txc_buf_printf(b, "txc_reconcile_runs_total{result=\"%s\"} %llu\n", results[i], runs[i]);
  }
  if (!have) return;
  txc_buf_printf(b, "# HELP txc_reconcile_differences Differences the last reconciliation run of this instance "
                    "found, by kind.\n"
                    "# TYPE txc_reconcile_differences gauge\n");
  for (size_t i = 0; i < recon_nkinds && i < 16; i++)
    txc_buf_printf(b, "txc_reconcile_differences{check=\"%s\",kind=\"%s\"} %zu\n", recon_kinds[i].check,
                   recon_kinds[i].kind, by_kind[i]);
  txc_buf_printf(b,
                 "# TYPE txc_reconcile_last_differences gauge\ntxc_reconcile_last_differences %zu\n"
                 "# TYPE txc_reconcile_last_run_id gauge\ntxc_reconcile_last_run_id %lld\n"
                 "# TYPE txc_reconcile_last_run_timestamp_seconds gauge\n"
                 "txc_reconcile_last_run_timestamp_seconds %.3f\n",
                 total, id, when);
}

void order_recon_stop(order_recon_t *r) {
  if (!r) return;
  txc_worker_stop(&r->job);
  free(r);
}
