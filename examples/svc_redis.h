/*
 * svc_redis.h - one plain hiredis connection from a REDIS_URL, for the
 * examples' own Redis work beside the prefilter: the outbox relay, the
 * event consumers and the checker's direct reads.
 *
 * NOTES
 *   Blocking hiredis with a connect and a command timeout: these run on
 *   threads of their own (never on an event loop).  A context whose 'err'
 *   is set is dead: free it and connect again.
 *
 *   Addresses: a URL is parsed and, for a Sentinel URL, resolved by
 *   librmclient (rm_redis_resolve, rm_client.h), so every (re)connect goes
 *   to the current master; a READONLY reply (a demoted master) marks the
 *   context dead, so the next svc_redis_ensure finds the new one.  The
 *   programs take their URL from svc_redis_env_url().
 */
#ifndef SVC_REDIS_H
#define SVC_REDIS_H

#include <stdbool.h>
#include <stddef.h>

#include <hiredis/hiredis.h>

/* Where a REDIS_URL points. */
typedef struct svc_redis_addr {
  char host[256], password[256];
  int port, db;
} svc_redis_addr_t;

/* Parse "redis://[:password@]host[:port][/db]" (host may be "[v6addr]";
 * port 1..65535, default 6379).  false if malformed, or a Sentinel URL
 * (it has no fixed address: use svc_redis_connect_to). */
bool svc_redis_parse_url(const char *url, svc_redis_addr_t *out);

/* The Redis URL of the environment (rm_redis_url_from_env: a Sentinel URL
 * from REDIS_SENTINELS and REDIS_MASTER_NAME, else REDIS_URL), computed
 * once; NULL if none is set. */
const char *svc_redis_env_url(void);

/* Connect to 'a' with these timeouts, AUTH and SELECT as it says.  NULL
 * with 'err' set when it fails. */
redisContext *svc_redis_open(const svc_redis_addr_t *a, unsigned connect_ms, unsigned command_ms, char *err,
                             size_t errlen);

/* Resolve 'url' (either form; a Sentinel URL: each step bounded by
 * 'connect_ms') and svc_redis_open the master.  NULL with 'err' set. */
redisContext *svc_redis_connect_to(const char *url, unsigned connect_ms, unsigned command_ms, char *err,
                                   size_t errlen);
/* svc_redis_connect_to with 'timeout_ms' for both. */
redisContext *svc_redis_connect(const char *url, unsigned timeout_ms, char *err, size_t errlen);

/* A thread's own connection: keep '*c' if it has no error, else connect
 * again.  Returns 1 when it is the connection it was, 2 when it is a new
 * one (the caller redoes its set-up), 0 with 'err' set and '*c' NULL. */
int svc_redis_ensure(redisContext **c, const char *url, unsigned timeout_ms, char *err, size_t errlen);

/* Run a command (redisCommand's format); the reply, or NULL with 'err' set
 * (transport error: the context is dead, or an error reply: the reply is
 * freed and its text copied). */
redisReply *svc_redis_cmd(redisContext *c, char *err, size_t errlen, const char *fmt, ...);

#endif /* SVC_REDIS_H */
