/*
 * tc_bus_auth.c - see tc_bus_auth.h.
 */
#include "tc_bus_auth.h"

#include <errno.h>
#include <sodium.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "tc_bus_msg.h"
#include "txc_keyfile.h"

static int hex_key(const char *hex, size_t n, unsigned char *key) { return txc_key_from_hex(hex, n, key); }

int tc_bus_keys_load(const char *path, tc_bus_keys_t *out, char *err, size_t errlen) {
  memset(out, 0, sizeof(*out));
  int n = txc_keyfile_load(path, "cluster secret file", out->key, TC_BUS_MAX_KEYS, err, errlen);
  if (n < 0) return -1;
  out->n = n;
  return 0;
}

int tc_bus_keys_from_hex(tc_bus_keys_t *out, const char *current, const char *previous) {
  memset(out, 0, sizeof(*out));
  if (sodium_init() < 0 || !current || hex_key(current, strlen(current), out->key[0]) != 0) return -1;
  out->n = 1;
  if (previous) {
    if (hex_key(previous, strlen(previous), out->key[1]) != 0) {
      tc_bus_keys_wipe(out);
      return -1;
    }
    out->n = 2;
  }
  return 0;
}

void tc_bus_keys_wipe(tc_bus_keys_t *k) {
  sodium_memzero(k, sizeof(*k));
}

static void put_u64_at(uint8_t *p, uint64_t v) {
  for (int i = 7; i >= 0; i--) {
    p[i] = (uint8_t)v;
    v >>= 8;
  }
}

int tc_bus_seal(txp_buf_t *b, size_t start, uint64_t seq, uint64_t sent_ms, const tc_bus_keys_t *k) {
  if (!k || k->n < 1 || !b->data || b->len < start + TC_BUS_HEADER_SIZE) return TXP_EINVALID_ARG;
  uint8_t *m = (uint8_t *)b->data + start;
  if (memcmp(m, TC_BUS_MAGIC, 4) != 0) return TXP_EINVALID_ARG;
  put_u64_at(m + 16, seq);
  put_u64_at(m + 24, sent_ms);
  unsigned char mac[TC_BUS_MAC_BYTES];
  crypto_auth(mac, m, b->len - start, k->key[0]);
  return txp_buf_append(b, mac, sizeof(mac));
}

int tc_bus_verify(const void *buf, size_t len, const tc_bus_keys_t *k) {
  if (!buf || !k || len < TC_BUS_HEADER_SIZE + TC_BUS_MAC_BYTES) return TXP_EAUTH;
  const unsigned char *m = buf;
  size_t body = len - TC_BUS_MAC_BYTES;
  int ok = 0;
  for (int i = 0; i < k->n && i < TC_BUS_MAX_KEYS; i++) ok |= crypto_auth_verify(m + body, m, body, k->key[i]) == 0;
  return ok ? 0 : TXP_EAUTH;
}

/* ------------------------------------------------------ replay window */

void tc_bus_replay_init(tc_bus_replay_t *r, uint64_t window_ms) {
  memset(r, 0, sizeof(*r));
  r->window_ms = window_ms ? window_ms : 30000;
}

tc_bus_replay_verdict_t tc_bus_replay_check(tc_bus_replay_t *r, uint16_t from, uint32_t incarnation, uint64_t seq,
                                            uint64_t sent_ms, uint64_t now_ms) {
  uint64_t w = r->window_ms;
  if (sent_ms + w < now_ms || sent_ms > now_ms + w) return TC_BUS_STALE;
  tc_bus_replay_slot_t *hit = NULL, *spare = NULL, *lru = NULL;
  for (int i = 0; i < TC_BUS_REPLAY_SLOTS; i++) {
    tc_bus_replay_slot_t *s = &r->slot[i];
    if (s->from == from && s->incarnation == incarnation) {
      hit = s;
      break;
    }
    /* Forgotten after 2 x window: whatever it saw is now stale. */
    bool expired = s->from == 0 || s->last_ms + 2 * w < now_ms;
    if (expired && !spare) spare = s;
    if (!lru || s->last_ms < lru->last_ms) lru = s;
  }
  if (hit) {
    if (seq <= hit->max_seq) return TC_BUS_REPLAYED;
  } else {
    hit = spare ? spare : lru;
    hit->from = from;
    hit->incarnation = incarnation;
  }
  hit->max_seq = seq;
  hit->last_ms = now_ms;
  return TC_BUS_FRESH;
}

uint64_t tc_bus_wall_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}
