/*
 * rm_prefilter_pg.h - the PostgreSQL glue of the prefilter's PostgreSQL
 * side (rm_prefilter_pg.c), which the fallback's local mode and
 * compensation job use too: statements on a caller's connection with the
 * failure in the thread's message (rm_prefilter_errmsg, rm_local_errmsg).
 * Not installed.
 */
#ifndef RM_PREFILTER_PG_H
#define RM_PREFILTER_PG_H

#include <libpq-fe.h>
#include <stdbool.h>
#include <stdint.h>

/* The caller's connection must be usable: 0, or RM_E_INVALID when it is
 * closed, RM_E_STATE in a failed (or busy) transaction, or with
 * 'need_idle', inside a transaction block; the thread's message set. */
int rm__pf_pg_usable(PGconn *pg, bool need_idle);
/* The start of a statement about one order: the connection usable (as
 * rm__pf_pg_usable, not need_idle) and 'order_id' an id, written into
 * 'text' in decimal.  0, or the error: 'invalid_rc' for a bad id, with
 * the thread's message set. */
int rm__pf_pg_order_arg(PGconn *pg, int64_t order_id, int invalid_rc, char text[24]);
/* Run 'sql' with text parameters: its result when it returned rows or
 * completed, else NULL with the thread's message "could not WHAT: ...". */
PGresult *rm__pf_pg_exec(PGconn *pg, const char *what, const char *sql, int n, const char *const *vals);

#endif /* RM_PREFILTER_PG_H */
