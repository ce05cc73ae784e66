/*
 * test_prefilter.c - librmclient's Redis prefilter against a real Redis and
 * the real stock database.
 *
 * Usage: scripts/with-servers --pg --redis -- test_prefilter main
 *        scripts/with-servers --pg --redis --aof -- test_prefilter restart
 *
 * NOTES
 *   Servers: REDIS_URL (and REDIS_PID, REDIS_DIR) and STOCK_PG_URL come from
 *   scripts/with-servers; the restart group also needs TX_SOURCE_DIR (set
 *   by ctest) to run scripts/redis-tmp.  Without the variables every test
 *   is skipped.  Each test uses its own activity ids, so tests do not
 *   depend on their order.
 *
 *   What is checked (issue 5):
 *     - load: 2,000 buyers (plus 500 second tries) on 100 threads over 4
 *       prefilter objects (up to 128 connections) against 500 tickets with
 *       a limit of 2, with 1, 5 and 16 buckets: exactly 500 frozen, nobody
 *       above the limit, every other answer sold out or over limit, the
 *       counters agree;
 *     - confirm and release racing each other and themselves, on Redis
 *       alone and PostgreSQL-first: one winner per order, totals conserved;
 *     - malformed arguments, through the API and as raw EVALSHA: an error
 *       code and not one byte changed in Redis;
 *     - waitlist join/fill: order, one entry per user, skipping and
 *       dropping;
 *     - NOSCRIPT after SCRIPT FLUSH; no call hangs when Redis is gone,
 *       stopped (SIGSTOP) or never answers;
 *     - expiry: due freezes released exactly once by concurrent sweeps
 *       racing confirms, orphans, repairs, and after Redis lost everything
 *       (rebuilt from PostgreSQL);
 *     - a reconciliation's hold: every writing script refuses without a
 *       change while it lasts, the library waits it out (or gives up with
 *       RM_PF_E_HELD), and reconciliations succeed under writers that never
 *       pause (they all fail without the hold);
 *     - restart: Redis killed (-9) and restarted with AOF in the middle of
 *       a load that records every freeze in PostgreSQL; after
 *       reconciliation Redis and PostgreSQL agree, and expiry still works.
 *
 *   Threads: worker threads never call cmocka (its failures longjmp);
 *   they record results that the main thread asserts.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <hiredis/hiredis.h>
#include <inttypes.h>
#include <libpq-fe.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "rm_client.h"
#include "itest_redis.h"

static const char *redis_url, *stock_url;
static redisContext *raw; /* the main thread's own look into Redis */
static PGconn *pg;        /* the main thread's stock database connection */

/* ------------------------------------------------------------- helpers --- */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int64_t unix_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static void log_cb(int level, const char *msg, void *arg) {
  (void)arg;
  if (level <= RM_LOG_ERROR || getenv("RM_TEST_VERBOSE")) fprintf(stderr, "  [prefilter %d] %s\n", level, msg);
}

static rm_prefilter_t *pf_new(unsigned max_conns) {
  rm_pf_options_t o = {0};
  rm_prefilter_t *pf = NULL;
  o.max_connections = max_conns;
  o.log_cb = log_cb;
  o.log_level = RM_LOG_DEBUG;
  assert_int_equal(rm_prefilter_new(redis_url, &o, &pf), 0);
  return pf;
}

