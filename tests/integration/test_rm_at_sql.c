/*
 * test_rm_at_sql.c - rm_at_sql, plain SQL in an AT branch, against the
 * real databases and tcd of test_rm_at.c (its fixture): each statement
 * kind committed and rolled back through the coordinator, multi-row
 * updates and deletes, a composite key in another schema with quoted
 * names, the caller's RETURNING, a WHERE that matches nothing, a dirty
 * write found by the rollback, and refusals that change nothing.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <libpq-fe.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rm_at_fixture.h"
#include "rm_client.h"
#include "rm_internal.h"

/* A table with a quoted name and key, and one with a composite key in
 * another schema; 'tag' keeps each test to its own rows. */
static void sql_tables(PGconn *o) {
  assert_true(exec_ok(o, "CREATE TABLE IF NOT EXISTS \"Plain Sql\" (\"K\" text PRIMARY KEY, n int NOT NULL,"
                         " note text, tag text, at timestamptz DEFAULT now())"));
  assert_true(exec_ok(o, "CREATE TABLE IF NOT EXISTS other.pair (a int, b text, v numeric(12,2), tag text,"
                         " PRIMARY KEY (a, b))"));
}

/* The rows of a test, as text, for before/after comparison. */
static char *rows_of(PGconn *o, const char *tag) {
  const char *p[1] = {tag};
  PGresult *r = PQexecParams(o,
                             "SELECT coalesce(string_agg(t::text, ';' ORDER BY t::text), '') FROM ("
                             " SELECT \"K\", n, note, tag, at FROM \"Plain Sql\" WHERE tag = $1"
                             " UNION ALL SELECT a::text, v::int, b, tag, NULL FROM other.pair WHERE tag = $1) t",
                             1, NULL, p, NULL, NULL, 0);
  assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
  char *s = strdup(PQgetvalue(r, 0, 0));
  PQclear(r);
  return s;
}

static void commit_branch(PGconn *o, rm_branch_t *b) {
  int64_t bid = 0;
  bool committed = false;
  int rc = rm_at_prepare_commit(b, &bid, &committed);
  if (rc != 0) fail_msg("prepare: %s", rm_at_errmsg(b));
  assert_true(committed);
  assert_int_equal(rm_at_close(b, true), 0);
  (void)o;
}

static int sql(rm_branch_t *b, const char *text, int n, const char *const *vals, int64_t *rows) {
  int rc = rm_at_sql(b, text, n, NULL, vals, rows, NULL);
  if (rc != 0 && getenv("RM_TEST_VERBOSE")) fprintf(stderr, "  rm_at_sql: %s\n", rm_at_errmsg(b));
  return rc;
}

/* Insert (several rows), update (several rows), delete: committed, then a
 * second global transaction does the same kinds and is rolled back to
 * exactly the rows of the first. */
void test_sql_commit_rollback(void **state) {
  (void)state;
  PGconn *o = itest_pg(orders_url);
  sql_tables(o);
  const char *tag = "sql-cr";
  char xid[RM_XID_MAX];

  /* 1: inserts, committed. */
  rm_branch_t *b = begin_and_open(o, "sql_commit", "orders", xid);
  int64_t rows = -1;
  const char *v1[] = {"cr-1", "10", "cr-2", "20", "cr-3", tag};
  assert_int_equal(sql(b, "INSERT INTO \"Plain Sql\" (\"K\", n, tag) VALUES ($1, $2::int, $6), ($3, $4::int, $6),"
                          " ($5, 30, $6)", 6, v1, &rows), 0);
  assert_int_equal(rows, 3);
  const char *v2[] = {"7", "x", tag};
  assert_int_equal(sql(b, "INSERT INTO other.pair AS p VALUES ($1::int, $2, 1.50, $3), (8, 'y''s', 2.25, $3)", 3,
                       v2, &rows), 0);
  assert_int_equal(rows, 2);
  commit_branch(o, b);
  int st = 0;
  assert_int_equal(rm_tm_commit(client, xid, &st), 0);
  char *first = rows_of(o, tag);
  assert_non_null(strstr(first, "cr-3"));

  /* 2: multi-row update, a delete, an insert; then rolled back. */
  assert_int_equal(rm_tm_begin(client, 30000, "sql_rollback", xid), 0);
  b = open_branch(o, xid, "orders");
  const char *v3[] = {"5", tag, "cr-1"};
  assert_int_equal(sql(b, "UPDATE \"Plain Sql\" SET n = n + $1::int, note = 'changed' WHERE tag = $2 AND \"K\" <> $3",
                       3, v3, &rows), 0);
  assert_int_equal(rows, 2);
  const char *v4[] = {tag};
  assert_int_equal(sql(b, "DELETE FROM other.pair WHERE tag = $1 AND v > 2", 1, v4, &rows), 0);
  assert_int_equal(rows, 1);
  const char *v5[] = {"cr-9", tag};
  assert_int_equal(sql(b, "INSERT INTO \"Plain Sql\" VALUES ($1, 99, NULL, $2)", 2, v5, &rows), 0);
  assert_int_equal(rows, 1);
  /* The undo has one item per row: 2 updates, 1 delete, 1 insert. */
  assert_int_equal(json_array_size(b->undo), 4);
  commit_branch(o, b);
  char *during = rows_of(o, tag);
  assert_string_not_equal(during, first);
  assert_non_null(strstr(during, "changed"));
  assert_int_equal(rm_tm_rollback(client, xid, &st), 0);
  assert_int_equal(st, RM_GS_ROLLBACKED);
  char *after = rows_of(o, tag);
  assert_string_equal(after, first);
  free(first);
  free(during);
  free(after);
}

