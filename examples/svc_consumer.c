/*
 * svc_consumer.c - an idempotent consumer group of the order events
 * (svc_consumer.h).
 *
 * NOTES
 *   The loop, on the consumer's thread:
 *     1. due retries: XPENDING IDLE (the shortest backoff) lists the
 *        group's pending entries with their idle time and delivery count;
 *        an entry past its backoff is dead-lettered when it reached
 *        max_deliveries, else claimed (XCLAIM with that idle time as the
 *        minimum, so two consumers never both take it) and applied;
 *     2. redeliveries an operator asked for (dead_letter rows REDELIVER);
 *     3. new entries: XREADGROUP ... COUNT batch_max (64) BLOCK 200 ms
 *        ">", applied together (process; svc_consumer.h NOTES).
 *   The group is created at id 0 (everything the stream holds: the
 *   consumers are idempotent), and again if Redis lost it (NOGROUP).
 *   The last failure of each pending entry is kept in the hash
 *   txc:consumer-errors:{group} so that its dead letter says why.
 */
#include "svc_consumer.h"

#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "svc_outbox.h"
#include "svc_redis.h"
#include "txc_failpoint.h"
#include "txc_worker.h"

#define MAX_BACKOFF 32
#define READ_COUNT 64
#define MARK_TTL_S 86400
#define DEFAULT_LINGER_MS 300

static const int64_t default_backoff_ms[] = {1000,   5000,   10000,  30000,  60000,   120000,  180000,  240000,
                                             300000, 360000, 420000, 480000, 540000, 600000, 1200000, 1800000};

struct svc_consumer {
  char *redis_url, *pg_url, *stream, *group, *consumer;
  svc_event_apply_fn apply;
  svc_event_apply_batch_fn apply_batch;
  svc_event_after_fn after;
  void *arg;
  const svc_auth_t *auth;
  int max_deliveries;
  size_t batch_max;     /* 1..READ_COUNT */
  int64_t linger_ms;    /* CONSUMER_LINGER_MS; none when batch_max is 1 */
  int64_t last_read_us; /* when the last read that brought events returned; 0: it brought none */
  int64_t backoff_ms[MAX_BACKOFF];
  size_t nbackoff;

  txc_worker_t job;
  svc_consumer_stats_t stats; /* under job.mu */

  PGconn *pg;
  redisContext *redis;
  bool failing;
  int64_t next_retry_us, next_redeliver_us, next_info_us;
  unsigned info_passes;
};

static void count(svc_consumer_t *c, uint64_t *field) {
  pthread_mutex_lock(&c->job.mu);
  (*field)++;
  pthread_mutex_unlock(&c->job.mu);
}

static bool stopping(svc_consumer_t *c) { return txc_worker_stopping(&c->job); }

static void loop_failed(svc_consumer_t *c, const char *err) {
  count(c, &c->stats.errors);
  if (!c->failing)
    SVC_LOG(SVC_LOG_WARN, json_pack("{s:s,s:s}", "group", c->group, "stream", c->stream),
            "consumer: %s (retrying; nothing is lost: entries stay pending in the stream)", err);
  c->failing = true;
}

/* ------------------------------------------------------- connections */

static bool ensure_group(svc_consumer_t *c, char *err, size_t errlen) {
  redisReply *x = redisCommand(c->redis, "XGROUP CREATE %s %s 0 MKSTREAM", c->stream, c->group);
  if (!x) {
    snprintf(err, errlen, "Redis: %s", c->redis->errstr);
    return false;
  }
  bool ok = x->type != REDIS_REPLY_ERROR || (x->str && strncmp(x->str, "BUSYGROUP", 9) == 0);
  if (!ok) snprintf(err, errlen, "Redis XGROUP CREATE: %s", x->str ? x->str : "error");
  freeReplyObject(x);
  return ok;
}

static bool connect_stores(svc_consumer_t *c, char *err, size_t errlen) {
  if (!svc_pg_ensure(&c->pg, c->pg_url, "the consumer's database", err, errlen)) return false;
  int rc = svc_redis_ensure(&c->redis, c->redis_url, 2000, err, errlen);
  if (rc == 2 && !ensure_group(c, err, errlen)) { /* a new connection: the group may be new too */
    redisFree(c->redis);
    c->redis = NULL;
    return false;
  }
  return rc > 0;
}

/* ----------------------------------------------------------- events */

static const char *field_of(const char *const *k, const char *const *v, size_t n, const char *name) {
  for (size_t i = 0; i < n; i++)
    if (k[i] && strcmp(k[i], name) == 0) return v[i];
  return NULL;
}

/* A stream entry's fields into 'ev' (svc_event_parse), its signature
 * checked first when the consumer has a key. */
static bool parse_entry(const svc_consumer_t *c, const redisReply *fields, svc_event_t *ev, json_t **payload,
                        char *biz, char *why, size_t whylen) {
  *payload = NULL;
  if (!fields || fields->type != REDIS_REPLY_ARRAY || fields->elements % 2 || fields->elements > 64) {
    snprintf(why, whylen, "malformed event: not a list of fields and values");
    return false;
  }
  const char *k[32], *v[32];
  size_t n = fields->elements / 2;
  for (size_t i = 0; i < n; i++) {
    k[i] = fields->element[2 * i]->str;
    v[i] = fields->element[2 * i + 1]->str;
  }
  if (c->auth && !svc_event_verify(c->auth, field_of(k, v, n, "event_id"), field_of(k, v, n, "type"),
                                   field_of(k, v, n, "order_id"), field_of(k, v, n, "payload"),
                                   field_of(k, v, n, "mac"))) {
    snprintf(why, whylen, "the event's signature does not verify (forged, or signed with another key)");
    return false;
  }
  return svc_event_parse(k, v, n, ev, payload, biz, why, whylen);
}

