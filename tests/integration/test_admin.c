/*
 * test_admin.c - the operator's view of a running tcd: the admin socket
 * (access control, framing, every command and repair), tcctl, and the
 * metrics endpoint (/metrics, /healthz, /readyz).
 *
 * NOTES
 *   A real tcd (TX_BIN_DIR/tcd, sanitizers and all) on a real PostgreSQL
 *   (TC_PG_URL; run through scripts/with-servers --pg), forked by the group
 *   setup with an admin socket in a temporary directory and metrics on a
 *   free loopback port.  Its stderr goes to a file that the checks read
 *   (repairs are logged with the operator's uid) and that the group
 *   teardown copies to the test's stderr; any sanitizer report in it fails
 *   the group.
 *
 *   Two simulated resource managers, each a thread with its own
 *   connection: "rm" serves db_orders and db_stock and answers OK, holds
 *   its answers (silent) or answers DIRTY_WRITE for chosen branches; "late"
 *   serves db_nobody and is started only when a test wants the branches
 *   that nobody served so far to be driven to their end.  Until then a
 *   branch on db_nobody has no RM, which is how the retrying states are
 *   made.
 *
 *   Each state of a global transaction is created by driving real
 *   transactions (txclient) and is checked through the socket field by
 *   field; every repair is checked against the database afterwards, and
 *   every refusal is checked to have changed nothing.  Asynchronous effects
 *   are waited for by polling with a deadline, never by fixed sleeps.
 *
 *   Access control runs tcctl and a raw client as "nobody" (fork, setgid,
 *   setuid); it needs root and is skipped otherwise.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <inttypes.h>
#include <jansson.h>
#include <libpq-fe.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "txclient.h"
#include "txp_msg.h"

#define TOKEN "test-token"
#define HOST "127.0.0.1"
#define WAIT_MS 15000
#define POLL_NS 10000000L
#define MAX_REQUEST 512
#define IDLE_MS 1500
#define NOBODY 65534

extern char **environ;

static double now_ms(void) { return txc_now_ms(); }

static void nap(void) {
  struct timespec ts = {0, POLL_NS};
  nanosleep(&ts, NULL);
}

/* ----------------------------------------------------------- processes */

static char g_bin[4096], g_tcd_path[4200], g_tcctl_path[4200];
static const char *g_pg_url;
static char g_dir[256], g_sock[300], g_log[300];
static pid_t g_tcd = -1;
static int g_port, g_mport;
static pid_t g_test_pid;
static PGconn *g_pg;

static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  struct sockaddr_in sa;
  memset(&sa, 0, sizeof(sa));
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t sl = sizeof(sa);
  int port = -1;
  if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 && getsockname(fd, (struct sockaddr *)&sa, &sl) == 0)
    port = ntohs(sa.sin_port);
  close(fd);
  return port;
}

/* fork + execve tcd with our environment minus TC_*, plus 'extra' (NULL
 * terminated), stderr appended to 'log'. */
static pid_t spawn_tcd(const char *const *extra, const char *log) {
  size_t n = 0, ne = 0;
  while (environ[n]) n++;
  while (extra[ne]) ne++;
  char **envp = calloc(n + ne + 1, sizeof(char *));
  if (!envp) return -1;
  size_t k = 0;
  for (size_t i = 0; i < n; i++)
    if (strncmp(environ[i], "TC_", 3) != 0) envp[k++] = environ[i];
  for (size_t i = 0; i < ne; i++) envp[k++] = (char *)(uintptr_t)extra[i];
  envp[k] = NULL;
  char *argv[] = {g_tcd_path, NULL};
  int logfd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  pid_t parent = getpid();
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(126);
    if (logfd >= 0) dup2(logfd, 2);
    execve(g_tcd_path, argv, envp);
    _exit(127);
  }
  if (logfd >= 0) close(logfd);
  free(envp);
  return pid;
}

static bool wait_serving(pid_t pid, int port, const char *sock, int timeout_ms) {
  double deadline = now_ms() + timeout_ms;
  while (now_ms() < deadline) {
    int st;
    if (waitpid(pid, &st, WNOHANG) == pid) {
      fprintf(stderr, "test_admin: tcd exited at start-up (status 0x%x)\n", st);
      return false;
    }
    char err[256];
    txc_t *c = txc_connect(HOST, port, 200, err, sizeof(err));
    if (c) {
      int rc = txc_register(c, false, "probe", "probe", TOKEN, NULL);
      txc_close(c);
      struct stat sb;
      if (rc == 0 && (!sock || stat(sock, &sb) == 0)) return true;
    }
    nap();
  }
  return false;
}

static int stop_pid(pid_t pid, int timeout_ms) {
  kill(pid, SIGTERM);
  double deadline = now_ms() + timeout_ms;
  int st = 0;
  while (now_ms() < deadline) {
    if (waitpid(pid, &st, WNOHANG) == pid) return st;
    nap();
  }
  kill(pid, SIGKILL);
  waitpid(pid, &st, 0);
  return -1;
}

static void kill_at_exit(void) {
  if (getpid() == g_test_pid && g_tcd > 0) {
    kill(g_tcd, SIGKILL);
    waitpid(g_tcd, NULL, 0);
  }
}

/* Whether the tcd log contains 'needle'. */
static bool log_has(const char *needle) {
  FILE *f = fopen(g_log, "r");
  if (!f) return false;
  char line[8192];
  bool found = false;
  while (!found && fgets(line, sizeof(line), f)) found = strstr(line, needle) != NULL;
  fclose(f);
  return found;
}

/* ------------------------------------------------------- simulated RMs */

#define RM_MAX_PENDING 64
#define RM_MAX_DIRTY 16

typedef struct rmsim {
  const char *name, *resources;
  pthread_mutex_t mu;
  pthread_t thread;
  bool started, stop;
  bool silent_commit, silent_rollback;
  int64_t dirty[RM_MAX_DIRTY];
  int ndirty;
  int generation;
  int commits, rollbacks;
  struct {
    int type;
    uint64_t request_id;
    int64_t branch_id;
  } pending[RM_MAX_PENDING];
  int npending;
} rmsim_t;

