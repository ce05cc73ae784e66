/*
 * tc_bench.c - coordinator throughput: N clients each run
 *   begin -> 2 x BranchRegister (distinct lock keys) -> commit
 * against tcd, with branch acknowledgements from a minimal RM (each client's
 * own connection answers the BranchCommits for its branches).  In the same
 * run, on the same PostgreSQL, it measures the naive baseline: the same
 * store writes for one transaction issued directly by one libpq client per
 * connection, one statement at a time, no batching.
 *
 * Cluster mode: the same load is measured twice in one run, first with
 * every client on one node ("single"), then with the clients spread
 * round-robin over all nodes ("cluster"); the nodes share one PostgreSQL.
 *
 * Environment: TC_PG_URL (the coordinator database) and TC_NODES
 * (host:port,...) select an existing setup (with several nodes, e.g. from
 * cluster/local/up, both figures are measured on them).  Without TC_PG_URL
 * the bench re-runs itself under scripts/with-servers (a temporary
 * PostgreSQL); without TC_NODES it starts its own tcd nodes: --nodes N
 * (default 3) nodes with distinct node ids and a peer bus; node 1 alone for
 * the single-node figure, then nodes 2..N join for the cluster figure.
 * The registration secret is application "tc-bench"'s (common/txc_secret.h:
 * TC_SECRET_FILE, TC_SECRETS_DIR/tc-bench as cluster/local/up writes it, or
 * the legacy TC_TOKEN; default "bench-token" for the nodes it starts, as
 * their server.token).
 *
 * The last line printed is one JSON object:
 *   {"clients":N,"tps":...,"p50_ms":...,"p99_ms":...,"baseline_tps":...,"ratio":...,
 *    "nodes":N,"cluster_tps":...,"cluster_p50_ms":...,"cluster_p99_ms":...,"cluster_vs_single":...}
 * ("tps" etc. are the single-node figures.)
 */
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <libpq-fe.h>
#include <limits.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "pgstat.h"
#include "tc_bench_load.h"
#include "txc_secret.h"
#include "txclient.h"

#ifndef TX_SOURCE_DIR
#define TX_SOURCE_DIR "."
#endif

#define MAX_NODES 8

typedef struct {
  int clients;
  double duration_s, warmup_s, baseline_s;
  char nodes[MAX_NODES][64];
  int nnodes;
  int want_nodes; /* --nodes: how many to start without TC_NODES */
  int use_nodes;  /* clients go to the first use_nodes nodes */
  bool no_bus;    /* --no-bus: the nodes it starts run without a peer bus */
  bool fresh_wal; /* --fresh-wal: skip prepare_wal() on its own PostgreSQL */
  int rounds;     /* --rounds: single/cluster pairs */
  const char *token;
  const char *pg_url;
} opts_t;

/* What the store's server did per transaction over a measured period
 * (pgstat.h): counts that do not depend on the machine. */
typedef struct {
  bool ok;
  bool has_statements; /* pg_stat_statements loaded (TX_PG_STATEMENTS=1) */
  double statements, xacts, rows_read, wal_bytes, wal_records, wal_syncs;
} tx_budget_t;

typedef struct {
  double tps, p50, p99;
  uint64_t errors, done;
  double tcd_cpu_ms_per_tx; /* CPU time of the nodes it started, per transaction (0: not known) */
  tx_budget_t budget;
} result_t;

static void budget_start(pgstat_t *a, const char *url) {
  memset(a, 0, sizeof(*a));
  pgstat_add_db(a, url);
  pgstat_sample(a, url);
}

static tx_budget_t budget_end(const pgstat_t *a, const char *url, uint64_t done) {
  pgstat_t b = *a;
  pgstat_sample(&b, url);
  tx_budget_t t = {0};
  if (!a->ok || !b.ok || done == 0 || a->ndb != 1) return t;
  double n = (double)done;
  t.ok = true;
  /* The WAL and the transactions are the server's own counters; the
   * statements need pg_stat_statements. */
  t.has_statements = a->statements[0] >= 0 && b.statements[0] >= 0;
  if (t.has_statements) t.statements = (double)(b.statements[0] - a->statements[0]) / n;
  t.xacts = (double)(b.xacts[0] - a->xacts[0]) / n;
  t.rows_read = (double)(b.rows_read[0] - a->rows_read[0]) / n;
  t.wal_bytes = (double)(b.wal_bytes - a->wal_bytes) / n;
  t.wal_records = (double)(b.wal_records - a->wal_records) / n;
  t.wal_syncs = (double)(b.wal_sync - a->wal_sync) / n;
  return t;
}

