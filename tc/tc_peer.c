/*
 * tc_peer.c - the glue between one node and cluster/ (tc_peer.h): the
 * membership gets a connection of its own (tc_read_conn_t: the advisory
 * lock of the node id lives as long as that session), the bus gets handlers that
 * reach the lock waiters and the RM connections of this node, and a
 * relayed phase-two call is only sent for a decision on record.
 */
#include "tc_peer.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tc_bus.h"
#include "tc_cluster.h"
#include "tc_lockwait.h"
#include "tc_log.h"
#include "tc_parts.h"
#include "tc_recovery.h"
#include "tc_server.h"
#include "tc_store_read.h"

#define MEMBER_SQL_DEADLINE_MS 5000

struct tc_peer {
  tc_ctx_t *ctx;
  void (*on_claimed)(int status, const char *err, void *arg);
  void *arg;
  tc_cluster_t *cluster;
  tc_bus_t *bus;
  tc_read_conn_t *member_conn; /* the session that holds the node id's lock */
};

static void cluster_log(int level, const char *msg, void *arg) { TC_LOG(level, NULL, "%s", msg); }

typedef struct member_call {
  tc_cluster_sql_cb cb;
  void *arg;
} member_call_t;

static void on_member_sql(int status, const struct pg_result *res, const char *err, void *arg) {
  member_call_t *mc = arg;
  if (status == TC_READ_OK) mc->cb(0, res, NULL, mc->arg);
  else mc->cb(status, NULL, err[0] ? err : "store connection unavailable", mc->arg);
  free(mc);
}

static int member_sql(void *ctx, const char *sql, int n, const char *const *v, tc_cluster_sql_cb cb, void *arg) {
  tc_peer_t *p = ctx;
  member_call_t *mc = malloc(sizeof(*mc));
  if (!mc) return TXP_ENOMEM;
  mc->cb = cb;
  mc->arg = arg;
  int rc = tc_read_conn_exec(p->member_conn, sql, n, v, MEMBER_SQL_DEADLINE_MS, on_member_sql, mc);
  if (rc != 0) free(mc);
  return rc == TC_READ_ENOMEM ? TXP_ENOMEM : rc;
}

static void on_member_state(bool up, const char *err, void *arg) {
  tc_peer_t *p = arg;
  if (!p->cluster) return;
  if (up) tc_cluster_session_up(p->cluster);
  else tc_cluster_session_down(p->cluster);
}

static void on_claimed(int status, const char *err, void *arg) {
  tc_peer_t *p = arg;
  if (p->ctx->stopping) return;
  p->on_claimed(status, err, p->arg);
}

static void on_claim_lost(const char *err, void *arg) {
  tc_peer_t *p = arg;
  /* Two live processes must never share a node id: stop this one the way
   * an operator would (tc_main's SIGTERM handler stops the node cleanly). */
  tc_log_error("%s; this process gives up its node id and stops", err);
  kill(getpid(), SIGTERM);
  (void)p;
}

static bool cluster_is_leader(void *arg) {
  tc_peer_t *p = arg;
  bool leader = p->ctx->recovery && tc_recovery_is_leader(p->ctx->recovery);
  if (p->bus) tc_bus_set_leader(p->bus, leader);
  return leader;
}

static void on_cluster_peer(int node_id, const char *bus_address, void *arg) {
  tc_peer_t *p = arg;
  if (p->bus && tc_bus_add_peer(p->bus, node_id, bus_address) != 0)
    tc_log_warn("could not connect the bus to node %d at \"%s\"", node_id, bus_address);
}

static void on_cluster_members(const int *ids, size_t n, void *arg) {
  tc_peer_t *p = arg;
  if (p->bus) tc_bus_set_members(p->bus, ids, n);
}

static void bus_log(int level, const char *msg, void *arg) { TC_LOG(level, NULL, "%s", msg); }

static void on_bus_stranger(int node_id, void *arg) {
  tc_peer_t *p = arg;
  if (p->cluster) tc_cluster_beat_soon(p->cluster);
}

static int add_config_peer(int node_id, const char *addr, void *arg) {
  on_cluster_peer(node_id, addr, arg);
  return 0;
}

