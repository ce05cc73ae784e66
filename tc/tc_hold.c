/*
 * tc_hold.c - see tc_hold.h.
 *
 * NOTES
 *   An entry is in one of three states:
 *     HELD     answered, not in the store, on the timer's list (oldest
 *              first); a registration may fold it, anything else stores
 *              it at once (STORING);
 *     FOLDED   riding a registration's batch (tc_hold_unfold ends it);
 *     STORING  its own begin op is in the store (on_stored ends it).
 *   The entry leaves the table when its begin reached the store (stored
 *   or failed), and only then are its parked requests resumed, in their
 *   order of arrival: they find the global in the store, or "not found"
 *   when the begin was lost.
 *   Entries are found by a 64-bit hash of the xid (txc_fnv.h) in the
 *   project's id table, and then compared in full; keyed ones also by a
 *   hash of (application, key), in a second table.
 */
#include "tc_hold.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tc_server.h"
#include "txc_fnv.h"
#include "txc_idtable.h"
#include "txp_msg.h"

#define TC_HOLD_MAX 8192 /* begins held at once (an entry is about 1.5 KB) */
#define RETRY_MARGIN_MS 100 /* past the hold: the maker's batch that stores the begin */

typedef enum { HELD, FOLDED, STORING } state_t;

typedef struct parked {
  tc_req_t *req;
  uint64_t due_ms; /* retries only: when it runs again */
  struct parked *next;
} parked_t;

typedef struct held {
  txc_idnode_t node; /* id: hash of the xid */
  txc_idnode_t key_node; /* id: hash of (app_id, idem_key); in 'keys' when has_key */
  tc_hold_t *h;
  state_t state;
  uint64_t due_ms;           /* HELD: when the timer stores it */
  struct held *prev, *next;  /* HELD: the timer's list */
  parked_t *parked, *parked_tail;
  tc_op_t op;                /* STORING: the begin stored alone */
  int64_t txid;
  uint32_t timeout_ms;
  bool has_name, has_key;
  char idem_key[TXP_MAX_IDEM_LEN + 1];
  char xid[TXP_MAX_XID_LEN + 1];
  char name[TXP_MAX_NAME_LEN + 1];
  char app_id[TXP_MAX_NAME_LEN + 1];
  char group[TXP_MAX_NAME_LEN + 1];
} held_t;

struct tc_hold {
  uv_loop_t *loop;
  tc_store_t *store;
  unsigned hold_ms;
  size_t max;
  void (*resume)(tc_req_t *req, void *arg);
  void *arg;
  txc_idtable_t table;
  txc_idtable_t keys;
  held_t *oldest, *newest; /* HELD entries, by due time */
  uv_timer_t timer;
  parked_t *retries, *retries_tail; /* tc_hold_retry_later, by due time */
  size_t nretries;
  uv_timer_t retry_timer;
  size_t parked;
  uint64_t folded, stored_alone;
  bool closing;
  int timers_open;
  void (*done)(void *);
  void *done_arg;
};

static uint64_t xid_hash(const char *xid) { return txc_fnv1a_str(TXC_FNV_OFFSET, xid); }

/* (app_id, idem_key), with the NUL between them hashed too. */
static uint64_t key_hash(const char *app_id, const char *idem_key) {
  return txc_fnv1a_str(txc_fnv1a(TXC_FNV_OFFSET, app_id, strlen(app_id) + 1), idem_key);
}

static held_t *find(const tc_hold_t *h, const char *xid) {
  if (!h || !xid || !xid[0] || !txc_idtable_count(&h->table)) return NULL;
  uint64_t id = xid_hash(xid);
  /* find() returns the first node with the id: walk its chain for the
   * others with the same hash. */
  for (txc_idnode_t *n = txc_idtable_find(&h->table, id); n; n = n->next) {
    if (n->id != id) continue;
    held_t *e = TXC_IDTABLE_ELEM(n, held_t, node);
    if (strcmp(e->xid, xid) == 0) return e;
  }
  return NULL;
}

