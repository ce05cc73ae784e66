/*
 * test_proto_xid.c - the xid format (proto/txp_xid.h): what a coordinator
 * makes, a client reads back, and what it refuses.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <string.h>

#include "txp_xid.h"

static void test_make_and_parse(void **state) {
  (void)state;
  char xid[TXP_MAX_XID_LEN + 1], node[TXP_XID_NODE_MAX + 1];
  int64_t id = 0;
  uint64_t nonce = 0;
  assert_int_equal(txp_xid_make(xid, sizeof(xid), "127.0.0.1:8091", 4096, 0x9f3a2b1c4d5e6f70u), 36);
  assert_string_equal(xid, "127.0.0.1:8091:4096:9f3a2b1c4d5e6f70");
  assert_int_equal(txp_xid_parse(xid, node, sizeof(node), &id, &nonce), 0);
  assert_string_equal(node, "127.0.0.1:8091");
  assert_true(id == 4096);
  assert_true(nonce == 0x9f3a2b1c4d5e6f70u);
  /* The nonce always has its 16 digits. */
  assert_true(txp_xid_make(xid, sizeof(xid), "h:1", 7, 1) > 0);
  assert_string_equal(xid, "h:1:7:0000000000000001");
  /* IPv6 and names; the largest id and nonce */
  assert_true(txp_xid_make(xid, sizeof(xid), "[::1]:7", INT64_MAX, UINT64_MAX) > 0);
  assert_int_equal(txp_xid_parse(xid, node, sizeof(node), &id, &nonce), 0);
  assert_string_equal(node, "[::1]:7");
  assert_true(id == INT64_MAX);
  assert_true(nonce == UINT64_MAX);
  assert_int_equal(txp_xid_parse("tc-2:9000:1:00000000000000ff", node, sizeof(node), NULL, NULL), 0);
  assert_string_equal(node, "tc-2:9000");
  /* A node of the longest length fits an xid with the largest id. */
  char longest[TXP_XID_NODE_MAX + 1];
  memset(longest, 'h', TXP_XID_NODE_MAX - 5);
  memcpy(longest + TXP_XID_NODE_MAX - 5, ":9999", 6);
  assert_true(txp_xid_make(xid, sizeof(xid), longest, INT64_MAX, UINT64_MAX) > 0);
  assert_true(strlen(xid) <= TXP_MAX_XID_LEN);
  assert_int_equal(txp_xid_parse(xid, node, sizeof(node), &id, NULL), 0);
  assert_string_equal(node, longest);
}

/* Consecutive transactions of one node differ in their nonce: the xid of
 * transaction n+1 is not the xid of transaction n with the id bumped. */
static void test_next_is_not_derived(void **state) {
  (void)state;
  char a[TXP_MAX_XID_LEN + 1], b[TXP_MAX_XID_LEN + 1], guess[TXP_MAX_XID_LEN + 1];
  assert_true(txp_xid_make(a, sizeof(a), "h:1", 41, 0x1111111111111111u) > 0);
  assert_true(txp_xid_make(b, sizeof(b), "h:1", 42, 0x2222222222222222u) > 0);
  assert_true(txp_xid_make(guess, sizeof(guess), "h:1", 42, 0x1111111111111111u) > 0);
  assert_string_not_equal(b, guess);
}

static void test_refused(void **state) {
  (void)state;
  char xid[TXP_MAX_XID_LEN + 1], node[TXP_XID_NODE_MAX + 1];
  char too_long[TXP_XID_NODE_MAX + 2];
  memset(too_long, 'h', sizeof(too_long) - 1);
  too_long[sizeof(too_long) - 1] = '\0';
  assert_int_equal(txp_xid_make(xid, sizeof(xid), too_long, 1, 1), -1);
  assert_int_equal(txp_xid_make(xid, sizeof(xid), "", 1, 1), -1);
  assert_int_equal(txp_xid_make(xid, sizeof(xid), NULL, 1, 1), -1);
  assert_int_equal(txp_xid_make(xid, sizeof(xid), "h:1", -1, 1), -1);
  assert_int_equal(txp_xid_make(xid, 5, "h:1", 12345, 1), -1);
  static const char *const bad[] = {
    "", ":", "1", "h:1", ":1:2", "h:x:1", "h:1:", "h:1:x", "h:1:-1", "h::1",
    "h:1:99999999999999999999", "h:1:9223372036854775808", "txc-degrade-probe",
    /* the old format, without a nonce */
    "127.0.0.1:8091:4096",
    /* nonce: too short, too long, upper case, not hex, missing */
    "h:1:2:000000000000001", "h:1:2:00000000000000001", "h:1:2:000000000000000A",
    "h:1:2:000000000000000g", "h:1:2:", "h:1::0000000000000001",
    /* id: not digits, too big */
    "h:1:x:0000000000000001", "h:1:-1:0000000000000001", "h:1:9223372036854775808:0000000000000001",
    /* node: no port, empty */
    "h:2:0000000000000001", ":1:2:0000000000000001", "h::2:0000000000000001",
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
    if (txp_xid_parse(bad[i], node, sizeof(node), NULL, NULL) != -1) fail_msg("accepted xid \"%s\"", bad[i]);
  assert_int_equal(txp_xid_parse(NULL, node, sizeof(node), NULL, NULL), -1);
  const char *x = "127.0.0.1:8091:1:0123456789abcdef";
  assert_int_equal(txp_xid_parse(x, node, 14, NULL, NULL), -1); /* the node needs 15 */
  assert_int_equal(txp_xid_parse(x, node, 15, NULL, NULL), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_make_and_parse),
    cmocka_unit_test(test_next_is_not_derived),
    cmocka_unit_test(test_refused),
  };
  return cmocka_run_group_tests_name("proto_xid", tests, NULL, NULL);
}
