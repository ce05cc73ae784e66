/*
 * rm_fence_rules.c - the fence's rules, pure (rm_fence.h has them as a
 * table).
 */
#include "rm_fence.h"

#include <stddef.h>

rm_fence_action_t rm_fence_phase2(bool commit, int found, int *to, const char **why) {
  *to = RM_FENCE_NONE;
  *why = NULL;
  switch (found) {
  case RM_FENCE_TRIED:
    *to = commit ? RM_FENCE_CONFIRMED : RM_FENCE_CANCELLED;
    return RM_FENCE_RUN;
  case RM_FENCE_CONFIRMED:
    if (commit) return RM_FENCE_DONE;
    *why = "the branch was committed (confirmed) before: it cannot be rolled back now (tcctl show XID)";
    return RM_FENCE_REFUSE;
  case RM_FENCE_CANCELLED:
  case RM_FENCE_CANCELLED_EMPTY:
    if (!commit) return RM_FENCE_DONE;
    *why = found == RM_FENCE_CANCELLED
             ? "the branch was rolled back (cancelled) before: it cannot be committed now (tcctl show XID)"
             : "the branch was rolled back before its try or XA start, which was then refused: it cannot "
               "be committed (tcctl show XID)";
    return RM_FENCE_REFUSE;
  case RM_FENCE_NONE:
    if (!commit) {
      *to = RM_FENCE_CANCELLED_EMPTY;
      return RM_FENCE_RECORD;
    }
    *why = "no try or prepared XA branch is recorded yet (its local transaction has not committed or "
           "prepared): retried; if it never does, the global was committed without it (tcctl show XID)";
    return RM_FENCE_RETRY;
  default:
    *why = "the fence row has a status this library does not know (a newer library wrote it?)";
    return RM_FENCE_REFUSE;
  }
}

rm_fence_action_t rm_fence_saga(bool commit, int found, int *to, const char **why) {
  *to = RM_FENCE_NONE;
  *why = NULL;
  switch (found) {
  case RM_FENCE_NONE:
    *to = commit ? RM_FENCE_CONFIRMED : RM_FENCE_CANCELLED_EMPTY;
    return commit ? RM_FENCE_RUN : RM_FENCE_RECORD;
  case RM_FENCE_CONFIRMED:
    if (commit) return RM_FENCE_DONE;
    *to = RM_FENCE_CANCELLED;
    return RM_FENCE_RUN;
  case RM_FENCE_CANCELLED:
  case RM_FENCE_CANCELLED_EMPTY:
    if (!commit) return RM_FENCE_DONE;
    *why = "the saga step was compensated before its action ran: the action is refused (anti-hanging; "
           "tcctl show XID)";
    return RM_FENCE_REFUSE;
  default:
    *why = "the fence row of the saga step has a status a step never leaves behind (tried, or unknown)";
    return RM_FENCE_REFUSE;
  }
}

bool rm_fence_first_ok(int found, const char **why) {
  *why = NULL;
  switch (found) {
  case RM_FENCE_NONE: return true;
  case RM_FENCE_CANCELLED_EMPTY:
    *why = "the global transaction rolled this branch back before its try or XA start: refused (anti-hanging)";
    return false;
  case RM_FENCE_CANCELLED: *why = "the branch was rolled back already: refused"; return false;
  case RM_FENCE_CONFIRMED: *why = "the branch was committed already: refused"; return false;
  case RM_FENCE_TRIED: *why = "the branch has its row already (a second phase one of one branch id)"; return false;
  default: *why = "the fence row has a status this library does not know"; return false;
  }
}

const char *rm_fence_status_name(int status) {
  switch (status) {
  case RM_FENCE_NONE: return "none";
  case RM_FENCE_TRIED: return "tried";
  case RM_FENCE_CONFIRMED: return "confirmed";
  case RM_FENCE_CANCELLED: return "cancelled";
  case RM_FENCE_CANCELLED_EMPTY: return "cancelled before any try";
  default: return "unknown";
  }
}
