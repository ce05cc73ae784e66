/*
 * test_tc_bus.c - the peer bus without tcd: the message codec (round trips,
 * every truncation and corruption refused), and three tc_bus instances on
 * one loop talking over real nanomsg TCP pipes on loopback: heartbeats,
 * batched lock-release wake-ups, forwarded phase-two calls (answered, no RM
 * anywhere, no answer in time), no duplicate delivery, and a clean close.
 * And what makes bus messages believable (tc_bus_auth.h): the secret file,
 * the MAC, the replay window, and on live buses an intruder that joins the
 * bus and forges FORWARD_RESULTs (old format, wrong key, non-member,
 * member not asked, wrong xid), replays a captured message and sends a
 * stale one: all dropped and counted, the real answer wins; a non-member
 * is not heard; a rolling key rotation.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <nanomsg/bus.h>
#include <nanomsg/nn.h>

#include "tc_bus.h"
#include "tc_bus_auth.h"
#include "tc_bus_msg.h"
#include "bus_txb1.h"
#include "test_file.h"
#include "txclient.h"

#define KEY_A "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"
#define KEY_B "ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100"

static tc_bus_keys_t key_a(void) {
  tc_bus_keys_t k;
  assert_int_equal(tc_bus_keys_from_hex(&k, KEY_A, NULL), 0);
  return k;
}

/* Seal the one message in 'b' with KEY_A. */
static void seal(txp_buf_t *b) {
  tc_bus_keys_t k = key_a();
  assert_int_equal(tc_bus_seal(b, 0, 1, tc_bus_wall_ms(), &k), 0);
}

/* ---------------------------------------------------------------- codec */

static void count_xid(const char *xid, void *arg) {
  int *n = arg;
  assert_true(strlen(xid) > 0);
  (*n)++;
}

static void test_codec_roundtrip(void **state) {
  (void)state;
  txp_buf_t b;
  txp_buf_init(&b, 0);
  tc_bus_hdr_t h;

  assert_int_equal(tc_bus_write_hello(&b, 7, 0xdeadbeef, TC_BUS_F_LEADER, "127.0.0.1:8091"), 0);
  /* Unsealed: no MAC yet, does not parse. */
  assert_int_equal(tc_bus_parse_header(b.data, b.len, &h), TXP_EMALFORMED);
  seal(&b);
  assert_int_equal(tc_bus_parse_header(b.data, b.len, &h), 0);
  assert_true(h.seq == 1 && h.sent_ms > 0);
  assert_int_equal(h.kind, TC_BUS_HELLO);
  assert_int_equal(h.from, 7);
  assert_int_equal(h.incarnation, 0xdeadbeefu);
  assert_true(h.flags & TC_BUS_F_LEADER);
  char addr[TC_BUS_MAX_ADDR + 1];
  assert_int_equal(tc_bus_parse_hello(&h, addr, sizeof(addr)), 0);
  assert_string_equal(addr, "127.0.0.1:8091");
  txp_buf_reset(&b);

  tc_bus_released_writer_t w;
  assert_int_equal(tc_bus_released_begin(&w, &b, 3, 1, 0), 0);
  char xid[TXP_MAX_XID_LEN + 1];
  for (int i = 0; i < 500; i++) {
    snprintf(xid, sizeof(xid), "127.0.0.1:8091:%d", i);
    assert_int_equal(tc_bus_released_add(&w, xid), 0);
  }
  assert_int_equal(tc_bus_released_add(&w, ""), TXP_EINVALID_ARG);
  tc_bus_released_end(&w);
  seal(&b);
  assert_int_equal(tc_bus_parse_header(b.data, b.len, &h), 0);
  int n = 0;
  assert_int_equal(tc_bus_each_released(&h, count_xid, &n), 500);
  assert_int_equal(n, 500);
  txp_buf_reset(&b);

  /* A small batch limit: add says full, nothing half-written. */
  assert_int_equal(tc_bus_released_begin(&w, &b, 3, 1, 64), 0);
  int added = 0;
  while (tc_bus_released_add(&w, "node:123456789") == 0) added++;
  tc_bus_released_end(&w);
  assert_true(added > 0 && b.len <= 64);
  seal(&b);
  assert_int_equal(tc_bus_parse_header(b.data, b.len, &h), 0);
  n = 0;
  assert_int_equal(tc_bus_each_released(&h, count_xid, &n), added);
  txp_buf_reset(&b);

  const uint8_t frame[] = {1, 2, 3, 4, 5};
  tc_bus_forward_msg_t f = {.target = 0, .id = 0x0102030405060708ull, .timeout_ms = 9000,
                            .frame = frame, .frame_len = sizeof(frame)};
  snprintf(f.client_id, sizeof(f.client_id), "rm-1");
  assert_int_equal(tc_bus_write_forward(&b, 2, 9, &f), 0);
  seal(&b);
  assert_int_equal(tc_bus_parse_header(b.data, b.len, &h), 0);
  tc_bus_forward_msg_t g;
  assert_int_equal(tc_bus_parse_forward(&h, &g), 0);
  assert_true(g.id == f.id && g.timeout_ms == 9000 && g.frame_len == sizeof(frame));
  assert_memory_equal(g.frame, frame, sizeof(frame));
  assert_string_equal(g.client_id, "rm-1");
  txp_buf_reset(&b);

  tc_bus_result_msg_t r = {.target = 2, .id = 42, .outcome = TC_BUS_NO_RM};
  /* A result names the xid it answers. */
  assert_int_equal(tc_bus_write_result(&b, 1, 9, &r), TXP_EINVALID_ARG);
  assert_int_equal(b.len, 0);
  snprintf(r.xid, sizeof(r.xid), "x:1");
  r.branch_id = -5;
  assert_int_equal(tc_bus_write_result(&b, 1, 9, &r), 0);
  seal(&b);
  assert_int_equal(tc_bus_parse_header(b.data, b.len, &h), 0);
  tc_bus_result_msg_t q;
  assert_int_equal(tc_bus_parse_result(&h, &q), 0);
  assert_true(q.target == 2 && q.id == 42 && q.outcome == TC_BUS_NO_RM && q.frame_len == 0);
  assert_string_equal(q.xid, "x:1");
  assert_true(q.branch_id == -5);
  /* ANSWERED needs a frame, the others must not carry one. */
  txp_buf_reset(&b);
  r.outcome = TC_BUS_ANSWERED;
  assert_int_equal(tc_bus_write_result(&b, 1, 9, &r), TXP_EINVALID_ARG);
  assert_int_equal(b.len, 0);
  txp_buf_free(&b);
}

