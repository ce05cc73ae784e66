/*
 * rm_fence.h - the fence of TCC, XA and saga branches: its rules (pure,
 * no I/O: rm_fence_rules.c, every case in tests/unit/test_fence.c), the
 * SQL on its rows (rm_fence_sql.c, the table sql/rm/002_branch_fence.sql)
 * and one phase two behind it with a handler (rm_fence_run.c).  tcc/,
 * saga/ and xa/ use it; it knows only libpq, the public header's handler
 * types and the core's error helper.
 *
 * NOTES
 *   A branch's fence row (xid, branch_id) is written in the local
 *   transaction of the business change it guards, so what the row says
 *   happened did happen ("tried" reads "tried or prepared" for XA,
 *   "confirmed" "committed", "cancelled" "rolled back"):
 *     phase one  no row -> insert TRIED; a row (a rollback came first) ->
 *                refuse
 *     commit     TRIED -> run it, CONFIRMED; CONFIRMED -> done (a
 *                duplicate); no row -> retry (phase one has not committed:
 *                it may be in flight); CANCELLED or CANCELLED_EMPTY ->
 *                refuse
 *     rollback   TRIED -> run it, CANCELLED; CANCELLED or CANCELLED_EMPTY
 *                -> done; no row -> record CANCELLED_EMPTY (the empty
 *                rollback; a late phase one now fails on the key);
 *                CONFIRMED -> refuse
 *   A saga step has no phase one: its action is phase one and commit in
 *   one local transaction (rm_fence_saga):
 *     action     no row -> insert it, run it, CONFIRMED; CONFIRMED -> done;
 *                CANCELLED or CANCELLED_EMPTY -> refuse (compensated first:
 *                anti-hanging)
 *     compensate CONFIRMED -> run it, CANCELLED; no row -> record
 *                CANCELLED_EMPTY (the action never committed: an empty
 *                compensation, and a late action now fails on the key);
 *                CANCELLED or CANCELLED_EMPTY -> done
 *   "Refuse" is a contradiction that no retry can mend (the branch was
 *   both committed and rolled back, as far as the coordinator asks): the
 *   branch fails for good and an operator looks (tcctl show XID).
 */
#ifndef RM_FENCE_H
#define RM_FENCE_H

#include <libpq-fe.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rm_pg.h"

/* branch_fence.status; NONE: no row. */
typedef enum rm_fence_status {
  RM_FENCE_NONE = 0,
  RM_FENCE_TRIED = 1,
  RM_FENCE_CONFIRMED = 2,
  RM_FENCE_CANCELLED = 3,
  RM_FENCE_CANCELLED_EMPTY = 4,
} rm_fence_status_t;

typedef enum rm_fence_action {
  RM_FENCE_RUN,    /* run phase two, then set the row to 'to', in one local transaction */
  RM_FENCE_DONE,   /* already done: answer success, change nothing, run nothing */
  RM_FENCE_RECORD, /* insert the row as 'to' (the empty rollback), run nothing */
  RM_FENCE_RETRY,  /* not now: answer a retryable failure */
  RM_FENCE_REFUSE, /* a contradiction: answer an unretryable failure */
} rm_fence_action_t;

/* ---------------------------------------------------------- the rules */

/* Phase two (commit, else rollback) of a branch whose row is 'found' (a
 * status, or NONE).  '*to': the status to write for RUN and RECORD;
 * '*why': for RETRY and REFUSE, a sentence for the operator. */
rm_fence_action_t rm_fence_phase2(bool commit, int found, int *to, const char **why);

/* The same for a saga step (commit: its action; rollback: its
 * compensation).  RUN with 'found' NONE: insert the row, then run. */
rm_fence_action_t rm_fence_saga(bool commit, int found, int *to, const char **why);

/* A phase one that found the row 'found' when inserting its own (NONE: the
 * insert went in): true to go on, false (with '*why') to refuse. */
bool rm_fence_first_ok(int found, const char **why);

/* "tried", "confirmed", ... ("none" for NONE, "unknown" otherwise). */
const char *rm_fence_status_name(int status);

/* ------------------------------------------------------- the SQL on rows */

/* The maximum length of a TCC try's args. */
#define RM_FENCE_ARGS_MAX 65536u

/* Every call runs on 'io' (rm_pg.h): 0 on success, or -1 with the
 * failure in 'io' (its message, its SQLSTATE; 'bad' when the connection
 * must not be reused). */

/* Phase one, in the caller's transaction: insert the branch's row as TRIED
 * with 'args' (may be NULL).  0 with '*found' NONE (inserted) or the
 * status of the row that was there. */
