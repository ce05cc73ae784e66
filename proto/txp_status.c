/*
 * txp_status.c - names, classes and the transition tables of the status
 * enums in txp_status.h.
 */
#include "txp_status.h"

#include <stddef.h>
#include <strings.h>

#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

static const char *const global_names[TXP_GS__MAX] = {
  [TXP_GS_UNKNOWN] = "Unknown",
  [TXP_GS_BEGIN] = "Begin",
  [TXP_GS_COMMITTING] = "Committing",
  [TXP_GS_COMMIT_RETRYING] = "CommitRetrying",
  [TXP_GS_ROLLBACKING] = "Rollbacking",
  [TXP_GS_ROLLBACK_RETRYING] = "RollbackRetrying",
  [TXP_GS_TIMEOUT_ROLLBACKING] = "TimeoutRollbacking",
  [TXP_GS_TIMEOUT_ROLLBACK_RETRYING] = "TimeoutRollbackRetrying",
  [TXP_GS_ASYNC_COMMITTING] = "AsyncCommitting",
  [TXP_GS_COMMITTED] = "Committed",
  [TXP_GS_COMMIT_FAILED] = "CommitFailed",
  [TXP_GS_ROLLBACKED] = "Rollbacked",
  [TXP_GS_TIMEOUT_ROLLBACKED] = "TimeoutRollbacked",
  [TXP_GS_ROLLBACK_FAILED] = "RollbackFailed",
  [TXP_GS_TIMEOUT_ROLLBACK_FAILED] = "TimeoutRollbackFailed",
  [TXP_GS_FINISHED] = "Finished",
  [TXP_GS_STOP_COMMIT_RETRY] = "StopCommitRetry",
  [TXP_GS_STOP_ROLLBACK_RETRY] = "StopRollbackRetry",
};

static const char *const branch_names[TXP_BS__MAX] = {
  [TXP_BS_UNKNOWN] = "Unknown",
  [TXP_BS_REGISTERED] = "Registered",
  [TXP_BS_PHASE1_DONE] = "PhaseOneDone",
  [TXP_BS_PHASE1_FAILED] = "PhaseOneFailed",
  [TXP_BS_PHASE1_TIMEOUT] = "PhaseOneTimeout",
  [TXP_BS_PHASE2_COMMITTED] = "PhaseTwoCommitted",
  [TXP_BS_PHASE2_COMMIT_FAILED_RETRYABLE] = "PhaseTwoCommitFailedRetryable",
  [TXP_BS_PHASE2_COMMIT_FAILED_UNRETRYABLE] = "PhaseTwoCommitFailedUnretryable",
  [TXP_BS_PHASE2_ROLLBACKED] = "PhaseTwoRollbacked",
  [TXP_BS_PHASE2_ROLLBACK_FAILED_RETRYABLE] = "PhaseTwoRollbackFailedRetryable",
  [TXP_BS_PHASE2_ROLLBACK_FAILED_UNRETRYABLE] = "PhaseTwoRollbackFailedUnretryable",
  [TXP_BS_STOP_RETRY] = "StopRetry",
};

static const char *const branch_type_names[TXP_BT__MAX] = {
  [TXP_BT_AT] = "AT", [TXP_BT_TCC] = "TCC", [TXP_BT_SAGA] = "SAGA", [TXP_BT_XA] = "XA",
};

bool txp_global_status_valid(int s) {
  return s > TXP_GS_UNKNOWN && s < TXP_GS__MAX && global_names[s] != NULL;
}

bool txp_branch_status_valid(int s) {
  return s > TXP_BS_UNKNOWN && s < TXP_BS__MAX && branch_names[s] != NULL;
}

const char *txp_global_status_name(int s) {
  return (s >= 0 && s < TXP_GS__MAX && global_names[s]) ? global_names[s] : "Unknown";
}

const char *txp_branch_status_name(int s) {
  return (s >= 0 && s < TXP_BS__MAX && branch_names[s]) ? branch_names[s] : "Unknown";
}

const char *txp_branch_type_name(int t) {
  return (t >= 0 && t < TXP_BT__MAX) ? branch_type_names[t] : "Unknown";
}

static int parse_name(const char *const *names, int n, const char *name) {
  if (name == NULL) return -1;
  for (int i = 1; i < n; i++)
    if (names[i] && strcasecmp(names[i], name) == 0) return i;
  return -1;
}

int txp_global_status_parse(const char *name) {
  return parse_name(global_names, TXP_GS__MAX, name);
}

int txp_branch_status_parse(const char *name) {
  return parse_name(branch_names, TXP_BS__MAX, name);
}

bool txp_global_status_final(int s) {
  switch (s) {
  case TXP_GS_COMMITTED:
  case TXP_GS_COMMIT_FAILED:
  case TXP_GS_ROLLBACKED:
  case TXP_GS_TIMEOUT_ROLLBACKED:
  case TXP_GS_ROLLBACK_FAILED:
  case TXP_GS_TIMEOUT_ROLLBACK_FAILED:
  case TXP_GS_FINISHED:
    return true;
  default:
    return false;
  }
}

