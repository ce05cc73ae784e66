/*
 * txp_xid.c - the global transaction id's format (txp_xid.h).
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "txp_xid.h"

int txp_xid_make(char *out, size_t cap, const char *node, int64_t id, uint64_t nonce) {
  size_t n = node ? strlen(node) : 0;
  if (!out || n == 0 || n > TXP_XID_NODE_MAX || id < 0) return -1;
  int w = snprintf(out, cap, "%s:%" PRId64 ":%016" PRIx64, node, id, nonce);
  if (w < 0 || (size_t)w >= cap || w > (int)TXP_MAX_XID_LEN) {
    if (cap) out[0] = '\0';
    return -1;
  }
  return w;
}

static int digits(const char *s, size_t n) {
  if (n == 0) return 0;
  for (size_t i = 0; i < n; i++)
    if (s[i] < '0' || s[i] > '9') return 0;
  return 1;
}

/* Lowercase only: an xid has one spelling, so that the store's lookup of
 * it (a plain string comparison) cannot be dodged by changing case. */
static int hex_value(char ch) {
  if (ch >= '0' && ch <= '9') return ch - '0';
  if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
  return -1;
}

int txp_xid_parse(const char *xid, char *node, size_t cap, int64_t *id, uint64_t *nonce) {
  if (!xid || !node || cap == 0) return -1;
  size_t len = strlen(xid);
  if (len < TXP_XID_NONCE_LEN + 1 || len > TXP_MAX_XID_LEN) return -1;
  const char *hex = xid + len - TXP_XID_NONCE_LEN;
  if (hex[-1] != ':') return -1;
  uint64_t r = 0;
  for (size_t i = 0; i < TXP_XID_NONCE_LEN; i++) {
    int v = hex_value(hex[i]);
    if (v < 0) return -1;
    r = r << 4 | (uint64_t)v;
  }
  /* ID: between the ':' before it and the one before the nonce. */
  const char *id_end = hex - 1;
  const char *id_colon = id_end > xid ? memrchr(xid, ':', (size_t)(id_end - xid)) : NULL;
  if (!id_colon || id_colon == xid) return -1;
  size_t n = (size_t)(id_colon - xid), idlen = (size_t)(id_end - id_colon - 1);
  if (n > TXP_XID_NODE_MAX || n >= cap || idlen > 19 || !digits(id_colon + 1, idlen)) return -1;
  /* NODE itself ends in ":port". */
  const char *port = memrchr(xid, ':', n);
  if (!port || port == xid || !digits(port + 1, (size_t)(id_colon - port - 1))) return -1;
  int64_t v = 0;
  for (size_t i = 0; i < idlen; i++) {
    int d = id_colon[1 + i] - '0';
    if (v > (INT64_MAX - d) / 10) return -1;
    v = v * 10 + d;
  }
  memcpy(node, xid, n);
  node[n] = '\0';
  if (id) *id = v;
  if (nonce) *nonce = r;
  return 0;
}