static void print_budget(const char *what, const tx_budget_t *t) {
  if (!t->ok) return;
  char statements[64] = "statements unknown (TX_PG_STATEMENTS=1 counts them)";
  if (t->has_statements) snprintf(statements, sizeof(statements), "%.2f statements", t->statements);
  printf("%s per transaction: %s, %.2f PostgreSQL transactions, %.1f rows read, %.0f WAL bytes, "
         "%.1f WAL records, %.3f WAL fsyncs\n",
         what, statements, t->xacts, t->rows_read, t->wal_bytes, t->wal_records, t->wal_syncs);
}

static atomic_int phase; /* 0 warm-up, 1 measure, 2 stop */

typedef struct {
  bench_client_t *clients;
  int n;
  const char *token;
  int rc;
} load_arg_t;

static void *load_main(void *arg) {
  load_arg_t *a = arg;
  a->rc = bench_load_run(a->clients, a->n, a->token, &phase);
  return NULL;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static void sleep_s(double s) {
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

/* ------------------------------------------------------------- baseline */

typedef struct {
  const char *url;
  int id;
  pthread_t th;
  uint64_t done, errors;
  char err[256];
} base_t;

static atomic_int base_phase;

static bool exec_ok(PGconn *pg, const char *sql, int n, const char *const *v, base_t *b) {
  PGresult *r = PQexecParams(pg, sql, n, NULL, v, NULL, NULL, 0);
  bool ok = PQresultStatus(r) == PGRES_COMMAND_OK || PQresultStatus(r) == PGRES_TUPLES_OK;
  if (!ok && !b->err[0]) snprintf(b->err, sizeof(b->err), "%s", PQerrorMessage(pg));
  PQclear(r);
  return ok;
}

/* The two branches of the benchmark transaction. The lock row names its
 * resource and table as literals, exactly as the store's own statement does,
 * so each branch carries its own INSERT text. */
static const struct {
  const char *resource, *table, *lock_sql;
} baseline_branches[] = {
  {"bench_db1", "t_order",
   "INSERT INTO bench_lock_table (row_key, xid, transaction_id, branch_id, resource_id, table_name, pk) "
   "VALUES ($1, $2, $3, $4, 'bench_db1', 't_order', '1')"},
  {"bench_db2", "t_stock",
   "INSERT INTO bench_lock_table (row_key, xid, transaction_id, branch_id, resource_id, table_name, pk) "
   "VALUES ($1, $2, $3, $4, 'bench_db2', 't_stock', '1')"},
};

/* Registers branch 'i' of transaction 'base' for worker 'b' as two
 * autocommitted statements: its branch row, then the row lock it holds. */
static bool insert_baseline_branch(PGconn *pg, base_t *b, size_t i, int64_t base, uint64_t seq,
                                   const char *xid, const char *txid) {
  char branch_id[32], row_key[96];
  snprintf(branch_id, sizeof(branch_id), "%" PRId64, base + 1 + (int64_t)i);
  snprintf(row_key, sizeof(row_key), "%s^^^%s^^^%d_%" PRIu64, baseline_branches[i].resource,
           baseline_branches[i].table, b->id, seq);
  const char *branch[] = {branch_id, xid, txid, baseline_branches[i].resource};
  const char *lock[] = {row_key, xid, txid, branch_id};
  return exec_ok(pg,
                 "INSERT INTO bench_branch_table (branch_id, xid, transaction_id, resource_id, status) "
                 "VALUES ($1, $2, $3, $4, 1)",
                 4, branch, b) &&
         exec_ok(pg, baseline_branches[i].lock_sql, 4, lock, b);
}

/* The naive client: the 9 store statements of one two-branch transaction,
 * each its own autocommitted statement, one round trip each. */
static void *baseline_main(void *arg) {
  base_t *b = arg;
  PGconn *pg = PQconnectdb(b->url);
  if (PQstatus(pg) != CONNECTION_OK) {
    snprintf(b->err, sizeof(b->err), "%s", PQerrorMessage(pg));
    PQfinish(pg);
    return NULL;
  }
  uint64_t seq = 0;
  char xid[64], txid[32];
  while (atomic_load(&base_phase) < 2) {
    seq++;
    int64_t base = ((int64_t)b->id << 40) + (int64_t)seq * 4;
    snprintf(xid, sizeof(xid), "bench:%" PRId64, base);
    snprintf(txid, sizeof(txid), "%" PRId64, base);
    const char *g[] = {xid, txid};
    const char *x[] = {xid};
    bool ok = exec_ok(pg,
                      "INSERT INTO bench_global_table (xid, transaction_id, status, timeout_ms, deadline, node_id) "
                      "VALUES ($1, $2, 1, 60000, clock_timestamp() + interval '60 s', 0)",
                      2, g, b);
    for (size_t i = 0; ok && i < sizeof(baseline_branches) / sizeof(baseline_branches[0]); i++)
      ok = insert_baseline_branch(pg, b, i, base, seq, xid, txid);
    ok = ok && exec_ok(pg, "UPDATE bench_global_table SET status = 8 WHERE xid = $1 AND status = 1", 1, x, b) &&
         exec_ok(pg, "DELETE FROM bench_lock_table WHERE xid = $1", 1, x, b) &&
         exec_ok(pg, "DELETE FROM bench_branch_table WHERE xid = $1", 1, x, b) &&
         exec_ok(pg, "DELETE FROM bench_global_table WHERE xid = $1", 1, x, b);
    if (!ok) {
      b->errors++;
      if (b->errors > 100) break;
      continue;
    }
    if (atomic_load(&base_phase) == 1) b->done++;
  }
  PQfinish(pg);
  return NULL;
}

static int prepare_baseline_tables(const char *url) {
  PGconn *pg = PQconnectdb(url);
  if (PQstatus(pg) != CONNECTION_OK) {
    fprintf(stderr, "tc-bench: could not connect to %s: %s", url, PQerrorMessage(pg));
    PQfinish(pg);
    return -1;
  }
  /* Same columns, indexes and storage settings as the real store tables. */
  PGresult *r = PQexec(pg,
                       "DROP TABLE IF EXISTS bench_global_table, bench_branch_table, bench_lock_table;"
                       "CREATE TABLE bench_global_table (LIKE global_table INCLUDING ALL);"
                       "CREATE TABLE bench_branch_table (LIKE branch_table INCLUDING ALL);"
                       "CREATE TABLE bench_lock_table (LIKE lock_table INCLUDING ALL);");
  int rc = PQresultStatus(r) == PGRES_COMMAND_OK ? 0 : -1;
  if (rc) fprintf(stderr, "tc-bench: could not create baseline tables: %s", PQerrorMessage(pg));
  PQclear(r);
  PQfinish(pg);
  return rc;
}

/* The PostgreSQL that tc-bench starts for itself was initdb'd a second
 * ago: its pg_wal holds one segment, so every 16 MB of WAL the load writes
 * is a new file, zero-filled while the commits behind it wait for the WAL
 * write lock (about every 0.6 s at 6,000 transactions/s).  A server that has
 * been running recycles the segments of earlier checkpoints instead.  Give
 * this one what such a server has: switch through 'segments' new segments
 * (a one-record WAL message in each, so that each switch happens), then a
 * checkpoint, which keeps them for reuse.  It takes the fresh server's
 * WAL-file creation out of the p99 (bench/README.md has the figures).  Only
 * the temporary server gets this; a database given with TC_PG_URL is
 * measured as it is. */
#define OWN_PG_ENV "TC_BENCH_OWN_PG"
#define MAX_WAL_SEGMENTS 96 /* 1.5 GB, within pg-tmp's max_wal_size of 2 GB */

static int prepare_wal(const char *url, int segments) {
  PGconn *pg = PQconnectdb(url);
  if (PQstatus(pg) != CONNECTION_OK) {
    fprintf(stderr, "tc-bench: cannot connect to prepare the WAL: %s", PQerrorMessage(pg));
    PQfinish(pg);
    return -1;
  }
  double t0 = txc_now_ms();
  int rc = 0;
  for (int i = 0; i < segments && rc == 0; i++) {
    PGresult *r = PQexec(pg, "SELECT pg_switch_wal() FROM (SELECT pg_logical_emit_message(false, 'tc-bench', '')) m");
    if (PQresultStatus(r) != PGRES_TUPLES_OK) rc = -1;
    PQclear(r);
  }
  if (rc == 0) {
    PGresult *r = PQexec(pg, "CHECKPOINT");
    if (PQresultStatus(r) != PGRES_COMMAND_OK) rc = -1;
    PQclear(r);
  }
  if (rc != 0)
    fprintf(stderr, "tc-bench: could not prepare the WAL (--fresh-wal skips it): %s", PQerrorMessage(pg));
  else
    printf("tc-bench: prepared %d recycled WAL segments on its own PostgreSQL in %.1fs\n", segments,
           (txc_now_ms() - t0) / 1000.0);
  PQfinish(pg);
  return rc;
}

static double run_baseline(const opts_t *o, tx_budget_t *budget) {
  if (prepare_baseline_tables(o->pg_url) != 0) return -1;
  base_t *bs = calloc((size_t)o->clients, sizeof(base_t));
  if (!bs) return -1;
  atomic_store(&base_phase, 0);
  for (int i = 0; i < o->clients; i++) {
    bs[i].url = o->pg_url;
    bs[i].id = i + 1;
    pthread_create(&bs[i].th, NULL, baseline_main, &bs[i]);
  }
  sleep_s(o->warmup_s);
  atomic_store(&base_phase, 1);
  pgstat_t pg0;
  budget_start(&pg0, o->pg_url);
  double t0 = txc_now_ms();
  sleep_s(o->baseline_s);
  atomic_store(&base_phase, 2);
  double elapsed = (txc_now_ms() - t0) / 1000.0;
  uint64_t done = 0, errors = 0;
  for (int i = 0; i < o->clients; i++) {
    pthread_join(bs[i].th, NULL);
    done += bs[i].done;
    errors += bs[i].errors;
    if (bs[i].err[0] && i == 0) fprintf(stderr, "tc-bench: baseline error: %s", bs[i].err);
  }
  *budget = budget_end(&pg0, o->pg_url, done);
  free(bs);
  if (errors) fprintf(stderr, "tc-bench: baseline had %" PRIu64 " failed transactions\n", errors);
  return (double)done / elapsed;
}

/* ------------------------------------------------------------------ tcd */

static pid_t tcd_pids[MAX_NODES];
static int bus_ports[MAX_NODES];

static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t sl = sizeof(sa);
  if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 ||
      getsockname(fd, (struct sockaddr *)&sa, &sl) != 0) {
    if (fd >= 0) close(fd);
    return -1;
  }
  close(fd);
  return ntohs(sa.sin_port);
}

