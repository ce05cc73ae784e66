/*
 * test_tcd_authz.c - who may do what with an xid (issue 20, item 2), end
 * to end: a real tcd with a credentials file on a real PostgreSQL, driven
 * over the wire.
 *
 * NOTES
 *   The credentials file gives four applications of the group "shop"
 *   (order-svc begins, stock-svc registers branches, audit-svc is in the
 *   group but takes no part, test-rm is the simulated RM that answers phase
 *   two) and one of the group "other" (evil, the attacker: a valid
 *   credential of its own, the reviewer's t2.py).  No server.token is set
 *   but in the last test, where the legacy token's holders are shown to be
 *   a group of their own.
 *
 *   Every refusal is checked twice: the answer (TXP_ENOT_OWNER, TXP_EAUTH,
 *   TXP_EGLOBAL_NOT_FOUND) and the store (nothing changed).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "db.h"
#include "rmsim.h"
#include "tcd_proc.h"
#include "test_file.h"
#include "txclient.h"
#include "txp_errno.h"
#include "txp_msg.h"
#include "txp_status.h"
#include "txp_xid.h"

#define HOST TCD_PROC_HOST
#define S_ORDER "order-svc-secret-0123456789abcdef"
#define S_STOCK "stock-svc-secret-0123456789abcdef"
#define S_STOCK2 "stock-svc-rotated-0123456789abcdef"
#define S_AUDIT "audit-svc-secret-0123456789abcdef"
#define S_RM "test-rm-secret-0123456789abcdef"
#define S_EVIL "evil-secret-0123456789abcdef0123"
#define LEGACY_TOKEN "legacy-shared-token-0123456789"

#define SQL_STATUS "SELECT status FROM global_table WHERE xid = $1"
#define SQL_BRANCH_STATUS "SELECT status FROM branch_table WHERE branch_id = $1::bigint"
#define SQL_BRANCHES "SELECT count(*) FROM branch_table WHERE xid = $1"

static tcd_proc_t g_tcd;
static rmsim_t *g_rm;
static char g_dir[256], g_creds[300];
static txc_t *g_open[16];

/* ------------------------------------------------------------- helpers */

static void write_creds(const char *text, mode_t mode) { assert_true(test_write_file(g_creds, text, mode)); }

static const char *const CREDS =
  "# application group secret\n"
  "order-svc shop " S_ORDER "\n"
  "stock-svc shop " S_STOCK "\n"
  "audit-svc shop " S_AUDIT "\n"
  "test-rm   shop " S_RM "\n"
  "\n"
  "evil other " S_EVIL "\n";

static txc_t *open_conn(void) {
  char err[256];
  txc_t *c = txc_connect(HOST, g_tcd.port, 2000, err, sizeof(err));
  if (!c) fail_msg("could not connect to tcd: %s", err);
  for (size_t i = 0; i < sizeof(g_open) / sizeof(g_open[0]); i++)
    if (!g_open[i]) {
      g_open[i] = c;
      return c;
    }
  fail_msg("too many connections");
  return NULL;
}

/* A registered connection of 'app' with 'secret'. */
static txc_t *app_conn(bool rm, const char *app, const char *secret) {
  txc_t *c = open_conn();
  char cid[64];
  snprintf(cid, sizeof(cid), "%s-%s", app, rm ? "rm" : "tm");
  int rc = txc_register(c, rm, app, cid, secret, rm ? "r_nobody" : NULL);
  if (rc != 0) fail_msg("could not register %s: %s (%d)", app, txp_errname(rc), rc);
  return c;
}

static int report(txc_t *c, const char *xid, int64_t branch, int status) {
  txp_msg_t req, res;
  txp_msg_init(&req, TXP_MSG_BRANCH_REPORT);
  txp_msg_set_str(&req, TXP_F_XID, xid);
  txp_msg_set_int(&req, TXP_F_BRANCH_ID, branch);
  txp_msg_set_int(&req, TXP_F_BRANCH_STATUS, status);
  int rc = txc_call(c, &req, &res, 5000);
  if (rc == 0) rc = res.code;
  txp_msg_clear(&req);
  txp_msg_clear(&res);
  return rc;
}

