/*
 * svc_http.c - JSON HTTP server (libmicrohttpd) and client (libcurl) for
 * the example services; see svc_http.h.
 *
 * NOTES
 *   Server request lifecycle in libmicrohttpd's terms: the access handler
 *   is called first with no body (we allocate the request's buffer and
 *   keep it in *con_cls), then once per body chunk (appended, up to
 *   SVC_HTTP_MAX_BODY), then once with *upload_data_size == 0: the request
 *   is complete and the service's handler runs.  The completion callback
 *   frees the buffer, whatever happened to the connection.
 */
#include "svc_http.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <curl/curl.h>
#include <microhttpd.h>

#include "svc_common.h"

/* ------------------------------------------------------------- server */

struct svc_http {
  struct MHD_Daemon *d;
  svc_handler_fn fn;
  void *arg;
  int port;
};

typedef struct req_ctx {
  char *buf;
  size_t len, cap;
  bool too_big;
} req_ctx_t;

const char *svc_req_header(const svc_req_t *req, const char *name) {
  return MHD_lookup_connection_value((struct MHD_Connection *)req->conn_, MHD_HEADER_KIND, name);
}

void svc_resp_json(svc_resp_t *resp, int status, json_t *body) {
  json_decref(resp->body);
  resp->status = status;
  resp->body = body;
}

void svc_resp_error(svc_resp_t *resp, int status, const char *reason, const char *detail) {
  json_t *o = json_pack("{s:s}", "error", reason);
  if (detail) {
    json_t *d = json_string(detail);
    if (d) json_object_set_new(o, "detail", d);
  }
  svc_resp_json(resp, status, o);
}

static enum MHD_Result send_json(struct MHD_Connection *conn, int status, json_t *body) {
  char *s = body ? json_dumps(body, JSON_COMPACT) : NULL;
  if (!s) {
    status = 500;
    s = strdup("{\"error\":\"internal\"}");
    if (!s) return MHD_NO;
  }
  size_t n = strlen(s);
  struct MHD_Response *r = MHD_create_response_from_buffer(n, s, MHD_RESPMEM_MUST_FREE);
  if (!r) {
    free(s);
    return MHD_NO;
  }
  MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
  enum MHD_Result ret = MHD_queue_response(conn, (unsigned)status, r);
  MHD_destroy_response(r);
  return ret;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_data_size,
                                  void **con_cls) {
  (void)version;
  svc_http_t *h = cls;
  req_ctx_t *rc = *con_cls;
  if (!rc) {
    rc = calloc(1, sizeof(*rc));
    if (!rc) return MHD_NO;
    *con_cls = rc;
    return MHD_YES;
  }
  if (*upload_data_size > 0) {
    size_t n = *upload_data_size;
    *upload_data_size = 0;
    if (rc->too_big || rc->len + n > SVC_HTTP_MAX_BODY) {
      rc->too_big = true;
      return MHD_YES;
    }
    if (rc->len + n + 1 > rc->cap) {
      size_t cap = rc->cap ? rc->cap : 512;
      while (cap < rc->len + n + 1) cap *= 2;
      char *nb = realloc(rc->buf, cap);
      if (!nb) return MHD_NO;
      rc->buf = nb;
      rc->cap = cap;
    }
    memcpy(rc->buf + rc->len, upload_data, n);
    rc->len += n;
    rc->buf[rc->len] = '\0';
    return MHD_YES;
  }
  svc_resp_t resp = {0};
  if (rc->too_big) {
    svc_resp_error(&resp, 413, "body_too_large", "request bodies are limited to 16384 bytes");
  } else {
    svc_req_t req = {.method = method, .path = url, .body = rc->buf ? rc->buf : "", .body_len = rc->len,
                     .conn_ = conn};
    h->fn(&req, &resp, h->arg);
    if (resp.status == 0 || !resp.body) svc_resp_error(&resp, 500, "internal", NULL);
  }
  enum MHD_Result ret = send_json(conn, resp.status, resp.body);
  json_decref(resp.body);
  return ret;
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
  (void)cls;
  (void)conn;
  (void)toe;
  req_ctx_t *rc = *con_cls;
  if (rc) {
    free(rc->buf);
    free(rc);
  }
  *con_cls = NULL;
}

