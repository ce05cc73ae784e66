/*
 * test_tc_pg.c - integration tests for tc_pg (the libpq pool on libuv),
 * against a real PostgreSQL.
 *
 * NOTES
 *   The server comes from the environment: TC_PG_URL (set by
 *   scripts/with-servers --pg).  Without it every test that needs a server
 *   is skipped.  Each test owns its own uv_loop_t, pool and tables, drives
 *   everything with uv_run, counts callbacks, closes the pool and checks
 *   that uv_loop_close() succeeds, i.e. that no handle or request leaked.
 *
 *   Waiting is always event driven: the next step starts from a job
 *   callback, an on_state callback or a uv timer, never from sleep().  A
 *   watchdog timer (unreferenced, so it never keeps a loop alive) fails a
 *   test that hangs.
 *
 *   Thread: single-threaded; everything runs on the test's loop.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tc_pg.h"

#define WATCHDOG_MS 90000
#define NCONC 1000
#define BIG_PARAM (24 * 1024 * 1024)
#define BIG_PARAM_STR "25165824"
#define BIG_NSTMTS 2000

/* ---- fixture ---- */

/* The pool's codes (0, TC_PG_ESTMT ... TC_PG_ECLOSING) as indexes 0..5. */
#define STATUS_SLOT(st) ((st) == TC_PG_OK ? 0 : TC_PG_ESTMT - (st) + 1)

typedef struct ctx {
  uv_loop_t loop;
  uv_timer_t watchdog;
  uv_timer_t delay; /* for steps that must wait a little */
  tc_pg_pool_t *pool;
  const char *url;
  int closed; /* done() calls */
  int step; /* where a test driven by on_state stands */

  int ups[8];
  int downs[8];
  char last_down_err[256];

  int ncb; /* job callbacks so far: also where a script stands */
  int nok;
  int status_seen[8]; /* indexed by STATUS_SLOT(status) */
  int counts[NCONC];
  int order[8];
  int norder;
  int victim_index;
  double elapsed[8];
  int pids[NCONC];
  int npids;
} ctx_t;

static void on_watchdog(uv_timer_t *t)
{
  (void)t;
  fail_msg("test timed out");
}

static void ctx_init(ctx_t *t)
{
  memset(t, 0, sizeof *t);
  t->url = getenv("TC_PG_URL");
  t->victim_index = -1;
  assert_int_equal(uv_loop_init(&t->loop), 0);
  assert_int_equal(uv_timer_init(&t->loop, &t->watchdog), 0);
  uv_timer_start(&t->watchdog, on_watchdog, WATCHDOG_MS, 0);
  uv_unref((uv_handle_t *)&t->watchdog);
  assert_int_equal(uv_timer_init(&t->loop, &t->delay), 0);
  uv_unref((uv_handle_t *)&t->delay);
  t->delay.data = t;
}

/* After the loop ran out: the pool closed once.  Close the test's own
 * handles and check that nothing else is left. */
static void ctx_finish(ctx_t *t)
{
  assert_int_equal(t->closed, 1);
  uv_close((uv_handle_t *)&t->watchdog, NULL);
  uv_close((uv_handle_t *)&t->delay, NULL);
  assert_int_equal(uv_run(&t->loop, UV_RUN_DEFAULT), 0);
  assert_int_equal(uv_loop_close(&t->loop), 0);
}

/* Call before ctx_init, so that a skipped test leaves no loop behind. */
static void need_server(void)
{
  const char *url = getenv("TC_PG_URL");

  if (url == NULL || url[0] == '\0') {
    print_message("TC_PG_URL is not set: skipping (run under scripts/with-servers --pg)\n");
    skip();
  }
}

static void pool_done(void *arg)
{
  ctx_t *t = arg;

  t->closed++;
}

static void close_pool(ctx_t *t)
{
  tc_pg_pool_close(t->pool, pool_done, t);
}

static void on_state(tc_pg_pool_t *pool, int idx, bool up, const char *err, void *arg)
{
  ctx_t *t = arg;

  assert_ptr_equal(pool, t->pool);
  assert_true(idx >= 0 && idx < 8);
  if (up) {
    assert_null(err);
    t->ups[idx]++;
  } else {
    assert_non_null(err);
    assert_true(err[0] != '\0');
    snprintf(t->last_down_err, sizeof t->last_down_err, "%s", err);
    t->downs[idx]++;
  }
}

/* What a pool tells about its connections: on_state, or a test's own
 * callback that calls on_state and then acts on the change. */
typedef void pool_state_cb(tc_pg_pool_t *pool, int idx, bool up, const char *err, void *arg);

/* The options every pool of these tests starts from: 'size' connections
 * on 'conninfo', their changes reported to 'watch' with the test's ctx. */
static tc_pg_pool_opts_t pool_opts(ctx_t *t, const char *conninfo, int size, pool_state_cb *watch)
{
  tc_pg_pool_opts_t o;

  memset(&o, 0, sizeof o);
  o.conninfo = conninfo;
  o.size = size;
  o.on_state = watch;
  o.state_arg = t;
  return o;
}

static tc_pg_pool_t *start_pool(ctx_t *t, const tc_pg_pool_opts_t *o)
{
  t->pool = tc_pg_pool_new(&t->loop, o);
  assert_non_null(t->pool);
  return t->pool;
}

/* A pool that reconnects quickly, so that tests of lost connections do
 * not wait out the default backoff. */
static tc_pg_pool_t *open_pool(ctx_t *t, const char *conninfo, int size, size_t max_queue)
{
  tc_pg_pool_opts_t o = pool_opts(t, conninfo, size, on_state);

  o.max_queue = max_queue;
  o.reconnect_min_ms = 20;
  o.reconnect_max_ms = 200;
  return start_pool(t, &o);
}

static tc_pg_job_t *make_job_va(unsigned flags, tc_pg_job_cb cb, void *arg, const char *sql,
                                va_list ap)
{
  tc_pg_job_t *job = tc_pg_job_new(flags, cb, arg);
  const char *s;

  assert_non_null(job);
  for (s = sql; s != NULL; s = va_arg(ap, const char *))
    assert_int_equal(tc_pg_job_add(job, s, 0, NULL), 0);
  return job;
}

