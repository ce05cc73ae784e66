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
 *   rm_errmsg() has the details of the calling thread's last failure.
 *
 *   The library never prints, never exits and installs no signal handler:
 *   log lines go to the callback set in rm_config_t (none by default;
 *   rm_log_stderr is a ready-made one).
 *
 *   A first program: rm-client/README.md ("Using librmclient") and
 *   examples/transfer/transfer.c.
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
  RM_E_AUTH = -10101,           /* wrong secret for the application_id */
  RM_E_GLOBAL_NOT_FOUND = -10103,
  RM_E_GLOBAL_NOT_ACTIVE = -10104, /* e.g. register after the decision */
  RM_E_LOCK_CONFLICT = -10105,
  RM_E_LOCK_WAIT_TIMEOUT = -10106,
  RM_E_LOCK_HOLDER_ROLLBACKING = -10107,
  RM_E_TIMED_OUT = -10108,      /* the global transaction timed out */
  RM_E_STORE = -10109,          /* TC store unavailable: retryable */
  RM_E_BUSY = -10111,
  RM_E_DIRTY_WRITE = -10115,
  RM_E_NOT_OWNER = -10119,      /* the xid or branch is another application's
                                   (or another group's): nothing changed */
  RM_E_UNKNOWN_OUTCOME = -10200, /* sent, no answer: may have happened */
  RM_E_DEADLINE = -10201,       /* deadline passed before sending: did not happen */
  RM_E_NO_NODE = -10202,        /* no coordinator node reachable */
  RM_E_CONN_LOST = -10203,
  RM_E_NOT_SUPPORTED = -10204,  /* statement the AT layer cannot handle */
  RM_E_ROLLBACK_PENDING = -10205, /* rm_tm_rollback: rolled back as a decision, but not every
                                     branch is undone yet (*status: Rollbacking, RollbackRetrying,
                                     TimeoutRollback(Retry)ing, StopRollbackRetry); the coordinator
                                     retries while each resource's RM runs: see rm_errmsg() */
  RM_E_ROLLBACK_FAILED = -10206,  /* rm_tm_rollback: a branch can never be undone automatically
                                     (*status RollbackFailed or TimeoutRollbackFailed, e.g. a
                                     dirty write): repair the row, then `tcctl redrive XID` */
  RM_E_COMMIT_FAILED = -10207,    /* rm_tm_commit: committed as a decision, but a branch's
                                     phase two failed for good (*status CommitFailed): an
                                     operator's (`tcctl show XID`) */
  RM_E_COMMIT_PENDING = -10208,   /* rm_tm_commit of a saga: a step is not done yet and the
                                     coordinator retries it (*status Committing or
                                     CommitRetrying); rm_tm_status tells how it ends */
  RM_E_DB = -10300,             /* a database statement failed (see errmsg) */
  RM_E_NO_TABLE = -10301,       /* unknown table */
  RM_E_NO_PK = -10302,          /* table has no primary key */
  RM_E_NOT_ONE_ROW = -10303,    /* the statement would touch no row or several */
  RM_E_GUARD = -10304,          /* a delta update's guard refused (e.g. sold out) */
  RM_E_STATE = -10305,          /* call out of order for this branch */
  RM_E_TCC_HANDLER = -10306,    /* a TCC confirm or cancel handler failed (see errmsg) */
  RM_E_FENCE = -10307,          /* the fence of a TCC or XA branch refused: the branch was finished
                                   the other way, or rolled back before its phase one (anti-hanging) */
};

/* Global status values (Seata's numbers; proto/txp_status.h), every one
 * the coordinator may answer.  Final: Committed, CommitFailed, Rollbacked,
 * TimeoutRollbacked, RollbackFailed, TimeoutRollbackFailed, Finished. */
enum {
  RM_GS_UNKNOWN = 0,
  RM_GS_BEGIN = 1,                     /* active: branches may register */
  RM_GS_COMMITTING = 2,                /* commit decided, phase two running */
  RM_GS_COMMIT_RETRYING = 3,           /* commit decided, phase two retried */
  RM_GS_ROLLBACKING = 4,               /* rollback decided, undo running */
  RM_GS_ROLLBACK_RETRYING = 5,         /* rollback decided, undo retried (an RM is missing,
                                          a database without undo_log, a lock timeout) */
  RM_GS_TIMEOUT_ROLLBACKING = 6,       /* timed out: rollback decided, undo running */
  RM_GS_TIMEOUT_ROLLBACK_RETRYING = 7, /* timed out: undo retried */
  RM_GS_ASYNC_COMMITTING = 8,          /* committed, clean-up running (shown as Committed) */
  RM_GS_COMMITTED = 9,
  RM_GS_COMMIT_FAILED = 10,            /* committed, a branch failed for good: operator */
  RM_GS_ROLLBACKED = 11,
  RM_GS_TIMEOUT_ROLLBACKED = 12,
  RM_GS_ROLLBACK_FAILED = 13,          /* a branch cannot be undone (dirty write): operator */
  RM_GS_TIMEOUT_ROLLBACK_FAILED = 14,
  RM_GS_FINISHED = 15,
  RM_GS_STOP_COMMIT_RETRY = 19,        /* an operator stopped the retries (tcctl) */
  RM_GS_STOP_ROLLBACK_RETRY = 20,
};

RM_API const char *rm_strerror(int code);
/* Name of a global status ("Committed", ...). */
RM_API const char *rm_global_status_name(int status);
/*
 * Details of the calling thread's last failed call of the library ("" if
 * none yet): why the arguments were refused, the coordinator's, Redis's or
 * PostgreSQL's message, what to run to fix it.  rm_prefilter_errmsg and
 * rm_local_errmsg read the same message.  Thread-local, like errno: valid
 * until the thread's next failed call, never cleared by a success (read it
 * right after the failure).  An AT branch's failures are also in
 * rm_at_errmsg(b).
 */
RM_API const char *rm_errmsg(void);

/* Levels start at 1 so that a zero-initialized rm_config_t means the
 * default (RM_LOG_WARN).  Lower is more severe. */
typedef enum { RM_LOG_ERROR = 1, RM_LOG_WARN = 2, RM_LOG_INFO = 3, RM_LOG_DEBUG = 4 } rm_log_level_t;
/* One log line (no newline).  Called from the library's threads, one call
 * at a time; 'msg' is valid during the call.  Must not call back into the
 * library's blocking functions. */
typedef void (*rm_log_cb)(int level, const char *msg, void *arg);
/* A ready-made rm_log_cb: one line per call on stderr, "PREFIX: rmclient
 * LEVEL: msg", PREFIX being 'arg' as a C string (the program's name; NULL:
 * none).  The library calls it only when the program passes it:
 *   rm_config_t cfg = {..., .log_cb = rm_log_stderr, .log_arg = "transfer"}; */
RM_API void rm_log_stderr(int level, const char *msg, void *arg);

/* Strings are copied by rm_client_new(); numbers: 0 means the default. */
typedef struct rm_config {
  const char *nodes;           /* "host:port,host:port,...", required ([v6]:port too) */
  const char *token;           /* registration secret, required: this
                                  application's own secret when the TC has a
                                  credentials file (README "Security
                                  model"), else the cluster's server.token */
  const char *application_id;  /* required; with credentials, the name the
                                  secret belongs to */
  const char *client_id;       /* default: application_id-pid-random */
  unsigned connect_timeout_ms; /* connect + register, default 3000 */
  unsigned request_timeout_ms; /* default deadline of a call, default 5000 */
  unsigned heartbeat_ms;       /* default 1000; silent for 2 of these = dead, so a
                                  hung node costs callers ~2 s, not more */
  unsigned lock_wait_ms;       /* default wait for a busy global lock, default 2000 */
  rm_log_cb log_cb;            /* may be NULL: no logging */
  void *log_arg;
  int log_level;               /* rm_log_level_t, 0 = RM_LOG_WARN */
  int node_choice;             /* where calls without an xid (GlobalBegin) go:
                                  rm_node_choice_t, 0 = RM_NODE_HOME */
  int unnamed_statements;      /* nonzero: the AT layer sends its queries unnamed
                                  instead of as named prepared statements kept per
                                  connection; for connections behind a proxy that
                                  cannot keep them (PgBouncer pool_mode=transaction)
                                  or an application that runs DEALLOCATE ALL */
  int undo_format;             /* how AT branches write their undo rows:
                                  rm_undo_format_t, 0 = RM_UNDO_COMPACT */
} rm_config_t;

/* rm_config_t.undo_format.
 *   RM_UNDO_COMPACT  (version 3) about half the bytes of an undo row, and
 *                    of its WAL: what a library of this version writes.
 *                    Libraries of before it cannot read such a row: they
 *                    answer its rollback "cannot be read", for an operator.
 *   RM_UNDO_OBJECTS  the form of earlier versions (1, and 2 with commit
 *                    deltas), which they read: for a rolling upgrade, set
 *                    it while any older instance still serves one of the
 *                    client's resources, and drop it once none does.
 *  Either form is read by this version, whatever the setting. */
typedef enum { RM_UNDO_COMPACT = 0, RM_UNDO_OBJECTS = 1 } rm_undo_format_t;

/* rm_config_t.node_choice.  Calls about an xid always go to the node that
 * created it (while it is up).  Calls without one:
 *   RM_NODE_HOME         this client's home node, picked from its client_id
 *                        (so the instances of a service spread over the
 *                        nodes), or while it is down the next live node in
 *                        the list.  A client's transactions then share one
 *                        node's group-commit batches: fuller batches, less
 *                        PostgreSQL work per transaction (bench/README.md).
 *   RM_NODE_ROUND_ROBIN  the next live node for each call. */
typedef enum { RM_NODE_HOME = 0, RM_NODE_ROUND_ROBIN = 1 } rm_node_choice_t;

typedef struct rm_client rm_client_t;

/* Start the client (background thread, connections).  Does not wait for
 * the connections: a call made while no node is registered waits for one
 * up to the connect timeout (or its deadline, if earlier), then ends with
 * RM_E_NO_NODE; under degrade detection, at once when the client switches
 * to local mode.  Returns 0 or RM_E_INVALID / RM_E_NOMEM. */
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

/*
 * The TM calls: 0 means the caller got what it asked for, and nothing else
 * does.  '*status' (may be NULL) is the global status the coordinator
 * answered with, whatever the code (0 when it did not answer).  Codes any
 * of them may return: RM_E_INVALID (bad argument, or a blocking call from
 * a library callback), RM_E_NOMEM, RM_E_AUTH, RM_E_NO_NODE and
 * RM_E_DEADLINE (not sent: nothing happened), RM_E_UNKNOWN_OUTCOME and
 * RM_E_CONN_LOST after sending (may have happened: ask rm_tm_status, or
 * repeat the call, which is idempotent), RM_E_STORE and RM_E_BUSY (the
 * coordinator could not take it now: retry), RM_E_GLOBAL_NOT_FOUND.
 * rm_errmsg() has the details of a failure.
 */

/* Begin a global transaction.  'timeout_ms' 0 = the TC's default (tcd
 * --print-config: 60 s); 'name' may be NULL.  Writes the xid (a plain
 * string to pass to other services) into 'xid' (RM_XID_MAX bytes; "" on
 * failure).  RM_E_NO_NODE or RM_E_DEADLINE: certainly no transaction. */
