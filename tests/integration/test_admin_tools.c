/*
 * test_admin_tools.c - the operator's tools on a running tcd: the lock-wait
 * queue as the admin socket and the metrics show it, the metrics endpoint
 * (/metrics, /healthz, /readyz), and tcctl (tables, --json, exit codes,
 * --help, a repair).
 *
 * NOTES
 *   The fixture (a real tcd with an admin socket and metrics on a real
 *   PostgreSQL, the simulated RMs, the clients) is admin_suite.h, shared
 *   with test_admin (the socket, states and repairs).  The metrics test
 *   runs after the lock-wait test, whose admin requests it counts.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "admin_suite.h"
#include "tc_lockwait.h"

/* ----------------------------------------------------------------- HTTP */

typedef struct {
  int code;
  char *body;
} http_t;

static http_t http(const char *method, const char *path) {
  http_t h = {0, NULL};
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in sa;
  memset(&sa, 0, sizeof(sa));
  sa.sin_family = AF_INET;
  sa.sin_port = htons((uint16_t)g_tcd.metrics_port);
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) fail_msg("metrics connect: %s", strerror(errno));
  char req[256];
  int n = snprintf(req, sizeof(req), "%s %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n", method, path);
  send_all(fd, req, (size_t)n);
  size_t cap = 1 << 20, len = 0;
  char *buf = malloc(cap);
  for (;;) {
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, 10000) <= 0) break;
    ssize_t k = recv(fd, buf + len, cap - len - 1, 0);
    if (k <= 0) break;
    len += (size_t)k;
  }
  close(fd);
  buf[len] = '\0';
  if (sscanf(buf, "HTTP/1.%*d %d", &h.code) != 1) fail_msg("bad HTTP answer: %.200s", buf);
  char *body = strstr(buf, "\r\n\r\n");
  h.body = strdup(body ? body + 4 : "");
  free(buf);
  return h;
}

/* Parsed /metrics: one entry per sample line ("name{labels}" -> value). */
typedef struct {
  char series[512];
  double v;
} sample_t;

typedef struct {
  sample_t *s;
  int n;
} scrape_t;

static bool name_char(char c, bool first) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':' || (!first && c >= '0' && c <= '9');
}

/* Scrape and validate the format: every sample is "name[{labels}] value",
 * names are txc_*, and each sample's family has a # TYPE line first. */