static void on_bus_released(const char *xid, void *arg) {
  tc_peer_t *p = arg;
  /* Local waiters only: what arrives on the bus is not sent on again. */
  if (p->ctx->lockwait && !p->ctx->stopping) tc_lockwait_release(p->ctx->lockwait, xid);
}

static size_t bus_waiters(void *arg) {
  tc_peer_t *p = arg;
  return p->ctx->lockwait ? tc_lockwait_count(p->ctx->lockwait) : 0;
}

static void on_bus_peer(int node_id, const char *address, bool up, void *arg) {
  tc_log_info("peer node %d (%s) %s the bus", node_id, address[0] ? address : "?", up ? "joined" : "left");
}

/* A phase-two call relayed for a peer: the request's fields (copied, since
 * the bus lends them only during on_forward) and the bus's reply handle. */
typedef struct relay {
  tc_peer_t *p;
  tc_bus_fwd_t *f;
  int type;
  char xid[TXP_MAX_XID_LEN + 1];
  int64_t branch_id;
  int branch_type;
  char resource_id[TXP_MAX_RESOURCE_LEN + 1];
  char client_id[TXP_MAX_NAME_LEN + 1];
  char app_id[TXP_MAX_NAME_LEN + 1];    /* of the branch, from the store */
  char app_group[TXP_MAX_NAME_LEN + 1]; /* its group, from the store */
  unsigned timeout_ms;
} relay_t;

static void on_relay_answer(int status, const txp_msg_t *res, void *arg) {
  relay_t *r = arg;
  tc_bus_forward_reply(r->f, status, res);
  free(r);
}

/* The store agrees (or not) that the branch is to be driven that way: a
 * relayed BranchCommit/Rollback is only sent for a decision on record, so a
 * stale, duplicated or forged bus message can never make an RM act against
 * it. */
static void on_relay_checked(int status, const char *err, const tc_read_owner_t *o, void *arg) {
  relay_t *r = arg;
  tc_peer_t *p = r->p;
  int rc = TXP_ESTORE;
  if (status == TC_READ_OK && !p->ctx->stopping) {
    int gs = o->found ? o->global_status : 0;
    bool ok = r->type == TXP_MSG_BRANCH_COMMIT ? txp_global_status_is_commit(gs)
                                               : txp_global_status_is_rollback(gs);
    rc = ok ? 0 : TXP_EBAD_STATE;
    if (ok) { /* who registered the branch, as the store says: not the message */
      snprintf(r->app_id, sizeof(r->app_id), "%s", o->application_id);
      snprintf(r->app_group, sizeof(r->app_group), "%s", o->app_group);
    }
  } else if (p->ctx->stopping) {
    rc = TXP_ESHUTDOWN;
  }
  if (rc == 0) {
    /* only an RM of the branch's group, as when this node drives phase two
     * itself (tc_phase2.c) */
    tc_conn_t *conn = tc_server_find_branch_rm(p->ctx->server, r->resource_id, r->client_id[0] ? r->client_id : NULL,
                                               r->app_id, r->app_group);
    if (!conn) {
      rc = TXP_EBRANCH_NOT_FOUND; /* it went away meanwhile */
    } else {
      txp_msg_t m;
      txp_msg_init(&m, (txp_msg_type_t)r->type);
      txp_msg_set_str(&m, TXP_F_XID, r->xid);
      txp_msg_set_int(&m, TXP_F_BRANCH_ID, r->branch_id);
      txp_msg_set_str(&m, TXP_F_RESOURCE_ID, r->resource_id);
      txp_msg_set_int(&m, TXP_F_BRANCH_TYPE, r->branch_type);
      rc = tc_conn_call(conn, &m, r->timeout_ms, on_relay_answer, r);
      if (rc == 0) return;
    }
  }
  tc_bus_forward_reply(r->f, rc, NULL);
  free(r);
}

