/*
 * txp_lockkey.c - see txp_lockkey.h.
 */
#include "txp_lockkey.h"

#include <stdio.h>
#include <string.h>

int txp_lockkey_part_ok(const char *v, size_t n) {
  if (n == 0) return 0;
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)v[i];
    if (c < 0x20 || c == 0x7f || c == ':' || c == ',' || c == ';' || c == '^') return 0;
  }
  return 1;
}

/* One pass over 's'; with cb == NULL it only validates and counts. */
static int walk(const char *s, size_t max_keys, int (*cb)(const txp_lockkey_t *, void *),
                void *arg) {
  if (!s || !*s) return TXP_EBAD_REQUEST;
  size_t count = 0;
  const char *p = s;
  while (*p) {
    const char *colon = strchr(p, ':');
    const char *semi = strchr(p, ';');
    if (!colon || (semi && semi < colon)) return TXP_EBAD_REQUEST;
    txp_lockkey_t k = {p, (size_t)(colon - p), NULL, 0};
    if (!txp_lockkey_part_ok(k.table, k.table_len)) return TXP_EBAD_REQUEST;
    const char *q = colon + 1;
    const char *end = semi ? semi : p + strlen(p);
    for (;;) {
      const char *comma = memchr(q, ',', (size_t)(end - q));
      const char *stop = comma ? comma : end;
      k.pk = q;
      k.pk_len = (size_t)(stop - q);
      if (!txp_lockkey_part_ok(k.pk, k.pk_len)) return TXP_EBAD_REQUEST;
      if (++count > max_keys) return TXP_ELIMIT;
      if (cb) {
        int rc = cb(&k, arg);
        if (rc != 0) return rc;
      }
      if (!comma) break;
      q = comma + 1;
    }
    if (!semi) break;
    p = semi + 1;
    if (!*p) return TXP_EBAD_REQUEST; /* trailing ';' */
  }
  return (int)count;
}

int txp_lockkeys_count(const char *s, size_t max_keys) { return walk(s, max_keys, NULL, NULL); }

int txp_lockkeys_each(const char *s, size_t max_keys, int (*cb)(const txp_lockkey_t *, void *),
                      void *arg) {
  int n = walk(s, max_keys, NULL, NULL);
  if (n < 0 || !cb) return n;
  int rc = walk(s, max_keys, cb, arg);
  return rc < 0 || rc > 0 ? rc : n;
}

int txp_lockkeys_append(txp_buf_t *b, const char *table, const char *pk) {
  if (!table || !pk) return TXP_EINVALID_ARG;
  size_t tl = strlen(table), pl = strlen(pk);
  if (!txp_lockkey_part_ok(table, tl) || !txp_lockkey_part_ok(pk, pl)) return TXP_EBAD_REQUEST;
  size_t old = b->len;
  int rc = 0;
  if (b->len) rc = txp_buf_append(b, ";", 1);
  if (!rc) rc = txp_buf_append(b, table, tl);
  if (!rc) rc = txp_buf_append(b, ":", 1);
  if (!rc) rc = txp_buf_append(b, pk, pl);
  if (rc) { /* all or nothing, and still a C string */
    b->len = old;
    if (b->data) b->data[old] = '\0';
  }
  return rc;
}

int txp_row_key(const char *resource, const txp_lockkey_t *k, char *out, size_t cap) {
  size_t rl = strlen(resource);
  size_t sl = sizeof(TXP_ROW_KEY_SEP) - 1;
  size_t n = rl + sl + k->table_len + sl + k->pk_len;
  if (n > TXP_MAX_ROW_KEY_LEN || n + 1 > cap) return TXP_EFIELD_TOO_LONG;
  char *w = out;
  memcpy(w, resource, rl), w += rl;
  memcpy(w, TXP_ROW_KEY_SEP, sl), w += sl;
  memcpy(w, k->table, k->table_len), w += k->table_len;
  memcpy(w, TXP_ROW_KEY_SEP, sl), w += sl;
  memcpy(w, k->pk, k->pk_len), w += k->pk_len;
  *w = '\0';
  return (int)n;
}
