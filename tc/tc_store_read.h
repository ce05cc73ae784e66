/*
 * tc_store_read.h - the store's named reads: every statement the node
 * runs outside the group-commit batches, each a function with typed
 * inputs and a callback that gets parsed rows.  The SQL text lives in
 * tc_store_read.c only; its callers (coord, admin_exec, metrics,
 * recovery, peer) see no PostgreSQL type and write no SQL.
 *
 * NOTES
 *   Where they run.  The reads go to the store's reader connections
 *   (tc_store_read(), on the read pool that tc_store owns), never to the
 *   writers of the group-commit lanes, so an operator's query or the
 *   leader's scan cannot delay a commit batch.  "Read" names those
 *   connections, not the statement: five of them change rows, each in one
 *   compare-and-set or idempotent statement that no client waits on: the
 *   operator's repairs (tc_read_admin_cas, tc_read_admin_delete:
 *   sql/tc/004_admin.sql) and the leader's jobs (tc_read_claim_retries,
 *   tc_read_adopt_orphans, tc_read_prune_history).
 *
 *   Dedicated connections (tc_read_conn_t) are for what must live exactly
 *   as long as one PostgreSQL session: the leader's advisory lock
 *   (tc_read_leader_try, tc_read_leader_held) and the membership's node
 *   lock (cluster/tc_cluster.c brings its own SQL, sql/tc/003_cluster.sql,
 *   and runs it through tc_read_conn_exec).
 *
 *   Contract (libuv's): every function returns 0, and then its callback
 *   runs exactly once, later, on the loop thread; or a code, and then the
 *   callback never runs: TC_READ_ENOMEM, TC_READ_EINVAL, TC_READ_EFULL
 *   (the queue is full) or TC_READ_ECLOSING (the store is closing).  The
 *   callback's 'status' is TC_READ_OK or a code below; 'err' is never
 *   NULL: the failing statement's message for TC_READ_ESTMT and
 *   TC_READ_EBROKEN, "" otherwise.  The rows it gets, and every string in
 *   them, are borrowed until the callback returns; a string field is NULL
 *   where the column is SQL NULL.  Without TC_READ_OK the rows are NULL
 *   (and counts 0).  'deadline_ms' bounds the wait for a connection (0:
 *   no bound); 'st' and the string arguments are borrowed for the call
 *   only.
 *
 *   Thread: the loop thread only.
 */
#ifndef TC_STORE_READ_H
#define TC_STORE_READ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "tc_store.h"

/* The codes of the PostgreSQL pool (tc_pg.h), passed through unchanged
 * (tc_store_read.c checks that they agree), and two of this module. */
enum {
  TC_READ_OK = 0,
  TC_READ_ESTMT = -10500,    /* a statement failed: PostgreSQL answered 'err' */
  TC_READ_EBROKEN = -10501,  /* connection lost in flight: the outcome is unknown */
  TC_READ_ENOCONN = -10502,  /* no connection could be had before the deadline */
  TC_READ_EFULL = -10503,    /* the queue is full: not accepted */
  TC_READ_ECLOSING = -10504, /* the store (or the connection) is closing */
  TC_READ_ENOMEM = -10510,   /* out of memory, building the statement or parsing its answer */
  TC_READ_EINVAL = -10511,   /* an argument cannot be put into the statement: nothing sent */
};

/* ------------------------------------------------------------------ rows */

/* A live global transaction (global_table), as the operator sees it. */
typedef struct tc_read_global {
  const char *xid;
  int64_t transaction_id;
  int status;
  const char *application_id; /* NULL: none */
  const char *name;           /* NULL: none */
  int64_t timeout_ms;
  const char *begin_time; /* timestamps: ISO 8601 UTC, milliseconds */
  double age_s;           /* since begin_time */
  const char *deadline;
  bool timed_out; /* the deadline has passed */
  int64_t node_id;
  int64_t retry_count;
  const char *next_retry_at; /* NULL: no retry scheduled */
  const char *last_error;    /* NULL: none */
  int64_t branches, locks;   /* rows in branch_table, lock_table */
} tc_read_global_t;

