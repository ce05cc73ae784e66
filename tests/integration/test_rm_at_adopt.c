/*
 * test_rm_at_adopt.c - what a first program meets (issue 21), in the
 * program and fixture of test_rm_at.c (rm_at_fixture.h): rm_resource_add
 * refusing a database without the RM schema (or with an old one), a
 * rollback that cannot finish (a database whose undo_log went away)
 * answered RM_E_ROLLBACK_PENDING until it can, a commit whose give-back
 * is refused answered RM_E_COMMIT_FAILED, rm_at_update_add (a debit
 * of 10.50 in one call, its guard, its undo), and rm_errmsg() for calls
 * that have no branch to hold a message.
 *
 * NOTES
 *   The databases are the fixture's "orders" one; each test works in a
 *   schema of its own (rmt_*), reached through the conninfo's options
 *   (search_path), so that the shared public.undo_log is never touched.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rm_at_fixture.h"

/* 'orders_url' with search_path set to 'schema' (the URL has no query). */
static void url_with_path(char *out, size_t cap, const char *schema) {
  snprintf(out, cap, "%s%coptions=-csearch_path%%3D%s", orders_url, strchr(orders_url, '?') ? '&' : '?', schema);
}

static bool has(const char *hay, const char *needle) {
  if (!strstr(hay, needle)) {
    print_message("  \"%s\" not in \"%s\"\n", needle, hay);
    return false;
  }
  return true;
}

/* A schema 'name' with an undo_log like the real one and an account table
 * with row 1 at 100.00. */
static void make_rm_schema(PGconn *o, const char *name) {
  char sql[1024];
  snprintf(sql, sizeof(sql),
           "DROP SCHEMA IF EXISTS %s CASCADE; CREATE SCHEMA %s;"
           " CREATE TABLE %s.undo_log (LIKE public.undo_log INCLUDING ALL);"
           " CREATE TABLE %s.acct (id int PRIMARY KEY, balance numeric(12,2) NOT NULL);"
           " INSERT INTO %s.acct VALUES (1, 100.00)",
           name, name, name, name, name);
  assert_true(exec_ok(o, sql));
}

/* Schema 'name' (its URL from url_with_path) added to the client as a
 * resource of that name, which must succeed, the registration with it
 * given the time to reach the node; 'o' then works in it (search_path). */
static void serve_schema(PGconn *o, const char *name) {
  char url[1024];
  url_with_path(url, sizeof(url), name);
  assert_int_equal(rm_resource_add(client, name, url), 0);
  sleep_ms(200); /* the RM registration with the new resource reaches the node */
  char sql[128];
  snprintf(sql, sizeof(sql), "SET search_path = %s", name);
  assert_true(exec_ok(o, sql));
}

/* A connection of the running case working in a new schema 'name'
 * (make_rm_schema) that the client serves (serve_schema). */
static PGconn *open_in_new_schema(const char *name) {
  PGconn *o = itest_pg(orders_url);
  make_rm_schema(o, name);
  serve_schema(o, name);
  return o;
}

static char *balance(PGconn *o, const char *schema) {
  char sql[256];
  snprintf(sql, sizeof(sql), "SELECT balance FROM %s.acct WHERE id = 1", schema);
  PGresult *r = PQexec(o, sql);
  char *v = PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1 ? strdup(PQgetvalue(r, 0, 0)) : NULL;
  PQclear(r);
  return v;
}

static void assert_balance(PGconn *o, const char *schema, const char *want) {
  char *v = balance(o, schema);
  assert_non_null(v);
  assert_string_equal(v, want);
  free(v);
}

/* rm_resource_add connects and refuses a database without the RM schema,
 * or with one older than the library needs, naming the command to run;
 * an unreachable database fails at once too. */
