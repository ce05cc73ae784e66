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

/* global status (txp_status.h numbers) */
#define G_NONE 0
#define G_BEGIN 1
#define G_COMMITTING 2
#define G_ROLLBACKING 4
#define G_COMMITTED 9
#define G_ROLLBACKED 11
/* branch status */
#define B_NONE 0
#define B_REGISTERED 1
#define B_COMMITTED 5
#define B_ROLLBACKED 8
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
#define A_DIRTY 2

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
#define FINAL(g) (gs[g] == G_COMMITTED || gs[g] == G_ROLLBACKED)

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
       /* tc_decide_batch: a commit releases the locks at the decision */
       gs[g] = G_COMMITTING; release_locks(g) }
  :: atomic { gs[g] == G_BEGIN -> gs[g] = G_ROLLBACKING; EARLY_UNLOCK(g) }
  :: skip        /* dies before deciding */
  fi
}

/* The coordinator: the timeout job, and phase two driven from the store
 * (the first drive and recovery's re-drives are the same transitions:
 * nothing but the store is needed).  A crash loses what is in flight. */
#define DECIDED(g) (gs[g] == G_COMMITTING || gs[g] == G_ROLLBACKING)
#define NOTHING_LEFT(g) (bs[IX(g, 0)] != B_REGISTERED && (NBR(g) == 1 || bs[IX(g, 1)] != B_REGISTERED))

/* tc_timeout job: a global still Begin past its deadline is rolled back */
#define TIMEOUT(g) \
  atomic { gs[g] == G_BEGIN -> gs[g] = G_ROLLBACKING; EARLY_UNLOCK(g) }
/* phase two: send a branch its request (again, after a loss or a crash) */
#define SEND(g, b) \
  atomic { DECIDED(g) && bs[IX(g, b)] == B_REGISTERED && req[IX(g, b)] == R_NONE && ans[IX(g, b)] == A_NONE -> \
           req[IX(g, b)] = (gs[g] == G_COMMITTING -> R_COMMIT : R_ROLLBACK) }
/* an answer: the branch recorded (tc_phase2_batch) and the global
 * finished when no branch is left; a rollback releases its locks then */
#define ANSWER(g, b) \
  atomic { ans[IX(g, b)] != A_NONE -> \
           if \
           :: ans[IX(g, b)] == A_OK && bs[IX(g, b)] == B_REGISTERED && DECIDED(g) -> \
              bs[IX(g, b)] = (gs[g] == G_COMMITTING -> B_COMMITTED : B_ROLLBACKED) \
           :: else -> skip \
           fi; \
           ans[IX(g, b)] = A_NONE }
/* a decided global with nothing left to drive is finished */
#define FINISH(g) \
  atomic { DECIDED(g) && NOTHING_LEFT(g) -> \
           if \
           :: gs[g] == G_COMMITTING -> gs[g] = G_COMMITTED \
           :: else -> gs[g] = G_ROLLBACKED; release_locks(g) \
           fi; \
           assert(lock_owner[0] != g && lock_owner[1] != g) }

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
  :: FINISH(1)
  :: FINISH(2)
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

/* The faulty network: a request or an answer lost. */
#define LOSE(k) \
  :: atomic { faults > 0 && req[k] != R_NONE -> req[k] = R_NONE; faults-- } \
  :: atomic { faults > 0 && ans[k] != A_NONE -> ans[k] = A_NONE; faults-- }

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
  assert(FINAL(1) && FINAL(2));
  assert(gs[1] != G_COMMITTED || (applied[IX(1, 0)] && applied[IX(1, 1)]));
  assert(gs[1] != G_ROLLBACKED || (!applied[IX(1, 0)] && !applied[IX(1, 1)]));
  assert(gs[2] != G_COMMITTED || applied[IX(2, 0)]);
  assert(gs[2] != G_ROLLBACKED || !applied[IX(2, 0)]);
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
