/*
 * rm_prefilter_keys.c - pure helpers of the Redis prefilter (see
 * rm_prefilter_keys.h): URL, keys, codes, freeze records, reply parsing.
 *
 * NOTES
 *   Nothing here does I/O or keeps state, so every function is safe from
 *   any thread.  Replies are hiredis's redisReply trees, borrowed.
 */
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rm_prefilter_keys.h"

/* ---------------------------------------------------------------- URL --- */

static int parse_uint(const char *s, size_t len, long max, long *out) {
  long v = 0;
  if (len == 0 || len > 9) return -1;
  for (size_t i = 0; i < len; i++) {
    if (s[i] < '0' || s[i] > '9') return -1;
    v = v * 10 + (s[i] - '0');
  }
  if (v > max) return -1;
  *out = v;
  return 0;
}

/* One "host[:port]" or "[v6][:port]" in [p, end): 0 or -1. */
static int parse_hostport(const char *p, const char *end, int defport, rm_pf_hostport_t *out) {
  const char *hend;
  long v;
  out->port = defport;
  if (p < end && *p == '[') {
    const char *rb = memchr(p, ']', (size_t)(end - p));
    if (!rb || rb == p + 1) return -1;
    if ((size_t)(rb - p - 1) >= sizeof(out->host)) return -1;
    memcpy(out->host, p + 1, (size_t)(rb - p - 1));
    out->host[rb - p - 1] = '\0';
    hend = rb + 1;
    if (hend < end && *hend != ':') return -1;
  } else {
    hend = p;
    while (hend < end && *hend != ':') hend++;
    if (hend == p || (size_t)(hend - p) >= sizeof(out->host)) return -1;
    memcpy(out->host, p, (size_t)(hend - p));
    out->host[hend - p] = '\0';
    for (const char *q = out->host; *q; q++)
      if (*q == '[' || *q == ']' || *q == '@' || *q == ',') return -1;
  }
  if (hend < end) { /* ":port" */
    if (parse_uint(hend + 1, (size_t)(end - hend - 1), 65535, &v) != 0 || v == 0) return -1;
    out->port = (int)v;
  }
  return 0;
}

int rm__pf_url_parse(const char *url, rm_pf_url_t *out) {
  static const char scheme[] = "redis://", sscheme[] = "redis+sentinel://";
  const char *p, *end, *at, *slash;
  bool sentinel;
  long v;
  if (!url || !out) return -1;
  memset(out, 0, sizeof(*out));
  out->port = 6379;
  if (strncmp(url, scheme, sizeof(scheme) - 1) == 0) {
    sentinel = false;
    p = url + sizeof(scheme) - 1;
  } else if (strncmp(url, sscheme, sizeof(sscheme) - 1) == 0) {
    sentinel = true;
    p = url + sizeof(sscheme) - 1;
  } else {
    return -1;
  }
  end = p + strlen(p);
  for (const char *q = p; q < end; q++)
    if ((unsigned char)*q <= ' ' || *q == 0x7f) return -1;

  /* Authority ends at the first '/'. */
  slash = memchr(p, '/', (size_t)(end - p));
  if (!slash) slash = end;
  at = NULL;
  for (const char *q = p; q < slash; q++)
    if (*q == '@') at = q; /* the last '@': a password may hold one */
  if (at) {
    size_t plen;
    if (*p != ':') return -1; /* "user:pass@" (ACL user) not supported */
    plen = (size_t)(at - p - 1);
    if (plen == 0 || plen >= sizeof(out->password)) return -1;
    memcpy(out->password, p + 1, plen);
    out->password[plen] = '\0';
    out->has_password = true;
    p = at + 1;
  }

  if (!sentinel) {
    rm_pf_hostport_t hp;
    if (parse_hostport(p, slash, 6379, &hp) != 0) return -1;
    memcpy(out->host, hp.host, sizeof(out->host));
    out->port = hp.port;
    if (slash < end && slash + 1 < end) { /* "/db", or a lone "/" */
      if (parse_uint(slash + 1, (size_t)(end - slash - 1), 1000000, &v) != 0) return -1;
      out->db = (int)v;
    }
    return 0;
  }

  /* Sentinels "h1[:p1],h2[:p2]...", then "/name[/db]". */
  while (p < slash) {
    const char *comma = memchr(p, ',', (size_t)(slash - p));
    if (!comma) comma = slash;
    if (out->nsentinels >= RM_PF_SENTINELS_MAX) return -1;
    if (parse_hostport(p, comma, RM_PF_SENTINEL_PORT, &out->sentinel[out->nsentinels]) != 0) return -1;
    out->nsentinels++;
    p = comma < slash ? comma + 1 : slash;
    if (comma < slash && p == slash) return -1; /* trailing ',' */
  }
  if (out->nsentinels == 0 || slash >= end) return -1;
  {
    const char *name = slash + 1, *nend = memchr(name, '/', (size_t)(end - name));
    if (!nend) nend = end;
    if (nend == name || (size_t)(nend - name) >= sizeof(out->master_name)) return -1;
    for (const char *q = name; q < nend; q++)
      if (!((*q >= 'a' && *q <= 'z') || (*q >= 'A' && *q <= 'Z') || (*q >= '0' && *q <= '9') || *q == '_' ||
            *q == '.' || *q == '-'))
        return -1;
    memcpy(out->master_name, name, (size_t)(nend - name));
    out->master_name[nend - name] = '\0';
    if (nend < end && nend + 1 < end) {
      if (parse_uint(nend + 1, (size_t)(end - nend - 1), 1000000, &v) != 0) return -1;
      out->db = (int)v;
    }
  }
  return 0;
}