static rmsim_t g_rm = {.name = "rm-main", .resources = "db_orders,db_stock", .mu = PTHREAD_MUTEX_INITIALIZER};
static rmsim_t g_late = {.name = "rm-late", .resources = "db_nobody", .mu = PTHREAD_MUTEX_INITIALIZER};

static bool rm_is_dirty(rmsim_t *r, int64_t b) {
  for (int i = 0; i < r->ndirty; i++)
    if (r->dirty[i] == b) return true;
  return false;
}

/* A "dirty" branch fails for good: its rollback meets a dirty write, its
 * commit an unretryable error. */
static void rm_fill(rmsim_t *r, int type, int64_t branch, txp_msg_t *res) {
  if (type == TXP_MSG_BRANCH_ROLLBACK && rm_is_dirty(r, branch)) {
    txp_msg_set_int(res, TXP_F_CODE, TXP_EDIRTY_WRITE);
    txp_msg_set_str(res, TXP_F_MESSAGE, "dirty write: row changed since the branch ran");
    return;
  }
  if (type == TXP_MSG_BRANCH_COMMIT && rm_is_dirty(r, branch)) {
    txp_msg_set_int(res, TXP_F_CODE, TXP_EBRANCH_UNRETRYABLE);
    txp_msg_set_str(res, TXP_F_MESSAGE, "undo log unreadable");
    return;
  }
  txp_msg_set_int(res, TXP_F_BRANCH_STATUS,
                  type == TXP_MSG_BRANCH_COMMIT ? TXP_BS_PHASE2_COMMITTED : TXP_BS_PHASE2_ROLLBACKED);
}

static int rm_handler(txc_t *c, const txp_msg_t *req, txp_msg_t *res, void *arg) {
  rmsim_t *r = arg;
  (void)c;
  int type = req->type;
  if (type != TXP_MSG_BRANCH_COMMIT && type != TXP_MSG_BRANCH_ROLLBACK) return 0;
  pthread_mutex_lock(&r->mu);
  if (type == TXP_MSG_BRANCH_COMMIT) r->commits++;
  else r->rollbacks++;
  bool silent = type == TXP_MSG_BRANCH_COMMIT ? r->silent_commit : r->silent_rollback;
  int rc = 0;
  if (silent) {
    if (r->npending < RM_MAX_PENDING) {
      r->pending[r->npending].type = type;
      r->pending[r->npending].request_id = req->request_id;
      r->pending[r->npending].branch_id = req->branch_id;
      r->npending++;
    }
    rc = 1;
  } else {
    rm_fill(r, type, req->branch_id, res);
  }
  pthread_mutex_unlock(&r->mu);
  return rc;
}

static int rm_answer_pending(rmsim_t *r, txc_t *c) {
  txp_buf_t out;
  txp_buf_init(&out, 0);
  pthread_mutex_lock(&r->mu);
  int keep = 0;
  for (int i = 0; i < r->npending; i++) {
    bool silent = r->pending[i].type == TXP_MSG_BRANCH_COMMIT ? r->silent_commit : r->silent_rollback;
    if (silent) {
      r->pending[keep++] = r->pending[i];
      continue;
    }
    txp_msg_t req, res;
    txp_msg_init(&req, (txp_msg_type_t)r->pending[i].type);
    req.request_id = r->pending[i].request_id;
    txp_msg_init_result(&res, &req, 0, NULL);
    rm_fill(r, r->pending[i].type, r->pending[i].branch_id, &res);
    txp_encode(&res, &out, 0);
  }
  r->npending = keep;
  pthread_mutex_unlock(&r->mu);
  int rc = out.len ? txc_send_raw(c, out.data, out.len) : 0;
  txp_buf_free(&out);
  return rc == 0 ? 0 : -1;
}

static void *rm_main(void *arg) {
  rmsim_t *r = arg;
  txc_t *c = NULL;
  double next_beat = 0;
  for (;;) {
    pthread_mutex_lock(&r->mu);
    bool stop = r->stop;
    pthread_mutex_unlock(&r->mu);
    if (stop) break;
    if (!c) {
      char err[256];
      c = txc_connect(HOST, g_port, 500, err, sizeof(err));
      if (c && txc_register(c, true, "test-rm", r->name, TOKEN, r->resources) != 0) {
        txc_close(c);
        c = NULL;
      }
      if (!c) {
        nap();
        continue;
      }
      txc_set_handler(c, rm_handler, r);
      pthread_mutex_lock(&r->mu);
      r->generation++;
      r->npending = 0;
      pthread_mutex_unlock(&r->mu);
      next_beat = now_ms() + 1000;
    }
    int rc = rm_answer_pending(r, c) == 0 ? txc_poll(c, 20, false) : TXP_ECONN_LOST;
    if (rc >= 0 && now_ms() >= next_beat) {
      txp_msg_t hb, res;
      txp_msg_init(&hb, TXP_MSG_HEARTBEAT);
      rc = txc_call(c, &hb, &res, 3000);
      txp_msg_clear(&res);
      if (rc == TXP_EUNKNOWN_OUTCOME) rc = 0;
      next_beat = now_ms() + 1000;
    }
    if (rc < 0) {
      txc_close(c);
      c = NULL;
    }
  }
  txc_close(c);
  return NULL;
}

static void rm_start(rmsim_t *r) {
  if (r->started) return;
  pthread_mutex_lock(&r->mu);
  int gen = r->generation;
  r->stop = false;
  pthread_mutex_unlock(&r->mu);
  assert_int_equal(pthread_create(&r->thread, NULL, rm_main, r), 0);
  r->started = true;
  double deadline = now_ms() + WAIT_MS;
  for (;;) {
    pthread_mutex_lock(&r->mu);
    int g = r->generation;
    pthread_mutex_unlock(&r->mu);
    if (g > gen) break;
    if (now_ms() > deadline) fail_msg("RM %s could not register", r->name);
    nap();
  }
}

static void rm_stop(rmsim_t *r) {
  if (!r->started) return;
  pthread_mutex_lock(&r->mu);
  r->stop = true;
  pthread_mutex_unlock(&r->mu);
  pthread_join(r->thread, NULL);
  r->started = false;
}

