/*
 * svc_parse.c - strict parsing of numbers from text and JSON (svc_parse.h).
 */
#include "svc_parse.h"

#include <errno.h>
#include <stdlib.h>

bool svc_parse_ll(const char *s, long long min, long long max, long long *out) {
  if (!s || !*s) return false;
  errno = 0;
  char *end = NULL;
  long long v = strtoll(s, &end, 10);
  if (errno || !end || *end || v < min || v > max) return false;
  *out = v;
  return true;
}

bool svc_json_int(const json_t *o, const char *key, long long min, long long max, long long *out) {
  json_t *v = json_object_get(o, key);
  if (!json_is_integer(v)) return false;
  long long x = (long long)json_integer_value(v);
  if (x < min || x > max) return false;
  *out = x;
  return true;
}