/* --------------------------------------------------------------- keys --- */

/* Append 's' at 'p'; returns the new end. */
static char *put(char *p, const char *s, size_t n) {
  memcpy(p, s, n);
  return p + n;
}

/* Every call builds these keys: plain copies instead of snprintf keep this
 * off the profile (it runs once per prefilter call on the caller's thread). */
int rm__pf_keys_build(rm_pf_keys_t *ks, int64_t activity, int32_t tt) {
  static const char *const suffix[RM_PF_K__COUNT] = {
    [RM_PF_K_META] = "meta",     [RM_PF_K_STOCK] = "stock", [RM_PF_K_BOUGHT] = "bought",
    [RM_PF_K_ORDERS] = "orders", [RM_PF_K_EXPIRY] = "expiry", [RM_PF_K_WL] = "wl",
    [RM_PF_K_WLQ] = "wlq",       [RM_PF_K_WLSEQ] = "wlseq", [RM_PF_K_QUEUE] = "queue",
  };
  char tag[40], tts[16];
  size_t tag_len, tt_len;
  char *p;
  if (!ks || !rm__pf_id_ok(activity) || !rm__pf_tt_ok(tt)) return -1;
  /* "{act_<A>}:" and "t<T>:" (at most 26 and 12 bytes). */
  p = put(tag, "{act_", 5);
  p += rm__pf_i64_str(p, activity);
  p = put(p, "}:", 2);
  tag_len = (size_t)(p - tag);
  tts[0] = 't';
  tt_len = 1 + rm__pf_i64_str(tts + 1, tt);
  tts[tt_len++] = ':';
  for (int i = 0; i < RM_PF_K__COUNT; i++) {
    bool per_tt = i != RM_PF_K_META && i != RM_PF_K_BOUGHT && i != RM_PF_K_ORDERS && i != RM_PF_K_QUEUE;
    size_t sl = strlen(suffix[i]);
    /* Sized for the maxima: 26 + 12 + 6 + 1 < RM_PF_KEY_MAX. */
    p = put(ks->k[i], tag, tag_len);
    if (per_tt) p = put(p, tts, tt_len);
    p = put(p, suffix[i], sl);
    *p = '\0';
  }
  return 0;
}

/* ------------------------------------------------------------ scripts --- */

static const char *const script_names[RM_PF_S__COUNT] = {
  [RM_PF_S_FREEZE] = "freeze",
  [RM_PF_S_CONFIRM] = "confirm",
  [RM_PF_S_RELEASE] = "release",
  [RM_PF_S_EXPIRE] = "expire",
  [RM_PF_S_WAITLIST_JOIN] = "waitlist_join",
  [RM_PF_S_WAITLIST_FILL] = "waitlist_fill",
  [RM_PF_S_STOCK_ADD] = "stock_add",
  [RM_PF_S_HOLD] = "hold",
};

const char *rm__pf_script_name(int script) {
  if (script < 0 || script >= RM_PF_S__COUNT) return NULL;
  return script_names[script];
}

int rm__pf_script_index(const char *name) {
  if (!name) return -1;
  for (int i = 0; i < RM_PF_S__COUNT; i++)
    if (strcmp(name, script_names[i]) == 0) return i;
  return -1;
}

/* ----------------------------------------------------- codes, numbers --- */

int rm__pf_code_from_lua(long long v) {
  if (v >= 0) return v > INT_MAX ? INT_MAX : (int)v;
  if (v >= -8) return (int)(-10400 + v);
  return RM_PF_E_REPLY;
}