static void pg_ok(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void pg_ok(const char *fmt, ...) {
  char sql[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(sql, sizeof(sql), fmt, ap);
  va_end(ap);
  PGresult *r = PQexec(pg, sql);
  if (PQresultStatus(r) != PGRES_COMMAND_OK && PQresultStatus(r) != PGRES_TUPLES_OK)
    fail_msg("%s: %s", sql, PQerrorMessage(pg));
  PQclear(r);
}

static long long pg_ll(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static long long pg_ll(const char *fmt, ...) {
  char sql[2048];
  va_list ap;
  long long v;
  va_start(ap, fmt);
  vsnprintf(sql, sizeof(sql), fmt, ap);
  va_end(ap);
  PGresult *r = PQexec(pg, sql);
  if (PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) != 1)
    fail_msg("%s: %s", sql, PQerrorMessage(pg));
  v = PQgetisnull(r, 0, 0) ? 0 : atoll(PQgetvalue(r, 0, 0));
  PQclear(r);
  return v;
}

/* Activity 'act' with 'stock' tickets of type 'tt' over 'nb' buckets. */
static void seed_pg(int64_t act, int status, int limit, int tt, int nb, int stock) {
  pg_ok("INSERT INTO activity (activity_id, name, status, per_user_limit, starts_at, ends_at) "
        "VALUES (%" PRId64 ", 'prefilter test', %d, %d, now(), now() + interval '1 day') "
        "ON CONFLICT (activity_id) DO NOTHING",
        act, status, limit);
  pg_ok("INSERT INTO activity_ticket_bucket (activity_id, ticket_type, bucket_id, stock) "
        "SELECT %" PRId64 ", %d, b, %d / %d + CASE WHEN b < %d %% %d THEN 1 ELSE 0 END "
        "FROM generate_series(0, %d - 1) b",
        act, tt, stock, nb, stock, nb, nb);
}

/* A command on the main thread's own connection (itest_rcmd). */
#define rcmd(...) itest_rcmd(raw, __VA_ARGS__)

/* Sum of the "<what>:i" fields of the stock hash of (act, tt). */
static long long bucket_sum(int64_t act, int tt, const char *what) {
  redisReply *r = rcmd("HGETALL {act_%" PRId64 "}:t%d:stock", act, tt);
  long long sum = 0;
  size_t wl = strlen(what);
  for (size_t i = 0; i + 1 < r->elements; i += 2)
    if (strncmp(r->element[i]->str, what, wl) == 0 && r->element[i]->str[wl] == ':')
      sum += atoll(r->element[i + 1]->str);
  freeReplyObject(r);
  return sum;
}

/* Every bucket: frozen + sold <= stock, none negative.  Returns buckets. */
static int check_buckets(int64_t act, int tt) {
  redisReply *n = rcmd("HGET {act_%" PRId64 "}:t%d:stock n", act, tt);
  int nb = n->str ? atoi(n->str) : 0;
  freeReplyObject(n);
  for (int b = 0; b < nb; b++) {
    redisReply *r = rcmd("HMGET {act_%" PRId64 "}:t%d:stock stock:%d frozen:%d sold:%d", act, tt, b, b, b);
    long long s = r->element[0]->str ? atoll(r->element[0]->str) : 0;
    long long f = r->element[1]->str ? atoll(r->element[1]->str) : 0;
    long long d = r->element[2]->str ? atoll(r->element[2]->str) : 0;
    freeReplyObject(r);
    if (f < 0 || d < 0 || f + d > s) fail_msg("bucket %d of activity %" PRId64 ": stock %lld frozen %lld sold %lld", b, act, s, f, d);
  }
  return nb;
}

static long long user_bought(int64_t act, int64_t user) {
  redisReply *r = rcmd("HGET {act_%" PRId64 "}:bought %" PRId64, act, user);
  long long v = r->str ? atoll(r->str) : 0;
  freeReplyObject(r);
  return v;
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Everything Redis holds for (act, tt), as one string. */
static char *snapshot(int64_t act, int tt) {
  static const char *const hashes[] = {"meta", "bought", "orders"};
  static const char *const tthashes[] = {"stock", "wlq"};
  static const char *const zsets[] = {"expiry", "wl"};
  size_t cap = 1 << 16, len = 0;
  char *out = malloc(cap);
  assert_non_null(out);
  out[0] = '\0';
#define SNAP_APPEND(...)                                                       \
  do {                                                                         \
    int n_ = snprintf(out + len, cap - len, __VA_ARGS__);                      \
    if (n_ < 0 || (size_t)n_ >= cap - len) fail_msg("snapshot too large");     \
    len += (size_t)n_;                                                         \
  } while (0)
  for (int k = 0; k < 7; k++) {
    char key[96];
    redisReply *r;
    if (k < 3) {
      snprintf(key, sizeof(key), "{act_%" PRId64 "}:%s", act, hashes[k]);
      r = rcmd("HGETALL %s", key);
    } else if (k < 5) {
      snprintf(key, sizeof(key), "{act_%" PRId64 "}:t%d:%s", act, tt, tthashes[k - 3]);
      r = rcmd("HGETALL %s", key);
    } else {
      snprintf(key, sizeof(key), "{act_%" PRId64 "}:t%d:%s", act, tt, zsets[k - 5]);
      r = rcmd("ZRANGE %s 0 -1 WITHSCORES", key);
    }
    /* HGETALL order is not stable across rehashes: sort the pairs. */
    size_t np = r->elements / 2;
    char **pairs = calloc(np + 1, sizeof(*pairs));
    for (size_t i = 0; i < np; i++) {
      size_t l = r->element[2 * i]->len + r->element[2 * i + 1]->len + 2;
      pairs[i] = malloc(l);
      snprintf(pairs[i], l, "%s=%s", r->element[2 * i]->str, r->element[2 * i + 1]->str);
    }
    if (k < 5 && np > 1) qsort(pairs, np, sizeof(*pairs), cmp_str);
    SNAP_APPEND("%s:", key);
    for (size_t i = 0; i < np; i++) {
      SNAP_APPEND(" %s", pairs[i]);
      free(pairs[i]);
    }
    SNAP_APPEND("\n");
    free(pairs);
    freeReplyObject(r);
  }
  {
    redisReply *r = rcmd("GET {act_%" PRId64 "}:t%d:wlseq", act, tt);
    SNAP_APPEND("wlseq %s\n", r->str ? r->str : "-");
    freeReplyObject(r);
  }
#undef SNAP_APPEND
  return out;
}

/* Run 'fn(i)' on 'n' threads at once (after a common start line). */
typedef struct run {
  void *(*fn)(void *);
  void *arg;
  int idx;
} run_t;

static pthread_barrier_t start_line;

static void *run_main(void *p) {
  run_t *r = p;
  pthread_barrier_wait(&start_line);
  return r->fn(r);
}

static void run_threads(int n, void *(*fn)(void *), void *arg) {
  pthread_t *t = calloc((size_t)n, sizeof(*t));
  run_t *r = calloc((size_t)n, sizeof(*r));
  assert_non_null(t);
  assert_non_null(r);
  pthread_barrier_init(&start_line, NULL, (unsigned)n);
  for (int i = 0; i < n; i++) {
    r[i] = (run_t){fn, arg, i};
    assert_int_equal(pthread_create(&t[i], NULL, run_main, &r[i]), 0);
  }
  for (int i = 0; i < n; i++) pthread_join(t[i], NULL);
  pthread_barrier_destroy(&start_line);
  free(t);
  free(r);
}

/* (Re)open the main thread's own connection to Redis. */
static int raw_connect(void) {
  if (raw) redisFree(raw);
  raw = itest_redis_connect(redis_url);
  return raw ? 0 : -1;
}

static int group_setup(void **state) {
  (void)state;
  redis_url = getenv("REDIS_URL");
  stock_url = getenv("STOCK_PG_URL");
  if (!redis_url || !stock_url) {
    fprintf(stderr, "test_prefilter: REDIS_URL or STOCK_PG_URL not set; run me under "
                    "scripts/with-servers --pg --redis\n");
    return 0;
  }
  if (raw_connect() != 0) return -1;
  pg = PQconnectdb(stock_url);
  if (PQstatus(pg) != CONNECTION_OK) return -1;
  return 0;
}

static int group_teardown(void **state) {
  (void)state;
  if (raw) redisFree(raw);
  raw = NULL;
  if (pg) PQfinish(pg);
  pg = NULL;
  return 0;
}

#define NEED_SERVERS()                                                                             \
  do {                                                                                             \
    if (!redis_url || !stock_url) skip();                                                          \
  } while (0)

/* ---------------------------------------------------------------- load --- */

#define LOAD_USERS 2000
#define LOAD_TRIES (LOAD_USERS + LOAD_USERS / 4)
#define LOAD_THREADS 100
#define LOAD_PFS 4
#define LOAD_STOCK 500
#define LOAD_LIMIT 2

typedef struct load {
  rm_prefilter_t *pf[LOAD_PFS];
  int64_t act;
  int64_t user[LOAD_TRIES];
  int qty[LOAD_TRIES];
  int thread[LOAD_TRIES];
  int rc[LOAD_TRIES];
  int bucket[LOAD_TRIES];
} load_t;

static void *load_worker(void *p) {
  run_t *r = p;
  load_t *l = r->arg;
  rm_prefilter_t *pf = l->pf[r->idx % LOAD_PFS];
  for (int i = 0; i < LOAD_TRIES; i++) {
    if (l->thread[i] != r->idx) continue;
    l->rc[i] = rm_prefilter_freeze(pf, l->act, 1, l->user[i], l->act * 100000 + i + 1, l->qty[i],
                                   &l->bucket[i]);
  }
  return NULL;
}

static void load_run(int nbuckets) {
  load_t *l = calloc(1, sizeof(*l));
  int n = 0;
  long long frozen = 0, ok = 0, sold_out = 0, over = 0, other = 0;
  long long held[LOAD_USERS + 1] = {0};
  assert_non_null(l);
  l->act = 1000 + nbuckets;
  seed_pg(l->act, 1, LOAD_LIMIT, 1, nbuckets, LOAD_STOCK);
  for (int i = 0; i < LOAD_PFS; i++) l->pf[i] = pf_new(32);
  assert_int_equal(rm_prefilter_seed(l->pf[0], pg, l->act), 0);
  assert_int_equal(check_buckets(l->act, 1), nbuckets);
  assert_int_equal(bucket_sum(l->act, 1, "stock"), LOAD_STOCK);

  /* User u wants 1 or 2 tickets; every fourth tries again for one more
   * (on the same thread, right after): over the limit if the first won. */
  for (int u = 0; u < LOAD_USERS; u++) {
    int t = u % LOAD_THREADS;
    l->user[n] = u + 1;
    l->qty[n] = 1 + u % 2;
    l->thread[n++] = t;
    if (u % 4 == 3) {
      l->user[n] = u + 1;
      l->qty[n] = 1;
      l->thread[n++] = t;
    }
  }
  assert_int_equal(n, LOAD_TRIES);

  double t0 = now_s();
  run_threads(LOAD_THREADS, load_worker, l);
  double dt = now_s() - t0;

  for (int i = 0; i < LOAD_TRIES; i++) {
    if (l->rc[i] == 0) {
      ok++;
      frozen += l->qty[i];
      held[l->user[i]] += l->qty[i];
      if (l->bucket[i] < 0 || l->bucket[i] >= nbuckets) fail_msg("bucket %d out of range", l->bucket[i]);
    } else if (l->rc[i] == RM_PF_SOLD_OUT) {
      sold_out++;
    } else if (l->rc[i] == RM_PF_OVER_LIMIT) {
      over++;
    } else {
      other++;
      fprintf(stderr, "  try %d: %s (%s)\n", i, rm_prefilter_strerror(l->rc[i]), rm_prefilter_errmsg());
    }
  }
  printf("  %d bucket(s): %d tries in %.2f s on %d threads: %lld frozen by %lld orders, "
         "%lld sold out, %lld over limit\n",
         nbuckets, LOAD_TRIES, dt, LOAD_THREADS, frozen, ok, sold_out, over);
  assert_int_equal(other, 0);
  assert_int_equal(frozen, LOAD_STOCK);
  assert_true(sold_out > 0);
  assert_true(over > 0);
  assert_int_equal(bucket_sum(l->act, 1, "frozen"), LOAD_STOCK);
  assert_int_equal(bucket_sum(l->act, 1, "sold"), 0);
  check_buckets(l->act, 1);
  for (int u = 1; u <= LOAD_USERS; u++) {
    if (held[u] > LOAD_LIMIT) fail_msg("user %d holds %lld", u, held[u]);
    if (user_bought(l->act, u) != held[u]) fail_msg("user %d: Redis says %lld, calls say %lld", u, user_bought(l->act, u), held[u]);
  }
  {
    redisReply *r = rcmd("HLEN {act_%" PRId64 "}:orders", l->act);
    assert_int_equal(r->integer, ok);
    freeReplyObject(r);
    r = rcmd("ZCARD {act_%" PRId64 "}:t1:expiry", l->act);
    assert_int_equal(r->integer, ok);
    freeReplyObject(r);
  }
  /* The counters saw the same. */
  {
    rm_pf_counts_t sum = {0};
    for (int i = 0; i < LOAD_PFS; i++) {
      rm_pf_stats_t st;
      rm_prefilter_stats(l->pf[i], &st);
      sum.ok += st.freeze.ok;
      sum.sold_out += st.freeze.sold_out;
      sum.over_limit += st.freeze.over_limit;
      sum.unknown_outcome += st.freeze.unknown_outcome;
      sum.not_sent += st.freeze.not_sent;
      assert_true(st.open_connections <= 32);
    }
    assert_int_equal(sum.ok, ok);
    assert_int_equal(sum.sold_out, sold_out);
    assert_int_equal(sum.over_limit, over);
    assert_int_equal(sum.unknown_outcome + sum.not_sent, 0);
  }
  for (int i = 0; i < LOAD_PFS; i++) rm_prefilter_free(l->pf[i]);
  free(l);
}

static void test_load_1_bucket(void **state) {
  (void)state;
  NEED_SERVERS();
  load_run(1);
}

static void test_load_5_buckets(void **state) {
  (void)state;
  NEED_SERVERS();
  load_run(5);
}

static void test_load_16_buckets(void **state) {
  (void)state;
  NEED_SERVERS();
  load_run(16);
}

/* ---------------------------------------------------------------- race --- */

#define RACE_ORDERS 200
#define RACE_THREADS 8

typedef struct race {
  rm_prefilter_t *pf;
  int64_t act;
  bool use_pg;
  int qty[RACE_ORDERS];
  int op[RACE_THREADS][RACE_ORDERS];      /* 0 confirm, 1 release */
  int rc[RACE_THREADS][RACE_ORDERS];      /* Redis result (Redis race) or PostgreSQL's */
  int redis_rc[RACE_THREADS][RACE_ORDERS]; /* PostgreSQL-first: Redis after a PG win */
  atomic_int errors;
} race_t;

static int64_t race_order(const race_t *r, int i) { return r->act * 100000 + i + 1; }

static void *race_worker(void *p) {
  run_t *run = p;
  race_t *r = run->arg;
  int t = run->idx;
  PGconn *c = NULL;
  if (r->use_pg) {
    c = PQconnectdb(stock_url);
    if (PQstatus(c) != CONNECTION_OK) {
      atomic_fetch_add(&r->errors, 1);
      PQfinish(c);
      return NULL;
    }
  }
  for (int k = 0; k < RACE_ORDERS; k++) {
    /* Each thread walks the orders in its own order (the multipliers are
     * prime to RACE_ORDERS, so each walk visits every order once). */
    static const int mult[RACE_THREADS] = {1, 3, 7, 9, 11, 13, 17, 19};
    int i = (int)(((long)k * mult[t] + 37L * t) % RACE_ORDERS);
    int op = r->op[t][i];
    int64_t order = race_order(r, i);
    if (!r->use_pg) {
      r->rc[t][i] = op == 0 ? rm_prefilter_confirm(r->pf, r->act, 1, order)
                            : rm_prefilter_release(r->pf, r->act, 1, order);
    } else {
      r->rc[t][i] = op == 0 ? rm_prefilter_pg_confirm(c, order) : rm_prefilter_pg_release(c, order);
      r->redis_rc[t][i] = 1; /* not called */
      if (r->rc[t][i] == 0)
        r->redis_rc[t][i] = op == 0 ? rm_prefilter_confirm(r->pf, r->act, 1, order)
                                    : rm_prefilter_release(r->pf, r->act, 1, order);
    }
  }
  PQfinish(c);
  return NULL;
}

static void race_run(bool use_pg) {
  race_t *r = calloc(1, sizeof(*r));
  long long sold = 0, released_qty = 0, total_stock = 400;
  assert_non_null(r);
  r->act = use_pg ? 2002 : 2001;
  r->use_pg = use_pg;
  seed_pg(r->act, 1, 10, 1, 4, (int)total_stock);
  r->pf = pf_new(RACE_THREADS);
  assert_int_equal(rm_prefilter_seed(r->pf, pg, r->act), 0);
  int64_t deadline = unix_ms() + 3600000;
  for (int i = 0; i < RACE_ORDERS; i++) {
    int b = -1;
    r->qty[i] = 1 + i % 2;
    assert_int_equal(rm_prefilter_freeze_until(r->pf, r->act, 1, 50000 + i, race_order(r, i), r->qty[i],
                                               deadline, &b), 0);
    if (use_pg) assert_int_equal(rm_prefilter_pg_freeze(pg, r->act, 1, b, 50000 + i, race_order(r, i),
                                                        r->qty[i], deadline), 0);
  }
  unsigned seed = use_pg ? 7 : 3;
  for (int t = 0; t < RACE_THREADS; t++)
    for (int i = 0; i < RACE_ORDERS; i++) {
      r->op[t][i] = rand_r(&seed) % 2;
      r->rc[t][i] = 1; /* "not run": no API call returns 1 */
    }

  run_threads(RACE_THREADS, race_worker, r);
  assert_int_equal(atomic_load(&r->errors), 0);

  for (int i = 0; i < RACE_ORDERS; i++) {
    int wins = 0, winner = -1;
    for (int t = 0; t < RACE_THREADS; t++)
      if (r->rc[t][i] == 0) {
        wins++;
        winner = r->op[t][i];
        if (use_pg && r->redis_rc[t][i] != 0)
          fail_msg("order %d: PostgreSQL decided, Redis answered %s", i, rm_prefilter_strerror(r->redis_rc[t][i]));
      }
    if (wins != 1) fail_msg("order %d: %d winners", i, wins);
    int loser_code = winner == 0 ? RM_PF_ALREADY_CONFIRMED : RM_PF_ALREADY_RELEASED;
    for (int t = 0; t < RACE_THREADS; t++)
      if (r->rc[t][i] != 0 && r->rc[t][i] != loser_code)
        fail_msg("order %d: winner %s, thread %d got %s", i, winner ? "release" : "confirm", t,
                 rm_prefilter_strerror(r->rc[t][i]));
    if (winner == 0) {
      sold += r->qty[i];
      if (user_bought(r->act, 50000 + i) != r->qty[i]) fail_msg("order %d: user count wrong", i);
    } else {
      released_qty += r->qty[i];
      if (user_bought(r->act, 50000 + i) != 0) fail_msg("order %d: user count not released", i);
    }
  }
  printf("  %s: %d orders x %d threads: %lld tickets sold, %lld released\n",
         use_pg ? "PostgreSQL first" : "Redis", RACE_ORDERS, RACE_THREADS, sold, released_qty);
  /* Conservation: nothing frozen any more, sold as decided, stock intact. */
  assert_int_equal(bucket_sum(r->act, 1, "frozen"), 0);
  assert_int_equal(bucket_sum(r->act, 1, "sold"), sold);
  assert_int_equal(bucket_sum(r->act, 1, "stock"), total_stock);
  check_buckets(r->act, 1);
  {
    redisReply *z = rcmd("ZCARD {act_%" PRId64 "}:t1:expiry", r->act);
    assert_int_equal(z->integer, 0);
    freeReplyObject(z);
  }
  if (use_pg) {
    assert_int_equal(pg_ll("SELECT sum(frozen_count) FROM activity_ticket_bucket WHERE activity_id = %" PRId64, r->act), 0);
    assert_int_equal(pg_ll("SELECT sum(sold_count) FROM activity_ticket_bucket WHERE activity_id = %" PRId64, r->act), sold);
    assert_int_equal(pg_ll("SELECT count(*) FROM stock_freeze WHERE activity_id = %" PRId64 " AND state = 'FROZEN'", r->act), 0);
    /* The ledger: exactly one confirm or release per order. */
    assert_int_equal(pg_ll("SELECT count(*) FROM (SELECT order_id FROM stock_log WHERE activity_id = %" PRId64
                           " AND op IN ('confirm', 'release') GROUP BY order_id HAVING count(*) <> 1) x", r->act), 0);
    assert_int_equal(pg_ll("SELECT count(DISTINCT order_id) FROM stock_log WHERE activity_id = %" PRId64
                           " AND op IN ('confirm', 'release')", r->act), RACE_ORDERS);
    /* And Redis agrees with PostgreSQL. */
    rm_pf_reconcile_t rep;
    assert_int_equal(rm_prefilter_reconcile(r->pf, pg, r->act, true, &rep, NULL, NULL), 0);
    assert_int_equal(rep.meta + rep.buckets + rep.users + rep.orders + rep.deadlines, 0);
  }
  rm_prefilter_free(r->pf);
  free(r);
}

static void test_race_redis(void **state) {
  (void)state;
  NEED_SERVERS();
  race_run(false);
}

static void test_race_pg_first(void **state) {
  (void)state;
  NEED_SERVERS();
  race_run(true);
}

/* ----------------------------------------------------------- malformed --- */

static void test_malformed(void **state) {
  (void)state;
  NEED_SERVERS();
  const int64_t act = 3001;
  rm_prefilter_t *pf = pf_new(4);
  char sha[41], *before, *after;
  int b = -1;
  long pos;
  seed_pg(act, 1, 2, 1, 2, 10);
  assert_int_equal(rm_prefilter_seed(pf, pg, act), 0);
  /* Some state worth protecting: a frozen order and a waiting user. */
  assert_int_equal(rm_prefilter_freeze(pf, act, 1, 7, 42, 1, &b), 0);
  assert_int_equal(rm_prefilter_waitlist_join(pf, act, 1, 8, 1, &pos), 0);
  before = snapshot(act, 1);

  /* Through the API: refused before any round trip. */
  const int32_t bad_qty[] = {0, -1, 10001, INT32_MAX, INT32_MIN};
  for (size_t i = 0; i < sizeof(bad_qty) / sizeof(bad_qty[0]); i++) {
    assert_int_equal(rm_prefilter_freeze(pf, act, 1, 9, 43, bad_qty[i], &b), RM_PF_BAD_ARGS);
    assert_int_equal(rm_prefilter_waitlist_join(pf, act, 1, 9, bad_qty[i], &pos), RM_PF_BAD_ARGS);
  }
  assert_int_equal(rm_prefilter_freeze(pf, act, 1, 0, 43, 1, &b), RM_PF_BAD_ARGS);
  assert_int_equal(rm_prefilter_freeze(pf, act, 1, -9, 43, 1, &b), RM_PF_BAD_ARGS);
  assert_int_equal(rm_prefilter_freeze(pf, act, 1, 9, 0, 1, &b), RM_PF_BAD_ARGS);
  assert_int_equal(rm_prefilter_freeze(pf, act, -1, 9, 43, 1, &b), RM_PF_BAD_ARGS);
  assert_int_equal(rm_prefilter_freeze(pf, 0, 1, 9, 43, 1, &b), RM_PF_BAD_ARGS);
  assert_int_equal(rm_prefilter_freeze_until(pf, act, 1, 9, 43, 1, -1, &b), RM_PF_BAD_ARGS);
  assert_int_equal(rm_prefilter_confirm(pf, act, 1, -42), RM_PF_BAD_ARGS);
  assert_int_equal(rm_prefilter_release(pf, act, -1, 42), RM_PF_BAD_ARGS);
  {
    int64_t ids[2] = {0, 44};
    rm_pf_fill_t out[4];
    size_t n;
    assert_int_equal(rm_prefilter_waitlist_fill(pf, act, 1, ids, 2, 0, out, 4, &n), RM_PF_BAD_ARGS);
    ids[0] = 42; /* already an order */
    assert_int_equal(rm_prefilter_waitlist_fill(pf, act, 1, ids, 2, 0, out, 4, &n), RM_PF_BAD_ARGS);
    ids[0] = 44; /* twice the same id */
    assert_int_equal(rm_prefilter_waitlist_fill(pf, act, 1, ids, 2, 0, out, 4, &n), RM_PF_BAD_ARGS);
    assert_int_equal(rm_prefilter_waitlist_fill(pf, act, 1, ids, 0, 0, out, 4, &n), RM_PF_BAD_ARGS);
  }
  /* A second freeze of order 42 with other values. */
  assert_int_equal(rm_prefilter_freeze(pf, act, 1, 7, 42, 2, &b), RM_PF_BAD_ARGS);
  assert_int_equal(rm_prefilter_freeze(pf, act, 1, 8, 42, 1, &b), RM_PF_BAD_ARGS);
  /* The same freeze again: its bucket, nothing new. */
  {
    int b2 = -1;
    assert_int_equal(rm_prefilter_freeze(pf, act, 1, 7, 42, 1, &b2), 0);
    assert_int_equal(b2, b);
  }
  /* Another ticket type's keys for this order. */
  assert_int_equal(rm_prefilter_confirm(pf, act, 2, 42), RM_PF_BAD_ARGS);

  /* Raw EVALSHA, as any client could send it. */
  assert_int_equal(rm_prefilter_script_sha(pf, "freeze", sha), 0);
  {
    const char *k[5] = {"{act_3001}:meta", "{act_3001}:t1:stock", "{act_3001}:bought",
                        "{act_3001}:orders", "{act_3001}:t1:expiry"};
    const char *good[5] = {"1", "9", "43", "1", "99999999999"};
    static const char *const bad_values[] = {"abc", "1e3", "0x10", " 1", "1 ", "1.5", "-1", "",
                                             "+1", "99999999999999999999", "9223372036854775808", "0"};
    int checked = 0;
    for (int pos_i = 0; pos_i < 5; pos_i++) {
      for (size_t v = 0; v < sizeof(bad_values) / sizeof(bad_values[0]); v++) {
        const char *argv[13] = {"EVALSHA", sha, "5", k[0], k[1], k[2], k[3], k[4]};
        for (int j = 0; j < 5; j++) argv[8 + j] = good[j];
        argv[8 + pos_i] = bad_values[v];
        /* "0" is a fine ticket type and deadline. */
        if (strcmp(bad_values[v], "0") == 0 && (pos_i == 0 || pos_i == 4)) continue;
        redisReply *r = redisCommandArgv(raw, 13, argv, NULL);
        assert_non_null(r);
        if (r->type != REDIS_REPLY_INTEGER || r->integer != -4)
          fail_msg("argument %d = \"%s\": expected -4, got type %d (%lld)", pos_i, bad_values[v], r->type, r->integer);
        freeReplyObject(r);
        checked++;
      }
    }
    /* Huge quantity, wrong counts of keys and arguments. */
    redisReply *r = redisCommand(raw, "EVALSHA %s 5 %s %s %s %s %s 1 9 43 10001 99", sha, k[0], k[1], k[2], k[3], k[4]);
    assert_int_equal(r->integer, -4);
    freeReplyObject(r);
    r = redisCommand(raw, "EVALSHA %s 4 %s %s %s %s 1 9 43 1 99", sha, k[0], k[1], k[2], k[3]);
    assert_int_equal(r->integer, -4);
    freeReplyObject(r);
    r = redisCommand(raw, "EVALSHA %s 5 %s %s %s %s %s 1 9 43 1", sha, k[0], k[1], k[2], k[3], k[4]);
    assert_int_equal(r->integer, -4);
    freeReplyObject(r);
    r = redisCommand(raw, "EVALSHA %s 5 %s %s %s %s %s 1 9 43 1 99 extra", sha, k[0], k[1], k[2], k[3], k[4]);
    assert_int_equal(r->integer, -4);
    freeReplyObject(r);
    r = redisCommand(raw, "EVALSHA %s 0", sha);
    assert_int_equal(r->integer, -4);
    freeReplyObject(r);
    printf("  %d malformed raw freezes refused, plus wrong key/argument counts\n", checked);
  }
  /* Other scripts, raw. */
  {
    static const char *const names[] = {"confirm", "release", "expire", "waitlist_join", "waitlist_fill",
                                        "stock_add", "stock_add", "stock_add"};
    static const char *const calls[] = {
      "EVALSHA %s 4 {act_3001}:t1:stock {act_3001}:orders {act_3001}:t1:expiry {act_3001}:meta 1 x42",
      "EVALSHA %s 5 {act_3001}:t1:stock {act_3001}:bought {act_3001}:orders {act_3001}:t1:expiry {act_3001}:meta "
      "-1 42",
      "EVALSHA %s 5 {act_3001}:t1:stock {act_3001}:bought {act_3001}:orders {act_3001}:t1:expiry {act_3001}:meta "
      "1 99999999999999 0",
      "EVALSHA %s 5 {act_3001}:meta {act_3001}:bought {act_3001}:t1:wl {act_3001}:t1:wlq {act_3001}:t1:wlseq 9 2.5",
      "EVALSHA %s 7 {act_3001}:meta {act_3001}:t1:stock {act_3001}:bought {act_3001}:orders {act_3001}:t1:expiry "
      "{act_3001}:t1:wl {act_3001}:t1:wlq 1 99999999999 10 10 45 abc",
      "EVALSHA %s 7 {act_3001}:meta {act_3001}:t1:stock {act_3001}:bought {act_3001}:orders {act_3001}:t1:expiry "
      "{act_3001}:t1:wl {act_3001}:t1:wlq 1 99999999999 10 10 2 5 -3 46",
      "EVALSHA %s 7 {act_3001}:meta {act_3001}:t1:stock {act_3001}:bought {act_3001}:orders {act_3001}:t1:expiry "
      "{act_3001}:t1:wl {act_3001}:t1:wlq 1 99999999999 10 10 3 5 5",
      "EVALSHA %s 7 {act_3001}:meta {act_3001}:t1:stock {act_3001}:bought {act_3001}:orders {act_3001}:t1:expiry "
      "{act_3001}:t1:wl {act_3001}:t1:wlq 1 99999999999 10 10 2 5 5 42",
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
      char s[41];
      assert_int_equal(rm_prefilter_script_sha(pf, names[i], s), 0);
      redisReply *r = redisCommand(raw, calls[i], s);
      if (r->type != REDIS_REPLY_INTEGER || r->integer != -4) fail_msg("%s: expected -4", names[i]);
      freeReplyObject(r);
    }
  }
  after = snapshot(act, 1);
  assert_string_equal(before, after);
  free(before);
  free(after);

  /* Not loaded, not on sale. */
  assert_int_equal(rm_prefilter_freeze(pf, 3999, 1, 9, 43, 1, &b), RM_PF_NOT_LOADED);
  seed_pg(3002, 0, 2, 1, 1, 10);
  assert_int_equal(rm_prefilter_seed(pf, pg, 3002), 0);
  assert_int_equal(rm_prefilter_freeze(pf, 3002, 1, 9, 43, 1, &b), RM_PF_NOT_ON_SALE);
  assert_int_equal(rm_prefilter_freeze(pf, 3002, 2, 9, 43, 1, &b), RM_PF_NOT_ON_SALE);
  assert_int_equal(rm_prefilter_seed(pf, pg, 3998), RM_PF_NO_ACTIVITY);
  {
    rm_pf_stats_t st;
    rm_prefilter_stats(pf, &st);
    assert_true(st.freeze.bad_args >= 13);
    assert_int_equal(st.freeze.not_loaded, 1);
    assert_int_equal(st.freeze.not_on_sale, 2);
  }
  rm_prefilter_free(pf);
}

/* ------------------------------------------------------------ waitlist --- */

static void test_waitlist(void **state) {
  (void)state;
  NEED_SERVERS();
  const int64_t act = 4001;
  rm_prefilter_t *pf = pf_new(4);
  int b;
  long pos = -1;
  rm_pf_fill_t out[8];
  size_t n = 0;
  int64_t ids[5] = {9001, 9002, 9003, 9004, 9005};
  seed_pg(act, 1, 2, 1, 1, 4);
  assert_int_equal(rm_prefilter_seed(pf, pg, act), 0);
  assert_int_equal(rm_prefilter_freeze(pf, act, 1, 1, 101, 2, &b), 0);
  assert_int_equal(rm_prefilter_freeze(pf, act, 1, 2, 102, 2, &b), 0);
  assert_int_equal(rm_prefilter_freeze(pf, act, 1, 3, 103, 1, &b), RM_PF_SOLD_OUT);

  /* Queue: 10:2, 11:1, 12:2, 13:1, 14:1, 15:2. */
  static const int64_t users[] = {10, 11, 12, 13, 14, 15};
  static const int qtys[] = {2, 1, 2, 1, 1, 2};
  for (int i = 0; i < 6; i++) {
    assert_int_equal(rm_prefilter_waitlist_join(pf, act, 1, users[i], qtys[i], &pos), 0);
    assert_int_equal(pos, i);
  }
  assert_int_equal(rm_prefilter_waitlist_join(pf, act, 1, 10, 1, &pos), RM_PF_ALREADY_WAITING);
  assert_int_equal(pos, 0);
  assert_int_equal(rm_prefilter_waitlist_join(pf, act, 1, 1, 1, &pos), RM_PF_OVER_LIMIT);

  /* Nothing available: nothing served. */
  assert_int_equal(rm_prefilter_waitlist_fill(pf, act, 1, ids, 5, 0, out, 8, &n), 0);
  assert_int_equal(n, 0);

  /* 2 back: user 10 (2) first. */
  assert_int_equal(rm_prefilter_release(pf, act, 1, 101), 0);
  assert_int_equal(rm_prefilter_waitlist_fill(pf, act, 1, ids, 5, 0, out, 8, &n), 0);
  assert_int_equal(n, 1);
  assert_true(out[0].user_id == 10 && out[0].order_id == 9001 && out[0].qty == 2 && out[0].code == 0);
  assert_int_equal(user_bought(act, 10), 2);

  /* 2 back: 11 (1) served, 12 (2) does not fit and keeps its place, 13 (1). */
  ids[0] = 9011, ids[1] = 9012, ids[2] = 9013;
  assert_int_equal(rm_prefilter_release(pf, act, 1, 102), 0);
  assert_int_equal(rm_prefilter_waitlist_fill(pf, act, 1, ids, 3, 0, out, 8, &n), 0);
  assert_int_equal(n, 2);
  assert_true(out[0].user_id == 11 && out[0].order_id == 9011 && out[0].qty == 1);
  assert_true(out[1].user_id == 13 && out[1].order_id == 9012 && out[1].qty == 1);
  {
    redisReply *r = rcmd("ZRANGE {act_4001}:t1:wl 0 -1");
    assert_int_equal(r->elements, 3);
    assert_string_equal(r->element[0]->str, "12");
    assert_string_equal(r->element[1]->str, "14");
    assert_string_equal(r->element[2]->str, "15");
    freeReplyObject(r);
  }

  /* The limit drops to 1: wanting 2 can never be served now. */
  freeReplyObject(rcmd("HSET {act_4001}:meta limit 1"));
  assert_int_equal(rm_prefilter_release(pf, act, 1, 9001), 0);
  ids[0] = 9021, ids[1] = 9022, ids[2] = 9023;
  assert_int_equal(rm_prefilter_waitlist_fill(pf, act, 1, ids, 3, 0, out, 8, &n), 0);
  assert_int_equal(n, 3);
  assert_true(out[0].user_id == 12 && out[0].order_id == 0 && out[0].code == RM_PF_OVER_LIMIT);
  assert_true(out[1].user_id == 14 && out[1].order_id == 9021 && out[1].code == 0);
  assert_true(out[2].user_id == 15 && out[2].order_id == 0 && out[2].code == RM_PF_OVER_LIMIT);
  {
    redisReply *r = rcmd("ZCARD {act_4001}:t1:wl");
    assert_int_equal(r->integer, 0);
    freeReplyObject(r);
    r = rcmd("HLEN {act_4001}:t1:wlq");
    assert_int_equal(r->integer, 0);
    freeReplyObject(r);
  }
  assert_int_equal(bucket_sum(act, 1, "frozen"), 3); /* 11, 13, 14 */
  check_buckets(act, 1);
  /* Served orders are ordinary freezes. */
  assert_int_equal(rm_prefilter_confirm(pf, act, 1, 9021), 0);
  assert_int_equal(rm_prefilter_release(pf, act, 1, 9021), RM_PF_ALREADY_CONFIRMED);

  /* Off sale: no fill. */
  freeReplyObject(rcmd("HSET {act_4001}:meta status 2"));
  ids[0] = 9031;
  assert_int_equal(rm_prefilter_waitlist_fill(pf, act, 1, ids, 1, 0, out, 8, &n), RM_PF_NOT_ON_SALE);
  rm_prefilter_free(pf);
}

/* -------------------------------------------------- NOSCRIPT, timeouts --- */

/* More tickets (rm_prefilter_stock_add): Redis rises to PostgreSQL's stock
 * and the waitlist is served from the new tickets first, in the same step;
 * a repeat, or an older addition applied late, changes nothing. */
static void test_stock_add(void **state) {
  (void)state;
  NEED_SERVERS();
  const int64_t act = 4101;
  rm_prefilter_t *pf = pf_new(4);
  int b;
  long pos = -1;
  rm_pf_fill_t out[8];
  size_t n = 9;
  seed_pg(act, 1, 2, 1, 2, 2); /* 1 + 1 tickets */
  assert_int_equal(rm_prefilter_seed(pf, pg, act), 0);
  assert_int_equal(rm_prefilter_freeze(pf, act, 1, 1, 201, 1, &b), 0);
  assert_int_equal(rm_prefilter_freeze(pf, act, 1, 2, 202, 1, &b), 0);
  assert_int_equal(rm_prefilter_freeze(pf, act, 1, 3, 203, 1, &b), RM_PF_SOLD_OUT);
  /* waiting: 10 wants 1, 11 wants 2, 12 wants 3 (over the limit of 2) */
  assert_int_equal(rm_prefilter_waitlist_join(pf, act, 1, 10, 1, &pos), 0);
  assert_int_equal(rm_prefilter_waitlist_join(pf, act, 1, 11, 2, &pos), 0);
  assert_int_equal(rm_prefilter_waitlist_join(pf, act, 1, 13, 1, &pos), 0);

  /* bad arguments: refused before any round trip */
  int64_t stock[2] = {3, 2};
  int64_t ids[3] = {9101, 9102, 9103};
  int64_t bad_stock[2] = {2, -1};
  assert_int_equal(rm_prefilter_stock_add(pf, act, 1, bad_stock, 2, ids, 3, 0, out, 8, &n), RM_PF_BAD_ARGS);
  assert_int_equal(rm_prefilter_stock_add(pf, act, 1, stock, 0, ids, 3, 0, out, 8, &n), RM_PF_BAD_ARGS);
  assert_int_equal(rm_prefilter_stock_add(pf, act, 1, stock, 2, NULL, 3, 0, out, 8, &n), RM_PF_BAD_ARGS);
  assert_int_equal(rm_prefilter_stock_add(pf, 0, 1, stock, 2, ids, 3, 0, out, 8, &n), RM_PF_BAD_ARGS);
  /* an activity Redis does not have: nothing raised */
  assert_int_equal(rm_prefilter_stock_add(pf, 4199, 1, stock, 2, ids, 3, 0, out, 8, &n), RM_PF_NOT_LOADED);
  assert_int_equal(bucket_sum(act, 1, "stock"), 2);

  /* 2 + 1 more (PostgreSQL says 3 and 2): 10 gets 1, 11 gets 2, all of
   * them go to the waitlist; 13 keeps its place, a new buyer finds none */
  pg_ok("UPDATE activity_ticket_bucket SET stock = CASE bucket_id WHEN 0 THEN 3 ELSE 2 END "
        "WHERE activity_id = %" PRId64, act);
  assert_int_equal(rm_prefilter_stock_add(pf, act, 1, stock, 2, ids, 3, 0, out, 8, &n), 0);
  assert_int_equal(n, 2);
  assert_true(out[0].user_id == 10 && out[0].order_id == 9101 && out[0].qty == 1 && out[0].code == 0);
  assert_true(out[1].user_id == 11 && out[1].order_id == 9102 && out[1].qty == 2 && out[1].code == 0);
  assert_int_equal(bucket_sum(act, 1, "stock"), 5);
  assert_int_equal(bucket_sum(act, 1, "frozen"), 5);
  assert_int_equal(rm_prefilter_freeze(pf, act, 1, 4, 204, 1, &b), RM_PF_SOLD_OUT);
  {
    redisReply *r = rcmd("ZRANGE {act_4101}:t1:wl 0 -1");
    assert_int_equal(r->elements, 1);
    assert_string_equal(r->element[0]->str, "13");
    freeReplyObject(r);
  }
  check_buckets(act, 1);

  /* the same addition again, and an older one applied late: stock stays */
  int64_t older[2] = {1, 2};
  int64_t ids2[1] = {9111};
  assert_int_equal(rm_prefilter_stock_add(pf, act, 1, stock, 2, NULL, 0, 0, out, 8, &n), 0);
  assert_int_equal(n, 0);
  assert_int_equal(rm_prefilter_stock_add(pf, act, 1, older, 2, ids2, 1, 0, out, 8, &n), 0);
  assert_int_equal(n, 0);
  assert_int_equal(bucket_sum(act, 1, "stock"), 5);
  /* the used order ids are refused (a served order is new or nothing) */
  assert_int_equal(rm_prefilter_stock_add(pf, act, 1, stock, 2, ids, 1, 0, out, 8, &n), RM_PF_BAD_ARGS);

  /* a sale not open: raised all the same, nobody served */
  freeReplyObject(rcmd("HSET {act_4101}:meta status 2"));
  int64_t more[2] = {3, 3};
  int64_t ids3[1] = {9121};
  assert_int_equal(rm_prefilter_stock_add(pf, act, 1, more, 2, ids3, 1, 0, out, 8, &n), 0);
  assert_int_equal(n, 0);
  assert_int_equal(bucket_sum(act, 1, "stock"), 6);
  {
    redisReply *r = rcmd("ZCARD {act_4101}:t1:wl");
    assert_int_equal(r->integer, 1);
    freeReplyObject(r);
  }
  rm_pf_stats_t st;
  rm_prefilter_stats(pf, &st);
  assert_int_equal(st.stock_add.ok, 4);
  assert_int_equal(st.stock_add.bad_args, 5);
  assert_int_equal(st.stock_add.not_loaded, 1);
  rm_prefilter_free(pf);
}

/* ---------------------------------------------------------------- hold --- */

/* The writers honour a reconciliation's hold (lua/hold.lua, pf_held):
 * each script that writes a watched key answers -9 and changes nothing
 * while it lasts; the library waits it out, or gives up with
 * RM_PF_E_HELD after RM_PF_HOLD_WAIT_MS. */
static void test_hold(void **state) {
  (void)state;
  NEED_SERVERS();
  const int64_t act = 8101;
  rm_prefilter_t *pf = pf_new(4);
  char hold[41], sha[41];
  int b;
  seed_pg(act, 1, 4, 1, 2, 100);
  assert_int_equal(rm_prefilter_seed(pf, pg, act), 0);
  assert_int_equal(rm_prefilter_freeze(pf, act, 1, 11, act * 1000 + 1, 1, &b), 0);
  assert_int_equal(rm_prefilter_freeze(pf, act, 1, 12, act * 1000 + 2, 1, &b), 0);
  assert_int_equal(rm_prefilter_script_sha(pf, "hold", hold), 0);

  /* Bad arguments, and an activity that is not loaded: nothing to hold. */
  {
    static const char *const bad[] = {"0", "10001", "abc", "-5", ""};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
      redisReply *r = rcmd("EVALSHA %s 1 {act_8101}:meta %s", hold, bad[i]);
      if (r->type != REDIS_REPLY_INTEGER || r->integer != -4) fail_msg("hold \"%s\": expected -4", bad[i]);
      freeReplyObject(r);
    }
    redisReply *r = rcmd("EVALSHA %s 0", hold);
    assert_int_equal(r->integer, -4);
    freeReplyObject(r);
    r = rcmd("EVALSHA %s 1 {act_8199}:meta 100", hold);
    assert_int_equal(r->integer, 0);
    freeReplyObject(r);
    r = rcmd("EXISTS {act_8199}:meta");
    assert_int_equal(r->integer, 0);
    freeReplyObject(r);
  }

  /* A ten seconds hold: every writer refuses, raw, and nothing changes. */
  redisReply *r = rcmd("EVALSHA %s 1 {act_8101}:meta 10000", hold);
  assert_int_equal(r->integer, 1);
  freeReplyObject(r);
  char *before = snapshot(act, 1);
  {
    static const char *const names[] = {"freeze", "confirm", "release", "expire", "waitlist_fill", "stock_add"};
    static const char *const calls[] = {
      "EVALSHA %s 5 {act_8101}:meta {act_8101}:t1:stock {act_8101}:bought {act_8101}:orders {act_8101}:t1:expiry "
      "1 13 8101003 1 99999999999",
      "EVALSHA %s 4 {act_8101}:t1:stock {act_8101}:orders {act_8101}:t1:expiry {act_8101}:meta 1 8101001",
      "EVALSHA %s 5 {act_8101}:t1:stock {act_8101}:bought {act_8101}:orders {act_8101}:t1:expiry {act_8101}:meta "
      "1 8101002",
      "EVALSHA %s 5 {act_8101}:t1:stock {act_8101}:bought {act_8101}:orders {act_8101}:t1:expiry {act_8101}:meta "
      "1 99999999999999 10",
      "EVALSHA %s 7 {act_8101}:meta {act_8101}:t1:stock {act_8101}:bought {act_8101}:orders {act_8101}:t1:expiry "
      "{act_8101}:t1:wl {act_8101}:t1:wlq 1 99999999999 10 10 8101004",
      "EVALSHA %s 7 {act_8101}:meta {act_8101}:t1:stock {act_8101}:bought {act_8101}:orders {act_8101}:t1:expiry "
      "{act_8101}:t1:wl {act_8101}:t1:wlq 1 99999999999 10 10 2 500 500",
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
      assert_int_equal(rm_prefilter_script_sha(pf, names[i], sha), 0);
      r = rcmd(calls[i], sha);
      if (r->type != REDIS_REPLY_INTEGER || r->integer != -9) fail_msg("%s under a hold: expected -9", names[i]);
      freeReplyObject(r);
    }
    /* Answers that write nothing do not wait: an unknown order. */
    assert_int_equal(rm_prefilter_confirm(pf, act, 1, act * 1000 + 77), RM_PF_UNKNOWN_ORDER);
  }
  /* Through the library: it waits, then gives up, and nothing changed. */
  double t0 = now_s();
  assert_int_equal(rm_prefilter_freeze(pf, act, 1, 13, act * 1000 + 3, 1, &b), RM_PF_E_HELD);
  double waited = now_s() - t0;
  printf("  a freeze under a ten seconds hold gave up after %.1f s: %s\n", waited, rm_prefilter_errmsg());
  assert_true(waited >= 2.9); /* RM_PF_HOLD_WAIT_MS of sleeps at least */
  assert_non_null(strstr(rm_prefilter_errmsg(), "hold"));
  char *after = snapshot(act, 1);
  assert_string_equal(before, after);
  free(before);
  free(after);

  /* A short hold: the calls wait it out and succeed. */
  r = rcmd("EVALSHA %s 1 {act_8101}:meta 300", hold);
  assert_int_equal(r->integer, 1);
  freeReplyObject(r);
  assert_int_equal(rm_prefilter_confirm(pf, act, 1, act * 1000 + 1), 0);
  assert_int_equal(rm_prefilter_release(pf, act, 1, act * 1000 + 2), 0);
  assert_int_equal(rm_prefilter_freeze(pf, act, 1, 13, act * 1000 + 3, 1, &b), 0);
  assert_int_equal(user_bought(act, 11), 1);
  assert_int_equal(user_bought(act, 12), 0);
  assert_int_equal(user_bought(act, 13), 1);
  /* The reconciliation (not a dry run) leaves no hold behind. */
  assert_int_equal(rm_prefilter_reconcile(pf, pg, act, false, NULL, NULL, NULL), 0);
  rm_prefilter_free(pf);
}

/* A reconciliation while the sale writes without a pause: a writer thread
 * freezes and releases as fast as Redis answers, so that every WATCHed
 * round is aborted; the rounds after the first two hold the writers, and
 * the reconciliation succeeds every time.  The writer only waits: it never
 * sees RM_PF_E_HELD. */
typedef struct hammer {
  rm_prefilter_t *pf;
  int64_t act;
  atomic_bool stop;
  atomic_long ops;
  atomic_int errors;
  int first_error;
} hammer_t;

static void *hammer_main(void *p) {
  hammer_t *h = ((run_t *)p)->arg;
  int idx = ((run_t *)p)->idx;
  for (int64_t i = 0; !atomic_load(&h->stop); i++) {
    int64_t order = h->act * 1000000 + idx * 100000 + i, user = 1 + i % 50;
    int b, rc = rm_prefilter_freeze(h->pf, h->act, 1, user, order, 1, &b);
    if (rc == 0) rc = rm_prefilter_release(h->pf, h->act, 1, order);
    /* A round may drop the Redis-only freeze in between (PostgreSQL never
     * saw it), or reset a user's count: those answers are fine. */
    if (rc != 0 && rc != RM_PF_UNKNOWN_ORDER && rc != RM_PF_SOLD_OUT && rc != RM_PF_OVER_LIMIT) {
      if (atomic_fetch_add(&h->errors, 1) == 0) h->first_error = rc;
    }
    atomic_fetch_add(&h->ops, 1);
  }
  return NULL;
}

static void test_reconcile_under_writes(void **state) {
  (void)state;
  NEED_SERVERS();
  hammer_t *h = calloc(1, sizeof(*h));
  assert_non_null(h);
  h->act = 8102;
  h->pf = pf_new(8);
  seed_pg(h->act, 1, 4, 1, 4, 1000);
  assert_int_equal(rm_prefilter_seed(h->pf, pg, h->act), 0);
  /* Freezes recorded in both, so that a round reads a few hundred rows. */
  for (int i = 1; i <= 300; i++) {
    int64_t order = h->act * 1000 + i, dl = unix_ms() + 3600 * 1000;
    int b;
    assert_int_equal(rm_prefilter_freeze_until(h->pf, h->act, 1, 1000 + i, order, 1, dl, &b), 0);
    assert_int_equal(rm_prefilter_pg_freeze(pg, h->act, 1, b, 1000 + i, order, 1, dl), 0);
  }

  pthread_t t[2];
  run_t runs[2];
  for (int i = 0; i < 2; i++) {
    runs[i] = (run_t){NULL, h, i};
    assert_int_equal(pthread_create(&t[i], NULL, hammer_main, &runs[i]), 0);
  }
  while (atomic_load(&h->ops) < 500) sleep_ms(5);
  int failed = 0;
  long ops_before = atomic_load(&h->ops);
  for (int k = 0; k < 5; k++) {
    rm_pf_reconcile_t rep;
    int rc = rm_prefilter_reconcile(h->pf, pg, h->act, false, &rep, NULL, NULL);
    if (rc != 0) {
      fprintf(stderr, "  reconcile %d under writes: %s: %s\n", k, rm_prefilter_strerror(rc), rm_prefilter_errmsg());
      failed++;
    }
  }
  long ops_during = atomic_load(&h->ops) - ops_before;
  atomic_store(&h->stop, true);
  for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
  printf("  5 reconciliations under %ld writer calls: %d failed; writer errors %d\n", ops_during, failed,
         atomic_load(&h->errors));
  assert_int_equal(failed, 0);
  if (atomic_load(&h->errors)) fail_msg("writer: %s", rm_prefilter_strerror(h->first_error));
  redisReply *r = rcmd("HEXISTS {act_8102}:meta hold");
  assert_int_equal(r->integer, 0);
  freeReplyObject(r);
  /* Quiet now: one pass drops the writer's tombstones, then they agree. */
  rm_pf_reconcile_t rep;
  assert_int_equal(rm_prefilter_reconcile(h->pf, pg, h->act, false, &rep, NULL, NULL), 0);
  assert_int_equal(rm_prefilter_reconcile(h->pf, pg, h->act, true, &rep, NULL, NULL), 0);
  assert_int_equal(rep.meta + rep.buckets + rep.users + rep.orders + rep.deadlines, 0);
  rm_prefilter_free(h->pf);
  free(h);
}

static void test_noscript(void **state) {
  (void)state;
  NEED_SERVERS();
  const int64_t act = 5001;
  rm_prefilter_t *pf = pf_new(2);
  rm_pf_stats_t st;
  int b;
  seed_pg(act, 1, 4, 1, 2, 10);
  assert_int_equal(rm_prefilter_seed(pf, pg, act), 0);
  assert_int_equal(rm_prefilter_freeze(pf, act, 1, 1, 1, 1, &b), 0);
  freeReplyObject(rcmd("SCRIPT FLUSH"));
  assert_int_equal(rm_prefilter_freeze(pf, act, 1, 2, 2, 1, &b), 0);
  assert_int_equal(rm_prefilter_confirm(pf, act, 1, 2), 0);
  rm_prefilter_stats(pf, &st);
  assert_int_equal(st.noscript_reloads, 2);
  assert_int_equal(st.connects, 1);
  rm_prefilter_free(pf);
}

/* rm_prefilter_prewarm opens the pool's connections ahead, scripts loaded:
 * the calls after it open none.  Idle connections count towards 'n', the
 * pool's size bounds it, and an unreachable Redis is a clean failure. */
static void test_prewarm(void **state) {
  (void)state;
  NEED_SERVERS();
  const int64_t act = 5004;
  rm_prefilter_t *pf = pf_new(4);
  rm_pf_stats_t st;
  unsigned opened = 99;
  int b;
  seed_pg(act, 1, 8, 1, 2, 10);
  assert_int_equal(rm_prefilter_prewarm(pf, 3, &opened), 0);
  assert_int_equal(opened, 3);
  rm_prefilter_stats(pf, &st);
  assert_int_equal(st.connects, 3);
  assert_int_equal(st.open_connections, 3);
  /* Already idle: nothing more to open; past the pool's size: capped. */
  assert_int_equal(rm_prefilter_prewarm(pf, 3, &opened), 0);
  assert_int_equal(opened, 0);
  assert_int_equal(rm_prefilter_prewarm(pf, 100, &opened), 0);
  assert_int_equal(opened, 1);
  rm_prefilter_stats(pf, &st);
  assert_int_equal(st.open_connections, 4);
  /* The scripts are loaded on them: calls open nothing and reload nothing. */
  assert_int_equal(rm_prefilter_seed(pf, pg, act), 0);
  assert_int_equal(rm_prefilter_freeze(pf, act, 1, 1, 1, 1, &b), 0);
  assert_int_equal(rm_prefilter_confirm(pf, act, 1, 1), 0);
  rm_prefilter_stats(pf, &st);
  assert_int_equal(st.connects, 4);
  assert_int_equal(st.noscript_reloads, 0);
  assert_int_equal(rm_prefilter_prewarm(pf, 0, NULL), 0);
  assert_int_equal(rm_prefilter_prewarm(NULL, 1, &opened), RM_E_INVALID);
  assert_int_equal(opened, 0);
  rm_prefilter_free(pf);
  /* Nobody listens there: the first connect fails, nothing is open. */
  rm_pf_options_t o = {.connect_timeout_ms = 200, .max_connections = 4};
  assert_int_equal(rm_prefilter_new("redis://127.0.0.1:1", &o, &pf), 0);
  assert_int_equal(rm_prefilter_prewarm(pf, 4, &opened), RM_E_CONN_LOST);
  assert_int_equal(opened, 0);
  rm_prefilter_stats(pf, &st);
  assert_int_equal(st.open_connections, 0);
  rm_prefilter_free(pf);
}

/* The URL's database and password are used on every connection. */
static void test_url_db_auth(void **state) {
  (void)state;
  NEED_SERVERS();
  char url[256];
  rm_prefilter_t *pf;
  int b = -1;
  snprintf(url, sizeof(url), "%s/3", redis_url);
  assert_int_equal(rm_prefilter_new(url, NULL, &pf), 0);
  freeReplyObject(rcmd("SELECT 3"));
  freeReplyObject(rcmd("HSET {act_5003}:meta status 1 limit 2"));
  freeReplyObject(rcmd("HSET {act_5003}:t1:stock n 1 stock:0 1"));
  freeReplyObject(rcmd("SELECT 0"));
  assert_int_equal(rm_prefilter_freeze(pf, 5003, 1, 1, 1, 1, &b), 0);
  assert_int_equal(b, 0);
  assert_int_equal(rm_prefilter_freeze(pf, 5003, 1, 2, 2, 1, &b), RM_PF_SOLD_OUT);
  assert_int_equal(rm_prefilter_freeze(pf, 5003, 1, 3, 3, 1, &b), RM_PF_SOLD_OUT);
  {
    redisReply *r = rcmd("EXISTS {act_5003}:meta"); /* not in database 0 */
    assert_int_equal(r->integer, 0);
    freeReplyObject(r);
  }
  rm_prefilter_free(pf);
  /* A password this Redis does not have: refused at connect. */
  snprintf(url, sizeof(url), "redis://:wrong@%s", redis_url + strlen("redis://"));
  assert_int_equal(rm_prefilter_new(url, NULL, &pf), 0);
  assert_int_equal(rm_prefilter_freeze(pf, 5003, 1, 1, 1, 1, &b), RM_E_CONN_LOST);
  assert_non_null(strstr(rm_prefilter_errmsg(), "could not authenticate"));
  rm_prefilter_free(pf);
}

/* A listening socket nobody accepts on: connects succeed, nothing answers. */
static int deaf_listener(int *port) {
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t al = sizeof(a);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  assert_true(fd >= 0);
  assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
  assert_int_equal(listen(fd, 64), 0);
  assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &al), 0);
  *port = ntohs(a.sin_port);
  return fd;
}

