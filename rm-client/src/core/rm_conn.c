/*
 * rm_conn.c - one coordinator connection of librmclient (see rm_conn.h for
 * the session lifecycle), the pure routing helpers and the log sink.
 *
 * NOTES
 *   Handles.  A connection embeds two timers (the state timer: backoff,
 *   connect and registration timeouts; the heartbeat timer) that live as
 *   long as it does, and one uv_tcp_t per session.  A session's handle is
 *   closed with uv_close() and only re-initialized after its close
 *   callback, which is also where the owner hears that the session ended:
 *   a session never ends inside one of the owner's own calls (not even
 *   inside rm__conn_send), so the owner never reroutes while it iterates.
 *
 *   Sent or not.  'enc_total' counts bytes ever encoded on this connection
 *   and 'handed_total' bytes ever handed to the kernel or to a successful
 *   uv_write() (txc_uv_write).  A frame whose end lies at or before
 *   'handed_total' may have reached the coordinator; one beyond it was
 *   discarded with the session's queue and certainly did not.  A new
 *   session starts with enc_total = handed_total.
 *
 *   Logging: a failing node is reported once per failure streak (warn),
 *   then at debug level, so a node that is down for an hour does not flood
 *   the caller's log.
 *
 *   Thread: the loop thread (helpers and logger: any thread).
 */
#include "rm_conn.h"
#include "rm_util.h"
#include "txc_uvwrite.h"
#include "txp_xid.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CONN_READ_BUF (32u * 1024u)
#define CONN_OUT_CAP (4u * 1024u * 1024u) /* queued bytes before we give up */
#define CONN_WBUF_KEEP (256u * 1024u)     /* keep a write buffer up to this */
#define BACKOFF_MIN_MS 100u
#define BACKOFF_MAX_MS 5000u

typedef enum {
  CONN_NEW = 0,     /* allocated, no handle yet */
  CONN_IDLE,        /* between sessions: the state timer runs the backoff */
  CONN_RESOLVING,   /* uv_getaddrinfo in flight */
  CONN_CONNECTING,  /* uv_tcp_connect in flight */
  CONN_REGISTERING, /* RegisterTM/RM sent, not answered */
  CONN_READY,       /* registered: the owner may send */
  CONN_CLOSING,     /* uv_close(tcp) called, close callback pending */
  CONN_STOPPED,     /* rm__conn_close() called, session over */
} conn_state_t;

struct rm_conn {
  uv_loop_t *loop;
  rm_conn_opts_t o;
  conn_state_t state;
  char addr[RM_ADDR_MAX];      /* as configured */
  char host[RM_ADDR_MAX];
  char port_str[8];
  char advertise[RM_ADDR_MAX]; /* learned from the xids it creates, or "" */
  bool numeric;                /* host is an IP literal: no resolution */
  struct sockaddr_storage sa;

  bool stopping;    /* rm__conn_close() was called */
  bool auth_failed; /* the last registration was refused with TXP_EAUTH */
  bool warned;      /* this failure streak was already logged as a warning */
  bool was_ready;   /* the closing session had been registered */
  bool rereg_wanted;
  int end_reason;
  unsigned failures; /* consecutive failed sessions, for the backoff */
  uint32_t rng;
  uint64_t session;
  uint64_t reg_id;   /* request id of the registration in flight, or 0 */
  uint64_t last_rx;  /* ms (uv_hrtime) of the last whole frame received */

  uv_timer_t timer;
  uv_timer_t hb;
  uv_tcp_t tcp;
  bool tcp_open;     /* tcp initialized and its close callback not yet run */
  int open_handles;  /* timers + tcp not yet closed */
  uv_connect_t connect_req;
  uv_getaddrinfo_t gai;
  bool resolving;
  uv_write_t write_req;
  bool writing;

  txp_decoder_t *dec;
  txp_buf_t out;  /* encoded, not yet handed to uv_write */
  txp_buf_t wbuf; /* bytes of the write in flight */
  uint64_t enc_total;
  uint64_t handed_total;

  void (*close_done)(rm_conn_t *c, void *arg);
  void *close_arg;
  char rbuf[CONN_READ_BUF];
};

