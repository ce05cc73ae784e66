/*
 * test_tc_server.c - tc_server (tc/tc_server.h) against in-process clients.
 *
 * NOTES
 *   The server and every client share one libuv loop; nothing sleeps.  A
 *   test acts, then runs the loop until a predicate holds or a deadline
 *   timer fires (run_until), and asserts on what the clients received and
 *   on the server's counters.  The clients are a few dozen lines over
 *   uv_tcp plus the real txp encoder/decoder, so they speak exactly the
 *   bytes a real TM/RM would; raw frames (bad version, bad bodies, garbage)
 *   are written by hand.
 *
 *   Every test ends in teardown: clients closed, the server stopped, the
 *   loop run dry, and uv_loop_close() must return 0 (no handle leaked).
 *   Memory leaks are caught by ASan/valgrind at exit.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <uv.h>

#include "tc_log.h"
#include "tc_server.h"

#define TOKEN "s3cret-token"
#define NODE_ID 7
#define WAIT_MS 3000
#define MAX_CLIENTS 16
#define MAX_HELD 16

/* ----------------------------------------------------------- the fixture */

static uv_loop_t loop_storage;
static uv_loop_t *loop;
static uv_timer_t deadline;
static bool deadline_hit;
static tc_server_t *srv;
static tc_server_opts_t opts;
static bool stopped;
/* The idle test's heartbeat timer: static so that teardown can close it
 * even when a failed assertion left the test early. */
static uv_timer_t beat;
static bool beat_used;

/* What the test's request handler and RM hook saw. */
static tc_req_t *held[MAX_HELD];
static int nheld;
static int requests_seen;
static int rm_ups, rm_downs;

static void on_deadline(uv_timer_t *t) {
  (void)t;
  deadline_hit = true;
}

/* Run the loop until 'pred(arg)' or 'ms' pass; returns pred's last value. */
static bool run_until(bool (*pred)(void *), void *arg, unsigned ms) {
  deadline_hit = false;
  uv_timer_start(&deadline, on_deadline, ms, 0);
  while (!pred(arg) && !deadline_hit) uv_run(loop, UV_RUN_ONCE);
  uv_timer_stop(&deadline);
  return pred(arg);
}

static bool flag_true(void *p) { return *(bool *)p; }
static bool int_nonzero(void *p) { return *(int *)p != 0; }
static bool held_at_least(void *p) { return nheld >= *(int *)p; }
static bool never(void *p) {
  (void)p;
  return false;
}

/* Let the loop run for 'ms' (for "nothing else happens" checks). */
static void run_for(unsigned ms) { run_until(never, NULL, ms); }

/* ------------------------------------------------------------ the client */

typedef enum { RM_PASSIVE, RM_ANSWER, RM_DISCONNECT } rm_mode_t;

typedef struct client {
  uv_tcp_t tcp;
  uv_connect_t creq;
  txp_decoder_t *dec;
  txp_msg_t *msgs; /* received, in order */
  size_t nmsgs, cap, next;
  bool connected, eof, closing, closed;
  int connect_status;
  int decode_err;
  rm_mode_t rm_mode; /* what to do with BranchCommit/BranchRollback */
  uint64_t next_id;
  char rbuf[65536];
} client_t;

static client_t *clients[MAX_CLIENTS];
static int nclients;

typedef struct {
  uv_write_t req;
  char *data;
} wreq_t;

static void on_client_close(uv_handle_t *h) {
  client_t *cl = h->data;
  cl->closed = true;
}

static void client_close(client_t *cl) {
  if (cl->closing) return;
  cl->closing = true;
  uv_close((uv_handle_t *)&cl->tcp, on_client_close);
}

static void on_client_write(uv_write_t *req, int status) {
  wreq_t *w = (wreq_t *)req;
  (void)status;
  free(w->data);
  free(w);
}

static void client_write_raw(client_t *cl, const void *data, size_t len) {
  assert_false(cl->closing);
  wreq_t *w = malloc(sizeof(*w));
  assert_non_null(w);
  w->data = malloc(len);
  assert_non_null(w->data);
  memcpy(w->data, data, len);
  uv_buf_t b = uv_buf_init(w->data, (unsigned)len);
  assert_int_equal(uv_write(&w->req, (uv_stream_t *)&cl->tcp, &b, 1, on_client_write), 0);
}

/* Encode and send 'm'; assigns a request id unless one is set. */
static uint64_t client_send(client_t *cl, txp_msg_t *m) {
  txp_buf_t b;
  if (m->request_id == 0) m->request_id = ++cl->next_id;
  txp_buf_init(&b, 0);
  assert_int_equal(txp_encode(m, &b, 0), 0);
  client_write_raw(cl, b.data, b.len);
  txp_buf_free(&b);
  return m->request_id;
}

/* The RM side of a TC->RM call, per the client's mode. */
static bool client_rm_auto(client_t *cl, const txp_msg_t *m) {
  if (cl->rm_mode == RM_PASSIVE || (m->flags & TXP_FLAG_RESPONSE) ||
      (m->type != TXP_MSG_BRANCH_COMMIT && m->type != TXP_MSG_BRANCH_ROLLBACK))
    return false;
  if (cl->rm_mode == RM_DISCONNECT) {
    client_close(cl);
    return true;
  }
  txp_msg_t res;
  txp_msg_init_result(&res, m, 0, NULL);
  txp_msg_set_int(&res, TXP_F_BRANCH_ID, m->branch_id);
  txp_msg_set_int(&res, TXP_F_BRANCH_STATUS,
                  m->type == TXP_MSG_BRANCH_COMMIT ? TXP_BS_PHASE2_COMMITTED
                                                   : TXP_BS_PHASE2_ROLLBACKED);
  client_send(cl, &res);
  return true;
}

static void on_client_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  client_t *cl = h->data;
  (void)suggested;
  *buf = uv_buf_init(cl->rbuf, (unsigned)sizeof(cl->rbuf));
}

