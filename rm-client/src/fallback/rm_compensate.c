/*
 * rm_compensate.c - the compensation job of fallback-to-local mode, and its
 * scheduler: make the orders database, the stock database and Redis agree
 * about every order taken without a coordinator, then reconcile Redis
 * with PostgreSQL.
 *
 * NOTES
 *   One pass (rm_compensate_run):
 *     1. Connect to the orders database and take the session advisory lock
 *        RM_COMP_LOCK_KEY with pg_try_advisory_lock: at most one pass runs
 *        at a time, whichever process it is in (every order-service
 *        instance may schedule passes).  Busy: RM_COMP_E_LOCKED, nothing
 *        done.  The lock belongs to the connection, so a pass that is
 *        killed (SIGKILL, a crash, a lost network) holds nothing once its
 *        server backend notices the closed socket.
 *     2. For each PENDING order_compensation row, in order id order:
 *          a. ask the stock database (rm__local_stock_freeze, source
 *             "compensation"): the order's stock_compensation row decides
 *             the stock side once; if stock-service decided already this
 *             only reads its decision, else it freezes now if the stock
 *             permits, or records the refusal;
 *          b. frozen: rm_local_order_finish (the order stands, the row is
 *             DONE); refused: rm_local_order_cancel (Redis freeze
 *             released, the order CANCELLED with a reason for the user, the
 *             row DONE, one transaction after the release).
 *        A failure of one row is written on it (attempts, last_error) and
 *        the pass goes on; the row stays PENDING for the next pass.
 *     3. With 'reconcile': rm_prefilter_reconcile for every activity of the
 *        stock database (or one): Redis gets PostgreSQL's counts, per-user
 *        totals, freeze records and deadlines; each difference is logged
 *        with both values and counted.  Step 2 comes first so that the
 *        freezes it records are in PostgreSQL before Redis is rebuilt
 *        from it.
 *
 *   Killed anywhere: every write of step 2 is idempotent and each row's
 *   decision is durable in the stock database before the orders database
 *   or Redis act on it (2a commits before 2b starts; a refusal is never
 *   turned into a freeze later, nor the reverse), so running the pass
 *   again redoes the unfinished steps with the same decisions and reaches
 *   the same end state.  The Redis release of 2b happens before the
 *   orders transaction that marks the row DONE, so a crash between them
 *   repeats a release that Redis answers "already released".
 *
 *   Mixed with global transactions: when the coordinator is back, new
 *   orders take the global path while passes finish the local ones.  Both
 *   freeze stock through guarded updates of the same bucket rows
 *   (stock - frozen - sold >= qty, and the table's CHECK), so whatever the
 *   interleaving the stock is never oversold; a local order that comes too
 *   late for the remaining stock is refused and cancelled, never forced.
 *
 *   Scheduler (rm_compensator_*): one thread per compensator, sleeping on a
 *   condition variable (CLOCK_MONOTONIC) until the next pass is due or a
 *   kick arrives; it never holds its mutex while a pass runs.
 *
 *   Redis master changes (a Sentinel failover, a restart: the new master
 *   may have lost up to a second of freezes, so it can show more stock
 *   than exists and forget what a user bought): the thread checks the
 *   prefilter's master every MASTER_PROBE_MS (rm__pf_master_probe), and
 *   the prefilter's pool calls the hook when any connection finds another
 *   master.  Either way reconciliation passes follow: one at once, then
 *   one every FAILOVER_AGAIN_MS until a pass (the second or later) finds
 *   nothing to correct; a failed one (RM_PF_E_CONFLICT, rare now that a
 *   busy round holds the sale's writers for a moment; a database error) is
 *   retried after FAILOVER_RETRY_MS; at most
 *   FAILOVER_MAX_PASSES.  Why more than one: a pass drops the freezes that
 *   Redis granted and PostgreSQL has not recorded yet (in flight), and
 *   the next puts back those that committed meanwhile; once the traffic
 *   of the sale has settled, two passes agree and Redis equals
 *   PostgreSQL.  PostgreSQL's guards keep the sale from overselling in
 *   between, whatever Redis says.
 *
 *   The library never prints: lines go to the options' log callback.
 */
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rm_local.h"
#include "rm_log.h"
#include "rm_pg.h"
#include "rm_prefilter_conn.h"
#include "rm_prefilter_int.h"
#include "rm_prefilter_pg.h"
#include "rm_prefilter_keys.h"
#include "txc_worker.h"

