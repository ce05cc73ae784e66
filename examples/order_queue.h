/*
 * order_queue.h - the first seed's queued order path (ORDER_MODE=queued):
 * the consumer that turns the queue entries of the Lua freeze into orders.
 *
 * NOTES
 *   In queued mode POST /orders answers the buyer as soon as Redis froze
 *   the tickets (202 "QUEUED", with the order id and its order_token):
 *   the freeze script (rm_prefilter_freeze_queued) adds, in the same
 *   atomic step, an entry carrying the order to the activity's stream
 *   {act_A}:queue.  This consumer reads those streams in the consumer
 *   group "order-create" and hands each entry to the 'place' callback,
 *   which creates the order and takes the stock in PostgreSQL (the global
 *   transaction of the synchronous path, whose stock branch is the final
 *   check: stock - frozen - sold >= qty).  It answers:
 *     ORDER_QUEUE_DONE   the order exists now (or already did), or it was
 *                        refused and the buyer was told: acknowledged and
 *                        deleted from the stream;
 *     ORDER_QUEUE_LATER  the outcome is unknown (the coordinator did not
 *                        answer): left pending; claimed again after
 *                        ORDER_QUEUE_RETRY_MS by any consumer of the group
 *                        (XAUTOCLAIM), whose callback first looks for the
 *                        order in PostgreSQL.
 *   The streams are found from the activities this process queued for and,
 *   every ORDER_QUEUE_SCAN_MS, by a SCAN of the keys "{act_*}:queue" (the
 *   entries of another instance, or of this one before a restart).  A
 *   stream holds only entries not yet handled (they are deleted once
 *   done), at most the activity's stock, so nothing grows without bound.
 *   Each consumer thread owns its Redis connection and never runs on an
 *   event loop; the group spreads the entries over them.
 */
#ifndef ORDER_QUEUE_H
#define ORDER_QUEUE_H

#include <stddef.h>
#include <stdint.h>

#define ORDER_QUEUE_GROUP "order-create"
#define ORDER_QUEUE_RETRY_MS 5000
#define ORDER_QUEUE_SCAN_MS 2000

/* One queue entry, as the freeze script wrote it (every field checked). */
typedef struct order_queue_entry {
  long long activity, order_id, user, ticket_type, qty, bucket;
  int64_t deadline_ms;
  char key[65]; /* the request's Idempotency-Key, "" for none */
} order_queue_entry_t;

typedef enum { ORDER_QUEUE_DONE = 0, ORDER_QUEUE_LATER = 1 } order_queue_result_t;

typedef order_queue_result_t (*order_queue_place_fn)(const order_queue_entry_t *e, void *arg);

typedef struct order_queue order_queue_t;

/* Start 'threads' consumers (1 .. 256; each its own connection and
 * consumer name in the group) on 'redis_url' (borrowed).  NULL with 'err'
 * set. */
order_queue_t *order_queue_start(const char *redis_url, unsigned threads, order_queue_place_fn place, void *arg,
                                 char *err, size_t errlen);
/* An order of 'activity' was queued: read its stream (at once). */
void order_queue_note(order_queue_t *q, long long activity);
/* Finish the entry in hand and stop.  NULL is fine. */
void order_queue_stop(order_queue_t *q);

typedef struct order_queue_stats {
  unsigned long long done;    /* entries handled and deleted */
  unsigned long long later;   /* left pending for a retry */
  unsigned long long claimed; /* taken over after ORDER_QUEUE_RETRY_MS */
  unsigned long long bad;     /* malformed entries, deleted */
  unsigned long long errors;  /* Redis failures of the loop */
  unsigned streams;           /* activities known */
} order_queue_stats_t;
void order_queue_stats(order_queue_t *q, order_queue_stats_t *out);

#endif /* ORDER_QUEUE_H */
