/*
 * order_model.c - an order as order-service's files share it
 * (order_service.h): what a global transaction's status means for it, its
 * JSON, the buyer's token, reading it from the orders database.  Includes
 * nothing of the purchase or the idempotent submit: both call it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "order_service.h"

/* What a global transaction's status means for the order. */
decision_t decision_of(int status) {
  switch (status) {
  case RM_GS_COMMITTING:
  case RM_GS_COMMIT_RETRYING:
  case RM_GS_ASYNC_COMMITTING:
  case RM_GS_COMMITTED:
    return DECIDED_COMMIT;
  case RM_GS_ROLLBACKING:
  case RM_GS_ROLLBACK_RETRYING:
  case RM_GS_TIMEOUT_ROLLBACKING:
  case RM_GS_TIMEOUT_ROLLBACK_RETRYING:
  case RM_GS_ROLLBACKED:
  case RM_GS_TIMEOUT_ROLLBACKED:
    return DECIDED_ROLLBACK;
  default: /* Begin, RollbackFailed (undo not applied), unknown */
    return DECIDED_UNKNOWN;
  }
}

json_t *order_json(const order_t *o) {
  json_t *j = json_pack("{s:I,s:I,s:I,s:I,s:I,s:I,s:s}", "order_id", (json_int_t)o->order_id, "activity",
                        (json_int_t)o->activity, "ticket_type", (json_int_t)o->ticket_type, "user",
                        (json_int_t)o->user, "qty", (json_int_t)o->qty, "bucket", (json_int_t)o->bucket,
                        "status", o->status);
  json_object_set_new(j, "xid", o->xid[0] ? json_string(o->xid) : json_null());
  if (o->cancel_reason[0]) json_object_set_new(j, "cancel_reason", json_string(o->cancel_reason));
  return j;
}

/*
 * The buyer's proof (the demo's stand-in for a login, issue 20): the 201
 * that creates an order hands out order_token, the MAC of the order id
 * and its user under the services' key, and GET, pay and cancel of that
 * order need it back as "Authorization: Bearer <order_token>".  Nothing
 * is stored: any instance verifies it, across restarts, and a key
 * rotation (svc_auth.h) keeps old tokens valid while the old key is
 * listed.  It proves "this caller got the 201", not who the user is: a
 * real deployment checks its login session here instead.  Without
 * TXC_SERVICE_KEY_FILE nothing is checked (the service says so at start).
 */
static void order_token(const order_svc_t *s, long long order_id, long long user, char out[SVC_AUTH_HEX_MAX]) {
  char id[24], u[24];
  snprintf(id, sizeof(id), "%lld", order_id);
  snprintf(u, sizeof(u), "%lld", user);
  const char *parts[3] = {"order-token/1", id, u};
  size_t lens[3] = {strlen(parts[0]), strlen(id), strlen(u)};
  svc_auth_sign(s->auth, parts, lens, 3, out);
}

/* The order as its buyer gets it in the 201: with its order_token. */
json_t *buyer_json(const order_svc_t *s, const order_t *o) {
  json_t *j = order_json(o);
  if (s->auth) {
    char tok[SVC_AUTH_HEX_MAX];
    order_token(s, o->order_id, o->user, tok);
    json_object_set_new(j, "order_token", json_string(tok));
  }
  return j;
}

/* Whether 'req' carries the order token of order 'order_id' of 'user'
 * (always true without the services' key).  Otherwise 'resp' has the
 * answer: 401 without a token, 403 with another order's. */
bool buyer_ok(const order_svc_t *s, const svc_req_t *req, long long order_id, long long user,
                     svc_resp_t *resp) {
  if (!s->auth) return true;
  const char *h = svc_req_header(req, "Authorization");
  if (!h || strncasecmp(h, "Bearer ", 7) != 0 || !h[7]) {
    svc_resp_header(resp, "WWW-Authenticate", "Bearer realm=\"orders\"");
    svc_resp_error(resp, 401, "unauthorized",
                   "this needs the order's token: Authorization: Bearer <order_token of the 201>");
    return false;
  }
  char id[24], u[24];
  snprintf(id, sizeof(id), "%lld", order_id);
  snprintf(u, sizeof(u), "%lld", user);
  const char *parts[3] = {"order-token/1", id, u};
  size_t lens[3] = {strlen(parts[0]), strlen(id), strlen(u)};
  if (!svc_auth_verify(s->auth, parts, lens, 3, h + 7)) {
    svc_resp_error(resp, 403, "forbidden", "the token is not this order's");
    return false;
  }
  return true;
}

/* Load order 'id'; false if absent or on error (err set, *found false). */
bool load_order(PGconn *pg, long long id, order_t *o, bool *found, char *err, size_t errlen) {
  char sid[24];
  snprintf(sid, sizeof(sid), "%lld", id);
  const char *p[1] = {sid};
  PGresult *r = NULL;
  *found = false;
  if (!svc_pg_exec(pg,
                   "SELECT order_id, activity_id, ticket_type, user_id, qty, bucket_id, status, xid, cancel_reason"
                   " FROM trade_order WHERE order_id = $1",
                   1, p, PGRES_TUPLES_OK, &r, err, errlen))
    return false;
  if (PQntuples(r) == 1) {
    *found = true;
    o->order_id = atoll(PQgetvalue(r, 0, 0));
    o->activity = atoll(PQgetvalue(r, 0, 1));
    o->ticket_type = atoll(PQgetvalue(r, 0, 2));
    o->user = atoll(PQgetvalue(r, 0, 3));
    o->qty = atoll(PQgetvalue(r, 0, 4));
    o->bucket = atoll(PQgetvalue(r, 0, 5));
    snprintf(o->status, sizeof(o->status), "%s", PQgetvalue(r, 0, 6));
    snprintf(o->xid, sizeof(o->xid), "%s", PQgetisnull(r, 0, 7) ? "" : PQgetvalue(r, 0, 7));
    snprintf(o->cancel_reason, sizeof(o->cancel_reason), "%s", PQgetisnull(r, 0, 8) ? "" : PQgetvalue(r, 0, 8));
  }
  PQclear(r);
  return *found;
}