/* Build a job of 'n' statements from a NULL-terminated list of SQL texts
 * without parameters. */
static tc_pg_job_t *make_job(unsigned flags, tc_pg_job_cb cb, void *arg, const char *sql, ...)
{
  tc_pg_job_t *job;
  va_list ap;

  va_start(ap, sql);
  job = make_job_va(flags, cb, arg, sql, ap);
  va_end(ap);
  return job;
}

/* A test on the server: its loop and a pool of 'size' (queue bound
 * 'max_queue') on TC_PG_URL. */
static void ctx_open(ctx_t *t, int size, size_t max_queue)
{
  need_server();
  ctx_init(t);
  open_pool(t, t->url, size, max_queue);
}

/* A test on the server whose pool reports to the test's own 'watch' (with
 * the pool's default backoff): the test starts its work when a connection is
 * up. */
static void ctx_open_watched(ctx_t *t, int size, pool_state_cb *watch)
{
  tc_pg_pool_opts_t o;

  need_server();
  ctx_init(t);
  o = pool_opts(t, t->url, size, watch);
  start_pool(t, &o);
}

static void submit_ok(ctx_t *t, tc_pg_job_t *job, unsigned deadline_ms)
{
  assert_int_equal(tc_pg_submit(t->pool, job, deadline_ms), 0);
}

static const char *val(const tc_pg_job_t *job, int stmt, int row, int col)
{
  const PGresult *res = tc_pg_job_result(job, stmt);

  assert_non_null(res);
  assert_int_equal(PQresultStatus(res), PGRES_TUPLES_OK);
  assert_true(row < PQntuples(res));
  return PQgetvalue(res, row, col);
}

static void expect_ok(const tc_pg_job_t *job, int status)
{
  if (status != TC_PG_OK)
    fail_msg("job failed: status %d, error \"%s\", sqlstate \"%s\", index %d", status,
             tc_pg_job_error(job), tc_pg_job_sqlstate(job), tc_pg_job_failed_index(job));
}

/* Run the loop until the pool closed and nothing is left to do, then
 * check how many job callbacks ran. */
static void run_expecting_callbacks(ctx_t *t, int ncb)
{
  uv_run(&t->loop, UV_RUN_DEFAULT);
  assert_int_equal(t->ncb, ncb);
}

/* The whole end of a test that checks nothing but the callbacks: their
 * count, the pool closed, and nothing leaked. */
static void finish_after_callbacks(ctx_t *t, int ncb)
{
  run_expecting_callbacks(t, ncb);
  ctx_finish(t);
}

/* A test on the server whose script ('first_step' onward) starts once
 * its tables exist: a TXN job of the NULL-terminated 'ddl' statements. */
static void ctx_open_with_tables(ctx_t *t, int size, tc_pg_job_cb first_step, const char *ddl,
                                 ...)
{
  va_list ap;

  ctx_open(t, size, 0);
  va_start(ap, ddl);
  submit_ok(t, make_job_va(TC_PG_JOB_TXN, first_step, t, ddl, ap), 0);
  va_end(ap);
}

/* ---- 1. one statement with parameters ---- */

static void single_cb(tc_pg_job_t *job, int status, void *arg)
{
  ctx_t *t = arg;
  const PGresult *res;

  expect_ok(job, status);
  t->ncb++;
  assert_int_equal(tc_pg_job_count(job), 1);
  res = tc_pg_job_result(job, 0);
  assert_non_null(res);
  assert_int_equal(PQntuples(res), 1);
  assert_string_equal(val(job, 0, 0, 0), "42");
  assert_string_equal(val(job, 0, 0, 1), "hello, world");
  assert_string_equal(val(job, 0, 0, 2), "t");
  assert_string_equal(tc_pg_job_error(job), "");
  assert_string_equal(tc_pg_job_sqlstate(job), "");
  assert_int_equal(tc_pg_job_failed_index(job), -1);
  assert_true(tc_pg_job_elapsed_ms(job) > 0.0);
  assert_null(tc_pg_job_result(job, 1));
  assert_null(tc_pg_job_result(job, -1));
  assert_int_equal(tc_pg_pool_queued(t->pool), 0);
  close_pool(t);
}

static void test_single_statement(void **state)
{
  ctx_t t;
  tc_pg_job_t *job;
  const char *vals[3] = {"41", "hello, world", NULL};

  (void)state;
  ctx_open(&t, 2, 0);
  job = tc_pg_job_new(0, single_cb, &t);
  assert_non_null(job);
  assert_int_equal(
    tc_pg_job_add(job, "SELECT $1::int + 1, $2::text, $3::text IS NULL", 3, vals), 0);
  submit_ok(&t, job, 5000);
  assert_int_equal(tc_pg_pool_queued(t.pool), 1);
  finish_after_callbacks(&t, 1);
}

/* ---- 2. a TXN job of 100 statements commits atomically ---- */

static void txn100_cb(tc_pg_job_t *job, int status, void *arg)
{
  ctx_t *t = arg;
  int i;

  expect_ok(job, status);
  switch (t->ncb++) {
  case 0: /* table created: insert 100 rows in one transaction */
    job = tc_pg_job_new(TC_PG_JOB_TXN, txn100_cb, t);
    assert_non_null(job);
    for (i = 0; i < 100; i++) {
      char id[16], v[32];
      const char *vals[2] = {id, v};

      snprintf(id, sizeof id, "%d", i);
      snprintf(v, sizeof v, "row %d", i);
      assert_int_equal(
        tc_pg_job_add(job, "INSERT INTO tc_pg_t100 (id, v) VALUES ($1, $2)", 2, vals), 0);
    }
    submit_ok(t, job, 0);
    break;
  case 1: /* inserted: every statement has its own result */
    assert_int_equal(tc_pg_job_count(job), 100);
    for (i = 0; i < 100; i++) {
      const PGresult *res = tc_pg_job_result(job, i);

      assert_non_null(res);
      assert_int_equal(PQresultStatus(res), PGRES_COMMAND_OK);
      assert_string_equal(PQcmdTuples((PGresult *)(uintptr_t)res), "1");
    }
    submit_ok(t, make_job(0, txn100_cb, t, "SELECT count(*), sum(id), min(v) FROM tc_pg_t100",
                          NULL),
              0);
    break;
  case 2:
    assert_string_equal(val(job, 0, 0, 0), "100");
    assert_string_equal(val(job, 0, 0, 1), "4950");
    assert_string_equal(val(job, 0, 0, 2), "row 0");
    close_pool(t);
    break;
  default:
    fail();
  }
}

