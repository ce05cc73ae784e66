/*
 * txc_keyfile.h - a file of MAC keys, the format the services' key
 * (examples/svc_auth.h) and the cluster secret (cluster/tc_bus_auth.h)
 * share: one key per line, 64 hex digits (32 bytes), '#' comments and
 * blank lines ignored, at most 'max' keys (the first signs, every one
 * verifies: a rotation adds the new key as a second line first).  The
 * file must be its owner's only (txc_private_fopen).  A library of its own
 * (txkeyfile, libsodium): only what signs links it.
 */
#ifndef TXC_KEYFILE_H
#define TXC_KEYFILE_H

#include <stddef.h>

#define TXC_KEY_BYTES 32

/* The keys of 'path' into keys[0..max-1]; 'what' names the file in
 * messages ("service key file").  Returns how many (1..max), or -1 with
 * the reason in 'err' (nothing left in 'keys'). */
int txc_keyfile_load(const char *path, const char *what, unsigned char (*keys)[TXC_KEY_BYTES], int max, char *err,
                     size_t errlen);

/* 'hex' (length 'n') as one key: 0, or -1 when it is not 64 hex digits. */
int txc_key_from_hex(const char *hex, size_t n, unsigned char key[TXC_KEY_BYTES]);

#endif /* TXC_KEYFILE_H */
