/*
 * model/tcc.pml - a TCC branch beside an AT one: one global transaction
 * G1 with an AT branch on row 0 and a TCC branch (a reservation: the
 * try's freeze), the coordinator with its store in the code's own global
 * and branch statuses (txp_status.h), phase two with its retries, the
 * fence of the TCC branch (sql/rm/002_branch_fence.sql, rm_fence_phase2),
 * the AT branch's undo row cleaned by its commit or by the RM's resolve
 * pass, and the faults: message loss (the coordinator's call times out:
 * retryable), duplication and reordering, a TC crash, an RM that dies
 * (before the try, inside it, after its local commit), a try whose local
 * transaction is still open when the cancel comes, a TM that dies.
 *
 * model/README.md maps each transition to the code that implements it.
 *
 * Safety (pan -DSAFETY -DNOCLAIM): the asserts.  Liveness (pan -a -f):
 * the ltl "finishes" under weak fairness, every fault bounded so that
 * they stop.
 *
 * Bugs to put back (each must make spin find a violation):
 *   -DBUG_NO_EMPTY_RECORD  a cancel that finds no fence row records
 *                          nothing: the late try goes in after its
 *                          global was rolled back (the hanging try)
 *   -DBUG_CANCEL_TWICE     the fence's "cancelled: done" taken out: a
 *                          duplicated cancel runs the handler again
 *   -DBUG_EMPTY_CANCEL_RUNS the cancel handler runs with no row (Seata's
 *                          empty rollback): it releases what no try froze
 *   -DBUG_CANCEL_WAITS     (liveness) a cancel that finds no row asks for
 *                          a retry, waiting for the try, instead of
 *                          recording the empty rollback: when the try
 *                          never comes, the rollback is retried for ever
 *   -DBUG_NO_RETRY_TIMEOUT (liveness) recovery's claim leaves out
 *                          TimeoutRollbackRetrying (7): a timeout rollback
 *                          that met one retryable failure is never driven
 *                          again
 *   -DBUG_FINISH_WITH_TCC  the decision's "AT only" test does not look at
 *                          the branch type: the commit is finished at its
 *                          decision as an AT-only one (sql/tc/010), the
 *                          TCC branch only "told" and never confirmed
 *
 * Bounds: FAULTS message faults (loss or duplication), TC_CRASHES
 * coordinator crashes.
 */
#ifndef FAULTS
#define FAULTS 2
#endif
#ifndef TC_CRASHES
#define TC_CRASHES 1
#endif

/* global status (txp_status.h) */
#define G_BEGIN 1
#define G_COMMITTING 2
#define G_COMMIT_RETRYING 3
#define G_ROLLBACKING 4
#define G_ROLLBACK_RETRYING 5
#define G_TIMEOUT_ROLLBACKING 6
#define G_TIMEOUT_ROLLBACK_RETRYING 7
#define G_ASYNC_COMMITTING 8
#define G_COMMITTED 9
#define G_COMMIT_FAILED 10
#define G_ROLLBACKED 11
#define G_TIMEOUT_ROLLBACKED 12
#define G_ROLLBACK_FAILED 13
#define G_TIMEOUT_ROLLBACK_FAILED 14
/* branch status (txp_status.h) */
#define B_NONE 0
#define B_REGISTERED 1
#define B_COMMITTED 5
#define B_COMMIT_RETRY 6
#define B_COMMIT_FAILED 7
#define B_ROLLBACKED 8
#define B_ROLLBACK_RETRY 9
#define B_ROLLBACK_FAILED 10
/* AT: the branch's undo_log row */
#define U_NONE 0
#define U_PRESENT 1
#define U_GUARD 2
#define U_GONE 3
/* TCC: the branch's branch_fence row (rm_fence.h; 0: no row) */
#define F_NONE 0
#define F_TRIED 1
#define F_CONFIRMED 2
#define F_CANCELLED 3
#define F_CANCELLED_EMPTY 4
/* rm_fence_action_t */
#define ACT_RUN 1
#define ACT_DONE 2
#define ACT_RECORD 3
#define ACT_RETRY 4
#define ACT_REFUSE 5
/* phase-two requests and the branch status answered (or the call's
 * timeout: retryable) */
