/*
 * test_failpoint.c - the failpoint spec language and arming rules
 * (common/txc_failpoint.h): validation, all-or-nothing arming, the Nth-hit
 * count, one-shot firing, the listing.  Only the "trace" action fires here
 * (abort and stop would end or stop the test).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "txc_failpoint.h"

static char err[512];

static void disarm_all(void) {
  for (const char *const *n = txc_failpoint_names; *n; n++) {
    char spec[128];
    snprintf(spec, sizeof(spec), "%s=off", *n);
    assert_int_equal(txc_failpoint_arm(spec, err, sizeof(err)), 0);
  }
}

static int setup(void **state) {
  (void)state;
  disarm_all();
  return 0;
}

static void refuses_bad_specs(void **state) {
  (void)state;
  static const struct {
    const char *spec, *why;
  } bad[] = {
    {"", "empty"},
    {"tc.begin.after_store", "expected name=action"},
    {"tc.begin.after_storex=abort", "unknown failpoint"},
    {"nope=abort", "unknown failpoint"},
    {"tc.begin.after_store=explode", "unknown action"},
    {"tc.begin.after_store=abort@", "hit count"},
    {"tc.begin.after_store=abort@0", "hit count"},
    {"tc.begin.after_store=abort@-1", "hit count"},
    {"tc.begin.after_store=abort@2x", "hit count"},
    {"tc.begin.after_store=abort@99999999999999999999", "hit count"},
    {"tc.begin.after_store=abort,", "ends with a comma"},
    {",tc.begin.after_store=abort", "empty element"},
    {"tc.begin.after_store=abort,,rm.at.after_register=stop", "empty element"},
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    err[0] = '\0';
    assert_int_equal(txc_failpoint_check(bad[i].spec, err, sizeof(err)), -1);
    if (!strstr(err, bad[i].why)) fail_msg("spec \"%s\": error \"%s\" lacks \"%s\"", bad[i].spec, err, bad[i].why);
    assert_int_equal(txc_failpoint_arm(bad[i].spec, err, sizeof(err)), -1);
  }
  char big[TXC_FAILPOINT_MAX_SPEC + 32];
  memset(big, 'a', sizeof(big) - 1);
  big[sizeof(big) - 1] = '\0';
  assert_int_equal(txc_failpoint_check(big, err, sizeof(err)), -1);
  assert_non_null(strstr(err, "limit"));
  assert_int_equal(txc_failpoint_check(NULL, err, sizeof(err)), -1);
}

static void fires_on_the_nth_hit_once(void **state) {
  (void)state;
  assert_int_equal(txc_failpoint_arm("tc.commit.after_decision=trace@3", err, sizeof(err)), 0);
  assert_int_equal(txc_failpoint_hit("tc.commit.after_decision"), TXC_FP_OFF);
  assert_int_equal(txc_failpoint_hit("tc.rollback.after_decision"), TXC_FP_OFF); /* other points */
  assert_int_equal(txc_failpoint_hit("tc.commit.after_decision"), TXC_FP_OFF);
  assert_int_equal(txc_failpoint_hit("tc.commit.after_decision"), TXC_FP_TRACE);
  /* one-shot: disarmed after firing */
  for (int i = 0; i < 5; i++) assert_int_equal(txc_failpoint_hit("tc.commit.after_decision"), TXC_FP_OFF);
  /* re-arming starts a new count */
  assert_int_equal(txc_failpoint_arm("tc.commit.after_decision=trace", err, sizeof(err)), 0);
  assert_int_equal(txc_failpoint_hit("tc.commit.after_decision"), TXC_FP_TRACE);
}

static void arming_is_all_or_nothing(void **state) {
  (void)state;
  assert_int_equal(txc_failpoint_arm("tc.begin.after_store=trace,bogus.point=abort", err, sizeof(err)), -1);
  assert_int_equal(txc_failpoint_hit("tc.begin.after_store"), TXC_FP_OFF);
  /* a valid list arms every element; the last one of a name wins */
  assert_int_equal(txc_failpoint_arm("tc.begin.after_store=trace@2,rm.at.after_register=trace,"
                                     "tc.begin.after_store=trace", err, sizeof(err)), 0);
  assert_int_equal(txc_failpoint_hit("rm.at.after_register"), TXC_FP_TRACE);
  assert_int_equal(txc_failpoint_hit("tc.begin.after_store"), TXC_FP_TRACE);
}

