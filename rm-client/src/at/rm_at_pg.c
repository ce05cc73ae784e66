/*
 * rm_at_pg.c - the smallest helpers of the AT layer: a branch's message
 * and a result row as an image.  A leaf of at/ (the images and libpq).
 */
#include <stdarg.h>
#include <stdio.h>

#include "rm_at_int.h"

void rm__at_err(rm_branch_t *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(b->errmsg, sizeof(b->errmsg), fmt, ap);
  va_end(ap);
  rm__errmsg_set("%s", b->errmsg); /* rm_errmsg() too: the one last-error pattern */
}

rm_row_t *rm__row_from_result(const PGresult *res, int row) { return rm__row_from_fields(res, row, 0); }

rm_row_t *rm__row_from_fields(const PGresult *res, int row, int first) {
  return rm__row_from_range(res, row, first, PQnfields(res) - first);
}

rm_row_t *rm__row_from_range(const PGresult *res, int row, int first, int n) {
  rm_row_t *r = rm_row_new(n > 0 ? n : 0);
  if (!r) return NULL;
  for (int i = 0; i < n; i++) {
    const char *v = PQgetisnull(res, row, first + i) ? NULL : PQgetvalue(res, row, first + i);
    if (rm_row_set(r, i, PQfname(res, first + i), v) != 0) {
      rm_row_free(r);
      return NULL;
    }
  }
  return r;
}


