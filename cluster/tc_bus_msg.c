/*
 * tc_bus_msg.c - see tc_bus_msg.h.
 */
#include "tc_bus_msg.h"

#include <string.h>

/* ------------------------------------------------------------- reading */

typedef struct {
  const uint8_t *p, *end;
  bool bad;
} rd_t;

static bool rd_need(rd_t *r, size_t n) {
  if (r->bad || (size_t)(r->end - r->p) < n) {
    r->bad = true;
    return false;
  }
  return true;
}

static uint8_t rd_u8(rd_t *r) { return rd_need(r, 1) ? *r->p++ : 0; }

static uint16_t rd_u16(rd_t *r) {
  if (!rd_need(r, 2)) return 0;
  uint16_t v = (uint16_t)((r->p[0] << 8) | r->p[1]);
  r->p += 2;
  return v;
}

static uint32_t rd_u32(rd_t *r) {
  if (!rd_need(r, 4)) return 0;
  uint32_t v = ((uint32_t)r->p[0] << 24) | ((uint32_t)r->p[1] << 16) | ((uint32_t)r->p[2] << 8) | r->p[3];
  r->p += 4;
  return v;
}

static uint64_t rd_u64(rd_t *r) {
  uint64_t hi = rd_u32(r);
  return (hi << 32) | rd_u32(r);
}

/* A string of 'n' bytes into 'dst' (NUL-terminated); refuses NUL bytes and
 * strings longer than 'max'. */
static void rd_str(rd_t *r, size_t n, char *dst, size_t max) {
  if (n > max || !rd_need(r, n) || memchr(r->p, '\0', n)) {
    r->bad = true;
    if (max) dst[0] = '\0';
    return;
  }
  memcpy(dst, r->p, n);
  dst[n] = '\0';
  r->p += n;
}

static const uint8_t *rd_bytes(rd_t *r, size_t n) {
  if (!rd_need(r, n)) return NULL;
  const uint8_t *p = r->p;
  r->p += n;
  return p;
}

/* A reader of the payload of 'h', bad from the start unless 'h' is a
 * message of 'kind'. */
static rd_t rd_payload(const tc_bus_hdr_t *h, int kind) {
  if (h->kind != kind) return (rd_t){.bad = true};
  return (rd_t){h->payload, h->payload + h->payload_len, false};
}

/* The target node and the forward id that open a forward and its result. */
static void rd_forward_head(rd_t *r, uint16_t *target, uint64_t *id) {
  *target = rd_u16(r);
  *id = rd_u64(r);
}

/* The length-prefixed frame that ends a forward and its result. */
static const uint8_t *rd_frame(rd_t *r, uint32_t *len) {
  *len = rd_u32(r);
  return rd_bytes(r, *len);
}

/* A payload parses only if it is consumed exactly. */
static int rd_done(const rd_t *r) { return r->bad || r->p != r->end ? TXP_EMALFORMED : 0; }

int tc_bus_parse_header(const void *buf, size_t len, tc_bus_hdr_t *out) {
  memset(out, 0, sizeof(*out));
  if (!buf || len < TC_BUS_HEADER_SIZE + TC_BUS_TRAILER_SIZE || len > TC_BUS_MAX_MSG) return TXP_EMALFORMED;
  if (memcmp(buf, TC_BUS_MAGIC, 4) != 0) return TXP_EMALFORMED;
  rd_t r = {(const uint8_t *)buf + 4, (const uint8_t *)buf + len, false};
  out->kind = rd_u8(&r);
  out->flags = rd_u8(&r);
  out->from = rd_u16(&r);
  out->incarnation = rd_u32(&r);
  out->payload_len = rd_u32(&r);
  out->seq = rd_u64(&r);
  out->sent_ms = rd_u64(&r);
  out->payload = r.p;
  if (r.bad || len - TC_BUS_HEADER_SIZE < TC_BUS_TRAILER_SIZE ||
      out->payload_len != len - TC_BUS_HEADER_SIZE - TC_BUS_TRAILER_SIZE)
    return TXP_EMALFORMED;
  if (out->seq == 0) return TXP_EMALFORMED;
  if (out->kind < TC_BUS_HELLO || out->kind > TC_BUS_FORWARD_RESULT) return TXP_EMALFORMED;
  if (out->from == 0 || out->from > 1023) return TXP_EMALFORMED;
  return 0;
}

int tc_bus_parse_hello(const tc_bus_hdr_t *h, char *addr, size_t addrlen) {
  rd_t r = rd_payload(h, TC_BUS_HELLO);
  if (r.bad || addrlen < TC_BUS_MAX_ADDR + 1) return TXP_EMALFORMED;
  rd_str(&r, rd_u8(&r), addr, TC_BUS_MAX_ADDR);
  return rd_done(&r);
}

