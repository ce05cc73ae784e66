/*
 * txc_worker.h - the one thread of a background job: it sleeps between
 * passes on the monotonic clock (a wall-clock jump moves nothing) until
 * its next pass is due, it is kicked (a pass at once) or it is stopped (at
 * once, from any thread); or it beats every period (a late beat does not
 * shift the ones after it).  The job may keep its own state under the
 * worker's mutex.
 *
 *   owner:   txc_worker_start(&w, job_main, job);  ...  txc_worker_stop(&w);
 *   thread:  do { pass(); } while (txc_worker_sleep(&w, wait_ms));
 *      or:   do { sample(); } while (txc_worker_beat(&w, period_ms));
 *
 * The waits take the mutex themselves: call them without it.  Used by the
 * console's sampler, the flash-sale timeline, the HTTP guard and the
 * services' jobs (reconciliation, sale window, outbox relay, consumer).
 */
#ifndef TXC_WORKER_H
#define TXC_WORKER_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

typedef struct txc_worker {
  pthread_mutex_t mu;   /* the two flags, and whatever the job keeps under it */
  pthread_cond_t wake;  /* CLOCK_MONOTONIC */
  pthread_t thread;
  bool stopping;        /* under mu */
  bool kicked;          /* under mu: the next sleep returns at once */
  struct timespec beat; /* the next beat (txc_worker_beat), CLOCK_MONOTONIC */
} txc_worker_t;

/* A condition variable whose timed waits take CLOCK_MONOTONIC deadlines:
 * 0, or the error number of pthread_cond_init. */
int txc_cond_init_monotonic(pthread_cond_t *cv);
/* The CLOCK_MONOTONIC deadline 'ms' milliseconds from now, for such a
 * wait. */
void txc_deadline_in_ms(struct timespec *until, int64_t ms);

/* Start the thread: main(arg).  0, or the error number of pthread_create
 * (the worker is then destroyed: nothing to stop). */
int txc_worker_start(txc_worker_t *w, void *(*main)(void *), void *arg);
/* Sleep up to 'ms' (<= 0: not at all), or until kicked: true; false once
 * the worker is stopping.  A kick made while awake is not lost. */
bool txc_worker_sleep(txc_worker_t *w, int64_t ms);
/* Sleep until 'ms' after 'since_us' (CLOCK_MONOTONIC microseconds; not at
 * all when that is past, or 'since_us' or 'ms' <= 0) whatever kicks come
 * meanwhile (they are kept for the next sleep): true; false once the
 * worker is stopping.  The pacing of a job that, once a pass found work,
 * starts the next no sooner than 'ms' after it, so that under load each
 * pass takes what gathered meanwhile. */
bool txc_worker_pause_since(txc_worker_t *w, int64_t since_us, int64_t ms);
/* Sleep until the next beat, 'period_ms' after the one before (the first
 * a period after the start): true; false once the worker is stopping. */
bool txc_worker_beat(txc_worker_t *w, long period_ms);
/* Whether the worker is stopping (for a thread that polls between
 * blocking calls of its own). */
bool txc_worker_stopping(txc_worker_t *w);
void txc_worker_kick(txc_worker_t *w);
/* Ask the thread to stop, wake it, wait for it to end; the worker is then
 * destroyed. */
void txc_worker_stop(txc_worker_t *w);

#endif /* TXC_WORKER_H */
