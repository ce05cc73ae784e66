/*
 * rm_redis_sentinel.c - the Redis master through Sentinel (see
 * rm_redis_sentinel.h), and the public rm_redis_* entry points.
 *
 * NOTES
 *   Blocking hiredis on the caller's thread, with a connect timeout and
 *   SO_RCVTIMEO/SO_SNDTIMEO on every context: never called on a loop
 *   thread (the prefilter's calls and the services' Redis threads are
 *   the callers' own).  Every context is freed before return.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include "rm_client.h"
#include "rm_prefilter_sock.h"
#include "rm_util.h"
#include "rm_redis_sentinel.h"

#define DEFAULT_TIMEOUT_MS 500u

static struct timeval ms_tv(unsigned ms) {
  struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};
  return tv;
}

/* A blocking context to 'host:port' with both timeouts, or NULL with
 * 'why' (cap 'whylen') set. */
static redisContext *open_ctx(const char *host, int port, unsigned connect_ms, unsigned cmd_ms, char *why,
                              size_t whylen) {
  redisContext *c = redisConnectWithTimeout(host, port, ms_tv(connect_ms));
  if (!c) {
    snprintf(why, whylen, "out of memory");
    return NULL;
  }
  if (c->err || rm__pf_self_connected(c->fd) || redisSetTimeout(c, ms_tv(cmd_ms)) != REDIS_OK) {
    snprintf(why, whylen, "%s", c->err ? c->errstr : "connection refused (self-connected)");
    redisFree(c);
    return NULL;
  }
  return c;
}

int rm__sentinel_ask(const rm_pf_url_t *u, unsigned connect_ms, unsigned cmd_ms, unsigned *next,
                     rm_pf_hostport_t *out) {
  char what[RM_ERRMSG_MAX] = "";
  size_t off = 0;
  unsigned start = *next < u->nsentinels ? *next : 0;
  for (unsigned k = 0; k < u->nsentinels; k++) {
    unsigned i = (start + k) % u->nsentinels;
    const rm_pf_hostport_t *s = &u->sentinel[i];
    char why[128] = "";
    redisContext *c = open_ctx(s->host, s->port, connect_ms, cmd_ms, why, sizeof(why));
    if (c) {
      redisReply *r = redisCommand(c, "SENTINEL get-master-addr-by-name %s", u->master_name);
      if (r && r->type == REDIS_REPLY_ARRAY && r->elements == 2 && r->element[0]->type == REDIS_REPLY_STRING &&
          r->element[1]->type == REDIS_REPLY_STRING && r->element[0]->len > 0 &&
          r->element[0]->len < sizeof(out->host)) {
        char *e = NULL;
        long port = strtol(r->element[1]->str, &e, 10);
        if (e && *e == '\0' && port > 0 && port <= 65535) {
          memcpy(out->host, r->element[0]->str, r->element[0]->len);
          out->host[r->element[0]->len] = '\0';
          out->port = (int)port;
          freeReplyObject(r);
          redisFree(c);
          *next = i;
          return 0;
        }
      }
      if (!r)
        snprintf(why, sizeof(why), "%.100s", c->errstr[0] ? c->errstr : "no answer");
      else if (r->type == REDIS_REPLY_NIL)
        snprintf(why, sizeof(why), "does not know master \"%.64s\"", u->master_name);
      else if (r->type == REDIS_REPLY_ERROR)
        snprintf(why, sizeof(why), "%.100s", r->str);
      else
        snprintf(why, sizeof(why), "unexpected reply");
      freeReplyObject(r);
      redisFree(c);
    }
    if (off < sizeof(what)) {
      int n = snprintf(what + off, sizeof(what) - off, "%s%s:%d: %s", off ? "; " : "", s->host, s->port, why);
      if (n > 0) off += (size_t)n;
    }
  }
  rm__errmsg_set("no Redis master \"%s\" from the sentinels (%s)", u->master_name, what);
  return RM_E_REDIS_NO_MASTER;
}

