/*
 * tc_bus.c - the nanomsg BUS between tcd nodes; see tc_bus.h.
 *
 * NOTES
 *   Handles: a uv_poll on the socket's NN_RCVFD (readable while messages
 *   wait), a 100 ms timer (heartbeats, peer liveness, forward deadlines), a
 *   uv_idle that is active only while a RELEASED batch is open, so that
 *   xids released during one loop iteration leave in one message at the
 *   start of the next (the idle handle also keeps poll from blocking while
 *   a batch waits), and a uv_check that looks at the node's lock waiters
 *   after each poll phase: when the first one queues, a heartbeat with the
 *   "has waiters" flag leaves at once, so peers start sending releases
 *   before the holder is likely to release.  (If a release does slip
 *   through that window, the waiter's store re-check catches it.)
 *
 *   Received messages are handled in arrival order, at most RECV_BURST per
 *   poll callback (the fd stays readable if more wait, so the loop comes
 *   back to them after serving everything else once).
 *
 *   What a message must pass before anything reads its payload, in this
 *   order (tc_bus_auth.h): it parses (header and lengths), its MAC verifies
 *   with a key of the cluster secret, its sender is a current member (the
 *   live nodes of the store's node table, from tc_bus_set_members: nobody
 *   before the first heartbeat), and its sequence and stamp pass the replay
 *   window.  A message that fails is dropped and counted by reason
 *   (tc_bus_stats_t.rejected); the first of each (claimed) sender in a
 *   log interval is logged, the rest only counted.  A FORWARD_RESULT is
 *   further matched with its pending forward: the forward id (64 random
 *   bits), a sender the FORWARD went to and that has not answered yet, and
 *   the xid and branch id it asked about, in the payload and in the RM's
 *   frame.
 */
#include "tc_bus.h"

#include <errno.h>
#include <fcntl.h>
#include <nanomsg/bus.h>
#include <nanomsg/nn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sodium.h>

#include "tc_bus_auth.h"
#include "tc_bus_msg.h"

#define MAX_PEERS 64
#define TICK_MS 100
#define RECV_BURST 256
#define RELEASED_BATCH_BYTES (60u * 1024u)
#define PEER_DEAD_BEATS 3
#define MAX_NODE_ID 1023

typedef struct peer {
  int node_id;
  char addr[TC_BUS_MAX_ADDR + 1];      /* nanomsg address, if known */
  int endpoint;                        /* ours when we connect, else -1 */
  char advertise[TC_BUS_MAX_ADDR + 1]; /* from its heartbeats */
  uint32_t incarnation;
  uint64_t last_seen_ms;
  bool up, leader, waiters;
} peer_t;

typedef struct pending {
  uint64_t id; /* random, never 0 */
  tc_bus_call_cb cb;
  void *arg;
  uint64_t deadline_ms;
  int expected, no_rm, failed, refused;
  char resource[TXP_MAX_RESOURCE_LEN + 1];
  char xid[TXP_MAX_XID_LEN + 1]; /* what was asked: answers must match */
  int64_t branch_id;
  uint16_t result_type;
  uint16_t asked[MAX_PEERS]; /* the peers up when it was sent; 0 once answered */
  struct pending *next;
} pending_t;

struct tc_bus_fwd {
  tc_bus_t *bus;
  uint16_t asker;
  uint64_t id;
  char xid[TXP_MAX_XID_LEN + 1];
  int64_t branch_id;
};

struct tc_bus {
  uv_loop_t *loop;
  int sock;
  int node_id;
  uint32_t incarnation;
  char bind[TC_BUS_MAX_ADDR + 1];
  char advertise[TC_BUS_MAX_ADDR + 1];
  unsigned heartbeat_ms;
  tc_bus_handlers_t h;

  uv_poll_t rpoll;
  uv_timer_t timer;
  uv_idle_t flush;
  bool flush_on;
  uv_check_t wcheck;
  bool waiting;       /* this node has lock waiters (as last checked) */
  bool hello_waiting; /* the last heartbeat sent said so */
  uint64_t last_hello_ms;

  txp_buf_t rel; /* the open RELEASED batch */
  tc_bus_released_writer_t relw;
  bool rel_open;
  txp_buf_t out; /* scratch for single messages */

  peer_t peers[MAX_PEERS];
  int npeers;
  pending_t *pending;
  bool leader;

  tc_bus_keys_t keys;
  tc_bus_replay_t replay;
  uint64_t seq;                                 /* last sequence number sent */
  uint8_t member[(MAX_NODE_ID + 1 + 7) / 8];    /* bit per node id: current members */
  bool members_known;                           /* tc_bus_set_members was called */
  unsigned log_interval_ms;
  uint64_t last_log_ms[MAX_NODE_ID + 1];        /* per claimed sender (0: unparsable) */
  uint32_t unlogged[MAX_NODE_ID + 1];

