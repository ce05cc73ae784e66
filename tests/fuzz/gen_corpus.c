/*
 * gen_corpus.c - writes the seed corpus of fuzz_decoder: one valid frame per
 * message type (every field the type allows, set), plus a few streams and
 * frames that reach the less common paths (unknown keys, a newer minor, a
 * body error followed by a valid frame).
 *
 *   gen_corpus DIR
 *
 * Which fields a type allows is discovered through the encoder itself
 * (it checks required fields first, then refuses fields outside the type),
 * so this program never repeats the format table.  The output is
 * deterministic; the files in tests/fuzz/corpus/ were made with it.
 */
#include <msgpack.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "txp_msg.h"

enum { K_STR, K_I64, K_U32, K_BOOL };

static const struct {
  int key;
  int kind;
} fields[] = {
#define FROW(fname, key, kind, member, maxlen) {(key), K_##kind},
  TXP_FIELD_MAP(FROW)
#undef FROW
};

#define NFIELDS (sizeof(fields) / sizeof(fields[0]))

static const char *str_for(int key) {
  switch (key) {
  case TXP_F_MESSAGE: return "global lock conflict on stock:42";
  case TXP_F_XID: return "10.0.0.7:8091:90001234:5ac1d2e3f4a5b6c7";
  case TXP_F_NAME: return "flash-sale-order";
  case TXP_F_RESOURCE_ID: return "jdbc:postgresql://db/shop";
  case TXP_F_LOCK_KEYS: return "stock:42,43;orders:9001";
  case TXP_F_APP_DATA: return "{\"k\":\"v\"}";
  case TXP_F_IDEM_KEY: return "idem-7f3a";
  case TXP_F_APP_ID: return "shop";
  case TXP_F_TOKEN: return "s3cr\xc3\xa9t";
  case TXP_F_RESOURCE_IDS: return "jdbc:postgresql://db/shop,redis://cache";
  case TXP_F_CLIENT_ID: return "shop-1";
  case TXP_F_SERVER_VERSION: return "txc/0.1.0";
  case TXP_F_LOCK_HOLDER: return "10.0.0.8:8091:90001200";
  default: return "x";
  }
}

static int64_t int_for(int key) {
  switch (key) {
  case TXP_F_CODE: return TXP_ELOCK_CONFLICT;
  case TXP_F_BRANCH_ID: return 90001235;
  case TXP_F_GLOBAL_STATUS: return TXP_GS_COMMITTED;
  case TXP_F_BRANCH_STATUS: return TXP_BS_PHASE2_COMMITTED;
  case TXP_F_BRANCH_TYPE: return TXP_BT_AT;
  case TXP_F_LOCKABLE: return 1;
  case TXP_F_NODE_ID: return 3;
  default: return 60000;
  }
}

static void set_field(txp_msg_t *m, int i) {
  if (fields[i].kind == K_STR) txp_msg_set_str(m, (txp_field_t)fields[i].key, str_for(fields[i].key));
  else txp_msg_set_int(m, (txp_field_t)fields[i].key, int_for(fields[i].key));
}

static int try_encode(const txp_msg_t *m) {
  txp_buf_t b;
  txp_buf_init(&b, 0);
  int rc = txp_encode(m, &b, 0);
  txp_buf_free(&b);
  return rc;
}

/* A message of 'type' with every field the type allows. */
static void full_msg(txp_msg_t *m, int type, uint64_t rid) {
  txp_msg_init(m, (txp_msg_type_t)type);
  m->request_id = rid;
  if (!txp_msg_type_is_request(type) && type != TXP_MSG_HEARTBEAT) m->flags = TXP_FLAG_RESPONSE;
  for (size_t i = 0; i < NFIELDS; i++) set_field(m, (int)i);
  /* drop fields one by one unless the type requires them */
  for (size_t i = 0; i < NFIELDS; i++) {
    uint64_t bit = TXP_FIELD_BIT(fields[i].key);
    m->present &= ~bit;
    if (try_encode(m) == TXP_EFIELD_MISSING) m->present |= bit;
  }
  /* add back each one the type accepts */
  for (size_t i = 0; i < NFIELDS; i++) {
    uint64_t bit = TXP_FIELD_BIT(fields[i].key);
    if (m->present & bit) continue;
    m->present |= bit;
    if (try_encode(m) != 0) m->present &= ~bit;
  }
  if (try_encode(m) != 0) {
    fprintf(stderr, "gen_corpus: cannot build type %d\n", type);
    exit(1);
  }
}

static void write_file(const char *dir, const char *name, const void *p, size_t n) {
  char path[4096];
  snprintf(path, sizeof(path), "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(p, 1, n, f) != n || fclose(f) != 0) {
    perror(path);
    exit(1);
  }
}

static void header(unsigned char *h, uint8_t minor, uint16_t type, uint16_t flags, uint64_t rid,
                   uint32_t body_len) {
  h[0] = 0xDA;
  h[1] = 0xDA;
  h[2] = TXP_VERSION_MAJOR;
  h[3] = minor;
  h[4] = (unsigned char)(type >> 8);
  h[5] = (unsigned char)type;
  h[6] = (unsigned char)(flags >> 8);
  h[7] = (unsigned char)flags;
  for (int i = 0; i < 8; i++) h[8 + i] = (unsigned char)(rid >> (56 - 8 * i));
  for (int i = 0; i < 4; i++) h[16 + i] = (unsigned char)(body_len >> (24 - 8 * i));
}

