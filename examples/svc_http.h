/*
 * svc_http.h - the HTTP side of the example services: a JSON request /
 * response server on libmicrohttpd, and a keep-alive JSON client on
 * libcurl for the one internal call (order-service -> stock-service).
 *
 * NOTES
 *   Server: libmicrohttpd's thread pool (epoll) does the socket I/O; each
 *   complete request is handed to a pool of worker threads that run the
 *   blocking handlers, first come first served, so the worker count is the
 *   number of requests served at once: size it for I/O waits, not for
 *   CPUs.  Bodies are collected up to SVC_HTTP_MAX_BODY bytes (413
 *   beyond), then the handler is called once with the whole body.  Every
 *   answer is JSON.
 *
 *   Client: a pool of libcurl handles, each keeping its connection to the
 *   peer alive, so a steady stream of calls costs no TCP handshakes; a
 *   call can be started and finished later, so that the caller works
 *   meanwhile.  Safe from any number of threads.
 */
#ifndef SVC_HTTP_H
#define SVC_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include <jansson.h>

#include "svc_auth.h"

#define SVC_HTTP_MAX_BODY 16384

/* The transaction id travels between services in this header. */
#define SVC_XID_HEADER "X-Txc-Xid"

/* ------------------------------------------------------------- server */

typedef struct svc_http svc_http_t;

typedef struct svc_req {
  const char *method; /* "GET", "POST", ... */
  const char *path;   /* without the query string */
  const char *body;   /* NUL-terminated; "" when none */
  size_t body_len;
  void *conn_; /* private */
} svc_req_t;

#define SVC_RESP_MAX_HEADERS 6
#define SVC_RESP_HBUF 96

typedef struct svc_resp {
  int status;
  json_t *body; /* taken by the server after the handler returns */
  bool text;    /* svc_resp_text: 'body' is a JSON string sent as text/plain */
  /* Extra response headers (svc_resp_header), {name, value} each. */
  const char *headers[SVC_RESP_MAX_HEADERS][2];
  int nheaders;
  /* Storage of the values svc_resp_header_copy copied. */
  char hbuf[SVC_RESP_HBUF];
  size_t hlen;
} svc_resp_t;

/* Called once per request on a pool thread; fills 'resp' (status 0 or a
 * NULL body means 500). */
typedef void (*svc_handler_fn)(const svc_req_t *req, svc_resp_t *resp, void *arg);

/* Value of request header 'name' (case-insensitive), NULL if absent. */
const char *svc_req_header(const svc_req_t *req, const char *name);

/* Set 'resp' to the problem object (svc_problem_new) of 'status', error
 * word 'reason' and 'detail' (NULL: the problem's title).  Returns
 * nothing: the handler returns after it. */
void svc_resp_error(svc_resp_t *resp, int status, const char *reason, const char *detail);
void svc_resp_json(svc_resp_t *resp, int status, json_t *body);
/* Answer 'text' (copied) as text/plain (Prometheus exposition format). */
void svc_resp_text(svc_resp_t *resp, int status, const char *text);
/* Answer GET /metrics: the service's own families in 'b', then this
 * process's HTTP (svc_http_metrics) and process_* (svc_process_metrics)
 * ones; 500 when the page ran out of memory.  Frees b->p. */
struct txc_buf;
void svc_resp_metrics(svc_resp_t *resp, struct txc_buf *b);
/* Send header 'name: value' with the answer, whatever its status and body
 * (they may be set before or after).  Both strings are kept, not copied:
 * string literals.  A name already set gets the new value; beyond
 * SVC_RESP_MAX_HEADERS names the header is dropped. */
void svc_resp_header(svc_resp_t *resp, const char *name, const char *value);
/* The same with 'value' copied into the answer (at most SVC_RESP_HBUF
 * bytes for all copied values: beyond, the header is dropped); 'name' is
 * still kept. */
void svc_resp_header_copy(svc_resp_t *resp, const char *name, const char *value);
/* 405 method_not_allowed with "Allow: 'allow'" (copied). */
void svc_resp_not_allowed(svc_resp_t *resp, const char *allow);
/* The value of header 'name' set on 'resp' (case-insensitive), NULL if
 * none. */
