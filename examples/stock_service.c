/*
 * stock_service.c - stock-service of the flash-sale demo: the second
 * branch of every purchase, on the stock database.
 *
 * NOTES
 *   HTTP API (JSON bodies; examples/openapi/stock-service.yaml describes
 *   each route, `--routes` lists them from routes[]; errors are RFC 9457
 *   problems, svc_problem.h; every call that moves stock carries
 *   order-service's signature and the global transaction id in the
 *   X-Txc-Xid header, and runs as one AT branch of that transaction):
 *
 *     POST /freeze  {order_id, activity, ticket_type, bucket, qty, user,
 *                    deadline_ms}
 *          frozen_count += qty on the bucket row, guarded by
 *          stock - frozen_count - sold_count >= qty (delta mode: the undo
 *          is frozen_count -= qty, which commutes with the other freezes,
 *          so concurrent freezes of one bucket take no global row lock),
 *          and the freeze's stock_freeze row (FROZEN, its deadline: what
 *          the prefilter's reconciliation and expiry sweep read)
 *          200 {bucket, branch_id} | 409 {error: sold_out | over_limit |
 *          not_on_sale} (not_on_sale: outside the sale window, the
 *          stock_freeze insert trigger of sql/stock/006)
 *     POST /confirm {order_id}  stock_freeze FROZEN -> CONFIRMED,
 *          frozen_count -= qty, sold_count += qty
 *     POST /release {order_id, reason: cancel|expire}  stock_freeze
 *          FROZEN -> RELEASED, frozen_count -= qty
 *          In delta modes the bucket's counters of both move only when
 *          the global transaction commits (rm_at_update_delta_on_commit):
 *          a release gives tickets back, and given back at its local
 *          commit they could be bought by others before the global
 *          decision, after which a rollback could not take them back
 *          (issue 17).  So until the commit the tickets stay frozen, the
 *          commit applies the release (or the frozen -> sold move) in one
 *          UPDATE, and a rollback has nothing to undo there.  The
 *          stock_freeze row changes at once, under its global lock (AT
 *          images), so no other confirm or release of the order can run
 *          meanwhile.
 *
 *   Every path that returns stock, and why none can be refused later:
 *     - cancel and expiry (POST /release in a global transaction) and
 *       payment (POST /confirm, a move frozen -> sold): the bucket moves at
 *       the commit, as above; a rollback finds nothing to undo there;
 *     - the waitlist hand-over (order-service) places new orders after a
 *       cancel or an expiry committed: freezes, which take;
 *     - the expiry backstop (rm_prefilter_expire with PostgreSQL) and the
 *       fallback-to-local mode (rm_local_*, the compensation job) return
 *       stock in local transactions of their own, outside any global
 *       transaction: nothing ever rolls them back (in local mode the stock
 *       database decides each order once, FROZEN or REFUSED, and a refusal
 *       gives back only the Redis freeze);
 *     - STOCK_FREEZE_MODE=at: the bucket row is under its global lock
 *       until the global transaction ends, so nobody can take what a
 *       release gives back before the decision.
 *          Both: 200 | 200 {noop: true} when already done the same way |
 *          409 {error: confirmed|released} when done the other way | 404
 *          {error: unknown_order}.  The row is locked (SELECT ... FOR
 *          UPDATE) in the local transaction before the change, so a
 *          confirm and a release of one order cannot both win.
 *     POST /tickets {activity, ticket_type, qty, key, operator?}  more
 *          tickets in one local transaction (stock_add, sql/stock/007),
 *          once per key: handle_tickets
 *     GET  /activities/{id}  the activity as PostgreSQL has it (name,
 *          status, window, stock by ticket type): handle_activity; 404
 *          unknown_activity (what order-service asks when Redis has not
 *          loaded an activity)
 *     GET  /healthz  200 {ok, tc_nodes_up, mode}
 *     POST /admin/mode {mode: local|global|auto}  this client's forced mode
 *          (svc_admin.h; stock-service follows each call's own mode)
 *
 *   Each operation also inserts its stock_log row (UNIQUE (order_id, op))
 *   in the same branch, so an operation happens at most once per order
 *   (a repeat answers 409 {error: duplicate}) and a rolled-back global
 *   transaction takes its rows away with its counter change.
 *
 *   Errors: 400 bad request, 404 no such bucket, 409 as above or
 *   global_not_active (the global transaction was already decided), 503
 *   when the branch could not be done (coordinator, lock wait or database
 *   trouble): the caller rolls the global transaction back.
 *
 *   Settings (environment, as printed by cluster/local/up): STOCK_PG_URL,
 *   TC_NODES, TC_SECRETS_DIR (or TC_SECRET_FILE: the secret of application
 *   "stock-service"; the legacy TC_TOKEN still works); STOCK_LISTEN
 *   (host:port, default 127.0.0.1:0 = any
 *   free port), STOCK_THREADS (default 8 per CPU: each holds a connection
 *   of the pool; svc_pg_pool_default), STOCK_RESOURCE_ID
 *   (default "stock"), STOCK_SLOW_MS (1000: a slower operation logs the time
 *   of each phase, at info level), STOCK_LOG_LEVEL; for the benchmarks:
 *   STOCK_FREEZE_MODE (deferred, the default: delta mode with the UPDATE
 *   deferred to rm_at_prepare; delta: the UPDATE at once; at: plain AT row
 *   images and a global lock on the bucket row; tcc and xa: the freeze as a
 *   TCC or an XA branch, stock_modes.h, the confirm and release as in
 *   deferred) and STOCK_LOCAL_MODE=1 (calls without
 *   an xid run as plain local transactions: the "no coordinator" baseline;
 *   never in production, nothing would undo them); STOCK_WINDOW_INTERVAL_MS
 *   (1000; 0: off): the sale-window job (stock_window.h), which opens and
 *   closes each activity's sale at its starts_at and ends_at in PostgreSQL
 *   and Redis, one instance at a time.  --listen and --url-file FILE (the
 *   service writes its URL there once it serves: how scripts find a port
 *   chosen by the kernel) override them.  SIGTERM/SIGINT: stop accepting,
 *   finish the requests in progress, close, exit 0.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "svc_admin.h"
#include "svc_common.h"
#include "txc_isotime.h"
#include "svc_consumer.h"
#include "svc_http.h"
#include "txc_buf.h"
#include "svc_idem.h"
#include "svc_prefilter.h"
#include "svc_redis.h"
#include "stock_modes.h"
#include "stock_window.h"

#define FREEZE_GUARD "stock - frozen_count - sold_count >= $1"

typedef struct stock_svc {
  rm_client_t *rm;
  svc_pgpool_t *pool;
  const char *resource;
  int mode;        /* freeze_mode_t: STOCK_FREEZE_MODE */
  bool at_sql;     /* TXC_AT_WRITES=sql: the branch writes plain SQL (rm_at_sql), else the structured calls */
  int64_t slow_us; /* STOCK_SLOW_MS: log the phases of slower operations */
  bool local_mode; /* STOCK_LOCAL_MODE: serve requests without an xid */
  svc_pf_t *pf;              /* Redis follows the events applied here */
  svc_consumer_t *consumer;  /* group "stock" of the order events */
  svc_auth_t *auth;          /* order-service's signature on every call; NULL: calls unchecked */
  stock_window_t *window;    /* the sale-window job (stock_window.h); NULL: off */
  svc_admin_t *admin;        /* POST /admin/mode (svc_admin.h) */
  _Atomic unsigned long long unauthenticated; /* calls refused: no valid signature */
  const char *redis_url;     /* for the waitlists' lengths on /metrics */
  pthread_mutex_t metrics_mu; /* metrics_redis: one scrape at a time */
  redisContext *metrics_redis;
} stock_svc_t;

typedef enum { OP_FREEZE, OP_CONFIRM, OP_RELEASE } stock_opkind_t;
static const char *const op_names[] = {"freeze", "confirm", "release"};

typedef struct stock_op {
  stock_opkind_t kind;
  long long order_id, activity, ticket_type, bucket, qty;
  long long user, deadline_ms; /* freeze */
  char reason[16];             /* release: "cancel" or "expire" */
} stock_op_t;

/* Validate the body of /freeze, /confirm and /release into 'op'.  Confirm
 * and release need only order_id: the freeze's row (stock_freeze) says
 * where its tickets are. */
