/*
 * console_http.h - the console's pages and their JSON (libmicrohttpd).
 *
 * NOTES
 *   Routes (GET unless said; every one but /healthz and /login needs the
 *   console's credential):
 *     /  /globals  /locks  /history  /sale   the pages (one shell,
 *                    www/index.html; www/console.js draws each)
 *     /console.js /console.css               their script and style
 *     /login         GET ?token=T[&next=/page] or POST token=T: the
 *                    credential checked, a session cookie set (12 h,
 *                    HttpOnly, SameSite=Strict), 303 to 'next' if it is
 *                    one of the pages above, else to /; without a
 *                    token, the login form
 *     /logout        the cookie cleared, 303 to /login
 *     /healthz       200 "ok" (no credential: a probe)
 *     /api/overview  nodes and the leader, globals by status, branches,
 *                    locks, globals finished in the last minute
 *     /api/globals   the live globals (oldest first, ?limit=, at most
 *                    500) with their branches and lock counts
 *     /api/global    ?xid=X: one global, live or from the history
 *     /api/locks     the lock table (?limit=) and, from each live node's
 *                    admin socket, the registrations waiting for them
 *     /api/history   ?xid=prefix&status=Name|n&app=&name=&minutes=&limit=
 *     /api/activities, /api/sale?activity=N (its buckets, its orders by
 *                    status), /api/series?activity=N&seconds=S (the
 *                    sampler, console_sampler.h)
 *   The credential: 'Authorization: Bearer <token>', or the session
 *   cookie, a keyed hash of the token (the token itself never sits in a
 *   browser).  Compared in constant time.  A page asked for without it
 *   is sent to /login (303); an API call gets 401.
 *   Errors are application/problem+json (RFC 9457) {type, title, status,
 *   detail}; a 405 says Allow; a 503 (a database down) says Retry-After.
 *   Every answer: Cache-Control no-store, a Content-Security-Policy that
 *   allows this origin's script and style only, nosniff, no referrer,
 *   no framing.  Read-only: the databases are read in read-only
 *   transactions (console_db.h); repairs stay with tcctl.
 *   Thread: libmicrohttpd's pool (CONSOLE_HTTP_THREADS).
 */
#ifndef CONSOLE_HTTP_H
#define CONSOLE_HTTP_H

#include <stdbool.h>
#include <stddef.h>

#include "console_db.h"
#include "console_sampler.h"

#define CONSOLE_HTTP_THREADS 4
#define CONSOLE_HTTP_CONNECTIONS 64
#define CONSOLE_HTTP_REQUEST_MS 10000 /* a request must have arrived by then */
#define CONSOLE_TOKEN_MAX 256

typedef struct {
  const char *listen;                  /* "host:port"; port 0 picks one */
  const char *token;                   /* the credential, CONSOLE_TOKEN_MAX - 1 bytes at most */
  console_db_t *tc, *stock, *orders;   /* stock and orders may be NULL (no sale pages) */
  console_sampler_t *sampler;
} console_http_cfg_t;

typedef struct console_http console_http_t;

console_http_t *console_http_start(const console_http_cfg_t *cfg, char *err, size_t errlen);
int console_http_port(const console_http_t *h);
void console_http_stop(console_http_t *h);

#endif /* CONSOLE_HTTP_H */
