/*
 * tc_store.c - group-commit batches of store operations; see tc_store.h.
 *
 * NOTES
 *   Flow of one op:  tc_store_submit -> queue -> (idle handle) flush ->
 *   batch_build (one tc_pg job, one PostgreSQL transaction) -> on_batch_done
 *   -> outputs parsed per statement -> op callbacks, in queue order within
 *   each kind.
 *
 *   The flush runs from a uv_idle handle that is active only while ops are
 *   queued and a writer is free: requests decoded in one poll phase are
 *   batched together at the start of the next iteration, and the idle
 *   handle keeps poll from blocking while work is waiting.
 *
 *   Arrays go to PostgreSQL as text literals ('{"a","b",NULL}') so that one
 *   parameter carries a whole column of the batch.
 *
 *   Lazy ops (op->lazy: the record that every branch of a commit is done,
 *   which moves the session to history) wait in a queue of their own while
 *   the store is busy, and join the main queue when it falls idle, when
 *   LAZY_BATCH of them are waiting, or after TC_STORE_LAZY_MS.  Nobody
 *   waits for them (the TM had its answer at the decision, the locks went
 *   with it), they are the most expensive items of a batch (history insert
 *   and three deletes), and the batches that carry begins, registrations
 *   and decisions are the ones clients wait for: those stay light, and the
 *   clean-up runs in fewer, fuller statements.
 *
 *   Three lanes.  The durable lane (store.writers connections) carries the
 *   records that must survive a PostgreSQL crash once acknowledged: branch
 *   registrations with their global locks, and decisions (and the begins
 *   that ride a registration: tc_hold.h).  The relaxed lane
 *   (store.relaxed_writers connections, synchronous_commit off) carries the
 *   begins stored alone, and the clean-up lane (one more such connection)
 *   phase-two records.  Their commit returns without waiting for the WAL flush, which
 *   is what made every global transaction wait for four flushes instead of
 *   three.  Phase-two batches have a lane of their own because they are the
 *   big ones (64 lazy records, the history insert): a begin queued behind
 *   one waited twice as long as its own batch takes, and the begin is on
 *   every client's critical path while phase two is on nobody's.  What a
 *   PostgreSQL crash can lose on the relaxed and clean-up lanes is
 *   harmless, and nothing else loses anything (a tcd crash loses nothing:
 *   the commit is in PostgreSQL's memory and visible at once):
 *     - a begin: its xid is then unknown; a branch cannot register under
 *       it, so no RM has changed data, and the TM's commit or rollback finds
 *       nothing to do.  Any later durable commit (a registration under that
 *       xid, made after the begin's commit returned) flushes the WAL up to
 *       itself, the begin included: WAL is one sequence.
 *     - a phase-two record: the branch's last status goes back to
 *       committing/rollbacking and the recovery job sends BranchCommit or
 *       BranchRollback again, which the RM answers idempotently.
 *   store.relaxed_writers = 0 puts everything on the durable lane (and
 *   opens no clean-up connection).
 *
 *   Unknown outcomes.  A batch whose connection breaks in flight (the
 *   primary died, failed over, or the network cut) may or may not have
 *   committed: the COMMIT may have run with its answer lost.  Nothing is
 *   guessed and nothing is answered from memory; the store reads back what
 *   PostgreSQL holds, on a reader connection, which (target_session_attrs=
 *   read-write, the same conninfo as the writers) lands on the primary that
 *   takes the writes now, after the failover.  Since a synchronous standby
 *   had every durable commit before it was acknowledged, what the new
 *   primary holds is what committed; a transaction that was only in the old
 *   primary's memory was never answered, so losing it loses no answer.
 *   Each op carries its own identity, so one reading tells for all of them
 *   (the batch's other effects are set-based functions of the same ops):
 *     - a begin: its xid (chosen by this node) is in global_table or
 *       global_history: it committed, answer ok;
 *     - a registration: its branch id (chosen by this node) is in
 *       branch_table under its xid: it committed with its locks, answer ok
 *       with that id;
 *     - a decision: the global's status is the outcome of this op's action
 *       and the caller may decide it (tc__may_decide): the decision stands,
 *       answered as a fresh one with the branches to drive (if another
 *       decision to the same effect got there first, phase two is driven
 *       twice, which RMs answer idempotently, as they do recovery's).
 *   The reading is a transaction that takes a transaction id, on a
 *   connection with synchronous_commit on, and its answers count only once
 *   it committed: that COMMIT flushes (and, with a synchronous standby,
 *   replicates) the WAL up to itself, so a row it saw is durable, a begin
 *   committed asynchronously on the relaxed lane included.  Without that,
 *   a reader whose backend outlived the writer's by a moment in a crash saw
 *   such a begin in memory, answered it, and the crash lost it (the fault
 *   suite's cluster_pgrestart found it: a TM's acknowledged xid gone).
 *   Everything else did not happen (or was refused, which changed nothing):
 *   it goes back to the head of its lane and runs again, and the function
 *   gives the answer a first run would have (a crossing decision, a
 *   stranger's, a global finished meanwhile).  An op whose batch broke
 *   MAX_BROKEN times fails with TXP_ESTORE saying nothing was recorded; a
 *   reading that cannot be had within RESOLVE_WAIT_MS fails the ops with
 *   "outcome unknown" (the callers' idempotency keys and the recovery job
 *   remain).  One race is closed too: if the old connection's transaction
 *   ended after the reading (a network cut, not a crash), an op run again
 *   meets a unique violation on its own xid or branch id, and is read
 *   again instead of failing.  Phase-two records are not read back: they
 *   fail, and the recovery job drives the branch again (their loss is
 *   harmless, see above).  Failpoints tc.store.*.aborted and
 *   tc.store.*.reply_lost stand for both kinds of loss in the tests.
 */
#include "tc_store.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tc_log.h"
#include "tc_parts.h"
#include "tc_pg.h"
#include "tc_sql_array.h"
#include "txc_failpoint.h"
#include "txp_lockkey.h"
#include "txp_status.h"

#define ID_BLOCK 4096
/* Id blocks held in reserve.  A two-branch transaction takes three ids, so
 * at 7,000 transactions/s a block lasts 0.2 s: one spare fetched at half a
 * block (0.1 s of warning, on the read pool, behind whatever reads are
 * queued there) ran out under load and begins failed with "no transaction
 * id available".  Four, refilled when two are left, give 0.4 s or more. */
#define SPARE_BLOCKS 4
#define MAX_ATTEMPTS 3
#define LAZY_BATCH 64
/* Unknown outcomes (see NOTES): how often an op may see its batch's
 * connection break before it fails (each time the store was read and the
 * op found not applied), how long the reading waits for a connection (a
 * primary's failover takes up to 15 s), and how often a broken reading is
 * tried again. */
#define MAX_BROKEN 3
#define RESOLVE_WAIT_MS 30000
#define RESOLVE_READS 3
/* At most one "store connection lost" line this often (on_pool_state). */
#define LOST_LOG_MS 2000

/* The write lanes (see NOTES). */
enum { LANE_DURABLE = 0, LANE_RELAXED = 1, LANE_CLEANUP = 2, LANES = 3 };

typedef struct lane {
  tc_pg_pool_t *pool; /* NULL: the lane is off, its ops go durable */
  int writers;        /* batches in flight at most */
  int inflight;
  tc_op_t *head, *tail;
  size_t queued;
} lane_t;

struct tc_store {
  uv_loop_t *loop;
  int node_id;
  int batch_max;
  int batch_min; /* ops that justify a second concurrent batch */
  size_t queue_max;
  int lease_ms;
  int retry_min_ms, retry_max_ms;
  int max_lock_keys;

  lane_t lane[LANES];  /* group-commit batches */
  tc_pg_pool_t *rpool; /* reads */

  uv_idle_t flush_idle;
  bool idle_active;

