/*
 * test_tc_lockwait.c - lock-wait queues: FIFO wake-up, re-queueing,
 * deadlines, cancel, bound, shutdown.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>
#include <uv.h>

#include "tc_lockwait.h"

typedef struct {
  int order[16];
  int reasons[16];
  int n;
} log_t;

typedef struct {
  tc_waiter_t w;
  int id;
  log_t *log;
  const char *requeue_under; /* re-queue from the callback */
  tc_lockwait_t *lw;
} item_t;

static void on_wake(tc_waiter_t *w, int reason) {
  item_t *it = w->data;
  it->log->order[it->log->n] = it->id;
  it->log->reasons[it->log->n++] = reason;
  if (it->requeue_under && reason == 0) {
    snprintf(it->w.holder, sizeof(it->w.holder), "%s", it->requeue_under);
    it->requeue_under = NULL;
    it->w.met_ns = uv_hrtime() + 1; /* a conflict met after the release */
    assert_int_equal(tc_lockwait_add(it->lw, &it->w), 0);
  }
}

static void init_item(item_t *it, int id, const char *holder, uint64_t queued, uint64_t deadline_ms, log_t *log,
                      tc_lockwait_t *lw) {
  memset(it, 0, sizeof(*it));
  it->id = id;
  it->log = log;
  it->lw = lw;
  snprintf(it->w.holder, sizeof(it->w.holder), "%s", holder);
  it->w.first_queued_ns = queued;
  it->w.met_ns = uv_hrtime();
  it->w.deadline_ns = uv_hrtime() + deadline_ms * 1000000u;
  it->w.cb = on_wake;
  it->w.data = it;
}

static void closed(void *arg) { *(int *)arg = 1; }

/* Run 'loop' to its end: the close callback ran ('*done') and nothing is
 * left open on the loop. */
static void run_closed(uv_loop_t *loop, const int *done) {
  uv_run(loop, UV_RUN_DEFAULT);
  assert_int_equal(*done, 1);
  assert_int_equal(uv_loop_close(loop), 0);
}

/* Close 'lw' with nobody waiting, and check it closes cleanly. */
static void close_idle(uv_loop_t *loop, tc_lockwait_t *lw) {
  int done = 0;
  tc_lockwait_close(lw, closed, &done);
  run_closed(loop, &done);
}

static void test_fifo_release_and_requeue(void **state) {
  (void)state;
  uv_loop_t loop;
  uv_loop_init(&loop);
  tc_lockwait_t *lw = tc_lockwait_new(&loop, 10);
  log_t log = {0};
  item_t a, b, c, other;
  init_item(&a, 1, "X", 300, 10000, &log, lw);
  init_item(&b, 2, "X", 100, 10000, &log, lw); /* queued first although added second */
  init_item(&c, 3, "X", 200, 10000, &log, lw);
  init_item(&other, 4, "Y", 50, 10000, &log, lw);
  assert_int_equal(tc_lockwait_add(lw, &a.w), 0);
  assert_int_equal(tc_lockwait_add(lw, &b.w), 0);
  assert_int_equal(tc_lockwait_add(lw, &c.w), 0);
  assert_int_equal(tc_lockwait_add(lw, &other.w), 0);
  assert_int_equal(tc_lockwait_count(lw), 4);
  b.requeue_under = "X"; /* re-queues under the same holder: must not be woken twice */
  assert_int_equal(tc_lockwait_release(lw, "X"), 3);
  assert_int_equal(log.n, 3);
  assert_int_equal(log.order[0], 2);
  assert_int_equal(log.order[1], 3);
  assert_int_equal(log.order[2], 1);
  assert_int_equal(tc_lockwait_count(lw), 2); /* b again, and other */
  assert_int_equal(tc_lockwait_release(lw, "nobody"), 0);
  assert_int_equal(tc_lockwait_release(lw, "X"), 1);
  assert_int_equal(log.order[3], 2);
  tc_lockwait_cancel(lw, &other.w);
  assert_int_equal(tc_lockwait_count(lw), 0);
  assert_int_equal(tc_lockwait_release(lw, "Y"), 0);
  close_idle(&loop, lw);
}

static void test_deadline_and_bound(void **state) {
  (void)state;
  uv_loop_t loop;
  uv_loop_init(&loop);
  tc_lockwait_t *lw = tc_lockwait_new(&loop, 2);
  log_t log = {0};
  item_t a, b, c;
  init_item(&a, 1, "X", 1, 30, &log, lw);
  init_item(&b, 2, "X", 2, 60, &log, lw);
  init_item(&c, 3, "X", 3, 60, &log, lw);
  assert_int_equal(tc_lockwait_add(lw, &a.w), 0);
  assert_int_equal(tc_lockwait_add(lw, &b.w), 0);
  assert_int_equal(tc_lockwait_add(lw, &c.w), TXP_EBUSY); /* bound of 2 */
  uv_run(&loop, UV_RUN_DEFAULT);                          /* runs until both time out */
  assert_int_equal(log.n, 2);
  assert_int_equal(log.order[0], 1);
  assert_int_equal(log.reasons[0], TXP_ELOCK_WAIT_TIMEOUT);
  assert_int_equal(log.reasons[1], TXP_ELOCK_WAIT_TIMEOUT);
  assert_int_equal(tc_lockwait_count(lw), 0);
  close_idle(&loop, lw);
}

static void test_close_wakes_with_shutdown(void **state) {
  (void)state;
  uv_loop_t loop;
  uv_loop_init(&loop);
  tc_lockwait_t *lw = tc_lockwait_new(&loop, 8);
  log_t log = {0};
  item_t a;
  init_item(&a, 1, "X", 1, 10000, &log, lw);
  assert_int_equal(tc_lockwait_add(lw, &a.w), 0);
  int done = 0;
  tc_lockwait_close(lw, closed, &done);
  assert_int_equal(log.n, 1);
  assert_int_equal(log.reasons[0], TXP_ESHUTDOWN);
  run_closed(&loop, &done);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_fifo_release_and_requeue),
    cmocka_unit_test(test_deadline_and_bound),
    cmocka_unit_test(test_close_wakes_with_shutdown),
  };
  return cmocka_run_group_tests_name("tc_lockwait", tests, NULL, NULL);
}