static bool parse_op_or_reply(const svc_req_t *req, svc_resp_t *resp, stock_op_t *op) {
  json_error_t je;
  json_t *o = json_loadb(req->body, req->body_len, JSON_REJECT_DUPLICATES, &je);
  if (!json_is_object(o)) {
    svc_resp_error(resp, 400, "bad_json", o ? "the body must be a JSON object" : je.text);
    json_decref(o);
    return false;
  }
  const char *bad = NULL;
  if (!svc_json_int(o, "order_id", 1, INT64_MAX, &op->order_id)) {
    bad = "order_id must be a positive integer";
  } else if (op->kind == OP_FREEZE) {
    if (!svc_json_int(o, "activity", 1, INT64_MAX, &op->activity))
      bad = "activity must be a positive integer";
    else if (!svc_json_int(o, "ticket_type", 0, INT32_MAX, &op->ticket_type))
      bad = "ticket_type must be an integer >= 0";
    else if (!svc_json_int(o, "bucket", 0, INT32_MAX, &op->bucket))
      bad = "bucket must be an integer >= 0";
    else if (!svc_json_int(o, "qty", 1, 10000, &op->qty))
      bad = "qty must be an integer from 1 to 10000";
    else if (!svc_json_int(o, "user", 1, INT64_MAX, &op->user))
      bad = "user must be a positive integer";
    else if (!svc_json_int(o, "deadline_ms", 1, INT64_MAX / 2, &op->deadline_ms))
      bad = "deadline_ms must be a positive integer (unix milliseconds)";
  } else if (op->kind == OP_RELEASE) {
    const char *r = json_string_value(json_object_get(o, "reason"));
    if (json_object_get(o, "reason") && (!r || (strcmp(r, "cancel") != 0 && strcmp(r, "expire") != 0)))
      bad = "reason must be \"cancel\" or \"expire\"";
    else
      snprintf(op->reason, sizeof(op->reason), "%s", r ? r : "cancel");
  }
  json_decref(o);
  if (bad) {
    svc_resp_error(resp, 400, "bad_request", bad);
    return false;
  }
  return true;
}

/* For confirm and release: lock the order's stock_freeze row in the local
 * transaction and read where its tickets are.  Returns 0 (FROZEN: 'op'
 * completed from the row), 1 (already finished the same way: nothing to
 * do), or an HTTP status with the reason word in '*reason'. */
static int lock_freeze_row(PGconn *pg, stock_op_t *op, const char **reason, char *err, size_t errlen) {
  char so[24];
  snprintf(so, sizeof(so), "%lld", op->order_id);
  const char *p[1] = {so};
  PGresult *r = NULL;
  if (!svc_pg_exec(pg,
                   "SELECT state, activity_id, ticket_type, bucket_id, qty FROM stock_freeze"
                   " WHERE order_id = $1 FOR UPDATE",
                   1, p, PGRES_TUPLES_OK, &r, err, errlen)) {
    *reason = "unavailable";
    return 503;
  }
  if (PQntuples(r) != 1) {
    PQclear(r);
    *reason = "unknown_order";
    snprintf(err, errlen, "no freeze of order %lld", op->order_id);
    return 404;
  }
  const char *state = PQgetvalue(r, 0, 0);
  op->activity = atoll(PQgetvalue(r, 0, 1));
  op->ticket_type = atoll(PQgetvalue(r, 0, 2));
  op->bucket = atoll(PQgetvalue(r, 0, 3));
  op->qty = atoll(PQgetvalue(r, 0, 4));
  int rc = 0;
  if (strcmp(state, "FROZEN") != 0) {
    bool same = strcmp(state, op->kind == OP_CONFIRM ? "CONFIRMED" : "RELEASED") == 0;
    rc = same ? 1 : 409;
    *reason = strcmp(state, "CONFIRMED") == 0 ? "confirmed" : "released";
    snprintf(err, errlen, "the freeze of order %lld is %s", op->order_id, state);
  }
  PQclear(r);
  return rc;
}

/* ------------------------------------------------------- statements */

/*
 * The statements run through one of four paths:
 *   deferred (default) AT branch, bucket counters by
 *          rm_at_update_delta_deferred: as delta, but the UPDATE runs in
 *          rm_at_prepare after the registration, so the bucket row is
 *          locked only for UPDATE + undo insert + COMMIT;
 *   delta  AT branch, bucket counters by rm_at_update_delta: the undo
 *          subtracts, concurrent branches on one bucket take no global row
 *          lock (the UPDATE runs at once: the row stays locked through
 *          the registration round trip);
 *   at     AT branch, bucket row by rm_at_update with before/after images
 *          and a global lock on the bucket row until the global
 *          transaction ends (Seata's plain AT, for the hot-row benchmark);
 *   local  no branch (no xid, STOCK_LOCAL_MODE=1): plain SQL in a local
 *          transaction, the "no coordinator" baseline of the benchmarks.
 * 'b' is NULL on the local path.
 */
typedef enum { MODE_DEFERRED, MODE_DELTA, MODE_AT, MODE_TCC, MODE_XA } freeze_mode_t;
static const char *const mode_names[] = {"deferred", "delta", "at", "tcc", "xa"};

typedef struct stmt_ctx {
  stock_svc_t *s;
  rm_branch_t *b; /* NULL: local */
  PGconn *pg;
  char *err;
  size_t errlen;
} stmt_ctx_t;

static int local_exec(stmt_ctx_t *c, const char *sql, int n, const char *const *params, int *rows) {
  PGresult *r = PQexecParams(c->pg, sql, n, NULL, params, NULL, NULL, 0);
  ExecStatusType st = PQresultStatus(r);
  if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
    snprintf(c->err, c->errlen, "%s", PQresultErrorMessage(r));
    PQclear(r);
    return RM_E_DB;
  }
  if (rows) *rows = atoi(PQcmdTuples(r));
  PQclear(r);
  return 0;
}

/* Run 'sql' in the statement's branch as plain SQL (rm_at_sql; 'locked':
 * under the global locks of the rows it writes), or as a local statement
 * without a branch. */
static int stmt_exec(stmt_ctx_t *c, const char *sql, int n, const char *const *params, bool locked, int *rows) {
  if (!c->b) return local_exec(c, sql, n, params, rows);
  int64_t done = 0;
  int rc = locked ? rm_at_sql(c->b, sql, n, NULL, params, &done, NULL)
                  : rm_at_sql_unlocked(c->b, sql, n, NULL, params, &done, NULL);
  if (rows) *rows = (int)done;
  return rc;
}

/* INSERT one row of 'table' (a constant of this file).  'locked': under
 * a global lock on its key until the global transaction ends; a row no
 * other global transaction writes needs none (rm_at_insert_unlocked). */
static int row_insert(stmt_ctx_t *c, const char *table, bool locked, int n, const char *const *cols,
                      const char *const *vals) {
  if (c->b && !c->s->at_sql) {
    return locked ? rm_at_insert(c->b, table, n, cols, vals) : rm_at_insert_unlocked(c->b, table, n, cols, vals);
  }
  char sql[512];
  int off = snprintf(sql, sizeof(sql), "INSERT INTO %s (", table);
  for (int i = 0; i < n; i++) off += snprintf(sql + off, sizeof(sql) - (size_t)off, "%s%s", i ? ", " : "", cols[i]);
  off += snprintf(sql + off, sizeof(sql) - (size_t)off, ") VALUES (");
  for (int i = 0; i < n; i++) off += snprintf(sql + off, sizeof(sql) - (size_t)off, "%s$%d", i ? ", " : "", i + 1);
  snprintf(sql + off, sizeof(sql) - (size_t)off, ")");
  return stmt_exec(c, sql, n, vals, locked, NULL);
}

/* UPDATE the stock_freeze row of 'order_id' (locked by the caller). */
static int freeze_row_update(stmt_ctx_t *c, const char *order_id, int n, const char *const *cols,
                             const char *const *vals) {
  const char *pk[1] = {order_id};
  if (c->b && !c->s->at_sql) return rm_at_update(c->b, "stock_freeze", pk, n, cols, vals);
  char sql[512];
  const char *params[8];
  int off = snprintf(sql, sizeof(sql), "UPDATE stock_freeze SET ");
  for (int i = 0; i < n && i < 7; i++) {
    off += snprintf(sql + off, sizeof(sql) - (size_t)off, "%s%s = $%d", i ? ", " : "", cols[i], i + 1);
    params[i] = vals[i];
  }
  snprintf(sql + off, sizeof(sql) - (size_t)off, " WHERE order_id = $%d", n + 1);
  params[n] = order_id;
  int rows = 0;
  int rc = stmt_exec(c, sql, n + 1, params, true, &rows);
  if (rc == 0 && rows != 1) {
    snprintf(c->err, c->errlen, "no freeze row for order %s", order_id);
    rc = RM_E_NOT_ONE_ROW;
  }
  return rc;
}

/* Move the bucket's counters: frozen_count += dfrozen, sold_count +=
 * dsold, refusing (RM_E_GUARD) a freeze beyond the stock or an unfreeze
 * below zero. */
