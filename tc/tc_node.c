/*
 * tc_node.c - start and stop one coordinator node; see tc_node.h.
 */
#include "tc_node.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tc_lockwait.h"
#include "tc_log.h"
#include "tc_recovery.h"
#include "tc_server.h"

#define MAX_LOCK_WAITERS 100000
#define STORE_READY_TIMEOUT_MS 30000

void tc__lockwait_release(tc_node_t *node, const char *xid) {
  if (node->lockwait) tc_lockwait_release(node->lockwait, xid);
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
  node->recovery = tc_recovery_new(node);
  if (!node->recovery) {
    fail_start(node, TXP_ENOMEM, "could not start the recovery jobs: out of memory");
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
  if (!node->lockwait || !node->store) {
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
  stop_part(node);
}

void tc_node_stop(tc_node_t *node, void (*done)(void *), void *arg) {
  node->stopping = true;

  node->stop_done = done;
  node->stop_arg = arg;
  if (node->server) tc_server_stop(node->server, after_server_stopped, node);
  else after_server_stopped(node);
}