/* Parse whatever the header says, with every parser. */
static int parse_all(const void *buf, size_t len) {
  tc_bus_hdr_t h;
  int rc = tc_bus_parse_header(buf, len, &h);
  if (rc != 0) return rc;
  char addr[TC_BUS_MAX_ADDR + 1];
  tc_bus_forward_msg_t f;
  tc_bus_result_msg_t r;
  int n = 0;
  switch (h.kind) {
  case TC_BUS_HELLO: return tc_bus_parse_hello(&h, addr, sizeof(addr));
  case TC_BUS_RELEASED: return tc_bus_each_released(&h, count_xid, &n) < 0 ? TXP_EMALFORMED : 0;
  case TC_BUS_FORWARD: return tc_bus_parse_forward(&h, &f);
  default: return tc_bus_parse_result(&h, &r);
  }
}

static void test_codec_rejects(void **state) {
  (void)state;
  txp_buf_t msgs[4];
  for (int i = 0; i < 4; i++) txp_buf_init(&msgs[i], 0);
  assert_int_equal(tc_bus_write_hello(&msgs[0], 1, 1, 0, "h:1"), 0);
  seal(&msgs[0]);
  tc_bus_released_writer_t w;
  assert_int_equal(tc_bus_released_begin(&w, &msgs[1], 1, 1, 0), 0);
  assert_int_equal(tc_bus_released_add(&w, "a:1"), 0);
  assert_int_equal(tc_bus_released_add(&w, "b:2"), 0);
  tc_bus_released_end(&w);
  seal(&msgs[1]);
  const uint8_t frame[] = {9, 9, 9};
  tc_bus_forward_msg_t f = {.id = 1, .frame = frame, .frame_len = 3};
  assert_int_equal(tc_bus_write_forward(&msgs[2], 1, 1, &f), 0);
  seal(&msgs[2]);
  tc_bus_result_msg_t r = {.target = 1, .id = 1, .outcome = TC_BUS_ANSWERED, .xid = "x:9", .frame = frame,
                           .frame_len = 3};
  assert_int_equal(tc_bus_write_result(&msgs[3], 1, 1, &r), 0);
  seal(&msgs[3]);
  tc_bus_keys_t ka = key_a(), kb;
  assert_int_equal(tc_bus_keys_from_hex(&kb, KEY_B, NULL), 0);

  for (int i = 0; i < 4; i++) {
    txp_buf_t *m = &msgs[i];
    assert_int_equal(parse_all(m->data, m->len), 0);
    /* Every truncation is refused. */
    for (size_t len = 0; len < m->len; len++) assert_int_not_equal(parse_all(m->data, len), 0);
    /* A trailing byte is refused too (lengths must add up). */
    char *longer = malloc(m->len + 1);
    memcpy(longer, m->data, m->len);
    longer[m->len] = 0;
    assert_int_not_equal(parse_all(longer, m->len + 1), 0);
    free(longer);
    /* The MAC verifies with its key only; and flipping any bit never
     * crashes the parsers (it may still parse: e.g. an id) but always
     * breaks the MAC. */
    assert_int_equal(tc_bus_verify(m->data, m->len, &ka), 0);
    assert_int_equal(tc_bus_verify(m->data, m->len, &kb), TXP_EAUTH);
    tc_bus_keys_t both;
    assert_int_equal(tc_bus_keys_from_hex(&both, KEY_B, KEY_A), 0);
    assert_int_equal(tc_bus_verify(m->data, m->len, &both), 0);
    for (size_t at = 0; at < m->len; at++) {
      for (int bit = 0; bit < 8; bit++) {
        m->data[at] = (char)(m->data[at] ^ (1 << bit));
        (void)parse_all(m->data, m->len);
        assert_int_equal(tc_bus_verify(m->data, m->len, &ka), TXP_EAUTH);
        m->data[at] = (char)(m->data[at] ^ (1 << bit));
      }
    }
  }
  /* The old unauthenticated format, bad magic, node id 0, unknown kind,
   * sequence 0. */
  char *d0 = msgs[0].data;
  d0[3] = '1';
  assert_int_equal(parse_all(d0, msgs[0].len), TXP_EMALFORMED);
  d0[3] = '2';
  d0[23] = 0;
  assert_int_equal(parse_all(d0, msgs[0].len), TXP_EMALFORMED);
  d0[23] = 1;
  char *d = msgs[0].data;
  d[0] = 'X';
  assert_int_equal(parse_all(d, msgs[0].len), TXP_EMALFORMED);
  d[0] = 'T';
  d[6] = 0;
  d[7] = 0;
  assert_int_equal(parse_all(d, msgs[0].len), TXP_EMALFORMED);
  d[7] = 1;
  d[4] = 99;
  assert_int_equal(parse_all(d, msgs[0].len), TXP_EMALFORMED);
  /* A NUL inside an xid. */
  char *x = msgs[1].data + TC_BUS_HEADER_SIZE + 2 + 1;
  x[1] = '\0';
  assert_int_equal(parse_all(msgs[1].data, msgs[1].len), TXP_EMALFORMED);
  for (int i = 0; i < 4; i++) txp_buf_free(&msgs[i]);
}

