/*
 * svc_event.h - an order event as a consumer receives it: the one decoder
 * of stream entries (pure; unit-tested and fuzzed).
 *
 * NOTES
 *   An entry of txc:order-events has the fields event_id, type, order_id
 *   and payload (a JSON object: activity, ticket_type, bucket, user, qty),
 *   written by svc_outbox.c's relay.  Nothing that arrives is trusted: the
 *   stream is a shared Redis any program on the network may write to, so
 *   every field is checked and a bad entry is refused with a reason (the
 *   consumer dead-letters it) rather than half applied.
 */
#ifndef SVC_EVENT_H
#define SVC_EVENT_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#include "svc_auth.h"

#define SVC_EVENT_BIZ_KEY_MAX 96

typedef struct svc_event {
  const char *stream_id; /* "12-0" */
  long long event_id, order_id;
  const char *type;      /* "order.paid", "order.cancelled", "order.expired"; "waitlist.ordered" (an order
                          * placed for a waiting user), "waitlist.refused" (a waiting user removed, or
                          * the order not placed: payload "reason"); "order.rejected" (a
                          * queued order that was not made: payload "reason") */
  const json_t *payload; /* {activity, ticket_type, bucket, user, qty} */
  const char *biz_key;   /* "<type>:<order_id>" */
  int deliveries;        /* 1 on the first; a redelivered dead letter: 0 */
} svc_event_t;

/* Decode the 'n' field/value pairs of an entry into 'ev' (type borrowed
 * from 'values'; the payload is new: '*payload', to json_decref) and its
 * business key into 'biz' (SVC_EVENT_BIZ_KEY_MAX bytes; ev->biz_key points
 * there).  Fields may come in any order; unknown ones are ignored; a
 * repeated field, a missing one, a bad number, an unknown type or a
 * payload that is not a JSON object with positive activity, user and qty
 * refuses the entry: false with 'why'. */
bool svc_event_parse(const char *const *fields, const char *const *values, size_t n, svc_event_t *ev,
                     json_t **payload, char biz[SVC_EVENT_BIZ_KEY_MAX], char *why, size_t whylen);

/* The MAC of an event (svc_auth.h): over its event_id, type, order_id and
 * payload, as the stream carries them (text). */
void svc_event_sign(const svc_auth_t *a, const char *event_id, const char *type, const char *order_id,
                    const char *payload, char out[SVC_AUTH_HEX_MAX]);
bool svc_event_verify(const svc_auth_t *a, const char *event_id, const char *type, const char *order_id,
                      const char *payload, const char *mac);

#endif /* SVC_EVENT_H */