  tc_op_t *lazy_head, *lazy_tail; /* lazy ops not yet in the main queue */
  size_t lazy_queued;
  uv_timer_t lazy_timer;          /* runs while lazy ops wait */

  /* id blocks: [next, end) in use; spare[0..nspare) fetched ahead */
  int64_t id_next, id_end, spare[SPARE_BLOCKS];
  int nspare;
  bool block_fetching;

  void (*on_ready)(int, const char *, void *);
  void *ready_arg;
  uv_timer_t ready_timer;
  bool ready_fired;

  bool closing;
  tc_parts_t close; /* the handles and pools tc_store_close waits for */

  tc_store_stats_t stats;
  uint64_t lost_logged_ms; /* the last "connection lost" line (loop time), 0: none yet */
  uint64_t lost_unlogged;  /* failures since, not logged */
};

typedef struct batch {
  tc_store_t *st;
  lane_t *lane;
  int n;
  tc_op_t **ops;           /* all ops, queue order */
  tc_op_t **by_kind[TC_OP__KINDS];
  int count[TC_OP__KINDS];
  int stmt_index[TC_OP__KINDS]; /* statement of each kind in the job, -1 if none */
  int branches_stmt;       /* DECIDE: the branch list statement */
  uint64_t started_ns;
  bool aborted_on_purpose; /* failpoint tc.store.*.aborted: the job ends in an error */
  int reads;               /* a resolution (see NOTES): readings sent so far */
} batch_t;

static void schedule_flush(tc_store_t *st);

/* -------------------------------------------------------------- results */

static tc_res_t parse_res(const char *w) {
  static const struct {
    const char *word;
    tc_res_t res;
  } map[] = {
    {"ok", TC_RES_OK},
    {"not_found", TC_RES_NOT_FOUND},
    {"not_active", TC_RES_NOT_ACTIVE},
    {"timed_out", TC_RES_TIMED_OUT},
    {"conflict", TC_RES_CONFLICT},
    {"holder_rollbacking", TC_RES_HOLDER_ROLLBACKING},
    {"decided", TC_RES_DECIDED},
    {"finished", TC_RES_FINISHED},
    {"not_expired", TC_RES_NOT_EXPIRED},
    {"branch_not_found", TC_RES_BRANCH_NOT_FOUND},
    {"failed", TC_RES_FAILED},
    {"retry", TC_RES_RETRY},
    {"not_owner", TC_RES_NOT_OWNER},
    {"compensate", TC_RES_COMPENSATE},
  };
  for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++)
    if (strcmp(map[i].word, w) == 0) return map[i].res;
  return TC_RES_NONE;
}

static void copy_str(char *dst, size_t cap, const char *src) {
  snprintf(dst, cap, "%s", src ? src : "");
}

static int get_int(const PGresult *r, int row, int col) {
  return PQgetisnull(r, row, col) ? 0 : atoi(PQgetvalue(r, row, col));
}

static int64_t get_i64(const PGresult *r, int row, int col) {
  return PQgetisnull(r, row, col) ? 0 : strtoll(PQgetvalue(r, row, col), NULL, 10);
}

/* ---------------------------------------------------------------- ops */

void tc_op_clear(tc_op_t *op) {
  free(op->branches);
  op->branches = NULL;
  op->nbranches = 0;
}

static void op_fail(tc_op_t *op, const char *msg) {
  op->status = TXP_ESTORE;
  op->res = TC_RES_NONE;
  copy_str(op->errmsg, sizeof(op->errmsg), msg);
}

const double tc_store_op_bounds[TC_STORE_OP_BUCKETS] = {0.0005, 0.001, 0.002, 0.005, 0.01,
                                                        0.02,   0.05,  0.1,   0.5,   1.0};

static void op_complete(tc_store_t *st, tc_op_t *op) {
  if (op->status != 0) st->stats.op_failures++;
  double sec = (double)(uv_hrtime() - op->queued_ns_) / 1e9;
  st->stats.op_seconds_by_kind[op->kind] += sec;
  st->stats.op_count[op->kind]++;
  for (int i = 0; i < TC_STORE_OP_BUCKETS; i++) {
    if (sec <= tc_store_op_bounds[i]) {
      st->stats.op_bucket[op->kind][i]++;
      break;
    }
  }
  op->cb(op, op->arg);
}

static void queue_push_front(lane_t *l, tc_op_t *op) {
  op->next_ = l->head;
  l->head = op;
  if (!l->tail) l->tail = op;
  l->queued++;
}

/* Begins ride the relaxed lane and phase-two records the clean-up lane,
 * when there are such lanes (both or neither). */
static lane_t *lane_of(tc_store_t *st, const tc_op_t *op) {
  if (op->kind == TC_OP_BEGIN && st->lane[LANE_RELAXED].pool) return &st->lane[LANE_RELAXED];
  if (op->kind == TC_OP_PHASE2 && st->lane[LANE_CLEANUP].pool) return &st->lane[LANE_CLEANUP];
  return &st->lane[LANE_DURABLE];
}

static size_t queued_total(const tc_store_t *st) {
  size_t n = st->lazy_queued;
  for (int i = 0; i < LANES; i++) n += st->lane[i].queued;
  return n;
}

/* Whether any lane has a batch in flight or ops waiting.  Lazy ops wait
 * while it does: with the relaxed lane on, their own lane is often idle
 * between begins, and releasing them then sent them out four at a time. */
static bool store_busy(const tc_store_t *st) {
  for (int i = 0; i < LANES; i++)
    if (st->lane[i].inflight > 0 || st->lane[i].head) return true;
  return false;
}

/* The lazy ops join their lane's queue (at its tail). */
static void lazy_release(tc_store_t *st) {
  if (!st->lazy_head) return;
  lane_t *l = lane_of(st, st->lazy_head); /* all lazy ops are PHASE2 */
  if (l->tail) l->tail->next_ = st->lazy_head;
  else l->head = st->lazy_head;
  l->tail = st->lazy_tail;
  l->queued += st->lazy_queued;
  st->lazy_head = st->lazy_tail = NULL;
  st->lazy_queued = 0;
  uv_timer_stop(&st->lazy_timer);
}

static void on_lazy_timer(uv_timer_t *t) {
  tc_store_t *st = t->data;
  lazy_release(st);
  schedule_flush(st);
}

int tc_store_submit(tc_store_t *st, tc_op_t *op) {
  if (st->closing) return TXP_ESHUTDOWN;
  if (queued_total(st) >= st->queue_max) return TXP_EBUSY;
  op->status = 0;
  op->attempts_ = 0;
  op->broken_ = 0;
  op->alone_ = false;
  op->res = TC_RES_NONE;
  op->errmsg[0] = '\0';
  op->next_ = NULL;
  op->queued_ns_ = uv_hrtime();
  lane_t *l = lane_of(st, op);
  if (op->lazy && store_busy(st)) {
    /* Busy: wait for a fuller batch (see NOTES). */
    if (st->lazy_tail) st->lazy_tail->next_ = op;
    else st->lazy_head = op;
    st->lazy_tail = op;
    if (++st->lazy_queued >= LAZY_BATCH) {
      lazy_release(st);
      schedule_flush(st);
    } else if (st->lazy_queued == 1) {
      uv_timer_start(&st->lazy_timer, on_lazy_timer, TC_STORE_LAZY_MS, 0);
    }
    return 0;
  }
  if (l->tail) l->tail->next_ = op;
  else l->head = op;
  l->tail = op;
  l->queued++;
  if (queued_total(st) > st->stats.queue_peak) st->stats.queue_peak = queued_total(st);
  schedule_flush(st);
  return 0;
}

/* ------------------------------------------------------------- building */

static int cmp_op_xid(const void *a, const void *b) {
  const tc_op_t *x = *(tc_op_t *const *)a, *y = *(tc_op_t *const *)b;
  int c = strcmp(x->xid, y->xid);
  if (c) return c;
  return x->id < y->id ? -1 : x->id > y->id;
}