#define CONN_LOG(c, lvl, ...) RM_LOGGER((c)->o.log, (lvl), __VA_ARGS__)

/* -------------------------------------------------------- pure helpers */

static bool all_digits(const char *s, size_t n) {
  if (n == 0) return false;
  for (size_t i = 0; i < n; i++)
    if (s[i] < '0' || s[i] > '9') return false;
  return true;
}

int rm__addr_parse(const char *addr, char *host, size_t hostcap, int *port) {
  const char *h, *hend, *p;
  if (!addr || !host || hostcap == 0 || !port) return -1;
  if (addr[0] == '[') {
    h = addr + 1;
    hend = strchr(h, ']');
    if (!hend || hend[1] != ':') return -1;
    p = hend + 2;
  } else {
    hend = strrchr(addr, ':');
    if (!hend) return -1;
    h = addr;
    p = hend + 1;
    if (memchr(h, ':', (size_t)(hend - h))) return -1; /* bare IPv6: brackets required */
  }
  size_t hlen = (size_t)(hend - h);
  size_t plen = strlen(p);
  if (hlen == 0 || hlen >= hostcap || plen > 5 || !all_digits(p, plen)) return -1;
  int v = atoi(p);
  if (v < 1 || v > 65535) return -1;
  for (size_t i = 0; i < hlen; i++)
    if ((unsigned char)h[i] <= ' ' || h[i] == ',' || h[i] == '[' || h[i] == ']') return -1;
  memcpy(host, h, hlen);
  host[hlen] = '\0';
  *port = v;
  return 0;
}

int rm__nodes_parse(const char *list, rm_addr_t *out, int max) {
  int n = 0;
  if (!list || !out || max <= 0) return -1;
  const char *p = list;
  for (;;) {
    const char *end = strchr(p, ',');
    if (!end) end = p + strlen(p);
    const char *a = p, *b = end;
    while (a < b && (*a == ' ' || *a == '\t')) a++;
    while (b > a && (b[-1] == ' ' || b[-1] == '\t')) b--;
    size_t len = (size_t)(b - a);
    if (len == 0 || len >= RM_ADDR_MAX) return -1;
    if (n == max) return -2;
    char host[RM_ADDR_MAX];
    int port;
    memcpy(out[n].addr, a, len);
    out[n].addr[len] = '\0';
    if (rm__addr_parse(out[n].addr, host, sizeof(host), &port) != 0) return -1;
    n++;
    if (*end == '\0') break;
    p = end + 1;
  }
  return n;
}

int rm__xid_node(const char *xid, char *out, size_t cap) {
  char host[RM_ADDR_MAX], node[RM_ADDR_MAX];
  int port;
  if (!out || cap == 0 || txp_xid_parse(xid, node, sizeof(node), NULL, NULL) != 0) return -1;
  size_t n = strlen(node);
  if (n >= cap || rm__addr_parse(node, host, sizeof(host), &port) != 0) return -1;
  memcpy(out, node, n + 1);
  return 0;
}

unsigned rm__backoff_ms(unsigned failures, unsigned min_ms, unsigned max_ms, uint32_t rnd) {
  if (failures == 0) return 0;
  if (max_ms < min_ms) max_ms = min_ms;
  uint64_t base = min_ms;
  for (unsigned i = 1; i < failures && base < max_ms; i++) base *= 2;
  if (base > max_ms) base = max_ms;
  uint64_t half = base / 2;
  return (unsigned)(half + rnd % (base - half + 1));
}

uint32_t rm__rand32(uint32_t *state) {
  uint32_t x = *state ? *state : 0x9E3779B9u;
  x ^= x << 13;
  x ^= x >> 17;
  x ^= x << 5;
  *state = x;
  return x;
}

/* ------------------------------------------------------------ sessions */


static void session_begin(rm_conn_t *c);
static void conn_flush(rm_conn_t *c);
static void on_timer(uv_timer_t *t);
static void on_heartbeat(uv_timer_t *t);

static void maybe_finish(rm_conn_t *c) {
  if (!c->stopping || c->open_handles > 0 || c->resolving || !c->close_done) return;
  void (*done)(rm_conn_t *, void *) = c->close_done;
  c->close_done = NULL;
  done(c, c->close_arg);
}