int rm__pf_parse_i64(const char *s, size_t len, int64_t *out) {
  bool neg = false;
  uint64_t v = 0, lim;
  size_t i = 0;
  if (!s || len == 0) return -1;
  if (s[0] == '-') {
    neg = true;
    i = 1;
    if (len == 1) return -1;
  }
  lim = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
  for (; i < len; i++) {
    unsigned d;
    if (s[i] < '0' || s[i] > '9') return -1;
    d = (unsigned)(s[i] - '0');
    if (v > (lim - d) / 10) return -1;
    v = v * 10 + d;
  }
  if (neg)
    *out = v == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)v;
  else
    *out = (int64_t)v;
  return 0;
}

size_t rm__pf_i64_str(char *buf, int64_t v) {
  char tmp[24];
  size_t n = 0, len = 0;
  uint64_t u = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
  do {
    tmp[n++] = (char)('0' + u % 10);
    u /= 10;
  } while (u);
  if (v < 0) buf[len++] = '-';
  while (n) buf[len++] = tmp[--n];
  buf[len] = '\0';
  return len;
}

/* ------------------------------------------------------ freeze record --- */

int rm__pf_rec_format(char *buf, size_t cap, const rm_pf_rec_t *r) {
  int n;
  if (!buf || !r) return -1;
  if ((r->state != 'F' && r->state != 'C' && r->state != 'R') || r->tt < 0 || r->bucket < 0 ||
      !rm__pf_qty_ok(r->qty) || !rm__pf_id_ok(r->user))
    return -1;
  n = snprintf(buf, cap, "%c:%" PRId32 ":%" PRId32 ":%" PRId32 ":%" PRId64, r->state, r->tt,
               r->bucket, r->qty, r->user);
  if (n < 0 || (size_t)n >= cap) return -1;
  return n;
}

/* The next ':'-separated decimal field of [*p, end) in canonical form (no
 * sign, no leading zero unless "0"). */
static int rec_field(const char **p, const char *end, bool last, int64_t *v) {
  const char *q = *p;
  while (q < end && *q != ':') q++;
  if (last != (q == end)) return -1;
  if (q == *p || (q - *p > 1 && **p == '0') || **p == '-') return -1;
  if (rm__pf_parse_i64(*p, (size_t)(q - *p), v) != 0) return -1;
  *p = q < end ? q + 1 : q;
  return 0;
}

int rm__pf_rec_parse(const char *s, size_t len, rm_pf_rec_t *r) {
  const char *p, *end;
  int64_t tt, b, q, u;
  if (!s || !r || len < 10) return -1;
  if ((s[0] != 'F' && s[0] != 'C' && s[0] != 'R') || s[1] != ':') return -1;
  p = s + 2;
  end = s + len;
  if (rec_field(&p, end, false, &tt) != 0 || rec_field(&p, end, false, &b) != 0 ||
      rec_field(&p, end, false, &q) != 0 || rec_field(&p, end, true, &u) != 0)
    return -1;
  if (tt > INT32_MAX || b > INT32_MAX || q < 1 || q > RM_PF_MAX_QTY || u < 1) return -1;
  r->state = s[0];
  r->tt = (int32_t)tt;
  r->bucket = (int32_t)b;
  r->qty = (int32_t)q;
  r->user = u;
  return 0;
}

/* ------------------------------------------------------------ replies --- */

static int reply_error(const redisReply *r, char *err, size_t errlen) {
  if (err && errlen) snprintf(err, errlen, "%.*s", (int)(r->len > 200 ? 200 : r->len), r->str);
  return RM_PF_E_REDIS;
}

int rm__pf_reply_int(const redisReply *r, long long *v, char *err, size_t errlen) {
  if (!r) return RM_PF_E_REPLY;
  if (r->type == REDIS_REPLY_ERROR) return reply_error(r, err, errlen);
  if (r->type != REDIS_REPLY_INTEGER) return RM_PF_E_REPLY;
  *v = r->integer;
  return 0;
}

int rm__pf_parse_join(const redisReply *r, long *position, char *err, size_t errlen) {
  if (!r) return RM_PF_E_REPLY;
  if (r->type == REDIS_REPLY_ERROR) return reply_error(r, err, errlen);
  if (r->type == REDIS_REPLY_INTEGER) {
    int code = rm__pf_code_from_lua(r->integer);
    return code >= 0 ? RM_PF_E_REPLY : code;
  }
  if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
      r->element[0]->type != REDIS_REPLY_INTEGER || r->element[1]->type != REDIS_REPLY_INTEGER ||
      (r->element[0]->integer != 0 && r->element[0]->integer != 1) || r->element[1]->integer < 0 ||
      r->element[1]->integer > LONG_MAX)
    return RM_PF_E_REPLY;
  if (position) *position = (long)r->element[1]->integer;
  return r->element[0]->integer == 1 ? 0 : RM_PF_ALREADY_WAITING;
}

