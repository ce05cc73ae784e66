/*
 * tc_sql_array.c - PostgreSQL array literals; see tc_sql_array.h.
 */
#include "tc_sql_array.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>

void tc_sql_array_init(tc_sql_array_t *a) {
  txp_buf_init(&a->b, 0);
  a->n = 0;
  a->ended = 0;
  a->failed = txp_buf_append(&a->b, "{", 1) != 0;
}

void tc_sql_array_add(tc_sql_array_t *a, const char *v) {
  if (a->failed) return;
  int rc = a->n++ ? txp_buf_append(&a->b, ",", 1) : 0;
  if (!v) {
    if (!rc) rc = txp_buf_append(&a->b, "NULL", 4);
  } else {
    /* Escape for the literal: the text may hold '"' or '\\'. */
    if (!rc) rc = txp_buf_append(&a->b, "\"", 1);
    for (const char *p = v; *p && !rc; p++) {
      if (*p == '"' || *p == '\\') rc = txp_buf_append(&a->b, "\\", 1);
      if (!rc) rc = txp_buf_append(&a->b, p, 1);
    }
    if (!rc) rc = txp_buf_append(&a->b, "\"", 1);
  }
  a->failed = rc != 0;
}

void tc_sql_array_add_i64(tc_sql_array_t *a, int64_t v) {
  char tmp[32];
  snprintf(tmp, sizeof(tmp), "%" PRId64, v);
  tc_sql_array_add(a, tmp);
}

const char *tc_sql_array_end(tc_sql_array_t *a) {
  if (!a->failed && !a->ended) a->failed = txp_buf_append(&a->b, "}", 1) != 0;
  a->ended = 1;
  return a->failed ? NULL : a->b.data;
}

void tc_sql_array_free(tc_sql_array_t *a) { txp_buf_free(&a->b); }

/* Whether 'a' is wanted and out of memory. */
static bool spent(const tc_sql_array_t *a) { return a && a->failed; }

int tc_lock_rows_add(const txp_lockkey_t *k, void *arg) {
  tc_lock_rows_t *c = arg;
  char row[TXP_MAX_ROW_KEY_LEN + 1], table[TXP_MAX_ROW_KEY_LEN + 1], pk[TXP_MAX_ROW_KEY_LEN + 1];
  if (txp_row_key(c->resource, k, row, sizeof(row)) < 0) return TXP_EFIELD_TOO_LONG;
  snprintf(table, sizeof(table), "%.*s", (int)k->table_len, k->table);
  snprintf(pk, sizeof(pk), "%.*s", (int)k->pk_len, k->pk);
  if (c->item) tc_sql_array_add_i64(c->item, c->index);
  if (c->row) tc_sql_array_add(c->row, row);
  if (c->table) tc_sql_array_add(c->table, table);
  if (c->pk) tc_sql_array_add(c->pk, pk);
  return spent(c->item) || spent(c->row) || spent(c->table) || spent(c->pk) ? TXP_ENOMEM : 0;
}
