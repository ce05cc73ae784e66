/*
 * svc_consumer.h - an idempotent consumer group of the order events
 * (the Redis stream that svc_outbox.h's relay fills), with backoff
 * retries, dead letters and redelivery.
 *
 * NOTES
 *   Each event is applied in a local transaction of the consumer's own
 *   database together with its consumed_event row (sql/consumer/), keyed
 *   (group, biz_key = "<type>:<order_id>"): whatever the stream redelivers
 *   (a consumer killed before XACK, a relay that published again, a Redis
 *   that lost its acknowledgements), the effect happens once.  A Redis
 *   mark (SET NX, the seed's fast path) lets repeats skip the database; a
 *   failure removes it so that the retry gets in.  PostgreSQL decides.
 *
 *   Events read together (XREADGROUP, up to batch_max) are applied together: one
 *   transaction, one INSERT of their consumed_event rows, their effects
 *   in stream order (one apply_batch call when the group has one, else
 *   an apply each), one COMMIT; their marks, XACK and error-hash cleanup
 *   in one Redis round trip.  After a read that brought events the next
 *   one waits until CONSUMER_LINGER_MS (default 300) after it, so that
 *   under load the events per commit grow; an event that finds the
 *   consumer idle is applied at once.  If any effect of the batch fails, the batch is
 *   rolled back and its events are applied one by one, each in its own
 *   transaction, so only the failing one retries or is dead-lettered.
 *
 *   The apply callback answers:
 *     SVC_EV_DONE   applied (or nothing to do): commit, acknowledge;
 *     SVC_EV_RETRY  not now (a store down, the order's stock not decided
 *                   yet): roll back; the entry stays pending and is tried
 *                   again after the backoff of its delivery count
 *                   (CONSUMER_BACKOFF_MS, default the seed's 1 s, 5 s,
 *                   10 s, 30 s, 1 min, 2 min, ... 30 min); after
 *                   max_deliveries (CONSUMER_MAX_DELIVERIES, default 16)
 *                   it goes to dead_letter;
 *     SVC_EV_DEAD   never (a malformed or contradictory event): roll back,
 *                   to dead_letter at once.
 *   A dead letter is acknowledged in the stream and logged at error level
 *   (the alert line: "event dead-lettered").  An operator fixes the cause
 *   and runs `txc-events redeliver`, which marks the row REDELIVER; the
 *   consumer applies it from there (the same idempotent path) and marks
 *   it REDELIVERED, or DEAD again with the new reason.
 *
 *   Entries pending at a consumer that died are claimed (XCLAIM) by any
 *   live consumer of the group once their backoff passed: the same path
 *   as a retry, so a crash costs at most one backoff step.
 *   One thread per consumer; it owns its PostgreSQL and Redis connections.
 */
#ifndef SVC_CONSUMER_H
#define SVC_CONSUMER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>
#include <libpq-fe.h>

#include "svc_common.h"
#include "svc_event.h"

typedef enum { SVC_EV_DONE = 0, SVC_EV_RETRY = 1, SVC_EV_DEAD = 2 } svc_ev_result_t;

/* Apply 'ev' inside the open transaction of 'pg'; on RETRY or DEAD say why
 * in 'why'. */
typedef svc_ev_result_t (*svc_event_apply_fn)(PGconn *pg, const svc_event_t *ev, void *arg, char *why,
                                              size_t whylen);
/* Optional: apply the 'n' events of one batch (n >= 2, in stream order)
 * inside the open transaction, as 'n' calls of the apply would, but in as
 * few statements as it can.  Anything but DONE rolls the batch back and
 * the consumer applies the events one by one with the apply. */
typedef svc_ev_result_t (*svc_event_apply_batch_fn)(PGconn *pg, const svc_event_t *const *evs, size_t n, void *arg,
                                                    char *why, size_t whylen);
/* After the commit, and for a repeat of an event applied before: the
 * event's effects outside the database (Redis), which must be idempotent. */
typedef void (*svc_event_after_fn)(const svc_event_t *ev, void *arg);

typedef struct svc_consumer_opts {
  const char *redis_url, *pg_url;
  const char *stream;   /* NULL: SVC_ORDER_STREAM */
  const char *group;    /* e.g. "stock", "points" */
  const char *consumer; /* NULL: "<host>-<pid>" */
  svc_event_apply_fn apply;
  svc_event_apply_batch_fn apply_batch; /* may be NULL: the apply, event by event */
  svc_event_after_fn after; /* may be NULL */
  void *arg;
  /* the events must carry a valid "mac" (svc_auth.h); NULL: not checked */
  const svc_auth_t *auth;
  /* 0 / NULL: from the environment (CONSUMER_MAX_DELIVERIES,
   * CONSUMER_BACKOFF_MS="1000,5000,...") or the defaults */
  int max_deliveries;
  const int64_t *backoff_ms;
  size_t nbackoff;
  /* Events applied in one transaction at most (0: 64).  An apply that
   * updates hot rows either takes 1 (a batch would hold their row locks
   * until its commit) or updates them once, last, in its apply_batch, as
   * stock-service's does. */
  int batch_max;
} svc_consumer_opts_t;

typedef struct svc_consumer svc_consumer_t;

/* Start the consumer thread.  NULL with 'err' set (bad options). */
svc_consumer_t *svc_consumer_start(const svc_consumer_opts_t *o, char *err, size_t errlen);
/* Finish the event in hand and stop.  NULL is fine. */
void svc_consumer_stop(svc_consumer_t *c);

typedef struct svc_consumer_stats {
  uint64_t consumed;      /* applied now */
  uint64_t duplicates;    /* applied before: dropped */
  uint64_t retried;       /* a delivery that failed and will be tried again */
  uint64_t dead_lettered;
  uint64_t redelivered;   /* dead letters applied on an operator's request */
  uint64_t commits;       /* local transactions that applied events (consumed / commits: events per commit) */
  uint64_t errors;        /* store errors of the loop itself */
  long long pending;      /* the group's pending entries (XINFO GROUPS), -1 unknown */
  long long lag;          /* entries not yet delivered to the group, -1 unknown */
} svc_consumer_stats_t;
void svc_consumer_stats(svc_consumer_t *c, svc_consumer_stats_t *out);
const char *svc_consumer_group(const svc_consumer_t *c);

/* Append the Prometheus text of the consumers 'cs[0..n-1]' (labelled
 * group="...") to 'b'. */
void svc_consumer_metrics(svc_consumer_t *const *cs, size_t n, txc_buf_t *b);

#endif /* SVC_CONSUMER_H */
