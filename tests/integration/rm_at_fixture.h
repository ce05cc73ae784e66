/*
 * rm_at_fixture.h - what the AT resource manager's tests share: the
 * fixture of test_rm_at.c (one tcd, one rm_client_t serving "orders" and
 * "stock", set up once for the group) and its helpers, used by the
 * statement tests in test_rm_at_stmt.c, which run in the same program.
 */
#ifndef RM_AT_FIXTURE_H
#define RM_AT_FIXTURE_H

#include <libpq-fe.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "itest_pg.h"
#include "rm_at_int.h"
#include "rm_client.h"
#include "rm_itest.h"
#include "tcd_proc.h"

#define TOKEN "rm-at-test-token"
#define ACTIVITY "1"
#define TICKET "1"
#define GUARD "stock - frozen_count - sold_count >= $1"

extern const char *orders_url, *stock_url, *tc_url;
extern tcd_proc_t tcd;
extern rm_client_t *client;
extern atomic_llong next_order;

/* First value of a query with up to 3 text parameters, as a long long;
 * LLONG_MIN if no row or NULL, LLONG_MIN + 1 on error. */
long long q_ll(PGconn *pg, const char *sql, const char *p1, const char *p2, const char *p3);
long long order_exists(PGconn *pg, long long id);
/* Whether the caller's transaction is still open and takes statements. */
bool tx_usable(PGconn *pg);
/* Insert an order of the demo schema through 'b'. */
int insert_order(rm_branch_t *b, long long id, int user, int qty, int bucket, const char *xid);

/* A branch of global 'xid' on 'resource' opened in a new local
 * transaction of 'pg' (BEGIN), which must succeed. */
rm_branch_t *open_branch(PGconn *pg, const char *xid, const char *resource);
/* The same in a global begun for it ('name', 30 s; its xid in 'xid',
 * RM_XID_MAX). */
rm_branch_t *begin_and_open(PGconn *pg, const char *name, const char *resource, char *xid);

/* Phase two ('commit' or not) of AT branch 'bid' of 'xid' on 'resource'
 * delivered straight to the client's RM, as the TC would: the branch
 * status it answers; its error code and message in 'reply'. */
typedef struct phase2_reply {
  int code;
  char msg[1024];
} phase2_reply_t;
int deliver_phase2(bool commit, const char *xid, int64_t bid, const char *resource, phase2_reply_t *reply);

/* One complete local branch: BEGIN, 'body', prepare, COMMIT, close.
 * Returns 0 or the first failing code; *bid gets the branch id. */
typedef int (*body_fn)(rm_branch_t *b, void *arg);
int run_branch(PGconn *pg, const char *xid, const char *resource, body_fn body, void *arg, int64_t *bid);
/* The global status of 'xid' from the TC, or the rm_tm_status code. */
int global_status(const char *xid);

/* activity_ticket_bucket's primary key of 'bucket' (ACTIVITY, TICKET,
 * bucket) as the rm_at calls take it; 'pk' points into 'text'. */
typedef struct bucket_key {
  char text[16];
  const char *pk[3];
} bucket_key_t;
void bucket_key(bucket_key_t *k, int bucket);

/* A delta update of a bucket's frozen_count through 'b' (body_delta). */
typedef struct delta_arg {
  int bucket;
  long long delta;
} delta_arg_t;
int body_delta(rm_branch_t *b, void *arg);

/* test_rm_at_stmt.c */
void test_bad_input(void **state);
void test_sql_commit_rollback(void **state);
void test_sql_returning_and_nothing(void **state);
void test_sql_refused(void **state);
void test_sql_dirty_write(void **state);
void test_sql_global_lock(void **state);
void test_sql_newcomer_row(void **state);
void test_sql_select_for_update(void **state);
void test_sql_select_for_update_timeout(void **state);
void test_sql_hot_counter(void **state);
void test_schema_change(void **state);
void test_prepared_statements(void **state);
void test_insert_fails_late(void **state);
void test_open_idle(void **state);
void test_begin_open(void **state);
void test_register_early(void **state);
void test_rehearsal(void **state);

/* test_rm_at_adopt.c */
void test_resource_needs_undo_log(void **state);
void test_update_add(void **state);
void test_rollback_pending(void **state);
void test_errmsg(void **state);
void test_commit_failed(void **state);

/* test_rm_at_giveback.c */
void test_giveback_refused_in_phase_one(void **state);
void test_release_waits_for_commit(void **state);
void test_release_rolled_back_after_tm_death(void **state);
void test_move_on_commit_by_the_deleter(void **state);
void test_commit_delta_leftover(void **state);
void test_undo_refused_by_constraint(void **state);

#endif