static void on_client_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf) {
  client_t *cl = st->data;
  if (nread < 0) {
    cl->eof = true;
    client_close(cl);
    return;
  }
  if (nread == 0 || cl->closing) return;
  assert_int_equal(txp_decoder_feed(cl->dec, buf->base, (size_t)nread), 0);
  for (;;) {
    txp_msg_t m;
    txp_msg_init(&m, TXP_MSG_NONE);
    int rc = txp_decoder_next(cl->dec, &m);
    if (rc == TXP_EAGAIN) break;
    if (rc != 0) {
      cl->decode_err = rc;
      txp_msg_clear(&m);
      break;
    }
    if (client_rm_auto(cl, &m)) {
      txp_msg_clear(&m);
      if (cl->closing) break;
      continue;
    }
    if (cl->nmsgs == cl->cap) {
      cl->cap = cl->cap ? cl->cap * 2 : 16;
      cl->msgs = realloc(cl->msgs, cl->cap * sizeof(*cl->msgs));
      assert_non_null(cl->msgs);
    }
    cl->msgs[cl->nmsgs++] = m; /* moved */
  }
}

static void on_client_connect(uv_connect_t *req, int status) {
  client_t *cl = req->data;
  cl->connect_status = status;
  cl->connected = true;
  if (status == 0)
    assert_int_equal(
      uv_read_start((uv_stream_t *)&cl->tcp, on_client_alloc, on_client_read), 0);
}

static client_t *client_connect(void) {
  assert_true(nclients < MAX_CLIENTS);
  client_t *cl = calloc(1, sizeof(*cl));
  assert_non_null(cl);
  clients[nclients++] = cl;
  cl->dec = txp_decoder_new(NULL);
  assert_non_null(cl->dec);
  assert_int_equal(uv_tcp_init(loop, &cl->tcp), 0);
  cl->tcp.data = cl;
  /* Without it Nagle holds a second small frame until the server's
   * delayed ACK, ~40 ms later, and ordering checks turn flaky. */
  assert_int_equal(uv_tcp_nodelay(&cl->tcp, 1), 0);
  cl->creq.data = cl;
  struct sockaddr_in a;
  assert_int_equal(uv_ip4_addr("127.0.0.1", tc_server_port(srv), &a), 0);
  assert_int_equal(
    uv_tcp_connect(&cl->creq, &cl->tcp, (const struct sockaddr *)&a, on_client_connect), 0);
  assert_true(run_until(flag_true, &cl->connected, WAIT_MS));
  assert_int_equal(cl->connect_status, 0);
  return cl;
}

static bool client_has_msg(void *p) {
  client_t *cl = p;
  return cl->next < cl->nmsgs;
}

static bool client_gone(void *p) {
  client_t *cl = p;
  return cl->eof;
}

/* The next frame the client received (waits for it). */
static const txp_msg_t *client_next(client_t *cl) {
  assert_true(run_until(client_has_msg, cl, WAIT_MS));
  return &cl->msgs[cl->next++];
}

static void client_free(client_t *cl) {
  for (size_t i = 0; i < cl->nmsgs; i++) txp_msg_clear(&cl->msgs[i]);
  free(cl->msgs);
  txp_decoder_free(cl->dec);
  free(cl);
}

/* Register and return the result code. */
static int client_register(client_t *cl, bool rm, const char *client_id, const char *resources,
                           const char *token) {
  txp_msg_t m;
  txp_msg_init(&m, rm ? TXP_MSG_REGISTER_RM : TXP_MSG_REGISTER_TM);
  txp_msg_set_str(&m, TXP_F_APP_ID, "shop");
  txp_msg_set_str(&m, TXP_F_CLIENT_ID, client_id);
  if (token) txp_msg_set_str(&m, TXP_F_TOKEN, token);
  if (resources) txp_msg_set_str(&m, TXP_F_RESOURCE_IDS, resources);
  uint64_t id = client_send(cl, &m);
  const txp_msg_t *res = client_next(cl);
  assert_int_equal(res->type, rm ? TXP_MSG_REGISTER_RM_RESULT : TXP_MSG_REGISTER_TM_RESULT);
  assert_int_equal(res->request_id, id);
  assert_true(res->flags & TXP_FLAG_RESPONSE);
  return (int)res->code;
}

static client_t *client_tm(const char *client_id) {
  client_t *cl = client_connect();
  assert_int_equal(client_register(cl, false, client_id, NULL, TOKEN), 0);
  return cl;
}

static client_t *client_rm(const char *client_id, const char *resources, rm_mode_t mode) {
  client_t *cl = client_connect();
  assert_int_equal(client_register(cl, true, client_id, resources, TOKEN), 0);
  cl->rm_mode = mode;
  return cl;
}

static uint64_t send_simple(client_t *cl, txp_msg_type_t type, const char *xid) {
  txp_msg_t m;
  txp_msg_init(&m, type);
  if (xid) txp_msg_set_str(&m, TXP_F_XID, xid);
  return client_send(cl, &m);
}

/* A GlobalBegin round trip: the connection is alive and served. */
static void assert_served(client_t *cl) {
  uint64_t id = send_simple(cl, TXP_MSG_GLOBAL_BEGIN, NULL);
  const txp_msg_t *res = client_next(cl);
  assert_int_equal(res->type, TXP_MSG_GLOBAL_BEGIN_RESULT);
  assert_int_equal(res->request_id, id);
  assert_int_equal(res->code, 0);
  assert_string_equal(res->xid, "127.0.0.1:8091:1");
}

