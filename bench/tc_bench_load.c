/*
 * tc_bench_load.c - see tc_bench_load.h.
 *
 * NOTES
 *   One state machine per client, driven by the answers to its own
 *   requests (one in flight at a time, as a blocking TM would).  Requests
 *   from the coordinator (phase two) are answered whenever they arrive.
 *   Writes go out with uv_try_write; the rare remainder (a full socket
 *   buffer) is copied into a uv_write of its own, so the client's buffer is
 *   free again at once.  Every request is a few hundred bytes and a client
 *   has one outstanding plus the phase-two answers it owes, so what can be
 *   queued is bounded by the clients' branches in flight.
 */
#include "tc_bench_load.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "txclient.h" /* txc_now_ms */
#include "txp_errno.h"
#include "txp_msg.h"
#include "txp_status.h"

#define GRACE_MS 300 /* phase-two answers owed after the stop */
#define TICK_MS 20   /* how often the loop looks at *phase */
#define BACKOFF_MS 10 /* before the next transaction after an error */

typedef enum {
  ST_CONNECTING,
  ST_REGISTER,
  ST_BEGIN,
  ST_BRANCH1,
  ST_BRANCH2,
  ST_COMMIT,
  ST_ROLLBACK,
  ST_IDLE, /* stopped between transactions */
  ST_DEAD  /* connection failed or lost */
} state_t;

typedef struct loop_ctx loop_ctx_t;

typedef struct {
  bench_client_t *pub;
  loop_ctx_t *lc;
  uv_tcp_t tcp;
  uv_connect_t connect;
  uv_timer_t backoff;
  bool open;   /* tcp and backoff initialised (need a close) */
  bool failed; /* the current transaction met an error */
  txp_decoder_t *dec;
  txp_buf_t out;
  state_t state;
  uint64_t next_id, want_id;
  uint64_t seq;
  double t0;
  char xid[TXP_MAX_XID_LEN + 1];
} client_t;

struct loop_ctx {
  uv_loop_t loop;
  uv_timer_t tick;
  client_t *c;
  int n;
  const char *token;
  const atomic_int *phase;
  bool stopping;
  double stop_at;
  char rbuf[65536];
};

static void note_error(client_t *c, const char *what, int code) {
  c->pub->errors++;
  c->failed = true;
  if (!c->pub->first_error[0])
    snprintf(c->pub->first_error, sizeof(c->pub->first_error), "%s: %s (%d)", what, txp_strerror(code),
             code);
}

static void on_written(uv_write_t *w, int status) {
  (void)status; /* a lost connection shows in the read callback */
  free(w);
}

/* Send what c->out holds. */
static int flush_out(client_t *c) {
  uv_buf_t b = uv_buf_init(c->out.data, (unsigned)c->out.len);
  int n = uv_try_write((uv_stream_t *)&c->tcp, &b, 1);
  if (n == UV_EAGAIN) n = 0;
  if (n < 0) return TXP_ECONN_LOST;
  if ((size_t)n < c->out.len) {
    size_t rest = c->out.len - (size_t)n;
    uv_write_t *w = malloc(sizeof(*w) + rest);
    if (!w) return TXP_ENOMEM;
    char *copy = (char *)(w + 1);
    memcpy(copy, c->out.data + n, rest);
    uv_buf_t r = uv_buf_init(copy, (unsigned)rest);
    if (uv_write(w, (uv_stream_t *)&c->tcp, &r, 1, on_written) != 0) {
      free(w);
      return TXP_ECONN_LOST;
    }
  }
  txp_buf_reset(&c->out);
  return 0;
}

static void send_msg(client_t *c, txp_msg_t *m, bool request) {
  if (request) {
    m->request_id = c->next_id++;
    c->want_id = m->request_id;
  }
  int rc = txp_encode(m, &c->out, 0);
  if (rc == 0) rc = flush_out(c);
  if (rc != 0) {
    note_error(c, "send", rc);
    c->state = ST_DEAD;
  }
}

static void send_begin(client_t *c) {
  txp_msg_t m;
  txp_msg_init(&m, TXP_MSG_GLOBAL_BEGIN);
  txp_msg_set_int(&m, TXP_F_TIMEOUT_MS, 30000);
  txp_msg_set_str(&m, TXP_F_NAME, "bench");
  c->t0 = txc_now_ms();
  c->state = ST_BEGIN;
  send_msg(c, &m, true);
}

static void send_branch(client_t *c, int which) {
  char key[96];
  snprintf(key, sizeof(key), "%s:%d_%" PRIu64, which == 1 ? "t_order" : "t_stock", c->pub->id, c->seq);
  txp_msg_t m;
  txp_msg_init(&m, TXP_MSG_BRANCH_REGISTER);
  txp_msg_set_str(&m, TXP_F_XID, c->xid);
  txp_msg_set_int(&m, TXP_F_BRANCH_TYPE, TXP_BT_AT);
  txp_msg_set_str(&m, TXP_F_RESOURCE_ID, which == 1 ? "bench_db1" : "bench_db2");
  txp_msg_set_str(&m, TXP_F_LOCK_KEYS, key);
  c->state = which == 1 ? ST_BRANCH1 : ST_BRANCH2;
  send_msg(c, &m, true);
}