static int global_report(txc_t *c, const char *xid, int status) {
  txp_msg_t req, res;
  txp_msg_init(&req, TXP_MSG_GLOBAL_REPORT);
  txp_msg_set_str(&req, TXP_F_XID, xid);
  txp_msg_set_int(&req, TXP_F_GLOBAL_STATUS, status);
  int rc = txc_call(c, &req, &res, 5000);
  if (rc == 0) rc = res.code;
  txp_msg_clear(&req);
  txp_msg_clear(&res);
  return rc;
}

static int count_calls(txc_t *c, const txp_msg_t *req, txp_msg_t *res, void *arg) {
  (void)c;
  (void)req;
  (void)res;
  (*(int *)arg)++;
  return 0;
}

static long branch_status_of(int64_t branch) {
  char b[32];
  snprintf(b, sizeof(b), "%" PRId64, branch);
  return db_long(SQL_BRANCH_STATUS, b, NULL);
}

static void begin(txc_t *c, const char *idem, char *xid) {
  int rc = txc_begin(c, 30000, "authz", idem, xid);
  if (rc != 0) fail_msg("GlobalBegin: %s (%d)", txp_errname(rc), rc);
}

static int64_t register_branch(txc_t *c, const char *xid, const char *keys) {
  int64_t branch = 0;
  int rc = txc_branch_register(c, xid, "r_stock", keys, 0, &branch, NULL);
  if (rc != 0) fail_msg("BranchRegister: %s (%d)", txp_errname(rc), rc);
  return branch;
}

static bool serving(const tcd_proc_t *t, void *arg) {
  (void)arg;
  char err[64];
  txc_t *c = txc_connect(HOST, t->port, 200, err, sizeof(err));
  if (!c) return false;
  bool ok = txc_register(c, false, "audit-svc", "probe", S_AUDIT, NULL) == 0;
  txc_close(c);
  return ok;
}

static int start_tcd(const char *token) {
  static char env_creds[400];
  snprintf(env_creds, sizeof(env_creds), "TC_SERVER_CREDENTIALS_FILE=%s", g_creds);
  static const char *env[4];
  env[0] = env_creds;
  env[1] = "TC_RECOVERY_INTERVAL_MS=200";
  env[2] = NULL;
  static char log[320];
  snprintf(log, sizeof(log), "%s/tcd.log", g_dir);
  tcd_opts_t o = {.token = token, .log_level = "info", .env = env, .attempts = 5, .ready = serving, .log = log};
  if (tcd_proc_start(&g_tcd, &o) != 0) return -1;
  rmsim_set_port(g_rm, g_tcd.port);
  return 0;
}

/* --------------------------------------------------------------- setup */

static int group_setup(void **state) {
  (void)state;
  snprintf(g_dir, sizeof(g_dir), "%s/tcd-authz.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
  if (!mkdtemp(g_dir)) return -1;
  snprintf(g_creds, sizeof(g_creds), "%s/credentials", g_dir);
  write_creds(CREDS, 0600);
  const char *url = getenv("TC_PG_URL");
  g_pg = url ? PQconnectdb(url) : NULL;
  if (!g_pg || PQstatus(g_pg) != CONNECTION_OK) {
    fprintf(stderr, "test_tcd_authz: TC_PG_URL unset or unreachable\n");
    return -1;
  }
  g_rm = rmsim_new("test-rm-1", "r_stock", S_RM, 0);
  if (!g_rm || start_tcd(NULL) != 0) return -1;
  return rmsim_start(g_rm, 10000);
}

static int group_teardown(void **state) {
  (void)state;
  rmsim_free(g_rm);
  int st = tcd_proc_stop(&g_tcd, 10000);
  int san = tcd_proc_print_log(&g_tcd, stderr);
  PQfinish(g_pg);
  unlink(g_creds);
  unlink(g_tcd.log);
  rmdir(g_dir);
  /* A clean stop: no sanitizer report, no leak. */
  return st == 0 && san == 0 ? 0 : -1;
}

static int test_teardown(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof(g_open) / sizeof(g_open[0]); i++) {
    if (g_open[i]) txc_close(g_open[i]);
    g_open[i] = NULL;
  }
  return 0;
}

