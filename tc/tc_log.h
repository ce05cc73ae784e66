/*
 * tc_log.h - structured logs for tcd: one JSON object per line on stderr.
 *
 * NOTES
 *   {"ts":"2026-11-30T08:42:01.123Z","level":"warn","node":1,
 *    "msg":"could not ...","xid":"...","branch_id":12}
 *   The level is checked before any argument is formatted (TC_LOG macro), so
 *   a debug line costs a compare when debug is off.  Messages follow
 *   PostgreSQL's wording: lowercase, no final period, "could not X: reason",
 *   plus what the operator can do.  Thread-safe: one write(2) per line.
 */
#ifndef TC_LOG_H
#define TC_LOG_H

#include <stdint.h>

typedef enum { TC_LOG_ERROR = 0, TC_LOG_WARN = 1, TC_LOG_INFO = 2, TC_LOG_DEBUG = 3 } tc_log_level_t;

/* Context fields appended to a line; any may be NULL/0. */
typedef struct tc_log_ctx {
  const char *xid;
  int64_t branch_id;
  const char *peer;
} tc_log_ctx_t;

extern int tc_log_level;

/* Parse "error"/"warn"/"info"/"debug"; -1 if unknown. */
int tc_log_level_parse(const char *name);
void tc_log_set_node(unsigned node_id);
/* Log as logfmt-free JSON (default) or plain text for terminals. */
void tc_log_set_json(int json);

void tc_log_write(int level, const tc_log_ctx_t *ctx, const char *fmt, ...)
  __attribute__((format(printf, 3, 4)));

#define TC_LOG(level, ctx, ...)                  \
  do {                                           \
    if ((level) > tc_log_level) break;           \
    tc_log_write((level), (ctx), __VA_ARGS__);   \
  } while (0)

#define tc_log_error(...) TC_LOG(TC_LOG_ERROR, NULL, __VA_ARGS__)
#define tc_log_warn(...) TC_LOG(TC_LOG_WARN, NULL, __VA_ARGS__)
#define tc_log_info(...) TC_LOG(TC_LOG_INFO, NULL, __VA_ARGS__)
#define tc_log_debug(...) TC_LOG(TC_LOG_DEBUG, NULL, __VA_ARGS__)

#endif /* TC_LOG_H */
