/*
 * txc_events.c - txc-events, the operator's tool for the dead letters of
 * the order-event consumers (build/bin/txc-events).
 *
 * NOTES
 *   A consumer group (svc_consumer.h) keeps its consumed_event rows and its
 *   dead letters in its own database (sql/consumer/): the groups of
 *   event-consumers (points, notify, tickets) in the events database
 *   (EVENTS_PG_URL, the default), stock-service's group "stock" in the
 *   stock database (--db "$STOCK_PG_URL").
 *
 *     txc-events [--db URL] list [--group G] [--state DEAD|REDELIVER|REDELIVERED]
 *         the dead letters, oldest first: id, group, biz_key, deliveries,
 *         state, reason, created_at
 *     txc-events [--db URL] redeliver --group G (--id N [--id N ...] | --all)
 *         marks dead letters REDELIVER: --all every DEAD one of the group;
 *         --id the ones named, which must belong to the group and be DEAD
 *         or REDELIVERED (again: the consumer applies it through the same
 *         idempotent path, so an effect that happened stays single).  The
 *         group's consumers pick the rows up within about a second
 *         (svc_consumer.c, step 2), apply them and mark them REDELIVERED,
 *         or DEAD again with the new reason.  Prints how many were marked.
 *     txc-events [--db URL] stats
 *         per group: consumed_event rows, dead letters by state
 *
 *   Every argument is checked before anything changes: an unknown group,
 *   an id that does not exist, belongs to another group or is in the wrong
 *   state is an error and nothing is marked (one transaction, rows locked).
 *   Exit status: 0 done, 1 failure (database, unknown group or id), 2 usage.
 */
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "svc_parse.h"

#define PROG "txc-events"
#define MAX_IDS 1000
#define MAX_GROUP 128

enum { EXIT_OK = 0, EXIT_FAIL = 1, EXIT_USAGE = 2 };

static void usage(FILE *f) {
  fprintf(f,
          "usage: " PROG " [--db URL] list [--group G] [--state DEAD|REDELIVER|REDELIVERED]\n"
          "       " PROG " [--db URL] redeliver --group G (--id N [--id N ...] | --all)\n"
          "       " PROG " [--db URL] stats\n"
          "       " PROG " --help\n"
          "\n"
          "The dead letters of the order-event consumer groups (examples/svc_consumer.h).\n"
          "  list       dead letters, oldest first: id, group, biz_key, deliveries, state,\n"
          "             reason, created_at\n"
          "  redeliver  mark dead letters of group G for another try: --all (every DEAD one)\n"
          "             or --id N (DEAD or REDELIVERED; repeatable); the group's consumers\n"
          "             apply them within about a second\n"
          "  stats      per group: consumed events, dead letters by state\n"
          "\n"
          "  --db URL   the consumers' database (default $EVENTS_PG_URL: points, notify,\n"
          "             tickets; the stock group's is the stock database, $STOCK_PG_URL)\n"
          "\n"
          "exit status: 0 ok, 1 failure, 2 usage\n");
}

static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int usage_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, PROG ": ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, " (see " PROG " --help)\n");
  va_end(ap);
  return EXIT_USAGE;
}

static bool parse_id(const char *s, long long *out) {
  if (!s || !*s) return false;
  long long v = 0;
  for (const char *p = s; *p; p++) {
    if (*p < '0' || *p > '9') return false;
    if (v > (9223372036854775807LL - (*p - '0')) / 10) return false;
    v = v * 10 + (*p - '0');
  }
  if (v < 1) return false;
  *out = v;
  return true;
}

static bool valid_group(const char *g) {
  size_t n = strlen(g);
  if (n == 0 || n > MAX_GROUP) return false;
  for (const char *p = g; *p; p++)
    if ((unsigned char)*p < 0x20 || *p == 0x7f) return false;
  return true;
}

/* ----------------------------------------------------------- database */

static PGconn *db_connect(const char *url) {
  const char *keys[] = {"dbname", "application_name", "connect_timeout", NULL};
  const char *vals[] = {url, PROG, "10", NULL};
  PGconn *pg = PQconnectdbParams(keys, vals, 1);
  if (PQstatus(pg) != CONNECTION_OK) {
    fprintf(stderr, PROG ": could not connect to the database: %s", PQerrorMessage(pg));
    PQfinish(pg);
    return NULL;
  }
  return pg;
}

/* Run 'sql' with 'n' text parameters; the result on 'want', else NULL with
 * a message (and a hint when the consumer tables are missing). */