static void test_replay_window(void **state) {
  (void)state;
  tc_bus_replay_t *r = malloc(sizeof(*r));
  tc_bus_replay_init(r, 30000);
  uint64_t now = 1700000000000ull;
  /* Strictly increasing per (sender, incarnation); gaps are fine. */
  static const uint64_t seqs[] = {1, 2, 2, 5, 3, 3, 100, 36, 101};
  static const int want[] = {TC_BUS_FRESH, TC_BUS_FRESH, TC_BUS_REPLAYED, TC_BUS_FRESH, TC_BUS_REPLAYED,
                             TC_BUS_REPLAYED, TC_BUS_FRESH, TC_BUS_REPLAYED, TC_BUS_FRESH};
  for (size_t i = 0; i < sizeof(seqs) / sizeof(seqs[0]); i++)
    assert_int_equal(tc_bus_replay_check(r, 2, 77, seqs[i], now, now), want[i]);
  /* Another incarnation (a restart) and another sender start afresh. */
  assert_int_equal(tc_bus_replay_check(r, 2, 78, 1, now, now), TC_BUS_FRESH);
  assert_int_equal(tc_bus_replay_check(r, 3, 77, 1, now, now), TC_BUS_FRESH);
  /* ... and the old incarnation is still remembered. */
  assert_int_equal(tc_bus_replay_check(r, 2, 77, 101, now, now), TC_BUS_REPLAYED);
  /* Stamps outside +-window. */
  assert_int_equal(tc_bus_replay_check(r, 2, 77, 200, now - 30001, now), TC_BUS_STALE);
  assert_int_equal(tc_bus_replay_check(r, 2, 77, 200, now + 30001, now), TC_BUS_STALE);
  assert_int_equal(tc_bus_replay_check(r, 2, 77, 200, now - 29000, now), TC_BUS_FRESH);
  /* Forgotten after 2 x window: what it saw can only come back stale. */
  uint64_t later = now + 60001;
  for (int i = 0; i < TC_BUS_REPLAY_SLOTS; i++)
    assert_int_equal(tc_bus_replay_check(r, (uint16_t)(10 + i), 1, 1, later, later), TC_BUS_FRESH);
  assert_int_equal(tc_bus_replay_check(r, 2, 77, 200, now, later), TC_BUS_STALE);
  free(r);
}

static void test_secret_file(void **state) {
  (void)state;
  char path[] = "/tmp/test_tc_bus_secret.XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  tc_bus_keys_t k;
  char err[512];
  assert_true(test_write_file(path, "# the cluster secret\n" KEY_A "\n", 0600));
  assert_int_equal(tc_bus_keys_load(path, &k, err, sizeof(err)), 0);
  assert_int_equal(k.n, 1);
  assert_true(test_write_file(path, KEY_B "\n\n" KEY_A "\n", 0600));
  assert_int_equal(tc_bus_keys_load(path, &k, err, sizeof(err)), 0);
  assert_int_equal(k.n, 2);
  tc_bus_keys_t want;
  assert_int_equal(tc_bus_keys_from_hex(&want, KEY_B, KEY_A), 0);
  assert_memory_equal(k.key, want.key, sizeof(k.key));
  static const struct {
    const char *text;
    mode_t mode;
    const char *says;
  } bad[] = {
    {KEY_A "\n", 0640, "chmod 600"},
    {KEY_A "\n", 0604, "chmod 600"},
    {"", 0600, "holds no key"},
    {"# nothing\n", 0600, "holds no key"},
    {"00112233\n", 0600, "64 hex digits"},
    {KEY_A "zz\n", 0600, "64 hex digits"},
    {KEY_A "\n" KEY_B "\n" KEY_A "\n", 0600, "more than 2 keys"},
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    assert_true(test_write_file(path, bad[i].text, bad[i].mode));
    err[0] = '\0';
    assert_int_equal(tc_bus_keys_load(path, &k, err, sizeof(err)), -1);
    assert_int_equal(k.n, 0);
    if (!strstr(err, bad[i].says) || !strstr(err, path)) fail_msg("case %zu: \"%s\"", i, err);
  }
  unlink(path);
  assert_int_equal(tc_bus_keys_load(path, &k, err, sizeof(err)), -1);
  assert_non_null(strstr(err, "could not open"));
}

/* ----------------------------------------------------------- live buses */

#define NBUS 3