/* An id element: a string (or integer) holding a decimal int64. */
static int elem_i64(const redisReply *e, int64_t *v) {
  if (e->type == REDIS_REPLY_INTEGER) {
    *v = e->integer;
    return 0;
  }
  if (e->type != REDIS_REPLY_STRING) return -1;
  return rm__pf_parse_i64(e->str, e->len, v);
}

/* One 4-tuple of a fill or expire reply: two ids, then two integers. */
typedef struct reply_quad {
  int64_t id[2];
  long long qty, bucket;
} reply_quad_t;

/* Checks quad 'q' and stores what it says as entry 'i' of 'out';
 * RM_PF_E_REPLY when it is out of range. */
typedef int (*quad_store_fn)(const reply_quad_t *q, void *out, size_t i);

/* Common shape of fill and expire replies: an array of 4-tuples
 * (id, id, integer, integer), each given to 'store', or an integer code.
 * '*n' counts the entries stored, 0 unless all of them were. */
static int parse_quads(const redisReply *r, size_t cap, size_t *n, char *err, size_t errlen, quad_store_fn store,
                       void *out) {
  *n = 0;
  if (!r) return RM_PF_E_REPLY;
  if (r->type == REDIS_REPLY_ERROR) return reply_error(r, err, errlen);
  if (r->type == REDIS_REPLY_INTEGER) {
    int code = rm__pf_code_from_lua(r->integer);
    return code >= 0 ? RM_PF_E_REPLY : code;
  }
  if (r->type != REDIS_REPLY_ARRAY || r->elements % 4 != 0 || r->elements / 4 > cap)
    return RM_PF_E_REPLY;
  for (size_t i = 0; i < r->elements; i += 4)
    if (r->element[i + 2]->type != REDIS_REPLY_INTEGER ||
        r->element[i + 3]->type != REDIS_REPLY_INTEGER)
      return RM_PF_E_REPLY;
  for (size_t i = 0; i < r->elements / 4; i++) {
    const redisReply *const *e = (const redisReply *const *)r->element + 4 * i;
    reply_quad_t q = {.qty = e[2]->integer, .bucket = e[3]->integer};
    if (elem_i64(e[0], &q.id[0]) != 0 || elem_i64(e[1], &q.id[1]) != 0 || store(&q, out, i) != 0)
      return RM_PF_E_REPLY;
  }
  *n = r->elements / 4;
  return 0;
}

/* A fill quad: (user, order, qty, bucket), the bucket -2 or -4 (a code)
 * when the user got nothing. */
static int store_fill(const reply_quad_t *q, void *out, size_t i) {
  rm_pf_fill_t f = {.user_id = q->id[0], .order_id = q->id[1]};
  if (f.user_id < 1 || f.order_id < 0 || q->qty < 0 || q->qty > RM_PF_MAX_QTY || q->bucket > INT32_MAX)
    return RM_PF_E_REPLY;
  f.qty = (int32_t)q->qty;
  if (q->bucket >= 0) {
    if (f.order_id < 1) return RM_PF_E_REPLY;
    f.bucket = (int32_t)q->bucket;
    f.code = 0;
  } else {
    if (q->bucket != -2 && q->bucket != -4) return RM_PF_E_REPLY;
    f.bucket = -1;
    f.code = rm__pf_code_from_lua(q->bucket);
  }
  ((rm_pf_fill_t *)out)[i] = f;
  return 0;
}

int rm__pf_parse_fill(const redisReply *r, rm_pf_fill_t *out, size_t cap, size_t *n, char *err,
                      size_t errlen) {
  return parse_quads(r, cap, n, err, errlen, store_fill, out);
}

/* An expire quad: (order, user, qty, bucket). */
static int store_expired(const reply_quad_t *q, void *out, size_t i) {
  rm_pf_expired_t x = {.order_id = q->id[0], .user_id = q->id[1]};
  if (x.order_id < 1 || x.user_id < 1 || q->qty < 1 || q->qty > RM_PF_MAX_QTY || q->bucket < 0 ||
      q->bucket > INT32_MAX)
    return RM_PF_E_REPLY;
  x.qty = (int32_t)q->qty;
  x.bucket = (int32_t)q->bucket;
  ((rm_pf_expired_t *)out)[i] = x;
  return 0;
}

int rm__pf_parse_expired(const redisReply *r, rm_pf_expired_t *out, size_t cap, size_t *n,
                         char *err, size_t errlen) {
  return parse_quads(r, cap, n, err, errlen, store_expired, out);
}

/* ------------------------------------------------------------ backoff --- */

unsigned rm__pf_backoff_ms(unsigned failures, unsigned min_ms, unsigned max_ms) {
  unsigned d = min_ms ? min_ms : 1;
  if (failures == 0) return 0;
  for (unsigned i = 1; i < failures && d < max_ms; i++) d = d > max_ms / 2 ? max_ms : d * 2;
  return d > max_ms ? max_ms : d;
}