static PGresult *db_exec(PGconn *pg, const char *sql, int n, const char *const *params, ExecStatusType want) {
  PGresult *r = PQexecParams(pg, sql, n, NULL, params, NULL, NULL, 0);
  if (PQresultStatus(r) == want) return r;
  const char *state = PQresultErrorField(r, PG_DIAG_SQLSTATE);
  fprintf(stderr, PROG ": query failed: %s", PQerrorMessage(pg));
  if (state && strcmp(state, "42P01") == 0)
    fprintf(stderr, PROG ": hint: this database has no consumer tables (dead_letter, consumed_event); "
                    "--db must name a consumer's database (the events database, or the stock database for "
                    "the stock group)\n");
  PQclear(r);
  return NULL;
}

static bool db_cmd(PGconn *pg, const char *sql) {
  PGresult *r = db_exec(pg, sql, 0, NULL, PGRES_COMMAND_OK);
  PQclear(r);
  return r != NULL;
}

/* The groups this database knows (consumed events or dead letters), as
 * "a, b, c" (malloc'd), or NULL on error. */
static char *known_groups(PGconn *pg) {
  PGresult *r = db_exec(pg,
                        "SELECT coalesce(string_agg(g, ', ' ORDER BY g), '') FROM (SELECT consumer_group AS g"
                        " FROM consumed_event UNION SELECT consumer_group FROM dead_letter) s",
                        0, NULL, PGRES_TUPLES_OK);
  if (!r) return NULL;
  char *s = strdup(PQgetvalue(r, 0, 0));
  PQclear(r);
  return s;
}

/* 1 the group has rows here, 0 not (with an error message), -1 error. */
static int check_group(PGconn *pg, const char *group) {
  const char *p[1] = {group};
  PGresult *r = db_exec(pg,
                        "SELECT EXISTS (SELECT 1 FROM consumed_event WHERE consumer_group = $1)"
                        " OR EXISTS (SELECT 1 FROM dead_letter WHERE consumer_group = $1)",
                        1, p, PGRES_TUPLES_OK);
  if (!r) return -1;
  bool known = strcmp(PQgetvalue(r, 0, 0), "t") == 0;
  PQclear(r);
  if (known) return 1;
  char *all = known_groups(pg);
  fprintf(stderr, PROG ": unknown group \"%s\": no consumed event and no dead letter of it in this database", group);
  if (all) fprintf(stderr, " (groups here: %s)", *all ? all : "none");
  fprintf(stderr, "\n");
  if (strcmp(group, "stock") == 0)
    fprintf(stderr, PROG ": hint: the stock group's dead letters are in the stock database: --db \"$STOCK_PG_URL\"\n");
  free(all);
  return 0;
}

/* ---------------------------------------------------------- output */

/* Print 'r' as an aligned table with 'headers'; control characters in a
 * value (a reason with a newline) are shown as spaces. */
static void print_table(PGresult *r, const char *const *headers, int ncol) {
  size_t w[16] = {0};
  for (int c = 0; c < ncol; c++) w[c] = strlen(headers[c]);
  for (int i = 0; i < PQntuples(r); i++)
    for (int c = 0; c < ncol; c++) {
      size_t n = (size_t)PQgetlength(r, i, c);
      if (n > w[c]) w[c] = n;
    }
  for (int c = 0; c < ncol; c++) printf("%-*s%s", c + 1 < ncol ? (int)w[c] : 0, headers[c], c + 1 < ncol ? "  " : "\n");
  for (int i = 0; i < PQntuples(r); i++)
    for (int c = 0; c < ncol; c++) {
      const char *v = PQgetvalue(r, i, c);
      size_t n = strlen(v);
      for (size_t k = 0; k < n; k++) putchar((unsigned char)v[k] < 0x20 ? ' ' : v[k]);
      if (c + 1 < ncol)
        printf("%*s", (int)(w[c] - n + 2), "");
      else
        putchar('\n');
    }
}

/* --------------------------------------------------------- commands */

static int cmd_list(PGconn *pg, const char *group, const char *state) {
  if (group) {
    int k = check_group(pg, group);
    if (k <= 0) return EXIT_FAIL;
  }
  const char *p[2] = {group, state};
  PGresult *r = db_exec(pg,
                        "SELECT id, consumer_group, biz_key, deliveries, state, reason,"
                        " to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')"
                        " FROM dead_letter WHERE ($1::text IS NULL OR consumer_group = $1)"
                        " AND ($2::text IS NULL OR state = $2) ORDER BY id",
                        2, p, PGRES_TUPLES_OK);
  if (!r) return EXIT_FAIL;
  static const char *const h[] = {"id", "group", "biz_key", "deliveries", "state", "reason", "created_at"};
  print_table(r, h, 7);
  int n = PQntuples(r);
  printf("(%d dead letter%s)\n", n, n == 1 ? "" : "s");
  PQclear(r);
  return EXIT_OK;
}

