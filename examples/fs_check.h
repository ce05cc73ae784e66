/*
 * fs_check.h - seeding a flash-sale activity and checking the invariants
 * of a finished sale, directly on PostgreSQL and Redis.  Used by the load
 * generator (flashsale.c) and the benchmarks.
 *
 * NOTES
 *   The invariants (DESIGN.md, "Invariants every test suite checks"):
 *     no_oversell_pg      every bucket: 0 <= frozen, 0 <= sold,
 *                         frozen + sold <= stock
 *     no_oversell_redis   the same on the prefilter's copy
 *     totals_conserved    stock sums to the tickets seeded; per bucket the
 *                         stock_log ledger (freeze - confirm - release,
 *                         confirm), the stock_freeze rows (FROZEN,
 *                         CONFIRMED) and the orders (UNPAID, PAID) give
 *                         exactly frozen_count and sold_count
 *     client_view         every order answered 201 exists, every order
 *                         answered "paid" is PAID
 *     one_order_per_key   no (user_id, idem_key) has two orders in
 *                         PostgreSQL; every Idempotency-Key the client
 *                         saw answered 201 more than once got the same
 *                         order each time, and that order holds the key
 *     within_user_limit   no user holds more than the activity's
 *                         per-user limit: in the orders (UNPAID, PAID)
 *                         nor in the stock freezes (not RELEASED)
 *     globals_finished    every global transaction of the run ended
 *                         Committed or Rolled back
 *     no_leftover_locks   no global lock and no pending undo_log row left
 *     events_delivered    every order event (pay, cancel, expiry) is
 *                         published and applied to the stock, none is
 *                         dead-lettered
 *     redis_equals_pg     the prefilter's per-bucket counters equal
 *                         PostgreSQL's, and a dry-run reconciliation finds
 *                         nothing to change (users' counts, freeze records,
 *                         deadlines)
 *     consumers_once      (with EVENTS_PG_URL; skipped without) the
 *                         downstream consumers (event-consumers) applied
 *                         every PAID order of the activity exactly once:
 *                         one points_ledger row of qty * 100 points, one
 *                         member_notice row and qty issued_ticket rows
 *                         (seq 1..qty); no row for an order of the
 *                         activity that is not PAID; no dead letter in the
 *                         events database (state DEAD or REDELIVER)
 *   A check that could not be made counts as failed.
 */
#ifndef FS_CHECK_H
#define FS_CHECK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include <jansson.h>

typedef struct fs_env {
  const char *order_url, *stock_pg, *orders_pg, *tc_pg, *redis_url;
  const char *events_pg; /* EVENTS_PG_URL, may be NULL: consumers_once is skipped */
} fs_env_t;

/* Read the environment; prints what is missing to stderr (EVENTS_PG_URL
 * is optional). */
bool fs_env_load(fs_env_t *env);

/* The queued order mode: the orders 'ids[0..n-1]', answered 202 at
 * 'sent_ms[i]' (unix ms), are made a moment later.  Wait (at most
 * 'bound_s') until all exist in the orders database 'orders_pg', then
 * write each one's time from its click to its trade_order row (created_at,
 * the same host's clock) in microseconds to 'lat_us' (room for n; sorted),
 * their number to '*made' and the last row's created_at (unix ms) to
 * '*last_ms'.  false (message on stderr) when the database failed. */
bool fs_created_latency(const char *orders_pg, const long long *ids, const int64_t *sent_ms, size_t n,
                        double bound_s, long long *lat_us, size_t *made, int64_t *last_ms);

typedef struct fs_activity {
  long long activity; /* 0: choose the next free id */
  long long ticket_type, tickets, buckets, limit;
  /* The sale window: 0 = on sale from now (status 1, starts_at now - 1 s,
   * ends_at now + 1 day); > 0 = the sale opens in open_in_ms (status 0:
   * stock-service's window job opens it) and closes close_after_ms after
   * that (default 60 s).  PostgreSQL's clock. */
  long long open_in_ms, close_after_ms;
  bool redis_seeded;  /* out: the prefilter's copy was loaded */
  long long starts_ms, ends_ms; /* out: starts_at and ends_at, unix ms */
} fs_activity_t;

typedef struct fs_check fs_check_t;

fs_check_t *fs_check_new(const fs_env_t *env);
void fs_check_free(fs_check_t *c);

/* Create the activity (on sale from now, or in the window a->open_in_ms
 * asks for) and its buckets in the stock database, and the prefilter's
 * copy in Redis; remembers the run's start on the coordinator's clock. */
bool fs_seed(fs_check_t *c, fs_activity_t *a, char *err, size_t errlen);

/* The activity's status now in PostgreSQL (activity.status) and in Redis
 * (the meta hash's status; -1 when absent).  false with 'err' set when
 * either could not be read. */
bool fs_sale_status(fs_check_t *c, const fs_activity_t *a, int *pg_status, int *redis_status, char *err,
                    size_t errlen);

/* One 201 answer to a POST /orders that carried an Idempotency-Key. */
typedef struct fs_keyed {
  char key[72]; /* the key sent (at most 64 bytes) */
  long long user, order_id;
} fs_keyed_t;

typedef struct fs_client_view {
  const long long *accepted; /* order ids answered 201 */
  size_t naccepted;
  const long long *paid;     /* order ids answered 200 to pay */
  size_t npaid;
  const fs_keyed_t *keyed;   /* every 201 to a keyed request, retries and replays included */
  size_t nkeyed;
} fs_client_view_t;

enum { FS_SKIPPED = -1, FS_FAILED = 0, FS_HOLDS = 1 };

typedef struct fs_invariant {
  const char *name;
  int state;
  char detail[256];
} fs_invariant_t;

#define FS_MAX_INV 16

typedef struct fs_result {
  long long stock, sold, frozen, available;
  long long orders_unpaid, orders_paid, orders_cancelled, orders_expired;
  long long committed, rolled_back, unfinished, other_final;
  long long events, events_unapplied, dead_letters; /* pay/cancel/expiry as order events */
  double settle_s;
  fs_invariant_t inv[FS_MAX_INV];
  int ninv;
  bool ok;
} fs_result_t;

/* Check an existing activity instead of seeding one: fills 'a' (tickets,
 * buckets, limit) from the stock database; the global transactions
 * counted are then all of order-service's, not only a run's. */
bool fs_load(fs_check_t *c, fs_activity_t *a, char *err, size_t errlen);

/* Wait up to 'settle_s' for the run's global transactions to finish, then
 * check every invariant into 'res'. */
void fs_check_run(fs_check_t *c, const fs_activity_t *a, const fs_client_view_t *view, int settle_s,
                  fs_result_t *res);

void fs_print_invariants(const fs_result_t *res, FILE *f);
/* {name: {"ok": true|false|null, "detail": "..."}} */
json_t *fs_invariants_json(const fs_result_t *res);

#endif /* FS_CHECK_H */
