/*
 * test_admin.c - the admin socket of a running tcd: access control,
 * framing, every command on every state of a global transaction, every
 * repair, and a clean stop that removes the socket.
 *
 * NOTES
 *   The fixture (a real tcd with an admin socket on a real PostgreSQL, the
 *   simulated RMs, the clients) is admin_suite.h, shared with
 *   test_admin_tools (tcctl, /metrics, /healthz, /readyz, lock waiters).
 *
 *   Each state of a global transaction is created by driving real
 *   transactions (txclient) and is checked through the socket field by
 *   field; every repair is checked against the database afterwards, and
 *   every refusal is checked to have changed nothing.
 *
 *   Access control runs tcctl and a raw client as "nobody" (fork, setgid,
 *   setuid); it needs root and is skipped otherwise.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "admin_suite.h"

static json_t *find_branch(json_t *arr, int64_t id) {
  size_t i;
  json_t *o;
  json_array_foreach(arr, i, o) if (json_integer_value(json_object_get(o, "branch_id")) == id) return o;
  return NULL;
}

/* A repair 'what' that must succeed ('answer' from adm), moving the
 * session from 'from' to 'to' and, unless 'status' is NULL, leaving it
 * 'status' once driven. */
static void adm_repaired(const char *what, json_t *answer, const char *from, const char *to, const char *status) {
  json_t *a = adm_ok(what, answer);
  assert_string_equal(js(a, "from"), from);
  assert_string_equal(js(a, "to"), to);
  if (status) assert_string_equal(js(a, "status"), status);
  json_decref(a);
}

/* ================================================================ tests */

/* Access: the socket is 0600 root-owned; a uid not on the allow-list is
 * refused by SO_PEERCRED even when the file mode lets it connect; an
 * allowed uid gets in. */
static void test_access_control(void **state) {
  (void)state;
  struct stat st;
  assert_int_equal(stat(g_sock, &st), 0);
  assert_true(S_ISSOCK(st.st_mode));
  assert_int_equal(st.st_mode & 0777, 0600);
  assert_int_equal(st.st_uid, geteuid());

  /* root (tcd's own uid) is in */
  json_t *a = adm_ok("stats as root", adm("stats"));
  json_decref(a);

  if (geteuid() != 0) {
    fprintf(stderr, "test_admin: not root, cannot act as \"nobody\": skipping the rest\n");
    skip();
  }
  /* 1. the file mode keeps nobody out: tcctl cannot connect (exit 3) */
  char *argv[] = {g_tcctl_path, "--socket", g_sock, "stats", NULL};
  memset(&g_run, 0, sizeof(g_run));
  run_as(NOBODY, argv, NULL, &g_run);
  assert_int_equal(g_run.status, 3);
  assert_non_null(strstr(g_run.err, "Permission denied"));

  /* 2. with the mode opened up, the peer credentials still refuse it */
  assert_int_equal(chmod(g_sock, 0666), 0);
  memset(&g_run, 0, sizeof(g_run));
  run_as(NOBODY, argv, NULL, &g_run);
  assert_int_equal(g_run.status, 3);
  if (!strstr(g_run.err, "permission denied: uid 65534")) fail_msg("tcctl as nobody said: %s", g_run.err);
  /* ... and a raw client gets the JSON error, then the connection ends */
  char *argv_json[] = {g_tcctl_path, "--socket", g_sock, "--json", "nodes", NULL};
  memset(&g_run, 0, sizeof(g_run));
  run_as(NOBODY, argv_json, NULL, &g_run);
  assert_int_equal(g_run.status, 3);
  json_t *d = parse_answer(g_run.out);
  assert_true(json_is_false(json_object_get(d, "ok")));
  assert_string_equal(js(d, "code"), "denied");
  json_decref(d);
  assert_int_equal(chmod(g_sock, 0600), 0);
  assert_true(tcd_proc_log_has(&g_tcd, "refused a connection from uid 65534"));
  a = adm_ok("stats", adm("stats"));
  assert_true(ji(json_object_get(a, "admin"), "denied") >= 2);
  json_decref(a);

  /* 3. a second node with nobody on its allow-list lets it in (once the
   * file mode does too) */
  char sock2[320], log2[320], envsock2[340];
  snprintf(sock2, sizeof(sock2), "%s/admin2.sock", g_dir);
  snprintf(log2, sizeof(log2), "%s/tcd2.log", g_dir);
  snprintf(envsock2, sizeof(envsock2), "TC_ADMIN_SOCKET=%s", sock2);
  const char *env2[] = {"TC_ADMIN_ALLOW_UIDS=4242, 65534", envsock2, NULL};
  tcd_proc_t t2 = {0};
  tcd_opts_t o2 = {.pg_url = g_pg_url, .token = TOKEN, .node_id = 2, .log_level = "info", .env = env2,
                   .log = log2, .ready = tcd_serving, .ready_arg = sock2};
  if (tcd_proc_start(&t2, &o2) != 0) fail_msg("second tcd did not start (log %s)", log2);
  assert_int_equal(stat(sock2, &st), 0);
  assert_int_equal(st.st_mode & 0777, 0600); /* the default */
  assert_int_equal(chmod(sock2, 0666), 0);
  char *argv2[] = {g_tcctl_path, "--json", "nodes", NULL};
  char envsock[700];
  snprintf(envsock, sizeof(envsock), "TC_ADMIN_SOCKETS=%s,%s", sock2, g_sock); /* the first one is used */
  const char *cenv[] = {envsock, NULL};
  memset(&g_run, 0, sizeof(g_run));
  run_as(NOBODY, argv2, cenv, &g_run);
  assert_int_equal(g_run.status, 0);
  d = parse_answer(g_run.out);
  assert_true(json_is_true(json_object_get(d, "ok")));
  assert_int_equal(ji(json_object_get(d, "self"), "node_id"), 2);
  json_decref(d);
  int st2 = tcd_proc_stop(&t2, 15000);
  if (st2 == -1 || !WIFEXITED(st2) || WEXITSTATUS(st2) != 0) fail_msg("second tcd did not stop cleanly: 0x%x", st2);
  /* the socket file goes with it */
  assert_int_equal(stat(sock2, &st), -1);
  unlink(log2);
}