  bool closing;
  int close_parts;
  int fwd_out; /* forwards taken by on_forward, not yet answered */
  void (*done)(void *);
  void *done_arg;
  tc_bus_stats_t stats;
};

/* ------------------------------------------------------------- helpers */

static peer_t *find_peer(tc_bus_t *bus, int node_id, bool create) {
  for (int i = 0; i < bus->npeers; i++)
    if (bus->peers[i].node_id == node_id) return &bus->peers[i];
  if (!create || bus->npeers == MAX_PEERS) return NULL;
  peer_t *p = &bus->peers[bus->npeers++];
  memset(p, 0, sizeof(*p));
  p->node_id = node_id;
  p->endpoint = -1;
  return p;
}

/* Seal the one message in 'b' (next sequence number, our clock, the MAC)
 * and send it. */
static void send_buf(tc_bus_t *bus, txp_buf_t *b) {
  if (bus->sock < 0 || !b->len) return;
  if (tc_bus_seal(b, 0, ++bus->seq, tc_bus_wall_ms(), &bus->keys) != 0) {
    bus->stats.send_dropped++;
    return;
  }
  int rc = nn_send(bus->sock, b->data, b->len, NN_DONTWAIT);
  if (rc < 0) bus->stats.send_dropped++;
  else bus->stats.sent++;
}

static void send_out(tc_bus_t *bus) {
  send_buf(bus, &bus->out);
  txp_buf_reset(&bus->out);
}

static const char *const reject_names[TC_BUS_REJECT_N] = {
  [TC_BUS_REJECT_MALFORMED] = "malformed",     [TC_BUS_REJECT_BAD_MAC] = "bad MAC",
  [TC_BUS_REJECT_NOT_MEMBER] = "not a member", [TC_BUS_REJECT_REPLAYED] = "replayed",
  [TC_BUS_REJECT_STALE] = "outside the time window", [TC_BUS_REJECT_UNEXPECTED] = "unexpected answer",
};

const char *tc_bus_reject_name(int reason) {
  static const char *const keys[TC_BUS_REJECT_N] = {"malformed", "bad_mac", "not_member",
                                                    "replayed",  "stale",   "unexpected"};
  return reason >= 0 && reason < TC_BUS_REJECT_N ? keys[reason] : "unknown";
}

/* Drop a message: count it, and log it if it is the first from 'from' (the
 * id it claims, 0 when unparsable) in this log interval; the next line
 * says how many went unlogged meanwhile. */
static void reject(tc_bus_t *bus, int reason, unsigned from, const char *fmt, ...)
  __attribute__((format(printf, 4, 5)));
static void reject(tc_bus_t *bus, int reason, unsigned from, const char *fmt, ...) {
  bus->stats.rejected[reason]++;
  bus->stats.bad_messages++;
  if (from > MAX_NODE_ID) from = 0;
  uint64_t now = uv_now(bus->loop);
  if (bus->last_log_ms[from] && now - bus->last_log_ms[from] < bus->log_interval_ms) {
    bus->unlogged[from]++;
    return;
  }
  bus->last_log_ms[from] = now ? now : 1;
  if (!bus->h.log) {
    bus->unlogged[from] = 0;
    return;
  }
  char what[256], msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof(what), fmt, ap);
  va_end(ap);
  int n = snprintf(msg, sizeof(msg), "dropped a bus message (%s) claiming to be from node %u: %s",
                   reject_names[reason], from, what);
  if (bus->unlogged[from] && n > 0 && (size_t)n < sizeof(msg))
    snprintf(msg + n, sizeof(msg) - (size_t)n, " (and %u more from it not logged since the last line)",
             bus->unlogged[from]);
  bus->unlogged[from] = 0;
  bus->h.log(1, msg, bus->h.arg);
}

static bool is_member(const tc_bus_t *bus, unsigned id) {
  return id <= MAX_NODE_ID && (bus->member[id / 8] & (1u << (id % 8)));
}

/* ----------------------------------------------------------- heartbeat */

static void send_hello_flags(tc_bus_t *bus, uint8_t extra) {
  uint8_t flags = (bus->leader ? TC_BUS_F_LEADER : 0) | (bus->waiting ? TC_BUS_F_WAITERS : 0) | extra;
  txp_buf_reset(&bus->out);
  if (tc_bus_write_hello(&bus->out, (uint16_t)bus->node_id, bus->incarnation, flags, bus->advertise) == 0)
    send_out(bus);
  bus->hello_waiting = bus->waiting;
  bus->last_hello_ms = uv_now(bus->loop);
}

static void send_hello(tc_bus_t *bus) { send_hello_flags(bus, 0); }

static void on_wcheck(uv_check_t *h) {
  tc_bus_t *bus = h->data;
  if (bus->closing) return;
  bus->waiting = bus->h.waiters(bus->h.arg) > 0;
  /* Only the first waiter is news; the end of waiting waits for the next
   * periodic heartbeat (fewer messages when waiters come and go). */
  if (bus->waiting && !bus->hello_waiting) send_hello(bus);
}

