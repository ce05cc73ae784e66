/*
 * svc_problem.h - the one shape of the services' error answers: a problem
 * object of RFC 9457 (application/problem+json), pure (no I/O).
 *
 * NOTES
 *   Every answer with a status of 400 or more is
 *     {"type": "urn:txc:problem:<error>", "title": ..., "status": <status>,
 *      "detail": ..., "error": "<error>", ...extension members}
 *   where 'error' is the word the services answered before this shape
 *   (scripts and tests read it: an interface, kept as an extension
 *   member), 'type' names the same problem as a URI (a name, not
 *   resolvable: RFC 9457 3.1.1 allows it), 'title' is the same for every
 *   occurrence of the type, and 'detail' says what happened this time.
 *   Extension members stay as they were ("reason" of a 409 rejected),
 *   but for the one "status" that was the order's (409 bad_state): the
 *   problem's "status" is the HTTP status (RFC 9457 3.1.2), so the
 *   order's state is "order_status".
 *   examples/openapi/ describes the shape (components/schemas/Problem).
 */
#ifndef SVC_PROBLEM_H
#define SVC_PROBLEM_H

#include <stdbool.h>

#include <jansson.h>

#define SVC_PROBLEM_TYPE_PREFIX "urn:txc:problem:"
#define SVC_PROBLEM_MEDIA_TYPE "application/problem+json"

/* The title of problem 'error' (the same for every occurrence), else the
 * reason phrase of HTTP 'status', else "Error".  Never NULL. */
const char *svc_problem_title(const char *error, int status);

/* The reason phrase of HTTP 'status' ("Not Found"), NULL when unknown. */
const char *svc_problem_reason_phrase(int status);

/* A new problem object (new reference; NULL when out of memory) for HTTP
 * 'status' and 'error' (a word of [a-z0-9_], at most 48 bytes: anything
 * else, e.g. a word another service answered, becomes "error").
 * 'detail' NULL: the title. */
json_t *svc_problem_new(int status, const char *error, const char *detail);

/* The 409 refusal of an order: problem "rejected" with member "reason"
 * ("sold_out", "over_limit", "not_on_sale", ...) and a detail saying it. */
json_t *svc_problem_rejected(const char *reason);

/*
 * 'body' (taken) as a problem object for HTTP 'status': the members a
 * problem needs that it lacks are added (type and title from its "error",
 * "error" when it has none or not a word; status; detail), what it has is
 * kept, but a "status" that is not a number (the order's, in a bad_state
 * answer stored before this shape) moves to "order_status"; a body that
 * is not an object becomes problem "internal".  Returns the object (NULL
 * when out of memory).  For answers built before this shape (an
 * idempotent replay stored earlier) and any a handler built by hand.
 */
json_t *svc_problem_complete(json_t *body, int status);

/* Whether 'body' has the members of a problem object for 'status'. */
bool svc_problem_ok(const json_t *body, int status);

#endif /* SVC_PROBLEM_H */