static void test_txn_100_commits(void **state)
{
  ctx_t t;

  (void)state;
  ctx_open_with_tables(&t, 2, txn100_cb, "DROP TABLE IF EXISTS tc_pg_t100",
                       "CREATE TABLE tc_pg_t100 (id int PRIMARY KEY, v text NOT NULL)", NULL);
  finish_after_callbacks(&t, 3);
}

/* ---- 3. a TXN job whose 3rd statement fails rolls back everything ---- */

static tc_pg_job_t *insert_job(ctx_t *t, tc_pg_job_cb cb, const char *table, const int *ids,
                               int n)
{
  tc_pg_job_t *job = tc_pg_job_new(TC_PG_JOB_TXN, cb, t);
  char sql[128];
  int i;

  assert_non_null(job);
  snprintf(sql, sizeof sql, "INSERT INTO %s (id) VALUES ($1::int)", table);
  for (i = 0; i < n; i++) {
    char id[16];
    const char *vals[1] = {id};

    snprintf(id, sizeof id, "%d", ids[i]);
    assert_int_equal(tc_pg_job_add(job, sql, 1, vals), 0);
  }
  return job;
}

/* The script of test_txn_failure_rolls_back, a row a job callback: what
 * the job that just finished must have reported, then the next job. */
typedef enum { NEXT_INSERT, NEXT_COUNT, NEXT_COUNT_THEN_FAIL, NEXT_CLOSE } txn_next_t;

static const int dup_ids[] = {1, 2, 1, 3};
static const int good_ids[] = {1, 2};

static const struct txn_step {
  const char *sqlstate; /* the failure expected; NULL: the job succeeded */
  int failed_index;     /* with sqlstate: the statement that failed, -1 for COMMIT */
  const char *error_has;
  const char *rows;     /* the job counted the rows: how many; NULL: no count */
  txn_next_t next;      /* then: insert 'ids' into 'table', or count its rows */
  const char *table;
  const int *ids;
  int nids;
} txn_failure_script[] = {
  /* Tables created: a duplicate key fails statement 2. */
  {NULL, 0, NULL, NULL, NEXT_INSERT, "tc_pg_tfail", dup_ids, 4},
  /* The only connection must be usable again (ROLLBACK ran). */
  {"23505", 2, "duplicate key", NULL, NEXT_COUNT, "tc_pg_tfail", NULL, 0},
  {NULL, 0, NULL, "0", NEXT_INSERT, "tc_pg_tfail", good_ids, 2},
  {NULL, 0, NULL, NULL, NEXT_COUNT_THEN_FAIL, "tc_pg_tfail", NULL, 0},
  /* A plain (non-TXN) job: the error is reported at its index. */
  {"22012", 1, NULL, NULL, NEXT_COUNT, "tc_pg_tfail", NULL, 0},
  /* A failure at COMMIT (deferred constraint) reports index -1. */
  {NULL, 0, NULL, "2", NEXT_INSERT, "tc_pg_tdefer", good_ids, 2},
  {NULL, 0, NULL, NULL, NEXT_INSERT, "tc_pg_tdefer", dup_ids, 3},
  {"23505", -1, NULL, NULL, NEXT_COUNT, "tc_pg_tdefer", NULL, 0},
  {NULL, 0, NULL, "2", NEXT_CLOSE, NULL, NULL, 0},
};

#define TXN_FAILURE_STEPS ((int)(sizeof txn_failure_script / sizeof txn_failure_script[0]))

static void txnfail_cb(tc_pg_job_t *job, int status, void *arg)
{
  ctx_t *t = arg;
  const struct txn_step *step;
  char count_sql[64];

  assert_true(t->ncb < TXN_FAILURE_STEPS);
  step = &txn_failure_script[t->ncb++];
  if (step->sqlstate != NULL) {
    assert_int_equal(status, TC_PG_ESTMT);
    assert_int_equal(tc_pg_job_failed_index(job), step->failed_index);
    assert_string_equal(tc_pg_job_sqlstate(job), step->sqlstate);
  } else {
    expect_ok(job, status);
  }
  if (step->error_has != NULL)
    assert_non_null(strstr(tc_pg_job_error(job), step->error_has));
  if (step->rows != NULL)
    assert_string_equal(val(job, 0, 0, 0), step->rows);
  if (step->next == NEXT_CLOSE) {
    close_pool(t);
    return;
  }
  if (step->next == NEXT_INSERT) {
    submit_ok(t, insert_job(t, txnfail_cb, step->table, step->ids, step->nids), 0);
    return;
  }
  snprintf(count_sql, sizeof count_sql, "SELECT count(*) FROM %s", step->table);
  if (step->next == NEXT_COUNT)
    submit_ok(t, make_job(0, txnfail_cb, t, count_sql, NULL), 0);
  else
    submit_ok(t, make_job(0, txnfail_cb, t, count_sql, "SELECT 1/0", "SELECT 3", NULL), 0);
}

static void test_txn_failure_rolls_back(void **state)
{
  ctx_t t;

  (void)state;
  ctx_open_with_tables(&t, 1, txnfail_cb, "DROP TABLE IF EXISTS tc_pg_tfail",
                       "CREATE TABLE tc_pg_tfail (id int PRIMARY KEY)",
                       "DROP TABLE IF EXISTS tc_pg_tdefer",
                       "CREATE TABLE tc_pg_tdefer (id int, CONSTRAINT tc_pg_tdefer_u UNIQUE (id)"
                       " DEFERRABLE INITIALLY DEFERRED)",
                       NULL);
  finish_after_callbacks(&t, TXN_FAILURE_STEPS);
}

