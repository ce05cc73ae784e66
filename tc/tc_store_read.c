/*
 * tc_store_read.c - the store's named reads and their SQL; see
 * tc_store_read.h.
 *
 * NOTES
 *   Each read is a small heap object (rd_t: the caller's callback and
 *   argument) that rides one tc_pg job as its argument: when the job ends,
 *   its answer (answer_<read>, or answer_rows for the reads that list
 *   rows) parses the PGresults into the rows of the header and hands them
 *   to the caller; then the read is freed.  Every kind of row is read one
 *   way, by its entry in row_kinds[] (the fields in column order, READ_COLS).
 *   Rows are arrays on the heap only where a read returns many (the rest
 *   live on the stack); strings point into the PGresults, which the job
 *   frees after its callback returns.
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
#include "tc_sql_array.h"
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

/* Which rows a read decodes (row_kinds[]); the list reads among them hand
 * their rows to the caller (answer_rows). */
typedef enum rows_kind {
  ROWS_GLOBALS,       /* tc_read_global_t: GLOBAL_COLS */
  ROWS_FINISHED,      /* tc_read_finished_t */
  ROWS_HELD_LOCKS,    /* tc_read_lock_t: LOCK_COLS, then the holder's status */
  ROWS_NODES,         /* tc_read_node_t */
  ROWS_COUNTS,        /* tc_read_count_t: sessions_sql */
  ROWS_XIDS,          /* const char *: an xid */
  ROWS_LOCKS,         /* tc_read_lock_t: LOCK_COLS */
  ROWS_BRANCHES,      /* tc_read_branch_t */
  ROWS_PHASE_TWO,     /* tc_branch_row_t: see branch_row() */
  ROWS_STATUSES,      /* int: a status */
} rows_kind_t;

typedef struct rd rd_t;

/* A read's answer: parse the job's results and call the caller's
 * callback, once. */
typedef void (*answer_fn)(const rd_t *rd, tc_pg_job_t *job, int status);

/* One read in flight: the caller's callback and argument, and how its
 * answer is made. */
struct rd {
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
  answer_fn answer;
  rows_kind_t rows; /* answer_rows: what the rows are */
};

/* The caller's callback 'fn', as the member 'type' of rd_t.cb (so the
 * compiler checks it is of its read's type), and its argument 'a'. */
#define RD(type, fn, a) ((rd_t){.cb.type = (fn), .arg = (a)})

/* The job's callback for every read: its answer, then the read is done. */
static void on_read_done(tc_pg_job_t *job, int status, void *arg) {
  rd_t *rd = arg;
  rd->answer(rd, job, status);
  free(rd);
}

/*
 * Send 'n' statements ('sql[i]' with 'np[i]' text parameters 'vals[i]')
 * as one job whose results 'answer' hands to the callback of 'caller': on
 * the store's reader connections, or on 'pool' when 'st' is NULL.  0, or
 * a code (then the callback never runs).
 */