static int add_stmt(tc_pg_job_t *job, const char *name, const char *sql, tc_sql_array_t *arrs, int narrs,
                    const char *const *extra, int nextra) {
  const char *vals[16];
  for (int i = 0; i < narrs; i++) {
    vals[i] = tc_sql_array_end(&arrs[i]);
    if (!vals[i]) return -1;
  }
  for (int i = 0; i < nextra; i++) vals[narrs + i] = extra[i];
  return tc_pg_job_add_prepared(job, name, sql, narrs + nextra, vals);
}

/* A batch statement's builder: it fills the arrays 'a' from the batch's
 * ops and adds its statement over them to 'job'. */
typedef int (*build_fn)(tc_store_t *st, batch_t *b, tc_pg_job_t *job, tc_sql_array_t *a);

/* Run 'build' with 'narrs' fresh arrays (at most 14, tc_register_batch's),
 * freed once its statement is in the job. */
static int build_with_arrays(tc_store_t *st, batch_t *b, tc_pg_job_t *job, int narrs, build_fn build) {
  tc_sql_array_t a[14];
  for (int i = 0; i < narrs; i++) tc_sql_array_init(&a[i]);
  int rc = build(st, b, job, a);
  for (int i = 0; i < narrs; i++) tc_sql_array_free(&a[i]);
  return rc;
}

/* Registrations of the batch that begin their global too (tc_op_t
 * begin_txid): their begins are items of the batch's tc_begin_batch,
 * after its own begins, so their globals exist when tc_register_batch
 * runs, in the same transaction. */
static int begin_parts(const batch_t *b) {
  int n = 0;
  for (int i = 0; i < b->count[TC_OP_REGISTER]; i++) n += b->by_kind[TC_OP_REGISTER][i]->begin_txid != 0;
  return n;
}

/* One item of tc_begin_batch's arrays. */
static void begin_item(tc_sql_array_t *a, const char *xid, int64_t txid, uint32_t timeout_ms, const char *name,
                       const char *app_id, const char *group, const char *idem_key) {
  tc_sql_array_add(&a[0], xid);
  tc_sql_array_add_i64(&a[1], txid);
  tc_sql_array_add_i64(&a[2], timeout_ms);
  tc_sql_array_add(&a[3], name);
  tc_sql_array_add(&a[4], app_id);
  tc_sql_array_add(&a[5], group);
  tc_sql_array_add(&a[6], idem_key);
}

static int build_begin(tc_store_t *st, batch_t *b, tc_pg_job_t *job, tc_sql_array_t *a) {
  for (int i = 0; i < b->count[TC_OP_BEGIN]; i++) {
    tc_op_t *op = b->by_kind[TC_OP_BEGIN][i];
    begin_item(a, op->xid, op->id, op->timeout_ms, op->name, op->app_id, op->group, op->idem_key);
  }
  /* (take_begin reads only the items of the batch's own begins; a
   * registration's begin that failed fails the whole transaction.) */
  for (int i = 0; i < b->count[TC_OP_REGISTER]; i++) {
    tc_op_t *op = b->by_kind[TC_OP_REGISTER][i];
    if (op->begin_txid)
      begin_item(a, op->xid, op->begin_txid, op->begin_timeout_ms, op->begin_name,
                 op->begin_app_id ? op->begin_app_id : op->app_id, op->begin_app_id ? op->begin_group : op->group,
                 op->begin_idem_key);
  }
  char node[16];
  snprintf(node, sizeof(node), "%d", st->node_id);
  const char *extra[] = {node};
  return add_stmt(job, "tc_begin",
                  "SELECT item, xid, result FROM tc_begin_batch($1::text[], $2::bigint[], "
                  "$3::int[], $4::text[], $5::text[], $6::text[], $7::text[], $8::int)",
                  a, 7, extra, 1);
}

static int build_register(tc_store_t *st, batch_t *b, tc_pg_job_t *job, tc_sql_array_t *a) {
  int rc = 0;
  for (int i = 0; i < b->count[TC_OP_REGISTER] && rc == 0; i++) {
    tc_op_t *op = b->by_kind[TC_OP_REGISTER][i];
    tc_sql_array_add(&a[0], op->xid);
    tc_sql_array_add_i64(&a[1], op->id);
    tc_sql_array_add(&a[2], op->resource_id);
    tc_sql_array_add_i64(&a[3], op->branch_type);
    tc_sql_array_add(&a[4], op->lock_keys);
    tc_sql_array_add(&a[5], op->app_data);
    tc_sql_array_add(&a[6], op->client_id);
    tc_sql_array_add(&a[7], op->idem_key);
    tc_sql_array_add(&a[8], op->app_id);
    tc_sql_array_add(&a[9], op->group);
    if (op->lock_keys && op->lock_keys[0]) {
      tc_lock_rows_t c = {&a[10], &a[11], &a[12], &a[13], i + 1, op->resource_id};
      if (txp_lockkeys_each(op->lock_keys, (size_t)st->max_lock_keys, tc_lock_rows_add, &c) < 0)
        rc = -1; /* validated by the caller: only a bug gets here */
    }
  }
  if (rc == 0)
    rc = add_stmt(job, "tc_register",
                  "SELECT item, result, branch_id, holder, holder_status FROM tc_register_batch("
                  "$1::text[], $2::bigint[], $3::text[], $4::smallint[], $5::text[], $6::text[], "
                  "$7::text[], $8::text[], $9::text[], $10::text[], $11::int[], $12::text[], "
                  "$13::text[], $14::text[])",
                  a, 14, NULL, 0);
  return rc;
}

/* The branches of the xids $1, in xid order (COLLATE "C": attach_branches
 * merges these rows with the ops sorted by strcmp(), which the database's
 * default collation need not agree with). */
#define SQL_DECIDE_BRANCHES                                                          \
  "SELECT xid, branch_id, branch_type, status, resource_id, client_id, "              \
  "application_data IS NOT DISTINCT FROM '" TXP_APP_DATA_PHASE2_SYNC "', "           \
  "application_id, app_group "                                                        \
  "FROM branch_table WHERE xid = ANY($1::text[]) "                                    \
  "ORDER BY xid COLLATE \"C\", branch_id"

/* The same rows, read by the decision batch after it locked the globals
 * (sql/tc/010_commit_at_decision.sql). */
#define SQL_DECIDE_LOCK                                                               \
  "SELECT xid, branch_id, branch_type, status, resource_id, client_id, phase2_sync, " \
  "application_id, app_group FROM tc_decide_lock($1::text[])"

static int build_decide(tc_store_t *st, batch_t *b, tc_pg_job_t *job, tc_sql_array_t *a) {
  static const char *const action_words[] = {"commit", "rollback", "timeout"};
  for (int i = 0; i < b->count[TC_OP_DECIDE]; i++) {
    tc_op_t *op = b->by_kind[TC_OP_DECIDE][i];
    tc_sql_array_add(&a[0], op->xid);
    tc_sql_array_add(&a[1], action_words[op->action]);
    tc_sql_array_add(&a[2], op->group ? op->app_id : NULL);
    tc_sql_array_add(&a[3], op->group);
  }
  char lease[16];
  snprintf(lease, sizeof(lease), "%d", st->lease_ms);
  const char *extra[] = {lease};
  /* First the globals' lock and their branches (tc_decide_lock): a
   * decision may delete them (an AT commit is finished at once, sql/tc/010),
   * and tcd still tells each branch. */
  const char *xids = tc_sql_array_end(&a[0]);
  int rc = -1;
  if (xids) {
    const char *v[] = {xids};
    rc = tc_pg_job_add_prepared(job, "tc_decide_lock", SQL_DECIDE_LOCK, 1, v);
  }
  if (rc == 0)
    rc = add_stmt(job, "tc_decide",
                  "SELECT item, result, status FROM tc_decide_batch($1::text[], $2::text[], "
                  "$3::text[], $4::text[], $5::int)",
                  a, 4, extra, 1);
  return rc;
}

