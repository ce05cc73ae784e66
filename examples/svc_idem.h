/*
 * svc_idem.h - the Redis fast path of order-service's idempotent submit
 * (POST /orders with an Idempotency-Key header): per user and key, a mark
 * that a request holds while it works, then the answer it gave, which a
 * retry with the same key gets back as it was.
 *
 * NOTES
 *   Key: txc:idem:{<user>}:<key> (the hash tag puts a user's keys in one
 *   Redis Cluster slot).  Value: "pending" while a request holds the key
 *   (svc_idem_claim: SET NX EX lease), then the answer, a JSON object
 *   {"req": "<activity>/<ticket_type>/<qty>", "status": 201 | 409,
 *   "body": {...}} (svc_idem_store: SET XX EX ttl).  The lease bounds
 *   how long a request that died holding the key keeps others waiting.
 *
 *   Redis is only the fast path: the truth is the orders database, where
 *   the key is written with the order under a unique (user_id, idem_key),
 *   so a mark lost, expired or never written can cost a PostgreSQL lookup
 *   but never a second order.  Hence every failure here (Redis down, slow,
 *   or holding something unreadable) is SVC_IDEM_ERROR and the caller goes
 *   to PostgreSQL; none of them refuses a request.  After a failed connect
 *   or an I/O error the module does not try Redis again for 500 ms, so a
 *   dead Redis costs an error, not a timeout per request.
 *
 *   Connections: blocking hiredis contexts with the prefilter's timeouts,
 *   in a pool of idle ones; one thread uses one at a time.  Every function
 *   is safe to call from any thread.
 */
#ifndef SVC_IDEM_H
#define SVC_IDEM_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

/* The request header, and its value's limits (also trade_order's CHECK). */
#define SVC_IDEM_HEADER "Idempotency-Key"
#define SVC_IDEM_KEY_MAX 64

typedef struct svc_idem svc_idem_t;

typedef enum {
  SVC_IDEM_CLAIMED = 0, /* the key was free: this request holds it now */
  SVC_IDEM_PENDING = 1, /* another request holds it (or held it and died) */
  SVC_IDEM_STORED = 2,  /* an answer is stored: '*out' has it */
  SVC_IDEM_ABSENT = 3,  /* svc_idem_peek: no mark at all */
  SVC_IDEM_ERROR = -1,  /* Redis failed, or holds something unreadable */
} svc_idem_state_t;

/* A stored answer; svc_idem_answer_clear frees its body. */
typedef struct svc_idem_answer {
  int status;
  json_t *body;
  char req[72]; /* the fingerprint of the request that got it */
} svc_idem_answer_t;

void svc_idem_answer_clear(svc_idem_answer_t *a);

/* A fast path on 'redis_url' ("redis://[[user]:password@]host[:port][/db]",
 * host may be "[v6addr]") with these timeouts; connects on demand.  NULL
 * with 'err' set on a malformed URL or no memory. */
svc_idem_t *svc_idem_new(const char *redis_url, unsigned command_timeout_ms, unsigned connect_timeout_ms, char *err,
                         size_t errlen);
/* Close every connection and free; NULL does nothing. */
void svc_idem_free(svc_idem_t *x);

/* Whether 'key' is a valid Idempotency-Key: 1 to SVC_IDEM_KEY_MAX bytes of
 * [A-Za-z0-9._:-]. */
bool svc_idem_key_ok(const char *key);

/* Take the key of 'user' for 'lease_s' seconds, or say who has it:
 * SVC_IDEM_CLAIMED, SVC_IDEM_PENDING, SVC_IDEM_STORED (the answer in
 * '*out'), SVC_IDEM_ERROR. */
svc_idem_state_t svc_idem_claim(svc_idem_t *x, long long user, const char *key, unsigned lease_s,
                                svc_idem_answer_t *out);
/* Look without taking: SVC_IDEM_PENDING, SVC_IDEM_STORED ('*out'),
 * SVC_IDEM_ABSENT, SVC_IDEM_ERROR. */
svc_idem_state_t svc_idem_peek(svc_idem_t *x, long long user, const char *key, svc_idem_answer_t *out);
/* Store the answer (status, body, the request's fingerprint 'req') for
 * 'ttl_s' seconds, only if the key is still there (XX: a mark deleted
 * meanwhile stays deleted); 'body' is borrowed.  0, or -1 on a Redis
 * failure (harmless: the next retry finds the order in PostgreSQL). */
int svc_idem_store(svc_idem_t *x, long long user, const char *key, const char *req, int status, json_t *body,
                   unsigned ttl_s);
/* Delete the key (the answer was not final: a retry must get in).  0 or -1. */
int svc_idem_forget(svc_idem_t *x, long long user, const char *key);

#endif /* SVC_IDEM_H */
