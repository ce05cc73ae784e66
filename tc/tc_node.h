/*
 * tc_node.h - one coordinator node: the composition root that starts the
 * store, the server, lock waits, recovery, the admin socket, metrics and
 * the node's part in the cluster, and hands them one shared context
 * (tc_ctx.h).  tcd's main creates one; tests may create several in one
 * process.
 *
 * NOTES
 *   Start-up order: store (pools, first id block) and, at the same time,
 *   the node id claim (tc_peer.h: a second live process with the same id
 *   refuses to start) -> server (listen) -> peer bus and node_table
 *   registration -> recovery (leader election; it adopts every unfinished
 *   session found in the store, which is how a restarted node finishes what
 *   a killed one left) -> admin socket, metrics.  Shutdown runs the
 *   reverse order.
 */
#ifndef TC_NODE_H
#define TC_NODE_H

#include <uv.h>

#include <stddef.h>

#include "tc_config.h"

typedef struct tc_node tc_node_t;

/* Start a node on 'loop' with 'cfg' (copied).  'on_ready' runs once: status
 * 0 when the node serves, or an error (store unreachable, listen failed).
 * Returns NULL only on allocation failure. */
tc_node_t *tc_node_start(uv_loop_t *loop, const tc_config_t *cfg,
                         void (*on_ready)(tc_node_t *, int, const char *, void *), void *arg);
/* Stop serving and release everything; 'done' runs when all is closed. */
void tc_node_stop(tc_node_t *node, void (*done)(void *arg), void *arg);

/* Read the cluster secret file again (SIGHUP: a rotation step).  0 (also
 * without a bus; 'msg' then says what was loaded) or < 0 with 'msg' saying
 * why not: the keys in use stay. */
int tc_node_reload_secret(tc_node_t *node, char *msg, size_t msglen);

/* Load server.credentials_file again and use it for later registrations
 * (SIGHUP).  0 (what was loaded, in 'err'), 1 when no file is configured,
 * or -1 with the reason in 'err': the table in use stays. */
int tc_node_reload_credentials(tc_node_t *node, char *err, size_t errlen);

/* The port actually listened on (useful with port 0). */
int tc_node_port(const tc_node_t *node);

#endif /* TC_NODE_H */
