/*
 * test_proto_codec.c - the frame codec (txp_msg.h) and the msgpack
 * structure check (txp_mpcheck.h) on valid input, in the style of
 * hiredis's reader tests: the tables pinned, every message type encoded
 * and decoded, golden bytes, hand-made byte streams fed whole, byte by
 * byte and in random chunks, versions and unknown keys, the msgpack
 * checker, what the encoder refuses, and regressions.  Malformed frames
 * and the limits are test_proto_codec_bad; both share codec_fixture.h.
 *
 * Every decoded message is txp_msg_clear'ed: the build runs this under
 * ASan/LeakSanitizer (and valgrind), so a leak fails the test.
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

/* The field table pinned independently: key, kind, limit are the wire
 * format. */
static const struct {
  int key;
  int kind;
  uint32_t max_len;
} field_pin[] = {
  {1, K_I64, 0},     {2, K_STR, 1024}, {3, K_STR, 128},    {4, K_I64, 0},     {5, K_U32, 0},
  {6, K_STR, 128},   {7, K_U32, 0},    {8, K_U32, 0},      {9, K_U32, 0},     {10, K_STR, 256},
  {11, K_STR, 65536}, {12, K_STR, 65536}, {13, K_U32, 0},  {14, K_U32, 0},    {15, K_STR, 64},
  {16, K_STR, 128},  {17, K_STR, 256}, {18, K_STR, 4096},  {19, K_STR, 128},  {20, K_U32, 0},
  {21, K_BOOL, 0},   {22, K_U32, 0},   {23, K_STR, 128},   {24, K_U32, 0},    {25, K_STR, 128},
  {26, K_BOOL, 0},
};

/* xorshift64*: deterministic chunk sizes. */
static uint64_t rng(uint64_t *s) {
  uint64_t x = *s;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  *s = x;
  return x * UINT64_C(2685821657736338717);
}

/* =============================================================== tests */

static void test_tables_pinned(void **state) {
  (void)state;
  assert_int_equal(nfspec, NELEM(field_pin));
  for (size_t i = 0; i < NELEM(field_pin); i++) {
    const fspec_t *f = field_of(field_pin[i].key);
    assert_non_null(f);
    assert_int_equal(f->kind, field_pin[i].kind);
    assert_int_equal(f->max_len, field_pin[i].max_len);
    assert_string_equal(txp_field_name(f->key), f->name);
  }
  assert_string_equal(txp_field_name(0), "unknown");
  assert_string_equal(txp_field_name(TXP_F__MAX), "unknown");
  assert_string_equal(txp_field_name(-1), "unknown");

  /* Every valid type is in tspec and vice versa, with its name. */
  int nvalid = 0;
  for (int t = -2; t < TXP_MSG__MAX + 10; t++) {
    const tspec_t *ts = type_of(t);
    assert_int_equal(txp_msg_type_valid(t), ts != NULL);
    if (!ts) {
      assert_string_equal(txp_msg_type_name(t), "Unknown");
      assert_false(txp_msg_type_is_request(t));
      continue;
    }
    nvalid++;
    assert_string_equal(txp_msg_type_name(t), ts->name);
    assert_true((ts->req & ts->allowed) == ts->req);
    bool is_req = t != TXP_MSG_ERROR && (t % 2) == 0;
    assert_int_equal(txp_msg_type_is_request(t), is_req);
    if (is_req) assert_non_null(type_of(t + 1));
  }
  assert_int_equal(nvalid, (int)ntspec);
  assert_int_equal(TXP_HEADER_SIZE, 20);
  assert_int_equal(TXP_MAX_XID_LEN, 128);
}

/* For every type and every field: the encoder accepts it iff the table
 * allows it, and refuses to drop any required field. */
static void test_encode_field_table(void **state) {
  (void)state;
  txp_buf_t b;
  txp_buf_init(&b, 0);
  for (size_t i = 0; i < ntspec; i++) {
    const tspec_t *ts = &tspec[i];
    for (int k = 1; k < TXP_F__MAX; k++) {
      txp_msg_t m;
      make_msg(&m, ts->type, ts->req | TXP_FIELD_BIT(k), 0, 7, 0);
      txp_buf_reset(&b);
      int rc = txp_encode(&m, &b, 0);
      int want = (ts->allowed & TXP_FIELD_BIT(k)) ? 0 : TXP_EFIELD_TYPE;
      if (rc != want)
        fail_msg("%s + %s: got %s, want %s", ts->name, field_of(k)->name, txp_errname(rc),
                 txp_errname(want));
      if (rc != 0) assert_int_equal(b.len, 0);

      /* Decoding a frame with a field the type does not allow ignores it. */
      if (!(ts->allowed & TXP_FIELD_BIT(k))) {
        bytes_t s = {0};
        add_msg_frame(&s, &m);
        txp_msg_t out;
        txp_msg_init(&out, TXP_MSG_NONE);
        rc = txp_decode_frame(s.p, s.n, NULL, &out);
        if (rc != 0) fail_msg("%s + foreign %s: %s", ts->name, field_of(k)->name, txp_errname(rc));
        assert_int_equal(out.present, ts->req);
        assert_absent_zero(&out);
        txp_msg_clear(&out);
        bytes_free(&s);
      }
    }
    for (int k = 1; k < TXP_F__MAX; k++) {
      if (!(ts->req & TXP_FIELD_BIT(k))) continue;
      txp_msg_t m;
      /* one of a set: without all of them */
      uint64_t drop = (ts->one_of & TXP_FIELD_BIT(k)) ? ts->one_of : TXP_FIELD_BIT(k);
      make_msg(&m, ts->type, ts->allowed & ~drop, 0, 7, 0);
      txp_buf_reset(&b);
      assert_int_equal(txp_encode(&m, &b, 0), TXP_EFIELD_MISSING);
      assert_int_equal(b.len, 0);
      /* and the decoder refuses the frame the test packs without it */
      bytes_t s = {0};
      add_msg_frame(&s, &m);
      txp_msg_t out;
      txp_msg_init(&out, TXP_MSG_NONE);
      assert_int_equal(txp_decode_frame(s.p, s.n, NULL, &out), TXP_EFIELD_MISSING);
      assert_header_only(&out, (uint16_t)ts->type, 0, 7);
      txp_msg_clear(&out);
      bytes_free(&s);
    }
  }
  txp_buf_free(&b);
}

/* Each type with all its allowed fields, and with only the required ones:
 * encode, compare the body with the test's packer, decode, compare. */
