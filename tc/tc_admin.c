/*
 * tc_admin.c - the admin socket server: listening, peer credentials,
 * line framing, idle timeouts and answers; see tc_admin.h.  What each
 * command does is in tc_admin_exec.c.
 *
 * NOTES
 *   Connection lifecycle:
 *     1. accepted, peer credentials checked (refused: one error line, then
 *        closed);
 *     2. reading: bytes accumulate in 'buf' until a newline; a complete
 *        line stops reading and becomes a request (tc_adm_req_t) handed to
 *        the executor;
 *     3. the executor's answer is written as one JSON line; the next
 *        buffered line (pipelined requests) runs, or reading resumes;
 *     4. closed on end of input, on a write error, on a protocol error
 *        (too long, incomplete), after admin.idle_ms of silence, or when
 *        the node stops.
 *   A connection owns two handles (pipe, idle timer) and is freed after
 *   both close callbacks ran AND its request (if any) finished: a request
 *   keeps a reference, so an executor that answers after the peer went
 *   away finds a closed connection and only drops the answer.
 *
 *   Thread: the node's loop thread only.
 */
#include "tc_admin.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/un.h>
#include <unistd.h>
#include <uv.h>

#include "tc_log.h"
#include "tc_ctx.h"

typedef struct adm_conn adm_conn_t;

struct tc_admin {
  tc_ctx_t *ctx;
  tc_admin_exec_fn exec;
  uv_pipe_t listener;
  char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
  unsigned allow_uids[TC_ADM_MAX_IDS], allow_gids[TC_ADM_MAX_IDS];
  int nuids, ngids;
  unsigned own_uid;
  size_t max_request;
  uint64_t idle_ms;
  adm_conn_t *conns;
  int requests_inflight;
  bool closing;
  bool listener_closed;
  void (*done)(void *);
  void *done_arg;
  tc_admin_stats_t stats;
};

struct adm_conn {
  tc_admin_t *adm;
  uv_pipe_t pipe;
  uv_timer_t idle;
  unsigned uid, gid;
  int pid;
  char *buf;
  size_t len, cap;
  int refs;        /* open handles + the request in flight */
  bool busy;       /* a request is being served */
  bool reading;
  bool eof;        /* the peer finished sending */
  bool closing;
  bool finishing;  /* a last answer is being written, then it closes */
  bool close_when_flushed;
  int writes;      /* answers not yet written out */
  bool processing; /* inside process_lines(): no recursion */
  adm_conn_t *prev, *next;
};

typedef struct {
  uv_write_t w;
  adm_conn_t *conn;
  bool close_after;
  char *data;
} adm_write_t;

/* Answers queued on one connection before it stops reading: a peer that
 * pipelines requests without reading the answers cannot grow our memory. */
#define MAX_QUEUED_ANSWERS 16

static void conn_close(adm_conn_t *c);
static void process_lines(adm_conn_t *c);
static void admin_maybe_done(tc_admin_t *adm);

/* ------------------------------------------------------------ answers */

json_t *tc__admin_error(const char *code, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  return json_pack("{s:b, s:s, s:o}", "ok", 0, "code", code, "error", tc__admin_str(msg));
}

json_t *tc__admin_str(const char *s) {
  if (!s) return json_string("");
  json_t *j = json_string(s);
  if (j) return j;
  /* Not valid UTF-8: keep the ASCII, replace the rest. */
  size_t n = strlen(s);
  char *copy = malloc(n + 1);
  if (!copy) return NULL;
  for (size_t i = 0; i <= n; i++) copy[i] = (unsigned char)s[i] < 0x80 ? s[i] : '?';
  j = json_string(copy);
  free(copy);
  return j;
}

void tc__admin_count_repair(tc_admin_t *adm, bool refused) {
  if (refused) adm->stats.refused++;
  else adm->stats.repairs++;
}

static void conn_unref(adm_conn_t *c) {
  if (--c->refs > 0) return;
  tc_admin_t *adm = c->adm;
  if (c->prev) c->prev->next = c->next;
  else adm->conns = c->next;
  if (c->next) c->next->prev = c->prev;
  adm->stats.connections--;
  free(c->buf);
  free(c);
  admin_maybe_done(adm);
}

