/*
 * test_tcd.c - tcd end to end: a real tcd process (the binary the build
 * made, sanitizers and all) on a real PostgreSQL, driven over the wire with
 * txclient.
 *
 * NOTES
 *   The database comes from TC_PG_URL and the binary from TX_BIN_DIR (both
 *   set by ctest through scripts/with-servers --pg).  The group setup starts
 *   tcd on a free loopback port and an RM thread; tests share that tcd,
 *   except the crash test, which kills it with SIGKILL and starts another
 *   one on the same database, and the last test, which stops it with
 *   SIGTERM and requires a clean exit (exit status 0: no sanitizer report,
 *   no leak).  tcd's stderr is inherited, so its warnings and any sanitizer
 *   report appear in the test output.
 *
 *   The RM thread has its own connection, registered as RM for db_orders and
 *   db_stock, and answers BranchCommit/BranchRollback: it records every
 *   request (xid, branch id, order, connection generation) and answers OK,
 *   DIRTY_WRITE for one chosen branch, or nothing ("silent": the request is
 *   held and answered late once the mode is switched back, unless the
 *   connection dies first).  It reconnects by itself when tcd goes away, to
 *   whatever port tcd listens on now, and sends a heartbeat every second.
 *
 *   Test-thread clients register as RM for resources nobody serves
 *   ("db_client", "db_waiter"): the TC looks the RM of a branch up by
 *   resource id, so phase-two requests always go to the RM thread, which
 *   answers while the test thread waits.  Where two requests must be
 *   processed in a known order (lock-wait FIFO, a rollback left hanging),
 *   frames are written raw on their own connection and the answers read
 *   from its socket with a decoder of the test's own.
 *
 *   Asynchronous effects are waited for by polling PostgreSQL (or the RM's
 *   records) with a short nanosleep and an overall deadline; nothing sleeps
 *   for a fixed time.  Each test uses its own xids and lock keys.
 *
 *   Besides the eight scenarios of the brief (1-8) and the clean stop (9),
 *   3b and 7b, and a few checks inside the others, pin down bugs found while
 *   writing this file: a lock waiter that missed its wake-up, a branch
 *   report rewriting phase-two outcomes, a use-after-free when a connection
 *   registers again with requests in flight.
 *
 *   Threads: the cmocka test thread (all assertions), the RM thread, and a
 *   background TM/RM client in the bad-input test.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <libpq-fe.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "txclient.h"
#include "txp_msg.h"

#define TOKEN "test-token"
#define HOST "127.0.0.1"
#define RM_RESOURCES "db_orders,db_stock"
#define START_TIMEOUT_MS 15000
#define STOP_TIMEOUT_MS 10000
#define WAIT_MS 10000       /* default bound of a wait for an asynchronous effect */
#define POLL_NS 10000000L   /* 10 ms between two looks */
#define MAX_TRACKED 64

extern char **environ;

/* ------------------------------------------------------------ utilities */

static double now_ms(void) { return txc_now_ms(); }

static void nap(void) {
  struct timespec ts = {0, POLL_NS};
  nanosleep(&ts, NULL);
}

/* ------------------------------------------------------------ tcd process */

static char g_tcd_path[4096];
static const char *g_pg_url;
static pid_t g_tcd = -1;
static int g_port;
static pid_t g_test_pid;
static bool g_stopped_on_purpose; /* the clean-stop test stopped it */

static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  struct sockaddr_in sa;
  memset(&sa, 0, sizeof(sa));
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t sl = sizeof(sa);
  int port = -1;
  if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 &&
      getsockname(fd, (struct sockaddr *)&sa, &sl) == 0)
    port = ntohs(sa.sin_port);
  close(fd);
  return port;
}

/* fork + execve tcd listening on 'port'.  The environment is ours without
 * any TC_* setting, plus the test's settings. */
