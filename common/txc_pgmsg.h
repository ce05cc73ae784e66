/*
 * txc_pgmsg.h - the one rule for quoting a libpq message in a log line or
 * an error string: libpq ends its messages with a newline (and sometimes
 * a space), which a one-line log entry must not carry.  Header only: tc,
 * librmclient and the demo services each include it, none links the
 * others.
 */
#ifndef TXC_PGMSG_H
#define TXC_PGMSG_H

#include <string.h>

/* Length of libpq message 'm' without its trailing newlines, carriage
 * returns and spaces (0 for NULL). */
static inline size_t txc_pgmsg_len(const char *m) {
  size_t n = m ? strlen(m) : 0;
  while (n > 0 && (m[n - 1] == '\n' || m[n - 1] == '\r' || m[n - 1] == ' ')) n--;
  return n;
}

#endif /* TXC_PGMSG_H */
