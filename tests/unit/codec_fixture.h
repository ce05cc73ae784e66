/*
 * codec_fixture.h - what test_proto_codec and test_proto_codec_bad share:
 * the field and message-type tables written down a second time, message
 * values, hand-made frames (bytes_t, body_t built with msgpack-c's packer,
 * headers written by add_header), checks of decoded messages, and an
 * allocation tracker under ASan.
 *
 * NOTES
 *   Malformed bodies are built with msgpack-c's packer (body_t) or as raw
 *   bytes, and framed with add_frame(), which writes the 20-byte header
 *   itself, so the encoder under test never has a say in what is fed back.
 */
#ifndef CODEC_FIXTURE_H
#define CODEC_FIXTURE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <msgpack.h>

#include "txp_msg.h"

#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

/* Under ASan, the largest single allocation between start and stop, so
 * that "no large allocation for a lying container header" is checked
 * directly; 0 when it cannot be known. */
void alloc_track_start(void);
size_t alloc_track_stop(void);

/* ================================================================ tables */

enum { K_STR, K_I64, K_U32, K_BOOL };

/* The field table as the header defines it (for offsets and names). */
typedef struct {
  int key;
  int kind;
  size_t off;
  uint32_t max_len;
  const char *name;
} fspec_t;

extern const fspec_t fspec[];
extern const size_t nfspec;

/* Which fields each message type requires and allows: the format, written
 * down a second time on purpose (the encoder and decoder share one table in
 * txp_msg.c; this one catches a change to it). */
typedef struct {
  int type;
  const char *name;
  uint64_t req;     /* a minimal valid set */
  uint64_t allowed;
  uint64_t one_of;  /* at least one of these is required (BranchRegister:
                       its xid, or the timeout that begins the global) */
} tspec_t;

extern const tspec_t tspec[];
extern const size_t ntspec;

const fspec_t *field_of(int key);
const tspec_t *type_of(int type);

/* ======================================================== message values */

/* Two values per field ('variant' 0 or 1): strings with multi-byte UTF-8,
 * integers at the ends of their ranges. */
const char *str_value(int key, int variant);
int64_t int_value(int key, int variant);
void set_field(txp_msg_t *m, int key, int variant);
/* A message of 'type' carrying the fields in 'mask'. */
void make_msg(txp_msg_t *m, int type, uint64_t mask, int variant, uint64_t rid, uint16_t flags);
const char *msg_str(const txp_msg_t *m, const fspec_t *f);
int64_t msg_int(const txp_msg_t *m, const fspec_t *f);
/* Field-by-field equality of header, present mask and every present field. */
void assert_msg_eq(const txp_msg_t *want, const txp_msg_t *got);
/* A decoded message leaves absent fields zero. */
void assert_absent_zero(const txp_msg_t *m);
/* What a body error leaves in 'out': the header, nothing else. */
void assert_header_only(const txp_msg_t *m, uint16_t type, uint16_t flags, uint64_t rid);

/* ================================================================= bytes */

typedef struct {
  char *p;
  size_t n, cap;
} bytes_t;

void bytes_add(bytes_t *b, const void *p, size_t n);
void bytes_free(bytes_t *b);

typedef struct {
  uint8_t major, minor;
  uint16_t type, flags;
  uint64_t rid;
} hdr_t;

/* The header of a frame of this version. */
hdr_t H(uint16_t type, uint64_t rid);
void put_be(unsigned char *p, uint64_t v, int n);
/* A header declaring 'body_len', whatever follows. */
void add_header(bytes_t *out, hdr_t h, uint32_t body_len);
void add_frame(bytes_t *out, hdr_t h, const void *body, size_t n);

/* A msgpack body under construction. */
typedef struct {
  msgpack_sbuffer sb;
  msgpack_packer pk;
} body_t;

void body_init(body_t *b);
void body_free(body_t *b);
void pk_raw(body_t *b, const void *p, size_t n);
void pk_key(body_t *b, uint64_t k);
void pk_strn(body_t *b, const char *s, size_t n);
void pk_str(body_t *b, const char *s);
/* A body of one field: xid "x". */
void b_xid(body_t *b);
void add_body_frame(bytes_t *out, hdr_t h, const body_t *b);
/* The test's own encoder: packs every present field of 'm' in key order,
 * without any validation.  For valid messages it must produce the same
 * bytes as txp_encode (which pins the body format); for invalid ones it
 * produces the frames txp_encode refuses to write. */
void pack_fields(body_t *b, const txp_msg_t *m, uint32_t extra_entries);
void add_msg_frame(bytes_t *out, const txp_msg_t *m);
/* The "next valid frame" appended after each bad one, and its check. */
void add_good_frame(bytes_t *out, uint64_t rid);
void expect_good(txp_decoder_t *d, uint64_t rid);

/* The frame decodes (whole, and through a decoder); result in 'out'. */
void expect_decode_ok(const txp_limits_t *lim, hdr_t h, const void *body, size_t n, txp_msg_t *out,
                      const char *what);

#endif /* CODEC_FIXTURE_H */
