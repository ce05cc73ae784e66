/*
 * svc_outbox.c - the orders database's outbox and its relay to Redis
 * (svc_outbox.h).
 *
 * NOTES
 *   One pass of the relay, in one transaction of its own connection:
 *     1. pg_try_advisory_xact_lock: one relay at a time over all
 *        order-service instances (stream ids must grow, so publication is
 *        serial); another instance holds it: nothing to do;
 *     2. the stream's last id L (XINFO STREAM; 0 when the key is gone) and
 *        the highest recorded position P: L < P means Redis lost entries
 *        (restarted without AOF, or the stream was deleted): publish the
 *        events after L again, under their positions, in order;
 *     3. the unpublished events (oldest first, locked), numbered from
 *        max(L, P) + 1, XADDed in one pipeline, then marked published;
 *     4. COMMIT.
 *   After a pass that published events the next waits until linger_ms
 *   (OUTBOX_LINGER_MS) after it, however many kicks come: under load a
 *   pass (its seven statements and its commit) carries the events of that
 *   time, not one; a kick to an idle relay publishes at once.
 *   Published rows older than the retention are deleted now and then.
 *   Failures (either store down) roll the pass back and retry with a
 *   growing pause (up to 2 s), logged once per outage.
 */
#include "svc_outbox.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "svc_common.h"
#include "svc_event.h"
#include "svc_redis.h"
#include "txc_failpoint.h"
#include "txc_worker.h"

/* pg_try_advisory_xact_lock key of the relay (any constant of ours). */
#define RELAY_LOCK_KEY "7466019"
#define BATCH 500
#define REPUBLISH_BATCH 1000

bool svc_outbox_row(svc_outbox_row_t *row, const char *type, long long order_id, json_t *payload, char *err,
                    size_t errlen) {
  memset(row, 0, sizeof(*row));
  snprintf(row->order_id, sizeof(row->order_id), "%lld", order_id);
  row->payload = payload ? json_dumps(payload, JSON_COMPACT) : NULL;
  json_decref(payload);
  if (!row->payload) {
    snprintf(err, errlen, "could not encode the event payload");
    return false;
  }
  row->params[0] = type;
  row->params[1] = row->order_id;
  row->params[2] = row->payload;
  row->stmt = (svc_pg_stmt_t){"INSERT INTO order_outbox (event_type, order_id, payload) VALUES ($1, $2, $3::jsonb)", 3,
                              row->params, PGRES_COMMAND_OK};
  return true;
}

void svc_outbox_row_free(svc_outbox_row_t *row) {
  free(row->payload);
  row->payload = NULL;
}

bool svc_outbox_add(PGconn *pg, const char *type, long long order_id, json_t *payload, char *err, size_t errlen) {
  svc_outbox_row_t row;
  if (!svc_outbox_row(&row, type, order_id, payload, err, errlen)) return false;
  bool ok = svc_pg_exec(pg, row.stmt.sql, row.stmt.n, row.stmt.params, row.stmt.want, NULL, err, errlen);
  svc_outbox_row_free(&row);
  return ok;
}

struct svc_relay {
  char *pg_url, *redis_url, *stream;
  unsigned poll_ms, linger_ms;
  long long maxlen, retention_s;
  const svc_auth_t *auth;

  txc_worker_t job;
  svc_relay_stats_t stats; /* under job.mu */

  /* the thread's own */
  PGconn *pg;
  redisContext *redis;
  bool failing; /* an outage is logged once */
  int64_t next_cleanup_us;
  int64_t last_published_us; /* when the last pass that published ended; 0: it published nothing */
};

static void relay_failed(svc_relay_t *r, const char *what, const char *err) {
  pthread_mutex_lock(&r->job.mu);
  r->stats.errors++;
  pthread_mutex_unlock(&r->job.mu);
  if (!r->failing)
    SVC_LOG(SVC_LOG_WARN, json_pack("{s:s}", "stream", r->stream),
            "outbox relay: could not %s: %s (retrying; events stay in order_outbox until published)", what, err);
  r->failing = true;
}

static bool relay_connect(svc_relay_t *r, char *err, size_t errlen) {
  return svc_pg_ensure(&r->pg, r->pg_url, "the orders database", err, errlen) &&
         svc_redis_ensure(&r->redis, r->redis_url, 2000, err, errlen) > 0;
}

/* The stream's last generated id's first part; 0 when there is no stream.
 * -1 on error. */
