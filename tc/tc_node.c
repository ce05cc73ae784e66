/*
 * tc_node.c - start and stop one coordinator node; see tc_node.h.
 */
#include "tc_node.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tc_bus.h"
#include "tc_cluster.h"
#include "tc_admin.h"
#include "tc_lockwait.h"
#include "tc_log.h"
#include "tc_metrics.h"
#include "tc_recovery.h"
#include "tc_server.h"

#define MAX_LOCK_WAITERS 100000
#define STORE_READY_TIMEOUT_MS 30000
#define MEMBER_SQL_DEADLINE_MS 5000

#ifndef TXC_VERSION
#define TXC_VERSION "0.1.0"
#endif

static void start_serving(tc_node_t *node);

void tc__lockwait_release(tc_node_t *node, const char *xid) {
  if (node->lockwait) tc_lockwait_release(node->lockwait, xid);
  if (node->bus) tc_bus_released(node->bus, xid);
}

/* ------------------------------------------------------------- cluster
 *
 * The glue between the node and cluster/: membership gets a one-connection
 * pool of its own (the advisory lock of the node id lives as long as that
 * session), the bus gets handlers that reach the lock waiters and the RM
 * connections of this node.
 */

static void cluster_log(int level, const char *msg, void *arg) { TC_LOG(level, NULL, "%s", msg); }

typedef struct member_call {
  tc_cluster_sql_cb cb;
  void *arg;
} member_call_t;

static void on_member_job(tc_pg_job_t *job, int status, void *arg) {
  member_call_t *mc = arg;
  if (status == TC_PG_OK) {
    mc->cb(0, tc_pg_job_result(job, 0), NULL, mc->arg);
  } else {
    const char *e = status == TC_PG_ESTMT || status == TC_PG_EBROKEN ? tc_pg_job_error(job) : NULL;
    mc->cb(status, NULL, e && e[0] ? e : "store connection unavailable", mc->arg);
  }
  free(mc);
}

static int member_sql(void *ctx, const char *sql, int n, const char *const *v, tc_cluster_sql_cb cb, void *arg) {
  tc_node_t *node = ctx;
  member_call_t *mc = malloc(sizeof(*mc));
  tc_pg_job_t *job = mc ? tc_pg_job_new(0, on_member_job, mc) : NULL;
  if (!job || tc_pg_job_add(job, sql, n, v) != 0) {
    if (job) tc_pg_job_free(job);
    free(mc);
    return TXP_ENOMEM;
  }
  mc->cb = cb;
  mc->arg = arg;
  int rc = tc_pg_submit(node->member_pool, job, MEMBER_SQL_DEADLINE_MS);
  if (rc != 0) {
    tc_pg_job_free(job);
    free(mc);
  }
  return rc;
}

static void on_member_state(tc_pg_pool_t *pool, int idx, bool up, const char *err, void *arg) {
  tc_node_t *node = arg;
  if (!node->cluster) return;
  if (up) tc_cluster_session_up(node->cluster);
  else tc_cluster_session_down(node->cluster);
}

static void on_claimed(int status, const char *err, void *arg) {
  tc_node_t *node = arg;
  if (node->stopping) return;
  if (status != 0) {
    if (node->on_ready) node->on_ready(node, TXP_EBAD_STATE, err, node->ready_arg);
    node->on_ready = NULL;
    return;
  }
  node->claimed = true;
  if (node->store_ready) start_serving(node);
}

static void on_claim_lost(const char *err, void *arg) {
  tc_node_t *node = arg;
  /* Two live processes must never share a node id: stop this one the way
   * an operator would (tc_main's SIGTERM handler stops the node cleanly). */
  tc_log_error("%s; this process gives up its node id and stops", err);
  kill(getpid(), SIGTERM);
  (void)node;
}

static bool cluster_is_leader(void *arg) {
  tc_node_t *node = arg;
  bool leader = node->recovery && tc_recovery_is_leader(node->recovery);
  if (node->bus) tc_bus_set_leader(node->bus, leader);
  return leader;
}

static void on_cluster_peer(int node_id, const char *bus_address, void *arg) {
  tc_node_t *node = arg;
  if (node->bus && tc_bus_add_peer(node->bus, node_id, bus_address) != 0)
    tc_log_warn("could not connect the bus to node %d at \"%s\"", node_id, bus_address);
}

static int add_config_peer(int node_id, const char *addr, void *arg) {
  on_cluster_peer(node_id, addr, arg);
  return 0;
}

static void on_bus_released(const char *xid, void *arg) {
  tc_node_t *node = arg;
  /* Local waiters only: what arrives on the bus is not sent on again. */
  if (node->lockwait && !node->stopping) tc_lockwait_release(node->lockwait, xid);
}

