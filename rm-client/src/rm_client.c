/*
 * rm_client.c - librmclient's core: configuration, the background loop
 * thread, the TM API (blocking and callback forms), routing, deadlines and
 * retries of every call, phase two for the AT layer, and the internal calls
 * of rm_internal.h.
 *
 * NOTES
 *   Threads.  rm_client_new() starts one thread that runs a libuv loop and
 *   owns everything below marked "loop thread": the connections (rm_conn.c,
 *   one per configured node), the deadline heap, the table of requests
 *   awaiting an answer.  Caller threads never touch those.  They build a
 *   call (an rm_call_t holding copies of its arguments), put it on the
 *   submit queue under 'mu', and wake the loop with uv_async_send (also
 *   under 'mu', so that the loop can close the async handle once it has
 *   seen the stop flag without racing a late sender).  A blocking caller
 *   then waits on the call's own condition variable; an *_async call's
 *   callback runs on the loop thread.  A call is reference counted (the
 *   caller's reference and the loop's), so a blocking caller that gives up
 *   (see RM_BLOCKING_GRACE_MS) never frees memory the loop still uses.
 *   Phase two runs rm__at_phase2() on libuv's thread pool (uv_queue_work),
 *   since it blocks on PostgreSQL.
 *
 *   Life of a call (loop thread):
 *     1. NEW: taken off the submit queue, entered in the deadline heap.
 *     2. dispatch: pick a node: the one that created the xid (its address
 *        precedes the last ':' of the xid) when it is registered, else the
 *        next registered node round-robin.  None registered -> WAITING (in
 *        'waitq') until one registers or the deadline passes.
 *     3. SENT: encoded on that node's connection, in the id table and on
 *        the node's 'sent' list.  The answer completes it, except:
 *          - TXP_ESTORE (idempotent calls only), TXP_EBUSY, TXP_ESHUTDOWN,
 *            TXP_ETOO_MANY_CONNS: BACKOFF (a short delay in the heap), then
 *            dispatch again (avoiding a node that is shutting down);
 *          - the connection dies first: a frame that never left our queue
 *            is dispatched again; one that was handed to the kernel is
 *            resent only if the call is idempotent (GlobalBegin and
 *            BranchRegister carry an idempotency key made once per logical
 *            call; GlobalCommit/Rollback/Status are idempotent at the TC),
 *            else it completes with RM_E_UNKNOWN_OUTCOME.
 *     4. DONE: completed exactly once, by an answer, by its deadline, or by
 *        rm_client_free().
 *   The deadline decides what a failure means: a call that may have reached
 *   a coordinator ('maybe_done', or SENT at expiry) gets
 *   RM_E_UNKNOWN_OUTCOME; one that certainly did not gets RM_E_NO_NODE when
 *   no node is registered (RM_E_AUTH when every node refused our token),
 *   else the last retryable refusal (RM_E_BUSY, ...) or RM_E_DEADLINE.
 *
 *   Time: deadlines are absolute uv_hrtime() milliseconds, computed on the
 *   caller's thread when the call is made.  One uv_timer, armed for the
 *   earliest entry of the heap, expires calls and ends backoffs.
 *
 *   Bounds: at most RM_MAX_LIVE_CALLS calls between submission and
 *   completion (RM_E_BUSY beyond), which bounds the submit queue, the wait
 *   list and the id table; each connection's write queue is bounded in
 *   rm_conn.c; at most RM_MAX_PHASE2 phase-two jobs run at once.
 *
 *   The library never prints: every line goes through rm__log() to the
 *   caller's callback.
 *
 *   Degrade detection (rm_client_degrade_enable, rm_client.h): once
 *   enabled, the loop thread runs one probe at a time, an internal
 *   GlobalStatus call of an xid that does not exist (RM_PROBE_XID) with the
 *   probe timeout as its deadline, routed like any call.  "Not found" (or
 *   any answer of a working node: RM_E_BUSY included) is a success; no
 *   answer in time, no node, or a store error is a failure.  The streaks of
 *   consecutive results decide the detected mode; the mode the services
 *   read is the forced one if any, else the detected one.  It is published
 *   in atomics (read from any thread without locking); changes of it are
 *   made under 'mode_mu' (so each switch is counted once) and logged after.
 *   A call that ends with RM_E_NO_NODE starts the next probe at once.
 */
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "rm_conn.h"
#include "rm_internal.h"
#include "txp_failpoint.h"

#define RM_DEFAULT_CONNECT_TIMEOUT_MS 3000u
#define RM_DEFAULT_REQUEST_TIMEOUT_MS 5000u
#define RM_DEFAULT_HEARTBEAT_MS 1000u
#define RM_DEFAULT_LOCK_WAIT_MS 2000u
#define RM_MAX_NODES 64
#define RM_MAX_LIVE_CALLS 16384u
#define RM_MAX_PHASE2 1024
#define RM_RETRY_MIN_MS 20u  /* backoff after a retryable refusal */
#define RM_RETRY_MAX_MS 500u
#define RM_BLOCKING_GRACE_MS 2000u /* a blocking caller gives up this long after its deadline */
#define RM_IDEM_BYTES 16
#define RM_HASH_BITS_MIN 6
#define RM_PROBE_XID "txc-degrade-probe" /* never an xid the TC made: no ':' */
#define RM_DEGRADE_FAILS 3u
#define RM_DEGRADE_RECOVERS 3u
#define RM_DEGRADE_INTERVAL_MS 1000u
#define RM_DEGRADE_MAX_THRESHOLD 1000u
#define RM_DEGRADE_MAX_MS 3600000u

/* ------------------------------------------------------------- types */

typedef enum {
  CALL_NEW = 0, /* submitted, or between two dispatches */
  CALL_WAITING, /* no node registered: in waitq */
  CALL_SENT,    /* in the id table and its node's sent list */
  CALL_BACKOFF, /* refused with a retryable code: waits in the heap */
  CALL_DONE,
} call_state_t;

typedef struct rm_call rm_call_t;

typedef struct call_list {
  rm_call_t *head, *tail;
} call_list_t;

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
  uint64_t deadline_ms;
  rm_tm_cb cb; /* async form; NULL for a blocking call */
  void *cb_arg;

  /* Loop thread. */
  call_state_t state;
  uint64_t due_ms; /* heap key: the deadline, or the end of a backoff */
  size_t heap_idx; /* SIZE_MAX when not in the heap */
  rm_call_t *prev, *next;
  rm_call_t *hnext;
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

typedef struct node {
  rm_conn_t *conn;
  call_list_t sent;
} node_t;

struct rm_client {
  /* Immutable after rm_client_new(). */
  rm_config_t cfg; /* defaults applied; strings point at the copies below */
  char *nodes_str;
  char *token;
  char *app_id;
  char *client_id;
  rm_logger_t log;
  int nnodes;
  node_t *nodes;

  /* Shared: under 'mu'. */
  uv_mutex_t mu;
  call_list_t submitq;
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
  call_list_t waitq;
  rm_call_t **heap;
  size_t heap_len, heap_cap;
  rm_call_t **buckets;
  unsigned hash_bits;
  size_t nhash;
  uint64_t next_request_id;
  unsigned rr;
  uint32_t rng;
  int phase2_jobs;

  /* The AT layer's state (rm__at_state); its own business. */
  rm_at_state_t *at;

  /* Degrade detection (see NOTES).  Set by callers under 'mu': */
  rm_degrade_opts_t dg_req; /* defaults applied */
  bool dg_changed;
  /* Loop thread: */
  rm_degrade_opts_t dg;
  bool dg_enabled;
  bool probe_inflight;
  uv_timer_t probe_timer;
  /* Any thread: */
  uv_mutex_t mode_mu; /* serializes changes of 'mode' */
  atomic_bool dg_on;
  atomic_int mode, forced, detected;
  atomic_uint fail_streak, ok_streak;
  atomic_uint_fast64_t to_local, to_global, probes, probe_failures;
};

/* The client whose loop runs on this thread, if any: blocking calls made
 * from a callback would wait for the very thread they block. */
static _Thread_local rm_client_t *tls_loop_client;

static void dispatch(rm_client_t *c, rm_call_t *k);
static void arm_timer(rm_client_t *c);
static void probe_soon(rm_client_t *c);

/* ------------------------------------------------------------ helpers */

static uint64_t now_ms(void) { return uv_hrtime() / 1000000u; }

void rm__log(rm_client_t *c, int level, const char *fmt, ...) {
  va_list ap;
  if (!c || !c->log.cb || level > c->log.level) return;
  va_start(ap, fmt);
  rm__logger_vwrite(&c->log, level, fmt, ap);
  va_end(ap);
}

#define LOG(c, lvl, ...) RM_LOGGER(&(c)->log, (lvl), __VA_ARGS__)

static char *str_dup(const char *s) {
  if (!s) return NULL;
  size_t n = strlen(s) + 1;
  char *p = malloc(n);
  if (p) memcpy(p, s, n);
  return p;
}

