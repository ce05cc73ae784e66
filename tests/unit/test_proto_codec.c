/*
 * test_proto_codec.c - the frame codec (txp_msg.h) and the msgpack
 * structure check (txp_mpcheck.h), in the style of hiredis's reader tests:
 * hand-made byte streams fed whole, byte by byte and in random chunks,
 * malformed frames of every kind, and every limit at and past its edge.
 *
 * Malformed bodies are built with msgpack-c's packer (body_t below) or as
 * raw bytes, and framed with add_frame(), which writes the 20-byte header
 * itself, so the encoder under test never has a say in what is fed back.
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

#include "txp_mpcheck.h"
#include "txp_msg.h"

#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

/* Under ASan, a malloc hook records the largest single allocation, so that
 * "no large allocation for a lying container header" is checked directly. */
#if defined(__SANITIZE_ADDRESS__)
#define TEST_HAVE_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TEST_HAVE_ASAN 1
#endif
#endif

#ifdef TEST_HAVE_ASAN
int __sanitizer_install_malloc_and_free_hooks(void (*malloc_hook)(const volatile void *, size_t),
                                              void (*free_hook)(const volatile void *));
static volatile size_t g_max_alloc;
static volatile int g_tracking;
static void track_malloc(const volatile void *p, size_t n) {
  (void)p;
  if (g_tracking && n > g_max_alloc) g_max_alloc = n;
}
static void track_free(const volatile void *p) { (void)p; }
static void alloc_track_start(void) {
  static int installed;
  if (!installed) installed = __sanitizer_install_malloc_and_free_hooks(track_malloc, track_free) > 0;
  g_max_alloc = 0;
  g_tracking = 1;
}
/* Largest allocation since start, or 0 when it cannot be known. */
static size_t alloc_track_stop(void) {
  g_tracking = 0;
  return g_max_alloc;
}
#else
static void alloc_track_start(void) {}
static size_t alloc_track_stop(void) { return 0; }
#endif

/* ================================================================ tables */

enum { K_STR, K_I64, K_U32, K_BOOL };

/* The field table as the header defines it (for offsets and names)... */
typedef struct {
  int key;
  int kind;
  size_t off;
  uint32_t max_len;
  const char *name;
} fspec_t;

static const fspec_t fspec[] = {
#define FROW(fname, key, kind, member, maxlen) \
  {(key), K_##kind, offsetof(txp_msg_t, member), (maxlen), #member},
  TXP_FIELD_MAP(FROW)
#undef FROW
};

/* ...and pinned independently: key, kind, limit are the wire format. */
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
};

/* Which fields each message type requires and allows: the format, written
 * down a second time on purpose (the encoder and decoder share one table in
 * txp_msg.c; this one catches a change to it). */
#define F(x) TXP_FIELD_BIT(TXP_F_##x)
#define RB (F(CODE) | F(MESSAGE) | F(XID) | F(BRANCH_ID) | F(NODE_ID))
typedef struct {
  int type;
  const char *name;
  uint64_t req;
  uint64_t allowed;
} tspec_t;