int rm_fence_insert(rm_pg_io_t *io, const char *xid, int64_t bid, const char *resource_id, int branch_type,
                    const char *args, int *found);
/* Read the row, locked (FOR UPDATE), inside a transaction: '*status'
 * (NONE: no row) and, if 'args', its args (malloc'd; NULL if none). */
int rm_fence_lock(rm_pg_io_t *io, const char *xid, int64_t bid, int *status, char **args);
/* Read the row without a lock (outside a transaction too). */
int rm_fence_read(rm_pg_io_t *io, const char *xid, int64_t bid, int *status);
/* Insert the row of an empty rollback (CANCELLED_EMPTY): 0 with
 * '*inserted' false when a row was there. */
int rm_fence_record_empty(rm_pg_io_t *io, const char *xid, int64_t bid, const char *resource_id,
                          int branch_type, bool *inserted);
/* Set the row's status. */
int rm_fence_set(rm_pg_io_t *io, const char *xid, int64_t bid, int status);
/* Delete at most 'limit' (0: 1000) finished rows of 'branch_type' last
 * changed over 'retention_s' ago, on 'pg': the rows removed, or RM_E_DB
 * with 'err' set.  The sweep of the modes behind the fence
 * (rm_at_mode_t.sweep). */
long long rm_fence_sweep(PGconn *pg, int branch_type, unsigned retention_s, unsigned limit, char *err,
                         size_t errlen);
/* What a mode checks in a database before it serves a resource there. */
typedef struct rm_fence_probe {
  bool has_fence;       /* the branch_fence table is on the search path */
  int max_prepared;     /* max_prepared_transactions (XA needs > 0) */
  char db[64];          /* current_database() */
} rm_fence_probe_t;
/* Connect to 'conninfo' (a connect timeout of 10 s), read 'out', close.
 * 0, or -1 with 'err' set. */
int rm_fence_probe(const char *conninfo, rm_fence_probe_t *out, char *err, size_t errlen);
/* Whether the database of 'conninfo' can serve 'mode' ("TCC", "XA")
 * branches of resource 'id': the fence, and with 'need_prepared'
 * max_prepared_transactions > 0.  Asked before the resource is added, so
 * that a refused one leaves nothing behind.  0, or RM_E_DB, RM_E_NO_TABLE,
 * RM_E_NOT_SUPPORTED with rm_errmsg saying what to do. */
int rm_fence_require(const char *mode, const char *id, const char *conninfo, bool need_prepared);
/* Phase one in the caller's transaction on 'pg' ('what': "TCC try",
 * "XA start"): the branch's row inserted, or the row found there checked
 * (rm_fence_first_ok).  0, or RM_E_DB / RM_E_FENCE with rm_errmsg set (the
 * caller must roll back). */
int rm_fence_first(PGconn *pg, const char *what, const char *xid, int64_t bid, const char *resource_id,
                   int branch_type, const char *args);
/* Run one command without parameters ("BEGIN", "COMMIT"): 0 or -1. */
int rm_fence_command(rm_pg_io_t *io, const char *sql, const char *what);

/* ------------------------------------------- phase two behind the fence */

struct rm_tcc_call; /* rm_client.h */

typedef rm_fence_action_t (*rm_fence_rules_fn)(bool commit, int found, int *to, const char **why);

/* One phase two of a branch: what rm_fence_run needs to know. */
typedef struct rm_fence_job {
  bool commit;
  const char *xid;
  int64_t branch_id;
  const char *resource_id;
  int branch_type;
  const char *mode;     /* "TCC", "saga": for messages */
  const char *what;     /* "confirm", "compensation", ...: for messages */
  const char *args;     /* given to the handler (and a new row); NULL: the row's */
  rm_fence_rules_fn rules;
  int (*handler)(const struct rm_tcc_call *call, void *arg, char *errmsg, size_t errlen);
  void *handler_arg;
} rm_fence_job_t;

/* Phase two in one local transaction on 'io->pg' (idle): lock the row,
 * let 'rules' decide, record or run the handler and set the row, commit;
 * rolled back on any failure, so the connection is idle again (or
 * 'io->bad').  The branch status to answer: PhaseTwoCommitted or
 * PhaseTwoRollbacked on success, else a *Retryable or *Unretryable one
 * with '*code' and 'io->err' set.  '*empty' (may be NULL): true when an
 * empty rollback or compensation was recorded. */
int rm_fence_run(rm_pg_io_t *io, const rm_fence_job_t *job, int *code, bool *empty);

#endif /* RM_FENCE_H */
