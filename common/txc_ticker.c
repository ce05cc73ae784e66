/*
 * txc_ticker.c - a sampling thread's beat (txc_ticker.h).
 */
#include "txc_ticker.h"

void txc_ticker_init(txc_ticker_t *t, long period_ms) {
  pthread_mutex_init(&t->mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&t->wake, &ca);
  pthread_condattr_destroy(&ca);
  t->stop = false;
  t->period_ms = period_ms;
  clock_gettime(CLOCK_MONOTONIC, &t->next);
}

bool txc_ticker_wait(txc_ticker_t *t) {
  pthread_mutex_lock(&t->mu);
  t->next.tv_nsec += t->period_ms % 1000 * 1000000L;
  t->next.tv_sec += t->period_ms / 1000;
  while (t->next.tv_nsec >= 1000000000L) {
    t->next.tv_sec++;
    t->next.tv_nsec -= 1000000000L;
  }
  while (!t->stop && pthread_cond_timedwait(&t->wake, &t->mu, &t->next) == 0) {
  }
  bool go_on = !t->stop;
  pthread_mutex_unlock(&t->mu);
  return go_on;
}

void txc_ticker_stop(txc_ticker_t *t) {
  pthread_mutex_lock(&t->mu);
  t->stop = true;
  pthread_cond_broadcast(&t->wake);
  pthread_mutex_unlock(&t->mu);
}

void txc_ticker_destroy(txc_ticker_t *t) {
  pthread_mutex_destroy(&t->mu);
  pthread_cond_destroy(&t->wake);
}
