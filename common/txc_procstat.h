/*
 * txc_procstat.h - the standard process_* metrics of a Prometheus client
 * (CPU seconds, resident and virtual memory, open and most file
 * descriptors, start time, threads), read from /proc/self, for tcd's and
 * the services' /metrics pages: one reader rather than one per program.
 *
 * NOTES
 *   procfs reads do not wait on a device; they are still only done by a
 *   page's HTTP thread, never on an event loop.  Linux only (the target).
 */
#ifndef TXC_PROCSTAT_H
#define TXC_PROCSTAT_H

#include <stddef.h>

typedef struct txc_procstat {
  double cpu_seconds;       /* user + system */
  double resident_bytes, virtual_bytes;
  double open_fds, max_fds; /* max_fds: the soft limit, -1 if unlimited */
  double start_time_seconds; /* unix seconds */
  double threads;
} txc_procstat_t;

/* This process's figures: 0, or -1 if /proc/self could not be read. */
int txc_procstat_read(txc_procstat_t *out);

/* The families as Prometheus text (HELP, TYPE and the sample of each)
 * into 'out' ('cap' bytes): the length written, or -1 (unreadable /proc,
 * or 'cap' too small: 1024 bytes are enough). */
int txc_procstat_format(const txc_procstat_t *p, char *out, size_t cap);

#endif /* TXC_PROCSTAT_H */