/* A string argument: RM_E_INVALID when NULL/empty (if required) or longer
 * than 'max' bytes. */
static int check_str(const char *s, size_t max, bool required) {
  if (!s) return required ? RM_E_INVALID : 0;
  size_t n = strnlen(s, max + 1);
  if (n > max || (required && n == 0)) return RM_E_INVALID;
  return 0;
}

/* Cut 's' to at most 'max' bytes at a UTF-8 character boundary (in place). */
static void utf8_cut(char *s, size_t max) {
  size_t n = strlen(s);
  if (n <= max) return;
  n = max;
  while (n > 0 && ((unsigned char)s[n] & 0xc0) == 0x80) n--;
  s[n] = '\0';
}

static int code_of(int64_t code) {
  if (code == 0) return 0;
  return (code < 0 && code >= INT_MIN) ? (int)code : TXP_EINTERNAL;
}

/* 128 random bits as 32 hex digits: one idempotency key per logical call. */
static void make_idem_key(char *out) {
  static atomic_uint_fast64_t counter;
  uint8_t b[RM_IDEM_BYTES];
  if (uv_random(NULL, NULL, b, sizeof(b), 0, NULL) != 0) {
    /* No entropy source: mix the clock, a counter and the stack address
     * (splitmix64); unique in practice for one process. */
    uint64_t x = uv_hrtime() ^ ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)&b;
    x += atomic_fetch_add(&counter, 1) * UINT64_C(0x9E3779B97F4A7C15);
    for (size_t i = 0; i < sizeof(b); i += 8) {
      uint64_t z = (x += UINT64_C(0x9E3779B97F4A7C15));
      z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
      z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
      z ^= z >> 31;
      memcpy(b + i, &z, 8);
    }
  }
  static const char hex[] = "0123456789abcdef";
  for (size_t i = 0; i < sizeof(b); i++) {
    out[2 * i] = hex[b[i] >> 4];
    out[2 * i + 1] = hex[b[i] & 15];
  }
  out[2 * RM_IDEM_BYTES] = '\0';
}

/* -------------------------------------------------------------- lists */

static void list_push(call_list_t *l, rm_call_t *k) {
  k->next = NULL;
  k->prev = l->tail;
  if (l->tail) l->tail->next = k;
  else l->head = k;
  l->tail = k;
}

static void list_remove(call_list_t *l, rm_call_t *k) {
  if (k->prev) k->prev->next = k->next;
  else l->head = k->next;
  if (k->next) k->next->prev = k->prev;
  else l->tail = k->prev;
  k->prev = k->next = NULL;
}

static rm_call_t *list_pop(call_list_t *l) {
  rm_call_t *k = l->head;
  if (k) list_remove(l, k);
  return k;
}

/* --------------------------------------------------------------- heap */

static bool heap_less(const rm_call_t *a, const rm_call_t *b) { return a->due_ms < b->due_ms; }

static void heap_set(rm_client_t *c, size_t i, rm_call_t *k) {
  c->heap[i] = k;
  k->heap_idx = i;
}

static void heap_up(rm_client_t *c, size_t i) {
  rm_call_t *k = c->heap[i];
  while (i > 0) {
    size_t p = (i - 1) / 2;
    if (!heap_less(k, c->heap[p])) break;
    heap_set(c, i, c->heap[p]);
    i = p;
  }
  heap_set(c, i, k);
}

static void heap_down(rm_client_t *c, size_t i) {
  rm_call_t *k = c->heap[i];
  for (;;) {
    size_t l = 2 * i + 1, r = l + 1, m = i;
    const rm_call_t *best = k;
    if (l < c->heap_len && heap_less(c->heap[l], best)) {
      m = l;
      best = c->heap[l];
    }
    if (r < c->heap_len && heap_less(c->heap[r], best)) m = r;
    if (m == i) break;
    heap_set(c, i, c->heap[m]);
    i = m;
  }
  heap_set(c, i, k);
}

static int heap_push(rm_client_t *c, rm_call_t *k, uint64_t due) {
  if (c->heap_len == c->heap_cap) {
    size_t n = c->heap_cap ? c->heap_cap * 2 : 64;
    rm_call_t **h = realloc(c->heap, n * sizeof(*h));
    if (!h) return RM_E_NOMEM;
    c->heap = h;
    c->heap_cap = n;
  }
  k->due_ms = due;
  heap_set(c, c->heap_len++, k);
  heap_up(c, k->heap_idx);
  return 0;
}

static void heap_remove(rm_client_t *c, rm_call_t *k) {
  size_t i = k->heap_idx;
  if (i == SIZE_MAX) return;
  k->heap_idx = SIZE_MAX;
  rm_call_t *last = c->heap[--c->heap_len];
  if (i == c->heap_len) return;
  heap_set(c, i, last);
  heap_up(c, i);
  heap_down(c, last->heap_idx);
}

static void heap_update(rm_client_t *c, rm_call_t *k, uint64_t due) {
  k->due_ms = due;
  heap_up(c, k->heap_idx);
  heap_down(c, k->heap_idx);
}

/* ------------------------------------------------- the id table (hash) */

static size_t hash_slot(const rm_client_t *c, uint64_t id) {
  return (size_t)((id * UINT64_C(0x9E3779B97F4A7C15)) >> (64 - c->hash_bits));
}

static void hash_grow(rm_client_t *c) {
  unsigned bits = c->hash_bits + 1;
  rm_call_t **nb = calloc((size_t)1 << bits, sizeof(*nb));
  if (!nb) return; /* chains just get longer */
  size_t old_n = (size_t)1 << c->hash_bits;
  rm_call_t **old = c->buckets;
  c->buckets = nb;
  c->hash_bits = bits;
  for (size_t i = 0; i < old_n; i++) {
    rm_call_t *k = old[i];
    while (k) {
      rm_call_t *next = k->hnext;
      size_t s = hash_slot(c, k->request_id);
      k->hnext = nb[s];
      nb[s] = k;
      k = next;
    }
  }
  free(old);
}

static void hash_insert(rm_client_t *c, rm_call_t *k) {
  if (c->nhash >= ((size_t)1 << c->hash_bits)) hash_grow(c);
  size_t s = hash_slot(c, k->request_id);
  k->hnext = c->buckets[s];
  c->buckets[s] = k;
  c->nhash++;
}

static rm_call_t *hash_find(const rm_client_t *c, uint64_t id) {
  for (rm_call_t *k = c->buckets[hash_slot(c, id)]; k; k = k->hnext)
    if (k->request_id == id) return k;
  return NULL;
}

static void hash_remove(rm_client_t *c, rm_call_t *k) {
  rm_call_t **pp = &c->buckets[hash_slot(c, k->request_id)];
  while (*pp && *pp != k) pp = &(*pp)->hnext;
  if (*pp) {
    *pp = k->hnext;
    c->nhash--;
  }
  k->hnext = NULL;
}

/* ------------------------------------------------------- call objects */

static rm_call_t *call_new(uint16_t type, bool idempotent, unsigned timeout_ms) {
  rm_call_t *k = calloc(1, sizeof(*k));
  if (!k) return NULL;
  k->type = type;
  k->idempotent = idempotent;
  k->deadline_ms = now_ms() + timeout_ms;
  k->heap_idx = SIZE_MAX;
  k->node = -1;
  k->avoid = -1;
  atomic_init(&k->refs, 1);
  return k;
}

static void call_destroy(rm_call_t *k) {
  free(k->name);
  free(k->resource_id);
  free(k->lock_keys);
  free(k->app_data);
  free(k->message);
  if (k->sync) {
    uv_cond_destroy(&k->cv);
    uv_mutex_destroy(&k->mu);
  }
  free(k);
}

static void call_unref(rm_call_t *k) {
  if (atomic_fetch_sub(&k->refs, 1) == 1) call_destroy(k);
}

/* Take 'k' out of the id table and its node's list. */
static void unlink_sent(rm_client_t *c, rm_call_t *k) {
  hash_remove(c, k);
  list_remove(&c->nodes[k->node].sent, k);
  k->node = -1;
}

/*
 * Complete 'k' with 'code' (loop thread): exactly once per call.  The
 * caller has already unlinked it from the id table and the lists.  Runs
 * the async callback or wakes the blocking caller, then drops the loop's
 * reference.
 */
static void complete(rm_client_t *c, rm_call_t *k, int code) {
  heap_remove(c, k);
  k->state = CALL_DONE;
  k->code = code;
  if (code != 0 && (!k->errmsg[0] || k->errmsg_code != code))
    snprintf(k->errmsg, sizeof(k->errmsg), "%s", rm_strerror(code));
  uv_mutex_lock(&c->mu);
  c->live--;
  uv_mutex_unlock(&c->mu);
  if (code == RM_E_NO_NODE) probe_soon(c);
  if (!k->sync) {
    const char *xid = k->type == TXP_MSG_GLOBAL_BEGIN ? (code == 0 ? k->res_xid : NULL) : k->xid;
    k->cb(code, xid, k->status, k->cb_arg);
  } else {
    uv_mutex_lock(&k->mu);
    k->done = true;
    uv_cond_signal(&k->cv);
    uv_mutex_unlock(&k->mu);
  }
  call_unref(k);
}