/* The event as JSON, for its dead letter. */
static json_t *event_json(const redisReply *fields) {
  json_t *j = json_object();
  if (fields && fields->type == REDIS_REPLY_ARRAY)
    for (size_t i = 0; i + 1 < fields->elements; i += 2)
      if (fields->element[i]->str && fields->element[i + 1]->str)
        json_object_set_new(j, fields->element[i]->str, json_string(fields->element[i + 1]->str));
  return j;
}

static void mark_key(const svc_consumer_t *c, const char *biz_key, char *out, size_t outlen) {
  snprintf(out, outlen, "txc:consumed:{%s}:%s", c->group, biz_key);
}

/* Acknowledge the 'n' (<= READ_COUNT) entries 'ids' in one pipelined
 * round trip: their marks (when 'marks') set "done", one XACK, one HDEL
 * of their last errors. */
static void ack_all(svc_consumer_t *c, const char *const *ids, const char *const *marks, size_t n) {
  const char *argv[3 + READ_COUNT];
  char errkey[160];
  snprintf(errkey, sizeof(errkey), "txc:consumer-errors:{%s}", c->group);
  for (size_t i = 0; marks && i < n; i++) redisAppendCommand(c->redis, "SET %s done EX %d", marks[i], MARK_TTL_S);
  argv[0] = "XACK";
  argv[1] = c->stream;
  argv[2] = c->group;
  memcpy(argv + 3, ids, n * sizeof(*ids));
  redisAppendCommandArgv(c->redis, (int)(3 + n), argv, NULL);
  argv[0] = "HDEL";
  argv[1] = errkey;
  memcpy(argv + 2, ids, n * sizeof(*ids));
  redisAppendCommandArgv(c->redis, (int)(2 + n), argv, NULL);
  for (size_t i = 0; i < (marks ? n : 0) + 2; i++) {
    void *r = NULL;
    if (redisGetReply(c->redis, &r) != REDIS_OK) return; /* the context is dead: the loop reconnects */
    freeReplyObject(r);
  }
}

/* XACK one entry and forget its last error. */
static void ack(svc_consumer_t *c, const char *id) { ack_all(c, &id, NULL, 1); }

/* Write the dead letter (or refresh it), acknowledge, alert.  false: the
 * database refused (the entry stays pending). */
static bool dead_letter(svc_consumer_t *c, const char *id, const char *biz_key, long long event_id,
                        const redisReply *fields, int deliveries, const char *why) {
  char err[512], sd[16], se[24];
  snprintf(sd, sizeof(sd), "%d", deliveries);
  snprintf(se, sizeof(se), "%lld", event_id);
  json_t *ej = event_json(fields);
  char *js = json_dumps(ej, JSON_COMPACT);
  json_decref(ej);
  const char *p[7] = {c->group, biz_key, se, id, js ? js : "{}", sd, why};
  bool ok = svc_pg_exec(c->pg,
                        "INSERT INTO dead_letter (consumer_group, biz_key, event_id, stream_id, event, deliveries,"
                        " reason) VALUES ($1, $2, $3, $4, $5::jsonb, $6, $7)"
                        " ON CONFLICT (consumer_group, biz_key) DO UPDATE SET state = 'DEAD', stream_id = $4,"
                        " event = $5::jsonb, deliveries = $6, reason = $7, updated_at = now()",
                        7, p, PGRES_COMMAND_OK, NULL, err, sizeof(err));
  free(js);
  if (!ok) {
    loop_failed(c, err);
    return false;
  }
  ack(c, id);
  count(c, &c->stats.dead_lettered);
  SVC_LOG(SVC_LOG_ERROR,
          json_pack("{s:s,s:s,s:s,s:I,s:i,s:s}", "group", c->group, "stream_id", id, "biz_key", biz_key, "event_id",
                    (json_int_t)event_id, "deliveries", deliveries, "reason", why),
          "event dead-lettered: %s (fix the cause, then: txc-events redeliver --group %s)", why, c->group);
  return true;
}

/* Inside the open transaction of c->pg: the consumed_event row of 'ev',
 * then its effect.  *dup when it was applied before (nothing done).  On
 * anything but DONE the caller rolls back. */
static svc_ev_result_t apply_in_tx(svc_consumer_t *c, const svc_event_t *ev, bool *dup, char *why, size_t whylen) {
  char se[24];
  snprintf(se, sizeof(se), "%lld", ev->event_id);
  const char *p[3] = {c->group, ev->biz_key, se};
  PGresult *r = NULL;
  *dup = false;
  if (!svc_pg_exec(c->pg,
                   "INSERT INTO consumed_event (consumer_group, biz_key, event_id) VALUES ($1, $2, $3)"
                   " ON CONFLICT DO NOTHING",
                   3, p, PGRES_COMMAND_OK, &r, why, whylen))
    return SVC_EV_RETRY;
  *dup = atoll(PQcmdTuples(r)) != 1;
  PQclear(r);
  if (*dup) return SVC_EV_DONE;
  return c->apply(c->pg, ev, c->arg, why, whylen);
}

