/*
 * tc_store_read.c - the store's named reads and their SQL; see
 * tc_store_read.h.
 *
 * NOTES
 *   Each read is a small heap object (rd_t: the caller's callback and
 *   argument) that rides one tc_pg job as its argument: the job's callback
 *   (on_<read>) parses the PGresults into the rows of the header, hands
 *   them to the caller, and frees both.  Rows are arrays on the heap only
 *   where a read returns many (the rest live on the stack); strings point
 *   into the PGresults, which the job frees after its callback returns.
 *
 *   The statements are the ones the modules ran themselves before this
 *   file existed, word for word: the comments beside them say why they are
 *   shaped so (which index a bound must be able to use).  The live
 *   definitions of the functions they call (tc__may_decide,
 *   tc_admin_cas, tc_claim_retries, tc_leader_try, ...) are in
 *   sql/tc/schema.sql.
 *
 *   Thread: the loop thread only.
 */
#include "tc_store_read.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tc_pg.h"
#include "txp_lockkey.h"
#include "txp_msg.h"

/* The pool's codes pass through unchanged (tc_store_read.h). */
#define SAME_CODE(a, b) ((int)(a) == (int)(b))
_Static_assert(SAME_CODE(TC_READ_OK, TC_PG_OK) && SAME_CODE(TC_READ_ESTMT, TC_PG_ESTMT) &&
                 SAME_CODE(TC_READ_EBROKEN, TC_PG_EBROKEN) && SAME_CODE(TC_READ_ENOCONN, TC_PG_ENOCONN) &&
                 SAME_CODE(TC_READ_EFULL, TC_PG_EFULL) && SAME_CODE(TC_READ_ECLOSING, TC_PG_ECLOSING),
               "tc_store_read.h's codes must agree with tc_pg.h's");

/* A timestamp column as ISO 8601 UTC with milliseconds. */
#define TS(col) "to_char((" col ") AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')"

/* ------------------------------------------------------------ one read */

typedef struct rd {
  union {
    tc_read_status_cb status;
    tc_read_holder_cb holder;
    tc_read_owner_cb owner;
    tc_read_globals_cb globals;
    tc_read_history_cb history;
    tc_read_global_cb global;
    tc_read_locks_cb locks;
    tc_read_nodes_cb nodes;
    tc_read_counts_cb counts;
    tc_read_repair_state_cb repair_state;
    tc_read_cas_cb cas;
    tc_read_delete_cb del;
    tc_read_probe_cb probe;
    tc_read_xids_cb xids;
    tc_read_claims_cb claims;
    tc_read_count_cb count;
    tc_read_answer_cb answer;
    tc_read_held_cb held;
    tc_read_exec_cb exec;
  } cb;
  void *arg;
} rd_t;

static rd_t *rd_new(void *arg) {
  rd_t *rd = calloc(1, sizeof(*rd));
  if (rd) rd->arg = arg;
  return rd;
}

/*
 * Send 'n' statements ('sql[i]' with 'np[i]' text parameters 'vals[i]')
 * as one job whose callback 'done' gets 'rd': on the store's reader
 * connections, or on 'pool' when 'st' is NULL.  0, or a code (then 'rd'
 * is freed here and its callback never runs).
 */
static int run(tc_store_t *st, tc_pg_pool_t *pool, rd_t *rd, unsigned flags, tc_pg_job_cb done, int n,
               const char *const *sql, const int *np, const char *const *const *vals, unsigned deadline_ms) {
  tc_pg_job_t *job = tc_pg_job_new(flags, done, rd);
  bool ok = job != NULL;
  for (int i = 0; ok && i < n; i++) ok = tc_pg_job_add(job, sql[i], np[i], vals[i]) == 0;
  if (!ok) {
    tc_pg_job_free(job);
    free(rd);
    return TC_READ_ENOMEM;
  }
  int rc = st ? tc_store_read(st, job, deadline_ms) : tc_pg_submit(pool, job, deadline_ms);
  if (rc != 0) {
    tc_pg_job_free(job);
    free(rd);
  }
  return rc;
}

/* The same for one statement on the reader connections. */
static int run1(tc_store_t *st, rd_t *rd, tc_pg_job_cb done, const char *sql, int n, const char *const *vals,
                unsigned deadline_ms) {
  return run(st, NULL, rd, 0, done, 1, &sql, &n, &vals, deadline_ms);
}

/* What the callback's 'err' says (tc_store_read.h). */
static const char *err_of(const tc_pg_job_t *job, int status) {
  return status == TC_PG_ESTMT || status == TC_PG_EBROKEN ? tc_pg_job_error(job) : "";
}

/* ------------------------------------------------------------- columns */

static const char *col_s(const PGresult *r, int row, int col) {
  return PQgetisnull(r, row, col) ? NULL : PQgetvalue(r, row, col);
}

static int64_t col_i64(const PGresult *r, int row, int col) {
  return PQgetisnull(r, row, col) ? 0 : strtoll(PQgetvalue(r, row, col), NULL, 10);
}

static int col_int(const PGresult *r, int row, int col) {
  return PQgetisnull(r, row, col) ? 0 : atoi(PQgetvalue(r, row, col));
}

static double col_f(const PGresult *r, int row, int col) {
  return PQgetisnull(r, row, col) ? 0.0 : strtod(PQgetvalue(r, row, col), NULL);
}

static bool col_b(const PGresult *r, int row, int col) {
  return !PQgetisnull(r, row, col) && PQgetvalue(r, row, col)[0] == 't';
}

/* An array of 'n' rows of 'size' bytes (never a NULL for n 0). */
static void *rows_new(int n, size_t size) { return calloc((size_t)(n > 0 ? n : 1), size); }

/* Statement 0's result of a job that ended with '*status' ('*r', NULL
 * unless TC_PG_OK) and an array of as many zeroed rows of 'size' bytes as
 * it has ('*n'); out of memory: NULL, *n = 0 and *status TC_READ_ENOMEM. */
static void *rows_of(tc_pg_job_t *job, int *status, size_t size, const PGresult **r, int *n) {
  *r = NULL;
  *n = 0;
  if (*status != TC_PG_OK) return NULL;
  *r = tc_pg_job_result(job, 0);
  void *rows = rows_new(PQntuples(*r), size);
  if (!rows) {
    *status = TC_READ_ENOMEM;
    return NULL;
  }
  *n = PQntuples(*r);
  return rows;
}

