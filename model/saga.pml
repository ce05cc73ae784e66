/*
 * model/saga.pml - a saga: one global transaction G1 with two saga steps
 * S1, S2 (added by the TM in this order) and a TCC branch T (tried,
 * registered after them: the newest, the first one compensated), the
 * coordinator's phase-two drives as tc/tc_phase2.c runs them (a drive
 * reads the branches from the store, keeps its own copy and its
 * direction, and calls one branch at a time: a saga's commit runs the
 * steps' actions in order, then the other branches; a rollback runs
 * every compensation newest first), the store's op for each outcome
 * (tc_phase2_batch of sql/tc/009_saga.sql and 011_stale_outcomes.sql: an
 * action that fails for good turns the saga to Rollbacking, and the drive
 * that heard it goes on as the compensating one; a stale outcome is not
 * recorded), and the fence (rm_fence_saga, rm_fence_phase2).
 *
 * Faults: a call that times out (its request lost, or still delivered
 * later: a ghost the RM runs with nobody waiting for the answer), an
 * answer lost, a TC crash (every drive gone; the store kept; recovery
 * drives again), a second drive of the same global while one runs (the
 * lease ran out under a slow drive or a paused node: tc_claim_retries), a
 * TM that dies (the timeout job rolls back), an action that fails for
 * good (the business refuses; run again it may not).
 *
 * model/README.md maps each transition to the code.
 *
 * Bugs to put back (each must make spin find a violation):
 *   -DBUG_OLDEST_FIRST    compensations in registration order: S1's runs
 *                         while S2's action is still in effect
 *   -DBUG_NO_EMPTY_COMP   a compensation that finds no row records
 *                         nothing: a late action goes in after the saga
 *                         was compensated
 *   -DBUG_DRIVE_GOES_ON   (the code before the fix, one part) a drive
 *                         goes on in its own direction after the store
 *                         says the global turned: a commit drive confirms
 *                         T after another drive turned the saga to its
 *                         compensations
 *   -DBUG_OUTCOME_AGAINST (another part) the store records an outcome
 *                         against the global's direction: the stale
 *                         drive's action, refused because its step was
 *                         compensated first, fails the rollback
 *                         (RollbackFailed for a saga compensated in full)
 *   -DBUG_FAILURE_OVER_DONE (the last part) the store records a failure
 *                         over the status the branch finished with: a
 *                         stale "failed for good" of a step that another
 *                         drive's delivery ran turns the saga, while that
 *                         drive confirms T
 *   (the three together: the code before tc_phase2.c's stale-drive stop
 *   and sql/tc/011_stale_outcomes.sql)
 *   -DBUG_COMP_WAITS      (liveness) a compensation that finds no row asks
 *                         for a retry, waiting for its action, instead of
 *                         recording the empty compensation: when the
 *                         action never comes, it is retried for ever
 *
 * Bounds: FAULTS call faults, TC_CRASHES crashes, OVERLAPS second drives.
 */
#ifndef FAULTS
#define FAULTS 1
#endif
#ifndef TC_CRASHES
#define TC_CRASHES 1
#endif
#ifndef OVERLAPS
#define OVERLAPS 1
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
#define B_REGISTERED 1
#define B_COMMITTED 5
#define B_COMMIT_RETRY 6
#define B_COMMIT_FAILED 7
#define B_ROLLBACKED 8
#define B_ROLLBACK_RETRY 9
#define B_ROLLBACK_FAILED 10
/* branch_fence rows (rm_fence.h) */
#define F_NONE 0
#define F_TRIED 1
#define F_CONFIRMED 2
#define F_CANCELLED 3
#define F_CANCELLED_EMPTY 4
#define CANCELLED(f) ((f) == F_CANCELLED || (f) == F_CANCELLED_EMPTY)
/* answers (and the call's timeout: retryable) */
#define A_NONE 0
#define A_OK 1
#define A_RETRY 2
#define A_FAIL 3
/* the store op's result (tc_store.c) */
#define RES_OK 1
#define RES_FINISHED 2
#define RES_FAILED 3
#define RES_RETRY 4
#define RES_COMPENSATE 5
#define RES_NOT_FOUND 6
/* a drive's phase */
#define P_IDLE 0
#define P_NEXT 1
#define P_WAIT 2