/* A finished one (global_history). */
typedef struct tc_read_history {
  int64_t transaction_id;
  int status;
  const char *application_id;
  const char *name;
  const char *begin_time;
  const char *end_time;
  const char *branches_json; /* its branches: a JSON array (tc__finish_many) */
} tc_read_history_t;

/* A branch row (branch_table), as the operator sees it; phase two's
 * tc_branch_row_t is in tc_store.h. */
typedef struct tc_read_branch {
  int64_t branch_id;
  const char *resource_id;
  int branch_type;
  int status;
  const char *client_id;
  int64_t retry_count;
  const char *next_retry_at;
  const char *last_error;
  const char *lock_keys;
  const char *application_data;
  const char *created, *modified;
} tc_read_branch_t;

/* A global row lock (lock_table). */
typedef struct tc_read_lock {
  const char *row_key;
  const char *xid; /* the holder */
  int64_t branch_id;
  const char *resource_id;
  const char *table;
  const char *pk;
  int status; /* 0 locked, 1 rollbacking */
  const char *since;
  /* tc_read_locks only: the holder's global status, unless the lock is
   * an orphan (its holder has no row in global_table). */
  bool orphan;
  int holder_status;
} tc_read_lock_t;

/* A member of the cluster (node_table). */
typedef struct tc_read_node {
  int64_t node_id;
  const char *address;
  const char *admin_socket;
  const char *started_at;
  const char *heartbeat_at;
  double heartbeat_age_s;
  bool is_leader;
  bool has_pid;
  int64_t pid;
  const char *version;
  const char *state; /* up, stalled, reconnecting, down (tc_cluster_nodes) */
} tc_read_node_t;

/* Unfinished global transactions of one status. */
typedef struct tc_read_count {
  int status;
  int64_t count;
} tc_read_count_t;

/* ---------------------------------------------------- the TM's requests */

typedef struct tc_read_status {
  bool found;   /* live, or in history */
  bool allowed; /* the asker may see it (tc__may_decide; once finished: its group) */
  int global_status;
} tc_read_status_t;
typedef void (*tc_read_status_cb)(int status, const char *err, const tc_read_status_t *r, void *arg);

/* GlobalStatus of 'xid' for the application 'app_id' of group 'group'. */
int tc_read_status(tc_store_t *st, const char *xid, const char *app_id, const char *group, unsigned deadline_ms,
                   tc_read_status_cb cb, void *arg);

/* The application data a branch was registered with (a saga step's
 * args, which phase two sends with each call): 'answer' is NULL when the
 * branch is gone or has none. */
typedef void (*tc_read_answer_cb)(int status, const char *err, const char *answer, void *arg);
int tc_read_branch_data(tc_store_t *st, const char *xid, int64_t branch_id, unsigned deadline_ms,
                        tc_read_answer_cb cb, void *arg);

/* 'holder': an xid holding one of the keys, NULL when none does. */
typedef void (*tc_read_holder_cb)(int status, const char *err, const char *holder, void *arg);

/* GlobalLockQuery: whether another global transaction than 'xid' (may be
 * NULL) holds one of 'lock_keys' ("table:pk1,pk2;...", already validated:
 * txp_lockkeys_each with 'max_keys') of 'resource_id'. */
int tc_read_lock_holder(tc_store_t *st, const char *resource_id, const char *lock_keys, size_t max_keys,
                        const char *xid, unsigned deadline_ms, tc_read_holder_cb cb, void *arg);

/* The global status of 'xid' and who registered its branch 'branch_id',
 * as the store says: a phase-two call relayed by a peer is sent only for
 * a decision on record, and only to an RM of that group. */
typedef struct tc_read_owner {
  bool found; /* the transaction is live and has that branch, or it is an
                 AT commit finished at its decision that had it (sql/tc/010) */
  int global_status;
  const char *application_id; /* "" for branches before sql/tc/008, and
                                 for those of a finished commit */
  const char *app_group;
} tc_read_owner_t;
typedef void (*tc_read_owner_cb)(int status, const char *err, const tc_read_owner_t *r, void *arg);

int tc_read_branch_owner(tc_store_t *st, const char *xid, int64_t branch_id, unsigned deadline_ms,
                         tc_read_owner_cb cb, void *arg);

