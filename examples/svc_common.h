/*
 * svc_common.h - what order-service, stock-service and the flash-sale load
 * generator share: structured logging, settings from the environment,
 * signal handling, a small PostgreSQL connection pool and the
 * librmclient set-up.
 *
 * NOTES
 *   Logs are one JSON object per line on stderr, in the shape tcd writes
 *   ({"ts":..., "level":..., "svc":..., "msg":..., fields...}).  The level
 *   is checked before any argument is evaluated (SVC_LOG), so debug lines
 *   cost a compare when debug is off.  Messages follow PostgreSQL's wording:
 *   lowercase, no final period, "could not X: reason".
 *
 *   Settings: every service reads the variables that cluster/local/up
 *   prints (TC_NODES, TC_TOKEN, ORDERS_PG_URL, STOCK_PG_URL, REDIS_URL,
 *   STOCK_URL, ...); svc_env_* give the value or a default and complain
 *   about malformed numbers instead of guessing.
 *
 *   Threads: everything here is safe to call from any thread.  The pool
 *   hands one PGconn to one thread at a time.
 */
#ifndef SVC_COMMON_H
#define SVC_COMMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <jansson.h>
#include <libpq-fe.h>

#include "rm_client.h"
#include "svc_parse.h"
#include "txc_buf.h"

/* ------------------------------------------------------------- logging */

typedef enum { SVC_LOG_ERROR = 0, SVC_LOG_WARN = 1, SVC_LOG_INFO = 2, SVC_LOG_DEBUG = 3 } svc_log_level_t;

extern int svc_log_level;

/* Name the process in every line ("order-service") and take the level from
 * the environment variable 'level_var' (error|warn|info|debug; default
 * info).  Call once, first thing in main. */
void svc_log_init(const char *svc_name, const char *level_var);
/* Write one line: 'fields' (may be NULL) is a JSON object whose members are
 * appended to the line; it is taken (decref'd here). */
