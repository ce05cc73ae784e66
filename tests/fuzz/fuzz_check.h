/*
 * fuzz_check.h - what the libFuzzer targets here share: the entry point's
 * prototype, CHECK (a property every input must keep: abort(), which
 * libFuzzer reports as a crash, with the file, line and condition on
 * stderr), and the input as a C string for the targets that parse text.
 * Header only: each target is one source file.
 */
#ifndef FUZZ_CHECK_H
#define FUZZ_CHECK_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond)                                                              \
  do {                                                                           \
    if (!(cond)) {                                                               \
      fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      abort();                                                                   \
    }                                                                            \
  } while (0)

/* The input's bytes and a NUL after them (malloc'd: free it), or NULL
 * when there are more than 'max' of them or memory ran out. */
static inline char *fuzz_cstr(const uint8_t *data, size_t size, size_t max) {
  if (size > max) return NULL;
  char *s = malloc(size + 1);
  if (!s) return NULL;
  memcpy(s, data, size);
  s[size] = '\0';
  return s;
}

#endif /* FUZZ_CHECK_H */