static void rm_modes(rmsim_t *r, bool silent_commit, bool silent_rollback) {
  pthread_mutex_lock(&r->mu);
  r->silent_commit = silent_commit;
  r->silent_rollback = silent_rollback;
  pthread_mutex_unlock(&r->mu);
}

static void rm_dirty(rmsim_t *r, int64_t branch) {
  pthread_mutex_lock(&r->mu);
  if (branch == 0) r->ndirty = 0;
  else if (r->ndirty < RM_MAX_DIRTY) r->dirty[r->ndirty++] = branch;
  pthread_mutex_unlock(&r->mu);
}

static int rm_count(rmsim_t *r, bool commits) {
  pthread_mutex_lock(&r->mu);
  int n = commits ? r->commits : r->rollbacks;
  pthread_mutex_unlock(&r->mu);
  return n;
}

/* ---------------------------------------------------------- PostgreSQL */

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

static void db_exec(const char *sql, const char *p1, const char *p2) {
  const char *params[2] = {p1, p2};
  int n = p2 ? 2 : p1 ? 1 : 0;
  PGresult *r = PQexecParams(g_pg, sql, n, NULL, params, NULL, NULL, 0);
  ExecStatusType st = PQresultStatus(r);
  if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
    char msg[512];
    snprintf(msg, sizeof(msg), "%s", PQresultErrorMessage(r));
    PQclear(r);
    fail_msg("statement failed: %s: %s", sql, msg);
  }
  PQclear(r);
}

static void db_text(const char *sql, const char *p1, char *out, size_t cap) {
  const char *params[1] = {p1};
  PGresult *r = PQexecParams(g_pg, sql, p1 ? 1 : 0, NULL, params, NULL, NULL, 0);
  out[0] = '\0';
  if (PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) > 0 && !PQgetisnull(r, 0, 0))
    snprintf(out, cap, "%s", PQgetvalue(r, 0, 0));
  PQclear(r);
}

static bool db_wait_long(const char *sql, const char *p1, long want, int timeout_ms) {
  double deadline = now_ms() + timeout_ms;
  for (;;) {
    if (db_long(sql, p1, NULL) == want) return true;
    if (now_ms() >= deadline) return false;
    nap();
  }
}

#define SQL_STATUS "SELECT status FROM global_table WHERE xid = $1"
#define SQL_HISTORY "SELECT status FROM global_history WHERE xid = $1"
#define SQL_LOCKS "SELECT count(*) FROM lock_table WHERE xid = $1"
#define SQL_RETRIES "SELECT retry_count FROM global_table WHERE xid = $1"

static void expect_status(const char *xid, int status) {
  if (!db_wait_long(SQL_STATUS, xid, status, WAIT_MS))
    fail_msg("global %s: status %ld, expected %d (%s)", xid, db_long(SQL_STATUS, xid, NULL), status,
             txp_global_status_name(status));
}

static void expect_history(const char *xid, int status) {
  if (!db_wait_long(SQL_HISTORY, xid, status, WAIT_MS))
    fail_msg("global %s: history status %ld (live %ld), expected %s", xid, db_long(SQL_HISTORY, xid, NULL),
             db_long(SQL_STATUS, xid, NULL), txp_global_status_name(status));
}

/* -------------------------------------------------------------- clients */

typedef struct cli {
  txc_t *tm, *rm;
} cli_t;

static txc_t *client(bool as_rm, const char *id) {
  char err[256];
  txc_t *c = txc_connect(HOST, g_port, 2000, err, sizeof(err));
  if (!c) fail_msg("could not connect to tcd: %s", err);
  int rc = txc_register(c, as_rm, "test-app", id, TOKEN, as_rm ? "db_client" : NULL);
  if (rc != 0) fail_msg("could not register %s: %s", id, txp_errname(rc));
  return c;
}

static void cli_open(cli_t *cl, const char *name) {
  char id[64];
  snprintf(id, sizeof(id), "%s-tm", name);
  cl->tm = client(false, id);
  snprintf(id, sizeof(id), "%s-rm", name);
  cl->rm = client(true, id);
}

static void cli_close(cli_t *cl) {
  txc_close(cl->tm);
  txc_close(cl->rm);
}

static void begin_ok(txc_t *tm, uint32_t timeout_ms, const char *name, char *xid) {
  int rc = txc_begin(tm, timeout_ms, name, NULL, xid);
  if (rc != 0) fail_msg("GlobalBegin %s: %s", name, txp_errname(rc));
}

static int64_t register_ok(txc_t *c, const char *xid, const char *resource, const char *keys) {
  int64_t branch = 0;
  int rc = txc_branch_register(c, xid, resource, keys, 0, &branch, NULL);
  if (rc != 0) fail_msg("BranchRegister %s %s: %s", xid, keys ? keys : "-", txp_errname(rc));
  return branch;
}

/* A GlobalRollback written raw: the answer (which waits for phase two) is
 * never read. */
static void send_rollback_nowait(txc_t *c, const char *xid) {
  txp_msg_t m;
  txp_msg_init(&m, TXP_MSG_GLOBAL_ROLLBACK);
  txp_msg_set_str(&m, TXP_F_XID, xid);
  m.request_id = 900001;
  txp_buf_t out;
  txp_buf_init(&out, 0);
  assert_int_equal(txp_encode(&m, &out, 0), 0);
  assert_int_equal(txc_send_raw(c, out.data, out.len), 0);
  txp_buf_free(&out);
}

/* --------------------------------------------------------- admin socket */

static int adm_connect_path(const char *path) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  struct sockaddr_un sa;
  memset(&sa, 0, sizeof(sa));
  sa.sun_family = AF_UNIX;
  if (strlen(path) >= sizeof(sa.sun_path)) {
    close(fd);
    errno = ENAMETOOLONG;
    return -1;
  }
  memcpy(sa.sun_path, path, strlen(path) + 1);
  if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
    int e = errno;
    close(fd);
    errno = e;
    return -1;
  }
  return fd;
}

static int adm_connect(void) {
  int fd = adm_connect_path(g_sock);
  if (fd < 0) fail_msg("could not connect to %s: %s", g_sock, strerror(errno));
  return fd;
}

static void send_all(int fd, const void *buf, size_t len) {
  const char *p = buf;
  while (len) {
    ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail_msg("send: %s", strerror(errno));
    p += n;
    len -= (size_t)n;
  }
}