static void test_roundtrip_every_type(void **state) {
  (void)state;
  txp_buf_t b, b2;
  txp_buf_init(&b, 0);
  txp_buf_init(&b2, 0);
  for (size_t i = 0; i < ntspec; i++) {
    for (int variant = 0; variant < 2; variant++) {
      const tspec_t *ts = &tspec[i];
      txp_msg_t m;
      uint64_t rid = variant ? UINT64_MAX - i : 1000 + i;
      uint16_t flags = (uint16_t)((i + (size_t)variant) % 4);
      make_msg(&m, ts->type, variant ? ts->req : ts->allowed, variant, rid, flags);
      txp_buf_reset(&b);
      int rc = txp_encode(&m, &b, 0);
      if (rc != 0) fail_msg("%s: encode %s", ts->name, txp_errname(rc));

      /* the header, byte for byte */
      const unsigned char *h = (const unsigned char *)b.data;
      assert_int_equal(h[0], 0xDA);
      assert_int_equal(h[1], 0xDA);
      assert_int_equal(h[2], TXP_VERSION_MAJOR);
      assert_int_equal(h[3], TXP_VERSION_MINOR);
      assert_int_equal((h[4] << 8) | h[5], ts->type);
      assert_int_equal((h[6] << 8) | h[7], flags);
      uint64_t r = 0;
      for (int k = 0; k < 8; k++) r = (r << 8) | h[8 + k];
      assert_int_equal(r, rid);
      uint32_t blen = ((uint32_t)h[16] << 24) | ((uint32_t)h[17] << 16) | ((uint32_t)h[18] << 8) | h[19];
      assert_int_equal(blen, b.len - TXP_HEADER_SIZE);

      /* the body, byte for byte, against the independent packer */
      body_t pb;
      body_init(&pb);
      pack_fields(&pb, &m, 0);
      assert_int_equal(pb.sb.size, blen);
      assert_memory_equal(pb.sb.data, b.data + TXP_HEADER_SIZE, blen);
      body_free(&pb);

      txp_msg_t out;
      txp_msg_init(&out, TXP_MSG_NONE);
      rc = txp_decode_frame(b.data, b.len, NULL, &out);
      if (rc != 0) fail_msg("%s: decode %s", ts->name, txp_errname(rc));
      assert_msg_eq(&m, &out);
      assert_absent_zero(&out);
      assert_int_equal(out.ver_major, TXP_VERSION_MAJOR);
      assert_int_equal(out.ver_minor, TXP_VERSION_MINOR);
      for (int k = 1; k < TXP_F__MAX; k++)
        assert_int_equal(txp_msg_has(&out, (txp_field_t)k), (m.present & TXP_FIELD_BIT(k)) != 0);

      /* re-encoding the decoded message gives the same bytes */
      txp_buf_reset(&b2);
      assert_int_equal(txp_encode(&out, &b2, 0), 0);
      assert_int_equal(b2.len, b.len);
      assert_memory_equal(b2.data, b.data, b.len);
      txp_msg_clear(&out);
      /* clear is idempotent */
      txp_msg_clear(&out);
      assert_null(out.owned_);
    }
  }
  txp_buf_free(&b);
  txp_buf_free(&b2);
}

/* 'm' encodes to exactly 'skip' bytes (the header, unchecked when not 0)
 * and then the 'n' bytes of 'want'. */
static void assert_encodes_to(const txp_msg_t *m, size_t skip, const unsigned char *want, size_t n) {
  txp_buf_t b;
  txp_buf_init(&b, 0);
  assert_int_equal(txp_encode(m, &b, 0), 0);
  assert_int_equal(b.len, skip + n);
  assert_memory_equal((const unsigned char *)b.data + skip, want, n);
  txp_buf_free(&b);
}

static void test_golden_bytes(void **state) {
  (void)state;
  txp_msg_t m;
  txp_msg_init(&m, TXP_MSG_GLOBAL_COMMIT);
  m.request_id = UINT64_C(0x0102030405060708);
  m.flags = TXP_FLAG_ONEWAY;
  txp_msg_set_str(&m, TXP_F_XID, "ab");
  static const unsigned char want1[] = {0xDA, 0xDA, 0x01, 0x00, 0x00, 0x16, 0x00, 0x02, 0x01,
                                        0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x00, 0x00,
                                        0x00, 0x05, 0x81, 0x03, 0xA2, 0x61, 0x62};
  assert_encodes_to(&m, 0, want1, sizeof(want1));

  /* A result built with txp_msg_init_result: type + 1, RESPONSE, code. */
  txp_msg_t res;
  txp_msg_init(&m, TXP_MSG_GLOBAL_REPORT);
  m.request_id = 1;
  txp_msg_init_result(&res, &m, TXP_ELOCK_CONFLICT, NULL);
  assert_int_equal(res.type, TXP_MSG_GLOBAL_REPORT_RESULT);
  assert_int_equal(res.flags, TXP_FLAG_RESPONSE);
  assert_int_equal(res.request_id, 1);
  assert_int_equal(res.present, TXP_FIELD_BIT(TXP_F_CODE));
  static const unsigned char want2[] = {0xDA, 0xDA, 0x01, 0x00, 0x00, 0x1D, 0x00, 0x01, 0x00,
                                        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00,
                                        0x00, 0x05, 0x81, 0x01, 0xD1, 0xD8, 0x87};
  assert_encodes_to(&res, 0, want2, sizeof(want2));

  /* bool false is carried, not dropped */
  txp_msg_init(&m, TXP_MSG_GLOBAL_LOCK_QUERY_RESULT);
  txp_msg_set_int(&m, TXP_F_CODE, 0);
  txp_msg_set_int(&m, TXP_F_LOCKABLE, 0);
  static const unsigned char body3[] = {0x82, 0x01, 0x00, 0x15, 0xC2};
  assert_encodes_to(&m, TXP_HEADER_SIZE, body3, sizeof(body3));
}