/* Apply 'ev' in a transaction of its own with its consumed_event row. */
static svc_ev_result_t apply_once(svc_consumer_t *c, const svc_event_t *ev, bool *dup, char *why, size_t whylen) {
  if (!svc_pg_exec(c->pg, "BEGIN", 0, NULL, PGRES_COMMAND_OK, NULL, why, whylen)) return SVC_EV_RETRY;
  svc_ev_result_t res = apply_in_tx(c, ev, dup, why, whylen);
  if (res == SVC_EV_DONE && !*dup) {
    TXC_FAILPOINT("svc.consumer.after_apply");
    if (!svc_pg_exec(c->pg, "COMMIT", 0, NULL, PGRES_COMMAND_OK, NULL, why, whylen)) return SVC_EV_RETRY;
    count(c, &c->stats.commits);
    TXC_FAILPOINT("svc.consumer.after_commit");
    return SVC_EV_DONE;
  }
  if (PQstatus(c->pg) == CONNECTION_OK && PQtransactionStatus(c->pg) != PQTRANS_IDLE)
    PQclear(PQexec(c->pg, "ROLLBACK"));
  return res;
}

/* An entry in hand: decoded, with the key of its Redis mark.  ev.biz_key
 * points into biz: an entry does not move once opened. */
typedef struct entry {
  const char *id;
  const redisReply *fields;
  int deliveries;
  svc_event_t ev;
  json_t *payload;
  char biz[SVC_EVENT_BIZ_KEY_MAX], mark[256];
} entry_t;

/* Decode 'e' (id, fields and deliveries set).  A malformed entry is
 * dead-lettered here: false. */
static bool entry_open(svc_consumer_t *c, entry_t *e) {
  char why[512] = "";
  e->ev = (svc_event_t){.stream_id = e->id, .deliveries = e->deliveries};
  e->payload = NULL;
  if (!parse_entry(c, e->fields, &e->ev, &e->payload, e->biz, why, sizeof(why))) {
    snprintf(e->biz, sizeof(e->biz), "malformed:%.60s", e->id);
    dead_letter(c, e->id, e->biz, 0, e->fields, e->deliveries, why);
    return false;
  }
  mark_key(c, e->biz, e->mark, sizeof(e->mark));
  return true;
}

/* The fast path of 'n' entries, in two pipelined round trips: each mark
 * set "busy" if absent (SET NX); where it was there, read it.  done[i]:
 * the mark says "done", the event was applied before.  Otherwise the mark
 * is ours, or a delivery died half-way, or Redis could not say: the
 * database decides.  A dead context answers nothing (the loop reconnects
 * after this pass). */
static void marks_check(svc_consumer_t *c, entry_t *const *es, size_t n, bool *done) {
  bool won[READ_COUNT] = {false};
  for (size_t i = 0; i < n; i++) {
    done[i] = false;
    redisAppendCommand(c->redis, "SET %s busy NX EX %d", es[i]->mark, MARK_TTL_S);
  }
  for (size_t i = 0; i < n; i++) {
    redisReply *x = NULL;
    if (redisGetReply(c->redis, (void **)&x) != REDIS_OK) return;
    won[i] = x && x->type == REDIS_REPLY_STATUS;
    freeReplyObject(x);
  }
  size_t asked = 0;
  for (size_t i = 0; i < n; i++)
    if (!won[i]) {
      redisAppendCommand(c->redis, "GET %s", es[i]->mark);
      asked++;
    }
  for (size_t i = 0; i < n && asked; i++) {
    if (won[i]) continue;
    redisReply *x = NULL;
    if (redisGetReply(c->redis, (void **)&x) != REDIS_OK) return;
    asked--;
    done[i] = x && x->type == REDIS_REPLY_STRING && strcmp(x->str, "done") == 0;
    freeReplyObject(x);
  }
}

/* 'n' entries whose effect is committed now (or was before: dup[i]):
 * acknowledged with their marks "done" (ack_all), counted, and their
 * effects outside the database (c->after). */
static void finish_done(svc_consumer_t *c, entry_t *const *es, size_t n, const bool *dup) {
  const char *ids[READ_COUNT] = {NULL}, *marks[READ_COUNT] = {NULL};
  for (size_t i = 0; i < n; i++) {
    ids[i] = es[i]->id;
    marks[i] = es[i]->mark;
  }
  ack_all(c, ids, marks, n);
  for (size_t i = 0; i < n; i++) {
    count(c, dup[i] ? &c->stats.duplicates : &c->stats.consumed);
    if (c->after) c->after(&es[i]->ev, c->arg);
  }
}

/* An event applied before (its mark says so): acknowledged, counted, and
 * its effects outside the database again (they are idempotent). */
static void repeat_done(svc_consumer_t *c, entry_t *e) {
  ack(c, e->id);
  count(c, &c->stats.duplicates);
  if (c->after) c->after(&e->ev, c->arg);
}

/* Apply 'e' in a transaction of its own and finish it: acknowledged when
 * done; else its mark removed and the entry left pending for a retry, or
 * dead-lettered. */
