/*
 * rm_pstmt.h - named prepared statements for the AT layer's queries, kept
 * per database connection.
 *
 * NOTES
 *   An AT statement's SQL (its INSERT ... RETURNING, the locking SELECT of
 *   a before-image, the undo row) is the same text for every call on a
 *   table, yet sent unnamed it is parsed, analysed and planned by the
 *   server on every call: about an eighth of PostgreSQL's CPU in the
 *   flash-sale load (bench/README.md).  The cache remembers which texts a
 *   connection has prepared, so that the next call only binds and runs.
 *
 *   A connection is known by its PGconn pointer and its backend pid: a
 *   reset or a new connection at the same address gets a new pid and
 *   starts empty.  Names come from one counter per cache and are never
 *   reused, so a forgotten entry can never point at another text.  A
 *   statement the server reports as missing (SQLSTATE 26000: a DISCARD ALL
 *   by the application, say) makes the cache forget that connection.
 *
 *   Bounded: RM_PSTMT_CONNS connections (the least recently used is
 *   forgotten; its statements stay on the server until its session ends)
 *   and RM_PSTMT_PER_CONN statements each (then texts go unnamed).
 *
 *   Thread-safe: one mutex per cache; a connection is used by one thread
 *   at a time, as libpq requires.
 */
#ifndef RM_PSTMT_H
#define RM_PSTMT_H

#include <libpq-fe.h>
#include <stdbool.h>

#define RM_PSTMT_CONNS 64
#define RM_PSTMT_PER_CONN 64
#define RM_PSTMT_NAME_MAX 24

typedef struct rm_pstmt_cache rm_pstmt_cache_t;

rm_pstmt_cache_t *rm__pstmt_new(void);
void rm__pstmt_free(rm_pstmt_cache_t *c);

/*
 * How to send 'sql' (with 'n' parameters of 'types', which may be NULL) on
 * 'pg'.  Returns true with 'name' filled when it is prepared there
 * ('*fresh' false), or when it should be prepared now under that name
 * ('*fresh' true: send PQsendPrepare first, then call rm__pstmt_prepared
 * with the outcome).  Returns false when it goes unnamed (no cache, no room).
 */
bool rm__pstmt_lookup(rm_pstmt_cache_t *c, PGconn *pg, const char *sql, int n, const Oid *types,
                      char name[RM_PSTMT_NAME_MAX], bool *fresh);

/* The server's answer to the Prepare of a fresh 'name': remembered when ok. */
void rm__pstmt_prepared(rm_pstmt_cache_t *c, PGconn *pg, const char *sql, int n, const Oid *types,
                        const char *name, bool ok);

/* Forget everything prepared on 'pg' (after SQLSTATE 26000). */
void rm__pstmt_forget(rm_pstmt_cache_t *c, PGconn *pg);

#endif
