/*
 * admin_suite.c - see admin_suite.h.
 *
 * Threads: the cmocka test thread (all assertions) and the simulated RMs
 * (rmsim).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "admin_suite.h"

#define POLL_NS 10000000L

double now_ms(void) { return txc_now_ms(); }

void nap(void) {
  struct timespec ts = {0, POLL_NS};
  nanosleep(&ts, NULL);
}

/* ----------------------------------------------------------- processes */

const char *g_pg_url;
char g_dir[256], g_sock[300];
char g_tcctl_path[4200];
tcd_proc_t g_tcd;

bool tcd_serving(const tcd_proc_t *t, void *sock) {
  struct stat sb;
  return txc_serving(HOST, t->port, TOKEN, 200) && stat(sock, &sb) == 0;
}

/* ------------------------------------------------------- simulated RMs */

rmsim_t *g_rm, *g_late;

void rm_start(rmsim_t *r) {
  if (rmsim_start(r, WAIT_MS) != 0) fail_msg("an RM could not register");
}

/* ---------------------------------------------------------- PostgreSQL */

void expect_status(const char *xid, int status) {
  if (!db_wait_long(SQL_STATUS, xid, NULL, status, WAIT_MS))
    fail_msg("global %s: status %ld, expected %d (%s)", xid, db_long(SQL_STATUS, xid, NULL), status,
             txp_global_status_name(status));
}

void expect_history(const char *xid, int status) {
  if (!db_wait_long(SQL_HISTORY, xid, NULL, status, WAIT_MS))
    fail_msg("global %s: history status %ld (live %ld), expected %s", xid, db_long(SQL_HISTORY, xid, NULL),
             db_long(SQL_STATUS, xid, NULL), txp_global_status_name(status));
}

/* -------------------------------------------------------------- clients */

txc_t *client(bool as_rm, const char *id) {
  char err[256];
  txc_t *c = txc_connect(HOST, g_tcd.port, 2000, err, sizeof(err));
  if (!c) fail_msg("could not connect to tcd: %s", err);
  int rc = txc_register(c, as_rm, "test-app", id, TOKEN, as_rm ? "db_client" : NULL);
  if (rc != 0) fail_msg("could not register %s: %s", id, txp_errname(rc));
  return c;
}

void cli_open(cli_t *cl, const char *name) {
  char id[64];
  snprintf(id, sizeof(id), "%s-tm", name);
  cl->tm = client(false, id);
  snprintf(id, sizeof(id), "%s-rm", name);
  cl->rm = client(true, id);
}

void cli_close(cli_t *cl) {
  txc_close(cl->tm);
  txc_close(cl->rm);
}

void begin_ok(txc_t *tm, uint32_t timeout_ms, const char *name, char *xid) {
  int rc = txc_begin(tm, timeout_ms, name, NULL, xid);
  if (rc != 0) fail_msg("GlobalBegin %s: %s", name, txp_errname(rc));
}

static int64_t register_with(txc_t *c, const char *xid, const char *resource, const char *keys,
                             const char *app_data) {
  int64_t branch = 0;
  int rc = txc_branch_register_data(c, xid, resource, keys, app_data, 0, &branch, NULL);
  if (rc != 0) fail_msg("BranchRegister %s %s: %s", xid, keys ? keys : "-", txp_errname(rc));
  return branch;
}

int64_t register_ok(txc_t *c, const char *xid, const char *resource, const char *keys) {
  return register_with(c, xid, resource, keys, NULL);
}

int64_t register_sync_ok(txc_t *c, const char *xid, const char *resource, const char *keys) {
  return register_with(c, xid, resource, keys, TXP_APP_DATA_PHASE2_SYNC);
}

static void send_decision_nowait(txc_t *c, const char *xid, txp_msg_type_t type);

void send_rollback_nowait(txc_t *c, const char *xid) { send_decision_nowait(c, xid, TXP_MSG_GLOBAL_ROLLBACK); }

void send_commit_nowait(txc_t *c, const char *xid) { send_decision_nowait(c, xid, TXP_MSG_GLOBAL_COMMIT); }