RM_API int rm_tm_begin(rm_client_t *c, unsigned timeout_ms, const char *name, char *xid);
/*
 * rm_tm_begin, and the registration of the global's first branch, an AT
 * branch of 'resource_id' that this client writes (rm_at_open_registered),
 * in one call to the coordinator instead of two: for a TM that writes the
 * first branch itself (order-service's order row).  *branch_id is set (0
 * when the coordinator does not know the combined call: it then began the
 * global alone, and the branch registers at its prepare as usual).  The
 * codes of rm_tm_begin.  A global begun by an attempt whose answer was
 * lost is not found again: it rolls back at its timeout, with nothing to
 * undo.
 */
RM_API int rm_tm_begin_branch(rm_client_t *c, unsigned timeout_ms, const char *name, const char *resource_id,
                              char *xid, int64_t *branch_id);
/*
 * Commit.  0: the commit is decided and durable; *status is
 * RM_GS_COMMITTED (or, for a repeated call, Committing/CommitRetrying:
 * phase two, AT clean-up, still runs).  Not committed: RM_E_TIMED_OUT (the
 * transaction timed out and is rolled back: *status TimeoutRollback*),
 * RM_E_GLOBAL_NOT_ACTIVE (a rollback was decided before: *status tells
 * which).  RM_E_COMMIT_FAILED: committed, but a branch's phase-two commit
 * failed for good (*status RM_GS_COMMIT_FAILED; only branches with
 * rm_at_update_delta_on_commit and TCC confirms do work there): an
 * operator's.  With such branches the call returns once they ran, or
 * failed for now (*status Committed all the same: the decision stands,
 * and the coordinator retries them; rm_tm_status shows CommitRetrying).
 */
RM_API int rm_tm_commit(rm_client_t *c, const char *xid, int *status);
/*
 * Roll back, and wait until every branch is undone.  0: rolled back and
 * finished, *status RM_GS_ROLLBACKED (or RM_GS_TIMEOUT_ROLLBACKED: it timed
 * out first).  Decided but not finished:
 *   RM_E_ROLLBACK_PENDING  *status Rollbacking, RollbackRetrying,
 *                          TimeoutRollbacking, TimeoutRollbackRetrying or
 *                          StopRollbackRetry: a branch's undo failed for
 *                          now (its resource's RM is not running, the
 *                          database has no undo_log, a row lock timed
 *                          out); the coordinator retries it, and finishes
 *                          once an RM of that resource runs.
 *   RM_E_ROLLBACK_FAILED   *status RollbackFailed or TimeoutRollbackFailed:
 *                          a branch can never be undone automatically (a
 *                          dirty write: someone changed the row outside
 *                          the coordinator; nothing was overwritten).
 *                          Repair the row by hand, then `tcctl redrive XID`
 *                          (`tcctl show XID` has the row and both values).
 * Either way nothing of the transaction will be committed.  Not rolled
 * back: RM_E_GLOBAL_NOT_ACTIVE with *status RM_GS_COMMITTED (a commit was
 * decided before).  A transaction the timeout rolled back first answers as
 * that rollback does (0 with RM_GS_TIMEOUT_ROLLBACKED, or the two codes
 * above with the Timeout* statuses).
 */
RM_API int rm_tm_rollback(rm_client_t *c, const char *xid, int *status);
/* The coordinator's status of 'xid' (also after it finished), passed
 * through: any RM_GS_* above.  0 whenever the coordinator answered. */
RM_API int rm_tm_status(rm_client_t *c, const char *xid, int *status);

/* Callback forms: 'xid' is the new xid for begin (NULL on failure) and the
 * request's xid for the others, valid during the callback; 'status' is set
 * for commit/rollback/status when the coordinator said it (else 0).  The
 * callback runs on the library's thread and must not block, nor call the
 * blocking functions (they return RM_E_INVALID there).  'code' is what the
 * blocking form would return (RM_E_ROLLBACK_PENDING ... included). */
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
 * (the library opens its own connections there).  Connects once to check
 * the database: it must have the RM schema, sql/rm's undo_log table
 * (`txc-db-migrate 'CONNINFO' rm`, once per database).  Re-registers with
 * every node.  Call once per resource, before its branches; adding the same
 * id with the same conninfo again is a no-op (no check).  While this
 * process runs it also does phase two (commit clean-up, rollback undo) of
 * its resources' branches for every transaction, its own or others'.
 * Codes (rm_errmsg() says which and what to run): RM_E_INVALID (NULL or
 * empty arguments, an id longer than 256 bytes or holding ',', '^' or
 * control bytes, a malformed conninfo, the id already added with another
 * conninfo), RM_E_DB (the database refused the connection or the check),
 * RM_E_NO_TABLE (no undo_log table), RM_E_NOT_SUPPORTED (an undo_log of an
 * older version of the schema set), RM_E_NOMEM.
 */
RM_API int rm_resource_add(rm_client_t *c, const char *resource_id, const char *conninfo);

typedef struct rm_branch rm_branch_t;

/*
 * Start an AT branch of global transaction 'xid' inside the caller's local
 * transaction on 'pg'.  The caller has run BEGIN, or 'pg' is idle outside
 * a transaction block: then the branch begins the transaction itself, in
 * the same round trip as its first statement (one round trip less), and
 * the caller ends it as usual (COMMIT or ROLLBACK, or
 * rm_at_prepare_commit).  The branch records the
 * before/after images of each statement run through it.  A branch, like
 * its PGconn, is used by one thread at a time.  RM_E_INVALID (NULL, xid
 * empty or over 128 bytes, resource not added), RM_E_STATE ('pg' busy or
 * in a failed transaction), RM_E_NOT_SUPPORTED (client_encoding not UTF8).
 *
 * Statements: 'table' is "name" (found through the search path of 'pg')
 * or "schema.name", unquoted.  Each rm_at_insert/update/delete/update_delta
 * runs inside a savepoint of its own (unless rm_at_statement_savepoints
 * turned them off): when it fails, its changes are rolled back and the
 * caller's transaction is left exactly as before the call, still usable
 * (earlier statements of the branch stand).  Codes:
 * RM_E_INVALID (bad argument; unknown column; a value the column type
 * refuses; a primary key too long for a lock key; images of the branch over
 * 8 MiB or over 1000 statements: an insert's undo keeps its key and the
 * row's digest, not the row), RM_E_NO_TABLE, RM_E_NO_PK,
 * RM_E_NOT_ONE_ROW (no row has that key), RM_E_NOT_SUPPORTED (updating a
 * key column, a delta on a non-numeric column), RM_E_GUARD, RM_E_STATE
 * (after prepare, or the transaction already failed), RM_E_DB (any other
 * database error: rm_at_errmsg has PostgreSQL's message).  The images are
 * text as the session prints it: do not change TimeZone, DateStyle,
 * IntervalStyle, extra_float_digits, bytea_output or lc_monetary during a
 * branch (the undo row records the values they have at rm_at_prepare,
 * and the rollback re-applies them).
 */
RM_API int rm_at_open(rm_client_t *c, const char *xid, const char *resource_id, PGconn *pg,
                      rm_branch_t **out);
/*
 * Open the branch 'branch_id' that rm_tm_begin_branch registered with the
 * global 'xid', as rm_at_open does (the same codes).  The branch takes no
 * global lock and no commit delta (rm_at_insert_unlocked,
 * rm_at_sql_unlocked, rm_at_update_delta_deferred ...; rm_at_prepare
 * refuses one that does, with RM_E_STATE): it was registered before its
 * statements ran, and rm_at_prepare only writes its undo row.
 * 'branch_id' 0 (rm_tm_begin_branch with an older coordinator): as
 * rm_at_open, registered by rm_at_prepare.
 */
RM_API int rm_at_open_registered(rm_client_t *c, const char *xid, const char *resource_id, int64_t branch_id,
                                 PGconn *pg, rm_branch_t **out);

/*
 * Open a rehearsal of a branch on 'pg' (idle or inside a transaction, as
 * rm_at_open): every call works on it as on a branch (the same statements,
 * images, savepoints, deferred deltas, and the undo row that prepare
 * writes), but nothing goes to the coordinator (no registration, no
 * global lock asked for; rm_at_register_early answers 0) and nothing
 * commits: rm_at_prepare_commit rolls the local transaction back where a
 * branch would commit (0, *committed false), and rm_at_prepare rolls it
 * back after writing the undo row, so a caller's COMMIT after it has
 * nothing to commit.  Close it with rm_at_close(b, false).
 *
 * For a service that warms its PostgreSQL connections before it serves:
 * a fresh connection's first branch pays the backend's catalog caches,
 * the plans of every statement and the PL/pgSQL functions and triggers
 * they reach, and on a small machine a sale's first burst meeting every
 * connection cold costs several times the latency of the next one
 * (bench/README, twenty-fifth session).  The rows it works on should be
 * ones the caller's transaction made itself (they are gone with its
 * rollback, and no other transaction waits on them).  The undo row
 * carries the xid RM_AT_REHEARSAL_XID and branch id 0.
 */
#define RM_AT_REHEARSAL_XID "rm-at-rehearsal"
RM_API int rm_at_open_rehearsal(rm_client_t *c, const char *resource_id, PGconn *pg, rm_branch_t **out);

/*
 * Register 'b' now, right after rm_at_open and before its statements,
 * without waiting: the call to the coordinator goes on while the
 * statements run, and rm_at_prepare waits for its answer (one round trip
 * off the branch's time).  As for rm_at_open_registered's branches, the
 * statements then take no global lock and no commit delta (rm_at_prepare
 * refuses them, RM_E_STATE).  0, or RM_E_STATE (not right after
 * rm_at_open) or the call's code; a registration that failed is reported
 * by rm_at_prepare.
 */
RM_API int rm_at_register_early(rm_branch_t *b);

/*
 * Whether each statement of 'b' runs inside a savepoint of its own (on, the
 * default: a failed statement leaves the caller's transaction as before the
 * call, still usable).  Off, for a caller that rolls its transaction back
 * on any failure anyway (as a service handler does): no SAVEPOINT and
 * RELEASE around each statement and around prepare's deferred updates (two
 * statements each, 10 of the 24 of the demo's order), prepare writes
 * the undo row in the deferred updates' round trip, and a deferred delta
 * does not read its row first (rm_at_update_delta_deferred).  A failure then fails
 * the branch (RM_E_STATE for what follows) and may leave the transaction
 * aborted (a refusing deferred guard always does, on purpose: the undo row
 * is already in it): the caller must ROLLBACK and rm_at_close(b, false).
 * Call it after rm_at_open, before the first statement; RM_E_STATE later.
 */
RM_API int rm_at_statement_savepoints(rm_branch_t *b, bool on);

/* INSERT one row: 'cols'/'vals' are column names and text values (NULL
 * value = SQL NULL); the primary key must be among them or have a default. */
RM_API int rm_at_insert(rm_branch_t *b, const char *table, int ncols, const char *const *cols,
                        const char *const *vals);
/*
 * rm_at_insert without the global lock on the new row's key: the branch
 * registers no lock key for it, so the coordinator writes and later
 * deletes no lock row (three store rows and their index entries per
 * insert).  For a row that no other global transaction writes before this
 * one ends: an append-only log row, or a row that afterwards only local
 * transactions change (they never wait for global locks anyway, as the
 * demo's orders and freezes after "only the order needs a global
 * transaction").  The undo is the same: a rollback deletes the row if it
 * is as inserted, and refuses (RM_E_DIRTY_WRITE, the global ends
 * RollbackFailed for an operator) if someone changed it meanwhile, where
 * with the lock another global transaction would have waited instead.
 */
