/*
 * rm_fence_branch.h - where the fenced modes (TCC, saga, XA) meet at/'s
 * resources: adding a resource served by a fenced mode with handlers, and
 * opening a branch in the caller's transaction (TCC's try, XA's start),
 * and running phase two on the resource's pool (TCC, saga).
 * The modes differ there only in names and messages, so each passes those
 * and the steps are written once.  Unlike the rest of fence/, this stands
 * on at/ (rm_at_int.h) and on the core's registration.
 */
#ifndef RM_FENCE_BRANCH_H
#define RM_FENCE_BRANCH_H

#include <libpq-fe.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rm_at_int.h"
#include "rm_fence.h"

/* A fenced mode with handlers (TCC, saga), for rm__fence_resource_add. */
typedef struct rm_fence_handled_mode {
  int type;                  /* TXP_BT_TCC, TXP_BT_SAGA */
  const char *name;          /* "TCC", "saga": the messages' word for the mode */
  const char *handler_names; /* "confirm and cancel": the two a caller must set */
  const rm_at_mode_t *ops;   /* its arg is a copy of the handlers, freed with free() */
  /* How phase two logs an empty rollback or compensation: "<branch_word>
   * <id> of <xid> on <resource> <empty_note>". */
  const char *branch_word; /* "branch", "saga step" */
  const char *empty_note;  /* "cancelled before its try: recorded (...)" */
} rm_fence_handled_mode_t;

/*
 * Add resource 'resource_id' served by 'mode' with a copy of the 'size'
 * bytes of handlers at 'h' ('complete': the caller's handlers are all
 * set).  Refuses a second set of handlers for the same resource before
 * it checks the database (rm_fence_require).  0 or an RM_E_* code with
 * rm_errmsg set.
 */
int rm__fence_resource_add(rm_client_t *c, const rm_fence_handled_mode_t *mode, const char *resource_id,
                           const char *conninfo, const void *h, size_t size, bool complete);

/* A fenced mode whose branch opens inside the caller's transaction, for
 * rm__fence_branch_open. */
typedef struct rm_fence_opening {
  int type;               /* TXP_BT_TCC, TXP_BT_XA */
  const char *what;       /* "TCC try": the messages' subject, and rm_fence_first's */
  const char *not_served; /* the end of the message when the resource lacks the mode */
  const char *failpoint;  /* TXC_FAILPOINT's name after the registration */
  /* The test hook called after the registration (NULL: none) and its arg. */
  void (*after_register)(const char *xid, int64_t branch_id, void *arg);
  void *after_register_arg;
} rm_fence_opening_t;

/*
 * Open a branch of 'o' on resource 'resource_id' in the transaction open
 * on 'pg': checked arguments ('args' at most RM_FENCE_ARGS_MAX bytes, or
 * NULL), the registration with the coordinator, then the fence row
 * (rm_fence_first).  *branch_id (if given) is the new branch's id, 0 on
 * failure.  0 or an RM_E_* code with rm_errmsg set.
 */
int rm__fence_branch_open(rm_client_t *c, const rm_fence_opening_t *o, const char *xid, const char *resource_id,
                          PGconn *pg, const char *args, int64_t *branch_id);

/*
 * Phase two 'req' of a branch of 'mode' on resource 'r': 'job' (the
 * mode's part: words, rules, handler; the branch, its type and the
 * decision are filled in here) run by rm_fence_run on a connection of the
 * resource's phase-two pool; an empty rollback or compensation recorded
 * is logged.  The branch status, *code and 'errmsg' as rm_fence_run's.
 */
int rm__fence_phase2(rm_at_resource_t *r, const rm_fence_handled_mode_t *mode, const rm_phase2_req_t *req,
                     rm_fence_job_t *job, int *code, char *errmsg, size_t errlen);

#endif /* RM_FENCE_BRANCH_H */
