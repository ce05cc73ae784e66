/*
 * rm_client.c - librmclient's core: configuration, the client's life
 * (rm_client_new, rm_client_free), the background loop thread and what
 * caller threads hand to it, and the small calls of rm_internal.h.  Calls
 * run on the loop thread in rm_call.c, the TM API is in rm_tm.c, requests
 * from a coordinator in rm_serve.c, degrade detection in rm_degrade.c, the
 * helpers every part uses in rm_util.c.
 *
 * NOTES
 *   Threads.  rm_client_new() starts one thread that runs a libuv loop and
 *   owns everything marked "loop thread" in rm_client_t (rm_core.h): the
 *   connections (rm_conn.c, one per configured node), the deadline heap,
 *   the table of requests awaiting an answer (rm_call.c).  Caller threads
 *   never touch those.  They build a call (an rm_call_t holding copies of
 *   its arguments), put it on the submit queue under 'mu', and wake the
 *   loop with uv_async_send (also under 'mu', so that the loop can close
 *   the async handle once it has seen the stop flag without racing a late
 *   sender).  A blocking caller then waits on the call's own condition
 *   variable; an *_async call's callback runs on the loop thread.  A call
 *   is reference counted (the caller's reference and the loop's), so a
 *   blocking caller that gives up (see RM_BLOCKING_GRACE_MS, rm_tm.c)
 *   never frees memory the loop still uses.
 *   Phase two runs the resource manager's phase2 (rm_rm_ops_t) on libuv's
 *   thread pool (uv_queue_work), since it blocks on PostgreSQL.
 *
 *   Bounds: at most RM_MAX_LIVE_CALLS calls between submission and
 *   completion (RM_E_BUSY beyond), which bounds the submit queue, the wait
 *   list and the id table; each connection's write queue is bounded in
 *   rm_conn.c; at most RM_MAX_PHASE2 phase-two jobs run at once
 *   (rm_serve.c).
 *
 *   The library never prints: every line goes through rm__log() to the
 *   caller's callback.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rm_core.h"
#include "txc_failpoint.h"

#define RM_DEFAULT_CONNECT_TIMEOUT_MS 3000u
#define RM_DEFAULT_REQUEST_TIMEOUT_MS 5000u
#define RM_DEFAULT_HEARTBEAT_MS 1000u
#define RM_DEFAULT_LOCK_WAIT_MS 2000u
#define RM_MAX_NODES 64
#define RM_MAX_LIVE_CALLS 16384u
#define RM_HASH_BITS_MIN 6

/* The client whose loop runs on this thread, if any: blocking calls made
 * from a callback would wait for the very thread they block. */
static _Thread_local rm_client_t *tls_loop_client;

bool rm__on_loop_thread(const rm_client_t *c) { return tls_loop_client == c; }

/* ------------------------------------------------------------ helpers */

void rm__log(rm_client_t *c, int level, const char *fmt, ...) {
  va_list ap;
  if (!c || !c->log.cb || level > c->log.level) return;
  va_start(ap, fmt);
  rm__logger_vwrite(&c->log, level, fmt, ap);
  va_end(ap);
}

/* --------------------------------------------------------- submission */

int rm__submit(rm_client_t *c, rm_call_t *k) {
  uv_mutex_lock(&c->mu);
  if (c->stop_requested) {
    uv_mutex_unlock(&c->mu);
    return RM_E_CONN_LOST;
  }
  if (c->live >= RM_MAX_LIVE_CALLS) {
    uv_mutex_unlock(&c->mu);
    return RM_E_BUSY;
  }
  c->live++;
  k->prev = k->next = NULL;
  rm__call_list_push(&c->submitq, k);
  uv_async_send(&c->async); /* under mu: see NOTES */
  uv_mutex_unlock(&c->mu);
  return 0;
}

/* ------------------------------------------------------ the loop thread */

static void on_conn_closed(rm_conn_t *conn, void *arg) {
  (void)conn;
  (void)arg; /* freed by rm_client_free() after the loop ends */
}

/*
 * rm_client_free() asked to stop: complete every call (RM_E_UNKNOWN_OUTCOME
 * when it may have reached a coordinator, else RM_E_CONN_LOST) and close
 * every handle; uv_run() then returns once the last close callback and
 * phase-two job are done.
 */
static void begin_shutdown(rm_client_t *c) {
  if (c->stopping) return;
  c->stopping = true;
  rm__calls_abort(c);
  uv_close((uv_handle_t *)&c->async, NULL);
  uv_close((uv_handle_t *)&c->timer, NULL);
  uv_close((uv_handle_t *)&c->probe_timer, NULL);
  for (int i = 0; i < c->nnodes; i++) rm__conn_close(c->nodes[i].conn, on_conn_closed, c);
}