/* --------------------------------------------------------- submission */

/*
 * Hand 'k' to the loop thread.  Returns 0 (the loop now holds a reference
 * and will complete it), or RM_E_CONN_LOST (the client is being freed) /
 * RM_E_BUSY (too many calls in flight); then nothing happened.
 */
static int submit(rm_client_t *c, rm_call_t *k) {
  uv_mutex_lock(&c->mu);
  if (c->stop_requested) {
    uv_mutex_unlock(&c->mu);
    return RM_E_CONN_LOST;
  }
  if (c->live >= RM_MAX_LIVE_CALLS) {
    uv_mutex_unlock(&c->mu);
    return RM_E_BUSY;
  }
  c->live++;
  k->prev = k->next = NULL;
  list_push(&c->submitq, k);
  uv_async_send(&c->async); /* under mu: see NOTES */
  uv_mutex_unlock(&c->mu);
  return 0;
}

/*
 * Run 'k' as a blocking call: returns its code.  The caller keeps its
 * reference and drops it afterwards; it may read the outcome fields only
 * when '*completed' (the loop completed the call: otherwise it was refused
 * before submission, or given up on, and the loop may still write them).
 */
static int run_blocking(rm_client_t *c, rm_call_t *k, bool *completed) {
  *completed = false;
  if (tls_loop_client == c) {
    LOG(c, RM_LOG_ERROR, "blocking call %s made from a library callback: refused",
        txp_msg_type_name(k->type));
    return RM_E_INVALID;
  }
  k->sync = true;
  if (uv_mutex_init(&k->mu) != 0) {
    k->sync = false;
    return RM_E_NOMEM;
  }
  if (uv_cond_init(&k->cv) != 0) {
    uv_mutex_destroy(&k->mu);
    k->sync = false;
    return RM_E_NOMEM;
  }
  atomic_store(&k->refs, 2);
  int rc = submit(c, k);
  if (rc != 0) {
    atomic_store(&k->refs, 1);
    return rc;
  }
  uv_mutex_lock(&k->mu);
  while (!k->done) {
    /* The loop completes every call by its deadline; the grace period only
     * guards against a loop thread blocked by a misbehaving callback. */
    uint64_t limit = k->deadline_ms + RM_BLOCKING_GRACE_MS, now = now_ms();
    if (now >= limit) break;
    uv_cond_timedwait(&k->cv, &k->mu, (limit - now) * 1000000u);
  }
  bool done = k->done;
  rc = k->code;
  uv_mutex_unlock(&k->mu);
  *completed = done;
  if (!done) {
    LOG(c, RM_LOG_ERROR, "%s got no completion %u ms past its deadline: the library thread is "
        "blocked (a callback that blocks?); outcome unknown",
        txp_msg_type_name(k->type), RM_BLOCKING_GRACE_MS);
    return RM_E_UNKNOWN_OUTCOME;
  }
  return rc;
}

/* Start an async call: 0 (callback runs once) or an error (it never runs). */
static int run_async(rm_client_t *c, rm_call_t *k, rm_tm_cb cb, void *arg) {
  k->cb = cb;
  k->cb_arg = arg;
  int rc = submit(c, k);
  if (rc != 0) call_unref(k);
  return rc;
}

/* ------------------------------------------------------------ routing */

static bool node_ready(const rm_client_t *c, int i) { return rm__conn_ready(c->nodes[i].conn); }

/* No node registered and every one refused our token. */
static bool all_auth_failed(const rm_client_t *c) {
  if (atomic_load(&c->nodes_up) > 0) return false;
  for (int i = 0; i < c->nnodes; i++)
    if (!rm__conn_auth_failed(c->nodes[i].conn)) return false;
  return true;
}

static bool any_auth_failed(const rm_client_t *c) {
  for (int i = 0; i < c->nnodes; i++)
    if (rm__conn_auth_failed(c->nodes[i].conn)) return true;
  return false;
}

/* The node for 'k': the xid's creator if registered, else round-robin
 * over registered nodes (skipping 'avoid' unless it is the only one). */
static int pick_node(rm_client_t *c, const rm_call_t *k) {
  if (k->xid[0]) {
    char addr[RM_ADDR_MAX];
    if (rm__xid_node(k->xid, addr, sizeof(addr)) == 0) {
      for (int i = 0; i < c->nnodes; i++)
        if (i != k->avoid && node_ready(c, i) && rm__conn_is_node(c->nodes[i].conn, addr)) return i;
    }
  }
  for (int n = 0; n < c->nnodes; n++) {
    int i = (int)((c->rr + (unsigned)n) % (unsigned)c->nnodes);
    if (i != k->avoid && node_ready(c, i)) {
      c->rr = (unsigned)i + 1;
      return i;
    }
  }
  if (k->avoid >= 0 && node_ready(c, k->avoid)) return k->avoid;
  return -1;
}

/* The lock wait to ask for now: what is left of the deadline, keeping the
 * request timeout (or half of what is left) for the answer itself. */
static uint32_t lock_wait_now(const rm_client_t *c, const rm_call_t *k) {
  uint64_t now = now_ms();
  if (!k->lock_wait_ms || now >= k->deadline_ms) return 0;
  uint64_t left = k->deadline_ms - now;
  uint64_t reserve = c->cfg.request_timeout_ms < left / 2 ? c->cfg.request_timeout_ms : left / 2;
  uint64_t lw = left - reserve;
  return lw < k->lock_wait_ms ? (uint32_t)lw : k->lock_wait_ms;
}

static void build_msg(const rm_client_t *c, const rm_call_t *k, txp_msg_t *m) {
  txp_msg_init(m, (txp_msg_type_t)k->type);
  switch (k->type) {
  case TXP_MSG_GLOBAL_BEGIN:
    if (k->timeout_ms) txp_msg_set_int(m, TXP_F_TIMEOUT_MS, k->timeout_ms);
    if (k->name) txp_msg_set_str(m, TXP_F_NAME, k->name);
    txp_msg_set_str(m, TXP_F_IDEM_KEY, k->idem);
    break;
  case TXP_MSG_BRANCH_REGISTER: {
    uint32_t lw = lock_wait_now(c, k);
    txp_msg_set_str(m, TXP_F_XID, k->xid);
    txp_msg_set_int(m, TXP_F_BRANCH_TYPE, TXP_BT_AT);
    txp_msg_set_str(m, TXP_F_RESOURCE_ID, k->resource_id);
    if (k->lock_keys && k->lock_keys[0]) txp_msg_set_str(m, TXP_F_LOCK_KEYS, k->lock_keys);
    if (k->app_data) txp_msg_set_str(m, TXP_F_APP_DATA, k->app_data);
    if (lw) txp_msg_set_int(m, TXP_F_LOCK_WAIT_MS, lw);
    txp_msg_set_str(m, TXP_F_IDEM_KEY, k->idem);
    txp_msg_set_str(m, TXP_F_CLIENT_ID, c->client_id);
    break;
  }
  case TXP_MSG_BRANCH_REPORT:
    txp_msg_set_str(m, TXP_F_XID, k->xid);
    txp_msg_set_int(m, TXP_F_BRANCH_ID, k->branch_id);
    txp_msg_set_int(m, TXP_F_BRANCH_STATUS, k->branch_status);
    if (k->message && k->message[0]) txp_msg_set_str(m, TXP_F_MESSAGE, k->message);
    break;
  default: /* commit, rollback, status */
    txp_msg_set_str(m, TXP_F_XID, k->xid);
    break;
  }
}

/* The code for a call that ends without an answer: see NOTES. */
static int unanswered_code(const rm_client_t *c, const rm_call_t *k) {
  if (k->maybe_done) return RM_E_UNKNOWN_OUTCOME;
  if (atomic_load(&c->nodes_up) == 0) return any_auth_failed(c) ? RM_E_AUTH : RM_E_NO_NODE;
  return k->last_code ? k->last_code : RM_E_DEADLINE;
}

/* The deadline of 'k' passed: complete it (whatever its state). */
static void expire(rm_client_t *c, rm_call_t *k) {
  int code;
  switch (k->state) {
  case CALL_SENT:
    unlink_sent(c, k);
    code = RM_E_UNKNOWN_OUTCOME;
    LOG(c, RM_LOG_DEBUG, "%s request %" PRIu64 " got no answer within its deadline: outcome unknown",
        txp_msg_type_name(k->type), k->request_id);
    break;
  case CALL_WAITING:
    list_remove(&c->waitq, k);
    code = unanswered_code(c, k);
    break;
  default:
    code = unanswered_code(c, k);
    break;
  }
  complete(c, k, code);
}

/*
 * Send 'k' (state NEW, unlinked, in the heap) to a node, or park it in the
 * wait list when none is registered.  May complete it (deadline already
 * passed, every node refused our token, arguments the encoder refuses).
 */
