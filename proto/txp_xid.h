/*
 * txp_xid.h - the global transaction id, made by a coordinator and read by
 * clients: "NODE:ID", where NODE is the host:port the coordinator
 * advertises (at most TXP_XID_NODE_MAX bytes) and ID its decimal
 * transaction id.  Clients route a transaction's later calls to NODE.
 * One definition of the format, for both sides of the wire.
 */
#ifndef TXP_XID_H
#define TXP_XID_H

#include <stddef.h>
#include <stdint.h>

#include "txp_msg.h"

/* Longest NODE part (node.advertise is validated against it). */
#define TXP_XID_NODE_MAX 100

/*
 * Write the xid of transaction 'id' (>= 0) begun on 'node' into 'out'.
 * Returns its length, or -1 when 'node' is empty or longer than
 * TXP_XID_NODE_MAX, 'id' negative, or the xid does not fit 'cap'.
 */
int txp_xid_make(char *out, size_t cap, const char *node, int64_t id);

/*
 * Split 'xid' into its NODE (copied into 'node', 'cap' bytes) and ID
 * (*id, may be NULL).  Returns 0, or -1 when 'xid' is not of the form
 * above: no ':', an empty or too long NODE, NODE without a ":port" of
 * digits, an ID that is not 1-19 decimal digits, or NODE not fitting
 * 'cap'.  The host part is not checked further: that is the client's
 * address parser's business.
 */
int txp_xid_parse(const char *xid, char *node, size_t cap, int64_t *id);

#endif /* TXP_XID_H */
