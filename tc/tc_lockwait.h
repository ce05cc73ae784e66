/*
 * tc_lockwait.h - registrations waiting for a global lock, woken when the
 * holder releases it (pushed, never polled).
 *
 * NOTES
 *   A BranchRegister that meets a lock held by another xid and asked to
 *   wait (lock_wait_ms > 0) is parked here under the holder's xid.  When the
 *   holder's locks are released (commit decision, end of rollback) or it
 *   starts rolling back, all its waiters are woken in the order they first
 *   queued: they retry in that order in the next store batch, so the first
 *   to queue for a key is the first to get it (FIFO per key); the others
 *   meet the new holder and queue again, keeping their original position.
 *   A waiter whose deadline passes is woken with TXP_ELOCK_WAIT_TIMEOUT.
 *   The number of waiters is bounded; past it a registration fails at once
 *   with the conflict.
 *
 *   Thread: the loop thread only.
 */
#ifndef TC_LOCKWAIT_H
#define TC_LOCKWAIT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "txp_msg.h"

typedef struct tc_lockwait tc_lockwait_t;
typedef struct tc_waiter tc_waiter_t;

/* 'reason' is 0 (the holder released: retry) or TXP_ELOCK_WAIT_TIMEOUT.
 * The waiter is no longer queued when this runs. */
typedef void (*tc_waiter_cb)(tc_waiter_t *w, int reason);

/* Embedded by the caller in its request context. */
struct tc_waiter {
  char holder[TXP_MAX_XID_LEN + 1];
  uint64_t first_queued_ns; /* set on the first wait, kept across re-queues */
  uint64_t met_ns;          /* when the op that met the holder was submitted */
  uint64_t deadline_ns;
  tc_waiter_cb cb;
  void *data;
  const char *xid;          /* optional: the waiting transaction, for operators (borrowed) */
  /* private */
  tc_waiter_t *prev_, *next_;  /* in the holder's queue */
  tc_waiter_t *aprev_, *anext_; /* in the list of all waiters */
  struct lw_queue *queue_;
};

tc_lockwait_t *tc_lockwait_new(uv_loop_t *loop, size_t max_waiters);
/* Every waiter is woken with TXP_ESHUTDOWN, then 'done' runs once the
 * timer handle is closed and the memory freed. */
void tc_lockwait_close(tc_lockwait_t *lw, void (*done)(void *), void *arg);

/* Queue 'w' (holder, deadline, met_ns, cb set by the caller).  Returns 0,
 * TXP_EBUSY when the bound is reached, or TXP_EAGAIN when the holder may
 * have been released since 'met_ns' (its release can run before the
 * conflict is reported back, e.g. a commit in the same store batch): the
 * caller retries at once instead of waiting for a wake-up already past. */
int tc_lockwait_add(tc_lockwait_t *lw, tc_waiter_t *w);
/* Wake every waiter of 'holder' (callbacks run before this returns). */
int tc_lockwait_release(tc_lockwait_t *lw, const char *holder);
/* Remove 'w' without calling it (e.g. its connection closed). */
void tc_lockwait_cancel(tc_lockwait_t *lw, tc_waiter_t *w);
size_t tc_lockwait_count(const tc_lockwait_t *lw);
/* The release record 'xid' shares with every xid of the same hash: a
 * waiter that met its holder before the record's last release retries
 * (TXP_EAGAIN above).  For tests that make two xids share one. */
unsigned tc_lockwait_bucket(const char *xid);

/* For operators (tcctl locks): visit the waiters of 'holder', or of every
 * holder when it is NULL, each queue in its FIFO order.  'fn' must not
 * change the queues.  Returns the number of waiters visited. */
typedef void (*tc_lockwait_visit_fn)(const char *holder, const tc_waiter_t *w, void *arg);
size_t tc_lockwait_each(const tc_lockwait_t *lw, const char *holder, tc_lockwait_visit_fn fn, void *arg);

#endif /* TC_LOCKWAIT_H */
