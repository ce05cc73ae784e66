/*
 * rm_internal.h - the seam between librmclient's core (core/: connections,
 * TM API, serving the TC's requests, degrade detection; their own
 * internals are in rm_core.h) and what sits above it: the AT resource
 * manager (at/) and the fallback (fallback/).  Not installed.
 *
 * NOTES
 *   The core owns the background libuv thread and every TC connection.  The
 *   AT layer runs on caller threads (branch statements on the caller's own
 *   PGconn) and on worker threads (phase two on the library's own
 *   connections); it reaches the TC only through the calls below, and the
 *   core reaches it only through the rm_rm_ops_t table it attached.
 */
#ifndef RM_INTERNAL_H
#define RM_INTERNAL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rm_client.h"
#include "rm_util.h"

/* Logging through the caller's callback (no-op when none). */
void rm__log(rm_client_t *c, int level, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/*
 * BranchRegister, blocking, from any thread.  'lock_keys' may be NULL
 * (delta branches).  The request carries 'idem_key' so that a retry on
 * another node after a lost connection returns the same branch.  Waits up
 * to 'lock_wait_ms' for busy locks (pushed by the TC) plus the request
 * timeout.  On failure, 'errmsg' (cap 'errlen') gets the TC's message.
 */
/*
 * Whether the rows 'lock_keys' of 'resource_id' are free of other global
 * transactions' locks than 'xid''s (GlobalLockQuery); with 'lock_wait_ms',
 * the coordinator holds the answer until they are (its pushed lock
 * queue).  0 with *lockable (false: the holder's xid in 'holder');
 * RM_E_LOCK_WAIT_TIMEOUT when the wait ran out (the holder named); or the
 * call's code, with 'errmsg'.  Blocks: never on the loop thread.
 */
int rm__lock_query(rm_client_t *c, const char *xid, const char *resource_id, const char *lock_keys,
                   unsigned lock_wait_ms, bool *lockable, char *holder, size_t holderlen, char *errmsg,
                   size_t errlen);
int rm__branch_register(rm_client_t *c, const char *xid, const char *resource_id,
                        const char *lock_keys, const char *app_data, unsigned lock_wait_ms,
                        int64_t *branch_id, char *errmsg, size_t errlen);
/* The same for a branch of type 'branch_type' (TXP_BT_*; the above: AT). */
int rm__branch_register_as(rm_client_t *c, int branch_type, const char *xid, const char *resource_id,
                           const char *lock_keys, const char *app_data, unsigned lock_wait_ms,
                           int64_t *branch_id, char *errmsg, size_t errlen);

/* GlobalBegin and the BranchRegister of its first branch, an AT branch
 * without lock keys, in one call (a BranchRegister without an xid: one
 * round trip, one store transaction at the coordinator): 'xid' (RM_XID_MAX
 * bytes) and 'branch_id' are set on success.  RM_E_NOT_SUPPORTED when the
 * coordinator does not know the combined call (an older tcd: begin and
 * register apart then); the rest as rm_tm_begin and rm__branch_register.
 * Not resent after a lost connection with an idempotency key for its
 * begin: a global begun by a lost attempt times out with a branch that
 * never wrote its undo row.  Blocks: never on the loop thread. */
int rm__begin_register(rm_client_t *c, unsigned timeout_ms, const char *name, const char *resource_id,
                       char *xid, int64_t *branch_id, char *errmsg, size_t errlen);

/* A BranchRegister of an AT branch without lock keys, started now and
 * waited for later (rm_at_register_early: the branch's statements run
 * meanwhile).  _start returns at once: 0 with the pending call in *out,
 * or the code (nothing was sent).  _wait blocks until its end (0 with the
 * branch id, or the code and 'errmsg') and frees it: every started
 * registration is waited for exactly once.  Never on the loop thread. */
typedef struct rm_call rm_pending_t;
int rm__branch_register_start(rm_client_t *c, const char *xid, const char *resource_id, rm_pending_t **out);
int rm__branch_register_wait(rm_client_t *c, rm_pending_t *k, int64_t *branch_id, char *errmsg, size_t errlen);

/* BranchReport (PhaseOneDone / PhaseOneFailed), blocking. */
int rm__branch_report(rm_client_t *c, const char *xid, int64_t branch_id, int branch_status,
                      const char *message);

/* The configured default lock wait. */
unsigned rm__lock_wait_ms(const rm_client_t *c);
/* rm_config_t.unnamed_statements. */
bool rm__unnamed_statements(const rm_client_t *c);
/* rm_config_t.undo_format: whether AT branches write the compact form. */
bool rm__undo_compact(const rm_client_t *c);

/* One BranchCommit/BranchRollback that a TC sent (rm_rm_ops_t.phase2). */
typedef struct rm_phase2_req {
  bool commit;
  const char *xid;
  int64_t branch_id;
  const char *resource_id;
  int branch_type;
  const char *args; /* the coordinator's application data (a saga step's args); NULL if none */
} rm_phase2_req_t;

/*
 * The resource manager above the core (the AT layer), as the core sees
 * it: the core calls it through this table and never by name, so the
 * arrows run one way (AT -> core).  'rm' is the state that rm__rm_get
 * created.
 */
typedef struct rm_rm_ops {
  /* Phase two of one branch, on a worker thread (never the loop thread);
   * may block on the database.  Returns the branch status to answer
   * (PhaseTwoCommitted, PhaseTwoRollbacked, or a *Failed* status) and, for
   * failures, an error code (e.g. RM_E_DIRTY_WRITE) and a message. */
  int (*phase2)(void *rm, const rm_phase2_req_t *req, int *code, char *errmsg, size_t errlen);
  /* The common AT commit, without blocking, on the loop thread: true when
   * it was taken care of (queued for the background deleter), false when
   * it needs 'phase2'. */
  bool (*commit_queued)(void *rm, const rm_phase2_req_t *req);
  /* Resource ids served, comma-separated (for RegisterRM), on the loop
   * thread: their length, or a negative code. */
  int (*resource_ids)(void *rm, char *out, size_t cap);
  /* A registered coordinator connection was lost, on the loop thread,
   * without blocking: what it would have told this RM may never come (an
   * AT commit's notice, sql/tc/010), so the RM looks for leftovers soon. */
  void (*node_lost)(void *rm);
  /* Free the state, once the loop thread is gone (rm_client_free). */
  void (*free)(void *rm);
} rm_rm_ops_t;

/*
 * The resource manager state of 'c': created by 'create' (with 'ops'
 * remembered beside it) on the first call, under the client's lock, so
 * that two threads adding resources at once create one.  NULL when
 * 'create' failed (it may be asked again).
 */
void *rm__rm_get(rm_client_t *c, const rm_rm_ops_t *ops, void *(*create)(rm_client_t *c));
/* The state if it exists, else NULL; never creates (any thread). */
void *rm__rm_peek(rm_client_t *c);
/* The client's degrade figures (rm_degrade.c), without the fallback's:
 * local_orders stays 0; fallback/ adds it in rm_client_degrade_stats. */
void rm__degrade_stats(rm_client_t *c, rm_degrade_stats_t *out);

/* What local mode (fallback/rm_local.c) counts for a client: the rm_local_*
 * calls that succeeded with it named (rm_client_local_stats).  They live in
 * the client, so that two clients of one process count apart; atomics:
 * any thread, no lock. */
typedef struct rm_local_counters {
  atomic_uint_fast64_t orders, frozen, refused, finished, cancelled;
} rm_local_counters_t;
/* The counters of 'c'; NULL for NULL. */
rm_local_counters_t *rm__local_counters(rm_client_t *c);

/* Tell the core that the resource list changed: it re-registers as RM. */
void rm__resources_changed(rm_client_t *c);

#endif /* RM_INTERNAL_H */