static void test_no_hang(void **state) {
  (void)state;
  NEED_SERVERS();
  rm_pf_options_t o = {0};
  rm_prefilter_t *pf;
  char url[64];
  int port, fd, b;
  double t0, dt;

  /* Nobody listening: refused at once, then the backoff answers at once. */
  fd = deaf_listener(&port);
  close(fd);
  snprintf(url, sizeof(url), "redis://127.0.0.1:%d", port);
  o.log_cb = log_cb;
  assert_int_equal(rm_prefilter_new(url, &o, &pf), 0);
  t0 = now_s();
  assert_int_equal(rm_prefilter_freeze(pf, 1, 1, 1, 1, 1, &b), RM_E_CONN_LOST);
  assert_int_equal(rm_prefilter_freeze(pf, 1, 1, 1, 1, 1, &b), RM_E_CONN_LOST);
  dt = now_s() - t0;
  printf("  refused: 2 calls in %.1f ms (%s)\n", dt * 1000, rm_prefilter_errmsg());
  assert_true(dt < 0.2);
  rm_prefilter_free(pf);

  /* Accepted by the kernel, never answered: the script load times out. */
  fd = deaf_listener(&port);
  snprintf(url, sizeof(url), "redis://127.0.0.1:%d", port);
  assert_int_equal(rm_prefilter_new(url, &o, &pf), 0);
  t0 = now_s();
  assert_int_equal(rm_prefilter_freeze(pf, 1, 1, 1, 1, 1, &b), RM_E_CONN_LOST);
  dt = now_s() - t0;
  printf("  deaf server: failed in %.0f ms (%s)\n", dt * 1000, rm_prefilter_errmsg());
  assert_true(dt >= 0.15 && dt < 1.0);
  t0 = now_s();
  assert_int_equal(rm_prefilter_freeze(pf, 1, 1, 1, 1, 1, &b), RM_E_CONN_LOST); /* backoff */
  assert_true(now_s() - t0 < 0.05);
  rm_prefilter_free(pf);
  close(fd);

  /* The real Redis stopped (SIGSTOP) under an open connection. */
  const char *pid_s = getenv("REDIS_PID");
  if (!pid_s) return;
  pid_t pid = (pid_t)atoi(pid_s);
  const int64_t act = 5002;
  seed_pg(act, 1, 4, 1, 2, 10);
  o.reconnect_max_ms = 100;
  assert_int_equal(rm_prefilter_new(redis_url, &o, &pf), 0);
  assert_int_equal(rm_prefilter_seed(pf, pg, act), 0);
  assert_int_equal(kill(pid, SIGSTOP), 0);
  t0 = now_s();
  int rc1 = rm_prefilter_freeze(pf, act, 1, 1, 77, 1, &b);   /* sent: unknown */
  double dt1 = now_s() - t0;
  t0 = now_s();
  int rc2 = rm_prefilter_freeze(pf, act, 1, 2, 78, 1, &b);   /* new connection: load times out */
  double dt2 = now_s() - t0;
  kill(pid, SIGCONT);
  printf("  stopped Redis: %s after %.0f ms, then %s after %.0f ms\n", rm_prefilter_strerror(rc1),
         dt1 * 1000, rm_prefilter_strerror(rc2), dt2 * 1000);
  assert_int_equal(rc1, RM_E_UNKNOWN_OUTCOME);
  assert_int_equal(rc2, RM_E_CONN_LOST);
  assert_true(dt1 < 0.5 && dt2 < 1.0);
  /* Redis runs again: retrying the unknown call is safe and answers the
   * truth (the first EVALSHA did run once Redis resumed). */
  int rc = -1;
  int b1 = -1;
  for (int i = 0; i < 100 && rc != 0; i++) {
    rc = rm_prefilter_freeze(pf, act, 1, 1, 77, 1, &b1);
    if (rc != 0) sleep_ms(20);
  }
  assert_int_equal(rc, 0);
  assert_int_equal(user_bought(act, 1), 1);
  assert_int_equal(bucket_sum(act, 1, "frozen"), 1);
  rm_prefilter_free(pf);
}

