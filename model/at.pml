/*
 * model/at.pml - the AT protocol: one global transaction G1 with two
 * branches on rows 0 and 1, a second one G2 contending for row 0, the
 * coordinator with its store, one RM process serving phase two, and the
 * faults: message loss, duplication and reordering between the TC and
 * the RM, a TC crash (volatile state lost, the store kept), an RM that
 * dies after its local commit and before it reports, a late local commit
 * after a timeout rollback, a TM that dies before deciding.
 *
 * The two ways an AT commit ends (sql/tc/010_commit_at_decision.sql):
 *   - G1's branches are plain AT (no commit work): its commit is finished
 *     by the decision's own store transaction (history Committed, each
 *     branch PhaseTwoCommitted, the global, its branches and its locks
 *     deleted); tcd then only tells each branch in a one-way BranchCommit
 *     (tc__phase2_notify) that nothing records or retries: a notice may
 *     be lost (the network, the RM down, tcd dying right after the
 *     decision), and the RM's resolve pass (rm_undo.c "Leftovers") asks
 *     the coordinator the global's status, reads Committed from the
 *     history and deletes the row;
 *   - G2's branch has commit work (a commit delta: registered with
 *     TXP_APP_DATA_PHASE2_SYNC, its undo row marked): its commit is
 *     decided AsyncCommitting and driven as before (BranchCommit calls,
 *     outcomes recorded, *Retrying, recovery), the work applied with the
 *     row's deletion, exactly once.
 * Rollbacks and timeouts of both are driven.
 *
 * model/README.md maps each transition to the code that implements it.
 * The coordinator is in the code's own statuses (txp_status.h): a lost
 * request or answer is the call's timeout, a retryable outcome that puts
 * the global in *Retrying until recovery drives it again.
 *
 * Safety only (pan -DSAFETY): this model has no cycle (every step spends
 * a bounded fault or moves a branch or an undo row on), so a run that
 * never finishes ends where nothing can move, and AtTheEnd's "every
 * global finished, every undo row of it gone" is its liveness check;
 * tcc.pml and saga.pml, whose retries only another process's step ends,
 * get the search under weak fairness.
 *
 * Bugs to put back (each must make spin find a violation):
 *   -DBUG_NO_GUARD      a rollback that finds no undo row records nothing:
 *                       the late local commit goes in (a hanging branch)
 *   -DBUG_EARLY_UNLOCK  a rollback releases the global locks at its
 *                       decision, before the undo ran: another global
 *                       writes the row, the undo meets a dirty write
 *   -DBUG_UNDO_TWICE    a duplicated rollback replays the undo again
 *   -DBUG_RESOLVE_BEGIN the resolve pass deletes the undo rows of a
 *                       global still Begin (not only the commit family):
 *                       the global then rolls back over no undo row
 *   -DBUG_RESOLVE_ROLLBACK the resolve pass deletes the undo rows of a
 *                       global rolling back: its rollback finds none
 *   -DBUG_NO_HISTORY_STATUS the status the resolve pass asks is read from
 *                       the live globals only: a commit finished at its
 *                       decision is "not found", and the row of a lost
 *                       notice is never deleted
 *   -DBUG_FINISH_KEEPS_LOCKS the finish at the decision deletes the global
 *                       and its branches but not its locks
 *   -DBUG_NOTICE_EARLY  tcd tells the branches as it sends the decision
 *                       to the store, not once the store answered: the
 *                       decision can be lost (tcd dies, the batch
 *                       fails), the global times out and rolls back over
 *                       undo rows a notice deleted
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
/* one-way commit notices (tc__phase2_notify), in flight to the RM */
#define N_NONE 0
#define N_SENT 1

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
byte work[NG * NB];      /* how often the branch's commit work (its commit deltas) was applied */
/* ---- what happened, for the properties */
bit applied[NG * NB];    /* the branch's change is in the row */
byte undone[NG * NB];    /* how often its undo was replayed */
bit dirty;               /* a rollback met a row someone else changed */
/* ---- volatile and in flight (lost by a TC crash; faulty network) */
byte req[NG * NB];       /* a phase-two request on its way to the RM */
byte ans[NG * NB];       /* its answer on its way back */
bit note[NG * NB];       /* a one-way commit notice on its way to the RM */
bit reported[NG * NB];   /* the TM heard the branch's outcome ok */
byte faults = FAULTS;
byte crashes = TC_CRASHES;