static void on_async(uv_async_t *h) {
  rm_client_t *c = h->data;
  uv_mutex_lock(&c->mu);
  rm_call_list_t q = c->submitq;
  c->submitq.head = c->submitq.tail = NULL;
  bool stop = c->stop_requested;
  bool resources = c->resources_changed;
  c->resources_changed = false;
  bool degrade = c->dg_changed;
  c->dg_changed = false;
  if (degrade) c->dg = c->dg_req;
  uv_mutex_unlock(&c->mu);
  if (degrade && !stop) {
    c->dg_enabled = true;
    rm__probe_soon(c);
  }
  rm_call_t *k;
  /* Registration first: a call made after rm_resource_add() returned then
   * reaches each coordinator after the new RegisterRM on that connection. */
  if (resources && !stop)
    for (int i = 0; i < c->nnodes; i++) rm__conn_reregister(c->nodes[i].conn);
  while ((k = rm__call_list_pop(&q))) {
    if (stop) rm__call_complete(c, k, RM_E_CONN_LOST);
    else rm__call_start(c, k);
  }
  if (stop) {
    begin_shutdown(c);
    return;
  }
  rm__call_arm_timer(c);
}

static void loop_main(void *arg) {
  rm_client_t *c = arg;
  tls_loop_client = c;
  for (int i = 0; i < c->nnodes; i++) rm__conn_start(c->nodes[i].conn);
  uv_run(&c->loop, UV_RUN_DEFAULT);
  tls_loop_client = NULL;
}

/* ------------------------------------------------------ public: setup */

static void client_free_memory(rm_client_t *c) {
  if (c->nodes)
    for (int i = 0; i < c->nnodes; i++) rm__conn_free(c->nodes[i].conn);
  free(c->nodes);
  txc_heap_free(&c->heap);
  txc_idtable_free(&c->sent_ids);
  free(c->nodes_str);
  free(c->token);
  free(c->app_id);
  free(c->client_id);
  free(c);
}

/* Start the loop thread with asynchronous signals blocked, so that the
 * application's signals are delivered to its own threads and a write to a
 * dead coordinator fails with EPIPE instead of raising SIGPIPE. */
static int start_thread(rm_client_t *c) {
  sigset_t all, old;
  sigfillset(&all);
  static const int sync_signals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGABRT, SIGSYS};
  for (size_t i = 0; i < sizeof(sync_signals) / sizeof(sync_signals[0]); i++)
    sigdelset(&all, sync_signals[i]);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int rc = uv_thread_create(&c->thread, loop_main, c);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  return rc;
}

