/*
 * rm_at_int.h - internals shared by the AT resource manager's files (at/):
 * rm_at.c (a branch's open, prepare and close on the caller's connection;
 * libpq helpers), rm_at_stmt.c (its statements) and rm_at_frame.c (the
 * frame they run in), rm_resource.c (the state, its resources, the calls
 * the core makes), rm_at_meta.c (table metadata) and rm_undo.c (phase two
 * on the library's own connections, the undo clean-up queue and sweep).
 * The layer includes the core's rm_internal.h and nothing above it.  Not
 * installed.
 *
 * NOTES
 *   Per client, one rm_at_state_t (created by the first rm_resource_add or
 *   rm__at_tune through the core's rm__rm_get, freed by the core through
 *   the rm_rm_ops_t table) holds:
 *     - the resources, an append-only list guarded by 'mu' (a resource is
 *       never removed before the state is freed, so a resource pointer
 *       stays valid for the life of the client);
 *     - per resource: the table metadata cache (its own mutex; entries are
 *       immutable once published), a small pool of phase-two connections
 *       (its own mutex and condition variable) and the queue of committed
 *       branches whose undo rows are waiting to be deleted (guarded by the
 *       state's 'mu');
 *     - the deleter thread, which wakes every 'flush_ms' (or when a queue
 *       reaches 'delete_batch'), deletes queued undo rows in batches,
 *       resolves leftover undo rows through the coordinator every
 *       'resolve_interval_s' (and once soon after a resource is added) and
 *       runs the retention sweep every 'sweep_interval_s'.
 *   Lock order: state mu -> (nothing); pool mu and meta mu are leaves.  No
 *   lock is held across a database call.
 */
#ifndef RM_AT_INT_H
#define RM_AT_INT_H

#include <libpq-fe.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "rm_image.h"
#include "rm_internal.h"
#include "txp_status.h"
#include "rm_pg.h"
#include "txc_pstmt.h"
#include "rm_sql.h"
#include "txc_pgpool.h"

/* Limits of one branch (bad input beyond them is RM_E_INVALID). */
#define RM_AT_MAX_ITEMS 1000                  /* statements per branch */
#define RM_AT_MAX_UNDO_BYTES (8u * 1024 * 1024) /* images per branch, roughly */
#define RM_AT_MAX_NAME 63                     /* PostgreSQL's NAMEDATALEN - 1 */
#define RM_AT_POOL_MAX 64                     /* phase-two connections per resource */
#define RM_AT_MAX_HOT 64                      /* hot counter columns per resource */

/* Knobs of the phase-two side; zero fields of rm__at_tune keep the value. */
typedef struct rm_at_tuning {
  unsigned pool_size;            /* phase-two connections per resource (4) */
  unsigned queue_max;            /* queued commits per resource before inline deletes (10000) */
  unsigned flush_ms;             /* deleter period (1000) */
  unsigned delete_batch;         /* undo rows per DELETE (1000) */
  unsigned sweep_interval_s;     /* retention sweep period (3600) */
  unsigned retention_s;          /* sweep removes undo rows older than this (86400) */
  unsigned lock_timeout_ms;      /* lock_timeout of phase-two sessions (5000) */
  unsigned statement_timeout_ms; /* statement_timeout of phase-two sessions (8000) */
  unsigned connect_timeout_s;    /* default connect_timeout of the pool (5) */
  /* Leftover resolution (rm_undo.c): undo rows whose delete was lost are
   * resolved through the coordinator.  0 in the state means the default
   * (rm_at_meta.c's default_tuning does not set them). */
  unsigned resolve_interval_s;   /* period of the resolve pass (30) */
  unsigned resolve_grace_s;      /* only rows older than this are asked about (30) */
  unsigned resolve_max_xids;     /* xids asked per pass and resource (256) */
} rm_at_tuning_t;

/* One column of a table, from pg_catalog. */
typedef struct rm_col {
  char *name;
  char *qname;      /* quoted identifier */
  unsigned type;    /* pg_type oid */
  char generated;   /* attgenerated: 's' stored generated, else 0 */
  char identity;    /* attidentity: 'a' always, 'd' by default, else 0 */
} rm_col_t;