/* The orders database's advisory lock key of the job ("txc" + 1: distinct
 * from db-migrate's 7466001). */
#define RM_COMP_LOCK_KEY "7466101"
#define SCAN_BATCH "100"
#define DEFAULT_INTERVAL_MS 10000u
#define DEFAULT_RECONCILE_MS 300000u
/* Redis master changes: check the master this often; reconcile at once,
 * then again this long after each pass (freezes in flight during one are
 * in PostgreSQL by then: the services' global timeout is at most 5 s)
 * until one finds nothing; retry a failed one this soon; give up after
 * this many (the periodic reconciliation goes on). */
#define MASTER_PROBE_MS 1000u
#define FAILOVER_AGAIN_MS 5000u
#define FAILOVER_RETRY_MS 1000u
#define FAILOVER_MAX_PASSES 120u
#define ERR_MAX 512

/* ------------------------------------------------------------ logging --- */

/* The pass's lines go to its caller's callback (rm_comp_options_t). */
#define COMP_LOG(l, lvl, ...) RM_LOGGER((l), (lvl), __VA_ARGS__)

/* ---------------------------------------------------------- one pass --- */

typedef struct pass {
  PGconn *orders;
  PGconn *stock;
  rm_prefilter_t *pf;
  const rm_comp_options_t *o;
  rm_comp_report_t *rep;
  rm_logger_t log;
} pass_t;

static PGconn *connect_db(const char *conninfo, const char *which) {
  const char *const keys[] = {"dbname", "application_name", NULL};
  const char *const vals[] = {conninfo, "txc-compensate", NULL};
  PGconn *pg = PQconnectdbParams(keys, vals, 1);
  if (pg && PQstatus(pg) == CONNECTION_OK) return pg;
  char what[64], err[ERR_MAX];
  snprintf(what, sizeof(what), "could not connect to the %s database", which);
  if (pg) rm__pg_error(err, sizeof(err), what, pg, NULL);
  else snprintf(err, sizeof(err), "%s: out of memory", what);
  rm__errmsg_set("%s", err);
  PQfinish(pg);
  return NULL;
}

/* Write a row's failure on it (best effort: the pass goes on). */
static void note_failure(pass_t *p, int64_t order_id, const char *err) {
  char s[24];
  rm__pf_i64_str(s, order_id);
  const char *vals[2] = {s, err};
  PGresult *res = rm__pf_pg_exec(p->orders, "note the failure",
                                 "UPDATE order_compensation SET attempts = attempts + 1, last_error = left($2, 1000), "
                                 "updated_at = now() WHERE order_id = $1::bigint AND state = 'PENDING'",
                                 2, vals);
  PQclear(res);
}

/* Steps 2a and 2b for one row. */
static void compensate_one(pass_t *p, const rm_local_order_t *ord) {
  char err[ERR_MAX];
  int rc = rm__local_stock_freeze(NULL, p->stock, ord, RM_LOCAL_SOURCE_JOB);
  if (rc == 0 || rc == 1) {
    int f = rm_local_order_finish(NULL, p->orders, ord->order_id);
    if (f == 0 || f == 1) {
      p->rep->frozen++;
      COMP_LOG(&p->log, RM_LOG_INFO, "compensation: order %" PRId64 " stands: its stock was %s", ord->order_id,
           rc == 0 ? "frozen now" : "frozen before");
      return;
    }
    snprintf(err, sizeof(err), "could not finish the order: %s: %s", rm_prefilter_strerror(f), rm_local_errmsg());
  } else if (rm__local_is_refusal(rc)) {
    int f = rm_local_order_cancel(NULL, p->orders, p->pf, ord->order_id, rc);
    if (f == 0 || f == 1) {
      p->rep->cancelled++;
      COMP_LOG(&p->log, RM_LOG_WARN,
           "compensation: order %" PRId64 " (activity %" PRId64 ", bucket %d, qty %d) cancelled: the stock "
           "database refused it (%s)",
           ord->order_id, ord->activity_id, (int)ord->bucket, (int)ord->qty, rm_prefilter_strerror(rc));
      return;
    }
    snprintf(err, sizeof(err), "could not cancel the order: %s: %s", rm_prefilter_strerror(f), rm_local_errmsg());
  } else {
    snprintf(err, sizeof(err), "could not ask the stock database: %s: %s", rm_prefilter_strerror(rc),
             rm_local_errmsg());
  }
  p->rep->failed++;
  COMP_LOG(&p->log, RM_LOG_ERROR, "compensation: order %" PRId64 " left pending: %s", ord->order_id, err);
  if (PQstatus(p->orders) == CONNECTION_OK) note_failure(p, ord->order_id, err);
}