int tc_bus_parse_forward(const tc_bus_hdr_t *h, tc_bus_forward_msg_t *out) {
  memset(out, 0, sizeof(*out));
  rd_t r = rd_payload(h, TC_BUS_FORWARD);
  rd_forward_head(&r, &out->target, &out->id);
  out->timeout_ms = rd_u32(&r);
  rd_str(&r, rd_u8(&r), out->client_id, TXP_MAX_NAME_LEN);
  out->frame = rd_frame(&r, &out->frame_len);
  if (rd_done(&r) != 0 || out->frame_len == 0) return TXP_EMALFORMED;
  return 0;
}

int tc_bus_parse_result(const tc_bus_hdr_t *h, tc_bus_result_msg_t *out) {
  memset(out, 0, sizeof(*out));
  rd_t r = rd_payload(h, TC_BUS_FORWARD_RESULT);
  rd_forward_head(&r, &out->target, &out->id);
  out->outcome = rd_u8(&r);
  uint8_t xl = rd_u8(&r);
  if (xl == 0) r.bad = true;
  rd_str(&r, xl, out->xid, TXP_MAX_XID_LEN);
  out->branch_id = (int64_t)rd_u64(&r);
  out->frame = rd_frame(&r, &out->frame_len);
  if (rd_done(&r) != 0 || out->outcome > TC_BUS_FAILED) return TXP_EMALFORMED;
  if ((out->outcome == TC_BUS_ANSWERED) != (out->frame_len > 0)) return TXP_EMALFORMED;
  return 0;
}

int tc_bus_each_released(const tc_bus_hdr_t *h, void (*fn)(const char *xid, void *arg), void *arg) {
  char xid[TXP_MAX_XID_LEN + 1];
  /* First pass: validate everything, so that nothing is applied from a
   * message that turns out to be malformed. */
  rd_t r = rd_payload(h, TC_BUS_RELEASED);
  uint16_t n = rd_u16(&r);
  for (uint16_t i = 0; i < n && !r.bad; i++) {
    uint8_t len = rd_u8(&r);
    if (len == 0) r.bad = true;
    rd_str(&r, len, xid, TXP_MAX_XID_LEN);
  }
  if (rd_done(&r) != 0) return TXP_EMALFORMED;
  r = rd_payload(h, TC_BUS_RELEASED);
  n = rd_u16(&r);
  for (uint16_t i = 0; i < n; i++) {
    rd_str(&r, rd_u8(&r), xid, TXP_MAX_XID_LEN);
    fn(xid, arg);
  }
  return n;
}

/* ------------------------------------------------------------- writing */

static int put_u8(txp_buf_t *b, uint8_t v) { return txp_buf_append(b, &v, 1); }

static int put_u16(txp_buf_t *b, uint16_t v) {
  uint8_t x[2] = {(uint8_t)(v >> 8), (uint8_t)v};
  return txp_buf_append(b, x, 2);
}

static int put_u32(txp_buf_t *b, uint32_t v) {
  uint8_t x[4] = {(uint8_t)(v >> 24), (uint8_t)(v >> 16), (uint8_t)(v >> 8), (uint8_t)v};
  return txp_buf_append(b, x, 4);
}

static int put_u64(txp_buf_t *b, uint64_t v) {
  int rc = put_u32(b, (uint32_t)(v >> 32));
  return rc ? rc : put_u32(b, (uint32_t)v);
}

static void patch_u32(txp_buf_t *b, size_t at, uint32_t v) {
  uint8_t *p = (uint8_t *)b->data + at;
  p[0] = (uint8_t)(v >> 24);
  p[1] = (uint8_t)(v >> 16);
  p[2] = (uint8_t)(v >> 8);
  p[3] = (uint8_t)v;
}

static int put_str8(txp_buf_t *b, const char *s, size_t max) {
  size_t n = s ? strlen(s) : 0;
  if (n > max || n > 255) return TXP_EFIELD_TOO_LONG;
  int rc = put_u8(b, (uint8_t)n);
  return rc || !n ? rc : txp_buf_append(b, s, n);
}

/* Header with a zero payload length, patched by finish(); seq and sent_ms
 * zero, written by tc_bus_seal(). */
static int put_header(txp_buf_t *b, int kind, uint8_t flags, uint16_t from, uint32_t inc) {
  int rc = txp_buf_append(b, TC_BUS_MAGIC, 4);
  if (!rc) rc = put_u8(b, (uint8_t)kind);
  if (!rc) rc = put_u8(b, flags);
  if (!rc) rc = put_u16(b, from);
  if (!rc) rc = put_u32(b, inc);
  if (!rc) rc = put_u32(b, 0);
  if (!rc) rc = put_u64(b, 0);
  if (!rc) rc = put_u64(b, 0);
  return rc;
}

/* Patch the payload length of the message that starts at 'start', or undo
 * it when 'rc' says it failed. */
