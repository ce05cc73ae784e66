/*
 * svc_prefilter.h - order-service's view of the Redis prefilter: the
 * freeze that turns hopeless requests away before any global transaction,
 * and the confirm / release / waitlist that follow an order's life.
 *
 * NOTES
 *   A thin adapter over librmclient's rm_prefilter_*, so that the services
 *   speak in the demo's terms (reason words, buckets) and map the library's
 *   codes in one place.  Redis is only a filter: PostgreSQL decides.  A
 *   freeze that Redis granted can still be refused by the stock branch
 *   (then order-service releases it); a Redis error makes the request 503,
 *   never an oversell.
 */
#ifndef SVC_PREFILTER_H
#define SVC_PREFILTER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rm_client.h"

typedef enum {
  PF_OK = 0,
  PF_NOT_ON_SALE = 1,
  PF_OVER_LIMIT = 2,
  PF_SOLD_OUT = 3,
  PF_DONE_BEFORE = 4, /* confirm/release: this order was already finished */
  PF_ERROR = -1,      /* Redis unavailable, not loaded, or a script error: see 'err' */
} pf_result_t;

typedef struct svc_pf svc_pf_t;

/* A prefilter on 'redis_url' ("redis://host:port") with a pool of up to
 * 'max_connections'. */
svc_pf_t *svc_pf_new(const char *redis_url, unsigned max_connections, char *err, size_t errlen);
void svc_pf_free(svc_pf_t *pf);
/* The library's handle, for seeding and reconciliation. */
rm_prefilter_t *svc_pf_handle(svc_pf_t *pf);

/* The prefilter's results for /metrics: txc_client_prefilter_<script>_total
 * {code} for every script (freeze, confirm, release, expire,
 * waitlist_join, waitlist_fill, stock_add) and its connection failures;
 * 'pf' may be NULL (all 0). */
struct txc_buf;
void svc_pf_metrics(svc_pf_t *pf, struct txc_buf *b);

/* The reason word of a refusal ("not_on_sale", "over_limit", "sold_out"). */
const char *svc_pf_reason(pf_result_t r);

/* Freeze 'qty' tickets for order 'order_id' of 'user' until 'deadline_ms'
 * (unix ms); on PF_OK '*bucket' is the bucket they were taken from. */
pf_result_t svc_pf_freeze(svc_pf_t *pf, long long activity, long long ticket_type, long long user, long long qty,
                          long long order_id, int64_t deadline_ms, int *bucket, char *err, size_t errlen);
/* The same for the queued order mode (rm_prefilter_freeze_queued): a new
 * freeze also queues its order, with 'idem_key' (may be NULL). */
pf_result_t svc_pf_freeze_queued(svc_pf_t *pf, long long activity, long long ticket_type, long long user,
                                 long long qty, long long order_id, int64_t deadline_ms, const char *idem_key,
                                 int *bucket, char *err, size_t errlen);
/* The library code of the calling thread's last svc_pf_freeze,
 * svc_pf_freeze_queued or svc_pf_waitlist (0 if it froze or joined),
 * e.g. RM_PF_NOT_LOADED behind a PF_ERROR. */
int svc_pf_last_code(void);
/* Payment went through: frozen -> sold.  PF_DONE_BEFORE if already done. */
pf_result_t svc_pf_confirm(svc_pf_t *pf, long long activity, long long ticket_type, long long order_id,
                           char *err, size_t errlen);
/* The order will not happen (rolled back, cancelled, expired): give the
 * tickets and the user's limit back.  PF_DONE_BEFORE if already done. */
pf_result_t svc_pf_release(svc_pf_t *pf, long long activity, long long ticket_type, long long order_id,
                           char *err, size_t errlen);
/* Put 'user' on the waitlist; '*position' (0 = next) on PF_OK, also when
 * the user was already waiting. */
pf_result_t svc_pf_waitlist(svc_pf_t *pf, long long activity, long long ticket_type, long long user,
                            long long qty, long long *position, char *err, size_t errlen);

/* One waiting user served by svc_pf_waitlist_fill: their tickets are
 * frozen in 'bucket' for the new order 'order_id', which the caller now
 * places (or releases). */
typedef struct svc_pf_served {
  long long user, order_id, qty;
  int bucket;
  pf_result_t code; /* PF_OK served; else removed from the waitlist (PF_OVER_LIMIT, PF_BAD_ARGS), order_id 0 */
} svc_pf_served_t;

/* Stock came back: serve waiting users first come first served, with the
 * same checks as a freeze, using the fresh order ids 'ids[0..n-1]' in
 * turn.  Returns the number of users served (written to 'out', at most
 * 'cap'), or -1 with 'err' set. */
int svc_pf_waitlist_fill(svc_pf_t *pf, long long activity, long long ticket_type, const long long *ids, size_t n,
                         int64_t deadline_ms, svc_pf_served_t *out, size_t cap, char *err, size_t errlen);

/* Most order ids one fill or stock addition uses. */
#define SVC_PF_FILL_MAX 64

/* More tickets, already in PostgreSQL ('bucket_stock[0..nbuckets-1]':
 * each bucket's stock there now): Redis rises to it and serves the
 * waitlist from the new tickets first, in one step (rm_prefilter_stock_add),
 * with 'ids[0..n-1]' as svc_pf_waitlist_fill.  Returns the users served,
 * -2 when Redis has not loaded the activity (nothing to raise: loading it
 * copies PostgreSQL's stock), or -1 with 'err' set. */
int svc_pf_stock_add(svc_pf_t *pf, long long activity, long long ticket_type, const int64_t *bucket_stock,
                     size_t nbuckets, const long long *ids, size_t n, int64_t deadline_ms, svc_pf_served_t *out,
                     size_t cap, char *err, size_t errlen);

#endif /* SVC_PREFILTER_H */
