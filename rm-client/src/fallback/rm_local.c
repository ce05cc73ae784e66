/*
 * rm_local.c - local-mode orders: what the services call instead of a
 * global transaction when no coordinator answers (rm_client_mode() ==
 * RM_MODE_LOCAL).
 *
 * NOTES
 *   An order in local mode touches three stores, none of them inside a
 *   global transaction:
 *     1. Redis (the caller's rm_prefilter_freeze): the stock gate;
 *     2. the orders database: rm_local_order_insert writes the order (with
 *        the client's idempotency key, if any: unique per user) and
 *        its order_compensation row (PENDING) in one local transaction;
 *     3. the stock database: rm_local_stock_freeze writes its
 *        stock_compensation row and the guarded freeze in one local
 *        transaction.  The row's primary key decides the stock side once
 *        per order: FROZEN or REFUSED, whoever asks first (stock-service,
 *        or the compensation job when stock-service never did).
 *   Then the order is finished by the decision: rm_local_order_finish
 *   (frozen: the order stands) or rm_local_order_cancel (refused: the
 *   Redis freeze is released, the order cancelled with a reason for the
 *   user).  If the caller never gets there (a lost answer, a crash), the
 *   compensation job (rm_compensate.c) does exactly the same later.
 *
 *   Why this is safe without a coordinator:
 *     - oversell is impossible in PostgreSQL: the freeze is the guarded
 *       UPDATE of stock_freeze_apply (and the table's CHECK), whatever
 *       Redis let through;
 *     - the decision is taken once, durably, before anything depends on
 *       it: an order is cancelled only after the stock database recorded
 *       its refusal, and a refusal can never turn into a freeze later;
 *     - every call is idempotent by order id, so a retry, or the job
 *       running while the service finishes the same order, is harmless.
 *
 *   The logic lives in the SQL functions (sql/orders/002, sql/stock/003):
 *   each call here is one statement, so it runs in the caller's open
 *   transaction, or alone (autocommit) when none is open.
 *
 *   Threads: each call uses the caller's PGconn only (one thread at a time,
 *   as libpq requires).  A success is counted in the client the caller
 *   names (rm_client_local_stats; atomics in the client, rm_internal.h),
 *   never in the process: two clients count apart, and the compensation
 *   job, which names none, has its own figures (rm_comp_report_t).  Error
 *   details go to the library's one per-thread last-error slot
 *   (rm_local_errmsg reads it, as rm_errmsg does; like errno: these calls
 *   block on the caller's thread and take no object of their own to keep
 *   it in).
 */
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "rm_internal.h"
#include "rm_local.h"
#include "rm_prefilter_conn.h"
#include "rm_prefilter_pg.h"
#include "rm_prefilter_keys.h"

#define DEFAULT_TTL_MS (15 * 60 * 1000) /* trade_order's default expiry */

/* One more success 'field' (rm_local_counters_t) for client 'c'; NULL
 * counts nowhere. */
#define COUNT(c, field)                                   \
  do {                                                    \
    rm_local_counters_t *k_ = rm__local_counters(c);      \
    if (k_) atomic_fetch_add(&k_->field, 1);              \
  } while (0)

/* ---------------------------------------------------------- libpq glue --- */

/* A function returning one integer; RM_E_DB when it failed. */
static int call_code(PGconn *pg, const char *what, const char *sql, int n, const char *const *vals,
                     int64_t *code) {
  PGresult *res = rm__pf_pg_exec(pg, what, sql, n, vals);
  if (!res) return RM_E_DB;
  int rc = 0;
  const char *v = PQntuples(res) == 1 && PQnfields(res) == 1 && !PQgetisnull(res, 0, 0) ? PQgetvalue(res, 0, 0) : NULL;
  if (!v || rm__pf_parse_i64(v, strlen(v), code) != 0) {
    rm__errmsg_set("could not %s: unexpected answer from the database", what);
    rc = RM_E_DB;
  }
  PQclear(res);
  return rc;
}

static int64_t unix_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* An idempotency key: NULL, or 1..64 bytes of [A-Za-z0-9._:-] (the CHECK
 * of trade_order.idem_key). */
