/*
 * tc_node.c - start and stop one coordinator node (tc_node.h): the node
 * owns the modules and their shared context, and implements the context's
 * operations (tc_ctx_ops_t) with the lock waiters and its peer.
 */
#include "tc_node.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tc_admin.h"
#include "tc_admin_exec.h"
#include "tc_coord.h"
#include "tc_creds.h"
#include "tc_ctx.h"
#include "tc_hold.h"
#include "tc_lockwait.h"
#include "tc_log.h"
#include "tc_metrics.h"
#include "tc_parts.h"
#include "tc_peer.h"
#include "tc_recovery.h"
#include "tc_server.h"

#define MAX_LOCK_WAITERS 100000
#define STORE_READY_TIMEOUT_MS 30000

struct tc_node {
  tc_ctx_t ctx; /* first: the node's modules hold &node->ctx */
  tc_config_t cfg;
  char advertise[TC_CONFIG_STR];
  struct tc_metrics *metrics; /* NULL without metrics.listen */
  tc_peer_t *peer;
  tc_creds_t *creds; /* server.credentials_file; NULL: none */
  bool store_ready, claimed;
  uv_timer_t stats_timer; /* debug-level store statistics */
  bool stats_timer_on;

  void (*on_ready)(tc_node_t *node, int status, const char *err, void *arg);
  void *ready_arg;
  tc_parts_t stop; /* the parts tc_node_stop waits for, and its caller */
};

static tc_node_t *node_of(const tc_ctx_t *ctx) { return (tc_node_t *)(uintptr_t)ctx; }

static void start_serving(tc_node_t *node);

/* ------------------------------------------------- the context's ops */

static void ops_release_locks(tc_ctx_t *ctx, const char *xid) {
  if (ctx->lockwait) tc_lockwait_release(ctx->lockwait, xid);
  tc_peer_released(node_of(ctx)->peer, xid);
}

static int ops_forward(tc_ctx_t *ctx, const txp_msg_t *req, const char *client_id, unsigned timeout_ms,
                       void (*cb)(int status, const txp_msg_t *res, void *arg), void *arg) {
  tc_peer_t *p = node_of(ctx)->peer;
  return p ? tc_peer_forward(p, req, client_id, timeout_ms, cb, arg) : TXP_ENO_NODE;
}

static bool ops_may_lead(const tc_ctx_t *ctx) {
  tc_peer_t *p = node_of(ctx)->peer;
  return !p || tc_peer_may_lead(p);
}

static const tc_ctx_ops_t node_ops = {ops_release_locks, ops_forward, ops_may_lead};

static void on_claimed(int status, const char *err, void *arg) {
  tc_node_t *node = arg;
  if (status != 0) {
    if (node->on_ready) node->on_ready(node, TXP_EBAD_STATE, err, node->ready_arg);
    node->on_ready = NULL;
    return;
  }
  node->claimed = true;
  if (node->store_ready) start_serving(node);
}

