/*
 * stock_window.c - stock-service's sale-window job (stock_window.h says
 * what a pass does and why).
 */
#include "stock_window.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "svc_redis.h"
#include "txc_worker.h"

/* Activities whose Redis copy each pass keeps in line: not ended, or
 * ended this recently. */
#define SYNC_RECENT "interval '10 minutes'"

struct stock_window {
  const char *pg_url, *redis_url; /* borrowed: the environment's */
  int64_t interval_ms;
  txc_worker_t job;
  /* Under job.mu: the counters of /metrics. */
  unsigned long long passes[3]; /* ok, skipped (another instance), failed */
  unsigned long long opened, closed, redis_updates, redis_errors;
  /* The job thread's own. */
  PGconn *pg;
  redisContext *redis;
  bool redis_failing; /* log a Redis failure once per streak */
};

enum { PASS_OK, PASS_SKIPPED, PASS_FAILED };

/* Step 2: move every activity forward to what its window says now, and
 * log each change.  false with 'err' set when the statement failed. */
static bool flip_statuses(stock_window_t *w, char *err, size_t errlen) {
  PGresult *r = NULL;
  if (!svc_pg_exec(w->pg,
                   "WITH due AS ("
                   "  SELECT activity_id, CASE WHEN now() < starts_at THEN 0 WHEN now() < ends_at THEN 1 ELSE 2 END"
                   "         AS want"
                   "    FROM activity WHERE status < 2)"
                   " UPDATE activity a SET status = due.want FROM due"
                   "  WHERE a.activity_id = due.activity_id AND due.want > a.status"
                   " RETURNING a.activity_id, a.status, a.starts_at, a.ends_at,"
                   "  floor(extract(epoch FROM now() - CASE a.status WHEN 1 THEN a.starts_at ELSE a.ends_at END)"
                   "        * 1000)::bigint",
                   0, NULL, PGRES_TUPLES_OK, &r, err, errlen))
    return false;
  for (int i = 0; i < PQntuples(r); i++) {
    long long id = atoll(PQgetvalue(r, i, 0)), late = atoll(PQgetvalue(r, i, 4));
    bool open = strcmp(PQgetvalue(r, i, 1), "1") == 0;
    SVC_LOG(SVC_LOG_INFO,
            json_pack("{s:I,s:i,s:s,s:s,s:I}", "activity", (json_int_t)id, "status", open ? 1 : 2, "starts_at",
                      PQgetvalue(r, i, 2), "ends_at", PQgetvalue(r, i, 3), "late_ms", (json_int_t)late),
            "sale of activity %lld %s", id, open ? "opened" : "closed");
    pthread_mutex_lock(&w->job.mu);
    if (open)
      w->opened++;
    else
      w->closed++;
    pthread_mutex_unlock(&w->job.mu);
  }
  PQclear(r);
  return true;
}

/* Step 3: the meta hashes of the recent activities follow PostgreSQL.
 * false when Redis failed (the next pass tries again). */
static bool sync_redis(stock_window_t *w) {
  char err[512];
  if (!w->redis_url) return true;
  PGresult *r = NULL;
  if (!svc_pg_exec(w->pg,
                   "SELECT activity_id, status, floor(extract(epoch FROM starts_at) * 1000)::bigint,"
                   " floor(extract(epoch FROM ends_at) * 1000)::bigint FROM activity"
                   " WHERE status < 2 OR ends_at > now() - " SYNC_RECENT " ORDER BY activity_id",
                   0, NULL, PGRES_TUPLES_OK, &r, err, sizeof(err))) {
    svc_warn("sale window: could not read the activities: %s", err);
    return false;
  }
  bool ok = true;
  unsigned long long updates = 0;
  if (svc_redis_ensure(&w->redis, w->redis_url, 2000, err, sizeof(err)) == 0) {
    ok = false;
  } else {
    for (int i = 0; i < PQntuples(r) && ok; i++) {
      const char *id = PQgetvalue(r, i, 0), *st = PQgetvalue(r, i, 1), *starts = PQgetvalue(r, i, 2),
                 *ends = PQgetvalue(r, i, 3);
      char key[64];
      snprintf(key, sizeof(key), "{act_%s}:meta", id);
      redisReply *m = svc_redis_cmd(w->redis, err, sizeof(err), "HMGET %s status starts ends", key);
      if (!m) {
        ok = false;
        break;
      }
      bool loaded = m->type == REDIS_REPLY_ARRAY && m->elements == 3 && m->element[0]->type == REDIS_REPLY_STRING;
      bool same = loaded && strcmp(m->element[0]->str, st) == 0 && m->element[1]->type == REDIS_REPLY_STRING &&
                  strcmp(m->element[1]->str, starts) == 0 && m->element[2]->type == REDIS_REPLY_STRING &&
                  strcmp(m->element[2]->str, ends) == 0;
      freeReplyObject(m);
      if (!loaded || same) continue; /* not loaded: the prefilter's seed will copy all of it */
      redisReply *h = svc_redis_cmd(w->redis, err, sizeof(err), "HSET %s status %s starts %s ends %s", key, st,
                                    starts, ends);
      if (!h) {
        ok = false;
        break;
      }
      freeReplyObject(h);
      updates++;
      SVC_LOG(SVC_LOG_INFO, json_pack("{s:s,s:s}", "activity", id, "status", st),
              "sale window: Redis status of activity %s set to %s", id, st);
    }
  }
  PQclear(r);
  pthread_mutex_lock(&w->job.mu);
  w->redis_updates += updates;
  if (!ok) w->redis_errors++;
  pthread_mutex_unlock(&w->job.mu);
  if (!ok && !w->redis_failing)
    svc_warn("sale window: could not update Redis: %s (tried again every pass)", err);
  else if (ok && w->redis_failing)
    svc_info("sale window: Redis updated again");
  w->redis_failing = !ok;
  return ok;
}

