/*
 * rm_undo_int.h - what the files of AT phase two share (not installed):
 * rm_undo_pool.c (the connection pool and the helpers of one phase-two
 * local transaction), rm_commit.c (commit: the deleter's queue, commit
 * deltas), rm_rollback.c (the checked replay) and rm_undo.c (the deleter
 * thread, leftover resolution, the retention sweep; its NOTES describe all
 * of phase two); rm_resource.c enters them.  Arrows: rm_resource ->
 * rm_undo -> {rm_commit, rm_rollback} -> rm_undo_pool.
 */
#ifndef RM_UNDO_INT_H
#define RM_UNDO_INT_H

#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include "rm_at_int.h"
#include "txp_errno.h"
#include "txp_status.h"

#define INT8OID 20

/* The version of the "rm" schema set (sql/rm/NNN_*.sql, recorded by
 * db-migrate in schema_version) this library needs: rm_resource_add
 * refuses a database below it.  Raise it with a new sql/rm file that the
 * library depends on. */
#define RM_UNDO_SCHEMA_VERSION 1

/* SQL: whether undo_log row alias 'u' carries commit deltas (context values
 * are %-escaped, so ";commit=1;" cannot occur inside one). */
#define MARKED(u) "((';' || coalesce(" u ".context, '') || ';') LIKE '%;commit=1;%')"

/* --- rm_undo_pool.c --- */

int64_t rm__undo_now_ms(void);
struct timespec rm__undo_abs_ms(int64_t at);
/* The state's tuning, copied under its lock. */
rm_at_tuning_t rm__undo_tuning(rm_at_state_t *st);
/* A connection of 'r''s pool, opened if none is idle and the pool is not
 * full; otherwise waits up to statement_timeout_ms.  0 or RM_E_DB. */
int rm__undo_pool_get(rm_at_resource_t *r, PGconn **out, char *err, size_t errlen);
/* Return 'pg' to the pool; 'bad' (or a broken or unfinished session)
 * closes it instead. */
void rm__undo_pool_put(rm_at_resource_t *r, PGconn *pg, bool bad);
void rm__undo_pool_close(rm_at_resource_t *r);

/* One phase-two local transaction. */
typedef struct undo_ctx {
  rm_at_resource_t *r;
  const rm_phase2_req_t *req;
  rm_pg_io_t io; /* its connection and failures; io.bad: not back to the pool */
} rm_undo_ctx_t;

/* Outcome of one item. */
enum { RM_UNDO_OK = 0, RM_UNDO_DIRTY = 1, RM_UNDO_DB = 2, RM_UNDO_FATAL = 3 };

/* End the local transaction of a commit or rollback: ROLLBACK whatever
 * was not committed (nothing half-done stays); u->bad when the
 * connection cannot go back to its pool. */
void rm__undo_end(rm_undo_ctx_t *u);
/* The local transaction of a commit ('commit') or a rollback on an undo
 * row, as both run it: BEGIN; the row (the caller's statement); its items
 * read and its session settings applied; the caller's work on the items;
 * COMMIT; and at the end, whatever happened, rm__undo_end and everything
 * freed.  'status' is what the phase returns: a retryable failure until
 * a step decides otherwise. */
typedef struct rm_undo_txn {
  bool commit;
  char bid[32];
  const char *key[2]; /* the undo row's key: $1 xid, $2 branch id */
  PGresult *row;      /* the undo row, read or taken by the caller */
  rm_ctx_t ctx;       /* its recorded session settings */
  rm_item_t *items;
  size_t nitems;
  int status;
} rm_undo_txn_t;

/* Set 't' up for u->req (*code RM_E_DB until done) and BEGIN: false if
 * BEGIN failed. */
bool rm__undo_txn_begin(rm_undo_ctx_t *u, rm_undo_txn_t *t, bool commit, int *code);
/* Read t->row's items and apply its settings: false if not (a row that
 * cannot be read fails for good, *code TXP_EBRANCH_UNRETRYABLE). */
bool rm__undo_txn_load(rm_undo_ctx_t *u, rm_undo_txn_t *t, int *code);
/* COMMIT ('what' says which in the message): false if not; else the
 * phase is done (*code 0). */