static scrape_t scrape(void) {
  http_t h = http("GET", "/metrics");
  assert_int_equal(h.code, 200);
  scrape_t sc = {calloc(4096, sizeof(sample_t)), 0};
  char typed[256][128];
  int ntyped = 0;
  char *save = NULL;
  for (char *line = strtok_r(h.body, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
    if (line[0] == '#') {
      char fam[128], type[32];
      if (sscanf(line, "# TYPE %127s %31s", fam, type) == 2) {
        assert_true(strcmp(type, "counter") == 0 || strcmp(type, "gauge") == 0 || strcmp(type, "histogram") == 0 ||
                    strcmp(type, "summary") == 0);
        assert_true(ntyped < 256);
        snprintf(typed[ntyped++], sizeof(typed[0]), "%s", fam);
      } else if (strncmp(line, "# HELP ", 7) != 0) {
        fail_msg("unexpected comment line: %s", line);
      }
      continue;
    }
    const char *p = line;
    if (!name_char(*p, true)) fail_msg("bad sample line: %s", line);
    while (name_char(*p, false)) p++;
    size_t namelen = (size_t)(p - line);
    if (*p == '{') {
      const char *close = strchr(p, '}');
      if (!close) fail_msg("unterminated labels: %s", line);
      p = close + 1;
    }
    if (*p != ' ') fail_msg("no value separator: %s", line);
    char *end;
    double v = strtod(p + 1, &end);
    if (end == p + 1 || *end) fail_msg("bad value: %s", line);
    /* ours, or the standard process_* families (txc_procstat.h) */
    assert_true(strncmp(line, "txc_", 4) == 0 || strncmp(line, "process_", 8) == 0);
    /* the family: the name itself, or without _bucket/_sum/_count */
    char fam[128];
    snprintf(fam, sizeof(fam), "%.*s", (int)namelen, line);
    bool known = false;
    for (int i = 0; i < ntyped && !known; i++) {
      size_t fl = strlen(typed[i]);
      known = strcmp(fam, typed[i]) == 0 ||
              (strncmp(fam, typed[i], fl) == 0 &&
               (strcmp(fam + fl, "_bucket") == 0 || strcmp(fam + fl, "_sum") == 0 || strcmp(fam + fl, "_count") == 0));
    }
    if (!known) fail_msg("sample without a # TYPE line: %s", line);
    assert_true(sc.n < 4096);
    snprintf(sc.s[sc.n].series, sizeof(sc.s[0].series), "%.*s", (int)(p - line), line);
    sc.s[sc.n].v = v;
    sc.n++;
  }
  free(h.body);
  return sc;
}

static double metric(const scrape_t *sc, const char *series) {
  for (int i = 0; i < sc->n; i++)
    if (strcmp(sc->s[i].series, series) == 0) return sc->s[i].v;
  fail_msg("metric %s not found", series);
  return NAN;
}

/* Histogram buckets of 'fam'{label="value"} are cumulative and end in
 * +Inf == _count. */
static void check_histogram(const scrape_t *sc, const char *fam, const char *label, const char *value) {
  char prefix[256];
  snprintf(prefix, sizeof(prefix), "%s_bucket{%s=\"%s\",le=\"", fam, label, value);
  double prev = 0, inf = -1;
  int n = 0;
  for (int i = 0; i < sc->n; i++) {
    if (strncmp(sc->s[i].series, prefix, strlen(prefix)) != 0) continue;
    assert_true(sc->s[i].v >= prev);
    prev = sc->s[i].v;
    n++;
    if (strstr(sc->s[i].series, "le=\"+Inf\"")) inf = sc->s[i].v;
  }
  assert_true(n >= 2);
  char cnt[256];
  snprintf(cnt, sizeof(cnt), "%s_count{%s=\"%s\"}", fam, label, value);
  assert_true(inf == metric(sc, cnt));
}

/* ================================================================ tests */

/* A registration waiting for a lock shows in the holder's wait queue. */
typedef struct waiter_arg {
  char xid[TXP_MAX_XID_LEN + 1];
  const char *key;
  int rc;
  uint32_t waited;
} waiter_arg_t;

/* The clients 'cl' (named 'client') and a global of theirs in Begin (for
 * ten minutes: the test ends it) whose branch in db_orders holds the lock
 * on 'key'. */
static void open_holding(cli_t *cl, const char *client, const char *name, char *xid, const char *key) {
  cli_open(cl, client);
  begin_ok(cl->tm, 600000, name, xid);
  register_ok(cl->rm, xid, "db_orders", key);
}

static void *waiter_main(void *p) {
  waiter_arg_t *w = p;
  txc_t *rm = client(true, "waiter-rm");
  int64_t b;
  w->rc = txc_branch_register(rm, w->xid, "db_orders", w->key, 20000, &b, &w->waited);
  txc_close(rm);
  return NULL;
}

/* The answer of "show locks xid=HOLDER" once it lists one group of
 * waiters (the waiter 'w' queued); fails, saying what the waiter got,
 * after WAIT_MS. */
static json_t *await_waiter(const char *holder, const waiter_arg_t *w) {
  double deadline = now_ms() + WAIT_MS;
  for (;;) {
    json_t *a = adm_ok("locks", adm("show locks xid=%s", holder));
    if (json_array_size(json_object_get(a, "waiters")) == 1) return a;
    json_decref(a);
    if (now_ms() > deadline)
      fail_msg("the waiter %s never showed up in %d ms (its registration: %s)", w->xid, WAIT_MS,
               w->rc == 1 ? "still running" : txp_errname(w->rc));
    nap();
  }
}

static void test_lock_waiters(void **state) {
  (void)state;
  cli_t cl;
  char holder[TXP_MAX_XID_LEN + 1];
  open_holding(&cl, "waits", "adm-holder", holder, "t_wait:1");
  waiter_arg_t w = {.rc = 1, .key = "t_wait:1"};
  begin_ok(cl.tm, 600000, "adm-waiter", w.xid);
  scrape_t before = scrape();
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, waiter_main, &w), 0);
  json_t *a = await_waiter(holder, &w), *q = NULL;
  json_t *grp = json_array_get(json_object_get(a, "waiters"), 0);
  assert_string_equal(js(grp, "holder"), holder);
  q = json_object_get(grp, "queue");
  assert_int_equal(json_array_size(q), 1);
  json_t *wt = json_array_get(q, 0);
  assert_string_equal(js(wt, "xid"), w.xid);
  assert_true(ji(wt, "waiting_ms") >= 0);
  assert_true(ji(wt, "timeout_in_ms") > 10000 && ji(wt, "timeout_in_ms") <= 20000);
  json_decref(a);
  /* the same queue from the key, from the holder, and in the full list */
  a = adm_ok("locks key", adm("show locks key=db_orders^^^t_wait^^^1"));
  assert_int_equal(json_array_size(json_object_get(a, "waiters")), 1);
  json_decref(a);
  a = adm_ok("locks all", adm("show locks"));
  assert_non_null(find_by(json_object_get(a, "waiters"), "holder", holder));
  json_decref(a);
  a = adm_ok("show holder", adm("show global %s", holder));
  assert_int_equal(json_array_size(json_object_get(a, "waiters")), 1);
  assert_string_equal(js(json_array_get(json_object_get(a, "waiters"), 0), "xid"), w.xid);
  json_decref(a);
  a = adm_ok("stats", adm("stats"));
  assert_int_equal(ji(json_object_get(a, "locks"), "waiting"), 1);
  json_decref(a);
  /* the holder commits: the waiter gets the key */
  int status;
  assert_int_equal(txc_commit(cl.tm, holder, &status), 0);
  pthread_join(th, NULL);
  assert_int_equal(w.rc, 0);
  char key_holder[256];
  db_text("SELECT xid FROM lock_table WHERE row_key = $1", "db_orders^^^t_wait^^^1", key_holder, sizeof(key_holder));
  assert_string_equal(key_holder, w.xid);
  /* the snapshot is published every 500 ms: wait for it */
  scrape_t after;
  double until = now_ms() + WAIT_MS;
  for (;;) {
    after = scrape();
    if (metric(&after, "txc_lock_waits_total") >= metric(&before, "txc_lock_waits_total") + 1 &&
        metric(&after, "txc_lock_wait_seconds_total") > metric(&before, "txc_lock_wait_seconds_total"))
      break;
    free(after.s);
    if (now_ms() > until) fail_msg("txc_lock_waits_total or txc_lock_wait_seconds_total did not move");
    nap();
  }
  assert_true(metric(&after, "txc_lock_wait_seconds_total") > metric(&before, "txc_lock_wait_seconds_total"));
  free(before.s);
  free(after.s);
  assert_int_equal(txc_rollback(cl.tm, w.xid, &status), 0);
  cli_close(&cl);
}