/* Per-connection read buffer (answers may arrive together). */
typedef struct {
  int fd;
  char buf[8 << 20];
  size_t len;
} conn_t;

/* The next answer line (malloc'ed), or NULL at end of input (*eof) or
 * after 'timeout_ms'. */
static char *read_line(conn_t *c, int timeout_ms, bool *eof) {
  double deadline = now_ms() + timeout_ms;
  *eof = false;
  for (;;) {
    char *nl = c->len ? memchr(c->buf, '\n', c->len) : NULL;
    if (nl) {
      size_t l = (size_t)(nl - c->buf);
      char *line = malloc(l + 1);
      memcpy(line, c->buf, l);
      line[l] = '\0';
      memmove(c->buf, nl + 1, c->len - l - 1);
      c->len -= l + 1;
      return line;
    }
    double left = deadline - now_ms();
    if (left <= 0) return NULL;
    struct pollfd p = {c->fd, POLLIN, 0};
    if (poll(&p, 1, (int)left + 1) <= 0) continue;
    ssize_t n = recv(c->fd, c->buf + c->len, sizeof(c->buf) - c->len - 1, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      *eof = true;
      return NULL;
    }
    c->len += (size_t)n;
  }
}

static json_t *parse_answer(const char *line) {
  json_error_t e;
  json_t *j = json_loads(line, 0, &e);
  if (!json_is_object(j)) fail_msg("answer is not a JSON object (%s): %.300s", e.text, line);
  return j;
}

static json_t *read_answer(conn_t *c, int timeout_ms) {
  bool eof;
  char *line = read_line(c, timeout_ms, &eof);
  if (!line) fail_msg("no answer from the admin socket (%s)", eof ? "closed" : "timeout");
  json_t *j = parse_answer(line);
  free(line);
  return j;
}