static void on_handle_closed(uv_handle_t *h) { conn_unref(h->data); }

static void on_written(uv_write_t *w, int status) {
  adm_write_t *aw = (adm_write_t *)w;
  adm_conn_t *c = aw->conn;
  free(aw->data);
  bool close_after = aw->close_after;
  free(aw);
  c->writes--;
  if (status < 0 || close_after || (c->writes == 0 && c->close_when_flushed)) {
    conn_close(c);
  } else if (!c->closing) {
    uv_timer_again(&c->idle); /* a reader that keeps up is not idle */
    if (c->writes == MAX_QUEUED_ANSWERS / 2 && !c->busy) process_lines(c);
  }
  conn_unref(c);
}

/* Write one answer line (takes 'answer').  'close_after': close the
 * connection once it is written. */
static void conn_send(adm_conn_t *c, json_t *answer, bool close_after) {
  if (!answer) answer = json_pack("{s:b, s:s, s:s}", "ok", 0, "code", "internal", "error", "out of memory");
  char *text = answer ? json_dumps(answer, JSON_COMPACT | JSON_ENSURE_ASCII) : NULL;
  json_decref(answer);
  if (c->closing) {
    free(text);
    return;
  }
  if (close_after) {
    /* Nothing more is read or run on this connection. */
    c->finishing = true;
    if (c->reading) uv_read_stop((uv_stream_t *)&c->pipe);
    c->reading = false;
  }
  size_t n = text ? strlen(text) : 0;
  adm_write_t *aw = text ? calloc(1, sizeof(*aw)) : NULL;
  char *line = aw ? realloc(text, n + 2) : NULL;
  if (!line) {
    free(aw);
    free(text);
    conn_close(c);
    return;
  }
  line[n] = '\n';
  line[n + 1] = '\0';
  aw->conn = c;
  aw->data = line;
  aw->close_after = close_after;
  uv_buf_t b = uv_buf_init(line, (unsigned)(n + 1));
  c->refs++;
  c->writes++;
  if (uv_write(&aw->w, (uv_stream_t *)&c->pipe, &b, 1, on_written) != 0) {
    free(line);
    free(aw);
    c->writes--;
    conn_close(c);
    conn_unref(c);
  }
}

/* Close once every answer is written out (closing a stream cancels its
 * pending writes: a long answer would be cut). */
static void conn_close_flushed(adm_conn_t *c) {
  if (c->writes == 0) {
    conn_close(c);
    return;
  }
  c->finishing = true;
  c->close_when_flushed = true;
  if (c->reading) uv_read_stop((uv_stream_t *)&c->pipe);
  c->reading = false;
}

static void conn_close(adm_conn_t *c) {
  if (c->closing) return;
  c->closing = true;
  uv_close((uv_handle_t *)&c->pipe, on_handle_closed);
  uv_close((uv_handle_t *)&c->idle, on_handle_closed);
}

static void restart_idle(adm_conn_t *c);

void tc__admin_finish(tc_adm_req_t *req, json_t *answer) {
  adm_conn_t *c = req->conn;
  tc_admin_t *adm = req->adm;
  free(req);
  adm->requests_inflight--;
  c->busy = false;
  if (!c->closing) {
    conn_send(c, answer, false);
    restart_idle(c);
    process_lines(c);
  } else {
    json_decref(answer);
  }
  conn_unref(c); /* the request's reference */
}

/* -------------------------------------------------------------- reading */

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *out) {
  adm_conn_t *c = h->data;
  (void)suggested;
  /* Room for one more byte than a request may have: a line that fills it
   * without a newline is too long. */
  size_t want = c->adm->max_request + 2;
  if (c->cap < want) {
    char *nb = realloc(c->buf, want);
    if (!nb) {
      *out = uv_buf_init(NULL, 0);
      return;
    }
    c->buf = nb;
    c->cap = want;
  }
  *out = uv_buf_init(c->buf + c->len, (unsigned)(c->cap - c->len));
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *b);

static void stop_reading(adm_conn_t *c) {
  if (!c->reading) return;
  uv_read_stop((uv_stream_t *)&c->pipe);
  c->reading = false;
}

