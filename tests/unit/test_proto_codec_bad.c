/*
 * test_proto_codec_bad.c - the frame codec (txp_msg.h) on malformed input
 * and at its limits: bad magic, every kind of malformed body, lying
 * container counts, invalid UTF-8, out-of-range status values, and every
 * limit (frame size, field lengths, strings, counts, depth, the decoder's
 * buffer) at and past its edge.  Valid input is test_proto_codec; both
 * share codec_fixture.h.
 *
 * Each bad frame is followed by a valid one, which must still decode: a
 * body error skips exactly its frame.  Every decoded message is
 * txp_msg_clear'ed: the build runs this under ASan/LeakSanitizer (and
 * valgrind), so a leak fails the test.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <msgpack.h>

#include "codec_fixture.h"
#include "txp_mpcheck.h"

/* ============================================= body errors: one frame each */

/*
 * The frame [h | body] must fail with 'want', keeping the header in 'out'
 * and skipping exactly that frame: the valid frame after it still decodes.
 * Checked fed whole, fed one byte at a time, and through txp_decode_frame.
 */
static void expect_body_error_lim(const txp_limits_t *lim, hdr_t h, const void *body, size_t n,
                                  int want, const char *what) {
  bytes_t s = {0};
  add_frame(&s, h, body, n);
  size_t badlen = s.n;
  add_good_frame(&s, h.rid + 1);

  for (int mode = 0; mode < 2; mode++) {
    txp_decoder_t *d = txp_decoder_new(lim);
    assert_non_null(d);
    txp_msg_t m;
    txp_msg_init(&m, TXP_MSG_NONE);
    int got_bad = 0, got_good = 0;
    size_t step = mode == 0 ? s.n : 1;
    for (size_t off = 0; off < s.n; off += step) {
      assert_int_equal(txp_decoder_feed(d, s.p + off, step), 0);
      for (;;) {
        txp_msg_init(&m, TXP_MSG_NONE);
        int rc = txp_decoder_next(d, &m);
        if (rc == TXP_EAGAIN) break;
        if (!got_bad) {
          if (rc != want)
            fail_msg("%s (mode %d): got %s, want %s", what, mode, txp_errname(rc), txp_errname(want));
          assert_header_only(&m, h.type, h.flags, h.rid);
          assert_int_equal(m.ver_major, h.major);
          assert_int_equal(m.ver_minor, h.minor);
          txp_msg_clear(&m);
          got_bad = 1;
          assert_int_equal(txp_decoder_buffered(d), off + step - badlen);
          continue;
        }
        if (rc != 0) fail_msg("%s (mode %d): next frame: %s", what, mode, txp_errname(rc));
        assert_string_equal(m.xid, "next");
        assert_int_equal(m.request_id, h.rid + 1);
        txp_msg_clear(&m);
        got_good++;
      }
    }
    assert_true(got_bad);
    assert_int_equal(got_good, 1);
    assert_int_equal(txp_decoder_buffered(d), 0);
    txp_decoder_free(d);
  }

  txp_msg_t m;
  txp_msg_init(&m, TXP_MSG_NONE);
  int rc = txp_decode_frame(s.p, badlen, lim, &m);
  if (rc != want)
    fail_msg("%s (decode_frame): got %s, want %s", what, txp_errname(rc), txp_errname(want));
  assert_header_only(&m, h.type, h.flags, h.rid);
  txp_msg_clear(&m);
  bytes_free(&s);
}

static void expect_body_error(hdr_t h, const body_t *b, int want, const char *what) {
  expect_body_error_lim(NULL, h, b->sb.data, b->sb.size, want, what);
}

/* ============================================================== garbage */

static void test_bad_magic_sticky(void **state) {
  (void)state;
  bytes_t s = {0};
  add_good_frame(&s, 1);
  txp_decoder_t *d = txp_decoder_new(NULL);
  txp_msg_t m;
  txp_msg_init(&m, TXP_MSG_NONE);

  /* a partial frame, completed, then garbage */
  assert_int_equal(txp_decoder_feed(d, s.p, 9), 0);
  assert_int_equal(txp_decoder_next(d, &m), TXP_EAGAIN);
  assert_int_equal(txp_decoder_feed(d, s.p + 9, s.n - 9), 0);
  expect_good(d, 1);
  assert_int_equal(txp_decoder_next(d, &m), TXP_EAGAIN);
  assert_int_equal(txp_decoder_feed(d, "G", 1), 0);
  assert_int_equal(txp_decoder_next(d, &m), TXP_EAGAIN); /* one byte: cannot tell yet */
  assert_int_equal(txp_decoder_feed(d, "ET / HTTP/1.1\r\n", 15), 0);
  assert_int_equal(txp_decoder_next(d, &m), TXP_EBAD_MAGIC);
  assert_int_equal(m.request_id, 0); /* nothing to answer */
  /* sticky: even a valid frame afterwards is not decoded */
  assert_int_equal(txp_decoder_feed(d, s.p, s.n), 0);
  for (int i = 0; i < 3; i++) assert_int_equal(txp_decoder_next(d, &m), TXP_EBAD_MAGIC);
  txp_msg_clear(&m);
  txp_decoder_free(d);

  /* half a magic */
  d = txp_decoder_new(NULL);
  assert_int_equal(txp_decoder_feed(d, "\xDA", 1), 0);
  assert_int_equal(txp_decoder_next(d, &m), TXP_EAGAIN);
  assert_int_equal(txp_decoder_feed(d, "\xDB", 1), 0);
  assert_int_equal(txp_decoder_next(d, &m), TXP_EBAD_MAGIC);
  txp_decoder_free(d);

  /* a frame whose body_len is short: the rest of its body is read as the
   * next header, which is garbage */
  bytes_t t = {0};
  body_t b;
  body_init(&b);
  msgpack_pack_map(&b.pk, 0);
  pk_raw(&b, "\x81\x03\xa1x", 4);
  add_frame(&t, H(TXP_MSG_GLOBAL_BEGIN, 3), b.sb.data, 1); /* declares 1 byte of 5 */
  bytes_add(&t, b.sb.data + 1, b.sb.size - 1);
  body_free(&b);
  d = txp_decoder_new(NULL);
  assert_int_equal(txp_decoder_feed(d, t.p, t.n), 0);
  assert_int_equal(txp_decoder_next(d, &m), 0);
  assert_int_equal(m.type, TXP_MSG_GLOBAL_BEGIN);
  txp_msg_clear(&m);
  assert_int_equal(txp_decoder_next(d, &m), TXP_EBAD_MAGIC); /* 0x81 0x03 */
  txp_decoder_free(d);
  bytes_free(&t);

  /* decode_frame on garbage */
  assert_int_equal(txp_decode_frame("XXXXXXXXXXXXXXXXXXXXXXXX", 24, NULL, &m), TXP_EBAD_MAGIC);
  txp_msg_clear(&m);
  bytes_free(&s);
}

