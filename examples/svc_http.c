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
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include <curl/curl.h>
#include <microhttpd.h>

#include "svc_common.h"
#include "svc_problem.h"
#include "txc_httpguard.h"

/* ------------------------------------------------------------- server */

/*
 * Threads: libmicrohttpd's own pool ('io_threads', the CPUs) reads and
 * writes the sockets; a complete request is suspended there
 * (MHD_suspend_connection) and queued to our workers ('workers' threads),
 * which run the blocking handlers; a worker stores the answer and resumes
 * the connection, and libmicrohttpd calls the access handler once more,
 * which queues the answer.  One shared FIFO queue means a slow request
 * delays no other one while a worker is free (with libmicrohttpd's pool
 * alone, a handler blocking its thread would stall every connection that
 * thread owns).
 *
 * Shutdown: stop accepting (MHD_quiesce_daemon), answer 503 to requests
 * that arrive from now on, let the workers finish the queue, then stop the
 * daemon (no connection is suspended any more) and join the workers.
 */
typedef enum { REQ_READING, REQ_QUEUED, REQ_ANSWERED } req_state_t;

typedef struct req_ctx {
  txc_buf_t body; /* at most SVC_HTTP_MAX_BODY bytes; body.over: it was longer */
  req_state_t state;
  struct MHD_Connection *conn;
  char *method, *path;
  svc_resp_t resp;
  int64_t queued_us;    /* when it had arrived whole (the latency's start) */
  struct req_ctx *next; /* work queue */
} req_ctx_t;

/* Connections at once, and how long a request may take to arrive (from
 * connect, or the last answer on a kept-alive connection): a stranger
 * dribbling its headers is cut then (txc_httpguard.h). */
#define SVC_HTTP_CONNECTIONS 4000
#define SVC_HTTP_REQUEST_DEADLINE_MS 10000

struct svc_http {
  struct MHD_Daemon *d;
  txc_httpguard_t *guard;
  svc_handler_fn fn;
  void *arg;
  int port;

  pthread_mutex_t mu;
  pthread_cond_t cv;      /* work queued, or stopping */
  pthread_cond_t idle_cv; /* a job finished */
  req_ctx_t *head, *tail;
  int queued, running;
  bool stopping;
  pthread_t *workers;
  int nworkers;
};

const char *svc_req_header(const svc_req_t *req, const char *name) {
  return MHD_lookup_connection_value((struct MHD_Connection *)req->conn_, MHD_HEADER_KIND, name);
}

void svc_resp_json(svc_resp_t *resp, int status, json_t *body) {
  json_decref(resp->body);
  resp->status = status;
  resp->body = body;
  resp->text = false;
}

void svc_resp_error(svc_resp_t *resp, int status, const char *reason, const char *detail) {
  svc_resp_json(resp, status, svc_problem_new(status, reason, detail));
}

void svc_resp_text(svc_resp_t *resp, int status, const char *text) {
  svc_resp_json(resp, status, json_string(text ? text : ""));
  resp->text = resp->body != NULL;
}

void svc_resp_metrics(svc_resp_t *resp, txc_buf_t *b) {
  svc_http_metrics(b);
  svc_process_metrics(b);
  if (b->p)
    svc_resp_text(resp, 200, b->p);
  else
    svc_resp_error(resp, 500, "internal", "out of memory");
  free(b->p);
  b->p = NULL;
}

void svc_resp_header(svc_resp_t *resp, const char *name, const char *value) {
  for (int i = 0; i < resp->nheaders; i++)
    if (strcasecmp(resp->headers[i][0], name) == 0) {
      resp->headers[i][1] = value;
      return;
    }
  if (resp->nheaders >= SVC_RESP_MAX_HEADERS) return;
  resp->headers[resp->nheaders][0] = name;
  resp->headers[resp->nheaders][1] = value;
  resp->nheaders++;
}

void svc_resp_header_copy(svc_resp_t *resp, const char *name, const char *value) {
  size_t n = strlen(value) + 1;
  if (resp->hlen + n > sizeof(resp->hbuf)) return;
  char *v = resp->hbuf + resp->hlen;
  memcpy(v, value, n);
  resp->hlen += n;
  svc_resp_header(resp, name, v);
}

