/*
 * console_log.c - one JSON line per event on stderr (console_log.h).
 */
#include "console_log.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "txc_isotime.h"

void console_log(const char *level, const char *fmt, ...) {
  char msg[1024], ts[TXC_ISO_TIME_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  txc_iso_time(ts, txc_unix_ms());
  json_t *o = json_pack("{s:s, s:s, s:s, s:s}", "ts", ts, "level", level, "component", "console", "msg", msg);
  char *line = o ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
  if (line) fprintf(stderr, "%s\n", line);
  free(line);
  json_decref(o);
}
