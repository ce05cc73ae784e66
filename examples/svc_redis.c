/*
 * svc_redis.c - plain hiredis connections for the examples (svc_redis.h).
 */
#include "svc_redis.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include "svc_parse.h"

bool svc_redis_parse_url(const char *url, svc_redis_addr_t *x) {
  memset(x, 0, sizeof(*x));
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

redisContext *svc_redis_open(const svc_redis_addr_t *a, unsigned connect_ms, unsigned command_ms, char *err,
                             size_t errlen) {
  struct timeval ctv = {(time_t)(connect_ms / 1000), (suseconds_t)(connect_ms % 1000) * 1000};
  struct timeval tv = {(time_t)(command_ms / 1000), (suseconds_t)(command_ms % 1000) * 1000};
  redisContext *c = redisConnectWithTimeout(a->host, a->port, ctv);
  if (!c || c->err) {
    snprintf(err, errlen, "could not connect to Redis at \"%s:%d\": %s", a->host, a->port,
             c ? c->errstr : "out of memory");
    if (c) redisFree(c);
    return NULL;
  }
  redisSetTimeout(c, tv);
  if (a->password[0]) {
    redisReply *r = svc_redis_cmd(c, err, errlen, "AUTH %s", a->password);
    if (!r) {
      redisFree(c);
      return NULL;
    }
    freeReplyObject(r);
  }
  if (a->db) {
    redisReply *r = svc_redis_cmd(c, err, errlen, "SELECT %d", a->db);
    if (!r) {
      redisFree(c);
      return NULL;
    }
    freeReplyObject(r);
  }
  return c;
}

redisContext *svc_redis_connect(const char *url, unsigned timeout_ms, char *err, size_t errlen) {
  svc_redis_addr_t a;
  if (!url || !svc_redis_parse_url(url, &a)) {
    snprintf(err, errlen, "malformed Redis URL \"%s\" (expected redis://[:password@]host[:port][/db])",
             url ? url : "");
    return NULL;
  }
  return svc_redis_open(&a, timeout_ms, timeout_ms, err, errlen);
}

int svc_redis_ensure(redisContext **c, const char *url, unsigned timeout_ms, char *err, size_t errlen) {
  if (*c && !(*c)->err) return 1;
  if (*c) redisFree(*c);
  *c = svc_redis_connect(url, timeout_ms, err, errlen);
  return *c ? 2 : 0;
}

redisReply *svc_redis_cmd(redisContext *c, char *err, size_t errlen, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  redisReply *r = redisvCommand(c, fmt, ap);
  va_end(ap);
  if (!r) {
    snprintf(err, errlen, "Redis: %s", c->errstr[0] ? c->errstr : "no reply");
    return NULL;
  }
  if (r->type == REDIS_REPLY_ERROR) {
    snprintf(err, errlen, "Redis: %s", r->str ? r->str : "error reply");
    freeReplyObject(r);
    return NULL;
  }
  return r;
}
