/*
 * svc_redis.h - one plain hiredis connection from a REDIS_URL, for the
 * examples' own Redis work beside the prefilter: the outbox relay, the
 * event consumers and the checker's direct reads.
 *
 * NOTES
 *   Blocking hiredis with a connect and a command timeout: these run on
 *   threads of their own (never on an event loop).  A context whose 'err'
 *   is set is dead: free it and connect again.
 */
#ifndef SVC_REDIS_H
#define SVC_REDIS_H

#include <stddef.h>

#include <hiredis/hiredis.h>

/* Connect to 'url' (redis://[:password@]host[:port][/db]) with
 * 'timeout_ms' for the connect and every command, AUTH and SELECT as the
 * URL says.  NULL with 'err' set when it fails. */
redisContext *svc_redis_connect(const char *url, unsigned timeout_ms, char *err, size_t errlen);

/* Run a command (redisCommand's format); the reply, or NULL with 'err' set
 * (transport error: the context is dead, or an error reply: the reply is
 * freed and its text copied). */
redisReply *svc_redis_cmd(redisContext *c, char *err, size_t errlen, const char *fmt, ...);

#endif /* SVC_REDIS_H */