/* Whether the node on 'port' begins a global transaction: it listens
 * before its store connections are up, and a load started then would
 * count "store unavailable" errors. */
static bool serves_begin(int port, const char *token) {
  char err[128], xid[TXP_MAX_XID_LEN + 1];
  txc_t *c = txc_connect("127.0.0.1", port, 100, err, sizeof(err));
  if (!c) return false;
  int status;
  bool ok = txc_register(c, false, "tc-bench", "tc-bench-probe", token, NULL) == 0 &&
            txc_begin(c, 5000, "probe", NULL, xid) == 0 && txc_rollback(c, xid, &status) == 0;
  txc_close(c);
  return ok;
}

/* Start node 'idx' (node id idx + 1) of the bench's own cluster of
 * o->want_nodes nodes: its own listen port, a peer bus, the other nodes'
 * buses as peers. */
/* A free port outside the kernel's ephemeral range, for a bus that binds
 * later: nanomsg cannot bind a port that a client socket of any process
 * holds (or left in TIME_WAIT), and ephemeral ports are handed out to
 * client sockets all the time. */
static int free_port_static(void) {
  int lo = 32768, hi = 60999;
  FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
  if (f) {
    if (fscanf(f, "%d %d", &lo, &hi) != 2) lo = 32768, hi = 60999;
    fclose(f);
  }
  int from = lo > 22000 ? 20000 : hi + 1, to = lo > 22000 ? lo - 1 : 65535;
  if (to <= from) return free_port();
  for (int attempt = 0; attempt < 100; attempt++) {
    int port = from + (int)(((unsigned)rand() ^ ((unsigned)getpid() << 8)) % (unsigned)(to - from + 1));
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int ok = fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
    if (fd >= 0) close(fd);
    if (ok) return port;
  }
  return free_port();
}