static void dispatch(rm_client_t *c, rm_call_t *k) {
  if (now_ms() >= k->deadline_ms) {
    expire(c, k);
    return;
  }
  for (int tries = 0; tries < c->nnodes; tries++) {
    int i = pick_node(c, k);
    if (i < 0) break;
    txp_msg_t m;
    build_msg(c, k, &m);
    m.request_id = ++c->next_request_id;
    uint64_t end = 0;
    int rc = rm__conn_send(c->nodes[i].conn, &m, &end);
    if (rc == 0) {
      k->state = CALL_SENT;
      k->node = i;
      k->request_id = m.request_id;
      k->wire_end = end;
      hash_insert(c, k);
      list_push(&c->nodes[i].sent, k);
      return;
    }
    if (rc == TXP_ECONN_LOST) continue; /* that session just ended: next node */
    /* The encoder refused the message: an argument is invalid (e.g. not
     * UTF-8).  Nothing was sent. */
    LOG(c, RM_LOG_WARN, "could not send %s: %s", txp_msg_type_name(k->type), txp_strerror(rc));
    complete(c, k, rc == TXP_ENOMEM ? RM_E_NOMEM : RM_E_INVALID);
    return;
  }
  if (all_auth_failed(c)) {
    complete(c, k, k->maybe_done ? RM_E_UNKNOWN_OUTCOME : RM_E_AUTH);
    return;
  }
  k->state = CALL_WAITING;
  list_push(&c->waitq, k);
}

/* A retryable refusal: try again after a short backoff (within the
 * deadline; the heap entry becomes the earlier of the two). */
static void retry_later(rm_client_t *c, rm_call_t *k) {
  k->retries++;
  unsigned delay = rm__backoff_ms(k->retries, RM_RETRY_MIN_MS, RM_RETRY_MAX_MS, rm__rand32(&c->rng));
  uint64_t due = now_ms() + delay;
  k->state = CALL_BACKOFF;
  heap_update(c, k, due < k->deadline_ms ? due : k->deadline_ms);
}

/* The answer 'm' to SENT call 'k' (already unlinked), from 'conn'. */
static void on_answer(rm_client_t *c, rm_conn_t *conn, rm_call_t *k, const txp_msg_t *m) {
  int idx = rm__conn_index(conn);
  int code = code_of(m->code);
  k->state = CALL_NEW;
  if (m->type != TXP_MSG_ERROR && m->type != k->type + 1) {
    LOG(c, RM_LOG_WARN, "coordinator \"%s\" answered %s with %s: outcome unknown",
        rm__conn_addr(conn), txp_msg_type_name(k->type), txp_msg_type_name(m->type));
    complete(c, k, RM_E_UNKNOWN_OUTCOME);
    return;
  }
  if (m->message) {
    snprintf(k->errmsg, sizeof(k->errmsg), "%s", m->message);
  } else {
    k->errmsg[0] = '\0';
  }
  k->errmsg_code = code;
  if (txp_msg_has(m, TXP_F_GLOBAL_STATUS)) k->status = (int)m->global_status;
  if (code == 0) {
    if (k->type == TXP_MSG_GLOBAL_BEGIN) {
      if (!m->xid || !m->xid[0]) {
        LOG(c, RM_LOG_WARN, "coordinator \"%s\" answered GlobalBegin without an xid", rm__conn_addr(conn));
        complete(c, k, RM_E_UNKNOWN_OUTCOME);
        return;
      }
      snprintf(k->res_xid, sizeof(k->res_xid), "%s", m->xid);
      rm__conn_learn_xid(conn, m->xid);
    } else if (k->type == TXP_MSG_BRANCH_REGISTER) {
      k->res_branch_id = m->branch_id;
      k->waited_ms = m->waited_ms;
      if (m->waited_ms)
        LOG(c, RM_LOG_DEBUG, "branch %" PRId64 " of \"%s\" registered after waiting %u ms for a global lock",
            m->branch_id, k->xid, (unsigned)m->waited_ms);
    }
    complete(c, k, 0);
    return;
  }
  bool retry = code == TXP_EBUSY || code == TXP_ESHUTDOWN || code == TXP_ETOO_MANY_CONNS ||
               (code == TXP_ESTORE && k->idempotent);
  if (retry) {
    /* The store may have committed before failing: only an idempotent call
     * gets here with TXP_ESTORE, and its outcome is open until answered. */
    if (code == TXP_ESTORE) k->maybe_done = true;
    if (code == TXP_ESHUTDOWN) k->avoid = idx;
    k->last_code = code;
    LOG(c, RM_LOG_DEBUG, "coordinator \"%s\" refused %s (%s): retrying", rm__conn_addr(conn),
        txp_msg_type_name(k->type), txp_errname(code));
    retry_later(c, k);
    return;
  }
  complete(c, k, code);
}

/* ------------------------------------------------------------ phase two */

typedef struct p2_job {
  uv_work_t work;
  rm_client_t *c;
  int node;
  uint64_t session;
  uint64_t request_id;
  uint16_t type;
  uint16_t flags;
  bool commit;
  int64_t branch_id;
  int branch_type;
  int status;
  int code;
  char xid[TXP_MAX_XID_LEN + 1];
  char resource_id[TXP_MAX_RESOURCE_LEN + 1];
  char errmsg[TXP_MAX_MESSAGE_LEN + 1];
} p2_job_t;

/* Send the *_RESULT of a phase-two request; a message the encoder refuses
 * (not UTF-8) is dropped rather than the answer. */
static void p2_answer(rm_conn_t *conn, uint16_t type, uint64_t request_id, const char *xid,
                      int64_t branch_id, int code, int status, const char *message) {
  txp_msg_t res;
  txp_msg_init(&res, (txp_msg_type_t)(type + 1));
  res.request_id = request_id;
  res.flags = TXP_FLAG_RESPONSE;
  txp_msg_set_int(&res, TXP_F_CODE, code);
  txp_msg_set_int(&res, TXP_F_BRANCH_STATUS, status);
  txp_msg_set_str(&res, TXP_F_XID, xid);
  txp_msg_set_int(&res, TXP_F_BRANCH_ID, branch_id);
  if (message && message[0]) txp_msg_set_str(&res, TXP_F_MESSAGE, message);
  int rc = rm__conn_send(conn, &res, NULL);
  if (rc != 0 && rc != TXP_ECONN_LOST && message) {
    txp_msg_set_str(&res, TXP_F_MESSAGE, NULL);
    rm__conn_send(conn, &res, NULL);
  }
}

static void p2_work(uv_work_t *w) {
  p2_job_t *j = w->data;
  rm_phase2_req_t req = {j->commit, j->xid, j->branch_id, j->resource_id, j->branch_type};
  j->code = 0;
  j->errmsg[0] = '\0';
  j->status = rm__at_phase2(j->c, &req, &j->code, j->errmsg, sizeof(j->errmsg));
}

static void p2_after(uv_work_t *w, int status) {
  p2_job_t *j = w->data;
  rm_client_t *c = j->c;
  int ok = j->commit ? TXP_BS_PHASE2_COMMITTED : TXP_BS_PHASE2_ROLLBACKED;
  int retry = j->commit ? TXP_BS_PHASE2_COMMIT_FAILED_RETRYABLE : TXP_BS_PHASE2_ROLLBACK_FAILED_RETRYABLE;
  int fail = j->commit ? TXP_BS_PHASE2_COMMIT_FAILED_UNRETRYABLE : TXP_BS_PHASE2_ROLLBACK_FAILED_UNRETRYABLE;
  c->phase2_jobs--;
  if (status == UV_ECANCELED) {
    j->status = retry;
    j->code = TXP_ESHUTDOWN;
  }
  if (j->status == ok) {
    j->code = 0;
  } else {
    if (j->status != retry && j->status != fail) {
      LOG(c, RM_LOG_WARN, "phase two of branch %" PRId64 " returned branch status %d, which is not a "
          "result of %s: answering it as retryable", j->branch_id, j->status,
          j->commit ? "a commit" : "a rollback");
      j->status = retry;
    }
    if (j->code == 0) j->code = j->status == fail ? TXP_EBRANCH_UNRETRYABLE : TXP_EBRANCH_RETRYABLE;
    utf8_cut(j->errmsg, TXP_MAX_MESSAGE_LEN);
    LOG(c, RM_LOG_WARN, "could not %s branch %" PRId64 " of global transaction \"%s\" on \"%s\": %s",
        j->commit ? "commit" : "roll back", j->branch_id, j->xid, j->resource_id,
        j->errmsg[0] ? j->errmsg : rm_strerror(j->code));
  }
  rm_conn_t *conn = c->stopping ? NULL : c->nodes[j->node].conn;
  if (conn && rm__conn_ready(conn) && rm__conn_session(conn) == j->session) {
    if (!(j->flags & TXP_FLAG_ONEWAY))
      p2_answer(conn, j->type, j->request_id, j->xid, j->branch_id, j->code, j->status, j->errmsg);
  } else {
    /* The coordinator times the call out and drives the branch again. */
    LOG(c, RM_LOG_DEBUG, "dropping the answer to %s of branch %" PRId64 ": its connection is gone",
        txp_msg_type_name(j->type), j->branch_id);
  }
  free(j);
}