/* ---- 4. 1000 concurrent jobs over a pool of 4 ---- */

typedef struct conc_arg {
  ctx_t *t;
  int i;
} conc_arg_t;

static void conc_cb(tc_pg_job_t *job, int status, void *arg)
{
  conc_arg_t *a = arg;
  ctx_t *t = a->t;
  int pid, j;

  expect_ok(job, status);
  assert_int_equal(atoi(val(job, 0, 0, 0)), a->i);
  t->counts[a->i]++;
  pid = atoi(val(job, 0, 0, 1));
  for (j = 0; j < t->npids && t->pids[j] != pid; j++)
    ;
  if (j == t->npids)
    t->pids[t->npids++] = pid;
  if (++t->ncb == NCONC)
    close_pool(t);
}

static void test_concurrent_1000(void **state)
{
  ctx_t t;
  conc_arg_t *args;
  int i;

  (void)state;
  need_server();
  ctx_init(&t);
  args = calloc(NCONC, sizeof *args);
  assert_non_null(args);
  open_pool(&t, t.url, 4, 0);
  for (i = 0; i < NCONC; i++) {
    char v[16];
    const char *vals[1] = {v};
    tc_pg_job_t *job;

    args[i].t = &t;
    args[i].i = i;
    snprintf(v, sizeof v, "%d", i);
    job = tc_pg_job_new((i % 2) ? TC_PG_JOB_TXN : 0, conc_cb, &args[i]);
    assert_non_null(job);
    assert_int_equal(tc_pg_job_add(job, "SELECT $1::int, pg_backend_pid()", 1, vals), 0);
    submit_ok(&t, job, 60000);
  }
  assert_int_equal(tc_pg_pool_queued(t.pool), NCONC);
  run_expecting_callbacks(&t, NCONC);
  for (i = 0; i < NCONC; i++)
    assert_int_equal(t.counts[i], 1);
  /* The work was spread over the pool's connections. */
  assert_true(t.npids >= 2 && t.npids <= 4);
  free(args);
  ctx_finish(&t);
}

/* ---- 5. the queue bound ---- */

static void bound_cb(tc_pg_job_t *job, int status, void *arg)
{
  ctx_t *t = arg;

  expect_ok(job, status);
  if (++t->ncb == 3)
    close_pool(t);
}

static void test_queue_bound(void **state)
{
  ctx_t t;
  tc_pg_job_t *extra;
  int i;

  (void)state;
  ctx_open(&t, 1, 3);
  for (i = 0; i < 3; i++)
    submit_ok(&t, make_job(0, bound_cb, &t, "SELECT 1", NULL), 0);
  extra = make_job(0, bound_cb, &t, "SELECT 1", NULL);
  assert_int_equal(tc_pg_submit(t.pool, extra, 0), TC_PG_EFULL);
  assert_int_equal(tc_pg_pool_queued(t.pool), 3);
  tc_pg_job_free(extra); /* refused: still ours */
  finish_after_callbacks(&t, 3);
}

/* ---- 6. deadlines while the server is unreachable ---- */

static void deadline_cb(tc_pg_job_t *job, int status, void *arg)
{
  ctx_t *t = arg;
  int which = (int)tc_pg_job_count(job); /* 1, 2 or 3 statements tell them apart */

  t->ncb++;
  t->order[t->norder++] = which;
  t->status_seen[STATUS_SLOT(status)]++;
  t->elapsed[which] = tc_pg_job_elapsed_ms(job);
  if (which == 3) { /* no deadline: only closing ends it */
    assert_int_equal(status, TC_PG_ECLOSING);
    return;
  }
  assert_int_equal(status, TC_PG_ENOCONN);
  assert_non_null(strstr(tc_pg_job_error(job), "no connection"));
  assert_int_equal(tc_pg_job_failed_index(job), -1);
  assert_int_equal(tc_pg_pool_ready(t->pool), 0);
  if (which == 1) /* the last deadline */
    close_pool(t);
}

/* A TCP port on 127.0.0.1 that is bound but not listening: connecting to
 * it is refused for as long as 'fd' stays open. */
static int closed_port(int *fd)
{
  struct sockaddr_in sa;
  socklen_t len = sizeof sa;

  *fd = socket(AF_INET, SOCK_STREAM, 0);
  assert_true(*fd >= 0);
  memset(&sa, 0, sizeof sa);
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  assert_int_equal(bind(*fd, (struct sockaddr *)&sa, sizeof sa), 0);
  assert_int_equal(getsockname(*fd, (struct sockaddr *)&sa, &len), 0);
  return ntohs(sa.sin_port);
}

static void test_deadline_unreachable(void **state)
{
  ctx_t t;
  char conninfo[128];
  int fd, port;

  (void)state;
  ctx_init(&t);
  port = closed_port(&fd);
  snprintf(conninfo, sizeof conninfo, "host=127.0.0.1 port=%d user=postgres dbname=postgres",
           port);
  open_pool(&t, conninfo, 2, 0);
  /* Job 1 has the later deadline but is queued first: job 2 must expire
   * first all the same. */
  submit_ok(&t, make_job(0, deadline_cb, &t, "SELECT 1", NULL), 300);
  submit_ok(&t, make_job(0, deadline_cb, &t, "SELECT 1", "SELECT 2", NULL), 100);
  submit_ok(&t, make_job(0, deadline_cb, &t, "SELECT 1", "SELECT 2", "SELECT 3", NULL), 0);
  uv_run(&t.loop, UV_RUN_DEFAULT);
  close(fd);
  assert_int_equal(t.ncb, 3);
  assert_int_equal(t.norder, 3);
  assert_int_equal(t.order[0], 2);
  assert_int_equal(t.order[1], 1);
  assert_int_equal(t.order[2], 3);
  assert_int_equal(t.status_seen[STATUS_SLOT(TC_PG_ENOCONN)], 2);
  assert_int_equal(t.status_seen[STATUS_SLOT(TC_PG_ECLOSING)], 1);
  assert_true(t.elapsed[2] >= 99.0);
  assert_true(t.elapsed[1] >= 299.0);
  assert_true(t.downs[0] + t.downs[1] >= 2);
  assert_int_equal(t.ups[0] + t.ups[1], 0);
  assert_non_null(strstr(t.last_down_err, "refused"));
  ctx_finish(&t);
}

