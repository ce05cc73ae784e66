/*
 * tc_pg.c - the asynchronous PostgreSQL pool declared in tc_pg.h.
 *
 * NOTES
 *   Objects.  A pool owns 'size' connections (tc_pg_conn_t, one array that
 *   lives as long as the pool), a FIFO of queued jobs, a binary min-heap of
 *   the queued jobs that have a deadline, one uv_timer for the earliest of
 *   those deadlines and one uv_idle ("kick") that dispatches jobs submitted
 *   from outside the pool's own callbacks.  Each connection owns a PGconn,
 *   a uv_timer (reconnect backoff, or connect timeout while connecting) and
 *   at most one uv_poll on the PGconn's socket.
 *
 *   Connection lifecycle (one state per step, one function per transition):
 *     1. IDLE        no PGconn.  The timer is armed: 0 ms at start-up, then
 *                    the backoff (reconnect_min_ms doubling up to
 *                    reconnect_max_ms; reset once a connection is ready).
 *     2. RESOLVING   only when the conninfo names exactly one host by name
 *                    and gives no hostaddr: uv_getaddrinfo (thread pool)
 *                    resolves it, and the address is passed to libpq as
 *                    hostaddr so that libpq never calls getaddrinfo() on
 *                    the loop.  Other conninfos (IP literals, Unix sockets,
 *                    lists of hosts) go straight to step 3.
 *     3. CONNECTING  PQconnectStart/PQconnectStartParams, then
 *                    PQconnectPoll each time the socket is ready in the
 *                    direction it asked for.  The timer bounds the whole
 *                    of steps 3-4 (connect_timeout from the conninfo, else
 *                    10 s), because libpq does not enforce connect_timeout
 *                    for PQconnectPoll; with several hosts it bounds each
 *                    host (see "Several hosts" below).
 *     4. INIT        PQsetnonblocking(1); then, if init_sql is set, it is
 *                    sent with PQsendQuery (simple protocol, so it may hold
 *                    several statements) before pipeline mode is entered,
 *                    and its results are drained.  Any error fails the
 *                    attempt (back to 1 with backoff).
 *     5. READY       PQenterPipelineMode succeeded; on_state(up=true).  The
 *                    socket is watched for readability even when idle, so a
 *                    server that goes away is noticed at once.
 *     6. BUSY        one job in flight (see "Jobs" below).
 *     7. CLEANUP     the job left the session inside a transaction block (a
 *                    TXN job whose statement failed leaves it "aborted":
 *                    Sync does not end an explicit block).  ROLLBACK + Sync
 *                    are sent and drained before the connection is READY.
 *   Any failure in 3-7 (PQconsumeInput/PQflush/PQsend* failing, PQstatus
 *   CONNECTION_BAD, a poll error, the connect timeout) goes through
 *   conn_fail(): the uv_poll is closed *before* PQfinish closes the socket
 *   (libuv requires it), the in-flight job completes with TC_PG_EBROKEN,
 *   on_state(up=false, why) runs, and the connection goes back to 1.
 *   So does a job that failed with SQLSTATE 25006 (read_only_sql_
 *   transaction): the session is on a server that became a standby, or
 *   was opened on one, and every write would fail the same way there; the
 *   job completes with TC_PG_ESTMT (nothing was written), the connection
 *   is dropped and opened again, on the primary if the conninfo says
 *   target_session_attrs=read-write (with a host list and without that,
 *   the next attempt at least begins with the next host).
 *
 *   Several hosts (host=a,b or postgresql://a:1,b:2/db, e.g. a primary and
 *   its standby with target_session_attrs=read-write: libpq walks the list
 *   inside PQconnectPoll, skipping hosts that refuse or are read-only).
 *   libpq has no call to give up on one host and go on to the next, and
 *   a host that accepts the TCP connection and then never answers (a
 *   hung or paused server) would hold the whole attempt.  So the timer
 *   bounds each host: after every PQconnectPoll the host libpq is on
 *   (PQhost/PQport) is looked up in the list, and the timer restarts when
 *   it changed.  When it fires, the attempt is dropped and started again at
 *   once with the list rotated to begin after that host (it comes last);
 *   after as many timeouts in a row as there are hosts, the attempt fails
 *   as usual (backoff).  A connection that got through remembers its
 *   host: its next attempt (after the server died, say) starts there, so a
 *   pool that found the new primary after a failover goes straight back
 *   to it.  Host names in a list are resolved by libpq on the loop (only a
 *   single host by name goes through step 2): use addresses.
 *
 *   Poll handles.  libpq may close its socket and open another one inside
 *   PQconnectPoll (next address, SSL or GSS fallback), possibly with the
 *   same descriptor number.  So while connecting, uv_poll_start is called
 *   after every PQconnectPoll (it deregisters and re-registers the
 *   descriptor with epoll, which is right for an old or a new socket), and
 *   if the number changed the handle is closed and a new one is created.
 *   Poll handles are therefore heap objects (tc_pg_watch_t) freed in their
 *   own close callback, not embedded in the connection.
 *
 *   Jobs.  A job is queued (FIFO, at most max_queue) until some connection
 *   is READY, then sent as one pipeline segment: [BEGIN] stmt... [COMMIT]
 *   Sync, flushed with PQflush (watching UV_WRITABLE while it returns 1,
 *   and reading at the same time so neither side can block on a full
 *   socket buffer).  Results are read as they come: in pipeline mode each
 *   statement yields its result(s) then a NULL, so 'item' counts NULLs to
 *   know which statement a result belongs to.  After an error the server
 *   skips to the Sync and libpq reports PGRES_PIPELINE_ABORTED for every
 *   skipped statement.  The job ends at its PGRES_PIPELINE_SYNC: OK, or
 *   TC_PG_ESTMT with the first error (message, SQLSTATE, statement index,
 *   -1 for BEGIN/COMMIT).  Results of BEGIN/COMMIT are freed at once.
 *   Without TC_PG_JOB_TXN the statements still share the implicit
 *   transaction that the extended protocol opens until Sync, so an error
 *   rolls back the job's earlier statements as well.  COPY is not
 *   supported in pipeline mode; a job that tries it breaks its connection.
 *
 *   Deadlines.  A job's deadline bounds only its time in the queue.  The
 *   heap keeps queued jobs with deadlines ordered by expiry (O(log n) per
 *   submit and dispatch); the single pool timer is armed for the earliest
 *   one.  A job dispatched before its deadline leaves the heap; the timer
 *   may then fire with nothing to expire, and simply re-arms.
 *
 *   Callbacks and re-entrancy.  Every entry into the pool (uv callbacks,
 *   tc_pg_submit) is bracketed by pool_enter/pool_leave.  User callbacks
 *   (job callbacks, on_state) only ever run with depth > 0, and are called
 *   only when the pool's own state is consistent; code that called one
 *   returns at once afterwards, because the callback may have closed the
 *   pool.  Dispatching happens in pool_leave when the outermost frame
 *   ends, so a job submitted from inside a callback is started after that
 *   callback returns.  tc_pg_submit never dispatches itself: it starts the
 *   idle handle, so a job's callback never runs inside tc_pg_submit.
 *
 *   Closing.  tc_pg_pool_close tears down every connection (poll handles
 *   closed, PQfinish), completes in-flight and queued jobs with
 *   TC_PG_ECLOSING, and uv_closes every handle; a pending uv_getaddrinfo is
 *   cancelled.  The pool counts open handles and pending requests; when the
 *   last close callback (or cancelled request callback) has run, done(arg)
 *   is called and the memory is freed.  No callback of the pool runs after
 *   that.
 *
 *   Errors never get printed: libpq's notice processor is replaced by one
 *   that drops notices, connection errors go to on_state, job errors to
 *   the job.
 *
 *   Thread: everything runs on the thread that runs the pool's loop.
 */
