/*
 * rm_tcc_fence.c - the TCC fence's rules (rm_tcc_fence.h has them as a
 * table).
 */
#include "rm_tcc_fence.h"

#include <stddef.h>

rm_fence_action_t rm_tcc_fence_phase2(bool commit, int found, int *to, const char **why) {
  *to = RM_FENCE_NONE;
  *why = NULL;
  switch (found) {
  case RM_FENCE_TRIED:
    *to = commit ? RM_FENCE_CONFIRMED : RM_FENCE_CANCELLED;
    return RM_FENCE_RUN;
  case RM_FENCE_CONFIRMED:
    if (commit) return RM_FENCE_DONE;
    *why = "the branch was confirmed before: it cannot be cancelled now (tcctl show XID)";
    return RM_FENCE_REFUSE;
  case RM_FENCE_CANCELLED:
  case RM_FENCE_CANCELLED_EMPTY:
    if (!commit) return RM_FENCE_DONE;
    *why = found == RM_FENCE_CANCELLED
             ? "the branch was cancelled before: it cannot be confirmed now (tcctl show XID)"
             : "the branch was cancelled before its try, which was then refused: it cannot be confirmed "
               "(tcctl show XID)";
    return RM_FENCE_REFUSE;
  case RM_FENCE_NONE:
    if (!commit) {
      *to = RM_FENCE_CANCELLED_EMPTY;
      return RM_FENCE_RECORD;
    }
    *why = "no try is recorded for this branch yet (its local transaction has not committed): retried; if "
           "it never commits, the global was committed without its try (tcctl show XID)";
    return RM_FENCE_RETRY;
  default:
    *why = "the fence row has a status this library does not know (a newer library wrote it?)";
    return RM_FENCE_REFUSE;
  }
}

bool rm_tcc_fence_try_ok(int found, const char **why) {
  *why = NULL;
  switch (found) {
  case RM_FENCE_NONE: return true;
  case RM_FENCE_CANCELLED_EMPTY:
    *why = "the global transaction cancelled this branch before its try: the try is refused (anti-hanging)";
    return false;
  case RM_FENCE_CANCELLED: *why = "the branch was cancelled already: the try is refused"; return false;
  case RM_FENCE_CONFIRMED: *why = "the branch was confirmed already: the try is refused"; return false;
  case RM_FENCE_TRIED: *why = "the branch was tried already (a second try of one branch id)"; return false;
  default: *why = "the fence row has a status this library does not know"; return false;
  }
}

const char *rm_tcc_fence_status_name(int status) {
  switch (status) {
  case RM_FENCE_NONE: return "none";
  case RM_FENCE_TRIED: return "tried";
  case RM_FENCE_CONFIRMED: return "confirmed";
  case RM_FENCE_CANCELLED: return "cancelled";
  case RM_FENCE_CANCELLED_EMPTY: return "cancelled before any try";
  default: return "unknown";
  }
}