/* Phase two's branch row from columns branch_id, branch_type, status,
 * resource_id, client_id, application_id, app_group from 'col' on (SQL
 * NULL: ""). */
static void branch_row(const PGresult *r, int row, int col, tc_branch_row_t *b) {
  memset(b, 0, sizeof(*b));
  b->branch_id = strtoll(PQgetvalue(r, row, col), NULL, 10);
  b->branch_type = col_int(r, row, col + 1);
  b->status = col_int(r, row, col + 2);
  snprintf(b->resource_id, sizeof(b->resource_id), "%s", PQgetvalue(r, row, col + 3));
  snprintf(b->client_id, sizeof(b->client_id), "%s", PQgetvalue(r, row, col + 4));
  snprintf(b->application_id, sizeof(b->application_id), "%s", PQgetvalue(r, row, col + 5));
  snprintf(b->app_group, sizeof(b->app_group), "%s", PQgetvalue(r, row, col + 6));
}

/* ------------------------------------------------------------ TM reads */

static void on_status(tc_pg_job_t *job, int status, void *arg) {
  rd_t *rd = arg;
  tc_read_status_t s = {0};
  if (status == TC_PG_OK) {
    const PGresult *r = tc_pg_job_result(job, 0);
    s.found = PQntuples(r) > 0;
    if (s.found) {
      s.allowed = strcmp(PQgetvalue(r, 0, 1), "t") == 0;
      s.global_status = atoi(PQgetvalue(r, 0, 0));
    }
  }
  rd->cb.status(status, err_of(job, status), status == TC_PG_OK ? &s : NULL, rd->arg);
  free(rd);
}

int tc_read_status(tc_store_t *st, const char *xid, const char *app_id, const char *group, unsigned deadline_ms,
                   tc_read_status_cb cb, void *arg) {
  rd_t *rd = rd_new(arg);
  if (!rd) return TC_READ_ENOMEM;
  rd->cb.status = cb;
  const char *v[] = {xid, app_id, group};
  return run1(st, rd, on_status,
              "SELECT status, tc__may_decide(xid, application_id, app_group, $2, $3) "
              "FROM global_table WHERE xid = $1 "
              "UNION ALL SELECT status, app_group = $3 FROM global_history WHERE xid = $1 LIMIT 1",
              3, v, deadline_ms);
}

static void on_branch_data(tc_pg_job_t *job, int status, void *arg) {
  rd_t *rd = arg;
  const PGresult *r = status == TC_PG_OK ? tc_pg_job_result(job, 0) : NULL;
  const char *data = r && PQntuples(r) > 0 ? col_s(r, 0, 0) : NULL;
  rd->cb.answer(status, err_of(job, status), data, rd->arg);
  free(rd);
}

int tc_read_branch_data(tc_store_t *st, const char *xid, int64_t branch_id, unsigned deadline_ms,
                        tc_read_answer_cb cb, void *arg) {
  rd_t *rd = rd_new(arg);
  if (!rd) return TC_READ_ENOMEM;
  rd->cb.answer = cb;
  char bid[24];
  snprintf(bid, sizeof(bid), "%" PRId64, branch_id);
  const char *v[] = {xid, bid};
  return run1(st, rd, on_branch_data,
              "SELECT application_data FROM branch_table WHERE xid = $1 AND branch_id = $2::bigint", 2, v,
              deadline_ms);
}

/* Row keys of the lock keys of 'resource' as a PostgreSQL text[] literal. */
typedef struct {
  txp_buf_t buf;
  const char *resource;
  int n;
} rowkeys_t;

static int add_rowkey(const txp_lockkey_t *k, void *arg) {
  rowkeys_t *rk = arg;
  char row[TXP_MAX_ROW_KEY_LEN + 1];
  if (txp_row_key(rk->resource, k, row, sizeof(row)) < 0) return TXP_EFIELD_TOO_LONG;
  /* Escape for the text[] literal: key parts may hold '"' or '\\'. */
  int rc = rk->n ? txp_buf_append(&rk->buf, ",\"", 2) : txp_buf_append(&rk->buf, "\"", 1);
  rk->n++;
  for (const char *p = row; *p && !rc; p++) {
    if (*p == '"' || *p == '\\') rc = txp_buf_append(&rk->buf, "\\", 1);
    if (!rc) rc = txp_buf_append(&rk->buf, p, 1);
  }
  if (!rc) rc = txp_buf_append(&rk->buf, "\"", 1);
  return rc;
}

static void on_holder(tc_pg_job_t *job, int status, void *arg) {
  rd_t *rd = arg;
  const char *holder = NULL;
  if (status == TC_PG_OK) {
    const PGresult *r = tc_pg_job_result(job, 0);
    if (PQntuples(r) > 0) holder = PQgetvalue(r, 0, 0);
  }
  rd->cb.holder(status, err_of(job, status), holder, rd->arg);
  free(rd);
}

int tc_read_lock_holder(tc_store_t *st, const char *resource_id, const char *lock_keys, size_t max_keys,
                        const char *xid, unsigned deadline_ms, tc_read_holder_cb cb, void *arg) {
  rowkeys_t rk = {.resource = resource_id};
  txp_buf_init(&rk.buf, 0);
  int rc = txp_buf_append(&rk.buf, "{", 1) == 0 ? 0 : TC_READ_ENOMEM;
  if (rc == 0) {
    int n = txp_lockkeys_each(lock_keys, max_keys, add_rowkey, &rk);
    if (n < 0) rc = n == TXP_ENOMEM ? TC_READ_ENOMEM : TC_READ_EINVAL;
  }
  if (rc == 0 && txp_buf_append(&rk.buf, "}", 1) != 0) rc = TC_READ_ENOMEM;
  if (rc != 0) {
    txp_buf_free(&rk.buf);
    return rc;
  }
  rd_t *rd = rd_new(arg);
  if (!rd) {
    txp_buf_free(&rk.buf);
    return TC_READ_ENOMEM;
  }
  rd->cb.holder = cb;
  const char *v[] = {rk.buf.data, xid ? xid : ""};
  rc = run1(st, rd, on_holder, "SELECT xid FROM lock_table WHERE row_key = ANY($1::text[]) AND xid <> $2 LIMIT 1", 2,
            v, deadline_ms);
  txp_buf_free(&rk.buf);
  return rc;
}