static int cmp_ll(const void *a, const void *b) {
  long long x = *(const long long *)a, y = *(const long long *)b;
  return x < y ? -1 : x > y;
}

/* "{1,2,3}" of 'ids' into 'out' (size enough: 21 bytes per id + 3). */
static void id_array(const long long *ids, size_t n, char *out, size_t outlen) {
  size_t off = 0;
  off += (size_t)snprintf(out + off, outlen - off, "{");
  for (size_t i = 0; i < n && off < outlen; i++)
    off += (size_t)snprintf(out + off, outlen - off, i ? ",%lld" : "%lld", ids[i]);
  if (off < outlen) snprintf(out + off, outlen - off, "}");
}

static int cmd_redeliver(PGconn *pg, const char *group, long long *ids, size_t nids, bool all) {
  if (!db_cmd(pg, "BEGIN")) return EXIT_FAIL;
  int rc = EXIT_FAIL;
  PGresult *r = NULL;
  char *arr = NULL;
  int k = check_group(pg, group);
  if (k <= 0) goto done;
  if (all) {
    const char *p[1] = {group};
    r = db_exec(pg,
                "UPDATE dead_letter SET state = 'REDELIVER', updated_at = now()"
                " WHERE consumer_group = $1 AND state = 'DEAD' RETURNING id",
                1, p, PGRES_TUPLES_OK);
  } else {
    qsort(ids, nids, sizeof(ids[0]), cmp_ll);
    size_t u = 0;
    for (size_t i = 0; i < nids; i++)
      if (u == 0 || ids[u - 1] != ids[i]) ids[u++] = ids[i];
    nids = u;
    size_t cap = nids * 21 + 3;
    if (!(arr = malloc(cap))) {
      fprintf(stderr, PROG ": out of memory\n");
      goto done;
    }
    id_array(ids, nids, arr, cap);
    const char *p[1] = {arr};
    /* Lock the rows first: a consumer marking one REDELIVERED meanwhile
     * waits, or we see its new state. */
    PGresult *q = db_exec(pg,
                          "SELECT id, consumer_group, state FROM dead_letter WHERE id = ANY($1::bigint[])"
                          " ORDER BY id FOR UPDATE",
                          1, p, PGRES_TUPLES_OK);
    if (!q) goto done;
    int bad = 0, j = 0, already = 0;
    for (size_t i = 0; i < nids; i++) {
      long long got = j < PQntuples(q) ? atoll(PQgetvalue(q, j, 0)) : 0;
      if (got != ids[i]) {
        fprintf(stderr, PROG ": no dead letter with id %lld\n", ids[i]);
        bad++;
        continue;
      }
      const char *g = PQgetvalue(q, j, 1), *st = PQgetvalue(q, j, 2);
      j++;
      if (strcmp(g, group) != 0) {
        fprintf(stderr, PROG ": dead letter %lld belongs to group \"%s\", not \"%s\"\n", ids[i], g, group);
        bad++;
      } else if (strcmp(st, "REDELIVER") == 0) {
        already++;
      }
    }
    PQclear(q);
    if (bad) {
      fprintf(stderr, PROG ": nothing changed\n");
      goto done;
    }
    if (already)
      fprintf(stderr, PROG ": %d of the dead letters named are already marked REDELIVER (left as they are)\n",
              already);
    const char *p2[2] = {arr, group};
    r = db_exec(pg,
                "UPDATE dead_letter SET state = 'REDELIVER', updated_at = now()"
                " WHERE id = ANY($1::bigint[]) AND consumer_group = $2 AND state IN ('DEAD', 'REDELIVERED')"
                " RETURNING id",
                2, p2, PGRES_TUPLES_OK);
  }
  if (!r) goto done;
  if (!db_cmd(pg, "COMMIT")) goto done;
  int n = PQntuples(r);
  printf("%d dead letter%s of group \"%s\" marked for redelivery", n, n == 1 ? "" : "s", group);
  for (int i = 0; i < n; i++) printf("%s%s", i ? ", " : " (id ", PQgetvalue(r, i, 0));
  printf("%s\n", n ? ")" : "");
  if (n)
    printf("the group's consumers apply them within about a second; then: " PROG " list --group %s\n", group);
  else if (all)
    printf("no dead letter of group \"%s\" is in state DEAD\n", group);
  rc = EXIT_OK;
done:
  PQclear(r);
  free(arr);
  if (rc != EXIT_OK && PQtransactionStatus(pg) != PQTRANS_IDLE) PQclear(PQexec(pg, "ROLLBACK"));
  return rc;
}