/* --------------------------------------------------------------- tests */

/* Each application authenticates with its own secret; another's secret,
 * an unknown application, an empty or prefix secret are refused. */
static void test_wrong_credential_refused(void **state) {
  (void)state;
  struct {
    const char *app, *secret;
    int want;
  } cases[] = {
    {"stock-svc", S_STOCK, 0},
    {"stock-svc", S_ORDER, TXP_EAUTH},  /* another application's secret */
    {"evil", S_STOCK, TXP_EAUTH},
    {"order-svc", "order-svc-secret", TXP_EAUTH}, /* a prefix */
    {"order-svc", S_ORDER "x", TXP_EAUTH},        /* longer */
    {"nobody", S_ORDER, TXP_EAUTH},               /* not listed */
    {"", S_ORDER, TXP_EAUTH},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    for (int rm = 0; rm < 2; rm++) {
      txc_t *c = open_conn();
      int rc = txc_register(c, rm, cases[i].app, "authz-probe", cases[i].secret, rm ? "r_x" : NULL);
      if (rc != cases[i].want)
        fail_msg("Register%s \"%s\" case %zu: got %s, want %s", rm ? "RM" : "TM", cases[i].app, i,
                 txp_errname(rc), txp_errname(cases[i].want));
    }
  }
  assert_true(tcd_proc_log_has(&g_tcd, "wrong secret for the application"));
  assert_true(tcd_proc_log_has(&g_tcd, "unknown application"));
}

/* The reviewer's t2.py with a credential of its own: the attacker (another
 * group) can neither report, register, roll back, commit nor read the
 * victim's transaction; the victim's group works as before: order-svc
 * begins, stock-svc registers and reports, order-svc commits. */
static void test_foreign_app_refused(void **state) {
  (void)state;
  txc_t *tm = app_conn(false, "order-svc", S_ORDER);
  txc_t *rm = app_conn(true, "stock-svc", S_STOCK);
  txc_t *evil = app_conn(false, "evil", S_EVIL);
  txc_t *evil_rm = app_conn(true, "evil", S_EVIL);
  /* A rogue RM that claims the branch's resource and client id. */
  txc_t *rogue = open_conn();
  assert_int_equal(txc_register(rogue, true, "evil", "stock-svc-rm", S_EVIL, "r_stock"), 0);
  int rogue_calls = 0;
  txc_set_handler(rogue, count_calls, &rogue_calls);
  char xid[TXP_MAX_XID_LEN + 1];
  begin(tm, NULL, xid);
  int64_t br = register_branch(rm, xid, "t_authz:1");
  long before = branch_status_of(br);

  /* the foreign branch report */
  assert_int_equal(report(evil_rm, xid, br, TXP_BS_PHASE1_FAILED), TXP_ENOT_OWNER);
  assert_int_equal(report(evil, xid, br, TXP_BS_PHASE1_FAILED), TXP_ENOT_OWNER);
  assert_int_equal(branch_status_of(br), before);
  /* a foreign branch into the victim's transaction */
  int64_t b2 = 0;
  assert_int_equal(txc_branch_register(evil_rm, xid, "r_stock", "t_authz:2", 0, &b2, NULL), TXP_ENOT_OWNER);
  assert_int_equal(db_long(SQL_BRANCHES, xid, NULL), 1);
  /* the foreign rollback, commit, report and status */
  int status = -1;
  assert_int_equal(txc_rollback(evil, xid, &status), TXP_ENOT_OWNER);
  assert_int_equal(txc_commit(evil, xid, &status), TXP_ENOT_OWNER);
  assert_int_equal(global_report(evil, xid, TXP_GS_ROLLBACKED), TXP_ENOT_OWNER);
  assert_int_equal(txc_status(evil, xid, &status), TXP_ENOT_OWNER);
  assert_int_equal(db_long(SQL_STATUS, xid, NULL), TXP_GS_BEGIN);

  /* The legitimate group: stock-svc reports its own branch, order-svc
   * commits and may read the outcome. */
  assert_int_equal(report(rm, xid, br, TXP_BS_PHASE1_DONE), 0);
  assert_int_equal(branch_status_of(br), TXP_BS_PHASE1_DONE);
  assert_int_equal(txc_commit(tm, xid, &status), 0);
  assert_int_equal(status, TXP_GS_COMMITTED);
  /* Phase two went to the group's RM, not to the rogue. */
  bool delivered = false;
  for (int i = 0; i < 500 && !delivered; i++) {
    delivered = rmsim_events(g_rm, xid, TXP_MSG_BRANCH_COMMIT, 0, NULL, 0) > 0;
    if (!delivered) usleep(10000);
  }
  assert_true(delivered);
  txc_poll(rogue, 100, false);
  assert_int_equal(rogue_calls, 0);
  assert_int_equal(txc_status(tm, xid, &status), 0);
  assert_true(status == TXP_GS_COMMITTED || status == TXP_GS_ASYNC_COMMITTING);
  /* Finished: still not the attacker's to read or decide. */
  assert_true(db_wait_long("SELECT count(*) FROM global_history WHERE xid = $1", xid, NULL, 1, 10000));
  assert_int_equal(txc_status(evil, xid, &status), TXP_ENOT_OWNER);
  assert_int_equal(txc_rollback(evil, xid, &status), TXP_ENOT_OWNER);
}