/* A deadline also expires while every connection is up but busy. */
static void busy_cb(tc_pg_job_t *job, int status, void *arg)
{
  ctx_t *t = arg;

  t->order[t->norder++] = status;
  if (status == TC_PG_ENOCONN) {
    assert_string_equal(tc_pg_job_error(job), "no connection available within 100 ms");
    assert_int_equal(tc_pg_pool_ready(t->pool), 1);
    return;
  }
  expect_ok(job, status);
  close_pool(t);
}

static void busy_on_state(tc_pg_pool_t *pool, int idx, bool up, const char *err, void *arg)
{
  ctx_t *t = arg;

  on_state(pool, idx, up, err, arg);
  if (!up || t->step++ != 0)
    return;
  /* The only connection is up: occupy it, then queue a job that cannot
   * get it within its deadline. */
  submit_ok(t, make_job(0, busy_cb, t, "SELECT pg_sleep(0.5)", NULL), 0);
  submit_ok(t, make_job(0, busy_cb, t, "SELECT 1", NULL), 100);
}

static void test_deadline_busy(void **state)
{
  ctx_t t;

  (void)state;
  ctx_open_watched(&t, 1, busy_on_state);
  uv_run(&t.loop, UV_RUN_DEFAULT);
  assert_int_equal(t.norder, 2);
  assert_int_equal(t.order[0], TC_PG_ENOCONN);
  assert_int_equal(t.order[1], TC_PG_OK);
  ctx_finish(&t);
}

/* ---- 7. a connection killed mid-job ---- */

static void kill_step(ctx_t *t);

static void killed_later_cb(tc_pg_job_t *job, int status, void *arg)
{
  ctx_t *t = arg;

  expect_ok(job, status);
  assert_string_equal(val(job, 0, 0, 0), "7");
  if (++t->nok == 10)
    close_pool(t);
}

static void victim_cb(tc_pg_job_t *job, int status, void *arg)
{
  ctx_t *t = arg;

  t->status_seen[STATUS_SLOT(status)]++;
  assert_int_equal(status, TC_PG_EBROKEN);
  assert_true(tc_pg_job_error(job)[0] != '\0');
  t->step = 2;
}

static void killer_retry(uv_timer_t *timer)
{
  kill_step(timer->data);
}

static void killer_cb(tc_pg_job_t *job, int status, void *arg)
{
  ctx_t *t = arg;
  const PGresult *res;

  expect_ok(job, status);
  res = tc_pg_job_result(job, 0);
  if (PQntuples(res) == 0) { /* the victim is not running yet */
    uv_timer_start(&t->delay, killer_retry, 10, 0);
    return;
  }
  assert_string_equal(val(job, 0, 0, 0), "t");
}

static void kill_step(ctx_t *t)
{
  submit_ok(t,
            make_job(0, killer_cb, t,
                     "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                     " WHERE query LIKE '%tc_pg_victim%' AND state = 'active'"
                     " AND pid <> pg_backend_pid()",
                     NULL),
            0);
}

static void kill_on_state(tc_pg_pool_t *pool, int idx, bool up, const char *err, void *arg)
{
  ctx_t *t = arg;
  int i;

  on_state(pool, idx, up, err, arg);
  if (up && t->step == 0 && tc_pg_pool_ready(pool) == 2) {
    /* Both connections up: one runs the victim, the other the killer. */
    t->step = 1;
    submit_ok(t, make_job(0, victim_cb, t, "SELECT pg_sleep(60) /* tc_pg_victim */", NULL), 0);
    kill_step(t);
  } else if (!up) {
    assert_int_equal(t->victim_index, -1);
    t->victim_index = idx;
  } else if (up && idx == t->victim_index) {
    /* Reconnected: later jobs are served. */
    assert_int_equal(t->step, 2);
    t->step = 3;
    for (i = 0; i < 10; i++)
      submit_ok(t, make_job(TC_PG_JOB_TXN, killed_later_cb, t, "SELECT 7", NULL), 1000);
  }
}

static void test_killed_mid_job(void **state)
{
  ctx_t t;
  tc_pg_pool_opts_t o;

  (void)state;
  need_server();
  ctx_init(&t);
  t.delay.data = &t;
  o = pool_opts(&t, t.url, 2, kill_on_state);
  o.reconnect_min_ms = 50;
  o.reconnect_max_ms = 500;
  start_pool(&t, &o);
  uv_run(&t.loop, UV_RUN_DEFAULT);
  assert_int_equal(t.step, 3);
  assert_int_equal(t.status_seen[STATUS_SLOT(TC_PG_EBROKEN)], 1);
  assert_true(t.victim_index >= 0);
  assert_int_equal(t.downs[t.victim_index], 1);
  assert_int_equal(t.ups[t.victim_index], 2);
  assert_int_equal(t.downs[0] + t.downs[1], 1);
  assert_int_equal(t.nok, 10);
  ctx_finish(&t);
}

/* ---- 8. submitting from inside a callback ---- */

static void chain_cb(tc_pg_job_t *job, int status, void *arg)
{
  ctx_t *t = arg;
  char v[16];
  const char *vals[1] = {v};
  tc_pg_job_t *next;

  expect_ok(job, status);
  assert_int_equal(atoi(val(job, 0, 0, 0)), t->ncb);
  t->ncb++;
  if (t->ncb == 200) {
    /* Closing from inside a job callback is allowed too. */
    close_pool(t);
    return;
  }
  snprintf(v, sizeof v, "%d", t->ncb);
  next = tc_pg_job_new(t->ncb % 3 ? TC_PG_JOB_TXN : 0, chain_cb, t);
  assert_non_null(next);
  assert_int_equal(tc_pg_job_add(next, "SELECT $1::int", 1, vals), 0);
  submit_ok(t, next, 0);
  /* The new job is not started before this callback returns. */
  assert_int_equal(tc_pg_pool_queued(t->pool), 1);
}

