/*
 * admin_suite.h - the fixture that test_admin and test_admin_tools share:
 * a real tcd with an admin socket and a metrics endpoint on a real
 * PostgreSQL, simulated resource managers, the store, protocol clients, the
 * admin socket's client side and tcctl runs.
 *
 * NOTES
 *   A real tcd (TX_BIN_DIR/tcd, sanitizers and all) on a real PostgreSQL
 *   (TC_PG_URL; run through scripts/with-servers --pg), started by the group
 *   setup with an admin socket in a temporary directory and metrics on a
 *   free loopback port.  Its output goes to a log file that the checks read
 *   (repairs are logged with the operator's uid) and that the group
 *   teardown copies to the test's stderr; any sanitizer report in it fails
 *   the group, as does a tcd that does not stop cleanly on SIGTERM.
 *
 *   Two simulated resource managers (rmsim.h), each a thread with its own
 *   connection: "rm" (g_rm) serves db_orders and db_stock and answers OK,
 *   holds its answers (silent) or answers DIRTY_WRITE for chosen branches;
 *   "late" (g_late) serves db_nobody and is started only when a test wants
 *   the branches that nobody served so far to be driven to their end.
 *   Until then a branch on db_nobody has no RM, which is how the retrying
 *   states are made.  The test setup starts g_rm.
 *
 *   Asynchronous effects are waited for by polling with a deadline, never
 *   by fixed sleeps.
 */
#ifndef ADMIN_SUITE_H
#define ADMIN_SUITE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>
#include <libpq-fe.h>

#include "db.h"
#include "rmsim.h"
#include "tcd_proc.h"
#include "txclient.h"
#include "txp_msg.h"

#define TOKEN "test-token"
#define HOST TCD_PROC_HOST
#define WAIT_MS 15000
#define MAX_REQUEST 512 /* tcd's admin.max_request */
#define IDLE_MS 1500    /* tcd's admin.idle_ms */
#define NOBODY 65534

double now_ms(void);
/* 10 ms. */
void nap(void);

/* ----------------------------------------------------------- processes */

extern const char *g_pg_url;
extern char g_dir[256], g_sock[300]; /* the temporary directory, the admin socket in it */
extern char g_tcctl_path[4200];      /* a copy of tcctl in g_dir ("nobody" can run it) */
extern tcd_proc_t g_tcd;             /* node 1, metrics on g_tcd.metrics_port, its log g_tcd.log */

/* A tcd_opts_t ready check: tcd accepts a registration and its admin
 * socket (the path 'sock') exists. */
bool tcd_serving(const tcd_proc_t *t, void *sock);

/* ------------------------------------------------------- simulated RMs */

extern rmsim_t *g_rm, *g_late;

/* rmsim_start, failing the test if it does not register in time. */
void rm_start(rmsim_t *r);

/* ---------------------------------------------------------- PostgreSQL */

#define SQL_STATUS "SELECT status FROM global_table WHERE xid = $1"
#define SQL_HISTORY "SELECT status FROM global_history WHERE xid = $1"
#define SQL_LOCKS "SELECT count(*) FROM lock_table WHERE xid = $1"
#define SQL_RETRIES "SELECT retry_count FROM global_table WHERE xid = $1"

void expect_status(const char *xid, int status);
void expect_history(const char *xid, int status);

/* -------------------------------------------------------------- clients */

typedef struct cli {
  txc_t *tm, *rm;
} cli_t;

txc_t *client(bool as_rm, const char *id);
void cli_open(cli_t *cl, const char *name);
void cli_close(cli_t *cl);
void begin_ok(txc_t *tm, uint32_t timeout_ms, const char *name, char *xid);
int64_t register_ok(txc_t *c, const char *xid, const char *resource, const char *keys);
/* An AT branch with commit work (TXP_APP_DATA_PHASE2_SYNC): its commit is
 * driven and recorded (CommitRetrying, CommitFailed, AsyncCommitting are
 * states of such globals; one without commit work is finished at its
 * decision). */
int64_t register_sync_ok(txc_t *c, const char *xid, const char *resource, const char *keys);
/* A GlobalRollback written raw: the answer (which waits for phase two) is
 * never read. */
void send_rollback_nowait(txc_t *c, const char *xid);
void send_commit_nowait(txc_t *c, const char *xid);

/* --------------------------------------------------------- admin socket */

int adm_connect_path(const char *path);
int adm_connect(void);
void send_all(int fd, const void *buf, size_t len);

/* Per-connection read buffer (answers may arrive together). */
typedef struct {
  int fd;
  char buf[8 << 20];
  size_t len;
} conn_t;

/* The next answer line (malloc'ed), or NULL at end of input (*eof) or
 * after 'timeout_ms'. */
char *read_line(conn_t *c, int timeout_ms, bool *eof);
json_t *parse_answer(const char *line);
json_t *read_answer(conn_t *c, int timeout_ms);
/* One request on a fresh connection; the parsed answer. */
json_t *adm(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
json_t *adm_ok(const char *what, json_t *a);
/* 'a' must be {"ok":false,"code":code} with an error containing 'want'. */
void adm_refused(const char *what, json_t *a, const char *code, const char *want);
const char *js(const json_t *o, const char *k);
long long ji(const json_t *o, const char *k);
json_t *find_by(json_t *arr, const char *key, const char *val);

/* ------------------------------------------------------------ commands */

typedef struct {
  int status; /* exit status, or -1 */
  char out[65536];
  char err[8192];
} run_t;

/* Run 'argv' (as 'uid' unless -1), with extra environment 'env' (NULL
 * terminated, may be NULL); capture output. */
void run_as(int uid, char *const argv[], const char *const *env, run_t *r);

extern run_t g_run;

/* tcctl [--socket g_sock] args... as root; returns the exit status (its
 * output in g_run). */
int tcctl(const char *a1, const char *a2, const char *a3, const char *a4);

/* -------------------------------------------------------------- fixture */

int suite_group_setup(void **state);
int suite_group_teardown(void **state);
/* tcd still runs; g_rm is started. */
int suite_test_setup(void **state);
/* RM modes back to normal. */
int suite_test_teardown(void **state);

#endif /* ADMIN_SUITE_H */
