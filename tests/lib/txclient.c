/*
 * txclient.c - see txclient.h.
 */
#include "txclient.h"
#include "txp_status.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

struct txc {
  int fd;
  txp_decoder_t *dec;
  txp_buf_t out;
  uint64_t next_id;
  txc_handler_fn handler;
  void *handler_arg;
  bool closed;
};

double txc_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

txc_t *txc_connect(const char *host, int port, int timeout_ms, char *err, size_t errlen) {
  struct sockaddr_in sa;
  memset(&sa, 0, sizeof(sa));
  sa.sin_family = AF_INET;
  sa.sin_port = htons((uint16_t)port);
  if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) {
    snprintf(err, errlen, "invalid IPv4 address \"%s\"", host);
    return NULL;
  }
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) {
    snprintf(err, errlen, "socket: %s", strerror(errno));
    return NULL;
  }
  int rc = connect(fd, (struct sockaddr *)&sa, sizeof(sa));
  if (rc != 0 && errno == EINPROGRESS) {
    struct pollfd p = {fd, POLLOUT, 0};
    rc = poll(&p, 1, timeout_ms) == 1 ? 0 : -1;
    int soerr = 0;
    socklen_t sl = sizeof(soerr);
    if (rc == 0 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) == 0 && soerr) {
      errno = soerr;
      rc = -1;
    } else if (rc != 0) {
      errno = ETIMEDOUT;
    }
  }
  if (rc != 0) {
    snprintf(err, errlen, "connect %s:%d: %s", host, port, strerror(errno));
    close(fd);
    return NULL;
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  txc_t *c = calloc(1, sizeof(*c));
  if (!c || !(c->dec = txp_decoder_new(NULL))) {
    free(c);
    close(fd);
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  c->fd = fd;
  c->next_id = 1;
  txp_buf_init(&c->out, 0);
  return c;
}

void txc_close(txc_t *c) {
  if (!c) return;
  close(c->fd);
  txp_decoder_free(c->dec);
  txp_buf_free(&c->out);
  free(c);
}

int txc_fd(const txc_t *c) { return c->fd; }

void txc_set_handler(txc_t *c, txc_handler_fn fn, void *arg) {
  c->handler = fn;
  c->handler_arg = arg;
}

static int flush_out(txc_t *c) {
  size_t off = 0;
  while (off < c->out.len) {
    ssize_t n = send(c->fd, c->out.data + off, c->out.len - off, MSG_NOSIGNAL);
    if (n > 0) {
      off += (size_t)n;
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      struct pollfd p = {c->fd, POLLOUT, 0};
      poll(&p, 1, 1000);
      continue;
    }
    c->closed = true;
    return TXP_ECONN_LOST;
  }
  txp_buf_reset(&c->out);
  return 0;
}

int txc_send_raw(txc_t *c, const void *buf, size_t len) {
  if (txp_buf_append(&c->out, buf, len) != 0) return TXP_ENOMEM;
  return flush_out(c);
}

static int send_msg(txc_t *c, const txp_msg_t *m) {
  int rc = txp_encode(m, &c->out, 0);
  if (rc != 0) return rc;
  return flush_out(c);
}

int txc_send_msg(txc_t *c, const txp_msg_t *m) { return send_msg(c, m); }

/* Read what is available (waiting up to 'timeout_ms' for the first byte). */
static int read_some(txc_t *c, int timeout_ms) {
  struct pollfd p = {c->fd, POLLIN, 0};
  int pr = poll(&p, 1, timeout_ms < 0 ? 0 : timeout_ms);
  if (pr == 0) return 0;
  if (pr < 0) return errno == EINTR ? 0 : TXP_ECONN_LOST;
  char buf[65536];
  ssize_t n = recv(c->fd, buf, sizeof(buf), 0);
  if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
    c->closed = true;
    return TXP_ECONN_LOST;
  }
  if (n < 0) return 0;
  int rc = txp_decoder_feed(c->dec, buf, (size_t)n);
  return rc ? rc : (int)n;
}

static void serve(txc_t *c, txp_msg_t *req) {
  txp_msg_t res;
  txp_msg_init_result(&res, req, 0, NULL);
  if (c->handler && c->handler(c, req, &res, c->handler_arg) == 0) send_msg(c, &res);
}

