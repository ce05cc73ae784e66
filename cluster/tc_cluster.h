/*
 * tc_cluster.h - membership of one tcd node in the cluster: it owns its node
 * id, keeps its node_table row and heartbeat current, and learns its peers'
 * bus addresses.  The SQL side is sql/tc/003_cluster.sql.
 *
 * NOTES
 *   Life of a membership:
 *     1. CLAIM   on the dedicated session: tc_node_claim(node_id) takes the
 *                session-level advisory lock of the id.  Refused -> retried
 *                every CLAIM_RETRY_MS for claim_wait_ms (a killed
 *                predecessor's session may still be closing), then
 *                on_claimed(error naming the holder): a second live process
 *                with the same id does not start.
 *     2. REGISTER (tc_cluster_register, once the node listens)
 *                tc_node_register writes the row (address, admin socket, bus
 *                address, pid, version).
 *     3. BEAT    every heartbeat_ms tc_node_heartbeat updates heartbeat_at
 *                and is_leader, and returns the live peers with a bus
 *                address (on_peer for each).
 *   The lock lives as long as the session.  When the session is lost
 *   (tc_cluster_session_down: e.g. PostgreSQL restarted) the claim is gone
 *   with it; when it is back (tc_cluster_session_up) the node claims again
 *   and re-registers.  If by then another process holds the id, on_lost
 *   runs: the caller must stop, since two processes would share one id.
 *
 *   tc_cluster_healthy() is what leadership depends on: claimed, registered
 *   and a heartbeat written within half the lease.  A node that cannot
 *   write heartbeats does not lead (and a leader that stops writing them is
 *   fenced by the others, see tc_leader_try in 003_cluster.sql).
 *
 *   The module does not own a database connection: the caller provides the
 *   dedicated session as a function (tcd: a one-connection tc_pg pool) and
 *   reports its state changes, so this library depends on libpq only for
 *   reading results.  It never logs; messages go to the 'log' callback.
 *
 *   Thread: the loop thread only.
 */
#ifndef TC_CLUSTER_H
#define TC_CLUSTER_H

#include <libpq-fe.h>
#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

typedef struct tc_cluster tc_cluster_t;

/* Result of one statement: status 0 and 'res' (borrowed, valid during the
 * call), or status < 0 with 'err' saying why (res NULL). */
typedef void (*tc_cluster_sql_cb)(int status, const PGresult *res, const char *err, void *arg);
/* Run 'sql' with text parameters on the dedicated session.  Returns 0 (cb
 * runs exactly once, later) or < 0 (cb never runs). */
typedef int (*tc_cluster_sql_fn)(void *ctx, const char *sql, int nparams, const char *const *values,
                                 tc_cluster_sql_cb cb, void *arg);

typedef struct tc_cluster_opts {
  int node_id;
  const char *version;     /* copied */
  unsigned heartbeat_ms;   /* default 1000 */
  unsigned lease_ms;       /* default 5000 */
  unsigned claim_wait_ms;  /* default 3000 */
  tc_cluster_sql_fn sql;
  void *sql_ctx;
  /* Once, after the first claim: status 0, or < 0 with 'err' (id in use). */
  void (*on_claimed)(int status, const char *err, void *arg);
  /* The id was taken by another process while our session was away. */
  void (*on_lost)(const char *err, void *arg);
  /* A live peer with a bus address (from every heartbeat); may be NULL. */
  void (*on_peer)(int node_id, const char *bus_address, void *arg);
  /* After each heartbeat written: the node ids of every live peer with a
   * bus address ('ids' borrowed, 'n' of them); may be NULL.  What the bus
   * takes as the current members. */
  void (*on_members)(const int *ids, size_t n, void *arg);
  /* Whether this node leads now (written with the heartbeat); may be NULL. */
  bool (*is_leader)(void *arg);
  /* Log lines (level: 0 error, 1 warn, 2 info, 3 debug); may be NULL. */
  void (*log)(int level, const char *msg, void *arg);
  void *arg;
} tc_cluster_opts_t;

typedef struct tc_cluster_stats {
  uint64_t claims, heartbeats, heartbeat_failures, reclaims;
} tc_cluster_stats_t;

/* Create; nothing happens until tc_cluster_session_up().  NULL on
 * allocation failure. */
tc_cluster_t *tc_cluster_new(uv_loop_t *loop, const tc_cluster_opts_t *opts);
/* The timers are closed; 'done' runs after (statements in flight are
 * awaited: their callbacks must still come). */
void tc_cluster_close(tc_cluster_t *cl, void (*done)(void *arg), void *arg);

/* The dedicated session became usable / was lost. */
void tc_cluster_session_up(tc_cluster_t *cl);
void tc_cluster_session_down(tc_cluster_t *cl);

/* Write the node's row (after on_claimed(0)) and start heartbeats.
 * Strings are copied; 'admin_socket'/'bus_address' may be empty. */
void tc_cluster_register(tc_cluster_t *cl, const char *address, const char *admin_socket,
                         const char *bus_address);

/* Write the next heartbeat (and read the peers again) at the next tick
 * rather than after heartbeat_ms: at most one per tick (100 ms).  For the
 * bus, when a message signed with the secret comes from a node id that is
 * not (yet) a member: a node that just started. */
void tc_cluster_beat_soon(tc_cluster_t *cl);

bool tc_cluster_healthy(const tc_cluster_t *cl);
/* Milliseconds since the last heartbeat was written (UINT64_MAX if never). */
uint64_t tc_cluster_heartbeat_age_ms(const tc_cluster_t *cl);
void tc_cluster_get_stats(const tc_cluster_t *cl, tc_cluster_stats_t *out);

#endif /* TC_CLUSTER_H */