/* The caller's RETURNING comes back as its own columns; a WHERE that
 * matches nothing changes nothing and records nothing; a read runs as is. */
void test_sql_returning_and_nothing(void **state) {
  (void)state;
  PGconn *o = itest_pg(orders_url);
  sql_tables(o);
  const char *tag = "sql-ret";
  char xid[RM_XID_MAX];
  rm_branch_t *b = begin_and_open(o, "sql_returning", "orders", xid);
  PGresult *res = NULL;
  int64_t rows = 0;
  const char *v1[] = {"ret-1", tag};
  assert_int_equal(rm_at_sql(b, "INSERT INTO \"Plain Sql\" AS r (\"K\", n, tag) VALUES ($1, 4, $2)"
                                " RETURNING r.n * 10 AS tens, \"K\"", 2, NULL, v1, &rows, &res), 0);
  assert_non_null(res);
  assert_int_equal(PQnfields(res), 2);
  assert_string_equal(PQfname(res, 0), "tens");
  assert_string_equal(PQgetvalue(res, 0, 0), "40");
  assert_string_equal(PQgetvalue(res, 0, 1), "ret-1");
  PQclear(res);
  const unsigned int types[] = {23, 25}; /* int4, text */
  const char *v2[] = {"3", tag};
  assert_int_equal(rm_at_sql(b, "UPDATE \"Plain Sql\" SET n = n - $1 WHERE tag = $2 RETURNING n, note", 2, types, v2,
                             &rows, &res), 0);
  assert_int_equal(rows, 1);
  assert_int_equal(PQnfields(res), 2);
  assert_string_equal(PQgetvalue(res, 0, 0), "1");
  assert_true(PQgetisnull(res, 0, 1));
  PQclear(res);
  size_t items = json_array_size(b->undo);
  const char *v3[] = {"no-such-tag"};
  assert_int_equal(rm_at_sql(b, "DELETE FROM \"Plain Sql\" WHERE tag = $1 RETURNING *", 1, NULL, v3, &rows, &res), 0);
  assert_int_equal(rows, 0);
  assert_int_equal(PQntuples(res), 0);
  PQclear(res);
  assert_int_equal(json_array_size(b->undo), items);
  assert_int_equal(rm_at_sql(b, "SELECT n FROM \"Plain Sql\" WHERE tag = $1", 1, NULL, (const char *[]){tag}, &rows,
                             &res), 0);
  assert_int_equal(rows, 1);
  assert_string_equal(PQgetvalue(res, 0, 0), "1");
  PQclear(res);
  assert_int_equal(json_array_size(b->undo), items);
  commit_branch(o, b);
  int st = 0;
  assert_int_equal(rm_tm_rollback(client, xid, &st), 0);
  char *left = rows_of(o, tag);
  assert_string_equal(left, "");
  free(left);
}

/* Refused statements say why, change nothing and leave the caller's
 * transaction usable; so does a statement PostgreSQL itself rejects. */
