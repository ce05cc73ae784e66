/*
 * rm_prefilter_pg.c - the prefilter's PostgreSQL side: recording freezes
 * and their ends in the stock database, reconciling Redis with it (seed
 * included), and the durable expiry sweep.
 *
 * NOTES
 *   PostgreSQL is the truth; Redis is a fast copy that may lose writes (a
 *   restart without AOF, the last second with appendfsync everysec) or
 *   hold freezes PostgreSQL never saw (the caller died between the Redis
 *   freeze and its local transaction).  Three mechanisms keep them close:
 *
 *   1. Lifecycle in PostgreSQL first.  rm_prefilter_pg_* call the functions
 *      of sql/stock/002_stock_freeze.sql in the caller's connection: a
 *      conditional UPDATE of stock_freeze.state decides each confirm or
 *      release exactly once, the bucket counts move in the same
 *      transaction.  The caller then applies the same change to Redis,
 *      whose scripts are exactly-once per order too.
 *
 *   2. Reconciliation (and seeding: the same thing on an empty Redis).
 *      One REPEATABLE READ snapshot of activity, activity_ticket_bucket and
 *      stock_freeze gives the target; Redis is read under WATCH, compared,
 *      and corrected in one MULTI/EXEC, so a script running in between
 *      makes EXEC fail and the round is redone on fresh values.  Counters
 *      compare by value (a missing field is 0), records and deadlines
 *      exactly; Redis-only records are deleted.  WATCH is optimistic: under
 *      a sale that never pauses, some script changes the keys inside every
 *      round's window (the PostgreSQL read is in it, on purpose: see
 *      reconcile_round).  So after HOLD_AFTER_ABORTS aborted rounds each
 *      round first sets a hold (lua/hold.lua: meta's field "hold", a
 *      deadline on the Redis server's clock) that every writing script
 *      honours by answering "held" without a change; the library's callers
 *      wait it out (rm__pf_eval).  The round's EXEC deletes the hold; a
 *      failed round deletes it too, and a dead reconciler's ends at its
 *      deadline.  Ordering is unchanged: the hold only keeps writers out
 *      of the window, WATCH still guards it.
 *
 *   3. Expiry.  Deadlines live in stock_freeze.deadline (durable) and in
 *      the Redis zset {act_A}:t<T>:expiry (an index: rebuilt by step 2).
 *      The sweep releases due FROZEN rows in PostgreSQL first
 *      (stock_freeze_expire: FOR UPDATE SKIP LOCKED, one winner per row),
 *      then in Redis; then it walks Redis's due entries and repairs those
 *      that PostgreSQL already decided (released or confirmed: apply the
 *      same), releases those PostgreSQL never recorded (orphans), and
 *      corrects deadlines PostgreSQL holds later.  A crash anywhere leaves
 *      a state the next sweep finishes: no timer or notification holds an
 *      expiry, so neither a process restart nor a Redis restart loses one.
 *
 *   Threads: each call uses the caller's PGconn (one thread at a time, as
 *   libpq requires) and connections from the pool.
 */
#include <inttypes.h>
#include <libpq-fe.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rm_pg.h"
#include "rm_prefilter_int.h"
#include "rm_prefilter_pg.h"

#define RECONCILE_TRIES 10
/* Rounds aborted by the sale's writes before the next ones hold them. */
#define HOLD_AFTER_ABORTS 2
#define EXPIRE_MAX 10000u

/* ---------------------------------------------------------- libpq glue --- */

int rm__pf_pg_usable(PGconn *pg, bool need_idle) {
  int code;
  const char *why = rm__pg_unusable(pg, need_idle, &code);
  if (why) rm__errmsg_set("%s", why);
  return code;
}

int rm__pf_pg_order_arg(PGconn *pg, int64_t order_id, int invalid_rc, char text[24]) {
  int rc = rm__pf_pg_usable(pg, false);
  if (rc != 0) return rc;
  if (!rm__pf_id_ok(order_id)) {
    rm__errmsg_set("invalid argument: order id must be >= 1");
    return invalid_rc;
  }
  rm__pf_i64_str(text, order_id);
  return 0;
}

PGresult *rm__pf_pg_exec(PGconn *pg, const char *what, const char *sql, int n, const char *const *vals) {
  PGresult *res = PQexecParams(pg, sql, n, NULL, vals, NULL, NULL, 0);
  ExecStatusType st = PQresultStatus(res);
  if (st == PGRES_TUPLES_OK || st == PGRES_COMMAND_OK) return res;
  char what_[160], err[1024];
  snprintf(what_, sizeof(what_), "could not %s", what);
  rm__pg_error(err, sizeof(err), what_, pg, res);
  rm__errmsg_set("%s", err);
  PQclear(res);
  return NULL;
}

static PGresult *pg_exec(PGconn *pg, const char *sql, int n, const char *const *vals) {
  return rm__pf_pg_exec(pg, "query the stock database", sql, n, vals);
}

/* One integer cell. */
static int cell_i64(const PGresult *res, int row, int col, int64_t *v) {
  const char *s = PQgetvalue(res, row, col);
  if (PQgetisnull(res, row, col) || rm__pf_parse_i64(s, strlen(s), v) != 0) {
    rm__errmsg_set("unexpected value \"%s\" from the stock database", s);
    return -1;
  }
  return 0;
}

/* A function returning one integer code. */
static int pg_call_code(PGconn *pg, const char *sql, int n, const char *const *vals, int64_t *code) {
  PGresult *res = pg_exec(pg, sql, n, vals);
  int rc = 0;
  if (!res) return RM_E_DB;
  if (PQntuples(res) != 1 || PQnfields(res) != 1 || cell_i64(res, 0, 0, code) != 0) rc = RM_E_DB;
  PQclear(res);
  return rc;
}

static int code_from_sql(int64_t v) {
  if (v == 0 || v == 1) return (int)v;
  if (v >= -8 && v < 0) return rm__pf_code_from_lua(v);
  rm__errmsg_set("unexpected code %" PRId64 " from the stock database", v);
  return RM_E_DB;
}

/* ----------------------------------------------- lifecycle in PostgreSQL --- */