static const tspec_t tspec[] = {
  {TXP_MSG_ERROR, "Error", F(CODE), RB | F(SERVER_VERSION)},
  {TXP_MSG_HEARTBEAT, "Heartbeat", 0, F(NODE_ID)},
  {TXP_MSG_HEARTBEAT_RESULT, "HeartbeatResult", F(CODE), RB},
  {TXP_MSG_REGISTER_TM, "RegisterTM", F(APP_ID) | F(CLIENT_ID), F(APP_ID) | F(CLIENT_ID) | F(TOKEN)},
  {TXP_MSG_REGISTER_TM_RESULT, "RegisterTMResult", F(CODE), RB | F(HEARTBEAT_MS) | F(SERVER_VERSION)},
  {TXP_MSG_REGISTER_RM, "RegisterRM", F(APP_ID) | F(CLIENT_ID),
   F(APP_ID) | F(CLIENT_ID) | F(TOKEN) | F(RESOURCE_IDS)},
  {TXP_MSG_REGISTER_RM_RESULT, "RegisterRMResult", F(CODE), RB | F(HEARTBEAT_MS) | F(SERVER_VERSION)},
  {TXP_MSG_GLOBAL_BEGIN, "GlobalBegin", 0, F(TIMEOUT_MS) | F(NAME) | F(IDEM_KEY)},
  {TXP_MSG_GLOBAL_BEGIN_RESULT, "GlobalBeginResult", F(CODE), RB | F(TIMEOUT_MS)},
  {TXP_MSG_GLOBAL_COMMIT, "GlobalCommit", F(XID), F(XID)},
  {TXP_MSG_GLOBAL_COMMIT_RESULT, "GlobalCommitResult", F(CODE), RB | F(GLOBAL_STATUS)},
  {TXP_MSG_GLOBAL_ROLLBACK, "GlobalRollback", F(XID), F(XID)},
  {TXP_MSG_GLOBAL_ROLLBACK_RESULT, "GlobalRollbackResult", F(CODE), RB | F(GLOBAL_STATUS)},
  {TXP_MSG_GLOBAL_STATUS, "GlobalStatus", F(XID), F(XID)},
  {TXP_MSG_GLOBAL_STATUS_RESULT, "GlobalStatusResult", F(CODE), RB | F(GLOBAL_STATUS)},
  {TXP_MSG_GLOBAL_REPORT, "GlobalReport", F(XID) | F(GLOBAL_STATUS), F(XID) | F(GLOBAL_STATUS)},
  {TXP_MSG_GLOBAL_REPORT_RESULT, "GlobalReportResult", F(CODE), RB | F(GLOBAL_STATUS)},
  {TXP_MSG_BRANCH_REGISTER, "BranchRegister", F(XID) | F(BRANCH_TYPE) | F(RESOURCE_ID),
   F(XID) | F(BRANCH_TYPE) | F(RESOURCE_ID) | F(LOCK_KEYS) | F(APP_DATA) | F(LOCK_WAIT_MS) |
     F(IDEM_KEY) | F(CLIENT_ID)},
  {TXP_MSG_BRANCH_REGISTER_RESULT, "BranchRegisterResult", F(CODE),
   RB | F(WAITED_MS) | F(LOCK_HOLDER)},
  {TXP_MSG_BRANCH_REPORT, "BranchReport", F(XID) | F(BRANCH_ID) | F(BRANCH_STATUS),
   F(XID) | F(BRANCH_ID) | F(BRANCH_STATUS) | F(APP_DATA) | F(RESOURCE_ID) | F(MESSAGE)},
  {TXP_MSG_BRANCH_REPORT_RESULT, "BranchReportResult", F(CODE), RB},
  {TXP_MSG_GLOBAL_LOCK_QUERY, "GlobalLockQuery", F(RESOURCE_ID) | F(LOCK_KEYS),
   F(RESOURCE_ID) | F(LOCK_KEYS) | F(XID)},
  {TXP_MSG_GLOBAL_LOCK_QUERY_RESULT, "GlobalLockQueryResult", F(CODE),
   RB | F(LOCKABLE) | F(LOCK_HOLDER)},
  {TXP_MSG_BRANCH_COMMIT, "BranchCommit", F(XID) | F(BRANCH_ID) | F(RESOURCE_ID),
   F(XID) | F(BRANCH_ID) | F(RESOURCE_ID) | F(BRANCH_TYPE) | F(APP_DATA)},
  {TXP_MSG_BRANCH_COMMIT_RESULT, "BranchCommitResult", F(CODE), RB | F(BRANCH_STATUS)},
  {TXP_MSG_BRANCH_ROLLBACK, "BranchRollback", F(XID) | F(BRANCH_ID) | F(RESOURCE_ID),
   F(XID) | F(BRANCH_ID) | F(RESOURCE_ID) | F(BRANCH_TYPE) | F(APP_DATA)},
  {TXP_MSG_BRANCH_ROLLBACK_RESULT, "BranchRollbackResult", F(CODE), RB | F(BRANCH_STATUS)},
  {TXP_MSG_UNDO_LOG_DELETE, "UndoLogDelete", F(RESOURCE_ID),
   F(RESOURCE_ID) | F(SAVE_DAYS) | F(BRANCH_TYPE)},
  {TXP_MSG_UNDO_LOG_DELETE_RESULT, "UndoLogDeleteResult", F(CODE), RB},
};

static const fspec_t *field_of(int key) {
  for (size_t i = 0; i < NELEM(fspec); i++)
    if (fspec[i].key == key) return &fspec[i];
  return NULL;
}

static const tspec_t *type_of(int type) {
  for (size_t i = 0; i < NELEM(tspec); i++)
    if (tspec[i].type == type) return &tspec[i];
  return NULL;
}

/* ========================================================= message values */

static const char *str_value(int key, int variant) {
  static char vals[TXP_F__MAX][2][96];
  char *p = vals[key][variant & 1];
  if (!p[0])
    snprintf(p, sizeof(vals[0][0]), "%s-%d-\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80", field_of(key)->name,
             variant & 1);
  return p;
}

