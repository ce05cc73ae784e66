/*
 * order_service.c - order-service of the flash-sale demo: the entry point
 * of every purchase and the transaction manager (TM) of its global
 * transaction.
 *
 * NOTES
 *   HTTP API (JSON; examples/openapi/order-service.yaml describes each
 *   route, `--routes` lists them from routes[] below; every error is an
 *   RFC 9457 problem carrying its error word, svc_problem.h; a path no
 *   route has is 404, a method its path lacks 405 with Allow):
 *     POST /orders {activity, ticket_type, user, qty}
 *          [Idempotency-Key: 1..64 bytes of A-Za-z0-9._:-]
 *          201 order (Location: /orders/{id}) | 409 {error: rejected,
 *          reason: not_on_sale | over_limit | sold_out} | 400 | 404
 *          {error: unknown_activity} (unknown_activity_or_reply) | 503
 *          {error: unavailable} (Retry-After: 1);
 *          with a key also: the key's earlier answer again (header
 *          Idempotent-Replayed: true) | 409 {error: in_progress}
 *          (Retry-After: 1) | 422 {error: idempotency_key_reused}
 *          (a 201's order has its order_token: buyer_ok)
 *     GET  /orders/{id}                200 order | 401 | 403 | 404
 *     POST /orders/{id}/pay            200 order (PAID) | 401 | 403 | 404 | 409
 *                                      {error: bad_state, order_status} | 503
 *     POST /orders/{id}/cancel         200 order (CANCELLED) | 401 | 403 | 404 | 409 | 503
 *          (GET, pay and cancel: Authorization: Bearer <order_token>)
 *          (the stock follows through the order event a moment later)
 *     POST /activities/{id}/waitlist {user, ticket_type, qty}
 *          202 {position} | 409 {error: rejected, reason: over_limit} |
 *          404 {error: unknown_activity} | 503
 *     POST /activities/{id}/tickets {ticket_type, qty, key, operator?}
 *          more tickets, admin credentials (handle_tickets): 200 {result:
 *          added | done_before, buckets, waitlist_served, orders_placed,
 *          redis} | 400 | 401 | 403 | 404 no_buckets | unknown_activity |
 *          409 key_reused | sale_ended | at_mode | 503
 *     GET  /healthz                    200 {ok, tc_nodes_up, mode}
 *     POST /admin/mode {mode: local|global|auto}   the runtime switch of
 *          the fallback to local mode, authenticated (svc_admin.h)
 *     GET  /metrics                    200 Prometheus text (txc_client_*)
 *   ORDER_MODE=queued (order_queue.h, examples/README.md): POST /orders
 *   answers 202 {status: QUEUED} once the Lua freeze queued the order in
 *   {act_A}:queue; the consumer group makes it (queue_place) and tells
 *   the buyer of a refusal (order.rejected).  ORDER_QUEUE_THREADS
 *   consumers (default 32 per CPU).
 *   Fallback to local (TXC_TX_MODE=auto|global|local, default auto): with
 *   no coordinator, purchases run as local transactions with compensation
 *   records (place_order_local; examples/README.md); pay, cancel and
 *   expiry work as always (they never need the coordinator); a local
 *   order whose compensation is still pending answers 503 not_ready.
 *   An order is {order_id, activity, ticket_type, user, qty, bucket,
 *   status, xid}.
 *
 *   Idempotent submit (create_keyed): the same Idempotency-Key from the
 *   same user gets the same answer (the same 201 with the same order, or
 *   the same 409 refusal) and never a second order, in global and local
 *   mode and across a restart.  Two layers:
 *     - the truth, in the orders database: the key is written in the very
 *       statement that creates the order (the AT insert of branch 1, or
 *       rm_local_order_insert), under UNIQUE (user_id, idem_key)
 *       (sql/orders/003).  An attempt whose insert meets an order of the
 *       key rolls back (and gives its Redis freeze back) and answers with
 *       that order; a global transaction that rolls back deletes its
 *       order and so frees the key (that order did not happen);
 *     - the fast path, in Redis (svc_idem.h): before anything else,
 *       SET txc:idem:{user}:key pending NX EX lease (lease: longer than a
 *       purchase can take).  Won: the purchase runs, then its final answer
 *       (201, or a 409 refusal) is stored there for ORDER_IDEMPOTENCY_TTL_S;
 *       any other outcome (503, in_progress) deletes the mark so that a
 *       retry gets in.  Lost: a stored answer is replayed as it was (422
 *       if the key came with another activity, ticket type or qty);
 *       "pending" means another request holds the key (or died holding
 *       it): PostgreSQL is asked, then Redis polled for up to 1 s, then
 *       409 in_progress with Retry-After: 1.
 *   PostgreSQL's answer counts only once decided: an AT insert commits in
 *   phase one, so an order whose undo_log row is still there counts only
 *   if the coordinator says committed (else in_progress), and a local
 *   order whose stock side has not answered within the lease is
 *   in_progress too.  A refusal is not written to PostgreSQL: a Redis that
 *   lost a refused key's answer evaluates the request again (harmless, no
 *   order was made); but since a refusal can also be caused by the key's
 *   own earlier order (the user's limit, the last tickets), a refusal of
 *   a keyed request is checked against PostgreSQL before it is answered
 *   (one indexed read).  Redis down or failing: PostgreSQL alone, never a
 *   refusal for it.
 *
 *   One purchase (POST /orders), in order:
 *     1. take an order id (from blocks of trade_order_id_seq);
 *     2. prefilter freeze in Redis: a refusal answers 409 here, with no
 *        coordinator round trip;
 *     3. rm_tm_begin_branch -> xid, and branch 1 registered in the same
 *        round trip (GlobalBegin and BranchRegister in one call);
 *     4. branch 2 goes out first: POST stock-service /freeze with the xid
 *        in X-Txc-Xid (an AT delta branch on the bucket row plus the
 *        freeze's stock_freeze and stock_log rows, see stock_service.c);
 *     5. meanwhile branch 1, orders DB: [BEGIN; AT insert into
 *        trade_order] in one round trip, then [undo_log row; COMMIT] in
 *        another; then wait for stock-service's answer (the purchase waits
 *        for the slower branch, not for both in turn);
 *     6. rm_tm_commit -> 201.
 *   Any failure after 3 rolls the global transaction back (the TC undoes
 *   the branches that committed locally) and then gives the Redis freeze
 *   back.  When the outcome cannot be known (the coordinator did not
 *   answer a commit or a rollback), the answer is 503 and the Redis freeze
 *   is left in place: a freeze released for an order that did commit
 *   would let Redis sell a ticket twice, while a freeze kept for an order
 *   that rolled back only hides a ticket until reconciliation (PostgreSQL
 *   is the truth, Redis follows it).
 *
 *   Pay, cancel and expiry are not global transactions (examples/README.md,
 *   "Only the order needs a global transaction"): each is one local
 *   transaction of the orders database that moves the order from UNPAID
 *   (checked under SELECT ... FOR UPDATE, so two of them cannot both win)
 *   to PAID / CANCELLED / EXPIRED and writes its event to order_outbox; the
 *   relay thread publishes it to the Redis stream txc:order-events
 *   (svc_outbox.h), and stock-service's consumer confirms or releases the
 *   freeze exactly once, then updates Redis.  They need no coordinator.
 *
 *   Waitlist: when a cancel or an expiry gives tickets back, the
 *   background thread asks the prefilter to freeze them for the first
 *   waiting users (rm_prefilter_waitlist_fill, first come first served)
 *   once stock-service has put them back in Redis (it tries every 250 ms
 *   for 10 s), and places their orders like any purchase (steps 3 to 6);
 *   the users find them with GET /orders/{id}, and hear of them as the
 *   events waitlist.ordered / waitlist.refused (buyer_event).
 *
 *   Expiry: the same thread finds UNPAID orders past expire_at every
 *   ORDER_EXPIRY_INTERVAL_MS and expires them as above (checking the
 *   order's state and deadline first, under its row lock).  New orders get
 *   expire_at = now + ORDER_TTL_S (default 900: 15 minutes); their Redis
 *   and stock_freeze deadline is ORDER_FREEZE_GRACE_S (default 60) later,
 *   so that this job comes first and the prefilter's own expiry sweep
 *   (rm_prefilter_expire, stock side only) is only a backstop.
 *
 *   Settings (environment, as printed by cluster/local/up): ORDERS_PG_URL,
 *   TC_NODES, TC_SECRETS_DIR (or TC_SECRET_FILE: the secret of application
 *   "order-service"; the legacy TC_TOKEN still works), REDIS_URL,
 *   STOCK_URL; and, with their defaults:
 *     OUTBOX_STREAM_MAXLEN     1000000 (approximate trim of the stream:
 *                              keep it above the worst consumer backlog)
 *     OUTBOX_RETENTION_S       604800 (published outbox rows kept 7 days)
 *     OUTBOX_LINGER_MS         100 (after a relay pass that published, the
 *                              next waits this long: events per pass grow
 *                              under load; an idle relay publishes at once)
 *     ORDER_LISTEN             127.0.0.1:0 (any free port)
 *     ORDER_THREADS            32 per CPU: handler threads; they block on
 *                              Redis, the coordinator and stock-service
 *     ORDER_PG_POOL            8 per CPU: connections to the orders
 *                              database (held only for the local
 *                              transactions, never while waiting;
 *                              svc_pg_pool_default)
 *     ORDER_RESOURCE_ID        orders
 *     ORDER_GTX_TIMEOUT_MS     10000
 *     STOCK_CALL_TIMEOUT_MS    5000
 *     ORDER_TTL_S              900 (unpaid orders expire)
 *     ORDER_FREEZE_GRACE_S     60
 *     ORDER_EXPIRY_INTERVAL_MS 1000 (0: no expiry job)
 *     ORDER_SLOW_MS            1000 (an order slower than this logs the
 *                              time of each phase, at info level)
 *     PF_COMMAND_TIMEOUT_MS    500, PF_CONNECT_TIMEOUT_MS 1000 (Redis)
 *     ORDER_TICKET_PRICE_CENTS 9900 (an order's amount_cents is qty times
 *                              this; the payment ledger takes it)
 *     ORDER_RECONCILE_AT       02:30 (the daily reconciliation, UTC; off:
 *                              none; order_recon.h, reconcile.h)
 *     ORDER_RECONCILE_INTERVAL_S 0 (> 0: every this many seconds instead)
 *     ORDER_RECONCILE_SETTLE_S 300 (changes this recent wait for the next run)
 *     ORDER_IDEMPOTENCY_TTL_S  86400 (how long Redis keeps a key's answer;
 *                              PostgreSQL keeps the key with the order)
 *     ORDER_LOG_LEVEL          info
 *   --listen and --url-file FILE override ORDER_LISTEN / name a file to
 *   write the URL to once serving, as for stock-service.
 *   ORDER_TX_MODE=local (benchmarks only) takes orders without the
 *   coordinator: two plain local transactions (stock-service with
 *   STOCK_LOCAL_MODE=1), the baseline that "cost of consistency" compares
 *   with; pay and cancel then answer 501.
 *   SIGTERM/SIGINT: stop accepting, finish the requests in progress and
 *   the expiry pass, close, exit 0.
 */
#include <errno.h>
#include <stdarg.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "order_service.h"
#include "order_recon.h"
#include "order_queue.h"
#include "svc_admin.h"
#include "svc_problem.h"
#include "svc_common.h"
#include "txc_isotime.h"
#include "svc_http.h"
#include "svc_idem.h"
#include "svc_outbox.h"
#include "svc_prefilter.h"
#include "svc_redis.h"
#include "txc_failpoint.h"

typedef enum { FIN_PAY, FIN_CANCEL, FIN_EXPIRE } finish_kind_t;
static const char *const fin_names[] = {"pay", "cancel", "expire"};
static const char *const fin_status[] = {"PAID", "CANCELLED", "EXPIRED"};
static const char *const fin_events[] = {"order.paid", "order.cancelled", "order.expired"};

/* ------------------------------------------------------------ order ids */

/* Next order id; 0 with 'err' set when the sequence cannot be read.  A
 * database round trip only once per ID_BLOCK orders. */
