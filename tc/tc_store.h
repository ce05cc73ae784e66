/*
 * tc_store.h - the coordinator store on PostgreSQL, with group commit.
 *
 * NOTES
 *   Every state change of a global transaction (begin, branch registration,
 *   the decision, phase-two outcomes) is an "op" put in the FIFO queue of
 *   its lane (tc_store.c NOTES: durable for registrations and decisions,
 *   relaxed for begins, clean-up for phase-two records).  On each loop
 *   iteration a lane's queue is cut into batches of up to store.batch_max
 *   ops, and each batch runs as ONE PostgreSQL transaction on one of the
 *   lane's connections: one pipelined round trip, set-based functions
 *   (their live definitions: sql/tc/schema.sql).  An op's callback runs
 *   only after that transaction committed; on the durable lane, after its
 *   WAL flush, so nothing a client relies on is acknowledged before it is
 *   durable.
 *
 *   Failure handling per batch:
 *     - deadlock / serialization failure (40P01, 40001): the whole batch is
 *       put back at the head of the queue, up to 3 attempts;
 *     - any other statement error: the ops are retried one per batch, so one
 *       bad op cannot fail its neighbours; an op that fails alone gets
 *       TXP_ESTORE;
 *     - connection lost while in flight: the outcome is unknown, and the
 *       store reads it back on a reader connection (the primary that takes
 *       the writes now) instead of guessing: begins, registrations and
 *       decisions found recorded are answered as their batch would have,
 *       the others run again (tc_store.c NOTES, "Unknown outcomes");
 *       phase-two records get TXP_ESTORE and are left to recovery.
 *   Reads (status, lock query, the operator's commands, the metrics
 *   probe, recovery scans) run on the reader connections, outside
 *   batches: tc_store_read.h names each one and holds its SQL.
 *
 *   Ids: blocks of 4096 ids from tc_id_block_seq; one block in use and up
 *   to SPARE_BLOCKS (4) in reserve, refilled in one round trip when two are
 *   left, so taking an id costs no round trip.
 *
 *   Thread: the loop thread only.
 */
#ifndef TC_STORE_H
#define TC_STORE_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "tc_config.h"
#include "txp_msg.h"

struct tc_pg_job; /* tc_pg.h: only tc_store.c and tc_store_read.c know it */

typedef struct tc_store tc_store_t;

typedef enum tc_op_kind {
  TC_OP_BEGIN = 0,
  TC_OP_REGISTER,
  TC_OP_DECIDE,
  TC_OP_PHASE2, /* also phase-one reports */
  TC_OP__KINDS
} tc_op_kind_t;

/* Outcome words of the store functions. */
typedef enum tc_res {
  TC_RES_NONE = 0,
  TC_RES_OK,
  TC_RES_NOT_FOUND,
  TC_RES_NOT_ACTIVE,
  TC_RES_TIMED_OUT,
  TC_RES_CONFLICT,
  TC_RES_HOLDER_ROLLBACKING,
  TC_RES_DECIDED,
  TC_RES_FINISHED,
  TC_RES_NOT_EXPIRED,
  TC_RES_BRANCH_NOT_FOUND,
  TC_RES_FAILED,
  TC_RES_RETRY,
  TC_RES_NOT_OWNER, /* the caller may not act on this xid or branch */
  TC_RES_COMPENSATE, /* PHASE2: a saga step's action failed for good; the
                        global is Rollbacking now (sql/tc/009_saga.sql) */
} tc_res_t;

typedef enum tc_decide_action { TC_DECIDE_COMMIT, TC_DECIDE_ROLLBACK, TC_DECIDE_TIMEOUT } tc_decide_action_t;

typedef struct tc_branch_row {
  int64_t branch_id;
  int branch_type;
  int status;
  char resource_id[TXP_MAX_RESOURCE_LEN + 1];
  char client_id[TXP_MAX_NAME_LEN + 1];
  char application_id[TXP_MAX_NAME_LEN + 1]; /* of the registering RM; "" before sql/tc/008 */
  char app_group[TXP_MAX_NAME_LEN + 1];      /* its group; "" before sql/tc/008 */
  bool phase2_sync; /* registered with TXP_APP_DATA_PHASE2_SYNC (DECIDE rows) */
} tc_branch_row_t;

/* How long a lazy op (tc_op_t.lazy) may wait for a fuller batch while the
 * store is busy. */
#define TC_STORE_LAZY_MS 20

typedef struct tc_op tc_op_t;
typedef void (*tc_op_cb)(tc_op_t *op, void *arg);

/*
 * One store operation.  The caller allocates it (usually embedded in its
 * request context), fills the inputs for its kind, and submits it; string
 * inputs are borrowed until the callback.  Outputs are valid in and after
 * the callback; tc_op_clear() frees what the op owns (the branch list).
 */
struct tc_op {
  tc_op_kind_t kind;
  tc_op_cb cb;
  void *arg;