static int build_phase2(tc_store_t *st, batch_t *b, tc_pg_job_t *job, tc_sql_array_t *a) {
  for (int i = 0; i < b->count[TC_OP_PHASE2]; i++) {
    tc_op_t *op = b->by_kind[TC_OP_PHASE2][i];
    tc_sql_array_add(&a[0], op->xid);
    tc_sql_array_add_i64(&a[1], op->id);
    tc_sql_array_add_i64(&a[2], op->branch_status);
    tc_sql_array_add(&a[3], op->error);
    /* A report (the caller's identity given) is checked; phase-two
     * outcomes, the coordinator's own, are not. */
    tc_sql_array_add(&a[4], op->group ? op->app_id : NULL);
    tc_sql_array_add(&a[5], op->group ? op->client_id : NULL);
    tc_sql_array_add(&a[6], op->group);
  }
  char rmin[16], rmax[16];
  snprintf(rmin, sizeof(rmin), "%d", st->retry_min_ms);
  snprintf(rmax, sizeof(rmax), "%d", st->retry_max_ms);
  const char *extra[] = {rmin, rmax};
  return add_stmt(job, "tc_phase2",
                  "SELECT item, result, global_status, finished FROM tc_phase2_batch("
                  "$1::text[], $2::bigint[], $3::smallint[], $4::text[], $5::text[], $6::text[], "
                  "$7::text[], $8::int, $9::int)",
                  a, 7, extra, 2);
}

/* ------------------------------------------------------------- results */

/* Hand each row of a batch statement's result 'r' (item, ...) to 'take'
 * with the op of 'kind' that its item (from 1) names; a row that names
 * none is passed over. */
static void take_items(batch_t *b, tc_op_kind_t kind, const PGresult *r,
                       void (*take)(tc_op_t *op, const PGresult *r, int row)) {
  for (int row = 0; row < PQntuples(r); row++) {
    int item = get_int(r, row, 0);
    if (item >= 1 && item <= b->count[kind]) take(b->by_kind[kind][item - 1], r, row);
  }
}

static void take_begin(tc_op_t *op, const PGresult *r, int row) {
  copy_str(op->out_xid, sizeof(op->out_xid), PQgetvalue(r, row, 1));
  op->res = parse_res(PQgetvalue(r, row, 2));
}

static void take_register(tc_op_t *op, const PGresult *r, int row) {
  op->res = parse_res(PQgetvalue(r, row, 1));
  op->out_id = get_i64(r, row, 2);
  copy_str(op->holder, sizeof(op->holder), PQgetvalue(r, row, 3));
  op->holder_status = get_int(r, row, 4);
  if (op->res == TC_RES_NOT_ACTIVE) op->global_status = op->holder_status;
}

static void take_decide(tc_op_t *op, const PGresult *r, int row) {
  op->res = parse_res(PQgetvalue(r, row, 1));
  op->global_status = get_int(r, row, 2);
}

static void take_phase2(tc_op_t *op, const PGresult *r, int row) {
  op->res = parse_res(PQgetvalue(r, row, 1));
  op->global_status = get_int(r, row, 2);
  op->finished = PQgetvalue(r, row, 3)[0] == 't';
}

/* The branches to drive of the decisions just made ('br': rows of
 * tc_decide_branches, in xid order like the ops). */
static void attach_branches(batch_t *b, const PGresult *br) {
  /* Both sides are in xid order: merge.  Only ops whose decision was just
   * made get branches to drive (a repeated commit must not drive twice). */
  int nrows = PQntuples(br), row = 0;
  for (int i = 0; i < b->count[TC_OP_DECIDE]; i++) {
    tc_op_t *op = b->by_kind[TC_OP_DECIDE][i];
    while (row < nrows && strcmp(PQgetvalue(br, row, 0), op->xid) < 0) row++;
    int first = row, last = row;
    while (last < nrows && strcmp(PQgetvalue(br, last, 0), op->xid) == 0) last++;
    if (op->res != TC_RES_OK && op->res != TC_RES_TIMED_OUT) continue;
    if (last == first || op->branches) continue;
    op->branches = calloc((size_t)(last - first), sizeof(tc_branch_row_t));
    if (!op->branches) {
      op_fail(op, "out of memory");
      continue;
    }
    for (int k = first; k < last; k++) {
      tc_branch_row_t *bw = &op->branches[op->nbranches++];
      bw->branch_id = get_i64(br, k, 1);
      bw->branch_type = get_int(br, k, 2);
      bw->status = get_int(br, k, 3);
      copy_str(bw->resource_id, sizeof(bw->resource_id), PQgetvalue(br, k, 4));
      copy_str(bw->client_id, sizeof(bw->client_id), PQgetvalue(br, k, 5));
      bw->phase2_sync = strcmp(PQgetvalue(br, k, 6), "t") == 0;
      copy_str(bw->application_id, sizeof(bw->application_id), PQgetvalue(br, k, 7));
      copy_str(bw->app_group, sizeof(bw->app_group), PQgetvalue(br, k, 8));
    }
  }
}

/* ------------------------------------------------------------- batches */

static void batch_free(batch_t *b) {
  for (int k = 0; k < TC_OP__KINDS; k++) free(b->by_kind[k]);
  free(b->ops);
  free(b);
}

/* ------------------------------------------------------ unknown outcomes */

/* Whether one of the failpoints of the kinds this batch carries fires
 * (action "fail"); each kind present hits its own point. */
static bool batch_fault(const batch_t *b, const char *begin_fp, const char *register_fp,
                        const char *decide_fp) {
  (void)begin_fp, (void)register_fp, (void)decide_fp; /* unused without failpoints */
  bool fired = false;
  if (b->count[TC_OP_BEGIN] && TXC_FAILPOINT_FAILS(begin_fp)) fired = true;
  if (b->count[TC_OP_REGISTER] && TXC_FAILPOINT_FAILS(register_fp)) fired = true;
  if (b->count[TC_OP_DECIDE] && TXC_FAILPOINT_FAILS(decide_fp)) fired = true;
  return fired;
}

static void resolve_send(batch_t *r);

/* Ends a resolution's op that the reading found applied, or that cannot
 * be resolved ('why' set: it fails with it). */
static void resolve_end(tc_store_t *st, tc_op_t *op, const char *why) {
  if (why) {
    op_fail(op, why);
    st->stats.unknown_failed++;
  } else {
    st->stats.unknown_applied++;
  }
  op_complete(st, op);
}

/* Fails every op of a resolution that could not read the store. */
static void resolve_give_up(batch_t *r, const char *why) {
  char msg[256];
  snprintf(msg, sizeof(msg),
           "store connection lost in flight and the outcome could not be read back (%s): "
           "unknown, retry with the same idempotency key or ask the status",
           why);
  for (int i = 0; i < r->n; i++) resolve_end(r->st, r->ops[i], msg);
  batch_free(r);
}

/* Moves the ops of 'b' whose outcome a reading can tell (begins,
 * registrations, decisions; phase-two records stay in 'b' and fail: see
 * NOTES) into a resolution, and sends its reading. */