static long long next_order_id(order_svc_t *s, char *err, size_t errlen) {
  pthread_mutex_lock(&s->id_mu);
  PGconn *pg = s->nids == 0 ? svc_pg_get(s->pool, 2000, err, errlen) : NULL;
  if (pg) {
    PGresult *r = NULL;
    char n[16];
    snprintf(n, sizeof(n), "%d", ID_BLOCK);
    const char *p[1] = {n};
    if (svc_pg_exec(pg, "SELECT nextval('trade_order_id_seq') FROM generate_series(1, $1::int)", 1, p,
                    PGRES_TUPLES_OK, &r, err, errlen)) {
      int rows = PQntuples(r);
      /* Hand them out in increasing order: pop from the end. */
      for (int i = 0; i < rows && i < ID_BLOCK; i++) s->ids[i] = atoll(PQgetvalue(r, rows - 1 - i, 0));
      s->nids = rows < ID_BLOCK ? rows : ID_BLOCK;
      PQclear(r);
    }
    svc_pg_put(s->pool, pg);
  }
  long long id = s->nids > 0 ? s->ids[--s->nids] : 0;
  pthread_mutex_unlock(&s->id_mu);
  return id;
}

/* ------------------------------------------------------ global helpers */

/* Roll 'xid' back and tell what became of it. */
static decision_t rollback_global(order_svc_t *s, const char *xid, const char *why) {
  int st = 0;
  int rc = rm_tm_rollback(s->rm, xid, &st);
  if (rc == 0) return DECIDED_ROLLBACK;
  /* RM_E_ROLLBACK_PENDING: decided, the TC finishes the undo (the status
   * says rollback); RM_E_ROLLBACK_FAILED: a branch is not undone (status
   * RollbackFailed: unknown here, for an operator).  rm_errmsg() has it. */
  decision_t d = st ? decision_of(st) : DECIDED_UNKNOWN;
  if (d == DECIDED_UNKNOWN) {
    int st2 = 0;
    if (rm_tm_status(s->rm, xid, &st2) == 0) d = decision_of(st2);
  }
  SVC_LOG(d == DECIDED_ROLLBACK ? SVC_LOG_INFO : SVC_LOG_WARN,
          json_pack("{s:s,s:s}", "xid", xid, "cause", why), "rollback of global transaction: %s (%s)",
          rm_strerror(rc), d == DECIDED_ROLLBACK ? "rolled back" : d == DECIDED_COMMIT ? "committed" : "unknown");
  return d;
}

/* Commit 'xid'; on an error, find out what was decided. */
static decision_t commit_global(order_svc_t *s, const char *xid, char *err, size_t errlen) {
  int st = 0;
  int rc = rm_tm_commit(s->rm, xid, &st);
  if (rc == 0) return DECIDED_COMMIT;
  if (rc == RM_E_COMMIT_FAILED) {
    /* Committed; a branch's phase-two commit (a give-back) failed for
     * good: the order stands, the branch is an operator's. */
    SVC_LOG(SVC_LOG_WARN, json_pack("{s:s}", "xid", xid), "%s", rm_errmsg());
    return DECIDED_COMMIT;
  }
  snprintf(err, errlen, "commit: %s", rm_strerror(rc));
  decision_t d = st ? decision_of(st) : DECIDED_UNKNOWN;
  for (int i = 0; d == DECIDED_UNKNOWN && i < 3; i++) {
    int st2 = 0;
    int rc2 = rm_tm_status(s->rm, xid, &st2);
    if (rc2 == 0) {
      d = decision_of(st2);
      if (d == DECIDED_UNKNOWN && st2 == RM_GS_BEGIN) {
        /* The commit never reached the TC: decide now (roll back). */
        return rollback_global(s, xid, "commit not delivered");
      }
    }
  }
  return d;
}

/* ----------------------------------------------------- order branches */

static bool local_commit(PGconn *pg, char *err, size_t errlen) {
  PGresult *r = PQexec(pg, "COMMIT");
  bool ok = PQresultStatus(r) == PGRES_COMMAND_OK && strcmp(PQcmdStatus(r), "COMMIT") == 0;
  if (!ok) snprintf(err, errlen, "local commit failed: %s", PQresultErrorMessage(r));
  PQclear(r);
  return ok;
}

static void local_abort(PGconn *pg) {
  if (PQtransactionStatus(pg) != PQTRANS_IDLE) PQclear(PQexec(pg, "ROLLBACK"));
}

/* Branch 1 of a purchase, 'bid' (registered with the global's begin:
 * rm_tm_begin_branch), on 'pg': insert 'o' as UNPAID, prepare and
 * commit.  'rehearsal': the same statements in a rehearsal of the branch
 * (rm_at_open_rehearsal: no coordinator, rolled back; warm_connection). */
static int branch_insert_order(order_svc_t *s, PGconn *pg, int64_t bid, const order_t *o, bool rehearsal, char *err,
                               size_t errlen) {
  char sid[24], sa[24], st[24], su[24], sq[24], sb[24], sm[24], exp[64] = "";
  snprintf(sid, sizeof(sid), "%lld", o->order_id);
  snprintf(sm, sizeof(sm), "%lld", o->qty * s->price_cents);
  snprintf(sa, sizeof(sa), "%lld", o->activity);
  snprintf(st, sizeof(st), "%lld", o->ticket_type);
  snprintf(su, sizeof(su), "%lld", o->user);
  snprintf(sq, sizeof(sq), "%lld", o->qty);
  snprintf(sb, sizeof(sb), "%lld", o->bucket);
  /* The key goes in with the order: the unique (user_id, idem_key) refuses
   * a second order for it (the AT insert fails, this attempt rolls back). */
  const char *cols[10] = {"order_id", "activity_id", "ticket_type", "user_id", "qty", "bucket_id", "xid",
                          "expire_at", "amount_cents", "idem_key"};
  const char *vals[10] = {sid, sa, st, su, sq, sb, o->xid, exp, sm, o->idem_key};
  txc_iso_time(exp, o->expire_ms);
  int ncols = o->idem_key ? 10 : 9;
  /* No BEGIN of our own: the branch begins the transaction with its
   * first statement, in one round trip (on an idle connection). */
  rm_branch_t *b = NULL;
  int rc = rehearsal ? rm_at_open_rehearsal(s->rm, s->resource, pg, &b)
                     : rm_at_open_registered(s->rm, o->xid, s->resource, bid, pg, &b);
  /* A failure rolls the transaction back: no savepoint per statement. */
  if (rc == 0) rc = rm_at_statement_savepoints(b, false);
  /* No global lock on the new order: no global transaction writes an
   * order after its own (pay, cancel and expiry are local transactions),
   * so the lock would guard against nobody and cost the coordinator a
   * lock row; the checked rollback still refuses a changed row. */
  /* Deferred, both ways: prepare_commit sends the insert, its undo row and
   * the COMMIT as one statement (the whole local transaction, one round
   * trip, as the local mode's plain INSERT). */
  if (rc == 0 && s->at_sql) {
    /* The SQL the service would write anyway (TXC_AT_WRITES=sql). */
    static const char *const insert_sql[2] = {
      "INSERT INTO trade_order (order_id, activity_id, ticket_type, user_id, qty, bucket_id, xid, expire_at,"
      " amount_cents) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
      "INSERT INTO trade_order (order_id, activity_id, ticket_type, user_id, qty, bucket_id, xid, expire_at,"
      " amount_cents, idem_key) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)"};
    rc = rm_at_sql_deferred(b, insert_sql[ncols == 10], ncols, NULL, vals);
  } else if (rc == 0) {
    rc = rm_at_insert_deferred(b, "trade_order", ncols, cols, vals);
  }
  /* prepare and COMMIT: with the undo row in one round trip */
  bool committed = false;
  if (rc == 0) rc = rm_at_prepare_commit(b, NULL, &committed);
  if (rc != 0) {
    snprintf(err, errlen, "order branch: %s: %s", rm_strerror(rc), b ? rm_at_errmsg(b) : "");
    local_abort(pg);
    if (b) rm_at_close(b, committed);
    return rc;
  }
  rm_at_close(b, committed);
  return 0;
}

/*
 * svc_pg_warm_fn: the order branch rehearsed on 'pg' before the service
 * serves (rm_at_open_rehearsal: the statements a purchase runs on the
 * orders database, nothing to the coordinator, rolled back), with ids no
 * request can have.  The backend has then read the catalogs and planned
 * what the first purchase of a sale would (bench/README, twenty-fifth
 * session).
 */
static bool warm_connection(PGconn *pg, void *arg, char *err, size_t errlen) {
  order_svc_t *s = arg;
  order_t o = {.order_id = INT64_MAX, .activity = -1, .ticket_type = 1, .user = INT64_MAX, .qty = 1, .bucket = 0,
               .expire_ms = svc_now_us() / 1000 + 60000, .idem_key = "warm-up"};
  snprintf(o.xid, sizeof(o.xid), "%s", RM_AT_REHEARSAL_XID);
  int rc = branch_insert_order(s, pg, 0, &o, true, err, errlen);
  local_abort(pg);
  return rc == 0;
}

/* Branch 2: the stock-service call with 'body' (taken).  Returns the HTTP
 * status (0: no answer) and the error word of a refusal in 'reason'. */
/* The end of a stock-service call started with svc_httpc_start ('call'
 * may be NULL: it could not start, 'err' says why). */
static long stock_answer(svc_httpc_call_t *call, const char *path, char *reason, size_t reasonlen, char *err,
                         size_t errlen) {
  long status = 0;
  json_t *ans = NULL;
  reason[0] = '\0';
  if (!call || svc_httpc_finish(call, &status, &ans, err, errlen) != 0) return 0;
  const char *e = json_string_value(json_object_get(ans, "error"));
  const char *d = json_string_value(json_object_get(ans, "detail"));
  snprintf(reason, reasonlen, "%s", e ? e : "");
  if (status != 200) snprintf(err, errlen, "stock-service %s: %ld %s%s%s", path, status, e ? e : "", d ? ": " : "",
                              d ? d : "");
  json_decref(ans);
  return status;
}

static long call_stock(order_svc_t *s, const char *path, const char *xid, json_t *body, char *reason,
                       size_t reasonlen, char *err, size_t errlen) {
  svc_httpc_call_t *call = svc_httpc_start(s->stock, path, xid, body, s->stock_timeout_ms, err, errlen);
  json_decref(body);
  return stock_answer(call, path, reason, reasonlen, err, errlen);
}

/* ---------------------------------------------------------- handlers */


/*
 * The "no coordinator" baseline of the benchmarks (ORDER_TX_MODE=local):
 * the same two writes as a purchase, each a plain local transaction
 * (stock-service runs /freeze without an xid), and a best-effort
 * compensation (delete the order, release Redis) when the second fails.
 * Not consistent under failures: that is what the coordinator is for.
 * Takes 'pg' (returns it to the pool).
 */