RM_API int rm_at_insert_unlocked(rm_branch_t *b, const char *table, int ncols, const char *const *cols,
                                 const char *const *vals);
/*
 * rm_at_insert_unlocked, with the row inserted by prepare rather than now:
 * a branch that is this one insert, without statement savepoints,
 * prepared by rm_at_prepare_commit, sends the insert, its undo row and
 * the COMMIT as one statement (on a connection with no transaction open,
 * the whole local transaction: one statement and one round trip, as the
 * plain INSERT of a service without a coordinator).  Otherwise prepare
 * runs it first, as rm_at_insert_unlocked would have, then the rest.  The
 * row goes in after the branch's other statements, which therefore do not
 * see it; one per branch (RM_E_INVALID for a second).  The arguments and
 * the columns are checked now; what the insert itself meets (a unique
 * key, a CHECK, a value the column refuses) is prepare's code.
 */
RM_API int rm_at_insert_deferred(rm_branch_t *b, const char *table, int ncols, const char *const *cols,
                                 const char *const *vals);
/* UPDATE one row identified by its primary key values (in key order). */
RM_API int rm_at_update(rm_branch_t *b, const char *table, const char *const *pk_vals, int nset,
                        const char *const *set_cols, const char *const *set_vals);
/*
 * UPDATE table SET col = col + amount WHERE pk AND (guard), one row: the
 * read-modify-write of a balance in one call, e.g. a debit of 10.50:
 *   rm_at_update_add(b, "account", pk, "balance", "-10.50", "balance + $1 >= 0")
 * 'amount' is text in the column's type (integer or numeric, any sign);
 * 'guard' an SQL condition on the row's own columns with $1 standing for
 * 'amount', or NULL.  It is an rm_at_update in every other respect: the
 * row is locked (FOR UPDATE locally, its global lock key at prepare), its
 * before and after images are recorded, and a rollback restores the before
 * image (refusing, as a dirty write, if the row changed meanwhile).  Use
 * it for money; rm_at_update_delta is for hot counters that may not take
 * a global lock.  Codes as rm_at_update's, and RM_E_GUARD when the guard
 * refuses (the message has the column's value), RM_E_NOT_SUPPORTED for a
 * column that is not integer or numeric, or part of the key.
 */
RM_API int rm_at_update_add(rm_branch_t *b, const char *table, const char *const *pk_vals, const char *col,
                            const char *amount, const char *guard);
/* DELETE one row identified by its primary key values. */
RM_API int rm_at_delete(rm_branch_t *b, const char *table, const char *const *pk_vals);

typedef struct pg_result PGresult; /* libpq's */

/*
 * Plain SQL in an AT branch, as the service would write it anyway: the
 * statement is parsed with PostgreSQL's own grammar (libpg_query, once per
 * text and resource), classified, and run with its images, as Seata's
 * data-source proxy does.  Parameters are $1..$nparams in text form
 * ('param_types' may be NULL, or hold 0 for "inferred", as in
 * PQexecParams).  Runs inside a savepoint like the other statements: on
 * failure nothing of it is left and the caller's transaction is usable.
 * '*rows' (may be NULL): the rows inserted, updated, deleted or read.
 * '*result' (may be NULL): for a statement with RETURNING, or a SELECT,
 * its rows as libpq gives them (PQclear it); NULL otherwise.
 *
 *   INSERT INTO t [AS a] [(cols)] VALUES (...)[, (...)] [RETURNING ...]
 *     One or many rows.  Each row's key and digest go to the undo (as
 *     rm_at_insert's); its lock key is taken.
 *       rm_at_sql(b, "INSERT INTO orders (id, user_id, qty) VALUES ($1, $2, $3)", 3, NULL, vals, &n, NULL)
 *   UPDATE t [AS a] SET ... WHERE <any condition> [RETURNING ...]
 *     The before image is SELECT * FROM t WHERE <the condition> FOR
 *     UPDATE with the same parameters; the lock keys are its rows' keys;
 *     the after image is what the UPDATE returns.  Many rows are fine; a
 *     key column may not be set.
 *       rm_at_sql(b, "UPDATE stock SET qty = qty - $1 WHERE sku = $2 AND qty >= $1", 2, NULL, vals, &n, NULL)
 *   DELETE FROM t [AS a] WHERE <any condition> [RETURNING ...]
 *     The before image as for UPDATE.
 *       rm_at_sql(b, "DELETE FROM cart WHERE user_id = $1", 1, NULL, vals, &n, NULL)
 *   SELECT ... FROM t [AS a] [WHERE ...] [ORDER BY ... LIMIT n] FOR UPDATE
 *     One table.  The rows it returns are read under their local row
 *     locks and must be free of other global transactions' locks (Seata's
 *     "read committed" across global transactions): when one holds a row,
 *     the local locks are let go and the coordinator answers once the
 *     holder has released it (its pushed lock queue, up to the client's
 *     lock_wait_ms), then the rows are read again.  RM_E_LOCK_WAIT_TIMEOUT
 *     (the holder named) when it does not; RM_E_LOCK_CONFLICT at once on a
 *     branch without statement savepoints.  Takes no global lock itself.
 *       rm_at_sql(b, "SELECT qty FROM stock WHERE sku = $1 FOR UPDATE", 1, NULL, vals, &n, &res)
 *   SELECT without FOR UPDATE
 *     Runs as it is (a read takes no global lock).
 *       rm_at_sql(b, "SELECT qty FROM stock WHERE sku = $1", 1, NULL, vals, &n, &res)
 *
 * Refused with RM_E_NOT_SUPPORTED and a message saying what was found and
 * why, before anything runs: several statements; WITH that writes;
 * INSERT ... SELECT, ON CONFLICT; UPDATE ... FROM, DELETE ... USING; an
 * UPDATE or DELETE without WHERE (write WHERE true if every row is
 * meant); WHERE CURRENT OF; SET col[i] or col.field; a condition that
 * calls a volatile builtin (random, nextval, clock_timestamp, ...: it would
 * run twice, for the image and for the statement; a function of your own
 * is not known to be volatile: the check that the statement changed the
 * rows its image read is the net); FOR UPDATE over a join or several
 * tables, FOR SHARE, NOWAIT, SKIP LOCKED; DDL, COPY, MERGE, CALL and every
 * other statement.
 * A syntax error is RM_E_INVALID with PostgreSQL's message and position.
 * When the statement changed other rows than its before image held (a
 * row that came to match the condition, committed by another transaction
 * between the two), it is undone: RM_E_NOT_ONE_ROW; run it again.  Other
 * codes as rm_at_update's.  A statement that changes a row to a value
 * computed from others (qty = qty - 1) goes through images, under the
 * row's global lock, unless the column is a declared hot counter
 * (rm_at_hot_column, below): then it is a delta, as rm_at_update_delta's.
 */
RM_API int rm_at_sql(rm_branch_t *b, const char *sql, int nparams, const unsigned int *param_types,
                     const char *const *param_values, int64_t *rows, PGresult **result);
/* rm_at_sql for an INSERT whose rows need no global lock, as
 * rm_at_insert_unlocked (read its comment): RM_E_INVALID for any other
 * statement. */
RM_API int rm_at_sql_unlocked(rm_branch_t *b, const char *sql, int nparams, const unsigned int *param_types,
                              const char *const *param_values, int64_t *rows, PGresult **result);
/* rm_at_sql_unlocked of an INSERT of one row without RETURNING, run by
 * prepare as rm_at_insert_deferred's row is (read its comment: with
 * rm_at_prepare_commit on a branch that is this insert alone, without
 * statement savepoints, the whole local transaction is one statement).
 * RM_E_NOT_SUPPORTED for any other statement; the statement is parsed and
 * its table checked now, what the insert meets is prepare's code. */
RM_API int rm_at_sql_deferred(rm_branch_t *b, const char *sql, int nparams, const unsigned int *param_types,
                              const char *const *param_values);
/*
 * Declare 'column' of 'table' ("name": in any schema, or "schema.name";
 * unquoted) of resource 'resource_id' a hot counter of things taken
 * (frozen, sold, used: capacity taken when it goes up).  rm_at_sql then
 * takes an UPDATE that changes only that column by an amount and names the
 * row by its whole key, without RETURNING,
 *   UPDATE t SET c = c + X WHERE <each key column> = ... [AND <guard>]
 * (X a parameter or an integer; c - X too) as a delta instead of images:
 * no global lock on the row, and the undo is the opposite delta.  X >= 0
 * takes: the UPDATE (the caller's own, guard and all) runs in
 * rm_at_prepare, as rm_at_update_delta_deferred's does.  X < 0 gives back:
 * recorded for the commit, as rm_at_update_delta_on_commit (the rule of
 * the atomicity issue: a give-back is never undone by an opposite delta),
 * and it may have no condition beyond the key (RM_E_INVALID).  '*rows' is
 * then 1 (the change is applied later).  Every other statement on the
 * column goes through images as before.  At most 64 per resource; call it
 * after rm_resource_add.  0, RM_E_INVALID (unknown resource, a bad name,
 * too many).
 */
RM_API int rm_at_hot_column(rm_client_t *c, const char *resource_id, const char *table, const char *column);
/*
 * Hot-row counter: UPDATE table SET col = col + delta WHERE pk AND (guard).
 * 'guard' is an SQL condition on the row's own columns with $1 standing for
 * 'delta' (e.g. "stock - frozen_count - sold_count >= $1"), or NULL.  The
 * undo is col = col - delta, which commutes with other deltas, so this
 * takes no global row lock.  RM_E_GUARD when the guard refuses.
 *
 * Only a take may run now: 'delta' must be >= 0 (a counter of what is
 * taken: frozen, sold, used).  A decrement gives capacity back the moment
 * the branch commits locally; others may take it before the global
 * decision, and then its undo (+n) would be refused and the global
 * transaction could never roll back.  A negative delta is therefore
 * RM_E_INVALID here (and in rm_at_update_delta_deferred), with nothing
 * changed: give back with rm_at_update_delta_on_commit.  An amount (a
 * balance, a debit of 10.50) is rm_at_update_add's job: any sign, numeric,
 * under the row's global lock.
 */
RM_API int rm_at_update_delta(rm_branch_t *b, const char *table, const char *const *pk_vals,
                              const char *col, long long delta, const char *guard);