static void test_msg_helpers(void **state) {
  (void)state;
  txp_msg_t m, res;
  /* results of requests; anything else is answered with Error */
  for (size_t i = 0; i < ntspec; i++) {
    txp_msg_init(&m, (txp_msg_type_t)tspec[i].type);
    m.request_id = 99 + i;
    m.flags = TXP_FLAG_ONEWAY;
    txp_msg_init_result(&res, &m, TXP_EBUSY, "busy");
    int want = txp_msg_type_is_request(m.type) ? m.type + 1 : TXP_MSG_ERROR;
    assert_int_equal(res.type, want);
    assert_int_equal(res.request_id, 99 + i);
    assert_int_equal(res.flags, TXP_FLAG_RESPONSE);
    assert_int_equal(res.code, TXP_EBUSY);
    assert_string_equal(res.message, "busy");
    assert_int_equal(res.present, TXP_FIELD_BIT(TXP_F_CODE) | TXP_FIELD_BIT(TXP_F_MESSAGE));
    txp_buf_t b;
    txp_buf_init(&b, 0);
    assert_int_equal(txp_encode(&res, &b, 0), 0);
    txp_buf_free(&b);
  }
  txp_msg_init(&m, TXP_MSG_NONE);
  m.type = 77;
  txp_msg_init_result(&res, &m, 0, NULL);
  assert_int_equal(res.type, TXP_MSG_ERROR);
  assert_int_equal(res.present, TXP_FIELD_BIT(TXP_F_CODE));

  /* setters */
  txp_msg_init(&m, TXP_MSG_GLOBAL_COMMIT);
  txp_msg_set_str(&m, TXP_F_XID, "x");
  assert_true(txp_msg_has(&m, TXP_F_XID));
  txp_msg_set_str(&m, TXP_F_XID, NULL);
  assert_false(txp_msg_has(&m, TXP_F_XID));
  assert_null(m.xid);
  txp_msg_set_int(&m, TXP_F_XID, 5); /* wrong kind: ignored */
  assert_false(txp_msg_has(&m, TXP_F_XID));
  txp_msg_set_str(&m, TXP_F_CODE, "x"); /* wrong kind: ignored */
  assert_false(txp_msg_has(&m, TXP_F_CODE));
  txp_msg_set_int(&m, (txp_field_t)0, 5);
  txp_msg_set_int(&m, (txp_field_t)TXP_F__MAX, 5);
  txp_msg_set_str(&m, (txp_field_t)40, "x");
  assert_int_equal(m.present, 0);
  assert_false(txp_msg_has(&m, (txp_field_t)0));
  assert_false(txp_msg_has(&m, (txp_field_t)63));
  txp_msg_set_int(&m, TXP_F_TIMEOUT_MS, INT64_C(0x100000005)); /* u32: truncated */
  assert_int_equal(m.timeout_ms, 5);
  txp_msg_set_int(&m, TXP_F_LOCKABLE, 42);
  assert_true(m.lockable);
  txp_msg_clear(&m); /* nothing owned: fine */
  assert_int_equal(m.type, 0);

  /* txp_buf */
  txp_buf_t b;
  txp_buf_init(&b, 0);
  txp_buf_consume(&b, 10);
  assert_int_equal(b.len, 0);
  txp_msg_init(&m, TXP_MSG_HEARTBEAT);
  assert_int_equal(txp_encode(&m, &b, 0), 0);
  assert_int_equal(txp_encode(&m, &b, 0), 0);
  assert_int_equal(b.len, 2 * 21);
  txp_buf_consume(&b, 21);
  assert_int_equal(b.len, 21);
  assert_int_equal((unsigned char)b.data[0], 0xDA);
  txp_buf_consume(&b, 100);
  assert_int_equal(b.len, 0);
  txp_buf_free(&b);
  txp_buf_free(&b);
  txp_decoder_free(NULL);

  txp_limits_t l;
  txp_limits_default(&l);
  assert_int_equal(l.max_frame, TXP_DEFAULT_MAX_FRAME);
  assert_int_equal(l.max_string, TXP_DEFAULT_MAX_STRING);
  assert_int_equal(l.max_count, TXP_DEFAULT_MAX_COUNT);
  assert_int_equal(l.max_depth, TXP_DEFAULT_MAX_DEPTH);
}

/* ============================================================== streams */

#define STREAM_MAX 64

typedef struct {
  txp_msg_t want[STREAM_MAX];
  size_t n;
  bytes_t bytes;
} stream_t;

/* Every type twice (all fields / required only), encoded back to back;
 * on the heap (STREAM_MAX messages), freed by stream_free. */
static stream_t *stream_new(void) {
  stream_t *s = calloc(1, sizeof(*s));
  assert_non_null(s);
  txp_buf_t b;
  txp_buf_init(&b, 0);
  for (size_t i = 0; i < ntspec; i++)
    for (int v = 0; v < 2; v++) {
      assert_true(s->n < STREAM_MAX);
      txp_msg_t *m = &s->want[s->n];
      make_msg(m, tspec[i].type, v ? tspec[i].req : tspec[i].allowed, v, s->n * 1000 + 1,
               (uint16_t)(s->n % 4));
      assert_int_equal(txp_encode(m, &b, 0), 0);
      s->n++;
    }
  bytes_add(&s->bytes, b.data, b.len);
  txp_buf_free(&b);
  return s;
}

static void stream_free(stream_t *s) {
  bytes_free(&s->bytes);
  free(s);
}

/*
 * Feed s->bytes in chunks chosen by 'seed' (0: one byte at a time), taking
 * messages out after every feed (sometimes all, sometimes just one), and
 * check they are exactly s->want in order.
 */
static void stream_check(const stream_t *s, uint64_t seed) {
  txp_decoder_t *d = txp_decoder_new(NULL);
  assert_non_null(d);
  size_t got = 0, off = 0;
  uint64_t r = seed;
  txp_msg_t m;
  while (off < s->bytes.n || got < s->n) {
    size_t chunk = 1;
    bool drain_all = true;
    if (seed) {
      uint64_t x = rng(&r);
      switch (x % 8) {
      case 0: chunk = 0; break;                         /* empty feed */
      case 1: chunk = 1 + (x >> 8) % 4; break;          /* tiny */
      case 2: chunk = 1 + (x >> 8) % 1024; break;       /* several frames */
      default: chunk = 1 + (x >> 8) % 64; break;
      }
      drain_all = (x >> 40) % 3 != 0;
    }
    if (off >= s->bytes.n) chunk = 0, drain_all = true;
    if (chunk > s->bytes.n - off) chunk = s->bytes.n - off;
    assert_int_equal(txp_decoder_feed(d, s->bytes.p + off, chunk), 0);
    off += chunk;
    assert_true(txp_decoder_buffered(d) <= off);
    do {
      txp_msg_init(&m, TXP_MSG_NONE);
      int rc = txp_decoder_next(d, &m);
      if (rc == TXP_EAGAIN) break;
      if (rc != 0) fail_msg("seed %llu at %zu: %s", (unsigned long long)seed, off, txp_errname(rc));
      assert_true(got < s->n);
      assert_msg_eq(&s->want[got], &m);
      assert_absent_zero(&m);
      txp_msg_clear(&m);
      got++;
    } while (drain_all);
    if (off == s->bytes.n && drain_all && got < s->n)
      fail_msg("seed %llu: stream ended after %zu of %zu messages", (unsigned long long)seed, got,
               s->n);
  }
  assert_int_equal(got, s->n);
  assert_int_equal(txp_decoder_buffered(d), 0);
  txp_msg_init(&m, TXP_MSG_NONE);
  assert_int_equal(txp_decoder_next(d, &m), TXP_EAGAIN);
  txp_decoder_free(d);
}

static void test_stream_byte_at_a_time(void **state) {
  (void)state;
  stream_t *s = stream_new();
  stream_check(s, 0);
  stream_free(s);
}

