/*
 * svc_parse.h - strict parsing of numbers from text and JSON (settings,
 * HTTP bodies and stream entries all go through these two) and of the
 * tools' command-line options (pure; no dependency beyond jansson, so the
 * fuzz targets and txc-events link it alone).
 */
#ifndef SVC_PARSE_H
#define SVC_PARSE_H

#include <stdbool.h>

#include <jansson.h>

/* Parse 's' entirely as a decimal integer in [min, max]. */
bool svc_parse_ll(const char *s, long long min, long long max, long long *out);

/* 'o[key]' as an integer in [min, max]; false if missing or not one. */
bool svc_json_int(const json_t *o, const char *key, long long min, long long max, long long *out);

/* "--name VALUE" or "--name=VALUE" at argv[*i]: the value (advancing *i
 * past it), or NULL when argv[*i] is not this option; '*missing' when it
 * is, without a value. */
const char *svc_opt_value(int argc, char **argv, int *i, const char *name, bool *missing);

#endif /* SVC_PARSE_H */