static int bucket_change(stmt_ctx_t *c, freeze_mode_t mode, const stock_op_t *op, long long dfrozen,
                         long long dsold) {
  char sa[24], st[24], sb[24];
  snprintf(sa, sizeof(sa), "%lld", op->activity);
  snprintf(st, sizeof(st), "%lld", op->ticket_type);
  snprintf(sb, sizeof(sb), "%lld", op->bucket);
  const char *pk[3] = {sa, st, sb};
  /* Without a branch, or in AT mode as plain SQL: one guarded UPDATE (in
   * a branch its before image is read under the row lock, and the global
   * lock of the row is taken, as rm_at_update's). */
  if (!c->b || (c->s->mode == MODE_AT && c->s->at_sql)) {
    char df[24], ds[24];
    snprintf(df, sizeof(df), "%lld", dfrozen);
    snprintf(ds, sizeof(ds), "%lld", dsold);
    const char *p[5] = {sa, st, sb, df, ds};
    int rows = 0;
    int rc = stmt_exec(c,
                       "UPDATE activity_ticket_bucket SET frozen_count = frozen_count + $4::int,"
                       " sold_count = sold_count + $5::int"
                       " WHERE activity_id = $1 AND ticket_type = $2 AND bucket_id = $3"
                       " AND stock - frozen_count - sold_count >= $4::int + $5::int AND frozen_count + $4::int >= 0",
                       5, p, true, &rows);
    if (rc == 0 && rows != 1) {
      snprintf(c->err, c->errlen, "bucket %lld has not the tickets (or is not frozen)", op->bucket);
      rc = RM_E_GUARD;
    }
    return rc;
  }
  if ((mode == MODE_DELTA || mode == MODE_DEFERRED) && dfrozen < 0) {
    /* A release or a confirm: applied by the commit, in one UPDATE (the
     * header says why).  The commit of a move keeps the row's CHECK:
     * frozen + sold does not change. */
    int rc = rm_at_update_delta_on_commit(c->b, "activity_ticket_bucket", pk, "frozen_count", dfrozen);
    if (rc == 0 && dsold) rc = rm_at_update_delta_on_commit(c->b, "activity_ticket_bucket", pk, "sold_count", dsold);
    return rc;
  }
  if (mode == MODE_DEFERRED && c->s->at_sql && dfrozen > 0 && dsold == 0) {
    /* A freeze as the SQL the service would write: frozen_count is a
     * declared hot counter, so this is the same deferred delta, guard and
     * all, run in rm_at_prepare. */
    char df[24];
    snprintf(df, sizeof(df), "%lld", dfrozen);
    const char *p[4] = {sa, st, sb, df};
    return stmt_exec(c,
                     "UPDATE activity_ticket_bucket SET frozen_count = frozen_count + $4::int"
                     " WHERE activity_id = $1 AND ticket_type = $2 AND bucket_id = $3"
                     " AND stock - frozen_count - sold_count >= $4::int",
                     4, p, true, NULL);
  }
  if (mode == MODE_DELTA || mode == MODE_DEFERRED) {
    /* A freeze: taken now, under its guard (deferred: in rm_at_prepare,
     * after the registration). */
    int (*fn)(rm_branch_t *, const char *, const char *const *, const char *, long long, const char *) =
      mode == MODE_DEFERRED ? rm_at_update_delta_deferred : rm_at_update_delta;
    int rc = 0;
    if (dfrozen) rc = fn(c->b, "activity_ticket_bucket", pk, "frozen_count", dfrozen, FREEZE_GUARD);
    if (rc == 0 && dsold) rc = fn(c->b, "activity_ticket_bucket", pk, "sold_count", dsold, NULL);
    return rc;
  }
  /* MODE_AT: read under the local row lock, check, write the new values */
  PGresult *r = PQexecParams(c->pg,
                             "SELECT stock, frozen_count, sold_count FROM activity_ticket_bucket"
                             " WHERE activity_id = $1 AND ticket_type = $2 AND bucket_id = $3 FOR UPDATE",
                             3, NULL, pk, NULL, NULL, 0);
  if (PQresultStatus(r) != PGRES_TUPLES_OK) {
    snprintf(c->err, c->errlen, "%s", PQresultErrorMessage(r));
    PQclear(r);
    return RM_E_DB;
  }
  if (PQntuples(r) != 1) {
    PQclear(r);
    return RM_E_NOT_ONE_ROW;
  }
  long long stock = atoll(PQgetvalue(r, 0, 0)), frozen = atoll(PQgetvalue(r, 0, 1)) + dfrozen,
            sold = atoll(PQgetvalue(r, 0, 2)) + dsold;
  PQclear(r);
  if (frozen < 0 || frozen + sold > stock) return RM_E_GUARD;
  char nf[24], ns[24];
  snprintf(nf, sizeof(nf), "%lld", frozen);
  snprintf(ns, sizeof(ns), "%lld", sold);
  static const char *const cols[2] = {"frozen_count", "sold_count"};
  const char *vals[2] = {nf, ns};
  return rm_at_update(c->b, "activity_ticket_bucket", pk, 2, cols, vals);
}

/* The bucket change of an operation. */
static int op_bucket(stmt_ctx_t *c, freeze_mode_t mode, const stock_op_t *op) {
  switch (op->kind) {
  case OP_FREEZE: return bucket_change(c, mode, op, op->qty, 0);
  case OP_CONFIRM: return bucket_change(c, mode, op, -op->qty, op->qty);
  default: return bucket_change(c, mode, op, -op->qty, 0);
  }
}

/*
 * The statements of one operation.  In delta mode (and locally) the
 * bucket row comes last: its row lock (taken by the UPDATE) is held until
 * the local COMMIT, and rm_at_prepare's round trip to the coordinator
 * comes before that COMMIT; every statement placed before the UPDATE is
 * time the hot row is not held.  In AT mode the row is read FOR UPDATE for
 * its before image and held from there anyway, so there the bucket row
 * comes first: a missing bucket or a refusal is found before any other
 * statement ran.  (stock_freeze has no foreign key to the bucket: its check
 * locked the hot row KEY SHARE on every insert, sql/stock/004.)
 */
static int op_statements(stmt_ctx_t *c, freeze_mode_t mode, const stock_op_t *op, const char *xid) {
  bool bucket_first = c->b && mode == MODE_AT;
  if (bucket_first) {
    int rc = op_bucket(c, mode, op);
    if (rc != 0) return rc;
  }
  char sa[24], st[24], sb[24], so[24], sq[24], su[24], dl[48];
  snprintf(sa, sizeof(sa), "%lld", op->activity);
  snprintf(st, sizeof(st), "%lld", op->ticket_type);
  snprintf(sb, sizeof(sb), "%lld", op->bucket);
  snprintf(so, sizeof(so), "%lld", op->order_id);
  snprintf(sq, sizeof(sq), "%lld", op->qty);
  snprintf(su, sizeof(su), "%lld", op->user);
  int rc;
  switch (op->kind) {
  case OP_FREEZE: {
    /* the deadline as an exact UTC timestamp */
    txc_iso_time(dl, op->deadline_ms);
    static const char *const fcols[] = {"order_id", "activity_id", "ticket_type", "bucket_id", "user_id", "qty",
                                        "deadline"};
    const char *fvals[] = {so, sa, st, sb, su, sq, dl};
    /* No global lock on the new freeze, as on the new order: what changes
     * it later (payment, cancellation, expiry) are local transactions of
     * the order events, which a global lock does not hold back anyway; a
     * global /confirm or /release, which no service sends since those
     * became events, would wait on the lock only if it came before the
     * freeze's own decision, and without it the checked rollback of that
     * freeze refuses the changed row (RollbackFailed, nothing overwritten).
     * The lock cost the coordinator a lock row per order (about 500 bytes
     * of WAL with its two index entries, bench/README.md). */
    rc = row_insert(c, "stock_freeze", false, 7, fcols, fvals);
    break;
  }
  case OP_CONFIRM: {
    static const char *const ucols[] = {"state", "finished_at"};
    const char *uvals[] = {"CONFIRMED", "now"};
    rc = freeze_row_update(c, so, 2, ucols, uvals);
    break;
  }
  default: {
    static const char *const ucols[] = {"state", "release_reason", "finished_at"};
    const char *uvals[] = {"RELEASED", op->reason, "now"};
    rc = freeze_row_update(c, so, 3, ucols, uvals);
    break;
  }
  }
  if (rc != 0) return rc;
  static const char *const cols[] = {"activity_id", "ticket_type", "bucket_id", "order_id", "op", "qty", "xid"};
  const char *vals[] = {sa, st, sb, so, op_names[op->kind], sq, xid};
  rc = row_insert(c, "stock_log", false, 7, cols, vals);
  if (rc != 0 || bucket_first) return rc;
  return op_bucket(c, mode, op);
}

/* ------------------------------------------------- order events */

/*
 * The consumer group "stock" of the order events (svc_consumer.h): a
 * payment confirms the order's freeze (frozen -> sold), a cancellation or
 * an expiry releases it, in a plain local transaction of the stock
 * database (no global transaction: the order's state already changed for
 * good in the orders database, so nothing can roll this back).  The
 * events of one read go together: one stock_freeze_finish_many
 * (sql/stock/008) locks their stock_freeze rows, moves them, and updates
 * each bucket once with the summed quantities, last, so the hot bucket
 * rows are held for the commit only, as with one event.  A freeze found
 * done before the same way is nothing to do; done the other way it is a
 * contradiction (dead letter, for an operator).  Redis follows after the
 * commit.
 */
