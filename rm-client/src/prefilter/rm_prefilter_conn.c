/*
 * rm_prefilter_conn.c - the prefilter's pool of blocking Redis connections
 * (see rm_prefilter_conn.h for why blocking, and for the contract).
 *
 * NOTES
 *   Life of a connection:
 *     1. connect: redisConnectWithTimeout (non-blocking connect, poll for
 *        at most connect_timeout_ms), then SO_RCVTIMEO/SO_SNDTIMEO set to
 *        command_timeout_ms, then one pipelined round of AUTH and SELECT
 *        (when the URL has them) and SCRIPT LOAD of every script; their
 *        SHA1s are kept on the connection.  Any failure closes it and the
 *        pool's backoff starts: no new connect before retry_at.
 *     2. in use by one thread: each command is written whole with send()
 *        and its reply read with recv() into hiredis's reader.
 *     3. idle in the pool (LIFO: the warmest connection first); checked for
 *        a pending EOF before reuse when idle for a while.
 *     4. closed: after any transport error or timeout, when found stale,
 *        or at pool destruction.
 *   'open' counts connections in states 1-3, bounded by max_conns; a
 *   caller finding none idle and no free slot waits on 'cv' at most the
 *   command timeout.
 */
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "rm_prefilter_conn.h"
#include "rm_prefilter_lua.h"
#include "txc_worker.h"

#define STALE_CHECK_IDLE_MS 20 /* check idle connections older than this */
#define BACKOFF_MIN_MS 50
#define RECV_BUF 16384
#define SENTINEL_BACKOFF_MAX_MS 250 /* with Sentinel: look for the new master soon */

/* ---------------------------------------------------- errors, logging --- */



static struct timeval ms_tv(unsigned ms) {
  struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};
  return tv;
}

/* ------------------------------------------------------------ the pool --- */

int rm__pf_pool_init(rm_pf_pool_t *p, const rm_pf_url_t *url, unsigned cmd_timeout_ms,
                     unsigned connect_timeout_ms, unsigned max_conns, unsigned backoff_max_ms,
                     rm_logger_t *log) {
  memset(p, 0, sizeof(*p));
  p->url = *url;
  p->cmd_timeout_ms = cmd_timeout_ms;
  p->connect_timeout_ms = connect_timeout_ms;
  p->max_conns = max_conns;
  if (url->nsentinels && backoff_max_ms > SENTINEL_BACKOFF_MAX_MS) backoff_max_ms = SENTINEL_BACKOFF_MAX_MS;
  p->backoff_min_ms = BACKOFF_MIN_MS < backoff_max_ms ? BACKOFF_MIN_MS : backoff_max_ms;
  p->backoff_max_ms = backoff_max_ms;
  p->log = log;
  for (int i = 0; i < RM_PF_S__COUNT; i++) {
    const char *name = rm__pf_script_name(i);
    for (size_t j = 0; j < rm__pf_lua_count; j++) {
      if (strcmp(rm__pf_lua[j].name, name) == 0) {
        p->script_text[i] = rm__pf_lua[j].text;
        p->script_len[i] = rm__pf_lua[j].len;
      }
    }
    if (!p->script_text[i]) {
      rm__errmsg_set("script \"%s\" is missing from the library (lua/%s.lua)", name, name);
      return RM_E_INVALID;
    }
  }
  if (pthread_mutex_init(&p->mu, NULL) != 0) return RM_E_NOMEM;
  if (pthread_mutex_init(&p->resolve_mu, NULL) != 0) {
    pthread_mutex_destroy(&p->mu);
    return RM_E_NOMEM;
  }
  if (txc_cond_init_monotonic(&p->cv) != 0) goto fail_mutex;
  atomic_init(&p->connects, 0);
  atomic_init(&p->connect_failures, 0);
  atomic_init(&p->noscript_reloads, 0);
  atomic_init(&p->stale_closed, 0);
  atomic_init(&p->master_changes, 0);
  return 0;

fail_mutex:
  pthread_mutex_destroy(&p->resolve_mu);
  pthread_mutex_destroy(&p->mu);
  return RM_E_NOMEM;
}

