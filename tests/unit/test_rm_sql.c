/*
 * test_rm_sql.c - plain SQL classified and its before-image query built
 * (rm-client/src/sql/rm_sql.c), on a corpus of accepted and refused
 * statements: odd and quoted identifiers, schemas, aliases, parameters of
 * many types.  Each image query is parsed again, so that it is known to be
 * one valid SELECT ... FOR UPDATE of the same table.  The same statements
 * seed tests/fuzz/corpus-sql.  Leaks are caught by the ASan build.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "rm_client.h"
#include "rm_sql.h"

typedef struct accepted {
  const char *sql;
  rm_sql_kind_t kind;
  const char *schema; /* NULL: unqualified */
  const char *table;  /* NULL: none (a plain read) */
  int nrows;          /* insert */
  int nparams;
  const char *image;  /* NULL: none */
  const char *used;   /* image_params as '0'/'1' per $n, "" when none */
} accepted_t;

static const accepted_t accepted[] = {
    {"UPDATE stock SET qty = qty - $2 WHERE id = $1", RM_SQL_UPDATE, NULL, "stock", 0, 2,
     "SELECT * FROM stock WHERE id = $1 FOR UPDATE", "10"},
    {"update \"Odd Name\" AS o set \"Col\" = $1 where o.\"Key\" = $2 and $3::int > 0", RM_SQL_UPDATE, NULL, "Odd Name",
     0, 3, "SELECT * FROM \"Odd Name\" o WHERE o.\"Key\" = $2 AND $3::int > 0 FOR UPDATE", "011"},
    {"DELETE FROM ONLY app.orders o WHERE o.id IN (SELECT x FROM y) RETURNING *", RM_SQL_DELETE, "app", "orders", 0, 0,
     "SELECT * FROM ONLY app.orders o WHERE o.id IN (SELECT x FROM y) FOR UPDATE", ""},
    {"INSERT INTO a.b (x, y) VALUES ($1, $2), ($3, $4) RETURNING id", RM_SQL_INSERT, "a", "b", 2, 4, NULL, ""},
    {"insert into t default values", RM_SQL_INSERT, NULL, "t", 1, 0, NULL, ""},
    {"INSERT INTO \"we\"\"ird\".\"Tab le\" (\"a b\") VALUES ($1::jsonb), (E'it''s'), ($2::numeric[])", RM_SQL_INSERT,
     "we\"ird", "Tab le", 3, 2, NULL, ""},
    {"SELECT * FROM t WHERE id = $1 FOR UPDATE", RM_SQL_SELECT_FOR_UPDATE, NULL, "t", 0, 1,
     "SELECT * FROM t WHERE id = $1 FOR UPDATE", "1"},
    {"SELECT id FROM t WHERE q > 0 ORDER BY id LIMIT $1 FOR UPDATE", RM_SQL_SELECT_FOR_UPDATE, NULL, "t", 0, 1,
     "SELECT * FROM t WHERE q > 0 ORDER BY id LIMIT $1 FOR UPDATE", "1"},
    {"SELECT * FROM t WHERE x = $2 FOR UPDATE", RM_SQL_SELECT_FOR_UPDATE, NULL, "t", 0, 2,
     "SELECT * FROM t WHERE x = $2 FOR UPDATE", "01"},
    /* $1 is only in SET: the image does not use it (the caller sends it as text) */
    {"UPDATE t SET x = $1 WHERE y = $3", RM_SQL_UPDATE, NULL, "t", 0, 3, "SELECT * FROM t WHERE y = $3 FOR UPDATE",
     "001"},
    {"UPDATE t SET a = $1::timestamptz, b = $2::int[] WHERE id = ANY($3::bigint[]) AND tag = $4::text COLLATE \"C\"",
     RM_SQL_UPDATE, NULL, "t", 0, 4,
     "SELECT * FROM t WHERE id = ANY($3::bigint[]) AND tag = $4::text COLLATE \"C\" FOR UPDATE", "0011"},
    /* the same $n twice, and a '$1' inside a string that is no parameter */
    {"DELETE FROM t WHERE a = $1 OR b = $1 OR c = '$2'", RM_SQL_DELETE, NULL, "t", 0, 1,
     "SELECT * FROM t WHERE a = $1 OR b = $1 OR c = '$2' FOR UPDATE", "1"},
    /* a volatile function in SET runs once, with the statement: fine */
  {"UPDATE t SET v = nextval('s') WHERE id = lower($1)", RM_SQL_UPDATE, NULL, "t", 0, 1,
   "SELECT * FROM t WHERE id = lower($1) FOR UPDATE", "1"},
  {"UPDATE s.t SET v = v + 1 WHERE true", RM_SQL_UPDATE, "s", "t", 0, 0, "SELECT * FROM s.t WHERE true FOR UPDATE",
     ""},
    {"select 1", RM_SQL_READ, NULL, NULL, 0, 0, NULL, ""},
    {"with a as (select 1) select * from a", RM_SQL_READ, NULL, NULL, 0, 0, NULL, ""},
    {"SELECT * FROM t WHERE id = $1", RM_SQL_READ, NULL, NULL, 0, 1, NULL, ""},
    /* a keyword as a quoted name, and a comment */
    {"UPDATE \"select\" SET \"from\" = 1 WHERE \"where\" = 2 -- trailing", RM_SQL_UPDATE, NULL, "select", 0, 0,
     "SELECT * FROM \"select\" WHERE \"where\" = 2 FOR UPDATE", ""},
    /* a name in another script (the deparser quotes it: the same name) */
    {"UPDATE билеты SET остаток = остаток - 1 WHERE ид = $1", RM_SQL_UPDATE, NULL, "билеты", 0, 1,
     "SELECT * FROM \"билеты\" WHERE \"ид\" = $1 FOR UPDATE", "1"},
};