static int64_t int_value(int key, int variant) {
  variant &= 1;
  switch (key) {
  case TXP_F_CODE: return variant ? 0 : TXP_ELOCK_CONFLICT;
  case TXP_F_BRANCH_ID: return variant ? INT64_MIN : INT64_MAX;
  case TXP_F_GLOBAL_STATUS: return variant ? TXP_GS_STOP_ROLLBACK_RETRY : TXP_GS_COMMITTED;
  case TXP_F_BRANCH_STATUS: return variant ? TXP_BS_STOP_RETRY : TXP_BS_PHASE2_ROLLBACKED;
  case TXP_F_BRANCH_TYPE: return variant ? TXP_BT_XA : TXP_BT_TCC;
  case TXP_F_LOCKABLE: return variant ? 0 : 1;
  default: return variant ? (int64_t)UINT32_MAX : 1000 + key;
  }
}

static void set_field(txp_msg_t *m, int key, int variant) {
  if (field_of(key)->kind == K_STR) txp_msg_set_str(m, (txp_field_t)key, str_value(key, variant));
  else txp_msg_set_int(m, (txp_field_t)key, int_value(key, variant));
}

/* A message of 'type' carrying the fields in 'mask'. */
static void make_msg(txp_msg_t *m, int type, uint64_t mask, int variant, uint64_t rid,
                     uint16_t flags) {
  txp_msg_init(m, (txp_msg_type_t)type);
  m->request_id = rid;
  m->flags = flags;
  for (int k = 1; k < TXP_F__MAX; k++)
    if (mask & TXP_FIELD_BIT(k)) set_field(m, k, variant);
}

static const char *msg_str(const txp_msg_t *m, const fspec_t *f) {
  return *(char *const *)(const void *)((const char *)m + f->off);
}

static int64_t msg_int(const txp_msg_t *m, const fspec_t *f) {
  const void *p = (const char *)m + f->off;
  switch (f->kind) {
  case K_I64: return *(const int64_t *)p;
  case K_U32: return *(const uint32_t *)p;
  case K_BOOL: return *(const bool *)p;
  default: return 0;
  }
}

/* Field-by-field equality of header, present mask and every present field. */
static void assert_msg_eq(const txp_msg_t *want, const txp_msg_t *got) {
  assert_int_equal(want->type, got->type);
  assert_int_equal(want->flags, got->flags);
  assert_int_equal(want->request_id, got->request_id);
  if (want->present != got->present)
    fail_msg("%s rid %llu: present %#llx, want %#llx", txp_msg_type_name(want->type),
             (unsigned long long)want->request_id, (unsigned long long)got->present,
             (unsigned long long)want->present);
  for (size_t i = 0; i < NELEM(fspec); i++) {
    const fspec_t *f = &fspec[i];
    if (!(want->present & TXP_FIELD_BIT(f->key))) continue;
    if (f->kind == K_STR) {
      const char *a = msg_str(want, f), *b = msg_str(got, f);
      assert_non_null(b);
      if (strcmp(a, b) != 0) fail_msg("field %s: '%s' want '%s'", f->name, b, a);
    } else if (msg_int(want, f) != msg_int(got, f)) {
      fail_msg("field %s: %lld want %lld", f->name, (long long)msg_int(got, f),
               (long long)msg_int(want, f));
    }
  }
}

/* A decoded message leaves absent fields zero. */
static void assert_absent_zero(const txp_msg_t *m) {
  for (size_t i = 0; i < NELEM(fspec); i++) {
    const fspec_t *f = &fspec[i];
    if (m->present & TXP_FIELD_BIT(f->key)) continue;
    if (f->kind == K_STR) assert_null(msg_str(m, f));
    else assert_int_equal(msg_int(m, f), 0);
  }
}

/* What a body error leaves in 'out': the header, nothing else. */
static void assert_header_only(const txp_msg_t *m, uint16_t type, uint16_t flags, uint64_t rid) {
  assert_int_equal(m->type, type);
  assert_int_equal(m->flags, flags);
  assert_int_equal(m->request_id, rid);
  assert_int_equal(m->present, 0);
  assert_null(m->owned_);
  assert_absent_zero(m);
}

/* ================================================================= bytes */

typedef struct {
  char *p;
  size_t n, cap;
} bytes_t;