static void create_local(order_svc_t *s, PGconn *pg, order_t *o, int64_t deadline_ms, svc_resp_t *resp) {
  char err[512] = "", reason[64], perr[256];
  char sid[24], sa[24], st[24], su[24], sq[24], sb[24], exp[64];
  snprintf(sid, sizeof(sid), "%lld", o->order_id);
  snprintf(sa, sizeof(sa), "%lld", o->activity);
  snprintf(st, sizeof(st), "%lld", o->ticket_type);
  snprintf(su, sizeof(su), "%lld", o->user);
  snprintf(sq, sizeof(sq), "%lld", o->qty);
  snprintf(sb, sizeof(sb), "%lld", o->bucket);
  snprintf(exp, sizeof(exp), "%lld", (long long)o->expire_ms);
  const char *p[8] = {sid, sa, st, su, sq, sb, exp, o->idem_key};
  bool ok = svc_pg_exec(pg,
                        "INSERT INTO trade_order (order_id, activity_id, ticket_type, user_id, qty, bucket_id,"
                        " expire_at, idem_key) VALUES ($1, $2, $3, $4, $5, $6, to_timestamp($7::bigint / 1000.0), $8)",
                        8, p, PGRES_COMMAND_OK, NULL, err, sizeof(err));
  long status = 0;
  if (ok) {
    json_t *body = json_pack("{s:I,s:I,s:I,s:I,s:I,s:I,s:I}", "order_id", (json_int_t)o->order_id, "activity",
                             (json_int_t)o->activity, "ticket_type", (json_int_t)o->ticket_type, "bucket",
                             (json_int_t)o->bucket, "qty", (json_int_t)o->qty, "user", (json_int_t)o->user,
                             "deadline_ms", (json_int_t)deadline_ms);
    status = call_stock(s, "/freeze", NULL, body, reason, sizeof(reason), err, sizeof(err));
    if (status == 200) {
      svc_pg_put(s->pool, pg);
      svc_resp_json(resp, 201, buyer_json(s, o));
      return;
    }
    /* compensate: the order goes, then the Redis freeze */
    char derr[256];
    if (!svc_pg_exec(pg, "DELETE FROM trade_order WHERE order_id = $1", 1, p, PGRES_COMMAND_OK, NULL, derr,
                     sizeof(derr)))
      svc_warn("could not delete order %lld after a failed stock call: %s", o->order_id, derr);
  }
  svc_pg_put(s->pool, pg);
  svc_pf_release(s->pf, o->activity, o->ticket_type, o->order_id, perr, sizeof(perr));
  if (status == 409 && strcmp(reason, "sold_out") == 0) {
    svc_resp_json(resp, 409, svc_problem_rejected("sold_out"));
    return;
  }
  /* the insert failed: on the unique key of an order made with this key? */
  if (!ok && o->idem_key && answer_key_taken(s, o, resp)) return;
  svc_warn("could not take an order (local mode): %s", err);
  svc_resp_error(resp, 503, "unavailable", err);
}

/* ------------------------------------------------- fallback to local */

/* The refusal code of stock-service's answer word to a local freeze; 0
 * when it is not a refusal. */
static int local_refusal(const char *reason) {
  if (strcmp(reason, "sold_out") == 0) return RM_PF_SOLD_OUT;
  if (strcmp(reason, "over_limit") == 0) return RM_PF_OVER_LIMIT;
  if (strcmp(reason, "invalid") == 0) return RM_PF_BAD_ARGS;
  if (strcmp(reason, "not_on_sale") == 0) return RM_PF_NOT_ON_SALE;
  return 0;
}

/*
 * A purchase without the coordinator (rm_client_mode says local, or
 * rm_tm_begin found no node): the order and its compensation row in one
 * local transaction, then stock-service /freeze without an xid
 * (X-Txc-Local: 1), then finish or cancel by its answer.  No answer: the
 * order stands as UNPAID and the compensation job decides it (it may end
 * CANCELLED with a reason).  Fills 'resp'.
 */
static void place_order_local(order_svc_t *s, order_t *o, int64_t deadline_ms, svc_resp_t *resp) {
  char err[512] = "", reason[64] = "", perr[256];
  o->xid[0] = '\0';
  rm_local_order_t lo = {.order_id = o->order_id, .activity_id = o->activity, .ticket_type = (int32_t)o->ticket_type,
                         .bucket = (int32_t)o->bucket, .user_id = o->user, .qty = (int32_t)o->qty,
                         .expire_ms = o->expire_ms, .deadline_ms = deadline_ms, .idem_key = o->idem_key};
  PGconn *pg = svc_pg_get(s->pool, 5000, err, sizeof(err));
  int rc = pg ? rm_local_order_insert(s->rm, pg, &lo) : RM_E_DB;
  if (pg && rc < 0) snprintf(err, sizeof(err), "local order: %s: %s", rm_prefilter_strerror(rc), rm_local_errmsg());
  svc_pg_put(s->pool, pg);
  if (rc < 0) {
    svc_pf_release(s->pf, o->activity, o->ticket_type, o->order_id, perr, sizeof(perr));
    /* another order holds the key: answer with it (nothing was inserted) */
    if (rc == RM_LOCAL_E_IDEM_KEY && answer_key_taken(s, o, resp)) return;
    SVC_LOG(SVC_LOG_WARN, json_pack("{s:I,s:s}", "order_id", (json_int_t)o->order_id, "mode", "local"),
            "could not take an order: %s", err);
    svc_resp_error(resp, 503, "unavailable", err);
    return;
  }
  json_t *body = json_pack("{s:I,s:I,s:I,s:I,s:I,s:I,s:I}", "order_id", (json_int_t)o->order_id, "activity",
                           (json_int_t)o->activity, "ticket_type", (json_int_t)o->ticket_type, "bucket",
                           (json_int_t)o->bucket, "qty", (json_int_t)o->qty, "user", (json_int_t)o->user,
                           "deadline_ms", (json_int_t)deadline_ms);
  svc_httpc_call_t *call =
    svc_httpc_start_hdr(s->stock, "/freeze", NULL, "X-Txc-Local: 1", body, s->stock_timeout_ms, err, sizeof(err));
  json_decref(body);
  long st = stock_answer(call, "/freeze", reason, sizeof(reason), err, sizeof(err));
  int refusal = st == 409 ? local_refusal(reason) : 0;
  if (st == 200) {
    pg = svc_pg_get(s->pool, 5000, perr, sizeof(perr));
    rc = pg ? rm_local_order_finish(s->rm, pg, o->order_id) : RM_E_DB;
    if (pg && rc < 0) snprintf(perr, sizeof(perr), "%s: %s", rm_prefilter_strerror(rc), rm_local_errmsg());
    svc_pg_put(s->pool, pg);
    if (rc < 0)
      SVC_LOG(SVC_LOG_WARN, json_pack("{s:I}", "order_id", (json_int_t)o->order_id),
              "could not finish a local order (the compensation job will): %s", perr);
    svc_resp_json(resp, 201, buyer_json(s, o));
    return;
  }
  if (refusal) {
    pg = svc_pg_get(s->pool, 5000, perr, sizeof(perr));
    rc = pg ? rm_local_order_cancel(s->rm, pg, svc_pf_handle(s->pf), o->order_id, refusal) : RM_E_DB;
    if (pg && rc < 0) snprintf(perr, sizeof(perr), "%s: %s", rm_prefilter_strerror(rc), rm_local_errmsg());
    svc_pg_put(s->pool, pg);
    if (rc < 0)
      SVC_LOG(SVC_LOG_WARN, json_pack("{s:I}", "order_id", (json_int_t)o->order_id),
              "could not cancel a refused local order (the compensation job will): %s", perr);
    svc_resp_json(resp, 409, svc_problem_rejected(reason));
    return;
  }
  if (st == 0 || st >= 500) {
    /* the stock side may have frozen: the order stands (UNPAID); the
     * compensation job asks the stock database and decides it */
    SVC_LOG(SVC_LOG_WARN, json_pack("{s:I}", "order_id", (json_int_t)o->order_id),
            "local order left to the compensation job: %s", err);
    if (s->comp) rm_compensator_kick(s->comp, false);
    svc_resp_json(resp, 201, buyer_json(s, o));
    return;
  }
  /* any other answer (400, 409 mismatch): nothing was frozen; the order
   * stays pending for the compensation job */
  SVC_LOG(SVC_LOG_WARN, json_pack("{s:I}", "order_id", (json_int_t)o->order_id),
          "could not take a local order: %s", err);
  svc_resp_error(resp, 503, "unavailable", err);
}

/* ------------------------------------------------------------ metrics */

/* GET /metrics: the client side (prefilter, mode, compensation, HTTP) in
 * Prometheus text format. */
static void handle_metrics(order_svc_t *s, svc_resp_t *resp) {
  txc_buf_t b = {0};
  svc_pf_metrics(s->pf, &b);

  rm_degrade_stats_t ds = {0};
  rm_client_degrade_stats(s->rm, &ds);
  txc_buf_printf(&b,
       "# HELP txc_client_mode Current transaction mode (1 = the labelled mode).\n"
       "# TYPE txc_client_mode gauge\n"
       "txc_client_mode{mode=\"global\"} %d\ntxc_client_mode{mode=\"local\"} %d\n"
       "# HELP txc_client_mode_forced The transaction mode forced by an operator: 0 auto (detection decides), 1 global, 2 local.\n"
       "# TYPE txc_client_mode_forced gauge\ntxc_client_mode_forced %d\n"
       "# HELP txc_client_mode_switches_total Switches of the transaction mode.\n"
       "# TYPE txc_client_mode_switches_total counter\n"
       "txc_client_mode_switches_total{to=\"local\"} %llu\ntxc_client_mode_switches_total{to=\"global\"} %llu\n"
       "# HELP txc_client_degrade_probes_total Probes of the coordinators by the degrade detection.\n"
       "# TYPE txc_client_degrade_probes_total counter\ntxc_client_degrade_probes_total %llu\n"
       "# HELP txc_client_degrade_probe_failures_total Probes of the coordinators that failed.\n"
       "# TYPE txc_client_degrade_probe_failures_total counter\ntxc_client_degrade_probe_failures_total %llu\n"
       "# HELP txc_client_local_orders_total Orders taken in fallback-to-local mode.\n"
       "# TYPE txc_client_local_orders_total counter\ntxc_client_local_orders_total %llu\n",
       ds.mode == RM_MODE_GLOBAL, ds.mode == RM_MODE_LOCAL, ds.forced, (unsigned long long)ds.to_local,
       (unsigned long long)ds.to_global, (unsigned long long)ds.probes, (unsigned long long)ds.probe_failures,
       (unsigned long long)ds.local_orders);

  rm_compensator_stats_t cs = {0};
  if (s->comp) rm_compensator_stats(s->comp, &cs);
  txc_buf_printf(&b,
       "# HELP txc_client_compensation_passes_total Compensation passes by result.\n"
       "# TYPE txc_client_compensation_passes_total counter\n"
       "txc_client_compensation_passes_total{result=\"ran\"} %llu\n"
       "txc_client_compensation_passes_total{result=\"locked\"} %llu\n"
       "txc_client_compensation_passes_total{result=\"error\"} %llu\n"
       "# HELP txc_client_compensation_orders_total Local orders finished by the compensation job.\n"
       "# TYPE txc_client_compensation_orders_total counter\n"
       "txc_client_compensation_orders_total{outcome=\"frozen\"} %llu\n"
       "txc_client_compensation_orders_total{outcome=\"cancelled\"} %llu\n"
       "txc_client_compensation_orders_total{outcome=\"failed\"} %llu\n"
       "# HELP txc_client_reconciled_activities_total Activities the Redis/PostgreSQL reconciliation compared.\n"
       "# TYPE txc_client_reconciled_activities_total counter\ntxc_client_reconciled_activities_total %llu\n"
       "# HELP txc_client_reconcile_fixes_total Redis values the reconciliation corrected to PostgreSQL's.\n"
       "# TYPE txc_client_reconcile_fixes_total counter\ntxc_client_reconcile_fixes_total %llu\n",
       (unsigned long long)cs.passes, (unsigned long long)cs.locked, (unsigned long long)cs.errors,
       (unsigned long long)cs.frozen, (unsigned long long)cs.cancelled, (unsigned long long)cs.failed,
       (unsigned long long)cs.reconciled, (unsigned long long)cs.fixed);

  txc_buf_printf(&b,
                 "# HELP txc_client_idempotent_replays_total POST /orders answered with the answer its Idempotency-Key "
                 "already had, by where it was found.\n"
                 "# TYPE txc_client_idempotent_replays_total counter\n"
                 "txc_client_idempotent_replays_total{source=\"redis\"} %llu\n"
                 "txc_client_idempotent_replays_total{source=\"pg\"} %llu\n"
                 "# HELP txc_client_idempotent_in_progress_total POST /orders answered 409 in_progress: another request "
                 "held the Idempotency-Key.\n"
                 "# TYPE txc_client_idempotent_in_progress_total counter\n"
                 "txc_client_idempotent_in_progress_total %llu\n",
                 (unsigned long long)s->idem_replays_redis, (unsigned long long)s->idem_replays_pg,
                 (unsigned long long)s->idem_in_progress);
  svc_relay_stats_t rs;
  svc_relay_stats(s->relay, &rs);
  txc_buf_printf(&b,
                 "# HELP txc_events_published_total Order events the outbox relay published.\n"
                 "# TYPE txc_events_published_total counter\n"
                 "txc_events_published_total %llu\n"
                 "# HELP txc_events_republished_total Order events published again after the stream lost them.\n"
                 "# TYPE txc_events_republished_total counter\n"
                 "txc_events_republished_total %llu\n"
                 "# HELP txc_events_relay_errors_total Passes of the outbox relay that failed (retried).\n"
       "# TYPE txc_events_relay_errors_total counter\ntxc_events_relay_errors_total %llu\n"
                 "# HELP txc_outbox_unpublished Events in the outbox not published yet (outbox lag).\n"
                 "# TYPE txc_outbox_unpublished gauge\ntxc_outbox_unpublished %lld\n"
                 "# HELP txc_outbox_oldest_unpublished_seconds Age of the oldest unpublished event.\n"
                 "# TYPE txc_outbox_oldest_unpublished_seconds gauge\ntxc_outbox_oldest_unpublished_seconds %.3f\n",
                 (unsigned long long)rs.published, (unsigned long long)rs.republished,
                 (unsigned long long)rs.errors, rs.unpublished, rs.oldest_unpublished_s);
  if (s->queue) {
    order_queue_stats_t qs;
    order_queue_stats(s->queue, &qs);
    txc_buf_printf(&b,
                   "# HELP txc_order_queue_entries_total Queued orders handled by the queue's consumer, by result.\n"
                   "# TYPE txc_order_queue_entries_total counter\n"
                   "txc_order_queue_entries_total{result=\"done\"} %llu\n"
                   "txc_order_queue_entries_total{result=\"later\"} %llu\n"
                   "txc_order_queue_entries_total{result=\"claimed\"} %llu\n"
                   "txc_order_queue_entries_total{result=\"malformed\"} %llu\n"
                   "# HELP txc_order_queue_errors_total Redis failures of the queue's consumer.\n"
                   "# TYPE txc_order_queue_errors_total counter\ntxc_order_queue_errors_total %llu\n"
                   "# HELP txc_order_queue_streams Activities whose queue the consumer reads.\n"
                   "# TYPE txc_order_queue_streams gauge\ntxc_order_queue_streams %u\n",
                   qs.done, qs.later, qs.claimed, qs.bad, qs.errors, qs.streams);
  }
  order_recon_metrics(s->recon, &b);
  svc_admin_metrics(s->admin, &b, false);
  svc_resp_metrics(resp, &b);
}