/* ------------------------------------------------------------ operators */

/* What the lists of global transactions, live or finished, filter on
 * alike. */
typedef struct tc_read_list_filter {
  const int *statuses; /* one of these statuses; NULL or nstatuses 0: any */
  int nstatuses;
  const char *name; /* this transaction name; NULL: any */
  int limit;        /* rows at most */
} tc_read_list_filter_t;

/* Live global transactions, oldest first (begin_time, xid). */
typedef struct tc_read_globals_filter {
  tc_read_list_filter_t list;
  bool has_min_age;
  double min_age_s; /* begun at least this long ago */
} tc_read_globals_filter_t;
typedef void (*tc_read_globals_cb)(int status, const char *err, const tc_read_global_t *rows, int n, void *arg);

int tc_read_globals(tc_store_t *st, const tc_read_globals_filter_t *f, unsigned deadline_ms, tc_read_globals_cb cb,
                    void *arg);

/* Finished global transactions (global_history), the latest first. */
typedef struct tc_read_finished {
  const char *xid;
  tc_read_history_t h;  /* h.branches_json is NULL: lists do not carry the branches */
  double duration_s;    /* end_time - begin_time */
  int64_t branches;     /* how many it had */
} tc_read_finished_t;
typedef struct tc_read_history_filter {
  tc_read_list_filter_t list; /* its statuses: final ones */
  const char *xid;            /* this xid; NULL: any */
  bool has_since, has_until;
  double since_unix, until_unix; /* ended within [since, until], Unix time */
} tc_read_history_filter_t;
typedef void (*tc_read_history_cb)(int status, const char *err, const tc_read_finished_t *rows, int n, void *arg);

int tc_read_history(tc_store_t *st, const tc_read_history_filter_t *f, unsigned deadline_ms, tc_read_history_cb cb,
                    void *arg);

/* Everything the store has of one xid. */
typedef struct tc_read_global_view {
  const tc_read_global_t *global;   /* NULL: not live */
  const tc_read_history_t *history; /* NULL: not in history */
  const tc_read_branch_t *branches; /* branch_table rows, by branch_id */
  int nbranches;
  const tc_read_lock_t *locks; /* lock_table rows, by row_key, at most 'max_locks' */
  int nlocks;
} tc_read_global_view_t;
typedef void (*tc_read_global_cb)(int status, const char *err, const tc_read_global_view_t *v, void *arg);

int tc_read_global(tc_store_t *st, const char *xid, int max_locks, unsigned deadline_ms, tc_read_global_cb cb,
                   void *arg);

/* Global row locks by row_key, with their holder's status. */
typedef struct tc_read_locks_filter {
  const char *xid;    /* held by this xid; NULL: any */
  const char *key;    /* this row key; NULL: any */
  const char *prefix; /* row keys starting so; NULL: any */
  int limit;          /* rows at most */
} tc_read_locks_filter_t;
typedef void (*tc_read_locks_cb)(int status, const char *err, const tc_read_lock_t *rows, int n, void *arg);

int tc_read_locks(tc_store_t *st, const tc_read_locks_filter_t *f, unsigned deadline_ms, tc_read_locks_cb cb,
                  void *arg);

/* node_table, by node_id. */
typedef void (*tc_read_nodes_cb)(int status, const char *err, const tc_read_node_t *rows, int n, void *arg);

/* 'stale_ms' (cluster.leader_lease_ms): a node whose heartbeat is older is
 * not up; 'leader_key' (recovery.leader_lock_key): whose lock makes the
 * leader. */
int tc_read_nodes(tc_store_t *st, int stale_ms, int64_t leader_key, unsigned deadline_ms, tc_read_nodes_cb cb,
                  void *arg);

/* Unfinished global transactions by status, by status (the admin "stats"
 * command; /metrics has them in tc_read_probe). */
typedef void (*tc_read_counts_cb)(int status, const char *err, const tc_read_count_t *rows, int n, void *arg);

int tc_read_sessions(tc_store_t *st, unsigned deadline_ms, tc_read_counts_cb cb, void *arg);

