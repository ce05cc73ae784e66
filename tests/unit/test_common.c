/*
 * test_common.c - common/: the min-heap of deadlines (txc_heap.h) and the
 * table of requests by id (txc_idtable.h), each against a plain array
 * doing the same operations; the ISO time, the process stats, the libpq
 * message rule, the growing text buffer (txc_buf.h), and the background
 * job's thread (txc_worker.h).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "txc_buf.h"
#include "txc_heap.h"
#include "txc_idtable.h"
#include "txc_isotime.h"
#include "txc_procstat.h"
#include "txc_pgmsg.h"
#include "txc_worker.h"

#include <pthread.h>
#include <stdatomic.h>

#define N 500

typedef struct item {
  int value;
  txc_heap_node_t hnode;
  txc_idnode_t idnode;
} item_t;

static uint32_t rng = 12345;
static uint32_t next_rand(void) {
  rng ^= rng << 13;
  rng ^= rng >> 17;
  rng ^= rng << 5;
  return rng;
}

/* Pushes, removals from the middle, key updates and pops, checked against
 * a linear scan for the minimum after each step. */
static void test_heap_against_model(void **state) {
  (void)state;
  static item_t items[N];
  txc_heap_t h;
  txc_heap_init(&h);
  assert_null(txc_heap_min(&h));
  for (int i = 0; i < N; i++) {
    items[i].value = i;
    txc_heap_node_init(&items[i].hnode);
  }
  for (int step = 0; step < 5000; step++) {
    item_t *it = &items[next_rand() % N];
    uint32_t op = next_rand() % 4;
    if (!txc_heap_contains(&it->hnode)) {
      assert_int_equal(txc_heap_push(&h, &it->hnode, next_rand() % 1000), 0);
    } else if (op == 0) {
      txc_heap_remove(&h, &it->hnode);
      assert_false(txc_heap_contains(&it->hnode));
      txc_heap_remove(&h, &it->hnode); /* twice: nothing */
    } else if (op == 1) {
      txc_heap_update(&h, &it->hnode, next_rand() % 1000);
    }
    /* the minimum is the smallest key of the items that are in */
    uint64_t min = UINT64_MAX;
    size_t in = 0;
    for (int i = 0; i < N; i++)
      if (txc_heap_contains(&items[i].hnode)) {
        in++;
        if (items[i].hnode.key < min) min = items[i].hnode.key;
        assert_ptr_equal(h.a[items[i].hnode.idx], &items[i].hnode);
      }
    assert_int_equal(txc_heap_len(&h), in);
    if (in) assert_true(txc_heap_min(&h)->key == min);
  }
  /* Drain in order. */
  uint64_t last = 0;
  for (txc_heap_node_t *n; (n = txc_heap_min(&h)) != NULL;) {
    assert_true(n->key >= last);
    last = n->key;
    item_t *it = TXC_HEAP_ELEM(n, item_t, hnode);
    assert_ptr_equal(&it->hnode, n);
    txc_heap_remove(&h, n);
  }
  txc_heap_free(&h);
}

static void test_idtable_against_model(void **state) {
  (void)state;
  static item_t items[N];
  static bool in[N];
  txc_idtable_t t;
  assert_int_equal(txc_idtable_init(&t, 2), 0); /* small: it must grow */
  for (int i = 0; i < N; i++) {
    items[i].value = i;
    items[i].idnode.id = (uint64_t)i * 7919u + 1; /* spread, never 0 */
    in[i] = false;
  }
  for (int step = 0; step < 5000; step++) {
    int i = (int)(next_rand() % N);
    if (!in[i]) {
      txc_idtable_insert(&t, &items[i].idnode);
      in[i] = true;
    } else if (next_rand() % 2) {
      assert_true(txc_idtable_remove(&t, &items[i].idnode));
      in[i] = false;
      assert_false(txc_idtable_remove(&t, &items[i].idnode));
    }
    int j = (int)(next_rand() % N);
    txc_idnode_t *n = txc_idtable_find(&t, items[j].idnode.id);
    if (in[j]) {
      assert_ptr_equal(n, &items[j].idnode);
      assert_int_equal(TXC_IDTABLE_ELEM(n, item_t, idnode)->value, j);
    } else {
      assert_null(n);
    }
  }
  size_t count = 0;
  for (int i = 0; i < N; i++) count += in[i];
  assert_int_equal(txc_idtable_count(&t), count);
  assert_null(txc_idtable_find(&t, UINT64_MAX));
  txc_idtable_free(&t);
}

/* The one ISO formatter: epoch, before it (a negative time rounds down to
 * the second before, with 999 ms), a day of 2026, a leap day. */
