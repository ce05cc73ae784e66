/*
 * test_proto_status.c - status names, classes and transition tables
 * (txp_status.h) and the error table (txp_errno.h).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "txp_errno.h"
#include "txp_status.h"

#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

/* ------------------------------------------------------------ expectations */

/* Every valid global status with its operator-visible name; the numbers are
 * stored and sent on the wire, so they are pinned here too. */
static const struct {
  int value;
  const char *name;
} global_expect[] = {
  {1, "Begin"},
  {2, "Committing"},
  {3, "CommitRetrying"},
  {4, "Rollbacking"},
  {5, "RollbackRetrying"},
  {6, "TimeoutRollbacking"},
  {7, "TimeoutRollbackRetrying"},
  {8, "AsyncCommitting"},
  {9, "Committed"},
  {10, "CommitFailed"},
  {11, "Rollbacked"},
  {12, "TimeoutRollbacked"},
  {13, "RollbackFailed"},
  {14, "TimeoutRollbackFailed"},
  {15, "Finished"},
  {19, "StopCommitRetry"},
  {20, "StopRollbackRetry"},
};

static const struct {
  int value;
  const char *name;
} branch_expect[] = {
  {1, "Registered"},
  {2, "PhaseOneDone"},
  {3, "PhaseOneFailed"},
  {4, "PhaseOneTimeout"},
  {5, "PhaseTwoCommitted"},
  {6, "PhaseTwoCommitFailedRetryable"},
  {7, "PhaseTwoCommitFailedUnretryable"},
  {8, "PhaseTwoRollbacked"},
  {9, "PhaseTwoRollbackFailedRetryable"},
  {10, "PhaseTwoRollbackFailedUnretryable"},
  {13, "StopRetry"},
};

/* Range scanned by the exhaustive loops: well past both enums, and below. */
#define SCAN_LO (-3)
#define SCAN_HI 40

static bool in_global_expect(int s) {
  for (size_t i = 0; i < NELEM(global_expect); i++)
    if (global_expect[i].value == s) return true;
  return false;
}

static bool in_branch_expect(int s) {
  for (size_t i = 0; i < NELEM(branch_expect); i++)
    if (branch_expect[i].value == s) return true;
  return false;
}

/* Branch families (the branch API has no classifier; this is the test's). */
static bool branch_is_commit(int s) {
  return s == TXP_BS_PHASE2_COMMITTED || s == TXP_BS_PHASE2_COMMIT_FAILED_RETRYABLE ||
         s == TXP_BS_PHASE2_COMMIT_FAILED_UNRETRYABLE;
}

static bool branch_is_rollback(int s) {
  return s == TXP_BS_PHASE2_ROLLBACKED || s == TXP_BS_PHASE2_ROLLBACK_FAILED_RETRYABLE ||
         s == TXP_BS_PHASE2_ROLLBACK_FAILED_UNRETRYABLE;
}

/* ------------------------------------------------------------------ names */

static void test_global_names_roundtrip(void **state) {
  (void)state;
  for (size_t i = 0; i < NELEM(global_expect); i++) {
    int v = global_expect[i].value;
    const char *name = txp_global_status_name(v);
    assert_string_equal(name, global_expect[i].name);
    assert_true(txp_global_status_valid(v));
    assert_int_equal(txp_global_status_parse(name), v);
    /* case-insensitive */
    char buf[64];
    size_t n = strlen(name);
    assert_true(n < sizeof(buf));
    for (size_t k = 0; k <= n; k++)
      buf[k] = (char)((name[k] >= 'a' && name[k] <= 'z') ? name[k] - 32 : name[k]);
    assert_int_equal(txp_global_status_parse(buf), v);
    for (size_t k = 0; k <= n; k++)
      buf[k] = (char)((name[k] >= 'A' && name[k] <= 'Z') ? name[k] + 32 : name[k]);
    assert_int_equal(txp_global_status_parse(buf), v);
  }
  /* Every value the API calls valid is in the table above. */
  int nvalid = 0;
  for (int s = SCAN_LO; s <= SCAN_HI; s++)
    if (txp_global_status_valid(s)) {
      assert_true(in_global_expect(s));
      nvalid++;
    }
  assert_int_equal(nvalid, (int)NELEM(global_expect));
}

