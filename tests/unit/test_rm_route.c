/*
 * test_rm_route.c - librmclient's pure routing helpers (rm_conn.h): node
 * address and node list parsing, the xid -> creating node mapping, the
 * reconnect/retry backoff and its jitter.
 *
 * NOTES
 *   No network, no loop: these functions are what decides where a request
 *   goes and when a connection is retried, so their edge cases are pinned
 *   here (bracketed IPv6, ports out of range, xids of foreign shape, backoff
 *   overflow at absurd failure counts).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <limits.h>
#include <string.h>

#include "rm_conn.h"

static void test_addr_parse_ok(void **state) {
  (void)state;
  char host[RM_ADDR_MAX];
  int port = 0;
  assert_int_equal(rm__addr_parse("127.0.0.1:8091", host, sizeof(host), &port), 0);
  assert_string_equal(host, "127.0.0.1");
  assert_int_equal(port, 8091);
  assert_int_equal(rm__addr_parse("tc-1.example:1", host, sizeof(host), &port), 0);
  assert_string_equal(host, "tc-1.example");
  assert_int_equal(port, 1);
  assert_int_equal(rm__addr_parse("[::1]:65535", host, sizeof(host), &port), 0);
  assert_string_equal(host, "::1");
  assert_int_equal(port, 65535);
  assert_int_equal(rm__addr_parse("[fe80::1%eth0]:80", host, sizeof(host), &port), 0);
  assert_string_equal(host, "fe80::1%eth0");
}

static void test_addr_parse_bad(void **state) {
  (void)state;
  char host[RM_ADDR_MAX];
  int port = 0;
  static const char *const bad[] = {
    "", "host", "host:", ":80", "host:0", "host:65536", "host:123456", "host:8x", "host:-1",
    "::1:80", "[::1]80", "[::1]:", "[]:80", "[::1:80", "ho st:80", "a,b:80", "host:+80",
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    if (rm__addr_parse(bad[i], host, sizeof(host), &port) != -1) fail_msg("accepted \"%s\"", bad[i]);
  }
  assert_int_equal(rm__addr_parse(NULL, host, sizeof(host), &port), -1);
  assert_int_equal(rm__addr_parse("abcdef:80", host, 4, &port), -1); /* host does not fit */
  assert_int_equal(rm__addr_parse("abc:80", host, 4, &port), 0);
  assert_string_equal(host, "abc");
}

static void test_nodes_parse(void **state) {
  (void)state;
  rm_addr_t a[4];
  assert_int_equal(rm__nodes_parse("127.0.0.1:1", a, 4), 1);
  assert_string_equal(a[0].addr, "127.0.0.1:1");
  assert_int_equal(rm__nodes_parse(" a:1,\tb:2 , [::1]:3 ", a, 4), 3);
  assert_string_equal(a[0].addr, "a:1");
  assert_string_equal(a[1].addr, "b:2");
  assert_string_equal(a[2].addr, "[::1]:3");
  assert_int_equal(rm__nodes_parse("", a, 4), -1);
  assert_int_equal(rm__nodes_parse(" ", a, 4), -1);
  assert_int_equal(rm__nodes_parse("a:1,,b:2", a, 4), -1);
  assert_int_equal(rm__nodes_parse("a:1,", a, 4), -1);
  assert_int_equal(rm__nodes_parse("a:1,b", a, 4), -1);
  assert_int_equal(rm__nodes_parse("a:1,b:2,c:3,d:4", a, 4), 4);
  assert_int_equal(rm__nodes_parse("a:1,b:2,c:3,d:4,e:5", a, 4), -2);
  assert_int_equal(rm__nodes_parse(NULL, a, 4), -1);
}

