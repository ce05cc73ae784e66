/*
 * tc_server.c - tcd's network side; see tc_server.h for the API.
 *
 * NOTES
 *   Everything here runs on the node's single libuv loop; nothing blocks.
 *
 *   Handles.  The server embeds five handles: the listener, two sweep timers
 *   (idle connections every heartbeat/2, pending TC->RM calls every 50 ms
 *   while any exist) and a prepare/check pair that flushes write queues.
 *   Each connection embeds its uv_tcp_t.  tc_server_stop() closes them all;
 *   the server is freed right after 'done' returns, from the close callback
 *   of the last handle.
 *
 *   Connection lifecycle:
 *     1. OPEN: accepted, reading, decoding.  Counted in 'connections'.
 *     2. DRAINING (optional): a final answer (auth failure, not registered,
 *        bad version) is queued; new frames are read and discarded, and the
 *        write side is shut down once the queue is written.  The peer's EOF,
 *        or a linger of one heartbeat interval, leads to 3.  Reading on
 *        instead of closing at once keeps the kernel from answering the
 *        peer's unread bytes with a RST that could destroy our last frame.
 *     3. CLOSED: uv_close() was called.  Its close callback fails pending
 *        calls (TXP_ECONN_LOST, or TXP_ESHUTDOWN during stop), reports an RM
 *        as gone, unlinks the connection from the server and sets
 *        conn->server to NULL: a closed connection never touches the server
 *        again, so it may outlive it.
 *   The handle holds one reference from accept to its close callback;
 *   requests in flight and callers of tc_conn_ref() hold others.  The struct
 *   is freed at the last unref, which therefore never happens inside one of
 *   its own libuv callbacks.
 *
 *   Writes.  Frames are encoded into conn->out (bounded: a peer that lets
 *   CONN_OUT_CAP bytes pile up is not reading and is closed).  Producing a
 *   frame only marks the connection dirty; the prepare handle (before the
 *   loop blocks) and the check handle (right after poll) hand everything a
 *   loop iteration produced to the kernel in one go: uv_try_write when the
 *   socket takes it all (txc_uvwrite.h: no request, no callback, and none
 *   of the epoll_ctl a completed uv_write costs), else a single uv_write.
 *   At most one write is in flight per connection: its bytes sit in
 *   conn->wbuf until its callback.
 *
 *   Calls from the TC to RMs get request ids from one per-server counter,
 *   are found by id in a small hash table when the answer comes, and sit on
 *   their connection's list so that a lost connection can fail them.
 *   Timeouts are found by the 50 ms sweep, so a call may run up to 50 ms
 *   past its deadline.  Call callbacks never run inside tc_conn_call().
 */
#include "tc_server.h"

#include <arpa/inet.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tc_config.h"
#include "tc_creds.h"
#include "tc_log.h"
#include "txc_idtable.h"
#include "txc_uvwrite.h"

#define TC_SERVER_VERSION "txc/0.1"

#define CONN_READ_BUF (32u * 1024u)
#define CONN_OUT_CAP (4u * 1024u * 1024u) /* queued bytes before we give up */
#define CONN_WBUF_KEEP (256u * 1024u)     /* keep a write buffer up to this */
#define CONN_MAX_BAD_FRAMES 100
#define LISTEN_BACKLOG 511
#define CALL_SWEEP_MS 50
#define CALL_DEFAULT_TIMEOUT_MS 30000u
#define DEFAULT_MAX_CONNECTIONS 1024
#define DEFAULT_MAX_INFLIGHT 256
#define DEFAULT_HEARTBEAT_MS 5000
#define SERVER_HANDLES 5 /* listener, idle timer, call timer, prepare, check */
#define CALL_HASH_BITS_MIN 6

typedef enum { CONN_OPEN, CONN_DRAINING, CONN_CLOSED } conn_state_t;
typedef enum { ROLE_NONE, ROLE_TM, ROLE_RM } conn_role_t;

/* One TC->RM call waiting for its *_RESULT. */
typedef struct tc_call {
  txc_idnode_t node;     /* in the server's table; node.id is the request id */
  uint16_t expect_type;  /* the request type + 1 */
  uint64_t deadline;     /* uv_now() milliseconds */
  tc_call_cb cb;
  void *arg;
  tc_conn_t *conn;
  struct tc_call *prev, *next; /* conn->calls */
} tc_call_t;

struct tc_conn {
  uv_tcp_t tcp; /* data = this */
  uv_write_t write_req;
  uv_shutdown_t shutdown_req;
  tc_server_t *server;          /* NULL once the handle's close callback ran */
  tc_conn_t *prev, *next;       /* server->conns: every conn with a handle */
  tc_conn_t *dprev, *dnext;     /* server->dirty, iff 'dirty' */
  conn_state_t state;
  conn_role_t role;             /* ROLE_NONE until registered */
  bool dirty;
  bool counted;                 /* in server->nlive (accepted, not refused) */
  bool writing;                 /* write_req in flight */
  bool shutting_down;           /* shutdown_req issued */
  bool warned;                  /* one warning per connection for bad input */
  int refs;
  int close_status;             /* what pending calls fail with */
  int inflight;                 /* tc_req_t not yet replied or dropped */
  int bad_frames;
  uint64_t last_active;         /* uv_now() of the last whole frame */
  uint64_t accepted_at;         /* uv_now() at accept: registration is due by then + 3 heartbeats */
  uint64_t drain_start;
  txp_decoder_t *dec;
  txp_buf_t out;                /* encoded, not yet handed to uv_write */
  txp_buf_t wbuf;               /* bytes of the write in flight */
  tc_call_t *calls;
  char *client_id;
  char *app_id;
  char *group;                  /* the application's group (tc_creds.h) */
  char **resource_ids;
  size_t n_resource_ids;
  char peer[80]; /* "[" INET6_ADDRSTRLEN "]:65535" */
  char rbuf[CONN_READ_BUF];
};

struct tc_server {
  uv_loop_t *loop;
  tc_server_opts_t opts; /* strings point at our copies below */
  char *host;
  char *token;                  /* NULL: no legacy token */
  size_t token_len;
  const tc_creds_t *creds;      /* borrowed; NULL: token only */
  uv_tcp_t listener;
  uv_timer_t idle_timer;
  uv_timer_t call_timer;
  uint64_t refusal_logged_at, refusals_unlogged; /* refusal_log's rate limit */
  uv_prepare_t prepare;
  uv_check_t check;
  int handles; /* server handles not yet closed */
  bool stopping;
  bool flushing; /* prepare/check started */
  void (*done)(void *arg);
  void *done_arg;
  int port;
  tc_conn_t *conns;
  tc_conn_t *dirty;
  txc_idtable_t calls; /* calls awaiting their answer, by request id */
  uint64_t next_request_id;
  int nlive, nrms, ntms;
  tc_server_stats_t st;
};

