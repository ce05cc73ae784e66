/*
 * svc_prefilter.c - the prefilter adapter over librmclient's
 * rm_prefilter_* (see svc_prefilter.h).
 */
#include "svc_prefilter.h"

#include <stdio.h>
#include <stdlib.h>

#include "svc_common.h"

struct svc_pf {
  rm_prefilter_t *pf;
};

svc_pf_t *svc_pf_new(const char *redis_url, unsigned max_connections, char *err, size_t errlen) {
  svc_pf_t *p = calloc(1, sizeof(*p));
  if (!p) {
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  bool ok = true;
  rm_pf_options_t o = {
    .command_timeout_ms = (unsigned)svc_env_int("PF_COMMAND_TIMEOUT_MS", 500, 1, 60000, &ok),
    .connect_timeout_ms = (unsigned)svc_env_int("PF_CONNECT_TIMEOUT_MS", 1000, 1, 60000, &ok),
    .max_connections = max_connections,
    .log_cb = svc_rm_log_cb,
    .log_level = svc_log_level + 1,
  };
  int rc = ok ? rm_prefilter_new(redis_url, &o, &p->pf) : RM_E_INVALID;
  if (rc != 0) {
    snprintf(err, errlen, "%s (REDIS_URL=%s)", rm_prefilter_strerror(rc), redis_url);
    free(p);
    return NULL;
  }
  return p;
}

void svc_pf_free(svc_pf_t *p) {
  if (!p) return;
  rm_prefilter_free(p->pf);
  free(p);
}

rm_prefilter_t *svc_pf_handle(svc_pf_t *p) { return p->pf; }

const char *svc_pf_reason(pf_result_t r) {
  switch (r) {
  case PF_NOT_ON_SALE: return "not_on_sale";
  case PF_OVER_LIMIT: return "over_limit";
  case PF_SOLD_OUT: return "sold_out";
  case PF_DONE_BEFORE: return "done_before";
  case PF_OK: return "ok";
  default: return "error";
  }
}

/* Map a library code; fills 'err' for errors. */
static pf_result_t map(int rc, char *err, size_t errlen) {
  switch (rc) {
  case 0: return PF_OK;
  case RM_PF_NOT_ON_SALE: return PF_NOT_ON_SALE;
  case RM_PF_OVER_LIMIT: return PF_OVER_LIMIT;
  case RM_PF_SOLD_OUT: return PF_SOLD_OUT;
  case RM_PF_ALREADY_CONFIRMED:
  case RM_PF_ALREADY_RELEASED: return PF_DONE_BEFORE;
  default: {
    const char *m = rm_prefilter_errmsg();
    snprintf(err, errlen, "prefilter: %s%s%s", rm_prefilter_strerror(rc), m && *m ? ": " : "", m ? m : "");
    return PF_ERROR;
  }
  }
}

static _Thread_local int last_code;

int svc_pf_last_code(void) { return last_code; }

pf_result_t svc_pf_freeze(svc_pf_t *p, long long activity, long long ticket_type, long long user, long long qty,
                          long long order_id, int64_t deadline_ms, int *bucket, char *err, size_t errlen) {
  int rc = rm_prefilter_freeze_until(p->pf, activity, (int32_t)ticket_type, user, order_id, (int32_t)qty,
                                     deadline_ms, bucket);
  /* A lost answer: the same freeze again returns the first one's bucket. */
  if (rc == RM_E_UNKNOWN_OUTCOME)
    rc = rm_prefilter_freeze_until(p->pf, activity, (int32_t)ticket_type, user, order_id, (int32_t)qty,
                                   deadline_ms, bucket);
  last_code = rc;
  pf_result_t r = map(rc, err, errlen);
  return r == PF_DONE_BEFORE ? PF_ERROR : r; /* an order id used twice: a bug, not a refusal */
}

pf_result_t svc_pf_freeze_queued(svc_pf_t *p, long long activity, long long ticket_type, long long user,
                                 long long qty, long long order_id, int64_t deadline_ms, const char *idem_key,
                                 int *bucket, char *err, size_t errlen) {
  int rc = rm_prefilter_freeze_queued(p->pf, activity, (int32_t)ticket_type, user, order_id, (int32_t)qty,
                                      deadline_ms, idem_key, bucket);
  if (rc == RM_E_UNKNOWN_OUTCOME) /* the same freeze again: its bucket, and no second entry */
    rc = rm_prefilter_freeze_queued(p->pf, activity, (int32_t)ticket_type, user, order_id, (int32_t)qty,
                                    deadline_ms, idem_key, bucket);
  last_code = rc;
  pf_result_t r = map(rc, err, errlen);
  return r == PF_DONE_BEFORE ? PF_ERROR : r;
}

pf_result_t svc_pf_confirm(svc_pf_t *p, long long activity, long long ticket_type, long long order_id, char *err,
                           size_t errlen) {
  int rc = rm_prefilter_confirm(p->pf, activity, (int32_t)ticket_type, order_id);
  if (rc == RM_E_UNKNOWN_OUTCOME) rc = rm_prefilter_confirm(p->pf, activity, (int32_t)ticket_type, order_id);
  return map(rc, err, errlen);
}

pf_result_t svc_pf_release(svc_pf_t *p, long long activity, long long ticket_type, long long order_id, char *err,
                           size_t errlen) {
  int rc = rm_prefilter_release(p->pf, activity, (int32_t)ticket_type, order_id);
  if (rc == RM_E_UNKNOWN_OUTCOME) rc = rm_prefilter_release(p->pf, activity, (int32_t)ticket_type, order_id);
  return map(rc, err, errlen);
}

pf_result_t svc_pf_waitlist(svc_pf_t *p, long long activity, long long ticket_type, long long user, long long qty,
                            long long *position, char *err, size_t errlen) {
  long pos = 0;
  int rc = rm_prefilter_waitlist_join(p->pf, activity, (int32_t)ticket_type, user, (int32_t)qty, &pos);
  if (rc == RM_PF_ALREADY_WAITING) rc = 0;
  last_code = rc;
  *position = pos;
  return map(rc, err, errlen);
}

/* The users handled in 'fill[0..nout-1]' into 'out' (at most 'cap'):
 * served, or removed with their code. */
static int served_from(const rm_pf_fill_t *fill, size_t nout, svc_pf_served_t *out, size_t cap) {
  int served = 0;
  for (size_t i = 0; i < nout && (size_t)served < cap; i++) {
    bool ok = fill[i].code == 0 && fill[i].order_id > 0 && fill[i].bucket >= 0;
    if (!ok && fill[i].code == 0) continue; /* not a shape the scripts answer */
    out[served++] = (svc_pf_served_t){.user = fill[i].user_id, .order_id = ok ? fill[i].order_id : 0,
                                      .qty = fill[i].qty, .bucket = ok ? fill[i].bucket : -1,
                                      .code = ok ? PF_OK : map(fill[i].code, NULL, 0)};
  }
  return served;
}

int svc_pf_waitlist_fill(svc_pf_t *p, long long activity, long long ticket_type, const long long *ids, size_t n,
                         int64_t deadline_ms, svc_pf_served_t *out, size_t cap, char *err, size_t errlen) {
  int64_t oid[SVC_PF_FILL_MAX];
  rm_pf_fill_t fill[SVC_PF_FILL_MAX];
  if (n > SVC_PF_FILL_MAX) n = SVC_PF_FILL_MAX;
  if (n == 0 || cap == 0) return 0;
  for (size_t i = 0; i < n; i++) oid[i] = ids[i];
  size_t nout = 0;
  int rc = rm_prefilter_waitlist_fill(p->pf, activity, (int32_t)ticket_type, oid, n, deadline_ms, fill,
                                      SVC_PF_FILL_MAX, &nout);
  if (rc == RM_PF_NOT_ON_SALE) return 0; /* nobody to serve any more */
  if (rc != 0) {
    map(rc, err, errlen);
    return -1;
  }
  return served_from(fill, nout, out, cap);
}

int svc_pf_stock_add(svc_pf_t *p, long long activity, long long ticket_type, const int64_t *bucket_stock,
                     size_t nbuckets, const long long *ids, size_t n, int64_t deadline_ms, svc_pf_served_t *out,
                     size_t cap, char *err, size_t errlen) {
  int64_t oid[SVC_PF_FILL_MAX];
  rm_pf_fill_t fill[SVC_PF_FILL_MAX];
  if (n > SVC_PF_FILL_MAX) n = SVC_PF_FILL_MAX;
  if (n > cap) n = cap;
  for (size_t i = 0; i < n; i++) oid[i] = ids[i];
  size_t nout = 0;
  int rc = rm_prefilter_stock_add(p->pf, activity, (int32_t)ticket_type, bucket_stock, nbuckets, oid, n, deadline_ms,
                                  fill, SVC_PF_FILL_MAX, &nout);
  if (rc != 0) {
    map(rc, err, errlen);
    return rc == RM_PF_NOT_LOADED ? -2 : -1;
  }
  return served_from(fill, nout, out, cap);
}

/* One family txc_client_prefilter_<op>_total{code} of a script's results. */
static void counts_metric(txc_buf_t *b, const char *op, const char *help, const rm_pf_counts_t *f) {
  txc_buf_printf(b, "# HELP txc_client_prefilter_%s_total %s\n# TYPE txc_client_prefilter_%s_total counter\n", op,
                 help, op);
  const struct {
    const char *code;
    uint64_t v;
  } fr[] = {{"ok", f->ok},
            {"not_on_sale", f->not_on_sale},
            {"over_limit", f->over_limit},
            {"sold_out", f->sold_out},
            {"bad_args", f->bad_args},
            {"not_loaded", f->not_loaded},
            {"already_confirmed", f->already_confirmed},
            {"already_released", f->already_released},
            {"unknown_order", f->unknown_order},
            {"already_waiting", f->already_waiting},
            {"errors", f->unknown_outcome + f->not_sent + f->error}};
  for (size_t i = 0; i < sizeof(fr) / sizeof(fr[0]); i++)
    txc_buf_printf(b, "txc_client_prefilter_%s_total{code=\"%s\"} %llu\n", op, fr[i].code,
                   (unsigned long long)fr[i].v);
}

void svc_pf_metrics(svc_pf_t *p, struct txc_buf *b) {
  rm_pf_stats_t ps = {0};
  if (p) rm_prefilter_stats(p->pf, &ps);
  counts_metric(b, "freeze", "Prefilter freezes by result.", &ps.freeze);
  counts_metric(b, "confirm", "Prefilter confirms (frozen to sold) by result.", &ps.confirm);
  counts_metric(b, "release", "Prefilter releases (frozen back to available) by result.", &ps.release);
  counts_metric(b, "expire", "Prefilter expiry sweeps by result.", &ps.expire);
  counts_metric(b, "waitlist_join", "Prefilter waitlist joins by result.", &ps.waitlist_join);
  counts_metric(b, "waitlist_fill", "Prefilter waitlist fills by result.", &ps.waitlist_fill);
  counts_metric(b, "stock_add", "Prefilter stock additions (raise and serve the waitlist) by result.", &ps.stock_add);
  txc_buf_printf(b,
                 "# HELP txc_client_prefilter_connect_failures_total Redis connections of the prefilter that could "
                 "not be opened.\n# TYPE txc_client_prefilter_connect_failures_total counter\n"
                 "txc_client_prefilter_connect_failures_total %llu\n",
                 (unsigned long long)ps.connect_failures);
}