static void test_stream_random_chunks(void **state) {
  (void)state;
  stream_t *s = stream_new();
  for (uint64_t seed = 1; seed <= 200; seed++) stream_check(s, seed * UINT64_C(0x9E3779B97F4A7C15));
  /* whole stream in one feed */
  txp_decoder_t *d = txp_decoder_new(NULL);
  assert_int_equal(txp_decoder_feed(d, s->bytes.p, s->bytes.n), 0);
  for (size_t i = 0; i < s->n; i++) {
    txp_msg_t m;
    txp_msg_init(&m, TXP_MSG_NONE);
    assert_int_equal(txp_decoder_next(d, &m), 0);
    assert_msg_eq(&s->want[i], &m);
    txp_msg_clear(&m);
  }
  txp_decoder_free(d);
  stream_free(s);
}

static void test_decode_frame_whole_only(void **state) {
  (void)state;
  bytes_t s = {0};
  add_good_frame(&s, 5);
  size_t one = s.n;
  add_good_frame(&s, 6);
  txp_msg_t m;
  txp_msg_init(&m, TXP_MSG_NONE);
  /* incomplete at every length */
  for (size_t n = 0; n < one; n++) {
    assert_int_equal(txp_decode_frame(s.p, n, NULL, &m), TXP_EAGAIN);
    txp_msg_clear(&m);
  }
  assert_int_equal(txp_decode_frame(s.p, one, NULL, &m), 0);
  txp_msg_clear(&m);
  /* trailing bytes (here: a second frame) */
  assert_int_equal(txp_decode_frame(s.p, s.n, NULL, &m), TXP_EMALFORMED);
  assert_null(m.owned_);
  assert_int_equal(m.present, 0);
  txp_msg_clear(&m);
  assert_int_equal(txp_decode_frame(s.p, one + 1, NULL, &m), TXP_EMALFORMED);
  txp_msg_clear(&m);
  bytes_free(&s);
}

static void test_versions(void **state) {
  (void)state;
  bytes_t s = {0};
  body_t b;
  body_init(&b);
  b_xid(&b);
  /* unknown majors: refused from the header alone, header fields set, sticky */
  static const uint8_t majors[] = {0, 2, 255};
  for (size_t i = 0; i < NELEM(majors); i++) {
    s.n = 0;
    hdr_t h = H(TXP_MSG_GLOBAL_COMMIT, 4242 + i);
    h.major = majors[i];
    h.minor = 3;
    h.flags = TXP_FLAG_RESPONSE;
    add_body_frame(&s, h, &b);
    txp_decoder_t *d = txp_decoder_new(NULL);
    assert_int_equal(txp_decoder_feed(d, s.p, TXP_HEADER_SIZE), 0);
    txp_msg_t m;
    txp_msg_init(&m, TXP_MSG_NONE);
    assert_int_equal(txp_decoder_next(d, &m), TXP_EBAD_VERSION);
    assert_header_only(&m, TXP_MSG_GLOBAL_COMMIT, TXP_FLAG_RESPONSE, 4242 + i);
    assert_int_equal(m.ver_major, majors[i]);
    assert_int_equal(m.ver_minor, 3);
    txp_msg_clear(&m);
    add_good_frame(&s, 1);
    assert_int_equal(txp_decoder_feed(d, s.p + TXP_HEADER_SIZE, s.n - TXP_HEADER_SIZE), 0);
    assert_int_equal(txp_decoder_next(d, &m), TXP_EBAD_VERSION);
    txp_msg_clear(&m);
    txp_decoder_free(d);
    assert_int_equal(txp_decode_frame(s.p, TXP_HEADER_SIZE, NULL, &m), TXP_EBAD_VERSION);
    assert_int_equal(m.request_id, 4242 + i);
    txp_msg_clear(&m);
  }
  /* newer minors are accepted and reported */
  static const uint8_t minors[] = {1, 9, 255};
  for (size_t i = 0; i < NELEM(minors); i++) {
    hdr_t h = H(TXP_MSG_GLOBAL_COMMIT, 8);
    h.minor = minors[i];
    txp_msg_t m;
    expect_decode_ok(NULL, h, b.sb.data, b.sb.size, &m, "newer minor");
    assert_int_equal(m.ver_major, TXP_VERSION_MAJOR);
    assert_int_equal(m.ver_minor, minors[i]);
    assert_string_equal(m.xid, "x");
    txp_msg_clear(&m);
  }
  body_free(&b);
  bytes_free(&s);
}

/* A newer minor may add fields: unknown keys, whatever their value, are
 * skipped; so is a known field that this type does not carry. */
static void test_unknown_keys_skipped(void **state) {
  (void)state;
  static const uint64_t keys[] = {0, 26, 27, 63, 64, 127, 128, 255, 256, 65535, UINT64_C(1) << 32,
                                  UINT64_MAX};
  body_t b;
  body_init(&b);
  msgpack_pack_map(&b.pk, (NELEM(keys) + 2));
  for (size_t i = 0; i < NELEM(keys); i++) {
    pk_key(&b, keys[i]);
    switch (i % 12) {
    case 0: msgpack_pack_nil(&b.pk); break;
    case 1: msgpack_pack_true(&b.pk); break;
    case 2: msgpack_pack_double(&b.pk, 2.5); break;
    case 3: msgpack_pack_float(&b.pk, 1.5f); break;
    case 4: msgpack_pack_bin(&b.pk, 3); msgpack_pack_bin_body(&b.pk, "\0\1\2", 3); break;
    case 5: msgpack_pack_ext(&b.pk, 4, -1); msgpack_pack_ext_body(&b.pk, "abcd", 4); break;
    case 6: pk_strn(&b, "\xff\x00", 2); break; /* invalid UTF-8 and NUL: not ours to check */
    case 7:
      msgpack_pack_array(&b.pk, 2);
      msgpack_pack_int(&b.pk, -5);
      pk_str(&b, "z");
      break;
    case 8:
      msgpack_pack_map(&b.pk, 1);
      pk_str(&b, "k");
      msgpack_pack_array(&b.pk, 0);
      break;
    case 9: msgpack_pack_int64(&b.pk, INT64_MIN); break;
    case 10: msgpack_pack_uint64(&b.pk, UINT64_MAX); break;
    default: pk_str(&b, "later"); break;
    }
  }
  pk_key(&b, TXP_F_HEARTBEAT_MS); /* known, not a GlobalCommit field, wrong type too */
  pk_str(&b, "not a number");
  pk_key(&b, TXP_F_XID);
  pk_str(&b, "xid-1");
  txp_msg_t m;
  expect_decode_ok(NULL, H(TXP_MSG_GLOBAL_COMMIT, 11), b.sb.data, b.sb.size, &m, "unknown keys");
  assert_int_equal(m.present, TXP_FIELD_BIT(TXP_F_XID));
  assert_string_equal(m.xid, "xid-1");
  assert_int_equal(m.heartbeat_ms, 0);
  assert_absent_zero(&m);
  txp_msg_clear(&m);
  body_free(&b);
}

/* ============================================================== mpcheck */

#define S(lit) {lit, sizeof(lit) - 1}
typedef struct {
  const char *p;
  size_t n;
} sample_t;