static void apply_one(svc_consumer_t *c, entry_t *e) {
  char why[512] = "";
  bool dup = false;
  svc_ev_result_t res = apply_once(c, &e->ev, &dup, why, sizeof(why));
  if (res == SVC_EV_DONE) {
    finish_done(c, &e, 1, &dup);
    return;
  }
  freeReplyObject(redisCommand(c->redis, "DEL %s", e->mark));
  if (res == SVC_EV_DEAD || e->deliveries >= c->max_deliveries) {
    char reason[600];
    snprintf(reason, sizeof(reason), "%s%s", res == SVC_EV_DEAD ? "" : "gave up after the last delivery: ", why);
    dead_letter(c, e->id, e->biz, e->ev.event_id, e->fields, e->deliveries, reason);
  } else {
    freeReplyObject(redisCommand(c->redis, "HSET txc:consumer-errors:{%s} %s %s", c->group, e->id, why));
    count(c, &c->stats.retried);
    SVC_LOG(SVC_LOG_WARN,
            json_pack("{s:s,s:s,s:s,s:i}", "group", c->group, "stream_id", e->id, "biz_key", e->biz, "deliveries",
                      e->deliveries),
            "consumer: could not apply an event (will retry): %s", why);
  }
}

/* 'n' >= 2 events in one transaction: their consumed_event rows in one
 * INSERT (those it did not insert were applied before: dup[i]; of two
 * entries with one business key the second is a repeat), the effects of
 * the others in stream order (apply_batch's few statements, or one apply
 * each), one COMMIT.  true: committed.  false: rolled
 * back, nothing of the batch is done; the caller applies them one by one,
 * which isolates the event that failed. */
static bool apply_together(svc_consumer_t *c, entry_t *const *es, size_t n, bool *dup) {
  char why[512] = "";
  json_t *keys = json_array();
  for (size_t i = 0; keys && i < n; i++)
    if (json_array_append_new(keys, json_pack("{s:s,s:I}", "b", es[i]->biz, "e", (json_int_t)es[i]->ev.event_id))) {
      json_decref(keys);
      keys = NULL;
    }
  char *js = keys ? json_dumps(keys, JSON_COMPACT) : NULL;
  json_decref(keys);
  if (!js) return false;
  const char *p[2] = {c->group, js};
  PGresult *r = NULL;
  bool ok = svc_pg_exec(c->pg, "BEGIN", 0, NULL, PGRES_COMMAND_OK, NULL, why, sizeof(why)) &&
            svc_pg_exec(c->pg,
                        "INSERT INTO consumed_event (consumer_group, biz_key, event_id) SELECT $1, k.b, k.e"
                        " FROM pg_catalog.jsonb_to_recordset($2::jsonb) AS k(b text, e bigint)"
                        " ON CONFLICT DO NOTHING RETURNING biz_key",
                        2, p, PGRES_TUPLES_OK, &r, why, sizeof(why));
  free(js);
  if (ok) {
    bool taken[READ_COUNT] = {false};
    int rows = PQntuples(r);
    for (size_t i = 0; i < n; i++) {
      dup[i] = true;
      for (int k = 0; k < rows && dup[i]; k++)
        if (!taken[k] && strcmp(PQgetvalue(r, k, 0), es[i]->biz) == 0) taken[k] = true, dup[i] = false;
    }
    PQclear(r);
    const svc_event_t *fresh[READ_COUNT];
    size_t nfresh = 0;
    for (size_t i = 0; i < n; i++)
      if (!dup[i]) fresh[nfresh++] = &es[i]->ev;
    if (c->apply_batch && nfresh > 1)
      ok = c->apply_batch(c->pg, fresh, nfresh, c->arg, why, sizeof(why)) == SVC_EV_DONE;
    else
      for (size_t i = 0; i < nfresh && ok; i++) ok = c->apply(c->pg, fresh[i], c->arg, why, sizeof(why)) == SVC_EV_DONE;
  }
  if (ok) {
    TXC_FAILPOINT("svc.consumer.after_apply");
    ok = svc_pg_exec(c->pg, "COMMIT", 0, NULL, PGRES_COMMAND_OK, NULL, why, sizeof(why));
    if (ok) TXC_FAILPOINT("svc.consumer.after_commit");
  }
  if (!ok && PQstatus(c->pg) == CONNECTION_OK && PQtransactionStatus(c->pg) != PQTRANS_IDLE)
    PQclear(PQexec(c->pg, "ROLLBACK"));
  if (ok) {
    bool applied = false;
    for (size_t i = 0; i < n; i++) applied = applied || !dup[i];
    if (applied) count(c, &c->stats.commits);
  }
  return ok;
}

/* Entries delivered together ('deliveries' times each): decoded (the
 * malformed ones dead-lettered), their marks checked in one round trip,
 * the repeats acknowledged, the rest applied in one transaction when
 * there are several, one by one when that fails or there is one. */
static void process(svc_consumer_t *c, const redisReply *const *ents, size_t n, int deliveries) {
  entry_t *es = calloc(n ? n : 1, sizeof(*es));
  entry_t *open[READ_COUNT], *todo[READ_COUNT];
  bool done[READ_COUNT], dup[READ_COUNT];
  size_t nopen = 0, ntodo = 0;
  if (!es || n > READ_COUNT) { /* cannot be: callers pass at most READ_COUNT; leave them pending */
    free(es);
    return;
  }
  for (size_t i = 0; i < n; i++) {
    es[i].id = ents[i]->element[0]->str;
    es[i].fields = ents[i]->element[1];
    es[i].deliveries = deliveries;
    if (entry_open(c, &es[i])) open[nopen++] = &es[i];
  }
  marks_check(c, open, nopen, done);
  for (size_t i = 0; i < nopen; i++)
    if (done[i]) repeat_done(c, open[i]);
    else todo[ntodo++] = open[i];
  if (ntodo > 1 && apply_together(c, todo, ntodo, dup)) {
    finish_done(c, todo, ntodo, dup);
  } else {
    for (size_t i = 0; i < ntodo && !stopping(c); i++) apply_one(c, todo[i]);
  }
  for (size_t i = 0; i < n; i++) json_decref(es[i].payload);
  free(es);
}