typedef struct node {
  int id;
  tc_bus_t *bus;
  char addr[64];
  int joins[NBUS + 1];  /* on_peer(up) per peer id */
  int released;         /* xids received */
  char last_xid[TXP_MAX_XID_LEN + 1];
  int forward_mode;     /* 0 no RM, 1 answer, 2 take and never answer (until told) */
  tc_bus_fwd_t *held;
  int forwards_seen;
  bool closed;
  size_t nwait; /* lock waiters it reports */
  int logs;     /* lines its bus logged */
  char last_log[512];
} node_t;

typedef struct world {
  uv_loop_t loop;
  node_t n[NBUS];
  uv_timer_t t;
  int (*until)(struct world *);
  bool timed_out;
  /* forward results */
  int fwd_status, fwd_code, fwd_calls;
  int fwd_branch_status;
} world_t;

static world_t *W;

static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t sl = sizeof(sa);
  int port = -1;
  if (fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 &&
      getsockname(fd, (struct sockaddr *)&sa, &sl) == 0)
    port = ntohs(sa.sin_port);
  if (fd >= 0) close(fd);
  return port;
}

static void on_released(const char *xid, void *arg) {
  node_t *n = arg;
  n->released++;
  snprintf(n->last_xid, sizeof(n->last_xid), "%s", xid);
}

static size_t waiters(void *arg) {
  node_t *n = arg;
  return n->nwait;
}

static void on_log(int level, const char *msg, void *arg) {
  node_t *n = arg;
  n->logs++;
  snprintf(n->last_log, sizeof(n->last_log), "%s", msg);
}

static void on_peer(int node_id, const char *address, bool up, void *arg) {
  node_t *n = arg;
  if (up && node_id >= 1 && node_id <= NBUS) n->joins[node_id]++;
}

typedef struct later {
  uv_timer_t t;
  tc_bus_fwd_t *f;
  int type;
} later_t;

static void on_later_closed(uv_handle_t *h) { free(h->data); }

static void answer_later(uv_timer_t *t) {
  later_t *l = t->data;
  txp_msg_t req, res;
  txp_msg_init(&req, (txp_msg_type_t)l->type);
  txp_msg_init_result(&res, &req, 0, NULL);
  txp_msg_set_int(&res, TXP_F_BRANCH_STATUS, TXP_BS_PHASE2_COMMITTED);
  tc_bus_forward_reply(l->f, 0, &res);
  uv_close((uv_handle_t *)&l->t, on_later_closed);
}

static int on_forward(tc_bus_fwd_t *f, const txp_msg_t *req, const char *client_id, unsigned timeout_ms,
                      void *arg) {
  node_t *n = arg;
  n->forwards_seen++;
  assert_string_equal(req->xid, "x:1");
  assert_string_equal(client_id, "rm-7");
  if (n->forward_mode == 0) return TXP_EBRANCH_NOT_FOUND;
  if (n->forward_mode == 2) {
    n->held = f;
    return 0;
  }
  /* Answer from a later loop iteration, as tcd does (after an RM call). */
  later_t *l = calloc(1, sizeof(*l));
  l->f = f;
  l->type = req->type;
  uv_timer_init(&W->loop, &l->t);
  l->t.data = l;
  uv_timer_start(&l->t, answer_later, 5, 0);
  return 0;
}

static void on_fwd_done(int status, const txp_msg_t *res, void *arg) {
  world_t *w = arg;
  w->fwd_calls++;
  w->fwd_status = status;
  w->fwd_code = res ? (int)res->code : 0;
  w->fwd_branch_status = res ? (int)res->branch_status : 0;
}

static void on_deadline(uv_timer_t *t) {
  world_t *w = t->data;
  w->timed_out = true;
  uv_stop(&w->loop);
}

static void on_check(uv_timer_t *t);

/* Run the loop until 'until' holds or 'ms' pass. */
static bool run_until(world_t *w, int (*until)(world_t *), int ms) {
  uv_timer_t dl, chk;
  w->until = until;
  w->timed_out = false;
  uv_timer_init(&w->loop, &dl);
  dl.data = w;
  uv_timer_start(&dl, on_deadline, (uint64_t)ms, 0);
  uv_timer_init(&w->loop, &chk);
  chk.data = w;
  uv_timer_start(&chk, on_check, 1, 1);
  if (!until(w)) uv_run(&w->loop, UV_RUN_DEFAULT);
  uv_close((uv_handle_t *)&dl, NULL);
  uv_close((uv_handle_t *)&chk, NULL);
  uv_run(&w->loop, UV_RUN_NOWAIT);
  return until(w);
}

static void on_check(uv_timer_t *t) {
  world_t *w = t->data;
  if (w->until(w)) uv_stop(&w->loop);
}

static int all_up(world_t *w) {
  for (int i = 0; i < NBUS; i++)
    if (tc_bus_peers_up(w->n[i].bus) != NBUS - 1) return 0;
  return 1;
}

static int released_arrived(world_t *w) { return w->n[0].released >= 1000 && w->n[2].released >= 1000; }
static int fwd_done(world_t *w) { return w->fwd_calls > 0; }