static void bytes_add(bytes_t *b, const void *p, size_t n) {
  if (b->n + n > b->cap) {
    size_t c = b->cap ? b->cap : 256;
    while (c < b->n + n) c *= 2;
    char *q = realloc(b->p, c);
    assert_non_null(q);
    b->p = q;
    b->cap = c;
  }
  if (n) memcpy(b->p + b->n, p, n);
  b->n += n;
}

static void bytes_free(bytes_t *b) {
  free(b->p);
  memset(b, 0, sizeof(*b));
}

typedef struct {
  uint8_t major, minor;
  uint16_t type, flags;
  uint64_t rid;
} hdr_t;

static hdr_t H(uint16_t type, uint64_t rid) {
  hdr_t h = {TXP_VERSION_MAJOR, TXP_VERSION_MINOR, type, 0, rid};
  return h;
}

static void put_be(unsigned char *p, uint64_t v, int n) {
  for (int i = n - 1; i >= 0; i--, v >>= 8) p[i] = (unsigned char)(v & 0xff);
}

/* A header declaring 'body_len', whatever follows. */
static void add_header(bytes_t *out, hdr_t h, uint32_t body_len) {
  unsigned char b[TXP_HEADER_SIZE];
  b[0] = 0xDA;
  b[1] = 0xDA;
  b[2] = h.major;
  b[3] = h.minor;
  put_be(b + 4, h.type, 2);
  put_be(b + 6, h.flags, 2);
  put_be(b + 8, h.rid, 8);
  put_be(b + 16, body_len, 4);
  bytes_add(out, b, sizeof(b));
}

static void add_frame(bytes_t *out, hdr_t h, const void *body, size_t n) {
  add_header(out, h, (uint32_t)n);
  bytes_add(out, body, n);
}

/* A msgpack body under construction. */
typedef struct {
  msgpack_sbuffer sb;
  msgpack_packer pk;
} body_t;

static void body_init(body_t *b) {
  msgpack_sbuffer_init(&b->sb);
  msgpack_packer_init(&b->pk, &b->sb, msgpack_sbuffer_write);
}

static void body_free(body_t *b) { msgpack_sbuffer_destroy(&b->sb); }

static void pk_raw(body_t *b, const void *p, size_t n) { msgpack_sbuffer_write(&b->sb, p, n); }
static void pk_key(body_t *b, uint64_t k) { msgpack_pack_uint64(&b->pk, k); }
static void pk_strn(body_t *b, const char *s, size_t n) {
  msgpack_pack_str(&b->pk, n);
  msgpack_pack_str_body(&b->pk, s, n);
}
static void pk_str(body_t *b, const char *s) { pk_strn(b, s, strlen(s)); }

static void add_body_frame(bytes_t *out, hdr_t h, const body_t *b) {
  add_frame(out, h, b->sb.data, b->sb.size);
}

/* The test's own encoder: packs every present field of 'm' in key order,
 * without any validation.  For valid messages it must produce the same
 * bytes as txp_encode (which pins the body format); for invalid ones it
 * produces the frames txp_encode refuses to write. */
static void pack_fields(body_t *b, const txp_msg_t *m, uint32_t extra_entries) {
  msgpack_pack_map(&b->pk, (size_t)__builtin_popcountll(m->present) + extra_entries);
  for (size_t i = 0; i < NELEM(fspec); i++) {
    const fspec_t *f = &fspec[i];
    if (!(m->present & TXP_FIELD_BIT(f->key))) continue;
    msgpack_pack_uint8(&b->pk, (uint8_t)f->key);
    switch (f->kind) {
    case K_STR: pk_str(b, msg_str(m, f)); break;
    case K_I64: msgpack_pack_int64(&b->pk, msg_int(m, f)); break;
    case K_U32: msgpack_pack_uint32(&b->pk, (uint32_t)msg_int(m, f)); break;
    case K_BOOL:
      if (msg_int(m, f)) msgpack_pack_true(&b->pk);
      else msgpack_pack_false(&b->pk);
      break;
    }
  }
}

static void add_msg_frame(bytes_t *out, const txp_msg_t *m) {
  body_t b;
  body_init(&b);
  pack_fields(&b, m, 0);
  hdr_t h = H(m->type, m->request_id);
  h.flags = m->flags;
  add_body_frame(out, h, &b);
  body_free(&b);
}

/* The "next valid frame" appended after each bad one. */
static void add_good_frame(bytes_t *out, uint64_t rid) {
  body_t b;
  body_init(&b);
  msgpack_pack_map(&b.pk, 1);
  pk_key(&b, TXP_F_XID);
  pk_str(&b, "next");
  add_body_frame(out, H(TXP_MSG_GLOBAL_COMMIT, rid), &b);
  body_free(&b);
}

