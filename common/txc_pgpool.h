/*
 * txc_pgpool.h - the one bounded pool of libpq connections: librmclient's
 * phase-two pool of each resource, the demo services' pool and the
 * console's.  At most 'max' connections exist, idle or lent; a taker
 * gets an idle one, else opens a new one while there is room, else waits
 * on the monotonic clock for one to come back.  What differs between the
 * owners is only how a connection is opened, whether an idle one may be
 * lent again, and the messages: the owner passes the first two
 * (txc_pgpool_ops_t) and writes the third.
 * Header only, like txc_pgconn.h: txcommon does not link libpq.
 */
#ifndef TXC_PGPOOL_H
#define TXC_PGPOOL_H

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <time.h>

#include <libpq-fe.h>

#include "txc_worker.h" /* txc_cond_init_monotonic, txc_deadline_in_ms */

typedef struct txc_pgpool {
  pthread_mutex_t mu;
  pthread_cond_t freed; /* a connection came back, or a slot was freed */
  PGconn **idle;        /* 'cap' slots */
  int cap;
  int nidle;
  int open; /* connections that exist (idle, lent, or being opened) */
} txc_pgpool_t;

/* How an owner opens a connection (NULL with 'err' set when it cannot),
 * and whether an idle one may be lent again ('lendable' may repair it,
 * e.g. PQreset; false: it is closed and its slot freed; NULL: every idle
 * connection is lent as it is).  'arg' is the owner's, passed through. */
typedef struct txc_pgpool_ops {
  PGconn *(*open)(void *arg, char *err, size_t errlen);
  bool (*lendable)(PGconn *pg);
} txc_pgpool_ops_t;

/* What txc_pgpool_get returns. */
enum { TXC_PGPOOL_OK = 0, TXC_PGPOOL_NOT_OPENED = -1, TXC_PGPOOL_BUSY = -2 };

/* A pool of at most 'cap' idle connections.  0, or -1 out of memory. */
static inline int txc_pgpool_init(txc_pgpool_t *p, int cap) {
  *p = (txc_pgpool_t){.cap = cap > 0 ? cap : 1};
  if (!(p->idle = calloc((size_t)p->cap, sizeof(PGconn *)))) return -1;
  pthread_mutex_init(&p->mu, NULL);
  txc_cond_init_monotonic(&p->freed);
  return 0;
}

/* Close the idle connections: the lent ones stay counted until they come
 * back (then txc_pgpool_put closes or keeps them as usual). */
static inline void txc_pgpool_close_idle(txc_pgpool_t *p) {
  for (;;) { /* one at a time: PQfinish talks to the server, not under the lock */
    pthread_mutex_lock(&p->mu);
    PGconn *pg = p->nidle > 0 ? p->idle[--p->nidle] : NULL;
    if (pg) p->open--;
    pthread_mutex_unlock(&p->mu);
    if (!pg) return;
    PQfinish(pg);
  }
}

/* Close the idle connections and free the pool (every connection back;
 * a pool txc_pgpool_init failed on, too). */
static inline void txc_pgpool_destroy(txc_pgpool_t *p) {
  if (!p->idle) return;
  txc_pgpool_close_idle(p);
  pthread_mutex_destroy(&p->mu);
  pthread_cond_destroy(&p->freed);
  free(p->idle);
  p->idle = NULL;
}

/* A connection nobody holds any more (closed, or never opened): its slot
 * goes to a waiter. */
static inline void txc_pgpool_forget(txc_pgpool_t *p) {
  pthread_mutex_lock(&p->mu);
  p->open--;
  pthread_cond_signal(&p->freed);
  pthread_mutex_unlock(&p->mu);
}

/*
 * A connection for *out: an idle one that ops->lendable accepts, else a
 * new one while fewer than 'max' exist, else the first to come back
 * within 'wait_ms'.  TXC_PGPOOL_OK; TXC_PGPOOL_NOT_OPENED with ops->open's
 * message in 'err'; or TXC_PGPOOL_BUSY (all 'max' lent the whole time:
 * the caller says so).
 */
static inline int txc_pgpool_get(txc_pgpool_t *p, int max, unsigned wait_ms, const txc_pgpool_ops_t *ops, void *arg,
                                 PGconn **out, char *err, size_t errlen) {
  struct timespec until;
  txc_deadline_in_ms(&until, wait_ms);
  *out = NULL;
  pthread_mutex_lock(&p->mu);
  for (;;) {
    if (p->nidle > 0) {
      PGconn *pg = p->idle[--p->nidle];
      pthread_mutex_unlock(&p->mu);
      if (!ops->lendable || ops->lendable(pg)) {
        *out = pg;
        return TXC_PGPOOL_OK;
      }
      PQfinish(pg); /* broken while idle (its server died, a failover), or read-only */
      txc_pgpool_forget(p);
      pthread_mutex_lock(&p->mu);
      continue;
    }
    if (p->open < max) {
      p->open++;
      pthread_mutex_unlock(&p->mu);
      if ((*out = ops->open(arg, err, errlen))) return TXC_PGPOOL_OK;
      txc_pgpool_forget(p);
      return TXC_PGPOOL_NOT_OPENED;
    }
    if (pthread_cond_timedwait(&p->freed, &p->mu, &until) == ETIMEDOUT) {
      pthread_mutex_unlock(&p->mu);
      return TXC_PGPOOL_BUSY;
    }
  }
}

/* Give 'pg' back (NULL: nothing): kept idle if 'keep', it is open and
 * outside any transaction, and there is room; else closed.  A
 * connection that failed in the middle of a transaction, or was left in
 * an open or failed block, is never lent again. */
static inline void txc_pgpool_put(txc_pgpool_t *p, PGconn *pg, bool keep) {
  if (!pg) return;
  keep = keep && PQstatus(pg) == CONNECTION_OK && PQtransactionStatus(pg) == PQTRANS_IDLE;
  pthread_mutex_lock(&p->mu);
  if (keep && p->nidle < p->cap) {
    p->idle[p->nidle++] = pg;
    pg = NULL;
  } else {
    p->open--;
  }
  pthread_cond_signal(&p->freed);
  pthread_mutex_unlock(&p->mu);
  if (pg) PQfinish(pg);
}

#endif /* TXC_PGPOOL_H */