static void check_peers(tc_bus_t *bus, uint64_t now) {
  int up = 0;
  for (int i = 0; i < bus->npeers; i++) {
    peer_t *p = &bus->peers[i];
    if (p->up && now - p->last_seen_ms > (uint64_t)PEER_DEAD_BEATS * bus->heartbeat_ms) {
      p->up = false;
      if (bus->h.on_peer) bus->h.on_peer(p->node_id, p->advertise, false, bus->h.arg);
    }
    up += p->up;
  }
  bus->stats.peers_up = up;
}

static void on_hello(tc_bus_t *bus, const tc_bus_hdr_t *hd) {
  char addr[TC_BUS_MAX_ADDR + 1];
  if (tc_bus_parse_hello(hd, addr, sizeof(addr)) != 0) {
    reject(bus, TC_BUS_REJECT_MALFORMED, hd->from, "bad hello payload");
    return;
  }
  peer_t *p = find_peer(bus, hd->from, true);
  if (!p) return;
  bool news = !p->up || p->incarnation != hd->incarnation;
  p->incarnation = hd->incarnation;
  p->leader = hd->flags & TC_BUS_F_LEADER;
  p->waiters = hd->flags & TC_BUS_F_WAITERS;
  p->last_seen_ms = uv_now(bus->loop);
  snprintf(p->advertise, sizeof(p->advertise), "%s", addr);
  if (news) {
    if (!p->up) bus->stats.peers_up++;
    p->up = true;
    if (bus->h.on_peer) bus->h.on_peer(p->node_id, p->advertise, true, bus->h.arg);
    /* A peer that just (re)joined learns about us at once. */
    send_hello(bus);
  } else if (hd->flags & TC_BUS_F_ASK) {
    /* It just took us for a member: it may have dropped our last hello. */
    send_hello(bus);
  }
}

/* ------------------------------------------------------------- release */

static void flush_released(tc_bus_t *bus) {
  if (!bus->rel_open) return;
  tc_bus_released_end(&bus->relw);
  if (bus->relw.count) send_buf(bus, &bus->rel);
  bus->stats.released_sent += bus->relw.count;
  txp_buf_reset(&bus->rel);
  bus->rel_open = false;
}

static void on_flush(uv_idle_t *h) {
  tc_bus_t *bus = h->data;
  flush_released(bus);
  uv_idle_stop(&bus->flush);
  bus->flush_on = false;
}

/* Whether a release is worth sending: some peer up has lock waiters. */
static bool peers_waiting(const tc_bus_t *bus) {
  for (int i = 0; i < bus->npeers; i++)
    if (bus->peers[i].up && bus->peers[i].waiters) return true;
  return false;
}

void tc_bus_released(tc_bus_t *bus, const char *xid) {
  if (!bus || bus->closing) return;
  if (!peers_waiting(bus)) {
    bus->stats.released_skipped++;
    return;
  }
  for (int attempt = 0; attempt < 2; attempt++) {
    if (!bus->rel_open) {
      if (tc_bus_released_begin(&bus->relw, &bus->rel, (uint16_t)bus->node_id, bus->incarnation,
                                RELEASED_BATCH_BYTES) != 0)
        return;
      bus->rel_open = true;
    }
    int rc = tc_bus_released_add(&bus->relw, xid);
    if (rc == 0) break;
    if (rc != TXP_EBUFFER_FULL) return;
    flush_released(bus); /* full: send it now, start another */
  }
  if (!bus->flush_on) {
    uv_idle_start(&bus->flush, on_flush);
    bus->flush_on = true;
  }
}

static void released_one(const char *xid, void *arg) {
  tc_bus_t *bus = arg;
  bus->stats.released_received++;
  if (bus->h.on_released) bus->h.on_released(xid, bus->h.arg);
}

/* ------------------------------------------------------------ forwards */

static void send_result(tc_bus_t *bus, uint16_t asker, uint64_t id, const char *xid, int64_t branch_id,
                        int outcome, const txp_buf_t *frame) {
  tc_bus_result_msg_t r = {.target = asker, .id = id, .outcome = (uint8_t)outcome, .branch_id = branch_id};
  snprintf(r.xid, sizeof(r.xid), "%s", xid);
  if (frame) {
    r.frame = (const uint8_t *)frame->data;
    r.frame_len = (uint32_t)frame->len;
  }
  txp_buf_reset(&bus->out);
  if (tc_bus_write_result(&bus->out, (uint16_t)bus->node_id, bus->incarnation, &r) == 0) send_out(bus);
}