static void test_submit_from_callback(void **state)
{
  ctx_t t;
  const char *vals[1] = {"0"};
  tc_pg_job_t *job;

  (void)state;
  ctx_open(&t, 3, 0);
  job = tc_pg_job_new(0, chain_cb, &t);
  assert_non_null(job);
  assert_int_equal(tc_pg_job_add(job, "SELECT $1::int", 1, vals), 0);
  submit_ok(&t, job, 0);
  finish_after_callbacks(&t, 200);
}

/* ---- 9. closing with jobs queued and in flight ---- */

static void closing_cb(tc_pg_job_t *job, int status, void *arg)
{
  ctx_t *t = arg;
  tc_pg_job_t *again;
  int i = (int)tc_pg_job_count(job) - 1;

  assert_int_equal(status, TC_PG_ECLOSING);
  assert_int_equal(t->closed, 0);
  t->counts[i]++;
  t->ncb++;
  /* Submitting while closing is refused, and the job stays ours. */
  again = make_job(0, closing_cb, t, "SELECT 1", NULL);
  assert_int_equal(tc_pg_submit(t->pool, again, 0), TC_PG_ECLOSING);
  tc_pg_job_free(again);
  /* A second close is ignored. */
  tc_pg_pool_close(t->pool, pool_done, t);
}

static void close_later(uv_timer_t *timer)
{
  ctx_t *t = timer->data;

  assert_int_equal(tc_pg_pool_queued(t->pool), 10);
  close_pool(t);
}

static void closing_on_state(tc_pg_pool_t *pool, int idx, bool up, const char *err, void *arg)
{
  ctx_t *t = arg;
  int i, j;

  on_state(pool, idx, up, err, arg);
  if (!up || t->step != 0)
    return;
  t->step = 1;
  /* Job 0 is in flight (sleeping) when the pool closes; jobs 1-10 wait. */
  for (i = 0; i < 11; i++) {
    tc_pg_job_t *job = tc_pg_job_new(0, closing_cb, t);

    assert_non_null(job);
    /* 'i + 1' statements identify the job in its callback. */
    assert_int_equal(tc_pg_job_add(job, "SELECT pg_sleep(5)", 0, NULL), 0);
    for (j = 0; j < i; j++)
      assert_int_equal(tc_pg_job_add(job, "SELECT 1", 0, NULL), 0);
    submit_ok(t, job, 0);
  }
  uv_timer_start(&t->delay, close_later, 200, 0);
  uv_ref((uv_handle_t *)&t->delay);
}

static void test_close_with_jobs(void **state)
{
  ctx_t t;
  int i;

  (void)state;
  ctx_open_watched(&t, 1, closing_on_state);
  run_expecting_callbacks(&t, 11);
  for (i = 0; i < 11; i++)
    assert_int_equal(t.counts[i], 1);
  ctx_finish(&t);
}

static void early_cb(tc_pg_job_t *job, int status, void *arg)
{
  ctx_t *t = arg;

  (void)job;
  assert_int_equal(status, TC_PG_ECLOSING);
  assert_string_equal(tc_pg_job_error(job), "connection pool is closing");
  t->ncb++;
}

/* Closed before the loop ever ran: nothing was connected yet. */
static void test_close_before_run(void **state)
{
  ctx_t t;
  int i;

  (void)state;
  ctx_init(&t);
  open_pool(&t, "host=127.0.0.1 port=1 user=postgres", 3, 0);
  for (i = 0; i < 5; i++)
    submit_ok(&t, make_job(TC_PG_JOB_TXN, early_cb, &t, "SELECT 1", NULL), i * 10);
  close_pool(&t);
  assert_int_equal(t.ncb, 5);
  assert_int_equal(t.closed, 0); /* done() only runs from the loop */
  uv_run(&t.loop, UV_RUN_DEFAULT);
  assert_int_equal(t.ups[0] + t.downs[0], 0);
  ctx_finish(&t);
}

/* ---- 10. init_sql ---- */

static void init_cb(tc_pg_job_t *job, int status, void *arg)
{
  ctx_t *t = arg;

  expect_ok(job, status);
  assert_string_equal(val(job, 0, 0, 0), "tc_pg_init");
  assert_string_equal(val(job, 1, 0, 0), "123s");
  if (++t->ncb == 4)
    close_pool(t);
}

static void bad_init_cb(tc_pg_job_t *job, int status, void *arg)
{
  ctx_t *t = arg;

  assert_int_equal(status, TC_PG_ENOCONN);
  assert_non_null(strstr(tc_pg_job_error(job), "init_sql"));
  t->ncb++;
  close_pool(t);
}

static void test_init_sql(void **state)
{
  ctx_t t;
  tc_pg_pool_opts_t o;
  int i;

  (void)state;
  need_server();
  ctx_init(&t);
  o = pool_opts(&t, t.url, 2, on_state);
  o.init_sql = "SET application_name = 'tc_pg_init'; SET statement_timeout = '123s'";
  start_pool(&t, &o);
  for (i = 0; i < 4; i++)
    submit_ok(&t, make_job(0, init_cb, &t, "SHOW application_name", "SHOW statement_timeout",
                           NULL),
              0);
  finish_after_callbacks(&t, 4);

  /* An init_sql that fails keeps the connection from ever being used. */
  ctx_init(&t);
  o.size = 1;
  o.reconnect_min_ms = 20;
  o.state_arg = &t;
  o.init_sql = "SET application_name = 'x'; SELECT * FROM tc_pg_no_such_table";
  start_pool(&t, &o);
  submit_ok(&t, make_job(0, bad_init_cb, &t, "SELECT 1", NULL), 300);
  run_expecting_callbacks(&t, 1);
  assert_true(t.downs[0] >= 1);
  assert_int_equal(t.ups[0], 0);
  assert_non_null(strstr(t.last_down_err, "tc_pg_no_such_table"));
  ctx_finish(&t);
}