#include "tc_pg.h"
#include "tc_pg_int.h"

#include <arpa/inet.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#define TC_PG_DEFAULT_SIZE 4
#define TC_PG_DEFAULT_MAX_QUEUE 4096
#define TC_PG_DEFAULT_RECONNECT_MIN_MS 100u
/* A second at most between attempts: after a primary's failover the new
 * one must be found within a second of its promotion (cluster/local/pg-ha),
 * and a failed attempt costs little. */
#define TC_PG_DEFAULT_RECONNECT_MAX_MS 1000u
#define TC_PG_MAX_SIZE 1024
#define TC_PG_DEFAULT_CONNECT_TIMEOUT_MS 10000u

typedef struct tc_pg_conn tc_pg_conn_t;


typedef enum conn_state {
  CONN_IDLE,
  CONN_RESOLVING,
  CONN_CONNECTING,
  CONN_INIT,
  CONN_READY,
  CONN_BUSY,
  CONN_CLEANUP,
  CONN_CLOSED,
} conn_state_t;

/* A uv_poll on one socket of one connection.  Heap-allocated so that a new
 * one can be created while the old one waits for its close callback. */
typedef struct tc_pg_watch {
  uv_poll_t poll;
  tc_pg_pool_t *pool;
  tc_pg_conn_t *conn; /* NULL once closing */
  int fd;
  int events; /* events passed to the last uv_poll_start */
} tc_pg_watch_t;

struct tc_pg_conn {
  tc_pg_pool_t *pool;
  int index;
  conn_state_t state;
  PGconn *pg;
  tc_pg_watch_t *watch;
  uv_timer_t timer; /* backoff in IDLE, connect timeout in CONNECTING/INIT */
  uv_getaddrinfo_t gai;
  bool gai_pending;
  bool want_write; /* the last PQflush returned 1 */
  unsigned backoff_ms;
  /* Several hosts: where in the list the next attempt begins, the
   * position (in that rotated order) of the host libpq is on (-1: not
   * known yet), and the host timeouts of this round. */
  int first_host;
  int cur_host;
  int host_timeouts;
  tc_pg_job_t *job; /* in flight (BUSY only) */
  /* Prepared statements of this session (names are static strings). */
  const char *prepared[TC_PG_MAX_PREPARED];
  int nprepared;
  bool must_deallocate; /* a job failed: the set above may be wrong */
  bool init_failed;
  char init_err[TC_PG_ERR_LEN];
};

struct tc_pg_pool {
  uv_loop_t *loop;
  char *conninfo;
  char *init_sql; /* NULL if none */
  int size;
  size_t max_queue;
  unsigned reconnect_min_ms;
  unsigned reconnect_max_ms;
  unsigned connect_timeout_ms;
  void (*on_state)(tc_pg_pool_t *pool, int conn_index, bool up, const char *err, void *arg);
  void *state_arg;

  PQconninfoOption *parsed; /* the conninfo, parsed once */
  const char *resolve_host; /* points into 'parsed'; NULL: let libpq do it */
  /* The conninfo's host list, when it has two hosts or more (else
   * nhosts <= 1 and the lists are NULL): host, hostaddr and port, split at
   * the commas; a list the conninfo does not give is NULL, and a single
   * port (nport 1) applies to every host. */
  int nhosts;
  char **hosts;
  char **hostaddrs;
  char **ports;
  int nport;

  tc_pg_conn_t *conns;

  tc_pg_job_t *qhead;
  tc_pg_job_t *qtail;
  size_t nqueued;

  txc_heap_t heap; /* queued jobs with a deadline, earliest first */

  uv_timer_t deadline_timer;
  uv_idle_t kick;

  unsigned depth; /* nesting of pool_enter */
  bool closing;
  unsigned open_handles; /* initialized and not yet through close_cb */
  unsigned pending_reqs; /* uv_getaddrinfo requests not yet called back */
  void (*done)(void *arg);
  void *done_arg;

  char last_err[TC_PG_ERR_LEN]; /* last connection error, for ENOCONN */
};

static void conn_on_poll(uv_poll_t *handle, int status, int events);
static void conn_on_timer(uv_timer_t *timer);
static void conn_fail(tc_pg_conn_t *c, const char *why);
static void conn_drain_pipeline(tc_pg_conn_t *c);
static void pool_dispatch(tc_pg_pool_t *pool);

/* ---- small helpers ---- */

/* libpq's default notice processor writes to stderr: we never print. */
static void notice_ignore(void *arg, const PGresult *res)
{
  (void)arg;
  (void)res;
}

/* ---- the queue (FIFO) and the deadline heap ---- */

static void queue_push(tc_pg_pool_t *pool, tc_pg_job_t *job)
{
  job->next = NULL;
  job->prev = pool->qtail;
  if (pool->qtail != NULL)
    pool->qtail->next = job;
  else
    pool->qhead = job;
  pool->qtail = job;
  pool->nqueued++;
}

static void queue_remove(tc_pg_pool_t *pool, tc_pg_job_t *job)
{
  if (job->prev != NULL)
    job->prev->next = job->next;
  else
    pool->qhead = job->next;
  if (job->next != NULL)
    job->next->prev = job->prev;
  else
    pool->qtail = job->prev;
  job->prev = job->next = NULL;
  pool->nqueued--;
}

/* The deadline heap (common/txc_heap.h), keyed by deadline_ns. */
static int heap_push(tc_pg_pool_t *pool, tc_pg_job_t *job)
{
  return txc_heap_push(&pool->heap, &job->hnode, job->deadline_ns);
}

static void heap_remove(tc_pg_pool_t *pool, tc_pg_job_t *job)
{
  txc_heap_remove(&pool->heap, &job->hnode);
}

/* The job whose deadline comes first, or NULL. */
static tc_pg_job_t *heap_first(const tc_pg_pool_t *pool)
{
  txc_heap_node_t *n = txc_heap_min(&pool->heap);

  return n ? TXC_HEAP_ELEM(n, tc_pg_job_t, hnode) : NULL;
}

/* Take 'job' out of the queue and the heap. */
static void pool_unqueue(tc_pg_pool_t *pool, tc_pg_job_t *job)
{
  queue_remove(pool, job);
  heap_remove(pool, job);
}

/* ---- pool entry/exit, dispatch, deadlines ---- */

static void pool_enter(tc_pg_pool_t *pool)
{
  pool->depth++;
}

/* Leaving the outermost frame is the safe point to start queued jobs: no
 * user callback is on the stack any more. */
static void pool_leave(tc_pg_pool_t *pool)
{
  if (pool->depth == 1 && !pool->closing)
    pool_dispatch(pool);
  pool->depth--;
}

static void pool_on_deadline(uv_timer_t *timer);

/* Arm the pool timer for the earliest deadline, or stop it. */
static void pool_arm_deadline(tc_pg_pool_t *pool)
{
  uint64_t now, due;

  if (pool->closing)
    return;
  if (txc_heap_len(&pool->heap) == 0) {
    uv_timer_stop(&pool->deadline_timer);
    return;
  }
  now = uv_hrtime();
  due = heap_first(pool)->deadline_ns;
  /* Round up: firing a little late is fine, firing early only re-arms. */
  uv_timer_start(&pool->deadline_timer, pool_on_deadline,
                 due > now ? (due - now + 999999) / 1000000 : 0, 0);
}