static void on_forward(tc_bus_t *bus, const tc_bus_hdr_t *hd) {
  tc_bus_forward_msg_t f;
  if (tc_bus_parse_forward(hd, &f) != 0) {
    reject(bus, TC_BUS_REJECT_MALFORMED, hd->from, "bad forward payload");
    return;
  }
  if (f.target != 0 && f.target != bus->node_id) return; /* meant for another node */
  txp_msg_t req;
  txp_msg_init(&req, TXP_MSG_NONE);
  int rc = txp_decode_frame((const char *)f.frame, f.frame_len, NULL, &req);
  if (rc != 0 || (req.type != TXP_MSG_BRANCH_COMMIT && req.type != TXP_MSG_BRANCH_ROLLBACK) || !req.xid ||
      !req.xid[0] || strlen(req.xid) > TXP_MAX_XID_LEN || !txp_msg_has(&req, TXP_F_BRANCH_ID)) {
    reject(bus, TC_BUS_REJECT_MALFORMED, hd->from, "forward without a BranchCommit or BranchRollback frame");
    txp_msg_clear(&req);
    return;
  }
  tc_bus_fwd_t *fw = calloc(1, sizeof(*fw));
  if (!fw) {
    send_result(bus, hd->from, f.id, req.xid, req.branch_id, TC_BUS_FAILED, NULL);
    txp_msg_clear(&req);
    return;
  }
  fw->bus = bus;
  fw->asker = hd->from;
  fw->id = f.id;
  snprintf(fw->xid, sizeof(fw->xid), "%s", req.xid);
  fw->branch_id = req.branch_id;
  bus->fwd_out++;
  rc = bus->h.on_forward ? bus->h.on_forward(fw, &req, f.client_id, f.timeout_ms, bus->h.arg)
                         : TXP_EBRANCH_NOT_FOUND;
  txp_msg_clear(&req);
  if (rc != 0) {
    bus->fwd_out--;
    send_result(bus, hd->from, f.id, fw->xid, fw->branch_id, rc == TXP_EBRANCH_NOT_FOUND ? TC_BUS_NO_RM : TC_BUS_FAILED,
                NULL);
    free(fw);
    return;
  }
  bus->stats.forwards_served++;
}

static void finish_close(tc_bus_t *bus);

void tc_bus_forward_reply(tc_bus_fwd_t *f, int status, const txp_msg_t *res) {
  tc_bus_t *bus = f->bus;
  bus->fwd_out--;
  if (!bus->closing) {
    int outcome = TC_BUS_FAILED;
    txp_buf_t frame;
    txp_buf_init(&frame, 0);
    txp_msg_t m;
    if (status == 0 && res) {
      /* The answer names what it answers (the RM need not): a shallow copy,
       * its strings stay borrowed. */
      m = *res;
      txp_msg_set_str(&m, TXP_F_XID, f->xid);
      txp_msg_set_int(&m, TXP_F_BRANCH_ID, f->branch_id);
      if (txp_encode(&m, &frame, 0) == 0) outcome = TC_BUS_ANSWERED;
    } else if (status == TXP_EBAD_STATE) {
      outcome = TC_BUS_REFUSED;
    } else if (status == TXP_EBRANCH_NOT_FOUND) {
      outcome = TC_BUS_NO_RM;
    }
    send_result(bus, f->asker, f->id, f->xid, f->branch_id, outcome, outcome == TC_BUS_ANSWERED ? &frame : NULL);
    txp_buf_free(&frame);
  }
  free(f);
  if (bus->closing) finish_close(bus);
}

static bool take_pending_peek(const tc_bus_t *bus, uint64_t id) {
  for (const pending_t *q = bus->pending; q; q = q->next)
    if (q->id == id) return true;
  return false;
}

static pending_t *take_pending(tc_bus_t *bus, uint64_t id) {
  for (pending_t **pp = &bus->pending; *pp; pp = &(*pp)->next) {
    if ((*pp)->id == id) {
      pending_t *p = *pp;
      *pp = p->next;
      return p;
    }
  }
  return NULL;
}

/* Nobody relayed the call: answer it as a retryable branch failure, which
 * phase two records (and the leader retries with backoff). */
static void complete_unanswered(pending_t *p) {
  char msg[TXP_MAX_RESOURCE_LEN + 160];
  if (p->failed || p->refused)
    snprintf(msg, sizeof(msg),
             "no peer could relay the call to a resource manager of \"%s\" "
             "(%d had none, %d failed, %d refused)",
             p->resource, p->no_rm, p->failed, p->refused);
  else
    snprintf(msg, sizeof(msg), "no resource manager connected for resource \"%s\" on any node",
             p->resource);
  txp_msg_t res;
  txp_msg_init(&res, (txp_msg_type_t)p->result_type);
  txp_msg_set_int(&res, TXP_F_CODE, TXP_EBRANCH_RETRYABLE);
  txp_msg_set_str(&res, TXP_F_MESSAGE, msg);
  p->cb(0, &res, p->arg);
}

