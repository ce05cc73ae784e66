/*
 * order_recon.h - order-service's schedule of the daily reconciliation
 * (reconcile.h): a thread that runs it once a day at ORDER_RECONCILE_AT
 * (HH:MM, UTC; default 02:30; "off": never), or every
 * ORDER_RECONCILE_INTERVAL_S seconds when that is set (the demo and the
 * tests), with the settle margin ORDER_RECONCILE_SETTLE_S (default 300).
 * One run over all instances: the run's advisory lock, and a run is
 * skipped when another instance's scheduled run was done within the
 * period (a day: 20 hours; an interval: half of it).  The result of this
 * instance's last run is on /metrics (order_recon_metrics).
 */
#ifndef ORDER_RECON_H
#define ORDER_RECON_H

#include <stdbool.h>

#include "svc_common.h"

typedef struct order_recon order_recon_t;

/* Read the settings and start the thread: NULL when the schedule is off
 * or cannot run (no STOCK_PG_URL: logged); '*ok' false on a malformed
 * setting (the service refuses to start). */
order_recon_t *order_recon_start(const char *orders_url, bool *ok);
/* txc_reconcile_* lines (runs by result; the last run's differences by
 * kind, its time and id) for GET /metrics; 'r' may be NULL (the runs, all
 * zero). */
void order_recon_metrics(order_recon_t *r, txc_buf_t *b);
/* Stop the thread (waits for a run in progress) and free; NULL: nothing. */
void order_recon_stop(order_recon_t *r);

#endif /* ORDER_RECON_H */