/* Within the group: only the RM that registered a branch reports it; a
 * participant (an application with a branch) may roll back, a member that
 * took no part may not. */
static void test_group_rules(void **state) {
  (void)state;
  txc_t *tm = app_conn(false, "order-svc", S_ORDER);
  txc_t *rm = app_conn(true, "stock-svc", S_STOCK);
  txc_t *audit = app_conn(false, "audit-svc", S_AUDIT);
  txc_t *audit_rm = app_conn(true, "audit-svc", S_AUDIT);
  /* the same application, another client id */
  txc_t *rm2 = open_conn();
  assert_int_equal(txc_register(rm2, true, "stock-svc", "stock-svc-other", S_STOCK, "r_nobody"), 0);

  char xid[TXP_MAX_XID_LEN + 1];
  begin(tm, NULL, xid);
  int64_t br = register_branch(rm, xid, "t_authz:10");
  assert_int_equal(report(audit_rm, xid, br, TXP_BS_PHASE1_FAILED), TXP_ENOT_OWNER);
  assert_int_equal(report(rm2, xid, br, TXP_BS_PHASE1_FAILED), TXP_ENOT_OWNER);
  assert_int_equal(branch_status_of(br), TXP_BS_REGISTERED);
  int status = -1;
  assert_int_equal(txc_commit(audit, xid, &status), TXP_ENOT_OWNER);
  assert_int_equal(txc_status(audit, xid, &status), TXP_ENOT_OWNER);
  /* audit-svc may register (same group) and then is a participant. */
  int64_t b2 = 0;
  assert_int_equal(txc_branch_register(audit_rm, xid, "r_stock", "t_authz:11", 0, &b2, NULL), 0);
  assert_int_equal(txc_status(audit, xid, &status), 0);
  assert_int_equal(status, TXP_GS_BEGIN);
  /* stock-svc, a participant, rolls back: test-rm answers phase two. */
  assert_int_equal(txc_rollback(rm, xid, &status), 0);
  assert_int_equal(status, TXP_GS_ROLLBACKED);
}

/* xid n+1 made from a seen xid n is no live xid: the nonce is random.
 * Neither the attacker nor the owner can act on the guess. */