static void pool_on_deadline(uv_timer_t *timer)
{
  tc_pg_pool_t *pool = timer->data;
  uint64_t now;

  pool_enter(pool);
  /* A connection that became ready in this iteration takes jobs first:
   * a deadline only bounds the wait for a connection. */
  pool_dispatch(pool);
  now = uv_hrtime();
  for (tc_pg_job_t *job; !pool->closing && (job = heap_first(pool)) != NULL && job->deadline_ns <= now;) {
    char msg[TC_PG_ERR_LEN + 64];

    pool_unqueue(pool, job);
    /* Say why no connection is up; if some are, they were all busy. */
    if (tc_pg_pool_ready(pool) == 0 && pool->last_err[0] != '\0')
      snprintf(msg, sizeof msg, "no connection available within %u ms: %s", job->deadline_ms,
               pool->last_err);
    else
      snprintf(msg, sizeof msg, "no connection available within %u ms", job->deadline_ms);
    tc__pg_job_set_error(job, msg, "", -1);
    tc__pg_job_complete(job, TC_PG_ENOCONN);
  }
  pool_arm_deadline(pool);
  pool_leave(pool);
}

static void pool_on_kick(uv_idle_t *idle)
{
  tc_pg_pool_t *pool = idle->data;

  uv_idle_stop(idle);
  pool_enter(pool);
  pool_leave(pool); /* dispatches */
}

static void conn_start_job(tc_pg_conn_t *c, tc_pg_job_t *job);

/* Start queued jobs on READY connections, in FIFO order.  Starting a job
 * can fail and run its callback, which may submit more jobs or close the
 * pool: the loop re-reads everything each time round. */
static void pool_dispatch(tc_pg_pool_t *pool)
{
  bool dequeued_deadline = false;

  while (!pool->closing && pool->qhead != NULL) {
    tc_pg_conn_t *c = NULL;
    tc_pg_job_t *job;
    int i;

    for (i = 0; i < pool->size; i++) {
      if (pool->conns[i].state == CONN_READY) {
        c = &pool->conns[i];
        break;
      }
    }
    if (c == NULL)
      break;
    job = pool->qhead;
    if (txc_heap_contains(&job->hnode))
      dequeued_deadline = true;
    pool_unqueue(pool, job);
    conn_start_job(c, job);
  }
  /* The timer may still point at a dispatched job; that is harmless (it
   * re-arms), but stop it when nothing is left so the loop can end. */
  if (dequeued_deadline && txc_heap_len(&pool->heap) == 0 && !pool->closing)
    uv_timer_stop(&pool->deadline_timer);
}

/* ---- handle bookkeeping and the end of the pool ---- */

static void free_list(char **list)
{
  if (list == NULL)
    return;
  for (char **p = list; *p != NULL; p++)
    free(*p);
  free(list);
}

static void pool_free(tc_pg_pool_t *pool)
{
  free_list(pool->hosts);
  free_list(pool->hostaddrs);
  free_list(pool->ports);
  txc_heap_free(&pool->heap);
  free(pool->conns);
  if (pool->parsed != NULL)
    PQconninfoFree(pool->parsed);
  free(pool->init_sql);
  free(pool->conninfo);
  free(pool);
}

/* Once closing and nothing is left open: call done, then free. */
static void pool_maybe_finish(tc_pg_pool_t *pool)
{
  void (*done)(void *arg);
  void *arg;

  if (!pool->closing || pool->open_handles > 0 || pool->pending_reqs > 0)
    return;
  done = pool->done;
  arg = pool->done_arg;
  pool->done = NULL;
  if (done != NULL)
    done(arg);
  pool_free(pool);
}

static void pool_handle_closed(tc_pg_pool_t *pool)
{
  pool->open_handles--;
  pool_maybe_finish(pool);
}

static void pool_handle_close_cb(uv_handle_t *handle)
{
  pool_handle_closed(handle->data);
}

static void conn_timer_close_cb(uv_handle_t *handle)
{
  tc_pg_conn_t *c = handle->data;

  pool_handle_closed(c->pool);
}

static void watch_close_cb(uv_handle_t *handle)
{
  tc_pg_watch_t *w = handle->data;
  tc_pg_pool_t *pool = w->pool;

  free(w);
  pool_handle_closed(pool);
}

/* Detach and close the connection's poll handle, if any.  Must run before
 * the socket is closed (PQfinish) or replaced. */
static void watch_close(tc_pg_conn_t *c)
{
  tc_pg_watch_t *w = c->watch;

  if (w == NULL)
    return;
  c->watch = NULL;
  w->conn = NULL;
  uv_close((uv_handle_t *)&w->poll, watch_close_cb);
}

/*
 * Watch the PGconn's current socket for 'events'.  A handle on another
 * descriptor is replaced.  'force' restarts the poll even if 'events' did
 * not change: used after PQconnectPoll, which may have swapped the socket
 * for another one with the same number.  Returns 0 or a libuv error.
 */
static int conn_watch(tc_pg_conn_t *c, int events, bool force)
{
  tc_pg_pool_t *pool = c->pool;
  tc_pg_watch_t *w = c->watch;
  int fd = PQsocket(c->pg);
  int rc;

  if (fd < 0)
    return UV_EBADF;
  if (w != NULL && w->fd != fd) {
    watch_close(c);
    w = NULL;
  }
  if (w == NULL) {
    w = malloc(sizeof *w);
    if (w == NULL)
      return UV_ENOMEM;
    rc = uv_poll_init_socket(pool->loop, &w->poll, fd);
    if (rc != 0) {
      /* A failed init leaves nothing registered with the loop. */
      free(w);
      return rc;
    }
    w->poll.data = w;
    w->pool = pool;
    w->conn = c;
    w->fd = fd;
    w->events = 0;
    pool->open_handles++;
    c->watch = w;
    force = true;
  }
  if (force || w->events != events) {
    rc = uv_poll_start(&w->poll, events, conn_on_poll);
    if (rc != 0)
      return rc;
    w->events = events;
  }
  return 0;
}

/* Close the poll handle, then the PGconn. */
static void conn_teardown(tc_pg_conn_t *c)
{
  c->nprepared = 0; /* prepared statements die with the session */
  c->must_deallocate = false;
  watch_close(c);
  if (c->pg != NULL) {
    PQfinish(c->pg);
    c->pg = NULL;
  }
  c->want_write = false;
}

static bool conn_is_up(const tc_pg_conn_t *c)
{
  return c->state == CONN_READY || c->state == CONN_BUSY || c->state == CONN_CLEANUP;
}

/* ---- connection failure and reconnection ---- */

/*
 * The connection is lost, or this attempt to open it failed ('why' says
 * why; it may point into the PGconn, so it is copied first).  Tear down,
 * schedule the next attempt, complete the in-flight job with
 * TC_PG_EBROKEN, then tell on_state.  The caller must return at once
 * afterwards: the callbacks may have closed the pool.
 */
