/*
 * tc_bus_auth.h - what makes a bus message believable: the cluster secret
 * (a MAC over the whole message), and the replay window.
 *
 * NOTES
 *   The secret.  A file of one or two lines, each 64 hex digits (a 32-byte
 *   key, e.g. `od -An -tx1 -N32 /dev/urandom | tr -d ' \n'`), mode 0600
 *   (a file that group or others may read is refused), '#' lines and empty
 *   lines ignored.  Line 1 is the current key: messages are signed with it.
 *   Line 2, if present, is the other key of a rotation: messages that verify
 *   with it are accepted too.  Rolling rotation without a bus outage (each
 *   step applied to every node, one node at a time, before the next step):
 *     1. "OLD\nNEW"  sign with the old key, accept the new one;
 *     2. "NEW\nOLD"  sign with the new key, still accept the old one;
 *     3. "NEW"       the old key is gone.
 *   A node reads the file at start (tcd: and again on SIGHUP).
 *
 *   The MAC is libsodium's crypto_auth (HMAC-SHA-512-256, 32 bytes) over
 *   the header and the payload (tc_bus_msg.h has the layout), the tag in
 *   the last 32 bytes.  It proves "written by a holder of the secret", i.e.
 *   some member: that the claimed sender is really that member is not
 *   proved (that would take per-node signing keys, crypto_sign).  The
 *   payload is not encrypted: whoever can reach the bus can still read
 *   xids and branch ids, not act on them.
 *
 *   The replay window.  Every sender numbers its messages 1, 2, 3, ... per
 *   incarnation (a random u32 per process start) and stamps them with its
 *   wall clock (ms).  A receiver accepts a message only if the stamp is
 *   within +-window of its own clock and its sequence number is above every
 *   one it accepted from that (sender, incarnation).  Strictly increasing is
 *   enough: each pair of nodes shares exactly one TCP pipe (tc_bus.h), so
 *   messages from one sender arrive in order (some may be lost, a gap is
 *   fine).  The window bounds what must be remembered: an entry not used
 *   for 2 x window is forgotten, and anything it could have been replayed
 *   with is then outside the window.  The clocks of the nodes must agree
 *   within the window (NTP).
 *
 *   Thread: pure functions and caller-owned state, no locks.
 */
#ifndef TC_BUS_AUTH_H
#define TC_BUS_AUTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "txp_msg.h"

#define TC_BUS_KEY_BYTES 32 /* TXC_KEY_BYTES: the key file format is common/txc_keyfile.h */
#define TC_BUS_MAC_BYTES 32
#define TC_BUS_MAX_KEYS 2

typedef struct tc_bus_keys {
  unsigned char key[TC_BUS_MAX_KEYS][TC_BUS_KEY_BYTES];
  int n; /* 0: no secret */
} tc_bus_keys_t;

/* Read the secret file 'path' into 'out' (see NOTES).  0, or -1 with 'err'
 * naming the file and what is wrong with it (missing, readable by others,
 * a bad line, no key, more than two).  'out' is wiped on failure. */
int tc_bus_keys_load(const char *path, tc_bus_keys_t *out, char *err, size_t errlen);
/* One or two keys from hex strings ('previous' may be NULL): for tests and
 * tools.  0 or -1. */
int tc_bus_keys_from_hex(tc_bus_keys_t *out, const char *current, const char *previous);
/* Wipe the key material. */
void tc_bus_keys_wipe(tc_bus_keys_t *k);

/* Seal the message that starts at 'start' in 'b' (written by a
 * tc_bus_write_* function, header and payload, nothing after): write
 * 'seq' and 'sent_ms' into its header and append the MAC with the current
 * key.  0, TXP_EINVALID_ARG (no key, no message there) or TXP_ENOMEM. */
int tc_bus_seal(txp_buf_t *b, size_t start, uint64_t seq, uint64_t sent_ms, const tc_bus_keys_t *k);
/* Whether the whole message 'buf' (header, payload, MAC) carries a MAC made
 * with one of the keys; constant time in the tag.  0 or TXP_EAUTH. */
int tc_bus_verify(const void *buf, size_t len, const tc_bus_keys_t *k);

/* ------------------------------------------------------ replay window */

#define TC_BUS_REPLAY_SLOTS 256

typedef struct tc_bus_replay_slot {
  uint16_t from;        /* 0: free */
  uint32_t incarnation;
  uint64_t max_seq;
  uint64_t last_ms;     /* our clock when it last accepted */
} tc_bus_replay_slot_t;

typedef struct tc_bus_replay {
  uint64_t window_ms;
  tc_bus_replay_slot_t slot[TC_BUS_REPLAY_SLOTS];
} tc_bus_replay_t;

typedef enum tc_bus_replay_verdict {
  TC_BUS_FRESH = 0,   /* accepted (and remembered) */
  TC_BUS_REPLAYED = 1, /* sequence not above what was seen */
  TC_BUS_STALE = 2,   /* stamp outside the window */
} tc_bus_replay_verdict_t;

void tc_bus_replay_init(tc_bus_replay_t *r, uint64_t window_ms);
/* Check (and on TC_BUS_FRESH remember) one authenticated message: its
 * sender, incarnation, sequence and stamp, against 'now_ms' (the wall
 * clock, ms since the epoch).  Slots unused for 2 x window are reused;
 * when all are in use the least recently used goes (only holders of the
 * secret can fill them). */
tc_bus_replay_verdict_t tc_bus_replay_check(tc_bus_replay_t *r, uint16_t from, uint32_t incarnation, uint64_t seq,
                                            uint64_t sent_ms, uint64_t now_ms);

/* Wall clock in ms since the epoch. */
uint64_t tc_bus_wall_ms(void);

#endif /* TC_BUS_AUTH_H */
