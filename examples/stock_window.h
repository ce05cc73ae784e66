/*
 * stock_window.h - stock-service's sale-window job: opens and closes each
 * activity's sale at its activity.starts_at and ends_at, in PostgreSQL
 * (activity.status 0 -> 1 -> 2) and in the prefilter's copy in Redis
 * ({act_A}:meta status).
 *
 * NOTES
 *   What "on sale" means, and who enforces it (sql/stock/006, and
 *   pf_on_sale in lua/stock_lib.lua): status 1 and the clock inside
 *   [starts_at, ends_at).  PostgreSQL checks it at every freeze with its
 *   own clock, the Lua prefilter with the Redis server's (TIME) against
 *   the window fields 'starts' and 'ends' (unix ms) that the prefilter's
 *   seed and reconciliation copy into the meta hash.  This job moves the
 *   status at the times, so that both say "not started" / "on sale" /
 *   "ended" as an operator reads them, and the sale opens: until the job
 *   has set status 1 nothing is sold (a stopped job keeps a sale closed,
 *   never open: the close needs no job, the clocks do it).
 *
 *   One pass, on a connection of its own to the stock database:
 *     1. pg_try_advisory_lock(STOCK_WINDOW_LOCK_KEY) (session level, let
 *        go after the pass): one instance at a time over every
 *        stock-service; another instance's pass in progress makes this
 *        one a no-op ("skipped");
 *     2. one UPDATE moves every activity forward to what its window says
 *        now (0 -> 1 at starts_at, 0|1 -> 2 at ends_at; never backward:
 *        an ended sale stays ended, an operator's early 2 stays), logged
 *        per activity ("sale of activity N opened", "... closed", with
 *        how late after the time);
 *     3. Redis follows: for every activity not ended, or ended within the
 *        last 10 minutes, the meta hash's status and window are set to
 *        PostgreSQL's where they differ (only when the meta hash exists:
 *        an activity the prefilter never loaded stays unloaded).  This
 *        also repairs a Redis write a failed pass left undone;
 *     4. the next wake-up: the next starts_at or ends_at to come (plus a
 *        millisecond), or STOCK_WINDOW_INTERVAL_MS (1000) at most, so a
 *        sale opens within a few milliseconds of its time.
 *   Runs on its own thread; stop joins it.
 */
#ifndef STOCK_WINDOW_H
#define STOCK_WINDOW_H

#include <stdbool.h>

#include "svc_common.h"

/* The session advisory lock of the job on the stock database. */
#define STOCK_WINDOW_LOCK_KEY "7466131"

typedef struct stock_window stock_window_t;

/* Start the job on the stock database 'pg_url' and the Redis 'redis_url'
 * (may be NULL: PostgreSQL only).  Reads STOCK_WINDOW_INTERVAL_MS (1000;
 * 0: no job in this instance); a bad value clears '*ok'.  NULL when off or
 * on failure (logged). */
stock_window_t *stock_window_start(const char *pg_url, const char *redis_url, bool *ok);
/* Its counters for /metrics (nothing when 'w' is NULL). */
void stock_window_metrics(stock_window_t *w, txc_buf_t *b);
/* Stop and free; stock_window_stop(NULL) does nothing. */
void stock_window_stop(stock_window_t *w);

#endif /* STOCK_WINDOW_H */