static void test_xid_node(void **state) {
  (void)state;
  char out[RM_ADDR_MAX];
  assert_int_equal(rm__xid_node("127.0.0.1:8091:4096:00000000deadbeef", out, sizeof(out)), 0);
  assert_string_equal(out, "127.0.0.1:8091");
  assert_int_equal(rm__xid_node("tc-2:9000:1:00000000deadbeef", out, sizeof(out)), 0);
  assert_string_equal(out, "tc-2:9000");
  assert_int_equal(rm__xid_node("[::1]:8091:7:00000000deadbeef", out, sizeof(out)), 0);
  assert_string_equal(out, "[::1]:8091");
  static const char *const bad[] = {
    "", "abc", "4096", ":4096", "127.0.0.1:8091:", "127.0.0.1:8091:12a:00000000deadbeef",
    "127.0.0.1:8091:4096" /* the old format, no nonce */, "host:4096",
    "127.0.0.1:0:1:00000000deadbeef", "127.0.0.1:8091:-1:00000000deadbeef", "::1:8091:7:00000000deadbeef",
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    if (rm__xid_node(bad[i], out, sizeof(out)) != -1) fail_msg("accepted xid \"%s\"", bad[i]);
  }
  assert_int_equal(rm__xid_node(NULL, out, sizeof(out)), -1);
  assert_int_equal(rm__xid_node("127.0.0.1:8091:1:00000000deadbeef", out, 14), -1); /* "127.0.0.1:8091" needs 15 */
  assert_int_equal(rm__xid_node("127.0.0.1:8091:1:00000000deadbeef", out, 15), 0);
}

static void test_backoff_bounds(void **state) {
  (void)state;
  static const uint32_t rnds[] = {0, 1, 7, 12345, 0x7fffffffu, 0xffffffffu};
  assert_int_equal(rm__backoff_ms(0, 100, 5000, 42), 0);
  for (unsigned f = 1; f <= 40; f++) {
    unsigned base = 100;
    for (unsigned i = 1; i < f && base < 5000; i++) base *= 2;
    if (base > 5000) base = 5000;
    for (size_t r = 0; r < sizeof(rnds) / sizeof(rnds[0]); r++) {
      unsigned d = rm__backoff_ms(f, 100, 5000, rnds[r]);
      assert_in_range(d, base / 2, base);
    }
    assert_int_equal(rm__backoff_ms(f, 100, 5000, 0), base / 2); /* the low end is reachable */
  }
  /* The first retry is quick, the cap holds at absurd counts. */
  assert_in_range(rm__backoff_ms(1, 100, 5000, 99), 50, 100);
  assert_in_range(rm__backoff_ms(UINT_MAX, 100, 5000, 0xffffffffu), 2500, 5000);
  assert_in_range(rm__backoff_ms(3, 20, 500, 5), 40, 80);
  /* max below min: min wins */
  assert_in_range(rm__backoff_ms(5, 100, 10, 3), 50, 100);
}

static void test_backoff_jitter_spreads(void **state) {
  (void)state;
  /* Many clients that lost the same node must not all retry at once. */
  uint32_t s = 12345;
  unsigned lo = UINT_MAX, hi = 0, seen[11] = {0};
  for (int i = 0; i < 10000; i++) {
    unsigned d = rm__backoff_ms(6, 100, 5000, rm__rand32(&s)); /* base 3200 */
    if (d < lo) lo = d;
    if (d > hi) hi = d;
    seen[(d - 1600) * 10 / 1600]++;
  }
  assert_in_range(lo, 1600, 1700);
  assert_in_range(hi, 3100, 3200);
  for (int b = 0; b < 10; b++) assert_true(seen[b] > 700); /* roughly uniform */
}

static void test_rand32(void **state) {
  (void)state;
  uint32_t s = 0; /* a zero state is repaired, never stuck at zero */
  uint32_t a = rm__rand32(&s), b = rm__rand32(&s);
  assert_true(a != 0 && b != 0 && a != b);
  uint32_t t = 1;
  for (int i = 0; i < 1000; i++) assert_true(rm__rand32(&t) != 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_addr_parse_ok),
    cmocka_unit_test(test_addr_parse_bad),
    cmocka_unit_test(test_nodes_parse),
    cmocka_unit_test(test_xid_node),
    cmocka_unit_test(test_backoff_bounds),
    cmocka_unit_test(test_backoff_jitter_spreads),
    cmocka_unit_test(test_rand32),
  };
  return cmocka_run_group_tests_name("rm_route", tests, NULL, NULL);
}
