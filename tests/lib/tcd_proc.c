/*
 * tcd_proc.c - see tcd_proc.h.
 */
#include "tcd_proc.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define DEFAULT_TIMEOUT_MS 30000
#define POLL_NS 10000000L /* 10 ms between two looks */
#define MAX_LIVE 64

extern char **environ;

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void nap(void) {
  struct timespec ts = {0, POLL_NS};
  nanosleep(&ts, NULL);
}

/* Set t->err and say it on stderr. */
static void fail(tcd_proc_t *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(tcd_proc_t *t, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(t->err, sizeof(t->err), fmt, ap);
  va_end(ap);
  fprintf(stderr, "%s: %s\n", program_invocation_short_name, t->err);
}

/* ------------------------------------------------ processes left at exit */

static pid_t g_live[MAX_LIVE];
static pid_t g_owner; /* the process that started them (not a forked child) */

static void kill_live_at_exit(void) {
  if (getpid() != g_owner) return;
  for (int i = 0; i < MAX_LIVE; i++)
    if (g_live[i] > 0) {
      kill(g_live[i], SIGKILL);
      kill(g_live[i], SIGCONT);
      waitpid(g_live[i], NULL, 0);
      g_live[i] = 0;
    }
}

static void live_add(pid_t pid) {
  if (!g_owner) {
    g_owner = getpid();
    atexit(kill_live_at_exit);
  }
  for (int i = 0; i < MAX_LIVE; i++)
    if (g_live[i] == 0) {
      g_live[i] = pid;
      return;
    }
}

static void live_del(pid_t pid) {
  for (int i = 0; i < MAX_LIVE; i++)
    if (g_live[i] == pid) g_live[i] = 0;
}

/* The process ended (reaped): forget it. */
static void gone(tcd_proc_t *t) {
  live_del(t->pid);
  t->pid = 0;
  t->stopped = false;
}

/* ------------------------------------------------------------- ports */

int tcd_proc_free_port(void) {
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

bool tcd_proc_port_open(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  struct sockaddr_in sa;
  memset(&sa, 0, sizeof(sa));
  sa.sin_family = AF_INET;
  sa.sin_port = htons((uint16_t)port);
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bool ok = connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
  close(fd);
  return ok;
}

/* ------------------------------------------------------------- start */

#define NGEN 6 /* settings made here: listen, store, token, node, level, metrics */

/* The child's environment: ours without TC_*, then the settings.  One
 * allocation (the pointer array, then the generated strings); NULL when out
 * of memory. */
static char **build_env(const tcd_proc_t *t) {
  const tcd_opts_t *o = &t->opts;
  size_t n = 0, ne = 0;
  while (environ[n]) n++;
  while (o->env && o->env[ne]) ne++;
  const char *url = o->pg_url ? o->pg_url : getenv("TC_PG_URL");
  size_t slen = 256 + (url ? strlen(url) : 0) + (o->token ? strlen(o->token) : 0) +
                (o->log_level ? strlen(o->log_level) : 0);
  size_t nptr = n + ne + NGEN + 1;
  char **envp = malloc(nptr * sizeof(char *) + NGEN * slen);
  if (!envp) return NULL;
  char *s = (char *)(envp + nptr);
  size_t k = 0;
  for (size_t i = 0; i < n; i++)
    if (strncmp(environ[i], "TC_", 3) != 0) envp[k++] = environ[i];
#define GEN(...)                        \
  do {                                  \
    snprintf(s, slen, __VA_ARGS__);     \
    envp[k++] = s;                      \
    s += slen;                          \
  } while (0)
  GEN("TC_SERVER_LISTEN=%s:%d", TCD_PROC_HOST, t->port);
  if (url) GEN("TC_STORE_PG_URL=%s", url);
  if (o->token) GEN("TC_SERVER_TOKEN=%s", o->token);
  if (o->node_id > 0) GEN("TC_NODE_ID=%d", o->node_id);
  if (o->log_level) GEN("TC_LOG_LEVEL=%s", o->log_level);
  if (o->metrics) GEN("TC_METRICS_LISTEN=%s:%d", TCD_PROC_HOST, t->metrics_port);
#undef GEN
  for (size_t i = 0; i < ne; i++) envp[k++] = (char *)(uintptr_t)o->env[i];
  envp[k] = NULL;
  return envp;
}

static pid_t spawn(tcd_proc_t *t, const char *bin) {
  char **envp = build_env(t);
  if (!envp) {
    fail(t, "out of memory");
    return -1;
  }
  int logfd = -1;
  if (t->log[0]) {
    logfd = open(t->log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (logfd < 0) {
      fail(t, "could not open %s: %s", t->log, strerror(errno));
      free(envp);
      return -1;
    }
  }
  char *argv[] = {(char *)(uintptr_t)bin, NULL};
  pid_t parent = getpid();
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) {
    /* Only async-signal-safe calls here: the parent may have threads. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(126);
    if (logfd >= 0) {
      dup2(logfd, 1);
      dup2(logfd, 2);
    }
    execve(bin, argv, envp);
    _exit(127);
  }
  int fork_errno = errno;
  if (logfd >= 0) close(logfd);
  free(envp);
  if (pid < 0) {
    fail(t, "fork: %s", strerror(fork_errno));
    return -1;
  }
  live_add(pid);
  return pid;
}

/* One start on the ports already in t.  0 or -1 (nothing left running). */
static int start_once(tcd_proc_t *t, const char *bin) {
  pid_t pid = spawn(t, bin);
  if (pid < 0) return -1;
  t->pid = pid;
  t->stopped = false;
  int timeout_ms = t->opts.timeout_ms > 0 ? t->opts.timeout_ms : DEFAULT_TIMEOUT_MS;
  double deadline = now_ms() + timeout_ms;
  for (;;) {
    int st;
    if (waitpid(pid, &st, WNOHANG) == pid) {
      gone(t);
      fail(t, "tcd exited during start-up on port %d (status 0x%x)%s%s", t->port, st,
           t->log[0] ? ", log " : "", t->log);
      return -1;
    }
    if (t->opts.ready ? t->opts.ready(t, t->opts.ready_arg) : tcd_proc_port_open(t->port)) return 0;
    if (now_ms() > deadline) {
      tcd_proc_kill(t);
      fail(t, "tcd did not serve on port %d within %d ms%s%s", t->port, timeout_ms, t->log[0] ? ", log " : "",
           t->log);
      return -1;
    }
    nap();
  }
}

static int start(tcd_proc_t *t, const tcd_opts_t *o, int port, int metrics_port) {
  tcd_opts_t opts = *o; /* 'o' may be &t->opts */
  if (t->pid > 0) {
    fail(t, "tcd (pid %d) is already running", (int)t->pid);
    return -1;
  }
  char log[sizeof(t->log)];
  snprintf(log, sizeof(log), "%s", opts.log ? opts.log : "");
  memset(t, 0, sizeof(*t));
  memcpy(t->log, log, sizeof(log));
  t->opts = opts;
  t->opts.log = t->log[0] ? t->log : NULL; /* the copy: the caller's may go */
  char bin[4096];
  const char *dir = getenv("TX_BIN_DIR");
  snprintf(bin, sizeof(bin), "%s", opts.bin ? opts.bin : "");
  if (!opts.bin) snprintf(bin, sizeof(bin), "%s/tcd", dir ? dir : ".");
  if (access(bin, X_OK) != 0) {
    fail(t, "no tcd binary at %s", bin);
    return -1;
  }
  int attempts = port ? 1 : opts.attempts > 0 ? opts.attempts : 1;
  for (int i = 0; i < attempts; i++) {
    t->port = port ? port : tcd_proc_free_port();
    t->metrics_port = !opts.metrics ? 0 : metrics_port ? metrics_port : tcd_proc_free_port();
    if (t->port <= 0 || (opts.metrics && t->metrics_port <= 0)) {
      fail(t, "no free port: %s", strerror(errno));
      continue;
    }
    if (start_once(t, bin) == 0) {
      t->err[0] = '\0';
      return 0;
    }
  }
  return -1;
}

int tcd_proc_start(tcd_proc_t *t, const tcd_opts_t *o) { return start(t, o, o->port, 0); }

int tcd_proc_restart(tcd_proc_t *t) { return start(t, &t->opts, t->port, t->metrics_port); }

/* -------------------------------------------------------------- stop */

int tcd_proc_stop(tcd_proc_t *t, int timeout_ms) {
  if (t->pid <= 0) return -1;
  kill(t->pid, SIGTERM);
  if (t->stopped) kill(t->pid, SIGCONT);
  double deadline = now_ms() + timeout_ms;
  int st = 0;
  while (now_ms() < deadline) {
    if (waitpid(t->pid, &st, WNOHANG) == t->pid) {
      gone(t);
      return st;
    }
    nap();
  }
  fail(t, "tcd (pid %d) did not stop within %d ms: SIGKILL", (int)t->pid, timeout_ms);
  tcd_proc_kill(t);
  return -1;
}

void tcd_proc_kill(tcd_proc_t *t) {
  if (t->pid <= 0) return;
  kill(t->pid, SIGKILL);
  if (t->stopped) kill(t->pid, SIGCONT);
  waitpid(t->pid, NULL, 0);
  gone(t);
}

int tcd_proc_signal(tcd_proc_t *t, int sig) {
  if (t->pid <= 0 || kill(t->pid, sig) != 0) return -1;
  if (sig == SIGSTOP) t->stopped = true;
  if (sig == SIGCONT) t->stopped = false;
  return 0;
}

bool tcd_proc_alive(tcd_proc_t *t, int *status) {
  if (t->pid <= 0) return false;
  int st = 0;
  pid_t r = waitpid(t->pid, &st, WNOHANG);
  if (r == 0) return true;
  const char *me = program_invocation_short_name;
  if (r == t->pid) {
    if (status) *status = st;
    if (WIFSIGNALED(st))
      fprintf(stderr, "%s: tcd (pid %d) was killed by signal %d\n", me, (int)t->pid, WTERMSIG(st));
    else
      fprintf(stderr, "%s: tcd (pid %d) exited with status %d%s\n", me, (int)t->pid, WEXITSTATUS(st),
              WEXITSTATUS(st) == 0 ? " (a clean stop: SIGTERM/SIGINT from outside the test)" : "");
  } else {
    fprintf(stderr, "%s: waitpid(%d): %s\n", me, (int)t->pid, strerror(errno));
  }
  gone(t);
  return false;
}

/* --------------------------------------------------------------- log */

bool tcd_proc_log_has(const tcd_proc_t *t, const char *needle) {
  FILE *f = t->log[0] ? fopen(t->log, "r") : NULL;
  if (!f) return false;
  char line[8192];
  bool found = false;
  while (!found && fgets(line, sizeof(line), f)) found = strstr(line, needle) != NULL;
  fclose(f);
  return found;
}

int tcd_proc_print_log(const tcd_proc_t *t, FILE *out) {
  FILE *f = t->log[0] ? fopen(t->log, "r") : NULL;
  if (!f) return -1;
  char line[8192];
  int bad = 0;
  fprintf(out, "---- tcd log %s ----\n", t->log);
  while (fgets(line, sizeof(line), f)) {
    fputs(line, out);
    if (strstr(line, "AddressSanitizer") || strstr(line, "runtime error:") || strstr(line, "LeakSanitizer")) bad = 1;
  }
  fclose(f);
  fprintf(out, "---- end of tcd log ----\n");
  fflush(out);
  return bad;
}