static void test_guessed_xid(void **state) {
  (void)state;
  txc_t *tm = app_conn(false, "order-svc", S_ORDER);
  txc_t *evil = app_conn(false, "evil", S_EVIL);
  char x1[TXP_MAX_XID_LEN + 1], x2[TXP_MAX_XID_LEN + 1], node[TXP_XID_NODE_MAX + 1];
  begin(tm, NULL, x1);
  begin(tm, NULL, x2);
  int64_t id1, id2;
  uint64_t n1, n2;
  assert_int_equal(txp_xid_parse(x1, node, sizeof(node), &id1, &n1), 0);
  assert_int_equal(txp_xid_parse(x2, node, sizeof(node), &id2, &n2), 0);
  assert_true(n1 != n2);
  /* Guesses from x1: the next ids with x1's nonce, and the old format. */
  for (int64_t d = 1; d <= 8; d++) {
    char guess[TXP_MAX_XID_LEN + 1];
    assert_true(txp_xid_make(guess, sizeof(guess), node, id1 + d, n1) > 0);
    assert_string_not_equal(guess, x2);
    int status = -1;
    assert_int_equal(txc_commit(evil, guess, &status), TXP_EGLOBAL_NOT_FOUND);
    assert_int_equal(txc_rollback(tm, guess, &status), TXP_EGLOBAL_NOT_FOUND);
    snprintf(guess, sizeof(guess), "%s:%" PRId64, node, id1 + d);
    assert_int_equal(txc_rollback(evil, guess, &status), TXP_EGLOBAL_NOT_FOUND);
  }
  /* The real x2 is still live, and the attacker cannot touch it anyway. */
  int status = -1;
  assert_int_equal(txc_rollback(evil, x2, &status), TXP_ENOT_OWNER);
  assert_int_equal(db_long(SQL_STATUS, x2, NULL), TXP_GS_BEGIN);
  assert_int_equal(txc_rollback(tm, x1, &status), 0);
  assert_int_equal(txc_rollback(tm, x2, &status), 0);
}

/* An idempotency key is the application's: the same key from another
 * application begins another transaction. */
static void test_idem_key_per_app(void **state) {
  (void)state;
  txc_t *tm = app_conn(false, "order-svc", S_ORDER);
  txc_t *evil = app_conn(false, "evil", S_EVIL);
  char a[TXP_MAX_XID_LEN + 1], a2[TXP_MAX_XID_LEN + 1], e[TXP_MAX_XID_LEN + 1];
  begin(tm, "authz-order-1", a);
  begin(tm, "authz-order-1", a2);
  begin(evil, "authz-order-1", e);
  assert_string_equal(a, a2);
  assert_string_not_equal(a, e);
  int status = -1;
  assert_int_equal(txc_rollback(tm, a, &status), 0);
  assert_int_equal(txc_rollback(evil, e, &status), 0);
}

/* Rotation: a second secret for stock-svc, SIGHUP, both work; the old one
 * removed, SIGHUP, only the new one; a broken file keeps the old table. */
