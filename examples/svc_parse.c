/*
 * svc_parse.c - strict parsing of numbers from text and JSON (svc_parse.h).
 */
#include "svc_parse.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

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

const char *svc_opt_value(int argc, char **argv, int *i, const char *name, bool *missing) {
  size_t n = strlen(name);
  const char *a = argv[*i];
  *missing = false;
  if (strncmp(a, name, n) != 0) return NULL;
  if (a[n] == '=') return a + n + 1;
  if (a[n] != '\0') return NULL;
  if (*i + 1 >= argc) {
    *missing = true;
    return NULL;
  }
  return argv[++*i];
}
