/*
 * tc_cluster.c - membership of one node; see tc_cluster.h.
 *
 * NOTES
 *   One statement at a time on the dedicated session ('busy'), driven by
 *   step(): from a 100 ms tick, after every answer, and when the session
 *   comes back.  step() does the first thing missing, in this order:
 *   claim the id, write the row, beat.
 */
#include "tc_cluster.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define TICK_MS 100
#define CLAIM_RETRY_MS 250

struct tc_cluster {
  uv_loop_t *loop;
  tc_cluster_opts_t o;
  char version[64];
  uv_timer_t timer;

  bool session_up;
  bool claimed;          /* the current session holds the id's lock */
  bool ever_claimed;     /* on_claimed(0) ran */
  bool failed;           /* on_claimed(error) or on_lost ran: do nothing more */
  uint64_t refused_since_ms; /* first refusal of the current claim round, 0 = none */
  uint64_t next_claim_ms;

  bool want_register;
  bool registered;       /* the row was written by the current session */
  char address[256], admin_socket[256], bus_address[256];

  bool busy;
  uint64_t last_beat_sent_ms;
  bool beat_soon; /* tc_cluster_beat_soon: the next tick beats */
  uint64_t last_beat_ok_ms; /* 0 = never */

  bool closing;
  int inflight;
  void (*done)(void *);
  void *done_arg;
  tc_cluster_stats_t stats;
};

static void step(tc_cluster_t *cl);