/* A waiter whose xid shares its holder's release record in tcd
 * (tc_lockwait_bucket) waits like any other.  Its own conflicting keys,
 * given back in the same step, once counted as its holder's release: it
 * retried at once, met the holder again, and so on until its deadline,
 * never queued (one waiter/holder pair in 1024). */
static void test_lock_waiter_sharing_a_bucket(void **state) {
  (void)state;
  cli_t cl;
  char holder[TXP_MAX_XID_LEN + 1];
  open_holding(&cl, "bucket", "adm-bucket-holder", holder, "t_bucket:1");
  waiter_arg_t w = {.rc = 1, .key = "t_bucket:1"};
  /* New globals until one shares the holder's record: 1 in 1024, each a
   * begin tcd answers at once (the others time out unused). */
  int tries = 0;
  do {
    assert_true(++tries <= 20000);
    begin_ok(cl.tm, 30000, "adm-bucket-waiter", w.xid);
  } while (tc_lockwait_bucket(w.xid) != tc_lockwait_bucket(holder));
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, waiter_main, &w), 0);
  json_t *a = await_waiter(holder, &w);
  json_t *wt = json_array_get(json_object_get(json_array_get(json_object_get(a, "waiters"), 0), "queue"), 0);
  assert_string_equal(js(wt, "xid"), w.xid);
  json_decref(a);
  int status;
  assert_int_equal(txc_commit(cl.tm, holder, &status), 0);
  pthread_join(th, NULL);
  assert_int_equal(w.rc, 0);
  assert_true(w.waited > 0);
  assert_int_equal(txc_rollback(cl.tm, w.xid, &status), 0);
  cli_close(&cl);
}