static pid_t spawn_tcd(int port) {
  static char listen_env[64], url_env[4200];
  snprintf(listen_env, sizeof(listen_env), "TC_SERVER_LISTEN=%s:%d", HOST, port);
  snprintf(url_env, sizeof(url_env), "TC_STORE_PG_URL=%s", g_pg_url);
  static const char *const ours[] = {
    "TC_SERVER_TOKEN=" TOKEN, "TC_LOG_LEVEL=warn", "TC_RECOVERY_INTERVAL_MS=200",
    "TC_RECOVERY_RETRY_MIN_MS=100",
  };
  size_t n = 0;
  while (environ[n]) n++;
  size_t nours = sizeof(ours) / sizeof(ours[0]);
  char **envp = calloc(n + nours + 3, sizeof(char *));
  if (!envp) return -1;
  size_t k = 0;
  for (size_t i = 0; i < n; i++)
    if (strncmp(environ[i], "TC_", 3) != 0) envp[k++] = environ[i];
  for (size_t i = 0; i < nours; i++) envp[k++] = (char *)(uintptr_t)ours[i];
  envp[k++] = listen_env;
  envp[k++] = url_env;
  envp[k] = NULL;
  char *argv[] = {g_tcd_path, NULL};
  pid_t parent = getpid();
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) {
    /* Only async-signal-safe calls here: the parent has threads. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(126);
    execve(g_tcd_path, argv, envp);
    _exit(127);
  }
  free(envp);
  return pid;
}

/* Wait until 'pid' answers a registration on 'port'.  False if it exited
 * (e.g. could not bind) or did not come up in time. */
static bool wait_serving(pid_t pid, int port, int timeout_ms) {
  double deadline = now_ms() + timeout_ms;
  while (now_ms() < deadline) {
    int st;
    if (waitpid(pid, &st, WNOHANG) == pid) {
      fprintf(stderr, "test_tcd: tcd exited at start-up (status 0x%x)\n", st);
      return false;
    }
    char err[256];
    txc_t *c = txc_connect(HOST, port, 200, err, sizeof(err));
    if (c) {
      int rc = txc_register(c, false, "probe", "probe", TOKEN, NULL);
      txc_close(c);
      if (rc == 0) return true;
    }
    nap();
  }
  return false;
}

static void rm_set_port(int port);

/* Start tcd on a fresh port (retrying when the port is taken); 0 or -1. */
static int tcd_start(void) {
  for (int attempt = 0; attempt < 5; attempt++) {
    int port = free_port();
    if (port <= 0) continue;
    pid_t pid = spawn_tcd(port);
    if (pid < 0) return -1;
    if (wait_serving(pid, port, START_TIMEOUT_MS)) {
      g_tcd = pid;
      g_port = port;
      rm_set_port(port);
      return 0;
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
  }
  return -1;
}

/* SIGTERM, bounded wait, then SIGKILL.  Returns the wait status, or -1. */
static int tcd_stop(void) {
  if (g_tcd <= 0) return -1;
  pid_t pid = g_tcd;
  g_tcd = -1;
  kill(pid, SIGTERM);
  double deadline = now_ms() + STOP_TIMEOUT_MS;
  int st = 0;
  while (now_ms() < deadline) {
    if (waitpid(pid, &st, WNOHANG) == pid) return st;
    nap();
  }
  fprintf(stderr, "test_tcd: tcd did not stop within %d ms: SIGKILL\n", STOP_TIMEOUT_MS);
  kill(pid, SIGKILL);
  waitpid(pid, &st, 0);
  return -1;
}

static void tcd_kill9(void) {
  if (g_tcd <= 0) return;
  kill(g_tcd, SIGKILL);
  waitpid(g_tcd, NULL, 0);
  g_tcd = -1;
}

/* Whether tcd still runs; if it ended, say how (once) and forget it. */
static bool tcd_alive(void) {
  if (g_tcd <= 0) return false;
  int st = 0;
  pid_t r = waitpid(g_tcd, &st, WNOHANG);
  if (r == 0) return true;
  if (r == g_tcd) {
    if (WIFSIGNALED(st))
      fprintf(stderr, "test_tcd: tcd (pid %d) was killed by signal %d\n", (int)g_tcd, WTERMSIG(st));
    else
      fprintf(stderr, "test_tcd: tcd (pid %d) exited with status %d%s\n", (int)g_tcd, WEXITSTATUS(st),
              WEXITSTATUS(st) == 0 ? " (a clean stop: SIGTERM/SIGINT from outside the test)" : "");
  } else {
    fprintf(stderr, "test_tcd: waitpid(%d): %s\n", (int)g_tcd, strerror(errno));
  }
  g_tcd = -1;
  return false;
}

static void kill_at_exit(void) {
  if (getpid() == g_test_pid && g_tcd > 0) {
    kill(g_tcd, SIGKILL);
    waitpid(g_tcd, NULL, 0);
  }
}

/* -------------------------------------------------------------- the RM */

#define RM_MAX_EVENTS 2048
#define RM_MAX_PENDING 64

typedef struct rm_event {
  int type; /* TXP_MSG_BRANCH_COMMIT / _ROLLBACK */
  char xid[TXP_MAX_XID_LEN + 1];
  int64_t branch_id;
  int generation; /* which connection received it */
} rm_event_t;

typedef struct rm_pending {
  int type;
  uint64_t request_id;
  int64_t branch_id;
} rm_pending_t;

static struct {
  pthread_mutex_t mu;
  pthread_t thread;
  bool started;
  bool stop;
  int port;
  bool silent_commit, silent_rollback;
  int64_t dirty_branch; /* answer DIRTY_WRITE to its rollback */
  int generation;       /* successful registrations so far */
  rm_event_t ev[RM_MAX_EVENTS];
  int nev;
  rm_pending_t pending[RM_MAX_PENDING];
  int npending;
} rm = {.mu = PTHREAD_MUTEX_INITIALIZER};

static void rm_set_port(int port) {
  pthread_mutex_lock(&rm.mu);
  rm.port = port;
  pthread_mutex_unlock(&rm.mu);
}

/* Fill the answer to a BranchCommit/Rollback of 'branch'; rm.mu held. */
static void rm_fill_answer(int type, int64_t branch, txp_msg_t *res) {
  if (type == TXP_MSG_BRANCH_ROLLBACK && branch == rm.dirty_branch) {
    txp_msg_set_int(res, TXP_F_CODE, TXP_EDIRTY_WRITE);
    txp_msg_set_str(res, TXP_F_MESSAGE, "dirty write: row changed since the branch ran");
    return;
  }
  txp_msg_set_int(res, TXP_F_BRANCH_STATUS,
                  type == TXP_MSG_BRANCH_COMMIT ? TXP_BS_PHASE2_COMMITTED : TXP_BS_PHASE2_ROLLBACKED);
}

static int rm_handler(txc_t *c, const txp_msg_t *req, txp_msg_t *res, void *arg) {
  (void)c;
  (void)arg;
  int type = req->type;
  if (type != TXP_MSG_BRANCH_COMMIT && type != TXP_MSG_BRANCH_ROLLBACK) return 0;
  pthread_mutex_lock(&rm.mu);
  if (rm.nev < RM_MAX_EVENTS) {
    rm_event_t *e = &rm.ev[rm.nev++];
    e->type = type;
    snprintf(e->xid, sizeof(e->xid), "%s", req->xid ? req->xid : "");
    e->branch_id = req->branch_id;
    e->generation = rm.generation;
  }
  bool silent = type == TXP_MSG_BRANCH_COMMIT ? rm.silent_commit : rm.silent_rollback;
  int rc = 0;
  if (silent) {
    if (rm.npending < RM_MAX_PENDING) {
      rm_pending_t *p = &rm.pending[rm.npending++];
      p->type = type;
      p->request_id = req->request_id;
      p->branch_id = req->branch_id;
    }
    rc = 1;
  } else {
    rm_fill_answer(type, req->branch_id, res);
  }
  pthread_mutex_unlock(&rm.mu);
  return rc;
}

/* Answer held requests whose mode is no longer silent.  -1 if the
 * connection broke. */
static int rm_answer_pending(txc_t *c) {
  txp_buf_t out;
  txp_buf_init(&out, 0);
  pthread_mutex_lock(&rm.mu);
  int keep = 0;
  for (int i = 0; i < rm.npending; i++) {
    rm_pending_t p = rm.pending[i];
    bool silent = p.type == TXP_MSG_BRANCH_COMMIT ? rm.silent_commit : rm.silent_rollback;
    if (silent) {
      rm.pending[keep++] = p;
      continue;
    }
    txp_msg_t req, res;
    txp_msg_init(&req, (txp_msg_type_t)p.type);
    req.request_id = p.request_id;
    txp_msg_init_result(&res, &req, 0, NULL);
    rm_fill_answer(p.type, p.branch_id, &res);
    txp_encode(&res, &out, 0);
  }
  rm.npending = keep;
  pthread_mutex_unlock(&rm.mu);
  int rc = out.len ? txc_send_raw(c, out.data, out.len) : 0;
  txp_buf_free(&out);
  return rc == 0 ? 0 : -1;
}

static void *rm_main(void *arg) {
  (void)arg;
  txc_t *c = NULL;
  double next_beat = 0;
  for (;;) {
    pthread_mutex_lock(&rm.mu);
    bool stop = rm.stop;
    int port = rm.port;
    pthread_mutex_unlock(&rm.mu);
    if (stop) break;
    if (!c) {
      char err[256];
      c = txc_connect(HOST, port, 500, err, sizeof(err));
      if (c && txc_register(c, true, "test-rm", "rm-orders-stock", TOKEN, RM_RESOURCES) != 0) {
        txc_close(c);
        c = NULL;
      }
      if (!c) {
        nap();
        continue;
      }
      txc_set_handler(c, rm_handler, NULL);
      pthread_mutex_lock(&rm.mu);
      rm.generation++;
      rm.npending = 0; /* held requests of the old connection died with it */
      pthread_mutex_unlock(&rm.mu);
      next_beat = now_ms() + 1000;
    }
    int rc = rm_answer_pending(c) == 0 ? txc_poll(c, 20, false) : TXP_ECONN_LOST;
    if (rc >= 0 && now_ms() >= next_beat) {
      txp_msg_t hb, res;
      txp_msg_init(&hb, TXP_MSG_HEARTBEAT);
      rc = txc_call(c, &hb, &res, 3000);
      txp_msg_clear(&res);
      if (rc == TXP_EUNKNOWN_OUTCOME) rc = 0; /* a slow answer is not a lost connection */
      next_beat = now_ms() + 1000;
    }
    if (rc < 0) {
      txc_close(c);
      c = NULL;
      pthread_mutex_lock(&rm.mu);
      rm.npending = 0;
      pthread_mutex_unlock(&rm.mu);
    }
  }
  txc_close(c);
  return NULL;
}

static int rm_generation(void) {
  pthread_mutex_lock(&rm.mu);
  int g = rm.generation;
  pthread_mutex_unlock(&rm.mu);
  return g;
}

static bool rm_wait_generation(int above, int timeout_ms) {
  double deadline = now_ms() + timeout_ms;
  while (rm_generation() <= above) {
    if (now_ms() >= deadline) return false;
    nap();
  }
  return true;
}

static void rm_set_modes(bool silent_commit, bool silent_rollback, int64_t dirty_branch) {
  pthread_mutex_lock(&rm.mu);
  rm.silent_commit = silent_commit;
  rm.silent_rollback = silent_rollback;
  rm.dirty_branch = dirty_branch;
  pthread_mutex_unlock(&rm.mu);
}

/* Requests of 'type' for 'xid' received on connections of generation >
 * 'after_gen'; their branch ids in order of arrival go to 'ids' (may be
 * NULL). */
static int rm_events(const char *xid, int type, int after_gen, int64_t *ids, int max) {
  int n = 0;
  pthread_mutex_lock(&rm.mu);
  for (int i = 0; i < rm.nev; i++) {
    const rm_event_t *e = &rm.ev[i];
    if (e->type != type || e->generation <= after_gen || strcmp(e->xid, xid) != 0) continue;
    if (ids && n < max) ids[n] = e->branch_id;
    n++;
  }
  pthread_mutex_unlock(&rm.mu);
  return n;
}

static bool rm_wait_events(const char *xid, int type, int after_gen, int want, int timeout_ms) {
  double deadline = now_ms() + timeout_ms;
  while (rm_events(xid, type, after_gen, NULL, 0) < want) {
    if (now_ms() >= deadline) return false;
    nap();
  }
  return true;
}

static bool has_id(const int64_t *ids, int n, int64_t id) {
  for (int i = 0; i < n; i++)
    if (ids[i] == id) return true;
  return false;
}

/* --------------------------------------------------------- PostgreSQL */

static PGconn *g_pg;

/* First column of the first row as a number; -1 when there is no row or it
 * is NULL.  Up to two text parameters. */
static long db_long(const char *sql, const char *p1, const char *p2) {
  const char *params[2] = {p1, p2};
  int n = p2 ? 2 : p1 ? 1 : 0;
  PGresult *r = PQexecParams(g_pg, sql, n, NULL, params, NULL, NULL, 0);
  if (PQresultStatus(r) != PGRES_TUPLES_OK) {
    char msg[512];
    snprintf(msg, sizeof(msg), "%s", PQresultErrorMessage(r));
    PQclear(r);
    fail_msg("query failed: %s: %s", sql, msg);
  }
  long v = -1;
  if (PQntuples(r) > 0 && !PQgetisnull(r, 0, 0)) v = strtol(PQgetvalue(r, 0, 0), NULL, 10);
  PQclear(r);
  return v;
}

/* First column of the first row as text into 'out' ("" if none). */
static void db_text(const char *sql, const char *p1, char *out, size_t cap) {
  const char *params[1] = {p1};
  PGresult *r = PQexecParams(g_pg, sql, p1 ? 1 : 0, NULL, params, NULL, NULL, 0);
  out[0] = '\0';
  if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) > 0 && !PQgetisnull(r, 0, 0))
    snprintf(out, cap, "%s", PQgetvalue(r, 0, 0));
  bool ok = PQresultStatus(r) == PGRES_TUPLES_OK;
  PQclear(r);
  if (!ok) fail_msg("query failed: %s", sql);
}

static bool db_wait_long(const char *sql, const char *p1, const char *p2, long want, int timeout_ms) {
  double deadline = now_ms() + timeout_ms;
  for (;;) {
    if (db_long(sql, p1, p2) == want) return true;
    if (now_ms() >= deadline) return false;
    nap();
  }
}

#define SQL_HISTORY_STATUS "SELECT status FROM global_history WHERE xid = $1"
#define SQL_GLOBAL_STATUS "SELECT status FROM global_table WHERE xid = $1"
#define SQL_HISTORY_BRANCHES                                                            \
  "SELECT count(*) FROM global_history h, jsonb_array_elements(h.branches) e "          \
  "WHERE h.xid = $1 AND (e->>'status')::int = $2::int"
#define SQL_LIVE_ROWS                                                                   \
  "SELECT (SELECT count(*) FROM global_table WHERE xid = $1) + "                        \
  "(SELECT count(*) FROM branch_table WHERE xid = $1) + "                               \
  "(SELECT count(*) FROM lock_table WHERE xid = $1)"
#define SQL_LOCKS "SELECT count(*) FROM lock_table WHERE xid = $1"
#define SQL_BRANCHES "SELECT count(*) FROM branch_table WHERE xid = $1"
#define SQL_KEY_HOLDER "SELECT xid FROM lock_table WHERE row_key = $1"

static void expect_history(const char *xid, int status, int timeout_ms) {
  if (!db_wait_long(SQL_HISTORY_STATUS, xid, NULL, status, timeout_ms))
    fail_msg("global %s: history status is %ld (live status %ld), expected %d", xid,
             db_long(SQL_HISTORY_STATUS, xid, NULL), db_long(SQL_GLOBAL_STATUS, xid, NULL), status);
}

static long history_branches(const char *xid, int branch_status) {
  char s[16];
  snprintf(s, sizeof(s), "%d", branch_status);
  return db_long(SQL_HISTORY_BRANCHES, xid, s);
}

/* ------------------------------------------------------------ clients */

static txc_t *g_tracked[MAX_TRACKED];

/* Reads answers from a connection's socket with the test's own decoder;
 * answers that arrive before the one waited for are kept for later. */
#define READER_HELD 8
typedef struct reader {
  txp_decoder_t *dec;
  txp_msg_t held[READER_HELD];
  int nheld;
} reader_t;

static reader_t *g_readers[MAX_TRACKED];

static txc_t *track(txc_t *c) {
  for (int i = 0; i < MAX_TRACKED; i++)
    if (!g_tracked[i]) {
      g_tracked[i] = c;
      return c;
    }
  fail_msg("too many open clients");
  return c;
}

static void untrack_close(txc_t *c) {
  for (int i = 0; i < MAX_TRACKED; i++)
    if (g_tracked[i] == c) g_tracked[i] = NULL;
  txc_close(c);
}

static void reader_free(reader_t *r) {
  if (!r) return;
  for (int i = 0; i < r->nheld; i++) txp_msg_clear(&r->held[i]);
  txp_decoder_free(r->dec);
  free(r);
}

static reader_t *new_reader(void) {
  for (int i = 0; i < MAX_TRACKED; i++)
    if (!g_readers[i]) {
      reader_t *r = calloc(1, sizeof(*r));
      assert_non_null(r);
      r->dec = txp_decoder_new(NULL);
      if (!r->dec) {
        free(r);
        fail_msg("out of memory");
      }
      g_readers[i] = r;
      return r;
    }
  fail_msg("too many readers");
  return NULL;
}

static void bg_stop(void);

/* Each test starts with a serving tcd: if an earlier one crashed it, a new
 * one is started (the crash already failed that test). */
