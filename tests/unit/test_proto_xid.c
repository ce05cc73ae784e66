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
  assert_int_equal(txp_xid_make(xid, sizeof(xid), "127.0.0.1:8091", 4096), 19);
  assert_string_equal(xid, "127.0.0.1:8091:4096");
  assert_int_equal(txp_xid_parse(xid, node, sizeof(node), &id), 0);
  assert_string_equal(node, "127.0.0.1:8091");
  assert_true(id == 4096);
  /* IPv6 and names; the largest id */
  assert_true(txp_xid_make(xid, sizeof(xid), "[::1]:7", INT64_MAX) > 0);
  assert_int_equal(txp_xid_parse(xid, node, sizeof(node), &id), 0);
  assert_string_equal(node, "[::1]:7");
  assert_true(id == INT64_MAX);
  assert_int_equal(txp_xid_parse("tc-2:9000:1", node, sizeof(node), NULL), 0);
  assert_string_equal(node, "tc-2:9000");
  /* A node of the longest length fits an xid. */
  char longest[TXP_XID_NODE_MAX + 1];
  memset(longest, 'h', TXP_XID_NODE_MAX - 5);
  memcpy(longest + TXP_XID_NODE_MAX - 5, ":9999", 6);
  assert_true(txp_xid_make(xid, sizeof(xid), longest, INT64_MAX) > 0);
  assert_int_equal(txp_xid_parse(xid, node, sizeof(node), &id), 0);
  assert_string_equal(node, longest);
}

static void test_refused(void **state) {
  (void)state;
  char xid[TXP_MAX_XID_LEN + 1], node[TXP_XID_NODE_MAX + 1];
  char too_long[TXP_XID_NODE_MAX + 2];
  memset(too_long, 'h', sizeof(too_long) - 1);
  too_long[sizeof(too_long) - 1] = '\0';
  assert_int_equal(txp_xid_make(xid, sizeof(xid), too_long, 1), -1);
  assert_int_equal(txp_xid_make(xid, sizeof(xid), "", 1), -1);
  assert_int_equal(txp_xid_make(xid, sizeof(xid), NULL, 1), -1);
  assert_int_equal(txp_xid_make(xid, sizeof(xid), "h:1", -1), -1);
  assert_int_equal(txp_xid_make(xid, 5, "h:1", 12345), -1);
  static const char *const bad[] = {
    "", ":", "1", "h:1", ":1:2", "h:x:1", "h:1:", "h:1:x", "h:1:-1", "h::1",
    "h:1:99999999999999999999", "h:1:9223372036854775808", "txc-degrade-probe",
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
    if (txp_xid_parse(bad[i], node, sizeof(node), NULL) != -1) fail_msg("accepted xid \"%s\"", bad[i]);
  assert_int_equal(txp_xid_parse(NULL, node, sizeof(node), NULL), -1);
  assert_int_equal(txp_xid_parse("127.0.0.1:8091:1", node, 14, NULL), -1); /* the node needs 15 */
  assert_int_equal(txp_xid_parse("127.0.0.1:8091:1", node, 15, NULL), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_make_and_parse),
    cmocka_unit_test(test_refused),
  };
  return cmocka_run_group_tests_name("proto_xid", tests, NULL, NULL);
}
