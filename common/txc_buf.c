/*
 * txc_buf.c - the growing text buffer (txc_buf.h).
 */
#include "txc_buf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Room for 'need' bytes of text and its NUL. */
static bool reserve(txc_buf_t *b, size_t need) {
  if (need + 1 <= b->cap) return true;
  size_t cap = b->cap ? b->cap * 2 : 512;
  while (cap < need + 1) cap *= 2;
  char *np = realloc(b->p, cap);
  if (!np) return false;
  if (!b->p) np[0] = '\0';
  b->p = np;
  b->cap = cap;
  return true;
}

bool txc_buf_add(txc_buf_t *b, const void *data, size_t n) {
  if (b->max && b->len + n > b->max) {
    b->over = true;
    return false;
  }
  if (!reserve(b, b->len + n)) return false;
  memcpy(b->p + b->len, data, n);
  b->len += n;
  b->p[b->len] = '\0';
  return true;
}

void txc_buf_clear(txc_buf_t *b) {
  b->len = 0;
  b->over = false;
  if (b->p) b->p[0] = '\0';
}

void txc_buf_printf(txc_buf_t *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = b->p ? vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap) : vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  if (b->p && b->len + (size_t)n < b->cap) {
    b->len += (size_t)n;
    return;
  }
  /* It did not fit: grow, then write it whole. */
  if (!reserve(b, b->len + (size_t)n)) {
    if (b->p) b->p[b->len] = '\0';
    return;
  }
  va_start(ap, fmt);
  vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
  va_end(ap);
  b->len += (size_t)n;
}

size_t txc_buf_curl_write(char *data, size_t size, size_t nmemb, void *buf) {
  size_t n = size * nmemb;
  return txc_buf_add(buf, data, n) ? n : 0;
}
