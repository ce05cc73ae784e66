/*
 * test_svc_common.c - svc_common's CPU count: the services size their
 * pools by the CPUs they may run on (taskset, a container's cpuset), not
 * by the machine's.
 */
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "svc_common.h"

static void test_ncpu_follows_affinity(void **state) {
  (void)state;
  cpu_set_t all, one;
  assert_int_equal(sched_getaffinity(0, sizeof(all), &all), 0);
  assert_int_equal(svc_ncpu(), CPU_COUNT(&all));
  int first = 0;
  while (!CPU_ISSET(first, &all)) first++;
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  assert_int_equal(sched_setaffinity(0, sizeof(one), &one), 0);
  int pinned = svc_ncpu();
  assert_int_equal(sched_setaffinity(0, sizeof(all), &all), 0); /* back before any assertion can end the case */
  assert_int_equal(pinned, 1);
  assert_int_equal(svc_ncpu(), CPU_COUNT(&all));
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_ncpu_follows_affinity),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