/* Every 10 s at debug level: what the store did (for tuning batches). */
static void on_stats_tick(uv_timer_t *t) {
  tc_node_t *node = t->data;
  tc_store_stats_t s;
  tc_store_get_stats(node->ctx.store, &s);
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
  if (node->ctx.stopping) return;
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
  so.creds = node->creds;
  so.node_id = node->cfg.node_id;
  so.max_connections = node->cfg.max_connections;
  so.max_connections_per_address = node->cfg.max_connections_per_address;
  so.max_inflight = node->cfg.max_inflight;
  so.heartbeat_ms = node->cfg.heartbeat_ms;
  so.max_frame = (uint32_t)node->cfg.max_frame;
  so.on_request = tc__coord_on_request;
  so.request_arg = &node->ctx;
  int rc = tc_server_start(node->ctx.loop, &so, &node->ctx.server, errbuf, sizeof(errbuf));
  if (rc != 0) {
    fail_start(node, rc, errbuf);
    return;
  }
  /* The advertised address goes into every xid: with port 0 it is only
   * known now. */
  if (node->cfg.advertise[0]) snprintf(node->advertise, sizeof(node->advertise), "%s", node->cfg.advertise);
  else snprintf(node->advertise, sizeof(node->advertise), "%.200s:%d", host, tc_server_port(node->ctx.server));
  if (tc_peer_bus_start(node->peer, errbuf, sizeof(errbuf)) != 0) {
    fail_start(node, TXP_EINVALID_ARG, errbuf);
    return;
  }
  node->ctx.peers = tc_peer_bus_on(node->peer);
  tc_peer_register(node->peer);
  node->ctx.recovery = tc_recovery_new(&node->ctx);
  if (!node->ctx.recovery) {
    fail_start(node, TXP_ENOMEM, "could not start the recovery jobs: out of memory");
    return;
  }
  if (node->cfg.admin_socket[0] && (rc = tc_admin_start(&node->ctx, tc__admin_execute, &node->ctx.admin, errbuf, sizeof(errbuf))) != 0) {
    fail_start(node, rc, errbuf);
    return;
  }
  if (node->cfg.metrics_listen[0] && (rc = tc_metrics_start(&node->ctx, &node->metrics, errbuf, sizeof(errbuf))) != 0) {
    fail_start(node, rc, errbuf);
    return;
  }
  node->ctx.serving = true;
  if (tc_log_level >= TC_LOG_DEBUG) {
    uv_timer_init(node->ctx.loop, &node->stats_timer);
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
  node->ctx.loop = loop;
  node->cfg = *cfg;
  node->ctx.cfg = &node->cfg;
  node->ctx.advertise = node->advertise;
  node->ctx.ops = &node_ops;
  node->on_ready = on_ready;
  node->ready_arg = arg;
  if (node->cfg.credentials_file[0]) {
    char why[512];
    node->creds = tc_creds_load(node->cfg.credentials_file, why, sizeof(why));
    if (!node->creds) {
      fail_start(node, TXP_EINVALID_ARG, why);
      return node;
    }
    tc_log_info("loaded %zu credentials of %zu applications from \"%s\"", tc_creds_count(node->creds),
                tc_creds_apps(node->creds), node->cfg.credentials_file);
  }
  node->ctx.lockwait = tc_lockwait_new(loop, MAX_LOCK_WAITERS);
  node->ctx.store = tc_store_new(loop, &node->cfg, on_store_ready, node, STORE_READY_TIMEOUT_MS);
  if (node->ctx.store)
    node->ctx.hold = tc_hold_new(loop, node->ctx.store, (unsigned)node->cfg.begin_hold_ms,
                                 (size_t)node->cfg.queue_max, tc__coord_resume, &node->ctx);
  if (node->ctx.lockwait && node->ctx.hold) node->peer = tc_peer_new(&node->ctx, on_claimed, node);
  if (!node->ctx.lockwait || !node->ctx.store || !node->ctx.hold || !node->peer) {
    /* Allocation failures at start-up: report, the caller exits. */
    fail_start(node, TXP_ENOMEM, "could not start the node: out of memory or bad store URL");
    return node;
  }
  return node;
}

int tc_node_port(const tc_node_t *node) { return node->ctx.server ? tc_server_port(node->ctx.server) : -1; }

static void node_free(void *arg) {
  tc_node_t *node = arg;
  tc_creds_free(node->creds);
  free(node);
}

static void on_stats_timer_closed(uv_handle_t *h) {
  tc_node_t *node = h->data;
  tc_parts_closed(&node->stop);
}

/* The store closes once the hold is done: the begins it answered and
 * held reach PostgreSQL first. */
static void close_store(void *arg) {
  tc_parts_t *stop = arg;
  tc_node_t *node = stop->owner;
  node->ctx.hold = NULL; /* freed: the coordinator's calls still finishing find no hold */
  tc_store_close(node->ctx.store, tc_parts_closed, stop);
}

/* Closes what the node owns; this call is a part itself, open until all
 * the others are started. */
static void after_server_stopped(void *arg) {
  tc_node_t *node = arg;
  tc_parts_t *stop = &node->stop;
  /* No new requests can arrive now: release the rest. */
  if (node->stats_timer_on) {
    node->stats_timer_on = false;
    tc_parts_add(stop);
    uv_close((uv_handle_t *)&node->stats_timer, on_stats_timer_closed);
  }
  if (node->metrics) tc_metrics_close(node->metrics, tc_parts_closed, tc_parts_add(stop));
  if (node->ctx.admin) tc_admin_close(node->ctx.admin, tc_parts_closed, tc_parts_add(stop));
  if (node->ctx.recovery) tc_recovery_close(node->ctx.recovery, tc_parts_closed, tc_parts_add(stop));
  if (node->ctx.lockwait) tc_lockwait_close(node->ctx.lockwait, tc_parts_closed, tc_parts_add(stop));
  if (node->ctx.hold) tc_hold_close(node->ctx.hold, close_store, tc_parts_add(stop));
  else if (node->ctx.store) tc_store_close(node->ctx.store, tc_parts_closed, tc_parts_add(stop));
  if (node->peer) {
    tc_peer_t *p = node->peer;
    node->peer = NULL; /* the ops find no peer from now on */
    tc_peer_close(p, tc_parts_closed, tc_parts_add(stop));
  }
  tc_parts_closed(stop);
}

void tc_node_stop(tc_node_t *node, void (*done)(void *), void *arg) {
  node->ctx.stopping = true;
  /* Begins answered and held go to the store now, while it still takes
   * them: their TMs' later calls may come to another node. */
  tc_hold_flush(node->ctx.hold);

  tc_parts_start(&node->stop, 1, node_free, node, done, arg);
  if (node->ctx.server) tc_server_stop(node->ctx.server, after_server_stopped, node);
  else after_server_stopped(node);
}

int tc_node_reload_secret(tc_node_t *node, char *msg, size_t msglen) {
  if (msglen) msg[0] = '\0';
  if (!node || node->ctx.stopping || !node->peer) return 0;
  return tc_peer_reload_secret(node->peer, msg, msglen);
}

int tc_node_reload_credentials(tc_node_t *node, char *err, size_t errlen) {
  if (!node->cfg.credentials_file[0]) {
    snprintf(err, errlen, "no server.credentials_file configured");
    return 1;
  }
  tc_creds_t *fresh = tc_creds_load(node->cfg.credentials_file, err, errlen);
  if (!fresh) return -1;
  /* The server reads the table only while registering, on this loop: once
   * it has the new one, nothing refers to the old one. */
  if (node->ctx.server) tc_server_set_creds(node->ctx.server, fresh);
  tc_creds_free(node->creds);
  node->creds = fresh;
  snprintf(err, errlen, "%zu credentials of %zu applications", tc_creds_count(fresh), tc_creds_apps(fresh));
  return 0;
}