const char *tc_hold_keyed(const tc_hold_t *h, const char *app_id, const char *idem_key, uint32_t *timeout_ms) {
  if (!h || !idem_key || !idem_key[0] || !txc_idtable_count(&h->keys)) return NULL;
  if (!app_id) app_id = "";
  uint64_t id = key_hash(app_id, idem_key);
  for (txc_idnode_t *n = txc_idtable_find(&h->keys, id); n; n = n->next) {
    if (n->id != id) continue;
    held_t *e = TXC_IDTABLE_ELEM(n, held_t, key_node);
    if (strcmp(e->idem_key, idem_key) == 0 && strcmp(e->app_id, app_id) == 0) {
      *timeout_ms = e->timeout_ms;
      return e->xid;
    }
  }
  return NULL;
}

static void list_remove(tc_hold_t *h, held_t *e) {
  if (e->prev) e->prev->next = e->next;
  else h->oldest = e->next;
  if (e->next) e->next->prev = e->prev;
  else h->newest = e->prev;
  e->prev = e->next = NULL;
}

static void list_append(tc_hold_t *h, held_t *e) {
  e->prev = h->newest;
  e->next = NULL;
  if (h->newest) h->newest->next = e;
  else h->oldest = e;
  h->newest = e;
}

static void maybe_release(tc_hold_t *h) {
  if (!h->closing || h->timers_open || txc_idtable_count(&h->table)) return;
  void (*done)(void *) = h->done;
  void *arg = h->done_arg;
  txc_idtable_free(&h->table);
  txc_idtable_free(&h->keys);
  free(h);
  if (done) done(arg);
}

/* The begin reached the store (or never will): the entry goes, and its
 * parked requests run again, in order. */
static void finish(tc_hold_t *h, held_t *e) {
  if (e->state == HELD) list_remove(h, e);
  txc_idtable_remove(&h->table, &e->node);
  if (e->has_key) txc_idtable_remove(&h->keys, &e->key_node);
  parked_t *p = e->parked;
  tc_op_clear(&e->op);
  free(e);
  while (p) {
    parked_t *next = p->next;
    tc_req_t *req = p->req;
    free(p);
    h->parked--;
    h->resume(req, h->arg);
    p = next;
  }
  maybe_release(h);
}

static void on_stored(tc_op_t *op, void *arg) {
  (void)op;
  held_t *e = arg;
  finish(e->h, e);
}

static void arm_timer(tc_hold_t *h);

/* Store 'e' alone now (HELD -> STORING).  A full store queue leaves it
 * held, for the timer to try again, unless 'must' (the node is stopping);
 * a closing store loses it. */
static void store_now(tc_hold_t *h, held_t *e, bool must) {
  tc_op_t *op = &e->op;
  memset(op, 0, sizeof(*op));
  op->kind = TC_OP_BEGIN;
  op->cb = on_stored;
  op->arg = e;
  op->xid = e->xid;
  op->id = e->txid;
  op->timeout_ms = e->timeout_ms;
  op->name = e->has_name ? e->name : NULL;
  op->app_id = e->app_id;
  op->group = e->group;
  op->idem_key = e->has_key ? e->idem_key : NULL;
  int rc = tc_store_submit(h->store, op);
  if (rc == 0) {
    list_remove(h, e);
    e->state = STORING;
    h->stored_alone++;
    return;
  }
  if (rc == TXP_EBUSY && !must) {
    list_remove(h, e);
    e->due_ms = uv_now(h->loop) + (h->hold_ms ? h->hold_ms : 1);
    list_append(h, e);
    arm_timer(h);
    return;
  }
  finish(h, e); /* shutting down: the begin is lost (tc_hold.h) */
}

