/*
 * tc_stats.c - one snapshot of a node's figures (tc_stats.h).
 */
#include "tc_stats.h"

#include "tc_lockwait.h"

void tc_stats_read(const tc_ctx_t *ctx, tc_stats_t *out) {
  out->node_id = ctx->cfg->node_id;
  out->serving = ctx->serving;
  out->stopping = ctx->stopping;
  out->counters = ctx->stats;
  tc_store_get_stats(ctx->store, &out->store);
  out->store_ready_conns = tc_store_ready_conns(ctx->store);
  if (ctx->stopping) return; /* the parts below may be released: keep their last values */
  out->has_server = ctx->server != NULL;
  if (ctx->server) tc_server_get_stats(ctx->server, &out->server);
  out->has_recovery = ctx->recovery != NULL;
  out->leader = ctx->recovery && tc_recovery_is_leader(ctx->recovery);
  if (ctx->recovery) tc_recovery_get_stats(ctx->recovery, &out->rec);
  out->has_bus = ctx->bus != NULL;
  if (ctx->bus) tc_bus_get_stats(ctx->bus, &out->bus);
  out->has_admin = ctx->admin != NULL;
  if (ctx->admin) tc_admin_get_stats(ctx->admin, &out->admin);
  out->lock_waiters = ctx->lockwait ? tc_lockwait_count(ctx->lockwait) : 0;
  tc_hold_get_stats(ctx->hold, &out->hold);
}