/* paid, cancelled, expired: the events that end an order's freeze (not
 * order.rejected, whose order never froze in PostgreSQL, nor waitlist.*) */
static bool is_order_end(const svc_event_t *ev) {
  return strcmp(ev->type, "order.paid") == 0 || strcmp(ev->type, "order.cancelled") == 0 ||
         strcmp(ev->type, "order.expired") == 0;
}

/* What stock_freeze_finish_many's code 'rc' for 'ev' means for the event. */
static svc_ev_result_t finish_verdict(const svc_event_t *ev, int rc, char *why, size_t whylen) {
  bool confirm = strcmp(ev->type, "order.paid") == 0;
  switch (rc) {
  case 0: return SVC_EV_DONE;
  case -6: /* confirmed before */
  case -7: /* released before */
    if ((rc == -6) == confirm) return SVC_EV_DONE; /* done before, the same way */
    snprintf(why, whylen, "the freeze of order %lld was %s before, but the order is %s (settle by hand)",
             ev->order_id, rc == -6 ? "confirmed" : "released", confirm ? "paid" : "no longer to be sold");
    return SVC_EV_DEAD;
  default:
    /* no freeze (yet): a local-mode order whose stock side is undecided */
    snprintf(why, whylen, "no stock freeze for order %lld", ev->order_id);
    return SVC_EV_RETRY;
  }
}

/* The 'n' events (one, or a batch in stream order) inside the open
 * transaction.  One event gets its own verdict; a batch is DONE only when
 * every event is, else the consumer rolls it back and goes one by one. */
static svc_ev_result_t stock_events_apply(PGconn *pg, const svc_event_t *const *evs, size_t n, void *arg, char *why,
                                          size_t whylen) {
  (void)arg;
  txc_buf_t ids = {0}, reasons = {0};
  size_t nend = 0;
  txc_buf_printf(&ids, "{");
  txc_buf_printf(&reasons, "{");
  for (size_t i = 0; i < n; i++) {
    if (!is_order_end(evs[i])) continue; /* waitlist.*: notices for the buyer, nothing for the stock */
    const char *t = evs[i]->type;
    txc_buf_printf(&ids, "%s%lld", nend ? "," : "", evs[i]->order_id);
    txc_buf_printf(&reasons, "%s%s", nend ? "," : "",
                   strcmp(t, "order.paid") == 0 ? "NULL" : strcmp(t, "order.cancelled") == 0 ? "cancel" : "expire");
    nend++;
  }
  txc_buf_printf(&ids, "}");
  txc_buf_printf(&reasons, "}");
  svc_ev_result_t res = SVC_EV_DONE;
  PGresult *r = NULL;
  const char *p[2] = {ids.p, reasons.p};
  /* an append that ran out of memory is missing: the SQL refuses the
   * arrays, or the count of rows below tells */
  if (nend > 0 && (!ids.p || !reasons.p)) {
    snprintf(why, whylen, "out of memory");
    res = SVC_EV_RETRY;
  } else if (nend > 0 &&
             !svc_pg_exec(pg, "SELECT result FROM stock_freeze_finish_many($1::bigint[], $2::text[])", 2, p,
                          PGRES_TUPLES_OK, &r, why, whylen)) {
    res = SVC_EV_RETRY;
  } else if (nend > 0 && PQntuples(r) != (int)nend) {
    snprintf(why, whylen, "stock_freeze_finish_many answered %d rows for %zu orders", PQntuples(r), nend);
    res = SVC_EV_RETRY;
  }
  for (size_t i = 0, row = 0; res == SVC_EV_DONE && i < n; i++)
    if (is_order_end(evs[i])) res = finish_verdict(evs[i], atoi(PQgetvalue(r, (int)row++, 0)), why, whylen);
  PQclear(r);
  free(ids.p);
  free(reasons.p);
  return res;
}

static svc_ev_result_t stock_event_apply(PGconn *pg, const svc_event_t *ev, void *arg, char *why, size_t whylen) {
  return stock_events_apply(pg, &ev, 1, arg, why, whylen);
}

/* After the commit (or for a repeat): Redis follows, idempotently. */
static void stock_event_after(const svc_event_t *ev, void *arg) {
  stock_svc_t *s = arg;
  if (!is_order_end(ev)) return;
  long long activity = 0, tt = 0;
  svc_json_int(ev->payload, "activity", 1, INT64_MAX, &activity);
  svc_json_int(ev->payload, "ticket_type", 0, INT32_MAX, &tt);
  if (!s->pf || activity <= 0) return;
  char err[256];
  pf_result_t pr = strcmp(ev->type, "order.paid") == 0
                     ? svc_pf_confirm(s->pf, activity, tt, ev->order_id, err, sizeof(err))
                     : svc_pf_release(s->pf, activity, tt, ev->order_id, err, sizeof(err));
  if (pr != PF_OK && pr != PF_DONE_BEFORE)
    SVC_LOG(SVC_LOG_WARN, json_pack("{s:I,s:s}", "order_id", (json_int_t)ev->order_id, "event", ev->type),
            "could not update Redis after an order event: %s (reconciliation will)", err);
}

/* ---------------------------------------------------------- warm-up */

/*
 * svc_pg_warm_fn: one freeze rehearsed on 'pg' before the service serves,
 * through the statements a request runs in the service's mode (an AT
 * branch rehearsed, rm_at_open_rehearsal: nothing goes to the
 * coordinator; TCC, XA and the local path: their plain SQL), on an
 * activity and a bucket that its own transaction creates (activity -1,
 * which no sale uses; order and user ids no request can have), then
 * rolled back: nothing is left, and no other transaction waits on its
 * rows.  The backend has then read the catalogs, planned the statements
 * and compiled stock_freeze's PL/pgSQL triggers that the first freeze
 * of a sale would (bench/README, twenty-fifth session).
 */
static bool warm_connection(PGconn *pg, void *arg, char *err, size_t errlen) {
  stock_svc_t *s = arg;
  stmt_ctx_t c = {.s = s, .pg = pg, .err = err, .errlen = errlen};
  stock_op_t op = {.kind = OP_FREEZE, .order_id = INT64_MAX, .activity = -1, .ticket_type = 1, .bucket = 0,
                   .qty = 1, .user = INT64_MAX, .deadline_ms = svc_now_us() / 1000 + 60000};
  bool branch = s->rm && s->mode != MODE_TCC && s->mode != MODE_XA;
  int rc = 0;
  bool ok = svc_pg_exec(pg, "BEGIN", 0, NULL, PGRES_COMMAND_OK, NULL, err, errlen) &&
            svc_pg_exec(pg,
                        "INSERT INTO activity (activity_id, name, status, per_user_limit, starts_at, ends_at)"
                        " VALUES (-1, 'warm-up (never committed)', 1, 2, now() - interval '1 minute',"
                        " now() + interval '1 hour')",
                        0, NULL, PGRES_COMMAND_OK, NULL, err, errlen) &&
            svc_pg_exec(pg,
                        "INSERT INTO activity_ticket_bucket (activity_id, ticket_type, bucket_id, stock)"
                        " VALUES (-1, 1, 0, 1)",
                        0, NULL, PGRES_COMMAND_OK, NULL, err, errlen);
  if (ok && branch && (rc = rm_at_open_rehearsal(s->rm, s->resource, pg, &c.b)) != 0)
    snprintf(err, errlen, "%s", rm_errmsg());
  if (ok && rc == 0 && c.b && (rc = rm_at_statement_savepoints(c.b, false)) == 0 &&
      (s->mode == MODE_DELTA || s->mode == MODE_DEFERRED))
    rc = rm_at_register_early(c.b);
  freeze_mode_t mode = branch ? (freeze_mode_t)s->mode : MODE_DEFERRED;
  if (ok && rc == 0) rc = op_statements(&c, mode, &op, c.b ? RM_AT_REHEARSAL_XID : NULL);
  bool committed = false; /* stays false: a rehearsal rolls back */
  if (ok && rc == 0 && c.b) rc = rm_at_prepare_commit(c.b, NULL, &committed);
  if (c.b) {
    if (rc != 0 && *rm_at_errmsg(c.b)) snprintf(err, errlen, "%s", rm_at_errmsg(c.b));
    rm_at_close(c.b, false);
  }
  if (PQtransactionStatus(pg) != PQTRANS_IDLE) PQclear(PQexec(pg, "ROLLBACK"));
  return ok && rc == 0;
}

/* ---------------------------------------------------------- handlers */

