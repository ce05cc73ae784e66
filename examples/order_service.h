/*
 * order_service.h - what order-service's files share (not installed, not a
 * library): the service's state, an order, and the calls between the
 * purchase (order_service.c) and the idempotent submit (order_idem.c).
 * Arrows run one way: order_service.c -> order_idem.c -> order_model.c,
 * order_service.c -> order_model.c; the idempotent submit makes a purchase
 * only through the function order_service.c hands it (order_take_fn).
 */
#ifndef ORDER_SERVICE_H
#define ORDER_SERVICE_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "svc_auth.h"
#include "svc_common.h"
#include "svc_http.h"
#include "svc_idem.h"
#include "svc_outbox.h"
#include "svc_prefilter.h"

#define ID_BLOCK 100

typedef struct order_svc {
  rm_client_t *rm;
  svc_pgpool_t *pool;
  svc_httpc_t *stock;
  svc_pf_t *pf;
  rm_compensator_t *comp; /* local-mode orders: compensation and reconciliation */
  svc_relay_t *relay;     /* the outbox's events to the stream */
  svc_idem_t *idem;       /* the idempotent submit's fast path; NULL: PostgreSQL alone */
  svc_auth_t *auth;       /* signs the calls to stock-service and the order events; NULL: unsigned */
  struct svc_admin *admin;  /* POST /admin/mode (svc_admin.h) */
  struct order_recon *recon; /* the daily reconciliation's schedule (order_recon.h); NULL: none */
  unsigned idem_ttl_s;    /* ORDER_IDEMPOTENCY_TTL_S: how long Redis keeps an answer */
  _Atomic unsigned long long idem_replays_redis, idem_replays_pg, idem_in_progress;
  const char *resource;
  unsigned gtx_timeout_ms, stock_timeout_ms;
  long long ttl_s;           /* unpaid orders expire after this */
  long long freeze_grace_s;  /* the Redis/stock freeze outlives the order by this */
  long long expiry_interval_ms;
  long long price_cents;     /* ORDER_TICKET_PRICE_CENTS: an order's amount is qty times this */
  bool local_mode; /* ORDER_TX_MODE=local: no coordinator (benchmark baseline) */
  bool queued;     /* ORDER_MODE=queued: the buyer's answer once Redis froze (order_queue.h) */
  struct order_queue *queue; /* the queued mode's consumer; NULL in sync mode */
  bool at_sql;     /* TXC_AT_WRITES: the branch's insert as plain SQL (rm_at_sql) or the structured call */
  int64_t slow_us;  /* ORDER_SLOW_MS: log the phases of slower orders */

  /* Order ids, fetched ID_BLOCK at a time. */
  pthread_mutex_t id_mu;
  long long ids[ID_BLOCK];
  int nids;

  /* Background thread: the expiry job, and the waitlists to serve (stock
   * came back by a cancel or an expiry); both under bg_mu, woken by
   * bg_cv. */
  pthread_t bg_thread;
  bool bg_started;
  pthread_mutex_t bg_mu;
  pthread_cond_t bg_cv;
  bool stopping;
  int nwl;
  struct {
    long long activity, ticket_type;
    int tries;       /* passes that found no ticket back in Redis yet */
    int64_t next_us; /* not before */
  } wl[64];
} order_svc_t;

typedef struct order {
  long long order_id, activity, ticket_type, user, qty, bucket;
  int64_t expire_ms; /* expire_at, unix ms (new orders) */
  char status[16];
  char xid[RM_XID_MAX];
  char cancel_reason[256]; /* trade_order.cancel_reason ("" = NULL) */
  const char *idem_key;    /* the request's Idempotency-Key (NULL = none), borrowed */
} order_t;

/* order_model.c.  What a global transaction's status means for the order. */
typedef enum { DECIDED_UNKNOWN, DECIDED_COMMIT, DECIDED_ROLLBACK } decision_t;

decision_t decision_of(int status);

/* order_model.c.  The order as GET /orders/{id} shows it. */
json_t *order_json(const order_t *o);
/* The order as its buyer gets it in the 201: with its order_token. */
json_t *buyer_json(const order_svc_t *s, const order_t *o);
/* Whether 'req' carries the order token of order 'order_id' of 'user'
 * (always true without the services' key); otherwise 'resp' has the
 * answer (401 or 403). */
bool buyer_ok(const order_svc_t *s, const svc_req_t *req, long long order_id, long long user, svc_resp_t *resp);
/* Read order 'id' ('*found' false if there is none); false with 'err'
 * set when the database could not be read. */
bool load_order(PGconn *pg, long long id, order_t *o, bool *found, char *err, size_t errlen);
/* The purchase itself (prefilter, global or local transaction), as
 * order_service.c hands it to create_keyed: 'resp' gets its answer. */
typedef void (*order_take_fn)(order_svc_t *s, order_t *o, int64_t t0, svc_resp_t *resp);

/* order_idem.c: POST /orders with an Idempotency-Key; 'take' makes the
 * purchase when the key is new. */
void create_keyed(order_svc_t *s, order_t *o, int64_t t0, order_take_fn take, svc_resp_t *resp);
/* The order branch failed on the unique key of an order made with
 * o->idem_key: answer with that order (true), or false to answer as
 * usual. */
bool answer_key_taken(order_svc_t *s, const order_t *o, svc_resp_t *resp);

#endif /* ORDER_SERVICE_H */
