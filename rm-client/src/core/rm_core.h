/*
 * rm_core.h - internals shared by the files of librmclient's core (core/):
 * the client and its loop thread (rm_client.c), calls on the loop thread
 * (rm_call.c), the TM API and the AT layer's calls (rm_tm.c), requests
 * from a coordinator (rm_serve.c) and degrade detection (rm_degrade.c).
 * The connections are rm_conn.h's; what sits above the core (at/,
 * fallback/) sees only rm_internal.h.  Not installed.
 *
 * NOTES
 *   Which thread touches what is marked on the fields of rm_client_t (see
 *   rm_client.c's NOTES); the functions below say where they run.
 */
#ifndef RM_CORE_H
#define RM_CORE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "rm_conn.h"
#include "rm_internal.h"
#include "rm_util.h"
#include "txc_heap.h"
#include "txc_idtable.h"

/* ------------------------------------------------------------- types */

typedef enum {
  RM_CALL_NEW = 0, /* submitted, or between two dispatches */
  RM_CALL_WAITING, /* no node registered: in waitq */
  RM_CALL_SENT,    /* in the id table and its node's sent list */
  RM_CALL_BACKOFF, /* refused with a retryable code: waits in the heap */
  RM_CALL_DONE,
} rm_call_state_t;

typedef struct rm_call rm_call_t;

typedef struct rm_call_list {
  rm_call_t *head, *tail;
} rm_call_list_t;

struct rm_call {
  /* The request: set by the caller thread, read-only once submitted. */
  uint16_t type; /* TXP_MSG_* */
  bool idempotent;
  char xid[TXP_MAX_XID_LEN + 1];
  char idem[2 * RM_IDEM_BYTES + 1];
  char *name;        /* owned; NULL if absent */
  char *resource_id;
  char *lock_keys;
  char *app_data;
  char *message;
  uint32_t timeout_ms;
  uint32_t lock_wait_ms;
  int64_t branch_id;
  int branch_status;
  int branch_type; /* BranchRegister: TXP_BT_* */
  uint64_t deadline_ms;
  rm_tm_cb cb; /* async form; NULL for a blocking call */
  void *cb_arg;

  /* Loop thread. */
  rm_call_state_t state;
  txc_heap_node_t hnode; /* key: the deadline, or the end of a backoff */
  rm_call_t *prev, *next;
  txc_idnode_t idnode; /* in sent_ids while SENT (id: request_id) */
  uint64_t request_id;
  int node; /* where it is SENT, else -1 */
  uint64_t wire_end;
  int avoid; /* node not to use next time (it is shutting down), or -1 */
  unsigned retries;
  bool maybe_done;
  int last_code;

  /* The outcome, written by the loop thread before 'done'. */
  int code;
  int status;
  int64_t res_branch_id;
  uint32_t waited_ms;
  bool res_lockable;         /* GlobalLockQuery; its holder, if any, in res_xid */
  char res_xid[TXP_MAX_XID_LEN + 1];
  char errmsg[TXP_MAX_MESSAGE_LEN + 1];
  int errmsg_code; /* the code 'errmsg' came with */

  /* Completion of a blocking call. */
  bool sync;
  bool done;
  uv_mutex_t mu;
  uv_cond_t cv;
  atomic_int refs;
};

/* Start the next degrade probe now (rm_degrade.c), on the loop thread. */
typedef void (*rm_probe_fn)(rm_client_t *c);

typedef struct rm_node {
  rm_conn_t *conn;
  rm_call_list_t sent;
} rm_node_t;

struct rm_client {
  /* Immutable after rm_client_new(). */
  rm_config_t cfg; /* defaults applied; strings point at the copies below */
  char *nodes_str;
  char *token;
  char *app_id;
  char *client_id;
  rm_logger_t log;
  int nnodes;
  rm_node_t *nodes;

  /* Shared: under 'mu'. */
  uv_mutex_t mu;
  rm_call_list_t submitq;
  size_t live; /* calls submitted and not completed */
  bool stop_requested;
  bool resources_changed;
  atomic_int nodes_up;

  /* Loop thread. */
  uv_loop_t loop;
  uv_thread_t thread;
  uv_async_t async;
  uv_timer_t timer;
  bool stopping;
  rm_call_list_t waitq;
  txc_heap_t heap;        /* calls by due time */
  txc_idtable_t sent_ids; /* calls awaiting an answer, by request id */
  uint64_t next_request_id;
  unsigned rr;   /* RM_NODE_ROUND_ROBIN: where the next search starts */
  unsigned home; /* RM_NODE_HOME: this client's node (rm_client_new) */
  uint32_t rng;
  int phase2_jobs;