/* -------------------------------------------------------------- expiry --- */

typedef struct expiry {
  rm_prefilter_t *pf;
  int64_t act;
  int64_t now;
  int nsweepers;
  atomic_int released[1000]; /* callbacks per order index */
  atomic_int orphans[1000];
  int confirm_rc[1000];
  int confirm_redis_rc[1000];
  bool race_confirm[1000];
  atomic_int errors;
} expiry_t;

static void on_expired(int64_t order_id, int64_t user_id, int32_t qty, int32_t bucket, bool orphan,
                       void *arg) {
  expiry_t *e = arg;
  (void)user_id, (void)qty, (void)bucket;
  int64_t i = order_id - e->act * 1000;
  if (i < 0 || i >= 1000) {
    atomic_fetch_add(&e->errors, 1);
    return;
  }
  atomic_fetch_add(&e->released[i], 1);
  if (orphan) atomic_fetch_add(&e->orphans[i], 1);
}

static void *expiry_worker(void *p) {
  run_t *run = p;
  expiry_t *e = run->arg;
  PGconn *c = PQconnectdb(stock_url);
  if (PQstatus(c) != CONNECTION_OK) {
    atomic_fetch_add(&e->errors, 1);
    PQfinish(c);
    return NULL;
  }
  if (run->idx < e->nsweepers) {
    unsigned n = 0;
    /* Small batches so that the sweepers interleave. */
    for (int k = 0; k < 20; k++) {
      int rc = rm_prefilter_expire(e->pf, c, e->act, 1, e->now, 3, on_expired, e, &n);
      if (rc != 0) {
        fprintf(stderr, "  sweep: %s (%s)\n", rm_prefilter_strerror(rc), rm_prefilter_errmsg());
        atomic_fetch_add(&e->errors, 1);
      }
    }
  } else {
    /* Payment arriving for due orders while the sweep runs. */
    for (int i = 0; i < 1000; i++) {
      if (!e->race_confirm[i]) continue;
      e->confirm_rc[i] = rm_prefilter_pg_confirm(c, e->act * 1000 + i);
      if (e->confirm_rc[i] == 0) e->confirm_redis_rc[i] = rm_prefilter_confirm(e->pf, e->act, 1, e->act * 1000 + i);
    }
  }
  PQfinish(c);
  return NULL;
}