/* BranchCommit/BranchRollback from a coordinator: run the AT layer's
 * phase two on the thread pool and answer from p2_after(). */
static void start_phase2(rm_client_t *c, rm_conn_t *conn, const txp_msg_t *m) {
  bool commit = m->type == TXP_MSG_BRANCH_COMMIT;
  int retry = commit ? TXP_BS_PHASE2_COMMIT_FAILED_RETRYABLE : TXP_BS_PHASE2_ROLLBACK_FAILED_RETRYABLE;
  if (c->phase2_jobs >= RM_MAX_PHASE2) {
    p2_answer(conn, m->type, m->request_id, m->xid, m->branch_id, TXP_EBUSY, retry,
              "too many phase-two requests in progress on this client: retry later");
    return;
  }
  p2_job_t *j = calloc(1, sizeof(*j));
  if (!j) {
    p2_answer(conn, m->type, m->request_id, m->xid, m->branch_id, TXP_ENOMEM, retry, "out of memory");
    return;
  }
  j->c = c;
  j->node = rm__conn_index(conn);
  j->session = rm__conn_session(conn);
  j->request_id = m->request_id;
  j->type = m->type;
  j->flags = m->flags;
  j->commit = commit;
  j->branch_id = m->branch_id;
  j->branch_type = txp_msg_has(m, TXP_F_BRANCH_TYPE) ? (int)m->branch_type : TXP_BT_AT;
  snprintf(j->xid, sizeof(j->xid), "%s", m->xid ? m->xid : "");
  snprintf(j->resource_id, sizeof(j->resource_id), "%s", m->resource_id ? m->resource_id : "");
  j->work.data = j;
  int rc = uv_queue_work(&c->loop, &j->work, p2_work, p2_after);
  if (rc != 0) {
    p2_answer(conn, m->type, m->request_id, m->xid, m->branch_id, TXP_EINTERNAL, retry,
              "could not queue phase two on this client");
    free(j);
    return;
  }
  c->phase2_jobs++;
}

/* A request from a coordinator. */
static void serve_request(rm_client_t *c, rm_conn_t *conn, const txp_msg_t *m) {
  txp_msg_t res;
  switch (m->type) {
  case TXP_MSG_BRANCH_COMMIT:
  case TXP_MSG_BRANCH_ROLLBACK:
    start_phase2(c, conn, m);
    return;
  case TXP_MSG_UNDO_LOG_DELETE:
    /* Undo rows go with phase-two commit and the AT layer's sweep. */
    if (m->flags & TXP_FLAG_ONEWAY) return;
    txp_msg_init_result(&res, m, 0, NULL);
    rm__conn_send(conn, &res, NULL);
    return;
  default:
    if (m->flags & TXP_FLAG_ONEWAY) return;
    txp_msg_init_result(&res, m, TXP_EBAD_REQUEST, "request type not served by a client");
    rm__conn_send(conn, &res, NULL);
    return;
  }
}

/* ------------------------------------------ connection callbacks (loop) */

static void on_conn_ready(rm_conn_t *conn, void *arg) {
  rm_client_t *c = arg;
  atomic_fetch_add(&c->nodes_up, 1);
  /* Everything that waited for a node goes now, in arrival order. */
  call_list_t q = c->waitq;
  c->waitq.head = c->waitq.tail = NULL;
  rm_call_t *k;
  while ((k = list_pop(&q))) {
    k->state = CALL_NEW;
    dispatch(c, k);
  }
  (void)conn;
  arm_timer(c);
}

static void on_conn_down(rm_conn_t *conn, bool was_ready, int reason, void *arg) {
  rm_client_t *c = arg;
  node_t *n = &c->nodes[rm__conn_index(conn)];
  if (was_ready) atomic_fetch_sub(&c->nodes_up, 1);
  call_list_t q = n->sent;
  n->sent.head = n->sent.tail = NULL;
  rm_call_t *k;
  while ((k = list_pop(&q))) {
    hash_remove(c, k);
    k->node = -1;
    k->state = CALL_NEW;
    if (!rm__conn_sent(conn, k->wire_end)) {
      dispatch(c, k); /* never left our queue: it did not happen */
    } else if (k->idempotent) {
      k->maybe_done = true;
      LOG(c, RM_LOG_DEBUG, "resending %s after losing \"%s\"", txp_msg_type_name(k->type),
          rm__conn_addr(conn));
      dispatch(c, k);
    } else {
      k->maybe_done = true;
      complete(c, k, RM_E_UNKNOWN_OUTCOME);
    }
  }
  if (reason == TXP_EAUTH && all_auth_failed(c)) {
    /* No node will take us: fail what waits now rather than at deadlines. */
    q = c->waitq;
    c->waitq.head = c->waitq.tail = NULL;
    while ((k = list_pop(&q))) complete(c, k, k->maybe_done ? RM_E_UNKNOWN_OUTCOME : RM_E_AUTH);
  }
  arm_timer(c);
}

static void on_conn_frame(rm_conn_t *conn, txp_msg_t *m, void *arg) {
  rm_client_t *c = arg;
  if (!(m->flags & TXP_FLAG_RESPONSE) && txp_msg_type_is_request(m->type)) {
    serve_request(c, conn, m);
    return;
  }
  rm_call_t *k = hash_find(c, m->request_id);
  if (!k || k->node != rm__conn_index(conn)) {
    LOG(c, RM_LOG_DEBUG, "ignoring %s for request %" PRIu64 " from \"%s\" (timed out?)",
        txp_msg_type_name(m->type), m->request_id, rm__conn_addr(conn));
    return;
  }
  unlink_sent(c, k);
  on_answer(c, conn, k, m);
  arm_timer(c);
}

static void on_conn_bad_response(rm_conn_t *conn, uint64_t request_id, int rc, void *arg) {
  rm_client_t *c = arg;
  rm_call_t *k = hash_find(c, request_id);
  if (!k || k->node != rm__conn_index(conn)) return;
  unlink_sent(c, k);
  k->maybe_done = true;
  LOG(c, RM_LOG_WARN, "invalid answer to %s from \"%s\" (%s): outcome unknown",
      txp_msg_type_name(k->type), rm__conn_addr(conn), txp_strerror(rc));
  complete(c, k, RM_E_UNKNOWN_OUTCOME);
  arm_timer(c);
}

static int conn_resource_ids(char *out, size_t cap, void *arg) {
  return rm__resource_ids(arg, out, cap);
}

static const rm_conn_cbs_t conn_cbs = {
  on_conn_ready, on_conn_down, on_conn_frame, on_conn_bad_response, conn_resource_ids,
};

/* ----------------------------------------------------- loop: the rest */

static void on_timer(uv_timer_t *t) {
  rm_client_t *c = t->data;
  uint64_t now = now_ms();
  while (c->heap_len > 0 && c->heap[0]->due_ms <= now) {
    rm_call_t *k = c->heap[0];
    if (now >= k->deadline_ms) {
      expire(c, k);
    } else { /* a backoff ended */
      heap_update(c, k, k->deadline_ms);
      k->state = CALL_NEW;
      dispatch(c, k);
    }
  }
  arm_timer(c);
}

/* Arm the timer for the earliest heap entry. */
static void arm_timer(rm_client_t *c) {
  if (c->stopping) return;
  if (c->heap_len == 0) {
    uv_timer_stop(&c->timer);
    return;
  }
  uint64_t now = now_ms(), due = c->heap[0]->due_ms;
  uv_update_time(&c->loop); /* the timer counts from the loop's clock */
  uv_timer_start(&c->timer, on_timer, due > now ? due - now : 0, 0);
}

/* A new call from the submit queue. */
static void start_call(rm_client_t *c, rm_call_t *k) {
  k->state = CALL_NEW;
  if (heap_push(c, k, k->deadline_ms) != 0) {
    complete(c, k, RM_E_NOMEM);
    return;
  }
  dispatch(c, k);
}

/* ------------------------------------------- degrade detection (loop) */

/* Publish the mode the services read (forced, else detected), counting and
 * logging a switch.  Any thread. */
static void mode_update(rm_client_t *c, const char *why) {
  uv_mutex_lock(&c->mode_mu);
  int old = atomic_load(&c->mode);
  int forced = atomic_load(&c->forced);
  int now = forced != RM_MODE_AUTO ? forced : atomic_load(&c->detected);
  if (now != old) {
    atomic_store(&c->mode, now);
    atomic_fetch_add(now == RM_MODE_LOCAL ? &c->to_local : &c->to_global, 1);
  }
  uv_mutex_unlock(&c->mode_mu);
  if (now != old)
    LOG(c, RM_LOG_WARN, "client \"%s\" switched from %s to %s mode: %s", c->client_id, rm_mode_name(old),
        rm_mode_name(now), why);
}

static void on_probe_timer(uv_timer_t *t);