static int setup(void **state) {
  world_t *w = calloc(1, sizeof(*w));
  W = w;
  assert_int_equal(uv_loop_init(&w->loop), 0);
  for (int i = 0; i < NBUS; i++) {
    node_t *n = &w->n[i];
    n->id = i + 1;
    snprintf(n->addr, sizeof(n->addr), "tcp://127.0.0.1:%d", free_port());
    tc_bus_keys_t k = key_a();
    tc_bus_opts_t o = {.node_id = n->id, .bind = n->addr, .advertise = "127.0.0.1:1", .heartbeat_ms = 100,
                       .keys = &k};
    o.h.on_released = on_released;
    o.h.on_forward = on_forward;
    o.h.on_peer = on_peer;
    o.h.waiters = waiters;
    o.h.log = on_log;
    o.h.arg = n;
    n->nwait = 1;
    char err[256];
    n->bus = tc_bus_new(&w->loop, &o, err, sizeof(err));
    if (!n->bus) fail_msg("tc_bus_new: %s", err);
    /* The store's node table, as the membership heartbeat reports it
     * (node 4 is a member that is not on the bus). */
    static const int members[] = {1, 2, 3, 4};
    tc_bus_set_members(n->bus, members, 4);
  }
  /* Everyone knows everyone (twice: from config and discovery). */
  for (int r = 0; r < 2; r++)
    for (int i = 0; i < NBUS; i++)
      for (int j = 0; j < NBUS; j++) assert_int_equal(tc_bus_add_peer(w->n[i].bus, w->n[j].id, w->n[j].addr), 0);
  assert_true(run_until(w, all_up, 5000));
  *state = w;
  return 0;
}

static int closed_count;
static void on_bus_closed(void *arg) {
  node_t *n = arg;
  n->closed = true;
  closed_count++;
}

static int teardown(void **state) {
  world_t *w = *state;
  closed_count = 0;
  for (int i = 0; i < NBUS; i++) {
    if (w->n[i].held) {
      /* A forward still taken: the bus waits for its answer. */
      tc_bus_close(w->n[i].bus, on_bus_closed, &w->n[i]);
      uv_run(&w->loop, UV_RUN_NOWAIT);
      uv_run(&w->loop, UV_RUN_NOWAIT);
      assert_false(w->n[i].closed);
      tc_bus_forward_reply(w->n[i].held, TXP_ESHUTDOWN, NULL);
    } else {
      tc_bus_close(w->n[i].bus, on_bus_closed, &w->n[i]);
    }
  }
  uv_run(&w->loop, UV_RUN_DEFAULT);
  assert_int_equal(closed_count, NBUS);
  assert_int_equal(uv_loop_close(&w->loop), 0);
  free(w);
  return 0;
}

static void test_heartbeats_and_release(void **state) {
  world_t *w = *state;
  /* One pipe per pair: each peer joined exactly once. */
  for (int i = 0; i < NBUS; i++)
    for (int j = 1; j <= NBUS; j++) assert_int_equal(w->n[i].joins[j], j == w->n[i].id ? 0 : 1);
  /* 1000 releases in one loop iteration leave as a few batches and all
   * arrive, once, at both peers. */
  char xid[64];
  for (int i = 0; i < 1000; i++) {
    snprintf(xid, sizeof(xid), "127.0.0.1:9:%d", i);
    tc_bus_released(w->n[1].bus, xid);
  }
  assert_true(run_until(w, released_arrived, 5000));
  uv_sleep(200);
  uv_run(&w->loop, UV_RUN_NOWAIT);
  assert_int_equal(w->n[0].released, 1000);
  assert_int_equal(w->n[2].released, 1000);
  assert_int_equal(w->n[1].released, 0);
  assert_string_equal(w->n[0].last_xid, "127.0.0.1:9:999");
  tc_bus_stats_t s;
  tc_bus_get_stats(w->n[1].bus, &s);
  assert_int_equal(s.released_sent, 1000);
  assert_true(s.sent >= 1);
}

static int node1_released(world_t *w) { return w->n[0].released > 0; }

/* Releases go only to clusters where someone waits. */
static void test_release_only_when_waited_for(void **state) {
  world_t *w = *state;
  for (int i = 0; i < NBUS; i++) w->n[i].nwait = 0;
  uv_sleep(250); /* a periodic heartbeat says "no waiters" */
  uv_run(&w->loop, UV_RUN_NOWAIT);
  run_until(w, node1_released, 300);
  tc_bus_released(w->n[1].bus, "x:skipped");
  assert_false(run_until(w, node1_released, 300));
  tc_bus_stats_t s;
  tc_bus_get_stats(w->n[1].bus, &s);
  assert_int_equal(s.released_skipped, 1);
  assert_int_equal(s.released_sent, 0);
  /* Node 1's first waiter is announced in the same loop iteration (not
   * at the next beat). */
  tc_bus_stats_t s1;
  tc_bus_get_stats(w->n[0].bus, &s1);
  w->n[0].nwait = 1;
  uv_run(&w->loop, UV_RUN_NOWAIT);
  tc_bus_stats_t s2;
  tc_bus_get_stats(w->n[0].bus, &s2);
  assert_true(s2.sent > s1.sent);
  for (int i = 0; i < 500 && !w->n[0].released; i++) {
    uv_run(&w->loop, UV_RUN_NOWAIT);
    tc_bus_released(w->n[1].bus, "x:sent");
    uv_sleep(2);
  }
  assert_true(run_until(w, node1_released, 2000));
  assert_string_equal(w->n[0].last_xid, "x:sent");
}

static void forward_once(world_t *w, unsigned timeout_ms) {
  txp_msg_t m;
  txp_msg_init(&m, TXP_MSG_BRANCH_COMMIT);
  txp_msg_set_str(&m, TXP_F_XID, "x:1");
  txp_msg_set_int(&m, TXP_F_BRANCH_ID, 5);
  txp_msg_set_str(&m, TXP_F_RESOURCE_ID, "db1");
  w->fwd_calls = 0;
  assert_int_equal(tc_bus_forward(w->n[0].bus, &m, "rm-7", timeout_ms, on_fwd_done, w), 0);
  assert_int_equal(w->fwd_calls, 0); /* never from inside the call */
}