/* The bus of the bench's nodes needs a cluster secret: a random key in a
 * file of mode 0600 (mkstemp's), removed by stop_tcd. */
static char bench_secret[PATH_MAX];

static int make_secret(void) {
  if (bench_secret[0]) return 0;
  const char *dir = getenv("TMPDIR") && getenv("TMPDIR")[0] ? getenv("TMPDIR") : "/tmp";
  snprintf(bench_secret, sizeof(bench_secret), "%s/tc-bench-secret.XXXXXX", dir);
  int fd = mkstemp(bench_secret);
  unsigned char key[32];
  FILE *r = fopen("/dev/urandom", "rb");
  bool ok = fd >= 0 && r && fread(key, 1, sizeof(key), r) == sizeof(key);
  if (r) fclose(r);
  char hex[2 * sizeof(key) + 2];
  for (size_t i = 0; i < sizeof(key); i++) snprintf(hex + 2 * i, 3, "%02x", key[i]);
  hex[2 * sizeof(key)] = '\n';
  ok = ok && write(fd, hex, 2 * sizeof(key) + 1) == (ssize_t)(2 * sizeof(key) + 1);
  if (fd >= 0) close(fd);
  if (!ok) {
    fprintf(stderr, "tc-bench: could not write the cluster secret file %s\n", bench_secret);
    if (fd >= 0) unlink(bench_secret);
    bench_secret[0] = '\0';
    return -1;
  }
  return 0;
}

