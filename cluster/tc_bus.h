/*
 * tc_bus.h - the peer bus between tcd nodes: one nanomsg BUS socket per
 * node, polled on the node's libuv loop.
 *
 * NOTES
 *   What travels on it (tc_bus_msg.h has the format):
 *     - heartbeats (HELLO): who is on the bus, who leads; a peer not heard
 *       from for 3 heartbeat intervals counts as gone;
 *     - lock-release wake-ups (RELEASED): xids whose global locks were just
 *       released on the sender, batched per loop iteration, so that a
 *       registration waiting on another node retries at once.  Only sent
 *       while some peer has waiters: heartbeats carry a "has waiters" flag,
 *       and a node whose first waiter queues says so at once (in the same
 *       loop iteration), so an uncontended cluster sends no releases at all;
 *     - phase-two forwarding (FORWARD / FORWARD_RESULT): a node that must
 *       send BranchCommit/BranchRollback to a resource whose RM is not
 *       connected to it asks its peers; a peer that has such an RM (and
 *       whose store agrees with the request, see tc_node.c) relays the call
 *       and sends back the RM's answer.
 *   Every message is sealed with the cluster secret and numbered; a
 *   receiver believes only messages that verify, come from a current
 *   member (tc_bus_set_members: the live nodes of the store's node table),
 *   and are not replays (tc_bus_auth.h, and tc_bus.c for the order of the
 *   checks).  Nodes with different secrets, or an older version that speaks
 *   the unauthenticated TXB1 format, do not hear each other: the cluster
 *   works on without the bus (below) until they agree again.
 *
 *   Nothing on the bus is needed for correctness: a lost RELEASED delays a
 *   waiter until its next store re-check, a lost FORWARD leaves the branch to
 *   the leader's retry job, a repeated one reaches an idempotent RM twice.
 *   nanomsg reconnects and resends on its own; a full pipe drops messages
 *   (counted in the stats).
 *
 *   Topology: every node binds its own address; a node connects to the
 *   peers whose node id is lower than its own, so each pair shares exactly
 *   one pipe and nothing arrives twice.  Peers come from the configuration
 *   and from the node table (tc_bus_add_peer is idempotent).
 *
 *   nanomsg keeps its own worker thread; this module only ever calls it
 *   with NN_DONTWAIT, from the loop thread, after uv_poll reports NN_RCVFD
 *   readable, so the loop never blocks on it.
 *
 *   Thread: the loop thread only.
 */
#ifndef TC_BUS_H
#define TC_BUS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "tc_bus_auth.h"
#include "txp_msg.h"

typedef struct tc_bus tc_bus_t;
typedef struct tc_bus_fwd tc_bus_fwd_t;

/* Completion of a forwarded call, exactly once, never from inside
 * tc_bus_forward: status 0 and 'res' the RM's result (borrowed), or status
 * < 0 and res NULL (TXP_EUNKNOWN_OUTCOME: no answer in time;
 * TXP_ESHUTDOWN: the bus closed). */
typedef void (*tc_bus_call_cb)(int status, const txp_msg_t *res, void *arg);

typedef struct tc_bus_handlers {
  /* 'xid' released its locks on a peer.  'xid' is borrowed. */
  void (*on_released)(const char *xid, void *arg);
  /* A peer asks this node to relay 'req' (BranchCommit/Rollback, borrowed)
   * to a local RM of req->resource_id, preferring 'client_id'.  Return 0
   * when taken: the handler must then call tc_bus_forward_reply(f, ...)
   * exactly once, possibly later.  Return TXP_EBRANCH_NOT_FOUND when no
   * RM here serves the resource (the bus answers NO_RM itself). */
  int (*on_forward)(tc_bus_fwd_t *f, const txp_msg_t *req, const char *client_id,
                    unsigned timeout_ms, void *arg);
  /* A message signed with the secret came from 'node_id', which is not a
   * member (yet): e.g. a node that just started; the membership may want
   * to look again soon (tc_cluster_beat_soon).  May be NULL. */
  void (*on_stranger)(int node_id, void *arg);
  /* A peer appeared on (up) or left (!up) the bus; may be NULL. */
  void (*on_peer)(int node_id, const char *address, bool up, void *arg);
  /* How many lock waiters this node has now (checked once per loop
   * iteration); NULL = always some, peers always send releases. */
  size_t (*waiters)(void *arg);
  /* Log lines (level: 0 error, 1 warn, 2 info, 3 debug), e.g. a dropped
   * message, at most one per claimed sender per log interval; may be
   * NULL.  'msg' is borrowed. */
  void (*log)(int level, const char *msg, void *arg);
  void *arg;
} tc_bus_handlers_t;