/* Node 2 has seen the forward: it may get it after node 3 has answered. */
static int node2_saw_forward(world_t *w) { return w->n[1].forwards_seen >= 1; }

static void test_forward_answered(void **state) {
  world_t *w = *state;
  w->n[1].forward_mode = 0; /* node 2: no RM */
  w->n[2].forward_mode = 1; /* node 3: has one */
  forward_once(w, 3000);
  assert_true(run_until(w, fwd_done, 4000));
  assert_int_equal(w->fwd_status, 0);
  assert_int_equal(w->fwd_code, 0);
  assert_int_equal(w->fwd_branch_status, TXP_BS_PHASE2_COMMITTED);
  assert_true(run_until(w, node2_saw_forward, 2000));
  assert_int_equal(w->n[1].forwards_seen, 1);
  assert_int_equal(w->n[2].forwards_seen, 1);
}

static void test_forward_no_rm(void **state) {
  world_t *w = *state;
  w->n[1].forward_mode = 0;
  w->n[2].forward_mode = 0;
  uint64_t t0 = uv_hrtime();
  forward_once(w, 5000);
  assert_true(run_until(w, fwd_done, 4000));
  /* Every peer said "none": answered at once, not after the timeout. */
  assert_true(uv_hrtime() - t0 < 2000000000ull);
  assert_int_equal(w->fwd_status, 0);
  assert_int_equal(w->fwd_code, TXP_EBRANCH_RETRYABLE);
}

static void test_forward_timeout(void **state) {
  world_t *w = *state;
  w->n[1].forward_mode = 0;
  w->n[2].forward_mode = 2; /* takes it, never answers in time */
  forward_once(w, 300);
  assert_true(run_until(w, fwd_done, 3000));
  assert_int_equal(w->fwd_status, TXP_EUNKNOWN_OUTCOME);
  /* A late answer is dropped: no second completion. */
  tc_bus_forward_reply(w->n[2].held, 0, NULL);
  w->n[2].held = NULL;
  uv_sleep(100);
  uv_run(&w->loop, UV_RUN_NOWAIT);
  assert_int_equal(w->fwd_calls, 1);
  /* Without peers up, forwarding refuses synchronously. */
  tc_bus_stats_t s;
  tc_bus_get_stats(w->n[0].bus, &s);
  assert_int_equal(s.forwards_timed_out, 1);
}

static void test_close_with_forward_taken(void **state) {
  world_t *w = *state;
  w->n[1].forward_mode = 0;
  w->n[2].forward_mode = 2;
  forward_once(w, 60000);
  /* Let node 3 take it; teardown closes node 3 with the forward held (the
   * bus must wait for its answer) and node 1 with its forward pending
   * (completed with TXP_ESHUTDOWN). */
  while (!w->n[2].held) uv_run(&w->loop, UV_RUN_ONCE);
}

/* ------------------------------------------------------------ intruders */

/* Run the loop for about 'ms' (the intruder's socket is polled between). */
static void pump(world_t *w, int ms) {
  for (int i = 0; i < ms; i += 5) {
    uv_run(&w->loop, UV_RUN_NOWAIT);
    uv_sleep(5);
  }
  uv_run(&w->loop, UV_RUN_NOWAIT);
}

/* A BranchCommit result claiming the RM gave up (not what node 3 says). */
static void forged_frame(txp_buf_t *frame, const char *xid, int64_t branch_id) {
  txp_msg_t res;
  txc_branch_result(&res, TXP_MSG_BRANCH_COMMIT, xid, branch_id, TXP_BS_PHASE2_COMMIT_FAILED_UNRETRYABLE);
  txp_buf_init(frame, 0);
  assert_int_equal(txp_encode(&res, frame, 0), 0);
}

/* A FORWARD_RESULT for forward 'id' to node 1, sealed with 'k' as 'from'. */
static void send_forged(int s, uint16_t from, const tc_bus_keys_t *k, uint64_t id, const char *xid, int64_t branch_id,
                        uint64_t sent_ms) {
  txp_buf_t frame, b;
  forged_frame(&frame, xid, branch_id);
  txp_buf_init(&b, 0);
  tc_bus_result_msg_t r = {.target = 1, .id = id, .outcome = TC_BUS_ANSWERED, .branch_id = branch_id,
                           .frame = (const uint8_t *)frame.data, .frame_len = (uint32_t)frame.len};
  snprintf(r.xid, sizeof(r.xid), "%s", xid);
  assert_int_equal(tc_bus_write_result(&b, from, 0x5eed, &r), 0);
  static uint64_t seq; /* each one new: only the check under test refuses it */
  assert_int_equal(tc_bus_seal(&b, 0, ++seq, sent_ms, k), 0);
  assert_true(nn_send(s, b.data, b.len, 0) == (int)b.len);
  txp_buf_free(&b);
  txp_buf_free(&frame);
}

/* What the old code accepted (shared/security/bus.py): the TXB1 format,
 * no MAC, any node id. */
static void send_old_format(int s, uint64_t id, const char *xid) {
  txp_buf_t frame;
  forged_frame(&frame, xid, 5);
  assert_true(bus_send_txb1(s, 1, id, &frame) > 0);
  txp_buf_free(&frame);
}