static int start_tcd(opts_t *o, const char *self, int idx) {
  char bin[PATH_MAX];
  snprintf(bin, sizeof(bin), "%s", self);
  char *slash = strrchr(bin, '/');
  if (slash) snprintf(slash + 1, sizeof(bin) - (size_t)(slash + 1 - bin), "tcd");
  else snprintf(bin, sizeof(bin), "tcd");
  if (o->want_nodes > 1 && !o->no_bus && make_secret() != 0) return -1;
  if (idx == 0) {
    /* Every bus port up front: each node lists all the others as peers. */
    for (int i = 0; i < o->want_nodes; i++) {
      int p;
      do p = free_port_static();
      while (p > 0 && i > 0 && p == bus_ports[i - 1]);
      bus_ports[i] = p;
    }
  }
  char peers[1024] = "";
  for (int i = 0; i < o->want_nodes; i++) {
    size_t len = strlen(peers);
    snprintf(peers + len, sizeof(peers) - len, "%s%d@tcp://127.0.0.1:%d", len ? "," : "", i + 1, bus_ports[i]);
  }
  for (int attempt = 0; attempt < 5; attempt++) {
    int port = free_port();
    if (port <= 0) continue;
    char listen[64], url[1100], id[32], bus[64], peers_env[1100];
    snprintf(listen, sizeof(listen), "TC_SERVER_LISTEN=127.0.0.1:%d", port);
    snprintf(url, sizeof(url), "TC_STORE_PG_URL=%s", o->pg_url);
    snprintf(id, sizeof(id), "TC_NODE_ID=%d", idx + 1);
    snprintf(bus, sizeof(bus), "TC_CLUSTER_BUS=tcp://127.0.0.1:%d", bus_ports[idx]);
    snprintf(peers_env, sizeof(peers_env), "TC_CLUSTER_PEERS=%s", peers);
    pid_t pid = fork();
    if (pid == 0) {
      setenv("TC_SERVER_TOKEN", o->token, 1);
      putenv(listen);
      putenv(url);
      putenv(id);
      if (o->want_nodes > 1 && !o->no_bus) {
        putenv(bus);
        putenv(peers_env);
        setenv("TC_CLUSTER_SECRET_FILE", bench_secret, 1);
      }
      if (!getenv("TC_LOG_LEVEL")) setenv("TC_LOG_LEVEL", "warn", 1);
      execl(bin, "tcd", (char *)NULL);
      fprintf(stderr, "tc-bench: could not run %s: %s\n", bin, strerror(errno));
      _exit(127);
    }
    for (int i = 0; i < 300; i++) {
      if (serves_begin(port, o->token)) {
        tcd_pids[idx] = pid;
        snprintf(o->nodes[idx], sizeof(o->nodes[0]), "127.0.0.1:%d", port);
        o->nnodes = idx + 1;
        return 0;
      }
      int st;
      if (waitpid(pid, &st, WNOHANG) == pid) break; /* exited: port taken? retry */
      sleep_s(0.05);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
  }
  fprintf(stderr, "tc-bench: could not start tcd node %d (%s)\n", idx + 1, bin);
  return -1;
}

static void stop_tcd(void) {
  for (int i = 0; i < MAX_NODES; i++) {
    if (tcd_pids[i] <= 0) continue;
    kill(tcd_pids[i], SIGTERM);
    waitpid(tcd_pids[i], NULL, 0);
    tcd_pids[i] = 0;
  }
  if (bench_secret[0]) unlink(bench_secret);
  bench_secret[0] = '\0';
}

/* ----------------------------------------------------------------- main */

static void usage(FILE *f) {
  fprintf(f,
          "usage: tc-bench [--clients N] [--duration S] [--warmup S] [--baseline-duration S] [--nodes N]\n"
          "                [--no-bus] [--rounds R] [--fresh-wal]\n"
          "Coordinator throughput: begin + 2 branch registers + commit per transaction,\n"
          "against the naive one-statement-at-a-time store baseline on the same PostgreSQL;\n"
          "with several nodes, all clients on one node, then spread over all of them.\n"
          "--nodes N: nodes to start when TC_NODES is not set (default 3; 1 = single only);\n"
          "--no-bus: start them without the peer bus (to measure what it costs);\n"
          "--rounds R: R single/cluster pairs (alternating after the first), median ratio;\n"
          "--fresh-wal: on the temporary PostgreSQL it starts, measure without first giving\n"
          "  it the recycled WAL segments of a server that has been running (see bench/README.md).\n"
          "Env: TC_PG_URL, TC_NODES (host:port,...), TC_TOKEN.\n");
}

/* CPU seconds (user + system) used so far by the tcd nodes this bench
 * started; 0 when it started none.  A figure that machine noise affects far
 * less than throughput: what one transaction costs the coordinator. */
static double tcd_cpu_s(void) {
  double total = 0;
  long hz = sysconf(_SC_CLK_TCK);
  for (int i = 0; i < MAX_NODES; i++) {
    if (tcd_pids[i] <= 0) continue;
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)tcd_pids[i]);
    FILE *f = fopen(path, "r");
    if (!f) continue;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *p = strrchr(buf, ')');
    unsigned long ut = 0, st = 0;
    /* after ") ": state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime */
    if (p && sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) == 2)
      total += (double)(ut + st) / (double)hz;
  }
  return total;
}

