/*
 * txp_lockkey.h - the lock key string that an RM sends with BranchRegister
 * and GlobalLockQuery, and the row keys the TC stores.
 *
 * NOTES
 *   Grammar (Seata's):   keys  := group (';' group)*
 *                        group := table ':' pk (',' pk)*
 *   e.g. "trade_order:1001,1002;stock:7".  Table names and pk values are
 *   non-empty and may not contain ':' ',' ';' '^' or control bytes (an RM
 *   with such primary keys encodes them first, e.g. hex).  Empty strings and
 *   empty groups are errors; duplicates are allowed (the TC ignores them).
 *   The TC stores each key as the row key  resource '^^^' table '^^^' pk,
 *   at most TXP_MAX_ROW_KEY_LEN bytes, never truncated.
 */
#ifndef TXP_LOCKKEY_H
#define TXP_LOCKKEY_H

#include <stddef.h>

#include "txp_msg.h"

#define TXP_MAX_ROW_KEY_LEN 2048
#define TXP_ROW_KEY_SEP "^^^"

typedef struct txp_lockkey {
  const char *table; /* points into the parsed string; not NUL-terminated */
  size_t table_len;
  const char *pk;
  size_t pk_len;
} txp_lockkey_t;

/*
 * Call 'cb' for each key of 's' in order.  Stops at the first callback that
 * returns non-zero and returns that value.  Returns the number of keys, or
 * TXP_EBAD_REQUEST if 's' is malformed, or TXP_ELIMIT past 'max_keys' keys
 * (nothing is reported for a malformed string: it is checked whole first).
 */
int txp_lockkeys_each(const char *s, size_t max_keys, int (*cb)(const txp_lockkey_t *k, void *arg),
                      void *arg);

/* Number of keys in 's' (or the same errors as txp_lockkeys_each). */
int txp_lockkeys_count(const char *s, size_t max_keys);

/* Whether 'v' (length 'n') is usable as a table name or pk value. */
int txp_lockkey_part_ok(const char *v, size_t n);

/*
 * Append "table:pk" to 'b' (';'-separated from what is there), as text
 * without a NUL.  Returns 0, TXP_EBAD_REQUEST for an unusable part, or the
 * buffer's errors.
 */
int txp_lockkeys_append(txp_buf_t *b, const char *table, const char *pk);

/* Write the row key of 'k' for 'resource' into 'out' (NUL-terminated).
 * Returns its length, or TXP_EFIELD_TOO_LONG if it does not fit 'cap' or
 * TXP_MAX_ROW_KEY_LEN. */
int txp_row_key(const char *resource, const txp_lockkey_t *k, char *out, size_t cap);

#endif /* TXP_LOCKKEY_H */