/* Take decoded messages: answers matching 'want_id' go to 'res' (returns
 * 1), requests are served, others dropped. */
static int drain(txc_t *c, uint64_t want_id, txp_msg_t *res, int *served) {
  for (;;) {
    txp_msg_t m;
    txp_msg_init(&m, TXP_MSG_NONE);
    int rc = txp_decoder_next(c->dec, &m);
    if (rc == TXP_EAGAIN) return 0;
    if (rc != 0) {
      txp_msg_clear(&m);
      if (rc == TXP_EBAD_MAGIC || rc == TXP_EBAD_VERSION || rc == TXP_EFRAME_TOO_BIG) return rc;
      continue;
    }
    if (m.flags & TXP_FLAG_RESPONSE || m.type == TXP_MSG_ERROR) {
      if (want_id && (m.request_id == want_id || m.type == TXP_MSG_ERROR)) {
        *res = m;
        return 1;
      }
      txp_msg_clear(&m);
      continue;
    }
    serve(c, &m);
    if (served) (*served)++;
    txp_msg_clear(&m);
  }
}

int txc_call(txc_t *c, txp_msg_t *req, txp_msg_t *res, int timeout_ms) {
  if (c->closed) return TXP_ECONN_LOST;
  req->request_id = c->next_id++;
  int rc = send_msg(c, req);
  if (rc != 0) return rc;
  double deadline = txc_now_ms() + timeout_ms;
  txp_msg_init(res, TXP_MSG_NONE);
  for (;;) {
    rc = drain(c, req->request_id, res, NULL);
    if (rc == 1) return 0;
    if (rc < 0) return TXP_ECONN_LOST;
    double left = deadline - txc_now_ms();
    if (left <= 0) return TXP_EUNKNOWN_OUTCOME;
    rc = read_some(c, (int)left + 1);
    if (rc < 0) {
      /* answers may already be buffered before the close */
      if (drain(c, req->request_id, res, NULL) == 1) return 0;
      return TXP_ECONN_LOST;
    }
  }
}

int txc_poll(txc_t *c, int timeout_ms, bool once) {
  int served = 0;
  double deadline = txc_now_ms() + timeout_ms;
  for (;;) {
    int rc = drain(c, 0, NULL, &served);
    if (rc < 0) return TXP_ECONN_LOST;
    if (once && served) return served;
    double left = deadline - txc_now_ms();
    if (left <= 0) return served;
    rc = read_some(c, (int)left + 1);
    if (rc < 0) {
      drain(c, 0, NULL, &served);
      return served ? served : TXP_ECONN_LOST;
    }
  }
}

bool txc_wait_closed(txc_t *c, int timeout_ms) {
  double deadline = txc_now_ms() + timeout_ms;
  while (!c->closed) {
    double left = deadline - txc_now_ms();
    if (left <= 0) return false;
    if (read_some(c, (int)left + 1) < 0) return true;
    drain(c, 0, NULL, NULL);
  }
  return true;
}

int txc_register(txc_t *c, bool rm, const char *app, const char *client_id, const char *token,
                 const char *resource_ids) {
  txp_msg_t req, res;
  txp_msg_init(&req, rm ? TXP_MSG_REGISTER_RM : TXP_MSG_REGISTER_TM);
  txp_msg_set_str(&req, TXP_F_APP_ID, app);
  txp_msg_set_str(&req, TXP_F_CLIENT_ID, client_id);
  if (token) txp_msg_set_str(&req, TXP_F_TOKEN, token);
  if (rm && resource_ids) txp_msg_set_str(&req, TXP_F_RESOURCE_IDS, resource_ids);
  int rc = txc_call(c, &req, &res, 5000);
  if (rc == 0) rc = (int)res.code;
  txp_msg_clear(&res);
  return rc;
}

bool txc_serving(const char *host, int port, const char *token, int timeout_ms) {
  char err[256];
  txc_t *c = txc_connect(host, port, timeout_ms, err, sizeof(err));
  if (!c) return false;
  int rc = txc_register(c, false, "probe", "probe", token, NULL);
  txc_close(c);
  return rc == 0;
}

static int simple_call(txc_t *c, txp_msg_t *req, int *status_out) {
  txp_msg_t res;
  int rc = txc_call(c, req, &res, 15000);
  if (rc == 0) {
    rc = (int)res.code;
    if (status_out) *status_out = (int)res.global_status;
  }
  txp_msg_clear(&res);
  return rc;
}

