/*
 * event_consumers.c - event-consumers of the flash-sale demo: the
 * downstream consumer groups of the order events, on a database of their
 * own (build/bin/event-consumers).
 *
 * NOTES
 *   Three consumer groups of the stream txc:order-events (svc_consumer.h),
 *   one thread each, all on the events database (sql/events/):
 *     points   credits qty * 100 points: one points_ledger row per order;
 *     notify   tells the member: one member_notice row per order and kind
 *              (paid; and waitlist_ordered / waitlist_refused for the
 *              events waitlist.ordered and waitlist.refused); a user
 *              whose account is on hold (a member_hold row) is refused
 *              with SVC_EV_RETRY "account on hold: <reason>": the event is
 *              retried with backoff and, after N deliveries, dead-lettered;
 *              the fix is deleting the hold, then
 *              `txc-events redeliver --group notify ...`;
 *     tickets  issues the tickets: qty issued_ticket rows, seq 1..qty,
 *              each with a code derived from the order and the seq.
 *   A group's effect is one INSERT of rows read from a JSON array, the
 *   same statement for one event (apply) and for all the events of a
 *   consumer transaction (apply_batch); notify's hold check is one read
 *   for them all too.
 *   Each acts on order.paid only; order.cancelled and order.expired have
 *   nothing to do (SVC_EV_DONE, so that they are acknowledged).  A paid
 *   event whose payload lacks what the effect needs (user, qty, activity,
 *   ticket_type) can never be applied: SVC_EV_DEAD, a dead letter at once.
 *
 *   Exactly once per group: svc_consumer writes the group's consumed_event
 *   row (UNIQUE (consumer_group, biz_key)) in the same local transaction
 *   as the effect, with a Redis SET NX mark as the fast path for repeats
 *   and the mark removed after a failure so that the retry gets in; the
 *   effect tables' own keys (one row per order; PRIMARY KEY (order_id,
 *   seq)) would refuse a second copy anyway.  A kill -9 at any point loses
 *   nothing: an uncommitted effect is rolled back by PostgreSQL, the entry
 *   stays pending in the stream, and a consumer of the group (this process
 *   restarted, or another instance) claims it once its backoff passed.
 *   Nothing here reads the orders database: the event carries all a
 *   consumer needs.
 *
 *   HTTP (the services' server, svc_http.h):
 *     GET /healthz  200 {ok, groups: {name: {consumed, retried,
 *                   dead_lettered, redelivered, errors, pending, lag}}}
 *     GET /metrics  Prometheus text: txc_events_consumed_total,
 *                   _retried_total, _dead_lettered_total, ... by group,
 *                   txc_events_consumer_lag and _pending (svc_consumer_metrics)
 *
 *   Settings (environment, as printed by cluster/local/up): EVENTS_PG_URL,
 *   REDIS_URL; EVENTS_LISTEN (host:port, default 127.0.0.1:0 = any free
 *   port), EVENTS_GROUPS (comma-separated subset of points,notify,tickets;
 *   default all three), EVENTS_LOG_LEVEL; the consumer settings
 *   CONSUMER_MAX_DELIVERIES (default 16), CONSUMER_BACKOFF_MS (default
 *   1000,5000,10000,30000,60000,120000,...) and CONSUMER_LINGER_MS
 *   (default 300: after a read that brought events, the next waits until
 *   this long after it; the events of a read share one transaction,
 *   svc_consumer.h); for tests,
 *   EVENTS_APPLY_DELAY_MS (default 0: each apply sleeps this long inside
 *   its transaction, so that a kill lands in the middle of consuming).
 *   --listen and --url-file FILE as for the services.  TX_FAILPOINTS (a
 *   build with failpoints): svc.consumer.after_apply, .after_commit.
 *   SIGTERM/SIGINT: stop serving, let each consumer finish the event in
 *   hand, close, log "event-consumers stopped", exit 0.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "svc_common.h"
#include "svc_consumer.h"
#include "svc_http.h"
#include "svc_redis.h"
#include "txc_failpoint.h"

#define POINTS_PER_TICKET 100

typedef struct ev_ctx {
  int delay_ms; /* EVENTS_APPLY_DELAY_MS */
} ev_ctx_t;