static void on_result(tc_bus_t *bus, const tc_bus_hdr_t *hd) {
  tc_bus_result_msg_t r;
  if (tc_bus_parse_result(hd, &r) != 0) {
    reject(bus, TC_BUS_REJECT_MALFORMED, hd->from, "bad forward-result payload");
    return;
  }
  if (r.target != bus->node_id) return;
  pending_t *p = NULL;
  for (pending_t *q = bus->pending; q; q = q->next)
    if (q->id == r.id) p = q;
  if (!p) return; /* answered already (another peer was faster), or expired */
  /* Only a peer the forward went to, once each, about what was asked. */
  int slot = -1;
  for (int i = 0; i < p->expected && slot < 0; i++)
    if (p->asked[i] == hd->from) slot = i;
  if (slot < 0) {
    reject(bus, TC_BUS_REJECT_UNEXPECTED, hd->from, "an answer to forward %016llx, which was not sent to it "
           "(or which it answered already)", (unsigned long long)r.id);
    return;
  }
  if (strcmp(r.xid, p->xid) != 0 || r.branch_id != p->branch_id) {
    reject(bus, TC_BUS_REJECT_UNEXPECTED, hd->from, "an answer to forward %016llx about \"%s\" branch %lld, "
           "which asked about \"%s\" branch %lld", (unsigned long long)r.id, r.xid, (long long)r.branch_id, p->xid,
           (long long)p->branch_id);
    return;
  }
  p->asked[slot] = 0;
  if (r.outcome == TC_BUS_ANSWERED) {
    txp_msg_t res;
    txp_msg_init(&res, TXP_MSG_NONE);
    if (txp_decode_frame((const char *)r.frame, r.frame_len, NULL, &res) != 0 ||
        res.type != p->result_type || !res.xid || strcmp(res.xid, p->xid) != 0 ||
        !txp_msg_has(&res, TXP_F_BRANCH_ID) || res.branch_id != p->branch_id) {
      reject(bus, TC_BUS_REJECT_UNEXPECTED, hd->from,
             "an answer to forward %016llx whose frame is not a result for \"%s\" branch %lld",
             (unsigned long long)r.id, p->xid, (long long)p->branch_id);
      txp_msg_clear(&res);
      p->failed++; /* it had its say: count it as failed */
      if (p->no_rm + p->refused + p->failed < p->expected) return;
      take_pending(bus, p->id);
      bus->stats.forwards_no_rm++;
      complete_unanswered(p);
      free(p);
      return;
    }
    take_pending(bus, p->id);
    bus->stats.forwards_answered++;
    p->cb(0, &res, p->arg);
    txp_msg_clear(&res);
    free(p);
    return;
  }
  if (r.outcome == TC_BUS_NO_RM) p->no_rm++;
  else if (r.outcome == TC_BUS_REFUSED) p->refused++;
  else p->failed++;
  if (p->no_rm + p->refused + p->failed < p->expected) return;
  take_pending(bus, p->id);
  bus->stats.forwards_no_rm++;
  complete_unanswered(p);
  free(p);
}

int tc_bus_forward(tc_bus_t *bus, const txp_msg_t *req, const char *client_id, unsigned timeout_ms,
                   tc_bus_call_cb cb, void *arg) {
  if (!bus || bus->closing) return TXP_ESHUTDOWN;
  if (!req || !cb || (req->type != TXP_MSG_BRANCH_COMMIT && req->type != TXP_MSG_BRANCH_ROLLBACK) || !req->xid ||
      !req->xid[0] || strlen(req->xid) > TXP_MAX_XID_LEN)
    return TXP_EINVALID_ARG;
  check_peers(bus, uv_now(bus->loop));
  if (bus->stats.peers_up == 0) return TXP_ENO_NODE;
  pending_t *p = calloc(1, sizeof(*p));
  if (!p) return TXP_ENOMEM;
  txp_buf_t frame;
  txp_buf_init(&frame, 0);
  int rc = txp_encode(req, &frame, 0);
  if (rc != 0) {
    txp_buf_free(&frame);
    free(p);
    return rc;
  }
  /* Not guessable, and not one pending already. */
  do {
    randombytes_buf(&p->id, sizeof(p->id));
  } while (p->id == 0 || take_pending_peek(bus, p->id));
  p->cb = cb;
  p->arg = arg;
  for (int i = 0; i < bus->npeers && p->expected < MAX_PEERS; i++)
    if (bus->peers[i].up) p->asked[p->expected++] = (uint16_t)bus->peers[i].node_id;
  snprintf(p->xid, sizeof(p->xid), "%s", req->xid ? req->xid : "");
  p->branch_id = req->branch_id;
  p->deadline_ms = uv_now(bus->loop) + (timeout_ms ? timeout_ms : 10000);
  p->result_type = (uint16_t)(req->type + 1);
  snprintf(p->resource, sizeof(p->resource), "%s", req->resource_id ? req->resource_id : "");
  tc_bus_forward_msg_t f = {.target = 0, .id = p->id, .timeout_ms = timeout_ms,
                            .frame = (const uint8_t *)frame.data, .frame_len = (uint32_t)frame.len};
  snprintf(f.client_id, sizeof(f.client_id), "%s", client_id ? client_id : "");
  txp_buf_reset(&bus->out);
  rc = tc_bus_write_forward(&bus->out, (uint16_t)bus->node_id, bus->incarnation, &f);
  txp_buf_free(&frame);
  if (rc != 0) {
    free(p);
    return rc;
  }
  send_out(bus);
  bus->stats.forwards_sent++;
  p->next = bus->pending;
  bus->pending = p;
  return 0;
}

