/*
 * test_pstmt.c - the named prepared statements of txc_pstmt.h, which
 * librmclient's AT layer and the services' svc_pg_exec share, against a
 * real PostgreSQL (scripts/with-servers --pg; STOCK_PG_URL):
 *
 *   1. a statement run twice on a connection is prepared there once, under
 *      the cache's prefix, and answers as the unnamed one would; two
 *      caches with different prefixes share a connection;
 *   2. a statement the server dropped (DEALLOCATE ALL) is run unnamed at
 *      once outside a transaction, and prepared again on the next call;
 *   3. a table changed under a prepared statement (its result type:
 *      0A000): outside a transaction the call still answers; inside one
 *      the error is the answer and the next call prepares afresh;
 *   4. a reconnected connection starts empty; no cache or no room: unnamed;
 *   5. svc_pg_exec goes through the services' cache ("svc_" names);
 *   6. svc_pg_pipeline: statements in one round trip, prepared the same
 *      way; a failing one stops the rest (their results NULL), its message
 *      is the answer, and the transaction it was in is aborted.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "svc_common.h"
#include "txc_pstmt.h"

static const char *url(void) {
  const char *u = getenv("STOCK_PG_URL");
  if (!u) fail_msg("STOCK_PG_URL is not set: run me under scripts/with-servers --pg");
  return u;
}

static PGconn *connect_ok(void) {
  PGconn *pg = PQconnectdb(url());
  if (PQstatus(pg) != CONNECTION_OK) fail_msg("could not connect: %s", PQerrorMessage(pg));
  return pg;
}

static void run_ok(PGconn *pg, const char *sql) {
  PGresult *r = PQexec(pg, sql);
  ExecStatusType st = PQresultStatus(r);
  if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) fail_msg("%s: %s", sql, PQerrorMessage(pg));
  PQclear(r);
}

/* The statements prepared on 'pg' whose names begin with 'prefix'. */
static int prepared(PGconn *pg, const char *prefix) {
  const char *p[1] = {prefix};
  PGresult *r = PQexecParams(pg, "SELECT count(*) FROM pg_prepared_statements WHERE starts_with(name, $1)", 1, NULL,
                             p, NULL, NULL, 0);
  assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
  int n = atoi(PQgetvalue(r, 0, 0));
  PQclear(r);
  return n;
}

/* SELECT $1 + 1 through the cache: its answer. */
static int plus_one(txc_pstmt_cache_t *c, PGconn *pg, int x) {
  char sx[16];
  snprintf(sx, sizeof(sx), "%d", x);
  const char *p[1] = {sx};
  PGresult *r = txc_pstmt_exec(c, pg, "SELECT $1::int + 1", 1, p);
  if (PQresultStatus(r) != PGRES_TUPLES_OK) fail_msg("SELECT $1 + 1: %s", PQresultErrorMessage(r));
  int v = atoi(PQgetvalue(r, 0, 0));
  PQclear(r);
  return v;
}

static void test_prepared_once(void **state) {
  (void)state;
  PGconn *pg = connect_ok();
  txc_pstmt_cache_t *a = txc_pstmt_new("ta_", 4), *b = txc_pstmt_new("tb_", 4);
  assert_non_null(a);
  assert_non_null(b);
  assert_int_equal(plus_one(a, pg, 1), 2);
  assert_int_equal(prepared(pg, "ta_"), 1);
  assert_int_equal(plus_one(a, pg, 41), 42);
  assert_int_equal(prepared(pg, "ta_"), 1); /* run by name, not prepared again */
  assert_int_equal(plus_one(b, pg, 2), 3);  /* the other cache, the same text */
  assert_int_equal(prepared(pg, "ta_"), 1);
  assert_int_equal(prepared(pg, "tb_"), 1);
  /* a statement without parameters goes as it is */
  PGresult *r = txc_pstmt_exec(a, pg, "SELECT 7", 0, NULL);
  assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
  PQclear(r);
  assert_int_equal(prepared(pg, "ta_"), 1);
  /* an error is the statement's own, whether prepared now or not */
  r = txc_pstmt_exec(a, pg, "SELECT $1::int FROM no_such_table", 1, (const char *const[]){"1"});
  assert_int_equal(PQresultStatus(r), PGRES_FATAL_ERROR);
  assert_string_equal(PQresultErrorField(r, PG_DIAG_SQLSTATE), "42P01");
  PQclear(r);
  r = txc_pstmt_exec(a, pg, "SELECT $1::int + 1", 1, (const char *const[]){"x"});
  assert_int_equal(PQresultStatus(r), PGRES_FATAL_ERROR);
  assert_string_equal(PQresultErrorField(r, PG_DIAG_SQLSTATE), "22P02");
  PQclear(r);
  txc_pstmt_free(a);
  txc_pstmt_free(b);
  PQfinish(pg);
  /* bad prefixes */
  assert_null(txc_pstmt_new("", 4));
  assert_null(txc_pstmt_new("a-b", 4));
  assert_null(txc_pstmt_new("much_too_long_prefix", 4));
  assert_null(txc_pstmt_new("ok_", 0));
}