const char *svc_resp_get_header(const svc_resp_t *resp, const char *name);
/*
 * The answer as it is sent, whatever the handler made of it (called by
 * the server before it sends; pure): no status or no body is a 500; an
 * error status (400 or more) has a problem body (svc_problem_complete:
 * one built by hand, or stored before, gets the members it lacks); a 503
 * says Retry-After (1 s, unless the handler said otherwise).
 */
void svc_resp_finish(svc_resp_t *resp);

/* One route of a service: 'path' a template whose "{id}" segments stand
 * for a positive decimal id ("/orders/{id}/pay"), 'method' one method;
 * 'op' the service's handler number. */
typedef struct svc_route {
  const char *method, *path;
  int op;
} svc_route_t;

#define SVC_ROUTE_NOT_FOUND -1
#define SVC_ROUTE_NOT_ALLOWED -2

/*
 * The route of 'method' and 'path' in 'routes[0..n-1]': its index, with
 * the id of its first "{id}" segment in '*id' (0 when it has none); or
 * SVC_ROUTE_NOT_FOUND when no route has the path (an id of 0, of leading
 * zeros or beyond 2^63 - 1 is no id); or SVC_ROUTE_NOT_ALLOWED when
 * routes have the path but not the method, with their methods in 'allow'
 * ("GET, POST", in the table's order).  Pure.
 */
int svc_route_find(const svc_route_t *routes, size_t n, const char *method, const char *path, long long *id,
                   char *allow, size_t allowlen);

/*
 * Answer 'req' from 'routes': its route's op in '*op' and true; or false
 * with the answer in 'resp' (404 not_found, or 405 with Allow).
 */
bool svc_route_or_reply(const svc_route_t *routes, size_t n, const svc_req_t *req, svc_resp_t *resp, int *op,
                        long long *id);

/* The services' --routes option: when it is the only argument, print the
 * routes as "METHOD PATH" lines (the OpenAPI check compares them with its
 * paths) and return true (the caller exits 0). */
bool svc_routes_option(int argc, char **argv, const svc_route_t *routes, size_t n);

/* The route of a request path for a metric label: every segment of digits
 * becomes {id} ("/orders/42/pay" -> "/orders/{id}/pay"); a path longer
 * than 'cap' - 1 is "other".  Pure. */
void svc_http_route(const char *path, char *out, size_t cap);

/* The HTTP families of this process's servers into 'b':
 * txc_client_http_responses_total, the answers by status (counted as they
 * are queued), and txc_http_request_duration_seconds, a histogram by
 * method, route and status of every request answered (from its arrival to
 * its answer), at most SVC_HTTP_SERIES series (later ones count as route
 * "other"). */
#define SVC_HTTP_SERIES 128
struct txc_buf;
void svc_http_metrics(struct txc_buf *b);

/* Listen on 'listen' ("host:port"; port 0 = any free port) with
 * 'io_threads' socket threads and 'workers' handler threads.  Returns NULL
 * with a message in 'err' on failure. */
svc_http_t *svc_http_start(const char *listen, unsigned io_threads, unsigned workers, svc_handler_fn fn,
                           void *arg, char *err, size_t errlen);
/* The port actually bound. */
int svc_http_port(const svc_http_t *h);
/* Stop accepting, answer 503 to new requests on open connections, wait
 * for the requests queued or in progress, free.  NULL: no-op. */
void svc_http_stop(svc_http_t *h);

/* ------------------------------------------------- a service's main() */

/* What the opening of a service's main() found. */
typedef struct svc_main {
  const char *name;     /* "order-service": the log's name, its messages */
  const char *listen;   /* --listen, else <PREFIX>_LISTEN, else 127.0.0.1:0 */
  const char *url_file; /* --url-file, or NULL */
} svc_main_t;

/* The opening of the main() of service 'name': with --routes alone,
 * print 'routes' (svc_routes_option) and return 0; else log as 'name' at
 * the level of <PREFIX>_LOG_LEVEL ('prefix': "ORDER") and read the command
 * line (svc_parse_args with 'usage') into 'm'.  -1 to go on, or the exit
 * status to return at once. */
