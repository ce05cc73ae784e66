/*
 * rm_itest.h - what librmclient's tests share (test_rm_at, test_rm_modes,
 * test_rm_tm, test_fallback, test_fallback_degrade): time, a libpq
 * connection and a statement that must succeed, the client's log callback,
 * and WAIT_EQ.  No cmocka here.
 */
#ifndef RM_ITEST_H
#define RM_ITEST_H

#include <libpq-fe.h>
#include <stdbool.h>

/* Sleep 'ms', a signal notwithstanding. */
void sleep_ms(int ms);
/* CLOCK_MONOTONIC in seconds, and in milliseconds. */
double now_s(void);
double now_ms(void);
/* The client's log callback: warnings and errors on stderr (everything
 * with RM_TEST_VERBOSE set). */
void log_cb(int level, const char *msg, void *arg);
/* A connection (its notices below warnings not sent), or NULL (the reason
 * on stderr). */
PGconn *pg_open(const char *url);
/* Run a statement that must succeed (any result kind); the failure on
 * stderr. */
bool exec_ok(PGconn *pg, const char *sql);

/* The mode the client's degrade detection says (RM_MODE_*), whatever the
 * mode in force: for WAIT_EQ. */
struct rm_client;
int degrade_detected(struct rm_client *c);

/* Poll 'what' until it equals 'want' or 'secs' pass; returns the last value. */
#define WAIT_EQ(want, secs, what)                                           \
  ({                                                                        \
    long long _v = (what);                                                  \
    for (double _end = now_s() + (secs); _v != (want) && now_s() < _end;) { \
      sleep_ms(20);                                                         \
      _v = (what);                                                          \
    }                                                                       \
    _v;                                                                     \
  })

#endif