static void mhd_log(void *cls, const char *fmt, va_list ap) {
  (void)cls;
  char buf[512];
  vsnprintf(buf, sizeof(buf), fmt, ap);
  size_t n = strlen(buf);
  while (n && buf[n - 1] == '\n') buf[--n] = '\0';
  svc_warn("http server: %s", buf);
}

/* Parse "host:port" into an IPv4 socket address (host may be a name). */
static bool parse_listen(const char *listen, struct sockaddr_in *sa, char *err, size_t errlen) {
  const char *colon = strrchr(listen, ':');
  if (!colon || colon == listen) {
    snprintf(err, errlen, "invalid listen address \"%s\": expected host:port", listen);
    return false;
  }
  long long port;
  if (!svc_parse_ll(colon + 1, 0, 65535, &port)) {
    snprintf(err, errlen, "invalid port in listen address \"%s\"", listen);
    return false;
  }
  char host[256];
  size_t hl = (size_t)(colon - listen);
  if (hl >= sizeof(host)) hl = sizeof(host) - 1;
  memcpy(host, listen, hl);
  host[hl] = '\0';
  memset(sa, 0, sizeof(*sa));
  sa->sin_family = AF_INET;
  sa->sin_port = htons((uint16_t)port);
  if (inet_pton(AF_INET, host, &sa->sin_addr) == 1) return true;
  struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai = NULL;
  if (getaddrinfo(host, NULL, &hints, &ai) != 0 || !ai) {
    snprintf(err, errlen, "could not resolve listen host \"%s\"", host);
    return false;
  }
  sa->sin_addr = ((struct sockaddr_in *)(void *)ai->ai_addr)->sin_addr;
  freeaddrinfo(ai);
  return true;
}

svc_http_t *svc_http_start(const char *listen, unsigned threads, svc_handler_fn fn, void *arg, char *err,
                           size_t errlen) {
  struct sockaddr_in sa;
  if (!parse_listen(listen, &sa, err, errlen)) return NULL;
  svc_http_t *h = calloc(1, sizeof(*h));
  if (!h) {
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  h->fn = fn;
  h->arg = arg;
  if (threads < 1) threads = 1;
  h->d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_USE_ERROR_LOG, 0, NULL, NULL,
                          on_request, h, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
                          MHD_OPTION_THREAD_POOL_SIZE, threads, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)60,
                          MHD_OPTION_CONNECTION_LIMIT, (unsigned)4000, MHD_OPTION_LISTEN_BACKLOG_SIZE,
                          (unsigned)1024, MHD_OPTION_NOTIFY_COMPLETED, on_completed, NULL,
                          MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL, MHD_OPTION_END);
  if (!h->d) {
    snprintf(err, errlen, "could not listen on \"%s\" (address in use or not local?)", listen);
    free(h);
    return NULL;
  }
  const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
  h->port = di ? (int)di->port : (int)ntohs(sa.sin_port);
  return h;
}

int svc_http_port(const svc_http_t *h) { return h->port; }

void svc_http_stop(svc_http_t *h) {
  if (!h) return;
  MHD_stop_daemon(h->d);
  free(h);
}

/* ------------------------------------------------------------- client */

#define HTTPC_MAX_IDLE 256

struct svc_httpc {
  pthread_mutex_t mu;
  char *base;
  int nidle;
  CURL *idle[HTTPC_MAX_IDLE];
};

bool svc_http_global_init(void) { return curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK; }
void svc_http_global_cleanup(void) { curl_global_cleanup(); }

