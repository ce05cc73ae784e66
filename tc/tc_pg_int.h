/*
 * tc_pg_int.h - what tc_pg.c (connections, pool) and tc_pg_job.c (the job
 * object and its API) share.  Not for other modules: they use tc_pg.h.
 */
#ifndef TC_PG_INT_H
#define TC_PG_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tc_pg.h"
#include "txc_heap.h"

#define TC_PG_MAX_PARAMS 65535 /* the protocol's limit (Int16 count) */
#define TC_PG_ERR_LEN 256
#define TC_PG_MAX_PREPARED 32
#define TC_PG_ITEM_OTHER (-1)
#define TC_PG_ITEM_PREPARE_BASE (-2)

/* One statement of a job.  'sql' and 'values' live in 'block' (one
 * allocation per statement); 'res' is its result once received. */
typedef struct tc_pg_stmt {
  void *block;
  const char *name; /* prepared statement name (static), or NULL */
  char *sql;
  char **values; /* 'nparams' entries; NULL is SQL NULL */
  int nparams;
  PGresult *res;
} tc_pg_stmt_t;

struct tc_pg_job {
  /* Queue links (valid while queued), and the position in the deadline
   * heap (SIZE_MAX when not in it). */
  tc_pg_job_t *prev;
  tc_pg_job_t *next;
  txc_heap_node_t hnode;

  unsigned flags;
  tc_pg_job_cb cb;
  void *arg;

  tc_pg_stmt_t *stmts;
  int nstmts;
  int cap;

  uint64_t submit_ns;
  uint64_t deadline_ns; /* 0: no deadline */
  uint64_t done_ns;
  unsigned deadline_ms;

  /* Pipeline item whose results are being read, and what each item is:
   * a statement index (>= 0), TC_PG_ITEM_OTHER (BEGIN, COMMIT, DEALLOCATE), or
   * TC_PG_ITEM_PREPARE_BASE - i for the Prepare of statement i. */
  int item;
  int *items;
  int nitems;

  bool has_error;
  int failed_index;
  char sqlstate[6];
  char *errmsg;
};


/* Copy 'src' into 'dst' ('len' bytes) without libpq's trailing newlines. */
void tc__pg_copy_msg(char *dst, size_t len, const char *src);
/* Record the job's first error (later ones are ignored). */
void tc__pg_job_set_error(tc_pg_job_t *job, const char *msg, const char *sqlstate, int index);
void tc__pg_job_set_error_from_result(tc_pg_job_t *job, const PGresult *res, int index);
/* Run the job's callback once and free the job (already detached). */
void tc__pg_job_complete(tc_pg_job_t *job, int status);

#endif /* TC_PG_INT_H */