/* One request on a fresh connection; the parsed answer. */
static json_t *adm(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static json_t *adm(const char *fmt, ...) {
  char line[8192];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(line, sizeof(line) - 1, fmt, ap);
  va_end(ap);
  line[n++] = '\n';
  conn_t *c = malloc(sizeof(*c));
  c->fd = adm_connect();
  c->len = 0;
  send_all(c->fd, line, (size_t)n);
  json_t *a = read_answer(c, 30000);
  close(c->fd);
  free(c);
  return a;
}

static json_t *adm_ok(const char *what, json_t *a) {
  if (!json_is_true(json_object_get(a, "ok"))) {
    char *s = json_dumps(a, JSON_COMPACT);
    fail_msg("%s: expected ok, got %s", what, s);
  }
  return a;
}

/* 'a' must be {"ok":false,"code":code} with an error containing 'want'. */
static void adm_refused(const char *what, json_t *a, const char *code, const char *want) {
  const char *err = json_string_value(json_object_get(a, "error"));
  const char *c = json_string_value(json_object_get(a, "code"));
  if (json_is_true(json_object_get(a, "ok")) || !err || !c || strcmp(c, code) != 0 || !strstr(err, want)) {
    char *s = json_dumps(a, JSON_COMPACT);
    fail_msg("%s: expected code %s with \"%s\", got %s", what, code, want, s);
  }
  json_decref(a);
}

static const char *js(const json_t *o, const char *k) {
  const json_t *v = json_object_get(o, k);
  if (!json_is_string(v)) fail_msg("field \"%s\" is not a string", k);
  return json_string_value(v);
}

static long long ji(const json_t *o, const char *k) {
  const json_t *v = json_object_get(o, k);
  if (!json_is_integer(v)) fail_msg("field \"%s\" is not an integer", k);
  return json_integer_value(v);
}

static json_t *find_by(json_t *arr, const char *key, const char *val) {
  size_t i;
  json_t *o;
  json_array_foreach(arr, i, o) {
    const json_t *v = json_object_get(o, key);
    if (json_is_string(v) && strcmp(json_string_value(v), val) == 0) return o;
  }
  return NULL;
}

static json_t *find_branch(json_t *arr, int64_t id) {
  size_t i;
  json_t *o;
  json_array_foreach(arr, i, o) if (json_integer_value(json_object_get(o, "branch_id")) == id) return o;
  return NULL;
}

/* ----------------------------------------------------------- processes */

typedef struct {
  int status; /* exit status, or -1 */
  char out[65536];
  char err[8192];
} run_t;

/* Run 'argv' (as 'uid' unless -1), with extra environment 'env' (NULL
 * terminated, may be NULL); capture output. */
static void run_as(int uid, char *const argv[], const char *const *env, run_t *r) {
  int po[2], pe[2];
  assert_int_equal(pipe(po), 0);
  assert_int_equal(pipe(pe), 0);
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) {
    dup2(po[1], 1);
    dup2(pe[1], 2);
    close(po[0]);
    close(pe[0]);
    if (uid >= 0) {
      gid_t g = (gid_t)uid;
      if (setgroups(1, &g) != 0 || setgid((gid_t)uid) != 0 || setuid((uid_t)uid) != 0) _exit(125);
    }
    for (const char *const *e = env; e && *e; e++) putenv((char *)(uintptr_t)*e);
    execv(argv[0], argv);
    _exit(127);
  }
  close(po[1]);
  close(pe[1]);
  size_t no = 0, ne = 0;
  struct pollfd p[2] = {{po[0], POLLIN, 0}, {pe[0], POLLIN, 0}};
  int open_fds = 2;
  while (open_fds > 0) {
    if (poll(p, 2, 60000) <= 0) break;
    for (int i = 0; i < 2; i++) {
      if (p[i].fd < 0 || !(p[i].revents & (POLLIN | POLLHUP))) continue;
      char *dst = i ? r->err : r->out;
      size_t *n = i ? &ne : &no;
      size_t cap = i ? sizeof(r->err) : sizeof(r->out);
      char tmp[4096];
      ssize_t k = read(p[i].fd, tmp, sizeof(tmp));
      if (k <= 0) {
        close(p[i].fd);
        p[i].fd = -1;
        open_fds--;
        continue;
      }
      size_t take = (size_t)k < cap - 1 - *n ? (size_t)k : cap - 1 - *n;
      memcpy(dst + *n, tmp, take);
      *n += take;
    }
  }
  r->out[no] = '\0';
  r->err[ne] = '\0';
  int st;
  waitpid(pid, &st, 0);
  r->status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static run_t g_run;

/* tcctl [--socket g_sock] args... as root; returns the exit status. */
static int tcctl(const char *a1, const char *a2, const char *a3, const char *a4) {
  char *argv[] = {g_tcctl_path, "--socket", g_sock, (char *)(uintptr_t)a1, (char *)(uintptr_t)a2,
                  (char *)(uintptr_t)a3, (char *)(uintptr_t)a4, NULL};
  memset(&g_run, 0, sizeof(g_run));
  run_as(-1, argv, NULL, &g_run);
  return g_run.status;
}

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
  sa.sin_port = htons((uint16_t)g_mport);
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
    assert_true(strncmp(line, "txc_", 4) == 0);
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

/* Histogram buckets of 'fam'{decision="d"} are cumulative and end in
 * +Inf == _count. */
static void check_histogram(const scrape_t *sc, const char *fam, const char *decision) {
  char prefix[256];
  snprintf(prefix, sizeof(prefix), "%s_bucket{decision=\"%s\",le=\"", fam, decision);
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
  snprintf(cnt, sizeof(cnt), "%s_count{decision=\"%s\"}", fam, decision);
  assert_true(inf == metric(sc, cnt));
}

/* --------------------------------------------------------------- setup */

static const char *g_env_main[32];
static char g_env_buf[8][4300];


/* Copy the executable 'src' to 'dir'/'name' (mode 0755) and write the new
 * path into 'out'.  0 or -1. */
static int copy_executable(const char *src, const char *dir, const char *name, char *out, size_t outlen) {
  char dst[512];
  snprintf(dst, sizeof(dst), "%s/%s", dir, name);
  int in = open(src, O_RDONLY | O_CLOEXEC);
  if (in < 0) return -1;
  int fd = open(dst, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0755);
  if (fd < 0) {
    close(in);
    return -1;
  }
  char buf[65536];
  ssize_t n;
  int rc = 0;
  while ((n = read(in, buf, sizeof(buf))) > 0)
    if (write(fd, buf, (size_t)n) != n) rc = -1;
  if (n < 0) rc = -1;
  close(in);
  if (close(fd) != 0 || fchmodat(AT_FDCWD, dst, 0755, 0) != 0) rc = -1;
  if (rc == 0) snprintf(out, outlen, "%s", dst);
  return rc;
}

static int group_setup(void **state) {
  (void)state;
  g_test_pid = getpid();
  g_pg_url = getenv("TC_PG_URL");
  const char *bin = getenv("TX_BIN_DIR");
  if (!g_pg_url || !bin) {
    fprintf(stderr, "test_admin: TC_PG_URL and TX_BIN_DIR must be set (run it through ctest)\n");
    return -1;
  }
  snprintf(g_bin, sizeof(g_bin), "%s", bin);
  snprintf(g_tcd_path, sizeof(g_tcd_path), "%s/tcd", bin);
  snprintf(g_tcctl_path, sizeof(g_tcctl_path), "%s/tcctl", bin);
  if (access(g_tcd_path, X_OK) != 0 || access(g_tcctl_path, X_OK) != 0) {
    fprintf(stderr, "test_admin: no tcd or tcctl in %s\n", bin);
    return -1;
  }
  signal(SIGPIPE, SIG_IGN);
  snprintf(g_dir, sizeof(g_dir), "/tmp/test_admin.XXXXXX");
  if (!mkdtemp(g_dir)) return -1;
  chmod(g_dir, 0755); /* "nobody" must reach the socket to be refused by it */
  /* ...and run tcctl: the build tree may sit in a directory only root can
   * enter (a clone in a mktemp -d), so "nobody" runs a copy from here. */
  if (copy_executable(g_tcctl_path, g_dir, "tcctl", g_tcctl_path, sizeof(g_tcctl_path)) != 0) {
    fprintf(stderr, "test_admin: could not copy tcctl into %s\n", g_dir);
    return -1;
  }
  snprintf(g_sock, sizeof(g_sock), "%s/admin.sock", g_dir);
  snprintf(g_log, sizeof(g_log), "%s/tcd.log", g_dir);
  g_pg = PQconnectdb(g_pg_url);
  if (PQstatus(g_pg) != CONNECTION_OK) {
    fprintf(stderr, "test_admin: could not connect to %s: %s\n", g_pg_url, PQerrorMessage(g_pg));
    return -1;
  }
  atexit(kill_at_exit);
  for (int attempt = 0; attempt < 5 && g_tcd <= 0; attempt++) {
    g_port = free_port();
    g_mport = free_port();
    int k = 0, b = 0;
    g_env_main[k++] = "TC_SERVER_TOKEN=" TOKEN;
    g_env_main[k++] = "TC_LOG_LEVEL=info";
    g_env_main[k++] = "TC_RECOVERY_INTERVAL_MS=200";
    g_env_main[k++] = "TC_RECOVERY_RETRY_MIN_MS=100";
    g_env_main[k++] = "TC_RECOVERY_RETRY_MAX_MS=400";
    g_env_main[k++] = "TC_NODE_ID=1";
    snprintf(g_env_buf[b], sizeof(g_env_buf[b]), "TC_ADMIN_MAX_REQUEST=%d", MAX_REQUEST);
    g_env_main[k++] = g_env_buf[b++];
    snprintf(g_env_buf[b], sizeof(g_env_buf[b]), "TC_ADMIN_IDLE_MS=%d", IDLE_MS);
    g_env_main[k++] = g_env_buf[b++];
    snprintf(g_env_buf[b], sizeof(g_env_buf[b]), "TC_SERVER_LISTEN=%s:%d", HOST, g_port);
    g_env_main[k++] = g_env_buf[b++];
    snprintf(g_env_buf[b], sizeof(g_env_buf[b]), "TC_METRICS_LISTEN=%s:%d", HOST, g_mport);
    g_env_main[k++] = g_env_buf[b++];
    snprintf(g_env_buf[b], sizeof(g_env_buf[b]), "TC_STORE_PG_URL=%s", g_pg_url);
    g_env_main[k++] = g_env_buf[b++];
    snprintf(g_env_buf[b], sizeof(g_env_buf[b]), "TC_ADMIN_SOCKET=%s", g_sock);
    g_env_main[k++] = g_env_buf[b++];
    g_env_main[k] = NULL;
    pid_t pid = spawn_tcd(g_env_main, g_log);
    if (pid > 0 && wait_serving(pid, g_port, g_sock, 30000)) {
      g_tcd = pid;
      break;
    }
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, NULL, 0);
    }
  }
  if (g_tcd <= 0) {
    fprintf(stderr, "test_admin: could not start tcd (log: %s)\n", g_log);
    return -1;
  }
  return 0;
}

