/*
 * budget.h - what the stack spent over a measured period, to divide by the
 * orders of that period: CPU time and context switches per component, and
 * counts that do not depend on the machine (PostgreSQL statements and
 * transactions by database, WAL bytes, records and full-page images,
 * commands Redis ran, frames the coordinators received, HTTP requests
 * stock-service answered).  Issue 23: "a per-order budget, counted, not
 * timed".
 *
 * NOTES
 *   A sample is taken at the start and at the end of the measured period;
 *   budget_json() turns the difference into per-order figures.  Each part
 *   is read only where the environment names it (the export lines of
 *   cluster/local/up and examples/services: PG_PID, TC_PIDS, ORDER_PID,
 *   STOCK_PID, REDIS_PID, TXC_PG_BASE_URL or TC_PG_URL, the *_PG_URL of
 *   each database, REDIS_URL, TC_ADMIN_SOCKETS, STOCK_URL); a part that
 *   cannot be read is left out of the JSON rather than reported as 0.
 *   Statements come from pg_stat_statements (the servers the scripts start
 *   load it); the sampling's own few statements are in the figures, which
 *   is noise below 0.01 per order at the benchmarks' sizes.  Threads that
 *   ended within the period (none in the services, which keep their pools)
 *   take their context switches with them.
 *
 *   Not thread-safe; takes tens of milliseconds (it runs queries and
 *   tcctl), so the load loop stalls that long at both ends.
 */
#ifndef BUDGET_H
#define BUDGET_H

#include <stdbool.h>

#include <jansson.h>

#include "pgstat.h"

enum { BUDGET_PG, BUDGET_TCD, BUDGET_ORDER, BUDGET_STOCK, BUDGET_REDIS, BUDGET_SELF, BUDGET_NCOMP };

typedef struct budget_sample {
  bool have_procs;                       /* the environment named the processes */
  long long cpu_ticks[BUDGET_NCOMP];     /* utime + stime */
  long long ctx_switches[BUDGET_NCOMP];  /* voluntary + involuntary, every thread */
  long long machine_ctx_switches;        /* /proc/stat ctxt, -1 unreadable */

  pgstat_t pg;                           /* WAL, and transactions and statements by database */

  long long redis_commands;              /* -1 unreadable */
  long long tc_frames_in;                /* summed over TC_ADMIN_SOCKETS; -1 unreadable */
  long long stock_http;                  /* HTTP answers of stock-service; -1 unreadable */
} budget_sample_t;

/* Take a sample now. */
void budget_sample(budget_sample_t *out);

/* The per-order figures between two samples over 'orders' orders:
 * {"cpu_ms": {component: ms, "total"}, "context_switches": {...},
 *  "machine_context_switches", "wal_bytes", "wal_records", "wal_fpi", "wal_syncs",
 *  "pg_transactions": {db: n, "total"}, "pg_statements": {...},
 *  "pg_rows_read": {db: n, "total"} (pg_stat_database.tup_returned),
 *  "redis_commands", "tc_frames", "stock_http_requests"} (parts that could
 * not be read are absent).  New reference, or NULL when orders <= 0. */
json_t *budget_json(const budget_sample_t *a, const budget_sample_t *b, long long orders);

#endif