/* What an order.paid event says, from its payload. */
typedef struct paid {
  long long activity, ticket_type, user, qty;
} paid_t;

/* The payload of 'ev' into 'p': false (with 'why') when it lacks a field
 * the effects need, which no retry can mend. */
static bool parse_paid(const svc_event_t *ev, paid_t *p, char *why, size_t whylen) {
  const char *bad = NULL;
  if (!svc_json_int(ev->payload, "activity", 1, INT64_MAX, &p->activity))
    bad = "activity must be a positive integer";
  else if (!svc_json_int(ev->payload, "ticket_type", 0, INT32_MAX, &p->ticket_type))
    bad = "ticket_type must be an integer >= 0";
  else if (!svc_json_int(ev->payload, "user", 1, INT64_MAX, &p->user))
    bad = "user must be a positive integer";
  else if (!svc_json_int(ev->payload, "qty", 1, 10000, &p->qty))
    bad = "qty must be an integer from 1 to 10000";
  if (bad) {
    snprintf(why, whylen, "malformed order.paid payload of order %lld: %s", ev->order_id, bad);
    return false;
  }
  return true;
}

/* The start of every apply: order.paid only, its payload parsed, and the
 * test delay.  Returns false with '*res' set when there is nothing (more)
 * to do. */
static bool paid_event(const svc_event_t *ev, const ev_ctx_t *x, paid_t *p, svc_ev_result_t *res, char *why,
                       size_t whylen) {
  if (strcmp(ev->type, "order.paid") != 0) {
    *res = SVC_EV_DONE; /* cancelled or expired: nothing was credited, noticed or issued */
    return false;
  }
  if (!parse_paid(ev, p, why, whylen)) {
    *res = SVC_EV_DEAD;
    return false;
  }
  if (x->delay_ms > 0) {
    struct timespec ts = {x->delay_ms / 1000, (long)(x->delay_ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
  }
  return true;
}

/*
 * A group's effect is one INSERT of rows read from a JSON array
 * (jsonb_to_recordset), one object per event that has an effect in the
 * group: the same statement for one event (apply) and for the events of
 * one consumer transaction (apply_batch).  Every row has o (the order), u
 * (its user), a (its activity) and e (the event id); each group adds its
 * own fields (row_fn).
 */
typedef json_t *(*row_fn)(const svc_event_t *ev, const paid_t *p);

static json_t *base_row(const svc_event_t *ev, const paid_t *p) {
  return json_pack("{s:I,s:I,s:I,s:I}", "o", (json_int_t)ev->order_id, "u", (json_int_t)p->user, "a",
                   (json_int_t)p->activity, "e", (json_int_t)ev->event_id);
}

/* Group "points": one points_ledger row, qty * POINTS_PER_TICKET. */
static json_t *points_row(const svc_event_t *ev, const paid_t *p) {
  json_t *r = base_row(ev, p);
  if (r) json_object_set_new(r, "pts", json_integer((json_int_t)(p->qty * POINTS_PER_TICKET)));
  return r;
}

/* The events besides order.paid that group "notify" tells the member of:
 * what became of a waiting user, and an order the stock refused. */
static bool is_outcome_event(const svc_event_t *ev) {
  return strncmp(ev->type, "waitlist.", 9) == 0 || strcmp(ev->type, "order.rejected") == 0;
}

/* Group "notify": one member_notice row per order and kind ("paid" for
 * order.paid, "waitlist_ordered" / "waitlist_refused" for what became of a
 * waiting user, "rejected"), unless the member is on hold (the group's
 * hold check, before its INSERT). */
static json_t *notify_row(const svc_event_t *ev, const paid_t *p) {
  const char *kind = !is_outcome_event(ev)                     ? "paid"
                     : strcmp(ev->type, "order.rejected") == 0   ? "rejected"
                     : strcmp(ev->type, "waitlist.ordered") == 0 ? "waitlist_ordered"
                                                                 : "waitlist_refused";
  char text[256];
  const char *s = p->qty == 1 ? "" : "s";
  if (strcmp(kind, "paid") == 0) {
    snprintf(text, sizeof(text), "Payment received for order %lld: %lld ticket%s of activity %lld.", ev->order_id,
             p->qty, s, p->activity);
  } else if (strcmp(kind, "waitlist_ordered") == 0) {
    snprintf(text, sizeof(text),
             "Your wait is over: order %lld holds %lld ticket%s of activity %lld for you; pay it before it expires.",
             ev->order_id, p->qty, s, p->activity);
  } else if (strcmp(kind, "rejected") == 0) {
    /* the first seed's words: a stock error, the order not made, the money back */
    snprintf(text, sizeof(text),
             "Stock error: order %lld for %lld ticket%s of activity %lld could not be made; you have been refunded"
             " in full. (库存异常，抢票未成功，已全额退款)",
             ev->order_id, p->qty, s, p->activity);
  } else {
    const char *reason = json_string_value(json_object_get(ev->payload, "reason"));
    char rs[33];
    /* the reason is a word from order-service; shown only if it is one */
    size_t n = reason ? strspn(reason, "abcdefghijklmnopqrstuvwxyz_") : 0;
    snprintf(rs, sizeof(rs), "%.*s", (int)(reason && n == strlen(reason) && n < sizeof(rs) ? n : 0),
             reason ? reason : "");
    snprintf(text, sizeof(text), "Your wait for %lld ticket%s of activity %lld ended without an order%s%s.", p->qty, s,
             p->activity, rs[0] ? ": " : "", rs);
  }
  json_t *r = base_row(ev, p);
  if (r) {
    json_object_set_new(r, "k", json_string(kind));
    json_object_set_new(r, "t", json_string(text));
  }
  return r;
}

/* Group "tickets": qty issued_ticket rows, seq 1..qty.  The code depends
 * only on the order and the seq, so a ticket is the same whenever (and
 * however often) the event is applied. */
static json_t *tickets_row(const svc_event_t *ev, const paid_t *p) {
  json_t *r = base_row(ev, p);
  if (r) {
    json_object_set_new(r, "tt", json_integer((json_int_t)p->ticket_type));
    json_object_set_new(r, "q", json_integer((json_int_t)p->qty));
  }
  return r;
}

typedef struct group_def {
  const char *name;
  row_fn row;
  const char *insert_sql; /* $1: the rows */
  bool takes_outcomes;    /* also is_outcome_event's events, not only order.paid */
  bool checks_hold;       /* a member on hold: SVC_EV_RETRY, nothing inserted */
  bool row_per_ticket;    /* the INSERT writes qty rows per object, else one */
} group_def_t;

static const group_def_t group_defs[] = {
  {"points", points_row,
   "INSERT INTO points_ledger (order_id, user_id, activity_id, points, event_id)"
   " SELECT r.o, r.u, r.a, r.pts, r.e"
   " FROM pg_catalog.jsonb_to_recordset($1::jsonb) AS r(o bigint, u bigint, a bigint, pts int, e bigint)",
   false, false, false},
  {"notify", notify_row,
   "INSERT INTO member_notice (order_id, user_id, activity_id, kind, text, event_id)"
   " SELECT r.o, r.u, r.a, r.k, r.t, r.e"
   " FROM pg_catalog.jsonb_to_recordset($1::jsonb) AS r(o bigint, u bigint, a bigint, k text, t text, e bigint)",
   true, true, false},
  {"tickets", tickets_row,
   "INSERT INTO issued_ticket (order_id, seq, ticket_code, user_id, activity_id, ticket_type, event_id)"
   " SELECT r.o, g, format('TK%s-%s-%s-%s', r.a, r.o, g, upper(substr(md5(r.o || ':' || g), 1, 6))),"
   " r.u, r.a, r.tt, r.e"
   " FROM pg_catalog.jsonb_to_recordset($1::jsonb) AS r(o bigint, u bigint, a bigint, tt int, q int, e bigint)"
   " CROSS JOIN LATERAL generate_series(1, r.q) g",
   false, false, true},
};
#define NGROUPS (sizeof(group_defs) / sizeof(group_defs[0]))

/* A consumer's 'arg': its group and the service's settings. */
typedef struct group_arg {
  const group_def_t *def;
  const ev_ctx_t *ctx;
} group_arg_t;

/* Group "notify": the first member of 'rows' on hold, if any: SVC_EV_RETRY
 * with the reason (the hold may be lifted; the retries and in the end the
 * dead letter carry it for the operator). */
static svc_ev_result_t hold_check(PGconn *pg, const char *rows, char *why, size_t whylen) {
  const char *p[1] = {rows};
  PGresult *r = NULL;
  if (!svc_pg_exec(pg,
                   "SELECT h.user_id, h.reason FROM member_hold h WHERE h.user_id IN"
                   " (SELECT (x->>'u')::bigint FROM pg_catalog.jsonb_array_elements($1::jsonb) x)"
                   " ORDER BY h.user_id LIMIT 1",
                   1, p, PGRES_TUPLES_OK, &r, why, whylen))
    return SVC_EV_RETRY;
  bool held = PQntuples(r) == 1;
  if (held) snprintf(why, whylen, "account on hold: user %s: %s", PQgetvalue(r, 0, 0), PQgetvalue(r, 0, 1));
  PQclear(r);
  return held ? SVC_EV_RETRY : SVC_EV_DONE;
}

/* The rows of the events that have an effect in group 'g', appended to
 * 'rows', and in '*expect' the rows its INSERT is to write: SVC_EV_DONE,
 * or the answer of an event that cannot be applied. */
static svc_ev_result_t rows_of(const group_arg_t *g, const svc_event_t *const *evs, size_t n, json_t *rows,
                               long long *expect, char *why, size_t whylen) {
  for (size_t i = 0; i < n; i++) {
    paid_t p;
    svc_ev_result_t res = SVC_EV_DONE;
    if (g->def->takes_outcomes && is_outcome_event(evs[i])) {
      /* the same payload as an order's event; the checks of parse_paid */
      if (!parse_paid(evs[i], &p, why, whylen)) return SVC_EV_DEAD;
    } else if (!paid_event(evs[i], g->ctx, &p, &res, why, whylen)) {
      if (res != SVC_EV_DONE) return res;
      continue; /* nothing to do for it */
    }
    if (json_array_append_new(rows, g->def->row(evs[i], &p)) != 0) {
      snprintf(why, whylen, "out of memory");
      return SVC_EV_RETRY;
    }
    *expect += g->def->row_per_ticket ? p.qty : 1;
  }
  return SVC_EV_DONE;
}

/* Every group's apply, for 'n' events in the open transaction: each parsed
 * (and delayed, for the tests) once, the rows of those with an effect in
 * the group, the group's one INSERT of them.  An event that cannot be
 * applied makes the whole call answer for it (alone, as apply, it is
 * retried or dead-lettered; in a batch the consumer then goes one by
 * one). */
static svc_ev_result_t apply_events(PGconn *pg, const svc_event_t *const *evs, size_t n, void *arg, char *why,
                                    size_t whylen) {
  const group_arg_t *g = arg;
  long long expect = 0;
  json_t *rows = json_array();
  svc_ev_result_t res = rows ? rows_of(g, evs, n, rows, &expect, why, whylen) : SVC_EV_RETRY;
  size_t nrows = json_array_size(rows);
  char *js = res == SVC_EV_DONE && nrows > 0 ? json_dumps(rows, JSON_COMPACT) : NULL;
  json_decref(rows);
  if (res != SVC_EV_DONE || (rows && nrows == 0)) {
    if (!rows) snprintf(why, whylen, "out of memory");
    return res;
  }
  if (!js) {
    snprintf(why, whylen, "out of memory");
    return SVC_EV_RETRY;
  }
  if (g->def->checks_hold) res = hold_check(pg, js, why, whylen);
  PGresult *r = NULL;
  const char *p[1] = {js};
  if (res == SVC_EV_DONE && !svc_pg_exec(pg, g->def->insert_sql, 1, p, PGRES_COMMAND_OK, &r, why, whylen))
    res = SVC_EV_RETRY;
  free(js);
  if (res != SVC_EV_DONE) return res;
  long long wrote = atoll(PQcmdTuples(r));
  PQclear(r);
  if (wrote != expect) {
    snprintf(why, whylen, "wrote %lld %s rows instead of %lld (%zu event%s, the first of order %lld)", wrote,
             g->def->name, expect, n, n == 1 ? "" : "s", evs[0]->order_id);
    return SVC_EV_RETRY;
  }
  return SVC_EV_DONE;
}

static svc_ev_result_t apply_group(PGconn *pg, const svc_event_t *ev, void *arg, char *why, size_t whylen) {
  return apply_events(pg, &ev, 1, arg, why, whylen);
}

typedef struct ev_svc {
  svc_consumer_t *cs[NGROUPS];
  size_t n;
} ev_svc_t;

/* ---------------------------------------------------------- handlers */

static void handle_metrics(ev_svc_t *s, svc_resp_t *resp) {
  txc_buf_t b = {0};
  svc_consumer_metrics(s->cs, s->n, &b);
  svc_resp_metrics(resp, &b);
}

static void handle_healthz(ev_svc_t *s, svc_resp_t *resp) {
  json_t *groups = json_object();
  for (size_t i = 0; i < s->n; i++) {
    svc_consumer_stats_t st;
    svc_consumer_stats(s->cs[i], &st);
    json_object_set_new(
      groups, svc_consumer_group(s->cs[i]),
      json_pack("{s:I,s:I,s:I,s:I,s:I,s:I,s:I}", "consumed", (json_int_t)st.consumed, "retried",
                (json_int_t)st.retried, "dead_lettered", (json_int_t)st.dead_lettered, "redelivered",
                (json_int_t)st.redelivered, "errors", (json_int_t)st.errors, "pending", (json_int_t)st.pending,
                "lag", (json_int_t)st.lag));
  }
  svc_resp_json(resp, 200, json_pack("{s:b,s:o}", "ok", 1, "groups", groups));
}

/* The routes (svc_http.h), as examples/openapi/event-consumers.yaml
 * describes them; `event-consumers --routes` prints them. */
enum { OP_METRICS, OP_HEALTHZ };
static const svc_route_t routes[] = {{"GET", "/metrics", OP_METRICS}, {"GET", "/healthz", OP_HEALTHZ}};

static void handler(const svc_req_t *req, svc_resp_t *resp, void *arg) {
  ev_svc_t *s = arg;
  int op;
  long long id;
  if (!svc_route_or_reply(routes, sizeof(routes) / sizeof(routes[0]), req, resp, &op, &id)) return;
  if (op == OP_METRICS)
    handle_metrics(s, resp);
  else
    handle_healthz(s, resp);
}

/* EVENTS_GROUPS "points,tickets" into 'want' (indexes of group_defs).
 * false (logged) on an unknown or repeated name, or none. */
static bool parse_groups(const char *spec, bool want[NGROUPS]) {
  char buf[256];
  if (strlen(spec) >= sizeof(buf)) {
    svc_error("invalid EVENTS_GROUPS: longer than %zu bytes", sizeof(buf) - 1);
    return false;
  }
  snprintf(buf, sizeof(buf), "%s", spec);
  size_t n = 0;
  for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
    size_t k = 0;
    while (k < NGROUPS && strcmp(group_defs[k].name, t) != 0) k++;
    if (k == NGROUPS || want[k]) {
      svc_error("invalid EVENTS_GROUPS \"%s\": %s \"%s\" (expected a comma-separated subset of points,notify,tickets)",
                spec, k == NGROUPS ? "unknown group" : "repeated group", t);
      return false;
    }
    want[k] = true;
    n++;
  }
  if (n == 0) svc_error("invalid EVENTS_GROUPS \"%s\": no group", spec);
  return n > 0;
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: event-consumers [--listen HOST:PORT] [--url-file FILE] | --routes\n"
          "\n"
          "The downstream consumer groups of the order events: points, notify and tickets\n"
          "(see examples/event_consumers.c), on their own database.\n"
          "Environment: EVENTS_PG_URL, REDIS_URL (from cluster/local/up), EVENTS_LISTEN,\n"
          "EVENTS_GROUPS (default points,notify,tickets), EVENTS_LOG_LEVEL, CONSUMER_MAX_DELIVERIES\n"
          "(default 16), CONSUMER_BACKOFF_MS (default 1000,5000,10000,...), CONSUMER_LINGER_MS (default 300),\n"
          "EVENTS_APPLY_DELAY_MS (tests).\n"
          "Dead letters: build/bin/txc-events list | redeliver | stats.\n"
          "--routes prints the routes it serves (METHOD PATH), as examples/openapi/event-consumers.yaml describes them.\n");
}