/*
 * Steps 3 to 6 of a purchase for 'o', whose tickets the prefilter froze
 * (until 'deadline_ms') in bucket o->bucket: begin, both branches, commit;
 * on failure roll back and give the Redis freeze back.  Fills 'resp'.
 * 't0' is when the request started (for the slow-order log line).
 */
static void place_order(order_svc_t *s, order_t *o, int64_t deadline_ms, int64_t t0, svc_resp_t *resp) {
  char err[512] = "", reason[64];
  if (rm_client_mode(s->rm) == RM_MODE_LOCAL) {
    place_order_local(s, o, deadline_ms, resp);
    return;
  }
  /* 3. begin, with the order branch registered in the same round trip
   * (rm_tm_begin_branch: the branch takes no global lock, see
   * branch_insert_order) */
  int64_t t_pf = svc_now_us();
  int64_t bid = 0;
  int rc = rm_tm_begin_branch(s->rm, s->gtx_timeout_ms, "order", s->resource, o->xid, &bid);
  int64_t t_begin = svc_now_us();
  if (rc == RM_E_NO_NODE || rc == RM_E_DEADLINE) {
    /* certainly no global transaction: take the order in local mode */
    o->xid[0] = '\0';
    place_order_local(s, o, deadline_ms, resp);
    return;
  }
  if (rc != 0) {
    snprintf(err, sizeof(err), "begin: %s", rm_strerror(rc));
    /* RM_E_UNKNOWN_OUTCOME: a transaction may exist, but no branch was
     * registered in it: it times out with nothing to undo. */
    svc_pf_release(s->pf, o->activity, o->ticket_type, o->order_id, reason, sizeof(reason));
    SVC_LOG(SVC_LOG_WARN, json_pack("{s:I}", "order_id", (json_int_t)o->order_id), "could not take an order: %s",
            err);
    svc_resp_error(resp, 503, "unavailable", err);
    return;
  }

  /* 4. and 5.: the stock call goes out first, and the order branch runs
   * while stock-service does its own: the two branches are independent
   * (each registers with the coordinator under the xid), so the purchase
   * waits for the slower of them, not for their sum. */
  int http_status = 503;
  const char *answer_reason = "unavailable";
  char serr[512] = "";
  json_t *body = json_pack("{s:I,s:I,s:I,s:I,s:I,s:I,s:I}", "order_id", (json_int_t)o->order_id, "activity",
                           (json_int_t)o->activity, "ticket_type", (json_int_t)o->ticket_type, "bucket",
                           (json_int_t)o->bucket, "qty", (json_int_t)o->qty, "user", (json_int_t)o->user,
                           "deadline_ms", (json_int_t)deadline_ms);
  svc_httpc_call_t *call = svc_httpc_start(s->stock, "/freeze", o->xid, body, s->stock_timeout_ms, serr,
                                           sizeof(serr));
  json_decref(body);
  PGconn *pg = svc_pg_get(s->pool, 5000, err, sizeof(err));
  rc = pg ? branch_insert_order(s, pg, bid, o, false, err, sizeof(err)) : RM_E_DB;
  svc_pg_put(s->pool, pg);
  int64_t t_b1 = svc_now_us();
  long st = stock_answer(call, "/freeze", reason, sizeof(reason), serr, sizeof(serr));
  if (rc == 0 && st != 200) snprintf(err, sizeof(err), "%s", serr);
  if (rc == 0) {
    if (st == 200) {
      /* 6. commit.  Both branches committed locally: a TM that dies here
       * leaves the global transaction to the timeout (the fault suite
       * kills it here). */
      TXC_FAILPOINT("svc.order.fin.before_commit");
      int64_t t_stock = svc_now_us();
      decision_t d = commit_global(s, o->xid, err, sizeof(err));
      if (d == DECIDED_COMMIT) {
        int64_t t_end = svc_now_us();
        if (t_end - t0 >= s->slow_us)
          SVC_LOG(SVC_LOG_INFO,
                  json_pack("{s:s,s:I,s:f,s:f,s:f,s:f,s:f,s:f}", "xid", o->xid, "order_id", (json_int_t)o->order_id,
                            "total_ms", (double)(t_end - t0) / 1000, "prefilter_ms", (double)(t_pf - t0) / 1000,
                            "begin_ms", (double)(t_begin - t_pf) / 1000, "order_branch_ms",
                            (double)(t_b1 - t_begin) / 1000, "stock_wait_ms", (double)(t_stock - t_b1) / 1000,
                            "commit_ms", (double)(t_end - t_stock) / 1000),
                  "slow order");
        svc_resp_json(resp, 201, buyer_json(s, o));
        return;
      }
      if (d == DECIDED_UNKNOWN) {
        SVC_LOG(SVC_LOG_WARN, json_pack("{s:s,s:I}", "xid", o->xid, "order_id", (json_int_t)o->order_id),
                "outcome of the order is unknown: %s; the Redis freeze is kept until reconciliation", err);
        svc_resp_error(resp, 503, "unknown_outcome", err);
        return;
      }
      /* rolled back (e.g. timed out): release below */
      goto released;
    }
    if (st == 409 && (strcmp(reason, "sold_out") == 0 || strcmp(reason, "over_limit") == 0 ||
                      strcmp(reason, "not_on_sale") == 0)) {
      /* PostgreSQL's refusal where Redis let the order through (the sale
       * window: sql/stock/006) */
      http_status = 409;
      answer_reason = strcmp(reason, "sold_out") == 0 ? "sold_out"
                      : strcmp(reason, "over_limit") == 0 ? "over_limit" : "not_on_sale";
    }
  }
  {
    decision_t d = rollback_global(s, o->xid, err);
    if (d != DECIDED_ROLLBACK) {
      SVC_LOG(SVC_LOG_WARN, json_pack("{s:s,s:I}", "xid", o->xid, "order_id", (json_int_t)o->order_id),
              "outcome of the order is unknown after: %s; the Redis freeze is kept until reconciliation", err);
      svc_resp_error(resp, 503, "unknown_outcome", err);
      return;
    }
  }
released:
  {
    char perr[256];
    if (svc_pf_release(s->pf, o->activity, o->ticket_type, o->order_id, perr, sizeof(perr)) != PF_OK)
      SVC_LOG(SVC_LOG_WARN, json_pack("{s:s,s:I}", "xid", o->xid, "order_id", (json_int_t)o->order_id),
              "could not release the Redis freeze of a rolled-back order: %s", perr);
  }
  /* The order branch failed: on the unique key of an order made with this
   * idempotency key (Redis lost the mark, or was down)?  Answer with it. */
  if (rc != 0 && o->idem_key && answer_key_taken(s, o, resp)) return;
  if (http_status == 409) {
    /* PostgreSQL said sold out (or over the user's limit) where Redis let
     * the order through: Redis is behind (reconciliation will align it).
     * The client sees a refusal. */
    SVC_LOG(SVC_LOG_DEBUG, json_pack("{s:s,s:I,s:s}", "xid", o->xid, "bucket", (json_int_t)o->bucket, "reason",
                                     answer_reason),
            "PostgreSQL refused what the prefilter let through");
    svc_resp_json(resp, 409, svc_problem_rejected(answer_reason));
    return;
  }
  SVC_LOG(SVC_LOG_WARN, json_pack("{s:s,s:I}", "xid", o->xid, "order_id", (json_int_t)o->order_id),
          "could not take an order: %s", err);
  svc_resp_error(resp, 503, "unavailable", err);
}

/* An event for the buyer alone (no order state changes with it): 'type'
 * of 'order_id' with the order's payload and 'reason' (may be NULL),
 * through the outbox in a local transaction of its own; the notify group
 * writes the member's notice once.  A crash before the commit loses only
 * the notice.  'what' names it in the warning when it cannot be written. */
static void buyer_event(order_svc_t *s, const char *type, long long order_id, long long activity,
                        long long ticket_type, long long bucket, long long user, long long qty, const char *reason,
                        const char *what) {
  char err[512] = "";
  json_t *payload = json_pack("{s:I,s:I,s:I,s:I,s:I}", "activity", (json_int_t)activity, "ticket_type",
                              (json_int_t)ticket_type, "bucket", (json_int_t)(bucket < 0 ? 0 : bucket), "user",
                              (json_int_t)user, "qty", (json_int_t)qty);
  if (reason) json_object_set_new(payload, "reason", json_string(reason));
  PGconn *pg = svc_pg_get(s->pool, 2000, err, sizeof(err));
  bool ok = pg && svc_pg_exec(pg, "BEGIN", 0, NULL, PGRES_COMMAND_OK, NULL, err, sizeof(err));
  if (ok) {
    ok = svc_outbox_add(pg, type, order_id, payload, err, sizeof(err)); /* takes the payload */
    payload = NULL;
  }
  json_decref(payload);
  if (ok) ok = local_commit(pg, err, sizeof(err));
  if (pg) {
    if (!ok) local_abort(pg);
    svc_pg_put(s->pool, pg);
  }
  if (ok)
    svc_relay_kick(s->relay);
  else
    SVC_LOG(SVC_LOG_WARN, json_pack("{s:I,s:I,s:s}", "order_id", (json_int_t)order_id, "user", (json_int_t)user,
                                    "event", type),
            "could not tell %s: %s", what, err);
}

/*
 * The queued mode's consumer (order_queue.h) hands over one order the
 * freeze script queued: create it as the synchronous path would (steps 3
 * to 6: the global transaction, whose stock branch is PostgreSQL's final
 * check).  An order already in the database (an earlier attempt, whose
 * acknowledgement was lost) is done.  A refusal (PostgreSQL had not the
 * tickets: Redis had lost writes; or the order could not be placed) gave
 * the Redis freeze and the user's count back (place_order): the buyer is
 * told by an order.rejected event.  An unknown outcome keeps the freeze
 * and the entry, for a retry that looks in the database first.
 */