static void handle_op(stock_svc_t *s, const svc_req_t *req, svc_resp_t *resp, stock_opkind_t kind) {
  stock_op_t op = {.kind = kind};
  const char *xid = svc_req_header(req, SVC_XID_HEADER);
  bool local = !xid || !*xid;
  if (local && !s->local_mode) {
    svc_resp_error(resp, 400, "bad_request", "the " SVC_XID_HEADER " header must carry the global transaction id");
    return;
  }
  if (!local && strlen(xid) >= RM_XID_MAX) {
    svc_resp_error(resp, 400, "bad_request", SVC_XID_HEADER " is longer than 128 bytes");
    return;
  }
  if (local) xid = NULL;
  if (!parse_op_or_reply(req, resp, &op)) return;
  const char *xid_log = xid ? xid : "";

  char err[512] = "";
  int64_t t0 = svc_now_us();
  PGconn *pg = svc_pg_get(s->pool, 2000, err, sizeof(err));
  int64_t t_pg = svc_now_us();
  if (!pg) {
    SVC_LOG(SVC_LOG_WARN, json_pack("{s:s}", "xid", xid_log), "could not %s stock: %s", op_names[kind], err);
    svc_resp_error(resp, 503, "unavailable", err);
    return;
  }
  stmt_ctx_t c = {.s = s, .pg = pg, .err = err, .errlen = sizeof(err)};
  int64_t bid = 0;
  int rc;
  /* The freeze of a delta-mode AT branch, whose statements all go through
   * the library, begins its transaction with its first statement
   * (rm_at_open on an idle connection: one round trip less); everything
   * else begins here (AT mode reads the bucket FOR UPDATE itself first). */
  bool other_branch = !local && kind == OP_FREEZE && (s->mode == MODE_TCC || s->mode == MODE_XA);
  bool at_freeze = !local && kind == OP_FREEZE && (s->mode == MODE_DELTA || s->mode == MODE_DEFERRED);
  if (!at_freeze && !svc_pg_exec(pg, "BEGIN", 0, NULL, PGRES_COMMAND_OK, NULL, err, sizeof(err))) {
    rc = RM_E_DB;
    goto fail;
  }
  if (kind != OP_FREEZE) {
    const char *why = NULL;
    int st = lock_freeze_row(pg, &op, &why, err, sizeof(err));
    if (st != 0) {
      PQclear(PQexec(pg, "ROLLBACK"));
      svc_pg_put(s->pool, pg);
      if (st == 1) { /* done before, the same way: nothing to do */
        svc_resp_json(resp, 200, json_pack("{s:b,s:b}", "ok", 1, "noop", 1));
        return;
      }
      SVC_LOG(SVC_LOG_WARN,
              json_pack("{s:s,s:I,s:s}", "xid", xid_log, "order_id", (json_int_t)op.order_id, "reason", why),
              "could not %s stock: %s", op_names[kind], err);
      svc_resp_error(resp, st, why, err);
      return;
    }
  }
  /* The freeze as a TCC or XA branch (stock_modes.h): begun here, its
   * statements the local path's plain SQL, ended below. */
  stock_branch_kind_t bk = s->mode == MODE_XA ? STOCK_BRANCH_XA : STOCK_BRANCH_TCC;
  if (other_branch &&
      (rc = stock_modes_begin(s->rm, bk, xid, s->resource, pg, op.order_id, &bid, err, sizeof(err))) != 0)
    goto fail;
  if (!local && !other_branch && (rc = rm_at_open(s->rm, xid, s->resource, pg, &c.b)) != 0) {
    snprintf(err, sizeof(err), "%s", rm_strerror(rc));
    goto fail;
  }
  /* Every failure below rolls the whole transaction back: no statement
   * needs a savepoint of its own (two statements each saved). */
  if (c.b && (rc = rm_at_statement_savepoints(c.b, false)) != 0) {
    snprintf(err, sizeof(err), "%s", rm_at_errmsg(c.b));
    goto fail;
  }
  /* A delta-mode freeze takes no global lock (the bucket's delta needs
   * none, the new rows are written by no other global transaction): the
   * registration travels while the statements run. */
  if (c.b && at_freeze && (rc = rm_at_register_early(c.b)) != 0) {
    snprintf(err, sizeof(err), "%s", rm_at_errmsg(c.b));
    goto fail;
  }
  int64_t t_open = svc_now_us();
  /* Confirm and release stay AT branches in the TCC and XA modes, as in
   * the default one. */
  freeze_mode_t at_mode = s->mode == MODE_TCC || s->mode == MODE_XA ? MODE_DEFERRED : (freeze_mode_t)s->mode;
  if ((rc = op_statements(&c, at_mode, &op, xid)) != 0) {
    if (c.b && *rm_at_errmsg(c.b)) snprintf(err, sizeof(err), "%s: %s", rm_strerror(rc), rm_at_errmsg(c.b));
    goto fail;
  }
  int64_t t_stmts = svc_now_us();
  bool committed = false;
  if (c.b) {
    /* prepare and COMMIT in one round trip: the bucket row's lock, taken
     * by the deferred UPDATE, is held for that round trip only */
    if ((rc = rm_at_prepare_commit(c.b, &bid, &committed)) != 0) {
      snprintf(err, sizeof(err), "%s: %s", rm_strerror(rc), rm_at_errmsg(c.b));
      goto fail;
    }
  }
  int64_t t_prep = svc_now_us();
  if (other_branch) {
    committed = stock_modes_end(s->rm, bk, xid, pg, bid, err, sizeof(err));
  } else if (!c.b) {
    PGresult *r = PQexec(pg, "COMMIT");
    committed = PQresultStatus(r) == PGRES_COMMAND_OK && strcmp(PQcmdStatus(r), "COMMIT") == 0;
    if (!committed) snprintf(err, sizeof(err), "local commit failed: %s", PQresultErrorMessage(r));
    PQclear(r);
  }
  if (c.b) rm_at_close(c.b, committed);
  svc_pg_put(s->pool, pg);
  if (!committed) {
    SVC_LOG(SVC_LOG_WARN, json_pack("{s:s,s:I}", "xid", xid_log, "order_id", (json_int_t)op.order_id),
            "could not %s stock: %s", op_names[kind], err);
    svc_resp_error(resp, 503, "unavailable", err);
    return;
  }
  int64_t t_end = svc_now_us();
  if (t_end - t0 >= s->slow_us)
    SVC_LOG(SVC_LOG_INFO,
            json_pack("{s:s,s:I,s:I,s:f,s:f,s:f,s:f,s:f,s:f}", "xid", xid_log, "order_id", (json_int_t)op.order_id,
                      "bucket", (json_int_t)op.bucket, "total_ms", (double)(t_end - t0) / 1000, "pool_ms",
                      (double)(t_pg - t0) / 1000, "begin_open_ms", (double)(t_open - t_pg) / 1000, "statements_ms",
                      (double)(t_stmts - t_open) / 1000, "prepare_ms", (double)(t_prep - t_stmts) / 1000,
                      "commit_ms", (double)(t_end - t_prep) / 1000),
            "slow %s", op_names[kind]);
  SVC_LOG(SVC_LOG_DEBUG,
          json_pack("{s:s,s:I,s:I,s:I}", "xid", xid_log, "order_id", (json_int_t)op.order_id, "bucket",
                    (json_int_t)op.bucket, "branch_id", (json_int_t)bid),
          "%s done", op_names[kind]);
  svc_resp_json(resp, 200, json_pack("{s:b,s:I,s:I}", "ok", 1, "bucket", (json_int_t)op.bucket, "branch_id",
                                     (json_int_t)bid));
  return;

fail:
  if (PQtransactionStatus(pg) != PQTRANS_IDLE) PQclear(PQexec(pg, "ROLLBACK"));
  if (c.b) rm_at_close(c.b, false);
  svc_pg_put(s->pool, pg);
  int status = 503;
  const char *reason = "unavailable";
  switch (rc) {
  case RM_E_GUARD:
    status = 409;
    reason = kind == OP_FREEZE ? "sold_out" : "not_frozen";
    break;
  case RM_E_NOT_ONE_ROW:
    status = 404;
    reason = "no_bucket";
    break;
  case RM_E_GLOBAL_NOT_ACTIVE:
  case RM_E_GLOBAL_NOT_FOUND:
  case RM_E_TIMED_OUT:
  case RM_E_FENCE: /* rolled back before the try or the XA start */
    status = 409;
    reason = "global_not_active";
    break;
  case RM_E_INVALID:
    status = 400;
    reason = "bad_request";
    break;
  case RM_E_DB:
    if (strstr(err, "stock_log_order_op_key") || strstr(err, "stock_freeze_pkey")) {
      status = 409;
      reason = "duplicate";
    }
    break;
  default:
    break;
  }
  if (status == 503 && kind == OP_FREEZE && strstr(err, "over_limit: ")) {
    /* stock_freeze's insert trigger (sql/stock/005): the user's limit,
     * PostgreSQL's word whatever Redis let through */
    status = 409;
    reason = "over_limit";
  }
  if (status == 503 && kind == OP_FREEZE && strstr(err, "not_on_sale: ")) {
    /* the sale window, stock_freeze's other insert trigger (sql/stock/006) */
    status = 409;
    reason = "not_on_sale";
  }
  SVC_LOG(status == 409 && (rc == RM_E_GUARD || strcmp(reason, "over_limit") == 0 ||
                            strcmp(reason, "not_on_sale") == 0) ? SVC_LOG_DEBUG : SVC_LOG_WARN,
          json_pack("{s:s,s:I,s:I,s:s}", "xid", xid_log, "order_id", (json_int_t)op.order_id, "bucket",
                    (json_int_t)op.bucket, "reason", reason),
          "could not %s stock: %s", op_names[kind], err);
  svc_resp_error(resp, status, reason, err);
}