static void conn_close(tc_conn_t *c, int status);
static void conn_flush(tc_conn_t *c);

/* ------------------------------------------------------------ utilities */

static char *str_dup(const char *s) {
  size_t n = strlen(s) + 1;
  char *p = malloc(n);
  if (p) memcpy(p, s, n);
  return p;
}

/* Copy 'src' into 'dst' (size TXP_MAX_MESSAGE_LEN + 1), cut at a UTF-8
 * character boundary so that the encoder accepts it. */
static const char *message_fit(char *dst, const char *src) {
  size_t n = strlen(src);
  if (n <= TXP_MAX_MESSAGE_LEN) return src;
  n = TXP_MAX_MESSAGE_LEN;
  while (n > 0 && ((unsigned char)src[n] & 0xc0) == 0x80) n--;
  memcpy(dst, src, n);
  dst[n] = '\0';
  return dst;
}

static void peer_name(tc_conn_t *c) {
  struct sockaddr_storage ss;
  int len = (int)sizeof(ss);
  char ip[INET6_ADDRSTRLEN];
  snprintf(c->peer, sizeof(c->peer), "unknown");
  if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&ss, &len) != 0) return;
  if (ss.ss_family == AF_INET) {
    const struct sockaddr_in *a = (const struct sockaddr_in *)&ss;
    if (uv_ip4_name(a, ip, sizeof(ip)) == 0)
      snprintf(c->peer, sizeof(c->peer), "%s:%u", ip, (unsigned)ntohs(a->sin_port));
  } else if (ss.ss_family == AF_INET6) {
    const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)&ss;
    if (uv_ip6_name(a, ip, sizeof(ip)) == 0)
      snprintf(c->peer, sizeof(c->peer), "[%s]:%u", ip, (unsigned)ntohs(a->sin6_port));
  }
}

/* -------------------------------------------------------- the call table */

static void calls_insert(tc_server_t *s, tc_call_t *k) {
  txc_idtable_insert(&s->calls, &k->node);
  tc_conn_t *c = k->conn;
  k->prev = NULL;
  k->next = c->calls;
  if (c->calls) c->calls->prev = k;
  c->calls = k;
}

static tc_call_t *calls_find(const tc_server_t *s, uint64_t id) {
  txc_idnode_t *n = txc_idtable_find(&s->calls, id);
  return n ? TXC_IDTABLE_ELEM(n, tc_call_t, node) : NULL;
}

/* Take 'k' out of the table and its connection's list. */
static void calls_remove(tc_server_t *s, tc_call_t *k) {
  txc_idtable_remove(&s->calls, &k->node);
  if (k->prev) k->prev->next = k->next;
  else k->conn->calls = k->next;
  if (k->next) k->next->prev = k->prev;
  k->prev = k->next = NULL;
}

/* Complete every call still pending on 'c' with 'status'.  The calls are
 * unlinked first, so a callback may freely call tc_conn_call() again (on
 * another connection) or stop the server. */
static void conn_fail_calls(tc_conn_t *c, int status) {
  tc_call_t *list = NULL;
  while (c->calls) {
    tc_call_t *k = c->calls;
    calls_remove(c->server, k);
    k->next = list;
    list = k;
  }
  while (list) {
    tc_call_t *k = list;
    list = k->next;
    k->cb(status, NULL, k->arg);
    free(k);
  }
}

/* ------------------------------------------------------- server lifetime */

static void server_free(tc_server_t *s) {
  txc_idtable_free(&s->calls);
  free(s->host);
  free(s->token);
  free(s);
}

/* Called at the end of every close callback: once the last handle is gone
 * the stop is complete.  Must be the last use of 's' by the caller. */
static void server_maybe_finish(tc_server_t *s) {
  if (!s->stopping || s->handles > 0 || s->conns != NULL) return;
  void (*done)(void *) = s->done;
  void *arg = s->done_arg;
  s->done = NULL;
  if (done) done(arg);
  server_free(s);
}

static void on_server_handle_close(uv_handle_t *h) {
  tc_server_t *s = h->data;
  s->handles--;
  server_maybe_finish(s);
}

/* ---------------------------------------------------------- connections */

static tc_conn_t *conn_new(tc_server_t *s) {
  tc_conn_t *c = calloc(1, sizeof(*c));
  if (!c) return NULL;
  c->server = s;
  c->refs = 1; /* the handle's, released by on_conn_close */
  c->state = CONN_OPEN;
  c->close_status = TXP_ECONN_LOST;
  txp_buf_init(&c->out, CONN_OUT_CAP);
  txp_buf_init(&c->wbuf, 0);
  snprintf(c->peer, sizeof(c->peer), "unknown");
  return c;
}

static void conn_free_registration(tc_conn_t *c) {
  for (size_t i = 0; i < c->n_resource_ids; i++) free(c->resource_ids[i]);
  free(c->resource_ids);
  free(c->client_id);
  free(c->app_id);
  free(c->group);
  c->resource_ids = NULL;
  c->n_resource_ids = 0;
  c->client_id = c->app_id = c->group = NULL;
}

static void conn_free(tc_conn_t *c) {
  txp_decoder_free(c->dec);
  txp_buf_free(&c->out);
  txp_buf_free(&c->wbuf);
  conn_free_registration(c);
  free(c);
}

static void dirty_remove(tc_conn_t *c) {
  if (!c->dirty) return;
  tc_server_t *s = c->server;
  if (c->dprev) c->dprev->dnext = c->dnext;
  else s->dirty = c->dnext;
  if (c->dnext) c->dnext->dprev = c->dprev;
  c->dprev = c->dnext = NULL;
  c->dirty = false;
}

static void on_flush(tc_server_t *s) {
  while (s->dirty) {
    tc_conn_t *c = s->dirty;
    dirty_remove(c);
    conn_flush(c);
  }
  uv_prepare_stop(&s->prepare);
  uv_check_stop(&s->check);
  s->flushing = false;
}

static void on_prepare(uv_prepare_t *h) { on_flush(h->data); }
static void on_check(uv_check_t *h) { on_flush(h->data); }

/* Queue 'c' for the next flush point of this loop iteration. */
static void conn_mark_dirty(tc_conn_t *c) {
  tc_server_t *s = c->server;
  if (!c->dirty) {
    c->dirty = true;
    c->dprev = NULL;
    c->dnext = s->dirty;
    if (s->dirty) s->dirty->dprev = c;
    s->dirty = c;
  }
  if (!s->flushing && !s->stopping) {
    uv_prepare_start(&s->prepare, on_prepare);
    uv_check_start(&s->check, on_check);
    s->flushing = true;
  }
}

