/*
 * test_prefilter_keys.c - the Redis prefilter's pure helpers
 * (rm_prefilter_keys.h), the embedded script table, and the self-connected
 * socket check of rm_prefilter_conn.h.
 *
 * NOTES
 *   No server: the self-connection check uses loopback sockets of its own.  Replies are built the way hiredis builds them: RESP bytes
 *   fed to a redisReader, whole, one byte at a time, and followed by
 *   garbage, so the parsers are checked on exactly what a connection
 *   hands them (after hiredis's test_reply_reader).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "rm_prefilter_conn.h"
#include "rm_prefilter_keys.h"
#include "rm_prefilter_lua.h"

/* ------------------------------------------------------------ helpers --- */

/* Parse one reply out of 'resp', fed in pieces of 'step' bytes (0: all). */
static redisReply *reply_of(const char *resp, size_t step) {
  redisReader *rd = redisReaderCreate();
  void *out = NULL;
  size_t len = strlen(resp), off = 0;
  assert_non_null(rd);
  if (step == 0) step = len;
  while (!out && off < len) {
    size_t n = len - off < step ? len - off : step;
    assert_int_equal(redisReaderFeed(rd, resp + off, n), REDIS_OK);
    off += n;
    assert_int_equal(redisReaderGetReply(rd, &out), REDIS_OK);
  }
  redisReaderFree(rd);
  assert_non_null(out);
  return out;
}

/* ---------------------------------------------------------------- URL --- */

static void test_url_ok(void **state) {
  (void)state;
  rm_pf_url_t u;
  assert_int_equal(rm__pf_url_parse("redis://127.0.0.1:6380", &u), 0);
  assert_string_equal(u.host, "127.0.0.1");
  assert_int_equal(u.port, 6380);
  assert_false(u.has_password);
  assert_int_equal(u.db, 0);
  assert_int_equal(rm__pf_url_parse("redis://cache.example", &u), 0);
  assert_string_equal(u.host, "cache.example");
  assert_int_equal(u.port, 6379);
  assert_int_equal(rm__pf_url_parse("redis://:s3cr@t@[::1]:7000/5", &u), 0);
  assert_string_equal(u.host, "::1");
  assert_int_equal(u.port, 7000);
  assert_true(u.has_password);
  assert_string_equal(u.password, "s3cr@t");
  assert_int_equal(u.db, 5);
  assert_int_equal(rm__pf_url_parse("redis://h/", &u), 0);
  assert_int_equal(u.db, 0);
  assert_int_equal(rm__pf_url_parse("redis://[fe80::1]", &u), 0);
  assert_string_equal(u.host, "fe80::1");
  assert_int_equal(u.port, 6379);
}

static void test_url_bad(void **state) {
  (void)state;
  static const char *const bad[] = {
    "", "127.0.0.1:6379", "http://h:1", "redis://", "redis://:6379", "redis://h:0",
    "redis://h:65536", "redis://h:12x", "redis://h:-1", "redis://user:pw@h", "redis://:@h",
    "redis://h /1", "redis://h:1/x", "redis://h:1/-1", "redis://[::1", "redis://[]:1",
    "redis://[::1]x", "redis://h:1/99999999", "redis://h\n", "rediss://h",
  };
  rm_pf_url_t u;
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
    if (rm__pf_url_parse(bad[i], &u) != -1) fail_msg("accepted \"%s\"", bad[i]);
  assert_int_equal(rm__pf_url_parse(NULL, &u), -1);
  char longhost[400] = "redis://";
  memset(longhost + 8, 'a', 300);
  longhost[308] = '\0';
  assert_int_equal(rm__pf_url_parse(longhost, &u), -1);
}

