/*
 * txp_errno.h - the one table of error codes shared by tcd, librmclient and
 * the wire protocol.
 *
 * NOTES
 *   Functions in this project return 0 on success and a negative code on
 *   failure.  Our codes live at -10000 and below so that they never collide
 *   with libuv's -errno values, which are passed through unchanged.  The same
 *   numbers travel on the wire in the "code" field of every result frame, so
 *   a code, once published, never changes meaning.
 */
#ifndef TXP_ERRNO_H
#define TXP_ERRNO_H

#include <stdbool.h>

/* X(NAME, value, retryable, message) */
#define TXP_ERRNO_MAP(X)                                                              \
  /* codec / framing */                                                               \
  X(AGAIN,             -10001, false, "incomplete frame, more bytes needed")          \
  X(BAD_MAGIC,         -10002, false, "bad frame magic")                              \
  X(BAD_VERSION,       -10003, false, "unsupported protocol major version")           \
  X(FRAME_TOO_BIG,     -10004, false, "frame larger than the configured limit")       \
  X(MALFORMED,         -10005, false, "malformed message body")                       \
  X(UNKNOWN_TYPE,      -10006, false, "unknown message type")                         \
  X(FIELD_MISSING,     -10007, false, "required field missing")                       \
  X(FIELD_TYPE,        -10008, false, "field has the wrong type")                     \
  X(FIELD_TOO_LONG,    -10009, false, "field longer than its limit")                  \
  X(LIMIT,             -10010, false, "count or nesting limit exceeded")              \
  X(NOMEM,             -10011, true,  "out of memory")                                \
  X(BUFFER_FULL,       -10012, false, "decoder buffer full: drain messages first")    \
  X(BAD_FLAGS,         -10013, false, "unknown frame flags")                          \
  X(INVALID_ARG,       -10014, false, "invalid argument")                             \
  /* coordinator */                                                                   \
  X(BAD_REQUEST,       -10100, false, "bad request")                                  \
  X(AUTH,              -10101, false, "authentication failed")                        \
  X(NOT_REGISTERED,    -10102, false, "connection not registered")                    \
  X(GLOBAL_NOT_FOUND,  -10103, false, "global transaction not found")                 \
  X(GLOBAL_NOT_ACTIVE, -10104, false, "global transaction not active")                \
  X(LOCK_CONFLICT,     -10105, true,  "global lock conflict")                         \
  X(LOCK_WAIT_TIMEOUT, -10106, true,  "global lock wait timed out")                   \
  X(LOCK_HOLDER_ROLLBACKING, -10107, true, "global lock holder is rolling back")      \
  X(TIMED_OUT,         -10108, false, "global transaction timed out")                 \
  X(STORE,             -10109, true,  "coordinator store unavailable")                \
  X(BRANCH_NOT_FOUND,  -10110, false, "branch not found")                             \
  X(BUSY,              -10111, true,  "too many requests in flight")                  \
  X(SHUTDOWN,          -10112, true,  "coordinator shutting down")                    \
  X(BRANCH_RETRYABLE,  -10113, true,  "branch phase two failed, retryable")           \
  X(BRANCH_UNRETRYABLE,-10114, false, "branch phase two failed, not retryable")       \
  X(DIRTY_WRITE,       -10115, false, "dirty write: row changed since the branch")    \
  X(BAD_STATE,         -10116, false, "illegal status transition")                    \
  X(INTERNAL,          -10117, false, "internal error")                               \
  X(TOO_MANY_CONNS,    -10118, true,  "too many connections")                         \
  X(NOT_OWNER,         -10119, false, "not the owner: another application's transaction") \
  /* client side */                                                                   \
  X(UNKNOWN_OUTCOME,   -10200, true,  "outcome unknown: request sent, no answer")     \
  X(DEADLINE,          -10201, true,  "deadline exceeded before sending")             \
  X(NO_NODE,           -10202, true,  "no coordinator node reachable")                \
  X(CONN_LOST,         -10203, true,  "connection lost")                              \
  X(NOT_SUPPORTED,     -10204, false, "statement not supported by the AT layer")        \
  X(ROLLBACK_PENDING,  -10205, true,  "rollback decided, not finished: the coordinator retries") \
  X(ROLLBACK_FAILED,   -10206, false, "rollback decided, a branch could not be undone") \
  X(COMMIT_FAILED,     -10207, false, "commit decided, a branch could not be committed") \
  X(COMMIT_PENDING,    -10208, true,  "saga going on: a step is retried by the coordinator")

typedef enum txp_errno {
  TXP_OK = 0,
#define TXP__ERR_ENUM(name, val, retry, msg) TXP_E##name = (val),
  TXP_ERRNO_MAP(TXP__ERR_ENUM)
#undef TXP__ERR_ENUM
} txp_errno_t;

/* A short, static, lowercase description of 'code'.  Negative libuv codes
 * are described by libuv's own table is not linked here: they come back as
 * "system error". Never NULL. */
const char *txp_strerror(int code);

/* The symbolic name without prefix ("LOCK_CONFLICT"), or "UNKNOWN". */
const char *txp_errname(int code);

/* True when a caller may retry the same request (with the same idempotency
 * key) and expect a different outcome. */
bool txp_err_retryable(int code);

/* True when 'code' is one of ours (in the table above). */
bool txp_err_known(int code);

#endif /* TXP_ERRNO_H */
