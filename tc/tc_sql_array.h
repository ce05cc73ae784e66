/*
 * tc_sql_array.h - PostgreSQL array literals ('{"a","b",NULL}') built as
 * the text of a statement's parameter, so that one parameter carries a
 * whole column: the group-commit batches pass their ops so (tc_store.c),
 * and GlobalLockQuery its row keys (tc_store_read.c).
 *
 * NOTES
 *   Out of memory sticks: once an append fails, later adds do nothing and
 *   tc_sql_array_end() returns NULL, so a caller checks once, at the end.
 *
 *   Thread: any; an array belongs to one thread at a time.
 */
#ifndef TC_SQL_ARRAY_H
#define TC_SQL_ARRAY_H

#include <stdint.h>

#include "txp_lockkey.h"
#include "txp_msg.h"

typedef struct tc_sql_array {
  txp_buf_t b;
  int n;      /* elements so far */
  int failed; /* out of memory */
  int ended;  /* the closing brace is written */
} tc_sql_array_t;

void tc_sql_array_init(tc_sql_array_t *a);
/* Add 'v' (NULL: SQL NULL), quoted and escaped. */
void tc_sql_array_add(tc_sql_array_t *a, const char *v);
void tc_sql_array_add_i64(tc_sql_array_t *a, int64_t v);
/* Close the literal (once) and return it; NULL: out of memory. */
const char *tc_sql_array_end(tc_sql_array_t *a);
void tc_sql_array_free(tc_sql_array_t *a);

/* The lock_table rows that lock keys of 'resource' make, one element per
 * key in each array that is wanted (not NULL): 'item' (always 'index'),
 * 'row' (the row key, txp_row_key), 'table' and 'pk'. */
typedef struct tc_lock_rows {
  tc_sql_array_t *item, *row, *table, *pk;
  int index;
  const char *resource;
} tc_lock_rows_t;

/* A txp_lockkeys_each callback ('arg': a tc_lock_rows_t): 0,
 * TXP_EFIELD_TOO_LONG (the row key is too long) or TXP_ENOMEM. */
int tc_lock_rows_add(const txp_lockkey_t *k, void *arg);

#endif /* TC_SQL_ARRAY_H */