void test_resource_needs_undo_log(void **state) {
  (void)state;
  PGconn *o = itest_pg(orders_url);
  assert_true(exec_ok(o, "DROP SCHEMA IF EXISTS rmt_empty CASCADE; CREATE SCHEMA rmt_empty"));
  char url[1024];
  url_with_path(url, sizeof(url), "rmt_empty");
  assert_int_equal(rm_resource_add(client, "no_undo", url), RM_E_NO_TABLE);
  assert_true(has(rm_errmsg(), "resource \"no_undo\""));
  assert_true(has(rm_errmsg(), "no undo_log table"));
  assert_true(has(rm_errmsg(), "txc-db-migrate 'CONNINFO' rm"));
  /* Not added: a branch on it is refused, with the reason. */
  char xid[RM_XID_MAX];
  assert_int_equal(rm_tm_begin(client, 30000, "no_undo", xid), 0);
  assert_true(exec_ok(o, "BEGIN"));
  rm_branch_t *b = NULL;
  assert_int_equal(rm_at_open(client, xid, "no_undo", o, &b), RM_E_INVALID);
  assert_true(has(rm_errmsg(), "resource \"no_undo\" was not added"));
  assert_true(exec_ok(o, "ROLLBACK"));

  /* An undo_log that db-migrate recorded at version 0 (older than 1). */
  make_rm_schema(o, "rmt_old");
  assert_true(exec_ok(o, "CREATE TABLE rmt_old.schema_version (LIKE public.schema_version INCLUDING ALL);"
                         " INSERT INTO rmt_old.schema_version (set_name, version, filename, checksum)"
                         " VALUES ('rm', 0, '000_old.sql', 'x')"));
  url_with_path(url, sizeof(url), "rmt_old");
  assert_int_equal(rm_resource_add(client, "old_undo", url), RM_E_NOT_SUPPORTED);
  assert_true(has(rm_errmsg(), "at version 0"));
  assert_true(has(rm_errmsg(), "txc-db-migrate"));
  /* An undo_log made by hand without a column the library writes. */
  assert_true(exec_ok(o, "DROP TABLE rmt_old.schema_version; ALTER TABLE rmt_old.undo_log DROP COLUMN context"));
  assert_int_equal(rm_resource_add(client, "old_undo", url), RM_E_NOT_SUPPORTED);
  assert_true(has(rm_errmsg(), "not the one this library writes"));
  /* A database nobody serves: RM_E_DB, with libpq's reason. */
  assert_int_equal(rm_resource_add(client, "nowhere", "host=127.0.0.1 port=1 dbname=x connect_timeout=2"),
                   RM_E_DB);
  assert_true(has(rm_errmsg(), "could not connect"));
  /* The real one (made by hand, all columns, no schema_version): fine. */
  make_rm_schema(o, "rmt_hand");
  url_with_path(url, sizeof(url), "rmt_hand");
  assert_int_equal(rm_resource_add(client, "hand_undo", url), 0);
  assert_true(exec_ok(o, "DROP SCHEMA rmt_empty CASCADE; DROP SCHEMA rmt_old CASCADE"));
}

/* The branch that debits 'amount' from acct 1 in 'schema' (resource 'res'). */
typedef struct debit_arg {
  const char *amount;
  int rc;
} debit_arg_t;

static int body_debit(rm_branch_t *b, void *arg) {
  debit_arg_t *d = arg;
  const char *pk[1] = {"1"};
  d->rc = rm_at_update_add(b, "acct", pk, "balance", d->amount, "balance + $1 >= 0");
  return d->rc;
}

static int debit_branch(PGconn *o, const char *xid, const char *res, const char *amount) {
  debit_arg_t d = {amount, 0};
  int64_t bid = 0;
  return run_branch(o, xid, res, body_debit, &d, &bid);
}

/* rm_at_update_add: a numeric debit in one call; commit keeps it, rollback
 * restores the before image; a guard that refuses leaves the row and the
 * transaction as they were, and says the value it saw. */