static int cmd_stats(PGconn *pg) {
  PGresult *r = db_exec(
    pg,
    "WITH g AS (SELECT consumer_group FROM consumed_event UNION SELECT consumer_group FROM dead_letter)"
    " SELECT g.consumer_group,"
    " (SELECT count(*) FROM consumed_event c WHERE c.consumer_group = g.consumer_group),"
    " (SELECT count(*) FROM dead_letter d WHERE d.consumer_group = g.consumer_group AND d.state = 'DEAD'),"
    " (SELECT count(*) FROM dead_letter d WHERE d.consumer_group = g.consumer_group AND d.state = 'REDELIVER'),"
    " (SELECT count(*) FROM dead_letter d WHERE d.consumer_group = g.consumer_group AND d.state = 'REDELIVERED')"
    " FROM g ORDER BY 1",
    0, NULL, PGRES_TUPLES_OK);
  if (!r) return EXIT_FAIL;
  static const char *const h[] = {"group", "consumed", "dead", "redeliver", "redelivered"};
  print_table(r, h, 5);
  if (PQntuples(r) == 0) printf("(no consumer group has used this database yet)\n");
  PQclear(r);
  return EXIT_OK;
}

/* ------------------------------------------------------------- main */

int main(int argc, char **argv) {
  const char *db = NULL, *cmd = NULL, *group = NULL, *state = NULL;
  static long long ids[MAX_IDS];
  size_t nids = 0;
  bool all = false, missing = false, is_list = false, is_redeliver = false, is_stats = false;
  const char *v;
  /* Global options, then the command, then its options (--help and --db
   * are accepted anywhere). */
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
      usage(stdout);
      return EXIT_OK;
    } else if ((v = svc_opt_value(argc, argv, &i, "--db", &missing)) || missing) {
      if (missing) return usage_error("%s needs a value", "--db");
      db = v;
    } else if (!cmd && argv[i][0] == '-') {
      return usage_error("unknown option \"%s\"", argv[i]);
    } else if (!cmd) {
      cmd = argv[i];
      is_list = strcmp(cmd, "list") == 0;
      is_redeliver = strcmp(cmd, "redeliver") == 0;
      is_stats = strcmp(cmd, "stats") == 0;
      if (!is_list && !is_redeliver && !is_stats)
        return usage_error("unknown command \"%s\": expected list, redeliver or stats", cmd);
    } else if (!is_stats && ((v = svc_opt_value(argc, argv, &i, "--group", &missing)) || missing)) {
      if (missing) return usage_error("%s needs a value", "--group");
      if (!valid_group(v)) return usage_error("invalid group \"%s\": 1 to 128 printable characters", v);
      group = v;
    } else if (is_list && ((v = svc_opt_value(argc, argv, &i, "--state", &missing)) || missing)) {
      if (missing) return usage_error("%s needs a value", "--state");
      if (strcmp(v, "DEAD") != 0 && strcmp(v, "REDELIVER") != 0 && strcmp(v, "REDELIVERED") != 0)
        return usage_error("invalid state \"%s\": expected DEAD, REDELIVER or REDELIVERED", v);
      state = v;
    } else if (is_redeliver && ((v = svc_opt_value(argc, argv, &i, "--id", &missing)) || missing)) {
      if (missing) return usage_error("%s needs a value", "--id");
      if (!parse_id(v, &ids[nids])) return usage_error("invalid id \"%s\": expected a positive integer", v);
      if (++nids == MAX_IDS) return usage_error("more than %d ids: use --all, or several runs", MAX_IDS - 1);
    } else if (is_redeliver && strcmp(argv[i], "--all") == 0) {
      all = true;
    } else {
      fprintf(stderr, PROG ": unknown argument \"%s\" for %s (see " PROG " --help)\n", argv[i], cmd);
      return EXIT_USAGE;
    }
  }
  if (!cmd) return usage_error("%s", "no command: list, redeliver or stats");
  if (is_redeliver) {
    if (!group) return usage_error("%s", "redeliver needs --group");
    if (all == (nids > 0)) return usage_error("%s", "redeliver needs either --id N ... or --all");
  }
  if (!db) db = getenv("EVENTS_PG_URL");
  if (!db || !*db) return usage_error("%s", "no database: give --db URL or set EVENTS_PG_URL");

  PGconn *pg = db_connect(db);
  if (!pg) return EXIT_FAIL;
  PQclear(PQexec(pg, "SET client_min_messages = warning"));
  int rc = is_list        ? cmd_list(pg, group, state)
           : is_redeliver ? cmd_redeliver(pg, group, ids, nids, all)
                          : cmd_stats(pg);
  PQfinish(pg);
  return rc;
}
