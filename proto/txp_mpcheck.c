/*
 * txp_mpcheck.c - see txp_mpcheck.h.  An iterative walk: a small stack of
 * "entries still to read" per open container, bounded by max_depth.
 */
#include "txp_mpcheck.h"

#include "txp_errno.h"

#define MPCHECK_MAX_DEPTH 32

static uint64_t be(const unsigned char *p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; i++) v = (v << 8) | p[i];
  return v;
}

int txp_mpcheck(const unsigned char *buf, size_t len, uint32_t max_count, uint32_t max_depth,
                uint32_t max_string) {
  uint64_t pending[MPCHECK_MAX_DEPTH + 1];
  unsigned depth = 0;
  size_t pos = 0;

  if (max_depth > MPCHECK_MAX_DEPTH) max_depth = MPCHECK_MAX_DEPTH;
  pending[0] = 1; /* exactly one top-level object */

  while (depth > 0 || pending[0] > 0) {
    if (pending[depth] == 0) { /* container finished */
      depth--;
      continue;
    }
    pending[depth]--;
    if (pos >= len) return TXP_EMALFORMED;

    unsigned char b = buf[pos++];
    size_t left = len - pos;
    uint64_t skip = 0;      /* payload bytes after the header */
    uint64_t children = 0;  /* objects inside, if a container */
    int hdr = 0;            /* size of the length field */
    int is_container = 0;
    int is_blob = 0;

    if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3) {
      /* fixint, nil, bool: no payload */
    } else if (b >= 0x80 && b <= 0x8f) {
      children = (uint64_t)(b & 0x0f) * 2, is_container = 1;
    } else if (b >= 0x90 && b <= 0x9f) {
      children = b & 0x0f, is_container = 1;
    } else if (b >= 0xa0 && b <= 0xbf) {
      skip = b & 0x1f, is_blob = 1;
    } else {
      switch (b) {
      case 0xcc: case 0xd0: skip = 1; break;
      case 0xcd: case 0xd1: skip = 2; break;
      case 0xca: case 0xce: case 0xd2: skip = 4; break;
      case 0xcb: case 0xcf: case 0xd3: skip = 8; break;
      case 0xd4: skip = 2; break; /* fixext: type byte + data */
      case 0xd5: skip = 3; break;
      case 0xd6: skip = 5; break;
      case 0xd7: skip = 9; break;
      case 0xd8: skip = 17; break;
      case 0xc4: case 0xd9: hdr = 1, is_blob = 1; break;
      case 0xc5: case 0xda: hdr = 2, is_blob = 1; break;
      case 0xc6: case 0xdb: hdr = 4, is_blob = 1; break;
      case 0xc7: hdr = 1, is_blob = 2; break; /* ext: + type byte */
      case 0xc8: hdr = 2, is_blob = 2; break;
      case 0xc9: hdr = 4, is_blob = 2; break;
      case 0xdc: hdr = 2, is_container = 1; break;
      case 0xdd: hdr = 4, is_container = 1; break;
      case 0xde: hdr = 2, is_container = 2; break;
      case 0xdf: hdr = 4, is_container = 2; break;
      default: return TXP_EMALFORMED; /* 0xc1: never used */
      }
      if (hdr) {
        if (left < (size_t)hdr) return TXP_EMALFORMED;
        uint64_t n = be(buf + pos, hdr);
        pos += hdr, left -= hdr;
        if (is_blob) {
          if (n > max_string) return TXP_ELIMIT;
          skip = n + (is_blob == 2 ? 1 : 0);
        } else
          children = is_container == 2 ? n * 2 : n;
      }
    }

    if (is_blob && !hdr && skip > max_string) return TXP_ELIMIT; /* fixstr */
    if (skip > left) return TXP_EMALFORMED;
    pos += skip;

    if (is_container) {
      uint64_t entries = (b >= 0x80 && b <= 0x8f) || b == 0xde || b == 0xdf ? children / 2 : children;
      if (entries > max_count) return TXP_ELIMIT;
      if (children > len - pos) return TXP_EMALFORMED; /* each needs >= 1 byte */
      /* An empty container takes a level too: msgpack-c's unpacker checks
       * its fixed stack (32 levels) before it looks at the count, so an
       * empty array inside 32 others is an error there, and must be here. */
      if (depth + 1 > max_depth) return TXP_ELIMIT;
      if (children > 0) pending[++depth] = children;
    }
  }
  return pos == len ? 0 : TXP_EMALFORMED;
}
