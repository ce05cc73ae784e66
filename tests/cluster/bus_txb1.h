/*
 * bus_txb1.h - what the old peer bus accepted (shared/security/bus.py):
 * the TXB1 format, no MAC, any node id.  The tests that check the bus
 * refuses it now (cluster_bus's intruder, test_tc_bus) send it with this.
 */
#ifndef BUS_TXB1_H
#define BUS_TXB1_H

#include <stdint.h>

#include "txp_msg.h"

/* Send on the nanomsg socket 's', in the TXB1 format as node 777, the
 * answer to forward 'id' of node 'asker' carrying the encoded result
 * 'frame'.  The bytes sent, or -1 (nn_send's). */
int bus_send_txb1(int s, uint16_t asker, uint64_t id, const txp_buf_t *frame);

#endif /* BUS_TXB1_H */