/*
 * The same delta update, deferred to rm_at_prepare, so that the row lock
 * of a hot row is held only for the UPDATE, the undo_log insert and the
 * caller's COMMIT (with rm_at_update_delta it is held from the UPDATE
 * through prepare's BranchRegister round trip to the coordinator).  Now:
 * the arguments, the table, column and key are checked as for
 * rm_at_update_delta and the row is read once without a lock (it must
 * exist: else RM_E_NOT_ONE_ROW); nothing is changed, and a failure leaves
 * the caller's transaction as it was, usable.  (With statement savepoints
 * off, rm_at_statement_savepoints, the row is not read now, one round
 * trip less: a missing row, or a key value its column refuses, fails
 * rm_at_prepare instead, RM_E_NOT_ONE_ROW or RM_E_INVALID.)  Then rm_at_prepare, right
 * after the registration succeeded (a delta needs no global lock key) and
 * before the undo_log insert, runs the branch's deferred UPDATEs, in the
 * order of the calls, after every other statement of the branch, inside
 * one savepoint.  When a guard refuses there, rm_at_prepare returns
 * RM_E_GUARD (RM_E_NOT_ONE_ROW if the row is gone, RM_E_DB/RM_E_INVALID
 * if an UPDATE failed) with the deferred updates rolled back; the branch
 * is registered: the caller must ROLLBACK its local transaction and call
 * rm_at_close(b, false), which reports PhaseOneFailed, and the TM then
 * rolls the global transaction back.  Do not COMMIT after such a failure
 * (the branch's other statements would be durable without an undo row).
 * The undo item is the same delta item as rm_at_update_delta's.  Codes
 * otherwise as rm_at_update_delta's (never RM_E_GUARD here).
 */
RM_API int rm_at_update_delta_deferred(rm_branch_t *b, const char *table, const char *const *pk_vals,
                                       const char *col, long long delta, const char *guard);
/*
 * A delta applied only when the global transaction commits: a give-back
 * (a release: frozen_count - n) or a move between counters of one row (a
 * confirm: frozen_count - n and sold_count + n).  Now: the arguments,
 * table, column and key are checked as for rm_at_update_delta and the row
 * is read once without a lock (it must exist: else RM_E_NOT_ONE_ROW);
 * nothing is changed, so until the commit the capacity stays taken and
 * nobody else can take it.  Phase-two commit applies the branch's commit
 * deltas, one UPDATE per row with its columns' deltas together, exactly
 * once (with the deletion of the branch's undo row, in one local
 * transaction); a rollback drops them: there is nothing to undo.  Such a
 * branch registers as one whose commit matters, so the TM's rm_tm_commit
 * returns once the commit was applied (by this client, when it prepared
 * the branch and is still running; otherwise the library applies it
 * moments later, from its deleter).  A commit
 * cannot be refused, so per row the commit deltas of a branch must add up
 * to zero or less (RM_E_INVALID from rm_at_prepare otherwise: take in
 * phase one, under a guard).  Should the commit meet the row gone or a
 * constraint refusing it (a write outside the coordinator), the branch
 * ends PhaseTwoCommitFailedUnretryable and the global CommitFailed, for an
 * operator.  Every resource manager serving the resource must be of this
 * version or later (such an undo row is version 2 or 3, which older ones
 * refuse to roll back rather than misread; rm_config_t.undo_format).
 */
RM_API int rm_at_update_delta_on_commit(rm_branch_t *b, const char *table, const char *const *pk_vals,
                                        const char *col, long long delta);

/*
 * Before the caller's COMMIT: register the branch with the TC (waiting up
 * to the lock-wait timeout for busy global locks), run the deferred delta
 * updates (rm_at_update_delta_deferred) and write the undo_log row in the
 * caller's transaction.  On error the caller must ROLLBACK.
 * '*branch_id' (may be NULL) receives the branch id.  Errors: the TC's
 * codes from registration (the transaction is untouched), RM_E_STATE (no
 * statement yet, or prepared already), RM_E_GUARD (and the other codes
 * of a deferred delta update: see rm_at_update_delta_deferred; the branch
 * is registered), RM_E_GLOBAL_NOT_ACTIVE (the global
 * transaction already rolled this branch back: the fence), RM_E_DB.  When
 * the undo row cannot be written, the caller's transaction is left failed
 * on purpose, so that a COMMIT cannot make the change durable.
 * RM_E_INVALID before any registration: the commit deltas of one row add
 * up to more than zero (rm_at_update_delta_on_commit).
 */
RM_API int rm_at_prepare(rm_branch_t *b, int64_t *branch_id);
/*
 * rm_at_prepare and the caller's COMMIT together: on a branch without
 * statement savepoints (rm_at_statement_savepoints) with at most one
 * deferred delta, the undo row, that delta's UPDATE (one statement: a
 * refusing guard fails it) and the COMMIT go in one round trip after the
 * registration, so a hot row is locked for that one round trip only
 * (rm_at_prepare then COMMIT: two); otherwise it runs rm_at_prepare, then
 * COMMIT.  On return the caller's transaction has ended either way:
 * '*committed' says whether it committed (after any failure it is rolled
 * back).  Then rm_at_close(b, *committed), as after a COMMIT.  Codes:
 * rm_at_prepare's (RM_E_GUARD, RM_E_NOT_ONE_ROW for the deferred delta
 * as there), and RM_E_DB when the COMMIT failed.
 */
RM_API int rm_at_prepare_commit(rm_branch_t *b, int64_t *branch_id, bool *committed);
/* After the caller's COMMIT (committed=true) or ROLLBACK: report a failed
 * local commit to the TC, and free the branch.  Always frees 'b'.
 * RM_E_STATE if statements were committed without rm_at_prepare (they are
 * not part of the global transaction); RM_E_INVALID for NULL. */
RM_API int rm_at_close(rm_branch_t *b, bool committed);
/* The last database or TC error message of 'b' ("" if none). */
RM_API const char *rm_at_errmsg(const rm_branch_t *b);

/* ------------------------------------------------------ RM: TCC mode --- */

/*
 * A TCC branch: the caller's try reserves, the coordinator's phase two
 * confirms (keeps) or cancels (gives back) through handlers this process
 * registered, for a resource that is not a row AT can image (a Redis
 * reservation, a payment hold, a call to another company) or where the
 * team wants to write both halves itself.
 *
 * The fence (sql/rm/002_branch_fence.sql: `txc-db-migrate 'CONNINFO' rm`) is a
 * row per branch in the resource's own database, written in the same
 * local transaction as the business change of the try, of the confirm and
 * of the cancel: a confirm or a cancel runs at most once and a duplicate
 * is answered from the row; a cancel that arrives before the try (an
 * empty rollback) is recorded, so the late try is refused instead of
 * hanging a reservation nobody releases.  One global transaction may mix
 * AT and TCC branches; the coordinator drives TCC phase two with AT's
 * retries, timeouts and tcctl repairs, and the TM's rm_tm_commit returns
 * once the confirms ran.
 */

/* What a handler returns. */
enum {
  RM_TCC_OK = 0,     /* done: the fence records it in the same transaction */
  RM_TCC_RETRY = 1,  /* not now (a store down, a timeout): the coordinator retries */
  RM_TCC_FAILED = 2, /* never: the branch fails for good (CommitFailed / RollbackFailed, for an operator) */
};

typedef struct rm_tcc_call {
  const char *xid;
  int64_t branch_id;
  const char *resource_id;
  const char *args; /* what the try recorded (rm_tcc_try's 'args'); NULL if none */
  PGconn *pg;       /* the library's connection to the resource's database, inside the fence's
                       local transaction: write the business change here; never COMMIT or
                       ROLLBACK it (the library does, with the fence row) */
} rm_tcc_call_t;

/* A confirm or a cancel, on a worker thread of the library.  'errmsg' (cap
 * 'errlen') says why on failure.  A change outside 'pg' (Redis, another
 * service) must be idempotent: when the fence's commit fails after it,
 * the handler runs again. */
typedef int (*rm_tcc_handler_fn)(const rm_tcc_call_t *call, void *arg, char *errmsg, size_t errlen);

typedef struct rm_tcc_handlers {
  rm_tcc_handler_fn confirm; /* required */
  rm_tcc_handler_fn cancel;  /* required */
  void *arg;                 /* passed to both; must outlive the client */
} rm_tcc_handlers_t;

/*
 * Serve TCC branches of 'resource_id' (one PostgreSQL database, as for
 * rm_resource_add, which this adds it with if needed; an AT resource may
 * also serve TCC) with 'h'.  Checks that the database has the fence (the
 * "rm" schema set at version 2 or later).  While this process runs it
 * confirms and cancels every TCC branch of the resource, its own or
 * others'.  0, or RM_E_INVALID (NULL, a missing handler, TCC handlers
 * set already), RM_E_NO_TABLE (no branch_fence table: rm_errmsg says what to
 * run), the codes of rm_resource_add.
 */
RM_API int rm_tcc_resource_add(rm_client_t *c, const char *resource_id, const char *conninfo,
                               const rm_tcc_handlers_t *h);

/*
 * The try of a TCC branch of 'xid' inside the caller's local transaction
 * on 'pg' (the caller has run BEGIN, on a connection to the resource's
 * database): registers the branch with the coordinator and inserts its
 * fence row with 'args' (text the handlers get back, at most 64 KiB, may
 * be NULL).  The caller then makes its reservation in the same
 * transaction and COMMITs; if that fails, nothing was tried, and the
 * cancel the coordinator sends finds no row: an empty rollback.  On any
 * error the caller must ROLLBACK.  '*branch_id' (may be NULL) gets the
 * branch id.  Codes: the coordinator's from the registration
 * (RM_E_GLOBAL_NOT_ACTIVE when it is already being rolled back, ...),
 * RM_E_FENCE when the fence says the branch was cancelled before its
 * try (anti-hanging: the reservation must not be made), RM_E_INVALID (NULL,
 * xid empty or over 128 bytes, a resource without TCC handlers, args too
 * long), RM_E_STATE ('pg' not in a transaction block), RM_E_DB.
 */
RM_API int rm_tcc_try(rm_client_t *c, const char *xid, const char *resource_id, PGconn *pg, const char *args,
                      int64_t *branch_id);

/* ----------------------------------------------------- RM: Saga mode --- */

/*
 * A saga: a global transaction of ordered steps, each an action and its
 * compensation.  The TM begins the global and adds the steps in order
 * (rm_saga_step: the resource and the step's args, which the coordinator
 * stores); rm_tm_commit then lets the coordinator run the actions one at
 * a time, in that order, each through an RM serving the step's resource
 * (rm_saga_resource_add), with phase two's retries.  When an action fails
 * for good (RM_TCC_FAILED, or the fence refuses it), the coordinator runs
 * the compensations, newest first, of the steps before it and of the step
 * itself.  Its state is in the coordinator's store: a coordinator that
 * dies goes on where it was; `tcctl show XID` lists the steps.
 *
 * Each action and each compensation runs inside a local transaction of
 * the resource's database with the fence row (as TCC's confirm and
 * cancel): at most once, duplicates answered from the row; a compensation
 * of a step whose action never committed is an empty compensation
 * (recorded, its handler not run), and an action that comes after it is
 * refused.  A handler's change outside the database must be idempotent.
 *
 * rm_tm_commit of a saga returns: 0 (*status Committed: every action
 * ran); RM_E_GLOBAL_NOT_ACTIVE (*status Rollbacked: a step failed, the
 * saga is compensated; rm_errmsg has why); RM_E_COMMIT_PENDING (a step is
 * being retried); RM_E_ROLLBACK_PENDING (compensations being retried);
 * RM_E_ROLLBACK_FAILED (a compensation failed for good: an operator's).
 * rm_tm_rollback before the commit: every step is compensated (empty:
 * no action ran).  A saga may hold TCC and XA branches too; an AT
 * branch's global locks go at the commit decision, so its undo, should a
 * later step fail, may find the row changed (checked: RollbackFailed for
 * an operator, nothing overwritten): keep AT out of sagas.
 */

