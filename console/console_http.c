/*
 * console_http.c - the console's pages and JSON (console_http.h).
 */
#include "console_http.h"

#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <microhttpd.h>
#include <netdb.h>
#include <sodium.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "console_assets.h"
#include "console_log.h"
#include "console_sql.h"
#include "tc_admin_client.h"
#include "txc_httpguard.h"
#include "txp_status.h"

#define COOKIE "txc_console"
#define SESSION_CONTEXT "txc-console-session-v1"
#define LOGIN_BODY_MAX 1024
#define PARAM_MAX 128
#define CONSOLE_SESSION_S (12 * 3600) /* the session cookie lasts a working day */
#define LIST_DEFAULT 200
#define LIST_MAX 500
#define ADMIN_TIMEOUT_S 1.0
#define ADMIN_ANSWER_MAX (8u << 20)
#define SECURITY_CSP                                                                                              \
  "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "       \
  "form-action 'self'; base-uri 'none'; frame-ancestors 'none'"

struct console_http {
  console_http_cfg_t cfg;
  struct MHD_Daemon *mhd;
  txc_httpguard_t *guard;
  int port;
  /* The session cookie's value: a keyed hash of the token, in hex. */
  char session[crypto_generichash_BYTES * 2 + 1];
  unsigned char token_hash[crypto_generichash_BYTES];
  /* Status names as PostgreSQL text arrays (console_sql.h, $1..$3). */
  char global_names[1024], branch_names[1024], type_names[128];
};

/* One request's state across libmicrohttpd's calls (a POST's body). */
typedef struct {
  char body[LOGIN_BODY_MAX + 1];
  size_t len;
  int too_long;
} request_t;

/* ------------------------------------------------------------ answers */

static void common_headers(struct MHD_Response *r) {
  MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
  MHD_add_response_header(r, "Content-Security-Policy", SECURITY_CSP);
  MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
  MHD_add_response_header(r, "Referrer-Policy", "no-referrer");
  MHD_add_response_header(r, "X-Frame-Options", "DENY");
}

/* Queue 'body' (taken: freed by libmicrohttpd) with 'type' and extra
 * headers given as name, value pairs ending with NULL. */
static enum MHD_Result answer(struct MHD_Connection *conn, unsigned code, char *body, const char *type, ...) {
  if (!body) return MHD_NO;
  struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
  if (!r) {
    free(body);
    return MHD_NO;
  }
  common_headers(r);
  if (type) MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
  va_list ap;
  va_start(ap, type);
  for (const char *name = va_arg(ap, const char *); name; name = va_arg(ap, const char *))
    MHD_add_response_header(r, name, va_arg(ap, const char *));
  va_end(ap);
  enum MHD_Result ret = MHD_queue_response(conn, code, r);
  MHD_destroy_response(r);
  return ret;
}

static const char *title_of(unsigned code) {
  switch (code) {
  case 400: return "Bad Request";
  case 401: return "Unauthorized";
  case 404: return "Not Found";
  case 405: return "Method Not Allowed";
  case 413: return "Content Too Large";
  case 503: return "Service Unavailable";
  default: return "Internal Server Error";
  }
}

