/*
 * model/at.pml - the AT protocol: one global transaction G1 with two
 * branches on rows 0 and 1, a second one G2 contending for row 0, the
 * coordinator with its store, one RM process serving phase two, and the
 * faults: message loss, duplication and reordering between the TC and
 * the RM, a TC crash (volatile state lost, the store kept), an RM that
 * dies after its local commit and before it reports, a late local commit
 * after a timeout rollback, a TM that dies before deciding.
 *
 * model/README.md maps each transition to the code that implements it.
 * The coordinator is in the code's own statuses (txp_status.h): a lost
 * request or answer is the call's timeout, a retryable outcome that puts
 * the global in *Retrying until recovery drives it again.
 *
 * Safety only (pan -DSAFETY): this model has no cycle (every step spends
 * a bounded fault or moves a branch on), so a run that never finishes
 * ends where nothing can move, and AtTheEnd's "every global finished"
 * is its liveness check; tcc.pml and saga.pml, whose retries only another
 * process's step ends, get the search under weak fairness.
 *
 * Bugs to put back (each must make spin find a violation):
 *   -DBUG_NO_GUARD      a rollback that finds no undo row records nothing:
 *                       the late local commit goes in (a hanging branch)
 *   -DBUG_EARLY_UNLOCK  a rollback releases the global locks at its
 *                       decision, before the undo ran: another global
 *                       writes the row, the undo meets a dirty write
 *   -DBUG_UNDO_TWICE    a duplicated rollback replays the undo again
 *
 * Bounds: FAULTS message faults (loss or duplication) and TC_CRASHES
 * coordinator crashes per run.
 */
#ifndef FAULTS
#define FAULTS 2
#endif
#ifndef TC_CRASHES
#define TC_CRASHES 1
#endif

/* global status (txp_status.h) */
#define G_NONE 0
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
/* undo_log row of a branch, in the RM's database */
#define U_NONE 0
#define U_PRESENT 1    /* the local commit wrote it with the before image */
#define U_GUARD 2      /* a rollback found none and inserted the guard row */
#define U_GONE 3       /* deleted by phase two */
/* phase-two requests and answers */
#define R_NONE 0
#define R_COMMIT 1
#define R_ROLLBACK 2
#define A_NONE 0
#define A_OK 1
#define A_RETRY 2      /* retryable: the call timed out (a loss) */

#define NG 3   /* globals 1 and 2 (0 unused) */
#define NB 2   /* branches per global */
#define NR 2   /* rows */

/* ---- the coordinator's store (PostgreSQL: survives a TC crash) */
byte gs[NG];
byte bs[NG * NB];
byte lock_owner[NR];
/* ---- the RM's database */
byte data[NR];           /* the value in a row: 0, or the global that wrote it */
byte undo[NG * NB];
byte before[NG * NB];
/* ---- what happened, for the properties */
bit applied[NG * NB];    /* the branch's change is in the row */
byte undone[NG * NB];    /* how often its undo was replayed */
bit dirty;               /* a rollback met a row someone else changed */
/* ---- volatile and in flight (lost by a TC crash; faulty network) */
byte req[NG * NB];       /* a phase-two request on its way to the RM */
byte ans[NG * NB];       /* its answer on its way back */
bit reported[NG * NB];   /* the TM heard the branch's outcome ok */
byte faults = FAULTS;
byte crashes = TC_CRASHES;

#define IX(g, b) ((g) * NB + (b))
#define ROW(g, b) ((g) == 1 -> (b) : 0)
#define NBR(g) ((g) == 1 -> 2 : 1)
#define COMMIT_FAM(g) (gs[g] == G_COMMITTING || gs[g] == G_COMMIT_RETRYING || gs[g] == G_ASYNC_COMMITTING)
#define ROLLBACK_FAM(g) (gs[g] == G_ROLLBACKING || gs[g] == G_ROLLBACK_RETRYING)
#define TIMEOUT_FAM(g) (gs[g] == G_TIMEOUT_ROLLBACKING || gs[g] == G_TIMEOUT_ROLLBACK_RETRYING)
/* phase two runs: the first drive, or recovery's claim (tc_claim_retries: 2..8) */
#define DRIVEN(g) (COMMIT_FAM(g) || ROLLBACK_FAM(g) || TIMEOUT_FAM(g))
#define FINAL(g) (gs[g] == G_COMMITTED || gs[g] == G_ROLLBACKED || gs[g] == G_TIMEOUT_ROLLBACKED)
#define FAILED(g) (gs[g] == G_COMMIT_FAILED || gs[g] == G_ROLLBACK_FAILED || gs[g] == G_TIMEOUT_ROLLBACK_FAILED)
#define FINISHED(k) (bs[k] == B_COMMITTED || bs[k] == B_ROLLBACKED)
#define LEFT(k) (bs[k] != B_NONE && !FINISHED(k))
#define NOTHING_LEFT(g) (!LEFT(IX(g, 0)) && (NBR(g) == 1 || !LEFT(IX(g, 1))))
#define FINAL_OF(g) (COMMIT_FAM(g) -> G_COMMITTED : (ROLLBACK_FAM(g) -> G_ROLLBACKED : G_TIMEOUT_ROLLBACKED))

