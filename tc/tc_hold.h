/*
 * tc_hold.h - GlobalBegins answered before they are stored: a begin rides
 * the batch of its global's first registration on this node.
 *
 * NOTES
 *   A new begin changes nothing a client could lose: its xid is new and no
 *   branch is under it yet.  So the node answers it at once, with an id
 *   from its block, and holds the begin here for store.begin_hold_ms.  The global's first BranchRegister on
 *   this node within that time carries the begin into its own store
 *   transaction (tc_op_t begin_txid: the begin's row goes in first, in the
 *   same transaction), so the global costs one batch and one round trip
 *   less on the client's path, and one PostgreSQL transaction less in all.
 *   A begin that no registration takes in time is stored alone (the
 *   relaxed lane, as before).
 *
 *   Until its begin is stored, every other request about the xid on this
 *   node waits here (parked) and runs, in arrival order, once it is: a
 *   commit, rollback, status or report that comes first stores the begin
 *   at once; a second registration waits for the first one's batch.  So
 *   nothing on this node ever sees the global missing.
 *
 *   What changes for others:
 *     - Clients send an xid's calls to the node that made it (the xid
 *       names it).  Another node gets them when the client cannot reach
 *       that one: a registration, decision or status there that finds no
 *       global of an xid another node made runs once more, after
 *       store.begin_hold_ms and a margin (tc_hold_retry_later), by when
 *       a live maker has stored the begin.  So the cluster's nodes should
 *       share one store.begin_hold_ms.  An operator's command may find
 *       such an xid "not found" for that long.
 *     - A tcd crash (not only a PostgreSQL one, as with relaxed begins)
 *       can lose a begin it answered.  That is harmless for the same
 *       reason: no branch can register under a lost xid, so no resource
 *       changed, and the TM's commit finds nothing ("not found").
 *   store.begin_hold_ms = 0 turns the hold off: begins are stored before
 *   they are answered.
 *
 *   Idempotency keys.  A begin with a key may be a resend, which must get
 *   the xid of the first send: that one may be held here (found by its
 *   key: tc_hold_keyed) or stored.  So only a begin that says it is the
 *   first send of its key (txp FIRST_SEND, which librmclient sets until a
 *   send may have reached a coordinator) is held; any other keyed begin
 *   not held here goes to the store first, as before.  The held begin is
 *   stored with its key: if a resend meanwhile began the global on
 *   another node, the held one finds that key taken and is never stored,
 *   and its xid, which the client never got, stays unknown.
 *
 *   Bounds: at most store.queue_max begins held; past it a begin is stored
 *   before its answer, as with the hold off.  Parked requests are bounded
 *   by the connections' in-flight limits.
 *
 *   Thread: the loop thread only.
 */
#ifndef TC_HOLD_H
#define TC_HOLD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "tc_store.h"

struct tc_req;
typedef struct tc_hold tc_hold_t;

/* What a held begin's row needs (copied). */
typedef struct tc_held_begin {
  const char *xid;
  int64_t txid;
  uint32_t timeout_ms;
  const char *name;   /* may be NULL */
  const char *app_id; /* the TM's */
  const char *group;
  const char *idem_key; /* may be NULL */
} tc_held_begin_t;

/* Parked requests go back to 'resume' (the coordinator's dispatch) once
 * their begin is stored or lost.  'hold_ms' 0: nothing is ever held.
 * NULL when out of memory. */
tc_hold_t *tc_hold_new(uv_loop_t *loop, tc_store_t *store, unsigned hold_ms, size_t max,
                       void (*resume)(struct tc_req *req, void *arg), void *arg);

/* Hold a begin that is answered now: 0, or -1 (the hold is off, full,
 * closing or out of memory: store the begin before answering it). */
int tc_hold_begin(tc_hold_t *h, const tc_held_begin_t *b);

/* The xid of the begin held with idempotency key 'idem_key' of
 * application 'app_id' (and its timeout in *timeout_ms), or NULL.  Valid
 * until control returns to the loop. */
const char *tc_hold_keyed(const tc_hold_t *h, const char *app_id, const char *idem_key, uint32_t *timeout_ms);

/* Whether 'req' must wait for its xid's begin: true when the hold took it
 * (it comes back through 'resume').  A BranchRegister of a begin still
 * held is not parked: it takes the begin along (tc_hold_fold). */
bool tc_hold_park(tc_hold_t *h, struct tc_req *req);

/* Let registration 'op' (of op->xid) carry its global's held begin: true
 * when it does (op's begin fields set, begin_folded).  Until
 * tc_hold_unfold, other requests about the xid wait. */
bool tc_hold_fold(tc_hold_t *h, tc_op_t *op);

/* The folded op's batch is over ('ran': it reached the store, whatever
 * the result; its begin fields are cleared) or it never ran (the store
 * refused it: the begin is held again). */
void tc_hold_unfold(tc_hold_t *h, tc_op_t *op, bool ran);

/* 'req' found no global of an xid that another node made: that node may
 * hold its begin.  Run it once more after store.begin_hold_ms and a
 * margin: true when the hold took it (it comes back through 'resume');
 * false when it ran twice already, or the hold is off, full or closing
 * (answer it as it is). */
bool tc_hold_retry_later(tc_hold_t *h, struct tc_req *req);

/* Store every held begin now (the node is stopping). */
void tc_hold_flush(tc_hold_t *h);

/* Held begins, parked requests, requests waiting to run again (gauges),
 * and begins that rode a registration / were stored alone (counters). */
typedef struct tc_hold_stats {
  size_t held, parked, retrying;
  uint64_t folded, stored_alone;
} tc_hold_stats_t;
void tc_hold_get_stats(const tc_hold_t *h, tc_hold_stats_t *out);

/* Flush what is held and free the hold once its begins are stored;
 * 'done(arg)' then runs once.  Parked requests are resumed first. */
void tc_hold_close(tc_hold_t *h, void (*done)(void *), void *arg);

#endif /* TC_HOLD_H */
