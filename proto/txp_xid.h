/*
 * txp_xid.h - the global transaction id, made by a coordinator and read by
 * clients: "NODE:ID:NONCE", where NODE is the host:port the coordinator
 * advertises (at most TXP_XID_NODE_MAX bytes), ID its decimal transaction
 * id and NONCE 16 lowercase hex digits of a random 64-bit value that the
 * coordinator draws for each transaction (getrandom(2)).  Clients route a
 * transaction's later calls to NODE.  One definition of the format, for
 * both sides of the wire.
 *
 * NOTES
 *   ID makes an xid unique (ids come from blocks no two nodes share); NONCE
 *   makes it unguessable: knowing one xid, or a thousand, tells nothing
 *   about the next, since the next ID is easy to guess but its NONCE is not
 *   (one in 2^64).  The coordinator never parses an xid: it looks it up in
 *   its store as an opaque string, and an xid that is not there is "not
 *   found".  An xid is not a credential either: the coordinator checks who
 *   may act on a transaction (README "Security model"); the nonce only
 *   keeps strangers from finding live transactions to try.
 */
#ifndef TXP_XID_H
#define TXP_XID_H

#include <stddef.h>
#include <stdint.h>

#include "txp_msg.h"

/* Longest NODE part (node.advertise is validated against it): the longest
 * xid, NODE + ':' + 19 digits + ':' + the nonce, fits TXP_MAX_XID_LEN. */
#define TXP_XID_NODE_MAX 90
/* Hex digits of the NONCE part. */
#define TXP_XID_NONCE_LEN 16

_Static_assert(TXP_XID_NODE_MAX + 1 + 19 + 1 + TXP_XID_NONCE_LEN <= TXP_MAX_XID_LEN,
               "the longest xid must fit TXP_MAX_XID_LEN");

/*
 * Write the xid of transaction 'id' (>= 0) begun on 'node', with the
 * random 'nonce', into 'out'.  Returns its length, or -1 when 'node' is
 * empty or longer than TXP_XID_NODE_MAX, 'id' negative, or the xid does not
 * fit 'cap'.  The caller draws 'nonce' from a cryptographic source.
 */
int txp_xid_make(char *out, size_t cap, const char *node, int64_t id, uint64_t nonce);

/*
 * Split 'xid' into its NODE (copied into 'node', 'cap' bytes), ID (*id,
 * may be NULL) and NONCE (*nonce, may be NULL).  Returns 0, or -1 when
 * 'xid' is not of the form above: fewer than three ':', a NONCE that is
 * not 16 lowercase hex digits, an ID that is not 1-19 decimal digits (or
 * above INT64_MAX), an empty or too long NODE, NODE without a ":port" of
 * digits, or NODE not fitting 'cap'.  The host part is not checked
 * further: that is the client's address parser's business.
 */
int txp_xid_parse(const char *xid, char *node, size_t cap, int64_t *id, uint64_t *nonce);

#endif /* TXP_XID_H */
