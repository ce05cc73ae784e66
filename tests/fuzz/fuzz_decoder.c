/*
 * fuzz_decoder.c - libFuzzer target for the frame decoder (txp_msg.h) and
 * the msgpack structure check (txp_mpcheck.h).
 *
 * For each input, twice (small limits, then the defaults):
 *   (a) the input is fed to a txp_decoder in chunks whose sizes come from
 *       the input's first bytes, draining with txp_decoder_next() after
 *       every feed; the sequence of results must equal the one obtained by
 *       feeding the whole input at once (chunking never changes anything);
 *   (b) txp_decode_frame() on the whole input must agree with (a);
 *   (c) every decoded message is re-encoded and decoded again: the result
 *       must be identical, and re-encoding that gives the same bytes.
 * Plus: whenever txp_mpcheck() accepts the input, msgpack-c must parse it as
 * exactly one object.
 *
 * Any disagreement calls abort(), which libFuzzer reports as a crash.
 * Every decoded message is txp_msg_clear'ed, so LeakSanitizer sees leaks.
 */
#include <msgpack.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_check.h"
#include "txp_mpcheck.h"
#include "txp_msg.h"

enum { K_STR, K_I64, K_U32, K_BOOL };

static const struct {
  int key;
  int kind;
  size_t off;
} fields[] = {
#define FROW(fname, key, kind, member, maxlen) {(key), K_##kind, offsetof(txp_msg_t, member)},
  TXP_FIELD_MAP(FROW)
#undef FROW
};

#define NFIELDS (sizeof(fields) / sizeof(fields[0]))

static const char *field_str(const txp_msg_t *m, size_t i) {
  return *(char *const *)(const void *)((const char *)m + fields[i].off);
}

static int64_t field_int(const txp_msg_t *m, size_t i) {
  const void *p = (const char *)m + fields[i].off;
  switch (fields[i].kind) {
  case K_I64: return *(const int64_t *)p;
  case K_U32: return *(const uint32_t *)p;
  case K_BOOL: return *(const bool *)p;
  default: return 0;
  }
}

/* Same header, same present mask, same values; absent fields are zero. */
static bool msg_equal(const txp_msg_t *a, const txp_msg_t *b) {
  if (a->type != b->type || a->flags != b->flags || a->request_id != b->request_id ||
      a->present != b->present)
    return false;
  for (size_t i = 0; i < NFIELDS; i++) {
    bool here = (a->present & TXP_FIELD_BIT(fields[i].key)) != 0;
    if (fields[i].kind == K_STR) {
      const char *x = field_str(a, i), *y = field_str(b, i);
      if (!here) {
        if (x || y) return false;
        continue;
      }
      if (!x || !y || strcmp(x, y) != 0) return false;
    } else if (field_int(a, i) != field_int(b, i)) {
      return false;
    }
  }
  return true;
}

static bool is_body_error(int rc) {
  return rc == TXP_EMALFORMED || rc == TXP_EUNKNOWN_TYPE || rc == TXP_EFIELD_MISSING ||
         rc == TXP_EFIELD_TYPE || rc == TXP_EFIELD_TOO_LONG || rc == TXP_ELIMIT ||
         rc == TXP_EBAD_FLAGS;
}

static bool is_stream_error(int rc) {
  return rc == TXP_EBAD_MAGIC || rc == TXP_EBAD_VERSION || rc == TXP_EFRAME_TOO_BIG;
}

/* What txp_decoder_next/txp_decode_frame may leave in 'm' for 'rc'. */
static void check_result(int rc, const txp_msg_t *m) {
  CHECK(rc == 0 || is_body_error(rc) || is_stream_error(rc));
  if (rc == 0) {
    CHECK(txp_msg_type_valid(m->type));
    CHECK((m->flags & ~TXP_FLAGS_KNOWN) == 0);
    CHECK(m->ver_major == TXP_VERSION_MAJOR);
    CHECK((m->present & 1u) == 0 && (m->present >> TXP_F__MAX) == 0);
    for (size_t i = 0; i < NFIELDS; i++)
      if (fields[i].kind == K_STR && (m->present & TXP_FIELD_BIT(fields[i].key)))
        CHECK(field_str(m, i) != NULL);
  } else {
    /* header at most: no fields, nothing owned */
    CHECK(m->present == 0);
    CHECK(m->owned_ == NULL);
    for (size_t i = 0; i < NFIELDS; i++) {
      if (fields[i].kind == K_STR) CHECK(field_str(m, i) == NULL);
      else CHECK(field_int(m, i) == 0);
    }
  }
}