#define NB 3       /* branches in registration order: S1, S2, T */
#define S1 0
#define S2 1
#define T 2
#define STEP(b) ((b) != T)
#define ND 2       /* drives at once */

/* ---- the coordinator's store */
byte gs;
byte bs[NB];
/* ---- the resources' databases */
byte fence[NB];
bit done[2];               /* step i's action is in effect */
bit reserved;              /* T's freeze (its try committed) */
byte confirms, cancels;
/* ---- the drives (volatile: a crash ends them) */
byte phase[ND];
bit dcommit[ND];           /* the drive's direction, fixed at its start */
bit first[ND];             /* at its start: nothing to drive -> re-record one */
byte pos[ND];              /* next place in its order */
byte cur[ND];              /* the branch it called */
byte rows[ND * NB];        /* its copy of the branch statuses */
/* ---- calls: one per drive; ghosts: requests that reach the RM late */
byte req[ND];              /* 0, or the branch + 1 */
bit reqcommit[ND];
byte ans[ND];
bit ghostc[NB], ghostr[NB];
byte faults = FAULTS;
byte crashes = TC_CRASHES;
byte overlaps = OVERLAPS;

#define COMMIT_FAM (gs == G_COMMITTING || gs == G_COMMIT_RETRYING || gs == G_ASYNC_COMMITTING || gs == G_COMMIT_FAILED)
#define ROLLBACK_FAM (gs == G_ROLLBACKING || gs == G_ROLLBACK_RETRYING || gs == G_ROLLBACK_FAILED)
#define TIMEOUT_FAM (gs == G_TIMEOUT_ROLLBACKING || gs == G_TIMEOUT_ROLLBACK_RETRYING || gs == G_TIMEOUT_ROLLBACK_FAILED)
/* tc_claim_retries: 2..8 */
#define DRIVEN (gs >= G_COMMITTING && gs <= G_ASYNC_COMMITTING)
#define FINAL (gs == G_COMMITTED || gs == G_ROLLBACKED || gs == G_TIMEOUT_ROLLBACKED)
#define FAILED (gs == G_COMMIT_FAILED || gs == G_ROLLBACK_FAILED || gs == G_TIMEOUT_ROLLBACK_FAILED)
#define ACTIVE(d) (phase[d] != P_IDLE)

/* tc_phase2.c branch_finished: for a rollback a step whose action ran
 * is not finished (its compensation is to run) */
#define FIN(commit, st, b) ((st) == B_ROLLBACKED || ((st) == B_COMMITTED && ((commit) || !STEP(b))))
/* the order of a drive: a saga's commit S1, S2, then T; a rollback
 * newest first: T, S2, S1 */
#ifdef BUG_OLDEST_FIRST
#define ORD(d, i) (i)
#else
#define ORD(d, i) (dcommit[d] -> (i) : 2 - (i))
#endif
#define ROW(d, b) rows[(d) * NB + (b)]

/* Start drive d from the store (tc__phase2_drive): its direction and its
 * copy of the rows. */
inline start_drive(d) {
  phase[d] = P_NEXT; dcommit[d] = COMMIT_FAM; first[d] = 1; pos[d] = 0;
  ROW(d, S1) = bs[S1]; ROW(d, S2) = bs[S2]; ROW(d, T) = bs[T]
}

/* tc_decide_batch (with its first drive, on_decide_done / the timeout
 * job's on_timeout_decided) */
inline decide(to) {
  gs = to;
  start_drive(0)
}

/* tc_phase2_batch for one outcome 'st' of branch 'b' (sql/tc/009_saga.sql
 * as in schema.sql): the branch's status overwritten by any phase-two
 * outcome; a step's action failed for good (7) in a saga going forward
 * turns it to Rollbacking ('compensate'); else by the global's family
 * (the *Failed ones count in theirs): unretryable -> *Failed, retryable
 * -> *Retrying, nothing left -> final (a step at 5 is left in a
 * rollback). */