/* Framing: bad, oversized, half-sent, pipelined and idle requests. */
static void test_framing(void **state) {
  (void)state;
  conn_t *c = malloc(sizeof(*c));
  c->len = 0;
  c->fd = adm_connect();
  /* bad commands are answered and the connection stays */
  send_all(c->fd, "frobnicate now\n", 15);
  json_t *a = read_answer(c, 10000);
  adm_refused("unknown command", a, "bad_request", "unknown command \"frobnicate\"");
  send_all(c->fd, "show globals limit=0\n", 21);
  adm_refused("bad limit", read_answer(c, 10000), "bad_request", "invalid value \"0\" for \"limit\"");
  send_all(c->fd, "stats\x01\n", 7);
  adm_refused("control char", read_answer(c, 10000), "bad_request", "control character");
  send_all(c->fd, "show global \xff\xfe\n", 15);
  adm_refused("bad utf-8", read_answer(c, 10000), "bad_request", "not valid UTF-8");
  send_all(c->fd, "\n\r\n", 3); /* blank lines: no answer */
  /* pipelined: answers in order, CRLF accepted */
  send_all(c->fd, "help\r\nshow nodes\nstats\n", 23);
  a = read_answer(c, 10000);
  assert_true(json_is_array(json_object_get(adm_ok("help", a), "commands")));
  json_decref(a);
  a = read_answer(c, 10000);
  assert_true(json_is_array(json_object_get(adm_ok("nodes", a), "nodes")));
  json_decref(a);
  a = read_answer(c, 10000);
  assert_true(json_is_object(json_object_get(adm_ok("stats", a), "globals")));
  json_decref(a);
  /* a request sent one byte at a time */
  const char *slow = "show locks limit=3\n";
  for (const char *p = slow; *p; p++) send_all(c->fd, p, 1);
  a = read_answer(c, 10000);
  assert_true(json_is_array(json_object_get(adm_ok("slow", a), "locks")));
  json_decref(a);
  /* oversized: answered, then closed */
  char big[MAX_REQUEST + 100];
  memset(big, 'a', sizeof(big));
  send_all(c->fd, big, sizeof(big));
  adm_refused("too long", read_answer(c, 10000), "too_long", "at most 512 bytes");
  bool eof;
  char *l = read_line(c, 5000, &eof);
  assert_null(l);
  assert_true(eof);
  close(c->fd);

  /* oversized with its newline in the same write */
  c->len = 0;
  c->fd = adm_connect();
  char big2[MAX_REQUEST + 10];
  memcpy(big2, "show global ", 12);
  memset(big2 + 12, 'x', sizeof(big2) - 13);
  big2[sizeof(big2) - 1] = '\n';
  send_all(c->fd, big2, sizeof(big2));
  adm_refused("too long 2", read_answer(c, 10000), "too_long", "request too long");
  close(c->fd);

  /* half-sent, then end of input: not executed */
  cli_t cl;
  cli_open(&cl, "frame");
  char xid[TXP_MAX_XID_LEN + 1];
  begin_ok(cl.tm, 60000, "adm-half", xid);
  register_ok(cl.rm, xid, "db_orders", "t_half:1");
  c->len = 0;
  c->fd = adm_connect();
  char half[300];
  int hn = snprintf(half, sizeof(half), "rollback %s", xid);
  send_all(c->fd, half, (size_t)hn);
  shutdown(c->fd, SHUT_WR);
  adm_refused("half-sent", read_answer(c, 10000), "incomplete", "without a newline at end of input; not executed");
  assert_null(read_line(c, 5000, &eof));
  assert_true(eof);
  close(c->fd);
  assert_int_equal(db_long(SQL_STATUS, xid, NULL), TXP_GS_BEGIN); /* nothing changed */

  /* half-sent, then silence: the idle timeout answers and closes */
  c->len = 0;
  c->fd = adm_connect();
  double t0 = now_ms();
  send_all(c->fd, half, (size_t)hn);
  adm_refused("half-sent idle", read_answer(c, IDLE_MS * 5), "incomplete", "no newline within 1500 ms");
  assert_true(now_ms() - t0 >= IDLE_MS - 100);
  assert_null(read_line(c, 5000, &eof));
  assert_true(eof);
  close(c->fd);
  assert_int_equal(db_long(SQL_STATUS, xid, NULL), TXP_GS_BEGIN);

  /* idle: closed without a word */
  c->len = 0;
  c->fd = adm_connect();
  t0 = now_ms();
  assert_null(read_line(c, IDLE_MS * 5, &eof));
  assert_true(eof);
  assert_true(now_ms() - t0 >= IDLE_MS - 100);
  close(c->fd);

  /* a flood of pipelined requests is answered completely and in order
   * (tcd stops reading while answers pile up, and resumes) */
  {
    enum { N = 3000 };
    size_t total = N * 6, sent = 0;
    char *flood = malloc(total);
    for (int i = 0; i < N; i++) memcpy(flood + i * 6, "bogus\n", 6);
    int fd = adm_connect();
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    int answers = 0;
    size_t partial = 0;
    double until = now_ms() + 60000;
    char rb[65536];
    while (answers < N && now_ms() < until) {
      struct pollfd p = {fd, (short)(POLLIN | (sent < total ? POLLOUT : 0)), 0};
      if (poll(&p, 1, 1000) <= 0) continue;
      if ((p.revents & POLLOUT) && sent < total) {
        ssize_t k = send(fd, flood + sent, total - sent, MSG_NOSIGNAL);
        if (k > 0) sent += (size_t)k;
      }
      if (p.revents & POLLIN) {
        ssize_t k = recv(fd, rb, sizeof(rb), 0);
        if (k <= 0) break;
        for (ssize_t j = 0; j < k; j++) {
          if (rb[j] == '\n') {
            answers++;
            partial = 0;
          } else {
            partial++;
          }
        }
      }
    }
    close(fd);
    free(flood);
    assert_int_equal(answers, N);
    assert_int_equal(partial, 0);
  }

  /* a long answer to a request followed by end of input is written out
   * whole before the connection closes, even to a slow reader */
  db_exec("INSERT INTO lock_table (row_key, xid, transaction_id, branch_id, resource_id, table_name, pk) "
          "SELECT 'db_orders^^^t_bulk^^^' || g, 'bulk:1', 0, 1, 'db_orders', 't_bulk', g::text "
          "FROM generate_series(1, 4000) g",
          NULL, NULL);
  c->len = 0;
  c->fd = adm_connect();
  send_all(c->fd, "show locks prefix=db_orders^^^t_bulk^^^ limit=5000\n", 51);
  shutdown(c->fd, SHUT_WR);
  struct timespec pause = {0, 300000000L};
  nanosleep(&pause, NULL); /* let the answer fill the socket buffers */
  a = read_answer(c, 30000);
  assert_int_equal(json_array_size(json_object_get(adm_ok("bulk", a), "locks")), 4000);
  json_decref(a);
  assert_null(read_line(c, 5000, &eof));
  assert_true(eof);
  close(c->fd);
  db_exec("DELETE FROM lock_table WHERE xid = 'bulk:1'", NULL, NULL);

  /* tidy up: the operator rolls it back */
  a = adm_ok("rollback", adm("rollback %s", xid));
  json_decref(a);
  expect_history(xid, TXP_GS_ROLLBACKED);
  cli_close(&cl);
  free(c);

  a = adm_ok("stats", adm("stats"));
  json_t *as = json_object_get(a, "admin");
  assert_true(ji(as, "bad_requests") >= 4);
  json_decref(a);
}