/* Copy the tcd log to our stderr; fail on a sanitizer report. */
static int dump_log(void) {
  FILE *f = fopen(g_log, "r");
  if (!f) return 0;
  char line[8192];
  int bad = 0;
  fprintf(stderr, "---- tcd log ----\n");
  while (fgets(line, sizeof(line), f)) {
    fputs(line, stderr);
    if (strstr(line, "AddressSanitizer") || strstr(line, "runtime error:") || strstr(line, "LeakSanitizer")) bad = 1;
  }
  fclose(f);
  fprintf(stderr, "---- end of tcd log ----\n");
  return bad;
}

static int group_teardown(void **state) {
  (void)state;
  rm_stop(&g_rm);
  rm_stop(&g_late);
  int rc = 0;
  if (g_tcd > 0) {
    int st = stop_pid(g_tcd, 15000);
    g_tcd = -1;
    if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      fprintf(stderr, "test_admin: tcd did not exit cleanly: status 0x%x\n", st);
      rc = -1;
    }
  }
  if (dump_log()) rc = -1;
  if (g_pg) PQfinish(g_pg);
  unlink(g_log);
  unlink(g_tcctl_path); /* the copy in g_dir */
  rmdir(g_dir);
  return rc;
}

static int test_setup(void **state) {
  (void)state;
  if (g_tcd <= 0 || waitpid(g_tcd, NULL, WNOHANG) != 0) {
    fprintf(stderr, "test_admin: tcd is gone\n");
    return -1;
  }
  rm_start(&g_rm);
  return 0;
}