/* Leaving OPEN: the connection stops counting as live. */
static void conn_leave_open(tc_conn_t *c) {
  tc_server_t *s = c->server;
  if (!c->counted) return;
  c->counted = false;
  s->nlive--;
  s->st.closed++;
  if (c->role == ROLE_TM) s->ntms--;
  else if (c->role == ROLE_RM) s->nrms--;
}

static void on_conn_close(uv_handle_t *h) {
  tc_conn_t *c = h->data;
  tc_server_t *s = c->server;

  conn_fail_calls(c, c->close_status);
  if (c->role == ROLE_RM && s->opts.on_rm_change)
    s->opts.on_rm_change(c, false, s->opts.rm_change_arg);

  dirty_remove(c);
  if (c->prev) c->prev->next = c->next;
  else s->conns = c->next;
  if (c->next) c->next->prev = c->prev;
  c->prev = c->next = NULL;
  c->server = NULL;
  tc_conn_unref(c); /* the handle's reference */
  server_maybe_finish(s);
}

/*
 * Close 'c' now: unsent output is dropped.  Pending calls fail with
 * 'status' from the close callback, not from here, so that no user callback
 * runs inside whatever callback decided to close.  Idempotent.
 */
static void conn_close(tc_conn_t *c, int status) {
  if (c->state == CONN_CLOSED) return;
  conn_leave_open(c);
  c->state = CONN_CLOSED;
  c->close_status = status;
  dirty_remove(c);
  uv_close((uv_handle_t *)&c->tcp, on_conn_close);
}

static void on_shutdown(uv_shutdown_t *req, int status) {
  tc_conn_t *c = req->data;
  if (c->state == CONN_CLOSED) return;
  if (status < 0) conn_close(c, TXP_ECONN_LOST);
  /* else: wait for the peer's EOF, or the linger in the idle sweep */
}

/* A draining connection whose output is all handed to libuv shuts down its
 * write side (libuv waits for the write in flight). */
static void conn_maybe_shutdown(tc_conn_t *c) {
  if (c->state != CONN_DRAINING || c->shutting_down || c->out.len > 0) return;
  c->shutting_down = true;
  c->shutdown_req.data = c;
  int rc = uv_shutdown(&c->shutdown_req, (uv_stream_t *)&c->tcp, on_shutdown);
  if (rc != 0) conn_close(c, TXP_ECONN_LOST);
}

/* Send what is queued and close: the answer to a peer we refuse. */
static void conn_drain(tc_conn_t *c) {
  if (c->state != CONN_OPEN) return;
  conn_leave_open(c);
  c->state = CONN_DRAINING;
  c->drain_start = uv_now(c->server->loop);
  conn_maybe_shutdown(c);
}

/* The write buffer's bytes are with the kernel. */
static void wbuf_written(tc_conn_t *c) {
  if (c->wbuf.alloc > CONN_WBUF_KEEP) txp_buf_free(&c->wbuf); /* after a burst */
  else txp_buf_reset(&c->wbuf);
}

static void on_write(uv_write_t *req, int status) {
  tc_conn_t *c = req->data;
  c->writing = false;
  wbuf_written(c);
  if (c->state == CONN_CLOSED) return;
  if (status < 0) {
    TC_LOG(TC_LOG_DEBUG, NULL, "could not write to %s: %s", c->peer, uv_strerror(status));
    conn_close(c, TXP_ECONN_LOST);
    return;
  }
  if (c->out.len > 0) conn_mark_dirty(c); /* batch with this iteration's frames */
}

/* Hand everything queued to the kernel (txc_uv_write: at once if it takes
 * it, else one uv_write), unless a write is in flight. */
static void conn_flush(tc_conn_t *c) {
  if (c->state == CONN_CLOSED || c->writing) return;
  if (c->out.len > 0) {
    txp_buf_t tmp = c->wbuf;
    c->wbuf = c->out;
    c->out = tmp;
    c->out.cap = CONN_OUT_CAP;
    c->wbuf.cap = 0;
    txp_buf_reset(&c->out);
    c->write_req.data = c;
    int rc = txc_uv_write(&c->write_req, (uv_stream_t *)&c->tcp, c->wbuf.data, c->wbuf.len, on_write);
    if (rc < 0) {
      TC_LOG(TC_LOG_DEBUG, NULL, "could not write to %s: %s", c->peer, uv_strerror(rc));
      txp_buf_reset(&c->wbuf);
      conn_close(c, TXP_ECONN_LOST);
      return;
    }
    if (rc == 1) wbuf_written(c);
    else c->writing = true;
  }
  conn_maybe_shutdown(c);
}

/*
 * Encode 'm' onto the write queue of 'c'.  Returns 0; TXP_ECONN_LOST if the
 * connection no longer takes frames; TXP_EBUFFER_FULL if the queue is over
 * its cap, in which case the connection is closed; or an encoder error
 * (nothing queued, connection unchanged).
 */
static int conn_send(tc_conn_t *c, const txp_msg_t *m) {
  if (c->state != CONN_OPEN) return TXP_ECONN_LOST;
  tc_server_t *s = c->server;
  int rc = txp_encode(m, &c->out, s->opts.max_frame);
  if (rc == TXP_EBUFFER_FULL) {
    tc_log_warn("closing connection from %s: peer is not reading (%zu bytes queued)", c->peer,
                c->out.len);
    conn_close(c, TXP_ECONN_LOST);
    return rc;
  }
  if (rc != 0) return rc;
  s->st.frames_out++;
  conn_mark_dirty(c);
  return 0;
}

/* Answer request (or request header) 'req' with just a code and message. */
static void conn_reply_code(tc_conn_t *c, const txp_msg_t *req, int code, const char *message) {
  txp_msg_t res;
  txp_msg_init_result(&res, req, code, message);
  int rc = conn_send(c, &res);
  if (rc != 0 && c->state == CONN_OPEN)
    tc_log_warn("could not answer %s from %s: %s", txp_msg_type_name(req->type), c->peer,
                txp_strerror(rc));
}

/* First bad input on a connection is worth a warning; the rest is noise. */
static void conn_warn_once(tc_conn_t *c, const char *what, int code) {
  if (c->warned) {
    TC_LOG(TC_LOG_DEBUG, NULL, "%s from %s: %s", what, c->peer, txp_strerror(code));
    return;
  }
  c->warned = true;
  tc_log_warn("%s from %s: %s", what, c->peer, txp_strerror(code));
}

/* ------------------------------------------------------------- dispatch */

