/*
 * itest_pg.h - the PostgreSQL side of a librmclient test case (cmocka):
 * connections the case opens and its teardown closes, however the case
 * ended, so that no test repeats open-check-close; and a fresh, empty
 * database for the cases that need one without the RM schema.
 */
#ifndef ITEST_PG_H
#define ITEST_PG_H

#include <stddef.h>

#include <libpq-fe.h>

/* A connection to 'url' for the running case, which fails if it does not
 * open.  itest_pg_close_all closes it after the case. */
PGconn *itest_pg(const char *url);
/* The teardown of a case that opened connections with itest_pg. */
int itest_pg_close_all(void **state);
/* A case of such a group: cmocka_unit_test with that teardown. */
#define ITEST_CASE(f) cmocka_unit_test_teardown(f, itest_pg_close_all)

/* Database 'name' made anew (dropped first) through 'admin_url', and in
 * 'url' the address of it: 'like_url' with its database name replaced
 * (its options kept). */
void itest_fresh_database(const char *admin_url, const char *like_url, const char *name, char *url, size_t cap);

#endif