static int on_bus_forward(tc_bus_fwd_t *f, const txp_msg_t *req, const char *client_id, unsigned timeout_ms,
                          void *arg) {
  tc_peer_t *p = arg;
  if (p->ctx->stopping || !p->ctx->server || !req->xid || !req->resource_id) return TXP_EBRANCH_NOT_FOUND;
  if (!tc_server_find_rm(p->ctx->server, req->resource_id, NULL)) return TXP_EBRANCH_NOT_FOUND;
  relay_t *r = calloc(1, sizeof(*r));
  if (!r) return TXP_ENOMEM;
  r->p = p;
  r->f = f;
  r->type = req->type;
  snprintf(r->xid, sizeof(r->xid), "%s", req->xid);
  r->branch_id = req->branch_id;
  r->branch_type = (int)req->branch_type;
  snprintf(r->resource_id, sizeof(r->resource_id), "%s", req->resource_id);
  snprintf(r->client_id, sizeof(r->client_id), "%s", client_id ? client_id : "");
  /* Leave the asker time to hear the answer before it gives up. */
  unsigned t = timeout_ms ? timeout_ms : (unsigned)p->ctx->cfg->cluster_forward_timeout_ms;
  r->timeout_ms = t > 1000 ? t - 500 : t / 2 + 1;
  int rc = tc_read_branch_owner(p->ctx->store, r->xid, r->branch_id, r->timeout_ms, on_relay_checked, r);
  if (rc != 0) {
    free(r);
    return rc == TC_READ_ENOMEM ? TXP_ENOMEM : TXP_EBUSY;
  }
  p->ctx->stats.phase2_calls++;
  return 0;
}

int tc_peer_forward(tc_peer_t *p, const txp_msg_t *req, const char *client_id, unsigned timeout_ms,
                    void (*cb)(int status, const txp_msg_t *res, void *arg), void *arg) {
  if (!p->bus || p->ctx->stopping) return TXP_ENO_NODE;
  unsigned t = (unsigned)p->ctx->cfg->cluster_forward_timeout_ms;
  if (timeout_ms && timeout_ms < t) t = timeout_ms;
  int rc = tc_bus_forward(p->bus, req, client_id, t, cb, arg);
  if (rc == 0) p->ctx->stats.phase2_forwarded++;
  return rc;
}

bool tc_peer_may_lead(const tc_peer_t *p) {
  return !p->cluster || tc_cluster_healthy(p->cluster);
}

/* Start the membership: its connection, then the claim of the node id. */
static int membership_start(tc_peer_t *p) {
  tc_cluster_opts_t co = {0};
  co.node_id = p->ctx->cfg->node_id;
  co.version = TXC_VERSION;
  co.heartbeat_ms = (unsigned)p->ctx->cfg->cluster_heartbeat_ms;
  co.lease_ms = (unsigned)p->ctx->cfg->cluster_leader_lease_ms;
  co.claim_wait_ms = (unsigned)p->ctx->cfg->cluster_claim_wait_ms;
  co.sql = member_sql;
  co.sql_ctx = p;
  co.on_claimed = on_claimed;
  co.on_lost = on_claim_lost;
  co.on_peer = on_cluster_peer;
  co.on_members = on_cluster_members;
  co.is_leader = cluster_is_leader;
  co.log = cluster_log;
  co.arg = p;
  p->cluster = tc_cluster_new(p->ctx->loop, &co);
  if (!p->cluster) return TXP_ENOMEM;
  p->member_conn =
    tc_read_conn_new(p->ctx->loop, p->ctx->cfg->pg_url, TC_READ_CONN_MEMBER, p->ctx->cfg->node_id, on_member_state, p);
  return p->member_conn ? 0 : TXP_ENOMEM;
}