static void conn_fail(tc_pg_conn_t *c, const char *why)
{
  tc_pg_pool_t *pool = c->pool;
  tc_pg_job_t *job = c->job;
  char err[TC_PG_ERR_LEN];

  tc__pg_copy_msg(err, sizeof err, why != NULL && why[0] != '\0' ? why : "connection lost");
  c->job = NULL;
  conn_teardown(c);
  tc__pg_copy_msg(pool->last_err, sizeof pool->last_err, err);

  if (c->backoff_ms == 0)
    c->backoff_ms = pool->reconnect_min_ms;
  else if (c->backoff_ms >= pool->reconnect_max_ms / 2)
    c->backoff_ms = pool->reconnect_max_ms;
  else
    c->backoff_ms *= 2;
  c->state = CONN_IDLE;
  uv_timer_start(&c->timer, conn_on_timer, c->backoff_ms, 0);

  if (job != NULL) {
    tc__pg_job_set_error(job, err, "", -1);
    tc__pg_job_complete(job, TC_PG_EBROKEN);
    if (pool->closing)
      return;
  }
  if (pool->on_state != NULL)
    pool->on_state(pool, c->index, false, err, pool->state_arg);
}

/* Flush the output buffer; watch for writability while libpq still has
 * data to send.  Returns 0, or -1 after conn_fail. */
static int conn_flush(tc_pg_conn_t *c)
{
  int r = PQflush(c->pg);

  if (r < 0) {
    conn_fail(c, PQerrorMessage(c->pg));
    return -1;
  }
  c->want_write = r == 1;
  if (conn_watch(c, UV_READABLE | (c->want_write ? UV_WRITABLE : 0), false) != 0) {
    conn_fail(c, "could not watch the connection's socket");
    return -1;
  }
  return 0;
}

/* Step 5: pipeline mode, READY, on_state(up). */
static void conn_ready(tc_pg_conn_t *c)
{
  tc_pg_pool_t *pool = c->pool;

  if (!PQenterPipelineMode(c->pg)) {
    conn_fail(c, PQerrorMessage(c->pg));
    return;
  }
  uv_timer_stop(&c->timer);
  c->state = CONN_READY;
  c->backoff_ms = 0;
  if (conn_watch(c, UV_READABLE, false) != 0) {
    conn_fail(c, "could not watch the connection's socket");
    return;
  }
  if (pool->on_state != NULL)
    pool->on_state(pool, c->index, true, NULL, pool->state_arg);
}

/*
 * The next result libpq has ready, for the drain loops below: false when
 * the caller must return (libpq needs more input, or the connection went
 * bad and conn_fail ran); true with '*res' (NULL: the end of one
 * statement's results).
 */
static bool conn_next_result(tc_pg_conn_t *c, PGresult **res)
{
  if (PQstatus(c->pg) == CONNECTION_BAD) {
    conn_fail(c, PQerrorMessage(c->pg));
    return false;
  }
  if (PQisBusy(c->pg))
    return false;
  *res = PQgetResult(c->pg);
  return true;
}

/* True, with 'res' cleared and the connection failed with 'why', when
 * 'res' starts a COPY: a pool never asks for one and cannot serve it. */
static bool conn_refused_copy(tc_pg_conn_t *c, PGresult *res, const char *why)
{
  ExecStatusType st = PQresultStatus(res);

  if (st != PGRES_COPY_IN && st != PGRES_COPY_OUT && st != PGRES_COPY_BOTH)
    return false;
  PQclear(res);
  conn_fail(c, why);
  return true;
}

/* Step 4: drain init_sql's results (simple protocol: one per statement,
 * then NULL). */
static void conn_drain_init(tc_pg_conn_t *c)
{
  for (;;) {
    PGresult *res;
    ExecStatusType st;

    if (!conn_next_result(c, &res))
      return;
    if (res == NULL)
      break;
    st = PQresultStatus(res);
    if (conn_refused_copy(c, res, "could not run init_sql: COPY is not supported"))
      return;
    if ((st == PGRES_FATAL_ERROR || st == PGRES_BAD_RESPONSE) && !c->init_failed) {
      const char *msg = PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY);
      char tmp[TC_PG_ERR_LEN - 32]; /* leaves room for the prefix */

      tc__pg_copy_msg(tmp, sizeof tmp, msg != NULL ? msg : PQresultErrorMessage(res));
      snprintf(c->init_err, sizeof c->init_err, "could not run init_sql: %s", tmp);
      c->init_failed = true;
    }
    PQclear(res);
  }
  if (c->init_failed) {
    conn_fail(c, c->init_err);
    return;
  }
  conn_ready(c);
}

/* ---- several hosts ---- */

/* Entry 'i' of 'list' (NULL or "" when the conninfo does not give it). */
static const char *list_at(char **list, int n, int i)
{
  if (list == NULL)
    return NULL;
  return list[n == 1 ? 0 : i];
}

/*
 * The position, in the order of the current attempt (the list rotated to
 * begin at c->first_host), of the host libpq is on; -1 if it cannot be
 * told.  PQhost gives the host, or the hostaddr when there is no host.
 */
static int conn_host_index(const tc_pg_conn_t *c)
{
  const tc_pg_pool_t *pool = c->pool;
  const char *h = PQhost(c->pg), *p = PQport(c->pg);
  int n = pool->nhosts;

  if (h == NULL)
    return -1;
  for (int k = 0; k < n; k++) {
    int i = (c->first_host + k) % n;
    const char *name = list_at(pool->hosts, n, i);
    const char *port = list_at(pool->ports, pool->nport, i);

    if (name == NULL || name[0] == '\0')
      name = list_at(pool->hostaddrs, n, i);
    if (name == NULL || strcmp(name, h) != 0)
      continue;
    if (p != NULL && p[0] != '\0' && port != NULL && port[0] != '\0' && strcmp(port, p) != 0)
      continue;
    return k;
  }
  return -1;
}

/* After a PQconnectPoll with several hosts: restart the timer when libpq
 * moved on to another host, so that each host has the whole timeout. */
static void conn_track_host(tc_pg_conn_t *c)
{
  int k;

  if (c->pool->nhosts < 2)
    return;
  k = conn_host_index(c);
  if (k >= 0 && k != c->cur_host) {
    c->cur_host = k;
    uv_timer_start(&c->timer, conn_on_timer, c->pool->connect_timeout_ms, 0);
  }
}

static void conn_start(tc_pg_conn_t *c, const char *hostaddr);

/*
 * The connect timeout fired on host c->cur_host of a list.  Give up on
 * that host: start again at once with the list rotated to begin after it,
 * unless every host of the list timed out in this round, then fail as
 * usual (backoff).  Returns whether it started again.
 */
static bool conn_skip_host(tc_pg_conn_t *c)
{
  tc_pg_pool_t *pool = c->pool;
  int k = c->cur_host >= 0 ? c->cur_host : 0;

  c->first_host = (c->first_host + k + 1) % pool->nhosts;
  if (++c->host_timeouts >= pool->nhosts) {
    c->host_timeouts = 0;
    return false;
  }
  conn_teardown(c);
  conn_start(c, NULL);
  return true;
}

/* Step 3 done: PQconnectPoll said OK. */
static void conn_connected(tc_pg_conn_t *c)
{
  tc_pg_pool_t *pool = c->pool;

  if (pool->nhosts >= 2) {
    /* The next attempt begins with the host that answered. */
    int k = conn_host_index(c);

    if (k >= 0)
      c->first_host = (c->first_host + k) % pool->nhosts;
    c->cur_host = -1;
    c->host_timeouts = 0;
  }

  if (PQsetnonblocking(c->pg, 1) != 0) {
    conn_fail(c, PQerrorMessage(c->pg));
    return;
  }
  if (pool->init_sql == NULL) {
    conn_ready(c);
    return;
  }
  if (!PQsendQuery(c->pg, pool->init_sql)) {
    conn_fail(c, PQerrorMessage(c->pg));
    return;
  }
  c->state = CONN_INIT;
  c->init_failed = false;
  if (conn_flush(c) != 0)
    return;
  conn_drain_init(c);
}

