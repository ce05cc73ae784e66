/*
 * rm_client.h - librmclient, the client side of the txc transaction
 * coordinator: the TM API (begin/commit/rollback/status of global
 * transactions) and the RM API (AT-mode branches on PostgreSQL).
 *
 * NOTES
 *   This is the library's only public header.  It includes no libuv,
 *   hiredis or msgpack header; libpq's PGconn appears only where the caller
 *   passes its own connection (the AT functions), declared opaquely here.
 *
 *   Threading: rm_client_new() starts one background thread that owns the
 *   connections to every configured coordinator node (connects to all,
 *   reconnects with backoff, heartbeats).  Every public function is safe to
 *   call from any number of threads at once.  Blocking calls wait for their
 *   answer or their deadline; *_async calls return at once and run their
 *   callback exactly once on the background thread (keep callbacks short:
 *   they must not block).  If an *_async call returns an error, its callback
 *   never runs.
 *
 *   Errors: functions return 0 or a negative code; rm_strerror() describes
 *   it.  RM_E_UNKNOWN_OUTCOME means the request was sent and no answer came
 *   before the deadline (or the connection died after sending): the
 *   coordinator may or may not have acted.  It is never reported as a plain
 *   failure; callers resolve it with rm_tm_status() or by retrying the same
 *   call (begin and branch registration carry idempotency keys, so a retry
 *   never creates a second transaction or branch).
 *
 *   The library never prints, never exits and installs no signal handler:
 *   log lines go to the callback set in rm_config_t (none by default).
 */
#ifndef RM_CLIENT_H
#define RM_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define RM_API __attribute__((visibility("default")))
#else
#define RM_API
#endif

#define RM_XID_MAX 129 /* buffer size for an xid, with its NUL */

/* Codes.  The numbers are the coordinator protocol's (proto/txp_errno.h):
 * a code that comes back from the TC is passed through unchanged. */
enum {
  RM_OK = 0,
  RM_E_INVALID = -10014,        /* bad argument (NULL, empty, too long) */
  RM_E_NOMEM = -10011,
  RM_E_BAD_REQUEST = -10100,    /* the TC refused the request as malformed */
  RM_E_AUTH = -10101,           /* wrong token */
  RM_E_GLOBAL_NOT_FOUND = -10103,
  RM_E_GLOBAL_NOT_ACTIVE = -10104, /* e.g. register after the decision */
  RM_E_LOCK_CONFLICT = -10105,
  RM_E_LOCK_WAIT_TIMEOUT = -10106,
  RM_E_LOCK_HOLDER_ROLLBACKING = -10107,
  RM_E_TIMED_OUT = -10108,      /* the global transaction timed out */
  RM_E_STORE = -10109,          /* TC store unavailable: retryable */
  RM_E_BUSY = -10111,
  RM_E_DIRTY_WRITE = -10115,
  RM_E_UNKNOWN_OUTCOME = -10200, /* sent, no answer: may have happened */
  RM_E_DEADLINE = -10201,       /* deadline passed before sending: did not happen */
  RM_E_NO_NODE = -10202,        /* no coordinator node reachable */
  RM_E_CONN_LOST = -10203,
  RM_E_NOT_SUPPORTED = -10204,  /* statement the AT layer cannot handle */
  RM_E_DB = -10300,             /* a database statement failed (see errmsg) */
  RM_E_NO_TABLE = -10301,       /* unknown table */
  RM_E_NO_PK = -10302,          /* table has no primary key */
  RM_E_NOT_ONE_ROW = -10303,    /* the statement would touch no row or several */
  RM_E_GUARD = -10304,          /* a delta update's guard refused (e.g. sold out) */
  RM_E_STATE = -10305,          /* call out of order for this branch */
};

/* Global status values (Seata's numbers; proto/txp_status.h). */
enum {
  RM_GS_BEGIN = 1,
  RM_GS_ROLLBACKING = 4,
  RM_GS_COMMITTED = 9,
  RM_GS_ROLLBACKED = 11,
  RM_GS_TIMEOUT_ROLLBACKED = 12,
  RM_GS_ROLLBACK_FAILED = 13,
};

RM_API const char *rm_strerror(int code);
/* Name of a global status ("Committed", ...). */
RM_API const char *rm_global_status_name(int status);

/* Levels start at 1 so that a zero-initialized rm_config_t means the
 * default (RM_LOG_WARN).  Lower is more severe. */
