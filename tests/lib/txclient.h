/*
 * txclient.h - a small blocking client of the coordinator protocol, for
 * integration tests, fault drivers and tc-bench.  Not the product client
 * (that is librmclient): this one is deliberately simple and lets a test
 * send anything, including garbage.
 *
 * NOTES
 *   One TCP connection, poll(2)-based, one request in flight at a time.
 *   While waiting for an answer it serves requests that the TC sends to
 *   this connection (BranchCommit/BranchRollback when registered as an RM)
 *   through the handler set with txc_set_handler, so a thread can act as TM
 *   and RM on one connection without deadlocking.
 *   Not thread-safe: one txc_t per thread.
 */
#ifndef TXCLIENT_H
#define TXCLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "txp_msg.h"

typedef struct txc txc_t;

/* Answer a TC->RM request: fill 'res' (already init'ed as its result with
 * code 0).  Return 0 to send it, non-zero to stay silent. */
typedef int (*txc_handler_fn)(txc_t *c, const txp_msg_t *req, txp_msg_t *res, void *arg);

/* Connect with a timeout.  NULL on failure (errno-style message in err). */
txc_t *txc_connect(const char *host, int port, int timeout_ms, char *err, size_t errlen);
void txc_close(txc_t *c);
int txc_fd(const txc_t *c);

void txc_set_handler(txc_t *c, txc_handler_fn fn, void *arg);

/* RegisterTM (rm=false) or RegisterRM with 'resource_ids' (comma list).
 * Returns the result code (0 ok) or a negative transport error. */
int txc_register(txc_t *c, bool rm, const char *app, const char *client_id, const char *token,
                 const char *resource_ids);

/* Whether a coordinator on host:port accepts a TM registration with
 * 'token' (connect timeout 'timeout_ms'): it serves. */
bool txc_serving(const char *host, int port, const char *token, int timeout_ms);

/* Send 'req' (request_id assigned here) and wait for its answer into 'res'
 * (cleared by the caller afterwards).  Returns 0 when an answer arrived
 * (check res->code), TXP_EUNKNOWN_OUTCOME on timeout, TXP_ECONN_LOST if the
 * connection closed. */
int txc_call(txc_t *c, txp_msg_t *req, txp_msg_t *res, int timeout_ms);

/* Serve incoming requests for up to 'timeout_ms' (or until one arrives
 * when 'once').  Returns the number served, or TXP_ECONN_LOST. */
int txc_poll(txc_t *c, int timeout_ms, bool once);

/* Write raw bytes (for garbage tests). */
int txc_send_raw(txc_t *c, const void *buf, size_t len);
/* Encode 'm' (its request_id as set) and send it without waiting for an
 * answer (the answer, if any, is left unread): 0 or a TXP error. */
int txc_send_msg(txc_t *c, const txp_msg_t *m);
/* True if the peer closed the connection within 'timeout_ms'. */
bool txc_wait_closed(txc_t *c, int timeout_ms);

/* Convenience wrappers; each returns the result code or a transport error.
 * 'xid_out' must hold TXP_MAX_XID_LEN + 1 bytes. */
int txc_begin(txc_t *c, uint32_t timeout_ms, const char *name, const char *idem, char *xid_out);
int txc_commit(txc_t *c, const char *xid, int *status_out);
int txc_rollback(txc_t *c, const char *xid, int *status_out);
int txc_status(txc_t *c, const char *xid, int *status_out);
int txc_branch_register(txc_t *c, const char *xid, const char *resource, const char *lock_keys,
                        uint32_t lock_wait_ms, int64_t *branch_out, uint32_t *waited_ms);
/* The same with the branch's application data ('app_data' may be NULL),
 * e.g. TXP_APP_DATA_PHASE2_SYNC: an AT branch whose commit does work, which
 * the coordinator drives and records (an AT commit without it is finished
 * at its decision). */
int txc_branch_register_data(txc_t *c, const char *xid, const char *resource, const char *lock_keys,
                             const char *app_data, uint32_t lock_wait_ms, int64_t *branch_out,
                             uint32_t *waited_ms);

/* A resource manager's answer to the phase-two request of type
 * 'req_type' (TXP_MSG_BRANCH_COMMIT or TXP_MSG_BRANCH_ROLLBACK) about
 * 'xid' and 'branch_id': code 0 and the branch status 'status'; what a
 * test sends as an RM, or forges as a peer. */
void txc_branch_result(txp_msg_t *res, int req_type, const char *xid, int64_t branch_id, int status);
/* The branch status of a phase two done as 'req_type' asks: Committed or
 * Rollbacked. */
int txc_phase2_done(int req_type);

/* Milliseconds since an arbitrary start (monotonic). */
double txc_now_ms(void);

#endif /* TXCLIENT_H */