static const sample_t mp_valid[] = {
  S("\x00"), S("\x7f"), S("\xe0"), S("\xff"),                         /* fixint */
  S("\xc0"), S("\xc2"), S("\xc3"),                                    /* nil, bool */
  S("\x80"), S("\x81\x01\x02"), S("\x82\x01\xa1x\xa1y\x90"),          /* fixmap */
  S("\x90"), S("\x93\x01\x02\x03"),                                   /* fixarray */
  S("\xa0"), S("\xa3" "abc"),
  S("\xbf" "0123456789012345678901234567890"),                        /* fixstr 31 */
  S("\xc4\x00"), S("\xc4\x02\xaa\xbb"),                               /* bin8 */
  S("\xc5\x00\x02\xaa\xbb"), S("\xc6\x00\x00\x00\x02\xaa\xbb"),       /* bin16, bin32 */
  S("\xc7\x00\x05"), S("\xc7\x02\x05\xaa\xbb"),                       /* ext8 */
  S("\xc8\x00\x02\x05\xaa\xbb"), S("\xc9\x00\x00\x00\x02\x05\xaa\xbb"), /* ext16, ext32 */
  S("\xca\x3f\x80\x00\x00"), S("\xcb\x3f\xf0\x00\x00\x00\x00\x00\x00"), /* float */
  S("\xcc\xff"), S("\xcd\xff\xff"), S("\xce\xff\xff\xff\xff"),
  S("\xcf\xff\xff\xff\xff\xff\xff\xff\xff"),                          /* uint */
  S("\xd0\x80"), S("\xd1\x80\x00"), S("\xd2\x80\x00\x00\x00"),
  S("\xd3\x80\x00\x00\x00\x00\x00\x00\x00"),                          /* int */
  S("\xd4\x01\xaa"), S("\xd5\x01\xaa\xbb"), S("\xd6\x01\x01\x02\x03\x04"),
  S("\xd7\x01\x01\x02\x03\x04\x05\x06\x07\x08"),
  S("\xd8\x01\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c\x0d\x0e\x0f\x10"), /* fixext */
  S("\xd9\x00"), S("\xd9\x03" "abc"), S("\xda\x00\x03" "abc"), S("\xdb\x00\x00\x00\x03" "abc"),
  S("\xdc\x00\x00"), S("\xdc\x00\x02\x01\x02"), S("\xdd\x00\x00\x00\x02\x01\x02"),
  S("\xde\x00\x00"), S("\xde\x00\x01\x01\x02"), S("\xdf\x00\x00\x00\x01\x01\x02"),
  S("\x92\x91\xc0\x81\xa1k\x93\x01\x02\x03"),                         /* nested */
  S("\x83\x01\xc4\x01\x00\x02\xd4\x00\x00\x03\xdc\x00\x01\xcb\x00\x00\x00\x00\x00\x00\x00\x00"),
};

static void test_mpcheck_formats(void **state) {
  (void)state;
  const uint32_t big = UINT32_MAX;
  for (size_t i = 0; i < NELEM(mp_valid); i++) {
    const unsigned char *p = (const unsigned char *)mp_valid[i].p;
    size_t n = mp_valid[i].n;
    int rc = txp_mpcheck(p, n, big, 32, big);
    if (rc != 0) fail_msg("sample %zu (0x%02x): %s", i, p[0], txp_errname(rc));
    assert_int_equal(txp_mpcheck(p, n, 64, 4, 1024), 0); /* defaults-ish too */

    /* msgpack-c agrees the sample is exactly one object */
    msgpack_unpacked up;
    msgpack_unpacked_init(&up);
    size_t off = 0;
    assert_int_equal(msgpack_unpack_next(&up, (const char *)p, n, &off), MSGPACK_UNPACK_SUCCESS);
    assert_int_equal(off, n);
    msgpack_unpacked_destroy(&up);

    /* truncated at every position */
    for (size_t k = 0; k < n; k++) {
      rc = txp_mpcheck(p, k, big, 32, big);
      if (rc != TXP_EMALFORMED)
        fail_msg("sample %zu (0x%02x) cut at %zu: %s", i, p[0], k, txp_errname(rc));
    }
    /* trailing bytes */
    unsigned char buf[64];
    assert_true(n * 2 <= sizeof(buf));
    memcpy(buf, p, n);
    buf[n] = 0x00;
    assert_int_equal(txp_mpcheck(buf, n + 1, big, 32, big), TXP_EMALFORMED);
    memcpy(buf + n, p, n);
    assert_int_equal(txp_mpcheck(buf, 2 * n, big, 32, big), TXP_EMALFORMED);
  }

  /* 0xc1, never used: alone, inside an array, as a map value */
  assert_int_equal(txp_mpcheck((const unsigned char *)"\xc1", 1, big, 32, big), TXP_EMALFORMED);
  assert_int_equal(txp_mpcheck((const unsigned char *)"\x92\x01\xc1", 3, big, 32, big),
                   TXP_EMALFORMED);
  assert_int_equal(txp_mpcheck((const unsigned char *)"\x81\x01\xc1", 3, big, 32, big),
                   TXP_EMALFORMED);
  /* and every single byte: only 0xc1 is malformed as a complete one-byte
   * object among the one-byte formats */
  for (int c = 0; c < 256; c++) {
    unsigned char one = (unsigned char)c;
    int rc = txp_mpcheck(&one, 1, big, 32, big);
    bool one_byte_obj = c <= 0x7f || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3 ||
                        c == 0x80 || c == 0x90 || c == 0xa0;
    assert_int_equal(rc, one_byte_obj ? 0 : TXP_EMALFORMED);
  }
  /* nothing at all */
  assert_int_equal(txp_mpcheck((const unsigned char *)"", 0, big, 32, big), TXP_EMALFORMED);
  assert_int_equal(txp_mpcheck(NULL, 0, big, 32, big), TXP_EMALFORMED);
}