static void expire_forwards(tc_bus_t *bus, uint64_t now) {
  for (pending_t **pp = &bus->pending; *pp;) {
    pending_t *p = *pp;
    if (p->deadline_ms > now) {
      pp = &p->next;
      continue;
    }
    *pp = p->next;
    bus->stats.forwards_timed_out++;
    p->cb(TXP_EUNKNOWN_OUTCOME, NULL, p->arg);
    free(p);
    pp = &bus->pending; /* the callback may have added forwards: restart */
  }
}

/* ------------------------------------------------------------ receive */

static void handle(tc_bus_t *bus, const void *buf, size_t len) {
  tc_bus_hdr_t hd;
  bus->stats.received++;
  if (tc_bus_parse_header(buf, len, &hd) != 0) {
    bool old = len >= 4 && memcmp(buf, "TXB1", 4) == 0;
    reject(bus, TC_BUS_REJECT_MALFORMED, 0, "%s (%zu bytes)",
           old ? "the unauthenticated TXB1 format of older versions" : "not a bus message", len);
    return;
  }
  if (tc_bus_verify(buf, len, &bus->keys) != 0) {
    reject(bus, TC_BUS_REJECT_BAD_MAC, hd.from, "%s not signed with the cluster secret", tc_bus_kind_name(hd.kind));
    return;
  }
  if (hd.from == bus->node_id) return; /* ours: a misconfigured peer list */
  if (!is_member(bus, hd.from)) {
    /* Before the first membership heartbeat everyone is a stranger: count
     * those, but do not log them (the peers' first hellos, every start). */
    if (bus->h.on_stranger) bus->h.on_stranger(hd.from, bus->h.arg);
    if (!bus->members_known) {
      bus->stats.rejected[TC_BUS_REJECT_NOT_MEMBER]++;
      bus->stats.bad_messages++;
      return;
    }
    reject(bus, TC_BUS_REJECT_NOT_MEMBER, hd.from, "%s from a node id that is not a live member in the node table",
           tc_bus_kind_name(hd.kind));
    return;
  }
  uint64_t now = tc_bus_wall_ms();
  switch (tc_bus_replay_check(&bus->replay, hd.from, hd.incarnation, hd.seq, hd.sent_ms, now)) {
  case TC_BUS_FRESH: break;
  case TC_BUS_REPLAYED:
    reject(bus, TC_BUS_REJECT_REPLAYED, hd.from, "%s number %llu of incarnation %08x seen already",
           tc_bus_kind_name(hd.kind), (unsigned long long)hd.seq, (unsigned)hd.incarnation);
    return;
  default:
    reject(bus, TC_BUS_REJECT_STALE, hd.from, "%s sent at %llu, %lld ms from our clock (window %llu ms)",
           tc_bus_kind_name(hd.kind), (unsigned long long)hd.sent_ms, (long long)(hd.sent_ms - now),
           (unsigned long long)bus->replay.window_ms);
    return;
  }
  /* Any message shows that its sender is alive.  Only heartbeats (and the
   * configuration) make a new peer: anything else from an unknown sender
   * is still handled, but does not take a slot of the peer table. */
  peer_t *p = find_peer(bus, hd.from, false);
  if (p && p->up && p->incarnation == hd.incarnation) p->last_seen_ms = uv_now(bus->loop);
  switch (hd.kind) {
  case TC_BUS_HELLO: on_hello(bus, &hd); break;
  case TC_BUS_RELEASED:
    if (tc_bus_each_released(&hd, released_one, bus) < 0)
      reject(bus, TC_BUS_REJECT_MALFORMED, hd.from, "bad released payload");
    break;
  case TC_BUS_FORWARD: on_forward(bus, &hd); break;
  case TC_BUS_FORWARD_RESULT: on_result(bus, &hd); break;
  default: reject(bus, TC_BUS_REJECT_MALFORMED, hd.from, "unknown kind %d", hd.kind); break;
  }
}

