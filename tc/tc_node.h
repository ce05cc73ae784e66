/*
 * tc_node.h - one coordinator node: the object that wires the store, the
 * server, lock waits, phase two and recovery together.  tcd's main creates
 * one; tests may create several in one process.
 *
 * NOTES
 *   Start-up order: store (pools, first id block) and, at the same time,
 *   the node id claim (cluster/tc_cluster.h: a second live process with the
 *   same id refuses to start) -> server (listen) -> peer bus and node_table
 *   registration -> recovery (leader election; it adopts every unfinished
 *   session found in the store, which is how a restarted node finishes what
 *   a killed one left).  Shutdown runs the reverse order.
 */
#ifndef TC_NODE_H
#define TC_NODE_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "tc_config.h"
#include "tc_store.h"

typedef struct tc_node tc_node_t;
typedef struct tc_server tc_server_t;
typedef struct tc_lockwait tc_lockwait_t;
typedef struct tc_recovery tc_recovery_t;
struct tc_req;

/* Upper bounds of the phase-two latency buckets: tc_metrics.c. */
#define TC_PHASE2_BUCKETS 14
extern const double tc_phase2_bounds[TC_PHASE2_BUCKETS];

/* Counters; monotonic unless noted. */
typedef struct tc_node_stats {
  uint64_t begun, committed, rolled_back, timed_out, commit_failed, rollback_failed;
  uint64_t registered, register_conflicts, lock_waits, lock_wait_timeouts, lock_wait_ms_total;
  uint64_t phase2_calls, phase2_retryable, phase2_unretryable, phase2_no_rm;
  uint64_t requests, bad_requests;
  uint64_t phase2_forwarded; /* branch calls relayed through a peer (cluster bus) */
  int phase2_active; /* gauge */
  /* Phase-two drives, [0] commit / [1] rollback: a duration histogram
   * (bucket i counts drives <= tc_phase2_bounds[i], not cumulative). */
  uint64_t phase2_bucket[2][TC_PHASE2_BUCKETS];
  uint64_t phase2_count[2];
  double phase2_seconds[2];
} tc_node_stats_t;

struct tc_node {
  uv_loop_t *loop;
  tc_config_t cfg;
  char advertise[TC_CONFIG_STR];
  tc_store_t *store;
  tc_server_t *server;
  tc_lockwait_t *lockwait;
  tc_recovery_t *recovery;
  struct tc_admin *admin;     /* NULL without admin.socket */
  struct tc_metrics *metrics; /* NULL without metrics.listen */
  /* Cluster (cluster/): the node id claim and heartbeats on a connection of
   * their own, and the peer bus (NULL without cluster.bus). */
  struct tc_cluster *cluster;
  struct tc_bus *bus;
  tc_pg_pool_t *member_pool;
  bool store_ready, claimed;
  tc_node_stats_t stats;
  bool serving;
  bool stopping;
  uv_timer_t stats_timer; /* debug-level store statistics */
  bool stats_timer_on;

  void (*on_ready)(tc_node_t *node, int status, const char *err, void *arg);
  void *ready_arg;
  void (*stop_done)(void *arg);
  void *stop_arg;
  int stop_parts;
};

/* Start a node on 'loop' with 'cfg' (copied).  'on_ready' runs once: status
 * 0 when the node serves, or an error (store unreachable, listen failed).
 * Returns NULL only on allocation failure. */
tc_node_t *tc_node_start(uv_loop_t *loop, const tc_config_t *cfg,
                         void (*on_ready)(tc_node_t *, int, const char *, void *), void *arg);
/* Stop serving and release everything; 'done' runs when all is closed. */
void tc_node_stop(tc_node_t *node, void (*done)(void *arg), void *arg);

/* The port actually listened on (useful with port 0). */
int tc_node_port(const tc_node_t *node);

/* ---- used between the node's modules ---- */

/* Serve one decoded request (tc_server's on_request). */
void tc__coord_on_request(struct tc_req *req, void *arg);

/* Phase two of a decided transaction: drive 'branches' (copied) to the
 * decision implied by 'global_status'.  'done' (may be NULL) runs once with
 * the global status reached (final, or a *Retrying/Failed status). */
void tc__phase2_drive(tc_node_t *node, const char *xid, int global_status,
                      const tc_branch_row_t *branches, int nbranches,
                      void (*done)(int global_status, void *arg), void *arg);

/* Locks of 'xid' were released or began rolling back: wake its waiters,
 * here and (through the peer bus) on the other nodes. */
void tc__lockwait_release(tc_node_t *node, const char *xid);

/* Phase two found no local RM for 'req' (BranchCommit/Rollback): relay it
 * through a peer that has one.  Returns 0 (cb runs once, later, as
 * tc_conn_call's would) or < 0 when no peer can be asked (no bus, no peer
 * up; cb never runs). */
int tc__cluster_forward(tc_node_t *node, const txp_msg_t *req, const char *client_id, unsigned timeout_ms,
                        void (*cb)(int status, const txp_msg_t *res, void *arg), void *arg);

/* Whether this node may take the recovery leadership: its membership is
 * claimed and its heartbeats are being written. */
bool tc__cluster_may_lead(const tc_node_t *node);

#endif /* TC_NODE_H */