static int test_setup(void **state) {
  (void)state;
  if (tcd_alive()) return 0;
  fprintf(stderr, "test_tcd: tcd is not running: starting a new one\n");
  return tcd_start();
}

/* Close everything a test opened, also after a failed assertion, and fail
 * the test if tcd died under it (a test that kills tcd starts another). */
static int test_teardown(void **state) {
  (void)state;
  bg_stop();
  int rc = 0;
  if (!g_stopped_on_purpose && !tcd_alive()) {
    fprintf(stderr, "test_tcd: tcd died during the test\n");
    rc = -1;
  }
  for (int i = 0; i < MAX_TRACKED; i++) {
    if (g_tracked[i]) txc_close(g_tracked[i]);
    reader_free(g_readers[i]);
    g_tracked[i] = NULL;
    g_readers[i] = NULL;
  }
  rm_set_modes(false, false, 0);
  return rc;
}

static txc_t *raw_connect(void) {
  char err[256];
  txc_t *c = txc_connect(HOST, g_port, 2000, err, sizeof(err));
  if (!c) fail_msg("could not connect to tcd on port %d: %s", g_port, err);
  return track(c);
}

/* A registered connection: TM, or RM of 'resources' (none of which the RM
 * thread serves, so phase two never comes here). */
static txc_t *client(bool as_rm, const char *client_id, const char *resources) {
  txc_t *c = raw_connect();
  int rc = txc_register(c, as_rm, "test-app", client_id, TOKEN, as_rm ? resources : NULL);
  if (rc != 0) fail_msg("could not register %s: %s (%d)", client_id, txp_errname(rc), rc);
  return c;
}

typedef struct cli {
  txc_t *tm; /* GlobalBegin/Commit/Rollback */
  txc_t *rm; /* BranchRegister/Report */
} cli_t;

static void cli_open(cli_t *cl, const char *name) {
  char id[64];
  snprintf(id, sizeof(id), "%s-tm", name);
  cl->tm = client(false, id, NULL);
  snprintf(id, sizeof(id), "%s-rm", name);
  cl->rm = client(true, id, "db_client");
}

static void begin_ok(txc_t *tm, uint32_t timeout_ms, const char *name, char *xid) {
  int rc = txc_begin(tm, timeout_ms, name, NULL, xid);
  if (rc != 0) fail_msg("GlobalBegin %s: %s (%d)", name, txp_errname(rc), rc);
  assert_true(xid[0] != '\0');
}

static int64_t register_ok(txc_t *c, const char *xid, const char *resource, const char *keys) {
  int64_t branch = 0;
  int rc = txc_branch_register(c, xid, resource, keys, 0, &branch, NULL);
  if (rc != 0) fail_msg("BranchRegister %s %s on %s: %s (%d)", xid, keys, resource, txp_errname(rc), rc);
  assert_true(branch > 0);
  return branch;
}

static void msg_register(txp_msg_t *m, const char *xid, const char *resource, const char *keys,
                         uint32_t lock_wait_ms, const char *idem) {
  txp_msg_init(m, TXP_MSG_BRANCH_REGISTER);
  txp_msg_set_str(m, TXP_F_XID, xid);
  txp_msg_set_int(m, TXP_F_BRANCH_TYPE, TXP_BT_AT);
  txp_msg_set_str(m, TXP_F_RESOURCE_ID, resource);
  if (keys) txp_msg_set_str(m, TXP_F_LOCK_KEYS, keys);
  if (lock_wait_ms) txp_msg_set_int(m, TXP_F_LOCK_WAIT_MS, lock_wait_ms);
  if (idem) txp_msg_set_str(m, TXP_F_IDEM_KEY, idem);
}

/* Write 'n' requests in one write, with request ids first_id, first_id+1... */
static void send_frames(txc_t *c, txp_msg_t *msgs, int n, uint64_t first_id) {
  txp_buf_t out;
  txp_buf_init(&out, 0);
  for (int i = 0; i < n; i++) {
    msgs[i].request_id = first_id + (uint64_t)i;
    int rc = txp_encode(&msgs[i], &out, 0);
    if (rc != 0) {
      txp_buf_free(&out);
      fail_msg("could not encode a frame: %s", txp_errname(rc));
    }
  }
  int rc = txc_send_raw(c, out.data, out.len);
  txp_buf_free(&out);
  assert_int_equal(rc, 0);
}

/* Read the answer to request 'id' from the socket of 'c' (frames written
 * with send_frames; txclient's own decoder holds nothing then).  0, or
 * TXP_EUNKNOWN_OUTCOME on timeout, TXP_ECONN_LOST. */
static int recv_answer(txc_t *c, reader_t *rd, uint64_t id, txp_msg_t *out, int timeout_ms) {
  double deadline = now_ms() + timeout_ms;
  for (int i = 0; i < rd->nheld; i++) {
    if (rd->held[i].request_id != id) continue;
    *out = rd->held[i];
    rd->held[i] = rd->held[--rd->nheld];
    return 0;
  }
  txp_msg_init(out, TXP_MSG_NONE);
  for (;;) {
    int rc = txp_decoder_next(rd->dec, out);
    if (rc == 0) {
      if ((out->flags & TXP_FLAG_RESPONSE) && out->request_id == id) return 0;
      if ((out->flags & TXP_FLAG_RESPONSE) && rd->nheld < READER_HELD) rd->held[rd->nheld++] = *out;
      else txp_msg_clear(out);
      txp_msg_init(out, TXP_MSG_NONE);
      continue;
    }
    txp_msg_clear(out);
    if (rc != TXP_EAGAIN) return rc;
    double left = deadline - now_ms();
    if (left <= 0) return TXP_EUNKNOWN_OUTCOME;
    struct pollfd p = {txc_fd(c), POLLIN, 0};
    int pr = poll(&p, 1, (int)left + 1);
    if (pr <= 0) continue;
    char buf[4096];
    ssize_t got = recv(txc_fd(c), buf, sizeof(buf), 0);
    if (got == 0 || (got < 0 && errno != EAGAIN && errno != EINTR)) return TXP_ECONN_LOST;
    if (got > 0 && txp_decoder_feed(rd->dec, buf, (size_t)got) != 0) return TXP_ENOMEM;
  }
}

static bool readable_now(txc_t *c) {
  struct pollfd p = {txc_fd(c), POLLIN, 0};
  return poll(&p, 1, 0) == 1;
}

/* ===================================================================== */
/*                                tests                                  */
/* ===================================================================== */

/* 1. Two branches, commit: Committed at once, phase two cleans up. */
static void test_commit_two_branches(void **state) {
  (void)state;
  cli_t cl;
  cli_open(&cl, "t1");
  char xid[TXP_MAX_XID_LEN + 1];
  begin_ok(cl.tm, 30000, "t1-commit", xid);
  int64_t b1 = register_ok(cl.rm, xid, "db_orders", "t_order:1");
  int64_t b2 = register_ok(cl.rm, xid, "db_stock", "t_stock:1");
  assert_true(b1 != b2);
  assert_int_equal(db_long(SQL_GLOBAL_STATUS, xid, NULL), TXP_GS_BEGIN);
  assert_int_equal(db_long(SQL_BRANCHES, xid, NULL), 2);
  assert_int_equal(db_long(SQL_LOCKS, xid, NULL), 2);

  int status = -1;
  assert_int_equal(txc_commit(cl.tm, xid, &status), 0);
  assert_int_equal(status, TXP_GS_COMMITTED);

  expect_history(xid, TXP_GS_COMMITTED, WAIT_MS);
  assert_int_equal(history_branches(xid, TXP_BS_PHASE2_COMMITTED), 2);
  assert_int_equal(db_long(SQL_LIVE_ROWS, xid, NULL), 0);
  int64_t ids[8];
  assert_int_equal(rm_events(xid, TXP_MSG_BRANCH_COMMIT, 0, ids, 8), 2);
  assert_true(has_id(ids, 2, b1) && has_id(ids, 2, b2));
  assert_int_equal(rm_events(xid, TXP_MSG_BRANCH_ROLLBACK, 0, NULL, 0), 0);
  /* The TM sees the same answer from GlobalStatus now. */
  assert_int_equal(txc_status(cl.tm, xid, &status), 0);
  assert_int_equal(status, TXP_GS_COMMITTED);
}

/* 2. Two branches, rollback: newest branch undone first. */
static void test_rollback_two_branches(void **state) {
  (void)state;
  cli_t cl;
  cli_open(&cl, "t2");
  char xid[TXP_MAX_XID_LEN + 1];
  begin_ok(cl.tm, 30000, "t2-rollback", xid);
  int64_t b1 = register_ok(cl.rm, xid, "db_orders", "t_order:2");
  int64_t b2 = register_ok(cl.rm, xid, "db_stock", "t_stock:2");

  int status = -1;
  assert_int_equal(txc_rollback(cl.tm, xid, &status), 0);
  assert_int_equal(status, TXP_GS_ROLLBACKED);

  expect_history(xid, TXP_GS_ROLLBACKED, WAIT_MS);
  assert_int_equal(history_branches(xid, TXP_BS_PHASE2_ROLLBACKED), 2);
  assert_int_equal(db_long(SQL_LIVE_ROWS, xid, NULL), 0);
  int64_t ids[8];
  assert_int_equal(rm_events(xid, TXP_MSG_BRANCH_ROLLBACK, 0, ids, 8), 2);
  assert_true(ids[0] == b2 && ids[1] == b1);
  assert_int_equal(rm_events(xid, TXP_MSG_BRANCH_COMMIT, 0, NULL, 0), 0);
}

/* 3. Lock conflicts: immediate conflict, FIFO wake-up of waiters, holder
 * rolling back, wait timeout. */