void test_update_add(void **state) {
  (void)state;
  PGconn *o = open_in_new_schema("rmt_add");

  char xid[RM_XID_MAX];
  int st = 0;
  assert_int_equal(rm_tm_begin(client, 30000, "add_commit", xid), 0);
  assert_int_equal(debit_branch(o, xid, "rmt_add", "-10.50"), 0);
  assert_int_equal(rm_tm_commit(client, xid, &st), 0);
  assert_balance(o, "rmt_add", "89.50");

  assert_int_equal(rm_tm_begin(client, 30000, "add_rollback", xid), 0);
  assert_int_equal(debit_branch(o, xid, "rmt_add", "-80"), 0);
  assert_balance(o, "rmt_add", "9.50");
  assert_int_equal(rm_tm_rollback(client, xid, &st), 0);
  assert_int_equal(st, RM_GS_ROLLBACKED);
  assert_balance(o, "rmt_add", "89.50");

  /* The guard refuses an overdraft: nothing changed, transaction usable. */
  rm_branch_t *b = begin_and_open(o, "add_guard", "rmt_add", xid);
  const char *pk[1] = {"1"};
  assert_int_equal(rm_at_update_add(b, "acct", pk, "balance", "-100.00", "balance + $1 >= 0"), RM_E_GUARD);
  assert_true(has(rm_at_errmsg(b), "refused"));
  assert_true(has(rm_at_errmsg(b), "89.50"));
  assert_string_equal(rm_errmsg(), rm_at_errmsg(b));
  assert_true(tx_usable(o));
  /* Not a number, not a numeric column. */
  assert_int_equal(rm_at_update_add(b, "acct", pk, "balance", "ten", NULL), RM_E_INVALID);
  assert_true(tx_usable(o));
  assert_int_equal(rm_at_update_add(b, "acct", pk, "id", "1", NULL), RM_E_NOT_SUPPORTED);
  assert_int_equal(rm_at_update_add(b, "acct", pk, "balance", NULL, NULL), RM_E_INVALID);
  assert_int_equal(rm_at_update_add(b, "acct", pk, "balance", "1.25", NULL), 0);
  assert_true(exec_ok(o, "ROLLBACK"));
  rm_at_close(b, false);
  assert_int_equal(rm_tm_rollback(client, xid, &st), 0);
  assert_balance(o, "rmt_add", "89.50");
  assert_true(exec_ok(o, "RESET search_path"));
}

/* A rollback whose undo cannot run (the database's undo_log went away
 * after the branch committed locally): RM_E_ROLLBACK_PENDING with the
 * retrying status and a message naming why, not 0; once the table is
 * back the coordinator's retry finishes it and the row is restored. */
void test_rollback_pending(void **state) {
  (void)state;
  PGconn *o = open_in_new_schema("rmt_gone");
  char xid[RM_XID_MAX];
  assert_int_equal(rm_tm_begin(client, 30000, "rollback_pending", xid), 0);
  assert_int_equal(debit_branch(o, xid, "rmt_gone", "-10.50"), 0);
  assert_true(exec_ok(o, "ALTER TABLE rmt_gone.undo_log RENAME TO undo_away"));
  int st = 0;
  assert_int_equal(rm_tm_rollback(client, xid, &st), RM_E_ROLLBACK_PENDING);
  assert_true(st == RM_GS_ROLLBACK_RETRYING || st == RM_GS_ROLLBACKING);
  assert_true(has(rm_errmsg(), xid));
  assert_true(has(rm_errmsg(), "not finished"));
  assert_balance(o, "rmt_gone", "89.50");
  /* Asking again while it cannot finish: the same answer. */
  assert_int_equal(rm_tm_rollback(client, xid, &st), RM_E_ROLLBACK_PENDING);
  assert_true(exec_ok(o, "ALTER TABLE rmt_gone.undo_away RENAME TO undo_log"));
  assert_int_equal(WAIT_EQ(RM_GS_ROLLBACKED, 20, global_status(xid)), RM_GS_ROLLBACKED);
  assert_balance(o, "rmt_gone", "100.00");
  assert_int_equal(rm_tm_rollback(client, xid, &st), 0);
  assert_int_equal(st, RM_GS_ROLLBACKED);
  assert_true(exec_ok(o, "RESET search_path"));
}

/* Calls that fail before a branch exists leave their reason in
 * rm_errmsg(); TM calls leave the coordinator's. */