static void on_readable(uv_poll_t *h, int status, int events) {
  tc_bus_t *bus = h->data;
  if (bus->closing) return;
  for (int i = 0; i < RECV_BURST && !bus->closing; i++) {
    void *buf = NULL;
    int n = nn_recv(bus->sock, &buf, NN_MSG, NN_DONTWAIT);
    if (n < 0) {
      if (nn_errno() == EINTR) continue;
      break; /* EAGAIN: drained */
    }
    handle(bus, buf, (size_t)n);
    nn_freemsg(buf);
  }
}

static void on_tick(uv_timer_t *t) {
  tc_bus_t *bus = t->data;
  if (bus->closing) return;
  uint64_t now = uv_now(bus->loop);
  if (now - bus->last_hello_ms >= bus->heartbeat_ms) send_hello(bus);
  check_peers(bus, now);
  expire_forwards(bus, now);
}

/* ----------------------------------------------------------- lifecycle */

int tc_bus_add_peer(tc_bus_t *bus, int node_id, const char *addr) {
  if (!bus || bus->closing || node_id == bus->node_id || node_id < 1 || !addr || !addr[0]) return 0;
  if (strlen(addr) > TC_BUS_MAX_ADDR) return TXP_EFIELD_TOO_LONG;
  peer_t *p = find_peer(bus, node_id, true);
  if (!p) return TXP_ELIMIT;
  if (strcmp(p->addr, addr) == 0 && (p->endpoint >= 0 || node_id > bus->node_id)) return 0;
  if (p->endpoint >= 0) {
    nn_shutdown(bus->sock, p->endpoint);
    p->endpoint = -1;
  }
  snprintf(p->addr, sizeof(p->addr), "%s", addr);
  if (node_id < bus->node_id) {
    int ep = nn_connect(bus->sock, addr);
    if (ep < 0) return TXP_EINVALID_ARG;
    p->endpoint = ep;
  }
  return 0;
}