/* Split "a, b,c" into trimmed, non-empty strings. */
static int parse_resource_ids(const char *list, char ***out, size_t *n_out) {
  char **ids = NULL;
  size_t n = 0;
  const char *p = list ? list : "";
  while (*p) {
    const char *end = strchr(p, ',');
    if (!end) end = p + strlen(p);
    const char *a = p, *b = end;
    while (a < b && (*a == ' ' || *a == '\t')) a++;
    while (b > a && (b[-1] == ' ' || b[-1] == '\t')) b--;
    if (b > a) {
      char **grown = realloc(ids, (n + 1) * sizeof(*ids));
      char *id = malloc((size_t)(b - a) + 1);
      if (grown) ids = grown;
      if (!grown || !id) {
        free(id);
        for (size_t i = 0; i < n; i++) free(ids[i]);
        free(ids);
        return TXP_ENOMEM;
      }
      memcpy(id, a, (size_t)(b - a));
      id[b - a] = '\0';
      ids[n++] = id;
    }
    p = *end ? end + 1 : end;
  }
  *out = ids;
  *n_out = n;
  return 0;
}

/*
 * Who the peer is: the group of its application when its secret is right,
 * else NULL with the reason in '*why'.  An application listed in the
 * credentials file must present one of its own secrets; server.token
 * admits only applications that are not listed, into a group of their own
 * (TC_CREDS_TOKEN_GROUP), so that the shared token cannot reach a
 * credentialed application's transactions.
 */
static const char *authenticate(const tc_server_t *s, const txp_msg_t *m, const char **why) {
  if (!txp_msg_has(m, TXP_F_TOKEN) || m->token == NULL) {
    *why = "no secret given";
    return NULL;
  }
  const char *app = m->application_id ? m->application_id : "";
  bool known = false;
  if (s->creds) {
    const char *group = tc_creds_check(s->creds, app, m->token, &known);
    if (group) return group;
    if (known) {
      *why = "wrong secret for the application";
      return NULL;
    }
  }
  if (s->token && tc_creds_secret_equal(m->token, s->token, s->token_len)) return TC_CREDS_TOKEN_GROUP;
  *why = s->creds ? (s->token ? "unknown application or wrong token" : "unknown application")
                  : "wrong token";
  return NULL;
}

/*
 * RegisterTM / RegisterRM: authenticate the peer's application, remember
 * who the peer is (client id, application, group), and answer.  A wrong or
 * missing secret is answered AUTH and the connection is drained.
 * Registering again on the same connection replaces the identity (e.g. a
 * new resource list).
 */
static void conn_register(tc_conn_t *c, const txp_msg_t *m) {
  tc_server_t *s = c->server;
  bool rm = m->type == TXP_MSG_REGISTER_RM;
  const char *kind = rm ? "RM" : "TM";
  const char *why = NULL;

  const char *group = authenticate(s, m, &why);
  if (!group) {
    char text[128];
    s->st.auth_failures++;
    tc_log_warn("could not register %s \"%s\" of application \"%s\" from %s: authentication failed: %s",
                kind, m->client_id, m->application_id ? m->application_id : "", c->peer, why);
    snprintf(text, sizeof(text), "authentication failed: %s", why);
    conn_reply_code(c, m, TXP_EAUTH, text);
    conn_drain(c);
    return;
  }

  char **ids = NULL;
  size_t nids = 0;
  char *cid = str_dup(m->client_id);
  char *aid = str_dup(m->application_id);
  char *grp = str_dup(group);
  int rc = (cid && aid && grp) ? 0 : TXP_ENOMEM;
  if (rc == 0 && rm) rc = parse_resource_ids(m->resource_ids, &ids, &nids);
  if (rc != 0) {
    free(cid);
    free(aid);
    free(grp);
    tc_log_error("could not register %s \"%s\" from %s: out of memory", kind, m->client_id,
                 c->peer);
    conn_reply_code(c, m, TXP_ENOMEM, "could not register: out of memory");
    return;
  }

  conn_role_t was = c->role;
  if (was == ROLE_TM) s->ntms--;
  else if (was == ROLE_RM) s->nrms--;
  conn_free_registration(c);
  c->client_id = cid;
  c->app_id = aid;
  c->group = grp;
  c->resource_ids = ids;
  c->n_resource_ids = nids;
  c->role = rm ? ROLE_RM : ROLE_TM;
  if (rm) s->nrms++;
  else s->ntms++;

  txp_msg_t res;
  txp_msg_init_result(&res, m, 0, NULL);
  txp_msg_set_int(&res, TXP_F_NODE_ID, s->opts.node_id);
  txp_msg_set_int(&res, TXP_F_HEARTBEAT_MS, s->opts.heartbeat_ms);
  txp_msg_set_str(&res, TXP_F_SERVER_VERSION, TC_SERVER_VERSION);
  rc = conn_send(c, &res);
  if (rc != 0 && c->state == CONN_OPEN)
    tc_log_warn("could not answer %s registration from %s: %s", kind, c->peer, txp_strerror(rc));

  tc_log_info("registered %s \"%s\" of application \"%s\" (group \"%s\") from %s%s%s%s", kind, cid,
              aid, grp, c->peer, rm ? " with resources \"" : "", rm ? m->resource_ids : "",
              rm ? "\"" : "");
  /* Announce after the answer is queued: a handler that calls the RM at
   * once must not overtake its registration result. */
  if (s->opts.on_rm_change) {
    if (rm) s->opts.on_rm_change(c, true, s->opts.rm_change_arg);
    else if (was == ROLE_RM) s->opts.on_rm_change(c, false, s->opts.rm_change_arg);
  }
}

/* The answer to one of our calls (or an unsolicited *_RESULT / Error). */
static void conn_on_response(tc_conn_t *c, const txp_msg_t *m) {
  tc_server_t *s = c->server;
  tc_call_t *k = calls_find(s, m->request_id);
  if (!k || k->conn != c) {
    TC_LOG(TC_LOG_DEBUG, NULL, "ignoring %s for unknown request %" PRIu64 " from %s",
           txp_msg_type_name(m->type), m->request_id, c->peer);
    return;
  }
  calls_remove(s, k);
  if (m->type == k->expect_type) {
    k->cb(0, m, k->arg);
  } else if (m->type == TXP_MSG_ERROR) {
    int code = (m->code < 0 && m->code >= INT_MIN) ? (int)m->code : TXP_EINTERNAL;
    k->cb(code, NULL, k->arg);
  } else {
    tc_log_warn("could not match %s from %s to the %s it answers: outcome unknown",
                txp_msg_type_name(m->type), c->peer, txp_msg_type_name(k->expect_type - 1));
    k->cb(TXP_EUNKNOWN_OUTCOME, NULL, k->arg);
  }
  free(k);
}