typedef struct refused {
  const char *sql;
  int rc;
  const char *says; /* a part of the message */
} refused_t;

static const refused_t refused[] = {
  {"UPDATE t SET x = 1", RM_E_NOT_SUPPORTED, "without WHERE"},
  {"DELETE FROM t", RM_E_NOT_SUPPORTED, "without WHERE"},
  {"UPDATE t SET x = 1 FROM u WHERE t.id = u.id", RM_E_NOT_SUPPORTED, "FROM another table"},
  {"DELETE FROM t USING u WHERE t.id = u.id", RM_E_NOT_SUPPORTED, "USING another table"},
  {"with a as (delete from t returning *) select * from a", RM_E_NOT_SUPPORTED, "WITH clause that writes"},
  {"WITH a AS (SELECT 1) UPDATE t SET x = 1 WHERE true", RM_E_NOT_SUPPORTED, "WITH clause"},
  {"WITH a AS (SELECT 1) INSERT INTO t VALUES (1)", RM_E_NOT_SUPPORTED, "WITH clause"},
  {"INSERT INTO t SELECT * FROM u", RM_E_NOT_SUPPORTED, "only INSERT ... VALUES"},
  {"INSERT INTO t VALUES (1) ON CONFLICT DO NOTHING", RM_E_NOT_SUPPORTED, "ON CONFLICT"},
  {"INSERT INTO t VALUES (1) ON CONFLICT (id) DO UPDATE SET x = 2", RM_E_NOT_SUPPORTED, "ON CONFLICT"},
  {"select 1; select 2", RM_E_NOT_SUPPORTED, "2 statements"},
  {"UPDATE t SET x = 1 WHERE true; DROP TABLE t", RM_E_NOT_SUPPORTED, "2 statements"},
  {"create table t (x int)", RM_E_NOT_SUPPORTED, "not an INSERT, UPDATE, DELETE or SELECT"},
  {"TRUNCATE t", RM_E_NOT_SUPPORTED, "not an INSERT"},
  {"COPY t FROM STDIN", RM_E_NOT_SUPPORTED, "not an INSERT"},
  {"MERGE INTO t USING u ON t.id = u.id WHEN MATCHED THEN DELETE", RM_E_NOT_SUPPORTED, "not an INSERT"},
  {"CALL p()", RM_E_NOT_SUPPORTED, "not an INSERT"},
  {"SELECT * FROM t FOR SHARE", RM_E_NOT_SUPPORTED, "only FOR UPDATE"},
  {"SELECT * FROM t FOR NO KEY UPDATE", RM_E_NOT_SUPPORTED, "only FOR UPDATE"},
  {"SELECT * FROM t, u FOR UPDATE", RM_E_NOT_SUPPORTED, "one table only"},
  {"SELECT * FROM t JOIN u USING (id) FOR UPDATE", RM_E_NOT_SUPPORTED, "one table only"},
  {"SELECT * FROM (SELECT * FROM t) s FOR UPDATE", RM_E_NOT_SUPPORTED, "one table only"},
  {"SELECT * FROM t FOR UPDATE NOWAIT", RM_E_NOT_SUPPORTED, "NOWAIT"},
  {"SELECT * FROM t FOR UPDATE SKIP LOCKED", RM_E_NOT_SUPPORTED, "SKIP LOCKED"},
  {"SELECT * FROM t FOR UPDATE OF t FOR SHARE OF t", RM_E_NOT_SUPPORTED, "several locking clauses"},
  {"DELETE FROM t WHERE CURRENT OF c", RM_E_NOT_SUPPORTED, "CURRENT OF"},
  {"UPDATE t SET x = $1001 WHERE true", RM_E_NOT_SUPPORTED, "parameters are $1 to $1000"},
  {"DELETE FROM d.s.t WHERE x = 1", RM_E_NOT_SUPPORTED, "database name"},
  {"SELEC 1", RM_E_INVALID, "syntax error"},
  {"UPDATE t SET WHERE", RM_E_INVALID, "syntax error"},
  {"UPDATE t SET q = q - $2, (a, \"B\") = ($3, 4) WHERE id = $1", RM_E_NOT_SUPPORTED, "cannot be rebuilt faithfully"},
  {"UPDATE t SET a[1] = 2 WHERE true", RM_E_NOT_SUPPORTED, "set the whole column"},
  {"UPDATE t SET c.f = 2 WHERE true", RM_E_NOT_SUPPORTED, "set the whole column"},
  {"DELETE FROM t WHERE id = (SELECT max(id) FROM t WHERE random() < 0.5)", RM_E_NOT_SUPPORTED, "calls random()"},
  {"UPDATE t SET x = 1 WHERE id = pg_catalog.nextval('s')", RM_E_NOT_SUPPORTED, "calls nextval()"},
  {"SELECT * FROM t WHERE at < clock_timestamp() FOR UPDATE", RM_E_NOT_SUPPORTED, "calls clock_timestamp()"},
  {"", RM_E_INVALID, "no statement"},
  {"-- only a comment", RM_E_INVALID, "no statement"},
};