#define LEFT_IN(b) (bs[b] != B_COMMITTED && bs[b] != B_ROLLBACKED || (!COMMIT_FAM && STEP(b) && bs[b] == B_COMMITTED))
/* An outcome the store must not take (sql/tc/011_stale_outcomes.sql):
 * against the global's direction (a commit drive's, after a saga turned
 * to its compensations), or over a status the branch finished with in
 * that direction (a call that timed out, or failed, before another call
 * of the same branch went through). */
#define COMMIT_OUT(st) ((st) == B_COMMITTED || (st) == B_COMMIT_RETRY || (st) == B_COMMIT_FAILED)
#ifdef BUG_OUTCOME_AGAINST
#define AGAINST(st) 0
#else
#define AGAINST(st) (COMMIT_OUT(st) != COMMIT_FAM)
#endif
#ifdef BUG_FAILURE_OVER_DONE
#define OVER_DONE(b, st) 0
#else
#define OVER_DONE(b, st) ((((st) == B_COMMIT_RETRY || (st) == B_COMMIT_FAILED) && bs[b] == B_COMMITTED) || \
                          (((st) == B_ROLLBACK_RETRY || (st) == B_ROLLBACK_FAILED) && bs[b] == B_ROLLBACKED))
#endif
#define STALE(b, st) (AGAINST(st) || OVER_DONE(b, st))
inline store_op(b, st) {
  if
  :: !(DRIVEN || FAILED) -> res = RES_NOT_FOUND
  :: (DRIVEN || FAILED) && STALE(b, st) -> res = RES_OK    /* ignored */
  :: else ->
     bs[b] = st;
     if
     :: st == B_COMMIT_FAILED && STEP(b) && (gs == G_COMMITTING || gs == G_COMMIT_RETRYING || gs == G_ASYNC_COMMITTING) ->
        gs = G_ROLLBACKING; res = RES_COMPENSATE
     :: else ->
        if
        :: st == B_COMMIT_FAILED || st == B_ROLLBACK_FAILED ->
           gs = (COMMIT_FAM -> G_COMMIT_FAILED : (ROLLBACK_FAM -> G_ROLLBACK_FAILED : G_TIMEOUT_ROLLBACK_FAILED));
           res = RES_FAILED
        :: st == B_COMMIT_RETRY || st == B_ROLLBACK_RETRY ->
           gs = (COMMIT_FAM -> G_COMMIT_RETRYING : (ROLLBACK_FAM -> G_ROLLBACK_RETRYING : G_TIMEOUT_ROLLBACK_RETRYING));
           res = RES_RETRY
        :: else ->
           if
           :: !LEFT_IN(S1) && !LEFT_IN(S2) && !LEFT_IN(T) ->
              gs = (COMMIT_FAM -> G_COMMITTED : (ROLLBACK_FAM -> G_ROLLBACKED : G_TIMEOUT_ROLLBACKED));
              res = RES_FINISHED
           :: else -> res = RES_OK
           fi
        fi
     fi
  fi
}

/* handle_stored: the drive's copy follows; then continue, turn to the
 * compensations, or stop */
inline stored(d) {
  ROW(d, cur[d]) = st;
  if
  :: res == RES_COMPENSATE -> dcommit[d] = 0; first[d] = 1; pos[d] = 0; phase[d] = P_NEXT
  :: res == RES_OK ->
#ifndef BUG_DRIVE_GOES_ON
     /* the store says the global turned (another drive heard an action
      * fail for good): this drive's direction is stale */
     if :: dcommit[d] != COMMIT_FAM -> phase[d] = P_IDLE :: else -> phase[d] = P_NEXT fi
#else
     phase[d] = P_NEXT
#endif
  :: else -> phase[d] = P_IDLE   /* finished, failed, retry (sequential), not found */
  fi;
  res = 0; st = 0
}

