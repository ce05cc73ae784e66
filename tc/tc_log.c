/*
 * tc_log.c - see tc_log.h.
 */
#include "tc_log.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "txc_isotime.h"

int tc_log_level = TC_LOG_INFO;
static unsigned log_node;
static int log_json = 1;

static const char *const level_names[] = {"error", "warn", "info", "debug"};

int tc_log_level_parse(const char *name) {
  for (int i = 0; i < 4; i++)
    if (name && strcmp(name, level_names[i]) == 0) return i;
  return -1;
}

void tc_log_set_node(unsigned node_id) { log_node = node_id; }
void tc_log_set_json(int json) { log_json = json; }

/* Append 's' JSON-escaped to out[*n], never past cap-1. */
static void put_escaped(char *out, size_t cap, size_t *n, const char *s) {
  for (; *s && *n + 7 < cap; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') {
      out[(*n)++] = '\\';
      out[(*n)++] = (char)c;
    } else if (c < 0x20) {
      *n += (size_t)snprintf(out + *n, cap - *n, "\\u%04x", c);
    } else {
      out[(*n)++] = (char)c;
    }
  }
}

static void put_raw(char *out, size_t cap, size_t *n, const char *s) {
  if (*n + 1 >= cap) return;
  size_t l = strlen(s);
  if (*n + l >= cap) l = cap - *n - 1;
  memcpy(out + *n, s, l);
  *n += l;
}

void tc_log_write(int level, const tc_log_ctx_t *ctx, const char *fmt, ...) {
  char msg[2048], line[4096], ts[40], tmp[64];
  size_t n = 0;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);

  struct timeval tv;
  gettimeofday(&tv, NULL);
  txc_iso_time(ts, (int64_t)tv.tv_sec * 1000 + tv.tv_usec / 1000);
  if (level < 0) level = 0;
  if (level > 3) level = 3;

  if (log_json) {
    n = (size_t)snprintf(line, sizeof(line), "{\"ts\":\"%s\",\"level\":\"%s\",\"node\":%u,\"msg\":\"",
                         ts, level_names[level], log_node);
    put_escaped(line, sizeof(line), &n, msg);
    put_raw(line, sizeof(line), &n, "\"");
    if (ctx && ctx->xid) {
      put_raw(line, sizeof(line), &n, ",\"xid\":\"");
      put_escaped(line, sizeof(line), &n, ctx->xid);
      put_raw(line, sizeof(line), &n, "\"");
    }
    if (ctx && ctx->branch_id) {
      snprintf(tmp, sizeof(tmp), ",\"branch_id\":%" PRId64, ctx->branch_id);
      put_raw(line, sizeof(line), &n, tmp);
    }
    if (ctx && ctx->peer) {
      put_raw(line, sizeof(line), &n, ",\"peer\":\"");
      put_escaped(line, sizeof(line), &n, ctx->peer);
      put_raw(line, sizeof(line), &n, "\"");
    }
    put_raw(line, sizeof(line), &n, "}\n");
  } else {
    int w = snprintf(line, sizeof(line), "%s %-5s node=%u %s", ts, level_names[level], log_node,
                     msg);
    n = w < 0 ? 0 : (size_t)w;
    if (n >= sizeof(line)) n = sizeof(line) - 1;
    if (ctx && ctx->xid) {
      snprintf(tmp, sizeof(tmp), " xid=%.50s", ctx->xid);
      put_raw(line, sizeof(line), &n, tmp);
    }
    if (ctx && ctx->branch_id) {
      snprintf(tmp, sizeof(tmp), " branch_id=%" PRId64, ctx->branch_id);
      put_raw(line, sizeof(line), &n, tmp);
    }
    put_raw(line, sizeof(line), &n, "\n");
  }
  if (n >= sizeof(line)) n = sizeof(line) - 1;
  ssize_t w = write(STDERR_FILENO, line, n);
  (void)w;
}