/*
 * A well-framed frame whose body or header fields are invalid: answer it
 * with the specific error (the *_RESULT of a known request type, else an
 * Error frame) and keep the connection, unless it keeps doing this.
 * Answers and Error frames are never answered, so two peers cannot
 * ping-pong errors; a broken answer to one of our calls completes it with
 * TXP_EUNKNOWN_OUTCOME since the RM may have acted on it.
 */
static void conn_body_error(tc_conn_t *c, const txp_msg_t *hdr, int rc) {
  tc_server_t *s = c->server;
  char text[TXP_MAX_MESSAGE_LEN + 1];
  s->st.bad_frames++;
  if (++c->bad_frames > CONN_MAX_BAD_FRAMES) {
    tc_log_warn("closing connection from %s: more than %d invalid frames", c->peer,
                CONN_MAX_BAD_FRAMES);
    conn_close(c, TXP_ECONN_LOST);
    return;
  }
  conn_warn_once(c, "invalid frame", rc);

  if (hdr->flags & TXP_FLAG_RESPONSE) {
    tc_call_t *k = calls_find(s, hdr->request_id);
    if (k && k->conn == c) {
      calls_remove(s, k);
      k->cb(TXP_EUNKNOWN_OUTCOME, NULL, k->arg);
      free(k);
    }
    return;
  }
  if (hdr->type == TXP_MSG_ERROR) return;
  if (txp_msg_type_valid(hdr->type))
    snprintf(text, sizeof(text), "invalid %s frame: %s", txp_msg_type_name(hdr->type),
             txp_strerror(rc));
  else
    snprintf(text, sizeof(text), "invalid frame of type %u: %s", (unsigned)hdr->type,
             txp_strerror(rc));
  conn_reply_code(c, hdr, rc, text);
}

/* Another major version: say which one we speak, then drain. */
static void conn_bad_version(tc_conn_t *c, const txp_msg_t *hdr) {
  tc_server_t *s = c->server;
  char text[128];
  s->st.version_mismatches++;
  tc_log_warn("closing connection from %s: unsupported protocol version %u.%u", c->peer,
              (unsigned)hdr->ver_major, (unsigned)hdr->ver_minor);
  snprintf(text, sizeof(text), "unsupported protocol version %u.%u: this server speaks %d.x",
           (unsigned)hdr->ver_major, (unsigned)hdr->ver_minor, TXP_VERSION_MAJOR);
  txp_msg_t e;
  txp_msg_init(&e, TXP_MSG_ERROR);
  e.request_id = hdr->request_id;
  e.flags = TXP_FLAG_RESPONSE;
  txp_msg_set_int(&e, TXP_F_CODE, TXP_EBAD_VERSION);
  txp_msg_set_str(&e, TXP_F_MESSAGE, text);
  txp_msg_set_str(&e, TXP_F_SERVER_VERSION, TC_SERVER_VERSION);
  txp_msg_set_int(&e, TXP_F_NODE_ID, s->opts.node_id);
  conn_send(c, &e);
  conn_drain(c);
}

/* Garbage in the stream: nothing can be answered, close. */
static void conn_stream_error(tc_conn_t *c, int rc) {
  if (rc == TXP_ENOMEM) {
    tc_log_error("could not decode frame from %s: out of memory", c->peer);
  } else {
    c->server->st.bad_frames++;
    conn_warn_once(c, "closing connection", rc);
  }
  conn_close(c, TXP_ECONN_LOST);
}

/* Hand a request to the application; 'm' is moved into the tc_req_t. */
static void conn_dispatch_request(tc_conn_t *c, txp_msg_t *m) {
  tc_server_t *s = c->server;
  char text[128];
  if (!s->opts.on_request) {
    conn_reply_code(c, m, TXP_EBAD_REQUEST, "request type not served by this node");
    return;
  }
  if (c->inflight >= s->opts.max_inflight) {
    s->st.busy_replies++;
    snprintf(text, sizeof(text), "too many requests in flight on this connection (max %d)",
             s->opts.max_inflight);
    conn_reply_code(c, m, TXP_EBUSY, text);
    return;
  }
  tc_req_t *req = malloc(sizeof(*req));
  if (!req) {
    conn_reply_code(c, m, TXP_ENOMEM, "could not accept request: out of memory");
    return;
  }
  req->conn = c;
  req->msg = *m;
  req->received_ns = uv_hrtime();
  req->retried = false;
  txp_msg_init(m, TXP_MSG_NONE); /* moved */
  c->inflight++;
  tc_conn_ref(c);
  s->opts.on_request(req, s->opts.request_arg);
}

static void conn_dispatch(tc_conn_t *c, txp_msg_t *m) {
  bool response = (m->flags & TXP_FLAG_RESPONSE) || !txp_msg_type_is_request(m->type);
  if (c->role == ROLE_NONE && response) {
    /* A stranger may send only its registration: an answer to a call we
     * never made (a HeartbeatResult that keeps a socket alive) closes it. */
    tc_log_warn("closing connection from %s: %s before registration", c->peer, txp_msg_type_name(m->type));
    c->server->st.unregistered_closed++;
    conn_close(c, TXP_ECONN_LOST);
    return;
  }
  if (response) {
    conn_on_response(c, m);
    return;
  }
  if (m->type == TXP_MSG_REGISTER_TM || m->type == TXP_MSG_REGISTER_RM) {
    conn_register(c, m);
    return;
  }
  if (c->role == ROLE_NONE) {
    tc_log_warn("closing connection from %s: %s before registration",
                c->peer, txp_msg_type_name(m->type));
    c->server->st.unregistered_closed++;
    conn_reply_code(c, m, TXP_ENOT_REGISTERED,
                    "connection not registered: send RegisterTM or RegisterRM first");
    conn_drain(c);
    return;
  }
  if (m->type == TXP_MSG_HEARTBEAT) {
    if (m->flags & TXP_FLAG_ONEWAY) return;
    txp_msg_t res;
    txp_msg_init_result(&res, m, 0, NULL);
    txp_msg_set_int(&res, TXP_F_NODE_ID, c->server->opts.node_id);
    conn_send(c, &res);
    return;
  }
  conn_dispatch_request(c, m);
}

