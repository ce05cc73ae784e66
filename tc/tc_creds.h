/*
 * tc_creds.h - the applications a coordinator admits, each with its own
 * secret, and the group each belongs to (server.credentials_file).
 *
 * NOTES
 *   The file has one line per credential, "application_id group secret",
 *   fields separated by blanks; '#' starts a comment line.  An application
 *   may have several lines (several secrets, for rotation: add the new one,
 *   reload, move the clients, remove the old one, reload), all in the same
 *   group.  The file must be a regular file that only its owner can read
 *   or write (mode 0600 or 0400): it holds every application's secret.
 *
 *   The group is the unit of trust between applications (Seata's
 *   "transaction service group"): the applications of one business
 *   transaction (order-service begins, stock-service registers a branch)
 *   are put in one group, and the coordinator lets only members of the
 *   group that began a global transaction act on it (tc_coord.c NOTES).
 *
 *   A table is immutable once loaded: a reload (SIGHUP) loads a new one and
 *   swaps it in; connections keep the identity they registered with.
 */
#ifndef TC_CREDS_H
#define TC_CREDS_H

#include <stdbool.h>
#include <stddef.h>

typedef struct tc_creds tc_creds_t;

/* Shortest secret accepted (bytes): 128 bits of hex. */
#define TC_CREDS_SECRET_MIN 16
/* Group name of the clients that registered with server.token (legacy
 * single-group mode).  Not a valid name in a credentials file, so no
 * credentialed application can share it. */
#define TC_CREDS_TOKEN_GROUP "*token*"

/*
 * Load the table from 'path'.  Returns it, or NULL with the reason in
 * 'err' (file missing, readable by others, a malformed line named by its
 * number, an application in two groups, no credential at all).
 */
tc_creds_t *tc_creds_load(const char *path, char *err, size_t errlen);
void tc_creds_free(tc_creds_t *c);

/* Number of credentials (lines) and of applications. */
size_t tc_creds_count(const tc_creds_t *c);
size_t tc_creds_apps(const tc_creds_t *c);

/*
 * The group of 'app' when 'secret' is one of its secrets, else NULL.
 * '*known' (may be NULL) tells whether 'app' has any credential.  Every
 * secret of 'app' is compared in full, in time that does not depend on
 * where a guess differs.  The string is the table's: valid while it is.
 */
const char *tc_creds_check(const tc_creds_t *c, const char *app, const char *secret, bool *known);

/* Compare 'given' with 'want' in time that depends only on 'want_len'. */
bool tc_creds_secret_equal(const char *given, const char *want, size_t want_len);

#endif /* TC_CREDS_H */