/* Body builders for the error table. */
static void b_empty_map(body_t *b) { msgpack_pack_map(&b->pk, 0); }
static void b_nothing(body_t *b) { (void)b; }
static void b_c1(body_t *b) { pk_raw(b, "\xc1", 1); }
static void b_c1_value(body_t *b) { pk_raw(b, "\x82\x03\xa1x\x63\xc1", 6); }
static void b_truncated_map(body_t *b) { pk_raw(b, "\x82\x03\xa1x", 4); }
static void b_truncated_str(body_t *b) { pk_raw(b, "\x81\x03\xa5xy", 5); }
static void b_trailing(body_t *b) {
  b_xid(b);
  pk_raw(b, "\xc0", 1);
}
static void b_two_maps(body_t *b) {
  b_xid(b);
  b_xid(b);
}
static void b_root_array(body_t *b) {
  msgpack_pack_array(&b->pk, 2);
  pk_key(b, TXP_F_XID);
  pk_str(b, "x");
}
static void b_root_int(body_t *b) { msgpack_pack_int(&b->pk, 3); }
static void b_root_str(body_t *b) { pk_str(b, "xid"); }
static void b_str_key(body_t *b) {
  msgpack_pack_map(&b->pk, 1);
  pk_str(b, "xid");
  pk_str(b, "x");
}
static void b_neg_key(body_t *b) {
  msgpack_pack_map(&b->pk, 2);
  pk_key(b, TXP_F_XID);
  pk_str(b, "x");
  msgpack_pack_int(&b->pk, -1);
  msgpack_pack_nil(&b->pk);
}
static void b_nil_key(body_t *b) {
  msgpack_pack_map(&b->pk, 2);
  pk_key(b, TXP_F_XID);
  pk_str(b, "x");
  msgpack_pack_nil(&b->pk);
  msgpack_pack_nil(&b->pk);
}
static void b_float_key(body_t *b) {
  msgpack_pack_map(&b->pk, 2);
  pk_key(b, TXP_F_XID);
  pk_str(b, "x");
  msgpack_pack_double(&b->pk, 3.0);
  msgpack_pack_nil(&b->pk);
}
static void b_xid_int(body_t *b) {
  msgpack_pack_map(&b->pk, 1);
  pk_key(b, TXP_F_XID);
  msgpack_pack_int(&b->pk, 5);
}
static void b_xid_bin(body_t *b) {
  msgpack_pack_map(&b->pk, 1);
  pk_key(b, TXP_F_XID);
  msgpack_pack_bin(&b->pk, 1);
  msgpack_pack_bin_body(&b->pk, "x", 1);
}
static void b_xid_nil(body_t *b) {
  msgpack_pack_map(&b->pk, 1);
  pk_key(b, TXP_F_XID);
  msgpack_pack_nil(&b->pk);
}
static void b_xid_array(body_t *b) {
  msgpack_pack_map(&b->pk, 1);
  pk_key(b, TXP_F_XID);
  msgpack_pack_array(&b->pk, 1);
  pk_str(b, "x");
}
static void b_code_str(body_t *b) {
  msgpack_pack_map(&b->pk, 1);
  pk_key(b, TXP_F_CODE);
  pk_str(b, "0");
}
static void b_code_u64max(body_t *b) {
  msgpack_pack_map(&b->pk, 1);
  pk_key(b, TXP_F_CODE);
  msgpack_pack_uint64(&b->pk, UINT64_MAX);
}
static void b_code_int64max(body_t *b) { /* one past what an int64 holds */
  msgpack_pack_map(&b->pk, 1);
  pk_key(b, TXP_F_CODE);
  msgpack_pack_uint64(&b->pk, (uint64_t)INT64_MAX + 1);
}
static void b_code_bool(body_t *b) {
  msgpack_pack_map(&b->pk, 1);
  pk_key(b, TXP_F_CODE);
  msgpack_pack_false(&b->pk);
}
static void b_timeout_neg(body_t *b) {
  msgpack_pack_map(&b->pk, 1);
  pk_key(b, TXP_F_TIMEOUT_MS);
  msgpack_pack_int(&b->pk, -1);
}
static void b_timeout_big(body_t *b) {
  msgpack_pack_map(&b->pk, 1);
  pk_key(b, TXP_F_TIMEOUT_MS);
  msgpack_pack_uint64(&b->pk, UINT64_C(0x100000000));
}
static void b_timeout_float(body_t *b) {
  msgpack_pack_map(&b->pk, 1);
  pk_key(b, TXP_F_TIMEOUT_MS);
  msgpack_pack_double(&b->pk, 1.0);
}
static void b_lockable_int(body_t *b) {
  msgpack_pack_map(&b->pk, 2);
  pk_key(b, TXP_F_CODE);
  msgpack_pack_int(&b->pk, 0);
  pk_key(b, TXP_F_LOCKABLE);
  msgpack_pack_int(&b->pk, 1);
}
static void b_branch_register_no_resource(body_t *b) {
  msgpack_pack_map(&b->pk, 2);
  pk_key(b, TXP_F_XID);
  pk_str(b, "x");
  pk_key(b, TXP_F_BRANCH_TYPE);
  msgpack_pack_uint32(&b->pk, TXP_BT_AT);
}
static void b_unknown_only(body_t *b) {
  msgpack_pack_map(&b->pk, 1);
  pk_key(b, 99);
  pk_str(b, "x");
}
static void b_dup(body_t *b) {
  msgpack_pack_map(&b->pk, 2);
  pk_key(b, TXP_F_XID);
  pk_str(b, "a");
  pk_key(b, TXP_F_XID);
  pk_str(b, "b");
}
static void b_dup_same(body_t *b) {
  msgpack_pack_map(&b->pk, 2);
  pk_key(b, TXP_F_XID);
  pk_str(b, "a");
  pk_raw(b, "\xcc\x03", 2); /* key 3 again, spelled as uint8 */
  pk_str(b, "a");
}
static void b_dup_foreign(body_t *b) { /* duplicate of a field GlobalCommit ignores */
  msgpack_pack_map(&b->pk, 3);
  pk_key(b, TXP_F_XID);
  pk_str(b, "a");
  pk_key(b, TXP_F_HEARTBEAT_MS);
  msgpack_pack_int(&b->pk, 1);
  pk_key(b, TXP_F_HEARTBEAT_MS);
  msgpack_pack_int(&b->pk, 2);
}
static void b_nul(body_t *b) {
  msgpack_pack_map(&b->pk, 1);
  pk_key(b, TXP_F_XID);
  pk_strn(b, "a\0b", 3);
}
static void b_nul_only(body_t *b) {
  msgpack_pack_map(&b->pk, 1);
  pk_key(b, TXP_F_XID);
  pk_strn(b, "\0", 1);
}
static void b_gs(body_t *b, uint32_t gs) {
  msgpack_pack_map(&b->pk, 2);
  pk_key(b, TXP_F_XID);
  pk_str(b, "x");
  pk_key(b, TXP_F_GLOBAL_STATUS);
  msgpack_pack_uint32(&b->pk, gs);
}
static void b_gs16(body_t *b) { b_gs(b, 16); }
static void b_gs21(body_t *b) { b_gs(b, 21); }
static void b_gs_huge(body_t *b) { b_gs(b, UINT32_MAX); }
static void b_bs(body_t *b, uint32_t bs) {
  msgpack_pack_map(&b->pk, 3);
  pk_key(b, TXP_F_XID);
  pk_str(b, "x");
  pk_key(b, TXP_F_BRANCH_ID);
  msgpack_pack_int(&b->pk, 1);
  pk_key(b, TXP_F_BRANCH_STATUS);
  msgpack_pack_uint32(&b->pk, bs);
}
static void b_bs11(body_t *b) { b_bs(b, 11); }
static void b_bs14(body_t *b) { b_bs(b, 14); }
static void b_bt(body_t *b, uint32_t bt) {
  msgpack_pack_map(&b->pk, 3);
  pk_key(b, TXP_F_XID);
  pk_str(b, "x");
  pk_key(b, TXP_F_BRANCH_TYPE);
  msgpack_pack_uint32(&b->pk, bt);
  pk_key(b, TXP_F_RESOURCE_ID);
  pk_str(b, "r");
}
static void b_bt4(body_t *b) { b_bt(b, TXP_BT__MAX); }
static void b_result_gs(body_t *b) { /* in a result type too */
  msgpack_pack_map(&b->pk, 2);
  pk_key(b, TXP_F_CODE);
  msgpack_pack_int(&b->pk, 0);
  pk_key(b, TXP_F_GLOBAL_STATUS);
  msgpack_pack_uint32(&b->pk, 17);
}
static void b_map32_huge(body_t *b) { pk_raw(b, "\xdf\xff\xff\xff\xff\x01\x02\x03\x04\x05", 10); }
static void b_array32_huge(body_t *b) { pk_raw(b, "\xdd\xff\xff\xff\xff\x01\x02\x03\x04\x05", 10); }
static void b_nested_huge(body_t *b) { pk_raw(b, "\x81\x63\xdf\xff\xff\xff\xff\x01\x02\x03", 10); }
static void b_str32_huge(body_t *b) { pk_raw(b, "\x81\x03\xdb\xff\xff\xff\xff\x61\x62\x63", 10); }
static void b_bin32_huge(body_t *b) { pk_raw(b, "\x81\x63\xc6\x7f\xff\xff\xff\x61\x62\x63", 10); }

