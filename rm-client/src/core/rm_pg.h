/*
 * rm_pg.h - libpq helpers every part of librmclient uses (rm_pg.c).  Not
 * installed.
 */
#ifndef RM_PG_H
#define RM_PG_H

#include <libpq-fe.h>
#include <stdbool.h>
#include <stddef.h>

#include "rm_client.h"

/* Format a libpq failure of 'res' (or of 'pg' when res is NULL) into
 * 'err' as "what: primary message (detail)", without libpq's trailing
 * newline. */
void rm__pg_error(char *err, size_t errlen, const char *what, PGconn *pg, const PGresult *res);
/* SQLSTATE of 'res' ("" if none). */
const char *rm__sqlstate(const PGresult *res);
/* Why a caller's connection cannot take a statement now (NULL: it can),
 * with the code in *code: RM_E_INVALID when it is closed, RM_E_STATE in a
 * failed or busy transaction, or with 'need_idle', inside a transaction
 * block. */
const char *rm__pg_unusable(PGconn *pg, bool need_idle, int *code);
/* Whether an idle pooled connection can be lent again: open, and not
 * closed by its server meanwhile (whatever the server sent is read without
 * blocking, so a server that died or was stopped by a failover is seen
 * now, not by the next statement), and not on a read-only server (a hot
 * standby, or a session made read-only: every write would fail there with
 * SQLSTATE 25006; PostgreSQL 14 and later report both settings to the
 * client).  A connection that is not usable should be closed. */
bool rm__pg_idle_usable(PGconn *pg);
/* Whether 'res' failed because the server is read-only (SQLSTATE 25006:
 * a standby): the connection should be closed rather than reused. */
bool rm__pg_read_only_error(const PGresult *res);

/* A connection of a statement sequence and where its failures go: every
 * rm__pg_io_exec that fails formats its message into 'err' (cap
 * 'errlen'), its SQLSTATE into 'sqlstate' (6 bytes; "" if none), and sets
 * 'bad' when the connection must not be reused (lost, or on a read-only
 * server).  The fence's statements and the AT layer's phase two run
 * through it. */
typedef struct rm_pg_io {
  PGconn *pg;
  char *err;
  size_t errlen;
  bool bad;
  char sqlstate[6];
} rm_pg_io_t;

/* Run 'sql' with 'n' text 'params' (their 'types' may be NULL) on io->pg:
 * the result, or NULL unless it gave 'want' (the failure in 'io', its
 * message "what: ..."). */
PGresult *rm__pg_io_exec(rm_pg_io_t *io, const char *what, const char *sql, int n, const char *const *params,
                         const Oid *types, ExecStatusType want);

#endif /* RM_PG_H */
