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

#endif /* RM_PG_H */
