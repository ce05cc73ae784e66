/*
 * svc_prefilter.c - the prefilter adapter (see svc_prefilter.h).
 *
 * INTERIM: librmclient's prefilter is not in rm_client.h yet; until it is,
 * this pass-through grants every freeze (bucket = order id modulo
 * PF_INTERIM_BUCKETS, default 5) and PostgreSQL's guard decides alone.
 */
#include "svc_prefilter.h"

#include <stdio.h>
#include <stdlib.h>

#include "svc_common.h"

struct svc_pf {
  int buckets;
};

svc_pf_t *svc_pf_new(const char *redis_url, char *err, size_t errlen) {
  (void)redis_url;
  svc_pf_t *pf = calloc(1, sizeof(*pf));
  if (!pf) {
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  pf->buckets = (int)svc_env_int("PF_INTERIM_BUCKETS", 5, 1, 1 << 20, NULL);
  if (pf->buckets < 1) pf->buckets = 5;
  return pf;
}

void svc_pf_free(svc_pf_t *pf) { free(pf); }

bool svc_pf_available(const svc_pf_t *pf) {
  (void)pf;
  return false;
}

const char *svc_pf_reason(pf_result_t r) {
  switch (r) {
  case PF_NOT_ON_SALE: return "not_on_sale";
  case PF_OVER_LIMIT: return "over_limit";
  case PF_SOLD_OUT: return "sold_out";
  case PF_OK: return "ok";
  default: return "error";
  }
}

pf_result_t svc_pf_freeze(svc_pf_t *pf, long long activity, long long ticket_type, long long user,
                          long long qty, long long order_id, int *bucket, char *err, size_t errlen) {
  (void)activity, (void)ticket_type, (void)user, (void)qty, (void)err, (void)errlen;
  *bucket = (int)(order_id % pf->buckets);
  return PF_OK;
}

pf_result_t svc_pf_confirm(svc_pf_t *pf, long long activity, long long ticket_type, long long order_id,
                           char *err, size_t errlen) {
  (void)pf, (void)activity, (void)ticket_type, (void)order_id, (void)err, (void)errlen;
  return PF_OK;
}

pf_result_t svc_pf_release(svc_pf_t *pf, long long activity, long long ticket_type, long long order_id,
                           char *err, size_t errlen) {
  (void)pf, (void)activity, (void)ticket_type, (void)order_id, (void)err, (void)errlen;
  return PF_OK;
}

pf_result_t svc_pf_waitlist(svc_pf_t *pf, long long activity, long long ticket_type, long long user,
                            long long qty, long long *position, char *err, size_t errlen) {
  (void)pf, (void)activity, (void)ticket_type, (void)user, (void)qty;
  *position = 0;
  snprintf(err, errlen, "the waitlist needs librmclient's prefilter");
  return PF_ERROR;
}