static void on_handle_close(uv_handle_t *h) {
  rm_conn_t *c = h->data;
  c->open_handles--;
  maybe_finish(c);
}

/* A failed attempt, or a session over: wait, then try again. */
static void schedule_retry(rm_conn_t *c) {
  c->failures++;
  unsigned delay = rm__backoff_ms(c->failures, BACKOFF_MIN_MS, BACKOFF_MAX_MS, rm__rand32(&c->rng));
  c->state = CONN_IDLE;
  CONN_LOG(c, RM_LOG_DEBUG, "next connection attempt to coordinator \"%s\" in %u ms", c->addr, delay);
  uv_timer_start(&c->timer, on_timer, delay, 0);
}

/* Log a failure: a warning for the first of a streak, then debug. */
static void log_failure(rm_conn_t *c, const char *what) {
  if (c->warned) {
    CONN_LOG(c, RM_LOG_DEBUG, "%s", what);
  } else {
    c->warned = true;
    CONN_LOG(c, RM_LOG_WARN, "%s; retrying with backoff", what);
  }
}

/* An attempt that failed before any TCP handle existed. */
static void attempt_failed(rm_conn_t *c, const char *what) {
  log_failure(c, what);
  schedule_retry(c);
}

static void on_tcp_close(uv_handle_t *h) {
  rm_conn_t *c = h->data;
  bool was_ready = c->was_ready;
  int reason = c->end_reason;
  c->tcp_open = false;
  c->open_handles--;
  c->was_ready = false;
  c->writing = false;
  c->reg_id = 0;
  c->rereg_wanted = false;
  txp_decoder_free(c->dec);
  c->dec = NULL;
  txp_buf_free(&c->out);
  txp_buf_free(&c->wbuf);
  txp_buf_init(&c->out, CONN_OUT_CAP);
  txp_buf_init(&c->wbuf, 0);
  if (c->stopping) {
    c->state = CONN_STOPPED;
    maybe_finish(c);
    return;
  }
  if (was_ready) c->failures = 0; /* a registered session ended: start the backoff over */
  schedule_retry(c);
  c->o.cbs->on_down(c, was_ready, reason, c->o.arg);
}

/*
 * End the current session: close its handle.  What is queued is dropped;
 * the owner hears of it from the close callback.  'what' (may be NULL) is
 * logged: as a warning when a registered session is lost, else as a
 * failed attempt.  Idempotent.
 */
static void session_end(rm_conn_t *c, int reason, const char *what) {
  if (!c->tcp_open || c->state == CONN_CLOSING || c->state == CONN_STOPPED) return;
  c->was_ready = c->state == CONN_READY;
  c->end_reason = reason;
  if (what) {
    if (c->was_ready) {
      c->warned = true; /* the reconnect failures that follow are the same story */
      CONN_LOG(c, RM_LOG_WARN, "%s", what);
    } else {
      log_failure(c, what);
    }
  }
  c->state = CONN_CLOSING;
  uv_timer_stop(&c->timer);
  uv_timer_stop(&c->hb);
  uv_close((uv_handle_t *)&c->tcp, on_tcp_close);
}

/* session_end for a lost connection, 'fmt' (printf) saying why. */
static void session_lost(rm_conn_t *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void session_lost(rm_conn_t *c, const char *fmt, ...) {
  char what[RM_ADDR_MAX + 128];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof(what), fmt, ap);
  va_end(ap);
  session_end(c, TXP_ECONN_LOST, what);
}

/* Encode 'm' and start writing it; no state check (registration uses it). */
static int conn_encode(rm_conn_t *c, const txp_msg_t *m, uint64_t *wire_end) {
  size_t before = c->out.len;
  int rc = txp_encode(m, &c->out, 0);
  if (rc == TXP_EBUFFER_FULL) {
    char what[RM_ADDR_MAX + 128];
    snprintf(what, sizeof(what),
             "closing connection to coordinator \"%s\": it is not reading (%zu bytes queued)",
             c->addr, c->out.len);
    session_end(c, TXP_ECONN_LOST, what);
    return TXP_ECONN_LOST;
  }
  if (rc != 0) return rc;
  c->enc_total += c->out.len - before;
  if (wire_end) *wire_end = c->enc_total;
  conn_flush(c);
  return 0;
}