static void print_result(const char *what, const result_t *r, const char *note) {
  printf("tcd, %s %.0f two-branch global transactions/s, p50 %.2f ms, p99 %.2f ms, %" PRIu64 " errors%s\n",
         what, r->tps, r->p50, r->p99, r->errors, note);
  if (r->tcd_cpu_ms_per_tx > 0) printf("              tcd CPU %.3f ms per transaction\n", r->tcd_cpu_ms_per_tx);
  fflush(stdout);
}

/* One measured run: o->clients clients spread over the first o->use_nodes
 * nodes. */
static int run_clients(opts_t *o, result_t *out) {
  bench_client_t *cl = calloc((size_t)o->clients, sizeof(bench_client_t));
  if (!cl) return -1;
  atomic_store(&phase, 0);
  for (int i = 0; i < o->clients; i++) {
    cl[i].id = i + 1;
    const char *node = o->nodes[i % o->use_nodes];
    const char *colon = strrchr(node, ':');
    snprintf(cl[i].host, sizeof(cl[i].host), "%.*s", (int)(colon ? colon - node : 0), node);
    cl[i].port = colon ? atoi(colon + 1) : 0;
  }
  /* The clients share one loop thread (tc_bench_load.h says why). */
  load_arg_t la = {cl, o->clients, o->token, 0};
  pthread_t th;
  if (pthread_create(&th, NULL, load_main, &la) != 0) {
    free(cl);
    return -1;
  }
  printf("tc-bench: %d clients on %d node(s), warm-up %.0fs, measuring %.0fs\n", o->clients, o->use_nodes,
         o->warmup_s, o->duration_s);
  fflush(stdout);
  sleep_s(o->warmup_s);
  atomic_store(&phase, 1);
  pgstat_t pg0;
  budget_start(&pg0, o->pg_url);
  double t0 = txc_now_ms(), cpu0 = tcd_cpu_s();
  sleep_s(o->duration_s);
  atomic_store(&phase, 2);
  double elapsed = (txc_now_ms() - t0) / 1000.0, cpu = tcd_cpu_s() - cpu0;

  uint64_t done = 0, errors = 0;
  size_t nlat = 0;
  pthread_join(th, NULL);
  if (la.rc != 0) fprintf(stderr, "tc-bench: could not start the client loop\n");
  for (int i = 0; i < o->clients; i++) {
    done += cl[i].done;
    errors += cl[i].errors;
    nlat += cl[i].nlat;
  }
  double *all = malloc((nlat ? nlat : 1) * sizeof(double));
  size_t k = 0;
  for (int i = 0; i < o->clients; i++) {
    if (all) memcpy(all + k, cl[i].lat, cl[i].nlat * sizeof(double));
    k += cl[i].nlat;
    if (cl[i].first_error[0] && errors)
      fprintf(stderr, "tc-bench: client %d: %s\n", cl[i].id, cl[i].first_error);
    free(cl[i].lat);
  }
  out->p50 = out->p99 = 0;
  if (all && nlat) {
    qsort(all, nlat, sizeof(double), cmp_double);
    out->p50 = all[nlat / 2];
    out->p99 = all[(size_t)((double)nlat * 0.99)];
  }
  free(all);
  free(cl);
  /* Read once the load stopped: the few transactions in flight then are
   * counted in the server's figures, not in 'done' (well below 1%). */
  out->budget = budget_end(&pg0, o->pg_url, done);
  out->tps = (double)done / elapsed;
  out->tcd_cpu_ms_per_tx = done && cpu > 0 ? cpu * 1000.0 / (double)done : 0;
  out->done = done;
  out->errors = errors;
  return 0;
}

