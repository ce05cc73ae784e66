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

/* Results counted: X(NAME, field) for counter RM_PF_C_NAME and its field
 * of rm_pf_counts_t, in the struct's order.  One list, so that the enum
 * and the copy into rm_pf_counts_t (rm_prefilter_stats) cannot drift. */
#define RM_PF_COUNTERS(X)                                                                                       \
  X(OK, ok) X(NOT_ON_SALE, not_on_sale) X(OVER_LIMIT, over_limit) X(SOLD_OUT, sold_out)                         \
  X(BAD_ARGS, bad_args) X(NOT_LOADED, not_loaded) X(ALREADY_CONFIRMED, already_confirmed)                       \
  X(ALREADY_RELEASED, already_released) X(UNKNOWN_ORDER, unknown_order)                                         \
  X(ALREADY_WAITING, already_waiting) X(UNKNOWN_OUTCOME, unknown_outcome) X(NOT_SENT, not_sent)                 \
  X(ERROR, error)

typedef enum {
#define RM_PF_COUNTER_ENUM(name, field) RM_PF_C_##name,
  RM_PF_COUNTERS(RM_PF_COUNTER_ENUM)
#undef RM_PF_COUNTER_ENUM
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
