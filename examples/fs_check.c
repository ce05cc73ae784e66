/*
 * fs_check.c - seed a flash-sale activity, check a finished sale (see
 * fs_check.h).
 *
 * NOTES
 *   Every figure is read from the databases themselves, never from what
 *   the services answered: the client's view is only compared with them
 *   (client_view).  The run's global transactions are those the
 *   order-service began since fs_seed, on the coordinator database's own
 *   clock (global_table for the unfinished ones, global_history for the
 *   finished ones).
 */
#include "fs_check.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <hiredis/hiredis.h>
#include <libpq-fe.h>

#include "svc_common.h"
#include "svc_redis.h"

#define TM_APP "order-service"

struct fs_check {
  fs_env_t env;
  PGconn *stock, *orders, *tc;
  PGconn *events; /* NULL without EVENTS_PG_URL */
  rm_prefilter_t *pf;  /* seed and reconciliation (dry run) */
  redisContext *redis; /* direct reads of the prefilter's keys */
  char run_start[64]; /* timestamptz text, TC database clock */
};

bool fs_env_load(fs_env_t *env) {
  env->order_url = svc_env_str("ORDER_URL", NULL);
  env->stock_pg = svc_env_str("STOCK_PG_URL", NULL);
  env->orders_pg = svc_env_str("ORDERS_PG_URL", NULL);
  env->tc_pg = svc_env_str("TC_PG_URL", NULL);
  env->redis_url = svc_redis_env_url(); /* a Sentinel URL under cluster/local/up --ha */
  env->events_pg = svc_env_str("EVENTS_PG_URL", NULL);
  const char *missing[5];
  int n = 0;
  if (!env->order_url) missing[n++] = "ORDER_URL";
  if (!env->stock_pg) missing[n++] = "STOCK_PG_URL";
  if (!env->orders_pg) missing[n++] = "ORDERS_PG_URL";
  if (!env->tc_pg) missing[n++] = "TC_PG_URL";
  if (!env->redis_url) missing[n++] = "REDIS_URL";
  if (n) {
    fprintf(stderr, "flashsale: not set:");
    for (int i = 0; i < n; i++) fprintf(stderr, " %s", missing[i]);
    fprintf(stderr, " (cluster/local/up --with-services prints them)\n");
    return false;
  }
  return true;
}

static PGconn *connect_db(const char *url, const char *what) {
  PGconn *pg = PQconnectdb(url);
  if (PQstatus(pg) != CONNECTION_OK) {
    fprintf(stderr, "flashsale: could not connect to the %s database: %s", what, PQerrorMessage(pg));
    PQfinish(pg);
    return NULL;
  }
  return pg;
}

static void sleep_ms(int ms);

/* Make sure '*pg' works: a round trip, and after a failure (e.g. the
 * server restarted) PQreset, up to 'tries' times 500 ms apart.  The
 * checks run long after the connections were opened. */
static bool fs_pg_alive(PGconn *pg, const char *what, int tries) {
  for (int i = 0; i <= tries; i++) {
    if (PQstatus(pg) == CONNECTION_OK) {
      PGresult *r = PQexec(pg, "SELECT 1");
      bool ok = PQresultStatus(r) == PGRES_TUPLES_OK;
      PQclear(r);
      if (ok) return true;
    }
    if (i == tries) break;
    if (i > 0) sleep_ms(500);
    PQreset(pg);
    if (PQstatus(pg) == CONNECTION_OK)
      fprintf(stderr, "flashsale: reconnected to the %s database\n", what);
  }
  fprintf(stderr, "flashsale: the %s database is unreachable: %s", what, PQerrorMessage(pg));
  return false;
}

/* All the connections; false if one stays broken. */
static bool fs_reconnect(fs_check_t *c) {
  bool a = fs_pg_alive(c->stock, "stock", 20);
  bool b = fs_pg_alive(c->orders, "orders", 20);
  bool d = fs_pg_alive(c->tc, "coordinator", 20);
  bool e = !c->events || fs_pg_alive(c->events, "events", 20);
  return a && b && d && e;
}

fs_check_t *fs_check_new(const fs_env_t *env) {
  fs_check_t *c = calloc(1, sizeof(*c));
  if (!c) return NULL;
  c->env = *env;
  c->stock = connect_db(env->stock_pg, "stock");
  c->orders = c->stock ? connect_db(env->orders_pg, "orders") : NULL;
  c->tc = c->orders ? connect_db(env->tc_pg, "coordinator") : NULL;
  if (!c->tc || (env->events_pg && !(c->events = connect_db(env->events_pg, "events")))) {
    fs_check_free(c);
    return NULL;
  }
  rm_pf_options_t po = {.command_timeout_ms = 5000, .connect_timeout_ms = 2000, .max_connections = 2};
  int rc = rm_prefilter_new(env->redis_url, &po, &c->pf);
  if (rc != 0) {
    fprintf(stderr, "flashsale: could not set up the prefilter on %s: %s\n", env->redis_url,
            rm_prefilter_strerror(rc));
    fs_check_free(c);
    return NULL;
  }
  char rerr[256];
  c->redis = svc_redis_connect(env->redis_url, 5000, rerr, sizeof(rerr));
  if (!c->redis) {
    fprintf(stderr, "flashsale: %s\n", rerr);
    fs_check_free(c);
    return NULL;
  }
  return c;
}

void fs_check_free(fs_check_t *c) {
  if (!c) return;
  PQfinish(c->stock);
  PQfinish(c->orders);
  PQfinish(c->tc);
  PQfinish(c->events);
  rm_prefilter_free(c->pf);
  if (c->redis) redisFree(c->redis);
  free(c);
}

/* First value of a query as long long; 'ok' cleared on error. */
static long long q_ll(PGconn *pg, const char *sql, int n, const char *const *p, bool *ok) {
  char err[512];
  PGresult *r = NULL;
  if (!svc_pg_exec(pg, sql, n, p, PGRES_TUPLES_OK, &r, err, sizeof(err))) {
    fprintf(stderr, "flashsale: query failed: %s\n", err);
    *ok = false;
    return 0;
  }
  long long v = PQntuples(r) && !PQgetisnull(r, 0, 0) ? atoll(PQgetvalue(r, 0, 0)) : 0;
  PQclear(r);
  return v;
}

