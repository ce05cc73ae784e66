/*
 * txp_msg.c - the frame codec: message/field tables, encoder, incremental
 * decoder.  See txp_msg.h for the format.
 *
 * NOTES
 *   Decoding an untrusted frame goes in four steps, each refusing before the
 *   next one can allocate or read past what is there:
 *     1. header: magic, major version, flags, body_len <= max_frame
 *        (checked as soon as 20 bytes are in, not after buffering the body);
 *     2. txp_mpcheck(): counts vs bytes left, depth, string lengths;
 *     3. msgpack_unpack_next() into a zone (now bounded by the body size);
 *     4. the field table: key types, value kinds, per-field length limits,
 *        UTF-8 without NUL, enum ranges, required fields of the type.
 */
#include "txp_msg.h"

#include <limits.h>
#include <msgpack.h>
#include <stdlib.h>
#include <string.h>

#include "txp_mpcheck.h"

/* ---------------------------------------------------------------- tables */

typedef enum { KIND_STR, KIND_I64, KIND_U32, KIND_BOOL } field_kind_t;

typedef struct {
  const char *name;
  field_kind_t kind;
  size_t offset;
  uint32_t max_len;
} field_desc_t;

static const field_desc_t fields[TXP_F__MAX] = {
#define TXP__FIELD_ROW(fname, key, kind, member, maxlen) \
  [key] = {#member, KIND_##kind, offsetof(txp_msg_t, member), (maxlen)},
  TXP_FIELD_MAP(TXP__FIELD_ROW)
#undef TXP__FIELD_ROW
};

#define B(f) TXP_FIELD_BIT(TXP_F_##f)
#define RESULT_BASE (B(CODE) | B(MESSAGE) | B(XID) | B(BRANCH_ID) | B(NODE_ID))

typedef struct {
  const char *name;
  uint64_t required;
  uint64_t allowed; /* includes required */
} type_desc_t;

static const type_desc_t types[TXP_MSG__MAX] = {
  [TXP_MSG_ERROR] = {"Error", B(CODE), RESULT_BASE | B(SERVER_VERSION)},
  [TXP_MSG_HEARTBEAT] = {"Heartbeat", 0, B(NODE_ID)},
  [TXP_MSG_HEARTBEAT_RESULT] = {"HeartbeatResult", B(CODE), RESULT_BASE},
  [TXP_MSG_REGISTER_TM] = {"RegisterTM", B(APP_ID) | B(CLIENT_ID),
                           B(APP_ID) | B(CLIENT_ID) | B(TOKEN)},
  [TXP_MSG_REGISTER_TM_RESULT] = {"RegisterTMResult", B(CODE),
                                  RESULT_BASE | B(HEARTBEAT_MS) | B(SERVER_VERSION)},
  [TXP_MSG_REGISTER_RM] = {"RegisterRM", B(APP_ID) | B(CLIENT_ID),
                           B(APP_ID) | B(CLIENT_ID) | B(TOKEN) | B(RESOURCE_IDS)},
  [TXP_MSG_REGISTER_RM_RESULT] = {"RegisterRMResult", B(CODE),
                                  RESULT_BASE | B(HEARTBEAT_MS) | B(SERVER_VERSION)},
  [TXP_MSG_GLOBAL_BEGIN] = {"GlobalBegin", 0, B(TIMEOUT_MS) | B(NAME) | B(IDEM_KEY) | B(FIRST_SEND)},
  [TXP_MSG_GLOBAL_BEGIN_RESULT] = {"GlobalBeginResult", B(CODE), RESULT_BASE | B(TIMEOUT_MS)},
  [TXP_MSG_GLOBAL_COMMIT] = {"GlobalCommit", B(XID), B(XID)},
  [TXP_MSG_GLOBAL_COMMIT_RESULT] = {"GlobalCommitResult", B(CODE), RESULT_BASE | B(GLOBAL_STATUS)},
  [TXP_MSG_GLOBAL_ROLLBACK] = {"GlobalRollback", B(XID), B(XID)},
  [TXP_MSG_GLOBAL_ROLLBACK_RESULT] = {"GlobalRollbackResult", B(CODE),
                                      RESULT_BASE | B(GLOBAL_STATUS)},
  [TXP_MSG_GLOBAL_STATUS] = {"GlobalStatus", B(XID), B(XID)},
  [TXP_MSG_GLOBAL_STATUS_RESULT] = {"GlobalStatusResult", B(CODE), RESULT_BASE | B(GLOBAL_STATUS)},
  [TXP_MSG_GLOBAL_REPORT] = {"GlobalReport", B(XID) | B(GLOBAL_STATUS), B(XID) | B(GLOBAL_STATUS)},
  [TXP_MSG_GLOBAL_REPORT_RESULT] = {"GlobalReportResult", B(CODE), RESULT_BASE | B(GLOBAL_STATUS)},
  /* The xid, or, to begin the global in the same call (its first branch),
   * its timeout (and name) instead: the result then carries the xid. */
  [TXP_MSG_BRANCH_REGISTER] = {"BranchRegister", B(BRANCH_TYPE) | B(RESOURCE_ID),
                               B(XID) | B(BRANCH_TYPE) | B(RESOURCE_ID) | B(LOCK_KEYS) |
                                 B(APP_DATA) | B(LOCK_WAIT_MS) | B(IDEM_KEY) | B(CLIENT_ID) |
                                 B(TIMEOUT_MS) | B(NAME)},
  [TXP_MSG_BRANCH_REGISTER_RESULT] = {"BranchRegisterResult", B(CODE),
                                      RESULT_BASE | B(WAITED_MS) | B(LOCK_HOLDER) | B(TIMEOUT_MS)},
  [TXP_MSG_BRANCH_REPORT] = {"BranchReport", B(XID) | B(BRANCH_ID) | B(BRANCH_STATUS),
                             B(XID) | B(BRANCH_ID) | B(BRANCH_STATUS) | B(APP_DATA) |
                               B(RESOURCE_ID) | B(MESSAGE)},
  [TXP_MSG_BRANCH_REPORT_RESULT] = {"BranchReportResult", B(CODE), RESULT_BASE},
  [TXP_MSG_GLOBAL_LOCK_QUERY] = {"GlobalLockQuery", B(RESOURCE_ID) | B(LOCK_KEYS),
                                 B(RESOURCE_ID) | B(LOCK_KEYS) | B(XID) | B(LOCK_WAIT_MS)},
  [TXP_MSG_GLOBAL_LOCK_QUERY_RESULT] = {"GlobalLockQueryResult", B(CODE),
                                        RESULT_BASE | B(LOCKABLE) | B(LOCK_HOLDER) | B(WAITED_MS)},
  [TXP_MSG_BRANCH_COMMIT] = {"BranchCommit", B(XID) | B(BRANCH_ID) | B(RESOURCE_ID),
                             B(XID) | B(BRANCH_ID) | B(RESOURCE_ID) | B(BRANCH_TYPE) |
                               B(APP_DATA)},
  [TXP_MSG_BRANCH_COMMIT_RESULT] = {"BranchCommitResult", B(CODE), RESULT_BASE | B(BRANCH_STATUS)},
  [TXP_MSG_BRANCH_ROLLBACK] = {"BranchRollback", B(XID) | B(BRANCH_ID) | B(RESOURCE_ID),
                               B(XID) | B(BRANCH_ID) | B(RESOURCE_ID) | B(BRANCH_TYPE) |
                                 B(APP_DATA)},
  [TXP_MSG_BRANCH_ROLLBACK_RESULT] = {"BranchRollbackResult", B(CODE),
                                      RESULT_BASE | B(BRANCH_STATUS)},
  [TXP_MSG_UNDO_LOG_DELETE] = {"UndoLogDelete", B(RESOURCE_ID),
                               B(RESOURCE_ID) | B(SAVE_DAYS) | B(BRANCH_TYPE)},
  [TXP_MSG_UNDO_LOG_DELETE_RESULT] = {"UndoLogDeleteResult", B(CODE), RESULT_BASE},
};

/* Of these, at least one too (0: no such rule). */
static uint64_t one_of(int type) { return type == TXP_MSG_BRANCH_REGISTER ? B(XID) | B(TIMEOUT_MS) : 0; }

#undef B

static bool field_valid(int f) { return f > 0 && f < TXP_F__MAX && fields[f].name != NULL; }

bool txp_msg_type_valid(int type) {
  return type > 0 && type < TXP_MSG__MAX && types[type].name != NULL;
}

bool txp_msg_type_is_request(int type) {
  return txp_msg_type_valid(type) && type != TXP_MSG_ERROR && txp_msg_type_valid(type + 1) &&
         (type % 2) == 0;
}

const char *txp_msg_type_name(int type) {
  return txp_msg_type_valid(type) ? types[type].name : "Unknown";
}

const char *txp_field_name(int f) { return field_valid(f) ? fields[f].name : "unknown"; }

void txp_limits_default(txp_limits_t *l) {
  l->max_frame = TXP_DEFAULT_MAX_FRAME;
  l->max_string = TXP_DEFAULT_MAX_STRING;
  l->max_count = TXP_DEFAULT_MAX_COUNT;
  l->max_depth = TXP_DEFAULT_MAX_DEPTH;
}

/* Copy 'in' (NULL = defaults), replacing each 0 by its default: the decoder
 * and txp_decode_frame() must read the same limits the same way. */
static void limits_resolve(txp_limits_t *l, const txp_limits_t *in) {
  if (in) *l = *in;
  else txp_limits_default(l);
  if (l->max_frame == 0) l->max_frame = TXP_DEFAULT_MAX_FRAME;
  if (l->max_string == 0) l->max_string = TXP_DEFAULT_MAX_STRING;
  if (l->max_count == 0) l->max_count = TXP_DEFAULT_MAX_COUNT;
  if (l->max_depth == 0) l->max_depth = TXP_DEFAULT_MAX_DEPTH;
}

/* -------------------------------------------------------------- messages */

void txp_msg_init(txp_msg_t *m, txp_msg_type_t type) {
  memset(m, 0, sizeof(*m));
  m->type = (uint16_t)type;
}

void txp_msg_clear(txp_msg_t *m) {
  free(m->owned_);
  memset(m, 0, sizeof(*m));
}

static char **str_slot(txp_msg_t *m, txp_field_t f) {
  return (char **)(void *)((char *)m + fields[f].offset);
}

void txp_msg_set_str(txp_msg_t *m, txp_field_t f, const char *value) {
  if (!field_valid(f) || fields[f].kind != KIND_STR) return;
  *str_slot(m, f) = (char *)(uintptr_t)value; /* borrowed; never written through */
  if (value) m->present |= TXP_FIELD_BIT(f);
  else m->present &= ~TXP_FIELD_BIT(f);
}

void txp_msg_set_int(txp_msg_t *m, txp_field_t f, int64_t value) {
  if (!field_valid(f)) return;
  void *slot = (char *)m + fields[f].offset;
  switch (fields[f].kind) {
  case KIND_I64: *(int64_t *)slot = value; break;
  case KIND_U32: *(uint32_t *)slot = (uint32_t)value; break;
  case KIND_BOOL: *(bool *)slot = value != 0; break;
  case KIND_STR: return;
  }
  m->present |= TXP_FIELD_BIT(f);
}

bool txp_msg_has(const txp_msg_t *m, txp_field_t f) {
  return field_valid(f) && (m->present & TXP_FIELD_BIT(f)) != 0;
}

void txp_msg_init_result(txp_msg_t *res, const txp_msg_t *req, int code, const char *message) {
  int type = txp_msg_type_is_request(req->type) ? req->type + 1 : TXP_MSG_ERROR;
  txp_msg_init(res, (txp_msg_type_t)type);
  res->request_id = req->request_id;
  res->flags = TXP_FLAG_RESPONSE;
  txp_msg_set_int(res, TXP_F_CODE, code);
  if (message) txp_msg_set_str(res, TXP_F_MESSAGE, message);
}

/* ---------------------------------------------------------------- buffer */

void txp_buf_init(txp_buf_t *b, size_t cap) {
  memset(b, 0, sizeof(*b));
  b->cap = cap;
}

void txp_buf_free(txp_buf_t *b) {
  free(b->data);
  memset(b, 0, sizeof(*b));
}

void txp_buf_reset(txp_buf_t *b) { b->len = 0; }

void txp_buf_consume(txp_buf_t *b, size_t n) {
  if (n >= b->len) {
    b->len = 0;
    return;
  }
  memmove(b->data, b->data + n, b->len - n);
  b->len -= n;
}

static int buf_reserve(txp_buf_t *b, size_t extra) {
  if (extra > SIZE_MAX - b->len) return TXP_ENOMEM;
  size_t need = b->len + extra;
  if (b->cap && need > b->cap) return TXP_EBUFFER_FULL;
  if (need <= b->alloc) return 0;
  size_t n = b->alloc ? b->alloc : 256;
  while (n < need) n = n > SIZE_MAX / 2 ? need : n * 2;
  if (b->cap && n > b->cap) n = b->cap;
  char *p = realloc(b->data, n);
  if (!p) return TXP_ENOMEM;
  b->data = p;
  b->alloc = n;
  return 0;
}

/* msgpack's write callback can only say "failed": remember why, so that a
 * full bounded buffer is reported as TXP_EBUFFER_FULL, not TXP_ENOMEM. */
typedef struct {
  txp_buf_t *b;
  int err;
} pack_ctx_t;

int txp_buf_append(txp_buf_t *b, const void *data, size_t len) {
  int rc = buf_reserve(b, len + 1);
  if (rc != 0) return rc;
  memcpy(b->data + b->len, data, len);
  b->len += len;
  b->data[b->len] = '\0';
  return 0;
}

int txp_buf_append_str(txp_buf_t *b, const char *s) { return txp_buf_append(b, s, strlen(s)); }

static int buf_write_cb(void *data, const char *buf, size_t len) {
  pack_ctx_t *c = data;
  int rc = buf_reserve(c->b, len);
  if (rc != 0) {
    c->err = rc;
    return -1;
  }
  memcpy(c->b->data + c->b->len, buf, len);
  c->b->len += len;
  return 0;
}

/* ----------------------------------------------------------------- utf-8 */

/* Valid UTF-8 without NUL bytes: what PostgreSQL text columns accept. */
static bool utf8_ok(const unsigned char *s, size_t n) {
  size_t i = 0;
  while (i < n) {
    unsigned char c = s[i];
    if (c == 0) return false;
    if (c < 0x80) {
      i++;
      continue;
    }
    size_t len;
    uint32_t cp;
    if (c >= 0xc2 && c <= 0xdf) len = 2, cp = c & 0x1f;
    else if (c >= 0xe0 && c <= 0xef) len = 3, cp = c & 0x0f;
    else if (c >= 0xf0 && c <= 0xf4) len = 4, cp = c & 0x07;
    else return false;
    if (n - i < len) return false;
    for (size_t k = 1; k < len; k++) {
      if ((s[i + k] & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (s[i + k] & 0x3f);
    }
    if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
        (cp >= 0xd800 && cp <= 0xdfff))
      return false;
    i += len;
  }
  return true;
}

/* --------------------------------------------------------------- encoder */

static void put_be(unsigned char *p, uint64_t v, int n) {
  for (int i = n - 1; i >= 0; i--, v >>= 8) p[i] = (unsigned char)(v & 0xff);
}

static uint64_t get_be(const unsigned char *p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; i++) v = (v << 8) | p[i];
  return v;
}

/* Range checks that belong to the protocol rather than to a handler. */
static int check_values(const txp_msg_t *m) {
  if ((m->present & TXP_FIELD_BIT(TXP_F_GLOBAL_STATUS)) && m->global_status != 0 &&
      !txp_global_status_valid((int)m->global_status))
    return TXP_EFIELD_TYPE;
  if ((m->present & TXP_FIELD_BIT(TXP_F_BRANCH_STATUS)) && m->branch_status != 0 &&
      !txp_branch_status_valid((int)m->branch_status))
    return TXP_EFIELD_TYPE;
  if ((m->present & TXP_FIELD_BIT(TXP_F_BRANCH_TYPE)) && m->branch_type >= TXP_BT__MAX)
    return TXP_EFIELD_TYPE;
  return 0;
}

static int check_for_encode(const txp_msg_t *m) {
  if (!txp_msg_type_valid(m->type)) return TXP_EUNKNOWN_TYPE;
  if (m->flags & ~TXP_FLAGS_KNOWN) return TXP_EBAD_FLAGS;
  const type_desc_t *t = &types[m->type];
  if ((m->present & t->required) != t->required) return TXP_EFIELD_MISSING;
  uint64_t any = one_of(m->type);
  if (any && !(m->present & any)) return TXP_EFIELD_MISSING;
  if (m->present & ~t->allowed) return TXP_EFIELD_TYPE;
  for (int f = 1; f < TXP_F__MAX; f++) {
    if (!(m->present & TXP_FIELD_BIT(f)) || fields[f].kind != KIND_STR) continue;
    const char *s = *(char *const *)(const void *)((const char *)m + fields[f].offset);
    if (!s) return TXP_EFIELD_MISSING;
    size_t n = strlen(s);
    if (n > fields[f].max_len) return TXP_EFIELD_TOO_LONG;
    if (!utf8_ok((const unsigned char *)s, n)) return TXP_EFIELD_TYPE;
  }
  return check_values(m); /* never send what the peer's decoder refuses */
}

int txp_encode(const txp_msg_t *m, txp_buf_t *out, uint32_t max_frame) {
  int rc = check_for_encode(m);
  if (rc != 0) return rc;
  if (max_frame == 0) max_frame = TXP_DEFAULT_MAX_FRAME;

  size_t start = out->len;
  if ((rc = buf_reserve(out, TXP_HEADER_SIZE)) != 0) return rc;
  out->len += TXP_HEADER_SIZE;

  pack_ctx_t ctx = {out, 0};
  msgpack_packer pk;
  msgpack_packer_init(&pk, &ctx, buf_write_cb);
  uint32_t nfields = (uint32_t)__builtin_popcountll(m->present);
  if (msgpack_pack_map(&pk, nfields) != 0) goto nomem;
  for (int f = 1; f < TXP_F__MAX; f++) {
    if (!(m->present & TXP_FIELD_BIT(f))) continue;
    const void *slot = (const char *)m + fields[f].offset;
    if (msgpack_pack_uint8(&pk, (uint8_t)f) != 0) goto nomem;
    int prc = 0;
    switch (fields[f].kind) {
    case KIND_STR: {
      const char *s = *(char *const *)slot;
      size_t n = strlen(s);
      prc = msgpack_pack_str(&pk, n);
      if (prc == 0) prc = msgpack_pack_str_body(&pk, s, n);
      break;
    }
    case KIND_I64: prc = msgpack_pack_int64(&pk, *(const int64_t *)slot); break;
    case KIND_U32: prc = msgpack_pack_uint32(&pk, *(const uint32_t *)slot); break;
    case KIND_BOOL:
      prc = *(const bool *)slot ? msgpack_pack_true(&pk) : msgpack_pack_false(&pk);
      break;
    }
    if (prc != 0) goto nomem;
  }

  size_t body = out->len - start - TXP_HEADER_SIZE;
  if (body > max_frame) {
    out->len = start;
    return TXP_EFRAME_TOO_BIG;
  }
  unsigned char *h = (unsigned char *)out->data + start;
  put_be(h + 0, TXP_MAGIC, 2);
  h[2] = TXP_VERSION_MAJOR;
  h[3] = TXP_VERSION_MINOR;
  put_be(h + 4, m->type, 2);
  put_be(h + 6, m->flags, 2);
  put_be(h + 8, m->request_id, 8);
  put_be(h + 16, body, 4);
  return 0;

nomem:
  out->len = start;
  return ctx.err ? ctx.err : TXP_ENOMEM;
}

/* --------------------------------------------------------------- decoder */

struct txp_decoder {
  txp_limits_t limits;
  char *data;
  size_t len;   /* bytes held, from data[0] */
  size_t rpos;  /* start of unconsumed bytes */
  size_t alloc;
  int poisoned; /* stream error, sticky */
};

txp_decoder_t *txp_decoder_new(const txp_limits_t *limits) {
  txp_decoder_t *d = calloc(1, sizeof(*d));
  if (!d) return NULL;
  limits_resolve(&d->limits, limits);
  return d;
}

void txp_decoder_free(txp_decoder_t *d) {
  if (!d) return;
  free(d->data);
  free(d);
}

size_t txp_decoder_buffered(const txp_decoder_t *d) { return d->len - d->rpos; }

size_t txp_decoder_capacity(const txp_decoder_t *d) { return d->alloc; }

int txp_decoder_feed(txp_decoder_t *d, const char *buf, size_t len) {
  if (len == 0) return 0;
  size_t held = d->len - d->rpos;
  size_t bound = (size_t)d->limits.max_frame + TXP_HEADER_SIZE + TXP_DECODER_SLACK;
  if (len > bound || held > bound - len) return TXP_EBUFFER_FULL;
  if (d->rpos > 0) { /* compact: keep the unconsumed tail at the front */
    memmove(d->data, d->data + d->rpos, held);
    d->len = held;
    d->rpos = 0;
  }
  if (d->len + len > d->alloc) {
    size_t n = d->alloc ? d->alloc : 4096;
    while (n < d->len + len) n *= 2;
    char *p = realloc(d->data, n);
    if (!p) return TXP_ENOMEM;
    d->data = p;
    d->alloc = n;
  }
  memcpy(d->data + d->len, buf, len);
  d->len += len;
  return 0;
}

/* Map one msgpack value onto field 'f' of 'out'; strings are copied into
 * '*arena' (pre-sized).  Returns 0 or a TXP_EFIELD_* / TXP_ELIMIT code. */
static int take_field(txp_msg_t *out, int f, const msgpack_object *v, char **arena,
                      const txp_limits_t *lim) {
  void *slot = (char *)out + fields[f].offset;
  switch (fields[f].kind) {
  case KIND_STR: {
    if (v->type != MSGPACK_OBJECT_STR) return TXP_EFIELD_TYPE;
    uint32_t n = v->via.str.size;
    if (n > fields[f].max_len || n > lim->max_string) return TXP_EFIELD_TOO_LONG;
    if (!utf8_ok((const unsigned char *)v->via.str.ptr, n)) return TXP_EFIELD_TYPE;
    char *dst = *arena;
    if (n) memcpy(dst, v->via.str.ptr, n); /* msgpack-c: ptr is NULL when n == 0 */
    dst[n] = '\0';
    *arena += n + 1;
    *(char **)slot = dst;
    return 0;
  }
  case KIND_I64:
    if (v->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
      if (v->via.u64 > INT64_MAX) return TXP_EFIELD_TYPE;
      *(int64_t *)slot = (int64_t)v->via.u64;
    } else if (v->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
      *(int64_t *)slot = v->via.i64;
    } else {
      return TXP_EFIELD_TYPE;
    }
    return 0;
  case KIND_U32:
    if (v->type != MSGPACK_OBJECT_POSITIVE_INTEGER || v->via.u64 > UINT32_MAX)
      return TXP_EFIELD_TYPE;
    *(uint32_t *)slot = (uint32_t)v->via.u64;
    return 0;
  case KIND_BOOL:
    if (v->type != MSGPACK_OBJECT_BOOLEAN) return TXP_EFIELD_TYPE;
    *(bool *)slot = v->via.boolean;
    return 0;
  }
  return TXP_EFIELD_TYPE;
}

static int decode_body(const char *body, size_t len, const txp_limits_t *lim, txp_msg_t *out) {
  int rc = txp_mpcheck((const unsigned char *)body, len, lim->max_count, lim->max_depth,
                       lim->max_string);
  if (rc != 0) return rc;

  msgpack_unpacked up;
  msgpack_unpacked_init(&up);
  size_t off = 0;
  if (msgpack_unpack_next(&up, body, len, &off) != MSGPACK_UNPACK_SUCCESS || off != len) {
    rc = TXP_EMALFORMED;
    goto done;
  }
  const msgpack_object *root = &up.data;
  if (root->type != MSGPACK_OBJECT_MAP) {
    rc = TXP_EMALFORMED;
    goto done;
  }

  /* Pass 1: keys, duplicates, string storage needed. */
  const type_desc_t *t = &types[out->type];
  uint64_t seen = 0;
  size_t strbytes = 0;
  const msgpack_object_kv *kv = root->via.map.ptr;
  for (uint32_t i = 0; i < root->via.map.size; i++) {
    if (kv[i].key.type != MSGPACK_OBJECT_POSITIVE_INTEGER) {
      rc = TXP_EMALFORMED;
      goto done;
    }
    uint64_t key = kv[i].key.via.u64;
    if (key >= TXP_F__MAX || !field_valid((int)key)) continue; /* newer minor */
    if (seen & TXP_FIELD_BIT(key)) {
      rc = TXP_EMALFORMED; /* duplicate key */
      goto done;
    }
    seen |= TXP_FIELD_BIT(key);
    if (fields[key].kind == KIND_STR && kv[i].val.type == MSGPACK_OBJECT_STR &&
        (t->allowed & TXP_FIELD_BIT(key)))
      strbytes += (size_t)kv[i].val.via.str.size + 1;
  }

  /* Pass 2: values of the fields this type allows. */
  char *arena = NULL;
  if (strbytes) {
    arena = malloc(strbytes);
    if (!arena) {
      rc = TXP_ENOMEM;
      goto done;
    }
    out->owned_ = arena;
  }
  for (uint32_t i = 0; i < root->via.map.size; i++) {
    uint64_t key = kv[i].key.via.u64;
    if (key >= TXP_F__MAX || !field_valid((int)key)) continue;
    if (!(t->allowed & TXP_FIELD_BIT(key))) continue; /* not for this type: ignored */
    rc = take_field(out, (int)key, &kv[i].val, &arena, lim);
    if (rc != 0) goto done;
    out->present |= TXP_FIELD_BIT(key);
  }
  uint64_t any = one_of(out->type);
  if ((out->present & t->required) != t->required || (any && !(out->present & any))) {
    rc = TXP_EFIELD_MISSING;
    goto done;
  }
  rc = check_values(out);

done:
  msgpack_unpacked_destroy(&up);
  return rc;
}

/* Fill out's header fields from a 20-byte header. */
static void read_header(const unsigned char *h, txp_msg_t *out, uint32_t *body_len) {
  out->ver_major = h[2];
  out->ver_minor = h[3];
  out->type = (uint16_t)get_be(h + 4, 2);
  out->flags = (uint16_t)get_be(h + 6, 2);
  out->request_id = get_be(h + 8, 8);
  *body_len = (uint32_t)get_be(h + 16, 4);
}

/* Decode the frame at the start of [buf, buf+len).  *consumed is set to the
 * frame size when a whole frame was examined (success or body error), 0
 * otherwise.  *stream_err is set when the error ends the stream. */
static int decode_one(const char *buf, size_t len, const txp_limits_t *lim, txp_msg_t *out,
                      size_t *consumed, bool *stream_err) {
  const unsigned char *h = (const unsigned char *)buf;
  *consumed = 0;
  *stream_err = false;
  if (len < 2) return TXP_EAGAIN;
  if (get_be(h, 2) != TXP_MAGIC) {
    *stream_err = true;
    return TXP_EBAD_MAGIC;
  }
  if (len < TXP_HEADER_SIZE) return TXP_EAGAIN;

  txp_msg_t hdr;
  uint32_t body_len;
  txp_msg_init(&hdr, TXP_MSG_NONE);
  read_header(h, &hdr, &body_len);
  if (hdr.ver_major != TXP_VERSION_MAJOR) {
    *stream_err = true;
    *out = hdr;
    return TXP_EBAD_VERSION;
  }
  if (body_len > lim->max_frame) {
    *stream_err = true;
    *out = hdr;
    return TXP_EFRAME_TOO_BIG;
  }
  if (len - TXP_HEADER_SIZE < body_len) return TXP_EAGAIN;

  *consumed = TXP_HEADER_SIZE + (size_t)body_len;
  *out = hdr;
  if (hdr.flags & ~TXP_FLAGS_KNOWN) return TXP_EBAD_FLAGS;
  if (!txp_msg_type_valid(hdr.type)) return TXP_EUNKNOWN_TYPE;
  int rc = decode_body(buf + TXP_HEADER_SIZE, body_len, lim, out);
  if (rc != 0) {
    /* Keep the header so the caller can answer; drop any partial fields. */
    free(out->owned_);
    *out = hdr;
  }
  return rc;
}

int txp_decoder_next(txp_decoder_t *d, txp_msg_t *out) {
  if (d->poisoned) return d->poisoned;
  if (d->rpos == d->len) return TXP_EAGAIN; /* also: d->data may still be NULL */
  size_t consumed;
  bool stream_err;
  int rc = decode_one(d->data + d->rpos, d->len - d->rpos, &d->limits, out, &consumed,
                      &stream_err);
  if (stream_err) {
    d->poisoned = rc;
    return rc;
  }
  d->rpos += consumed;
  if (d->rpos == d->len) {
    d->rpos = d->len = 0;
    /* A buffer that grew for a large frame goes back to its first size
     * once empty: 32 connections that each sent one 1 MB frame must not
     * keep 32 MB (security review, finding 3). */
    if (d->alloc > TXP_DECODER_KEEP) {
      free(d->data);
      d->data = NULL;
      d->alloc = 0;
    }
  }
  return rc;
}

int txp_decode_frame(const char *buf, size_t len, const txp_limits_t *limits, txp_msg_t *out) {
  txp_limits_t lim;
  limits_resolve(&lim, limits);
  size_t consumed;
  bool stream_err;
  int rc = decode_one(buf, len, &lim, out, &consumed, &stream_err);
  if (rc == 0 && consumed != len) {
    txp_msg_clear(out);
    return TXP_EMALFORMED; /* trailing bytes after the frame */
  }
  return rc;
}