static void on_owner(tc_pg_job_t *job, int status, void *arg) {
  rd_t *rd = arg;
  tc_read_owner_t o = {0};
  if (status == TC_PG_OK) {
    const PGresult *r = tc_pg_job_result(job, 0);
    o.found = PQntuples(r) == 1;
    if (o.found) {
      o.global_status = atoi(PQgetvalue(r, 0, 0));
      o.application_id = PQgetvalue(r, 0, 1);
      o.app_group = PQgetvalue(r, 0, 2);
    }
  }
  rd->cb.owner(status, err_of(job, status), status == TC_PG_OK ? &o : NULL, rd->arg);
  free(rd);
}

int tc_read_branch_owner(tc_store_t *st, const char *xid, int64_t branch_id, unsigned deadline_ms,
                         tc_read_owner_cb cb, void *arg) {
  rd_t *rd = rd_new(arg);
  if (!rd) return TC_READ_ENOMEM;
  rd->cb.owner = cb;
  char branch[32];
  snprintf(branch, sizeof(branch), "%" PRId64, branch_id);
  const char *v[] = {xid, branch};
  /* A live branch, or one of an AT commit finished at its decision
   * (sql/tc/010): in the history, Committed, listed among its branches,
   * of the global's group (a branch is registered by an application of
   * it), by an application the history does not keep. */
  return run1(st, rd, on_owner,
              "SELECT g.status, coalesce(b.application_id, ''), coalesce(b.app_group, '')"
              " FROM global_table g JOIN branch_table b"
              " ON b.xid = g.xid AND b.branch_id = $2::bigint WHERE g.xid = $1"
              " UNION ALL"
              " SELECT h.status, '', coalesce(h.app_group, '') FROM global_history h"
              " WHERE h.xid = $1 AND h.status = 9"
              " AND h.branches @> pg_catalog.jsonb_build_array(pg_catalog.jsonb_build_object('branch_id', $2::bigint))"
              " LIMIT 1",
              2, v, deadline_ms);
}

/* ------------------------------------------------------------ operators */

/* Columns of a live global transaction; see global_row(). */
#define GLOBAL_COLS                                                                                     \
  "g.xid, g.transaction_id, g.status, g.application_id, g.transaction_name, g.timeout_ms, " TS(        \
    "g.begin_time") ", extract(epoch FROM clock_timestamp() - g.begin_time)::float8, " TS("g.deadline") \
    ", g.node_id, g.retry_count, " TS("g.next_retry_at") ", g.last_error, "                            \
    "(SELECT count(*) FROM branch_table b WHERE b.xid = g.xid), "                                       \
    "(SELECT count(*) FROM lock_table l WHERE l.xid = g.xid), g.deadline < clock_timestamp()"

static void global_row(const PGresult *r, int row, tc_read_global_t *g) {
  g->xid = col_s(r, row, 0);
  g->transaction_id = col_i64(r, row, 1);
  g->status = col_int(r, row, 2);
  g->application_id = col_s(r, row, 3);
  g->name = col_s(r, row, 4);
  g->timeout_ms = col_i64(r, row, 5);
  g->begin_time = col_s(r, row, 6);
  g->age_s = col_f(r, row, 7);
  g->deadline = col_s(r, row, 8);
  g->node_id = col_i64(r, row, 9);
  g->retry_count = col_i64(r, row, 10);
  g->next_retry_at = col_s(r, row, 11);
  g->last_error = col_s(r, row, 12);
  g->branches = col_i64(r, row, 13);
  g->locks = col_i64(r, row, 14);
  g->timed_out = col_b(r, row, 15);
}

#define LOCK_COLS "l.row_key, l.xid, l.branch_id, l.resource_id, l.table_name, l.pk, l.status, " TS("l.gmt_create")

static void lock_row(const PGresult *r, int row, tc_read_lock_t *l) {
  l->row_key = col_s(r, row, 0);
  l->xid = col_s(r, row, 1);
  l->branch_id = col_i64(r, row, 2);
  l->resource_id = col_s(r, row, 3);
  l->table = col_s(r, row, 4);
  l->pk = col_s(r, row, 5);
  l->status = col_int(r, row, 6);
  l->since = col_s(r, row, 7);
}

/* A status list as a PostgreSQL array literal ("{9,11}"), or NULL for none. */
static const char *status_array(const int *statuses, int n, char *buf, size_t cap, bool *too_long) {
  *too_long = false;
  if (!statuses || n <= 0) return NULL;
  size_t o = 0;
  buf[o++] = '{';
  for (int i = 0; i < n; i++) {
    if (o >= cap - 16) {
      *too_long = true;
      return NULL;
    }
    o += (size_t)snprintf(buf + o, cap - o, "%s%d", i ? "," : "", statuses[i]);
  }
  snprintf(buf + o, cap - o, "}");
  return buf;
}

static void on_globals(tc_pg_job_t *job, int status, void *arg) {
  rd_t *rd = arg;
  const PGresult *r;
  int n;
  tc_read_global_t *rows = rows_of(job, &status, sizeof(*rows), &r, &n);
  for (int i = 0; i < n; i++) global_row(r, i, &rows[i]);
  rd->cb.globals(status, err_of(job, status), rows, n, rd->arg);
  free(rows);
  free(rd);
}

int tc_read_globals(tc_store_t *st, const tc_read_globals_filter_t *f, unsigned deadline_ms, tc_read_globals_cb cb,
                    void *arg) {
  char statuses[64 * 8], age[32], limit[16];
  bool too_long;
  const char *v[4] = {status_array(f->statuses, f->nstatuses, statuses, sizeof(statuses), &too_long), NULL, NULL,
                      limit};
  if (too_long) return TC_READ_EINVAL;
  if (f->has_min_age) {
    snprintf(age, sizeof(age), "%.3f", f->min_age_s);
    v[1] = age;
  }
  v[2] = f->name;
  snprintf(limit, sizeof(limit), "%d", f->limit);
  rd_t *rd = rd_new(arg);
  if (!rd) return TC_READ_ENOMEM;
  rd->cb.globals = cb;
  return run1(st, rd, on_globals,
              "SELECT " GLOBAL_COLS " FROM global_table g "
              "WHERE ($1::smallint[] IS NULL OR g.status = ANY ($1::smallint[])) "
              "AND ($2::float8 IS NULL OR g.begin_time <= clock_timestamp() - $2::float8 * interval '1 second') "
              "AND ($3::text IS NULL OR g.transaction_name = $3) "
              "ORDER BY g.begin_time, g.xid LIMIT $4::int",
              4, v, deadline_ms);
}