/* ---------------------------------------------------------- the loop */

/* A stream entry as Redis answers it: [id, [field, value, ...]]. */
static bool entry_shaped(const redisReply *ent) {
  return ent->type == REDIS_REPLY_ARRAY && ent->elements == 2 && ent->element[0]->type == REDIS_REPLY_STRING &&
         ent->element[0]->str;
}

static int64_t backoff_of(const svc_consumer_t *c, int deliveries) {
  size_t i = deliveries <= 1 ? 0 : (size_t)(deliveries - 1);
  return c->backoff_ms[i < c->nbackoff ? i : c->nbackoff - 1];
}

/* Step 1: entries whose backoff passed. */
static bool retry_due(svc_consumer_t *c, char *err, size_t errlen) {
  redisReply *x = svc_redis_cmd(c->redis, err, errlen, "XPENDING %s %s IDLE %lld - + 100", c->stream, c->group,
                                (long long)c->backoff_ms[0]);
  if (!x) return strstr(err, "NOGROUP") ? ensure_group(c, err, errlen) : false;
  for (size_t i = 0; x->type == REDIS_REPLY_ARRAY && i < x->elements && !stopping(c); i++) {
    const redisReply *e = x->element[i];
    if (e->type != REDIS_REPLY_ARRAY || e->elements < 4 || !e->element[0]->str) continue;
    const char *id = e->element[0]->str;
    long long idle = e->element[2]->integer, deliveries = e->element[3]->integer;
    int64_t wait = backoff_of(c, (int)deliveries);
    if (idle < wait) continue;
    if (deliveries >= c->max_deliveries) {
      redisReply *rr = svc_redis_cmd(c->redis, err, errlen, "XRANGE %s %s %s", c->stream, id, id);
      redisReply *last = redisCommand(c->redis, "HGET txc:consumer-errors:{%s} %s", c->group, id);
      const redisReply *fields =
        rr && rr->type == REDIS_REPLY_ARRAY && rr->elements == 1 ? rr->element[0]->element[1] : NULL;
      char reason[700], biz[SVC_EVENT_BIZ_KEY_MAX] = "";
      svc_event_t ev = {0};
      json_t *pl = NULL;
      char perr[256];
      if (!fields || !parse_entry(c, fields, &ev, &pl, biz, perr, sizeof(perr)))
        snprintf(biz, sizeof(biz), "malformed:%.60s", id);
      json_decref(pl);
      snprintf(reason, sizeof(reason), "%lld deliveries failed; the last: %s", deliveries,
               last && last->type == REDIS_REPLY_STRING ? last->str
               : fields                                  ? "unknown (the consumer restarted)"
                                                         : "the entry was trimmed from the stream");
      dead_letter(c, id, biz, ev.event_id, fields, (int)deliveries, reason);
      if (rr) freeReplyObject(rr);
      if (last) freeReplyObject(last);
      continue;
    }
    redisReply *cl = svc_redis_cmd(c->redis, err, errlen, "XCLAIM %s %s %s %lld %s", c->stream, c->group,
                                   c->consumer, (long long)wait, id);
    if (!cl) break;
    for (size_t k = 0; cl->type == REDIS_REPLY_ARRAY && k < cl->elements; k++) {
      const redisReply *ent = cl->element[k];
      if (!entry_shaped(ent)) continue; /* deleted meanwhile */
      process(c, &ent, 1, (int)deliveries + 1);
    }
    freeReplyObject(cl);
  }
  freeReplyObject(x);
  return !c->redis->err;
}

/* Step 2: dead letters an operator asked to redeliver, one at a time,
 * each in one transaction that locks its row (FOR UPDATE SKIP LOCKED: two
 * consumers of the group never take the same one), applies it under a
 * savepoint and records the outcome: REDELIVERED, or DEAD again with the
 * new reason (the effect rolled back to the savepoint). */