/* The write buffer's bytes are with the kernel. */
static void wbuf_written(rm_conn_t *c) {
  if (c->wbuf.alloc > CONN_WBUF_KEEP) txp_buf_free(&c->wbuf); /* after a burst */
  else txp_buf_reset(&c->wbuf);
}

static void on_write(uv_write_t *req, int status) {
  rm_conn_t *c = req->data;
  c->writing = false;
  wbuf_written(c);
  if (c->state == CONN_CLOSING || c->state == CONN_STOPPED || !c->tcp_open) return;
  if (status < 0) {
    session_lost(c, "lost connection to coordinator \"%s\": could not write: %s",
                 c->addr, uv_strerror(status));
    return;
  }
  if (c->out.len > 0) conn_flush(c);
}

/* Hand everything queued to the kernel (txc_uv_write: at once if it takes
 * it, else one uv_write), unless a write is in flight. */
static void conn_flush(rm_conn_t *c) {
  if (c->writing || c->out.len == 0 || !c->tcp_open || c->state == CONN_CLOSING) return;
  txp_buf_t tmp = c->wbuf;
  c->wbuf = c->out;
  c->out = tmp;
  c->out.cap = CONN_OUT_CAP;
  c->wbuf.cap = 0;
  txp_buf_reset(&c->out);
  c->write_req.data = c;
  int rc = txc_uv_write(&c->write_req, (uv_stream_t *)&c->tcp, c->wbuf.data, c->wbuf.len, on_write);
  if (rc < 0) {
    char what[RM_ADDR_MAX + 96];
    snprintf(what, sizeof(what), "lost connection to coordinator \"%s\": could not write: %s",
             c->addr, uv_strerror(rc));
    txp_buf_reset(&c->wbuf);
    session_end(c, TXP_ECONN_LOST, what);
    return;
  }
  c->handed_total += c->wbuf.len;
  if (rc == 1) wbuf_written(c);
  else c->writing = true;
}

/* RegisterRM when the owner serves resources, else RegisterTM.  Either
 * one lets the connection carry TM requests too. */
static void send_register(rm_conn_t *c) {
  char ids[TXP_MAX_RESOURCE_IDS_LEN + 1];
  ids[0] = '\0';
  if (c->o.cbs->resource_ids && c->o.cbs->resource_ids(ids, sizeof(ids), c->o.arg) < 0) {
    CONN_LOG(c, RM_LOG_WARN, "could not list the resource ids to register with \"%s\": registering as TM only",
         c->addr);
    ids[0] = '\0';
  }
  ids[sizeof(ids) - 1] = '\0';
  txp_msg_t m;
  txp_msg_init(&m, ids[0] ? TXP_MSG_REGISTER_RM : TXP_MSG_REGISTER_TM);
  txp_msg_set_str(&m, TXP_F_APP_ID, c->o.app_id);
  txp_msg_set_str(&m, TXP_F_CLIENT_ID, c->o.client_id);
  txp_msg_set_str(&m, TXP_F_TOKEN, c->o.token);
  if (ids[0]) txp_msg_set_str(&m, TXP_F_RESOURCE_IDS, ids);
  m.request_id = ++*c->o.next_request_id;
  int rc = conn_encode(c, &m, NULL);
  if (rc != 0) {
    session_lost(c, "could not register with coordinator \"%s\": %s", c->addr,
                 txp_strerror(rc));
    return;
  }
  c->reg_id = m.request_id;
}

