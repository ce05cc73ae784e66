/*
 * rm_log.c - the one logger of librmclient (rm_log.h).
 */
#include <stdio.h>

#include "rm_log.h"

/* Longest line handed to the callback (longer ones are cut). */
#define LOG_LINE_MAX 1024

int rm__logger_init(rm_logger_t *l, rm_log_cb cb, void *arg, int level) {
  l->cb = cb;
  l->arg = arg;
  l->level = level;
  return pthread_mutex_init(&l->mu, NULL) == 0 ? 0 : RM_E_NOMEM;
}

void rm__logger_destroy(rm_logger_t *l) { pthread_mutex_destroy(&l->mu); }

void rm__logger_vwrite(rm_logger_t *l, int level, const char *fmt, va_list ap) {
  char line[LOG_LINE_MAX];
  if (!l->cb || level > l->level) return;
  vsnprintf(line, sizeof(line), fmt, ap);
  pthread_mutex_lock(&l->mu);
  l->cb(level, line, l->arg);
  pthread_mutex_unlock(&l->mu);
}

void rm__logger_write(rm_logger_t *l, int level, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  rm__logger_vwrite(l, level, fmt, ap);
  va_end(ap);
}

/* The stock logger a program may pass (rm_client.h): the library never
 * calls it on its own. */
void rm_log_stderr(int level, const char *msg, void *arg) {
  static const char *const names[] = {"?", "error", "warning", "info", "debug"};
  const char *prefix = arg;
  const char *name = level >= RM_LOG_ERROR && level <= RM_LOG_DEBUG ? names[level] : names[0];
  fprintf(stderr, "%s%srmclient %s: %s\n", prefix ? prefix : "", prefix ? ": " : "", name, msg ? msg : "");
}
