/*
 * svc_common.c - logging, environment, signals, PostgreSQL pool and
 * librmclient set-up shared by the example services (see svc_common.h).
 */
#include "svc_common.h"
#include "txc_procstat.h"
#include "txc_failpoint.h"
#include "txc_logfile.h"
#include "txc_isotime.h"
#include "txc_pgconn.h"
#include "txc_pgmsg.h"
#include "txc_pgpool.h"
#include "txc_pstmt.h"
#include "txc_secret.h"
#include "txc_worker.h"
#include "svc_auth.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------- logging */

int svc_log_level = SVC_LOG_INFO;
static char g_svc_name[64] = "svc";

static const char *const level_names[] = {"error", "warn", "info", "debug"};

void svc_log_init(const char *svc_name, const char *level_var) {
  snprintf(g_svc_name, sizeof(g_svc_name), "%s", svc_name);
  const char *lv = level_var ? getenv(level_var) : NULL;
  if (!lv || !*lv) lv = getenv("SVC_LOG_LEVEL");
  if (lv && *lv) {
    for (int i = 0; i < 4; i++)
      if (strcmp(lv, level_names[i]) == 0) svc_log_level = i;
  }
}

void svc_log_write(int level, json_t *fields, const char *fmt, ...) {
  char msg[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);

  char when[TXC_ISO_TIME_MAX];
  txc_iso_time(when, txc_unix_ms());

  if (level < 0) level = 0;
  if (level > 3) level = 3;
  json_t *line = json_object();
  json_object_set_new(line, "ts", json_string(when));
  json_object_set_new(line, "level", json_string(level_names[level]));
  json_object_set_new(line, "svc", json_string(g_svc_name));
  json_object_set_new(line, "pid", json_integer(getpid()));
  /* Invalid UTF-8 (e.g. a PostgreSQL message in another encoding) must
   * not lose the line: json_string refuses it, so fall back to a note. */
  json_t *m = json_string(msg);
  json_object_set_new(line, "msg", m ? m : json_string("(message not valid UTF-8)"));
  if (fields && json_is_object(fields)) json_object_update(line, fields);
  json_decref(fields);
  char *s = json_dumps(line, JSON_COMPACT | JSON_ENSURE_ASCII);
  json_decref(line);
  if (!s) return;
  size_t n = strlen(s);
  s[n] = '\n'; /* replaces the NUL: one write(2) for the whole line */
  ssize_t off = 0;
  while ((size_t)off < n + 1) {
    ssize_t w = write(STDERR_FILENO, s + off, n + 1 - (size_t)off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) break;
    off += w;
  }
  free(s);
}

void svc_rm_log_cb(int level, const char *msg, void *arg) {
  (void)arg;
  /* rm levels: 1 error .. 4 debug; ours: 0 error .. 3 debug */
  int l = level - 1;
  if (l > svc_log_level) return;
  svc_log_write(l, json_pack("{s:s}", "from", "rmclient"), "%s", msg);
}

/* --------------------------------------------------------- environment */

const char *svc_env_str(const char *name, const char *def) {
  const char *v = getenv(name);
  return v && *v ? v : def;
}

bool svc_env_either(const char *name, const char *usual, const char *other, bool *ok) {
  const char *v = svc_env_str(name, usual);
  if (strcmp(v, other) == 0) return true;
  if (strcmp(v, usual) != 0) {
    svc_error("invalid value \"%s\" for %s: expected %s or %s", v, name, usual, other);
    *ok = false;
  }
  return false;
}

bool svc_at_writes_sql(bool *ok) { return !svc_env_either("TXC_AT_WRITES", "sql", "calls", ok); }

long long svc_env_int(const char *name, long long def, long long min, long long max, bool *ok) {
  const char *v = getenv(name);
  if (!v || !*v) return def;
  long long x;
  if (!svc_parse_ll(v, min, max, &x)) {
    svc_error("invalid value \"%s\" for %s: expected an integer from %lld to %lld", v, name, min, max);
    if (ok) *ok = false;
    return -1;
  }
  return x;
}