static int cell(const PGresult *res, int row, int col, int64_t *v) {
  const char *s = PQgetvalue(res, row, col);
  return PQgetisnull(res, row, col) || rm__pf_parse_i64(s, strlen(s), v) != 0 ? -1 : 0;
}

/* Step 2: every pending row (up to max_rows). */
static int compensate_rows(pass_t *p) {
  char last[24] = "0", age[24];
  rm__pf_i64_str(age, p->o->min_age_ms);
  unsigned seen = 0;
  for (;;) {
    const char *vals[2] = {last, age};
    PGresult *res = rm__pf_pg_exec(p->orders, "read the pending local-mode orders",
                                   "SELECT order_id, activity_id, ticket_type, bucket_id, user_id, qty, "
                                   "(extract(epoch FROM freeze_deadline) * 1000)::bigint "
                                   "FROM order_compensation WHERE state = 'PENDING' AND order_id > $1::bigint "
                                   "AND created_at <= now() - $2::bigint * interval '1 millisecond' "
                                   "ORDER BY order_id LIMIT " SCAN_BATCH,
                                   2, vals);
    if (!res) return RM_E_DB;
    int n = PQntuples(res);
    for (int i = 0; i < n; i++) {
      int64_t v[7];
      bool ok = true;
      for (int j = 0; j < 7 && ok; j++) ok = cell(res, i, j, &v[j]) == 0;
      if (!ok) {
        PQclear(res);
        rm__errmsg_set("unexpected row in order_compensation");
        return RM_E_DB;
      }
      if (p->o->max_rows && seen >= p->o->max_rows) {
        PQclear(res);
        return 0;
      }
      rm_local_order_t ord = {0};
      ord.order_id = v[0];
      ord.activity_id = v[1];
      ord.ticket_type = (int32_t)v[2];
      ord.bucket = (int32_t)v[3];
      ord.user_id = v[4];
      ord.qty = (int32_t)v[5];
      ord.deadline_ms = v[6] > 0 ? v[6] : 0;
      seen++;
      p->rep->rows++;
      compensate_one(p, &ord);
      rm__pf_i64_str(last, ord.order_id);
      if (PQstatus(p->orders) != CONNECTION_OK || PQstatus(p->stock) != CONNECTION_OK) {
        PQclear(res);
        rm__errmsg_set("lost the connection to the %s database",
                       PQstatus(p->orders) != CONNECTION_OK ? "orders" : "stock");
        return RM_E_DB;
      }
    }
    PQclear(res);
    if (n == 0) return 0;
  }
}

static void on_reconcile_change(const char *key, const char *field, const char *redis_value, const char *pg_value,
                                void *arg) {
  pass_t *p = arg;
  COMP_LOG(&p->log, RM_LOG_WARN, "reconciliation: Redis \"%s\" \"%s\" was %s%s%s, PostgreSQL has %s%s%s: corrected",
       key, field, redis_value ? "\"" : "", redis_value ? redis_value : "absent", redis_value ? "\"" : "",
       pg_value ? "\"" : "", pg_value ? pg_value : "nothing (deleted)", pg_value ? "\"" : "");
}