#define R_NONE 0
#define R_COMMIT 1
#define R_ROLLBACK 2
#define A_NONE 0
#define A_OK 1
#define A_RETRY 2
#define A_FAIL 3

#define NB 2      /* branches of G1: 0 the AT one (row 0), 1 the TCC one */
#define AT 0
#define TCC 1

/* ---- the coordinator's store (PostgreSQL: survives a TC crash) */
byte gs;
byte bs[NB];
byte lock_owner;          /* row 0's global lock: 0, or 1 (G1) */
/* ---- the AT resource's database */
byte data;                /* row 0: 0, or 1 when G1's change is in it */
byte undo;
/* ---- the TCC resource's database */
byte fence;               /* the branch_fence row */
bit open;                 /* the try's local transaction: its row inserted, not committed */
bit reserved;             /* the try's freeze is in the database (committed) */
/* ---- what happened, for the properties */
bit applied;              /* the AT change is in the row */
byte undone;              /* AT undo replays */
byte confirms, cancels;   /* handler runs */
bit cancel_answered;      /* the RM answered a cancel of the TCC branch ok */
/* ---- volatile and in flight */
byte req[NB];
byte ans[NB];
bit reported[NB];         /* the TM heard the branch's try or local commit went in */
byte faults = FAULTS;
byte crashes = TC_CRASHES;

#define COMMIT_FAM (gs == G_COMMITTING || gs == G_COMMIT_RETRYING || gs == G_ASYNC_COMMITTING)
#define ROLLBACK_FAM (gs == G_ROLLBACKING || gs == G_ROLLBACK_RETRYING)
#define TIMEOUT_FAM (gs == G_TIMEOUT_ROLLBACKING || gs == G_TIMEOUT_ROLLBACK_RETRYING)
/* phase two runs: the first drive, or recovery's claim (tc_claim_retries: 2..8) */
#ifdef BUG_NO_RETRY_TIMEOUT
#define DRIVEN (COMMIT_FAM || ROLLBACK_FAM || gs == G_TIMEOUT_ROLLBACKING)
#else
#define DRIVEN (COMMIT_FAM || ROLLBACK_FAM || TIMEOUT_FAM)
#endif
#define PHASE2 (COMMIT_FAM || ROLLBACK_FAM || TIMEOUT_FAM)
#define FINAL (gs == G_COMMITTED || gs == G_ROLLBACKED || gs == G_TIMEOUT_ROLLBACKED)
#define FAILED (gs == G_COMMIT_FAILED || gs == G_ROLLBACK_FAILED || gs == G_TIMEOUT_ROLLBACK_FAILED)
#define FINISHED(k) (bs[k] == B_COMMITTED || bs[k] == B_ROLLBACKED)
#define LEFT(k) (bs[k] != B_NONE && !FINISHED(k))

/* tc_decide_batch's at_only (sql/tc/010): no registered branch of
 * another type than AT (nor with commit work: none here) */
#ifdef BUG_FINISH_WITH_TCC
#define AT_ONLY true
#else
#define AT_ONLY (bs[TCC] == B_NONE)
#endif

/* tc_decide_batch: from Begin only; a global without branches is
 * finished at once, and so is a commit whose branches are all AT
 * without commit work (010: history Committed, every branch recorded
 * PhaseTwoCommitted, the locks gone; its AT branch only told, here left
 * to the resolve pass: at.pml draws the notices).  Any other commit
 * deletes the locks and is driven (AsyncCommitting: with a TCC branch
 * always); a rollback keeps them (marked rollbacking) until it finishes. */