/*
 * POST /freeze with X-Txc-Local: 1 and no xid: a local-mode order's stock
 * side (order-service has no coordinator), rm_local_stock_freeze on an
 * idle pooled connection: 200 frozen (now or before) | 409 {error:
 * sold_out | over_limit | invalid | mismatch} (refusals are recorded: the
 * order will be cancelled) | 400 | 503 (nothing decided).
 */
static void handle_local_freeze(stock_svc_t *s, const svc_req_t *req, svc_resp_t *resp) {
  stock_op_t op = {.kind = OP_FREEZE};
  if (!parse_op_or_reply(req, resp, &op)) return;
  char err[512] = "";
  PGconn *pg = svc_pg_get(s->pool, 2000, err, sizeof(err));
  if (!pg) {
    svc_resp_error(resp, 503, "unavailable", err);
    return;
  }
  rm_local_order_t lo = {.order_id = op.order_id, .activity_id = op.activity, .ticket_type = (int32_t)op.ticket_type,
                         .bucket = (int32_t)op.bucket, .user_id = op.user, .qty = (int32_t)op.qty,
                         .expire_ms = 0, .deadline_ms = op.deadline_ms};
  int rc = rm_local_stock_freeze(s->rm, pg, &lo);
  if (rc < 0) snprintf(err, sizeof(err), "%s: %s", rm_prefilter_strerror(rc), rm_local_errmsg());
  svc_pg_put(s->pool, pg);
  int status = 503;
  const char *reason = "unavailable";
  switch (rc) {
  case 0:
  case 1:
    svc_resp_json(resp, 200, json_pack("{s:b,s:I,s:b}", "ok", 1, "bucket", (json_int_t)op.bucket, "before", rc == 1));
    return;
  case RM_PF_SOLD_OUT: status = 409; reason = "sold_out"; break;
  case RM_PF_OVER_LIMIT: status = 409; reason = "over_limit"; break;
  case RM_PF_BAD_ARGS: status = 409; reason = "invalid"; break;
  case RM_PF_NOT_ON_SALE: status = 409; reason = "not_on_sale"; break;
  case RM_LOCAL_E_MISMATCH: status = 409; reason = "mismatch"; break;
  case RM_E_INVALID: status = 400; reason = "bad_request"; break;
  default: break;
  }
  SVC_LOG(status == 409 && rc != RM_LOCAL_E_MISMATCH ? SVC_LOG_DEBUG : SVC_LOG_WARN,
          json_pack("{s:I,s:I,s:s,s:s}", "order_id", (json_int_t)op.order_id, "bucket", (json_int_t)op.bucket,
                    "reason", reason, "mode", "local"),
          "local freeze: %s", err);
  svc_resp_error(resp, status, reason, err);
}

/* Whether 'activity' is in the stock database; false with 'err' set when
 * it could not be read. */
static bool activity_exists(stock_svc_t *s, long long activity, char *err, size_t errlen) {
  char sa[24];
  snprintf(sa, sizeof(sa), "%lld", activity);
  const char *p[1] = {sa};
  PGresult *r = NULL;
  err[0] = '\0';
  bool found = svc_pg_query(s->pool, 2000, "SELECT 1 FROM activity WHERE activity_id = $1", 1, p, PGRES_TUPLES_OK,
                            &r, err, errlen) &&
               PQntuples(r) == 1;
  PQclear(r);
  return found;
}

/*
 * POST /tickets {activity, ticket_type, qty, key, operator?}: more tickets
 * of a ticket type (order-service's POST /activities/{id}/tickets, signed
 * with the services' key), in one local transaction, stock_add of
 * sql/stock/007: spread over the buckets, once per key.  200 {result:
 * "added" | "done_before", buckets: [{bucket, stock}]} (the stocks after
 * it, for the prefilter's raise) | 409 {error: key_reused | sale_ended |
 * at_mode} | 404 {error: no_buckets | unknown_activity} | 400 | 503.  Not in AT image mode:
 * a global rollback there puts a bucket's before image back, stock
 * included, and would take the addition away (issue 17's rule: what was
 * given cannot be taken back by an image).
 */
static void handle_tickets(stock_svc_t *s, const svc_req_t *req, svc_resp_t *resp) {
  json_error_t je;
  json_t *in = json_loadb(req->body, req->body_len, JSON_REJECT_DUPLICATES, &je);
  svc_tickets_t t;
  const char *bad = in ? svc_tickets_parse(in, true, &t) : je.text;
  if (bad) {
    svc_resp_error(resp, 400, "bad_request", bad);
    json_decref(in);
    return;
  }
  long long activity = t.activity, tt = t.ticket_type, qty = t.qty;
  const char *key = t.key, *op = t.op;
  if (s->mode == MODE_AT) {
    json_decref(in);
    svc_resp_error(resp, 409, "at_mode",
                   "stock additions need STOCK_FREEZE_MODE deferred or delta: in image mode a rollback would put "
                   "a bucket's old stock back");
    return;
  }
  char sa[24], st[24], sq[24], err[512] = "";
  snprintf(sa, sizeof(sa), "%lld", activity);
  snprintf(st, sizeof(st), "%lld", tt);
  snprintf(sq, sizeof(sq), "%lld", qty);
  const char *p[5] = {sa, st, sq, key, op};
  PGresult *r = NULL;
  PGconn *pg = svc_pg_get(s->pool, 2000, err, sizeof(err));
  bool ok = pg && svc_pg_exec(pg, "SELECT result, bucket_id, stock FROM stock_add($1, $2, $3, $4, $5)", 5, p,
                              PGRES_TUPLES_OK, &r, err, sizeof(err));
  if (pg) svc_pg_put(s->pool, pg);
  if (!ok || PQntuples(r) < 1) {
    if (r) PQclear(r);
    SVC_LOG(SVC_LOG_WARN, json_pack("{s:I,s:s}", "activity", (json_int_t)activity, "key", key),
            "could not add tickets: %s", ok ? "no answer from stock_add" : err);
    json_decref(in);
    svc_resp_error(resp, 503, "unavailable", err);
    return;
  }
  int code = atoi(PQgetvalue(r, 0, 0));
  if (code < 0) {
    PQclear(r);
    json_decref(in);
    if (code == -4 && !activity_exists(s, activity, err, sizeof(err)) && !err[0])
      svc_resp_error(resp, 404, "unknown_activity", "there is no such activity");
    else if (code == -3)
      svc_resp_error(resp, 404, "no_buckets", "the activity has no buckets of this ticket type");
    else
      svc_resp_error(resp, 409, code == -2 ? "key_reused" : "sale_ended",
                     code == -2 ? "this key named an addition of another ticket type or quantity"
                                : "no such activity, or its sale has ended");
    return;
  }
  json_t *buckets = json_array();
  for (int i = 0; i < PQntuples(r); i++)
    json_array_append_new(buckets, json_pack("{s:i,s:I}", "bucket", atoi(PQgetvalue(r, i, 1)), "stock",
                                             (json_int_t)atoll(PQgetvalue(r, i, 2))));
  PQclear(r);
  SVC_LOG(code == 0 ? SVC_LOG_INFO : SVC_LOG_DEBUG,
          json_pack("{s:I,s:I,s:I,s:s,s:s}", "activity", (json_int_t)activity, "ticket_type", (json_int_t)tt, "qty",
                    (json_int_t)qty, "key", key, "operator", op ? op : ""),
          code == 0 ? "tickets added" : "tickets added before under this key");
  svc_resp_json(resp, 200, json_pack("{s:s,s:I,s:I,s:I,s:o}", "result", code == 0 ? "added" : "done_before",
                                     "activity", (json_int_t)activity, "ticket_type", (json_int_t)tt, "qty",
                                     (json_int_t)qty, "buckets", buckets));
  json_decref(in);
}

/*
 * GET /activities/{id}: the activity as PostgreSQL has it (the truth; what
 * order-service asks when Redis has not loaded an activity, to tell an
 * unknown one, 404, from one to load, 503): 200 {activity, name, status
 * (not_started | on_sale | ended), per_user_limit, starts_at, ends_at,
 * ticket_types: [{ticket_type, buckets, stock, frozen, sold, available}]}
 * | 404 unknown_activity | 503.  Read only, one snapshot.
 */
