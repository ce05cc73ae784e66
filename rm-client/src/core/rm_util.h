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

#endif /* RM_UTIL_H */
