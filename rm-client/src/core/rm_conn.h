/*
 * rm_conn.h - librmclient's connection to one coordinator node, plus the
 * small pure helpers the core routes with (address and xid parsing, backoff)
 * and the log sink.  Internal: not installed.
 *
 * NOTES
 *   An rm_conn_t is one configured node ("host:port").  It lives as long as
 *   the client and goes through TCP sessions, one at a time:
 *
 *     IDLE --timer--> RESOLVING (names only) --> CONNECTING --> REGISTERING
 *       ^                                                          |
 *       |                                          RegisterTM/RM answered 0
 *       |                                                          v
 *       +--- backoff (100 ms .. 5 s, jitter) <--- CLOSING <------ READY
 *
 *   Connecting and registering together must finish within the connect
 *   timeout.  A READY session sends a Heartbeat every heartbeat interval; a
 *   session that has received no frame at all for two intervals is
 *   considered dead and closed.  Any failure (refused, timed out, EOF,
 *   garbage, registration refused) closes the TCP handle; the session ends
 *   in the handle's close callback, which is where the owner hears of it
 *   (on_down).  By then every write of the session has completed or been
 *   cancelled, so the owner can tell exactly which of its frames were
 *   handed to the kernel (rm__conn_sent) and which were discarded unsent.
 *
 *   The connection knows nothing about calls: it sends frames the owner
 *   gives it, answers heartbeats and registration itself, and hands every
 *   other frame (responses, and requests from the TC such as BranchCommit)
 *   to the owner.  Request ids come from a counter the owner shares with
 *   all its connections, so ids are unique per client.
 *
 *   Writes: frames are encoded into a bounded queue (CONN_OUT_CAP) and
 *   handed to the kernel at once with uv_try_write when the socket takes
 *   them (txc_uvwrite.h); otherwise at most one uv_write is in flight, and
 *   whatever piles up meanwhile goes out in the next one.  A peer that lets
 *   the queue fill up is not reading: the session is closed.
 *
 *   Thread: everything here runs on the client's loop thread, except the
 *   pure helpers and the logger, which any thread may use.
 */
#ifndef RM_CONN_H
#define RM_CONN_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "rm_client.h"
#include "rm_log.h"
#include "txp_msg.h"

/* -------------------------------------------------------- pure helpers */

/* "host:port" of a node as configured: host up to 255 bytes, brackets for
 * IPv6, a port: at most this many bytes with the NUL. */
#define RM_ADDR_MAX 264

typedef struct rm_addr {
  char addr[RM_ADDR_MAX];
} rm_addr_t;

/*
 * Split "host:port" or "[v6addr]:port" into 'host' (brackets removed, cap
 * 'hostcap') and '*port' (1..65535).  Returns 0, or -1 if malformed.
 */
int rm__addr_parse(const char *addr, char *host, size_t hostcap, int *port);

/*
 * Parse the node list "a:1, b:2,[::1]:3" into 'out' (at most 'max' entries,
 * each trimmed and checked with rm__addr_parse).  Returns the number of
 * nodes (>= 1), or -1 if the list is empty or an entry is malformed, or -2
 * if there are more than 'max'.
 */
int rm__nodes_parse(const char *list, rm_addr_t *out, int max);

/*
 * The address of the node that created 'xid': an xid is "host:port:txid"
 * (tc_coord.c), so it is everything before the last ':', which must itself
 * be a valid "host:port", and the txid must be decimal digits.  Writes it
 * to 'out' (cap 'cap').  Returns 0, or -1 if 'xid' is not of that form.
 */
int rm__xid_node(const char *xid, char *out, size_t cap);

/*
 * Reconnect and retry delays: after the 'failures'-th consecutive failure
 * (>= 1) the base delay is min_ms * 2^(failures-1), capped at max_ms; the
 * result is drawn from [base/2, base] with 'rnd' ("equal jitter"), so that
 * clients that lost the same node do not come back in lock step.
 * failures == 0 gives 0.
 */
unsigned rm__backoff_ms(unsigned failures, unsigned min_ms, unsigned max_ms, uint32_t rnd);

/* xorshift32: a cheap generator for jitter ('*state' must not be 0). */
uint32_t rm__rand32(uint32_t *state);

/* ---------------------------------------------------------- connection */

typedef struct rm_conn rm_conn_t;