static void test_branch_names_roundtrip(void **state) {
  (void)state;
  for (size_t i = 0; i < NELEM(branch_expect); i++) {
    int v = branch_expect[i].value;
    const char *name = txp_branch_status_name(v);
    assert_string_equal(name, branch_expect[i].name);
    assert_true(txp_branch_status_valid(v));
    assert_int_equal(txp_branch_status_parse(name), v);
  }
  assert_int_equal(txp_branch_status_parse("phasetwocommitted"), TXP_BS_PHASE2_COMMITTED);
  assert_int_equal(txp_branch_status_parse("STOPRETRY"), TXP_BS_STOP_RETRY);
  int nvalid = 0;
  for (int s = SCAN_LO; s <= SCAN_HI; s++)
    if (txp_branch_status_valid(s)) {
      assert_true(in_branch_expect(s));
      nvalid++;
    }
  assert_int_equal(nvalid, (int)NELEM(branch_expect));
}

static void test_branch_type_names(void **state) {
  (void)state;
  assert_string_equal(txp_branch_type_name(TXP_BT_AT), "AT");
  assert_string_equal(txp_branch_type_name(TXP_BT_TCC), "TCC");
  assert_string_equal(txp_branch_type_name(TXP_BT_SAGA), "SAGA");
  assert_string_equal(txp_branch_type_name(TXP_BT_XA), "XA");
  assert_string_equal(txp_branch_type_name(TXP_BT__MAX), "Unknown");
  assert_string_equal(txp_branch_type_name(-1), "Unknown");
  assert_string_equal(txp_branch_type_name(1000), "Unknown");
}

static void test_invalid_values(void **state) {
  (void)state;
  static const int bad_global[] = {0, -1, 16, 17, 18, 21, 22, 100, INT32_MIN, INT32_MAX};
  for (size_t i = 0; i < NELEM(bad_global); i++) {
    int s = bad_global[i];
    assert_false(txp_global_status_valid(s));
    assert_string_equal(txp_global_status_name(s), "Unknown");
    assert_false(txp_global_status_final(s));
    assert_false(txp_global_status_needs_operator(s));
    assert_false(txp_global_status_is_commit(s));
    assert_false(txp_global_status_is_rollback(s));
  }
  static const int bad_branch[] = {0, -1, 11, 12, 14, 15, 100, INT32_MIN, INT32_MAX};
  for (size_t i = 0; i < NELEM(bad_branch); i++) {
    assert_false(txp_branch_status_valid(bad_branch[i]));
    assert_string_equal(txp_branch_status_name(bad_branch[i]), "Unknown");
  }
  /* "Unknown" is a name but not a parseable, valid status. */
  assert_int_equal(txp_global_status_parse("Unknown"), -1);
  assert_int_equal(txp_branch_status_parse("Unknown"), -1);
  assert_int_equal(txp_global_status_parse(NULL), -1);
  assert_int_equal(txp_branch_status_parse(NULL), -1);
  assert_int_equal(txp_global_status_parse(""), -1);
  assert_int_equal(txp_global_status_parse("Begin "), -1);
  assert_int_equal(txp_global_status_parse("Begi"), -1);
  assert_int_equal(txp_global_status_parse("Registered"), -1); /* a branch name */
  assert_int_equal(txp_branch_status_parse("Begin"), -1);      /* a global name */
  assert_int_equal(txp_branch_status_parse("PhaseTwoCommittedX"), -1);
}

/* ------------------------------------------------------------ transitions */

