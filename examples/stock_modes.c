/*
 * stock_modes.c - stock-service's freeze as a TCC or XA branch
 * (stock_modes.h says what each half does).
 */
#include "stock_modes.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Keep: the freeze stays FROZEN for the payment (or the expiry) to move. */
static int freeze_confirm(const rm_tcc_call_t *call, void *arg, char *errmsg, size_t errlen) {
  (void)call;
  (void)arg;
  (void)errmsg;
  (void)errlen;
  return RM_TCC_OK;
}

/* Undo the freeze exactly, as AT's rollback would: its row, its log row
 * and its frozen_count, in one statement on the fence's transaction. */
static int freeze_cancel(const rm_tcc_call_t *call, void *arg, char *errmsg, size_t errlen) {
  (void)arg;
  char *end = NULL;
  long long order_id = call->args ? strtoll(call->args, &end, 10) : 0;
  if (!call->args || order_id <= 0 || *end) {
    snprintf(errmsg, errlen, "the try recorded no order id (args \"%s\")", call->args ? call->args : "");
    return RM_TCC_FAILED;
  }
  const char *p[1] = {call->args};
  PGresult *r = PQexecParams(call->pg,
                             "WITH f AS (DELETE FROM stock_freeze WHERE order_id = $1 AND state = 'FROZEN'"
                             "             RETURNING activity_id, ticket_type, bucket_id, qty),"
                             "     l AS (DELETE FROM stock_log WHERE order_id = $1 AND op = 'freeze'),"
                             "     b AS (UPDATE activity_ticket_bucket t SET frozen_count = t.frozen_count - f.qty"
                             "             FROM f WHERE t.activity_id = f.activity_id AND t.ticket_type = f.ticket_type"
                             "             AND t.bucket_id = f.bucket_id RETURNING 1)"
                             " SELECT (SELECT count(*) FROM f), (SELECT count(*) FROM b),"
                             "        (SELECT state FROM stock_freeze WHERE order_id = $1)",
                             1, NULL, p, NULL, NULL, 0);
  int rc = RM_TCC_OK;
  if (PQresultStatus(r) != PGRES_TUPLES_OK) {
    snprintf(errmsg, errlen, "could not undo the freeze of order %lld: %s", order_id, PQresultErrorMessage(r));
    rc = RM_TCC_RETRY;
  } else if (atoi(PQgetvalue(r, 0, 0)) != atoi(PQgetvalue(r, 0, 1))) {
    snprintf(errmsg, errlen, "the freeze of order %lld names a bucket that is gone", order_id);
    rc = RM_TCC_FAILED;
  } else if (atoi(PQgetvalue(r, 0, 0)) == 0 && !PQgetisnull(r, 0, 2)) {
    /* Moved on (CONFIRMED, RELEASED) although its global is rolled back:
     * not ours to undo; an operator's. */
    snprintf(errmsg, errlen, "the freeze of order %lld is %s: its global transaction was rolled back after it moved",
             order_id, PQgetvalue(r, 0, 2));
    rc = RM_TCC_FAILED;
  }
  PQclear(r);
  return rc;
}

static const rm_tcc_handlers_t freeze_handlers = {.confirm = freeze_confirm, .cancel = freeze_cancel};

int stock_modes_serve(rm_client_t *rm, stock_branch_kind_t kind, const char *resource, const char *pg_url) {
  return kind == STOCK_BRANCH_TCC ? rm_tcc_resource_add(rm, resource, pg_url, &freeze_handlers)
                                  : rm_xa_resource_add(rm, resource, pg_url);
}

int stock_modes_begin(rm_client_t *rm, stock_branch_kind_t kind, const char *xid, const char *resource, PGconn *pg,
                      long long order_id, int64_t *bid, char *err, size_t errlen) {
  char args[24];
  snprintf(args, sizeof(args), "%lld", order_id);
  int rc = kind == STOCK_BRANCH_TCC ? rm_tcc_try(rm, xid, resource, pg, args, bid)
                                    : rm_xa_start(rm, xid, resource, pg, bid);
  if (rc != 0) snprintf(err, errlen, "%s: %s", rm_strerror(rc), rm_errmsg());
  return rc;
}

bool stock_modes_end(rm_client_t *rm, stock_branch_kind_t kind, const char *xid, PGconn *pg, int64_t bid, char *err,
                     size_t errlen) {
  if (kind == STOCK_BRANCH_XA) {
    int rc = rm_xa_prepare(rm, xid, pg, bid);
    if (rc != 0) snprintf(err, errlen, "%s: %s", rm_strerror(rc), rm_errmsg());
    return rc == 0;
  }
  PGresult *r = PQexec(pg, "COMMIT");
  bool ok = PQresultStatus(r) == PGRES_COMMAND_OK && strcmp(PQcmdStatus(r), "COMMIT") == 0;
  if (!ok) snprintf(err, errlen, "the try's commit failed: %s", PQresultErrorMessage(r));
  PQclear(r);
  return ok;
}