/* Step 3. */
static int reconcile_all(pass_t *p) {
  int64_t *ids = NULL;
  int n = 0;
  if (p->o->activity_id) {
    ids = malloc(sizeof(*ids));
    if (!ids) return RM_E_NOMEM;
    ids[0] = p->o->activity_id;
    n = 1;
  } else {
    PGresult *res = rm__pf_pg_exec(p->stock, "list the activities", "SELECT activity_id FROM activity ORDER BY 1",
                                   0, NULL);
    if (!res) return RM_E_DB;
    n = PQntuples(res);
    ids = malloc(sizeof(*ids) * (size_t)(n ? n : 1));
    if (!ids) {
      PQclear(res);
      return RM_E_NOMEM;
    }
    for (int i = 0; i < n; i++)
      if (cell(res, i, 0, &ids[i]) != 0) ids[i] = 0;
    PQclear(res);
  }
  for (int i = 0; i < n; i++) {
    if (ids[i] <= 0) continue;
    rm_pf_reconcile_t r = {0};
    int rc = rm_prefilter_reconcile(p->pf, p->stock, ids[i], false, &r, on_reconcile_change, p);
    if (rc != 0) {
      p->rep->reconcile_failed++;
      COMP_LOG(&p->log, RM_LOG_ERROR, "reconciliation: could not reconcile activity %" PRId64 ": %s: %s", ids[i],
           rm_prefilter_strerror(rc), rm_prefilter_errmsg());
      continue;
    }
    p->rep->activities++;
    p->rep->fixed.meta += r.meta;
    p->rep->fixed.buckets += r.buckets;
    p->rep->fixed.users += r.users;
    p->rep->fixed.orders += r.orders;
    p->rep->fixed.deadlines += r.deadlines;
    if (r.meta || r.buckets || r.users || r.orders || r.deadlines)
      COMP_LOG(&p->log, RM_LOG_WARN,
           "reconciliation: activity %" PRId64 ": corrected %u activity, %u bucket, %u user, %u freeze record "
           "and %u deadline value(s) in Redis",
           ids[i], r.meta, r.buckets, r.users, r.orders, r.deadlines);
  }
  free(ids);
  return 0;
}

static int count_pending(pass_t *p, unsigned *out) {
  PGresult *res = rm__pf_pg_exec(p->orders, "count the pending local-mode orders",
                                 "SELECT count(*) FROM order_compensation WHERE state = 'PENDING'", 0, NULL);
  int64_t v = 0;
  if (!res) return RM_E_DB;
  int rc = PQntuples(res) == 1 && cell(res, 0, 0, &v) == 0 ? 0 : RM_E_DB;
  PQclear(res);
  *out = (unsigned)v;
  return rc;
}

