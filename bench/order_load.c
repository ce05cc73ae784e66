/*
 * order_load.c - sustained order load on order-service (build/bin/order-load),
 * the driver of the flash-sale benchmarks (bench/flashsale-bench).
 *
 * NOTES
 *   Closed loop: --connections requests are always in flight; each answer
 *   sends the next POST /orders at once, for --warmup then --duration
 *   seconds (only the second period is measured).  Every request is a new
 *   user buying one ticket of a fresh activity with far more tickets than
 *   the run can sell (--tickets, default 10 million), so nothing is
 *   refused for stock or limit reasons and every request runs the whole
 *   purchase: prefilter, global transaction, both branches.  --buckets
 *   sets how many bucket rows the stock is split into: the hot-row
 *   benchmark's variable.
 *
 *   --mode (default buy) chooses what is measured:
 *     buy     the POST /orders above;
 *     cancel  each connection buys, then cancels what it bought, then buys
 *             again...: every cancel gives a ticket back to a bucket
 *             others freeze at the same moment (with --buckets 1, one hot
 *             row): a local transaction of the orders database with its
 *             outbox event, applied to the bucket by stock-service's
 *             consumer a moment later; measured: the cancels
 *             (POST /orders/{id}/cancel answered 200), "cancels_per_s" and
 *             their latency, and the buys in between ("orders_per_s");
 *     expire  --orders N are bought first (not measured), then made
 *             overdue at once (their expire_at set in the past in the
 *             orders database), and the time until order-service's expiry
 *             job has expired every one is measured: "expiries_per_s"
 *             (its passes run every ORDER_EXPIRY_INTERVAL_MS, 100 orders a
 *             pass, one local transaction with its event an order; the
 *             stock follows through the consumer).
 *
 *   One thread, one libcurl multi handle (keep-alive connections); the
 *   loop waits in curl_multi_poll.
 *
 *   Against order-service in ORDER_MODE=queued, buy mode counts the 202
 *   answers (the queue took the order) as the answers they are, and then
 *   waits for the orders themselves: "created_p50_ms" / "created_p99_ms"
 *   time each from its click to its trade_order row (created_at, the same
 *   host's clock), "drain_s" how long after the measured period the last
 *   one came, "created_per_s" the orders made over the period and the
 *   drain.
 *
 *   Environment: ORDER_URL, STOCK_PG_URL, ORDERS_PG_URL, TC_PG_URL,
 *   REDIS_URL (as for flashsale).  The last line printed is one JSON
 *   object: {"orders_per_s", "p50_ms", "p95_ms", "p99_ms", "ok", "errors",
 *   "connections", "buckets", "duration_s", ...}.  Exit status 0, or 1
 *   when more than 1% of the measured requests failed, 2 usage, 3 could
 *   not run.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <curl/curl.h>
#include <jansson.h>
#include <libpq-fe.h>
#include <time.h>

#include "budget.h"
#include "fs_check.h"
#include "svc_common.h"

typedef enum { MODE_BUY, MODE_CANCEL, MODE_EXPIRE } load_mode_t;

typedef struct conn {
  CURL *e;
  int64_t start_us;
  int64_t start_wall_ms;
  char body[160];
  char url[512];
  long long user;
  bool cancelling;  /* cancel mode: this request is the cancel */
  char resp[1024];  /* the answer's body (cut at the buffer's size) */
  size_t rlen;
  char token[72];   /* the order_token of the order to cancel */
  struct curl_slist *cancel_hdrs; /* the headers with its Authorization */
} conn_t;

typedef struct load {
  load_mode_t mode;
  const char *url;
  long long activity;
  int connections;
  double warmup_s, duration_s;
  CURLM *multi;
  struct curl_slist *hdrs;
  conn_t *conns;
  long long next_user;
  int64_t t0, measure_from, measure_to;
  long long ok, errors, sold_out, first_status;
  long long bought;   /* cancel mode: the buys between the cancels; expire mode: orders made */
  long long to_buy;   /* expire mode: stop once this many were bought */
  char first_error[256];
  long long *lat;
  size_t nlat, cap;
  /* buy mode against ORDER_MODE=queued: the measured 202 answers' orders
   * and when they were sent (unix ms), to time them until created */
  long long *queued_ids;
  int64_t *queued_sent_ms;
  size_t nqueued, qcap;
} load_t;

static int64_t wall_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static size_t keep_body(char *p, size_t s, size_t n, void *ud) {
  conn_t *c = ud;
  size_t len = s * n, room = sizeof(c->resp) - 1 - c->rlen;
  memcpy(c->resp + c->rlen, p, len < room ? len : room);
  c->rlen += len < room ? len : room;
  c->resp[c->rlen] = '\0';
  return len;
}