/* Step 3: one PQconnectPoll, then watch whatever it asks for. */
static void conn_connect_step(tc_pg_conn_t *c)
{
  int events;

  switch (PQconnectPoll(c->pg)) {
  case PGRES_POLLING_OK:
    conn_connected(c);
    return;
  case PGRES_POLLING_READING:
    events = UV_READABLE;
    break;
  case PGRES_POLLING_WRITING:
  case PGRES_POLLING_ACTIVE:
    events = UV_WRITABLE;
    break;
  case PGRES_POLLING_FAILED:
  default:
    conn_fail(c, PQerrorMessage(c->pg));
    return;
  }
  conn_track_host(c);
  if (conn_watch(c, events, true) != 0)
    conn_fail(c, "could not watch the connection's socket");
}

/*
 * Step 3 begins.  'hostaddr' is the resolved address of the conninfo's
 * host (step 2), or NULL to hand the conninfo to libpq as it is.
 */
/* 'list' (n entries) joined with commas, beginning at entry 'first';
 * NULL on allocation failure. */
static char *join_rotated(char **list, int n, int first)
{
  size_t len = 1;
  char *out, *p;

  for (int i = 0; i < n; i++)
    len += strlen(list[i]) + 1;
  out = malloc(len);
  if (out == NULL)
    return NULL;
  p = out;
  for (int k = 0; k < n; k++) {
    const char *e = list[(first + k) % n];
    size_t l = strlen(e);

    if (k > 0)
      *p++ = ',';
    memcpy(p, e, l);
    p += l;
  }
  *p = '\0';
  return out;
}

/*
 * PQconnectStartParams with the parsed conninfo, 'hostaddr' instead of its
 * hostaddr (step 2), or with its host lists rotated to begin at
 * c->first_host.  NULL on allocation failure.
 */
static PGconn *start_params(tc_pg_conn_t *c, const char *hostaddr)
{
  tc_pg_pool_t *pool = c->pool;
  const char **keys = NULL, **vals = NULL;
  char *rot[3] = {NULL, NULL, NULL};
  size_t n = 0, i = 0;
  PQconninfoOption *o;
  PGconn *pg = NULL;
  bool rotate = hostaddr == NULL;

  if (rotate) {
    if (pool->hosts != NULL && (rot[0] = join_rotated(pool->hosts, pool->nhosts, c->first_host)) == NULL)
      goto out;
    if (pool->hostaddrs != NULL &&
        (rot[1] = join_rotated(pool->hostaddrs, pool->nhosts, c->first_host)) == NULL)
      goto out;
    if (pool->ports != NULL && pool->nport > 1 &&
        (rot[2] = join_rotated(pool->ports, pool->nport, c->first_host)) == NULL)
      goto out;
  }
  for (o = pool->parsed; o->keyword != NULL; o++)
    n++;
  keys = calloc(n + 2, sizeof *keys);
  vals = calloc(n + 2, sizeof *vals);
  if (keys == NULL || vals == NULL)
    goto out;
  for (o = pool->parsed; o->keyword != NULL; o++) {
    const char *v = o->val;

    if (v == NULL)
      continue;
    if (strcmp(o->keyword, "hostaddr") == 0) {
      if (!rotate)
        continue; /* given below */
      v = rot[1] != NULL ? rot[1] : v;
    } else if (rotate && strcmp(o->keyword, "host") == 0 && rot[0] != NULL) {
      v = rot[0];
    } else if (rotate && strcmp(o->keyword, "port") == 0 && rot[2] != NULL) {
      v = rot[2];
    }
    keys[i] = o->keyword;
    vals[i] = v;
    i++;
  }
  if (!rotate) {
    keys[i] = "hostaddr";
    vals[i] = hostaddr;
  }
  pg = PQconnectStartParams(keys, vals, 0);
out:
  free(keys);
  free(vals);
  for (int k = 0; k < 3; k++)
    free(rot[k]);
  return pg;
}

static void conn_start(tc_pg_conn_t *c, const char *hostaddr)
{
  tc_pg_pool_t *pool = c->pool;
  PGconn *pg;

  c->cur_host = -1;
  if (hostaddr != NULL || (pool->nhosts >= 2 && c->first_host != 0))
    pg = start_params(c, hostaddr);
  else
    pg = PQconnectStart(pool->conninfo);
  if (pg == NULL) {
    conn_fail(c, "out of memory");
    return;
  }
  c->pg = pg;
  PQsetNoticeReceiver(pg, notice_ignore, NULL);
  if (PQstatus(pg) == CONNECTION_BAD) {
    conn_fail(c, PQerrorMessage(pg));
    return;
  }
  c->state = CONN_CONNECTING;
  uv_timer_start(&c->timer, conn_on_timer, pool->connect_timeout_ms, 0);
  /* libpq: after PQconnectStart, behave as if PQconnectPoll had returned
   * PGRES_POLLING_WRITING. */
  if (conn_watch(c, UV_WRITABLE, true) != 0)
    conn_fail(c, "could not watch the connection's socket");
}

static void conn_on_resolved(uv_getaddrinfo_t *req, int status, struct addrinfo *res)
{
  tc_pg_conn_t *c = req->data;
  tc_pg_pool_t *pool = c->pool;
  char addr[INET6_ADDRSTRLEN];
  char msg[TC_PG_ERR_LEN];
  int rc = status;

  c->gai_pending = false;
  pool->pending_reqs--;
  if (pool->closing || c->state != CONN_RESOLVING) {
    uv_freeaddrinfo(res);
    pool_maybe_finish(pool);
    return;
  }
  if (rc == 0 && res == NULL)
    rc = UV_EAI_NONAME;
  if (rc == 0) {
    if (res->ai_family == AF_INET6)
      rc = uv_ip6_name((const struct sockaddr_in6 *)(const void *)res->ai_addr, addr, sizeof addr);
    else
      rc = uv_ip4_name((const struct sockaddr_in *)(const void *)res->ai_addr, addr, sizeof addr);
  }
  uv_freeaddrinfo(res);

  pool_enter(pool);
  if (rc != 0) {
    snprintf(msg, sizeof msg, "could not resolve host \"%s\": %s", pool->resolve_host,
             uv_strerror(rc));
    conn_fail(c, msg);
  } else {
    conn_start(c, addr);
  }
  pool_leave(pool);
}

/* Step 1 -> 2 or 3. */
static void conn_connect(tc_pg_conn_t *c)
{
  tc_pg_pool_t *pool = c->pool;
  struct addrinfo hints;
  char msg[TC_PG_ERR_LEN];
  int rc;

  if (pool->resolve_host == NULL) {
    conn_start(c, NULL);
    return;
  }
  memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  c->gai.data = c;
  c->state = CONN_RESOLVING;
  rc = uv_getaddrinfo(pool->loop, &c->gai, conn_on_resolved, pool->resolve_host, NULL, &hints);
  if (rc != 0) {
    snprintf(msg, sizeof msg, "could not resolve host \"%s\": %s", pool->resolve_host,
             uv_strerror(rc));
    conn_fail(c, msg);
    return;
  }
  c->gai_pending = true;
  pool->pending_reqs++;
}

