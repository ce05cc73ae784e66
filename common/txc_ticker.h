/*
 * txc_ticker.h - a sampling thread's beat: wake every period on the
 * monotonic clock (a late tick does not shift the ones after it), and
 * stop at once when asked, from any thread.
 *
 *   txc_ticker_t tk;  txc_ticker_init(&tk, 1000);
 *   thread:  do { sample(); } while (txc_ticker_wait(&tk));
 *   owner:   txc_ticker_stop(&tk); pthread_join(...); txc_ticker_destroy(&tk);
 */
#ifndef TXC_TICKER_H
#define TXC_TICKER_H

#include <pthread.h>
#include <stdbool.h>
#include <time.h>

typedef struct {
  pthread_mutex_t mu;
  pthread_cond_t wake;
  bool stop;
  struct timespec next; /* the next tick, CLOCK_MONOTONIC */
  long period_ms;
} txc_ticker_t;

void txc_ticker_init(txc_ticker_t *t, long period_ms);
/* Sleep until the next tick: true, or false once txc_ticker_stop was called. */
bool txc_ticker_wait(txc_ticker_t *t);
void txc_ticker_stop(txc_ticker_t *t);
void txc_ticker_destroy(txc_ticker_t *t);

#endif /* TXC_TICKER_H */
