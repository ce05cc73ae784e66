/*
 * svc_auth.h - the demo services' shared secret: order-service signs its
 * calls to stock-service and the order events it publishes; stock-service
 * and the consumers refuse what does not verify (security review,
 * finding 2; issue 20).
 *
 * NOTES
 *   The key: TXC_SERVICE_KEY_FILE names a file (mode 0600: a file group or
 *   others may read is refused) holding one key per line, 64 hex digits
 *   (32 bytes); cluster/local/up writes one.  The first line signs; every
 *   line verifies, so a key is rotated without downtime: add the new key
 *   as a second line everywhere, then swap the lines everywhere, then drop
 *   the old one.  Never on the command line.  Without TXC_SERVICE_KEY_FILE
 *   the services run unauthenticated and say so at start.
 *
 *   The MAC: libsodium's crypto_auth (HMAC-SHA-512 truncated to 256 bits)
 *   over the parts of the message, each preceded by its length (8 bytes,
 *   little-endian), so that no two different part lists sign alike.  An
 *   HTTP call signs method, path, its X-Txc-Xid, its X-Txc-Local and the
 *   body: the freeze is bound to its order, xid, quantity and deadline.  A
 *   replayed call does what it did (every stock operation is idempotent by
 *   order); an order event signs event_id, type, order_id and payload.
 */
#ifndef SVC_AUTH_H
#define SVC_AUTH_H

#include <stdbool.h>
#include <stddef.h>

#define SVC_AUTH_HEADER "X-Txc-Signature"
#define SVC_AUTH_HEX_MAX 65 /* 64 hex digits and a NUL */

typedef struct svc_auth svc_auth_t;

/* The keys of TXC_SERVICE_KEY_FILE.  NULL with err[0] == '\0' when it is
 * not set (unauthenticated); NULL with 'err' set when the file is bad
 * (missing, readable by others, a line that is not 64 hex digits). */
svc_auth_t *svc_auth_from_env(char *err, size_t errlen);
/* The keys of 'path' (svc_auth_from_env's rules). */
svc_auth_t *svc_auth_load(const char *path, char *err, size_t errlen);
void svc_auth_free(svc_auth_t *a);

/* The hex MAC of 'n' parts with the signing key. */
void svc_auth_sign(const svc_auth_t *a, const char *const *parts, const size_t *lens, size_t n,
                   char out[SVC_AUTH_HEX_MAX]);
/* Whether 'hex' is the MAC of the parts under any of the keys. */
bool svc_auth_verify(const svc_auth_t *a, const char *const *parts, const size_t *lens, size_t n, const char *hex);

#endif /* SVC_AUTH_H */
