/*
 * order_queue.c - the consumer of the queued order path (order_queue.h).
 */
#include "order_queue.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "rm_client.h"
#include "svc_common.h"
#include "svc_idem.h"
#include "svc_parse.h"
#include "svc_redis.h"

#define MAX_STREAMS 64
#define BATCH 16
#define BLOCK_MS 100

typedef struct worker {
  struct order_queue *q;
  pthread_t thread;
  unsigned index;
  char consumer[96];
  redisContext *redis;
  long long grouped[MAX_STREAMS]; /* activities whose group this thread made sure of */
  unsigned ngrouped;
  int64_t next_scan_us, next_claim_us;
  bool failing;
} worker_t;

struct order_queue {
  char *redis_url;
  order_queue_place_fn place;
  void *arg;
  pthread_mutex_t mu;
  bool stopping;                /* under mu */
  long long acts[MAX_STREAMS];  /* under mu */
  unsigned nacts;               /* under mu */
  order_queue_stats_t stats;    /* under mu */
  unsigned nworkers;
  worker_t *workers;
};

static int64_t now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static bool stopping(order_queue_t *q) {
  pthread_mutex_lock(&q->mu);
  bool s = q->stopping;
  pthread_mutex_unlock(&q->mu);
  return s;
}

static void count(order_queue_t *q, unsigned long long *field) {
  pthread_mutex_lock(&q->mu);
  (*field)++;
  pthread_mutex_unlock(&q->mu);
}

/* Add 'activity' to the known set (no-op when known or full). */
static void add_activity(order_queue_t *q, long long activity) {
  pthread_mutex_lock(&q->mu);
  unsigned i = 0;
  while (i < q->nacts && q->acts[i] != activity) i++;
  if (i == q->nacts && q->nacts < MAX_STREAMS) q->acts[q->nacts++] = activity;
  if (i == q->nacts && q->nacts == MAX_STREAMS && q->acts[MAX_STREAMS - 1] != activity)
    svc_warn("order queue: more than %d activities with queued orders; the others wait for a slot", MAX_STREAMS);
  q->stats.streams = q->nacts;
  pthread_mutex_unlock(&q->mu);
}

void order_queue_note(order_queue_t *q, long long activity) {
  if (q && activity > 0) add_activity(q, activity);
}

/* The activity of a stream key "{act_<A>}:queue", or 0. */
static long long key_activity(const char *key) {
  long long a = 0;
  char tail[8];
  if (sscanf(key, "{act_%lld}%7s", &a, tail) != 2 || strcmp(tail, ":queue") != 0 || a <= 0) return 0;
  char again[64];
  if (rm_prefilter_queue_key(a, again, sizeof(again)) != 0 || strcmp(again, key) != 0) return 0;
  return a;
}

/* SCAN for the streams of other instances (bounded: 100 pages). */
static bool scan_streams(worker_t *w, char *err, size_t errlen) {
  char cursor[32] = "0";
  for (int page = 0; page < 100; page++) {
    redisReply *r = svc_redis_cmd(w->redis, err, errlen, "SCAN %s MATCH {act_*}:queue COUNT 1000 TYPE stream", cursor);
    if (!r) return false;
    bool ok = r->type == REDIS_REPLY_ARRAY && r->elements == 2 && r->element[0]->type == REDIS_REPLY_STRING &&
              r->element[1]->type == REDIS_REPLY_ARRAY;
    if (ok) {
      snprintf(cursor, sizeof(cursor), "%s", r->element[0]->str);
      for (size_t i = 0; i < r->element[1]->elements; i++) {
        redisReply *k = r->element[1]->element[i];
        long long a = k->type == REDIS_REPLY_STRING ? key_activity(k->str) : 0;
        if (a) add_activity(w->q, a);
      }
    }
    freeReplyObject(r);
    if (!ok) {
      snprintf(err, errlen, "unexpected reply to SCAN");
      return false;
    }
    if (strcmp(cursor, "0") == 0) break;
  }
  return true;
}