/* The states every command is checked on (see make_states). */
typedef struct states {
  char begin[TXP_MAX_XID_LEN + 1];     /* Begin, 2 branches, 2 locks */
  int64_t begin_b1, begin_b2;
  char dirty[TXP_MAX_XID_LEN + 1];     /* RollbackFailed (DIRTY_WRITE) */
  int64_t dirty_b1, dirty_b2;
  char cretry[TXP_MAX_XID_LEN + 1];    /* CommitRetrying: a branch on db_nobody */
  int64_t cretry_ok, cretry_nobody;
  char rretry[TXP_MAX_XID_LEN + 1];    /* RollbackRetrying: db_nobody */
  char tretry[TXP_MAX_XID_LEN + 1];    /* TimeoutRollbackRetrying: db_nobody */
  char silent[TXP_MAX_XID_LEN + 1];    /* Rollbacking: the RM holds its answer */
  char committed[TXP_MAX_XID_LEN + 1]; /* finished: Committed */
  char cfailed[TXP_MAX_XID_LEN + 1];   /* CommitFailed: an unretryable commit */
  int64_t cfailed_b;
  char tfailed[TXP_MAX_XID_LEN + 1];   /* TimeoutRollbackFailed: a dirty timeout rollback */
  int64_t tfailed_b;
  char async[TXP_MAX_XID_LEN + 1];     /* AsyncCommitting: the RM holds its commit answer */
  char rolled[TXP_MAX_XID_LEN + 1];    /* finished: Rollbacked */
} states_t;

static states_t S;
static cli_t g_cl;
static txc_t *g_silent_tm; /* its GlobalRollback waits for the silent RM */
static txc_t *g_async_tm;  /* its GlobalCommit too */

/* A session of one branch (no commit work) on 'resource' 'keys'. */
static int64_t begin_with_branch(const cli_t *cl, uint32_t timeout_ms, const char *name, char *xid,
                                 const char *resource, const char *keys) {
  begin_ok(cl->tm, timeout_ms, name, xid);
  return register_ok(cl->rm, xid, resource, keys);
}

static void make_states(void) {
  cli_t *cl = &g_cl;
  cli_open(cl, "states");
  int status;
  /* Begin */
  begin_ok(cl->tm, 600000, "adm-begin", S.begin);
  S.begin_b1 = register_ok(cl->rm, S.begin, "db_orders", "t_adm:1");
  S.begin_b2 = register_ok(cl->rm, S.begin, "db_stock", "t_adm:2");
  /* RollbackFailed */
  begin_ok(cl->tm, 600000, "adm-dirty", S.dirty);
  S.dirty_b1 = register_ok(cl->rm, S.dirty, "db_orders", "t_adm:3");
  S.dirty_b2 = register_ok(cl->rm, S.dirty, "db_stock", "t_adm:4");
  rmsim_dirty(g_rm, S.dirty_b1);
  assert_int_equal(txc_rollback(cl->tm, S.dirty, &status), 0);
  assert_int_equal(status, TXP_GS_ROLLBACK_FAILED);
  /* CommitRetrying (branches with commit work: an AT commit without is
   * finished at its decision) */
  begin_ok(cl->tm, 600000, "adm-cretry", S.cretry);
  S.cretry_ok = register_sync_ok(cl->rm, S.cretry, "db_orders", "t_adm:5");
  S.cretry_nobody = register_sync_ok(cl->rm, S.cretry, "db_nobody", "t_adm:6");
  assert_int_equal(txc_commit(cl->tm, S.cretry, &status), 0);
  expect_status(S.cretry, TXP_GS_COMMIT_RETRYING);
  /* RollbackRetrying */
  begin_with_branch(cl, 600000, "adm-rretry", S.rretry, "db_nobody", "t_adm:7");
  assert_int_equal(txc_rollback(cl->tm, S.rretry, &status), 0);
  expect_status(S.rretry, TXP_GS_ROLLBACK_RETRYING);
  /* TimeoutRollbackRetrying */
  begin_with_branch(cl, 300, "adm-tretry", S.tretry, "db_nobody", "t_adm:8");
  expect_status(S.tretry, TXP_GS_TIMEOUT_ROLLBACK_RETRYING);
  /* CommitFailed */
  begin_ok(cl->tm, 600000, "adm-cfailed", S.cfailed);
  S.cfailed_b = register_sync_ok(cl->rm, S.cfailed, "db_orders", "t_adm:13");
  rmsim_dirty(g_rm, S.cfailed_b);
  assert_int_equal(txc_commit(cl->tm, S.cfailed, &status), 0);
  expect_status(S.cfailed, TXP_GS_COMMIT_FAILED);
  /* TimeoutRollbackFailed */
  begin_ok(cl->tm, 300, "adm-tfailed", S.tfailed);
  S.tfailed_b = register_ok(cl->rm, S.tfailed, "db_stock", "t_adm:14");
  rmsim_dirty(g_rm, S.tfailed_b);
  expect_status(S.tfailed, TXP_GS_TIMEOUT_ROLLBACK_FAILED);
  /* finished: Committed and Rollbacked */
  begin_with_branch(cl, 600000, "adm-committed", S.committed, "db_orders", "t_adm:10");
  assert_int_equal(txc_commit(cl->tm, S.committed, &status), 0);
  expect_history(S.committed, TXP_GS_COMMITTED);
  begin_with_branch(cl, 600000, "adm-rolled", S.rolled, "db_stock", "t_adm:11");
  assert_int_equal(txc_rollback(cl->tm, S.rolled, &status), 0);
  assert_int_equal(status, TXP_GS_ROLLBACKED);
  /* Rollbacking: the RM holds its answer (for up to the TC's 10 s call
   * timeout; then the session goes RollbackRetrying) */
  begin_with_branch(cl, 600000, "adm-silent", S.silent, "db_orders", "t_adm:9");
  rmsim_modes(g_rm, false, true);
  g_silent_tm = client(false, "silent-tm");
  send_rollback_nowait(g_silent_tm, S.silent);
  expect_status(S.silent, TXP_GS_ROLLBACKING);
  adm_refused("rollback rollbacking", adm("rollback %s", S.silent), "refused", "already Rollbacking");
  /* AsyncCommitting: the commit answer of a branch with commit work is
   * held too (its TM waits for that phase two: sent without waiting). */
  begin_ok(cl->tm, 600000, "adm-async", S.async);
  register_sync_ok(cl->rm, S.async, "db_stock", "t_adm:15");
  rmsim_modes(g_rm, true, true);
  g_async_tm = client(false, "async-tm");
  send_commit_nowait(g_async_tm, S.async);
  expect_status(S.async, TXP_GS_ASYNC_COMMITTING);
  adm_refused("commit async", adm("commit %s", S.async), "refused", "already AsyncCommitting");
  adm_refused("rollback async", adm("rollback %s", S.async), "refused", "the decision was commit");
  /* stopped while its phase two is in flight */
  adm_repaired("stop async", adm("stop-retry %s", S.async), "AsyncCommitting", "StopCommitRetry", NULL);
}

