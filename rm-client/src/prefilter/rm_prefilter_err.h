/*
 * rm_prefilter_err.h - the prefilter's leaves: the thread-local message of
 * the last failure (rm_prefilter_errmsg) and the self-connected socket
 * check.  Both the connection pool (rm_prefilter_conn.c) and the Sentinel
 * resolver (rm_redis_sentinel.c) use them; they include nothing of either.
 *
 * The message is per thread on purpose, like errno and rm_errmsg (public
 * API: rm_client.h): one rm_prefilter_t serves any number of threads at
 * once, and the rm_prefilter_pg_* and rm_local_* calls that also report
 * here take no prefilter, so a message kept in the object would be
 * overwritten by another thread's before the caller read it.
 */
#ifndef RM_PREFILTER_ERR_H
#define RM_PREFILTER_ERR_H

#include <stdbool.h>

#define RM_PF_ERR_MAX 256

/* Thread-local message of the last failure (rm_prefilter_errmsg). */
void rm__pf_errf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
const char *rm__pf_err(void);

/* Whether the connected TCP socket 'fd' is connected to itself: its local
 * and peer addresses are equal.  On loopback, a connect to a port where
 * nothing listens can succeed that way when the kernel happens to pick that
 * very port as the local one (TCP simultaneous open); the socket then holds
 * the port the restarting Redis needs and echoes our commands back. */
bool rm__pf_self_connected(int fd);

#endif /* RM_PREFILTER_ERR_H */