bool fs_seed(fs_check_t *c, fs_activity_t *a, char *err, size_t errlen) {
  bool ok = true;
  PGresult *r = NULL;
  if (!svc_pg_exec(c->tc, "SELECT clock_timestamp()::text", 0, NULL, PGRES_TUPLES_OK, &r, err, errlen))
    return false;
  snprintf(c->run_start, sizeof(c->run_start), "%s", PQgetvalue(r, 0, 0));
  PQclear(r);

  for (int attempt = 0; attempt < 5; attempt++) {
    long long id = a->activity;
    if (!id) {
      id = q_ll(c->stock, "SELECT coalesce(max(activity_id), 0) + 1 FROM activity", 0, NULL, &ok);
      if (!ok) {
        snprintf(err, errlen, "could not read the activities");
        return false;
      }
    }
    char sid[24], stt[24], st[24], sb[24], sl[24], name[64], sopen[24], sclose[24];
    snprintf(sid, sizeof(sid), "%lld", id);
    snprintf(stt, sizeof(stt), "%lld", a->ticket_type);
    snprintf(st, sizeof(st), "%lld", a->tickets);
    snprintf(sb, sizeof(sb), "%lld", a->buckets);
    snprintf(sl, sizeof(sl), "%lld", a->limit);
    snprintf(name, sizeof(name), "flash sale %lld", id);
    snprintf(sopen, sizeof(sopen), "%lld", a->open_in_ms);
    snprintf(sclose, sizeof(sclose), "%lld", a->close_after_ms > 0 ? a->close_after_ms : 60000);
    const char *p1[5] = {sid, name, sl, sopen, sclose};
    PGresult *wr = NULL;
    const char *p2[4] = {sid, stt, st, sb};
    if (!svc_pg_exec(c->stock, "BEGIN", 0, NULL, PGRES_COMMAND_OK, NULL, err, errlen)) return false;
    /* open_in_ms 0: on sale now, as before the sale window existed; else
     * not started, opening in open_in_ms (the window job flips it) */
    if (svc_pg_exec(c->stock,
                    "INSERT INTO activity (activity_id, name, status, per_user_limit, starts_at, ends_at)"
                    " SELECT $1, $2, CASE WHEN $4::bigint > 0 THEN 0 ELSE 1 END, $3, s,"
                    "  CASE WHEN $4::bigint > 0 THEN s + $5::bigint * interval '1 millisecond'"
                    "  ELSE now() + interval '1 day' END"
                    " FROM (SELECT CASE WHEN $4::bigint > 0 THEN now() + $4::bigint * interval '1 millisecond'"
                    "  ELSE now() - interval '1 second' END AS s) w"
                    " RETURNING floor(extract(epoch FROM starts_at) * 1000)::bigint,"
                    "  floor(extract(epoch FROM ends_at) * 1000)::bigint",
                    5, p1, PGRES_TUPLES_OK, &wr, err, errlen) &&
        svc_pg_exec(c->stock,
                    "INSERT INTO activity_ticket_bucket (activity_id, ticket_type, bucket_id, stock)"
                    " SELECT $1, $2, g, $3::int / $4::int + CASE WHEN g < $3::int % $4::int THEN 1 ELSE 0 END"
                    " FROM generate_series(0, $4::int - 1) g",
                    4, p2, PGRES_COMMAND_OK, NULL, err, errlen) &&
        svc_pg_exec(c->stock, "COMMIT", 0, NULL, PGRES_COMMAND_OK, NULL, err, errlen)) {
      a->activity = id;
      a->starts_ms = atoll(PQgetvalue(wr, 0, 0));
      a->ends_ms = atoll(PQgetvalue(wr, 0, 1));
      PQclear(wr);
      break;
    }
    PQclear(wr);
    PQclear(PQexec(c->stock, "ROLLBACK"));
    if (a->activity || !strstr(err, "activity_pkey")) return false; /* taken on purpose, or another error */
    err[0] = '\0';                                                    /* raced another seeder: next id */
  }
  if (!a->activity) {
    snprintf(err, errlen, "could not find a free activity id");
    return false;
  }
  /* Redis: the prefilter's copy, from PostgreSQL. */
  int rc = rm_prefilter_seed(c->pf, c->stock, a->activity);
  if (rc != 0) {
    snprintf(err, errlen, "could not load activity %lld into Redis: %s: %s", a->activity,
             rm_prefilter_strerror(rc), rm_prefilter_errmsg());
    return false;
  }
  a->redis_seeded = true;
  return true;
}

bool fs_sale_status(fs_check_t *c, const fs_activity_t *a, int *pg_status, int *redis_status, char *err,
                    size_t errlen) {
  char sid[24], key[64];
  snprintf(sid, sizeof(sid), "%lld", a->activity);
  const char *p[1] = {sid};
  bool ok = true;
  long long st = q_ll(c->stock, "SELECT status FROM activity WHERE activity_id = $1", 1, p, &ok);
  if (!ok) {
    snprintf(err, errlen, "could not read the status of activity %lld", a->activity);
    return false;
  }
  *pg_status = (int)st;
  snprintf(key, sizeof(key), "{act_%lld}:meta", a->activity);
  if (svc_redis_ensure(&c->redis, c->env.redis_url, 5000, err, errlen) == 0) return false;
  redisReply *r = svc_redis_cmd(c->redis, err, errlen, "HGET %s status", key);
  if (!r) return false;
  *redis_status = r->type == REDIS_REPLY_STRING ? atoi(r->str) : -1;
  freeReplyObject(r);
  return true;
}

bool fs_load(fs_check_t *c, fs_activity_t *a, char *err, size_t errlen) {
  fs_reconnect(c);
  char sid[24], stt[24];
  snprintf(sid, sizeof(sid), "%lld", a->activity);
  snprintf(stt, sizeof(stt), "%lld", a->ticket_type);
  const char *p[2] = {sid, stt};
  PGresult *r = NULL;
  if (!svc_pg_exec(c->stock,
                   "SELECT a.per_user_limit, coalesce(sum(b.stock), 0), count(b.bucket_id)"
                   " FROM activity a LEFT JOIN activity_ticket_bucket b"
                   " ON b.activity_id = a.activity_id AND b.ticket_type = $2"
                   " WHERE a.activity_id = $1 GROUP BY a.per_user_limit",
                   2, p, PGRES_TUPLES_OK, &r, err, errlen))
    return false;
  if (PQntuples(r) != 1) {
    PQclear(r);
    snprintf(err, errlen, "activity %lld does not exist", a->activity);
    return false;
  }
  a->limit = atoll(PQgetvalue(r, 0, 0));
  a->tickets = atoll(PQgetvalue(r, 0, 1));
  a->buckets = atoll(PQgetvalue(r, 0, 2));
  PQclear(r);
  snprintf(c->run_start, sizeof(c->run_start), "-infinity");
  return true;
}