static void test_global_legal_transitions(void **state) {
  (void)state;
  static const int legal[][2] = {
    {TXP_GS_BEGIN, TXP_GS_COMMITTING},
    {TXP_GS_BEGIN, TXP_GS_ASYNC_COMMITTING},
    {TXP_GS_BEGIN, TXP_GS_ROLLBACKING},
    {TXP_GS_BEGIN, TXP_GS_TIMEOUT_ROLLBACKING},
    {TXP_GS_COMMITTING, TXP_GS_COMMITTED},
    {TXP_GS_COMMITTING, TXP_GS_COMMIT_RETRYING},
    {TXP_GS_ASYNC_COMMITTING, TXP_GS_COMMITTED},
    {TXP_GS_COMMIT_RETRYING, TXP_GS_COMMITTED},
    {TXP_GS_COMMIT_RETRYING, TXP_GS_STOP_COMMIT_RETRY},
    {TXP_GS_STOP_COMMIT_RETRY, TXP_GS_COMMIT_RETRYING},
    {TXP_GS_ROLLBACKING, TXP_GS_ROLLBACKED},
    {TXP_GS_ROLLBACKING, TXP_GS_ROLLBACK_RETRYING},
    {TXP_GS_ROLLBACK_RETRYING, TXP_GS_ROLLBACKED},
    {TXP_GS_ROLLBACK_RETRYING, TXP_GS_ROLLBACK_FAILED},
    {TXP_GS_ROLLBACK_RETRYING, TXP_GS_STOP_ROLLBACK_RETRY},
    {TXP_GS_STOP_ROLLBACK_RETRY, TXP_GS_ROLLBACK_RETRYING},
    {TXP_GS_TIMEOUT_ROLLBACKING, TXP_GS_TIMEOUT_ROLLBACK_RETRYING},
    {TXP_GS_TIMEOUT_ROLLBACKING, TXP_GS_TIMEOUT_ROLLBACKED},
    {TXP_GS_TIMEOUT_ROLLBACK_RETRYING, TXP_GS_TIMEOUT_ROLLBACKED},
    {TXP_GS_TIMEOUT_ROLLBACK_RETRYING, TXP_GS_TIMEOUT_ROLLBACK_FAILED},
    {TXP_GS_COMMITTED, TXP_GS_FINISHED},
    {TXP_GS_ROLLBACKED, TXP_GS_FINISHED},
    {TXP_GS_TIMEOUT_ROLLBACKED, TXP_GS_FINISHED},
  };
  for (size_t i = 0; i < NELEM(legal); i++) {
    if (!txp_global_transition_ok(legal[i][0], legal[i][1]))
      fail_msg("%s -> %s should be legal", txp_global_status_name(legal[i][0]),
               txp_global_status_name(legal[i][1]));
  }
}

static void test_global_illegal_transitions(void **state) {
  (void)state;
  static const int illegal[][2] = {
    {TXP_GS_COMMITTED, TXP_GS_ROLLBACKING},
    {TXP_GS_ROLLBACKED, TXP_GS_COMMITTING},
    {TXP_GS_BEGIN, TXP_GS_BEGIN},
    {TXP_GS_COMMITTING, TXP_GS_BEGIN},
    {TXP_GS_COMMITTING, TXP_GS_ROLLBACKING},
    {TXP_GS_ROLLBACKING, TXP_GS_COMMITTING},
    {TXP_GS_COMMITTED, TXP_GS_COMMITTING},
    {TXP_GS_FINISHED, TXP_GS_BEGIN},
    {TXP_GS_FINISHED, TXP_GS_COMMITTED},
    {TXP_GS_BEGIN, TXP_GS_FINISHED},
    {TXP_GS_COMMIT_FAILED, TXP_GS_FINISHED},
    {TXP_GS_ROLLBACK_FAILED, TXP_GS_FINISHED},
    {TXP_GS_UNKNOWN, TXP_GS_BEGIN},
    {TXP_GS_BEGIN, TXP_GS_UNKNOWN},
    {TXP_GS_BEGIN, 16},
    {16, TXP_GS_COMMITTING},
    {-1, TXP_GS_COMMITTING},
    {TXP_GS_BEGIN, 99},
  };
  for (size_t i = 0; i < NELEM(illegal); i++) {
    if (txp_global_transition_ok(illegal[i][0], illegal[i][1]))
      fail_msg("%d -> %d should be illegal", illegal[i][0], illegal[i][1]);
  }
  /* No self-edges, and nothing in or out of an invalid value. */
  for (int a = SCAN_LO; a <= SCAN_HI; a++) {
    assert_false(txp_global_transition_ok(a, a));
    for (int b = SCAN_LO; b <= SCAN_HI; b++)
      if (!txp_global_status_valid(a) || !txp_global_status_valid(b))
        assert_false(txp_global_transition_ok(a, b));
  }
}

