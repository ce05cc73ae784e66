/*
 * order_idem.c - order-service's idempotent submit (order_service.c's
 * NOTES, "Idempotent submit"; order_service.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "order_service.h"
#include "svc_problem.h"

/* ------------------------------------------------- idempotent submit */

/*
 * POST /orders with an Idempotency-Key (NOTES above): the fast path in
 * Redis (svc_idem: the key's mark, then its answer), the truth in the
 * orders database (the key is written with the order, under the unique
 * (user_id, idem_key)).  Nothing here holds a PostgreSQL connection while
 * it waits for Redis, the coordinator or another request.
 */

#define IDEM_WAIT_US (1000 * 1000) /* how long a request finding its key held waits for the answer */
#define IDEM_POLL_US (50 * 1000)

/* How long a request holds its key: longer than a purchase can take (the
 * global transaction's timeout, then the stock call's), so that only a
 * request that died keeps the others waiting, and not for long. */
static unsigned idem_lease_s(const order_svc_t *s) { return (s->gtx_timeout_ms + s->stock_timeout_ms) / 1000 + 5; }

/* What a key's answer was given for, to tell a retry from a key reused for
 * another purchase. */
static void idem_fingerprint(long long activity, long long ticket_type, long long qty, char *out, size_t len) {
  snprintf(out, len, "%lld/%lld/%lld", activity, ticket_type, qty);
}

typedef enum {
  KEY_NONE,  /* no order holds the key */
  KEY_FINAL, /* an order holds it, decided: the answer it stands for */
  KEY_BUSY,  /* an order holds it, its fate not decided yet */
  KEY_ERROR, /* the orders database could not be read */
} key_state_t;

/*
 * The truth about 'key' of 'user': the order made with it, if any.  On
 * KEY_FINAL '*ans' is the answer that order stands for: 201 with the order
 * as GET /orders/{id} shows it, or, for a local-mode order the stock
 * refused (cancelled by the refusal), the 409 refusal its request got.
 * KEY_BUSY: the order of a global transaction not decided yet (its
 * rollback would delete it and free the key), or a local-mode order whose
 * stock side has not answered yet, younger than the lease.  The AT insert
 * commits in phase one, so an order row alone proves nothing: phase two's
 * commit deletes the undo_log row, a rollback deletes both; with the undo
 * row still there the coordinator is asked.
 */
static key_state_t key_lookup(order_svc_t *s, long long user, const char *key, svc_idem_answer_t *ans, char *err,
                              size_t errlen) {
  char su[24], sl[24], reason[64] = "";
  snprintf(su, sizeof(su), "%lld", user);
  snprintf(sl, sizeof(sl), "%u", idem_lease_s(s));
  const char *p[3] = {su, key, sl};
  err[0] = '\0';
  PGconn *pg = svc_pg_get(s->pool, 2000, err, errlen);
  if (!pg) return KEY_ERROR;
  PGresult *r = NULL;
  order_t o = {0};
  bool found = false;
  bool ok = svc_pg_exec(pg,
                        "SELECT o.order_id,"
                        " o.xid IS NOT NULL AND EXISTS (SELECT 1 FROM undo_log u"
                        "   WHERE u.xid = o.xid AND u.log_status = 0),"
                        " o.xid IS NULL AND c.state = 'PENDING'"
                        "   AND o.created_at > now() - $3::int * interval '1 second',"
                        " CASE WHEN c.outcome = 'CANCELLED' THEN c.reason END"
                        " FROM trade_order o LEFT JOIN order_compensation c ON c.order_id = o.order_id"
                        " WHERE o.user_id = $1 AND o.idem_key = $2",
                        3, p, PGRES_TUPLES_OK, &r, err, errlen);
  /* (an order that vanished between the two reads was rolled back) */
  if (ok && PQntuples(r) == 1 && !load_order(pg, atoll(PQgetvalue(r, 0, 0)), &o, &found, err, errlen))
    ok = !err[0];
  svc_pg_put(s->pool, pg);
  if (!ok) {
    PQclear(r);
    return KEY_ERROR;
  }
  bool undo_pending = found && strcmp(PQgetvalue(r, 0, 1), "t") == 0;
  bool local_pending = found && strcmp(PQgetvalue(r, 0, 2), "t") == 0;
  if (found && !PQgetisnull(r, 0, 3)) snprintf(reason, sizeof(reason), "%s", PQgetvalue(r, 0, 3));
  PQclear(r);
  if (!found) return KEY_NONE;
  if (local_pending) return KEY_BUSY;
  if (undo_pending) {
    int st = 0;
    if (rm_tm_status(s->rm, o.xid, &st) != 0 || decision_of(st) != DECIDED_COMMIT) return KEY_BUSY;
  }
  if (reason[0]) {
    ans->status = 409;
    ans->body = svc_problem_rejected(reason);
  } else {
    ans->status = 201;
    ans->body = buyer_json(s, &o);
  }
  idem_fingerprint(o.activity, o.ticket_type, o.qty, ans->req, sizeof(ans->req));
  return KEY_FINAL;
}

