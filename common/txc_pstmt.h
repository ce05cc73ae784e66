/*
 * txc_pstmt.h - named prepared statements, kept per database connection:
 * the AT layer's queries (librmclient) and the demo services' own
 * (svc_pg_exec) use one cache each.
 *
 * NOTES
 *   A statement's SQL (an AT branch's INSERT ... RETURNING, the locking
 *   SELECT of a before-image, the undo row; a service's payment, outbox
 *   row or consumer effect) is the same text for every call, yet sent
 *   unnamed it is parsed, analysed and planned by the server on every
 *   call: about an eighth of PostgreSQL's CPU in the flash-sale load for
 *   the AT layer's alone (bench/README.md).  The cache remembers which
 *   texts a connection has prepared, so that the next call only binds and
 *   runs.
 *
 *   A connection is known by its PGconn pointer and its backend pid: a
 *   reset or a new connection at the same address gets a new pid and
 *   starts empty.  Names are the cache's prefix and a number from one
 *   counter per cache, never reused, so a forgotten entry can never point
 *   at another text, and two caches with different prefixes can share a
 *   connection (a service's statements and its AT branches').  A
 *   statement the server reports as missing (SQLSTATE 26000: a DISCARD ALL
 *   by the application, say) makes the cache forget that connection.
 *
 *   Bounded: the cache's connections (the least recently used is
 *   forgotten; its statements stay on the server until its session ends)
 *   and TXC_PSTMT_PER_CONN statements each (then texts go unnamed).
 *
 *   Thread-safe: one mutex per cache; a connection is used by one thread
 *   at a time, as libpq requires.
 */
#ifndef TXC_PSTMT_H
#define TXC_PSTMT_H

#include <libpq-fe.h>
#include <stdbool.h>

#define TXC_PSTMT_PER_CONN 64
#define TXC_PSTMT_NAME_MAX 24
#define TXC_PSTMT_PREFIX_MAX 12 /* bytes of a name's prefix, at most */

typedef struct txc_pstmt_cache txc_pstmt_cache_t;

/* A cache for up to 'conns' connections whose statement names begin with
 * 'prefix' (1 to TXC_PSTMT_PREFIX_MAX letters, digits or '_').  NULL: out
 * of memory or a bad prefix. */
txc_pstmt_cache_t *txc_pstmt_new(const char *prefix, int conns);
void txc_pstmt_free(txc_pstmt_cache_t *c);

/*
 * How to send 'sql' (with 'n' parameters of 'types', which may be NULL) on
 * 'pg'.  Returns true with 'name' filled when it is prepared there
 * ('*fresh' false), or when it should be prepared now under that name
 * ('*fresh' true: send PQsendPrepare first, then call txc_pstmt_prepared
 * with the outcome).  Returns false when it goes unnamed (no cache, no room).
 */
bool txc_pstmt_lookup(txc_pstmt_cache_t *c, PGconn *pg, const char *sql, int n, const Oid *types,
                      char name[TXC_PSTMT_NAME_MAX], bool *fresh);

/* The server's answer to the Prepare of a fresh 'name': remembered when ok. */
void txc_pstmt_prepared(txc_pstmt_cache_t *c, PGconn *pg, const char *sql, int n, const Oid *types,
                        const char *name, bool ok);

/* Forget everything prepared on 'pg' (after SQLSTATE 26000). */
void txc_pstmt_forget(txc_pstmt_cache_t *c, PGconn *pg);

/* Whether 'r' says the server can no longer run a named statement: gone
 * (26000: a DISCARD ALL, say) or "cached plan must not change result
 * type" (0A000: a table changed under it; the message is localised, the
 * code is not). */
bool txc_pstmt_stale(const PGresult *r);

/*
 * 'sql' with its 'n' text parameters on 'pg', as PQexecParams runs it
 * (types from the text, text results), but under a name prepared there
 * once when 'c' has room: the first call on a connection prepares (one
 * round trip more), the next only bind and run.  A statement without
 * parameters goes as it is.  A named statement the server can no longer
 * run (26000 gone, 0A000 a table changed under it) is forgotten on 'pg';
 * outside a transaction the call is then run once more unnamed, inside
 * one its error is the answer (the transaction is aborted anyway).  The
 * result as libpq gives it (NULL: out of memory).
 */
PGresult *txc_pstmt_exec(txc_pstmt_cache_t *c, PGconn *pg, const char *sql, int n, const char *const *params);

#endif