static int test_teardown(void **state) {
  (void)state;
  rm_modes(&g_rm, false, false);
  rm_dirty(&g_rm, 0);
  return 0;
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
  assert_true(log_has("refused a connection from uid 65534"));
  a = adm_ok("stats", adm("stats"));
  assert_true(ji(json_object_get(a, "admin"), "denied") >= 2);
  json_decref(a);

  /* 3. a second node with nobody on its allow-list lets it in (once the
   * file mode does too) */
  char sock2[320], log2[320], env[6][4300];
  snprintf(sock2, sizeof(sock2), "%s/admin2.sock", g_dir);
  snprintf(log2, sizeof(log2), "%s/tcd2.log", g_dir);
  int port2 = free_port();
  snprintf(env[0], sizeof(env[0]), "TC_SERVER_LISTEN=%s:%d", HOST, port2);
  snprintf(env[1], sizeof(env[1]), "TC_STORE_PG_URL=%s", g_pg_url);
  snprintf(env[2], sizeof(env[2]), "TC_ADMIN_SOCKET=%s", sock2);
  const char *env2[] = {"TC_SERVER_TOKEN=" TOKEN, "TC_NODE_ID=2", "TC_LOG_LEVEL=info", "TC_ADMIN_ALLOW_UIDS=4242, 65534",
                        env[0], env[1], env[2], NULL};
  pid_t pid2 = spawn_tcd(env2, log2);
  assert_true(pid2 > 0);
  if (!wait_serving(pid2, port2, sock2, 30000)) {
    kill(pid2, SIGKILL);
    waitpid(pid2, NULL, 0);
    fail_msg("second tcd did not start (log %s)", log2);
  }
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
  int st2 = stop_pid(pid2, 15000);
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
  rm_dirty(&g_rm, S.dirty_b1);
  assert_int_equal(txc_rollback(cl->tm, S.dirty, &status), 0);
  assert_int_equal(status, TXP_GS_ROLLBACK_FAILED);
  /* CommitRetrying */
  begin_ok(cl->tm, 600000, "adm-cretry", S.cretry);
  S.cretry_ok = register_ok(cl->rm, S.cretry, "db_orders", "t_adm:5");
  S.cretry_nobody = register_ok(cl->rm, S.cretry, "db_nobody", "t_adm:6");
  assert_int_equal(txc_commit(cl->tm, S.cretry, &status), 0);
  expect_status(S.cretry, TXP_GS_COMMIT_RETRYING);
  /* RollbackRetrying */
  begin_ok(cl->tm, 600000, "adm-rretry", S.rretry);
  register_ok(cl->rm, S.rretry, "db_nobody", "t_adm:7");
  assert_int_equal(txc_rollback(cl->tm, S.rretry, &status), 0);
  expect_status(S.rretry, TXP_GS_ROLLBACK_RETRYING);
  /* TimeoutRollbackRetrying */
  begin_ok(cl->tm, 300, "adm-tretry", S.tretry);
  register_ok(cl->rm, S.tretry, "db_nobody", "t_adm:8");
  expect_status(S.tretry, TXP_GS_TIMEOUT_ROLLBACK_RETRYING);
  /* CommitFailed */
  begin_ok(cl->tm, 600000, "adm-cfailed", S.cfailed);
  S.cfailed_b = register_ok(cl->rm, S.cfailed, "db_orders", "t_adm:13");
  rm_dirty(&g_rm, S.cfailed_b);
  assert_int_equal(txc_commit(cl->tm, S.cfailed, &status), 0);
  expect_status(S.cfailed, TXP_GS_COMMIT_FAILED);
  /* TimeoutRollbackFailed */
  begin_ok(cl->tm, 300, "adm-tfailed", S.tfailed);
  S.tfailed_b = register_ok(cl->rm, S.tfailed, "db_stock", "t_adm:14");
  rm_dirty(&g_rm, S.tfailed_b);
  expect_status(S.tfailed, TXP_GS_TIMEOUT_ROLLBACK_FAILED);
  /* finished: Committed and Rollbacked */
  begin_ok(cl->tm, 600000, "adm-committed", S.committed);
  register_ok(cl->rm, S.committed, "db_orders", "t_adm:10");
  assert_int_equal(txc_commit(cl->tm, S.committed, &status), 0);
  expect_history(S.committed, TXP_GS_COMMITTED);
  begin_ok(cl->tm, 600000, "adm-rolled", S.rolled);
  register_ok(cl->rm, S.rolled, "db_stock", "t_adm:11");
  assert_int_equal(txc_rollback(cl->tm, S.rolled, &status), 0);
  assert_int_equal(status, TXP_GS_ROLLBACKED);
  /* Rollbacking: the RM holds its answer (for up to the TC's 10 s call
   * timeout; then the session goes RollbackRetrying) */
  begin_ok(cl->tm, 600000, "adm-silent", S.silent);
  register_ok(cl->rm, S.silent, "db_orders", "t_adm:9");
  rm_modes(&g_rm, false, true);
  g_silent_tm = client(false, "silent-tm");
  send_rollback_nowait(g_silent_tm, S.silent);
  expect_status(S.silent, TXP_GS_ROLLBACKING);
  adm_refused("rollback rollbacking", adm("rollback %s", S.silent), "refused", "already Rollbacking");
  /* AsyncCommitting: the commit answer is held too.  The TM hears
   * "committed" at once (AT phase two is clean-up). */
  begin_ok(cl->tm, 600000, "adm-async", S.async);
  register_ok(cl->rm, S.async, "db_stock", "t_adm:15");
  rm_modes(&g_rm, true, true);
  assert_int_equal(txc_commit(cl->tm, S.async, &status), 0);
  assert_int_equal(status, TXP_GS_COMMITTED);
  assert_int_equal(db_long(SQL_STATUS, S.async, NULL), TXP_GS_ASYNC_COMMITTING);
  adm_refused("commit async", adm("commit %s", S.async), "refused", "already AsyncCommitting");
  adm_refused("rollback async", adm("rollback %s", S.async), "refused", "the decision was commit");
  /* stopped while its phase two is in flight */
  json_t *a = adm_ok("stop async", adm("stop-retry %s", S.async));
  assert_string_equal(js(a, "from"), "AsyncCommitting");
  assert_string_equal(js(a, "to"), "StopCommitRetry");
  json_decref(a);
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
  assert_int_equal(ji(g, "pid"), g_tcd);
  char addr[64];
  snprintf(addr, sizeof(addr), "%s:%d", HOST, g_port);
  assert_string_equal(js(g, "address"), addr);
  list = json_object_get(a, "nodes");
  o = NULL;
  json_array_foreach(list, i, g) if (ji(g, "node_id") == 1) o = g;
  if (o) { /* node_table is written by the membership, when it runs */
    assert_true(json_is_true(json_object_get(o, "self")));
    assert_string_equal(js(o, "address"), addr);
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
  assert_true(log_has("refused: could not roll back global transaction"));

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
  rm_dirty(&g_rm, S.dirty_b1);
  int before = rm_count(&g_rm, false);
  a = adm_ok("rollback dirty", adm("rollback %s", S.dirty));
  assert_string_equal(js(a, "action"), "rollback");
  assert_string_equal(js(a, "from"), "RollbackFailed");
  assert_string_equal(js(a, "to"), "RollbackRetrying");
  assert_string_equal(js(a, "status"), "RollbackFailed");
  assert_true(json_is_false(json_object_get(a, "finished")));
  json_decref(a);
  assert_true(rm_count(&g_rm, false) > before);
  assert_int_equal(db_long(SQL_STATUS, S.dirty, NULL), TXP_GS_ROLLBACK_FAILED);
  assert_true(log_has("operator uid 0"));
  assert_true(log_has("RollbackFailed -> RollbackRetrying"));
  /* the data is repaired: re-drive finishes it */
  rm_dirty(&g_rm, 0);
  a = adm_ok("redrive dirty", adm("redrive %s", S.dirty));
  assert_string_equal(js(a, "status"), "Rollbacked");
  assert_true(json_is_true(json_object_get(a, "finished")));
  json_decref(a);
  expect_history(S.dirty, TXP_GS_ROLLBACKED);
  assert_int_equal(db_long(SQL_LOCKS, S.dirty, NULL), 0);

  /* ---- stop and resume: the leader leaves a stopped session alone */
  a = adm_ok("stop rretry", adm("stop-retry %s", S.rretry));
  assert_string_equal(js(a, "from"), "RollbackRetrying");
  assert_string_equal(js(a, "to"), "StopRollbackRetry");
  json_decref(a);
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
  a = adm_ok("resume rretry", adm("resume-retry %s", S.rretry));
  assert_string_equal(js(a, "from"), "StopRollbackRetry");
  assert_string_equal(js(a, "to"), "RollbackRetrying");
  json_decref(a);
  /* the leader retries it again (still no RM: the count goes up) */
  double deadline = now_ms() + WAIT_MS;
  while (db_long(SQL_RETRIES, S.rretry, NULL) <= r0) {
    if (now_ms() > deadline) fail_msg("resumed session %s was not retried", S.rretry);
    nap();
  }

  /* ---- the missing RM comes: a stopped commit is re-driven to the end,
   * the resumed rollback and the timed-out one finish */
  rm_start(&g_late);
  a = adm_ok("redrive cretry", adm("redrive %s", S.cretry));
  assert_string_equal(js(a, "from"), "StopCommitRetry");
  assert_string_equal(js(a, "to"), "CommitRetrying");
  assert_string_equal(js(a, "status"), "Committed");
  json_decref(a);
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
  rm_dirty(&g_rm, 0);
  a = adm_ok("commit cfailed", adm("commit %s", S.cfailed));
  assert_string_equal(js(a, "from"), "CommitFailed");
  assert_string_equal(js(a, "to"), "CommitRetrying");
  assert_string_equal(js(a, "status"), "Committed");
  json_decref(a);
  expect_history(S.cfailed, TXP_GS_COMMITTED);
  /* a timeout rollback that failed for good */
  adm_refused("commit tfailed", adm("commit %s", S.tfailed), "refused", "the decision was rollback");
  a = adm_ok("redrive tfailed", adm("redrive %s", S.tfailed));
  assert_string_equal(js(a, "from"), "TimeoutRollbackFailed");
  assert_string_equal(js(a, "to"), "TimeoutRollbackRetrying");
  assert_string_equal(js(a, "status"), "TimeoutRollbacked");
  json_decref(a);
  expect_history(S.tfailed, TXP_GS_TIMEOUT_ROLLBACKED);

  /* ---- the commit stopped in flight: the RM answers, the branch is
   * recorded, the session stays stopped until resumed */
  rm_modes(&g_rm, false, false);
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
  int commits = rm_count(&g_rm, true);
  a = adm_ok("commit begin", adm("commit %s", S.begin));
  assert_string_equal(js(a, "from"), "Begin");
  assert_string_equal(js(a, "to"), "AsyncCommitting");
  assert_string_equal(js(a, "status"), "Committed");
  assert_true(json_is_true(json_object_get(a, "finished")));
  json_decref(a);
  expect_history(S.begin, TXP_GS_COMMITTED);
  assert_int_equal(rm_count(&g_rm, true), commits + 2);
  assert_true(log_has("Begin -> AsyncCommitting (forced decision)"));
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
  rm_modes(&g_rm, false, false);
  expect_history(S.silent, TXP_GS_ROLLBACKED);
  txc_close(g_silent_tm);
  g_silent_tm = NULL;

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
  assert_true(log_has("deleted 1 lock rows and 1 branch rows"));

  a = adm_ok("stats", adm("stats"));
  assert_true(ji(json_object_get(a, "admin"), "repairs") >= 9);
  assert_true(ji(json_object_get(a, "admin"), "refused") >= 10);
  json_decref(a);
  rm_stop(&g_late);
  cli_close(&g_cl);
}

/* A registration waiting for a lock shows in the holder's wait queue. */
typedef struct waiter_arg {
  char xid[TXP_MAX_XID_LEN + 1];
  int rc;
  uint32_t waited;
} waiter_arg_t;

static void *waiter_main(void *p) {
  waiter_arg_t *w = p;
  txc_t *rm = client(true, "waiter-rm");
  int64_t b;
  w->rc = txc_branch_register(rm, w->xid, "db_orders", "t_wait:1", 20000, &b, &w->waited);
  txc_close(rm);
  return NULL;
}

static void test_lock_waiters(void **state) {
  (void)state;
  cli_t cl;
  cli_open(&cl, "waits");
  char holder[TXP_MAX_XID_LEN + 1];
  begin_ok(cl.tm, 600000, "adm-holder", holder);
  register_ok(cl.rm, holder, "db_orders", "t_wait:1");
  waiter_arg_t w = {.rc = 1};
  begin_ok(cl.tm, 600000, "adm-waiter", w.xid);
  scrape_t before = scrape();
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, waiter_main, &w), 0);
  json_t *a = NULL, *q = NULL;
  double deadline = now_ms() + WAIT_MS;
  for (;;) {
    a = adm_ok("locks", adm("show locks xid=%s", holder));
    json_t *groups = json_object_get(a, "waiters");
    if (json_array_size(groups) == 1) break;
    json_decref(a);
    if (now_ms() > deadline) fail_msg("the waiter never showed up");
    nap();
  }
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
  begin_ok(cl.tm, 60000, "m-commit", x1);
  register_ok(cl.rm, x1, "db_orders", "t_m:1");
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
  txc_t *bad = txc_connect(HOST, g_port, 2000, err, sizeof(err));
  assert_non_null(bad);
  assert_int_equal(txc_send_raw(bad, "GARBAGE-GARBAGE-GARBAGE", 23), 0);
  assert_true(txc_wait_closed(bad, 5000));
  txc_close(bad);

  /* counters move (the gauge follows the store within a probe or two) */
  scrape_t b;
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
  check_histogram(&b, "txc_phase2_duration_seconds", "commit");
  check_histogram(&b, "txc_phase2_duration_seconds", "rollback");
  assert_true(metric(&b, "txc_bad_frames_total") >= metric(&a, "txc_bad_frames_total") + 1);
  assert_true(metric(&b, "txc_store_batches_total") > metric(&a, "txc_store_batches_total"));
  assert_true(metric(&b, "txc_store_batch_size_sum") >= metric(&b, "txc_store_batch_size_count"));
  assert_true(metric(&b, "txc_store_batch_duration_seconds_count") == metric(&b, "txc_store_batches_total"));
  assert_true(metric(&b, "txc_store_ops_total{kind=\"begin\"}") >= metric(&a, "txc_store_ops_total{kind=\"begin\"}") + 4);
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
  cli_open(&cl, "tcctl");
  char x[TXP_MAX_XID_LEN + 1];
  begin_ok(cl.tm, 600000, "ctl-begin", x);
  register_ok(cl.rm, x, "db_orders", "t_ctl:1");

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
  static const char *const cmds[] = {"globals", "show", "locks", "nodes", "stats", "rollback", "commit",
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

/* Last: SIGTERM stops tcd cleanly and removes the socket. */
static void test_clean_stop(void **state) {
  (void)state;
  rm_stop(&g_rm);
  int st = stop_pid(g_tcd, 15000);
  g_tcd = -1;
  if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) fail_msg("tcd did not exit cleanly: 0x%x", st);
  struct stat sb;
  assert_int_equal(stat(g_sock, &sb), -1);
  assert_int_equal(errno, ENOENT);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup_teardown(test_access_control, test_setup, test_teardown),
    cmocka_unit_test_setup_teardown(test_framing, test_setup, test_teardown),
    cmocka_unit_test_setup_teardown(test_show, test_setup, test_teardown),
    cmocka_unit_test_setup_teardown(test_repairs, test_setup, test_teardown),
    cmocka_unit_test_setup_teardown(test_lock_waiters, test_setup, test_teardown),
    cmocka_unit_test_setup_teardown(test_metrics, test_setup, test_teardown),
    cmocka_unit_test_setup_teardown(test_tcctl, test_setup, test_teardown),
    cmocka_unit_test(test_clean_stop),
  };
  return cmocka_run_group_tests_name("admin", tests, group_setup, group_teardown);
}