static void test_lock_conflict_fifo(void **state) {
  (void)state;
  cli_t cl;
  cli_open(&cl, "t3");
  const char *row42 = "db_orders^^^t_row^^^42";
  char xa[TXP_MAX_XID_LEN + 1], xb[TXP_MAX_XID_LEN + 1], xc[TXP_MAX_XID_LEN + 1];
  char xx[TXP_MAX_XID_LEN + 1];
  begin_ok(cl.tm, 60000, "t3-A", xa);
  register_ok(cl.rm, xa, "db_orders", "t_row:42");

  /* No lock wait asked: conflict at once, naming the holder, nothing kept. */
  begin_ok(cl.tm, 60000, "t3-X", xx);
  txp_msg_t req, res;
  msg_register(&req, xx, "db_orders", "t_other:1;t_row:42", 0, NULL);
  double t0 = now_ms();
  assert_int_equal(txc_call(cl.rm, &req, &res, 10000), 0);
  double took = now_ms() - t0;
  assert_int_equal(res.code, TXP_ELOCK_CONFLICT);
  assert_non_null(res.lock_holder);
  assert_string_equal(res.lock_holder, xa);
  assert_non_null(res.message);
  assert_non_null(strstr(res.message, xa));
  txp_msg_clear(&res);
  assert_true(took < 3000);
  assert_int_equal(db_long(SQL_LIVE_ROWS, xx, NULL), 1); /* only its global row */

  /* B then C wait for the key.  Each writes its waiting registration and,
   * in the same write, a probe (the same key without waiting) that
   * conflicts at once: requests of one connection are batched in order, so
   * the probe's answer proves that the waiting registration is queued. */
  begin_ok(cl.tm, 60000, "t3-B", xb);
  begin_ok(cl.tm, 60000, "t3-C", xc);
  txc_t *cb = client(true, "t3-waiter-b", "db_waiter");
  txc_t *cc = client(true, "t3-waiter-c", "db_waiter");
  reader_t *db = new_reader(), *dc = new_reader();
  txp_msg_t pair[2];
  msg_register(&pair[0], xb, "db_orders", "t_row:42", 5000, NULL);
  msg_register(&pair[1], xb, "db_orders", "t_row:42", 0, NULL);
  send_frames(cb, pair, 2, 100);
  assert_int_equal(recv_answer(cb, db, 101, &res, 10000), 0);
  assert_int_equal(res.code, TXP_ELOCK_CONFLICT);
  txp_msg_clear(&res);
  msg_register(&pair[0], xc, "db_orders", "t_row:42", 5000, NULL);
  msg_register(&pair[1], xc, "db_orders", "t_row:42", 0, NULL);
  send_frames(cc, pair, 2, 200);
  assert_int_equal(recv_answer(cc, dc, 201, &res, 10000), 0);
  assert_int_equal(res.code, TXP_ELOCK_CONFLICT);
  txp_msg_clear(&res);
  assert_false(readable_now(cb));
  assert_false(readable_now(cc));

  /* A commits: B (first in line) gets the key, C waits on. */
  int status = -1;
  assert_int_equal(txc_commit(cl.tm, xa, &status), 0);
  assert_int_equal(status, TXP_GS_COMMITTED);
  assert_int_equal(recv_answer(cb, db, 100, &res, 10000), 0);
  assert_int_equal(res.code, 0);
  assert_true(res.branch_id > 0);
  assert_true(txp_msg_has(&res, TXP_F_WAITED_MS));
  assert_true(res.waited_ms > 0);
  txp_msg_clear(&res);
  char holder[TXP_MAX_XID_LEN + 1];
  db_text(SQL_KEY_HOLDER, row42, holder, sizeof(holder));
  assert_string_equal(holder, xb);
  assert_false(readable_now(cc));
  assert_int_equal(db_long(SQL_BRANCHES, xc, NULL), 0);

  /* B commits: now C. */
  assert_int_equal(txc_commit(cl.tm, xb, &status), 0);
  assert_int_equal(status, TXP_GS_COMMITTED);
  assert_int_equal(recv_answer(cc, dc, 200, &res, 10000), 0);
  assert_int_equal(res.code, 0);
  assert_true(res.branch_id > 0);
  assert_true(txp_msg_has(&res, TXP_F_WAITED_MS));
  assert_true(res.waited_ms > 0);
  txp_msg_clear(&res);
  db_text(SQL_KEY_HOLDER, row42, holder, sizeof(holder));
  assert_string_equal(holder, xc);
  assert_int_equal(txc_rollback(cl.tm, xc, &status), 0);
  assert_int_equal(status, TXP_GS_ROLLBACKED);
  assert_int_equal(db_long("SELECT count(*) FROM lock_table WHERE row_key = $1", row42, NULL), 0);
  expect_history(xa, TXP_GS_COMMITTED, WAIT_MS);
  expect_history(xb, TXP_GS_COMMITTED, WAIT_MS);
  expect_history(xc, TXP_GS_ROLLBACKED, WAIT_MS);
  assert_int_equal(txc_rollback(cl.tm, xx, &status), 0);

  /* A holder that is rolling back (its RM does not answer yet): others
   * fail fast, waiting or not. */
  char xh[TXP_MAX_XID_LEN + 1], xp[TXP_MAX_XID_LEN + 1];
  begin_ok(cl.tm, 60000, "t3-H", xh);
  register_ok(cl.rm, xh, "db_orders", "t_rb:1");
  rm_set_modes(false, true, 0);
  txc_t *ch = client(false, "t3-rollbacker", NULL);
  reader_t *dh = new_reader();
  txp_msg_init(&req, TXP_MSG_GLOBAL_ROLLBACK);
  txp_msg_set_str(&req, TXP_F_XID, xh);
  send_frames(ch, &req, 1, 300);
  assert_true(rm_wait_events(xh, TXP_MSG_BRANCH_ROLLBACK, 0, 1, WAIT_MS));
  assert_int_equal(db_long(SQL_GLOBAL_STATUS, xh, NULL), TXP_GS_ROLLBACKING);
  assert_int_equal(db_long("SELECT min(status) FROM lock_table WHERE xid = $1", xh, NULL), 1);
  begin_ok(cl.tm, 60000, "t3-P", xp);
  msg_register(&req, xp, "db_orders", "t_rb:1", 5000, NULL);
  t0 = now_ms();
  assert_int_equal(txc_call(cl.rm, &req, &res, 10000), 0);
  took = now_ms() - t0;
  assert_int_equal(res.code, TXP_ELOCK_HOLDER_ROLLBACKING);
  assert_non_null(res.lock_holder);
  assert_string_equal(res.lock_holder, xh);
  txp_msg_clear(&res);
  assert_true(took < 2000);
  msg_register(&req, xp, "db_orders", "t_rb:1", 0, NULL);
  assert_int_equal(txc_call(cl.rm, &req, &res, 10000), 0);
  assert_int_equal(res.code, TXP_ELOCK_HOLDER_ROLLBACKING);
  txp_msg_clear(&res);
  assert_int_equal(db_long(SQL_BRANCHES, xp, NULL), 0);
  /* The RM answers now: the rollback completes and is answered. */
  rm_set_modes(false, false, 0);
  assert_int_equal(recv_answer(ch, dh, 300, &res, 15000), 0);
  assert_int_equal(res.code, 0);
  assert_int_equal(res.global_status, TXP_GS_ROLLBACKED);
  txp_msg_clear(&res);
  expect_history(xh, TXP_GS_ROLLBACKED, WAIT_MS);
  /* The key is free again: P takes it. */
  register_ok(cl.rm, xp, "db_orders", "t_rb:1");

  /* A wait longer than the holder lasts: LOCK_WAIT_TIMEOUT. */
  char xw[TXP_MAX_XID_LEN + 1];
  begin_ok(cl.tm, 60000, "t3-W", xw);
  t0 = now_ms();
  msg_register(&req, xw, "db_orders", "t_rb:1", 300, NULL);
  assert_int_equal(txc_call(cl.rm, &req, &res, 10000), 0);
  took = now_ms() - t0;
  assert_int_equal(res.code, TXP_ELOCK_WAIT_TIMEOUT);
  txp_msg_clear(&res);
  assert_true(took >= 290 && took < 5000);
  assert_int_equal(db_long(SQL_LIVE_ROWS, xw, NULL), 1);
  assert_int_equal(txc_rollback(cl.tm, xp, &status), 0);
  assert_int_equal(status, TXP_GS_ROLLBACKED);
  assert_int_equal(txc_rollback(cl.tm, xw, &status), 0);
  assert_int_equal(status, TXP_GS_ROLLBACKED);
}

/* 3b. A lock released while a registration that met it is on its way
 * back: the holder's commit and a waiting registration in one batch (the
 * commit first), so the release happens before the waiter could queue.
 * The waiter must get the free lock at once, not sit out its lock wait. */
static void test_lock_release_race(void **state) {
  (void)state;
  cli_t cl;
  cli_open(&cl, "t3b");
  txc_t *c = client(true, "t3b-both", "db_waiter");
  reader_t *rd = new_reader();
  for (int round = 0; round < 3; round++) {
    char xa[TXP_MAX_XID_LEN + 1], xb[TXP_MAX_XID_LEN + 1], key[32];
    snprintf(key, sizeof(key), "t_race:%d", round);
    begin_ok(cl.tm, 30000, "t3b-A", xa);
    register_ok(cl.rm, xa, "db_orders", key);
    begin_ok(cl.tm, 30000, "t3b-B", xb);
    txp_msg_t m[2], res;
    txp_msg_init(&m[0], TXP_MSG_GLOBAL_COMMIT);
    txp_msg_set_str(&m[0], TXP_F_XID, xa);
    msg_register(&m[1], xb, "db_orders", key, 4000, NULL);
    uint64_t id = 10 + 2 * (uint64_t)round;
    double t0 = now_ms();
    send_frames(c, m, 2, id);
    assert_int_equal(recv_answer(c, rd, id, &res, 10000), 0);
    assert_int_equal(res.code, 0);
    assert_int_equal(res.global_status, TXP_GS_COMMITTED);
    txp_msg_clear(&res);
    assert_int_equal(recv_answer(c, rd, id + 1, &res, 10000), 0);
    double took = now_ms() - t0;
    if (res.code != 0)
      fail_msg("round %d: waiting registration answered %s after %.0f ms: %s", round,
               txp_errname((int)res.code), took, res.message ? res.message : "");
    assert_true(res.branch_id > 0);
    txp_msg_clear(&res);
    if (took >= 2000) fail_msg("round %d: the free lock took %.0f ms to be granted", round, took);
    int status = -1;
    assert_int_equal(txc_rollback(cl.tm, xb, &status), 0);
    assert_int_equal(status, TXP_GS_ROLLBACKED);
  }

  /* In one batch: A wants k1 and k2 (k2 held by C), B waits for k1.  A
   * takes k1, meets C on k2 and gives k1 back; B, which met k1 held by A,
   * must not wait for A (which holds nothing). */
  char xa[TXP_MAX_XID_LEN + 1], xb[TXP_MAX_XID_LEN + 1], xc[TXP_MAX_XID_LEN + 1];
  begin_ok(cl.tm, 30000, "t3b-C", xc);
  register_ok(cl.rm, xc, "db_orders", "t_giveback:2");
  begin_ok(cl.tm, 30000, "t3b-A", xa);
  begin_ok(cl.tm, 30000, "t3b-B", xb);
  txp_msg_t m[2], res;
  msg_register(&m[0], xa, "db_orders", "t_giveback:1,2", 0, NULL);
  msg_register(&m[1], xb, "db_orders", "t_giveback:1", 4000, NULL);
  double t0 = now_ms();
  send_frames(c, m, 2, 100);
  assert_int_equal(recv_answer(c, rd, 100, &res, 10000), 0);
  assert_int_equal(res.code, TXP_ELOCK_CONFLICT);
  assert_non_null(res.lock_holder);
  assert_string_equal(res.lock_holder, xc);
  txp_msg_clear(&res);
  assert_int_equal(recv_answer(c, rd, 101, &res, 10000), 0);
  double took = now_ms() - t0;
  if (res.code != 0)
    fail_msg("B answered %s after %.0f ms: %s", txp_errname((int)res.code), took,
             res.message ? res.message : "");
  txp_msg_clear(&res);
  if (took >= 2000) fail_msg("the free lock took %.0f ms to be granted", took);
  char holder[TXP_MAX_XID_LEN + 1];
  db_text(SQL_KEY_HOLDER, "db_orders^^^t_giveback^^^1", holder, sizeof(holder));
  assert_string_equal(holder, xb);
  assert_int_equal(db_long(SQL_LOCKS, xa, NULL), 0);
  int status = -1;
  assert_int_equal(txc_rollback(cl.tm, xa, &status), 0);
  assert_int_equal(txc_rollback(cl.tm, xb, &status), 0);
  assert_int_equal(txc_rollback(cl.tm, xc, &status), 0);
  assert_int_equal(status, TXP_GS_ROLLBACKED);
}

