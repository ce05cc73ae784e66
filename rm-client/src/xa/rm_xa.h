/*
 * rm_xa.h - what tests reach inside the XA mode (not installed).  The
 * public API is rm_client.h's "RM: XA mode"; rm_xa.c has the NOTES.
 */
#ifndef RM_XA_H
#define RM_XA_H

#include <stddef.h>
#include <stdint.h>

/* PostgreSQL's limit on a prepared transaction's id, with its NUL. */
#define RM_XA_GID_MAX 200

/* The prepared transaction id of branch 'branch_id' of 'xid':
 * "txc:BRANCH_ID:XID". */
void rm__xa_gid(char *out, size_t cap, const char *xid, int64_t branch_id);

/* Failpoint for tests: if set, rm_xa_start calls it after the branch is
 * registered and before its fence row is written. */
extern void (*rm__xa_failpoint_after_register)(const char *xid, int64_t branch_id, void *arg);
extern void *rm__xa_failpoint_arg;

#endif /* RM_XA_H */
