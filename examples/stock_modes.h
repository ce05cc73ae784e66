/*
 * stock_modes.h - stock-service's freeze as a TCC or an XA branch
 * (STOCK_FREEZE_MODE=tcc|xa) instead of an AT one: the freeze's statements
 * are the same plain SQL as the local path; what changes is how the
 * branch begins, ends and is undone.
 *
 *   tcc  try = rm_tcc_try, then the freeze (stock_freeze row FROZEN,
 *        stock_log row, frozen_count + qty under its guard) and COMMIT, in
 *        one local transaction; confirm = keep (nothing to change: payment
 *        later confirms the freeze through its order event); cancel = undo
 *        the freeze exactly (delete the FROZEN row and its log row,
 *        frozen_count - qty), in the fence's local transaction.  The Redis
 *        side stays order-service's, as in every mode.
 *   xa   rm_xa_start, the same statements, rm_xa_prepare instead of
 *        COMMIT; the coordinator's COMMIT PREPARED / ROLLBACK PREPARED.  The
 *        bucket row stays locked by PostgreSQL until phase two: one bucket
 *        serialises the whole sale (the benchmark shows the price).
 */
#ifndef STOCK_MODES_H
#define STOCK_MODES_H

#include <libpq-fe.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rm_client.h"

typedef enum { STOCK_BRANCH_TCC = 1, STOCK_BRANCH_XA = 2 } stock_branch_kind_t;

/* Serve 'resource' (the stock database at 'pg_url') as the mode's
 * resource: TCC handlers or XA.  0 or an rm_* code (rm_errmsg says why). */
int stock_modes_serve(rm_client_t *rm, stock_branch_kind_t kind, const char *resource, const char *pg_url);

/* Begin the branch of 'xid' in the transaction open on 'pg' (after BEGIN):
 * the try's registration and fence row ('order_id' recorded for the
 * cancel), or the XA start.  0 or an rm_* code, with 'err' set. */
int stock_modes_begin(rm_client_t *rm, stock_branch_kind_t kind, const char *xid, const char *resource, PGconn *pg,
                      long long order_id, int64_t *bid, char *err, size_t errlen);

/* End it after the statements: COMMIT (TCC) or PREPARE TRANSACTION (XA).
 * True when the branch is durable (committed, or prepared). */
bool stock_modes_end(rm_client_t *rm, stock_branch_kind_t kind, const char *xid, PGconn *pg, int64_t bid, char *err,
                     size_t errlen);

#endif