static void send_end(client_t *c, bool commit) {
  txp_msg_t m;
  txp_msg_init(&m, commit ? TXP_MSG_GLOBAL_COMMIT : TXP_MSG_GLOBAL_ROLLBACK);
  txp_msg_set_str(&m, TXP_F_XID, c->xid);
  c->state = commit ? ST_COMMIT : ST_ROLLBACK;
  send_msg(c, &m, true);
}

static void on_backoff(uv_timer_t *t) {
  client_t *c = t->data;
  if (atomic_load(c->lc->phase) >= 2) c->state = ST_IDLE;
  else send_begin(c);
}

/* Start the next transaction (a moment later after an error, so that a
 * coordinator that refuses everything is not flooded), or stop between
 * transactions. */
static void next_tx(client_t *c) {
  if (c->failed) {
    c->failed = false;
    c->state = ST_IDLE;
    uv_timer_start(&c->backoff, on_backoff, BACKOFF_MS, 0);
    return;
  }
  on_backoff(&c->backoff);
}

static void record(client_t *c) {
  if (atomic_load(c->lc->phase) != 1) return;
  bench_client_t *p = c->pub;
  if (p->nlat == p->cap) {
    size_t ncap = p->cap ? p->cap * 2 : 4096;
    double *l = realloc(p->lat, ncap * sizeof(double));
    if (!l) return;
    p->lat = l;
    p->cap = ncap;
  }
  p->lat[p->nlat++] = txc_now_ms() - c->t0;
  p->done++;
}

/* The answer to the client's outstanding request. */
static void on_answer(client_t *c, const txp_msg_t *m) {
  int code = m->type == TXP_MSG_ERROR ? (m->code ? (int)m->code : TXP_EINTERNAL) : (int)m->code;
  switch (c->state) {
  case ST_REGISTER:
    if (code != 0) {
      note_error(c, "register", code);
      c->state = ST_DEAD;
      return;
    }
    next_tx(c);
    return;
  case ST_BEGIN:
    if (code != 0 || !m->xid) {
      note_error(c, "begin", code ? code : TXP_EINTERNAL);
      next_tx(c);
      return;
    }
    snprintf(c->xid, sizeof(c->xid), "%s", m->xid);
    c->seq++;
    send_branch(c, 1);
    return;
  case ST_BRANCH1:
  case ST_BRANCH2:
    if (code != 0) {
      note_error(c, "branch register", code);
      send_end(c, false);
    } else if (c->state == ST_BRANCH1) {
      send_branch(c, 2);
    } else {
      send_end(c, true);
    }
    return;
  case ST_COMMIT:
    if (code != 0 || m->global_status != TXP_GS_COMMITTED) note_error(c, "commit", code ? code : TXP_EINTERNAL);
    else record(c);
    next_tx(c);
    return;
  case ST_ROLLBACK:
    next_tx(c);
    return;
  default:
    return; /* not waiting: a late answer */
  }
}

/* The minimal RM: every phase-two request succeeds. */
static void serve(client_t *c, const txp_msg_t *req) {
  txp_msg_t res;
  txp_msg_init_result(&res, req, 0, NULL);
  if (req->type == TXP_MSG_BRANCH_COMMIT) txp_msg_set_int(&res, TXP_F_BRANCH_STATUS, TXP_BS_PHASE2_COMMITTED);
  else if (req->type == TXP_MSG_BRANCH_ROLLBACK)
    txp_msg_set_int(&res, TXP_F_BRANCH_STATUS, TXP_BS_PHASE2_ROLLBACKED);
  send_msg(c, &res, false);
}

static void drain(client_t *c) {
  while (c->state != ST_DEAD) {
    txp_msg_t m;
    txp_msg_init(&m, TXP_MSG_NONE);
    int rc = txp_decoder_next(c->dec, &m);
    if (rc == TXP_EAGAIN) return;
    if (rc != 0) {
      txp_msg_clear(&m);
      if (rc == TXP_EBAD_MAGIC || rc == TXP_EBAD_VERSION || rc == TXP_EFRAME_TOO_BIG) {
        note_error(c, "decode", rc);
        c->state = ST_DEAD;
        uv_read_stop((uv_stream_t *)&c->tcp);
        return;
      }
      continue;
    }
    bool answer = (m.flags & TXP_FLAG_RESPONSE) || m.type == TXP_MSG_ERROR;
    if (!answer) serve(c, &m);
    else if (m.request_id == c->want_id || m.type == TXP_MSG_ERROR) on_answer(c, &m);
    txp_msg_clear(&m);
  }
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  (void)suggested;
  client_t *c = h->data;
  *buf = uv_buf_init(c->lc->rbuf, sizeof(c->lc->rbuf));
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf) {
  client_t *c = s->data;
  if (n < 0) {
    if (c->state != ST_IDLE || !c->lc->stopping) note_error(c, "connection", TXP_ECONN_LOST);
    c->state = ST_DEAD;
    uv_read_stop(s);
    return;
  }
  if (n == 0) return;
  int rc = txp_decoder_feed(c->dec, buf->base, (size_t)n);
  if (rc != 0) {
    note_error(c, "decode", rc);
    c->state = ST_DEAD;
    uv_read_stop(s);
    return;
  }
  drain(c);
}

