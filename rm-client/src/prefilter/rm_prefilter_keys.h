/*
 * rm_prefilter_keys.h - pure helpers of the Redis prefilter: the Redis URL,
 * key names, argument checks, result codes, freeze records and the parsing
 * of script replies.  No I/O; unit-tested by tests/unit/test_prefilter_keys.c.
 *
 * NOTES
 *   Key names and the freeze record format are a contract with the Lua
 *   scripts: lua/stock_lib.lua documents both, and this file is the only C
 *   that knows them.  Every key of activity A carries the hash tag {act_A}.
 */
#ifndef RM_PREFILTER_KEYS_H
#define RM_PREFILTER_KEYS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <hiredis/hiredis.h>

#include "rm_client.h"

/* ---------------------------------------------------------------- URL --- */

#define RM_PF_HOST_MAX 256
#define RM_PF_PASSWORD_MAX 256

#define RM_PF_SENTINELS_MAX 8
#define RM_PF_MASTER_NAME_MAX 128
#define RM_PF_SENTINEL_PORT 26379

typedef struct rm_pf_hostport {
  char host[RM_PF_HOST_MAX]; /* without brackets for IPv6 */
  int port;
} rm_pf_hostport_t;

typedef struct rm_pf_url {
  char host[RM_PF_HOST_MAX]; /* without brackets for IPv6; "" for a Sentinel URL */
  int port;                  /* 1..65535, default 6379 */
  char password[RM_PF_PASSWORD_MAX]; /* the master's (never sent to a sentinel) */
  bool has_password;
  int db; /* 0..1000000, default 0 */
  /* A Sentinel URL: nsentinels >= 1, the master found by name. */
  unsigned nsentinels;
  rm_pf_hostport_t sentinel[RM_PF_SENTINELS_MAX]; /* port default 26379 */
  char master_name[RM_PF_MASTER_NAME_MAX];
} rm_pf_url_t;

/* Parse "redis://[:password@]host[:port][/db]" ("[v6]" hosts too; a user
 * name before the ':' is refused: Redis 7 ACL users are not supported),
 * or "redis+sentinel://[:password@]h1[:p1],h2[:p2],.../master-name[/db]"
 * (1..8 sentinels, port 26379 by default; the password is the master's;
 * the name [A-Za-z0-9_.-], up to 127 characters).  0 or -1. */
int rm__pf_url_parse(const char *url, rm_pf_url_t *out);

/* --------------------------------------------------------------- keys --- */

/* Long enough for "{act_9223372036854775807}:t2147483647:expiry". */
#define RM_PF_KEY_MAX 64

typedef enum {
  RM_PF_K_META = 0, /* {act_A}:meta */
  RM_PF_K_STOCK,    /* {act_A}:t<T>:stock */
  RM_PF_K_BOUGHT,   /* {act_A}:bought */
  RM_PF_K_ORDERS,   /* {act_A}:orders */
  RM_PF_K_EXPIRY,   /* {act_A}:t<T>:expiry */
  RM_PF_K_WL,       /* {act_A}:t<T>:wl */
  RM_PF_K_WLQ,      /* {act_A}:t<T>:wlq */
  RM_PF_K_WLSEQ,    /* {act_A}:t<T>:wlseq */
  RM_PF_K_QUEUE,    /* {act_A}:queue (the queued order mode's stream) */
  RM_PF_K__COUNT
} rm_pf_key_kind_t;

typedef struct rm_pf_keys {
  char k[RM_PF_K__COUNT][RM_PF_KEY_MAX];
} rm_pf_keys_t;

/* Every key of ('activity', 'tt').  0, or -1 when the ids are out of range
 * (activity < 1, tt < 0). */
int rm__pf_keys_build(rm_pf_keys_t *ks, int64_t activity, int32_t tt);

/* Argument ranges, the same as the scripts'. */
#define RM_PF_MAX_QTY 10000
#define RM_PF_MAX_FILL_IDS 1000
#define RM_PF_MAX_FILL_SCAN 1000
#define RM_PF_MAX_RESULTS 10000
#define RM_PF_MAX_BUCKETS 100000 /* stock_add.lua's bound, as the reconciliation's */
static inline bool rm__pf_id_ok(int64_t id) { return id >= 1; }
static inline bool rm__pf_qty_ok(int32_t q) { return q >= 1 && q <= RM_PF_MAX_QTY; }
static inline bool rm__pf_tt_ok(int32_t tt) { return tt >= 0; }
/* Unix milliseconds up to 2^53 - 1 (exact in a Lua number). */
static inline bool rm__pf_ms_ok(int64_t ms) { return ms >= 0 && ms <= 9007199254740991LL; }