static long long stream_last_seq(svc_relay_t *r, char *err, size_t errlen) {
  redisReply *x = redisCommand(r->redis, "XINFO STREAM %s", r->stream);
  if (!x) {
    snprintf(err, errlen, "Redis: %s", r->redis->errstr);
    return -1;
  }
  long long last = -1;
  if (x->type == REDIS_REPLY_ERROR) {
    if (x->str && strstr(x->str, "no such key"))
      last = 0;
    else
      snprintf(err, errlen, "Redis XINFO STREAM: %s", x->str ? x->str : "error");
  } else if (x->type == REDIS_REPLY_ARRAY) {
    for (size_t i = 0; i + 1 < x->elements; i += 2) {
      const redisReply *k = x->element[i], *v = x->element[i + 1];
      if (k->str && strcmp(k->str, "last-generated-id") == 0 && v->str) last = atoll(v->str);
    }
    if (last < 0) snprintf(err, errlen, "Redis XINFO STREAM: no last-generated-id");
  }
  freeReplyObject(x);
  return last;
}

/* XADD the rows of 'res' (event_id, event_type, order_id, payload[,
 * stream_seq]) in one pipeline, at positions 'first_seq' on, or at their
 * own (column 'seq_col' >= 0).  Returns how many, in order, Redis took
 * (it stops at the first refusal, 'err' says why), or -1 when the
 * connection failed (then nothing is known of the rest). */
static int xadd_rows(svc_relay_t *r, PGresult *res, long long first_seq, int seq_col, char *err, size_t errlen) {
  int n = PQntuples(res);
  char maxlen[24];
  snprintf(maxlen, sizeof(maxlen), "%lld", r->maxlen);
  for (int i = 0; i < n; i++) {
    char id[32];
    long long seq = seq_col >= 0 ? atoll(PQgetvalue(res, i, seq_col)) : first_seq + i;
    snprintf(id, sizeof(id), "%lld-0", seq);
    char mac[SVC_AUTH_HEX_MAX] = "";
    if (r->auth) svc_event_sign(r->auth, PQgetvalue(res, i, 0), PQgetvalue(res, i, 1), PQgetvalue(res, i, 2),
                                PQgetvalue(res, i, 3), mac);
    const char *argv[] = {"XADD", r->stream, "MAXLEN", "~", maxlen, id, "event_id", PQgetvalue(res, i, 0),
                          "type", PQgetvalue(res, i, 1), "order_id", PQgetvalue(res, i, 2), "payload",
                          PQgetvalue(res, i, 3), "mac", mac};
    int argc = (int)(sizeof(argv) / sizeof(argv[0])) - (r->auth ? 0 : 2);
    redisAppendCommandArgv(r->redis, argc, argv, NULL);
  }
  int took = 0;
  bool stopped = false;
  for (int i = 0; i < n; i++) {
    void *v = NULL;
    if (redisGetReply(r->redis, &v) != REDIS_OK) {
      snprintf(err, errlen, "Redis XADD: %s", r->redis->errstr);
      return -1;
    }
    redisReply *x = v;
    if (x->type == REDIS_REPLY_ERROR) {
      if (!stopped) snprintf(err, errlen, "Redis XADD: %s", x->str ? x->str : "error");
      stopped = true;
    } else if (!stopped) {
      took++;
    }
    freeReplyObject(x);
  }
  return took;
}

/* "{1,2,3}" of column 'col' of the first 'n' rows (malloc'd). */
static char *column_array(PGresult *res, int col, int n) {
  size_t cap = 3 + (size_t)n * 21;
  char *s = malloc(cap);
  if (!s) return NULL;
  size_t off = 0;
  s[off++] = '{';
  for (int i = 0; i < n; i++) off += (size_t)snprintf(s + off, cap - off, "%s%s", i ? "," : "", PQgetvalue(res, i, col));
  s[off++] = '}';
  s[off] = '\0';
  return s;
}