static void on_history(tc_pg_job_t *job, int status, void *arg) {
  rd_t *rd = arg;
  const PGresult *r;
  int n;
  tc_read_finished_t *rows = rows_of(job, &status, sizeof(*rows), &r, &n);
  for (int i = 0; i < n; i++) {
    tc_read_finished_t *f = &rows[i];
    f->xid = col_s(r, i, 0);
    f->h.transaction_id = col_i64(r, i, 1);
    f->h.status = col_int(r, i, 2);
    f->h.application_id = col_s(r, i, 3);
    f->h.name = col_s(r, i, 4);
    f->h.begin_time = col_s(r, i, 5);
    f->h.end_time = col_s(r, i, 6);
    f->duration_s = col_f(r, i, 7);
    f->branches = col_i64(r, i, 8);
  }
  rd->cb.history(status, err_of(job, status), rows, n, rd->arg);
  free(rows);
  free(rd);
}

int tc_read_history(tc_store_t *st, const tc_read_history_filter_t *f, unsigned deadline_ms, tc_read_history_cb cb,
                    void *arg) {
  char statuses[64 * 8], since[32], until[32], limit[16];
  bool too_long;
  const char *v[6] = {f->xid, status_array(f->statuses, f->nstatuses, statuses, sizeof(statuses), &too_long), f->name,
                      NULL, NULL, limit};
  if (too_long) return TC_READ_EINVAL;
  if (f->has_since) {
    snprintf(since, sizeof(since), "%.3f", f->since_unix);
    v[3] = since;
  }
  if (f->has_until) {
    snprintf(until, sizeof(until), "%.3f", f->until_unix);
    v[4] = until;
  }
  snprintf(limit, sizeof(limit), "%d", f->limit);
  rd_t *rd = rd_new(arg);
  if (!rd) return TC_READ_ENOMEM;
  rd->cb.history = cb;
  /* The time bounds use global_history_end_time_idx; an xid is its key. */
  return run1(st, rd, on_history,
              "SELECT h.xid, h.transaction_id, h.status, h.application_id, h.transaction_name, " TS("h.begin_time")
              ", " TS("h.end_time") ", extract(epoch FROM h.end_time - h.begin_time)::float8, "
              "jsonb_array_length(h.branches) FROM global_history h "
              "WHERE ($1::text IS NULL OR h.xid = $1) "
              "AND ($2::smallint[] IS NULL OR h.status = ANY ($2::smallint[])) "
              "AND ($3::text IS NULL OR h.transaction_name = $3) "
              "AND ($4::float8 IS NULL OR h.end_time >= to_timestamp($4::float8)) "
              "AND ($5::float8 IS NULL OR h.end_time <= to_timestamp($5::float8)) "
              "ORDER BY h.end_time DESC, h.xid LIMIT $6::int",
              6, v, deadline_ms);
}

static void on_global(tc_pg_job_t *job, int status, void *arg) {
  rd_t *rd = arg;
  tc_read_global_view_t v = {0};
  tc_read_global_t g;
  tc_read_history_t h;
  tc_read_branch_t *branches = NULL;
  tc_read_lock_t *locks = NULL;
  if (status == TC_PG_OK) {
    const PGresult *gr = tc_pg_job_result(job, 0), *br = tc_pg_job_result(job, 1), *lk = tc_pg_job_result(job, 2),
                   *hr = tc_pg_job_result(job, 3);
    if (PQntuples(gr) > 0) {
      global_row(gr, 0, &g);
      v.global = &g;
    }
    if (PQntuples(hr) > 0) {
      h.transaction_id = col_i64(hr, 0, 0);
      h.status = col_int(hr, 0, 1);
      h.application_id = col_s(hr, 0, 2);
      h.name = col_s(hr, 0, 3);
      h.begin_time = col_s(hr, 0, 4);
      h.end_time = col_s(hr, 0, 5);
      h.branches_json = col_s(hr, 0, 6);
      v.history = &h;
    }
    v.nbranches = PQntuples(br);
    v.nlocks = PQntuples(lk);
    branches = rows_new(v.nbranches, sizeof(*branches));
    locks = rows_new(v.nlocks, sizeof(*locks));
    if (!branches || !locks) {
      status = TC_READ_ENOMEM;
    } else {
      for (int i = 0; i < v.nbranches; i++) {
        tc_read_branch_t *b = &branches[i];
        b->branch_id = col_i64(br, i, 0);
        b->resource_id = col_s(br, i, 1);
        b->branch_type = col_int(br, i, 2);
        b->status = col_int(br, i, 3);
        b->client_id = col_s(br, i, 4);
        b->retry_count = col_i64(br, i, 5);
        b->next_retry_at = col_s(br, i, 6);
        b->last_error = col_s(br, i, 7);
        b->lock_keys = col_s(br, i, 8);
        b->application_data = col_s(br, i, 9);
        b->created = col_s(br, i, 10);
        b->modified = col_s(br, i, 11);
      }
      for (int i = 0; i < v.nlocks; i++) lock_row(lk, i, &locks[i]);
      v.branches = branches;
      v.locks = locks;
    }
  }
  rd->cb.global(status, err_of(job, status), status == TC_PG_OK ? &v : NULL, rd->arg);
  free(branches);
  free(locks);
  free(rd);
}