/* The safety property of the table: a decision, once recorded, is never
 * contradicted.  No single edge crosses families, and (stronger) nothing
 * reachable from a commit-family status is rollback-family or vice versa. */
static void test_global_no_edge_crosses_families(void **state) {
  (void)state;
  int nedges = 0;
  for (int a = SCAN_LO; a <= SCAN_HI; a++)
    for (int b = SCAN_LO; b <= SCAN_HI; b++) {
      if (!txp_global_transition_ok(a, b)) continue;
      nedges++;
      if ((txp_global_status_is_commit(a) && txp_global_status_is_rollback(b)) ||
          (txp_global_status_is_rollback(a) && txp_global_status_is_commit(b)))
        fail_msg("edge %s -> %s crosses families", txp_global_status_name(a),
                 txp_global_status_name(b));
      /* No edge goes back to Begin, none leaves Finished. */
      assert_int_not_equal(b, TXP_GS_BEGIN);
      assert_int_not_equal(a, TXP_GS_FINISHED);
      /* Once decided, always decided. */
      if (txp_global_status_is_commit(a) || txp_global_status_is_rollback(a))
        assert_true(txp_global_status_is_commit(b) || txp_global_status_is_rollback(b) ||
                    b == TXP_GS_FINISHED);
    }
  assert_true(nedges > 20);

  /* Transitive closure (Floyd-Warshall over SCAN range). */
  enum { N = SCAN_HI + 1 };
  static bool reach[N][N];
  memset(reach, 0, sizeof(reach));
  for (int a = 0; a < N; a++)
    for (int b = 0; b < N; b++) reach[a][b] = txp_global_transition_ok(a, b);
  for (int k = 0; k < N; k++)
    for (int a = 0; a < N; a++)
      if (reach[a][k])
        for (int b = 0; b < N; b++)
          if (reach[k][b]) reach[a][b] = true;
  for (int a = 0; a < N; a++)
    for (int b = 0; b < N; b++) {
      if (!reach[a][b]) continue;
      if ((txp_global_status_is_commit(a) && txp_global_status_is_rollback(b)) ||
          (txp_global_status_is_rollback(a) && txp_global_status_is_commit(b)))
        fail_msg("path %s ->* %s crosses families", txp_global_status_name(a),
                 txp_global_status_name(b));
    }
  /* Sanity of the closure: Begin reaches both families and Finished. */
  assert_true(reach[TXP_GS_BEGIN][TXP_GS_COMMITTED]);
  assert_true(reach[TXP_GS_BEGIN][TXP_GS_ROLLBACK_FAILED]);
  assert_true(reach[TXP_GS_BEGIN][TXP_GS_FINISHED]);
  assert_true(reach[TXP_GS_STOP_COMMIT_RETRY][TXP_GS_COMMITTED]);
  assert_false(reach[TXP_GS_FINISHED][TXP_GS_FINISHED]);
}