bool txp_global_status_needs_operator(int s) {
  switch (s) {
  case TXP_GS_COMMIT_FAILED:
  case TXP_GS_ROLLBACK_FAILED:
  case TXP_GS_TIMEOUT_ROLLBACK_FAILED:
  case TXP_GS_STOP_COMMIT_RETRY:
  case TXP_GS_STOP_ROLLBACK_RETRY:
    return true;
  default:
    return false;
  }
}

bool txp_global_status_is_commit(int s) {
  switch (s) {
  case TXP_GS_COMMITTING:
  case TXP_GS_COMMIT_RETRYING:
  case TXP_GS_ASYNC_COMMITTING:
  case TXP_GS_COMMITTED:
  case TXP_GS_COMMIT_FAILED:
  case TXP_GS_STOP_COMMIT_RETRY:
    return true;
  default:
    return false;
  }
}

bool txp_global_status_is_rollback(int s) {
  switch (s) {
  case TXP_GS_ROLLBACKING:
  case TXP_GS_ROLLBACK_RETRYING:
  case TXP_GS_TIMEOUT_ROLLBACKING:
  case TXP_GS_TIMEOUT_ROLLBACK_RETRYING:
  case TXP_GS_ROLLBACKED:
  case TXP_GS_TIMEOUT_ROLLBACKED:
  case TXP_GS_ROLLBACK_FAILED:
  case TXP_GS_TIMEOUT_ROLLBACK_FAILED:
  case TXP_GS_STOP_ROLLBACK_RETRY:
    return true;
  default:
    return false;
  }
}

typedef struct {
  unsigned char from, to;
} transition_t;

/* The legal edges.  Anything not listed is refused.  Note what is absent:
 * no edge leaves the commit family for the rollback family or back, and no
 * edge leaves a final status except Finished (history) for the clean ends. */
static const transition_t global_edges[] = {
  {TXP_GS_BEGIN, TXP_GS_COMMITTING},
  {TXP_GS_BEGIN, TXP_GS_ASYNC_COMMITTING},
  {TXP_GS_BEGIN, TXP_GS_ROLLBACKING},
  {TXP_GS_BEGIN, TXP_GS_TIMEOUT_ROLLBACKING},
  {TXP_GS_BEGIN, TXP_GS_COMMITTED}, /* no branches: nothing to drive */
  {TXP_GS_BEGIN, TXP_GS_ROLLBACKED},
  {TXP_GS_BEGIN, TXP_GS_TIMEOUT_ROLLBACKED},

  {TXP_GS_COMMITTING, TXP_GS_COMMIT_RETRYING},
  {TXP_GS_COMMITTING, TXP_GS_COMMITTED},
  {TXP_GS_COMMITTING, TXP_GS_COMMIT_FAILED},
  {TXP_GS_ASYNC_COMMITTING, TXP_GS_COMMIT_RETRYING},
  {TXP_GS_ASYNC_COMMITTING, TXP_GS_COMMITTED},
  {TXP_GS_COMMIT_RETRYING, TXP_GS_COMMITTED},
  {TXP_GS_COMMIT_RETRYING, TXP_GS_COMMIT_FAILED},
  {TXP_GS_COMMIT_RETRYING, TXP_GS_STOP_COMMIT_RETRY},
  {TXP_GS_ASYNC_COMMITTING, TXP_GS_STOP_COMMIT_RETRY},
  {TXP_GS_COMMITTING, TXP_GS_STOP_COMMIT_RETRY},
  {TXP_GS_STOP_COMMIT_RETRY, TXP_GS_COMMIT_RETRYING},
  {TXP_GS_COMMIT_FAILED, TXP_GS_COMMIT_RETRYING}, /* operator re-drive */

  {TXP_GS_ROLLBACKING, TXP_GS_ROLLBACK_RETRYING},
  {TXP_GS_ROLLBACKING, TXP_GS_ROLLBACKED},
  {TXP_GS_ROLLBACKING, TXP_GS_ROLLBACK_FAILED},
  {TXP_GS_ROLLBACK_RETRYING, TXP_GS_ROLLBACKED},
  {TXP_GS_ROLLBACK_RETRYING, TXP_GS_ROLLBACK_FAILED},
  {TXP_GS_ROLLBACKING, TXP_GS_STOP_ROLLBACK_RETRY},
  {TXP_GS_ROLLBACK_RETRYING, TXP_GS_STOP_ROLLBACK_RETRY},
  {TXP_GS_STOP_ROLLBACK_RETRY, TXP_GS_ROLLBACK_RETRYING},
  {TXP_GS_ROLLBACK_FAILED, TXP_GS_ROLLBACK_RETRYING}, /* operator re-drive */

  {TXP_GS_TIMEOUT_ROLLBACKING, TXP_GS_TIMEOUT_ROLLBACK_RETRYING},
  {TXP_GS_TIMEOUT_ROLLBACKING, TXP_GS_TIMEOUT_ROLLBACKED},
  {TXP_GS_TIMEOUT_ROLLBACKING, TXP_GS_TIMEOUT_ROLLBACK_FAILED},
  {TXP_GS_TIMEOUT_ROLLBACK_RETRYING, TXP_GS_TIMEOUT_ROLLBACKED},
  {TXP_GS_TIMEOUT_ROLLBACK_RETRYING, TXP_GS_TIMEOUT_ROLLBACK_FAILED},
  {TXP_GS_TIMEOUT_ROLLBACKING, TXP_GS_STOP_ROLLBACK_RETRY},
  {TXP_GS_TIMEOUT_ROLLBACK_RETRYING, TXP_GS_STOP_ROLLBACK_RETRY},
  {TXP_GS_TIMEOUT_ROLLBACK_FAILED, TXP_GS_TIMEOUT_ROLLBACK_RETRYING},

  {TXP_GS_COMMITTED, TXP_GS_FINISHED},
  {TXP_GS_ROLLBACKED, TXP_GS_FINISHED},
  {TXP_GS_TIMEOUT_ROLLBACKED, TXP_GS_FINISHED},
};

