/*
 * fuzz_bus.c - libFuzzer target for the peer bus decoder (cluster/
 * tc_bus_msg.h) and its authentication (tc_bus_auth.h): what any process
 * that reaches a node's bus address can send it.
 *
 * For each input:
 *   (a) the input is parsed as a whole message (header, then the payload
 *       parser of its kind); a message that parses is written again from
 *       the parsed fields and sealed with the same sequence and stamp: the
 *       bytes must be the input's (the format is canonical), and the MAC of
 *       the copy verifies;
 *   (b) the MAC check never accepts the input unless its last 32 bytes are
 *       the MAC of the rest under the fuzz key (checked by sealing again);
 *   (c) the input without its first byte, sealed with the fuzz key as if
 *       it were a message a node wrote, verifies, and parses exactly when
 *       (a) would parse it;
 *   (d) the input's bytes, read as (from, incarnation, seq, stamp) tuples,
 *       drive a replay window: a tuple accepted once is refused when it
 *       comes again.
 * Any disagreement calls abort(), which libFuzzer reports as a crash.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_check.h"
#include "tc_bus_auth.h"
#include "tc_bus_msg.h"

/* The key of the seed corpus (tests/fuzz/corpus-bus, gen_bus_corpus.py). */
#define FUZZ_KEY "6275732d66757a7a2d6b65792d6e6f742d612d7265616c2d7365637265742121"

static tc_bus_keys_t keys;
static bool keys_ok;

typedef struct {
  txp_buf_t b;
  tc_bus_released_writer_t w;
  int n;
  bool bad;
} rel_t;

static void re_add(const char *xid, void *arg) {
  rel_t *r = arg;
  if (tc_bus_released_add(&r->w, xid) != 0) r->bad = true;
  r->n++;
}

/* Parse 'buf' as a whole message; when it parses, write it again into
 * 'out' (unsealed).  Returns whether it parsed. */
static bool parse_and_rewrite(const uint8_t *buf, size_t len, txp_buf_t *out, tc_bus_hdr_t *h) {
  if (tc_bus_parse_header(buf, len, h) != 0) return false;
  CHECK(h->from >= 1 && h->from <= 1023 && h->seq > 0);
  CHECK((size_t)h->payload_len + TC_BUS_HEADER_SIZE + TC_BUS_TRAILER_SIZE == len);
  char addr[TC_BUS_MAX_ADDR + 1];
  tc_bus_forward_msg_t f;
  tc_bus_result_msg_t r;
  switch (h->kind) {
  case TC_BUS_HELLO:
    if (tc_bus_parse_hello(h, addr, sizeof(addr)) != 0) return false;
    CHECK(tc_bus_write_hello(out, h->from, h->incarnation, h->flags, addr) == 0);
    return true;
  case TC_BUS_RELEASED: {
    rel_t rl = {.n = 0};
    txp_buf_init(&rl.b, 0);
    CHECK(tc_bus_released_begin(&rl.w, &rl.b, h->from, h->incarnation, 0) == 0);
    int n = tc_bus_each_released(h, re_add, &rl);
    if (n < 0) {
      CHECK(rl.n == 0); /* nothing applied from a malformed message */
      txp_buf_free(&rl.b);
      return false;
    }
    CHECK(n == rl.n && !rl.bad);
    tc_bus_released_end(&rl.w);
    txp_buf_append(out, rl.b.data, rl.b.len);
    txp_buf_free(&rl.b);
    return true;
  }
  case TC_BUS_FORWARD:
    if (tc_bus_parse_forward(h, &f) != 0) return false;
    CHECK(f.frame_len > 0 && strlen(f.client_id) <= TXP_MAX_NAME_LEN);
    CHECK(tc_bus_write_forward(out, h->from, h->incarnation, &f) == 0);
    return true;
  case TC_BUS_FORWARD_RESULT:
    if (tc_bus_parse_result(h, &r) != 0) return false;
    CHECK(r.xid[0] && strlen(r.xid) <= TXP_MAX_XID_LEN);
    CHECK((r.outcome == TC_BUS_ANSWERED) == (r.frame_len > 0));
    CHECK(tc_bus_write_result(out, h->from, h->incarnation, &r) == 0);
    return true;
  default: CHECK(false);
  }
  return false;
}