/* One pass (NOTES).  Returns the events published, or -1. */
static int relay_pass(svc_relay_t *r, char *err, size_t errlen) {
  PGresult *res = NULL;
  if (!svc_pg_exec(r->pg, "BEGIN", 0, NULL, PGRES_COMMAND_OK, NULL, err, errlen)) return -1;
  if (!svc_pg_exec(r->pg, "SELECT pg_try_advisory_xact_lock(" RELAY_LOCK_KEY ")", 0, NULL, PGRES_TUPLES_OK, &res,
                   err, errlen))
    goto fail;
  bool mine = strcmp(PQgetvalue(res, 0, 0), "t") == 0;
  PQclear(res);
  res = NULL;
  if (!mine) {
    PQclear(PQexec(r->pg, "ROLLBACK"));
    return 0;
  }
  long long last = stream_last_seq(r, err, errlen);
  if (last < 0) goto fail;
  if (!svc_pg_exec(r->pg, "SELECT coalesce(max(stream_seq), 0) FROM order_outbox", 0, NULL, PGRES_TUPLES_OK, &res,
                   err, errlen))
    goto fail;
  long long recorded = atoll(PQgetvalue(res, 0, 0));
  PQclear(res);
  res = NULL;
  int republished = 0;
  if (last < recorded) {
    char sl[24], lim[24];
    snprintf(sl, sizeof(sl), "%lld", last);
    snprintf(lim, sizeof(lim), "%d", REPUBLISH_BATCH);
    const char *p[2] = {sl, lim};
    if (!svc_pg_exec(r->pg,
                     "SELECT event_id, event_type, order_id, payload, stream_seq FROM order_outbox"
                     " WHERE stream_seq > $1 ORDER BY stream_seq LIMIT $2",
                     2, p, PGRES_TUPLES_OK, &res, err, errlen))
      goto fail;
    republished = xadd_rows(r, res, 0, 4, err, errlen);
    int n = PQntuples(res);
    long long upto = n > 0 ? atoll(PQgetvalue(res, n - 1, 4)) : recorded;
    PQclear(res);
    res = NULL;
    if (republished < 0 || republished < n) goto fail;
    SVC_LOG(SVC_LOG_WARN,
            json_pack("{s:s,s:I,s:I,s:i}", "stream", r->stream, "stream_last", (json_int_t)last, "recorded",
                      (json_int_t)recorded, "republished", republished),
            "outbox relay: the stream lost %lld events (Redis restarted without them?); published them again",
            recorded - last);
    last = upto;
    if (last < recorded) {
      /* more to republish: the next pass goes on (positions must stay in
       * order, new events wait) */
      PQclear(PQexec(r->pg, "COMMIT"));
      pthread_mutex_lock(&r->job.mu);
      r->stats.republished += (uint64_t)republished;
      pthread_mutex_unlock(&r->job.mu);
      return republished;
    }
  }
  char lim[24];
  snprintf(lim, sizeof(lim), "%d", BATCH);
  const char *pl[1] = {lim};
  if (!svc_pg_exec(r->pg,
                   "SELECT event_id, event_type, order_id, payload FROM order_outbox WHERE stream_seq IS NULL"
                   " ORDER BY event_id LIMIT $1 FOR UPDATE",
                   1, pl, PGRES_TUPLES_OK, &res, err, errlen))
    goto fail;
  int n = PQntuples(res), published = 0;
  long long first = (last > recorded ? last : recorded) + 1;
  if (n > 0) {
    published = xadd_rows(r, res, first, -1, err, errlen);
    if (published < 0) goto fail; /* the next pass sees what went out (stream id above ours) */
    TXC_FAILPOINT("svc.outbox.after_xadd");
    if (published > 0) {
      char *ids = column_array(res, 0, published), sf[24];
      snprintf(sf, sizeof(sf), "%lld", first);
      const char *p[2] = {ids, sf};
      bool ok = ids && svc_pg_exec(r->pg,
                                   "UPDATE order_outbox o SET stream_seq = $2::bigint + v.ord - 1, published_at = now()"
                                   " FROM unnest($1::bigint[]) WITH ORDINALITY AS v(id, ord) WHERE o.event_id = v.id",
                                   2, p, PGRES_COMMAND_OK, NULL, err, errlen);
      free(ids);
      if (!ok) goto fail;
    }
  }
  PQclear(res);
  res = NULL;
  if (!svc_pg_exec(r->pg, "COMMIT", 0, NULL, PGRES_COMMAND_OK, NULL, err, errlen)) goto fail;
  /* lag, for the metrics */
  if (svc_pg_exec(r->pg,
                  "SELECT count(*), coalesce(extract(epoch FROM now() - min(created_at)), 0) FROM order_outbox"
                  " WHERE stream_seq IS NULL",
                  0, NULL, PGRES_TUPLES_OK, &res, err, errlen)) {
    pthread_mutex_lock(&r->job.mu);
    r->stats.unpublished = atoll(PQgetvalue(res, 0, 0));
    r->stats.oldest_unpublished_s = atof(PQgetvalue(res, 0, 1));
    pthread_mutex_unlock(&r->job.mu);
    PQclear(res);
    res = NULL;
  }
  pthread_mutex_lock(&r->job.mu);
  r->stats.published += (uint64_t)published;
  r->stats.republished += (uint64_t)republished;
  r->stats.passes++;
  pthread_mutex_unlock(&r->job.mu);
  if (published < n) return -1; /* Redis refused some: 'err' says why */
  return published + republished;

fail:
  if (res) PQclear(res);
  if (PQstatus(r->pg) == CONNECTION_OK) PQclear(PQexec(r->pg, "ROLLBACK"));
  return -1;
}