/* (c): encode 'm', decode it again, compare; re-encode, compare bytes. */
static void roundtrip(const txp_msg_t *m, const txp_limits_t *lim) {
  txp_buf_t b1, b2;
  txp_buf_init(&b1, 0);
  txp_buf_init(&b2, 0);
  /* The re-encoded body is never longer than the one received (the
   * encoder writes every value in its shortest form and drops unknown
   * keys), so it fits the same max_frame. */
  int rc = txp_encode(m, &b1, lim->max_frame);
  if (rc != 0) fprintf(stderr, "re-encode: %s\n", txp_errname(rc));
  CHECK(rc == 0);
  txp_msg_t m2;
  txp_msg_init(&m2, TXP_MSG_NONE);
  rc = txp_decode_frame(b1.data, b1.len, lim, &m2);
  if (rc != 0) fprintf(stderr, "re-decode: %s\n", txp_errname(rc));
  CHECK(rc == 0);
  CHECK(msg_equal(m, &m2));
  CHECK(m2.ver_major == TXP_VERSION_MAJOR && m2.ver_minor == TXP_VERSION_MINOR);
  CHECK(txp_encode(&m2, &b2, lim->max_frame) == 0);
  CHECK(b2.len == b1.len && memcmp(b1.data, b2.data, b1.len) == 0);
  txp_msg_clear(&m2);
  txp_buf_free(&b1);
  txp_buf_free(&b2);
}

/* ------------------------------------------------------------ (a) streams */

typedef struct {
  int rc;
  txp_msg_t m; /* owns its strings when rc == 0 */
} result_t;

typedef struct {
  result_t *v;
  size_t n, cap;
} results_t;

static void results_push(results_t *r, int rc, const txp_msg_t *m) {
  if (r->n == r->cap) {
    size_t c = r->cap ? r->cap * 2 : 16;
    result_t *p = realloc(r->v, c * sizeof(*p));
    CHECK(p != NULL);
    r->v = p;
    r->cap = c;
  }
  r->v[r->n].rc = rc;
  r->v[r->n].m = *m; /* takes ownership */
  r->n++;
}

static void results_free(results_t *r) {
  for (size_t i = 0; i < r->n; i++) txp_msg_clear(&r->v[i].m);
  free(r->v);
  memset(r, 0, sizeof(*r));
}

/* Take every message out; returns the stream error once it is hit. */
static int drain(txp_decoder_t *d, results_t *r, int poisoned) {
  for (;;) {
    txp_msg_t m;
    txp_msg_init(&m, TXP_MSG_NONE);
    int rc = txp_decoder_next(d, &m);
    if (rc == TXP_EAGAIN) {
      CHECK(!poisoned);
      txp_msg_clear(&m);
      return 0;
    }
    check_result(rc, &m);
    if (poisoned) { /* sticky: same error, nothing else */
      CHECK(rc == poisoned);
      txp_msg_clear(&m);
      return rc;
    }
    results_push(r, rc, &m);
    if (is_stream_error(rc)) return rc;
  }
}

/*
 * Feed data[0..size) in chunks: chunk sizes cycle through the first (up to)
 * four bytes of the input; 0 means an empty feed followed by one byte, 255
 * means everything left.  chunked == false: a single feed.
 */
static void run_stream(const uint8_t *data, size_t size, const txp_limits_t *lim, bool chunked,
                       results_t *r) {
  txp_decoder_t *d = txp_decoder_new(lim);
  CHECK(d != NULL);
  size_t nsz = size < 4 ? size : 4;
  size_t off = 0, j = 0;
  int poisoned = 0;
  /* a decoder that has seen nothing has nothing to give */
  poisoned = drain(d, r, poisoned);
  while (off < size) {
    size_t c = size - off;
    if (chunked) {
      c = data[j++ % nsz];
      if (c == 0) {
        CHECK(txp_decoder_feed(d, (const char *)data + off, 0) == 0);
        int p = drain(d, r, poisoned);
        if (!poisoned) poisoned = p;
        c = 1;
      } else if (c == 255) {
        c = size - off;
      }
      if (c > size - off) c = size - off;
    }
    CHECK(txp_decoder_feed(d, (const char *)data + off, c) == 0);
    off += c;
    int p = drain(d, r, poisoned);
    if (!poisoned) poisoned = p;
    CHECK(txp_decoder_buffered(d) <= size);
  }
  txp_decoder_free(d);
}

