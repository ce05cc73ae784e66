/*
 * txc_secret.h - a client's registration secret, read from a file: what
 * the coordinator's credentials file (tc/tc_creds.h) lists for the
 * client's application.  Never from a command line.
 *
 * NOTES
 *   Where a client looks, in this order:
 *     TC_SECRET_FILE   a file holding this process's secret;
 *     TC_SECRETS_DIR   a directory of files named by application id (what
 *                      cluster/local/up writes: one file per application);
 *     TC_TOKEN         the legacy shared server.token, as a value (kept so
 *                      that old deployments and tools work: its holders are
 *                      a group of their own, README "Security model").
 *   A secret file must be a regular file that only its owner can read or
 *   write (0600 or 0400); its first line is the secret, surrounding blanks
 *   and the line end removed.  A client reads it once, at start-up: after
 *   a rotation it is restarted (or reads the file again on reconnect,
 *   where it can).
 */
#ifndef TXC_SECRET_H
#define TXC_SECRET_H

#include <stddef.h>
#include <stdio.h>

/*
 * Open 'path' for reading if it is a regular file that only its owner may
 * read (mode 0600 or 0400): the one check for every secret the project
 * reads (a client's secret, tcd's credentials, the cluster secret, the
 * services' key).  NULL with the reason in 'err', naming the file as
 * 'what' ("secret file", "credentials file", ...).
 */
FILE *txc_private_fopen(const char *path, const char *what, char *err, size_t errlen);

/*
 * The secret in 'path' into 'out' ('cap' bytes).  Returns 0, or -1 with
 * the reason in 'err': missing, not a regular file, readable by group or
 * others, empty, longer than 'cap' - 1.
 */
int txc_secret_read(const char *path, char *out, size_t cap, char *err, size_t errlen);

/*
 * The secret of application 'app' from the environment (NOTES) into 'out'.
 * Returns 0 with '*source' (may be NULL) naming where it came from
 * ("TC_SECRET_FILE", "TC_SECRETS_DIR" or "TC_TOKEN"), 1 when none of the
 * three is set, or -1 with the reason in 'err'.
 */
int txc_secret_for(const char *app, char *out, size_t cap, const char **source, char *err, size_t errlen);

#endif /* TXC_SECRET_H */