static void test_metrics(void **state) {
  (void)state;
  http_t h = http("GET", "/healthz");
  assert_int_equal(h.code, 200);
  assert_non_null(strstr(h.body, "loop alive"));
  free(h.body);
  double deadline = now_ms() + WAIT_MS;
  for (;;) {
    h = http("GET", "/readyz");
    if (h.code == 200) break;
    free(h.body);
    if (now_ms() > deadline) fail_msg("/readyz never became ready");
    nap();
  }
  assert_non_null(strstr(h.body, "ready"));
  free(h.body);
  h = http("GET", "/nowhere");
  assert_int_equal(h.code, 404);
  free(h.body);
  h = http("POST", "/metrics");
  assert_int_equal(h.code, 405);
  free(h.body);

  scrape_t a = scrape();
  assert_true(metric(&a, "txc_leader") == 1);
  assert_true(metric(&a, "txc_connections{role=\"rm\"}") >= 1);
  assert_true(metric(&a, "txc_store_reachable") == 1);
  assert_true(metric(&a, "txc_schema_ok") == 1);
  assert_true(metric(&a, "txc_ready") == 1);
  assert_true(metric(&a, "txc_snapshot_age_seconds") < 5);

  /* run transactions of each outcome and some garbage */
  cli_t cl;
  cli_open(&cl, "metrics");
  char x1[TXP_MAX_XID_LEN + 1], x2[TXP_MAX_XID_LEN + 1], x3[TXP_MAX_XID_LEN + 1], x4[TXP_MAX_XID_LEN + 1];
  int status;
  /* A branch with commit work: its commit is a phase-two drive (one
   * without it is finished at its decision, its branches only told). */
  begin_ok(cl.tm, 60000, "m-commit", x1);
  register_sync_ok(cl.rm, x1, "db_orders", "t_m:1");
  assert_int_equal(txc_commit(cl.tm, x1, &status), 0);
  begin_ok(cl.tm, 60000, "m-rollback", x2);
  register_ok(cl.rm, x2, "db_stock", "t_m:2");
  assert_int_equal(txc_rollback(cl.tm, x2, &status), 0);
  assert_int_equal(status, TXP_GS_ROLLBACKED);
  begin_ok(cl.tm, 200, "m-timeout", x3);
  expect_history(x3, TXP_GS_TIMEOUT_ROLLBACKED);
  begin_ok(cl.tm, 60000, "m-open", x4); /* stays Begin for the gauge */
  expect_history(x1, TXP_GS_COMMITTED);
  char err[256];
  txc_t *bad = txc_connect(HOST, g_tcd.port, 2000, err, sizeof(err));
  assert_non_null(bad);
  assert_int_equal(txc_send_raw(bad, "GARBAGE-GARBAGE-GARBAGE", 23), 0);
  assert_true(txc_wait_closed(bad, 5000));
  txc_close(bad);

  /* counters move (the gauge follows the store within a probe or two) */
  scrape_t b;
  /* x4's begin is stored once its hold ends (tc/tc_hold.h): count after. */
  assert_true(db_wait_long("SELECT count(*) FROM global_table WHERE xid = $1", x4, NULL, 1, WAIT_MS));
  long begin_count = db_long("SELECT count(*) FROM global_table WHERE status = 1", NULL, NULL);
  deadline = now_ms() + WAIT_MS;
  for (;;) {
    b = scrape();
    if (metric(&b, "txc_active_sessions{status=\"Begin\"}") == (double)begin_count &&
        metric(&b, "txc_globals_begun_total") >= metric(&a, "txc_globals_begun_total") + 4 &&
        metric(&b, "txc_bad_frames_total") >= metric(&a, "txc_bad_frames_total") + 1)
      break;
    free(b.s);
    if (now_ms() > deadline) fail_msg("txc_active_sessions{status=\"Begin\"} never reached %ld", begin_count);
    nap();
  }
  assert_true(metric(&b, "txc_globals_begun_total") >= metric(&a, "txc_globals_begun_total") + 4);
  /* Each of the four begins was held and then stored, with its first
   * registration or alone (x3, x4). */
#define STORED(s) (metric(&s, "txc_begins_stored_total{how=\"with_registration\"}") + \
                   metric(&s, "txc_begins_stored_total{how=\"alone\"}"))
  assert_true(STORED(b) >= STORED(a) + 4);
  assert_true(metric(&b, "txc_begins_stored_total{how=\"alone\"}") >=
              metric(&a, "txc_begins_stored_total{how=\"alone\"}") + 2);