const char *svc_resp_get_header(const svc_resp_t *resp, const char *name) {
  for (int i = 0; i < resp->nheaders; i++)
    if (strcasecmp(resp->headers[i][0], name) == 0) return resp->headers[i][1];
  return NULL;
}

void svc_resp_not_allowed(svc_resp_t *resp, const char *allow) {
  char detail[128];
  snprintf(detail, sizeof(detail), "this path answers only %s", allow);
  svc_resp_error(resp, 405, "method_not_allowed", detail);
  svc_resp_header_copy(resp, "Allow", allow);
}

void svc_resp_finish(svc_resp_t *resp) {
  if (resp->status == 0 || !resp->body) svc_resp_error(resp, 500, "internal", NULL);
  if (resp->status >= 400 && !resp->text) {
    resp->body = svc_problem_complete(resp->body, resp->status);
    if (!resp->body) resp->status = 500; /* out of memory: send_json's fallback */
  }
  /* Every 503 is "try again soon" (a store, Redis or the coordinator is
   * away, e.g. the second or two of a Redis failover): say when. */
  if (resp->status == 503 && !svc_resp_get_header(resp, "Retry-After")) svc_resp_header(resp, "Retry-After", "1");
}

/* ---- routes ---- */

/* Whether 'path' matches template 'tmpl'; the first {id} in '*id'. */
static bool route_match(const char *tmpl, const char *path, long long *id) {
  *id = 0;
  for (;;) {
    if (strncmp(tmpl, "{id}", 4) == 0) {
      if (*path < '1' || *path > '9') return false;
      long long v = 0;
      for (; *path >= '0' && *path <= '9'; path++) {
        if (v > (INT64_MAX - (*path - '0')) / 10) return false;
        v = v * 10 + (*path - '0');
      }
      if (*id == 0) *id = v;
      tmpl += 4;
      continue;
    }
    if (*tmpl != *path) return false;
    if (!*tmpl) return true;
    tmpl++;
    path++;
  }
}

int svc_route_find(const svc_route_t *routes, size_t n, const char *method, const char *path, long long *id,
                   char *allow, size_t allowlen) {
  size_t used = 0;
  bool path_known = false;
  if (allowlen) allow[0] = '\0';
  for (size_t i = 0; i < n; i++) {
    long long v;
    if (!route_match(routes[i].path, path, &v)) continue;
    if (strcmp(routes[i].method, method) == 0) {
      *id = v;
      return (int)i;
    }
    path_known = true;
    int w = snprintf(allow + used, allowlen > used ? allowlen - used : 0, "%s%s", used ? ", " : "",
                     routes[i].method);
    if (w > 0 && used + (size_t)w < allowlen)
      used += (size_t)w;
    else if (allowlen)
      allow[used] = '\0'; /* it did not fit: cut at the last whole method */
  }
  *id = 0;
  return path_known ? SVC_ROUTE_NOT_ALLOWED : SVC_ROUTE_NOT_FOUND;
}

bool svc_route_or_reply(const svc_route_t *routes, size_t n, const svc_req_t *req, svc_resp_t *resp, int *op,
                        long long *id) {
  char allow[64];
  int i = svc_route_find(routes, n, req->method, req->path, id, allow, sizeof(allow));
  if (i >= 0) {
    *op = routes[i].op;
    return true;
  }
  if (i == SVC_ROUTE_NOT_ALLOWED)
    svc_resp_not_allowed(resp, allow);
  else
    svc_resp_error(resp, 404, "not_found", "no such path on this service");
  return false;
}

bool svc_routes_option(int argc, char **argv, const svc_route_t *routes, size_t n) {
  if (argc != 2 || strcmp(argv[1], "--routes") != 0) return false;
  for (size_t i = 0; i < n; i++) printf("%s %s\n", routes[i].method, routes[i].path);
  return true;
}

static _Atomic unsigned long long status_counts[600];