/* "fail" is returned to the point (TXC_FAILPOINT_FAILS), once, on the Nth hit. */
static void fail_is_returned_once(void **state) {
  (void)state;
  assert_int_equal(txc_failpoint_arm("tc.store.decide.reply_lost=fail@2", err, sizeof(err)), 0);
  assert_int_equal(txc_failpoint_hit("tc.store.decide.reply_lost"), TXC_FP_OFF);
  assert_int_equal(txc_failpoint_hit("tc.store.decide.reply_lost"), TXC_FP_FAIL);
  assert_int_equal(txc_failpoint_hit("tc.store.decide.reply_lost"), TXC_FP_OFF);
  char out[2048];
  txc_failpoint_list(out, sizeof(out));
  assert_non_null(strstr(out, "tc.store.decide.reply_lost off 0\n"));
  assert_int_equal(txc_failpoint_arm("tc.store.begin.aborted=fail@4", err, sizeof(err)), 0);
  txc_failpoint_list(out, sizeof(out));
  assert_non_null(strstr(out, "tc.store.begin.aborted fail 4\n"));
  assert_int_equal(txc_failpoint_arm("tc.store.begin.aborted=off", err, sizeof(err)), 0);
}

static void off_disarms(void **state) {
  (void)state;
  assert_int_equal(txc_failpoint_arm("tc.phase2.after_acks=trace", err, sizeof(err)), 0);
  assert_int_equal(txc_failpoint_arm("tc.phase2.after_acks=off", err, sizeof(err)), 0);
  assert_int_equal(txc_failpoint_hit("tc.phase2.after_acks"), TXC_FP_OFF);
  assert_int_equal(txc_failpoint_hit("not.a.registered.point"), TXC_FP_OFF);
}

static void lists_every_point(void **state) {
  (void)state;
  assert_int_equal(txc_failpoint_arm("rm.at.after_local_commit=trace@7", err, sizeof(err)), 0);
  char out[2048];
  size_t len = txc_failpoint_list(out, sizeof(out));
  assert_int_equal(len, strlen(out));
  size_t lines = 0;
  for (const char *p = out; *p; p++) lines += *p == '\n';
  size_t npoints = 0;
  for (const char *const *n = txc_failpoint_names; *n; n++) npoints++;
  assert_int_equal(lines, npoints);
  assert_non_null(strstr(out, "rm.at.after_local_commit trace 7\n"));
  assert_non_null(strstr(out, "tc.begin.after_store off 0\n"));
  /* truncation keeps a terminated string */
  char tiny[10];
  len = txc_failpoint_list(tiny, sizeof(tiny));
  assert_true(len < sizeof(tiny));
  assert_int_equal(strlen(tiny), len);
}

static void env_arming(void **state) {
  (void)state;
  unsetenv("TX_FAILPOINTS");
  assert_int_equal(txc_failpoint_arm_env(err, sizeof(err)), 0);
  setenv("TX_FAILPOINTS", "tc.register.after_store=trace", 1);
  if (txc_failpoint_compiled()) {
    assert_int_equal(txc_failpoint_arm_env(err, sizeof(err)), 0);
    assert_int_equal(txc_failpoint_hit("tc.register.after_store"), TXC_FP_TRACE);
    setenv("TX_FAILPOINTS", "tc.register.after_store=bogus", 1);
    assert_int_equal(txc_failpoint_arm_env(err, sizeof(err)), -1);
  } else {
    /* a build without the points refuses instead of running without the fault */
    assert_int_equal(txc_failpoint_arm_env(err, sizeof(err)), -1);
    assert_non_null(strstr(err, "TX_FAILPOINTS=ON"));
  }
  unsetenv("TX_FAILPOINTS");
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup(refuses_bad_specs, setup),
    cmocka_unit_test_setup(fires_on_the_nth_hit_once, setup),
    cmocka_unit_test_setup(arming_is_all_or_nothing, setup),
    cmocka_unit_test_setup(fail_is_returned_once, setup),
    cmocka_unit_test_setup(off_disarms, setup),
    cmocka_unit_test_setup(lists_every_point, setup),
    cmocka_unit_test_setup(env_arming, setup),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