#undef STORED
  assert_true(metric(&b, "txc_globals_committed_total") >= metric(&a, "txc_globals_committed_total") + 1);
  assert_true(metric(&b, "txc_globals_rolled_back_total") >= metric(&a, "txc_globals_rolled_back_total") + 1);
  assert_true(metric(&b, "txc_globals_timed_out_total") >= metric(&a, "txc_globals_timed_out_total") + 1);
  assert_true(metric(&b, "txc_branches_registered_total") >= metric(&a, "txc_branches_registered_total") + 2);
  assert_true(metric(&b, "txc_phase2_calls_total") >= metric(&a, "txc_phase2_calls_total") + 2);
  assert_true(metric(&b, "txc_phase2_duration_seconds_count{decision=\"commit\"}") >=
              metric(&a, "txc_phase2_duration_seconds_count{decision=\"commit\"}") + 1);
  assert_true(metric(&b, "txc_phase2_duration_seconds_count{decision=\"rollback\"}") >=
              metric(&a, "txc_phase2_duration_seconds_count{decision=\"rollback\"}") + 1);
  assert_true(metric(&b, "txc_phase2_duration_seconds_sum{decision=\"commit\"}") > 0);
  check_histogram(&b, "txc_phase2_duration_seconds", "decision", "commit");
  /* test_lock_waiters' waiter was granted its lock once the holder ended */
  assert_true(metric(&b, "txc_lock_wait_duration_seconds_count{outcome=\"granted\"}") >= 1);
  check_histogram(&b, "txc_lock_wait_duration_seconds", "outcome", "granted");
  check_histogram(&b, "txc_lock_wait_duration_seconds", "outcome", "refused");
  check_histogram(&b, "txc_phase2_duration_seconds", "decision", "rollback");
  static const char *const kinds[] = {"begin", "register", "decide", "phase2"};
  for (size_t k = 0; k < sizeof(kinds) / sizeof(kinds[0]); k++) check_histogram(&b, "txc_store_op_seconds", "kind", kinds[k]);
  /* Begin ops: the begins stored alone (x3, x4, and x1, x2 if their
   * registration came after the hold); the others rode a registration. */
  assert_true(metric(&b, "txc_store_op_seconds_count{kind=\"begin\"}") >=
              metric(&a, "txc_store_op_seconds_count{kind=\"begin\"}") + 2);
  assert_true(metric(&b, "txc_store_op_seconds_sum{kind=\"decide\"}") > 0);
  assert_true(metric(&b, "txc_bad_frames_total") >= metric(&a, "txc_bad_frames_total") + 1);
  assert_true(metric(&b, "txc_store_batches_total") > metric(&a, "txc_store_batches_total"));
  assert_true(metric(&b, "txc_store_batch_size_sum") >= metric(&b, "txc_store_batch_size_count"));
  assert_true(metric(&b, "txc_store_batch_duration_seconds_count") == metric(&b, "txc_store_batches_total"));
  assert_true(metric(&b, "txc_store_ops_total{kind=\"begin\"}") >= metric(&a, "txc_store_ops_total{kind=\"begin\"}") + 2);
  assert_true(metric(&b, "txc_requests_total") > metric(&a, "txc_requests_total"));
  assert_true(metric(&b, "txc_retry_queue_depth") >= 0);
  assert_true(metric(&b, "txc_admin_requests_total") > 0);
  free(a.s);
  free(b.s);
  assert_int_equal(txc_rollback(cl.tm, x4, &status), 0);
  cli_close(&cl);

  /* /readyz follows the schema: a missing tc version makes it 503 */
  char maxv[32];
  db_text("SELECT max(version)::text FROM schema_version WHERE set_name = 'tc'", NULL, maxv, sizeof(maxv));
  assert_true(maxv[0] != '\0');
  db_exec("BEGIN", NULL, NULL);
  db_exec("CREATE TEMP TABLE sv_saved AS SELECT * FROM schema_version WHERE set_name = 'tc' AND version = $1::int",
          maxv, NULL);
  db_exec("DELETE FROM schema_version WHERE set_name = 'tc' AND version = $1::int", maxv, NULL);
  db_exec("COMMIT", NULL, NULL);
  deadline = now_ms() + WAIT_MS;
  for (;;) {
    h = http("GET", "/readyz");
    if (h.code == 503) break;
    free(h.body);
    if (now_ms() > deadline) fail_msg("/readyz stayed ready without schema version %s", maxv);
    nap();
  }
  char want[64];
  snprintf(want, sizeof(want), "lacks tc version(s) %s", maxv);
  if (!strstr(h.body, want)) fail_msg("/readyz body \"%s\" does not say \"%s\"", h.body, want);
  free(h.body);
  db_exec("INSERT INTO schema_version SELECT * FROM sv_saved", NULL, NULL);
  db_exec("DROP TABLE sv_saved", NULL, NULL);
  deadline = now_ms() + WAIT_MS;
  for (;;) {
    h = http("GET", "/readyz");
    int code = h.code;
    free(h.body);
    if (code == 200) break;
    if (now_ms() > deadline) fail_msg("/readyz did not recover");
    nap();
  }
  h = http("GET", "/healthz");
  assert_int_equal(h.code, 200);
  free(h.body);
}

