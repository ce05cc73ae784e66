/*
 * rm_prefilter_int.h - what rm_prefilter.c (Redis calls) and
 * rm_prefilter_pg.c (PostgreSQL side, reconcile, expiry) share: the
 * prefilter object and its counters.  Not installed.
 */
#ifndef RM_PREFILTER_INT_H
#define RM_PREFILTER_INT_H

#include <stdatomic.h>
#include <stdint.h>

#include "rm_client.h"
#include "rm_prefilter_conn.h"
#include "rm_prefilter_keys.h"

/* Operations counted separately (rm_pf_stats_t). */
typedef enum {
  RM_PF_OP_FREEZE = 0,
  RM_PF_OP_CONFIRM,
  RM_PF_OP_RELEASE,
  RM_PF_OP_JOIN,
  RM_PF_OP_FILL,
  RM_PF_OP_EXPIRE,
  RM_PF_OP_ADD,
  RM_PF_OP__COUNT
} rm_pf_op_t;

/* Results counted (the fields of rm_pf_counts_t, in order). */
typedef enum {
  RM_PF_C_OK = 0,
  RM_PF_C_NOT_ON_SALE,
  RM_PF_C_OVER_LIMIT,
  RM_PF_C_SOLD_OUT,
  RM_PF_C_BAD_ARGS,
  RM_PF_C_NOT_LOADED,
  RM_PF_C_ALREADY_CONFIRMED,
  RM_PF_C_ALREADY_RELEASED,
  RM_PF_C_UNKNOWN_ORDER,
  RM_PF_C_ALREADY_WAITING,
  RM_PF_C_UNKNOWN_OUTCOME,
  RM_PF_C_NOT_SENT,
  RM_PF_C_ERROR,
  RM_PF_C__COUNT
} rm_pf_count_t;

struct rm_prefilter {
  rm_pf_options_t opts; /* defaults applied */
  rm_logger_t log;
  rm_pf_pool_t pool;
  atomic_uint_fast64_t counts[RM_PF_OP__COUNT][RM_PF_C__COUNT];
};

/* Count result 'rc' of operation 'op'; returns 'rc'. */
int rm__pf_count(rm_prefilter_t *pf, rm_pf_op_t op, int rc);
/* Which counter a code falls in. */
rm_pf_count_t rm__pf_count_index(int rc);
/* Unix time in milliseconds. */
int64_t rm__pf_unix_ms(void);
/* Run a script whose reply is one integer and map it (rm__pf_code_from_lua);
 * Redis error replies become RM_PF_E_REDIS with rm_prefilter_errmsg set. */
int rm__pf_eval_code(rm_prefilter_t *pf, int script, int nkeys, const char *const *keys, int nargs,
                     const char *const *args);

#endif /* RM_PREFILTER_INT_H */