static void expect_good(txp_decoder_t *d, uint64_t rid) {
  txp_msg_t m;
  txp_msg_init(&m, TXP_MSG_NONE);
  int rc = txp_decoder_next(d, &m);
  if (rc != 0) fail_msg("next valid frame: %s", txp_errname(rc));
  assert_int_equal(m.type, TXP_MSG_GLOBAL_COMMIT);
  assert_int_equal(m.request_id, rid);
  assert_int_equal(m.present, TXP_FIELD_BIT(TXP_F_XID));
  assert_string_equal(m.xid, "next");
  txp_msg_clear(&m);
}

/* xorshift64*: deterministic chunk sizes. */
static uint64_t rng(uint64_t *s) {
  uint64_t x = *s;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  *s = x;
  return x * UINT64_C(2685821657736338717);
}

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

/* The frame decodes (whole, and through a decoder); result in 'out'. */
static void expect_decode_ok(const txp_limits_t *lim, hdr_t h, const void *body, size_t n,
                             txp_msg_t *out, const char *what) {
  bytes_t s = {0};
  add_frame(&s, h, body, n);
  txp_msg_init(out, TXP_MSG_NONE);
  int rc = txp_decode_frame(s.p, s.n, lim, out);
  if (rc != 0) fail_msg("%s: decode_frame %s", what, txp_errname(rc));
  assert_int_equal(out->type, h.type);
  assert_int_equal(out->request_id, h.rid);

  txp_decoder_t *d = txp_decoder_new(lim);
  assert_int_equal(txp_decoder_feed(d, s.p, s.n), 0);
  txp_msg_t m;
  txp_msg_init(&m, TXP_MSG_NONE);
  rc = txp_decoder_next(d, &m);
  if (rc != 0) fail_msg("%s: decoder %s", what, txp_errname(rc));
  assert_msg_eq(out, &m);
  txp_msg_clear(&m);
  assert_int_equal(txp_decoder_next(d, &m), TXP_EAGAIN);
  txp_decoder_free(d);
  bytes_free(&s);
}

/* =============================================================== tests */

static void test_tables_pinned(void **state) {
  (void)state;
  assert_int_equal(NELEM(fspec), NELEM(field_pin));
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
  assert_int_equal(nvalid, (int)NELEM(tspec));
  assert_int_equal(TXP_HEADER_SIZE, 20);
  assert_int_equal(TXP_MAX_XID_LEN, 128);
}

/* For every type and every field: the encoder accepts it iff the table
 * allows it, and refuses to drop any required field. */
