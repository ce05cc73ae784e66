/*
 * txc_isotime.c - see txc_isotime.h.
 */
#include "txc_isotime.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

void txc_iso_time(char out[TXC_ISO_TIME_MAX], int64_t unix_ms) {
  int64_t secs = unix_ms >= 0 ? unix_ms / 1000 : (unix_ms - 999) / 1000;
  time_t t = (time_t)secs;
  struct tm tm;
  gmtime_r(&t, &tm);
  char tmp[96]; /* room for any int the compiler can imagine in the fields */
  snprintf(tmp, sizeof(tmp), "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
           tm.tm_hour, tm.tm_min, tm.tm_sec, (int)(unix_ms - secs * 1000));
  size_t n = strnlen(tmp, TXC_ISO_TIME_MAX - 1);
  memcpy(out, tmp, n);
  out[n] = '\0';
}

int64_t txc_unix_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}
