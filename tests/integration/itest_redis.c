/* itest_redis.c - see itest_redis.h. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "itest_redis.h"

redisContext *itest_redis_connect(const char *url) {
  const char *prefix = "redis://";
  char host[64];
  int port = 0;
  if (!url || strncmp(url, prefix, strlen(prefix)) != 0 ||
      sscanf(url + strlen(prefix), "%63[^:]:%d", host, &port) != 2)
    return NULL;
  redisContext *c = redisConnect(host, port);
  if (c && c->err) {
    redisFree(c);
    c = NULL;
  }
  return c;
}

redisReply *itest_rcmd(redisContext *c, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  redisReply *r = redisvCommand(c, fmt, ap);
  va_end(ap);
  if (!r) fail_msg("redis: %s", c->errstr);
  return r;
}