typedef struct {
  const char *what;
  uint16_t type;
  uint16_t flags;
  int want;
  void (*build)(body_t *);
} body_case_t;

static const body_case_t body_cases[] = {
  /* unknown type: the body is not even looked at */
  {"type 0", 0, 0, TXP_EUNKNOWN_TYPE, b_empty_map},
  {"type 4 (gap)", 4, 0, TXP_EUNKNOWN_TYPE, b_empty_map},
  {"type 46", TXP_MSG__MAX, 0, TXP_EUNKNOWN_TYPE, b_empty_map},
  {"type 0xffff", 0xffff, 0, TXP_EUNKNOWN_TYPE, b_c1},
  /* unknown flags */
  {"flags 0x4", TXP_MSG_GLOBAL_COMMIT, 0x4, TXP_EBAD_FLAGS, b_xid},
  {"flags 0x8001", TXP_MSG_GLOBAL_COMMIT, 0x8001, TXP_EBAD_FLAGS, b_xid},
  /* malformed msgpack / not a map of integer keys */
  {"empty body", TXP_MSG_GLOBAL_BEGIN, 0, TXP_EMALFORMED, b_nothing},
  {"0xc1", TXP_MSG_GLOBAL_BEGIN, 0, TXP_EMALFORMED, b_c1},
  {"0xc1 as a value", TXP_MSG_GLOBAL_COMMIT, 0, TXP_EMALFORMED, b_c1_value},
  {"truncated map", TXP_MSG_GLOBAL_COMMIT, 0, TXP_EMALFORMED, b_truncated_map},
  {"truncated str", TXP_MSG_GLOBAL_COMMIT, 0, TXP_EMALFORMED, b_truncated_str},
  {"trailing byte", TXP_MSG_GLOBAL_COMMIT, 0, TXP_EMALFORMED, b_trailing},
  {"two maps", TXP_MSG_GLOBAL_COMMIT, 0, TXP_EMALFORMED, b_two_maps},
  {"root array", TXP_MSG_GLOBAL_COMMIT, 0, TXP_EMALFORMED, b_root_array},
  {"root int", TXP_MSG_GLOBAL_BEGIN, 0, TXP_EMALFORMED, b_root_int},
  {"root str", TXP_MSG_GLOBAL_BEGIN, 0, TXP_EMALFORMED, b_root_str},
  {"str key", TXP_MSG_GLOBAL_COMMIT, 0, TXP_EMALFORMED, b_str_key},
  {"negative key", TXP_MSG_GLOBAL_COMMIT, 0, TXP_EMALFORMED, b_neg_key},
  {"nil key", TXP_MSG_GLOBAL_COMMIT, 0, TXP_EMALFORMED, b_nil_key},
  {"float key", TXP_MSG_GLOBAL_COMMIT, 0, TXP_EMALFORMED, b_float_key},
  /* wrong field types */
  {"xid int", TXP_MSG_GLOBAL_COMMIT, 0, TXP_EFIELD_TYPE, b_xid_int},
  {"xid bin", TXP_MSG_GLOBAL_COMMIT, 0, TXP_EFIELD_TYPE, b_xid_bin},
  {"xid nil", TXP_MSG_GLOBAL_COMMIT, 0, TXP_EFIELD_TYPE, b_xid_nil},
  {"xid array", TXP_MSG_GLOBAL_COMMIT, 0, TXP_EFIELD_TYPE, b_xid_array},
  {"code str", TXP_MSG_GLOBAL_BEGIN_RESULT, 0, TXP_EFIELD_TYPE, b_code_str},
  {"code u64 max", TXP_MSG_GLOBAL_BEGIN_RESULT, 0, TXP_EFIELD_TYPE, b_code_u64max},
  {"code INT64_MAX+1", TXP_MSG_GLOBAL_BEGIN_RESULT, 0, TXP_EFIELD_TYPE, b_code_int64max},
  {"code bool", TXP_MSG_GLOBAL_BEGIN_RESULT, 0, TXP_EFIELD_TYPE, b_code_bool},
  {"u32 negative", TXP_MSG_GLOBAL_BEGIN, 0, TXP_EFIELD_TYPE, b_timeout_neg},
  {"u32 2^32", TXP_MSG_GLOBAL_BEGIN, 0, TXP_EFIELD_TYPE, b_timeout_big},
  {"u32 float", TXP_MSG_GLOBAL_BEGIN, 0, TXP_EFIELD_TYPE, b_timeout_float},
  {"bool int", TXP_MSG_GLOBAL_LOCK_QUERY_RESULT, 0, TXP_EFIELD_TYPE, b_lockable_int},
  /* missing required fields */
  {"no xid", TXP_MSG_GLOBAL_COMMIT, 0, TXP_EFIELD_MISSING, b_empty_map},
  {"no code", TXP_MSG_ERROR, TXP_FLAG_RESPONSE, TXP_EFIELD_MISSING, b_empty_map},
  {"no resource_id", TXP_MSG_BRANCH_REGISTER, 0, TXP_EFIELD_MISSING, b_branch_register_no_resource},
  {"only unknown key", TXP_MSG_GLOBAL_ROLLBACK, 0, TXP_EFIELD_MISSING, b_unknown_only},
  /* duplicate keys */
  {"duplicate xid", TXP_MSG_GLOBAL_COMMIT, 0, TXP_EMALFORMED, b_dup},
  {"duplicate xid, other spelling", TXP_MSG_GLOBAL_COMMIT, 0, TXP_EMALFORMED, b_dup_same},
  {"duplicate ignored field", TXP_MSG_GLOBAL_COMMIT, 0, TXP_EMALFORMED, b_dup_foreign},
  /* strings */
  {"NUL inside", TXP_MSG_GLOBAL_COMMIT, 0, TXP_EFIELD_TYPE, b_nul},
  {"NUL only", TXP_MSG_GLOBAL_COMMIT, 0, TXP_EFIELD_TYPE, b_nul_only},
  /* out-of-range enums */
  {"global_status 16", TXP_MSG_GLOBAL_REPORT, 0, TXP_EFIELD_TYPE, b_gs16},
  {"global_status 21", TXP_MSG_GLOBAL_REPORT, 0, TXP_EFIELD_TYPE, b_gs21},
  {"global_status max", TXP_MSG_GLOBAL_REPORT, 0, TXP_EFIELD_TYPE, b_gs_huge},
  {"global_status 17 in result", TXP_MSG_GLOBAL_STATUS_RESULT, 1, TXP_EFIELD_TYPE, b_result_gs},
  {"branch_status 11", TXP_MSG_BRANCH_REPORT, 0, TXP_EFIELD_TYPE, b_bs11},
  {"branch_status 14", TXP_MSG_BRANCH_REPORT, 0, TXP_EFIELD_TYPE, b_bs14},
  {"branch_type 4", TXP_MSG_BRANCH_REGISTER, 0, TXP_EFIELD_TYPE, b_bt4},
  /* containers and blobs declaring 2^32-1 entries/bytes in a 10-byte body */
  {"map32 2^32-1", TXP_MSG_GLOBAL_BEGIN, 0, TXP_ELIMIT, b_map32_huge},
  {"array32 2^32-1", TXP_MSG_GLOBAL_BEGIN, 0, TXP_ELIMIT, b_array32_huge},
  {"nested map32 2^32-1", TXP_MSG_GLOBAL_BEGIN, 0, TXP_ELIMIT, b_nested_huge},
  {"str32 2^32-1", TXP_MSG_GLOBAL_COMMIT, 0, TXP_ELIMIT, b_str32_huge},
  {"bin32 2^31-1", TXP_MSG_GLOBAL_BEGIN, 0, TXP_ELIMIT, b_bin32_huge},
};

