/*
 * rm_internal.h - the seam between librmclient's core (connections, TM
 * API: rm_client.c, rm_call.c, rm_tm.c, rm_phase2.c, rm_degrade.c,
 * rm_conn.c; their own internals are in rm_core.h) and its AT resource
 * manager (rm_at*.c, rm_undo.c, rm_image.c).  Not installed.
 *
 * NOTES
 *   The core owns the background libuv thread and every TC connection.  The
 *   AT layer runs on caller threads (branch statements on the caller's own
 *   PGconn) and on worker threads (phase two on the library's own
 *   connections); it reaches the TC only through the two calls below, and
 *   the core reaches it only through the rm__at_phase2() hook.
 */
#ifndef RM_INTERNAL_H
#define RM_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rm_client.h"

/* Logging through the caller's callback (no-op when none). */
void rm__log(rm_client_t *c, int level, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/*
 * BranchRegister, blocking, from any thread.  'lock_keys' may be NULL
 * (delta branches).  The request carries 'idem_key' so that a retry on
 * another node after a lost connection returns the same branch.  Waits up
 * to 'lock_wait_ms' for busy locks (pushed by the TC) plus the request
 * timeout.  On failure, 'errmsg' (cap 'errlen') gets the TC's message.
 */
int rm__branch_register(rm_client_t *c, const char *xid, const char *resource_id,
                        const char *lock_keys, const char *app_data, unsigned lock_wait_ms,
                        int64_t *branch_id, char *errmsg, size_t errlen);

/* BranchReport (PhaseOneDone / PhaseOneFailed), blocking. */
int rm__branch_report(rm_client_t *c, const char *xid, int64_t branch_id, int branch_status,
                      const char *message);

/* The configured default lock wait. */
unsigned rm__lock_wait_ms(const rm_client_t *c);
/* rm_config_t.unnamed_statements. */
bool rm__unnamed_statements(const rm_client_t *c);

/*
 * Phase two, called by the core for each BranchCommit/BranchRollback that a
 * TC sends.  Runs on a worker thread (never the loop thread); may block on
 * the database.  Returns the branch status to answer (PhaseTwoCommitted,
 * PhaseTwoRollbacked, or a *Failed* status) and, for failures, an error
 * code (e.g. RM_E_DIRTY_WRITE) and message in 'errmsg'.
 */
typedef struct rm_phase2_req {
  bool commit;
  const char *xid;
  int64_t branch_id;
  const char *resource_id;
  int branch_type;
} rm_phase2_req_t;

int rm__at_phase2(rm_client_t *c, const rm_phase2_req_t *req, int *code, char *errmsg, size_t errlen);

/* The common case of an AT BranchCommit, without blocking: the undo row
 * queued for the background deleter.  False when it needs rm__at_phase2
 * (not an AT commit, unknown resource, or the queue is full and the row
 * must be deleted inline).  Safe on the client's loop thread. */
bool rm__at_commit_queued(rm_client_t *c, const rm_phase2_req_t *req);

/* The AT layer's per-client state (resources, their connection pools,
 * the undo clean-up queue), created lazily by rm_resource_add and freed by
 * rm_client_free through this hook. */
typedef struct rm_at_state rm_at_state_t;
rm_at_state_t **rm__at_state(rm_client_t *c);
void rm__at_free(rm_at_state_t *s);
/* Resource ids this client serves, comma-separated (for RegisterRM). */
int rm__resource_ids(rm_client_t *c, char *out, size_t cap);
/* Tell the core that the resource list changed: it re-registers as RM. */
void rm__resources_changed(rm_client_t *c);

#endif /* RM_INTERNAL_H */