  /* inputs */
  const char *xid;
  int64_t id;             /* BEGIN: transaction id; REGISTER/PHASE2: branch id */
  uint32_t timeout_ms;    /* BEGIN */
  const char *name;       /* BEGIN */
  const char *app_id;     /* BEGIN; REGISTER, DECIDE, PHASE2: the caller's */
  const char *group;      /* BEGIN, REGISTER, DECIDE, PHASE2: the caller's
                             group; NULL: the coordinator itself (recovery,
                             phase two, operators), never refused */
  const char *idem_key;   /* BEGIN, REGISTER */
  const char *resource_id;/* REGISTER */
  int branch_type;        /* REGISTER */
  const char *lock_keys;  /* REGISTER, already validated; may be NULL */
  /* REGISTER that begins its global too: the global's transaction id (0:
   * a plain registration), timeout, name and owner (NULL: the
   * registration's app_id and group).  Its begin runs in the same batch,
   * before the registration.  Two kinds: a BranchRegister without xid
   * (tc_coord.c: no lock keys, so it never waits and runs again), and a
   * begin answered already and held until its first registration
   * (begin_folded, tc_hold.h: cleared once the batch ran, before any
   * retry). */
  int64_t begin_txid;
  uint32_t begin_timeout_ms;
  const char *begin_name;
  const char *begin_app_id, *begin_group, *begin_idem_key;
  bool begin_folded;
  const char *app_data;   /* REGISTER */
  const char *client_id;  /* REGISTER; PHASE2: the reporting RM's */
  tc_decide_action_t action; /* DECIDE */
  int branch_status;      /* PHASE2 */
  const char *error;      /* PHASE2: last error text, may be NULL */
  bool lazy;              /* clean-up nobody waits for (the all-committed
                             PHASE2 op): it may wait, up to TC_STORE_LAZY_MS,
                             to ride a later, fuller batch (tc_store.c) */

  /* outputs */
  int status;             /* 0, or TXP_ESTORE (see errmsg) */
  tc_res_t res;
  int global_status;      /* DECIDE, PHASE2; REGISTER: status when not active */
  int holder_status;      /* REGISTER conflict: 0 locked, 1 rollbacking */
  bool finished;          /* PHASE2: the global transaction ended */
  int64_t out_id;         /* REGISTER: branch id */
  char out_xid[TXP_MAX_XID_LEN + 1];  /* BEGIN: the xid (may differ on idem) */
  char holder[TXP_MAX_XID_LEN + 1];   /* REGISTER conflict: holder xid */
  tc_branch_row_t *branches;          /* DECIDE: branches to drive (owned) */
  int nbranches;
  char errmsg[256];

  /* private */
  int attempts_;
  int broken_; /* batches of this op that lost their connection in flight */
  bool alone_;
  uint64_t queued_ns_;
  tc_op_t *next_;
};

/* Upper bounds (seconds) of the store operation latency histogram. */
#define TC_STORE_OP_BUCKETS 10
extern const double tc_store_op_bounds[TC_STORE_OP_BUCKETS];

typedef struct tc_store_stats {
  uint64_t batches, ops, batch_retries, op_failures, deadlocks;
  uint64_t queue_len, queue_peak;
  double batch_ms_total;
  uint64_t ops_by_kind[TC_OP__KINDS];
  double op_seconds_by_kind[TC_OP__KINDS]; /* submit to callback, summed */
  uint64_t op_bucket[TC_OP__KINDS][TC_STORE_OP_BUCKETS]; /* ... counted per bound (not cumulative) */
  uint64_t op_count[TC_OP__KINDS];                       /* ... completed */
  /* Batches whose connection broke in flight (outcome unknown), and what
   * reading the store made of their ops: found applied (answered as the
   * batch would have), not applied (run again), or failed (no reading, or
   * broken too often). */
  uint64_t unknown_batches, unknown_applied, unknown_redone, unknown_failed;
} tc_store_stats_t;

/*
 * Connect the pools (writers + readers from 'cfg').  'on_ready' runs once
 * when the first id block is in hand (the node may start serving), or with
 * an error status if the store could not be reached before 'ready_timeout_ms'.
 */
tc_store_t *tc_store_new(uv_loop_t *loop, const tc_config_t *cfg,
                         void (*on_ready)(int status, const char *err, void *arg), void *arg,
                         unsigned ready_timeout_ms);
void tc_store_close(tc_store_t *st, void (*done)(void *arg), void *arg);

/* Submit 'op'.  Returns 0 (callback will run exactly once) or TXP_EBUSY when
 * the queue is full (callback will not run). */
int tc_store_submit(tc_store_t *st, tc_op_t *op);
/* Release what an op owns (its branch list); the op itself is the caller's. */
void tc_op_clear(tc_op_t *op);

/* Next unique id (transaction or branch).  Returns 0 or TXP_ESTORE when no
 * id block is available (store unreachable). */
int tc_store_next_id(tc_store_t *st, int64_t *out);

/* Run a job on a reader connection (see tc_pg_submit), for
 * tc_store_read.c: the other modules call its named reads, and never see
 * a job.  TC_PG_ECLOSING once the store closes. */
int tc_store_read(tc_store_t *st, struct tc_pg_job *job, unsigned deadline_ms);

void tc_store_get_stats(const tc_store_t *st, tc_store_stats_t *out);
int tc_store_ready_conns(const tc_store_t *st);

#endif /* TC_STORE_H */