/* The statement without RETURNING, and that list, for the AT layer. */
typedef struct rebuilt {
  const char *sql, *base, *returning, *alias, *set; /* set: the SET columns, comma-separated */
} rebuilt_t;

static const rebuilt_t rebuilt[] = {
  {"UPDATE stock s SET qty = qty - $2, a = $3 WHERE id = $1 RETURNING s.qty AS left, *",
   "UPDATE stock s SET qty = qty - $2, a = $3 WHERE id = $1", "s.qty AS \"left\", *", "s", "qty,a"},
  {"update \"T t\" set \"Q\" = 1 where k = 2", "UPDATE \"T t\" SET \"Q\" = 1 WHERE k = 2", NULL, NULL, "Q"},
  {"INSERT INTO t (a) VALUES ($1) RETURNING id", "INSERT INTO t (a) VALUES ($1)", "id", NULL, ""},
  {"INSERT INTO s.t AS x VALUES (1, $1::int[], 'it''s')", "INSERT INTO s.t AS x VALUES (1, $1::int[], 'it''s')", NULL,
   "x", ""},
  {"UPDATE t SET (a, b) = ($1, 2) WHERE id = $3", "UPDATE t SET (a, b) = ($1, 2) WHERE id = $3", NULL, NULL, "a,b"},
  {"DELETE FROM t WHERE id = 1 and b like '%x' RETURNING b || 'y'", "DELETE FROM t WHERE id = 1 AND b LIKE '%x'",
   "b || 'y'", NULL, ""},
};

