/*
 * rm_util.c - the small helpers every part of librmclient uses: error
 * strings (rm_strerror), status names, argument checks, UTF-8 cutting and
 * idempotency keys.  A leaf: it includes nothing of the library but the
 * public header and proto/, so that the prefilter, the fallback and the AT
 * layer can use it without reaching into the core.
 */
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "rm_util.h"
#include "txp_errno.h"
#include "txp_status.h"

/* rm_client.h repeats the protocol's numbers for the caller (a code from
 * the TC is passed through unchanged): they must stay the same. */
_Static_assert((int)RM_E_INVALID == (int)TXP_EINVALID_ARG, "RM_E_INVALID is TXP_EINVALID_ARG");
_Static_assert((int)RM_E_NOMEM == (int)TXP_ENOMEM, "RM_E_NOMEM is TXP_ENOMEM");
_Static_assert((int)RM_E_BAD_REQUEST == (int)TXP_EBAD_REQUEST, "RM_E_BAD_REQUEST is TXP_EBAD_REQUEST");
_Static_assert((int)RM_E_AUTH == (int)TXP_EAUTH, "RM_E_AUTH is TXP_EAUTH");
_Static_assert((int)RM_E_GLOBAL_NOT_FOUND == (int)TXP_EGLOBAL_NOT_FOUND, "RM_E_GLOBAL_NOT_FOUND is TXP_EGLOBAL_NOT_FOUND");
_Static_assert((int)RM_E_GLOBAL_NOT_ACTIVE == (int)TXP_EGLOBAL_NOT_ACTIVE, "RM_E_GLOBAL_NOT_ACTIVE is TXP_EGLOBAL_NOT_ACTIVE");
_Static_assert((int)RM_E_LOCK_CONFLICT == (int)TXP_ELOCK_CONFLICT, "RM_E_LOCK_CONFLICT is TXP_ELOCK_CONFLICT");
_Static_assert((int)RM_E_LOCK_WAIT_TIMEOUT == (int)TXP_ELOCK_WAIT_TIMEOUT, "RM_E_LOCK_WAIT_TIMEOUT is TXP_ELOCK_WAIT_TIMEOUT");
_Static_assert((int)RM_E_LOCK_HOLDER_ROLLBACKING == (int)TXP_ELOCK_HOLDER_ROLLBACKING, "RM_E_LOCK_HOLDER_ROLLBACKING is TXP_ELOCK_HOLDER_ROLLBACKING");
_Static_assert((int)RM_E_TIMED_OUT == (int)TXP_ETIMED_OUT, "RM_E_TIMED_OUT is TXP_ETIMED_OUT");
_Static_assert((int)RM_E_STORE == (int)TXP_ESTORE, "RM_E_STORE is TXP_ESTORE");
_Static_assert((int)RM_E_BUSY == (int)TXP_EBUSY, "RM_E_BUSY is TXP_EBUSY");
_Static_assert((int)RM_E_DIRTY_WRITE == (int)TXP_EDIRTY_WRITE, "RM_E_DIRTY_WRITE is TXP_EDIRTY_WRITE");
_Static_assert((int)RM_E_UNKNOWN_OUTCOME == (int)TXP_EUNKNOWN_OUTCOME, "RM_E_UNKNOWN_OUTCOME is TXP_EUNKNOWN_OUTCOME");
_Static_assert((int)RM_E_DEADLINE == (int)TXP_EDEADLINE, "RM_E_DEADLINE is TXP_EDEADLINE");
_Static_assert((int)RM_E_NO_NODE == (int)TXP_ENO_NODE, "RM_E_NO_NODE is TXP_ENO_NODE");
_Static_assert((int)RM_E_CONN_LOST == (int)TXP_ECONN_LOST, "RM_E_CONN_LOST is TXP_ECONN_LOST");
_Static_assert((int)RM_E_NOT_SUPPORTED == (int)TXP_ENOT_SUPPORTED, "RM_E_NOT_SUPPORTED is TXP_ENOT_SUPPORTED");
_Static_assert((int)RM_E_ROLLBACK_PENDING == (int)TXP_EROLLBACK_PENDING, "RM_E_ROLLBACK_PENDING is TXP_EROLLBACK_PENDING");
_Static_assert((int)RM_E_ROLLBACK_FAILED == (int)TXP_EROLLBACK_FAILED, "RM_E_ROLLBACK_FAILED is TXP_EROLLBACK_FAILED");
_Static_assert((int)RM_E_COMMIT_FAILED == (int)TXP_ECOMMIT_FAILED, "RM_E_COMMIT_FAILED is TXP_ECOMMIT_FAILED");
_Static_assert((int)RM_E_COMMIT_PENDING == (int)TXP_ECOMMIT_PENDING, "RM_E_COMMIT_PENDING is TXP_ECOMMIT_PENDING");
/* Every global status, so that a caller can name each one the TC answers. */
#define RM_GS_SAME(rm, txp) _Static_assert((int)(rm) == (int)(txp), #rm " is " #txp)
RM_GS_SAME(RM_GS_UNKNOWN, TXP_GS_UNKNOWN);
RM_GS_SAME(RM_GS_BEGIN, TXP_GS_BEGIN);
RM_GS_SAME(RM_GS_COMMITTING, TXP_GS_COMMITTING);
RM_GS_SAME(RM_GS_COMMIT_RETRYING, TXP_GS_COMMIT_RETRYING);
RM_GS_SAME(RM_GS_ROLLBACKING, TXP_GS_ROLLBACKING);
RM_GS_SAME(RM_GS_ROLLBACK_RETRYING, TXP_GS_ROLLBACK_RETRYING);
RM_GS_SAME(RM_GS_TIMEOUT_ROLLBACKING, TXP_GS_TIMEOUT_ROLLBACKING);
RM_GS_SAME(RM_GS_TIMEOUT_ROLLBACK_RETRYING, TXP_GS_TIMEOUT_ROLLBACK_RETRYING);
RM_GS_SAME(RM_GS_ASYNC_COMMITTING, TXP_GS_ASYNC_COMMITTING);
RM_GS_SAME(RM_GS_COMMITTED, TXP_GS_COMMITTED);
RM_GS_SAME(RM_GS_COMMIT_FAILED, TXP_GS_COMMIT_FAILED);
RM_GS_SAME(RM_GS_ROLLBACKED, TXP_GS_ROLLBACKED);
RM_GS_SAME(RM_GS_TIMEOUT_ROLLBACKED, TXP_GS_TIMEOUT_ROLLBACKED);
RM_GS_SAME(RM_GS_ROLLBACK_FAILED, TXP_GS_ROLLBACK_FAILED);
RM_GS_SAME(RM_GS_TIMEOUT_ROLLBACK_FAILED, TXP_GS_TIMEOUT_ROLLBACK_FAILED);
RM_GS_SAME(RM_GS_FINISHED, TXP_GS_FINISHED);
RM_GS_SAME(RM_GS_STOP_COMMIT_RETRY, TXP_GS_STOP_COMMIT_RETRY);
RM_GS_SAME(RM_GS_STOP_ROLLBACK_RETRY, TXP_GS_STOP_ROLLBACK_RETRY);
_Static_assert(TXP_GS__MAX == 21, "a new global status: add it to rm_client.h's RM_GS_*");
#undef RM_GS_SAME