int rm_client_new(const rm_config_t *cfg, rm_client_t **out) {
  rm_addr_t addrs[RM_MAX_NODES];
  char cid[TXP_MAX_NAME_LEN + 1];
  char fperr[256] = "";
  if (out) *out = NULL;
  if (!cfg || !out) return rm__fail(RM_E_INVALID, "could not create the client: config or out is NULL");
  if (rm__check_str(cfg->token, TXP_MAX_TOKEN_LEN, true) != 0)
    return rm__fail(RM_E_INVALID, "could not create the client: token is NULL, empty or longer than %d bytes",
                    TXP_MAX_TOKEN_LEN);
  if (rm__check_str(cfg->application_id, TXP_MAX_NAME_LEN, true) != 0)
    return rm__fail(RM_E_INVALID,
                    "could not create the client: application_id is NULL, empty or longer than %d bytes",
                    TXP_MAX_NAME_LEN);
  if (rm__check_str(cfg->client_id, TXP_MAX_NAME_LEN, false) != 0 || (cfg->client_id && !cfg->client_id[0]))
    return rm__fail(RM_E_INVALID, "could not create the client: client_id is empty or longer than %d bytes",
                    TXP_MAX_NAME_LEN);
  if (!cfg->nodes) return rm__fail(RM_E_INVALID, "could not create the client: nodes is NULL");
  int nnodes = rm__nodes_parse(cfg->nodes, addrs, RM_MAX_NODES);
  if (nnodes <= 0)
    return rm__fail(RM_E_INVALID,
                    "could not create the client: invalid nodes \"%.200s\" (want \"host:port,host:port\", "
                    "at most %d)", cfg->nodes, RM_MAX_NODES);
  if (cfg->log_level < 0 || cfg->log_level > RM_LOG_DEBUG)
    return rm__fail(RM_E_INVALID, "could not create the client: log_level %d is not an rm_log_level_t",
                    cfg->log_level);
  if (cfg->node_choice != RM_NODE_HOME && cfg->node_choice != RM_NODE_ROUND_ROBIN)
    return rm__fail(RM_E_INVALID, "could not create the client: node_choice %d is not an rm_node_choice_t",
                    cfg->node_choice);

  if (cfg->undo_format != RM_UNDO_COMPACT && cfg->undo_format != RM_UNDO_OBJECTS)
    return rm__fail(RM_E_INVALID, "could not create the client: undo_format %d is not an rm_undo_format_t",
                    cfg->undo_format);

  rm_client_t *c = calloc(1, sizeof(*c));
  if (!c) return rm__fail(RM_E_NOMEM, "could not create the client: out of memory");
  c->cfg = *cfg;
  c->created_ms = rm__mono_ms();
  if (!c->cfg.connect_timeout_ms) c->cfg.connect_timeout_ms = RM_DEFAULT_CONNECT_TIMEOUT_MS;
  if (!c->cfg.request_timeout_ms) c->cfg.request_timeout_ms = RM_DEFAULT_REQUEST_TIMEOUT_MS;
  if (!c->cfg.heartbeat_ms) c->cfg.heartbeat_ms = RM_DEFAULT_HEARTBEAT_MS;
  if (!c->cfg.lock_wait_ms) c->cfg.lock_wait_ms = RM_DEFAULT_LOCK_WAIT_MS;
  if (!c->cfg.log_level) c->cfg.log_level = RM_LOG_WARN;
  if (cfg->client_id) {
    snprintf(cid, sizeof(cid), "%s", cfg->client_id);
  } else {
    char idem[2 * RM_IDEM_BYTES + 1];
    rm__idem_key(idem);
    snprintf(cid, sizeof(cid), "%.90s-%ld-%.8s", cfg->application_id, (long)getpid(), idem);
  }
  c->nodes_str = strdup(cfg->nodes);
  c->token = strdup(cfg->token);
  c->app_id = strdup(cfg->application_id);
  c->client_id = strdup(cid);
  c->nodes = calloc((size_t)nnodes, sizeof(*c->nodes));
  txc_heap_init(&c->heap);
  bool ids_ok = txc_idtable_init(&c->sent_ids, RM_HASH_BITS_MIN) == 0;
  if (!c->nodes_str || !c->token || !c->app_id || !c->client_id || !c->nodes || !ids_ok)
    goto fail_memory;
  c->cfg.nodes = c->nodes_str;
  c->cfg.token = c->token;
  c->cfg.application_id = c->app_id;
  c->cfg.client_id = c->client_id;
  c->nnodes = nnodes;
  /* The home node: FNV-1a of the client id, so that a service's instances
   * (distinct ids) spread over the nodes while each keeps to one. */
  uint32_t h = 2166136261u;
  for (const char *p = c->client_id; *p; p++) h = (h ^ (uint8_t)*p) * 16777619u;
  c->home = h % (unsigned)nnodes;
  c->rng = (uint32_t)uv_hrtime() | 1u;
  atomic_init(&c->nodes_up, 0);
  atomic_init(&c->rm, NULL);
  atomic_init(&c->probe_soon, NULL);
  atomic_init(&c->dg_on, false);
  atomic_init(&c->mode, RM_MODE_GLOBAL);
  atomic_init(&c->forced, RM_MODE_AUTO);
  atomic_init(&c->detected, RM_MODE_GLOBAL);
  atomic_init(&c->fail_streak, 0);
  atomic_init(&c->ok_streak, 0);
  atomic_init(&c->to_local, 0);
  atomic_init(&c->to_global, 0);
  atomic_init(&c->probes, 0);
  atomic_init(&c->probe_failures, 0);

  int rc = RM_E_NOMEM;
  if (rm__logger_init(&c->log, c->cfg.log_cb, c->cfg.log_arg, c->cfg.log_level) != 0) goto fail_memory;
  if (txc_failpoint_arm_env(fperr, sizeof(fperr)) != 0) {
    /* A fault run with a bad spec must not run without its fault; the
     * library never prints: the reason goes to the caller's log. */
    RM_LOG_C(c, RM_LOG_ERROR, "invalid TX_FAILPOINTS: %s", fperr);
    rc = RM_E_INVALID;
    goto fail_logger;
  }
  if (uv_mutex_init(&c->mu) != 0) goto fail_logger;
  if (uv_mutex_init(&c->mode_mu) != 0) goto fail_mutex;
  if (uv_mutex_init(&c->rm_mu) != 0) goto fail_mode_mutex;
  if (uv_loop_init(&c->loop) != 0) goto fail_rm_mutex;
  for (int i = 0; i < nnodes; i++) {
    rm_conn_opts_t o = {0};
    o.loop = &c->loop;
    o.addr = addrs[i].addr;
    o.index = i;
    o.token = c->token;
    o.app_id = c->app_id;
    o.client_id = c->client_id;
    o.next_request_id = &c->next_request_id;
    o.log = &c->log;
    o.cbs = &rm__call_conn_cbs;
    o.arg = c;
    o.connect_timeout_ms = c->cfg.connect_timeout_ms;
    o.heartbeat_ms = c->cfg.heartbeat_ms;
    rc = rm__conn_new(&o, &c->nodes[i].conn);
    if (rc != 0) goto fail_loop;
  }
  if (uv_async_init(&c->loop, &c->async, on_async) != 0) goto fail_loop;
  c->async.data = c;
  uv_timer_init(&c->loop, &c->timer);
  c->timer.data = c;
  uv_timer_init(&c->loop, &c->probe_timer);
  c->probe_timer.data = c;
  if (start_thread(c) != 0) {
    rc = RM_E_NOMEM;
    uv_close((uv_handle_t *)&c->async, NULL);
    uv_close((uv_handle_t *)&c->timer, NULL);
    uv_close((uv_handle_t *)&c->probe_timer, NULL);
    uv_run(&c->loop, UV_RUN_DEFAULT);
    goto fail_loop;
  }
  RM_LOG_C(c, RM_LOG_INFO, "client \"%s\" of application \"%s\" started with %d coordinator node%s",
      c->client_id, c->app_id, nnodes, nnodes == 1 ? "" : "s");
  *out = c;
  return 0;

fail_loop:
  uv_loop_close(&c->loop);
fail_rm_mutex:
  uv_mutex_destroy(&c->rm_mu);
fail_mode_mutex:
  uv_mutex_destroy(&c->mode_mu);
fail_mutex:
  uv_mutex_destroy(&c->mu);
fail_logger:
  rm__logger_destroy(&c->log);
  client_free_memory(c);
  if (fperr[0]) return rm__fail(rc, "could not create the client: invalid TX_FAILPOINTS: %s", fperr);
  return rm__fail(rc, "could not create the client: %s", rm_strerror(rc));
fail_memory:
  client_free_memory(c);
  return rm__fail(RM_E_NOMEM, "could not create the client: out of memory");
}

