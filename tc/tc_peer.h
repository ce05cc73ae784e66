/*
 * tc_peer.h - a node's part in the cluster (cluster/): the claim of its
 * node id with heartbeats, and the peer bus that carries lock releases and
 * relays phase-two calls to a node that has the RM (tc_peer.c).  The node
 * starts it, and its tc_ctx_ops_t (release_locks, forward, may_lead) use
 * it.  Loop thread only.
 */
#ifndef TC_PEER_H
#define TC_PEER_H

#include <stdbool.h>
#include <stddef.h>

#include "tc_ctx.h"

typedef struct tc_peer tc_peer_t;

/* Start the membership (its connection, then the claim of the node id
 * from ctx->cfg); 'on_claimed' runs once with the claim's outcome (0, or a
 * code and a message: another live process has the id).  NULL on
 * allocation failure. */
tc_peer_t *tc_peer_new(tc_ctx_t *ctx, void (*on_claimed)(int status, const char *err, void *arg), void *arg);
/* Once the node listens (ctx->advertise known): the bus, if cluster.bus
 * is set.  0, or TXP_EINVALID_ARG with 'err' saying why. */
int tc_peer_bus_start(tc_peer_t *p, char *err, size_t errlen);
/* Write this node's addresses into node_table (heartbeats carry them). */
void tc_peer_register(tc_peer_t *p);
/* Read cluster.secret_file again (a rotation step, on SIGHUP): 0 and the
 * bus signs with its first key from now on, or TXP_EINVALID_ARG with 'err'
 * saying why (the old keys stay).  0 without a bus. */
int tc_peer_reload_secret(tc_peer_t *p, char *err, size_t errlen);
/* Whether a bus runs. */
bool tc_peer_bus_on(const tc_peer_t *p);
/* Locks of 'xid' were released here: tell the other nodes' waiters. */
void tc_peer_released(tc_peer_t *p, const char *xid);
/* tc_ctx_ops_t.forward through the bus. */
int tc_peer_forward(tc_peer_t *p, const txp_msg_t *req, const char *client_id, unsigned timeout_ms,
                    void (*cb)(int status, const txp_msg_t *res, void *arg), void *arg);
/* tc_ctx_ops_t.may_lead: the membership is claimed and healthy. */
bool tc_peer_may_lead(const tc_peer_t *p);
/* Close the bus, the membership and its connection (the node id is given
 * back), then free; 'done' runs when all is closed. */
void tc_peer_close(tc_peer_t *p, void (*done)(void *arg), void *arg);

#endif /* TC_PEER_H */