static void on_connect(uv_connect_t *req, int status) {
  client_t *c = req->data;
  if (status != 0) {
    snprintf(c->pub->first_error, sizeof(c->pub->first_error), "connect %s:%d: %s", c->pub->host,
             c->pub->port, uv_strerror(status));
    c->pub->errors++;
    c->state = ST_DEAD;
    return;
  }
  uv_tcp_nodelay(&c->tcp, 1);
  if (uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) != 0) {
    note_error(c, "read", TXP_ECONN_LOST);
    c->state = ST_DEAD;
    return;
  }
  char client_id[64];
  snprintf(client_id, sizeof(client_id), "bench-%d", c->pub->id);
  txp_msg_t m;
  txp_msg_init(&m, TXP_MSG_REGISTER_RM);
  txp_msg_set_str(&m, TXP_F_APP_ID, "tc-bench");
  txp_msg_set_str(&m, TXP_F_CLIENT_ID, client_id);
  if (c->lc->token) txp_msg_set_str(&m, TXP_F_TOKEN, c->lc->token);
  txp_msg_set_str(&m, TXP_F_RESOURCE_IDS, "bench_db1,bench_db2");
  c->state = ST_REGISTER;
  send_msg(c, &m, true);
}

static void on_tick(uv_timer_t *t) {
  loop_ctx_t *lc = t->data;
  if (atomic_load(lc->phase) < 2) return;
  if (!lc->stopping) {
    lc->stopping = true;
    lc->stop_at = txc_now_ms() + GRACE_MS;
    return;
  }
  if (txc_now_ms() < lc->stop_at) return;
  uv_timer_stop(t);
  uv_close((uv_handle_t *)t, NULL);
  for (int i = 0; i < lc->n; i++) {
    if (!lc->c[i].open) continue;
    uv_close((uv_handle_t *)&lc->c[i].tcp, NULL);
    uv_close((uv_handle_t *)&lc->c[i].backoff, NULL);
  }
}

int bench_load_run(bench_client_t *clients, int n, const char *token, const atomic_int *phase) {
  loop_ctx_t *lc = calloc(1, sizeof(*lc));
  client_t *c = calloc((size_t)n, sizeof(client_t));
  if (!lc || !c || uv_loop_init(&lc->loop) != 0) {
    free(lc);
    free(c);
    return -1;
  }
  lc->c = c;
  lc->n = n;
  lc->token = token;
  lc->phase = phase;
  uv_timer_init(&lc->loop, &lc->tick);
  lc->tick.data = lc;
  uv_timer_start(&lc->tick, on_tick, TICK_MS, TICK_MS);
  for (int i = 0; i < n; i++) {
    client_t *x = &c[i];
    x->pub = &clients[i];
    x->lc = lc;
    x->next_id = 1;
    x->state = ST_DEAD;
    txp_buf_init(&x->out, 0);
    struct sockaddr_in sa;
    if (!(x->dec = txp_decoder_new(NULL)) || uv_ip4_addr(x->pub->host, x->pub->port, &sa) != 0) {
      snprintf(x->pub->first_error, sizeof(x->pub->first_error), "bad address %s:%d or out of memory",
               x->pub->host, x->pub->port);
      x->pub->errors++;
      continue;
    }
    uv_tcp_init(&lc->loop, &x->tcp);
    uv_timer_init(&lc->loop, &x->backoff);
    x->open = true;
    x->tcp.data = x;
    x->backoff.data = x;
    x->connect.data = x;
    x->state = ST_CONNECTING;
    if (uv_tcp_connect(&x->connect, &x->tcp, (const struct sockaddr *)&sa, on_connect) != 0) {
      note_error(x, "connect", TXP_ECONN_LOST);
      x->state = ST_DEAD;
    }
  }
  uv_run(&lc->loop, UV_RUN_DEFAULT);
  uv_loop_close(&lc->loop);
  for (int i = 0; i < n; i++) {
    txp_decoder_free(c[i].dec);
    txp_buf_free(&c[i].out);
  }
  free(c);
  free(lc);
  return 0;
}
