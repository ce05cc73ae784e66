/*
 * txp_xid.c - the global transaction id's format (txp_xid.h).
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "txp_xid.h"

int txp_xid_make(char *out, size_t cap, const char *node, int64_t id) {
  size_t n = node ? strlen(node) : 0;
  if (!out || n == 0 || n > TXP_XID_NODE_MAX || id < 0) return -1;
  int w = snprintf(out, cap, "%s:%" PRId64, node, id);
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

int txp_xid_parse(const char *xid, char *node, size_t cap, int64_t *id) {
  if (!xid || !node || cap == 0) return -1;
  const char *last = strrchr(xid, ':');
  if (!last || last == xid) return -1;
  size_t n = (size_t)(last - xid), idlen = strlen(last + 1);
  if (n > TXP_XID_NODE_MAX || n >= cap || idlen > 19 || !digits(last + 1, idlen)) return -1;
  /* NODE itself ends in ":port". */
  const char *port = memrchr(xid, ':', n);
  if (!port || port == xid || !digits(port + 1, (size_t)(last - port - 1))) return -1;
  int64_t v = 0;
  for (size_t i = 0; i < idlen; i++) {
    int d = last[1 + i] - '0';
    if (v > (INT64_MAX - d) / 10) return -1;
    v = v * 10 + d;
  }
  memcpy(node, xid, n);
  node[n] = '\0';
  if (id) *id = v;
  return 0;
}
