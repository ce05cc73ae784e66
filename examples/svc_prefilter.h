/*
 * svc_prefilter.h - order-service's view of the Redis prefilter: the
 * freeze that turns hopeless requests away before any global transaction,
 * and the confirm / release / waitlist that follow an order's life.
 *
 * NOTES
 *   A thin adapter over librmclient's prefilter, so that order-service and
 *   the load generator speak in the demo's terms (reasons, buckets) and
 *   the services do not depend on the library's exact calling convention.
 *   Redis is only a filter: PostgreSQL decides.  A freeze that Redis
 *   granted can still be refused by the stock branch (then order-service
 *   releases it); a Redis error makes the request 503, never an oversell.
 */
#ifndef SVC_PREFILTER_H
#define SVC_PREFILTER_H

#include <stdbool.h>
#include <stddef.h>

typedef enum {
  PF_OK = 0,
  PF_NOT_ON_SALE = 1,
  PF_OVER_LIMIT = 2,
  PF_SOLD_OUT = 3,
  PF_ERROR = -1, /* Redis unavailable or a script error: see 'err' */
} pf_result_t;

typedef struct svc_pf svc_pf_t;

/* Connect to 'redis_url' ("redis://host:port"). */
svc_pf_t *svc_pf_new(const char *redis_url, char *err, size_t errlen);
void svc_pf_free(svc_pf_t *pf);

/* The reason word of a refusal ("not_on_sale", "over_limit", "sold_out"). */
const char *svc_pf_reason(pf_result_t r);

/* Freeze 'qty' tickets for order 'order_id' of 'user'; on PF_OK '*bucket'
 * is the bucket the tickets were taken from. */
pf_result_t svc_pf_freeze(svc_pf_t *pf, long long activity, long long ticket_type, long long user,
                          long long qty, long long order_id, int *bucket, char *err, size_t errlen);
/* Payment went through: frozen -> sold.  Idempotent per order. */
pf_result_t svc_pf_confirm(svc_pf_t *pf, long long activity, long long ticket_type, long long order_id,
                           char *err, size_t errlen);
/* The order will not happen (rolled back, cancelled, expired): give the
 * tickets back and the user's limit.  Idempotent per order. */
pf_result_t svc_pf_release(svc_pf_t *pf, long long activity, long long ticket_type, long long order_id,
                           char *err, size_t errlen);
/* Put 'user' on the activity's waitlist; '*position' (1-based) on PF_OK. */
pf_result_t svc_pf_waitlist(svc_pf_t *pf, long long activity, long long ticket_type, long long user,
                            long long qty, long long *position, char *err, size_t errlen);
/* Whether the adapter has a real prefilter behind it (false: the interim
 * pass-through that grants everything and lets PostgreSQL decide). */
bool svc_pf_available(const svc_pf_t *pf);

#endif /* SVC_PREFILTER_H */