static void test_mpcheck_limits(void **state) {
  (void)state;
  const uint32_t big = UINT32_MAX;
#define MP(lit) (const unsigned char *)(lit), sizeof(lit) - 1
  /* string/bin/ext lengths against max_string */
  assert_int_equal(txp_mpcheck(MP("\xa3" "abc"), big, 32, 3), 0);
  assert_int_equal(txp_mpcheck(MP("\xa3" "abc"), big, 32, 2), TXP_ELIMIT);
  assert_int_equal(txp_mpcheck(MP("\xd9\x03" "abc"), big, 32, 3), 0);
  assert_int_equal(txp_mpcheck(MP("\xd9\x03" "abc"), big, 32, 2), TXP_ELIMIT);
  assert_int_equal(txp_mpcheck(MP("\xc4\x03" "abc"), big, 32, 3), 0);
  assert_int_equal(txp_mpcheck(MP("\xc4\x03" "abc"), big, 32, 2), TXP_ELIMIT);
  assert_int_equal(txp_mpcheck(MP("\xc7\x03\x01" "abc"), big, 32, 3), 0);
  assert_int_equal(txp_mpcheck(MP("\xc7\x03\x01" "abc"), big, 32, 2), TXP_ELIMIT);
  assert_int_equal(txp_mpcheck(MP("\xa0"), big, 32, 0), 0);
  /* lengths past the bytes there */
  assert_int_equal(txp_mpcheck(MP("\xd9\xff" "a"), big, 32, big), TXP_EMALFORMED);
  assert_int_equal(txp_mpcheck(MP("\xdb\xff\xff\xff\xff" "a"), big, 32, big), TXP_EMALFORMED);
  assert_int_equal(txp_mpcheck(MP("\xc9\xff\xff\xff\xff\x01" "a"), big, 32, big), TXP_EMALFORMED);
  /* counts: entries (map pairs) against max_count */
  assert_int_equal(txp_mpcheck(MP("\x92\x01\x02"), 2, 32, big), 0);
  assert_int_equal(txp_mpcheck(MP("\x92\x01\x02"), 1, 32, big), TXP_ELIMIT);
  assert_int_equal(txp_mpcheck(MP("\x82\x01\x02\x03\x04"), 2, 32, big), 0);
  assert_int_equal(txp_mpcheck(MP("\x82\x01\x02\x03\x04"), 1, 32, big), TXP_ELIMIT);
  assert_int_equal(txp_mpcheck(MP("\xdc\x00\x02\x01\x02"), 1, 32, big), TXP_ELIMIT);
  assert_int_equal(txp_mpcheck(MP("\xde\x00\x01\x01\x02"), 1, 32, big), 0);
  assert_int_equal(txp_mpcheck(MP("\xde\x00\x01\x01\x02"), 0, 32, big), TXP_ELIMIT);
  assert_int_equal(txp_mpcheck(MP("\x90"), 0, 32, big), 0);
  /* counts past the bytes there: refused before anything is allocated */
  assert_int_equal(txp_mpcheck(MP("\xdd\xff\xff\xff\xff\x00"), big, 32, big), TXP_EMALFORMED);
  assert_int_equal(txp_mpcheck(MP("\xdf\xff\xff\xff\xff\x00\x00"), big, 32, big), TXP_EMALFORMED);
  assert_int_equal(txp_mpcheck(MP("\xdd\xff\xff\xff\xff\x00"), 64, 32, big), TXP_ELIMIT);
  assert_int_equal(txp_mpcheck(MP("\x82\x01\x02\x03"), big, 32, big), TXP_EMALFORMED);
  /* a map needs two objects per entry */
  assert_int_equal(txp_mpcheck(MP("\x81\x01"), big, 32, big), TXP_EMALFORMED);
  /* depth */
  assert_int_equal(txp_mpcheck(MP("\x91\x91\x91\x01"), big, 3, big), 0);
  assert_int_equal(txp_mpcheck(MP("\x91\x91\x91\x01"), big, 2, big), TXP_ELIMIT);
  assert_int_equal(txp_mpcheck(MP("\x81\x01\x81\x01\x01"), big, 2, big), 0);
  assert_int_equal(txp_mpcheck(MP("\x81\x01\x81\x01\x01"), big, 1, big), TXP_ELIMIT);
  assert_int_equal(txp_mpcheck(MP("\x01"), big, 0, big), 0);
  /* an empty container counts as a level, as in msgpack-c */
  assert_int_equal(txp_mpcheck(MP("\x91\x91\x90"), big, 3, big), 0);
  assert_int_equal(txp_mpcheck(MP("\x91\x91\x90"), big, 2, big), TXP_ELIMIT);
  assert_int_equal(txp_mpcheck(MP("\x90"), big, 0, big), TXP_ELIMIT);
  /* depth recovers after a container closes */
  assert_int_equal(txp_mpcheck(MP("\x93\x91\x91\x01\x91\x91\x01\x91\x01"), big, 3, big), 0);
#undef MP
  /* 32 nested arrays is the checker's own ceiling, whatever max_depth says */
  unsigned char deep[40];
  for (int d = 30; d <= 34; d++) {
    memset(deep, 0x91, (size_t)d);
    deep[d] = 0x01;
    assert_int_equal(txp_mpcheck(deep, (size_t)d + 1, big, big, big), d <= 32 ? 0 : TXP_ELIMIT);
    /* an empty array in place of the innermost value: one level more (a
     * fuzzer finding: msgpack-c refused 32 arrays around an empty one that
     * the checker had let through) */
    deep[d] = 0x90;
    assert_int_equal(txp_mpcheck(deep, (size_t)d + 1, big, big, big), d <= 31 ? 0 : TXP_ELIMIT);
    msgpack_unpacked up;
    msgpack_unpacked_init(&up);
    size_t off = 0;
    msgpack_unpack_return ur = msgpack_unpack_next(&up, (const char *)deep, (size_t)d + 1, &off);
    assert_int_equal(ur == MSGPACK_UNPACK_SUCCESS, d <= 31);
    msgpack_unpacked_destroy(&up);
  }
}

/* ======================================================== encode errors */