/* The group on every known stream (XGROUP CREATE ... MKSTREAM; BUSYGROUP
 * means it was there). */
static bool ensure_groups(worker_t *w, const long long *acts, unsigned n, char *err, size_t errlen) {
  for (unsigned i = 0; i < n; i++) {
    unsigned j = 0;
    while (j < w->ngrouped && w->grouped[j] != acts[i]) j++;
    if (j < w->ngrouped) continue;
    char key[64];
    rm_prefilter_queue_key(acts[i], key, sizeof(key));
    redisReply *r = redisCommand(w->redis, "XGROUP CREATE %s " ORDER_QUEUE_GROUP " 0 MKSTREAM", key);
    if (!r) {
      snprintf(err, errlen, "XGROUP CREATE: %s", w->redis->errstr);
      return false;
    }
    bool ok = r->type != REDIS_REPLY_ERROR || strncmp(r->str, "BUSYGROUP", 9) == 0;
    if (!ok) snprintf(err, errlen, "XGROUP CREATE %s: %s", key, r->str);
    freeReplyObject(r);
    if (!ok) return false;
    if (w->ngrouped < MAX_STREAMS) w->grouped[w->ngrouped++] = acts[i];
  }
  return true;
}

/* One entry [id, [field, value, ...]] into 'e'; false if malformed. */
static bool parse_entry(const redisReply *fields, long long activity, order_queue_entry_t *e) {
  if (!fields || fields->type != REDIS_REPLY_ARRAY || fields->elements % 2 != 0) return false;
  static const char *const names[] = {"order", "user", "tt", "qty", "bucket", "deadline"};
  long long v[6];
  bool seen[6] = {false};
  char key[65] = "";
  for (size_t i = 0; i < fields->elements; i += 2) {
    const redisReply *f = fields->element[i], *x = fields->element[i + 1];
    if (f->type != REDIS_REPLY_STRING || x->type != REDIS_REPLY_STRING) return false;
    if (strcmp(f->str, "key") == 0) {
      if (key[0] || !svc_idem_key_ok(x->str)) return false;
      snprintf(key, sizeof(key), "%s", x->str);
    }
    for (int k = 0; k < 6; k++) {
      if (strcmp(f->str, names[k]) != 0) continue;
      long long lo = k == 2 || k == 4 ? 0 : 1;
      long long hi = k == 3 ? 10000 : k == 2 || k == 4 ? INT32_MAX : INT64_MAX;
      if (seen[k] || !svc_parse_ll(x->str, lo, hi, &v[k])) return false;
      seen[k] = true;
    }
  }
  for (int k = 0; k < 6; k++)
    if (!seen[k]) return false;
  *e = (order_queue_entry_t){.activity = activity, .order_id = v[0], .user = v[1], .ticket_type = v[2],
                             .qty = v[3], .bucket = v[4], .deadline_ms = v[5]};
  snprintf(e->key, sizeof(e->key), "%s", key);
  return true;
}

/* Handle the entries of one stream's reply array. */
static void handle_entries(worker_t *w, long long activity, const redisReply *entries, bool claimed) {
  order_queue_t *q = w->q;
  char key[64], err[256];
  rm_prefilter_queue_key(activity, key, sizeof(key));
  for (size_t i = 0; entries && entries->type == REDIS_REPLY_ARRAY && i < entries->elements; i++) {
    const redisReply *ent = entries->element[i];
    if (ent->type != REDIS_REPLY_ARRAY || ent->elements != 2 || ent->element[0]->type != REDIS_REPLY_STRING)
      continue;
    const char *id = ent->element[0]->str;
    order_queue_entry_t e;
    order_queue_result_t res = ORDER_QUEUE_DONE;
    if (claimed) count(q, &q->stats.claimed);
    if (!parse_entry(ent->element[1], activity, &e)) {
      /* deleted meanwhile (nil fields) or not the freeze script's: nothing
       * to create; a freeze without its order expires on its own */
      if (ent->element[1]->type != REDIS_REPLY_NIL) {
        count(q, &q->stats.bad);
        SVC_LOG(SVC_LOG_WARN, json_pack("{s:s,s:s}", "stream", key, "entry", id),
                "order queue: a malformed entry, deleted");
      }
    } else {
      res = q->place(&e, q->arg);
    }
    if (res == ORDER_QUEUE_LATER) {
      count(q, &q->stats.later);
      continue;
    }
    redisReply *r = svc_redis_cmd(w->redis, err, sizeof(err), "XACK %s " ORDER_QUEUE_GROUP " %s", key, id);
    if (r) freeReplyObject(r);
    r = r ? svc_redis_cmd(w->redis, err, sizeof(err), "XDEL %s %s", key, id) : NULL;
    if (r) freeReplyObject(r);
    if (!r) {
      /* left pending: claimed again later, and the callback finds the
       * order made */
      count(q, &q->stats.errors);
      svc_warn("order queue: could not acknowledge entry %s of %s: %s", id, key, err);
      return;
    }
    count(q, &q->stats.done);
  }
}

