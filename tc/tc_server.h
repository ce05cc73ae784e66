/*
 * tc_server.h - tcd's network side: the TCP listener, client connections,
 * registration, heartbeats, request dispatch, and calls from the TC to RMs.
 *
 * NOTES
 *   Runs on the node's single libuv loop.  Each connection owns a txp
 *   decoder and a bounded write queue.  The first request on a connection
 *   must be RegisterTM or RegisterRM with the application's secret (or the
 *   legacy shared token: authenticate() in tc_server.c); anything
 *   else first is answered NOT_REGISTERED and the connection is closed.  A
 *   peer whose protocol major version differs gets an Error frame with
 *   BAD_VERSION and is closed; a peer that sends garbage (bad magic,
 *   oversized frame) is closed; a well-framed but invalid body is answered
 *   with the specific error and the connection stays.
 *
 *   Requests other than registration and heartbeat go to the 'on_request'
 *   handler, which owns the tc_req_t and must finish it with tc_req_reply()
 *   (or tc_req_drop()) exactly once, possibly much later.  If the connection
 *   dies meanwhile the reply is discarded.  In-flight requests per connection
 *   are bounded (server.max_inflight): past it the server answers BUSY itself.
 *
 *   A connection idle for 3 heartbeat intervals is closed.  Calls to RMs
 *   (BranchCommit/BranchRollback) wait for the matching *_RESULT with a
 *   timeout; a lost connection or timeout completes them with
 *   TXP_ECONN_LOST / TXP_EUNKNOWN_OUTCOME.
 *
 *   Connections are reference counted: a tc_conn_t stays valid (but
 *   'closed') while requests or calls hold a reference.
 */
#ifndef TC_SERVER_H
#define TC_SERVER_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "txp_msg.h"

typedef struct tc_server tc_server_t;
typedef struct tc_conn tc_conn_t;
typedef struct tc_creds tc_creds_t;

/* One request being served.  'msg' is owned by the request. */
typedef struct tc_req {
  tc_conn_t *conn; /* referenced until reply/drop */
  txp_msg_t msg;
  uint64_t received_ns; /* uv_hrtime at decode */
  bool retried;         /* the coordinator already ran it a second time (tc_hold.h) */
} tc_req_t;

typedef void (*tc_request_cb)(tc_req_t *req, void *arg);
/* Completion of a TC->RM call: 'status' 0 and 'res' the result frame
 * (borrowed, valid during the callback), or status < 0 and res NULL. */
typedef void (*tc_call_cb)(int status, const txp_msg_t *res, void *arg);

typedef struct tc_server_opts {
  const char *listen_host;
  int listen_port; /* 0: ephemeral (see tc_server_port) */
  const char *token;        /* legacy shared secret; NULL or "": none */
  const tc_creds_t *creds;  /* per-application secrets (borrowed); NULL: none.
                               At least one of the two. */
  int node_id;
  int max_connections;
  int max_connections_per_address; /* live connections one peer address may hold; 0: max_connections */
  int max_inflight;
  int heartbeat_ms;
  uint32_t max_frame;
  tc_request_cb on_request;
  void *request_arg;
  /* optional: an RM registered / went away (resource ids changed) */
  void (*on_rm_change)(tc_conn_t *conn, bool up, void *arg);
  void *rm_change_arg;
} tc_server_opts_t;

/* Bind and listen.  Returns 0 or a negative libuv/txp code; on error
 * *out is NULL and 'err' says what failed. */
int tc_server_start(uv_loop_t *loop, const tc_server_opts_t *opts, tc_server_t **out, char *err,
                    size_t errlen);
/* Stop listening and close every connection; pending calls complete with
 * TXP_ESHUTDOWN, pending requests' replies are discarded.  'done' runs after
 * every handle is closed; the server is freed after it returns. */
void tc_server_stop(tc_server_t *s, void (*done)(void *arg), void *arg);

int tc_server_port(const tc_server_t *s);
int tc_server_conn_count(const tc_server_t *s);

/* ---- requests ---- */

/* Send 'res' as the answer of 'req' (res->request_id etc. are set from req:
 * build it with txp_msg_init_result(res, &req->msg, ...)).  Frees the
 * request.  'res' is borrowed. */
void tc_req_reply(tc_req_t *req, const txp_msg_t *res);
/* Shortcut: reply with just a code and message. */
void tc_req_reply_code(tc_req_t *req, int code, const char *message);
/* Free without answering (the peer will time out). */
void tc_req_drop(tc_req_t *req);

/* ---- connections ---- */

bool tc_conn_is_rm(const tc_conn_t *c);
bool tc_conn_closed(const tc_conn_t *c);
const char *tc_conn_peer(const tc_conn_t *c);      /* "ip:port" */
const char *tc_conn_client_id(const tc_conn_t *c); /* from registration */
const char *tc_conn_app_id(const tc_conn_t *c);
/* The group its application authenticated into (tc_creds.h). */
const char *tc_conn_group(const tc_conn_t *c);
void tc_conn_ref(tc_conn_t *c);
void tc_conn_unref(tc_conn_t *c);

/*
 * Find a live RM connection serving 'resource_id', preferring the one
 * whose client id is 'client_id' (may be NULL).  Borrowed; NULL if none.
 */
tc_conn_t *tc_server_find_rm(tc_server_t *s, const char *resource_id, const char *client_id);
/* The same among the RMs of 'group' only (when not NULL or ""), and
 * preferring the RMs of application 'app_id': phase two of a branch goes
 * to an RM of the group that registered it, never to an application of
 * another group that claims its resource. */
tc_conn_t *tc_server_find_branch_rm(tc_server_t *s, const char *resource_id, const char *client_id,
                                    const char *app_id, const char *group);

/* Credentials for later registrations (a reload); 'creds' is borrowed and
 * must stay valid until replaced or the server is stopped.  Registered
 * connections keep their identity. */
void tc_server_set_creds(tc_server_t *s, const tc_creds_t *creds);

/* Send request 'msg' (type, fields; request_id is assigned here) to 'c' and
 * call 'cb' once with the result or an error.  Returns 0, or a negative code
 * (closed connection, write queue full) in which case 'cb' is not called. */
int tc_conn_call(tc_conn_t *c, txp_msg_t *msg, unsigned timeout_ms, tc_call_cb cb, void *arg);

/* Send request 'msg' to 'c' marked TXP_FLAG_ONEWAY: no answer comes, and
 * nothing waits for one.  Returns 0 once queued, or a negative code. */
int tc_conn_send_oneway(tc_conn_t *c, txp_msg_t *msg);

/* Counters for stats/metrics. */
typedef struct tc_server_stats {
  uint64_t accepted, refused, closed, frames_in, frames_out, bad_frames, busy_replies;
  uint64_t auth_failures, version_mismatches;
  uint64_t unregistered_closed; /* strangers closed: a frame before registering, or no registration in time */
  uint64_t refused_per_address; /* of 'refused': the peer address held its share already */
  int connections, rms, tms;
} tc_server_stats_t;
void tc_server_get_stats(const tc_server_t *s, tc_server_stats_t *out);

#endif /* TC_SERVER_H */
