/*
 * rm_util.h - librmclient's small helpers (rm_util.c), used by every part
 * of the library: the one place that includes nothing of it but the public
 * header.  Not installed.
 */
#ifndef RM_UTIL_H
#define RM_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rm_client.h"

/* Bytes of an idempotency key (rm__idem_key writes twice as many hex
 * digits and a NUL). */
#define RM_IDEM_BYTES 16

/* Monotonic milliseconds (CLOCK_MONOTONIC, the clock libuv's uv_hrtime
 * reads): the one clock of the library's deadlines and backoffs. */
uint64_t rm__mono_ms(void);

/* A string argument: RM_E_INVALID when NULL/empty (if required) or longer
 * than 'max' bytes. */
int rm__check_str(const char *s, size_t max, bool required);
/* Cut 's' to at most 'max' bytes at a UTF-8 character boundary (in place). */
void rm__utf8_cut(char *s, size_t max);
/* 128 random bits as 32 hex digits: one idempotency key per logical call
 * ('out' holds 2 * RM_IDEM_BYTES + 1 bytes). */
void rm__idem_key(char *out);

/* rm_errmsg(): the calling thread's last failure, set by every public
 * call that fails: the library's one last-error slot, which the prefilter
 * and the local mode report to as well (rm_prefilter_errmsg and
 * rm_local_errmsg read it).  Lowercase, no final period, PostgreSQL's
 * style. */
#define RM_ERRMSG_MAX 1024
void rm__errmsg_set(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* rm__errmsg_set, then return 'code': "return rm__fail(RM_E_INVALID, ...)". */
int rm__fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif /* RM_UTIL_H */