int svc_ncpu(void) {
  /* the CPUs this process may run on (taskset, a container's cpuset),
   * not every CPU of the machine: the pools are sized by it */
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}

int svc_pg_pool_default(void) { return 8 * svc_ncpu(); }

/* ----------------------------------------------------------- signals */

/* The signals svc_wait_signal waits for: stop (TERM, INT) and reopen the
 * log (HUP). */
static void waited_signals(sigset_t *set) {
  sigemptyset(set);
  sigaddset(set, SIGTERM);
  sigaddset(set, SIGINT);
  sigaddset(set, SIGHUP);
}

void svc_block_signals(void) {
  sigset_t set;
  waited_signals(&set);
  sigaddset(&set, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &set, NULL);
  txc_logfile_remember();
}

int svc_wait_signal(void) {
  sigset_t set;
  waited_signals(&set);
  for (;;) {
    int sig = 0;
    if (sigwait(&set, &sig) != 0) continue;
    if (sig != SIGHUP) return sig;
    /* logrotate's signal: reopen the log file, go on */
    int rc = txc_logfile_reopen();
    if (rc > 0)
      svc_info("received SIGHUP: log file reopened");
    else if (rc == 0)
      svc_info("received SIGHUP: the log goes to a pipe or terminal, nothing to reopen; not stopping");
    else
      svc_warn("received SIGHUP: could not reopen the log file: %s (still writing to the old one)", strerror(errno));
  }
}

int64_t svc_now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static int cmp_ll(const void *a, const void *b) {
  long long x = *(const long long *)a, y = *(const long long *)b;
  return (x > y) - (x < y);
}

void svc_sort_ll(long long *v, size_t n) {
  if (n) qsort(v, n, sizeof(*v), cmp_ll);
}

double svc_pct_ms(const long long *v, size_t n, double p) {
  if (!n) return 0;
  size_t i = (size_t)ceil(p / 100.0 * (double)n);
  if (i < 1) i = 1;
  if (i > n) i = n;
  return (double)v[i - 1] / 1000.0;
}

/* ------------------------------------------------------ PostgreSQL pool */

struct svc_pgpool {
  txc_pgpool_t pool; /* at most pool.cap connections, opened on demand */
  char *conninfo;
  char appname[64];
};

/* Before svc_pgpool_new, which frees what it half made with it. */
void svc_pgpool_free(svc_pgpool_t *p) {
  if (!p) return;
  txc_pgpool_destroy(&p->pool);
  free(p->conninfo);
  free(p);
}

svc_pgpool_t *svc_pgpool_new(const char *conninfo, int max, const char *application_name) {
  if (!conninfo || max <= 0) return NULL;
  svc_pgpool_t *p = calloc(1, sizeof(*p));
  if (p && (!(p->conninfo = strdup(conninfo)) || txc_pgpool_init(&p->pool, max) != 0)) {
    svc_pgpool_free(p);
    p = NULL;
  }
  if (p) snprintf(p->appname, sizeof(p->appname), "%s", application_name ? application_name : "svc");
  return p;
}

static PGconn *pg_connect(void *arg, char *err, size_t errlen) {
  const svc_pgpool_t *p = arg;
  const char *keys[] = {"dbname", "application_name", NULL};
  const char *vals[] = {p->conninfo, p->appname, NULL};
  PGconn *pg = PQconnectdbParams(keys, vals, 1);
  if (!pg || PQstatus(pg) != CONNECTION_OK) {
    const char *m = pg ? PQerrorMessage(pg) : "out of memory";
    snprintf(err, errlen, "could not connect to PostgreSQL: %.*s", (int)txc_pgmsg_len(m), m);
    PQfinish(pg);
    return NULL;
  }
  return pg;
}

/* An idle connection is lent only if txc_pgconn_usable() (common/txc_pgconn.h).
 * One that died while idle (a server restart, the primary's failover) or
 * is on a standby is replaced: PQreset connects again with the same
 * conninfo, so a multi-host one with target_session_attrs=read-write
 * lands on the (new) primary. */