/* Entries idle longer than ORDER_QUEUE_RETRY_MS at any consumer. */
static bool claim_idle(worker_t *w, const long long *acts, unsigned n, char *err, size_t errlen) {
  for (unsigned i = 0; i < n && !stopping(w->q); i++) {
    char key[64];
    rm_prefilter_queue_key(acts[i], key, sizeof(key));
    redisReply *r = svc_redis_cmd(w->redis, err, errlen, "XAUTOCLAIM %s " ORDER_QUEUE_GROUP " %s %d 0-0 COUNT %d",
                                  key, w->consumer, ORDER_QUEUE_RETRY_MS, BATCH);
    if (!r) return false;
    if (r->type == REDIS_REPLY_ARRAY && r->elements >= 2) handle_entries(w, acts[i], r->element[1], true);
    freeReplyObject(r);
  }
  return true;
}

/* One XREADGROUP over every known stream, waiting up to BLOCK_MS. */
static bool read_new(worker_t *w, const long long *acts, unsigned n, char *err, size_t errlen) {
  if (n == 0) {
    struct timespec ts = {0, BLOCK_MS * 1000000L};
    nanosleep(&ts, NULL);
    return true;
  }
  const char *argv[9 + 2 * MAX_STREAMS];
  size_t lens[9 + 2 * MAX_STREAMS];
  char keys[MAX_STREAMS][64], count_s[16], block_s[16];
  int argc = 0;
  snprintf(count_s, sizeof(count_s), "%d", BATCH);
  snprintf(block_s, sizeof(block_s), "%d", BLOCK_MS);
  argv[argc++] = "XREADGROUP";
  argv[argc++] = "GROUP";
  argv[argc++] = ORDER_QUEUE_GROUP;
  argv[argc++] = w->consumer;
  argv[argc++] = "COUNT";
  argv[argc++] = count_s;
  argv[argc++] = "BLOCK";
  argv[argc++] = block_s;
  argv[argc++] = "STREAMS";
  for (unsigned i = 0; i < n; i++) {
    rm_prefilter_queue_key(acts[i], keys[i], sizeof(keys[i]));
    argv[argc++] = keys[i];
  }
  for (unsigned i = 0; i < n; i++) argv[argc++] = ">";
  for (int i = 0; i < argc; i++) lens[i] = strlen(argv[i]);
  redisReply *r = redisCommandArgv(w->redis, argc, argv, lens);
  if (!r) {
    snprintf(err, errlen, "XREADGROUP: %s", w->redis->errstr);
    return false;
  }
  bool ok = r->type != REDIS_REPLY_ERROR;
  if (!ok) {
    snprintf(err, errlen, "XREADGROUP: %s", r->str);
    if (strncmp(r->str, "NOGROUP", 7) == 0) w->ngrouped = 0; /* a stream lost (Redis restarted): again */
  } else if (r->type == REDIS_REPLY_ARRAY) {
    for (size_t i = 0; i < r->elements; i++) {
      const redisReply *s = r->element[i];
      if (s->type != REDIS_REPLY_ARRAY || s->elements != 2 || s->element[0]->type != REDIS_REPLY_STRING) continue;
      long long a = key_activity(s->element[0]->str);
      if (a) handle_entries(w, a, s->element[1], false);
    }
  }
  freeReplyObject(r);
  return ok;
}