void test_sql_refused(void **state) {
  (void)state;
  PGconn *o = itest_pg(orders_url);
  sql_tables(o);
  char xid[RM_XID_MAX];
  rm_branch_t *b = begin_and_open(o, "sql_refused", "orders", xid);
  struct {
    const char *sql;
    int rc;
    const char *says;
  } cases[] = {
    {"UPDATE \"Plain Sql\" SET n = 1", RM_E_NOT_SUPPORTED, "without WHERE"},
    {"UPDATE \"Plain Sql\" SET \"K\" = 'z' WHERE n = 1", RM_E_NOT_SUPPORTED, "primary key"},
    {"INSERT INTO \"Plain Sql\" SELECT * FROM \"Plain Sql\"", RM_E_NOT_SUPPORTED, "only INSERT ... VALUES"},
    {"DELETE FROM \"Plain Sql\" USING other.pair WHERE true", RM_E_NOT_SUPPORTED, "USING another table"},
    {"SELECT * FROM \"Plain Sql\" p JOIN other.pair q ON true FOR UPDATE", RM_E_NOT_SUPPORTED, "one table only"},
    {"DROP TABLE \"Plain Sql\"", RM_E_NOT_SUPPORTED, "not an INSERT"},
    {"UPDATE nopk SET b = 'x' WHERE a = 1", RM_E_NO_PK, ""},
    {"UPDATE no_such_table SET b = 'x' WHERE a = 1", RM_E_NO_TABLE, ""},
    {"UPDATE \"Plain Sql\" SET no_such_col = 1 WHERE true", RM_E_INVALID, "no_such_col"},
    {"INSERT INTO \"Plain Sql\" (\"K\", n) VALUES ('r', 'not a number')", RM_E_INVALID, ""},
    {"UPDATE \"Plain Sql\" SET n = 1 WHERE", RM_E_INVALID, "syntax error"},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    int rc = rm_at_sql(b, cases[i].sql, 0, NULL, NULL, NULL, NULL);
    if (rc != cases[i].rc) fail_msg("%s: rc %d not %d: %s", cases[i].sql, rc, cases[i].rc, rm_at_errmsg(b));
    if (!strstr(rm_at_errmsg(b), cases[i].says))
      fail_msg("%s: \"%s\" does not say \"%s\"", cases[i].sql, rm_at_errmsg(b), cases[i].says);
    assert_true(tx_usable(o));
  }
  /* Too few parameters for the statement. */
  assert_int_equal(rm_at_sql(b, "DELETE FROM \"Plain Sql\" WHERE \"K\" = $2", 1, NULL, (const char *[]){"a"}, NULL,
                             NULL), RM_E_INVALID);
  assert_int_equal(json_array_size(b->undo), 0);
  assert_int_equal(b->lock_keys.len, 0);
  assert_true(exec_ok(o, "ROLLBACK"));
  assert_int_equal(rm_at_close(b, false), 0);
  int st = 0;
  assert_int_equal(rm_tm_rollback(client, xid, &st), 0);
}

/* A row a plain-SQL UPDATE changed, changed again outside any global
 * transaction: the rollback finds it dirty and overwrites nothing. */
void test_sql_dirty_write(void **state) {
  (void)state;
  PGconn *o = itest_pg(orders_url);
  sql_tables(o);
  assert_true(exec_ok(o, "INSERT INTO \"Plain Sql\" (\"K\", n, tag) VALUES ('dirty-1', 1, 'sql-dirty')"
                         " ON CONFLICT (\"K\") DO UPDATE SET n = 1"));
  char xid[RM_XID_MAX];
  rm_branch_t *b = begin_and_open(o, "sql_dirty", "orders", xid);
  assert_int_equal(sql(b, "UPDATE \"Plain Sql\" SET n = 2 WHERE \"K\" = 'dirty-1'", 0, NULL, NULL), 0);
  commit_branch(o, b);
  assert_true(exec_ok(o, "UPDATE \"Plain Sql\" SET n = 3 WHERE \"K\" = 'dirty-1'"));
  int st = 0;
  assert_int_equal(rm_tm_rollback(client, xid, &st), RM_E_ROLLBACK_FAILED);
  assert_int_equal(st, RM_GS_ROLLBACK_FAILED);
  assert_int_equal(q_ll(o, "SELECT n FROM \"Plain Sql\" WHERE \"K\" = 'dirty-1'", NULL, NULL, NULL), 3);
}