static void conn_close(rm_pf_conn_t *c) {
  if (!c) return;
  redisFree(c->ctx);
  free(c);
}

void rm__pf_pool_destroy(rm_pf_pool_t *p) {
  rm_pf_conn_t *c = p->idle;
  while (c) {
    rm_pf_conn_t *next = c->next;
    conn_close(c);
    c = next;
  }
  p->idle = NULL;
  pthread_cond_destroy(&p->cv);
  pthread_mutex_destroy(&p->resolve_mu);
  pthread_mutex_destroy(&p->mu);
}

unsigned rm__pf_pool_open(rm_pf_pool_t *p) {
  unsigned n;
  pthread_mutex_lock(&p->mu);
  n = p->open;
  pthread_mutex_unlock(&p->mu);
  return n;
}

/* ------------------------------------------------------- socket I/O --- */

/* Write all of 'buf'.  0; RM_E_CONN_LOST when not one byte left (the
 * command did not reach Redis); RM_E_UNKNOWN_OUTCOME when part of it did. */
static int send_all(rm_pf_pool_t *p, rm_pf_conn_t *c, const char *buf, size_t len) {
  size_t done = 0;
  while (done < len) {
    ssize_t n = send(c->ctx->fd, buf + done, len - done, MSG_NOSIGNAL);
    if (n > 0) {
      done += (size_t)n;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      rm__errmsg_set("could not send to Redis at \"%s:%d\": no progress within %u ms", c->host,
                     c->port, p->cmd_timeout_ms);
    else
      rm__errmsg_set("could not send to Redis at \"%s:%d\": %s", c->host, c->port,
                     n < 0 ? strerror(errno) : "connection closed");
    return done == 0 ? RM_E_CONN_LOST : RM_E_UNKNOWN_OUTCOME;
  }
  return 0;
}

/* Read one reply.  0 or RM_E_UNKNOWN_OUTCOME. */
static int read_reply(rm_pf_pool_t *p, rm_pf_conn_t *c, redisReply **out) {
  char buf[RECV_BUF];
  for (;;) {
    void *r = NULL;
    ssize_t n;
    if (redisReaderGetReply(c->ctx->reader, &r) != REDIS_OK) {
      rm__errmsg_set("protocol error from Redis at \"%s:%d\": %s", c->host, c->port,
                     c->ctx->reader->errstr);
      return RM_E_UNKNOWN_OUTCOME;
    }
    if (r) {
      *out = r;
      return 0;
    }
    n = recv(c->ctx->fd, buf, sizeof(buf), 0);
    if (n > 0) {
      if (redisReaderFeed(c->ctx->reader, buf, (size_t)n) != REDIS_OK) {
        rm__errmsg_set("could not buffer the reply of Redis at \"%s:%d\"", c->host, c->port);
        return RM_E_UNKNOWN_OUTCOME;
      }
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n == 0)
      rm__errmsg_set("Redis at \"%s:%d\" closed the connection before answering", c->host,
                     c->port);
    else if (errno == EAGAIN || errno == EWOULDBLOCK)
      rm__errmsg_set("Redis at \"%s:%d\" did not answer within %u ms", c->host, c->port,
                     p->cmd_timeout_ms);
    else
      rm__errmsg_set("could not read from Redis at \"%s:%d\": %s", c->host, c->port,
                     strerror(errno));
    return RM_E_UNKNOWN_OUTCOME;
  }
}

int rm__pf_conn_pipeline(rm_pf_pool_t *p, rm_pf_conn_t *c, size_t n, char *const *cmds,
                         const size_t *lens, redisReply **replies) {
  const char *buf;
  char *joined = NULL;
  size_t total = 0;
  int rc;
  for (size_t i = 0; i < n; i++) {
    replies[i] = NULL;
    total += lens[i];
  }
  if (n == 1) {
    buf = cmds[0];
  } else {
    size_t off = 0;
    joined = malloc(total ? total : 1);
    if (!joined) {
      rm__errmsg_set("out of memory");
      return RM_E_CONN_LOST;
    }
    for (size_t i = 0; i < n; i++) {
      memcpy(joined + off, cmds[i], lens[i]);
      off += lens[i];
    }
    buf = joined;
  }
  rc = send_all(p, c, buf, total);
  free(joined);
  if (rc != 0) return rc;
  for (size_t i = 0; i < n; i++) {
    rc = read_reply(p, c, &replies[i]);
    if (rc != 0) {
      for (size_t j = 0; j < i; j++) {
        freeReplyObject(replies[j]);
        replies[j] = NULL;
      }
      return rc;
    }
  }
  return 0;
}

int rm__pf_conn_command(rm_pf_pool_t *p, rm_pf_conn_t *c, int argc, const char **argv,
                        const size_t *argvlen, redisReply **reply) {
  char *cmd = NULL;
  int len = redisFormatCommandArgv(&cmd, argc, argv, argvlen);
  int rc;
  *reply = NULL;
  if (len < 0) {
    rm__errmsg_set("out of memory");
    return RM_E_NOMEM;
  }
  size_t ulen = (size_t)len;
  rc = rm__pf_conn_pipeline(p, c, 1, &cmd, &ulen, reply);
  redisFreeCommand(cmd);
  return rc;
}

/* --------------------------------------------------------- connecting --- */

static bool is_sha(const redisReply *r) {
  if (!r || r->type != REDIS_REPLY_STRING || r->len != RM_PF_SHA_LEN) return false;
  for (size_t i = 0; i < r->len; i++) {
    char ch = r->str[i];
    if (!((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f'))) return false;
  }
  return true;
}

static bool is_ok(const redisReply *r) {
  return r && r->type == REDIS_REPLY_STATUS && r->len == 2 && memcmp(r->str, "OK", 2) == 0;
}

enum { K_INFO = -4, K_ROLE = -3, K_AUTH = -2, K_SELECT = -1 };

/* AUTH, SELECT, ROLE, INFO server and SCRIPT LOAD of every script ('only'
 * < 0; 'run_id' gets the server's), or SCRIPT LOAD of script 'only'
 * alone, in one round trip.  With Sentinel, a server whose ROLE is not
 * master fails with RM_E_REDIS_NO_MASTER. */
static int conn_prepare(rm_pf_pool_t *p, rm_pf_conn_t *c, int only, char *run_id) {
  char *cmds[RM_PF_S__COUNT + 4];
  size_t lens[RM_PF_S__COUNT + 4];
  redisReply *replies[RM_PF_S__COUNT + 4];
  int kinds[RM_PF_S__COUNT + 4]; /* K_*, else a script */
  size_t n = 0;
  int rc = 0;
  char dbs[16];
  int role_at = -1;

  if (only < 0 && p->url.has_password) {
    const char *argv[] = {"AUTH", p->url.password};
    kinds[n] = K_AUTH;
    int len = redisFormatCommandArgv(&cmds[n], 2, argv, NULL);
    if (len < 0) goto nomem;
    lens[n++] = (size_t)len;
  }
  if (only < 0 && p->url.db != 0) {
    const char *argv[] = {"SELECT", dbs};
    snprintf(dbs, sizeof(dbs), "%d", p->url.db);
    kinds[n] = K_SELECT;
    int len = redisFormatCommandArgv(&cmds[n], 2, argv, NULL);
    if (len < 0) goto nomem;
    lens[n++] = (size_t)len;
  }
  if (only < 0) {
    const char *rargv[] = {"ROLE"}, *iargv[] = {"INFO", "server"};
    int len;
    role_at = (int)n;
    kinds[n] = K_ROLE;
    len = redisFormatCommandArgv(&cmds[n], 1, rargv, NULL);
    if (len < 0) goto nomem;
    lens[n++] = (size_t)len;
    kinds[n] = K_INFO;
    len = redisFormatCommandArgv(&cmds[n], 2, iargv, NULL);
    if (len < 0) goto nomem;
    lens[n++] = (size_t)len;
  }
  for (int i = 0; i < RM_PF_S__COUNT; i++) {
    if (only >= 0 && i != only) continue;
    const char *argv[] = {"SCRIPT", "LOAD", p->script_text[i]};
    size_t alen[] = {6, 4, p->script_len[i]};
    kinds[n] = i;
    int len = redisFormatCommandArgv(&cmds[n], 3, argv, alen);
    if (len < 0) goto nomem;
    lens[n++] = (size_t)len;
  }

  rc = rm__pf_conn_pipeline(p, c, n, cmds, lens, replies);
  if (rc == 0 && role_at >= 0) {
    char role[16];
    if (rm__redis_parse_identity(replies[role_at], replies[role_at + 1], run_id, role, sizeof(role)) != 0 &&
        p->url.nsentinels) {
      rm__errmsg_set("Redis at \"%s:%d\", named master \"%s\" by the sentinels, is not a master (ROLE: %s)",
                     c->host, c->port, p->url.master_name, role);
      rc = RM_E_REDIS_NO_MASTER;
    }
    if (rc != 0)
      for (size_t i = 0; i < n; i++) freeReplyObject(replies[i]);
  }
  if (rc == 0) {
    for (size_t i = 0; i < n && rc == 0; i++) {
      const redisReply *r = replies[i];
      if (kinds[i] == K_ROLE || kinds[i] == K_INFO) continue;
      if (kinds[i] < 0 ? is_ok(r) : is_sha(r)) {
        if (kinds[i] >= 0) memcpy(c->sha[kinds[i]], r->str, RM_PF_SHA_LEN + 1);
        continue;
      }
      rm__errmsg_set("could not %s on Redis at \"%s:%d\": %.*s",
                     kinds[i] == K_AUTH ? "authenticate" : kinds[i] == K_SELECT ? "select the database" : "load the scripts",
                     c->host, c->port,
                     r && (r->type == REDIS_REPLY_ERROR || r->type == REDIS_REPLY_STATUS) ? (int)r->len : 16,
                     r && (r->type == REDIS_REPLY_ERROR || r->type == REDIS_REPLY_STATUS) ? r->str
                                                                                      : "unexpected reply");
      rc = RM_PF_E_REDIS;
    }
    for (size_t i = 0; i < n; i++) freeReplyObject(replies[i]);
  }
  for (size_t i = 0; i < n; i++) redisFreeCommand(cmds[i]);
  return rc;

nomem:
  for (size_t i = 0; i < n; i++) redisFreeCommand(cmds[i]);
  rm__errmsg_set("out of memory");
  return RM_E_NOMEM;
}


/* With Sentinel: forget the master's address, so that the next connect
 * asks the sentinels.  Under 'mu'. */
static void master_forget_locked(rm_pf_pool_t *p) {
  if (p->url.nsentinels) p->master_known = false;
}

/* Where a new connection goes: the URL's address, or (Sentinel) the
 * master as last resolved, asking the sentinels first if it is not known.
 * 0 or RM_E_REDIS_NO_MASTER. */
static int conn_target(rm_pf_pool_t *p, rm_pf_hostport_t *t) {
  rm_pf_hostport_t m;
  unsigned next;
  int rc;
  if (!p->url.nsentinels) {
    memcpy(t->host, p->url.host, sizeof(t->host));
    t->port = p->url.port;
    return 0;
  }
  pthread_mutex_lock(&p->resolve_mu);
  pthread_mutex_lock(&p->mu);
  if (p->master_known) {
    *t = p->master;
    pthread_mutex_unlock(&p->mu);
    pthread_mutex_unlock(&p->resolve_mu);
    return 0;
  }
  next = p->sentinel_next;
  pthread_mutex_unlock(&p->mu);
  rc = rm__sentinel_ask(&p->url, p->connect_timeout_ms, p->cmd_timeout_ms, &next, &m);
  pthread_mutex_lock(&p->mu);
  p->sentinel_next = next;
  if (rc == 0) {
    if (!p->master_known && (strcmp(m.host, p->master.host) != 0 || m.port != p->master.port))
      RM_LOGGER(p->log, RM_LOG_INFO, "the sentinels name \"%s:%d\" as Redis master \"%s\"", m.host, m.port,
                p->url.master_name);
    p->master = m;
    p->master_known = true;
    *t = m;
  }
  pthread_mutex_unlock(&p->mu);
  pthread_mutex_unlock(&p->resolve_mu);
  return rc;
}

/* A new connection reached the master 't' with 'run_id': if another than
 * the one before, count a master change and call the hook. */
static void master_seen(rm_pf_pool_t *p, const rm_pf_hostport_t *t, const char *run_id) {
  char before[RM_PF_HOST_MAX + 64] = "";
  bool changed;
  if (!run_id[0]) return; /* INFO without run_id: cannot tell */
  pthread_mutex_lock(&p->mu);
  changed = p->seen_run_id[0] &&
            (strcmp(p->seen_run_id, run_id) != 0 || strcmp(p->seen.host, t->host) != 0 || p->seen.port != t->port);
  if (changed) snprintf(before, sizeof(before), "%s:%d (run_id %.12s)", p->seen.host, p->seen.port, p->seen_run_id);
  if (changed || !p->seen_run_id[0]) {
    p->seen = *t;
    snprintf(p->seen_run_id, sizeof(p->seen_run_id), "%s", run_id);
  }
  if (changed) {
    atomic_fetch_add_explicit(&p->master_changes, 1, memory_order_relaxed);
    if (p->on_change) p->on_change(p->on_change_arg);
  }
  pthread_mutex_unlock(&p->mu);
  if (changed)
    RM_LOGGER(p->log, RM_LOG_WARN,
              "Redis master changed: %s -> %s:%d (run_id %.12s): it may have lost the last writes; "
              "reconciliation with PostgreSQL follows",
              before, t->host, t->port, run_id);
}

static int conn_open_once(rm_pf_pool_t *p, rm_pf_conn_t **out);

/* With Sentinel, a connect to the master as last resolved that fails is
 * retried once after asking the sentinels again (the master died, or was
 * demoted, since): a caller after a failover need not fail once first. */
static int conn_open(rm_pf_pool_t *p, rm_pf_conn_t **out) {
  bool known;
  int rc;
  pthread_mutex_lock(&p->mu);
  known = p->master_known;
  pthread_mutex_unlock(&p->mu);
  rc = conn_open_once(p, out);
  if (rc == RM_E_REDIS_NO_MASTER && p->url.nsentinels && known) rc = conn_open_once(p, out);
  return rc;
}

static int conn_open_once(rm_pf_pool_t *p, rm_pf_conn_t **out) {
  rm_pf_conn_t *c;
  rm_pf_hostport_t t;
  char run_id[RM_REDIS_RUN_ID_MAX] = "";
  int rc = conn_target(p, &t);
  /* With Sentinel, "cannot connect" means "no master reachable". */
  int lost = p->url.nsentinels ? RM_E_REDIS_NO_MASTER : RM_E_CONN_LOST;
  if (rc != 0) return rc;
  redisContext *ctx = redisConnectWithTimeout(t.host, t.port, ms_tv(p->connect_timeout_ms));
  if (!ctx) {
    rm__errmsg_set("out of memory");
    return RM_E_NOMEM;
  }
  if (ctx->err) {
    rm__errmsg_set("could not connect to Redis at \"%s:%d\": %s", t.host, t.port, ctx->errstr);
    redisFree(ctx);
    goto lost;
  }
  if (rm__pf_self_connected(ctx->fd)) {
    rm__errmsg_set("could not connect to Redis at \"%s:%d\": the socket connected to itself "
                   "(nothing listens there, and the kernel chose that port as the local one)",
                   t.host, t.port);
    redisFree(ctx);
    goto lost;
  }
  if (redisSetTimeout(ctx, ms_tv(p->cmd_timeout_ms)) != REDIS_OK) {
    rm__errmsg_set("could not set the timeouts of a connection to Redis at \"%s:%d\": %s",
                   t.host, t.port, ctx->errstr);
    redisFree(ctx);
    goto lost;
  }
  c = calloc(1, sizeof(*c));
  if (!c) {
    redisFree(ctx);
    rm__errmsg_set("out of memory");
    return RM_E_NOMEM;
  }
  c->ctx = ctx;
  memcpy(c->host, t.host, sizeof(c->host));
  c->port = t.port;
  rc = conn_prepare(p, c, -1, run_id);
  if (rc != 0) {
    conn_close(c);
    if (rc == RM_E_NOMEM) return rc;
    goto lost; /* nothing of the caller's command was sent */
  }
  atomic_fetch_add_explicit(&p->connects, 1, memory_order_relaxed);
  master_seen(p, &t, run_id);
  *out = c;
  return 0;

lost:
  pthread_mutex_lock(&p->mu);
  master_forget_locked(p);
  pthread_mutex_unlock(&p->mu);
  return lost;
}

/* Whether an idle connection was closed by the server (or has unexpected
 * bytes: either way it must not be used). */
static bool conn_stale(rm_pf_conn_t *c) {
  struct pollfd pfd = {.fd = c->ctx->fd, .events = POLLIN};
  return c->ctx->err != 0 || poll(&pfd, 1, 0) != 0;
}

int rm__pf_conn_get(rm_pf_pool_t *p, rm_pf_conn_t **out) {
  uint64_t now = rm__mono_ms();
  uint64_t deadline = now + p->cmd_timeout_ms;
  *out = NULL;
  pthread_mutex_lock(&p->mu);
  for (;;) {
    while (p->idle) {
      rm_pf_conn_t *c = p->idle;
      p->idle = c->next;
      c->next = NULL;
      if (now >= c->idle_since_ms + STALE_CHECK_IDLE_MS && conn_stale(c)) {
        p->open--;
        master_forget_locked(p); /* closed by the server: maybe it died */
        atomic_fetch_add_explicit(&p->stale_closed, 1, memory_order_relaxed);
        conn_close(c);
        continue;
      }
      pthread_mutex_unlock(&p->mu);
      *out = c;
      return 0;
    }
    if (p->open < p->max_conns) {
      rm_pf_conn_t *c = NULL;
      int rc;
      if (now < p->retry_at_ms) {
        unsigned wait = (unsigned)(p->retry_at_ms - now);
        pthread_mutex_unlock(&p->mu);
        if (p->url.nsentinels) {
          rm__errmsg_set("no Redis master \"%s\" reachable: next attempt in %u ms", p->url.master_name, wait);
          return RM_E_REDIS_NO_MASTER;
        }
        rm__errmsg_set("Redis at \"%s:%d\" is unreachable: next connection attempt in %u ms",
                       p->url.host, p->url.port, wait);
        return RM_E_CONN_LOST;
      }
      p->open++;
      pthread_mutex_unlock(&p->mu);
      rc = conn_open(p, &c);
      pthread_mutex_lock(&p->mu);
      if (rc != 0) {
        unsigned delay;
        p->open--;
        p->failures++;
        delay = rm__pf_backoff_ms(p->failures, p->backoff_min_ms, p->backoff_max_ms);
        p->retry_at_ms = rm__mono_ms() + delay;
        pthread_cond_signal(&p->cv);
        pthread_mutex_unlock(&p->mu);
        atomic_fetch_add_explicit(&p->connect_failures, 1, memory_order_relaxed);
        RM_LOGGER(p->log, RM_LOG_WARN, "%s (retrying in %u ms)", rm_errmsg(), delay);
        return rc;
      }
      if (p->failures) RM_LOGGER(p->log, RM_LOG_INFO, "connected to Redis at \"%s:%d\" again",
                                 c->host, c->port);
      p->failures = 0;
      p->retry_at_ms = 0;
      pthread_mutex_unlock(&p->mu);
      *out = c;
      return 0;
    }
    {
      struct timespec ts = {(time_t)(deadline / 1000), (long)(deadline % 1000) * 1000000L};
      if (now >= deadline || pthread_cond_timedwait(&p->cv, &p->mu, &ts) == ETIMEDOUT) {
        pthread_mutex_unlock(&p->mu);
        rm__errmsg_set("no Redis connection free within %u ms (%u in use)", p->cmd_timeout_ms,
                       p->max_conns);
        return RM_E_DEADLINE;
      }
      now = rm__mono_ms();
    }
  }
}

void rm__pf_conn_put(rm_pf_pool_t *p, rm_pf_conn_t *c, bool broken) {
  if (!c) return;
  if (broken) {
    conn_close(c);
    pthread_mutex_lock(&p->mu);
    p->open--;
    /* A broken connection may be the first sign of a failover. */
    master_forget_locked(p);
  } else {
    c->idle_since_ms = rm__mono_ms();
    pthread_mutex_lock(&p->mu);
    c->next = p->idle;
    p->idle = c;
  }
  pthread_cond_signal(&p->cv);
  pthread_mutex_unlock(&p->mu);
}

/* Unlink every idle connection (closed by close_list outside 'mu'). */
static rm_pf_conn_t *take_idle_locked(rm_pf_pool_t *p) {
  rm_pf_conn_t *idle = p->idle;
  p->idle = NULL;
  for (rm_pf_conn_t *x = idle; x; x = x->next) p->open--;
  return idle;
}

static void close_list(rm_pf_conn_t *c) {
  while (c) {
    rm_pf_conn_t *next = c->next;
    conn_close(c);
    c = next;
  }
}

/* ----------------------------------------------------------- EVALSHA --- */

static int eval_once(rm_pf_pool_t *p, int script, int nkeys, const char *const *keys, int nargs,
                     const char *const *args, redisReply **reply) {
  const char *sargv[64];
  size_t slens[64];
  const char **argv = sargv;
  size_t *lens = slens;
  int argc = 3 + nkeys + nargs, rc;
  char nk[24];
  rm_pf_conn_t *c = NULL;
  redisReply *r = NULL;
  bool readonly_retried = false;

  *reply = NULL;
  if (argc > 64) {
    argv = malloc((size_t)argc * sizeof(*argv));
    lens = malloc((size_t)argc * sizeof(*lens));
    if (!argv || !lens) {
      rc = RM_E_NOMEM;
      rm__errmsg_set("out of memory");
      goto out;
    }
  }
  rm__pf_i64_str(nk, nkeys);
  argv[0] = "EVALSHA";
  argv[2] = nk;
  for (int i = 0; i < nkeys; i++) argv[3 + i] = keys[i];
  for (int i = 0; i < nargs; i++) argv[3 + nkeys + i] = args[i];
  for (int i = 0; i < argc; i++) lens[i] = i == 1 ? RM_PF_SHA_LEN : strlen(argv[i]);

  rc = rm__pf_conn_get(p, &c);
  if (rc != 0) goto out;
  for (int attempt = 0;; attempt++) {
    argv[1] = c->sha[script];
    rc = rm__pf_conn_command(p, c, argc, argv, lens, &r);
    if (rc != 0) {
      rm__pf_conn_put(p, c, true);
      goto out;
    }
    if (r->type == REDIS_REPLY_ERROR && r->len >= 8 && memcmp(r->str, "READONLY", 8) == 0 && !readonly_retried) {
      /* A demoted master (a failover: Sentinel made it a replica).  The
       * script was refused before it ran: find the master again and run
       * it there, once. */
      readonly_retried = true;
      RM_LOGGER(p->log, RM_LOG_WARN, "Redis at \"%s:%d\" is a replica now (READONLY): looking for the master",
                c->host, c->port);
      freeReplyObject(r);
      r = NULL;
      rm__pf_conn_put(p, c, true);
      c = NULL;
      pthread_mutex_lock(&p->mu);
      rm_pf_conn_t *idle = take_idle_locked(p); /* to the same demoted server */
      pthread_cond_broadcast(&p->cv);
      pthread_mutex_unlock(&p->mu);
      close_list(idle);
      rc = rm__pf_conn_get(p, &c);
      if (rc != 0) goto out;
      attempt = -1;
      continue;
    }
    if (attempt == 0 && r->type == REDIS_REPLY_ERROR && r->len >= 8 &&
        memcmp(r->str, "NOSCRIPT", 8) == 0) {
      /* The scripts were flushed (SCRIPT FLUSH, a failover): the script
       * did not run, so load it and try once more. */
      freeReplyObject(r);
      r = NULL;
      atomic_fetch_add_explicit(&p->noscript_reloads, 1, memory_order_relaxed);
      RM_LOGGER(p->log, RM_LOG_INFO, "script \"%s\" missing on Redis at \"%s:%d\" (NOSCRIPT): loading it again",
                rm__pf_script_name(script), c->host, c->port);
      rc = conn_prepare(p, c, script, NULL);
      if (rc != 0) {
        rm__pf_conn_put(p, c, true);
        if (rc != RM_E_NOMEM) rc = RM_E_CONN_LOST;
        goto out;
      }
      continue;
    }
    break;
  }
  rm__pf_conn_put(p, c, false);
  *reply = r;

out:
  if (argv != sargv) free(argv);
  if (lens != slens) free(lens);
  return rc;
}

static bool is_held(const redisReply *r) { return r->type == REDIS_REPLY_INTEGER && r->integer == RM_PF_LUA_HELD; }

int rm__pf_eval(rm_pf_pool_t *p, int script, int nkeys, const char *const *keys, int nargs,
                const char *const *args, redisReply **reply) {
  unsigned waited_ms = 0, step_ms = 2;
  for (;;) {
    int rc = eval_once(p, script, nkeys, keys, nargs, args, reply);
    if (rc != 0 || !is_held(*reply)) return rc;
    freeReplyObject(*reply);
    *reply = NULL;
    if (waited_ms >= RM_PF_HOLD_WAIT_MS) {
      rm__errmsg_set("script \"%s\" waited %u ms for a reconciliation of the activity to end (the field "
                     "\"hold\" of its meta hash in Redis); call again",
                     rm__pf_script_name(script), waited_ms);
      return RM_PF_E_HELD;
    }
    /* The hold lasts one reconciliation round (milliseconds) and is
     * deleted by it: poll, backing off, rather than wait for its deadline. */
    struct timespec ts = {0, (long)step_ms * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
    waited_ms += step_ms;
    step_ms = step_ms * 2 > 25 ? 25 : step_ms * 2;
  }
}

int rm__pf_script_sha(rm_pf_pool_t *p, int script, char sha[RM_PF_SHA_LEN + 1]) {
  rm_pf_conn_t *c;
  int rc = rm__pf_conn_get(p, &c);
  if (rc != 0) return rc;
  memcpy(sha, c->sha[script], RM_PF_SHA_LEN + 1);
  rm__pf_conn_put(p, c, false);
  return 0;
}

/* ---------------------------------------------------- master changes --- */

void rm__pf_pool_set_hook(rm_pf_pool_t *p, void (*fn)(void *arg), void *arg) {
  pthread_mutex_lock(&p->mu);
  p->on_change = fn;
  p->on_change_arg = arg;
  pthread_mutex_unlock(&p->mu);
}

int rm__pf_master_probe(rm_pf_pool_t *p) {
  rm_pf_conn_t *c = NULL, *idle = NULL;
  int rc;
  if (p->url.nsentinels) {
    rm_pf_hostport_t m;
    unsigned next;
    pthread_mutex_lock(&p->mu);
    next = p->sentinel_next;
    pthread_mutex_unlock(&p->mu);
    rc = rm__sentinel_ask(&p->url, p->connect_timeout_ms, p->cmd_timeout_ms, &next, &m);
    pthread_mutex_lock(&p->mu);
    p->sentinel_next = next;
    if (rc == 0 && p->master_known && (strcmp(m.host, p->master.host) != 0 || m.port != p->master.port)) {
      /* The sentinels name another master: the idle connections go to
       * the old one (maybe alive and a replica now). */
      RM_LOGGER(p->log, RM_LOG_INFO, "the sentinels name \"%s:%d\" as Redis master \"%s\" now (was \"%s:%d\")",
                m.host, m.port, p->url.master_name, p->master.host, p->master.port);
      p->master = m;
      idle = take_idle_locked(p);
    }
    pthread_mutex_unlock(&p->mu);
    close_list(idle);
  }
  rc = rm__pf_conn_get(p, &c);
  if (rc == 0) rm__pf_conn_put(p, c, false);
  return rc;
}