static order_queue_result_t queue_place(const order_queue_entry_t *e, void *arg) {
  order_svc_t *s = arg;
  char err[512] = "";
  order_t o = {.order_id = e->order_id, .activity = e->activity, .ticket_type = e->ticket_type, .user = e->user,
               .qty = e->qty, .bucket = e->bucket, .expire_ms = e->deadline_ms - s->freeze_grace_s * 1000,
               .idem_key = e->key[0] ? e->key : NULL};
  snprintf(o.status, sizeof(o.status), "UNPAID");
  order_t found_o;
  bool found = false;
  PGconn *pg = svc_pg_get(s->pool, 2000, err, sizeof(err));
  /* (load_order is false for "not there" too: then 'err' stays empty) */
  bool ok = pg && (load_order(pg, o.order_id, &found_o, &found, err, sizeof(err)) || !err[0]);
  if (pg) svc_pg_put(s->pool, pg);
  if (!ok) {
    SVC_LOG(SVC_LOG_WARN, json_pack("{s:I}", "order_id", (json_int_t)o.order_id),
            "queued order: could not look for it: %s (tried again)", err);
    return ORDER_QUEUE_LATER;
  }
  if (found) return ORDER_QUEUE_DONE;
  svc_resp_t r = {0};
  if (s->local_mode) {
    PGconn *lpg = svc_pg_get(s->pool, 5000, err, sizeof(err));
    if (!lpg) return ORDER_QUEUE_LATER;
    create_local(s, lpg, &o, e->deadline_ms, &r);
  } else {
    place_order(s, &o, e->deadline_ms, svc_now_us(), &r);
  }
  const char *why = json_string_value(json_object_get(r.body, "reason"));
  const char *error = json_string_value(json_object_get(r.body, "error"));
  order_queue_result_t res = ORDER_QUEUE_DONE;
  if (r.status == 503 && error && strcmp(error, "unknown_outcome") == 0) {
    res = ORDER_QUEUE_LATER; /* the freeze stays; the retry looks in the database first */
  } else if (r.status != 201) {
    SVC_LOG(SVC_LOG_INFO,
            json_pack("{s:I,s:I,s:i,s:s}", "order_id", (json_int_t)o.order_id, "user", (json_int_t)o.user, "status",
                      r.status, "reason", why ? why : error ? error : ""),
            "queued order not made: the buyer is told");
    buyer_event(s, "order.rejected", o.order_id, o.activity, o.ticket_type, o.bucket, o.user, o.qty,
                why ? why : "not_placed", "the buyer that a queued order was not made");
  }
  json_decref(r.body);
  return res;
}

/*
 * After a prefilter call that failed: when Redis had not loaded
 * 'activity' (svc_pf_last_code), ask stock-service, which owns the
 * activities, whether there is one (GET /activities/{id}).  None: 'resp'
 * is 404 unknown_activity and true is returned.  One (Redis lost it, or
 * never had it): the reconciliation loads it, and false (the caller
 * answers 503: a retry in a second finds it).  Stock-service away: false.
 */
static bool unknown_activity_or_reply(order_svc_t *s, long long activity, svc_resp_t *resp) {
  if (svc_pf_last_code() != RM_PF_NOT_LOADED) return false;
  char path[48], err[256];
  snprintf(path, sizeof(path), "/activities/%lld", activity);
  long status = 0;
  json_t *ans = NULL;
  int rc = svc_httpc_get(s->stock, path, s->stock_timeout_ms, &status, &ans, err, sizeof(err));
  json_decref(ans);
  if (rc == 0 && status == 404) {
    char detail[64];
    snprintf(detail, sizeof(detail), "there is no activity %lld", activity);
    svc_resp_error(resp, 404, "unknown_activity", detail);
    return true;
  }
  if (s->comp) rm_compensator_kick(s->comp, true); /* reconciliation loads the activity */
  return false;
}

/*
 * Steps 1 and 2 of a purchase for 'o' (a valid request), then the rest
 * (place_order, or create_local in ORDER_TX_MODE=local).  Fills 'resp'.
 * 't0' is when the request started.
 */
static void take_order(order_svc_t *s, order_t *o, int64_t t0, svc_resp_t *resp) {
  /* No database connection is held while waiting for Redis or the
   * coordinator: refusals never touch PostgreSQL (but see create_keyed),
   * and the pool can stay much smaller than the number of requests in
   * progress. */
  char err[512] = "", reason[64];
  o->order_id = next_order_id(s, err, sizeof(err));
  if (!o->order_id) {
    svc_warn("could not take an order: %s", err);
    svc_resp_error(resp, 503, "unavailable", err);
    return;
  }

  /* 2. prefilter: the freeze outlives the order by a grace period, so
   * that the order's own expiry (a global transaction over both
   * databases) normally comes first and the prefilter's sweep is only a
   * backstop. */
  int bucket = -1;
  o->expire_ms = txc_unix_ms() + s->ttl_s * 1000;
  int64_t deadline_ms = o->expire_ms + s->freeze_grace_s * 1000;
  pf_result_t pr = s->queued ? svc_pf_freeze_queued(s->pf, o->activity, o->ticket_type, o->user, o->qty, o->order_id,
                                                    deadline_ms, o->idem_key, &bucket, err, sizeof(err))
                             : svc_pf_freeze(s->pf, o->activity, o->ticket_type, o->user, o->qty, o->order_id,
                                             deadline_ms, &bucket, err, sizeof(err));
  if (pr != PF_OK) {
    if (pr == PF_ERROR) {
      if (unknown_activity_or_reply(s, o->activity, resp)) return;
      SVC_LOG(SVC_LOG_WARN, json_pack("{s:I}", "order_id", (json_int_t)o->order_id),
              "could not run the prefilter: %s", err);
      svc_resp_error(resp, 503, "unavailable", err);
    } else {
      svc_resp_json(resp, 409, svc_problem_rejected(svc_pf_reason(pr)));
    }
    return;
  }
  o->bucket = bucket;
  snprintf(o->status, sizeof(o->status), "UNPAID");

  if (s->queued) {
    /* the freeze script queued the order: the consumer creates it
     * (queue_place); the buyer has the answer now */
    order_queue_note(s->queue, o->activity);
    snprintf(o->status, sizeof(o->status), "QUEUED");
    svc_resp_json(resp, 202, buyer_json(s, o));
    return;
  }

  if (s->local_mode) {
    PGconn *lpg = svc_pg_get(s->pool, 5000, err, sizeof(err));
    if (!lpg) {
      svc_pf_release(s->pf, o->activity, o->ticket_type, o->order_id, reason, sizeof(reason));
      svc_resp_error(resp, 503, "unavailable", err);
      return;
    }
    create_local(s, lpg, o, deadline_ms, resp);
    return;
  }

  place_order(s, o, deadline_ms, t0, resp);
}

static void handle_create(order_svc_t *s, const svc_req_t *req, svc_resp_t *resp) {
  json_error_t je;
  json_t *in = json_loadb(req->body, req->body_len, JSON_REJECT_DUPLICATES, &je);
  order_t o = {.idem_key = svc_req_header(req, SVC_IDEM_HEADER)};
  const char *bad = NULL;
  if (!json_is_object(in))
    bad = in ? "the body must be a JSON object" : je.text;
  else if (!svc_json_int(in, "activity", 1, INT64_MAX, &o.activity))
    bad = "activity must be a positive integer";
  else if (!svc_json_int(in, "ticket_type", 0, INT32_MAX, &o.ticket_type))
    bad = "ticket_type must be an integer >= 0";
  else if (!svc_json_int(in, "user", 1, INT64_MAX, &o.user))
    bad = "user must be a positive integer";
  else if (!svc_json_int(in, "qty", 1, 100, &o.qty))
    bad = "qty must be an integer from 1 to 100";
  else if (o.idem_key && !svc_idem_key_ok(o.idem_key))
    bad = "the Idempotency-Key header must be 1 to 64 characters of A-Z, a-z, 0-9, '.', '_', ':' and '-'";
  if (bad) {
    svc_resp_error(resp, 400, "bad_request", bad);
    json_decref(in);
    return;
  }
  json_decref(in);
  int64_t t0 = svc_now_us();
  if (o.idem_key)
    create_keyed(s, &o, t0, take_order, resp);
  else
    take_order(s, &o, t0, resp);
}

/* 'n' fresh order ids into 'ids': false (logged, with 'what') if the
 * sequence cannot be read. */
static bool take_ids(order_svc_t *s, long long *ids, int n, const char *what) {
  char err[512];
  for (int i = 0; i < n; i++) {
    ids[i] = next_order_id(s, err, sizeof(err));
    if (!ids[i]) {
      svc_warn("could not %s: %s", what, err);
      return false;
    }
  }
  return true;
}

/* Place the orders of the waiting users 'served[0..n-1]' (frozen in Redis
 * by a fill) as any purchase; a placement that fails gives the freeze
 * back, as for any order.  Each user hears of it (buyer_event), those
 * the fill removed too.  Returns how many orders were placed. */
static int place_served(order_svc_t *s, long long activity, long long ticket_type, const svc_pf_served_t *served,
                        int n, int64_t expire_ms, int64_t deadline_ms) {
  int placed = 0;
  for (int i = 0; i < n; i++) {
    if (served[i].code != PF_OK) {
      /* removed from the waitlist (the limit no longer fits): no order,
       * so the notice is keyed by an order id of its own */
      long long id;
      if (served[i].user > 0 && served[i].qty > 0 && take_ids(s, &id, 1, "tell a removed waiting user"))
        buyer_event(s, "waitlist.refused", id, activity, ticket_type, -1, served[i].user, served[i].qty,
                    svc_pf_reason(served[i].code), "a waiting user");
      continue;
    }
    order_t o = {.order_id = served[i].order_id, .activity = activity, .ticket_type = ticket_type,
                 .user = served[i].user, .qty = served[i].qty, .bucket = served[i].bucket, .expire_ms = expire_ms};
    snprintf(o.status, sizeof(o.status), "UNPAID");
    svc_resp_t r = {0};
    place_order(s, &o, deadline_ms, svc_now_us(), &r);
    if (r.status == 201) placed++;
    SVC_LOG(r.status == 201 ? SVC_LOG_INFO : SVC_LOG_WARN,
            json_pack("{s:I,s:I,s:I,s:i}", "activity", (json_int_t)activity, "user", (json_int_t)o.user,
                      "order_id", (json_int_t)o.order_id, "status", r.status),
            r.status == 201 ? "waitlist: order placed" : "waitlist: could not place the order");
    const char *why = r.status == 201 ? NULL : json_string_value(json_object_get(r.body, "reason"));
    buyer_event(s, r.status == 201 ? "waitlist.ordered" : "waitlist.refused", o.order_id, activity, ticket_type,
                o.bucket, o.user, o.qty, r.status == 201 ? NULL : why ? why : "not_placed", "a waiting user");
    json_decref(r.body);
  }
  return placed;
}

/*
 * Stock came back in (activity, ticket type): freeze it in Redis for the
 * first users of the waitlist (rm_prefilter_waitlist_fill), then place
 * their orders as any other purchase (place_served: each user hears of it
 * as an event).
 */
static int serve_waitlist(order_svc_t *s, long long activity, long long ticket_type) {
  enum { BATCH = 8 };
  long long ids[BATCH];
  char err[512];
  if (!take_ids(s, ids, BATCH, "serve the waitlist")) return -1;
  int64_t expire_ms = txc_unix_ms() + s->ttl_s * 1000;
  int64_t deadline_ms = expire_ms + s->freeze_grace_s * 1000;
  svc_pf_served_t served[BATCH];
  int n = svc_pf_waitlist_fill(s->pf, activity, ticket_type, ids, BATCH, deadline_ms, served, BATCH, err,
                               sizeof(err));
  if (n < 0) {
    SVC_LOG(SVC_LOG_WARN, json_pack("{s:I}", "activity", (json_int_t)activity), "could not serve the waitlist: %s",
            err);
    return -1;
  }
  place_served(s, activity, ticket_type, served, n, expire_ms, deadline_ms);
  return n;
}

/* Ask the background thread to serve the waitlist of (activity, ticket
 * type): the cancel or expiry that gives the tickets back answers without
 * waiting for the orders placed for waiting users.  The tickets come back
 * when stock-service has consumed the event (PostgreSQL, then Redis), so
 * the thread tries a few times until Redis shows them (WAITLIST_TRIES
 * passes WAITLIST_RETRY_US apart). */