proctype Driver(byte d) {
  byte res, st, i;
end:
  do
  /* the next branch to call: skip those finished in the copy; none at
   * the start: record the last finished one again (the store finishes
   * the session); none later: done */
  :: atomic {
       phase[d] == P_NEXT && req[d] == 0 ->
       do
       :: pos[d] < NB && FIN(dcommit[d], ROW(d, ORD(d, pos[d])), ORD(d, pos[d])) -> i = ORD(d, pos[d]); pos[d]++
       :: else -> break
       od;
       if
       :: pos[d] < NB ->
          cur[d] = ORD(d, pos[d]); pos[d]++;
          req[d] = cur[d] + 1; reqcommit[d] = dcommit[d]; phase[d] = P_WAIT
       :: pos[d] >= NB && first[d] ->
          cur[d] = i; st = ROW(d, i); store_op(i, st); stored(d); phase[d] = P_IDLE
       :: else -> phase[d] = P_IDLE
       fi;
       first[d] = 0; i = 0
     }
  /* its answer (or the call's timeout): the outcome stored */
  :: atomic {
       phase[d] == P_WAIT && ans[d] != A_NONE ->
       if
       :: ans[d] == A_OK -> st = (dcommit[d] -> B_COMMITTED : B_ROLLBACKED)
       :: ans[d] == A_RETRY -> st = (dcommit[d] -> B_COMMIT_RETRY : B_ROLLBACK_RETRY)
       :: ans[d] == A_FAIL -> st = (dcommit[d] -> B_COMMIT_FAILED : B_ROLLBACK_FAILED)
       fi;
       ans[d] = A_NONE;
       store_op(cur[d], st);
       stored(d)
     }
  od
}

/* The TM: S1 and S2 added, T tried (init); commit, roll back, or die. */
proctype TM() {
  if
  :: atomic { gs == G_BEGIN -> decide(G_ASYNC_COMMITTING) }
  :: atomic { gs == G_BEGIN -> decide(G_ROLLBACKING) }
  :: skip
  fi
}

/* The coordinator: the timeout job, recovery's claim (a drive of a global
 * in phase two whose lease ran out: a second one while another runs is a
 * fault, OVERLAPS), a crash (drives gone; a request on its way may
 * still reach the RM). */
#define CLAIM(d) \
  atomic { DRIVEN && !ACTIVE(d) && req[d] == 0 && ans[d] == A_NONE && \
           (!ACTIVE(1 - d) || overlaps > 0) -> \
           if :: ACTIVE(1 - d) -> overlaps-- :: else -> skip fi; \
           start_drive(d) }
#define GHOST(d) \
  if \
  :: req[d] != 0 && reqcommit[d] -> ghostc[req[d] - 1] = 1 \
  :: req[d] != 0 && !reqcommit[d] -> ghostr[req[d] - 1] = 1 \
  :: else -> skip \
  fi; \
  req[d] = 0

proctype TC() {
end:
  do
  :: atomic { gs == G_BEGIN -> decide(G_TIMEOUT_ROLLBACKING) }
  :: CLAIM(0)
  :: CLAIM(1)
  :: atomic {
       crashes > 0 -> crashes--;
       GHOST(0); GHOST(1);
       phase[0] = P_IDLE; phase[1] = P_IDLE; ans[0] = A_NONE; ans[1] = A_NONE
     }
  od
}

/* ---- the RM: phase two behind the fence (rm_fence_run) */

/* a saga step (rm_fence_saga): the action inserts the row, runs, sets
 * confirmed, or fails for good and leaves no row; a compensation runs
 * on confirmed, records "cancelled before any try" on no row */