int rm_prefilter_pg_freeze(PGconn *pg, int64_t activity_id, int32_t ticket_type, int32_t bucket,
                           int64_t user_id, int64_t order_id, int32_t qty, int64_t deadline_ms) {
  char s[7][24];
  const char *vals[7];
  int64_t code;
  int rc = rm__pf_pg_usable(pg, false);
  if (rc != 0) return rc;
  if (!rm__pf_id_ok(activity_id) || !rm__pf_tt_ok(ticket_type) || bucket < 0 ||
      !rm__pf_id_ok(user_id) || !rm__pf_id_ok(order_id) || !rm__pf_qty_ok(qty) ||
      !rm__pf_ms_ok(deadline_ms)) {
    rm__errmsg_set("invalid argument: freeze record out of range");
    return RM_PF_BAD_ARGS;
  }
  rm__pf_i64_str(s[0], order_id);
  rm__pf_i64_str(s[1], activity_id);
  rm__pf_i64_str(s[2], ticket_type);
  rm__pf_i64_str(s[3], bucket);
  rm__pf_i64_str(s[4], user_id);
  rm__pf_i64_str(s[5], qty);
  rm__pf_i64_str(s[6], deadline_ms);
  for (int i = 0; i < 7; i++) vals[i] = s[i];
  rc = pg_call_code(pg,
                    "SELECT stock_freeze_apply($1::bigint, $2::bigint, $3::integer, $4::integer, "
                    "$5::bigint, $6::integer, timestamptz 'epoch' + $7::bigint * interval '1 millisecond')",
                    7, vals, &code);
  return rc != 0 ? rc : code_from_sql(code);
}

static int pg_finish(PGconn *pg, int64_t order_id, const char *reason) {
  char s[24];
  const char *vals[2] = {s, reason};
  int64_t code;
  int rc = rm__pf_pg_order_arg(pg, order_id, RM_PF_BAD_ARGS, s);
  if (rc != 0) return rc;
  rc = pg_call_code(pg, "SELECT stock_freeze_finish($1::bigint, $2::text)", 2, vals, &code);
  if (rc != 0) return rc;
  rc = code_from_sql(code);
  if (rc == 1) { /* not a code finish returns */
    rm__errmsg_set("unexpected code 1 from stock_freeze_finish");
    rc = RM_E_DB;
  }
  return rc;
}

int rm_prefilter_pg_confirm(PGconn *pg, int64_t order_id) { return pg_finish(pg, order_id, NULL); }

int rm_prefilter_pg_release(PGconn *pg, int64_t order_id) { return pg_finish(pg, order_id, "cancel"); }

/* ------------------------------------------------- reconcile: structures --- */

/* A small bump allocator for the strings of one reconciliation. */
typedef struct arena_chunk {
  struct arena_chunk *next;
  size_t used, cap;
  char data[];
} arena_chunk_t;

typedef struct arena {
  arena_chunk_t *head;
} arena_t;