static bool pg_lendable(PGconn *pg) {
  if (txc_pgconn_usable(pg)) return true;
  PQreset(pg);
  return txc_pgconn_usable(pg);
}

static const txc_pgpool_ops_t pg_pool_ops = {.open = pg_connect, .lendable = pg_lendable};

void svc_deadline_in(struct timespec *until, int64_t us) {
  clock_gettime(CLOCK_MONOTONIC, until);
  if (us < 0) us = 0;
  until->tv_sec += (time_t)(us / 1000000);
  until->tv_nsec += (long)(us % 1000000) * 1000L;
  if (until->tv_nsec >= 1000000000L) {
    until->tv_sec++;
    until->tv_nsec -= 1000000000L;
  }
}

bool svc_pg_ensure(PGconn **pg, const char *conninfo, const char *what, char *err, size_t errlen) {
  /* Between transactions the check reads what the server sent (a dead
   * one shows now); inside one, nothing is read behind the caller's back. */
  if (*pg && (PQtransactionStatus(*pg) == PQTRANS_IDLE ? txc_pgconn_usable(*pg) : PQstatus(*pg) == CONNECTION_OK))
    return true;
  PQfinish(*pg);
  *pg = PQconnectdb(conninfo);
  if (PQstatus(*pg) == CONNECTION_OK) return true;
  const char *m = PQerrorMessage(*pg);
  snprintf(err, errlen, "could not connect to %s: %.*s", what, (int)txc_pgmsg_len(m), m);
  PQfinish(*pg);
  *pg = NULL;
  return false;
}

PGconn *svc_pg_get(svc_pgpool_t *p, unsigned wait_ms, char *err, size_t errlen) {
  PGconn *pg;
  int max = p->pool.cap;
  if (txc_pgpool_get(&p->pool, max, wait_ms, &pg_pool_ops, p, &pg, err, errlen) == TXC_PGPOOL_BUSY)
    snprintf(err, errlen, "could not get a PostgreSQL connection: all %d in use", max);
  return pg;
}

int svc_pgpool_prewarm(svc_pgpool_t *p, int n, svc_pg_warm_fn warm, void *arg) {
  PGconn **got = calloc((size_t)(n > 0 ? n : 1), sizeof(PGconn *));
  if (!got) return 0;
  int k = 0;
  char err[512];
  for (; k < n; k++) {
    got[k] = svc_pg_get(p, 0, err, sizeof(err));
    if (!got[k]) {
      svc_warn("%s", err);
      break;
    }
  }
  /* all taken first, so that each one is a different backend */
  int warmed = 0;
  bool failed = false;
  for (; warm && !failed && warmed < k; warmed++) {
    for (int round = 0; round < SVC_PG_WARM_ROUNDS; round++) {
      if (!warm(got[warmed], arg, err, sizeof(err))) {
        svc_warn("could not warm the PostgreSQL connections before serving: %s; the first requests warm them", err);
        failed = true;
        break;
      }
    }
  }
  if (warm && !failed && k > 0)
    svc_info("warmed %d PostgreSQL connection(s) before serving: a request's statements rehearsed %d times on each",
             k, SVC_PG_WARM_ROUNDS);
  for (int i = 0; i < k; i++) svc_pg_put(p, got[i]);
  free(got);
  return k;
}

void svc_pg_put(svc_pgpool_t *p, PGconn *pg) {
  /* A connection that failed in the middle of a transaction (its server
   * died: CONNECTION_BAD; or left in a failed or open block) is closed,
   * never lent again (txc_pgpool_put); so is one found to be on a
   * read-only server. */
  const char *hs = pg ? PQparameterStatus(pg, "in_hot_standby") : NULL;
  const char *ro = pg ? PQparameterStatus(pg, "default_transaction_read_only") : NULL;
  txc_pgpool_put(&p->pool, pg, !(hs && strcmp(hs, "on") == 0) && !(ro && strcmp(ro, "on") == 0));
}