typedef enum { RM_LOG_ERROR = 1, RM_LOG_WARN = 2, RM_LOG_INFO = 3, RM_LOG_DEBUG = 4 } rm_log_level_t;
/* One log line (no newline).  Called from the library's threads, one call
 * at a time; 'msg' is valid during the call.  Must not call back into the
 * library's blocking functions. */
typedef void (*rm_log_cb)(int level, const char *msg, void *arg);

/* Strings are copied by rm_client_new(); numbers: 0 means the default. */
typedef struct rm_config {
  const char *nodes;           /* "host:port,host:port,...", required ([v6]:port too) */
  const char *token;           /* registration secret, required */
  const char *application_id;  /* required */
  const char *client_id;       /* default: application_id-pid-random */
  unsigned connect_timeout_ms; /* connect + register, default 3000 */
  unsigned request_timeout_ms; /* default deadline of a call, default 5000 */
  unsigned heartbeat_ms;       /* default 5000; silent for 2 of these = dead */
  unsigned lock_wait_ms;       /* default wait for a busy global lock, default 2000 */
  rm_log_cb log_cb;            /* may be NULL: no logging */
  void *log_arg;
  int log_level;               /* rm_log_level_t, 0 = RM_LOG_WARN */
} rm_config_t;

typedef struct rm_client rm_client_t;

/* Start the client (background thread, connections).  Does not wait for
 * the connections: calls made before a node is reachable wait up to their
 * deadline.  Returns 0 or RM_E_INVALID / RM_E_NOMEM. */
RM_API int rm_client_new(const rm_config_t *cfg, rm_client_t **out);
/* Stop the thread and close everything.  Calls still waiting fail with
 * RM_E_CONN_LOST (or RM_E_UNKNOWN_OUTCOME if sent), callbacks of pending
 * *_async calls run before it returns.  Must not be called from a library
 * callback (it would join its own thread: it logs an error and does
 * nothing).  rm_client_free(NULL) does nothing. */
RM_API void rm_client_free(rm_client_t *c);

/* Number of coordinator nodes currently connected and registered. */
RM_API int rm_client_nodes_up(rm_client_t *c);

/* ---------------------------------------------------------------- TM --- */

/* Begin a global transaction.  'timeout_ms' 0 = the TC's default; 'name'
 * may be NULL.  Writes the xid (a plain string to pass to other services)
 * into 'xid' (RM_XID_MAX bytes). */
RM_API int rm_tm_begin(rm_client_t *c, unsigned timeout_ms, const char *name, char *xid);
/* Commit.  On 0, *status (may be NULL) is RM_GS_COMMITTED; a rollback
 * decision made meanwhile (e.g. timeout) comes back as RM_E_TIMED_OUT or
 * RM_E_GLOBAL_NOT_ACTIVE with *status telling which. */
RM_API int rm_tm_commit(rm_client_t *c, const char *xid, int *status);
RM_API int rm_tm_rollback(rm_client_t *c, const char *xid, int *status);
/* The coordinator's status of 'xid' (also after it finished), passed
 * through: any txp global status, e.g. RM_GS_BEGIN or RM_GS_COMMITTED. */
RM_API int rm_tm_status(rm_client_t *c, const char *xid, int *status);

/* Callback forms: 'xid' is the new xid for begin (NULL on failure) and the
 * request's xid for the others, valid during the callback; 'status' is set
 * for commit/rollback/status when the coordinator said it (else 0).  The
 * callback runs on the library's thread and must not block, nor call the
 * blocking functions (they return RM_E_INVALID there). */
typedef void (*rm_tm_cb)(int code, const char *xid, int status, void *arg);
RM_API int rm_tm_begin_async(rm_client_t *c, unsigned timeout_ms, const char *name, rm_tm_cb cb, void *arg);
RM_API int rm_tm_commit_async(rm_client_t *c, const char *xid, rm_tm_cb cb, void *arg);
RM_API int rm_tm_rollback_async(rm_client_t *c, const char *xid, rm_tm_cb cb, void *arg);
RM_API int rm_tm_status_async(rm_client_t *c, const char *xid, rm_tm_cb cb, void *arg);

/* ------------------------------------------------------- RM: AT mode --- */

typedef struct pg_conn PGconn; /* libpq's, as the caller passes it */

/*
 * Declare this process a resource manager for 'resource_id' (one
 * PostgreSQL database), reachable for phase-two work through 'conninfo'
 * (the library opens its own connections there; the database must have
 * sql/rm's undo_log table).  Re-registers with every node.  Call once per
 * resource, before its branches; adding the same id with the same conninfo
 * again is a no-op.  RM_E_INVALID: NULL or empty arguments, an id longer
 * than 256 bytes or holding ',', '^' or control bytes, a malformed
 * conninfo, or the id already added with another conninfo.
 */