/* What a repair is planned from (tc_adm_plan_repair). */
typedef struct tc_read_repair_state {
  bool live;           /* in global_table: then 'global_status' and 'past_deadline' */
  int global_status;
  bool past_deadline;
  const int *branch_status; /* its branch rows' statuses, by branch_id */
  int nbranches;
  bool in_history; /* in global_history: then 'history_status' */
  int history_status;
} tc_read_repair_state_t;
typedef void (*tc_read_repair_state_cb)(int status, const char *err, const tc_read_repair_state_t *s, void *arg);

int tc_read_repair_state(tc_store_t *st, const char *xid, unsigned deadline_ms, tc_read_repair_state_cb cb,
                         void *arg);

/* What tc_admin_cas() does to next_retry_at. */
typedef enum tc_read_retry {
  TC_READ_RETRY_LEASE, /* this node drives now: a lease of 'lease_ms' keeps the recovery job away */
  TC_READ_RETRY_NOW,   /* due at once: the leader's retry job picks it up */
  TC_READ_RETRY_CLEAR, /* no retry scheduled */
} tc_read_retry_t;

/* One compare-and-set of an operator's repair (sql/tc/004_admin.sql). */
typedef struct tc_read_cas {
  const char *xid;
  int from, to; /* the status expected, the status set */
  tc_read_retry_t retry;
  int lease_ms;
  const int *forbid; /* branch statuses that refuse the change */
  int nforbid;
} tc_read_cas_t;

typedef struct tc_read_cas_result {
  const char *result;  /* "ok", "not_found" (finished meanwhile), "changed",
                          "branch" (a forbidden branch), or what the function
                          said; "" when it returned no row */
  int global_status;   /* the status now (not_found, changed) */
  int64_t branch_id;   /* "branch": the branch, and its status */
  int branch_status;
  const tc_branch_row_t *rows; /* the branches after the change, to drive */
  int nrows;
} tc_read_cas_result_t;
typedef void (*tc_read_cas_cb)(int status, const char *err, const tc_read_cas_result_t *r, void *arg);

/* One transaction: the compare-and-set, then the branches to drive.
 * TC_READ_EBROKEN: the outcome is unknown. */
int tc_read_admin_cas(tc_store_t *st, const tc_read_cas_t *in, unsigned deadline_ms, tc_read_cas_cb cb, void *arg);

typedef struct tc_read_delete_result {
  const char *result; /* "ok", "live" (refused), "not_found", or what the function said; "" without a row */
  int history_status; /* the status in global_history, 0 if none; "live": the live status */
  int64_t locks, branches; /* "ok": rows deleted */
} tc_read_delete_result_t;
typedef void (*tc_read_delete_cb)(int status, const char *err, const tc_read_delete_result_t *r, void *arg);

/* Delete the lock and branch rows a finished (or unknown) transaction left
 * behind (tc_admin_delete_leftovers), in one transaction. */
int tc_read_admin_delete(tc_store_t *st, const char *xid, unsigned deadline_ms, tc_read_delete_cb cb, void *arg);

/* -------------------------------------------------------------- metrics */

typedef struct tc_read_probe {
  const tc_read_count_t *sessions; /* unfinished global transactions by status */
  int nsessions;
  int64_t retry_depth; /* sessions with a retry scheduled */
  int64_t retry_due;   /* ... that is due */
  const char *schema_versions; /* the tc versions of schema_version: "1,2,4" */
} tc_read_probe_t;
typedef void (*tc_read_probe_cb)(int status, const char *err, const tc_read_probe_t *p, void *arg);

/* The /metrics and /readyz probe, in one round trip.  TC_READ_ESTMT:
 * PostgreSQL answered but the schema is not what this build reads. */
int tc_read_probe(tc_store_t *st, unsigned deadline_ms, tc_read_probe_cb cb, void *arg);

/* ---------------------------------------------------- the leader's jobs */

typedef void (*tc_read_xids_cb)(int status, const char *err, const char *const *xids, int n, void *arg);

/* Begin sessions past their deadline, the oldest deadline first, at most
 * 'limit'. */
int tc_read_timeouts(tc_store_t *st, int limit, unsigned deadline_ms, tc_read_xids_cb cb, void *arg);