/* Table metadata, immutable once published in the cache. */
typedef struct rm_table {
  struct rm_table *next;
  char *key_schema; /* as asked: NULL = resolved through search_path */
  char *key_name;
  char *schema;     /* resolved */
  char *name;
  char *qname;      /* "schema"."name", quoted */
  char *lockname;   /* table part of lock keys: name, or schema.name outside public */
  int ncols;
  rm_col_t *cols;   /* in attnum order */
  int npk;
  int *pk;          /* indexes into cols, in key order */
} rm_table_t;

/* The undo rows of one committed branch, waiting to be deleted. */
typedef struct rm_undo_key {
  char *xid;
  int64_t branch_id;
} rm_undo_key_t;

typedef struct rm_at_resource rm_at_resource_t;
typedef struct rm_at_state rm_at_state_t;

/*
 * A branch mode other than AT on a resource (tcc/ attaches TXP_BT_TCC's):
 * the resources, their connection pools and the deleter's sweep live in
 * this layer, the modes above it, reached through this table only (the
 * arrow runs mode -> at).  'arg' is the mode's own state of the resource.
 */
typedef struct rm_at_mode {
  /* Phase two of one branch of the mode, on a worker thread; as
   * rm_rm_ops_t.phase2. */
  int (*phase2)(rm_at_resource_t *r, void *arg, const rm_phase2_req_t *req, int *code, char *errmsg, size_t errlen);
  /* The retention sweep of the rows of branch type 'type' (the mode's) on
   * 'pg' (idle, to be left idle), at most 'limit' rows finished
   * 'retention_s' ago: rows removed, or a negative code with 'err' set
   * (the caller logs it).  May be NULL.  (The fenced modes' is
   * rm_fence_sweep.) */
  long long (*sweep)(PGconn *pg, int type, unsigned retention_s, unsigned limit, char *err, size_t errlen);
  /* Free 'arg' with the resource.  May be NULL. */
  void (*free_arg)(void *arg);
} rm_at_mode_t;

struct rm_at_resource {
  rm_at_resource_t *next;
  rm_at_state_t *st;
  char *id;
  char *conninfo;

  pthread_mutex_t meta_mu;
  rm_table_t *tables;

  txc_pstmt_cache_t *pstmt; /* NULL: queries go unnamed (rm_config_t.unnamed_statements) */
  rm_sql_cache_t *sql;     /* rm_at_sql's statements, classified once (NULL: each time) */
  /* rm_at_hot_column's declarations, under meta_mu. */
  struct rm_hot_col {
    char schema[RM_AT_MAX_NAME + 1]; /* "" : any */
    char table[RM_AT_MAX_NAME + 1];
    char col[RM_AT_MAX_NAME + 1];
  } hot[RM_AT_MAX_HOT];
  int nhot;

  txc_pgpool_t pool; /* phase two's own connections (at most RM_AT_POOL_MAX idle) */

  /* Other branch modes served on this resource (rm__at_resource_set_mode),
   * by branch type; under meta_mu. */
  const rm_at_mode_t *modes[TXP_BT__MAX];
  void *mode_args[TXP_BT__MAX];

  /* Guarded by st->mu. */
  rm_undo_key_t *queue;
  size_t qlen, qcap;
  /* Branches prepared by this client with commit deltas, whose
   * BranchCommit is served at once on a worker (rm_undo.c); guarded by
   * st->mu, at most RM_AT_INLINE_MAX. */
  struct rm_inline_key *inl;
  size_t ninl;
};

struct rm_at_state {
  rm_client_t *c;
  pthread_mutex_t mu;
  pthread_cond_t cv;       /* wakes the deleter */
  rm_at_resource_t *resources;
  int nresources;
  rm_at_tuning_t tune;
  pthread_t deleter;
  bool deleter_running;
  bool stopping;
  bool kick;               /* a queue is full enough: flush now */
  int64_t next_sweep_ms;
  int64_t resolve_soon_ms; /* a coordinator was lost: a resolve pass then (0: none) */
};

/* --- the branch (rm_at.c, rm_at_stmt.c, rm_at_frame.c) --- */

/* pg_type.h's oid of int8 (the server headers are not a dependency). */
#define INT8OID 20