/* ---- 11. big payloads (PQflush returning 1) and many statements ---- */

static void big_cb(tc_pg_job_t *job, int status, void *arg)
{
  ctx_t *t = arg;
  const PGresult *res;
  int i;

  expect_ok(job, status);
  assert_int_equal(tc_pg_job_count(job), BIG_NSTMTS);
  for (i = 1; i < BIG_NSTMTS - 2; i++)
    assert_int_equal(atoi(val(job, i, 0, 0)), i);
  res = tc_pg_job_result(job, BIG_NSTMTS - 2);
  assert_int_equal(PQntuples(res), 20000);
  assert_int_equal(PQgetlength(res, 19999, 0), 500);
  assert_string_equal(val(job, BIG_NSTMTS - 1, 0, 0), BIG_PARAM_STR);
  t->ncb++;
  close_pool(t);
}

static void test_big_payloads(void **state)
{
  ctx_t t;
  tc_pg_job_t *job;
  char *big;
  const char *vals[1];
  int i;

  (void)state;
  ctx_open(&t, 1, 0);
  job = tc_pg_job_new(TC_PG_JOB_TXN, big_cb, &t);
  assert_non_null(job);
  /* The backend sleeps first and reads nothing meanwhile, so the large
   * parameter at the end (more than the socket buffers hold) leaves
   * PQflush returning 1: the pool must wait for UV_WRITABLE. */
  assert_int_equal(tc_pg_job_add(job, "SELECT pg_sleep(1)", 0, NULL), 0);
  for (i = 1; i < BIG_NSTMTS - 2; i++) {
    char v[16];

    snprintf(v, sizeof v, "%d", i);
    vals[0] = v;
    assert_int_equal(tc_pg_job_add(job, "SELECT $1::int", 1, vals), 0);
  }
  assert_int_equal(
    tc_pg_job_add(job, "SELECT repeat('z', 500) FROM generate_series(1, 20000)", 0, NULL), 0);
  big = malloc(BIG_PARAM + 1);
  assert_non_null(big);
  memset(big, 'y', BIG_PARAM);
  big[BIG_PARAM] = '\0';
  vals[0] = big;
  assert_int_equal(tc_pg_job_add(job, "SELECT length($1)", 1, vals), 0);
  free(big);
  submit_ok(&t, job, 0);
  finish_after_callbacks(&t, 1);
}

/* ---- 12. a host name is resolved off the loop ---- */

static void host_cb(tc_pg_job_t *job, int status, void *arg)
{
  ctx_t *t = arg;

  expect_ok(job, status);
  assert_string_equal(val(job, 0, 0, 0), "1");
  t->ncb++;
  close_pool(t);
}

/* Where the server of TC_PG_URL listens, for the tests that reach it by
 * another name or after another host. */
typedef struct server_addr {
  char port[64];
  char user[64];
  char db[64];
} server_addr_t;

/* The server's port, user and database from TC_PG_URL, if it listens on
 * 127.0.0.1; false otherwise. */
static bool url_parts(const char *url, server_addr_t *a)
{
  PQconninfoOption *opts, *o;
  char *err = NULL;
  bool tcp = false;

  opts = PQconninfoParse(url, &err);
  assert_non_null(opts);
  snprintf(a->port, sizeof a->port, "5432");
  snprintf(a->user, sizeof a->user, "postgres");
  snprintf(a->db, sizeof a->db, "postgres");
  for (o = opts; o->keyword != NULL; o++) {
    if (o->val == NULL)
      continue;
    if (strcmp(o->keyword, "port") == 0)
      snprintf(a->port, sizeof a->port, "%s", o->val);
    else if (strcmp(o->keyword, "user") == 0)
      snprintf(a->user, sizeof a->user, "%s", o->val);
    else if (strcmp(o->keyword, "dbname") == 0)
      snprintf(a->db, sizeof a->db, "%s", o->val);
    else if (strcmp(o->keyword, "host") == 0)
      tcp = strcmp(o->val, "127.0.0.1") == 0;
  }
  PQconninfoFree(opts);
  return tcp;
}

/* Call before ctx_init, as need_server. */
static void need_local_tcp_server(server_addr_t *a)
{
  need_server();
  if (!url_parts(getenv("TC_PG_URL"), a))
    skip(); /* the server does not listen on 127.0.0.1 */
}

/* A list of two hosts on 127.0.0.1: 'first_port' (one that fails), then
 * the server; 'options' is appended as it is. */
static void two_host_conninfo(char *conninfo, size_t len, int first_port, const server_addr_t *a,
                              const char *options)
{
  snprintf(conninfo, len, "host=127.0.0.1,127.0.0.1 port=%d,%s user=%s dbname=%s%s", first_port,
           a->port, a->user, a->db, options);
}

static void test_hostname(void **state)
{
  ctx_t t;
  server_addr_t a;
  char conninfo[256];

  (void)state;
  need_local_tcp_server(&a);
  ctx_init(&t);
  snprintf(conninfo, sizeof conninfo, "host=localhost port=%s user=%s dbname=%s", a.port, a.user,
           a.db);
  open_pool(&t, conninfo, 2, 0);
  submit_ok(&t, make_job(0, host_cb, &t, "SELECT 1", NULL), 10000);
  finish_after_callbacks(&t, 1);
}

/* A list of hosts whose first one refuses: libpq closes that socket and
 * opens another inside PQconnectPoll, so the poll handle must follow. */
static void test_host_list_fallback(void **state)
{
  ctx_t t;
  server_addr_t a;
  char conninfo[256];
  int fd;

  (void)state;
  need_local_tcp_server(&a);
  ctx_init(&t);
  two_host_conninfo(conninfo, sizeof conninfo, closed_port(&fd), &a, "");
  open_pool(&t, conninfo, 3, 0);
  submit_ok(&t, make_job(0, host_cb, &t, "SELECT 1", NULL), 10000);
  uv_run(&t.loop, UV_RUN_DEFAULT);
  close(fd);
  assert_int_equal(t.ncb, 1);
  assert_int_equal(t.downs[0] + t.downs[1] + t.downs[2], 0);
  ctx_finish(&t);
}