/* ------------------------------------------------------------- checks */

static void inv_set(fs_result_t *res, const char *name, int state, const char *fmt, ...)
  __attribute__((format(printf, 4, 5)));

static void inv_set(fs_result_t *res, const char *name, int state, const char *fmt, ...) {
  if (res->ninv >= FS_MAX_INV) return;
  fs_invariant_t *v = &res->inv[res->ninv++];
  v->name = name;
  v->state = state;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(v->detail, sizeof(v->detail), fmt, ap);
  va_end(ap);
}

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

typedef struct settle_counts {
  long long unfinished, locks, undo_orders, undo_stock, overdue;
  long long comp_pending; /* local-mode orders the compensation job has not decided yet */
  long long queued;       /* the queued order mode: entries of {act_A}:queue not handled yet */
  long long events, events_unpublished, events_unapplied, dead_letters;
  /* the downstream consumers (events database; all 0 without it) */
  long long ds_paid;    /* PAID orders of the activity */
  long long ds_wrong;   /* of those, without exactly their effects */
  long long ds_waiting; /* of those, with an effect missing and no dead letter: still to come */
  long long ds_tickets; /* tickets issued for them */
  long long ds_stray;   /* effect rows of the activity for orders that are not PAID */
  long long ds_dead;    /* dead letters of the events database, DEAD or REDELIVER */
} settle_counts_t;

/* The order events of 'activity' (sql/orders/004_outbox.sql): how many,
 * how many not published yet, and how many the stock has not applied
 * (a stock_log row of the event's operation for its order), and the
 * stock consumer's dead letters. */
static bool read_events(fs_check_t *c, const char *activity, settle_counts_t *s) {
  char err[256];
  PGresult *r = NULL;
  const char *pa[1] = {activity};
  if (!svc_pg_exec(c->orders,
                   "SELECT count(*), count(*) FILTER (WHERE e.stream_seq IS NULL),"
                   " coalesce(array_agg(e.order_id) FILTER (WHERE e.event_type = 'order.paid'), '{}'),"
                   " coalesce(array_agg(e.order_id) FILTER (WHERE e.event_type <> 'order.paid'), '{}')"
                   " FROM order_outbox e JOIN trade_order o ON o.order_id = e.order_id"
                   " WHERE o.activity_id = $1 AND e.event_type IN ('order.paid', 'order.cancelled', 'order.expired')",
                   1, pa, PGRES_TUPLES_OK, &r, err, sizeof(err)))
    return false;
  s->events = atoll(PQgetvalue(r, 0, 0));
  s->events_unpublished = atoll(PQgetvalue(r, 0, 1));
  const char *p[3] = {activity, PQgetvalue(r, 0, 2), PQgetvalue(r, 0, 3)};
  PGresult *q = NULL;
  bool ok = svc_pg_exec(c->stock,
                        "SELECT count(*) FILTER (WHERE op = 'confirm' AND order_id = ANY($2::bigint[]))"
                        " + count(*) FILTER (WHERE op = 'release' AND order_id = ANY($3::bigint[])),"
                        " (SELECT count(*) FROM dead_letter WHERE state <> 'REDELIVERED')"
                        " FROM stock_log WHERE activity_id = $1",
                        3, p, PGRES_TUPLES_OK, &q, err, sizeof(err));
  PQclear(r);
  if (!ok) return false;
  s->events_unapplied = s->events - atoll(PQgetvalue(q, 0, 0));
  s->dead_letters = atoll(PQgetvalue(q, 0, 1));
  PQclear(q);
  return true;
}

/* The downstream consumers' effects for the PAID orders of 'activity'
 * (sql/events/001_downstream.sql), compared order by order: the PAID
 * orders and their qty come from the orders database, everything else
 * from the events database.  Nothing to read without EVENTS_PG_URL. */
static bool read_downstream(fs_check_t *c, const char *activity, settle_counts_t *s) {
  if (!c->events) return true;
  char err[256];
  PGresult *r = NULL;
  const char *pa[1] = {activity};
  if (!svc_pg_exec(c->orders,
                   "SELECT coalesce(array_agg(order_id ORDER BY order_id), '{}'),"
                   " coalesce(array_agg(qty ORDER BY order_id), '{}')"
                   " FROM trade_order WHERE activity_id = $1 AND status = 'PAID'",
                   1, pa, PGRES_TUPLES_OK, &r, err, sizeof(err))) {
    fprintf(stderr, "flashsale: could not read the paid orders: %s\n", err);
    return false;
  }
  const char *p[3] = {PQgetvalue(r, 0, 0), PQgetvalue(r, 0, 1), activity};
  PGresult *q = NULL;
  bool ok = svc_pg_exec(
    c->events,
    "WITH p AS (SELECT * FROM unnest($1::bigint[], $2::int[]) AS p(order_id, qty)),"
    " e AS (SELECT p.order_id, p.qty,"
    "   (SELECT count(*) FROM points_ledger l WHERE l.order_id = p.order_id) AS pts,"
    "   (SELECT count(*) FROM points_ledger l WHERE l.order_id = p.order_id AND l.points = 100 * p.qty) AS pts_ok,"
    "   (SELECT count(*) FROM member_notice n WHERE n.order_id = p.order_id AND n.kind = 'paid') AS notes,"
    "   (SELECT count(*) FROM issued_ticket t WHERE t.order_id = p.order_id) AS tix,"
    "   (SELECT count(*) FROM issued_ticket t WHERE t.order_id = p.order_id AND t.seq <= p.qty) AS tix_ok"
    "   FROM p)"
    " SELECT count(*),"
    "  count(*) FILTER (WHERE pts <> 1 OR pts_ok <> 1 OR notes <> 1 OR tix <> qty OR tix_ok <> qty),"
    "  count(*) FILTER (WHERE (pts = 0 OR notes = 0 OR tix < qty) AND NOT EXISTS (SELECT 1 FROM dead_letter d"
    "   WHERE d.biz_key = 'order.paid:' || e.order_id AND d.state = 'DEAD')),"
    "  coalesce(sum(tix), 0),"
    "  (SELECT count(*) FROM points_ledger WHERE activity_id = $3 AND order_id NOT IN (SELECT order_id FROM p))"
    "  + (SELECT count(*) FROM member_notice WHERE activity_id = $3 AND kind = 'paid'"
    "     AND order_id NOT IN (SELECT order_id FROM p))"
    "  + (SELECT count(*) FROM issued_ticket WHERE activity_id = $3 AND order_id NOT IN (SELECT order_id FROM p)),"
    "  (SELECT count(*) FROM dead_letter WHERE state IN ('DEAD', 'REDELIVER'))"
    " FROM e",
    3, p, PGRES_TUPLES_OK, &q, err, sizeof(err));
  PQclear(r);
  if (!ok) {
    fprintf(stderr, "flashsale: could not read the downstream effects: %s\n", err);
    return false;
  }
  s->ds_paid = atoll(PQgetvalue(q, 0, 0));
  s->ds_wrong = atoll(PQgetvalue(q, 0, 1));
  s->ds_waiting = atoll(PQgetvalue(q, 0, 2));
  s->ds_tickets = atoll(PQgetvalue(q, 0, 3));
  s->ds_stray = atoll(PQgetvalue(q, 0, 4));
  s->ds_dead = atoll(PQgetvalue(q, 0, 5));
  PQclear(q);
  return true;
}