static void test_dropped_by_the_server(void **state) {
  (void)state;
  PGconn *pg = connect_ok();
  txc_pstmt_cache_t *c = txc_pstmt_new("td_", 4);
  assert_int_equal(plus_one(c, pg, 1), 2);
  run_ok(pg, "DEALLOCATE ALL");
  assert_int_equal(prepared(pg, "td_"), 0);
  assert_int_equal(plus_one(c, pg, 5), 6); /* 26000, then unnamed at once */
  assert_int_equal(prepared(pg, "td_"), 0);
  assert_int_equal(plus_one(c, pg, 6), 7); /* forgotten, so prepared afresh */
  assert_int_equal(prepared(pg, "td_"), 1);
  txc_pstmt_free(c);
  PQfinish(pg);
}

/* 'sql' through 'c' answers rows: how many columns. */
static int columns(txc_pstmt_cache_t *c, PGconn *pg, const char *sql, const char *const *p) {
  PGresult *r = txc_pstmt_exec(c, pg, sql, 1, p);
  if (PQresultStatus(r) != PGRES_TUPLES_OK) fail_msg("%s: %s", sql, PQresultErrorMessage(r));
  int n = PQnfields(r);
  PQclear(r);
  return n;
}

static void test_table_changed(void **state) {
  (void)state;
  PGconn *pg = connect_ok();
  run_ok(pg, "DROP TABLE IF EXISTS pstmt_t; CREATE TABLE pstmt_t (id int, v int); INSERT INTO pstmt_t VALUES (1, 10)");
  txc_pstmt_cache_t *c = txc_pstmt_new("tt_", 4);
  const char *sql = "SELECT * FROM pstmt_t WHERE id = $1";
  const char *p[1] = {"1"};
  assert_int_equal(columns(c, pg, sql, p), 2);
  /* outside a transaction: answered (unnamed), with the new column */
  run_ok(pg, "ALTER TABLE pstmt_t ADD COLUMN w int DEFAULT 5");
  assert_int_equal(columns(c, pg, sql, p), 3);
  assert_int_equal(columns(c, pg, sql, p), 3); /* prepared again, with three columns */
  /* inside a transaction: the error is the answer; after the rollback the
   * statement is prepared afresh */
  run_ok(pg, "ALTER TABLE pstmt_t DROP COLUMN w");
  run_ok(pg, "BEGIN");
  PGresult *r = txc_pstmt_exec(c, pg, sql, 1, p);
  assert_int_equal(PQresultStatus(r), PGRES_FATAL_ERROR);
  assert_string_equal(PQresultErrorField(r, PG_DIAG_SQLSTATE), "0A000");
  assert_true(txc_pstmt_stale(r));
  PQclear(r);
  run_ok(pg, "ROLLBACK");
  assert_int_equal(columns(c, pg, sql, p), 2);
  run_ok(pg, "DROP TABLE pstmt_t");
  txc_pstmt_free(c);
  PQfinish(pg);
}

static void test_reconnect_and_limits(void **state) {
  (void)state;
  PGconn *pg = connect_ok();
  txc_pstmt_cache_t *c = txc_pstmt_new("tr_", 1);
  assert_int_equal(plus_one(c, pg, 1), 2);
  PQreset(pg); /* a new backend at the same address: nothing is prepared there */
  assert_int_equal(PQstatus(pg), CONNECTION_OK);
  assert_int_equal(plus_one(c, pg, 2), 3);
  assert_int_equal(prepared(pg, "tr_"), 1);
  /* room for one connection: a second takes its slot (least recently used) */
  PGconn *other = connect_ok();
  assert_int_equal(plus_one(c, other, 3), 4);
  assert_int_equal(prepared(other, "tr_"), 1);
  /* no cache: unnamed */
  assert_int_equal(plus_one(NULL, other, 4), 5);
  assert_int_equal(prepared(other, "tr_"), 1);
  /* a full connection: the texts beyond TXC_PSTMT_PER_CONN go unnamed */
  for (int i = 0; i < TXC_PSTMT_PER_CONN + 3; i++) {
    char sql[64], si[16];
    snprintf(sql, sizeof(sql), "SELECT $1::int + %d", i);
    snprintf(si, sizeof(si), "%d", i);
    const char *p[1] = {si};
    PGresult *r = txc_pstmt_exec(c, other, sql, 1, p);
    assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
    assert_int_equal(atoi(PQgetvalue(r, 0, 0)), 2 * i);
    PQclear(r);
  }
  assert_int_equal(prepared(other, "tr_"), TXC_PSTMT_PER_CONN);
  txc_pstmt_free(c);
  PQfinish(pg);
  PQfinish(other);
}

