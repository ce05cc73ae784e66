/*
 * test_fence.c - the fence's rules (rm-client/src/fence/rm_fence_rules.c):
 * every row state against a commit, a rollback and a phase one, the saga
 * step's rules (action and compensation), and the names.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "rm_fence.h"

static rm_fence_action_t decide(bool commit, int found, int *to, const char **why) {
  *to = -1;
  *why = "unset";
  return rm_fence_phase2(commit, found, to, why);
}

static void test_tried_runs_the_handler_once(void **state) {
  (void)state;
  int to;
  const char *why;
  assert_int_equal(decide(true, RM_FENCE_TRIED, &to, &why), RM_FENCE_RUN);
  assert_int_equal(to, RM_FENCE_CONFIRMED);
  assert_null(why);
  assert_int_equal(decide(false, RM_FENCE_TRIED, &to, &why), RM_FENCE_RUN);
  assert_int_equal(to, RM_FENCE_CANCELLED);
  assert_null(why);
}

static void test_duplicates_are_answered_from_the_row(void **state) {
  (void)state;
  int to;
  const char *why;
  /* A second confirm after a confirm, a second cancel after either kind of cancel: done, nothing written. */
  assert_int_equal(decide(true, RM_FENCE_CONFIRMED, &to, &why), RM_FENCE_DONE);
  assert_int_equal(to, RM_FENCE_NONE);
  assert_null(why);
  assert_int_equal(decide(false, RM_FENCE_CANCELLED, &to, &why), RM_FENCE_DONE);
  assert_int_equal(decide(false, RM_FENCE_CANCELLED_EMPTY, &to, &why), RM_FENCE_DONE);
  assert_int_equal(to, RM_FENCE_NONE);
}

static void test_empty_rollback_is_recorded(void **state) {
  (void)state;
  int to;
  const char *why;
  assert_int_equal(decide(false, RM_FENCE_NONE, &to, &why), RM_FENCE_RECORD);
  assert_int_equal(to, RM_FENCE_CANCELLED_EMPTY);
  assert_null(why);
}

static void test_confirm_without_try_retries(void **state) {
  (void)state;
  int to;
  const char *why;
  assert_int_equal(decide(true, RM_FENCE_NONE, &to, &why), RM_FENCE_RETRY);
  assert_int_equal(to, RM_FENCE_NONE);
  assert_non_null(why);
  assert_non_null(strstr(why, "retried"));
}

static void test_contradictions_are_refused(void **state) {
  (void)state;
  int to;
  const char *why;
  assert_int_equal(decide(false, RM_FENCE_CONFIRMED, &to, &why), RM_FENCE_REFUSE);
  assert_non_null(strstr(why, "committed (confirmed)"));
  assert_int_equal(decide(true, RM_FENCE_CANCELLED, &to, &why), RM_FENCE_REFUSE);
  assert_non_null(strstr(why, "cancelled"));
  assert_int_equal(decide(true, RM_FENCE_CANCELLED_EMPTY, &to, &why), RM_FENCE_REFUSE);
  assert_non_null(strstr(why, "before its try"));
  /* A status a newer library may write. */
  assert_int_equal(decide(true, 9, &to, &why), RM_FENCE_REFUSE);
  assert_int_equal(decide(false, -3, &to, &why), RM_FENCE_REFUSE);
  assert_int_equal(to, RM_FENCE_NONE);
}

static void test_try(void **state) {
  (void)state;
  const char *why = "unset";
  assert_true(rm_fence_first_ok(RM_FENCE_NONE, &why));
  assert_null(why);
  /* Anti-hanging: the row of an empty rollback refuses the late try. */
  assert_false(rm_fence_first_ok(RM_FENCE_CANCELLED_EMPTY, &why));
  assert_non_null(strstr(why, "anti-hanging"));
  int others[] = {RM_FENCE_TRIED, RM_FENCE_CONFIRMED, RM_FENCE_CANCELLED, 17};
  for (size_t i = 0; i < sizeof(others) / sizeof(others[0]); i++) {
    why = NULL;
    assert_false(rm_fence_first_ok(others[i], &why));
    assert_non_null(why);
  }
}

/* Every state a row can be in is decided for both directions, and the
 * only ones that run a handler start from TRIED. */