/* Answer with 'ans' (cleared), the answer o->idem_key already stands for,
 * found in Redis ('from_redis') or PostgreSQL: the same status and body,
 * with "Idempotent-Replayed: true".  422 when 'o' is another purchase than
 * the one that got it (the client reused the key). */
static void idem_replay(order_svc_t *s, const order_t *o, svc_idem_answer_t *ans, bool from_redis,
                        svc_resp_t *resp) {
  char fp[sizeof(ans->req)];
  idem_fingerprint(o->activity, o->ticket_type, o->qty, fp, sizeof(fp));
  if (strcmp(fp, ans->req) != 0) {
    char detail[256 + 2 * sizeof(ans->req)];
    snprintf(detail, sizeof(detail),
             "this Idempotency-Key was used for another purchase (activity/ticket_type/qty %s, not %s)", ans->req, fp);
    svc_resp_error(resp, 422, "idempotency_key_reused", detail);
    svc_idem_answer_clear(ans);
    return;
  }
  svc_resp_json(resp, ans->status, ans->body);
  ans->body = NULL;
  svc_idem_answer_clear(ans);
  svc_resp_header(resp, "Idempotent-Replayed", "true");
  if (from_redis)
    s->idem_replays_redis++;
  else
    s->idem_replays_pg++;
}

/* Another request holds the key: try again in a second. */
static void idem_in_progress(order_svc_t *s, svc_resp_t *resp) {
  s->idem_in_progress++;
  svc_resp_error(resp, 409, "in_progress", "another request with this Idempotency-Key is in progress: retry");
  svc_resp_header(resp, "Retry-After", "1");
}

/* The insert of 'o' failed, perhaps on the unique (user_id, idem_key):
 * when an order holds the key, answer as the key stands (that order, or
 * in_progress while it is undecided) and return true; false when none
 * does (the caller answers its own error).  Called with no PostgreSQL
 * connection held. */
bool answer_key_taken(order_svc_t *s, const order_t *o, svc_resp_t *resp) {
  char err[512];
  svc_idem_answer_t ans = {0};
  switch (key_lookup(s, o->user, o->idem_key, &ans, err, sizeof(err))) {
  case KEY_FINAL:
    idem_replay(s, o, &ans, false, resp);
    return true;
  case KEY_BUSY:
    idem_in_progress(s, resp);
    return true;
  default:
    return false;
  }
}

/*
 * Another request holds the key of 'o' (or held it and died): wait up to
 * IDEM_WAIT_US for the answer it stores, looking in PostgreSQL first and
 * last (the holder may have made the order and died before storing it);
 * then 409 in_progress.
 */
