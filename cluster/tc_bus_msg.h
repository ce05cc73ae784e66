/*
 * tc_bus_msg.h - the messages tcd nodes exchange on their nanomsg BUS, and
 * their byte format.
 *
 * NOTES
 *   Nothing on the bus is durable and nothing on it decides anything: every
 *   message is safe to lose, to repeat and to receive late.  The bus only
 *   makes things faster than the store-driven fallbacks (a waiter re-checks
 *   the store, the leader retries phase two).
 *
 *   A message is a 32-byte header, a payload and a 32-byte MAC (see
 *   tc_bus_auth.h: HMAC-SHA-512-256 with the cluster secret over the header
 *   and the payload); integers are big-endian, strings are a length (u8 or
 *   u16) and bytes without a NUL:
 *
 *     off size field
 *       0    4 magic        "TXB2" (TXB1 was the unauthenticated format:
 *                           refused like any other bad magic)
 *       4    1 kind         tc_bus_kind_t
 *       5    1 flags        TC_BUS_F_* (HELLO only; 0 otherwise)
 *       6    2 from         sender node id (1..1023)
 *       8    4 incarnation  random per process start of the sender
 *      12    4 payload_len  bytes that follow the header, before the MAC
 *      16    8 seq          per (sender, incarnation): 1, 2, 3, ...
 *      24    8 sent_ms      sender's wall clock, ms since the epoch
 *      32    n payload
 *    32+n   32 mac          crypto_auth of bytes [0, 32+n)
 *
 *   Payloads:
 *     HELLO           u8 len + advertised client address; flags: leader, asks for an answer,
 *                     has lock waiters
 *     RELEASED        u16 count, then count x (u8 len + xid): the global
 *                     locks of these xids were released (or began rolling
 *                     back) on the sender: wake their waiters
 *     FORWARD         u16 target node (0 = any), u64 forward id,
 *                     u32 timeout_ms, u8 len + client_id, u32 len + one
 *                     txp frame (BranchCommit or BranchRollback)
 *     FORWARD_RESULT  u16 target node (the asker), u64 forward id,
 *                     u8 outcome (tc_bus_outcome_t), u8 len + xid, u64
 *                     branch id (both copied from the FORWARD answered),
 *                     u32 len + one txp frame (the RM's *_RESULT, with the
 *                     same xid and branch id set by the relaying node;
 *                     empty unless ANSWERED)
 *   A receiver checks every length against the bytes present; a message
 *   that does not parse is dropped and counted, never half-applied.  The
 *   writers leave seq, sent_ms and the MAC out: tc_bus_seal() adds them.
 *
 *   Thread: pure functions, no state.
 */
#ifndef TC_BUS_MSG_H
#define TC_BUS_MSG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "txp_msg.h"

#define TC_BUS_MAGIC "TXB2"
#define TC_BUS_HEADER_SIZE 32
#define TC_BUS_TRAILER_SIZE 32 /* the MAC */
#define TC_BUS_MAX_MSG (1024u * 1024u) /* below NN_RCVMAXSIZE */
#define TC_BUS_MAX_ADDR 255

typedef enum tc_bus_kind {
  TC_BUS_HELLO = 1,
  TC_BUS_RELEASED = 2,
  TC_BUS_FORWARD = 3,
  TC_BUS_FORWARD_RESULT = 4,
} tc_bus_kind_t;

enum {
  TC_BUS_F_LEADER = 1u << 0,  /* the sender leads the recovery jobs */
  TC_BUS_F_WAITERS = 1u << 1, /* the sender has lock waiters: send it releases */
  TC_BUS_F_ASK = 1u << 2,     /* the sender just learned new members: answer with a HELLO */
};