static void start_reading(adm_conn_t *c) {
  if (c->reading || c->eof || c->closing || c->finishing) return;
  if (uv_read_start((uv_stream_t *)&c->pipe, on_alloc, on_read) == 0) c->reading = true;
  else conn_close(c);
}

static void restart_idle(adm_conn_t *c) {
  if (!c->closing) uv_timer_again(&c->idle);
}

/* Run the first complete line of 'buf', if any and nothing is running;
 * otherwise deal with what is left (too long, incomplete at EOF) or read
 * more. */
static void process_lines(adm_conn_t *c) {
  if (c->processing || c->finishing) return;
  c->processing = true;
  tc_admin_t *adm = c->adm;
  while (!c->busy && !c->closing && !c->finishing) {
    if (c->writes >= MAX_QUEUED_ANSWERS) {
      stop_reading(c); /* resumed from on_written */
      break;
    }
    char *nl = c->len ? memchr(c->buf, '\n', c->len) : NULL;
    if (!nl) {
      if (c->len > adm->max_request) {
        adm->stats.too_long++;
        conn_send(c,
                  tc__admin_error("too_long", "request too long: at most %zu bytes before the newline",
                                  adm->max_request),
                  true);
        c->len = 0;
      } else if (c->eof) {
        if (c->len) {
          adm->stats.incomplete++;
          conn_send(c,
                    tc__admin_error("incomplete",
                                    "incomplete request: %zu bytes without a newline at end of input; not executed",
                                    c->len),
                    true);
          c->len = 0;
        } else {
          conn_close_flushed(c);
        }
      } else {
        start_reading(c);
      }
      break;
    }
    size_t linelen = (size_t)(nl - c->buf);
    if (linelen > adm->max_request) {
      adm->stats.too_long++;
      conn_send(c, tc__admin_error("too_long", "request too long: at most %zu bytes before the newline", adm->max_request),
                true);
      c->len = 0;
      break;
    }
    tc_adm_cmd_t cmd;
    char err[512];
    int rc = tc_adm_parse(c->buf, linelen, &cmd, err, sizeof(err));
    size_t rest = c->len - linelen - 1;
    memmove(c->buf, nl + 1, rest);
    c->len = rest;
    if (rc != 0) {
      adm->stats.requests++;
      adm->stats.bad_requests++;
      conn_send(c, tc__admin_error("bad_request", "%s", err), false);
      continue;
    }
    if (cmd.kind == TC_ADM_NONE) continue; /* blank line */
    adm->stats.requests++;
    if (adm->closing || adm->ctx->stopping) {
      conn_send(c, tc__admin_error("shutting_down", "coordinator shutting down"), false);
      continue;
    }
    tc_adm_req_t *req = calloc(1, sizeof(*req));
    if (!req) {
      conn_send(c, NULL, false);
      continue;
    }
    req->adm = adm;
    req->ctx = adm->ctx;
    req->conn = c;
    req->uid = c->uid;
    req->gid = c->gid;
    req->pid = c->pid;
    req->cmd = cmd;
    c->busy = true;
    c->refs++;
    adm->requests_inflight++;
    stop_reading(c);
    adm->exec(req); /* may finish at once (re-entering: 'processing' holds it) */
  }
  /* (A request that finishes synchronously calls back into here, which
   * returns at once: the loop above goes on with the next line.) */
  c->processing = false;
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *b) {
  adm_conn_t *c = s->data;
  (void)b;
  if (nread == UV_ENOBUFS) {
    conn_close(c);
    return;
  }
  if (nread < 0) {
    stop_reading(c);
    c->eof = true;
    if (nread != UV_EOF) {
      conn_close(c);
      return;
    }
    process_lines(c);
    return;
  }
  if (nread == 0) return;
  c->len += (size_t)nread;
  restart_idle(c);
  process_lines(c);
}