inline decide(to) {
  if
  :: bs[AT] == B_NONE && bs[TCC] == B_NONE ->
     gs = (to == G_ASYNC_COMMITTING -> G_COMMITTED : (to == G_ROLLBACKING -> G_ROLLBACKED : G_TIMEOUT_ROLLBACKED));
     lock_owner = 0
  :: to == G_ASYNC_COMMITTING && AT_ONLY && !(bs[AT] == B_NONE && bs[TCC] == B_NONE) ->
     gs = G_COMMITTED;
     lock_owner = 0;
     if :: bs[AT] != B_NONE -> bs[AT] = B_COMMITTED :: else -> skip fi;
     if :: bs[TCC] != B_NONE -> bs[TCC] = B_COMMITTED :: else -> skip fi
  :: else ->
     gs = to;
     if :: to == G_ASYNC_COMMITTING -> lock_owner = 0 :: else -> skip fi
  fi
}

/* The AT branch: BranchRegister with row 0's lock, the local commit
 * with its undo row (refused on the key when the guard row is there),
 * the report; it may die after any step. */
proctype AtBranch() {
  if
  :: atomic { gs == G_BEGIN -> lock_owner = 1; bs[AT] = B_REGISTERED }
  :: atomic { gs != G_BEGIN -> goto out }
  fi;
  if :: skip :: goto out fi;
  atomic {
    if
    :: undo == U_NONE -> data = 1; undo = U_PRESENT; applied = 1
    :: else -> goto out
    fi
  };
  if :: reported[AT] = 1 :: skip fi;
out:
  skip
}

/* The TCC branch (rm_tcc_try): register first, then the fence row in
 * the caller's transaction, with the reservation; then the caller's
 * COMMIT, and the report.  It may die between registration and the
 * row, or with its transaction open (rolled back: nothing stays), or
 * after its commit, before it reports. */
proctype TccBranch() {
  if
  :: atomic { gs == G_BEGIN -> bs[TCC] = B_REGISTERED }
  :: atomic { gs != G_BEGIN -> goto out }   /* refused: not Begin */
  fi;
  if :: skip :: goto out fi;
  /* rm_fence_first: INSERT ... ON CONFLICT DO NOTHING; a row there (a
   * cancel came first and recorded it) refuses the try: RM_E_FENCE */
  atomic {
    if
    :: fence == F_NONE -> open = 1
    :: else -> goto out
    fi
  };
  if
  :: atomic {
       /* the caller's COMMIT: the row and the freeze go in together */
       assert(!cancel_answered);   /* no hanging try */
       fence = F_TRIED; reserved = 1; open = 0
     }
  :: atomic { open = 0; goto out }   /* its transaction rolled back (the RM died, the business refused) */
  fi;
  if :: reported[TCC] = 1 :: skip fi;
out:
  skip
}

/* The TM: commits once both branches reported, rolls back, or dies. */
proctype TM() {
  if
  :: atomic { reported[AT] && reported[TCC] && gs == G_BEGIN -> decide(G_ASYNC_COMMITTING) }
  :: atomic { gs == G_BEGIN -> decide(G_ROLLBACKING) }
  :: skip
  fi
}

/* The coordinator: the timeout job and phase two, driven from the store
 * (the first drive and recovery's re-drives: the same transitions). */
#define SEND(k) \
  atomic { DRIVEN && LEFT(k) && req[k] == R_NONE && ans[k] == A_NONE -> \
           req[k] = (COMMIT_FAM -> R_COMMIT : R_ROLLBACK) }

/* tc_phase2_batch: the outcome sets the branch's status; a retryable
 * one puts the global in *Retrying, an unretryable one in *Failed (for an
 * operator); a failure over a branch finished is stale, not recorded
 * (011_stale_outcomes.sql); no branch left: final, history, locks gone.
 * A global finished or failed ignores it. */
