/*
 * console_db.h - a small pool of read-only PostgreSQL connections, for the
 * console's HTTP threads and its sampler.
 *
 * NOTES
 *   Every connection is opened with default_transaction_read_only=on and
 *   a statement timeout (CONSOLE_DB_STATEMENT_MS): the console can read
 *   the store and the business databases, never change them, and a slow
 *   query cannot pile the HTTP threads up.  A caller borrows a connection
 *   for one query (console_db_json) and waits at most
 *   CONSOLE_DB_WAIT_MS for one to come free; a connection that failed is
 *   dropped and opened again by the next caller.  The calls block: they
 *   run on libmicrohttpd's and the sampler's threads, never on an event
 *   loop.
 */
#ifndef CONSOLE_DB_H
#define CONSOLE_DB_H

#include <stddef.h>

#define CONSOLE_DB_STATEMENT_MS 3000
#define CONSOLE_DB_WAIT_MS 2000
#define CONSOLE_DB_CONNECT_S 3
#define CONSOLE_DB_MAX_PARAMS 16

typedef struct console_db console_db_t;

/* A pool of at most 'size' connections to 'conninfo' (a URL or key=value
 * string), named 'what' in messages ("tc store").  NULL: out of memory. */
console_db_t *console_db_new(const char *what, const char *conninfo, int size);
void console_db_free(console_db_t *db);

/*
 * Run 'sql' with 'nparams' (at most CONSOLE_DB_MAX_PARAMS) parameters, all
 * of type text (NULL = SQL NULL; the SQL casts them).  The query
 * returns one row and one column, a json or text value: that value, a
 * malloc'd string the caller frees, into '*out'.  Returns 0, or -1 with
 * what failed in 'err' (no connection, the query failed, no row).
 */
int console_db_value(console_db_t *db, const char *sql, int nparams, const char *const *params, char **out, char *err,
                     size_t errlen);

#endif /* CONSOLE_DB_H */
