/*
 * rm_tcc.h - what tests reach inside the TCC mode (not installed).  The
 * public API is rm_client.h's "RM: TCC mode"; rm_tcc.c has the NOTES.
 */
#ifndef RM_TCC_H
#define RM_TCC_H

#include <stdint.h>

/* Failpoint for tests: if set, rm_tcc_try calls it after the branch is
 * registered and before its fence row is written (a paused process, so a
 * test can roll the global back in between: the cancel before the try). */
extern void (*rm__tcc_failpoint_after_register)(const char *xid, int64_t branch_id, void *arg);
extern void *rm__tcc_failpoint_arg;

#endif /* RM_TCC_H */
