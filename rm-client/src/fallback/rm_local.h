/*
 * rm_local.h - what the compensation job (rm_compensate.c) shares with the
 * local-mode order helpers (rm_local.c).  Not installed.
 */
#ifndef RM_LOCAL_H
#define RM_LOCAL_H

#include <libpq-fe.h>

#include "rm_client.h"

/* Who decides the stock side of a local-mode order (stock_compensation.source). */
#define RM_LOCAL_SOURCE_SERVICE "service"
#define RM_LOCAL_SOURCE_JOB "compensation"

/* rm_local_stock_freeze with the decider named: 'source' is one of the
 * RM_LOCAL_SOURCE_* strings.  'c' as there (the job passes NULL). */
int rm__local_stock_freeze(rm_client_t *c, PGconn *pg, const rm_local_order_t *o, const char *source);

/* Whether 'rc' (of rm_local_stock_freeze) is a recorded refusal. */
bool rm__local_is_refusal(int rc);

#endif /* RM_LOCAL_H */