int rm_compensate_run(const char *orders_conninfo, const char *stock_conninfo, rm_prefilter_t *pf,
                      const rm_comp_options_t *opts, rm_comp_report_t *report) {
  rm_comp_options_t o = {0};
  rm_comp_report_t rep = {0};
  if (opts) o = *opts;
  if (report) memset(report, 0, sizeof(*report));
  if (!orders_conninfo || !stock_conninfo || (o.reconcile && !pf) || o.log_level < 0 ||
      o.log_level > RM_LOG_DEBUG || o.activity_id < 0) {
    rm__errmsg_set("invalid argument to rm_compensate_run");
    return RM_E_INVALID;
  }
  pass_t p = {0};
  p.pf = pf;
  p.o = &o;
  p.rep = &rep;
  if (rm__logger_init(&p.log, o.log_cb, o.log_arg, o.log_level ? o.log_level : RM_LOG_WARN) != 0) {
    rm__errmsg_set("out of memory");
    return RM_E_NOMEM;
  }

  int rc = RM_E_DB;
  char err[ERR_MAX];
  p.orders = connect_db(orders_conninfo, "orders");
  if (!p.orders) goto fail;
  PGresult *res = rm__pf_pg_exec(p.orders, "take the compensation lock",
                                 "SELECT pg_try_advisory_lock(" RM_COMP_LOCK_KEY ")", 0, NULL);
  if (!res) goto fail_orders;
  bool locked = PQntuples(res) == 1 && strcmp(PQgetvalue(res, 0, 0), "t") == 0;
  PQclear(res);
  if (!locked) {
    rm__errmsg_set("another compensation job holds the lock");
    COMP_LOG(&p.log, RM_LOG_DEBUG, "compensation: another job is running: pass skipped");
    rc = RM_COMP_E_LOCKED;
    goto fail_orders;
  }
  p.stock = connect_db(stock_conninfo, "stock");
  if (!p.stock) goto fail_orders;

  rc = compensate_rows(&p);
  if (rc == 0 && o.reconcile) rc = reconcile_all(&p);
  if (rc == 0) rc = count_pending(&p, &rep.pending);
  if (rc != 0) {
    snprintf(err, sizeof(err), "%s", rm_local_errmsg());
    COMP_LOG(&p.log, RM_LOG_ERROR, "compensation: pass stopped: %s", err);
  } else {
    int lvl = rep.failed || rep.cancelled || rep.reconcile_failed ? RM_LOG_WARN : RM_LOG_INFO;
    COMP_LOG(&p.log, lvl,
         "compensation: pass done: %u local-mode order(s) looked at, %u stand, %u cancelled, %u failed, %u "
         "pending; %u activit%s reconciled (%u failed)",
         rep.rows, rep.frozen, rep.cancelled, rep.failed, rep.pending, rep.activities,
         rep.activities == 1 ? "y" : "ies", rep.reconcile_failed);
  }
  PQfinish(p.stock);
  /* Unlocking is a courtesy: closing the connection releases it too. */
  PQclear(PQexec(p.orders, "SELECT pg_advisory_unlock(" RM_COMP_LOCK_KEY ")"));
  PQfinish(p.orders);
  rm__logger_destroy(&p.log);
  if (report) *report = rep;
  return rc;

fail_orders:
  PQfinish(p.orders);
fail:
  if (rc != RM_COMP_E_LOCKED) {
    snprintf(err, sizeof(err), "%s", rm_local_errmsg());
    COMP_LOG(&p.log, RM_LOG_ERROR, "compensation: pass failed: %s", err);
  }
  rm__logger_destroy(&p.log);
  if (report) *report = rep;
  return rc;
}

/* --------------------------------------------------------- scheduler --- */

struct rm_compensator {
  /* Immutable after start. */
  char *orders;
  char *stock;
  rm_prefilter_t *pf;
  unsigned interval_ms;
  unsigned reconcile_ms;
  rm_comp_options_t run;

  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t wake; /* the thread: a kick or stop */
  pthread_cond_t done; /* waiters of run_now: a pass ended */
  /* Under 'mu'. */
  bool stop;
  bool kick;
  bool kick_reconcile;
  bool fo_active;          /* a master change: reconciling until a quiet pass */
  unsigned fo_passes;      /* passes since it (done and failed) */
  unsigned fo_ok;          /* of which succeeded */
  uint64_t fo_due;         /* the next of them, or UINT64_MAX */
  uint64_t started, finished;
  rm_comp_report_t last;
  rm_compensator_stats_t st;
};


static void deadline_ts(uint64_t ms, struct timespec *ts) {
  ts->tv_sec = (time_t)(ms / 1000u);
  ts->tv_nsec = (long)(ms % 1000u) * 1000000L;
}

/* The prefilter's pool found another master (called under its mutex). */
static void on_master_change(void *arg) {
  rm_compensator_t *k = arg;
  pthread_mutex_lock(&k->mu);
  k->fo_active = true;
  k->fo_passes = k->fo_ok = 0;
  k->fo_due = UINT64_MAX;
  k->kick = k->kick_reconcile = true;
  pthread_cond_signal(&k->wake);
  pthread_mutex_unlock(&k->mu);
}

static uint64_t min3(uint64_t a, uint64_t b, uint64_t c) {
  uint64_t m = a < b ? a : b;
  return m < c ? m : c;
}