static void test_body_errors(void **state) {
  (void)state;
  for (size_t i = 0; i < NELEM(body_cases); i++) {
    const body_case_t *c = &body_cases[i];
    body_t b;
    body_init(&b);
    c->build(&b);
    hdr_t h = H(c->type, 0x1000 + i);
    h.flags = c->flags;
    h.minor = (uint8_t)(i % 3); /* header fields are echoed whatever the minor */
    alloc_track_start();
    expect_body_error(h, &b, c->want, c->what);
    size_t peak = alloc_track_stop();
    if (peak > 256 * 1024) fail_msg("%s: allocated %zu bytes at once", c->what, peak);
    body_free(&b);
  }
}

/* The 2^32-1 cases above fail on max_count; with every limit out of the way
 * the lying counts and lengths still fail on the bytes actually there
 * (each entry needs at least one), and nothing large is allocated. */
static void test_huge_counts_no_allocation(void **state) {
  (void)state;
  static const char *const bodies[] = {
    "\xdf\xff\xff\xff\xff\x01\x02\x03\x04\x05",
    "\xdd\xff\xff\xff\xff\x01\x02\x03\x04\x05",
    "\x81\x63\xdf\xff\xff\xff\xff\x01\x02\x03",
    "\x81\x63\xdd\xff\xff\xff\xff\x01\x02\x03",
    "\x81\x63\xdc\xff\xff\x01\x02\x03\x04\x05",
    "\x81\x63\xde\xff\xff\x01\x02\x03\x04\x05",
    "\x81\x03\xdb\xff\xff\xff\xff\x61\x62\x63",
    "\x81\x63\xc6\xff\xff\xff\xff\x61\x62\x63",
    "\x81\x63\xc9\xff\xff\xff\xff\x01\x62\x63",
  };
#ifdef TEST_HAVE_ASAN
  { /* the tracker itself sees allocations */
    alloc_track_start();
    void *volatile p = malloc(12345);
    free(p);
    assert_true(alloc_track_stop() >= 12345);
  }
#endif
  txp_limits_t lim = {UINT32_MAX, UINT32_MAX, UINT32_MAX, 32};
  for (size_t i = 0; i < NELEM(bodies); i++) {
    alloc_track_start();
    expect_body_error_lim(&lim, H(TXP_MSG_GLOBAL_BEGIN, i), bodies[i], 10, TXP_EMALFORMED,
                          "huge count, no limits");
    assert_int_equal(txp_mpcheck((const unsigned char *)bodies[i], 10, UINT32_MAX, 32, UINT32_MAX),
                     TXP_EMALFORMED);
    size_t peak = alloc_track_stop();
    if (peak > 64 * 1024) fail_msg("body %zu: allocated %zu bytes at once", i, peak);
  }
}

