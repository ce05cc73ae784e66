/*
 * tcd_proc.h - a tcd process for tests: started from $TX_BIN_DIR/tcd with
 * its settings in the environment, on a free loopback port, waited for
 * until it serves, then signalled, stopped, killed or restarted; its output
 * kept in a log file.
 *
 * NOTES
 *   The child's environment is the test's without any TC_* variable, plus
 *   the settings of tcd_opts_t: a test sees exactly the settings it asked
 *   for.  It is built before fork(), and the child calls only
 *   async-signal-safe functions (the test may have threads).  The child
 *   gets PR_SET_PDEATHSIG (SIGKILL), and every tcd still running when the
 *   process that started it exits is killed by an atexit handler, so a
 *   crashed or failed test leaves nothing behind.
 *
 *   No cmocka here: the calls return -1 with the reason in t->err (also
 *   written to stderr), and the test asserts.  Not thread-safe: start and
 *   stop processes from one thread.
 */
#ifndef TCD_PROC_H
#define TCD_PROC_H

#include <stdbool.h>
#include <stdio.h>
#include <sys/types.h>

#define TCD_PROC_HOST "127.0.0.1"

struct tcd_proc;

/* Whether the starting tcd serves yet (its port is in t->port). */
typedef bool (*tcd_ready_fn)(const struct tcd_proc *t, void *arg);

typedef struct tcd_opts {
  const char *bin;        /* tcd binary; NULL: $TX_BIN_DIR/tcd */
  const char *pg_url;     /* TC_STORE_PG_URL; NULL: $TC_PG_URL */
  const char *token;      /* TC_SERVER_TOKEN; NULL: not set */
  int node_id;            /* TC_NODE_ID; 0: not set */
  const char *log_level;  /* TC_LOG_LEVEL; NULL: not set */
  const char *const *env; /* more "TC_X_Y=value" settings, NULL-terminated; may be NULL */
  bool metrics;           /* TC_METRICS_LISTEN on a free loopback port too */
  int port;               /* TC_SERVER_LISTEN's port; 0: a free one, new on every attempt */
  const char *log;        /* stdout and stderr appended to this file (the path is copied); NULL: inherited */
  int attempts;           /* with port 0: fresh ports tried before giving up; 0: 1 */
  int timeout_ms;         /* wait for ready, per attempt; 0: 30000 */
  tcd_ready_fn ready;     /* NULL: serving once the port accepts a TCP connection */
  void *ready_arg;
} tcd_opts_t;

typedef struct tcd_proc {
  pid_t pid;          /* 0: not running */
  int port;           /* the client port (kept after it stops, for a restart) */
  int metrics_port;   /* with opts.metrics */
  bool stopped;       /* SIGSTOPped by tcd_proc_signal */
  tcd_opts_t opts;    /* as last started; the strings they point to (but the log path) must live on */
  char log[512];      /* the log file; "" when the output is inherited */
  char err[256];      /* why the last call failed */
} tcd_proc_t;

/* Start tcd with 'o' and wait until it serves.  't' is zeroed or not
 * running.  0, or -1 (nothing left running, reason in t->err). */
int tcd_proc_start(tcd_proc_t *t, const tcd_opts_t *o);

/* Start it again with the same options on the same ports (after a stop or
 * kill).  0 or -1. */
int tcd_proc_restart(tcd_proc_t *t);

/* SIGTERM, then wait up to 'timeout_ms', then SIGKILL.  Returns the wait
 * status of a process that stopped in time, -1 if it had to be killed or
 * was not running. */
int tcd_proc_stop(tcd_proc_t *t, int timeout_ms);

/* SIGKILL (a stopped process is continued so that it dies) and reap.  No-op
 * when not running. */
void tcd_proc_kill(tcd_proc_t *t);

/* kill(2) with bookkeeping of SIGSTOP/SIGCONT.  0 or -1. */
int tcd_proc_signal(tcd_proc_t *t, int sig);

/* Whether it still runs.  If it ended, says how on stderr (once), reaps it
 * and stores its wait status in *status (may be NULL). */
bool tcd_proc_alive(tcd_proc_t *t, int *status);

/* Whether a line of the log contains 'needle'. */
bool tcd_proc_log_has(const tcd_proc_t *t, const char *needle);

/* Copy the log to 'out' between two marker lines.  1 if it holds a
 * sanitizer report, 0 if not, -1 if there is no log to read. */
int tcd_proc_print_log(const tcd_proc_t *t, FILE *out);

/* A loopback port nobody listens on right now (the kernel's choice); -1 on
 * error. */
int tcd_proc_free_port(void);

/* Whether something accepts TCP connections on the loopback 'port'. */
bool tcd_proc_port_open(int port);

#endif /* TCD_PROC_H */