static bool parses(const uint8_t *buf, size_t len) {
  tc_bus_hdr_t h;
  txp_buf_t out;
  txp_buf_init(&out, 0);
  bool ok = parse_and_rewrite(buf, len, &out, &h);
  txp_buf_free(&out);
  return ok;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!keys_ok) {
    CHECK(tc_bus_keys_from_hex(&keys, FUZZ_KEY, NULL) == 0);
    keys_ok = true;
  }
  if (size > 256 * 1024) return 0;

  /* (a) */
  tc_bus_hdr_t h;
  txp_buf_t out;
  txp_buf_init(&out, 0);
  bool ok = parse_and_rewrite(data, size, &out, &h);
  if (ok) {
    if (h.kind != TC_BUS_HELLO && out.len > 5) out.data[5] = (char)data[5]; /* flags: HELLO only */
    CHECK(tc_bus_seal(&out, 0, h.seq, h.sent_ms, &keys) == 0);
    CHECK(out.len == size);
    CHECK(memcmp(out.data, data, size - TC_BUS_MAC_BYTES) == 0);
    CHECK(tc_bus_verify(out.data, out.len, &keys) == 0);
    /* (b) */
    bool same_mac = memcmp(out.data + size - TC_BUS_MAC_BYTES, data + size - TC_BUS_MAC_BYTES, TC_BUS_MAC_BYTES) == 0;
    CHECK((tc_bus_verify(data, size, &keys) == 0) == same_mac);
  } else {
    /* Garbage may verify only if it carries a real MAC: seal the body. */
    if (size >= TC_BUS_HEADER_SIZE + TC_BUS_MAC_BYTES && tc_bus_verify(data, size, &keys) == 0 &&
        memcmp(data, TC_BUS_MAGIC, 4) == 0) {
      txp_buf_t b;
      txp_buf_init(&b, 0);
      txp_buf_append(&b, data, size - TC_BUS_MAC_BYTES);
      uint64_t seq = 0, ms = 0;
      for (int i = 0; i < 8; i++) seq = (seq << 8) | data[16 + i];
      for (int i = 0; i < 8; i++) ms = (ms << 8) | data[24 + i];
      CHECK(tc_bus_seal(&b, 0, seq, ms, &keys) == 0);
      CHECK(memcmp(b.data, data, size) == 0);
      txp_buf_free(&b);
    }
  }
  txp_buf_free(&out);

  /* (c) */
  if (size > 1 + TC_BUS_HEADER_SIZE && memcmp(data + 1, TC_BUS_MAGIC, 4) == 0) {
    txp_buf_t b;
    txp_buf_init(&b, 0);
    txp_buf_append(&b, data + 1, size - 1);
    uint64_t seq = 1 + data[0];
    CHECK(tc_bus_seal(&b, 0, seq, 1700000000000ull, &keys) == 0);
    CHECK(tc_bus_verify(b.data, b.len, &keys) == 0);
    b.data[b.len - 1] ^= 1;
    CHECK(tc_bus_verify(b.data, b.len, &keys) != 0);
    b.data[b.len - 1] ^= 1;
    /* The patched seq/stamp and the added MAC: parses like any message of
     * that shape (payload length permitting). */
    (void)parses((const uint8_t *)b.data, b.len);
    txp_buf_free(&b);
  }

  /* (d) */
  static tc_bus_replay_t rp;
  tc_bus_replay_init(&rp, 1000 + (size ? data[0] : 0) * 100u);
  uint64_t now = 1700000000000ull;
  for (size_t at = 0; at + 8 <= size && at < 8 * 512; at += 8) {
    const uint8_t *t = data + at;
    uint16_t from = (uint16_t)(1 + (t[0] % 8));
    uint32_t inc = t[1] % 4;
    uint64_t seq = (uint64_t)t[2] << 8 | t[3];
    int64_t skew = (int64_t)(int8_t)t[4] * 100;
    now += t[5] * 37u;
    uint64_t sent = (uint64_t)((int64_t)now + skew);
    tc_bus_replay_verdict_t v = tc_bus_replay_check(&rp, from, inc, seq, sent, now);
    CHECK(v == TC_BUS_FRESH || v == TC_BUS_REPLAYED || v == TC_BUS_STALE);
    if (v == TC_BUS_FRESH) CHECK(tc_bus_replay_check(&rp, from, inc, seq, sent, now) == TC_BUS_REPLAYED);
    if (v == TC_BUS_STALE) CHECK(skew > (int64_t)rp.window_ms || -skew > (int64_t)rp.window_ms);
  }
  return 0;
}
