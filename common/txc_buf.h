/*
 * txc_buf.h - the one growing text buffer of the services and the console:
 * metrics pages written with txc_buf_printf, request and answer bodies
 * collected with txc_buf_add (libcurl's write callback, txc_buf_curl_write,
 * included).
 *
 * NOTES
 *   A buffer starts zeroed ({0}, or with 'max' set) and its text is always
 *   NUL-terminated once anything was added; the owner frees 'p'.  Growth
 *   doubles.  Out of memory, or beyond 'max', the text stops growing: what
 *   it holds stays valid, the append is not made.  No locking: one thread
 *   at a time.
 */
#ifndef TXC_BUF_H
#define TXC_BUF_H

#include <stdbool.h>
#include <stddef.h>

typedef struct txc_buf {
  char *p;         /* the text, NUL-terminated; NULL until something is added */
  size_t len, cap; /* bytes of text; bytes allocated */
  size_t max;      /* the most text it takes (0: no limit) */
  bool over;       /* an append was refused for 'max' */
} txc_buf_t;

/* Append 'n' bytes of 'data'.  false when they would take the text beyond
 * 'max' (b->over set) or memory ran out: nothing is appended. */
bool txc_buf_add(txc_buf_t *b, const void *data, size_t n);
/* Empty the text (and 'over'), keeping its memory and 'max'. */
void txc_buf_clear(txc_buf_t *b);
/* Append the formatted text; out of memory, nothing. */
void txc_buf_printf(txc_buf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A libcurl write callback (CURLOPT_WRITEFUNCTION) into the txc_buf_t of
 * CURLOPT_WRITEDATA: a body beyond its 'max', or out of memory, stops the
 * transfer (CURLE_WRITE_ERROR). */
size_t txc_buf_curl_write(char *data, size_t size, size_t nmemb, void *buf);

#endif /* TXC_BUF_H */