int tc_read_global(tc_store_t *st, const char *xid, int max_locks, unsigned deadline_ms, tc_read_global_cb cb,
                   void *arg) {
  rd_t *rd = rd_new(arg);
  if (!rd) return TC_READ_ENOMEM;
  rd->cb.global = cb;
  char lim[16];
  snprintf(lim, sizeof(lim), "%d", max_locks);
  const char *v[] = {xid};
  const char *vl[] = {xid, lim};
  const char *sql[] = {
    "SELECT " GLOBAL_COLS " FROM global_table g WHERE g.xid = $1",
    "SELECT branch_id, resource_id, branch_type, status, client_id, retry_count, " TS("next_retry_at")
    ", last_error, lock_keys, application_data, " TS("gmt_create") ", " TS("gmt_modified")
    " FROM branch_table WHERE xid = $1 ORDER BY branch_id",
    "SELECT " LOCK_COLS " FROM lock_table l WHERE l.xid = $1 ORDER BY l.row_key LIMIT $2::int",
    "SELECT transaction_id, status, application_id, transaction_name, " TS("begin_time") ", " TS("end_time")
    ", branches::text FROM global_history WHERE xid = $1",
  };
  const int np[] = {1, 1, 2, 1};
  const char *const *vals[] = {v, v, vl, v};
  return run(st, NULL, rd, 0, on_global, 4, sql, np, vals, deadline_ms);
}

static void on_locks(tc_pg_job_t *job, int status, void *arg) {
  rd_t *rd = arg;
  const PGresult *r;
  int n;
  tc_read_lock_t *rows = rows_of(job, &status, sizeof(*rows), &r, &n);
  for (int i = 0; i < n; i++) {
    lock_row(r, i, &rows[i]);
    rows[i].orphan = PQgetisnull(r, i, 8);
    rows[i].holder_status = col_int(r, i, 8);
  }
  rd->cb.locks(status, err_of(job, status), rows, n, rd->arg);
  free(rows);
  free(rd);
}

int tc_read_locks(tc_store_t *st, const tc_read_locks_filter_t *f, unsigned deadline_ms, tc_read_locks_cb cb,
                  void *arg) {
  rd_t *rd = rd_new(arg);
  if (!rd) return TC_READ_ENOMEM;
  rd->cb.locks = cb;
  char limit[16];
  snprintf(limit, sizeof(limit), "%d", f->limit);
  const char *v[] = {f->xid, f->key, f->prefix, limit};
  return run1(st, rd, on_locks,
              "SELECT " LOCK_COLS ", g.status FROM lock_table l LEFT JOIN global_table g ON g.xid = l.xid "
              "WHERE ($1::text IS NULL OR l.xid = $1) AND ($2::text IS NULL OR l.row_key = $2) "
              "AND ($3::text IS NULL OR starts_with(l.row_key, $3)) "
              "ORDER BY l.row_key LIMIT $4::int",
              4, v, deadline_ms);
}

static void on_nodes(tc_pg_job_t *job, int status, void *arg) {
  rd_t *rd = arg;
  const PGresult *r;
  int n;
  tc_read_node_t *rows = rows_of(job, &status, sizeof(*rows), &r, &n);
  for (int i = 0; i < n; i++) {
    tc_read_node_t *o = &rows[i];
    o->node_id = col_i64(r, i, 0);
    o->address = col_s(r, i, 1);
    o->admin_socket = col_s(r, i, 2);
    o->started_at = col_s(r, i, 3);
    o->heartbeat_at = col_s(r, i, 4);
    o->heartbeat_age_s = col_f(r, i, 5);
    o->is_leader = col_b(r, i, 6);
    o->has_pid = !PQgetisnull(r, i, 7);
    o->pid = col_i64(r, i, 7);
    o->version = col_s(r, i, 8);
    o->state = col_s(r, i, 9);
  }
  rd->cb.nodes(status, err_of(job, status), rows, n, rd->arg);
  free(rows);
  free(rd);
}

int tc_read_nodes(tc_store_t *st, int stale_ms, int64_t leader_key, unsigned deadline_ms, tc_read_nodes_cb cb,
                  void *arg) {
  rd_t *rd = rd_new(arg);
  if (!rd) return TC_READ_ENOMEM;
  rd->cb.nodes = cb;
  char ss[16], sk[24];
  snprintf(ss, sizeof(ss), "%d", stale_ms);
  snprintf(sk, sizeof(sk), "%lld", (long long)leader_key);
  const char *v[2] = {ss, sk};
  /* the state as tc_nodes shows it (a live store session and a fresh
   * heartbeat: up), and the leader by its lock, not by a flag */
  return run1(st, rd, on_nodes,
              "SELECT node_id, address, admin_socket, " TS("started_at") ", " TS("heartbeat_at")
              ", heartbeat_age_ms / 1000.0, is_leader, pid, version, state "
              "FROM tc_cluster_nodes($1::int, $2::bigint) ORDER BY node_id",
              2, v, deadline_ms);
}

/* Unfinished global transactions by status: rows (status, count). */
static const char sessions_sql[] = "SELECT status, count(*) FROM global_table GROUP BY status ORDER BY status";

/* The rows of sessions_sql; NULL when out of memory. */
static tc_read_count_t *count_rows(const PGresult *r, int *n) {
  *n = PQntuples(r);
  tc_read_count_t *rows = rows_new(*n, sizeof(*rows));
  if (!rows) {
    *n = 0;
    return NULL;
  }
  for (int i = 0; i < *n; i++) {
    rows[i].status = col_int(r, i, 0);
    rows[i].count = col_i64(r, i, 1);
  }
  return rows;
}

static void on_sessions(tc_pg_job_t *job, int status, void *arg) {
  rd_t *rd = arg;
  tc_read_count_t *rows = NULL;
  int n = 0;
  if (status == TC_PG_OK && !(rows = count_rows(tc_pg_job_result(job, 0), &n))) status = TC_READ_ENOMEM;
  rd->cb.counts(status, err_of(job, status), rows, n, rd->arg);
  free(rows);
  free(rd);
}

int tc_read_sessions(tc_store_t *st, unsigned deadline_ms, tc_read_counts_cb cb, void *arg) {
  rd_t *rd = rd_new(arg);
  if (!rd) return TC_READ_ENOMEM;
  rd->cb.counts = cb;
  return run1(st, rd, on_sessions, sessions_sql, 0, NULL, deadline_ms);
}