/* One session claimed for a phase-two retry. */
typedef struct tc_read_claim {
  const char *xid;
  int global_status;
  const tc_branch_row_t *branches; /* the branches it has left */
  int nbranches;
} tc_read_claim_t;
typedef void (*tc_read_claims_cb)(int status, const char *err, const tc_read_claim_t *claims, int n, void *arg);

/* Claim (tc_claim_retries, SKIP LOCKED) up to 'limit' sessions mid-phase-
 * two whose lease expired, each for a new lease of 'lease_ms'. */
int tc_read_claim_retries(tc_store_t *st, int limit, int lease_ms, unsigned deadline_ms, tc_read_claims_cb cb,
                          void *arg);

typedef void (*tc_read_count_cb)(int status, const char *err, int64_t n, void *arg);

/* Make due at once the sessions whose phase-two drive belonged to a node
 * that is gone (tc_adopt_orphans); 'n': how many. */
int tc_read_adopt_orphans(tc_store_t *st, unsigned deadline_ms, tc_read_count_cb cb, void *arg);

/* History rows deleted per tc_read_prune_history at most: a first pruning
 * after a long retention period must not become one huge transaction. */
#define TC_READ_HISTORY_BATCH 10000

/* Delete history rows that ended more than 'days' days ago, the oldest
 * first, up to TC_READ_HISTORY_BATCH; 'n': how many. */
int tc_read_prune_history(tc_store_t *st, int days, unsigned deadline_ms, tc_read_count_cb cb, void *arg);

/* ------------------------------------------------ dedicated connections */

typedef struct tc_read_conn tc_read_conn_t;

typedef enum tc_read_conn_kind {
  TC_READ_CONN_LEADER, /* the recovery leader's advisory lock ("tcd-leader/N") */
  TC_READ_CONN_MEMBER, /* the membership's node lock and heartbeats ("tcd-member/N"; no fsync wait) */
} tc_read_conn_kind_t;

/*
 * Open a connection of its own to 'conninfo' for node 'node_id' (the
 * session's application_name says which node and what for).  'on_state'
 * (may be NULL) runs on the loop thread each time the session comes up
 * ('up') or is lost ('err' says why; whatever the session held, an
 * advisory lock, is gone with it); it reconnects by itself.  NULL on bad
 * arguments or out of memory.
 */
tc_read_conn_t *tc_read_conn_new(uv_loop_t *loop, const char *conninfo, tc_read_conn_kind_t kind, int node_id,
                                 void (*on_state)(bool up, const char *err, void *arg), void *arg);
/* Close the session (what it holds is given back at once); statements
 * queued or in flight complete with TC_READ_ECLOSING.  'done' (may be NULL)
 * runs once all is closed, and the object is freed after it returns. */
void tc_read_conn_close(tc_read_conn_t *c, void (*done)(void *arg), void *arg);

/* The leader's lock: tc_leader_try (sql/tc/003_cluster.sql), which also
 * fences a stalled holder.  'answer': "leader", "fenced", "no-privilege"
 * or what else it said. */
int tc_read_leader_try(tc_read_conn_t *c, int64_t lock_key, int node_id, int lease_ms, unsigned deadline_ms,
                       tc_read_answer_cb cb, void *arg);

/* Whether this session still holds the leader's lock 'lock_key'. */
typedef void (*tc_read_held_cb)(int status, const char *err, bool held, void *arg);
int tc_read_leader_held(tc_read_conn_t *c, int64_t lock_key, unsigned deadline_ms, tc_read_held_cb cb, void *arg);

/* For cluster/ (tc_cluster_opts_t.sql), which brings its own statements:
 * run 'sql' with 'n' text parameters on the session; 'res' (libpq's,
 * borrowed) on TC_READ_OK, else NULL. */
struct pg_result;
typedef void (*tc_read_exec_cb)(int status, const struct pg_result *res, const char *err, void *arg);
int tc_read_conn_exec(tc_read_conn_t *c, const char *sql, int n, const char *const *values, unsigned deadline_ms,
                      tc_read_exec_cb cb, void *arg);

#endif /* TC_STORE_READ_H */