void svc_log_write(int level, json_t *fields, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#define SVC_LOG(level, fields, ...)                \
  do {                                             \
    if ((level) > svc_log_level) break;            \
    svc_log_write((level), (fields), __VA_ARGS__); \
  } while (0)

#define svc_error(...) SVC_LOG(SVC_LOG_ERROR, NULL, __VA_ARGS__)
#define svc_warn(...) SVC_LOG(SVC_LOG_WARN, NULL, __VA_ARGS__)
#define svc_info(...) SVC_LOG(SVC_LOG_INFO, NULL, __VA_ARGS__)
#define svc_debug(...) SVC_LOG(SVC_LOG_DEBUG, NULL, __VA_ARGS__)

/* A librmclient log callback that writes through svc_log_write. */
void svc_rm_log_cb(int level, const char *msg, void *arg);

/* --------------------------------------------------------- environment */

/* The value of 'name', or 'def' when unset or empty. */
const char *svc_env_str(const char *name, const char *def);

/* The services' command line: [--listen HOST:PORT] [--url-file FILE] [-h].
 * Overrides '*listen' / '*url_file' as given.  Returns -1 to go on, or the
 * exit status to return at once (0 after --help, 64 on a usage error);
 * 'usage' prints the service's own help. */
int svc_parse_args(int argc, char **argv, const char **listen, const char **url_file,
                   void (*usage)(FILE *f));
/* Write 'url' and a newline to 'path' atomically (temporary file +
 * rename), for --url-file: a reader never sees half a URL. */
bool svc_write_url_file(const char *path, const char *url);
/* The value of 'name' as an integer in [min, max]; 'def' when unset or
 * empty.  A malformed or out-of-range value is logged and gives -1 in
 * '*ok' (set to false); callers refuse to start. */
long long svc_env_int(const char *name, long long def, long long min, long long max, bool *ok);
/* Which of two words 'name' says: true for 'other'; false for 'usual'
 * (also when unset or empty), and for anything else, which is logged
 * ("invalid value ... expected USUAL or OTHER") and sets '*ok' false. */
bool svc_env_either(const char *name, const char *usual, const char *other, bool *ok);
/* TXC_AT_WRITES: how the services' AT branches write, "sql" (the default:
 * the SQL the service would write anyway, through rm_at_sql) or "calls"
 * (the structured rm_at_insert / rm_at_update calls, kept for the
 * benchmark's comparison).  True for sql; a bad value is logged and sets
 * '*ok' false. */
bool svc_at_writes_sql(bool *ok);
/* Number of CPUs the process may run on (its affinity: taskset, a
 * cpuset), else of online CPUs; at least 1. */
int svc_ncpu(void);
/* The default number of PostgreSQL connections a service keeps for its
 * local transactions: 8 per CPU (svc_ncpu).  With one rehearsal per
 * connection, fewer made a small machine's first sale much faster; with
 * SVC_PG_WARM_ROUNDS the difference is small (bench/README, twenty-fifth
 * and twenty-sixth sessions), so the pools stay this size. */
int svc_pg_pool_default(void);

/* ----------------------------------------------------------- signals */

/* Block SIGTERM, SIGINT, SIGHUP and SIGPIPE in the calling thread (call
 * before any thread starts, so that every thread inherits the mask);
 * svc_wait_signal then returns the first SIGTERM or SIGINT.  A SIGHUP
 * (logrotate) reopens the log file when stderr is one, and is logged. */
void svc_block_signals(void);
int svc_wait_signal(void);

/* ------------------------------------------------------------- time */

/* Monotonic clock in microseconds. */
int64_t svc_now_us(void);
/* '*until' = now + 'us' on CLOCK_MONOTONIC, for pthread_cond_timedwait on
 * a condition variable made with that clock. */
struct timespec;
void svc_deadline_in(struct timespec *until, int64_t us);
/* (ISO 8601 times: txc_isotime.h in common/.) */

/* Latencies: sort 'v' ascending; the p-th percentile (nearest rank) of
 * sorted microseconds v[0..n-1], in milliseconds (0 when n is 0). */
void svc_sort_ll(long long *v, size_t n);
double svc_pct_ms(const long long *v, size_t n, double p);

/* ------------------------------------------------------ PostgreSQL pool */

typedef struct svc_pgpool svc_pgpool_t;

/* A pool of at most 'max' connections to 'conninfo' (copied), opened on
 * demand.  'application_name' is set on each connection. */
svc_pgpool_t *svc_pgpool_new(const char *conninfo, int max, const char *application_name);
/* Close every idle connection and free the pool; every connection must
 * have been returned.  svc_pgpool_free(NULL) does nothing. */
void svc_pgpool_free(svc_pgpool_t *p);
/* Take a connection, waiting up to 'wait_ms' when all are in use; NULL
 * with a message in 'err' when none can be had. */
PGconn *svc_pg_get(svc_pgpool_t *p, unsigned wait_ms, char *err, size_t errlen);
/* Run a request's statements on 'pg' and roll them back (a service's
 * rehearsal, rm_at_open_rehearsal); false with a message in 'err'.  It
 * leaves 'pg' idle, outside a transaction, either way. */
typedef bool (*svc_pg_warm_fn)(PGconn *pg, void *arg, char *err, size_t errlen);
/* How many times svc_pgpool_prewarm rehearses on each connection: a
 * prepared statement's first five runs are planned for their parameters
 * (plan_cache_mode auto); from the sixth PostgreSQL may keep a generic
 * plan, and the first burst's requests plan less (bench/README,
 * twenty-sixth session: half the stock database's plans). */
#define SVC_PG_WARM_ROUNDS 6
/* Open up to 'n' connections now, so that the first requests do not pay
 * for the connection set-up, and, 'warm' given, run it on each: a
 * backend's first request otherwise pays its catalog caches, plans and
 * PL/pgSQL functions, and a sale's first burst meets all of them at once
 * (bench/README, twenty-fifth session).  Each connection is rehearsed
 * SVC_PG_WARM_ROUNDS times.  Returns how many are open; a
 * failure is logged, not fatal (requests connect, or warm, on demand). */
int svc_pgpool_prewarm(svc_pgpool_t *p, int n, svc_pg_warm_fn warm, void *arg);
/* Give 'pg' back.  A connection that is broken or left inside a
 * transaction is closed instead of kept. */
void svc_pg_put(svc_pgpool_t *p, PGconn *pg);

/* A thread's own connection: keep '*pg' if it is healthy, else (re)connect
 * to 'conninfo'.  false with 'err' set ("could not connect to 'what': ...")
 * and '*pg' NULL when it cannot. */
bool svc_pg_ensure(PGconn **pg, const char *conninfo, const char *what, char *err, size_t errlen);

/* Run 'sql' (no parameters, or 'n' text parameters) and return whether it
 * gave 'want' (PGRES_COMMAND_OK or PGRES_TUPLES_OK).  On success '*res'
 * (may be NULL: then cleared here) receives the result; on failure the
 * message goes to 'err'.  A statement with parameters is prepared on the
 * connection the first time and run by name after (txc_pstmt.h), unless
 * RM_UNNAMED_STATEMENTS=1. */
bool svc_pg_exec(PGconn *pg, const char *sql, int n, const char *const *params, ExecStatusType want,
                 PGresult **res, char *err, size_t errlen);

/* One statement of svc_pg_pipeline: its text, its 'n' text parameters and
 * the status it must give. */
typedef struct svc_pg_stmt {
  const char *sql;
  int n;
  const char *const *params;
  ExecStatusType want;
} svc_pg_stmt_t;
#define SVC_PG_PIPELINE_MAX 8

/* The 'n' (1..SVC_PG_PIPELINE_MAX) statements in one round trip (a libpq
 * pipeline), each as svc_pg_exec would run it (prepared once per
 * connection when it has parameters).  true when each gave its 'want';
 * else false with the first failure's message in 'err': the server
 * skipped the ones after it, and an open transaction is aborted (the
 * caller rolls back).  'res' (may be NULL) receives the n results, NULL
 * for those that did not run; the caller clears them. */
bool svc_pg_pipeline(PGconn *pg, const svc_pg_stmt_t *stmts, int n, PGresult **res, char *err, size_t errlen);

/* One statement on a connection of pool 'p' (svc_pg_get with 'wait_ms',
 * svc_pg_exec, svc_pg_put): for reads that need no transaction. */
bool svc_pg_query(svc_pgpool_t *p, unsigned wait_ms, const char *sql, int n, const char *const *params,
                  ExecStatusType want, PGresult **res, char *err, size_t errlen);

/* -------------------------------------------------------- librmclient */

/* Start a client for 'application_id' from TC_NODES and its secret
 * (common/txc_secret.h: TC_SECRET_FILE, TC_SECRETS_DIR or TC_TOKEN) (and
 * RM_REQUEST_TIMEOUT_MS, RM_LOCK_WAIT_MS), logging through svc_log.  Waits
 * up to 'wait_ms' for a first coordinator node to be connected (a service
 * that starts before the cluster still starts; calls wait for nodes).
 * Returns 0 or an RM_E_* code with a log line. */
int svc_rm_client_new(const char *application_id, unsigned wait_ms, rm_client_t **out);

/* --------------------------------------------------------- service key */

/* The services' shared key (svc_auth.h) from TXC_SERVICE_KEY_FILE into
 * '*out': true with *out NULL (and a warning that calls and events go
 * unauthenticated) when it is not set; false, logged, when the file is
 * bad (the service refuses to start). */
struct svc_auth;
bool svc_service_key(struct svc_auth **out);

/* ------------------------------------------------------------ metrics */

/* The standard process_* families of this process (txc_procstat.h), for a
 * /metrics page (a txc_buf_t text, common/txc_buf.h). */
void svc_process_metrics(txc_buf_t *b);

/* ------------------------------------------------------------ JSON */


#endif /* SVC_COMMON_H */