static void conn_on_timer(uv_timer_t *timer)
{
  tc_pg_conn_t *c = timer->data;
  tc_pg_pool_t *pool = c->pool;

  pool_enter(pool);
  if (c->state == CONN_IDLE) {
    conn_connect(c);
  } else if (c->state == CONN_CONNECTING || c->state == CONN_INIT) {
    /* The connect timeout covers the session's init statements too; only
     * a connection still being made can move on to the next host. */
    bool next_host = c->state == CONN_CONNECTING && pool->nhosts >= 2 && conn_skip_host(c);
    if (!next_host)
      conn_fail(c, "timeout expired while connecting");
  }
  pool_leave(pool);
}

/* ---- jobs on a connection ---- */

/* Step 6: send the whole job as one pipeline segment. */
static bool conn_has_prepared(const tc_pg_conn_t *c, const char *name)
{
  for (int i = 0; i < c->nprepared; i++)
    if (strcmp(c->prepared[i], name) == 0)
      return true;
  return false;
}

static void conn_start_job(tc_pg_conn_t *c, tc_pg_job_t *job)
{
  PGconn *pg = c->pg;
  bool txn = (job->flags & TC_PG_JOB_TXN) != 0;
  bool ok = true;
  int i, n = 0;

  c->job = job;
  c->state = CONN_BUSY;
  job->item = 0;
  free(job->items);
  job->items = malloc(((size_t)job->nstmts * 2 + 3) * sizeof(int));
  if (job->items == NULL) {
    conn_fail(c, "out of memory");
    return;
  }
  if (c->must_deallocate) {
    ok = PQsendQueryParams(pg, "DEALLOCATE ALL", 0, NULL, NULL, NULL, NULL, 0) == 1;
    job->items[n++] = TC_PG_ITEM_OTHER;
    c->must_deallocate = false;
    c->nprepared = 0;
  }
  if (ok && txn) {
    ok = PQsendQueryParams(pg, "BEGIN", 0, NULL, NULL, NULL, NULL, 0) == 1;
    job->items[n++] = TC_PG_ITEM_OTHER;
  }
  for (i = 0; ok && i < job->nstmts; i++) {
    const tc_pg_stmt_t *s = &job->stmts[i];

    if (s->name == NULL) {
      ok = PQsendQueryParams(pg, s->sql, s->nparams, NULL, (const char *const *)s->values, NULL,
                             NULL, 0) == 1;
      job->items[n++] = i;
      continue;
    }
    /* Prepared once per session: the parse and plan of the call are paid
     * once, not in every batch. */
    if (!conn_has_prepared(c, s->name) && c->nprepared < TC_PG_MAX_PREPARED) {
      ok = PQsendPrepare(pg, s->name, s->sql, s->nparams, NULL) == 1;
      job->items[n++] = TC_PG_ITEM_PREPARE_BASE - i;
      c->prepared[c->nprepared++] = s->name;
    }
    if (ok && conn_has_prepared(c, s->name)) {
      ok = PQsendQueryPrepared(pg, s->name, s->nparams, (const char *const *)s->values, NULL, NULL,
                               0) == 1;
    } else if (ok) { /* no room for another prepared statement */
      ok = PQsendQueryParams(pg, s->sql, s->nparams, NULL, (const char *const *)s->values, NULL,
                             NULL, 0) == 1;
    }
    job->items[n++] = i;
  }
  if (ok && txn) {
    ok = PQsendQueryParams(pg, "COMMIT", 0, NULL, NULL, NULL, NULL, 0) == 1;
    job->items[n++] = TC_PG_ITEM_OTHER;
  }
  job->nitems = n;
  if (ok)
    ok = PQpipelineSync(pg) == 1;
  if (!ok) {
    /* Part of the segment may have reached the server: outcome unknown. */
    conn_fail(c, PQerrorMessage(pg));
    return;
  }
  if (conn_flush(c) != 0)
    return;
  /* While its write would block, libpq reads what the server sent: those
   * results may already sit in its buffer, with no readability to come. */
  conn_drain_pipeline(c);
}

/* File one result of the in-flight job under its pipeline item. */
static void job_take_result(tc_pg_job_t *job, PGresult *res)
{
  int kind = job->item >= 0 && job->item < job->nitems ? job->items[job->item] : TC_PG_ITEM_OTHER;
  int idx = kind >= 0 ? kind : kind <= TC_PG_ITEM_PREPARE_BASE ? TC_PG_ITEM_PREPARE_BASE - kind : -1;
  bool is_stmt = kind >= 0 && kind < job->nstmts;

  switch (PQresultStatus(res)) {
  case PGRES_FATAL_ERROR:
  case PGRES_BAD_RESPONSE:
  case PGRES_NONFATAL_ERROR:
    tc__pg_job_set_error_from_result(job, res, idx);
    PQclear(res);
    break;
  case PGRES_PIPELINE_ABORTED:
    PQclear(res);
    break;
  default:
    if (is_stmt) {
      if (job->stmts[idx].res != NULL)
        PQclear(job->stmts[idx].res);
      job->stmts[idx].res = res;
    } else {
      PQclear(res); /* BEGIN, COMMIT, DEALLOCATE, a Prepare */
    }
    break;
  }
}

/*
 * The Sync of the segment in flight came back.  In CLEANUP, the ROLLBACK
 * is done.  In BUSY, the job is finished: decide what the connection does
 * next (READY, CLEANUP or failed) before running the callback, so that the
 * pool is consistent whatever the callback does.
 */
static void conn_sync_done(tc_pg_conn_t *c)
{
  tc_pg_job_t *job = c->job;
  PGTransactionStatusType ts = PQtransactionStatus(c->pg);
  int status;

  if (c->state == CONN_CLEANUP) {
    if (ts != PQTRANS_IDLE) {
      conn_fail(c, "could not roll back the transaction a job left open");
      return;
    }
    c->state = CONN_READY;
    return;
  }

  c->job = NULL;
  status = job->has_error ? TC_PG_ESTMT : TC_PG_OK;
  /* After an error, which Prepares took effect is unclear: start over. */
  if (job->has_error && c->nprepared > 0)
    c->must_deallocate = true;
  if (PQstatus(c->pg) == CONNECTION_BAD) {
    conn_fail(c, PQerrorMessage(c->pg));
  } else if (job->has_error && strcmp(job->sqlstate, "25006") == 0) {
    /* A standby (NOTES): find the primary.  With a host list, the next
     * attempt begins after this host, so that a conninfo without
     * target_session_attrs=read-write does not come straight back. */
    if (c->pool->nhosts >= 2)
      c->first_host = (c->first_host + 1) % c->pool->nhosts;
    conn_fail(c, "the server is read-only (a standby?): reconnecting");
  } else if (ts == PQTRANS_IDLE) {
    c->state = CONN_READY;
  } else if (ts == PQTRANS_INTRANS || ts == PQTRANS_INERROR) {
    c->state = CONN_CLEANUP;
    if (PQsendQueryParams(c->pg, "ROLLBACK", 0, NULL, NULL, NULL, NULL, 0) != 1 ||
        PQpipelineSync(c->pg) != 1)
      conn_fail(c, PQerrorMessage(c->pg));
    else if (conn_flush(c) == 0) /* on failure conn_fail has run */
      conn_drain_pipeline(c);    /* as in conn_start_job */
  } else {
    conn_fail(c, "unexpected transaction status after a job");
  }
  /* The job's outcome is known whatever happened to the connection since. */
  tc__pg_job_complete(job, status);
}