/* Take every whole frame out of the decoder and act on it. */
static void conn_process(tc_conn_t *c) {
  tc_server_t *s = c->server;
  while (c->state == CONN_OPEN) {
    txp_msg_t m;
    txp_msg_init(&m, TXP_MSG_NONE);
    int rc = txp_decoder_next(c->dec, &m);
    if (rc == TXP_EAGAIN) break;
    switch (rc) {
    case 0:
      c->last_active = uv_now(s->loop);
      s->st.frames_in++;
      conn_dispatch(c, &m);
      break;
    case TXP_EBAD_VERSION:
      conn_bad_version(c, &m);
      break;
    case TXP_EBAD_MAGIC:
    case TXP_EFRAME_TOO_BIG:
    case TXP_EBUFFER_FULL:
    case TXP_ENOMEM:
      conn_stream_error(c, rc);
      break;
    default: /* body errors: the stream is still in sync */
      c->last_active = uv_now(s->loop);
      conn_body_error(c, &m, rc);
      break;
    }
    txp_msg_clear(&m);
  }
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  tc_conn_t *c = h->data;
  (void)suggested;
  *buf = uv_buf_init(c->rbuf, (unsigned)sizeof(c->rbuf));
}

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf) {
  tc_conn_t *c = st->data;
  if (nread == 0 || c->state == CONN_CLOSED) return;
  if (nread < 0) {
    if (nread != UV_EOF && c->state == CONN_OPEN)
      TC_LOG(TC_LOG_DEBUG, NULL, "could not read from %s: %s", c->peer,
             uv_strerror((int)nread));
    conn_close(c, TXP_ECONN_LOST);
    return;
  }
  if (c->state == CONN_DRAINING) return; /* discarded until EOF or linger */
  int rc = txp_decoder_feed(c->dec, buf->base, (size_t)nread);
  if (rc != 0) {
    conn_stream_error(c, rc);
    return;
  }
  conn_process(c);
}

/* ------------------------------------------------------------- sweeps */

/* Close connections silent for 3 heartbeats, strangers not registered
 * within 3 heartbeats of their accept (an absolute deadline: no frame
 * moves it), and drains that linger. */
static void on_idle_sweep(uv_timer_t *t) {
  tc_server_t *s = t->data;
  uint64_t now = uv_now(s->loop);
  uint64_t idle = 3 * (uint64_t)s->opts.heartbeat_ms;
  uint64_t linger = (uint64_t)s->opts.heartbeat_ms;
  /* conn_close() unlinks nothing and runs no callback: safe to iterate. */
  for (tc_conn_t *c = s->conns; c; c = c->next) {
    if (c->state == CONN_OPEN && c->role == ROLE_NONE && now - c->accepted_at >= idle) {
      tc_log_info("closing connection from %s: not registered %" PRIu64 " ms after it connected", c->peer,
                  now - c->accepted_at);
      s->st.unregistered_closed++;
      conn_close(c, TXP_ECONN_LOST);
    } else if (c->state == CONN_OPEN && now - c->last_active >= idle) {
      tc_log_info("closing connection from %s: no frame for %" PRIu64 " ms", c->peer,
                  now - c->last_active);
      conn_close(c, TXP_ECONN_LOST);
    } else if (c->state == CONN_DRAINING && now - c->drain_start >= linger) {
      conn_close(c, TXP_ECONN_LOST);
    }
  }
}

/* Complete calls whose deadline passed with TXP_EUNKNOWN_OUTCOME: the RM
 * may or may not have acted on them. */
static void on_call_sweep(uv_timer_t *t) {
  tc_server_t *s = t->data;
  uint64_t now = uv_now(s->loop);
  tc_call_t *expired = NULL;
  for (tc_conn_t *c = s->conns; c; c = c->next) {
    tc_call_t *k = c->calls;
    while (k) {
      tc_call_t *next = k->next;
      if (now >= k->deadline) {
        calls_remove(s, k);
        k->next = expired;
        expired = k;
      }
      k = next;
    }
  }
  while (expired) {
    tc_call_t *k = expired;
    expired = k->next;
    TC_LOG(TC_LOG_DEBUG, NULL, "call %" PRIu64 " (%s) timed out", k->node.id,
           txp_msg_type_name(k->expect_type - 1));
    k->cb(TXP_EUNKNOWN_OUTCOME, NULL, k->arg);
    free(k);
  }
  if (txc_idtable_count(&s->calls) == 0) uv_timer_stop(&s->call_timer);
}

/* ------------------------------------------------------------ listening */

/* The length of the address part of a peer name ("1.2.3.4:5", "[::1]:5"). */
static size_t peer_host_len(const char *peer) {
  const char *colon = strrchr(peer, ':');
  return colon ? (size_t)(colon - peer) : strlen(peer);
}

/* Live (counted) connections from the address of 'c'.  A scan: accepts are
 * rare next to frames, and max_connections bounds the list. */
static int peer_connections(const tc_server_t *s, const tc_conn_t *c) {
  size_t hl = peer_host_len(c->peer);
  int n = 0;
  for (const tc_conn_t *o = s->conns; o; o = o->next)
    if (o != c && o->counted && o->state == CONN_OPEN && peer_host_len(o->peer) == hl &&
        memcmp(o->peer, c->peer, hl) == 0)
      n++;
  return n;
}

/* A refusal is logged at most once a second (a flood of connects must not
 * become a flood of log lines); the count of refusals is in the stats. */
static void refusal_log(tc_server_t *s, const tc_conn_t *c, const char *why, const char *setting, int limit) {
  uint64_t now = uv_now(s->loop);
  if (s->refusal_logged_at && now - s->refusal_logged_at < 1000) {
    s->refusals_unlogged++;
    return;
  }
  tc_log_warn("refusing connection from %s: %s (%s is %d; %" PRIu64 " more refused since the last line)", c->peer,
              why, setting, limit, s->refusals_unlogged);
  s->refusal_logged_at = now;
  s->refusals_unlogged = 0;
}