static void test_expiry(void **state) {
  (void)state;
  NEED_SERVERS();
  expiry_t *e = calloc(1, sizeof(*e));
  const int64_t act = 6001;
  int b;
  assert_non_null(e);
  e->act = act;
  e->pf = pf_new(8);
  seed_pg(act, 1, 4, 1, 2, 200);
  assert_int_equal(rm_prefilter_seed(e->pf, pg, act), 0);
  int64_t t0 = unix_ms();
  int64_t soon = t0 + 1000, later = t0 + 3600 * 1000;
  e->now = t0 + 2000; /* the sweeps' clock: "soon" has passed */

  /* 0..29 due (recorded), 30..39 not due, 40..44 orphans (Redis only). */
  for (int i = 0; i < 45; i++) {
    int64_t order = act * 1000 + i, dl = i >= 30 && i < 40 ? later : soon;
    assert_int_equal(rm_prefilter_freeze_until(e->pf, act, 1, 100 + i, order, 1 + i % 2, dl, &b), 0);
    if (i < 40) assert_int_equal(rm_prefilter_pg_freeze(pg, act, 1, b, 100 + i, order, 1 + i % 2, dl), 0);
  }
  /* Paid: 0..4; cancelled: 5..7 (PostgreSQL first, then Redis). */
  for (int i = 0; i < 5; i++) {
    assert_int_equal(rm_prefilter_pg_confirm(pg, act * 1000 + i), 0);
    assert_int_equal(rm_prefilter_confirm(e->pf, act, 1, act * 1000 + i), 0);
  }
  for (int i = 5; i < 8; i++) {
    assert_int_equal(rm_prefilter_pg_release(pg, act * 1000 + i), 0);
    assert_int_equal(rm_prefilter_release(e->pf, act, 1, act * 1000 + i), 0);
  }
  /* 8: released in PostgreSQL, the process died before Redis (repair). */
  assert_int_equal(rm_prefilter_pg_release(pg, act * 1000 + 8), 0);
  /* 9: confirmed in PostgreSQL only (repair). */
  assert_int_equal(rm_prefilter_pg_confirm(pg, act * 1000 + 9), 0);
  /* 10..13: payment races the sweep. */
  for (int i = 10; i < 14; i++) e->race_confirm[i] = true;

  e->nsweepers = 3;
  run_threads(4, expiry_worker, e);
  assert_int_equal(atomic_load(&e->errors), 0);

  int released = 0, orphans = 0, raced_paid = 0;
  for (int i = 0; i < 45; i++) {
    int n = atomic_load(&e->released[i]);
    bool expect;
    if (i < 10) expect = false;                                  /* decided before */
    else if (i < 14) expect = e->confirm_rc[i] != 0;             /* lost the race */
    else if (i < 30) expect = true;
    else if (i < 40) expect = false;                             /* not due */
    else expect = true;                                          /* orphans */
    if (n != (expect ? 1 : 0)) fail_msg("order %d released %d times by the sweeps", i, n);
    if (i >= 10 && i < 14) {
      if (e->confirm_rc[i] == 0) {
        raced_paid++;
        assert_int_equal(e->confirm_redis_rc[i], 0);
      } else {
        assert_int_equal(e->confirm_rc[i], RM_PF_ALREADY_RELEASED);
      }
    }
    released += n;
    orphans += atomic_load(&e->orphans[i]);
  }
  printf("  expiry: %d released by 3 concurrent sweeps (%d orphans), %d of 4 racing payments won\n",
         released, orphans, raced_paid);
  assert_int_equal(orphans, 5);
  /* Repairs happened: 8 released, 9 confirmed in Redis too. */
  {
    redisReply *r = rcmd("HMGET {act_6001}:orders %" PRId64 " %" PRId64, act * 1000 + 8, act * 1000 + 9);
    assert_int_equal(r->element[0]->str[0], 'R');
    assert_int_equal(r->element[1]->str[0], 'C');
    freeReplyObject(r);
  }
  /* Only the not-due ones are still frozen, in both. */
  long long frozen_left = 0;
  for (int i = 30; i < 40; i++) frozen_left += 1 + i % 2;
  assert_int_equal(bucket_sum(act, 1, "frozen"), frozen_left);
  assert_int_equal(pg_ll("SELECT sum(frozen_count) FROM activity_ticket_bucket WHERE activity_id = 6001"), frozen_left);
  assert_int_equal(pg_ll("SELECT count(*) FROM stock_log WHERE activity_id = 6001 AND op = 'release'"),
                   pg_ll("SELECT count(*) FROM stock_freeze WHERE activity_id = 6001 AND state = 'RELEASED'"));
  /* Redis and PostgreSQL agree, but for the orphans' tombstones. */
  rm_pf_reconcile_t rep;
  assert_int_equal(rm_prefilter_reconcile(e->pf, pg, act, true, &rep, NULL, NULL), 0);
  assert_int_equal(rep.buckets + rep.users + rep.deadlines + rep.meta, 0);
  assert_int_equal(rep.orders, 5);
  /* Exactly once: a second sweep finds nothing. */
  unsigned n = 99;
  assert_int_equal(rm_prefilter_expire(e->pf, pg, act, 1, e->now, 100, NULL, NULL, &n), 0);
  assert_int_equal(n, 0);

  /* Redis loses everything; the deadlines come back from PostgreSQL. */
  freeReplyObject(rcmd("FLUSHALL"));
  rm_pf_reconcile_t fix;
  assert_int_equal(rm_prefilter_reconcile(e->pf, pg, act, false, &fix, NULL, NULL), 0);
  printf("  after FLUSHALL, reconcile rewrote: meta %u, buckets %u, users %u, orders %u, deadlines %u\n",
         fix.meta, fix.buckets, fix.users, fix.orders, fix.deadlines);
  assert_int_equal(fix.deadlines, 10);
  assert_int_equal(bucket_sum(act, 1, "frozen"), frozen_left);
  unsigned before_release = 0;
  assert_int_equal(rm_prefilter_expire(e->pf, pg, act, 1, later + 1, 100, NULL, NULL, &before_release), 0);
  assert_int_equal(before_release, 10);
  assert_int_equal(bucket_sum(act, 1, "frozen"), 0);
  assert_int_equal(pg_ll("SELECT sum(frozen_count) FROM activity_ticket_bucket WHERE activity_id = 6001"), 0);
  assert_int_equal(rm_prefilter_reconcile(e->pf, pg, act, true, &rep, NULL, NULL), 0);
  assert_int_equal(rep.meta + rep.buckets + rep.users + rep.orders + rep.deadlines, 0);
  assert_int_equal(rm_prefilter_expire(e->pf, pg, act, 1, later + 1, 100, NULL, NULL, &n), 0);
  assert_int_equal(n, 0);

  /* Redis alone (no PostgreSQL): expire.lua. */
  for (int i = 100; i < 104; i++)
    assert_int_equal(rm_prefilter_freeze_until(e->pf, act, 1, 900 + i, act * 1000 + i, 1, soon, &b), 0);
  assert_int_equal(rm_prefilter_expire(e->pf, NULL, act, 1, e->now, 3, NULL, NULL, &n), 0);
  assert_int_equal(n, 3);
  assert_int_equal(rm_prefilter_expire(e->pf, NULL, act, 1, e->now, 3, NULL, NULL, &n), 0);
  assert_int_equal(n, 1);
  assert_int_equal(rm_prefilter_expire(e->pf, NULL, act, 1, e->now, 3, NULL, NULL, &n), 0);
  assert_int_equal(n, 0);
  assert_int_equal(bucket_sum(act, 1, "frozen"), 0);
  rm_prefilter_free(e->pf);
  free(e);
}