static void handle_activity(stock_svc_t *s, long long activity, svc_resp_t *resp) {
  static const char *const status_names[] = {"not_started", "on_sale", "ended"};
  char sa[24], err[512] = "";
  snprintf(sa, sizeof(sa), "%lld", activity);
  const char *p[1] = {sa};
  PGresult *r = NULL;
  if (!svc_pg_query(s->pool, 2000,
                    "SELECT a.name, a.status, a.per_user_limit, (extract(epoch FROM a.starts_at) * 1000)::bigint,"
                    " (extract(epoch FROM a.ends_at) * 1000)::bigint, b.ticket_type, count(b.bucket_id),"
                    " sum(b.stock), sum(b.frozen_count), sum(b.sold_count)"
                    " FROM activity a LEFT JOIN activity_ticket_bucket b ON b.activity_id = a.activity_id"
                    " WHERE a.activity_id = $1 GROUP BY 1, 2, 3, 4, 5, 6 ORDER BY 6 LIMIT 1000",
                    1, p, PGRES_TUPLES_OK, &r, err, sizeof(err))) {
    svc_resp_error(resp, 503, "unavailable", err);
    return;
  }
  if (PQntuples(r) == 0) {
    PQclear(r);
    snprintf(err, sizeof(err), "there is no activity %lld", activity);
    svc_resp_error(resp, 404, "unknown_activity", err);
    return;
  }
  int st = atoi(PQgetvalue(r, 0, 1));
  char starts[TXC_ISO_TIME_MAX], ends[TXC_ISO_TIME_MAX];
  txc_iso_time(starts, atoll(PQgetvalue(r, 0, 3)));
  txc_iso_time(ends, atoll(PQgetvalue(r, 0, 4)));
  json_t *types = json_array();
  for (int i = 0; i < PQntuples(r); i++) {
    if (PQgetisnull(r, i, 5)) continue; /* no buckets at all */
    long long stock = atoll(PQgetvalue(r, i, 7)), frozen = atoll(PQgetvalue(r, i, 8)),
              sold = atoll(PQgetvalue(r, i, 9));
    json_array_append_new(types, json_pack("{s:I,s:I,s:I,s:I,s:I,s:I}", "ticket_type",
                                           (json_int_t)atoll(PQgetvalue(r, i, 5)), "buckets",
                                           (json_int_t)atoll(PQgetvalue(r, i, 6)), "stock", (json_int_t)stock,
                                           "frozen", (json_int_t)frozen, "sold", (json_int_t)sold, "available",
                                           (json_int_t)(stock - frozen - sold)));
  }
  svc_resp_json(resp, 200,
                json_pack("{s:I,s:s,s:s,s:I,s:s,s:s,s:o}", "activity", (json_int_t)activity, "name",
                          PQgetvalue(r, 0, 0), "status", st >= 0 && st <= 2 ? status_names[st] : "ended",
                          "per_user_limit", (json_int_t)atoll(PQgetvalue(r, 0, 2)), "starts_at", starts, "ends_at",
                          ends, "ticket_types", types));
  PQclear(r);
}

/*
 * Per-activity gauges for /metrics, read when scraped (on an HTTP worker,
 * never on a loop): txc_activity_tickets{activity, ticket_type, state =
 * stock | frozen | sold | available} from PostgreSQL (the truth), and
 * txc_activity_waitlist{activity, ticket_type} from Redis (ZCARD of the
 * waitlist), for the activities not ended or ended in the last 10 minutes
 * (at most 200 rows).  A store that does not answer leaves the families
 * empty; the page still answers.
 */
static void activity_metrics(stock_svc_t *s, txc_buf_t *b) {
  txc_buf_printf(b, "# HELP txc_activity_tickets Tickets of an activity's ticket type by state, in PostgreSQL.\n"
                    "# TYPE txc_activity_tickets gauge\n");
  char err[256];
  PGresult *r = NULL;
  bool ok = svc_pg_query(s->pool, 1000,
                         "SELECT b.activity_id, b.ticket_type, sum(b.stock), sum(b.frozen_count),"
                         " sum(b.sold_count) FROM activity_ticket_bucket b"
                         " JOIN activity a ON a.activity_id = b.activity_id"
                         " WHERE a.status < 2 OR a.ends_at > now() - interval '10 minutes'"
                         " GROUP BY 1, 2 ORDER BY 1, 2 LIMIT 200",
                         0, NULL, PGRES_TUPLES_OK, &r, err, sizeof(err));
  int n = ok ? PQntuples(r) : 0;
  for (int i = 0; i < n; i++) {
    const char *a = PQgetvalue(r, i, 0), *t = PQgetvalue(r, i, 1);
    long long st = atoll(PQgetvalue(r, i, 2)), fr = atoll(PQgetvalue(r, i, 3)), so = atoll(PQgetvalue(r, i, 4));
    const struct {
      const char *state;
      long long v;
    } v[] = {{"stock", st}, {"frozen", fr}, {"sold", so}, {"available", st - fr - so}};
    for (size_t k = 0; k < sizeof(v) / sizeof(v[0]); k++)
      txc_buf_printf(b, "txc_activity_tickets{activity=\"%s\",ticket_type=\"%s\",state=\"%s\"} %lld\n", a, t,
                     v[k].state, v[k].v);
  }
  txc_buf_printf(b, "# HELP txc_activity_waitlist Users waiting for tickets of an activity's ticket type (Redis).\n"
                    "# TYPE txc_activity_waitlist gauge\n");
  pthread_mutex_lock(&s->metrics_mu);
  if (n && s->redis_url && svc_redis_ensure(&s->metrics_redis, s->redis_url, 1000, err, sizeof(err)) != 0) {
    for (int i = 0; i < n; i++) {
      const char *a = PQgetvalue(r, i, 0), *t = PQgetvalue(r, i, 1);
      redisReply *z = svc_redis_cmd(s->metrics_redis, err, sizeof(err), "ZCARD {act_%s}:t%s:wl", a, t);
      if (!z) break;
      if (z->type == REDIS_REPLY_INTEGER)
        txc_buf_printf(b, "txc_activity_waitlist{activity=\"%s\",ticket_type=\"%s\"} %lld\n", a, t, z->integer);
      freeReplyObject(z);
    }
  }
  pthread_mutex_unlock(&s->metrics_mu);
  if (r) PQclear(r);
}

/* GET /metrics: local-mode freezes (rm_client_local_stats) and HTTP answers by
 * status, in Prometheus text format. */
static void handle_stock_metrics(stock_svc_t *s, svc_resp_t *resp) {
  txc_buf_t b = {0};
  rm_local_stats_t ls = {0};
  rm_client_local_stats(s->rm, &ls);
  txc_buf_printf(&b,
                 "# HELP txc_client_local_freezes_total Local-mode stock freezes decided here.\n"
                 "# TYPE txc_client_local_freezes_total counter\n"
                 "txc_client_local_freezes_total{result=\"frozen\"} %llu\n"
                 "txc_client_local_freezes_total{result=\"refused\"} %llu\n",
                 (unsigned long long)ls.frozen, (unsigned long long)ls.refused);
  txc_buf_printf(&b,
                 "# HELP txc_client_unauthenticated_calls_total Calls refused: no valid order-service signature.\n"
                 "# TYPE txc_client_unauthenticated_calls_total counter\n"
                 "txc_client_unauthenticated_calls_total %llu\n",
                 (unsigned long long)s->unauthenticated);
  if (s->consumer) svc_consumer_metrics(&s->consumer, 1, &b);
  stock_window_metrics(s->window, &b);
  svc_pf_metrics(s->pf, &b);
  activity_metrics(s, &b);
  svc_admin_metrics(s->admin, &b, true);
  svc_resp_metrics(resp, &b);
}

/* A local-mode order's freeze: X-Txc-Local: 1 and no xid. */
static bool is_local_freeze(const svc_req_t *req) {
  const char *l = svc_req_header(req, "X-Txc-Local");
  const char *xid = svc_req_header(req, SVC_XID_HEADER);
  return l && strcmp(l, "1") == 0 && (!xid || !*xid);
}

/* The routes of stock-service (svc_http.h): examples/openapi/stock-service.yaml
 * describes each; `stock-service --routes` prints them for its check.  The
 * POST routes move stock: only order-service, with its signature. */
enum { OP_FREEZE_R, OP_CONFIRM_R, OP_RELEASE_R, OP_TICKETS, OP_ACTIVITY, OP_HEALTHZ, OP_METRICS, OP_ADMIN };
static const svc_route_t routes[] = {
  {"POST", "/freeze", OP_FREEZE_R},
  {"POST", "/confirm", OP_CONFIRM_R},
  {"POST", "/release", OP_RELEASE_R},
  {"POST", "/tickets", OP_TICKETS},
  {"GET", "/activities/{id}", OP_ACTIVITY},
  {"GET", "/healthz", OP_HEALTHZ},
  {"GET", "/metrics", OP_METRICS},
  {"GET", "/admin/mode", OP_ADMIN},
  {"POST", "/admin/mode", OP_ADMIN},
};
#define NROUTES (sizeof(routes) / sizeof(routes[0]))