/* ------------------------------------------------------------ scripts --- */

typedef enum {
  RM_PF_S_FREEZE = 0,
  RM_PF_S_CONFIRM,
  RM_PF_S_RELEASE,
  RM_PF_S_EXPIRE,
  RM_PF_S_WAITLIST_JOIN,
  RM_PF_S_WAITLIST_FILL,
  RM_PF_S_STOCK_ADD,
  RM_PF_S_HOLD,
  RM_PF_S__COUNT
} rm_pf_script_t;

/* "freeze", ... (the lua/ file name without ".lua"); NULL if out of range. */
const char *rm__pf_script_name(int script);
/* The index of 'name', or -1. */
int rm__pf_script_index(const char *name);

/* ----------------------------------------------------- codes, numbers --- */

/* The scripts' answer "held" (stock_lib.lua, pf_held): nothing changed;
 * rm__pf_eval waits and runs the script again. */
#define RM_PF_LUA_HELD (-9)

/* A script's integer result: >= 0 passes through (clamped to INT_MAX), -1
 * .. -8 become RM_PF_NOT_ON_SALE .. RM_PF_UNKNOWN_ORDER, anything else is
 * RM_PF_E_REPLY. */
int rm__pf_code_from_lua(long long v);

/* Decimal int64, optional '-', no spaces, leading zeros allowed.  0/-1. */
int rm__pf_parse_i64(const char *s, size_t len, int64_t *out);
/* Format 'v' into 'buf' (at least 21 bytes); returns the length. */
size_t rm__pf_i64_str(char *buf, int64_t v);

/* ------------------------------------------------------ freeze record --- */

/* "S:T:B:Q:U" (lua/stock_lib.lua). */
typedef struct rm_pf_rec {
  char state; /* 'F' frozen, 'C' confirmed, 'R' released */
  int32_t tt;
  int32_t bucket;
  int32_t qty;
  int64_t user;
} rm_pf_rec_t;

#define RM_PF_REC_MAX 64
/* Returns the length, or -1 (bad state/values, or 'cap' too small). */
int rm__pf_rec_format(char *buf, size_t cap, const rm_pf_rec_t *r);
/* 0, or -1 when 's' is not a record in canonical form. */
int rm__pf_rec_parse(const char *s, size_t len, rm_pf_rec_t *r);

/* ------------------------------------------------------------ replies --- */

/* An integer reply: 0 and '*v'; RM_PF_E_REDIS for an error reply (its text
 * to 'err', cap 'errlen', may be NULL); RM_PF_E_REPLY for anything else. */
int rm__pf_reply_int(const redisReply *r, long long *v, char *err, size_t errlen);

/* waitlist_join's reply: 0 (joined) or RM_PF_ALREADY_WAITING with
 * '*position'; a script code (RM_PF_OVER_LIMIT, ...); RM_PF_E_REDIS;
 * RM_PF_E_REPLY. */
int rm__pf_parse_join(const redisReply *r, long *position, char *err, size_t errlen);

/* waitlist_fill's reply into 'out' (up to 'cap'), '*n' entries: 0; a
 * script code for an integer reply; RM_PF_E_REDIS; RM_PF_E_REPLY (also
 * when the reply has more than 'cap' entries or malformed ones). */
int rm__pf_parse_fill(const redisReply *r, rm_pf_fill_t *out, size_t cap, size_t *n, char *err,
                      size_t errlen);

/* One order released by expire.lua. */
typedef struct rm_pf_expired {
  int64_t order_id;
  int64_t user_id;
  int32_t qty;
  int32_t bucket;
} rm_pf_expired_t;
/* expire.lua's reply; codes as rm__pf_parse_fill. */
int rm__pf_parse_expired(const redisReply *r, rm_pf_expired_t *out, size_t cap, size_t *n,
                         char *err, size_t errlen);

/* ------------------------------------------------------------ backoff --- */

/* Delay before the next connect after 'failures' (>= 1) failed ones:
 * min_ms doubled per failure, at most max_ms. */
unsigned rm__pf_backoff_ms(unsigned failures, unsigned min_ms, unsigned max_ms);

#endif /* RM_PREFILTER_KEYS_H */