/* Append a frame with a hand-packed body to 'out'. */
static void append_raw(txp_buf_t *out, uint8_t minor, uint16_t type, uint64_t rid,
                       const msgpack_sbuffer *body) {
  unsigned char h[TXP_HEADER_SIZE];
  header(h, minor, type, 0, rid, (uint32_t)body->size);
  size_t need = out->len + sizeof(h) + body->size;
  char *p = realloc(out->data, need);
  if (!p) exit(1);
  out->data = p;
  out->alloc = need;
  memcpy(out->data + out->len, h, sizeof(h));
  memcpy(out->data + out->len + sizeof(h), body->data, body->size);
  out->len = need;
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: gen_corpus DIR\n");
    return 2;
  }
  const char *dir = argv[1];
  txp_buf_t all;
  txp_buf_init(&all, 0);

  for (int type = 1; type < TXP_MSG__MAX; type++) {
    if (!txp_msg_type_valid(type)) continue;
    txp_msg_t m;
    full_msg(&m, type, 1000 + (uint64_t)type);
    txp_buf_t b;
    txp_buf_init(&b, 0);
    if (txp_encode(&m, &b, 0) != 0 || txp_encode(&m, &all, 0) != 0) return 1;
    char name[128];
    snprintf(name, sizeof(name), "type_%02d_%s.bin", type, txp_msg_type_name(type));
    write_file(dir, name, b.data, b.len);
    txp_buf_free(&b);
  }
  /* every type back to back: one stream */
  write_file(dir, "stream_all_types.bin", all.data, all.len);
  txp_buf_free(&all);

  /* minor 3, unknown keys of every msgpack family, a foreign field */
  msgpack_sbuffer sb;
  msgpack_packer pk;
  msgpack_sbuffer_init(&sb);
  msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
  msgpack_pack_map(&pk, 8);
  msgpack_pack_uint8(&pk, TXP_F_XID);
  msgpack_pack_str_with_body(&pk, "10.0.0.7:8091:1", 15);
  msgpack_pack_uint8(&pk, 99);
  msgpack_pack_array(&pk, 2);
  msgpack_pack_map(&pk, 1);
  msgpack_pack_int(&pk, -1);
  msgpack_pack_nil(&pk);
  msgpack_pack_double(&pk, 0.5);
  msgpack_pack_uint16(&pk, 300);
  msgpack_pack_bin_with_body(&pk, "\0\1", 2);
  msgpack_pack_uint32(&pk, 70000);
  msgpack_pack_ext_with_body(&pk, "abcd", 4, 5);
  msgpack_pack_uint64(&pk, UINT64_C(1) << 40);
  msgpack_pack_float(&pk, 1.5f);
  msgpack_pack_uint8(&pk, 26);
  msgpack_pack_true(&pk);
  msgpack_pack_uint8(&pk, TXP_F_HEARTBEAT_MS); /* not a GlobalCommit field: ignored */
  msgpack_pack_uint32(&pk, 5);
  msgpack_pack_uint8(&pk, 0);
  msgpack_pack_int64(&pk, INT64_MIN);
  txp_buf_t raw;
  txp_buf_init(&raw, 0);
  append_raw(&raw, 3, TXP_MSG_GLOBAL_COMMIT, 7, &sb);
  write_file(dir, "unknown_keys_minor3.bin", raw.data, raw.len);

  /* a body error (duplicate key), then a valid frame */
  msgpack_sbuffer_clear(&sb);
  msgpack_pack_map(&pk, 2);
  msgpack_pack_uint8(&pk, TXP_F_XID);
  msgpack_pack_str_with_body(&pk, "a", 1);
  msgpack_pack_uint8(&pk, TXP_F_XID);
  msgpack_pack_str_with_body(&pk, "b", 1);
  txp_buf_reset(&raw);
  append_raw(&raw, 0, TXP_MSG_GLOBAL_ROLLBACK, 8, &sb);
  txp_msg_t m;
  full_msg(&m, TXP_MSG_GLOBAL_ROLLBACK, 9);
  if (txp_encode(&m, &raw, 0) != 0) return 1;
  write_file(dir, "body_error_then_valid.bin", raw.data, raw.len);

  /* empty strings (msgpack-c hands back a NULL pointer for those) */
  txp_buf_reset(&raw);
  txp_msg_init(&m, TXP_MSG_GLOBAL_BEGIN);
  m.request_id = 10;
  txp_msg_set_str(&m, TXP_F_NAME, "");
  txp_msg_set_str(&m, TXP_F_IDEM_KEY, "");
  if (txp_encode(&m, &raw, 0) != 0) return 1;
  txp_msg_init(&m, TXP_MSG_GLOBAL_COMMIT);
  m.request_id = 11;
  txp_msg_set_str(&m, TXP_F_XID, "");
  if (txp_encode(&m, &raw, 0) != 0) return 1;
  write_file(dir, "empty_strings.bin", raw.data, raw.len);

  txp_buf_free(&raw);
  msgpack_sbuffer_destroy(&sb);
  return 0;
}
