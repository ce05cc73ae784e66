/*
 * codec_fixture.c - see codec_fixture.h.
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

#include "codec_fixture.h"

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
void alloc_track_start(void) {
  static int installed;
  if (!installed) installed = __sanitizer_install_malloc_and_free_hooks(track_malloc, track_free) > 0;
  g_max_alloc = 0;
  g_tracking = 1;
}
size_t alloc_track_stop(void) {
  g_tracking = 0;
  return g_max_alloc;
}
#else
void alloc_track_start(void) {}
size_t alloc_track_stop(void) { return 0; }
#endif

/* ================================================================ tables */

const fspec_t fspec[] = {
#define FROW(fname, key, kind, member, maxlen) \
  {(key), K_##kind, offsetof(txp_msg_t, member), (maxlen), #member},
  TXP_FIELD_MAP(FROW)
#undef FROW
};

#define F(x) TXP_FIELD_BIT(TXP_F_##x)
#define RB (F(CODE) | F(MESSAGE) | F(XID) | F(BRANCH_ID) | F(NODE_ID))

const tspec_t tspec[] = {
  {TXP_MSG_ERROR, "Error", F(CODE), RB | F(SERVER_VERSION), 0},
  {TXP_MSG_HEARTBEAT, "Heartbeat", 0, F(NODE_ID), 0},
  {TXP_MSG_HEARTBEAT_RESULT, "HeartbeatResult", F(CODE), RB, 0},
  {TXP_MSG_REGISTER_TM, "RegisterTM", F(APP_ID) | F(CLIENT_ID), F(APP_ID) | F(CLIENT_ID) | F(TOKEN), 0},
  {TXP_MSG_REGISTER_TM_RESULT, "RegisterTMResult", F(CODE), RB | F(HEARTBEAT_MS) | F(SERVER_VERSION), 0},
  {TXP_MSG_REGISTER_RM, "RegisterRM", F(APP_ID) | F(CLIENT_ID),
   F(APP_ID) | F(CLIENT_ID) | F(TOKEN) | F(RESOURCE_IDS), 0},
  {TXP_MSG_REGISTER_RM_RESULT, "RegisterRMResult", F(CODE), RB | F(HEARTBEAT_MS) | F(SERVER_VERSION), 0},
  {TXP_MSG_GLOBAL_BEGIN, "GlobalBegin", 0, F(TIMEOUT_MS) | F(NAME) | F(IDEM_KEY) | F(FIRST_SEND), 0},
  {TXP_MSG_GLOBAL_BEGIN_RESULT, "GlobalBeginResult", F(CODE), RB | F(TIMEOUT_MS), 0},
  {TXP_MSG_GLOBAL_COMMIT, "GlobalCommit", F(XID), F(XID), 0},
  {TXP_MSG_GLOBAL_COMMIT_RESULT, "GlobalCommitResult", F(CODE), RB | F(GLOBAL_STATUS), 0},
  {TXP_MSG_GLOBAL_ROLLBACK, "GlobalRollback", F(XID), F(XID), 0},
  {TXP_MSG_GLOBAL_ROLLBACK_RESULT, "GlobalRollbackResult", F(CODE), RB | F(GLOBAL_STATUS), 0},
  {TXP_MSG_GLOBAL_STATUS, "GlobalStatus", F(XID), F(XID), 0},
  {TXP_MSG_GLOBAL_STATUS_RESULT, "GlobalStatusResult", F(CODE), RB | F(GLOBAL_STATUS), 0},
  {TXP_MSG_GLOBAL_REPORT, "GlobalReport", F(XID) | F(GLOBAL_STATUS), F(XID) | F(GLOBAL_STATUS), 0},
  {TXP_MSG_GLOBAL_REPORT_RESULT, "GlobalReportResult", F(CODE), RB | F(GLOBAL_STATUS), 0},
  /* req: a minimal valid set (the xid; TIMEOUT_MS instead of it begins the
   * global too: test_branch_register_begins) */
  {TXP_MSG_BRANCH_REGISTER, "BranchRegister", F(XID) | F(BRANCH_TYPE) | F(RESOURCE_ID),
   F(XID) | F(BRANCH_TYPE) | F(RESOURCE_ID) | F(LOCK_KEYS) | F(APP_DATA) | F(LOCK_WAIT_MS) |
     F(IDEM_KEY) | F(CLIENT_ID) | F(TIMEOUT_MS) | F(NAME),
   F(XID) | F(TIMEOUT_MS)},
  {TXP_MSG_BRANCH_REGISTER_RESULT, "BranchRegisterResult", F(CODE),
   RB | F(WAITED_MS) | F(LOCK_HOLDER) | F(TIMEOUT_MS), 0},
  {TXP_MSG_BRANCH_REPORT, "BranchReport", F(XID) | F(BRANCH_ID) | F(BRANCH_STATUS),
   F(XID) | F(BRANCH_ID) | F(BRANCH_STATUS) | F(APP_DATA) | F(RESOURCE_ID) | F(MESSAGE), 0},
  {TXP_MSG_BRANCH_REPORT_RESULT, "BranchReportResult", F(CODE), RB, 0},
  {TXP_MSG_GLOBAL_LOCK_QUERY, "GlobalLockQuery", F(RESOURCE_ID) | F(LOCK_KEYS),
   F(RESOURCE_ID) | F(LOCK_KEYS) | F(XID) | F(LOCK_WAIT_MS), 0},
  {TXP_MSG_GLOBAL_LOCK_QUERY_RESULT, "GlobalLockQueryResult", F(CODE),
   RB | F(LOCKABLE) | F(LOCK_HOLDER) | F(WAITED_MS), 0},
  {TXP_MSG_BRANCH_COMMIT, "BranchCommit", F(XID) | F(BRANCH_ID) | F(RESOURCE_ID),
   F(XID) | F(BRANCH_ID) | F(RESOURCE_ID) | F(BRANCH_TYPE) | F(APP_DATA), 0},
  {TXP_MSG_BRANCH_COMMIT_RESULT, "BranchCommitResult", F(CODE), RB | F(BRANCH_STATUS), 0},
  {TXP_MSG_BRANCH_ROLLBACK, "BranchRollback", F(XID) | F(BRANCH_ID) | F(RESOURCE_ID),
   F(XID) | F(BRANCH_ID) | F(RESOURCE_ID) | F(BRANCH_TYPE) | F(APP_DATA), 0},
  {TXP_MSG_BRANCH_ROLLBACK_RESULT, "BranchRollbackResult", F(CODE), RB | F(BRANCH_STATUS), 0},
  {TXP_MSG_UNDO_LOG_DELETE, "UndoLogDelete", F(RESOURCE_ID),
   F(RESOURCE_ID) | F(SAVE_DAYS) | F(BRANCH_TYPE), 0},
  {TXP_MSG_UNDO_LOG_DELETE_RESULT, "UndoLogDeleteResult", F(CODE), RB, 0},
};

const size_t nfspec = NELEM(fspec);
const size_t ntspec = NELEM(tspec);

const fspec_t *field_of(int key) {
  for (size_t i = 0; i < NELEM(fspec); i++)
    if (fspec[i].key == key) return &fspec[i];
  return NULL;
}

const tspec_t *type_of(int type) {
  for (size_t i = 0; i < NELEM(tspec); i++)
    if (tspec[i].type == type) return &tspec[i];
  return NULL;
}

/* ========================================================= message values */

const char *str_value(int key, int variant) {
  static char vals[TXP_F__MAX][2][96];
  char *p = vals[key][variant & 1];
  if (!p[0])
    snprintf(p, sizeof(vals[0][0]), "%s-%d-\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80", field_of(key)->name,
             variant & 1);
  return p;
}

int64_t int_value(int key, int variant) {
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

void set_field(txp_msg_t *m, int key, int variant) {
  if (field_of(key)->kind == K_STR) txp_msg_set_str(m, (txp_field_t)key, str_value(key, variant));
  else txp_msg_set_int(m, (txp_field_t)key, int_value(key, variant));
}

void make_msg(txp_msg_t *m, int type, uint64_t mask, int variant, uint64_t rid,
                     uint16_t flags) {
  txp_msg_init(m, (txp_msg_type_t)type);
  m->request_id = rid;
  m->flags = flags;
  for (int k = 1; k < TXP_F__MAX; k++)
    if (mask & TXP_FIELD_BIT(k)) set_field(m, k, variant);
}

const char *msg_str(const txp_msg_t *m, const fspec_t *f) {
  return *(char *const *)(const void *)((const char *)m + f->off);
}

int64_t msg_int(const txp_msg_t *m, const fspec_t *f) {
  const void *p = (const char *)m + f->off;
  switch (f->kind) {
  case K_I64: return *(const int64_t *)p;
  case K_U32: return *(const uint32_t *)p;
  case K_BOOL: return *(const bool *)p;
  default: return 0;
  }
}

void assert_msg_eq(const txp_msg_t *want, const txp_msg_t *got) {
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

void assert_absent_zero(const txp_msg_t *m) {
  for (size_t i = 0; i < NELEM(fspec); i++) {
    const fspec_t *f = &fspec[i];
    if (m->present & TXP_FIELD_BIT(f->key)) continue;
    if (f->kind == K_STR) assert_null(msg_str(m, f));
    else assert_int_equal(msg_int(m, f), 0);
  }
}

void assert_header_only(const txp_msg_t *m, uint16_t type, uint16_t flags, uint64_t rid) {
  assert_int_equal(m->type, type);
  assert_int_equal(m->flags, flags);
  assert_int_equal(m->request_id, rid);
  assert_int_equal(m->present, 0);
  assert_null(m->owned_);
  assert_absent_zero(m);
}

/* ================================================================= bytes */

void bytes_add(bytes_t *b, const void *p, size_t n) {
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

void bytes_free(bytes_t *b) {
  free(b->p);
  memset(b, 0, sizeof(*b));
}

hdr_t H(uint16_t type, uint64_t rid) {
  hdr_t h = {TXP_VERSION_MAJOR, TXP_VERSION_MINOR, type, 0, rid};
  return h;
}

void put_be(unsigned char *p, uint64_t v, int n) {
  for (int i = n - 1; i >= 0; i--, v >>= 8) p[i] = (unsigned char)(v & 0xff);
}

void add_header(bytes_t *out, hdr_t h, uint32_t body_len) {
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

void add_frame(bytes_t *out, hdr_t h, const void *body, size_t n) {
  add_header(out, h, (uint32_t)n);
  bytes_add(out, body, n);
}

void body_init(body_t *b) {
  msgpack_sbuffer_init(&b->sb);
  msgpack_packer_init(&b->pk, &b->sb, msgpack_sbuffer_write);
}

void body_free(body_t *b) { msgpack_sbuffer_destroy(&b->sb); }

void pk_raw(body_t *b, const void *p, size_t n) { msgpack_sbuffer_write(&b->sb, p, n); }
void pk_key(body_t *b, uint64_t k) { msgpack_pack_uint64(&b->pk, k); }
void pk_strn(body_t *b, const char *s, size_t n) {
  msgpack_pack_str(&b->pk, n);
  msgpack_pack_str_body(&b->pk, s, n);
}
void pk_str(body_t *b, const char *s) { pk_strn(b, s, strlen(s)); }

void b_xid(body_t *b) {
  msgpack_pack_map(&b->pk, 1);
  pk_key(b, TXP_F_XID);
  pk_str(b, "x");
}

void add_body_frame(bytes_t *out, hdr_t h, const body_t *b) {
  add_frame(out, h, b->sb.data, b->sb.size);
}

void pack_fields(body_t *b, const txp_msg_t *m, uint32_t extra_entries) {
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

void add_msg_frame(bytes_t *out, const txp_msg_t *m) {
  body_t b;
  body_init(&b);
  pack_fields(&b, m, 0);
  hdr_t h = H(m->type, m->request_id);
  h.flags = m->flags;
  add_body_frame(out, h, &b);
  body_free(&b);
}

/* The "next valid frame" appended after each bad one. */
void add_good_frame(bytes_t *out, uint64_t rid) {
  body_t b;
  body_init(&b);
  msgpack_pack_map(&b.pk, 1);
  pk_key(&b, TXP_F_XID);
  pk_str(&b, "next");
  add_body_frame(out, H(TXP_MSG_GLOBAL_COMMIT, rid), &b);
  body_free(&b);
}

void expect_good(txp_decoder_t *d, uint64_t rid) {
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
void expect_decode_ok(const txp_limits_t *lim, hdr_t h, const void *body, size_t n,
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
