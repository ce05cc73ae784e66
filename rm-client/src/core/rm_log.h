/*
 * rm_log.h - the one logger of librmclient: lines go to the caller's
 * callback (rm_log_cb), filtered by level, one at a time (the mutex
 * serialises lines from the loop thread, caller threads and workers, so
 * the callback need not be thread-safe).  The library never prints.  A
 * leaf.  Not installed.
 */
#ifndef RM_LOG_H
#define RM_LOG_H

#include <pthread.h>
#include <stdarg.h>

#include "rm_client.h"

typedef struct rm_logger {
  rm_log_cb cb; /* NULL: logging off */
  void *arg;
  int level;    /* pass lines with level <= this */
  pthread_mutex_t mu;
} rm_logger_t;

/* 0, or RM_E_NOMEM. */
int rm__logger_init(rm_logger_t *l, rm_log_cb cb, void *arg, int level);
void rm__logger_destroy(rm_logger_t *l);
void rm__logger_vwrite(rm_logger_t *l, int level, const char *fmt, va_list ap)
  __attribute__((format(printf, 3, 0)));
void rm__logger_write(rm_logger_t *l, int level, const char *fmt, ...)
  __attribute__((format(printf, 3, 4)));

/* Test the level before evaluating any argument. */
#define RM_LOGGER(l, lvl, ...)                                  \
  do {                                                          \
    if (!(l)->cb || (lvl) > (l)->level) break;                  \
    rm__logger_write((l), (lvl), __VA_ARGS__);                  \
  } while (0)

#endif /* RM_LOG_H */