static void resolve_take(tc_store_t *st, lane_t *lane, batch_t *b) {
  batch_t *r = calloc(1, sizeof(*r));
  if (r) r->ops = calloc((size_t)b->n, sizeof(tc_op_t *));
  if (!r || !r->ops) {
    free(r);
    return; /* the ops fail with "outcome unknown", as without this */
  }
  r->st = st;
  r->lane = lane;
  for (int i = 0; i < b->n; i++) {
    tc_op_t *op = b->ops[i];
    if (!op || op->kind == TC_OP_PHASE2) continue;
    op->broken_++;
    r->ops[r->n++] = op;
    r->count[op->kind]++;
    b->ops[i] = NULL;
  }
  for (int k = 0; k < TC_OP__KINDS; k++) {
    r->stmt_index[k] = -1;
    if (!r->count[k]) continue;
    r->by_kind[k] = calloc((size_t)r->count[k], sizeof(tc_op_t *));
    if (!r->by_kind[k]) {
      resolve_give_up(r, "out of memory");
      return;
    }
    int j = 0;
    for (int i = 0; i < r->n; i++)
      if (r->ops[i]->kind == (tc_op_kind_t)k) r->by_kind[k][j++] = r->ops[i];
  }
  if (r->count[TC_OP_DECIDE] > 1)
    qsort(r->by_kind[TC_OP_DECIDE], (size_t)r->count[TC_OP_DECIDE], sizeof(tc_op_t *), cmp_op_xid);
  if (r->n == 0) {
    batch_free(r);
    return;
  }
  tc_log_warn("store batch of %d op(s) lost its connection in flight: reading the store to "
              "resolve %d of them",
              b->n, r->n);
  resolve_send(r);
}

/* Whether global status 's' is the outcome of decision 'a'. */
static bool status_is_outcome_of(int s, tc_decide_action_t a) {
  return a == TC_DECIDE_COMMIT ? txp_global_status_is_commit(s) : txp_global_status_is_rollback(s);
}

static void on_resolved(tc_pg_job_t *job, int status, void *arg) {
  batch_t *r = arg;
  tc_store_t *st = r->st;
  if (status != TC_PG_OK) {
    if (status == TC_PG_EBROKEN && !st->closing && r->reads < RESOLVE_READS) {
      resolve_send(r);
      return;
    }
    resolve_give_up(r, status == TC_PG_ESTMT ? tc_pg_job_error(job)
                       : status == TC_PG_ENOCONN ? "no store connection in time"
                       : status == TC_PG_ECLOSING ? "shutting down"
                                                  : "store connection lost again");
    return;
  }
  /* What the reading found applied is answered as its batch would have;
   * the rest did not happen and runs again. */
  bool *applied = calloc((size_t)r->n > 0 ? (size_t)r->n : 1, sizeof(bool));
  if (!applied) {
    resolve_give_up(r, "out of memory");
    return;
  }
  for (int k = TC_OP_BEGIN; k <= TC_OP_DECIDE; k++) {
    if (r->stmt_index[k] < 0) continue;
    const PGresult *res = tc_pg_job_result(job, r->stmt_index[k]);
    for (int row = 0; row < PQntuples(res); row++) {
      int item = get_int(res, row, 0);
      if (item < 1 || item > r->count[k]) continue;
      tc_op_t *op = r->by_kind[k][item - 1];
      if (k == TC_OP_DECIDE) {
        /* Decided, by this op or another one to the same effect, and this
         * caller may decide it: the decision stands.  Anything else runs
         * again (still active: it was not taken; a crossing decision or a
         * stranger: the function gives the answer). */
        if (PQgetisnull(res, row, 1) || PQgetvalue(res, row, 2)[0] != 't') continue;
        int gs = get_int(res, row, 1);
        if (gs == TXP_GS_BEGIN || !status_is_outcome_of(gs, op->action)) continue;
        op->res = TC_RES_OK;
        op->global_status = gs;
      } else {
        if (PQgetvalue(res, row, 1)[0] != 't') continue;
        op->res = TC_RES_OK;
        if (k == TC_OP_BEGIN) copy_str(op->out_xid, sizeof(op->out_xid), op->xid);
        else op->out_id = op->id;
      }
      for (int i = 0; i < r->n; i++)
        if (r->ops[i] == op) applied[i] = true;
    }
  }
  if (r->stmt_index[TC_OP_DECIDE] >= 0) attach_branches(r, tc_pg_job_result(job, r->branches_stmt));

  /* Not applied: back to the head of the lane, in queue order. */
  bool requeued = false;
  for (int i = r->n - 1; i >= 0; i--) {
    tc_op_t *op = r->ops[i];
    if (applied[i]) continue;
    r->ops[i] = NULL;
    if (op->broken_ >= MAX_BROKEN || st->closing) {
      char msg[256];
      snprintf(msg, sizeof(msg),
               "store connection lost in flight %d time(s); the store was read back and nothing "
               "of this request is recorded: retry",
               op->broken_);
      resolve_end(st, op, msg);
      continue;
    }
    op->res = TC_RES_NONE;
    op->status = 0;
    op->errmsg[0] = '\0';
    queue_push_front(r->lane, op);
    st->stats.unknown_redone++;
    requeued = true;
  }
  for (int i = 0; i < r->n; i++) {
    if (!r->ops[i]) continue;
    if (r->ops[i]->status != 0) { /* attach_branches ran out of memory */
      st->stats.unknown_failed++;
      op_complete(st, r->ops[i]);
    } else {
      resolve_end(st, r->ops[i], NULL);
    }
  }
  free(applied);
  batch_free(r);
  if (requeued) schedule_flush(st);
}

/* The reading asks, for each kind of op that the batch has, which of its
 * ops the store holds: one statement over arrays of the ops ('items'
 * fills them), whose rows are (index in the batch, ...). */
typedef struct resolve_stmt {
  tc_op_kind_t kind;
  const char *name, *sql;
  int narrs;
  void (*items)(const batch_t *r, tc_sql_array_t *a);
} resolve_stmt_t;

static void resolve_begin_items(const batch_t *r, tc_sql_array_t *a) {
  for (int i = 0; i < r->count[TC_OP_BEGIN]; i++) tc_sql_array_add(&a[0], r->by_kind[TC_OP_BEGIN][i]->xid);
}

static void resolve_register_items(const batch_t *r, tc_sql_array_t *a) {
  for (int i = 0; i < r->count[TC_OP_REGISTER]; i++) {
    tc_sql_array_add(&a[0], r->by_kind[TC_OP_REGISTER][i]->xid);
    tc_sql_array_add_i64(&a[1], r->by_kind[TC_OP_REGISTER][i]->id);
  }
}

static void resolve_decide_items(const batch_t *r, tc_sql_array_t *a) {
  for (int i = 0; i < r->count[TC_OP_DECIDE]; i++) {
    const tc_op_t *op = r->by_kind[TC_OP_DECIDE][i];
    tc_sql_array_add(&a[0], op->xid);
    tc_sql_array_add(&a[1], op->group ? op->app_id : NULL);
    tc_sql_array_add(&a[2], op->group);
  }
}

static const resolve_stmt_t resolve_stmts[] = {
  {TC_OP_BEGIN, "tc_resolve_begin",
   "SELECT u.i::int, EXISTS (SELECT 1 FROM global_table g WHERE g.xid = u.x) "
   "OR EXISTS (SELECT 1 FROM global_history h WHERE h.xid = u.x) "
   "FROM unnest($1::text[]) WITH ORDINALITY AS u(x, i)",
   1, resolve_begin_items},
  {TC_OP_REGISTER, "tc_resolve_register",
   "SELECT u.i::int, EXISTS (SELECT 1 FROM branch_table b "
   "WHERE b.branch_id = u.b AND b.xid = u.x) "
   "FROM unnest($1::text[], $2::bigint[]) WITH ORDINALITY AS u(x, b, i)",
   2, resolve_register_items},
  {TC_OP_DECIDE, "tc_resolve_decide",
   "SELECT u.i::int, g.status, "
   "tc__may_decide(g.xid, g.application_id, g.app_group, u.ap, u.gr) "
   "FROM unnest($1::text[], $2::text[], $3::text[]) "
   "WITH ORDINALITY AS u(x, ap, gr, i) "
   "LEFT JOIN global_table g ON g.xid = u.x",
   3, resolve_decide_items},
};