/* The message of a failed result (or of the connection). */
static void pg_failure(PGconn *pg, const PGresult *r, char *err, size_t errlen) {
  const char *m = r ? PQresultErrorMessage(r) : PQerrorMessage(pg);
  if (!m || !*m) m = "unexpected result";
  snprintf(err, errlen, "%.*s", (int)txc_pgmsg_len(m), m);
}

/* The services' statements with parameters, prepared once per connection
 * (txc_pstmt.h): the same few texts run thousands of times a sale, and
 * sent unnamed each is parsed and planned anew.  One cache for the
 * process, its names "svc_N" (the AT layer's on the same connections are
 * "rm_at_N"); none with RM_UNNAMED_STATEMENTS=1 (a transaction-pooling
 * proxy keeps no statement between transactions).  It lives as long as
 * the process. */
#define SVC_PSTMT_CONNS 256
static txc_pstmt_cache_t *svc_stmts;
static pthread_once_t svc_stmts_once = PTHREAD_ONCE_INIT;

static void svc_stmts_init(void) {
  bool ok = true; /* a bad value: logged, and svc_rm_client_new refuses it */
  if (svc_env_int("RM_UNNAMED_STATEMENTS", 0, 0, 1, &ok) == 0) svc_stmts = txc_pstmt_new("svc_", SVC_PSTMT_CONNS);
}

bool svc_pg_exec(PGconn *pg, const char *sql, int n, const char *const *params, ExecStatusType want,
                 PGresult **res, char *err, size_t errlen) {
  PGresult *r;
  if (n > 0) {
    pthread_once(&svc_stmts_once, svc_stmts_init);
    r = txc_pstmt_exec(svc_stmts, pg, sql, n, params);
  } else {
    r = PQexec(pg, sql);
  }
  if (PQresultStatus(r) != want) {
    pg_failure(pg, r, err, errlen);
    PQclear(r);
    if (res) *res = NULL;
    return false;
  }
  if (res)
    *res = r;
  else
    PQclear(r);
  return true;
}

