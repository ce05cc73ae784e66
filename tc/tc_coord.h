/*
 * tc_coord.h - the coordinator's request handlers (tc_coord.c): begin,
 * register, report, decide, status, lock query.  Loop thread only.
 */
#ifndef TC_COORD_H
#define TC_COORD_H

struct tc_req;

/* Serve one decoded request: tc_server's on_request, with the node's
 * context (tc_ctx_t *) as 'arg'. */
void tc__coord_on_request(struct tc_req *req, void *arg);

/* The same, for a request that waited for its global's begin (tc_hold.h):
 * not counted again. */
void tc__coord_resume(struct tc_req *req, void *arg);

#endif /* TC_COORD_H */
