/*
 * rmsim.h - a simulated resource manager for tests: a thread with its own
 * txclient connection to tcd, registered as RM for some resources, that
 * answers BranchCommit/BranchRollback the way a test asks.
 *
 * NOTES
 *   It answers OK, or holds its answers ("silent": a held request is
 *   answered once the mode is switched back, unless the connection dies
 *   first), or fails chosen branches for good (their rollback meets a
 *   dirty write, their commit an unretryable error).  It records every
 *   request (type, xid, branch id, and the generation of the connection
 *   that received it; a generation is a successful registration), counts
 *   commits and rollbacks, sends a heartbeat every second, and reconnects
 *   by itself when tcd goes away, to whatever port rmsim_set_port said
 *   last.
 *
 *   The calls are thread-safe; none calls cmocka.
 */
#ifndef RMSIM_H
#define RMSIM_H

#include <stdbool.h>
#include <stdint.h>

typedef struct rmsim rmsim_t;

/* An RM registering as 'client_id' (application "test-rm") for
 * 'resources' (comma list) with 'token', on TCD_PROC_HOST:'port'.  NULL
 * when out of memory.  Not started. */
rmsim_t *rmsim_new(const char *client_id, const char *resources, const char *token, int port);
/* Stop it (if started) and free it. */
void rmsim_free(rmsim_t *r);

/* Where tcd listens now (the thread connects there from its next attempt). */
void rmsim_set_port(rmsim_t *r, int port);

/* Start the thread (no-op when started) and wait up to 'timeout_ms' for
 * it to register.  0, or -1 if it did not (the thread runs on). */
int rmsim_start(rmsim_t *r, int timeout_ms);
/* Stop the thread and close its connection (no-op when not started). */
void rmsim_stop(rmsim_t *r);

/* Hold commit / rollback answers (silent) or answer them. */
void rmsim_modes(rmsim_t *r, bool silent_commit, bool silent_rollback);
/* 'branch' fails for good from now on; 0: no branch does any more. */
void rmsim_dirty(rmsim_t *r, int64_t branch);

/* Successful registrations so far. */
int rmsim_generation(rmsim_t *r);
/* Commits (or rollbacks) received so far. */
int rmsim_count(rmsim_t *r, bool commits);
/* Requests of 'type' for 'xid' received on connections of generation >
 * 'after_gen'; their branch ids in order of arrival go to 'ids' (may be
 * NULL, at most 'max'). */
int rmsim_events(rmsim_t *r, const char *xid, int type, int after_gen, int64_t *ids, int max);

#endif /* RMSIM_H */