static bool read_settle(fs_check_t *c, long long activity, settle_counts_t *s) {
  bool ok = true;
  char sa[24];
  snprintf(sa, sizeof(sa), "%lld", activity);
  const char *pa[1] = {sa};
  /* unpaid orders past their expiry: order-service's expiry job is about
   * to release them (only with a short ORDER_TTL_S) */
  s->overdue = q_ll(c->orders,
                    "SELECT count(*) FROM trade_order WHERE activity_id = $1 AND status = 'UNPAID'"
                    " AND expire_at < now()",
                    1, pa, &ok);
  s->comp_pending = q_ll(c->orders,
                         "SELECT count(*) FROM order_compensation WHERE activity_id = $1 AND state = 'PENDING'", 1,
                         pa, &ok);
  const char *p[2] = {c->run_start, TM_APP};
  s->unfinished =
    q_ll(c->tc, "SELECT count(*) FROM global_table WHERE begin_time >= $1 AND application_id = $2", 2, p, &ok);
  s->locks = q_ll(c->tc,
                  "SELECT count(*) FROM lock_table l WHERE l.gmt_create >= $1"
                  " OR NOT EXISTS (SELECT 1 FROM global_table g WHERE g.xid = l.xid)",
                  1, p, &ok);
  s->undo_orders = q_ll(c->orders, "SELECT count(*) FROM undo_log WHERE log_status = 0", 0, NULL, &ok);
  s->undo_stock = q_ll(c->stock, "SELECT count(*) FROM undo_log WHERE log_status = 0", 0, NULL, &ok);
  /* queued orders the consumer has not made yet (ORDER_MODE=queued) */
  char key[64], err[256];
  s->queued = 0;
  if (ok && rm_prefilter_queue_key(activity, key, sizeof(key)) == 0 &&
      svc_redis_ensure(&c->redis, c->env.redis_url, 5000, err, sizeof(err)) != 0) {
    redisReply *x = svc_redis_cmd(c->redis, err, sizeof(err), "XLEN %s", key);
    ok = x && x->type == REDIS_REPLY_INTEGER;
    if (ok) s->queued = x->integer;
    if (x) freeReplyObject(x);
  }
  return ok && read_events(c, sa, s) && read_downstream(c, sa, s);
}

/* "{1,2,3}" from 'n' ids (malloc'd). */
static char *pg_array(const long long *v, size_t n) {
  size_t cap = 3 + n * 21;
  char *s = malloc(cap);
  if (!s) return NULL;
  size_t off = 0;
  s[off++] = '{';
  for (size_t i = 0; i < n; i++) off += (size_t)snprintf(s + off, cap - off, i ? ",%lld" : "%lld", v[i]);
  s[off++] = '}';
  s[off] = '\0';
  return s;
}

/* '{"a","b"}' from the keys of 'v' (malloc'd); quoted, so any key is safe. */
static char *pg_key_array(const fs_keyed_t *v, size_t n) {
  size_t cap = 3 + n * (2 * sizeof(v->key) + 3);
  char *s = malloc(cap);
  if (!s) return NULL;
  size_t off = 0;
  s[off++] = '{';
  for (size_t i = 0; i < n; i++) {
    if (i) s[off++] = ',';
    s[off++] = '"';
    for (const char *k = v[i].key; *k; k++) {
      if (*k == '"' || *k == '\\') s[off++] = '\\';
      s[off++] = *k;
    }
    s[off++] = '"';
  }
  s[off++] = '}';
  s[off] = '\0';
  return s;
}

static int cmp_keyed(const void *a, const void *b) {
  const fs_keyed_t *x = a, *y = b;
  if (x->user != y->user) return x->user < y->user ? -1 : 1;
  int c = strcmp(x->key, y->key);
  if (c) return c;
  return x->order_id < y->order_id ? -1 : x->order_id > y->order_id;
}

/* one_order_per_key: PostgreSQL's unique (user_id, idem_key) (a second
 * order for a key would be the bug idempotent submit exists to prevent),
 * and the client's view of the keyed 201s against it. */