static int intruder_open(world_t *w) {
  int s = nn_socket(AF_SP, NN_BUS);
  assert_true(s >= 0);
  assert_true(nn_connect(s, w->n[0].addr) >= 0);
  assert_true(nn_connect(s, w->n[1].addr) >= 0);
  pump(w, 300);
  return s;
}

/* A process that joins the bus sees node 1's FORWARD and answers it in
 * every way it can think of; only node 3's real answer counts. */
static void test_intruder(void **state) {
  world_t *w = *state;
  w->n[1].forward_mode = 0; /* node 2: no RM */
  w->n[2].forward_mode = 2; /* node 3: takes it, answers when told */
  int s = intruder_open(w);
  forward_once(w, 20000);
  uint64_t fid = 0;
  txp_buf_t captured; /* a message of node 2's, for a replay */
  txp_buf_init(&captured, 0);
  for (int i = 0; i < 600 && (!fid || !captured.len || !w->n[2].held); i++) {
    pump(w, 5);
    void *buf = NULL;
    int n;
    while ((n = nn_recv(s, &buf, NN_MSG, NN_DONTWAIT)) >= 0) {
      tc_bus_hdr_t h;
      tc_bus_forward_msg_t f;
      if (tc_bus_parse_header(buf, (size_t)n, &h) == 0) {
        if (h.from == 1 && h.kind == TC_BUS_FORWARD && tc_bus_parse_forward(&h, &f) == 0) fid = f.id;
        if (h.from == 2 && !captured.len) txp_buf_append(&captured, buf, (size_t)n);
      }
      nn_freemsg(buf);
    }
  }
  bool got = fid != 0 && captured.len > 0 && w->n[2].held;
  if (!got) txp_buf_free(&captured);
  assert_true(got);
  pump(w, 200); /* node 1 has heard node 2's captured message, and later ones */
  tc_bus_stats_t s0, s1;
  tc_bus_get_stats(w->n[0].bus, &s0);
  int logs0 = w->n[0].logs;
  tc_bus_keys_t ka = key_a(), kb;
  assert_int_equal(tc_bus_keys_from_hex(&kb, KEY_B, NULL), 0);
  uint64_t now = tc_bus_wall_ms();
  send_old_format(s, fid, "x:1");                       /* old format: malformed */
  send_forged(s, 3, &kb, fid, "x:1", 5, now);           /* another key: bad MAC */
  send_forged(s, 777, &ka, fid, "x:1", 5, now);         /* not in the node table */
  send_forged(s, 4, &ka, fid, "x:1", 5, now);           /* a member it was not sent to */
  send_forged(s, 3, &ka, fid, "x:2", 5, now);           /* another xid */
  send_forged(s, 3, &ka, fid, "x:1", 6, now);           /* another branch */
  send_forged(s, 3, &ka, fid, "x:1", 5, now - 120000);  /* two minutes old */
  assert_true(nn_send(s, captured.data, captured.len, 0) == (int)captured.len); /* a replay */
  txp_buf_free(&captured);
  pump(w, 300);
  assert_int_equal(w->fwd_calls, 0); /* nothing forged completed the call */
  tc_bus_get_stats(w->n[0].bus, &s1);
  assert_int_equal(s1.rejected[TC_BUS_REJECT_MALFORMED] - s0.rejected[TC_BUS_REJECT_MALFORMED], 1);
  assert_int_equal(s1.rejected[TC_BUS_REJECT_BAD_MAC] - s0.rejected[TC_BUS_REJECT_BAD_MAC], 1);
  assert_int_equal(s1.rejected[TC_BUS_REJECT_NOT_MEMBER] - s0.rejected[TC_BUS_REJECT_NOT_MEMBER], 1);
  assert_int_equal(s1.rejected[TC_BUS_REJECT_UNEXPECTED] - s0.rejected[TC_BUS_REJECT_UNEXPECTED], 3);
  assert_int_equal(s1.rejected[TC_BUS_REJECT_STALE] - s0.rejected[TC_BUS_REJECT_STALE], 1);
  assert_int_equal(s1.rejected[TC_BUS_REJECT_REPLAYED] - s0.rejected[TC_BUS_REJECT_REPLAYED], 1);
  /* Logged once per claimed sender: 0 (unparsable), 3, 777, 4, 2. */
  int logs1 = w->n[0].logs;
  assert_true(logs1 - logs0 >= 1 && logs1 - logs0 <= 5);
  for (int i = 0; i < 50; i++) send_forged(s, 3, &kb, fid, "x:1", 5, now);
  pump(w, 200);
  assert_int_equal(w->n[0].logs, logs1); /* counted, not logged again */
  tc_bus_get_stats(w->n[0].bus, &s0);
  assert_int_equal(s0.rejected[TC_BUS_REJECT_BAD_MAC] - s1.rejected[TC_BUS_REJECT_BAD_MAC], 50);

  /* Node 3's real answer completes the call. */
  txp_msg_t req, res;
  txp_msg_init(&req, TXP_MSG_BRANCH_COMMIT);
  txp_msg_init_result(&res, &req, 0, NULL);
  txp_msg_set_int(&res, TXP_F_BRANCH_STATUS, TXP_BS_PHASE2_COMMITTED);
  tc_bus_forward_reply(w->n[2].held, 0, &res);
  w->n[2].held = NULL;
  assert_true(run_until(w, fwd_done, 3000));
  assert_int_equal(w->fwd_status, 0);
  assert_int_equal(w->fwd_code, 0);
  assert_int_equal(w->fwd_branch_status, TXP_BS_PHASE2_COMMITTED);
  nn_close(s);
}