static void on_connection(uv_stream_t *l, int status) {
  tc_server_t *s = l->data;
  if (status < 0) {
    tc_log_warn("could not accept connection: %s", uv_strerror(status));
    return;
  }
  tc_conn_t *c = conn_new(s);
  if (!c) {
    /* Without memory we cannot even accept in order to close; libuv stops
     * polling the listener until a later accept succeeds. */
    tc_log_error("could not accept connection: out of memory");
    return;
  }
  int rc = uv_tcp_init(s->loop, &c->tcp);
  if (rc != 0) {
    tc_log_error("could not accept connection: %s", uv_strerror(rc));
    conn_free(c);
    return;
  }
  c->tcp.data = c;
  c->next = s->conns;
  if (s->conns) s->conns->prev = c;
  s->conns = c;

  rc = uv_accept(l, (uv_stream_t *)&c->tcp);
  if (rc != 0) {
    tc_log_warn("could not accept connection: %s", uv_strerror(rc));
    conn_close(c, TXP_ECONN_LOST);
    return;
  }
  peer_name(c);
  if (s->nlive >= s->opts.max_connections) {
    s->st.refused++;
    refusal_log(s, c, "too many connections", "max_connections", s->opts.max_connections);
    conn_close(c, TXP_ETOO_MANY_CONNS);
    return;
  }
  if (peer_connections(s, c) >= s->opts.max_connections_per_address) {
    s->st.refused++;
    s->st.refused_per_address++;
    refusal_log(s, c, "too many connections from its address", "max_connections_per_address",
                s->opts.max_connections_per_address);
    conn_close(c, TXP_ETOO_MANY_CONNS);
    return;
  }
  txp_limits_t lim;
  txp_limits_default(&lim);
  lim.max_frame = s->opts.max_frame;
  c->dec = txp_decoder_new(&lim);
  if (!c->dec) {
    tc_log_error("could not accept connection from %s: out of memory", c->peer);
    conn_close(c, TXP_ECONN_LOST);
    return;
  }
  uv_tcp_nodelay(&c->tcp, 1);
  uv_tcp_keepalive(&c->tcp, 1, 60);
  c->counted = true;
  s->nlive++;
  s->st.accepted++;
  c->last_active = c->accepted_at = uv_now(s->loop);
  rc = uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
  if (rc != 0) {
    tc_log_warn("could not read from %s: %s", c->peer, uv_strerror(rc));
    conn_close(c, TXP_ECONN_LOST);
    return;
  }
  TC_LOG(TC_LOG_DEBUG, NULL, "accepted connection from %s", c->peer);
}

/* Numeric address only: name resolution would block the loop. */
int tc_server_start(uv_loop_t *loop, const tc_server_opts_t *opts, tc_server_t **out, char *err,
                    size_t errlen) {
  char dummy[1];
  if (!err || errlen == 0) {
    err = dummy;
    errlen = sizeof(dummy);
  }
  err[0] = '\0';
  if (out) *out = NULL;
  if (!loop || !opts || !out) {
    snprintf(err, errlen, "could not start server: invalid argument");
    return TXP_EINVALID_ARG;
  }
  bool has_token = opts->token && *opts->token;
  if ((!has_token && !opts->creds) || (opts->token && strlen(opts->token) > TXP_MAX_TOKEN_LEN)) {
    snprintf(err, errlen,
             "could not start server: credentials or a registration token of 1 to %d bytes are needed",
             TXP_MAX_TOKEN_LEN);
    return TXP_EINVALID_ARG;
  }
  if (opts->listen_port < 0 || opts->listen_port > 65535) {
    snprintf(err, errlen, "could not start server: invalid port %d", opts->listen_port);
    return TXP_EINVALID_ARG;
  }
  struct sockaddr_storage addr;
  if (tc_config_listen_sockaddr(opts->listen_host, opts->listen_port, &addr) != 0) {
    snprintf(err, errlen, "could not start server: listen address \"%s\" is not a numeric IP",
             opts->listen_host);
    return TXP_EINVALID_ARG;
  }

  tc_server_t *s = calloc(1, sizeof(*s));
  if (!s) goto fail_nomem;
  s->loop = loop;
  s->opts = *opts;
  s->host = str_dup(opts->listen_host ? opts->listen_host : "0.0.0.0");
  s->token = has_token ? str_dup(opts->token) : NULL;
  s->creds = opts->creds;
  bool calls_ok = txc_idtable_init(&s->calls, CALL_HASH_BITS_MIN) == 0;
  if (!s->host || (has_token && !s->token) || !calls_ok) goto fail_free;
  s->token_len = s->token ? strlen(s->token) : 0;
  s->opts.listen_host = s->host;
  s->opts.token = s->token;
  if (s->opts.max_connections <= 0) s->opts.max_connections = DEFAULT_MAX_CONNECTIONS;
  if (s->opts.max_connections_per_address <= 0) s->opts.max_connections_per_address = s->opts.max_connections;
  if (s->opts.max_inflight <= 0) s->opts.max_inflight = DEFAULT_MAX_INFLIGHT;
  if (s->opts.heartbeat_ms <= 0) s->opts.heartbeat_ms = DEFAULT_HEARTBEAT_MS;
  if (s->opts.max_frame == 0) s->opts.max_frame = TXP_DEFAULT_MAX_FRAME;

  int rc = uv_tcp_init(loop, &s->listener);
  if (rc != 0) {
    snprintf(err, errlen, "could not create listener: %s", uv_strerror(rc));
    server_free(s);
    return rc;
  }
  s->listener.data = s;
  s->handles = 1;
  rc = uv_tcp_bind(&s->listener, (const struct sockaddr *)&addr, 0);
  if (rc == 0) rc = uv_listen((uv_stream_t *)&s->listener, LISTEN_BACKLOG, on_connection);
  if (rc != 0) {
    snprintf(err, errlen, "could not listen on %s:%d: %s", s->host, opts->listen_port,
             uv_strerror(rc));
    /* The handle is registered: it can only be freed from its close
     * callback, which the caller's next uv_run delivers. */
    s->stopping = true;
    uv_close((uv_handle_t *)&s->listener, on_server_handle_close);
    return rc;
  }
  struct sockaddr_storage bound;
  int blen = (int)sizeof(bound);
  s->port = opts->listen_port;
  if (uv_tcp_getsockname(&s->listener, (struct sockaddr *)&bound, &blen) == 0) {
    if (bound.ss_family == AF_INET)
      s->port = ntohs(((const struct sockaddr_in *)&bound)->sin_port);
    else if (bound.ss_family == AF_INET6)
      s->port = ntohs(((const struct sockaddr_in6 *)&bound)->sin6_port);
  }

  uv_timer_init(loop, &s->idle_timer);
  uv_timer_init(loop, &s->call_timer);
  uv_prepare_init(loop, &s->prepare);
  uv_check_init(loop, &s->check);
  s->idle_timer.data = s->call_timer.data = s;
  s->prepare.data = s->check.data = s;
  s->handles = SERVER_HANDLES;
  uint64_t sweep = (uint64_t)s->opts.heartbeat_ms / 2;
  if (sweep < 10) sweep = 10;
  uv_timer_start(&s->idle_timer, on_idle_sweep, sweep, sweep);

  tc_log_info("listening on %s:%d", s->host, s->port);
  *out = s;
  return 0;

fail_free:
  server_free(s);
fail_nomem:
  snprintf(err, errlen, "could not start server: out of memory");
  return TXP_ENOMEM;
}

