/*
 * prefilter_bench.c - freeze calls per second through librmclient's Redis
 * prefilter (rm_prefilter_freeze: 50 caller threads, blocking calls, one
 * command in flight per connection) against redis-benchmark running the
 * very same script with EVALSHA, 50 connections, no pipelining (-P 1), on
 * the same Redis in the same run.  The ratio is what the library costs on
 * top of the network and the script; the target is >= 0.8.
 *
 * Environment: REDIS_URL (redis://host:port) selects an existing Redis;
 * without it the bench re-runs itself under scripts/with-servers --redis (a
 * temporary Redis, no persistence).  PF_BENCH_N (calls per round, default
 * 100000), PF_BENCH_ROUNDS (default 3), PF_BENCH_CLIENTS (default 50).
 *
 * Workload: one activity (its own id, so an existing Redis is not
 * disturbed), 4 buckets of 10^12 tickets, a limit nobody reaches; every call
 * freezes 1 ticket for a new order of a random user, so each one takes the
 * full path of freeze.lua (status, order, limit, bucket, four writes).
 * redis-benchmark gets the same keys and arguments, its random order and
 * user ids from __rand_int__ (-r 10^9).  Rounds alternate library /
 * redis-benchmark after a warm-up; the medians are reported (the ratio is
 * the median of the per-round ratios).
 *
 * The last line printed is one JSON object:
 *   {"clients":50,"freeze_per_s":...,"redis_benchmark_per_s":...,"ratio":...}
 */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "rm_client.h"
#include "rm_prefilter_keys.h"

#ifndef TX_SOURCE_DIR
#define TX_SOURCE_DIR "."
#endif

#define ACTIVITY 990001
#define TT 1
#define MAX_ROUNDS 15

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* CPU seconds (user + system) of this process or of its waited-for
 * children. */