static void test_iso_time(void **state) {
  (void)state;
  char out[TXC_ISO_TIME_MAX];
  txc_iso_time(out, 0);
  assert_string_equal(out, "1970-01-01T00:00:00.000Z");
  txc_iso_time(out, -1);
  assert_string_equal(out, "1969-12-31T23:59:59.999Z");
  txc_iso_time(out, 1796186503453LL);
  assert_string_equal(out, "2026-12-02T04:41:43.453Z");
  txc_iso_time(out, 951782400000LL + 86399999LL);
  assert_string_equal(out, "2000-02-29T23:59:59.999Z");
}

/* libpq messages lose their trailing newline, carriage return and spaces
 * only. */
static void test_pgmsg_len(void **state) {
  (void)state;
  assert_int_equal(txc_pgmsg_len(NULL), 0);
  assert_int_equal(txc_pgmsg_len(""), 0);
  assert_int_equal(txc_pgmsg_len("ERROR:  x\n"), 9);
  assert_int_equal(txc_pgmsg_len("a\nb \r\n"), 3);
  assert_int_equal(txc_pgmsg_len("\n\n"), 0);
}

/* The text grows past its first block whole, stays NUL-terminated, stops
 * at 'max' (over set, nothing appended) and is emptied by clear. */
static void test_buf(void **state) {
  (void)state;
  txc_buf_t b = {0};
  for (int i = 0; i < 1000; i++) txc_buf_printf(&b, "line %04d\n", i);
  assert_int_equal(b.len, 10000);
  assert_int_equal(strlen(b.p), 10000);
  assert_memory_equal(b.p + 9990, "line 0999\n", 10);
  txc_buf_clear(&b);
  assert_int_equal(b.len, 0);
  assert_string_equal(b.p, "");
  b.max = 8;
  assert_true(txc_buf_add(&b, "12345", 5));
  assert_false(txc_buf_add(&b, "6789", 4));
  assert_true(b.over);
  assert_string_equal(b.p, "12345");
  assert_int_equal(txc_buf_curl_write("678", 1, 3, &b), 3);
  assert_int_equal(txc_buf_curl_write("9", 1, 1, &b), 0);
  assert_string_equal(b.p, "12345678");
  free(b.p);
}

/* process_* figures of this very process: plausible, and the text has
 * every family with its HELP and TYPE. */
static void test_procstat(void **state) {
  (void)state;
  txc_procstat_t p;
  assert_int_equal(txc_procstat_read(&p), 0);
  assert_true(p.resident_bytes > 1024 * 1024 / 4); /* a running test binary */
  assert_true(p.virtual_bytes >= p.resident_bytes);
  assert_true(p.open_fds >= 3);                     /* stdin, stdout, stderr */
  assert_true(p.threads >= 1);
  assert_true(p.cpu_seconds >= 0);
  double now = (double)time(NULL);
  assert_true(p.start_time_seconds > now - 3600 && p.start_time_seconds <= now + 1);
  char out[2048];
  int n = txc_procstat_format(&p, out, sizeof(out));
  assert_true(n > 0);
  static const char *const fams[] = {"process_cpu_seconds_total", "process_resident_memory_bytes",
                                     "process_virtual_memory_bytes", "process_open_fds", "process_max_fds",
                                     "process_start_time_seconds", "process_threads"};
  for (size_t i = 0; i < sizeof(fams) / sizeof(fams[0]); i++) {
    char want[128];
    snprintf(want, sizeof(want), "# HELP %s ", fams[i]);
    assert_non_null(strstr(out, want));
    snprintf(want, sizeof(want), "# TYPE %s ", fams[i]);
    assert_non_null(strstr(out, want));
    snprintf(want, sizeof(want), "\n%s ", fams[i]);
    assert_non_null(strstr(out, want));
  }
  assert_int_equal(txc_procstat_format(&p, out, 64), -1); /* too small: refused, not cut */
}

static long long mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* A job's thread as the tests see it: when it woke, how often. */
typedef struct job {
  txc_worker_t w;
  long long period_ms; /* > 0: it beats; else it sleeps 10 s between passes */
  long long woke[3];
  _Atomic int passes;
} job_t;

static void *job_main(void *arg) {
  job_t *j = arg;
  if (j->period_ms > 0) {
    while (txc_worker_beat(&j->w, j->period_ms))
      if (j->passes < 3) j->woke[atomic_fetch_add(&j->passes, 1)] = mono_ms();
  } else {
    while (txc_worker_sleep(&j->w, 10000)) atomic_fetch_add(&j->passes, 1);
  }
  return NULL;
}