static int node1_sees_one(world_t *w) { return tc_bus_peers_up(w->n[0].bus) == 1; }

/* A node id not in the node table is not heard, and not asked. */
static void test_not_member(void **state) {
  world_t *w = *state;
  static const int only2[] = {2};
  tc_bus_set_members(w->n[0].bus, only2, 1);
  assert_true(run_until(w, node1_sees_one, 3000));
  tc_bus_stats_t st;
  tc_bus_get_stats(w->n[0].bus, &st);
  assert_true(st.rejected[TC_BUS_REJECT_NOT_MEMBER] > 0);
  /* Node 3 has the RM, but only node 2 is asked (and heard). */
  w->n[1].forward_mode = 0;
  w->n[2].forward_mode = 1;
  forward_once(w, 3000);
  assert_true(run_until(w, fwd_done, 4000));
  assert_int_equal(w->fwd_status, 0);
  assert_int_equal(w->fwd_code, TXP_EBRANCH_RETRYABLE);
  static const int all[] = {1, 2, 3};
  tc_bus_set_members(w->n[0].bus, all, 3);
  assert_true(run_until(w, all_up, 3000));
}

static int node2_lost_node1(world_t *w) { return tc_bus_peers_up(w->n[1].bus) == 1; }

/* A rolling rotation keeps everyone talking; a node with a key the others
 * do not have is not heard. */
static void test_rotation(void **state) {
  world_t *w = *state;
  tc_bus_keys_t a = key_a(), b, ab, ba;
  assert_int_equal(tc_bus_keys_from_hex(&b, KEY_B, NULL), 0);
  assert_int_equal(tc_bus_keys_from_hex(&ab, KEY_A, KEY_B), 0);
  assert_int_equal(tc_bus_keys_from_hex(&ba, KEY_B, KEY_A), 0);
  assert_int_equal(tc_bus_set_keys(w->n[0].bus, &b), 0); /* too early: only B */
  assert_true(run_until(w, node2_lost_node1, 3000));
  tc_bus_stats_t st;
  tc_bus_get_stats(w->n[1].bus, &st);
  assert_true(st.rejected[TC_BUS_REJECT_BAD_MAC] > 0);
  /* Step 1, node by node (sign A, accept B): all heard again. */
  for (int i = 0; i < NBUS; i++) assert_int_equal(tc_bus_set_keys(w->n[i].bus, &ab), 0);
  assert_true(run_until(w, all_up, 3000));
  pump(w, 100);
  /* Steps 2 (sign B, accept A) and 3 (B only), node by node, a little
   * time between: nobody drops anything. */
  tc_bus_stats_t s0[NBUS], s1[NBUS];
  for (int i = 0; i < NBUS; i++) tc_bus_get_stats(w->n[i].bus, &s0[i]);
  for (int step = 0; step < 2; step++) {
    for (int i = 0; i < NBUS; i++) {
      assert_int_equal(tc_bus_set_keys(w->n[i].bus, step == 0 ? &ba : &b), 0);
      pump(w, 50);
    }
    pump(w, 100);
  }
  pump(w, 300);
  for (int i = 0; i < NBUS; i++) {
    tc_bus_get_stats(w->n[i].bus, &s1[i]);
    assert_int_equal(s1[i].bad_messages, s0[i].bad_messages);
    assert_true(s1[i].received > s0[i].received);
  }
  assert_true(all_up(w));
  assert_int_equal(tc_bus_set_keys(w->n[0].bus, &(tc_bus_keys_t){0}), TXP_EINVALID_ARG);
  (void)a;
}

static void test_needs_secret(void **state) {
  (void)state;
  uv_loop_t loop;
  assert_int_equal(uv_loop_init(&loop), 0);
  char addr[64], err[256] = "";
  snprintf(addr, sizeof(addr), "tcp://127.0.0.1:%d", free_port());
  tc_bus_opts_t o = {.node_id = 1, .bind = addr};
  assert_null(tc_bus_new(&loop, &o, err, sizeof(err)));
  assert_non_null(strstr(err, "cluster.secret_file"));
  assert_int_equal(uv_loop_close(&loop), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_codec_roundtrip),
    cmocka_unit_test(test_codec_rejects),
    cmocka_unit_test(test_replay_window),
    cmocka_unit_test(test_secret_file),
    cmocka_unit_test(test_needs_secret),
    cmocka_unit_test_setup_teardown(test_heartbeats_and_release, setup, teardown),
    cmocka_unit_test_setup_teardown(test_release_only_when_waited_for, setup, teardown),
    cmocka_unit_test_setup_teardown(test_forward_answered, setup, teardown),
    cmocka_unit_test_setup_teardown(test_forward_no_rm, setup, teardown),
    cmocka_unit_test_setup_teardown(test_forward_timeout, setup, teardown),
    cmocka_unit_test_setup_teardown(test_close_with_forward_taken, setup, teardown),
    cmocka_unit_test_setup_teardown(test_intruder, setup, teardown),
    cmocka_unit_test_setup_teardown(test_not_member, setup, teardown),
    cmocka_unit_test_setup_teardown(test_rotation, setup, teardown),
  };
  return cmocka_run_group_tests_name("tc_bus", tests, NULL, NULL);
}