/* Add the reading's statement 's' to 'job' as its statement '*stmt'
 * (r->stmt_index); DECIDE's is followed by the branches of its xids
 * (r->branches_stmt), which the reading hands back with the decisions. */
static int add_resolve_stmt(tc_pg_job_t *job, batch_t *r, const resolve_stmt_t *s, int *stmt) {
  tc_sql_array_t a[3];
  for (int i = 0; i < 3; i++) tc_sql_array_init(&a[i]);
  s->items(r, a);
  r->stmt_index[s->kind] = (*stmt)++;
  if (s->kind == TC_OP_DECIDE) r->branches_stmt = (*stmt)++;
  int rc = add_stmt(job, s->name, s->sql, a, s->narrs, NULL, 0);
  if (rc == 0 && s->kind == TC_OP_DECIDE) {
    const char *v[] = {tc_sql_array_end(&a[0])};
    rc = tc_pg_job_add_prepared(job, "tc_decide_branches", SQL_DECIDE_BRANCHES, 1, v);
  }
  for (int i = 0; i < 3; i++) tc_sql_array_free(&a[i]);
  return rc;
}

/* The reading: which of the ops is recorded in the store (on a reader
 * connection, which reaches the primary that takes the writes now). */
static void resolve_send(batch_t *r) {
  tc_store_t *st = r->st;
  r->reads++;
  /* A transaction with an id of its own: its COMMIT (synchronous_commit
   * is on for readers) flushes the WAL up to itself, so what the reading
   * saw is durable once the job returns (NOTES). */
  tc_pg_job_t *job = tc_pg_job_new(TC_PG_JOB_TXN, on_resolved, r);
  int rc = job ? tc_pg_job_add(job, "SELECT pg_catalog.pg_current_xact_id()", 0, NULL) : -1, stmt = 1;
  for (size_t i = 0; rc == 0 && i < sizeof(resolve_stmts) / sizeof(resolve_stmts[0]); i++)
    if (r->count[resolve_stmts[i].kind]) rc = add_resolve_stmt(job, r, &resolve_stmts[i], &stmt);
  if (rc == 0) rc = tc_pg_submit(st->rpool, job, RESOLVE_WAIT_MS);
  if (rc != 0) {
    if (job) tc_pg_job_free(job);
    resolve_give_up(r, "could not queue the reading");
  }
}

static void on_batch_done(tc_pg_job_t *job, int status, void *arg) {
  batch_t *b = arg;
  tc_store_t *st = b->st;
  lane_t *lane = b->lane;
  lane->inflight--;
  st->stats.batches++;
  st->stats.ops += (uint64_t)b->n;
  st->stats.batch_ms_total += tc_pg_job_elapsed_ms(job);

  /* The fault suite's stand-ins for a connection lost before the COMMIT
   * (the job's last statement failed on purpose: nothing committed) and
   * for a COMMIT whose answer was lost (committed, results dropped). */
  if (status == TC_PG_ESTMT && b->aborted_on_purpose)
    status = TC_PG_EBROKEN;
  else if (status == TC_PG_OK && batch_fault(b, "tc.store.begin.reply_lost", "tc.store.register.reply_lost",
                                             "tc.store.decide.reply_lost"))
    status = TC_PG_EBROKEN;
  if (status == TC_PG_EBROKEN) st->stats.unknown_batches++;

  if (status == TC_PG_OK) {
    static void (*const take[TC_OP__KINDS])(tc_op_t *op, const PGresult *r, int row) = {
      [TC_OP_BEGIN] = take_begin,
      [TC_OP_REGISTER] = take_register,
      [TC_OP_DECIDE] = take_decide,
      [TC_OP_PHASE2] = take_phase2,
    };
    for (int k = 0; k < TC_OP__KINDS; k++) {
      if (b->stmt_index[k] < 0) continue;
      take_items(b, k, tc_pg_job_result(job, b->stmt_index[k]), take[k]);
      const PGresult *br = k == TC_OP_DECIDE ? tc_pg_job_result(job, b->branches_stmt) : NULL;
      if (br) attach_branches(b, br); /* the decisions' branches, before the next kind */
    }
    for (int i = 0; i < b->n; i++) {
      if (b->ops[i]->res == TC_RES_NONE && b->ops[i]->status == 0)
        op_fail(b->ops[i], "store returned no row for the request");
    }
  } else {
    const char *sqlstate = status == TC_PG_ESTMT ? tc_pg_job_sqlstate(job) : "";
    bool transient = strcmp(sqlstate, "40P01") == 0 || strcmp(sqlstate, "40001") == 0;
    if (transient) st->stats.deadlocks++;
    /* Requeue at the head, in original order, when another attempt can
     * help: a transient conflict (the whole batch again, a bounded number
     * of times), or a statement error in a batch of several (then each op
     * runs alone, so that one bad op fails alone). */
    if (!st->closing && status == TC_PG_ESTMT && (transient || b->n > 1)) {
      for (int i = b->n - 1; i >= 0; i--) {
        tc_op_t *op = b->ops[i];
        if (transient ? ++op->attempts_ < MAX_ATTEMPTS : !op->alone_) {
          if (!transient) op->alone_ = true;
          queue_push_front(lane, op);
          b->ops[i] = NULL;
        }
      }
      st->stats.batch_retries++;
    }
    /* Outcome unknown: read the store rather than guess (NOTES).  An op
     * that ran again after such a reading and met a unique violation may
     * find its first run committed after all (the old connection's
     * transaction ended late): read again. */
    if (!st->closing && (status == TC_PG_EBROKEN ||
                         (status == TC_PG_ESTMT && strcmp(sqlstate, "23505") == 0 && b->n == 1 &&
                          b->ops[0] && b->ops[0]->broken_ > 0)))
      resolve_take(st, lane, b);
    char msg[256];
    if (status == TC_PG_EBROKEN)
      snprintf(msg, sizeof(msg), "store connection lost in flight: outcome unknown, retry");
    else if (status == TC_PG_ESTMT)
      snprintf(msg, sizeof(msg), "store error: %s", tc_pg_job_error(job));
    else
      snprintf(msg, sizeof(msg), "store unavailable (code %d)", status);
    if (status == TC_PG_ESTMT && !transient && b->n == 1 && b->ops[0])
      tc_log_warn("could not run store batch: %s", tc_pg_job_error(job));
    for (int i = 0; i < b->n; i++)
      if (b->ops[i]) op_fail(b->ops[i], msg);
  }

  /* Callbacks may submit new ops: they queue behind what is there. */
  for (int i = 0; i < b->n; i++)
    if (b->ops[i]) op_complete(st, b->ops[i]);
  batch_free(b);
  if (st->lazy_head && !store_busy(st)) lazy_release(st); /* idle: no reason to wait */
  schedule_flush(st);
}

/* Take up to batch_max ops off the queue (ops that must run alone are
 * taken alone) and submit them as one transaction. */