typedef enum tc_bus_outcome {
  TC_BUS_ANSWERED = 0, /* the RM answered: the frame is its result */
  TC_BUS_NO_RM = 1,    /* no RM for that resource on the sender */
  TC_BUS_REFUSED = 2,  /* the store does not back the request (e.g. the
                        * global transaction is not decided that way) */
  TC_BUS_FAILED = 3,   /* an RM was there but the call failed (lost, timeout) */
} tc_bus_outcome_t;

typedef struct tc_bus_hdr {
  int kind;
  uint8_t flags;
  uint16_t from;
  uint32_t incarnation;
  uint64_t seq;
  uint64_t sent_ms;
  const uint8_t *payload; /* borrowed from the buffer */
  uint32_t payload_len;
} tc_bus_hdr_t;

typedef struct tc_bus_forward_msg {
  uint16_t target;
  uint64_t id;
  uint32_t timeout_ms;
  char client_id[TXP_MAX_NAME_LEN + 1];
  const uint8_t *frame; /* borrowed */
  uint32_t frame_len;
} tc_bus_forward_msg_t;

typedef struct tc_bus_result_msg {
  uint16_t target;
  uint64_t id;
  uint8_t outcome;
  char xid[TXP_MAX_XID_LEN + 1]; /* of the FORWARD answered */
  int64_t branch_id;
  const uint8_t *frame; /* borrowed; may be empty */
  uint32_t frame_len;
} tc_bus_result_msg_t;

/* Parse the header of 'buf' (a whole message: header, payload, MAC).
 * Returns 0 or TXP_EMALFORMED (bad magic, unknown kind, node id 0 or above
 * 1023, sequence 0, a payload length that does not match 'len').  The MAC
 * is not checked here: tc_bus_verify(). */
int tc_bus_parse_header(const void *buf, size_t len, tc_bus_hdr_t *out);

/* Payload parsers: 0 or TXP_EMALFORMED.  'addr' holds TC_BUS_MAX_ADDR + 1. */
int tc_bus_parse_hello(const tc_bus_hdr_t *h, char *addr, size_t addrlen);
int tc_bus_parse_forward(const tc_bus_hdr_t *h, tc_bus_forward_msg_t *out);
int tc_bus_parse_result(const tc_bus_hdr_t *h, tc_bus_result_msg_t *out);

/* RELEASED: call 'fn' for each xid (NUL-terminated copy, at most
 * TXP_MAX_XID_LEN bytes).  The whole payload is checked before the first
 * call, so a malformed message calls nothing.  Returns the count or
 * TXP_EMALFORMED. */
int tc_bus_each_released(const tc_bus_hdr_t *h, void (*fn)(const char *xid, void *arg), void *arg);

/* ---- writers: append one message to 'out' (nothing on error), to be
 * sealed with tc_bus_seal() before it is sent ---- */

int tc_bus_write_hello(txp_buf_t *out, uint16_t from, uint32_t inc, uint8_t flags, const char *addr);
int tc_bus_write_forward(txp_buf_t *out, uint16_t from, uint32_t inc, const tc_bus_forward_msg_t *f);
int tc_bus_write_result(txp_buf_t *out, uint16_t from, uint32_t inc, const tc_bus_result_msg_t *r);

/* RELEASED is built incrementally: begin, add xids, end.  add returns
 * TXP_EBUFFER_FULL when the message would pass 'max_bytes' or 65535 xids
 * (end it, send it, begin another).  An empty message (no xid) is valid. */
typedef struct tc_bus_released_writer {
  txp_buf_t *out;
  size_t start;
  uint16_t count;
  size_t max_bytes;
} tc_bus_released_writer_t;

int tc_bus_released_begin(tc_bus_released_writer_t *w, txp_buf_t *out, uint16_t from, uint32_t inc,
                          size_t max_bytes);
int tc_bus_released_add(tc_bus_released_writer_t *w, const char *xid);
void tc_bus_released_end(tc_bus_released_writer_t *w);

const char *tc_bus_kind_name(int kind);

#endif /* TC_BUS_MSG_H */
