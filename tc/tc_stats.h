/*
 * tc_stats.h - one snapshot of a node's figures (tc_stats.c), read by both
 * /metrics (tc_metrics.c) and the admin "stats" command (tc_admin_exec.c),
 * so the two cannot disagree about what a figure is.  The store's figures
 * (sessions by status) are reads of their own: tc_read_sessions and
 * tc_read_probe (tc_store_read.h).  Loop thread only.
 */
#ifndef TC_STATS_H
#define TC_STATS_H

#include <stdbool.h>
#include <stdint.h>

#include "tc_admin.h"
#include "tc_bus.h"
#include "tc_ctx.h"
#include "tc_hold.h"
#include "tc_recovery.h"
#include "tc_server.h"
#include "tc_store.h"

typedef struct tc_stats {
  int node_id;
  bool serving, stopping, leader;
  bool has_server, has_recovery, has_admin, has_bus; /* which parts below were read */
  tc_node_stats_t counters;
  tc_store_stats_t store;
  int store_ready_conns;
  tc_server_stats_t server;
  tc_recovery_stats_t rec;
  tc_admin_stats_t admin;
  tc_bus_stats_t bus;
  uint64_t lock_waiters;
  tc_hold_stats_t hold;
} tc_stats_t;

/* Fill 'out' from the node's modules.  While the node stops, the server,
 * recovery, lock waits and admin may be gone: their parts keep what 'out'
 * held (pass the previous snapshot to keep the last values). */
void tc_stats_read(const tc_ctx_t *ctx, tc_stats_t *out);

#endif /* TC_STATS_H */