void test_errmsg(void **state) {
  (void)state;
  PGconn *o = itest_pg(orders_url);
  char xid[RM_XID_MAX];
  rm_branch_t *b = NULL;
  assert_int_equal(rm_tm_begin(client, 30000, "errmsg", xid), 0);
  assert_true(exec_ok(o, "BEGIN"));
  PQclear(PQexec(o, "SELECT 1 / 0"));
  assert_int_equal(rm_at_open(client, xid, "orders", o, &b), RM_E_STATE);
  assert_true(has(rm_errmsg(), "not in a failed or busy transaction"));
  assert_true(exec_ok(o, "ROLLBACK"));
  assert_int_equal(rm_at_open(client, "", "orders", o, &b), RM_E_INVALID);
  assert_true(has(rm_errmsg(), "xid is empty"));
  int st = 0;
  char other[RM_XID_MAX + 8], want[RM_XID_MAX + 64];
  snprintf(other, sizeof(other), "%s999", xid); /* on the same node, never begun */
  assert_int_equal(rm_tm_commit(client, other, &st), RM_E_GLOBAL_NOT_FOUND);
  snprintf(want, sizeof(want), "could not commit global transaction \"%s\"", other);
  assert_true(has(rm_errmsg(), want));
  assert_true(has(rm_errmsg(), "not found"));
  assert_int_equal(rm_tm_rollback(client, xid, &st), 0);
  assert_int_equal(rm_tm_commit(client, xid, &st), RM_E_GLOBAL_NOT_ACTIVE);
  assert_true(has(rm_errmsg(), "status Rollbacked"));
  rm_config_t cfg = {.nodes = "nowhere", .token = "t", .application_id = "a"};
  rm_client_t *c = NULL;
  assert_int_equal(rm_client_new(&cfg, &c), RM_E_INVALID);
  assert_true(has(rm_errmsg(), "invalid nodes \"nowhere\""));
  cfg.nodes = "127.0.0.1:1";
  cfg.token = NULL;
  assert_int_equal(rm_client_new(&cfg, &c), RM_E_INVALID);
  assert_true(has(rm_errmsg(), "token"));
}

/* A commit whose phase two fails for good (a give-back refused by a
 * constraint after an outside write): RM_E_COMMIT_FAILED with status
 * CommitFailed, not 0. */
void test_commit_failed(void **state) {
  (void)state;
  PGconn *o = itest_pg(orders_url);
  assert_true(exec_ok(o, "DROP SCHEMA IF EXISTS rmt_cf CASCADE; CREATE SCHEMA rmt_cf;"
                         " CREATE TABLE rmt_cf.undo_log (LIKE public.undo_log INCLUDING ALL);"
                         " CREATE TABLE rmt_cf.cnt (id int PRIMARY KEY, frozen int NOT NULL CHECK (frozen >= 0));"
                         " INSERT INTO rmt_cf.cnt VALUES (1, 5)"));
  serve_schema(o, "rmt_cf");
  char xid[RM_XID_MAX];
  rm_branch_t *b = begin_and_open(o, "commit_failed", "rmt_cf", xid);
  const char *pk[1] = {"1"};
  assert_int_equal(rm_at_update_delta_on_commit(b, "cnt", pk, "frozen", -3), 0);
  assert_int_equal(rm_at_prepare(b, NULL), 0);
  assert_true(exec_ok(o, "COMMIT"));
  rm_at_close(b, true);
  assert_true(exec_ok(o, "UPDATE rmt_cf.cnt SET frozen = 1 WHERE id = 1")); /* the outside write */
  int st = 0;
  assert_int_equal(rm_tm_commit(client, xid, &st), RM_E_COMMIT_FAILED);
  assert_int_equal(st, RM_GS_COMMIT_FAILED);
  assert_true(has(rm_errmsg(), "committed, but"));
  assert_true(has(rm_errmsg(), xid));
  assert_int_equal(q_ll(o, "SELECT frozen FROM rmt_cf.cnt WHERE id = 1", NULL, NULL, NULL), 1);
  assert_true(exec_ok(o, "RESET search_path"));
}
