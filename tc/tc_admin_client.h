/*
 * tc_admin_client.h - one request to a tcd admin socket (tc_admin.h):
 * send a line, read the answer line, within a deadline.  What tcctl and
 * the web console (console/) share; it knows nothing of the commands.
 */
#ifndef TC_ADMIN_CLIENT_H
#define TC_ADMIN_CLIENT_H

#include <stddef.h>

/* Send 'line' (no newline) to the admin socket at 'path' and read the
 * answer line (at most 'max_answer' bytes) into '*out' (malloc'ed, the
 * newline removed).  Returns 0, or -1 with why in 'why' (cannot connect,
 * with a hint; closed before the answer; no answer within 'timeout_s'). */
int tc_admin_talk(const char *path, const char *line, double timeout_s, size_t max_answer, char **out, char *why,
                  size_t whylen);

#endif /* TC_ADMIN_CLIENT_H */