static void test_show(void **state) {
  (void)state;
  make_states();
  json_t *a, *g, *list, *o;

  /* ---- show globals: every live state, field by field */
  a = adm_ok("globals", adm("show globals limit=10000"));
  list = json_object_get(a, "globals");
  assert_false(json_is_true(json_object_get(a, "truncated")));
  assert_int_equal(ji(a, "count"), (long long)json_array_size(list));
  g = find_by(list, "xid", S.begin);
  assert_non_null(g);
  assert_string_equal(js(g, "status"), "Begin");
  assert_int_equal(ji(g, "status_code"), TXP_GS_BEGIN);
  assert_string_equal(js(g, "name"), "adm-begin");
  assert_string_equal(js(g, "application_id"), "test-app");
  assert_int_equal(ji(g, "node_id"), 1);
  assert_int_equal(ji(g, "timeout_ms"), 600000);
  assert_int_equal(ji(g, "branches"), 2);
  assert_int_equal(ji(g, "locks"), 2);
  assert_int_equal(ji(g, "retry_count"), 0);
  assert_true(json_is_null(json_object_get(g, "last_error")));
  assert_true(json_is_null(json_object_get(g, "next_retry_at")));
  assert_true(json_is_false(json_object_get(g, "timed_out")));
  assert_true(json_is_true(json_object_get(g, "live")));
  assert_true(json_number_value(json_object_get(g, "age_s")) >= 0);
  assert_true(strlen(js(g, "begin_time")) == 24 && js(g, "begin_time")[23] == 'Z');
  char tid[32];
  snprintf(tid, sizeof(tid), "%lld", ji(g, "transaction_id"));
  assert_non_null(strstr(S.begin, tid));

  g = find_by(list, "xid", S.dirty);
  assert_string_equal(js(g, "status"), "RollbackFailed");
  assert_non_null(strstr(js(g, "last_error"), "DIRTY_WRITE"));
  assert_int_equal(ji(g, "locks"), 2);
  assert_true(json_is_null(json_object_get(g, "next_retry_at")));
  g = find_by(list, "xid", S.cretry);
  assert_string_equal(js(g, "status"), "CommitRetrying");
  assert_non_null(strstr(js(g, "last_error"), "db_nobody"));
  assert_true(ji(g, "retry_count") >= 1);
  assert_true(json_is_string(json_object_get(g, "next_retry_at")));
  assert_int_equal(ji(g, "locks"), 0); /* commit released them */
  g = find_by(list, "xid", S.rretry);
  assert_string_equal(js(g, "status"), "RollbackRetrying");
  g = find_by(list, "xid", S.tretry);
  assert_string_equal(js(g, "status"), "TimeoutRollbackRetrying");
  assert_true(json_is_true(json_object_get(g, "timed_out")));
  g = find_by(list, "xid", S.silent);
  assert_true(strcmp(js(g, "status"), "Rollbacking") == 0 || strcmp(js(g, "status"), "RollbackRetrying") == 0);
  assert_null(find_by(list, "xid", S.committed)); /* finished: not live */
  g = find_by(list, "xid", S.cfailed);
  assert_string_equal(js(g, "status"), "CommitFailed");
  assert_non_null(strstr(js(g, "last_error"), "BRANCH_UNRETRYABLE"));
  g = find_by(list, "xid", S.tfailed);
  assert_string_equal(js(g, "status"), "TimeoutRollbackFailed");
  assert_non_null(strstr(js(g, "last_error"), "DIRTY_WRITE"));
  assert_int_equal(ji(g, "locks"), 1); /* kept for the operator */
  g = find_by(list, "xid", S.async);
  assert_string_equal(js(g, "status"), "StopCommitRetry");
  assert_true(json_is_null(json_object_get(g, "next_retry_at")));
  json_decref(a);

  /* filters */
  a = adm_ok("globals by status", adm("show globals status=RollbackFailed,CommitRetrying"));
  list = json_object_get(a, "globals");
  size_t i;
  json_array_foreach(list, i, o) {
    const char *s = js(o, "status");
    assert_true(strcmp(s, "RollbackFailed") == 0 || strcmp(s, "CommitRetrying") == 0);
  }
  assert_non_null(find_by(list, "xid", S.dirty));
  assert_non_null(find_by(list, "xid", S.cretry));
  json_decref(a);
  a = adm_ok("globals by name", adm("show globals name=adm-begin status=1"));
  list = json_object_get(a, "globals");
  assert_int_equal(json_array_size(list), 1);
  assert_string_equal(js(json_array_get(list, 0), "xid"), S.begin);
  json_decref(a);
  a = adm_ok("globals by age", adm("show globals name=adm-begin min_age=3600"));
  assert_int_equal(json_array_size(json_object_get(a, "globals")), 0);
  json_decref(a);
  a = adm_ok("globals limit", adm("show globals limit=1"));
  assert_int_equal(json_array_size(json_object_get(a, "globals")), 1);
  assert_true(json_is_true(json_object_get(a, "truncated")));
  json_decref(a);

  /* ---- show global: the Begin one */
  a = adm_ok("show begin", adm("show global %s", S.begin));
  g = json_object_get(a, "global");
  assert_string_equal(js(g, "xid"), S.begin);
  assert_string_equal(js(g, "status"), "Begin");
  list = json_object_get(a, "branches");
  assert_int_equal(json_array_size(list), 2);
  o = find_branch(list, S.begin_b1);
  assert_non_null(o);
  assert_string_equal(js(o, "resource_id"), "db_orders");
  assert_string_equal(js(o, "branch_type"), "AT");
  assert_string_equal(js(o, "status"), "Registered");
  assert_int_equal(ji(o, "status_code"), TXP_BS_REGISTERED);
  assert_string_equal(js(o, "client_id"), "states-rm");
  assert_int_equal(ji(o, "retry_count"), 0);
  assert_true(json_is_null(json_object_get(o, "last_error")));
  assert_string_equal(js(o, "lock_keys"), "t_adm:1");
  o = find_branch(list, S.begin_b2);
  assert_string_equal(js(o, "resource_id"), "db_stock");
  list = json_object_get(a, "locks");
  assert_int_equal(json_array_size(list), 2);
  o = find_by(list, "row_key", "db_orders^^^t_adm^^^1");
  assert_non_null(o);
  assert_int_equal(ji(o, "branch_id"), S.begin_b1);
  assert_string_equal(js(o, "resource_id"), "db_orders");
  assert_string_equal(js(o, "table"), "t_adm");
  assert_string_equal(js(o, "pk"), "1");
  assert_string_equal(js(o, "status"), "locked");
  assert_non_null(find_by(list, "row_key", "db_stock^^^t_adm^^^2"));
  assert_int_equal(json_array_size(json_object_get(a, "waiters")), 0);
  json_decref(a);

  /* the dirty one: branch statuses, last errors, rollbacking locks */
  a = adm_ok("show dirty", adm("show global %s", S.dirty));
  g = json_object_get(a, "global");
  assert_string_equal(js(g, "status"), "RollbackFailed");
  assert_int_equal(ji(g, "status_code"), TXP_GS_ROLLBACK_FAILED);
  list = json_object_get(a, "branches");
  o = find_branch(list, S.dirty_b1);
  assert_string_equal(js(o, "status"), "PhaseTwoRollbackFailedUnretryable");
  assert_non_null(strstr(js(o, "last_error"), "DIRTY_WRITE"));
  o = find_branch(list, S.dirty_b2);
  assert_string_equal(js(o, "status"), "PhaseTwoRollbacked");
  list = json_object_get(a, "locks");
  assert_int_equal(json_array_size(list), 2);
  assert_string_equal(js(json_array_get(list, 0), "status"), "rollbacking");
  json_decref(a);

  /* the commit-retrying one */
  a = adm_ok("show cretry", adm("show global %s", S.cretry));
  list = json_object_get(a, "branches");
  assert_string_equal(js(find_branch(list, S.cretry_ok), "status"), "PhaseTwoCommitted");
  o = find_branch(list, S.cretry_nobody);
  assert_string_equal(js(o, "status"), "PhaseTwoCommitFailedRetryable");
  assert_non_null(strstr(js(o, "last_error"), "no resource manager connected for resource \"db_nobody\""));
  assert_int_equal(json_array_size(json_object_get(a, "locks")), 0);
  json_decref(a);

  /* the unretryable commit */
  a = adm_ok("show cfailed", adm("show global %s", S.cfailed));
  o = find_branch(json_object_get(a, "branches"), S.cfailed_b);
  assert_string_equal(js(o, "status"), "PhaseTwoCommitFailedUnretryable");
  assert_non_null(strstr(js(o, "last_error"), "undo log unreadable"));
  json_decref(a);

  /* a finished one, from history */
  a = adm_ok("show committed", adm("show global %s", S.committed));
  g = json_object_get(a, "global");
  assert_string_equal(js(g, "status"), "Committed");
  assert_true(json_is_false(json_object_get(g, "live")));
  assert_true(json_is_string(json_object_get(g, "end_time")));
  list = json_object_get(a, "branches");
  assert_int_equal(json_array_size(list), 1);
  assert_string_equal(js(json_array_get(list, 0), "status"), "PhaseTwoCommitted");
  assert_string_equal(js(json_array_get(list, 0), "resource_id"), "db_orders");
  assert_int_equal(ji(a, "leftover_branches"), 0);
  json_decref(a);
  adm_refused("show unknown", adm("show global nowhere:1"), "not_found", "\"nowhere:1\" not found");

  /* ---- show locks: by xid, key, prefix */
  a = adm_ok("locks by xid", adm("show locks xid=%s", S.begin));
  list = json_object_get(a, "locks");
  assert_int_equal(json_array_size(list), 2);
  json_array_foreach(list, i, o) {
    assert_string_equal(js(o, "xid"), S.begin);
    assert_string_equal(js(o, "holder_status"), "Begin");
    assert_true(json_is_false(json_object_get(o, "orphan")));
  }
  json_decref(a);
  a = adm_ok("locks by key", adm("show locks key=db_orders^^^t_adm^^^3"));
  list = json_object_get(a, "locks");
  assert_int_equal(json_array_size(list), 1);
  assert_string_equal(js(json_array_get(list, 0), "xid"), S.dirty);
  assert_string_equal(js(json_array_get(list, 0), "status"), "rollbacking");
  assert_string_equal(js(json_array_get(list, 0), "holder_status"), "RollbackFailed");
  json_decref(a);
  a = adm_ok("locks by prefix", adm("show locks prefix=db_stock^^^t_adm^^^ limit=1000"));
  list = json_object_get(a, "locks");
  assert_true(json_array_size(list) >= 2); /* t_adm:2 (begin) and t_adm:4 (dirty) */
  json_array_foreach(list, i, o) assert_int_equal(strncmp(js(o, "row_key"), "db_stock^^^t_adm^^^", 19), 0);
  json_decref(a);

  /* ---- show nodes */
  a = adm_ok("nodes", adm("show nodes"));
  g = json_object_get(a, "self");
  assert_int_equal(ji(g, "node_id"), 1);
  assert_true(json_is_true(json_object_get(g, "serving")));
  assert_true(json_is_true(json_object_get(g, "leader"))); /* the only node */
  assert_string_equal(js(g, "admin_socket"), g_sock);
  assert_int_equal(ji(g, "pid"), g_tcd.pid);
  char addr[64];
  snprintf(addr, sizeof(addr), "%s:%d", HOST, g_tcd.port);
  assert_string_equal(js(g, "address"), addr);
  list = json_object_get(a, "nodes");
  o = NULL;
  json_array_foreach(list, i, g) if (ji(g, "node_id") == 1) o = g;
  if (o) { /* node_table is written by the membership, when it runs */
    assert_true(json_is_true(json_object_get(o, "self")));
    assert_string_equal(js(o, "address"), addr);
    assert_string_equal(js(o, "state"), "up"); /* a live store session, a fresh heartbeat */
  }
  json_decref(a);

  /* ---- stats */
  a = adm_ok("stats", adm("stats"));
  g = json_object_get(a, "globals");
  assert_true(ji(g, "begun") >= 8);
  assert_true(ji(g, "committed") >= 2);
  assert_true(ji(g, "rolled_back") >= 3);
  assert_true(ji(g, "timed_out") >= 1);
  assert_true(ji(g, "rollback_failed") >= 1);
  g = json_object_get(a, "sessions");
  assert_true(ji(g, "Begin") >= 1);
  assert_true(ji(g, "RollbackFailed") >= 1);
  assert_true(ji(g, "CommitRetrying") >= 1);
  assert_true(ji(json_object_get(a, "server"), "rms") >= 2);
  assert_true(json_is_true(json_object_get(json_object_get(a, "node"), "leader")));
  json_decref(a);
}