static void on_repair_state(tc_pg_job_t *job, int status, void *arg) {
  rd_t *rd = arg;
  tc_read_repair_state_t s = {0};
  int *bs = NULL;
  if (status == TC_PG_OK) {
    const PGresult *g = tc_pg_job_result(job, 0), *br = tc_pg_job_result(job, 1), *h = tc_pg_job_result(job, 2);
    s.live = PQntuples(g) > 0;
    if (s.live) {
      s.global_status = col_int(g, 0, 0);
      s.past_deadline = col_b(g, 0, 1);
    }
    s.in_history = PQntuples(h) > 0;
    if (s.in_history) s.history_status = col_int(h, 0, 0);
    s.nbranches = PQntuples(br);
    bs = rows_new(s.nbranches, sizeof(int));
    if (!bs) status = TC_READ_ENOMEM;
    for (int i = 0; bs && i < s.nbranches; i++) bs[i] = col_int(br, i, 0);
    s.branch_status = bs;
  }
  rd->cb.repair_state(status, err_of(job, status), status == TC_PG_OK ? &s : NULL, rd->arg);
  free(bs);
  free(rd);
}

int tc_read_repair_state(tc_store_t *st, const char *xid, unsigned deadline_ms, tc_read_repair_state_cb cb,
                         void *arg) {
  rd_t *rd = rd_new(arg);
  if (!rd) return TC_READ_ENOMEM;
  rd->cb.repair_state = cb;
  const char *v[] = {xid};
  const char *sql[] = {
    "SELECT status, deadline < clock_timestamp() FROM global_table WHERE xid = $1",
    "SELECT status FROM branch_table WHERE xid = $1 ORDER BY branch_id",
    "SELECT status FROM global_history WHERE xid = $1",
  };
  const int np[] = {1, 1, 1};
  const char *const *vals[] = {v, v, v};
  return run(st, NULL, rd, 0, on_repair_state, 3, sql, np, vals, deadline_ms);
}

static void on_cas(tc_pg_job_t *job, int status, void *arg) {
  rd_t *rd = arg;
  tc_read_cas_result_t c = {.result = ""};
  tc_branch_row_t *rows = NULL;
  if (status == TC_PG_OK) {
    const PGresult *r = tc_pg_job_result(job, 0), *br = tc_pg_job_result(job, 1);
    if (PQntuples(r) > 0) {
      c.result = PQgetvalue(r, 0, 0);
      c.global_status = col_int(r, 0, 1);
      c.branch_id = col_i64(r, 0, 2);
      c.branch_status = col_int(r, 0, 3);
    }
    c.nrows = PQntuples(br);
    rows = rows_new(c.nrows, sizeof(*rows));
    if (!rows) status = TC_READ_ENOMEM;
    for (int i = 0; rows && i < c.nrows; i++) branch_row(br, i, 0, &rows[i]);
    c.rows = rows;
  }
  rd->cb.cas(status, err_of(job, status), status == TC_PG_OK ? &c : NULL, rd->arg);
  free(rows);
  free(rd);
}

int tc_read_admin_cas(tc_store_t *st, const tc_read_cas_t *in, unsigned deadline_ms, tc_read_cas_cb cb, void *arg) {
  static const char *const retry_words[] = {"lease", "now", "clear"};
  if ((unsigned)in->retry > TC_READ_RETRY_CLEAR || in->nforbid < 0 || in->nforbid > 8) return TC_READ_EINVAL;
  char from[16], to[16], lease[16], forbid[8 * 12 + 3];
  snprintf(from, sizeof(from), "%d", in->from);
  snprintf(to, sizeof(to), "%d", in->to);
  snprintf(lease, sizeof(lease), "%d", in->lease_ms);
  size_t o = (size_t)snprintf(forbid, sizeof(forbid), "{");
  for (int i = 0; i < in->nforbid; i++)
    o += (size_t)snprintf(forbid + o, sizeof(forbid) - o, "%s%d", i ? "," : "", in->forbid[i]);
  snprintf(forbid + o, sizeof(forbid) - o, "}");
  rd_t *rd = rd_new(arg);
  if (!rd) return TC_READ_ENOMEM;
  rd->cb.cas = cb;
  const char *v0[] = {in->xid, from, to, retry_words[in->retry], lease, forbid};
  const char *v1[] = {in->xid};
  const char *sql[] = {
    "SELECT result, status, branch_id, branch_status FROM tc_admin_cas($1, $2::smallint, $3::smallint, $4, "
    "$5::int, $6::smallint[])",
    "SELECT branch_id, branch_type, status, resource_id, coalesce(client_id, ''), "
    "coalesce(application_id, ''), coalesce(app_group, '') FROM branch_table WHERE xid = $1 "
    "ORDER BY branch_id",
  };
  const int np[] = {6, 1};
  const char *const *vals[] = {v0, v1};
  return run(st, NULL, rd, TC_PG_JOB_TXN, on_cas, 2, sql, np, vals, deadline_ms);
}

static void on_deleted(tc_pg_job_t *job, int status, void *arg) {
  rd_t *rd = arg;
  tc_read_delete_result_t d = {.result = ""};
  if (status == TC_PG_OK) {
    const PGresult *r = tc_pg_job_result(job, 0);
    if (PQntuples(r) > 0) {
      d.result = PQgetvalue(r, 0, 0);
      d.history_status = col_int(r, 0, 1);
      d.locks = col_i64(r, 0, 2);
      d.branches = col_i64(r, 0, 3);
    }
  }
  rd->cb.del(status, err_of(job, status), status == TC_PG_OK ? &d : NULL, rd->arg);
  free(rd);
}

int tc_read_admin_delete(tc_store_t *st, const char *xid, unsigned deadline_ms, tc_read_delete_cb cb, void *arg) {
  rd_t *rd = rd_new(arg);
  if (!rd) return TC_READ_ENOMEM;
  rd->cb.del = cb;
  const char *sql = "SELECT result, status, locks, branches FROM tc_admin_delete_leftovers($1)";
  const int np = 1;
  const char *v[] = {xid};
  const char *const *vals[] = {v};
  return run(st, NULL, rd, TC_PG_JOB_TXN, on_deleted, 1, &sql, &np, vals, deadline_ms);
}

/* -------------------------------------------------------------- metrics */

static void on_probe(tc_pg_job_t *job, int status, void *arg) {
  rd_t *rd = arg;
  tc_read_probe_t p = {0};
  tc_read_count_t *rows = NULL;
  if (status == TC_PG_OK) {
    if (!(rows = count_rows(tc_pg_job_result(job, 0), &p.nsessions))) {
      status = TC_READ_ENOMEM;
    } else {
      const PGresult *r = tc_pg_job_result(job, 1);
      p.sessions = rows;
      p.retry_depth = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
      p.retry_due = strtoll(PQgetvalue(r, 0, 1), NULL, 10);
      p.schema_versions = PQgetvalue(tc_pg_job_result(job, 2), 0, 0);
    }
  }
  rd->cb.probe(status, err_of(job, status), status == TC_PG_OK ? &p : NULL, rd->arg);
  free(rows);
  free(rd);
}

