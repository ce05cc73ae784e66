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

#define POOL_IDLE 64           /* idle connections kept */
#define DOWN_US (500 * 1000)   /* no Redis call for this long after a failure */
#define PENDING "pending"

struct svc_idem {
  char host[256], password[256];
  int port, db;
  struct timeval cmd_tv, conn_tv;

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

static struct timeval ms_tv(unsigned ms) { return (struct timeval){.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000}; }

/* "redis://[[user]:password@]host[:port][/db]" into 'x'. */
static bool parse_url(svc_idem_t *x, const char *url) {
  const char *u = url;
  if (strncmp(u, "redis://", 8) != 0) return false;
  u += 8;
  const char *at = strrchr(u, '@');
  if (at) {
    const char *colon = memchr(u, ':', (size_t)(at - u));
    if (colon) {
      size_t pl = (size_t)(at - colon - 1);
      if (pl >= sizeof(x->password)) return false;
      memcpy(x->password, colon + 1, pl);
      x->password[pl] = '\0';
    }
    u = at + 1;
  }
  const char *h = u, *he;
  if (*u == '[') {
    h = u + 1;
    he = strchr(h, ']');
    if (!he) return false;
    u = he + 1;
  } else {
    he = u + strcspn(u, ":/");
    u = he;
  }
  size_t hl = (size_t)(he - h);
  if (hl == 0 || hl >= sizeof(x->host)) return false;
  memcpy(x->host, h, hl);
  x->host[hl] = '\0';
  long long v = 6379;
  if (*u == ':') {
    char port[8];
    size_t l = strcspn(u + 1, "/");
    if (l == 0 || l >= sizeof(port)) return false;
    memcpy(port, u + 1, l);
    port[l] = '\0';
    if (!svc_parse_ll(port, 1, 65535, &v)) return false;
    u += 1 + l;
  }
  x->port = (int)v;
  v = 0;
  if (*u == '/' && u[1] && !svc_parse_ll(u + 1, 0, 1000000, &v)) return false;
  x->db = (int)v;
  return *u == '\0' || *u == '/';
}

svc_idem_t *svc_idem_new(const char *redis_url, unsigned command_timeout_ms, unsigned connect_timeout_ms, char *err,
                         size_t errlen) {
  svc_idem_t *x = calloc(1, sizeof(*x));
  if (!x) {
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  if (!redis_url || !parse_url(x, redis_url)) {
    snprintf(err, errlen, "malformed Redis URL \"%s\" (expected redis://[:password@]host[:port][/db])",
             redis_url ? redis_url : "");
    free(x);
    return NULL;
  }
  x->cmd_tv = ms_tv(command_timeout_ms ? command_timeout_ms : 500);
  x->conn_tv = ms_tv(connect_timeout_ms ? connect_timeout_ms : 1000);
  pthread_mutex_init(&x->mu, NULL);
  return x;
}

void svc_idem_free(svc_idem_t *x) {
  if (!x) return;
  for (int i = 0; i < x->nidle; i++) redisFree(x->idle[i]);
  pthread_mutex_destroy(&x->mu);
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

/* A reply of the type wanted, else NULL (freed). */
static redisReply *expect(redisReply *r, int type) {
  if (r && r->type == type) return r;
  if (r) freeReplyObject(r);
  return NULL;
}

static redisContext *conn_get(svc_idem_t *x) {
  pthread_mutex_lock(&x->mu);
  redisContext *c = x->nidle > 0 ? x->idle[--x->nidle] : NULL;
  bool down = !c && svc_now_us() < x->down_until_us;
  pthread_mutex_unlock(&x->mu);
  if (c || down) return c;
  c = redisConnectWithTimeout(x->host, x->port, x->conn_tv);
  bool ok = c && !c->err && redisSetTimeout(c, x->cmd_tv) == REDIS_OK;
  if (ok && x->password[0]) {
    redisReply *r = expect(redisCommand(c, "AUTH %s", x->password), REDIS_REPLY_STATUS);
    ok = r != NULL;
    if (r) freeReplyObject(r);
  }
  if (ok && x->db) {
    redisReply *r = expect(redisCommand(c, "SELECT %d", x->db), REDIS_REPLY_STATUS);
    ok = r != NULL;
    if (r) freeReplyObject(r);
  }
  if (!ok) {
    SVC_LOG(SVC_LOG_DEBUG, NULL, "idempotency fast path: could not connect to Redis at \"%s:%d\": %s", x->host,
            x->port, c ? c->errstr : "out of memory");
    if (c) redisFree(c);
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
    SVC_LOG(SVC_LOG_DEBUG, NULL, "idempotency fast path: Redis at \"%s:%d\": %s", x->host, x->port, c->errstr);
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
