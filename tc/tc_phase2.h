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

/* Tell 'branches' of 'xid', an AT commit the store finished at its
 * decision (sql/tc/010_commit_at_decision.sql), to delete their undo rows.
 * Nothing waits for the answers and nothing records them: an RM that
 * misses the call deletes the row in its resolve pass, from the history's
 * Committed (rm-client/src/at/rm_undo.c NOTES). */
void tc__phase2_notify(tc_ctx_t *ctx, const char *xid, const tc_branch_row_t *branches, int nbranches);

#endif /* TC_PHASE2_H */
