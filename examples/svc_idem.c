/*
 * svc_idem.c - the Redis fast path of the idempotent submit (see
 * svc_idem.h).
 */
#include "svc_idem.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include <hiredis/hiredis.h>

#include "svc_common.h"
#include "svc_redis.h"

#define POOL_IDLE 64           /* idle connections kept */
#define DOWN_US (500 * 1000)   /* no Redis call for this long after a failure */
#define PENDING "pending"

struct svc_idem {
  char *url; /* resolved at each connect (Sentinel: the current master) */
  unsigned cmd_ms, conn_ms;

  pthread_mutex_t mu; /* the fields below */
  redisContext *idle[POOL_IDLE];
  int nidle;
  int64_t down_until_us; /* svc_now_us() before which calls fail at once */
};

void svc_idem_answer_clear(svc_idem_answer_t *a) {
  json_decref(a->body);
  *a = (svc_idem_answer_t){0};
}

bool svc_idem_key_ok(const char *key) {
  size_t n = 0;
  if (!key) return false;
  for (; key[n]; n++) {
    char c = key[n];
    bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
              c == ':' || c == '-';
    if (!ok || n >= SVC_IDEM_KEY_MAX) return false;
  }
  return n > 0;
}

svc_idem_t *svc_idem_new(const char *redis_url, unsigned command_timeout_ms, unsigned connect_timeout_ms, char *err,
                         size_t errlen) {
  svc_idem_t *x = calloc(1, sizeof(*x));
  if (!x) {
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  if (!rm_redis_url_valid(redis_url) || !(x->url = strdup(redis_url))) {
    snprintf(err, errlen, "malformed Redis URL \"%s\" (expected redis://[:password@]host[:port][/db] or "
             "redis+sentinel://host:port,.../master-name)", redis_url ? redis_url : "");
    free(x);
    return NULL;
  }
  x->cmd_ms = command_timeout_ms ? command_timeout_ms : 500;
  x->conn_ms = connect_timeout_ms ? connect_timeout_ms : 1000;
  pthread_mutex_init(&x->mu, NULL);
  return x;
}

void svc_idem_free(svc_idem_t *x) {
  if (!x) return;
  for (int i = 0; i < x->nidle; i++) redisFree(x->idle[i]);
  pthread_mutex_destroy(&x->mu);
  free(x->url);
  free(x);
}

/* ---------------------------------------------------------- connections */

/* Something failed: drop the idle connections (after a Redis restart they
 * are all dead) and stay away for DOWN_US. */
static void went_down(svc_idem_t *x) {
  redisContext *idle[POOL_IDLE];
  pthread_mutex_lock(&x->mu);
  int n = x->nidle;
  memcpy(idle, x->idle, sizeof(idle[0]) * (size_t)n);
  x->nidle = 0;
  x->down_until_us = svc_now_us() + DOWN_US;
  pthread_mutex_unlock(&x->mu);
  for (int i = 0; i < n; i++) redisFree(idle[i]);
}

static redisContext *conn_get(svc_idem_t *x) {
  pthread_mutex_lock(&x->mu);
  redisContext *c = x->nidle > 0 ? x->idle[--x->nidle] : NULL;
  bool down = !c && svc_now_us() < x->down_until_us;
  pthread_mutex_unlock(&x->mu);
  if (c || down) return c;
  char err[256];
  c = svc_redis_connect_to(x->url, x->conn_ms, x->cmd_ms, err, sizeof(err));
  if (!c) {
    SVC_LOG(SVC_LOG_DEBUG, NULL, "idempotency fast path: %s", err);
    went_down(x);
    return NULL;
  }
  return c;
}

static void conn_put(svc_idem_t *x, redisContext *c) {
  if (c->err) {
    redisFree(c);
    went_down(x);
    return;
  }
  pthread_mutex_lock(&x->mu);
  if (x->nidle < POOL_IDLE) {
    x->idle[x->nidle++] = c;
    c = NULL;
  }
  pthread_mutex_unlock(&x->mu);
  if (c) redisFree(c);
}

/* One command; NULL on any failure (an error reply included). */
static redisReply *run(svc_idem_t *x, int argc, const char **argv) {
  redisContext *c = conn_get(x);
  if (!c) return NULL;
  redisReply *r = redisCommandArgv(c, argc, argv, NULL);
  if (!r)
    SVC_LOG(SVC_LOG_DEBUG, NULL, "idempotency fast path: Redis at \"%s:%d\": %s", c->tcp.host ? c->tcp.host : "?", c->tcp.port, c->errstr);
  conn_put(x, c);
  if (r && r->type == REDIS_REPLY_ERROR) {
    SVC_LOG(SVC_LOG_WARN, NULL, "idempotency fast path: Redis refused %s: %s", argv[0], r->str);
    freeReplyObject(r);
    return NULL;
  }
  return r;
}

/* ------------------------------------------------------------ commands */

static void rkey(char *out, size_t len, long long user, const char *key) {
  snprintf(out, len, "txc:idem:{%lld}:%s", user, key);
}

/* What a GET answered: the stored answer, the mark, or nothing. */
static svc_idem_state_t decode(redisReply *r, svc_idem_answer_t *out) {
  if (r->type == REDIS_REPLY_NIL) return SVC_IDEM_ABSENT;
  if (r->type != REDIS_REPLY_STRING) return SVC_IDEM_ERROR;
  if (strcmp(r->str, PENDING) == 0) return SVC_IDEM_PENDING;
  json_t *j = json_loadb(r->str, r->len, 0, NULL);
  json_t *body = json_object_get(j, "body");
  json_int_t st = json_integer_value(json_object_get(j, "status"));
  const char *req = json_string_value(json_object_get(j, "req"));
  if (!json_is_object(body) || st < 100 || st > 599 || !req) {
    json_decref(j);
    return SVC_IDEM_ERROR;
  }
  out->status = (int)st;
  out->body = json_incref(body);
  snprintf(out->req, sizeof(out->req), "%s", req);
  json_decref(j);
  return SVC_IDEM_STORED;
}

static svc_idem_state_t get(svc_idem_t *x, const char *k, svc_idem_answer_t *out) {
  const char *argv[2] = {"GET", k};
  redisReply *r = run(x, 2, argv);
  if (!r) return SVC_IDEM_ERROR;
  svc_idem_state_t st = decode(r, out);
  freeReplyObject(r);
  return st;
}

svc_idem_state_t svc_idem_claim(svc_idem_t *x, long long user, const char *key, unsigned lease_s,
                                svc_idem_answer_t *out) {
  char k[128], ex[16];
  rkey(k, sizeof(k), user, key);
  snprintf(ex, sizeof(ex), "%u", lease_s ? lease_s : 1);
  /* A mark that expires between the SET and the GET: claim again, once. */
  for (int attempt = 0; attempt < 2; attempt++) {
    const char *argv[6] = {"SET", k, PENDING, "NX", "EX", ex};
    redisReply *r = run(x, 6, argv);
    if (!r) return SVC_IDEM_ERROR;
    bool won = r->type == REDIS_REPLY_STATUS;
    bool lost = r->type == REDIS_REPLY_NIL;
    freeReplyObject(r);
    if (won) return SVC_IDEM_CLAIMED;
    if (!lost) return SVC_IDEM_ERROR;
    svc_idem_state_t st = get(x, k, out);
    if (st != SVC_IDEM_ABSENT) return st;
  }
  return SVC_IDEM_PENDING;
}

svc_idem_state_t svc_idem_peek(svc_idem_t *x, long long user, const char *key, svc_idem_answer_t *out) {
  char k[128];
  rkey(k, sizeof(k), user, key);
  return get(x, k, out);
}

int svc_idem_store(svc_idem_t *x, long long user, const char *key, const char *req, int status, json_t *body,
                   unsigned ttl_s) {
  char k[128], ex[16];
  rkey(k, sizeof(k), user, key);
  snprintf(ex, sizeof(ex), "%u", ttl_s ? ttl_s : 1);
  json_t *v = json_pack("{s:s,s:i,s:O}", "req", req, "status", status, "body", body);
  char *s = v ? json_dumps(v, JSON_COMPACT) : NULL;
  json_decref(v);
  if (!s) return -1;
  const char *argv[6] = {"SET", k, s, "XX", "EX", ex};
  redisReply *r = run(x, 6, argv);
  free(s);
  if (!r) return -1;
  freeReplyObject(r); /* nil: the mark was gone, nothing stored (on purpose) */
  return 0;
}

int svc_idem_forget(svc_idem_t *x, long long user, const char *key) {
  char k[128];
  rkey(k, sizeof(k), user, key);
  const char *argv[2] = {"DEL", k};
  redisReply *r = run(x, 2, argv);
  if (!r) return -1;
  freeReplyObject(r);
  return 0;
}
