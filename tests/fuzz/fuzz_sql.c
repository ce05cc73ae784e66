/*
 * fuzz_sql.c - libFuzzer target for plain SQL's parse-and-rewrite path
 * (rm-client/src/sql/rm_sql.h): what a service hands rm_at_sql is any
 * text.
 *
 * Whatever the bytes: no crash, no leak, a message on every refusal; an
 * accepted statement is consistent (a known kind; a table for every kind
 * but a read; nparams within bounds), its before-image query classifies
 * again as a SELECT ... FOR UPDATE of the same table using no parameter
 * beyond the statement's, and its statement without RETURNING classifies
 * again as the same kind on the same table; a delta (SET c = c + X) and
 * the key conditions it reports are consistent with the statement.  Seeds: corpus-sql/, the
 * statements of tests/unit/test_rm_sql.c.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_check.h"
#include "rm_client.h"
#include "rm_sql.h"

static bool same(const char *a, const char *b) { return (!a && !b) || (a && b && strcmp(a, b) == 0); }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *sql = fuzz_cstr(data, size, 4096);
  if (!sql) return 0;
  rm_sql_stmt_t s;
  char err[512] = "";
  int rc = rm_sql_classify(sql, &s, err, sizeof(err));
  if (rc != 0) {
    CHECK(rc == RM_E_INVALID || rc == RM_E_NOT_SUPPORTED || rc == RM_E_NOMEM);
    CHECK(err[0] != '\0');
    CHECK(!s.table && !s.image_sql && !s.base_sql);
    free(sql);
    return 0;
  }
  CHECK(s.kind >= RM_SQL_INSERT && s.kind <= RM_SQL_READ);
  CHECK(s.nparams >= 0 && s.nparams <= RM_SQL_MAX_PARAMS);
  CHECK((s.kind == RM_SQL_READ) == (s.table == NULL));
  if (s.kind == RM_SQL_INSERT || s.kind == RM_SQL_UPDATE || s.kind == RM_SQL_DELETE) {
    CHECK(s.base_sql != NULL);
    CHECK(s.returning == (s.returning_sql != NULL));
    rm_sql_stmt_t again;
    CHECK(rm_sql_classify(s.base_sql, &again, err, sizeof(err)) == 0);
    CHECK(again.kind == s.kind && same(again.table, s.table) && same(again.schema, s.schema));
    CHECK(!again.returning && again.nparams <= s.nparams);
    rm_sql_stmt_clear(&again);
  }
  if (s.delta_col) { /* SET c = c +/- X: X a parameter of the statement, or a number */
    CHECK(s.kind == RM_SQL_UPDATE && s.nset == 1 && strcmp(s.set_cols[0], s.delta_col) == 0);
    CHECK(s.delta_sign == 1 || s.delta_sign == -1);
    CHECK((s.delta_param > 0) != (s.delta_value != NULL) && s.delta_param <= s.nparams);
  }
  for (int i = 0; i < s.neq; i++) {
    CHECK(s.eqs[i].col && s.eqs[i].col[0]);
    CHECK((s.eqs[i].param > 0) != (s.eqs[i].value != NULL) && s.eqs[i].param <= s.nparams);
  }
  if (s.kind == RM_SQL_UPDATE || s.kind == RM_SQL_DELETE || s.kind == RM_SQL_SELECT_FOR_UPDATE) {
    CHECK(s.image_sql != NULL);
    CHECK(s.nparams == 0 || s.image_params != NULL);
    rm_sql_stmt_t img;
    CHECK(rm_sql_classify(s.image_sql, &img, err, sizeof(err)) == 0);
    CHECK(img.kind == RM_SQL_SELECT_FOR_UPDATE && same(img.table, s.table) && same(img.schema, s.schema));
    CHECK(img.nparams <= s.nparams);
    for (int i = 0; i < img.nparams; i++) CHECK(!img.image_params[i] || s.image_params[i]);
    rm_sql_stmt_clear(&img);
  } else {
    CHECK(s.image_sql == NULL);
  }
  rm_sql_stmt_clear(&s);
  free(sql);
  return 0;
}