static void check_keys(fs_check_t *c, const char *activity, const fs_client_view_t *view, fs_result_t *res) {
  bool ok = true;
  const char *pa[1] = {activity};
  long long twice = q_ll(c->orders,
                         "SELECT count(*) FROM (SELECT 1 FROM trade_order WHERE activity_id = $1"
                         " AND idem_key IS NOT NULL GROUP BY user_id, idem_key HAVING count(*) > 1) d",
                         1, pa, &ok);
  long long keys = q_ll(c->orders, "SELECT count(idem_key) FROM trade_order WHERE activity_id = $1", 1, pa, &ok);
  size_t n = view->nkeyed, multi = 0, split = 0;
  long long wrong = 0;
  fs_keyed_t *k = n ? malloc(n * sizeof(*k)) : NULL;
  if (n && !k) ok = false;
  if (k) {
    memcpy(k, view->keyed, n * sizeof(*k));
    qsort(k, n, sizeof(*k), cmp_keyed);
    for (size_t i = 0; i < n;) {
      size_t e = i + 1;
      while (e < n && k[e].user == k[i].user && strcmp(k[e].key, k[i].key) == 0) e++;
      if (e - i > 1) multi++;
      if (k[e - 1].order_id != k[i].order_id) split++; /* sorted: first and last differ */
      i = e;
    }
    /* every answered order holds its key, for its user */
    long long *ids = malloc(n * sizeof(*ids)), *users = malloc(n * sizeof(*users));
    char *ak = pg_key_array(k, n), *ai = NULL, *au = NULL;
    if (ids && users) {
      for (size_t i = 0; i < n; i++) {
        ids[i] = k[i].order_id;
        users[i] = k[i].user;
      }
      ai = pg_array(ids, n);
      au = pg_array(users, n);
    }
    if (ak && ai && au) {
      const char *p[3] = {ak, ai, au};
      wrong = q_ll(c->orders,
                   "SELECT count(*) FROM unnest($1::text[], $2::bigint[], $3::bigint[]) AS a(k, id, u)"
                   " LEFT JOIN trade_order t ON t.order_id = a.id"
                   " WHERE t.idem_key IS DISTINCT FROM a.k OR t.user_id IS DISTINCT FROM a.u",
                   3, p, &ok);
    } else {
      ok = false;
    }
    free(ak);
    free(ai);
    free(au);
    free(ids);
    free(users);
    free(k);
  }
  if (!ok)
    inv_set(res, "one_order_per_key", FS_FAILED, "could not check the idempotency keys");
  else if (twice || split || wrong)
    inv_set(res, "one_order_per_key", FS_FAILED,
            "keys with two orders in PostgreSQL: %lld; keys answered 201 with different orders: %zu; "
            "answered orders not holding their key: %lld",
            twice, split, wrong);
  else
    inv_set(res, "one_order_per_key", FS_HOLDS,
            "%lld orders with a key, none twice; %zu keyed 201s, %zu keys answered 201 more than once, "
            "each with one order",
            keys, n, multi);
}

/* within_user_limit: no user holds more than the activity's per-user
 * limit, in the orders (UNPAID and PAID) nor in the stock (freezes not
 * RELEASED).  PostgreSQL enforces it whatever Redis said (a master that
 * lost its last second of writes forgets what a user bought; sql/stock/005):
 * this checks that it did. */
static void check_user_limit(fs_check_t *c, const char *activity, long long limit, fs_result_t *res) {
  bool ok = true;
  char lim[24];
  snprintf(lim, sizeof(lim), "%lld", limit);
  const char *po[2] = {activity, lim}, *ps[1] = {activity};
  long long o_over = q_ll(c->orders,
                          "SELECT count(*) FROM (SELECT user_id FROM trade_order WHERE activity_id = $1"
                          " AND status IN ('UNPAID', 'PAID') GROUP BY user_id HAVING sum(qty) > $2::bigint) x",
                          2, po, &ok);
  long long f_over = q_ll(c->stock,
                          "SELECT count(*) FROM (SELECT f.user_id FROM stock_freeze f JOIN activity a"
                          " USING (activity_id) WHERE f.activity_id = $1 AND f.state <> 'RELEASED'"
                          " GROUP BY f.user_id, a.per_user_limit HAVING sum(f.qty) > a.per_user_limit) x",
                          1, ps, &ok);
  if (!ok)
    inv_set(res, "within_user_limit", FS_FAILED, "could not count the users over the limit");
  else if (o_over || f_over)
    inv_set(res, "within_user_limit", FS_FAILED,
            "users over the per-user limit of %lld: %lld in the orders, %lld in the stock freezes", limit, o_over,
            f_over);
  else
    inv_set(res, "within_user_limit", FS_HOLDS,
            "no user holds more than %lld tickets (orders UNPAID or PAID, freezes not RELEASED)", limit);
}

#define MAXB 10000

/* A ledger's view of the buckets of (activity, ticket type) 'pa': 'sql'
 * gives rows (bucket, frozen, sold) into frozen[] and sold[]; a bucket
 * outside [0, nb) counts in '*bad'.  false when the query failed ('err'). */
static bool frozen_and_sold(PGconn *pg, const char *sql, const char *const *pa, long long nb, long long *frozen,
                            long long *sold, long long *bad, char *err, size_t errlen) {
  PGresult *r = NULL;
  if (!svc_pg_exec(pg, sql, 2, pa, PGRES_TUPLES_OK, &r, err, errlen)) return false;
  for (int i = 0; i < PQntuples(r); i++) {
    long long b = atoll(PQgetvalue(r, i, 0));
    if (b < 0 || b >= nb) {
      (*bad)++;
      continue;
    }
    frozen[b] = atoll(PQgetvalue(r, i, 1));
    sold[b] = atoll(PQgetvalue(r, i, 2));
  }
  PQclear(r);
  return true;
}