#define WAITLIST_TRIES 40
#define WAITLIST_RETRY_US 250000
static void queue_waitlist_at(order_svc_t *s, long long activity, long long ticket_type, int tries,
                              int64_t next_us) {
  pthread_mutex_lock(&s->bg_mu);
  int i = 0;
  while (i < s->nwl && !(s->wl[i].activity == activity && s->wl[i].ticket_type == ticket_type)) i++;
  if (i < s->nwl) {
    s->wl[i].tries = 0; /* more tickets came back: start over */
  } else if (s->nwl < (int)(sizeof(s->wl) / sizeof(s->wl[0]))) {
    s->wl[s->nwl].activity = activity;
    s->wl[s->nwl].ticket_type = ticket_type;
    s->wl[s->nwl].tries = tries;
    s->wl[s->nwl].next_us = next_us;
    s->nwl++;
  }
  pthread_cond_signal(&s->bg_cv);
  pthread_mutex_unlock(&s->bg_mu);
}

static void queue_waitlist(order_svc_t *s, long long activity, long long ticket_type) {
  queue_waitlist_at(s, activity, ticket_type, 0, svc_now_us() + WAITLIST_RETRY_US);
}

/*
 * Pay, cancel or expire order 'id': a local transaction of the orders
 * database that moves the order from UNPAID (checked under SELECT ... FOR
 * UPDATE, so two of them cannot both win; the expiry also checks that the
 * order is overdue, as the seed's consumer checks the order first) and
 * writes its event to the outbox (svc_outbox.h).  The stock follows when
 * stock-service consumes the event: the freeze is confirmed or released
 * once, in a local transaction of its own, and nothing ever rolls it back
 * (issue 17's released-ticket problem cannot arise).  No coordinator is
 * involved, so this works in local mode too.  A local-mode order whose
 * stock side is not decided yet (its compensation is pending) answers 503
 * not_ready: pay it a moment later.  Returns the HTTP status; 'resp' (may
 * be NULL for the expiry job) gets the answer.
 */
static int finish_order(order_svc_t *s, long long id, finish_kind_t kind, const svc_req_t *req, svc_resp_t *resp) {
  char err[512] = "", sid[24];
  snprintf(sid, sizeof(sid), "%lld", id);
  const char *p[1] = {sid};
  order_t o = {0};
  PGresult *r = NULL;
  PGconn *pg = svc_pg_get(s->pool, 2000, err, sizeof(err));
  if (!pg) goto unavailable;
  /* The BEGIN and the locking read in one round trip; the changes, the
   * event and the COMMIT in one more (svc_pg_pipeline). */
  const svc_pg_stmt_t lock[2] = {
    {"BEGIN", 0, NULL, PGRES_COMMAND_OK},
    {"SELECT o.order_id, o.activity_id, o.ticket_type, o.user_id, o.qty, o.bucket_id, o.status,"
     " o.xid, o.expire_at < now(), c.state FROM trade_order o"
     " LEFT JOIN order_compensation c ON c.order_id = o.order_id"
     " WHERE o.order_id = $1 FOR UPDATE OF o",
     1, p, PGRES_TUPLES_OK}};
  PGresult *lr[2] = {NULL, NULL};
  bool locked = svc_pg_pipeline(pg, lock, 2, lr, err, sizeof(err));
  PQclear(lr[0]);
  r = lr[1];
  if (!locked) goto fail;
  if (PQntuples(r) != 1) {
    PQclear(r);
    local_abort(pg);
    svc_pg_put(s->pool, pg);
    if (resp) svc_resp_error(resp, 404, "not_found", NULL);
    return 404;
  }
  o.order_id = atoll(PQgetvalue(r, 0, 0));
  o.activity = atoll(PQgetvalue(r, 0, 1));
  o.ticket_type = atoll(PQgetvalue(r, 0, 2));
  o.user = atoll(PQgetvalue(r, 0, 3));
  o.qty = atoll(PQgetvalue(r, 0, 4));
  o.bucket = atoll(PQgetvalue(r, 0, 5));
  snprintf(o.status, sizeof(o.status), "%s", PQgetvalue(r, 0, 6));
  snprintf(o.xid, sizeof(o.xid), "%s", PQgetisnull(r, 0, 7) ? "" : PQgetvalue(r, 0, 7));
  bool overdue = strcmp(PQgetvalue(r, 0, 8), "t") == 0;
  bool comp_pending = !PQgetisnull(r, 0, 9) && strcmp(PQgetvalue(r, 0, 9), "PENDING") == 0;
  PQclear(r);
  r = NULL;
  if (req && !buyer_ok(s, req, o.order_id, o.user, resp)) {
    local_abort(pg);
    svc_pg_put(s->pool, pg);
    return resp->status;
  }
  if (strcmp(o.status, "UNPAID") != 0 || (kind == FIN_EXPIRE && !overdue)) {
    local_abort(pg);
    svc_pg_put(s->pool, pg);
    if (resp) {
      char detail[64];
      snprintf(detail, sizeof(detail), "the order is %s, not UNPAID", o.status);
      svc_resp_error(resp, 409, "bad_state", detail);
      json_object_set_new(resp->body, "order_status", json_string(o.status));
    }
    return 409;
  }
  if (comp_pending && kind != FIN_EXPIRE) {
    /* taken in local mode, its stock not decided yet: the compensation
     * job decides it within seconds (an expiry waits for it too) */
    local_abort(pg);
    svc_pg_put(s->pool, pg);
    if (s->comp) rm_compensator_kick(s->comp, false);
    if (resp) svc_resp_error(resp, 503, "not_ready", "the order's stock is being confirmed; try again in a second");
    return 503;
  }
  if (comp_pending) {
    local_abort(pg);
    svc_pg_put(s->pool, pg);
    return 409;
  }
  const char *pu[2] = {sid, fin_status[kind]};
  json_t *payload = json_pack("{s:I,s:I,s:I,s:I,s:I}", "activity", (json_int_t)o.activity, "ticket_type",
                              (json_int_t)o.ticket_type, "bucket", (json_int_t)o.bucket, "user", (json_int_t)o.user,
                              "qty", (json_int_t)o.qty);
  /* A payment also writes the payment ledger (the demo's stand-in for the
   * provider's statement, which the daily reconciliation compares with
   * the orders: reconcile.h), with the order's amount; an order made
   * without one (local mode, before sql/orders/005) gets it now. */
  char sprice[24];
  snprintf(sprice, sizeof(sprice), "%lld", s->price_cents);
  const char *pp[2] = {sid, sprice};
  svc_outbox_row_t event;
  if (!svc_outbox_row(&event, fin_events[kind], o.order_id, payload, err, sizeof(err))) goto fail;
  const svc_pg_stmt_t change[3] = {
    kind == FIN_PAY
      ? (svc_pg_stmt_t){"WITH o AS (UPDATE trade_order SET status = 'PAID', updated_at = now(),"
                        " amount_cents = coalesce(amount_cents, qty * $2::bigint)"
                        " WHERE order_id = $1 RETURNING order_id, amount_cents)"
                        " INSERT INTO payment_ledger (order_id, amount_cents, provider_ref)"
                        " SELECT order_id, amount_cents, 'demo-pay:' || order_id FROM o",
                        2, pp, PGRES_COMMAND_OK}
      : (svc_pg_stmt_t){"UPDATE trade_order SET status = $2, updated_at = now() WHERE order_id = $1", 2, pu,
                        PGRES_COMMAND_OK},
    event.stmt,
    {"COMMIT", 0, NULL, PGRES_COMMAND_OK}};
  PGresult *cr[3] = {NULL, NULL, NULL};
  bool changed = svc_pg_pipeline(pg, change, 3, cr, err, sizeof(err));
  /* a COMMIT of an aborted transaction answers ROLLBACK */
  if (changed && strcmp(PQcmdStatus(cr[2]), "COMMIT") != 0) {
    snprintf(err, sizeof(err), "local commit failed: %s", PQcmdStatus(cr[2]));
    changed = false;
  }
  for (int i = 0; i < 3; i++) PQclear(cr[i]);
  svc_outbox_row_free(&event);
  if (!changed) goto fail;
  svc_pg_put(s->pool, pg);
  /* A service killed here leaves the event in the outbox: the relay of
   * any instance publishes it (the fault suite kills it here). */
  TXC_FAILPOINT("svc.order.fin.before_publish");
  svc_relay_kick(s->relay);
  snprintf(o.status, sizeof(o.status), "%s", fin_status[kind]);
  if (kind != FIN_PAY) queue_waitlist(s, o.activity, o.ticket_type);
  SVC_LOG(SVC_LOG_DEBUG, json_pack("{s:I}", "order_id", (json_int_t)id), "order %s", fin_names[kind]);
  if (resp) svc_resp_json(resp, 200, order_json(&o));
  return 200;

fail:
  if (r) PQclear(r);
  local_abort(pg);
  svc_pg_put(s->pool, pg);
unavailable:
  SVC_LOG(SVC_LOG_WARN, json_pack("{s:I}", "order_id", (json_int_t)id), "could not %s order: %s",
          fin_names[kind], err);
  if (resp) svc_resp_error(resp, 503, "unavailable", err);
  return 503;
}

static void handle_get(order_svc_t *s, long long id, const svc_req_t *req, svc_resp_t *resp) {
  char err[512] = "";
  order_t o = {0};
  bool found = false;
  PGconn *pg = svc_pg_get(s->pool, 2000, err, sizeof(err));
  if (pg) {
    load_order(pg, id, &o, &found, err, sizeof(err));
    svc_pg_put(s->pool, pg);
  }
  if (found && !buyer_ok(s, req, o.order_id, o.user, resp))
    return;
  if (found)
    svc_resp_json(resp, 200, order_json(&o));
  else if (!err[0])
    svc_resp_error(resp, 404, "not_found", NULL);
  else
    svc_resp_error(resp, 503, "unavailable", err);
}

/*
 * POST /activities/{id}/tickets {ticket_type, qty, key, operator?, at_ms?}
 * (admin credentials, svc_admin_check): more tickets for a sale.
 *   1. stock-service adds them in PostgreSQL, once per key (POST /tickets,
 *      stock_add of sql/stock/007), and answers each bucket's stock;
 *   2. the prefilter raises Redis to those stocks and serves the waitlist
 *      from the new tickets first, in one script (rm_prefilter_stock_add):
 *      no other buyer can take them in between;
 *   3. the served users' orders are placed as any purchase; waiting users
 *      beyond the first SVC_PF_FILL_MAX go to the background thread's
 *      waitlist pass.
 * A repeat with the same key adds nothing and does steps 2 and 3 again
 * (the raise is idempotent), which also finishes an addition whose answer
 * was lost after step 1.  A step 2 that failed leaves the new tickets in
 * PostgreSQL only, unsold until the repeat or the prefilter's
 * reconciliation copies them.  200 {result, activity, ticket_type, qty,
 * buckets, waitlist_served, orders_placed, redis} | 400 | 401 | 403 | 404
 * no_buckets | 409 key_reused | sale_ended | at_mode | 503.
 */