  /* The resource manager above the core (rm__rm_get): 'rm_ops' is set
   * before 'rm' is published, under 'rm_mu'; readers load 'rm' (acquire)
   * and may then use 'rm_ops'. */
  uv_mutex_t rm_mu;
  const rm_rm_ops_t *rm_ops;
  _Atomic(void *) rm;

  /* Set by rm_client_degrade_enable (rm_degrade.c), read on the loop
   * thread: the core's calls and loop ask for a probe through it, without
   * naming degrade detection (NULL: detection was never enabled). */
  _Atomic(rm_probe_fn) probe_soon;

  /* Degrade detection (rm_degrade.c).  Set by callers under 'mu': */
  rm_degrade_opts_t dg_req; /* defaults applied */
  bool dg_changed;
  /* Loop thread: */
  rm_degrade_opts_t dg;
  bool dg_enabled;
  bool probe_inflight;
  uint64_t probe_last_ms; /* when the last probe started (rm__mono_ms) */
  uint64_t created_ms;    /* rm_client_new (rm__mono_ms) */
  bool ever_up;           /* a node has been registered once (loop thread) */
  uv_timer_t probe_timer;
  /* Any thread: */
  uv_mutex_t mode_mu; /* serializes changes of 'mode' */
  atomic_bool dg_on;
  atomic_int mode, forced, detected;
  atomic_uint fail_streak, ok_streak;
  atomic_uint_fast64_t to_local, to_global, probes, probe_failures;

  /* Local mode's counters (rm__local_counters, fallback/rm_local.c). */
  rm_local_counters_t local;
};

#define RM_LOG_C(c, lvl, ...) RM_LOGGER(&(c)->log, (lvl), __VA_ARGS__)

/* Ask for a degrade probe now, if detection was ever enabled (loop thread). */
static inline void rm__probe_soon(rm_client_t *c) {
  rm_probe_fn f = atomic_load(&c->probe_soon);
  if (f) f(c);
}


/* --- rm_client.c --- */

/* Whether this is the loop thread of 'c': a blocking call made from a
 * library callback would wait for the very thread it blocks. */
bool rm__on_loop_thread(const rm_client_t *c);
/*
 * Hand 'k' to the loop thread (any thread).  Returns 0 (the loop now holds
 * a reference and will complete it), or RM_E_CONN_LOST (the client is
 * being freed) / RM_E_BUSY (too many calls in flight); then nothing
 * happened.
 */
int rm__submit(rm_client_t *c, rm_call_t *k);

/* --- rm_call.c: calls on the loop thread (unless said otherwise) --- */

/* A new call of 'type' (any thread), due within 'timeout_ms' from now,
 * with one reference (the caller's).  NULL on allocation failure. */
rm_call_t *rm__call_new(uint16_t type, bool idempotent, unsigned timeout_ms);
/* Free a call that was never submitted (any thread). */
void rm__call_destroy(rm_call_t *k);
/* Drop a reference (any thread); the last one frees the call. */
void rm__call_unref(rm_call_t *k);
void rm__call_list_push(rm_call_list_t *l, rm_call_t *k);
rm_call_t *rm__call_list_pop(rm_call_list_t *l);
/* A new call from the submit queue: into the deadline heap, then off to a
 * node (or the wait list). */
void rm__call_start(rm_client_t *c, rm_call_t *k);
/*
 * Complete 'k' with 'code': exactly once per call.  The caller has
 * already unlinked it from the id table and the lists.  Runs the async
 * callback or wakes the blocking caller, then drops the loop's reference.
 */
void rm__call_complete(rm_client_t *c, rm_call_t *k, int code);
/* Arm the timer for the earliest entry of the deadline heap. */
void rm__call_arm_timer(rm_client_t *c);
/* The client is stopping: complete every call (RM_E_UNKNOWN_OUTCOME when
 * it may have reached a coordinator, else RM_E_CONN_LOST). */
void rm__calls_abort(rm_client_t *c);
/* Detection switched to local mode: complete every call waiting for a node
 * (RM_E_NO_NODE) but those that may have reached one.  Loop thread. */
void rm__calls_fail_waiting(rm_client_t *c);
/* What each connection tells the calls: ready, down (failover), frames. */
extern const rm_conn_cbs_t rm__call_conn_cbs;

/* --- rm_serve.c --- */

/* A request from a coordinator (BranchCommit, BranchRollback, ...). */
void rm__serve_request(rm_client_t *c, rm_conn_t *conn, const txp_msg_t *m);


#endif /* RM_CORE_H */