/* An RFC 9457 problem; 'allow' for a 405, and a 503 says Retry-After. */
static enum MHD_Result problem(struct MHD_Connection *conn, unsigned code, const char *allow, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static enum MHD_Result problem(struct MHD_Connection *conn, unsigned code, const char *allow, const char *fmt, ...) {
  char detail[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(detail, sizeof(detail), fmt, ap);
  va_end(ap);
  json_t *o = json_pack("{s:s, s:s, s:i, s:s}", "type", "about:blank", "title", title_of(code), "status", (int)code,
                        "detail", detail);
  char *body = o ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
  json_decref(o);
  const char *type = "application/problem+json";
  if (code == 405) return answer(conn, code, body, type, MHD_HTTP_HEADER_ALLOW, allow, NULL);
  if (code == 503) return answer(conn, code, body, type, MHD_HTTP_HEADER_RETRY_AFTER, "2", NULL);
  if (code == 401) return answer(conn, code, body, type, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer realm=\"txc-console\"", NULL);
  return answer(conn, code, body, type, NULL);
}

static enum MHD_Result json_answer(struct MHD_Connection *conn, char *text) {
  return answer(conn, MHD_HTTP_OK, text, "application/json", NULL);
}

static enum MHD_Result redirect(struct MHD_Connection *conn, const char *to, const char *cookie) {
  char *body = strdup("");
  if (cookie) return answer(conn, 303, body, NULL, MHD_HTTP_HEADER_LOCATION, to, MHD_HTTP_HEADER_SET_COOKIE, cookie, NULL);
  return answer(conn, 303, body, NULL, MHD_HTTP_HEADER_LOCATION, to, NULL);
}

static enum MHD_Result asset(struct MHD_Connection *conn, const char *path) {
  for (const console_asset_t *a = console_assets; a->path; a++)
    if (strcmp(a->path, path) == 0) {
      char *copy = malloc(a->len + 1);
      if (!copy) return MHD_NO;
      memcpy(copy, a->data, a->len);
      copy[a->len] = '\0';
      return answer(conn, MHD_HTTP_OK, copy, a->content_type, NULL);
    }
  return problem(conn, 404, NULL, "no such file: %s", path);
}

/* -------------------------------------------------------------- access */

static void hash_token(const char *token, size_t len, unsigned char out[crypto_generichash_BYTES]) {
  crypto_generichash(out, crypto_generichash_BYTES, (const unsigned char *)token, len, NULL, 0);
}

/* Constant time: both sides hashed to the same length first. */
static bool token_ok(const console_http_t *h, const char *given, size_t len) {
  if (!given || len == 0 || len >= CONSOLE_TOKEN_MAX) return false;
  unsigned char g[crypto_generichash_BYTES];
  hash_token(given, len, g);
  return sodium_memcmp(g, h->token_hash, sizeof(g)) == 0;
}

static bool authorized(const console_http_t *h, struct MHD_Connection *conn) {
  const char *auth = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
  if (auth && strncasecmp(auth, "Bearer ", 7) == 0) return token_ok(h, auth + 7, strlen(auth + 7));
  const char *cookie = MHD_lookup_connection_value(conn, MHD_COOKIE_KIND, COOKIE);
  return cookie && strlen(cookie) == strlen(h->session) &&
         sodium_memcmp(cookie, h->session, strlen(h->session)) == 0;
}

/* "token=..." of a form body (application/x-www-form-urlencoded). */
static bool form_token(char *body, char **out) {
  for (char *kv = strtok(body, "&"); kv; kv = strtok(NULL, "&")) {
    if (strncmp(kv, "token=", 6) != 0) continue;
    for (char *p = kv + 6; *p; p++)
      if (*p == '+') *p = ' ';
    MHD_http_unescape(kv + 6);
    *out = kv + 6;
    return true;
  }
  return false;
}

static bool is_page(const char *path);

/* Where a login goes on: 'next' when it is one of the console's pages
 * (with a query string), else "/": never another site. */
static const char *after_login(const char *next, char *buf, size_t cap) {
  if (!next || next[0] != '/' || strlen(next) >= cap) return "/";
  for (const char *p = next; *p; p++)
    if ((unsigned char)*p < 0x21 || *p == 0x7f || *p == '\\') return "/";
  snprintf(buf, cap, "%s", next);
  char *q = strchr(buf, '?');
  if (q) *q = '\0';
  bool ok = is_page(buf);
  if (q) *q = '?';
  return ok ? buf : "/";
}

static enum MHD_Result login(console_http_t *h, struct MHD_Connection *conn, const char *token, const char *next) {
  if (!token) return asset(conn, "/login.html");
  if (!token_ok(h, token, strlen(token))) {
    console_log("warn", "login refused: wrong token");
    return problem(conn, 401, NULL, "wrong token: use the one in the console's --token-file");
  }
  char cookie[256], to[PARAM_MAX * 2];
  snprintf(cookie, sizeof(cookie), COOKIE "=%s; Path=/; Max-Age=%d; HttpOnly; SameSite=Strict", h->session,
           CONSOLE_SESSION_S);
  return redirect(conn, after_login(next, to, sizeof(to)), cookie);
}

/* ------------------------------------------------------------- queries */

/* A query parameter: absent or empty is NULL; longer than PARAM_MAX or
 * with a control character is refused (*bad set). */
static const char *param(struct MHD_Connection *conn, const char *name, bool *bad) {
  const char *v = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, name);
  if (!v || !*v) return NULL;
  if (strlen(v) > PARAM_MAX) {
    *bad = true;
    return NULL;
  }
  for (const char *p = v; *p; p++)
    if ((unsigned char)*p < 0x20 || *p == 0x7f) {
      *bad = true;
      return NULL;
    }
  return v;
}

/* A whole number in [lo, hi] into out (the default if absent); false if
 * it is not one. */
static bool number(const char *v, long lo, long hi, long dflt, long *out) {
  if (!v) {
    *out = dflt;
    return true;
  }
  char *end;
  errno = 0;
  long n = strtol(v, &end, 10);
  if (errno || *end || end == v || n < lo || n > hi) return false;
  *out = n;
  return true;
}

static enum MHD_Result query(console_http_t *h, struct MHD_Connection *conn, console_db_t *db, const char *sql,
                             int n, const char *const *params, bool not_found_is_404, const char *what) {
  if (!db) return problem(conn, 404, NULL, "%s: the console was started without that database", what);
  char *text = NULL, err[512];
  if (console_db_value(db, sql, n, params, &text, err, sizeof(err)) != 0) {
    console_log("warn", "%s: %s", what, err);
    return problem(conn, 503, NULL, "%s", err);
  }
  if (not_found_is_404 && strcmp(text, "null") == 0) {
    free(text);
    return problem(conn, 404, NULL, "%s: not found", what);
  }
  return json_answer(conn, text);
}

/* The tc queries' first three parameters, then up to six more. */
static enum MHD_Result tc_query(console_http_t *h, struct MHD_Connection *conn, const char *sql, int n,
                                const char *const *more, bool not_found_is_404, const char *what) {
  const char *params[9] = {h->global_names, h->branch_names, h->type_names};
  for (int i = 0; i < n && i < 6; i++) params[3 + i] = more[i];
  return query(h, conn, h->cfg.tc, sql, 3 + n, params, not_found_is_404, what);
}

static bool valid_xid(const char *x) {
  if (!x) return false;
  for (const char *p = x; *p; p++)
    if (!isgraph((unsigned char)*p)) return false;
  return strlen(x) <= 128; /* TXP_MAX_XID_LEN */
}

/* The lock table, and the waiters each live node's admin socket knows. */
static enum MHD_Result locks(console_http_t *h, struct MHD_Connection *conn, const char *limit) {
  const char *params[4] = {h->global_names, h->branch_names, h->type_names, limit};
  char *text = NULL, err[512];
  if (console_db_value(h->cfg.tc, CONSOLE_SQL_LOCKS, 4, params, &text, err, sizeof(err)) != 0)
    return problem(conn, 503, NULL, "%s", err);
  json_t *o = json_loads(text, 0, NULL);
  free(text);
  if (!o) return problem(conn, 503, NULL, "the store's answer was not JSON");
  json_t *waiters = json_array(), *unreachable = json_array();
  size_t i;
  json_t *node;
  json_array_foreach(json_object_get(o, "nodes"), i, node) {
    const char *sock = json_string_value(json_object_get(node, "admin_socket"));
    char *line = NULL, why[512];
    json_t *ans = NULL;
    if (sock && tc_admin_talk(sock, "show locks", ADMIN_TIMEOUT_S, ADMIN_ANSWER_MAX, &line, why, sizeof(why)) == 0)
      ans = json_loads(line, 0, NULL);
    free(line);
    json_t *w = json_object_get(ans, "waiters");
    if (json_is_array(w)) {
      size_t k;
      json_t *one;
      json_array_foreach(w, k, one) {
        json_object_set(one, "node_id", json_object_get(node, "node_id"));
        json_array_append(waiters, one);
      }
    } else {
      json_array_append_new(unreachable, json_pack("{s:O, s:s}", "node_id", json_object_get(node, "node_id"), "why",
                                                   ans ? "the admin socket refused: see its error" : why));
    }
    json_decref(ans);
  }
  json_object_del(o, "nodes");
  json_object_set_new(o, "waiters", waiters);
  json_object_set_new(o, "waiters_unavailable", unreachable);
  char *body = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
  json_decref(o);
  return json_answer(conn, body);
}

static enum MHD_Result api(console_http_t *h, struct MHD_Connection *conn, const char *path) {
  bool bad = false;
  char lim[16];
  long n;
  if (strcmp(path, "/api/overview") == 0) return tc_query(h, conn, CONSOLE_SQL_OVERVIEW, 0, NULL, false, "overview");
  if (strcmp(path, "/api/globals") == 0 || strcmp(path, "/api/locks") == 0) {
    const char *l = param(conn, "limit", &bad);
    if (bad || !number(l, 1, LIST_MAX, LIST_DEFAULT, &n))
      return problem(conn, 400, NULL, "limit: a number from 1 to %d", LIST_MAX);
    snprintf(lim, sizeof(lim), "%ld", n);
    const char *more[] = {lim};
    if (strcmp(path, "/api/locks") == 0) return locks(h, conn, lim);
    return tc_query(h, conn, CONSOLE_SQL_GLOBALS, 1, more, false, "globals");
  }
  if (strcmp(path, "/api/global") == 0) {
    const char *xid = param(conn, "xid", &bad);
    if (bad || !valid_xid(xid)) return problem(conn, 400, NULL, "xid: 1 to 128 printable characters");
    const char *more[] = {xid};
    return tc_query(h, conn, CONSOLE_SQL_GLOBAL, 1, more, true, "global transaction");
  }
  if (strcmp(path, "/api/history") == 0) {
    const char *xid = param(conn, "xid", &bad), *st = param(conn, "status", &bad), *app = param(conn, "app", &bad),
               *name = param(conn, "name", &bad), *mins = param(conn, "minutes", &bad),
               *l = param(conn, "limit", &bad);
    if (bad) return problem(conn, 400, NULL, "a parameter longer than %d bytes or with a control character", PARAM_MAX);
    if (xid && !valid_xid(xid)) return problem(conn, 400, NULL, "xid: printable characters");
    char status[16], minutes[16];
    const char *status_p = NULL;
    if (st) {
      long code;
      int parsed = txp_global_status_parse(st);
      if (parsed < 0 && !(number(st, 0, TXP_GS__MAX - 1, 0, &code) && txp_global_status_name((int)code)))
        return problem(conn, 400, NULL, "status: a global status name (Committed, Rollbacked, ...) or its number");
      snprintf(status, sizeof(status), "%ld", parsed >= 0 ? (long)parsed : code);
      status_p = status;
    }
    if (!number(mins, 1, 60 * 24 * 31, 60, &n)) return problem(conn, 400, NULL, "minutes: 1 to 44640");
    snprintf(minutes, sizeof(minutes), "%ld", n);
    if (!number(l, 1, LIST_MAX, LIST_DEFAULT, &n))
      return problem(conn, 400, NULL, "limit: a number from 1 to %d", LIST_MAX);
    snprintf(lim, sizeof(lim), "%ld", n);
    const char *more[] = {xid, status_p, app, name, minutes, lim};
    return tc_query(h, conn, CONSOLE_SQL_HISTORY, 6, more, false, "history");
  }
  if (strcmp(path, "/api/activities") == 0) {
    const char *params[] = {"50"};
    return query(h, conn, h->cfg.stock, CONSOLE_SQL_ACTIVITIES, 1, params, false, "activities");
  }
  if (strcmp(path, "/api/sale") == 0 || strcmp(path, "/api/series") == 0) {
    const char *a = param(conn, "activity", &bad);
    long act;
    if (bad || !a || !number(a, 1, LONG_MAX, 0, &act))
      return problem(conn, 400, NULL, "activity: a positive number");
    if (strcmp(path, "/api/series") == 0) {
      const char *s = param(conn, "seconds", &bad);
      if (bad || !number(s, 1, CONSOLE_SAMPLES, 300, &n))
        return problem(conn, 400, NULL, "seconds: 1 to %d", CONSOLE_SAMPLES);
      if (!h->cfg.sampler) return problem(conn, 404, NULL, "the console samples nothing");
      json_t *o = console_sampler_json(h->cfg.sampler, act, (int)n);
      char *body = o ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
      json_decref(o);
      return json_answer(conn, body);
    }
    char id[24];
    snprintf(id, sizeof(id), "%ld", act);
    const char *params[] = {id};
    if (!h->cfg.stock) return problem(conn, 404, NULL, "sale: the console was started without the stock database");
    char *sale = NULL, *orders = NULL, err[512];
    if (console_db_value(h->cfg.stock, CONSOLE_SQL_SALE, 1, params, &sale, err, sizeof(err)) != 0)
      return problem(conn, 503, NULL, "%s", err);
    if (strcmp(sale, "null") == 0) {
      free(sale);
      return problem(conn, 404, NULL, "no activity %ld", act);
    }
    json_t *o = json_loads(sale, 0, NULL);
    free(sale);
    if (h->cfg.orders && console_db_value(h->cfg.orders, CONSOLE_SQL_SALE_ORDERS, 1, params, &orders, err,
                                          sizeof(err)) == 0) {
      json_t *ord = json_loads(orders, 0, NULL);
      json_object_update(o, ord);
      json_decref(ord);
    } else if (h->cfg.orders) {
      json_object_set_new(o, "orders_error", json_string(err));
    }
    free(orders);
    char *body = o ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(o);
    return json_answer(conn, body);
  }
  return problem(conn, 404, NULL, "no such API: %s (see console/console_http.h)", path);
}

/* ------------------------------------------------------------- routing */

static bool is_page(const char *path) {
  static const char *const pages[] = {"/", "/globals", "/locks", "/history", "/sale", NULL};
  for (int i = 0; pages[i]; i++)
    if (strcmp(path, pages[i]) == 0) return true;
  return false;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
  console_http_t *h = cls;
  request_t *req = *con_cls;
  if (!req) {
    if (!(req = calloc(1, sizeof(*req)))) return MHD_NO;
    *con_cls = req;
    return MHD_YES;
  }
  if (*upload_size) { /* a body: only the login form has one, and a small one */
    if (req->len + *upload_size > LOGIN_BODY_MAX) req->too_long = 1;
    else memcpy(req->body + req->len, upload, *upload_size), req->len += *upload_size;
    *upload_size = 0;
    return MHD_YES;
  }
  txc_httpguard_received(h->guard, conn);
  bool get = strcmp(method, MHD_HTTP_METHOD_GET) == 0 || strcmp(method, MHD_HTTP_METHOD_HEAD) == 0;
  bool post = strcmp(method, MHD_HTTP_METHOD_POST) == 0;

  if (strcmp(url, "/healthz") == 0) {
    if (!get) return problem(conn, 405, "GET, HEAD", "use GET");
    return answer(conn, MHD_HTTP_OK, strdup("ok\n"), "text/plain; charset=utf-8", NULL);
  }
  if (strcmp(url, "/login") == 0) {
    if (post) {
      if (req->too_long) return problem(conn, 413, NULL, "a login form is at most %d bytes", LOGIN_BODY_MAX);
      req->body[req->len] = '\0';
      char *token = NULL;
      if (!form_token(req->body, &token)) return problem(conn, 400, NULL, "the form has no token field");
      return login(h, conn, token, NULL);
    }
    if (!get) return problem(conn, 405, "GET, HEAD, POST", "use GET or POST");
    const char *token = MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "token");
    return login(h, conn, token && *token ? token : NULL,
                 MHD_lookup_connection_value(conn, MHD_GET_ARGUMENT_KIND, "next"));
  }
  if (strcmp(url, "/login.html") == 0 || strcmp(url, "/console.css") == 0) {
    if (!get) return problem(conn, 405, "GET, HEAD", "use GET");
    return asset(conn, url); /* the login page's own look: no secret in it */
  }
  if (*upload_size == 0 && req->len > 0 && !post) return problem(conn, 400, NULL, "unexpected request body");
  bool page = is_page(url);
  if (!authorized(h, conn)) {
    if (page) return redirect(conn, "/login", NULL);
    return problem(conn, 401, NULL, "log in first (/login) or send Authorization: Bearer <token>");
  }
  if (strcmp(url, "/logout") == 0)
    return redirect(conn, "/login", COOKIE "=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0");
  if (!get) return problem(conn, 405, "GET, HEAD", "the console is read-only: use GET");
  if (page) return asset(conn, "/index.html");
  if (strncmp(url, "/api/", 5) == 0) return api(h, conn, url);
  if (strcmp(url, "/console.js") == 0) return asset(conn, url);
  return problem(conn, 404, NULL, "no such page: %.200s (try /, /globals, /locks, /history, /sale)", url);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls, enum MHD_RequestTerminationCode toe) {
  console_http_t *h = cls;
  free(*con_cls);
  *con_cls = NULL;
  txc_httpguard_completed(h->guard, conn);
}