static void *compensator_main(void *arg) {
  rm_compensator_t *k = arg;
  uint64_t next = rm__mono_ms();
  uint64_t next_rec = k->pf && k->reconcile_ms ? next : UINT64_MAX;
  uint64_t next_probe = k->pf ? next + MASTER_PROBE_MS : UINT64_MAX;
  pthread_mutex_lock(&k->mu);
  while (!k->stop) {
    uint64_t now = rm__mono_ms();
    if (now >= next_probe) {
      /* Outside the mutex: a probe may take a connect timeout, and a
       * change it finds calls on_master_change. */
      pthread_mutex_unlock(&k->mu);
      rm__pf_master_probe(&k->pf->pool);
      pthread_mutex_lock(&k->mu);
      now = rm__mono_ms();
      next_probe = now + MASTER_PROBE_MS;
      continue;
    }
    if (now >= k->fo_due) {
      k->fo_due = UINT64_MAX;
      k->kick = k->kick_reconcile = true;
    }
    bool due = k->kick || now >= next;
    bool rec = k->pf && (k->kick_reconcile || now >= next_rec);
    if (!due && !rec) {
      struct timespec ts;
      deadline_ts(min3(next < next_rec ? next : next_rec, next_probe, k->fo_due), &ts);
      pthread_cond_timedwait(&k->wake, &k->mu, &ts);
      continue;
    }
    k->kick = k->kick_reconcile = false;
    k->started++;
    pthread_mutex_unlock(&k->mu);

    rm_comp_options_t o = k->run;
    o.reconcile = rec;
    rm_comp_report_t rep;
    int rc = rm_compensate_run(k->orders, k->stock, k->pf, &o, &rep);

    pthread_mutex_lock(&k->mu);
    k->finished++;
    k->last = rep;
    k->st.last_code = rc;
    if (rc == RM_COMP_E_LOCKED) k->st.locked++;
    else if (rc != 0) k->st.errors++;
    else k->st.passes++;
    k->st.frozen += rep.frozen;
    k->st.cancelled += rep.cancelled;
    k->st.failed += rep.failed;
    k->st.reconciled += rep.activities;
    k->st.fixed += (uint64_t)rep.fixed.meta + rep.fixed.buckets + rep.fixed.users + rep.fixed.orders +
                   rep.fixed.deadlines;
    now = rm__mono_ms();
    next = now + k->interval_ms;
    /* A reconciliation that could not run (locked, failed) is due again
     * with the next pass rather than in a full period, not at once: a
     * database that is down must not make the job spin. */
    if (rec) next_rec = rc == 0 ? now + k->reconcile_ms : next;
    if (rec && k->fo_active) {
      bool ok = rc == 0 && !rep.reconcile_failed;
      unsigned fixed = rep.fixed.meta + rep.fixed.buckets + rep.fixed.users + rep.fixed.orders + rep.fixed.deadlines;
      k->fo_passes++;
      if (ok) k->fo_ok++;
      if (ok && k->fo_ok >= 2 && fixed == 0) {
        k->fo_active = false; /* Redis equals PostgreSQL again */
        k->fo_due = UINT64_MAX;
      } else if (k->fo_passes >= FAILOVER_MAX_PASSES) {
        k->fo_active = false;
        k->fo_due = UINT64_MAX;
        COMP_LOG(&k->pf->log, RM_LOG_WARN, "reconciliation after a Redis master change: still not quiet after %u passes; "
                   "the periodic reconciliation takes over", k->fo_passes);
      } else {
        /* Redis may still hold more stock than exists: soon, not in a period. */
        k->fo_due = now + (ok ? FAILOVER_AGAIN_MS : FAILOVER_RETRY_MS);
      }
    }
    pthread_cond_broadcast(&k->done);
  }
  pthread_mutex_unlock(&k->mu);
  return NULL;
}

static void compensator_free(rm_compensator_t *k) {
  free(k->orders);
  free(k->stock);
  free(k);
}