typedef struct tc_bus_opts {
  int node_id;              /* 1..1023 */
  const char *bind;         /* nanomsg address, e.g. tcp://127.0.0.1:7101; copied */
  const char *advertise;    /* client address, sent in heartbeats; copied */
  unsigned heartbeat_ms;    /* HELLO period, default 1000 */
  const tc_bus_keys_t *keys; /* the cluster secret (required); copied */
  unsigned replay_window_ms; /* accepted clock difference, default 30000 */
  unsigned log_interval_ms; /* one line per sender per interval, default 60000 */
  tc_bus_handlers_t h;
} tc_bus_opts_t;

/* Why a received message was dropped. */
typedef enum tc_bus_reject {
  TC_BUS_REJECT_MALFORMED = 0,  /* does not parse (TXB1 included) */
  TC_BUS_REJECT_BAD_MAC = 1,    /* not sealed with a key of the secret */
  TC_BUS_REJECT_NOT_MEMBER = 2, /* sender id not a live member */
  TC_BUS_REJECT_REPLAYED = 3,   /* sequence number seen already */
  TC_BUS_REJECT_STALE = 4,      /* stamp outside the replay window */
  TC_BUS_REJECT_UNEXPECTED = 5, /* an answer nobody was asked for, or about another branch */
  TC_BUS_REJECT_N = 6,
} tc_bus_reject_t;

typedef struct tc_bus_stats {
  uint64_t sent, received, send_dropped, bad_messages; /* bad: sum of rejected[] */
  uint64_t rejected[TC_BUS_REJECT_N];
  uint64_t released_sent, released_received;   /* xids */
  uint64_t released_skipped;                    /* not sent: no peer had waiters */
  uint64_t forwards_sent, forwards_answered, forwards_no_rm, forwards_timed_out;
  uint64_t forwards_served;                     /* relayed for peers */
  int peers_up;
} tc_bus_stats_t;

/* Bind and start polling.  Returns NULL with 'err' set when the address
 * cannot be bound (or allocation fails). */
tc_bus_t *tc_bus_new(uv_loop_t *loop, const tc_bus_opts_t *opts, char *err, size_t errlen);
/* Pending forwards complete with TXP_ESHUTDOWN, the socket is closed; 'done'
 * runs once every handle is closed and every forward taken by on_forward
 * has been answered (its reply is then dropped). */
void tc_bus_close(tc_bus_t *bus, void (*done)(void *arg), void *arg);

/* Know peer 'node_id' at nanomsg address 'addr' (connects when its id is
 * lower than ours; a changed address replaces the old one).  Returns 0 or a
 * negative code when the address is refused by nanomsg. */
int tc_bus_add_peer(tc_bus_t *bus, int node_id, const char *addr);

/* Tell the peers that 'xid' released its locks (batched: sent at the next
 * loop iteration).  Never fails; dropped if the batch cannot grow. */
void tc_bus_released(tc_bus_t *bus, const char *xid);

/* Relay 'req' (BranchCommit or BranchRollback; borrowed) through a peer
 * that has an RM for its resource.  Returns 0 (cb runs once, later) or
 * TXP_ENO_NODE when no peer is up on the bus (cb never runs).  When every
 * peer up answers NO_RM, cb gets a result with code TXP_EBRANCH_RETRYABLE. */
int tc_bus_forward(tc_bus_t *bus, const txp_msg_t *req, const char *client_id, unsigned timeout_ms,
                   tc_bus_call_cb cb, void *arg);

/* Answer a forward taken by on_forward: 'res' is the RM's result frame
 * (status 0), or status < 0 when the call failed (TXP_EBAD_STATE: refused
 * because the store disagrees).  Frees 'f'. */
void tc_bus_forward_reply(tc_bus_fwd_t *f, int status, const txp_msg_t *res);

/* Replace the cluster secret (e.g. a rotation step read on SIGHUP); keys
 * are copied.  0 or TXP_EINVALID_ARG (no key). */
int tc_bus_set_keys(tc_bus_t *bus, const tc_bus_keys_t *keys);
/* The current members: node ids whose messages are believed (the live
 * nodes of the node table, from each membership heartbeat).  Replaces the
 * previous list; 'ids' is borrowed.  Until the first call nobody is. */
void tc_bus_set_members(tc_bus_t *bus, const int *ids, size_t n);
/* "bad_mac", "replayed", ... for a tc_bus_reject_t (metric labels). */
const char *tc_bus_reject_name(int reason);

/* Our leadership, announced in heartbeats (informational). */
void tc_bus_set_leader(tc_bus_t *bus, bool leader);

int tc_bus_peers_up(const tc_bus_t *bus);
void tc_bus_get_stats(const tc_bus_t *bus, tc_bus_stats_t *out);

#endif /* TC_BUS_H */