static void on_idle(uv_timer_t *t) {
  adm_conn_t *c = t->data;
  if (c->busy || c->closing) return; /* a long command is not idleness */
  tc_admin_t *adm = c->adm;
  if (c->writes > 0) {
    /* Answers wait for a peer that has not read for admin.idle_ms. */
    adm->stats.idle_closed++;
    conn_close(c);
    return;
  }
  if (c->finishing) return;
  if (c->len) {
    adm->stats.incomplete++;
    conn_send(c,
              tc__admin_error("incomplete", "incomplete request: no newline within %" PRIu64 " ms; not executed",
                              adm->idle_ms),
              true);
    c->len = 0;
    return;
  }
  adm->stats.idle_closed++;
  conn_close(c);
}

/* ------------------------------------------------------------ accepting */

static bool id_listed(const unsigned *ids, int n, unsigned id) {
  for (int i = 0; i < n; i++)
    if (ids[i] == id) return true;
  return false;
}

static void on_connection(uv_stream_t *server, int status) {
  tc_admin_t *adm = server->data;
  if (status < 0) {
    tc_log_warn("admin socket: could not accept a connection: %s", uv_strerror(status));
    return;
  }
  adm_conn_t *c = calloc(1, sizeof(*c));
  if (!c) return;
  c->adm = adm;
  uv_pipe_init(server->loop, &c->pipe, 0);
  c->pipe.data = c;
  uv_timer_init(server->loop, &c->idle);
  c->idle.data = c;
  c->refs = 2;
  c->next = adm->conns;
  if (adm->conns) adm->conns->prev = c;
  adm->conns = c;
  adm->stats.connections++;
  if (uv_accept(server, (uv_stream_t *)&c->pipe) != 0 || adm->closing) {
    conn_close(c);
    return;
  }
  adm->stats.accepted++;
  uv_os_fd_t fd;
  struct ucred cred;
  socklen_t cl = sizeof(cred);
  if (uv_fileno((uv_handle_t *)&c->pipe, &fd) != 0 || getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0) {
    tc_log_warn("admin socket: could not read the peer credentials of a connection: %s", strerror(errno));
    conn_close(c);
    return;
  }
  c->uid = (unsigned)cred.uid;
  c->gid = (unsigned)cred.gid;
  c->pid = (int)cred.pid;
  uv_timer_start(&c->idle, on_idle, adm->idle_ms, adm->idle_ms);
  if (c->uid != adm->own_uid && !id_listed(adm->allow_uids, adm->nuids, c->uid) &&
      !id_listed(adm->allow_gids, adm->ngids, c->gid)) {
    adm->stats.denied++;
    tc_log_warn("admin socket: refused a connection from uid %u gid %u (pid %d): not in admin.allow_uids or "
                "admin.allow_gids",
                c->uid, c->gid, c->pid);
    conn_send(c,
              tc__admin_error("denied",
                              "permission denied: uid %u (gid %u) is not allowed on this admin socket; add it to "
                              "admin.allow_uids or admin.allow_gids",
                              c->uid, c->gid),
              true);
    return;
  }
  tc_log_debug("admin socket: connection from uid %u gid %u (pid %d)", c->uid, c->gid, c->pid);
  start_reading(c);
}

/* A socket file at 'path' that nothing accepts on is stale (a killed
 * tcd's): remove it.  0 if the path is free now, -1 with 'err' otherwise. */
static int clear_stale(const char *path, char *err, size_t errlen) {
  struct stat st;
  if (lstat(path, &st) != 0) {
    if (errno == ENOENT) return 0;
    snprintf(err, errlen, "could not use admin socket \"%s\": %s", path, strerror(errno));
    return -1;
  }
  if (!S_ISSOCK(st.st_mode)) {
    snprintf(err, errlen, "could not use admin socket \"%s\": the path exists and is not a socket", path);
    return -1;
  }
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    snprintf(err, errlen, "could not probe admin socket \"%s\": %s", path, strerror(errno));
    return -1;
  }
  struct sockaddr_un sa;
  memset(&sa, 0, sizeof(sa));
  sa.sun_family = AF_UNIX;
  snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
  int rc = connect(fd, (struct sockaddr *)&sa, sizeof(sa));
  int e = errno;
  close(fd);
  if (rc == 0) {
    snprintf(err, errlen, "could not use admin socket \"%s\": another process is listening on it", path);
    return -1;
  }
  if (e != ECONNREFUSED) {
    snprintf(err, errlen, "could not probe admin socket \"%s\": %s", path, strerror(e));
    return -1;
  }
  if (unlink(path) != 0 && errno != ENOENT) {
    snprintf(err, errlen, "could not remove stale admin socket \"%s\": %s", path, strerror(errno));
    return -1;
  }
  tc_log_info("removed stale admin socket \"%s\"", path);
  return 0;
}

