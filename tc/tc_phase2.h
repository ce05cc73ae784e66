/*
 * tc_phase2.h - phase two of decided global transactions (tc_phase2.c):
 * tell each branch to commit or roll back, and record each outcome.  Loop
 * thread only.
 */
#ifndef TC_PHASE2_H
#define TC_PHASE2_H

#include "tc_ctx.h"

/* The upper bounds (seconds) of the phase-two duration histogram
 * (tc_node_stats_t.phase2_bucket), for /metrics. */
extern const double tc_phase2_bounds[TC_PHASE2_BUCKETS];

/* Drive 'branches' (copied) of 'xid' to the decision implied by
 * 'global_status'.  'done' (may be NULL) runs once with the global status
 * reached (final, or a *Retrying/Failed status). */
void tc__phase2_drive(tc_ctx_t *ctx, const char *xid, int global_status, const tc_branch_row_t *branches,
                      int nbranches, void (*done)(int global_status, void *arg), void *arg);

#endif /* TC_PHASE2_H */