static bool redeliver_requested(svc_consumer_t *c, char *err, size_t errlen) {
  const char *p[1] = {c->group};
  for (int i = 0; i < 20 && !stopping(c); i++) {
    PGresult *r = NULL;
    if (!svc_pg_exec(c->pg, "BEGIN", 0, NULL, PGRES_COMMAND_OK, NULL, err, errlen)) return false;
    if (!svc_pg_exec(c->pg,
                     "SELECT id, stream_id, event::text FROM dead_letter WHERE consumer_group = $1"
                     " AND state = 'REDELIVER' ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED",
                     1, p, PGRES_TUPLES_OK, &r, err, errlen))
      goto fail;
    if (PQntuples(r) == 0) {
      PQclear(r);
      PQclear(PQexec(c->pg, "COMMIT"));
      return true;
    }
    char dl_id[24];
    snprintf(dl_id, sizeof(dl_id), "%s", PQgetvalue(r, 0, 0));
    json_t *ej = json_loads(PQgetvalue(r, 0, 2), 0, NULL);
    svc_event_t ev = {.stream_id = PQgetvalue(r, 0, 1), .deliveries = 0};
    char why[512] = "", biz[SVC_EVENT_BIZ_KEY_MAX] = "";
    const char *k[4] = {"event_id", "type", "order_id", "payload"}, *v[4];
    for (int f = 0; f < 4; f++) v[f] = json_string_value(json_object_get(ej, k[f]));
    json_t *payload = NULL;
    svc_ev_result_t res = SVC_EV_DEAD;
    bool dup = false;
    if (!svc_pg_exec(c->pg, "SAVEPOINT redeliver", 0, NULL, PGRES_COMMAND_OK, NULL, err, errlen)) {
      json_decref(ej);
      PQclear(r);
      goto fail;
    }
    const char *mac = json_string_value(json_object_get(ej, "mac"));
    if (c->auth && !svc_event_verify(c->auth, v[0], v[1], v[2], v[3], mac))
      snprintf(why, sizeof(why), "the event's signature does not verify (forged, or signed with another key)");
    else if (svc_event_parse(k, v, 4, &ev, &payload, biz, why, sizeof(why)))
      res = apply_in_tx(c, &ev, &dup, why, sizeof(why));
    if (res != SVC_EV_DONE && !svc_pg_exec(c->pg, "ROLLBACK TO SAVEPOINT redeliver", 0, NULL, PGRES_COMMAND_OK,
                                           NULL, err, errlen)) {
      json_decref(payload);
      json_decref(ej);
      PQclear(r);
      goto fail;
    }
    const char *p2[3] = {dl_id, res == SVC_EV_DONE ? "REDELIVERED" : "DEAD", why};
    bool ok = svc_pg_exec(c->pg,
                          "UPDATE dead_letter SET state = $2, redeliveries = redeliveries + 1, updated_at = now(),"
                          " reason = CASE WHEN $2 = 'DEAD' THEN 'redelivered, failed again: ' || $3 ELSE reason END"
                          " WHERE id = $1",
                          3, p2, PGRES_COMMAND_OK, NULL, err, errlen) &&
              svc_pg_exec(c->pg, "COMMIT", 0, NULL, PGRES_COMMAND_OK, NULL, err, errlen);
    if (ok && res == SVC_EV_DONE) {
      char mark[256];
      mark_key(c, biz, mark, sizeof(mark));
      freeReplyObject(redisCommand(c->redis, "SET %s done EX %d", mark, MARK_TTL_S));
      count(c, &c->stats.redelivered);
      if (c->after) c->after(&ev, c->arg);
      SVC_LOG(SVC_LOG_INFO, json_pack("{s:s,s:s,s:b}", "group", c->group, "biz_key", biz, "before", dup),
              "dead letter redelivered");
    } else if (ok) {
      SVC_LOG(SVC_LOG_WARN, json_pack("{s:s,s:s}", "group", c->group, "dead_letter", dl_id),
              "redelivered dead letter failed again: %s", why);
    }
    json_decref(payload);
    json_decref(ej);
    PQclear(r);
    if (!ok) goto fail;
  }
  return true;
fail:
  if (PQstatus(c->pg) == CONNECTION_OK && PQtransactionStatus(c->pg) != PQTRANS_IDLE)
    PQclear(PQexec(c->pg, "ROLLBACK"));
  return false;
}

/* The well-shaped entries of an XREADGROUP answer 'x' into batch[] (at
 * most READ_COUNT): how many. */
static size_t take_entries(const redisReply *x, const redisReply **batch) {
  size_t n = 0;
  if (!x || x->type != REDIS_REPLY_ARRAY || x->elements != 1 || x->element[0]->type != REDIS_REPLY_ARRAY ||
      x->element[0]->elements != 2 || x->element[0]->element[1]->type != REDIS_REPLY_ARRAY)
    return n;
  const redisReply *entries = x->element[0]->element[1];
  for (size_t i = 0; i < entries->elements && n < READ_COUNT; i++)
    if (entry_shaped(entries->element[i])) batch[n++] = entries->element[i];
  return n;
}

/* Step 3: new entries.  After a read that brought events the next read
 * waits until CONSUMER_LINGER_MS after it: what arrives meanwhile is
 * applied together, a commit per batch rather than per event, leaving the
 * CPU to the requests that wait for an answer (the events are
 * asynchronous already).  An event that finds the consumer idle is read
 * at once. */
static bool read_new(svc_consumer_t *c, char *err, size_t errlen) {
  if (!txc_worker_pause_since(&c->job, c->last_read_us, c->linger_ms)) return true; /* stopping */
  redisReply *x = svc_redis_cmd(c->redis, err, errlen, "XREADGROUP GROUP %s %s COUNT %d BLOCK 200 STREAMS %s >",
                                c->group, c->consumer, (int)c->batch_max, c->stream);
  if (!x) {
    if (strstr(err, "NOGROUP")) {
      SVC_LOG(SVC_LOG_WARN, json_pack("{s:s}", "group", c->group),
              "consumer: the group is gone from Redis (restarted without it?); creating it again from the start");
      return ensure_group(c, err, errlen);
    }
    return false;
  }
  const redisReply *batch[READ_COUNT];
  size_t n = take_entries(x, batch);
  c->last_read_us = n > 0 ? svc_now_us() : 0;
  if (n && !stopping(c)) process(c, batch, n, 1);
  freeReplyObject(x);
  return !c->redis->err;
}