static void on_register_result(rm_conn_t *c, const txp_msg_t *m) {
  int code = (m->code < 0 && m->code >= INT32_MIN) ? (int)m->code : (m->code ? TXP_EINTERNAL : 0);
  char what[RM_ADDR_MAX + TXP_MAX_MESSAGE_LEN + 64];
  c->reg_id = 0;
  if (code == 0) {
    if (c->state == CONN_REGISTERING) {
      c->state = CONN_READY;
      c->failures = 0;
      c->auth_failed = false;
      c->warned = false;
      c->last_rx = rm__mono_ms();
      uv_timer_stop(&c->timer);
      uv_timer_start(&c->hb, on_heartbeat, c->o.heartbeat_ms, c->o.heartbeat_ms);
      CONN_LOG(c, RM_LOG_INFO, "connected to coordinator \"%s\" (node %u, %s)", c->addr,
           (unsigned)m->node_id, m->server_version ? m->server_version : "unknown version");
      c->o.cbs->on_ready(c, c->o.arg);
    } else {
      CONN_LOG(c, RM_LOG_DEBUG, "registered again with coordinator \"%s\"", c->addr);
    }
    if (c->rereg_wanted && c->state == CONN_READY) {
      c->rereg_wanted = false;
      send_register(c);
    }
    return;
  }
  snprintf(what, sizeof(what), "could not register with coordinator \"%s\": %s", c->addr,
           m->message ? m->message : txp_strerror(code));
  if (code == TXP_EAUTH) {
    /* Not a network problem: say it loudly, once per streak. */
    if (!c->auth_failed) CONN_LOG(c, RM_LOG_ERROR, "%s; check the configured token", what);
    c->auth_failed = true;
    c->warned = true;
    session_end(c, TXP_EAUTH, NULL);
    return;
  }
  session_end(c, TXP_ECONN_LOST, what);
}

/* Answer a request from the coordinator that this layer serves itself. */
static void answer(rm_conn_t *c, const txp_msg_t *req, int code, const char *message) {
  if (req->flags & TXP_FLAG_ONEWAY) return;
  txp_msg_t res;
  txp_msg_init_result(&res, req, code, message);
  conn_encode(c, &res, NULL);
}

static void handle_frame(rm_conn_t *c, txp_msg_t *m) {
  bool response = (m->flags & TXP_FLAG_RESPONSE) || !txp_msg_type_is_request(m->type);
  if (response) {
    if (c->reg_id && m->request_id == c->reg_id) {
      on_register_result(c, m);
      return;
    }
    if (m->type == TXP_MSG_HEARTBEAT_RESULT) return;
    if (c->state == CONN_READY) c->o.cbs->on_frame(c, m, c->o.arg);
    return;
  }
  if (m->type == TXP_MSG_HEARTBEAT) {
    answer(c, m, 0, NULL);
    return;
  }
  if (c->state != CONN_READY) {
    answer(c, m, TXP_ENOT_REGISTERED, "client not registered yet");
    return;
  }
  c->o.cbs->on_frame(c, m, c->o.arg);
}

/* A well-framed frame with an invalid body. */
static void handle_body_error(rm_conn_t *c, const txp_msg_t *hdr, int rc) {
  char what[RM_ADDR_MAX + 128];
  CONN_LOG(c, RM_LOG_WARN, "invalid %s frame from coordinator \"%s\": %s",
       txp_msg_type_name(hdr->type), c->addr, txp_strerror(rc));
  if (hdr->flags & TXP_FLAG_RESPONSE) {
    if (c->reg_id && hdr->request_id == c->reg_id) {
      snprintf(what, sizeof(what), "could not register with coordinator \"%s\": invalid answer",
               c->addr);
      session_end(c, TXP_ECONN_LOST, what);
    } else if (c->state == CONN_READY) {
      c->o.cbs->on_bad_response(c, hdr->request_id, rc, c->o.arg);
    }
    return;
  }
  if (hdr->type == TXP_MSG_ERROR || !txp_msg_type_is_request(hdr->type)) return;
  answer(c, hdr, rc, "invalid frame");
}