int rm__redis_parse_identity(const redisReply *role, const redisReply *info, char run_id[RM_REDIS_RUN_ID_MAX],
                             char *rolename, size_t rolecap) {
  run_id[0] = '\0';
  snprintf(rolename, rolecap, "?");
  if (!role || role->type != REDIS_REPLY_ARRAY || role->elements < 1 ||
      role->element[0]->type != REDIS_REPLY_STRING) {
    if (role && role->type == REDIS_REPLY_ERROR) snprintf(rolename, rolecap, "error");
    return -1;
  }
  snprintf(rolename, rolecap, "%.*s", (int)role->element[0]->len, role->element[0]->str);
  if (strcmp(rolename, "master") != 0) return -1;
  if (info && (info->type == REDIS_REPLY_STRING)) {
    const char *p = strstr(info->str, "run_id:");
    if (p) {
      size_t n = 0;
      p += 7;
      while (n < RM_REDIS_RUN_ID_MAX - 1 && p[n] && p[n] != '\r' && p[n] != '\n') n++;
      memcpy(run_id, p, n);
      run_id[n] = '\0';
    }
  }
  return 0;
}

/* ------------------------------------------------------- public API --- */

const char *rm_redis_url_from_env(char *buf, size_t cap) {
  const char *url = getenv("REDIS_URL"), *sent = getenv("REDIS_SENTINELS"), *name = getenv("REDIS_MASTER_NAME");
  int n;
  if (!buf || cap == 0) return NULL;
  if (sent && *sent && name && *name) {
    rm_pf_url_t u;
    char auth[RM_PF_PASSWORD_MAX + 2] = "", db[16] = "";
    if (url && rm__pf_url_parse(url, &u) == 0) {
      if (u.has_password) snprintf(auth, sizeof(auth), ":%s@", u.password);
      if (u.db) snprintf(db, sizeof(db), "/%d", u.db);
    }
    n = snprintf(buf, cap, "redis+sentinel://%s%s/%s%s", auth, sent, name, db);
  } else if (url) {
    n = snprintf(buf, cap, "%s", url);
  } else {
    return NULL;
  }
  return n >= 0 && (size_t)n < cap ? buf : NULL;
}

bool rm_redis_url_valid(const char *url) {
  rm_pf_url_t u;
  return rm__pf_url_parse(url, &u) == 0;
}

int rm_redis_resolve(const char *url, unsigned timeout_ms, rm_redis_addr_t *out) {
  rm_pf_url_t u;
  rm_pf_hostport_t m;
  unsigned next = 0;
  char why[128] = "", role[16];
  int rc;
  if (!out || rm__pf_url_parse(url, &u) != 0) {
    rm__errmsg_set("invalid Redis URL \"%s\": expected redis://[:password@]host[:port][/db] or "
                   "redis+sentinel://[:password@]host[:port],.../master-name[/db]",
                   url ? url : "(null)");
    return RM_E_INVALID;
  }
  memset(out, 0, sizeof(*out));
  snprintf(out->password, sizeof(out->password), "%s", u.password);
  out->db = u.db;
  if (u.nsentinels == 0) {
    snprintf(out->host, sizeof(out->host), "%s", u.host);
    out->port = u.port;
    return 0;
  }
  if (!timeout_ms) timeout_ms = DEFAULT_TIMEOUT_MS;
  rc = rm__sentinel_ask(&u, timeout_ms, timeout_ms, &next, &m);
  if (rc != 0) return rc;
  redisContext *c = open_ctx(m.host, m.port, timeout_ms, timeout_ms, why, sizeof(why));
  if (!c) {
    rm__errmsg_set("could not connect to Redis master \"%s\" at \"%s:%d\" (as the sentinels say): %s", u.master_name,
                   m.host, m.port, why);
    return RM_E_REDIS_NO_MASTER;
  }
  redisReply *ra = NULL, *ri = NULL;
  if (u.has_password) {
    redisReply *a = redisCommand(c, "AUTH %s", u.password);
    freeReplyObject(a);
  }
  ra = redisCommand(c, "ROLE");
  if (ra) ri = redisCommand(c, "INFO server");
  rc = rm__redis_parse_identity(ra, ri, out->run_id, role, sizeof(role));
  if (rc != 0) {
    rm__errmsg_set("Redis at \"%s:%d\", named master \"%s\" by the sentinels, is not a master (ROLE: %s%s%s)", m.host,
                   m.port, u.master_name, ra ? role : "no answer", ra ? "" : ": ", ra ? "" : c->errstr);
    rc = RM_E_REDIS_NO_MASTER;
  } else {
    snprintf(out->host, sizeof(out->host), "%s", m.host);
    out->port = m.port;
  }
  freeReplyObject(ra);
  freeReplyObject(ri);
  redisFree(c);
  return rc;
}