void tc_server_stop(tc_server_t *s, void (*done)(void *arg), void *arg) {
  if (!s || s->stopping) return;
  s->stopping = true;
  s->done = done;
  s->done_arg = arg;
  uv_close((uv_handle_t *)&s->listener, on_server_handle_close);
  uv_close((uv_handle_t *)&s->idle_timer, on_server_handle_close);
  uv_close((uv_handle_t *)&s->call_timer, on_server_handle_close);
  uv_close((uv_handle_t *)&s->prepare, on_server_handle_close);
  uv_close((uv_handle_t *)&s->check, on_server_handle_close);
  s->flushing = false;
  for (tc_conn_t *c = s->conns; c; c = c->next) conn_close(c, TXP_ESHUTDOWN);
  tc_log_info("stopped listening on %s:%d", s->host, s->port);
}

int tc_server_port(const tc_server_t *s) { return s->port; }

int tc_server_conn_count(const tc_server_t *s) { return s->nlive; }

void tc_server_get_stats(const tc_server_t *s, tc_server_stats_t *out) {
  *out = s->st;
  out->connections = s->nlive;
  out->rms = s->nrms;
  out->tms = s->ntms;
}

/* ------------------------------------------------------------- requests */

static void req_finish(tc_req_t *req) {
  tc_conn_t *c = req->conn;
  c->inflight--;
  txp_msg_clear(&req->msg);
  free(req);
  tc_conn_unref(c);
}

void tc_req_reply(tc_req_t *req, const txp_msg_t *res) {
  if (!req) return;
  tc_conn_t *c = req->conn;
  if (res && c->state == CONN_OPEN && !(req->msg.flags & TXP_FLAG_ONEWAY)) {
    txp_msg_t m = *res; /* shallow: strings stay borrowed */
    m.request_id = req->msg.request_id;
    m.flags = TXP_FLAG_RESPONSE;
    int rc = conn_send(c, &m);
    if (rc != 0 && c->state == CONN_OPEN) {
      /* The handler built something the encoder refuses: the peer still
       * deserves an answer rather than a timeout. */
      tc_log_warn("could not encode %s answering request %" PRIu64 " from %s: %s",
                  txp_msg_type_name(res->type), req->msg.request_id, c->peer, txp_strerror(rc));
      conn_reply_code(c, &req->msg, TXP_EINTERNAL, "internal error: could not encode the answer");
    }
  }
  req_finish(req);
}

void tc_req_reply_code(tc_req_t *req, int code, const char *message) {
  if (!req) return;
  char buf[TXP_MAX_MESSAGE_LEN + 1];
  txp_msg_t res;
  txp_msg_init_result(&res, &req->msg, code, message ? message_fit(buf, message) : NULL);
  tc_req_reply(req, &res);
}

void tc_req_drop(tc_req_t *req) {
  if (req) req_finish(req);
}

/* ---------------------------------------------------------- connections */

bool tc_conn_is_rm(const tc_conn_t *c) { return c->role == ROLE_RM; }
bool tc_conn_closed(const tc_conn_t *c) { return c->state != CONN_OPEN; }
const char *tc_conn_peer(const tc_conn_t *c) { return c->peer; }
const char *tc_conn_client_id(const tc_conn_t *c) { return c->client_id ? c->client_id : ""; }
const char *tc_conn_app_id(const tc_conn_t *c) { return c->app_id ? c->app_id : ""; }
const char *tc_conn_group(const tc_conn_t *c) { return c->group ? c->group : ""; }

void tc_server_set_creds(tc_server_t *s, const tc_creds_t *creds) {
  if (s) s->creds = creds;
}

void tc_conn_ref(tc_conn_t *c) { c->refs++; }

void tc_conn_unref(tc_conn_t *c) {
  if (--c->refs == 0) conn_free(c);
}

static bool conn_serves(const tc_conn_t *c, const char *resource_id) {
  for (size_t i = 0; i < c->n_resource_ids; i++)
    if (strcmp(c->resource_ids[i], resource_id) == 0) return true;
  return false;
}

tc_conn_t *tc_server_find_rm(tc_server_t *s, const char *resource_id, const char *client_id) {
  return tc_server_find_branch_rm(s, resource_id, client_id, NULL, NULL);
}

tc_conn_t *tc_server_find_branch_rm(tc_server_t *s, const char *resource_id, const char *client_id,
                                    const char *app_id, const char *group) {
  tc_conn_t *any = NULL, *same_app = NULL;
  if (!s || !resource_id) return NULL;
  bool by_group = group && group[0];
  for (tc_conn_t *c = s->conns; c; c = c->next) {
    if (c->state != CONN_OPEN || c->role != ROLE_RM || !conn_serves(c, resource_id)) continue;
    if (by_group && strcmp(c->group, group) != 0) continue;
    bool app_ok = !app_id || !app_id[0] || strcmp(c->app_id, app_id) == 0;
    if (app_ok && client_id && strcmp(c->client_id, client_id) == 0) return c;
    if (app_ok && !same_app) same_app = c;
    if (!any) any = c;
  }
  return same_app ? same_app : any;
}

int tc_conn_send_oneway(tc_conn_t *c, txp_msg_t *msg) {
  if (!c || !msg || !txp_msg_type_is_request(msg->type)) return TXP_EINVALID_ARG;
  tc_server_t *s = c->server;
  if (c->state != CONN_OPEN) return (s && s->stopping) ? TXP_ESHUTDOWN : TXP_ECONN_LOST;
  msg->request_id = ++s->next_request_id;
  msg->flags = TXP_FLAG_ONEWAY;
  return conn_send(c, msg);
}

int tc_conn_call(tc_conn_t *c, txp_msg_t *msg, unsigned timeout_ms, tc_call_cb cb, void *arg) {
  if (!c || !msg || !cb || !txp_msg_type_is_request(msg->type)) return TXP_EINVALID_ARG;
  tc_server_t *s = c->server;
  if (c->state != CONN_OPEN) return (s && s->stopping) ? TXP_ESHUTDOWN : TXP_ECONN_LOST;
  tc_call_t *k = calloc(1, sizeof(*k));
  if (!k) return TXP_ENOMEM;
  msg->request_id = ++s->next_request_id;
  msg->flags = 0;
  int rc = conn_send(c, msg);
  if (rc != 0) {
    free(k);
    return rc;
  }
  k->node.id = msg->request_id;
  k->expect_type = (uint16_t)(msg->type + 1);
  k->deadline = uv_now(s->loop) + (timeout_ms ? timeout_ms : CALL_DEFAULT_TIMEOUT_MS);
  k->cb = cb;
  k->arg = arg;
  k->conn = c;
  calls_insert(s, k);
  if (!uv_is_active((uv_handle_t *)&s->call_timer))
    uv_timer_start(&s->call_timer, on_call_sweep, CALL_SWEEP_MS, CALL_SWEEP_MS);
  return 0;
}