typedef struct rm_conn_cbs {
  /* The session is registered: requests may be sent now. */
  void (*on_ready)(rm_conn_t *c, void *arg);
  /*
   * A session ended.  Runs from the TCP handle's close callback, after the
   * state left READY, so the owner may reroute at once.  'was_ready': it
   * had been registered; 'reason' is TXP_EAUTH when the node refused our
   * token, else TXP_ECONN_LOST.  Not called once rm__conn_close() ran.
   */
  void (*on_down)(rm_conn_t *c, bool was_ready, int reason, void *arg);
  /*
   * A frame for the owner: the answer to one of its requests (a *_RESULT or
   * an Error frame), or a request from the coordinator (BranchCommit,
   * BranchRollback, UndoLogDelete, ...).  'm' is borrowed for the call.
   */
  void (*on_frame)(rm_conn_t *c, txp_msg_t *m, void *arg);
  /* An answer to request 'request_id' arrived but its body is invalid
   * ('rc'): what the coordinator did is unknown. */
  void (*on_bad_response)(rm_conn_t *c, uint64_t request_id, int rc, void *arg);
  /* Resource ids to register with (comma-separated) into 'out' (cap
   * 'cap'); "" registers as a TM only.  Returns >= 0, or a negative code
   * (then it registers as a TM only). */
  int (*resource_ids)(char *out, size_t cap, void *arg);
} rm_conn_cbs_t;

typedef struct rm_conn_opts {
  uv_loop_t *loop;
  const char *addr;      /* "host:port", copied */
  int index;             /* the owner's number for this node */
  /* Borrowed, must outlive the connection: */
  const char *token;
  const char *app_id;
  const char *client_id;
  uint64_t *next_request_id; /* shared by all connections of a client */
  rm_logger_t *log;
  const rm_conn_cbs_t *cbs;
  void *arg;             /* passed to every callback */
  unsigned connect_timeout_ms;
  unsigned heartbeat_ms;
} rm_conn_opts_t;

/* Allocate a connection (no handle yet, any thread).  Returns 0,
 * RM_E_INVALID (bad address) or RM_E_NOMEM. */
int rm__conn_new(const rm_conn_opts_t *o, rm_conn_t **out);
/* Initialize the handles and make the first attempt (loop thread). */
void rm__conn_start(rm_conn_t *c);
/*
 * Stop for good: close the session and the handles.  'done' runs once
 * everything is closed (from a close callback, or at once if the
 * connection was never started); rm__conn_free() may then be called.
 */
void rm__conn_close(rm_conn_t *c, void (*done)(rm_conn_t *c, void *arg), void *arg);
void rm__conn_free(rm_conn_t *c);

/*
 * Encode 'm' (its request_id set by the caller) onto the session's write
 * queue.  On 0, '*wire_end' (may be NULL) receives the position of the
 * frame's last byte in the connection's output stream, for
 * rm__conn_sent().  Returns 0; TXP_ECONN_LOST if the session is not READY
 * or was just closed because its queue is full; or an encoder error
 * (TXP_EFIELD_*: nothing queued, session unchanged).
 */
int rm__conn_send(rm_conn_t *c, const txp_msg_t *m, uint64_t *wire_end);
/* Whether the frame ending at 'wire_end' was handed to the kernel (it may
 * have reached the coordinator).  Meaningful until the next session starts,
 * i.e. in on_down. */
bool rm__conn_sent(const rm_conn_t *c, uint64_t wire_end);

bool rm__conn_ready(const rm_conn_t *c);
/* The last registration attempt was refused with TXP_EAUTH. */
bool rm__conn_auth_failed(const rm_conn_t *c);
/* Number of the current TCP session (changes on every connect). */
uint64_t rm__conn_session(const rm_conn_t *c);
int rm__conn_index(const rm_conn_t *c);
const char *rm__conn_addr(const rm_conn_t *c);
/* Whether 'node_addr' (from rm__xid_node) names this node: its configured
 * address, or the address it advertises in the xids it creates. */
bool rm__conn_is_node(const rm_conn_t *c, const char *node_addr);
/* Remember the advertised address in 'xid', created by this node. */
void rm__conn_learn_xid(rm_conn_t *c, const char *xid);
/* The resource list changed: register again (RegisterRM) on this session
 * as soon as no registration is in flight; later sessions ask anyway. */
void rm__conn_reregister(rm_conn_t *c);

#endif /* RM_CONN_H */