/* A list whose first host accepts the TCP connection and never answers
 * (a listening socket nobody accepts from: a hung server).  libpq would
 * wait on it forever; the per-host timer gives up on it after
 * connect_timeout and starts again with the next host, without reporting
 * the connection down. */
static void hung_cb(tc_pg_job_t *job, int status, void *arg)
{
  ctx_t *t = arg;

  expect_ok(job, status);
  t->elapsed[t->ncb] = tc_pg_job_elapsed_ms(job);
  t->ncb++;
  if (t->ncb == 1) {
    /* The next connection of the pool begins with the host that
     * answered: no second wait. */
    submit_ok(t, make_job(0, hung_cb, t, "SELECT 1", NULL), 10000);
    return;
  }
  close_pool(t);
}

static void test_host_list_hung_first(void **state)
{
  ctx_t t;
  server_addr_t a;
  char conninfo[256];
  int fd, hung;

  (void)state;
  need_local_tcp_server(&a);
  ctx_init(&t);
  hung = closed_port(&fd);
  assert_int_equal(listen(fd, 16), 0);
  two_host_conninfo(conninfo, sizeof conninfo, hung, &a, " connect_timeout=2");
  open_pool(&t, conninfo, 1, 0);
  submit_ok(&t, make_job(0, hung_cb, &t, "SELECT 1", NULL), 10000);
  uv_run(&t.loop, UV_RUN_DEFAULT);
  close(fd);
  assert_int_equal(t.ncb, 2);
  assert_int_equal(t.downs[0], 0);
  print_message("first job %.0f ms, second %.0f ms\n", t.elapsed[0], t.elapsed[1]);
  assert_true(t.elapsed[0] >= 1900.0 && t.elapsed[0] < 6000.0);
  assert_true(t.elapsed[1] < 1000.0);
  ctx_finish(&t);
}

/* A write refused with SQLSTATE 25006 (the session is read-only, as on a
 * standby) fails the job and drops the connection; the next one is a new
 * session (here: no longer read-only). */
static void ro_cb(tc_pg_job_t *job, int status, void *arg)
{
  ctx_t *t = arg;

  t->ncb++;
  if (t->ncb == 1) {
    expect_ok(job, status);
    submit_ok(t, make_job(TC_PG_JOB_TXN, ro_cb, t, "CREATE TABLE tc_pg_ro_never (a int)", NULL), 10000);
  } else if (t->ncb == 2) {
    assert_int_equal(status, TC_PG_ESTMT);
    assert_string_equal(tc_pg_job_sqlstate(job), "25006");
    assert_int_equal(t->downs[0], 1);
    submit_ok(t, make_job(0, ro_cb, t, "SHOW default_transaction_read_only", NULL), 10000);
  } else {
    expect_ok(job, status);
    assert_string_equal(val(job, 0, 0, 0), "off");
    assert_int_equal(t->ups[0], 2);
    close_pool(t);
  }
}

static void test_read_only_reconnects(void **state)
{
  ctx_t t;

  (void)state;
  ctx_open(&t, 1, 0);
  submit_ok(&t, make_job(0, ro_cb, &t, "SET default_transaction_read_only = on", NULL), 10000);
  finish_after_callbacks(&t, 3);
}

/* ---- 13. bad options and job edge cases (no server needed) ---- */

static void test_bad_options(void **state)
{
  uv_loop_t loop;
  tc_pg_pool_opts_t o;
  tc_pg_job_t *job;
  const char *vals[1] = {"x"};

  (void)state;
  assert_int_equal(uv_loop_init(&loop), 0);
  memset(&o, 0, sizeof o);
  assert_null(tc_pg_pool_new(&loop, NULL));
  assert_null(tc_pg_pool_new(&loop, &o)); /* no conninfo */
  o.conninfo = "this is not a conninfo";
  assert_null(tc_pg_pool_new(&loop, &o));
  o.conninfo = "host=127.0.0.1";
  o.size = -1;
  assert_null(tc_pg_pool_new(&loop, &o));
  assert_int_equal(uv_loop_close(&loop), 0);

  job = tc_pg_job_new(0, NULL, NULL);
  assert_non_null(job);
  assert_int_equal(tc_pg_job_add(job, NULL, 0, NULL), -1);
  assert_int_equal(tc_pg_job_add(job, "SELECT $1", 1, NULL), -1);
  assert_int_equal(tc_pg_job_add(job, "SELECT $1", -1, vals), -1);
  assert_int_equal(tc_pg_job_add(job, "SELECT $1", 1, vals), 0);
  assert_int_equal(tc_pg_job_count(job), 1);
  assert_string_equal(tc_pg_job_error(job), "");
  assert_int_equal(tc_pg_job_failed_index(job), -1);
  assert_null(tc_pg_job_result(job, 0));
  tc_pg_job_free(job);
  tc_pg_job_free(NULL);
}

int main(void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_bad_options),
    cmocka_unit_test(test_close_before_run),
    cmocka_unit_test(test_deadline_unreachable),
    cmocka_unit_test(test_deadline_busy),
    cmocka_unit_test(test_single_statement),
    cmocka_unit_test(test_txn_100_commits),
    cmocka_unit_test(test_txn_failure_rolls_back),
    cmocka_unit_test(test_concurrent_1000),
    cmocka_unit_test(test_queue_bound),
    cmocka_unit_test(test_killed_mid_job),
    cmocka_unit_test(test_submit_from_callback),
    cmocka_unit_test(test_close_with_jobs),
    cmocka_unit_test(test_init_sql),
    cmocka_unit_test(test_big_payloads),
    cmocka_unit_test(test_hostname),
    cmocka_unit_test(test_host_list_fallback),
    cmocka_unit_test(test_host_list_hung_first),
    cmocka_unit_test(test_read_only_reconnects),
  };

  return cmocka_run_group_tests_name("tc_pg", tests, NULL, NULL);
}
