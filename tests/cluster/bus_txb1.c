/*
 * bus_txb1.c - see bus_txb1.h.
 */
#include "bus_txb1.h"

#include <nanomsg/nn.h>
#include <stdlib.h>
#include <string.h>

#include "tc_bus_msg.h"

static void put_be(uint8_t *p, uint64_t v, int n) {
  for (int i = n - 1; i >= 0; i--) {
    p[i] = (uint8_t)v;
    v >>= 8;
  }
}

int bus_send_txb1(int s, uint16_t asker, uint64_t id, const txp_buf_t *frame) {
  size_t plen = 2 + 8 + 1 + 4 + frame->len;
  uint8_t *m = calloc(1, 16 + plen);
  if (!m) return -1;
  memcpy(m, "TXB1", 4);
  m[4] = TC_BUS_FORWARD_RESULT;
  put_be(m + 6, 777, 2);
  put_be(m + 8, 12345, 4);
  put_be(m + 12, plen, 4);
  put_be(m + 16, asker, 2);
  put_be(m + 18, id, 8);
  m[26] = TC_BUS_ANSWERED;
  put_be(m + 27, frame->len, 4);
  memcpy(m + 31, frame->data, frame->len);
  int n = nn_send(s, m, 16 + plen, 0);
  free(m);
  return n;
}