static void *worker_main(void *arg) {
  worker_t *w = arg;
  order_queue_t *q = w->q;
  char err[512] = "";
  while (!stopping(q)) {
    bool ok = svc_redis_ensure(&w->redis, q->redis_url, 2000, err, sizeof(err)) != 0;
    int64_t t = now_us();
    if (ok && t >= w->next_scan_us) {
      ok = scan_streams(w, err, sizeof(err));
      w->next_scan_us = t + ORDER_QUEUE_SCAN_MS * 1000LL;
    }
    long long acts[MAX_STREAMS];
    pthread_mutex_lock(&q->mu);
    unsigned n = q->nacts;
    memcpy(acts, q->acts, n * sizeof(acts[0]));
    pthread_mutex_unlock(&q->mu);
    if (ok) ok = ensure_groups(w, acts, n, err, sizeof(err));
    if (ok && t >= w->next_claim_us) {
      ok = claim_idle(w, acts, n, err, sizeof(err));
      w->next_claim_us = t + 1000000;
    }
    if (ok) ok = read_new(w, acts, n, err, sizeof(err));
    if (!ok) {
      count(q, &q->stats.errors);
      if (!w->failing && w->index == 0) svc_warn("order queue: Redis failed: %s (tried again)", err);
      w->failing = true;
      if (w->redis && w->redis->err) {
        redisFree(w->redis);
        w->redis = NULL;
      }
      struct timespec ts = {0, 500 * 1000000L};
      nanosleep(&ts, NULL);
    } else if (w->failing) {
      w->failing = false;
      if (w->index == 0) svc_info("order queue: Redis works again");
    }
  }
  if (w->redis) redisFree(w->redis);
  w->redis = NULL;
  return NULL;
}

order_queue_t *order_queue_start(const char *redis_url, unsigned threads, order_queue_place_fn place, void *arg,
                                 char *err, size_t errlen) {
  if (!redis_url || !place || threads < 1 || threads > 256) {
    snprintf(err, errlen, "order queue: a Redis URL, a callback and 1 to 256 threads are needed");
    return NULL;
  }
  order_queue_t *q = calloc(1, sizeof(*q));
  if (!q || !(q->redis_url = strdup(redis_url)) || !(q->workers = calloc(threads, sizeof(worker_t)))) {
    if (q) free(q->redis_url);
    free(q);
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  q->place = place;
  q->arg = arg;
  pthread_mutex_init(&q->mu, NULL);
  char host[64] = "host";
  gethostname(host, sizeof(host) - 1);
  for (unsigned i = 0; i < threads; i++) {
    worker_t *w = &q->workers[i];
    w->q = q;
    w->index = i;
    snprintf(w->consumer, sizeof(w->consumer), "%s-%ld-%u", host, (long)getpid(), i);
    if (pthread_create(&w->thread, NULL, worker_main, w) != 0) {
      snprintf(err, errlen, "order queue: could not start a thread: %s", strerror(errno));
      order_queue_stop(q); /* the threads started so far */
      return NULL;
    }
    q->nworkers++;
  }
  return q;
}

void order_queue_stop(order_queue_t *q) {
  if (!q) return;
  pthread_mutex_lock(&q->mu);
  q->stopping = true;
  pthread_mutex_unlock(&q->mu);
  for (unsigned i = 0; i < q->nworkers; i++) pthread_join(q->workers[i].thread, NULL);
  pthread_mutex_destroy(&q->mu);
  free(q->workers);
  free(q->redis_url);
  free(q);
}

void order_queue_stats(order_queue_t *q, order_queue_stats_t *out) {
  *out = (order_queue_stats_t){0};
  if (!q) return;
  pthread_mutex_lock(&q->mu);
  *out = q->stats;
  pthread_mutex_unlock(&q->mu);
}