void fs_check_run(fs_check_t *c, const fs_activity_t *a, const fs_client_view_t *view, int settle_s,
                  fs_result_t *res) {
  memset(res, 0, sizeof(*res));
  char err[512];
  bool ok = true;

  /* Settle: the coordinator finishes phase two in the background, and
   * order-service expires overdue orders (then updates Redis).  Quiet
   * twice in a row, 200 ms apart, so that a step that just ended in one
   * store has time to reach the other. */
  settle_counts_t sc = {0};
  int64_t t0 = svc_now_us(), end = t0 + (int64_t)settle_s * 1000000;
  int quiet = 0;
  bool settled_ok = false; /* the last read of the counts worked */
  fs_reconnect(c);
  for (;;) {
    settled_ok = read_settle(c, a->activity, &sc);
    if (!settled_ok) {
      /* a database restarted meanwhile: reconnect and go on (bounded) */
      if (svc_now_us() >= end || !fs_reconnect(c)) break;
      continue;
    }
    bool q = sc.unfinished == 0 && sc.locks == 0 && sc.undo_orders == 0 && sc.undo_stock == 0 && sc.overdue == 0 &&
             sc.comp_pending == 0 && sc.queued == 0 && sc.events_unpublished == 0 && sc.events_unapplied <= 0 &&
             sc.ds_waiting == 0;
    quiet = q ? quiet + 1 : 0;
    if (quiet >= 2 || svc_now_us() >= end) break;
    sleep_ms(q ? 200 : 100);
  }
  res->settle_s = (double)(svc_now_us() - t0) / 1e6;

  char sid[24], stt[24];
  snprintf(sid, sizeof(sid), "%lld", a->activity);
  snprintf(stt, sizeof(stt), "%lld", a->ticket_type);
  const char *pa[2] = {sid, stt};

  /* Buckets */
  long long nb = a->buckets < MAXB ? a->buckets : MAXB;
  long long *stock = calloc((size_t)nb, sizeof(long long) * 12);
  long long *frozen = stock + nb, *sold = frozen + nb, *l_frozen = sold + nb, *l_sold = l_frozen + nb,
            *o_unpaid = l_sold + nb, *o_paid = o_unpaid + nb, *f_frozen = o_paid + nb, *f_sold = f_frozen + nb,
            *r_stock = f_sold + nb, *r_frozen = r_stock + nb, *r_sold = r_frozen + nb;
  if (!stock) return;
  PGresult *r = NULL;
  long long bad_buckets = 0, seen = 0;
  if (svc_pg_exec(c->stock,
                  "SELECT bucket_id, stock, frozen_count, sold_count FROM activity_ticket_bucket"
                  " WHERE activity_id = $1 AND ticket_type = $2 ORDER BY bucket_id",
                  2, pa, PGRES_TUPLES_OK, &r, err, sizeof(err))) {
    for (int i = 0; i < PQntuples(r); i++) {
      long long b = atoll(PQgetvalue(r, i, 0));
      if (b < 0 || b >= nb) {
        bad_buckets++;
        continue;
      }
      seen++;
      stock[b] = atoll(PQgetvalue(r, i, 1));
      frozen[b] = atoll(PQgetvalue(r, i, 2));
      sold[b] = atoll(PQgetvalue(r, i, 3));
      res->stock += stock[b];
      res->frozen += frozen[b];
      res->sold += sold[b];
      if (frozen[b] < 0 || sold[b] < 0 || frozen[b] + sold[b] > stock[b]) bad_buckets++;
    }
    PQclear(r);
    res->available = res->stock - res->frozen - res->sold;
    if (bad_buckets || seen != nb)
      inv_set(res, "no_oversell_pg", FS_FAILED, "%lld of %lld buckets over their stock or missing", bad_buckets,
              nb);
    else
      inv_set(res, "no_oversell_pg", FS_HOLDS, "%lld buckets: sold + frozen <= stock", nb);
  } else {
    inv_set(res, "no_oversell_pg", FS_FAILED, "could not read the buckets: %s", err);
  }
  /* Redis: the prefilter's bucket hash, read directly */
  char rkey[128];
  snprintf(rkey, sizeof(rkey), "{act_%lld}:t%lld:stock", a->activity, a->ticket_type);
  /* The connection may be to a master that died since (a Sentinel
   * failover during the sale): connect again, to the current one. */
  char rerr[256] = "";
  redisReply *rr = NULL;
  for (int attempt = 0; attempt < 2 && !rr; attempt++) {
    if (svc_redis_ensure(&c->redis, c->env.redis_url, 5000, rerr, sizeof(rerr)) == 0) break;
    rr = redisCommand(c->redis, "HGETALL %s", rkey);
    if (!rr) snprintf(rerr, sizeof(rerr), "%s", c->redis->errstr);
  }
  long long rn = -1, r_bad = 0, r_total = 0;
  bool redis_ok = rr && rr->type == REDIS_REPLY_ARRAY;
  if (redis_ok) {
    for (size_t i = 0; i + 1 < rr->elements; i += 2) {
      const char *f = rr->element[i]->str, *v = rr->element[i + 1]->str;
      if (!f || !v) continue;
      long long x = atoll(v), b = -1;
      const char *colon = strchr(f, ':');
      if (colon) b = atoll(colon + 1);
      if (strcmp(f, "n") == 0)
        rn = x;
      else if (b >= 0 && b < nb && strncmp(f, "stock:", 6) == 0)
        r_stock[b] = x;
      else if (b >= 0 && b < nb && strncmp(f, "frozen:", 7) == 0)
        r_frozen[b] = x;
      else if (b >= 0 && b < nb && strncmp(f, "sold:", 5) == 0)
        r_sold[b] = x;
    }
    for (long long b = 0; b < nb; b++) {
      r_total += r_stock[b];
      if (r_frozen[b] < 0 || r_sold[b] < 0 || r_frozen[b] + r_sold[b] > r_stock[b]) r_bad++;
    }
  }
  if (!redis_ok)
    inv_set(res, "no_oversell_redis", FS_FAILED, "could not read %s: %s", rkey,
            rr && rr->str ? rr->str : rerr);
  else if (rn != nb || r_bad)
    inv_set(res, "no_oversell_redis", FS_FAILED, "%lld of %lld buckets over their stock (Redis has n=%lld)", r_bad,
            nb, rn);
  else
    inv_set(res, "no_oversell_redis", FS_HOLDS, "%lld buckets: sold + frozen <= stock (%lld tickets)", nb,
            r_total);
  if (rr) freeReplyObject(rr);

  /* Totals: seeded stock, ledger, orders */
  long long ledger_bad = 0, orders_bad = 0, cancelled_with_reason = 0;
  if (!frozen_and_sold(c->stock,
                       "SELECT bucket_id,"
                       " coalesce(sum(qty) FILTER (WHERE op = 'freeze'), 0)"
                       " - coalesce(sum(qty) FILTER (WHERE op = 'confirm'), 0)"
                       " - coalesce(sum(qty) FILTER (WHERE op = 'release'), 0),"
                       " coalesce(sum(qty) FILTER (WHERE op = 'confirm'), 0)"
                       " FROM stock_log WHERE activity_id = $1 AND ticket_type = $2 GROUP BY bucket_id",
                       pa, nb, l_frozen, l_sold, &ledger_bad, err, sizeof(err)))
    ok = false;
  if (!frozen_and_sold(c->stock,
                       "SELECT bucket_id, coalesce(sum(qty) FILTER (WHERE state = 'FROZEN'), 0),"
                       " coalesce(sum(qty) FILTER (WHERE state = 'CONFIRMED'), 0)"
                       " FROM stock_freeze WHERE activity_id = $1 AND ticket_type = $2 GROUP BY bucket_id",
                       pa, nb, f_frozen, f_sold, &ledger_bad, err, sizeof(err)))
    ok = false;
  if (svc_pg_exec(c->orders,
                  "SELECT bucket_id, status, sum(qty), count(*), count(cancel_reason) FROM trade_order"
                  " WHERE activity_id = $1 AND ticket_type = $2 GROUP BY 1, 2",
                  2, pa, PGRES_TUPLES_OK, &r, err, sizeof(err))) {
    for (int i = 0; i < PQntuples(r); i++) {
      long long b = atoll(PQgetvalue(r, i, 0));
      const char *st = PQgetvalue(r, i, 1);
      long long q = atoll(PQgetvalue(r, i, 2)), n = atoll(PQgetvalue(r, i, 3));
      if (b < 0 || b >= nb) {
        orders_bad++;
        continue;
      }
      if (strcmp(st, "UNPAID") == 0) {
        o_unpaid[b] += q;
        res->orders_unpaid += n;
      } else if (strcmp(st, "PAID") == 0) {
        o_paid[b] += q;
        res->orders_paid += n;
      } else if (strcmp(st, "CANCELLED") == 0) {
        /* with or without a cancel_reason (a local-mode order that the
         * stock refused, cancelled by the system): no stock held */
        res->orders_cancelled += n;
        cancelled_with_reason += atoll(PQgetvalue(r, i, 4));
      } else {
        res->orders_expired += n;
      }
    }
    PQclear(r);
  } else {
    ok = false;
  }
  for (long long b = 0; b < nb; b++) {
    if (l_frozen[b] != frozen[b] || l_sold[b] != sold[b] || f_frozen[b] != frozen[b] || f_sold[b] != sold[b])
      ledger_bad++;
    if (o_unpaid[b] != frozen[b] || o_paid[b] != sold[b]) orders_bad++;
  }
  if (!ok)
    inv_set(res, "totals_conserved", FS_FAILED, "could not read the ledger or the orders: %s", err);
  else if (res->stock != a->tickets || ledger_bad || orders_bad)
    inv_set(res, "totals_conserved", FS_FAILED,
            "stock %lld of %lld seeded; buckets disagreeing with stock_log/stock_freeze: %lld, with the orders: %lld"
            " (local orders not compensated yet: %lld)",
            res->stock, a->tickets, ledger_bad, orders_bad, sc.comp_pending);
  else
    inv_set(res, "totals_conserved", FS_HOLDS,
            "%lld tickets = sold %lld + frozen %lld + available %lld; stock_log, stock_freeze and orders agree"
            " (%lld cancelled with a reason)",
            res->stock, res->sold, res->frozen, res->available, cancelled_with_reason);

  /* The client's view */
  ok = true;
  char *acc = pg_array(view->accepted, view->naccepted), *paid = pg_array(view->paid, view->npaid);
  const char *p1[1] = {acc}, *p2[1] = {paid};
  long long found = acc ? q_ll(c->orders, "SELECT count(*) FROM trade_order WHERE order_id = ANY($1::bigint[])",
                               1, p1, &ok)
                        : -1;
  long long paid_found =
    paid ? q_ll(c->orders,
                "SELECT count(*) FROM trade_order WHERE order_id = ANY($1::bigint[]) AND status = 'PAID'", 1, p2,
                &ok)
         : -1;
  free(acc);
  free(paid);
  if (!ok || found != (long long)view->naccepted || paid_found != (long long)view->npaid)
    inv_set(res, "client_view", FS_FAILED, "orders answered 201: %zu, found %lld; answered paid: %zu, PAID %lld",
            view->naccepted, found, view->npaid, paid_found);
  else
    inv_set(res, "client_view", FS_HOLDS, "all %zu accepted orders exist, all %zu paid ones are PAID",
            view->naccepted, view->npaid);
  check_keys(c, sid, view, res);
  check_user_limit(c, sid, a->limit, res);

  /* Global transactions */
  ok = true;
  const char *pt[2] = {c->run_start, TM_APP};
  if (svc_pg_exec(c->tc,
                  "SELECT status, count(*) FROM global_history WHERE begin_time >= $1 AND application_id = $2"
                  " GROUP BY status",
                  2, pt, PGRES_TUPLES_OK, &r, err, sizeof(err))) {
    for (int i = 0; i < PQntuples(r); i++) {
      int st = atoi(PQgetvalue(r, i, 0));
      long long n = atoll(PQgetvalue(r, i, 1));
      if (st == RM_GS_COMMITTED)
        res->committed += n;
      else if (st == RM_GS_ROLLBACKED || st == RM_GS_TIMEOUT_ROLLBACKED)
        res->rolled_back += n;
      else
        res->other_final += n;
    }
    PQclear(r);
  } else {
    ok = false;
  }
  res->unfinished = sc.unfinished;
  if (!ok)
    inv_set(res, "globals_finished", FS_FAILED, "could not read the coordinator's history: %s", err);
  else if (sc.unfinished || res->other_final)
    inv_set(res, "globals_finished", FS_FAILED,
            "%lld global transactions unfinished after %.1fs, %lld ended neither committed nor rolled back",
            sc.unfinished, res->settle_s, res->other_final);
  else
    inv_set(res, "globals_finished", FS_HOLDS, "%lld committed, %lld rolled back, none unfinished",
            res->committed, res->rolled_back);

  if (sc.locks || sc.undo_orders || sc.undo_stock)
    inv_set(res, "no_leftover_locks", FS_FAILED,
            "global locks left: %lld; pending undo_log rows: orders %lld, stock %lld", sc.locks, sc.undo_orders,
            sc.undo_stock);
  else
    inv_set(res, "no_leftover_locks", FS_HOLDS, "no global lock, no pending undo_log row");

  /* Pay, cancel and expiry went out as events: all published, each
   * applied to the stock exactly once (stock_log is unique per order and
   * operation, and totals_conserved counts it), none dead-lettered. */
  res->events = sc.events;
  res->events_unapplied = sc.events_unapplied;
  res->dead_letters = sc.dead_letters;
  if (sc.events_unpublished || sc.events_unapplied != 0 || sc.dead_letters)
    inv_set(res, "events_delivered", FS_FAILED,
            "of %lld order events: %lld unpublished, %lld not applied to the stock; %lld dead letters", sc.events,
            sc.events_unpublished, sc.events_unapplied, sc.dead_letters);
  else
    inv_set(res, "events_delivered", FS_HOLDS, "%lld order events published and applied to the stock once each",
            sc.events);

  /* The downstream consumers (settled above: the loop waited for every
   * effect still to come, i.e. not dead-lettered).  Exactly once is
   * what the group's consumed_event row guarantees; here it is seen from
   * outside, in the effect tables themselves. */
  if (!c->events)
    inv_set(res, "consumers_once", FS_SKIPPED, "EVENTS_PG_URL is not set: no downstream consumers to check");
  else if (!settled_ok)
    inv_set(res, "consumers_once", FS_FAILED, "could not read the downstream effects (see above)");
  else if (sc.ds_wrong || sc.ds_stray || sc.ds_dead)
    inv_set(res, "consumers_once", FS_FAILED,
            "of %lld paid orders %lld lack exactly one points row (qty * 100), one notice and qty tickets"
            " (%lld still missing one); %lld rows for orders that are not paid; %lld dead letters in the events"
            " database",
            sc.ds_paid, sc.ds_wrong, sc.ds_waiting, sc.ds_stray, sc.ds_dead);
  else
    inv_set(res, "consumers_once", FS_HOLDS,
            "%lld paid orders: one points row, one notice and qty tickets each (%lld tickets); none for the"
            " others; no dead letter",
            sc.ds_paid, sc.ds_tickets);

  /* Redis against PostgreSQL: the buckets directly, then everything the
   * prefilter keeps (users' counts, freeze records, deadlines) through a
   * dry-run reconciliation, which compares without changing anything. */
  long long diff_buckets = 0;
  for (long long b = 0; b < nb; b++)
    if (r_stock[b] != stock[b] || r_frozen[b] != frozen[b] || r_sold[b] != sold[b]) diff_buckets++;
  rm_pf_reconcile_t rep = {0};
  int rc = rm_prefilter_reconcile(c->pf, c->stock, a->activity, true, &rep, NULL, NULL);
  if (!redis_ok || rc != 0)
    inv_set(res, "redis_equals_pg", FS_FAILED, "could not compare: %s",
            rc ? rm_prefilter_strerror(rc) : "Redis unreadable");
  else if (diff_buckets || rep.meta || rep.buckets || rep.users || rep.orders || rep.deadlines)
    inv_set(res, "redis_equals_pg", FS_FAILED,
            "buckets differing: %lld; reconciliation would change meta %u, bucket fields %u, users %u, "
            "freeze records %u, deadlines %u",
            diff_buckets, rep.meta, rep.buckets, rep.users, rep.orders, rep.deadlines);
  else
    inv_set(res, "redis_equals_pg", FS_HOLDS,
            "%lld buckets equal; users' counts, freeze records and deadlines equal", nb);

  res->ok = true;
  for (int i = 0; i < res->ninv; i++)
    if (res->inv[i].state == FS_FAILED) res->ok = false;
  free(stock);
}

