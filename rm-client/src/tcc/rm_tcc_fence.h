/*
 * rm_tcc_fence.h - the TCC fence's rules (pure: no I/O), as the rows of
 * sql/rm/002_tcc_fence.sql hold them.  rm_tcc.c runs the SQL around them;
 * tests/unit/test_tcc_fence.c checks every case.
 *
 * NOTES
 *   The fence row of a branch (xid, branch_id) is written in the local
 *   transaction of the business change it guards, so what the row says
 *   happened did happen:
 *     try      no row -> insert TRIED; a row (a cancel came first) -> refuse
 *     confirm  TRIED -> run the handler, CONFIRMED; CONFIRMED -> done (a
 *              duplicate); no row -> retry (the try has not committed:
 *              it may be in flight); CANCELLED or CANCELLED_EMPTY -> refuse
 *     cancel   TRIED -> run the handler, CANCELLED; CANCELLED or
 *              CANCELLED_EMPTY -> done; no row -> record CANCELLED_EMPTY
 *              (the empty rollback; a late try now fails on the key);
 *              CONFIRMED -> refuse
 *   "Refuse" is a contradiction that no retry can mend (the branch was
 *   both confirmed and cancelled, as far as the coordinator asks): the
 *   branch fails for good and an operator looks (tcctl show XID).
 */
#ifndef RM_TCC_FENCE_H
#define RM_TCC_FENCE_H

#include <stdbool.h>

/* tcc_fence.status; NONE: no row. */
typedef enum rm_fence_status {
  RM_FENCE_NONE = 0,
  RM_FENCE_TRIED = 1,
  RM_FENCE_CONFIRMED = 2,
  RM_FENCE_CANCELLED = 3,
  RM_FENCE_CANCELLED_EMPTY = 4,
} rm_fence_status_t;

typedef enum rm_fence_action {
  RM_FENCE_RUN,    /* run the handler, then set the row to 'to', in one local transaction */
  RM_FENCE_DONE,   /* already done: answer success, change nothing, run nothing */
  RM_FENCE_RECORD, /* insert the row as 'to' (the empty rollback), run nothing */
  RM_FENCE_RETRY,  /* not now: answer a retryable failure */
  RM_FENCE_REFUSE, /* a contradiction: answer an unretryable failure */
} rm_fence_action_t;

/* Phase two (commit: a confirm, else a cancel) of a branch whose row is
 * 'found' (a status, or NONE).  '*to': the status to write for RUN and
 * RECORD; '*why': for RETRY and REFUSE, a sentence for the operator. */
rm_fence_action_t rm_tcc_fence_phase2(bool commit, int found, int *to, const char **why);

/* A try that found the row 'found' when inserting its own (NONE: the
 * insert went in): true to go on, false (with '*why') to refuse. */
bool rm_tcc_fence_try_ok(int found, const char **why);

/* "tried", "confirmed", ... ("none" for NONE, "unknown" otherwise). */
const char *rm_tcc_fence_status_name(int status);

#endif /* RM_TCC_FENCE_H */