__attribute__((format(printf, 2, 0))) static void mhd_log(void *arg, const char *fmt, va_list ap) {
  char msg[512];
  vsnprintf(msg, sizeof(msg), fmt, ap);
  size_t n = strlen(msg);
  while (n && (msg[n - 1] == '\n' || msg[n - 1] == '\r')) msg[--n] = '\0';
  console_log("warn", "http: %s", msg);
}

/* {"", "Begin", ...}: names by number + 1 (console_sql.h). */
static void names_array(char *out, size_t cap, int max, const char *(*name)(int)) {
  size_t o = (size_t)snprintf(out, cap, "{");
  for (int i = 0; i < max && o < cap; i++) {
    const char *s = name(i);
    o += (size_t)snprintf(out + o, cap - o, "%s\"%s\"", i ? "," : "", s ? s : "");
  }
  if (o < cap) snprintf(out + o, cap - o, "}");
}

console_http_t *console_http_start(const console_http_cfg_t *cfg, char *err, size_t errlen) {
  char host[256], portstr[16];
  const char *colon = strrchr(cfg->listen, ':');
  if (!colon || colon == cfg->listen || (size_t)(colon - cfg->listen) >= sizeof(host) || !colon[1]) {
    snprintf(err, errlen, "--listen \"%s\": expected host:port", cfg->listen);
    return NULL;
  }
  memcpy(host, cfg->listen, (size_t)(colon - cfg->listen));
  host[colon - cfg->listen] = '\0';
  if (host[0] == '[' && host[strlen(host) - 1] == ']') {
    memmove(host, host + 1, strlen(host));
    host[strlen(host) - 1] = '\0';
  }
  snprintf(portstr, sizeof(portstr), "%s", colon + 1);
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV | AI_PASSIVE},
                  *ai = NULL;
  int gr = getaddrinfo(host, portstr, &hints, &ai);
  if (gr != 0 || !ai) {
    snprintf(err, errlen, "--listen \"%s\": %s", cfg->listen, gai_strerror(gr));
    return NULL;
  }
  console_http_t *h = calloc(1, sizeof(*h));
  if (!h) {
    freeaddrinfo(ai);
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  h->cfg = *cfg;
  hash_token(cfg->token, strlen(cfg->token), h->token_hash);
  unsigned char key[crypto_generichash_KEYBYTES];
  hash_token(cfg->token, strlen(cfg->token), key); /* crypto_generichash_BYTES == KEYBYTES (32) */
  unsigned char mac[crypto_generichash_BYTES];
  crypto_generichash(mac, sizeof(mac), (const unsigned char *)SESSION_CONTEXT, strlen(SESSION_CONTEXT), key,
                     sizeof(key));
  sodium_bin2hex(h->session, sizeof(h->session), mac, sizeof(mac));
  names_array(h->global_names, sizeof(h->global_names), TXP_GS__MAX, txp_global_status_name);
  names_array(h->branch_names, sizeof(h->branch_names), TXP_BS__MAX, txp_branch_status_name);
  names_array(h->type_names, sizeof(h->type_names), TXP_BT__MAX, txp_branch_type_name);
  unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_USE_ERROR_LOG;
  if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
  h->guard = txc_httpguard_new(CONSOLE_HTTP_CONNECTIONS, CONSOLE_HTTP_REQUEST_MS);
  h->mhd = !h->guard ? NULL
                     : MHD_start_daemon(flags, 0, NULL, NULL, on_request, h, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,
                                        MHD_OPTION_SOCK_ADDR, ai->ai_addr, MHD_OPTION_THREAD_POOL_SIZE,
                                        (unsigned)CONSOLE_HTTP_THREADS, MHD_OPTION_CONNECTION_LIMIT,
                                        (unsigned)CONSOLE_HTTP_CONNECTIONS, MHD_OPTION_PER_IP_CONNECTION_LIMIT, 16u,
                                        MHD_OPTION_CONNECTION_TIMEOUT, 30u, MHD_OPTION_NOTIFY_CONNECTION,
                                        txc_httpguard_notify, h->guard, MHD_OPTION_NOTIFY_COMPLETED, on_completed, h,
                                        MHD_OPTION_END);
  freeaddrinfo(ai);
  if (!h->mhd) {
    snprintf(err, errlen, "cannot listen on \"%s\" (address in use, or not this machine's?)", cfg->listen);
    txc_httpguard_free(h->guard);
    free(h);
    return NULL;
  }
  const union MHD_DaemonInfo *info = MHD_get_daemon_info(h->mhd, MHD_DAEMON_INFO_BIND_PORT);
  h->port = info ? (int)info->port : 0;
  return h;
}

int console_http_port(const console_http_t *h) { return h->port; }

void console_http_stop(console_http_t *h) {
  if (!h) return;
  MHD_stop_daemon(h->mhd);
  txc_httpguard_free(h->guard);
  sodium_memzero(h->token_hash, sizeof(h->token_hash));
  sodium_memzero(h->session, sizeof(h->session));
  free(h);
}
