/*
 * tcd_suite.h - the fixture that test_tcd and test_tcd_recovery share: a
 * real tcd process on a real PostgreSQL, a simulated RM thread, helpers to
 * look into the store, and clients that write frames raw.
 *
 * NOTES
 *   The database comes from TC_PG_URL and the binary from TX_BIN_DIR (both
 *   set by ctest through scripts/with-servers --pg).  The group setup starts
 *   tcd on a free loopback port and an RM thread; the tests of a group share
 *   that tcd, and a test that kills it starts another one (tcd_start) on the
 *   same database.  The group teardown stops it with SIGTERM and requires a
 *   clean exit (exit status 0: no sanitizer report, no leak).  tcd's stderr
 *   is inherited, so its warnings and any sanitizer report appear in the
 *   test output.
 *
 *   The RM thread (rmsim.h) has its own connection, registered as RM for
 *   db_orders and db_stock, and answers BranchCommit/BranchRollback: it
 *   records every request (xid, branch id, order, connection generation)
 *   and answers OK, DIRTY_WRITE for one chosen branch, or nothing
 *   ("silent": the request is held and answered late once the mode is
 *   switched back, unless the connection dies first).  It reconnects by
 *   itself when tcd goes away, to whatever port tcd listens on now, and
 *   sends a heartbeat every second.
 *
 *   Test-thread clients register as RM for resources nobody serves
 *   ("db_client", "db_waiter"): the TC looks the RM of a branch up by
 *   resource id, so phase-two requests always go to the RM thread, which
 *   answers while the test thread waits.  Where two requests must be
 *   processed in a known order (lock-wait FIFO, a rollback left hanging),
 *   frames are written raw on their own connection and the answers read
 *   from its socket with a decoder of the test's own.  Every client and
 *   reader a test opens is closed by the test teardown, also after a failed
 *   assertion.
 *
 *   Asynchronous effects are waited for by polling PostgreSQL (or the RM's
 *   records) with a short nanosleep and an overall deadline; nothing sleeps
 *   for a fixed time.
 */
#ifndef TCD_SUITE_H
#define TCD_SUITE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <libpq-fe.h>

#include "db.h"
#include "tcd_proc.h"
#include "txclient.h"
#include "txp_msg.h"

#define TOKEN "test-token"
#define HOST TCD_PROC_HOST
#define WAIT_MS 10000 /* default bound of a wait for an asynchronous effect */

#define SQL_HISTORY_STATUS "SELECT status FROM global_history WHERE xid = $1"
#define SQL_GLOBAL_STATUS "SELECT status FROM global_table WHERE xid = $1"
#define SQL_HISTORY_BRANCHES                                                            \
  "SELECT count(*) FROM global_history h, jsonb_array_elements(tc_history_branches(h.branches)) e "          \
  "WHERE h.xid = $1 AND (e->>'status')::int = $2::int"
#define SQL_LIVE_ROWS                                                                   \
  "SELECT (SELECT count(*) FROM global_table WHERE xid = $1) + "                        \
  "(SELECT count(*) FROM branch_table WHERE xid = $1) + "                               \
  "(SELECT count(*) FROM lock_table WHERE xid = $1)"
#define SQL_LOCKS "SELECT count(*) FROM lock_table WHERE xid = $1"
#define SQL_BRANCHES "SELECT count(*) FROM branch_table WHERE xid = $1"
#define SQL_KEY_HOLDER "SELECT xid FROM lock_table WHERE row_key = $1"

/* ------------------------------------------------------------ utilities */

double now_ms(void);
/* 10 ms. */
void nap(void);

/* ------------------------------------------------------------ tcd process */

extern tcd_proc_t g_tcd;
extern bool g_stopped_on_purpose; /* a test stopped tcd: the teardown does not miss it */

/* One more "TC_X_Y=value" setting for every tcd the suite starts (NULL:
 * none); tcd_proc gives tcd no TC_* variable of the test's environment. */
extern const char *g_tcd_setting;

/* Start tcd on a fresh port (retrying when the port is taken) and point
 * the RM thread at it; 0 or -1. */
int tcd_start(void);
/* The same with failpoints armed from the start (TX_FAILPOINTS='failpoints',
 * NULL: none) and tcd's output appended to the file 'log' (NULL: inherited). */
int tcd_start_armed(const char *failpoints, const char *log);
/* SIGTERM, bounded wait, then SIGKILL.  Returns the wait status, or -1. */
int tcd_stop(void);
void tcd_kill9(void);
/* Whether tcd still runs; if it ended, says how (once) and forgets it. */
bool tcd_alive(void);

/* -------------------------------------------------------------- the RM */

/* Successful registrations of the RM thread so far. */
int rm_generation(void);
bool rm_wait_generation(int above, int timeout_ms);
/* Hold commits / rollbacks unanswered; answer DIRTY_WRITE to the rollback
 * of 'dirty_branch' (0: none). */
void rm_set_modes(bool silent_commit, bool silent_rollback, int64_t dirty_branch);
/* Requests of 'type' for 'xid' received on connections of generation >
 * 'after_gen'; their branch ids in order of arrival go to 'ids' (may be
 * NULL). */
int rm_events(const char *xid, int type, int after_gen, int64_t *ids, int max);
bool rm_wait_events(const char *xid, int type, int after_gen, int want, int timeout_ms);
bool has_id(const int64_t *ids, int n, int64_t id);