static int run(tc_store_t *st, tc_pg_pool_t *pool, rd_t caller, answer_fn answer, unsigned flags, int n,
               const char *const *sql, const int *np, const char *const *const *vals, unsigned deadline_ms) {
  rd_t *rd = malloc(sizeof(*rd));
  if (!rd) return TC_READ_ENOMEM;
  *rd = caller;
  rd->answer = answer;
  tc_pg_job_t *job = tc_pg_job_new(flags, on_read_done, rd);
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

/* The same for one statement, on the reader connections or on 'pool'. */
static int run1(tc_store_t *st, tc_pg_pool_t *pool, rd_t caller, answer_fn answer, const char *sql, int n,
                const char *const *vals, unsigned deadline_ms) {
  return run(st, pool, caller, answer, 0, 1, &sql, &n, &vals, deadline_ms);
}

/* What the callback's 'err' says (tc_store_read.h). */
static const char *err_of(const tc_pg_job_t *job, int status) {
  return status == TC_PG_ESTMT || status == TC_PG_EBROKEN ? tc_pg_job_error(job) : "";
}

/* Statement 'i''s result when the job succeeded and the statement
 * returned a row; else NULL. */
static const PGresult *first_row(tc_pg_job_t *job, int status, int i) {
  if (status != TC_PG_OK) return NULL;
  const PGresult *r = tc_pg_job_result(job, i);
  return PQntuples(r) > 0 ? r : NULL;
}

/* A number as a statement's text parameter. */
typedef struct param_text {
  char text[32];
} param_text_t;

static param_text_t int_text(int64_t v) {
  param_text_t p;
  snprintf(p.text, sizeof(p.text), "%" PRId64, v);
  return p;
}

/* Seconds, to the millisecond. */
static param_text_t seconds_text(double s) {
  param_text_t p;
  snprintf(p.text, sizeof(p.text), "%.3f", s);
  return p;
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

/* A field that a column is read into; the field's type says how (SQL
 * NULL: NULL, 0, 0.0 or false). */
typedef struct col_field {
  enum { COL_TEXT, COL_I64, COL_INT, COL_F64, COL_BOOL } kind;
  void *field;
} col_field_t;

/* The field at 'field_ptr' (a type without a col_* reader does not
 * compile). */
#define COL(field_ptr)                                                                                            \
  {                                                                                                               \
    _Generic((field_ptr), const char **: COL_TEXT, int64_t *: COL_I64, int *: COL_INT, double *: COL_F64,        \
             bool *: COL_BOOL),                                                                                   \
      (field_ptr)                                                                                                 \
  }

static void read_cols(const PGresult *r, int row, int col, const col_field_t *fields, size_t n) {
  for (size_t i = 0; i < n; i++, col++) {
    void *f = fields[i].field;
    switch (fields[i].kind) {
    case COL_TEXT: *(const char **)f = col_s(r, row, col); break;
    case COL_I64: *(int64_t *)f = col_i64(r, row, col); break;
    case COL_INT: *(int *)f = col_int(r, row, col); break;
    case COL_F64: *(double *)f = col_f(r, row, col); break;
    case COL_BOOL: *(bool *)f = col_b(r, row, col); break;
    }
  }
}

/* Read the columns of row 'row' from 'col' on into the fields given, in
 * column order: READ_COLS(r, row, col, COL(&x->a), COL(&x->b), ...). */
#define READ_COLS(r, row, col, ...)                                                                               \
  read_cols((r), (row), (col), (const col_field_t[]){__VA_ARGS__},                                                \
            sizeof((const col_field_t[]){__VA_ARGS__}) / sizeof(col_field_t))

/* ---------------------------------------------------------------- rows */

/* Columns of a live global transaction; see global_row(). */
#define GLOBAL_COLS                                                                                     \
  "g.xid, g.transaction_id, g.status, g.application_id, g.transaction_name, g.timeout_ms, " TS(        \
    "g.begin_time") ", extract(epoch FROM clock_timestamp() - g.begin_time)::float8, " TS("g.deadline") \
    ", g.node_id, g.retry_count, " TS("g.next_retry_at") ", g.last_error, "                            \
    "(SELECT count(*) FROM branch_table b WHERE b.xid = g.xid), "                                       \
    "(SELECT count(*) FROM lock_table l WHERE l.xid = g.xid), g.deadline < clock_timestamp()"

static void global_row(const PGresult *r, int row, void *dst) {
  tc_read_global_t *g = dst;
  READ_COLS(r, row, 0, COL(&g->xid), COL(&g->transaction_id), COL(&g->status), COL(&g->application_id),
            COL(&g->name), COL(&g->timeout_ms), COL(&g->begin_time), COL(&g->age_s), COL(&g->deadline),
            COL(&g->node_id), COL(&g->retry_count), COL(&g->next_retry_at), COL(&g->last_error),
            COL(&g->branches), COL(&g->locks), COL(&g->timed_out));
}

/* A history row's transaction_id, status, application_id,
 * transaction_name, begin_time and end_time, from 'col' on. */
static void history_cols(const PGresult *r, int row, int col, tc_read_history_t *h) {
  READ_COLS(r, row, col, COL(&h->transaction_id), COL(&h->status), COL(&h->application_id), COL(&h->name),
            COL(&h->begin_time), COL(&h->end_time));
}

static void finished_row(const PGresult *r, int row, void *dst) {
  tc_read_finished_t *f = dst;
  f->xid = col_s(r, row, 0);
  history_cols(r, row, 1, &f->h);
  READ_COLS(r, row, 7, COL(&f->duration_s), COL(&f->branches));
}

#define LOCK_COLS "l.row_key, l.xid, l.branch_id, l.resource_id, l.table_name, l.pk, l.status, " TS("l.gmt_create")

static void lock_row(const PGresult *r, int row, void *dst) {
  tc_read_lock_t *l = dst;
  READ_COLS(r, row, 0, COL(&l->row_key), COL(&l->xid), COL(&l->branch_id), COL(&l->resource_id), COL(&l->table),
            COL(&l->pk), COL(&l->status), COL(&l->since));
}

/* LOCK_COLS and the holder's global status (SQL NULL: an orphan). */
static void held_lock_row(const PGresult *r, int row, void *dst) {
  tc_read_lock_t *l = dst;
  lock_row(r, row, l);
  l->orphan = PQgetisnull(r, row, 8);
  l->holder_status = col_int(r, row, 8);
}

static void node_row(const PGresult *r, int row, void *dst) {
  tc_read_node_t *o = dst;
  READ_COLS(r, row, 0, COL(&o->node_id), COL(&o->address), COL(&o->admin_socket), COL(&o->started_at),
            COL(&o->heartbeat_at), COL(&o->heartbeat_age_s), COL(&o->is_leader), COL(&o->pid), COL(&o->version),
            COL(&o->state));
  o->has_pid = !PQgetisnull(r, row, 7);
}

/* Unfinished global transactions by status: rows (status, count). */
static const char sessions_sql[] = "SELECT status, count(*) FROM global_table GROUP BY status ORDER BY status";

static void count_row(const PGresult *r, int row, void *dst) {
  tc_read_count_t *c = dst;
  READ_COLS(r, row, 0, COL(&c->status), COL(&c->count));
}

static void xid_row(const PGresult *r, int row, void *dst) { *(const char **)dst = PQgetvalue(r, row, 0); }

static void branch_view_row(const PGresult *r, int row, void *dst) {
  tc_read_branch_t *b = dst;
  READ_COLS(r, row, 0, COL(&b->branch_id), COL(&b->resource_id), COL(&b->branch_type), COL(&b->status),
            COL(&b->client_id), COL(&b->retry_count), COL(&b->next_retry_at), COL(&b->last_error),
            COL(&b->lock_keys), COL(&b->application_data), COL(&b->created), COL(&b->modified));
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

static void phase_two_row(const PGresult *r, int row, void *dst) { branch_row(r, row, 0, dst); }

static void status_row(const PGresult *r, int row, void *dst) { *(int *)dst = col_int(r, row, 0); }

/* What each kind of row takes, and how one is read. */
static const struct {
  size_t size;
  void (*decode)(const PGresult *r, int row, void *dst);
} row_kinds[] = {
  [ROWS_GLOBALS] = {sizeof(tc_read_global_t), global_row},
  [ROWS_FINISHED] = {sizeof(tc_read_finished_t), finished_row},
  [ROWS_HELD_LOCKS] = {sizeof(tc_read_lock_t), held_lock_row},
  [ROWS_NODES] = {sizeof(tc_read_node_t), node_row},
  [ROWS_COUNTS] = {sizeof(tc_read_count_t), count_row},
  [ROWS_XIDS] = {sizeof(const char *), xid_row},
  [ROWS_LOCKS] = {sizeof(tc_read_lock_t), lock_row},
  [ROWS_BRANCHES] = {sizeof(tc_read_branch_t), branch_view_row},
  [ROWS_PHASE_TWO] = {sizeof(tc_branch_row_t), phase_two_row},
  [ROWS_STATUSES] = {sizeof(int), status_row},
};

/* All rows of 'r' as an array of 'kind' (zeroed, then read; never NULL
 * for none) and their number '*n'; out of memory: NULL and *n 0. */
static void *decode_rows(const PGresult *r, rows_kind_t kind, int *n) {
  size_t size = row_kinds[kind].size;
  int count = PQntuples(r);
  char *rows = calloc((size_t)(count > 0 ? count : 1), size);
  *n = rows ? count : 0;
  for (int i = 0; i < *n; i++) row_kinds[kind].decode(r, i, rows + (size_t)i * size);
  return rows;
}

/* The answer of a list read: statement 0's rows, of the kind rd->rows. */
static void answer_rows(const rd_t *rd, tc_pg_job_t *job, int status) {
  void *rows = NULL;
  int n = 0;
  if (status == TC_PG_OK && !(rows = decode_rows(tc_pg_job_result(job, 0), rd->rows, &n))) status = TC_READ_ENOMEM;
  const char *err = err_of(job, status);
  switch (rd->rows) {
  case ROWS_GLOBALS: rd->cb.globals(status, err, rows, n, rd->arg); break;
  case ROWS_FINISHED: rd->cb.history(status, err, rows, n, rd->arg); break;
  case ROWS_HELD_LOCKS: rd->cb.locks(status, err, rows, n, rd->arg); break;
  case ROWS_NODES: rd->cb.nodes(status, err, rows, n, rd->arg); break;
  case ROWS_COUNTS: rd->cb.counts(status, err, rows, n, rd->arg); break;
  case ROWS_XIDS: rd->cb.xids(status, err, rows, n, rd->arg); break;
  default: abort(); /* not a list read's */
  }
  free(rows);
}

/* A list read: 'sql' on the reader connections, its rows of 'kind'
 * handed to the callback of 'caller'. */
static int read_rows(tc_store_t *st, rows_kind_t kind, rd_t caller, const char *sql, int n, const char *const *vals,
                     unsigned deadline_ms) {
  caller.rows = kind;
  return run1(st, NULL, caller, answer_rows, sql, n, vals, deadline_ms);
}

/* ------------------------------------------------------------ TM reads */

static void answer_status(const rd_t *rd, tc_pg_job_t *job, int status) {
  tc_read_status_t s = {0};
  const PGresult *r = first_row(job, status, 0);
  s.found = r != NULL;
  if (r) READ_COLS(r, 0, 0, COL(&s.global_status), COL(&s.allowed));
  rd->cb.status(status, err_of(job, status), status == TC_PG_OK ? &s : NULL, rd->arg);
}

int tc_read_status(tc_store_t *st, const char *xid, const char *app_id, const char *group, unsigned deadline_ms,
                   tc_read_status_cb cb, void *arg) {
  const char *v[] = {xid, app_id, group};
  return run1(st, NULL, RD(status, cb, arg), answer_status,
              "SELECT status, tc__may_decide(xid, application_id, app_group, $2, $3) "
              "FROM global_table WHERE xid = $1 "
              "UNION ALL SELECT status, app_group = $3 FROM global_history WHERE xid = $1 LIMIT 1",
              3, v, deadline_ms);
}

/* Statement 0's first value (SQL NULL: NULL), NULL without a row. */
static void answer_first_value(const rd_t *rd, tc_pg_job_t *job, int status) {
  const PGresult *r = first_row(job, status, 0);
  rd->cb.answer(status, err_of(job, status), r ? col_s(r, 0, 0) : NULL, rd->arg);
}

int tc_read_branch_data(tc_store_t *st, const char *xid, int64_t branch_id, unsigned deadline_ms,
                        tc_read_answer_cb cb, void *arg) {
  param_text_t bid = int_text(branch_id);
  const char *v[] = {xid, bid.text};
  return run1(st, NULL, RD(answer, cb, arg), answer_first_value,
              "SELECT application_data FROM branch_table WHERE xid = $1 AND branch_id = $2::bigint", 2, v,
              deadline_ms);
}

int tc_read_lock_holder(tc_store_t *st, const char *resource_id, const char *lock_keys, size_t max_keys,
                        const char *xid, unsigned deadline_ms, tc_read_holder_cb cb, void *arg) {
  /* The row keys of the lock keys, as a text[] literal. */
  tc_sql_array_t rows;
  tc_sql_array_init(&rows);
  tc_lock_rows_t want = {.row = &rows, .resource = resource_id};
  int n = txp_lockkeys_each(lock_keys, max_keys, tc_lock_rows_add, &want), rc = 0;
  const char *row_keys = n < 0 ? NULL : tc_sql_array_end(&rows);
  if (n < 0 && n != TXP_ENOMEM)
    rc = TC_READ_EINVAL;
  else if (!row_keys)
    rc = TC_READ_ENOMEM;
  if (rc == 0) {
    const char *v[] = {row_keys, xid ? xid : ""};
    /* the holder: an xid, never SQL NULL */
    rc = run1(st, NULL, RD(holder, cb, arg), answer_first_value,
              "SELECT xid FROM lock_table WHERE row_key = ANY($1::text[]) AND xid <> $2 LIMIT 1", 2, v, deadline_ms);
  }
  tc_sql_array_free(&rows);
  return rc;
}

static void answer_owner(const rd_t *rd, tc_pg_job_t *job, int status) {
  tc_read_owner_t o = {0};
  const PGresult *r = first_row(job, status, 0);
  o.found = r != NULL;
  if (r) READ_COLS(r, 0, 0, COL(&o.global_status), COL(&o.application_id), COL(&o.app_group));
  rd->cb.owner(status, err_of(job, status), status == TC_PG_OK ? &o : NULL, rd->arg);
}

int tc_read_branch_owner(tc_store_t *st, const char *xid, int64_t branch_id, unsigned deadline_ms,
                         tc_read_owner_cb cb, void *arg) {
  param_text_t branch = int_text(branch_id);
  const char *v[] = {xid, branch.text};
  /* A live branch, or one of an AT commit finished at its decision
   * (sql/tc/010): in the history, Committed, listed among its branches,
   * of the global's group (a branch is registered by an application of
   * it), by an application the history does not keep.  No column is
   * SQL NULL. */
  return run1(st, NULL, RD(owner, cb, arg), answer_owner,
              "SELECT g.status, coalesce(b.application_id, ''), coalesce(b.app_group, '')"
              " FROM global_table g JOIN branch_table b"
              " ON b.xid = g.xid AND b.branch_id = $2::bigint WHERE g.xid = $1"
              " UNION ALL"
              " SELECT h.status, '', coalesce(h.app_group, '') FROM global_history h"
              " WHERE h.xid = $1 AND h.status = 9"
              " AND tc_history_has_branch(h.branches, $2::bigint)"
              " LIMIT 1",
              2, v, deadline_ms);
}

/* ------------------------------------------------------------ operators */

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

/* The parameters of a list filter: its statuses as an array literal and
 * its limit. */
typedef struct list_params {
  char literal[64 * 8];
  const char *statuses; /* NULL: any */
  param_text_t limit;
} list_params_t;

/* 0, or TC_READ_EINVAL: too many statuses for the literal. */
static int list_params(const tc_read_list_filter_t *f, list_params_t *p) {
  bool too_long;
  p->statuses = status_array(f->statuses, f->nstatuses, p->literal, sizeof(p->literal), &too_long);
  p->limit = int_text(f->limit);
  return too_long ? TC_READ_EINVAL : 0;
}

int tc_read_globals(tc_store_t *st, const tc_read_globals_filter_t *f, unsigned deadline_ms, tc_read_globals_cb cb,
                    void *arg) {
  list_params_t list;
  if (list_params(&f->list, &list) != 0) return TC_READ_EINVAL;
  param_text_t age = seconds_text(f->min_age_s);
  const char *v[] = {list.statuses, f->has_min_age ? age.text : NULL, f->list.name, list.limit.text};
  return read_rows(st, ROWS_GLOBALS, RD(globals, cb, arg),
                   "SELECT " GLOBAL_COLS " FROM global_table g "
                   "WHERE ($1::smallint[] IS NULL OR g.status = ANY ($1::smallint[])) "
                   "AND ($2::float8 IS NULL OR g.begin_time <= clock_timestamp() - $2::float8 * interval '1 second') "
                   "AND ($3::text IS NULL OR g.transaction_name = $3) "
                   "ORDER BY g.begin_time, g.xid LIMIT $4::int",
                   4, v, deadline_ms);
}

int tc_read_history(tc_store_t *st, const tc_read_history_filter_t *f, unsigned deadline_ms, tc_read_history_cb cb,
                    void *arg) {
  list_params_t list;
  if (list_params(&f->list, &list) != 0) return TC_READ_EINVAL;
  param_text_t since = seconds_text(f->since_unix), until = seconds_text(f->until_unix);
  const char *v[] = {f->xid, list.statuses, f->list.name, f->has_since ? since.text : NULL,
                     f->has_until ? until.text : NULL, list.limit.text};
  /* The time bounds use global_history_end_time_idx; an xid is its key. */
  return read_rows(st, ROWS_FINISHED, RD(history, cb, arg),
                   "SELECT h.xid, h.transaction_id, h.status, h.application_id, h.transaction_name, "
                   TS("h.begin_time") ", " TS("h.end_time") ", extract(epoch FROM h.end_time - h.begin_time)::float8, "
                   "jsonb_array_length(h.branches) FROM global_history h "
                   "WHERE ($1::text IS NULL OR h.xid = $1) "
                   "AND ($2::smallint[] IS NULL OR h.status = ANY ($2::smallint[])) "
                   "AND ($3::text IS NULL OR h.transaction_name = $3) "
                   "AND ($4::float8 IS NULL OR h.end_time >= to_timestamp($4::float8)) "
                   "AND ($5::float8 IS NULL OR h.end_time <= to_timestamp($5::float8)) "
                   "ORDER BY h.end_time DESC, h.xid LIMIT $6::int",
                   6, v, deadline_ms);
}

static void answer_global(const rd_t *rd, tc_pg_job_t *job, int status) {
  tc_read_global_view_t v = {0};
  tc_read_global_t g;
  tc_read_history_t h;
  void *branches = NULL, *locks = NULL;
  if (status == TC_PG_OK) {
    const PGresult *gr = first_row(job, status, 0), *hr = first_row(job, status, 3);
    if (gr) {
      global_row(gr, 0, &g);
      v.global = &g;
    }
    if (hr) {
      history_cols(hr, 0, 0, &h);
      h.branches_json = col_s(hr, 0, 6);
      v.history = &h;
    }
    branches = decode_rows(tc_pg_job_result(job, 1), ROWS_BRANCHES, &v.nbranches);
    locks = decode_rows(tc_pg_job_result(job, 2), ROWS_LOCKS, &v.nlocks);
    if (!branches || !locks) status = TC_READ_ENOMEM;
    v.branches = branches;
    v.locks = locks;
  }
  rd->cb.global(status, err_of(job, status), status == TC_PG_OK ? &v : NULL, rd->arg);
  free(branches);
  free(locks);
}

int tc_read_global(tc_store_t *st, const char *xid, int max_locks, unsigned deadline_ms, tc_read_global_cb cb,
                   void *arg) {
  param_text_t lim = int_text(max_locks);
  const char *v[] = {xid};
  const char *vl[] = {xid, lim.text};
  const char *sql[] = {
    "SELECT " GLOBAL_COLS " FROM global_table g WHERE g.xid = $1",
    "SELECT branch_id, resource_id, branch_type, status, client_id, retry_count, " TS("next_retry_at")
    ", last_error, lock_keys, application_data, " TS("gmt_create") ", " TS("gmt_modified")
    " FROM branch_table WHERE xid = $1 ORDER BY branch_id",
    "SELECT " LOCK_COLS " FROM lock_table l WHERE l.xid = $1 ORDER BY l.row_key LIMIT $2::int",
    "SELECT transaction_id, status, application_id, transaction_name, " TS("begin_time") ", " TS("end_time")
    ", tc_history_branches(branches)::text FROM global_history WHERE xid = $1",
  };
  const int np[] = {1, 1, 2, 1};
  const char *const *vals[] = {v, v, vl, v};
  return run(st, NULL, RD(global, cb, arg), answer_global, 0, 4, sql, np, vals, deadline_ms);
}

int tc_read_locks(tc_store_t *st, const tc_read_locks_filter_t *f, unsigned deadline_ms, tc_read_locks_cb cb,
                  void *arg) {
  param_text_t limit = int_text(f->limit);
  const char *v[] = {f->xid, f->key, f->prefix, limit.text};
  return read_rows(st, ROWS_HELD_LOCKS, RD(locks, cb, arg),
                   "SELECT " LOCK_COLS ", g.status FROM lock_table l LEFT JOIN global_table g ON g.xid = l.xid "
                   "WHERE ($1::text IS NULL OR l.xid = $1) AND ($2::text IS NULL OR l.row_key = $2) "
                   "AND ($3::text IS NULL OR starts_with(l.row_key, $3)) "
                   "ORDER BY l.row_key LIMIT $4::int",
                   4, v, deadline_ms);
}

int tc_read_nodes(tc_store_t *st, int stale_ms, int64_t leader_key, unsigned deadline_ms, tc_read_nodes_cb cb,
                  void *arg) {
  param_text_t stale = int_text(stale_ms), key = int_text(leader_key);
  const char *v[] = {stale.text, key.text};
  /* the state as tc_nodes shows it (a live store session and a fresh
   * heartbeat: up), and the leader by its lock, not by a flag */
  return read_rows(st, ROWS_NODES, RD(nodes, cb, arg),
                   "SELECT node_id, address, admin_socket, " TS("started_at") ", " TS("heartbeat_at")
                   ", heartbeat_age_ms / 1000.0, is_leader, pid, version, state "
                   "FROM tc_cluster_nodes($1::int, $2::bigint) ORDER BY node_id",
                   2, v, deadline_ms);
}

int tc_read_sessions(tc_store_t *st, unsigned deadline_ms, tc_read_counts_cb cb, void *arg) {
  return read_rows(st, ROWS_COUNTS, RD(counts, cb, arg), sessions_sql, 0, NULL, deadline_ms);
}

static void answer_repair_state(const rd_t *rd, tc_pg_job_t *job, int status) {
  tc_read_repair_state_t s = {0};
  int *bs = NULL;
  if (status == TC_PG_OK) {
    const PGresult *g = first_row(job, status, 0), *h = first_row(job, status, 2);
    s.live = g != NULL;
    if (g) READ_COLS(g, 0, 0, COL(&s.global_status), COL(&s.past_deadline));
    s.in_history = h != NULL;
    if (h) s.history_status = col_int(h, 0, 0);
    bs = decode_rows(tc_pg_job_result(job, 1), ROWS_STATUSES, &s.nbranches);
    if (!bs) status = TC_READ_ENOMEM;
    s.branch_status = bs;
  }
  rd->cb.repair_state(status, err_of(job, status), status == TC_PG_OK ? &s : NULL, rd->arg);
  free(bs);
}

int tc_read_repair_state(tc_store_t *st, const char *xid, unsigned deadline_ms, tc_read_repair_state_cb cb,
                         void *arg) {
  const char *v[] = {xid};
  const char *sql[] = {
    "SELECT status, deadline < clock_timestamp() FROM global_table WHERE xid = $1",
    "SELECT status FROM branch_table WHERE xid = $1 ORDER BY branch_id",
    "SELECT status FROM global_history WHERE xid = $1",
  };
  const int np[] = {1, 1, 1};
  const char *const *vals[] = {v, v, v};
  return run(st, NULL, RD(repair_state, cb, arg), answer_repair_state, 0, 3, sql, np, vals, deadline_ms);
}

static void answer_cas(const rd_t *rd, tc_pg_job_t *job, int status) {
  tc_read_cas_result_t c = {.result = ""};
  tc_branch_row_t *rows = NULL;
  if (status == TC_PG_OK) {
    const PGresult *r = first_row(job, status, 0);
    if (r) {
      c.result = PQgetvalue(r, 0, 0);
      READ_COLS(r, 0, 1, COL(&c.global_status), COL(&c.branch_id), COL(&c.branch_status));
    }
    rows = decode_rows(tc_pg_job_result(job, 1), ROWS_PHASE_TWO, &c.nrows);
    if (!rows) status = TC_READ_ENOMEM;
    c.rows = rows;
  }
  rd->cb.cas(status, err_of(job, status), status == TC_PG_OK ? &c : NULL, rd->arg);
  free(rows);
}

int tc_read_admin_cas(tc_store_t *st, const tc_read_cas_t *in, unsigned deadline_ms, tc_read_cas_cb cb, void *arg) {
  static const char *const retry_words[] = {"lease", "now", "clear"};
  if ((unsigned)in->retry > TC_READ_RETRY_CLEAR || in->nforbid < 0 || in->nforbid > 8) return TC_READ_EINVAL;
  param_text_t from = int_text(in->from), to = int_text(in->to), lease = int_text(in->lease_ms);
  char forbid[8 * 12 + 3];
  size_t o = (size_t)snprintf(forbid, sizeof(forbid), "{");
  for (int i = 0; i < in->nforbid; i++)
    o += (size_t)snprintf(forbid + o, sizeof(forbid) - o, "%s%d", i ? "," : "", in->forbid[i]);
  snprintf(forbid + o, sizeof(forbid) - o, "}");
  const char *v0[] = {in->xid, from.text, to.text, retry_words[in->retry], lease.text, forbid};
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
  return run(st, NULL, RD(cas, cb, arg), answer_cas, TC_PG_JOB_TXN, 2, sql, np, vals, deadline_ms);
}

static void answer_deleted(const rd_t *rd, tc_pg_job_t *job, int status) {
  tc_read_delete_result_t d = {.result = ""};
  const PGresult *r = first_row(job, status, 0);
  if (r) {
    d.result = PQgetvalue(r, 0, 0);
    READ_COLS(r, 0, 1, COL(&d.history_status), COL(&d.locks), COL(&d.branches));
  }
  rd->cb.del(status, err_of(job, status), status == TC_PG_OK ? &d : NULL, rd->arg);
}

int tc_read_admin_delete(tc_store_t *st, const char *xid, unsigned deadline_ms, tc_read_delete_cb cb, void *arg) {
  const char *sql = "SELECT result, status, locks, branches FROM tc_admin_delete_leftovers($1)";
  const int np = 1;
  const char *v[] = {xid};
  const char *const *vals[] = {v};
  return run(st, NULL, RD(del, cb, arg), answer_deleted, TC_PG_JOB_TXN, 1, &sql, &np, vals, deadline_ms);
}

/* -------------------------------------------------------------- metrics */

static void answer_probe(const rd_t *rd, tc_pg_job_t *job, int status) {
  tc_read_probe_t p = {0};
  tc_read_count_t *rows = NULL;
  if (status == TC_PG_OK) {
    if (!(rows = decode_rows(tc_pg_job_result(job, 0), ROWS_COUNTS, &p.nsessions))) {
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
}

int tc_read_probe(tc_store_t *st, unsigned deadline_ms, tc_read_probe_cb cb, void *arg) {
  const char *sql[] = {
    sessions_sql,
    "SELECT count(*), count(*) FILTER (WHERE next_retry_at <= clock_timestamp()) "
    "FROM global_table WHERE next_retry_at IS NOT NULL",
    "SELECT coalesce(string_agg(version::text, ',' ORDER BY version), '') "
    "FROM schema_version WHERE set_name = 'tc'",
  };
  const int np[] = {0, 0, 0};
  const char *const *vals[] = {NULL, NULL, NULL};
  return run(st, NULL, RD(probe, cb, arg), answer_probe, 0, 3, sql, np, vals, deadline_ms);
}

/* ---------------------------------------------------- the leader's jobs */

int tc_read_timeouts(tc_store_t *st, int limit, unsigned deadline_ms, tc_read_xids_cb cb, void *arg) {
  param_text_t lim = int_text(limit);
  const char *v[] = {lim.text};
  return read_rows(st, ROWS_XIDS, RD(xids, cb, arg),
                   "SELECT xid FROM global_table WHERE status = 1 AND deadline < statement_timestamp() "
                   "ORDER BY deadline LIMIT $1::int", /* stable bound: an index range scan */
                   1, v, deadline_ms);
}

static void answer_claimed(const rd_t *rd, tc_pg_job_t *job, int status) {
  tc_read_claim_t *claims = NULL;
  tc_branch_row_t *rows = NULL;
  int nclaims = 0;
  if (status == TC_PG_OK) {
    /* Rows: xid, global status, then one branch per row (NULL branch_id
     * when the session has none left), ordered by xid. */
    const PGresult *r = tc_pg_job_result(job, 0);
    int n = PQntuples(r);
    claims = calloc((size_t)(n > 0 ? n : 1), sizeof(*claims));
    rows = calloc((size_t)(n > 0 ? n : 1), sizeof(*rows));
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
}

int tc_read_claim_retries(tc_store_t *st, int limit, int lease_ms, unsigned deadline_ms, tc_read_claims_cb cb,
                          void *arg) {
  param_text_t lim = int_text(limit), lease = int_text(lease_ms);
  const char *v[] = {lim.text, lease.text};
  return run1(st, NULL, RD(claims, cb, arg), answer_claimed,
              "SELECT c.xid, c.status, b.branch_id, b.branch_type, b.status, b.resource_id, b.client_id, "
              "b.application_id, b.app_group "
              "FROM tc_claim_retries($1::int, $2::int) c "
              "LEFT JOIN branch_table b ON b.xid = c.xid ORDER BY c.xid, b.branch_id",
              2, v, deadline_ms);
}

static void answer_orphans(const rd_t *rd, tc_pg_job_t *job, int status) {
  int64_t n = status == TC_PG_OK ? atoi(PQgetvalue(tc_pg_job_result(job, 0), 0, 0)) : 0;
  rd->cb.count(status, err_of(job, status), n, rd->arg);
}

int tc_read_adopt_orphans(tc_store_t *st, unsigned deadline_ms, tc_read_count_cb cb, void *arg) {
  return run1(st, NULL, RD(count, cb, arg), answer_orphans, "SELECT tc_adopt_orphans()", 0, NULL, deadline_ms);
}

static void answer_pruned(const rd_t *rd, tc_pg_job_t *job, int status) {
  int64_t n = 0;
  if (status == TC_PG_OK) n = (int64_t)strtoull(PQcmdTuples((PGresult *)(uintptr_t)tc_pg_job_result(job, 0)), NULL, 10);
  rd->cb.count(status, err_of(job, status), n, rd->arg);
}

int tc_read_prune_history(tc_store_t *st, int days, unsigned deadline_ms, tc_read_count_cb cb, void *arg) {
  param_text_t d = int_text(days);
  const char *v[] = {d.text};
  /* statement_timestamp(), not clock_timestamp(): a volatile bound cannot
   * use the end_time index, and the history table is the one table here
   * that is large (a full scan every minute, 0.6 s at 1.5 million rows). */
  _Static_assert(TC_READ_HISTORY_BATCH == 10000, "the LIMIT below is TC_READ_HISTORY_BATCH");
  return run1(st, NULL, RD(count, cb, arg), answer_pruned,
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

int tc_read_leader_try(tc_read_conn_t *c, int64_t lock_key, int node_id, int lease_ms, unsigned deadline_ms,
                       tc_read_answer_cb cb, void *arg) {
  param_text_t key = int_text(lock_key), node = int_text(node_id), lease = int_text(lease_ms);
  const char *v[] = {key.text, node.text, lease.text};
  /* the answer: one row, never SQL NULL (sql/tc/003_cluster.sql) */
  return run1(NULL, c->pool, RD(answer, cb, arg), answer_first_value,
              "SELECT tc_leader_try($1::bigint, $2::integer, $3::integer)", 3, v, deadline_ms);
}

static void answer_leader_held(const rd_t *rd, tc_pg_job_t *job, int status) {
  const PGresult *r = first_row(job, status, 0);
  rd->cb.held(status, err_of(job, status), r && col_b(r, 0, 0), rd->arg);
}

int tc_read_leader_held(tc_read_conn_t *c, int64_t lock_key, unsigned deadline_ms, tc_read_held_cb cb, void *arg) {
  param_text_t key = int_text(lock_key);
  const char *v[] = {key.text};
  return run1(NULL, c->pool, RD(held, cb, arg), answer_leader_held,
              "SELECT EXISTS (SELECT 1 FROM pg_locks l WHERE l.pid = pg_backend_pid() "
              "AND l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 "
              "AND l.classid = ($1::bigint >> 32)::oid AND l.objid = ($1::bigint & 4294967295)::oid)",
              1, v, deadline_ms);
}

static void answer_exec(const rd_t *rd, tc_pg_job_t *job, int status) {
  rd->cb.exec(status, status == TC_PG_OK ? tc_pg_job_result(job, 0) : NULL, err_of(job, status), rd->arg);
}

int tc_read_conn_exec(tc_read_conn_t *c, const char *sql, int n, const char *const *values, unsigned deadline_ms,
                      tc_read_exec_cb cb, void *arg) {
  return run1(NULL, c->pool, RD(exec, cb, arg), answer_exec, sql, n, values, deadline_ms);
}