static void test_branch_transitions(void **state) {
  (void)state;
  static const int legal[][2] = {
    {TXP_BS_REGISTERED, TXP_BS_PHASE1_DONE},
    {TXP_BS_REGISTERED, TXP_BS_PHASE1_FAILED},
    {TXP_BS_PHASE1_DONE, TXP_BS_PHASE2_COMMITTED},
    {TXP_BS_PHASE1_DONE, TXP_BS_PHASE2_ROLLBACKED},
    {TXP_BS_PHASE1_FAILED, TXP_BS_PHASE2_ROLLBACKED},
    {TXP_BS_PHASE2_COMMIT_FAILED_RETRYABLE, TXP_BS_PHASE2_COMMITTED},
    {TXP_BS_PHASE2_ROLLBACK_FAILED_RETRYABLE, TXP_BS_PHASE2_ROLLBACKED},
    {TXP_BS_PHASE2_COMMIT_FAILED_RETRYABLE, TXP_BS_STOP_RETRY},
  };
  for (size_t i = 0; i < NELEM(legal); i++)
    if (!txp_branch_transition_ok(legal[i][0], legal[i][1]))
      fail_msg("branch %s -> %s should be legal", txp_branch_status_name(legal[i][0]),
               txp_branch_status_name(legal[i][1]));
  static const int illegal[][2] = {
    {TXP_BS_PHASE2_COMMITTED, TXP_BS_PHASE2_ROLLBACKED},
    {TXP_BS_PHASE2_ROLLBACKED, TXP_BS_PHASE2_COMMITTED},
    {TXP_BS_PHASE1_FAILED, TXP_BS_PHASE2_COMMITTED}, /* failed phase one never commits */
    {TXP_BS_PHASE1_TIMEOUT, TXP_BS_PHASE2_COMMITTED},
    {TXP_BS_PHASE2_COMMITTED, TXP_BS_REGISTERED},
    {TXP_BS_PHASE1_DONE, TXP_BS_REGISTERED},
    {TXP_BS_UNKNOWN, TXP_BS_REGISTERED},
    {TXP_BS_REGISTERED, 11},
  };
  for (size_t i = 0; i < NELEM(illegal); i++)
    if (txp_branch_transition_ok(illegal[i][0], illegal[i][1]))
      fail_msg("branch %d -> %d should be illegal", illegal[i][0], illegal[i][1]);

  for (int a = SCAN_LO; a <= SCAN_HI; a++) {
    assert_false(txp_branch_transition_ok(a, a));
    for (int b = SCAN_LO; b <= SCAN_HI; b++) {
      if (!txp_branch_transition_ok(a, b)) continue;
      assert_true(txp_branch_status_valid(a) && txp_branch_status_valid(b));
      /* phase two outcomes are never undone */
      assert_int_not_equal(a, TXP_BS_PHASE2_COMMITTED);
      assert_int_not_equal(a, TXP_BS_PHASE2_ROLLBACKED);
      assert_int_not_equal(a, TXP_BS_PHASE2_COMMIT_FAILED_UNRETRYABLE);
      assert_int_not_equal(a, TXP_BS_PHASE2_ROLLBACK_FAILED_UNRETRYABLE);
      assert_int_not_equal(b, TXP_BS_REGISTERED);
      if ((branch_is_commit(a) && branch_is_rollback(b)) ||
          (branch_is_rollback(a) && branch_is_commit(b)))
        fail_msg("branch edge %s -> %s crosses families", txp_branch_status_name(a),
                 txp_branch_status_name(b));
    }
  }
}

/* ---------------------------------------------------------------- classes */

