/*
 * svc_auth.c - signing and verifying with the services' shared key
 * (svc_auth.h).
 */
#include "svc_auth.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "txc_keyfile.h"

#define MAX_KEYS 2

struct svc_auth {
  unsigned char key[MAX_KEYS][crypto_auth_KEYBYTES];
  int nkeys;
};

svc_auth_t *svc_auth_load(const char *path, char *err, size_t errlen) {
  if (sodium_init() < 0) {
    snprintf(err, errlen, "could not initialise libsodium");
    return NULL;
  }
  svc_auth_t *a = sodium_malloc(sizeof(*a));
  if (!a) {
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  a->nkeys = txc_keyfile_load(path, "service key file", a->key, MAX_KEYS, err, errlen);
  if (a->nkeys < 0) {
    sodium_free(a);
    return NULL;
  }
  return a;
}

svc_auth_t *svc_auth_from_env(char *err, size_t errlen) {
  err[0] = '\0';
  const char *path = getenv("TXC_SERVICE_KEY_FILE");
  if (!path || !*path) return NULL;
  return svc_auth_load(path, err, errlen);
}

void svc_auth_free(svc_auth_t *a) {
  if (a) sodium_free(a);
}

static void mac_parts(const unsigned char *key, const char *const *parts, const size_t *lens, size_t n,
                      unsigned char out[crypto_auth_BYTES]) {
  crypto_auth_hmacsha512256_state st;
  crypto_auth_hmacsha512256_init(&st, key, crypto_auth_KEYBYTES);
  for (size_t i = 0; i < n; i++) {
    unsigned char len[8];
    uint64_t l = lens[i];
    for (int b = 0; b < 8; b++) len[b] = (unsigned char)(l >> (8 * b));
    crypto_auth_hmacsha512256_update(&st, len, sizeof(len));
    if (l) crypto_auth_hmacsha512256_update(&st, (const unsigned char *)parts[i], l);
  }
  crypto_auth_hmacsha512256_final(&st, out);
}

void svc_auth_sign(const svc_auth_t *a, const char *const *parts, const size_t *lens, size_t n,
                   char out[SVC_AUTH_HEX_MAX]) {
  unsigned char mac[crypto_auth_BYTES];
  mac_parts(a->key[0], parts, lens, n, mac);
  sodium_bin2hex(out, SVC_AUTH_HEX_MAX, mac, sizeof(mac));
}

bool svc_auth_verify(const svc_auth_t *a, const char *const *parts, const size_t *lens, size_t n, const char *hex) {
  unsigned char given[crypto_auth_BYTES];
  size_t bin = 0;
  if (!hex || strlen(hex) != 2 * crypto_auth_BYTES ||
      sodium_hex2bin(given, sizeof(given), hex, strlen(hex), NULL, &bin, NULL) != 0 || bin != sizeof(given))
    return false;
  bool ok = false;
  for (int k = 0; k < a->nkeys; k++) {
    unsigned char mac[crypto_auth_BYTES];
    mac_parts(a->key[k], parts, lens, n, mac);
    ok |= sodium_memcmp(mac, given, sizeof(mac)) == 0;
  }
  return ok;
}