/* Start the next probe after 'delay_ms' unless one is running. */
static void probe_schedule(rm_client_t *c, uint64_t delay_ms) {
  if (c->stopping || !c->dg_enabled || c->probe_inflight) return;
  uv_timer_start(&c->probe_timer, on_probe_timer, delay_ms, 0);
}

/* A call failed for want of a node: probe now rather than at the next
 * tick, so that a burst of failures is noticed within one probe timeout. */
static void probe_soon(rm_client_t *c) { probe_schedule(c, 0); }

static void on_probe_done(int code, const char *xid, int status, void *arg) {
  rm_client_t *c = arg;
  (void)xid;
  (void)status;
  c->probe_inflight = false;
  if (c->stopping) return; /* completed by the shutdown: not a result */
  /* Any answer from a working node counts; "not found" is the expected one. */
  bool ok = code == 0 || code == RM_E_GLOBAL_NOT_FOUND || code == RM_E_BUSY;
  atomic_fetch_add(&c->probes, 1);
  char why[192];
  if (ok) {
    unsigned n = atomic_fetch_add(&c->ok_streak, 1) + 1;
    atomic_store(&c->fail_streak, 0);
    if (n >= c->dg.recover_threshold && atomic_load(&c->detected) != RM_MODE_GLOBAL) {
      atomic_store(&c->detected, RM_MODE_GLOBAL);
      snprintf(why, sizeof(why), "a coordinator answered %u consecutive probes", n);
      mode_update(c, why);
    }
  } else {
    atomic_fetch_add(&c->probe_failures, 1);
    unsigned n = atomic_fetch_add(&c->fail_streak, 1) + 1;
    atomic_store(&c->ok_streak, 0);
    LOG(c, RM_LOG_DEBUG, "degrade probe failed (%u in a row): %s", n, rm_strerror(code));
    if (n >= c->dg.fail_threshold && atomic_load(&c->detected) != RM_MODE_LOCAL) {
      atomic_store(&c->detected, RM_MODE_LOCAL);
      snprintf(why, sizeof(why), "no coordinator answered %u consecutive probes within %u ms (last: %s)", n,
               c->dg.probe_timeout_ms, rm_strerror(code));
      mode_update(c, why);
    }
  }
  probe_schedule(c, c->dg.probe_interval_ms);
}

/* Send one probe: an internal call completed through on_probe_done. */
static void on_probe_timer(uv_timer_t *t) {
  rm_client_t *c = t->data;
  if (c->stopping || !c->dg_enabled || c->probe_inflight) return;
  rm_call_t *k = call_new(TXP_MSG_GLOBAL_STATUS, true, c->dg.probe_timeout_ms);
  if (!k) {
    probe_schedule(c, c->dg.probe_interval_ms);
    return;
  }
  snprintf(k->xid, sizeof(k->xid), "%s", RM_PROBE_XID);
  k->cb = on_probe_done;
  k->cb_arg = c;
  uv_mutex_lock(&c->mu);
  c->live++; /* complete() counts it out like a submitted call */
  uv_mutex_unlock(&c->mu);
  c->probe_inflight = true;
  start_call(c, k);
  arm_timer(c);
}

static void on_conn_closed(rm_conn_t *conn, void *arg) {
  (void)conn;
  (void)arg; /* freed by rm_client_free() after the loop ends */
}

/*
 * rm_client_free() asked to stop: complete every call (RM_E_UNKNOWN_OUTCOME
 * when it may have reached a coordinator, else RM_E_CONN_LOST) and close
 * every handle; uv_run() then returns once the last close callback and
 * phase-two job are done.
 */
static void begin_shutdown(rm_client_t *c) {
  if (c->stopping) return;
  c->stopping = true;
  while (c->heap_len > 0) {
    rm_call_t *k = c->heap[0];
    int code = k->maybe_done ? RM_E_UNKNOWN_OUTCOME : RM_E_CONN_LOST;
    if (k->state == CALL_SENT) {
      if (rm__conn_sent(c->nodes[k->node].conn, k->wire_end)) code = RM_E_UNKNOWN_OUTCOME;
      unlink_sent(c, k);
    } else if (k->state == CALL_WAITING) {
      list_remove(&c->waitq, k);
    }
    complete(c, k, code);
  }
  uv_close((uv_handle_t *)&c->async, NULL);
  uv_close((uv_handle_t *)&c->timer, NULL);
  uv_close((uv_handle_t *)&c->probe_timer, NULL);
  for (int i = 0; i < c->nnodes; i++) rm__conn_close(c->nodes[i].conn, on_conn_closed, c);
}

static void on_async(uv_async_t *h) {
  rm_client_t *c = h->data;
  uv_mutex_lock(&c->mu);
  call_list_t q = c->submitq;
  c->submitq.head = c->submitq.tail = NULL;
  bool stop = c->stop_requested;
  bool resources = c->resources_changed;
  c->resources_changed = false;
  bool degrade = c->dg_changed;
  c->dg_changed = false;
  if (degrade) c->dg = c->dg_req;
  uv_mutex_unlock(&c->mu);
  if (degrade && !stop) {
    c->dg_enabled = true;
    probe_schedule(c, 0);
  }
  rm_call_t *k;
  /* Registration first: a call made after rm_resource_add() returned then
   * reaches each coordinator after the new RegisterRM on that connection. */
  if (resources && !stop)
    for (int i = 0; i < c->nnodes; i++) rm__conn_reregister(c->nodes[i].conn);
  while ((k = list_pop(&q))) {
    if (stop) complete(c, k, RM_E_CONN_LOST);
    else start_call(c, k);
  }
  if (stop) {
    begin_shutdown(c);
    return;
  }
  arm_timer(c);
}

static void loop_main(void *arg) {
  rm_client_t *c = arg;
  tls_loop_client = c;
  for (int i = 0; i < c->nnodes; i++) rm__conn_start(c->nodes[i].conn);
  uv_run(&c->loop, UV_RUN_DEFAULT);
  tls_loop_client = NULL;
}

/* ------------------------------------------------------ public: setup */

const char *rm_strerror(int code) {
  switch (code) {
  case RM_E_DB: return "database statement failed";
  case RM_E_NO_TABLE: return "unknown table";
  case RM_E_NO_PK: return "table has no primary key";
  case RM_E_NOT_ONE_ROW: return "statement would change no row or several rows";
  case RM_E_GUARD: return "guard condition refused the update";
  case RM_E_STATE: return "call out of order for this branch";
  case RM_LOCAL_E_MISMATCH: return "order id already recorded with other values";
  case RM_LOCAL_E_PAID: return "order is paid: not cancelled";
  case RM_LOCAL_E_DECIDED: return "order was finished before with the other outcome";
  case RM_COMP_E_LOCKED: return "another compensation job is running";
  default: return txp_strerror(code);
  }
}

const char *rm_global_status_name(int status) { return txp_global_status_name(status); }

static void client_free_memory(rm_client_t *c) {
  if (c->nodes)
    for (int i = 0; i < c->nnodes; i++) rm__conn_free(c->nodes[i].conn);
  free(c->nodes);
  free(c->heap);
  free(c->buckets);
  free(c->nodes_str);
  free(c->token);
  free(c->app_id);
  free(c->client_id);
  free(c);
}

/* Start the loop thread with asynchronous signals blocked, so that the
 * application's signals are delivered to its own threads and a write to a
 * dead coordinator fails with EPIPE instead of raising SIGPIPE. */
static int start_thread(rm_client_t *c) {
  sigset_t all, old;
  sigfillset(&all);
  static const int sync_signals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGABRT, SIGSYS};
  for (size_t i = 0; i < sizeof(sync_signals) / sizeof(sync_signals[0]); i++)
    sigdelset(&all, sync_signals[i]);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int rc = uv_thread_create(&c->thread, loop_main, c);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  return rc;
}