#define IX(g, b) ((g) * NB + (b))
#define ROW(g, b) ((g) == 1 -> (b) : 0)
#define NBR(g) ((g) == 1 -> 2 : 1)
/* the branch registered with commit work (TXP_APP_DATA_PHASE2_SYNC, its
 * undo row marked): G2's */
#define SYNC(k) ((k) == IX(2, 0))
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
/* tc_decide_batch's at_only: no branch of another type (none here) nor
 * with commit work */
#define AT_ONLY(g) (!(bs[IX(g, 0)] != B_NONE && SYNC(IX(g, 0))) && \
                    (NBR(g) == 1 || !(bs[IX(g, 1)] != B_NONE && SYNC(IX(g, 1)))))
/* what the resolve pass deletes (rm_undo.c commit_family): the rows of a
 * global the coordinator answers in the commit family, Committed read
 * from the history (tc_read_status: global_table, then global_history) */
#if defined(BUG_NO_HISTORY_STATUS)
#define RESOLVES(g) COMMIT_FAM(g)
#elif defined(BUG_RESOLVE_BEGIN)
#define RESOLVES(g) (COMMIT_FAM(g) || gs[g] == G_COMMITTED || gs[g] == G_BEGIN)
#elif defined(BUG_RESOLVE_ROLLBACK)
#define RESOLVES(g) (COMMIT_FAM(g) || gs[g] == G_COMMITTED || ROLLBACK_FAM(g) || TIMEOUT_FAM(g))
#else
#define RESOLVES(g) (COMMIT_FAM(g) || gs[g] == G_COMMITTED)
#endif

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
 * finished at once; a commit of AT branches without commit work is
 * finished at once too (010): history Committed, its branches
 * PhaseTwoCommitted, its locks gone, and tcd tells each branch once the
 * store answered (tc__phase2_notify: one-way, volatile); another commit
 * deletes its locks and is driven; a rollback keeps them (marked
 * rollbacking) until it finishes. */