#define ANSWER(k) \
  atomic { ans[k] != A_NONE -> \
    if \
    :: PHASE2 && !(ans[k] != A_OK && FINISHED(k)) -> \
       if \
       :: ans[k] == A_OK -> bs[k] = (COMMIT_FAM -> B_COMMITTED : B_ROLLBACKED) \
       :: ans[k] == A_RETRY -> \
          bs[k] = (COMMIT_FAM -> B_COMMIT_RETRY : B_ROLLBACK_RETRY); \
          gs = (COMMIT_FAM -> G_COMMIT_RETRYING : (ROLLBACK_FAM -> G_ROLLBACK_RETRYING : G_TIMEOUT_ROLLBACK_RETRYING)) \
       :: ans[k] == A_FAIL -> \
          bs[k] = (COMMIT_FAM -> B_COMMIT_FAILED : B_ROLLBACK_FAILED); \
          gs = (COMMIT_FAM -> G_COMMIT_FAILED : (ROLLBACK_FAM -> G_ROLLBACK_FAILED : G_TIMEOUT_ROLLBACK_FAILED)) \
       fi; \
       if \
       :: ans[k] == A_OK && !LEFT(AT) && !LEFT(TCC) -> \
          gs = (COMMIT_FAM -> G_COMMITTED : (ROLLBACK_FAM -> G_ROLLBACKED : G_TIMEOUT_ROLLBACKED)); \
          lock_owner = 0 \
       :: else -> skip \
       fi \
    :: else -> skip \
    fi; \
    ans[k] = A_NONE }

proctype TC() {
end:
  do
  :: atomic { gs == G_BEGIN -> decide(G_TIMEOUT_ROLLBACKING) }   /* the timeout job */
  :: SEND(AT)
  :: SEND(TCC)
  :: ANSWER(AT)
  :: ANSWER(TCC)
  :: atomic {
       crashes > 0 -> crashes--;
       req[AT] = R_NONE; ans[AT] = A_NONE; req[TCC] = R_NONE; ans[TCC] = A_NONE
     }
  od
}

/* rm_fence_phase2 (rm_fence_rules.c): what phase two does on a row */
inline fence_rules(commit, found) {
  to = F_NONE;
  if
  :: found == F_TRIED -> act = ACT_RUN; to = (commit -> F_CONFIRMED : F_CANCELLED)
  :: found == F_CONFIRMED -> act = (commit -> ACT_DONE : ACT_REFUSE)
  :: found == F_CANCELLED || found == F_CANCELLED_EMPTY ->
#ifdef BUG_CANCEL_TWICE
     if :: commit -> act = ACT_REFUSE :: else -> act = ACT_RUN; to = found fi
#else
     act = (commit -> ACT_REFUSE : ACT_DONE)
#endif
  :: found == F_NONE ->
     if
     :: commit -> act = ACT_RETRY
#if defined(BUG_CANCEL_WAITS)
     :: else -> act = ACT_RETRY
#elif defined(BUG_EMPTY_CANCEL_RUNS)
     :: else -> act = ACT_RUN; to = F_CANCELLED
#else
     :: else -> act = ACT_RECORD; to = F_CANCELLED_EMPTY
#endif
     fi
  fi
}

/* The handlers: confirm moves the freeze on, cancel releases it; each
 * must find the freeze its try made. */
inline handler(commit) {
  assert(reserved);
  reserved = 0;
  if
  :: commit -> confirms++
  :: else -> cancels++
  fi;
  assert(confirms + cancels <= 1)
}

/* rm_fence_run: one local transaction: lock the row (an uncommitted
 * row is not seen), the rules, record or run and set, commit.  A cancel
 * that must record the empty rollback while the try's transaction holds
 * the key waits for it: past lock_timeout, a retryable failure (the
 * wait that ends with the try's commit is this step taken after it). */