/* --------------------------------------------------------- PostgreSQL */

/* The queries themselves: db.h (g_pg is opened by the group setup). */

void expect_history(const char *xid, int status, int timeout_ms);
long history_branches(const char *xid, int branch_status);
/* The status of branch 'branch' in branch_table (-1: no such row). */
long branch_status(int64_t branch);

/* ------------------------------------------------------------ clients */

/* Reads answers from a connection's socket with the test's own decoder;
 * answers that arrive before the one waited for are kept for later. */
#define READER_HELD 8
typedef struct reader {
  txp_decoder_t *dec;
  txp_msg_t held[READER_HELD];
  int nheld;
} reader_t;

reader_t *new_reader(void);
/* A connection (closed by the test teardown unless closed here). */
txc_t *raw_connect(void);
void untrack_close(txc_t *c);
/* A registered connection: TM, or RM of 'resources' (none of which the RM
 * thread serves, so phase two never comes here). */
txc_t *client(bool as_rm, const char *client_id, const char *resources);

typedef struct cli {
  txc_t *tm; /* GlobalBegin/Commit/Rollback */
  txc_t *rm; /* BranchRegister/Report */
} cli_t;

void cli_open(cli_t *cl, const char *name);
/* The same, as most tests begin: 'cli_t cl = new_cli("t1");'. */
cli_t new_cli(const char *name);
void begin_ok(txc_t *tm, uint32_t timeout_ms, const char *name, char *xid);
int64_t register_ok(txc_t *c, const char *xid, const char *resource, const char *keys);
/* An AT branch with commit work (TXP_APP_DATA_PHASE2_SYNC): its commit is
 * driven and recorded, and its TM answered after it (an AT commit without
 * commit work is finished at its decision). */
int64_t register_sync_ok(txc_t *c, const char *xid, const char *resource, const char *keys);

/* A transaction with a branch on each resource of the RM thread, both
 * registered by one RM connection: db_orders first, then db_stock. */
typedef struct two_branch_tx {
  char xid[TXP_MAX_XID_LEN + 1];
  int64_t orders; /* the branch on db_orders */
  int64_t stock;  /* the branch on db_stock */
} two_branch_tx_t;

void begin_two_branches(const cli_t *cl, uint32_t timeout_ms, const char *name, const char *orders_keys,
                        const char *stock_keys, two_branch_tx_t *tx);

/* GlobalCommit / GlobalRollback of 'xid' that must succeed with the global
 * Committed / Rollbacked. */
void commit_ok(txc_t *tm, const char *xid);
void rollback_ok(txc_t *tm, const char *xid);
/* The RM thread was told to commit exactly the branches 'b1' and 'b2' of
 * 'xid' (waits for both requests). */
void expect_commits_told(const char *xid, int64_t b1, int64_t b2);
/* The RM thread was told to roll back both branches of 'tx', and no
 * more: the newest (db_stock) first. */
void expect_rollbacks_newest_first(const two_branch_tx_t *tx);

void msg_register(txp_msg_t *m, const char *xid, const char *resource, const char *keys, uint32_t lock_wait_ms,
                  const char *idem);
/* A BranchReport of 'branch' of 'xid' with 'status'. */
void msg_report(txp_msg_t *m, const char *xid, int64_t branch, int status);
/* Write 'n' requests in one write, with request ids first_id, first_id+1... */
void send_frames(txc_t *c, txp_msg_t *msgs, int n, uint64_t first_id);
/* Write a GlobalRollback of 'xid' as request 'id' (its answer is left to
 * recv_answer). */
void send_rollback(txc_t *c, const char *xid, uint64_t id);
void send_commit(txc_t *c, const char *xid, uint64_t id);
/* Write a registration of 'xid' on db_orders 'keys' that waits up to
 * 'wait_ms' for them (request 'id') and, in the same write, the same
 * registration without waiting (id + 1), which conflicts at once: requests
 * of one connection are batched in order, so the probe's answer proves
 * that the waiting registration is queued. */
void queue_waiter(txc_t *c, reader_t *rd, const char *xid, const char *keys, uint32_t wait_ms, uint64_t id);
/* Read the answer to request 'id' from the socket of 'c' (frames written
 * with send_frames; txclient's own decoder holds nothing then).  0, or
 * TXP_EUNKNOWN_OUTCOME on timeout, TXP_ECONN_LOST. */
int recv_answer(txc_t *c, reader_t *rd, uint64_t id, txp_msg_t *out, int timeout_ms);
/* recv_answer within 10 s that must succeed with 'code'; the answer stays
 * in 'out' for further checks (the caller clears it). */
void expect_answer(txc_t *c, reader_t *rd, uint64_t id, txp_msg_t *out, int code);
bool readable_now(txc_t *c);

/* -------------------------------------------------------------- fixture */

/* cmocka group setup (tcd, the RM thread, the store connection) and
 * teardown (tcd must stop cleanly). */
int suite_group_setup(void **state);
int suite_group_teardown(void **state);
/* Each test starts with a serving tcd: if an earlier one crashed it, a new
 * one is started (the crash already failed that test). */
int suite_test_setup(void **state);
/* Close everything a test opened, also after a failed assertion, and fail
 * the test if tcd died under it (a test that kills tcd starts another). */
int suite_test_teardown(void **state);

#endif /* TCD_SUITE_H */