/* ------------------------------------------------------------- restart --- */

#define RS_THREADS 12

typedef struct restart {
  rm_prefilter_t *pf;
  int64_t act;
  atomic_bool stop;
  atomic_llong next_order;
  atomic_llong freezes, unknown, not_sent, pg_refused, confirms, releases, errors;
  atomic_llong max_call_us;
} restart_t;

static void note_latency(restart_t *r, double t0) {
  long long us = (long long)((now_s() - t0) * 1e6), cur = atomic_load(&r->max_call_us);
  while (us > cur && !atomic_compare_exchange_weak(&r->max_call_us, &cur, us)) {
  }
}

static void *restart_worker(void *p) {
  run_t *run = p;
  restart_t *r = run->arg;
  unsigned seed = (unsigned)run->idx * 7919u + 1;
  PGconn *c = PQconnectdb(stock_url);
  if (PQstatus(c) != CONNECTION_OK) {
    atomic_fetch_add(&r->errors, 1);
    PQfinish(c);
    return NULL;
  }
  while (!atomic_load(&r->stop)) {
    int64_t order = atomic_fetch_add(&r->next_order, 1);
    int64_t user = 1 + rand_r(&seed) % 100000; /* never at their limit: see test_restart */
    int qty = 1 + rand_r(&seed) % 2, b = -1;
    /* Half the freezes expire during the test, half much later. */
    int64_t deadline = unix_ms() + (rand_r(&seed) % 2 ? 500 : 3600 * 1000);
    double t0 = now_s();
    int rc = rm_prefilter_freeze_until(r->pf, r->act, 1, user, order, qty, deadline, &b);
    note_latency(r, t0);
    if (rc == RM_E_UNKNOWN_OUTCOME) {
      atomic_fetch_add(&r->unknown, 1);
      continue; /* maybe frozen in Redis, never recorded: an orphan */
    }
    if (rc == RM_E_CONN_LOST || rc == RM_E_DEADLINE ||
        (rc == RM_PF_E_REDIS && strstr(rm_prefilter_errmsg(), "LOADING"))) {
      atomic_fetch_add(&r->not_sent, 1);
      sleep_ms(5);
      continue;
    }
    if (rc == RM_PF_SOLD_OUT || rc == RM_PF_OVER_LIMIT) continue;
    if (rc != 0) {
      atomic_fetch_add(&r->errors, 1);
      continue;
    }
    atomic_fetch_add(&r->freezes, 1);
    /* The stock service records it; PostgreSQL may refuse when Redis
     * forgot earlier freezes (the restart): then Redis gives it back. */
    int prc = rm_prefilter_pg_freeze(c, r->act, 1, b, user, order, qty, deadline);
    if (prc != 0) {
      atomic_fetch_add(&r->pg_refused, 1);
      rm_prefilter_release(r->pf, r->act, 1, order);
      continue;
    }
    int what = rand_r(&seed) % 3;
    if (what == 0 && rm_prefilter_pg_confirm(c, order) == 0) {
      atomic_fetch_add(&r->confirms, 1);
      rm_prefilter_confirm(r->pf, r->act, 1, order); /* may fail while Redis is down: reconcile */
    } else if (what == 1 && rm_prefilter_pg_release(c, order) == 0) {
      atomic_fetch_add(&r->releases, 1);
      rm_prefilter_release(r->pf, r->act, 1, order);
    }
  }
  PQfinish(c);
  return NULL;
}