/* tcctl: tables, --json, exit codes, --help everywhere. */
static void test_tcctl(void **state) {
  (void)state;
  cli_t cl;
  char x[TXP_MAX_XID_LEN + 1];
  open_holding(&cl, "tcctl", "ctl-begin", x, "t_ctl:1");

  assert_int_equal(tcctl("globals", "--status", "Begin", NULL), 0);
  assert_non_null(strstr(g_run.out, "XID"));
  assert_non_null(strstr(g_run.out, x));
  assert_non_null(strstr(g_run.out, "ctl-begin"));
  assert_int_equal(tcctl("globals", "name=ctl-begin", "--limit=5", NULL), 0);
  assert_non_null(strstr(g_run.out, "1 global transaction"));
  assert_int_equal(tcctl("--json", "globals", "--min-age", "0"), 0); /* --json after --socket: still global */
  json_t *a = parse_answer(g_run.out);
  assert_true(json_is_true(json_object_get(a, "ok")));
  assert_non_null(find_by(json_object_get(a, "globals"), "xid", x));
  json_decref(a);
  assert_int_equal(tcctl("show", x, NULL, NULL), 0);
  assert_non_null(strstr(g_run.out, "Begin (1)"));
  assert_non_null(strstr(g_run.out, "db_orders^^^t_ctl^^^1"));
  assert_non_null(strstr(g_run.out, "1 branch"));
  assert_int_equal(tcctl("locks", "--xid", x, NULL), 0);
  assert_non_null(strstr(g_run.out, "db_orders^^^t_ctl^^^1"));
  assert_int_equal(tcctl("locks", "--prefix", "db_orders^^^t_ctl", NULL), 0);
  assert_int_equal(tcctl("nodes", NULL, NULL, NULL), 0);
  assert_non_null(strstr(g_run.out, "this node: 1"));
  assert_non_null(strstr(g_run.out, "STATE")); /* the column, and this node's row */
  assert_int_equal(tcctl("stats", NULL, NULL, NULL), 0);
  assert_non_null(strstr(g_run.out, "globals:"));
  assert_non_null(strstr(g_run.out, "begun"));

  /* refused: 1, with the reason on stderr */
  assert_int_equal(tcctl("redrive", x, NULL, NULL), 1);
  assert_non_null(strstr(g_run.err, "not decided yet"));
  assert_int_equal(tcctl("--json", "delete", x, NULL), 1);
  a = parse_answer(g_run.out);
  assert_string_equal(js(a, "code"), "refused");
  json_decref(a);
  assert_int_equal(tcctl("show", "nowhere:3", NULL, NULL), 1);
  /* usage: 2, before connecting */
  assert_int_equal(tcctl("frobnicate", NULL, NULL, NULL), 2);
  assert_int_equal(tcctl("show", NULL, NULL, NULL), 2);
  assert_int_equal(tcctl("rollback", x, "extra", NULL), 2);
  assert_int_equal(tcctl("globals", "--status", "Bogus", NULL), 2);
  assert_non_null(strstr(g_run.err, "unknown global status \"Bogus\""));
  assert_int_equal(tcctl("globals", "--frob", "1", NULL), 2);
  assert_int_equal(tcctl("locks", "--key", "a", "--prefix=b"), 2);
  /* --help on every command, and the top-level one */
  static const char *const cmds[] = {"globals", "show", "locks", "history", "nodes", "stats", "rollback", "commit",
                                     "stop-retry", "resume-retry", "redrive", "delete", "help"};
  for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++) {
    assert_int_equal(tcctl(cmds[i], "--help", NULL, NULL), 0);
    assert_non_null(strstr(g_run.out, "usage: tcctl"));
    assert_non_null(strstr(g_run.out, cmds[i]));
  }
  char *argv_help[] = {g_tcctl_path, "--help", NULL};
  memset(&g_run, 0, sizeof(g_run));
  run_as(-1, argv_help, NULL, &g_run);
  assert_int_equal(g_run.status, 0);
  assert_non_null(strstr(g_run.out, "exit status"));
  /* cannot connect: 3 */
  char *argv_bad[] = {g_tcctl_path, "--socket", "/nonexistent/tcd.sock", "stats", NULL};
  memset(&g_run, 0, sizeof(g_run));
  run_as(-1, argv_bad, NULL, &g_run);
  assert_int_equal(g_run.status, 3);
  /* the socket from the environment */
  char envsock[400];
  snprintf(envsock, sizeof(envsock), "TC_ADMIN_SOCKET=%s", g_sock);
  const char *env[] = {envsock, NULL};
  char *argv_env[] = {g_tcctl_path, "nodes", NULL};
  memset(&g_run, 0, sizeof(g_run));
  run_as(-1, argv_env, env, &g_run);
  assert_int_equal(g_run.status, 0);

  /* a repair through tcctl */
  assert_int_equal(tcctl("rollback", x, NULL, NULL), 0);
  assert_non_null(strstr(g_run.out, "Begin -> Rollbacking"));
  assert_non_null(strstr(g_run.out, "Rollbacked"));
  expect_history(x, TXP_GS_ROLLBACKED);
  cli_close(&cl);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup_teardown(test_lock_waiters, suite_test_setup, suite_test_teardown),
    cmocka_unit_test_setup_teardown(test_metrics, suite_test_setup, suite_test_teardown),
    cmocka_unit_test_setup_teardown(test_tcctl, suite_test_setup, suite_test_teardown),
    cmocka_unit_test_setup_teardown(test_lock_waiter_sharing_a_bucket, suite_test_setup, suite_test_teardown),
  };
  return cmocka_run_group_tests_name("admin_tools", tests, suite_group_setup, suite_group_teardown);
}