/* Queue 'r' with the answer's extra headers. */
static enum MHD_Result queue(struct MHD_Connection *conn, const svc_resp_t *resp, int status,
                             struct MHD_Response *r) {
  for (int i = 0; resp && i < resp->nheaders; i++) MHD_add_response_header(r, resp->headers[i][0], resp->headers[i][1]);
  if (status >= 100 && status < 600) status_counts[status]++;
  enum MHD_Result ret = MHD_queue_response(conn, (unsigned)status, r);
  MHD_destroy_response(r);
  return ret;
}

/* ---- request durations (svc_http_metrics) ---- */

static const double dur_bounds[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
#define NDUR (sizeof(dur_bounds) / sizeof(dur_bounds[0]))

typedef struct dur_series {
  char method[8], route[64];
  int status;
  unsigned long long buckets[NDUR], count;
  double sum;
} dur_series_t;

static pthread_mutex_t dur_mu = PTHREAD_MUTEX_INITIALIZER;
static dur_series_t dur[SVC_HTTP_SERIES];
static int ndur;

void svc_http_route(const char *path, char *out, size_t cap) {
  size_t o = 0;
  const char *p = path ? path : "";
  while (*p && o + 1 < cap) {
    if (*p == '/') {
      out[o++] = *p++;
      const char *q = p;
      while (*q >= '0' && *q <= '9') q++;
      if (q > p && (*q == '/' || *q == '\0')) { /* a segment of digits */
        if (o + 5 >= cap) break;
        memcpy(out + o, "{id}", 4);
        o += 4;
        p = q;
      }
      continue;
    }
    char c = *p++;
    /* label-safe: anything else than these is '_' */
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
              c == '.';
    out[o++] = ok ? c : '_';
  }
  if (*p) o = (size_t)snprintf(out, cap, "other");
  out[o < cap ? o : cap - 1] = '\0';
}

static void record_duration(const char *method, const char *path, int status, double seconds) {
  char route[64], m[8];
  svc_http_route(path, route, sizeof(route));
  snprintf(m, sizeof(m), "%s", method && strlen(method) < sizeof(m) ? method : "OTHER");
  pthread_mutex_lock(&dur_mu);
  int i = 0;
  while (i < ndur && !(dur[i].status == status && strcmp(dur[i].route, route) == 0 && strcmp(dur[i].method, m) == 0))
    i++;
  if (i == ndur) {
    if (ndur < SVC_HTTP_SERIES - 1) {
      ndur++;
    } else { /* full: the last series is "other" */
      i = SVC_HTTP_SERIES - 1;
      if (ndur < SVC_HTTP_SERIES) ndur = SVC_HTTP_SERIES;
      snprintf(route, sizeof(route), "other");
      snprintf(m, sizeof(m), "OTHER");
      status = 0;
    }
    snprintf(dur[i].method, sizeof(dur[i].method), "%s", m);
    snprintf(dur[i].route, sizeof(dur[i].route), "%s", route);
    dur[i].status = status;
  }
  for (size_t k = 0; k < NDUR; k++)
    if (seconds <= dur_bounds[k]) dur[i].buckets[k]++;
  dur[i].count++;
  dur[i].sum += seconds;
  pthread_mutex_unlock(&dur_mu);
}

void svc_http_metrics(struct txc_buf *b) {
  txc_buf_printf(b, "# HELP txc_client_http_responses_total HTTP answers of this service by status.\n"
                    "# TYPE txc_client_http_responses_total counter\n");
  for (int code = 100; code < 600; code++) {
    unsigned long long n = status_counts[code];
    if (n) txc_buf_printf(b, "txc_client_http_responses_total{status=\"%d\"} %llu\n", code, n);
  }
  txc_buf_printf(b, "# HELP txc_http_request_duration_seconds Requests answered by this service, from their arrival "
                    "to their answer, by method, route and status.\n"
                    "# TYPE txc_http_request_duration_seconds histogram\n");
  pthread_mutex_lock(&dur_mu);
  for (int i = 0; i < ndur; i++) {
    const dur_series_t *d = &dur[i];
    char labels[128];
    snprintf(labels, sizeof(labels), "method=\"%.7s\",route=\"%.63s\",status=\"%d\"", d->method, d->route,
             d->status);
    for (size_t k = 0; k < NDUR; k++)
      txc_buf_printf(b, "txc_http_request_duration_seconds_bucket{%s,le=\"%g\"} %llu\n", labels, dur_bounds[k],
                     d->buckets[k]);
    txc_buf_printf(b, "txc_http_request_duration_seconds_bucket{%s,le=\"+Inf\"} %llu\n", labels, d->count);
    txc_buf_printf(b, "txc_http_request_duration_seconds_sum{%s} %.6f\n", labels, d->sum);
    txc_buf_printf(b, "txc_http_request_duration_seconds_count{%s} %llu\n", labels, d->count);
  }
  pthread_mutex_unlock(&dur_mu);
}

/* A text answer (svc_resp_text). */
static enum MHD_Result send_text(struct MHD_Connection *conn, const svc_resp_t *resp) {
  int status = resp->status;
  const char *t = json_string_value(resp->body);
  char *s = strdup(t ? t : "");
  if (!s) return MHD_NO;
  struct MHD_Response *r = MHD_create_response_from_buffer(strlen(s), s, MHD_RESPMEM_MUST_FREE);
  if (!r) {
    free(s);
    return MHD_NO;
  }
  MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8");
  return queue(conn, resp, status, r);
}

static enum MHD_Result send_json(struct MHD_Connection *conn, svc_resp_t *resp) {
  svc_resp_finish(resp);
  int status = resp->status;
  char *s = resp->body ? json_dumps(resp->body, JSON_COMPACT) : NULL;
  if (!s) {
    status = 500;
    s = strdup("{\"type\":\"" SVC_PROBLEM_TYPE_PREFIX "internal\",\"title\":\"Internal error\",\"status\":500,"
               "\"detail\":\"out of memory\",\"error\":\"internal\"}");
    if (!s) return MHD_NO;
  }
  size_t n = strlen(s);
  struct MHD_Response *r = MHD_create_response_from_buffer(n, s, MHD_RESPMEM_MUST_FREE);
  if (!r) {
    free(s);
    return MHD_NO;
  }
  MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE,
                          status >= 400 ? SVC_PROBLEM_MEDIA_TYPE : "application/json");
  return queue(conn, resp, status, r);
}

