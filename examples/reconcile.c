/*
 * reconcile.c - the daily reconciliation: orders against payment, paid
 * tickets against stock, points against paid orders (see reconcile.h).
 *
 * NOTES
 *   The three databases are separate, so nothing is joined across them:
 *   the orders PAID in the window are read once (their ids, qty and
 *   bucket), then sent to the stock and events databases in chunks as
 *   arrays, where one query per chunk returns only the orders whose row
 *   is missing or differs (unnest(...) LEFT JOIN ...).  The other
 *   direction is the same: the freezes confirmed and the points credited
 *   in the window go to the orders database as arrays.  Rows that are
 *   final never change (a PAID order, a CONFIRMED freeze, a points row),
 *   so the reads need no common snapshot; what may still be on its way
 *   is outside the window (the settle margin).  A bucket's sold_count and
 *   its confirmed freezes are read in one statement of the stock
 *   database: one snapshot, and stock_freeze_finish changes both in one
 *   transaction.
 */
#include "reconcile.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <libpq-fe.h>

#include "svc_common.h"

#define CHUNK 5000

const recon_kind_t recon_kinds[] = {
    {"payment", "paid_without_ledger"}, {"payment", "ledger_without_order"},
    {"payment", "ledger_order_not_paid"}, {"payment", "amount_mismatch"},
    {"stock", "paid_not_confirmed"},    {"stock", "confirmed_not_paid"},
    {"stock", "sold_count_mismatch"},   {"points", "paid_without_points"},
    {"points", "points_not_paid"},      {"points", "points_mismatch"},
};
const size_t recon_nkinds = sizeof(recon_kinds) / sizeof(recon_kinds[0]);

/* A PAID order of the window. */
typedef struct paid {
  long long order_id, activity, ticket_type, bucket, qty;
} paid_t;

typedef struct run {
  const recon_opts_t *o;
  recon_result_t *res;
  PGconn *orders, *stock, *events;
  paid_t *paid;
  size_t npaid;
} run_t;