static void free_on_close(uv_handle_t *h) { free(h->data); }

static void on_listener_closed(uv_handle_t *h) {
  tc_admin_t *adm = h->data;
  adm->listener_closed = true;
  admin_maybe_done(adm);
}

int tc_admin_start(tc_ctx_t *ctx, tc_admin_exec_fn exec, tc_admin_t **out, char *err, size_t errlen) {
  const tc_config_t *cfg = ctx->cfg;
  *out = NULL;
  if (tc_adm_check_config(cfg->admin_socket, cfg->admin_allow_uids, cfg->admin_allow_gids, cfg->admin_socket_mode,
                          err, errlen) != 0)
    return TXP_EINVALID_ARG;
  if (!cfg->admin_socket[0]) {
    snprintf(err, errlen, "admin.socket is empty");
    return TXP_EINVALID_ARG;
  }
  tc_admin_t *adm = calloc(1, sizeof(*adm));
  if (!adm) {
    snprintf(err, errlen, "out of memory");
    return TXP_ENOMEM;
  }
  unsigned mode = 0600;
  char why[128];
  tc_adm_parse_ids(cfg->admin_allow_uids, adm->allow_uids, TC_ADM_MAX_IDS, &adm->nuids, why, sizeof(why));
  tc_adm_parse_ids(cfg->admin_allow_gids, adm->allow_gids, TC_ADM_MAX_IDS, &adm->ngids, why, sizeof(why));
  tc_adm_parse_mode(cfg->admin_socket_mode, &mode);
  adm->ctx = ctx;
  adm->exec = exec;
  adm->own_uid = (unsigned)geteuid();
  adm->max_request = (size_t)cfg->admin_max_request;
  adm->idle_ms = (uint64_t)cfg->admin_idle_ms;
  snprintf(adm->path, sizeof(adm->path), "%.107s", cfg->admin_socket); /* checked: <= 107 */
  if (clear_stale(adm->path, err, errlen) != 0) {
    free(adm);
    return TXP_EINVALID_ARG;
  }
  uv_pipe_init(ctx->loop, &adm->listener, 0);
  adm->listener.data = adm;
  /* Created owner-only, then opened up to the configured mode: nobody
   * else can connect in between.  (tcd's other threads create no files.) */
  mode_t old = umask(0177);
  int rc = uv_pipe_bind(&adm->listener, adm->path);
  umask(old);
  bool bound = rc == 0;
  if (rc == 0 && chmod(adm->path, (mode_t)mode) != 0) rc = uv_translate_sys_error(errno);
  if (rc == 0) rc = uv_listen((uv_stream_t *)&adm->listener, 64, on_connection);
  if (rc != 0) {
    snprintf(err, errlen, "could not listen on admin socket \"%s\": %s", adm->path, uv_strerror(rc));
    if (bound) unlink(adm->path);
    uv_close((uv_handle_t *)&adm->listener, free_on_close); /* frees 'adm' */
    return rc;
  }
  tc_log_info("admin socket on \"%s\" (mode %04o)", adm->path, mode);
  *out = adm;
  return 0;
}

static void admin_maybe_done(tc_admin_t *adm) {
  if (!adm->closing || !adm->listener_closed || adm->conns || adm->requests_inflight) return;
  void (*done)(void *) = adm->done;
  void *arg = adm->done_arg;
  free(adm);
  if (done) done(arg);
}

void tc_admin_close(tc_admin_t *adm, void (*done)(void *), void *arg) {
  adm->closing = true;
  adm->done = done;
  adm->done_arg = arg;
  unlink(adm->path);
  for (adm_conn_t *c = adm->conns; c; c = c->next) conn_close(c);
  uv_close((uv_handle_t *)&adm->listener, on_listener_closed);
}

void tc_admin_get_stats(const tc_admin_t *adm, tc_admin_stats_t *out) { *out = adm->stats; }