static void test_services_statements(void **state) {
  (void)state;
  PGconn *pg = connect_ok();
  char err[256];
  PGresult *r = NULL;
  const char *p[1] = {"20"};
  for (int i = 0; i < 3; i++) {
    assert_true(svc_pg_exec(pg, "SELECT $1::int * 2", 1, p, PGRES_TUPLES_OK, &r, err, sizeof(err)));
    assert_string_equal(PQgetvalue(r, 0, 0), "40");
    PQclear(r);
  }
  assert_int_equal(prepared(pg, "svc_"), 1);
  assert_false(svc_pg_exec(pg, "SELECT $1::int * 2", 1, (const char *const[]){"x"}, PGRES_TUPLES_OK, &r, err,
                           sizeof(err)));
  assert_null(r);
  assert_non_null(strstr(err, "invalid input syntax"));
  PQfinish(pg);
}

static void test_pipeline(void **state) {
  (void)state;
  PGconn *pg = connect_ok();
  char err[256];
  run_ok(pg, "DROP TABLE IF EXISTS pstmt_p; CREATE TABLE pstmt_p (id int PRIMARY KEY, v text)");
  for (int round = 0; round < 2; round++) { /* prepared in the first, by name in the second */
    char id[16];
    snprintf(id, sizeof(id), "%d", round);
    const char *ins[2] = {id, "x"};
    const char *sel[1] = {id};
    const svc_pg_stmt_t st[4] = {{"BEGIN", 0, NULL, PGRES_COMMAND_OK},
                                 {"INSERT INTO pstmt_p VALUES ($1, $2)", 2, ins, PGRES_COMMAND_OK},
                                 {"SELECT v FROM pstmt_p WHERE id = $1", 1, sel, PGRES_TUPLES_OK},
                                 {"COMMIT", 0, NULL, PGRES_COMMAND_OK}};
    PGresult *res[4];
    assert_true(svc_pg_pipeline(pg, st, 4, res, err, sizeof(err)));
    assert_string_equal(PQgetvalue(res[2], 0, 0), "x");
    assert_string_equal(PQcmdStatus(res[3]), "COMMIT");
    for (int i = 0; i < 4; i++) PQclear(res[i]);
    assert_int_equal(PQtransactionStatus(pg), PQTRANS_IDLE);
  }
  assert_int_equal(prepared(pg, "svc_"), 2);
  /* a duplicate key in the middle: the SELECT and the COMMIT do not run */
  const char *dup[2] = {"1", "y"};
  const char *sel[1] = {"1"};
  const svc_pg_stmt_t bad[4] = {{"BEGIN", 0, NULL, PGRES_COMMAND_OK},
                                {"INSERT INTO pstmt_p VALUES ($1, $2)", 2, dup, PGRES_COMMAND_OK},
                                {"SELECT v FROM pstmt_p WHERE id = $1", 1, sel, PGRES_TUPLES_OK},
                                {"COMMIT", 0, NULL, PGRES_COMMAND_OK}};
  PGresult *res[4];
  assert_false(svc_pg_pipeline(pg, bad, 4, res, err, sizeof(err)));
  assert_non_null(strstr(err, "duplicate key"));
  assert_non_null(res[0]);
  assert_non_null(res[1]);
  assert_null(res[2]);
  assert_null(res[3]);
  for (int i = 0; i < 4; i++) PQclear(res[i]);
  assert_int_equal(PQtransactionStatus(pg), PQTRANS_INERROR);
  run_ok(pg, "ROLLBACK");
  /* the connection works as before: out of pipeline mode */
  assert_int_equal(PQpipelineStatus(pg), PQ_PIPELINE_OFF);
  PGresult *r = NULL;
  assert_true(svc_pg_exec(pg, "SELECT count(*) FROM pstmt_p WHERE v = $1", 1, (const char *const[]){"x"},
                          PGRES_TUPLES_OK, &r, err, sizeof(err)));
  assert_string_equal(PQgetvalue(r, 0, 0), "2");
  PQclear(r);
  /* a statement that fails to prepare: its own message */
  const svc_pg_stmt_t wrong[1] = {{"SELEC $1", 1, sel, PGRES_TUPLES_OK}};
  assert_false(svc_pg_pipeline(pg, wrong, 1, NULL, err, sizeof(err)));
  assert_non_null(strstr(err, "syntax error"));
  assert_false(svc_pg_pipeline(pg, wrong, 0, NULL, err, sizeof(err)));
  assert_false(svc_pg_pipeline(pg, wrong, SVC_PG_PIPELINE_MAX + 1, NULL, err, sizeof(err)));
  run_ok(pg, "DROP TABLE pstmt_p");
  PQfinish(pg);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_prepared_once),
    cmocka_unit_test(test_dropped_by_the_server),
    cmocka_unit_test(test_table_changed),
    cmocka_unit_test(test_reconnect_and_limits),
    cmocka_unit_test(test_services_statements),
    cmocka_unit_test(test_pipeline),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
