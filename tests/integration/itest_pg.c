/* itest_pg.c - see itest_pg.h. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "itest_pg.h"
#include "rm_itest.h"

/* The running case's connections; a case needs a handful at the most. */
static PGconn *case_conns[8];
static int case_conn_count;

PGconn *itest_pg(const char *url) {
  assert_true(case_conn_count < (int)(sizeof(case_conns) / sizeof(case_conns[0])));
  PGconn *pg = pg_open(url);
  assert_non_null(pg);
  case_conns[case_conn_count++] = pg;
  return pg;
}

int itest_pg_close_all(void **state) {
  (void)state;
  while (case_conn_count > 0) PQfinish(case_conns[--case_conn_count]);
  return 0;
}

void itest_fresh_database(const char *admin_url, const char *like_url, const char *name, char *url, size_t cap) {
  char sql[160];
  PGconn *admin = itest_pg(admin_url);
  snprintf(sql, sizeof(sql), "DROP DATABASE IF EXISTS %s", name);
  assert_true(exec_ok(admin, sql));
  snprintf(sql, sizeof(sql), "CREATE DATABASE %s", name);
  assert_true(exec_ok(admin, sql));
  snprintf(url, cap, "%s", like_url);
  char *slash = strrchr(url, '/');
  assert_non_null(slash);
  const char *options = strchr(like_url + (slash - url), '?');
  snprintf(slash, cap - (size_t)(slash - url), "/%s%s", name, options ? options : "");
}
