/*
 * tc_lockwait.c - see tc_lockwait.h.  A chained hash table of per-holder
 * queues (kept sorted by first_queued_ns) plus one list of all waiters that
 * a timer sweeps for deadlines.
 */
#include "tc_lockwait.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NBUCKETS 1024
#define SWEEP_MS 10

typedef struct lw_queue {
  char holder[TXP_MAX_XID_LEN + 1];
  tc_waiter_t *head, *tail;
  struct lw_queue *chain;
} lw_queue_t;

struct tc_lockwait {
  uv_timer_t sweep;
  bool sweeping;
  size_t count, max;
  tc_waiter_t *all;
  lw_queue_t *buckets[NBUCKETS];
  /* uv_hrtime of the last release of any holder hashed to each bucket: a
   * waiter that met its holder before that may have missed the wake-up. */
  uint64_t released_ns[NBUCKETS];
  void (*done)(void *);
  void *done_arg;
};

static unsigned hash(const char *s) {
  unsigned h = 2166136261u; /* FNV-1a */
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 16777619u;
  return h % NBUCKETS;
}

unsigned tc_lockwait_bucket(const char *xid) { return hash(xid); }

static lw_queue_t *find_queue(tc_lockwait_t *lw, const char *holder, bool create) {
  unsigned b = hash(holder);
  for (lw_queue_t *q = lw->buckets[b]; q; q = q->chain)
    if (strcmp(q->holder, holder) == 0) return q;
  if (!create) return NULL;
  lw_queue_t *q = calloc(1, sizeof(*q));
  if (!q) return NULL;
  snprintf(q->holder, sizeof(q->holder), "%s", holder);
  q->chain = lw->buckets[b];
  lw->buckets[b] = q;
  return q;
}

static void drop_queue_if_empty(tc_lockwait_t *lw, lw_queue_t *q) {
  if (q->head) return;
  lw_queue_t **pp = &lw->buckets[hash(q->holder)];
  while (*pp && *pp != q) pp = &(*pp)->chain;
  if (*pp) *pp = q->chain;
  free(q);
}

static void unlink_from_all(tc_lockwait_t *lw, tc_waiter_t *w) {
  if (w->aprev_) w->aprev_->anext_ = w->anext_;
  else lw->all = w->anext_;
  if (w->anext_) w->anext_->aprev_ = w->aprev_;
  w->aprev_ = w->anext_ = NULL;
}

/* Unlink 'w' from its queue and from the list of all waiters. */
static void unlink_waiter(tc_lockwait_t *lw, tc_waiter_t *w) {
  lw_queue_t *q = w->queue_;
  if (!q) return;
  if (w->prev_) w->prev_->next_ = w->next_;
  else q->head = w->next_;
  if (w->next_) w->next_->prev_ = w->prev_;
  else q->tail = w->prev_;
  unlink_from_all(lw, w);
  w->prev_ = w->next_ = NULL;
  w->queue_ = NULL;
  lw->count--;
  drop_queue_if_empty(lw, q);
}

static void on_sweep(uv_timer_t *t) {
  tc_lockwait_t *lw = t->data;
  uint64_t now = uv_hrtime();
  tc_waiter_t *w = lw->all;
  while (w) {
    tc_waiter_t *next = w->anext_;
    if (w->deadline_ns <= now) {
      unlink_waiter(lw, w);
      w->cb(w, TXP_ELOCK_WAIT_TIMEOUT);
      next = lw->all; /* the callback may have changed the list: restart */
      now = uv_hrtime();
    }
    w = next;
  }
  if (!lw->all && lw->sweeping) {
    uv_timer_stop(&lw->sweep);
    lw->sweeping = false;
  }
}

tc_lockwait_t *tc_lockwait_new(uv_loop_t *loop, size_t max_waiters) {
  tc_lockwait_t *lw = calloc(1, sizeof(*lw));
  if (!lw) return NULL;
  lw->max = max_waiters;
  uv_timer_init(loop, &lw->sweep);
  lw->sweep.data = lw;
  return lw;
}