inline serve_tcc(commit) {
  fence_rules(commit, fence);
  if
  :: act == ACT_RECORD && open -> ans[TCC] = A_RETRY
  :: act == ACT_RECORD && !open ->
#ifndef BUG_NO_EMPTY_RECORD
     fence = to;
#endif
     ans[TCC] = A_OK
  :: act == ACT_RUN ->
     if
     :: fence == F_NONE && open -> ans[TCC] = A_RETRY   /* (BUG_EMPTY_CANCEL_RUNS) its insert waits on the key */
     :: else -> handler(commit); fence = to; ans[TCC] = A_OK
     fi
  :: act == ACT_DONE -> ans[TCC] = A_OK
  :: act == ACT_RETRY -> ans[TCC] = A_RETRY
  :: act == ACT_REFUSE -> ans[TCC] = A_FAIL
  fi;
  if :: !commit && ans[TCC] == A_OK -> cancel_answered = 1 :: else -> skip fi;
  act = 0; to = 0
}

/* AT phase two (rm_commit.c, rm_rollback.c), as in at.pml */
inline serve_at(commit) {
  if
  :: commit ->
     if :: undo == U_PRESENT -> undo = U_GONE :: else -> skip fi
  :: else ->
     if
     :: undo == U_PRESENT ->
        assert(data == 1);   /* the checked replay */
        data = 0; applied = 0; undone++; undo = U_GONE
     :: undo == U_NONE -> undo = U_GUARD
     :: else -> skip
     fi;
     assert(undone <= 1)
  fi;
  ans[AT] = A_OK
}

/* The AT resource's resolve pass (rm_undo.c resolve_resource): an undo
 * row of a global the coordinator answers in the commit family (Committed
 * from the history) is deleted; the others stay.  Only the passes that
 * delete are drawn. */
#define RESOLVE_AT \
  atomic { undo == U_PRESENT && (COMMIT_FAM || gs == G_COMMITTED) -> undo = U_GONE }

/* Any RM of the resource takes a request, and may keep a copy (a
 * duplicate, delivered again later). */
#define SERVE(k, body) \
  atomic { req[k] != R_NONE -> \
    body((req[k] == R_COMMIT)); \
    if \
    :: req[k] = R_NONE \
    :: faults > 0 -> faults-- \
    fi }

proctype RM() {
  byte act, to;
end:
  do
  :: SERVE(AT, serve_at)
  :: SERVE(TCC, serve_tcc)
  :: RESOLVE_AT
  od
}

/* The faulty network: a request or an answer lost; the coordinator's
 * call times out (tc_server.c), a retryable outcome. */
#define LOSE(k) \
  :: atomic { faults > 0 && req[k] != R_NONE -> req[k] = R_NONE; ans[k] = A_RETRY; faults-- } \
  :: atomic { faults > 0 && ans[k] != A_NONE && ans[k] != A_RETRY -> ans[k] = A_RETRY; faults-- }

proctype Net() {
end:
  do
  LOSE(AT)
  LOSE(TCC)
  od
}

/* At the end (nothing can move): finished, atomically, nothing held, no
 * undo row left. */
active proctype AtTheEnd() {
  timeout ->
  assert(!FAILED);    /* no global left to an operator */
  assert(FINAL);
  /* committed: the AT change in the row, the try confirmed once */
  assert(gs != G_COMMITTED || (applied && confirms == 1 && cancels == 0 && !reserved));
  /* rolled back: no AT change, no freeze left, nothing confirmed */
  assert(gs == G_COMMITTED || (!applied && !reserved && confirms == 0));
  assert(lock_owner == 0);
  assert(undo != U_PRESENT);   /* the AT undo row: committed, or replayed */
  assert(!open)
}

/* every transaction eventually finishes (pan -a -f: under weak fairness) */
ltl finishes { <> (gs == G_COMMITTED || gs == G_ROLLBACKED || gs == G_TIMEOUT_ROLLBACKED) }

init {
  atomic {
    gs = G_BEGIN;
    run TC(); run RM(); run Net();
    run TM(); run AtBranch(); run TccBranch()
  }
}