int tc_read_probe(tc_store_t *st, unsigned deadline_ms, tc_read_probe_cb cb, void *arg) {
  rd_t *rd = rd_new(arg);
  if (!rd) return TC_READ_ENOMEM;
  rd->cb.probe = cb;
  const char *sql[] = {
    sessions_sql,
    "SELECT count(*), count(*) FILTER (WHERE next_retry_at <= clock_timestamp()) "
    "FROM global_table WHERE next_retry_at IS NOT NULL",
    "SELECT coalesce(string_agg(version::text, ',' ORDER BY version), '') "
    "FROM schema_version WHERE set_name = 'tc'",
  };
  const int np[] = {0, 0, 0};
  const char *const *vals[] = {NULL, NULL, NULL};
  return run(st, NULL, rd, 0, on_probe, 3, sql, np, vals, deadline_ms);
}

/* ---------------------------------------------------- the leader's jobs */

static void on_timeouts(tc_pg_job_t *job, int status, void *arg) {
  rd_t *rd = arg;
  const char **xids = NULL;
  int n = 0;
  if (status == TC_PG_OK) {
    const PGresult *r = tc_pg_job_result(job, 0);
    n = PQntuples(r);
    xids = rows_new(n, sizeof(*xids));
    if (!xids) {
      status = TC_READ_ENOMEM;
      n = 0;
    }
    for (int i = 0; i < n; i++) xids[i] = PQgetvalue(r, i, 0);
  }
  rd->cb.xids(status, err_of(job, status), xids, n, rd->arg);
  free(xids);
  free(rd);
}

int tc_read_timeouts(tc_store_t *st, int limit, unsigned deadline_ms, tc_read_xids_cb cb, void *arg) {
  rd_t *rd = rd_new(arg);
  if (!rd) return TC_READ_ENOMEM;
  rd->cb.xids = cb;
  char lim[16];
  snprintf(lim, sizeof(lim), "%d", limit);
  const char *v[] = {lim};
  return run1(st, rd, on_timeouts,
              "SELECT xid FROM global_table WHERE status = 1 AND deadline < statement_timestamp() "
              "ORDER BY deadline LIMIT $1::int", /* stable bound: an index range scan */
              1, v, deadline_ms);
}

static void on_claimed(tc_pg_job_t *job, int status, void *arg) {
  rd_t *rd = arg;
  tc_read_claim_t *claims = NULL;
  tc_branch_row_t *rows = NULL;
  int nclaims = 0;
  if (status == TC_PG_OK) {
    /* Rows: xid, global status, then one branch per row (NULL branch_id
     * when the session has none left), ordered by xid. */
    const PGresult *r = tc_pg_job_result(job, 0);
    int n = PQntuples(r);
    claims = rows_new(n, sizeof(*claims));
    rows = rows_new(n, sizeof(*rows));
    if (!claims || !rows) {
      status = TC_READ_ENOMEM;
      n = 0;
    }
    int k = 0;
    for (int i = 0; i < n;) {
      tc_read_claim_t *c = &claims[nclaims++];
      c->xid = PQgetvalue(r, i, 0);
      c->global_status = atoi(PQgetvalue(r, i, 1));
      c->branches = &rows[k];
      int j = i;
      for (; j < n && strcmp(PQgetvalue(r, j, 0), c->xid) == 0; j++) {
        if (PQgetisnull(r, j, 2)) continue;
        branch_row(r, j, 2, &rows[k++]);
        c->nbranches++;
      }
      i = j;
    }
  }
  rd->cb.claims(status, err_of(job, status), status == TC_PG_OK ? claims : NULL, nclaims, rd->arg);
  free(claims);
  free(rows);
  free(rd);
}

int tc_read_claim_retries(tc_store_t *st, int limit, int lease_ms, unsigned deadline_ms, tc_read_claims_cb cb,
                          void *arg) {
  rd_t *rd = rd_new(arg);
  if (!rd) return TC_READ_ENOMEM;
  rd->cb.claims = cb;
  char lim[16], lease[16];
  snprintf(lim, sizeof(lim), "%d", limit);
  snprintf(lease, sizeof(lease), "%d", lease_ms);
  const char *v[] = {lim, lease};
  return run1(st, rd, on_claimed,
              "SELECT c.xid, c.status, b.branch_id, b.branch_type, b.status, b.resource_id, b.client_id, "
              "b.application_id, b.app_group "
              "FROM tc_claim_retries($1::int, $2::int) c "
              "LEFT JOIN branch_table b ON b.xid = c.xid ORDER BY c.xid, b.branch_id",
              2, v, deadline_ms);
}

static void on_orphans(tc_pg_job_t *job, int status, void *arg) {
  rd_t *rd = arg;
  int64_t n = status == TC_PG_OK ? atoi(PQgetvalue(tc_pg_job_result(job, 0), 0, 0)) : 0;
  rd->cb.count(status, err_of(job, status), n, rd->arg);
  free(rd);
}

int tc_read_adopt_orphans(tc_store_t *st, unsigned deadline_ms, tc_read_count_cb cb, void *arg) {
  rd_t *rd = rd_new(arg);
  if (!rd) return TC_READ_ENOMEM;
  rd->cb.count = cb;
  return run1(st, rd, on_orphans, "SELECT tc_adopt_orphans()", 0, NULL, deadline_ms);
}

static void on_pruned(tc_pg_job_t *job, int status, void *arg) {
  rd_t *rd = arg;
  int64_t n = 0;
  if (status == TC_PG_OK) n = (int64_t)strtoull(PQcmdTuples((PGresult *)(uintptr_t)tc_pg_job_result(job, 0)), NULL, 10);
  rd->cb.count(status, err_of(job, status), n, rd->arg);
  free(rd);
}

