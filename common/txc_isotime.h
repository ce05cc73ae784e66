/*
 * txc_isotime.h - the one ISO 8601 formatter: "2026-12-02T04:25:44.569Z"
 * (UTC, milliseconds), for tcd's and the services' log lines and for the
 * timestamps the services hand PostgreSQL; and the wall clock they read.
 */
#ifndef TXC_ISOTIME_H
#define TXC_ISOTIME_H

#include <stdint.h>

#define TXC_ISO_TIME_MAX 32

/* Unix time 'unix_ms' (negative too) as above, into 'out'. */
void txc_iso_time(char out[TXC_ISO_TIME_MAX], int64_t unix_ms);
/* The wall clock (CLOCK_REALTIME) now, in Unix milliseconds. */
int64_t txc_unix_ms(void);

#endif /* TXC_ISOTIME_H */