static void process(rm_conn_t *c) {
  while (c->state == CONN_REGISTERING || c->state == CONN_READY) {
    txp_msg_t m;
    txp_msg_init(&m, TXP_MSG_NONE);
    int rc = txp_decoder_next(c->dec, &m);
    if (rc == TXP_EAGAIN) break;
    if (rc == 0) {
      c->last_rx = rm__mono_ms();
      handle_frame(c, &m);
    } else if (rc == TXP_EBAD_MAGIC || rc == TXP_EBAD_VERSION || rc == TXP_EFRAME_TOO_BIG ||
               rc == TXP_EBUFFER_FULL || rc == TXP_ENOMEM) {
      session_lost(c, "closing connection to coordinator \"%s\": %s", c->addr,
                   txp_strerror(rc));
    } else {
      c->last_rx = rm__mono_ms();
      handle_body_error(c, &m, rc);
    }
    txp_msg_clear(&m);
  }
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  rm_conn_t *c = h->data;
  (void)suggested;
  *buf = uv_buf_init(c->rbuf, (unsigned)sizeof(c->rbuf));
}

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf) {
  rm_conn_t *c = st->data;
  if (nread == 0 || (c->state != CONN_REGISTERING && c->state != CONN_READY)) return;
  if (nread < 0) {
    char what[RM_ADDR_MAX + 96];
    if (nread == UV_EOF)
      snprintf(what, sizeof(what), "lost connection to coordinator \"%s\": closed by the peer",
               c->addr);
    else
      snprintf(what, sizeof(what), "lost connection to coordinator \"%s\": %s", c->addr,
               uv_strerror((int)nread));
    session_end(c, TXP_ECONN_LOST, what);
    return;
  }
  int rc = txp_decoder_feed(c->dec, buf->base, (size_t)nread);
  if (rc != 0) {
    session_lost(c, "closing connection to coordinator \"%s\": %s", c->addr,
                 txp_strerror(rc));
    return;
  }
  process(c);
}

static void on_connect(uv_connect_t *req, int status) {
  rm_conn_t *c = req->data;
  char what[RM_ADDR_MAX + 96];
  if (status == UV_ECANCELED || c->state != CONN_CONNECTING) return;
  if (status < 0) {
    snprintf(what, sizeof(what), "could not connect to coordinator \"%s\": %s", c->addr,
             uv_strerror(status));
    session_end(c, TXP_ECONN_LOST, what);
    return;
  }
  uv_tcp_nodelay(&c->tcp, 1);
  uv_tcp_keepalive(&c->tcp, 1, 60);
  c->dec = txp_decoder_new(NULL);
  if (!c->dec) {
    snprintf(what, sizeof(what), "could not connect to coordinator \"%s\": out of memory", c->addr);
    session_end(c, TXP_ECONN_LOST, what);
    return;
  }
  int rc = uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
  if (rc != 0) {
    snprintf(what, sizeof(what), "could not read from coordinator \"%s\": %s", c->addr,
             uv_strerror(rc));
    session_end(c, TXP_ECONN_LOST, what);
    return;
  }
  c->state = CONN_REGISTERING;
  send_register(c);
}

static void connect_addr(rm_conn_t *c, const struct sockaddr *sa) {
  char what[RM_ADDR_MAX + 96];
  int rc = uv_tcp_init(c->loop, &c->tcp);
  if (rc != 0) {
    snprintf(what, sizeof(what), "could not connect to coordinator \"%s\": %s", c->addr,
             uv_strerror(rc));
    attempt_failed(c, what);
    return;
  }
  c->tcp.data = c;
  c->tcp_open = true;
  c->open_handles++;
  c->session++;
  c->enc_total = c->handed_total;
  c->state = CONN_CONNECTING;
  c->connect_req.data = c;
  rc = uv_tcp_connect(&c->connect_req, &c->tcp, sa, on_connect);
  if (rc != 0) {
    snprintf(what, sizeof(what), "could not connect to coordinator \"%s\": %s", c->addr,
             uv_strerror(rc));
    session_end(c, TXP_ECONN_LOST, what);
    return;
  }
  /* Connecting and registering share one timeout. */
  uv_timer_start(&c->timer, on_timer, c->o.connect_timeout_ms, 0);
}