int tc_read_prune_history(tc_store_t *st, int days, unsigned deadline_ms, tc_read_count_cb cb, void *arg) {
  rd_t *rd = rd_new(arg);
  if (!rd) return TC_READ_ENOMEM;
  rd->cb.count = cb;
  char d[16];
  snprintf(d, sizeof(d), "%d", days);
  const char *v[] = {d};
  /* statement_timestamp(), not clock_timestamp(): a volatile bound cannot
   * use the end_time index, and the history table is the one table here
   * that is large (a full scan every minute, 0.6 s at 1.5 million rows). */
  _Static_assert(TC_READ_HISTORY_BATCH == 10000, "the LIMIT below is TC_READ_HISTORY_BATCH");
  return run1(st, rd, on_pruned,
              "DELETE FROM global_history WHERE xid IN (SELECT xid FROM global_history "
              "WHERE end_time < statement_timestamp() - $1::int * interval '1 day' "
              "ORDER BY end_time LIMIT 10000)", /* TC_READ_HISTORY_BATCH */
              1, v, deadline_ms);
}

/* ------------------------------------------------ dedicated connections */

struct tc_read_conn {
  tc_pg_pool_t *pool; /* one connection */
  void (*on_state)(bool up, const char *err, void *arg);
  void *arg;
  void (*done)(void *arg);
  void *done_arg;
};

static void on_conn_state(tc_pg_pool_t *pool, int idx, bool up, const char *err, void *arg) {
  tc_read_conn_t *c = arg;
  if (c->on_state) c->on_state(up, err, c->arg);
}

tc_read_conn_t *tc_read_conn_new(uv_loop_t *loop, const char *conninfo, tc_read_conn_kind_t kind, int node_id,
                                 void (*on_state)(bool up, const char *err, void *arg), void *arg) {
  char init[128];
  switch (kind) {
  case TC_READ_CONN_LEADER:
    /* The name says which node leads (tc_nodes, tc_leader_try read it). */
    snprintf(init, sizeof(init), "SET application_name = 'tcd-leader/%d'", node_id);
    break;
  case TC_READ_CONN_MEMBER:
    /* Heartbeats need not be durable: no fsync wait for them. */
    snprintf(init, sizeof(init), "SET application_name = 'tcd-member/%d'; SET synchronous_commit = off", node_id);
    break;
  default: return NULL;
  }
  tc_read_conn_t *c = calloc(1, sizeof(*c));
  if (!c) return NULL;
  c->on_state = on_state;
  c->arg = arg;
  tc_pg_pool_opts_t o = {0};
  o.conninfo = conninfo;
  o.size = 1;
  o.max_queue = 16;
  o.on_state = on_conn_state;
  o.state_arg = c;
  o.init_sql = init;
  c->pool = tc_pg_pool_new(loop, &o);
  if (!c->pool) {
    free(c);
    return NULL;
  }
  return c;
}

static void on_conn_closed(void *arg) {
  tc_read_conn_t *c = arg;
  void (*done)(void *) = c->done;
  void *darg = c->done_arg;
  free(c);
  if (done) done(darg);
}

void tc_read_conn_close(tc_read_conn_t *c, void (*done)(void *arg), void *arg) {
  if (!c) {
    if (done) done(arg);
    return;
  }
  c->done = done;
  c->done_arg = arg;
  tc_pg_pool_close(c->pool, on_conn_closed, c);
}

static void on_leader_answer(tc_pg_job_t *job, int status, void *arg) {
  rd_t *rd = arg;
  const char *answer = status == TC_PG_OK ? PQgetvalue(tc_pg_job_result(job, 0), 0, 0) : NULL;
  rd->cb.answer(status, err_of(job, status), answer, rd->arg);
  free(rd);
}

int tc_read_leader_try(tc_read_conn_t *c, int64_t lock_key, int node_id, int lease_ms, unsigned deadline_ms,
                       tc_read_answer_cb cb, void *arg) {
  rd_t *rd = rd_new(arg);
  if (!rd) return TC_READ_ENOMEM;
  rd->cb.answer = cb;
  char key[32], node[16], lease[16];
  snprintf(key, sizeof(key), "%" PRId64, lock_key);
  snprintf(node, sizeof(node), "%d", node_id);
  snprintf(lease, sizeof(lease), "%d", lease_ms);
  const char *sql = "SELECT tc_leader_try($1::bigint, $2::integer, $3::integer)";
  const int np = 3;
  const char *v[] = {key, node, lease};
  const char *const *vals[] = {v};
  return run(NULL, c->pool, rd, 0, on_leader_answer, 1, &sql, &np, vals, deadline_ms);
}

static void on_leader_held(tc_pg_job_t *job, int status, void *arg) {
  rd_t *rd = arg;
  bool held = status == TC_PG_OK && PQgetvalue(tc_pg_job_result(job, 0), 0, 0)[0] == 't';
  rd->cb.held(status, err_of(job, status), held, rd->arg);
  free(rd);
}

int tc_read_leader_held(tc_read_conn_t *c, int64_t lock_key, unsigned deadline_ms, tc_read_held_cb cb, void *arg) {
  rd_t *rd = rd_new(arg);
  if (!rd) return TC_READ_ENOMEM;
  rd->cb.held = cb;
  char key[32];
  snprintf(key, sizeof(key), "%" PRId64, lock_key);
  const char *sql = "SELECT EXISTS (SELECT 1 FROM pg_locks l WHERE l.pid = pg_backend_pid() "
                    "AND l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 "
                    "AND l.classid = ($1::bigint >> 32)::oid AND l.objid = ($1::bigint & 4294967295)::oid)";
  const int np = 1;
  const char *v[] = {key};
  const char *const *vals[] = {v};
  return run(NULL, c->pool, rd, 0, on_leader_held, 1, &sql, &np, vals, deadline_ms);
}

static void on_exec(tc_pg_job_t *job, int status, void *arg) {
  rd_t *rd = arg;
  rd->cb.exec(status, status == TC_PG_OK ? tc_pg_job_result(job, 0) : NULL, err_of(job, status), rd->arg);
  free(rd);
}

int tc_read_conn_exec(tc_read_conn_t *c, const char *sql, int n, const char *const *values, unsigned deadline_ms,
                      tc_read_exec_cb cb, void *arg) {
  rd_t *rd = rd_new(arg);
  if (!rd) return TC_READ_ENOMEM;
  rd->cb.exec = cb;
  return run(NULL, c->pool, rd, 0, on_exec, 1, &sql, &n, &values, deadline_ms);
}