/* The handlers of a saga resource; rm_tcc_call_t.args is the step's args. */
typedef struct rm_saga_handlers {
  rm_tcc_handler_fn action;     /* required */
  rm_tcc_handler_fn compensate; /* required */
  void *arg;                    /* passed to both; must outlive the client */
} rm_saga_handlers_t;

/*
 * Run the saga steps of 'resource_id' (one PostgreSQL database with the
 * fence, as for rm_tcc_resource_add) with 'h', for every saga of the
 * coordinator, while this process runs.  0, or RM_E_INVALID (NULL, a
 * missing handler, saga handlers set already), RM_E_NO_TABLE (no
 * branch_fence table), the codes of rm_resource_add.
 */
RM_API int rm_saga_resource_add(rm_client_t *c, const char *resource_id, const char *conninfo,
                                const rm_saga_handlers_t *h);

/*
 * Add the next step of saga 'xid' (begun, not yet committed) on
 * 'resource_id' with 'args' (text the handlers get, at most 64 KiB, may be
 * NULL).  This process need not serve the resource.  '*branch_id' (may be
 * NULL) gets the step's id.  Add the steps one after the other (each call
 * returns before the next): their order is the order of the calls.
 * Codes: the coordinator's (RM_E_GLOBAL_NOT_ACTIVE once the saga is
 * committed or rolled back, RM_E_TIMED_OUT), RM_E_INVALID.
 */
RM_API int rm_saga_step(rm_client_t *c, const char *xid, const char *resource_id, const char *args,
                        int64_t *branch_id);

/* ------------------------------------------------------- RM: XA mode --- */

/*
 * An XA branch: the branch's work is one local transaction of the
 * resource's database that rm_xa_prepare ends with PREPARE TRANSACTION;
 * the coordinator's phase two is COMMIT PREPARED or ROLLBACK PREPARED,
 * run by any RM of the resource (the prepared transaction outlives the
 * process that prepared it, and pg_prepared_xacts lists it as
 * "txc:BRANCH_ID:XID").  No undo log, no before image, no global row lock:
 * the database's own row locks are held from the branch's statements to
 * phase two, so use it for rows that are not hot.  The server needs
 * max_prepared_transactions > 0; the database needs the fence (the "rm"
 * schema set at version 2), which tells a duplicate commit from a branch
 * that never prepared and refuses a start after its global's rollback.
 *
 *   BEGIN; rm_xa_start(c, xid, "ledger", pg, &bid);
 *   ... the branch's statements on pg ...
 *   rm_xa_prepare(c, xid, pg, bid);      (instead of COMMIT; ROLLBACK on any failure before)
 *   ... later: rm_tm_commit or rm_tm_rollback of xid, by the TM
 */

/* Serve XA branches of 'resource_id' (added with rm_resource_add if need
 * be).  0 (also when it serves them already), RM_E_INVALID,
 * RM_E_NO_TABLE (no branch_fence table: rm_errmsg says what to run),
 * RM_E_NOT_SUPPORTED (max_prepared_transactions is 0), RM_E_DB, and the
 * codes of rm_resource_add. */
RM_API int rm_xa_resource_add(rm_client_t *c, const char *resource_id, const char *conninfo);

/* Start an XA branch of 'xid' in the caller's transaction on 'pg' (after
 * BEGIN): registers it and writes its fence row.  '*branch_id' gets its id.
 * Codes as rm_tcc_try's: the registration's, RM_E_FENCE (rolled back
 * before it started: do not go on), RM_E_INVALID, RM_E_STATE, RM_E_DB.  On
 * any error the caller must ROLLBACK. */
RM_API int rm_xa_start(rm_client_t *c, const char *xid, const char *resource_id, PGconn *pg, int64_t *branch_id);

/* End the branch's transaction on 'pg' with PREPARE TRANSACTION: 0, the
 * connection is then idle (outside a transaction) and free for other
 * work.  RM_E_DB: nothing was prepared (the transaction had failed, or the
 * PREPARE did; either way it was rolled back, and the coordinator's
 * rollback of the branch is an empty one).  RM_E_INVALID, RM_E_STATE (not
 * inside a transaction). */
RM_API int rm_xa_prepare(rm_client_t *c, const char *xid, PGconn *pg, int64_t branch_id);

/* ============================================================================
 * Redis prefilter (rm_prefilter_*): the stock gate in front of the global
 * transaction, and the stock lifecycle freeze -> confirm | release.
 *
 * NOTES
 *   An rm_prefilter_t is independent of rm_client_t: create one per Redis
 *   (it needs no coordinator).  It runs the scripts of lua/ (embedded in the
 *   library at build time; SCRIPT LOAD on every new connection, EVALSHA per
 *   call, re-loaded once on NOSCRIPT) over a pool of blocking connections,
 *   one command in flight per connection, used by the calling thread
 *   itself: no background thread.  Every function is safe to call from any
 *   number of threads at once.
 *
 *   Keys: every key of activity A carries the hash tag {act_A} (Redis
 *   Cluster: one slot per activity); lua/stock_lib.lua documents the
 *   layout.
 *
 *   Deadlines: no call hangs, whatever Redis does: every blocking step has
 *   its own bound: waiting for a pooled connection ('command_timeout_ms'),
 *   connecting ('connect_timeout_ms'), and each socket read or write of the
 *   script loading of a new connection, of the command, and of the one
 *   re-load + retry after a NOSCRIPT ('command_timeout_ms' without
 *   progress).  A stopped Redis (SIGSTOP) costs a call about one
 *   'command_timeout_ms'; a dead one costs nothing (refused at once, then
 *   the backoff).  A command that was sent and got no answer in time fails with
 *   RM_E_UNKNOWN_OUTCOME (it may have run) and its connection is closed; one
 *   that could not be sent fails with RM_E_CONN_LOST (it did not run).
 *   After a failed connect, new connects wait for a backoff (doubling, up to
 *   'reconnect_max_ms'); calls meanwhile fail at once with RM_E_CONN_LOST.
 *   A call that meets a reconciliation's hold (rm_prefilter_reconcile) waits
 *   for it to end, polling every 2-25 ms, at most 3 s, then fails with
 *   RM_PF_E_HELD having changed nothing.
 *   Retrying after RM_E_UNKNOWN_OUTCOME is safe: a freeze repeated with the
 *   same order id returns the bucket of the first; a repeated confirm or
 *   release answers RM_PF_ALREADY_CONFIRMED / RM_PF_ALREADY_RELEASED.
 *
 *   Durability: Redis only filters; PostgreSQL (the stock database, tables
 *   activity, activity_ticket_bucket and stock_freeze of sql/stock/) is the
 *   truth.  The rm_prefilter_pg_* functions make the same lifecycle changes
 *   there; rm_prefilter_seed/reconcile put PostgreSQL's state into Redis;
 *   rm_prefilter_expire releases freezes past their deadline, deciding each
 *   in PostgreSQL first, so that neither a process restart nor a Redis
 *   restart forgets an expiry.
 *
 *   Errors: 0 or >= 0 on success, else a code: RM_PF_* below or RM_E_*
 *   above; rm_prefilter_strerror() describes both.  rm_prefilter_errmsg()
 *   has the details (Redis's or PostgreSQL's message) of the calling
 *   thread's last failure.
 * ========================================================================== */

/* Results and errors of the prefilter (-10401 .. -10408 are the scripts'
 * codes -1 .. -8, shifted). */
enum {
  RM_PF_NOT_ON_SALE = -10401,       /* not on sale: status not 1, or outside the sale window */
  RM_PF_OVER_LIMIT = -10402,        /* the user would hold more than the limit */
  RM_PF_SOLD_OUT = -10403,          /* no bucket has the quantity */
  RM_PF_BAD_ARGS = -10404,          /* an argument out of range; nothing changed */
  RM_PF_NOT_LOADED = -10405,        /* the activity is not in Redis: seed it */
  RM_PF_ALREADY_CONFIRMED = -10406, /* the order was confirmed before: no-op */
  RM_PF_ALREADY_RELEASED = -10407,  /* the order was released before: no-op */
  RM_PF_UNKNOWN_ORDER = -10408,     /* no freeze of this order */
  RM_PF_ALREADY_WAITING = -10409,   /* waitlist: the user was already on it */
  RM_PF_E_REDIS = -10420,           /* Redis answered an error (errmsg has it) */
  RM_PF_E_REPLY = -10421,           /* Redis answered something unexpected */
  RM_PF_E_CONFLICT = -10422,        /* reconcile: Redis kept changing meanwhile */
  RM_PF_NO_ACTIVITY = -10423,       /* the activity is not in PostgreSQL */
  RM_PF_E_HELD = -10424,            /* a reconciliation held the activity longer than a call waits */
};

typedef struct rm_prefilter rm_prefilter_t;

/* Numbers: 0 means the default. */
typedef struct rm_pf_options {
  unsigned command_timeout_ms; /* one command round trip, default 200 */
  unsigned connect_timeout_ms; /* default 500 */
  unsigned max_connections;    /* pool size, default 64 */
  unsigned reconnect_max_ms;   /* longest backoff after failed connects, default 2000 */
  unsigned freeze_ttl_ms;      /* deadline of rm_prefilter_freeze, default 900000 (15 min) */
  rm_log_cb log_cb;            /* may be NULL: no logging */
  void *log_arg;
  int log_level;               /* rm_log_level_t, 0 = RM_LOG_WARN */
} rm_pf_options_t;

/*
 * Create a prefilter for the Redis at 'redis_url':
 * "redis://[:password@]host[:port][/db]" (port 6379 and db 0 by default;
 * host may be "[v6addr]").  'opts' may be NULL (all defaults).  Connects
 * lazily: no network I/O here.  RM_E_INVALID (bad URL or option),
 * RM_E_NOMEM.
 */
RM_API int rm_prefilter_new(const char *redis_url, const rm_pf_options_t *opts, rm_prefilter_t **out);
/* Close every connection and free 'pf'.  No call may be running on it.
 * rm_prefilter_free(NULL) does nothing. */
RM_API void rm_prefilter_free(rm_prefilter_t *pf);

/*
 * Open connections now, up to 'n' (at most the pool's max_connections),
 * each connected, authenticated and with every script loaded, and leave
 * them idle in the pool, so that a burst of calls soon after (a sale's
 * first second, right after a deploy) pays no connects: without it each
 * of the burst's concurrent calls opens its own connection on the way.
 * Connections already idle count towards 'n'.  Blocks while it connects
 * (at most the connect timeout each).  0, or the first failure
 * (RM_E_CONN_LOST: Redis unreachable, or in the pool's backoff;
 * RM_E_DEADLINE: every slot in use); the connections opened before it
 * stay.  '*opened' (may be NULL): how many it opened.  Redis keeps idle
 * connections unless its 'timeout' is set, and the pool checks one that
 * sat idle before lending it.
 */
RM_API int rm_prefilter_prewarm(rm_prefilter_t *pf, unsigned n, unsigned *opened);

/* Describes any code (prefilter or core; falls back to rm_strerror). */
RM_API const char *rm_prefilter_strerror(int code);
/* Details of the calling thread's last failed call ("" if none): the same
 * message as rm_errmsg(). */
RM_API const char *rm_prefilter_errmsg(void);