/* Between the image and the UPDATE: another transaction commits a row
 * that matches the condition. */
static void insert_newcomer(rm_branch_t *b, void *arg) {
  (void)b;
  PGconn *other = arg;
  exec_ok(other, "INSERT INTO \"Plain Sql\" (\"K\", n, tag) VALUES ('race-2', 1, 'sql-race')");
}

/* A row that came to match the condition between the before image and
 * the statement: the UPDATE would change a row it has no image of, so it
 * is undone as a whole (RM_E_NOT_ONE_ROW, the transaction usable, nothing
 * recorded); run again, it takes both rows with their images. */
void test_sql_newcomer_row(void **state) {
  (void)state;
  PGconn *o = itest_pg(orders_url), *other = itest_pg(orders_url);
  sql_tables(o);
  assert_true(exec_ok(o, "DELETE FROM \"Plain Sql\" WHERE tag = 'sql-race'"));
  assert_true(exec_ok(o, "INSERT INTO \"Plain Sql\" (\"K\", n, tag) VALUES ('race-1', 1, 'sql-race')"));
  char xid[RM_XID_MAX];
  rm_branch_t *b = begin_and_open(o, "sql_race", "orders", xid);
  rm__at_failpoint_arg = other;
  rm__at_sql_after_image = insert_newcomer;
  int64_t rows = -1;
  int rc = rm_at_sql(b, "UPDATE \"Plain Sql\" SET n = 5 WHERE tag = 'sql-race'", 0, NULL, NULL, &rows, NULL);
  rm__at_sql_after_image = NULL;
  rm__at_failpoint_arg = NULL;
  assert_int_equal(rc, RM_E_NOT_ONE_ROW);
  assert_non_null(strstr(rm_at_errmsg(b), "came to match"));
  assert_true(tx_usable(o));
  assert_int_equal(json_array_size(b->undo), 0);
  assert_int_equal(q_ll(o, "SELECT sum(n) FROM \"Plain Sql\" WHERE tag = 'sql-race'", NULL, NULL, NULL), 2);
  assert_int_equal(sql(b, "UPDATE \"Plain Sql\" SET n = 5 WHERE tag = 'sql-race'", 0, NULL, &rows), 0);
  assert_int_equal(rows, 2);
  assert_int_equal(json_array_size(b->undo), 2);
  commit_branch(o, b);
  int st = 0;
  assert_int_equal(rm_tm_rollback(client, xid, &st), 0);
  assert_int_equal(q_ll(o, "SELECT sum(n) FROM \"Plain Sql\" WHERE tag = 'sql-race'", NULL, NULL, NULL), 2);
}

typedef struct prepare_arg {
  rm_branch_t *b;
  int rc;
} prepare_arg_t;

static void *prepare_thread(void *arg) {
  prepare_arg_t *p = arg;
  int64_t bid = 0;
  p->rc = rm_at_prepare(p->b, &bid);
  return NULL;
}

/* Two global transactions updating the same row through plain SQL: the
 * second one's prepare waits in the coordinator's lock queue while the
 * first holds the row's global lock, and goes on when it commits. */
void test_sql_global_lock(void **state) {
  (void)state;
  PGconn *o = itest_pg(orders_url), *o2 = itest_pg(orders_url);
  sql_tables(o);
  assert_true(exec_ok(o, "INSERT INTO \"Plain Sql\" (\"K\", n, tag) VALUES ('lock-1', 1, 'sql-lock')"
                         " ON CONFLICT (\"K\") DO UPDATE SET n = 1"));
  char x1[RM_XID_MAX], x2[RM_XID_MAX];
  rm_branch_t *b = begin_and_open(o, "sql_lock_1", "orders", x1);
  assert_int_equal(sql(b, "UPDATE \"Plain Sql\" SET n = n + 1 WHERE \"K\" = 'lock-1'", 0, NULL, NULL), 0);
  commit_branch(o, b);
  assert_int_equal(rm_tm_begin(client, 30000, "sql_lock_2", x2), 0);
  prepare_arg_t pa = {.b = open_branch(o2, x2, "orders"), .rc = 1};
  assert_int_equal(sql(pa.b, "UPDATE \"Plain Sql\" SET n = n + 10 WHERE \"K\" = 'lock-1'", 0, NULL, NULL), 0);
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, prepare_thread, &pa), 0);
  sleep_ms(300);
  int st = 0;
  assert_int_equal(rm_tm_commit(client, x1, &st), 0); /* releases the lock x2 waits for */
  pthread_join(th, NULL);
  if (pa.rc != 0) fail_msg("the waiting prepare: %d %s", pa.rc, rm_at_errmsg(pa.b));
  assert_true(exec_ok(o2, "COMMIT"));
  assert_int_equal(rm_at_close(pa.b, true), 0);
  assert_int_equal(rm_tm_commit(client, x2, &st), 0);
  assert_int_equal(q_ll(o, "SELECT n FROM \"Plain Sql\" WHERE \"K\" = 'lock-1'", NULL, NULL, NULL), 12);
}