static void test_global_classes(void **state) {
  (void)state;
  static const int final_set[] = {TXP_GS_COMMITTED,          TXP_GS_COMMIT_FAILED,
                                  TXP_GS_ROLLBACKED,         TXP_GS_TIMEOUT_ROLLBACKED,
                                  TXP_GS_ROLLBACK_FAILED,    TXP_GS_TIMEOUT_ROLLBACK_FAILED,
                                  TXP_GS_FINISHED};
  static const int operator_set[] = {TXP_GS_COMMIT_FAILED, TXP_GS_ROLLBACK_FAILED,
                                     TXP_GS_TIMEOUT_ROLLBACK_FAILED, TXP_GS_STOP_COMMIT_RETRY,
                                     TXP_GS_STOP_ROLLBACK_RETRY};
  static const int commit_set[] = {TXP_GS_COMMITTING,    TXP_GS_COMMIT_RETRYING,
                                   TXP_GS_ASYNC_COMMITTING, TXP_GS_COMMITTED,
                                   TXP_GS_COMMIT_FAILED, TXP_GS_STOP_COMMIT_RETRY};
  static const int rollback_set[] = {
    TXP_GS_ROLLBACKING,         TXP_GS_ROLLBACK_RETRYING,       TXP_GS_TIMEOUT_ROLLBACKING,
    TXP_GS_TIMEOUT_ROLLBACK_RETRYING, TXP_GS_ROLLBACKED,        TXP_GS_TIMEOUT_ROLLBACKED,
    TXP_GS_ROLLBACK_FAILED,     TXP_GS_TIMEOUT_ROLLBACK_FAILED, TXP_GS_STOP_ROLLBACK_RETRY};

  for (int s = SCAN_LO; s <= SCAN_HI; s++) {
    bool f = false, o = false, c = false, r = false;
    for (size_t i = 0; i < NELEM(final_set); i++) f |= final_set[i] == s;
    for (size_t i = 0; i < NELEM(operator_set); i++) o |= operator_set[i] == s;
    for (size_t i = 0; i < NELEM(commit_set); i++) c |= commit_set[i] == s;
    for (size_t i = 0; i < NELEM(rollback_set); i++) r |= rollback_set[i] == s;
    if (txp_global_status_final(s) != f) fail_msg("final(%d)", s);
    if (txp_global_status_needs_operator(s) != o) fail_msg("needs_operator(%d)", s);
    if (txp_global_status_is_commit(s) != c) fail_msg("is_commit(%d)", s);
    if (txp_global_status_is_rollback(s) != r) fail_msg("is_rollback(%d)", s);
    assert_false(c && r); /* families are disjoint */
    /* Clean final statuses lead nowhere but Finished; the failed ones only
     * back into their own family (operator re-drive). */
    if (f && !o) {
      for (int b = SCAN_LO; b <= SCAN_HI; b++)
        if (txp_global_transition_ok(s, b)) assert_int_equal(b, TXP_GS_FINISHED);
    }
    /* Non-final valid statuses other than the operator stops all move on. */
    if (txp_global_status_valid(s) && !f) {
      int out = 0;
      for (int b = SCAN_LO; b <= SCAN_HI; b++) out += txp_global_transition_ok(s, b);
      assert_true(out > 0);
    }
  }
  assert_false(txp_global_status_final(TXP_GS_BEGIN));
  assert_false(txp_global_status_is_commit(TXP_GS_BEGIN));
  assert_false(txp_global_status_is_rollback(TXP_GS_BEGIN));
  assert_false(txp_global_status_is_commit(TXP_GS_FINISHED));
  assert_false(txp_global_status_is_rollback(TXP_GS_FINISHED));
}

/* ------------------------------------------------------------ error table */

static const struct {
  int code;
  const char *name;
  bool retryable;
} err_expect[] = {
#define ROW(name, val, retry, msg) {(val), #name, (retry)},
  TXP_ERRNO_MAP(ROW)
#undef ROW
};