static void handle_tickets(order_svc_t *s, long long activity, const svc_req_t *req, svc_resp_t *resp) {
  const char *who = svc_admin_check(s->admin, req, resp, "tickets");
  if (!who) return;
  json_error_t je;
  json_t *in = json_loadb(req->body, req->body_len, JSON_REJECT_DUPLICATES, &je);
  svc_tickets_t t;
  const char *bad = in ? svc_tickets_parse(in, false, &t) : je.text;
  if (bad) {
    json_decref(in);
    svc_resp_error(resp, 400, "bad_request", bad);
    return;
  }
  long long tt = t.ticket_type, qty = t.qty;
  const char *key = t.key, *op = t.op;
  json_t *body = json_pack("{s:I,s:I,s:I,s:s}", "activity", (json_int_t)activity, "ticket_type", (json_int_t)tt,
                           "qty", (json_int_t)qty, "key", key);
  if (op) json_object_set_new(body, "operator", json_string(op));
  char reason[64], err[512] = "";
  svc_httpc_call_t *call = svc_httpc_start(s->stock, "/tickets", NULL, body, s->stock_timeout_ms, err, sizeof(err));
  json_decref(body);
  json_t *ans = NULL;
  long status = 0;
  if (!call || svc_httpc_finish(call, &status, &ans, err, sizeof(err)) != 0) status = 0;
  if (status != 200) {
    const char *e = json_string_value(json_object_get(ans, "error"));
    const char *d = json_string_value(json_object_get(ans, "detail"));
    snprintf(reason, sizeof(reason), "%s", e ? e : "unavailable");
    if (status == 404 || status == 409 || status == 400)
      svc_resp_error(resp, (int)status, reason, d);
    else
      svc_resp_error(resp, 503, "unavailable", d ? d : err);
    SVC_LOG(SVC_LOG_WARN, json_pack("{s:I,s:s,s:I}", "activity", (json_int_t)activity, "key", key, "status",
                                    (json_int_t)status),
            "could not add tickets: %s", d ? d : err);
    json_decref(ans);
    json_decref(in);
    return;
  }
  json_t *buckets = json_object_get(ans, "buckets");
  size_t nb = json_array_size(buckets);
  int64_t *stock = calloc(nb ? nb : 1, sizeof(*stock));
  bool shape = stock && nb > 0;
  for (size_t i = 0; shape && i < nb; i++) {
    long long b = -1, v = -1;
    json_t *e = json_array_get(buckets, i);
    if (!svc_json_int(e, "bucket", 0, (long long)nb - 1, &b) || !svc_json_int(e, "stock", 0, INT32_MAX, &v))
      shape = false;
    else
      stock[b] = v;
  }
  long long ids[SVC_PF_FILL_MAX];
  svc_pf_served_t served[SVC_PF_FILL_MAX];
  int64_t expire_ms = txc_unix_ms() + s->ttl_s * 1000;
  int64_t deadline_ms = expire_ms + s->freeze_grace_s * 1000;
  int n = -1, placed = 0;
  const char *redis = "raised";
  if (!shape) {
    snprintf(err, sizeof(err), "stock-service answered buckets that are not 0 .. n-1 with their stock");
    redis = "failed";
  } else if (!take_ids(s, ids, SVC_PF_FILL_MAX, "serve the waitlist")) {
    snprintf(err, sizeof(err), "no order ids");
    redis = "failed";
  } else {
    n = svc_pf_stock_add(s->pf, activity, tt, stock, nb, ids, SVC_PF_FILL_MAX, deadline_ms, served,
                         SVC_PF_FILL_MAX, err, sizeof(err));
    if (n == -2) redis = "not_loaded";
    if (n == -1) redis = "failed";
  }
  free(stock);
  int nserved = 0;
  for (int i = 0; i < n; i++) nserved += served[i].code == PF_OK;
  if (n > 0) placed = place_served(s, activity, tt, served, n, expire_ms, deadline_ms);
  /* more waiting users than one step serves: the background pass goes on */
  if (n == SVC_PF_FILL_MAX) queue_waitlist(s, activity, tt);
  const char *result = json_string_value(json_object_get(ans, "result"));
  SVC_LOG(n == -1 ? SVC_LOG_WARN : SVC_LOG_INFO,
          json_pack("{s:s,s:I,s:I,s:I,s:s,s:s,s:s,s:i,s:i}", "admin", "tickets", "activity", (json_int_t)activity,
                    "ticket_type", (json_int_t)tt, "qty", (json_int_t)qty, "key", key, "who", who, "operator",
                    op ? op : "", "waitlist_served", nserved, "orders_placed", placed),
          n == -1 ? "tickets added in PostgreSQL; Redis not raised: %s (repeat the call with the same key)"
                  : "tickets added%s", n == -1 ? err : "");
  svc_resp_json(resp, 200,
                json_pack("{s:s,s:I,s:I,s:I,s:O,s:i,s:i,s:s}", "result", result ? result : "added", "activity",
                          (json_int_t)activity, "ticket_type", (json_int_t)tt, "qty", (json_int_t)qty, "buckets",
                          buckets, "waitlist_served", nserved, "orders_placed", placed, "redis", redis));
  json_decref(ans);
  json_decref(in);
}

static void handle_waitlist(order_svc_t *s, long long activity, const svc_req_t *req, svc_resp_t *resp) {
  json_error_t je;
  json_t *in = json_loadb(req->body, req->body_len, JSON_REJECT_DUPLICATES, &je);
  long long user = 0, tt = 0, qty = 1;
  const char *bad = NULL;
  if (!json_is_object(in))
    bad = in ? "the body must be a JSON object" : je.text;
  else if (!svc_json_int(in, "user", 1, INT64_MAX, &user))
    bad = "user must be a positive integer";
  else if (json_object_get(in, "ticket_type") && !svc_json_int(in, "ticket_type", 0, INT32_MAX, &tt))
    bad = "ticket_type must be an integer >= 0";
  else if (json_object_get(in, "qty") && !svc_json_int(in, "qty", 1, 100, &qty))
    bad = "qty must be an integer from 1 to 100";
  json_decref(in);
  if (bad) {
    svc_resp_error(resp, 400, "bad_request", bad);
    return;
  }
  char err[256];
  long long pos = 0;
  pf_result_t pr = svc_pf_waitlist(s->pf, activity, tt, user, qty, &pos, err, sizeof(err));
  if (pr == PF_OK)
    svc_resp_json(resp, 202, json_pack("{s:I,s:I,s:I}", "activity", (json_int_t)activity, "user",
                                       (json_int_t)user, "position", (json_int_t)pos));
  else if (pr == PF_ERROR && !unknown_activity_or_reply(s, activity, resp))
    svc_resp_error(resp, 503, "unavailable", err);
  else if (pr != PF_ERROR)
    svc_resp_json(resp, 409, svc_problem_rejected(svc_pf_reason(pr)));
}

/* The routes of order-service (svc_http.h): examples/openapi/order-service.yaml
 * describes each; `order-service --routes` prints them for its check. */
enum { OP_CREATE, OP_GET, OP_PAY, OP_CANCEL, OP_TICKETS, OP_WAITLIST, OP_HEALTHZ, OP_METRICS, OP_ADMIN };
static const svc_route_t routes[] = {
  {"POST", "/orders", OP_CREATE},
  {"GET", "/orders/{id}", OP_GET},
  {"POST", "/orders/{id}/pay", OP_PAY},
  {"POST", "/orders/{id}/cancel", OP_CANCEL},
  {"POST", "/activities/{id}/tickets", OP_TICKETS},
  {"POST", "/activities/{id}/waitlist", OP_WAITLIST},
  {"GET", "/healthz", OP_HEALTHZ},
  {"GET", "/metrics", OP_METRICS},
  {"GET", "/admin/mode", OP_ADMIN},
  {"POST", "/admin/mode", OP_ADMIN},
};
#define NROUTES (sizeof(routes) / sizeof(routes[0]))

/* POST /orders: a 201 says where its order is (Location), whichever path
 * made it (a purchase, a replay of its key). */
static void handle_create_located(order_svc_t *s, const svc_req_t *req, svc_resp_t *resp) {
  handle_create(s, req, resp);
  json_int_t id = json_integer_value(json_object_get(resp->body, "order_id"));
  if (resp->status == 201 && id > 0) {
    char loc[40];
    snprintf(loc, sizeof(loc), "/orders/%lld", (long long)id);
    svc_resp_header_copy(resp, "Location", loc);
  }
}

static void handler(const svc_req_t *req, svc_resp_t *resp, void *arg) {
  order_svc_t *s = arg;
  int op;
  long long id;
  if (!svc_route_or_reply(routes, NROUTES, req, resp, &op, &id)) return;
  switch (op) {
  case OP_CREATE: handle_create_located(s, req, resp); break;
  case OP_GET: handle_get(s, id, req, resp); break;
  case OP_PAY:
  case OP_CANCEL:
    if (s->local_mode)
      svc_resp_error(resp, 501, "not_implemented", "pay and cancel need the coordinator (ORDER_TX_MODE=global)");
    else
      finish_order(s, id, op == OP_PAY ? FIN_PAY : FIN_CANCEL, req, resp);
    break;
  case OP_TICKETS: handle_tickets(s, id, req, resp); break;
  case OP_WAITLIST: handle_waitlist(s, id, req, resp); break;
  case OP_HEALTHZ:
    svc_resp_json(resp, 200, json_pack("{s:b,s:i,s:s}", "ok", 1, "tc_nodes_up", rm_client_nodes_up(s->rm), "mode",
                                       rm_mode_name(rm_client_mode(s->rm))));
    break;
  case OP_METRICS: handle_metrics(s, resp); break;
  default: svc_admin_handle(s->admin, req, resp); break; /* the runtime mode switch */
  }
}

/* -------------------------------------------------------------- expiry */

/* One pass: expire up to 100 overdue orders.  Returns how many were. */
static int expire_pass(order_svc_t *s) {
  char err[512];
  PGconn *pg = svc_pg_get(s->pool, 2000, err, sizeof(err));
  if (!pg) {
    svc_warn("could not look for expired orders: %s", err);
    return 0;
  }
  PGresult *r = NULL;
  bool ok = svc_pg_exec(pg,
                        "SELECT order_id FROM trade_order WHERE status = 'UNPAID' AND expire_at < now()"
                        " ORDER BY expire_at LIMIT 100",
                        0, NULL, PGRES_TUPLES_OK, &r, err, sizeof(err));
  svc_pg_put(s->pool, pg);
  if (!ok) {
    svc_warn("could not look for expired orders: %s", err);
    return 0;
  }
  int n = 0;
  for (int i = 0; i < PQntuples(r); i++) {
    pthread_mutex_lock(&s->bg_mu);
    bool stop = s->stopping;
    pthread_mutex_unlock(&s->bg_mu);
    if (stop) break;
    if (finish_order(s, atoll(PQgetvalue(r, i, 0)), FIN_EXPIRE, NULL, NULL) == 200) n++;
  }
  PQclear(r);
  if (n) svc_info("expired %d unpaid orders", n);
  return n;
}

static void *background_main(void *arg) {
  order_svc_t *s = arg;
  int64_t interval_us = s->expiry_interval_ms * 1000;
  int64_t next_expiry = svc_now_us() + interval_us;
  pthread_mutex_lock(&s->bg_mu);
  while (!s->stopping) {
    int64_t now = svc_now_us(), next_wl = INT64_MAX;
    int due = -1;
    for (int i = 0; i < s->nwl; i++) {
      if (s->wl[i].next_us <= now && due < 0) due = i;
      if (s->wl[i].next_us < next_wl) next_wl = s->wl[i].next_us;
    }
    if (due >= 0) {
      long long activity = s->wl[due].activity, tt = s->wl[due].ticket_type;
      int tries = s->wl[due].tries;
      s->wl[due] = s->wl[--s->nwl];
      pthread_mutex_unlock(&s->bg_mu);
      int n = serve_waitlist(s, activity, tt);
      if (n == 0 && tries + 1 < WAITLIST_TRIES)
        queue_waitlist_at(s, activity, tt, tries + 1, svc_now_us() + WAITLIST_RETRY_US);
      pthread_mutex_lock(&s->bg_mu);
      continue;
    }
    if (interval_us > 0 && now >= next_expiry) {
      pthread_mutex_unlock(&s->bg_mu);
      expire_pass(s);
      pthread_mutex_lock(&s->bg_mu);
      next_expiry = svc_now_us() + interval_us;
      continue;
    }
    /* Sleep until the next expiry pass or waitlist try, or until woken
     * by work or the stop signal. */
    if (interval_us > 0 || next_wl != INT64_MAX) {
      struct timespec until;
      int64_t wake = interval_us > 0 && next_expiry < next_wl ? next_expiry : next_wl;
      svc_deadline_in(&until, wake - now);
      pthread_cond_timedwait(&s->bg_cv, &s->bg_mu, &until);
    } else {
      pthread_cond_wait(&s->bg_cv, &s->bg_mu);
    }
  }
  pthread_mutex_unlock(&s->bg_mu);
  return NULL;
}

/* ---------------------------------------------------------------- main */