static void test_encode_errors(void **state) {
  (void)state;
  txp_buf_t b;
  txp_buf_init(&b, 0);
  static const char prefix[] = "PREFIX";
  txp_msg_t m;

#define EXPECT_REFUSED(want)                                  \
  do {                                                        \
    b.len = 0;                                                \
    memcpy(b.data, prefix, 6);                                \
    b.len = 6;                                                \
    assert_int_equal(txp_encode(&m, &b, 0), (want));          \
    assert_int_equal(b.len, 6); /* nothing appended */        \
    assert_memory_equal(b.data, prefix, 6);                   \
  } while (0)

  /* give the buffer storage first */
  txp_msg_init(&m, TXP_MSG_HEARTBEAT);
  assert_int_equal(txp_encode(&m, &b, 0), 0);

  /* unknown type */
  static const int bad_types[] = {0, 4, 5, 9, 46, 999, 0xffff};
  for (size_t i = 0; i < NELEM(bad_types); i++) {
    txp_msg_init(&m, TXP_MSG_NONE);
    m.type = (uint16_t)bad_types[i];
    EXPECT_REFUSED(TXP_EUNKNOWN_TYPE);
  }
  /* unknown flags; the known ones are fine */
  static const uint16_t bad_flags[] = {0x4, 0x8, 0x100, 0x8000, 0xffff};
  for (size_t i = 0; i < NELEM(bad_flags); i++) {
    txp_msg_init(&m, TXP_MSG_HEARTBEAT);
    m.flags = bad_flags[i];
    EXPECT_REFUSED(TXP_EBAD_FLAGS);
  }
  txp_msg_init(&m, TXP_MSG_HEARTBEAT);
  m.flags = TXP_FLAGS_KNOWN;
  b.len = 0;
  assert_int_equal(txp_encode(&m, &b, 0), 0);

  /* missing required */
  txp_msg_init(&m, TXP_MSG_BRANCH_REPORT);
  txp_msg_set_str(&m, TXP_F_XID, "x");
  txp_msg_set_int(&m, TXP_F_BRANCH_STATUS, TXP_BS_PHASE1_DONE);
  EXPECT_REFUSED(TXP_EFIELD_MISSING);
  /* present bit with a NULL string */
  txp_msg_init(&m, TXP_MSG_GLOBAL_COMMIT);
  m.present = TXP_FIELD_BIT(TXP_F_XID);
  EXPECT_REFUSED(TXP_EFIELD_MISSING);
  /* optional field with NULL string */
  txp_msg_init(&m, TXP_MSG_GLOBAL_BEGIN);
  m.present = TXP_FIELD_BIT(TXP_F_NAME);
  EXPECT_REFUSED(TXP_EFIELD_MISSING);
  /* not allowed for the type; bits outside any field */
  txp_msg_init(&m, TXP_MSG_GLOBAL_COMMIT);
  txp_msg_set_str(&m, TXP_F_XID, "x");
  txp_msg_set_int(&m, TXP_F_CODE, 0);
  EXPECT_REFUSED(TXP_EFIELD_TYPE);
  static const int bad_bits[] = {0, 26, 40, 63};
  for (size_t i = 0; i < NELEM(bad_bits); i++) {
    txp_msg_init(&m, TXP_MSG_GLOBAL_COMMIT);
    txp_msg_set_str(&m, TXP_F_XID, "x");
    m.present |= UINT64_C(1) << bad_bits[i];
    EXPECT_REFUSED(TXP_EFIELD_TYPE);
  }
  /* too long */
  char longs[TXP_MAX_IDEM_LEN + 2];
  memset(longs, 'k', sizeof(longs));
  longs[TXP_MAX_IDEM_LEN + 1] = '\0';
  txp_msg_init(&m, TXP_MSG_GLOBAL_BEGIN);
  txp_msg_set_str(&m, TXP_F_IDEM_KEY, longs);
  EXPECT_REFUSED(TXP_EFIELD_TOO_LONG);
  /* invalid UTF-8 */
  txp_msg_init(&m, TXP_MSG_GLOBAL_BEGIN);
  txp_msg_set_str(&m, TXP_F_NAME, "bad\xc3(");
  EXPECT_REFUSED(TXP_EFIELD_TYPE);
  /* body over max_frame */
  txp_msg_init(&m, TXP_MSG_GLOBAL_BEGIN);
  txp_msg_set_str(&m, TXP_F_NAME, "n");
  b.len = 6;
  assert_int_equal(txp_encode(&m, &b, 3), TXP_EFRAME_TOO_BIG);
  assert_int_equal(b.len, 6);
  assert_int_equal(txp_encode(&m, &b, 4), 0); /* 81 06 a1 6e: 4 bytes */
  assert_int_equal(b.len, 6 + 20 + 4);
  assert_int_equal(txp_encode(&m, &b, 0), 0); /* 0: the default */
#undef EXPECT_REFUSED
  txp_buf_free(&b);
}

/* A bounded txp_buf: TXP_EBUFFER_FULL whether the header or the body does
 * not fit, nothing appended, and the exact fit works. */
static void test_encode_buffer_cap(void **state) {
  (void)state;
  txp_msg_t m;
  make_msg(&m, TXP_MSG_BRANCH_REGISTER, type_of(TXP_MSG_BRANCH_REGISTER)->allowed, 0, 1, 0);
  txp_buf_t b;
  txp_buf_init(&b, 0);
  assert_int_equal(txp_encode(&m, &b, 0), 0);
  size_t full = b.len;
  txp_buf_free(&b);
  assert_true(full > 60);

  for (size_t cap = 1; cap <= full + 8; cap++) {
    for (size_t pre = 0; pre <= 3; pre += 3) {
      if (pre > cap) continue;
      txp_buf_init(&b, cap);
      if (pre) { /* bytes already queued in the buffer */
        b.data = malloc(cap);
        assert_non_null(b.data);
        b.alloc = cap;
        memcpy(b.data, "abc", pre);
        b.len = pre;
      }
      int rc = txp_encode(&m, &b, 0);
      if (pre + full <= cap) {
        if (rc != 0) fail_msg("cap %zu pre %zu: %s", cap, pre, txp_errname(rc));
        assert_int_equal(b.len, pre + full);
      } else {
        if (rc != TXP_EBUFFER_FULL) fail_msg("cap %zu pre %zu: %s", cap, pre, txp_errname(rc));
        assert_int_equal(b.len, pre);
      }
      assert_true(b.alloc <= cap);
      if (pre) assert_memory_equal(b.data, "abc", pre);
      txp_buf_free(&b);
    }
  }
}

/* ========================================================== regressions */

/* txp_decoder_next() on a decoder that has never buffered anything did
 * pointer arithmetic on its NULL buffer (UBSan with clang: "applying zero
 * offset to null pointer"; GCC's UBSan does not flag it, fuzz_decoder's
 * clang build does). */
static void test_regress_next_on_empty_decoder(void **state) {
  (void)state;
  txp_decoder_t *d = txp_decoder_new(NULL);
  txp_msg_t m;
  txp_msg_init(&m, TXP_MSG_NONE);
  assert_int_equal(txp_decoder_next(d, &m), TXP_EAGAIN);
  assert_int_equal(txp_decoder_feed(d, NULL, 0), 0);
  assert_int_equal(txp_decoder_next(d, &m), TXP_EAGAIN);
  assert_int_equal(txp_decoder_buffered(d), 0);
  txp_decoder_free(d);
}

/* Security review, finding 3: a buffer that grew for a large frame goes
 * back to nothing once that frame is consumed (a connection that sent one
 * big frame must not keep its memory). */
