/*
 * tc_recovery.h - leader election (PostgreSQL advisory lock) and the
 * leader's jobs: timeouts, phase-two retries, history pruning.  See the
 * NOTES in tc_recovery.c.
 */
#ifndef TC_RECOVERY_H
#define TC_RECOVERY_H

#include <stdbool.h>
#include <stdint.h>

#include "tc_ctx.h"

typedef struct tc_recovery_stats {
  uint64_t leader_terms, timed_out, retried, history_pruned;
} tc_recovery_stats_t;

/* Start asking for leadership every recovery.interval_ms. */
tc_recovery_t *tc_recovery_new(tc_ctx_t *ctx);
void tc_recovery_close(tc_recovery_t *rec, void (*done)(void *arg), void *arg);
bool tc_recovery_is_leader(const tc_recovery_t *rec);
void tc_recovery_get_stats(const tc_recovery_t *rec, tc_recovery_stats_t *out);

#endif /* TC_RECOVERY_H */
