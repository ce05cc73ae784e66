/*
 * txc_worker.c - the one thread of a background job (txc_worker.h).
 */
#include "txc_worker.h"

int txc_cond_init_monotonic(pthread_cond_t *cv) {
  pthread_condattr_t ca;
  int rc = pthread_condattr_init(&ca);
  if (rc != 0) return rc;
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  rc = pthread_cond_init(cv, &ca);
  pthread_condattr_destroy(&ca);
  return rc;
}

static void add_ms(struct timespec *ts, int64_t ms) {
  ts->tv_sec += (time_t)(ms / 1000);
  ts->tv_nsec += (long)(ms % 1000) * 1000000L;
  if (ts->tv_nsec >= 1000000000L) {
    ts->tv_sec++;
    ts->tv_nsec -= 1000000000L;
  }
}

void txc_deadline_in_ms(struct timespec *until, int64_t ms) {
  clock_gettime(CLOCK_MONOTONIC, until);
  add_ms(until, ms);
}

int txc_worker_start(txc_worker_t *w, void *(*main)(void *), void *arg) {
  int rc = pthread_mutex_init(&w->mu, NULL);
  if (rc != 0) return rc;
  if ((rc = txc_cond_init_monotonic(&w->wake)) != 0) goto fail_mutex;
  w->stopping = w->kicked = false;
  clock_gettime(CLOCK_MONOTONIC, &w->beat);
  if ((rc = pthread_create(&w->thread, NULL, main, arg)) != 0) goto fail_cond;
  return 0;

fail_cond:
  pthread_cond_destroy(&w->wake);
fail_mutex:
  pthread_mutex_destroy(&w->mu);
  return rc;
}

/* Under mu: wait until 'until', a kick or the stop. */
static bool wait_until(txc_worker_t *w, const struct timespec *until) {
  while (!w->stopping && !w->kicked && pthread_cond_timedwait(&w->wake, &w->mu, until) == 0) {
  }
  w->kicked = false;
  return !w->stopping;
}

bool txc_worker_sleep(txc_worker_t *w, int64_t ms) {
  struct timespec until;
  clock_gettime(CLOCK_MONOTONIC, &until);
  if (ms > 0) add_ms(&until, ms);
  pthread_mutex_lock(&w->mu);
  bool go_on = wait_until(w, &until);
  pthread_mutex_unlock(&w->mu);
  return go_on;
}

/* Wait until 'until' whatever kicks come (they stay set). */
static bool pause_until(txc_worker_t *w, const struct timespec *until) {
  pthread_mutex_lock(&w->mu);
  while (!w->stopping && pthread_cond_timedwait(&w->wake, &w->mu, until) == 0) {
  }
  bool go_on = !w->stopping;
  pthread_mutex_unlock(&w->mu);
  return go_on;
}

bool txc_worker_pause_since(txc_worker_t *w, int64_t since_us, int64_t ms) {
  if (since_us <= 0 || ms <= 0) return !txc_worker_stopping(w);
  int64_t end_us = since_us + ms * 1000;
  struct timespec until = {.tv_sec = (time_t)(end_us / 1000000), .tv_nsec = (long)(end_us % 1000000) * 1000L};
  return pause_until(w, &until);
}

bool txc_worker_beat(txc_worker_t *w, long period_ms) {
  pthread_mutex_lock(&w->mu);
  add_ms(&w->beat, period_ms);
  bool go_on = wait_until(w, &w->beat);
  pthread_mutex_unlock(&w->mu);
  return go_on;
}

bool txc_worker_stopping(txc_worker_t *w) {
  pthread_mutex_lock(&w->mu);
  bool s = w->stopping;
  pthread_mutex_unlock(&w->mu);
  return s;
}

void txc_worker_kick(txc_worker_t *w) {
  pthread_mutex_lock(&w->mu);
  w->kicked = true;
  pthread_cond_signal(&w->wake);
  pthread_mutex_unlock(&w->mu);
}

void txc_worker_stop(txc_worker_t *w) {
  pthread_mutex_lock(&w->mu);
  w->stopping = true;
  pthread_cond_signal(&w->wake);
  pthread_mutex_unlock(&w->mu);
  pthread_join(w->thread, NULL);
  pthread_cond_destroy(&w->wake);
  pthread_mutex_destroy(&w->mu);
}