static void test_invalid_utf8(void **state) {
  (void)state;
  static const struct {
    const char *s;
    size_t n;
  } bad[] = {
    {"\xff", 1},                 {"\xfe", 1},
    {"\x80", 1},                 {"a\xbf", 2},             /* lone continuation */
    {"\xc0\x80", 2},             {"\xc1\xbf", 2},          /* overlong 2-byte */
    {"\xe0\x80\x80", 3},         {"\xe0\x9f\xbf", 3},      /* overlong 3-byte */
    {"\xf0\x80\x80\x80", 4},     {"\xf0\x8f\xbf\xbf", 4},  /* overlong 4-byte */
    {"\xed\xa0\x80", 3},         {"\xed\xbf\xbf", 3},      /* surrogates */
    {"\xf4\x90\x80\x80", 4},     {"\xf5\x80\x80\x80", 4},  /* > U+10FFFF */
    {"\xf8\x88\x80\x80\x80", 5}, {"\xc3", 1},              /* 5-byte, truncated */
    {"ab\xe2\x82", 4},           {"\xe2\x28\xa1", 3},      /* bad continuation */
    {"\xc3\xa9\xc3", 3},
  };
  static const struct {
    const char *s;
    size_t n;
  } good[] = {
    {"", 0},
    {"\x7f", 1},
    {"\xc2\x80", 2},
    {"\xdf\xbf", 2},
    {"\xe0\xa0\x80", 3},
    {"\xed\x9f\xbf", 3},
    {"\xee\x80\x80", 3},
    {"\xef\xbf\xbf", 3},
    {"\xf0\x90\x80\x80", 4},
    {"\xf4\x8f\xbf\xbf", 4},
  };
  txp_buf_t eb;
  txp_buf_init(&eb, 0);
  for (size_t i = 0; i < NELEM(bad); i++) {
    body_t b;
    body_init(&b);
    msgpack_pack_map(&b.pk, 1);
    pk_key(&b, TXP_F_XID);
    pk_strn(&b, bad[i].s, bad[i].n);
    char what[64];
    snprintf(what, sizeof(what), "bad utf-8 #%zu", i);
    expect_body_error(H(TXP_MSG_GLOBAL_COMMIT, 40 + i), &b, TXP_EFIELD_TYPE, what);
    body_free(&b);

    /* and the encoder refuses it */
    char s[8];
    memcpy(s, bad[i].s, bad[i].n);
    s[bad[i].n] = '\0';
    txp_msg_t m;
    txp_msg_init(&m, TXP_MSG_GLOBAL_COMMIT);
    txp_msg_set_str(&m, TXP_F_XID, s);
    assert_int_equal(txp_encode(&m, &eb, 0), TXP_EFIELD_TYPE);
    assert_int_equal(eb.len, 0);
  }
  for (size_t i = 0; i < NELEM(good); i++) {
    body_t b;
    body_init(&b);
    msgpack_pack_map(&b.pk, 1);
    pk_key(&b, TXP_F_XID);
    pk_strn(&b, good[i].s, good[i].n);
    txp_msg_t m;
    expect_decode_ok(NULL, H(TXP_MSG_GLOBAL_COMMIT, 1), b.sb.data, b.sb.size, &m, "good utf-8");
    assert_int_equal(strlen(m.xid), good[i].n);
    assert_memory_equal(m.xid, good[i].s, good[i].n);
    txp_msg_clear(&m);
    body_free(&b);
  }
  txp_buf_free(&eb);
}

/* Status 0 ("Unknown") is a legal value on the wire (e.g. GlobalStatus of
 * an xid the coordinator has never seen); the table's edges are accepted. */
static void test_status_values_accepted(void **state) {
  (void)state;
  static const uint32_t gs_ok[] = {0, 1, 15, 19, 20};
  for (size_t i = 0; i < NELEM(gs_ok); i++) {
    body_t b;
    body_init(&b);
    b_gs(&b, gs_ok[i]);
    txp_msg_t m;
    expect_decode_ok(NULL, H(TXP_MSG_GLOBAL_REPORT, 1), b.sb.data, b.sb.size, &m, "gs ok");
    assert_int_equal(m.global_status, gs_ok[i]);
    txp_msg_clear(&m);
    body_free(&b);
  }
  static const uint32_t bs_ok[] = {0, 1, 10, 13};
  for (size_t i = 0; i < NELEM(bs_ok); i++) {
    body_t b;
    body_init(&b);
    b_bs(&b, bs_ok[i]);
    txp_msg_t m;
    expect_decode_ok(NULL, H(TXP_MSG_BRANCH_REPORT, 1), b.sb.data, b.sb.size, &m, "bs ok");
    assert_int_equal(m.branch_status, bs_ok[i]);
    txp_msg_clear(&m);
    body_free(&b);
  }
  for (uint32_t bt = 0; bt < TXP_BT__MAX; bt++) {
    body_t b;
    body_init(&b);
    b_bt(&b, bt);
    txp_msg_t m;
    expect_decode_ok(NULL, H(TXP_MSG_BRANCH_REGISTER, 1), b.sb.data, b.sb.size, &m, "bt ok");
    assert_int_equal(m.branch_type, bt);
    txp_msg_clear(&m);
    body_free(&b);
  }
  /* i64 extremes and every integer spelling */
  static const char *const code_spellings[] = {
    "\x81\x01\x00",         "\x81\x01\xcc\x00",         "\x81\x01\xd0\x00",
    "\x81\x01\xcd\x00\x00", "\x81\x01\xd3\x00\x00\x00\x00\x00\x00\x00\x00",
  };
  static const size_t code_len[] = {3, 4, 4, 5, 11};
  for (size_t i = 0; i < NELEM(code_spellings); i++) {
    txp_msg_t m;
    expect_decode_ok(NULL, H(TXP_MSG_HEARTBEAT_RESULT, 1), code_spellings[i], code_len[i], &m,
                     "code 0");
    assert_int_equal(m.code, 0);
    assert_int_equal(m.present, TXP_FIELD_BIT(TXP_F_CODE));
    txp_msg_clear(&m);
  }
  txp_msg_t m;
  expect_decode_ok(NULL, H(TXP_MSG_HEARTBEAT_RESULT, 1),
                   "\x81\x01\xd3\x80\x00\x00\x00\x00\x00\x00\x00", 11, &m, "INT64_MIN");
  assert_true(m.code == INT64_MIN);
  txp_msg_clear(&m);
  expect_decode_ok(NULL, H(TXP_MSG_HEARTBEAT_RESULT, 1),
                   "\x81\x01\xcf\x7f\xff\xff\xff\xff\xff\xff\xff", 11, &m, "INT64_MAX");
  assert_true(m.code == INT64_MAX);
  txp_msg_clear(&m);
  expect_decode_ok(NULL, H(TXP_MSG_GLOBAL_BEGIN, 1), "\x81\x05\xce\xff\xff\xff\xff", 7, &m,
                   "UINT32_MAX");
  assert_true(m.timeout_ms == UINT32_MAX);
  txp_msg_clear(&m);
  expect_decode_ok(NULL, H(TXP_MSG_GLOBAL_BEGIN, 1), "\x81\x05\xd3\x00\x00\x00\x00\xff\xff\xff\xff",
                   11, &m, "UINT32_MAX as int64");
  assert_true(m.timeout_ms == UINT32_MAX);
  txp_msg_clear(&m);
}

