/*
 * txc_httpguard.h - a total deadline for receiving an HTTP request, for
 * libmicrohttpd daemons (tcd's /metrics, the demo services).
 *
 * NOTES
 *   libmicrohttpd's MHD_OPTION_CONNECTION_TIMEOUT is an idle timeout: a
 *   stranger that sends one header byte every few seconds holds its
 *   connection for ever (security review, finding 5; issue 20).  The guard
 *   counts from the moment a connection opens, or its last request was
 *   answered (keep-alive), until the request has fully arrived; past
 *   'deadline_ms' it shuts the socket down, and libmicrohttpd closes the
 *   connection as one the peer closed.  The time a request spends in its
 *   handler does not count: a slow answer is the server's business.
 *
 *   Wiring, all four needed:
 *     MHD_OPTION_NOTIFY_CONNECTION, txc_httpguard_notify, guard
 *     txc_httpguard_received(guard, conn) in the access handler once the
 *       request (headers and body) is complete
 *     txc_httpguard_completed(guard, conn) in MHD_OPTION_NOTIFY_COMPLETED
 *     txc_httpguard_free after MHD_stop_daemon
 *   The daemon's MHD_OPTION_CONNECTION_LIMIT must not exceed 'capacity'
 *   (a connection beyond it is not guarded, and is counted).
 *
 *   Thread: every call may come from any of libmicrohttpd's threads; the
 *   guard's own thread wakes every 250 ms.  The socket is shut down under
 *   the guard's lock, and libmicrohttpd announces a close (which removes
 *   the connection here under the same lock) before it closes the
 *   descriptor, so a reused descriptor is never touched.
 */
#ifndef TXC_HTTPGUARD_H
#define TXC_HTTPGUARD_H

#include <stdint.h>

#include <microhttpd.h>

typedef struct txc_httpguard txc_httpguard_t;

/* A guard for up to 'capacity' connections at once, or NULL (out of
 * memory, or its thread could not start). */
txc_httpguard_t *txc_httpguard_new(unsigned capacity, unsigned deadline_ms);
void txc_httpguard_free(txc_httpguard_t *g);

/* MHD_NotifyConnectionCallback; 'cls' is the guard. */
void txc_httpguard_notify(void *cls, struct MHD_Connection *conn, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe);
void txc_httpguard_received(txc_httpguard_t *g, struct MHD_Connection *conn);
void txc_httpguard_completed(txc_httpguard_t *g, struct MHD_Connection *conn);

/* Requests cut at the deadline, and connections beyond 'capacity'. */
uint64_t txc_httpguard_cut(const txc_httpguard_t *g);
uint64_t txc_httpguard_unguarded(const txc_httpguard_t *g);

#endif /* TXC_HTTPGUARD_H */