svc_httpc_t *svc_httpc_new(const char *base_url) {
  svc_httpc_t *c = calloc(1, sizeof(*c));
  if (!c) return NULL;
  c->base = strdup(base_url);
  if (!c->base) {
    free(c);
    return NULL;
  }
  size_t n = strlen(c->base);
  while (n && c->base[n - 1] == '/') c->base[--n] = '\0';
  pthread_mutex_init(&c->mu, NULL);
  return c;
}

void svc_httpc_free(svc_httpc_t *c) {
  if (!c) return;
  for (int i = 0; i < c->nidle; i++) curl_easy_cleanup(c->idle[i]);
  pthread_mutex_destroy(&c->mu);
  free(c->base);
  free(c);
}

typedef struct growbuf {
  char *p;
  size_t len, cap;
} growbuf_t;

static size_t on_write(char *ptr, size_t size, size_t nmemb, void *ud) {
  growbuf_t *b = ud;
  size_t n = size * nmemb;
  if (b->len + n > 1 << 20) return 0; /* 1 MiB is plenty for these answers */
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap * 2 : 1024;
    while (cap < b->len + n + 1) cap *= 2;
    char *np = realloc(b->p, cap);
    if (!np) return 0;
    b->p = np;
    b->cap = cap;
  }
  memcpy(b->p + b->len, ptr, n);
  b->len += n;
  b->p[b->len] = '\0';
  return n;
}

int svc_httpc_post(svc_httpc_t *c, const char *path, const char *xid, const json_t *body, unsigned timeout_ms,
                   long *status, json_t **answer, char *err, size_t errlen) {
  *answer = NULL;
  *status = 0;
  CURL *e = NULL;
  pthread_mutex_lock(&c->mu);
  if (c->nidle > 0) e = c->idle[--c->nidle];
  pthread_mutex_unlock(&c->mu);
  if (!e) e = curl_easy_init();
  if (!e) {
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  char url[1024];
  snprintf(url, sizeof(url), "%s%s", c->base, path);
  char *payload = json_dumps(body, JSON_COMPACT);
  struct curl_slist *hdrs = curl_slist_append(NULL, "Content-Type: application/json");
  hdrs = curl_slist_append(hdrs, "Expect:");
  if (xid) {
    char hx[RM_XID_MAX + 32];
    snprintf(hx, sizeof(hx), "%s: %s", SVC_XID_HEADER, xid);
    hdrs = curl_slist_append(hdrs, hx);
  }
  growbuf_t buf = {0};
  curl_easy_reset(e); /* keeps the live connection, clears options */
  curl_easy_setopt(e, CURLOPT_URL, url);
  curl_easy_setopt(e, CURLOPT_POSTFIELDS, payload ? payload : "{}");
  curl_easy_setopt(e, CURLOPT_HTTPHEADER, hdrs);
  curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_write);
  curl_easy_setopt(e, CURLOPT_WRITEDATA, &buf);
  curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, (long)timeout_ms);
  curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, (long)(timeout_ms < 2000 ? timeout_ms : 2000));
  curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(e, CURLOPT_TCP_NODELAY, 1L);
  CURLcode cc = curl_easy_perform(e);
  int rc = 0;
  if (cc != CURLE_OK) {
    snprintf(err, errlen, "could not call %s: %s", url, curl_easy_strerror(cc));
    rc = -1;
  } else {
    curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, status);
    if (buf.p) *answer = json_loadb(buf.p, buf.len, 0, NULL);
  }
  curl_slist_free_all(hdrs);
  free(payload);
  free(buf.p);
  pthread_mutex_lock(&c->mu);
  if (rc == 0 && c->nidle < HTTPC_MAX_IDLE) {
    c->idle[c->nidle++] = e;
    e = NULL;
  }
  pthread_mutex_unlock(&c->mu);
  if (e) curl_easy_cleanup(e); /* after a failure: drop the connection too */
  return rc;
}
