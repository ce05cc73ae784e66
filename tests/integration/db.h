/*
 * db.h - the store as the integration fixtures look into it: one
 * PostgreSQL connection (g_pg, opened by the fixture) and queries whose
 * failure fails the test (cmocka).
 */
#ifndef DB_H
#define DB_H

#include <stdbool.h>
#include <stddef.h>

#include <libpq-fe.h>

extern PGconn *g_pg;

/* First column of the first row as a number; -1 when there is no row or it
 * is NULL.  Up to two text parameters (NULL: fewer). */
long db_long(const char *sql, const char *p1, const char *p2);
/* First column of the first row as text into 'out' ("" if none). */
void db_text(const char *sql, const char *p1, char *out, size_t cap);
/* A statement (or query) that must succeed. */
void db_exec(const char *sql, const char *p1, const char *p2);
/* Poll db_long until it equals 'want' (every 10 ms, up to 'timeout_ms'). */
bool db_wait_long(const char *sql, const char *p1, const char *p2, long want, int timeout_ms);

#endif /* DB_H */
