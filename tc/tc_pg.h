/*
 * tc_pg.h - asynchronous PostgreSQL on the libuv loop: a small pool of
 * non-blocking libpq connections, each driven by a uv_poll_t on its socket.
 *
 * NOTES
 *   Nothing here blocks the loop: connections are opened with
 *   PQconnectStart/PQconnectPoll, queries are sent with PQsendQueryParams in
 *   pipeline mode, flushed with PQflush while the socket is writable, and read
 *   with PQconsumeInput/PQisBusy/PQgetResult when it is readable.  The socket
 *   can change across PQconnectPoll/PQresetPoll, so the poll handle is
 *   re-created after each of them.
 *
 *   A "job" is a list of statements sent as one pipeline.  With
 *   TC_PG_JOB_TXN the pool wraps them in BEGIN ... COMMIT, so a job is one
 *   PostgreSQL transaction: one round trip and one fsync however many
 *   statements it holds (this is what group commit is built on).  If any
 *   statement fails, the transaction is rolled back and the job's callback
 *   sees the error of the first failing statement.
 *
 *   Jobs wait in a bounded FIFO until a connection is free.  A connection
 *   that breaks is closed and reconnected with backoff; jobs that were in
 *   flight on it complete with TC_PG_EBROKEN ("outcome unknown" for a
 *   transaction whose COMMIT was sent: the caller must re-read, never
 *   assume).  The pool never retries a job by itself.
 *
 *   Thread: everything runs on the loop thread that owns the pool.
 */
#ifndef TC_PG_H
#define TC_PG_H

#include <libpq-fe.h>
#include <stdbool.h>
#include <stddef.h>
#include <uv.h>

typedef struct tc_pg_pool tc_pg_pool_t;
typedef struct tc_pg_job tc_pg_job_t;

/* The pool's codes, in a range of their own (not -errno's, not the
 * protocol's -10000..-10299, not librmclient's): they reach the callers of
 * tc_store_read, where a code must mean one thing. */
enum {
  TC_PG_OK = 0,
  TC_PG_ESTMT = -10500,    /* a statement failed: see tc_pg_job_error()/sqlstate */
  TC_PG_EBROKEN = -10501,  /* connection lost while the job was in flight: outcome unknown */
  TC_PG_ENOCONN = -10502,  /* no connection could be had before the job's deadline */
  TC_PG_EFULL = -10503,    /* queue full: the job was not accepted */
  TC_PG_ECLOSING = -10504, /* pool closing */
};

enum {
  TC_PG_JOB_TXN = 1u << 0, /* wrap the statements in BEGIN ... COMMIT */
};

/*
 * Called once per job, on the loop thread.  'status' is TC_PG_OK or one of
 * the codes above.  On TC_PG_OK, tc_pg_job_result(job, i) is the result of
 * statement i (owned by the job; valid until the callback returns).  The job
 * is freed after the callback returns.
 */
typedef void (*tc_pg_job_cb)(tc_pg_job_t *job, int status, void *arg);

typedef struct tc_pg_pool_opts {
  const char *conninfo;      /* libpq URL or key=value string; copied */
  int size;                  /* connections, default 4 */
  size_t max_queue;          /* queued jobs, default 4096 */
  unsigned reconnect_min_ms; /* backoff, default 100 */
  unsigned reconnect_max_ms; /* default 5000 */
  /* Optional: called on the loop thread when a connection becomes ready
   * (e.g. to SET session settings) and when one is lost; may be NULL. */
  void (*on_state)(tc_pg_pool_t *pool, int conn_index, bool up, const char *err, void *arg);
  void *state_arg;
  /* Optional: statements run on each new connection before it takes jobs. */
  const char *init_sql;
} tc_pg_pool_opts_t;

/* Create the pool and start connecting.  Returns NULL on bad options or
 * allocation failure.  'opts' is copied. */
tc_pg_pool_t *tc_pg_pool_new(uv_loop_t *loop, const tc_pg_pool_opts_t *opts);

/* Close every connection; queued and in-flight jobs complete with
 * TC_PG_ECLOSING.  'done' (may be NULL) runs when all handles are closed;
 * the pool memory is released after it returns. */
void tc_pg_pool_close(tc_pg_pool_t *pool, void (*done)(void *arg), void *arg);

/* Connections currently ready. */
int tc_pg_pool_ready(const tc_pg_pool_t *pool);
/* Jobs waiting for a connection. */
size_t tc_pg_pool_queued(const tc_pg_pool_t *pool);

/* ---- jobs ---- */

/* A new empty job.  'flags' is TC_PG_JOB_*.  NULL on allocation failure. */
tc_pg_job_t *tc_pg_job_new(unsigned flags, tc_pg_job_cb cb, void *arg);

/*
 * Append a statement with text parameters ($1..$n).  'sql' and each value
 * are copied (a NULL value is SQL NULL).  Returns 0 or -1 on allocation
 * failure (the job is then unusable: free it).
 */
int tc_pg_job_add(tc_pg_job_t *job, const char *sql, int nparams, const char *const *values);

/*
 * The same, run as the prepared statement 'name' (a string that outlives
 * the pool, e.g. a literal): each connection prepares it once, in the
 * pipeline of the first job that uses it, so later jobs skip the parse and
 * plan of the statement itself.  The same name must always carry the same
 * SQL.
 */
int tc_pg_job_add_prepared(tc_pg_job_t *job, const char *name, const char *sql, int nparams,
                           const char *const *values);

/* Number of statements added. */
int tc_pg_job_count(const tc_pg_job_t *job);

/* Submit: the pool takes ownership.  Returns 0 (the callback will run
 * exactly once) or TC_PG_EFULL / TC_PG_ECLOSING (the callback will not run
 * and the caller still owns the job). 'deadline_ms' bounds the time spent
 * waiting for a connection (0 = no bound). */
int tc_pg_submit(tc_pg_pool_t *pool, tc_pg_job_t *job, unsigned deadline_ms);

/* Free a job that was never submitted (or whose submit failed). */
void tc_pg_job_free(tc_pg_job_t *job);

/* In the callback: statement i's result (PGRES_TUPLES_OK or PGRES_COMMAND_OK). */
const PGresult *tc_pg_job_result(const tc_pg_job_t *job, int i);
/* In the callback after TC_PG_ESTMT/EBROKEN: the error text and SQLSTATE
 * (5 chars, "" if none); index of the failing statement or -1. */
const char *tc_pg_job_error(const tc_pg_job_t *job);
const char *tc_pg_job_sqlstate(const tc_pg_job_t *job);
int tc_pg_job_failed_index(const tc_pg_job_t *job);
/* Milliseconds between submit and completion (for metrics). */
double tc_pg_job_elapsed_ms(const tc_pg_job_t *job);

#endif /* TC_PG_H */
