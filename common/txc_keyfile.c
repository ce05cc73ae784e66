/*
 * txc_keyfile.c - see txc_keyfile.h.
 */
#include "txc_keyfile.h"

#include <sodium.h>
#include <stdio.h>
#include <string.h>

#include "txc_secret.h"

int txc_key_from_hex(const char *hex, size_t n, unsigned char key[TXC_KEY_BYTES]) {
  size_t bin = 0;
  if (n != 2 * TXC_KEY_BYTES) return -1;
  if (sodium_hex2bin(key, TXC_KEY_BYTES, hex, n, NULL, &bin, NULL) != 0 || bin != TXC_KEY_BYTES) return -1;
  return 0;
}

int txc_keyfile_load(const char *path, const char *what, unsigned char (*keys)[TXC_KEY_BYTES], int max, char *err,
                     size_t errlen) {
  if (sodium_init() < 0) {
    snprintf(err, errlen, "could not initialise libsodium");
    return -1;
  }
  FILE *f = txc_private_fopen(path, what, err, errlen);
  if (!f) return -1;
  char line[256];
  int lineno = 0, n = 0, rc = 0;
  while (rc == 0 && fgets(line, sizeof(line), f)) {
    lineno++;
    size_t len = strcspn(line, "\r\n");
    line[len] = '\0';
    while (len > 0 && (line[len - 1] == ' ' || line[len - 1] == '\t')) line[--len] = '\0';
    if (len == 0 || line[0] == '#') continue;
    if (n == max) {
      snprintf(err, errlen, "the %s \"%s\" has more than %d keys (line %d)", what, path, max, lineno);
      rc = -1;
    } else if (txc_key_from_hex(line, len, keys[n]) != 0) {
      snprintf(err, errlen, "line %d of the %s \"%s\" is not a key of %d hex digits", lineno, what, path,
               2 * TXC_KEY_BYTES);
      rc = -1;
    } else {
      n++;
    }
  }
  sodium_memzero(line, sizeof(line));
  fclose(f);
  if (rc == 0 && n == 0) {
    snprintf(err, errlen, "the %s \"%s\" holds no key", what, path);
    rc = -1;
  }
  if (rc != 0) {
    sodium_memzero(keys, (size_t)max * TXC_KEY_BYTES);
    return -1;
  }
  return n;
}