static void send_decision_nowait(txc_t *c, const char *xid, txp_msg_type_t type) {
  txp_msg_t m;
  txp_msg_init(&m, type);
  txp_msg_set_str(&m, TXP_F_XID, xid);
  m.request_id = 900001;
  assert_int_equal(txc_send_msg(c, &m), 0);
}

/* --------------------------------------------------------- admin socket */

int adm_connect_path(const char *path) {
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

int adm_connect(void) {
  int fd = adm_connect_path(g_sock);
  if (fd < 0) fail_msg("could not connect to %s: %s", g_sock, strerror(errno));
  return fd;
}

void send_all(int fd, const void *buf, size_t len) {
  const char *p = buf;
  while (len) {
    ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail_msg("send: %s", strerror(errno));
    p += n;
    len -= (size_t)n;
  }
}

char *read_line(conn_t *c, int timeout_ms, bool *eof) {
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

json_t *parse_answer(const char *line) {
  json_error_t e;
  json_t *j = json_loads(line, 0, &e);
  if (!json_is_object(j)) fail_msg("answer is not a JSON object (%s): %.300s", e.text, line);
  return j;
}

json_t *read_answer(conn_t *c, int timeout_ms) {
  bool eof;
  char *line = read_line(c, timeout_ms, &eof);
  if (!line) fail_msg("no answer from the admin socket (%s)", eof ? "closed" : "timeout");
  json_t *j = parse_answer(line);
  free(line);
  return j;
}

/* One request on a fresh connection; the parsed answer. */
json_t *adm(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

json_t *adm(const char *fmt, ...) {
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

json_t *adm_ok(const char *what, json_t *a) {
  if (!json_is_true(json_object_get(a, "ok"))) {
    char *s = json_dumps(a, JSON_COMPACT);
    fail_msg("%s: expected ok, got %s", what, s);
  }
  return a;
}

void adm_refused(const char *what, json_t *a, const char *code, const char *want) {
  const char *err = json_string_value(json_object_get(a, "error"));
  const char *c = json_string_value(json_object_get(a, "code"));
  if (json_is_true(json_object_get(a, "ok")) || !err || !c || strcmp(c, code) != 0 || !strstr(err, want)) {
    char *s = json_dumps(a, JSON_COMPACT);
    fail_msg("%s: expected code %s with \"%s\", got %s", what, code, want, s);
  }
  json_decref(a);
}

const char *js(const json_t *o, const char *k) {
  const json_t *v = json_object_get(o, k);
  if (!json_is_string(v)) fail_msg("field \"%s\" is not a string", k);
  return json_string_value(v);
}

long long ji(const json_t *o, const char *k) {
  const json_t *v = json_object_get(o, k);
  if (!json_is_integer(v)) fail_msg("field \"%s\" is not an integer", k);
  return json_integer_value(v);
}

json_t *find_by(json_t *arr, const char *key, const char *val) {
  size_t i;
  json_t *o;
  json_array_foreach(arr, i, o) {
    const json_t *v = json_object_get(o, key);
    if (json_is_string(v) && strcmp(json_string_value(v), val) == 0) return o;
  }
  return NULL;
}

/* ------------------------------------------------------------ commands */

void run_as(int uid, char *const argv[], const char *const *env, run_t *r) {
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

run_t g_run;

int tcctl(const char *a1, const char *a2, const char *a3, const char *a4) {
  char *argv[] = {g_tcctl_path, "--socket", g_sock, (char *)(uintptr_t)a1, (char *)(uintptr_t)a2,
                  (char *)(uintptr_t)a3, (char *)(uintptr_t)a4, NULL};
  memset(&g_run, 0, sizeof(g_run));
  run_as(-1, argv, NULL, &g_run);
  return g_run.status;
}

/* --------------------------------------------------------------- setup */

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


int suite_group_setup(void **state) {
  (void)state;
  const char *me = program_invocation_short_name;
  g_pg_url = getenv("TC_PG_URL");
  const char *bin = getenv("TX_BIN_DIR");
  if (!g_pg_url || !bin) {
    fprintf(stderr, "%s: TC_PG_URL and TX_BIN_DIR must be set (run it through ctest)\n", me);
    return -1;
  }
  snprintf(g_tcctl_path, sizeof(g_tcctl_path), "%s/tcctl", bin);
  if (access(g_tcctl_path, X_OK) != 0) {
    fprintf(stderr, "%s: no tcctl in %s\n", me, bin);
    return -1;
  }
  signal(SIGPIPE, SIG_IGN);
  snprintf(g_dir, sizeof(g_dir), "/tmp/%s.XXXXXX", me);
  if (!mkdtemp(g_dir)) return -1;
  chmod(g_dir, 0755); /* "nobody" must reach the socket to be refused by it */
  /* ...and run tcctl: the build tree may sit in a directory only root can
   * enter (a clone in a mktemp -d), so "nobody" runs a copy from here. */
  if (copy_executable(g_tcctl_path, g_dir, "tcctl", g_tcctl_path, sizeof(g_tcctl_path)) != 0) {
    fprintf(stderr, "%s: could not copy tcctl into %s\n", me, g_dir);
    return -1;
  }
  snprintf(g_sock, sizeof(g_sock), "%s/admin.sock", g_dir);
  g_pg = PQconnectdb(g_pg_url);
  if (PQstatus(g_pg) != CONNECTION_OK) {
    fprintf(stderr, "%s: could not connect to %s: %s\n", me, g_pg_url, PQerrorMessage(g_pg));
    return -1;
  }
  static char max_request[64], idle[64], sock[320], log[320];
  snprintf(max_request, sizeof(max_request), "TC_ADMIN_MAX_REQUEST=%d", MAX_REQUEST);
  snprintf(idle, sizeof(idle), "TC_ADMIN_IDLE_MS=%d", IDLE_MS);
  snprintf(sock, sizeof(sock), "TC_ADMIN_SOCKET=%s", g_sock);
  snprintf(log, sizeof(log), "%s/tcd.log", g_dir);
  static const char *env[] = {"TC_RECOVERY_INTERVAL_MS=200", "TC_RECOVERY_RETRY_MIN_MS=100",
                              "TC_RECOVERY_RETRY_MAX_MS=400", max_request, idle, sock, NULL};
  tcd_opts_t o = {.pg_url = g_pg_url, .token = TOKEN, .node_id = 1, .log_level = "info", .env = env,
                  .metrics = true, .log = log, .attempts = 5, .ready = tcd_serving, .ready_arg = g_sock};
  if (tcd_proc_start(&g_tcd, &o) != 0) {
    fprintf(stderr, "%s: could not start tcd (log: %s)\n", me, log);
    return -1;
  }
  g_rm = rmsim_new("rm-main", "db_orders,db_stock", TOKEN, g_tcd.port);
  g_late = rmsim_new("rm-late", "db_nobody", TOKEN, g_tcd.port);
  return g_rm && g_late ? 0 : -1;
}

int suite_group_teardown(void **state) {
  (void)state;
  rmsim_free(g_rm);
  rmsim_free(g_late);
  g_rm = g_late = NULL;
  int rc = 0;
  if (g_tcd.pid > 0) {
    int st = tcd_proc_stop(&g_tcd, 15000);
    if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      fprintf(stderr, "%s: tcd did not exit cleanly: status 0x%x\n", program_invocation_short_name, st);
      rc = -1;
    }
  }
  if (tcd_proc_print_log(&g_tcd, stderr) > 0) rc = -1; /* a sanitizer report */
  if (g_pg) PQfinish(g_pg);
  if (g_tcd.log[0]) unlink(g_tcd.log);
  unlink(g_tcctl_path); /* the copy in g_dir */
  rmdir(g_dir);
  return rc;
}

int suite_test_setup(void **state) {
  (void)state;
  if (!tcd_proc_alive(&g_tcd, NULL)) {
    fprintf(stderr, "%s: tcd is gone\n", program_invocation_short_name);
    return -1;
  }
  rm_start(g_rm);
  return 0;
}

int suite_test_teardown(void **state) {
  (void)state;
  rmsim_modes(g_rm, false, false);
  rmsim_dirty(g_rm, 0);
  return 0;
}