/* The savepoint of each statement, and of prepare's deferred updates. */
#define RM_AT_SAVEPOINT "rm_at_stmt"

typedef enum { RM_BRANCH_OPEN = 0, RM_BRANCH_PREPARED, RM_BRANCH_FAILED } rm_branch_state_t;

/* A delta update recorded by rm_at_update_delta_deferred: its UPDATE (and
 * the SELECT that tells a refusing guard from a vanished row), parameters
 * and undo item, run by rm_at_prepare after the branch is registered. */
typedef struct rm_deferred {
  char *update_sql; /* UPDATE ... SET c = c + $1 WHERE pk = $2.. AND (guard) RETURNING c,
                     * or the caller's own statement (rm_at_sql) with RETURNING c */
  char *exists_sql; /* SELECT 1 FROM t WHERE pk = $1.. */
  int nparams;      /* of update_sql: at most RM_AT_DEFERRED_MAX_PARAMS */
  char **params;    /* its parameters (text) */
  Oid *types;       /* their types (0: inferred) */
  int npk;
  char **pk_vals;   /* exists_sql's */
  json_t *item;     /* the undo item (a delta item, as rm_at_update_delta records) */
  char what[160];   /* "table"."col" for messages */
  long long delta;
} rm_deferred_t;

/* After the deferred update 'd' changed no row, in the transaction as it
 * is (nothing of it failed): whether its guard refused (RM_E_GUARD) or
 * its row is gone (RM_E_NOT_ONE_ROW), with the branch's message; or the
 * read's own error. */
int rm__at_deferred_refused(rm_branch_t *b, const rm_deferred_t *d);
/* The most parameters a deferred UPDATE may have (its fused form with the
 * undo row's INSERT has 4 more). */
#define RM_AT_DEFERRED_MAX_PARAMS 64

/* The row of rm_at_insert_deferred or rm_at_sql_deferred, run by prepare
 * (one per branch at most): the call as made, for prepare to run it as
 * rm_at_insert_unlocked or rm_at_sql_unlocked would, and the parts of the
 * fused statement (rm_at.c fused_insert_commit): the INSERT as those run
 * it (RETURNING the row's digest, then its key) and what the undo item
 * names. */
typedef struct rm_deferred_insert {
  char *sql;          /* rm_at_sql_deferred: the caller's statement; NULL: */
  char *table;        /* rm_at_insert_deferred: the table as the caller named it, */
  int ncols;          /*   and its columns */
  char **cols;
  int nparams;        /* the parameters: the values (one may be NULL) */
  char **vals;
  unsigned int *types; /* their types (NULL: all inferred) */
  char *insert_sql;   /* the INSERT ... RETURNING digest, key.. (parameters $1..) */
  char *item_table;   /* the undo item's table, and its schema (NULL: public) */
  char *item_schema;
  int npk;
  char **pk_names;
} rm_deferred_insert_t;

/* A deferred insert into 't' whose statement is 'insert_sql' (taken)
 * over the 'nparams' parameters 'vals' and 'types' (copied; 'types' may
 * be NULL); the caller sets its form (sql, or table and cols).  NULL out
 * of memory ('insert_sql' freed). */
rm_deferred_insert_t *rm__at_deferred_insert_new(const rm_table_t *t, char *insert_sql, int nparams,
                                                 const char *const *vals, const unsigned int *types);
/* A copy of 'n' strings (an entry may be NULL); NULL out of memory. */
char **rm__strs_dup(int n, const char *const *in);
/* Free a deferred insert and what it holds (NULL: nothing). */
void rm__at_deferred_insert_free(rm_deferred_insert_t *d);
/* Run a deferred insert now, its undo item recorded: rm_at_stmt.c's as
 * rm_at_insert_unlocked, rm_at_sql.c's (d->sql) as rm_at_sql_unlocked
 * (prepare's path when it cannot fuse the statement, rm_at.c).  0, or
 * the statement's code. */
int rm__at_insert_deferred_run(rm_branch_t *b, const rm_deferred_insert_t *d);
int rm__at_sql_deferred_run(rm_branch_t *b, const rm_deferred_insert_t *d);