#ifdef BUG_EARLY_UNLOCK
#define EARLY_UNLOCK(g) release_locks(g)
#else
#define EARLY_UNLOCK(g) skip
#endif

/* Release every lock of 'g' (part of the store's transaction). */
inline release_locks(g) {
  if :: lock_owner[0] == g -> lock_owner[0] = 0 :: else -> skip fi;
  if :: lock_owner[1] == g -> lock_owner[1] = 0 :: else -> skip fi
}

/* tc_decide_batch: from Begin only; a global without branches is
 * finished at once; a commit deletes its locks, a rollback keeps them
 * (marked rollbacking) until it finishes. */
inline decide(g, to) {
  if
  :: bs[IX(g, 0)] == B_NONE && (NBR(g) == 1 || bs[IX(g, 1)] == B_NONE) ->
     gs[g] = (to == G_ASYNC_COMMITTING -> G_COMMITTED : (to == G_ROLLBACKING -> G_ROLLBACKED : G_TIMEOUT_ROLLBACKED));
     release_locks(g)
  :: else ->
     gs[g] = to;
     if :: to == G_ASYNC_COMMITTING -> release_locks(g) :: else -> EARLY_UNLOCK(g) fi
  fi
}

/* A branch: BranchRegister (locks in the store), then the local commit
 * with its undo row, then the report to the TM.  It may die after any
 * step (the RM process crashes), or be slow: its local commit may come
 * after the coordinator rolled the global back. */
proctype Branch(byte g; byte b) {
  byte row = ROW(g, b);
  /* tc_register_batch: only while Begin; a held key waits (pushed wait)
   * until it is free or the global is no longer Begin */
  if
  :: atomic { gs[g] == G_BEGIN && (lock_owner[row] == 0 || lock_owner[row] == g) ->
       lock_owner[row] = g; bs[IX(g, b)] = B_REGISTERED }
  :: atomic { gs[g] != G_BEGIN -> goto refused }
  fi;
  if
  :: skip
  :: goto died   /* the RM dies between registration and local commit */
  fi;
  /* the local COMMIT: the undo row's insert fails on the key when a
   * rollback put its guard row there first */
  atomic {
    if
    :: undo[IX(g, b)] == U_NONE ->
       before[IX(g, b)] = data[row]; data[row] = g; undo[IX(g, b)] = U_PRESENT; applied[IX(g, b)] = 1
    :: else -> goto refused
    fi
  };
  if
  :: reported[IX(g, b)] = 1
  :: skip        /* dies after its local commit, before it reports */
  fi;
refused:
died:
  skip
}

/* The TM: commits once every branch reported, rolls back otherwise, or
 * dies without a word (the timeout rolls back). */
proctype TM(byte g) {
  if
  :: atomic { (reported[IX(g, 0)] && (NBR(g) == 1 || reported[IX(g, 1)])) && gs[g] == G_BEGIN ->
       decide(g, G_ASYNC_COMMITTING) }
  :: atomic { gs[g] == G_BEGIN -> decide(g, G_ROLLBACKING) }
  :: skip        /* dies before deciding */
  fi
}

/* The coordinator: the timeout job, and phase two driven from the store
 * (the first drive and recovery's re-drives are the same transitions:
 * nothing but the store is needed).  A crash loses what is in flight. */

/* tc_timeout job: a global still Begin past its deadline is rolled back */
#define TIMEOUT(g) atomic { gs[g] == G_BEGIN -> decide(g, G_TIMEOUT_ROLLBACKING) }
/* phase two: send a branch its request (again, after a retryable outcome
 * or a crash) */
#define SEND(g, b) \
  atomic { DRIVEN(g) && LEFT(IX(g, b)) && req[IX(g, b)] == R_NONE && ans[IX(g, b)] == A_NONE -> \
           req[IX(g, b)] = (COMMIT_FAM(g) -> R_COMMIT : R_ROLLBACK) }
/* an outcome (tc_phase2_batch): the branch's status set, a retryable
 * one puts the global in *Retrying; a retryable one over a finished
 * branch is stale, not recorded (011_stale_outcomes.sql); nothing left:
 * final, history, locks gone (a rollback's released then) */