/* ================================================================ limits */

static void test_limit_max_frame(void **state) {
  (void)state;
  txp_limits_t lim;
  txp_limits_default(&lim);
  lim.max_frame = 64;

  /* GlobalCommit {3: "x" * n}: body = 1 + 1 + 2 (str8) + n */
  char xid[TXP_MAX_XID_LEN + 1];
  memset(xid, 'x', sizeof(xid));
  for (int over = 0; over < 2; over++) {
    size_t n = 60 + (size_t)over;
    body_t b;
    body_init(&b);
    msgpack_pack_map(&b.pk, 1);
    pk_key(&b, TXP_F_XID);
    pk_strn(&b, xid, n);
    assert_int_equal(b.sb.size, 64 + (size_t)over);
    hdr_t h = H(TXP_MSG_GLOBAL_COMMIT, 77);
    h.flags = TXP_FLAG_ONEWAY;

    /* encode: body == max_frame is fine, one more is refused */
    char s[TXP_MAX_XID_LEN + 1];
    memcpy(s, xid, n);
    s[n] = '\0';
    txp_msg_t m;
    txp_msg_init(&m, TXP_MSG_GLOBAL_COMMIT);
    txp_msg_set_str(&m, TXP_F_XID, s);
    txp_buf_t eb;
    txp_buf_init(&eb, 0);
    assert_int_equal(txp_encode(&m, &eb, 64), over ? TXP_EFRAME_TOO_BIG : 0);
    assert_int_equal(eb.len, over ? 0 : 20 + 64);
    assert_int_equal(txp_encode(&m, &eb, 65), 0);
    txp_buf_free(&eb);

    if (!over) {
      txp_msg_t out;
      expect_decode_ok(&lim, h, b.sb.data, b.sb.size, &out, "body == max_frame");
      assert_int_equal(strlen(out.xid), 60);
      txp_msg_clear(&out);
    } else {
      /* detected from the header alone, before the body arrives */
      bytes_t hs = {0};
      add_frame(&hs, h, b.sb.data, b.sb.size);
      txp_decoder_t *d = txp_decoder_new(&lim);
      assert_int_equal(txp_decoder_feed(d, hs.p, TXP_HEADER_SIZE - 1), 0);
      txp_msg_t out;
      txp_msg_init(&out, TXP_MSG_NONE);
      assert_int_equal(txp_decoder_next(d, &out), TXP_EAGAIN);
      assert_int_equal(txp_decoder_feed(d, hs.p + TXP_HEADER_SIZE - 1, 1), 0);
      assert_int_equal(txp_decoder_next(d, &out), TXP_EFRAME_TOO_BIG);
      assert_header_only(&out, TXP_MSG_GLOBAL_COMMIT, TXP_FLAG_ONEWAY, 77);
      txp_msg_clear(&out);
      /* poisoned: the body and a valid frame after it change nothing */
      assert_int_equal(txp_decoder_feed(d, hs.p + TXP_HEADER_SIZE, hs.n - TXP_HEADER_SIZE), 0);
      size_t before = hs.n;
      add_good_frame(&hs, 78);
      assert_int_equal(txp_decoder_feed(d, hs.p + before, hs.n - before), 0);
      assert_int_equal(txp_decoder_next(d, &out), TXP_EFRAME_TOO_BIG);
      assert_int_equal(txp_decoder_next(d, &out), TXP_EFRAME_TOO_BIG);
      txp_msg_clear(&out);
      txp_decoder_free(d);
      /* txp_decode_frame: header only is enough too */
      assert_int_equal(txp_decode_frame(hs.p, TXP_HEADER_SIZE, &lim, &out), TXP_EFRAME_TOO_BIG);
      assert_header_only(&out, TXP_MSG_GLOBAL_COMMIT, TXP_FLAG_ONEWAY, 77);
      txp_msg_clear(&out);
      bytes_free(&hs);
    }
    body_free(&b);
  }

  /* default limit: a header declaring 4 GiB - 1 */
  bytes_t hs = {0};
  add_header(&hs, H(TXP_MSG_GLOBAL_BEGIN, 5), UINT32_MAX);
  txp_msg_t out;
  txp_msg_init(&out, TXP_MSG_NONE);
  assert_int_equal(txp_decode_frame(hs.p, hs.n, NULL, &out), TXP_EFRAME_TOO_BIG);
  assert_int_equal(out.request_id, 5);
  txp_msg_clear(&out);
  hs.n = 0;
  add_header(&hs, H(TXP_MSG_GLOBAL_BEGIN, 5), TXP_DEFAULT_MAX_FRAME + 1);
  assert_int_equal(txp_decode_frame(hs.p, hs.n, NULL, &out), TXP_EFRAME_TOO_BIG);
  txp_msg_clear(&out);
  hs.n = 0;
  add_header(&hs, H(TXP_MSG_GLOBAL_BEGIN, 5), TXP_DEFAULT_MAX_FRAME);
  assert_int_equal(txp_decode_frame(hs.p, hs.n, NULL, &out), TXP_EAGAIN);
  txp_msg_clear(&out);
  bytes_free(&hs);
}