bool svc_pg_pipeline(PGconn *pg, const svc_pg_stmt_t *stmts, int n, PGresult **res, char *err, size_t errlen) {
  PGresult *got[SVC_PG_PIPELINE_MAX] = {NULL};
  char names[SVC_PG_PIPELINE_MAX][TXC_PSTMT_NAME_MAX];
  bool named[SVC_PG_PIPELINE_MAX] = {false}, fresh[SVC_PG_PIPELINE_MAX] = {false};
  if (n < 1 || n > SVC_PG_PIPELINE_MAX) {
    snprintf(err, errlen, "a pipeline of %d statements (1 to %d)", n, SVC_PG_PIPELINE_MAX);
    return false;
  }
  pthread_once(&svc_stmts_once, svc_stmts_init);
  if (PQpipelineStatus(pg) != PQ_PIPELINE_OFF || PQenterPipelineMode(pg) != 1) {
    pg_failure(pg, NULL, err, errlen);
    return false;
  }
  bool sent = true;
  for (int i = 0; sent && i < n; i++) {
    const svc_pg_stmt_t *st = &stmts[i];
    named[i] = st->n > 0 && txc_pstmt_lookup(svc_stmts, pg, st->sql, st->n, NULL, names[i], &fresh[i]);
    if (named[i] && fresh[i]) sent = PQsendPrepare(pg, names[i], st->sql, st->n, NULL) == 1;
    if (sent)
      sent = named[i] ? PQsendQueryPrepared(pg, names[i], st->n, st->params, NULL, NULL, 0) == 1
                      : PQsendQueryParams(pg, st->sql, st->n, NULL, st->params, NULL, NULL, 0) == 1;
  }
  if (sent) sent = PQpipelineSync(pg) == 1;
  bool ok = sent;
  if (!sent) pg_failure(pg, NULL, err, errlen);
  /* Every result of what was sent, each followed by its NULL, then the
   * sync; a failure is the first one that did not give its 'want'. */
  bool reading = true;
  for (int i = 0; sent && reading && i < n; i++) {
    for (int step = named[i] && fresh[i] ? 0 : 1; step < 2 && reading; step++) {
      PGresult *r = PQgetResult(pg), *extra;
      if (!r) {
        reading = false;
        if (ok) pg_failure(pg, NULL, err, errlen);
        ok = false;
        break;
      }
      while ((extra = PQgetResult(pg)) != NULL) PQclear(extra);
      ExecStatusType rs = PQresultStatus(r);
      if (step == 0) { /* the Prepare */
        bool prepared = rs == PGRES_COMMAND_OK;
        txc_pstmt_prepared(svc_stmts, pg, stmts[i].sql, stmts[i].n, NULL, names[i], prepared);
        if (!prepared && ok && rs != PGRES_PIPELINE_ABORTED) {
          pg_failure(pg, r, err, errlen);
          ok = false;
        }
        PQclear(r);
        continue;
      }
      if (named[i] && txc_pstmt_stale(r)) txc_pstmt_forget(svc_stmts, pg); /* prepared afresh next time */
      if (rs != stmts[i].want && ok) {
        pg_failure(pg, r, err, errlen);
        ok = false;
      }
      if (rs == PGRES_PIPELINE_ABORTED) PQclear(r);
      else got[i] = r;
    }
  }
  if (sent && reading) { /* the sync */
    PGresult *r = PQgetResult(pg);
    if (!r || PQresultStatus(r) != PGRES_PIPELINE_SYNC) {
      if (ok) pg_failure(pg, r, err, errlen);
      ok = false;
    }
    PQclear(r);
  }
  if (PQexitPipelineMode(pg) != 1 && ok) {
    pg_failure(pg, NULL, err, errlen);
    ok = false;
  }
  for (int i = 0; i < n; i++) {
    if (res) res[i] = got[i];
    else PQclear(got[i]);
  }
  return ok;
}

bool svc_pg_query(svc_pgpool_t *p, unsigned wait_ms, const char *sql, int n, const char *const *params,
                  ExecStatusType want, PGresult **res, char *err, size_t errlen) {
  if (res) *res = NULL;
  PGconn *pg = svc_pg_get(p, wait_ms, err, errlen);
  if (!pg) return false;
  bool ok = svc_pg_exec(pg, sql, n, params, want, res, err, errlen);
  svc_pg_put(p, pg);
  return ok;
}

/* -------------------------------------------------------- librmclient */