static size_t bus_waiters(void *arg) {
  tc_node_t *node = arg;
  return node->lockwait ? tc_lockwait_count(node->lockwait) : 0;
}

static void on_bus_peer(int node_id, const char *address, bool up, void *arg) {
  tc_log_info("peer node %d (%s) %s the bus", node_id, address[0] ? address : "?", up ? "joined" : "left");
}

/* A phase-two call relayed for a peer: the request's fields (copied, since
 * the bus lends them only during on_forward) and the bus's reply handle. */
typedef struct relay {
  tc_node_t *node;
  tc_bus_fwd_t *f;
  int type;
  char xid[TXP_MAX_XID_LEN + 1];
  int64_t branch_id;
  int branch_type;
  char resource_id[TXP_MAX_RESOURCE_LEN + 1];
  char client_id[TXP_MAX_NAME_LEN + 1];
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
static void on_relay_checked(tc_pg_job_t *job, int status, void *arg) {
  relay_t *r = arg;
  tc_node_t *node = r->node;
  int rc = TXP_ESTORE;
  if (status == TC_PG_OK && !node->stopping) {
    const PGresult *res = tc_pg_job_result(job, 0);
    int gs = PQntuples(res) == 1 ? atoi(PQgetvalue(res, 0, 0)) : 0;
    bool ok = r->type == TXP_MSG_BRANCH_COMMIT ? txp_global_status_is_commit(gs)
                                               : txp_global_status_is_rollback(gs);
    rc = ok ? 0 : TXP_EBAD_STATE;
  } else if (node->stopping) {
    rc = TXP_ESHUTDOWN;
  }
  if (rc == 0) {
    tc_conn_t *conn = tc_server_find_rm(node->server, r->resource_id, r->client_id[0] ? r->client_id : NULL);
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
  tc_node_t *node = arg;
  if (node->stopping || !node->server || !req->xid || !req->resource_id) return TXP_EBRANCH_NOT_FOUND;
  if (!tc_server_find_rm(node->server, req->resource_id, NULL)) return TXP_EBRANCH_NOT_FOUND;
  relay_t *r = calloc(1, sizeof(*r));
  tc_pg_job_t *job = r ? tc_pg_job_new(0, on_relay_checked, r) : NULL;
  char branch[32];
  snprintf(branch, sizeof(branch), "%lld", (long long)req->branch_id);
  const char *v[] = {req->xid, branch};
  if (!job ||
      tc_pg_job_add(job,
                    "SELECT g.status FROM global_table g JOIN branch_table b "
                    "ON b.xid = g.xid AND b.branch_id = $2::bigint WHERE g.xid = $1",
                    2, v) != 0) {
    if (job) tc_pg_job_free(job);
    free(r);
    return TXP_ENOMEM;
  }
  r->node = node;
  r->f = f;
  r->type = req->type;
  snprintf(r->xid, sizeof(r->xid), "%s", req->xid);
  r->branch_id = req->branch_id;
  r->branch_type = (int)req->branch_type;
  snprintf(r->resource_id, sizeof(r->resource_id), "%s", req->resource_id);
  snprintf(r->client_id, sizeof(r->client_id), "%s", client_id ? client_id : "");
  /* Leave the asker time to hear the answer before it gives up. */
  unsigned t = timeout_ms ? timeout_ms : (unsigned)node->cfg.cluster_forward_timeout_ms;
  r->timeout_ms = t > 1000 ? t - 500 : t / 2 + 1;
  if (tc_store_read(node->store, job, r->timeout_ms) != 0) {
    tc_pg_job_free(job);
    free(r);
    return TXP_EBUSY;
  }
  node->stats.phase2_calls++;
  return 0;
}

int tc__cluster_forward(tc_node_t *node, const txp_msg_t *req, const char *client_id, unsigned timeout_ms,
                        void (*cb)(int status, const txp_msg_t *res, void *arg), void *arg) {
  if (!node->bus || node->stopping) return TXP_ENO_NODE;
  unsigned t = (unsigned)node->cfg.cluster_forward_timeout_ms;
  if (timeout_ms && timeout_ms < t) t = timeout_ms;
  int rc = tc_bus_forward(node->bus, req, client_id, t, cb, arg);
  if (rc == 0) node->stats.phase2_forwarded++;
  return rc;
}

bool tc__cluster_may_lead(const tc_node_t *node) {
  return !node->cluster || tc_cluster_healthy(node->cluster);
}

/* Start the membership: its connection, then the claim of the node id. */
static int cluster_start(tc_node_t *node) {
  tc_cluster_opts_t co = {0};
  co.node_id = node->cfg.node_id;
  co.version = TXC_VERSION;
  co.heartbeat_ms = (unsigned)node->cfg.cluster_heartbeat_ms;
  co.lease_ms = (unsigned)node->cfg.cluster_leader_lease_ms;
  co.claim_wait_ms = (unsigned)node->cfg.cluster_claim_wait_ms;
  co.sql = member_sql;
  co.sql_ctx = node;
  co.on_claimed = on_claimed;
  co.on_lost = on_claim_lost;
  co.on_peer = on_cluster_peer;
  co.is_leader = cluster_is_leader;
  co.log = cluster_log;
  co.arg = node;
  node->cluster = tc_cluster_new(node->loop, &co);
  if (!node->cluster) return TXP_ENOMEM;
  char init[128];
  /* Heartbeats need not be durable: no fsync wait for them. */
  snprintf(init, sizeof(init), "SET application_name = 'tcd-member/%d'; SET synchronous_commit = off",
           node->cfg.node_id);
  tc_pg_pool_opts_t o = {0};
  o.conninfo = node->cfg.pg_url;
  o.size = 1;
  o.max_queue = 16;
  o.on_state = on_member_state;
  o.state_arg = node;
  o.init_sql = init;
  node->member_pool = tc_pg_pool_new(node->loop, &o);
  return node->member_pool ? 0 : TXP_ENOMEM;
}

/* The bus, once the node listens (its heartbeats carry the address). */
static int bus_start(tc_node_t *node, char *err, size_t errlen) {
  if (!node->cfg.cluster_bus[0]) return 0;
  tc_bus_opts_t bo = {0};
  bo.node_id = node->cfg.node_id;
  bo.bind = node->cfg.cluster_bus;
  bo.advertise = node->advertise;
  bo.heartbeat_ms = (unsigned)node->cfg.cluster_heartbeat_ms;
  bo.h.on_released = on_bus_released;
  bo.h.on_forward = on_bus_forward;
  bo.h.on_peer = on_bus_peer;
  bo.h.waiters = bus_waiters;
  bo.h.arg = node;
  node->bus = tc_bus_new(node->loop, &bo, err, errlen);
  if (!node->bus) return TXP_EINVALID_ARG;
  char perr[256];
  tc_config_each_peer(node->cfg.cluster_peers, add_config_peer, node, perr, sizeof(perr));
  return 0;
}

/* Every 10 s at debug level: what the store did (for tuning batches). */
static void on_stats_tick(uv_timer_t *t) {
  tc_node_t *node = t->data;
  tc_store_stats_t s;
  tc_store_get_stats(node->store, &s);
  static tc_store_stats_t prev;
  uint64_t b = s.batches - prev.batches, o = s.ops - prev.ops;
  double ms = s.batch_ms_total - prev.batch_ms_total;
  if (b)
    tc_log_debug("store: %llu batches, %.1f ops/batch, %.2f ms/batch, queue %llu (peak %llu), %llu deadlocks",
                 (unsigned long long)b, (double)o / (double)b, ms / (double)b,
                 (unsigned long long)s.queue_len, (unsigned long long)s.queue_peak,
                 (unsigned long long)(s.deadlocks - prev.deadlocks));
  prev = s;
}

static void fail_start(tc_node_t *node, int status, const char *err) {
  if (node->on_ready) node->on_ready(node, status, err, node->ready_arg);
  node->on_ready = NULL;
}

static void on_store_ready(int status, const char *err, void *arg) {
  tc_node_t *node = arg;
  if (node->stopping) return;
  if (status != 0) {
    fail_start(node, status, err);
    return;
  }
  /* Serve once the node id is ours too (on_claimed). */
  node->store_ready = true;
  if (node->claimed) start_serving(node);
}

static void start_serving(tc_node_t *node) {
  char host[256], errbuf[256];
  int port;
  tc_config_split_addr(node->cfg.listen, host, sizeof(host), &port);
  tc_server_opts_t so = {0};
  so.listen_host = host;
  so.listen_port = port;
  so.token = node->cfg.token;
  so.node_id = node->cfg.node_id;
  so.max_connections = node->cfg.max_connections;
  so.max_inflight = node->cfg.max_inflight;
  so.heartbeat_ms = node->cfg.heartbeat_ms;
  so.max_frame = (uint32_t)node->cfg.max_frame;
  so.on_request = tc__coord_on_request;
  so.request_arg = node;
  int rc = tc_server_start(node->loop, &so, &node->server, errbuf, sizeof(errbuf));
  if (rc != 0) {
    fail_start(node, rc, errbuf);
    return;
  }
  /* The advertised address goes into every xid: with port 0 it is only
   * known now. */
  if (node->cfg.advertise[0]) snprintf(node->advertise, sizeof(node->advertise), "%s", node->cfg.advertise);
  else snprintf(node->advertise, sizeof(node->advertise), "%.200s:%d", host, tc_server_port(node->server));
  if (bus_start(node, errbuf, sizeof(errbuf)) != 0) {
    fail_start(node, TXP_EINVALID_ARG, errbuf);
    return;
  }
  tc_cluster_register(node->cluster, node->advertise, node->cfg.admin_socket, node->cfg.cluster_bus);
  node->recovery = tc_recovery_new(node);
  if (!node->recovery) {
    fail_start(node, TXP_ENOMEM, "could not start the recovery jobs: out of memory");
    return;
  }
  if (node->cfg.admin_socket[0] && (rc = tc_admin_start(node, &node->admin, errbuf, sizeof(errbuf))) != 0) {
    fail_start(node, rc, errbuf);
    return;
  }
  if (node->cfg.metrics_listen[0] && (rc = tc_metrics_start(node, &node->metrics, errbuf, sizeof(errbuf))) != 0) {
    fail_start(node, rc, errbuf);
    return;
  }
  node->serving = true;
  if (tc_log_level >= TC_LOG_DEBUG) {
    uv_timer_init(node->loop, &node->stats_timer);
    node->stats_timer.data = node;
    uv_timer_start(&node->stats_timer, on_stats_tick, 2000, 2000);
    node->stats_timer_on = true;
  }
  tc_log_info("serving on %s (node %d)", node->advertise, node->cfg.node_id);
  if (node->on_ready) node->on_ready(node, 0, NULL, node->ready_arg);
  node->on_ready = NULL;
}

tc_node_t *tc_node_start(uv_loop_t *loop, const tc_config_t *cfg,
                         void (*on_ready)(tc_node_t *, int, const char *, void *), void *arg) {
  tc_node_t *node = calloc(1, sizeof(*node));
  if (!node) return NULL;
  node->loop = loop;
  node->cfg = *cfg;
  node->on_ready = on_ready;
  node->ready_arg = arg;
  node->lockwait = tc_lockwait_new(loop, MAX_LOCK_WAITERS);
  node->store = tc_store_new(loop, &node->cfg, on_store_ready, node, STORE_READY_TIMEOUT_MS);
  if (!node->lockwait || !node->store || cluster_start(node) != 0) {
    /* Allocation failures at start-up: report, the caller exits. */
    fail_start(node, TXP_ENOMEM, "could not start the node: out of memory or bad store URL");
    return node;
  }
  return node;
}

int tc_node_port(const tc_node_t *node) { return node->server ? tc_server_port(node->server) : -1; }

static void stop_part(void *arg) {
  tc_node_t *node = arg;
  if (--node->stop_parts > 0) return;
  void (*done)(void *) = node->stop_done;
  void *darg = node->stop_arg;
  free(node);
  if (done) done(darg);
}

static void on_stats_timer_closed(uv_handle_t *h) { stop_part(h->data); }

static void after_server_stopped(void *arg) {
  tc_node_t *node = arg;
  /* No new requests can arrive now: release the rest. */
  node->stop_parts = 1;
  if (node->stats_timer_on) {
    node->stats_timer_on = false;
    node->stop_parts++;
    uv_close((uv_handle_t *)&node->stats_timer, on_stats_timer_closed);
  }
  if (node->metrics) {
    node->stop_parts++;
    tc_metrics_close(node->metrics, stop_part, node);
  }
  if (node->admin) {
    node->stop_parts++;
    tc_admin_close(node->admin, stop_part, node);
  }
  if (node->recovery) {
    node->stop_parts++;
    tc_recovery_close(node->recovery, stop_part, node);
  }
  if (node->lockwait) {
    node->stop_parts++;
    tc_lockwait_close(node->lockwait, stop_part, node);
  }
  if (node->store) {
    node->stop_parts++;
    tc_store_close(node->store, stop_part, node);
  }
  /* The bus and the membership are forgotten before they are closed:
   * callbacks that still run during the shutdown (a release, the member
   * session going down) must not reach them. */
  if (node->bus) {
    tc_bus_t *bus = node->bus;
    node->bus = NULL;
    node->stop_parts++;
    tc_bus_close(bus, stop_part, node);
  }
  if (node->cluster) {
    tc_cluster_t *cl = node->cluster;
    node->cluster = NULL;
    node->stop_parts++;
    tc_cluster_close(cl, stop_part, node);
  }
  if (node->member_pool) {
    /* Closing the session gives the node id back at once. */
    node->stop_parts++;
    tc_pg_pool_close(node->member_pool, stop_part, node);
  }
  stop_part(node);
}

void tc_node_stop(tc_node_t *node, void (*done)(void *), void *arg) {
  node->stopping = true;

  node->stop_done = done;
  node->stop_arg = arg;
  if (node->server) tc_server_stop(node->server, after_server_stopped, node);
  else after_server_stopped(node);
}