static void test_reload_rotates(void **state) {
  (void)state;
  char text[2048];
  snprintf(text, sizeof(text), "%sstock-svc shop " S_STOCK2 "\n", CREDS);
  write_creds(text, 0600);
  assert_int_equal(tcd_proc_signal(&g_tcd, SIGHUP), 0);
  txc_t *c = NULL;
  int rc = -1;
  for (int i = 0; i < 200 && rc != 0; i++) {
    c = open_conn();
    rc = txc_register(c, false, "stock-svc", "rot", S_STOCK2, NULL);
    if (rc != 0) usleep(20000);
  }
  assert_int_equal(rc, 0);
  assert_int_equal(txc_register(open_conn(), false, "stock-svc", "rot", S_STOCK, NULL), 0);
  /* The old secret goes. */
  snprintf(text, sizeof(text),
           "order-svc shop " S_ORDER "\nstock-svc shop " S_STOCK2 "\naudit-svc shop " S_AUDIT
           "\ntest-rm shop " S_RM "\nevil other " S_EVIL "\n");
  write_creds(text, 0600);
  assert_int_equal(tcd_proc_signal(&g_tcd, SIGHUP), 0);
  rc = 0;
  for (int i = 0; i < 200 && rc == 0; i++) {
    rc = txc_register(open_conn(), false, "stock-svc", "rot", S_STOCK, NULL);
    if (rc == 0) usleep(20000);
    test_teardown(NULL);
  }
  assert_int_equal(rc, TXP_EAUTH);
  assert_int_equal(txc_register(open_conn(), false, "stock-svc", "rot", S_STOCK2, NULL), 0);
  /* A file others may read is refused at reload; the table in use stays. */
  write_creds(CREDS, 0644);
  assert_int_equal(tcd_proc_signal(&g_tcd, SIGHUP), 0);
  for (int i = 0; i < 200 && !tcd_proc_log_has(&g_tcd, "could not reload the credentials"); i++) usleep(20000);
  assert_true(tcd_proc_log_has(&g_tcd, "could not reload the credentials"));
  assert_int_equal(txc_register(open_conn(), false, "stock-svc", "rot", S_STOCK2, NULL), 0);
  write_creds(CREDS, 0600);
  assert_int_equal(tcd_proc_signal(&g_tcd, SIGHUP), 0);
}

/* The legacy shared token: with a credentials file it admits only
 * applications that are not listed, into a group of their own; a holder of
 * it cannot pose as a listed application nor touch its transactions. */
static void test_legacy_token_group(void **state) {
  (void)state;
  assert_int_equal(tcd_proc_stop(&g_tcd, 10000), 0);
  assert_int_equal(start_tcd(LEGACY_TOKEN), 0);
  txc_t *tm = app_conn(false, "order-svc", S_ORDER);
  txc_t *old = open_conn();
  assert_int_equal(txc_register(old, false, "legacy-tool", "legacy", LEGACY_TOKEN, NULL), 0);
  assert_int_equal(txc_register(open_conn(), false, "order-svc", "fake", LEGACY_TOKEN, NULL), TXP_EAUTH);
  char xid[TXP_MAX_XID_LEN + 1], mine[TXP_MAX_XID_LEN + 1];
  begin(tm, NULL, xid);
  int status = -1;
  assert_int_equal(txc_rollback(old, xid, &status), TXP_ENOT_OWNER);
  begin(old, NULL, mine);
  assert_int_equal(txc_commit(old, mine, &status), 0);
  assert_int_equal(txc_rollback(tm, xid, &status), 0);
}

/* tcd refuses to start with a credentials file others can read. */
static void test_check_config_mode(void **state) {
  (void)state;
  write_creds(CREDS, 0640);
  char cmd[1024];
  const char *bin = getenv("TX_BIN_DIR");
  snprintf(cmd, sizeof(cmd),
           "env -u TC_SERVER_TOKEN TC_STORE_PG_URL=postgresql://x/y TC_SERVER_CREDENTIALS_FILE=%s "
           "%s/tcd --check-config 2>&1",
           g_creds, bin ? bin : ".");
  FILE *p = popen(cmd, "r");
  assert_non_null(p);
  char out[1024] = "";
  size_t n = fread(out, 1, sizeof(out) - 1, p);
  out[n] = '\0';
  int st = pclose(p);
  write_creds(CREDS, 0600);
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 78);
  assert_non_null(strstr(out, "chmod 600"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test_teardown(test_wrong_credential_refused, test_teardown),
    cmocka_unit_test_teardown(test_foreign_app_refused, test_teardown),
    cmocka_unit_test_teardown(test_group_rules, test_teardown),
    cmocka_unit_test_teardown(test_guessed_xid, test_teardown),
    cmocka_unit_test_teardown(test_idem_key_per_app, test_teardown),
    cmocka_unit_test_teardown(test_reload_rotates, test_teardown),
    cmocka_unit_test_teardown(test_check_config_mode, test_teardown),
    cmocka_unit_test_teardown(test_legacy_token_group, test_teardown),
  };
  return cmocka_run_group_tests_name("tcd_authz", tests, group_setup, group_teardown);
}