void fs_print_invariants(const fs_result_t *res, FILE *f) {
  for (int i = 0; i < res->ninv; i++) {
    const fs_invariant_t *v = &res->inv[i];
    fprintf(f, "  %-18s %-7s %s\n", v->name,
            v->state == FS_HOLDS ? "ok" : v->state == FS_FAILED ? "FAILED" : "skipped", v->detail);
  }
}

json_t *fs_invariants_json(const fs_result_t *res) {
  json_t *o = json_object();
  for (int i = 0; i < res->ninv; i++) {
    const fs_invariant_t *v = &res->inv[i];
    json_t *ok = v->state == FS_HOLDS ? json_true() : v->state == FS_FAILED ? json_false() : json_null();
    json_object_set_new(o, v->name, json_pack("{s:o,s:s}", "ok", ok, "detail", v->detail));
  }
  return o;
}

bool fs_created_latency(const char *orders_pg, const long long *ids, const int64_t *sent_ms, size_t n,
                        double bound_s, long long *lat_us, size_t *made, int64_t *last_ms) {
  *made = 0;
  *last_ms = 0;
  if (n == 0) return true;
  PGconn *pg = PQconnectdb(orders_pg);
  if (PQstatus(pg) != CONNECTION_OK) {
    fprintf(stderr, "could not connect to the orders database: %s", PQerrorMessage(pg));
    PQfinish(pg);
    return false;
  }
  char *arr = malloc(n * 21 + 3), *p = arr;
  if (!arr) {
    PQfinish(pg);
    return false;
  }
  *p++ = '{';
  for (size_t i = 0; i < n; i++) p += sprintf(p, "%s%lld", i ? "," : "", ids[i]);
  *p++ = '}';
  *p = '\0';
  const char *pv[1] = {arr};
  int64_t t0 = svc_now_us();
  bool ok = true;
  for (;;) {
    PGresult *r = PQexecParams(pg, "SELECT count(*) FROM trade_order WHERE order_id = ANY($1::bigint[])", 1, NULL,
                               pv, NULL, NULL, 0);
    ok = PQresultStatus(r) == PGRES_TUPLES_OK;
    long long have = ok ? atoll(PQgetvalue(r, 0, 0)) : 0;
    PQclear(r);
    if (!ok || have >= (long long)n || (double)(svc_now_us() - t0) / 1e6 > bound_s) break;
    sleep_ms(100);
  }
  PGresult *r = ok ? PQexecParams(pg,
                                  "SELECT x.i, floor(extract(epoch FROM o.created_at) * 1000)::bigint"
                                  " FROM unnest($1::bigint[]) WITH ORDINALITY AS x(id, i)"
                                  " JOIN trade_order o ON o.order_id = x.id",
                                  1, NULL, pv, NULL, NULL, 0)
                   : NULL;
  ok = r && PQresultStatus(r) == PGRES_TUPLES_OK;
  if (!ok && r) fprintf(stderr, "could not read the queued orders: %s", PQerrorMessage(pg));
  for (int i = 0; ok && i < PQntuples(r); i++) {
    long long k = atoll(PQgetvalue(r, i, 0)) - 1;
    int64_t created = atoll(PQgetvalue(r, i, 1));
    if (k < 0 || (size_t)k >= n) continue;
    lat_us[(*made)++] = (created - sent_ms[k]) * 1000;
    if (created > *last_ms) *last_ms = created;
  }
  PQclear(r);
  PQfinish(pg);
  free(arr);
  svc_sort_ll(lat_us, *made);
  return ok;
}