#define ANSWER(g, b) \
  atomic { ans[IX(g, b)] != A_NONE -> \
    if \
    :: DRIVEN(g) && !(ans[IX(g, b)] == A_RETRY && FINISHED(IX(g, b))) -> \
       if \
       :: ans[IX(g, b)] == A_OK -> \
          bs[IX(g, b)] = (COMMIT_FAM(g) -> B_COMMITTED : B_ROLLBACKED); \
          if \
          :: NOTHING_LEFT(g) -> \
             gs[g] = FINAL_OF(g); release_locks(g); \
             assert(lock_owner[0] != g && lock_owner[1] != g) \
          :: else -> skip \
          fi \
       :: else -> \
          bs[IX(g, b)] = (COMMIT_FAM(g) -> B_COMMIT_RETRY : B_ROLLBACK_RETRY); \
          gs[g] = (COMMIT_FAM(g) -> G_COMMIT_RETRYING : (ROLLBACK_FAM(g) -> G_ROLLBACK_RETRYING : G_TIMEOUT_ROLLBACK_RETRYING)) \
       fi \
    :: else -> skip \
    fi; \
    ans[IX(g, b)] = A_NONE }

proctype TC() {
  byte i;
end:
  do
  :: TIMEOUT(1)
  :: TIMEOUT(2)
  :: SEND(1, 0)
  :: SEND(1, 1)
  :: SEND(2, 0)
  :: ANSWER(1, 0)
  :: ANSWER(1, 1)
  :: ANSWER(2, 0)
  /* crash and restart: requests and answers in flight are gone */
  :: atomic {
       crashes > 0 -> crashes--;
       for (i : 0 .. NG * NB - 1) { req[i] = R_NONE; ans[i] = A_NONE }
     }
  od
}

/* Phase two at the RM (rm_commit.c, rm_rollback.c): any RM of the
 * resource; takes a request, and may keep a copy (a duplicate). */
#ifdef BUG_UNDO_TWICE
#define AGAIN(k) if :: undone[k] > 0 -> undone[k]++ :: else -> skip fi
#else
#define AGAIN(k) skip
#endif
#ifdef BUG_NO_GUARD
#define GUARD(k) skip
#else
#define GUARD(k) undo[k] = U_GUARD   /* the anti-hanging guard row */
#endif

#define SERVE(g, b) \
  atomic { req[IX(g, b)] != R_NONE -> \
    if \
    :: req[IX(g, b)] == R_COMMIT -> \
       if :: undo[IX(g, b)] == U_PRESENT -> undo[IX(g, b)] = U_GONE :: else -> skip fi; \
       ans[IX(g, b)] = A_OK \
    :: req[IX(g, b)] == R_ROLLBACK -> \
       if \
       :: undo[IX(g, b)] == U_PRESENT -> \
          /* the checked replay: the row must still be what the branch wrote */ \
          assert(data[ROW(g, b)] == g); \
          data[ROW(g, b)] = before[IX(g, b)]; applied[IX(g, b)] = 0; undone[IX(g, b)]++; \
          undo[IX(g, b)] = U_GONE; ans[IX(g, b)] = A_OK \
       :: undo[IX(g, b)] == U_NONE -> GUARD(IX(g, b)); ans[IX(g, b)] = A_OK \
       :: else -> AGAIN(IX(g, b)); ans[IX(g, b)] = A_OK   /* done before: idempotent */ \
       fi; \
       assert(undone[IX(g, b)] <= 1) \
    fi; \
    if \
    :: req[IX(g, b)] = R_NONE \
    :: faults > 0 -> faults--     /* duplicated: delivered again later */ \
    fi }

proctype RM() {
end:
  do
  :: SERVE(1, 0)
  :: SERVE(1, 1)
  :: SERVE(2, 0)
  od
}

/* The faulty network: a request or an answer lost; the coordinator's
 * call times out (tc_server.c), a retryable outcome. */
#define LOSE(k) \
  :: atomic { faults > 0 && req[k] != R_NONE -> req[k] = R_NONE; ans[k] = A_RETRY; faults-- } \
  :: atomic { faults > 0 && ans[k] == A_OK -> ans[k] = A_RETRY; faults-- }

proctype Net() {
end:
  do
  LOSE(IX(1, 0))
  LOSE(IX(1, 1))
  LOSE(IX(2, 0))
  od
}

/* At the end (nothing can move): every global finished, atomically, and
 * no lock left. */
active proctype AtTheEnd() {
  timeout ->
  assert(!FAILED(1) && !FAILED(2));
  assert(FINAL(1) && FINAL(2));
  assert(gs[1] != G_COMMITTED || (applied[IX(1, 0)] && applied[IX(1, 1)]));
  assert(gs[1] == G_COMMITTED || (!applied[IX(1, 0)] && !applied[IX(1, 1)]));
  assert(gs[2] != G_COMMITTED || applied[IX(2, 0)]);
  assert(gs[2] == G_COMMITTED || !applied[IX(2, 0)]);
  assert(lock_owner[0] == 0 && lock_owner[1] == 0)
}

init {
  atomic {
    gs[1] = G_BEGIN; gs[2] = G_BEGIN;
    run TC(); run RM(); run Net();
    run TM(1); run Branch(1, 0); run Branch(1, 1);
    run TM(2); run Branch(2, 0)
  }
}