/*
 * Freeze 'qty' (1..10000) tickets of 'ticket_type' (>= 0) in 'activity_id'
 * (>= 1) for 'user_id' and 'order_id' (>= 1), atomically in Redis: sale on,
 * the user's tickets + qty <= the activity's limit, a bucket with qty
 * available (starting at order id mod buckets).  0 and '*bucket' (may be
 * NULL) on success, else RM_PF_NOT_ON_SALE, RM_PF_OVER_LIMIT,
 * RM_PF_SOLD_OUT, RM_PF_BAD_ARGS, RM_PF_NOT_LOADED,
 * RM_PF_ALREADY_CONFIRMED/RELEASED (the order id was used and finished),
 * or a transport error.  The freeze expires 'freeze_ttl_ms' from now.
 */
RM_API int rm_prefilter_freeze(rm_prefilter_t *pf, int64_t activity_id, int32_t ticket_type,
                               int64_t user_id, int64_t order_id, int32_t qty, int *bucket);
/* The same with an explicit deadline 'deadline_ms' (unix milliseconds), to
 * pass the same one to rm_prefilter_pg_freeze. */
RM_API int rm_prefilter_freeze_until(rm_prefilter_t *pf, int64_t activity_id, int32_t ticket_type,
                                     int64_t user_id, int64_t order_id, int32_t qty,
                                     int64_t deadline_ms, int *bucket);
/* The queued order mode: the same freeze, and in the same script a new
 * freeze adds an entry to the activity's stream (rm_prefilter_queue_key)
 * with the fields order, user, tt, qty, bucket, deadline and, when
 * 'idem_key' is not NULL (1 .. 64 of A-Za-z0-9._:-), key, for the
 * consumer that creates the order (a repeat of a freeze adds nothing).
 * Codes as rm_prefilter_freeze. */
RM_API int rm_prefilter_freeze_queued(rm_prefilter_t *pf, int64_t activity_id, int32_t ticket_type,
                                      int64_t user_id, int64_t order_id, int32_t qty, int64_t deadline_ms,
                                      const char *idem_key, int *bucket);
/* The name of that stream ("{act_<A>}:queue") into 'out' (64 bytes are
 * enough).  0, or RM_E_INVALID (activity < 1, 'out' too small). */
RM_API int rm_prefilter_queue_key(int64_t activity_id, char *out, size_t outlen);
/* Payment: frozen -> sold, once.  0, RM_PF_ALREADY_CONFIRMED,
 * RM_PF_ALREADY_RELEASED (release won the race: refund), RM_PF_UNKNOWN_ORDER,
 * RM_PF_BAD_ARGS, transport errors. */
RM_API int rm_prefilter_confirm(rm_prefilter_t *pf, int64_t activity_id, int32_t ticket_type,
                                int64_t order_id);
/* Cancel: frozen -> available, the user's count down, once.  0,
 * RM_PF_ALREADY_RELEASED, RM_PF_ALREADY_CONFIRMED (payment won),
 * RM_PF_UNKNOWN_ORDER, RM_PF_BAD_ARGS, transport errors. */
RM_API int rm_prefilter_release(rm_prefilter_t *pf, int64_t activity_id, int32_t ticket_type,
                                int64_t order_id);

/* Waitlist of one ticket type, first come first served, one entry per
 * user.  0 (joined now) or RM_PF_ALREADY_WAITING (the first entry stays),
 * with '*position' (may be NULL; 0 = next) set in both cases; or
 * RM_PF_OVER_LIMIT (could never be served), RM_PF_BAD_ARGS,
 * RM_PF_NOT_LOADED, transport errors. */
RM_API int rm_prefilter_waitlist_join(rm_prefilter_t *pf, int64_t activity_id, int32_t ticket_type,
                                      int64_t user_id, int32_t qty, long *position);

/* One user handled by rm_prefilter_waitlist_fill. */
typedef struct rm_pf_fill {
  int64_t user_id;
  int64_t order_id; /* the order id used (create this order), 0 if not served */
  int32_t qty;
  int32_t bucket;   /* >= 0: frozen in this bucket */
  int code;         /* 0 served; RM_PF_OVER_LIMIT or RM_PF_BAD_ARGS: removed */
} rm_pf_fill_t;

/*
 * Stock came back: serve waiting users in order with the same checks as a
 * freeze, using 'order_ids[0..n_ids-1]' (1..1000 new order ids) in turn for
 * the users served; users whose limit no longer fits are removed, users
 * whose quantity fits no bucket now keep their place.  Looks at most at the
 * first 1000 entries.  Writes up to 'cap' (1..10000) entries to 'out' and
 * their number to '*n_out'.  Deadline of the freezes: 'deadline_ms' (unix
 * ms), 0 = freeze_ttl_ms from now.  0, or RM_PF_NOT_ON_SALE,
 * RM_PF_NOT_LOADED, RM_PF_BAD_ARGS (also: an order id already used or
 * repeated; nothing changed), transport errors.
 */
RM_API int rm_prefilter_waitlist_fill(rm_prefilter_t *pf, int64_t activity_id, int32_t ticket_type,
                                      const int64_t *order_ids, size_t n_ids, int64_t deadline_ms,
                                      rm_pf_fill_t *out, size_t cap, size_t *n_out);

/*
 * More tickets: the stock database already holds them ('bucket_stock[i]'
 * is bucket i's stock there after the addition, i = 0 .. n_buckets-1,
 * 1 .. 100000 buckets).  In one atomic script, Redis's stock of each
 * bucket is raised to that value (never lowered: stock only grows, so a
 * repeat or two additions applied out of order end where PostgreSQL is)
 * and, while the sale is open, the waitlist is served from the new
 * tickets first, exactly as rm_prefilter_waitlist_fill with
 * 'order_ids[0..n_ids-1]' (0 .. 1000 new ids; 0: raise only).  0 with
 * '*n_out' users handled in 'out' (none while the sale is not open);
 * RM_PF_NOT_LOADED (nothing raised: loading the activity copies
 * PostgreSQL's stock), RM_PF_BAD_ARGS, transport errors.
 */
RM_API int rm_prefilter_stock_add(rm_prefilter_t *pf, int64_t activity_id, int32_t ticket_type,
                                  const int64_t *bucket_stock, size_t n_buckets, const int64_t *order_ids,
                                  size_t n_ids, int64_t deadline_ms, rm_pf_fill_t *out, size_t cap,
                                  size_t *n_out);

/* ---- PostgreSQL, the truth (sql/stock/) ----
 * 'pg' is the caller's connection to the stock database, used by one
 * thread at a time; the rm_prefilter_pg_* calls run in its current
 * transaction when one is open (so the stock service can make them part of
 * its own local transaction), else in their own.  Inside an AT branch use
 * rm_at_update_delta on activity_ticket_bucket and rm_at_insert into
 * stock_freeze instead, so that a global rollback undoes them.
 * RM_E_DB: a statement failed (rm_prefilter_errmsg has the message);
 * RM_E_STATE: 'pg' is in a failed transaction. */

/* Record a freeze that Redis granted: bucket frozen_count += qty (if it
 * fits: else RM_PF_SOLD_OUT; and if the user stays within the activity's
 * per_user_limit: else RM_PF_OVER_LIMIT; and if the activity is on sale
 * now, status 1 inside starts_at .. ends_at: else RM_PF_NOT_ON_SALE,
 * sql/stock/006), a stock_freeze row (FROZEN,
 * 'deadline_ms'), a stock_log "freeze" row.  0; 1 when this very freeze was
 * recorded before; RM_PF_ALREADY_CONFIRMED / RM_PF_ALREADY_RELEASED;
 * RM_PF_BAD_ARGS (the order id was recorded with other values, no such
 * activity, or a value out of range).  When it refuses, release the Redis
 * freeze (rm_prefilter_release): Redis let through what the truth does not
 * hold (e.g. it lost writes in a restart). */
RM_API int rm_prefilter_pg_freeze(PGconn *pg, int64_t activity_id, int32_t ticket_type,
                                  int32_t bucket, int64_t user_id, int64_t order_id, int32_t qty,
                                  int64_t deadline_ms);
/* FROZEN -> CONFIRMED and frozen -> sold, once.  0, RM_PF_ALREADY_CONFIRMED,
 * RM_PF_ALREADY_RELEASED, RM_PF_UNKNOWN_ORDER.  Call it first and
 * rm_prefilter_confirm after it returned 0: PostgreSQL decides the race. */
RM_API int rm_prefilter_pg_confirm(PGconn *pg, int64_t order_id);
/* FROZEN -> RELEASED and frozen_count -= qty, once (reason "cancel").
 * Codes as rm_prefilter_pg_confirm. */
RM_API int rm_prefilter_pg_release(PGconn *pg, int64_t order_id);

/* What reconciliation found different in Redis (and, unless dry run,
 * corrected): numbers of fields or members. */
typedef struct rm_pf_reconcile {
  unsigned meta;      /* status, limit, starts, ends (the sale window) */
  unsigned buckets;   /* n, stock:i, frozen:i, sold:i */
  unsigned users;     /* per-user ticket counts */
  unsigned orders;    /* freeze records */
  unsigned deadlines; /* expiry zset entries */
} rm_pf_reconcile_t;
/* One difference: 'key' and 'field' (the member for a zset); 'redis_value'
 * NULL = absent in Redis; 'pg_value' NULL = to be deleted.  The strings are
 * valid during the call. */
typedef void (*rm_pf_change_cb)(const char *key, const char *field, const char *redis_value,
                                const char *pg_value, void *arg);

/*
 * Make Redis agree with PostgreSQL for 'activity_id': status and limit
 * (activity), buckets of every ticket type (activity_ticket_bucket: n,
 * stock, frozen, sold), users' ticket counts and freeze records and
 * deadlines (stock_freeze).  Reads PostgreSQL in one snapshot, then changes
 * Redis in one MULTI/EXEC guarded by WATCH (retried when a script changed
 * the keys meanwhile; RM_PF_E_CONFLICT after 10 tries).  Under a sale that
 * never pauses every round would be aborted: after two aborted rounds,
 * each further round first holds the activity's writers (the field "hold"
 * of its meta hash: a deadline of 4x the last round's time + 100 ms, at
 * most 2 s, on the Redis server's clock), and its EXEC deletes the hold.
 * Meanwhile the freezes, confirms, releases, expiries and fills of the
 * activity wait in the library and then run (RM_PF_E_HELD only after 3 s
 * of waiting); a hold whose reconciler died ends at its deadline.  A dry
 * run never holds.  Freezes that Redis
 * granted but PostgreSQL never recorded are dropped: run it while the sale
 * is paused or idle (e.g. after a Redis restart, before reopening), or
 * accept that in-flight freezes may be counted again by the next run.
 * '*report' (may be NULL) gets the numbers; 'cb' (may be NULL) each
 * difference.  'dry_run': report only.  0, RM_PF_NO_ACTIVITY, RM_E_DB,
 * RM_E_STATE ('pg' inside a transaction), transport errors.
 */
RM_API int rm_prefilter_reconcile(rm_prefilter_t *pf, PGconn *pg, int64_t activity_id, bool dry_run,
                                  rm_pf_reconcile_t *report, rm_pf_change_cb cb, void *arg);
/* Load an activity into Redis from PostgreSQL: reconcile without a report. */
RM_API int rm_prefilter_seed(rm_prefilter_t *pf, PGconn *pg, int64_t activity_id);

/* One freeze released by rm_prefilter_expire.  'orphan': Redis had it but
 * PostgreSQL never recorded it (released in Redis only). */