int rm_client_new(const rm_config_t *cfg, rm_client_t **out) {
  rm_addr_t addrs[RM_MAX_NODES];
  char cid[TXP_MAX_NAME_LEN + 1];
  if (out) *out = NULL;
  if (!cfg || !out || check_str(cfg->token, TXP_MAX_TOKEN_LEN, true) != 0 ||
      check_str(cfg->application_id, TXP_MAX_NAME_LEN, true) != 0 ||
      check_str(cfg->client_id, TXP_MAX_NAME_LEN, false) != 0 || (cfg->client_id && !cfg->client_id[0]) ||
      !cfg->nodes)
    return RM_E_INVALID;
  int nnodes = rm__nodes_parse(cfg->nodes, addrs, RM_MAX_NODES);
  if (nnodes <= 0) return RM_E_INVALID;
  if (cfg->log_level < 0 || cfg->log_level > RM_LOG_DEBUG) return RM_E_INVALID;
  char fperr[256];
  if (txp_failpoint_arm_env(fperr, sizeof(fperr)) != 0) {
    /* A fault run with a bad spec must not run without its fault. */
    fprintf(stderr, "librmclient: TX_FAILPOINTS: %s\n", fperr);
    return RM_E_INVALID;
  }

  rm_client_t *c = calloc(1, sizeof(*c));
  if (!c) return RM_E_NOMEM;
  c->cfg = *cfg;
  if (!c->cfg.connect_timeout_ms) c->cfg.connect_timeout_ms = RM_DEFAULT_CONNECT_TIMEOUT_MS;
  if (!c->cfg.request_timeout_ms) c->cfg.request_timeout_ms = RM_DEFAULT_REQUEST_TIMEOUT_MS;
  if (!c->cfg.heartbeat_ms) c->cfg.heartbeat_ms = RM_DEFAULT_HEARTBEAT_MS;
  if (!c->cfg.lock_wait_ms) c->cfg.lock_wait_ms = RM_DEFAULT_LOCK_WAIT_MS;
  if (!c->cfg.log_level) c->cfg.log_level = RM_LOG_WARN;
  if (cfg->client_id) {
    snprintf(cid, sizeof(cid), "%s", cfg->client_id);
  } else {
    char idem[2 * RM_IDEM_BYTES + 1];
    make_idem_key(idem);
    snprintf(cid, sizeof(cid), "%.90s-%ld-%.8s", cfg->application_id, (long)getpid(), idem);
  }
  c->nodes_str = str_dup(cfg->nodes);
  c->token = str_dup(cfg->token);
  c->app_id = str_dup(cfg->application_id);
  c->client_id = str_dup(cid);
  c->nodes = calloc((size_t)nnodes, sizeof(*c->nodes));
  c->hash_bits = RM_HASH_BITS_MIN;
  c->buckets = calloc((size_t)1 << c->hash_bits, sizeof(*c->buckets));
  if (!c->nodes_str || !c->token || !c->app_id || !c->client_id || !c->nodes || !c->buckets)
    goto fail_memory;
  c->cfg.nodes = c->nodes_str;
  c->cfg.token = c->token;
  c->cfg.application_id = c->app_id;
  c->cfg.client_id = c->client_id;
  c->nnodes = nnodes;
  c->rng = (uint32_t)uv_hrtime() | 1u;
  atomic_init(&c->nodes_up, 0);
  atomic_init(&c->dg_on, false);
  atomic_init(&c->mode, RM_MODE_GLOBAL);
  atomic_init(&c->forced, RM_MODE_AUTO);
  atomic_init(&c->detected, RM_MODE_GLOBAL);
  atomic_init(&c->fail_streak, 0);
  atomic_init(&c->ok_streak, 0);
  atomic_init(&c->to_local, 0);
  atomic_init(&c->to_global, 0);
  atomic_init(&c->probes, 0);
  atomic_init(&c->probe_failures, 0);

  int rc = RM_E_NOMEM;
  if (rm__logger_init(&c->log, c->cfg.log_cb, c->cfg.log_arg, c->cfg.log_level) != 0) goto fail_memory;
  if (uv_mutex_init(&c->mu) != 0) goto fail_logger;
  if (uv_mutex_init(&c->mode_mu) != 0) goto fail_mutex;
  if (uv_loop_init(&c->loop) != 0) goto fail_mode_mutex;
  for (int i = 0; i < nnodes; i++) {
    rm_conn_opts_t o = {0};
    o.loop = &c->loop;
    o.addr = addrs[i].addr;
    o.index = i;
    o.token = c->token;
    o.app_id = c->app_id;
    o.client_id = c->client_id;
    o.next_request_id = &c->next_request_id;
    o.log = &c->log;
    o.cbs = &conn_cbs;
    o.arg = c;
    o.connect_timeout_ms = c->cfg.connect_timeout_ms;
    o.heartbeat_ms = c->cfg.heartbeat_ms;
    rc = rm__conn_new(&o, &c->nodes[i].conn);
    if (rc != 0) goto fail_loop;
  }
  if (uv_async_init(&c->loop, &c->async, on_async) != 0) goto fail_loop;
  c->async.data = c;
  uv_timer_init(&c->loop, &c->timer);
  c->timer.data = c;
  uv_timer_init(&c->loop, &c->probe_timer);
  c->probe_timer.data = c;
  if (start_thread(c) != 0) {
    rc = RM_E_NOMEM;
    uv_close((uv_handle_t *)&c->async, NULL);
    uv_close((uv_handle_t *)&c->timer, NULL);
    uv_close((uv_handle_t *)&c->probe_timer, NULL);
    uv_run(&c->loop, UV_RUN_DEFAULT);
    goto fail_loop;
  }
  LOG(c, RM_LOG_INFO, "client \"%s\" of application \"%s\" started with %d coordinator node%s",
      c->client_id, c->app_id, nnodes, nnodes == 1 ? "" : "s");
  *out = c;
  return 0;

fail_loop:
  uv_loop_close(&c->loop);
fail_mode_mutex:
  uv_mutex_destroy(&c->mode_mu);
fail_mutex:
  uv_mutex_destroy(&c->mu);
fail_logger:
  rm__logger_destroy(&c->log);
  client_free_memory(c);
  return rc;
fail_memory:
  client_free_memory(c);
  return RM_E_NOMEM;
}

void rm_client_free(rm_client_t *c) {
  if (!c) return;
  if (tls_loop_client == c) {
    LOG(c, RM_LOG_ERROR, "rm_client_free() called from a library callback: ignored");
    return;
  }
  uv_mutex_lock(&c->mu);
  c->stop_requested = true;
  uv_async_send(&c->async);
  uv_mutex_unlock(&c->mu);
  uv_thread_join(&c->thread);
  if (uv_loop_close(&c->loop) != 0) {
    /* A handle is still open (a bug): freeing its memory would be worse. */
    LOG(c, RM_LOG_ERROR, "could not close the event loop: handles still open; leaking the client");
    return;
  }
  /* The AT layer may still log or call in (it gets RM_E_CONN_LOST now). */
  if (c->at) rm__at_free(c->at);
  c->at = NULL;
  LOG(c, RM_LOG_INFO, "client \"%s\" stopped", c->client_id);
  uv_mutex_destroy(&c->mode_mu);
  uv_mutex_destroy(&c->mu);
  rm__logger_destroy(&c->log);
  client_free_memory(c);
}

int rm_client_nodes_up(rm_client_t *c) { return c ? atomic_load(&c->nodes_up) : 0; }

/* --------------------------------------------------------- public: TM */

static rm_call_t *begin_call(rm_client_t *c, unsigned timeout_ms, const char *name, int *rc) {
  *rc = RM_E_INVALID;
  if (!c || check_str(name, TXP_MAX_NAME_LEN, false) != 0) return NULL;
  *rc = RM_E_NOMEM;
  rm_call_t *k = call_new(TXP_MSG_GLOBAL_BEGIN, true, c->cfg.request_timeout_ms);
  if (!k) return NULL;
  k->timeout_ms = timeout_ms;
  make_idem_key(k->idem);
  if (name && !(k->name = str_dup(name))) {
    call_destroy(k);
    return NULL;
  }
  *rc = 0;
  return k;
}

static rm_call_t *xid_call(rm_client_t *c, uint16_t type, const char *xid, int *rc) {
  *rc = RM_E_INVALID;
  if (!c || check_str(xid, TXP_MAX_XID_LEN, true) != 0) return NULL;
  *rc = RM_E_NOMEM;
  rm_call_t *k = call_new(type, true, c->cfg.request_timeout_ms);
  if (!k) return NULL;
  snprintf(k->xid, sizeof(k->xid), "%s", xid);
  *rc = 0;
  return k;
}

int rm_tm_begin(rm_client_t *c, unsigned timeout_ms, const char *name, char *xid) {
  int rc;
  if (!xid) return RM_E_INVALID;
  xid[0] = '\0';
  bool completed;
  rm_call_t *k = begin_call(c, timeout_ms, name, &rc);
  if (!k) return rc;
  rc = run_blocking(c, k, &completed);
  if (rc == 0 && completed) snprintf(xid, RM_XID_MAX, "%s", k->res_xid);
  call_unref(k);
  return rc;
}

static int xid_blocking(rm_client_t *c, uint16_t type, const char *xid, int *status) {
  int rc;
  bool completed;
  if (status) *status = 0;
  rm_call_t *k = xid_call(c, type, xid, &rc);
  if (!k) return rc;
  rc = run_blocking(c, k, &completed);
  if (status && completed) *status = k->status;
  call_unref(k);
  return rc;
}

int rm_tm_commit(rm_client_t *c, const char *xid, int *status) {
  return xid_blocking(c, TXP_MSG_GLOBAL_COMMIT, xid, status);
}

int rm_tm_rollback(rm_client_t *c, const char *xid, int *status) {
  return xid_blocking(c, TXP_MSG_GLOBAL_ROLLBACK, xid, status);
}

int rm_tm_status(rm_client_t *c, const char *xid, int *status) {
  return xid_blocking(c, TXP_MSG_GLOBAL_STATUS, xid, status);
}