int tc_peer_bus_start(tc_peer_t *p, char *err, size_t errlen) {
  if (!p->ctx->cfg->cluster_bus[0]) return 0;
  tc_bus_keys_t keys;
  if (tc_bus_keys_load(p->ctx->cfg->cluster_secret_file, &keys, err, errlen) != 0) return TXP_EINVALID_ARG;
  tc_bus_opts_t bo = {0};
  bo.keys = &keys;
  bo.replay_window_ms = (unsigned)p->ctx->cfg->cluster_replay_window_ms;
  bo.node_id = p->ctx->cfg->node_id;
  bo.bind = p->ctx->cfg->cluster_bus;
  bo.advertise = p->ctx->advertise;
  bo.heartbeat_ms = (unsigned)p->ctx->cfg->cluster_heartbeat_ms;
  bo.h.on_released = on_bus_released;
  bo.h.on_forward = on_bus_forward;
  bo.h.on_peer = on_bus_peer;
  bo.h.waiters = bus_waiters;
  bo.h.log = bus_log;
  bo.h.on_stranger = on_bus_stranger;
  bo.h.arg = p;
  p->bus = tc_bus_new(p->ctx->loop, &bo, err, errlen);
  tc_bus_keys_wipe(&keys);
  if (!p->bus) return TXP_EINVALID_ARG;
  p->ctx->bus = p->bus;
  char perr[256];
  tc_config_each_peer(p->ctx->cfg->cluster_peers, add_config_peer, p, perr, sizeof(perr));
  return 0;
}


tc_peer_t *tc_peer_new(tc_ctx_t *ctx, void (*claimed_cb)(int status, const char *err, void *arg), void *arg) {
  tc_peer_t *p = calloc(1, sizeof(*p));
  if (!p) return NULL;
  p->ctx = ctx;
  p->on_claimed = claimed_cb;
  p->arg = arg;
  if (membership_start(p) != 0) {
    if (p->cluster) tc_cluster_close(p->cluster, NULL, NULL);
    free(p);
    return NULL;
  }
  return p;
}

void tc_peer_register(tc_peer_t *p) {
  tc_cluster_register(p->cluster, p->ctx->advertise, p->ctx->cfg->admin_socket, p->ctx->cfg->cluster_bus);
}

bool tc_peer_bus_on(const tc_peer_t *p) { return p && p->bus; }

int tc_peer_reload_secret(tc_peer_t *p, char *err, size_t errlen) {
  if (!p || !p->bus) return 0;
  tc_bus_keys_t keys;
  if (tc_bus_keys_load(p->ctx->cfg->cluster_secret_file, &keys, err, errlen) != 0) return TXP_EINVALID_ARG;
  int n = keys.n;
  int rc = tc_bus_set_keys(p->bus, &keys);
  tc_bus_keys_wipe(&keys);
  if (rc == 0) snprintf(err, errlen, "%d key%s", n, n == 1 ? "" : "s");
  return rc;
}

void tc_peer_released(tc_peer_t *p, const char *xid) {
  if (p && p->bus) tc_bus_released(p->bus, xid);
}

typedef struct peer_close {
  tc_peer_t *p;
  tc_parts_t parts;
} peer_close_t;

static void peer_close_free(void *arg) {
  peer_close_t *pc = arg;
  free(pc->p);
  free(pc);
}

void tc_peer_close(tc_peer_t *p, void (*done)(void *arg), void *arg) {
  peer_close_t *pc = p ? calloc(1, sizeof(*pc)) : NULL;
  if (!pc) {
    /* Nothing to close (or no memory to wait with: the handles go with
     * the loop). */
    free(p);
    if (done) done(arg);
    return;
  }
  pc->p = p;
  tc_parts_start(&pc->parts, 1, peer_close_free, pc, done, arg); /* 1: this call, until all are started */
  /* The bus and the membership are forgotten before they are closed:
   * callbacks that still run during the shutdown (a release, the member
   * session going down) must not reach them. */
  if (p->bus) {
    tc_bus_t *bus = p->bus;
    p->bus = NULL;
    p->ctx->bus = NULL;
    tc_bus_close(bus, tc_parts_closed, tc_parts_add(&pc->parts));
  }
  if (p->cluster) {
    tc_cluster_t *cl = p->cluster;
    p->cluster = NULL;
    tc_cluster_close(cl, tc_parts_closed, tc_parts_add(&pc->parts));
  }
  /* Closing the session gives the node id back at once. */
  if (p->member_conn) tc_read_conn_close(p->member_conn, tc_parts_closed, tc_parts_add(&pc->parts));
  tc_parts_closed(&pc->parts);
}
