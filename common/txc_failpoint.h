/* txc_failpoint: named fault-injection points for the fault suite.
 *
 * TXC_FAILPOINT("tc.commit.after_decision") marks a place where a crash or
 * a hang is interesting (between a durable write and the message that
 * reports it).  The points are compiled in only with -DTX_FAILPOINTS=ON
 * (the sanitizer build the tests use); elsewhere the macro is empty, so a
 * production build carries no trace of them.
 *
 * A point does nothing until it is armed, from the environment at start
 * (TX_FAILPOINTS="name=action[@N],...") or at run time (tcd's admin socket:
 * `tcctl failpoint arm SPEC`).  Actions:
 *   abort   the process kills itself with SIGKILL (exactly like kill -9:
 *           no atexit, no flush, sockets reset by the kernel)
 *   stop    the process stops itself with SIGSTOP (resumed by SIGCONT)
 *   trace   one line on stderr, nothing else (to see that a point is met)
 *   fail    one line on stderr, and TXC_FAILPOINT_FAILS(name) is true: the
 *           code at the point takes its fault branch (a point that stands
 *           for a fault of the world, not of the process, e.g. a lost
 *           answer of PostgreSQL; TXC_FAILPOINT treats it as trace)
 *   off     disarm
 * "@N" fires on the Nth hit after arming (default 1); the point disarms
 * once it fired.  Only names of the registry below are accepted, so a typo
 * in a fault script is an error instead of a fault that never happens.
 *
 * Thread-safe: hits come from loop threads and application threads; an
 * unarmed point costs one relaxed atomic load. */
#ifndef TXC_FAILPOINT_H
#define TXC_FAILPOINT_H

#include <stdbool.h>
#include <stddef.h>

/* Longest spec accepted (bytes). */
#define TXC_FAILPOINT_MAX_SPEC 1024

typedef enum { TXC_FP_OFF = 0, TXC_FP_ABORT, TXC_FP_STOP, TXC_FP_TRACE, TXC_FP_FAIL } txp_fp_action_t;

/* Arms (or with "off" disarms) the points in SPEC: "name=action[@N]",
 * comma-separated.  All or nothing: a bad element changes nothing and
 * writes why into err.  Returns 0 or -1. */
int txc_failpoint_arm(const char *spec, char *err, size_t errlen);

/* Only validates SPEC (what txc_failpoint_arm would accept). */
int txc_failpoint_check(const char *spec, char *err, size_t errlen);

/* Arms from the environment variable TX_FAILPOINTS if set.  Returns 0, or
 * -1 with err set (callers refuse to start: a fault run with a bad spec
 * must not silently run without its fault). */
int txc_failpoint_arm_env(char *err, size_t errlen);

/* Called by TXC_FAILPOINT.  Returns the action taken (TXC_FP_OFF when the
 * point is not armed or its count is not reached yet; abort and stop do
 * not return before the process is killed or continued). */
txp_fp_action_t txc_failpoint_hit(const char *name);

/* "name action hits-until-it-fires" for every point (0 when off), one per
 * line;
 * returns the length written (truncated to cap-1). */
size_t txc_failpoint_list(char *out, size_t cap);

/* Whether the points are compiled into this build. */
bool txc_failpoint_compiled(void);

/* The registry: every name a TXC_FAILPOINT uses (NULL-terminated). */
extern const char *const txc_failpoint_names[];

#ifdef TX_FAILPOINTS
#define TXC_FAILPOINT(name) ((void)txc_failpoint_hit(name))
#define TXC_FAILPOINT_FAILS(name) (txc_failpoint_hit(name) == TXC_FP_FAIL)
#else
#define TXC_FAILPOINT(name) ((void)0)
#define TXC_FAILPOINT_FAILS(name) false
#endif

#endif