/*
 * Read every result libpq has ready for the segment in flight (BUSY or
 * CLEANUP).  Returns when libpq needs more input, after the Sync, or after
 * conn_fail.
 */
static void conn_drain_pipeline(tc_pg_conn_t *c)
{
  int nulls = 0;

  for (;;) {
    PGresult *res;
    ExecStatusType st;

    if (!conn_next_result(c, &res))
      return;
    if (res == NULL) {
      /* One NULL ends each statement's results.  Two in a row would mean
       * libpq has nothing queued before our Sync: that must not happen,
       * and looping on it would spin forever. */
      if (++nulls > 1) {
        conn_fail(c, "unexpected end of pipeline results");
        return;
      }
      if (c->job != NULL)
        c->job->item++;
      continue;
    }
    nulls = 0;
    st = PQresultStatus(res);
    if (st == PGRES_PIPELINE_SYNC) {
      PQclear(res);
      conn_sync_done(c);
      return;
    }
    if (conn_refused_copy(c, res, "COPY is not supported in a job"))
      return;
    if (c->job != NULL)
      job_take_result(c->job, res);
    else
      PQclear(res); /* ROLLBACK in CLEANUP: its status is checked at Sync */
  }
}

/* The socket is readable and/or writable, in steps 4-7. */
static void conn_io(tc_pg_conn_t *c, int events)
{
  PGnotify *n;

  if (c->want_write && (events & UV_WRITABLE) && conn_flush(c) != 0)
    return;
  if (!PQconsumeInput(c->pg)) {
    conn_fail(c, PQerrorMessage(c->pg));
    return;
  }
  while ((n = PQnotifies(c->pg)) != NULL)
    PQfreemem(n);
  switch (c->state) {
  case CONN_INIT:
    conn_drain_init(c);
    break;
  case CONN_BUSY:
  case CONN_CLEANUP:
    conn_drain_pipeline(c);
    break;
  case CONN_READY:
    if (PQstatus(c->pg) == CONNECTION_BAD)
      conn_fail(c, PQerrorMessage(c->pg));
    break;
  default:
    break;
  }
}

static void conn_on_poll(uv_poll_t *handle, int status, int events)
{
  tc_pg_watch_t *w = handle->data;
  tc_pg_conn_t *c = w->conn;
  tc_pg_pool_t *pool;

  if (c == NULL || c->pg == NULL)
    return; /* closing */
  pool = c->pool;
  pool_enter(pool);
  if (status < 0) {
    /* libuv reports POLLERR (a refused connect, a reset) as UV_EBADF and
     * stops the handle.  libpq can say what really happened: let it look
     * (PQconnectPoll reads SO_ERROR, PQconsumeInput the recv error). */
    w->events = 0;
    if (c->state == CONN_CONNECTING) {
      conn_connect_step(c); /* re-arms the poll or fails */
    } else {
      conn_io(c, UV_READABLE);
      if (!pool->closing && c->watch == w) {
        char msg[TC_PG_ERR_LEN];

        snprintf(msg, sizeof msg, "could not poll the connection's socket: %s",
                 uv_strerror(status));
        conn_fail(c, msg);
      }
    }
  } else if (c->state == CONN_CONNECTING) {
    conn_connect_step(c);
  } else {
    conn_io(c, events);
  }
  pool_leave(pool);
}

/* ---- pool API ---- */

/* Decide at creation whether step 2 (resolving on the thread pool) applies:
 * exactly one host, given by name, and no hostaddr. */
static const char *pick_resolve_host(const PQconninfoOption *opts)
{
  const char *host = NULL, *hostaddr = NULL;
  const PQconninfoOption *o;
  unsigned char buf[sizeof(struct in6_addr)];

  for (o = opts; o->keyword != NULL; o++) {
    if (strcmp(o->keyword, "host") == 0)
      host = o->val;
    else if (strcmp(o->keyword, "hostaddr") == 0)
      hostaddr = o->val;
  }
  if (host == NULL || host[0] == '\0' || host[0] == '/' || host[0] == '@')
    return NULL;
  if (hostaddr != NULL && hostaddr[0] != '\0')
    return NULL;
  if (strchr(host, ',') != NULL)
    return NULL;
  if (inet_pton(AF_INET, host, buf) == 1 || inet_pton(AF_INET6, host, buf) == 1)
    return NULL;
  return host;
}

/* 'v' split at the commas into a NULL-terminated array (*n entries);
 * NULL with *n 0 for NULL or "", NULL with *n -1 on allocation failure. */
static char **split_list(const char *v, int *n)
{
  int cnt = 1, k = 0;
  char **out;
  const char *p;

  *n = 0;
  if (v == NULL || v[0] == '\0')
    return NULL;
  for (p = v; *p != '\0'; p++)
    if (*p == ',')
      cnt++;
  out = calloc((size_t)cnt + 1, sizeof *out);
  if (out == NULL)
    goto fail;
  for (p = v;; k++) {
    const char *e = strchr(p, ',');
    size_t l = e != NULL ? (size_t)(e - p) : strlen(p);

    out[k] = malloc(l + 1);
    if (out[k] == NULL)
      goto fail;
    memcpy(out[k], p, l);
    out[k][l] = '\0';
    if (e == NULL)
      break;
    p = e + 1;
  }
  *n = cnt;
  return out;
fail:
  free_list(out);
  *n = -1;
  return NULL;
}

/* Several hosts (NOTES): keep the conninfo's lists when it has two hosts
 * or more.  Returns 0, or -1 on allocation failure. */
static int pick_hosts(tc_pg_pool_t *pool)
{
  const char *host = NULL, *hostaddr = NULL, *port = NULL;
  int nh, na, np;

  for (const PQconninfoOption *o = pool->parsed; o->keyword != NULL; o++) {
    if (strcmp(o->keyword, "host") == 0)
      host = o->val;
    else if (strcmp(o->keyword, "hostaddr") == 0)
      hostaddr = o->val;
    else if (strcmp(o->keyword, "port") == 0)
      port = o->val;
  }
  pool->hosts = split_list(host, &nh);
  pool->hostaddrs = split_list(hostaddr, &na);
  pool->ports = split_list(port, &np);
  if (nh < 0 || na < 0 || np < 0)
    return -1;
  pool->nhosts = nh > na ? nh : na;
  pool->nport = np;
  /* libpq refuses lists of different lengths; then connecting fails the
   * usual way, without rotation. */
  if (pool->nhosts < 2 || (nh != 0 && na != 0 && nh != na) || (np > 1 && np != pool->nhosts)) {
    free_list(pool->hosts);
    free_list(pool->hostaddrs);
    free_list(pool->ports);
    pool->hosts = pool->hostaddrs = pool->ports = NULL;
    pool->nhosts = pool->nport = 0;
  }
  return 0;
}

static unsigned pick_connect_timeout(const PQconninfoOption *opts)
{
  const PQconninfoOption *o;

  for (o = opts; o->keyword != NULL; o++) {
    if (strcmp(o->keyword, "connect_timeout") == 0 && o->val != NULL) {
      long s = strtol(o->val, NULL, 10);

      if (s <= 0)
        break;
      if (s < 2)
        s = 2; /* libpq's own minimum */
      if (s > 3600)
        s = 3600;
      return (unsigned)s * 1000u;
    }
  }
  return TC_PG_DEFAULT_CONNECT_TIMEOUT_MS;
}