/* Per-field lengths: every string field at its limit and one past, on the
 * encode side and the decode side; limits count bytes, not characters. */
static void test_limit_field_lengths(void **state) {
  (void)state;
  txp_buf_t eb;
  txp_buf_init(&eb, 0);
  size_t checked = 0;
  for (size_t i = 0; i < nfspec; i++) {
    const fspec_t *f = &fspec[i];
    if (f->kind != K_STR) continue;
    const tspec_t *ts = NULL;
    for (size_t t = 0; t < ntspec && !ts; t++)
      if (tspec[t].allowed & TXP_FIELD_BIT(f->key)) ts = &tspec[t];
    assert_non_null(ts);
    char *s = malloc(f->max_len + 2);
    assert_non_null(s);
    for (int over = 0; over < 2; over++) {
      size_t n = f->max_len + (size_t)over;
      memset(s, 'a' + (int)(i % 26), n);
      s[n] = '\0';
      txp_msg_t m;
      make_msg(&m, ts->type, ts->req, 0, 500 + i, 0);
      txp_msg_set_str(&m, (txp_field_t)f->key, s);
      txp_buf_reset(&eb);
      int rc = txp_encode(&m, &eb, 0);
      if (rc != (over ? TXP_EFIELD_TOO_LONG : 0))
        fail_msg("encode %s len %zu: %s", f->name, n, txp_errname(rc));
      assert_int_equal(eb.len == 0, over);

      body_t b;
      body_init(&b);
      pack_fields(&b, &m, 0);
      hdr_t h = H((uint16_t)ts->type, 500 + i);
      if (over) {
        expect_body_error(h, &b, TXP_EFIELD_TOO_LONG, f->name);
      } else {
        txp_msg_t out;
        expect_decode_ok(NULL, h, b.sb.data, b.sb.size, &out, f->name);
        assert_int_equal(strlen(msg_str(&out, f)), n);
        assert_msg_eq(&m, &out);
        txp_msg_clear(&out);
      }
      body_free(&b);
    }
    free(s);
    checked++;
  }
  assert_int_equal(checked, 13);

  /* xid explicitly, in two-byte characters: 64 x U+00E9 = 128 bytes */
  char x[2 * 65 + 1];
  for (int k = 0; k < 65; k++) x[2 * k] = '\xc3', x[2 * k + 1] = '\xa9';
  x[128] = '\0';
  txp_msg_t m;
  txp_msg_init(&m, TXP_MSG_GLOBAL_STATUS);
  txp_msg_set_str(&m, TXP_F_XID, x);
  txp_buf_reset(&eb);
  assert_int_equal(txp_encode(&m, &eb, 0), 0);
  txp_msg_t out;
  txp_msg_init(&out, TXP_MSG_NONE);
  assert_int_equal(txp_decode_frame(eb.data, eb.len, NULL, &out), 0);
  assert_string_equal(out.xid, x);
  txp_msg_clear(&out);
  x[128] = '\xc3';
  x[130] = '\0';
  txp_buf_reset(&eb);
  assert_int_equal(txp_encode(&m, &eb, 0), TXP_EFIELD_TOO_LONG);
  assert_int_equal(eb.len, 0);
  txp_buf_free(&eb);
}

static void test_limit_max_string(void **state) {
  (void)state;
  txp_limits_t lim;
  txp_limits_default(&lim);
  lim.max_string = 100;
  char s[102];
  memset(s, 'q', sizeof(s));
  for (int over = 0; over < 2; over++) {
    size_t n = 100 + (size_t)over;
    /* a known field */
    body_t b;
    body_init(&b);
    msgpack_pack_map(&b.pk, 1);
    pk_key(&b, TXP_F_XID);
    pk_strn(&b, s, n);
    hdr_t h = H(TXP_MSG_GLOBAL_COMMIT, 9);
    if (over) {
      expect_body_error_lim(&lim, h, b.sb.data, b.sb.size, TXP_ELIMIT, "xid > max_string");
    } else {
      txp_msg_t m;
      expect_decode_ok(&lim, h, b.sb.data, b.sb.size, &m, "xid == max_string");
      assert_int_equal(strlen(m.xid), 100);
      txp_msg_clear(&m);
    }
    body_free(&b);

    /* an unknown key, as str, bin and ext */
    for (int kind = 0; kind < 3; kind++) {
      body_init(&b);
      msgpack_pack_map(&b.pk, 2);
      pk_key(&b, TXP_F_XID);
      pk_str(&b, "x");
      pk_key(&b, 200);
      if (kind == 0) pk_strn(&b, s, n);
      else if (kind == 1) {
        msgpack_pack_bin(&b.pk, n);
        msgpack_pack_bin_body(&b.pk, s, n);
      } else {
        msgpack_pack_ext(&b.pk, n, 7);
        msgpack_pack_ext_body(&b.pk, s, n);
      }
      if (over) {
        expect_body_error_lim(&lim, h, b.sb.data, b.sb.size, TXP_ELIMIT, "blob > max_string");
      } else {
        txp_msg_t m;
        expect_decode_ok(&lim, h, b.sb.data, b.sb.size, &m, "blob == max_string");
        assert_int_equal(m.present, TXP_FIELD_BIT(TXP_F_XID));
        txp_msg_clear(&m);
      }
      body_free(&b);
    }
  }
}

/* {xid, then 'extra' unknown keys} and {xid, 99: [extra nils]} */
static void build_count_body(body_t *b, uint32_t extra, int as_array) {
  body_init(b);
  if (as_array) {
    msgpack_pack_map(&b->pk, 2);
    pk_key(b, TXP_F_XID);
    pk_str(b, "x");
    pk_key(b, 99);
    msgpack_pack_array(&b->pk, extra);
    for (uint32_t i = 0; i < extra; i++) msgpack_pack_nil(&b->pk);
  } else {
    msgpack_pack_map(&b->pk, 1 + extra);
    pk_key(b, TXP_F_XID);
    pk_str(b, "x");
    for (uint32_t i = 0; i < extra; i++) {
      pk_key(b, 100 + i);
      msgpack_pack_nil(&b->pk);
    }
  }
}