typedef void (*rm_pf_expired_cb)(int64_t order_id, int64_t user_id, int32_t qty, int32_t bucket,
                                 bool orphan, void *arg);

/*
 * The expiry sweep of one ticket type: release up to 'max' (1..10000)
 * freezes whose deadline is <= 'now_ms' (unix ms; 0 = now), exactly once
 * each.  With 'pg' (may be NULL: Redis alone decides), PostgreSQL decides:
 * 1. due FROZEN stock_freeze rows are released there (one transaction,
 *    rows locked with SKIP LOCKED so sweeps may run concurrently), then in
 *    Redis; 2. due entries of the Redis expiry zset are checked against
 *    PostgreSQL: released or confirmed there -> the same in Redis; unknown
 *    there -> an orphan, released in Redis; frozen there with a later
 *    deadline -> the Redis deadline is corrected.  A crash between the
 *    steps is repaired by the next sweep; deadlines live in PostgreSQL and
 *    in the Redis zset (rebuilt from PostgreSQL by reconcile), never in a
 *    timer.  'cb' (may be NULL) runs for each release; '*released' (may be
 *    NULL) gets their number.  0 or an error code.
 */
RM_API int rm_prefilter_expire(rm_prefilter_t *pf, PGconn *pg, int64_t activity_id,
                               int32_t ticket_type, int64_t now_ms, unsigned max,
                               rm_pf_expired_cb cb, void *arg, unsigned *released);

/* Counters per result of each operation since rm_prefilter_new. */
typedef struct rm_pf_counts {
  uint64_t ok;
  uint64_t not_on_sale, over_limit, sold_out, bad_args, not_loaded;
  uint64_t already_confirmed, already_released, unknown_order, already_waiting;
  uint64_t unknown_outcome; /* sent, no answer in time (or the connection died) */
  uint64_t not_sent;        /* no connection (Redis down, backoff, pool busy) */
  uint64_t error;           /* Redis error, unexpected reply, database, memory */
} rm_pf_counts_t;
typedef struct rm_pf_stats {
  rm_pf_counts_t freeze, confirm, release, waitlist_join, waitlist_fill, expire;
  uint64_t connects;         /* connections opened (scripts loaded) */
  uint64_t connect_failures;
  uint64_t noscript_reloads; /* NOSCRIPT answered: loaded again and retried */
  uint64_t stale_closed;     /* idle connections found closed by Redis */
  unsigned open_connections;
  rm_pf_counts_t stock_add;  /* rm_prefilter_stock_add */
} rm_pf_stats_t;
RM_API void rm_prefilter_stats(rm_prefilter_t *pf, rm_pf_stats_t *out);

/* The SHA1 of script 'name' ("freeze", "confirm", "release", "expire",
 * "waitlist_join", "waitlist_fill", "stock_add") as loaded, for EVALSHA by other tools
 * (41 bytes with the NUL).  Connects if needed.  0, RM_E_INVALID (unknown
 * name), transport errors. */
RM_API int rm_prefilter_script_sha(rm_prefilter_t *pf, const char *name, char *sha);

/* ============================================================================
 * Fallback to local mode (degrade), local-mode orders, compensation and
 * reconciliation.
 *
 * NOTES
 *   Mode.  A client is in RM_MODE_GLOBAL (orders run as global
 *   transactions) or RM_MODE_LOCAL (no coordinator answers: orders run as
 *   local transactions with compensation records, see rm_local_* below).
 *   The mode is advice the services read before each order
 *   (rm_client_mode); the TM/RM calls above behave the same in both modes.
 *
 *   Detection (rm_client_degrade_enable): the client's background thread
 *   probes the coordinators: every 'probe_interval_ms' one GlobalStatus
 *   round trip (of an xid that does not exist: the answer "not found"
 *   proves that a node and its store work), which must be answered within
 *   'probe_timeout_ms' (default: the connect timeout, 3 s).  A failed
 *   probe is one where no node answered in time (none reachable, none
 *   registered, the store unavailable, or no answer).  'fail_threshold'
 *   consecutive failed probes switch the client to local mode;
 *   'recover_threshold' consecutive answered probes switch it back.  A
 *   call of the TM/RM API that ends with RM_E_NO_NODE makes the next probe
 *   start at once (at most 4 a second), and with no node registered a
 *   probe fails at once: with every coordinator gone the client switches
 *   within about fail_threshold * probe_interval_ms (2-3 s by default), and
 *   the calls that still wait for a node then end with RM_E_NO_NODE.  Each
 *   switch is logged (warning) and counted.
 *
 *   Forcing: rm_client_force_mode(c, RM_MODE_LOCAL or RM_MODE_GLOBAL)
 *   overrides detection (which keeps probing), RM_MODE_AUTO gives the
 *   decision back to it.  Services read the operator's choice from the
 *   environment variable RM_MODE_ENV ("auto", "global" or "local") with
 *   rm_mode_parse().
 *
 *   An order begun in global mode whose rm_tm_begin failed with
 *   RM_E_NO_NODE or RM_E_DEADLINE certainly has no global transaction: it
 *   may be taken in local mode instead.
 * ========================================================================== */

enum {
  RM_MODE_AUTO = 0,   /* rm_client_force_mode: let detection decide */
  RM_MODE_GLOBAL = 1, /* global transactions through the coordinator */
  RM_MODE_LOCAL = 2,  /* local transactions + compensation records */
};

/* The environment variable services read for a forced mode. */
#define RM_MODE_ENV "TXC_TX_MODE"

/* Numbers: 0 means the default. */
typedef struct rm_degrade_opts {
  unsigned fail_threshold;    /* consecutive failed probes -> local, default 3 */
  unsigned recover_threshold; /* consecutive answered probes -> global, default 3 */
  unsigned probe_interval_ms; /* pause between two probes, default 1000 */
  unsigned probe_timeout_ms;  /* a probe's deadline, default the connect timeout */
} rm_degrade_opts_t;

/* Start (or retune) degrade detection on 'c'; 'opts' may be NULL (all
 * defaults).  Until it is called the client stays in RM_MODE_GLOBAL unless
 * forced.  0, RM_E_INVALID (NULL client, a threshold over 1000, an
 * interval or timeout over one hour). */
RM_API int rm_client_degrade_enable(rm_client_t *c, const rm_degrade_opts_t *opts);
/* RM_MODE_GLOBAL or RM_MODE_LOCAL: the forced mode if any, else the
 * detected one.  Any thread, no blocking.  RM_MODE_GLOBAL for NULL. */
RM_API int rm_client_mode(rm_client_t *c);
/* Force 'mode' (RM_MODE_GLOBAL or RM_MODE_LOCAL), or RM_MODE_AUTO to end
 * forcing.  Logged.  0 or RM_E_INVALID. */
RM_API int rm_client_force_mode(rm_client_t *c, int mode);
/* "auto", "global", "local" (case-insensitive) -> RM_MODE_*; NULL or ""
 * -> RM_MODE_AUTO; anything else RM_E_INVALID. */
RM_API int rm_mode_parse(const char *s);
/* "auto", "global", "local" or "?". */
RM_API const char *rm_mode_name(int mode);

typedef struct rm_degrade_stats {
  int mode;                 /* rm_client_mode() */
  int forced;               /* RM_MODE_AUTO, or the forced mode */
  int detected;             /* what detection says: RM_MODE_GLOBAL or RM_MODE_LOCAL */
  bool enabled;             /* rm_client_degrade_enable was called */
  uint64_t to_local;        /* switches of rm_client_mode() to local */
  uint64_t to_global;       /* switches back */
  uint64_t probes;          /* probes finished */
  uint64_t probe_failures;  /* of which failed */
  unsigned fail_streak;     /* consecutive failed probes now */
  unsigned ok_streak;       /* consecutive answered probes now */
  uint64_t local_orders;    /* this client's: rm_client_local_stats().orders */
} rm_degrade_stats_t;
RM_API void rm_client_degrade_stats(rm_client_t *c, rm_degrade_stats_t *out);

/* ---- Local-mode orders (no coordinator) ----
 *
 * One order in local mode, across the services:
 *   1. order-service: rm_prefilter_freeze (Redis is the stock gate) ->
 *      bucket; refused: answer the refusal, nothing else happened.
 *   2. order-service: rm_local_order_insert on the orders database: the
 *      trade_order row (UNPAID, no xid) and its compensation row, in one
 *      local transaction.  Failed: rm_prefilter_release, answer an error.
 *   3. stock-service (called with the order, no xid):
 *      rm_local_stock_freeze on the stock database: its compensation row
 *      and the guarded freeze in one local transaction, decided once per
 *      order.
 *   4. order-service, by stock-service's answer: frozen ->
 *      rm_local_order_finish: the order stands; refused (a refusal code
 *      that stock-service got from step 3, which recorded it) ->
 *      rm_local_order_cancel: the order is cancelled with a reason and the
 *      Redis freeze released; no answer -> leave it: the compensation job
 *      asks the stock database itself (step 3 again, idempotent) and
 *      finishes the order either way.  Never cancel an order whose stock
 *      side did not answer a refusal: it may have frozen.
 * No undo log, no global lock.  Every function here is idempotent by order
 * id and runs in the caller's transaction when one is open on 'pg' (else
 * in its own).  Codes as the prefilter's; details in rm_local_errmsg().
 * 'c' is the client whose counters a success adds to
 * (rm_client_local_stats); it may be NULL: counted nowhere (the
 * compensation job names none: its figures are in rm_comp_report_t).
 * Nothing else of 'c' is used: no coordinator is asked.
 * The tables and functions are in sql/orders/002_local_compensation.sql
 * and sql/stock/003_stock_compensation.sql. */

typedef struct rm_local_order {
  int64_t order_id;    /* >= 1 */
  int64_t activity_id; /* >= 1 */
  int32_t ticket_type; /* >= 0 */
  int32_t bucket;      /* the bucket the Redis freeze returned, >= 0 */
  int64_t user_id;     /* >= 1 */
  int32_t qty;         /* 1..10000 */
  int64_t expire_ms;   /* trade_order.expire_at, unix ms; 0 = now + 15 min */
  int64_t deadline_ms; /* the stock freeze's deadline, unix ms; 0 = expire_ms */
  const char *idem_key; /* the client's idempotency key, stored with the order
                           (1..64 bytes of [A-Za-z0-9._:-]); NULL = none */
} rm_local_order_t;

/* Results beyond the prefilter's codes. */
enum {
  RM_LOCAL_E_MISMATCH = -10501, /* the order id was recorded with other values */
  RM_LOCAL_E_PAID = -10502,     /* cancel refused: the order is paid (operator) */
  RM_LOCAL_E_DECIDED = -10503,  /* finished before with the other outcome */
  RM_LOCAL_E_IDEM_KEY = -10504, /* another order of the user holds the idempotency key */
  RM_COMP_E_LOCKED = -10510,    /* another compensation job is running */
};

/* Step 2, orders database: 0 inserted, 1 inserted before (a retry),
 * RM_LOCAL_E_MISMATCH, RM_LOCAL_E_IDEM_KEY (another order of o->user_id
 * holds o->idem_key: nothing inserted; the caller answers with that
 * order), RM_E_INVALID (an argument out of range), RM_E_DB, RM_E_STATE.  Every rm_local_* call returns RM_E_INVALID for arguments
 * out of range, having done nothing. */