void rm_client_free(rm_client_t *c) {
  if (!c) return;
  if (tls_loop_client == c) {
    RM_LOG_C(c, RM_LOG_ERROR, "rm_client_free() called from a library callback: ignored");
    return;
  }
  uv_mutex_lock(&c->mu);
  c->stop_requested = true;
  uv_async_send(&c->async);
  uv_mutex_unlock(&c->mu);
  uv_thread_join(&c->thread);
  if (uv_loop_close(&c->loop) != 0) {
    /* A handle is still open (a bug): freeing its memory would be worse. */
    RM_LOG_C(c, RM_LOG_ERROR, "could not close the event loop: handles still open; leaking the client");
    return;
  }
  /* The AT layer may still log or call in (it gets RM_E_CONN_LOST now). */
  void *rm = atomic_load(&c->rm);
  if (rm) c->rm_ops->free(rm);
  atomic_store(&c->rm, NULL);
  uv_mutex_destroy(&c->rm_mu);
  RM_LOG_C(c, RM_LOG_INFO, "client \"%s\" stopped", c->client_id);
  uv_mutex_destroy(&c->mode_mu);
  uv_mutex_destroy(&c->mu);
  rm__logger_destroy(&c->log);
  client_free_memory(c);
}

int rm_client_nodes_up(rm_client_t *c) { return c ? atomic_load(&c->nodes_up) : 0; }

/* ------------------------------------------ internal: for the AT layer */

unsigned rm__lock_wait_ms(const rm_client_t *c) { return c ? c->cfg.lock_wait_ms : RM_DEFAULT_LOCK_WAIT_MS; }

bool rm__unnamed_statements(const rm_client_t *c) { return c && c->cfg.unnamed_statements; }
bool rm__undo_compact(const rm_client_t *c) { return !c || c->cfg.undo_format == RM_UNDO_COMPACT; }

void rm__resources_changed(rm_client_t *c) {
  if (!c) return;
  uv_mutex_lock(&c->mu);
  if (!c->stop_requested) {
    c->resources_changed = true;
    uv_async_send(&c->async);
  }
  uv_mutex_unlock(&c->mu);
}