static void test_encode_field_table(void **state) {
  (void)state;
  txp_buf_t b;
  txp_buf_init(&b, 0);
  for (size_t i = 0; i < NELEM(tspec); i++) {
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
      make_msg(&m, ts->type, ts->allowed & ~TXP_FIELD_BIT(k), 0, 7, 0);
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
  for (size_t i = 0; i < NELEM(tspec); i++) {
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

static void test_golden_bytes(void **state) {
  (void)state;
  txp_buf_t b;
  txp_buf_init(&b, 0);
  txp_msg_t m;
  txp_msg_init(&m, TXP_MSG_GLOBAL_COMMIT);
  m.request_id = UINT64_C(0x0102030405060708);
  m.flags = TXP_FLAG_ONEWAY;
  txp_msg_set_str(&m, TXP_F_XID, "ab");
  assert_int_equal(txp_encode(&m, &b, 0), 0);
  static const unsigned char want1[] = {0xDA, 0xDA, 0x01, 0x00, 0x00, 0x16, 0x00, 0x02, 0x01,
                                        0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x00, 0x00,
                                        0x00, 0x05, 0x81, 0x03, 0xA2, 0x61, 0x62};
  assert_int_equal(b.len, sizeof(want1));
  assert_memory_equal(b.data, want1, sizeof(want1));

  /* A result built with txp_msg_init_result: type + 1, RESPONSE, code. */
  txp_msg_t res;
  txp_msg_init(&m, TXP_MSG_GLOBAL_REPORT);
  m.request_id = 1;
  txp_msg_init_result(&res, &m, TXP_ELOCK_CONFLICT, NULL);
  assert_int_equal(res.type, TXP_MSG_GLOBAL_REPORT_RESULT);
  assert_int_equal(res.flags, TXP_FLAG_RESPONSE);
  assert_int_equal(res.request_id, 1);
  assert_int_equal(res.present, TXP_FIELD_BIT(TXP_F_CODE));
  txp_buf_reset(&b);
  assert_int_equal(txp_encode(&res, &b, 0), 0);
  static const unsigned char want2[] = {0xDA, 0xDA, 0x01, 0x00, 0x00, 0x1D, 0x00, 0x01, 0x00,
                                        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00,
                                        0x00, 0x05, 0x81, 0x01, 0xD1, 0xD8, 0x87};
  assert_int_equal(b.len, sizeof(want2));
  assert_memory_equal(b.data, want2, sizeof(want2));

  /* bool false is carried, not dropped */
  txp_msg_init(&m, TXP_MSG_GLOBAL_LOCK_QUERY_RESULT);
  txp_msg_set_int(&m, TXP_F_CODE, 0);
  txp_msg_set_int(&m, TXP_F_LOCKABLE, 0);
  txp_buf_reset(&b);
  assert_int_equal(txp_encode(&m, &b, 0), 0);
  static const unsigned char body3[] = {0x82, 0x01, 0x00, 0x15, 0xC2};
  assert_int_equal(b.len, TXP_HEADER_SIZE + sizeof(body3));
  assert_memory_equal(b.data + TXP_HEADER_SIZE, body3, sizeof(body3));
  txp_buf_free(&b);
}

static void test_msg_helpers(void **state) {
  (void)state;
  txp_msg_t m, res;
  /* results of requests; anything else is answered with Error */
  for (size_t i = 0; i < NELEM(tspec); i++) {
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

/* Every type twice (all fields / required only), encoded back to back. */
static void stream_build(stream_t *s) {
  memset(s, 0, sizeof(*s));
  txp_buf_t b;
  txp_buf_init(&b, 0);
  for (size_t i = 0; i < NELEM(tspec); i++)
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
  stream_t *s = malloc(sizeof(*s));
  assert_non_null(s);
  stream_build(s);
  stream_check(s, 0);
  bytes_free(&s->bytes);
  free(s);
}

static void test_stream_random_chunks(void **state) {
  (void)state;
  stream_t *s = malloc(sizeof(*s));
  assert_non_null(s);
  stream_build(s);
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
  bytes_free(&s->bytes);
  free(s);
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
static void b_xid(body_t *b) {
  msgpack_pack_map(&b->pk, 1);
  pk_key(b, TXP_F_XID);
  pk_str(b, "x");
}
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
  for (size_t i = 0; i < NELEM(fspec); i++) {
    const fspec_t *f = &fspec[i];
    if (f->kind != K_STR) continue;
    const tspec_t *ts = NULL;
    for (size_t t = 0; t < NELEM(tspec) && !ts; t++)
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
  /* depth recovers after a container closes */
  assert_int_equal(txp_mpcheck(MP("\x93\x91\x91\x01\x91\x91\x01\x91\x01"), big, 3, big), 0);
#undef MP
  /* 32 nested arrays is the checker's own ceiling, whatever max_depth says */
  unsigned char deep[40];
  for (int d = 30; d <= 34; d++) {
    memset(deep, 0x91, (size_t)d);
    deep[d] = 0x01;
    assert_int_equal(txp_mpcheck(deep, (size_t)d + 1, big, big, big), d <= 32 ? 0 : TXP_ELIMIT);
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

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_tables_pinned),
    cmocka_unit_test(test_encode_field_table),
    cmocka_unit_test(test_roundtrip_every_type),
    cmocka_unit_test(test_golden_bytes),
    cmocka_unit_test(test_msg_helpers),
    cmocka_unit_test(test_stream_byte_at_a_time),
    cmocka_unit_test(test_stream_random_chunks),
    cmocka_unit_test(test_decode_frame_whole_only),
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
    cmocka_unit_test(test_versions),
    cmocka_unit_test(test_unknown_keys_skipped),
    cmocka_unit_test(test_mpcheck_formats),
    cmocka_unit_test(test_mpcheck_limits),
    cmocka_unit_test(test_encode_errors),
    cmocka_unit_test(test_encode_buffer_cap),
    cmocka_unit_test(test_regress_next_on_empty_decoder),
    cmocka_unit_test(test_regress_decode_frame_zero_limits),
    cmocka_unit_test(test_regress_encode_cap_mid_body),
    cmocka_unit_test(test_regress_empty_strings),
  };
  return cmocka_run_group_tests_name("proto_codec", tests, NULL, NULL);
}