RM_API int rm_local_order_insert(rm_client_t *c, PGconn *orders_pg, const rm_local_order_t *o);
/* Step 3, stock database: 0 frozen now, 1 frozen before; RM_PF_SOLD_OUT,
 * RM_PF_OVER_LIMIT, RM_PF_BAD_ARGS (no such bucket...), RM_PF_NOT_ON_SALE
 * (outside the sale window, sql/stock/006): refused, now or
 * before (the refusal is recorded: the order will be cancelled);
 * RM_LOCAL_E_MISMATCH, RM_E_INVALID, RM_E_DB, RM_E_STATE (nothing
 * decided). */
RM_API int rm_local_stock_freeze(rm_client_t *c, PGconn *stock_pg, const rm_local_order_t *o);
/* Step 4, the stock side froze: mark the order's compensation done.  0, 1
 * (before), RM_LOCAL_E_DECIDED, RM_PF_UNKNOWN_ORDER (no compensation row),
 * RM_E_DB, RM_E_STATE. */
RM_API int rm_local_order_finish(rm_client_t *c, PGconn *orders_pg, int64_t order_id);
/*
 * Step 4, the stock side refused with 'refusal' (the code
 * rm_local_stock_freeze returned): release the Redis freeze through 'pf'
 * (may be NULL: then reconciliation must align Redis), then cancel the
 * order (UNPAID -> CANCELLED, trade_order.cancel_reason set to a sentence
 * for the user) and mark its compensation done, in one transaction of
 * 'orders_pg' (which must be idle: not inside a transaction).  0, 1
 * (before), RM_LOCAL_E_DECIDED, RM_LOCAL_E_PAID, RM_PF_UNKNOWN_ORDER,
 * RM_E_DB, RM_E_STATE; a Redis transport error (nothing changed in
 * PostgreSQL: retry, or leave it to the job).
 */
RM_API int rm_local_order_cancel(rm_client_t *c, PGconn *orders_pg, rm_prefilter_t *pf, int64_t order_id,
                                 int refusal);
/* Details of the calling thread's last failed call, rm_local_* or
 * rm_compensate among them ("" if none): the same message as rm_errmsg(). */
RM_API const char *rm_local_errmsg(void);

/* Counters of the rm_local_* calls that succeeded with client 'c' named,
 * since rm_client_new.  Per client: the process-wide rm_local_stats() of
 * earlier 0.1 builds is gone.  Any thread; all 0 for a NULL 'c'. */
typedef struct rm_local_stats {
  uint64_t orders;    /* rm_local_order_insert: inserted now */
  uint64_t frozen;    /* rm_local_stock_freeze: frozen now */
  uint64_t refused;   /* rm_local_stock_freeze: refused now */
  uint64_t finished;  /* rm_local_order_finish: done now */
  uint64_t cancelled; /* rm_local_order_cancel: cancelled now */
} rm_local_stats_t;
RM_API void rm_client_local_stats(rm_client_t *c, rm_local_stats_t *out);

/* ---- The compensation job and reconciliation ----
 *
 * rm_compensate_run: one pass, on its own connections to both databases.
 * Only one pass runs at a time across all processes: it holds a session
 * advisory lock on the orders database (released when the pass ends, or
 * when its connection drops: a killed job holds nothing).  For each
 * PENDING order_compensation row (oldest order id first, older than
 * 'min_age_ms'): rm_local_stock_freeze with the recorded order (asking
 * the stock database decides it, once, if stock-service never did:
 * frozen if the stock permits, else refused), then rm_local_order_finish
 * or rm_local_order_cancel.  Each step is idempotent and the decision is
 * durable in the stock database before anything depends on it, so a pass
 * killed at any point and run again reaches the same end state.  Then,
 * with 'reconcile', rm_prefilter_reconcile of every activity of the stock
 * database (or only 'activity_id'): PostgreSQL is the truth; each
 * difference is logged with both values (warning) and counted.
 */
typedef struct rm_comp_options {
  unsigned min_age_ms;   /* skip rows younger than this (their order may be in flight), default 0 */
  unsigned max_rows;     /* at most this many rows per pass, 0 = all */
  bool reconcile;        /* then reconcile Redis with PostgreSQL ('pf' required) */
  int64_t activity_id;   /* reconcile only this activity; 0 = all */
  rm_log_cb log_cb;      /* may be NULL: no logging */
  void *log_arg;
  int log_level;         /* rm_log_level_t, 0 = RM_LOG_WARN */
} rm_comp_options_t;

typedef struct rm_comp_report {
  unsigned rows;          /* pending rows looked at */
  unsigned frozen;        /* finished: the stock froze (now or before) */
  unsigned cancelled;     /* finished: cancelled, Redis freeze released */
  unsigned failed;        /* left pending after an error (retried next pass) */
  unsigned pending;       /* pending rows left when the pass ended */
  unsigned activities;    /* activities reconciled */
  unsigned reconcile_failed; /* activities whose reconciliation failed */
  rm_pf_reconcile_t fixed;   /* differences corrected in Redis, summed */
} rm_comp_report_t;

/* One pass.  'pf' may be NULL only without 'reconcile' (Redis freezes of
 * cancelled orders are then left to a later reconciliation); 'opts' may
 * be NULL (defaults); '*report' (may be NULL) gets the numbers.  0 (the
 * pass ran: see report->failed), RM_COMP_E_LOCKED (another pass holds the
 * lock: nothing done), RM_E_DB (could not connect or query: details in
 * rm_local_errmsg), RM_E_INVALID. */
RM_API int rm_compensate_run(const char *orders_conninfo, const char *stock_conninfo, rm_prefilter_t *pf,
                             const rm_comp_options_t *opts, rm_comp_report_t *report);

/*
 * The scheduler: a background thread that runs a compensation pass every
 * 'interval_ms' and a pass with reconciliation every
 * 'reconcile_interval_ms', and at once when kicked.  Every service
 * instance may run one: the advisory lock lets one pass run at a time.
 */
typedef struct rm_compensator_options {
  const char *orders_conninfo; /* required, copied */
  const char *stock_conninfo;  /* required, copied */
  rm_prefilter_t *pf;          /* borrowed (must outlive the compensator); may be NULL */
  unsigned interval_ms;        /* default 10000 */
  unsigned reconcile_interval_ms; /* default 300000 (5 min); needs 'pf' */
  rm_comp_options_t run;       /* per pass ('reconcile' is set by the schedule) */
} rm_compensator_options_t;

typedef struct rm_compensator rm_compensator_t;

/* Start the thread (the first pass runs at once).  0, RM_E_INVALID,
 * RM_E_NOMEM. */
RM_API int rm_compensator_start(const rm_compensator_options_t *o, rm_compensator_t **out);
/* Ask for a pass now ('reconcile': with reconciliation).  Returns at once. */
RM_API void rm_compensator_kick(rm_compensator_t *k, bool reconcile);
/* Wait until a pass that started after this call has ended (up to
 * 'timeout_ms'); its code and report.  0 = that pass's code, or
 * RM_E_DEADLINE.  Kicks a pass first. */
RM_API int rm_compensator_run_now(rm_compensator_t *k, bool reconcile, unsigned timeout_ms,
                                  rm_comp_report_t *report);
/* Stop the thread (waits for a running pass) and free.  NULL: no-op. */
RM_API void rm_compensator_stop(rm_compensator_t *k);

typedef struct rm_compensator_stats {
  uint64_t passes;        /* passes that ran */
  uint64_t locked;        /* passes skipped: another job held the lock */
  uint64_t errors;        /* passes that failed (connection...) */
  uint64_t frozen, cancelled, failed; /* rows, summed over passes */
  uint64_t reconciled;    /* activities reconciled */
  uint64_t fixed;         /* Redis differences corrected, all kinds */
  int last_code;          /* code of the last pass */
} rm_compensator_stats_t;
RM_API void rm_compensator_stats(rm_compensator_t *k, rm_compensator_stats_t *out);

/* ============================================================================
 * Redis addresses and Sentinel (rm_redis_*): the one parser and resolver of
 * Redis addresses in the project (the prefilter, txc-compensate and the
 * demo services all go through it).
 *
 * NOTES
 *   Two URL forms:
 *     redis://[:password@]host[:port][/db]              one server
 *     redis+sentinel://[:password@]h1[:p1],h2[:p2],.../master-name[/db]
 *   The second names 1..8 Sentinels (port 26379 by default) watching the
 *   master 'master-name'; the password is the master's.  Whoever is given
 *   it finds the master at each (re)connect: the sentinels are asked in
 *   turn (SENTINEL get-master-addr-by-name), the answer is connected to
 *   and must say ROLE master; on a broken connection, a timeout or a
 *   READONLY reply the next connect asks again.  +switch-master is not
 *   subscribed to: every failure re-resolves, and the prefilter's
 *   compensation job (rm_compensator_*) also checks the master once a
 *   second, so no thread is needed for it.  No step waits longer than its
 *   connect or command timeout; with no master reachable the calls fail
 *   at once with RM_E_REDIS_NO_MASTER (the command did not run).
 *
 *   The environment of cluster/local/up --ha: REDIS_SENTINELS
 *   (host:port,...) and REDIS_MASTER_NAME; REDIS_URL names the first
 *   master (for tools that need no failover).  rm_redis_url_from_env
 *   builds the URL every program should use from them.
 * ========================================================================== */

enum {
  RM_E_REDIS_NO_MASTER = -10430, /* no Redis master reachable (Sentinel): did not run */
};

typedef struct rm_redis_addr {
  char host[256];
  int port;
  char password[256]; /* "" = no AUTH */
  int db;
  char run_id[41];    /* the master's run_id ("" for a plain URL: not asked) */
} rm_redis_addr_t;

/* The Redis URL of this process's environment, into 'buf' (cap 'cap'):
 * with REDIS_SENTINELS and REDIS_MASTER_NAME both set and not empty,
 * "redis+sentinel://SENTINELS/NAME" (with the password and db of
 * REDIS_URL, if it has them); else REDIS_URL as it is.  Returns 'buf', or
 * NULL (neither set, or 'cap' too small). */
RM_API const char *rm_redis_url_from_env(char *buf, size_t cap);

/* Whether 'url' is a Redis URL of either form (no I/O). */
RM_API bool rm_redis_url_valid(const char *url);

/* Where the master of 'url' is now.  A redis:// URL: its address, no I/O.
 * A redis+sentinel:// URL: resolved as above (each connect and reply
 * bounded by 'timeout_ms', 0 = 500), run_id filled.  0; RM_E_INVALID (bad
 * URL); RM_E_REDIS_NO_MASTER (rm_prefilter_errmsg() says what each
 * sentinel and the master answered). */
RM_API int rm_redis_resolve(const char *url, unsigned timeout_ms, rm_redis_addr_t *out);

/* How many times the prefilter's connections found another master than
 * the one before (a new address or run_id: a failover or a restart).
 * Each one makes a compensator using 'pf' reconcile Redis with
 * PostgreSQL at once, then every 5 s until a pass (the second or later)
 * finds nothing to correct: a pass drops the freezes in flight, the next
 * puts back those that committed (at most 120 passes; a failed one is
 * retried after 1 s). */
RM_API uint64_t rm_prefilter_master_changes(rm_prefilter_t *pf);

#ifdef __cplusplus
}
#endif

#endif /* RM_CLIENT_H */