static void test_decoder_buffer_shrinks(void **state) {
  (void)state;
  txp_msg_t m;
  txp_msg_init(&m, TXP_MSG_BRANCH_REGISTER);
  m.request_id = 1;
  static char big[60000];
  memset(big, 'k', sizeof(big) - 1);
  big[sizeof(big) - 1] = '\0';
  txp_msg_set_str(&m, TXP_F_XID, "127.0.0.1:8091:1");
  txp_msg_set_int(&m, TXP_F_BRANCH_TYPE, 0);
  txp_msg_set_str(&m, TXP_F_RESOURCE_ID, "stock");
  txp_msg_set_str(&m, TXP_F_LOCK_KEYS, big);
  txp_msg_set_str(&m, TXP_F_APP_DATA, big);
  txp_buf_t b;
  txp_buf_init(&b, 0);
  assert_int_equal(txp_encode(&m, &b, 0), 0);
  txp_msg_clear(&m);
  assert_true(b.len > TXP_DECODER_KEEP);
  txp_decoder_t *d = txp_decoder_new(NULL);
  assert_int_equal(txp_decoder_feed(d, b.data, b.len), 0);
  assert_true(txp_decoder_capacity(d) >= b.len);
  txp_msg_t out;
  txp_msg_init(&out, TXP_MSG_NONE);
  assert_int_equal(txp_decoder_next(d, &out), 0);
  assert_int_equal(strlen(out.lock_keys), sizeof(big) - 1);
  txp_msg_clear(&out);
  assert_int_equal(txp_decoder_capacity(d), 0);
  /* and it still decodes what comes next */
  txp_msg_init(&m, TXP_MSG_HEARTBEAT);
  m.request_id = 2;
  txp_buf_t small;
  txp_buf_init(&small, 0);
  assert_int_equal(txp_encode(&m, &small, 0), 0);
  assert_int_equal(txp_decoder_feed(d, small.data, small.len), 0);
  assert_int_equal(txp_decoder_next(d, &out), 0);
  assert_int_equal(out.request_id, 2);
  assert_true(txp_decoder_capacity(d) < TXP_DECODER_KEEP);
  txp_msg_clear(&out);
  txp_msg_clear(&m);
  txp_buf_free(&small);
  txp_buf_free(&b);
  txp_decoder_free(d);
}

/* txp_decode_frame() took zero fields of 'limits' literally (max_count 0:
 * every non-empty body refused) while txp_decoder_new() reads 0 as "the
 * default"; the same limits must mean the same thing to both. */
static void test_regress_decode_frame_zero_limits(void **state) {
  (void)state;
  bytes_t s = {0};
  add_good_frame(&s, 1);
  txp_limits_t lim = {.max_frame = 4096};
  txp_msg_t m;
  txp_msg_init(&m, TXP_MSG_NONE);
  assert_int_equal(txp_decode_frame(s.p, s.n, &lim, &m), 0);
  assert_string_equal(m.xid, "next");
  txp_msg_clear(&m);
  txp_limits_t zero = {0, 0, 0, 0};
  assert_int_equal(txp_decode_frame(s.p, s.n, &zero, &m), 0);
  txp_msg_clear(&m);
  bytes_free(&s);
}

/* txp_encode() into a bounded txp_buf whose header fit but body did not
 * returned TXP_ENOMEM instead of TXP_EBUFFER_FULL. */
static void test_regress_encode_cap_mid_body(void **state) {
  (void)state;
  txp_msg_t m;
  txp_msg_init(&m, TXP_MSG_GLOBAL_COMMIT);
  txp_msg_set_str(&m, TXP_F_XID, "abcdefghijabcdefghijabcdefghij");
  txp_buf_t b;
  txp_buf_init(&b, 30);
  assert_int_equal(txp_encode(&m, &b, 0), TXP_EBUFFER_FULL);
  assert_int_equal(b.len, 0);
  txp_buf_free(&b);
}

/* An empty string value: msgpack-c gives a NULL pointer with size 0, which
 * take_field() passed to memcpy (UB: UBSan "null pointer passed as argument
 * 2").  GlobalCommit {xid: ""} and GlobalBegin {name: "", idem_key: ""}. */
static void test_regress_empty_strings(void **state) {
  (void)state;
  txp_msg_t m;
  expect_decode_ok(NULL, H(TXP_MSG_GLOBAL_COMMIT, 1), "\x81\x03\xa0", 3, &m, "empty xid");
  assert_non_null(m.xid);
  assert_string_equal(m.xid, "");
  txp_msg_clear(&m);
  expect_decode_ok(NULL, H(TXP_MSG_GLOBAL_BEGIN, 2), "\x82\x06\xa0\x0f\xd9\x00", 6, &m,
                   "empty name, idem_key");
  assert_string_equal(m.name, "");
  assert_string_equal(m.idem_key, "");
  assert_true(m.name != m.idem_key);
  txp_msg_clear(&m);
}

/* A BranchRegister names its xid, or, to begin the global with its first
 * branch, a timeout instead (the answer carries the xid); one of the two
 * it must have, both ways. */
static void test_branch_register_begins(void **state) {
  (void)state;
  txp_buf_t b;
  txp_buf_init(&b, 0);
  txp_msg_t m, out;
  txp_msg_init(&m, TXP_MSG_BRANCH_REGISTER);
  txp_msg_set_int(&m, TXP_F_BRANCH_TYPE, TXP_BT_AT);
  txp_msg_set_str(&m, TXP_F_RESOURCE_ID, "orders");
  assert_int_equal(txp_encode(&m, &b, 0), TXP_EFIELD_MISSING); /* neither */
  assert_int_equal(b.len, 0);
  txp_msg_set_int(&m, TXP_F_TIMEOUT_MS, 30000);
  txp_msg_set_str(&m, TXP_F_NAME, "order");
  m.request_id = 9;
  assert_int_equal(txp_encode(&m, &b, 0), 0);
  txp_decoder_t *d = txp_decoder_new(NULL);
  assert_non_null(d);
  assert_int_equal(txp_decoder_feed(d, b.data, b.len), 0);
  txp_msg_init(&out, TXP_MSG_NONE);
  assert_int_equal(txp_decoder_next(d, &out), 0);
  assert_true(txp_msg_has(&out, TXP_F_TIMEOUT_MS) && out.timeout_ms == 30000);
  assert_false(txp_msg_has(&out, TXP_F_XID));
  assert_string_equal(out.name, "order");
  txp_msg_clear(&out);
  txp_decoder_free(d);
  txp_buf_free(&b);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_tables_pinned),
    cmocka_unit_test(test_encode_field_table),
    cmocka_unit_test(test_branch_register_begins),
    cmocka_unit_test(test_roundtrip_every_type),
    cmocka_unit_test(test_golden_bytes),
    cmocka_unit_test(test_msg_helpers),
    cmocka_unit_test(test_stream_byte_at_a_time),
    cmocka_unit_test(test_stream_random_chunks),
    cmocka_unit_test(test_decode_frame_whole_only),
    cmocka_unit_test(test_versions),
    cmocka_unit_test(test_unknown_keys_skipped),
    cmocka_unit_test(test_mpcheck_formats),
    cmocka_unit_test(test_mpcheck_limits),
    cmocka_unit_test(test_encode_errors),
    cmocka_unit_test(test_encode_buffer_cap),
    cmocka_unit_test(test_regress_next_on_empty_decoder),
    cmocka_unit_test(test_decoder_buffer_shrinks),
    cmocka_unit_test(test_regress_decode_frame_zero_limits),
    cmocka_unit_test(test_regress_encode_cap_mid_body),
    cmocka_unit_test(test_regress_empty_strings),
  };
  return cmocka_run_group_tests_name("proto_codec", tests, NULL, NULL);
}