int main(int argc, char **argv) {
  svc_main_t m;
  int early = svc_main_start(&m, "event-consumers", "EVENTS", argc, argv, routes,
                             sizeof(routes) / sizeof(routes[0]), usage);
  if (early >= 0) return early;
  bool ok = true;
  ev_ctx_t ctx = {.delay_ms = (int)svc_env_int("EVENTS_APPLY_DELAY_MS", 0, 0, 10000, &ok)};
  const char *pg_url = svc_env_str("EVENTS_PG_URL", NULL), *redis_url = svc_redis_env_url();
  bool want[NGROUPS] = {false};
  if (!parse_groups(svc_env_str("EVENTS_GROUPS", "points,notify,tickets"), want)) ok = false;
  if (!pg_url) {
    svc_error("EVENTS_PG_URL is not set (it is printed by cluster/local/up)");
    ok = false;
  }
  if (!redis_url) {
    svc_error("REDIS_URL is not set (it is printed by cluster/local/up)");
    ok = false;
  }
  char err[512];
  if (txc_failpoint_compiled() && txc_failpoint_arm_env(err, sizeof(err)) != 0) {
    svc_error("invalid TX_FAILPOINTS: %s", err);
    ok = false;
  }
  if (!ok) return 78;

  svc_block_signals();
  int exit_code = 0;
  ev_svc_t s = {0};
  svc_http_t *http = NULL;
  svc_auth_t *auth = NULL;
  if (!svc_service_key(&auth)) {
    exit_code = 78;
    goto out;
  }
  group_arg_t group_args[NGROUPS];
  for (size_t k = 0; k < NGROUPS; k++) {
    if (!want[k]) continue;
    group_args[k] = (group_arg_t){.def = &group_defs[k], .ctx = &ctx};
    svc_consumer_opts_t co = {.redis_url = redis_url, .pg_url = pg_url, .group = group_defs[k].name,
                              .apply = apply_group, .apply_batch = apply_events, .arg = &group_args[k],
                              .auth = auth};
    if (!(s.cs[s.n] = svc_consumer_start(&co, err, sizeof(err)))) {
      svc_error("could not start consumer group \"%s\": %s", group_defs[k].name, err);
      exit_code = 78;
      goto out;
    }
    s.n++;
  }
  http = svc_http_start(m.listen, 1, 2, handler, &s, err, sizeof(err));
  if (!http) {
    svc_error("%s", err);
    exit_code = 69;
    goto out;
  }
  char names[64] = "";
  for (size_t i = 0; i < s.n; i++)
    snprintf(names + strlen(names), sizeof(names) - strlen(names), "%s%s", i ? "," : "",
             svc_consumer_group(s.cs[i]));
  exit_code = svc_main_serve(&m, http, json_pack("{s:s,s:i}", "groups", names, "apply_delay_ms", ctx.delay_ms));

out:
  svc_http_stop(http);
  for (size_t i = 0; i < s.n; i++) svc_consumer_stop(s.cs[i]);
  svc_auth_free(auth);
  if (exit_code == 0) svc_info("event-consumers stopped");
  return exit_code;
}