RM_API int rm_resource_add(rm_client_t *c, const char *resource_id, const char *conninfo);

typedef struct rm_branch rm_branch_t;

/*
 * Start an AT branch of global transaction 'xid' inside the caller's local
 * transaction on 'pg' (the caller has run BEGIN).  The branch records the
 * before/after images of each statement run through it.  A branch, like
 * its PGconn, is used by one thread at a time.  RM_E_INVALID (NULL, xid
 * empty or over 128 bytes, resource not added), RM_E_STATE ('pg' not idle
 * in a transaction block), RM_E_NOT_SUPPORTED (client_encoding not UTF8).
 *
 * Statements: 'table' is "name" (found through the search path of 'pg')
 * or "schema.name", unquoted.  Each rm_at_insert/update/delete/update_delta
 * runs inside a savepoint of its own: when it fails, its changes are rolled
 * back and the caller's transaction is left exactly as before the call,
 * still usable (earlier statements of the branch stand).  Codes:
 * RM_E_INVALID (bad argument; unknown column; a value the column type
 * refuses; a primary key too long for a lock key; images of the branch over
 * 8 MiB or over 1000 statements), RM_E_NO_TABLE, RM_E_NO_PK,
 * RM_E_NOT_ONE_ROW (no row has that key), RM_E_NOT_SUPPORTED (updating a
 * key column, a delta on a non-numeric column), RM_E_GUARD, RM_E_STATE
 * (after prepare, or the transaction already failed), RM_E_DB (any other
 * database error: rm_at_errmsg has PostgreSQL's message).  The images are
 * text as the session prints it: do not change TimeZone, DateStyle,
 * IntervalStyle, extra_float_digits, bytea_output or lc_monetary during a
 * branch (the rollback re-applies the values they had at its first
 * statement).
 */
RM_API int rm_at_open(rm_client_t *c, const char *xid, const char *resource_id, PGconn *pg,
                      rm_branch_t **out);

/* INSERT one row: 'cols'/'vals' are column names and text values (NULL
 * value = SQL NULL); the primary key must be among them or have a default. */
RM_API int rm_at_insert(rm_branch_t *b, const char *table, int ncols, const char *const *cols,
                        const char *const *vals);
/* UPDATE one row identified by its primary key values (in key order). */
RM_API int rm_at_update(rm_branch_t *b, const char *table, const char *const *pk_vals, int nset,
                        const char *const *set_cols, const char *const *set_vals);
/* DELETE one row identified by its primary key values. */
RM_API int rm_at_delete(rm_branch_t *b, const char *table, const char *const *pk_vals);
/*
 * Hot-row counter: UPDATE table SET col = col + delta WHERE pk AND (guard).
 * 'guard' is an SQL condition on the row's own columns with $1 standing for
 * 'delta' (e.g. "stock - frozen_count - sold_count >= $1"), or NULL.  The
 * undo is col = col - delta, which commutes with other deltas, so this
 * takes no global row lock.  RM_E_GUARD when the guard refuses.
 */
RM_API int rm_at_update_delta(rm_branch_t *b, const char *table, const char *const *pk_vals,
                              const char *col, long long delta, const char *guard);

/*
 * Before the caller's COMMIT: register the branch with the TC (waiting up
 * to the lock-wait timeout for busy global locks) and write the undo_log
 * row in the caller's transaction.  On error the caller must ROLLBACK.
 * '*branch_id' (may be NULL) receives the branch id.  Errors: the TC's
 * codes from registration (the transaction is untouched), RM_E_STATE (no
 * statement yet, or prepared already), RM_E_GLOBAL_NOT_ACTIVE (the global
 * transaction already rolled this branch back: the fence), RM_E_DB.  When
 * the undo row cannot be written, the caller's transaction is left failed
 * on purpose, so that a COMMIT cannot make the change durable.
 */
RM_API int rm_at_prepare(rm_branch_t *b, int64_t *branch_id);
/* After the caller's COMMIT (committed=true) or ROLLBACK: report a failed
 * local commit to the TC, and free the branch.  Always frees 'b'.
 * RM_E_STATE if statements were committed without rm_at_prepare (they are
 * not part of the global transaction); RM_E_INVALID for NULL. */
RM_API int rm_at_close(rm_branch_t *b, bool committed);
/* The last database or TC error message of 'b' ("" if none). */
RM_API const char *rm_at_errmsg(const rm_branch_t *b);

#ifdef __cplusplus
}
#endif

#endif /* RM_CLIENT_H */
