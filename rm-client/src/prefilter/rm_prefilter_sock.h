/*
 * rm_prefilter_sock.h - the prefilter's leaf: the self-connected socket
 * check, which both the connection pool (rm_prefilter_conn.c) and the
 * Sentinel resolver (rm_redis_sentinel.c) make; it includes nothing of
 * either.
 */
#ifndef RM_PREFILTER_SOCK_H
#define RM_PREFILTER_SOCK_H

#include <stdbool.h>

/* Whether the connected TCP socket 'fd' is connected to itself: its local
 * and peer addresses are equal.  On loopback, a connect to a port where
 * nothing listens can succeed that way when the kernel happens to pick that
 * very port as the local one (TCP simultaneous open); the socket then holds
 * the port the restarting Redis needs and echoes our commands back. */
bool rm__pf_self_connected(int fd);

#endif /* RM_PREFILTER_SOCK_H */
