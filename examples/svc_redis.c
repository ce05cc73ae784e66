/*
 * svc_redis.c - plain hiredis connections for the examples (svc_redis.h).
 */
#include "svc_redis.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sys/time.h>

#include "rm_client.h"
#include "svc_parse.h"

/* Redis addresses are librmclient's (rm_redis_*, rm_client.h): one parser
 * and one Sentinel resolver for the library and the services. */
static void addr_from(const rm_redis_addr_t *r, svc_redis_addr_t *x) {
  memset(x, 0, sizeof(*x));
  snprintf(x->host, sizeof(x->host), "%s", r->host);
  snprintf(x->password, sizeof(x->password), "%s", r->password);
  x->port = r->port;
  x->db = r->db;
}

bool svc_redis_parse_url(const char *url, svc_redis_addr_t *x) {
  rm_redis_addr_t r;
  memset(x, 0, sizeof(*x));
  /* A plain URL resolves without I/O; a Sentinel URL has no fixed address. */
  if (!url || strncmp(url, "redis://", 8) != 0 || rm_redis_resolve(url, 0, &r) != 0) return false;
  addr_from(&r, x);
  return true;
}

static char env_url[4096];
static const char *env_url_p;

static void env_url_init(void) { env_url_p = rm_redis_url_from_env(env_url, sizeof(env_url)); }

const char *svc_redis_env_url(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, env_url_init);
  return env_url_p;
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

redisContext *svc_redis_connect_to(const char *url, unsigned connect_ms, unsigned command_ms, char *err,
                                   size_t errlen) {
  rm_redis_addr_t r;
  svc_redis_addr_t a;
  int rc = rm_redis_resolve(url, connect_ms, &r);
  if (rc == RM_E_INVALID) {
    snprintf(err, errlen, "malformed Redis URL \"%s\" (expected redis://[:password@]host[:port][/db] or "
             "redis+sentinel://host:port,.../master-name[/db])", url ? url : "");
    return NULL;
  }
  if (rc != 0) {
    snprintf(err, errlen, "%s: %s", rm_prefilter_strerror(rc), rm_prefilter_errmsg());
    return NULL;
  }
  addr_from(&r, &a);
  return svc_redis_open(&a, connect_ms, command_ms, err, errlen);
}

redisContext *svc_redis_connect(const char *url, unsigned timeout_ms, char *err, size_t errlen) {
  return svc_redis_connect_to(url, timeout_ms, timeout_ms, err, errlen);
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
    if (r->str && strncmp(r->str, "READONLY", 8) == 0) {
      /* A demoted master (a Sentinel failover): this context is done
       * with; the caller's next connect finds the new master. */
      c->err = REDIS_ERR_OTHER;
      snprintf(c->errstr, sizeof(c->errstr), "the server is a replica now (READONLY)");
    }
    freeReplyObject(r);
    return NULL;
  }
  return r;
}