/* Now and then: the group's pending count and lag, for the metrics. */
static void read_info(svc_consumer_t *c) {
  redisReply *x = redisCommand(c->redis, "XINFO GROUPS %s", c->stream);
  long long pending = -1, lag = -1;
  for (size_t i = 0; x && x->type == REDIS_REPLY_ARRAY && i < x->elements; i++) {
    const redisReply *g = x->element[i];
    bool mine = false;
    long long gp = -1, gl = -1;
    for (size_t k = 0; g->type == REDIS_REPLY_ARRAY && k + 1 < g->elements; k += 2) {
      const char *key = g->element[k]->str;
      const redisReply *v = g->element[k + 1];
      if (!key) continue;
      if (strcmp(key, "name") == 0) mine = v->str && strcmp(v->str, c->group) == 0;
      else if (strcmp(key, "pending") == 0) gp = v->integer;
      else if (strcmp(key, "lag") == 0) gl = v->type == REDIS_REPLY_INTEGER ? v->integer : -1;
    }
    if (mine) {
      pending = gp;
      lag = gl;
    }
  }
  if (x) freeReplyObject(x);
  pthread_mutex_lock(&c->job.mu);
  c->stats.pending = pending;
  c->stats.lag = lag;
  pthread_mutex_unlock(&c->job.mu);
}

/* Now and then: forget consumers of the group that left (a process killed
 * or restarted: its name had its pid) once they hold nothing and were
 * idle for CONSUMER_FORGET_IDLE_MS; their pending entries were claimed by
 * the retries already. */
#define CONSUMER_FORGET_IDLE_MS (10LL * 60 * 1000)
static void forget_departed(svc_consumer_t *c) {
  redisReply *x = redisCommand(c->redis, "XINFO CONSUMERS %s %s", c->stream, c->group);
  for (size_t i = 0; x && x->type == REDIS_REPLY_ARRAY && i < x->elements; i++) {
    const redisReply *e = x->element[i];
    const char *name = NULL;
    long long pending = -1, idle = -1;
    for (size_t k = 0; e->type == REDIS_REPLY_ARRAY && k + 1 < e->elements; k += 2) {
      const char *key = e->element[k]->str;
      const redisReply *v = e->element[k + 1];
      if (!key) continue;
      if (strcmp(key, "name") == 0) name = v->str;
      else if (strcmp(key, "pending") == 0) pending = v->integer;
      else if (strcmp(key, "idle") == 0) idle = v->integer;
    }
    if (name && strcmp(name, c->consumer) != 0 && pending == 0 && idle >= CONSUMER_FORGET_IDLE_MS)
      freeReplyObject(redisCommand(c->redis, "XGROUP DELCONSUMER %s %s %s", c->stream, c->group, name));
  }
  if (x) freeReplyObject(x);
}

static void *consumer_main(void *arg) {
  svc_consumer_t *c = arg;
  unsigned pause_ms = 0;
  while (txc_worker_sleep(&c->job, pause_ms)) {
    char err[512] = "";
    bool ok = connect_stores(c, err, sizeof(err));
    int64_t now = svc_now_us();
    if (ok && now >= c->next_retry_us) {
      ok = retry_due(c, err, sizeof(err));
      c->next_retry_us = now + 250000;
    }
    if (ok && now >= c->next_redeliver_us) {
      ok = redeliver_requested(c, err, sizeof(err));
      c->next_redeliver_us = now + 1000000;
    }
    if (ok && now >= c->next_info_us) {
      read_info(c);
      if (++c->info_passes % 30 == 0) forget_departed(c);
      c->next_info_us = now + 2000000;
    }
    if (ok) ok = read_new(c, err, sizeof(err));
    if (!ok) {
      loop_failed(c, err);
      pause_ms = pause_ms ? (pause_ms * 2 > 2000 ? 2000 : pause_ms * 2) : 100;
    } else {
      if (c->failing) SVC_LOG(SVC_LOG_INFO, json_pack("{s:s}", "group", c->group), "consumer: consuming again");
      c->failing = false;
      pause_ms = 0;
    }
  }
  return NULL;
}

/* CONSUMER_BACKOFF_MS="1000,5000": into c->backoff_ms.  false if malformed. */
static bool backoff_from_env(svc_consumer_t *c) {
  const char *s = svc_env_str("CONSUMER_BACKOFF_MS", NULL);
  if (!s) return true;
  char buf[512];
  snprintf(buf, sizeof(buf), "%s", s);
  size_t n = 0;
  for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
    long long v;
    if (n == MAX_BACKOFF || !svc_parse_ll(t, 1, 86400000, &v)) return false;
    c->backoff_ms[n++] = v;
  }
  if (n == 0) return false;
  c->nbackoff = n;
  return true;
}

static void consumer_free(svc_consumer_t *c) {
  if (c->pg) PQfinish(c->pg);
  if (c->redis) redisFree(c->redis);
  free(c->redis_url);
  free(c->pg_url);
  free(c->stream);
  free(c->group);
  free(c->consumer);
  free(c);
}