static char *dup_str(const char *s)
{
  size_t n = strlen(s) + 1;
  char *d = malloc(n);

  if (d != NULL)
    memcpy(d, s, n);
  return d;
}

tc_pg_pool_t *tc_pg_pool_new(uv_loop_t *loop, const tc_pg_pool_opts_t *opts)
{
  tc_pg_pool_t *pool;
  char *perr = NULL;
  int i;

  if (loop == NULL || opts == NULL || opts->conninfo == NULL)
    return NULL;
  if (opts->size < 0 || opts->size > TC_PG_MAX_SIZE)
    return NULL;

  pool = calloc(1, sizeof *pool);
  if (pool == NULL)
    goto fail_pool;
  pool->loop = loop;
  pool->size = opts->size > 0 ? opts->size : TC_PG_DEFAULT_SIZE;
  pool->max_queue = opts->max_queue > 0 ? opts->max_queue : TC_PG_DEFAULT_MAX_QUEUE;
  pool->reconnect_min_ms =
    opts->reconnect_min_ms > 0 ? opts->reconnect_min_ms : TC_PG_DEFAULT_RECONNECT_MIN_MS;
  pool->reconnect_max_ms =
    opts->reconnect_max_ms > 0 ? opts->reconnect_max_ms : TC_PG_DEFAULT_RECONNECT_MAX_MS;
  if (pool->reconnect_max_ms < pool->reconnect_min_ms)
    pool->reconnect_max_ms = pool->reconnect_min_ms;
  pool->on_state = opts->on_state;
  pool->state_arg = opts->state_arg;

  pool->conninfo = dup_str(opts->conninfo);
  if (pool->conninfo == NULL)
    goto fail_conninfo;
  if (opts->init_sql != NULL && opts->init_sql[0] != '\0') {
    pool->init_sql = dup_str(opts->init_sql);
    if (pool->init_sql == NULL)
      goto fail_init_sql;
  }
  /* A conninfo libpq cannot parse is a bad option: refuse it now rather
   * than fail every connection attempt forever. */
  pool->parsed = PQconninfoParse(pool->conninfo, &perr);
  if (pool->parsed == NULL)
    goto fail_parse;
  pool->resolve_host = pick_resolve_host(pool->parsed);
  pool->connect_timeout_ms = pick_connect_timeout(pool->parsed);
  if (pick_hosts(pool) != 0)
    goto fail_hosts;
  pool->conns = calloc((size_t)pool->size, sizeof *pool->conns);
  if (pool->conns == NULL)
    goto fail_conns;

  /* Nothing below can fail: uv_timer_init and uv_idle_init only fill in
   * the handle.  Handles are not initialized before this point because
   * once they are, the pool can only be freed from close callbacks. */
  uv_timer_init(loop, &pool->deadline_timer);
  pool->deadline_timer.data = pool;
  uv_idle_init(loop, &pool->kick);
  pool->kick.data = pool;
  pool->open_handles = 2;
  for (i = 0; i < pool->size; i++) {
    tc_pg_conn_t *c = &pool->conns[i];

    c->pool = pool;
    c->index = i;
    c->state = CONN_IDLE;
    c->cur_host = -1;
    uv_timer_init(loop, &c->timer);
    c->timer.data = c;
    pool->open_handles++;
    /* Connect from the loop, so on_state never runs inside this call. */
    uv_timer_start(&c->timer, conn_on_timer, 0, 0);
  }
  return pool;

fail_conns:
fail_hosts:
  free_list(pool->hosts);
  free_list(pool->hostaddrs);
  free_list(pool->ports);
  PQconninfoFree(pool->parsed);
fail_parse:
  if (perr != NULL)
    PQfreemem(perr);
  free(pool->init_sql);
fail_init_sql:
  free(pool->conninfo);
fail_conninfo:
  free(pool);
fail_pool:
  return NULL;
}

void tc_pg_pool_close(tc_pg_pool_t *pool, void (*done)(void *arg), void *arg)
{
  tc_pg_job_t *inflight = NULL;
  tc_pg_job_t *job;
  int i;

  if (pool == NULL || pool->closing)
    return;
  pool->closing = true;
  pool->done = done;
  pool->done_arg = arg;
  pool_enter(pool);

  /* First stop all I/O, so that nothing below can be called back. */
  for (i = 0; i < pool->size; i++) {
    tc_pg_conn_t *c = &pool->conns[i];

    if (c->job != NULL) {
      c->job->next = inflight;
      inflight = c->job;
      c->job = NULL;
    }
    if (c->gai_pending)
      (void)uv_cancel((uv_req_t *)&c->gai); /* its callback runs either way */
    conn_teardown(c);
    c->state = CONN_CLOSED;
    uv_close((uv_handle_t *)&c->timer, conn_timer_close_cb);
  }
  uv_close((uv_handle_t *)&pool->deadline_timer, pool_handle_close_cb);
  uv_close((uv_handle_t *)&pool->kick, pool_handle_close_cb);

  /* Then complete every job.  Callbacks that submit get TC_PG_ECLOSING. */
  while ((job = inflight) != NULL) {
    inflight = job->next;
    job->next = NULL;
    tc__pg_job_set_error(job, "connection pool is closing", "", -1);
    tc__pg_job_complete(job, TC_PG_ECLOSING);
  }
  while ((job = pool->qhead) != NULL) {
    pool_unqueue(pool, job);
    tc__pg_job_set_error(job, "connection pool is closing", "", -1);
    tc__pg_job_complete(job, TC_PG_ECLOSING);
  }
  pool_leave(pool);
  /* done() runs from the last close callback, never from here. */
}

/* Connections that are up: in pipeline mode, idle or running a job. */
int tc_pg_pool_ready(const tc_pg_pool_t *pool)
{
  int i, n = 0;

  if (pool == NULL || pool->closing)
    return 0;
  for (i = 0; i < pool->size; i++)
    if (conn_is_up(&pool->conns[i]))
      n++;
  return n;
}

size_t tc_pg_pool_queued(const tc_pg_pool_t *pool)
{
  return pool != NULL ? pool->nqueued : 0;
}

/* ---- submitting ---- */

int tc_pg_submit(tc_pg_pool_t *pool, tc_pg_job_t *job, unsigned deadline_ms)
{
  if (pool == NULL || job == NULL)
    return TC_PG_EFULL;
  if (pool->closing)
    return TC_PG_ECLOSING;
  if (pool->nqueued >= pool->max_queue)
    return TC_PG_EFULL;
  job->submit_ns = uv_hrtime();
  job->deadline_ms = deadline_ms;
  job->deadline_ns = deadline_ms > 0 ? job->submit_ns + (uint64_t)deadline_ms * 1000000u : 0;
  if (deadline_ms > 0 && heap_push(pool, job) != 0)
    return TC_PG_EFULL; /* out of memory is a kind of full */
  queue_push(pool, job);
  if (txc_heap_contains(&job->hnode) && job->hnode.idx == 0)
    pool_arm_deadline(pool);
  /* Dispatch later, never here: the job's callback must not run inside
   * this call.  Inside a pool callback, pool_leave does it; otherwise the
   * idle handle runs it on the next loop iteration. */
  if (pool->depth == 0)
    uv_idle_start(&pool->kick, pool_on_kick);
  return 0;
}