/* ------------------------------------------------- SELECT ... FOR UPDATE */

typedef struct select_arg {
  PGconn *pg;
  char xid[RM_XID_MAX];
  int rc;
  long long n;
  double secs;
  char err[512];
} select_arg_t;

/* In a branch of its own global transaction: SELECT n ... FOR UPDATE of
 * 'lock-sfu', timed. */
static void *select_thread(void *arg) {
  select_arg_t *a = arg;
  double t0 = now_s();
  a->rc = -1;
  if (!exec_ok(a->pg, "BEGIN")) return NULL;
  rm_branch_t *b = NULL;
  if ((a->rc = rm_at_open(client, a->xid, "orders", a->pg, &b)) != 0) return NULL;
  PGresult *res = NULL;
  int64_t rows = 0;
  a->rc = rm_at_sql(b, "SELECT n FROM \"Plain Sql\" WHERE \"K\" = $1 FOR UPDATE", 1, NULL,
                    (const char *[]){"lock-sfu"}, &rows, &res);
  a->secs = now_s() - t0;
  snprintf(a->err, sizeof(a->err), "%s", a->rc ? rm_at_errmsg(b) : "");
  a->n = a->rc == 0 && rows == 1 ? atoll(PQgetvalue(res, 0, 0)) : -1;
  PQclear(res);
  a->rc = a->rc ? a->rc : tx_usable(a->pg) ? 0 : -2;
  exec_ok(a->pg, "ROLLBACK");
  rm_at_close(b, false);
  return NULL;
}

/* x1 sets the row's n to 'value' in a committed branch: it holds the row's
 * global lock until it ends. */
static void hold_row(PGconn *o, char *x1, int value) {
  assert_true(exec_ok(o, "INSERT INTO \"Plain Sql\" (\"K\", n, tag) VALUES ('lock-sfu', 1, 'sql-sfu')"
                         " ON CONFLICT (\"K\") DO UPDATE SET n = 1"));
  rm_branch_t *b = begin_and_open(o, "sql_sfu_holder", "orders", x1);
  char v[16];
  snprintf(v, sizeof(v), "%d", value);
  assert_int_equal(sql(b, "UPDATE \"Plain Sql\" SET n = $1::int WHERE \"K\" = 'lock-sfu'", 1, (const char *[]){v}, NULL), 0);
  commit_branch(o, b);
}

/* A SELECT ... FOR UPDATE of a row another global transaction holds waits
 * in the coordinator's queue (its local row lock let go meanwhile) and
 * gets the row when the holder commits: the committed value.  When the
 * holder rolls back instead, its rollback is not blocked by the reader
 * and the reader gets the row as it was. */
void test_sql_select_for_update(void **state) {
  (void)state;
  PGconn *o = itest_pg(orders_url), *o2 = itest_pg(orders_url);
  sql_tables(o);
  for (int round = 0; round < 2; round++) {
    bool commit = round == 0;
    char x1[RM_XID_MAX];
    hold_row(o, x1, commit ? 50 : 60);
    select_arg_t a = {.pg = o2};
    assert_int_equal(rm_tm_begin(client, 30000, "sql_sfu_reader", a.xid), 0);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, select_thread, &a), 0);
    sleep_ms(400);
    int st = 0;
    if (commit) assert_int_equal(rm_tm_commit(client, x1, &st), 0);
    else assert_int_equal(rm_tm_rollback(client, x1, &st), 0);
    pthread_join(th, NULL);
    if (a.rc != 0) fail_msg("the waiting SELECT: %d %s", a.rc, a.err);
    assert_int_equal(a.n, commit ? 50 : 1);
    assert_true(a.secs >= 0.3);
    assert_int_equal(rm_tm_rollback(client, a.xid, &st), 0);
  }
}

