/*
 * scenario.c - see scenario.h.
 */
#include "scenario.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <time.h>

int scenario_failures;

void check(bool ok, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  printf("%s - ", ok ? "ok  " : "FAIL");
  vprintf(fmt, ap);
  printf("\n");
  fflush(stdout);
  va_end(ap);
  if (!ok) scenario_failures++;
}

void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}