static void *worker_main(void *arg) {
  svc_http_t *h = arg;
  pthread_mutex_lock(&h->mu);
  for (;;) {
    while (!h->head && !h->stopping) pthread_cond_wait(&h->cv, &h->mu);
    if (!h->head) break; /* stopping and nothing left */
    req_ctx_t *rc = h->head;
    h->head = rc->next;
    if (!h->head) h->tail = NULL;
    h->queued--;
    h->running++;
    pthread_mutex_unlock(&h->mu);

    svc_req_t req = {.method = rc->method, .path = rc->path, .body = rc->body.p ? rc->body.p : "",
                     .body_len = rc->body.len, .conn_ = rc->conn};
    h->fn(&req, &rc->resp, h->arg);
    svc_resp_finish(&rc->resp);
    record_duration(rc->method, rc->path, rc->resp.status, (double)(svc_now_us() - rc->queued_us) / 1e6);
    struct MHD_Connection *conn = rc->conn;

    /* The I/O thread reads the answer after the resume, which
     * synchronises (a mutex and a wake-up inside libmicrohttpd); 'rc' may
     * be freed as soon as it is resumed: not touched after. */
    rc->state = REQ_ANSWERED;
    MHD_resume_connection(conn);
    pthread_mutex_lock(&h->mu);
    h->running--;
    pthread_cond_broadcast(&h->idle_cv);
  }
  pthread_mutex_unlock(&h->mu);
  return NULL;
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
    rc->body.max = SVC_HTTP_MAX_BODY;
    *con_cls = rc;
    return MHD_YES;
  }
  if (rc->state == REQ_ANSWERED) /* resumed by a worker */
    return rc->resp.text && json_is_string(rc->resp.body) ? send_text(conn, &rc->resp) : send_json(conn, &rc->resp);
  if (*upload_data_size > 0) {
    size_t n = *upload_data_size;
    *upload_data_size = 0;
    if (rc->body.over) return MHD_YES; /* too long: the rest is read and dropped (413) */
    return txc_buf_add(&rc->body, upload_data, n) || rc->body.over ? MHD_YES : MHD_NO;
  }
  if (rc->state != REQ_READING) return MHD_YES; /* queued: not resumed yet */
  txc_httpguard_received(h->guard, conn);
  if (rc->body.over) {
    svc_resp_error(&rc->resp, 413, "body_too_large", "request bodies are limited to 16384 bytes");
    return send_json(conn, &rc->resp);
  }
  rc->method = strdup(method);
  rc->path = strdup(url);
  if (!rc->method || !rc->path) return MHD_NO;
  rc->conn = conn;
  pthread_mutex_lock(&h->mu);
  if (h->stopping) {
    pthread_mutex_unlock(&h->mu);
    svc_resp_error(&rc->resp, 503, "shutting_down", NULL);
    return send_json(conn, &rc->resp);
  }
  rc->state = REQ_QUEUED;
  rc->queued_us = svc_now_us();
  MHD_suspend_connection(conn);
  if (h->tail)
    h->tail->next = rc;
  else
    h->head = rc;
  h->tail = rc;
  h->queued++;
  pthread_cond_signal(&h->cv);
  pthread_mutex_unlock(&h->mu);
  return MHD_YES;
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
  (void)toe;
  txc_httpguard_completed(((svc_http_t *)cls)->guard, conn);
  req_ctx_t *rc = *con_cls;
  if (rc) {
    json_decref(rc->resp.body);
    free(rc->method);
    free(rc->path);
    free(rc->body.p);
    free(rc);
  }
  *con_cls = NULL;
}