static void idem_await(order_svc_t *s, const order_t *o, svc_resp_t *resp) {
  char err[512];
  int64_t until = svc_now_us() + IDEM_WAIT_US;
  for (bool first = true;; first = false) {
    bool last = svc_now_us() >= until;
    if (first || last) {
      svc_idem_answer_t ans = {0};
      key_state_t ks = key_lookup(s, o->user, o->idem_key, &ans, err, sizeof(err));
      if (ks == KEY_FINAL) {
        /* the holder will store the same; one that died never will */
        svc_idem_store(s->idem, o->user, o->idem_key, ans.req, ans.status, ans.body, s->idem_ttl_s);
        idem_replay(s, o, &ans, false, resp);
        return;
      }
      if (last) {
        if (ks == KEY_ERROR)
          svc_resp_error(resp, 503, "unavailable", err);
        else
          idem_in_progress(s, resp);
        return;
      }
    }
    struct timespec ts = {0, IDEM_POLL_US * 1000L};
    nanosleep(&ts, NULL);
    svc_idem_answer_t ans = {0};
    svc_idem_state_t st = svc_idem_peek(s->idem, o->user, o->idem_key, &ans);
    if (st == SVC_IDEM_STORED) {
      idem_replay(s, o, &ans, true, resp);
      return;
    }
    if (st == SVC_IDEM_ABSENT) { /* the holder failed and let go: a retry gets in */
      idem_in_progress(s, resp);
      return;
    }
  }
}

/*
 * POST /orders for 'o' with an Idempotency-Key (o->idem_key): the answer
 * the key already has, or the purchase, whose final answer (201, or a 409
 * refusal) is then stored under the key; any other outcome deletes the
 * mark, so that a retry gets in (PostgreSQL's unique key still stands
 * between it and a second order).
 */
void create_keyed(order_svc_t *s, order_t *o, int64_t t0, order_take_fn take, svc_resp_t *resp) {
  svc_idem_answer_t ans = {0};
  svc_idem_state_t st =
    s->idem ? svc_idem_claim(s->idem, o->user, o->idem_key, idem_lease_s(s), &ans) : SVC_IDEM_ERROR;
  if (st == SVC_IDEM_STORED) {
    idem_replay(s, o, &ans, true, resp);
    return;
  }
  if (st == SVC_IDEM_PENDING) {
    idem_await(s, o, resp);
    return;
  }
  /* Claimed, or Redis failed: then PostgreSQL guards alone. */
  take(s, o, t0, resp);
  const char *e = json_string_value(json_object_get(resp->body, "error"));
  bool refused = resp->status == 409 && e && strcmp(e, "rejected") == 0;
  bool replayed = false; /* answered from PostgreSQL already (answer_key_taken) */
  for (int i = 0; i < resp->nheaders; i++) replayed |= strcmp(resp->headers[i][0], "Idempotent-Replayed") == 0;
  if (refused && !replayed) {
    /* A refusal can hide the order this key made before (its tickets
     * count against the user's limit and the stock) when Redis lost the
     * key's answer: PostgreSQL says, one indexed read. */
    char err[512];
    switch (key_lookup(s, o->user, o->idem_key, &ans, err, sizeof(err))) {
    case KEY_FINAL: idem_replay(s, o, &ans, false, resp); break;
    case KEY_BUSY: idem_in_progress(s, resp); break;
    case KEY_ERROR: svc_resp_error(resp, 503, "unavailable", err); break;
    case KEY_NONE: break; /* the refusal stands */
    }
  }
  if (st != SVC_IDEM_CLAIMED) return;
  e = json_string_value(json_object_get(resp->body, "error"));
  if (resp->status == 201 || resp->status == 202 || (resp->status == 409 && e && strcmp(e, "rejected") == 0)) {
    char fp[sizeof(ans.req)];
    idem_fingerprint(o->activity, o->ticket_type, o->qty, fp, sizeof(fp));
    svc_idem_store(s->idem, o->user, o->idem_key, fp, resp->status, resp->body, s->idem_ttl_s);
  } else {
    svc_idem_forget(s->idem, o->user, o->idem_key);
  }
}