/* 4. A transaction nobody finishes is rolled back at its deadline. */
static void test_timeout_rollback(void **state) {
  (void)state;
  cli_t cl;
  cli_open(&cl, "t4");
  char xid[TXP_MAX_XID_LEN + 1];
  begin_ok(cl.tm, 500, "t4-timeout", xid);
  int64_t b = register_ok(cl.rm, xid, "db_orders", "t_timeout:1");
  expect_history(xid, TXP_GS_TIMEOUT_ROLLBACKED, WAIT_MS);
  assert_int_equal(history_branches(xid, TXP_BS_PHASE2_ROLLBACKED), 1);
  assert_int_equal(db_long(SQL_LIVE_ROWS, xid, NULL), 0);
  int64_t ids[4];
  assert_int_equal(rm_events(xid, TXP_MSG_BRANCH_ROLLBACK, 0, ids, 4), 1);
  assert_true(ids[0] == b);

  int64_t nb = 0;
  int rc = txc_branch_register(cl.rm, xid, "db_orders", "t_timeout:2", 0, &nb, NULL);
  assert_true(rc == TXP_EGLOBAL_NOT_FOUND || rc == TXP_EGLOBAL_NOT_ACTIVE || rc == TXP_ETIMED_OUT);
  assert_int_equal(db_long(SQL_LIVE_ROWS, xid, NULL), 0);
  int status = -1;
  rc = txc_commit(cl.tm, xid, &status);
  assert_true(rc != 0);
  assert_true(txp_global_status_is_rollback(status));

  /* A commit that arrives after the deadline, before or after the timeout
   * job: never a success, always a rollback status. */
  char x2[TXP_MAX_XID_LEN + 1];
  begin_ok(cl.tm, 200, "t4-late-commit", x2);
  register_ok(cl.rm, x2, "db_orders", "t_timeout:3");
  assert_true(db_wait_long("SELECT count(*) FROM global_table WHERE xid = $1 AND "
                           "deadline < clock_timestamp()",
                           x2, NULL, 1, WAIT_MS) ||
              db_long(SQL_HISTORY_STATUS, x2, NULL) > 0);
  status = -1;
  rc = txc_commit(cl.tm, x2, &status);
  assert_true(rc != 0);
  assert_true(txp_global_status_is_rollback(status));
  expect_history(x2, TXP_GS_TIMEOUT_ROLLBACKED, WAIT_MS);
  assert_int_equal(db_long(SQL_LIVE_ROWS, x2, NULL), 0);
}

/* 5. Repeated messages get the same answer and change nothing. */
static void test_idempotency(void **state) {
  (void)state;
  cli_t cl;
  cli_open(&cl, "t5");
  char xid[TXP_MAX_XID_LEN + 1];
  int status = -1, status2 = -1;

  /* commit twice; rollback after commit */
  begin_ok(cl.tm, 30000, "t5-commit", xid);
  register_ok(cl.rm, xid, "db_orders", "t_idem:1");
  assert_int_equal(txc_commit(cl.tm, xid, &status), 0);
  assert_int_equal(status, TXP_GS_COMMITTED);
  assert_int_equal(txc_commit(cl.tm, xid, &status2), 0);
  assert_int_equal(status2, status);
  assert_int_equal(txc_rollback(cl.tm, xid, &status2), TXP_EGLOBAL_NOT_ACTIVE);
  assert_int_equal(status2, TXP_GS_COMMITTED);
  expect_history(xid, TXP_GS_COMMITTED, WAIT_MS);
  assert_int_equal(txc_commit(cl.tm, xid, &status2), 0);
  assert_int_equal(status2, TXP_GS_COMMITTED);
  assert_int_equal(txc_rollback(cl.tm, xid, &status2), TXP_EGLOBAL_NOT_ACTIVE);
  assert_int_equal(status2, TXP_GS_COMMITTED);
  assert_int_equal(rm_events(xid, TXP_MSG_BRANCH_COMMIT, 0, NULL, 0), 1);
  assert_int_equal(rm_events(xid, TXP_MSG_BRANCH_ROLLBACK, 0, NULL, 0), 0);

  /* unknown xid */
  char unknown[TXP_MAX_XID_LEN + 1];
  snprintf(unknown, sizeof(unknown), "%s:%d:999999999999", HOST, g_port);
  assert_int_equal(txc_commit(cl.tm, unknown, &status2), TXP_EGLOBAL_NOT_FOUND);
  assert_int_equal(txc_rollback(cl.tm, unknown, &status2), TXP_EGLOBAL_NOT_FOUND);
  assert_int_equal(txc_status(cl.tm, unknown, &status2), TXP_EGLOBAL_NOT_FOUND);
  assert_int_equal(db_long(SQL_LIVE_ROWS, unknown, NULL), 0);
  assert_int_equal(db_long(SQL_HISTORY_STATUS, unknown, NULL), -1);

  /* begin twice with one idempotency key */
  char idem[64], x1[TXP_MAX_XID_LEN + 1], x2[TXP_MAX_XID_LEN + 1];
  snprintf(idem, sizeof(idem), "t5-begin-%d", (int)getpid());
  assert_int_equal(txc_begin(cl.tm, 30000, "t5-idem", idem, x1), 0);
  assert_int_equal(txc_begin(cl.tm, 30000, "t5-idem", idem, x2), 0);
  assert_string_equal(x1, x2);
  assert_int_equal(db_long("SELECT count(*) FROM global_table WHERE idem_key = $1", idem, NULL), 1);

  /* register twice with one idempotency key */
  txp_msg_t req, res;
  msg_register(&req, x1, "db_orders", "t_idem:2", 0, "branch-1");
  assert_int_equal(txc_call(cl.rm, &req, &res, 10000), 0);
  assert_int_equal(res.code, 0);
  int64_t first = res.branch_id;
  txp_msg_clear(&res);
  assert_true(first > 0);
  msg_register(&req, x1, "db_orders", "t_idem:2", 0, "branch-1");
  assert_int_equal(txc_call(cl.rm, &req, &res, 10000), 0);
  assert_int_equal(res.code, 0);
  assert_int_equal(res.branch_id, first);
  txp_msg_clear(&res);
  assert_int_equal(db_long(SQL_BRANCHES, x1, NULL), 1);
  assert_int_equal(db_long(SQL_LOCKS, x1, NULL), 1);

  /* the same BranchReport twice */
  for (int i = 0; i < 2; i++) {
    txp_msg_init(&req, TXP_MSG_BRANCH_REPORT);
    txp_msg_set_str(&req, TXP_F_XID, x1);
    txp_msg_set_int(&req, TXP_F_BRANCH_ID, first);
    txp_msg_set_int(&req, TXP_F_BRANCH_STATUS, TXP_BS_PHASE1_DONE);
    assert_int_equal(txc_call(cl.rm, &req, &res, 10000), 0);
    assert_int_equal(res.code, 0);
    txp_msg_clear(&res);
  }
  char bid[32];
  snprintf(bid, sizeof(bid), "%" PRId64, first);
  assert_int_equal(db_long("SELECT status FROM branch_table WHERE branch_id = $1::bigint", bid, NULL),
                   TXP_BS_PHASE1_DONE);
  assert_int_equal(db_long(SQL_BRANCHES, x1, NULL), 1);
  assert_int_equal(db_long(SQL_GLOBAL_STATUS, x1, NULL), TXP_GS_BEGIN);

  assert_int_equal(txc_rollback(cl.tm, x1, &status), 0);
  assert_int_equal(status, TXP_GS_ROLLBACKED);
  assert_int_equal(txc_rollback(cl.tm, x1, &status2), 0);
  assert_int_equal(status2, TXP_GS_ROLLBACKED);
  assert_int_equal(txc_commit(cl.tm, x1, &status2), TXP_EGLOBAL_NOT_ACTIVE);
  assert_true(txp_global_status_is_rollback(status2));
  expect_history(x1, TXP_GS_ROLLBACKED, WAIT_MS);
  assert_int_equal(rm_events(x1, TXP_MSG_BRANCH_ROLLBACK, 0, NULL, 0), 1);
}