static double cpu_s(int who) {
  struct rusage ru;
  getrusage(who, &ru);
  return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
         (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}

static long env_long(const char *name, long def, long lo, long hi) {
  const char *v = getenv(name);
  char *end;
  long x;
  if (!v || !*v) return def;
  x = strtol(v, &end, 10);
  if (*end || x < lo || x > hi) {
    fprintf(stderr, "prefilter-bench: %s must be %ld..%ld\n", name, lo, hi);
    exit(64);
  }
  return x;
}

/* ----------------------------------------------------- library rounds --- */

typedef struct lib_run {
  rm_prefilter_t *pf;
  long calls;            /* total for the round */
  atomic_long next;      /* calls handed out */
  atomic_long failed;
  atomic_llong order;    /* order ids, unique across rounds */
  int64_t deadline_ms;
  pthread_barrier_t go;
  char first_error[300];
} lib_run_t;

typedef struct lib_thread {
  lib_run_t *run;
  unsigned seed;
} lib_thread_t;

static void *lib_worker(void *p) {
  lib_thread_t *t = p;
  lib_run_t *r = t->run;
  pthread_barrier_wait(&r->go);
  for (;;) {
    long k = atomic_fetch_add_explicit(&r->next, 1, memory_order_relaxed);
    if (k >= r->calls) break;
    int64_t order = atomic_fetch_add_explicit(&r->order, 1, memory_order_relaxed);
    int64_t user = 1 + (int64_t)(rand_r(&t->seed) % 1000000000);
    int b;
    int rc = rm_prefilter_freeze_until(r->pf, ACTIVITY, TT, user, order, 1, r->deadline_ms, &b);
    if (rc != 0 && atomic_fetch_add_explicit(&r->failed, 1, memory_order_relaxed) == 0)
      snprintf(r->first_error, sizeof(r->first_error), "%s: %s", rm_prefilter_strerror(rc),
               rm_prefilter_errmsg());
  }
  return NULL;
}

/* One round of 'calls' freezes on 'clients' threads; calls per second. */
static double lib_round(lib_run_t *r, int clients, long calls) {
  pthread_t th[4096];
  lib_thread_t ts[4096];
  double t0, t1;
  r->calls = calls;
  atomic_store(&r->next, 0);
  pthread_barrier_init(&r->go, NULL, (unsigned)clients + 1);
  for (int i = 0; i < clients; i++) {
    ts[i].run = r;
    ts[i].seed = (unsigned)(i * 7919 + (int)calls);
    if (pthread_create(&th[i], NULL, lib_worker, &ts[i]) != 0) {
      fprintf(stderr, "prefilter-bench: could not start a thread\n");
      exit(71);
    }
  }
  pthread_barrier_wait(&r->go);
  t0 = now_s();
  for (int i = 0; i < clients; i++) pthread_join(th[i], NULL);
  t1 = now_s();
  pthread_barrier_destroy(&r->go);
  return (double)calls / (t1 - t0);
}

/* ------------------------------------------------ redis-benchmark rounds --- */

/* Run redis-benchmark with the freeze script; its requests per second. */
static double rb_round(const char *host, int port, int clients, long calls, const char *sha,
                       const rm_pf_keys_t *ks, int64_t deadline_ms) {
  char cmd[2048], line[4096];
  double rps = -1;
  snprintf(cmd, sizeof(cmd),
           "redis-benchmark -h %s -p %d -c %d -n %ld -P 1 -r 1000000000 --csv "
           "EVALSHA %s 5 '%s' '%s' '%s' '%s' '%s' %d __rand_int__ __rand_int__ 1 %" PRId64
           " 2>&1",
           host, port, clients, calls, sha, ks->k[RM_PF_K_META], ks->k[RM_PF_K_STOCK],
           ks->k[RM_PF_K_BOUGHT], ks->k[RM_PF_K_ORDERS], ks->k[RM_PF_K_EXPIRY], TT, deadline_ms);
  FILE *f = popen(cmd, "r");
  if (!f) {
    fprintf(stderr, "prefilter-bench: could not run redis-benchmark: %s\n", strerror(errno));
    exit(69);
  }
  /* --csv: a header line, then "\"EVALSHA ...\",\"<rps>\",..." */
  while (fgets(line, sizeof(line), f)) {
    char *p = strstr(line, "\",\"");
    if (strncmp(line, "\"EVALSHA", 8) == 0 && p) rps = strtod(p + 3, NULL);
  }
  if (pclose(f) != 0 || rps <= 0) {
    fprintf(stderr, "prefilter-bench: redis-benchmark failed (is redis-tools installed?)\n");
    exit(69);
  }
  return rps;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof(*v), cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* ------------------------------------------------------------------ main --- */

static void seed_redis(redisContext *c, const rm_pf_keys_t *ks) {
  redisReply *r;
  for (int i = 0; i < RM_PF_K__COUNT; i++) freeReplyObject(redisCommand(c, "DEL %s", ks->k[i]));
  r = redisCommand(c, "HSET %s status 1 limit 1000000000000", ks->k[RM_PF_K_META]);
  if (!r || r->type == REDIS_REPLY_ERROR) {
    fprintf(stderr, "prefilter-bench: could not seed Redis: %s\n", r ? r->str : c->errstr);
    exit(69);
  }
  freeReplyObject(r);
  freeReplyObject(redisCommand(c, "HSET %s n 4 stock:0 1000000000000 stock:1 1000000000000 "
                                  "stock:2 1000000000000 stock:3 1000000000000",
                               ks->k[RM_PF_K_STOCK]));
}

int main(int argc, char **argv) {
  const char *url = getenv("REDIS_URL");
  long calls = env_long("PF_BENCH_N", 100000, 1000, 100000000);
  int rounds = (int)env_long("PF_BENCH_ROUNDS", 3, 1, MAX_ROUNDS);
  int clients = (int)env_long("PF_BENCH_CLIENTS", 50, 1, 4096);
  rm_pf_url_t u;
  rm_pf_keys_t ks;
  rm_prefilter_t *pf;
  rm_pf_options_t o = {0};
  char sha[41];
  double lib[MAX_ROUNDS], rb[MAX_ROUNDS];
  lib_run_t *run;

  (void)argc;
  if (!url || !*url) {
    /* No Redis given: run again under a temporary one. */
    char self[PATH_MAX], script[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n <= 0) {
      fprintf(stderr, "prefilter-bench: cannot find my own executable\n");
      return 69;
    }
    self[n] = '\0';
    snprintf(script, sizeof(script), "%s/scripts/with-servers", TX_SOURCE_DIR);
    char *args[] = {script, "--redis", "--", self, NULL};
    (void)argv;
    execv(script, args);
    fprintf(stderr, "prefilter-bench: could not run %s: %s\n", script, strerror(errno));
    return 69;
  }
  if (rm__pf_url_parse(url, &u) != 0) {
    fprintf(stderr, "prefilter-bench: bad REDIS_URL \"%s\"\n", url);
    return 64;
  }
  rm__pf_keys_build(&ks, ACTIVITY, TT);
  {
    redisContext *c = redisConnect(u.host, u.port);
    if (!c || c->err) {
      fprintf(stderr, "prefilter-bench: could not connect to %s\n", url);
      return 69;
    }
    seed_redis(c, &ks);
    redisFree(c);
  }

  o.max_connections = (unsigned)clients;
  /* Throughput, not fault handling: a loaded machine must not turn slow
   * answers into failed calls. */
  o.command_timeout_ms = 10000;
  o.connect_timeout_ms = 10000;
  if (rm_prefilter_new(url, &o, &pf) != 0 || rm_prefilter_script_sha(pf, "freeze", sha) != 0) {
    fprintf(stderr, "prefilter-bench: could not set up the prefilter: %s\n", rm_prefilter_errmsg());
    return 69;
  }
  run = calloc(1, sizeof(*run));
  if (!run) return 70;
  run->pf = pf;
  /* Above redis-benchmark's random ids (0 .. 10^9): no collisions. */
  atomic_init(&run->order, 1000000000000LL);
  run->deadline_ms = (int64_t)time(NULL) * 1000 + 15 * 60 * 1000;

  printf("prefilter-bench: %s, %d clients, %ld freezes per round, %d round(s), pipelining off\n",
         url, clients, calls, rounds);
  /* Warm-up: open every connection (and load the scripts) once. */
  lib_round(run, clients, calls / 10 > 5000 ? 5000 : calls / 10);
  for (int i = 0; i < rounds; i++) {
    double c0 = cpu_s(RUSAGE_SELF), c1, c2;
    lib[i] = lib_round(run, clients, calls);
    c1 = cpu_s(RUSAGE_SELF);
    c2 = cpu_s(RUSAGE_CHILDREN);
    rb[i] = rb_round(u.host, u.port, clients, calls, sha, &ks, run->deadline_ms);
    printf("  round %d: librmclient %.0f freezes/s (client CPU %.1f us/call), redis-benchmark "
           "EVALSHA %.0f/s (client CPU %.1f us/call), ratio %.3f\n",
           i + 1, lib[i], (c1 - c0) * 1e6 / (double)calls, rb[i],
           (cpu_s(RUSAGE_CHILDREN) - c2) * 1e6 / (double)calls, lib[i] / rb[i]);
  }
  {
    rm_pf_stats_t st;
    rm_prefilter_stats(pf, &st);
    printf("  library counters: %" PRIu64 " ok, %" PRIu64 " failed, %u connections, %" PRIu64
           " connects\n",
           st.freeze.ok, (uint64_t)atomic_load(&run->failed), st.open_connections, st.connects);
    if (atomic_load(&run->failed) != 0) {
      fprintf(stderr, "prefilter-bench: %ld freezes failed, the first: %s\n",
              atomic_load(&run->failed), run->first_error);
      return 1;
    }
  }
  /* The ratio is the median of the rounds' own ratios: the two halves of a
   * round run back to back and share the machine's load, which on a shared
   * machine moves more between rounds than between the two clients. */
  double ratio[MAX_ROUNDS];
  for (int i = 0; i < rounds; i++) ratio[i] = lib[i] / rb[i];
  double mratio = median(ratio, rounds), ml = median(lib, rounds), mr = median(rb, rounds);
  printf("{\"clients\":%d,\"freeze_per_s\":%.0f,\"redis_benchmark_per_s\":%.0f,\"ratio\":%.3f}\n",
         clients, ml, mr, mratio);
  rm_prefilter_free(pf);
  free(run);
  return 0;
}