int txc_begin(txc_t *c, uint32_t timeout_ms, const char *name, const char *idem, char *xid_out) {
  txp_msg_t req, res;
  txp_msg_init(&req, TXP_MSG_GLOBAL_BEGIN);
  if (timeout_ms) txp_msg_set_int(&req, TXP_F_TIMEOUT_MS, timeout_ms);
  if (name) txp_msg_set_str(&req, TXP_F_NAME, name);
  if (idem) txp_msg_set_str(&req, TXP_F_IDEM_KEY, idem);
  int rc = txc_call(c, &req, &res, 15000);
  if (rc == 0) {
    rc = (int)res.code;
    if (rc == 0) snprintf(xid_out, TXP_MAX_XID_LEN + 1, "%s", res.xid ? res.xid : "");
  }
  txp_msg_clear(&res);
  return rc;
}

int txc_commit(txc_t *c, const char *xid, int *status_out) {
  txp_msg_t req;
  txp_msg_init(&req, TXP_MSG_GLOBAL_COMMIT);
  txp_msg_set_str(&req, TXP_F_XID, xid);
  return simple_call(c, &req, status_out);
}

int txc_rollback(txc_t *c, const char *xid, int *status_out) {
  txp_msg_t req;
  txp_msg_init(&req, TXP_MSG_GLOBAL_ROLLBACK);
  txp_msg_set_str(&req, TXP_F_XID, xid);
  return simple_call(c, &req, status_out);
}

int txc_status(txc_t *c, const char *xid, int *status_out) {
  txp_msg_t req;
  txp_msg_init(&req, TXP_MSG_GLOBAL_STATUS);
  txp_msg_set_str(&req, TXP_F_XID, xid);
  return simple_call(c, &req, status_out);
}

int txc_branch_register(txc_t *c, const char *xid, const char *resource, const char *lock_keys,
                        uint32_t lock_wait_ms, int64_t *branch_out, uint32_t *waited_ms) {
  return txc_branch_register_data(c, xid, resource, lock_keys, NULL, lock_wait_ms, branch_out, waited_ms);
}

int txc_branch_register_data(txc_t *c, const char *xid, const char *resource, const char *lock_keys,
                             const char *app_data, uint32_t lock_wait_ms, int64_t *branch_out,
                             uint32_t *waited_ms) {
  txp_msg_t req, res;
  txp_msg_init(&req, TXP_MSG_BRANCH_REGISTER);
  txp_msg_set_str(&req, TXP_F_XID, xid);
  txp_msg_set_int(&req, TXP_F_BRANCH_TYPE, TXP_BT_AT);
  txp_msg_set_str(&req, TXP_F_RESOURCE_ID, resource);
  if (lock_keys) txp_msg_set_str(&req, TXP_F_LOCK_KEYS, lock_keys);
  if (app_data) txp_msg_set_str(&req, TXP_F_APP_DATA, app_data);
  if (lock_wait_ms) txp_msg_set_int(&req, TXP_F_LOCK_WAIT_MS, lock_wait_ms);
  int rc = txc_call(c, &req, &res, 15000 + (int)lock_wait_ms);
  if (rc == 0) {
    rc = (int)res.code;
    if (branch_out) *branch_out = res.branch_id;
    if (waited_ms) *waited_ms = res.waited_ms;
  }
  txp_msg_clear(&res);
  return rc;
}

void txc_branch_result(txp_msg_t *res, int req_type, const char *xid, int64_t branch_id, int status) {
  txp_msg_init(res, (txp_msg_type_t)(req_type + 1));
  res->flags = TXP_FLAG_RESPONSE;
  txp_msg_set_int(res, TXP_F_CODE, 0);
  txp_msg_set_str(res, TXP_F_XID, xid);
  txp_msg_set_int(res, TXP_F_BRANCH_ID, branch_id);
  txp_msg_set_int(res, TXP_F_BRANCH_STATUS, status);
}

int txc_phase2_done(int req_type) {
  return req_type == TXP_MSG_BRANCH_COMMIT ? TXP_BS_PHASE2_COMMITTED : TXP_BS_PHASE2_ROLLBACKED;
}