static void test_limit_max_count(void **state) {
  (void)state;
  txp_limits_t small = {4096, 4096, 8, 3};
  const txp_limits_t *lims[] = {NULL, &small};
  const uint32_t counts[] = {TXP_DEFAULT_MAX_COUNT, 8};
  for (int l = 0; l < 2; l++) {
    uint32_t mc = counts[l];
    for (int as_array = 0; as_array < 2; as_array++) {
      uint32_t base = as_array ? mc : mc - 1; /* map: xid is one of the entries */
      for (int over = 0; over < 2; over++) {
        body_t b;
        build_count_body(&b, base + (uint32_t)over, as_array);
        hdr_t h = H(TXP_MSG_GLOBAL_COMMIT, 3);
        if (over) {
          expect_body_error_lim(lims[l], h, b.sb.data, b.sb.size, TXP_ELIMIT, "count + 1");
        } else {
          txp_msg_t m;
          expect_decode_ok(lims[l], h, b.sb.data, b.sb.size, &m, "count at limit");
          assert_int_equal(m.present, TXP_FIELD_BIT(TXP_F_XID));
          txp_msg_clear(&m);
        }
        body_free(&b);
      }
    }
  }
}

/* {xid, 99: [[...[1]...]]} with 'arrays' levels of array under the map. */
static void build_depth_body(body_t *b, int arrays, int use_maps) {
  body_init(b);
  msgpack_pack_map(&b->pk, 2);
  pk_key(b, TXP_F_XID);
  pk_str(b, "x");
  pk_key(b, 99);
  for (int i = 0; i < arrays; i++) {
    if (use_maps) {
      msgpack_pack_map(&b->pk, 1);
      msgpack_pack_int(&b->pk, i);
    } else {
      msgpack_pack_array(&b->pk, 1);
    }
  }
  msgpack_pack_int(&b->pk, 1);
}

static void test_limit_max_depth(void **state) {
  (void)state;
  txp_limits_t two = {0, 0, 0, 2};
  txp_limits_t small = {4096, 4096, 8, 3};
  txp_limits_t deep = {0, 0, 0, 32};
  const struct {
    const txp_limits_t *lim;
    int depth;
  } cases[] = {{NULL, TXP_DEFAULT_MAX_DEPTH}, {&two, 2}, {&small, 3}, {&deep, 32}};
  for (size_t c = 0; c < NELEM(cases); c++)
    for (int use_maps = 0; use_maps < 2; use_maps++)
      for (int over = 0; over < 2; over++) {
        body_t b;
        build_depth_body(&b, cases[c].depth - 1 + over, use_maps); /* the root map is level 1 */
        hdr_t h = H(TXP_MSG_GLOBAL_COMMIT, 4);
        if (over) {
          expect_body_error_lim(cases[c].lim, h, b.sb.data, b.sb.size, TXP_ELIMIT, "depth + 1");
        } else {
          txp_msg_t m;
          expect_decode_ok(cases[c].lim, h, b.sb.data, b.sb.size, &m, "depth at limit");
          assert_int_equal(m.present, TXP_FIELD_BIT(TXP_F_XID));
          txp_msg_clear(&m);
        }
        body_free(&b);
      }
  /* a max_depth past the checker's own bound is clamped, not trusted */
  txp_limits_t huge = {0, 0, 0, UINT32_MAX};
  body_t b;
  build_depth_body(&b, 40, 0);
  expect_body_error_lim(&huge, H(TXP_MSG_GLOBAL_COMMIT, 4), b.sb.data, b.sb.size, TXP_ELIMIT,
                        "depth 41");
  body_free(&b);
}

static void test_limit_decoder_buffer(void **state) {
  (void)state;
  txp_limits_t lim = {16, 0, 0, 0};
  size_t bound = 16 + TXP_HEADER_SIZE + TXP_DECODER_SLACK;
  char *zeros = calloc(1, bound + 1);
  assert_non_null(zeros);

  /* one chunk past the bound, into an empty decoder */
  txp_decoder_t *d = txp_decoder_new(&lim);
  assert_int_equal(txp_decoder_feed(d, zeros, bound + 1), TXP_EBUFFER_FULL);
  assert_int_equal(txp_decoder_buffered(d), 0);
  /* exactly the bound, then one more byte */
  assert_int_equal(txp_decoder_feed(d, zeros, bound), 0);
  assert_int_equal(txp_decoder_buffered(d), bound);
  assert_int_equal(txp_decoder_feed(d, zeros, 1), TXP_EBUFFER_FULL);
  assert_int_equal(txp_decoder_buffered(d), bound);
  assert_int_equal(txp_decoder_feed(d, zeros, 0), 0); /* empty feed is always fine */
  txp_decoder_free(d);
  free(zeros);

  /* valid frames, fed without draining until full; drain; feed again */
  bytes_t f = {0};
  body_t b;
  body_init(&b);
  msgpack_pack_map(&b.pk, 0);
  add_body_frame(&f, H(TXP_MSG_GLOBAL_BEGIN, 1), &b);
  body_free(&b);
  assert_int_equal(f.n, 21);
  d = txp_decoder_new(&lim);
  size_t fed = 0;
  int rc;
  while ((rc = txp_decoder_feed(d, f.p, f.n)) == 0) fed++;
  assert_int_equal(rc, TXP_EBUFFER_FULL);
  assert_int_equal(fed, bound / 21);
  txp_msg_t m;
  for (size_t i = 0; i < fed; i++) {
    txp_msg_init(&m, TXP_MSG_NONE);
    assert_int_equal(txp_decoder_next(d, &m), 0);
    txp_msg_clear(&m);
    if (i == 0) { /* one frame out: room for one more */
      assert_int_equal(txp_decoder_feed(d, f.p, f.n), 0);
      fed++;
    }
  }
  txp_msg_init(&m, TXP_MSG_NONE);
  assert_int_equal(txp_decoder_next(d, &m), TXP_EAGAIN);
  assert_int_equal(txp_decoder_buffered(d), 0);
  assert_int_equal(txp_decoder_feed(d, f.p, f.n), 0);
  assert_int_equal(txp_decoder_next(d, &m), 0);
  txp_msg_clear(&m);
  txp_decoder_free(d);
  bytes_free(&f);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_bad_magic_sticky),
    cmocka_unit_test(test_body_errors),
    cmocka_unit_test(test_huge_counts_no_allocation),
    cmocka_unit_test(test_invalid_utf8),
    cmocka_unit_test(test_status_values_accepted),
    cmocka_unit_test(test_limit_max_frame),
    cmocka_unit_test(test_limit_field_lengths),
    cmocka_unit_test(test_limit_max_string),
    cmocka_unit_test(test_limit_max_count),
    cmocka_unit_test(test_limit_max_depth),
    cmocka_unit_test(test_limit_decoder_buffer),
  };
  return cmocka_run_group_tests_name("proto_codec_bad", tests, NULL, NULL);
}
