/*
 * reconcile.h - the daily reconciliation of the flash-sale demo (issue 24):
 * what the orders database says was sold and paid, compared with the
 * payment ledger, the stock database and the points of the events
 * database.  One run is recon_run(); build/bin/txc-reconcile
 * (txc_reconcile.c) runs it by hand, order-service's schedule
 * (order_recon.c) once a day.
 *
 * NOTES
 *   A run compares a window [since, until) of time; by default the day
 *   before its end, which is now minus the settle margin: the order
 *   events are eventually consistent (a payment reaches the stock and the
 *   points a moment after it committed), so what changed within the margin
 *   is left for the next run.  Three comparisons, each in both directions:
 *
 *     payment  the orders PAID in the window against payment_ledger (the
 *              provider's statement), and the ledger's entries of the
 *              window against the orders:
 *                paid_without_ledger    a PAID order without an entry
 *                ledger_without_order   an entry for an order that does not exist
 *                ledger_order_not_paid  an entry for an order that is not PAID
 *                amount_mismatch        the entry's amount is not the order's
 *     stock    the orders PAID in the window against their stock_freeze,
 *              the freezes confirmed in the window against their orders,
 *              and, per bucket of the activities sold in the window, the
 *              tickets of the confirmed freezes against sold_count:
 *                paid_not_confirmed     a PAID order whose freeze is not CONFIRMED (or missing)
 *                confirmed_not_paid     a CONFIRMED freeze whose order is not PAID (or missing)
 *                sold_count_mismatch    a bucket's sold_count is not its confirmed tickets
 *     points   the orders PAID in the window against points_ledger
 *              (qty * 100 points each, the points group's rule), and the
 *              points of the window against the orders:
 *                paid_without_points    a PAID order without its points row
 *                points_not_paid        points for an order that is not PAID (or missing)
 *                points_mismatch        the points are not qty * 100
 *              (only with an events database: without one the run says
 *              so and compares the rest).
 *
 *   The run is recorded in the orders database (sql/orders/005):
 *   reconcile_run (RUNNING, then DONE with the count or FAILED with the
 *   error) and one reconcile_difference row per difference, written in
 *   one transaction with the run's end.  One run at a time over all
 *   processes: the run holds the session advisory lock RECON_LOCK_KEY on
 *   the orders database (a second run waits for it up to lock_wait_ms,
 *   then gives up with RECON_LOCKED).  Nothing is repaired: a difference
 *   is for an operator to look at.
 *
 *   Not thread-safe per result; recon_run itself may run in any thread
 *   (it opens its own connections).  The library never prints: the alert
 *   line is recon_log's, the caller's choice.
 */
#ifndef RECONCILE_H
#define RECONCILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

/* pg_try_advisory_lock key of the reconciliation on the orders database
 * (any constant of ours: db-migrate 7466001, relay 7466019, compensation
 * 7466101). */
#define RECON_LOCK_KEY "7466124"
/* The points group's rule (event_consumers.c, POINTS_PER_TICKET). */
#define RECON_POINTS_PER_TICKET 100

typedef enum {
  RECON_OK = 0,          /* compared, no difference */
  RECON_DIFFERENCES = 1, /* compared, differences found (and recorded) */
  RECON_FAILED = 2,      /* could not compare ('error' says why) */
  RECON_LOCKED = 3,      /* another run held the lock for lock_wait_ms */
  RECON_SKIPPED = 4      /* skip_within_s: a run of the same starter was done recently */
} recon_status_t;

typedef struct recon_opts {
  const char *orders_url; /* the orders database (required) */
  const char *stock_url;  /* the stock database (required) */
  const char *events_url; /* the events database; NULL: points not compared */
  /* The window, as PostgreSQL timestamptz text ("2026-12-01T00:00:00Z");
   * NULL: until = now - settle, since = until - 1 day.  'day'
   * (YYYY-MM-DD, UTC) instead sets both to that day.  Either way the end
   * is cut to now - settle. */
  const char *since, *until, *day;
  long long settle_s;    /* the settle margin, seconds */
  const char *started_by; /* "tool" or "schedule" */
  unsigned lock_wait_ms;
  /* > 0: skip (RECON_SKIPPED) when a run of the same starter finished
   * DONE within this many seconds (another instance did the day's run). */
  long long skip_within_s;
} recon_opts_t;

typedef struct recon_diff {
  const char *check; /* "payment", "stock", "points" (static) */
  const char *kind;  /* one of recon_kinds (static) */
  char reason[256];
  long long order_id, activity, ticket_type, bucket; /* -1: not known / not an order's */
  char expected[48], actual[48];                   /* "" = NULL */
} recon_diff_t;

typedef struct recon_result {
  recon_status_t status;
  long long run_id; /* 0: not recorded */
  char since[40], until[40];
  long long paid_orders, ledger_entries, confirmed_freezes, buckets;
  long long points_rows; /* -1: the events database was not compared */
  size_t ndiffs, cap;
  recon_diff_t *diffs;
  char error[512];
} recon_result_t;

/* Every kind and its check, in report order (for metrics with zeros). */
typedef struct recon_kind {
  const char *check, *kind;
} recon_kind_t;
extern const recon_kind_t recon_kinds[];
extern const size_t recon_nkinds;

/* One run with 'o' into 'res' (zeroed here; free with recon_result_free).
 * Returns res->status. */
recon_status_t recon_run(const recon_opts_t *o, recon_result_t *res);
void recon_result_free(recon_result_t *res);
/* How many differences of 'kind' the result has. */
size_t recon_count_kind(const recon_result_t *res, const char *kind);
/* The result as JSON: {status, run_id, window {since, until}, counts,
 * total, by_kind, differences [{check, kind, reason, order_id, activity,
 * ticket_type, bucket, expected, actual}], error}. */
json_t *recon_result_json(const recon_result_t *res);
/* The alert line through svc_log (svc_common.h): error level "reconciliation
 * found N differences" with run_id, window and by_kind; info level when
 * there is none; error "could not reconcile" on failure; nothing when
 * skipped. */
void recon_log(const recon_result_t *res);

#endif /* RECONCILE_H */