static void on_resolved(uv_getaddrinfo_t *req, int status, struct addrinfo *res) {
  rm_conn_t *c = req->data;
  c->resolving = false;
  if (c->stopping) {
    if (res) uv_freeaddrinfo(res);
    c->state = CONN_STOPPED;
    maybe_finish(c);
    return;
  }
  if (status < 0 || !res) {
    char what[RM_ADDR_MAX * 2 + 96];
    snprintf(what, sizeof(what), "could not resolve coordinator host \"%s\": %s", c->host,
             uv_strerror(status < 0 ? status : UV_EAI_NONAME));
    if (res) uv_freeaddrinfo(res);
    attempt_failed(c, what);
    return;
  }
  struct sockaddr_storage sa;
  memset(&sa, 0, sizeof(sa));
  memcpy(&sa, res->ai_addr, res->ai_addrlen < sizeof(sa) ? res->ai_addrlen : sizeof(sa));
  uv_freeaddrinfo(res);
  connect_addr(c, (const struct sockaddr *)&sa);
}

static void session_begin(rm_conn_t *c) {
  if (c->stopping) return;
  if (c->numeric) {
    connect_addr(c, (const struct sockaddr *)&c->sa);
    return;
  }
  /* Names are resolved on the thread pool, on every attempt (addresses
   * may move). */
  struct addrinfo hints;
  memset(&hints, 0, sizeof(hints));
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  c->gai.data = c;
  c->state = CONN_RESOLVING;
  int rc = uv_getaddrinfo(c->loop, &c->gai, on_resolved, c->host, c->port_str, &hints);
  if (rc != 0) {
    char what[RM_ADDR_MAX * 2 + 96];
    snprintf(what, sizeof(what), "could not resolve coordinator host \"%s\": %s", c->host,
             uv_strerror(rc));
    attempt_failed(c, what);
    return;
  }
  c->resolving = true;
}

/* The state timer: backoff over, or the connect/registration timeout. */
static void on_timer(uv_timer_t *t) {
  rm_conn_t *c = t->data;
  char what[RM_ADDR_MAX + 96];
  switch (c->state) {
  case CONN_IDLE:
    session_begin(c);
    break;
  case CONN_CONNECTING:
    snprintf(what, sizeof(what), "could not connect to coordinator \"%s\": timed out after %u ms",
             c->addr, c->o.connect_timeout_ms);
    session_end(c, TXP_ECONN_LOST, what);
    break;
  case CONN_REGISTERING:
    snprintf(what, sizeof(what),
             "could not register with coordinator \"%s\": no answer within %u ms", c->addr,
             c->o.connect_timeout_ms);
    session_end(c, TXP_ECONN_LOST, what);
    break;
  default:
    break;
  }
}

/* Every heartbeat interval: declare the session dead after two silent
 * intervals, else send a Heartbeat (its answer, like any frame, proves the
 * node alive). */
static void on_heartbeat(uv_timer_t *t) {
  rm_conn_t *c = t->data;
  if (c->state != CONN_READY) return;
  uint64_t silent = rm__mono_ms() - c->last_rx;
  if (silent >= 2 * (uint64_t)c->o.heartbeat_ms) {
    session_lost(c, "lost connection to coordinator \"%s\": no answer for %" PRIu64 " ms",
                 c->addr, silent);
    return;
  }
  txp_msg_t m;
  txp_msg_init(&m, TXP_MSG_HEARTBEAT);
  m.request_id = ++*c->o.next_request_id;
  conn_encode(c, &m, NULL);
}

/* ------------------------------------------------------------ the API */

int rm__conn_new(const rm_conn_opts_t *o, rm_conn_t **out) {
  *out = NULL;
  if (!o || !o->addr || strlen(o->addr) >= RM_ADDR_MAX) return RM_E_INVALID;
  rm_conn_t *c = calloc(1, sizeof(*c));
  if (!c) return RM_E_NOMEM;
  c->o = *o;
  c->loop = o->loop;
  snprintf(c->addr, sizeof(c->addr), "%s", o->addr);
  int port;
  if (rm__addr_parse(c->addr, c->host, sizeof(c->host), &port) != 0) {
    free(c);
    return RM_E_INVALID;
  }
  snprintf(c->port_str, sizeof(c->port_str), "%d", port);
  if (strcmp(c->host, "localhost") == 0) snprintf(c->host, sizeof(c->host), "127.0.0.1");
  if (uv_ip4_addr(c->host, port, (struct sockaddr_in *)&c->sa) == 0 ||
      uv_ip6_addr(c->host, port, (struct sockaddr_in6 *)&c->sa) == 0)
    c->numeric = true;
  c->rng = (uint32_t)(uv_hrtime() ^ ((uintptr_t)c >> 4) ^ ((uint32_t)o->index * 0x9E3779B9u));
  if (c->rng == 0) c->rng = 1;
  if (c->o.connect_timeout_ms == 0) c->o.connect_timeout_ms = 3000;
  if (c->o.heartbeat_ms == 0) c->o.heartbeat_ms = 5000;
  txp_buf_init(&c->out, CONN_OUT_CAP);
  txp_buf_init(&c->wbuf, 0);
  c->state = CONN_NEW;
  *out = c;
  return 0;
}