tc_bus_t *tc_bus_new(uv_loop_t *loop, const tc_bus_opts_t *o, char *err, size_t errlen) {
  if (!o->bind || !o->bind[0] || strlen(o->bind) > TC_BUS_MAX_ADDR || o->node_id < 1 || o->node_id > 1023) {
    snprintf(err, errlen, "invalid bus options (address \"%s\", node id %d)", o->bind ? o->bind : "",
             o->node_id);
    return NULL;
  }
  if (!o->keys || o->keys->n < 1) {
    snprintf(err, errlen, "the bus needs the cluster secret (cluster.secret_file)");
    return NULL;
  }
  if (sodium_init() < 0) {
    snprintf(err, errlen, "could not initialise libsodium");
    return NULL;
  }
  tc_bus_t *bus = calloc(1, sizeof(*bus));
  if (!bus) {
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  bus->loop = loop;
  bus->node_id = o->node_id;
  bus->heartbeat_ms = o->heartbeat_ms ? o->heartbeat_ms : 1000;
  bus->h = o->h;
  snprintf(bus->bind, sizeof(bus->bind), "%s", o->bind);
  snprintf(bus->advertise, sizeof(bus->advertise), "%s", o->advertise ? o->advertise : "");
  bus->incarnation = randombytes_random() | 1u;
  bus->keys = *o->keys;
  tc_bus_replay_init(&bus->replay, o->replay_window_ms);
  bus->log_interval_ms = o->log_interval_ms ? o->log_interval_ms : 60000;
  txp_buf_init(&bus->rel, 0);
  txp_buf_init(&bus->out, 0);

  bus->sock = nn_socket(AF_SP, NN_BUS);
  if (bus->sock < 0) {
    snprintf(err, errlen, "could not create the bus socket: %s", nn_strerror(nn_errno()));
    goto fail;
  }
  int maxsz = (int)TC_BUS_MAX_MSG + 4096, ivl = 100, ivl_max = 2000, linger = 0, bufsz = 1024 * 1024;
  nn_setsockopt(bus->sock, NN_SOL_SOCKET, NN_RCVMAXSIZE, &maxsz, sizeof(maxsz));
  nn_setsockopt(bus->sock, NN_SOL_SOCKET, NN_RECONNECT_IVL, &ivl, sizeof(ivl));
  nn_setsockopt(bus->sock, NN_SOL_SOCKET, NN_RECONNECT_IVL_MAX, &ivl_max, sizeof(ivl_max));
  nn_setsockopt(bus->sock, NN_SOL_SOCKET, NN_LINGER, &linger, sizeof(linger));
  nn_setsockopt(bus->sock, NN_SOL_SOCKET, NN_SNDBUF, &bufsz, sizeof(bufsz));
  nn_setsockopt(bus->sock, NN_SOL_SOCKET, NN_RCVBUF, &bufsz, sizeof(bufsz));
  if (nn_bind(bus->sock, bus->bind) < 0) {
    snprintf(err, errlen, "could not bind the bus to \"%s\": %s", bus->bind, nn_strerror(nn_errno()));
    goto fail_sock;
  }
  int fd = -1;
  size_t fdsz = sizeof(fd);
  if (nn_getsockopt(bus->sock, NN_SOL_SOCKET, NN_RCVFD, &fd, &fdsz) < 0) {
    snprintf(err, errlen, "could not get the bus socket's receive fd: %s", nn_strerror(nn_errno()));
    goto fail_sock;
  }
  /* uv_poll_init makes the fd non-blocking; it is nanomsg's, so give it
   * back its own flags (poll needs none). */
  int flags = fcntl(fd, F_GETFL);
  if (uv_poll_init(loop, &bus->rpoll, fd) != 0) {
    snprintf(err, errlen, "could not poll the bus socket");
    goto fail_sock;
  }
  if (flags >= 0) fcntl(fd, F_SETFL, flags);
  bus->rpoll.data = bus;
  uv_poll_start(&bus->rpoll, UV_READABLE, on_readable);
  uv_timer_init(loop, &bus->timer);
  bus->timer.data = bus;
  uv_timer_start(&bus->timer, on_tick, TICK_MS, TICK_MS);
  uv_idle_init(loop, &bus->flush);
  bus->flush.data = bus;
  uv_check_init(loop, &bus->wcheck);
  bus->wcheck.data = bus;
  if (bus->h.waiters) uv_check_start(&bus->wcheck, on_wcheck);
  else bus->waiting = true; /* unknown: peers always send */
  send_hello(bus);
  return bus;

fail_sock:
  nn_close(bus->sock);
fail:
  txp_buf_free(&bus->rel);
  txp_buf_free(&bus->out);
  tc_bus_keys_wipe(&bus->keys);
  free(bus);
  return NULL;
}

static void finish_close(tc_bus_t *bus) {
  if (bus->close_parts > 0 || bus->fwd_out > 0) return;
  void (*done)(void *) = bus->done;
  void *darg = bus->done_arg;
  txp_buf_free(&bus->rel);
  txp_buf_free(&bus->out);
  tc_bus_keys_wipe(&bus->keys);
  free(bus);
  if (done) done(darg);
}

static void on_handle_closed(uv_handle_t *h) {
  tc_bus_t *bus = h->data;
  if (--bus->close_parts == 0) {
    /* The poll handle is gone: nanomsg's fd can be closed with the socket. */
    nn_close(bus->sock);
    bus->sock = -1;
  }
  finish_close(bus);
}

void tc_bus_close(tc_bus_t *bus, void (*done)(void *), void *arg) {
  bus->closing = true;
  bus->done = done;
  bus->done_arg = arg;
  while (bus->pending) {
    pending_t *p = bus->pending;
    bus->pending = p->next;
    p->cb(TXP_ESHUTDOWN, NULL, p->arg);
    free(p);
  }
  bus->close_parts = 4;
  uv_close((uv_handle_t *)&bus->rpoll, on_handle_closed);
  uv_close((uv_handle_t *)&bus->timer, on_handle_closed);
  uv_close((uv_handle_t *)&bus->flush, on_handle_closed);
  uv_close((uv_handle_t *)&bus->wcheck, on_handle_closed);
}

void tc_bus_set_leader(tc_bus_t *bus, bool leader) {
  if (!bus || bus->leader == leader) return;
  bus->leader = leader;
  if (!bus->closing) send_hello(bus); /* tell the peers now */
}

int tc_bus_set_keys(tc_bus_t *bus, const tc_bus_keys_t *keys) {
  if (!bus || !keys || keys->n < 1) return TXP_EINVALID_ARG;
  bus->keys = *keys;
  return 0;
}

void tc_bus_set_members(tc_bus_t *bus, const int *ids, size_t n) {
  if (!bus) return;
  uint8_t old[sizeof(bus->member)];
  memcpy(old, bus->member, sizeof(old));
  bus->members_known = true;
  memset(bus->member, 0, sizeof(bus->member));
  bool grew = false;
  for (size_t i = 0; i < n; i++) {
    if (ids[i] < 1 || ids[i] > MAX_NODE_ID || ids[i] == bus->node_id) continue;
    uint8_t bit = (uint8_t)(1u << (ids[i] % 8));
    bus->member[ids[i] / 8] |= bit;
    if (!(old[ids[i] / 8] & bit)) grew = true;
  }
  /* New members may have sent hellos that we dropped: greet them and ask
   * for an answer, rather than wait for their next heartbeat. */
  if (grew && !bus->closing) send_hello_flags(bus, TC_BUS_F_ASK);
}

int tc_bus_peers_up(const tc_bus_t *bus) { return bus ? bus->stats.peers_up : 0; }

void tc_bus_get_stats(const tc_bus_t *bus, tc_bus_stats_t *out) {
  if (!bus) {
    memset(out, 0, sizeof(*out));
    return;
  }
  *out = bus->stats;
}