/* Beats come on a schedule of a period from the start (a thread that
 * starts late, under valgrind say, catches up at once, not shifting the
 * ones after): the second no sooner than two periods after the start. */
static void test_worker_beats(void **state) {
  (void)state;
  job_t j = {.period_ms = 20};
  long long t0 = mono_ms();
  assert_int_equal(txc_worker_start(&j.w, job_main, &j), 0);
  while (atomic_load(&j.passes) < 3) {
    struct timespec d = {0, 5 * 1000000L};
    nanosleep(&d, NULL);
  }
  txc_worker_stop(&j.w);
  assert_true(j.woke[1] - t0 >= 39);
  assert_true(j.woke[0] <= j.woke[1] && j.woke[1] <= j.woke[2]);
}

/* A kick ends a sleep at once, and so does a stop from another thread (a
 * 10 s sleep would otherwise hold the thread). */
static void test_worker_kick_and_stop(void **state) {
  (void)state;
  job_t j = {.period_ms = 0};
  long long t0 = mono_ms();
  assert_int_equal(txc_worker_start(&j.w, job_main, &j), 0);
  txc_worker_kick(&j.w);
  while (atomic_load(&j.passes) < 1) {
    struct timespec d = {0, 5 * 1000000L};
    nanosleep(&d, NULL);
  }
  assert_false(txc_worker_stopping(&j.w));
  txc_worker_stop(&j.w);
  assert_int_equal(atomic_load(&j.passes), 1);
  assert_true(mono_ms() - t0 < 5000);
}

static int64_t mono_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* A pause lasts its time whatever kicks come, and keeps them: the sleep
 * after it returns at once.  A stop ends a pause.  One whose time is past
 * (or never started) does not wait. */
typedef struct pauser {
  txc_worker_t w;
  _Atomic int stage; /* 1 pausing, 2 paused and slept */
  long long paused_at, slept_at;
  bool go_on;
} pauser_t;

static void *pauser_main(void *arg) {
  pauser_t *p = arg;
  atomic_store(&p->stage, 1);
  p->go_on = txc_worker_pause_since(&p->w, mono_us(), 200);
  p->paused_at = mono_ms();
  if (p->go_on && txc_worker_sleep(&p->w, 10000)) p->slept_at = mono_ms();
  atomic_store(&p->stage, 2);
  while (txc_worker_sleep(&p->w, 10000)) {
  }
  return NULL;
}

static void test_worker_pause(void **state) {
  (void)state;
  pauser_t p = {0};
  long long t0 = mono_ms();
  assert_int_equal(txc_worker_start(&p.w, pauser_main, &p), 0);
  while (atomic_load(&p.stage) < 2) {
    txc_worker_kick(&p.w);
    struct timespec d = {0, 5 * 1000000L};
    nanosleep(&d, NULL);
  }
  txc_worker_stop(&p.w);
  assert_true(p.go_on);
  assert_true(p.paused_at - t0 >= 199);      /* the kicks did not cut it short */
  assert_true(p.slept_at > 0 && p.slept_at - p.paused_at < 5000); /* a kick was kept for the sleep */

  pauser_t q = {0};
  t0 = mono_ms();
  assert_int_equal(txc_worker_start(&q.w, pauser_main, &q), 0);
  while (atomic_load(&q.stage) < 1) {
    struct timespec d = {0, 1000000L};
    nanosleep(&d, NULL);
  }
  txc_worker_stop(&q.w); /* in the pause, or about to pause */
  assert_false(q.go_on);

  job_t j = {.period_ms = 0}; /* a worker asleep, to pause on */
  assert_int_equal(txc_worker_start(&j.w, job_main, &j), 0);
  t0 = mono_ms();
  assert_true(txc_worker_pause_since(&j.w, 0, 10000));                      /* never started */
  assert_true(txc_worker_pause_since(&j.w, mono_us() - 20000000, 10000)); /* 20 s ago: past */
  assert_true(mono_ms() - t0 < 5000);
  txc_worker_stop(&j.w);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_heap_against_model),
    cmocka_unit_test(test_idtable_against_model),
    cmocka_unit_test(test_iso_time),
    cmocka_unit_test(test_procstat),
    cmocka_unit_test(test_pgmsg_len),
    cmocka_unit_test(test_buf),
    cmocka_unit_test(test_worker_beats),
    cmocka_unit_test(test_worker_kick_and_stop),
    cmocka_unit_test(test_worker_pause),
  };
  return cmocka_run_group_tests_name("common", tests, NULL, NULL);
}
