/*
 * svc_outbox.h - the transactional outbox of the orders database and its
 * relay to the Redis stream of order events.
 *
 * NOTES
 *   Only the purchase is a global transaction.  Pay, cancel and expiry
 *   change the order in a local transaction and write their event with
 *   svc_outbox_add in that same transaction (sql/orders/004_outbox.sql):
 *   the event exists exactly when the change committed.  The relay, a
 *   thread of order-service, publishes committed events to the stream
 *   SVC_ORDER_STREAM, one instance at a time (a transaction-scoped
 *   advisory lock per pass), giving each its stream position at
 *   publication (stream_seq; the entry id is "<stream_seq>-0").
 *
 *   The table stays the record, the stream is only the channel: each pass
 *   first compares the stream's last id with the highest stream_seq
 *   recorded; a Redis that lost entries (a restart without AOF, a stream
 *   deleted) gets them again, in order, from the table.  Consumers are
 *   idempotent (svc_consumer.h), so a repeat costs a lookup.
 *
 *   A pass holds its PostgreSQL transaction over the XADDs (one pipelined
 *   round trip): a crash between XADD and COMMIT leaves entries the table
 *   does not know as published; the next pass publishes those events again
 *   under new positions, which consumers drop as duplicates.
 */
#ifndef SVC_OUTBOX_H
#define SVC_OUTBOX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>
#include <libpq-fe.h>

#include "svc_auth.h"
#include "svc_common.h"

#define SVC_ORDER_STREAM "txc:order-events"

/* Write the event 'type' ("order.paid", "order.cancelled",
 * "order.expired"; "waitlist.ordered", "waitlist.refused":
 * sql/orders/006) of 'order_id' with 'payload' (taken) in the open
 * transaction of 'pg'.  false with 'err' set. */
bool svc_outbox_add(PGconn *pg, const char *type, long long order_id, json_t *payload, char *err, size_t errlen);

/* The same event's row as one statement of a pipeline (svc_pg_pipeline),
 * for a caller that sends it with others: 'row->stmt' after
 * svc_outbox_row (which takes 'payload'; false with 'err' set when it
 * cannot be encoded), until svc_outbox_row_free.  'row' must stay where
 * it is meanwhile: the statement points into it. */
typedef struct svc_outbox_row {
  char order_id[24];
  char *payload;
  const char *params[3];
  svc_pg_stmt_t stmt;
} svc_outbox_row_t;
bool svc_outbox_row(svc_outbox_row_t *row, const char *type, long long order_id, json_t *payload, char *err,
                    size_t errlen);
void svc_outbox_row_free(svc_outbox_row_t *row);

typedef struct svc_relay_opts {
  const char *pg_url, *redis_url;
  const char *stream;      /* NULL: SVC_ORDER_STREAM */
  unsigned poll_ms;        /* 0: 200; a kick publishes at once */
  long long maxlen;        /* 0: 1,000,000 (approximate trimming) */
  long long retention_s;   /* published rows kept this long; 0: 7 days */
  /* After a pass that published events, the next starts this long after
   * it at the earliest (kicks wait), so that under load one pass carries
   * many events; a kick to an idle relay publishes at once.  0: none. */
  unsigned linger_ms;
  const svc_auth_t *auth;  /* signs each event (field "mac"); NULL: unsigned */
} svc_relay_opts_t;

typedef struct svc_relay svc_relay_t;

/* Start the relay thread (it connects on its own, and again after any
 * failure, logging once per outage).  NULL with 'err' set. */
svc_relay_t *svc_relay_start(const svc_relay_opts_t *o, char *err, size_t errlen);
/* An event committed: publish without waiting for the next poll. */
void svc_relay_kick(svc_relay_t *r);
/* Finish the current pass and stop.  NULL is fine. */
void svc_relay_stop(svc_relay_t *r);

typedef struct svc_relay_stats {
  uint64_t published;    /* events published the first time */
  uint64_t republished;  /* published again after the stream lost them */
  uint64_t passes, errors;
  long long unpublished; /* after the last pass */
  double oldest_unpublished_s;
} svc_relay_stats_t;
void svc_relay_stats(svc_relay_t *r, svc_relay_stats_t *out);

#endif /* SVC_OUTBOX_H */