/* One raw frame: header with any version/type/flags and a given body. */
static size_t raw_frame(unsigned char *out, unsigned major, unsigned type, unsigned flags,
                        uint64_t id, const unsigned char *body, uint32_t blen) {
  out[0] = 0xDA;
  out[1] = 0xDA;
  out[2] = (unsigned char)major;
  out[3] = 0;
  out[4] = (unsigned char)(type >> 8);
  out[5] = (unsigned char)type;
  out[6] = (unsigned char)(flags >> 8);
  out[7] = (unsigned char)flags;
  for (int i = 0; i < 8; i++) out[8 + i] = (unsigned char)(id >> (56 - 8 * i));
  out[16] = (unsigned char)(blen >> 24);
  out[17] = (unsigned char)(blen >> 16);
  out[18] = (unsigned char)(blen >> 8);
  out[19] = (unsigned char)blen;
  if (blen) memcpy(out + TXP_HEADER_SIZE, body, blen);
  return TXP_HEADER_SIZE + blen;
}

/* Send one raw frame (raw_frame's header fields and body) and check the
 * answer's type, request id and code; returns the answer. */
static const txp_msg_t *raw_call(client_t *cl, unsigned major, unsigned type, unsigned flags, uint64_t id,
                                 const unsigned char *body, uint32_t blen, unsigned want_type, int want_code) {
  unsigned char frame[64];
  assert_true(blen <= sizeof(frame) - TXP_HEADER_SIZE);
  client_write_raw(cl, frame, raw_frame(frame, major, type, flags, id, body, blen));
  const txp_msg_t *res = client_next(cl);
  assert_int_equal(res->type, want_type);
  assert_int_equal(res->request_id, id);
  assert_int_equal(res->code, want_code);
  return res;
}

/* ---------------------------------------------------- the application */

typedef struct {
  uv_timer_t timer;
  tc_req_t *req;
} delayed_t;

static void on_delayed_close(uv_handle_t *h) { free(h->data); }

static void on_delayed(uv_timer_t *t) {
  delayed_t *d = t->data;
  txp_msg_t res;
  txp_msg_init_result(&res, &d->req->msg, 0, NULL);
  txp_msg_set_int(&res, TXP_F_GLOBAL_STATUS, TXP_GS_COMMITTED);
  tc_req_reply(d->req, &res);
  uv_close((uv_handle_t *)&d->timer, on_delayed_close);
}

/*
 * GlobalBegin: answered at once.  GlobalCommit: answered 30 ms later from a
 * timer.  GlobalStatus: held in 'held' for the test to finish.
 */