static void on_timer(uv_timer_t *t) {
  tc_hold_t *h = t->data;
  uint64_t now = uv_now(h->loop);
  /* Store what is due; an entry put back (store busy) is due later, so
   * the walk ends there. */
  while (h->oldest && h->oldest->due_ms <= now) {
    held_t *e = h->oldest;
    store_now(h, e, false);
    if (h->oldest == e) break;
  }
  arm_timer(h);
}

static void arm_timer(tc_hold_t *h) {
  if (h->closing || !h->oldest) {
    uv_timer_stop(&h->timer);
    return;
  }
  uint64_t now = uv_now(h->loop), due = h->oldest->due_ms;
  uv_timer_start(&h->timer, on_timer, due > now ? due - now : 0, 0);
}

tc_hold_t *tc_hold_new(uv_loop_t *loop, tc_store_t *store, unsigned hold_ms, size_t max,
                       void (*resume)(tc_req_t *req, void *arg), void *arg) {
  tc_hold_t *h = calloc(1, sizeof(*h));
  if (!h) return NULL;
  if (txc_idtable_init(&h->table, 8) != 0) {
    free(h);
    return NULL;
  }
  if (txc_idtable_init(&h->keys, 6) != 0) {
    txc_idtable_free(&h->table);
    free(h);
    return NULL;
  }
  h->loop = loop;
  h->store = store;
  h->hold_ms = hold_ms;
  h->max = max < TC_HOLD_MAX ? max : TC_HOLD_MAX;
  h->resume = resume;
  h->arg = arg;
  uv_timer_init(loop, &h->timer);
  h->timer.data = h;
  uv_timer_init(loop, &h->retry_timer);
  h->retry_timer.data = h;
  h->timers_open = 2;
  return h;
}

int tc_hold_begin(tc_hold_t *h, const tc_held_begin_t *b) {
  if (!h || !h->hold_ms || h->closing || txc_idtable_count(&h->table) >= h->max) return -1;
  held_t *e = calloc(1, sizeof(*e));
  if (!e) return -1;
  e->h = h;
  e->state = HELD;
  e->txid = b->txid;
  e->timeout_ms = b->timeout_ms;
  e->has_name = b->name != NULL;
  snprintf(e->xid, sizeof(e->xid), "%s", b->xid ? b->xid : "");
  snprintf(e->name, sizeof(e->name), "%s", b->name ? b->name : "");
  snprintf(e->app_id, sizeof(e->app_id), "%s", b->app_id ? b->app_id : "");
  snprintf(e->group, sizeof(e->group), "%s", b->group ? b->group : "");
  e->has_key = b->idem_key && b->idem_key[0];
  snprintf(e->idem_key, sizeof(e->idem_key), "%s", b->idem_key ? b->idem_key : "");
  e->due_ms = uv_now(h->loop) + h->hold_ms;
  e->node.id = xid_hash(e->xid);
  txc_idtable_insert(&h->table, &e->node);
  if (e->has_key) {
    e->key_node.id = key_hash(e->app_id, e->idem_key);
    txc_idtable_insert(&h->keys, &e->key_node);
  }
  bool first = !h->oldest;
  list_append(h, e);
  if (first) arm_timer(h);
  return 0;
}

bool tc_hold_park(tc_hold_t *h, tc_req_t *req) {
  held_t *e = find(h, req->msg.xid);
  if (!e) return false;
  if (e->state == HELD && req->msg.type == TXP_MSG_BRANCH_REGISTER) return false; /* it folds */
  parked_t *p = malloc(sizeof(*p));
  if (!p) {
    tc_req_reply_code(req, TXP_ENOMEM, "out of memory");
    return true;
  }
  p->req = req;
  p->next = NULL;
  if (e->parked_tail) e->parked_tail->next = p;
  else e->parked = p;
  e->parked_tail = p;
  h->parked++;
  if (e->state == HELD) store_now(h, e, false); /* may finish 'e': then 'req' already ran */
  return true;
}