int svc_main_start(svc_main_t *m, const char *name, const char *prefix, int argc, char **argv,
                   const svc_route_t *routes, size_t nroutes, void (*usage)(FILE *f));
/* The service is up on 'http': log "<name> ready" with its URL and
 * 'fields' (a JSON object, taken; may be NULL), write the URL to the
 * --url-file, and wait for SIGTERM or SIGINT (svc_wait_signal).  0 once
 * the signal came; 73 at once when the URL file could not be written. */
int svc_main_serve(const svc_main_t *m, const svc_http_t *http, json_t *fields);

/* ------------------------------------------------------------- client */

typedef struct svc_httpc svc_httpc_t;

/* A client for 'base_url' ("http://host:port", copied). */
svc_httpc_t *svc_httpc_new(const char *base_url);
void svc_httpc_free(svc_httpc_t *c);

/*
 * POST 'body' (JSON, borrowed) to base_url + 'path', with the xid header
 * when 'xid' is not NULL, within 'timeout_ms'.  Returns 0 with the HTTP
 * status in '*status' and the parsed answer in '*answer' (new reference,
 * NULL if the body was not JSON), or -1 when no answer came (connection
 * refused, timeout, ...) with the reason in 'err'.  A timeout means the
 * peer may or may not have acted.
 */
int svc_httpc_post(svc_httpc_t *c, const char *path, const char *xid, const json_t *body, unsigned timeout_ms,
                   long *status, json_t **answer, char *err, size_t errlen);

/* GET base_url + 'path' within 'timeout_ms': svc_httpc_post's results. */
int svc_httpc_get(svc_httpc_t *c, const char *path, unsigned timeout_ms, long *status, json_t **answer, char *err,
                  size_t errlen);

/* The same in two steps: start the call (the request is sent at once on a
 * live connection), do something else, then wait for its answer.  Every
 * started call must be finished (which frees it), from the same thread.
 * svc_httpc_start returns NULL (no call: 'err' says why) only when out of
 * memory; connection errors come from svc_httpc_finish. */
typedef struct svc_httpc_call svc_httpc_call_t;
/* ('body' NULL: a GET.) */
svc_httpc_call_t *svc_httpc_start(svc_httpc_t *c, const char *path, const char *xid, const json_t *body,
                                  unsigned timeout_ms, char *err, size_t errlen);
/* svc_httpc_start with one more request header 'header' ("Name: value",
 * may be NULL). */
svc_httpc_call_t *svc_httpc_start_hdr(svc_httpc_t *c, const char *path, const char *xid, const char *header,
                                      const json_t *body, unsigned timeout_ms, char *err, size_t errlen);
int svc_httpc_finish(svc_httpc_call_t *call, long *status, json_t **answer, char *err, size_t errlen);

/* Sign every call of 'c' with 'auth' (svc_auth.h; borrowed, may be NULL:
 * unsigned), in the SVC_AUTH_HEADER header. */
void svc_httpc_set_auth(svc_httpc_t *c, const svc_auth_t *auth);
/* The signature of a call: method, path, its X-Txc-Xid value (NULL: none),
 * its extra header line ("X-Txc-Local: 1", NULL: none) and its body. */
void svc_http_sign(const svc_auth_t *a, const char *method, const char *path, const char *xid, const char *extra,
                   const char *body, size_t body_len, char out[SVC_AUTH_HEX_MAX]);
/* Whether 'req' carries a valid signature under 'a' (the same parts, read
 * from the request). */
bool svc_http_verify(const svc_auth_t *a, const svc_req_t *req);

/* GET 'url' (one short connection, within 'timeout_ms', at most 4 MiB):
 * the body of a 200 answer, malloc'd and NUL-terminated, or NULL with the
 * reason in 'err' (for scraping a /metrics page). */
char *svc_http_get_text(const char *url, unsigned timeout_ms, char *err, size_t errlen);

/* Call once at process start, before any thread (libcurl's global init). */
bool svc_http_global_init(void);
void svc_http_global_cleanup(void);

#endif /* SVC_HTTP_H */