static const transition_t branch_edges[] = {
  {TXP_BS_REGISTERED, TXP_BS_PHASE1_DONE},
  {TXP_BS_REGISTERED, TXP_BS_PHASE1_FAILED},
  {TXP_BS_REGISTERED, TXP_BS_PHASE1_TIMEOUT},
  /* phase two may reach a branch whose report never arrived */
  {TXP_BS_REGISTERED, TXP_BS_PHASE2_COMMITTED},
  {TXP_BS_REGISTERED, TXP_BS_PHASE2_COMMIT_FAILED_RETRYABLE},
  {TXP_BS_REGISTERED, TXP_BS_PHASE2_ROLLBACKED},
  {TXP_BS_REGISTERED, TXP_BS_PHASE2_ROLLBACK_FAILED_RETRYABLE},
  {TXP_BS_REGISTERED, TXP_BS_PHASE2_ROLLBACK_FAILED_UNRETRYABLE},
  {TXP_BS_PHASE1_DONE, TXP_BS_PHASE2_COMMITTED},
  {TXP_BS_PHASE1_DONE, TXP_BS_PHASE2_COMMIT_FAILED_RETRYABLE},
  {TXP_BS_PHASE1_DONE, TXP_BS_PHASE2_COMMIT_FAILED_UNRETRYABLE},
  {TXP_BS_PHASE1_DONE, TXP_BS_PHASE2_ROLLBACKED},
  {TXP_BS_PHASE1_DONE, TXP_BS_PHASE2_ROLLBACK_FAILED_RETRYABLE},
  {TXP_BS_PHASE1_DONE, TXP_BS_PHASE2_ROLLBACK_FAILED_UNRETRYABLE},
  {TXP_BS_PHASE1_FAILED, TXP_BS_PHASE2_ROLLBACKED},
  {TXP_BS_PHASE1_FAILED, TXP_BS_PHASE2_ROLLBACK_FAILED_RETRYABLE},
  {TXP_BS_PHASE1_TIMEOUT, TXP_BS_PHASE2_ROLLBACKED},
  {TXP_BS_PHASE1_TIMEOUT, TXP_BS_PHASE2_ROLLBACK_FAILED_RETRYABLE},
  {TXP_BS_PHASE2_COMMIT_FAILED_RETRYABLE, TXP_BS_PHASE2_COMMITTED},
  {TXP_BS_PHASE2_COMMIT_FAILED_RETRYABLE, TXP_BS_PHASE2_COMMIT_FAILED_UNRETRYABLE},
  {TXP_BS_PHASE2_ROLLBACK_FAILED_RETRYABLE, TXP_BS_PHASE2_ROLLBACKED},
  {TXP_BS_PHASE2_ROLLBACK_FAILED_RETRYABLE, TXP_BS_PHASE2_ROLLBACK_FAILED_UNRETRYABLE},
  {TXP_BS_PHASE2_COMMIT_FAILED_RETRYABLE, TXP_BS_STOP_RETRY},
  {TXP_BS_PHASE2_ROLLBACK_FAILED_RETRYABLE, TXP_BS_STOP_RETRY},
  /* No edge leaves StopRetry: it does not remember its family, so resuming
   * goes through the global transaction (operator re-drive), which sets the
   * branch status anew. */
};

static bool edge_ok(const transition_t *edges, size_t n, int from, int to) {
  for (size_t i = 0; i < n; i++)
    if (edges[i].from == from && edges[i].to == to) return true;
  return false;
}

bool txp_global_transition_ok(int from, int to) {
  if (!txp_global_status_valid(from) || !txp_global_status_valid(to)) return false;
  return edge_ok(global_edges, NELEM(global_edges), from, to);
}

bool txp_branch_transition_ok(int from, int to) {
  if (!txp_branch_status_valid(from) || !txp_branch_status_valid(to)) return false;
  return edge_ok(branch_edges, NELEM(branch_edges), from, to);
}