/* The holder does not end within the client's lock wait (2 s here): the
 * SELECT gives up with RM_E_LOCK_WAIT_TIMEOUT naming the holder, the
 * reader's transaction usable; a row of its own global transaction does
 * not wait at all. */
void test_sql_select_for_update_timeout(void **state) {
  (void)state;
  PGconn *o = itest_pg(orders_url), *o2 = itest_pg(orders_url);
  sql_tables(o);
  char x1[RM_XID_MAX];
  hold_row(o, x1, 70);
  select_arg_t a = {.pg = o2};
  assert_int_equal(rm_tm_begin(client, 30000, "sql_sfu_timeout", a.xid), 0);
  select_thread(&a);
  assert_int_equal(a.rc, RM_E_LOCK_WAIT_TIMEOUT);
  assert_non_null(strstr(a.err, x1));
  assert_true(a.secs >= 1.5);
  int st = 0;
  assert_int_equal(rm_tm_rollback(client, a.xid, &st), 0);
  /* the holder's own transaction reads it at once */
  select_arg_t own = {.pg = o2};
  snprintf(own.xid, sizeof(own.xid), "%s", x1);
  select_thread(&own);
  if (own.rc != 0) fail_msg("own SELECT: %d %s", own.rc, own.err);
  assert_int_equal(own.n, 70);
  assert_true(own.secs < 1.5);
  /* The coordinator bounds the wait it is asked for (lock_wait_max_ms). */
  bool lockable = true;
  char holder[RM_XID_MAX], err[512];
  assert_int_equal(rm__lock_query(client, a.xid, "orders", "\"Plain Sql\":lock-sfu", 3600u * 1000u, &lockable, holder,
                                  sizeof(holder), err, sizeof(err)),
                   RM_E_BAD_REQUEST);
  assert_non_null(strstr(err, "above the limit"));
  assert_false(lockable);
  assert_int_equal(rm_tm_commit(client, x1, &st), 0);
}

/* ------------------------------------------------------- hot counters */

#define HOT_TAKE                                                                                        \
  "UPDATE activity_ticket_bucket SET frozen_count = frozen_count + $4::int WHERE activity_id = $1"     \
  " AND ticket_type = $2 AND bucket_id = $3 AND stock - frozen_count - sold_count >= $4::int"
#define HOT_GIVE                                                                                        \
  "UPDATE activity_ticket_bucket SET frozen_count = frozen_count - $4::int WHERE activity_id = $1"     \
  " AND ticket_type = $2 AND bucket_id = $3"

static long long frozen14(PGconn *s) {
  return q_ll(s, "SELECT frozen_count FROM activity_ticket_bucket WHERE activity_id = 1 AND ticket_type = 1"
                 " AND bucket_id = 14", NULL, NULL, NULL);
}

/* A branch on the stock database running one statement with 'qty';
 * prepared and committed locally when 'commit'. */
static int hot_branch(PGconn *s, const char *xid, const char *stmt, const char *qty, bool commit, rm_branch_t **out) {
  rm_branch_t *b = open_branch(s, xid, "stock");
  int64_t rows = 0;
  const char *v[4] = {"1", "1", "14", qty};
  int rc = rm_at_sql(b, stmt, 4, NULL, v, &rows, NULL);
  if (rc == 0) assert_int_equal(rows, 1);
  *out = b;
  if (rc != 0 || !commit) return rc;
  int64_t bid = 0;
  rc = rm_at_prepare(b, &bid);
  if (rc == 0) assert_true(exec_ok(s, "COMMIT"));
  else exec_ok(s, "ROLLBACK");
  rm_at_close(b, rc == 0);
  return rc;
}

/* A declared hot counter (rm_at_hot_column): the plain UPDATE that takes
 * is a deferred delta (no global lock, the caller's own statement and
 * guard run in prepare; a rollback gives it back); one that gives back is
 * applied by the commit, and refused with a guard; a statement that does
 * not name the whole key goes through images. */