/* printf-style: lets the compiler check the forwarding of fmt to vsnprintf. */
__attribute__((format(printf, 2, 0))) static void mhd_log(void *cls, const char *fmt, va_list ap) {
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

svc_http_t *svc_http_start(const char *listen, unsigned io_threads, unsigned workers, svc_handler_fn fn,
                           void *arg, char *err, size_t errlen) {
  struct sockaddr_in sa;
  if (!parse_listen(listen, &sa, err, errlen)) return NULL;
  svc_http_t *h = calloc(1, sizeof(*h));
  if (!h) {
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  h->fn = fn;
  h->arg = arg;
  pthread_mutex_init(&h->mu, NULL);
  pthread_cond_init(&h->cv, NULL);
  pthread_cond_init(&h->idle_cv, NULL);
  if (io_threads < 1) io_threads = 1;
  if (workers < 1) workers = 1;
  h->workers = calloc(workers, sizeof(pthread_t));
  if (!h->workers) {
    snprintf(err, errlen, "out of memory");
    goto fail;
  }
  for (unsigned i = 0; i < workers; i++) {
    if (pthread_create(&h->workers[i], NULL, worker_main, h) != 0) {
      snprintf(err, errlen, "could not start worker threads");
      goto fail;
    }
    h->nworkers++;
  }
  unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_USE_ERROR_LOG | MHD_ALLOW_SUSPEND_RESUME;
  h->guard = txc_httpguard_new(SVC_HTTP_CONNECTIONS, SVC_HTTP_REQUEST_DEADLINE_MS);
  if (!h->guard) {
    snprintf(err, errlen, "out of memory");
    goto fail;
  }
  h->d = MHD_start_daemon(flags, 0, NULL, NULL, on_request, h, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,
                          MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa, MHD_OPTION_THREAD_POOL_SIZE, io_threads,
                          MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)60, MHD_OPTION_CONNECTION_LIMIT,
                          (unsigned)SVC_HTTP_CONNECTIONS, MHD_OPTION_LISTEN_BACKLOG_SIZE, (unsigned)1024,
                          MHD_OPTION_NOTIFY_COMPLETED, on_completed, h, MHD_OPTION_NOTIFY_CONNECTION,
                          txc_httpguard_notify, h->guard, MHD_OPTION_END);
  if (!h->d) {
    snprintf(err, errlen, "could not listen on \"%s\" (address in use or not local?)", listen);
    goto fail;
  }
  const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
  h->port = di ? (int)di->port : (int)ntohs(sa.sin_port);
  return h;

fail:
  pthread_mutex_lock(&h->mu);
  h->stopping = true;
  pthread_cond_broadcast(&h->cv);
  pthread_mutex_unlock(&h->mu);
  for (int i = 0; i < h->nworkers; i++) pthread_join(h->workers[i], NULL);
  txc_httpguard_free(h->guard);
  free(h->workers);
  pthread_mutex_destroy(&h->mu);
  pthread_cond_destroy(&h->cv);
  pthread_cond_destroy(&h->idle_cv);
  free(h);
  return NULL;
}

int svc_http_port(const svc_http_t *h) { return h->port; }

void svc_http_stop(svc_http_t *h) {
  if (!h) return;
  MHD_socket ls = MHD_quiesce_daemon(h->d); /* no new connections */
  pthread_mutex_lock(&h->mu);
  h->stopping = true; /* new requests on open connections: 503 */
  pthread_cond_broadcast(&h->cv);
  while (h->queued > 0 || h->running > 0) pthread_cond_wait(&h->idle_cv, &h->mu);
  pthread_mutex_unlock(&h->mu);
  for (int i = 0; i < h->nworkers; i++) pthread_join(h->workers[i], NULL);
  MHD_stop_daemon(h->d);
  txc_httpguard_free(h->guard);
  if (ls != MHD_INVALID_SOCKET) close(ls);
  free(h->workers);
  pthread_mutex_destroy(&h->mu);
  pthread_cond_destroy(&h->cv);
  pthread_cond_destroy(&h->idle_cv);
  free(h);
}

/* ------------------------------------------------- a service's main() */

int svc_main_start(svc_main_t *m, const char *name, const char *prefix, int argc, char **argv,
                   const svc_route_t *routes, size_t nroutes, void (*usage)(FILE *f)) {
  if (svc_routes_option(argc, argv, routes, nroutes)) return 0;
  char var[64];
  snprintf(var, sizeof(var), "%s_LOG_LEVEL", prefix);
  svc_log_init(name, var);
  snprintf(var, sizeof(var), "%s_LISTEN", prefix);
  m->name = name;
  m->listen = svc_env_str(var, "127.0.0.1:0");
  m->url_file = NULL;
  return svc_parse_args(argc, argv, &m->listen, &m->url_file, usage);
}

int svc_main_serve(const svc_main_t *m, const svc_http_t *http, json_t *fields) {
  char url[128];
  snprintf(url, sizeof(url), "http://127.0.0.1:%d", svc_http_port(http));
  json_t *line = json_pack("{s:s}", "url", url);
  if (line && fields) json_object_update(line, fields);
  json_decref(fields);
  if (SVC_LOG_INFO <= svc_log_level)
    svc_log_write(SVC_LOG_INFO, line, "%s ready", m->name); /* takes 'line' */
  else
    json_decref(line);
  if (m->url_file && !svc_write_url_file(m->url_file, url)) {
    svc_error("could not write the URL to \"%s\"", m->url_file);
    return 73;
  }
  int sig = svc_wait_signal();
  svc_info("%s stopping (signal %d)", m->name, sig);
  return 0;
}

/* ------------------------------------------------------------- client */

/*
 * Each pooled "line" is a libcurl multi handle with one easy handle that
 * stays attached to it between calls, so that the multi's connection
 * cache keeps the line's connection to the peer alive: a steady stream of
 * calls costs no handshakes.  A call takes a line, adds the easy handle,
 * pushes the request out (svc_httpc_start), and later drives the transfer
 * to its end (svc_httpc_finish); the caller may do other work in between.
 */
#define HTTPC_MAX_IDLE 256

typedef struct line {
  CURLM *multi;
  CURL *easy;
} line_t;

struct svc_httpc {
  pthread_mutex_t mu;
  char *base;
  const svc_auth_t *auth; /* NULL: calls unsigned */
  int nidle;
  line_t idle[HTTPC_MAX_IDLE];
};

struct svc_httpc_call {
  svc_httpc_t *c;
  line_t line;
  struct curl_slist *hdrs;
  char *payload;
  txc_buf_t buf; /* the answer: at most 1 MiB, plenty for these answers */
  char url[1024];
  bool done;
  CURLcode result;
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

static void line_free(line_t *l) {
  if (l->easy) curl_easy_cleanup(l->easy);
  if (l->multi) curl_multi_cleanup(l->multi);
  l->easy = NULL;
  l->multi = NULL;
}

void svc_httpc_free(svc_httpc_t *c) {
  if (!c) return;
  for (int i = 0; i < c->nidle; i++) line_free(&c->idle[i]);
  pthread_mutex_destroy(&c->mu);
  free(c->base);
  free(c);
}

/* Run the transfer without waiting; notes when it is over. */
static void call_step(svc_httpc_call_t *k) {
  int running = 0;
  curl_multi_perform(k->line.multi, &running);
  CURLMsg *m;
  int left;
  while ((m = curl_multi_info_read(k->line.multi, &left))) {
    if (m->msg == CURLMSG_DONE) {
      k->done = true;
      k->result = m->data.result;
    }
  }
}

svc_httpc_call_t *svc_httpc_start(svc_httpc_t *c, const char *path, const char *xid, const json_t *body,
                                  unsigned timeout_ms, char *err, size_t errlen) {
  return svc_httpc_start_hdr(c, path, xid, NULL, body, timeout_ms, err, errlen);
}

void svc_httpc_set_auth(svc_httpc_t *c, const svc_auth_t *auth) { c->auth = auth; }

void svc_http_sign(const svc_auth_t *a, const char *method, const char *path, const char *xid, const char *extra,
                   const char *body, size_t body_len, char out[SVC_AUTH_HEX_MAX]) {
  const char *parts[5] = {method, path, xid ? xid : "", extra ? extra : "", body};
  size_t lens[5] = {strlen(method), strlen(path), strlen(parts[2]), strlen(parts[3]), body_len};
  svc_auth_sign(a, parts, lens, 5, out);
}

bool svc_http_verify(const svc_auth_t *a, const svc_req_t *req) {
  const char *xid = svc_req_header(req, SVC_XID_HEADER);
  const char *local = svc_req_header(req, "X-Txc-Local");
  char extra[64] = "";
  if (local) snprintf(extra, sizeof(extra), "X-Txc-Local: %.40s", local);
  const char *parts[5] = {req->method, req->path, xid ? xid : "", extra, req->body};
  size_t lens[5] = {strlen(req->method), strlen(req->path), strlen(parts[2]), strlen(extra), req->body_len};
  return svc_auth_verify(a, parts, lens, 5, svc_req_header(req, SVC_AUTH_HEADER));
}

svc_httpc_call_t *svc_httpc_start_hdr(svc_httpc_t *c, const char *path, const char *xid, const char *header,
                                      const json_t *body, unsigned timeout_ms, char *err, size_t errlen) {
  svc_httpc_call_t *k = calloc(1, sizeof(*k));
  if (!k) {
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  k->c = c;
  k->buf.max = 1u << 20;
  pthread_mutex_lock(&c->mu);
  if (c->nidle > 0) k->line = c->idle[--c->nidle];
  pthread_mutex_unlock(&c->mu);
  if (!k->line.multi) {
    k->line.multi = curl_multi_init();
    k->line.easy = curl_easy_init();
  }
  k->payload = body ? json_dumps(body, JSON_COMPACT) : strdup(""); /* no body: a GET */
  if (!k->line.multi || !k->line.easy || !k->payload) {
    line_free(&k->line);
    free(k->payload);
    free(k);
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  snprintf(k->url, sizeof(k->url), "%s%s", c->base, path);
  k->hdrs = curl_slist_append(NULL, body ? "Content-Type: application/json" : "Accept: application/json");
  k->hdrs = curl_slist_append(k->hdrs, "Expect:");
  if (xid) {
    char hx[RM_XID_MAX + 32];
    snprintf(hx, sizeof(hx), "%s: %s", SVC_XID_HEADER, xid);
    k->hdrs = curl_slist_append(k->hdrs, hx);
  }
  if (header) k->hdrs = curl_slist_append(k->hdrs, header);
  if (c->auth) {
    char sig[SVC_AUTH_HEX_MAX], hs[SVC_AUTH_HEX_MAX + 32];
    svc_http_sign(c->auth, body ? "POST" : "GET", path, xid, header, k->payload, strlen(k->payload), sig);
    snprintf(hs, sizeof(hs), "%s: %s", SVC_AUTH_HEADER, sig);
    k->hdrs = curl_slist_append(k->hdrs, hs);
  }
  CURL *e = k->line.easy;
  curl_easy_reset(e); /* keeps the live connection (in the multi), clears options */
  curl_easy_setopt(e, CURLOPT_URL, k->url);
  if (body)
    curl_easy_setopt(e, CURLOPT_POSTFIELDS, k->payload);
  else
    curl_easy_setopt(e, CURLOPT_HTTPGET, 1L);
  curl_easy_setopt(e, CURLOPT_HTTPHEADER, k->hdrs);
  curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, txc_buf_curl_write);
  curl_easy_setopt(e, CURLOPT_WRITEDATA, &k->buf);
  curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, (long)timeout_ms);
  curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, (long)(timeout_ms < 2000 ? timeout_ms : 2000));
  curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(e, CURLOPT_TCP_NODELAY, 1L);
  curl_multi_add_handle(k->line.multi, e);
  call_step(k); /* on a live connection this sends the request */
  return k;
}

int svc_httpc_finish(svc_httpc_call_t *k, long *status, json_t **answer, char *err, size_t errlen) {
  *answer = NULL;
  *status = 0;
  while (!k->done) {
    curl_multi_poll(k->line.multi, NULL, 0, 1000, NULL);
    call_step(k);
  }
  int rc = 0;
  if (k->result != CURLE_OK) {
    snprintf(err, errlen, "could not call %s: %s", k->url, curl_easy_strerror(k->result));
    rc = -1;
  } else {
    curl_easy_getinfo(k->line.easy, CURLINFO_RESPONSE_CODE, status);
    if (k->buf.p) *answer = json_loadb(k->buf.p, k->buf.len, 0, NULL);
  }
  curl_multi_remove_handle(k->line.multi, k->line.easy);
  curl_slist_free_all(k->hdrs);
  free(k->payload);
  free(k->buf.p);
  svc_httpc_t *c = k->c;
  bool kept = false;
  if (rc == 0) {
    pthread_mutex_lock(&c->mu);
    if (c->nidle < HTTPC_MAX_IDLE) {
      c->idle[c->nidle++] = k->line;
      kept = true;
    }
    pthread_mutex_unlock(&c->mu);
  }
  if (!kept) line_free(&k->line); /* after a failure: drop the connection too */
  free(k);
  return rc;
}

int svc_httpc_get(svc_httpc_t *c, const char *path, unsigned timeout_ms, long *status, json_t **answer, char *err,
                  size_t errlen) {
  return svc_httpc_post(c, path, NULL, NULL, timeout_ms, status, answer, err, errlen); /* no body: GET */
}

int svc_httpc_post(svc_httpc_t *c, const char *path, const char *xid, const json_t *body, unsigned timeout_ms,
                   long *status, json_t **answer, char *err, size_t errlen) {
  *answer = NULL;
  *status = 0;
  svc_httpc_call_t *k = svc_httpc_start(c, path, xid, body, timeout_ms, err, errlen);
  if (!k) return -1;
  return svc_httpc_finish(k, status, answer, err, errlen);
}

/* ------------------------------------------------------------ GET text */

char *svc_http_get_text(const char *url, unsigned timeout_ms, char *err, size_t errlen) {
  CURL *e = curl_easy_init();
  if (!e) {
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  txc_buf_t b = {.max = 4u << 20};
  curl_easy_setopt(e, CURLOPT_URL, url);
  curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, txc_buf_curl_write);
  curl_easy_setopt(e, CURLOPT_WRITEDATA, &b);
  curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, (long)timeout_ms);
  curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
  long status = 0;
  CURLcode cc = curl_easy_perform(e);
  if (cc == CURLE_OK) curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &status);
  curl_easy_cleanup(e);
  if (cc != CURLE_OK || status != 200 || !b.p) {
    if (cc != CURLE_OK) snprintf(err, errlen, "%s", curl_easy_strerror(cc));
    else snprintf(err, errlen, "answered %ld, not 200", status);
    free(b.p);
    return NULL;
  }
  return b.p;
}