/* Delete published rows past the retention, a bounded batch at a time. */
static void relay_cleanup(svc_relay_t *r) {
  char ret[24], err[256];
  snprintf(ret, sizeof(ret), "%lld", r->retention_s);
  const char *p[1] = {ret};
  PGresult *res = NULL;
  if (svc_pg_exec(r->pg,
                  "DELETE FROM order_outbox WHERE event_id IN (SELECT event_id FROM order_outbox"
                  " WHERE published_at < now() - make_interval(secs => $1::bigint) ORDER BY event_id LIMIT 10000)",
                  1, p, PGRES_COMMAND_OK, &res, err, sizeof(err))) {
    if (atoll(PQcmdTuples(res)) > 0) svc_info("outbox relay: deleted %s published events past retention", PQcmdTuples(res));
    PQclear(res);
  } else {
    svc_warn("outbox relay: could not delete old events: %s", err);
  }
}

static void *relay_main(void *arg) {
  svc_relay_t *r = arg;
  unsigned pause_ms = 0;
  /* A first pass at once: what an earlier instance left. */
  do {
    char err[512] = "";
    if (!txc_worker_pause_since(&r->job, r->last_published_us, r->linger_ms)) break;
    int n = relay_connect(r, err, sizeof(err)) ? relay_pass(r, err, sizeof(err)) : -1;
    r->last_published_us = n > 0 ? svc_now_us() : 0;
    if (n < 0) {
      relay_failed(r, "publish order events", err);
      pause_ms = pause_ms ? (pause_ms * 2 > 2000 ? 2000 : pause_ms * 2) : 100;
    } else {
      if (r->failing) svc_info("outbox relay: publishing again");
      r->failing = false;
      pause_ms = 0;
      int64_t now = svc_now_us();
      if (now >= r->next_cleanup_us) {
        relay_cleanup(r);
        r->next_cleanup_us = now + 60 * 1000000LL;
      }
    }
    if (n == BATCH) txc_worker_kick(&r->job); /* more waiting: go on at once */
  } while (txc_worker_sleep(&r->job, pause_ms ? pause_ms : r->poll_ms));
  return NULL;
}

static void relay_free(svc_relay_t *r) {
  if (r->pg) PQfinish(r->pg);
  if (r->redis) redisFree(r->redis);
  free(r->pg_url);
  free(r->redis_url);
  free(r->stream);
  free(r);
}

svc_relay_t *svc_relay_start(const svc_relay_opts_t *o, char *err, size_t errlen) {
  svc_relay_t *r = calloc(1, sizeof(*r));
  if (!r || !o->pg_url || !o->redis_url) {
    snprintf(err, errlen, r ? "the relay needs the orders database and Redis URLs" : "out of memory");
    free(r);
    return NULL;
  }
  r->pg_url = strdup(o->pg_url);
  r->redis_url = strdup(o->redis_url);
  r->stream = strdup(o->stream ? o->stream : SVC_ORDER_STREAM);
  r->poll_ms = o->poll_ms ? o->poll_ms : 200;
  r->linger_ms = o->linger_ms;
  r->maxlen = o->maxlen > 0 ? o->maxlen : 1000000;
  r->retention_s = o->retention_s > 0 ? o->retention_s : 7 * 86400;
  r->auth = o->auth;
  r->next_cleanup_us = svc_now_us() + 60 * 1000000LL;
  if (!r->pg_url || !r->redis_url || !r->stream || txc_worker_start(&r->job, relay_main, r) != 0) {
    snprintf(err, errlen, "could not start the outbox relay thread");
    relay_free(r);
    return NULL;
  }
  return r;
}

void svc_relay_kick(svc_relay_t *r) {
  if (r) txc_worker_kick(&r->job);
}

void svc_relay_stop(svc_relay_t *r) {
  if (!r) return;
  txc_worker_stop(&r->job);
  relay_free(r);
}

void svc_relay_stats(svc_relay_t *r, svc_relay_stats_t *out) {
  memset(out, 0, sizeof(*out));
  if (!r) return;
  pthread_mutex_lock(&r->job.mu);
  *out = r->stats;
  pthread_mutex_unlock(&r->job.mu);
}