static void test_only_tried_runs(void **state) {
  (void)state;
  for (int s = RM_FENCE_NONE; s <= RM_FENCE_CANCELLED_EMPTY; s++) {
    for (int commit = 0; commit <= 1; commit++) {
      int to;
      const char *why;
      rm_fence_action_t a = decide(commit, s, &to, &why);
      assert_true(a == RM_FENCE_RUN || a == RM_FENCE_DONE || a == RM_FENCE_RECORD || a == RM_FENCE_RETRY ||
                  a == RM_FENCE_REFUSE);
      assert_int_equal(a == RM_FENCE_RUN, s == RM_FENCE_TRIED);
      if (a == RM_FENCE_RETRY || a == RM_FENCE_REFUSE) assert_non_null(why);
      if (a == RM_FENCE_RUN || a == RM_FENCE_RECORD) assert_true(to >= RM_FENCE_CONFIRMED);
    }
  }
}

/* ------------------------------------------------------------ saga steps */

static rm_fence_action_t saga(bool action, int found, int *to, const char **why) {
  *to = -1;
  *why = "unset";
  return rm_fence_saga(action, found, to, why);
}

static void test_saga_action_runs_once(void **state) {
  (void)state;
  int to;
  const char *why;
  /* No row: the action runs and writes CONFIRMED; a second one is a duplicate. */
  assert_int_equal(saga(true, RM_FENCE_NONE, &to, &why), RM_FENCE_RUN);
  assert_int_equal(to, RM_FENCE_CONFIRMED);
  assert_null(why);
  assert_int_equal(saga(true, RM_FENCE_CONFIRMED, &to, &why), RM_FENCE_DONE);
  assert_int_equal(to, RM_FENCE_NONE);
}

static void test_saga_compensation(void **state) {
  (void)state;
  int to;
  const char *why;
  /* After the action: the compensation runs, once. */
  assert_int_equal(saga(false, RM_FENCE_CONFIRMED, &to, &why), RM_FENCE_RUN);
  assert_int_equal(to, RM_FENCE_CANCELLED);
  assert_int_equal(saga(false, RM_FENCE_CANCELLED, &to, &why), RM_FENCE_DONE);
  /* No action committed (it failed, or never came): an empty compensation, recorded, no handler. */
  assert_int_equal(saga(false, RM_FENCE_NONE, &to, &why), RM_FENCE_RECORD);
  assert_int_equal(to, RM_FENCE_CANCELLED_EMPTY);
  assert_int_equal(saga(false, RM_FENCE_CANCELLED_EMPTY, &to, &why), RM_FENCE_DONE);
}

static void test_saga_late_action_refused(void **state) {
  (void)state;
  int to;
  const char *why;
  assert_int_equal(saga(true, RM_FENCE_CANCELLED_EMPTY, &to, &why), RM_FENCE_REFUSE);
  assert_non_null(strstr(why, "anti-hanging"));
  assert_int_equal(saga(true, RM_FENCE_CANCELLED, &to, &why), RM_FENCE_REFUSE);
  /* TRIED is never committed by a step; unknown statuses are refused both ways. */
  for (int commit = 0; commit <= 1; commit++) {
    assert_int_equal(saga(commit, RM_FENCE_TRIED, &to, &why), RM_FENCE_REFUSE);
    assert_int_equal(saga(commit, 11, &to, &why), RM_FENCE_REFUSE);
    assert_non_null(why);
  }
  /* A step never answers "retry" from its row: nothing is in flight that a retry waits for. */
  for (int s = RM_FENCE_NONE; s <= RM_FENCE_CANCELLED_EMPTY; s++)
    for (int commit = 0; commit <= 1; commit++) assert_int_not_equal(saga(commit, s, &to, &why), RM_FENCE_RETRY);
}

static void test_names(void **state) {
  (void)state;
  static const struct {
    int status;
    const char *name;
  } names[] = {
    {RM_FENCE_NONE, "none"},
    {RM_FENCE_TRIED, "tried"},
    {RM_FENCE_CONFIRMED, "confirmed"},
    {RM_FENCE_CANCELLED, "cancelled"},
    {RM_FENCE_CANCELLED_EMPTY, "cancelled before any try"},
    {99, "unknown"},
  };
  for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
    assert_string_equal(rm_fence_status_name(names[i].status), names[i].name);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_tried_runs_the_handler_once),
    cmocka_unit_test(test_duplicates_are_answered_from_the_row),
    cmocka_unit_test(test_empty_rollback_is_recorded),
    cmocka_unit_test(test_confirm_without_try_retries),
    cmocka_unit_test(test_contradictions_are_refused),
    cmocka_unit_test(test_try),
    cmocka_unit_test(test_only_tried_runs),
    cmocka_unit_test(test_saga_action_runs_once),
    cmocka_unit_test(test_saga_compensation),
    cmocka_unit_test(test_saga_late_action_refused),
    cmocka_unit_test(test_names),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