static void test_rebuilt(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof(rebuilt) / sizeof(rebuilt[0]); i++) {
    const rebuilt_t *r = &rebuilt[i];
    rm_sql_stmt_t s;
    char err[512] = "";
    if (rm_sql_classify(r->sql, &s, err, sizeof(err)) != 0) fail_msg("%s: %s", r->sql, err);
    assert_string_equal(s.base_sql, r->base);
    if (r->returning) assert_string_equal(s.returning_sql, r->returning);
    else assert_null(s.returning_sql);
    if (r->alias) assert_string_equal(s.alias, r->alias);
    else assert_null(s.alias);
    char set[256] = "";
    for (int k = 0; k < s.nset; k++) {
      if (k) strcat(set, ",");
      strcat(set, s.set_cols[k]);
    }
    assert_string_equal(set, r->set);
    rm_sql_stmt_clear(&s);
  }
}

static void bits(const rm_sql_stmt_t *s, char *out) {
  int i = 0;
  for (; s->image_params && i < s->nparams; i++) out[i] = s->image_params[i] ? '1' : '0';
  out[i] = '\0';
}

static void test_accepted(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof(accepted) / sizeof(accepted[0]); i++) {
    const accepted_t *a = &accepted[i];
    rm_sql_stmt_t s;
    char err[512] = "";
    int rc = rm_sql_classify(a->sql, &s, err, sizeof(err));
    if (rc != 0) fail_msg("%s: rc %d: %s", a->sql, rc, err);
    assert_int_equal(s.kind, a->kind);
    if (a->schema) assert_string_equal(s.schema, a->schema);
    else assert_null(s.schema);
    if (a->table) assert_string_equal(s.table, a->table);
    else assert_null(s.table);
    if (a->kind == RM_SQL_INSERT) assert_int_equal(s.nrows, a->nrows);
    assert_int_equal(s.nparams, a->nparams);
    if (a->image) {
      assert_non_null(s.image_sql);
      if (strcmp(s.image_sql, a->image) != 0) fail_msg("%s: image\n  %s\nnot\n  %s", a->sql, s.image_sql, a->image);
      char used[RM_SQL_MAX_PARAMS + 1];
      bits(&s, used);
      assert_string_equal(used, a->used);
      /* The image is itself one valid SELECT ... FOR UPDATE of the same table. */
      rm_sql_stmt_t again;
      rc = rm_sql_classify(s.image_sql, &again, err, sizeof(err));
      if (rc != 0) fail_msg("image of %s: rc %d: %s", a->sql, rc, err);
      assert_int_equal(again.kind, RM_SQL_SELECT_FOR_UPDATE);
      assert_string_equal(again.table, s.table);
      rm_sql_stmt_clear(&again);
    } else {
      assert_null(s.image_sql);
      assert_null(s.image_params);
    }
    rm_sql_stmt_clear(&s);
  }
}

static void test_returning_and_only(void **state) {
  (void)state;
  rm_sql_stmt_t s;
  char err[256];
  assert_int_equal(rm_sql_classify("DELETE FROM ONLY app.orders o WHERE true RETURNING *", &s, err, sizeof(err)), 0);
  assert_true(s.only);
  assert_true(s.returning);
  rm_sql_stmt_clear(&s);
  assert_int_equal(rm_sql_classify("UPDATE t SET x = 1 WHERE true", &s, err, sizeof(err)), 0);
  assert_false(s.only);
  assert_false(s.returning);
  rm_sql_stmt_clear(&s);
  assert_int_equal(rm_sql_classify("INSERT INTO t VALUES (1) RETURNING id, x", &s, err, sizeof(err)), 0);
  assert_true(s.returning);
  rm_sql_stmt_clear(&s);
}

static void test_refused(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++) {
    const refused_t *r = &refused[i];
    rm_sql_stmt_t s;
    memset(&s, 0x5a, sizeof(s)); /* it must clear what it does not fill */
    char err[512] = "";
    int rc = rm_sql_classify(r->sql, &s, err, sizeof(err));
    if (rc != r->rc) fail_msg("%s: rc %d not %d (%s)", r->sql, rc, r->rc, err);
    if (!strstr(err, r->says)) fail_msg("%s: message \"%s\" does not say \"%s\"", r->sql, err, r->says);
    assert_null(s.table);
    assert_null(s.image_sql);
    assert_null(s.image_params);
    rm_sql_stmt_clear(&s);
  }
}

