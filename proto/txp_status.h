/*
 * txp_status.h - global and branch status enums, and their legal
 * transitions, as data that tcd and librmclient share.
 *
 * NOTES
 *   The numbers follow Seata's GlobalStatus/BranchStatus so that operators who
 *   know Seata read our tables without a dictionary; they are stored in
 *   PostgreSQL and sent on the wire, so they never change.
 *
 *   Global lifecycle (AT mode):
 *     Begin -> Committing | AsyncCommitting        (TM commit; decision durable)
 *     Begin -> Rollbacking | TimeoutRollbacking    (TM rollback / timeout job)
 *     Committing/AsyncCommitting -> CommitRetrying -> Committed
 *     Rollbacking -> RollbackRetrying -> Rollbacked | RollbackFailed
 *     TimeoutRollbacking -> TimeoutRollbackRetrying -> TimeoutRollbacked
 *                                                    | TimeoutRollbackFailed
 *     any retrying status <-> StopCommitRetry / StopRollbackRetry (operator)
 *   Every change is a compare-and-set on the stored status, checked against
 *   txp_global_transition_ok() first: a node that wakes up late can only
 *   repeat a decision already recorded, never contradict it.
 */
#ifndef TXP_STATUS_H
#define TXP_STATUS_H

#include <stdbool.h>

typedef enum txp_global_status {
  TXP_GS_UNKNOWN = 0,
  TXP_GS_BEGIN = 1,
  TXP_GS_COMMITTING = 2,
  TXP_GS_COMMIT_RETRYING = 3,
  TXP_GS_ROLLBACKING = 4,
  TXP_GS_ROLLBACK_RETRYING = 5,
  TXP_GS_TIMEOUT_ROLLBACKING = 6,
  TXP_GS_TIMEOUT_ROLLBACK_RETRYING = 7,
  TXP_GS_ASYNC_COMMITTING = 8,
  TXP_GS_COMMITTED = 9,
  TXP_GS_COMMIT_FAILED = 10,
  TXP_GS_ROLLBACKED = 11,
  TXP_GS_TIMEOUT_ROLLBACKED = 12,
  TXP_GS_ROLLBACK_FAILED = 13,
  TXP_GS_TIMEOUT_ROLLBACK_FAILED = 14,
  TXP_GS_FINISHED = 15,
  TXP_GS_STOP_COMMIT_RETRY = 19,
  TXP_GS_STOP_ROLLBACK_RETRY = 20,
  TXP_GS__MAX = 21
} txp_global_status_t;

typedef enum txp_branch_status {
  TXP_BS_UNKNOWN = 0,
  TXP_BS_REGISTERED = 1,
  TXP_BS_PHASE1_DONE = 2,
  TXP_BS_PHASE1_FAILED = 3,
  TXP_BS_PHASE1_TIMEOUT = 4,
  TXP_BS_PHASE2_COMMITTED = 5,
  TXP_BS_PHASE2_COMMIT_FAILED_RETRYABLE = 6,
  TXP_BS_PHASE2_COMMIT_FAILED_UNRETRYABLE = 7,
  TXP_BS_PHASE2_ROLLBACKED = 8,
  TXP_BS_PHASE2_ROLLBACK_FAILED_RETRYABLE = 9,
  TXP_BS_PHASE2_ROLLBACK_FAILED_UNRETRYABLE = 10,
  TXP_BS_STOP_RETRY = 13,
  TXP_BS__MAX = 14
} txp_branch_status_t;

typedef enum txp_branch_type {
  TXP_BT_AT = 0,
  TXP_BT_TCC = 1,
  TXP_BT_SAGA = 2,
  TXP_BT_XA = 3,
  TXP_BT__MAX = 4
} txp_branch_type_t;

/* Names as operators see them ("Begin", "RollbackFailed", ...); "Unknown"
 * for values outside the enum.  Never NULL. */
const char *txp_global_status_name(int status);
const char *txp_branch_status_name(int status);
const char *txp_branch_type_name(int type);

/* Parse a name back (case-insensitive); returns -1 if unknown. */
int txp_global_status_parse(const char *name);
int txp_branch_status_parse(const char *name);

bool txp_global_status_valid(int status);
bool txp_branch_status_valid(int status);

/* Terminal: nothing more will happen without an operator. */
bool txp_global_status_final(int status);
/* Ended well or badly but needs an operator (RollbackFailed, ...). */
bool txp_global_status_needs_operator(int status);
/* The decision is commit (committing or committed). */
bool txp_global_status_is_commit(int status);
/* The decision is rollback (any rollback-family status). */
bool txp_global_status_is_rollback(int status);

/* Whether 'from' -> 'to' is a legal change of a stored global status. */
bool txp_global_transition_ok(int from, int to);
/* Whether 'from' -> 'to' is a legal change of a stored branch status. */
bool txp_branch_transition_ok(int from, int to);

#endif /* TXP_STATUS_H */
