/*
 * test_file.h - a file of the test's making: 'text' in 'path', with the
 * permission bits 'mode' (a secret or credentials file that the code under
 * test must accept or refuse for its mode).  Header only; true, or false
 * with errno set.
 */
#ifndef TEST_FILE_H
#define TEST_FILE_H

#include <stdbool.h>
#include <stdio.h>
#include <sys/stat.h>

static inline bool test_write_file(const char *path, const char *text, mode_t mode) {
  FILE *f = fopen(path, "w");
  if (!f) return false;
  bool ok = fputs(text, f) >= 0;
  ok = fclose(f) == 0 && ok;
  return ok && chmod(path, mode) == 0;
}

#endif /* TEST_FILE_H */