inline decide(g, to) {
  if
  :: bs[IX(g, 0)] == B_NONE && (NBR(g) == 1 || bs[IX(g, 1)] == B_NONE) ->
     gs[g] = (to == G_ASYNC_COMMITTING -> G_COMMITTED : (to == G_ROLLBACKING -> G_ROLLBACKED : G_TIMEOUT_ROLLBACKED));
     release_locks(g)
  :: else ->
     if
     :: to == G_ASYNC_COMMITTING && AT_ONLY(g) ->
        gs[g] = G_COMMITTED;
#ifndef BUG_FINISH_KEEPS_LOCKS
        release_locks(g);
#endif
        assert(lock_owner[0] != g && lock_owner[1] != g);
        if :: bs[IX(g, 0)] != B_NONE -> bs[IX(g, 0)] = B_COMMITTED; note[IX(g, 0)] = N_SENT :: else -> skip fi;
        if
        :: NBR(g) == 2 && bs[IX(g, 1)] != B_NONE -> bs[IX(g, 1)] = B_COMMITTED; note[IX(g, 1)] = N_SENT
        :: else -> skip
        fi
     :: else ->
        gs[g] = to;
        if :: to == G_ASYNC_COMMITTING -> release_locks(g) :: else -> EARLY_UNLOCK(g) fi
     fi
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
#ifdef BUG_NOTICE_EARLY
  :: atomic { (reported[IX(g, 0)] && (NBR(g) == 1 || reported[IX(g, 1)])) && gs[g] == G_BEGIN && AT_ONLY(g) ->
       note[IX(g, 0)] = N_SENT; if :: NBR(g) == 2 -> note[IX(g, 1)] = N_SENT :: else -> skip fi };
     if
     :: atomic { gs[g] == G_BEGIN -> decide(g, G_ASYNC_COMMITTING) }
     :: skip   /* the decision lost: tcd died, the batch failed */
     fi
  :: atomic { (reported[IX(g, 0)] && (NBR(g) == 1 || reported[IX(g, 1)])) && gs[g] == G_BEGIN && !AT_ONLY(g) ->
       decide(g, G_ASYNC_COMMITTING) }
#else
  :: atomic { (reported[IX(g, 0)] && (NBR(g) == 1 || reported[IX(g, 1)])) && gs[g] == G_BEGIN ->
       decide(g, G_ASYNC_COMMITTING) }
#endif
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
  /* crash and restart: requests, answers and notices in flight (or
   * not sent yet: a crash right after a decision) are gone */
  :: atomic {
       crashes > 0 -> crashes--;
       for (i : 0 .. NG * NB - 1) { req[i] = R_NONE; ans[i] = A_NONE; note[i] = N_NONE }
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

/* A branch's commit at the RM (rm_commit.c, rm_undo.c): delete its undo
 * row (queued for the deleter: a lost queue is a lost notice); a marked
 * row's commit deltas are applied with its deletion, in one local
 * transaction (the deletion is the mark: once). */
#define COMMIT_ROW(k) \
  if \
  :: undo[k] == U_PRESENT -> \
     if :: SYNC(k) -> work[k]++; assert(work[k] <= 1) :: else -> skip fi; \
     undo[k] = U_GONE \
  :: else -> skip \
  fi

#define SERVE(g, b) \
  atomic { req[IX(g, b)] != R_NONE -> \
    if \
    :: req[IX(g, b)] == R_COMMIT -> \
       COMMIT_ROW(IX(g, b)); \
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

/* A commit notice (one way: nothing answers, nothing records it).  A
 * relayed one is checked against the store first (tc_peer.c
 * on_relay_checked: a live commit, or the history's Committed listing the
 * branch): the notice of a decision on record only. */
#define TELL(g, b) \
  atomic { note[IX(g, b)] != N_NONE -> \
    COMMIT_ROW(IX(g, b)); \
    if \
    :: note[IX(g, b)] = N_NONE \
    :: faults > 0 -> faults--     /* duplicated */ \
    fi }

/* The resolve pass (rm_undo.c resolve_resource, every resolve_interval_s,
 * at start-up, and rm__undo_resolve_soon after a lost coordinator
 * connection): for an undo row (log_status 0: not a guard) it asks the
 * global's status (rm_tm_status) and commits the rows of the commit
 * family; Begin and rollback-family rows stay.  A pass that leaves a row
 * changes nothing: only the passes that delete are drawn.  The answer
 * and the delete are two steps in the code; a commit-family status never
 * leaves the family, so one step here. */
#define RESOLVE(g, b) \
  atomic { undo[IX(g, b)] == U_PRESENT && RESOLVES(g) -> COMMIT_ROW(IX(g, b)) }

proctype RM() {
end:
  do
  :: SERVE(1, 0)
  :: SERVE(1, 1)
  :: SERVE(2, 0)
  :: TELL(1, 0)
  :: TELL(1, 1)
  :: TELL(2, 0)
  :: RESOLVE(1, 0)
  :: RESOLVE(1, 1)
  :: RESOLVE(2, 0)
  od
}

/* The faulty network: a request or an answer lost, the coordinator's
 * call times out (tc_server.c), a retryable outcome; a notice lost (or its
 * RM down, or its relay refused): nobody knows. */
#define LOSE(k) \
  :: atomic { faults > 0 && req[k] != R_NONE -> req[k] = R_NONE; ans[k] = A_RETRY; faults-- } \
  :: atomic { faults > 0 && ans[k] == A_OK -> ans[k] = A_RETRY; faults-- } \
  :: atomic { faults > 0 && note[k] != N_NONE -> note[k] = N_NONE; faults-- }

proctype Net() {
end:
  do
  LOSE(IX(1, 0))
  LOSE(IX(1, 1))
  LOSE(IX(2, 0))
  od
}

/* At the end (nothing can move): every global finished, atomically, no
 * lock left, no undo row left (a finished global's rows are all gone:
 * deleted by its commit, a notice or the resolve pass, or replayed), the
 * commit work in once if its global committed and never otherwise. */
active proctype AtTheEnd() {
  timeout ->
  assert(!FAILED(1) && !FAILED(2));
  assert(FINAL(1) && FINAL(2));
  assert(gs[1] != G_COMMITTED || (applied[IX(1, 0)] && applied[IX(1, 1)]));
  assert(gs[1] == G_COMMITTED || (!applied[IX(1, 0)] && !applied[IX(1, 1)]));
  assert(gs[2] != G_COMMITTED || applied[IX(2, 0)]);
  assert(gs[2] == G_COMMITTED || !applied[IX(2, 0)]);
  assert(lock_owner[0] == 0 && lock_owner[1] == 0);
  assert(undo[IX(1, 0)] != U_PRESENT && undo[IX(1, 1)] != U_PRESENT && undo[IX(2, 0)] != U_PRESENT);
  assert(gs[2] != G_COMMITTED || work[IX(2, 0)] == 1);
  assert(gs[2] == G_COMMITTED || work[IX(2, 0)] == 0)
}

init {
  atomic {
    gs[1] = G_BEGIN; gs[2] = G_BEGIN;
    run TC(); run RM(); run Net();
    run TM(1); run Branch(1, 0); run Branch(1, 1);
    run TM(2); run Branch(2, 0)
  }
}