/* The last error of the calling thread (rm_errmsg). */
static _Thread_local char tls_errmsg[RM_ERRMSG_MAX];

const char *rm_errmsg(void) { return tls_errmsg; }

void rm__errmsg_set(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(tls_errmsg, sizeof(tls_errmsg), fmt, ap);
  va_end(ap);
}

int rm__fail(int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(tls_errmsg, sizeof(tls_errmsg), fmt, ap);
  va_end(ap);
  return code;
}

const char *rm_strerror(int code) {
  switch (code) {
  case RM_E_DB: return "database statement failed";
  case RM_E_NO_TABLE: return "unknown table";
  case RM_E_NO_PK: return "table has no primary key";
  case RM_E_NOT_ONE_ROW: return "statement would change no row or several rows";
  case RM_E_GUARD: return "guard condition refused the update";
  case RM_E_STATE: return "call out of order for this branch";
  case RM_E_TCC_HANDLER: return "a TCC confirm or cancel handler failed";
  case RM_E_FENCE: return "the branch fence refused (finished the other way, or rolled back before its phase one)";
  case RM_LOCAL_E_MISMATCH: return "order id already recorded with other values";
  case RM_LOCAL_E_PAID: return "order is paid: not cancelled";
  case RM_LOCAL_E_DECIDED: return "order was finished before with the other outcome";
  case RM_LOCAL_E_IDEM_KEY: return "another order of the user holds this idempotency key";
  case RM_COMP_E_LOCKED: return "another compensation job is running";
  default: return txp_strerror(code);
  }
}

const char *rm_global_status_name(int status) { return txp_global_status_name(status); }

int rm__check_str(const char *s, size_t max, bool required) {
  if (!s) return required ? RM_E_INVALID : 0;
  size_t n = strnlen(s, max + 1);
  if (n > max || (required && n == 0)) return RM_E_INVALID;
  return 0;
}

void rm__utf8_cut(char *s, size_t max) {
  size_t n = strlen(s);
  if (n <= max) return;
  n = max;
  while (n > 0 && ((unsigned char)s[n] & 0xc0) == 0x80) n--;
  s[n] = '\0';
}

void rm__idem_key(char *out) {
  static atomic_uint_fast64_t counter;
  uint8_t b[RM_IDEM_BYTES];
  if (uv_random(NULL, NULL, b, sizeof(b), 0, NULL) != 0) {
    /* No entropy source: mix the clock, a counter and the stack address
     * (splitmix64); unique in practice for one process. */
    uint64_t x = uv_hrtime() ^ ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)&b;
    x += atomic_fetch_add(&counter, 1) * UINT64_C(0x9E3779B97F4A7C15);
    for (size_t i = 0; i < sizeof(b); i += 8) {
      uint64_t z = (x += UINT64_C(0x9E3779B97F4A7C15));
      z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
      z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
      z ^= z >> 31;
      memcpy(b + i, &z, 8);
    }
  }
  static const char hex[] = "0123456789abcdef";
  for (size_t i = 0; i < sizeof(b); i++) {
    out[2 * i] = hex[b[i] >> 4];
    out[2 * i + 1] = hex[b[i] & 15];
  }
  out[2 * RM_IDEM_BYTES] = '\0';
}


uint64_t rm__mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}
