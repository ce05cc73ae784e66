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
#include <stdint.h>

#include "rm_client.h"
#include "tcd_proc.h"

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

/* The end of local branch 'b' (NULL: it did not open) on 'pg', whose work
 * returned 'rc': prepared ('bid' gets its id; may be NULL) and committed
 * when rc is 0, otherwise (or when the prepare fails) rolled back; closed
 * either way.  0, or the first failing code (RM_E_DB when the COMMIT did
 * not commit). */
int itest_branch_end(PGconn *pg, rm_branch_t *b, int rc, int64_t *bid);

/* The mode the client's degrade detection says (RM_MODE_*), whatever the
 * mode in force: for WAIT_EQ. */
int degrade_detected(rm_client_t *c);

/* A test group of the AT layer and its modes (test_rm_at, test_rm_modes):
 * the databases of scripts/with-servers --pg (false, saying so on stderr,
 * when one is not set) ... */
bool itest_urls(const char **orders, const char **stock, const char **tc);
/* ... tcd on 'tc_url' with 'token', phase two retried quickly (every
 * 100 ms, 50 to 'retry_max_ms' ms apart) so that retries show within a
 * test, one more setting 'extra' ("TC_X_Y=value", may be NULL; kept by
 * pointer), TC_LOG_LEVEL or "error" ... */
int itest_tcd_start(tcd_proc_t *t, const char *tc_url, const char *token, unsigned retry_max_ms, const char *extra);
/* ... the group's client on it: 'cfg' with the node filled in, short lock
 * waits on the phase-two side (1 s, statements 5 s) so that a blocked
 * rollback gives up (retryably) within a test ... */
int itest_client_new(const tcd_proc_t *t, rm_config_t cfg, rm_client_t **out);
/* ... and, its resources added, ready: registered with the node and the
 * resource list arrived there.  0, or -1 with why on stderr. */
int itest_client_ready(rm_client_t *c);
/* The group's end: the client freed, tcd stopped. */
void itest_group_stop(rm_client_t **c, tcd_proc_t *t);

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