static void on_request(tc_req_t *req, void *arg) {
  (void)arg;
  requests_seen++;
  assert_non_null(req->conn);
  assert_false(tc_conn_closed(req->conn));
  switch (req->msg.type) {
  case TXP_MSG_GLOBAL_BEGIN: {
    txp_msg_t res;
    txp_msg_init_result(&res, &req->msg, 0, NULL);
    txp_msg_set_str(&res, TXP_F_XID, "127.0.0.1:8091:1");
    txp_msg_set_int(&res, TXP_F_TIMEOUT_MS, 60000);
    tc_req_reply(req, &res);
    break;
  }
  case TXP_MSG_GLOBAL_COMMIT: {
    delayed_t *d = calloc(1, sizeof(*d));
    assert_non_null(d);
    d->req = req;
    uv_timer_init(loop, &d->timer);
    d->timer.data = d;
    uv_timer_start(&d->timer, on_delayed, 30, 0);
    break;
  }
  case TXP_MSG_GLOBAL_LOCK_QUERY: { /* a big answer: longer than a message may be */
    char big[1500];
    memset(big, 'x', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    tc_req_reply_code(req, 0, big);
    break;
  }
  case TXP_MSG_GLOBAL_STATUS:
    assert_true(nheld < MAX_HELD);
    held[nheld++] = req;
    break;
  default:
    tc_req_reply_code(req, TXP_EBAD_REQUEST, "unexpected request");
    break;
  }
}

static void on_rm_change(tc_conn_t *c, bool up, void *arg) {
  (void)arg;
  assert_true(tc_conn_is_rm(c));
  if (up) rm_ups++;
  else rm_downs++;
}

static void start_server(void) {
  char err[256];
  assert_int_equal(tc_server_start(loop, &opts, &srv, err, sizeof(err)), 0);
  assert_non_null(srv);
  assert_true(tc_server_port(srv) > 0);
}

static tc_server_stats_t stats(void) {
  tc_server_stats_t st;
  tc_server_get_stats(srv, &st);
  return st;
}

static bool connections_at_most(void *p) { return stats().connections <= *(int *)p; }
static bool no_connections(void *p) {
  int zero = 0;
  (void)p;
  return connections_at_most(&zero);
}

static void on_stopped(void *arg) { *(bool *)arg = true; }

static int setup(void **state) {
  (void)state;
  loop = &loop_storage;
  assert_int_equal(uv_loop_init(loop), 0);
  uv_timer_init(loop, &deadline);
  memset(&opts, 0, sizeof(opts));
  opts.listen_host = "127.0.0.1";
  opts.listen_port = 0;
  opts.token = TOKEN;
  opts.node_id = NODE_ID;
  opts.max_connections = 32;
  opts.max_inflight = 16;
  opts.heartbeat_ms = 5000;
  opts.max_frame = 64 * 1024;
  opts.on_request = on_request;
  opts.on_rm_change = on_rm_change;
  srv = NULL;
  stopped = false;
  nheld = requests_seen = rm_ups = rm_downs = 0;
  nclients = 0;
  return 0;
}

static int teardown(void **state) {
  (void)state;
  if (beat_used) uv_close((uv_handle_t *)&beat, NULL);
  beat_used = false;
  for (int i = 0; i < nclients; i++) client_close(clients[i]);
  if (srv) {
    tc_server_stop(srv, on_stopped, &stopped);
    assert_true(run_until(flag_true, &stopped, WAIT_MS));
    srv = NULL;
  }
  /* Requests still held are finished after the stop: discarded, freed. */
  for (int i = 0; i < nheld; i++) tc_req_drop(held[i]);
  nheld = 0;
  uv_close((uv_handle_t *)&deadline, NULL);
  uv_run(loop, UV_RUN_DEFAULT);
  for (int i = 0; i < nclients; i++) {
    assert_true(clients[i]->closed);
    client_free(clients[i]);
  }
  nclients = 0;
  assert_int_equal(uv_loop_close(loop), 0);
  return 0;
}

/* ----------------------------------------------------------------- tests */

static void test_start_errors(void **state) {
  (void)state;
  char err[256];
  tc_server_t *s2 = (tc_server_t *)1;
  tc_server_opts_t o = opts;
  o.listen_host = "not-an-address";
  assert_int_equal(tc_server_start(loop, &o, &s2, err, sizeof(err)), TXP_EINVALID_ARG);
  assert_null(s2);
  assert_non_null(strstr(err, "not-an-address"));

  o = opts;
  o.token = "";
  assert_int_equal(tc_server_start(loop, &o, &s2, err, sizeof(err)), TXP_EINVALID_ARG);
  assert_null(s2);

  /* A taken port fails at bind/listen; the half-made server is freed by
   * the loop (uv_loop_close in teardown checks nothing is left). */
  start_server();
  o = opts;
  o.listen_port = tc_server_port(srv);
  int rc = tc_server_start(loop, &o, &s2, err, sizeof(err));
  assert_int_equal(rc, UV_EADDRINUSE);
  assert_null(s2);
  assert_non_null(strstr(err, "could not listen on 127.0.0.1:"));
}

static void test_register_tm(void **state) {
  (void)state;
  start_server();
  client_t *cl = client_connect();
  txp_msg_t m;
  txp_msg_init(&m, TXP_MSG_REGISTER_TM);
  txp_msg_set_str(&m, TXP_F_APP_ID, "shop");
  txp_msg_set_str(&m, TXP_F_CLIENT_ID, "tm-1");
  txp_msg_set_str(&m, TXP_F_TOKEN, TOKEN);
  uint64_t id = client_send(cl, &m);
  const txp_msg_t *res = client_next(cl);
  assert_int_equal(res->type, TXP_MSG_REGISTER_TM_RESULT);
  assert_int_equal(res->request_id, id);
  assert_int_equal(res->code, 0);
  assert_int_equal(res->node_id, NODE_ID);
  assert_int_equal(res->heartbeat_ms, opts.heartbeat_ms);
  assert_string_equal(res->server_version, "txc/0.1");

  assert_served(cl);
  tc_server_stats_t st = stats();
  assert_int_equal(st.tms, 1);
  assert_int_equal(st.rms, 0);
  assert_int_equal(st.connections, 1);
  assert_int_equal(st.accepted, 1);
  assert_int_equal(tc_server_conn_count(srv), 1);
  assert_true(st.frames_in >= 2);
  assert_true(st.frames_out >= 2);

  /* Re-registration on the same connection is allowed. */
  assert_int_equal(client_register(cl, false, "tm-1b", NULL, TOKEN), 0);
  assert_int_equal(stats().tms, 1);
  assert_served(cl);
}

static void test_register_bad_token(void **state) {
  (void)state;
  start_server();
  client_t *a = client_connect();
  assert_int_equal(client_register(a, false, "tm-1", NULL, "wrong"), TXP_EAUTH);
  assert_non_null(strstr(a->msgs[0].message, "authentication failed: "));
  assert_int_equal(strncmp(a->msgs[0].message, "authentication failed: ", 23), 0);
  assert_true(run_until(client_gone, a, WAIT_MS));

  client_t *b = client_connect(); /* no token at all */
  assert_int_equal(client_register(b, true, "rm-1", "jdbc:a", NULL), TXP_EAUTH);
  assert_true(run_until(client_gone, b, WAIT_MS));

  client_t *c = client_connect(); /* right length, last byte wrong */
  assert_int_equal(client_register(c, false, "tm-2", NULL, "s3cret-tokeN"), TXP_EAUTH);
  assert_true(run_until(client_gone, c, WAIT_MS));

  tc_server_stats_t st = stats();
  assert_int_equal(st.auth_failures, 3);
  assert_int_equal(st.connections, 0);
  assert_int_equal(st.tms + st.rms, 0);
  assert_int_equal(rm_ups, 0);
  assert_int_equal(requests_seen, 0);
}

static void test_request_before_register(void **state) {
  (void)state;
  start_server();
  client_t *cl = client_connect();
  uint64_t id = send_simple(cl, TXP_MSG_GLOBAL_BEGIN, NULL);
  const txp_msg_t *res = client_next(cl);
  assert_int_equal(res->type, TXP_MSG_GLOBAL_BEGIN_RESULT);
  assert_int_equal(res->request_id, id);
  assert_int_equal(res->code, TXP_ENOT_REGISTERED);
  assert_true(run_until(client_gone, cl, WAIT_MS));
  assert_int_equal(requests_seen, 0);
}

/* Security review, finding 3: before registration a connection may send
 * only its registration.  A response frame (a HeartbeatResult that would
 * keep an idle stranger alive) closes it at once, with no reply. */
static void test_response_before_register_closes(void **state) {
  (void)state;
  start_server();
  client_t *cl = client_connect();
  txp_msg_t hb, res;
  txp_msg_init(&hb, TXP_MSG_HEARTBEAT);
  hb.request_id = 7;
  txp_msg_init_result(&res, &hb, 0, NULL);
  client_send(cl, &res);
  txp_msg_clear(&hb);
  assert_true(run_until(client_gone, cl, WAIT_MS));
  assert_int_equal(cl->nmsgs, 0);
  assert_int_equal(stats().unregistered_closed, 1);
  assert_int_equal(stats().connections, 0);
}

static bool one_connection_left(void *p) {
  (void)p;
  return stats().connections == 1;
}

/* Two registered TMs fill a limit of two connections: a third is closed
 * at once, unanswered, and counted refused; the two are still served.
 * Returns the first. */
static client_t *fill_two_and_refuse_third(void) {
  client_t *a = client_tm("tm-a");
  client_t *b = client_tm("tm-b");
  client_t *c = client_connect();
  assert_true(run_until(client_gone, c, WAIT_MS));
  assert_int_equal(c->nmsgs, 0);
  tc_server_stats_t st = stats();
  assert_int_equal(st.refused, 1);
  assert_int_equal(st.connections, 2);
  assert_served(a);
  assert_served(b);
  return a;
}

/* A server whose connection bound 'limit' (a field of opts) is 2, filled
 * as fill_two_and_refuse_third leaves it; returns its first client. */
static client_t *start_full_server(int *limit) {
  *limit = 2;
  start_server();
  return fill_two_and_refuse_third();
}

/* Finding 3: one address may hold at most max_connections_per_address
 * live connections; the next is refused (closed at once), the others go
 * on, and one that leaves makes room again. */
static void test_max_connections_per_address(void **state) {
  (void)state;
  client_t *a = start_full_server(&opts.max_connections_per_address);
  assert_int_equal(stats().refused_per_address, 1);
  client_close(a);
  assert_true(run_until(one_connection_left, NULL, WAIT_MS));
  client_t *d = client_tm("tm-d"); /* room again */
  assert_served(d);
}

static void test_bad_version(void **state) {
  (void)state;
  start_server();
  client_t *cl = client_connect();
  const unsigned char body[] = {0x80}; /* empty map */
  const txp_msg_t *res =
    raw_call(cl, 7, TXP_MSG_REGISTER_TM, 0, 4242, body, sizeof(body), TXP_MSG_ERROR, TXP_EBAD_VERSION);
  assert_string_equal(res->server_version, "txc/0.1");
  assert_string_equal(res->message, "unsupported protocol version 7.0: this server speaks 1.x");
  assert_true(run_until(client_gone, cl, WAIT_MS));
  assert_int_equal(stats().version_mismatches, 1);
}

static void test_garbage_closes_only_offender(void **state) {
  (void)state;
  start_server();
  client_t *good = client_tm("tm-good");
  client_t *bad = client_connect();
  const char http[] = "GET / HTTP/1.1\r\nHost: tc\r\n\r\n";
  client_write_raw(bad, http, sizeof(http) - 1);
  assert_true(run_until(client_gone, bad, WAIT_MS));
  assert_int_equal(bad->nmsgs, 0);

  /* A header announcing more than max_frame: closed before the body. */
  client_t *big = client_tm("tm-big");
  unsigned char frame[TXP_HEADER_SIZE];
  raw_frame(frame, 1, TXP_MSG_GLOBAL_BEGIN, 0, 1, NULL, 0);
  frame[16] = 0x7f; /* body_len ~ 2 GiB */
  client_write_raw(big, frame, sizeof(frame));
  assert_true(run_until(client_gone, big, WAIT_MS));

  assert_served(good);
  assert_false(good->eof);
  tc_server_stats_t st = stats();
  assert_int_equal(st.bad_frames, 2);
  assert_int_equal(st.connections, 1);
}

static void test_body_errors_keep_connection(void **state) {
  (void)state;
  start_server();
  client_t *cl = client_tm("tm-1");

  /* GlobalBegin whose "name" (field 6) is an integer. */
  const unsigned char wrong_type[] = {0x81, 0x06, 0x2a};
  const txp_msg_t *res = raw_call(cl, 1, TXP_MSG_GLOBAL_BEGIN, 0, 77, wrong_type, sizeof(wrong_type),
                                  TXP_MSG_GLOBAL_BEGIN_RESULT, TXP_EFIELD_TYPE);
  assert_non_null(res->message);

  /* An unknown message type: answered with an Error frame. */
  const unsigned char empty[] = {0x80};
  raw_call(cl, 1, 99, 0, 78, empty, sizeof(empty), TXP_MSG_ERROR, TXP_EUNKNOWN_TYPE);

  /* Unknown flag bits on a known request type. */
  raw_call(cl, 1, TXP_MSG_GLOBAL_BEGIN, 0x80, 79, empty, sizeof(empty), TXP_MSG_GLOBAL_BEGIN_RESULT, TXP_EBAD_FLAGS);

  /* Missing required field (GlobalCommit without xid). */
  raw_call(cl, 1, TXP_MSG_GLOBAL_COMMIT, 0, 80, empty, sizeof(empty), TXP_MSG_GLOBAL_COMMIT_RESULT,
           TXP_EFIELD_MISSING);

  assert_served(cl);
  assert_false(cl->eof);
  assert_int_equal(stats().bad_frames, 4);
  assert_int_equal(requests_seen, 1);
}

static void test_too_many_bad_frames(void **state) {
  (void)state;
  start_server();
  client_t *cl = client_tm("tm-1");
  enum { N = 101 };
  const unsigned char empty[] = {0x80};
  unsigned char *all = malloc(N * (TXP_HEADER_SIZE + 1));
  assert_non_null(all);
  size_t off = 0;
  for (int i = 0; i < N; i++)
    off += raw_frame(all + off, 1, 99, 0, (uint64_t)(1000 + i), empty, sizeof(empty));
  client_write_raw(cl, all, off);
  free(all);
  assert_true(run_until(client_gone, cl, WAIT_MS));
  /* Closed at once: answers still queued for the abuser are dropped. */
  assert_true(cl->nmsgs - 1 <= 100); /* 1 = the registration result */
  assert_int_equal(stats().bad_frames, N);
}

static void test_heartbeat(void **state) {
  (void)state;
  start_server();
  client_t *cl = client_tm("tm-1");
  uint64_t id = send_simple(cl, TXP_MSG_HEARTBEAT, NULL);
  const txp_msg_t *res = client_next(cl);
  assert_int_equal(res->type, TXP_MSG_HEARTBEAT_RESULT);
  assert_int_equal(res->request_id, id);
  assert_int_equal(res->code, 0);
  assert_int_equal(requests_seen, 0); /* answered by the server itself */
}

static void test_delayed_reply(void **state) {
  (void)state;
  start_server();
  client_t *cl = client_tm("tm-1");
  uint64_t t0 = uv_now(loop);
  uint64_t id = send_simple(cl, TXP_MSG_GLOBAL_COMMIT, "127.0.0.1:8091:1");
  /* Another request is answered while the commit is outstanding. */
  assert_served(cl);
  const txp_msg_t *res = client_next(cl);
  uv_update_time(loop);
  assert_int_equal(res->type, TXP_MSG_GLOBAL_COMMIT_RESULT);
  assert_int_equal(res->request_id, id);
  assert_int_equal(res->code, 0);
  assert_int_equal(res->global_status, TXP_GS_COMMITTED);
  assert_true(uv_now(loop) - t0 >= 25);
}

static void test_max_inflight_busy(void **state) {
  (void)state;
  opts.max_inflight = 2;
  start_server();
  client_t *cl = client_tm("tm-1");
  send_simple(cl, TXP_MSG_GLOBAL_STATUS, "x1");
  send_simple(cl, TXP_MSG_GLOBAL_STATUS, "x2");
  uint64_t id3 = send_simple(cl, TXP_MSG_GLOBAL_STATUS, "x3");
  const txp_msg_t *res = client_next(cl);
  assert_int_equal(res->request_id, id3);
  assert_int_equal(res->code, TXP_EBUSY);
  assert_int_equal(nheld, 2);
  assert_int_equal(stats().busy_replies, 1);

  /* Finishing one frees a slot. */
  uint64_t id1 = held[0]->msg.request_id;
  tc_req_reply_code(held[0], 0, NULL);
  held[0] = held[--nheld];
  res = client_next(cl);
  assert_int_equal(res->request_id, id1);
  assert_int_equal(res->code, 0);
  int want = 2;
  send_simple(cl, TXP_MSG_GLOBAL_STATUS, "x4");
  assert_true(run_until(held_at_least, &want, WAIT_MS));
  assert_int_equal(stats().busy_replies, 1);
  /* A dropped request is never answered; the slot is freed. */
  tc_req_drop(held[--nheld]);
  tc_req_drop(held[--nheld]);
  assert_served(cl);
}

static void test_max_connections(void **state) {
  (void)state;
  client_t *a = start_full_server(&opts.max_connections);

  /* A slot frees when a connection goes. */
  client_close(a);
  int want = 1; /* the server must have seen the EOF before 'd' connects */
  assert_true(run_until(connections_at_most, &want, WAIT_MS));
  client_tm("tm-d");
}

static uint64_t send_lock_query(client_t *cl) {
  txp_msg_t m;
  txp_msg_init(&m, TXP_MSG_GLOBAL_LOCK_QUERY);
  txp_msg_set_str(&m, TXP_F_RESOURCE_ID, "jdbc:a");
  txp_msg_set_str(&m, TXP_F_LOCK_KEYS, "t:1");
  return client_send(cl, &m);
}

static void test_long_message_cut(void **state) {
  (void)state;
  start_server();
  client_t *cl = client_tm("tm-1");
  uint64_t id = send_lock_query(cl);
  const txp_msg_t *res = client_next(cl);
  assert_int_equal(res->request_id, id);
  assert_int_equal(res->type, TXP_MSG_GLOBAL_LOCK_QUERY_RESULT);
  assert_int_equal(res->code, 0);
  assert_int_equal(strlen(res->message), TXP_MAX_MESSAGE_LEN);
}


/* A peer that sends but never reads: once its answers pile past the
 * write-queue cap (plus what the kernel buffers) it is closed. */
static void test_slow_reader_closed(void **state) {
  (void)state;
  enum { N = 40000 }; /* ~1 KiB answers: ~40 MiB, far past 4 MiB + socket buffers */
  opts.max_inflight = N;
  start_server();
  client_t *cl = client_tm("tm-slow");
  assert_int_equal(uv_read_stop((uv_stream_t *)&cl->tcp), 0);
  txp_buf_t b;
  txp_buf_init(&b, 0);
  for (int i = 0; i < N; i++) {
    txp_msg_t m;
    txp_msg_init(&m, TXP_MSG_GLOBAL_LOCK_QUERY);
    m.request_id = (uint64_t)(100 + i);
    txp_msg_set_str(&m, TXP_F_RESOURCE_ID, "jdbc:a");
    txp_msg_set_str(&m, TXP_F_LOCK_KEYS, "t:1");
    assert_int_equal(txp_encode(&m, &b, 0), 0);
  }
  client_write_raw(cl, b.data, b.len);
  txp_buf_free(&b);
  assert_true(run_until(no_connections, NULL, 20000));
  tc_server_stats_t st = stats();
  assert_int_equal(st.closed, 1);
}

/* Idle test: one client sends heartbeats from a timer, one stays silent. */
static void on_beat(uv_timer_t *t) {
  client_t *cl = t->data;
  if (!cl->closing) send_simple(cl, TXP_MSG_HEARTBEAT, NULL);
}

static void test_idle_timeout(void **state) {
  (void)state;
  opts.heartbeat_ms = 100;
  start_server();
  client_t *idle = client_connect();
  uv_update_time(loop);
  uint64_t t0 = uv_now(loop); /* at or before the idle client's last frame */
  assert_int_equal(client_register(idle, false, "tm-idle", NULL, TOKEN), 0);
  client_t *alive = client_tm("tm-alive");
  uv_timer_init(loop, &beat);
  beat_used = true;
  beat.data = alive;
  uv_timer_start(&beat, on_beat, 20, 20);

  assert_true(run_until(client_gone, idle, WAIT_MS));
  uv_update_time(loop);
  assert_true(uv_now(loop) - t0 >= 3 * 100);
  run_for(200);
  assert_false(alive->eof);
  assert_true(alive->nmsgs > 3);
  assert_int_equal(stats().connections, 1);
  uv_timer_stop(&beat);

  /* An unregistered, silent connection is closed the same way. */
  client_t *mute = client_connect();
  assert_true(run_until(client_gone, mute, WAIT_MS));
}

static void test_rm_registry(void **state) {
  (void)state;
  start_server();
  client_t *rm1 = client_rm("rm-1", "jdbc:a, jdbc:b", RM_PASSIVE);
  client_t *rm2 = client_rm("rm-2", "jdbc:b", RM_PASSIVE);
  client_tm("tm-1");
  assert_int_equal(rm_ups, 2);
  tc_server_stats_t st = stats();
  assert_int_equal(st.rms, 2);
  assert_int_equal(st.tms, 1);

  tc_conn_t *c = tc_server_find_rm(srv, "jdbc:a", NULL);
  assert_non_null(c);
  assert_true(tc_conn_is_rm(c));
  assert_string_equal(tc_conn_client_id(c), "rm-1");
  assert_string_equal(tc_conn_app_id(c), "shop");
  assert_non_null(strstr(tc_conn_peer(c), "127.0.0.1:"));
  c = tc_server_find_rm(srv, "jdbc:b", "rm-2");
  assert_non_null(c);
  assert_string_equal(tc_conn_client_id(c), "rm-2");
  c = tc_server_find_rm(srv, "jdbc:b", "rm-1");
  assert_non_null(c);
  assert_string_equal(tc_conn_client_id(c), "rm-1");
  assert_non_null(tc_server_find_rm(srv, "jdbc:b", "nobody"));
  assert_null(tc_server_find_rm(srv, "jdbc:c", NULL));
  assert_null(tc_server_find_rm(srv, "jdbc", NULL));

  /* Re-registering replaces the resource list. */
  assert_int_equal(client_register(rm2, true, "rm-2", "jdbc:c", TOKEN), 0);
  assert_int_equal(rm_ups, 3);
  c = tc_server_find_rm(srv, "jdbc:c", NULL);
  assert_non_null(c);
  assert_string_equal(tc_conn_client_id(c), "rm-2");
  c = tc_server_find_rm(srv, "jdbc:b", "rm-2");
  assert_string_equal(tc_conn_client_id(c), "rm-1");

  /* An RM going away is reported and no longer found. */
  client_close(rm1);
  assert_true(run_until(int_nonzero, &rm_downs, WAIT_MS));
  assert_int_equal(rm_downs, 1);
  assert_null(tc_server_find_rm(srv, "jdbc:a", NULL));
  assert_int_equal(stats().rms, 1);
}

typedef struct {
  int calls;
  int status;
  uint16_t type;
  int64_t code;
  int64_t branch_id;
  uint32_t branch_status;
} call_result_t;

static void on_call(int status, const txp_msg_t *res, void *arg) {
  call_result_t *r = arg;
  r->calls++;
  r->status = status;
  if (status == 0) {
    assert_non_null(res);
    r->type = res->type;
    r->code = res->code;
    r->branch_id = res->branch_id;
    r->branch_status = res->branch_status;
  } else {
    assert_null(res);
  }
}

static void branch_msg(txp_msg_t *m, txp_msg_type_t type, int64_t branch_id) {
  txp_msg_init(m, type);
  txp_msg_set_str(m, TXP_F_XID, "127.0.0.1:8091:1");
  txp_msg_set_int(m, TXP_F_BRANCH_ID, branch_id);
  txp_msg_set_str(m, TXP_F_RESOURCE_ID, "jdbc:a");
}

static void test_call_answered(void **state) {
  (void)state;
  start_server();
  client_rm("rm-1", "jdbc:a", RM_ANSWER);
  tc_conn_t *c = tc_server_find_rm(srv, "jdbc:a", NULL);
  assert_non_null(c);
  call_result_t r1 = {0}, r2 = {0};
  txp_msg_t m;
  branch_msg(&m, TXP_MSG_BRANCH_COMMIT, 5);
  assert_int_equal(tc_conn_call(c, &m, 1000, on_call, &r1), 0);
  assert_true(m.request_id != 0);
  uint64_t first = m.request_id;
  branch_msg(&m, TXP_MSG_BRANCH_ROLLBACK, 6);
  assert_int_equal(tc_conn_call(c, &m, 1000, on_call, &r2), 0);
  assert_true(m.request_id != first);
  assert_int_equal(r1.calls, 0); /* never inside tc_conn_call */

  assert_true(run_until(int_nonzero, &r2.calls, WAIT_MS));
  assert_true(run_until(int_nonzero, &r1.calls, WAIT_MS));
  assert_int_equal(r1.status, 0);
  assert_int_equal(r1.type, TXP_MSG_BRANCH_COMMIT_RESULT);
  assert_int_equal(r1.code, 0);
  assert_int_equal(r1.branch_id, 5);
  assert_int_equal(r1.branch_status, TXP_BS_PHASE2_COMMITTED);
  assert_int_equal(r2.status, 0);
  assert_int_equal(r2.type, TXP_MSG_BRANCH_ROLLBACK_RESULT);
  assert_int_equal(r2.branch_status, TXP_BS_PHASE2_ROLLBACKED);
  run_for(120); /* past the timeouts' sweep: no second completion */
  assert_int_equal(r1.calls, 1);
  assert_int_equal(r2.calls, 1);

  /* Only request types can be called. */
  txp_msg_init(&m, TXP_MSG_BRANCH_COMMIT_RESULT);
  assert_int_equal(tc_conn_call(c, &m, 1000, on_call, &r1), TXP_EINVALID_ARG);
}

static void test_call_timeout(void **state) {
  (void)state;
  start_server();
  client_t *rm = client_rm("rm-1", "jdbc:a", RM_PASSIVE);
  tc_conn_t *c = tc_server_find_rm(srv, "jdbc:a", NULL);
  call_result_t r = {0};
  txp_msg_t m;
  branch_msg(&m, TXP_MSG_BRANCH_COMMIT, 9);
  uint64_t t0 = uv_now(loop);
  assert_int_equal(tc_conn_call(c, &m, 100, on_call, &r), 0);
  assert_true(run_until(int_nonzero, &r.calls, WAIT_MS));
  uv_update_time(loop);
  assert_int_equal(r.status, TXP_EUNKNOWN_OUTCOME);
  assert_true(uv_now(loop) - t0 >= 100);

  /* The RM got it and answers late: ignored, no second callback. */
  const txp_msg_t *req = client_next(rm);
  assert_int_equal(req->type, TXP_MSG_BRANCH_COMMIT);
  assert_int_equal(req->request_id, m.request_id);
  txp_msg_t late;
  txp_msg_init_result(&late, req, 0, NULL);
  client_send(rm, &late);
  uint64_t hb = send_simple(rm, TXP_MSG_HEARTBEAT, NULL);
  const txp_msg_t *res = client_next(rm);
  assert_int_equal(res->request_id, hb);
  assert_int_equal(r.calls, 1);
  assert_false(rm->eof);
}

static void test_call_conn_lost(void **state) {
  (void)state;
  start_server();
  client_rm("rm-1", "jdbc:a", RM_DISCONNECT);
  tc_conn_t *c = tc_server_find_rm(srv, "jdbc:a", NULL);
  tc_conn_ref(c); /* keep the struct to check it after the close */
  call_result_t r = {0};
  txp_msg_t m;
  branch_msg(&m, TXP_MSG_BRANCH_ROLLBACK, 3);
  assert_int_equal(tc_conn_call(c, &m, 5000, on_call, &r), 0);
  assert_true(run_until(int_nonzero, &r.calls, WAIT_MS));
  assert_int_equal(r.status, TXP_ECONN_LOST);
  assert_int_equal(rm_downs, 1);
  assert_true(tc_conn_closed(c));
  assert_null(tc_server_find_rm(srv, "jdbc:a", NULL));
  branch_msg(&m, TXP_MSG_BRANCH_ROLLBACK, 3);
  assert_int_equal(tc_conn_call(c, &m, 5000, on_call, &r), TXP_ECONN_LOST);
  tc_conn_unref(c);
}

static void test_stop_with_work_outstanding(void **state) {
  (void)state;
  start_server();
  client_t *tm = client_tm("tm-1");
  client_t *rm = client_rm("rm-1", "jdbc:a", RM_PASSIVE);
  send_simple(tm, TXP_MSG_GLOBAL_STATUS, "x1");               /* held */
  send_simple(tm, TXP_MSG_GLOBAL_COMMIT, "127.0.0.1:8091:1"); /* answered in 30 ms */
  tc_conn_t *c = tc_server_find_rm(srv, "jdbc:a", NULL);
  call_result_t r = {0};
  txp_msg_t m;
  branch_msg(&m, TXP_MSG_BRANCH_COMMIT, 1);
  assert_int_equal(tc_conn_call(c, &m, 10000, on_call, &r), 0);
  assert_true(run_until(client_has_msg, rm, WAIT_MS)); /* the RM holds it */
  assert_true(run_until(int_nonzero, &nheld, WAIT_MS));

  tc_server_stop(srv, on_stopped, &stopped);
  tc_server_stop(srv, on_stopped, &stopped); /* second call: ignored */
  assert_int_equal(r.calls, 0);              /* failed from close callbacks */
  assert_true(run_until(flag_true, &stopped, WAIT_MS));
  srv = NULL; /* freed after on_stopped */
  assert_int_equal(r.calls, 1);
  assert_int_equal(r.status, TXP_ESHUTDOWN);
  assert_int_equal(rm_downs, 1);

  /* Requests outlive the server: answers are discarded, reqs freed. */
  assert_true(tc_conn_closed(held[0]->conn));
  tc_req_reply_code(held[0], 0, "too late");
  nheld = 0;
  assert_true(run_until(client_gone, tm, WAIT_MS));
  assert_true(run_until(client_gone, rm, WAIT_MS));
  run_for(60); /* the delayed GlobalCommit answer fires into a closed conn */
}

int main(void) {
  if (!getenv("TC_TEST_VERBOSE")) tc_log_level = TC_LOG_ERROR;
  const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup_teardown(test_start_errors, setup, teardown),
    cmocka_unit_test_setup_teardown(test_register_tm, setup, teardown),
    cmocka_unit_test_setup_teardown(test_register_bad_token, setup, teardown),
    cmocka_unit_test_setup_teardown(test_request_before_register, setup, teardown),
    cmocka_unit_test_setup_teardown(test_response_before_register_closes, setup, teardown),
    cmocka_unit_test_setup_teardown(test_max_connections_per_address, setup, teardown),
    cmocka_unit_test_setup_teardown(test_bad_version, setup, teardown),
    cmocka_unit_test_setup_teardown(test_garbage_closes_only_offender, setup, teardown),
    cmocka_unit_test_setup_teardown(test_body_errors_keep_connection, setup, teardown),
    cmocka_unit_test_setup_teardown(test_too_many_bad_frames, setup, teardown),
    cmocka_unit_test_setup_teardown(test_heartbeat, setup, teardown),
    cmocka_unit_test_setup_teardown(test_delayed_reply, setup, teardown),
    cmocka_unit_test_setup_teardown(test_max_inflight_busy, setup, teardown),
    cmocka_unit_test_setup_teardown(test_max_connections, setup, teardown),
    cmocka_unit_test_setup_teardown(test_long_message_cut, setup, teardown),
    cmocka_unit_test_setup_teardown(test_slow_reader_closed, setup, teardown),
    cmocka_unit_test_setup_teardown(test_idle_timeout, setup, teardown),
    cmocka_unit_test_setup_teardown(test_rm_registry, setup, teardown),
    cmocka_unit_test_setup_teardown(test_call_answered, setup, teardown),
    cmocka_unit_test_setup_teardown(test_call_timeout, setup, teardown),
    cmocka_unit_test_setup_teardown(test_call_conn_lost, setup, teardown),
    cmocka_unit_test_setup_teardown(test_stop_with_work_outstanding, setup, teardown),
  };
  return cmocka_run_group_tests_name("tc_server", tests, NULL, NULL);
}
