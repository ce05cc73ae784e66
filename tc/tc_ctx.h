/*
 * tc_ctx.h - what the modules of one coordinator node share: the loop, the
 * configuration, the store, the server, the lock waiters, the counters,
 * and a small table of what only the node can do (wake waiters on the
 * other nodes, relay a call through a peer, say whether this node may
 * lead).  tc_node.c owns and fills it; coord, phase2, recovery, admin,
 * admin_exec, metrics and peer take a tc_ctx_t * and never the node, so
 * the arrows run one way: node -> modules -> ctx.
 */
#ifndef TC_CTX_H
#define TC_CTX_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "tc_config.h"
#include "tc_store.h"
#include "txp_msg.h"

typedef struct tc_ctx tc_ctx_t;
typedef struct tc_server tc_server_t;
typedef struct tc_lockwait tc_lockwait_t;
typedef struct tc_hold tc_hold_t;
typedef struct tc_recovery tc_recovery_t;
typedef struct tc_admin tc_admin_t;

/* Upper bounds of the phase-two latency buckets: tc_phase2.c. */
#define TC_PHASE2_BUCKETS 14
extern const double tc_phase2_bounds[TC_PHASE2_BUCKETS];

/* Counters; monotonic unless noted. */
typedef struct tc_node_stats {
  uint64_t begun, committed, rolled_back, timed_out, commit_failed, rollback_failed;
  uint64_t registered, register_conflicts, lock_waits, lock_wait_timeouts, lock_wait_ms_total;
  uint64_t phase2_calls, phase2_retryable, phase2_unretryable, phase2_no_rm;
  uint64_t requests, bad_requests;
  uint64_t not_owner; /* requests refused: another application's xid or branch */
  uint64_t phase2_forwarded; /* branch calls relayed through a peer (cluster bus) */
  int phase2_active; /* gauge */
  int phase2_notices_active; /* gauge: relayed commit notices awaiting their answer */
  /* Phase-two drives, [0] commit / [1] rollback: a duration histogram
   * (bucket i counts drives <= tc_phase2_bounds[i], not cumulative). */
  uint64_t phase2_bucket[2][TC_PHASE2_BUCKETS];
  uint64_t phase2_count[2];
  double phase2_seconds[2];
  /* Global lock waits (registrations and locking reads), [0] granted /
   * [1] refused (timed out, or the request failed): the same buckets. */
  uint64_t lock_wait_bucket[2][TC_PHASE2_BUCKETS];
  uint64_t lock_wait_count[2];
  double lock_wait_seconds[2];
} tc_node_stats_t;

/* Count 'sec' in a histogram of those buckets (bucket i: <= bound i, not
 * cumulative; above the last: only in the count and sum). */
static inline void tc_hist_observe(uint64_t bucket[TC_PHASE2_BUCKETS], uint64_t *count, double *sum, double sec) {
  for (int i = 0; i < TC_PHASE2_BUCKETS; i++)
    if (sec <= tc_phase2_bounds[i]) {
      bucket[i]++;
      break;
    }
  (*count)++;
  *sum += sec;
}

/* What only the node can do, for its modules (tc_node.c and tc_peer.c
 * implement it). */
typedef struct tc_ctx_ops {
  /* Locks of 'xid' were released or began rolling back: wake its waiters,
   * here and (through the peer bus) on the other nodes. */
  void (*release_locks)(tc_ctx_t *ctx, const char *xid);
  /* Phase two found no local RM for 'req' (BranchCommit/Rollback): relay
   * it through a peer that has one.  Returns 0 (cb runs once, later, as
   * tc_conn_call's would) or < 0 when no peer can be asked (no bus, no peer
   * up; cb never runs). */
  int (*forward)(tc_ctx_t *ctx, const txp_msg_t *req, const char *client_id, unsigned timeout_ms,
                 void (*cb)(int status, const txp_msg_t *res, void *arg), void *arg);
  /* Whether this node may take the recovery leadership: its membership is
   * claimed and its heartbeats are being written. */
  bool (*may_lead)(const tc_ctx_t *ctx);
} tc_ctx_ops_t;

struct tc_ctx {
  uv_loop_t *loop;
  const tc_config_t *cfg;
  const char *advertise; /* host:port that goes into every xid */
  tc_store_t *store;
  tc_server_t *server;
  tc_lockwait_t *lockwait;
  tc_hold_t *hold;         /* begins answered, not stored yet (tc_hold.h) */
  tc_recovery_t *recovery; /* read by admin and metrics (leader, stats) */
  tc_admin_t *admin;       /* NULL without admin.socket; read by metrics */
  bool peers;              /* a peer bus runs: lock releases may come from other nodes */
  struct tc_bus *bus;      /* that bus (NULL without); read by stats */
  bool serving;
  bool stopping;
  tc_node_stats_t stats;
  const tc_ctx_ops_t *ops;
};

static inline void tc_ctx_release_locks(tc_ctx_t *ctx, const char *xid) { ctx->ops->release_locks(ctx, xid); }

#endif /* TC_CTX_H */
