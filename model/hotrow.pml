/*
 * model/hotrow.pml - the hot-row counter: a bucket with a capacity
 * constraint (sold + frozen <= stock, frozen >= 0: the CHECK of
 * sql/stock/001_bucket.sql), changed by deltas without a global row lock,
 * and the released-ticket bug of issue 17.
 *
 * Order A holds the bucket's only ticket (frozen 1).  A cancellation C of
 * A is a global transaction whose stock branch gives the ticket back;
 * buyers B1 and B2 each freeze one ticket in a global transaction of
 * their own (a delta, checked by the constraint).  Each global commits or
 * rolls back (its TM may die: the timeout rolls it back); phase two may
 * be delivered twice.
 *
 *   fixed (the code):  the give-back is a deferred delta: recorded at
 *                      phase one, applied by phase-two commit
 *                      (rm_at_update_delta_on_commit, rm_commit.c
 *                      apply_row_deltas), dropped by a rollback, which so
 *                      never needs capacity back
 *   -DBUG_EARLY_RELEASE the give-back applied at phase one with an undo
 *                      "frozen + 1": B takes the ticket, C's TM dies, and
 *                      the rollback's compensation is refused by the
 *                      constraint: C can never be rolled back (the bug)
 */

#define STOCK 1
#define UNDECIDED 0
#define COMMIT 1
#define ROLLBACK 2

byte frozen = 1;         /* A's ticket */
byte sold = 0;
bit a_holds = 1;         /* A's freeze is in the bucket */
bit b_holds[2];          /* B1's, B2's freeze is in the bucket */
byte c_decision, b_decision[2];
bit c_phase1;            /* C's local commit happened */
bit c_done;              /* C's phase two ran (once; a duplicate finds it done) */
bit b_phase1[2], b_done[2];
bit refused;             /* a compensation refused by the constraint */

/* The constraint, checked at each change of the row. */
#define FITS(df) (sold + frozen + (df) <= STOCK && frozen + (df) >= 0)

/* The cancellation's stock branch, then its TM. */
proctype Cancel() {
  atomic {
#ifdef BUG_EARLY_RELEASE
    frozen--; a_holds = 0;       /* the give-back now, its undo "+1" */
#endif
    c_phase1 = 1
  };
  if
  :: c_decision = COMMIT
  :: c_decision = ROLLBACK       /* the TM rolls back, or dies: the timeout does */
  fi
}

/* Phase two of the cancellation, delivered once or twice. */
proctype CancelPhase2() {
  do
  :: atomic {
       c_decision != UNDECIDED && c_phase1 && !c_done ->
       if
       :: c_decision == COMMIT ->
#ifndef BUG_EARLY_RELEASE
          frozen--; a_holds = 0;     /* the deferred give-back, applied by the commit */
#endif
          c_done = 1
       :: c_decision == ROLLBACK ->
#ifdef BUG_EARLY_RELEASE
          if
          :: FITS(1) -> frozen++; a_holds = 1; c_done = 1
          :: else -> refused = 1; c_done = 1   /* RollbackFailed: for ever */
          fi
#else
          c_done = 1                 /* the deferred delta dropped: nothing to undo */
#endif
       fi
     }
  :: atomic { c_done -> break }
  od
}

/* A buyer: the freeze's delta, refused when it does not fit; then its
 * global commits or rolls back (the undo of a freeze is "-1", which
 * always fits). */
proctype Buyer(byte i) {
  atomic {
    if
    :: FITS(1) -> frozen++; b_holds[i] = 1; b_phase1[i] = 1
    :: else -> goto out              /* sold out: the order is refused */
    fi
  };
  if
  :: b_decision[i] = COMMIT
  :: b_decision[i] = ROLLBACK
  fi;
  atomic {
    if
    :: b_decision[i] == ROLLBACK -> assert(FITS(-1)); frozen--; b_holds[i] = 0
    :: else -> skip
    fi;
    b_done[i] = 1
  };
out:
  skip
}

active proctype AtTheEnd() {
  timeout ->
  assert(!refused);                                   /* every rollback could be done */
  assert(sold + frozen <= STOCK);                     /* no oversell */
  assert(frozen == a_holds + b_holds[0] + b_holds[1]); /* the counter says who holds */
  assert(c_decision != COMMIT || !a_holds);           /* a committed cancellation gave A's ticket back */
  assert(c_decision != ROLLBACK || a_holds)           /* a rolled-back one did not */
}

init {
  atomic { run Cancel(); run CancelPhase2(); run Buyer(0); run Buyer(1) }
}