int main(int argc, char **argv) {
  opts_t o = {.clients = 64, .duration_s = 10, .warmup_s = 2, .baseline_s = 5, .want_nodes = 3, .rounds = 1};
  static const struct option lo[] = {
    {"clients", required_argument, NULL, 'c'}, {"duration", required_argument, NULL, 'd'},
    {"warmup", required_argument, NULL, 'w'},  {"baseline-duration", required_argument, NULL, 'b'},
    {"nodes", required_argument, NULL, 'n'},   {"no-bus", no_argument, NULL, 'B'},
    {"rounds", required_argument, NULL, 'r'},  {"fresh-wal", no_argument, NULL, 'F'},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0}};
  int ch;
  while ((ch = getopt_long(argc, argv, "c:d:w:b:n:r:h", lo, NULL)) != -1) {
    switch (ch) {
    case 'c': o.clients = atoi(optarg); break;
    case 'd': o.duration_s = atof(optarg); break;
    case 'w': o.warmup_s = atof(optarg); break;
    case 'b': o.baseline_s = atof(optarg); break;
    case 'n': o.want_nodes = atoi(optarg); break;
    case 'B': o.no_bus = true; break;
    case 'F': o.fresh_wal = true; break;
    case 'r': o.rounds = atoi(optarg); break;
    case 'h': usage(stdout); return 0;
    default: usage(stderr); return 64;
    }
  }
  if (o.clients < 1 || o.clients > 4096 || o.duration_s <= 0 || o.warmup_s < 0 || o.baseline_s <= 0 ||
      o.want_nodes < 1 || o.want_nodes > MAX_NODES || o.rounds < 1 || o.rounds > 64) {
    fprintf(stderr, "tc-bench: invalid options (clients 1..4096, durations > 0, nodes 1..%d)\n", MAX_NODES);
    return 64;
  }
  o.pg_url = getenv("TC_PG_URL");
  if (!o.pg_url || !o.pg_url[0]) {
    /* No database given: run again under a temporary PostgreSQL. */
    char script[PATH_MAX];
    snprintf(script, sizeof(script), "%s/scripts/with-servers", TX_SOURCE_DIR);
    char **args = calloc((size_t)argc + 5, sizeof(char *));
    if (!args) return 70;
    int n = 0;
    setenv(OWN_PG_ENV, "1", 1); /* tells the re-run that the server is its own */
    args[n++] = script;
    args[n++] = "--pg";
    args[n++] = "--";
    for (int i = 0; i < argc; i++) args[n++] = argv[i];
    execv(script, args);
    fprintf(stderr, "tc-bench: could not run %s: %s\n", script, strerror(errno));
    return 69;
  }
  bool own_pg = getenv(OWN_PG_ENV) != NULL;
  unsetenv(OWN_PG_ENV); /* not for the tcd nodes it starts */
  if (own_pg && !o.fresh_wal) {
    /* Enough segments for every phase at about 32 MB of WAL a second. */
    double phases = o.want_nodes > 1 ? 2.0 * o.rounds : 1.0;
    double seconds = phases * (o.warmup_s + o.duration_s) + o.warmup_s + o.baseline_s;
    int segments = (int)(seconds * 32 / 16) + 1;
    if (prepare_wal(o.pg_url, segments > MAX_WAL_SEGMENTS ? MAX_WAL_SEGMENTS : segments) != 0) return 69;
  }
  const char *nodes = getenv("TC_NODES");
  static char secret[512];
  char why[512];
  int src = txc_secret_for("tc-bench", secret, sizeof(secret), NULL, why, sizeof(why));
  if (src < 0) {
    fprintf(stderr, "tc-bench: %s\n", why);
    return 78;
  }
  o.token = src == 0 ? secret : "bench-token";
  bool own = !(nodes && nodes[0]);
  if (!own) {
    char tmp[1024];
    snprintf(tmp, sizeof(tmp), "%s", nodes);
    for (char *save = NULL, *t = strtok_r(tmp, ",", &save); t && o.nnodes < MAX_NODES; t = strtok_r(NULL, ",", &save))
      snprintf(o.nodes[o.nnodes++], sizeof(o.nodes[0]), "%s", t);
  } else if (start_tcd(&o, argv[0], 0) != 0) {
    return 69;
  }

  /* Single node: every client on the first node (the only one running
   * when the bench started its own). */
  result_t single, cluster = {0};
  o.use_nodes = 1;
  if (run_clients(&o, &single) != 0) return 70;
  print_result("1 node: ", &single, "");
  int total = own ? o.want_nodes : o.nnodes;
  double round_ratio[64];
  int nrounds = 0;
  if (total > 1) {
    for (int i = 1; own && i < total; i++)
      if (start_tcd(&o, argv[0], i) != 0) {
        stop_tcd();
        return 69;
      }
    if (own) sleep_s(1.5); /* the bus connects, heartbeats are exchanged */
    o.use_nodes = o.nnodes;
    if (run_clients(&o, &cluster) != 0) return 70;
    print_result("cluster:", &cluster, o.no_bus ? " (clients spread over the nodes; no bus)"
                                                 : " (clients spread over the nodes)");
    round_ratio[nrounds++] = single.tps > 0 ? cluster.tps / single.tps : 0;
    /* More rounds, alternating, every node running: the two halves of a
     * round share the machine's load, so the median ratio is what to read
     * on a noisy machine. */
    for (int r = 1; r < o.rounds && nrounds < 64; r++) {
      result_t s1, c1;
      o.use_nodes = 1;
      if (run_clients(&o, &s1) != 0) return 70;
      print_result("1 node: ", &s1, "");
      o.use_nodes = o.nnodes;
      if (run_clients(&o, &c1) != 0) return 70;
      print_result("cluster:", &c1, "");
      round_ratio[nrounds++] = s1.tps > 0 ? c1.tps / s1.tps : 0;
      single.errors += s1.errors;
      single.done += s1.done;
      cluster.errors += c1.errors;
      cluster.done += c1.done;
    }
  }
  stop_tcd();

  tx_budget_t base_budget;
  double base = run_baseline(&o, &base_budget);
  printf("baseline: %.0f transactions/s (same store writes, one statement per round trip, %d connections)\n",
         base, o.clients);
  print_budget("1 node: ", &single.budget);
  print_budget("baseline:", &base_budget);
  double ratio = base > 0 ? single.tps / base : 0;
  double cvs = 0;
  if (nrounds) {
    qsort(round_ratio, (size_t)nrounds, sizeof(double), cmp_double);
    cvs = round_ratio[nrounds / 2];
  }
  printf("ratio:    %.2fx (1 node vs baseline)\n", ratio);
  if (total > 1)
    printf("cluster:  %.2fx (%d nodes vs 1 node, same PostgreSQL%s)\n", cvs, o.nnodes,
           nrounds > 1 ? ", median of the rounds" : "");
  printf("{\"clients\":%d,\"tps\":%.1f,\"p50_ms\":%.3f,\"p99_ms\":%.3f,\"baseline_tps\":%.1f,\"ratio\":%.3f,"
         "\"errors\":%" PRIu64 ",\"nodes\":%d,\"cluster_tps\":%.1f,\"cluster_p50_ms\":%.3f,"
         "\"cluster_p99_ms\":%.3f,\"cluster_vs_single\":%.3f,\"cluster_errors\":%" PRIu64
         ",\"tcd_cpu_ms_per_tx\":%.4f,\"cluster_tcd_cpu_ms_per_tx\":%.4f,\"bus\":%s",
         o.clients, single.tps, single.p50, single.p99, base, ratio, single.errors, total > 1 ? o.nnodes : 1,
         cluster.tps, cluster.p50, cluster.p99, cvs, cluster.errors, single.tcd_cpu_ms_per_tx,
         cluster.tcd_cpu_ms_per_tx, o.no_bus ? "false" : "true");
  /* The store's work per transaction, the coordinator's and the naive
   * baseline's (absent when the server's counters could not be read). */
  const tx_budget_t *bud[] = {&single.budget, &base_budget};
  const char *bname[] = {"budget_per_tx", "baseline_budget_per_tx"};
  for (int i = 0; i < 2; i++) {
    if (!bud[i]->ok) continue;
    printf(",\"%s\":{", bname[i]);
    if (bud[i]->has_statements) printf("\"statements\":%.3f,", bud[i]->statements);
    printf("\"pg_transactions\":%.3f,\"pg_rows_read\":%.2f,\"wal_bytes\":%.1f,\"wal_records\":%.2f,"
           "\"wal_syncs\":%.4f}",
           bud[i]->xacts, bud[i]->rows_read, bud[i]->wal_bytes, bud[i]->wal_records, bud[i]->wal_syncs);
  }
  printf("}\n");
  uint64_t errors = single.errors + cluster.errors, done = single.done + cluster.done;
  return errors > done / 100 ? 1 : 0;
}
