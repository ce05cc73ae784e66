/*
 * svc_admin.h - the services' admin endpoint: the runtime switch of the
 * fallback to local mode (the seed's "fallback-to-local" in its config
 * centre), on a running order-service or stock-service, no restart.
 *
 * NOTES
 *   POST /admin/mode  {"mode": "local" | "global" | "auto",
 *                      "operator": NAME (optional, logged),
 *                      "at_ms": unix ms (required with a signature)}
 *     local / global: rm_client_force_mode (detection keeps probing but
 *     no longer decides); auto: the decision back to detection.
 *     200 {ok, mode (now in force), forced, detected, previous (the forced
 *     mode before)} | 400 bad_request (nothing changed) | 401
 *     unauthenticated | 403 admin_disabled (no admin credential is
 *     configured in this process: the endpoint refuses everything).
 *   GET /admin/mode   the same answer, changing nothing (authenticated too).
 *   TXC_TX_MODE at start stays the initial value; the endpoint changes it
 *   afterwards (a restart goes back to TXC_TX_MODE).
 *
 *   Authentication, either of (never a buyer's order token):
 *     - Authorization: Bearer <token>, the first line of the file named by
 *       TXC_ADMIN_TOKEN_FILE (at least 16 characters; mode 0600: a file
 *       group or others may read is refused at start).  For curl:
 *         curl -XPOST "$ORDER_URL/admin/mode" -H "Authorization: Bearer $(cat "$TXC_ADMIN_TOKEN_FILE")" \
 *              -d '{"mode":"local","operator":"alice"}'
 *     - X-Txc-Signature with the services' key (TXC_SERVICE_KEY_FILE,
 *       svc_auth.h: method, path and body signed), whose body carries
 *       "at_ms" within 60 s of this host's clock, so that a recorded call
 *       cannot be replayed later: what `txc-mode` (txc_mode.c) sends.
 *   Who: "admin-token" or "service-key", plus the body's operator, in the
 *   log line of each change ("transaction mode forced to local", JSON
 *   fields admin, who, operator, previous, mode, detected) and of each
 *   refusal (warning).  Counted: txc_admin_mode_changes_total{mode} and
 *   txc_admin_refused_total{reason="unauthenticated"|"bad_request"|
 *   "disabled"} on /metrics, beside txc_client_mode{mode} and
 *   txc_client_mode_forced (0 auto, 1 global, 2 local).
 *
 *   On stock-service the mode is its client's, shown on /healthz and
 *   /metrics: stock-service follows what each call says (an xid: a global
 *   branch; X-Txc-Local: a local freeze), so the switch that changes where
 *   orders go is order-service's; forcing both keeps a fleet's view one.
 */
#ifndef SVC_ADMIN_H
#define SVC_ADMIN_H

#include <stdbool.h>

#include "rm_client.h"
#include "svc_auth.h"
#include "svc_common.h"
#include "svc_http.h"

#define SVC_ADMIN_MAX_SKEW_MS 60000

typedef struct svc_admin svc_admin_t;

/* The admin endpoint of 'rm' (borrowed), accepting the admin token of
 * TXC_ADMIN_TOKEN_FILE (if set) and signatures under 'auth' (borrowed, may
 * be NULL).  NULL with a logged error when the token file is bad (the
 * service refuses to start). */
svc_admin_t *svc_admin_new(rm_client_t *rm, const svc_auth_t *auth);
void svc_admin_free(svc_admin_t *a);

/* Another admin call ('what', e.g. "tickets", for the log) on the same
 * credentials: who sent 'req' ("admin-token" or "service-key"; a signed
 * call's JSON body must carry at_ms within 60 s of now), or NULL with the
 * 401 / 403 refusal in 'resp' (counted, logged). */
const char *svc_admin_check(svc_admin_t *a, const svc_req_t *req, svc_resp_t *resp, const char *what);

/* The body of a ticket addition (order-service's POST
 * /activities/{id}/tickets, stock-service's POST /tickets). */
typedef struct svc_tickets {
  long long activity; /* only 'with_activity' */
  long long ticket_type, qty;
  const char *key, *op; /* borrowed from the JSON; op may be NULL */
} svc_tickets_t;

/* Read 'in' into 't': NULL, or what is wrong with it (for a 400). */
const char *svc_tickets_parse(const json_t *in, bool with_activity, svc_tickets_t *t);

/* Whether 'req' is for /admin/...: then 'resp' is filled. */
bool svc_admin_handle(svc_admin_t *a, const svc_req_t *req, svc_resp_t *resp);

/* txc_admin_* counters, and txc_client_mode / txc_client_mode_forced when
 * 'with_mode' (stock-service, whose page has them not otherwise). */
void svc_admin_metrics(svc_admin_t *a, txc_buf_t *b, bool with_mode);

#endif /* SVC_ADMIN_H */