/* Fallback to local: detection on, and the operator's forced mode
 * (RM_MODE_ENV) if any.  0 or a code (logged). */
static int start_degrade(order_svc_t *s, int forced_mode) {
  int rc = rm_client_degrade_enable(s->rm, NULL);
  if (rc == 0 && forced_mode > 0) rc = rm_client_force_mode(s->rm, forced_mode);
  if (rc != 0) svc_error("could not set up the fallback to local mode: %s", rm_strerror(rc));
  return rc;
}

/* The compensation job of local-mode orders (and Redis reconciliation).
 * Needs STOCK_PG_URL; without it local orders wait for another instance's
 * job or txc-compensate (logged). */
static void start_compensator(order_svc_t *s, const char *orders_url) {
  const char *stock_pg = svc_env_str("STOCK_PG_URL", NULL);
  if (!stock_pg) {
    svc_warn("STOCK_PG_URL is not set: no compensation job for local-mode orders in this instance");
    return;
  }
  rm_compensator_options_t ko = {.orders_conninfo = orders_url, .stock_conninfo = stock_pg,
                                 .pf = svc_pf_handle(s->pf),
                                 .run = {.log_cb = svc_rm_log_cb, .log_level = svc_log_level + 1}};
  int rc = rm_compensator_start(&ko, &s->comp);
  if (rc != 0) {
    svc_warn("could not start the compensation job: %s", rm_strerror(rc));
    s->comp = NULL;
  }
}



static void usage(FILE *f) {
  fprintf(f,
          "usage: order-service [--listen HOST:PORT] [--url-file FILE] | --routes\n"
          "\n"
          "The order entry point and TM of the flash-sale demo (see examples/order_service.c).\n"
          "Environment: ORDERS_PG_URL, TC_NODES, TC_SECRETS_DIR or TC_SECRET_FILE, REDIS_URL, STOCK_URL (from\n"
          "cluster/local/up), ORDER_LISTEN, ORDER_THREADS, ORDER_PG_POOL, ORDER_RESOURCE_ID,\n"
          "ORDER_GTX_TIMEOUT_MS, STOCK_CALL_TIMEOUT_MS, ORDER_TTL_S, ORDER_FREEZE_GRACE_S,\n"
          "ORDER_EXPIRY_INTERVAL_MS, PF_COMMAND_TIMEOUT_MS, PF_CONNECT_TIMEOUT_MS, ORDER_LOG_LEVEL,\n"
          "OUTBOX_STREAM_MAXLEN, OUTBOX_RETENTION_S, OUTBOX_LINGER_MS, ORDER_IDEMPOTENCY_TTL_S, ORDER_TICKET_PRICE_CENTS,\n"
          "ORDER_RECONCILE_AT, ORDER_RECONCILE_INTERVAL_S, ORDER_RECONCILE_SETTLE_S,\n"
          "TXC_AT_WRITES (sql|calls: plain SQL or the structured AT calls), ORDER_TX_MODE (global|local:\n"
          "benchmarks only), ORDER_MODE (sync|queued: the first seed's queued order path), ORDER_QUEUE_THREADS.\n"
          "--routes prints the routes it serves (METHOD PATH), as examples/openapi/order-service.yaml describes them.\n");
}

int main(int argc, char **argv) {
  svc_main_t m;
  int early = svc_main_start(&m, "order-service", "ORDER", argc, argv, routes, NROUTES, usage);
  if (early >= 0) return early;
  bool ok = true;
  order_svc_t s = {.resource = svc_env_str("ORDER_RESOURCE_ID", "orders")};
  int threads = (int)svc_env_int("ORDER_THREADS", 32LL * svc_ncpu(), 1, 4096, &ok);
  int pool_size = (int)svc_env_int("ORDER_PG_POOL", svc_pg_pool_default(), 1, 1024, &ok);
  s.gtx_timeout_ms = (unsigned)svc_env_int("ORDER_GTX_TIMEOUT_MS", 10000, 100, 600000, &ok);
  s.stock_timeout_ms = (unsigned)svc_env_int("STOCK_CALL_TIMEOUT_MS", 5000, 50, 600000, &ok);
  s.ttl_s = svc_env_int("ORDER_TTL_S", 900, 1, 86400LL * 365, &ok);
  s.freeze_grace_s = svc_env_int("ORDER_FREEZE_GRACE_S", 60, 0, 86400, &ok);
  s.slow_us = svc_env_int("ORDER_SLOW_MS", 1000, 0, 3600000, &ok) * 1000;
  s.idem_ttl_s = (unsigned)svc_env_int("ORDER_IDEMPOTENCY_TTL_S", 86400, 1, 86400LL * 365, &ok);
  s.expiry_interval_ms = svc_env_int("ORDER_EXPIRY_INTERVAL_MS", 1000, 0, 3600000, &ok);
  s.price_cents = svc_env_int("ORDER_TICKET_PRICE_CENTS", 9900, 0, 100000000, &ok);
  s.at_sql = svc_at_writes_sql(&ok);
  s.queued = svc_env_either("ORDER_MODE", "sync", "queued", &ok);
  unsigned queue_threads = (unsigned)svc_env_int("ORDER_QUEUE_THREADS", 32LL * svc_ncpu(), 1, 256, &ok);
  s.local_mode = svc_env_either("ORDER_TX_MODE", "global", "local", &ok);
  int forced_mode = rm_mode_parse(getenv(RM_MODE_ENV));
  if (forced_mode < 0) {
    svc_error("invalid value \"%s\" for " RM_MODE_ENV ": expected auto, global or local", getenv(RM_MODE_ENV));
    ok = false;
  }
  const char *pg_url = svc_env_str("ORDERS_PG_URL", NULL);
  const char *stock_url = svc_env_str("STOCK_URL", NULL);
  const char *redis_url = svc_redis_env_url(); /* REDIS_SENTINELS + REDIS_MASTER_NAME, else REDIS_URL */
  if (!pg_url || !stock_url || !redis_url) {
    svc_error("ORDERS_PG_URL, STOCK_URL and REDIS_URL must be set (cluster/local/up prints them)");
    ok = false;
  }
  if (!ok) return 78;

  svc_block_signals();
  if (!svc_http_global_init()) {
    svc_error("could not initialise libcurl");
    return 70;
  }
  pthread_mutex_init(&s.id_mu, NULL);
  pthread_mutex_init(&s.bg_mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&s.bg_cv, &ca);
  pthread_condattr_destroy(&ca);

  int exit_code = 0;
  svc_http_t *http = NULL;
  char err[512];
  if (svc_rm_client_new("order-service", 5000, &s.rm) != 0) {
    exit_code = 69;
    goto out;
  }
  int rc = rm_resource_add(s.rm, s.resource, pg_url);
  if (rc != 0) {
    svc_error("could not add resource \"%s\": %s", s.resource, rm_strerror(rc));
    exit_code = 69;
    goto out;
  }
  if ((rc = start_degrade(&s, forced_mode)) != 0) {
    exit_code = 69;
    goto out;
  }
  s.pool = svc_pgpool_new(pg_url, pool_size, "order-service");
  s.stock = svc_httpc_new(stock_url);
  if (!svc_service_key(&s.auth)) {
    exit_code = 78;
    goto out;
  }
  if (s.stock) svc_httpc_set_auth(s.stock, s.auth);
  if (!(s.admin = svc_admin_new(s.rm, s.auth))) {
    exit_code = 78;
    goto out;
  }
  if (!s.pool || !s.stock) {
    svc_error("out of memory");
    exit_code = 70;
    goto out;
  }
  s.pf = svc_pf_new(redis_url, (unsigned)(threads < 256 ? threads : 256), err, sizeof(err));
  if (!s.pf) {
    svc_error("could not set up the prefilter: %s", err);
    exit_code = 69;
    goto out;
  }
  {
    bool tok = true;
    unsigned cmd_ms = (unsigned)svc_env_int("PF_COMMAND_TIMEOUT_MS", 500, 1, 60000, &tok);
    unsigned conn_ms = (unsigned)svc_env_int("PF_CONNECT_TIMEOUT_MS", 1000, 1, 60000, &tok);
    s.idem = svc_idem_new(redis_url, cmd_ms, conn_ms, err, sizeof(err));
    if (!s.idem)
      svc_warn("idempotency keys are checked in PostgreSQL only, without the Redis fast path: %s", err);
  }
  start_compensator(&s, pg_url);
  if (!s.local_mode) {
    s.recon = order_recon_start(pg_url, &ok);
    if (!ok) {
      exit_code = 78;
      goto out;
    }
  }
  if (!s.local_mode) {
    svc_relay_opts_t ro = {.pg_url = pg_url, .redis_url = redis_url,
                           .maxlen = svc_env_int("OUTBOX_STREAM_MAXLEN", 1000000, 1000, INT64_MAX / 2, &ok),
                           .retention_s = svc_env_int("OUTBOX_RETENTION_S", 7 * 86400, 60, 86400LL * 3650, &ok),
                           .linger_ms = (unsigned)svc_env_int("OUTBOX_LINGER_MS", 100, 0, 1000, &ok),
                           .auth = s.auth};
    if (!ok || !(s.relay = svc_relay_start(&ro, err, sizeof(err)))) {
      svc_error("could not start the outbox relay: %s", ok ? err : "invalid OUTBOX_* setting");
      exit_code = ok ? 71 : 78;
      goto out;
    }
  }
  if (s.queued && !(s.queue = order_queue_start(redis_url, queue_threads, queue_place, &s, err, sizeof(err)))) {
    svc_error("could not start the order queue's consumer: %s", err);
    exit_code = 71;
    goto out;
  }
  /* (local mode places orders with plain SQL: nothing to rehearse) */
  svc_pgpool_prewarm(s.pool, pool_size, s.local_mode ? NULL : warm_connection, &s);
  if (s.pf) {
    /* The prefilter's Redis connections too: the first burst of a sale
     * would otherwise open one per concurrent purchase on its way (each a
     * connect and a SCRIPT LOAD round), on the critical path. */
    unsigned opened = 0;
    int prc = rm_prefilter_prewarm(svc_pf_handle(s.pf), (unsigned)(threads < 256 ? threads : 256), &opened);
    if (prc != 0)
      svc_warn("could not open the prefilter's Redis connections ahead (%u opened): %s; purchases open them as "
               "they come", opened, rm_prefilter_strerror(prc));
  }
  http = svc_http_start(m.listen, (unsigned)svc_ncpu(), (unsigned)threads, handler, &s, err, sizeof(err));
  if (!http) {
    svc_error("%s", err);
    exit_code = 69;
    goto out;
  }
  if (!s.local_mode) {
    if (pthread_create(&s.bg_thread, NULL, background_main, &s) != 0) {
      svc_error("could not start the background thread");
      exit_code = 71;
      goto out;
    }
    s.bg_started = true;
  }
  exit_code = svc_main_serve(&m, http,
                             json_pack("{s:i,s:s,s:s,s:s,s:s}", "threads", threads, "resource", s.resource,
                                       "stock_url", stock_url, "tx_mode", s.local_mode ? "local" : "global",
                                       "order_mode", s.queued ? "queued" : "sync"));

out:
  svc_http_stop(http);
  if (s.bg_started) {
    pthread_mutex_lock(&s.bg_mu);
    s.stopping = true;
    pthread_cond_signal(&s.bg_cv);
    pthread_mutex_unlock(&s.bg_mu);
    pthread_join(s.bg_thread, NULL);
  }
  order_queue_stop(s.queue); /* after the HTTP server: nothing queues any more */
  order_recon_stop(s.recon);
  svc_relay_stop(s.relay);
  svc_idem_free(s.idem);
  rm_compensator_stop(s.comp); /* before the prefilter it borrows */
  svc_pf_free(s.pf);
  svc_httpc_free(s.stock);
  svc_admin_free(s.admin);
  svc_auth_free(s.auth);
  svc_pgpool_free(s.pool);
  rm_client_free(s.rm);
  svc_http_global_cleanup();
  pthread_mutex_destroy(&s.id_mu);
  pthread_mutex_destroy(&s.bg_mu);
  pthread_cond_destroy(&s.bg_cv);
  if (exit_code == 0) svc_info("order-service stopped");
  return exit_code;
}
