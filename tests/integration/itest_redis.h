/*
 * itest_redis.h - a test's own plain look into the Redis under test
 * (REDIS_URL, "redis://host:port"), for the cases that read or write keys
 * around the code they test.
 */
#ifndef ITEST_REDIS_H
#define ITEST_REDIS_H

#include <hiredis/hiredis.h>

/* A new connection to 'url'; NULL when the URL is malformed or the
 * connection failed. */
redisContext *itest_redis_connect(const char *url);
/* A command on 'c'; the running case fails when no reply came (the reply,
 * an error reply included, is the caller's to free). */
redisReply *itest_rcmd(redisContext *c, const char *fmt, ...);

#endif