/* 6. The RM finds a dirty write: RollbackFailed, locks kept, tcd serves on. */
static void test_dirty_write(void **state) {
  (void)state;
  cli_t cl;
  cli_open(&cl, "t6");
  char xid[TXP_MAX_XID_LEN + 1];
  begin_ok(cl.tm, 30000, "t6-dirty", xid);
  int64_t b1 = register_ok(cl.rm, xid, "db_orders", "t_dirty:1");
  int64_t b2 = register_ok(cl.rm, xid, "db_stock", "t_dirty:2");
  rm_set_modes(false, false, b1);
  int status = -1;
  int rc = txc_rollback(cl.tm, xid, &status);
  assert_int_equal(rc, 0);
  assert_int_equal(status, TXP_GS_ROLLBACK_FAILED);
  assert_true(db_wait_long(SQL_GLOBAL_STATUS, xid, NULL, TXP_GS_ROLLBACK_FAILED, WAIT_MS));
  int64_t ids[8];
  assert_int_equal(rm_events(xid, TXP_MSG_BRANCH_ROLLBACK, 0, ids, 8), 2);
  assert_true(ids[0] == b2 && ids[1] == b1);
  char text[1024];
  db_text("SELECT last_error FROM global_table WHERE xid = $1", xid, text, sizeof(text));
  assert_non_null(strstr(text, "DIRTY_WRITE"));
  /* Locks stay (the row needs an operator), as do the branches. */
  assert_int_equal(db_long(SQL_LOCKS, xid, NULL), 2);
  assert_int_equal(db_long(SQL_BRANCHES, xid, NULL), 2);
  char bid[32];
  snprintf(bid, sizeof(bid), "%" PRId64, b1);
  assert_int_equal(db_long("SELECT status FROM branch_table WHERE branch_id = $1::bigint", bid, NULL),
                   TXP_BS_PHASE2_ROLLBACK_FAILED_UNRETRYABLE);
  assert_int_equal(db_long(SQL_HISTORY_STATUS, xid, NULL), -1);
  /* The failed transaction is left alone: no retry drives it again. */
  assert_int_equal(db_long("SELECT count(*) FROM global_table WHERE xid = $1 AND next_retry_at IS NULL",
                           xid, NULL), 1);
  rm_set_modes(false, false, 0);

  /* A late (repeated) phase-one report of the branch already undone is
   * accepted but does not undo its phase-two outcome: an operator re-drive
   * must not roll it back a second time. */
  txp_msg_t req, res;
  txp_msg_init(&req, TXP_MSG_BRANCH_REPORT);
  txp_msg_set_str(&req, TXP_F_XID, xid);
  txp_msg_set_int(&req, TXP_F_BRANCH_ID, b2);
  txp_msg_set_int(&req, TXP_F_BRANCH_STATUS, TXP_BS_PHASE1_DONE);
  assert_int_equal(txc_call(cl.rm, &req, &res, 10000), 0);
  assert_int_equal(res.code, 0);
  txp_msg_clear(&res);
  snprintf(bid, sizeof(bid), "%" PRId64, b2);
  assert_int_equal(db_long("SELECT status FROM branch_table WHERE branch_id = $1::bigint", bid, NULL),
                   TXP_BS_PHASE2_ROLLBACKED);
  assert_int_equal(db_long(SQL_GLOBAL_STATUS, xid, NULL), TXP_GS_ROLLBACK_FAILED);

  /* A repeated rollback answers the recorded outcome and drives nothing. */
  assert_int_equal(txc_rollback(cl.tm, xid, &status), 0);
  assert_int_equal(status, TXP_GS_ROLLBACK_FAILED);
  assert_int_equal(rm_events(xid, TXP_MSG_BRANCH_ROLLBACK, 0, NULL, 0), 2);

  /* Other transactions go on. */
  char x2[TXP_MAX_XID_LEN + 1];
  begin_ok(cl.tm, 30000, "t6-after", x2);
  register_ok(cl.rm, x2, "db_orders", "t_dirty:3");
  assert_int_equal(txc_commit(cl.tm, x2, &status), 0);
  assert_int_equal(status, TXP_GS_COMMITTED);
  expect_history(x2, TXP_GS_COMMITTED, WAIT_MS);
  /* ...but not on its locked rows. */
  char x3[TXP_MAX_XID_LEN + 1];
  begin_ok(cl.tm, 30000, "t6-blocked", x3);
  int64_t nb = 0;
  rc = txc_branch_register(cl.rm, x3, "db_orders", "t_dirty:1", 0, &nb, NULL);
  assert_true(rc == TXP_ELOCK_HOLDER_ROLLBACKING || rc == TXP_ELOCK_CONFLICT);
  assert_int_equal(txc_rollback(cl.tm, x3, &status), 0);
  assert_int_equal(status, TXP_GS_ROLLBACKED);
}

/* A TM+RM client that runs transactions until told to stop. */
typedef struct bg {
  pthread_t thread;
  int port;
  atomic_bool stop;
  atomic_int ok, failed;
  char error[256];
} bg_t;

static bg_t g_bg;
static bool g_bg_running;

static void bg_stop(void) {
  if (!g_bg_running) return;
  atomic_store(&g_bg.stop, true);
  pthread_join(g_bg.thread, NULL);
  g_bg_running = false;
}

static void *bg_main(void *arg) {
  bg_t *b = arg;
  char err[256];
  txc_t *tm = txc_connect(HOST, b->port, 2000, err, sizeof(err));
  txc_t *c = txc_connect(HOST, b->port, 2000, err, sizeof(err));
  int rc = (!tm || !c) ? TXP_ECONN_LOST : txc_register(tm, false, "bg", "bg-tm", TOKEN, NULL);
  if (rc == 0) rc = txc_register(c, true, "bg", "bg-rm", TOKEN, "db_client");
  if (rc != 0) {
    snprintf(b->error, sizeof(b->error), "register: %s", txp_errname(rc));
    atomic_fetch_add(&b->failed, 1);
  }
  for (int i = 0; rc == 0 && !atomic_load(&b->stop); i++) {
    char xid[TXP_MAX_XID_LEN + 1], keys[64];
    int status = -1;
    snprintf(keys, sizeof(keys), "t_bg:%d", i);
    rc = txc_begin(tm, 30000, "bg", NULL, xid);
    if (rc == 0) rc = txc_branch_register(c, xid, "db_orders", keys, 0, NULL, NULL);
    if (rc == 0) rc = txc_commit(tm, xid, &status);
    if (rc == 0 && status != TXP_GS_COMMITTED) rc = TXP_EINTERNAL;
    if (rc != 0) {
      snprintf(b->error, sizeof(b->error), "transaction %d: %s", i, txp_errname(rc));
      atomic_fetch_add(&b->failed, 1);
    } else {
      atomic_fetch_add(&b->ok, 1);
    }
  }
  txc_close(tm);
  txc_close(c);
  return NULL;
}

static void bg_wait_more(bg_t *b, int more) {
  int want = atomic_load(&b->ok) + more;
  double deadline = now_ms() + WAIT_MS;
  while (atomic_load(&b->ok) < want && atomic_load(&b->failed) == 0 && now_ms() < deadline) nap();
  if (atomic_load(&b->failed) != 0 || atomic_load(&b->ok) < want)
    fail_msg("background client stalled or failed: ok=%d failed=%d %s", atomic_load(&b->ok),
             atomic_load(&b->failed), b->error);
}

static void frame_header(unsigned char *h, unsigned major, unsigned type, uint64_t id, uint32_t body_len) {
  h[0] = 0xDA;
  h[1] = 0xDA;
  h[2] = (unsigned char)major;
  h[3] = 0;
  h[4] = (unsigned char)(type >> 8);
  h[5] = (unsigned char)type;
  h[6] = 0;
  h[7] = 0;
  for (int i = 0; i < 8; i++) h[8 + i] = (unsigned char)(id >> (56 - 8 * i));
  for (int i = 0; i < 4; i++) h[16 + i] = (unsigned char)(body_len >> (24 - 8 * i));
}

/* 7. Bad input is refused with a clear error and changes nothing; broken
 * streams close only their own connection. */
static void test_bad_input(void **state) {
  (void)state;
  bg_t *b = &g_bg;
  memset(b, 0, sizeof(*b));
  b->port = g_port;
  atomic_init(&b->stop, false);
  atomic_init(&b->ok, 0);
  atomic_init(&b->failed, 0);
  assert_int_equal(pthread_create(&b->thread, NULL, bg_main, b), 0);
  g_bg_running = true;

  bg_wait_more(b, 3);

  /* wrong token */
  txc_t *c = raw_connect();
  assert_int_equal(txc_register(c, true, "intruder", "intruder", "not-the-token", "db_orders"),
                   TXP_EAUTH);
  assert_true(txc_wait_closed(c, 5000));
  untrack_close(c);
  c = raw_connect();
  assert_int_equal(txc_register(c, false, "intruder", "intruder", NULL, NULL), TXP_EAUTH);
  assert_true(txc_wait_closed(c, 5000));
  untrack_close(c);

  cli_t cl;
  cli_open(&cl, "t7");
  char xid[TXP_MAX_XID_LEN + 1];
  begin_ok(cl.tm, 30000, "t7-bad", xid);

  /* malformed lock keys */
  static const char *const bad_keys[] = {
    "t_order", "t_order:", ":1", "t_order:1;", "t_order:1,,2", "t_order:1;;t_stock:2", "t^x:1", "t:a\tb",
  };
  for (size_t i = 0; i < sizeof(bad_keys) / sizeof(bad_keys[0]); i++) {
    int64_t nb = 0;
    int rc = txc_branch_register(cl.rm, xid, "db_orders", bad_keys[i], 0, &nb, NULL);
    if (rc != TXP_EBAD_REQUEST) fail_msg("lock keys \"%s\": got %s, expected BAD_REQUEST", bad_keys[i], txp_errname(rc));
  }
  /* unsupported branch type */
  txp_msg_t req, res;
  msg_register(&req, xid, "db_orders", "t_bad:1", 0, NULL);
  txp_msg_set_int(&req, TXP_F_BRANCH_TYPE, TXP_BT_SAGA);
  assert_int_equal(txc_call(cl.rm, &req, &res, 10000), 0);
  assert_int_equal(res.code, TXP_EBAD_REQUEST);
  assert_non_null(res.message);
  txp_msg_clear(&res);
  /* empty resource; lock wait above the limit */
  msg_register(&req, xid, "", "t_bad:1", 0, NULL);
  assert_int_equal(txc_call(cl.rm, &req, &res, 10000), 0);
  assert_int_equal(res.code, TXP_EBAD_REQUEST);
  txp_msg_clear(&res);
  msg_register(&req, xid, "db_orders", "t_bad:1", 600001, NULL);
  assert_int_equal(txc_call(cl.rm, &req, &res, 10000), 0);
  assert_int_equal(res.code, TXP_EBAD_REQUEST);
  txp_msg_clear(&res);
  assert_int_equal(db_long(SQL_BRANCHES, xid, NULL), 0);
  assert_int_equal(db_long(SQL_LOCKS, xid, NULL), 0);

  /* timeout above the maximum */
  char name[64], xbad[TXP_MAX_XID_LEN + 1] = "";
  snprintf(name, sizeof(name), "t7-too-long-%d", (int)getpid());
  assert_int_equal(txc_begin(cl.tm, 600001, name, NULL, xbad), TXP_EBAD_REQUEST);
  assert_int_equal(db_long("SELECT (SELECT count(*) FROM global_table WHERE transaction_name = $1) + "
                           "(SELECT count(*) FROM global_history WHERE transaction_name = $1)",
                           name, NULL),
                   0);
  /* a valid request still works on the same connection */
  int64_t ok_branch = register_ok(cl.rm, xid, "db_orders", "t_bad:1");
  assert_true(ok_branch > 0);
  int64_t ok_branch2 = register_ok(cl.rm, xid, "db_stock", "t_bad:2");

  /* BranchReport naming no branch of the xid (0, negative, unknown) */
  static const int64_t bad_ids[] = {0, -1, 999999999999};
  for (size_t i = 0; i < sizeof(bad_ids) / sizeof(bad_ids[0]); i++) {
    txp_msg_init(&req, TXP_MSG_BRANCH_REPORT);
    txp_msg_set_str(&req, TXP_F_XID, xid);
    txp_msg_set_int(&req, TXP_F_BRANCH_ID, bad_ids[i]);
    txp_msg_set_int(&req, TXP_F_BRANCH_STATUS, TXP_BS_PHASE1_FAILED);
    assert_int_equal(txc_call(cl.rm, &req, &res, 10000), 0);
    if (res.code != TXP_EBAD_REQUEST && res.code != TXP_EBRANCH_NOT_FOUND)
      fail_msg("BranchReport of branch %" PRId64 ": got %s", bad_ids[i], txp_errname((int)res.code));
    txp_msg_clear(&res);
  }
  assert_int_equal(db_long("SELECT count(*) FROM branch_table WHERE xid = $1 AND status = 1", xid, NULL), 2);
  /* ...and a report for an unknown xid */
  txp_msg_init(&req, TXP_MSG_BRANCH_REPORT);
  txp_msg_set_str(&req, TXP_F_XID, "no-such-xid");
  txp_msg_set_int(&req, TXP_F_BRANCH_ID, ok_branch);
  txp_msg_set_int(&req, TXP_F_BRANCH_STATUS, TXP_BS_PHASE1_DONE);
  assert_int_equal(txc_call(cl.rm, &req, &res, 10000), 0);
  assert_int_equal(res.code, TXP_EGLOBAL_NOT_FOUND);
  txp_msg_clear(&res);
  (void)ok_branch2;

  /* garbage bytes */
  c = raw_connect();
  static const char garbage[] = "GET / HTTP/1.1\r\nHost: tcd\r\n\r\nthis is not a frame at all";
  assert_int_equal(txc_send_raw(c, garbage, sizeof(garbage) - 1), 0);
  assert_true(txc_wait_closed(c, 5000));
  untrack_close(c);
  /* garbage after a good registration */
  c = client(false, "t7-garbage-tm", NULL);
  assert_int_equal(txc_send_raw(c, "\x00\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c\x0d\x0e\x0f\x10\x11\x12\x13", 20), 0);
  assert_true(txc_wait_closed(c, 5000));
  untrack_close(c);
  /* a header announcing a body far over the limit */
  unsigned char h[TXP_HEADER_SIZE + 64];
  c = client(false, "t7-huge-tm", NULL);
  frame_header(h, TXP_VERSION_MAJOR, TXP_MSG_GLOBAL_BEGIN, 1, 0x7fffffffu);
  assert_int_equal(txc_send_raw(c, h, TXP_HEADER_SIZE), 0);
  assert_true(txc_wait_closed(c, 5000));
  untrack_close(c);
  /* another major version */
  c = raw_connect();
  frame_header(h, TXP_VERSION_MAJOR + 1, TXP_MSG_REGISTER_TM, 1, 0);
  assert_int_equal(txc_send_raw(c, h, TXP_HEADER_SIZE), 0);
  assert_true(txc_wait_closed(c, 5000));
  untrack_close(c);
  /* a truncated frame: valid header, half the body, then the client goes */
  for (int i = 0; i < 2; i++) {
    c = i ? client(false, "t7-trunc-tm", NULL) : raw_connect();
    frame_header(h, TXP_VERSION_MAJOR, TXP_MSG_GLOBAL_BEGIN, 7, 64);
    memset(h + TXP_HEADER_SIZE, 0x81, 32);
    assert_int_equal(txc_send_raw(c, h, TXP_HEADER_SIZE + 32), 0);
    untrack_close(c);
  }
  /* a truncated frame left hanging does not block the others either */
  c = client(false, "t7-hang-tm", NULL);
  frame_header(h, TXP_VERSION_MAJOR, TXP_MSG_GLOBAL_BEGIN, 8, 64);
  assert_int_equal(txc_send_raw(c, h, TXP_HEADER_SIZE + 10), 0);

  /* The registered clients kept working all along. */
  bg_wait_more(b, 3);
  int status = -1;
  assert_int_equal(txc_rollback(cl.tm, xid, &status), 0);
  assert_int_equal(status, TXP_GS_ROLLBACKED);
  assert_true(tcd_alive());
  bg_stop();
  if (atomic_load(&b->failed) != 0) fail_msg("background client failed: %s", b->error);
  assert_true(atomic_load(&b->ok) >= 6);
}