static int flush_one(tc_store_t *st, lane_t *lane) {
  batch_t *b = calloc(1, sizeof(*b));
  int cap = st->batch_max;
  if (!b || !(b->ops = calloc((size_t)cap, sizeof(tc_op_t *)))) {
    free(b);
    return -1;
  }
  b->st = st;
  b->lane = lane;
  bool alone = lane->head && lane->head->alone_;
  while (lane->head && b->n < cap) {
    tc_op_t *op = lane->head;
    if (b->n > 0 && op->alone_) break; /* runs in a batch of its own */
    lane->head = op->next_;
    if (!lane->head) lane->tail = NULL;
    lane->queued--;
    op->next_ = NULL;
    b->ops[b->n++] = op;
    b->count[op->kind]++;
    if (alone) break;
  }
  for (int k = 0; k < TC_OP__KINDS; k++) {
    b->stmt_index[k] = -1;
    if (!b->count[k]) continue;
    b->by_kind[k] = calloc((size_t)b->count[k], sizeof(tc_op_t *));
    if (!b->by_kind[k]) goto fail_alloc;
    int j = 0;
    for (int i = 0; i < b->n; i++)
      if (b->ops[i]->kind == (tc_op_kind_t)k) b->by_kind[k][j++] = b->ops[i];
  }
  /* Row locks on global rows are taken in xid order by the decision and
   * phase-two functions, so two batches cannot deadlock on each other. */
  if (b->count[TC_OP_DECIDE] > 1)
    qsort(b->by_kind[TC_OP_DECIDE], (size_t)b->count[TC_OP_DECIDE], sizeof(tc_op_t *), cmp_op_xid);
  if (b->count[TC_OP_PHASE2] > 1)
    qsort(b->by_kind[TC_OP_PHASE2], (size_t)b->count[TC_OP_PHASE2], sizeof(tc_op_t *), cmp_op_xid);

  tc_pg_job_t *job = tc_pg_job_new(TC_PG_JOB_TXN, on_batch_done, b);
  if (!job) goto fail_alloc;
  int stmt = 0, rc = 0;
  if ((b->count[TC_OP_BEGIN] || begin_parts(b)) && rc == 0) {
    b->stmt_index[TC_OP_BEGIN] = stmt++;
    rc = build_with_arrays(st, b, job, 7, build_begin);
  }
  if (b->count[TC_OP_REGISTER] && rc == 0) {
    b->stmt_index[TC_OP_REGISTER] = stmt++;
    rc = build_with_arrays(st, b, job, 14, build_register);
  }
  if (b->count[TC_OP_DECIDE] && rc == 0) {
    b->branches_stmt = stmt++;
    b->stmt_index[TC_OP_DECIDE] = stmt++;
    rc = build_with_arrays(st, b, job, 4, build_decide);
  }
  if (b->count[TC_OP_PHASE2] && rc == 0) {
    b->stmt_index[TC_OP_PHASE2] = stmt++;
    rc = build_with_arrays(st, b, job, 7, build_phase2);
  }
  if (rc == 0 && batch_fault(b, "tc.store.begin.aborted", "tc.store.register.aborted", "tc.store.decide.aborted")) {
    b->aborted_on_purpose = true; /* see on_batch_done */
    rc = tc_pg_job_add(job, "SELECT 1 / 0", 0, NULL);
  }
  if (rc != 0) {
    tc_pg_job_free(job);
    goto fail_alloc;
  }
  for (int k = 0; k < TC_OP__KINDS; k++) st->stats.ops_by_kind[k] += (uint64_t)b->count[k];
  lane->inflight++;
  rc = tc_pg_submit(lane->pool, job, 5000);
  if (rc != 0) {
    lane->inflight--;
    tc_pg_job_free(job);
    for (int i = 0; i < b->n; i++) {
      op_fail(b->ops[i], "store queue refused the batch");
      op_complete(st, b->ops[i]);
    }
    batch_free(b);
  }
  return 0;

fail_alloc:
  for (int i = 0; i < b->n; i++) {
    op_fail(b->ops[i], "could not build the store batch: out of memory or bad input");
    op_complete(st, b->ops[i]);
  }
  batch_free(b);
  return -1;
}

/* Whether another batch should start now.  With no batch in flight, yes:
 * latency first.  With one in flight, only once enough ops have queued to
 * be worth a transaction of their own: a batch's fixed cost (a handful of
 * statements whatever its size) dominates small batches, so two half-empty
 * transactions cost PostgreSQL more CPU than one full one, and the ops
 * waiting now will ride the next batch a few milliseconds later anyway. */
static bool want_batch(const tc_store_t *st, const lane_t *l) {
  if (!l->head || st->closing || l->inflight >= l->writers) return false;
  return l->inflight == 0 || l->queued >= (size_t)st->batch_min;
}

static bool any_batch(const tc_store_t *st) {
  for (int i = 0; i < LANES; i++)
    if (want_batch(st, &st->lane[i])) return true;
  return false;
}

static void on_flush_idle(uv_idle_t *h) {
  tc_store_t *st = h->data;
  for (int i = 0; i < LANES; i++)
    while (want_batch(st, &st->lane[i])) flush_one(st, &st->lane[i]);
  uv_idle_stop(&st->flush_idle);
  st->idle_active = false;
}

static void schedule_flush(tc_store_t *st) {
  if (st->idle_active || !any_batch(st)) return;
  uv_idle_start(&st->flush_idle, on_flush_idle);
  st->idle_active = true;
}

/* ------------------------------------------------------------------ ids */

static void fetch_block(tc_store_t *st);

static void fire_ready(tc_store_t *st, int status, const char *err) {
  if (st->ready_fired) return;
  st->ready_fired = true;
  uv_timer_stop(&st->ready_timer);
  if (st->on_ready) st->on_ready(status, err, st->ready_arg);
}

static void use_block(tc_store_t *st, int64_t block) {
  st->id_next = block * ID_BLOCK;
  st->id_end = st->id_next + ID_BLOCK;
  if (st->id_next == 0) st->id_next = 1; /* id 0 is never used */
}

static void on_block(tc_pg_job_t *job, int status, void *arg) {
  tc_store_t *st = arg;
  st->block_fetching = false;
  if (status != TC_PG_OK) {
    if (!st->closing) tc_log_warn("could not reserve an id block: %s", tc_pg_job_error(job));
    return; /* retried on the next tc_store_next_id or ready timer tick */
  }
  const PGresult *r = tc_pg_job_result(job, 0);
  for (int row = 0; row < PQntuples(r); row++) {
    int64_t block = get_i64(r, row, 0);
    if (st->id_next >= st->id_end) use_block(st, block);
    else if (st->nspare < SPARE_BLOCKS) st->spare[st->nspare++] = block;
  }
  fire_ready(st, 0, NULL);
}

/* Reserve blocks until SPARE_BLOCKS are held (one round trip). */
static void fetch_block(tc_store_t *st) {
  if (st->block_fetching || st->closing) return;
  int want = SPARE_BLOCKS - st->nspare + (st->id_next >= st->id_end ? 1 : 0);
  char n[16];
  snprintf(n, sizeof(n), "%d", want);
  const char *params[] = {n};
  tc_pg_job_t *job = tc_pg_job_new(0, on_block, st);
  if (!job) return;
  if (tc_pg_job_add(job, "SELECT nextval('tc_id_block_seq') FROM generate_series(1, $1::int)", 1,
                    params) != 0 ||
      tc_pg_submit(st->rpool, job, 10000) != 0) {
    tc_pg_job_free(job);
    return;
  }
  st->block_fetching = true;
}

int tc_store_next_id(tc_store_t *st, int64_t *out) {
  if (st->id_next >= st->id_end) {
    if (st->nspare == 0) {
      fetch_block(st);
      return TXP_ESTORE;
    }
    use_block(st, st->spare[0]);
    memmove(st->spare, st->spare + 1, (size_t)(--st->nspare) * sizeof(st->spare[0]));
  }
  *out = st->id_next++;
  if (st->nspare <= SPARE_BLOCKS / 2) fetch_block(st);
  return 0;
}

static void on_ready_timer(uv_timer_t *t) {
  tc_store_t *st = t->data;
  fire_ready(st, TXP_ESTORE, "could not reach the store in time");
}

/* ----------------------------------------------------------- lifecycle */