static void handler(const svc_req_t *req, svc_resp_t *resp, void *arg) {
  stock_svc_t *s = arg;
  int op;
  long long id;
  if (!svc_route_or_reply(routes, NROUTES, req, resp, &op, &id)) return;
  bool moves_stock = op == OP_FREEZE_R || op == OP_CONFIRM_R || op == OP_RELEASE_R || op == OP_TICKETS;
  if (moves_stock && s->auth && !svc_http_verify(s->auth, req)) {
    /* only order-service, with the services' key, may move stock: a
     * forged freeze (X-Txc-Local included) or confirm changes nothing */
    s->unauthenticated++;
    SVC_LOG(SVC_LOG_DEBUG, json_pack("{s:s}", "path", req->path), "refused an unsigned or badly signed call");
    svc_resp_error(resp, 401, "unauthenticated",
                   "the call must carry order-service's " SVC_AUTH_HEADER " (the services' key)");
    return;
  }
  switch (op) {
  case OP_FREEZE_R:
    if (is_local_freeze(req))
      handle_local_freeze(s, req, resp);
    else
      handle_op(s, req, resp, OP_FREEZE);
    break;
  case OP_CONFIRM_R: handle_op(s, req, resp, OP_CONFIRM); break;
  case OP_RELEASE_R: handle_op(s, req, resp, OP_RELEASE); break;
  case OP_TICKETS: handle_tickets(s, req, resp); break;
  case OP_ACTIVITY: handle_activity(s, id, resp); break;
  case OP_METRICS: handle_stock_metrics(s, resp); break;
  case OP_HEALTHZ:
    svc_resp_json(resp, 200, json_pack("{s:b,s:i,s:s}", "ok", 1, "tc_nodes_up", rm_client_nodes_up(s->rm), "mode",
                                       rm_mode_name(rm_client_mode(s->rm))));
    break;
  default: svc_admin_handle(s->admin, req, resp); break; /* the runtime mode switch */
  }
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: stock-service [--listen HOST:PORT] [--url-file FILE] | --routes\n"
          "\n"
          "The stock branch of the flash-sale demo (see examples/stock_service.c).\n"
          "Environment: STOCK_PG_URL, TC_NODES, TC_SECRETS_DIR or TC_SECRET_FILE (from cluster/local/up),\n"
          "STOCK_LISTEN, STOCK_THREADS, STOCK_RESOURCE_ID, STOCK_FREEZE_MODE (deferred|delta|at|tcc|xa),\n"
          "STOCK_LOCAL_MODE (1: serve calls without an xid, no coordinator), STOCK_LOG_LEVEL,\n"
          "REDIS_URL (the order events), STOCK_CONSUMER_GROUP, CONSUMER_MAX_DELIVERIES, CONSUMER_BACKOFF_MS,\n"
          "STOCK_WINDOW_INTERVAL_MS (the sale-window job, 1000; 0: off).\n"
          "--routes prints the routes it serves (METHOD PATH), as examples/openapi/stock-service.yaml describes them.\n");
}

int main(int argc, char **argv) {
  svc_main_t m;
  int early = svc_main_start(&m, "stock-service", "STOCK", argc, argv, routes, NROUTES, usage);
  if (early >= 0) return early;
  bool ok = true;
  /* each handler thread holds a connection of the pool for its request */
  int threads = (int)svc_env_int("STOCK_THREADS", svc_pg_pool_default(), 1, 1024, &ok);
  const char *pg_url = svc_env_str("STOCK_PG_URL", NULL);
  stock_svc_t s = {.resource = svc_env_str("STOCK_RESOURCE_ID", "stock"),
                   .local_mode = svc_env_int("STOCK_LOCAL_MODE", 0, 0, 1, &ok) == 1};
  s.slow_us = svc_env_int("STOCK_SLOW_MS", 1000, 0, 3600000, &ok) * 1000;
  s.at_sql = svc_at_writes_sql(&ok);
  const char *mode = svc_env_str("STOCK_FREEZE_MODE", "deferred");
  if (strcmp(mode, "deferred") == 0) {
    s.mode = MODE_DEFERRED;
  } else if (strcmp(mode, "delta") == 0) {
    s.mode = MODE_DELTA;
  } else if (strcmp(mode, "at") == 0) {
    s.mode = MODE_AT;
  } else if (strcmp(mode, "tcc") == 0) {
    s.mode = MODE_TCC;
  } else if (strcmp(mode, "xa") == 0) {
    s.mode = MODE_XA;
  } else {
    svc_error("invalid value \"%s\" for STOCK_FREEZE_MODE: expected deferred, delta, at, tcc or xa", mode);
    ok = false;
  }
  if (!pg_url) {
    svc_error("STOCK_PG_URL is not set (it is printed by cluster/local/up)");
    ok = false;
  }
  if (!ok) return 78;

  svc_block_signals();
  if (!svc_http_global_init()) {
    svc_error("could not initialise libcurl");
    return 70;
  }
  int exit_code = 0;
  svc_http_t *http = NULL;
  if (svc_rm_client_new("stock-service", 5000, &s.rm) != 0) {
    exit_code = 69;
    goto out;
  }
  int rc = rm_resource_add(s.rm, s.resource, pg_url);
  /* The bucket's frozen_count is a counter of tickets taken: its plain
   * UPDATE by an amount is a delta (rm_at_hot_column), as the structured
   * rm_at_update_delta_deferred. */
  if (rc == 0 && s.at_sql) rc = rm_at_hot_column(s.rm, s.resource, "activity_ticket_bucket", "frozen_count");
  /* The freeze's TCC handlers or XA mode (stock_modes.h). */
  if (rc == 0 && (s.mode == MODE_TCC || s.mode == MODE_XA))
    rc = stock_modes_serve(s.rm, s.mode == MODE_XA ? STOCK_BRANCH_XA : STOCK_BRANCH_TCC, s.resource, pg_url);
  if (rc != 0) {
    svc_error("could not add resource \"%s\": %s: %s", s.resource, rm_strerror(rc), rm_errmsg());
    exit_code = 69;
    goto out;
  }
  /* One connection per pool thread: a request never waits for another's. */
  s.pool = svc_pgpool_new(pg_url, threads, "stock-service");
  if (!s.pool) {
    svc_error("out of memory");
    exit_code = 70;
    goto out;
  }
  char err[512];
  if (!svc_service_key(&s.auth) || !(s.admin = svc_admin_new(s.rm, s.auth))) {
    exit_code = 78;
    goto out;
  }
  const char *redis_url = svc_redis_env_url(); /* REDIS_SENTINELS + REDIS_MASTER_NAME, else REDIS_URL */
  s.redis_url = redis_url;
  pthread_mutex_init(&s.metrics_mu, NULL);
  if (redis_url) {
    /* the order events: payments confirm, cancellations and expiries
     * release, and Redis follows */
    s.pf = svc_pf_new(redis_url, 4, err, sizeof(err));
    svc_consumer_opts_t co = {.redis_url = redis_url, .pg_url = pg_url,
                              .group = svc_env_str("STOCK_CONSUMER_GROUP", "stock"),
                              .apply = stock_event_apply, .apply_batch = stock_events_apply,
                              .after = stock_event_after, .arg = &s, .auth = s.auth};
    if (!s.pf || !(s.consumer = svc_consumer_start(&co, err, sizeof(err)))) {
      svc_error("could not start the order-event consumer: %s", err);
      exit_code = 69;
      goto out;
    }
  } else {
    svc_warn("REDIS_URL is not set: no order-event consumer here (payments and cancellations will not reach the "
             "stock until one runs)");
  }
  {
    bool wok = true;
    s.window = stock_window_start(pg_url, redis_url, &wok);
    if (!wok) {
      exit_code = 78;
      goto out;
    }
  }
  svc_pgpool_prewarm(s.pool, threads, warm_connection, &s);
  http = svc_http_start(m.listen, (unsigned)svc_ncpu(), (unsigned)threads, handler, &s, err, sizeof(err));
  if (!http) {
    svc_error("%s", err);
    exit_code = 69;
    goto out;
  }
  exit_code = svc_main_serve(&m, http,
                             json_pack("{s:i,s:s,s:s,s:b}", "threads", threads, "resource", s.resource,
                                       "freeze_mode", mode_names[s.mode], "local_mode", s.local_mode));

out:
  svc_http_stop(http); /* waits for the requests in progress */
  if (s.metrics_redis) redisFree(s.metrics_redis);
  svc_consumer_stop(s.consumer);
  stock_window_stop(s.window);
  svc_pf_free(s.pf);
  svc_admin_free(s.admin);
  svc_auth_free(s.auth);
  svc_pgpool_free(s.pool);
  rm_client_free(s.rm);
  svc_http_global_cleanup();
  if (exit_code == 0) svc_info("stock-service stopped");
  return exit_code;
}