static void test_url_sentinel(void **state) {
  (void)state;
  rm_pf_url_t u;
  assert_int_equal(rm__pf_url_parse("redis+sentinel://127.0.0.1:26001,127.0.0.1:26002,[::1]/txc", &u), 0);
  assert_int_equal(u.nsentinels, 3);
  assert_string_equal(u.sentinel[0].host, "127.0.0.1");
  assert_int_equal(u.sentinel[1].port, 26002);
  assert_string_equal(u.sentinel[2].host, "::1");
  assert_int_equal(u.sentinel[2].port, 26379);
  assert_string_equal(u.master_name, "txc");
  assert_int_equal(u.db, 0);
  assert_false(u.has_password);
  assert_int_equal(rm__pf_url_parse("redis+sentinel://:pw@h1/my-master.1/3", &u), 0);
  assert_int_equal(u.nsentinels, 1);
  assert_string_equal(u.password, "pw");
  assert_string_equal(u.master_name, "my-master.1");
  assert_int_equal(u.db, 3);
  /* a plain URL has no sentinels */
  assert_int_equal(rm__pf_url_parse("redis://h:1", &u), 0);
  assert_int_equal(u.nsentinels, 0);
  static const char *const bad[] = {
    "redis+sentinel://", "redis+sentinel://h1", "redis+sentinel://h1/", "redis+sentinel://h1,/m",
    "redis+sentinel://,h1/m", "redis+sentinel://h1:0/m", "redis+sentinel://h1/m x", "redis+sentinel://h1/m/x",
    "redis+sentinel://h1/m$", "redis+sentinel://a,b,c,d,e,f,g,h,i/m", "redis://a,b/1",
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
    if (rm__pf_url_parse(bad[i], &u) != -1) fail_msg("accepted \"%s\"", bad[i]);
}

static void test_url_from_env(void **state) {
  (void)state;
  char buf[256];
  unsetenv("REDIS_SENTINELS");
  unsetenv("REDIS_MASTER_NAME");
  setenv("REDIS_URL", "redis://:pw@127.0.0.1:7000/2", 1);
  assert_string_equal(rm_redis_url_from_env(buf, sizeof(buf)), "redis://:pw@127.0.0.1:7000/2");
  setenv("REDIS_SENTINELS", "127.0.0.1:1,127.0.0.1:2", 1);
  assert_string_equal(rm_redis_url_from_env(buf, sizeof(buf)), "redis://:pw@127.0.0.1:7000/2"); /* no name */
  setenv("REDIS_MASTER_NAME", "txc", 1);
  assert_string_equal(rm_redis_url_from_env(buf, sizeof(buf)), "redis+sentinel://:pw@127.0.0.1:1,127.0.0.1:2/txc/2");
  assert_true(rm_redis_url_valid(buf));
  assert_null(rm_redis_url_from_env(buf, 10));
  setenv("REDIS_SENTINELS", "", 1);
  assert_string_equal(rm_redis_url_from_env(buf, sizeof(buf)), "redis://:pw@127.0.0.1:7000/2");
  unsetenv("REDIS_URL");
  assert_null(rm_redis_url_from_env(buf, sizeof(buf)));
  unsetenv("REDIS_SENTINELS");
  unsetenv("REDIS_MASTER_NAME");
  /* a plain URL resolves without I/O */
  rm_redis_addr_t a;
  assert_int_equal(rm_redis_resolve("redis://10.1.2.3:7001/4", 0, &a), 0);
  assert_string_equal(a.host, "10.1.2.3");
  assert_int_equal(a.port, 7001);
  assert_int_equal(a.db, 4);
  assert_int_equal(rm_redis_resolve("http://x", 0, &a), RM_E_INVALID);
  /* no sentinel listens on port 1: fails fast with the distinct code */
  assert_int_equal(rm_redis_resolve("redis+sentinel://127.0.0.1:1/txc", 200, &a), RM_E_REDIS_NO_MASTER);
}

/* --------------------------------------------------------------- keys --- */

static void test_keys(void **state) {
  (void)state;
  rm_pf_keys_t ks;
  assert_int_equal(rm__pf_keys_build(&ks, 1001, 3), 0);
  assert_string_equal(ks.k[RM_PF_K_META], "{act_1001}:meta");
  assert_string_equal(ks.k[RM_PF_K_STOCK], "{act_1001}:t3:stock");
  assert_string_equal(ks.k[RM_PF_K_BOUGHT], "{act_1001}:bought");
  assert_string_equal(ks.k[RM_PF_K_ORDERS], "{act_1001}:orders");
  assert_string_equal(ks.k[RM_PF_K_EXPIRY], "{act_1001}:t3:expiry");
  assert_string_equal(ks.k[RM_PF_K_WL], "{act_1001}:t3:wl");
  assert_string_equal(ks.k[RM_PF_K_WLQ], "{act_1001}:t3:wlq");
  assert_string_equal(ks.k[RM_PF_K_WLSEQ], "{act_1001}:t3:wlseq");
  /* Every key carries the same hash tag: one cluster slot per activity. */
  for (int i = 0; i < RM_PF_K__COUNT; i++)
    assert_int_equal(strncmp(ks.k[i], "{act_1001}:", 11), 0);
  /* The largest ids fit. */
  assert_int_equal(rm__pf_keys_build(&ks, INT64_MAX, INT32_MAX), 0);
  assert_string_equal(ks.k[RM_PF_K_EXPIRY], "{act_9223372036854775807}:t2147483647:expiry");
  assert_int_equal(rm__pf_keys_build(&ks, 0, 1), -1);
  assert_int_equal(rm__pf_keys_build(&ks, -5, 1), -1);
  assert_int_equal(rm__pf_keys_build(&ks, 1, -1), -1);
  assert_int_equal(rm__pf_keys_build(NULL, 1, 1), -1);
}

static void test_ranges(void **state) {
  (void)state;
  assert_true(rm__pf_qty_ok(1));
  assert_true(rm__pf_qty_ok(10000));
  assert_false(rm__pf_qty_ok(0));
  assert_false(rm__pf_qty_ok(-1));
  assert_false(rm__pf_qty_ok(10001));
  assert_false(rm__pf_qty_ok(INT32_MAX));
  assert_false(rm__pf_id_ok(0));
  assert_true(rm__pf_id_ok(INT64_MAX));
  assert_true(rm__pf_ms_ok(9007199254740991LL));
  assert_false(rm__pf_ms_ok(9007199254740992LL));
  assert_false(rm__pf_ms_ok(-1));
}

/* ------------------------------------------------------- codes, numbers --- */

static void test_codes(void **state) {
  (void)state;
  assert_int_equal(rm__pf_code_from_lua(0), 0);
  assert_int_equal(rm__pf_code_from_lua(15), 15);
  assert_int_equal(rm__pf_code_from_lua(1LL << 40), INT_MAX);
  assert_int_equal(rm__pf_code_from_lua(-1), RM_PF_NOT_ON_SALE);
  assert_int_equal(rm__pf_code_from_lua(-2), RM_PF_OVER_LIMIT);
  assert_int_equal(rm__pf_code_from_lua(-3), RM_PF_SOLD_OUT);
  assert_int_equal(rm__pf_code_from_lua(-4), RM_PF_BAD_ARGS);
  assert_int_equal(rm__pf_code_from_lua(-5), RM_PF_NOT_LOADED);
  assert_int_equal(rm__pf_code_from_lua(-6), RM_PF_ALREADY_CONFIRMED);
  assert_int_equal(rm__pf_code_from_lua(-7), RM_PF_ALREADY_RELEASED);
  assert_int_equal(rm__pf_code_from_lua(-8), RM_PF_UNKNOWN_ORDER);
  assert_int_equal(rm__pf_code_from_lua(-9), RM_PF_E_REPLY);
  assert_int_equal(rm__pf_code_from_lua(LLONG_MIN), RM_PF_E_REPLY);
}

static void test_i64(void **state) {
  (void)state;
  int64_t v;
  char buf[24];
  assert_int_equal(rm__pf_parse_i64("0", 1, &v), 0);
  assert_int_equal(v, 0);
  assert_int_equal(rm__pf_parse_i64("-42", 3, &v), 0);
  assert_int_equal(v, -42);
  assert_int_equal(rm__pf_parse_i64("0007", 4, &v), 0);
  assert_int_equal(v, 7);
  assert_int_equal(rm__pf_parse_i64("9223372036854775807", 19, &v), 0);
  assert_true(v == INT64_MAX);
  assert_int_equal(rm__pf_parse_i64("-9223372036854775808", 20, &v), 0);
  assert_true(v == INT64_MIN);
  static const char *const bad[] = {"", "-", "9223372036854775808", "-9223372036854775809",
                                    "1e3", " 1", "1 ", "+1", "0x10", "1.5", "99999999999999999999"};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
    if (rm__pf_parse_i64(bad[i], strlen(bad[i]), &v) != -1) fail_msg("accepted \"%s\"", bad[i]);
  assert_int_equal(rm__pf_parse_i64("12", 1, &v), 0); /* length bounds the parse */
  assert_int_equal(v, 1);
  assert_int_equal(rm__pf_i64_str(buf, 0), 1);
  assert_string_equal(buf, "0");
  assert_int_equal(rm__pf_i64_str(buf, INT64_MIN), 20);
  assert_string_equal(buf, "-9223372036854775808");
  rm__pf_i64_str(buf, 1234567890123LL);
  assert_string_equal(buf, "1234567890123");
}

/* ------------------------------------------------------ freeze record --- */

static void test_rec(void **state) {
  (void)state;
  rm_pf_rec_t r = {'F', 2, 15, 3, 4242}, p;
  char buf[RM_PF_REC_MAX];
  assert_int_equal(rm__pf_rec_format(buf, sizeof(buf), &r), 13);
  assert_string_equal(buf, "F:2:15:3:4242");
  assert_int_equal(rm__pf_rec_parse(buf, strlen(buf), &p), 0);
  assert_int_equal(p.state, 'F');
  assert_int_equal(p.tt, 2);
  assert_int_equal(p.bucket, 15);
  assert_int_equal(p.qty, 3);
  assert_true(p.user == 4242);
  assert_int_equal(rm__pf_rec_parse("R:0:0:1:9223372036854775807", 27, &p), 0);
  assert_int_equal(p.state, 'R');
  assert_true(p.user == INT64_MAX);
  static const char *const bad[] = {
    "", "F", "F:1:2:3", "X:1:2:3:4", "F:1:2:3:4:5", "F:01:2:3:4", "F:1:2:0:4", "F:1:2:10001:4",
    "F:1:2:3:0", "F:-1:2:3:4", "F::2:3:4", "F:1:2:3:4 ", "f:1:2:3:4", "F:1:2:3:", "F:2147483648:0:1:1",
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
    if (rm__pf_rec_parse(bad[i], strlen(bad[i]), &p) != -1) fail_msg("accepted \"%s\"", bad[i]);
  r.state = 'X';
  assert_int_equal(rm__pf_rec_format(buf, sizeof(buf), &r), -1);
  r.state = 'C';
  r.qty = 0;
  assert_int_equal(rm__pf_rec_format(buf, sizeof(buf), &r), -1);
  r.qty = 1;
  assert_int_equal(rm__pf_rec_format(buf, 5, &r), -1); /* does not fit */
}

/* ------------------------------------------------------------ replies --- */

static void test_reply_int(void **state) {
  (void)state;
  char err[64];
  long long v = 0;
  for (size_t step = 0; step <= 1; step++) {
    redisReply *r = reply_of(":-3\r\n", step);
    assert_int_equal(rm__pf_reply_int(r, &v, err, sizeof(err)), 0);
    assert_int_equal(v, -3);
    freeReplyObject(r);
    r = reply_of("-NOSCRIPT No matching script\r\n", step);
    assert_int_equal(rm__pf_reply_int(r, &v, err, sizeof(err)), RM_PF_E_REDIS);
    assert_string_equal(err, "NOSCRIPT No matching script");
    freeReplyObject(r);
    r = reply_of("$2\r\n12\r\n", step);
    assert_int_equal(rm__pf_reply_int(r, &v, err, sizeof(err)), RM_PF_E_REPLY);
    freeReplyObject(r);
  }
  assert_int_equal(rm__pf_reply_int(NULL, &v, NULL, 0), RM_PF_E_REPLY);
}

static void test_parse_join(void **state) {
  (void)state;
  long pos = -1;
  redisReply *r = reply_of("*2\r\n:1\r\n:4\r\n", 1);
  assert_int_equal(rm__pf_parse_join(r, &pos, NULL, 0), 0);
  assert_int_equal(pos, 4);
  freeReplyObject(r);
  r = reply_of("*2\r\n:0\r\n:0\r\n", 0);
  assert_int_equal(rm__pf_parse_join(r, &pos, NULL, 0), RM_PF_ALREADY_WAITING);
  assert_int_equal(pos, 0);
  freeReplyObject(r);
  r = reply_of(":-2\r\n", 0);
  assert_int_equal(rm__pf_parse_join(r, &pos, NULL, 0), RM_PF_OVER_LIMIT);
  freeReplyObject(r);
  static const char *const bad[] = {":3\r\n", "*2\r\n:2\r\n:1\r\n", "*2\r\n:1\r\n:-1\r\n",
                                    "*1\r\n:1\r\n", "*2\r\n$1\r\n1\r\n:1\r\n", "+OK\r\n"};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    r = reply_of(bad[i], 0);
    if (rm__pf_parse_join(r, &pos, NULL, 0) != RM_PF_E_REPLY) fail_msg("accepted reply %zu", i);
    freeReplyObject(r);
  }
}

static void test_parse_fill(void **state) {
  (void)state;
  rm_pf_fill_t out[4];
  size_t n = 99;
  /* Served, dropped (over limit), served. */
  const char *resp = "*12\r\n"
                     "$3\r\n101\r\n$4\r\n5001\r\n:2\r\n:3\r\n"
                     "$3\r\n102\r\n$1\r\n0\r\n:2\r\n:-2\r\n"
                     "$3\r\n103\r\n$4\r\n5002\r\n:1\r\n:0\r\n";
  for (size_t step = 0; step <= 1; step++) {
    redisReply *r = reply_of(resp, step);
    assert_int_equal(rm__pf_parse_fill(r, out, 4, &n, NULL, 0), 0);
    assert_int_equal(n, 3);
    assert_true(out[0].user_id == 101 && out[0].order_id == 5001 && out[0].qty == 2 &&
                out[0].bucket == 3 && out[0].code == 0);
    assert_true(out[1].user_id == 102 && out[1].order_id == 0 && out[1].code == RM_PF_OVER_LIMIT);
    assert_true(out[2].user_id == 103 && out[2].order_id == 5002 && out[2].bucket == 0);
    /* Too many for the room given. */
    assert_int_equal(rm__pf_parse_fill(r, out, 2, &n, NULL, 0), RM_PF_E_REPLY);
    assert_int_equal(n, 0);
    freeReplyObject(r);
  }
  redisReply *r = reply_of("*0\r\n", 0);
  assert_int_equal(rm__pf_parse_fill(r, out, 4, &n, NULL, 0), 0);
  assert_int_equal(n, 0);
  freeReplyObject(r);
  r = reply_of(":-1\r\n", 0);
  assert_int_equal(rm__pf_parse_fill(r, out, 4, &n, NULL, 0), RM_PF_NOT_ON_SALE);
  freeReplyObject(r);
  static const char *const bad[] = {
    "*3\r\n$1\r\n1\r\n$1\r\n2\r\n:1\r\n",                 /* not a multiple of 4 */
    "*4\r\n$1\r\nx\r\n$1\r\n2\r\n:1\r\n:0\r\n",           /* user not a number */
    "*4\r\n$1\r\n1\r\n$1\r\n0\r\n:1\r\n:0\r\n",           /* served without an order id */
    "*4\r\n$1\r\n1\r\n$1\r\n0\r\n:1\r\n:-3\r\n",          /* a code fill never returns */
    "*4\r\n$1\r\n1\r\n$1\r\n2\r\n$1\r\n1\r\n:0\r\n",      /* qty not an integer */
    "*4\r\n$1\r\n1\r\n$1\r\n2\r\n:10001\r\n:0\r\n",       /* qty out of range */
    ":5\r\n",                                             /* a positive integer */
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    r = reply_of(bad[i], 0);
    if (rm__pf_parse_fill(r, out, 4, &n, NULL, 0) != RM_PF_E_REPLY) fail_msg("accepted reply %zu", i);
    freeReplyObject(r);
  }
}

static void test_parse_expired(void **state) {
  (void)state;
  rm_pf_expired_t x[2];
  size_t n;
  char err[64];
  redisReply *r = reply_of("*8\r\n$2\r\n77\r\n$2\r\n12\r\n:2\r\n:1\r\n"
                           "$2\r\n78\r\n$2\r\n13\r\n:1\r\n:0\r\n", 1);
  assert_int_equal(rm__pf_parse_expired(r, x, 2, &n, err, sizeof(err)), 0);
  assert_int_equal(n, 2);
  assert_true(x[0].order_id == 77 && x[0].user_id == 12 && x[0].qty == 2 && x[0].bucket == 1);
  assert_true(x[1].order_id == 78 && x[1].user_id == 13 && x[1].qty == 1 && x[1].bucket == 0);
  freeReplyObject(r);
  r = reply_of("*4\r\n$2\r\n77\r\n$2\r\n12\r\n:2\r\n:-1\r\n", 0);
  assert_int_equal(rm__pf_parse_expired(r, x, 2, &n, err, sizeof(err)), RM_PF_E_REPLY);
  freeReplyObject(r);
  r = reply_of("-BUSY Redis is busy running a script\r\n", 0);
  assert_int_equal(rm__pf_parse_expired(r, x, 2, &n, err, sizeof(err)), RM_PF_E_REDIS);
  assert_string_equal(err, "BUSY Redis is busy running a script");
  freeReplyObject(r);
}

/* A reply cut short and followed by garbage is a reader error, never a
 * reply the parsers see (and nothing leaks). */
static void test_reader_garbage(void **state) {
  (void)state;
  redisReader *rd = redisReaderCreate();
  void *out = NULL;
  assert_int_equal(redisReaderFeed(rd, "*4\r\n$2\r\n77\r\n", 12), REDIS_OK);
  assert_int_equal(redisReaderGetReply(rd, &out), REDIS_OK);
  assert_null(out);
  assert_int_equal(redisReaderFeed(rd, "@garbage\r\n", 10), REDIS_OK);
  assert_int_equal(redisReaderGetReply(rd, &out), REDIS_ERR);
  assert_null(out);
  redisReaderFree(rd);
}

/* ------------------------------------------------------------ backoff --- */

static void test_backoff(void **state) {
  (void)state;
  assert_int_equal(rm__pf_backoff_ms(0, 50, 2000), 0);
  assert_int_equal(rm__pf_backoff_ms(1, 50, 2000), 50);
  assert_int_equal(rm__pf_backoff_ms(2, 50, 2000), 100);
  assert_int_equal(rm__pf_backoff_ms(6, 50, 2000), 1600);
  assert_int_equal(rm__pf_backoff_ms(7, 50, 2000), 2000);
  assert_int_equal(rm__pf_backoff_ms(UINT_MAX, 50, 2000), 2000);
  assert_int_equal(rm__pf_backoff_ms(3, 0, 10), 4);
  assert_int_equal(rm__pf_backoff_ms(40, 3000, UINT_MAX), UINT_MAX);
}

/* ------------------------------------------------------------ scripts --- */

/* Every script the C side runs is embedded, its includes expanded, and it
 * documents KEYS, ARGV and its results at its top. */
static void test_lua_table(void **state) {
  (void)state;
  assert_int_equal(rm__pf_script_index("freeze"), RM_PF_S_FREEZE);
  assert_int_equal(rm__pf_script_index("waitlist_fill"), RM_PF_S_WAITLIST_FILL);
  assert_int_equal(rm__pf_script_index("stock_lib"), -1);
  assert_int_equal(rm__pf_script_index(NULL), -1);
  assert_null(rm__pf_script_name(RM_PF_S__COUNT));
  for (int i = 0; i < RM_PF_S__COUNT; i++) {
    const char *name = rm__pf_script_name(i);
    const rm_pf_lua_t *found = NULL;
    char head[64];
    for (size_t j = 0; j < rm__pf_lua_count; j++)
      if (strcmp(rm__pf_lua[j].name, name) == 0) found = &rm__pf_lua[j];
    if (!found) fail_msg("script \"%s\" is not embedded", name);
    assert_int_equal(strlen(found->text), found->len);
    snprintf(head, sizeof(head), "-- %s.lua - ", name);
    assert_int_equal(strncmp(found->text, head, strlen(head)), 0);
    assert_non_null(strstr(found->text, "KEYS[1]"));
    assert_non_null(strstr(found->text, "ARGV[1]"));
    assert_non_null(strstr(found->text, "Returns"));
    /* The include line itself is gone, the library is in. */
    assert_null(strstr(found->text, "\n--#include "));
    assert_non_null(strstr(found->text, "local function pf_id("));
  }
  /* The library is not a script of its own. */
  for (size_t j = 0; j < rm__pf_lua_count; j++) assert_string_not_equal(rm__pf_lua[j].name, "stock_lib");
}

/* A TCP socket connected to itself is told apart from a real connection.
 * Connecting to the socket's own bound port makes one for sure (on Linux,
 * TCP simultaneous open with itself), as a reconnect to a stopped Redis on
 * loopback sometimes does by chance. */
static void test_self_connected(void **state) {
  (void)state;
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t sl = sizeof(sa);

  int self = socket(AF_INET, SOCK_STREAM, 0);
  assert_true(self >= 0);
  assert_int_equal(bind(self, (struct sockaddr *)&sa, sizeof(sa)), 0);
  assert_int_equal(getsockname(self, (struct sockaddr *)&sa, &sl), 0);
  assert_false(rm__pf_self_connected(self)); /* not connected yet */
  assert_int_equal(connect(self, (struct sockaddr *)&sa, sizeof(sa)), 0);
  assert_true(rm__pf_self_connected(self));
  close(self);

  /* a real connection, to a listener on loopback */
  struct sockaddr_in la = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t ll = sizeof(la);
  int lst = socket(AF_INET, SOCK_STREAM, 0), cli = socket(AF_INET, SOCK_STREAM, 0);
  assert_true(lst >= 0 && cli >= 0);
  assert_int_equal(bind(lst, (struct sockaddr *)&la, sizeof(la)), 0);
  assert_int_equal(listen(lst, 1), 0);
  assert_int_equal(getsockname(lst, (struct sockaddr *)&la, &ll), 0);
  assert_int_equal(connect(cli, (struct sockaddr *)&la, sizeof(la)), 0);
  assert_false(rm__pf_self_connected(cli));
  close(cli);
  close(lst);
  assert_false(rm__pf_self_connected(-1));
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_url_ok),        cmocka_unit_test(test_url_bad),
    cmocka_unit_test(test_url_sentinel),  cmocka_unit_test(test_url_from_env),
    cmocka_unit_test(test_keys),          cmocka_unit_test(test_ranges),
    cmocka_unit_test(test_codes),         cmocka_unit_test(test_i64),
    cmocka_unit_test(test_rec),           cmocka_unit_test(test_reply_int),
    cmocka_unit_test(test_parse_join),    cmocka_unit_test(test_parse_fill),
    cmocka_unit_test(test_parse_expired), cmocka_unit_test(test_reader_garbage),
    cmocka_unit_test(test_backoff),       cmocka_unit_test(test_lua_table),
    cmocka_unit_test(test_self_connected),
  };
  return cmocka_run_group_tests_name("prefilter_keys", tests, NULL, NULL);
}