int tc_lockwait_add(tc_lockwait_t *lw, tc_waiter_t *w) {
  if (lw->released_ns[hash(w->holder)] >= w->met_ns) return TXP_EAGAIN;
  if (lw->count >= lw->max) return TXP_EBUSY;
  lw_queue_t *q = find_queue(lw, w->holder, true);
  if (!q) return TXP_ENOMEM;
  /* Insert by first_queued_ns: a waiter that re-queues keeps its place. */
  tc_waiter_t *after = q->tail;
  while (after && after->first_queued_ns > w->first_queued_ns) after = after->prev_;
  w->prev_ = after;
  w->next_ = after ? after->next_ : q->head;
  if (w->next_) w->next_->prev_ = w;
  else q->tail = w;
  if (after) after->next_ = w;
  else q->head = w;
  w->queue_ = q;
  w->aprev_ = NULL;
  w->anext_ = lw->all;
  if (lw->all) lw->all->aprev_ = w;
  lw->all = w;
  lw->count++;
  if (!lw->sweeping) {
    uv_timer_start(&lw->sweep, on_sweep, SWEEP_MS, SWEEP_MS);
    lw->sweeping = true;
  }
  return 0;
}

int tc_lockwait_release(tc_lockwait_t *lw, const char *holder) {
  lw->released_ns[hash(holder)] = uv_hrtime();
  lw_queue_t *q = find_queue(lw, holder, false);
  if (!q) return 0;
  /* Detach the whole queue first: callbacks may queue again (under another
   * holder, or this one), and must not be woken twice by this call. */
  tc_waiter_t *list = q->head;
  for (tc_waiter_t *w = list; w; w = w->next_) {
    unlink_from_all(lw, w);
    w->queue_ = NULL;
    lw->count--;
  }
  q->head = q->tail = NULL;
  drop_queue_if_empty(lw, q);
  int n = 0;
  for (tc_waiter_t *w = list; w;) {
    tc_waiter_t *next = w->next_;
    w->prev_ = w->next_ = NULL;
    n++;
    w->cb(w, 0);
    w = next;
  }
  return n;
}

void tc_lockwait_cancel(tc_lockwait_t *lw, tc_waiter_t *w) { unlink_waiter(lw, w); }

size_t tc_lockwait_count(const tc_lockwait_t *lw) { return lw->count; }

static size_t visit_queue(const lw_queue_t *q, tc_lockwait_visit_fn fn, void *arg) {
  size_t n = 0;
  for (const tc_waiter_t *w = q->head; w; w = w->next_, n++) fn(q->holder, w, arg);
  return n;
}

size_t tc_lockwait_each(const tc_lockwait_t *lw, const char *holder, tc_lockwait_visit_fn fn, void *arg) {
  if (holder) {
    const lw_queue_t *q = find_queue((tc_lockwait_t *)(uintptr_t)lw, holder, false);
    return q ? visit_queue(q, fn, arg) : 0;
  }
  size_t n = 0;
  for (int b = 0; b < NBUCKETS; b++)
    for (const lw_queue_t *q = lw->buckets[b]; q; q = q->chain) n += visit_queue(q, fn, arg);
  return n;
}

static void on_closed(uv_handle_t *h) {
  tc_lockwait_t *lw = h->data;
  void (*done)(void *) = lw->done;
  void *arg = lw->done_arg;
  free(lw);
  if (done) done(arg);
}

void tc_lockwait_close(tc_lockwait_t *lw, void (*done)(void *), void *arg) {
  while (lw->all) {
    tc_waiter_t *w = lw->all;
    unlink_waiter(lw, w);
    w->cb(w, TXP_ESHUTDOWN);
  }
  lw->done = done;
  lw->done_arg = arg;
  uv_close((uv_handle_t *)&lw->sweep, on_closed);
}