struct rm_branch {
  rm_client_t *c;
  rm_at_resource_t *res;
  PGconn *pg;
  char xid[RM_XID_MAX];
  rm_branch_state_t state;
  bool registered;
  bool registered_first; /* registered before its statements (rm_at_open_registered,
                            rm_at_register_early): no locks, no commit delta */
  rm_pending_t *pending_reg; /* rm_at_register_early's registration, not waited for yet */
  bool rehearsal;            /* rm_at_open_rehearsal: no coordinator, never commits */
  int64_t branch_id;
  json_t *undo;       /* array of items, in statement order */
  size_t nitems;
  size_t undo_bytes;  /* compact JSON size so far */
  bool has_delta;
  bool has_commit_delta; /* rm_at_update_delta_on_commit: phase-two commit applies */
  bool no_savepoints; /* rm_at_statement_savepoints(b, false): a failure fails the branch */
  bool sp_pending;    /* the statement's SAVEPOINT goes with its first query */
  bool sp_taken;      /* the statement's SAVEPOINT was set (rm__at_stmt_end undoes or releases it) */
  bool sp_released;   /* ... and already released with the statement (rm__at_run_released) */
  bool begin_pending; /* opened on an idle connection: BEGIN goes with the first query (rm__at_pipe_run) */
  rm_deferred_t *deferred; /* rm_at_update_delta_deferred, run by prepare */
  rm_deferred_insert_t *dins; /* rm_at_insert_deferred, run by prepare */
  size_t ndeferred, capdeferred;
  txp_buf_t lock_keys;
  char errmsg[1024];
};

/* --- rm_at_pg.c --- */