/* Step 4: milliseconds until the next starts_at or ends_at to come, at
 * most the interval. */
static int64_t next_wait_ms(stock_window_t *w) {
  PGresult *r = NULL;
  char err[256];
  int64_t wait = w->interval_ms;
  if (!svc_pg_exec(w->pg,
                   "SELECT ceil(extract(epoch FROM min(CASE WHEN starts_at > now() THEN starts_at ELSE ends_at END)"
                   " - now()) * 1000)::bigint FROM activity WHERE status < 2 AND ends_at > now()",
                   0, NULL, PGRES_TUPLES_OK, &r, err, sizeof(err)))
    return wait;
  if (PQntuples(r) == 1 && !PQgetisnull(r, 0, 0)) {
    int64_t d = atoll(PQgetvalue(r, 0, 0)) + 1;
    if (d < 1) d = 1;
    if (d < wait) wait = d;
  }
  PQclear(r);
  return wait;
}

static int run_pass(stock_window_t *w, int64_t *wait_ms) {
  char err[512];
  *wait_ms = w->interval_ms;
  if (!svc_pg_ensure(&w->pg, w->pg_url, "the stock database", err, sizeof(err))) {
    svc_warn("sale window: %s", err);
    return PASS_FAILED;
  }
  PGresult *r = NULL;
  if (!svc_pg_exec(w->pg, "SELECT pg_try_advisory_lock(" STOCK_WINDOW_LOCK_KEY ")", 0, NULL, PGRES_TUPLES_OK, &r,
                   err, sizeof(err))) {
    svc_warn("sale window: %s", err);
    return PASS_FAILED;
  }
  bool locked = strcmp(PQgetvalue(r, 0, 0), "t") == 0;
  PQclear(r);
  if (!locked) return PASS_SKIPPED; /* another instance's pass */
  int rc = PASS_OK;
  if (!flip_statuses(w, err, sizeof(err))) {
    svc_warn("sale window: could not move the activities' status: %s", err);
    rc = PASS_FAILED;
  }
  if (!sync_redis(w)) rc = PASS_FAILED;
  *wait_ms = next_wait_ms(w);
  PQclear(PQexec(w->pg, "SELECT pg_advisory_unlock(" STOCK_WINDOW_LOCK_KEY ")"));
  return rc;
}

static void *window_main(void *arg) {
  stock_window_t *w = arg;
  int64_t wait_ms;
  do {
    int rc = run_pass(w, &wait_ms);
    pthread_mutex_lock(&w->job.mu);
    w->passes[rc]++;
    pthread_mutex_unlock(&w->job.mu);
  } while (txc_worker_sleep(&w->job, wait_ms));
  return NULL;
}

stock_window_t *stock_window_start(const char *pg_url, const char *redis_url, bool *ok) {
  long long interval = svc_env_int("STOCK_WINDOW_INTERVAL_MS", 1000, 0, 3600000, ok);
  if (!*ok || interval == 0) return NULL;
  stock_window_t *w = calloc(1, sizeof(*w));
  if (!w) return NULL;
  w->pg_url = pg_url;
  w->redis_url = redis_url;
  w->interval_ms = interval;
  if (txc_worker_start(&w->job, window_main, w) != 0) {
    svc_warn("could not start the sale-window thread");
    free(w);
    return NULL;
  }
  svc_info("sale window job: activities open at starts_at and close at ends_at (checked at the times, and "
           "every %lld ms)%s", interval, redis_url ? "" : "; REDIS_URL is not set: PostgreSQL only");
  return w;
}

void stock_window_metrics(stock_window_t *w, txc_buf_t *b) {
  if (!w) return;
  pthread_mutex_lock(&w->job.mu);
  unsigned long long p[3], opened = w->opened, closed = w->closed, ru = w->redis_updates, re = w->redis_errors;
  memcpy(p, w->passes, sizeof(p));
  pthread_mutex_unlock(&w->job.mu);
  txc_buf_printf(b,
                 "# HELP txc_sale_window_passes_total Passes of the sale-window job by result (skipped: another "
                 "instance's pass was running).\n"
                 "# TYPE txc_sale_window_passes_total counter\n"
                 "txc_sale_window_passes_total{result=\"ok\"} %llu\n"
                 "txc_sale_window_passes_total{result=\"skipped\"} %llu\n"
                 "txc_sale_window_passes_total{result=\"failed\"} %llu\n"
                 "# HELP txc_sale_window_changes_total Activities this instance opened or closed.\n"
                 "# TYPE txc_sale_window_changes_total counter\n"
                 "txc_sale_window_changes_total{to=\"on_sale\"} %llu\n"
                 "txc_sale_window_changes_total{to=\"ended\"} %llu\n"
                 "# HELP txc_sale_window_redis_updates_total Meta hashes set to PostgreSQL's status and window.\n"
                 "# TYPE txc_sale_window_redis_updates_total counter\n"
                 "txc_sale_window_redis_updates_total %llu\n"
                 "# HELP txc_sale_window_redis_errors_total Passes of the sale-window job whose Redis update failed (retried).\n"
       "# TYPE txc_sale_window_redis_errors_total counter\n"
                 "txc_sale_window_redis_errors_total %llu\n",
                 p[PASS_OK], p[PASS_SKIPPED], p[PASS_FAILED], opened, closed, ru, re);
}

void stock_window_stop(stock_window_t *w) {
  if (!w) return;
  txc_worker_stop(&w->job);
  if (w->pg) PQfinish(w->pg);
  if (w->redis) redisFree(w->redis);
  free(w);
}
