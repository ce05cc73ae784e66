/*
 * txp_mpcheck.h - structural check of untrusted msgpack bytes, before
 * msgpack-c is allowed to allocate for them.
 *
 * NOTES
 *   msgpack-c's unpacker allocates n * sizeof(msgpack_object) as soon as it
 *   reads a container header declaring n entries, whatever the bytes that
 *   follow.  A 6-byte body can therefore ask for gigabytes.  This walk runs
 *   first: it checks every count against the bytes actually left (each entry
 *   needs at least one byte) and against the limits, every string/bin/ext
 *   length likewise, the nesting depth, and that exactly one object fills the
 *   buffer.  It allocates nothing.
 */
#ifndef TXP_MPCHECK_H
#define TXP_MPCHECK_H

#include <stddef.h>
#include <stdint.h>

/* Returns 0 when 'buf' holds exactly one well-formed msgpack object within
 * the limits; TXP_EMALFORMED (bad/truncated/trailing bytes) or TXP_ELIMIT
 * (count, depth or string length past its limit). */
int txp_mpcheck(const unsigned char *buf, size_t len, uint32_t max_count, uint32_t max_depth,
                uint32_t max_string);

#endif /* TXP_MPCHECK_H */