/* scripts/redis-tmp CMD $REDIS_DIR OPT: the test's own Redis. */
static int redis_tmp(const char *cmd, const char *opt) {
  char line[1024];
  const char *src = getenv("TX_SOURCE_DIR"), *dir = getenv("REDIS_DIR");
  snprintf(line, sizeof(line), "'%s/scripts/redis-tmp' %s '%s' %s >/dev/null", src, cmd, dir, opt);
  return system(line);
}

static void test_restart(void **state) {
  (void)state;
  NEED_SERVERS();
  if (!getenv("TX_SOURCE_DIR") || !getenv("REDIS_DIR")) skip();
  restart_t *r = calloc(1, sizeof(*r));
  pthread_t t[RS_THREADS];
  run_t runs[RS_THREADS];
  assert_non_null(r);
  r->act = 7001;
  atomic_init(&r->next_order, 7001 * 1000000LL);
  rm_pf_options_t o = {0};
  o.log_cb = log_cb;
  o.reconnect_max_ms = 200;
  assert_int_equal(rm_prefilter_new(redis_url, &o, &r->pf), 0);
  /* Enough tickets and users that the sale cannot sell out or reach its
   * users' limits before the crash on a fast machine: after the restart
   * every refusal would then be "sold out" and no freeze could show that
   * the prefilter works again. */
  seed_pg(r->act, 1, 2, 1, 8, 1000000);
  assert_int_equal(rm_prefilter_seed(r->pf, pg, r->act), 0);

  pthread_barrier_init(&start_line, NULL, RS_THREADS);
  for (int i = 0; i < RS_THREADS; i++) {
    runs[i] = (run_t){restart_worker, r, i};
    assert_int_equal(pthread_create(&t[i], NULL, run_main, &runs[i]), 0);
  }
  sleep_ms(700);
  long long before = atomic_load(&r->freezes);
  /* Crash: kill -9 (the AOF is fsynced every second: the last writes may
   * be lost), then start again on the same directory and port. */
  assert_int_equal(redis_tmp("stop", "--kill"), 0);
  printf("  (restart) %lld freezes before the crash\n", before);
  sleep_ms(300);
  assert_int_equal(redis_tmp("start", "--aof"), 0);
  /* Run on until freezes succeed again (the pool reconnects with a backoff
   * of up to 2 s, longer on a loaded machine), at least 700 ms, bounded. */
  long long after_start = atomic_load(&r->freezes);
  for (int waited = 0; waited < 700 || (atomic_load(&r->freezes) <= after_start && waited < 15000);
       waited += 50)
    sleep_ms(50);
  atomic_store(&r->stop, true);
  for (int i = 0; i < RS_THREADS; i++) pthread_join(t[i], NULL);
  pthread_barrier_destroy(&start_line);
  printf("  (restart) freezes %lld, confirmed %lld, released %lld, unknown %lld, not sent %lld, "
         "refused by PostgreSQL %lld, longest call %.0f ms\n",
         atomic_load(&r->freezes), atomic_load(&r->confirms), atomic_load(&r->releases),
         atomic_load(&r->unknown), atomic_load(&r->not_sent), atomic_load(&r->pg_refused),
         atomic_load(&r->max_call_us) / 1000.0);
  assert_int_equal(atomic_load(&r->errors), 0);
  assert_true(atomic_load(&r->freezes) > before);            /* it worked again after */
  assert_true(atomic_load(&r->unknown) + atomic_load(&r->not_sent) > 0); /* and the crash was felt */
  assert_true(atomic_load(&r->max_call_us) < 1500 * 1000);   /* nobody hung */

  assert_int_equal(raw_connect(), 0); /* the restart closed it */
  /* Reconcile against PostgreSQL, then they agree. */
  rm_pf_reconcile_t fix, again;
  assert_int_equal(rm_prefilter_reconcile(r->pf, pg, r->act, false, &fix, NULL, NULL), 0);
  printf("  (restart) reconcile corrected: buckets %u, users %u, orders %u, deadlines %u\n",
         fix.buckets, fix.users, fix.orders, fix.deadlines);
  assert_int_equal(rm_prefilter_reconcile(r->pf, pg, r->act, true, &again, NULL, NULL), 0);
  assert_int_equal(again.meta + again.buckets + again.users + again.orders + again.deadlines, 0);
  assert_int_equal(bucket_sum(r->act, 1, "frozen"),
                   pg_ll("SELECT sum(frozen_count) FROM activity_ticket_bucket WHERE activity_id = 7001"));
  assert_int_equal(bucket_sum(r->act, 1, "sold"),
                   pg_ll("SELECT sum(sold_count) FROM activity_ticket_bucket WHERE activity_id = 7001"));
  check_buckets(r->act, 1);
  assert_int_equal(pg_ll("SELECT count(*) FROM stock_freeze f JOIN stock_freeze g USING (order_id) "
                         "WHERE f.activity_id = 7001 AND f.user_id <> g.user_id"), 0);
  assert_int_equal(pg_ll("SELECT count(*) FROM (SELECT user_id FROM stock_freeze WHERE activity_id = 7001 "
                         "AND state <> 'RELEASED' GROUP BY user_id HAVING sum(qty) > 2) x"), 0);

  /* Expiry after the restart: everything frozen is released once. */
  long long frozen_rows = pg_ll("SELECT count(*) FROM stock_freeze WHERE activity_id = 7001 AND state = 'FROZEN'");
  unsigned total = 0, n;
  int64_t far = unix_ms() + 7200 * 1000;
  do {
    assert_int_equal(rm_prefilter_expire(r->pf, pg, r->act, 1, far, 1000, NULL, NULL, &n), 0);
    total += n;
  } while (n > 0);
  printf("  (restart) expiry released %u freezes (%lld were frozen in PostgreSQL)\n", total, frozen_rows);
  assert_int_equal(total, frozen_rows);
  assert_int_equal(bucket_sum(r->act, 1, "frozen"), 0);
  assert_int_equal(pg_ll("SELECT sum(frozen_count) FROM activity_ticket_bucket WHERE activity_id = 7001"), 0);
  assert_int_equal(rm_prefilter_reconcile(r->pf, pg, r->act, true, &again, NULL, NULL), 0);
  assert_int_equal(again.meta + again.buckets + again.users + again.orders + again.deadlines, 0);
  rm_prefilter_free(r->pf);
  free(r);
}

int main(int argc, char **argv) {
  const char *group = argc > 1 ? argv[1] : "main";
  const struct CMUnitTest main_tests[] = {
    cmocka_unit_test(test_load_1_bucket),  cmocka_unit_test(test_load_5_buckets),
    cmocka_unit_test(test_load_16_buckets), cmocka_unit_test(test_race_redis),
    cmocka_unit_test(test_race_pg_first),  cmocka_unit_test(test_malformed),
    cmocka_unit_test(test_waitlist),       cmocka_unit_test(test_stock_add),
    cmocka_unit_test(test_noscript),       cmocka_unit_test(test_prewarm),
    cmocka_unit_test(test_url_db_auth),
    cmocka_unit_test(test_no_hang),        cmocka_unit_test(test_expiry),
    cmocka_unit_test(test_hold),           cmocka_unit_test(test_reconcile_under_writes),
  };
  const struct CMUnitTest restart_tests[] = {
    cmocka_unit_test(test_restart),
  };
  if (strcmp(group, "restart") == 0)
    return cmocka_run_group_tests_name("prefilter_restart", restart_tests, group_setup, group_teardown);
  return cmocka_run_group_tests_name("prefilter", main_tests, group_setup, group_teardown);
}