static void set_error(recon_result_t *res, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_error(recon_result_t *res, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(res->error, sizeof(res->error), fmt, ap);
  va_end(ap);
  /* libpq's messages end in a newline */
  size_t n = strlen(res->error);
  while (n && (res->error[n - 1] == '\n' || res->error[n - 1] == ' ')) res->error[--n] = '\0';
}

static const char *kind_check(const char *kind) {
  for (size_t i = 0; i < recon_nkinds; i++)
    if (strcmp(recon_kinds[i].kind, kind) == 0) return recon_kinds[i].check;
  return "payment";
}

/* Add a difference of 'kind'; 'expected'/'actual' NULL for none. */
static bool add_diff(recon_result_t *res, const char *kind, long long order_id, long long activity,
                     long long ticket_type, long long bucket, const char *expected, const char *actual,
                     const char *fmt, ...) __attribute__((format(printf, 9, 10)));
static bool add_diff(recon_result_t *res, const char *kind, long long order_id, long long activity,
                     long long ticket_type, long long bucket, const char *expected, const char *actual,
                     const char *fmt, ...) {
  if (res->ndiffs == res->cap) {
    size_t cap = res->cap ? res->cap * 2 : 16;
    recon_diff_t *d = realloc(res->diffs, cap * sizeof(*d));
    if (!d) {
      set_error(res, "out of memory");
      return false;
    }
    res->diffs = d;
    res->cap = cap;
  }
  recon_diff_t *d = &res->diffs[res->ndiffs++];
  memset(d, 0, sizeof(*d));
  for (size_t i = 0; i < recon_nkinds; i++)
    if (strcmp(recon_kinds[i].kind, kind) == 0) d->kind = recon_kinds[i].kind;
  d->check = kind_check(kind);
  d->order_id = order_id;
  d->activity = activity;
  d->ticket_type = ticket_type;
  d->bucket = bucket;
  snprintf(d->expected, sizeof(d->expected), "%s", expected ? expected : "");
  snprintf(d->actual, sizeof(d->actual), "%s", actual ? actual : "");
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(d->reason, sizeof(d->reason), fmt, ap);
  va_end(ap);
  return true;
}

static PGconn *connect_db(const char *url, const char *what, recon_result_t *res) {
  const char *keys[] = {"dbname", "application_name", "connect_timeout", NULL};
  const char *vals[] = {url, "txc-reconcile", "10", NULL};
  PGconn *pg = PQconnectdbParams(keys, vals, 1);
  if (PQstatus(pg) != CONNECTION_OK) {
    set_error(res, "could not connect to the %s database: %s", what, PQerrorMessage(pg));
    PQfinish(pg);
    return NULL;
  }
  return pg;
}

/* 'sql' with text parameters; the result, or NULL with the error set
 * ("could not <what>: ..."). */
static PGresult *query(recon_result_t *res, PGconn *pg, const char *what, const char *sql, int n,
                       const char *const *params) {
  PGresult *r = PQexecParams(pg, sql, n, NULL, params, NULL, NULL, 0);
  ExecStatusType st = PQresultStatus(r);
  if (st == PGRES_TUPLES_OK || st == PGRES_COMMAND_OK) return r;
  set_error(res, "could not %s: %s", what, PQerrorMessage(pg));
  PQclear(r);
  return NULL;
}

static long long ll(const PGresult *r, int row, int col) {
  return PQgetisnull(r, row, col) ? -1 : atoll(PQgetvalue(r, row, col));
}
static const char *str_or(const PGresult *r, int row, int col, const char *def) {
  return PQgetisnull(r, row, col) ? def : PQgetvalue(r, row, col);
}

/* 'sql' on 'pg' with the window as $1 and $2: every check reads the
 * rows written in it. */
static PGresult *query_window(run_t *r, PGconn *pg, const char *what, const char *sql) {
  const char *w[2] = {r->res->since, r->res->until};
  return query(r->res, pg, what, sql, 2, w);
}

/* "{a,b,c}" of 'n' values from 'v' (stride 'stride' bytes); malloc'd. */
static char *array_text(const void *v, size_t n, size_t stride, size_t off) {
  char *s = malloc(n * 21 + 3), *p = s;
  if (!s) return NULL;
  *p++ = '{';
  for (size_t i = 0; i < n; i++) {
    long long x;
    memcpy(&x, (const char *)v + i * stride + off, sizeof(x));
    p += sprintf(p, "%s%lld", i ? "," : "", x);
  }
  *p++ = '}';
  *p = '\0';
  return s;
}

/* ---------------------------------------------------------- the window */

/* The window in res->since/until from the options, on the orders
 * database's clock. */
static bool set_window(run_t *r) {
  const recon_opts_t *o = r->o;
  char settle[24];
  snprintf(settle, sizeof(settle), "%lld", o->settle_s);
  const char *p[4] = {o->day ? NULL : o->since, o->day ? NULL : o->until, o->day, settle};
  PGresult *q = query(r->res, r->orders, "compute the window",
                      "WITH w AS (SELECT coalesce($1::timestamptz, ($3::date)::timestamp AT TIME ZONE 'UTC') AS s0,"
                      "   coalesce($2::timestamptz, ($3::date + 1)::timestamp AT TIME ZONE 'UTC', 'infinity') AS u0),"
                      " c AS (SELECT least(u0, now() - $4::bigint * interval '1 second') AS u, s0 FROM w),"
                      " d AS (SELECT coalesce(s0, u - interval '1 day') AS s, u FROM c)"
                      " SELECT to_char(least(s, u) AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'),"
                      "        to_char(u AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"') FROM d",
                      4, p);
  if (!q) return false;
  snprintf(r->res->since, sizeof(r->res->since), "%s", PQgetvalue(q, 0, 0));
  snprintf(r->res->until, sizeof(r->res->until), "%s", PQgetvalue(q, 0, 1));
  PQclear(q);
  return true;
}

/* ------------------------------------------------------------- payment */

static bool check_payment(run_t *r) {
  recon_result_t *res = r->res;
  PGresult *q = query_window(r, r->orders, "read the paid orders",
                      "SELECT o.order_id, o.activity_id, o.ticket_type, o.bucket_id, o.qty, o.amount_cents,"
                      "       l.order_id IS NOT NULL, l.amount_cents"
                      "  FROM trade_order o LEFT JOIN payment_ledger l ON l.order_id = o.order_id"
                      " WHERE o.status = 'PAID' AND o.updated_at >= $1 AND o.updated_at < $2"
                      " ORDER BY o.order_id");
  if (!q) return false;
  int n = PQntuples(q);
  r->paid = calloc(n ? (size_t)n : 1, sizeof(*r->paid));
  if (!r->paid) {
    PQclear(q);
    set_error(res, "out of memory");
    return false;
  }
  bool ok = true;
  for (int i = 0; i < n && ok; i++) {
    paid_t *p = &r->paid[r->npaid++];
    p->order_id = ll(q, i, 0);
    p->activity = ll(q, i, 1);
    p->ticket_type = ll(q, i, 2);
    p->bucket = ll(q, i, 3);
    p->qty = ll(q, i, 4);
    const char *amount = str_or(q, i, 5, NULL);
    bool has_entry = strcmp(PQgetvalue(q, i, 6), "t") == 0;
    const char *paid = str_or(q, i, 7, NULL);
    if (!has_entry)
      ok = add_diff(res, "paid_without_ledger", p->order_id, p->activity, p->ticket_type, p->bucket,
                    amount ? amount : "present", "missing",
                    "order %lld is PAID but the payment ledger has no entry for it", p->order_id);
    else if (amount && strcmp(amount, paid) != 0)
      ok = add_diff(res, "amount_mismatch", p->order_id, p->activity, p->ticket_type, p->bucket, amount, paid,
                    "order %lld is PAID for %s cents but the payment ledger took %s", p->order_id, amount, paid);
  }
  PQclear(q);
  res->paid_orders = (long long)r->npaid;
  if (!ok) return false;

  q = query_window(r, r->orders, "read the payment ledger",
                   "SELECT count(*) FROM payment_ledger WHERE paid_at >= $1 AND paid_at < $2");
  if (!q) return false;
  res->ledger_entries = ll(q, 0, 0);
  PQclear(q);
  q = query_window(r, r->orders, "read the payment ledger",
            "SELECT l.order_id, l.amount_cents, o.order_id IS NOT NULL, o.status, o.activity_id, o.ticket_type,"
            "       o.bucket_id"
            "  FROM payment_ledger l LEFT JOIN trade_order o ON o.order_id = l.order_id"
            " WHERE l.paid_at >= $1 AND l.paid_at < $2 AND o.status IS DISTINCT FROM 'PAID'"
            " ORDER BY l.order_id");
  if (!q) return false;
  n = PQntuples(q);
  for (int i = 0; i < n && ok; i++) {
    long long id = ll(q, i, 0);
    const char *amount = PQgetvalue(q, i, 1);
    if (strcmp(PQgetvalue(q, i, 2), "t") != 0) {
      ok = add_diff(res, "ledger_without_order", id, -1, -1, -1, "PAID", "missing",
                    "the payment ledger took %s cents for order %lld, which does not exist", amount, id);
    } else {
      ok = add_diff(res, "ledger_order_not_paid", id, ll(q, i, 4), ll(q, i, 5), ll(q, i, 6), "PAID",
                    PQgetvalue(q, i, 3), "the payment ledger took %s cents for order %lld, which is %s", amount,
                    id, PQgetvalue(q, i, 3));
    }
  }
  PQclear(q);
  return ok;
}

/* --------------------------------------------------------------- stock */

/* The orders behind the rows another database wrote in the window:
 * 'sql' reads their ids (as array text) and how many rows there are
 * (into '*rows') from 'pg', with the window as $1 and $2.  Each of those
 * orders that is not PAID is a difference of kind 'kind', described as
 * 'fmt_what' ("the stock freeze is CONFIRMED for") the order. */
static bool window_orders_paid(run_t *r, PGconn *pg, const char *what, const char *sql, long long *rows,
                               const char *kind, const char *fmt_what) {
  PGresult *wq = query_window(r, pg, what, sql);
  if (!wq) return false;
  *rows = ll(wq, 0, 1);
  const char *p[1] = {PQgetvalue(wq, 0, 0)};
  PGresult *q = query(r->res, r->orders, "read the orders",
                      "SELECT x.id, o.status FROM unnest($1::bigint[]) AS x(id)"
                      "  LEFT JOIN trade_order o ON o.order_id = x.id"
                      " WHERE o.status IS DISTINCT FROM 'PAID' ORDER BY x.id",
                      1, p);
  PQclear(wq);
  if (!q) return false;
  bool ok = true;
  for (int i = 0; i < PQntuples(q) && ok; i++) {
    long long id = ll(q, i, 0);
    const char *st = str_or(q, i, 1, "missing");
    ok = add_diff(r->res, kind, id, -1, -1, -1, "PAID", st, "%s order %lld, but the order is %s", fmt_what, id,
                  strcmp(st, "missing") == 0 ? "missing" : st);
  }
  PQclear(q);
  return ok;
}

/* The paid order 'id' among r->paid[off, off + n), or one whose activity,
 * ticket type, bucket and qty are unknown (-1). */
static paid_t paid_in(const run_t *r, size_t off, size_t n, long long id) {
  for (size_t j = off; j < off + n; j++)
    if (r->paid[j].order_id == id) return r->paid[j];
  return (paid_t){.order_id = id, .activity = -1, .ticket_type = -1, .bucket = -1, .qty = -1};
}

/* One row of a check_paid_orders query: a difference for the paid order
 * 'pd' (false: out of memory). */
typedef bool (*paid_row_fn)(recon_result_t *res, const PGresult *q, int i, const paid_t *pd);

/* Runs 'sql' on 'db' over the paid orders, CHUNK at a time: $1 the chunk's
 * order ids, $2 their qtys and, when 'nparams' is 3, $3 'extra'.  Each row
 * it returns starts with an order id and goes to 'row' with that order. */
static bool check_paid_orders(run_t *r, PGconn *db, const char *what, const char *sql, int nparams,
                              const char *extra, paid_row_fn row) {
  recon_result_t *res = r->res;
  bool ok = true;
  for (size_t off = 0; off < r->npaid && ok; off += CHUNK) {
    size_t n = r->npaid - off < CHUNK ? r->npaid - off : CHUNK;
    char *ids = array_text(r->paid + off, n, sizeof(paid_t), offsetof(paid_t, order_id));
    char *qtys = array_text(r->paid + off, n, sizeof(paid_t), offsetof(paid_t, qty));
    if (!ids || !qtys) {
      free(ids);
      free(qtys);
      set_error(res, "out of memory");
      return false;
    }
    const char *p[3] = {ids, qtys, extra};
    PGresult *q = query(res, db, what, sql, nparams, p);
    free(ids);
    free(qtys);
    if (!q) return false;
    for (int i = 0; i < PQntuples(q) && ok; i++) {
      paid_t pd = paid_in(r, off, n, ll(q, i, 0));
      ok = row(res, q, i, &pd);
    }
    PQclear(q);
  }
  return ok;
}

static bool freeze_row(recon_result_t *res, const PGresult *q, int i, const paid_t *pd) {
  long long id = pd->order_id;
  if (PQgetisnull(q, i, 1))
    return add_diff(res, "paid_not_confirmed", id, pd->activity, pd->ticket_type, pd->bucket, "CONFIRMED", "missing",
                    "order %lld is PAID but the stock database has no freeze for it", id);
  return add_diff(res, "paid_not_confirmed", id, pd->activity, pd->ticket_type, pd->bucket, "CONFIRMED",
                  PQgetvalue(q, i, 1), "order %lld is PAID but its stock freeze is %s", id, PQgetvalue(q, i, 1));
}

static bool check_stock(run_t *r) {
  recon_result_t *res = r->res;
  bool ok = true;
  /* The paid orders' freezes. */
  if (!check_paid_orders(r, r->stock, "read the stock freezes",
                         "SELECT x.id, f.state FROM unnest($1::bigint[]) AS x(id)"
                         "  LEFT JOIN stock_freeze f ON f.order_id = x.id"
                         " WHERE f.state IS DISTINCT FROM 'CONFIRMED' ORDER BY x.id",
                         1, NULL, freeze_row))
    return false;

  /* The freezes confirmed in the window, against their orders. */
  if (!window_orders_paid(
          r, r->stock, "read the confirmed freezes",
          "SELECT coalesce('{' || string_agg(order_id::text, ',' ORDER BY order_id) || '}', '{}'), count(*)"
          "  FROM stock_freeze WHERE state = 'CONFIRMED' AND finished_at >= $1 AND finished_at < $2",
          &res->confirmed_freezes, "confirmed_not_paid", "the stock freeze is CONFIRMED for"))
    return false;

  /* Per bucket of the activities sold in the window: the confirmed
   * tickets against sold_count. */
  PGresult *q = query_window(r, r->stock, "read the buckets",
            "WITH a AS (SELECT DISTINCT activity_id FROM stock_freeze"
            "            WHERE created_at < $2 AND (finished_at IS NULL OR finished_at >= $1)),"
            " c AS (SELECT f.activity_id, f.ticket_type, f.bucket_id, sum(f.qty) AS qty FROM stock_freeze f"
            "        WHERE f.state = 'CONFIRMED' AND f.activity_id IN (SELECT activity_id FROM a)"
            "        GROUP BY 1, 2, 3)"
            " SELECT b.activity_id, b.ticket_type, b.bucket_id, b.sold_count, coalesce(c.qty, 0)"
            "   FROM activity_ticket_bucket b"
            "   LEFT JOIN c ON (c.activity_id, c.ticket_type, c.bucket_id) = (b.activity_id, b.ticket_type, b.bucket_id)"
            "  WHERE b.activity_id IN (SELECT activity_id FROM a)"
            "  ORDER BY 1, 2, 3");
  if (!q) return false;
  res->buckets = PQntuples(q);
  for (int i = 0; i < PQntuples(q) && ok; i++) {
    long long sold = ll(q, i, 3), confirmed = ll(q, i, 4);
    if (sold == confirmed) continue;
    char e[24], a[24];
    snprintf(e, sizeof(e), "%lld", confirmed);
    snprintf(a, sizeof(a), "%lld", sold);
    ok = add_diff(res, "sold_count_mismatch", -1, ll(q, i, 0), ll(q, i, 1), ll(q, i, 2), e, a,
                  "bucket %lld of activity %lld, ticket type %lld, has sold_count %lld but its confirmed freezes "
                  "hold %lld tickets",
                  ll(q, i, 2), ll(q, i, 0), ll(q, i, 1), sold, confirmed);
  }
  PQclear(q);
  return ok;
}

/* -------------------------------------------------------------- points */

static bool points_row(recon_result_t *res, const PGresult *q, int i, const paid_t *pd) {
  long long id = pd->order_id;
  const char *want = PQgetvalue(q, i, 1);
  if (PQgetisnull(q, i, 2))
    return add_diff(res, "paid_without_points", id, pd->activity, pd->ticket_type, pd->bucket, want, "missing",
                    "order %lld is PAID but the events database has no points for it", id);
  return add_diff(res, "points_mismatch", id, pd->activity, pd->ticket_type, pd->bucket, want, PQgetvalue(q, i, 2),
                  "order %lld has %s points, %s expected (qty %lld times %d)", id, PQgetvalue(q, i, 2), want,
                  pd->qty, RECON_POINTS_PER_TICKET);
}

static bool check_points(run_t *r) {
  recon_result_t *res = r->res;
  char per[16];
  snprintf(per, sizeof(per), "%d", RECON_POINTS_PER_TICKET);
  if (!check_paid_orders(r, r->events, "read the points",
                         "SELECT x.id, x.qty * $3::bigint, l.points"
                         "  FROM unnest($1::bigint[], $2::bigint[]) AS x(id, qty)"
                         "  LEFT JOIN points_ledger l ON l.order_id = x.id"
                         " WHERE l.points IS DISTINCT FROM x.qty * $3::bigint ORDER BY x.id",
                         3, per, points_row))
    return false;

  return window_orders_paid(
      r, r->events, "read the points of the window",
      "SELECT coalesce('{' || string_agg(order_id::text, ',' ORDER BY order_id) || '}', '{}'), count(*)"
      "  FROM points_ledger WHERE created_at >= $1 AND created_at < $2",
      &res->points_rows, "points_not_paid", "the events database credits points for");
}

/* ------------------------------------------------------------ recording */

static bool record_done(run_t *r) {
  recon_result_t *res = r->res;
  char rid[24], nd[24], counts[256];
  snprintf(rid, sizeof(rid), "%lld", res->run_id);
  snprintf(nd, sizeof(nd), "%zu", res->ndiffs);
  if (res->points_rows >= 0)
    snprintf(counts, sizeof(counts),
             "{\"paid_orders\":%lld,\"ledger_entries\":%lld,\"confirmed_freezes\":%lld,\"buckets\":%lld,"
             "\"points_rows\":%lld}",
             res->paid_orders, res->ledger_entries, res->confirmed_freezes, res->buckets, res->points_rows);
  else
    snprintf(counts, sizeof(counts),
             "{\"paid_orders\":%lld,\"ledger_entries\":%lld,\"confirmed_freezes\":%lld,\"buckets\":%lld,"
             "\"points_rows\":null}",
             res->paid_orders, res->ledger_entries, res->confirmed_freezes, res->buckets);
  PGresult *q = query(res, r->orders, "record the run", "BEGIN", 0, NULL);
  if (!q) return false;
  PQclear(q);
  for (size_t i = 0; i < res->ndiffs; i++) {
    const recon_diff_t *d = &res->diffs[i];
    char id[24], a[24], t[24], b[24];
    snprintf(id, sizeof(id), "%lld", d->order_id);
    snprintf(a, sizeof(a), "%lld", d->activity);
    snprintf(t, sizeof(t), "%lld", d->ticket_type);
    snprintf(b, sizeof(b), "%lld", d->bucket);
    const char *p[10] = {rid,
                         d->check,
                         d->kind,
                         d->reason,
                         d->order_id >= 0 ? id : NULL,
                         d->activity >= 0 ? a : NULL,
                         d->ticket_type >= 0 ? t : NULL,
                         d->bucket >= 0 ? b : NULL,
                         d->expected[0] ? d->expected : NULL,
                         d->actual[0] ? d->actual : NULL};
    q = query(res, r->orders, "record a difference",
              "INSERT INTO reconcile_difference (run_id, check_name, kind, reason, order_id, activity_id,"
              " ticket_type, bucket_id, expected, actual) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
              10, p);
    if (!q) {
      PQclear(PQexec(r->orders, "ROLLBACK"));
      return false;
    }
    PQclear(q);
  }
  const char *p[3] = {rid, nd, counts};
  q = query(res, r->orders, "record the run",
            "UPDATE reconcile_run SET state = 'DONE', differences = $2, counts = $3::jsonb, finished_at = now()"
            " WHERE run_id = $1",
            3, p);
  if (q) {
    PQclear(q);
    q = query(res, r->orders, "record the run", "COMMIT", 0, NULL);
  }
  if (!q) {
    PQclear(PQexec(r->orders, "ROLLBACK"));
    return false;
  }
  PQclear(q);
  return true;
}

static void record_failed(run_t *r) {
  if (!r->orders || !r->res->run_id || PQstatus(r->orders) != CONNECTION_OK) return;
  if (PQtransactionStatus(r->orders) != PQTRANS_IDLE) PQclear(PQexec(r->orders, "ROLLBACK"));
  char rid[24];
  snprintf(rid, sizeof(rid), "%lld", r->res->run_id);
  const char *p[2] = {rid, r->res->error[0] ? r->res->error : "unknown error"};
  PQclear(PQexecParams(r->orders,
                       "UPDATE reconcile_run SET state = 'FAILED', error = $2, finished_at = now() WHERE run_id = $1",
                       2, NULL, p, NULL, NULL, 0));
}

/* The advisory lock, waiting up to lock_wait_ms: 1 held, 0 not, -1 error. */
static int take_lock(run_t *r) {
  int64_t until = svc_now_us() + (int64_t)r->o->lock_wait_ms * 1000;
  for (;;) {
    PGresult *q = query(r->res, r->orders, "take the reconciliation lock",
                        "SELECT pg_try_advisory_lock(" RECON_LOCK_KEY ")", 0, NULL);
    if (!q) return -1;
    bool got = strcmp(PQgetvalue(q, 0, 0), "t") == 0;
    PQclear(q);
    if (got) return 1;
    if (svc_now_us() >= until) return 0;
    usleep(200 * 1000);
  }
}

recon_status_t recon_run(const recon_opts_t *o, recon_result_t *res) {
  memset(res, 0, sizeof(*res));
  res->points_rows = -1;
  run_t r = {.o = o, .res = res};
  if (!o->orders_url || !o->stock_url) {
    set_error(res, "the orders and stock databases are needed (ORDERS_PG_URL, STOCK_PG_URL)");
    return res->status = RECON_FAILED;
  }
  if (!(r.orders = connect_db(o->orders_url, "orders", res))) return res->status = RECON_FAILED;
  int locked = take_lock(&r);
  if (locked <= 0) {
    if (locked == 0)
      set_error(res, "another reconciliation holds the lock (waited %u ms)", o->lock_wait_ms);
    PQfinish(r.orders);
    return res->status = locked == 0 ? RECON_LOCKED : RECON_FAILED;
  }
  res->status = RECON_FAILED;
  const char *started_by = o->started_by ? o->started_by : "tool";
  if (o->skip_within_s > 0) {
    char within[24];
    snprintf(within, sizeof(within), "%lld", o->skip_within_s);
    const char *p[2] = {started_by, within};
    PGresult *q = query(res, r.orders, "read the last runs",
                        "SELECT count(*) FROM reconcile_run WHERE started_by = $1 AND state = 'DONE'"
                        " AND started_at > now() - $2::bigint * interval '1 second'",
                        2, p);
    if (!q) goto out;
    bool done = atoll(PQgetvalue(q, 0, 0)) > 0;
    PQclear(q);
    if (done) {
      res->status = RECON_SKIPPED;
      goto out;
    }
  }
  if (!set_window(&r)) goto out;
  {
    const char *p[3] = {started_by, res->since, res->until};
    PGresult *q = query(res, r.orders, "record the run",
                        "INSERT INTO reconcile_run (started_by, window_start, window_end) VALUES ($1, $2, $3)"
                        " RETURNING run_id",
                        3, p);
    if (!q) goto out;
    res->run_id = atoll(PQgetvalue(q, 0, 0));
    PQclear(q);
  }
  if (!(r.stock = connect_db(o->stock_url, "stock", res))) goto fail;
  if (o->events_url && !(r.events = connect_db(o->events_url, "events", res))) goto fail;
  if (!check_payment(&r) || !check_stock(&r) || (r.events && !check_points(&r))) goto fail;
  if (!record_done(&r)) goto fail;
  res->status = res->ndiffs ? RECON_DIFFERENCES : RECON_OK;
  goto out;

fail:
  record_failed(&r);
  res->status = RECON_FAILED;
out:
  if (PQstatus(r.orders) == CONNECTION_OK) PQclear(PQexec(r.orders, "SELECT pg_advisory_unlock(" RECON_LOCK_KEY ")"));
  PQfinish(r.orders);
  if (r.stock) PQfinish(r.stock);
  if (r.events) PQfinish(r.events);
  free(r.paid);
  return res->status;
}

void recon_result_free(recon_result_t *res) {
  free(res->diffs);
  res->diffs = NULL;
  res->ndiffs = res->cap = 0;
}

size_t recon_count_kind(const recon_result_t *res, const char *kind) {
  size_t n = 0;
  for (size_t i = 0; i < res->ndiffs; i++)
    if (strcmp(res->diffs[i].kind, kind) == 0) n++;
  return n;
}

static const char *const status_names[] = {"ok", "differences", "failed", "locked", "skipped"};

static json_t *by_kind_json(const recon_result_t *res) {
  json_t *k = json_object();
  for (size_t i = 0; i < recon_nkinds; i++) {
    size_t n = recon_count_kind(res, recon_kinds[i].kind);
    if (n) json_object_set_new(k, recon_kinds[i].kind, json_integer((json_int_t)n));
  }
  return k;
}

static json_t *id_or_null(long long v) { return v >= 0 ? json_integer(v) : json_null(); }
static json_t *str_or_null(const char *s) { return s[0] ? json_string(s) : json_null(); }

json_t *recon_result_json(const recon_result_t *res) {
  json_t *j = json_object();
  json_object_set_new(j, "status", json_string(status_names[res->status]));
  json_object_set_new(j, "run_id", res->run_id ? json_integer(res->run_id) : json_null());
  json_object_set_new(j, "window", json_pack("{s:s,s:s}", "since", res->since, "until", res->until));
  json_object_set_new(j, "counts",
                      json_pack("{s:I,s:I,s:I,s:I,s:o}", "paid_orders", (json_int_t)res->paid_orders,
                                "ledger_entries", (json_int_t)res->ledger_entries, "confirmed_freezes",
                                (json_int_t)res->confirmed_freezes, "buckets", (json_int_t)res->buckets,
                                "points_rows", res->points_rows >= 0 ? json_integer(res->points_rows) : json_null()));
  json_object_set_new(j, "points_compared", json_boolean(res->points_rows >= 0));
  json_object_set_new(j, "total", json_integer((json_int_t)res->ndiffs));
  json_object_set_new(j, "by_kind", by_kind_json(res));
  json_t *a = json_array();
  for (size_t i = 0; i < res->ndiffs; i++) {
    const recon_diff_t *d = &res->diffs[i];
    json_t *x = json_pack("{s:s,s:s,s:s}", "check", d->check, "kind", d->kind, "reason", d->reason);
    json_object_set_new(x, "order_id", id_or_null(d->order_id));
    json_object_set_new(x, "activity", id_or_null(d->activity));
    json_object_set_new(x, "ticket_type", id_or_null(d->ticket_type));
    json_object_set_new(x, "bucket", id_or_null(d->bucket));
    json_object_set_new(x, "expected", str_or_null(d->expected));
    json_object_set_new(x, "actual", str_or_null(d->actual));
    json_array_append_new(a, x);
  }
  json_object_set_new(j, "differences", a);
  json_object_set_new(j, "error", res->error[0] ? json_string(res->error) : json_null());
  return j;
}

void recon_log(const recon_result_t *res) {
  switch (res->status) {
  case RECON_OK:
  case RECON_DIFFERENCES: {
    json_t *f = json_pack("{s:s,s:I,s:s,s:s,s:I,s:o}", "alert", "reconciliation", "run_id", (json_int_t)res->run_id,
                          "window_start", res->since, "window_end", res->until, "differences",
                          (json_int_t)res->ndiffs, "by_kind", by_kind_json(res));
    int level = res->ndiffs ? SVC_LOG_ERROR : SVC_LOG_INFO;
    if (level > svc_log_level)
      json_decref(f);
    else if (res->ndiffs)
      svc_log_write(level, f, "reconciliation found %zu difference%s", res->ndiffs, res->ndiffs == 1 ? "" : "s");
    else
      svc_log_write(level, f, "reconciliation found no differences");
    break;
  }
  case RECON_FAILED:
  case RECON_LOCKED:
    SVC_LOG(SVC_LOG_ERROR, json_pack("{s:s}", "alert", "reconciliation"), "could not reconcile: %s", res->error);
    break;
  case RECON_SKIPPED:
    break;
  }
}
