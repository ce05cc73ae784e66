/*
 * txc_fnv.h - FNV-1a, 64 bits: the one hash of strings and bytes that the
 * project's own hash tables use (tcd's held begins, the prepared-statement
 * cache, librmclient's SQL cache).  Fast and well spread for short keys;
 * not for anything an attacker could aim at a table whose chains cost
 * them nothing to lengthen (those tables are bounded).  Header only.
 */
#ifndef TXC_FNV_H
#define TXC_FNV_H

#include <stddef.h>
#include <stdint.h>

#define TXC_FNV_OFFSET 14695981039346656037ull

/* 'h' (TXC_FNV_OFFSET to start) extended by 'len' bytes at 'p'. */
static inline uint64_t txc_fnv1a(uint64_t h, const void *p, size_t len) {
  const unsigned char *b = p;
  for (size_t i = 0; i < len; i++) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

/* The same over the NUL-terminated string 's'. */
static inline uint64_t txc_fnv1a_str(uint64_t h, const char *s) {
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) h = (h ^ *p) * 1099511628211ull;
  return h;
}

#endif /* TXC_FNV_H */