static void test_bad_arguments(void **state) {
  (void)state;
  rm_sql_stmt_t s;
  char err[64];
  assert_int_equal(rm_sql_classify(NULL, &s, err, sizeof(err)), RM_E_INVALID);
  assert_int_equal(rm_sql_classify("select 1", NULL, err, sizeof(err)), RM_E_INVALID);
  /* no room for a message is fine, and a short one is cut, not overrun */
  assert_int_equal(rm_sql_classify("UPDATE t SET x = 1", &s, NULL, 0), RM_E_NOT_SUPPORTED);
  char tiny[8];
  assert_int_equal(rm_sql_classify("UPDATE t SET x = 1", &s, tiny, sizeof(tiny)), RM_E_NOT_SUPPORTED);
  assert_int_equal(strlen(tiny), sizeof(tiny) - 1);
  rm_sql_stmt_clear(NULL);
  assert_string_equal(rm_sql_kind_name(RM_SQL_DELETE), "delete");
  assert_string_equal(rm_sql_kind_name((rm_sql_kind_t)99), "unknown");
}

/* The highest parameter bounds the map; a long statement with many. */
static void test_many_params(void **state) {
  (void)state;
  char sql[16384];
  size_t n = (size_t)snprintf(sql, sizeof(sql), "UPDATE t SET v = $1 WHERE id IN (");
  for (int i = 2; i <= RM_SQL_MAX_PARAMS; i++)
    n += (size_t)snprintf(sql + n, sizeof(sql) - n, "%s$%d", i > 2 ? ", " : "", i);
  snprintf(sql + n, sizeof(sql) - n, ")");
  rm_sql_stmt_t s;
  char err[256];
  assert_int_equal(rm_sql_classify(sql, &s, err, sizeof(err)), 0);
  assert_int_equal(s.nparams, RM_SQL_MAX_PARAMS);
  assert_false(s.image_params[0]);
  for (int i = 1; i < RM_SQL_MAX_PARAMS; i++) assert_true(s.image_params[i]);
  rm_sql_stmt_clear(&s);
}

/* SET c = c + X / c - X, and the WHERE's col = X conjuncts: what the AT
 * layer needs to take a hot counter's change as a delta. */
typedef struct delta_case {
  const char *sql;
  const char *col; /* NULL: not a delta */
  int sign, param;
  const char *value;
  const char *eqs; /* "col=$n" or "col='v'", comma-separated */
  bool more;
} delta_case_t;

static const delta_case_t delta_cases[] = {
  {"UPDATE b SET frozen = frozen + $4::int WHERE a = $1 AND t = $2 AND k = $3 AND stock - frozen >= $4::int",
   "frozen", 1, 4, NULL, "a=$1,t=$2,k=$3", true},
  {"UPDATE b SET n = b.n + 5 WHERE id = 'x'", "n", 1, 0, "5", "id='x'", false},
  {"UPDATE b SET n = n - $1 WHERE id = $2::bigint", "n", -1, 1, NULL, "id=$2", false},
  {"UPDATE b SET n = n + 2.5 WHERE id = 7", "n", 1, 0, "2.5", "id='7'", false},
  {"UPDATE b SET n = n + 1, m = 2 WHERE id = 1", NULL, 0, 0, NULL, "id='1'", false},
  {"UPDATE b SET n = m + 1 WHERE id = 1", NULL, 0, 0, NULL, "id='1'", false},
  {"UPDATE b SET n = n * 2 WHERE id = 1", NULL, 0, 0, NULL, "id='1'", false},
  {"UPDATE b SET n = n + 'x' WHERE id = 1", NULL, 0, 0, NULL, "id='1'", false},
  {"UPDATE b SET n = n + $1 WHERE id = $2 OR id = $3", "n", 1, 1, NULL, "", true},
  {"DELETE FROM b WHERE id = $1 AND $2 = x AND y > 0", NULL, 0, 0, NULL, "id=$1", true},
};