inline step_call(b, commit) {
  if
  :: commit && fence[b] == F_NONE ->
     if
     :: assert(b == S1 || fence[S1] == F_CONFIRMED);   /* actions in order */
        assert(!done[b]); done[b] = 1; fence[b] = F_CONFIRMED; a = A_OK
     :: a = A_FAIL                                      /* failed for good: rolled back */
     fi
  :: commit && fence[b] == F_CONFIRMED -> a = A_OK
  :: commit && CANCELLED(fence[b]) -> a = A_FAIL        /* compensated first: refused */
  :: !commit && fence[b] == F_CONFIRMED ->
     assert(b == S2 || CANCELLED(fence[S2]));           /* compensations newest first */
     assert(done[b]); done[b] = 0; fence[b] = F_CANCELLED; a = A_OK
  :: !commit && fence[b] == F_NONE ->
     assert(b == S2 || CANCELLED(fence[S2]));
#if defined(BUG_COMP_WAITS)
     a = A_RETRY
#else
#ifndef BUG_NO_EMPTY_COMP
     fence[b] = F_CANCELLED_EMPTY;
#endif
     a = A_OK
#endif
  :: !commit && CANCELLED(fence[b]) -> a = A_OK
  fi
}

/* the TCC branch (rm_fence_phase2) */
inline tcc_call(commit) {
  if
  :: fence[T] == F_TRIED ->
     assert(reserved); reserved = 0;
     if
     :: commit -> assert(done[S1] && done[S2]); confirms++; fence[T] = F_CONFIRMED   /* after every step */
     :: else -> cancels++; fence[T] = F_CANCELLED
     fi;
     a = A_OK
  :: fence[T] == F_CONFIRMED -> a = (commit -> A_OK : A_FAIL)
  :: fence[T] == F_CANCELLED -> a = (commit -> A_FAIL : A_OK)
  fi
}

inline call(b, commit) {
  if
  :: STEP(b) -> step_call(b, commit)
  :: else -> tcc_call(commit)
  fi
}

proctype RM() {
  byte a;
end:
  do
  :: atomic { req[0] != 0 -> call(req[0] - 1, reqcommit[0]); ans[0] = a; req[0] = 0; a = 0 }
  :: atomic { req[1] != 0 -> call(req[1] - 1, reqcommit[1]); ans[1] = a; req[1] = 0; a = 0 }
  :: atomic { ghostc[S1] -> call(S1, 1); ghostc[S1] = 0; a = 0 }
  :: atomic { ghostc[S2] -> call(S2, 1); ghostc[S2] = 0; a = 0 }
  :: atomic { ghostc[T] -> call(T, 1); ghostc[T] = 0; a = 0 }
  :: atomic { ghostr[S1] -> call(S1, 0); ghostr[S1] = 0; a = 0 }
  :: atomic { ghostr[S2] -> call(S2, 0); ghostr[S2] = 0; a = 0 }
  :: atomic { ghostr[T] -> call(T, 0); ghostr[T] = 0; a = 0 }
  od
}

/* The network: a call that times out (its request lost, or on its way
 * still: a ghost), an answer lost. */
#define CALL_FAULTS(d) \
  :: atomic { faults > 0 && req[d] != 0 -> faults--; req[d] = 0; ans[d] = A_RETRY } \
  :: atomic { faults > 0 && req[d] != 0 -> faults--; GHOST(d); ans[d] = A_RETRY } \
  :: atomic { faults > 0 && (ans[d] == A_OK || ans[d] == A_FAIL) -> faults--; ans[d] = A_RETRY }

proctype Net() {
end:
  do
  CALL_FAULTS(0)
  CALL_FAULTS(1)
  od
}

active proctype AtTheEnd() {
  timeout ->
  assert(!FAILED);
  assert(FINAL);
  assert(gs != G_COMMITTED || (done[S1] && done[S2] && confirms == 1 && cancels == 0));
  assert(gs == G_COMMITTED || (!done[S1] && !done[S2] && confirms == 0 && cancels == 1));
  assert(!reserved)
}

ltl finishes { <> (gs == G_COMMITTED || gs == G_ROLLBACKED || gs == G_TIMEOUT_ROLLBACKED) }

init {
  atomic {
    gs = G_BEGIN;
    bs[S1] = B_REGISTERED; bs[S2] = B_REGISTERED; bs[T] = B_REGISTERED;
    fence[T] = F_TRIED; reserved = 1;
    run TC(); run RM(); run Net(); run Driver(0); run Driver(1); run TM()
  }
}