void rm__conn_start(rm_conn_t *c) {
  if (c->state != CONN_NEW || c->stopping) return;
  uv_timer_init(c->loop, &c->timer);
  uv_timer_init(c->loop, &c->hb);
  c->timer.data = c->hb.data = c;
  c->open_handles = 2;
  c->state = CONN_IDLE;
  session_begin(c);
}

void rm__conn_close(rm_conn_t *c, void (*done)(rm_conn_t *, void *), void *arg) {
  if (c->stopping) return;
  c->stopping = true;
  c->close_done = done;
  c->close_arg = arg;
  if (c->state == CONN_NEW) {
    c->state = CONN_STOPPED;
    maybe_finish(c);
    return;
  }
  if (c->resolving) uv_cancel((uv_req_t *)&c->gai); /* its callback still runs */
  if (c->tcp_open && c->state != CONN_CLOSING) {
    c->was_ready = false;
    c->state = CONN_CLOSING;
    uv_close((uv_handle_t *)&c->tcp, on_tcp_close);
  } else if (!c->tcp_open && !c->resolving) {
    c->state = CONN_STOPPED;
  }
  uv_close((uv_handle_t *)&c->timer, on_handle_close);
  uv_close((uv_handle_t *)&c->hb, on_handle_close);
}

void rm__conn_free(rm_conn_t *c) {
  if (!c) return;
  txp_decoder_free(c->dec);
  txp_buf_free(&c->out);
  txp_buf_free(&c->wbuf);
  free(c);
}

int rm__conn_send(rm_conn_t *c, const txp_msg_t *m, uint64_t *wire_end) {
  if (c->state != CONN_READY) return TXP_ECONN_LOST;
  int rc = conn_encode(c, m, wire_end);
  if (rc == 0 && c->state != CONN_READY) return TXP_ECONN_LOST; /* closed while flushing */
  return rc;
}

bool rm__conn_sent(const rm_conn_t *c, uint64_t wire_end) { return wire_end <= c->handed_total; }

bool rm__conn_ready(const rm_conn_t *c) { return c->state == CONN_READY; }

bool rm__conn_auth_failed(const rm_conn_t *c) { return c->auth_failed; }

uint64_t rm__conn_session(const rm_conn_t *c) { return c->session; }

int rm__conn_index(const rm_conn_t *c) { return c->o.index; }

const char *rm__conn_addr(const rm_conn_t *c) { return c->addr; }

bool rm__conn_is_node(const rm_conn_t *c, const char *node_addr) {
  return strcmp(node_addr, c->addr) == 0 || (c->advertise[0] && strcmp(node_addr, c->advertise) == 0);
}

void rm__conn_learn_xid(rm_conn_t *c, const char *xid) {
  char a[RM_ADDR_MAX];
  if (!xid || rm__xid_node(xid, a, sizeof(a)) != 0) return;
  if (strcmp(a, c->addr) == 0 || strcmp(a, c->advertise) == 0) return;
  CONN_LOG(c, RM_LOG_DEBUG, "coordinator \"%s\" advertises itself as \"%s\"", c->addr, a);
  snprintf(c->advertise, sizeof(c->advertise), "%s", a);
}

void rm__conn_reregister(rm_conn_t *c) {
  if (c->state == CONN_REGISTERING || (c->state == CONN_READY && c->reg_id)) {
    c->rereg_wanted = true; /* after the registration in flight */
    return;
  }
  if (c->state == CONN_READY) send_register(c);
}