/* 7b. A connection may register again (a new identity) while its earlier
 * requests are still being served, even waiting for a lock: those keep the
 * identity they were sent under, and nothing reads the old one after it
 * is gone. */
static void test_reregister_in_flight(void **state) {
  (void)state;
  cli_t cl;
  cli_open(&cl, "t7b");
  txc_t *c = client(true, "t7b-first", "db_client");
  reader_t *dec = new_reader();
  char xid[TXP_MAX_XID_LEN + 1];
  begin_ok(cl.tm, 30000, "t7b", xid);

  /* BranchRegister and, in the same write, RegisterRM with a new id. */
  txp_msg_t m[2], res;
  msg_register(&m[0], xid, "db_orders", "t_rereg:1", 0, NULL);
  txp_msg_init(&m[1], TXP_MSG_REGISTER_RM);
  txp_msg_set_str(&m[1], TXP_F_APP_ID, "test-app-2");
  txp_msg_set_str(&m[1], TXP_F_CLIENT_ID, "t7b-second-identity");
  txp_msg_set_str(&m[1], TXP_F_TOKEN, TOKEN);
  txp_msg_set_str(&m[1], TXP_F_RESOURCE_IDS, "db_client");
  send_frames(c, m, 2, 10);
  assert_int_equal(recv_answer(c, dec, 10, &res, 10000), 0);
  assert_int_equal(res.code, 0);
  int64_t b1 = res.branch_id;
  txp_msg_clear(&res);
  assert_int_equal(recv_answer(c, dec, 11, &res, 10000), 0);
  assert_int_equal(res.code, 0);
  txp_msg_clear(&res);
  char bid[32], text[256];
  snprintf(bid, sizeof(bid), "%" PRId64, b1);
  db_text("SELECT client_id FROM branch_table WHERE branch_id = $1::bigint", bid, text, sizeof(text));
  assert_string_equal(text, "t7b-first");

  /* GlobalBegin and, in the same write, RegisterTM with a new identity. */
  txp_msg_init(&m[0], TXP_MSG_GLOBAL_BEGIN);
  txp_msg_set_int(&m[0], TXP_F_TIMEOUT_MS, 30000);
  txp_msg_init(&m[1], TXP_MSG_REGISTER_TM);
  txp_msg_set_str(&m[1], TXP_F_APP_ID, "test-app-3");
  txp_msg_set_str(&m[1], TXP_F_CLIENT_ID, "t7b-third-identity");
  txp_msg_set_str(&m[1], TXP_F_TOKEN, TOKEN);
  send_frames(c, m, 2, 20);
  assert_int_equal(recv_answer(c, dec, 20, &res, 10000), 0);
  assert_int_equal(res.code, 0);
  assert_non_null(res.xid);
  char x2[TXP_MAX_XID_LEN + 1];
  snprintf(x2, sizeof(x2), "%s", res.xid);
  txp_msg_clear(&res);
  assert_int_equal(recv_answer(c, dec, 21, &res, 10000), 0);
  assert_int_equal(res.code, 0);
  txp_msg_clear(&res);
  db_text("SELECT application_id FROM global_table WHERE xid = $1", x2, text, sizeof(text));
  assert_string_equal(text, "test-app-2");

  /* A registration waiting for a lock while its connection registers
   * again: it is served after the holder goes, under its first identity. */
  char xw[TXP_MAX_XID_LEN + 1];
  begin_ok(cl.tm, 30000, "t7b-wait", xw);
  msg_register(&m[0], xw, "db_orders", "t_rereg:1", 5000, NULL);
  msg_register(&m[1], xw, "db_orders", "t_rereg:1", 0, NULL);
  send_frames(c, m, 2, 30);
  assert_int_equal(recv_answer(c, dec, 31, &res, 10000), 0);
  assert_int_equal(res.code, TXP_ELOCK_CONFLICT);
  txp_msg_clear(&res);
  txp_msg_init(&m[0], TXP_MSG_REGISTER_RM);
  txp_msg_set_str(&m[0], TXP_F_APP_ID, "test-app-4");
  txp_msg_set_str(&m[0], TXP_F_CLIENT_ID, "t7b-fourth-identity");
  txp_msg_set_str(&m[0], TXP_F_TOKEN, TOKEN);
  txp_msg_set_str(&m[0], TXP_F_RESOURCE_IDS, "db_client");
  send_frames(c, m, 1, 32);
  assert_int_equal(recv_answer(c, dec, 32, &res, 10000), 0);
  assert_int_equal(res.code, 0);
  txp_msg_clear(&res);
  int status = -1;
  assert_int_equal(txc_commit(cl.tm, xid, &status), 0);
  assert_int_equal(status, TXP_GS_COMMITTED);
  assert_int_equal(recv_answer(c, dec, 30, &res, 10000), 0);
  assert_int_equal(res.code, 0);
  int64_t bw = res.branch_id;
  txp_msg_clear(&res);
  snprintf(bid, sizeof(bid), "%" PRId64, bw);
  db_text("SELECT client_id FROM branch_table WHERE branch_id = $1::bigint", bid, text, sizeof(text));
  assert_string_equal(text, "t7b-third-identity");
  assert_int_equal(txc_rollback(cl.tm, xw, &status), 0);
  assert_int_equal(status, TXP_GS_ROLLBACKED);
  assert_int_equal(txc_rollback(cl.tm, x2, &status), 0);
  assert_int_equal(status, TXP_GS_ROLLBACKED);
  assert_true(tcd_alive());
}

/* 8. tcd is killed mid-way; another one on the same store finishes its
 * work: a decided commit whose branches were not told, a decided rollback
 * whose first branch did not answer, and a Begin transaction that must
 * time out. */