static void test_error_table(void **state) {
  (void)state;
  assert_true(NELEM(err_expect) >= 38);
  for (size_t i = 0; i < NELEM(err_expect); i++) {
    int c = err_expect[i].code;
    assert_true(c <= -10000); /* never collides with libuv's -errno */
    assert_string_equal(txp_errname(c), err_expect[i].name);
    const char *msg = txp_strerror(c);
    assert_non_null(msg);
    assert_true(strlen(msg) > 0);
    assert_string_not_equal(msg, "unknown error");
    assert_string_not_equal(msg, "system error");
    assert_true(txp_err_known(c));
    assert_int_equal(txp_err_retryable(c), err_expect[i].retryable);
    /* codes and names are unique */
    for (size_t j = 0; j < i; j++) {
      assert_int_not_equal(err_expect[j].code, c);
      assert_string_not_equal(err_expect[j].name, err_expect[i].name);
    }
  }
  /* A few pinned by value (they travel on the wire). */
  assert_int_equal(TXP_EAGAIN, -10001);
  assert_int_equal(TXP_EBAD_MAGIC, -10002);
  assert_int_equal(TXP_EMALFORMED, -10005);
  assert_int_equal(TXP_ELOCK_CONFLICT, -10105);
  assert_int_equal(TXP_EUNKNOWN_OUTCOME, -10200);
  assert_int_equal(TXP_ENOT_SUPPORTED, -10204);
  assert_int_equal(TXP_EROLLBACK_PENDING, -10205);
  assert_int_equal(TXP_EROLLBACK_FAILED, -10206);
  assert_int_equal(TXP_ECOMMIT_FAILED, -10207);
  assert_string_equal(txp_errname(TXP_ELOCK_CONFLICT), "LOCK_CONFLICT");
  assert_string_equal(txp_strerror(TXP_ELOCK_CONFLICT), "global lock conflict");
  assert_string_equal(txp_strerror(TXP_EBAD_MAGIC), "bad frame magic");
}

static void test_error_retryable(void **state) {
  (void)state;
  assert_true(txp_err_retryable(TXP_ENOMEM));
  assert_true(txp_err_retryable(TXP_ELOCK_CONFLICT));
  assert_true(txp_err_retryable(TXP_ELOCK_WAIT_TIMEOUT));
  assert_true(txp_err_retryable(TXP_ESTORE));
  assert_true(txp_err_retryable(TXP_EBUSY));
  assert_true(txp_err_retryable(TXP_EUNKNOWN_OUTCOME));
  assert_true(txp_err_retryable(TXP_ECONN_LOST));
  assert_false(txp_err_retryable(TXP_EMALFORMED));
  assert_false(txp_err_retryable(TXP_EAUTH));
  assert_false(txp_err_retryable(TXP_EGLOBAL_NOT_FOUND));
  assert_false(txp_err_retryable(TXP_EBRANCH_UNRETRYABLE));
  assert_false(txp_err_retryable(TXP_EDIRTY_WRITE));
  assert_false(txp_err_retryable(0));
  assert_false(txp_err_retryable(-1));
  assert_false(txp_err_retryable(-10999));
}

static void test_error_unknown_codes(void **state) {
  (void)state;
  assert_string_equal(txp_strerror(0), "success");
  assert_string_equal(txp_errname(0), "OK");
  assert_true(txp_err_known(0));

  /* libuv-style -errno values pass through as "system error". */
  static const int sys[] = {-1, -4, -104, -4095};
  for (size_t i = 0; i < NELEM(sys); i++) {
    assert_string_equal(txp_strerror(sys[i]), "system error");
    assert_string_equal(txp_errname(sys[i]), "UNKNOWN");
    assert_false(txp_err_known(sys[i]));
  }
  static const int unk[] = {1, 42, -4096, -9999, -10000, -10015, -10099, -10120,
                            -10199, -10209, INT32_MIN, INT32_MAX, 10001};
  for (size_t i = 0; i < NELEM(unk); i++) {
    assert_string_equal(txp_strerror(unk[i]), "unknown error");
    assert_string_equal(txp_errname(unk[i]), "UNKNOWN");
    assert_false(txp_err_known(unk[i]));
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_global_names_roundtrip),
    cmocka_unit_test(test_branch_names_roundtrip),
    cmocka_unit_test(test_branch_type_names),
    cmocka_unit_test(test_invalid_values),
    cmocka_unit_test(test_global_legal_transitions),
    cmocka_unit_test(test_global_illegal_transitions),
    cmocka_unit_test(test_global_no_edge_crosses_families),
    cmocka_unit_test(test_branch_transitions),
    cmocka_unit_test(test_global_classes),
    cmocka_unit_test(test_error_table),
    cmocka_unit_test(test_error_retryable),
    cmocka_unit_test(test_error_unknown_codes),
  };
  return cmocka_run_group_tests_name("proto_status", tests, NULL, NULL);
}