static bool idem_key_ok(const char *k) {
  if (!k) return true;
  size_t n = 0;
  for (; k[n]; n++) {
    char ch = k[n];
    bool ok = (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '.' ||
              ch == '_' || ch == ':' || ch == '-';
    if (!ok || n >= 64) return false;
  }
  return n > 0;
}

static bool order_ok(const rm_local_order_t *o) {
  return o && rm__pf_id_ok(o->order_id) && rm__pf_id_ok(o->activity_id) && rm__pf_tt_ok(o->ticket_type) &&
         o->bucket >= 0 && rm__pf_id_ok(o->user_id) && rm__pf_qty_ok(o->qty) && rm__pf_ms_ok(o->expire_ms) &&
         rm__pf_ms_ok(o->deadline_ms) && idem_key_ok(o->idem_key);
}

/* ------------------------------------------------------------- orders --- */

int rm_local_order_insert(rm_client_t *c, PGconn *orders_pg, const rm_local_order_t *o) {
  char s[8][24];
  const char *vals[9];
  int64_t code;
  int rc = rm__pf_pg_usable(orders_pg, false);
  if (rc != 0) return rc;
  if (!order_ok(o)) {
    rm__errmsg_set("invalid argument: local order out of range (or a malformed idempotency key)");
    return RM_E_INVALID;
  }
  rm__pf_i64_str(s[0], o->order_id);
  rm__pf_i64_str(s[1], o->activity_id);
  rm__pf_i64_str(s[2], o->ticket_type);
  rm__pf_i64_str(s[3], o->user_id);
  rm__pf_i64_str(s[4], o->qty);
  rm__pf_i64_str(s[5], o->bucket);
  rm__pf_i64_str(s[6], o->expire_ms);
  rm__pf_i64_str(s[7], o->deadline_ms);
  for (int i = 0; i < 8; i++) vals[i] = s[i];
  /* 0 ms = NULL: the SQL function's default. */
  if (!o->expire_ms) vals[6] = NULL;
  if (!o->deadline_ms) vals[7] = NULL;
  vals[8] = o->idem_key; /* NULL = none */
  rc = call_code(orders_pg, "record the local-mode order",
                 "SELECT order_local_insert($1::bigint, $2::bigint, $3::integer, $4::bigint, $5::integer, "
                 "$6::integer, timestamptz 'epoch' + $7::bigint * interval '1 millisecond', "
                 "timestamptz 'epoch' + $8::bigint * interval '1 millisecond', $9::text)",
                 9, vals, &code);
  if (rc != 0) return rc;
  switch (code) {
  case 0: COUNT(c, orders); return 0;
  case 1: return 1;
  case -4:
    rm__errmsg_set("order %" PRId64 " exists with other values (or as an order of a global transaction)",
                   o->order_id);
    return RM_LOCAL_E_MISMATCH;
  case -9:
    rm__errmsg_set("another order of user %" PRId64 " holds idempotency key \"%s\"", o->user_id, o->idem_key);
    return RM_LOCAL_E_IDEM_KEY;
  default:
    rm__errmsg_set("unexpected code %" PRId64 " from order_local_insert", code);
    return RM_E_DB;
  }
}

/* order_local_finish: the order DONE, its stock frozen, or cancelled
 * ('vals': the order id, the outcome and, for a cancel, the job's and the
 * user's reasons).  0 (now; counted in 'c'), 1 (so before), or why not:
 * decided the other way before (RM_LOCAL_E_DECIDED), paid although its
 * stock was refused (RM_LOCAL_E_PAID, a cancel), no such order
 * (RM_PF_UNKNOWN_ORDER). */
static int finish_order(rm_client_t *c, PGconn *pg, int64_t order_id, bool cancel, const char *const vals[4]) {
  int64_t code;
  int rc = call_code(pg, cancel ? "cancel the local-mode order" : "finish the local-mode order",
                     "SELECT order_local_finish($1::bigint, $2::text, $3::text, $4::text)", 4, vals, &code);
  if (rc != 0) return rc;
  switch (code) {
  case 0:
    if (cancel)
      COUNT(c, cancelled);
    else
      COUNT(c, finished);
    return 0;
  case 1: return 1;
  case -5:
    rm__errmsg_set("local-mode order %" PRId64 " was %s", order_id,
                   cancel ? "finished before with its stock frozen" : "cancelled before");
    return RM_LOCAL_E_DECIDED;
  case -6:
    rm__errmsg_set("local-mode order %" PRId64 " is paid although its stock was refused: not cancelled", order_id);
    return RM_LOCAL_E_PAID;
  case -8:
    rm__errmsg_set("no local-mode order %" PRId64 " in the orders database", order_id);
    return RM_PF_UNKNOWN_ORDER;
  default:
    rm__errmsg_set("unexpected code %" PRId64 " from order_local_finish", code);
    return RM_E_DB;
  }
}

int rm_local_order_finish(rm_client_t *c, PGconn *orders_pg, int64_t order_id) {
  char s[24];
  int rc = rm__pf_pg_order_arg(orders_pg, order_id, RM_E_INVALID, s);
  if (rc != 0) return rc;
  const char *vals[4] = {s, "FROZEN", NULL, NULL};
  return finish_order(c, orders_pg, order_id, false, vals);
}

/* The words stored for a refusal: the job's reason and the user's. */
static void refusal_text(int refusal, const char **reason, const char **user) {
  switch (refusal) {
  case RM_PF_SOLD_OUT:
    *reason = "sold_out";
    *user = "cancelled: the tickets sold out before this order could be confirmed";
    break;
  case RM_PF_OVER_LIMIT:
    *reason = "over_limit";
    *user = "cancelled: this order would exceed the purchase limit per user";
    break;
  case RM_PF_NOT_ON_SALE:
    *reason = "not_on_sale";
    *user = "cancelled: the sale was not open when this order was confirmed";
    break;
  default:
    *reason = "invalid";
    *user = "cancelled: this order could not be confirmed";
    break;
  }
}

int rm_local_order_cancel(rm_client_t *c, PGconn *orders_pg, rm_prefilter_t *pf, int64_t order_id, int refusal) {
  char s[24];
  const char *reason, *user;
  int rc = rm__pf_pg_usable(orders_pg, true);
  if (rc != 0) return rc;
  if (!rm__pf_id_ok(order_id) || !rm__local_is_refusal(refusal)) {
    rm__errmsg_set("invalid argument: order id must be >= 1 and the refusal one of rm_local_stock_freeze's");
    return RM_E_INVALID;
  }
  rm__pf_i64_str(s, order_id);
  const char *vals[4] = {s, NULL, NULL, NULL};

  /* What to release in Redis, and whether there is anything left to do. */
  PGresult *res = rm__pf_pg_exec(orders_pg, "read the local-mode order",
                                 "SELECT activity_id, ticket_type, state, outcome FROM order_compensation "
                                 "WHERE order_id = $1::bigint",
                                 1, vals);
  if (!res) return RM_E_DB;
  if (PQntuples(res) != 1) {
    PQclear(res);
    rm__errmsg_set("no local-mode order %" PRId64 " in the orders database", order_id);
    return RM_PF_UNKNOWN_ORDER;
  }
  int64_t activity = 0, tt = 0;
  const char *a = PQgetvalue(res, 0, 0), *t = PQgetvalue(res, 0, 1);
  bool done = strcmp(PQgetvalue(res, 0, 2), "DONE") == 0;
  bool was_cancelled = strcmp(PQgetvalue(res, 0, 3), "CANCELLED") == 0;
  rc = rm__pf_parse_i64(a, strlen(a), &activity) != 0 || rm__pf_parse_i64(t, strlen(t), &tt) != 0 ? RM_E_DB : 0;
  PQclear(res);
  if (rc != 0) {
    rm__errmsg_set("unexpected order_compensation row for order %" PRId64, order_id);
    return rc;
  }
  if (done) {
    if (was_cancelled) return 1;
    rm__errmsg_set("local-mode order %" PRId64 " was finished before with its stock frozen", order_id);
    return RM_LOCAL_E_DECIDED;
  }

  /* Redis first: if the release fails nothing changed, and the caller (or
   * the job) retries; once the order is DONE nobody would release it.  A
   * release repeated after a crash between here and the commit below is a
   * no-op (RM_PF_ALREADY_RELEASED). */
  if (pf) {
    rc = rm_prefilter_release(pf, activity, (int32_t)tt, order_id);
    if (rc != 0 && rc != RM_PF_ALREADY_RELEASED && rc != RM_PF_UNKNOWN_ORDER && rc != RM_PF_NOT_LOADED &&
        rc != RM_PF_ALREADY_CONFIRMED) {
      /* keep rm_prefilter_errmsg's details, prefixed */
      char detail[RM_ERRMSG_MAX];
      snprintf(detail, sizeof(detail), "%s", rm_prefilter_errmsg());
      rm__errmsg_set("could not release the Redis freeze of order %" PRId64 ": %s%s%s", order_id,
                     rm_prefilter_strerror(rc), detail[0] ? ": " : "", detail);
      return rc;
    }
  }

  refusal_text(refusal, &reason, &user);
  vals[1] = "CANCELLED";
  vals[2] = reason;
  vals[3] = user;
  return finish_order(c, orders_pg, order_id, true, vals);
}

/* -------------------------------------------------------------- stock --- */

bool rm__local_is_refusal(int rc) {
  return rc == RM_PF_SOLD_OUT || rc == RM_PF_OVER_LIMIT || rc == RM_PF_BAD_ARGS || rc == RM_PF_NOT_ON_SALE;
}

int rm__local_stock_freeze(rm_client_t *c, PGconn *pg, const rm_local_order_t *o, const char *source) {
  char s[7][24];
  const char *vals[8];
  int64_t code;
  int rc = rm__pf_pg_usable(pg, false);
  if (rc != 0) return rc;
  if (!order_ok(o)) {
    rm__errmsg_set("invalid argument: local order out of range");
    return RM_E_INVALID;
  }
  int64_t deadline = o->deadline_ms ? o->deadline_ms : o->expire_ms ? o->expire_ms : unix_ms() + DEFAULT_TTL_MS;
  rm__pf_i64_str(s[0], o->order_id);
  rm__pf_i64_str(s[1], o->activity_id);
  rm__pf_i64_str(s[2], o->ticket_type);
  rm__pf_i64_str(s[3], o->bucket);
  rm__pf_i64_str(s[4], o->user_id);
  rm__pf_i64_str(s[5], o->qty);
  rm__pf_i64_str(s[6], deadline);
  for (int i = 0; i < 7; i++) vals[i] = s[i];
  vals[7] = source;
  rc = call_code(pg, "record the local-mode freeze",
                 "SELECT stock_local_freeze($1::bigint, $2::bigint, $3::integer, $4::integer, $5::bigint, "
                 "$6::integer, timestamptz 'epoch' + $7::bigint * interval '1 millisecond', $8::text)",
                 8, vals, &code);
  if (rc != 0) return rc;
  switch (code) {
  case 0: COUNT(c, frozen); return 0;
  case 1: return 1;
  case -1: /* outside the sale window (sql/stock/006) */
    COUNT(c, refused);
    rm__errmsg_set("the stock database refused order %" PRId64 " (not on sale)", o->order_id);
    return RM_PF_NOT_ON_SALE;
  case -2:
  case -3:
  case -4:
    COUNT(c, refused);
    rm__errmsg_set("the stock database refused order %" PRId64 " (%s)", o->order_id,
                   code == -2 ? "over the user limit" : code == -3 ? "sold out" : "no such bucket or other values");
    return code == -2 ? RM_PF_OVER_LIMIT : code == -3 ? RM_PF_SOLD_OUT : RM_PF_BAD_ARGS;
  case -9:
    rm__errmsg_set("order %" PRId64 " was recorded in the stock database with other values", o->order_id);
    return RM_LOCAL_E_MISMATCH;
  default:
    rm__errmsg_set("unexpected code %" PRId64 " from stock_local_freeze", code);
    return RM_E_DB;
  }
}

int rm_local_stock_freeze(rm_client_t *c, PGconn *stock_pg, const rm_local_order_t *o) {
  return rm__local_stock_freeze(c, stock_pg, o, RM_LOCAL_SOURCE_SERVICE);
}

/* ---------------------------------------------------------------- misc --- */

const char *rm_local_errmsg(void) { return rm_errmsg(); }

void rm_client_degrade_stats(rm_client_t *c, rm_degrade_stats_t *out) {
  if (!out) return;
  rm__degrade_stats(c, out);
  rm_local_stats_t ls;
  rm_client_local_stats(c, &ls);
  out->local_orders = ls.orders;
}

void rm_client_local_stats(rm_client_t *c, rm_local_stats_t *out) {
  if (!out) return;
  memset(out, 0, sizeof(*out));
  rm_local_counters_t *k = rm__local_counters(c);
  if (!k) return;
  out->orders = atomic_load(&k->orders);
  out->frozen = atomic_load(&k->frozen);
  out->refused = atomic_load(&k->refused);
  out->finished = atomic_load(&k->finished);
  out->cancelled = atomic_load(&k->cancelled);
}