static void on_pool_state(tc_pg_pool_t *pool, int idx, bool up, const char *err, void *arg) {
  tc_store_t *st = arg;
  if (up) {
    tc_log_debug("store connection %d ready", idx);
    if (st->id_next >= st->id_end && st->nspare == 0) fetch_block(st);
    schedule_flush(st);
  } else if (!st->closing) {
    /* While the server is away (a failover: several seconds), every
     * connection fails again at each backoff step: one line every
     * LOST_LOG_MS says so, with how many failures it stands for. */
    uint64_t now = uv_now(st->loop);
    if (st->lost_logged_ms == 0 || now - st->lost_logged_ms >= LOST_LOG_MS) {
      if (st->lost_unlogged)
        tc_log_warn("store connection %d lost: %s (and %llu more failures of store connections in the last %.0f s)",
                    idx, err ? err : "unknown error", (unsigned long long)st->lost_unlogged,
                    (double)(now - st->lost_logged_ms) / 1000.0);
      else
        tc_log_warn("store connection %d lost: %s", idx, err ? err : "unknown error");
      st->lost_logged_ms = now;
      st->lost_unlogged = 0;
    } else {
      st->lost_unlogged++;
    }
  }
}

tc_store_t *tc_store_new(uv_loop_t *loop, const tc_config_t *cfg,
                         void (*on_ready)(int, const char *, void *), void *arg,
                         unsigned ready_timeout_ms) {
  tc_store_t *st = calloc(1, sizeof(*st));
  if (!st) return NULL;
  st->loop = loop;
  st->node_id = cfg->node_id;
  st->batch_max = cfg->batch_max;
  st->batch_min = cfg->batch_max < 32 ? cfg->batch_max : 32;
  st->queue_max = (size_t)cfg->queue_max;
  /* Longer than a phase-two call (10 s in tc_phase2.c): the leader must not
   * re-drive a branch whose first call is still waiting for its RM.  A dead
   * node's sessions are adopted at once anyway (tc_adopt_orphans). */
  st->lease_ms = 12000;
  st->retry_min_ms = cfg->retry_min_ms;
  st->retry_max_ms = cfg->retry_max_ms;
  st->max_lock_keys = cfg->max_lock_keys;
  st->on_ready = on_ready;
  st->ready_arg = arg;

  /* Synchronous commit stays on for the durable lane: an acknowledged
   * decision or lock must survive a PostgreSQL crash.  Group commit is what
   * makes that affordable.  The relaxed lane turns it off (NOTES). */
  tc_pg_pool_opts_t w = {0};
  w.conninfo = cfg->pg_url;
  w.size = cfg->writers;
  w.max_queue = 1024;
  w.on_state = on_pool_state;
  w.state_arg = st;
  /* enable_seqscan off on the writers' connections: global_table,
   * branch_table and lock_table hold only the transactions in flight, so
   * their statistics say "a page or two" and the planner scans them
   * whole (xid = ANY (the batch's keys) as a filter, or a join of the
   * batch's unnest against the whole table) rather than probe the key,
   * while under load those pages are full of rows just deleted: each scan
   * tests every dead tuple's visibility.
   * Probing the key costs the same at any churn; measured (bench/README,
   * eighteenth session): rows read in the store per order 112 -> 36, the
   * stack's CPU per order 2.17 -> 1.94 ms.  A query with no index to use
   * still scans. */
  w.init_sql = "SET application_name = 'tcd-writer'; SET plan_cache_mode = force_generic_plan; "
               "SET enable_seqscan = off";
  tc_pg_pool_opts_t a = w;
  a.size = cfg->relaxed_writers;
  a.init_sql = "SET application_name = 'tcd-relaxed-writer'; SET plan_cache_mode = "
               "force_generic_plan; SET synchronous_commit = off; SET enable_seqscan = off";
  tc_pg_pool_opts_t c = a;
  c.size = 1;
  c.init_sql = "SET application_name = 'tcd-cleanup-writer'; SET plan_cache_mode = "
               "force_generic_plan; SET synchronous_commit = off; SET enable_seqscan = off";
  tc_pg_pool_opts_t r = w;
  r.size = cfg->pool_size - tc_config_store_writers(cfg);
  r.max_queue = 8192;
  r.init_sql = "SET application_name = 'tcd-reader'"; /* admin reads: the planner's own choice */

  bool relaxed = cfg->relaxed_writers > 0;
  st->lane[LANE_DURABLE].writers = cfg->writers;
  st->lane[LANE_RELAXED].writers = cfg->relaxed_writers;
  st->lane[LANE_CLEANUP].writers = 1;
  st->lane[LANE_DURABLE].pool = tc_pg_pool_new(loop, &w);
  st->rpool = tc_pg_pool_new(loop, &r);
  if (relaxed) {
    st->lane[LANE_RELAXED].pool = tc_pg_pool_new(loop, &a);
    st->lane[LANE_CLEANUP].pool = tc_pg_pool_new(loop, &c);
  }
  if (!st->lane[LANE_DURABLE].pool || !st->rpool ||
      (relaxed && (!st->lane[LANE_RELAXED].pool || !st->lane[LANE_CLEANUP].pool))) {
    st->closing = true;
    tc_pg_pool_t *pools[] = {st->lane[LANE_DURABLE].pool, st->lane[LANE_RELAXED].pool,
                             st->lane[LANE_CLEANUP].pool, st->rpool};
    tc_parts_start(&st->close, 0, free, st, NULL, NULL);
    for (int i = 0; i < 4; i++)
      if (pools[i]) tc_parts_add(&st->close);
    if (st->close.open == 0) {
      free(st);
      return NULL;
    }
    for (int i = 0; i < 4; i++) /* the last one closed frees 'st' */
      if (pools[i]) tc_pg_pool_close(pools[i], tc_parts_closed, &st->close);
    return NULL;
  }
  uv_idle_init(loop, &st->flush_idle);
  st->flush_idle.data = st;
  uv_timer_init(loop, &st->lazy_timer);
  st->lazy_timer.data = st;
  uv_timer_init(loop, &st->ready_timer);
  st->ready_timer.data = st;
  uv_timer_start(&st->ready_timer, on_ready_timer, ready_timeout_ms, 0);
  fetch_block(st);
  return st;
}

static void on_handle_closed(uv_handle_t *h) {
  tc_store_t *st = h->data;
  tc_parts_closed(&st->close);
}

void tc_store_close(tc_store_t *st, void (*done)(void *), void *arg) {
  st->closing = true;
  /* Queued ops never reached PostgreSQL: fail them now. */
  lazy_release(st);
  for (int i = 0; i < LANES; i++) {
    lane_t *l = &st->lane[i];
    while (l->head) {
      tc_op_t *op = l->head;
      l->head = op->next_;
      l->queued--;
      op_fail(op, "coordinator shutting down");
      op->status = TXP_ESHUTDOWN;
      op_complete(st, op);
    }
    l->tail = NULL;
  }
  tc_parts_start(&st->close, 4, free, st, done, arg); /* three handles and the read pool; the lanes' pools below */
  uv_close((uv_handle_t *)&st->flush_idle, on_handle_closed);
  uv_close((uv_handle_t *)&st->lazy_timer, on_handle_closed);
  uv_close((uv_handle_t *)&st->ready_timer, on_handle_closed);
  for (int i = 0; i < LANES; i++)
    if (st->lane[i].pool) tc_pg_pool_close(st->lane[i].pool, tc_parts_closed, tc_parts_add(&st->close));
  tc_pg_pool_close(st->rpool, tc_parts_closed, &st->close);
}

int tc_store_read(tc_store_t *st, tc_pg_job_t *job, unsigned deadline_ms) {
  if (st->closing) return TC_PG_ECLOSING;
  return tc_pg_submit(st->rpool, job, deadline_ms);
}

void tc_store_get_stats(const tc_store_t *st, tc_store_stats_t *out) {
  *out = st->stats;
  out->queue_len = queued_total(st);
}

int tc_store_ready_conns(const tc_store_t *st) {
  int n = tc_pg_pool_ready(st->rpool);
  for (int i = 0; i < LANES; i++)
    if (st->lane[i].pool) n += tc_pg_pool_ready(st->lane[i].pool);
  return n;
}