static void test_crash_recovery(void **state) {
  (void)state;
  cli_t cl;
  cli_open(&cl, "t8");
  rm_set_modes(true, true, 0);
  char x1[TXP_MAX_XID_LEN + 1], x2[TXP_MAX_XID_LEN + 1], x4[TXP_MAX_XID_LEN + 1];
  begin_ok(cl.tm, 60000, "t8-committed", x1);
  int64_t b1 = register_ok(cl.rm, x1, "db_orders", "t_crash:1");
  int64_t b2 = register_ok(cl.rm, x1, "db_stock", "t_crash:2");
  begin_ok(cl.tm, 1500, "t8-begun", x2);
  int64_t b3 = register_ok(cl.rm, x2, "db_orders", "t_crash:3");
  begin_ok(cl.tm, 60000, "t8-rolling-back", x4);
  int64_t b4 = register_ok(cl.rm, x4, "db_orders", "t_crash:4");
  int64_t b5 = register_ok(cl.rm, x4, "db_stock", "t_crash:5");
  txc_t *cr = client(false, "t8-rollbacker", NULL);
  txp_msg_t req;
  txp_msg_init(&req, TXP_MSG_GLOBAL_ROLLBACK);
  txp_msg_set_str(&req, TXP_F_XID, x4);
  send_frames(cr, &req, 1, 1);
  int status = -1;
  assert_int_equal(txc_commit(cl.tm, x1, &status), 0);
  assert_int_equal(status, TXP_GS_COMMITTED);
  /* The RM heard of both commits but says nothing. */
  assert_true(rm_wait_events(x1, TXP_MSG_BRANCH_COMMIT, 0, 2, WAIT_MS));
  assert_int_equal(db_long(SQL_GLOBAL_STATUS, x1, NULL), TXP_GS_ASYNC_COMMITTING);
  assert_int_equal(db_long(SQL_GLOBAL_STATUS, x2, NULL), TXP_GS_BEGIN);
  assert_int_equal(db_long(SQL_LOCKS, x1, NULL), 0); /* commit released them */
  /* The rollback is decided and waits for its newest branch. */
  assert_true(rm_wait_events(x4, TXP_MSG_BRANCH_ROLLBACK, 0, 1, WAIT_MS));
  assert_int_equal(db_long(SQL_GLOBAL_STATUS, x4, NULL), TXP_GS_ROLLBACKING);
  assert_int_equal(db_long("SELECT count(*) FROM lock_table WHERE xid = $1 AND status = 1", x4, NULL), 2);

  int gen = rm_generation();
  tcd_kill9();
  untrack_close(cl.tm);
  untrack_close(cl.rm);
  untrack_close(cr);
  rm_set_modes(false, false, 0);
  assert_int_equal(tcd_start(), 0);
  assert_true(rm_wait_generation(gen, WAIT_MS));

  expect_history(x1, TXP_GS_COMMITTED, 20000);
  assert_int_equal(history_branches(x1, TXP_BS_PHASE2_COMMITTED), 2);
  int64_t ids[8];
  int n = rm_events(x1, TXP_MSG_BRANCH_COMMIT, gen, ids, 8);
  assert_true(n >= 2);
  assert_true(has_id(ids, n, b1) && has_id(ids, n, b2));
  assert_int_equal(db_long(SQL_LIVE_ROWS, x1, NULL), 0);

  expect_history(x2, TXP_GS_TIMEOUT_ROLLBACKED, 20000);
  assert_int_equal(history_branches(x2, TXP_BS_PHASE2_ROLLBACKED), 1);
  n = rm_events(x2, TXP_MSG_BRANCH_ROLLBACK, gen, ids, 8);
  assert_true(n >= 1 && has_id(ids, n, b3));
  assert_int_equal(rm_events(x2, TXP_MSG_BRANCH_COMMIT, 0, NULL, 0), 0);
  assert_int_equal(db_long(SQL_LIVE_ROWS, x2, NULL), 0);

  expect_history(x4, TXP_GS_ROLLBACKED, 20000);
  assert_int_equal(history_branches(x4, TXP_BS_PHASE2_ROLLBACKED), 2);
  n = rm_events(x4, TXP_MSG_BRANCH_ROLLBACK, gen, ids, 8);
  assert_true(n >= 2);
  assert_true(ids[0] == b5 && has_id(ids, n, b4)); /* newest first again */
  assert_int_equal(rm_events(x4, TXP_MSG_BRANCH_COMMIT, 0, NULL, 0), 0);
  assert_int_equal(db_long(SQL_LIVE_ROWS, x4, NULL), 0);

  /* The new node serves new work. */
  cli_open(&cl, "t8b");
  char x3[TXP_MAX_XID_LEN + 1];
  begin_ok(cl.tm, 30000, "t8-after", x3);
  register_ok(cl.rm, x3, "db_orders", "t_crash:1");
  assert_int_equal(txc_commit(cl.tm, x3, &status), 0);
  assert_int_equal(status, TXP_GS_COMMITTED);
  expect_history(x3, TXP_GS_COMMITTED, WAIT_MS);
}

/* 9. SIGTERM stops tcd cleanly, even with work in every stage: a
 * transaction left open, a registration waiting for a lock, a rollback
 * whose RM has not answered (a TC->RM call pending), and a commit whose
 * branches have not answered.  Exit status 0: no sanitizer report, no leak
 * at exit.  What was decided stays decided in the store. */
static void test_clean_stop(void **state) {
  (void)state;
  cli_t cl;
  cli_open(&cl, "t9");
  char xo[TXP_MAX_XID_LEN + 1], xw[TXP_MAX_XID_LEN + 1], xr[TXP_MAX_XID_LEN + 1];
  char xc[TXP_MAX_XID_LEN + 1];
  begin_ok(cl.tm, 60000, "t9-open", xo);
  register_ok(cl.rm, xo, "db_orders", "t_stop:1");

  /* a waiter for the open transaction's key */
  begin_ok(cl.tm, 60000, "t9-waiter", xw);
  txc_t *cw = client(true, "t9-waiter", "db_waiter");
  reader_t *rw = new_reader();
  txp_msg_t m[2], res;
  msg_register(&m[0], xw, "db_orders", "t_stop:1", 30000, NULL);
  msg_register(&m[1], xw, "db_orders", "t_stop:1", 0, NULL);
  send_frames(cw, m, 2, 1);
  assert_int_equal(recv_answer(cw, rw, 2, &res, 10000), 0);
  assert_int_equal(res.code, TXP_ELOCK_CONFLICT);
  txp_msg_clear(&res);

  /* a rollback and a commit, both waiting for the silent RM */
  rm_set_modes(true, true, 0);
  begin_ok(cl.tm, 60000, "t9-rollback", xr);
  register_ok(cl.rm, xr, "db_orders", "t_stop:2");
  register_ok(cl.rm, xr, "db_stock", "t_stop:3");
  begin_ok(cl.tm, 60000, "t9-commit", xc);
  register_ok(cl.rm, xc, "db_orders", "t_stop:4");
  register_ok(cl.rm, xc, "db_stock", "t_stop:5");
  txc_t *cr = client(false, "t9-rollbacker", NULL);
  txp_msg_init(&m[0], TXP_MSG_GLOBAL_ROLLBACK);
  txp_msg_set_str(&m[0], TXP_F_XID, xr);
  send_frames(cr, m, 1, 1);
  int status = -1;
  assert_int_equal(txc_commit(cl.tm, xc, &status), 0);
  assert_int_equal(status, TXP_GS_COMMITTED);
  assert_true(rm_wait_events(xr, TXP_MSG_BRANCH_ROLLBACK, 0, 1, WAIT_MS));
  assert_true(rm_wait_events(xc, TXP_MSG_BRANCH_COMMIT, 0, 2, WAIT_MS));

  assert_true(tcd_alive());
  g_stopped_on_purpose = true;
  int st = tcd_stop();
  assert_true(st != -1);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
    fail_msg("tcd did not exit cleanly on SIGTERM: status 0x%x", st);
  assert_true(txc_wait_closed(cl.tm, 5000));
  assert_true(txc_wait_closed(cw, 5000));

  /* What it left is durable; nothing was decided that was not asked. */
  assert_int_equal(db_long(SQL_GLOBAL_STATUS, xo, NULL), TXP_GS_BEGIN);
  assert_int_equal(db_long(SQL_LOCKS, xo, NULL), 1);
  assert_int_equal(db_long(SQL_GLOBAL_STATUS, xw, NULL), TXP_GS_BEGIN);
  assert_int_equal(db_long(SQL_BRANCHES, xw, NULL), 0);
  long sr = db_long(SQL_GLOBAL_STATUS, xr, NULL);
  assert_true(sr == TXP_GS_ROLLBACKING || sr == TXP_GS_ROLLBACK_RETRYING);
  long sc = db_long(SQL_GLOBAL_STATUS, xc, NULL);
  assert_true(sc == TXP_GS_ASYNC_COMMITTING || sc == TXP_GS_COMMIT_RETRYING);
  assert_int_equal(db_long(SQL_LOCKS, xc, NULL), 0);
}

/* ------------------------------------------------------------- group */

static int group_setup(void **state) {
  (void)state;
  g_test_pid = getpid();
  g_pg_url = getenv("TC_PG_URL");
  const char *bin = getenv("TX_BIN_DIR");
  if (!g_pg_url || !bin) {
    fprintf(stderr, "test_tcd: TC_PG_URL and TX_BIN_DIR must be set (run it through ctest)\n");
    return -1;
  }
  snprintf(g_tcd_path, sizeof(g_tcd_path), "%s/tcd", bin);
  if (access(g_tcd_path, X_OK) != 0) {
    fprintf(stderr, "test_tcd: no tcd binary at %s\n", g_tcd_path);
    return -1;
  }
  signal(SIGPIPE, SIG_IGN);
  g_pg = PQconnectdb(g_pg_url);
  if (PQstatus(g_pg) != CONNECTION_OK) {
    fprintf(stderr, "test_tcd: could not connect to %s: %s\n", g_pg_url, PQerrorMessage(g_pg));
    return -1;
  }
  atexit(kill_at_exit);
  if (tcd_start() != 0) {
    fprintf(stderr, "test_tcd: could not start %s\n", g_tcd_path);
    return -1;
  }
  if (pthread_create(&rm.thread, NULL, rm_main, NULL) != 0) return -1;
  rm.started = true;
  if (!rm_wait_generation(0, WAIT_MS)) {
    fprintf(stderr, "test_tcd: the RM thread could not register\n");
    return -1;
  }
  return 0;
}

static int group_teardown(void **state) {
  (void)state;
  if (rm.started) {
    pthread_mutex_lock(&rm.mu);
    rm.stop = true;
    pthread_mutex_unlock(&rm.mu);
    pthread_join(rm.thread, NULL);
    rm.started = false;
  }
  int rc = 0;
  if (g_tcd > 0) {
    int st = tcd_stop();
    if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      fprintf(stderr, "test_tcd: tcd did not exit cleanly: status 0x%x\n", st);
      rc = -1;
    }
  }
  PQfinish(g_pg);
  g_pg = NULL;
  return rc;
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup_teardown(test_commit_two_branches, test_setup, test_teardown),
    cmocka_unit_test_setup_teardown(test_rollback_two_branches, test_setup, test_teardown),
    cmocka_unit_test_setup_teardown(test_lock_conflict_fifo, test_setup, test_teardown),
    cmocka_unit_test_setup_teardown(test_lock_release_race, test_setup, test_teardown),
    cmocka_unit_test_setup_teardown(test_timeout_rollback, test_setup, test_teardown),
    cmocka_unit_test_setup_teardown(test_idempotency, test_setup, test_teardown),
    cmocka_unit_test_setup_teardown(test_dirty_write, test_setup, test_teardown),
    cmocka_unit_test_setup_teardown(test_bad_input, test_setup, test_teardown),
    cmocka_unit_test_setup_teardown(test_reregister_in_flight, test_setup, test_teardown),
    cmocka_unit_test_setup_teardown(test_crash_recovery, test_setup, test_teardown),
    cmocka_unit_test_setup_teardown(test_clean_stop, test_setup, test_teardown),
  };
  return cmocka_run_group_tests_name("tcd", tests, group_setup, group_teardown);
}
