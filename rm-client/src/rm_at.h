/*
 * rm_at.h - internals shared by the AT resource manager's files: rm_at.c
 * (resources, table metadata, the branch API on the caller's connection)
 * and rm_undo.c (phase two on the library's own connections, the undo
 * clean-up queue and sweep).  Not installed.
 *
 * NOTES
 *   Per client, one rm_at_state_t (created by the first rm_resource_add or
 *   rm__at_tune, freed by the core through rm__at_free) holds:
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
#ifndef RM_AT_H
#define RM_AT_H

#include <libpq-fe.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "rm_image.h"
#include "rm_internal.h"

/* Limits of one branch (bad input beyond them is RM_E_INVALID). */
#define RM_AT_MAX_ITEMS 1000                  /* statements per branch */
#define RM_AT_MAX_UNDO_BYTES (8u * 1024 * 1024) /* images per branch, roughly */
#define RM_AT_MAX_NAME 63                     /* PostgreSQL's NAMEDATALEN - 1 */
#define RM_AT_POOL_MAX 64                     /* phase-two connections per resource */

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
   * (rm_at.c's default_tuning does not set them). */
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

struct rm_at_resource {
  rm_at_resource_t *next;
  rm_at_state_t *st;
  char *id;
  char *conninfo;

  pthread_mutex_t meta_mu;
  rm_table_t *tables;

  pthread_mutex_t pool_mu;
  pthread_cond_t pool_cv;
  PGconn *idle[RM_AT_POOL_MAX];
  int nidle;
  int total;    /* connections open or being opened */

  /* Guarded by st->mu. */
  rm_undo_key_t *queue;
  size_t qlen, qcap;
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
};

/* --- rm_at.c --- */

/* The client's state, created on first use.  NULL on allocation failure. */
rm_at_state_t *rm__at_state_get(rm_client_t *c);
/* The resource 'id' of 'c', or NULL. */
rm_at_resource_t *rm__at_resource_find(rm_client_t *c, const char *id);
/*
 * Metadata of table 'name' (in 'schema', or NULL: the table the search
 * path of 'pg' finds), from the cache or read from pg_catalog on 'pg'.
 * Returns 0, RM_E_NO_TABLE, RM_E_NO_PK, RM_E_DB or RM_E_NOMEM with a
 * message in 'err'.  Runs one query on 'pg' on a miss: the caller must be
 * ready for it to fail (inside a savepoint on a caller's connection).
 */
int rm__table_get(rm_at_resource_t *r, PGconn *pg, const char *schema, const char *name,
                  const rm_table_t **out, char *err, size_t errlen);
/* Row 'row' of 'res' as an image (all columns).  NULL on allocation failure. */
rm_row_t *rm__row_from_result(const PGresult *res, int row);
/* Format a libpq failure of 'res' (or of 'pg' when res is NULL) into 'err'. */
void rm__pg_error(char *err, size_t errlen, const char *what, PGconn *pg, const PGresult *res);
/* SQLSTATE of 'res' ("" if none). */
const char *rm__sqlstate(const PGresult *res);

/* Failpoint for tests: if set, rm_at_prepare calls it after the branch is
 * registered and before the undo row is written (a "paused process"). */
extern void (*rm__at_failpoint_after_register)(rm_branch_t *b, int64_t branch_id, void *arg);
extern void *rm__at_failpoint_arg;

/* --- rm_undo.c --- */

/* Start the deleter thread of 's' (once).  0 or RM_E_NOMEM. */
int rm__undo_start(rm_at_state_t *s);
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

#endif /* RM_AT_H */