svc_consumer_t *svc_consumer_start(const svc_consumer_opts_t *o, char *err, size_t errlen) {
  if (!o->redis_url || !o->pg_url || !o->group || !o->apply) {
    snprintf(err, errlen, "a consumer needs Redis and database URLs, a group and an apply function");
    return NULL;
  }
  svc_consumer_t *c = calloc(1, sizeof(*c));
  if (!c) {
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  char name[128];
  char host[64] = "host";
  gethostname(host, sizeof(host) - 1);
  snprintf(name, sizeof(name), "%s-%d", host, (int)getpid());
  c->redis_url = strdup(o->redis_url);
  c->pg_url = strdup(o->pg_url);
  c->stream = strdup(o->stream ? o->stream : SVC_ORDER_STREAM);
  c->group = strdup(o->group);
  c->consumer = strdup(o->consumer ? o->consumer : name);
  c->apply = o->apply;
  c->apply_batch = o->apply_batch;
  c->after = o->after;
  c->arg = o->arg;
  c->auth = o->auth;
  c->stats.pending = c->stats.lag = -1;
  bool ok = true;
  c->max_deliveries = o->max_deliveries > 0 ? o->max_deliveries
                                            : (int)svc_env_int("CONSUMER_MAX_DELIVERIES", 16, 1, 1000, &ok);
  c->batch_max = o->batch_max > 0 && o->batch_max < READ_COUNT ? (size_t)o->batch_max : READ_COUNT;
  c->linger_ms = c->batch_max > 1 ? svc_env_int("CONSUMER_LINGER_MS", DEFAULT_LINGER_MS, 0, 1000, &ok) : 0;
  if (o->backoff_ms && o->nbackoff) {
    c->nbackoff = o->nbackoff < MAX_BACKOFF ? o->nbackoff : MAX_BACKOFF;
    memcpy(c->backoff_ms, o->backoff_ms, c->nbackoff * sizeof(int64_t));
  } else {
    c->nbackoff = sizeof(default_backoff_ms) / sizeof(default_backoff_ms[0]);
    memcpy(c->backoff_ms, default_backoff_ms, sizeof(default_backoff_ms));
    if (!backoff_from_env(c)) {
      svc_error("invalid CONSUMER_BACKOFF_MS: expected up to %d comma-separated milliseconds", MAX_BACKOFF);
      ok = false;
    }
  }
  if (!ok || !c->redis_url || !c->pg_url || !c->stream || !c->group || !c->consumer ||
      txc_worker_start(&c->job, consumer_main, c) != 0) {
    snprintf(err, errlen, ok ? "could not start the consumer thread" : "invalid consumer settings");
    consumer_free(c);
    return NULL;
  }
  return c;
}

void svc_consumer_stop(svc_consumer_t *c) {
  if (!c) return;
  txc_worker_stop(&c->job);
  consumer_free(c);
}

void svc_consumer_stats(svc_consumer_t *c, svc_consumer_stats_t *out) {
  memset(out, 0, sizeof(*out));
  if (!c) return;
  pthread_mutex_lock(&c->job.mu);
  *out = c->stats;
  pthread_mutex_unlock(&c->job.mu);
}

const char *svc_consumer_group(const svc_consumer_t *c) { return c->group; }

void svc_consumer_metrics(svc_consumer_t *const *cs, size_t n, txc_buf_t *b) {
  static const struct {
    const char *name, *help;
    size_t off;
  } counters[] = {
    {"consumed", "Order events applied by the consumer group.", offsetof(svc_consumer_stats_t, consumed)},
    {"duplicates", "Order events dropped as applied before.", offsetof(svc_consumer_stats_t, duplicates)},
    {"retried", "Deliveries that failed and will be tried again.", offsetof(svc_consumer_stats_t, retried)},
    {"dead_lettered", "Order events moved to the dead-letter table.", offsetof(svc_consumer_stats_t, dead_lettered)},
    {"redelivered", "Dead letters applied on an operator's request.", offsetof(svc_consumer_stats_t, redelivered)},
    {"commits", "Local transactions that applied order events (consumed / commits: events per commit).",
     offsetof(svc_consumer_stats_t, commits)},
    {"errors", "Store errors of the consumer loop.", offsetof(svc_consumer_stats_t, errors)},
  };
  svc_consumer_stats_t st[16];
  if (n > 16) n = 16;
  for (size_t i = 0; i < n; i++) svc_consumer_stats(cs[i], &st[i]);
  for (size_t k = 0; k < sizeof(counters) / sizeof(counters[0]); k++) {
    txc_buf_printf(b, "# HELP txc_events_%s_total %s\n# TYPE txc_events_%s_total counter\n", counters[k].name,
                   counters[k].help, counters[k].name);
    for (size_t i = 0; i < n; i++)
      txc_buf_printf(b, "txc_events_%s_total{group=\"%s\"} %llu\n", counters[k].name, svc_consumer_group(cs[i]),
                     (unsigned long long)*(const uint64_t *)((const char *)&st[i] + counters[k].off));
  }
  txc_buf_printf(b, "# HELP txc_events_consumer_lag Entries of the stream not yet delivered to the group.\n"
                    "# TYPE txc_events_consumer_lag gauge\n");
  for (size_t i = 0; i < n; i++)
    txc_buf_printf(b, "txc_events_consumer_lag{group=\"%s\"} %lld\n", svc_consumer_group(cs[i]), st[i].lag);
  txc_buf_printf(b, "# HELP txc_events_consumer_pending Entries delivered to the group and not acknowledged.\n"
                    "# TYPE txc_events_consumer_pending gauge\n");
  for (size_t i = 0; i < n; i++)
    txc_buf_printf(b, "txc_events_consumer_pending{group=\"%s\"} %lld\n", svc_consumer_group(cs[i]), st[i].pending);
}