void test_sql_hot_counter(void **state) {
  (void)state;
  assert_int_equal(rm_at_hot_column(client, "stock", "activity_ticket_bucket", "frozen_count"), 0);
  assert_int_equal(rm_at_hot_column(client, "no-such-resource", "t", "c"), RM_E_INVALID);
  assert_int_equal(rm_at_hot_column(client, "stock", ".t", "c"), RM_E_INVALID);
  PGconn *s = itest_pg(stock_url);
  long long f0 = frozen14(s);
  char xid[RM_XID_MAX];
  int st = 0;

  /* takes 3: nothing moves before prepare, no lock key; rolled back after */
  assert_int_equal(rm_tm_begin(client, 30000, "sql_hot_take", xid), 0);
  rm_branch_t *b = NULL;
  assert_int_equal(hot_branch(s, xid, HOT_TAKE, "3", false, &b), 0);
  assert_int_equal(b->ndeferred, 1);
  assert_int_equal(b->lock_keys.len, 0);
  assert_int_equal(frozen14(s), f0);
  int64_t bid = 0;
  bool committed = false;
  assert_int_equal(rm_at_prepare_commit(b, &bid, &committed), 0);
  assert_true(committed);
  rm_at_close(b, true);
  assert_int_equal(frozen14(s), f0 + 3);
  assert_int_equal(rm_tm_rollback(client, xid, &st), 0);
  assert_int_equal(frozen14(s), f0);

  /* the guard (the caller's own condition) refuses in prepare */
  assert_int_equal(rm_tm_begin(client, 30000, "sql_hot_guard", xid), 0);
  assert_int_equal(hot_branch(s, xid, HOT_TAKE, "100000", true, &b), RM_E_GUARD);
  assert_int_equal(rm_tm_rollback(client, xid, &st), 0);
  assert_int_equal(frozen14(s), f0);

  /* gives back 2 (after taking 5 in a committed global): at the commit */
  assert_int_equal(rm_tm_begin(client, 30000, "sql_hot_take5", xid), 0);
  assert_int_equal(hot_branch(s, xid, HOT_TAKE, "5", true, &b), 0);
  assert_int_equal(rm_tm_commit(client, xid, &st), 0);
  assert_int_equal(frozen14(s), f0 + 5);
  assert_int_equal(rm_tm_begin(client, 30000, "sql_hot_give", xid), 0);
  assert_int_equal(hot_branch(s, xid, HOT_GIVE, "2", false, &b), 0);
  assert_int_equal(b->ndeferred, 0);
  assert_int_equal(b->lock_keys.len, 0);
  assert_int_equal(rm_at_prepare(b, &bid), 0);
  assert_true(exec_ok(s, "COMMIT"));
  rm_at_close(b, true);
  assert_int_equal(frozen14(s), f0 + 5); /* not before the commit */
  assert_int_equal(rm_tm_commit(client, xid, &st), 0);
  assert_int_equal(WAIT_EQ(f0 + 3, 10, frozen14(s)), f0 + 3);

  /* a give-back with a condition beyond the key is refused */
  assert_int_equal(rm_tm_begin(client, 30000, "sql_hot_give_guard", xid), 0);
  assert_int_equal(hot_branch(s, xid, HOT_GIVE " AND frozen_count >= $4::int", "1", false, &b), RM_E_INVALID);
  assert_non_null(strstr(rm_at_errmsg(b), "gives capacity back"));
  assert_true(tx_usable(s));
  /* not the whole key: through images, under the row's global lock */
  const char *v[3] = {"1", "14", "1"};
  int64_t rows = 0;
  assert_int_equal(rm_at_sql(b, "UPDATE activity_ticket_bucket SET frozen_count = frozen_count + $3::int"
                                " WHERE activity_id = $1 AND bucket_id = $2", 3, NULL, v, &rows, NULL), 0);
  assert_int_equal(rows, 1);
  assert_true(b->lock_keys.len > 0);
  assert_int_equal(b->ndeferred, 0);
  assert_true(exec_ok(s, "ROLLBACK"));
  rm_at_close(b, false);
  assert_int_equal(rm_tm_rollback(client, xid, &st), 0);
  assert_int_equal(frozen14(s), f0 + 3);
}