/* Set the branch's message (rm_at_errmsg). */
void rm__at_err(rm_branch_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Row 'row' of 'res' as an image (all columns).  NULL on allocation failure. */
rm_row_t *rm__row_from_result(const PGresult *res, int row);
/* The same of the fields from 'first' on (the ones before are not the row's). */
rm_row_t *rm__row_from_fields(const PGresult *res, int row, int first);
/* The same of the 'n' fields from 'first' on. */
rm_row_t *rm__row_from_range(const PGresult *res, int row, int first, int n);

/* --- rm_at.c --- */

/* Failpoint for tests: if set, rm_at_prepare calls it after the branch is
 * registered and before the undo row is written (a "paused process"). */
extern void (*rm__at_failpoint_after_register)(rm_branch_t *b, int64_t branch_id, void *arg);
extern void *rm__at_failpoint_arg;
/* Failpoint for tests: if set, rm_at_sql calls it between an UPDATE's or
 * DELETE's before image and the statement itself (rm_at_sql.c). */
extern void (*rm__at_sql_after_image)(rm_branch_t *b, void *arg);

/* --- rm_at_frame.c: the frame of a statement --- */

/*
 * Start a statement: check the transaction.  The SAVEPOINT (and, on the
 * first statement of a branch, the read of the image settings) is only
 * noted: it goes in one round trip with the statement's first query.
 */
int rm__at_stmt_begin(rm_branch_t *b);
/* End a statement begun by rm__at_stmt_begin with its code 'rc': release
 * on success, roll back to the savepoint on failure (the caller's
 * transaction is then as before).  Returns the statement's code. */
int rm__at_stmt_end(rm_branch_t *b, int rc);
/* Metadata of 'table' ("schema.table" or "table") for a statement (inside
 * its savepoint), with its 'n' columns 'cols' checked: a missing one
 * reloads the metadata once, inside the savepoint too. */
int rm__at_stmt_table(rm_branch_t *b, const char *table, int n, const char *const *cols,
                      const rm_table_t **t);
/* The same by its parts ('schema' NULL: through the search path), as a
 * parsed statement names it: a name may hold a dot. */
int rm__at_stmt_table_in(rm_branch_t *b, const char *schema, const char *name, int n, const char *const *cols,
                         const rm_table_t **t);
/* Run 'sql' with text parameters; returns the result on 'want', else NULL
 * with *rc and the message set.  A pending start (rm__at_stmt_begin) goes
 * in the same round trip, ahead of the statement. */
PGresult *rm__at_run(rm_branch_t *b, const char *what, const char *sql, int n, const char *const *params,
                     const Oid *types, ExecStatusType want, int *rc);
/* rm__at_run, with the RELEASE of the statement's savepoint in the same
 * round trip: for a statement whose result the caller only records (an
 * INSERT ... RETURNING *), one round trip less.  Should the recording fail
 * afterwards (out of memory, undo or lock keys over their limits), the
 * change cannot be undone alone: rm__at_stmt_end then fails the branch,
 * and the caller must roll back its transaction. */
PGresult *rm__at_run_released(rm_branch_t *b, const char *what, const char *sql, int n,
                              const char *const *params, const Oid *types, ExecStatusType want, int *rc);
/*
 * The statement's pending start (rm__at_stmt_begin), sent in one round
 * trip with the 'n' (at most 3) statements that follow it: SAVEPOINT
 * (unless the branch runs without), on the first statement of a branch
 * the image settings, then sqls[0..n-1].
 * 0 with out[i] their results, or an error (the start failed; out[] all
 * NULL).
 */
int rm__at_pending_run(rm_branch_t *b, int n, const char *const *sqls, const int *np,
                       const char *const *const *pp, const Oid *const *tt, PGresult **out);
/*
 * Run 'n' statements in one round trip (libpq pipeline mode, one sync at
 * the end): res[i] gets the result of statement i (after an error, the
 * later ones are PGRES_PIPELINE_ABORTED; NULL when none came).  Returns 0,
 * or RM_E_DB when the pipeline could not be sent or its results not read
 * in full (the connection is then broken: every res[i] is NULL).  The
 * statements run inside the caller's transaction block, as PQexec would
 * run them one by one.  Queries with parameters and SELECTs go as named
 * prepared statements when the resource has a cache (txc_pstmt.h): the
 * first use on a connection sends its Prepare in the same pipeline.
 */
int rm__at_pipe_run(rm_branch_t *b, int n, const char *const *sql, const int *nparams,
                    const char *const *const *params, const Oid *const *types, PGresult **res);
/* One query through rm__at_pipe_run: its result, or NULL when it could not
 * be sent or read (b->errmsg says why). */
PGresult *rm__at_exec(rm_branch_t *b, const char *sql, int n, const char *const *params, const Oid *types);
/* Map a failed statement ('res', consumed) to a code, with the message:
 * data errors (bad value for the type, value too long, ...) are the
 * caller's input, the rest is the database. */
int rm__at_stmt_error(rm_branch_t *b, const char *what, PGresult *res);
/* Roll back to the savepoint and release it: the transaction as it was
 * when the savepoint was set.  A failure of that is appended to the
 * message already set. */
void rm__at_sp_rollback(rm_branch_t *b);
/*
 * The undo item 'it' as JSON, if the branch's undo log stays within its
 * size limit with it: 0 with *out and its compact size in *size, or
 * RM_E_NOT_SUPPORTED / RM_E_INVALID with the message set.
 */
int rm__at_item_encode(rm_branch_t *b, const rm_table_t *t, const rm_item_t *it, json_t **out, size_t *size);
/*
 * Record a finished statement: the item (consumed) and, if 'lock', its
 * lock key.  On failure nothing is recorded (the caller then rolls back
 * the savepoint).
 */
int rm__at_record(rm_branch_t *b, const rm_table_t *t, rm_item_t *it, bool lock);
/* The same for the 'n' items of one statement (all consumed): all of them
 * recorded, or none. */
int rm__at_record_all(rm_branch_t *b, const rm_table_t *t, rm_item_t *its, size_t n, bool lock);
/*
 * The digest an insert's undo item keeps instead of its after image, of
 * the row 'alias' (a whole-row reference): the SHA-256 of its text form,
 * base64.  The insert takes it from RETURNING, the rollback from the row
 * as it is; the text form follows the settings of the undo context, which
 * the rollback re-applies, as for images.
 */
#define RM_AT_ROW_DIGEST_HEAD "pg_catalog.encode(pg_catalog.sha256(pg_catalog.textsend(("
#define RM_AT_ROW_DIGEST_TAIL ".*)::text)), 'base64')"
#define RM_AT_ROW_DIGEST(alias) RM_AT_ROW_DIGEST_HEAD alias RM_AT_ROW_DIGEST_TAIL
/* The alias of the row in the statements that take its digest. */
#define RM_AT_ROW_ALIAS "rm_at_digest_row"
/* The first part of the undo log's context of the branch (malloc'd, NULL
 * on allocation failure): version, delta or not; the undo row's INSERT
 * appends the image settings (RM_AT_CONTEXT_SETTINGS). */
char *rm__at_context(const rm_branch_t *b);
/*
 * The session settings an image's text depends on, as the rest of the
 * undo context, written by the undo row's INSERT itself ("$3 || " this):
 * no read of their own per branch.  They are those of the moment of
 * prepare; the images were printed under the same ones (rm_at_open's
 * contract: none of them changes during a branch), and the rollback
 * re-applies them.  Each value escaped as rm_ctx_format escapes it ('%',
 * ';' and '=' as %XX; rm_ctx_parse takes a control character as it is,
 * and these settings hold none).
 */
#define RM_AT_CTX_VALUE(name)                                                                                 \
  "pg_catalog.replace(pg_catalog.replace(pg_catalog.replace(pg_catalog.current_setting('" name "'), '%', " \
  "'%25'), ';', '%3B'), '=', '%3D')"
/* ";name=value", or (compact, version 3) nothing when the setting has
 * its standard value (rm_image.h, RM_CTX_STANDARD_SETTINGS: the parse
 * puts it back); RM_AT_CONTEXT_SETTINGS_ALL writes every one, as the
 * versions before 3 did and read (RM_UNDO_OBJECTS). */
#define RM_AT_CTX_ALWAYS(name) "';" name "=' || " RM_AT_CTX_VALUE(name)
#define RM_AT_CTX_SETTING(name, standard)                                                                  \
  "CASE WHEN pg_catalog.current_setting('" name "') = '" standard "' THEN '' ELSE " RM_AT_CTX_ALWAYS(name) " END"
#define RM_AT_CONTEXT_SETTINGS                                                                             \
  RM_AT_CTX_SETTING("TimeZone", RM_CTX_STD_TIMEZONE) " || " RM_AT_CTX_SETTING("DateStyle", RM_CTX_STD_DATESTYLE) \
  " || " RM_AT_CTX_SETTING("IntervalStyle", RM_CTX_STD_INTERVALSTYLE)                                      \
  " || " RM_AT_CTX_SETTING("extra_float_digits", RM_CTX_STD_EXTRA_FLOAT_DIGITS)                            \
  " || " RM_AT_CTX_SETTING("bytea_output", RM_CTX_STD_BYTEA_OUTPUT)                                        \
  " || " RM_AT_CTX_SETTING("lc_monetary", RM_CTX_STD_LC_MONETARY)
#define RM_AT_CONTEXT_SETTINGS_ALL                                                                         \
  RM_AT_CTX_ALWAYS("TimeZone") " || " RM_AT_CTX_ALWAYS("DateStyle") " || " RM_AT_CTX_ALWAYS("IntervalStyle") \
  " || " RM_AT_CTX_ALWAYS("extra_float_digits") " || " RM_AT_CTX_ALWAYS("bytea_output")                    \
  " || " RM_AT_CTX_ALWAYS("lc_monetary")

/* --- rm_at_stmt.c --- */
/* Helpers of the statements (rm_at_stmt.c, rm_at_sql.c). */
/* The key of 'row' (by the table's key columns): NULL if a key column is
 * missing or NULL, or on allocation failure. */
rm_row_t *rm__at_pk_from_row(const rm_table_t *t, const rm_row_t *row);
/* Whether the lock key of the row 'pk_vals' would be accepted (before the
 * statement runs): 0, or RM_E_INVALID with the message set. */
int rm__at_check_lock_key(rm_branch_t *b, const rm_table_t *t, const char *const *pk_vals);
/* An empty undo item of 'op' on 't': 0 or RM_E_NOMEM. */
int rm__at_item_init(rm_item_t *it, rm_op_t op, const rm_table_t *t);
/* Out of memory: RM_E_NOMEM, with the message set. */
int rm__at_oom(rm_branch_t *b);
/* Whether column 'ci' of 't' is part of its primary key. */
bool rm__at_is_pk_col(const rm_table_t *t, int ci);
/* Column 'col' of 't' may take a delta (an integer or numeric column
 * outside the key, not generated): 0 with its index in *ci, or
 * RM_E_NOT_SUPPORTED / RM_E_INVALID with the message set. */
int rm__at_delta_col(rm_branch_t *b, const rm_table_t *t, const char *col, int *ci);
/*
 * Inside a started statement, on the row 'pk_vals' of 't' (which must
 * exist: read without a lock): record a delta of column 'ci' for the
 * commit (rm_at_update_delta_on_commit), or defer 'update_sql' with its
 * parameters to prepare as the delta's UPDATE (rm_at_update_delta_deferred;
 * 'delta' >= 0, what its undo item takes back).  *released: the
 * statement's savepoint went with the read (the caller then must not end
 * the statement through rm__at_stmt_end, only clear sp_taken).
 */
int rm__at_commit_delta(rm_branch_t *b, const rm_table_t *t, int ci, const char *const *pk_vals, long long delta,
                        bool *released);
int rm__at_defer_delta(rm_branch_t *b, const rm_table_t *t, int ci, const char *const *pk_vals, long long delta,
                       const char *update_sql, int nparams, const char *const *params, const Oid *types,
                       bool *released);

/*
 * Prepare, after the registration: run the deferred delta UPDATEs under
 * one savepoint, in one round trip.  0, or the code with the savepoint
 * rolled back (the transaction as it was before prepare, still usable):
 * RM_E_GUARD, RM_E_NOT_ONE_ROW (the row is gone), RM_E_DB, RM_E_INVALID.
 * On success the savepoint is left for the caller to release.
 *
 * Without statement savepoints (b->no_savepoints) there is no savepoint:
 * 'tail' (the undo_log INSERT, 'ntail' text parameters) goes in the same
 * round trip behind the UPDATEs, its result in *tail_res (NULL when it did
 * not run); on any failure the transaction is left aborted on purpose (a
 * refusing guard leaves earlier UPDATEs and the undo row in it), so that no
 * COMMIT can make it durable.
 */
int rm__at_run_deferred(rm_branch_t *b, const char *tail, int ntail, const char *const *tail_params,
                        PGresult **tail_res);
/* Free what 'd' holds and zero it. */
void rm__at_deferred_clear(rm_deferred_t *d);

/* --- rm_resource.c --- */

/* The client's state, created on first use.  NULL on allocation failure. */
rm_at_state_t *rm__at_state_get(rm_client_t *c);
/* Whether column 'col' of 't' was declared hot (rm_at_hot_column). */
bool rm__at_hot(rm_at_resource_t *r, const rm_table_t *t, const char *col);
/* The resource 'id' of 'c', or NULL. */
rm_at_resource_t *rm__at_resource_find(rm_client_t *c, const char *id);
/* Resource ids this client serves, comma-separated (for RegisterRM): the
 * length, or RM_E_INVALID when they do not fit 'cap'. */
int rm__resource_ids(rm_client_t *c, char *out, size_t cap);
/* Stop the deleter and free the state with its resources. */
void rm__at_free(rm_at_state_t *s);
/* Serve branch type 'type' (not AT) of resource 'r' with 'mode' and its
 * 'arg' (freed with the resource by mode->free_arg, also when this fails).
 * 0, or RM_E_INVALID when the type is AT, unknown, or served already. */
int rm__at_resource_set_mode(rm_at_resource_t *r, int type, const rm_at_mode_t *mode, void *arg);
/* For a mode's rm_*_resource_add: add resource 'id' (rm_resource_add)
 * and serve 'type' on it with 'mode' and 'arg' (freed on any failure).
 * 'what' ("TCC", "saga") names the mode in rm_errmsg. */
int rm__at_resource_add_mode(rm_client_t *c, const char *what, const char *id, const char *conninfo, int type,
                             const rm_at_mode_t *mode, void *arg);
/* The mode serving 'type' on 'r' with its arg, or NULL (in rm_undo.c). */
const rm_at_mode_t *rm__at_resource_mode(rm_at_resource_t *r, int type, void **arg);
/* For a mode: a connection of the resource's phase-two pool (idle; to be
 * left idle) and its return ('bad': close it).  As rm__undo_pool_get. */
int rm__at_conn_get(rm_at_resource_t *r, PGconn **out, char *err, size_t errlen);
void rm__at_conn_put(rm_at_resource_t *r, PGconn *pg, bool bad);

/* --- rm_at_meta.c --- */

/* Free the metadata cache of 'r'. */
void rm__tables_free(rm_at_resource_t *r);
/*
 * Metadata of table 'name' (in 'schema', or NULL: the table the search
 * path of 'pg' finds), from the cache or read from pg_catalog on 'pg'.
 * Returns 0, RM_E_NO_TABLE, RM_E_NO_PK, RM_E_DB or RM_E_NOMEM with a
 * message in 'err'.  Runs one query on 'pg' on a miss: the caller must be
 * ready for it to fail (inside a savepoint on a caller's connection).
 */
int rm__table_get(rm_at_resource_t *r, PGconn *pg, const char *schema, const char *name,
                  const rm_table_t **out, char *err, size_t errlen);
/* The cached metadata of table 'name' (as rm__table_get is asked for it),
 * or NULL: no database call. */
rm_table_t *rm__table_cached(rm_at_resource_t *r, const char *schema, const char *name);
/*
 * Check that the 'n' columns 'names' exist in *t; if one does not, the
 * table may have changed since it was cached: read it again once (inside
 * the statement's savepoint) and check again.  0, or RM_E_INVALID with the
 * missing column named in 'err', or the reload's error.
 */
int rm__table_check_cols(rm_at_resource_t *r, PGconn *pg, const rm_table_t **t, int n,
                         const char *const *names, char *err, size_t errlen);
/* Index of column 'name' in t->cols, or -1. */
int rm__col_index(const rm_table_t *t, const char *name);

/* --- rm_undo.c --- */

/* Phase two of one branch (rm_rm_ops_t.phase2, rm_internal.h), on a worker
 * thread: the branch status to answer, with a code and a message for the
 * failures. */
int rm__at_phase2(rm_client_t *c, const rm_phase2_req_t *req, int *code, char *errmsg, size_t errlen);
/* The common AT commit, without blocking (rm_rm_ops_t.commit_queued): its
 * undo row queued for the deleter.  False when it needs rm__at_phase2 (not
 * an AT commit, unknown resource, a branch with commit deltas this client
 * remembers, or the queue is full).  Safe on the client's loop thread. */
bool rm__at_commit_queued(rm_client_t *c, const rm_phase2_req_t *req);

/* Branches with commit deltas whose BranchCommit this client should serve
 * at once (rm_undo.c NOTES): remember one after its prepare, forget it when
 * its local transaction did not commit.  Best effort: a branch that is not
 * remembered (a full set, another instance, a restart) is committed by the
 * deleter, later but as surely. */
#define RM_AT_INLINE_MAX 1024
void rm__at_inline_add(rm_at_resource_t *r, const char *xid, int64_t bid);
void rm__at_inline_remove(rm_at_resource_t *r, const char *xid, int64_t bid);

/* Start the deleter thread of 's' (once).  0 or RM_E_NOMEM. */
int rm__undo_start(rm_at_state_t *s);
/* A coordinator connection was lost (rm_rm_ops_t.node_lost, loop thread):
 * run a resolve pass of every resource RESOLVE_AFTER_LOSS_MS from now. */
void rm__undo_resolve_soon(rm_at_state_t *s);
/* Stop it, delete what is queued (best effort), close the pools. */
void rm__undo_stop(rm_at_state_t *s);
/* Free the pool and queue of 'r' (after rm__undo_stop). */
void rm__undo_resource_free(rm_at_resource_t *r);

/* Apply 't' (zero fields keep their value).  Creates the state. */
int rm__at_tune(rm_client_t *c, const rm_at_tuning_t *t);
/* Delete every queued undo row now, on this thread.  0 or RM_E_DB. */
int rm__at_flush(rm_client_t *c);
/* Run the retention sweep now; '*removed' (may be NULL) gets the count. */
int rm__at_sweep(rm_client_t *c, long long *removed);

#endif /* RM_AT_INT_H */