static void check_same_results(const results_t *a, const results_t *b) {
  CHECK(a->n == b->n);
  for (size_t i = 0; i < a->n; i++) {
    const result_t *x = &a->v[i], *y = &b->v[i];
    CHECK(x->rc == y->rc);
    CHECK(x->m.ver_major == y->m.ver_major && x->m.ver_minor == y->m.ver_minor);
    CHECK(msg_equal(&x->m, &y->m)); /* header-only results compare their headers */
  }
}

static void run_pass(const uint8_t *data, size_t size, const txp_limits_t *limits) {
  txp_limits_t lim;
  if (limits) lim = *limits;
  else txp_limits_default(&lim);

  /* (a) a chunked stream and a single feed give the same results */
  results_t chunked = {0}, whole = {0};
  bool streams = size <= TXP_DECODER_SLACK; /* else the decoder may say BUFFER_FULL */
  if (streams) {
    run_stream(data, size, limits, true, &chunked);
    run_stream(data, size, limits, false, &whole);
    check_same_results(&chunked, &whole);
  }

  /* (b) the one-shot decoder agrees with the stream */
  txp_msg_t m;
  txp_msg_init(&m, TXP_MSG_NONE);
  int rc = txp_decode_frame((const char *)data, size, limits, &m);
  if (rc != TXP_EAGAIN) check_result(rc, &m);
  if (streams) {
    if (rc == 0) {
      CHECK(whole.n == 1 && whole.v[0].rc == 0);
      CHECK(msg_equal(&m, &whole.v[0].m));
      CHECK(m.ver_minor == whole.v[0].m.ver_minor);
    } else if (rc == TXP_EAGAIN) {
      CHECK(whole.n == 0);
    } else if (whole.n > 0 && whole.v[0].rc == 0) {
      CHECK(rc == TXP_EMALFORMED && whole.n >= 1); /* a frame, then trailing bytes */
    } else {
      CHECK(whole.n >= 1 && whole.v[0].rc == rc);
      CHECK(msg_equal(&m, &whole.v[0].m));
    }
  }

  /* (c) everything decoded survives a round trip */
  if (rc == 0) roundtrip(&m, &lim);
  txp_msg_clear(&m);
  for (size_t i = 0; i < whole.n; i++)
    if (whole.v[i].rc == 0) roundtrip(&whole.v[i].m, &lim);

  results_free(&chunked);
  results_free(&whole);
}

/* txp_mpcheck accepting the bytes means msgpack-c can parse them as exactly
 * one object (and, having passed the check, without a large allocation). */
static void check_mpcheck_vs_msgpack(const uint8_t *data, size_t size) {
  int rc = txp_mpcheck(data, size, UINT32_MAX, 32, UINT32_MAX);
  CHECK(rc == 0 || rc == TXP_EMALFORMED || rc == TXP_ELIMIT);
  if (rc != 0) return;
  msgpack_unpacked up;
  msgpack_unpacked_init(&up);
  size_t off = 0;
  msgpack_unpack_return ur = msgpack_unpack_next(&up, (const char *)data, size, &off);
  if (ur != MSGPACK_UNPACK_SUCCESS || off != size)
    fprintf(stderr, "mpcheck ok but msgpack-c: %d, off %zu of %zu\n", (int)ur, off, size);
  CHECK(ur == MSGPACK_UNPACK_SUCCESS && off == size);
  msgpack_unpacked_destroy(&up);
  /* tighter limits can only refuse more */
  rc = txp_mpcheck(data, size, 8, 3, 64);
  CHECK(rc == 0 || rc == TXP_ELIMIT);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static const txp_limits_t small = {4096, 4096, 8, 3};
  run_pass(data, size, &small);
  run_pass(data, size, NULL);
  check_mpcheck_vs_msgpack(data, size);
  /* the body part of a would-be frame, too */
  if (size > TXP_HEADER_SIZE) check_mpcheck_vs_msgpack(data + TXP_HEADER_SIZE, size - TXP_HEADER_SIZE);
  return 0;
}