static void logf_(tc_cluster_t *cl, int level, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void logf_(tc_cluster_t *cl, int level, const char *fmt, ...) {
  if (!cl->o.log) return;
  char msg[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  cl->o.log(level, msg, cl->o.arg);
}

static void maybe_done(tc_cluster_t *cl) {
  if (!cl->closing || cl->inflight > 0 || cl->done == NULL) return;
  void (*done)(void *) = cl->done;
  void *arg = cl->done_arg;
  cl->done = NULL;
  free(cl);
  done(arg);
}

/* Accounting common to every answer; true when the object is closing (and
 * may have been freed: the caller must return at once). */
static bool answer_begin(tc_cluster_t *cl) {
  cl->busy = false;
  cl->inflight--;
  if (cl->closing) {
    maybe_done(cl);
    return true;
  }
  return false;
}

static int run(tc_cluster_t *cl, const char *sql, int n, const char *const *v, tc_cluster_sql_cb cb) {
  int rc = cl->o.sql(cl->o.sql_ctx, sql, n, v, cb, cl);
  if (rc == 0) {
    cl->busy = true;
    cl->inflight++;
  }
  return rc;
}

/* ----------------------------------------------------------------- claim */

static void claim_refused(tc_cluster_t *cl, const PGresult *r) {
  uint64_t now = uv_now(cl->loop);
  if (!cl->refused_since_ms) cl->refused_since_ms = now;
  if (now - cl->refused_since_ms < cl->o.claim_wait_ms) {
    cl->next_claim_ms = now + CLAIM_RETRY_MS;
    return;
  }
  char who[512];
  if (r && PQntuples(r) == 1 && !PQgetisnull(r, 0, 3)) {
    double age = PQgetisnull(r, 0, 4) ? -1 : atof(PQgetvalue(r, 0, 4)) / 1000.0;
    snprintf(who, sizeof(who), "pid %s at %s, last heartbeat %.1f s ago, database session %s",
             PQgetvalue(r, 0, 3), PQgetvalue(r, 0, 2), age,
             PQgetisnull(r, 0, 1) ? "unknown" : PQgetvalue(r, 0, 1));
  } else if (r && PQntuples(r) == 1 && !PQgetisnull(r, 0, 1)) {
    snprintf(who, sizeof(who), "a process that has not registered yet, database session %s",
             PQgetvalue(r, 0, 1));
  } else {
    snprintf(who, sizeof(who), "another session");
  }
  char err[768];
  snprintf(err, sizeof(err),
           "node id %d is already in use by another live tcd (%s): give every node its own node.id, "
           "or stop the other process first",
           cl->o.node_id, who);
  cl->failed = true;
  if (!cl->ever_claimed) {
    if (cl->o.on_claimed) cl->o.on_claimed(-1, err, cl->o.arg);
  } else if (cl->o.on_lost) {
    cl->o.on_lost(err, cl->o.arg);
  }
}

static void on_claim(int status, const PGresult *r, const char *err, void *arg) {
  tc_cluster_t *cl = arg;
  if (answer_begin(cl)) return;
  if (status != 0) {
    logf_(cl, 1, "could not claim node id %d: %s; retrying", cl->o.node_id, err ? err : "store error");
    cl->next_claim_ms = uv_now(cl->loop) + CLAIM_RETRY_MS;
    return;
  }
  bool got = PQntuples(r) == 1 && PQgetvalue(r, 0, 0)[0] == 't';
  if (!got) {
    claim_refused(cl, r);
    return;
  }
  cl->claimed = true;
  cl->refused_since_ms = 0;
  cl->stats.claims++;
  cl->registered = false;
  if (!cl->ever_claimed) {
    cl->ever_claimed = true;
    logf_(cl, 3, "claimed node id %d", cl->o.node_id);
    if (cl->o.on_claimed) cl->o.on_claimed(0, NULL, cl->o.arg);
    return; /* the callback may have closed us; the next tick goes on */
  }
  cl->stats.reclaims++;
  logf_(cl, 2, "claimed node id %d again after the store session came back", cl->o.node_id);
  step(cl);
}

static void send_claim(tc_cluster_t *cl) {
  char node[16];
  snprintf(node, sizeof(node), "%d", cl->o.node_id);
  const char *v[] = {node};
  run(cl,
      "SELECT claimed, holder_backend_pid, holder_address, holder_pid, holder_heartbeat_age_ms "
      "FROM tc_node_claim($1::integer)",
      1, v, on_claim);
}

/* -------------------------------------------------------------- register */

static void on_register(int status, const PGresult *r, const char *err, void *arg) {
  tc_cluster_t *cl = arg;
  if (answer_begin(cl)) return;
  if (status != 0) {
    /* Most likely the claim is gone with a lost session: claim again. */
    logf_(cl, 1, "could not register node %d in node_table: %s", cl->o.node_id, err ? err : "store error");
    cl->claimed = false;
    cl->next_claim_ms = uv_now(cl->loop) + CLAIM_RETRY_MS;
    return;
  }
  cl->registered = true;
  cl->last_beat_ok_ms = cl->last_beat_sent_ms = uv_now(cl->loop);
  step(cl);
}

static void send_register(tc_cluster_t *cl) {
  char node[16], pid[16];
  snprintf(node, sizeof(node), "%d", cl->o.node_id);
  snprintf(pid, sizeof(pid), "%d", (int)getpid());
  const char *v[] = {node, cl->address, cl->admin_socket, cl->bus_address, pid, cl->version};
  run(cl, "SELECT tc_node_register($1::integer, $2, $3, $4, $5::integer, $6)", 6, v, on_register);
}

void tc_cluster_register(tc_cluster_t *cl, const char *address, const char *admin_socket,
                         const char *bus_address) {
  snprintf(cl->address, sizeof(cl->address), "%s", address ? address : "");
  snprintf(cl->admin_socket, sizeof(cl->admin_socket), "%s", admin_socket ? admin_socket : "");
  snprintf(cl->bus_address, sizeof(cl->bus_address), "%s", bus_address ? bus_address : "");
  cl->want_register = true;
  cl->registered = false;
  step(cl);
}

/* ------------------------------------------------------------- heartbeat */

static void on_beat(int status, const PGresult *r, const char *err, void *arg) {
  tc_cluster_t *cl = arg;
  if (answer_begin(cl)) return;
  if (status != 0) {
    cl->stats.heartbeat_failures++;
    logf_(cl, 1, "could not write the heartbeat of node %d: %s", cl->o.node_id, err ? err : "store error");
    /* Either the session is going (session_down follows) or the claim is
     * gone: claim again (harmless when we still hold it). */
    cl->claimed = false;
    cl->registered = false;
    cl->next_claim_ms = uv_now(cl->loop) + CLAIM_RETRY_MS;
    return;
  }
  cl->stats.heartbeats++;
  cl->last_beat_ok_ms = uv_now(cl->loop);
  int ids[1024];
  size_t n = 0;
  for (int i = 0; i < PQntuples(r) && !cl->closing; i++) {
    if (PQgetisnull(r, i, 1)) continue;
    int id = atoi(PQgetvalue(r, i, 0));
    if (n < sizeof(ids) / sizeof(ids[0])) ids[n++] = id;
    if (cl->o.on_peer) cl->o.on_peer(id, PQgetvalue(r, i, 1), cl->o.arg);
  }
  if (cl->o.on_members && !cl->closing) cl->o.on_members(ids, n, cl->o.arg);
}

static void send_beat(tc_cluster_t *cl) {
  char node[16];
  snprintf(node, sizeof(node), "%d", cl->o.node_id);
  bool leader = cl->o.is_leader ? cl->o.is_leader(cl->o.arg) : false;
  const char *v[] = {node, leader ? "true" : "false"};
  cl->last_beat_sent_ms = uv_now(cl->loop);
  run(cl, "SELECT node_id, bus_address FROM tc_node_heartbeat($1::integer, $2::boolean)", 2, v, on_beat);
}

/* ------------------------------------------------------------------ step */

static void step(tc_cluster_t *cl) {
  if (cl->closing || cl->failed || cl->busy || !cl->session_up) return;
  uint64_t now = uv_now(cl->loop);
  if (!cl->claimed) {
    if (now >= cl->next_claim_ms) send_claim(cl);
  } else if (cl->want_register && !cl->registered) {
    send_register(cl);
  } else if (cl->registered && (now - cl->last_beat_sent_ms >= cl->o.heartbeat_ms ||
                                 (cl->beat_soon && now - cl->last_beat_sent_ms >= TICK_MS))) {
    cl->beat_soon = false;
    send_beat(cl);
  }
}

void tc_cluster_beat_soon(tc_cluster_t *cl) {
  if (cl && !cl->closing) cl->beat_soon = true;
}

static void on_tick(uv_timer_t *t) { step(t->data); }

/* ------------------------------------------------------------- lifecycle */

tc_cluster_t *tc_cluster_new(uv_loop_t *loop, const tc_cluster_opts_t *opts) {
  tc_cluster_t *cl = calloc(1, sizeof(*cl));
  if (!cl) return NULL;
  cl->loop = loop;
  cl->o = *opts;
  if (!cl->o.heartbeat_ms) cl->o.heartbeat_ms = 1000;
  if (!cl->o.lease_ms) cl->o.lease_ms = 5000;
  if (!cl->o.claim_wait_ms) cl->o.claim_wait_ms = 3000;
  snprintf(cl->version, sizeof(cl->version), "%s", opts->version ? opts->version : "");
  cl->o.version = cl->version;
  uv_timer_init(loop, &cl->timer);
  cl->timer.data = cl;
  uv_timer_start(&cl->timer, on_tick, TICK_MS, TICK_MS);
  return cl;
}

static void on_timer_closed(uv_handle_t *h) {
  tc_cluster_t *cl = h->data;
  cl->inflight--; /* the timer counted as one */
  maybe_done(cl);
}

void tc_cluster_close(tc_cluster_t *cl, void (*done)(void *), void *arg) {
  cl->closing = true;
  cl->done = done;
  cl->done_arg = arg;
  cl->inflight++;
  uv_close((uv_handle_t *)&cl->timer, on_timer_closed);
}

void tc_cluster_session_up(tc_cluster_t *cl) {
  cl->session_up = true;
  step(cl);
}

void tc_cluster_session_down(tc_cluster_t *cl) {
  cl->session_up = false;
  if (cl->claimed)
    logf_(cl, 1, "lost the store session that holds node id %d; claiming it again when it is back",
          cl->o.node_id);
  cl->claimed = false;
  cl->registered = false;
  cl->next_claim_ms = 0;
}

bool tc_cluster_healthy(const tc_cluster_t *cl) {
  if (!cl || cl->failed || !cl->claimed || !cl->registered || !cl->last_beat_ok_ms) return false;
  return uv_now(cl->loop) - cl->last_beat_ok_ms < cl->o.lease_ms / 2;
}

uint64_t tc_cluster_heartbeat_age_ms(const tc_cluster_t *cl) {
  if (!cl || !cl->last_beat_ok_ms) return UINT64_MAX;
  return uv_now(cl->loop) - cl->last_beat_ok_ms;
}

void tc_cluster_get_stats(const tc_cluster_t *cl, tc_cluster_stats_t *out) {
  if (!cl) {
    memset(out, 0, sizeof(*out));
    return;
  }
  *out = cl->stats;
}