bool tc_hold_fold(tc_hold_t *h, tc_op_t *op) {
  held_t *e = find(h, op->xid);
  if (!e || e->state != HELD) return false;
  list_remove(h, e);
  e->state = FOLDED;
  op->begin_txid = e->txid;
  op->begin_timeout_ms = e->timeout_ms;
  op->begin_name = e->has_name ? e->name : NULL;
  op->begin_app_id = e->app_id;
  op->begin_group = e->group;
  op->begin_idem_key = e->has_key ? e->idem_key : NULL;
  op->begin_folded = true;
  h->folded++;
  arm_timer(h);
  return true;
}

void tc_hold_unfold(tc_hold_t *h, tc_op_t *op, bool ran) {
  if (!op->begin_folded) return;
  held_t *e = find(h, op->xid);
  op->begin_folded = false;
  op->begin_txid = 0;
  op->begin_name = op->begin_app_id = op->begin_group = op->begin_idem_key = NULL;
  if (!e || e->state != FOLDED) return;
  if (ran) {
    finish(h, e);
    return;
  }
  h->folded--;
  e->state = HELD;
  e->due_ms = uv_now(h->loop) + h->hold_ms; /* the list stays in due order */
  list_append(h, e);
  if (h->closing) store_now(h, e, true);
  else arm_timer(h);
}

void tc_hold_flush(tc_hold_t *h) {
  if (!h) return;
  while (h->oldest) store_now(h, h->oldest, true);
  uv_timer_stop(&h->timer);
}

void tc_hold_get_stats(const tc_hold_t *h, tc_hold_stats_t *out) {
  memset(out, 0, sizeof(*out));
  if (!h) return;
  out->held = txc_idtable_count(&h->table);
  out->parked = h->parked;
  out->retrying = h->nretries;
  out->folded = h->folded;
  out->stored_alone = h->stored_alone;
}

static void run_retries(tc_hold_t *h);

static void on_retry_timer(uv_timer_t *t) { run_retries(t->data); }

/* Run the retries that are due (all of them when closing). */
static void run_retries(tc_hold_t *h) {
  uint64_t now = uv_now(h->loop);
  while (h->retries && (h->closing || h->retries->due_ms <= now)) {
    parked_t *p = h->retries;
    h->retries = p->next;
    if (!h->retries) h->retries_tail = NULL;
    h->nretries--;
    tc_req_t *req = p->req;
    free(p);
    h->resume(req, h->arg);
  }
  if (h->retries && !h->closing)
    uv_timer_start(&h->retry_timer, on_retry_timer, h->retries->due_ms - now, 0);
}

bool tc_hold_retry_later(tc_hold_t *h, tc_req_t *req) {
  if (!h || !h->hold_ms || h->closing || req->retried || h->nretries >= h->max) return false;
  parked_t *p = malloc(sizeof(*p));
  if (!p) return false;
  req->retried = true;
  p->req = req;
  p->due_ms = uv_now(h->loop) + h->hold_ms + RETRY_MARGIN_MS;
  p->next = NULL;
  /* One delay for all: the list stays in due order. */
  if (h->retries_tail) h->retries_tail->next = p;
  else h->retries = p;
  h->retries_tail = p;
  if (h->nretries++ == 0) uv_timer_start(&h->retry_timer, on_retry_timer, p->due_ms - uv_now(h->loop), 0);
  return true;
}

static void on_timer_closed(uv_handle_t *handle) {
  tc_hold_t *h = handle->data;
  h->timers_open--;
  maybe_release(h);
}

void tc_hold_close(tc_hold_t *h, void (*done)(void *), void *arg) {
  h->done = done;
  h->done_arg = arg;
  tc_hold_flush(h);
  h->closing = true;
  run_retries(h); /* they are answered "shutting down" now */
  uv_close((uv_handle_t *)&h->timer, on_timer_closed);
  uv_close((uv_handle_t *)&h->retry_timer, on_timer_closed);
}
