/*
 * tc_parts.h - closing an object whose parts close asynchronously.
 *
 * NOTES
 *   The node, the peer, the recovery, the store and the metrics each own
 *   several things that close on their own time (uv handles, pools,
 *   sub-objects).  Each counts the parts still open and, at the last,
 *   frees itself and only then tells its own caller.  That countdown used
 *   to be written out in every one of them; it lives here once.
 *
 *   The caller's 'done' is copied out before 'release' frees the owner
 *   (which holds the tc_parts_t): it must not be read after.
 *
 *   Thread: the loop thread only.
 */
#ifndef TC_PARTS_H
#define TC_PARTS_H

typedef struct tc_parts {
  int open;                    /* parts not closed yet */
  void (*release)(void *owner); /* frees the owner (and this struct with it) */
  void *owner;
  void (*done)(void *arg); /* the owner's caller, told after the owner is freed */
  void *arg;
} tc_parts_t;

/* Start closing 'owner' with 'n' parts open: once the last has closed,
 * 'release(owner)' frees it, then 'done(arg)' (may be NULL) runs. */
static inline void tc_parts_start(tc_parts_t *p, int n, void (*release)(void *owner), void *owner,
                                  void (*done)(void *arg), void *arg) {
  *p = (tc_parts_t){.open = n, .release = release, .owner = owner, .done = done, .arg = arg};
}

/* One more part open; returns 'p', the argument for tc_parts_closed:
 *   tc_metrics_close(m, tc_parts_closed, tc_parts_add(&node->stop)); */
static inline void *tc_parts_add(tc_parts_t *p) {
  p->open++;
  return p;
}

/* A part closed ('parts' is the tc_parts_t, so that this is a close
 * callback as it stands). */
static inline void tc_parts_closed(void *parts) {
  tc_parts_t *p = parts;
  if (--p->open > 0) return;
  void (*done)(void *) = p->done;
  void *arg = p->arg;
  p->release(p->owner);
  if (done) done(arg);
}

#endif