static int finish(txp_buf_t *b, size_t start, int rc) {
  if (rc == 0 && b->len - start > TC_BUS_MAX_MSG - TC_BUS_TRAILER_SIZE)
    rc = TXP_EFRAME_TOO_BIG;
  if (rc != 0) {
    b->len = start;
    if (b->data) b->data[start] = '\0';
    return rc;
  }
  patch_u32(b, start + 12, (uint32_t)(b->len - start - TC_BUS_HEADER_SIZE));
  return 0;
}

int tc_bus_write_hello(txp_buf_t *out, uint16_t from, uint32_t inc, uint8_t flags, const char *addr) {
  size_t start = out->len;
  int rc = put_header(out, TC_BUS_HELLO, flags, from, inc);
  if (!rc) rc = put_str8(out, addr, TC_BUS_MAX_ADDR);
  return finish(out, start, rc);
}

int tc_bus_write_forward(txp_buf_t *out, uint16_t from, uint32_t inc, const tc_bus_forward_msg_t *f) {
  size_t start = out->len;
  int rc = f->frame_len ? put_header(out, TC_BUS_FORWARD, 0, from, inc) : TXP_EINVALID_ARG;
  if (!rc) rc = put_u16(out, f->target);
  if (!rc) rc = put_u64(out, f->id);
  if (!rc) rc = put_u32(out, f->timeout_ms);
  if (!rc) rc = put_str8(out, f->client_id, TXP_MAX_NAME_LEN);
  if (!rc) rc = put_u32(out, f->frame_len);
  if (!rc) rc = txp_buf_append(out, f->frame, f->frame_len);
  return finish(out, start, rc);
}

int tc_bus_write_result(txp_buf_t *out, uint16_t from, uint32_t inc, const tc_bus_result_msg_t *r) {
  size_t start = out->len;
  bool answered = r->outcome == TC_BUS_ANSWERED;
  int rc = r->outcome <= TC_BUS_FAILED && answered == (r->frame_len > 0)
             ? put_header(out, TC_BUS_FORWARD_RESULT, 0, from, inc)
             : TXP_EINVALID_ARG;
  if (!rc) rc = put_u16(out, r->target);
  if (!rc) rc = put_u64(out, r->id);
  if (!rc) rc = put_u8(out, r->outcome);
  if (!rc) rc = r->xid[0] ? put_str8(out, r->xid, TXP_MAX_XID_LEN) : TXP_EINVALID_ARG;
  if (!rc) rc = put_u64(out, (uint64_t)r->branch_id);
  if (!rc) rc = put_u32(out, r->frame_len);
  if (!rc && r->frame_len) rc = txp_buf_append(out, r->frame, r->frame_len);
  return finish(out, start, rc);
}

int tc_bus_released_begin(tc_bus_released_writer_t *w, txp_buf_t *out, uint16_t from, uint32_t inc,
                          size_t max_bytes) {
  w->out = out;
  w->start = out->len;
  w->count = 0;
  /* The MAC comes after what the limit counts. */
  size_t most = TC_BUS_MAX_MSG - TC_BUS_TRAILER_SIZE;
  w->max_bytes = max_bytes && max_bytes < most ? max_bytes : most;
  int rc = put_header(out, TC_BUS_RELEASED, 0, from, inc);
  if (!rc) rc = put_u16(out, 0);
  if (rc) finish(out, w->start, rc);
  return rc;
}

int tc_bus_released_add(tc_bus_released_writer_t *w, const char *xid) {
  size_t n = xid ? strlen(xid) : 0;
  if (n == 0 || n > TXP_MAX_XID_LEN) return TXP_EINVALID_ARG;
  if (w->count == UINT16_MAX || w->out->len - w->start + 1 + n > w->max_bytes) return TXP_EBUFFER_FULL;
  size_t before = w->out->len;
  int rc = put_str8(w->out, xid, TXP_MAX_XID_LEN);
  if (rc) {
    w->out->len = before;
    return rc;
  }
  w->count++;
  return 0;
}

void tc_bus_released_end(tc_bus_released_writer_t *w) {
  uint8_t *p = (uint8_t *)w->out->data + w->start + TC_BUS_HEADER_SIZE;
  p[0] = (uint8_t)(w->count >> 8);
  p[1] = (uint8_t)w->count;
  patch_u32(w->out, w->start + 12, (uint32_t)(w->out->len - w->start - TC_BUS_HEADER_SIZE));
}

const char *tc_bus_kind_name(int kind) {
  switch (kind) {
  case TC_BUS_HELLO: return "hello";
  case TC_BUS_RELEASED: return "released";
  case TC_BUS_FORWARD: return "forward";
  case TC_BUS_FORWARD_RESULT: return "forward-result";
  default: return "unknown";
  }
}