/* The next request of 'c': a buy, or (cancel mode, after a buy that was
 * answered 201 with 'order_id') the cancel of that order. */
static void send_one(load_t *l, conn_t *c, long long cancel_id) {
  c->rlen = 0;
  c->resp[0] = '\0';
  c->cancelling = cancel_id > 0;
  curl_slist_free_all(c->cancel_hdrs);
  c->cancel_hdrs = NULL;
  if (c->cancelling) {
    snprintf(c->url, sizeof(c->url), "%s/orders/%lld/cancel", l->url, cancel_id);
    snprintf(c->body, sizeof(c->body), "{}");
    if (c->token[0]) {
      char h[96];
      snprintf(h, sizeof(h), "Authorization: Bearer %s", c->token);
      for (const struct curl_slist *x = l->hdrs; x; x = x->next) c->cancel_hdrs = curl_slist_append(c->cancel_hdrs, x->data);
      c->cancel_hdrs = curl_slist_append(c->cancel_hdrs, h);
    }
  } else {
    c->user = ++l->next_user;
    snprintf(c->url, sizeof(c->url), "%s/orders", l->url);
    snprintf(c->body, sizeof(c->body), "{\"activity\":%lld,\"ticket_type\":1,\"user\":%lld,\"qty\":1}",
             l->activity, c->user);
  }
  curl_easy_setopt(c->e, CURLOPT_URL, c->url);
  curl_easy_setopt(c->e, CURLOPT_POSTFIELDS, c->body);
  curl_easy_setopt(c->e, CURLOPT_HTTPHEADER, c->cancel_hdrs ? c->cancel_hdrs : l->hdrs);
  c->start_us = svc_now_us();
  c->start_wall_ms = wall_ms();
  curl_multi_add_handle(l->multi, c->e);
}

/* The order id of a 201 answer, or 0; its order_token into c->token. */
static long long answered_order(conn_t *c) {
  json_error_t je;
  json_t *j = json_loadb(c->resp, c->rlen, 0, &je);
  long long id = j ? (long long)json_integer_value(json_object_get(j, "order_id")) : 0;
  const char *tok = json_string_value(json_object_get(j, "order_token"));
  snprintf(c->token, sizeof(c->token), "%s", tok && strlen(tok) < sizeof(c->token) ? tok : "");
  json_decref(j);
  return id;
}

/* Expire mode: make the activity's unpaid orders overdue, then wait until
 * none is left unpaid; the seconds that took, or -1. */
static double expire_all(const fs_env_t *env, long long activity, long long n, double bound_s) {
  PGconn *pg = PQconnectdb(env->orders_pg);
  if (PQstatus(pg) != CONNECTION_OK) {
    fprintf(stderr, "order-load: could not connect to the orders database: %s", PQerrorMessage(pg));
    PQfinish(pg);
    return -1;
  }
  char a[32];
  snprintf(a, sizeof(a), "%lld", activity);
  const char *p[1] = {a};
  PGresult *r = PQexecParams(pg,
                             "UPDATE trade_order SET expire_at = now() - interval '1 second'"
                             " WHERE activity_id = $1 AND status = 'UNPAID'",
                             1, NULL, p, NULL, NULL, 0);
  bool ok = PQresultStatus(r) == PGRES_COMMAND_OK;
  long long made = ok ? atoll(PQcmdTuples(r)) : 0;
  PQclear(r);
  int64_t t0 = svc_now_us();
  double took = -1;
  printf("order-load: %lld orders made overdue (of %lld bought)\n", made, n);
  fflush(stdout);
  while (ok && (double)(svc_now_us() - t0) / 1e6 < bound_s) {
    r = PQexecParams(pg, "SELECT count(*) FROM trade_order WHERE activity_id = $1 AND status = 'UNPAID'", 1, NULL, p,
                     NULL, NULL, 0);
    ok = PQresultStatus(r) == PGRES_TUPLES_OK;
    long long left = ok ? atoll(PQgetvalue(r, 0, 0)) : -1;
    PQclear(r);
    if (left == 0) {
      took = (double)(svc_now_us() - t0) / 1e6;
      break;
    }
    struct timespec ts = {0, 50 * 1000000L};
    nanosleep(&ts, NULL);
  }
  PQfinish(pg);
  return took;
}