int rm_compensator_start(const rm_compensator_options_t *o, rm_compensator_t **out) {
  if (out) *out = NULL;
  if (!o || !out || !o->orders_conninfo || !o->stock_conninfo || o->run.log_level < 0 ||
      o->run.log_level > RM_LOG_DEBUG || o->run.activity_id < 0)
    return RM_E_INVALID;
  rm_compensator_t *k = calloc(1, sizeof(*k));
  if (!k) return RM_E_NOMEM;
  k->orders = strdup(o->orders_conninfo);
  k->stock = strdup(o->stock_conninfo);
  if (!k->orders || !k->stock) {
    compensator_free(k);
    return RM_E_NOMEM;
  }
  k->pf = o->pf;
  k->interval_ms = o->interval_ms ? o->interval_ms : DEFAULT_INTERVAL_MS;
  k->reconcile_ms = o->reconcile_interval_ms ? o->reconcile_interval_ms : DEFAULT_RECONCILE_MS;
  k->run = o->run;
  k->fo_due = UINT64_MAX;

  if (pthread_mutex_init(&k->mu, NULL) != 0) goto fail_memory;
  if (txc_cond_init_monotonic(&k->wake) != 0) goto fail_mutex;
  if (txc_cond_init_monotonic(&k->done) != 0) goto fail_wake;

  /* The application's asynchronous signals stay with its own threads. */
  sigset_t all, old;
  sigfillset(&all);
  static const int sync_signals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGABRT, SIGSYS};
  for (size_t i = 0; i < sizeof(sync_signals) / sizeof(sync_signals[0]); i++) sigdelset(&all, sync_signals[i]);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int rc = pthread_create(&k->thread, NULL, compensator_main, k);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (rc != 0) goto fail_done;
  if (k->pf) rm__pf_pool_set_hook(&k->pf->pool, on_master_change, k);
  *out = k;
  return 0;

fail_done:
  pthread_cond_destroy(&k->done);
fail_wake:
  pthread_cond_destroy(&k->wake);
fail_mutex:
  pthread_mutex_destroy(&k->mu);
fail_memory:
  compensator_free(k);
  return RM_E_NOMEM;
}

void rm_compensator_kick(rm_compensator_t *k, bool reconcile) {
  if (!k) return;
  pthread_mutex_lock(&k->mu);
  k->kick = true;
  if (reconcile) k->kick_reconcile = true;
  pthread_cond_signal(&k->wake);
  pthread_mutex_unlock(&k->mu);
}

int rm_compensator_run_now(rm_compensator_t *k, bool reconcile, unsigned timeout_ms, rm_comp_report_t *report) {
  if (report) memset(report, 0, sizeof(*report));
  if (!k) return RM_E_INVALID;
  struct timespec ts;
  deadline_ts(rm__mono_ms() + timeout_ms, &ts);
  pthread_mutex_lock(&k->mu);
  /* Passes end in the order they start: the one after those started so
   * far is ours. */
  uint64_t want = k->started + 1;
  k->kick = true;
  if (reconcile) k->kick_reconcile = true;
  pthread_cond_signal(&k->wake);
  int rc = 0;
  while (k->finished < want && !k->stop) {
    if (pthread_cond_timedwait(&k->done, &k->mu, &ts) != 0 && k->finished < want) {
      rc = RM_E_DEADLINE;
      break;
    }
  }
  if (rc == 0) {
    if (k->finished < want) rc = RM_E_CONN_LOST; /* stopped */
    else {
      rc = k->st.last_code;
      if (report) *report = k->last;
    }
  }
  pthread_mutex_unlock(&k->mu);
  return rc;
}

void rm_compensator_stop(rm_compensator_t *k) {
  if (!k) return;
  if (k->pf) rm__pf_pool_set_hook(&k->pf->pool, NULL, NULL);
  pthread_mutex_lock(&k->mu);
  k->stop = true;
  pthread_cond_broadcast(&k->wake);
  pthread_cond_broadcast(&k->done);
  pthread_mutex_unlock(&k->mu);
  pthread_join(k->thread, NULL);
  pthread_cond_destroy(&k->done);
  pthread_cond_destroy(&k->wake);
  pthread_mutex_destroy(&k->mu);
  compensator_free(k);
}

void rm_compensator_stats(rm_compensator_t *k, rm_compensator_stats_t *out) {
  if (!out) return;
  memset(out, 0, sizeof(*out));
  if (!k) return;
  pthread_mutex_lock(&k->mu);
  *out = k->st;
  pthread_mutex_unlock(&k->mu);
}