int rm_tm_begin_async(rm_client_t *c, unsigned timeout_ms, const char *name, rm_tm_cb cb, void *arg) {
  int rc;
  if (!cb) return RM_E_INVALID;
  rm_call_t *k = begin_call(c, timeout_ms, name, &rc);
  return k ? run_async(c, k, cb, arg) : rc;
}

static int xid_async(rm_client_t *c, uint16_t type, const char *xid, rm_tm_cb cb, void *arg) {
  int rc;
  if (!cb) return RM_E_INVALID;
  rm_call_t *k = xid_call(c, type, xid, &rc);
  return k ? run_async(c, k, cb, arg) : rc;
}

int rm_tm_commit_async(rm_client_t *c, const char *xid, rm_tm_cb cb, void *arg) {
  return xid_async(c, TXP_MSG_GLOBAL_COMMIT, xid, cb, arg);
}

int rm_tm_rollback_async(rm_client_t *c, const char *xid, rm_tm_cb cb, void *arg) {
  return xid_async(c, TXP_MSG_GLOBAL_ROLLBACK, xid, cb, arg);
}

int rm_tm_status_async(rm_client_t *c, const char *xid, rm_tm_cb cb, void *arg) {
  return xid_async(c, TXP_MSG_GLOBAL_STATUS, xid, cb, arg);
}

/* ---------------------------------------------- internal: for the AT layer */

int rm__branch_register(rm_client_t *c, const char *xid, const char *resource_id,
                        const char *lock_keys, const char *app_data, unsigned lock_wait_ms,
                        int64_t *branch_id, char *errmsg, size_t errlen) {
  if (errmsg && errlen) errmsg[0] = '\0';
  if (branch_id) *branch_id = 0;
  if (!c || check_str(xid, TXP_MAX_XID_LEN, true) != 0 ||
      check_str(resource_id, TXP_MAX_RESOURCE_LEN, true) != 0 ||
      check_str(lock_keys, TXP_MAX_LOCK_KEYS_LEN, false) != 0 ||
      check_str(app_data, TXP_MAX_APP_DATA_LEN, false) != 0) {
    if (errmsg && errlen) snprintf(errmsg, errlen, "invalid argument to branch registration");
    return RM_E_INVALID;
  }
  uint64_t timeout = (uint64_t)c->cfg.request_timeout_ms + lock_wait_ms;
  if (timeout > UINT_MAX) timeout = UINT_MAX;
  rm_call_t *k = call_new(TXP_MSG_BRANCH_REGISTER, true, (unsigned)timeout);
  if (!k) return RM_E_NOMEM;
  snprintf(k->xid, sizeof(k->xid), "%s", xid);
  make_idem_key(k->idem);
  k->lock_wait_ms = lock_wait_ms;
  k->resource_id = str_dup(resource_id);
  k->lock_keys = lock_keys ? str_dup(lock_keys) : NULL;
  k->app_data = app_data ? str_dup(app_data) : NULL;
  if (!k->resource_id || (lock_keys && !k->lock_keys) || (app_data && !k->app_data)) {
    call_destroy(k);
    return RM_E_NOMEM;
  }
  bool completed;
  int rc = run_blocking(c, k, &completed);
  if (rc == 0 && completed) {
    if (branch_id) *branch_id = k->res_branch_id;
  } else if (errmsg && errlen) {
    snprintf(errmsg, errlen, "%s", completed && k->errmsg[0] ? k->errmsg : rm_strerror(rc));
  }
  call_unref(k);
  return rc;
}

int rm__branch_report(rm_client_t *c, const char *xid, int64_t branch_id, int branch_status,
                      const char *message) {
  if (!c || check_str(xid, TXP_MAX_XID_LEN, true) != 0 ||
      (branch_status != TXP_BS_PHASE1_DONE && branch_status != TXP_BS_PHASE1_FAILED))
    return RM_E_INVALID;
  /* Not idempotent as far as this layer knows: once sent, a lost answer is
   * an unknown outcome rather than a resend. */
  rm_call_t *k = call_new(TXP_MSG_BRANCH_REPORT, false, c->cfg.request_timeout_ms);
  if (!k) return RM_E_NOMEM;
  snprintf(k->xid, sizeof(k->xid), "%s", xid);
  k->branch_id = branch_id;
  k->branch_status = branch_status;
  if (message && message[0]) {
    if (!(k->message = str_dup(message))) {
      call_destroy(k);
      return RM_E_NOMEM;
    }
    utf8_cut(k->message, TXP_MAX_MESSAGE_LEN);
  }
  bool completed;
  int rc = run_blocking(c, k, &completed);
  call_unref(k);
  return rc;
}

unsigned rm__lock_wait_ms(const rm_client_t *c) { return c ? c->cfg.lock_wait_ms : RM_DEFAULT_LOCK_WAIT_MS; }

rm_at_state_t **rm__at_state(rm_client_t *c) { return &c->at; }

void rm__resources_changed(rm_client_t *c) {
  if (!c) return;
  uv_mutex_lock(&c->mu);
  if (!c->stop_requested) {
    c->resources_changed = true;
    uv_async_send(&c->async);
  }
  uv_mutex_unlock(&c->mu);
}

/* ------------------------------------------- public: degrade, modes */

const char *rm_mode_name(int mode) {
  switch (mode) {
  case RM_MODE_AUTO: return "auto";
  case RM_MODE_GLOBAL: return "global";
  case RM_MODE_LOCAL: return "local";
  default: return "?";
  }
}

int rm_mode_parse(const char *s) {
  if (!s || !s[0]) return RM_MODE_AUTO;
  if (strcasecmp(s, "auto") == 0) return RM_MODE_AUTO;
  if (strcasecmp(s, "global") == 0) return RM_MODE_GLOBAL;
  if (strcasecmp(s, "local") == 0) return RM_MODE_LOCAL;
  return RM_E_INVALID;
}

int rm_client_degrade_enable(rm_client_t *c, const rm_degrade_opts_t *opts) {
  rm_degrade_opts_t o = {0};
  if (!c) return RM_E_INVALID;
  if (opts) o = *opts;
  if (o.fail_threshold > RM_DEGRADE_MAX_THRESHOLD || o.recover_threshold > RM_DEGRADE_MAX_THRESHOLD ||
      o.probe_interval_ms > RM_DEGRADE_MAX_MS || o.probe_timeout_ms > RM_DEGRADE_MAX_MS)
    return RM_E_INVALID;
  if (!o.fail_threshold) o.fail_threshold = RM_DEGRADE_FAILS;
  if (!o.recover_threshold) o.recover_threshold = RM_DEGRADE_RECOVERS;
  if (!o.probe_interval_ms) o.probe_interval_ms = RM_DEGRADE_INTERVAL_MS;
  if (!o.probe_timeout_ms) o.probe_timeout_ms = c->cfg.connect_timeout_ms;
  uv_mutex_lock(&c->mu);
  if (c->stop_requested) {
    uv_mutex_unlock(&c->mu);
    return RM_E_CONN_LOST;
  }
  c->dg_req = o;
  c->dg_changed = true;
  uv_async_send(&c->async);
  uv_mutex_unlock(&c->mu);
  atomic_store(&c->dg_on, true);
  LOG(c, RM_LOG_INFO, "degrade detection on: local mode after %u failed probes, global after %u answered "
      "(one every %u ms, %u ms each)", o.fail_threshold, o.recover_threshold, o.probe_interval_ms,
      o.probe_timeout_ms);
  return 0;
}

int rm_client_mode(rm_client_t *c) { return c ? atomic_load(&c->mode) : RM_MODE_GLOBAL; }

int rm_client_force_mode(rm_client_t *c, int mode) {
  if (!c || (mode != RM_MODE_AUTO && mode != RM_MODE_GLOBAL && mode != RM_MODE_LOCAL)) return RM_E_INVALID;
  int old = atomic_exchange(&c->forced, mode);
  if (old != mode)
    LOG(c, RM_LOG_WARN, "client \"%s\": mode %s by the operator", c->client_id,
        mode == RM_MODE_AUTO ? "left to detection" : mode == RM_MODE_LOCAL ? "forced to local" : "forced to global");
  mode_update(c, mode == RM_MODE_AUTO ? "forcing ended" : "forced by the operator");
  return 0;
}

void rm_client_degrade_stats(rm_client_t *c, rm_degrade_stats_t *out) {
  if (!out) return;
  memset(out, 0, sizeof(*out));
  rm_local_stats_t ls;
  rm_local_stats(&ls);
  out->local_orders = ls.orders;
  if (!c) {
    out->mode = out->detected = RM_MODE_GLOBAL;
    return;
  }
  out->mode = atomic_load(&c->mode);
  out->forced = atomic_load(&c->forced);
  out->detected = atomic_load(&c->detected);
  out->enabled = atomic_load(&c->dg_on);
  out->to_local = atomic_load(&c->to_local);
  out->to_global = atomic_load(&c->to_global);
  out->probes = atomic_load(&c->probes);
  out->probe_failures = atomic_load(&c->probe_failures);
  out->fail_streak = atomic_load(&c->fail_streak);
  out->ok_streak = atomic_load(&c->ok_streak);
}