static void test_delta_shape(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof(delta_cases) / sizeof(delta_cases[0]); i++) {
    const delta_case_t *d = &delta_cases[i];
    rm_sql_stmt_t s;
    char err[256];
    if (rm_sql_classify(d->sql, &s, err, sizeof(err)) != 0) fail_msg("%s: %s", d->sql, err);
    if (d->col) {
      if (!s.delta_col || strcmp(s.delta_col, d->col) != 0) fail_msg("%s: delta column %s", d->sql, s.delta_col);
      assert_int_equal(s.delta_sign, d->sign);
      assert_int_equal(s.delta_param, d->param);
      if (d->value) assert_string_equal(s.delta_value, d->value);
      else assert_null(s.delta_value);
    } else if (s.delta_col) {
      fail_msg("%s: taken as a delta of %s", d->sql, s.delta_col);
    }
    char eqs[256] = "";
    for (int k = 0; k < s.neq; k++) {
      size_t n = strlen(eqs);
      if (s.eqs[k].param) snprintf(eqs + n, sizeof(eqs) - n, "%s%s=$%d", k ? "," : "", s.eqs[k].col, s.eqs[k].param);
      else snprintf(eqs + n, sizeof(eqs) - n, "%s%s='%s'", k ? "," : "", s.eqs[k].col, s.eqs[k].value);
    }
    if (strcmp(eqs, d->eqs) != 0) fail_msg("%s: conditions \"%s\", not \"%s\"", d->sql, eqs, d->eqs);
    assert_int_equal(s.where_more, d->more);
    rm_sql_stmt_clear(&s);
  }
}

/* A condition nested deeper than the volatile-function check walks is
 * refused, not walked without bound. */
static void test_deep_condition(void **state) {
  (void)state;
  enum { TERMS = 3000 };
  char *sql = malloc(64 + TERMS * 4);
  assert_non_null(sql);
  size_t n = (size_t)sprintf(sql, "DELETE FROM t WHERE 0");
  for (int i = 0; i < TERMS; i++) n += (size_t)sprintf(sql + n, " + 1");
  sprintf(sql + n, " > 0");
  rm_sql_stmt_t s;
  char err[256] = "";
  assert_int_equal(rm_sql_classify(sql, &s, err, sizeof(err)), RM_E_NOT_SUPPORTED);
  assert_non_null(strstr(err, "nested too deeply"));
  free(sql);
}

/* The cache: one entry per text, refusals not kept, bounded. */
static void test_cache(void **state) {
  (void)state;
  rm_sql_cache_t *c = rm_sql_cache_new(1);
  assert_non_null(c);
  const rm_sql_stmt_t *a = NULL, *b = NULL;
  rm_sql_stmt_t own;
  char err[256];
  assert_int_equal(rm_sql_cache_get(c, "DELETE FROM t WHERE id = $1", &a, &own, err, sizeof(err)), 0);
  assert_ptr_not_equal(a, &own); /* kept */
  rm_sql_stmt_clear(&own);
  assert_int_equal(rm_sql_cache_get(c, "DELETE FROM t WHERE id = $1", &b, &own, err, sizeof(err)), 0);
  assert_ptr_equal(a, b);
  assert_int_equal(b->kind, RM_SQL_DELETE);
  rm_sql_stmt_clear(&own);
  /* full: classified into 'own' */
  assert_int_equal(rm_sql_cache_get(c, "UPDATE t SET x = 1 WHERE y = 2", &b, &own, err, sizeof(err)), 0);
  assert_ptr_equal(b, &own);
  assert_int_equal(b->kind, RM_SQL_UPDATE);
  rm_sql_stmt_clear(&own);
  assert_int_equal(rm_sql_cache_get(c, "UPDATE t SET x = 1", &b, &own, err, sizeof(err)), RM_E_NOT_SUPPORTED);
  assert_null(b);
  assert_non_null(strstr(err, "without WHERE"));
  rm_sql_stmt_clear(&own);
  assert_int_equal(rm_sql_cache_get(NULL, "select 1", &b, &own, err, sizeof(err)), 0); /* no cache */
  assert_ptr_equal(b, &own);
  rm_sql_stmt_clear(&own);
  assert_int_equal(rm_sql_cache_get(c, NULL, &b, &own, err, sizeof(err)), RM_E_INVALID);
  rm_sql_cache_free(c);
  rm_sql_cache_free(NULL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_accepted),      cmocka_unit_test(test_returning_and_only),
    cmocka_unit_test(test_refused),       cmocka_unit_test(test_bad_arguments),
    cmocka_unit_test(test_many_params),   cmocka_unit_test(test_rebuilt),
    cmocka_unit_test(test_cache),         cmocka_unit_test(test_delta_shape),
    cmocka_unit_test(test_deep_condition),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