bool rm__undo_txn_commit(rm_undo_ctx_t *u, rm_undo_txn_t *t, const char *what, int *code);
/* rm__undo_end, then free what 't' holds: the phase's status. */
int rm__undo_txn_end(rm_undo_ctx_t *u, rm_undo_txn_t *t);
/* The table of item 'it' (*t): RM_UNDO_OK; RM_UNDO_DB when the database
 * failed (u->io.bad if the connection is lost); RM_UNDO_FATAL when the
 * table is gone or no longer has a key. */
int rm__undo_item_table(rm_undo_ctx_t *u, const rm_item_t *it, const rm_table_t **t);
/* Whether the last failure was an integrity constraint refusing the
 * statement (SQLSTATE class 23): data, not the database, so a retry
 * cannot help. */
bool rm__undo_refused(const rm_undo_ctx_t *u);
/* Append " WHERE "k1" = $first AND ..." for the columns of 'pk'. */
int rm__undo_where_pk(PGconn *pg, txp_buf_t *sql, const rm_row_t *pk, int first);
/* Index of column 'name' in t->cols, or -1. */
int rm__undo_col_of(const rm_table_t *t, const char *name);
/* SET LOCAL the recorded settings in one statement; 'relaxed' adds
 * synchronous_commit = off (a commit with commit deltas: rm_commit.c). */
int rm__undo_apply_settings(rm_undo_ctx_t *u, const rm_ctx_t *ctx, bool relaxed);
/* The outcome of a failed item ('rc' a RM_UNDO_* code) of a commit or
 * rollback: the branch status, with *code set. */
int rm__undo_item_failure(rm_undo_ctx_t *u, int rc, bool commit, int *code);
/* The context and items of undo row 'row' (SELECT id, log_status,
 * context, rollback_info::text) of branch 'bid'.  0, or -1 with the
 * message set. */
int rm__undo_parse_row(rm_undo_ctx_t *u, const PGresult *row, const char *bid, rm_ctx_t *ctx, rm_item_t **items,
                       size_t *nitems);

/* --- rm_commit.c --- */

/* Commit 'n' branches: DELETE the undo rows without commit deltas in one
 * statement; commit each marked one with its deltas.  0, or the code of
 * the DELETE's failure. */
int rm__commit_finish(rm_at_resource_t *r, const rm_undo_key_t *keys, size_t n, char *err, size_t errlen);
/* Commit everything queued for 'r', batch by batch (failures requeued). */
int rm__commit_flush(rm_at_resource_t *r);
/* Commit the marked branch (xid, bid) on 'pg' (idle), its outcome logged;
 * *bad: 'pg' must not go back to its pool.  The branch status. */
int rm__commit_marked(rm_at_resource_t *r, PGconn *pg, const char *xid, int64_t bid, bool *bad, int *code,
                      char *err, size_t errlen);
void rm__commit_keys_free(rm_undo_key_t *keys, size_t n);
/* Queue the undo row of committed branch (xid, bid) for the deleter.
 * False when the queue is full (or out of memory): commit it inline; and
 * when this client remembers the branch for an inline commit. */
bool rm__commit_enqueue(rm_at_resource_t *r, const char *xid, int64_t bid);
/* BranchCommit of one branch of 'r' (rm__at_phase2, checked). */
int rm__commit_phase2(rm_at_resource_t *r, const rm_phase2_req_t *req, int *code, char *errmsg, size_t errlen);

/* --- rm_rollback.c --- */

/* BranchRollback of one branch of 'r' (rm__at_phase2, checked). */
int rm__rollback_phase2(rm_at_resource_t *r, const rm_phase2_req_t *req, int *code, char *errmsg, size_t errlen);

/* --- rm_undo.c --- */

/* Snapshot of the resource list (append-only, never freed before the
 * state).  Caller frees the array. */
rm_at_resource_t **rm__undo_resources(rm_at_state_t *st, int *n);
/* The retention sweep of 'r'; '*removed' (may be NULL) adds the count. */
int rm__undo_sweep(rm_at_resource_t *r, long long *removed);

#endif /* RM_UNDO_INT_H */