static void test_repairs(void **state) {
  (void)state;
  json_t *a;
  /* ---- refusals: each names the reason and changes nothing */
  adm_refused("rollback committing", adm("rollback %s", S.cretry), "refused", "the decision was commit");
  assert_int_equal(db_long(SQL_STATUS, S.cretry, NULL), TXP_GS_COMMIT_RETRYING);
  adm_refused("commit rolling back", adm("commit %s", S.dirty), "refused", "would break atomicity");
  assert_int_equal(db_long(SQL_STATUS, S.dirty, NULL), TXP_GS_ROLLBACK_FAILED);
  adm_refused("commit rretry", adm("commit %s", S.rretry), "refused", "the decision was rollback");
  adm_refused("redrive begin", adm("redrive %s", S.begin), "refused", "not decided yet");
  adm_refused("stop begin", adm("stop-retry %s", S.begin), "refused", "not in phase two");
  adm_refused("stop failed", adm("stop-retry %s", S.dirty), "refused", "no retry is scheduled");
  adm_refused("resume", adm("resume-retry %s", S.cretry), "refused", "not stopped");
  adm_refused("delete live", adm("delete %s", S.begin), "refused", "is live (Begin)");
  adm_refused("rollback finished", adm("rollback %s", S.committed), "refused", "already finished (Committed)");
  adm_refused("commit unknown", adm("commit nowhere:2"), "not_found", "\"nowhere:2\" not found");
  assert_int_equal(db_long(SQL_STATUS, S.begin, NULL), TXP_GS_BEGIN);
  assert_int_equal(db_long(SQL_LOCKS, S.begin, NULL), 2);
  assert_true(tcd_proc_log_has(&g_tcd, "refused: could not roll back global transaction"));

  /* a committed branch under a rollback: the planner and the SQL guard */
  char bid[32];
  snprintf(bid, sizeof(bid), "%" PRId64, S.dirty_b2);
  db_exec("UPDATE branch_table SET status = 5 WHERE branch_id = $1::bigint", bid, NULL);
  adm_refused("rollback with committed branch", adm("rollback %s", S.dirty), "refused",
              "a branch is already PhaseTwoCommitted");
  char res[64];
  db_text("SELECT result FROM tc_admin_cas($1, 13::smallint, 5::smallint, 'lease', 1000, '{5}')", S.dirty, res,
          sizeof(res));
  assert_string_equal(res, "branch");
  db_text("SELECT result FROM tc_admin_cas($1, 5::smallint, 5::smallint, 'lease', 1000, '{}')", S.dirty, res,
          sizeof(res));
  assert_string_equal(res, "changed"); /* it is 13, not 5 */
  db_exec("UPDATE branch_table SET status = 8 WHERE branch_id = $1::bigint", bid, NULL);
  assert_int_equal(db_long(SQL_STATUS, S.dirty, NULL), TXP_GS_ROLLBACK_FAILED);

  /* ---- force rollback of a failed rollback: still dirty, fails again */
  rmsim_dirty(g_rm, S.dirty_b1);
  int before = rmsim_count(g_rm, false);
  a = adm_ok("rollback dirty", adm("rollback %s", S.dirty));
  assert_string_equal(js(a, "action"), "rollback");
  assert_string_equal(js(a, "from"), "RollbackFailed");
  assert_string_equal(js(a, "to"), "RollbackRetrying");
  assert_string_equal(js(a, "status"), "RollbackFailed");
  assert_true(json_is_false(json_object_get(a, "finished")));
  json_decref(a);
  assert_true(rmsim_count(g_rm, false) > before);
  assert_int_equal(db_long(SQL_STATUS, S.dirty, NULL), TXP_GS_ROLLBACK_FAILED);
  assert_true(tcd_proc_log_has(&g_tcd, "operator uid 0"));
  assert_true(tcd_proc_log_has(&g_tcd, "RollbackFailed -> RollbackRetrying"));
  /* the data is repaired: re-drive finishes it */
  rmsim_dirty(g_rm, 0);
  a = adm_ok("redrive dirty", adm("redrive %s", S.dirty));
  assert_string_equal(js(a, "status"), "Rollbacked");
  assert_true(json_is_true(json_object_get(a, "finished")));
  json_decref(a);
  expect_history(S.dirty, TXP_GS_ROLLBACKED);
  assert_int_equal(db_long(SQL_LOCKS, S.dirty, NULL), 0);

  /* ---- stop and resume: the leader leaves a stopped session alone */
  adm_repaired("stop rretry", adm("stop-retry %s", S.rretry), "RollbackRetrying", "StopRollbackRetry", NULL);
  assert_int_equal(db_long(SQL_STATUS, S.rretry, NULL), TXP_GS_STOP_ROLLBACK_RETRY);
  assert_int_equal(db_long("SELECT count(*) FROM global_table WHERE xid = $1 AND next_retry_at IS NULL", S.rretry,
                           NULL),
                   1);
  long r0 = db_long(SQL_RETRIES, S.rretry, NULL);
  a = adm_ok("stop cretry", adm("stop-retry %s", S.cretry));
  assert_string_equal(js(a, "to"), "StopCommitRetry");
  json_decref(a);
  long c0 = db_long(SQL_RETRIES, S.cretry, NULL);
  /* several recovery intervals (200 ms) and retry delays (<= 400 ms) */
  double until = now_ms() + 1500;
  while (now_ms() < until) nap();
  assert_int_equal(db_long(SQL_RETRIES, S.rretry, NULL), r0);
  assert_int_equal(db_long(SQL_RETRIES, S.cretry, NULL), c0);
  adm_refused("stop twice", adm("stop-retry %s", S.rretry), "refused", "already stopped");
  adm_repaired("resume rretry", adm("resume-retry %s", S.rretry), "StopRollbackRetry", "RollbackRetrying", NULL);
  /* the leader retries it again (still no RM: the count goes up) */
  double deadline = now_ms() + WAIT_MS;
  while (db_long(SQL_RETRIES, S.rretry, NULL) <= r0) {
    if (now_ms() > deadline) fail_msg("resumed session %s was not retried", S.rretry);
    nap();
  }

  /* ---- the missing RM comes: a stopped commit is re-driven to the end,
   * the resumed rollback and the timed-out one finish */
  rm_start(g_late);
  adm_repaired("redrive cretry", adm("redrive %s", S.cretry), "StopCommitRetry", "CommitRetrying", "Committed");
  expect_history(S.cretry, TXP_GS_COMMITTED);
  a = adm("rollback %s", S.tretry);
  if (json_is_true(json_object_get(a, "ok"))) {
    /* (a retry of the leader may finish it alongside: then this drive
     * stops where it stood) */
    assert_string_equal(js(a, "from"), "TimeoutRollbackRetrying");
    assert_true(strcmp(js(a, "status"), "TimeoutRollbacked") == 0 ||
                strcmp(js(a, "status"), "TimeoutRollbackRetrying") == 0);
    json_decref(a);
  } else {
    /* the leader's retry got there first */
    adm_refused("rollback tretry", a, "refused", "already finished (TimeoutRollbacked)");
  }
  expect_history(S.tretry, TXP_GS_TIMEOUT_ROLLBACKED);
  expect_history(S.rretry, TXP_GS_ROLLBACKED);

  /* ---- a commit that failed for good: refused as a rollback, forced
   * (re-driven) as a commit once the RM can do it */
  adm_refused("rollback cfailed", adm("rollback %s", S.cfailed), "refused", "the decision was commit");
  rmsim_dirty(g_rm, 0);
  adm_repaired("commit cfailed", adm("commit %s", S.cfailed), "CommitFailed", "CommitRetrying", "Committed");
  expect_history(S.cfailed, TXP_GS_COMMITTED);
  /* a timeout rollback that failed for good */
  adm_refused("commit tfailed", adm("commit %s", S.tfailed), "refused", "the decision was rollback");
  adm_repaired("redrive tfailed", adm("redrive %s", S.tfailed), "TimeoutRollbackFailed", "TimeoutRollbackRetrying",
               "TimeoutRollbacked");
  expect_history(S.tfailed, TXP_GS_TIMEOUT_ROLLBACKED);

  /* ---- the commit stopped in flight: the RM answers, the branch is
   * recorded, the session stays stopped until resumed */
  rmsim_modes(g_rm, false, false);
  char ab[64];
  double until2 = now_ms() + WAIT_MS;
  for (;;) {
    /* 5: the held answer came; 6: the TC's call timed out first */
    db_text("SELECT string_agg(status::text, ',') FROM branch_table WHERE xid = $1", S.async, ab, sizeof(ab));
    if (strcmp(ab, "5") == 0 || strcmp(ab, "6") == 0) break;
    if (now_ms() > until2) fail_msg("the held commit of %s was not recorded (branches: %s)", S.async, ab);
    nap();
  }
  assert_int_equal(db_long(SQL_STATUS, S.async, NULL), TXP_GS_STOP_COMMIT_RETRY);
  a = adm_ok("resume async", adm("resume-retry %s", S.async));
  assert_string_equal(js(a, "to"), "CommitRetrying");
  json_decref(a);
  expect_history(S.async, TXP_GS_COMMITTED);

  /* ---- force decisions from Begin */
  int commits = rmsim_count(g_rm, true);
  a = adm_ok("commit begin", adm("commit %s", S.begin));
  assert_string_equal(js(a, "from"), "Begin");
  /* AT branches without commit work: finished by the decision, told after */
  assert_string_equal(js(a, "to"), "Committed");
  assert_string_equal(js(a, "status"), "Committed");
  assert_true(json_is_true(json_object_get(a, "finished")));
  json_decref(a);
  expect_history(S.begin, TXP_GS_COMMITTED);
  double until3 = now_ms() + WAIT_MS;
  while (rmsim_count(g_rm, true) < commits + 2 && now_ms() < until3) nap();
  assert_int_equal(rmsim_count(g_rm, true), commits + 2);
  assert_true(tcd_proc_log_has(&g_tcd, "Begin -> Committed (forced decision)"));
  char x[TXP_MAX_XID_LEN + 1];
  begin_ok(g_cl.tm, 600000, "adm-force-rb", x);
  register_ok(g_cl.rm, x, "db_orders", "t_adm:20");
  register_ok(g_cl.rm, x, "db_nobody", "t_adm:21");
  a = adm_ok("rollback begin", adm("rollback %s", x));
  assert_string_equal(js(a, "to"), "Rollbacking");
  assert_string_equal(js(a, "status"), "Rollbacked");
  json_decref(a);
  expect_history(x, TXP_GS_ROLLBACKED);
  /* the TM hears of it */
  int status = -1;
  assert_int_equal(txc_status(g_cl.tm, x, &status), 0);
  assert_int_equal(status, TXP_GS_ROLLBACKED);

  /* ---- the held rollback: the RM answers at last */
  rmsim_modes(g_rm, false, false);
  expect_history(S.silent, TXP_GS_ROLLBACKED);
  txc_close(g_silent_tm);
  g_silent_tm = NULL;
  txc_close(g_async_tm);
  g_async_tm = NULL;

  /* ---- leftovers: orphan rows of an unknown xid and of a finished one */
  db_exec("INSERT INTO lock_table (row_key, xid, transaction_id, branch_id, resource_id, table_name, pk) "
          "VALUES ('db_orders^^^t_orphan^^^1', 'ghost:1', 0, 1, 'db_orders', 't_orphan', '1')",
          NULL, NULL);
  db_exec("INSERT INTO branch_table (branch_id, xid, transaction_id, resource_id, status) "
          "VALUES (-77, 'ghost:1', 0, 'db_orders', 2)",
          NULL, NULL);
  db_exec("INSERT INTO lock_table (row_key, xid, transaction_id, branch_id, resource_id, table_name, pk) "
          "VALUES ('db_orders^^^t_orphan^^^2', $1, 0, 1, 'db_orders', 't_orphan', '2')",
          S.committed, NULL);
  a = adm_ok("orphan lock", adm("show locks key=db_orders^^^t_orphan^^^1"));
  json_t *l = json_array_get(json_object_get(a, "locks"), 0);
  assert_true(json_is_true(json_object_get(l, "orphan")));
  assert_true(json_is_null(json_object_get(l, "holder_status")));
  json_decref(a);
  a = adm_ok("show ghost", adm("show global ghost:1"));
  assert_true(json_is_null(json_object_get(a, "global")));
  assert_true(json_is_true(json_object_get(a, "orphan")));
  assert_int_equal(json_array_size(json_object_get(a, "branches")), 1);
  assert_int_equal(json_array_size(json_object_get(a, "locks")), 1);
  json_decref(a);
  a = adm_ok("delete ghost", adm("delete ghost:1"));
  assert_int_equal(ji(json_object_get(a, "deleted"), "locks"), 1);
  assert_int_equal(ji(json_object_get(a, "deleted"), "branches"), 1);
  assert_true(json_is_null(json_object_get(a, "history_status")));
  json_decref(a);
  assert_int_equal(db_long(SQL_LOCKS, "ghost:1", NULL), 0);
  assert_int_equal(db_long("SELECT count(*) FROM branch_table WHERE xid = $1", "ghost:1", NULL), 0);
  adm_refused("delete ghost twice", adm("delete ghost:1"), "not_found", "not found");
  a = adm_ok("show leftover", adm("show global %s", S.committed));
  assert_int_equal(json_array_size(json_object_get(a, "locks")), 1);
  json_decref(a);
  a = adm_ok("delete leftover", adm("delete %s", S.committed));
  assert_int_equal(ji(json_object_get(a, "deleted"), "locks"), 1);
  assert_string_equal(js(a, "history_status"), "Committed");
  json_decref(a);
  assert_int_equal(db_long(SQL_LOCKS, S.committed, NULL), 0);
  assert_true(tcd_proc_log_has(&g_tcd, "deleted 1 lock rows and 1 branch rows"));

  a = adm_ok("stats", adm("stats"));
  assert_true(ji(json_object_get(a, "admin"), "repairs") >= 9);
  assert_true(ji(json_object_get(a, "admin"), "refused") >= 10);
  json_decref(a);
  rmsim_stop(g_late);
  cli_close(&g_cl);
}

/* Last: SIGTERM stops tcd cleanly and removes the socket. */
static void test_clean_stop(void **state) {
  (void)state;
  rmsim_stop(g_rm);
  int st = tcd_proc_stop(&g_tcd, 15000);
  if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) fail_msg("tcd did not exit cleanly: 0x%x", st);
  struct stat sb;
  assert_int_equal(stat(g_sock, &sb), -1);
  assert_int_equal(errno, ENOENT);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup_teardown(test_access_control, suite_test_setup, suite_test_teardown),
    cmocka_unit_test_setup_teardown(test_framing, suite_test_setup, suite_test_teardown),
    cmocka_unit_test_setup_teardown(test_show, suite_test_setup, suite_test_teardown),
    cmocka_unit_test_setup_teardown(test_repairs, suite_test_setup, suite_test_teardown),
    cmocka_unit_test(test_clean_stop),
  };
  return cmocka_run_group_tests_name("admin", tests, suite_group_setup, suite_group_teardown);
}