static void usage(FILE *f) {
  fprintf(f, "usage: order-load [--connections N] [--duration S] [--warmup S] [--buckets N] [--tickets N]\n"
             "                  [--mode buy|cancel|expire] [--orders N] [--label TEXT] [--json FILE]\n"
             "Sustained POST /orders load on ORDER_URL (see bench/order_load.c).\n");
}

int main(int argc, char **argv) {
  static const struct option lo[] = {{"connections", required_argument, NULL, 'c'},
                                     {"duration", required_argument, NULL, 'd'},
                                     {"warmup", required_argument, NULL, 'w'},
                                     {"buckets", required_argument, NULL, 'b'},
                                     {"tickets", required_argument, NULL, 't'},
                                     {"label", required_argument, NULL, 'l'},
                                     {"mode", required_argument, NULL, 'm'},
                                     {"orders", required_argument, NULL, 'o'},
                                     {"json", required_argument, NULL, 'j'},
                                     {"help", no_argument, NULL, 'h'},
                                     {NULL, 0, NULL, 0}};
  load_t l = {.connections = 32, .warmup_s = 3, .duration_s = 10};
  long long buckets = 5, tickets = 10000000, v, orders = 2000;
  const char *label = "", *json_path = NULL;
  int c;
  while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
    bool ok = true;
    switch (c) {
    case 'c': ok = svc_parse_ll(optarg, 1, 4096, &v); l.connections = (int)v; break;
    case 'd': ok = svc_parse_ll(optarg, 1, 3600, &v); l.duration_s = (double)v; break;
    case 'w': ok = svc_parse_ll(optarg, 0, 3600, &v); l.warmup_s = (double)v; break;
    case 'b': ok = svc_parse_ll(optarg, 1, 10000, &buckets); break;
    case 't': ok = svc_parse_ll(optarg, 1, 1000000000, &tickets); break;
    case 'l': label = optarg; break;
    case 'm':
      ok = strcmp(optarg, "buy") == 0 || strcmp(optarg, "cancel") == 0 || strcmp(optarg, "expire") == 0;
      l.mode = optarg[0] == 'b' ? MODE_BUY : optarg[0] == 'c' ? MODE_CANCEL : MODE_EXPIRE;
      break;
    case 'o': ok = svc_parse_ll(optarg, 1, 10000000, &orders); break;
    case 'j': json_path = optarg; break;
    case 'h': usage(stdout); return 0;
    default: usage(stderr); return 2;
    }
    if (!ok) {
      fprintf(stderr, "order-load: invalid value \"%s\"\n", optarg);
      return 2;
    }
  }
  svc_log_init("order-load", "ORDER_LOAD_LOG_LEVEL");
  fs_env_t env;
  if (!fs_env_load(&env)) return 3;
  l.url = env.order_url;
  fs_check_t *ck = fs_check_new(&env);
  if (!ck) return 3;
  fs_activity_t act = {.ticket_type = 1, .tickets = tickets, .buckets = buckets, .limit = 1};
  char err[512];
  if (!fs_seed(ck, &act, err, sizeof(err))) {
    fprintf(stderr, "order-load: could not seed: %s\n", err);
    fs_check_free(ck);
    return 3;
  }
  fs_check_free(ck);
  l.activity = act.activity;
  /* users are unique per activity: their ids need not be */
  if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) return 3;
  l.multi = curl_multi_init();
  curl_multi_setopt(l.multi, CURLMOPT_MAX_TOTAL_CONNECTIONS, (long)l.connections);
  curl_multi_setopt(l.multi, CURLMOPT_MAXCONNECTS, (long)l.connections);
  l.hdrs = curl_slist_append(NULL, "Content-Type: application/json");
  l.hdrs = curl_slist_append(l.hdrs, "Expect:");
  l.conns = calloc((size_t)l.connections, sizeof(conn_t));
  for (int i = 0; i < l.connections; i++) {
    conn_t *k = &l.conns[i];
    k->e = curl_easy_init();
    curl_easy_setopt(k->e, CURLOPT_HTTPHEADER, l.hdrs);
    curl_easy_setopt(k->e, CURLOPT_WRITEFUNCTION, keep_body);
    curl_easy_setopt(k->e, CURLOPT_WRITEDATA, k);
    curl_easy_setopt(k->e, CURLOPT_PRIVATE, k);
    curl_easy_setopt(k->e, CURLOPT_TIMEOUT_MS, 30000L);
    curl_easy_setopt(k->e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(k->e, CURLOPT_TCP_NODELAY, 1L);
  }
  static const char *const mode_names[] = {"buy", "cancel", "expire"};
  printf("order-load%s%s: mode %s, activity %lld, %lld buckets, %d connections, warm-up %.0fs, measured %.0fs\n",
         *label ? " " : "", label, mode_names[l.mode], l.activity, buckets, l.connections, l.warmup_s,
         l.mode == MODE_EXPIRE ? 0.0 : l.duration_s);
  fflush(stdout);
  l.t0 = svc_now_us();
  l.measure_from = l.t0 + (int64_t)(l.warmup_s * 1e6);
  l.measure_to = l.measure_from + (int64_t)(l.duration_s * 1e6);
  if (l.mode == MODE_EXPIRE) { /* buy 'orders', measure nothing yet */
    l.to_buy = orders;
    l.measure_from = l.measure_to = INT64_MAX;
  }
  for (int i = 0; i < l.connections; i++) send_one(&l, &l.conns[i], 0);
  int inflight = l.connections;
  int64_t next_progress = l.t0 + 1000000;
  budget_sample_t cpu0, cpu1; /* the budget at the start and the end of the measured period */
  bool cpu_started = false, cpu_done = false;
  long long last_ok = 0;
  while (inflight > 0) {
    int running;
    curl_multi_perform(l.multi, &running);
    CURLMsg *m;
    int left;
    while ((m = curl_multi_info_read(l.multi, &left))) {
      if (m->msg != CURLMSG_DONE) continue;
      conn_t *k = NULL;
      curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&k);
      int64_t now = svc_now_us();
      long status = 0;
      if (m->data.result == CURLE_OK) curl_easy_getinfo(k->e, CURLINFO_RESPONSE_CODE, &status);
      curl_multi_remove_handle(l.multi, k->e);
      long long cancel_id = 0;
      if (l.mode == MODE_CANCEL && !k->cancelling && status == 201) cancel_id = answered_order(k);
      if (l.mode != MODE_BUY && !k->cancelling && status == 201) l.bought++;
      if (l.mode == MODE_EXPIRE && status != 201) l.errors++; /* nothing is "measured" while buying */
      /* cancel mode measures the cancels; the buys between them are counted */
      bool measured = k->start_us >= l.measure_from && now <= l.measure_to &&
                      (l.mode != MODE_CANCEL || k->cancelling || status != 201);
      if (measured) {
        bool queued = l.mode == MODE_BUY && status == 202;
        if (queued) {
          long long id = answered_order(k);
          if (id > 0) {
            if (l.nqueued == l.qcap) {
              l.qcap = l.qcap ? l.qcap * 2 : 4096;
              l.queued_ids = realloc(l.queued_ids, l.qcap * sizeof(long long));
              l.queued_sent_ms = realloc(l.queued_sent_ms, l.qcap * sizeof(int64_t));
              if (!l.queued_ids || !l.queued_sent_ms) {
                fprintf(stderr, "order-load: out of memory\n");
                return 3;
              }
            }
            l.queued_ids[l.nqueued] = id;
            l.queued_sent_ms[l.nqueued++] = k->start_wall_ms;
          }
        }
        if (status == (k->cancelling ? 200 : 201) || queued) {
          l.ok++;
          if (l.nlat == l.cap) {
            l.cap = l.cap ? l.cap * 2 : 4096;
            l.lat = realloc(l.lat, l.cap * sizeof(long long));
          }
          l.lat[l.nlat++] = now - k->start_us;
        } else {
          l.errors++;
          if (status == 409) l.sold_out++;
          if (!l.first_error[0])
            snprintf(l.first_error, sizeof(l.first_error), "HTTP %ld %s", status,
                     m->data.result == CURLE_OK ? "" : curl_easy_strerror(m->data.result));
        }
      }
      bool more = l.mode == MODE_EXPIRE ? l.bought + inflight - 1 < l.to_buy && l.errors < l.to_buy
                                        : now < l.measure_to;
      if (more || cancel_id > 0) /* a bought order is always cancelled: none is left behind */
        send_one(&l, k, cancel_id);
      else
        inflight--;
    }
    int64_t now = svc_now_us();
    if (!cpu_started && now >= l.measure_from) {
      cpu_started = true;
      budget_sample(&cpu0);
    }
    if (cpu_started && !cpu_done && now >= l.measure_to) {
      budget_sample(&cpu1);
      cpu_done = true;
    }
    if (now >= next_progress) {
      if (now > l.measure_from && now <= l.measure_to + 1000000) {
        printf("  [%5.1fs] %lld orders/s, errors %lld\n", (double)(now - l.t0) / 1e6, l.ok - last_ok, l.errors);
        fflush(stdout);
      }
      last_ok = l.ok;
      next_progress += 1000000;
    }
    curl_multi_poll(l.multi, NULL, 0, 100, NULL);
  }
  svc_sort_ll(l.lat, l.nlat);
  double tps = (double)l.ok / l.duration_s;
  double expire_s = -1;
  if (l.mode == MODE_EXPIRE) {
    expire_s = expire_all(&env, l.activity, l.bought, 600);
    tps = 0;
  }
  json_t *j = json_pack("{s:s,s:s,s:I,s:i,s:f,s:f,s:f,s:f,s:f,s:I,s:I,s:f}", "label", label, "mode",
                        mode_names[l.mode], "buckets", (json_int_t)buckets, "connections", l.connections,
                        "orders_per_s", l.mode == MODE_CANCEL ? (double)l.bought / l.duration_s : tps, "p50_ms",
                        svc_pct_ms(l.lat, l.nlat, 50), "p95_ms", svc_pct_ms(l.lat, l.nlat, 95), "p99_ms", svc_pct_ms(l.lat, l.nlat, 99),
                        "duration_s", l.duration_s, "ok", (json_int_t)l.ok, "errors", (json_int_t)l.errors,
                        "error_pct", l.ok + l.errors ? 100.0 * (double)l.errors / (double)(l.ok + l.errors) : 0.0);
  if (l.mode == MODE_CANCEL) json_object_set_new(j, "cancels_per_s", json_real(tps));
  if (l.mode == MODE_EXPIRE) {
    json_object_set_new(j, "orders", json_integer(l.bought));
    json_object_set_new(j, "expire_s", json_real(expire_s));
    json_object_set_new(j, "expiries_per_s", json_real(expire_s > 0 ? (double)l.bought / expire_s : 0));
  }
  if (l.nqueued) {
    /* the queued order mode: the answers were the queue's; the orders
     * themselves came later, timed from the click to their row */
    long long *clat = malloc(l.nqueued * sizeof(long long));
    size_t made = 0;
    int64_t last_ms = 0;
    if (clat && fs_created_latency(env.orders_pg, l.queued_ids, l.queued_sent_ms, l.nqueued, 300, clat, &made,
                                   &last_ms)) {
      /* how long after the measured period the last order came */
      int64_t end_wall_ms = wall_ms() - (svc_now_us() - l.measure_to) / 1000;
      double drain_s = made ? (last_ms > end_wall_ms ? (double)(last_ms - end_wall_ms) / 1000.0 : 0) : -1;
      json_object_set_new(j, "queued", json_integer((json_int_t)l.nqueued));
      json_object_set_new(j, "created", json_integer((json_int_t)made));
      json_object_set_new(j, "created_p50_ms", json_real(svc_pct_ms(clat, made, 50)));
      json_object_set_new(j, "created_p99_ms", json_real(svc_pct_ms(clat, made, 99)));
      json_object_set_new(j, "created_max_ms", json_real(made ? (double)clat[made - 1] / 1000.0 : 0));
      json_object_set_new(j, "drain_s", json_real(drain_s));
      json_object_set_new(j, "created_per_s",
                          json_real(drain_s >= 0 ? (double)made / (l.duration_s + drain_s) : 0));
    }
    free(clat);
  }
  if (l.first_error[0]) json_object_set_new(j, "first_error", json_string(l.first_error));
  json_t *budget = cpu_done ? budget_json(&cpu0, &cpu1, l.ok) : NULL;
  if (budget) {
    /* cpu_ms_per_order: the key the benchmarks read since the start */
    json_t *cpu = json_object_get(budget, "cpu_ms");
    if (cpu) json_object_set(j, "cpu_ms_per_order", cpu);
    json_object_set_new(j, "budget_per_order", budget);
  }
  char *s = json_dumps(j, JSON_COMPACT);
  printf("%s\n", s);
  if (json_path) json_dump_file(j, json_path, JSON_INDENT(2));
  bool bad = l.errors * 100 > l.ok + l.errors;
  free(s);
  json_decref(j);
  for (int i = 0; i < l.connections; i++) {
    curl_easy_cleanup(l.conns[i].e);
    curl_slist_free_all(l.conns[i].cancel_hdrs);
  }
  free(l.conns);
  free(l.lat);
  free(l.queued_ids);
  free(l.queued_sent_ms);
  curl_slist_free_all(l.hdrs);
  curl_multi_cleanup(l.multi);
  curl_global_cleanup();
  return bad ? 1 : 0;
}