static char *arena_printf(arena_t *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static char *arena_printf(arena_t *a, const char *fmt, ...) {
  va_list ap;
  int n;
  char tmp[128];
  va_start(ap, fmt);
  n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
  va_end(ap);
  if (n < 0 || (size_t)n >= sizeof(tmp)) return NULL;
  if (!a->head || a->head->cap - a->head->used < (size_t)n + 1) {
    size_t cap = 64 * 1024;
    arena_chunk_t *c = malloc(sizeof(*c) + cap);
    if (!c) return NULL;
    c->next = a->head;
    c->used = 0;
    c->cap = cap;
    a->head = c;
  }
  char *p = a->head->data + a->head->used;
  memcpy(p, tmp, (size_t)n + 1);
  a->head->used += (size_t)n + 1;
  return p;
}

static void arena_free(arena_t *a) {
  while (a->head) {
    arena_chunk_t *next = a->head->next;
    free(a->head);
    a->head = next;
  }
}

/* A field -> value list, sorted by field for the merge. */
typedef struct kv {
  const char *field;
  const char *value;
} kv_t;

typedef struct kvlist {
  kv_t *v;
  size_t n, cap;
} kvlist_t;

/* The array 'v' of '*cap' elements of 'size' bytes, 'n' of them used,
 * with room for one more: as it is, or reallocated to twice its capacity
 * ('first' elements the first time).  NULL (and 'v' untouched) when out
 * of memory. */
static void *room_for_one(void *v, size_t n, size_t *cap, size_t size, size_t first) {
  if (n < *cap) return v;
  size_t grown = *cap ? *cap * 2 : first;
  void *nv = realloc(v, grown * size);
  if (nv) *cap = grown;
  return nv;
}

static int kv_add(kvlist_t *l, const char *field, const char *value) {
  if (!field || !value) return -1;
  kv_t *v = room_for_one(l->v, l->n, &l->cap, sizeof(*v), 16);
  if (!v) return -1;
  l->v = v;
  l->v[l->n].field = field;
  l->v[l->n].value = value;
  l->n++;
  return 0;
}

static int kv_cmp(const void *a, const void *b) {
  return strcmp(((const kv_t *)a)->field, ((const kv_t *)b)->field);
}

static void kv_sort(kvlist_t *l) {
  if (l->n > 1) qsort(l->v, l->n, sizeof(*l->v), kv_cmp);
}

/* What one ticket type holds: its keys and targets. */
typedef struct tt_state {
  int32_t tt;
  rm_pf_keys_t keys;
  kvlist_t stock_target;  /* n, stock:i, frozen:i, sold:i */
  kvlist_t expiry_target; /* order -> deadline ms */
} tt_state_t;

typedef enum { CH_HSET, CH_HDEL, CH_ZADD, CH_ZREM } change_kind_t;
typedef enum { CAT_META, CAT_BUCKETS, CAT_USERS, CAT_ORDERS, CAT_DEADLINES } change_cat_t;

typedef struct change {
  change_kind_t kind;
  change_cat_t cat;
  const char *key;
  const char *field;
  const char *old_value; /* NULL: absent */
  const char *new_value; /* NULL: delete */
} change_t;

typedef struct changes {
  change_t *v;
  size_t n, cap;
} changes_t;

static int change_add(changes_t *c, change_kind_t kind, change_cat_t cat, const char *key,
                      const char *field, const char *old_value, const char *new_value) {
  change_t *v = room_for_one(c->v, c->n, &c->cap, sizeof(*v), 64);
  if (!v) return -1;
  c->v = v;
  c->v[c->n++] = (change_t){kind, cat, key, field, old_value, new_value};
  return 0;
}

typedef enum {
  DIFF_EXACT,   /* values compare as strings; extra fields are deleted */
  DIFF_COUNTER, /* values compare as integers, a missing field is 0 */
  DIFF_SUBSET,  /* like EXACT, but fields not in the target are left alone */
  DIFF_ZSET     /* member -> score, compared as integers */
} diff_mode_t;

static bool num_eq(const char *a, const char *b) {
  int64_t x = 0, y = 0;
  if (!a) a = "0";
  if (!b) b = "0";
  if (rm__pf_parse_i64(a, strlen(a), &x) != 0 || rm__pf_parse_i64(b, strlen(b), &y) != 0)
    return strcmp(a, b) == 0;
  return x == y;
}

/* A zset score as Redis prints it ("1700000000123", "1.7e+12"). */
static bool score_eq(const char *redis_score, const char *target) {
  int64_t t;
  char *end;
  double d = strtod(redis_score, &end);
  if (*end || rm__pf_parse_i64(target, strlen(target), &t) != 0) return false;
  /* Deadlines are integers below 2^53: exact in a double. */
  return d == (double)t;
}

static bool is_zero(const char *v) { return num_eq(v, "0"); }

/* Compare 'target' with 'cur' (both sorted) for 'key', appending changes. */
static int diff(changes_t *out, change_cat_t cat, const char *key, const kvlist_t *target,
                const kvlist_t *cur, diff_mode_t mode) {
  size_t i = 0, j = 0;
  bool zset = mode == DIFF_ZSET;
  while (i < target->n || j < cur->n) {
    int c = i == target->n ? 1 : j == cur->n ? -1 : strcmp(target->v[i].field, cur->v[j].field);
    int rc = 0;
    if (c == 0) {
      const char *tv = target->v[i].value, *cv = cur->v[j].value;
      bool eq = mode == DIFF_COUNTER ? num_eq(tv, cv) : zset ? score_eq(cv, tv) : strcmp(tv, cv) == 0;
      if (!eq) rc = change_add(out, zset ? CH_ZADD : CH_HSET, cat, key, target->v[i].field, cv, tv);
      i++;
      j++;
    } else if (c < 0) { /* only in the target */
      if (!(mode == DIFF_COUNTER && is_zero(target->v[i].value)))
        rc = change_add(out, zset ? CH_ZADD : CH_HSET, cat, key, target->v[i].field, NULL,
                        target->v[i].value);
      i++;
    } else { /* only in Redis */
      if (mode != DIFF_SUBSET && !(mode == DIFF_COUNTER && is_zero(cur->v[j].value)))
        rc = change_add(out, zset ? CH_ZREM : CH_HDEL, cat, key, cur->v[j].field, cur->v[j].value,
                        NULL);
      j++;
    }
    if (rc != 0) return -1;
  }
  return 0;
}

/* A flat field/value (or member/score) array reply into a sorted list
 * pointing into the reply. */
static int reply_pairs(const redisReply *r, kvlist_t *l) {
  l->n = 0;
  if (!r || r->type != REDIS_REPLY_ARRAY || r->elements % 2 != 0) return -1;
  for (size_t i = 0; i < r->elements; i += 2) {
    if (r->element[i]->type != REDIS_REPLY_STRING || r->element[i + 1]->type != REDIS_REPLY_STRING)
      return -1;
    if (kv_add(l, r->element[i]->str, r->element[i + 1]->str) != 0) return -1;
  }
  kv_sort(l);
  return 0;
}

/* ------------------------------------------------ reconcile: the target --- */

typedef struct target {
  arena_t arena;
  rm_pf_keys_t akeys; /* activity-wide keys (meta, bought, orders) */
  kvlist_t meta, bought, orders;
  tt_state_t *tts;
  size_t ntt;
  PGresult *res[4];
} target_t;

static void target_free(target_t *t) {
  free(t->meta.v);
  free(t->bought.v);
  free(t->orders.v);
  for (size_t i = 0; i < t->ntt; i++) {
    free(t->tts[i].stock_target.v);
    free(t->tts[i].expiry_target.v);
  }
  free(t->tts);
  for (int i = 0; i < 4; i++) PQclear(t->res[i]);
  arena_free(&t->arena);
}

static tt_state_t *tt_find(target_t *t, int32_t tt) {
  for (size_t i = 0; i < t->ntt; i++)
    if (t->tts[i].tt == tt) return &t->tts[i];
  return NULL;
}

#define OOM_IF(cond)                                                                               \
  do {                                                                                             \
    if (cond) {                                                                                    \
      rm__errmsg_set("out of memory");                                                                \
      return RM_E_NOMEM;                                                                           \
    }                                                                                              \
  } while (0)

/* Read the activity from PostgreSQL in one snapshot and build the target. */
static int target_load(PGconn *pg, int64_t activity_id, target_t *t) {
  static const char *const queries[4] = {
    "SELECT status, per_user_limit, floor(extract(epoch FROM starts_at) * 1000)::bigint, "
    "floor(extract(epoch FROM ends_at) * 1000)::bigint FROM activity WHERE activity_id = $1::bigint",
    "SELECT ticket_type, bucket_id, stock, frozen_count, sold_count FROM activity_ticket_bucket "
    "WHERE activity_id = $1::bigint ORDER BY ticket_type, bucket_id",
    "SELECT user_id, sum(qty) FROM stock_freeze WHERE activity_id = $1::bigint "
    "AND state <> 'RELEASED' GROUP BY user_id",
    "SELECT order_id, ticket_type, bucket_id, user_id, qty, left(state, 1), "
    "(extract(epoch FROM deadline) * 1000)::bigint FROM stock_freeze WHERE activity_id = $1::bigint",
  };
  char act[24];
  const char *vals[1] = {act};
  PGresult *r;
  int rc = 0;

  rm__pf_i64_str(act, activity_id);
  r = pg_exec(pg, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", 0, NULL);
  if (!r) return RM_E_DB;
  PQclear(r);
  for (int i = 0; i < 4; i++) {
    t->res[i] = pg_exec(pg, queries[i], 1, vals);
    if (!t->res[i]) {
      rc = RM_E_DB;
      break;
    }
  }
  r = pg_exec(pg, rc == 0 ? "COMMIT" : "ROLLBACK", 0, NULL);
  if (!r) return RM_E_DB;
  PQclear(r);
  if (rc != 0) return rc;
  if (PQntuples(t->res[0]) != 1) {
    rm__errmsg_set("activity %" PRId64 " is not in the stock database", activity_id);
    return RM_PF_NO_ACTIVITY;
  }
  if (rm__pf_keys_build(&t->akeys, activity_id, 0) != 0) return RM_PF_BAD_ARGS;

  /* meta: status, limit and the sale window in unix ms (the scripts'
   * pf_on_sale compares it with the Redis server's clock) */
  OOM_IF(kv_add(&t->meta, "status", PQgetvalue(t->res[0], 0, 0)) != 0 ||
         kv_add(&t->meta, "limit", PQgetvalue(t->res[0], 0, 1)) != 0 ||
         kv_add(&t->meta, "starts", PQgetvalue(t->res[0], 0, 2)) != 0 ||
         kv_add(&t->meta, "ends", PQgetvalue(t->res[0], 0, 3)) != 0);

  /* buckets: rows sorted by ticket type, bucket */
  {
    PGresult *b = t->res[1];
    int rows = PQntuples(b);
    t->tts = calloc((size_t)rows + 1, sizeof(*t->tts));
    OOM_IF(!t->tts);
    for (int row = 0; row < rows;) {
      int64_t tt, bucket, maxb = -1;
      if (cell_i64(b, row, 0, &tt) != 0 || tt < 0 || tt > INT32_MAX) return RM_E_DB;
      tt_state_t *s = &t->tts[t->ntt++];
      s->tt = (int32_t)tt;
      if (rm__pf_keys_build(&s->keys, activity_id, s->tt) != 0) return RM_E_DB;
      for (; row < rows; row++) {
        int64_t this_tt;
        if (cell_i64(b, row, 0, &this_tt) != 0) return RM_E_DB;
        if (this_tt != tt) break;
        if (cell_i64(b, row, 1, &bucket) != 0 || bucket < 0 || bucket > 100000) return RM_E_DB;
        OOM_IF(kv_add(&s->stock_target, arena_printf(&t->arena, "stock:%" PRId64, bucket),
                      PQgetvalue(b, row, 2)) != 0 ||
               kv_add(&s->stock_target, arena_printf(&t->arena, "frozen:%" PRId64, bucket),
                      PQgetvalue(b, row, 3)) != 0 ||
               kv_add(&s->stock_target, arena_printf(&t->arena, "sold:%" PRId64, bucket),
                      PQgetvalue(b, row, 4)) != 0);
        if (bucket > maxb) maxb = bucket;
      }
      /* Buckets missing in between hold nothing: their fields stay absent
       * (counters: absent = 0). */
      OOM_IF(kv_add(&s->stock_target, "n", arena_printf(&t->arena, "%" PRId64, maxb + 1)) != 0);
    }
  }

  /* users */
  {
    PGresult *u = t->res[2];
    for (int row = 0; row < PQntuples(u); row++)
      OOM_IF(kv_add(&t->bought, PQgetvalue(u, row, 0), PQgetvalue(u, row, 1)) != 0);
  }

  /* orders and deadlines */
  {
    PGresult *o = t->res[3];
    for (int row = 0; row < PQntuples(o); row++) {
      int64_t order, tt, bucket, user, qty;
      const char *st = PQgetvalue(o, row, 5);
      rm_pf_rec_t rec;
      char buf[RM_PF_REC_MAX];
      if (cell_i64(o, row, 0, &order) != 0 || cell_i64(o, row, 1, &tt) != 0 ||
          cell_i64(o, row, 2, &bucket) != 0 || cell_i64(o, row, 3, &user) != 0 ||
          cell_i64(o, row, 4, &qty) != 0)
        return RM_E_DB;
      rec.state = st[0];
      rec.tt = (int32_t)tt;
      rec.bucket = (int32_t)bucket;
      rec.qty = (int32_t)qty;
      rec.user = user;
      if (tt < 0 || tt > INT32_MAX || bucket < 0 || bucket > INT32_MAX ||
          rm__pf_rec_format(buf, sizeof(buf), &rec) < 0) {
        rm__errmsg_set("stock_freeze row of order %" PRId64 " is out of range", order);
        return RM_E_DB;
      }
      OOM_IF(kv_add(&t->orders, PQgetvalue(o, row, 0), arena_printf(&t->arena, "%s", buf)) != 0);
      if (rec.state == 'F') {
        tt_state_t *s = tt_find(t, rec.tt);
        if (!s) {
          rm__errmsg_set("stock_freeze row of order %" PRId64 " has no bucket", order);
          return RM_E_DB;
        }
        OOM_IF(kv_add(&s->expiry_target, PQgetvalue(o, row, 0), PQgetvalue(o, row, 6)) != 0);
      }
    }
  }

  kv_sort(&t->meta);
  kv_sort(&t->bought);
  kv_sort(&t->orders);
  for (size_t i = 0; i < t->ntt; i++) {
    kv_sort(&t->tts[i].stock_target);
    kv_sort(&t->tts[i].expiry_target);
  }
  return 0;
}

/* ------------------------------------------------- reconcile: in Redis --- */

static void free_cmds(char **cmds, size_t n) {
  for (size_t i = 0; i < n; i++) redisFreeCommand(cmds[i]);
}

static void free_replies(redisReply **r, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (r[i]) freeReplyObject(r[i]);
}

static bool is_watch_ok(const redisReply *r) {
  return r && r->type == REDIS_REPLY_STATUS && strcmp(r->str, "OK") == 0;
}

/* Format one command into cmds[*n]. */
static int fmt(char **cmds, size_t *lens, size_t *n, int argc, const char **argv) {
  char *cmd = NULL;
  int len = redisFormatCommandArgv(&cmd, argc, argv, NULL);
  if (len < 0) return -1;
  cmds[*n] = cmd;
  lens[*n] = (size_t)len;
  (*n)++;
  return 0;
}

/*
 * One round: WATCH + reads, diff, then MULTI/changes/EXEC (or UNWATCH).
 * 'held': the caller set a hold (hold.lua) before the round; the EXEC
 * deletes it, even when nothing differs.  Returns 0 (done, '*chg' holds
 * the changes made or found), 1 (EXEC aborted: the keys changed, try
 * again), or an error code.  The replies of the reads stay alive in
 * 'reads' (the changes point into them) until the caller frees them.
 */
static bool same_ticket_types(const target_t *a, const target_t *b) {
  if (a->ntt != b->ntt) return false;
  for (size_t i = 0; i < a->ntt; i++)
    if (a->tts[i].tt != b->tts[i].tt) return false;
  return true;
}

static int reconcile_round(rm_prefilter_t *pf, rm_pf_conn_t *c, PGconn *pg, int64_t activity_id, target_t *t,
                           bool dry_run, bool held, changes_t *chg, redisReply **reads, size_t *nreads,
                           bool *broken) {
  size_t nkeys = 3 + 2 * t->ntt, ncmd = 0, nr;
  size_t cap = 1 + 3 + 2 * t->ntt;
  char **cmds = calloc(cap, sizeof(*cmds));
  size_t *lens = calloc(cap, sizeof(*lens));
  const char **argv = calloc(nkeys + 1, sizeof(*argv));
  kvlist_t cur = {0};
  int rc = 0;

  *nreads = 0;
  chg->n = 0;
  if (!cmds || !lens || !argv) {
    rc = RM_E_NOMEM;
    goto out;
  }
  /* WATCH every key, then read them all. */
  argv[0] = "WATCH";
  argv[1] = t->akeys.k[RM_PF_K_META];
  argv[2] = t->akeys.k[RM_PF_K_BOUGHT];
  argv[3] = t->akeys.k[RM_PF_K_ORDERS];
  for (size_t i = 0; i < t->ntt; i++) {
    argv[4 + 2 * i] = t->tts[i].keys.k[RM_PF_K_STOCK];
    argv[5 + 2 * i] = t->tts[i].keys.k[RM_PF_K_EXPIRY];
  }
  if (fmt(cmds, lens, &ncmd, (int)nkeys + 1, argv) != 0) goto oom;
  /* WATCH before PostgreSQL is read: a writer that changes PostgreSQL and
   * then Redis (the stock consumer's confirm or release, an expiry) either
   * committed before the read below, so the target has it, or changes Redis
   * after the WATCH, so EXEC aborts and the round is done again.  Reading
   * PostgreSQL first would let such a writer slip in between and have its
   * Redis change overwritten with the stale target. */
  rc = rm__pf_conn_pipeline(&pf->pool, c, 1, cmds, lens, reads);
  free_cmds(cmds, ncmd);
  ncmd = 0;
  if (rc != 0) {
    *broken = true;
    goto out;
  }
  *nreads = 1;
  if (!is_watch_ok(reads[0])) {
    rm__errmsg_set("unexpected reply to WATCH");
    rc = RM_PF_E_REPLY;
    *broken = true;
    goto out;
  }
  {
    target_t fresh;
    memset(&fresh, 0, sizeof(fresh));
    rc = target_load(pg, activity_id, &fresh);
    if (rc != 0) {
      target_free(&fresh);
      goto unwatch;
    }
    bool same = same_ticket_types(t, &fresh);
    target_free(t);
    *t = fresh;
    if (!same) { /* the keys to watch changed: again, with the new ones */
      rc = 1;
      goto unwatch;
    }
  }
  {
    const char *a[] = {"HGETALL", t->akeys.k[RM_PF_K_META]};
    if (fmt(cmds, lens, &ncmd, 2, a) != 0) goto oom;
    a[1] = t->akeys.k[RM_PF_K_BOUGHT];
    if (fmt(cmds, lens, &ncmd, 2, a) != 0) goto oom;
    a[1] = t->akeys.k[RM_PF_K_ORDERS];
    if (fmt(cmds, lens, &ncmd, 2, a) != 0) goto oom;
  }
  for (size_t i = 0; i < t->ntt; i++) {
    const char *h[] = {"HGETALL", t->tts[i].keys.k[RM_PF_K_STOCK]};
    const char *z[] = {"ZRANGE", t->tts[i].keys.k[RM_PF_K_EXPIRY], "0", "-1", "WITHSCORES"};
    if (fmt(cmds, lens, &ncmd, 2, h) != 0 || fmt(cmds, lens, &ncmd, 5, z) != 0) goto oom;
  }
  nr = ncmd;
  rc = rm__pf_conn_pipeline(&pf->pool, c, ncmd, cmds, lens, reads + 1);
  free_cmds(cmds, ncmd);
  ncmd = 0;
  if (rc != 0) {
    *broken = true;
    goto out;
  }
  *nreads = 1 + nr;

  /* Diff. */
  if (reply_pairs(reads[1], &cur) != 0) goto bad_reply;
  if (diff(chg, CAT_META, t->akeys.k[RM_PF_K_META], &t->meta, &cur, DIFF_SUBSET) != 0) goto oom;
  if (reply_pairs(reads[2], &cur) != 0) goto bad_reply;
  if (diff(chg, CAT_USERS, t->akeys.k[RM_PF_K_BOUGHT], &t->bought, &cur, DIFF_COUNTER) != 0) goto oom;
  if (reply_pairs(reads[3], &cur) != 0) goto bad_reply;
  if (diff(chg, CAT_ORDERS, t->akeys.k[RM_PF_K_ORDERS], &t->orders, &cur, DIFF_EXACT) != 0) goto oom;
  for (size_t i = 0; i < t->ntt; i++) {
    if (reply_pairs(reads[4 + 2 * i], &cur) != 0) goto bad_reply;
    if (diff(chg, CAT_BUCKETS, t->tts[i].keys.k[RM_PF_K_STOCK], &t->tts[i].stock_target, &cur,
             DIFF_COUNTER) != 0)
      goto oom;
    if (reply_pairs(reads[5 + 2 * i], &cur) != 0) goto bad_reply;
    if (diff(chg, CAT_DEADLINES, t->tts[i].keys.k[RM_PF_K_EXPIRY], &t->tts[i].expiry_target, &cur,
             DIFF_ZSET) != 0)
      goto oom;
  }

  /* Apply. */
  {
    redisReply **wr = NULL;
    size_t nexec = chg->n + (held ? 1 : 0); /* the commands between MULTI and EXEC */
    size_t nw = dry_run || nexec == 0 ? 1 : nexec + 2;
    char **wc = calloc(nw, sizeof(*wc));
    size_t *wl = calloc(nw, sizeof(*wl));
    size_t n = 0;
    wr = calloc(nw, sizeof(*wr));
    if (!wc || !wl || !wr) {
      free(wc);
      free(wl);
      free(wr);
      goto oom;
    }
    if (nw == 1) {
      const char *a[] = {"UNWATCH"};
      if (fmt(wc, wl, &n, 1, a) != 0) goto oom_w;
    } else {
      const char *m[] = {"MULTI"};
      if (fmt(wc, wl, &n, 1, m) != 0) goto oom_w;
      for (size_t i = 0; i < chg->n; i++) {
        const change_t *x = &chg->v[i];
        const char *a[4];
        int argc;
        switch (x->kind) {
        case CH_HSET: a[0] = "HSET"; a[1] = x->key; a[2] = x->field; a[3] = x->new_value; argc = 4; break;
        case CH_HDEL: a[0] = "HDEL"; a[1] = x->key; a[2] = x->field; argc = 3; break;
        case CH_ZADD: a[0] = "ZADD"; a[1] = x->key; a[2] = x->new_value; a[3] = x->field; argc = 4; break;
        default: a[0] = "ZREM"; a[1] = x->key; a[2] = x->field; argc = 3; break;
        }
        if (fmt(wc, wl, &n, argc, a) != 0) goto oom_w;
      }
      if (held) {
        const char *h[] = {"HDEL", t->akeys.k[RM_PF_K_META], "hold"};
        if (fmt(wc, wl, &n, 3, h) != 0) goto oom_w;
      }
      const char *e[] = {"EXEC"};
      if (fmt(wc, wl, &n, 1, e) != 0) goto oom_w;
    }
    rc = rm__pf_conn_pipeline(&pf->pool, c, n, wc, wl, wr);
    if (rc != 0) {
      *broken = true;
    } else if (nw > 1) {
      const redisReply *ex = wr[n - 1];
      if (ex->type == REDIS_REPLY_NIL) {
        rc = 1; /* WATCH fired */
      } else if (ex->type != REDIS_REPLY_ARRAY || ex->elements != nexec) {
        rm__errmsg_set("unexpected reply to EXEC");
        for (size_t i = 0; i < n; i++)
          if (wr[i]->type == REDIS_REPLY_ERROR) {
            rm__errmsg_set("Redis refused a reconciliation write: %s", wr[i]->str);
            break;
          }
        rc = RM_PF_E_REDIS;
        *broken = true;
      }
    }
    free_replies(wr, n);
    free_cmds(wc, n);
    free(wc);
    free(wl);
    free(wr);
    goto out;
  oom_w:
    free_cmds(wc, n);
    free(wc);
    free(wl);
    free(wr);
    goto oom;
  }

unwatch: {
    int keep = rc;
    const char *u[] = {"UNWATCH"};
    redisReply *ur = NULL;
    if (fmt(cmds, lens, &ncmd, 1, u) != 0) goto oom;
    if (rm__pf_conn_pipeline(&pf->pool, c, 1, cmds, lens, &ur) != 0) *broken = true;
    free_replies(&ur, ur ? 1 : 0);
    rc = keep;
    goto out;
  }
bad_reply:
  rm__errmsg_set("unexpected reply while reading the activity from Redis");
  rc = RM_PF_E_REPLY;
  *broken = true;
  goto out;
oom:
  rm__errmsg_set("out of memory");
  rc = RM_E_NOMEM;
  *broken = true;
out:
  free_cmds(cmds, ncmd);
  free(cmds);
  free(lens);
  free(argv);
  free(cur.v);
  return rc;
}

static int64_t mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* hold.lua for 'ms': 1 held, 0 nothing to hold (no meta hash), or an
 * error code. */
static int hold_set(rm_prefilter_t *pf, const rm_pf_keys_t *akeys, unsigned ms) {
  char a_ms[16];
  rm__pf_i64_str(a_ms, ms);
  const char *keys[] = {akeys->k[RM_PF_K_META]};
  const char *args[] = {a_ms};
  return rm__pf_eval_code(pf, RM_PF_S_HOLD, 1, keys, 1, args);
}

/* Best effort, after a held round failed: the hold would end at its
 * deadline anyway. */
static void hold_drop(rm_prefilter_t *pf, const rm_pf_keys_t *akeys) {
  rm_pf_conn_t *c;
  redisReply *r = NULL;
  const char *argv[] = {"HDEL", akeys->k[RM_PF_K_META], "hold"};
  if (rm__pf_conn_get(&pf->pool, &c) != 0) return;
  int rc = rm__pf_conn_command(&pf->pool, c, 3, argv, NULL, &r);
  rm__pf_conn_put(&pf->pool, c, rc != 0);
  if (r) freeReplyObject(r);
}

int rm_prefilter_reconcile(rm_prefilter_t *pf, PGconn *pg, int64_t activity_id, bool dry_run,
                           rm_pf_reconcile_t *report, rm_pf_change_cb cb, void *arg) {
  target_t t;
  changes_t chg = {0};
  rm_pf_conn_t *c = NULL;
  redisReply **reads = NULL;
  bool held = false;
  unsigned held_rounds = 0;
  int64_t last_round_ms = 0;
  int rc;

  if (report) memset(report, 0, sizeof(*report));
  if (!pf) return RM_E_INVALID;
  if (!rm__pf_id_ok(activity_id)) {
    rm__errmsg_set("invalid argument: activity id must be >= 1");
    return RM_PF_BAD_ARGS;
  }
  rc = rm__pf_pg_usable(pg, true);
  if (rc != 0) return rc;
  memset(&t, 0, sizeof(t));
  rc = target_load(pg, activity_id, &t);
  if (rc != 0) goto out;
  rc = rm__pf_conn_get(&pf->pool, &c);
  if (rc != 0) goto out;

  for (int attempt = 1;; attempt++) {
    size_t nreads = 0;
    bool broken = false;
    if (!c && (rc = rm__pf_conn_get(&pf->pool, &c)) != 0) goto out; /* the last round broke it */
    free(reads);
    reads = calloc(4 + 2 * t.ntt, sizeof(*reads)); /* each round reads t's keys, t as reloaded */
    if (!reads) {
      rm__errmsg_set("out of memory");
      rc = RM_E_NOMEM;
      goto out;
    }
    /* The sale's writes aborted the last rounds: hold them for about four
     * rounds' time, so this one runs undisturbed (hold.lua).  Not for a
     * dry run: a check does not pause a sale. */
    held = false;
    if (!dry_run && attempt > HOLD_AFTER_ABORTS) {
      int64_t ms = 4 * last_round_ms + 100;
      int hr = hold_set(pf, &t.akeys, (unsigned)(ms > RM_PF_HOLD_MAX_MS ? RM_PF_HOLD_MAX_MS : ms));
      held = hr == 1;
      if (held) held_rounds++;
    }
    int64_t round_start = mono_ms();
    rc = reconcile_round(pf, c, pg, activity_id, &t, dry_run, held, &chg, reads, &nreads, &broken);
    last_round_ms = mono_ms() - round_start;
    if (rc == 0) {
      for (size_t i = 0; i < chg.n; i++) {
        const change_t *x = &chg.v[i];
        if (report) {
          unsigned *slot[] = {&report->meta, &report->buckets, &report->users, &report->orders,
                              &report->deadlines};
          (*slot[x->cat])++;
        }
        if (cb) cb(x->key, x->field, x->old_value, x->new_value, arg);
      }
      if (chg.n)
        RM_LOGGER(&pf->log, dry_run ? RM_LOG_INFO : RM_LOG_WARN,
                  "reconciliation of activity %" PRId64 " %s %zu difference(s) between Redis and "
                  "the stock database",
                  activity_id, dry_run ? "found" : "corrected", chg.n);
    }
    free_replies(reads, nreads);
    if (broken) {
      rm__pf_conn_put(&pf->pool, c, true);
      c = NULL;
    }
    if (rc != 1) break;
    if (attempt == RECONCILE_TRIES) {
      rm__errmsg_set("activity %" PRId64 " changed in Redis during each of %d reconciliation rounds",
                     activity_id, RECONCILE_TRIES);
      rc = RM_PF_E_CONFLICT;
      break;
    }
  }

  if (held && rc != 0) { /* else the last EXEC deleted it */
    char why[512];
    snprintf(why, sizeof(why), "%s", rm_errmsg());
    hold_drop(pf, &t.akeys);
    rm__errmsg_set("%s", why);
  }
  if (held_rounds)
    RM_LOGGER(&pf->log, rc == 0 ? RM_LOG_INFO : RM_LOG_WARN,
              "reconciliation of activity %" PRId64 " held the sale's writes in Redis during %u round(s)%s",
              activity_id, held_rounds, rc == 0 ? "" : ", and still failed");

out:
  if (c) rm__pf_conn_put(&pf->pool, c, rc != 0);
  free(reads);
  free(chg.v);
  target_free(&t);
  return rc;
}

int rm_prefilter_seed(rm_prefilter_t *pf, PGconn *pg, int64_t activity_id) {
  return rm_prefilter_reconcile(pf, pg, activity_id, false, NULL, NULL, NULL);
}

/* ------------------------------------------------------------ expiry --- */

/* Run release.lua or confirm.lua for one order (repairs and orphans). */
static int redis_finish(rm_prefilter_t *pf, const rm_pf_keys_t *ks, int32_t tt, int64_t order,
                        bool confirm) {
  char a_tt[16], a_order[24];
  rm__pf_i64_str(a_tt, tt);
  rm__pf_i64_str(a_order, order);
  const char *args[] = {a_tt, a_order};
  if (confirm) {
    const char *keys[] = {ks->k[RM_PF_K_STOCK], ks->k[RM_PF_K_ORDERS], ks->k[RM_PF_K_EXPIRY],
                          ks->k[RM_PF_K_META]};
    return rm__pf_eval_code(pf, RM_PF_S_CONFIRM, 4, keys, 2, args);
  }
  const char *keys[] = {ks->k[RM_PF_K_STOCK], ks->k[RM_PF_K_BOUGHT], ks->k[RM_PF_K_ORDERS],
                        ks->k[RM_PF_K_EXPIRY], ks->k[RM_PF_K_META]};
  return rm__pf_eval_code(pf, RM_PF_S_RELEASE, 5, keys, 2, args);
}

/* One plain command on a pooled connection. */
static int redis_cmd(rm_prefilter_t *pf, int argc, const char **argv, redisReply **reply) {
  rm_pf_conn_t *c;
  int rc = rm__pf_conn_get(&pf->pool, &c);
  if (rc != 0) return rc;
  rc = rm__pf_conn_command(&pf->pool, c, argc, argv, NULL, reply);
  rm__pf_conn_put(&pf->pool, c, rc != 0);
  if (rc == 0 && (*reply)->type == REDIS_REPLY_ERROR) {
    rm__errmsg_set("Redis refused %s: %s", argv[0], (*reply)->str);
    freeReplyObject(*reply);
    *reply = NULL;
    return RM_PF_E_REDIS;
  }
  return rc;
}

/* Redis alone: expire.lua. */
static int expire_redis_only(rm_prefilter_t *pf, const rm_pf_keys_t *ks, int32_t tt, int64_t now_ms,
                             unsigned max, rm_pf_expired_cb cb, void *arg, unsigned *released) {
  char a_tt[16], a_now[24], a_max[16], err[200];
  redisReply *r = NULL;
  rm_pf_expired_t *x;
  size_t n = 0;
  int rc;
  rm__pf_i64_str(a_tt, tt);
  rm__pf_i64_str(a_now, now_ms);
  rm__pf_i64_str(a_max, max);
  const char *keys[] = {ks->k[RM_PF_K_STOCK], ks->k[RM_PF_K_BOUGHT], ks->k[RM_PF_K_ORDERS],
                        ks->k[RM_PF_K_EXPIRY], ks->k[RM_PF_K_META]};
  const char *args[] = {a_tt, a_now, a_max};
  x = malloc(max * sizeof(*x));
  if (!x) {
    rm__errmsg_set("out of memory");
    return RM_E_NOMEM;
  }
  rc = rm__pf_eval(&pf->pool, RM_PF_S_EXPIRE, 5, keys, 3, args, &r);
  if (rc == 0) {
    rc = rm__pf_parse_expired(r, x, max, &n, err, sizeof(err));
    freeReplyObject(r);
    if (rc == RM_PF_E_REDIS) rm__errmsg_set("Redis refused script \"expire\": %s", err);
    if (rc == RM_PF_E_REPLY) rm__errmsg_set("unexpected reply to script \"expire\"");
  }
  for (size_t i = 0; rc == 0 && i < n; i++) {
    (*released)++;
    if (cb) cb(x[i].order_id, x[i].user_id, x[i].qty, x[i].bucket, false, arg);
  }
  free(x);
  return rc;
}

/* Step 1: PostgreSQL releases its due rows, then Redis follows. */
static int expire_pg_due(rm_prefilter_t *pf, PGconn *pg, const rm_pf_keys_t *ks, int64_t activity_id,
                         int32_t tt, int64_t now_ms, unsigned max, rm_pf_expired_cb cb, void *arg,
                         unsigned *released) {
  char s[4][24];
  const char *vals[4] = {s[0], s[1], s[2], s[3]};
  PGresult *res;
  int rc = 0;
  rm__pf_i64_str(s[0], activity_id);
  rm__pf_i64_str(s[1], tt);
  rm__pf_i64_str(s[2], now_ms);
  rm__pf_i64_str(s[3], max);
  /* Autocommit: the releases are durable when this returns. */
  res = pg_exec(pg,
                "SELECT expired_order_id, expired_user_id, expired_bucket_id, expired_qty "
                "FROM stock_freeze_expire($1::bigint, $2::integer, "
                "timestamptz 'epoch' + $3::bigint * interval '1 millisecond', $4::integer)",
                4, vals);
  if (!res) return RM_E_DB;
  for (int row = 0; row < PQntuples(res); row++) {
    int64_t order, user, bucket, qty;
    int r;
    if (cell_i64(res, row, 0, &order) != 0 || cell_i64(res, row, 1, &user) != 0 ||
        cell_i64(res, row, 2, &bucket) != 0 || cell_i64(res, row, 3, &qty) != 0) {
      rc = RM_E_DB;
      continue;
    }
    (*released)++;
    if (cb) cb(order, user, (int32_t)qty, (int32_t)bucket, false, arg);
    /* Released in PostgreSQL: now in Redis.  "Already released" or "unknown"
     * there is fine (a concurrent sweep, or Redis lost it: reconcile); a
     * transport failure leaves Redis frozen with a due deadline, which the
     * next sweep's step 2 repairs. */
    r = redis_finish(pf, ks, tt, order, false);
    if (r == RM_PF_ALREADY_CONFIRMED)
      RM_LOGGER(&pf->log, RM_LOG_ERROR,
                "order %" PRId64 " expired in the stock database but is confirmed in Redis", order);
    else if (r < 0 && r != RM_PF_ALREADY_RELEASED && r != RM_PF_UNKNOWN_ORDER && rc == 0)
      rc = r;
  }
  PQclear(res);
  return rc;
}

/* Step 2: Redis's due entries that PostgreSQL did not release just now. */
static int expire_redis_due(rm_prefilter_t *pf, PGconn *pg, const rm_pf_keys_t *ks, int32_t tt,
                            int64_t now_ms, unsigned max, rm_pf_expired_cb cb, void *arg,
                            unsigned *released) {
  char a_now[24], a_max[16];
  redisReply *due = NULL, *recs = NULL;
  PGresult *res = NULL;
  const char **argv = NULL;
  char *arr = NULL;
  int rc;

  rm__pf_i64_str(a_now, now_ms);
  rm__pf_i64_str(a_max, max);
  {
    const char *a[] = {"ZRANGEBYSCORE", ks->k[RM_PF_K_EXPIRY], "-inf", a_now, "LIMIT", "0", a_max};
    rc = redis_cmd(pf, 7, a, &due);
  }
  if (rc != 0) return rc;
  if (due->type != REDIS_REPLY_ARRAY) {
    rm__errmsg_set("unexpected reply to ZRANGEBYSCORE");
    rc = RM_PF_E_REPLY;
    goto out;
  }
  if (due->elements == 0) goto out;

  /* Their records (for orphans: user, qty, bucket) and their rows. */
  argv = calloc(due->elements + 2, sizeof(*argv));
  arr = malloc(due->elements * 21 + 3);
  if (!argv || !arr) {
    rc = RM_E_NOMEM;
    rm__errmsg_set("out of memory");
    goto out;
  }
  argv[0] = "HMGET";
  argv[1] = ks->k[RM_PF_K_ORDERS];
  {
    size_t off = 0;
    arr[off++] = '{';
    for (size_t i = 0; i < due->elements; i++) {
      const redisReply *e = due->element[i];
      int64_t id;
      if (e->type != REDIS_REPLY_STRING || rm__pf_parse_i64(e->str, e->len, &id) != 0 || id < 1 ||
          e->len > 19) {
        rc = RM_PF_E_REPLY;
        rm__errmsg_set("unexpected member in the expiry zset");
        goto out;
      }
      argv[2 + i] = e->str;
      if (i) arr[off++] = ',';
      memcpy(arr + off, e->str, e->len);
      off += e->len;
    }
    arr[off++] = '}';
    arr[off] = '\0';
  }
  rc = redis_cmd(pf, (int)due->elements + 2, argv, &recs);
  if (rc != 0) goto out;
  if (recs->type != REDIS_REPLY_ARRAY || recs->elements != due->elements) {
    rm__errmsg_set("unexpected reply to HMGET");
    rc = RM_PF_E_REPLY;
    goto out;
  }
  {
    const char *vals[1] = {arr};
    res = pg_exec(pg,
                  "SELECT order_id, left(state, 1), (extract(epoch FROM deadline) * 1000)::bigint "
                  "FROM stock_freeze WHERE order_id = ANY($1::bigint[])",
                  1, vals);
    if (!res) {
      rc = RM_E_DB;
      goto out;
    }
  }

  for (size_t i = 0; i < due->elements; i++) {
    const char *order_s = due->element[i]->str;
    int64_t order = 0, deadline = 0;
    char state = 0;
    int r = 0;
    rm__pf_parse_i64(order_s, strlen(order_s), &order);
    for (int row = 0; row < PQntuples(res); row++) {
      if (strcmp(PQgetvalue(res, row, 0), order_s) == 0) {
        state = PQgetvalue(res, row, 1)[0];
        if (cell_i64(res, row, 2, &deadline) != 0) state = 0;
        break;
      }
    }
    if (state == 'R' || state == 'C') {
      /* PostgreSQL decided before (a crash or a lost Redis call between the
       * two): the same in Redis. */
      r = redis_finish(pf, ks, tt, order, state == 'C');
      if (r == 0)
        RM_LOGGER(&pf->log, RM_LOG_INFO, "order %" PRId64 " repaired in Redis: %s in the stock database",
                  order, state == 'C' ? "confirmed" : "released");
    } else if (state == 'F') {
      if (deadline > now_ms) {
        /* PostgreSQL's deadline is later (extended): correct the index. */
        char dl[24];
        redisReply *z = NULL;
        rm__pf_i64_str(dl, deadline);
        const char *a[] = {"ZADD", ks->k[RM_PF_K_EXPIRY], "XX", dl, order_s};
        r = redis_cmd(pf, 5, a, &z);
        if (z) freeReplyObject(z);
      }
      /* Else due there too but not taken by step 1 (its limit, or a
       * concurrent sweep holds the row): a later sweep takes it. */
    } else {
      /* Orphan: Redis froze it, PostgreSQL never recorded it. */
      const redisReply *rec = recs->element[i];
      rm_pf_rec_t pr;
      bool have = rec->type == REDIS_REPLY_STRING && rm__pf_rec_parse(rec->str, rec->len, &pr) == 0;
      r = redis_finish(pf, ks, tt, order, false);
      if (r == 0) {
        (*released)++;
        RM_LOGGER(&pf->log, RM_LOG_INFO,
                  "order %" PRId64 " released in Redis: expired, never recorded in the stock database",
                  order);
        if (cb && have) cb(order, pr.user, pr.qty, pr.bucket, true, arg);
      }
    }
    if (r < 0 && r != RM_PF_ALREADY_RELEASED && r != RM_PF_ALREADY_CONFIRMED &&
        r != RM_PF_UNKNOWN_ORDER && rc == 0)
      rc = r;
  }

out:
  PQclear(res);
  free(argv);
  free(arr);
  if (due) freeReplyObject(due);
  if (recs) freeReplyObject(recs);
  return rc;
}

int rm_prefilter_expire(rm_prefilter_t *pf, PGconn *pg, int64_t activity_id, int32_t ticket_type,
                        int64_t now_ms, unsigned max, rm_pf_expired_cb cb, void *arg,
                        unsigned *released) {
  rm_pf_keys_t ks;
  unsigned count = 0;
  int rc;
  if (released) *released = 0;
  if (!pf) return RM_E_INVALID;
  if (rm__pf_keys_build(&ks, activity_id, ticket_type) != 0 || max < 1 || max > EXPIRE_MAX ||
      (now_ms != 0 && !rm__pf_ms_ok(now_ms))) {
    rm__errmsg_set("invalid argument: expire needs an activity id >= 1, a ticket type >= 0 and a "
                   "maximum of 1 to 10000");
    return rm__pf_count(pf, RM_PF_OP_EXPIRE, RM_PF_BAD_ARGS);
  }
  if (now_ms == 0) now_ms = rm__pf_unix_ms();
  if (!pg) {
    rc = expire_redis_only(pf, &ks, ticket_type, now_ms, max, cb, arg, &count);
  } else {
    rc = rm__pf_pg_usable(pg, true);
    if (rc == 0)
      rc = expire_pg_due(pf, pg, &ks, activity_id, ticket_type, now_ms, max, cb, arg, &count);
    if (rc == 0)
      rc = expire_redis_due(pf, pg, &ks, ticket_type, now_ms, max, cb, arg, &count);
  }
  if (released) *released = count;
  return rm__pf_count(pf, RM_PF_OP_EXPIRE, rc);
}