int svc_rm_client_new(const char *application_id, unsigned wait_ms, rm_client_t **out) {
  bool ok = true;
  const char *nodes = svc_env_str("TC_NODES", NULL);
  /* The application's own secret (txc_secret.h): TC_SECRET_FILE, or its
   * file in TC_SECRETS_DIR, or the legacy shared TC_TOKEN. */
  char secret[512], why[512];
  const char *source = NULL;
  int src = txc_secret_for(application_id, secret, sizeof(secret), &source, why, sizeof(why));
  if (!nodes || src != 0) {
    svc_error("could not start the transaction client: %s", !nodes ? "TC_NODES is not set (cluster/local/up prints it)"
              : src > 0 ? "no registration secret: set TC_SECRETS_DIR or TC_SECRET_FILE (cluster/local/up prints "
                          "them), or the legacy TC_TOKEN"
                        : why);
    return RM_E_INVALID;
  }
  if (strcmp(source, "TC_TOKEN") == 0)
    svc_warn("registering as \"%s\" with the shared TC_TOKEN: the coordinator puts all its holders in one "
             "group; give the application its own secret (TC_SECRETS_DIR or TC_SECRET_FILE)", application_id);
  rm_config_t cfg = {
    .nodes = nodes,
    .token = secret,
    .application_id = application_id,
    .request_timeout_ms = (unsigned)svc_env_int("RM_REQUEST_TIMEOUT_MS", 5000, 100, 600000, &ok),
    .lock_wait_ms = (unsigned)svc_env_int("RM_LOCK_WAIT_MS", 2000, 0, 600000, &ok),
    .log_cb = svc_rm_log_cb,
    .log_level = svc_log_level + 1,
    /* RM_UNNAMED_STATEMENTS=1 behind a transaction-pooling proxy. */
    .unnamed_statements = (int)svc_env_int("RM_UNNAMED_STATEMENTS", 0, 0, 1, &ok),
  };
  /* RM_NODE_CHOICE: "home" (the library's default) or "round-robin". */
  const char *choice = svc_env_str("RM_NODE_CHOICE", "home");
  if (strcmp(choice, "round-robin") == 0) {
    cfg.node_choice = RM_NODE_ROUND_ROBIN;
  } else if (strcmp(choice, "home") != 0) {
    svc_error("invalid RM_NODE_CHOICE \"%s\": expected home or round-robin", choice);
    ok = false;
  }
  if (!ok) return RM_E_INVALID;
  /* The service's own failpoints (svc.*; a build with TX_FAILPOINTS only):
   * TX_FAILPOINTS also arms the library's, which rm_client_new checks. */
  char fperr[256];
  if (txc_failpoint_compiled() && txc_failpoint_arm_env(fperr, sizeof(fperr)) != 0) {
    svc_error("invalid TX_FAILPOINTS: %s", fperr);
    return RM_E_INVALID;
  }
  int rc = rm_client_new(&cfg, out);
  memset(secret, 0, sizeof(secret)); /* the client keeps its own copy */
  if (rc != 0) {
    svc_error("could not start the transaction client: %s", rm_strerror(rc));
    return rc;
  }
  int64_t end = svc_now_us() + (int64_t)wait_ms * 1000;
  /* The client has no "connected" callback; a short poll at start-up is
   * the simplest honest wait (it only delays readiness). */
  while (rm_client_nodes_up(*out) < 1 && svc_now_us() < end) {
    struct timespec ts = {0, 20 * 1000000L};
    nanosleep(&ts, NULL);
  }
  if (rm_client_nodes_up(*out) < 1)
    svc_warn("no coordinator node connected yet (TC_NODES=%s); requests will wait for one", nodes);
  return 0;
}

/* ------------------------------------------------------------ JSON */

bool svc_write_url_file(const char *path, const char *url) {
  char tmp[4096];
  snprintf(tmp, sizeof(tmp), "%s.tmp%d", path, (int)getpid());
  FILE *f = fopen(tmp, "w");
  if (!f) return false;
  bool ok = fprintf(f, "%s\n", url) > 0;
  ok = fclose(f) == 0 && ok;
  if (ok) ok = rename(tmp, path) == 0;
  if (!ok) unlink(tmp);
  return ok;
}

int svc_parse_args(int argc, char **argv, const char **listen, const char **url_file,
                   void (*usage)(FILE *f)) {
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--listen") == 0 && i + 1 < argc) {
      *listen = argv[++i];
    } else if (strcmp(argv[i], "--url-file") == 0 && i + 1 < argc) {
      *url_file = argv[++i];
    } else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
      usage(stdout);
      return 0;
    } else {
      usage(stderr);
      return 64;
    }
  }
  return -1;
}

bool svc_service_key(struct svc_auth **out) {
  char err[512];
  *out = svc_auth_from_env(err, sizeof(err));
  if (*out) return true;
  if (err[0]) {
    svc_error("%s (TXC_SERVICE_KEY_FILE)", err);
    return false;
  }
  svc_warn("TXC_SERVICE_KEY_FILE is not set: calls between the services and the order events are not "
           "authenticated (cluster/local/up writes a key; see examples/svc_auth.h)");
  return true;
}

void svc_process_metrics(txc_buf_t *b) {
  txc_procstat_t ps;
  char text[2048];
  if (txc_procstat_read(&ps) == 0 && txc_procstat_format(&ps, text, sizeof(text)) > 0) txc_buf_printf(b, "%s", text);
}
