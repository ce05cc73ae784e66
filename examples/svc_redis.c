/*
 * svc_redis.c - plain hiredis connections for the examples (svc_redis.h).
 */
#include "svc_redis.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

redisContext *svc_redis_connect(const char *url, unsigned timeout_ms, char *err, size_t errlen) {
  char host[256] = "127.0.0.1", pass[256] = "";
  int port = 6379, db = 0;
  const char *u = url ? url : "";
  if (strncmp(u, "redis://", 8) == 0) u += 8;
  const char *at = strchr(u, '@');
  if (at) {
    const char *colon = memchr(u, ':', (size_t)(at - u));
    if (colon) snprintf(pass, sizeof(pass), "%.*s", (int)(at - colon - 1), colon + 1);
    u = at + 1;
  }
  size_t hl = strcspn(u, ":/");
  if (hl >= sizeof(host)) {
    snprintf(err, errlen, "invalid Redis URL \"%s\": host name too long", url);
    return NULL;
  }
  if (hl) snprintf(host, sizeof(host), "%.*s", (int)hl, u);
  if (u[hl] == ':') port = atoi(u + hl + 1);
  const char *slash = strchr(u, '/');
  if (slash) db = atoi(slash + 1);
  if (port <= 0 || port > 65535 || db < 0) {
    snprintf(err, errlen, "invalid Redis URL \"%s\": expected redis://[:password@]host[:port][/db]", url);
    return NULL;
  }
  struct timeval tv = {(time_t)(timeout_ms / 1000), (suseconds_t)(timeout_ms % 1000) * 1000};
  redisContext *c = redisConnectWithTimeout(host, port, tv);
  if (!c || c->err) {
    snprintf(err, errlen, "could not connect to Redis at %s:%d: %s", host, port, c ? c->errstr : "out of memory");
    if (c) redisFree(c);
    return NULL;
  }
  redisSetTimeout(c, tv);
  if (pass[0]) {
    redisReply *r = svc_redis_cmd(c, err, errlen, "AUTH %s", pass);
    if (!r) {
      redisFree(c);
      return NULL;
    }
    freeReplyObject(r);
  }
  if (db) {
    redisReply *r = svc_redis_cmd(c, err, errlen, "SELECT %d", db);
    if (!r) {
      redisFree(c);
      return NULL;
    }
    freeReplyObject(r);
  }
  return c;
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
